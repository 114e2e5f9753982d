//! SMMUv3 model: strict and lazy invalidation through the command queue, stale IOTLB
//! entries, the event queue, bypass STEs, both producer designs. Tests live in `mod smmuv3`
//! so `cargo test smmu` runs them.

mod smmuv3 {
    use std::sync::Arc;

    use iolab_iommu::addr::{Access, Iova, PhysAddr, SZ_4G, SZ_4K};
    use iolab_iommu::dma::{
        Device, Direction, DmaMapping, DomainConfig, DomainId, DomainMode, FlushQueueConfig,
        PhysRange,
    };
    use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use iolab_iommu::iova::IovaAllocator;
    use iolab_iommu::mem::PhysMemory;
    use iolab_iommu::pgtable::lpae::LpaeConfig;
    use iolab_iommu::smmuv3::{
        EventId, ProducerKind, SmmuDomain, SmmuFaultReason, Smmuv3, Smmuv3Config, Smmuv3Error,
    };
    use iolab_iommu::work::WorkRecord;
    use proptest::prelude::*;

    const SID: u32 = 5;
    const TEN_MS: u64 = 10_000_000;

    fn allocator() -> Arc<dyn IovaAllocator> {
        Arc::new(LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap())
    }

    fn smmu_with(kind: ProducerKind, range: bool, evtq_log2size: u32) -> Smmuv3 {
        Smmuv3::new(Smmuv3Config {
            producer: kind,
            range_invalidation: range,
            evtq_log2size,
            ..Smmuv3Config::default()
        })
        .unwrap()
    }

    fn smmu() -> Smmuv3 {
        smmu_with(ProducerKind::LockFree, true, 7)
    }

    fn domain_with(s: &Smmuv3, mode: DomainMode, asid: u16, ring: usize) -> SmmuDomain {
        let mut cfg = DomainConfig::new(DomainId(u32::from(asid)), mode);
        cfg.flush_queue = FlushQueueConfig {
            ring_size: ring,
            timeout_ns: TEN_MS,
        };
        let d = s
            .new_domain(asid, cfg, LpaeConfig::new(SZ_4K, 48, 48), allocator())
            .unwrap();
        s.attach(SID, &d, &mut WorkRecord::new()).unwrap();
        d
    }

    fn domain(s: &Smmuv3, mode: DomainMode) -> SmmuDomain {
        domain_with(s, mode, 1, 256)
    }

    fn dev() -> Device {
        Device::new(1, 64).unwrap()
    }

    fn map(d: &SmmuDomain, pa: u64, len: u64, dir: Direction) -> DmaMapping {
        d.domain()
            .map_page(
                &dev(),
                PhysAddr::new(pa),
                len,
                dir,
                0,
                &mut WorkRecord::new(),
            )
            .unwrap()
    }

    fn iova(m: &DmaMapping) -> Iova {
        Iova::new(m.dma_addr().0)
    }

