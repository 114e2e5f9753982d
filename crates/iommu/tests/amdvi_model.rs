//! AMD-Vi model tests: the v1 page table against a reference model. Tests live in
//! `mod amdvi` so `cargo test amdvi` runs them.

mod amdvi {
    use std::collections::BTreeMap;

    use iolab_iommu::addr::{Iova, PhysAddr, Prot, SZ_4K};
    use iolab_iommu::amdvi::{AmdV1Config, AmdV1Table};
    use iolab_iommu::pgtable::{IoPageTable, PgTableError, UnmapGather};
    use iolab_iommu::work::WorkRecord;
    use proptest::prelude::*;

    /// Physical pages are `PA_BASE + iova` (plus a skew in pages), so large pages form
    /// whenever the IOVA alignment allows and the skew is zero.
    const PA_BASE: u64 = 1 << 40;

    #[derive(Clone, Debug)]
    enum Op {
        Map {
            region: usize,
            page: u64,
            pages: u64,
            skew: u64,
            prot: u8,
        },
        UnmapEarlier {
            pick: usize,
        },
        UnmapRandom {
            region: usize,
            page: u64,
            pages: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        // Page counts from 1 to 3 * 512 + 16: 4 KiB runs, 64 KiB and 1 MiB sized pages,
        // 2 MiB and 4 MiB pages when aligned.
        let pages = prop_oneof![3 => 1u64..40, 2 => 1u64..1600];
        prop_oneof![
            5 => (0..3usize, 0u64..4096, pages.clone(), prop_oneof![3 => Just(0u64), 1 => 1..3u64], 0..3u8)
                .prop_map(|(region, page, pages, skew, prot)| Op::Map { region, page, pages, skew, prot }),
            3 => any::<usize>().prop_map(|pick| Op::UnmapEarlier { pick }),
            1 => (0..3usize, 0u64..4096, pages)
                .prop_map(|(region, page, pages)| Op::UnmapRandom { region, page, pages }),
        ]
    }

    /// Three regions: low, across the 1 GiB boundary, and near the top of a 48-bit space
    /// (so the level-4 and level-3 tables take more than one entry).
    const REGIONS: [u64; 3] = [0, (1 << 30) - (8 << 20), (1 << 47) - (16 << 20)];

    type Model = BTreeMap<u64, (u64, Prot)>;

    fn prot_of(p: u8) -> Prot {
        [Prot::READ, Prot::WRITE, Prot::READ_WRITE][usize::from(p)]
    }

    fn check_pages(t: &AmdV1Table, model: &Model, first: u64, pages: u64) {
        for i in first.saturating_sub(2)..first + pages + 2 {
            let iova = i * SZ_4K;
            let got = t.translate(Iova::new(iova + 0x123), &mut WorkRecord::new());
            match model.get(&i) {
                Some(&(pa, prot)) => {
                    let tr = got.unwrap_or_else(|| panic!("page {iova:#x} should be mapped"));
                    assert_eq!(tr.pa, PhysAddr::new(pa + 0x123), "page {iova:#x}");
                    assert_eq!(tr.prot, prot, "page {iova:#x}");
                    assert!(tr.page_size.is_power_of_two() && tr.page_size >= SZ_4K);
                }
                None => assert_eq!(got, None, "page {iova:#x} should be unmapped"),
            }
        }
    }

