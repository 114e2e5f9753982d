//! Property tests of the DMA API against a reference model.
//!
//! Random sequences of map / unmap / map_sg / unmap_sg (by handle and by address), device
//! accesses, clock advances and invalid calls run on a translated domain (a real LPAE table
//! and the Linux IOVA allocator) in strict and lazy mode. The model is the list of live
//! mappings with their physical buffers. After every step:
//!
//! - the domain has exactly the model's live mappings, and the page table maps exactly the
//!   granules they cover;
//! - translating every live mapping (every segment of a scatter-gather mapping) gives back
//!   the model's physical ranges, and every DMA address fits the device's mask;
//! - the allocator holds exactly the live mappings' IOVA ranges plus those waiting on the
//!   flush queue.
//!
//! Device accesses move bytes through the translation and are checked through memory.
//! Invalid calls (double unmap, unmap of something never mapped, wrong size or direction,
//! a scatter-gather mapping unmapped by address, handles from another domain) must fail with
//! the right error and change nothing. At the end everything is unmapped, the flush queue
//! drained, and the allocator and the page table must be empty (for LPAE, once the empty
//! tables its default `WholeSpan` reclaim policy keeps have been reclaimed).

mod common;

use common::{canonical, device_access};

use std::sync::{Arc, Mutex};

use iolab_iommu::addr::{Access, DmaAddr, Iova, PhysAddr, Prot, SZ_16K, SZ_4G, SZ_4K, SZ_64K};
use iolab_iommu::dma::{
    Device, Direction, DmaError, DmaMapping, DmaSgMapping, Domain, DomainConfig, DomainId,
    DomainMode, ImmediateInvalidator, MappingKind, PhysRange, SgEntry,
};
use iolab_iommu::iova::gaptree::GapTreeAllocator;
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::magazine::{MagazineCache, MagazineConfig};
use iolab_iommu::iova::IovaAllocator;
use iolab_iommu::mem::PhysMemory;
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::pgtable::tce::{TceConfig, TceTable};
use iolab_iommu::pgtable::{IoPageTable, PgTableError, Translation, UnmapGather};
use iolab_iommu::work::WorkRecord;
use proptest::prelude::*;

/// Everything the test inspects about one domain.
struct Setup {
    domain: Domain,
    alloc: Arc<dyn IovaAllocator>,
    /// The domain's LPAE table, to reclaim its kept empty tables at teardown.
    lpae: Option<SharedLpae>,
}

/// An LPAE table the domain owns and the test can still reach.
#[derive(Clone)]
struct SharedLpae(Arc<Mutex<LpaeTable>>);

impl SharedLpae {
    fn table(&self) -> std::sync::MutexGuard<'_, LpaeTable> {
        self.0.lock().expect("table lock")
    }
}

impl IoPageTable for SharedLpae {
    fn format_name(&self) -> &'static str {
        self.table().format_name()
    }

    fn page_size_bitmap(&self) -> u64 {
        self.table().page_size_bitmap()
    }

    fn granule(&self) -> u64 {
        self.table().granule()
    }

    fn iova_range(&self) -> (Iova, Iova) {
        self.table().iova_range()
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.table().map(iova, pa, size, prot, work)
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.table().unmap(iova, size, gather, work)
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        self.table().translate(iova, work)
    }

    fn table_pages(&self) -> usize {
        self.table().table_pages()
    }

    fn mapped_bytes(&self) -> u64 {
        self.table().mapped_bytes()
    }
}

/// Which real page table and allocator a domain is assembled from.
#[derive(Clone, Copy, Debug)]
enum Stack {
    /// LPAE 48-bit table, Linux tree allocator.
    LpaeLinux,
    /// LPAE table, Linux tree allocator behind per-CPU magazines (Linux's default stack).
    LpaeMagazine,
    /// LPAE table, iolab's gap-tree allocator.
    LpaeGapTree,
    /// A POWER TCE table over a 2 GiB window, Linux tree allocator over the window.
    TceLinux,
}

