//! The DMA API as drivers see it (being written).
