//! Domains and the driver-side DMA API: map and unmap pages, scatter-gather lists and
//! coherent buffers.
//!
//! A translated domain owns its page table behind one lock (counted as
//! [`LockId::PageTable`]), together with the record of live mappings; it shares its IOVA
//! allocator and invalidator with whoever built it. The map path is Linux's
//! `iommu_dma_map_page`: align to the granule, allocate IOVA space below the device's mask
//! and the aperture, write the page table. The unmap path is `__iommu_dma_unmap`: clear the
//! page table into an [`UnmapGather`]; strict mode invalidates the gathered ranges and freed
//! tables, syncs, and frees the IOVA; lazy mode invalidates only freed tables (synchronously,
//! as Linux does) and queues the IOVA on the CPU's flush queue.
//!
//! Every live mapping is recorded (like Linux's dma-debug), keyed by the DMA address the
//! driver got back, so that [`Domain::unmap_raw`] can tell a double unmap, an unmap of
//! something never mapped, or one with the wrong size or direction, from a good one. The
//! record is capped ([`DomainConfig::max_mappings`]). In the direct modes the record is the
//! only state, and its lock is not counted (Linux keeps no such state there).

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::addr::{DmaAddr, Iova, PhysAddr, SZ_4G, SZ_4K};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::linux::Pci32BitFirst;
use crate::mem::{MemError, PhysAllocator};
use crate::pgtable::{IoPageTable, UnmapGather};
use crate::work::{LockId, WorkRecord};

use super::flush_queue::{FlushQueue, FlushQueueConfig, FlushQueueVariant, FreeableIova};
use super::invalidate::{invalidate_range_and_sync, sync, Invalidator};
use super::protection::{ProtectionCounters, ProtectionStats, StaleSet};
use super::sg::{align_up, sg_finalise, sg_layout, DmaSegment, SgEntry};
use super::{Device, Direction, DmaError, DomainId, DomainMode, MappingKind, Rejected};

/// How to build a [`Domain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomainConfig {
    /// The domain's id (its ASID / context), passed to the invalidator.
    pub domain_id: DomainId,
    /// Translation mode.
    pub mode: DomainMode,
    /// The IOVA granule: the allocator's page size, a multiple of the table's smallest page
    /// (translated modes only).
    pub granule: u64,
    /// The IOVA range devices may use, as `(first, one past last)`; `None`: the page table's
    /// whole range (translated modes only).
    pub aperture: Option<(Iova, Iova)>,
    /// Number of CPUs that call in (CPU numbers are `0..cpus`); lazy mode keeps one flush
    /// ring per CPU.
    pub cpus: usize,
    /// Cap on live mappings.
    pub max_mappings: usize,
    /// Flush-queue sizing (lazy mode only).
    pub flush_queue: FlushQueueConfig,
    /// Flush-queue variant: ring shape and timer-path free CPU (lazy mode only; default:
    /// per-CPU rings, freed on each ring's CPU).
    pub flush_queue_variant: FlushQueueVariant,
    /// dma-iommu's PCI 32-bit-first allocation (the "SAC trick", translated modes only):
    /// for a PCI device ([`Device::is_pci`]) whose limit is above 4 GiB, first try below
    /// 4 GiB without flushing the IOVA caches, then the whole limit. `None` (default):
    /// allocate below the device's limit at once, as `iommu.forcedac=1` does.
    pub pci_32bit_first: Option<Pci32BitFirst>,
    /// Lazy mode: when a flushed page's stale window closes (default: when the flush runs).
    pub window_close: WindowClose,
}

/// Lazy mode: when a page the flush queue held stops being reachable, for the protection
/// report's window ([`ProtectionStats::max_reachable_after_unmap_ns`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WindowClose {
    /// When the flush runs, on the caller's clock: the invalidator completes synchronously
    /// (the functional command queues do).
    #[default]
    AtFlush,
    /// When the caller reports the flush's invalidation complete with
    /// [`Domain::invalidations_completed`]: for a caller that times the command queue, whose
    /// sync completes later than the flush was issued (the lab's timed queues).
    Reported,
}

impl DomainConfig {
    /// Default cap on live mappings per domain (cloud-hypervisor's).
    pub const DEFAULT_MAX_MAPPINGS: usize = 1 << 20;

    /// A configuration with a 4 KiB granule, the page table's whole range as aperture,
    /// one CPU, the default mapping cap and Linux's flush-queue sizing.
    pub fn new(domain_id: DomainId, mode: DomainMode) -> Self {
        Self {
            domain_id,
            mode,
            granule: SZ_4K,
            aperture: None,
            cpus: 1,
            max_mappings: Self::DEFAULT_MAX_MAPPINGS,
            flush_queue: FlushQueueConfig::default(),
            flush_queue_variant: FlushQueueVariant::default(),
            pci_32bit_first: None,
            window_close: WindowClose::AtFlush,
        }
    }
}

/// A mapping made by [`Domain::map_page`]. Unmap it with [`Domain::unmap_page`] (or by
/// address with [`Domain::unmap_raw`]); dropping it leaks the mapping, as forgetting to
/// unmap does in a driver.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a DMA mapping stays live (and its IOVA allocated) until it is unmapped"]
pub struct DmaMapping {
    domain: DomainId,
    dma: DmaAddr,
    len: u64,
    dir: Direction,
    generation: u64,
}

impl DmaMapping {
    /// The address the device uses for the buffer's first byte.
    pub fn dma_addr(&self) -> DmaAddr {
        self.dma
    }

    /// Length of the buffer.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer is empty (never: mappings are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Direction it was mapped for.
    pub fn direction(&self) -> Direction {
        self.dir
    }

    /// The domain that made it.
    pub fn domain_id(&self) -> DomainId {
        self.domain
    }
}

/// A scatter-gather mapping made by [`Domain::map_sg`]: the DMA segments for the device.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a DMA mapping stays live (and its IOVA allocated) until it is unmapped"]
pub struct DmaSgMapping {
    domain: DomainId,
    dir: Direction,
    generation: u64,
    nents: usize,
    segments: Vec<DmaSegment>,
}

impl DmaSgMapping {
    /// The DMA segments, in list order (fewer than the entries when merged).
    pub fn segments(&self) -> &[DmaSegment] {
        &self.segments
    }

    /// Number of list entries that were mapped.
    pub fn nents(&self) -> usize {
        self.nents
    }

    /// Direction it was mapped for.
    pub fn direction(&self) -> Direction {
        self.dir
    }

    /// The domain that made it.
    pub fn domain_id(&self) -> DomainId {
        self.domain
    }

    /// The record key: the first segment's address.
    fn key(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.dma.0)
    }
}

/// A zeroed, page-aligned buffer mapped bidirectionally, from [`Domain::alloc_coherent`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a coherent buffer stays allocated and mapped until it is freed"]
pub struct CoherentBuffer {
    mapping: DmaMapping,
    pa: PhysAddr,
}

impl CoherentBuffer {
    /// The address the device uses.
    pub fn dma_addr(&self) -> DmaAddr {
        self.mapping.dma
    }

    /// The address the CPU uses (the physical pages).
    pub fn phys_addr(&self) -> PhysAddr {
        self.pa
    }

    /// Size in bytes (the request rounded up to whole pages of the granule).
    pub fn size(&self) -> u64 {
        self.mapping.len
    }

    /// The domain that made it.
    pub fn domain_id(&self) -> DomainId {
        self.mapping.domain
    }
}

/// IOVA ranges mapped for one live mapping (padding between scatter-gather pieces is not).
#[derive(Debug)]
enum Runs {
    One((Iova, u64)),
    Many(Box<[(Iova, u64)]>),
}

impl Runs {
    fn as_slice(&self) -> &[(Iova, u64)] {
        match self {
            Runs::One(run) => std::slice::from_ref(run),
            Runs::Many(runs) => runs,
        }
    }
}

/// One live mapping.
#[derive(Debug)]
struct Live {
    kind: MappingKind,
    dir: Direction,
    /// The length the driver mapped (scatter-gather: the sum of its entries).
    len: u64,
    /// IOVA range and mapped runs, in translated modes.
    translated: Option<(IovaBlock, Runs)>,
}

/// A small multiplicative hasher (FxHash's step) for the live-mapping record's integer
/// keys: far cheaper than SipHash, and nothing depends on the map's iteration order (the
/// one scan, [`LiveMap::find_raw`], sorts what it finds).
#[derive(Default, Clone, Copy)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // The product's low bits depend only on the key's low bits, which are zero for
        // page-aligned DMA addresses, and the hash table picks buckets by the low bits:
        // without the rotation every address key lands in the same bucket group and each
        // insert probes the whole table. Rotating brings the well-mixed high bits down.
        self.0.rotate_left(26)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The live mappings at one DMA address, oldest generation first. In the translated modes
/// every live mapping has its own IOVA, so an address holds one mapping; only the direct
/// modes map one buffer several times.
///
/// The common single mapping is [`Packed`] inline, so a hash-map bucket (key and value) is
/// 32 bytes: with thousands of mappings live (8,192 with 256 CPUs at iodepth 32) the map
/// outgrows the host's L2 cache, and each map and unmap touches a bucket that other I/Os
/// have evicted; a bucket of 72 bytes spanned two cache lines and the table twice the
/// memory. Anything that does not pack is boxed (same contents, one more pointer).
#[derive(Debug)]
enum AtAddr {
    Packed(Packed),
    One(Box<(u64, Live)>),
    // Boxed (a thin pointer) to keep the variant, and so the bucket, small.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<(u64, Live)>>),
}

// `LiveMap::remove` forgets a removed packed record instead of dropping it: that is only
// right while it owns nothing to drop.
const _: () = assert!(!std::mem::needs_drop::<Packed>());

// The point of `Packed` (see above): keep the bucket at 32 bytes.
const _: () = assert!(std::mem::size_of::<(u64, AtAddr)>() <= 32);

/// A [`Live`] record without a heap part, with its generation: direct-mode records, and
/// translated ones whose IOVA block starts at the DMA address rounded down to the granule
/// and holds one mapped run from the block's start, of the granule-rounded length (what
/// [`Domain::map_page`] makes), with at most `u32::MAX` pages. [`Packed::pack`] checks
/// that [`Packed::unpack`] gives back exactly the record.
#[derive(Debug, Clone, Copy)]
struct Packed {
    generation: u64,
    len: u64,
    pages: u32,
    kind: MappingKind,
    dir: Direction,
    translated: bool,
}

impl Packed {
    /// The run a translated packed record maps at `dma`: (block start, run length).
    fn run(dma: u64, len: u64, granule: u64) -> Option<(u64, u64)> {
        if !granule.is_power_of_two() {
            return None;
        }
        let start = dma & !(granule - 1);
        Some((start, align_up(dma - start + len, granule)?))
    }

    /// `live` packed, if it packs exactly.
    fn pack(dma: u64, generation: u64, live: &Live, granule: u64) -> Option<Self> {
        let packed = |pages, translated| Self {
            generation,
            len: live.len,
            pages,
            kind: live.kind,
            dir: live.dir,
            translated,
        };
        match &live.translated {
            None => Some(packed(0, false)),
            Some((block, Runs::One((run_start, run_len)))) => {
                let pages = u32::try_from(block.pages).ok()?;
                let (start, len) = Self::run(dma, live.len, granule)?;
                (block.start.get() == start && run_start.get() == start && *run_len == len)
                    .then(|| packed(pages, true))
            }
            Some((_, Runs::Many(_))) => None,
        }
    }

