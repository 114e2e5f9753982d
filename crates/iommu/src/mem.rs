//! Sparse simulated physical memory (being written).
