//! The HP zx1 SBA IOMMU, as Linux's `arch/ia64/hp/common/sba_iommu.c` drives it.
//!
//! The IOC translates bus addresses inside its IOV window through a single-level I/O page
//! directory ([`SbaPdir`]) whose space is handed out by a resource bitmap
//! ([`SbaResourceAllocator`]: power-of-two sizes, circular search from a hint). Around those
//! two structures the driver adds three behaviours that this model reproduces:
//!
//! - **Bypass.** A device whose DMA mask reaches the buffer is given the physical address
//!   itself: no pdir entry, no resource bit, no translation on the device side
//!   (`ALLOW_IOV_BYPASS`). Linux tests only the buffer's first byte against the mask; this
//!   model tests the last byte too, so a buffer straddling the mask is translated instead.
//!   Scatter-gather lists bypass only when enabled ([`SbaIommuConfig::allow_bypass_sg`], Linux's
//!   `ALLOW_IOV_BYPASS_SG`, off in the driver) and the device's mask covers everything the IOC
//!   can address; a one-entry list takes the single-buffer path, which may bypass.
//! - **Batched purges.** An unmap does not free its resource bits: the range is queued, and
//!   at the 64th queued range (`DELAYED_RESOURCE_CNT`) every queued range gets its PCOM purge
//!   command (one register write each), one read of PCOM flushes the posted writes, and only
//!   then are the resource bits released. A range is never handed out again before its
//!   purge. When an allocation fails with ranges queued, the queue is purged and the
//!   allocation retried once, as Linux does. Linux ia64 also defers clearing the pdir entries
//!   to the batch; by default this model clears them at unmap (as the PA-RISC driver does, so
//!   a device cannot reach an unmapped buffer through the pdir), and
//!   [`SbaIommuConfig::invalidate_at_purge`] selects the ia64 behaviour.
//! - **Virtual merging** of scatter-gather lists (`sba_coalesce_chunks`): consecutive entries
//!   join one DMA stream (one allocation, one DMA segment) while they are virtually contiguous
//!   (the next starts where the previous ended) or both the previous end and the next start
//!   fall on an IOMMU page boundary, as long as the stream stays within the chunk size
//!   (`DMA_CHUNK_SIZE`, 64 IOMMU pages) and the device's maximum segment size. With
//!   [`SbaIommuConfig::merge`] off (the block layer's `BIO_VMERGE_BOUNDARY 0` assumption) every
//!   entry is its own stream. [`coalesce_chunks`] exposes the plan without mapping anything.
//!
//! Addresses: the model has no kernel virtual addresses, so "virtually contiguous" is
//! physical contiguity (ia64's identity-mapped kernel region makes them the same for the
//! buffers a block driver maps).
//!
//! Work counted: the pdir's `ptes_written` / `ptes_cleared` / `pte_reads`, the allocator's
//! `bitmap_words_scanned` and [`LockId::SbaResource`] acquisitions, [`LockId::Other`] for the
//! queue's lock (`saved_lock`), `mmio_writes` (one PCOM write per purged range), `mmio_reads`
//! (one read-back per batch), `purges` (one per batch), `translations` on the device side.
//! Bypasses count nothing in the work record; [`SbaIommu::stats`] counts them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::addr::{Access, DmaAddr, Iova, PhysAddr};
use crate::dma::{
    Device, Direction, DmaError, DmaFault, DmaSegment, DomainId, FaultReason, PhysRange,
    ProtectionCounters, ProtectionStats, Rejected, SgEntry,
};
use crate::iova::linux::IovaConfigError;
use crate::iova::sba::{SbaConfig as ResourceConfig, SbaResourceAllocator};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::pgtable::sba_pdir::{
    spec as pdir_spec, SbaConfig as PdirConfig, SbaConfigError, SbaPdir,
};
use crate::pgtable::{IoPageTable, PgTableError, UnmapGather};
use crate::work::{LockId, WorkRecord};

use super::{
    check_buffer, check_sg, device_access, next_instance, same_instance, take_live_slot,
    wrong_owner, BufferToken, DmaPath, MappedBuffer, MappedSg, SgToken,
};

/// Frees queued before a purge (Linux `DELAYED_RESOURCE_CNT`).
pub const DELAYED_RESOURCE_CNT: usize = 64;
/// Cap on [`SbaIommuConfig::delayed_frees`].
pub const MAX_DELAYED_FREES: usize = 4096;
/// DMA stream size limit in IOMMU pages (Linux `DMA_CHUNK_SIZE` = `BITS_PER_LONG * iovp_size`).
pub const CHUNK_PAGES: u64 = 64;
/// What a zx1 IOC can address (a 38-bit memory controller plus one bit for the range
/// displaced by MMIO): the mask a device needs for scatter-gather bypass.
pub const ZX1_IOC_DMA_MASK: u64 = (1 << 39) - 1;

/// Configuration of an [`SbaIommu`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SbaIommuConfig {
    /// The id reported in handles and errors.
    pub id: DomainId,
    /// First bus address of the IOV window (`IBASE`), aligned to its size.
    pub iova_base: u64,
    /// Size of the IOV window in bytes, a power of two.
    pub iova_size: u64,
    /// IOMMU page size (`iovp_size`: `min(PAGE_SIZE, 64 KiB)`), 4 KiB to 64 KiB.
    pub page_size: u64,
    /// Largest DMA stream in bytes (`DMA_CHUNK_SIZE`): a power-of-two multiple of the page
    /// size, at most half the window. Single buffers larger than this are refused.
    pub chunk_size: u64,
    /// Frees queued before a purge; 0 purges at every unmap. At most [`MAX_DELAYED_FREES`].
    pub delayed_frees: usize,
    /// Virtual merging of scatter-gather lists (see the module docs).
    pub merge: bool,
    /// Bypass single buffers the device's mask reaches (`ALLOW_IOV_BYPASS`).
    pub allow_bypass: bool,
    /// Bypass scatter-gather lists for devices whose mask covers `ioc_dma_mask`
    /// (`ALLOW_IOV_BYPASS_SG`).
    pub allow_bypass_sg: bool,
    /// Clear pdir entries at the purge instead of at unmap (ia64's behaviour).
    pub invalidate_at_purge: bool,
    /// The highest address the IOC can reach ([`ZX1_IOC_DMA_MASK`] on zx1).
    pub ioc_dma_mask: u64,
    /// Cap on live (translated) mappings.
    pub max_mappings: usize,
}