fn build(id: u32, mode: DomainMode, granule: u64) -> Setup {
    build_on(Stack::LpaeLinux, id, mode, granule)
}

fn build_on(stack: Stack, id: u32, mode: DomainMode, granule: u64) -> Setup {
    let mut config = DomainConfig::new(DomainId(id), mode);
    config.granule = granule;
    config.cpus = 2;
    // Small rings, so full-ring flushes happen within a test case.
    config.flush_queue.ring_size = 8;
    let shared = SharedLpae(Arc::new(Mutex::new(
        LpaeTable::new(LpaeConfig::new(granule, 48, 48)).expect("LPAE config"),
    )));
    let lpae = || -> Box<dyn IoPageTable> { Box::new(shared.clone()) };
    let space = IovaSpaceConfig::new(granule, Iova::new(1 << 48));
    let linux = |space| LinuxIovaAllocator::new(space).expect("IOVA config");
    let (table, alloc): (Box<dyn IoPageTable>, Arc<dyn IovaAllocator>) = match stack {
        Stack::LpaeLinux => (lpae(), Arc::new(linux(space))),
        Stack::LpaeMagazine => {
            let cache = MagazineCache::new(linux(space), MagazineConfig::new(2)).expect("rcache");
            (lpae(), Arc::new(cache))
        }
        Stack::LpaeGapTree => (
            lpae(),
            Arc::new(GapTreeAllocator::new(space).expect("gap tree config")),
        ),
        Stack::TceLinux => {
            let shift = granule.trailing_zeros();
            let tce = TceTable::new(TceConfig::new(0, 2 << 30, shift)).expect("TCE config");
            let window = IovaSpaceConfig::new(granule, Iova::new(2 << 30));
            (Box::new(tce), Arc::new(linux(window)))
        }
    };
    let lpae = match stack {
        Stack::TceLinux => None,
        _ => Some(shared),
    };
    let inv = Arc::new(ImmediateInvalidator::new());
    let domain = Domain::translated(config, table, alloc.clone(), inv).expect("domain");
    Setup {
        domain,
        alloc,
        lpae,
    }
}

fn devices() -> Vec<Device> {
    vec![
        Device::new(1, 64).unwrap(),
        Device::new(2, 32).unwrap(),
        Device::new(3, 48)
            .unwrap()
            .with_max_segment_size(2 * SZ_16K)
            .unwrap()
            .with_segment_boundary_mask(SZ_64K - 1)
            .unwrap(),
    ]
}

fn direction(d: u8) -> Direction {
    match d % 3 {
        0 => Direction::ToDevice,
        1 => Direction::FromDevice,
        _ => Direction::Bidirectional,
    }
}

/// The access a device makes through a mapping of this direction.
fn align_up(v: u64, g: u64) -> u64 {
    v.div_ceil(g) * g
}

/// A live mapping: the model's view and the handle.
enum Handle {
    Single(DmaMapping),
    Sg(DmaSgMapping),
}

struct Live {
    dev: usize,
    dir: Direction,
    /// The physical buffers, in order.
    entries: Vec<SgEntry>,
    handle: Handle,
}

impl Live {
    /// Granule-rounded bytes the page table maps for this mapping.
    fn mapped_bytes(&self, g: u64) -> u64 {
        self.entries
            .iter()
            .map(|e| align_up(e.pa.offset_in(g) + e.len, g))
            .sum()
    }

    /// The device-side pieces: (DMA address, length), in order.
    fn dma_pieces(&self) -> Vec<(DmaAddr, u64)> {
        match &self.handle {
            Handle::Single(m) => vec![(m.dma_addr(), m.len())],
            Handle::Sg(m) => m.segments().iter().map(|s| (s.dma, s.len)).collect(),
        }
    }
}

