//! Property tests of DMA API call sequences that mix valid and invalid calls over several
//! domains at once (strict, lazy, identity and no-IOMMU).
//!
//! Every invalid call — double unmap, unmap of an address never mapped, an address inside a
//! mapping (unaligned to its start), a wrong size, a wrong direction, a scatter-gather mapping
//! unmapped by address, a handle given to a foreign domain, a CPU out of range, an empty or
//! wrapping buffer, an empty scatter-gather list or entry, a buffer beyond a device's mask
//! without translation — must return its own error and leave every domain exactly as it was.
//! "Exactly" is a full snapshot: the live-mapping count, bytes mapped, page-table pages, the
//! allocator's live blocks, the flush queue's pending IOVAs, and the translation of every
//! granule of every DMA address the test ever received (mapped or since unmapped).
//!
//! Valid calls are checked against a reference model (a list of live mappings with their
//! physical buffers): the domain holds as many mappings as the model, the page table maps the
//! granule-rounded bytes the model predicts, the allocator holds one block per live mapping
//! plus those on the flush queue, and each live mapping translates back to its buffers.
//!
//! The DMA API has no `dma_sync_*` call (the simulated memory is coherent); the flush
//! operations of lazy mode (`poll_timeout` with an advancing clock, `flush_all`) take the
//! place of "sync" in the call sequences.

mod common;

use common::{canonical, device_access};

use std::collections::BTreeSet;
use std::sync::Arc;

use iolab_iommu::addr::{Access, DmaAddr, Iova, PhysAddr, SZ_4G, SZ_4K};
use iolab_iommu::dma::{
    Device, Direction, DmaError, DmaMapping, DmaSgMapping, Domain, DomainConfig, DomainId,
    DomainMode, ImmediateInvalidator, MappingKind, PhysRange, SgEntry,
};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::IovaAllocator;
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::work::WorkRecord;
use proptest::prelude::*;

/// CPUs every domain serves.
const CPUS: usize = 2;

/// The modes of the domains under test, by index.
const MODES: [DomainMode; 4] = [
    DomainMode::Strict,
    DomainMode::Lazy,
    DomainMode::Identity,
    DomainMode::NoIommu,
];

struct Dom {
    domain: Domain,
    alloc: Option<Arc<dyn IovaAllocator>>,
}

fn build(index: usize) -> Dom {
    let mode = MODES[index];
    let mut config = DomainConfig::new(DomainId(index as u32 + 1), mode);
    config.cpus = CPUS;
    config.flush_queue.ring_size = 4;
    if !mode.is_translated() {
        return Dom {
            domain: Domain::direct(config).expect("direct domain"),
            alloc: None,
        };
    }
    let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("LPAE config");
    let space = IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48));
    let alloc: Arc<dyn IovaAllocator> =
        Arc::new(LinuxIovaAllocator::new(space).expect("IOVA config"));
    let inv = Arc::new(ImmediateInvalidator::new());
    let domain = Domain::translated(config, Box::new(table), alloc.clone(), inv).expect("domain");
    Dom {
        domain,
        alloc: Some(alloc),
    }
}

fn devices() -> [Device; 2] {
    [Device::new(1, 64).unwrap(), Device::new(2, 32).unwrap()]
}

fn direction(d: u8) -> Direction {
    match d % 3 {
        0 => Direction::ToDevice,
        1 => Direction::FromDevice,
        _ => Direction::Bidirectional,
    }
}

fn other_direction(d: Direction) -> Direction {
    match d {
        Direction::ToDevice => Direction::FromDevice,
        Direction::FromDevice => Direction::Bidirectional,
        Direction::Bidirectional => Direction::ToDevice,
    }
}

enum Handle {
    Single(DmaMapping),
    Sg(DmaSgMapping),
}

/// One live mapping in the reference model.
struct Live {
    dom: usize,
    dev: usize,
    dir: Direction,
    entries: Vec<SgEntry>,
    handle: Handle,
}

impl Live {
    fn start(&self) -> u64 {
        match &self.handle {
            Handle::Single(m) => m.dma_addr().0,
            Handle::Sg(m) => m.segments()[0].dma.0,
        }
    }

    fn total(&self) -> u64 {
        self.entries.iter().map(|e| e.len).sum()
    }

