//! Tiny test-only implementations of the page-table and allocator traits, so the DMA layer
//! can be tested on its own. Deliberately simple: a map of pages, a first-fit list.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::addr::{Iova, PhysAddr, Prot};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::pgtable::{FreedTable, IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::{LockId, WorkRecord};

/// Size of the IOVA region one fake "table page" covers.
const TABLE_SPAN: u64 = 1 << 21;

/// A page table that is a map from IOVA page to (physical page, prot), at one page size.
/// It pretends to have one leaf table per 2 MiB of IOVA, freed when it empties, so unmaps
/// report freed tables.
pub struct MapTable {
    granule: u64,
    range: (Iova, Iova),
    pa_bits: u32,
    pages: BTreeMap<u64, (u64, Prot)>,
    tables: BTreeMap<u64, usize>,
}

impl MapTable {
    pub fn new(granule: u64, range: (Iova, Iova), pa_bits: u32) -> Self {
        Self {
            granule,
            range,
            pa_bits,
            pages: BTreeMap::new(),
            tables: BTreeMap::new(),
        }
    }
}

impl IoPageTable for MapTable {
    fn format_name(&self) -> &'static str {
        "test-map"
    }

    fn page_size_bitmap(&self) -> u64 {
        self.granule
    }

    fn iova_range(&self) -> (Iova, Iova) {
        self.range
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let g = self.granule;
        if !iova.is_aligned(g) || !pa.is_aligned(g) || size % g != 0 || size == 0 {
            return Err(PgTableError::Misaligned {
                addr: iova.get(),
                size,
                granule: g,
            });
        }
        let end = iova.get().checked_add(size);
        if iova < self.range.0 || !matches!(end, Some(e) if e <= self.range.1.get()) {
            return Err(PgTableError::OutOfRange {
                iova: iova.get(),
                size,
                start: self.range.0.get(),
                end: self.range.1.get(),
            });
        }
        if !matches!(pa.get().checked_add(size), Some(e) if e <= 1u64 << self.pa_bits) {
            return Err(PgTableError::PhysOutOfRange {
                pa: pa.get(),
                bits: self.pa_bits,
            });
        }
        if prot == Prot::NONE {
            return Err(PgTableError::NoPermission);
        }
        if let Some((&k, _)) = self.pages.range(iova.get()..iova.get() + size).next() {
            return Err(PgTableError::AlreadyMapped { iova: k });
        }
        for i in 0..size / g {
            let v = iova.get() + i * g;
            self.pages.insert(v, (pa.get() + i * g, prot));
            let t = self.tables.entry(v / TABLE_SPAN).or_insert(0);
            if *t == 0 {
                work.tables_allocated += 1;
            }
            *t += 1;
            work.ptes_written += 1;
        }
        Ok(())
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let g = self.granule;
        if !iova.is_aligned(g) || size % g != 0 || size == 0 {
            return Err(PgTableError::Misaligned {
                addr: iova.get(),
                size,
                granule: g,
            });
        }
        for i in 0..size / g {
            let v = iova.get() + i * g;
            if !self.pages.contains_key(&v) {
                return Err(PgTableError::NotMapped { iova: v });
            }
        }
        for i in 0..size / g {
            let v = iova.get() + i * g;
            self.pages.remove(&v);
            work.ptes_cleared += 1;
            gather.add(Iova::new(v), g, g);
            let key = v / TABLE_SPAN;
            let t = self.tables.get_mut(&key).expect("table of a mapped page");
            *t -= 1;
            if *t == 0 {
                self.tables.remove(&key);
                work.tables_freed += 1;
                gather.add_freed_table(FreedTable {
                    table_pa: PhysAddr::new(key * 4096),
                    level: 3,
                    iova: Iova::new(key * TABLE_SPAN),
                    size: TABLE_SPAN,
                });
            }
        }
        Ok(())
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        work.pte_reads += 1;
        let page = iova.align_down(self.granule);
        self.pages.get(&page.get()).map(|&(pa, prot)| Translation {
            pa: PhysAddr::new(pa + iova.offset_in(self.granule)),
            prot,
            page_size: self.granule,
        })
    }

    fn table_pages(&self) -> usize {
        1 + self.tables.len()
    }

    fn mapped_bytes(&self) -> u64 {
        self.pages.len() as u64 * self.granule
    }
}

/// A top-down first-fit allocator over a map of allocated blocks, under one lock.
pub struct SimpleAllocator {
    granule: u64,
    range: (Iova, Iova),
    blocks: Mutex<BTreeMap<u64, u64>>,
}

impl SimpleAllocator {
    pub fn new(granule: u64, start: Iova, end: Iova) -> Self {
        Self {
            granule,
            range: (start, end),
            blocks: Mutex::new(BTreeMap::new()),
        }
    }
}