/// One step of a test case.
#[derive(Clone, Debug)]
enum Op {
    Map {
        dev: usize,
        page: u64,
        off: u64,
        len: u64,
        dir: u8,
        cpu: usize,
    },
    MapSg {
        dev: usize,
        base: u64,
        pieces: Vec<(bool, u64, u64, u64)>,
        dir: u8,
        cpu: usize,
    },
    Unmap {
        pick: usize,
        raw: bool,
        cpu: usize,
    },
    Access {
        pick: usize,
        seed: u8,
    },
    Advance {
        ns: u64,
    },
    DoubleUnmapRaw {
        pick: usize,
    },
    UnmapNeverMapped {
        addr: u64,
    },
    WrongSize {
        pick: usize,
        delta: u64,
    },
    WrongDirection {
        pick: usize,
    },
    RawOnSg {
        pick: usize,
    },
    Foreign {
        sg: bool,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..3, 0u64..4096, 0u64..SZ_4K, 1u64..3 * SZ_4K, any::<u8>(), 0usize..2)
            .prop_map(|(dev, page, off, len, dir, cpu)| Op::Map { dev, page, off, len, dir, cpu }),
        4 => (
            0usize..3,
            0u64..4096,
            prop::collection::vec((any::<bool>(), 0u64..3, 0u64..SZ_4K, 1u64..2 * SZ_4K), 1..10),
            any::<u8>(),
            0usize..2,
        )
            .prop_map(|(dev, base, pieces, dir, cpu)| Op::MapSg { dev, base, pieces, dir, cpu }),
        6 => (any::<usize>(), any::<bool>(), 0usize..2)
            .prop_map(|(pick, raw, cpu)| Op::Unmap { pick, raw, cpu }),
        4 => (any::<usize>(), any::<u8>()).prop_map(|(pick, seed)| Op::Access { pick, seed }),
        2 => (0u64..6_000_000).prop_map(|ns| Op::Advance { ns }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleUnmapRaw { pick }),
        1 => any::<u64>().prop_map(|addr| Op::UnmapNeverMapped { addr }),
        1 => (any::<usize>(), 1u64..SZ_4K).prop_map(|(pick, delta)| Op::WrongSize { pick, delta }),
        1 => any::<usize>().prop_map(|pick| Op::WrongDirection { pick }),
        1 => any::<usize>().prop_map(|pick| Op::RawOnSg { pick }),
        1 => any::<bool>().prop_map(|sg| Op::Foreign { sg }),
    ]
}

/// The model and the system under test.
struct Harness {
    s: Setup,
    other: Setup,
    devs: Vec<Device>,
    mem: PhysMemory,
    g: u64,
    live: Vec<Live>,
    now: u64,
    work: WorkRecord,
    empty_table_pages: usize,
}

impl Harness {
    fn new(stack: Stack, mode: DomainMode, g: u64) -> Self {
        let s = build_on(stack, 1, mode, g);
        let empty_table_pages = s.domain.table_pages();
        Self {
            s,
            other: build(2, DomainMode::Strict, g),
            devs: devices(),
            mem: PhysMemory::new(1 << 40).unwrap(),
            g,
            live: Vec::new(),
            now: 0,
            work: WorkRecord::new(),
            empty_table_pages,
        }
    }

    /// (live mappings, allocator live blocks, mapped bytes, queued IOVAs).
    fn snapshot(&self) -> (usize, usize, u64, usize) {
        let d = &self.s.domain;
        let pending = d.flush_queue().map_or(0, |fq| fq.pending());
        (
            d.live_mappings(),
            self.s.alloc.live_blocks(),
            d.mapped_bytes(),
            pending,
        )
    }

