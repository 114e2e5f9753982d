//! Renesas IPMMU-VMSA: one whole-context flush per unmap, cache cleans for a non-coherent
//! walker, strict mode only, a 32-bit IOVA space. Tests live in `mod hw` so `cargo test hw`
//! runs them.

mod hw {
    use std::sync::Arc;

    use iolab_iommu::addr::{Access, Iova, PhysAddr, Prot, SZ_2M, SZ_4G, SZ_4K, SZ_64K};
    use iolab_iommu::dma::{
        Device, Direction, Domain, DomainConfig, DomainId, DomainMode, FlushQueueConfig, SgEntry,
    };
    use iolab_iommu::hw::ipmmu::{
        ipmmu_domain, IpmmuError, IpmmuFlushConfig, IpmmuInvalidator, IpmmuPageTable,
        IpmmuTableConfig,
    };
    use iolab_iommu::hw::DmaPath;
    use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use iolab_iommu::iova::IovaAllocator;
    use iolab_iommu::pgtable::{IoPageTable, PgTableError};
    use iolab_iommu::work::WorkRecord;

    fn allocator() -> Arc<dyn IovaAllocator> {
        Arc::new(LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap())
    }

    fn setup(polls: u32) -> (Domain, Arc<IpmmuInvalidator>) {
        let inv = Arc::new(
            IpmmuInvalidator::new(IpmmuFlushConfig {
                polls_per_flush: polls,
                cache_ipmmu: false,
                ..Default::default()
            })
            .unwrap(),
        );
        let cfg = DomainConfig::new(DomainId(2), DomainMode::Strict);
        (ipmmu_domain(cfg, allocator(), inv.clone()).unwrap(), inv)
    }

    #[test]
    fn every_unmap_is_exactly_one_flush() {
        let (d, inv) = setup(5);
        let dev = Device::new(1, 32).unwrap();
        let mut maps = Vec::new();
        let mut w = WorkRecord::new();
        for i in 0..20u64 {
            maps.push(
                d.map_page(
                    &dev,
                    PhysAddr::new(i * SZ_64K),
                    (i + 1) * SZ_4K,
                    Direction::ToDevice,
                    0,
                    &mut w,
                )
                .unwrap(),
            );
        }
        assert_eq!((w.mmio_writes, w.polls, w.inval_domains), (0, 0, 0));
        for (n, m) in maps.into_iter().enumerate() {
            let mut w = WorkRecord::new();
            d.unmap_page(m, 0, 0, &mut w).unwrap();
            assert_eq!(w.inval_domains, 1, "unmap {n}");
            assert_eq!(
                (w.mmio_writes, w.mmio_reads, w.polls),
                (1, 6, 5),
                "unmap {n}"
            );
        }
        assert_eq!(inv.stats().flushes, 20);
        // Scatter-gather unmaps are one flush too.
        let list: Vec<_> = (0..8)
            .map(|i| SgEntry::new(PhysAddr::new(0x100_0000 + i * SZ_2M), SZ_4K))
            .collect();
        let mut w = WorkRecord::new();
        let sg = d
            .map_sg(&dev, &list, Direction::FromDevice, 0, &mut w)
            .unwrap();
        assert_eq!(
            sg.segments().len(),
            1,
            "dma-iommu merges the pages into one segment"
        );
        let mut w = WorkRecord::new();
        d.unmap_sg(sg, 0, 0, &mut w).unwrap();
        assert_eq!((w.inval_domains, w.mmio_writes), (1, 1));
    }

