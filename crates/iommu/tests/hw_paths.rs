//! Every platform behind one `DmaPath`: untranslated paths (passthrough, SBA bypass, direct
//! DDW) reach the physical address with no table walk; translated paths round-trip; all of
//! them are safe to share between threads. Tests live in `mod hw` so `cargo test hw` runs
//! them.

mod common;

mod hw {
    use crate::common::map_to_device;
    use std::sync::Arc;
    use std::thread;

    use iolab_iommu::addr::{Access, DmaAddr, Iova, PhysAddr, SZ_1G, SZ_4G, SZ_4K};
    use iolab_iommu::dma::{
        Device, Direction, DmaError, Domain, DomainConfig, DomainId, DomainMode, PhysRange, SgEntry,
    };
    use iolab_iommu::hw::ipmmu::{ipmmu_domain, IpmmuFlushConfig, IpmmuInvalidator};
    use iolab_iommu::hw::pseries::{
        ddw_page, DdwConfig, PseriesConfig, PseriesIommu, DEFAULT_DDW_ADDR,
    };
    use iolab_iommu::hw::sba::{SbaIommu, SbaIommuConfig};
    use iolab_iommu::hw::DmaPath;
    use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use iolab_iommu::work::WorkRecord;

    fn passthrough() -> Domain {
        Domain::direct(DomainConfig::new(DomainId(1), DomainMode::Identity)).unwrap()
    }

    fn sba() -> SbaIommu {
        SbaIommu::new(SbaIommuConfig::new(DomainId(2), SZ_1G, SZ_1G, SZ_4K)).unwrap()
    }

    fn direct_ddw() -> PseriesIommu {
        let mut c = PseriesConfig::new(DomainId(3), 64 * SZ_1G);
        c.ddw = Some(DdwConfig::with_window(
            1 << 42,
            ddw_page::PS_4K | ddw_page::PS_64K,
        ));
        let p = PseriesIommu::new(c).unwrap();
        p.enable_ddw(&mut WorkRecord::new()).unwrap().unwrap();
        p
    }

    fn ipmmu() -> Domain {
        let inv = Arc::new(IpmmuInvalidator::new(IpmmuFlushConfig::default()).unwrap());
        let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap();
        let mut cfg = DomainConfig::new(DomainId(4), DomainMode::Strict);
        cfg.cpus = 4;
        ipmmu_domain(cfg, Arc::new(alloc), inv).unwrap()
    }

    #[test]
    fn untranslated_paths_reach_the_physical_address_without_a_walk() {
        let dev = Device::new(7, 64).unwrap();
        let cases: Vec<(Box<dyn DmaPath>, u64)> = vec![
            (Box::new(passthrough()), 0),
            (Box::new(sba()), 0),
            (Box::new(direct_ddw()), DEFAULT_DDW_ADDR),
        ];
        for (path, offset) in cases {
            let pa = PhysAddr::new(0x5_4321_0123);
            let mut w = WorkRecord::new();
            let b = path
                .map_single(&dev, pa, 3 * SZ_4K, Direction::ToDevice, 0, &mut w)
                .unwrap();
            assert_eq!(
                b.dma_addr(),
                DmaAddr(pa.get() + offset),
                "{}",
                path.platform()
            );
            assert_eq!(
                (w.ptes_written, w.hypercalls),
                (0, 0),
                "{}",
                path.platform()
            );
            let r = path
                .translate(&dev, b.dma_addr(), 3 * SZ_4K, Access::Read, &mut w)
                .unwrap();
            assert_eq!(
                r,
                vec![PhysRange { pa, len: 3 * SZ_4K }],
                "{}",
                path.platform()
            );
            assert_eq!(
                (w.pte_reads, w.walk_reads),
                (0, 0),
                "{}: {w:?}",
                path.platform()
            );
            path.unmap_single(b, 0, 0, &mut w).unwrap();
            assert_eq!(
                (w.ptes_cleared, w.hypercalls, w.purges),
                (0, 0, 0),
                "{}",
                path.platform()
            );
        }
    }

    #[test]
    fn handles_are_refused_by_other_paths() {
        let a = sba();
        let b = direct_ddw();
        let c = passthrough();
        let dev = Device::new(7, 64).unwrap();
        let mut w = WorkRecord::new();
        let h = map_to_device(&a, &dev, 0x1000, 1, 0, &mut w).unwrap();
        let back = b.unmap_single(h, 0, 0, &mut w).unwrap_err();
        assert!(matches!(back.error, DmaError::WrongDomain { .. }));
        let back = c.unmap_single(back.handle, 0, 0, &mut w).unwrap_err();
        a.unmap_single(back.handle, 0, 0, &mut w).unwrap();
        let list = [SgEntry::new(PhysAddr::new(0x1000), 8)];
        let sg = b
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        let back = a.unmap_sg(sg, 0, 0, &mut w).unwrap_err();
        assert!(matches!(back.error, DmaError::WrongDomain { .. }));
        b.unmap_sg(back.handle, 0, 0, &mut w).unwrap();
    }

    /// Four threads map, touch and unmap through one shared path; afterwards nothing is left.
    fn hammer(path: Arc<dyn DmaPath>, dev: Device) {
        let threads: Vec<_> = (0..4)
            .map(|cpu| {
                let path = path.clone();
                let dev = dev.clone();
                thread::spawn(move || {
                    let mut w = WorkRecord::new();
                    for i in 0..200u64 {
                        let pa = PhysAddr::new(0x1_0000_0000 + (cpu as u64 * 1000 + i) * 0x3000);
                        let len = 1 + (i * 977) % (6 * SZ_4K);
                        let b = path
                            .map_single(&dev, pa, len, Direction::Bidirectional, cpu, &mut w)
                            .unwrap();
                        let r = path
                            .translate(&dev, b.dma_addr(), len, Access::Write, &mut w)
                            .unwrap();
                        assert_eq!(r, vec![PhysRange { pa, len }]);
                        let list = [
                            SgEntry::new(pa, SZ_4K),
                            SgEntry::new(PhysAddr::new(pa.get() + 0x10_0000), 100),
                        ];
                        let sg = path
                            .map_sg(&dev, &list, Direction::ToDevice, cpu, &mut w)
                            .unwrap();
                        path.unmap_sg(sg, cpu, 0, &mut w).unwrap();
                        path.unmap_single(b, cpu, 0, &mut w).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn paths_are_safe_to_share_between_threads() {
        let dev32 = Device::new(1, 32).unwrap();
        let s = Arc::new(sba());
        hammer(s.clone(), dev32.clone());
        s.purge_all(&mut WorkRecord::new());
        assert_eq!((s.live_mappings(), s.pdir_entries_in_use()), (0, 0));
        let p = Arc::new(PseriesIommu::new(PseriesConfig::new(DomainId(5), 64 * SZ_1G)).unwrap());
        hammer(p.clone(), dev32.clone());
        assert_eq!((p.live_mappings(), p.default_mapped_bytes()), (0, 0));
        let d = Arc::new(ipmmu());
        hammer(d.clone(), dev32);
        assert_eq!((d.live_mappings(), d.mapped_bytes()), (0, 0));
    }
}