    /// Index of a live mapping chosen by `pick` among those `want` accepts.
    fn choose(&self, pick: usize, want: impl Fn(&Live) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.live.len())
            .filter(|&i| want(&self.live[i]))
            .collect();
        (!idx.is_empty()).then(|| idx[pick % idx.len()])
    }

    fn is_single(l: &Live) -> bool {
        matches!(l.handle, Handle::Single(_))
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.now += 1_000;
        let d = &self.s.domain;
        match *op {
            Op::Map {
                dev,
                page,
                off,
                len,
                dir,
                cpu,
            } => {
                let pa = PhysAddr::new(page * self.g + off);
                let dir = direction(dir);
                let m = d
                    .map_page(&self.devs[dev], pa, len, dir, cpu, &mut self.work)
                    .map_err(fail)?;
                self.live.push(Live {
                    dev,
                    dir,
                    entries: vec![SgEntry::new(pa, len)],
                    handle: Handle::Single(m),
                });
            }
            Op::MapSg {
                dev,
                base,
                ref pieces,
                dir,
                cpu,
            } => {
                let mut cursor = base * self.g;
                let mut entries = Vec::new();
                for &(contiguous, gap, off, len) in pieces {
                    let pa = if contiguous || entries.is_empty() && gap == 0 {
                        cursor
                    } else {
                        align_up(cursor, self.g) + gap * self.g + off % self.g
                    };
                    entries.push(SgEntry::new(PhysAddr::new(pa), len));
                    cursor = pa + len;
                }
                let dir = direction(dir);
                let m = d
                    .map_sg(&self.devs[dev], &entries, dir, cpu, &mut self.work)
                    .map_err(fail)?;
                prop_assert_eq!(m.nents(), entries.len());
                self.live.push(Live {
                    dev,
                    dir,
                    entries,
                    handle: Handle::Sg(m),
                });
            }
            Op::Unmap { pick, raw, cpu } => {
                let Some(i) = self.choose(pick, |_| true) else {
                    return Ok(());
                };
                let l = self.live.swap_remove(i);
                match l.handle {
                    Handle::Single(m) if raw => {
                        d.unmap_raw(
                            m.dma_addr(),
                            m.len(),
                            m.direction(),
                            cpu,
                            self.now,
                            &mut self.work,
                        )
                        .map_err(fail)?;
                        let _ = m;
                    }
                    Handle::Single(m) => d
                        .unmap_page(m, cpu, self.now, &mut self.work)
                        .map_err(fail)?,
                    Handle::Sg(m) => d.unmap_sg(m, cpu, self.now, &mut self.work).map_err(fail)?,
                }
            }
            Op::Access { pick, seed } => {
                let Some(i) = self.choose(pick, |_| true) else {
                    return Ok(());
                };
                let l = &self.live[i];
                let dev = &self.devs[l.dev];
                let total: u64 = l.entries.iter().map(|e| e.len).sum();
                let data: Vec<u8> = (0..total)
                    .map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed))
                    .collect();
                if device_access(l.dir) == Access::Write {
                    // The device writes through its segments; the CPU reads the buffers.
                    let mut done = 0usize;
                    for (dma, len) in l.dma_pieces() {
                        let chunk = &data[done..done + len as usize];
                        d.dma_write(dev, &self.mem, dma, chunk, &mut self.work)
                            .map_err(fail)?;
                        done += len as usize;
                    }
                    let mut done = 0usize;
                    for e in &l.entries {
                        let mut back = vec![0; e.len as usize];
                        self.mem.read(e.pa, &mut back).map_err(fail)?;
                        prop_assert_eq!(&back[..], &data[done..done + e.len as usize]);
                        done += e.len as usize;
                    }
                } else {
                    // The CPU fills the buffers; the device reads through its segments.
                    let mut done = 0usize;
                    for e in &l.entries {
                        self.mem
                            .write(e.pa, &data[done..done + e.len as usize])
                            .map_err(fail)?;
                        done += e.len as usize;
                    }
                    let mut got = Vec::new();
                    for (dma, len) in l.dma_pieces() {
                        let mut buf = vec![0; len as usize];
                        d.dma_read(dev, &self.mem, dma, &mut buf, &mut self.work)
                            .map_err(fail)?;
                        got.extend(buf);
                    }
                    prop_assert_eq!(got, data);
                }
            }
            Op::Advance { ns } => {
                self.now += ns;
                d.poll_timeout(self.now, &mut self.work);
            }
            Op::DoubleUnmapRaw { pick } => {
                let Some(i) = self.choose(pick, Self::is_single) else {
                    return Ok(());
                };
                let l = self.live.swap_remove(i);
                let Handle::Single(m) = l.handle else {
                    unreachable!()
                };
                let (dma, len, dir) = (m.dma_addr(), m.len(), m.direction());
                d.unmap_raw(dma, len, dir, 0, self.now, &mut self.work)
                    .map_err(fail)?;
                let before = self.snapshot();
                let err = d.unmap_raw(dma, len, dir, 0, self.now, &mut self.work);
                prop_assert_eq!(
                    err,
                    Err(DmaError::NotMapped {
                        domain: DomainId(1),
                        dma: dma.0
                    })
                );
                prop_assert_eq!(self.snapshot(), before);
                // The stale handle must not unmap anything either.
                let r = d.unmap_page(m, 0, self.now, &mut self.work);
                let stale_refused =
                    matches!(r, Err(ref e) if matches!(e.error, DmaError::NotMapped { .. }));
                prop_assert!(stale_refused, "a stale handle was accepted");
                prop_assert_eq!(self.snapshot(), before);
            }
            Op::UnmapNeverMapped { addr } => {
                let dma = DmaAddr(addr);
                let taken = self.live.iter().any(|l| match &l.handle {
                    Handle::Single(m) => m.dma_addr() == dma,
                    Handle::Sg(m) => m.segments()[0].dma == dma,
                });
                if taken {
                    return Ok(());
                }
                let before = self.snapshot();
                let r = d.unmap_raw(dma, 1, Direction::ToDevice, 0, self.now, &mut self.work);
                prop_assert_eq!(
                    r,
                    Err(DmaError::NotMapped {
                        domain: DomainId(1),
                        dma: addr
                    })
                );
                prop_assert_eq!(self.snapshot(), before);
            }
            Op::WrongSize { pick, delta } => {
                let Some(i) = self.choose(pick, Self::is_single) else {
                    return Ok(());
                };
                let Handle::Single(m) = &self.live[i].handle else {
                    unreachable!()
                };
                let (dma, len, dir) = (m.dma_addr(), m.len(), m.direction());
                let before = self.snapshot();
                let r = d.unmap_raw(dma, len + delta, dir, 0, self.now, &mut self.work);
                let want = DmaError::SizeMismatch {
                    dma: dma.0,
                    mapped: len,
                    given: len + delta,
                };
                prop_assert_eq!(r, Err(want));
                prop_assert_eq!(self.snapshot(), before);
            }
            Op::WrongDirection { pick } => {
                let Some(i) = self.choose(pick, Self::is_single) else {
                    return Ok(());
                };
                let Handle::Single(m) = &self.live[i].handle else {
                    unreachable!()
                };
                let (dma, len, dir) = (m.dma_addr(), m.len(), m.direction());
                let given = match dir {
                    Direction::ToDevice => Direction::FromDevice,
                    _ => Direction::ToDevice,
                };
                let before = self.snapshot();
                let r = d.unmap_raw(dma, len, given, 0, self.now, &mut self.work);
                let want = DmaError::DirectionMismatch {
                    dma: dma.0,
                    mapped: dir,
                    given,
                };
                prop_assert_eq!(r, Err(want));
                prop_assert_eq!(self.snapshot(), before);
            }
            Op::RawOnSg { pick } => {
                let Some(i) = self.choose(pick, |l| !Self::is_single(l)) else {
                    return Ok(());
                };
                let Handle::Sg(m) = &self.live[i].handle else {
                    unreachable!()
                };
                let dma = m.segments()[0].dma;
                let len: u64 = self.live[i].entries.iter().map(|e| e.len).sum();
                let before = self.snapshot();
                let r = d.unmap_raw(dma, len, m.direction(), 0, self.now, &mut self.work);
                let want = DmaError::KindMismatch {
                    dma: dma.0,
                    mapped: MappingKind::Sg,
                    given: MappingKind::Single,
                };
                prop_assert_eq!(r, Err(want));
                prop_assert_eq!(self.snapshot(), before);
            }
            Op::Foreign { sg } => {
                let od = &self.other.domain;
                let dev = &self.devs[0];
                let wrong = DmaError::WrongDomain {
                    mapping_domain: DomainId(2),
                    domain: DomainId(1),
                };
                let before = self.snapshot();
                if sg {
                    let list = [SgEntry::new(PhysAddr::new(0x4000), 10)];
                    let m = od
                        .map_sg(dev, &list, Direction::ToDevice, 0, &mut self.work)
                        .map_err(fail)?;
                    let r = d.unmap_sg(m, 0, self.now, &mut self.work).unwrap_err();
                    prop_assert_eq!(&r.error, &wrong);
                    prop_assert_eq!(self.snapshot(), before);
                    od.unmap_sg(r.handle, 0, self.now, &mut self.work)
                        .map_err(fail)?;
                } else {
                    let m = od
                        .map_page(
                            dev,
                            PhysAddr::new(0x4000),
                            10,
                            Direction::ToDevice,
                            0,
                            &mut self.work,
                        )
                        .map_err(fail)?;
                    let r = d.unmap_page(m, 0, self.now, &mut self.work).unwrap_err();
                    prop_assert_eq!(&r.error, &wrong);
                    prop_assert_eq!(self.snapshot(), before);
                    od.unmap_page(r.handle, 0, self.now, &mut self.work)
                        .map_err(fail)?;
                }
                prop_assert_eq!(od.live_mappings(), 0);
            }
        }
        self.check()
    }

    /// The invariants listed in the module docs.
    fn check(&mut self) -> Result<(), TestCaseError> {
        let d = &self.s.domain;
        let (live, blocks, mapped, pending) = self.snapshot();
        prop_assert_eq!(live, self.live.len());
        prop_assert_eq!(blocks, self.live.len() + pending);
        let want_mapped: u64 = self.live.iter().map(|l| l.mapped_bytes(self.g)).sum();
        prop_assert_eq!(mapped, want_mapped);
        for l in &self.live {
            let dev = &self.devs[l.dev];
            let mut got = Vec::new();
            for (dma, len) in l.dma_pieces() {
                prop_assert!(
                    dev.reaches(dma.0, len),
                    "{:?}+{:#x} beyond the mask",
                    dma,
                    len
                );
                let r = d
                    .translate(dev, dma, len, device_access(l.dir), &mut self.work)
                    .map_err(fail)?;
                got.extend(r);
            }
            let want = l.entries.iter().map(|e| PhysRange {
                pa: e.pa,
                len: e.len,
            });
            prop_assert_eq!(canonical(got), canonical(want));
        }
        Ok(())
    }

    /// Unmaps everything, drains the flush queue and the allocator's caches, and checks that
    /// nothing is left.
    fn teardown(mut self) -> Result<(), TestCaseError> {
        let d = &self.s.domain;
        let w = &mut self.work;
        for (i, l) in self.live.drain(..).enumerate() {
            match l.handle {
                Handle::Single(m) if i % 2 == 0 => {
                    d.unmap_raw(m.dma_addr(), m.len(), m.direction(), 1, self.now, w)
                        .map_err(fail)?;
                    let _ = m;
                }
                Handle::Single(m) => d.unmap_page(m, 1, self.now, w).map_err(fail)?,
                Handle::Sg(m) => d.unmap_sg(m, 0, self.now, w).map_err(fail)?,
            }
        }
        d.flush_all(w);
        self.s.alloc.drain_caches(w);
        prop_assert_eq!(d.live_mappings(), 0);
        prop_assert_eq!(self.s.alloc.live_blocks(), 0);
        prop_assert_eq!(d.mapped_bytes(), 0);
        // LPAE keeps the tables that partial unmaps emptied (as Linux does); a reclaim pass
        // must free all of them, or table pages leaked.
        if let Some(lpae) = &self.s.lpae {
            let mut gather = UnmapGather::new();
            let freed = lpae.table().reclaim_empty_tables(&mut gather, w);
            prop_assert!(gather.ranges.is_empty());
            prop_assert_eq!(gather.freed_tables.len(), freed);
        }
        prop_assert_eq!(d.table_pages(), self.empty_table_pages);
        prop_assert_eq!(d.flush_queue().map_or(0, |fq| fq.pending()), 0);
        Ok(())
    }
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

