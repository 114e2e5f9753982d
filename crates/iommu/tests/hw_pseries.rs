//! POWER TCE windows: hypercall counts, DDW direct and dynamic, pool locks and errors.
//! Tests live in `mod hw` so `cargo test hw` runs them.

mod common;

mod hw {
    use crate::common::map_to_device;
    use iolab_iommu::addr::{Access, DmaAddr, PhysAddr, SZ_1G, SZ_4K, SZ_64K};
    use iolab_iommu::dma::{Device, Direction, DmaError, DomainId, SgEntry};
    use iolab_iommu::hw::pseries::{
        ddw_page, pool_locks, DdwConfig, DdwMode, DdwPolicy, HcallFeatures, PseriesConfig,
        PseriesError, PseriesIommu, DEFAULT_DDW_ADDR,
    };
    use iolab_iommu::hw::DmaPath;
    use iolab_iommu::iova::IovaAllocator;
    use iolab_iommu::work::{LockId, WorkRecord};

    const GIB: u64 = SZ_1G;

    fn pseries(f: impl FnOnce(&mut PseriesConfig)) -> PseriesIommu {
        let mut c = PseriesConfig::new(DomainId(4), 64 * GIB);
        f(&mut c);
        PseriesIommu::new(c).unwrap()
    }

    fn dev32() -> Device {
        Device::new(1, 32).unwrap()
    }

    fn dev64() -> Device {
        Device::new(2, 64).unwrap()
    }

    /// (hypercalls, TCEs) to map and then unmap `pages` 4 KiB pages.
    fn costs(features: HcallFeatures, pages: u64) -> ((u64, u64), (u64, u64)) {
        let p = pseries(|c| c.features = features);
        let mut map = WorkRecord::new();
        let b = map_to_device(&p, &dev32(), 0x4000_0000, pages * SZ_4K, 0, &mut map).unwrap();
        let mut unmap = WorkRecord::new();
        p.unmap_single(b, 0, 0, &mut unmap).unwrap();
        assert_eq!(p.default_mapped_bytes(), 0);
        (
            (map.hypercalls, map.tces_touched),
            (unmap.hypercalls, unmap.tces_touched),
        )
    }

    #[test]
    fn hypercalls_for_1_16_and_600_pages_with_the_indirect_call() {
        let m = HcallFeatures::MULTI_TCE;
        assert_eq!(costs(m, 1), ((1, 1), (1, 1)));
        assert_eq!(costs(m, 16), ((1, 16), (1, 16)));
        assert_eq!(costs(m, 600), ((2, 600), (2, 600)));
    }

    #[test]
    fn hypercalls_for_1_16_and_600_pages_without_the_indirect_call() {
        let s = HcallFeatures::SINGLE_TCE;
        assert_eq!(costs(s, 1), ((1, 1), (1, 1)));
        assert_eq!(costs(s, 16), ((16, 16), (16, 16)));
        assert_eq!(costs(s, 600), ((600, 600), (600, 600)));
        // Indirect map, but no H_STUFF_TCE: clears go one H_PUT_TCE(0) per TCE.
        let mixed = HcallFeatures {
            put_tce_indirect: true,
            stuff_tce: false,
        };
        assert_eq!(costs(mixed, 600), ((2, 600), (600, 600)));
    }

    #[test]
    fn hypercall_kinds_are_counted_separately() {
        let p = pseries(|_| {});
        let mut w = WorkRecord::new();
        let one = map_to_device(&p, &dev32(), 0, SZ_4K, 0, &mut w).unwrap();
        let many = map_to_device(&p, &dev32(), 0, 600 * SZ_4K, 0, &mut w).unwrap();
        p.unmap_single(one, 0, 0, &mut w).unwrap();
        p.unmap_single(many, 0, 0, &mut w).unwrap();
        let s = p.stats();
        // One page goes through H_PUT_TCE even with the indirect call (Linux's npages == 1).
        assert_eq!((s.put_tce, s.put_tce_indirect, s.stuff_tce), (1, 2, 3));
        assert_eq!((s.tces_put, s.tces_cleared), (601, 601));
        assert_eq!(w.hypercalls, 6);
    }

    #[test]
    fn pool_locks_are_counted_by_pool() {
        let p = pseries(|_| {});
        let mut w = WorkRecord::new();
        let small = map_to_device(&p, &dev32(), 0, 15 * SZ_4K, 5, &mut w).unwrap();
        assert_eq!(
            (
                w.lock_count(LockId::TcePool),
                w.lock_count(LockId::TceLargePool)
            ),
            (1, 0)
        );
        let large = map_to_device(&p, &dev32(), 0, 16 * SZ_4K, 5, &mut w).unwrap();
        assert_eq!(
            (
                w.lock_count(LockId::TcePool),
                w.lock_count(LockId::TceLargePool)
            ),
            (1, 1)
        );
        p.unmap_single(small, 5, 0, &mut w).unwrap();
        p.unmap_single(large, 5, 0, &mut w).unwrap();
        assert_eq!(pool_locks(&w), 4);
        assert_eq!(p.default_pool().nr_pools(), 4, "a 2 GB window has 4 pools");
    }

