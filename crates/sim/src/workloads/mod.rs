//! Workloads: fio-, bonnie++-, re-aim- and netperf-like drivers and their output formats.
pub mod bonnie;
pub mod fio;
pub mod net_dim;
pub mod netperf;
pub(crate) mod nic_dma;
pub mod reaim;
pub mod rx_stream;
pub mod tcp_flow;
pub mod tx_stream;