fn run(stack: Stack, mode: DomainMode, g: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::new(stack, mode, g);
    for op in ops {
        h.step(op)?;
    }
    h.teardown()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn dma_strict_matches_the_model(ops in prop::collection::vec(arb_op(), 1..60)) {
        run(Stack::LpaeLinux, DomainMode::Strict, SZ_4K, &ops)?;
    }

    #[test]
    fn dma_lazy_matches_the_model(ops in prop::collection::vec(arb_op(), 1..60)) {
        run(Stack::LpaeLinux, DomainMode::Lazy, SZ_4K, &ops)?;
    }

    #[test]
    fn dma_strict_16k_granule_matches_the_model(ops in prop::collection::vec(arb_op(), 1..40)) {
        run(Stack::LpaeLinux, DomainMode::Strict, SZ_16K, &ops)?;
    }

    #[test]
    fn dma_lazy_magazines_match_the_model(ops in prop::collection::vec(arb_op(), 1..60)) {
        run(Stack::LpaeMagazine, DomainMode::Lazy, SZ_4K, &ops)?;
    }

    #[test]
    fn dma_strict_gap_tree_matches_the_model(ops in prop::collection::vec(arb_op(), 1..60)) {
        run(Stack::LpaeGapTree, DomainMode::Strict, SZ_4K, &ops)?;
    }

    #[test]
    fn dma_lazy_tce_window_matches_the_model(ops in prop::collection::vec(arb_op(), 1..60)) {
        run(Stack::TceLinux, DomainMode::Lazy, SZ_4K, &ops)?;
    }
}

