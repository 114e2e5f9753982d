//! VT-d model: translation through root/context tables and the second-stage walk, the
//! caches, fault recording, the invalidation queue (in-order consumption, PSI masks, IH,
//! IQE), the Linux strict path and Caching Mode. Tests live in `mod vtd` so `cargo test vtd`
//! runs them.

mod vtd {
    use std::sync::Arc;

    use iolab_iommu::addr::{Access, Iova, PhysAddr, SZ_2M, SZ_4G, SZ_4K};
    use iolab_iommu::dma::{Device, Direction, DmaMapping, DomainConfig, DomainId, DomainMode};
    use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use iolab_iommu::iova::IovaAllocator;
    use iolab_iommu::mem::{PhysAllocator, PhysMemory};
    use iolab_iommu::vtd::spec::{
        fsts, reason, Cap, CcGranularity, FaultRecord, InvDesc, IotlbGranularity,
    };
    use iolab_iommu::vtd::{
        iotlb_flush_desc, psi_mask, Dmar, DmarConfig, DmarDomain, NonLeafPsiScope, QiError,
    };
    use iolab_iommu::work::{LockId, WorkRecord};

    /// Bus 1, device 2, function 0.
    const SID: u16 = 0x0110;
    const DID: u16 = 5;

    fn allocator() -> Arc<dyn IovaAllocator> {
        Arc::new(LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap())
    }

    fn unit(config: DmarConfig) -> Arc<Dmar> {
        let mem = Arc::new(PhysMemory::new(256 << 20).unwrap());
        // Unit structures and tables live above 128 MiB; buffers below.
        let alloc =
            PhysAllocator::new(mem, PhysAddr::new(128 << 20), PhysAddr::new(256 << 20)).unwrap();
        Dmar::new(config, Arc::new(alloc)).unwrap()
    }

    fn domain(d: &Arc<Dmar>, mode: DomainMode) -> DmarDomain {
        let dom = d
            .new_domain(DID, DomainConfig::new(DomainId(1), mode), allocator())
            .unwrap();
        d.attach(SID, &dom, &mut WorkRecord::new()).unwrap();
        dom
    }

    fn dev() -> Device {
        Device::new(1, 64).unwrap()
    }

    fn map(d: &DmarDomain, pa: u64, len: u64, dir: Direction) -> DmaMapping {
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
    fn vtd_translation_walks_context_then_four_levels_then_hits() {
        let d = unit(DmarConfig::cascade_lake());
        assert_eq!(d.levels(), 4);
        let dom = domain(&d, DomainMode::Strict);
        let m = map(&dom, 0x12_3000, SZ_4K, Direction::Bidirectional);
        let at = iova(&m).add(0x10);

        let mut w = WorkRecord::new();
        let t = d.translate(SID, at, Access::Read, &mut w).unwrap();
        assert_eq!(t.pa, PhysAddr::new(0x12_3010));
        assert!(!t.iotlb_hit);
        // Root + context entries, then PML4, PDPT, PD, PT.
        assert_eq!(w.walk_reads, 6);
        assert_eq!((w.iotlb_misses, w.translations), (1, 1));

        let mut w = WorkRecord::new();
        let t = d.translate(SID, at, Access::Write, &mut w).unwrap();
        assert!(t.iotlb_hit);
        assert_eq!((w.walk_reads, w.iotlb_hits), (0, 1));
        assert_eq!(d.stats().context_hits, 1);
        assert_eq!(d.stats().context_misses, 1);

        // A neighbouring page in the same 2 MiB: IOTLB miss, one read (the PD entry cached).
        let m2 = map(&dom, 0x45_6000, SZ_4K, Direction::ToDevice);
        let mut w = WorkRecord::new();
        d.translate(SID, iova(&m2), Access::Read, &mut w).unwrap();
        assert_eq!(w.walk_reads, 1);
        assert_eq!(d.pscache_count(DID), 3);
    }

    #[test]
    fn vtd_strict_unmap_leaves_no_stale_iotlb_entry() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = domain(&d, DomainMode::Strict);
        let m = map(&dom, 0x12_3000, SZ_4K, Direction::FromDevice);
        let at = iova(&m);
        d.translate(SID, at, Access::Write, &mut WorkRecord::new())
            .unwrap();
        assert!(d.iotlb_probe(DID, at).is_some());

        let mut w = WorkRecord::new();
        dom.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!(d.iotlb_probe(DID, at), None);
        assert_eq!(d.iotlb_stale(), 0);
        // One PSI (AM 0: one page) and one wait, published with one tail write, one poll
        // with its FSTS read, q_lock taken twice (again after the poll), cache_lock once.
        assert_eq!(w.commands_written, 2);
        assert_eq!(w.mmio_writes, 1);
        assert_eq!((w.polls, w.mmio_reads), (1, 1));
        assert_eq!(w.lock_count(LockId::CmdqLock), 2);
        assert_eq!(w.lock_count(LockId::Other), 1);
        assert_eq!(w.inval_syncs, 1);
        let s = d.stats();
        assert_eq!((s.psi, s.dsi, s.descriptors[3]), (1, 0, 1));
        assert_eq!(d.qi_free_slots(), d.config().qi_entries);

        // The device now faults: reason 6 (read not set) recorded in register 0.
        let f = d
            .translate(SID, at, Access::Read, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::PTE_NO_READ);
        assert!(f.recorded);
        let rec = FaultRecord::decode(d.fault_record(0).unwrap()).unwrap();
        assert_eq!((rec.sid, rec.addr, rec.read), (SID, at.get(), true));
        assert_eq!(d.fsts() & fsts::PPF, fsts::PPF);
    }