impl SbaIommuConfig {
    /// Default cap on live mappings.
    pub const DEFAULT_MAX_MAPPINGS: usize = 1 << 20;

    /// A window of `iova_size` bytes at `iova_base` with `page_size` IOMMU pages and Linux's
    /// settings: 64-page chunks, purge after 64 frees, merging on, single-buffer bypass on,
    /// scatter-gather bypass off, pdir cleared at unmap, a zx1 IOC.
    pub fn new(id: DomainId, iova_base: u64, iova_size: u64, page_size: u64) -> Self {
        Self {
            id,
            iova_base,
            iova_size,
            page_size,
            chunk_size: CHUNK_PAGES.saturating_mul(page_size),
            delayed_frees: DELAYED_RESOURCE_CNT,
            merge: true,
            allow_bypass: true,
            allow_bypass_sg: false,
            invalidate_at_purge: false,
            ioc_dma_mask: ZX1_IOC_DMA_MASK,
            max_mappings: Self::DEFAULT_MAX_MAPPINGS,
        }
    }
}

/// Why an [`SbaIommu`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SbaError {
    /// The pdir refused the window.
    #[error("Invalid SBA I/O pdir window")]
    Pdir(#[from] SbaConfigError),
    /// The resource map refused the window.
    #[error("Invalid SBA resource map window")]
    Resource(#[from] IovaConfigError),
    /// The chunk size is not a power-of-two multiple of the page size within half the window.
    #[error("Chunk size {chunk:#x} must be a power of two from the page size {page:#x} to half the window")]
    BadChunkSize {
        /// The chunk size given.
        chunk: u64,
        /// The page size.
        page: u64,
    },
    /// Too many delayed frees.
    #[error("Delayed frees {value} exceed the cap of {max}")]
    TooManyDelayedFrees {
        /// The value given.
        value: usize,
        /// [`MAX_DELAYED_FREES`].
        max: usize,
    },
    /// The mapping cap is zero.
    #[error("The mapping cap must be at least 1")]
    ZeroMappingCap,
}

/// How to coalesce a list: see [`coalesce_chunks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoalesceParams {
    /// IOMMU page size.
    pub page_size: u64,
    /// Largest stream in bytes, page-rounded with its offset.
    pub chunk_size: u64,
    /// The device's maximum segment size.
    pub max_seg_size: u64,
    /// Virtual merging on.
    pub merge: bool,
}

/// A virtually contiguous run inside a stream: one pdir fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcontigChunk {
    /// First byte.
    pub pa: PhysAddr,
    /// Bytes.
    pub len: u64,
}

/// One DMA stream: one allocation in the IOV window and one DMA segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SbaStream {
    /// Index of the stream's first list entry.
    pub first: usize,
    /// Number of list entries in the stream.
    pub entries: usize,
    /// Offset of the first byte within its IOMMU page.
    pub offset: u64,
    /// Bytes of data: the DMA segment's length.
    pub len: u64,
    /// IOMMU pages the stream maps (`ceil((offset + len) / page)`).
    pub pages: u64,
    /// The virtually contiguous runs, in order; each after the first starts on a page.
    pub chunks: Vec<VcontigChunk>,
}

/// Plans the DMA streams of a list the way `sba_coalesce_chunks` does, without mapping
/// anything (the lab's block layer can count segments with it). See the module docs.
///
/// Errors: an empty list, an empty or wrapping entry, or an entry that alone needs more than
/// the chunk size.
pub fn coalesce_chunks(
    entries: &[SgEntry],
    p: &CoalesceParams,
) -> Result<Vec<SbaStream>, DmaError> {
    check_sg(entries)?;
    let mask = p.page_size - 1;
    let round = |v: u64| v.div_ceil(p.page_size) * p.page_size;
    let mut streams = Vec::new();
    let mut i = 0;
    while i < entries.len() {
        let e = entries[i];
        let offset = e.pa.get() & mask;
        if round(offset + e.len) > p.chunk_size {
            let pages = round(offset + e.len) / p.page_size;
            return Err(DmaError::IovaSpace {
                pages,
                limit: p.chunk_size,
                source: IovaError::BadSize { pages },
            });
        }
        let mut s = SbaStream {
            first: i,
            entries: 1,
            offset,
            len: e.len,
            pages: 0,
            chunks: vec![VcontigChunk {
                pa: e.pa,
                len: e.len,
            }],
        };
        let mut vcontig_end = e.pa.get() + e.len;
        i += 1;
        while p.merge && i < entries.len() {
            let n = entries[i];
            if round(s.len + offset + n.len) > p.chunk_size {
                break;
            }
            if s.len + n.len > p.max_seg_size {
                break;
            }
            let chunk = s.chunks.last_mut().expect("a stream has a chunk");
            if n.pa.get() == vcontig_end {
                chunk.len += n.len;
            } else if (vcontig_end | n.pa.get()) & mask == 0 {
                s.chunks.push(VcontigChunk {
                    pa: n.pa,
                    len: n.len,
                });
            } else {
                break;
            }
            vcontig_end = n.pa.get() + n.len;
            s.len += n.len;
            s.entries += 1;
            i += 1;
        }
        s.pages = (offset + s.len).div_ceil(p.page_size);
        streams.push(s);
    }
    Ok(streams)
}