    /// The packed record of a translated single mapping as [`Domain::map_page`] makes it:
    /// `len` bytes at `dma` in a block of `pages` starting at `dma` rounded down to the
    /// granule, mapped as one run of the granule-rounded length from the block's start.
    /// Exactly what [`Packed::pack`] makes of that record (`None` where it would not pack).
    #[inline]
    fn mapped(
        generation: u64,
        len: u64,
        kind: MappingKind,
        dir: Direction,
        pages: u64,
    ) -> Option<Self> {
        Some(Self {
            generation,
            len,
            pages: u32::try_from(pages).ok()?,
            kind,
            dir,
            translated: true,
        })
    }

    /// The record this was packed from.
    fn unpack(&self, dma: u64, granule: u64) -> Live {
        let translated = self.translated.then(|| {
            let (start, len) = Self::run(dma, self.len, granule).expect("checked when packed");
            let block = IovaBlock {
                start: Iova::new(start),
                pages: u64::from(self.pages),
            };
            (block, Runs::One((block.start, len)))
        });
        Live {
            kind: self.kind,
            dir: self.dir,
            len: self.len,
            translated,
        }
    }
}

impl AtAddr {
    /// (generation, kind, length, direction) of each mapping here.
    fn summaries(&self) -> impl Iterator<Item = (u64, MappingKind, u64, Direction)> + '_ {
        let (one, many) = match self {
            AtAddr::Packed(p) => (Some((p.generation, p.kind, p.len, p.dir)), &[][..]),
            AtAddr::One(b) => (Some((b.0, b.1.kind, b.1.len, b.1.dir)), &[][..]),
            AtAddr::Many(v) => (None, &v[..]),
        };
        one.into_iter()
            .chain(many.iter().map(|(g, l)| (*g, l.kind, l.len, l.dir)))
    }

    /// Whether generation `generation` is live here.
    #[cfg(test)]
    fn holds(&self, generation: u64) -> bool {
        match self {
            AtAddr::Packed(p) => p.generation == generation,
            AtAddr::One(b) => b.0 == generation,
            AtAddr::Many(v) => v.iter().any(|&(g, _)| g == generation),
        }
    }
}

/// The record of live mappings, keyed by (DMA address, generation): one hash map by DMA
/// address (every hot-path access is an exact lookup; a B-tree walk over thousands of live
/// mappings cost a cache miss per level), each entry holding the generations live there,
/// which `unmap_raw` (unmap by address) looks through.
#[derive(Debug)]
pub(super) struct LiveMap {
    by_addr: HashMap<u64, AtAddr, BuildHasherDefault<KeyHasher>>,
    len: usize,
    limit: usize,
    domain: DomainId,
    /// The domain's granule, which [`Packed`] records are unpacked with.
    granule: u64,
}

impl LiveMap {
    fn new(domain: DomainId, limit: usize, granule: u64) -> Self {
        Self {
            by_addr: HashMap::default(),
            len: 0,
            limit,
            domain,
            granule,
        }
    }

    /// Records a live mapping (its key must not be live).
    #[inline]
    fn insert(&mut self, key: (u64, u64), live: Live) {
        let (dma, generation) = key;
        let granule = self.granule;
        match self.by_addr.entry(dma) {
            Entry::Vacant(e) => {
                e.insert(match Packed::pack(dma, generation, &live, granule) {
                    Some(p) => AtAddr::Packed(p),
                    None => AtAddr::One(Box::new((generation, live))),
                });
            }
            Entry::Occupied(mut e) => {
                let at = e.get_mut();
                let mut gens = match std::mem::replace(at, AtAddr::Many(Box::default())) {
                    AtAddr::Packed(p) => vec![(p.generation, p.unpack(dma, granule))],
                    AtAddr::One(b) => vec![*b],
                    AtAddr::Many(gens) => *gens,
                };
                let i = gens.partition_point(|&(g, _)| g < generation);
                gens.insert(i, (generation, live));
                *at = AtAddr::Many(Box::new(gens));
            }
        }
        self.len += 1;
    }

    /// Records a live mapping already packed (its key must not be live): what
    /// [`LiveMap::insert`] does with the record `p` unpacks to, without packing it again.
    #[inline]
    fn insert_packed(&mut self, dma: u64, p: Packed) {
        match self.by_addr.entry(dma) {
            Entry::Vacant(e) => {
                e.insert(AtAddr::Packed(p));
                self.len += 1;
            }
            Entry::Occupied(_) => self.insert((dma, p.generation), p.unpack(dma, self.granule)),
        }
    }

    /// Removes a live mapping's record, if present.
    #[inline]
    fn remove(&mut self, key: &(u64, u64)) -> Option<Live> {
        let &(dma, generation) = key;
        let Entry::Occupied(mut e) = self.by_addr.entry(dma) else {
            return None;
        };
        let live = match e.get_mut() {
            AtAddr::Packed(p) if p.generation == generation => {
                let live = p.unpack(dma, self.granule);
                // A packed record owns nothing on the heap (checked at build time below the
                // type): forgetting it skips the drop glue of the boxed variants (a call per
                // unmap).
                std::mem::forget(e.remove());
                live
            }
            AtAddr::One(b) if b.0 == generation => match e.remove() {
                AtAddr::One(b) => b.1,
                _ => unreachable!("matched One"),
            },
            AtAddr::Packed(_) | AtAddr::One(_) => return None,
            AtAddr::Many(v) => {
                let i = v.iter().position(|&(g, _)| g == generation)?;
                let (_, l) = v.remove(i);
                if v.is_empty() {
                    e.remove();
                }
                l
            }
        };
        self.len -= 1;
        Some(live)
    }

    /// Number of live mappings.
    fn len(&self) -> usize {
        self.len
    }

    fn check_room(&self) -> Result<(), DmaError> {
        if self.len >= self.limit {
            return Err(DmaError::TooManyMappings {
                domain: self.domain,
                limit: self.limit,
            });
        }
        Ok(())
    }

    fn not_mapped(&self, dma: u64) -> DmaError {
        DmaError::NotMapped {
            domain: self.domain,
            dma,
        }
    }

    /// Takes out the record of the mapping at `dma` of generation `generation` (what a
    /// handle refers to), in one lookup; the record is unchanged if it is not live.
    #[inline]
    fn take_handle(&mut self, dma: u64, generation: u64) -> Result<((u64, u64), Live), DmaError> {
        let key = (dma, generation);
        match self.remove(&key) {
            Some(live) => Ok((key, live)),
            None => Err(self.not_mapped(dma)),
        }
    }

    /// The record a handle refers to.
    #[cfg(test)]
    fn find_handle(&self, dma: u64, generation: u64) -> Result<(u64, u64), DmaError> {
        let key = (dma, generation);
        let live = self
            .by_addr
            .get(&dma)
            .is_some_and(|at| at.holds(generation));
        if live {
            Ok(key)
        } else {
            Err(self.not_mapped(dma))
        }
    }

    /// The single mapping at `dma` matching `len` and `dir` (in the direct modes several
    /// mappings may share an address; the first, oldest generation first, that matches is
    /// taken), found through the by-address index.
    fn find_raw(&self, dma: u64, len: u64, dir: Direction) -> Result<(u64, u64), DmaError> {
        let at = self
            .by_addr
            .get(&dma)
            .into_iter()
            .flat_map(AtAddr::summaries);
        let mut first_err = None;
        for (g, kind, mapped_len, mapped_dir) in at {
            let key = (dma, g);
            let err = if kind != MappingKind::Single {
                DmaError::KindMismatch {
                    dma,
                    mapped: kind,
                    given: MappingKind::Single,
                }
            } else if mapped_len != len {
                DmaError::SizeMismatch {
                    dma,
                    mapped: mapped_len,
                    given: len,
                }
            } else if mapped_dir != dir {
                DmaError::DirectionMismatch {
                    dma,
                    mapped: mapped_dir,
                    given: dir,
                }
            } else {
                return Ok(key);
            };
            first_err.get_or_insert(err);
        }
        Err(first_err.unwrap_or_else(|| self.not_mapped(dma)))
    }
}

/// What the page-table lock protects.
pub(super) struct TState {
    pub(super) table: Box<dyn IoPageTable>,
    live: LiveMap,
    /// Lazy mode: unmapped runs the IOTLB may still translate (see [`super::protection`]).
    /// (Boxed: its indexes would make every domain backend as large as a translated one.)
    pub(super) stale: Box<StaleSet>,
}

/// The parts of a translated domain.
pub(super) struct Translated {
    pub(super) state: Mutex<TState>,
    allocator: Arc<dyn IovaAllocator>,
    invalidator: Arc<dyn Invalidator>,
    fq: Option<FlushQueue>,
    /// Usable IOVA range: the aperture narrowed to the allocator's range.
    aperture: (Iova, Iova),
    /// The PCI 32-bit-first policy, if any.
    pci_32bit_first: Option<Pci32BitFirst>,
    /// Devices that stopped trying below 4 GiB after a failure
    /// ([`Pci32BitFirst::UntilFirstFailure`]; Linux clears `pci_32bit_workaround`).
    full_range_devices: Box<Mutex<Vec<u32>>>,
    /// Whether `full_range_devices` may be non-empty (set before the first push), so a map
    /// looks it up only once some device has given up.
    any_full_range: AtomicBool,
    /// When a flushed page's stale window closes.
    window_close: WindowClose,
}

/// The two kinds of domain.
pub(super) enum Backend {
    /// No IOMMU or passthrough: only the record of live mappings.
    Direct(Mutex<LiveMap>),
    /// Translated through a page table.
    Translated(Translated),
}

/// One IOMMU domain. Thread-safe: every method takes `&self`. See the module docs.
pub struct Domain {
    id: DomainId,
    mode: DomainMode,
    granule: u64,
    cpus: usize,
    next_generation: AtomicU64,
    pub(super) backend: Backend,
    pub(super) protection: ProtectionCounters,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("id", &self.id)
            .field("mode", &self.mode)
            .field("granule", &self.granule)
            .field("live_mappings", &self.live_mappings())
            .finish()
    }
}

thread_local! {
    /// The gather of the calling thread's unmaps, reused (cleared) so an unmap does not
    /// allocate. Borrowed for a whole unmap; an unmap that finds it borrowed (nothing
    /// re-enters an unmap today) uses a fresh one.
    static GATHER: RefCell<UnmapGather> = const {
        RefCell::new(UnmapGather {
            ranges: Vec::new(),
            freed_tables: Vec::new(),
        })
    };
}

/// Returns an IOVA range that was allocated but never mapped (the map error paths).
fn release_unmapped(
    allocator: &dyn IovaAllocator,
    block: IovaBlock,
    cpu: usize,
    w: &mut WorkRecord,
) {
    let freed = FreeableIova::never_mapped(block).free(allocator, cpu, w);
    debug_assert!(
        freed.is_ok(),
        "freeing a just-allocated IOVA failed: {freed:?}"
    );
}

impl Translated {
    /// Exclusive IOVA limit for `dev`: its mask and the aperture.
    fn limit(&self, dev: &Device) -> Result<u64, DmaError> {
        let end = dev.dma_mask().saturating_add(1);
        let limit = end.min(self.aperture.1.get());
        if limit <= self.aperture.0.get() {
            return Err(DmaError::MaskTooSmall {
                device: dev.id(),
                mask_bits: dev.mask_bits(),
                addr: self.aperture.0.get(),
            });
        }
        Ok(limit)
    }

