//! # iolab-iommu: a functional DMA-remapping stack
//!
//! The real data structures and algorithms of the DMA-mapping path, as a thread-safe library
//! that knows nothing of time:
//!
//! - [`addr`]: address-space newtypes ([`addr::Iova`], [`addr::PhysAddr`], [`addr::Pfn`]).
//! - [`mem`]: sparse simulated physical memory with real bytes.
//! - [`pgtable`]: IO page-table formats (ARM LPAE, POWER TCE, SBA I/O pdir).
//! - [`iova`]: IOVA allocators (Linux tree, magazines, gap tree, POWER pools, SBA bitmap).
//! - [`vtd`]: an Intel VT-d remapping unit (root/context tables, second-stage tables,
//!   IOTLB and context cache, the invalidation queue) and the Linux intel-iommu strict path.
//! - [`iotlb`]: set-associative IOTLB and per-level walk caches, with real stale entries.
//! - [`amdvi`]: the AMD-Vi IOMMU (device table, v1 page tables, command buffer, event
//!   log, the Linux strict-unmap invalidator).
//! - [`dma`]: the DMA API (domains, modes, scatter-gather merging, flush queues) and the
//!   device side (translate, `dma_read`, `dma_write`).
//! - `vmm` (feature `vm-memory`): a domain as rust-vmm vm-memory's `Iommu`, for VMMs.
//! - [`work`]: work records, the exact counts of primitive steps every operation returns.
//! - [`linux`]: Linux kernel versions and which variant of each changed DMA-path algorithm
//!   (rcache depot, flush queues, 32-bit-first allocation, SMMUv3 command queue, default DMA
//!   mode) a version runs.
//!
//! Every operation does its real work on real state and adds what it did to a
//! [`work::WorkRecord`]; the iolab lab turns those counts into virtual time.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod addr;
pub mod amdvi;
pub mod dma;
pub mod hw;
pub mod iotlb;
pub mod iova;
pub mod linux;
pub mod mem;
pub mod pgtable;
pub mod smmuv3;
#[cfg(feature = "vm-memory")]
pub mod vmm;
pub mod vtd;
pub mod work;