    fn pieces(&self) -> Vec<(u64, u64)> {
        match &self.handle {
            Handle::Single(m) => vec![(m.dma_addr().0, m.len())],
            Handle::Sg(m) => m.segments().iter().map(|s| (s.dma.0, s.len)).collect(),
        }
    }

    /// Granule-rounded bytes a translated domain's table maps for this mapping.
    fn table_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| (e.pa.offset_in(SZ_4K) + e.len).div_ceil(SZ_4K) * SZ_4K)
            .sum()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Map {
        dom: usize,
        dev: usize,
        page: u64,
        off: u64,
        len: u64,
        dir: u8,
        cpu: usize,
    },
    MapSg {
        dom: usize,
        page: u64,
        pieces: Vec<(u64, u64, u64)>,
        dir: u8,
    },
    Unmap {
        pick: usize,
        raw: bool,
        cpu: usize,
    },
    Sync {
        dom: usize,
        ns: u64,
        all: bool,
    },
    DoubleUnmap {
        pick: usize,
    },
    NeverMapped {
        dom: usize,
        addr: u64,
    },
    Unaligned {
        pick: usize,
        delta: u64,
    },
    WrongSize {
        pick: usize,
        delta: u64,
        smaller: bool,
    },
    WrongDirection {
        pick: usize,
    },
    RawOnSg {
        pick: usize,
    },
    Foreign {
        pick: usize,
        to: usize,
    },
    BadCpu {
        pick: usize,
    },
    BadBuffer {
        dom: usize,
        wrap: bool,
    },
    BadSg {
        dom: usize,
        empty: bool,
    },
    BeyondMask {
        dom: usize,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..4, 0usize..2, 1u64..0xf_0000, 0u64..SZ_4K, 1u64..3 * SZ_4K, any::<u8>(), 0usize..CPUS)
            .prop_map(|(dom, dev, page, off, len, dir, cpu)| Op::Map { dom, dev, page, off, len, dir, cpu }),
        3 => (
            0usize..4,
            1u64..0xf_0000,
            prop::collection::vec((0u64..3, 0u64..SZ_4K, 1u64..2 * SZ_4K), 1..6),
            any::<u8>(),
        )
            .prop_map(|(dom, page, pieces, dir)| Op::MapSg { dom, page, pieces, dir }),
        5 => (any::<usize>(), any::<bool>(), 0usize..CPUS)
            .prop_map(|(pick, raw, cpu)| Op::Unmap { pick, raw, cpu }),
        2 => (0usize..4, 0u64..3_000_000, any::<bool>())
            .prop_map(|(dom, ns, all)| Op::Sync { dom, ns, all }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleUnmap { pick }),
        1 => (0usize..4, any::<u64>()).prop_map(|(dom, addr)| Op::NeverMapped { dom, addr }),
        1 => (any::<usize>(), 1u64..SZ_4K).prop_map(|(pick, delta)| Op::Unaligned { pick, delta }),
        1 => (any::<usize>(), 1u64..SZ_4K, any::<bool>())
            .prop_map(|(pick, delta, smaller)| Op::WrongSize { pick, delta, smaller }),
        1 => any::<usize>().prop_map(|pick| Op::WrongDirection { pick }),
        1 => any::<usize>().prop_map(|pick| Op::RawOnSg { pick }),
        1 => (any::<usize>(), 1usize..4).prop_map(|(pick, to)| Op::Foreign { pick, to }),
        1 => any::<usize>().prop_map(|pick| Op::BadCpu { pick }),
        1 => (0usize..4, any::<bool>()).prop_map(|(dom, wrap)| Op::BadBuffer { dom, wrap }),
        1 => (0usize..4, any::<bool>()).prop_map(|(dom, empty)| Op::BadSg { dom, empty }),
        1 => (2usize..4).prop_map(|dom| Op::BeyondMask { dom }),
    ]
}

/// What the test can observe of one domain.
#[derive(Debug, PartialEq, Eq)]
struct DomSnapshot {
    live: usize,
    mapped_bytes: u64,
    table_pages: usize,
    alloc_blocks: Option<usize>,
    pending: usize,
    translations: Vec<(u64, Result<Vec<PhysRange>, String>)>,
}