    #[test]
    fn the_lab_can_change_the_polls() {
        let (d, inv) = setup(1);
        inv.set_polls_per_flush(40).unwrap();
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let m = d
            .map_page(
                &dev,
                PhysAddr::new(0),
                SZ_4K,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
        let mut w = WorkRecord::new();
        d.unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!((w.polls, w.mmio_reads), (40, 41));
    }

    #[test]
    fn cache_cleans_are_counted_for_pte_writes() {
        let (d, _) = setup(1);
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let a = d
            .map_page(
                &dev,
                PhysAddr::new(0x10_0000),
                SZ_4K,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
        // Two new tables linked in (a line per descriptor) and one leaf line.
        assert_eq!((w.tables_allocated, w.cache_cleans), (2, 3));
        let mut w = WorkRecord::new();
        let b = d
            .map_page(
                &dev,
                PhysAddr::new(0x20_0000),
                16 * SZ_4K,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert_eq!(w.tables_allocated, 0);
        assert!(
            (2..=3).contains(&w.cache_cleans),
            "16 PTEs span 2 or 3 lines: {}",
            w.cache_cleans
        );
        let mut w = WorkRecord::new();
        d.unmap_page(b, 0, 0, &mut w).unwrap();
        assert!((2..=3).contains(&w.cache_cleans));
        d.unmap_page(a, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn lazy_mode_is_rejected() {
        let inv = Arc::new(IpmmuInvalidator::new(IpmmuFlushConfig::default()).unwrap());
        let mut cfg = DomainConfig::new(DomainId(2), DomainMode::Lazy);
        cfg.flush_queue = FlushQueueConfig::default();
        let e = ipmmu_domain(cfg, allocator(), inv).unwrap_err();
        assert_eq!(e, IpmmuError::LazyMode);
        assert_eq!(e.to_string(), "IPMMU-VMSA has no lazy mode");
    }

    #[test]
    fn no_mapping_above_4g_iova() {
        let mut t = IpmmuPageTable::new(IpmmuTableConfig::default()).unwrap();
        let mut w = WorkRecord::new();
        let e = t
            .map(
                Iova::new(SZ_4G),
                PhysAddr::new(0),
                SZ_4K,
                Prot::READ,
                &mut w,
            )
            .unwrap_err();
        assert!(matches!(e, PgTableError::OutOfRange { .. }));
        let e = t
            .map(
                Iova::new(SZ_4G - SZ_4K),
                PhysAddr::new(0),
                2 * SZ_4K,
                Prot::READ,
                &mut w,
            )
            .unwrap_err();
        assert!(matches!(e, PgTableError::OutOfRange { .. }));
        assert_eq!(t.lpae().levels(), 3);
        // Through a domain: every IOVA a device gets is below 4 GiB, even for a 64-bit device.
        let (d, _) = setup(1);
        let dev = Device::new(1, 64).unwrap();
        let mut maps = Vec::new();
        for i in 0..32u64 {
            let m = d
                .map_page(
                    &dev,
                    PhysAddr::new(1 << 36),
                    SZ_2M + i * SZ_4K,
                    Direction::ToDevice,
                    0,
                    &mut w,
                )
                .unwrap();
            assert!(m.dma_addr().0 + m.len() <= SZ_4G);
            maps.push(m);
        }
        for m in maps {
            d.unmap_page(m, 0, 0, &mut w).unwrap();
        }
        assert_eq!(d.mapped_bytes(), 0);
        assert!(d.table_pages() > 1, "emptied tables stay, as in Linux");
    }

    #[test]
    fn the_domain_works_through_dmapath() {
        let (d, inv) = setup(2);
        let path: &dyn DmaPath = &d;
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let b = path
            .map_single(
                &dev,
                PhysAddr::new(0x1234_5678),
                100,
                Direction::Bidirectional,
                0,
                &mut w,
            )
            .unwrap();
        let r = path
            .translate(&dev, b.dma_addr(), 100, Access::Write, &mut w)
            .unwrap();
        assert_eq!(r[0].pa, PhysAddr::new(0x1234_5678));
        assert!(w.pte_reads > 0, "a translated access walks the table");
        path.unmap_single(b, 0, 0, &mut w).unwrap();
        assert_eq!(inv.stats().flushes, 1);
    }
}