    fn alloc(
        &self,
        dev: &Device,
        pages: u64,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<IovaBlock, DmaError> {
        let limit = self.limit(dev)?;
        if let Some(policy) = self.pci_32bit_first {
            if dev.is_pci() && limit > SZ_4G && self.aperture.0.get() < SZ_4G {
                if let Some(block) = self.alloc_32bit_first(dev, policy, pages, cpu, work) {
                    return Ok(block);
                }
                work.iova_full_range_allocs += 1;
            }
        }
        let req = AllocRequest::new(pages, Iova::new(limit), cpu);
        self.allocator
            .alloc(req, work)
            .map_err(|source| match source {
                IovaError::LimitTooLow { start, .. } => DmaError::MaskTooSmall {
                    device: dev.id(),
                    mask_bits: dev.mask_bits(),
                    addr: start,
                },
                source => DmaError::IovaSpace {
                    pages,
                    limit,
                    source,
                },
            })
    }

    /// dma-iommu's 32-bit try for a PCI device (`iommu_dma_alloc_iova`): below 4 GiB, the
    /// caches not flushed on failure. A failure is counted, and under
    /// [`Pci32BitFirst::UntilFirstFailure`] the device stops trying. `None`: allocate from
    /// the whole limit.
    fn alloc_32bit_first(
        &self,
        dev: &Device,
        policy: Pci32BitFirst,
        pages: u64,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Option<IovaBlock> {
        let once = policy == Pci32BitFirst::UntilFirstFailure;
        if once
            && self.any_full_range.load(Ordering::Acquire)
            && self.full_range_devices.lock().contains(&dev.id())
        {
            return None;
        }
        let req = AllocRequest::new(pages, Iova::new(SZ_4G), cpu);
        match self.allocator.alloc_without_flush(req, work) {
            Ok(block) => Some(block),
            Err(_) => {
                work.iova_32bit_failures += 1;
                if once {
                    let mut given_up = self.full_range_devices.lock();
                    if !given_up.contains(&dev.id()) {
                        self.any_full_range.store(true, Ordering::Release);
                        given_up.push(dev.id());
                    }
                }
                None
            }
        }
    }

    /// Issues strict invalidation of everything in `gather` (leaf ranges, then freed
    /// tables); the caller syncs.
    fn invalidate_now(&self, domain: DomainId, gather: &UnmapGather, work: &mut WorkRecord) {
        for r in &gather.ranges {
            self.invalidator.invalidate_range(domain, r, work);
        }
        for t in &gather.freed_tables {
            self.invalidator.invalidate_walk(domain, t, work);
        }
    }

    /// After the page table no longer maps `block`: invalidate and free it (strict) or
    /// invalidate freed tables and queue it (lazy).
    #[allow(clippy::too_many_arguments)]
    fn retire(
        &self,
        domain: DomainId,
        block: IovaBlock,
        gather: &UnmapGather,
        cpu: usize,
        now_ns: u64,
        protection: &ProtectionCounters,
        work: &mut WorkRecord,
    ) -> Result<(), DmaError> {
        match &self.fq {
            None => {
                let done = match gather.ranges.split_last() {
                    // The usual case: no freed tables, so the last leaf range is the last
                    // invalidation before the sync, and both go in one call.
                    Some((last, rest)) if gather.freed_tables.is_empty() => {
                        for r in rest {
                            self.invalidator.invalidate_range(domain, r, work);
                        }
                        invalidate_range_and_sync(&*self.invalidator, domain, last, work)
                    }
                    _ => {
                        self.invalidate_now(domain, gather, work);
                        sync(&*self.invalidator, work)
                    }
                };
                let freed = FreeableIova::after_sync(block, done).free(&*self.allocator, cpu, work);
                debug_assert!(freed.is_ok(), "freeing a mapped IOVA failed: {freed:?}");
                Ok(())
            }
            Some(fq) => {
                // Freed table pages are invalidated now even in lazy mode: the walk caches
                // must not keep pointing at memory that is being reused.
                if !gather.freed_tables.is_empty() {
                    for t in &gather.freed_tables {
                        self.invalidator.invalidate_walk(domain, t, work);
                    }
                    let _synced = sync(&*self.invalidator, work);
                }
                let stamp = fq.queue(block, cpu, now_ns, work)?;
                protection.record_deferred_unmap();
                let mut st = self.state.lock();
                st.stale.stamp_pending(stamp);
                if self.window_close == WindowClose::AtFlush {
                    st.stale.retire(fq.flush_counts().1, now_ns, protection);
                }
                Ok(())
            }
        }
    }
}

impl Domain {
    /// A domain without translation: [`DomainMode::NoIommu`] or [`DomainMode::Identity`].
    /// The granule, aperture and flush-queue settings are unused.
    pub fn direct(config: DomainConfig) -> Result<Self, DmaError> {
        if config.mode.is_translated() {
            return Err(DmaError::Config {
                reason: "a translated mode needs a page table",
            });
        }
        Self::check_common(&config)?;
        let live = LiveMap::new(config.domain_id, config.max_mappings, config.granule);
        Ok(Self::assemble(config, Backend::Direct(Mutex::new(live))))
    }

    /// A translated domain ([`DomainMode::Strict`] or [`DomainMode::Lazy`]) over `table`,
    /// allocating from `allocator` and invalidating through `invalidator`.
    ///
    /// The granule must equal the allocator's and be a multiple of the table's smallest page;
    /// the aperture must lie within the table's range, and the allocator must not hand out
    /// IOVAs below the aperture.
    pub fn translated(
        config: DomainConfig,
        table: Box<dyn IoPageTable>,
        allocator: Arc<dyn IovaAllocator>,
        invalidator: Arc<dyn Invalidator>,
    ) -> Result<Self, DmaError> {
        let cfg = |reason| Err(DmaError::Config { reason });
        if !config.mode.is_translated() {
            return cfg("a direct mode takes no page table");
        }
        Self::check_common(&config)?;
        let g = config.granule;
        if !g.is_power_of_two() || g < SZ_4K {
            return cfg("the granule must be a power of two of at least 4 KiB");
        }
        if allocator.granule() != g {
            return cfg("the allocator's granule differs from the domain's");
        }
        if table.granule() > g {
            return cfg("the page table's smallest page is larger than the granule");
        }
        let table_range = table.iova_range();
        let ap = config.aperture.unwrap_or(table_range);
        if ap.0 >= ap.1 || ap.0 < table_range.0 || ap.1 > table_range.1 {
            return cfg("the aperture is empty or outside the page table's range");
        }
        if !ap.0.is_aligned(g) {
            return cfg("the aperture does not start on a granule boundary");
        }
        let (a_start, a_end) = allocator.range();
        if a_start < ap.0 {
            return cfg("the allocator hands out IOVAs below the aperture");
        }
        let aperture = (a_start, a_end.min(ap.1));
        if aperture.0 >= aperture.1 {
            return cfg("the allocator's range and the aperture do not overlap");
        }
        let fq = match config.mode {
            DomainMode::Lazy => Some(FlushQueue::with_variant(
                config.domain_id,
                config.cpus,
                config.flush_queue,
                config.flush_queue_variant,
                invalidator.clone(),
                allocator.clone(),
            )?),
            _ => None,
        };
        let state = TState {
            table,
            live: LiveMap::new(config.domain_id, config.max_mappings, g),
            stale: Box::default(),
        };
        let t = Translated {
            state: Mutex::new(state),
            allocator,
            invalidator,
            fq,
            aperture,
            pci_32bit_first: config.pci_32bit_first,
            full_range_devices: Box::default(),
            any_full_range: AtomicBool::new(false),
            window_close: config.window_close,
        };
        Ok(Self::assemble(config, Backend::Translated(t)))
    }

    fn check_common(config: &DomainConfig) -> Result<(), DmaError> {
        if config.cpus == 0 {
            return Err(DmaError::Config {
                reason: "a domain needs at least one CPU",
            });
        }
        if config.max_mappings == 0 {
            return Err(DmaError::Config {
                reason: "the mapping cap must be at least 1",
            });
        }
        Ok(())
    }

    fn assemble(config: DomainConfig, backend: Backend) -> Self {
        let granule = if config.mode.is_translated() {
            config.granule
        } else {
            SZ_4K
        };
        Self {
            id: config.domain_id,
            mode: config.mode,
            granule,
            cpus: config.cpus,
            next_generation: AtomicU64::new(1),
            backend,
            protection: ProtectionCounters::new(),
        }
    }

    /// The domain's id.
    pub fn id(&self) -> DomainId {
        self.id
    }

    /// The domain's mode.
    pub fn mode(&self) -> DomainMode {
        self.mode
    }

    /// The IOVA granule (4 KiB in the direct modes).
    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// Number of CPUs the domain serves.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// The usable IOVA range (translated modes).
    pub fn aperture(&self) -> Option<(Iova, Iova)> {
        match &self.backend {
            Backend::Direct(_) => None,
            Backend::Translated(t) => Some(t.aperture),
        }
    }

    /// The IOVA allocator (translated modes).
    pub fn allocator(&self) -> Option<&Arc<dyn IovaAllocator>> {
        match &self.backend {
            Backend::Direct(_) => None,
            Backend::Translated(t) => Some(&t.allocator),
        }
    }

    /// The flush queue (lazy mode).
    pub fn flush_queue(&self) -> Option<&FlushQueue> {
        match &self.backend {
            Backend::Translated(t) => t.fq.as_ref(),
            Backend::Direct(_) => None,
        }
    }

    /// Number of live mappings (single, scatter-gather and coherent).
    pub fn live_mappings(&self) -> usize {
        match &self.backend {
            Backend::Direct(l) => l.lock().len(),
            Backend::Translated(t) => t.state.lock().live.len(),
        }
    }

    /// Bytes the page table maps (0 in the direct modes).
    pub fn mapped_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Direct(_) => 0,
            Backend::Translated(t) => t.state.lock().table.mapped_bytes(),
        }
    }

    /// Page-table pages allocated (0 in the direct modes).
    pub fn table_pages(&self) -> usize {
        match &self.backend {
            Backend::Direct(_) => 0,
            Backend::Translated(t) => t.state.lock().table.table_pages(),
        }
    }

    /// Lazy mode: fires the flush-queue timer if `now_ns` is past its deadline. Returns
    /// whether it fired (always `false` in other modes).
    pub fn poll_timeout(&self, now_ns: u64, work: &mut WorkRecord) -> bool {
        self.poll_timeout_with(now_ns, None, work)
    }

    /// As [`Domain::poll_timeout`], with the timer firing on `cpu` (which matters with
    /// [`super::TimerFreeCpu::TimerCpu`]: the freed IOVAs go to `cpu`'s cache).
    pub fn poll_timeout_on(&self, now_ns: u64, cpu: usize, work: &mut WorkRecord) -> bool {
        self.poll_timeout_with(now_ns, Some(cpu), work)
    }

    fn poll_timeout_with(&self, now_ns: u64, cpu: Option<usize>, work: &mut WorkRecord) -> bool {
        self.protection.observe_now(now_ns);
        let fired = self.flush_queue().is_some_and(|fq| match cpu {
            Some(cpu) => fq.poll_timeout_on(now_ns, cpu, work),
            None => fq.poll_timeout(now_ns, work),
        });
        if fired && self.closes_windows_at_flush() {
            self.retire_stale(now_ns);
        }
        fired
    }

    /// Lazy mode: flushes and frees everything queued (teardown). No-op in other modes. The
    /// flush completes at the latest clock the domain has seen.
    pub fn flush_all(&self, work: &mut WorkRecord) {
        if let Some(fq) = self.flush_queue() {
            fq.flush_all(work);
            self.retire_stale(self.protection.latest_now_ns());
        }
    }

    /// Whether a flush closes its pages' stale windows when it runs ([`WindowClose::AtFlush`];
    /// `true` outside lazy mode, where nothing is held).
    fn closes_windows_at_flush(&self) -> bool {
        match &self.backend {
            Backend::Translated(t) => t.window_close == WindowClose::AtFlush,
            Backend::Direct(_) => true,
        }
    }

    /// Lazy mode with [`WindowClose::Reported`]: the invalidations of every flush counted in
    /// `finished` (a [`FlushQueue::flush_counts`] finish count the caller read after the
    /// flushes ran) completed at `now_ns`; the pages they held stop being reachable then.
    /// A count at or below one already reported changes nothing (a sync completes every
    /// command before it, so a later report covers an earlier one). No-op in other modes.
    pub fn invalidations_completed(&self, finished: u64, now_ns: u64) {
        self.protection.observe_now(now_ns);
        if let Backend::Translated(t) = &self.backend {
            if t.fq.is_some() {
                t.state
                    .lock()
                    .stale
                    .retire(finished, now_ns, &self.protection);
            }
        }
    }