impl IovaAllocator for SimpleAllocator {
    fn name(&self) -> &'static str {
        "test-simple"
    }

    fn granule(&self) -> u64 {
        self.granule
    }

    fn range(&self) -> (Iova, Iova) {
        self.range
    }

    fn alloc(&self, req: AllocRequest, work: &mut WorkRecord) -> Result<IovaBlock, IovaError> {
        let g = self.granule;
        if req.pages == 0 || req.pages > (self.range.1.get() - self.range.0.get()) / g {
            return Err(IovaError::BadSize { pages: req.pages });
        }
        if req.limit.get() <= self.range.0.get() {
            return Err(IovaError::LimitTooLow {
                limit: req.limit.get(),
                start: self.range.0.get(),
            });
        }
        let size = req.pages * g;
        let align = if req.size_aligned {
            req.pages.next_power_of_two() * g
        } else {
            g
        };
        let lo = self.range.0.get();
        let fit = |low: u64, high: u64| -> Option<u64> {
            let c = high.checked_sub(size)? & !(align - 1);
            (c >= low && c >= lo).then_some(c)
        };
        work.lock(LockId::IovaTree);
        let mut blocks = self.blocks.lock();
        let mut hi = req.limit.get().min(self.range.1.get());
        let mut found = None;
        for (&s, &len) in blocks.range(..hi).rev() {
            work.tree_nodes_visited += 1;
            let e = s + len;
            if e < hi {
                if let Some(c) = fit(e, hi) {
                    found = Some(c);
                    break;
                }
            }
            hi = hi.min(s);
        }
        let found = found.or_else(|| fit(lo, hi));
        match found {
            Some(c) => {
                blocks.insert(c, size);
                Ok(IovaBlock {
                    start: Iova::new(c),
                    pages: req.pages,
                })
            }
            None => {
                work.alloc_failures += 1;
                Err(IovaError::Exhausted {
                    pages: req.pages,
                    limit: req.limit.get(),
                })
            }
        }
    }

    fn free(&self, block: IovaBlock, _cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError> {
        work.lock(LockId::IovaTree);
        let mut blocks = self.blocks.lock();
        if blocks.get(&block.start.get()) != Some(&(block.pages * self.granule)) {
            return Err(IovaError::NotAllocated {
                start: block.start.get(),
                pages: block.pages,
            });
        }
        blocks.remove(&block.start.get());
        Ok(())
    }

    fn live_blocks(&self) -> usize {
        self.blocks.lock().len()
    }
}

// ---- Domain fixtures ----

use std::sync::Arc;

use crate::addr::SZ_4K;
use crate::dma::{Device, Domain, DomainConfig, DomainId, DomainMode, ImmediateInvalidator};
use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use crate::mem::{PhysAllocator, PhysMemory};
use crate::pgtable::lpae::{LpaeConfig, LpaeTable};

/// A domain and the shared pieces a test inspects.
pub struct Fx {
    pub domain: Domain,
    pub alloc: Arc<dyn IovaAllocator>,
    pub inv: Arc<ImmediateInvalidator>,
}

impl Fx {
    /// (live mappings, allocator live blocks, mapped bytes): what a failed call must not
    /// change.
    pub fn state(&self) -> (usize, usize, u64) {
        (
            self.domain.live_mappings(),
            self.alloc.live_blocks(),
            self.domain.mapped_bytes(),
        )
    }
}

/// A translated domain over a real LPAE table (4K, 48-bit) and the Linux allocator.
pub fn lpae_domain(mode: DomainMode, tweak: impl FnOnce(&mut DomainConfig)) -> Fx {
    let mut config = DomainConfig::new(DomainId(1), mode);
    config.cpus = 4;
    tweak(&mut config);
    let table = LpaeTable::new(LpaeConfig::new(config.granule, 48, 48)).unwrap();
    let end = config.aperture.map_or(Iova::new(1 << 48), |a| a.1);
    let mut space = IovaSpaceConfig::new(config.granule, end);
    if let Some((start, _)) = config.aperture {
        space.start_pfn = (start.get() / config.granule).max(1);
    }
    let alloc: Arc<dyn IovaAllocator> = Arc::new(LinuxIovaAllocator::new(space).unwrap());
    let inv = Arc::new(ImmediateInvalidator::new());
    let domain = Domain::translated(config, Box::new(table), alloc.clone(), inv.clone()).unwrap();
    Fx { domain, alloc, inv }
}

/// A translated domain over the test map table and allocator (IOVAs `4K..range_end`,
/// physical addresses below `2^pa_bits`).
pub fn map_domain(
    mode: DomainMode,
    range_end: u64,
    pa_bits: u32,
    tweak: impl FnOnce(&mut DomainConfig),
) -> Fx {
    let mut config = DomainConfig::new(DomainId(2), mode);
    config.cpus = 4;
    tweak(&mut config);
    let table = MapTable::new(
        config.granule,
        (Iova::new(0), Iova::new(range_end)),
        pa_bits,
    );
    let alloc: Arc<dyn IovaAllocator> = Arc::new(SimpleAllocator::new(
        config.granule,
        Iova::new(config.granule),
        Iova::new(range_end),
    ));
    let inv = Arc::new(ImmediateInvalidator::new());
    let domain = Domain::translated(config, Box::new(table), alloc.clone(), inv.clone()).unwrap();
    Fx { domain, alloc, inv }
}

/// A 64-bit device with default segment limits.
pub fn dev64() -> Device {
    Device::new(10, 64).unwrap()
}

/// A 32-bit device with default segment limits.
pub fn dev32() -> Device {
    Device::new(11, 32).unwrap()
}

/// 64 GiB of memory and an allocator over all of it but the first page.
pub fn memory() -> (Arc<PhysMemory>, PhysAllocator) {
    let mem = Arc::new(PhysMemory::new(64 << 30).unwrap());
    let phys =
        PhysAllocator::new(mem.clone(), PhysAddr::new(SZ_4K), PhysAddr::new(64 << 30)).unwrap();
    (mem, phys)
}