    #[test]
    fn sg_maps_issue_hypercalls_per_element_and_merge_contiguous_ones() {
        let p = pseries(|_| {});
        let dev = dev32().with_max_segment_size(1 << 20).unwrap();
        // 64 KiB elements go to the large pool, which places them back to back.
        let list: Vec<_> = (0..4)
            .map(|i| SgEntry::new(PhysAddr::new(0x100_0000 + i * 0x10_0000), SZ_64K))
            .collect();
        let mut w = WorkRecord::new();
        let m = p
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!((w.hypercalls, w.tces_touched), (4, 64));
        assert_eq!(m.segment_count(), 1);
        assert_eq!(m.segments()[0].len, 4 * SZ_64K);
        let seg = m.segments()[0];
        let r = p
            .translate(&dev, seg.dma, seg.len, Access::Read, &mut w)
            .unwrap();
        assert_eq!(r.len(), 4);
        // One clear run for the merged segment: 64 TCEs in one H_STUFF_TCE.
        let mut w = WorkRecord::new();
        p.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!((w.hypercalls, w.tces_touched), (1, 64));
        // With merging off, or the default 64 KiB segment limit, four segments.
        let off = pseries(|c| c.vmerge = false);
        let m = off
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(m.segment_count(), 4);
        off.unmap_sg(m, 0, 0, &mut w).unwrap();
        let m = p
            .map_sg(&dev32(), &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(m.segment_count(), 4);
        p.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(p.default_mapped_bytes(), 0);
    }

    #[test]
    fn ddw_direct_maps_every_io_without_hypercalls() {
        let p = pseries(|c| {
            c.memory_size = 32 * GIB;
            c.ddw = Some(DdwConfig::with_window(
                1 << 40,
                ddw_page::PS_4K | ddw_page::PS_64K,
            ));
        });
        let mut setup = WorkRecord::new();
        let info = p.enable_ddw(&mut setup).unwrap().unwrap();
        assert_eq!(info.mode, DdwMode::Direct);
        // 32 GiB in 64 KiB TCEs, 512 per H_PUT_TCE_INDIRECT, once.
        assert_eq!(setup.hypercalls, (32 * GIB / SZ_64K) / 512);
        assert_eq!(p.stats().premap_hypercalls, setup.hypercalls);
        let dev = dev64();
        let mut w = WorkRecord::new();
        let pa = PhysAddr::new(0x2_3456_7890);
        let b = p
            .map_single(&dev, pa, 3 * SZ_4K, Direction::FromDevice, 1, &mut w)
            .unwrap();
        let list = [
            SgEntry::new(PhysAddr::new(0x1000), 100),
            SgEntry::new(PhysAddr::new(0x9000), 200),
        ];
        let m = p
            .map_sg(&dev, &list, Direction::ToDevice, 1, &mut w)
            .unwrap();
        assert_eq!(m.segments()[1].dma, DmaAddr(DEFAULT_DDW_ADDR + 0x9000));
        assert!(w.is_empty(), "no per-I/O work: {w:?}");
        assert_eq!(b.dma_addr(), DmaAddr(DEFAULT_DDW_ADDR + pa.get()));
        let r = p
            .translate(&dev, b.dma_addr(), 3 * SZ_4K, Access::Write, &mut w)
            .unwrap();
        assert_eq!(r[0].pa, pa);
        assert_eq!((w.pte_reads, w.walk_reads, w.hypercalls), (0, 0, 0));
        // Beyond memory the window maps nothing.
        assert!(p
            .translate(
                &dev,
                DmaAddr(DEFAULT_DDW_ADDR + 32 * GIB),
                1,
                Access::Read,
                &mut w
            )
            .is_err());
        p.unmap_single(b, 1, 0, &mut w).unwrap();
        p.unmap_sg(m, 1, 0, &mut w).unwrap();
        assert!(w.hypercalls == 0);
        assert_eq!(p.stats().direct_maps, 2);
    }

    fn dynamic() -> PseriesIommu {
        pseries(|c| {
            c.memory_size = 512 * GIB;
            c.ddw = Some(DdwConfig::with_window(
                256 * GIB,
                ddw_page::PS_4K | ddw_page::PS_64K,
            ));
        })
    }

    #[test]
    fn ddw_dynamic_maps_64k_in_one_tce_instead_of_16() {
        let p = dynamic();
        let mut w = WorkRecord::new();
        let info = p.enable_ddw(&mut w).unwrap().unwrap();
        assert_eq!(
            (info.mode, info.size, info.page_shift),
            (DdwMode::Dynamic, 256 * GIB, 16)
        );
        let mut via_ddw = WorkRecord::new();
        let b = map_to_device(&p, &dev64(), 0x50_0000, SZ_64K, 0, &mut via_ddw).unwrap();
        assert_eq!((via_ddw.hypercalls, via_ddw.tces_touched), (1, 1));
        let mut via_default = WorkRecord::new();
        let c = map_to_device(&p, &dev32(), 0x50_0000, SZ_64K, 0, &mut via_default).unwrap();
        assert_eq!((via_default.hypercalls, via_default.tces_touched), (1, 16));
        let mut w = WorkRecord::new();
        let r = p
            .translate(&dev64(), b.dma_addr(), SZ_64K, Access::Read, &mut w)
            .unwrap();
        assert_eq!((r[0].pa, w.pte_reads), (PhysAddr::new(0x50_0000), 1));
        p.unmap_single(b, 0, 0, &mut w).unwrap();
        p.unmap_single(c, 0, 0, &mut w).unwrap();
        assert_eq!(p.live_mappings(), 0);
    }

    #[test]
    fn before_2020_a_small_ddw_falls_back_to_the_default_window() {
        let p = pseries(|c| {
            c.memory_size = 512 * GIB;
            c.ddw = Some(DdwConfig::with_window(
                256 * GIB,
                ddw_page::PS_4K | ddw_page::PS_64K,
            ));
            c.policy = DdwPolicy::DirectOnly;
        });
        let mut w = WorkRecord::new();
        assert_eq!(p.enable_ddw(&mut w), Ok(None));
        let b = map_to_device(&p, &dev64(), 0x50_0000, SZ_64K, 0, &mut w).unwrap();
        assert_eq!(w.tces_touched, 16);
        assert!(b.dma_addr().0 < 2 * GIB);
        p.unmap_single(b, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn over_large_requests_and_exhausted_windows_are_errors() {
        let p = pseries(|c| c.default_window.size = 256 * SZ_4K);
        let mut w = WorkRecord::new();
        let e = map_to_device(&p, &dev32(), 0, 256 * SZ_4K, 0, &mut w).unwrap_err();
        assert!(matches!(e, DmaError::IovaSpace { .. }), "{e}");
        let mut held = Vec::new();
        let e = loop {
            match map_to_device(&p, &dev32(), 0, 32 * SZ_4K, 0, &mut w) {
                Ok(b) => held.push(b),
                Err(e) => break e,
            }
        };
        assert!(matches!(e, DmaError::IovaSpace { .. }), "{e}");
        // A failed scatter-gather map leaves nothing behind.
        let before = p.default_mapped_bytes();
        let list = [
            SgEntry::new(PhysAddr::new(0), SZ_4K),
            SgEntry::new(PhysAddr::new(0), 64 * SZ_4K),
        ];
        assert!(p
            .map_sg(&dev32(), &list, Direction::ToDevice, 0, &mut w)
            .is_err());
        assert_eq!(p.default_mapped_bytes(), before);
        let live = held.len();
        assert_eq!(p.live_mappings(), live);
        for b in held {
            p.unmap_single(b, 0, 0, &mut w).unwrap();
        }
        assert_eq!(p.default_pool().live_blocks(), 0);
        // The mapping cap.
        let capped = pseries(|c| c.max_mappings = 1);
        let b = map_to_device(&capped, &dev32(), 0, 1, 0, &mut w).unwrap();
        assert!(matches!(
            map_to_device(&capped, &dev32(), 0, 1, 0, &mut w),
            Err(DmaError::TooManyMappings { limit: 1, .. })
        ));
        capped.unmap_single(b, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn ddw_lifecycle_errors() {
        let p = dynamic();
        let mut w = WorkRecord::new();
        assert_eq!(p.remove_ddw(&mut w), Err(PseriesError::NoDdw));
        let info = p.enable_ddw(&mut w).unwrap().unwrap();
        assert_eq!(
            p.enable_ddw(&mut w).unwrap(),
            Some(info),
            "an existing DDW is reused"
        );
        let b = map_to_device(&p, &dev64(), 0, SZ_64K, 0, &mut w).unwrap();
        assert_eq!(
            p.remove_ddw(&mut w),
            Err(PseriesError::DdwInUse { live: 1 })
        );
        p.unmap_single(b, 0, 0, &mut w).unwrap();
        let mut teardown = WorkRecord::new();
        p.remove_ddw(&mut teardown).unwrap();
        assert_eq!(teardown.hypercalls, (256 * GIB / SZ_64K).div_ceil(512));
        // A DDW placed over the default window is refused.
        let bad = pseries(|c| {
            let mut d = DdwConfig::with_window(GIB, ddw_page::PS_64K);
            d.window_addr = 0;
            c.ddw = Some(d);
        });
        assert!(matches!(
            bad.create_ddw(16, GIB, &mut w),
            Err(PseriesError::BadWindowPlace { .. })
        ));
        // No DDW offered.
        assert_eq!(
            pseries(|_| {}).query_pe_dma_window(),
            Err(PseriesError::NoDdwSupport)
        );
    }
}