    #[test]
    fn smmu_strict_unmap_faults_at_once_with_a_translation_event() {
        let s = smmu();
        let d = domain(&s, DomainMode::Strict);
        let m = map(&d, 0x10_0000, SZ_4K, Direction::Bidirectional);
        let at = iova(&m);

        let mut w = WorkRecord::new();
        let r = s.translate(SID, at, 64, Access::Read, &mut w).unwrap();
        assert_eq!(
            r,
            vec![PhysRange {
                pa: PhysAddr::new(0x10_0000),
                len: 64
            }]
        );
        assert_eq!(
            (w.iotlb_misses, w.iotlb_hits, w.walk_reads),
            (1, 0, 4),
            "cold: a 4-level walk"
        );

        let mut w = WorkRecord::new();
        s.translate(SID, at, 64, Access::Write, &mut w).unwrap();
        assert_eq!(
            (w.iotlb_misses, w.iotlb_hits, w.walk_reads),
            (0, 1, 0),
            "warm: an IOTLB hit"
        );

        let mut w = WorkRecord::new();
        d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!(w.commands_written, 2, "one TLBI and one CMD_SYNC");
        assert_eq!(w.inval_syncs, 1);
        assert!(s.cmdq().cmdq().is_idle());

        let mut w = WorkRecord::new();
        let f = s.translate(SID, at, 64, Access::Read, &mut w).unwrap_err();
        assert_eq!(f.reason, SmmuFaultReason::Translation);
        assert!(f.event_recorded);
        assert_eq!(w.iotlb_stale_hits, 0);
        let ev = s.drain_events();
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].id, ev[0].stream_id, ev[0].iova, ev[0].access),
            (EventId::Translation, SID, at, Access::Read)
        );
        assert_eq!(s.caches().lock().iotlb.count_stale(), 0);
    }

    #[test]
    fn smmu_walk_cache_resumes_below_the_root() {
        let s = smmu();
        let d = domain(&s, DomainMode::Strict);
        let a = map(&d, 0x20_0000, SZ_4K, Direction::ToDevice);
        let b = map(&d, 0x30_0000, SZ_4K, Direction::ToDevice);
        assert_eq!(
            iova(&a).get() >> 21,
            iova(&b).get() >> 21,
            "same leaf table"
        );
        let mut w = WorkRecord::new();
        s.translate(SID, iova(&a), 1, Access::Read, &mut w).unwrap();
        s.translate(SID, iova(&b), 1, Access::Read, &mut w).unwrap();
        assert_eq!(
            w.walk_reads,
            4 + 1,
            "the second walk starts at the leaf table"
        );
        assert_eq!(w.iotlb_misses, 2);
    }

    #[test]
    fn smmu_lazy_unmap_leaves_a_stale_entry_until_the_timeout_flush() {
        let s = smmu();
        let d = domain(&s, DomainMode::Lazy);
        let mem = PhysMemory::new(1 << 30).unwrap();
        mem.write(PhysAddr::new(0x40_0000), b"secret").unwrap();
        let m = map(&d, 0x40_0000, SZ_4K, Direction::ToDevice);
        let at = iova(&m);
        s.translate(SID, at, 8, Access::Read, &mut WorkRecord::new())
            .unwrap();

        let mut w = WorkRecord::new();
        d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!(
            (w.commands_written, w.flush_queue_adds),
            (0, 1),
            "queued, no TLBI yet"
        );
        assert_eq!(d.domain().mapped_bytes(), 0);

        let mut w = WorkRecord::new();
        let mut buf = [0u8; 6];
        s.dma_read(SID, &mem, at, &mut buf, &mut w).unwrap();
        assert_eq!(&buf, b"secret", "the device still reaches the old page");
        assert_eq!((w.iotlb_hits, w.iotlb_stale_hits, w.walk_reads), (1, 1, 0));

        let mut w = WorkRecord::new();
        assert!(!d.domain().poll_timeout(TEN_MS - 1, &mut w));
        assert!(d.domain().poll_timeout(TEN_MS, &mut w));
        assert_eq!(w.commands_written, 2, "TLBI_NH_ASID and CMD_SYNC");
        assert_eq!(s.sink_stats().tlbi_asid, 1);

        let mut w = WorkRecord::new();
        let f = s.dma_read(SID, &mem, at, &mut buf, &mut w).unwrap_err();
        assert_eq!(f.reason, SmmuFaultReason::Translation);
        assert_eq!((w.iotlb_stale_hits, w.iotlb_misses), (0, 1));
        assert_eq!(s.drain_events()[0].id, EventId::Translation);
    }

    #[test]
    fn smmu_lazy_full_ring_flushes_and_stale_entries_go() {
        let s = smmu();
        let d = domain_with(&s, DomainMode::Lazy, 3, 4);
        let maps: Vec<_> = (0..4)
            .map(|i| map(&d, 0x100_0000 + i * SZ_4K, SZ_4K, Direction::ToDevice))
            .collect();
        let addrs: Vec<Iova> = maps.iter().map(iova).collect();
        let mut w = WorkRecord::new();
        for &a in &addrs {
            s.translate(SID, a, 1, Access::Read, &mut w).unwrap();
        }
        let mut it = maps.into_iter();
        for m in it.by_ref().take(3) {
            d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        }
        let mut w = WorkRecord::new();
        for &a in &addrs[..3] {
            s.translate(SID, a, 1, Access::Read, &mut w).unwrap();
        }
        assert_eq!(w.iotlb_stale_hits, 3);
        // A ring of 4 slots holds 3 entries: the 4th unmap flushes first.
        let mut w = WorkRecord::new();
        d.domain()
            .unmap_page(it.next().unwrap(), 0, 0, &mut w)
            .unwrap();
        assert_eq!(w.flush_queue_flushes, 1);
        let mut w = WorkRecord::new();
        for &a in &addrs[..3] {
            assert!(s.translate(SID, a, 1, Access::Read, &mut w).is_err());
        }
        assert_eq!(w.iotlb_stale_hits, 0);
        // The 4th was cleared from the table before the flush, whose by-ASID TLBI swept its
        // entry too (its IOVA still waits for the next flush).
        assert!(s.translate(SID, addrs[3], 1, Access::Read, &mut w).is_err());
        assert_eq!(d.domain().flush_queue().unwrap().pending(), 1);
    }

    #[test]
    fn smmu_lazy_iova_is_not_reused_before_its_flush() {
        let s = smmu();
        let d = domain(&s, DomainMode::Lazy);
        let m = map(&d, 0x50_0000, SZ_4K, Direction::ToDevice);
        let old = iova(&m);
        d.domain()
            .unmap_page(m, 0, 0, &mut WorkRecord::new())
            .unwrap();
        let again = map(&d, 0x60_0000, SZ_4K, Direction::ToDevice);
        assert_ne!(
            iova(&again),
            old,
            "queued IOVA handed out again before its flush"
        );
        // The stale translation of the old IOVA still reaches the old page, not the new one.
        let r = s.translate(SID, old, 1, Access::Read, &mut WorkRecord::new());
        assert!(r.is_err() || r.unwrap()[0].pa == PhysAddr::new(0x50_0000));
        d.domain().flush_all(&mut WorkRecord::new());
        assert_eq!(d.domain().flush_queue().unwrap().pending(), 0);
    }

    #[test]
    fn smmu_range_invalidation_is_one_command_per_16_pages() {
        for (range, tlbis) in [(true, 1), (false, 16)] {
            let s = smmu_with(ProducerKind::LockFree, range, 7);
            let d = domain(&s, DomainMode::Strict);
            let m = map(&d, 0x80_0000, 16 * SZ_4K, Direction::ToDevice);
            let at = iova(&m);
            let mut w = WorkRecord::new();
            s.translate(SID, at, 16 * SZ_4K, Access::Read, &mut w)
                .unwrap();
            assert_eq!(s.caches().lock().iotlb.len(), 16);
            let mut w = WorkRecord::new();
            d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
            assert_eq!(w.commands_written, tlbis + 1, "range support {range}");
            assert_eq!((w.inval_syncs, w.inval_ranges, w.inval_pages), (1, 1, 16));
            let st = s.sink_stats();
            assert_eq!(st.tlbi_va, tlbis);
            assert_eq!(st.tlbi_va_ranges, u64::from(range));
            assert_eq!(s.caches().lock().iotlb.len(), 0);
            assert!(s
                .translate(SID, at.add(15 * SZ_4K), 1, Access::Read, &mut w)
                .is_err());
        }
    }

    /// The strict unmap path sends range commands only when the SMMU advertises
    /// `IDR3.RIL` *and* the driver uses it (Linux 5.7+): a 64 KiB unmap is one range command
    /// then, sixteen single-page ones otherwise (an SMMUv3.2 under Linux 5.4 included).
    #[test]
    fn range_commands_need_idr3_ril_and_a_driver_that_uses_it() {
        for (ril, driver, tlbis) in [(true, true, 1), (true, false, 16), (false, true, 16)] {
            let s = Smmuv3::new(Smmuv3Config {
                range_invalidation: ril,
                driver_range_invalidation: driver,
                ..Smmuv3Config::default()
            })
            .unwrap();
            assert_eq!(s.idr3() & (1 << 10) != 0, ril);
            assert_eq!(s.uses_range_invalidation(), ril && driver);
            let d = domain(&s, DomainMode::Strict);
            let m = map(&d, 0x80_0000, 16 * SZ_4K, Direction::ToDevice);
            let mut w = WorkRecord::new();
            d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
            assert_eq!(w.commands_written, tlbis + 1, "RIL {ril}, driver {driver}");
            assert_eq!(s.sink_stats().tlbi_va_ranges, u64::from(tlbis == 1));
        }
    }

    /// E2H needs both `IDR0.HYP` and the kernel at EL2 with VHE. With it the stage-1 STE
    /// says `STRW` = EL2, the entries are EL2-E2H ones, and a strict unmap's and a lazy
    /// flush's TLBIs are the EL2 forms that reach them; without it, the NH forms as before.
    #[test]
    fn smmu_e2h_domains_invalidate_with_el2_tlbis_and_others_with_nh_ones() {
        use iolab_iommu::smmuv3::spec::IDR0_HYP;
        for (hyp, host_vhe) in [(false, false), (true, false), (false, true), (true, true)] {
            let e2h = hyp && host_vhe;
            let s = Smmuv3::new(Smmuv3Config {
                hyp,
                host_vhe,
                range_invalidation: false,
                ..Smmuv3Config::default()
            })
            .unwrap();
            assert_eq!((s.idr0() & IDR0_HYP != 0, s.uses_e2h()), (hyp, e2h));
            let d = domain(&s, DomainMode::Strict);
            // STRTAB_STE_1_STRW_EL2 (2) in GENMASK_ULL(31, 30), or NSEL1 (0).
            let strw = if e2h { 2u64 << 30 } else { 0 };
            assert_eq!(s.ste(SID).unwrap().encode_word1(), strw);
            let m = map(&d, 0x10_0000, 2 * SZ_4K, Direction::Bidirectional);
            let at = iova(&m);
            s.translate(SID, at, 2 * SZ_4K, Access::Read, &mut WorkRecord::new())
                .unwrap();
            let before = s.sink_stats();
            d.domain()
                .unmap_page(m, 0, 0, &mut WorkRecord::new())
                .unwrap();
            let st = s.sink_stats();
            // Two single-page TLBIs, EL2 ones with E2H.
            assert_eq!(st.tlbi_va - before.tlbi_va, 2);
            assert_eq!(st.tlbi_el2 - before.tlbi_el2, if e2h { 2 } else { 0 });
            assert_eq!(
                st.iotlb_removed - before.iotlb_removed,
                2,
                "the TLBIs reached"
            );
            let f = s
                .translate(SID, at, 64, Access::Read, &mut WorkRecord::new())
                .unwrap_err();
            assert_eq!(f.reason, SmmuFaultReason::Translation);
            assert_eq!(s.caches().lock().iotlb.count_stale(), 0);
        }
        // Lazy: the flush is one CMD_TLBI_EL2_ASID, and it removes the stale entry.
        let s = Smmuv3::new(Smmuv3Config {
            hyp: true,
            host_vhe: true,
            ..Smmuv3Config::default()
        })
        .unwrap();
        let d = domain(&s, DomainMode::Lazy);
        let m = map(&d, 0x10_0000, SZ_4K, Direction::Bidirectional);
        let at = iova(&m);
        s.translate(SID, at, 64, Access::Read, &mut WorkRecord::new())
            .unwrap();
        d.domain()
            .unmap_page(m, 0, 0, &mut WorkRecord::new())
            .unwrap();
        assert!(s
            .translate(SID, at, 64, Access::Read, &mut WorkRecord::new())
            .is_ok());
        assert!(d.domain().poll_timeout(TEN_MS, &mut WorkRecord::new()));
        let st = s.sink_stats();
        assert_eq!((st.tlbi_asid, st.tlbi_el2), (1, 1));
        assert!(s
            .translate(SID, at, 64, Access::Read, &mut WorkRecord::new())
            .is_err());
    }

    #[test]
    fn smmu_permission_fault_records_f_permission() {
        let s = smmu();
        let d = domain(&s, DomainMode::Strict);
        let m = map(&d, 0x90_0000, SZ_4K, Direction::ToDevice);
        let mut w = WorkRecord::new();
        s.translate(SID, iova(&m), 4, Access::Read, &mut w).unwrap();
        let f = s
            .translate(SID, iova(&m).add(8), 4, Access::Write, &mut w)
            .unwrap_err();
        assert!(matches!(f.reason, SmmuFaultReason::Permission { .. }));
        let ev = s.drain_events();
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].id, ev[0].access, ev[0].iova),
            (EventId::Permission, Access::Write, iova(&m).add(8))
        );
        assert_eq!(ev[0].id.raw(), 0x13);
    }

    #[test]
    fn smmu_event_queue_overflow_is_recorded_without_growth() {
        let s = smmu_with(ProducerKind::LockFree, true, 2);
        let _d = domain(&s, DomainMode::Strict);
        let mut w = WorkRecord::new();
        for i in 0..10u64 {
            let f = s
                .translate(SID, Iova::new(i * SZ_4K), 1, Access::Read, &mut w)
                .unwrap_err();
            assert_eq!(f.event_recorded, i < 4);
        }
        s.with_events(|q| {
            assert_eq!((q.len(), q.capacity(), q.written(), q.lost()), (4, 4, 4, 6));
            assert!(q.overflow_pending());
            q.ack_overflow();
        });
        assert_eq!(s.drain_events().len(), 4);
        assert!(!s.with_events(|q| q.overflow_pending()));
    }

    #[test]
    fn smmu_bypass_ste_reaches_the_physical_address_without_a_walk() {
        let s = smmu();
        let mut w = WorkRecord::new();
        s.attach_bypass(7, &mut w).unwrap();
        assert_eq!(s.sink_stats().cfgi, 1);
        let mut w = WorkRecord::new();
        let r = s
            .translate(7, Iova::new(0x1234_5678), 3 * SZ_4K, Access::Write, &mut w)
            .unwrap();
        assert_eq!(
            r,
            vec![PhysRange {
                pa: PhysAddr::new(0x1234_5678),
                len: 3 * SZ_4K
            }]
        );
        assert_eq!(
            (w.walk_reads, w.iotlb_hits, w.iotlb_misses, w.translations),
            (0, 0, 0, 1)
        );
    }

    #[test]
    fn smmu_bad_stream_bad_ste_and_abort() {
        let s = smmu();
        let mut w = WorkRecord::new();
        let f = s
            .translate(3, Iova::new(0), 1, Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(
            (f.reason, f.event_recorded),
            (SmmuFaultReason::BadSte, true)
        );
        let f = s
            .translate(100_000, Iova::new(0), 1, Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(f.reason, SmmuFaultReason::BadStreamId);
        s.attach_abort(3, &mut w).unwrap();
        let f = s
            .translate(3, Iova::new(0), 1, Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(
            (f.reason, f.event_recorded),
            (SmmuFaultReason::Aborted, false)
        );
        let ids: Vec<EventId> = s.drain_events().iter().map(|e| e.id).collect();
        assert_eq!(ids, [EventId::BadSte, EventId::BadStreamId]);
        assert!(matches!(
            s.attach_bypass(1 << 20, &mut w),
            Err(Smmuv3Error::BadStreamId { .. })
        ));
    }

    #[test]
    fn smmu_asids_are_unique_and_domains_stay_with_their_smmu() {
        let s = smmu();
        let _d = domain(&s, DomainMode::Strict);
        let cfg = DomainConfig::new(DomainId(9), DomainMode::Strict);
        let lpae = LpaeConfig::new(SZ_4K, 48, 48);
        assert!(matches!(
            s.new_domain(1, cfg, lpae, allocator()),
            Err(Smmuv3Error::AsidInUse { asid: 1 })
        ));
        let other = smmu();
        let foreign = other.new_domain(1, cfg, lpae, allocator()).unwrap();
        assert!(matches!(
            s.attach(2, &foreign, &mut WorkRecord::new()),
            Err(Smmuv3Error::ForeignDomain { .. })
        ));
        let cd = s.context_descriptor(0).unwrap();
        assert_eq!((cd.asid, cd.t0sz, cd.granule), (1, 16, SZ_4K));
    }

    #[test]
    fn smmu_freed_tables_are_invalidated_at_once_even_in_lazy_mode() {
        let s = smmu();
        let d = domain(&s, DomainMode::Lazy);
        // 2 MiB at a PA that is not 2 MiB aligned: 512 4 KiB pages in one leaf table, which
        // the unmap of the whole span frees.
        let m = map(&d, 0x4000_1000, 1 << 21, Direction::ToDevice);
        let at = iova(&m);
        s.translate(SID, at, 1, Access::Read, &mut WorkRecord::new())
            .unwrap();
        assert_eq!(s.caches().lock().walk.level_len(2), 1);
        let pages_before = d.domain().table_pages();
        let mut w = WorkRecord::new();
        d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!(d.domain().table_pages(), pages_before - 1);
        assert_eq!((w.inval_walks, w.inval_ranges, w.inval_syncs), (1, 0, 1));
        assert_eq!(
            w.commands_written, 2,
            "one non-leaf range TLBI and a sync: {w:?}"
        );
        assert_eq!(
            s.caches().lock().walk.level_len(2),
            0,
            "walk cache forgot the table"
        );
        // A non-leaf TLBI invalidates every level, leaves included: no stale entry is left.
        let mut w = WorkRecord::new();
        assert!(s.translate(SID, at, 1, Access::Read, &mut w).is_err());
        assert_eq!(w.iotlb_stale_hits, 0);
    }

    #[test]
    fn smmu_concurrent_unmap_and_device_access_leave_no_stale_entry_in_strict_mode() {
        for kind in ProducerKind::ALL {
            let s = Arc::new(smmu_with(kind, false, 4));
            let d = domain(&s, DomainMode::Strict);
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let seen = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
            let device = {
                let (s, stop, seen) = (s.clone(), stop.clone(), seen.clone());
                std::thread::spawn(move || {
                    let mut w = WorkRecord::new();
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        let addrs = seen.lock().unwrap().clone();
                        for a in addrs {
                            let _ = s.translate(SID, Iova::new(a), 1, Access::Read, &mut w);
                        }
                        std::thread::yield_now();
                    }
                    w
                })
            };
            for i in 0..200u64 {
                let m = map(
                    &d,
                    0x100_0000 + (i % 8) * SZ_4K,
                    2 * SZ_4K,
                    Direction::ToDevice,
                );
                seen.lock().unwrap().push(m.dma_addr().0);
                std::thread::yield_now();
                d.domain()
                    .unmap_page(m, 0, 0, &mut WorkRecord::new())
                    .unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
            device.join().unwrap();
            // Every unmap returned after its TLBI: nothing of the domain is left cached.
            assert_eq!(s.caches().lock().iotlb.count_stale(), 0, "{kind}");
            assert_eq!(s.caches().lock().iotlb.len(), 0, "{kind}");
        }
    }

    /// One step of a scripted single-threaded workload.
    #[derive(Clone, Debug)]
    enum Op {
        Map { pages: u64, write: bool },
        Access { which: usize, write: bool },
        Unmap { which: usize },
        Probe { which: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..20, any::<bool>()).prop_map(|(pages, write)| Op::Map { pages, write }),
            (any::<usize>(), any::<bool>()).prop_map(|(which, write)| Op::Access { which, write }),
            any::<usize>().prop_map(|which| Op::Unmap { which }),
            any::<usize>().prop_map(|which| Op::Probe { which }),
        ]
    }

    /// What one access or probe of a scripted run gave.
    type Outcome = Result<Vec<PhysRange>, SmmuFaultReason>;

    /// Runs `ops`; returns every translation outcome, the events and the work totals.
    fn run(
        kind: ProducerKind,
        mode: DomainMode,
        ops: &[Op],
    ) -> (Vec<Outcome>, Vec<EventId>, WorkRecord) {
        let s = smmu_with(kind, true, 10);
        let d = domain(&s, mode);
        let mut live: Vec<DmaMapping> = Vec::new();
        let mut gone: Vec<Iova> = Vec::new();
        let mut out = Vec::new();
        let mut w = WorkRecord::new();
        let mut next_pa = 0x1000_0000u64;
        for op in ops {
            match *op {
                Op::Map { pages, write } => {
                    let dir = if write {
                        Direction::FromDevice
                    } else {
                        Direction::ToDevice
                    };
                    let m = d
                        .domain()
                        .map_page(
                            &dev(),
                            PhysAddr::new(next_pa),
                            pages * SZ_4K,
                            dir,
                            0,
                            &mut w,
                        )
                        .unwrap();
                    next_pa += pages * SZ_4K + SZ_4K;
                    live.push(m);
                }
                Op::Access { which, write } if !live.is_empty() => {
                    let m = &live[which % live.len()];
                    let access = if write { Access::Write } else { Access::Read };
                    let r = s.translate(SID, iova(m), m.len(), access, &mut w);
                    out.push(r.map_err(|f| f.reason));
                }
                Op::Unmap { which } if !live.is_empty() => {
                    let m = live.swap_remove(which % live.len());
                    gone.push(iova(&m));
                    d.domain().unmap_page(m, 0, 0, &mut w).unwrap();
                }
                Op::Probe { which } if !gone.is_empty() => {
                    let r = s.translate(SID, gone[which % gone.len()], 1, Access::Read, &mut w);
                    out.push(r.map_err(|f| f.reason));
                }
                _ => {}
            }
        }
        let events = s.drain_events().iter().map(|e| e.id).collect();
        (out, events, w)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn smmu_strict_never_counts_a_stale_hit(ops in proptest::collection::vec(op(), 1..60)) {
            let (results, events, w) = run(ProducerKind::LockFree, DomainMode::Strict, &ops);
            prop_assert_eq!(w.iotlb_stale_hits, 0);
            let faults = results.iter().filter(|r| r.is_err()).count();
            prop_assert_eq!(events.len(), faults);
        }

        #[test]
        fn smmu_both_producers_give_identical_results(
            ops in proptest::collection::vec(op(), 1..60),
            lazy in any::<bool>(),
        ) {
            let mode = if lazy { DomainMode::Lazy } else { DomainMode::Strict };
            let (ra, ea, wa) = run(ProducerKind::Spinlock, mode, &ops);
            let (rb, eb, wb) = run(ProducerKind::LockFree, mode, &ops);
            prop_assert_eq!(ra, rb);
            prop_assert_eq!(ea, eb);
            prop_assert_eq!(wa.commands_written, wb.commands_written);
            prop_assert_eq!(wa.inval_syncs, wb.inval_syncs);
            prop_assert_eq!(
                (wa.iotlb_hits, wa.iotlb_misses, wa.iotlb_stale_hits, wa.walk_reads),
                (wb.iotlb_hits, wb.iotlb_misses, wb.iotlb_stale_hits, wb.walk_reads)
            );
        }
    }
}