    /// Drops the stale translations every completed flush covers, as of `now_ns`.
    fn retire_stale(&self, now_ns: u64) {
        if let (Backend::Translated(t), Some(fq)) = (&self.backend, self.flush_queue()) {
            let finished = fq.flush_counts().1;
            t.state
                .lock()
                .stale
                .retire(finished, now_ns, &self.protection);
        }
    }

    /// What the domain has left devices able to reach so far (see [`super::protection`]).
    /// Pages still waiting for their flush count as reachable up to the latest clock seen.
    pub fn protection(&self) -> ProtectionStats {
        let mut s = self.protection.snapshot();
        if let Backend::Translated(t) = &self.backend {
            let open = t
                .state
                .lock()
                .stale
                .open_window_ns(self.protection.latest_now_ns());
            s.max_reachable_after_unmap_ns = s.max_reachable_after_unmap_ns.max(open);
        }
        s
    }

    fn check_cpu(&self, cpu: usize) -> Result<(), DmaError> {
        if cpu >= self.cpus {
            return Err(DmaError::BadCpu {
                cpu,
                cpus: self.cpus,
            });
        }
        Ok(())
    }

    fn generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    fn mask_too_small(dev: &Device, addr: u64) -> DmaError {
        DmaError::MaskTooSmall {
            device: dev.id(),
            mask_bits: dev.mask_bits(),
            addr: addr.max(dev.dma_mask().saturating_add(1)),
        }
    }