/// Running totals of an [`SbaIommu`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SbaStats {
    /// Single buffers that bypassed the IOMMU.
    pub bypass_maps: u64,
    /// Scatter-gather lists that bypassed the IOMMU.
    pub bypass_sg: u64,
    /// DMA streams mapped through the pdir (single buffers and scatter-gather streams).
    pub streams: u64,
    /// Scatter-gather entries mapped through the pdir.
    pub sg_entries: u64,
    /// Ranges waiting in the purge queue now.
    pub queued: u64,
    /// Purge batches done.
    pub purges: u64,
    /// Ranges purged (one PCOM write each).
    pub purged_ranges: u64,
    /// Purges forced by an allocation failure.
    pub forced_purges: u64,
}

#[derive(Debug, Default)]
struct Totals {
    bypass_maps: AtomicU64,
    bypass_sg: AtomicU64,
    streams: AtomicU64,
    sg_entries: AtomicU64,
    purges: AtomicU64,
    purged_ranges: AtomicU64,
    forced_purges: AtomicU64,
}

/// One mapped stream: its allocation and the pdir bytes filled from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StreamMap {
    block: IovaBlock,
    bytes: u64,
}

/// The SBA part of a [`MappedBuffer`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SbaSingle {
    instance: u64,
    map: Option<StreamMap>,
}

/// The SBA part of a [`MappedSg`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SbaSg {
    instance: u64,
    pub(super) segments: Vec<DmaSegment>,
    /// One per segment; empty when the list bypassed.
    streams: Vec<StreamMap>,
}

/// Proof that a PCOM read-back has flushed the purges issued before it: only
/// [`SbaIommu::read_back`] makes one, and only with one can resource bits be released.
#[must_use = "purged ranges are released with it"]
struct PurgeDone(());

/// The HP zx1 SBA IOMMU. Thread-safe. See the module docs.
#[derive(Debug)]
pub struct SbaIommu {
    cfg: SbaIommuConfig,
    instance: u64,
    pdir: Mutex<SbaPdir>,
    res: SbaResourceAllocator,
    /// `ioc->saved`: ranges waiting for their purge, at most `delayed_frees`, each with the
    /// caller's clock at its unmap (the start of its reachable window).
    saved: Mutex<Vec<(StreamMap, u64)>>,
    live: AtomicUsize,
    totals: Totals,
    /// Bypasses and faults of device accesses (see [`crate::dma::protection`]).
    protection: ProtectionCounters,
}