#[test]
fn dma_32_bit_device_iovas_stay_below_4g() {
    let s = build(1, DomainMode::Strict, SZ_4K);
    let dev = Device::new(2, 32).unwrap();
    let mut w = WorkRecord::new();
    let mut maps = Vec::new();
    for i in 0..64 {
        let m = s
            .domain
            .map_page(
                &dev,
                PhysAddr::new(i * SZ_64K),
                SZ_64K,
                Direction::FromDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert!(m.dma_addr().0 + SZ_64K <= SZ_4G);
        maps.push(m);
    }
    for m in maps {
        s.domain.unmap_page(m, 0, 0, &mut w).unwrap();
    }
    assert_eq!(s.alloc.live_blocks(), 0);
}

#[test]
fn dma_domains_and_memory_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Domain>();
    check::<PhysMemory>();
    check::<iolab_iommu::dma::FlushQueue>();
    check::<iolab_iommu::mem::PhysAllocator>();
}

#[test]
fn dma_lazy_domain_survives_concurrent_map_unmap_and_device_traffic() {
    let s = build(1, DomainMode::Lazy, SZ_4K);
    let mem = PhysMemory::new(1 << 36).unwrap();
    let dev = Device::new(1, 64).unwrap();
    std::thread::scope(|scope| {
        for cpu in 0..2usize {
            let (s, mem, dev) = (&s, &mem, &dev);
            scope.spawn(move || {
                let mut w = WorkRecord::new();
                for i in 0..2_000u64 {
                    let pa = PhysAddr::new((cpu as u64 * 1_000_000 + i) * SZ_4K + 8);
                    let m = s
                        .domain
                        .map_page(dev, pa, 100, Direction::FromDevice, cpu, &mut w)
                        .unwrap();
                    let data = [cpu as u8 + 1; 100];
                    s.domain
                        .dma_write(dev, mem, m.dma_addr(), &data, &mut w)
                        .unwrap();
                    let mut back = [0; 100];
                    mem.read(pa, &mut back).unwrap();
                    assert_eq!(back, data);
                    s.domain.unmap_page(m, cpu, i * 10_000, &mut w).unwrap();
                }
            });
        }
    });
    let mut w = WorkRecord::new();
    s.domain.flush_all(&mut w);
    assert_eq!(s.domain.live_mappings(), 0);
    assert_eq!(s.alloc.live_blocks(), 0);
    assert_eq!(s.domain.mapped_bytes(), 0);
}
