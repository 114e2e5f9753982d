//! The IOMMU's timed side: what the unit's hardware adds in virtual time.
//!
//! - [`port`]: the DMA port, where every device's DMA is translated and timed with one
//!   model (walkers, outstanding requests, posted-write ordering).
pub mod port;