    #[test]
    fn vtd_lazy_unmap_is_stale_until_the_domain_flush() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = domain(&d, DomainMode::Lazy);
        let m = map(&dom, 0x12_3000, SZ_4K, Direction::ToDevice);
        let at = iova(&m);
        d.translate(SID, at, Access::Read, &mut WorkRecord::new())
            .unwrap();
        let mut w = WorkRecord::new();
        dom.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!(w.commands_written, 0);
        assert_eq!(d.iotlb_stale(), 1);
        let mut w = WorkRecord::new();
        let t = d.translate(SID, at, Access::Read, &mut w).unwrap();
        assert!(t.stale);
        assert_eq!(w.iotlb_stale_hits, 1);

        let mut w = WorkRecord::new();
        dom.domain().flush_all(&mut w);
        // One domain-selective invalidation and a wait.
        assert_eq!(w.commands_written, 2);
        assert_eq!(d.stats().dsi, 1);
        assert_eq!(d.iotlb_count(DID), 0);
        assert!(d.translate(SID, at, Access::Read, &mut w).is_err());
    }

    #[test]
    fn vtd_psi_mask_matches_hand_worked_cases() {
        // One page.
        assert_eq!(psi_mask(0x1000, 0x1FFF), (0x1000, 0));
        // Four aligned pages at PFN 4.
        assert_eq!(psi_mask(0x4000, 0x7FFF), (0x4000, 2));
        // PFNs 5..=7: rounded to 4 pages, not aligned; shared bits above bit 1 start at 2.
        assert_eq!(psi_mask(0x5000, 0x7FFF), (0x4000, 2));
        // PFNs 3..=4 straddle 4: the smallest aligned block holding both is PFNs 0..=7.
        assert_eq!(psi_mask(0x3000, 0x4FFF), (0, 3));
        // X86.md §2.4: PFNs 0x1FFF..=0x2000 → mask 14, 64 MiB from 0.
        assert_eq!(psi_mask(0x1FF_F000, 0x200_0FFF), (0, 14));
        // A sub-page range still covers its page.
        assert_eq!(psi_mask(0x1_2345, 0x1_2346), (0x1_2000, 0));
        // 2 MiB aligned.
        assert_eq!(psi_mask(0x20_0000, 0x3F_FFFF), (0x20_0000, 9));

        let cap = Cap(0x08d2_078c_106f_0466); // MAMV 18, PSI, DRD, DWD.
        let psi = iotlb_flush_desc(cap, 3, 0x4000, 0x7FFF, false);
        assert_eq!(
            psi,
            InvDesc::Iotlb {
                granularity: IotlbGranularity::Page {
                    did: 3,
                    addr: 0x4000,
                    am: 2,
                    ih: false
                },
                drain_reads: true,
                drain_writes: true,
            }
        );
        // 2^19 pages exceed MAMV 18: domain-selective.
        let big = iotlb_flush_desc(cap, 3, 0, (1 << 31) - 1, false);
        assert!(matches!(
            big,
            InvDesc::Iotlb {
                granularity: IotlbGranularity::Domain { did: 3 },
                ..
            }
        ));
        // 2^18 pages fit.
        let ok = iotlb_flush_desc(cap, 3, 0, (1 << 30) - 1, false);
        assert!(matches!(
            ok,
            InvDesc::Iotlb {
                granularity: IotlbGranularity::Page { am: 18, .. },
                ..
            }
        ));
        // No PSI support: always domain-selective.
        let no_psi = Cap(cap.0 & !(1 << 39));
        assert!(matches!(
            iotlb_flush_desc(no_psi, 3, 0x1000, 0x1FFF, false),
            InvDesc::Iotlb {
                granularity: IotlbGranularity::Domain { .. },
                ..
            }
        ));
    }

    #[test]
    fn vtd_psi_drops_the_aligned_block_and_ih_keeps_the_pscache() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = domain(&d, DomainMode::Strict);
        // Eight pages in one mapping: IOVA size-aligned to 32 KiB.
        let m = map(&dom, 0x10_0000, 8 * SZ_4K, Direction::ToDevice);
        let base = iova(&m).get();
        let mut w = WorkRecord::new();
        for p in 0..8 {
            d.translate(SID, Iova::new(base + p * SZ_4K), Access::Read, &mut w)
                .unwrap();
        }
        assert_eq!(d.iotlb_count(DID), 8);
        let ps = d.pscache_count(DID);
        assert_eq!(ps, 3);
        // AM 2 at page 5: hardware ignores the low address bits, so pages 4..=7 go. IH kept
        // the paging-structure caches.
        let psi = |addr, ih| InvDesc::Iotlb {
            granularity: IotlbGranularity::Page {
                did: DID,
                addr,
                am: 2,
                ih,
            },
            drain_reads: false,
            drain_writes: false,
        };
        d.qi_submit_sync(&[psi(base + 5 * SZ_4K, true)], &mut w)
            .unwrap();
        for p in 0..8 {
            let present = d.iotlb_probe(DID, Iova::new(base + p * SZ_4K)).is_some();
            assert_eq!(present, p < 4, "page {p}");
        }
        assert_eq!(d.pscache_count(DID), ps);
        // Without IH the paging-structure entries covering the block go too.
        d.qi_submit_sync(&[psi(base, false)], &mut w).unwrap();
        assert_eq!(d.iotlb_count(DID), 0);
        assert_eq!(d.pscache_count(DID), 0);
        // Another domain's entries are untouched by a PSI of this one.
        assert_eq!(d.stats().psi, 2);
    }

    #[test]
    fn vtd_queue_error_stops_consumption_until_cleared() {
        let d = unit(DmarConfig::cascade_lake());
        let mem = d.memory().clone();
        let q = d.queue_base().get();
        let status = d
            .allocator()
            .alloc(1, 1, PhysAddr::new(u64::MAX), &mut WorkRecord::new())
            .unwrap()
            .get();
        let wait = |data: u32| {
            InvDesc::Wait {
                interrupt: false,
                status_write: true,
                fence: false,
                page_drain: false,
                status_data: data,
                status_addr: status + 4 * u64::from(data),
            }
            .encode()
            .unwrap()
        };
        let put = |slot: u64, words: [u64; 2]| {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&words[0].to_le_bytes());
            b[8..].copy_from_slice(&words[1].to_le_bytes());
            mem.write(PhysAddr::new(q + slot * 16), &b).unwrap();
        };
        let status_of = |i: u64| {
            let mut b = [0u8; 4];
            mem.read(PhysAddr::new(status + 4 * i), &mut b).unwrap();
            u32::from_le_bytes(b)
        };
        put(0, wait(1));
        put(1, [0x9, 0]); // type 9 (page-group response): not modelled, invalid here.
        put(2, wait(2));
        let mut w = WorkRecord::new();
        d.write_iqt(3 * 16, &mut w);
        assert_eq!(d.process_queue(), 1);
        assert_eq!(d.iqh(), 16);
        // IQA: the base, 128-bit descriptors, QS 0 (one page of 256).
        assert_eq!(d.iqa(), q);
        assert_eq!(d.fsts() & fsts::IQE, fsts::IQE);
        // IQEI 3: invalid descriptor type (Intel's IQERCD_REG reference: 1 invalid tail
        // pointer, 2 fetch error, 3 invalid type, 4 reserved field, 5 invalid width).
        assert_eq!(d.iqercd() & 0xF, 3);
        assert_eq!((status_of(1), status_of(2)), (1, 0));
        // Stalled while IQE is set, even with the descriptor fixed.
        put(
            1,
            InvDesc::ContextCache(CcGranularity::Global)
                .encode()
                .unwrap(),
        );
        assert_eq!(d.process_queue(), 0);
        d.write_fsts(fsts::IQE, &mut w);
        assert_eq!(d.process_queue(), 2);
        assert_eq!(status_of(2), 2);
        assert_eq!(d.iqh(), d.iqt());
        // A misaligned tail is an error too (IQEI 1: invalid tail pointer).
        d.write_iqt(3 * 16 + 8, &mut w);
        assert_eq!(d.fsts() & fsts::IQE, fsts::IQE);
        assert_eq!(d.iqercd() & 0xF, 1);
        assert_eq!(d.stats().queue_errors, 2);
    }

    #[test]
    fn vtd_driver_recovers_from_a_bad_descriptor_like_linux() {
        let d = unit(DmarConfig::cascade_lake());
        let mut w = WorkRecord::new();
        let r = d.qi_submit_raw(&[[0x2, 0]], &mut w); // IOTLB with reserved G = 0.
        assert_eq!(r, Err(QiError::InvalidDescriptor { index: 0 }));
        assert_eq!(d.fsts() & fsts::IQE, 0, "the driver cleared IQE");
        // The queue keeps working, in order, and the driver's ring is whole again.
        let mut w = WorkRecord::new();
        d.qi_submit_sync(&[InvDesc::ContextCache(CcGranularity::Global)], &mut w)
            .unwrap();
        assert_eq!(w.inval_syncs, 1);
        assert_eq!(d.iqh(), d.iqt());
        // Many submissions lap the 256-entry ring.
        for _ in 0..300 {
            d.qi_submit_sync(&[InvDesc::ContextCache(CcGranularity::Global)], &mut w)
                .unwrap();
        }
        assert_eq!(d.qi_free_slots(), 256);
    }

    #[test]
    fn vtd_fault_records_fill_round_robin_and_overflow() {
        let d = unit(DmarConfig::cascade_lake());
        assert_eq!(d.config().cap.nfr(), 8);
        let mut w = WorkRecord::new();
        // Bus 7 has no context table: root entry not present.
        for i in 0..9u64 {
            let f = d
                .translate(0x0700, Iova::new(i * SZ_4K), Access::Write, &mut w)
                .unwrap_err();
            assert_eq!(f.reason, reason::ROOT_NOT_PRESENT);
            assert_eq!(f.recorded, i < 8);
        }
        assert_eq!(d.fsts() & fsts::PFO, fsts::PFO);
        assert_eq!(d.stats().faults_dropped, 1);
        assert_eq!((d.fsts() >> fsts::FRI_SHIFT) & 0xFF, 0);
        d.clear_fault_record(0, &mut w);
        d.write_fsts(fsts::PFO, &mut w);
        let f = d
            .translate(0x0700, Iova::new(0x9000), Access::Read, &mut w)
            .unwrap_err();
        assert!(f.recorded);
        // The oldest pending record is now register 1.
        assert_eq!((d.fsts() >> fsts::FRI_SHIFT) & 0xFF, 1);
        assert_eq!(d.fsts() & fsts::PFO, 0);
        let rec = FaultRecord::decode(d.fault_record(0).unwrap()).unwrap();
        assert_eq!(rec.addr, 0x9000);
    }

    #[test]
    fn vtd_context_faults_permissions_and_detach() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = domain(&d, DomainMode::Strict);
        let mut w = WorkRecord::new();
        // Same bus, another devfn: the context entry is clear.
        let f = d
            .translate(SID + 1, Iova::new(0), Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(f.reason, reason::CONTEXT_NOT_PRESENT);
        // A device-read-only mapping refuses device writes with reason 5.
        let m = map(&dom, 0x20_0000, SZ_4K, Direction::ToDevice);
        let f = d
            .translate(SID, iova(&m), Access::Write, &mut w)
            .unwrap_err();
        assert_eq!(f.reason, reason::PTE_NO_WRITE);
        assert!(d.translate(SID, iova(&m), Access::Read, &mut w).is_ok());
        assert_eq!(d.context_cache_len(), 1);
        // Attaching twice is refused; detach invalidates the context cache and the IOTLB.
        assert!(d.attach(SID, &dom, &mut w).is_err());
        d.detach(SID, &mut w).unwrap();
        assert_eq!(d.context_cache_len(), 0);
        assert_eq!(d.iotlb_count(DID), 0);
        let f = d
            .translate(SID, iova(&m), Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(f.reason, reason::CONTEXT_NOT_PRESENT);
    }

    #[test]
    fn vtd_superpage_and_five_level_walks() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = domain(&d, DomainMode::Strict);
        // A 2 MiB buffer at a 2 MiB-aligned address gets a size-aligned IOVA: one PS leaf.
        let m = map(&dom, 0x40_0000, SZ_2M, Direction::ToDevice);
        let mut w = WorkRecord::new();
        let t = d
            .translate(SID, iova(&m).add(0x1_2345), Access::Read, &mut w)
            .unwrap();
        assert_eq!(t.page_size, SZ_2M);
        assert_eq!(t.pa, PhysAddr::new(0x41_2345));
        assert_eq!(w.walk_reads, 2 + 3);

        // A unit with 5-level SAGAW (bit 3) walks five levels.
        let cap5 = Cap((0x08d2_078c_106f_0466 & !(0x1F << 8)) | (0b1100 << 8));
        let d5 = unit(DmarConfig::new(
            cap5,
            iolab_iommu::vtd::spec::ECAP_CASCADE_LAKE,
        ));
        assert_eq!(d5.levels(), 5);
        let dom5 = domain(&d5, DomainMode::Strict);
        let m = map(&dom5, 0x12_3000, SZ_4K, Direction::ToDevice);
        let mut w = WorkRecord::new();
        d5.translate(SID, iova(&m), Access::Read, &mut w).unwrap();
        assert_eq!(w.walk_reads, 2 + 5);
    }

    /// Maps, unmaps and re-maps one page so the second map reuses the IOVA, after the device
    /// touched the unmapped IOVA (a not-present walk). Returns whether the device can reach
    /// the page right after the second map, and the work of `sync_map`.
    fn remap_after_fault(config: DmarConfig) -> (bool, bool, WorkRecord) {
        let d = unit(config);
        let dom = domain(&d, DomainMode::Strict);
        let m = map(&dom, 0x12_3000, SZ_4K, Direction::ToDevice);
        let at = iova(&m);
        dom.domain()
            .unmap_page(m, 0, 0, &mut WorkRecord::new())
            .unwrap();
        assert!(d
            .translate(SID, at, Access::Read, &mut WorkRecord::new())
            .is_err());
        let m = map(&dom, 0x45_6000, SZ_4K, Direction::ToDevice);
        assert_eq!(iova(&m), at, "the IOVA is reused");
        let before = d.translate(SID, at, Access::Read, &mut WorkRecord::new());
        let mut w = WorkRecord::new();
        dom.sync_map(at, SZ_4K, &mut w).unwrap();
        let after = d.translate(SID, at, Access::Read, &mut WorkRecord::new());
        assert_eq!(after.unwrap().pa, PhysAddr::new(0x45_6000));
        (before.is_ok(), after.is_ok(), w)
    }

    #[test]
    fn vtd_caching_mode_needs_invalidation_on_map() {
        // Bare metal (CM = 0): the new mapping is visible at once; sync_map does nothing.
        let (before, after, w) = remap_after_fault(DmarConfig::cascade_lake());
        assert!(before && after);
        assert!(w.is_empty(), "{w:?}");

        // Caching Mode: the unit cached the not-present entry, so the device still faults
        // after the map until the driver's PSI (iotlb_sync_map).
        let (before, after, w) = remap_after_fault(DmarConfig::cascade_lake().caching_mode());
        assert!(!before && after);
        assert_eq!(w.commands_written, 2);
        assert_eq!(w.inval_syncs, 1);
    }

    #[test]
    fn vtd_caching_mode_attach_invalidates_context_and_domain() {
        let d = unit(DmarConfig::cascade_lake().caching_mode());
        let dom = d
            .new_domain(
                DID,
                DomainConfig::new(DomainId(1), DomainMode::Strict),
                allocator(),
            )
            .unwrap();
        let mut w = WorkRecord::new();
        d.attach(SID, &dom, &mut w).unwrap();
        // Context-cache (device, DID 0) + IOTLB DSI + wait.
        assert_eq!(w.commands_written, 3);
        assert_eq!(d.stats().descriptors[0], 1);
        assert_eq!(d.stats().dsi, 1);
        // DID 0 is reserved and DIDs are unique per unit.
        let again = d.new_domain(
            DID,
            DomainConfig::new(DomainId(2), DomainMode::Strict),
            allocator(),
        );
        assert!(again.is_err());
        let zero = d.new_domain(
            0,
            DomainConfig::new(DomainId(3), DomainMode::Strict),
            allocator(),
        );
        assert!(zero.is_err());
    }

    #[test]
    fn vtd_psi_without_ih_drops_the_domain_s_nonleaf_entries_as_intel_iio_does() {
        // Two pages 4 MiB apart: two PD entries beside the one PML4 and one PDPT entry.
        for (scope, left) in [(NonLeafPsiScope::Domain, 0), (NonLeafPsiScope::Range, 1)] {
            let d = unit(DmarConfig {
                nonleaf_psi: scope,
                ..DmarConfig::cascade_lake()
            });
            let dom = domain(&d, DomainMode::Strict);
            let a = map(&dom, 0x10_0000, SZ_4K, Direction::ToDevice);
            let _spacer = map(&dom, 0x100_0000, 2 * SZ_2M, Direction::ToDevice);
            let c = map(&dom, 0x20_0000, SZ_4K, Direction::ToDevice);
            // The page below `c`, in its 2 MiB: not translated yet.
            let e = map(&dom, 0x30_0000, SZ_4K, Direction::ToDevice);
            assert_eq!(iova(&c).get() >> 21, iova(&e).get() >> 21);
            assert_ne!(iova(&a).get() >> 21, iova(&c).get() >> 21);
            let mut w = WorkRecord::new();
            d.translate(SID, iova(&a), Access::Read, &mut w).unwrap();
            d.translate(SID, iova(&c), Access::Read, &mut w).unwrap();
            assert_eq!(d.pscache_count(DID), 4, "{scope:?}");
            let psi = InvDesc::Iotlb {
                granularity: IotlbGranularity::Page {
                    did: DID,
                    addr: iova(&a).get(),
                    am: 0,
                    ih: false,
                },
                drain_reads: false,
                drain_writes: false,
            };
            d.qi_submit_sync(&[psi], &mut w).unwrap();
            // The IIO empties the domain's paging-structure caches; the spec's minimum
            // keeps the PD entry of the other page.
            assert_eq!(d.pscache_count(DID), left, "{scope:?}");
            // The leaf level is page-selective either way.
            assert!(d.iotlb_probe(DID, iova(&a)).is_none());
            assert!(d.iotlb_probe(DID, iova(&c)).is_some());
            // A miss in the other page's 2 MiB: after the domain-wide drop it walks all four
            // levels; with the spec's minimum the surviving PD entry leaves one read.
            let mut w = WorkRecord::new();
            d.translate(SID, iova(&e), Access::Read, &mut w).unwrap();
            assert_eq!(w.walk_reads, if left == 0 { 4 } else { 1 }, "{scope:?}");
            assert_eq!(w.full_walks, u64::from(left == 0), "{scope:?}");
        }
    }

    #[test]
    fn vtd_freed_table_merges_into_one_psi_and_ih_follows_the_f_and_s_option() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = domain(&d, DomainMode::Strict);
        // 2 MiB at a 4 KiB-aligned (not 2 MiB-aligned) address: 512 small pages in one leaf
        // table, which the unmap frees.
        let m = map(&dom, 0x40_1000, SZ_2M, Direction::ToDevice);
        let mut w = WorkRecord::new();
        dom.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        assert_eq!((w.inval_ranges, w.inval_walks, w.tables_freed), (1, 1, 1));
        // Range and freed table are one span: one PSI with AM 9, and the wait.
        assert_eq!(w.commands_written, 2);
        assert_eq!(d.stats().psi, 1);

        // With the F&S option, an unmap that frees no table sets IH: the paging-structure
        // caches survive it. Linux's default drops them.
        for honour in [false, true] {
            let d = unit(DmarConfig::cascade_lake());
            let dom = domain(&d, DomainMode::Strict);
            dom.invalidator().set_honour_ih(honour);
            let keep = map(&dom, 0x10_0000, SZ_4K, Direction::ToDevice);
            let m = map(&dom, 0x20_0000, SZ_4K, Direction::ToDevice);
            let mut w = WorkRecord::new();
            d.translate(SID, iova(&keep), Access::Read, &mut w).unwrap();
            d.translate(SID, iova(&m), Access::Read, &mut w).unwrap();
            assert_eq!(d.pscache_count(DID), 3);
            dom.domain().unmap_page(m, 0, 0, &mut w).unwrap();
            assert_eq!(d.pscache_count(DID) == 3, honour, "honour_ih {honour}");
            assert!(d.iotlb_probe(DID, iova(&keep)).is_some());
        }
    }

    #[test]
    fn vtd_concurrent_strict_unmaps_share_the_queue() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = Arc::new(domain(&d, DomainMode::Strict));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (d, dom) = (d.clone(), dom.clone());
                std::thread::spawn(move || {
                    let mut w = WorkRecord::new();
                    for i in 0..50u64 {
                        let pa = 0x100_0000 + (t * 64 + i % 64) * SZ_4K;
                        let m = map(&dom, pa, SZ_4K, Direction::ToDevice);
                        let at = iova(&m);
                        d.translate(SID, at, Access::Read, &mut w).unwrap();
                        dom.domain().unmap_page(m, 0, 0, &mut w).unwrap();
                    }
                    w
                })
            })
            .collect();
        let mut total = WorkRecord::new();
        for t in threads {
            total += t.join().unwrap();
        }
        assert_eq!(total.inval_syncs, 200);
        assert_eq!(total.commands_written, 400);
        assert_eq!(d.iotlb_stale(), 0);
        assert_eq!(d.qi_free_slots(), d.config().qi_entries);
        assert_eq!(d.iqh(), d.iqt());
    }

    #[test]
    fn vtd_context_cache_invalidation_by_device_with_function_mask() {
        let d = unit(DmarConfig::cascade_lake());
        let dom = domain(&d, DomainMode::Strict);
        // The same domain on function 4 of the device (devfn 0x14).
        let sid4 = SID | 0x4;
        d.attach(sid4, &dom, &mut WorkRecord::new()).unwrap();
        let m = map(&dom, 0x12_3000, SZ_4K, Direction::ToDevice);
        let fill = || {
            for sid in [SID, sid4] {
                d.translate(sid, iova(&m), Access::Read, &mut WorkRecord::new())
                    .unwrap();
            }
        };
        fill();
        assert_eq!(d.context_cache_len(), 2);
        let cc = |fm| {
            InvDesc::ContextCache(CcGranularity::Device {
                did: DID,
                sid: SID,
                fm,
            })
        };
        let mut w = WorkRecord::new();
        d.qi_submit_sync(&[cc(0)], &mut w).unwrap();
        assert_eq!(d.context_cache_len(), 1, "FM 0: exactly one function");
        fill();
        // FM 1 masks function bit 2: functions 0 and 4 both go.
        d.qi_submit_sync(&[cc(1)], &mut w).unwrap();
        assert_eq!(d.context_cache_len(), 0);
        fill();
        // Domain-selective for another DID keeps them; for this DID drops them.
        let dom_cc = |did| InvDesc::ContextCache(CcGranularity::Domain { did });
        d.qi_submit_sync(&[dom_cc(DID + 1)], &mut w).unwrap();
        assert_eq!(d.context_cache_len(), 2);
        d.qi_submit_sync(&[dom_cc(DID)], &mut w).unwrap();
        assert_eq!(d.context_cache_len(), 0);
    }

    #[test]
    fn vtd_strict_path_falls_back_to_dsi_beyond_mamv_or_without_psi() {
        let base = DmarConfig::cascade_lake();
        // MAMV 0: only single-page PSIs.
        let mamv0 = DmarConfig::new(
            Cap(base.cap.0 & !(0x3F << 48)),
            iolab_iommu::vtd::spec::ECAP_CASCADE_LAKE,
        );
        let no_psi = DmarConfig::new(
            Cap(base.cap.0 & !(1 << 39)),
            iolab_iommu::vtd::spec::ECAP_CASCADE_LAKE,
        );
        for (config, pages, psi, dsi) in [
            (base.clone(), 2, 1, 0),
            (mamv0.clone(), 1, 1, 0),
            (mamv0, 2, 0, 1),
            (no_psi, 1, 0, 1),
        ] {
            let d = unit(config);
            let dom = domain(&d, DomainMode::Strict);
            let m = map(&dom, 0x10_0000, pages * SZ_4K, Direction::ToDevice);
            dom.domain()
                .unmap_page(m, 0, 0, &mut WorkRecord::new())
                .unwrap();
            let s = d.stats();
            assert_eq!((s.psi, s.dsi), (psi, dsi), "{pages} pages");
        }
    }
}