impl SbaIommu {
    /// Builds the pdir and resource map for the configured window.
    pub fn new(cfg: SbaIommuConfig) -> Result<Self, SbaError> {
        let pdir = SbaPdir::new(PdirConfig::new(
            cfg.iova_base,
            cfg.iova_size,
            cfg.page_size.trailing_zeros(),
        ))?;
        if !cfg.page_size.is_power_of_two() {
            return Err(SbaConfigError::UnsupportedPageSize {
                page_shift: cfg.page_size.trailing_zeros(),
            }
            .into());
        }
        let res = SbaResourceAllocator::new(ResourceConfig {
            window_start: Iova::new(cfg.iova_base),
            window_size: cfg.iova_size,
            page_size: cfg.page_size,
        })?;
        if !cfg.chunk_size.is_power_of_two()
            || cfg.chunk_size < cfg.page_size
            || cfg.chunk_size > cfg.iova_size / 2
        {
            return Err(SbaError::BadChunkSize {
                chunk: cfg.chunk_size,
                page: cfg.page_size,
            });
        }
        if cfg.delayed_frees > MAX_DELAYED_FREES {
            return Err(SbaError::TooManyDelayedFrees {
                value: cfg.delayed_frees,
                max: MAX_DELAYED_FREES,
            });
        }
        if cfg.max_mappings == 0 {
            return Err(SbaError::ZeroMappingCap);
        }
        Ok(Self {
            cfg,
            instance: next_instance(),
            pdir: Mutex::new(pdir),
            res,
            saved: Mutex::new(Vec::with_capacity(cfg.delayed_frees)),
            live: AtomicUsize::new(0),
            totals: Totals::default(),
            protection: ProtectionCounters::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SbaIommuConfig {
        &self.cfg
    }

    /// The id reported in handles and errors.
    pub fn id(&self) -> DomainId {
        self.cfg.id
    }
    /// What this IOMMU has left devices able to reach: bypassed accesses (single buffers
    /// handed out as physical addresses), refused ones (translation and permission faults),
    /// sub-page exposure (the rest of each stream's pages), unmaps whose purge was deferred
    /// to a batch and the longest unmap-to-purge window. Stale hits stay 0: the model has no
    /// device-side I/O TLB, so it cannot observe one; the window bounds how long one was
    /// possible.
    pub fn protection(&self) -> ProtectionStats {
        self.protection.snapshot()
    }

    /// Totals since creation.
    pub fn stats(&self) -> SbaStats {
        let t = &self.totals;
        SbaStats {
            bypass_maps: t.bypass_maps.load(Ordering::Relaxed),
            bypass_sg: t.bypass_sg.load(Ordering::Relaxed),
            streams: t.streams.load(Ordering::Relaxed),
            sg_entries: t.sg_entries.load(Ordering::Relaxed),
            queued: self.saved.lock().len() as u64,
            purges: t.purges.load(Ordering::Relaxed),
            purged_ranges: t.purged_ranges.load(Ordering::Relaxed),
            forced_purges: t.forced_purges.load(Ordering::Relaxed),
        }
    }

    /// The resource allocator (for inspection).
    pub fn resource_map(&self) -> &SbaResourceAllocator {
        &self.res
    }

    /// Valid pdir entries now (bytes mapped / page size).
    pub fn pdir_entries_in_use(&self) -> u64 {
        self.pdir.lock().mapped_bytes() / self.cfg.page_size
    }

    /// Live translated mappings (single buffers and scatter-gather lists).
    pub fn live_mappings(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The coalescing parameters for `dev`.
    pub fn coalesce_params(&self, dev: &Device) -> CoalesceParams {
        CoalesceParams {
            page_size: self.cfg.page_size,
            chunk_size: self.cfg.chunk_size,
            max_seg_size: dev.max_segment_size(),
            merge: self.cfg.merge,
        }
    }

    /// Purges every queued range now (teardown, or before a measurement).
    pub fn purge_all(&self, work: &mut WorkRecord) {
        work.lock(LockId::Other);
        let mut saved = self.saved.lock();
        if !saved.is_empty() {
            let now_ns = self.protection.latest_now_ns();
            self.purge(&mut saved, now_ns, work);
        }
    }

    fn window_end(&self) -> u64 {
        self.cfg.iova_base + self.cfg.iova_size
    }

    fn in_window(&self, dma: u64) -> bool {
        dma >= self.cfg.iova_base && dma < self.window_end()
    }

    /// Whether `len` bytes at `pa` can bypass for `dev`: the mask reaches them, and they do
    /// not overlap the IOV window (firmware places the window where there is no memory;
    /// a bus address inside it would be translated).
    fn can_bypass(&self, dev: &Device, pa: u64, len: u64) -> bool {
        dev.reaches(pa, len) && (pa + len <= self.cfg.iova_base || pa >= self.window_end())
    }

    /// Checks that the pdir can hold `len` bytes at `pa` (40-bit physical page numbers).
    /// Reported as the pdir refusing a map at the window's base, before anything is
    /// allocated.
    fn check_phys(&self, pa: u64, len: u64) -> Result<(), DmaError> {
        let bits = pdir_spec::PHYS_BITS;
        match pa.checked_add(len) {
            Some(end) if end <= 1u64 << bits => Ok(()),
            _ => Err(DmaError::PageTable {
                iova: self.cfg.iova_base,
                len,
                source: PgTableError::PhysOutOfRange { pa, bits },
            }),
        }
    }

    /// Takes one slot of the live-mapping cap.
    fn take_slot(&self) -> Result<(), DmaError> {
        take_live_slot(&self.live, self.cfg.max_mappings, self.cfg.id)
    }

    fn release_slot(&self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// `sba_alloc_range`: `pages` IOMMU pages below what `dev` can reach, purging the queue
    /// and retrying once on failure.
    fn alloc(
        &self,
        dev: &Device,
        pages: u64,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<IovaBlock, DmaError> {
        let limit = dev.dma_mask().saturating_add(1).min(self.window_end());
        if limit <= self.cfg.iova_base + self.cfg.page_size {
            return Err(DmaError::MaskTooSmall {
                device: dev.id(),
                mask_bits: dev.mask_bits(),
                addr: self.cfg.iova_base,
            });
        }
        let req = AllocRequest::new(pages, Iova::new(limit), cpu);
        let first = self.res.alloc(req, work);
        let result = match first {
            Err(IovaError::Exhausted { .. }) => {
                work.lock(LockId::Other);
                let mut saved = self.saved.lock();
                if saved.is_empty() {
                    first
                } else {
                    self.totals.forced_purges.fetch_add(1, Ordering::Relaxed);
                    let now_ns = self.protection.latest_now_ns();
                    self.purge(&mut saved, now_ns, work);
                    drop(saved);
                    self.res.alloc(req, work)
                }
            }
            other => other,
        };
        result.map_err(|source| DmaError::IovaSpace {
            pages,
            limit,
            source,
        })
    }

    /// Writes the pdir entries of one stream at `block`.
    fn fill(
        &self,
        block: IovaBlock,
        offset: u64,
        chunks: &[VcontigChunk],
        work: &mut WorkRecord,
    ) -> u64 {
        let page = self.cfg.page_size;
        let mut pdir = self.pdir.lock();
        let mut cursor = block.start.get();
        let mut first_offset = offset;
        for c in chunks {
            let bytes = (first_offset + c.len).div_ceil(page) * page;
            let pa = PhysAddr::new(c.pa.get() & !(page - 1));
            let mapped = pdir.map(
                Iova::new(cursor),
                pa,
                bytes,
                crate::addr::Prot::READ_WRITE,
                work,
            );
            debug_assert!(
                mapped.is_ok(),
                "pdir fill of an allocated range failed: {mapped:?}"
            );
            cursor += bytes;
            first_offset = 0;
        }
        cursor - block.start.get()
    }

    /// `sba_mark_invalid` without the purge: clears the stream's pdir entries.
    fn clear(&self, s: StreamMap, work: &mut WorkRecord) {
        let mut gather = UnmapGather::new();
        let cleared = self
            .pdir
            .lock()
            .unmap(s.block.start, s.bytes, &mut gather, work);
        debug_assert!(
            cleared.is_ok(),
            "clearing a mapped stream failed: {cleared:?}"
        );
    }

    /// Reads PCOM back, which completes every purge written before it.
    fn read_back(&self, work: &mut WorkRecord) -> PurgeDone {
        work.mmio_reads += 1;
        PurgeDone(())
    }

    /// Returns purged ranges' resource bits.
    fn release(&self, done: PurgeDone, ranges: &[(StreamMap, u64)], work: &mut WorkRecord) {
        let _ = done;
        let blocks: Vec<IovaBlock> = ranges.iter().map(|(r, _)| r.block).collect();
        let freed = self.res.free_batch(&blocks, 0, work);
        debug_assert_eq!(freed, blocks.len(), "releasing purged ranges failed");
    }

    /// Purges the queued ranges at the caller's clock `now_ns`: a PCOM write per range
    /// (clearing its pdir entries first in ia64 mode), one read-back, then the resource
    /// bits. Each range's IOTLB entries could be used by the device from its unmap until
    /// here: that window is recorded.
    fn purge(&self, saved: &mut Vec<(StreamMap, u64)>, now_ns: u64, work: &mut WorkRecord) {
        for &(s, unmapped_at_ns) in saved.iter() {
            if self.cfg.invalidate_at_purge {
                self.clear(s, work);
            }
            work.mmio_writes += 1;
            self.protection.record_window(unmapped_at_ns, now_ns);
        }
        work.purges += 1;
        let done = self.read_back(work);
        self.release(done, saved, work);
        self.totals.purges.fetch_add(1, Ordering::Relaxed);
        self.totals
            .purged_ranges
            .fetch_add(saved.len() as u64, Ordering::Relaxed);
        saved.clear();
    }

    /// `sba_unmap_single` for a mapped stream at the caller's clock `now_ns`: clears the
    /// pdir (unless ia64 mode), queues the range, and purges at the batch size (an unmap
    /// that does not purge its own range is a deferred one).
    fn retire(&self, s: StreamMap, now_ns: u64, work: &mut WorkRecord) {
        self.protection.observe_now(now_ns);
        work.lock(LockId::Other);
        let mut saved = self.saved.lock();
        if !self.cfg.invalidate_at_purge {
            self.clear(s, work);
        }
        saved.push((s, now_ns));
        if saved.len() >= self.cfg.delayed_frees.max(1) {
            self.purge(&mut saved, now_ns, work);
        } else {
            self.protection.record_deferred_unmap();
        }
    }

    /// A stream of `pages` IOMMU pages mapped for `chunks`: the rest of its pages is
    /// reachable by the device without being asked for (sub-page exposure).
    fn note_exposure(&self, pages: u64, chunks: &[VcontigChunk]) {
        let requested: u64 = chunks.iter().map(|c| c.len).sum();
        self.protection
            .record_mapping(requested, pages * self.cfg.page_size);
    }

    /// Maps one stream: allocates and fills. Returns its map and DMA address.
    fn map_stream(
        &self,
        dev: &Device,
        offset: u64,
        pages: u64,
        chunks: &[VcontigChunk],
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<(StreamMap, u64), DmaError> {
        let block = self.alloc(dev, pages, cpu, work)?;
        let bytes = self.fill(block, offset, chunks, work);
        self.note_exposure(pages, chunks);
        self.totals.streams.fetch_add(1, Ordering::Relaxed);
        Ok((StreamMap { block, bytes }, block.start.get() + offset))
    }

    fn single(
        &self,
        dev: &Device,
        pa: PhysAddr,
        len: u64,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<(u64, Option<StreamMap>), DmaError> {
        check_buffer(pa, len)?;
        if self.cfg.allow_bypass && self.can_bypass(dev, pa.get(), len) {
            self.totals.bypass_maps.fetch_add(1, Ordering::Relaxed);
            return Ok((pa.get(), None));
        }
        self.check_phys(pa.get(), len)?;
        let page = self.cfg.page_size;
        let offset = pa.get() & (page - 1);
        let bytes = (offset + len).div_ceil(page) * page;
        if bytes > self.cfg.chunk_size {
            let pages = bytes / page;
            return Err(DmaError::IovaSpace {
                pages,
                limit: self.cfg.chunk_size,
                source: IovaError::BadSize { pages },
            });
        }
        self.take_slot()?;
        let chunk = [VcontigChunk { pa, len }];
        match self.map_stream(dev, offset, bytes / page, &chunk, cpu, work) {
            Ok((m, dma)) => Ok((dma, Some(m))),
            Err(e) => {
                self.release_slot();
                Err(e)
            }
        }
    }

    fn check_instance(&self, instance: u64, owner: DomainId) -> Result<(), DmaError> {
        same_instance(instance, self.instance, owner, self.cfg.id)
    }

    /// Walks the pdir for `[dma, dma + len)` inside the window.
    fn walk(
        &self,
        dev: &Device,
        dma: u64,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault> {
        let fault = |at: u64| DmaFault {
            device: dev.id(),
            dma: DmaAddr(at),
            access,
            reason: FaultReason::Unmapped,
        };
        let page = self.cfg.page_size;
        let pdir = self.pdir.lock();
        let mut out = Vec::new();
        let mut cur = dma;
        let end = dma + len;
        while cur < end {
            work.translations += 1;
            let t = pdir.translate(Iova::new(cur), work).ok_or(fault(cur))?;
            if !t.prot.allows(access.prot()) {
                return Err(DmaFault {
                    device: dev.id(),
                    dma: DmaAddr(cur),
                    access,
                    reason: FaultReason::Permission {
                        needed: access.prot(),
                        had: t.prot,
                    },
                });
            }
            let chunk = (end - cur).min(page - (cur & (page - 1)));
            PhysRange::append_to(&mut out, t.pa, chunk);
            cur += chunk;
        }
        Ok(out)
    }
}

impl DmaPath for SbaIommu {
    fn platform(&self) -> &'static str {
        "sba"
    }

    fn map_single(
        &self,
        dev: &Device,
        pa: PhysAddr,
        len: u64,
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedBuffer, DmaError> {
        let (dma, map) = self.single(dev, pa, len, cpu, work)?;
        Ok(MappedBuffer {
            dma: DmaAddr(dma),
            len,
            dir,
            owner: self.cfg.id,
            untranslated: map.is_none(),
            token: BufferToken::Sba(SbaSingle {
                instance: self.instance,
                map,
            }),
        })
    }

    fn unmap_single(
        &self,
        buf: MappedBuffer,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedBuffer>> {
        let _ = cpu;
        let check = match &buf.token {
            BufferToken::Sba(s) => self.check_instance(s.instance, buf.owner),
            _ => Err(wrong_owner(buf.owner, self.cfg.id)),
        };
        if let Err(error) = check {
            return Err(Rejected { handle: buf, error });
        }
        if let BufferToken::Sba(SbaSingle { map: Some(m), .. }) = buf.token {
            self.retire(m, now_ns, work);
            self.release_slot();
        }
        Ok(())
    }

    fn map_sg(
        &self,
        dev: &Device,
        entries: &[SgEntry],
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedSg, DmaError> {
        check_sg(entries)?;
        let handle = |segments: Vec<DmaSegment>, streams: Vec<StreamMap>| MappedSg {
            nents: entries.len(),
            dir,
            owner: self.cfg.id,
            token: SgToken::Sba(Box::new(SbaSg {
                instance: self.instance,
                segments,
                streams,
            })),
        };
        let bypass_all = self.cfg.allow_bypass_sg
            && self.cfg.ioc_dma_mask & !dev.dma_mask() == 0
            && entries
                .iter()
                .all(|e| self.can_bypass(dev, e.pa.get(), e.len));
        if bypass_all {
            self.totals.bypass_sg.fetch_add(1, Ordering::Relaxed);
            let segments = entries
                .iter()
                .map(|e| DmaSegment {
                    dma: DmaAddr(e.pa.get()),
                    len: e.len,
                })
                .collect();
            return Ok(handle(segments, Vec::new()));
        }
        if let [e] = entries {
            // Linux's fast path: a one-entry list is a single buffer (and may bypass).
            let (dma, map) = self.single(dev, e.pa, e.len, cpu, work)?;
            if map.is_some() {
                self.totals.sg_entries.fetch_add(1, Ordering::Relaxed);
            }
            let seg = vec![DmaSegment {
                dma: DmaAddr(dma),
                len: e.len,
            }];
            return Ok(handle(seg, map.into_iter().collect()));
        }
        for e in entries {
            self.check_phys(e.pa.get(), e.len)?;
        }
        let plan = coalesce_chunks(entries, &self.coalesce_params(dev))?;
        self.take_slot()?;
        // First pass: allocate every stream (Linux allocates while coalescing), then fill.
        let mut blocks = Vec::with_capacity(plan.len());
        for s in &plan {
            match self.alloc(dev, s.pages, cpu, work) {
                Ok(b) => blocks.push(b),
                Err(e) => {
                    // Never filled, so nothing can have cached them: free at once.
                    for b in blocks {
                        let freed = self.res.free(b, cpu, work);
                        debug_assert!(freed.is_ok());
                    }
                    self.release_slot();
                    return Err(e);
                }
            }
        }
        let mut segments = Vec::with_capacity(plan.len());
        let mut streams = Vec::with_capacity(plan.len());
        for (s, &block) in plan.iter().zip(&blocks) {
            let bytes = self.fill(block, s.offset, &s.chunks, work);
            self.note_exposure(s.pages, &s.chunks);
            streams.push(StreamMap { block, bytes });
            segments.push(DmaSegment {
                dma: DmaAddr(block.start.get() + s.offset),
                len: s.len,
            });
        }
        self.totals
            .streams
            .fetch_add(plan.len() as u64, Ordering::Relaxed);
        self.totals
            .sg_entries
            .fetch_add(entries.len() as u64, Ordering::Relaxed);
        Ok(handle(segments, streams))
    }

    fn unmap_sg(
        &self,
        sg: MappedSg,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedSg>> {
        let _ = cpu;
        let check = match &sg.token {
            SgToken::Sba(s) => self.check_instance(s.instance, sg.owner),
            _ => Err(wrong_owner(sg.owner, self.cfg.id)),
        };
        if let Err(error) = check {
            return Err(Rejected { handle: sg, error });
        }
        if let SgToken::Sba(s) = sg.token {
            // `sba_unmap_sg`: one `sba_unmap_single` per DMA segment.
            if !s.streams.is_empty() {
                for m in s.streams {
                    self.retire(m, now_ns, work);
                }
                self.release_slot();
            }
        }
        Ok(())
    }

    fn translate(
        &self,
        dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault> {
        device_access(dev, dma, len, access, &self.protection, |dma| {
            let last = dma + (len - 1);
            if self.in_window(dma) {
                return Ok((self.walk(dev, dma, len, access, work)?, false));
            }
            if dma < self.cfg.iova_base && last >= self.cfg.iova_base {
                // Runs from physical space into the window: the IOC would translate the rest.
                return Err(DmaFault {
                    device: dev.id(),
                    dma: DmaAddr(self.cfg.iova_base),
                    access,
                    reason: FaultReason::Unmapped,
                });
            }
            // Outside the IOV window the IOC passes the address through: a bypass.
            work.translations += 1;
            let ranges = vec![PhysRange {
                pa: PhysAddr::new(dma),
                len,
            }];
            Ok((ranges, true))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_1G, SZ_4K, SZ_64K};
    use crate::hw::test_support::{assert_translates_to, map_to_device};

    const BASE: u64 = SZ_1G;
    const P: u64 = SZ_4K;

    fn cfg() -> SbaIommuConfig {
        SbaIommuConfig::new(DomainId(3), BASE, SZ_1G, P)
    }

    fn sba(f: impl FnOnce(&mut SbaIommuConfig)) -> SbaIommu {
        let mut c = cfg();
        f(&mut c);
        SbaIommu::new(c).unwrap()
    }

    fn e(pa: u64, len: u64) -> SgEntry {
        SgEntry::new(PhysAddr::new(pa), len)
    }

    fn params(merge: bool, max_seg: u64) -> CoalesceParams {
        CoalesceParams {
            page_size: P,
            chunk_size: 64 * P,
            max_seg_size: max_seg,
            merge,
        }
    }

    fn lens(streams: &[SbaStream]) -> Vec<u64> {
        streams.iter().map(|s| s.len).collect()
    }

    #[test]
    fn scattered_pages_coalesce_into_one_stream_with_merge_on() {
        let list: Vec<_> = (0..8).map(|i| e(0x100_0000 + i * 0x10_0000, P)).collect();
        let on = coalesce_chunks(&list, &params(true, u64::MAX)).unwrap();
        assert_eq!(lens(&on), vec![8 * P]);
        assert_eq!((on[0].pages, on[0].chunks.len()), (8, 8));
        let off = coalesce_chunks(&list, &params(false, u64::MAX)).unwrap();
        assert_eq!(off.len(), 8);
    }

    #[test]
    fn an_offset_breaks_the_stream_but_contiguity_does_not() {
        // Piece 2 starts mid-page and is not contiguous with piece 1: new stream.
        let list = [e(0x10_0000, P), e(0x20_0200, 0x200), e(0x30_0000, P)];
        let s = coalesce_chunks(&list, &params(true, u64::MAX)).unwrap();
        assert_eq!(lens(&s), vec![P, 0x200, P]);
        // Contiguous sub-page pieces merge (virtually contiguous), then an aligned page
        // after a page-aligned end joins too.
        let list = [e(0x10_0800, 0x800), e(0x10_1000, 0x1000), e(0x50_0000, P)];
        let s = coalesce_chunks(&list, &params(true, u64::MAX)).unwrap();
        assert_eq!(lens(&s), vec![0x800 + 0x1000 + P]);
        assert_eq!((s[0].offset, s[0].pages, s[0].chunks.len()), (0x800, 3, 2));
        // A piece ending mid-page stops the next page-aligned piece from joining.
        let list = [e(0x10_0000, 0x800), e(0x50_0000, P)];
        assert_eq!(
            coalesce_chunks(&list, &params(true, u64::MAX))
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn max_segment_size_and_chunk_size_cap_a_stream() {
        let list: Vec<_> = (0..8).map(|i| e(0x100_0000 + i * 0x10_0000, P)).collect();
        let s = coalesce_chunks(&list, &params(true, 3 * P)).unwrap();
        assert_eq!(lens(&s), vec![3 * P, 3 * P, 2 * P]);
        let list: Vec<_> = (0..100).map(|i| e(0x100_0000 + i * 0x10_0000, P)).collect();
        let s = coalesce_chunks(&list, &params(true, u64::MAX)).unwrap();
        assert_eq!(lens(&s), vec![64 * P, 36 * P]);
        // An entry alone larger than the chunk is refused.
        let big = [e(0, 65 * P)];
        assert!(matches!(
            coalesce_chunks(&big, &params(true, u64::MAX)),
            Err(DmaError::IovaSpace { pages: 65, .. })
        ));
    }

    #[test]
    fn bypass_returns_the_physical_address_and_touches_nothing() {
        let s = sba(|_| {});
        let dev = Device::new(1, 64).unwrap();
        let mut w = WorkRecord::new();
        let b = map_to_device(&s, &dev, 0x12_3456, 5000, &mut w).unwrap();
        assert_eq!(b.dma_addr(), DmaAddr(0x12_3456));
        assert!(b.is_untranslated());
        assert!(w.is_empty());
        assert_translates_to(
            &s,
            &dev,
            b.dma_addr(),
            5000,
            Access::Read,
            0x12_3456,
            &mut w,
        );
        assert_eq!((w.pte_reads, w.translations), (0, 1));
        assert_eq!(s.pdir_entries_in_use(), 0);
        s.unmap_single(b, 0, 0, &mut w).unwrap();
        assert_eq!((s.stats().bypass_maps, s.stats().queued), (1, 0));
    }

    #[test]
    fn a_32_bit_device_maps_high_memory_through_the_pdir() {
        let s = sba(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let pa = 0x2_0000_0100;
        let b = s
            .map_single(
                &dev,
                PhysAddr::new(pa),
                2 * P,
                Direction::FromDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert!(s.in_window(b.dma_addr().0));
        assert_eq!(b.dma_addr().0 & (P - 1), 0x100);
        assert_eq!(w.ptes_written, 3);
        assert_eq!(w.lock_count(LockId::SbaResource), 1);
        assert_translates_to(&s, &dev, b.dma_addr(), 2 * P, Access::Write, pa, &mut w);
        // Unmap clears the pdir but the purge waits.
        let mut w = WorkRecord::new();
        let dma = b.dma_addr();
        s.unmap_single(b, 0, 0, &mut w).unwrap();
        assert_eq!((w.ptes_cleared, w.mmio_writes, w.purges), (3, 0, 0));
        assert!(s.translate(&dev, dma, 1, Access::Write, &mut w).is_err());
    }

    #[test]
    fn ia64_mode_leaves_the_entries_valid_until_the_purge() {
        let s = sba(|c| c.invalidate_at_purge = true);
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let b = map_to_device(&s, &dev, 0x2_0000_0000, P, &mut w).unwrap();
        let dma = b.dma_addr();
        s.unmap_single(b, 0, 0, &mut w).unwrap();
        assert_eq!(w.ptes_cleared, 0);
        assert!(s.translate(&dev, dma, 1, Access::Read, &mut w).is_ok());
        let mut w = WorkRecord::new();
        s.purge_all(&mut w);
        assert_eq!(
            (w.ptes_cleared, w.mmio_writes, w.mmio_reads, w.purges),
            (1, 1, 1, 1)
        );
        assert!(s.translate(&dev, dma, 1, Access::Read, &mut w).is_err());
    }

    #[test]
    fn the_protection_report_counts_exposure_deferral_and_the_purge_window() {
        let s = sba(|c| c.delayed_frees = 2);
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let map = |pa: u64, len: u64, w: &mut WorkRecord| {
            s.map_single(&dev, PhysAddr::new(pa), len, Direction::ToDevice, 0, w)
                .unwrap()
        };
        // 512 bytes expose the rest of their page; a whole page exposes nothing.
        let a = map(0x2_0000_0000, 512, &mut w);
        let b = map(0x2_0001_0000, P, &mut w);
        let p = s.protection();
        assert_eq!(p.subpage_exposed_bytes, P - 512);
        assert_eq!(p.max_subpage_exposed_bytes, P - 512);
        // The first unmap waits for the batch (deferred); the second purges both.
        s.unmap_single(a, 0, 1_000, &mut w).unwrap();
        let p = s.protection();
        assert_eq!((p.deferred_unmaps, p.max_reachable_after_unmap_ns), (1, 0));
        s.unmap_single(b, 0, 5_000, &mut w).unwrap();
        let p = s.protection();
        assert_eq!(p.deferred_unmaps, 1);
        // `a` stayed purgeable-but-unpurged from 1,000 ns to the purge at 5,000 ns.
        assert_eq!(p.max_reachable_after_unmap_ns, 4_000);
        // A purge forced at teardown closes windows at the latest clock seen.
        let c = map(0x2_0002_0000, P, &mut w);
        s.unmap_single(c, 0, 6_000, &mut w).unwrap();
        s.purge_all(&mut w);
        assert_eq!(s.protection().max_reachable_after_unmap_ns, 4_000);
        assert_eq!(s.protection().deferred_unmaps, 2);
    }

    #[test]
    fn zero_delayed_frees_purge_every_unmap() {
        let s = sba(|c| c.delayed_frees = 0);
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let b = map_to_device(&s, &dev, 0x2_0000_0000, P, &mut w).unwrap();
        let mut w = WorkRecord::new();
        s.unmap_single(b, 0, 0, &mut w).unwrap();
        assert_eq!((w.mmio_writes, w.mmio_reads, w.purges), (1, 1, 1));
        assert_eq!(s.resource_map().live_blocks(), 0);
    }

    #[test]
    fn sg_streams_map_contiguously_and_translate_back() {
        let s = sba(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let list = [
            e(0x2_0000_0800, 0x800),
            e(0x2_0010_0000, P),
            e(0x2_0030_0000, 0x100),
        ];
        let m = s
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(m.segment_count(), 1);
        let seg = m.segments()[0];
        assert_eq!(seg.len, 0x800 + P + 0x100);
        let r = s
            .translate(&dev, seg.dma, seg.len, Access::Read, &mut w)
            .unwrap();
        let want = vec![
            PhysRange {
                pa: PhysAddr::new(0x2_0000_0800),
                len: 0x800,
            },
            PhysRange {
                pa: PhysAddr::new(0x2_0010_0000),
                len: P,
            },
            PhysRange {
                pa: PhysAddr::new(0x2_0030_0000),
                len: 0x100,
            },
        ];
        assert_eq!(r, want);
        assert_eq!(w.ptes_written, 3);
        s.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(s.stats().queued, 1);
        assert_eq!(s.live_mappings(), 0);
    }

    #[test]
    fn sg_bypass_needs_the_switch_and_a_full_mask() {
        let list = [e(0x10_0000, P), e(0x30_0000, P)];
        let dev = Device::new(1, 64).unwrap();
        let mut w = WorkRecord::new();
        let off = sba(|_| {});
        let m = off
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(
            m.segment_count(),
            1,
            "no SG bypass in Linux's setting: merged"
        );
        off.unmap_sg(m, 0, 0, &mut w).unwrap();
        let on = sba(|c| c.allow_bypass_sg = true);
        let mut w = WorkRecord::new();
        let m = on
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(m.segments()[0].dma, DmaAddr(0x10_0000));
        assert_eq!(m.segment_count(), 2, "bypass: no merging at all");
        assert!(w.is_empty());
        on.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(on.stats().bypass_sg, 1);
        // A 39-bit device does not cover the IOC's reach... it does; a 36-bit one does not.
        let dev36 = Device::new(2, 36).unwrap();
        let m = on
            .map_sg(&dev36, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(m.segment_count(), 1);
        on.unmap_sg(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn a_one_entry_list_takes_the_single_path() {
        let s = sba(|_| {});
        let dev = Device::new(1, 64).unwrap();
        let mut w = WorkRecord::new();
        let m = s
            .map_sg(&dev, &[e(0x10_0000, P)], Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(m.segments()[0].dma, DmaAddr(0x10_0000));
        s.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(s.stats().bypass_maps, 1);
    }

    #[test]
    fn oversized_buffers_and_wrong_handles_are_errors() {
        let s = sba(|_| {});
        let t = sba(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let e = map_to_device(&s, &dev, 0x2_0000_0000, 65 * P, &mut w).unwrap_err();
        assert!(matches!(e, DmaError::IovaSpace { pages: 65, .. }));
        let b = map_to_device(&s, &dev, 0x2_0000_0000, SZ_64K, &mut w).unwrap();
        let back = t.unmap_single(b, 0, 0, &mut w).unwrap_err();
        assert!(matches!(back.error, DmaError::WrongDomain { .. }));
        s.unmap_single(back.handle, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn memory_beyond_40_bits_is_refused_before_allocating() {
        let s = sba(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let err = map_to_device(&s, &dev, 1 << 40, P, &mut w).unwrap_err();
        assert!(matches!(err, DmaError::PageTable { .. }));
        let list = [e(0x1000, P), e((1 << 40) - 0x800, P)];
        assert!(s
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .is_err());
        assert_eq!(s.resource_map().live_blocks(), 0);
        assert_eq!(s.live_mappings(), 0);
    }

    #[test]
    fn the_mapping_cap_is_enforced() {
        let s = sba(|c| c.max_mappings = 1);
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let b = map_to_device(&s, &dev, 0x2_0000_0000, P, &mut w).unwrap();
        let e = map_to_device(&s, &dev, 0x2_0001_0000, P, &mut w).unwrap_err();
        assert!(matches!(e, DmaError::TooManyMappings { limit: 1, .. }));
        s.unmap_single(b, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn bad_configurations_are_rejected() {
        let mut c = cfg();
        c.chunk_size = 3 * P;
        assert!(matches!(
            SbaIommu::new(c),
            Err(SbaError::BadChunkSize { .. })
        ));
        let mut c = cfg();
        c.delayed_frees = MAX_DELAYED_FREES + 1;
        assert!(matches!(
            SbaIommu::new(c),
            Err(SbaError::TooManyDelayedFrees { .. })
        ));
        let mut c = cfg();
        c.page_size = 1 << 17;
        assert!(SbaIommu::new(c).is_err());
        let mut c = cfg();
        c.max_mappings = 0;
        assert_eq!(SbaIommu::new(c).unwrap_err(), SbaError::ZeroMappingCap);
    }
}
