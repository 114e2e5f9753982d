//! Workloads: fio-, bonnie++-, re-aim- and netperf-like drivers and their output formats.
pub mod netperf;