    fn snapshot(t: &AmdV1Table) -> (u64, usize) {
        (t.mapped_bytes(), t.table_pages())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn v1_table_matches_a_btreemap(ops in prop::collection::vec(op(), 1..24), huge in any::<bool>()) {
            let mut t = AmdV1Table::new(AmdV1Config::new(48).with_huge_pages(huge)).unwrap();
            let mut model = Model::new();
            let mut maps: Vec<(u64, u64)> = Vec::new();
            let mut freed_bytes = 0;
            let mut mapped_total = 0;
            for op in ops {
                let mut w = WorkRecord::new();
                let mut g = UnmapGather::new();
                match op {
                    Op::Map { region, page, pages, skew, prot } => {
                        let first = REGIONS[region] / SZ_4K + page;
                        let iova = first * SZ_4K;
                        let pa = PA_BASE + iova + skew * SZ_4K;
                        let prot = prot_of(prot);
                        let before = snapshot(&t);
                        let free = (first..first + pages).all(|p| !model.contains_key(&p));
                        match t.map(Iova::new(iova), PhysAddr::new(pa), pages * SZ_4K, prot, &mut w) {
                            Ok(()) => {
                                prop_assert!(free, "mapped over a live page at {iova:#x}");
                                for i in 0..pages {
                                    model.insert(first + i, (pa + i * SZ_4K, prot));
                                }
                                maps.push((iova, pages * SZ_4K));
                                mapped_total += pages * SZ_4K;
                            }
                            Err(PgTableError::AlreadyMapped { iova: at }) => {
                                prop_assert!(!free);
                                prop_assert!(model.contains_key(&(at / SZ_4K)));
                                prop_assert_eq!(snapshot(&t), before);
                            }
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                        check_pages(&t, &model, first, pages);
                    }
                    Op::UnmapEarlier { pick } => {
                        if maps.is_empty() {
                            continue;
                        }
                        let (iova, size) = maps.swap_remove(pick % maps.len());
                        if !(0..size / SZ_4K).all(|i| model.contains_key(&(iova / SZ_4K + i))) {
                            // Partly removed by a random unmap already.
                            continue;
                        }
                        t.unmap(Iova::new(iova), size, &mut g, &mut w).unwrap();
                        prop_assert_eq!(g.bytes(), size);
                        prop_assert!(g.freed_tables.is_empty());
                        // Gathered ranges tile the unmapped range in order.
                        let mut at = iova;
                        for r in &g.ranges {
                            prop_assert_eq!(r.start.get(), at);
                            prop_assert!(r.start.get() % r.page_size == 0);
                            at += r.size;
                        }
                        freed_bytes += size;
                        for i in 0..size / SZ_4K {
                            model.remove(&(iova / SZ_4K + i));
                        }
                        check_pages(&t, &model, iova / SZ_4K, size / SZ_4K);
                    }
                    Op::UnmapRandom { region, page, pages } => {
                        let first = REGIONS[region] / SZ_4K + page;
                        let before = snapshot(&t);
                        match t.unmap(Iova::new(first * SZ_4K), pages * SZ_4K, &mut g, &mut w) {
                            Ok(()) => {
                                for i in first..first + pages {
                                    prop_assert!(model.remove(&i).is_some(), "unmapped a hole");
                                }
                                prop_assert_eq!(g.bytes(), pages * SZ_4K);
                                freed_bytes += pages * SZ_4K;
                            }
                            Err(PgTableError::NotMapped { iova }) => {
                                prop_assert!(!model.contains_key(&(iova / SZ_4K)));
                                prop_assert!(g.is_empty());
                                prop_assert_eq!(snapshot(&t), before);
                            }
                            Err(PgTableError::SplitsBlock { block_iova, block_size, .. }) => {
                                prop_assert!(block_size > SZ_4K && huge);
                                prop_assert!(model.contains_key(&(block_iova / SZ_4K)));
                                prop_assert!(g.is_empty());
                                prop_assert_eq!(snapshot(&t), before);
                            }
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                        check_pages(&t, &model, first, pages);
                    }
                }
                prop_assert_eq!(t.mapped_bytes(), model.len() as u64 * SZ_4K);
            }
            prop_assert_eq!(mapped_total - freed_bytes, t.mapped_bytes());
        }
    }

    // ----------------------------------------------------------------------------------
    // The IOMMU unit and the strict-unmap invalidator.

    use std::sync::Arc;

    use iolab_iommu::addr::{Access, SZ_2M, SZ_4G};
    use iolab_iommu::amdvi::spec::{fault_flags, RawCommand};
    use iolab_iommu::amdvi::{
        AmdVi, AmdViConfig, AmdViDomain, AmdViError, AmdViFaultReason, Command, Dte, Event,
        InvAddress,
    };
    use iolab_iommu::dma::Invalidator;
    use iolab_iommu::dma::{Device, Direction, DmaMapping, DomainConfig, DomainId, DomainMode};
    use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use iolab_iommu::mem::PhysMemory;
    use iolab_iommu::pgtable::GatherRange;
    use iolab_iommu::work::LockId;

    const DEV: u16 = 0x0018;

    fn iommu_with(config: AmdViConfig) -> (AmdVi, Arc<PhysMemory>) {
        let mem = Arc::new(PhysMemory::new(1 << 30).unwrap());
        (AmdVi::new(config, mem.clone()).unwrap(), mem)
    }

    fn iommu() -> (AmdVi, Arc<PhysMemory>) {
        iommu_with(AmdViConfig::default())
    }

    fn domain(iommu: &AmdVi, id: u16, mode: DomainMode) -> AmdViDomain {
        let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap();
        let d = iommu
            .new_domain(
                id,
                DomainConfig::new(DomainId(u32::from(id)), mode),
                AmdV1Config::new(48),
                Arc::new(alloc),
            )
            .unwrap();
        iommu.attach(DEV, &d, &mut WorkRecord::new()).unwrap();
        d
    }

    fn map(d: &AmdViDomain, pa: u64, len: u64, dir: Direction) -> DmaMapping {
        d.domain()
            .map_page(
                &Device::new(1, 64).unwrap(),
                PhysAddr::new(pa),
                len,
                dir,
                0,
                &mut WorkRecord::new(),
            )
            .unwrap()
    }

    fn iova_of(m: &DmaMapping) -> Iova {
        Iova::new(m.dma_addr().0)
    }

    /// The commands between ring slots `from..to`, decoded.
    fn ring(iommu: &AmdVi, from: usize, to: usize) -> Vec<Command> {
        (from..to)
            .map(|i| Command::decode(iommu.cmd_ring_entry(i).unwrap()).unwrap())
            .collect()
    }

    fn slot(iommu: &AmdVi) -> usize {
        (iommu.cmd_tail() / 16) as usize
    }

    #[test]
    fn strict_unmap_flushes_with_two_commands_and_leaves_no_stale_entry() {
        let (iommu, mem) = iommu();
        let d = domain(&iommu, 1, DomainMode::Strict);
        let m = map(&d, 0x10_0000, SZ_4K, Direction::Bidirectional);
        let at = iova_of(&m);

        // Cold: the DTE read and a four-level walk.
        let mut w = WorkRecord::new();
        let tr = iommu.translate(DEV, at, Access::Read, &mut w).unwrap();
        assert_eq!(tr.pa, PhysAddr::new(0x10_0000));
        assert_eq!((w.iotlb_misses, w.walk_reads), (1, 1 + 4));
        // Warm: an IOTLB hit, the DTE from its cache.
        let mut w = WorkRecord::new();
        iommu.translate(DEV, at, Access::Write, &mut w).unwrap();
        assert_eq!((w.iotlb_hits, w.walk_reads), (1, 0));

        let before = slot(&iommu);
        let stats = iommu.command_stats();
        let mut w = WorkRecord::new();
        d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        // X86.md 4.2: 2 commands, 2 tail writes, 1 completion wait (one 1 us poll);
        // dom->lock once (plus the DMA layer's own table lock), iommu->lock per command.
        assert_eq!(w.commands_written, 2);
        assert_eq!(w.mmio_writes, 2);
        assert_eq!(w.inval_syncs, 1);
        assert_eq!(w.polls, 1);
        assert_eq!(w.lock_count(LockId::CmdqLock), 2);
        assert_eq!(w.lock_count(LockId::PageTable), 2);
        assert_eq!(
            ring(&iommu, before, before + 2),
            vec![
                Command::invalidate_pages(1, at.get(), SZ_4K),
                Command::completion_wait(iommu.config().sem_addr.get(), 2),
            ]
        );
        let after = iommu.command_stats();
        assert_eq!(after.inv_pages - stats.inv_pages, 1);
        assert_eq!(after.completion_waits - stats.completion_waits, 1);
        assert_eq!(after.iotlb_removed - stats.iotlb_removed, 1);
        assert_eq!(iommu.cmd_head(), iommu.cmd_tail());
        // The semaphore holds the second sequence number (the first was the attach's).
        let mut sem = [0u8; 8];
        mem.read(iommu.config().sem_addr, &mut sem).unwrap();
        assert_eq!(u64::from_le_bytes(sem), 2);

        assert_eq!(iommu.caches().iotlb.count_stale(), 0);
        assert!(iommu
            .caches()
            .iotlb
            .probe(iolab_iommu::iotlb::Asid(1), at)
            .is_none());
        let mut w = WorkRecord::new();
        let f = iommu.translate(DEV, at, Access::Read, &mut w).unwrap_err();
        assert_eq!(f.reason, AmdViFaultReason::NotPresent);
        assert_eq!(w.iotlb_stale_hits, 0);
        assert_eq!(
            iommu.drain_events(),
            vec![Event::IoPageFault {
                device_id: DEV,
                domain_id: 1,
                flags: 0,
                address: at.get()
            }]
        );
    }

    #[test]
    fn lazy_unmap_keeps_a_stale_entry_until_the_flush_all() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 2, DomainMode::Lazy);
        let m = map(&d, 0x20_0000, SZ_4K, Direction::ToDevice);
        let at = iova_of(&m);
        iommu
            .translate(DEV, at, Access::Read, &mut WorkRecord::new())
            .unwrap();
        let mut w = WorkRecord::new();
        d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!(w.commands_written, 0);
        let mut w = WorkRecord::new();
        iommu.translate(DEV, at, Access::Read, &mut w).unwrap();
        assert_eq!(
            w.iotlb_stale_hits, 1,
            "the device still reaches the old page"
        );

        let before = slot(&iommu);
        let mut w = WorkRecord::new();
        d.domain().flush_all(&mut w);
        assert_eq!((w.commands_written, w.mmio_writes, w.polls), (2, 2, 1));
        let cmds = ring(&iommu, before, before + 1);
        assert_eq!(
            cmds[0],
            Command::InvalidateIommuPages {
                pasid: 0,
                domain_id: 2,
                pde: true,
                gn: false,
                address: InvAddress::ALL
            }
        );
        let mut w = WorkRecord::new();
        assert!(iommu.translate(DEV, at, Access::Read, &mut w).is_err());
        assert_eq!(w.iotlb_stale_hits, 0);
    }