struct Harness {
    doms: Vec<Dom>,
    devs: [Device; 2],
    live: Vec<Live>,
    /// Unmapped mappings: (domain, start, total length, direction, single?).
    dead: Vec<(usize, u64, u64, Direction, bool)>,
    /// Every granule-aligned DMA address ever handed out, per domain.
    seen: Vec<BTreeSet<u64>>,
    now: u64,
    work: WorkRecord,
}

fn fail(msg: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(msg.to_string())
}

impl Harness {
    fn new() -> Self {
        Self {
            doms: (0..MODES.len()).map(build).collect(),
            devs: devices(),
            live: Vec::new(),
            dead: Vec::new(),
            seen: vec![BTreeSet::new(); MODES.len()],
            now: 0,
            work: WorkRecord::new(),
        }
    }

    fn snapshot(&self) -> Vec<DomSnapshot> {
        let dev = &self.devs[0];
        self.doms
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut work = WorkRecord::new();
                let translations = self.seen[i]
                    .iter()
                    .map(|&a| {
                        let t = d
                            .domain
                            .translate(dev, DmaAddr(a), SZ_4K, Access::Read, &mut work)
                            .map_err(|f| format!("{:?}", f.reason));
                        (a, t)
                    })
                    .collect();
                DomSnapshot {
                    live: d.domain.live_mappings(),
                    mapped_bytes: d.domain.mapped_bytes(),
                    table_pages: d.domain.table_pages(),
                    alloc_blocks: d.alloc.as_ref().map(|a| a.live_blocks()),
                    pending: d.domain.flush_queue().map_or(0, |fq| fq.pending()),
                    translations,
                }
            })
            .collect()
    }

    fn record(&mut self, dom: usize, pieces: &[(u64, u64)]) {
        for &(a, len) in pieces {
            let first = a / SZ_4K * SZ_4K;
            let mut p = first;
            while p < a + len {
                self.seen[dom].insert(p);
                p += SZ_4K;
            }
        }
    }

    fn pick(&self, pick: usize, want: impl Fn(&Live) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.live.len())
            .filter(|&i| want(&self.live[i]))
            .collect();
        (!idx.is_empty()).then(|| idx[pick % idx.len()])
    }

    /// Whether a live mapping of `dom` starts at `addr`.
    fn starts_at(&self, dom: usize, addr: u64) -> bool {
        self.live.iter().any(|l| l.dom == dom && l.start() == addr)
    }

    /// Runs an invalid call: it must fail with `expect` and change nothing anywhere.
    fn invalid(
        &mut self,
        expect: impl Fn(&DmaError) -> bool,
        call: impl FnOnce(&mut Self) -> Result<(), DmaError>,
    ) -> Result<(), TestCaseError> {
        let before = self.snapshot();
        match call(self) {
            Ok(()) => return Err(fail("an invalid call succeeded")),
            Err(e) if !expect(&e) => return Err(fail(format!("unexpected error: {e:?}"))),
            Err(_) => {}
        }
        let after = self.snapshot();
        if before != after {
            return Err(fail(format!(
                "an invalid call changed state:\nbefore {before:?}\nafter {after:?}"
            )));
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.now += 1_000;
        let now = self.now;
        match op.clone() {
            Op::Map {
                dom,
                dev,
                page,
                off,
                len,
                dir,
                cpu,
            } => {
                let pa = PhysAddr::new(page * SZ_4K + off);
                let dir = direction(dir);
                let d = &self.doms[dom].domain;
                let m = d
                    .map_page(&self.devs[dev], pa, len, dir, cpu, &mut self.work)
                    .map_err(|e| fail(format!("valid map failed: {e}")))?;
                if !d.mode().is_translated() {
                    prop_assert_eq!(m.dma_addr().0, pa.get(), "direct modes map at the PA");
                } else {
                    prop_assert_eq!(m.dma_addr().0 % SZ_4K, pa.get() % SZ_4K);
                }
                prop_assert!(self.devs[dev].reaches(m.dma_addr().0, len));
                self.record(dom, &[(m.dma_addr().0, len)]);
                self.live.push(Live {
                    dom,
                    dev,
                    dir,
                    entries: vec![SgEntry { pa, len }],
                    handle: Handle::Single(m),
                });
            }
            Op::MapSg {
                dom,
                page,
                pieces,
                dir,
            } => {
                // Pieces laid out from `page`: a gap of `gap` pages, then `off` into the page.
                let mut entries = Vec::new();
                let mut next = page * SZ_4K;
                for (gap, off, len) in pieces {
                    let pa = next + gap * SZ_4K + off;
                    entries.push(SgEntry {
                        pa: PhysAddr::new(pa),
                        len,
                    });
                    next = (pa + len).div_ceil(SZ_4K) * SZ_4K;
                }
                let dir = direction(dir);
                let d = &self.doms[dom].domain;
                let m = d
                    .map_sg(&self.devs[0], &entries, dir, 0, &mut self.work)
                    .map_err(|e| fail(format!("valid map_sg failed: {e}")))?;
                let total: u64 = entries.iter().map(|e| e.len).sum();
                prop_assert_eq!(m.segments().iter().map(|s| s.len).sum::<u64>(), total);
                prop_assert_eq!(m.nents(), entries.len());
                let pieces: Vec<_> = m.segments().iter().map(|s| (s.dma.0, s.len)).collect();
                self.record(dom, &pieces);
                self.live.push(Live {
                    dom,
                    dev: 0,
                    dir,
                    entries,
                    handle: Handle::Sg(m),
                });
            }
            Op::Unmap { pick, raw, cpu } => {
                let Some(i) = self.pick(pick, |_| true) else {
                    return Ok(());
                };
                let l = self.live.swap_remove(i);
                let d = &self.doms[l.dom].domain;
                let (start, total, single) =
                    (l.start(), l.total(), matches!(l.handle, Handle::Single(_)));
                match l.handle {
                    Handle::Single(m) if raw => d
                        .unmap_raw(
                            m.dma_addr(),
                            m.len(),
                            m.direction(),
                            cpu,
                            now,
                            &mut self.work,
                        )
                        .map_err(|e| fail(format!("valid unmap_raw failed: {e}")))?,
                    Handle::Single(m) => d
                        .unmap_page(m, cpu, now, &mut self.work)
                        .map_err(|e| fail(format!("valid unmap failed: {e}")))?,
                    Handle::Sg(m) => d
                        .unmap_sg(m, cpu, now, &mut self.work)
                        .map_err(|e| fail(format!("valid unmap_sg failed: {e}")))?,
                }
                self.dead.push((l.dom, start, total, l.dir, single));
            }
            Op::Sync { dom, ns, all } => {
                self.now += ns;
                let d = &self.doms[dom].domain;
                if all {
                    d.flush_all(&mut self.work);
                    prop_assert_eq!(d.flush_queue().map_or(0, |fq| fq.pending()), 0);
                } else {
                    d.poll_timeout(self.now, &mut self.work);
                }
            }
            Op::DoubleUnmap { pick } => {
                if self.dead.is_empty() {
                    return Ok(());
                }
                let (dom, start, len, dir, single) = self.dead[pick % self.dead.len()];
                if !single || self.starts_at(dom, start) {
                    return Ok(());
                }
                self.invalid(
                    |e| matches!(e, DmaError::NotMapped { dma, .. } if *dma == start),
                    |h| {
                        h.doms[dom]
                            .domain
                            .unmap_raw(DmaAddr(start), len, dir, 0, now, &mut h.work)
                    },
                )?;
            }
            Op::NeverMapped { dom, addr } => {
                if self.starts_at(dom, addr) {
                    return Ok(());
                }
                self.invalid(
                    |e| matches!(e, DmaError::NotMapped { dma, .. } if *dma == addr),
                    |h| {
                        h.doms[dom].domain.unmap_raw(
                            DmaAddr(addr),
                            SZ_4K,
                            Direction::Bidirectional,
                            1,
                            now,
                            &mut h.work,
                        )
                    },
                )?;
            }
            Op::Unaligned { pick, delta } => {
                let Some(i) = self.pick(pick, |l| l.total() > 1) else {
                    return Ok(());
                };
                let l = &self.live[i];
                let (dom, len, dir) = (l.dom, l.total(), l.dir);
                let addr = l.start() + delta % (len - 1) + 1;
                if self.starts_at(dom, addr) {
                    return Ok(());
                }
                self.invalid(
                    |e| matches!(e, DmaError::NotMapped { dma, .. } if *dma == addr),
                    |h| {
                        h.doms[dom]
                            .domain
                            .unmap_raw(DmaAddr(addr), len, dir, 0, now, &mut h.work)
                    },
                )?;
            }
            Op::WrongSize {
                pick,
                delta,
                smaller,
            } => {
                let Some(i) = self.pick(pick, |l| matches!(l.handle, Handle::Single(_))) else {
                    return Ok(());
                };
                let l = &self.live[i];
                let (dom, start, len, dir) = (l.dom, l.start(), l.total(), l.dir);
                let given = if smaller && len > 1 {
                    len - 1 - delta % (len - 1)
                } else {
                    len + delta
                };
                // Another single mapping at the same address with that size would be valid.
                let clash = self
                    .live
                    .iter()
                    .any(|o| o.dom == dom && o.start() == start && o.total() == given);
                if clash {
                    return Ok(());
                }
                self.invalid(
                    |e| {
                        matches!(e, DmaError::SizeMismatch { dma, given: g, .. }
                            if *dma == start && *g == given)
                    },
                    |h| {
                        h.doms[dom].domain.unmap_raw(
                            DmaAddr(start),
                            given,
                            dir,
                            0,
                            now,
                            &mut h.work,
                        )
                    },
                )?;
            }
            Op::WrongDirection { pick } => {
                let Some(i) = self.pick(pick, |l| matches!(l.handle, Handle::Single(_))) else {
                    return Ok(());
                };
                let l = &self.live[i];
                let (dom, dev, start, len, dir) = (l.dom, l.dev, l.start(), l.total(), l.dir);
                let wrong = other_direction(dir);
                let clash = self.live.iter().any(|o| {
                    o.dom == dom && o.start() == start && o.total() == len && o.dir == wrong
                });
                if clash {
                    return Ok(());
                }
                self.invalid(
                    |e| {
                        matches!(e, DmaError::DirectionMismatch { dma, mapped, given }
                            if *dma == start && *mapped == dir && *given == wrong)
                    },
                    |h| {
                        h.doms[dom].domain.unmap_raw(
                            DmaAddr(start),
                            len,
                            wrong,
                            0,
                            now,
                            &mut h.work,
                        )
                    },
                )?;
                // The device side: a read-only mapping cannot be written through a
                // translated domain.
                if dir == Direction::ToDevice && MODES[dom].is_translated() {
                    let before = self.snapshot();
                    let d = &self.doms[dom].domain;
                    let r = d.translate(
                        &self.devs[dev],
                        DmaAddr(start),
                        len,
                        Access::Write,
                        &mut self.work,
                    );
                    prop_assert!(r.is_err(), "a write through a read-only mapping succeeded");
                    prop_assert_eq!(before, self.snapshot());
                }
            }
            Op::RawOnSg { pick } => {
                let Some(i) = self.pick(pick, |l| matches!(l.handle, Handle::Sg(_))) else {
                    return Ok(());
                };
                let l = &self.live[i];
                let (dom, start, len, dir) = (l.dom, l.start(), l.total(), l.dir);
                if self.live.iter().any(|o| {
                    o.dom == dom && o.start() == start && matches!(o.handle, Handle::Single(_))
                }) {
                    return Ok(());
                }
                self.invalid(
                    |e| {
                        matches!(e, DmaError::KindMismatch { dma, mapped: MappingKind::Sg, given: MappingKind::Single }
                            if *dma == start)
                    },
                    |h| {
                        h.doms[dom]
                            .domain
                            .unmap_raw(DmaAddr(start), len, dir, 0, now, &mut h.work)
                    },
                )?;
            }
            Op::Foreign { pick, to } => {
                let Some(i) = self.pick(pick, |_| true) else {
                    return Ok(());
                };
                let mut l = self.live.swap_remove(i);
                let other = (l.dom + to) % MODES.len();
                let (from_id, to_id) = (DomainId(l.dom as u32 + 1), DomainId(other as u32 + 1));
                let before = self.snapshot();
                let d = &self.doms[other].domain;
                let err = match l.handle {
                    Handle::Single(m) => {
                        let r = d
                            .unmap_page(m, 0, now, &mut self.work)
                            .expect_err("foreign unmap");
                        l.handle = Handle::Single(r.handle);
                        r.error
                    }
                    Handle::Sg(m) => {
                        let r = d
                            .unmap_sg(m, 0, now, &mut self.work)
                            .expect_err("foreign unmap_sg");
                        l.handle = Handle::Sg(r.handle);
                        r.error
                    }
                };
                prop_assert_eq!(
                    err,
                    DmaError::WrongDomain {
                        mapping_domain: from_id,
                        domain: to_id
                    }
                );
                prop_assert_eq!(before, self.snapshot());
                self.live.push(l);
            }
            Op::BadCpu { pick } => {
                let Some(i) = self.pick(pick, |_| true) else {
                    return Ok(());
                };
                let mut l = self.live.swap_remove(i);
                let before = self.snapshot();
                let d = &self.doms[l.dom].domain;
                let err = match l.handle {
                    Handle::Single(m) => {
                        let r = d
                            .unmap_page(m, CPUS, now, &mut self.work)
                            .expect_err("bad cpu");
                        l.handle = Handle::Single(r.handle);
                        r.error
                    }
                    Handle::Sg(m) => {
                        let r = d
                            .unmap_sg(m, CPUS + 7, now, &mut self.work)
                            .expect_err("bad cpu");
                        l.handle = Handle::Sg(r.handle);
                        r.error
                    }
                };
                prop_assert!(
                    matches!(err, DmaError::BadCpu { cpus: CPUS, .. }),
                    "{err:?}"
                );
                prop_assert_eq!(before, self.snapshot());
                self.live.push(l);
            }
            Op::BadBuffer { dom, wrap } => {
                let (pa, len) = if wrap {
                    (PhysAddr::new(u64::MAX - SZ_4K + 1), 2 * SZ_4K)
                } else {
                    (PhysAddr::new(0x10_0000), 0)
                };
                self.invalid(
                    |e| matches!(e, DmaError::BadBuffer { pa: p, len: l } if *p == pa.get() && *l == len),
                    |h| {
                        h.doms[dom]
                            .domain
                            .map_page(&h.devs[0], pa, len, Direction::ToDevice, 0, &mut h.work)
                            .map(drop)
                    },
                )?;
            }
            Op::BadSg { dom, empty } => {
                let entries = if empty {
                    vec![]
                } else {
                    vec![
                        SgEntry {
                            pa: PhysAddr::new(0x20_0000),
                            len: SZ_4K,
                        },
                        SgEntry {
                            pa: PhysAddr::new(0x30_0000),
                            len: 0,
                        },
                    ]
                };
                self.invalid(
                    |e| {
                        if empty {
                            matches!(e, DmaError::EmptySgList)
                        } else {
                            matches!(
                                e,
                                DmaError::BadSgEntry {
                                    index: 1,
                                    len: 0,
                                    ..
                                }
                            )
                        }
                    },
                    |h| {
                        h.doms[dom]
                            .domain
                            .map_sg(&h.devs[0], &entries, Direction::FromDevice, 1, &mut h.work)
                            .map(drop)
                    },
                )?;
            }
            Op::BeyondMask { dom } => {
                // Without translation a 32-bit device cannot reach a buffer above 4 GiB.
                let pa = PhysAddr::new(SZ_4G + 0x3000);
                self.invalid(
                    |e| {
                        matches!(
                            e,
                            DmaError::MaskTooSmall {
                                device: 2,
                                mask_bits: 32,
                                ..
                            }
                        )
                    },
                    |h| {
                        h.doms[dom]
                            .domain
                            .map_page(&h.devs[1], pa, 512, Direction::ToDevice, 0, &mut h.work)
                            .map(drop)
                    },
                )?;
            }
        }
        self.check()
    }

    /// The domains agree with the reference model.
    fn check(&self) -> Result<(), TestCaseError> {
        for (i, d) in self.doms.iter().enumerate() {
            let mine: Vec<&Live> = self.live.iter().filter(|l| l.dom == i).collect();
            prop_assert_eq!(d.domain.live_mappings(), mine.len());
            if MODES[i].is_translated() {
                let bytes: u64 = mine.iter().map(|l| l.table_bytes()).sum();
                prop_assert_eq!(d.domain.mapped_bytes(), bytes);
                let pending = d.domain.flush_queue().map_or(0, |fq| fq.pending());
                let blocks = d.alloc.as_ref().map_or(0, |a| a.live_blocks());
                prop_assert_eq!(blocks, mine.len() + pending);
            } else {
                prop_assert_eq!(d.domain.mapped_bytes(), 0);
                prop_assert_eq!(d.domain.table_pages(), 0);
            }
            for l in mine {
                let mut work = WorkRecord::new();
                let mut got = Vec::new();
                for (dma, len) in l.pieces() {
                    let r = d
                        .domain
                        .translate(
                            &self.devs[l.dev],
                            DmaAddr(dma),
                            len,
                            device_access(l.dir),
                            &mut work,
                        )
                        .map_err(|f| fail(format!("live mapping faulted: {f}")))?;
                    got.extend(r);
                }
                let want = canonical(l.entries.iter().map(|e| PhysRange {
                    pa: e.pa,
                    len: e.len,
                }));
                prop_assert_eq!(canonical(got), want);
            }
        }
        Ok(())
    }

    /// Unmaps everything; every domain ends empty.
    fn teardown(mut self) -> Result<(), TestCaseError> {
        while let Some(l) = self.live.pop() {
            let d = &self.doms[l.dom].domain;
            match l.handle {
                Handle::Single(m) => d
                    .unmap_page(m, 0, self.now, &mut self.work)
                    .map_err(|r| fail(r.error))?,
                Handle::Sg(m) => d
                    .unmap_sg(m, 0, self.now, &mut self.work)
                    .map_err(|r| fail(r.error))?,
            }
        }
        for d in &self.doms {
            d.domain.flush_all(&mut self.work);
            prop_assert_eq!(d.domain.live_mappings(), 0);
            prop_assert_eq!(d.domain.mapped_bytes(), 0);
            prop_assert_eq!(d.alloc.as_ref().map_or(0, |a| a.live_blocks()), 0);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn invalid_calls_fail_and_change_nothing_valid_calls_match_the_model(
        ops in prop::collection::vec(arb_op(), 1..120)
    ) {
        let mut h = Harness::new();
        for op in &ops {
            h.step(op)?;
        }
        h.teardown()?;
    }
}

/// Each invalid call kind on its own, once, so a regression names the call.
#[test]
fn every_invalid_call_kind_is_rejected_on_every_mode() {
    for (dom, mode) in MODES.iter().enumerate() {
        let mut h = Harness::new();
        let ops = [
            Op::Map {
                dom,
                dev: 0,
                page: 16,
                off: 0x100,
                len: 3 * 1024,
                dir: 0,
                cpu: 0,
            },
            Op::MapSg {
                dom,
                page: 64,
                pieces: vec![(0, 0, SZ_4K), (1, 0x200, 0x800)],
                dir: 1,
            },
            Op::WrongSize {
                pick: 0,
                delta: 8,
                smaller: false,
            },
            Op::WrongSize {
                pick: 0,
                delta: 8,
                smaller: true,
            },
            Op::WrongDirection { pick: 0 },
            Op::Unaligned { pick: 0, delta: 5 },
            Op::RawOnSg { pick: 0 },
            Op::Foreign { pick: 0, to: 1 },
            Op::Foreign { pick: 1, to: 3 },
            Op::BadCpu { pick: 0 },
            Op::NeverMapped {
                dom,
                addr: 0x7777_0000,
            },
            Op::BadBuffer { dom, wrap: true },
            Op::BadBuffer { dom, wrap: false },
            Op::BadSg { dom, empty: true },
            Op::BadSg { dom, empty: false },
            Op::Unmap {
                pick: 0,
                raw: true,
                cpu: 1,
            },
            Op::DoubleUnmap { pick: 0 },
            Op::Sync {
                dom,
                ns: 20_000_000,
                all: false,
            },
        ];
        for op in &ops {
            h.step(op)
                .unwrap_or_else(|e| panic!("mode {mode:?}, {op:?}: {e}"));
        }
        if !mode.is_translated() {
            h.step(&Op::BeyondMask { dom }).unwrap();
        }
        h.teardown().unwrap();
    }
}