    /// Maps `len` bytes at `pa` for `dev` (Linux `dma_map_page`). Translated modes allocate
    /// IOVA space below the device's mask and map whole granules; the returned address keeps
    /// `pa`'s offset within its granule. Direct modes return `pa` itself, if the mask
    /// reaches it.
    pub fn map_page(
        &self,
        dev: &Device,
        pa: PhysAddr,
        len: u64,
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<DmaMapping, DmaError> {
        self.map_single(dev, pa, len, dir, MappingKind::Single, cpu, work)
    }

    #[allow(clippy::too_many_arguments)]
    fn map_single(
        &self,
        dev: &Device,
        pa: PhysAddr,
        len: u64,
        dir: Direction,
        kind: MappingKind,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<DmaMapping, DmaError> {
        self.check_cpu(cpu)?;
        let bad = DmaError::BadBuffer { pa: pa.get(), len };
        if len == 0 || pa.checked_add(len).is_none() {
            return Err(bad);
        }
        let generation = self.generation();
        let handle = |dma: u64| DmaMapping {
            domain: self.id,
            dma: DmaAddr(dma),
            len,
            dir,
            generation,
        };
        let record = |translated| Live {
            kind,
            dir,
            len,
            translated,
        };
        match &self.backend {
            Backend::Direct(live) => {
                if !dev.reaches(pa.get(), len) {
                    return Err(Self::mask_too_small(dev, pa.get()));
                }
                let mut live = live.lock();
                live.check_room()?;
                live.insert((pa.get(), generation), record(None));
                Ok(handle(pa.get()))
            }
            Backend::Translated(t) => {
                let g = self.granule;
                let off = pa.offset_in(g);
                let map_len = align_up(off + len, g).ok_or(bad)?;
                let block = t.alloc(dev, map_len / g, cpu, work)?;
                work.lock(LockId::PageTable);
                let mut guard = t.state.lock();
                let st = &mut *guard;
                let mapped = st.live.check_room().and_then(|()| {
                    st.table
                        .map(block.start, pa.align_down(g), map_len, dir.prot(), work)
                        .map_err(|source| DmaError::PageTable {
                            iova: block.start.get(),
                            len: map_len,
                            source,
                        })
                });
                if let Err(e) = mapped {
                    drop(guard);
                    release_unmapped(&*t.allocator, block, cpu, work);
                    return Err(e);
                }
                let dma = block.start.get() + off;
                self.protection.record_mapping(len, map_len);
                // The block starts at `dma` rounded down and holds one run of `map_len`
                // from its start: the record packs, unless the block is huge.
                match Packed::mapped(generation, len, kind, dir, block.pages) {
                    Some(p) => st.live.insert_packed(dma, p),
                    None => {
                        let runs = Runs::One((block.start, map_len));
                        st.live
                            .insert((dma, generation), record(Some((block, runs))));
                    }
                }
                Ok(handle(dma))
            }
        }
    }

    /// Unmaps a mapping made by [`Domain::map_page`] (Linux `dma_unmap_page`). `now_ns` is
    /// the caller's clock, for the lazy flush-queue timer. On error the handle comes back
    /// and nothing changed.
    pub fn unmap_page(
        &self,
        mapping: DmaMapping,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<DmaMapping>> {
        let (dma, generation) = (mapping.dma.0, mapping.generation);
        self.unmap_handle(mapping.domain, cpu, now_ns, work, |l| {
            l.take_handle(dma, generation)
        })
        .map_err(|error| Rejected {
            handle: mapping,
            error,
        })
    }

    /// Unmaps by address, as drivers that keep only the address do: `dma_addr`, `len` and
    /// `dir` must be those of a live [`Domain::map_page`] mapping. Detects unmapping what was
    /// never mapped or already unmapped, a wrong length or direction, and scatter-gather or
    /// coherent mappings (which have their own calls).
    pub fn unmap_raw(
        &self,
        dma_addr: DmaAddr,
        len: u64,
        dir: Direction,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), DmaError> {
        self.remove(cpu, now_ns, work, |l| {
            let key = l.find_raw(dma_addr.0, len, dir)?;
            l.take_handle(key.0, key.1)
        })
    }

    fn unmap_handle(
        &self,
        domain: DomainId,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
        take: impl FnOnce(&mut LiveMap) -> Result<((u64, u64), Live), DmaError>,
    ) -> Result<(), DmaError> {
        if domain != self.id {
            return Err(DmaError::WrongDomain {
                mapping_domain: domain,
                domain: self.id,
            });
        }
        self.remove(cpu, now_ns, work, take)
    }

    /// Removes the live mapping `take` takes out of the record (one lookup): clears the
    /// page table and retires the IOVA.
    fn remove(
        &self,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
        take: impl FnOnce(&mut LiveMap) -> Result<((u64, u64), Live), DmaError>,
    ) -> Result<(), DmaError> {
        self.check_cpu(cpu)?;
        match &self.backend {
            Backend::Direct(live) => {
                take(&mut live.lock())?;
                Ok(())
            }
            Backend::Translated(t) => GATHER.with(|cell| {
                // One call site, so `remove_translated` inlines here.
                let mut fresh = UnmapGather::default();
                let mut borrowed = cell.try_borrow_mut();
                let gather = match &mut borrowed {
                    Ok(gather) => &mut **gather,
                    Err(_) => &mut fresh,
                };
                self.remove_translated(t, cpu, now_ns, work, take, gather)
            }),
        }
    }

    /// [`Domain::remove`] in a translated domain, gathering into `gather`.
    #[inline]
    fn remove_translated(
        &self,
        t: &Translated,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
        take: impl FnOnce(&mut LiveMap) -> Result<((u64, u64), Live), DmaError>,
        gather: &mut UnmapGather,
    ) -> Result<(), DmaError> {
        work.lock(LockId::PageTable);
        let mut guard = t.state.lock();
        let st = &mut *guard;
        let (key, live) = take(&mut st.live)?;
        let Some((block, runs)) = &live.translated else {
            return Err(st.live.not_mapped(key.0));
        };
        gather.clear();
        let lazy = t.fq.is_some();
        for &(iova, len) in runs.as_slice() {
            // Lazy mode: what the IOTLB may keep translating (looked up uncharged: the
            // model's bookkeeping, not work the kernel does).
            let old = if lazy {
                st.table.translate(iova, &mut WorkRecord::new())
            } else {
                None
            };
            if let Err(source) = st.table.unmap(iova, len, gather, work) {
                // The table refused to unmap what it mapped: a page-table bug. Keep the
                // record so the state stays explainable.
                let err = DmaError::PageTable {
                    iova: iova.get(),
                    len,
                    source,
                };
                st.live.insert(key, live);
                return Err(err);
            }
            if let Some(old) = old {
                st.stale.insert(iova.get(), len, old.pa, old.prot, now_ns);
            }
        }
        let block = *block;
        drop(guard);
        self.protection.observe_now(now_ns);
        t.retire(self.id, block, gather, cpu, now_ns, &self.protection, work)
    }

    /// Maps a scatter-gather list for `dev` (Linux `dma_map_sg`). Translated modes map the
    /// whole list into one IOVA allocation and merge pieces into as few DMA segments as the
    /// device's limits allow (see [`super::sg`]); direct modes return one segment per entry.
    pub fn map_sg(
        &self,
        dev: &Device,
        entries: &[SgEntry],
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<DmaSgMapping, DmaError> {
        self.check_cpu(cpu)?;
        let generation = self.generation();
        let handle = |segments: Vec<DmaSegment>| DmaSgMapping {
            domain: self.id,
            dir,
            generation,
            nents: entries.len(),
            segments,
        };
        match &self.backend {
            Backend::Direct(live) => {
                // Validate as the translated path does (granule 4 KiB, no boundary).
                sg_layout(entries, SZ_4K, u64::MAX)?;
                let mut total: u64 = 0;
                for e in entries {
                    if !dev.reaches(e.pa.get(), e.len) {
                        return Err(Self::mask_too_small(dev, e.pa.get()));
                    }
                    total = total.checked_add(e.len).ok_or(DmaError::SgTooLarge)?;
                }
                let segments: Vec<_> = entries
                    .iter()
                    .map(|e| DmaSegment {
                        dma: DmaAddr(e.pa.get()),
                        len: e.len,
                    })
                    .collect();
                let mut live = live.lock();
                live.check_room()?;
                let rec = Live {
                    kind: MappingKind::Sg,
                    dir,
                    len: total,
                    translated: None,
                };
                live.insert((entries[0].pa.get(), generation), rec);
                Ok(handle(segments))
            }
            Backend::Translated(t) => {
                let layout = sg_layout(entries, self.granule, dev.segment_boundary_mask())?;
                let total: u64 = entries.iter().map(|e| e.len).sum();
                let block = t.alloc(dev, layout.pages(), cpu, work)?;
                let runs: Box<[(Iova, u64)]> = layout
                    .map_runs()
                    .iter()
                    .map(|r| (block.start.add(r.iova_offset), r.len))
                    .collect();
                let pas: Vec<PhysAddr> = layout.map_runs().iter().map(|r| r.pa).collect();
                work.lock(LockId::PageTable);
                let mut guard = t.state.lock();
                let st = &mut *guard;
                if let Err(e) = st.live.check_room() {
                    drop(guard);
                    release_unmapped(&*t.allocator, block, cpu, work);
                    return Err(e);
                }
                for (i, (&(iova, len), &pa)) in runs.iter().zip(&pas).enumerate() {
                    if let Err(source) = st.table.map(iova, pa, len, dir.prot(), work) {
                        let mut gather = UnmapGather::new();
                        for &(iova, len) in &runs[..i] {
                            let undone = st.table.unmap(iova, len, &mut gather, work);
                            debug_assert!(undone.is_ok(), "rollback unmap failed: {undone:?}");
                        }
                        drop(guard);
                        if gather.is_empty() {
                            release_unmapped(&*t.allocator, block, cpu, work);
                        } else {
                            // As Linux's iommu_map_sg error path: unmap and sync before the
                            // IOVA is reused.
                            t.invalidate_now(self.id, &gather, work);
                            let done = sync(&*t.invalidator, work);
                            let freed = FreeableIova::after_sync(block, done).free(
                                &*t.allocator,
                                cpu,
                                work,
                            );
                            debug_assert!(freed.is_ok());
                        }
                        return Err(DmaError::PageTable {
                            iova: iova.get(),
                            len,
                            source,
                        });
                    }
                }
                let segments = sg_finalise(
                    &layout,
                    block.start,
                    dev.max_segment_size(),
                    dev.segment_boundary_mask(),
                );
                let key = segments[0].dma.0;
                let mapped: u64 = runs.iter().map(|&(_, len)| len).sum();
                self.protection.record_mapping(total, mapped);
                let rec = Live {
                    kind: MappingKind::Sg,
                    dir,
                    len: total,
                    translated: Some((block, Runs::Many(runs))),
                };
                st.live.insert((key, generation), rec);
                Ok(handle(segments))
            }
        }
    }

    /// Unmaps a scatter-gather mapping (Linux `dma_unmap_sg`). On error the handle comes
    /// back and nothing changed.
    pub fn unmap_sg(
        &self,
        mapping: DmaSgMapping,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<DmaSgMapping>> {
        let (key, generation) = (mapping.key(), mapping.generation);
        self.unmap_handle(mapping.domain, cpu, now_ns, work, |l| {
            l.take_handle(key, generation)
        })
        .map_err(|error| Rejected {
            handle: mapping,
            error,
        })
    }

    /// Allocates a zeroed buffer of at least `size` bytes from `phys` and maps it
    /// bidirectionally for `dev` (Linux `dma_alloc_coherent`). The size is rounded up to the
    /// granule and the buffer aligned to it; in the direct modes the pages come from below
    /// the device's mask.
    pub fn alloc_coherent(
        &self,
        dev: &Device,
        phys: &PhysAllocator,
        size: u64,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<CoherentBuffer, DmaError> {
        self.check_cpu(cpu)?;
        let g = self.granule;
        let bad = DmaError::BadBuffer { pa: 0, len: size };
        if size == 0 {
            return Err(bad);
        }
        let bytes = align_up(size, g).ok_or(bad)?;
        let limit = match self.backend {
            Backend::Direct(_) => dev.dma_mask().saturating_add(1),
            Backend::Translated(_) => u64::MAX,
        };
        let pa = phys
            .alloc(bytes / SZ_4K, g / SZ_4K, PhysAddr::new(limit), work)
            .map_err(|source| DmaError::Memory { bytes, source })?;
        match self.map_single(
            dev,
            pa,
            bytes,
            Direction::Bidirectional,
            MappingKind::Coherent,
            cpu,
            work,
        ) {
            Ok(mapping) => Ok(CoherentBuffer { mapping, pa }),
            Err(e) => {
                let freed = phys.free(pa, bytes / SZ_4K, work);
                debug_assert!(freed.is_ok());
                Err(e)
            }
        }
    }

    /// Unmaps a coherent buffer and returns its pages to `phys` (Linux
    /// `dma_free_coherent`). In lazy mode the pages are reused before the IOTLB is flushed,
    /// as in Linux. On error the buffer comes back and nothing changed.
    pub fn free_coherent(
        &self,
        buf: CoherentBuffer,
        phys: &PhysAllocator,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<CoherentBuffer>> {
        let pages = buf.mapping.len / SZ_4K;
        if !phys.is_allocated(buf.pa, pages) {
            let source = MemError::NotAllocated {
                pa: buf.pa.get(),
                pages,
            };
            let error = DmaError::Memory {
                bytes: buf.mapping.len,
                source,
            };
            return Err(Rejected { handle: buf, error });
        }
        let (dma, generation) = (buf.mapping.dma.0, buf.mapping.generation);
        if let Err(error) = self.unmap_handle(buf.mapping.domain, cpu, now_ns, work, |l| {
            l.take_handle(dma, generation)
        }) {
            return Err(Rejected { handle: buf, error });
        }
        let freed = phys.free(buf.pa, pages, work);
        debug_assert!(
            freed.is_ok(),
            "freeing checked coherent pages failed: {freed:?}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_1G, SZ_64K};
    use crate::dma::testutil::{
        dev32, dev64, lpae_domain, map_domain, memory, Fx, MapTable, SimpleAllocator,
    };
    use crate::dma::ImmediateInvalidator;
    use crate::pgtable::PgTableError;

    const TO: Direction = Direction::ToDevice;
    const FROM: Direction = Direction::FromDevice;

    fn strict() -> Fx {
        lpae_domain(DomainMode::Strict, |_| {})
    }

    fn lazy() -> Fx {
        lpae_domain(DomainMode::Lazy, |_| {})
    }

    fn direct(mode: DomainMode) -> Domain {
        Domain::direct(DomainConfig::new(DomainId(3), mode)).unwrap()
    }

    fn pa(v: u64) -> PhysAddr {
        PhysAddr::new(v)
    }

    // ---- construction ----

    #[test]
    fn constructors_reject_the_wrong_mode() {
        assert!(matches!(
            Domain::direct(DomainConfig::new(DomainId(1), DomainMode::Strict)),
            Err(DmaError::Config { .. })
        ));
        let fx = strict();
        let table = Box::new(MapTable::new(SZ_4K, (Iova::new(0), Iova::new(SZ_4G)), 48));
        let c = DomainConfig::new(DomainId(1), DomainMode::Identity);
        let r = Domain::translated(c, table, fx.alloc.clone(), fx.inv.clone());
        assert!(matches!(r, Err(DmaError::Config { .. })));
    }

    #[test]
    fn translated_constructor_checks_granule_aperture_and_cpus() {
        let inv: Arc<dyn Invalidator> = Arc::new(ImmediateInvalidator::new());
        let table = || Box::new(MapTable::new(SZ_4K, (Iova::new(0), Iova::new(SZ_4G)), 48));
        let alloc = |g, s| -> Arc<dyn IovaAllocator> {
            Arc::new(SimpleAllocator::new(g, Iova::new(s), Iova::new(SZ_4G)))
        };
        let base = DomainConfig::new(DomainId(1), DomainMode::Strict);
        let try_with =
            |c: DomainConfig, a| Domain::translated(c, table(), a, inv.clone()).map(|_| ());
        let cfg_err = |r: Result<(), DmaError>| matches!(r, Err(DmaError::Config { .. }));
        assert!(try_with(base, alloc(SZ_4K, SZ_4K)).is_ok());
        assert!(
            cfg_err(try_with(base, alloc(SZ_64K, SZ_64K))),
            "granule mismatch"
        );
        let c = DomainConfig {
            aperture: Some((Iova::new(0), Iova::new(2 * SZ_4G))),
            ..base
        };
        assert!(
            cfg_err(try_with(c, alloc(SZ_4K, SZ_4K))),
            "aperture beyond table"
        );
        let c = DomainConfig {
            aperture: Some((Iova::new(SZ_1G), Iova::new(SZ_4G))),
            ..base
        };
        assert!(
            cfg_err(try_with(c, alloc(SZ_4K, SZ_4K))),
            "allocator below aperture"
        );
        assert!(cfg_err(try_with(
            DomainConfig { cpus: 0, ..base },
            alloc(SZ_4K, SZ_4K)
        )));
        assert!(cfg_err(try_with(
            DomainConfig {
                max_mappings: 0,
                ..base
            },
            alloc(SZ_4K, SZ_4K)
        )));
    }

    // ---- map_page ----

    #[test]
    fn map_page_keeps_the_offset_and_maps_whole_granules() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0x12_3456), 0x2000, TO, 0, &mut w)
            .unwrap();
        assert_eq!(m.dma_addr().0 & 0xfff, 0x456);
        assert_eq!(m.len(), 0x2000);
        assert_eq!(fx.state(), (1, 1, 3 * SZ_4K));
        assert_eq!(w.lock_count(LockId::PageTable), 1);
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn a_32_bit_device_gets_iovas_below_4g() {
        let fx = strict();
        let mut w = WorkRecord::new();
        for i in 0..16 {
            let m = fx
                .domain
                .map_page(&dev32(), pa(i * SZ_64K), SZ_64K, FROM, 0, &mut w)
                .unwrap();
            assert!(m.dma_addr().0 + SZ_64K <= SZ_4G, "{:?}", m.dma_addr());
            let _ = std::mem::ManuallyDrop::new(m);
        }
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, FROM, 0, &mut w)
            .unwrap();
        assert!(m.dma_addr().0 >= SZ_4G, "the 64-bit device is not limited");
        let _ = std::mem::ManuallyDrop::new(m);
    }

    #[test]
    fn map_page_rejects_empty_and_wrapping_buffers_without_change() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let d = dev64();
        assert_eq!(
            fx.domain.map_page(&d, pa(0x1000), 0, TO, 0, &mut w),
            Err(DmaError::BadBuffer { pa: 0x1000, len: 0 })
        );
        assert_eq!(
            fx.domain.map_page(&d, pa(u64::MAX - 1), 4, TO, 0, &mut w),
            Err(DmaError::BadBuffer {
                pa: u64::MAX - 1,
                len: 4
            })
        );
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn exhausted_iova_space_is_an_error_with_its_source() {
        let fx = map_domain(DomainMode::Strict, 64 * SZ_4K, 48, |_| {});
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), 32 * SZ_4K, TO, 0, &mut w)
            .unwrap();
        let before = fx.state();
        let err = fx
            .domain
            .map_page(&dev64(), pa(0), 32 * SZ_4K, TO, 0, &mut w)
            .unwrap_err();
        assert!(matches!(
            err,
            DmaError::IovaSpace {
                pages: 32,
                source: IovaError::Exhausted { .. },
                ..
            }
        ));
        assert_eq!(fx.state(), before);
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn a_mask_below_the_aperture_is_mask_too_small() {
        let fx = lpae_domain(DomainMode::Strict, |c| {
            c.aperture = Some((Iova::new(SZ_4G), Iova::new(1 << 40)));
        });
        let mut w = WorkRecord::new();
        let err = fx
            .domain
            .map_page(&dev32(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap_err();
        assert_eq!(
            err,
            DmaError::MaskTooSmall {
                device: 11,
                mask_bits: 32,
                addr: SZ_4G
            }
        );
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn direct_modes_return_the_physical_address_or_mask_too_small() {
        for mode in [DomainMode::NoIommu, DomainMode::Identity] {
            let d = direct(mode);
            let mut w = WorkRecord::new();
            let m = d
                .map_page(&dev32(), pa(0x1234), 100, TO, 0, &mut w)
                .unwrap();
            assert_eq!(m.dma_addr(), DmaAddr(0x1234));
            let err = d
                .map_page(&dev32(), pa(SZ_4G - 10), 100, TO, 0, &mut w)
                .unwrap_err();
            assert_eq!(
                err,
                DmaError::MaskTooSmall {
                    device: 11,
                    mask_bits: 32,
                    addr: SZ_4G
                }
            );
            assert_eq!(d.live_mappings(), 1);
            d.unmap_page(m, 0, 0, &mut w).unwrap();
            assert!(w.is_empty(), "direct mappings do no counted work: {w:?}");
        }
    }

    #[test]
    fn a_page_table_refusal_frees_the_iova() {
        let fx = map_domain(DomainMode::Strict, SZ_4G, 32, |_| {});
        let mut w = WorkRecord::new();
        let err = fx
            .domain
            .map_page(&dev64(), pa(SZ_4G), SZ_4K, TO, 0, &mut w)
            .unwrap_err();
        assert!(matches!(
            err,
            DmaError::PageTable {
                source: PgTableError::PhysOutOfRange { .. },
                ..
            }
        ));
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn the_mapping_cap_is_enforced() {
        let fx = lpae_domain(DomainMode::Strict, |c| c.max_mappings = 2);
        let mut w = WorkRecord::new();
        let a = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let b = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let before = fx.state();
        let err = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap_err();
        assert_eq!(
            err,
            DmaError::TooManyMappings {
                domain: DomainId(1),
                limit: 2
            }
        );
        assert_eq!(fx.state(), before);
        let err = fx
            .domain
            .map_sg(&dev64(), &[SgEntry::new(pa(0), 8)], TO, 0, &mut w)
            .unwrap_err();
        assert!(matches!(err, DmaError::TooManyMappings { .. }));
        assert_eq!(fx.state(), before);
        fx.domain.unmap_page(a, 0, 0, &mut w).unwrap();
        fx.domain.unmap_page(b, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn a_bad_cpu_is_rejected_everywhere() {
        let fx = lazy();
        let mut w = WorkRecord::new();
        let bad = DmaError::BadCpu { cpu: 4, cpus: 4 };
        assert_eq!(
            fx.domain.map_page(&dev64(), pa(0), 1, TO, 4, &mut w),
            Err(bad.clone())
        );
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), 1, TO, 0, &mut w)
            .unwrap();
        let r = fx.domain.unmap_page(m, 4, 0, &mut w).unwrap_err();
        assert_eq!(r.error, bad);
        assert_eq!(fx.state(), (1, 1, SZ_4K));
        fx.domain.unmap_page(r.handle, 3, 0, &mut w).unwrap();
    }

    // ---- strict and lazy unmap ----

    #[test]
    fn strict_unmap_invalidates_ranges_and_syncs_each_time() {
        let fx = strict();
        let mut w = WorkRecord::new();
        for _ in 0..3 {
            let m = fx
                .domain
                .map_page(&dev64(), pa(0x10000), 3 * SZ_4K, TO, 0, &mut w)
                .unwrap();
            let mut u = WorkRecord::new();
            fx.domain.unmap_page(m, 0, 0, &mut u).unwrap();
            assert_eq!((u.inval_ranges, u.inval_pages, u.inval_syncs), (1, 3, 1));
            assert_eq!((u.inval_domains, u.flush_queue_adds), (0, 0));
        }
        assert_eq!(fx.alloc.live_blocks(), 0);
    }

    #[test]
    fn strict_unmap_invalidates_freed_tables_before_the_sync() {
        let fx = map_domain(DomainMode::Strict, SZ_4G, 48, |_| {});
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let mut u = WorkRecord::new();
        fx.domain.unmap_page(m, 0, 0, &mut u).unwrap();
        assert_eq!((u.inval_ranges, u.inval_walks, u.inval_syncs), (1, 1, 1));
    }

    #[test]
    fn lazy_unmap_defers_until_the_256th_entry_then_flushes_once() {
        let fx = lazy();
        let mut w = WorkRecord::new();
        // Keeps the leaf table alive, so no unmap frees a table (which is invalidated at once).
        let pin = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let mut w = WorkRecord::new();
        for i in 0..255u64 {
            let m = fx
                .domain
                .map_page(&dev64(), pa(i * SZ_4K), SZ_4K, TO, 0, &mut w)
                .unwrap();
            fx.domain.unmap_page(m, 0, i, &mut w).unwrap();
        }
        assert_eq!(
            (
                w.inval_ranges,
                w.inval_domains,
                w.inval_syncs,
                w.inval_walks
            ),
            (0, 0, 0, 0)
        );
        assert_eq!(fx.alloc.live_blocks(), 256, "queued IOVAs stay allocated");
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let mut u = WorkRecord::new();
        fx.domain.unmap_page(m, 0, 300, &mut u).unwrap();
        assert_eq!((u.inval_domains, u.inval_syncs, u.inval_ranges), (1, 1, 0));
        assert_eq!(u.flush_queue_frees, 255);
        assert_eq!(fx.alloc.live_blocks(), 2);
        assert_eq!(fx.domain.mapped_bytes(), SZ_4K);
        fx.domain.unmap_page(pin, 0, 400, &mut w).unwrap();
    }

    #[test]
    fn a_reported_window_closes_at_the_reported_sync_not_at_the_flush() {
        // Two domains fed the same calls: one closes windows when the flush runs, the other
        // when the caller reports the flush's sync complete.
        let at_flush = lazy();
        let reported = lpae_domain(DomainMode::Lazy, |c| c.window_close = WindowClose::Reported);
        for fx in [&at_flush, &reported] {
            let mut w = WorkRecord::new();
            let m = fx
                .domain
                .map_page(&dev64(), pa(0), SZ_4K, TO, 1, &mut w)
                .unwrap();
            fx.domain.unmap_page(m, 1, 1_000, &mut w).unwrap();
            assert!(
                fx.domain.poll_timeout(10_001_000, &mut w),
                "the timer flushes"
            );
        }
        let finished = reported.domain.flush_queue().unwrap().flush_counts().1;
        assert_eq!(finished, 1);
        // Closed at the flush: the window ran from the unmap (1 us) to the timer (10.001 ms).
        assert_eq!(
            at_flush.domain.protection().max_reachable_after_unmap_ns,
            10_000_000
        );
        // Still open until the sync is reported; a report of nothing finished closes nothing.
        reported.domain.invalidations_completed(0, 10_500_000);
        assert_eq!(
            reported.domain.protection().max_reachable_after_unmap_ns,
            10_499_000,
            "an open window counts up to the latest clock seen"
        );
        reported
            .domain
            .invalidations_completed(finished, 12_001_000);
        assert_eq!(
            reported.domain.protection().max_reachable_after_unmap_ns,
            12_000_000
        );
        // Closed: a later clock no longer lengthens it, and a repeated report is a no-op.
        reported
            .domain
            .invalidations_completed(finished, 20_000_000);
        assert_eq!(
            reported.domain.protection().max_reachable_after_unmap_ns,
            12_000_000
        );
    }

    #[test]
    fn lazy_timeout_flushes_through_poll_or_the_next_unmap() {
        let fx = lazy();
        let pin = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut WorkRecord::new())
            .unwrap();
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 1, &mut w)
            .unwrap();
        fx.domain.unmap_page(m, 1, 1_000, &mut w).unwrap();
        assert!(!fx.domain.poll_timeout(10_000_999, &mut w));
        assert!(fx.domain.poll_timeout(10_001_000, &mut w));
        assert_eq!((w.inval_domains, w.inval_syncs), (1, 1));
        assert_eq!(fx.alloc.live_blocks(), 1);
        // Through the next unmap's clock.
        let a = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let b = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        fx.domain.unmap_page(a, 0, 20_000_000, &mut w).unwrap();
        fx.domain.unmap_page(b, 2, 40_000_000, &mut w).unwrap();
        assert_eq!(w.inval_domains, 2);
        assert_eq!(fx.alloc.live_blocks(), 2, "only b (and the pin) wait");
        let _ = std::mem::ManuallyDrop::new(pin);
    }

    #[test]
    fn lazy_unmap_still_invalidates_freed_tables_synchronously() {
        let fx = map_domain(DomainMode::Lazy, SZ_4G, 48, |_| {});
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let mut u = WorkRecord::new();
        fx.domain.unmap_page(m, 0, 0, &mut u).unwrap();
        assert_eq!(
            (
                u.inval_walks,
                u.inval_syncs,
                u.inval_ranges,
                u.inval_domains
            ),
            (1, 1, 0, 0)
        );
        assert_eq!(u.flush_queue_adds, 1);
    }

    /// A domain built with Linux 6.7's single flush queue: unmaps on four CPUs share one
    /// ring, and the timer polled from CPU 2 frees everything.
    #[test]
    fn a_lazy_domain_takes_its_flush_queue_variant_from_the_config() {
        use crate::dma::flush_queue::{FlushQueueShape, FlushQueueVariant, TimerFreeCpu};
        let variant = FlushQueueVariant {
            shape: FlushQueueShape::Single,
            timer_free_cpu: TimerFreeCpu::TimerCpu,
        };
        let fx = lpae_domain(DomainMode::Lazy, |c| {
            c.flush_queue = FlushQueueConfig::LINUX_SINGLE;
            c.flush_queue_variant = variant;
        });
        let mut w = WorkRecord::new();
        for cpu in 0..4 {
            let m = fx
                .domain
                .map_page(&dev64(), pa(0), SZ_4K, TO, cpu, &mut w)
                .unwrap();
            fx.domain.unmap_page(m, cpu, 0, &mut w).unwrap();
        }
        let fq = fx.domain.flush_queue().unwrap();
        assert_eq!(fq.variant(), variant);
        assert_eq!(fq.pending(), 4);
        assert_eq!(fq.deadline(), Some(1_000_000_000));

        assert!(!fx.domain.poll_timeout_on(999_999_999, 2, &mut w));
        assert!(fx.domain.poll_timeout_on(1_000_000_000, 2, &mut w));

        assert_eq!(fq.pending(), 0);
        assert_eq!(fx.alloc.live_blocks(), 0);
    }

    #[test]
    fn a_lazily_unmapped_iova_is_not_reused_before_its_flush() {
        let fx = lazy();
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let first = m.dma_addr();
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
        let again = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        assert_ne!(again.dma_addr(), first);
        fx.domain.unmap_page(again, 0, 0, &mut w).unwrap();
        fx.domain.flush_all(&mut w);
        assert_eq!(fx.alloc.live_blocks(), 0);
        let after = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        assert_eq!(
            after.dma_addr(),
            first,
            "after the flush the top IOVA is free again"
        );
        fx.domain.unmap_page(after, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn a_strictly_unmapped_iova_is_reused_at_once() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let first = m.dma_addr();
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
        let again = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        assert_eq!(again.dma_addr(), first);
        fx.domain.unmap_page(again, 0, 0, &mut w).unwrap();
    }

    // ---- unmap errors ----

    #[test]
    fn a_handle_from_another_domain_is_returned_with_wrong_domain() {
        let a = strict();
        let b = map_domain(DomainMode::Strict, SZ_4G, 48, |_| {});
        let mut w = WorkRecord::new();
        let m = a
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        let r = b.domain.unmap_page(m, 0, 0, &mut w).unwrap_err();
        assert_eq!(
            r.error,
            DmaError::WrongDomain {
                mapping_domain: DomainId(1),
                domain: DomainId(2)
            }
        );
        assert_eq!((a.state(), b.state()), ((1, 1, SZ_4K), (0, 0, 0)));
        a.domain.unmap_page(r.handle, 0, 0, &mut w).unwrap();
    }

    /// A live record packs only when unpacking gives it back exactly; the others are kept
    /// boxed, and the map hands every record back as it was inserted.
    #[test]
    fn live_records_pack_exactly_or_stay_boxed() {
        let g = SZ_4K;
        let live = |len, translated| Live {
            kind: MappingKind::Single,
            dir: Direction::FromDevice,
            len,
            translated,
        };
        let block = |start: u64, pages| IovaBlock {
            start: Iova::new(start),
            pages,
        };
        let one = |start: u64, len| Runs::One((Iova::new(start), len));
        // (dma, record, packs)
        let cases = [
            (
                0x10_0000,
                live(4096, Some((block(0x10_0000, 1), one(0x10_0000, g)))),
                true,
            ),
            (
                0x10_0123,
                live(8000, Some((block(0x10_0000, 4), one(0x10_0000, 3 * g)))),
                true,
            ),
            (0x10_0000, live(1, None), true),
            // The run does not start at the block's start, or is not the rounded length.
            (
                0x10_0000,
                live(4096, Some((block(0x10_0000, 2), one(0x10_1000, g)))),
                false,
            ),
            (
                0x10_0000,
                live(4096, Some((block(0x10_0000, 2), one(0x10_0000, 2 * g)))),
                false,
            ),
            // The block does not start at the address rounded down.
            (
                0x10_1000,
                live(4096, Some((block(0x10_0000, 2), one(0x10_0000, g)))),
                false,
            ),
            (
                0x10_0000,
                live(4096, Some((block(0x10_0000, 1 << 32), one(0x10_0000, g)))),
                false,
            ),
            (
                0x10_0000,
                live(
                    4096,
                    Some((
                        block(0x10_0000, 1),
                        Runs::Many(Box::new([(Iova::new(0x10_0000), g)])),
                    )),
                ),
                false,
            ),
        ];
        let mut map = LiveMap::new(DomainId(1), 64, g);
        for (i, (dma, rec, packs)) in cases.into_iter().enumerate() {
            let want = format!("{rec:?}");
            let generation = i as u64 + 7;
            let packed = Packed::pack(dma, generation, &rec, g);
            assert_eq!(packed.is_some(), packs, "case {i}");
            if let Some(p) = packed {
                assert_eq!(format!("{:?}", p.unpack(dma, g)), want, "case {i}");
            }
            map.insert((dma, generation), rec);
            assert!(map.find_handle(dma, generation).is_ok());
            let back = map.remove(&(dma, generation)).expect("live");
            assert_eq!(format!("{back:?}"), want, "case {i}");
            assert!(map.find_handle(dma, generation).is_err());
            assert_eq!(map.len(), 0);
        }
        // Two generations at one address (the direct modes), then a third.
        for generation in [3, 1, 2] {
            map.insert((0x2000, generation), live(64, None));
        }
        assert_eq!(map.len(), 3);
        assert_eq!(
            map.find_raw(0x2000, 64, Direction::FromDevice).unwrap(),
            (0x2000, 1)
        );
        for generation in [2, 1, 3] {
            assert!(map.remove(&(0x2000, generation)).is_some());
            assert!(map.remove(&(0x2000, generation)).is_none());
        }
        assert_eq!(map.len(), 0);
    }

    /// A translated `map_page` records exactly what packing its full record gives.
    #[test]
    fn map_page_records_the_packed_form_of_its_record() {
        let fx = strict();
        let g = fx.domain.granule();
        let dev = dev64();
        let mut w = WorkRecord::new();
        for (i, (addr, len)) in [
            (0x10_0000, 4096),
            (0x10_0123, 8000),
            (0x20_0fff, 2),
            (0x30_0000, 3 * 4096 + 1),
            (0x40_0800, 1),
        ]
        .into_iter()
        .enumerate()
        {
            let dir = if i % 2 == 0 {
                Direction::FromDevice
            } else {
                Direction::ToDevice
            };
            let m = fx
                .domain
                .map_page(&dev, pa(addr), len, dir, 0, &mut w)
                .unwrap();
            let Backend::Translated(t) = &fx.domain.backend else {
                panic!("translated");
            };
            let st = t.state.lock();
            let dma = m.dma_addr().0;
            let Some(AtAddr::Packed(p)) = st.live.by_addr.get(&dma) else {
                panic!("case {i}: not packed");
            };
            let rec = p.unpack(dma, g);
            let start = dma & !(g - 1);
            let map_len = align_up(dma - start + len, g).unwrap();
            let (block, runs) = rec.translated.as_ref().expect("translated");
            assert_eq!(block.start.get(), start, "case {i}");
            assert_eq!(runs.as_slice(), &[(Iova::new(start), map_len)], "case {i}");
            assert_eq!(
                (rec.len, rec.dir, rec.kind),
                (len, dir, MappingKind::Single)
            );
            let again = Packed::pack(dma, m.generation, &rec, g).expect("packs");
            assert_eq!(format!("{again:?}"), format!("{p:?}"), "case {i}");
        }
    }

    #[test]
    fn unmap_raw_detects_double_unknown_size_and_direction_errors() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let m = fx
            .domain
            .map_page(&dev64(), pa(0x5000), 0x1800, FROM, 0, &mut w)
            .unwrap();
        let dma = m.dma_addr();
        let _ = std::mem::ManuallyDrop::new(m);
        let before = fx.state();
        let nm = |d: DmaAddr| DmaError::NotMapped {
            domain: DomainId(1),
            dma: d.0,
        };
        let other = DmaAddr(dma.0 + SZ_4K);
        assert_eq!(
            fx.domain.unmap_raw(other, 0x1800, FROM, 0, 0, &mut w),
            Err(nm(other))
        );
        assert_eq!(
            fx.domain.unmap_raw(dma, 0x1000, FROM, 0, 0, &mut w),
            Err(DmaError::SizeMismatch {
                dma: dma.0,
                mapped: 0x1800,
                given: 0x1000
            })
        );
        assert_eq!(
            fx.domain.unmap_raw(dma, 0x1800, TO, 0, 0, &mut w),
            Err(DmaError::DirectionMismatch {
                dma: dma.0,
                mapped: FROM,
                given: TO
            })
        );
        assert_eq!(fx.state(), before);
        fx.domain
            .unmap_raw(dma, 0x1800, FROM, 0, 0, &mut w)
            .unwrap();
        assert_eq!(fx.state(), (0, 0, 0));
        assert_eq!(
            fx.domain.unmap_raw(dma, 0x1800, FROM, 0, 0, &mut w),
            Err(nm(dma))
        );
    }

    #[test]
    fn unmap_raw_refuses_scatter_gather_and_coherent_mappings() {
        let fx = strict();
        let (_mem, phys) = memory();
        let mut w = WorkRecord::new();
        let sg = fx
            .domain
            .map_sg(&dev64(), &[SgEntry::new(pa(0), 100)], TO, 0, &mut w)
            .unwrap();
        let dma = sg.segments()[0].dma;
        assert_eq!(
            fx.domain.unmap_raw(dma, 100, TO, 0, 0, &mut w),
            Err(DmaError::KindMismatch {
                dma: dma.0,
                mapped: MappingKind::Sg,
                given: MappingKind::Single
            })
        );
        let c = fx
            .domain
            .alloc_coherent(&dev64(), &phys, 10, 0, &mut w)
            .unwrap();
        let r = fx
            .domain
            .unmap_raw(c.dma_addr(), SZ_4K, Direction::Bidirectional, 0, 0, &mut w);
        assert!(matches!(
            r,
            Err(DmaError::KindMismatch {
                mapped: MappingKind::Coherent,
                ..
            })
        ));
        assert_eq!(fx.domain.live_mappings(), 2);
        fx.domain.unmap_sg(sg, 0, 0, &mut w).unwrap();
        fx.domain.free_coherent(c, &phys, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn a_stale_handle_does_not_unmap_the_mapping_that_reused_its_address() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let old = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        fx.domain
            .unmap_raw(old.dma_addr(), SZ_4K, TO, 0, 0, &mut w)
            .unwrap();
        let new = fx
            .domain
            .map_page(&dev64(), pa(0), SZ_4K, TO, 0, &mut w)
            .unwrap();
        assert_eq!(new.dma_addr(), old.dma_addr());
        let r = fx.domain.unmap_page(old, 0, 0, &mut w).unwrap_err();
        assert!(matches!(r.error, DmaError::NotMapped { .. }));
        assert_eq!(fx.state(), (1, 1, SZ_4K));
        fx.domain.unmap_page(new, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn direct_mode_tracks_repeated_mappings_of_one_buffer() {
        let d = direct(DomainMode::NoIommu);
        let mut w = WorkRecord::new();
        let a = d.map_page(&dev64(), pa(0x9000), 64, TO, 0, &mut w).unwrap();
        let b = d.map_page(&dev64(), pa(0x9000), 64, TO, 0, &mut w).unwrap();
        let _ = (
            std::mem::ManuallyDrop::new(a),
            std::mem::ManuallyDrop::new(b),
        );
        d.unmap_raw(DmaAddr(0x9000), 64, TO, 0, 0, &mut w).unwrap();
        d.unmap_raw(DmaAddr(0x9000), 64, TO, 0, 0, &mut w).unwrap();
        assert!(matches!(
            d.unmap_raw(DmaAddr(0x9000), 64, TO, 0, 0, &mut w),
            Err(DmaError::NotMapped { .. })
        ));
    }

    // ---- scatter-gather ----

    #[test]
    fn map_sg_uses_one_allocation_and_merges_segments() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let list: Vec<_> = [0x10000, 0x50000, 0x30000, 0x90000]
            .iter()
            .map(|&p| SgEntry::new(pa(p), SZ_4K))
            .collect();
        let m = fx.domain.map_sg(&dev64(), &list, TO, 0, &mut w).unwrap();
        assert_eq!(m.segments().len(), 1);
        assert_eq!(m.segments()[0].len, 4 * SZ_4K);
        assert_eq!(m.nents(), 4);
        assert_eq!(fx.state(), (1, 1, 4 * SZ_4K));
        let mut u = WorkRecord::new();
        fx.domain.unmap_sg(m, 0, 0, &mut u).unwrap();
        assert_eq!(fx.state(), (0, 0, 0));
        assert_eq!(u.inval_syncs, 1);
        assert_eq!(u.inval_pages, 4);
    }

    #[test]
    fn map_sg_respects_the_device_segment_limits() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let dev = dev64().with_max_segment_size(2 * SZ_4K).unwrap();
        let list: Vec<_> = (0..4)
            .map(|i| SgEntry::new(pa(0x100_0000 + i * 0x10000), SZ_4K))
            .collect();
        let m = fx.domain.map_sg(&dev, &list, TO, 0, &mut w).unwrap();
        assert_eq!(
            m.segments().iter().map(|s| s.len).collect::<Vec<_>>(),
            vec![8192, 8192]
        );
        fx.domain.unmap_sg(m, 0, 0, &mut w).unwrap();
        let dev = dev64().with_segment_boundary_mask(SZ_64K - 1).unwrap();
        let list: Vec<_> = (0..20)
            .map(|i| SgEntry::new(pa(0x100_0000 + i * 0x10000), SZ_4K))
            .collect();
        let m = fx.domain.map_sg(&dev, &list, TO, 0, &mut w).unwrap();
        for s in m.segments() {
            assert_eq!(s.dma.0 / SZ_64K, (s.dma.0 + s.len - 1) / SZ_64K);
        }
        assert_eq!(m.segments().len(), 2);
        fx.domain.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn map_sg_padding_is_not_mapped_and_unmaps_cleanly() {
        let fx = strict();
        let mut w = WorkRecord::new();
        let dev = dev64().with_segment_boundary_mask(4 * SZ_4K - 1).unwrap();
        let list = [
            SgEntry::new(pa(0x10000), 3 * SZ_4K),
            SgEntry::new(pa(0x50000), 2 * SZ_4K),
        ];
        let m = fx.domain.map_sg(&dev, &list, TO, 0, &mut w).unwrap();
        assert_eq!(fx.domain.mapped_bytes(), 5 * SZ_4K);
        assert_eq!(m.segments()[1].dma.0 - m.segments()[0].dma.0, 4 * SZ_4K);
        fx.domain.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn bad_sg_lists_are_rejected_without_change() {
        let fx = strict();
        let mut w = WorkRecord::new();
        assert_eq!(
            fx.domain.map_sg(&dev64(), &[], TO, 0, &mut w),
            Err(DmaError::EmptySgList)
        );
        let list = [SgEntry::new(pa(0), 10), SgEntry::new(pa(0x2000), 0)];
        assert_eq!(
            fx.domain.map_sg(&dev64(), &list, TO, 0, &mut w),
            Err(DmaError::BadSgEntry {
                index: 1,
                pa: 0x2000,
                len: 0
            })
        );
        let list = [SgEntry::new(pa(u64::MAX), 2)];
        assert!(matches!(
            fx.domain.map_sg(&dev64(), &list, TO, 0, &mut w),
            Err(DmaError::BadSgEntry { .. })
        ));
        assert_eq!(fx.state(), (0, 0, 0));
        let d = direct(DomainMode::NoIommu);
        assert_eq!(
            d.map_sg(&dev64(), &[], TO, 0, &mut w),
            Err(DmaError::EmptySgList)
        );
        assert_eq!(d.live_mappings(), 0);
    }

    #[test]
    fn a_segment_boundary_below_the_granule_is_rejected() {
        let fx = lpae_domain(DomainMode::Strict, |c| c.granule = crate::addr::SZ_16K);
        let mut w = WorkRecord::new();
        let dev = dev64().with_segment_boundary_mask(SZ_4K - 1).unwrap();
        let err = fx
            .domain
            .map_sg(&dev, &[SgEntry::new(pa(0), 8)], TO, 0, &mut w)
            .unwrap_err();
        assert_eq!(
            err,
            DmaError::SegmentBoundaryTooSmall {
                mask: SZ_4K - 1,
                granule: 1 << 14
            }
        );
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn map_sg_out_of_iova_space_changes_nothing() {
        let fx = map_domain(DomainMode::Lazy, 16 * SZ_4K, 48, |_| {});
        let mut w = WorkRecord::new();
        let list: Vec<_> = (0..20)
            .map(|i| SgEntry::new(pa(i * SZ_64K), SZ_4K))
            .collect();
        let err = fx
            .domain
            .map_sg(&dev64(), &list, TO, 0, &mut w)
            .unwrap_err();
        assert!(matches!(err, DmaError::IovaSpace { pages: 20, .. }));
        assert_eq!(fx.state(), (0, 0, 0));
        assert_eq!(fx.domain.flush_queue().unwrap().pending(), 0);
    }

    #[test]
    fn a_sg_page_table_refusal_rolls_back_every_piece() {
        let fx = map_domain(DomainMode::Strict, SZ_4G, 32, |_| {});
        let mut w = WorkRecord::new();
        let list = [
            SgEntry::new(pa(0x1000), SZ_4K),
            SgEntry::new(pa(SZ_4G + 0x1000), SZ_4K),
        ];
        let err = fx
            .domain
            .map_sg(&dev64(), &list, TO, 0, &mut w)
            .unwrap_err();
        assert!(matches!(err, DmaError::PageTable { .. }));
        assert_eq!(fx.state(), (0, 0, 0));
    }

    #[test]
    fn direct_sg_mappings_are_not_merged_and_must_fit_the_mask() {
        let d = direct(DomainMode::Identity);
        let mut w = WorkRecord::new();
        let list = [
            SgEntry::new(pa(0x1000), SZ_4K),
            SgEntry::new(pa(0x2000), SZ_4K),
        ];
        let m = d.map_sg(&dev32(), &list, TO, 0, &mut w).unwrap();
        assert_eq!(m.segments().len(), 2);
        assert_eq!(m.segments()[1].dma, DmaAddr(0x2000));
        let high = [SgEntry::new(pa(0x1000), 1), SgEntry::new(pa(SZ_4G), 1)];
        assert!(matches!(
            d.map_sg(&dev32(), &high, TO, 0, &mut w),
            Err(DmaError::MaskTooSmall { .. })
        ));
        assert_eq!(d.live_mappings(), 1);
        d.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(d.live_mappings(), 0);
    }

    // ---- coherent ----

    #[test]
    fn coherent_buffers_are_zeroed_mapped_and_freed() {
        let fx = strict();
        let (mem, phys) = memory();
        let mut w = WorkRecord::new();
        // Dirty the memory the allocator will hand out first.
        mem.write(pa(SZ_4K), &[0xaa; 8192]).unwrap();
        let c = fx
            .domain
            .alloc_coherent(&dev64(), &phys, 5000, 0, &mut w)
            .unwrap();
        assert_eq!((c.phys_addr(), c.size()), (pa(SZ_4K), 2 * SZ_4K));
        let mut b = [1u8; 8192];
        mem.read(c.phys_addr(), &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(fx.state(), (1, 1, 2 * SZ_4K));
        fx.domain.free_coherent(c, &phys, 0, 0, &mut w).unwrap();
        assert_eq!(fx.state(), (0, 0, 0));
        assert_eq!(phys.live_allocations(), 0);
    }

    #[test]
    fn direct_coherent_buffers_come_from_below_the_mask() {
        let d = direct(DomainMode::NoIommu);
        let mem = Arc::new(crate::mem::PhysMemory::new(16 << 30).unwrap());
        let phys = PhysAllocator::new(mem, pa(SZ_4G - SZ_4K), pa(16 << 30)).unwrap();
        let mut w = WorkRecord::new();
        let c = d.alloc_coherent(&dev32(), &phys, SZ_4K, 0, &mut w).unwrap();
        assert_eq!(c.dma_addr(), DmaAddr(SZ_4G - SZ_4K));
        let err = d
            .alloc_coherent(&dev32(), &phys, SZ_4K, 0, &mut w)
            .unwrap_err();
        assert!(matches!(
            err,
            DmaError::Memory {
                source: MemError::OutOfMemory { .. },
                ..
            }
        ));
        assert_eq!((d.live_mappings(), phys.live_allocations()), (1, 1));
        d.free_coherent(c, &phys, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn free_coherent_with_the_wrong_allocator_changes_nothing() {
        let fx = strict();
        let (_m, phys) = memory();
        let (_m2, other) = memory();
        let mut w = WorkRecord::new();
        let c = fx
            .domain
            .alloc_coherent(&dev64(), &phys, 1, 0, &mut w)
            .unwrap();
        let r = fx
            .domain
            .free_coherent(c, &other, 0, 0, &mut w)
            .unwrap_err();
        assert!(matches!(
            r.error,
            DmaError::Memory {
                source: MemError::NotAllocated { .. },
                ..
            }
        ));
        assert_eq!(fx.state(), (1, 1, SZ_4K));
        fx.domain
            .free_coherent(r.handle, &phys, 0, 0, &mut w)
            .unwrap();
    }

    #[test]
    fn a_failed_coherent_mapping_returns_the_pages() {
        let fx = lpae_domain(DomainMode::Strict, |c| {
            c.aperture = Some((Iova::new(SZ_4G), Iova::new(1 << 40)));
        });
        let (_m, phys) = memory();
        let mut w = WorkRecord::new();
        let err = fx
            .domain
            .alloc_coherent(&dev32(), &phys, 1, 0, &mut w)
            .unwrap_err();
        assert!(matches!(err, DmaError::MaskTooSmall { .. }));
        assert_eq!(phys.live_allocations(), 0);
        assert_eq!(
            fx.domain.alloc_coherent(&dev64(), &phys, 0, 0, &mut w),
            Err(DmaError::BadBuffer { pa: 0, len: 0 })
        );
    }
}

/// dma-iommu's PCI 32-bit-first allocation ([`DomainConfig::pci_32bit_first`]), on a space
/// with only 16 pages below 4 GiB.
#[cfg(test)]
mod pci_32bit_first_tests {
    use super::*;
    use crate::dma::ImmediateInvalidator;
    use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use crate::iova::magazine::{MagazineCache, MagazineConfig};
    use crate::pgtable::lpae::{LpaeConfig, LpaeTable};

    const LOW: u64 = 16;
    const START: u64 = SZ_4G - LOW * SZ_4K;

    fn domain(policy: Option<Pci32BitFirst>) -> Domain {
        let mut config = DomainConfig::new(DomainId(1), DomainMode::Strict);
        config.aperture = Some((Iova::new(START), Iova::new(1 << 40)));
        config.pci_32bit_first = policy;
        let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).unwrap();
        let mut space = IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 40));
        space.start_pfn = START / SZ_4K;
        let tree = LinuxIovaAllocator::new(space).unwrap();
        let alloc = MagazineCache::new(tree, MagazineConfig::new(1)).unwrap();
        let inv = Arc::new(ImmediateInvalidator::new());
        Domain::translated(config, Box::new(table), Arc::new(alloc), inv).unwrap()
    }

    fn pci64() -> Device {
        Device::new(7, 64).unwrap().with_pci(true)
    }

    /// Maps `n` one-page buffers for `dev`; returns them and the work.
    fn map_n(d: &Domain, dev: &Device, n: u64) -> (Vec<DmaMapping>, WorkRecord) {
        let mut w = WorkRecord::new();
        let maps = (0..n)
            .map(|i| {
                d.map_page(
                    dev,
                    PhysAddr::new(i * SZ_4K),
                    SZ_4K,
                    Direction::ToDevice,
                    0,
                    &mut w,
                )
                .unwrap()
            })
            .collect();
        (maps, w)
    }

    fn below_4g(maps: &[DmaMapping]) -> usize {
        maps.iter().filter(|m| m.dma_addr().0 < SZ_4G).count()
    }

    #[test]
    fn without_the_policy_a_64_bit_device_gets_the_top_of_its_space() {
        let (maps, w) = map_n(&domain(None), &pci64(), 4);
        assert_eq!(below_4g(&maps), 0);
        assert_eq!(maps[0].dma_addr().0, (1 << 40) - SZ_4K);
        assert_eq!((w.iova_32bit_failures, w.iova_full_range_allocs), (0, 0));
    }

    #[test]
    fn a_pci_device_fills_the_32_bit_space_first_then_falls_back() {
        let d = domain(Some(Pci32BitFirst::EveryAllocation));
        let (maps, w) = map_n(&d, &pci64(), LOW + 4);
        assert_eq!(below_4g(&maps), LOW as usize);
        assert_eq!(maps[0].dma_addr().0, SZ_4G - SZ_4K);
        assert_eq!(w.iova_32bit_failures, 4);
        assert_eq!(w.iova_full_range_allocs, 4);
        // The failed tries flushed no cache (only the full-range allocation may).
        assert_eq!(w.rcache_flushes, 0);
        // A device off PCI (or one limited to 32 bits) is not given the trick.
        let plain = Device::new(8, 64).unwrap();
        let (maps, w) = map_n(&d, &plain, 1);
        assert!(maps[0].dma_addr().0 >= SZ_4G);
        assert_eq!(w.iova_32bit_failures, 0);
    }

    /// Until 6.5 every allocation tries below 4 GiB; from 6.6 a device that failed once
    /// allocates from its full range at once, even when space below 4 GiB is free again.
    #[test]
    fn from_6_6_a_device_stops_trying_after_its_first_failure() {
        for (policy, tries) in [
            (Pci32BitFirst::EveryAllocation, true),
            (Pci32BitFirst::UntilFirstFailure, false),
        ] {
            let d = domain(Some(policy));
            let dev = pci64();
            let (mut maps, w) = map_n(&d, &dev, LOW + 1);
            assert_eq!(w.iova_32bit_failures, 1, "{policy:?}");
            // Free one 32-bit mapping (its IOVA goes to the CPU's cache), then map again.
            let low = maps.iter().position(|m| m.dma_addr().0 < SZ_4G).unwrap();
            let mut w = WorkRecord::new();
            d.unmap_page(maps.swap_remove(low), 0, 0, &mut w).unwrap();
            let (again, w) = map_n(&d, &dev, 1);
            assert_eq!(w.iova_32bit_failures, 0, "{policy:?}");
            assert_eq!(w.iova_full_range_allocs, u64::from(!tries), "{policy:?}");
            // Either way the cache hands back the freed IOVA: its limit allows it.
            assert!(again[0].dma_addr().0 < SZ_4G);
            // A two-page request misses the cache: the try fails (no room below 4 GiB) or,
            // from 6.6, is not made.
            let mut w = WorkRecord::new();
            let m = d
                .map_page(
                    &dev,
                    PhysAddr::new(0),
                    2 * SZ_4K,
                    Direction::ToDevice,
                    0,
                    &mut w,
                )
                .unwrap();
            assert!(m.dma_addr().0 >= SZ_4G);
            assert_eq!(w.iova_32bit_failures, u64::from(tries), "{policy:?}");
            assert_eq!(w.iova_full_range_allocs, 1, "{policy:?}");
        }
    }
}