    #[test]
    fn a_range_crossing_a_power_of_two_boundary_flushes_the_covering_block() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 3, DomainMode::Strict);
        // Fill the IOTLB with translations at 0x0, 0x1f_f000 and 0x40_0000 through the
        // table directly (the DMA layer's allocator would choose its own IOVAs).
        let tag = iolab_iommu::iotlb::Asid(3);
        {
            let mut c = iommu.caches();
            for iova in [0u64, 0x1f_f000, 0x20_0000, 0x40_0000] {
                c.iotlb
                    .insert(tag, Iova::new(iova), PhysAddr::new(iova), SZ_4K, Prot::READ)
                    .unwrap();
            }
        }
        let inv = d.invalidator();
        let before = slot(&iommu);
        let mut w = WorkRecord::new();
        // Two pages straddling 2 MiB: [0x1f_f000, 0x20_1000).
        let range = GatherRange {
            start: Iova::new(0x1f_f000),
            size: 2 * SZ_4K,
            page_size: SZ_4K,
        };
        inv.invalidate_range(DomainId(3), &range, &mut w);
        inv.sync(&mut w);
        assert_eq!(
            (w.commands_written, w.inval_ranges, w.inval_pages),
            (2, 1, 2)
        );
        // 0x1f_f000 ^ 0x20_0fff = 0x3f_ffff: the 4 MiB block at 0, S set.
        assert_eq!(
            ring(&iommu, before, before + 1)[0],
            Command::InvalidateIommuPages {
                pasid: 0,
                domain_id: 3,
                pde: true,
                gn: false,
                address: InvAddress {
                    addr: 0x1f_f000,
                    s: true
                }
            }
        );
        let c = iommu.caches();
        assert!(
            c.iotlb.probe(tag, Iova::new(0)).is_none(),
            "inside the block"
        );
        assert!(c.iotlb.probe(tag, Iova::new(0x20_0000)).is_none());
        assert!(
            c.iotlb.probe(tag, Iova::new(0x40_0000)).is_some(),
            "outside it"
        );
        assert_eq!(inv.errors(), 0);
    }

    #[test]
    fn disjoint_ranges_merge_into_one_over_flush() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 4, DomainMode::Strict);
        let inv = d.invalidator();
        let before = slot(&iommu);
        let mut w = WorkRecord::new();
        for start in [0x1000u64, 0x9000] {
            let r = GatherRange {
                start: Iova::new(start),
                size: SZ_4K,
                page_size: SZ_4K,
            };
            inv.invalidate_range(DomainId(4), &r, &mut w);
        }
        inv.sync(&mut w);
        // [0x1000, 0xa000): one command for the 64 KiB block at 0, one wait.
        assert_eq!((w.commands_written, w.inval_syncs), (2, 1));
        let cmd = ring(&iommu, before, before + 1)[0];
        assert_eq!(cmd, Command::invalidate_pages(4, 0x1000, 0x9000));
        let Command::InvalidateIommuPages { address, .. } = cmd else {
            unreachable!()
        };
        assert_eq!(
            address.span(),
            iolab_iommu::amdvi::InvSpan::Range {
                start: 0,
                size: 0x1_0000
            }
        );
        // Nothing pending: a sync issues nothing.
        let mut w = WorkRecord::new();
        inv.sync(&mut w);
        assert!(w.is_empty());
    }

    #[test]
    fn walks_resume_from_the_pde_cache_and_pde_invalidation_drops_it() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 5, DomainMode::Strict);
        let a = map(&d, 0x30_0000, SZ_4K, Direction::ToDevice);
        let b = map(&d, 0x31_0000, SZ_4K, Direction::ToDevice);
        assert_eq!(iova_of(&a).get() >> 21, iova_of(&b).get() >> 21);
        let mut w = WorkRecord::new();
        iommu
            .translate(DEV, iova_of(&a), Access::Read, &mut w)
            .unwrap();
        let cold = w.walk_reads;
        let mut w = WorkRecord::new();
        iommu
            .translate(DEV, iova_of(&b), Access::Read, &mut w)
            .unwrap();
        assert_eq!(
            (cold, w.walk_reads),
            (1 + 4, 1),
            "resumes at the level-1 table"
        );
        assert_eq!(
            iommu.caches().pde.count_asid(iolab_iommu::iotlb::Asid(5)),
            3
        );
        // Unmapping b sends PDE = 1 over b's page: the PDEs covering it go too.
        d.domain()
            .unmap_page(b, 0, 0, &mut WorkRecord::new())
            .unwrap();
        assert_eq!(
            iommu.caches().pde.count_asid(iolab_iommu::iotlb::Asid(5)),
            0
        );
        let mut w = WorkRecord::new();
        iommu
            .translate(DEV, iova_of(&a), Access::Read, &mut w)
            .unwrap();
        assert_eq!((w.iotlb_hits, w.walk_reads), (1, 0), "a's leaf entry stays");
    }

    #[test]
    fn invalidate_pages_without_pde_keeps_the_directory_cache() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 13, DomainMode::Strict);
        let m = map(&d, 0x60_0000, SZ_4K, Direction::ToDevice);
        let at = iova_of(&m);
        iommu
            .translate(DEV, at, Access::Read, &mut WorkRecord::new())
            .unwrap();
        let tag = iolab_iommu::iotlb::Asid(13);
        let counts = |iommu: &AmdVi| {
            let c = iommu.caches();
            (c.iotlb.count_asid(tag), c.pde.count_asid(tag))
        };
        assert_eq!(counts(&iommu), (1, 3));
        let cmd = Command::InvalidateIommuPages {
            pasid: 0,
            domain_id: 13,
            pde: false,
            gn: false,
            address: InvAddress::page(at.get()),
        };
        let mut w = WorkRecord::new();
        iommu.queue_command(&cmd, &mut w).unwrap();
        iommu.completion_wait(&mut w).unwrap();
        assert_eq!(counts(&iommu), (0, 3));
        // Another domain's entries are never touched; INVALIDATE_IOMMU_ALL drops everything.
        iommu
            .queue_command(&Command::InvalidateIommuAll, &mut w)
            .unwrap();
        iommu.completion_wait(&mut w).unwrap();
        assert_eq!(iommu.caches().pde.count_asid(tag), 0);
    }

    #[test]
    fn permission_faults_log_pr_pe_and_rw() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 6, DomainMode::Strict);
        let m = map(&d, 0x40_0000, SZ_4K, Direction::ToDevice);
        let at = iova_of(&m);
        iommu
            .translate(DEV, at, Access::Read, &mut WorkRecord::new())
            .unwrap();
        let f = iommu
            .translate(DEV, at, Access::Write, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, AmdViFaultReason::Permission { had: Prot::READ });
        assert!(f.event_logged);
        assert_eq!(
            iommu.drain_events(),
            vec![Event::IoPageFault {
                device_id: DEV,
                domain_id: 6,
                flags: fault_flags::PR | fault_flags::PE | fault_flags::RW,
                address: at.get()
            }]
        );
    }

    #[test]
    fn dte_states_pass_through_abort_or_are_illegal() {
        let (iommu, _) = iommu();
        let mut w = WorkRecord::new();
        // V = 0: untranslated.
        let tr = iommu
            .translate(7, Iova::new(0x1234), Access::Write, &mut w)
            .unwrap();
        assert_eq!(tr.pa, PhysAddr::new(0x1234));
        // Identity (Mode 0) with IR only: reads pass, writes fault.
        let ro = Dte {
            write: false,
            ..Dte::translated(9, 0, 0)
        };
        iommu.write_dte(8, &ro).unwrap();
        assert_eq!(
            iommu
                .translate(8, Iova::new(0x5000), Access::Read, &mut w)
                .unwrap()
                .pa,
            PhysAddr::new(0x5000)
        );
        assert!(matches!(
            iommu
                .translate(8, Iova::new(0x5000), Access::Write, &mut w)
                .unwrap_err()
                .reason,
            AmdViFaultReason::Permission { .. }
        ));
        // Mode 7 with V and TV: ILLEGAL_DEV_TABLE_ENTRY.
        iommu.write_raw_dte(9, [0xe03, 0, 0, 0]).unwrap();
        let f = iommu
            .translate(9, Iova::new(0x6000), Access::Write, &mut w)
            .unwrap_err();
        assert_eq!(f.reason, AmdViFaultReason::IllegalDte);
        // Beyond the 256-entry table.
        let f = iommu
            .translate(0x400, Iova::new(0), Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(f.reason, AmdViFaultReason::IllegalDte);
        // V without TV: aborted, not-present fault. SA suppresses its event.
        let quiet = Dte {
            valid: true,
            suppress_all: true,
            ..Dte::default()
        };
        iommu.write_dte(10, &quiet).unwrap();
        let f = iommu
            .translate(10, Iova::new(0), Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(f.reason, AmdViFaultReason::NoTranslation);
        assert!(!f.event_logged);
        let events = iommu.drain_events();
        assert_eq!(events.len(), 3);
        assert!(matches!(events[0], Event::IoPageFault { device_id: 8, .. }));
        assert_eq!(
            events[1],
            Event::IllegalDevTableEntry {
                device_id: 9,
                pasid: 0,
                flags: fault_flags::RW,
                address: 0x6000
            }
        );
        assert!(matches!(
            events[2],
            Event::IllegalDevTableEntry {
                device_id: 0x400,
                ..
            }
        ));
    }

    #[test]
    fn a_rewritten_dte_is_used_only_after_invalidate_devtab_entry() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 11, DomainMode::Strict);
        let m = map(&d, 0x50_0000, SZ_4K, Direction::ToDevice);
        let at = iova_of(&m);
        iommu
            .translate(DEV, at, Access::Read, &mut WorkRecord::new())
            .unwrap();
        // Software clears TV without flushing: the cached DTE still translates.
        let off = Dte {
            valid: true,
            ..Dte::default()
        };
        iommu.write_dte(DEV, &off).unwrap();
        assert!(iommu
            .translate(DEV, at, Access::Read, &mut WorkRecord::new())
            .is_ok());
        let mut w = WorkRecord::new();
        iommu
            .queue_command(&Command::InvalidateDevtabEntry { device_id: DEV }, &mut w)
            .unwrap();
        iommu.completion_wait(&mut w).unwrap();
        assert_eq!((w.commands_written, w.mmio_writes, w.polls), (2, 2, 1));
        let f = iommu
            .translate(DEV, at, Access::Read, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, AmdViFaultReason::NoTranslation);
    }

    #[test]
    fn an_illegal_command_stops_the_consumer_and_is_logged() {
        let (iommu, mem) = iommu();
        let mut w = WorkRecord::new();
        iommu
            .queue_command(&Command::InvalidateIommuAll, &mut w)
            .unwrap();
        // Opcode 0 is not a command.
        let bad: RawCommand = [0x0000_0000_0000_0001, 0];
        iommu.queue_raw(bad, &mut w).unwrap();
        iommu
            .queue_command(&Command::InvalidateDevtabEntry { device_id: 1 }, &mut w)
            .unwrap();
        let mut w = WorkRecord::new();
        assert!(matches!(
            iommu.completion_wait(&mut w),
            Err(AmdViError::CompletionWaitTimeout)
        ));
        assert_eq!(w.polls, 100_000, "Linux's LOOP_TIMEOUT of 1 us polls");
        assert!(!iommu.cmd_running());
        assert_eq!(iommu.cmd_head(), 16, "Head stays on the bad command");
        let stats = iommu.command_stats();
        assert_eq!((stats.inv_all, stats.illegal, stats.inv_devtab), (1, 1, 0));
        let base = iommu.config().cmd_buf_base.get();
        assert_eq!(
            iommu.drain_events(),
            vec![Event::IllegalCommand {
                cmd_addr: base + 16
            }]
        );
        // Software skips it and restarts: the rest runs in order, the store arrives.
        iommu.restart_commands();
        assert_eq!(iommu.process_commands(), 2);
        assert_eq!(iommu.command_stats().inv_devtab, 1);
        let mut sem = [0u8; 8];
        mem.read(iommu.config().sem_addr, &mut sem).unwrap();
        assert_eq!(u64::from_le_bytes(sem), 1);
    }

    #[test]
    fn a_full_ring_waits_for_the_consumer_and_keeps_order() {
        let (iommu, _) = iommu_with(AmdViConfig {
            cmd_log2: 8,
            ..AmdViConfig::default()
        });
        let mut w = WorkRecord::new();
        // 600 commands through a 256-entry ring without a completion wait.
        for i in 0..600u32 {
            let cmd = Command::InvalidateDevtabEntry {
                device_id: (i % 256) as u16,
            };
            iommu.queue_command(&cmd, &mut w).unwrap();
        }
        assert_eq!(w.commands_written, 600);
        assert_eq!(w.mmio_writes, 600);
        // The ring blocks when 0x20 bytes or less would be left: at the 254th command
        // (Head re-read, still 0; a 1 us delay in which 253 commands are consumed; Head
        // re-read) and again 253 commands later.
        assert_eq!((w.mmio_reads, w.polls), (4, 2));
        iommu.completion_wait(&mut w).unwrap();
        assert_eq!(iommu.command_stats().inv_devtab, 600);
        assert_eq!(iommu.cmd_head(), iommu.cmd_tail());
        // The ring never held more than it can: 601 commands wrapped it more than twice.
        assert_eq!(iommu.cmd_tail(), (601 * 16) % (256 * 16));
    }

    #[test]
    fn a_full_event_log_loses_events_and_flags_overflow() {
        let (iommu, _) = iommu_with(AmdViConfig {
            event_log2: 8,
            ..AmdViConfig::default()
        });
        iommu
            .write_dte(
                1,
                &Dte {
                    valid: true,
                    ..Dte::default()
                },
            )
            .unwrap();
        for i in 0..300u64 {
            let _ = iommu.translate(1, Iova::new(i << 12), Access::Read, &mut WorkRecord::new());
        }
        assert_eq!(iommu.event_log_stats(), (256, 44, true));
        assert_eq!(iommu.drain_events().len(), 256);
        assert_eq!(iommu.event_log_stats(), (256, 44, false));
    }

    #[test]
    fn large_pages_translate_through_sized_entries() {
        let (iommu, _) = iommu();
        let d = domain(&iommu, 12, DomainMode::Strict);
        // A 2 MiB buffer at a 2 MiB-aligned physical address: the allocator aligns the
        // IOVA to the size, so the table maps one 2 MiB page.
        let m = map(&d, 0x80_0000, SZ_2M, Direction::FromDevice);
        let at = iova_of(&m);
        let mut w = WorkRecord::new();
        let tr = iommu
            .translate(DEV, at.add(0x1_2345), Access::Write, &mut w)
            .unwrap();
        assert_eq!(tr.pa, PhysAddr::new(0x81_2345));
        assert_eq!(tr.page_size, SZ_2M);
        assert_eq!(
            w.walk_reads,
            1 + 3,
            "the DTE, then levels 4, 3 and the 2 MiB entry at 2"
        );
    }
}
