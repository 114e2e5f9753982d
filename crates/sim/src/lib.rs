//! # iolab-sim: the virtual-time lab (being written)
#![warn(missing_docs)]
pub mod cost;
