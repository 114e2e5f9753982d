//! VT-d scalable mode: walks through hand-built scalable root, context, PASID directory and
//! PASID-table entries and first-/second-stage/nested tables (bit-level checks of output,
//! permissions, faults and reads), property tests against legacy mode and across stages,
//! the PASID cache and PASID-based invalidations, and the device-TLB. Tests live in
//! `mod vtd_sm` so `cargo test vtd` runs them.

mod vtd_sm {
    use std::sync::Arc;

    use iolab_iommu::addr::{Access, Iova, PhysAddr, Prot, SZ_1G, SZ_2M, SZ_4G, SZ_4K};
    use iolab_iommu::dma::{Device, Direction, DomainConfig, DomainId, DomainMode};
    use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use iolab_iommu::mem::{PhysAllocator, PhysMemory};
    use iolab_iommu::pgtable::IoPageTable;
    use iolab_iommu::vtd::spec::{
        self, reason, Cap, ContextEntry, Ecap, FaultRecord, FlPte, InvDesc, IotlbGranularity,
        PasidDirEntry, PasidEntry, PasidIotlbGranularity, PcGranularity, Pgtt, SlPte,
        SmContextEntry, SmRootEntry, TranslationType,
    };
    use iolab_iommu::vtd::{
        Dmar, DmarConfig, DmarDomain, DmarError, VtdPageTable, VtdRequest, VtdStage,
        VtdTableConfig, VtdTranslation,
    };
    use iolab_iommu::work::WorkRecord;
    use proptest::prelude::*;

    /// Bus 2, device 1, function 0 (lower context-table half).
    const SID: u16 = 0x0208;
    /// Bus 2, devfn 0x90 (upper half).
    const SID_HI: u16 = 0x0290;

    /// A Cascade Lake CAP with FL1GP and FL5LP; its ECAP with SMTS, SLTS, FLTS, NEST,
    /// PASID and 20 PASID bits.
    fn sm_regs() -> (Cap, Ecap) {
        let cap = Cap(spec::CAP_CASCADE_LAKE.0 | 1 << 56 | 1 << 60);
        let ecap = Ecap(
            spec::ECAP_CASCADE_LAKE.0 | 1 << 43 | 1 << 46 | 1 << 47 | 1 << 26 | 1 << 40 | 19 << 35,
        );
        (cap, ecap)
    }

    fn sm_config(t: VtdTranslation) -> DmarConfig {
        let (cap, ecap) = sm_regs();
        DmarConfig::new(cap, ecap).with_translation(t)
    }

    /// A strict DMA-API domain of domain id `did` on `d`, IOVAs below 4 GiB.
    fn strict_domain(d: &Arc<Dmar>, did: u16) -> DmarDomain {
        let iovas = Arc::new(
            LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap(),
        );
        d.new_domain(
            did,
            DomainConfig::new(DomainId(1), DomainMode::Strict),
            iovas,
        )
        .unwrap()
    }

    fn alloc() -> Arc<PhysAllocator> {
        let mem = Arc::new(PhysMemory::new(256 << 20).unwrap());
        Arc::new(
            PhysAllocator::new(mem, PhysAddr::new(128 << 20), PhysAddr::new(256 << 20)).unwrap(),
        )
    }

    fn page(d: &Dmar) -> u64 {
        d.allocator()
            .alloc(1, 1, PhysAddr::new(u64::MAX), &mut WorkRecord::new())
            .unwrap()
            .get()
    }

    fn write(d: &Dmar, pa: u64, words: &[u64]) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        d.memory().write(PhysAddr::new(pa), &bytes).unwrap();
    }

    fn read(d: &Dmar, pa: u64) -> u64 {
        let mut b = [0u8; 8];
        d.memory().read(PhysAddr::new(pa), &mut b).unwrap();
        u64::from_le_bytes(b)
    }

    /// Hand-built scalable structures for `sid`: root entry, context entry (PDTS 0: 128
    /// directory entries), directory entry for `pasid`, and `pe` at `pasid`. Returns the
    /// PASID-entry address.
    fn sm_setup(d: &Dmar, sid: u16, pasid: u32, pe: PasidEntry, paside: bool) -> u64 {
        let bus = u64::from(sid >> 8);
        let devfn = (sid & 0xFF) as u8;
        let root_pa = d.root_table().get() + bus * 16;
        let mut root = SmRootEntry::decode([read(d, root_pa), read(d, root_pa + 8)]).unwrap();
        let (present, mut table, idx) = root.table_for(devfn);
        if !present {
            table = page(d);
            if devfn < 0x80 {
                (root.lower_present, root.lower_table) = (true, table);
            } else {
                (root.upper_present, root.upper_table) = (true, table);
            }
            write(d, root_pa, &root.encode());
        }
        let ctx_at = table + idx * 32;
        let dir =
            match SmContextEntry::decode(std::array::from_fn(|i| read(d, ctx_at + 8 * i as u64))) {
                Some(c) if c.present => c.pasid_dir,
                _ => {
                    let dir = page(d);
                    let ce = SmContextEntry {
                        present: true,
                        paside,
                        pdts: 0,
                        pasid_dir: dir,
                        rid_pasid: 0,
                        ..SmContextEntry::default()
                    };
                    write(d, ctx_at, &ce.encode());
                    dir
                }
            };
        let de_at = dir + u64::from(pasid >> 6) * 8;
        let ptable = match PasidDirEntry::decode(read(d, de_at)) {
            Some(e) if e.present => e.table,
            _ => {
                let t = page(d);
                let de = PasidDirEntry {
                    present: true,
                    fpd: false,
                    table: t,
                };
                write(d, de_at, &[de.encode()]);
                t
            }
        };
        let at = ptable + u64::from(pasid & 63) * 64;
        write(d, at, &pe.encode());
        at
    }

    /// Writes `leaf` for `iova` at `leaf_level` of the table at `root` with `levels`
    /// levels, creating tables with `table_entry`. Returns the leaf entry's address.
    fn build(
        d: &Dmar,
        (root, levels): (u64, u32),
        iova: u64,
        leaf_level: u32,
        leaf: u64,
        table_entry: fn(u64) -> u64,
    ) -> u64 {
        let mut table = root;
        for level in (leaf_level + 1..=levels).rev() {
            let at = table + ((iova >> (12 + 9 * (level - 1))) & 511) * 8;
            let e = read(d, at);
            table = if e == 0 {
                let t = page(d);
                write(d, at, &[table_entry(t)]);
                t
            } else {
                e & spec::PTE_ADDR_MASK
            };
        }
        let at = table + ((iova >> (12 + 9 * (leaf_level - 1))) & 511) * 8;
        write(d, at, &[leaf]);
        at
    }

    fn fs_entry(root: u64, did: u16, flpm: u8) -> PasidEntry {
        PasidEntry {
            present: true,
            aw: 2,
            pgtt: Pgtt::FirstStage,
            flptptr: root,
            flpm,
            did,
            ..PasidEntry::default()
        }
    }

    fn ss_entry(root: u64, did: u16) -> PasidEntry {
        PasidEntry {
            present: true,
            aw: 2,
            pgtt: Pgtt::SecondStage,
            slptptr: root,
            did,
            ..PasidEntry::default()
        }
    }

    fn read_req(iova: u64) -> VtdRequest {
        VtdRequest::new(SID, Iova::new(iova), Access::Read)
    }

    fn write_req(iova: u64) -> VtdRequest {
        VtdRequest::new(SID, Iova::new(iova), Access::Write)
    }

    #[test]
    fn vtd_sm_rtaddr_has_ttm_and_needs_smts() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        assert!(d.is_scalable());
        assert_eq!(d.rtaddr(), d.root_table().get() | 1 << 10);
        let legacy =
            DmarConfig::cascade_lake().with_translation(VtdTranslation::ScalableSecondStage);
        assert!(matches!(
            Dmar::new(legacy, alloc()),
            Err(DmarError::NoScalableMode {
                missing: "SMTS",
                ..
            })
        ));
        let (cap, ecap) = sm_regs();
        let no_fl = DmarConfig::new(cap, Ecap(ecap.0 & !(1 << 47)))
            .with_translation(VtdTranslation::ScalableFirstStage);
        assert!(matches!(
            Dmar::new(no_fl, alloc()),
            Err(DmarError::NoScalableMode {
                missing: "FLTS",
                ..
            })
        ));
    }

    #[test]
    fn vtd_sm_first_stage_4k_2m_1g_walks_by_hand() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        let root = page(&d);
        sm_setup(&d, SID, 0, fs_entry(root, 7, 0), false);
        // 4 KiB writable at 0x1234_5000 → 0x0abc_d000; 2 MiB read-only at 0x4000_0000 →
        // 0x0200_0000; 1 GiB writable at 0x80_0000_0000 → 0x4000_0000.
        build(
            &d,
            (root, 4),
            0x1234_5000,
            1,
            FlPte::leaf(0x0abc_d000, true, false),
            FlPte::table,
        );
        build(
            &d,
            (root, 4),
            0x4000_0000,
            2,
            FlPte::leaf(0x0200_0000, false, true),
            FlPte::table,
        );
        build(
            &d,
            (root, 4),
            0x80_0000_0000,
            3,
            FlPte::leaf(0x4000_0000, true, true),
            FlPte::table,
        );

        let mut w = WorkRecord::new();
        let t = d
            .translate_request(&write_req(0x1234_5678), &mut w)
            .unwrap();
        assert_eq!(t.pa, PhysAddr::new(0x0abc_d678));
        assert_eq!((t.page_size, t.prot), (SZ_4K, Prot::READ_WRITE));
        // Root + context, directory + PASID entry, then PML4, PDPT, PD, PT.
        assert_eq!(w.walk_reads, 8);
        let s = d.stats();
        assert_eq!((s.context_misses, s.pasid_misses), (1, 1));

        // Again: context cache, PASID cache and IOTLB hit, no reads.
        let mut w = WorkRecord::new();
        let t = d.translate_request(&read_req(0x1234_5000), &mut w).unwrap();
        assert!(t.iotlb_hit);
        assert_eq!(w.walk_reads, 0);
        assert_eq!((d.stats().context_hits, d.stats().pasid_hits), (1, 1));

        // The 2 MiB page: PML4 cached, so PDPT + PD.
        let mut w = WorkRecord::new();
        let t = d.translate_request(&read_req(0x4012_3456), &mut w).unwrap();
        assert_eq!((t.pa, t.page_size), (PhysAddr::new(0x0212_3456), SZ_2M));
        assert_eq!(t.prot, Prot::READ);
        assert_eq!(w.walk_reads, 2);
        // It is read-only: a write faults 0x85 (and is recorded without PASID).
        let f = d
            .translate_request(&write_req(0x4000_0000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_NO_WRITE);
        let rec = FaultRecord::decode(d.fault_record(0).unwrap()).unwrap();
        assert_eq!((rec.reason, rec.read, rec.pasid), (0x85, false, None));

        // The 1 GiB page at PML4 index 1: a new PML4 entry, then the PDPT leaf.
        let mut w = WorkRecord::new();
        let t = d
            .translate_request(&write_req(0x80_3FFF_FFF8), &mut w)
            .unwrap();
        assert_eq!((t.pa, t.page_size), (PhysAddr::new(0x7FFF_FFF8), SZ_1G));
        assert_eq!(w.walk_reads, 2);

        // Unmapped: P clear in the PT → 0x71.
        let f = d
            .translate_request(&read_req(0x1234_6000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_FL_NOT_PRESENT);
        // Non-canonical for 4 levels (bit 47 set, bits 63:48 clear) → 0x80; canonical
        // upper half → a walk (PML4 index 256, nothing there).
        let f = d
            .translate_request(&read_req(0x8000_0000_0000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_NOT_CANONICAL);
        let f = d
            .translate_request(&read_req(0xFFFF_8000_0000_0000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_FL_NOT_PRESENT);
    }

    #[test]
    fn vtd_sm_first_stage_rights_us_rw_and_sre() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        let root = page(&d);
        sm_setup(&d, SID, 0, fs_entry(root, 3, 0), true);
        // A writable leaf under a PD entry with R/W clear: writes fault 0x85.
        let no_rw = |t: u64| FlPte::table(t) & !spec::fl::RW;
        build(&d, (root, 4), 0x20_0000, 2, no_rw(page(&d)), FlPte::table);
        build(
            &d,
            (root, 4),
            0x20_0000,
            1,
            FlPte::leaf(0x5000, true, false),
            FlPte::table,
        );
        let t = d
            .translate_request(&read_req(0x20_0000), &mut WorkRecord::new())
            .unwrap();
        assert_eq!((t.pa, t.prot), (PhysAddr::new(0x5000), Prot::READ));
        let f = d
            .translate_request(&write_req(0x20_0000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_NO_WRITE);

        // A leaf with U/S clear: a request without PASID (user) faults 0x81.
        let leaf = FlPte::leaf(0x6000, true, false) & !spec::fl::US;
        build(&d, (root, 4), 0x40_0000, 1, leaf, FlPte::table);
        let f = d
            .translate_request(&read_req(0x40_0000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_US_CLEAR);
        // A supervisor request with PASID 0 needs SRE: 0x5D, recorded with the PASID.
        let sup = read_req(0x40_0000).with_pasid(0, true);
        let f = d
            .translate_request(&sup, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!((f.reason, f.pasid), (reason::SM_SRE_CLEAR, Some(0)));
        let rec = FaultRecord::decode(d.fault_record(2).unwrap()).unwrap();
        assert_eq!(rec.pasid, Some(0));
        // With SRE (and the PASID cache flushed) the supervisor request translates.
        let mut pe = fs_entry(root, 3, 0);
        pe.sre = true;
        sm_setup(&d, SID, 0, pe, true);
        d.qi_submit_sync(
            &[InvDesc::PasidCache {
                did: 3,
                granularity: PcGranularity::Pasid { pasid: 0 },
            }],
            &mut WorkRecord::new(),
        )
        .unwrap();
        let t = d.translate_request(&sup, &mut WorkRecord::new()).unwrap();
        assert_eq!(t.pa, PhysAddr::new(0x6000));
    }

    #[test]
    fn vtd_sm_first_stage_five_levels() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        let root = page(&d);
        sm_setup(&d, SID, 0, fs_entry(root, 4, 1), false);
        // Bit 47 is an index bit with 5 levels, not a sign bit.
        let iova = 0x8000_0000_0000u64 | 0x3000;
        build(
            &d,
            (root, 5),
            iova,
            1,
            FlPte::leaf(0x7000, false, false),
            FlPte::table,
        );
        let mut w = WorkRecord::new();
        let t = d.translate_request(&read_req(iova), &mut w).unwrap();
        assert_eq!(t.pa, PhysAddr::new(0x7000));
        assert_eq!(w.walk_reads, 4 + 5);
        // 5-level without CAP.FL5LP: the PASID entry is invalid (0x5B).
        let (cap, ecap) = sm_regs();
        let cfg = DmarConfig::new(Cap(cap.0 & !(1 << 60)), ecap)
            .with_translation(VtdTranslation::ScalableFirstStage);
        let e = Dmar::new(cfg, alloc()).unwrap();
        let root = page(&e);
        sm_setup(&e, SID, 0, fs_entry(root, 4, 1), false);
        let f = e
            .translate_request(&read_req(0x1000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_PASID_INVALID);
    }

    #[test]
    fn vtd_sm_second_stage_pass_through_and_structure_faults() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableSecondStage), alloc()).unwrap();
        let root = page(&d);
        sm_setup(&d, SID, 0, ss_entry(root, 9), false);
        build(
            &d,
            (root, 4),
            0x1000,
            1,
            SlPte::leaf(0x9000, Prot::READ, false),
            SlPte::table,
        );
        let mut w = WorkRecord::new();
        let t = d.translate_request(&read_req(0x1010), &mut w).unwrap();
        assert_eq!((t.pa, w.walk_reads), (PhysAddr::new(0x9010), 8));
        let f = d
            .translate_request(&write_req(0x1000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_NO_WRITE);
        let f = d
            .translate_request(&read_req(0x2000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_SL_NOT_PRESENT);
        // 4-level second stage: 48 bits.
        let f = d
            .translate_request(&read_req(1 << 48), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_BEYOND_MAX);

        // The upper context half: pass-through (PGTT 4) for devfn 0x90.
        let pt = PasidEntry {
            present: true,
            pgtt: Pgtt::PassThrough,
            did: 1,
            ..PasidEntry::default()
        };
        sm_setup(&d, SID_HI, 0, pt, false);
        let req = VtdRequest::new(SID_HI, Iova::new(0x1234_5678), Access::Write);
        let t = d.translate_request(&req, &mut WorkRecord::new()).unwrap();
        assert_eq!(t.pa, PhysAddr::new(0x1234_5678));

        // Requests with PASID: PASIDE clear → 0x45; beyond PDTS 0's 128 × 64 → 0x46 (after
        // PASIDE is set on another device); a clear directory entry → 0x51; a clear PASID
        // entry → 0x59.
        let f = d
            .translate_request(
                &read_req(0x1000).with_pasid(5, false),
                &mut WorkRecord::new(),
            )
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_PASIDE_CLEAR);
        let sid2 = 0x0300;
        let pe2 = ss_entry(root, 9);
        sm_setup(&d, sid2, 0, pe2, true);
        let req2 =
            |pasid| VtdRequest::new(sid2, Iova::new(0x1000), Access::Read).with_pasid(pasid, false);
        let f = d
            .translate_request(&req2(128 * 64), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_PASID_TOO_LARGE);
        let f = d
            .translate_request(&req2(64), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_DIR_NOT_PRESENT);
        let f = d
            .translate_request(&req2(1), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_PASID_NOT_PRESENT);
        assert!(d
            .translate_request(&req2(0), &mut WorkRecord::new())
            .is_ok());
        // No context entry on bus 4 → root half clear 0x39; bus 2 devfn 0x10 → context
        // entry clear 0x41.
        let f = d
            .translate(0x0400, Iova::new(0), Access::Read, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_ROOT_NOT_PRESENT);
        let f = d
            .translate(0x0210, Iova::new(0), Access::Read, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_CONTEXT_NOT_PRESENT);

        // A legacy unit refuses requests with PASID: 0x31.
        let l = Dmar::new(DmarConfig::cascade_lake(), alloc()).unwrap();
        let f = l
            .translate_request(&read_req(0).with_pasid(1, false), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_TTM0_WITH_PASID);
    }

    #[test]
    fn vtd_sm_nested_walk_translates_every_pointer_through_the_second_stage() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        // Second stage: guest-physical 0..16 MiB at host 0x0800_0000 (2 MiB pages).
        let ss = page(&d);
        let host = d
            .allocator()
            .alloc(4096, 512, PhysAddr::new(u64::MAX), &mut WorkRecord::new())
            .unwrap()
            .get();
        for i in 0..8u64 {
            let leaf = SlPte::leaf(host + i * SZ_2M, Prot::READ_WRITE, true);
            build(&d, (ss, 4), i * SZ_2M, 2, leaf, SlPte::table);
        }
        // First-stage tables at guest-physical 0x1000.. (host + the same offset): a 4 KiB
        // leaf for 0x7000_0000 → guest-physical 0x30_0000.
        let (g_pml4, g_pdpt, g_pd, g_pt) = (0x1000u64, 0x2000, 0x3000, 0x4000);
        let iova = 0x7000_0000u64;
        let idx = |l: u32| ((iova >> (12 + 9 * (l - 1))) & 511) * 8;
        write(&d, host + g_pml4 + idx(4), &[FlPte::table(g_pdpt)]);
        write(&d, host + g_pdpt + idx(3), &[FlPte::table(g_pd)]);
        write(&d, host + g_pd + idx(2), &[FlPte::table(g_pt)]);
        write(
            &d,
            host + g_pt + idx(1),
            &[FlPte::leaf(0x30_0000, true, false)],
        );
        let pe = PasidEntry {
            present: true,
            aw: 2,
            pgtt: Pgtt::Nested,
            slptptr: ss,
            flptptr: g_pml4,
            did: 11,
            ..PasidEntry::default()
        };
        sm_setup(&d, SID, 0, pe, false);
        let mut w = WorkRecord::new();
        let t = d
            .translate_request(&write_req(iova + 0x18), &mut w)
            .unwrap();
        assert_eq!(t.pa, PhysAddr::new(host + 0x30_0018));
        assert_eq!(t.page_size, SZ_4K);
        // 4 structure reads, 4 first-stage reads, and a 3-read second-stage walk for each
        // of the 4 table pointers and the output.
        assert_eq!(w.walk_reads, 4 + 4 + 5 * 3);
        // A second page under the same PT: the first-stage paging-structure caches hold
        // host addresses, so one first-stage read and one nested translation.
        write(
            &d,
            host + g_pt + idx(1) + 8,
            &[FlPte::leaf(0x30_1000, false, false)],
        );
        let mut w = WorkRecord::new();
        let t = d
            .translate_request(&read_req(iova + 0x1000), &mut w)
            .unwrap();
        assert_eq!(
            (t.pa, t.prot),
            (PhysAddr::new(host + 0x30_1000), Prot::READ)
        );
        assert_eq!(w.walk_reads, 1 + 3);
        // Output beyond the second stage's mapping → 0x79.
        write(
            &d,
            host + g_pt + idx(1) + 16,
            &[FlPte::leaf(0x4000_0000, true, false)],
        );
        let f = d
            .translate_request(&read_req(iova + 0x2000), &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_SL_NOT_PRESENT);
    }

    #[test]
    fn vtd_sm_pasid_cache_holds_the_old_entry_until_invalidated() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        let (a, b) = (page(&d), page(&d));
        build(
            &d,
            (a, 4),
            0x1000,
            1,
            FlPte::leaf(0xA000, true, false),
            FlPte::table,
        );
        build(
            &d,
            (b, 4),
            0x1000,
            1,
            FlPte::leaf(0xB000, true, false),
            FlPte::table,
        );
        sm_setup(&d, SID, 0, fs_entry(a, 5, 0), false);
        let go = |d: &Dmar| d.translate_request(&read_req(0x1000), &mut WorkRecord::new());
        assert_eq!(go(&d).unwrap().pa, PhysAddr::new(0xA000));
        assert_eq!(d.pasid_cache_len(), 1);
        // Repoint the PASID entry at table B (same DID). A PASID-IOTLB flush alone is not
        // enough: the PASID cache still says table A, and the walk refills from A.
        sm_setup(&d, SID, 0, fs_entry(b, 5, 0), false);
        let piotlb = InvDesc::PasidIotlb {
            did: 5,
            pasid: 0,
            granularity: PasidIotlbGranularity::AllOfPasid,
        };
        d.qi_submit_sync(&[piotlb], &mut WorkRecord::new()).unwrap();
        assert_eq!(go(&d).unwrap().pa, PhysAddr::new(0xA000));
        // A PASID-cache invalidation of another DID, or another PASID, changes nothing.
        for g in [
            (6, PcGranularity::Domain),
            (5, PcGranularity::Pasid { pasid: 1 }),
        ] {
            let pc = InvDesc::PasidCache {
                did: g.0,
                granularity: g.1,
            };
            d.qi_submit_sync(&[pc, piotlb], &mut WorkRecord::new())
                .unwrap();
            assert_eq!(go(&d).unwrap().pa, PhysAddr::new(0xA000));
        }
        // PASID-selective for (5, 0), then the PASID-IOTLB: table B.
        let pc = InvDesc::PasidCache {
            did: 5,
            granularity: PcGranularity::Pasid { pasid: 0 },
        };
        d.qi_submit_sync(&[pc, piotlb], &mut WorkRecord::new())
            .unwrap();
        assert_eq!(go(&d).unwrap().pa, PhysAddr::new(0xB000));
        let s = d.stats();
        assert_eq!(s.pasid_removed, 1);
        assert_eq!(s.descriptors[5], 3);
        // Domain-selective and global drop it too.
        for g in [PcGranularity::Domain, PcGranularity::Global] {
            go(&d).unwrap();
            assert_eq!(d.pasid_cache_len(), 1);
            let pc = InvDesc::PasidCache {
                did: 5,
                granularity: g,
            };
            d.qi_submit_sync(&[pc], &mut WorkRecord::new()).unwrap();
            assert_eq!(d.pasid_cache_len(), 0);
        }
    }

    #[test]
    fn vtd_sm_iotlb_is_tagged_by_pasid_and_stage() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        let root = page(&d);
        let leaf_at = build(
            &d,
            (root, 4),
            0x40_0000,
            1,
            FlPte::leaf(0xA000, true, false),
            FlPte::table,
        );
        // PASID 0 (RID_PASID) and PASID 1 share DID 5 and the table.
        sm_setup(&d, SID, 0, fs_entry(root, 5, 0), true);
        sm_setup(&d, SID, 1, fs_entry(root, 5, 0), true);
        let p1 = read_req(0x40_0000).with_pasid(1, false);
        let go = |r: &VtdRequest| d.translate_request(r, &mut WorkRecord::new()).unwrap().pa;
        assert_eq!(go(&read_req(0x40_0000)), PhysAddr::new(0xA000));
        assert_eq!(go(&p1), PhysAddr::new(0xA000));
        assert!(d.iotlb_probe_pasid(5, 0, Iova::new(0x40_0000)).is_some());
        assert!(d.iotlb_probe_pasid(5, 1, Iova::new(0x40_0000)).is_some());
        assert_eq!(d.iotlb_count(5), 2);
        // Change the leaf in memory; both PASIDs keep the old page from the IOTLB.
        write(&d, leaf_at, &[FlPte::leaf(0xC000, true, false)]);
        // An IOTLB (type 2) DSI of DID 5 reaches second-stage tags only: nothing changes.
        let dsi = InvDesc::Iotlb {
            granularity: IotlbGranularity::Domain { did: 5 },
            drain_reads: false,
            drain_writes: false,
        };
        d.qi_submit_sync(&[dsi], &mut WorkRecord::new()).unwrap();
        assert_eq!(go(&p1), PhysAddr::new(0xA000));
        // A page-selective PASID-IOTLB of PASID 1 (AM 1: 0x40_0000..0x40_2000, the
        // address's low bit ignored) drops PASID 1's entry only.
        let psi = InvDesc::PasidIotlb {
            did: 5,
            pasid: 1,
            granularity: PasidIotlbGranularity::Page {
                addr: 0x40_1000 & !0x1FFF,
                am: 1,
                ih: true,
            },
        };
        d.qi_submit_sync(&[psi], &mut WorkRecord::new()).unwrap();
        assert_eq!(go(&p1), PhysAddr::new(0xC000));
        assert_eq!(go(&read_req(0x40_0000)), PhysAddr::new(0xA000));
        // IH = 1 kept the paging-structure caches: PASID 1's refill read only the PT.
        let mut w = WorkRecord::new();
        let psi0 = InvDesc::PasidIotlb {
            did: 5,
            pasid: 0,
            granularity: PasidIotlbGranularity::Page {
                addr: 0x40_0000,
                am: 0,
                ih: true,
            },
        };
        d.qi_submit_sync(&[psi0], &mut WorkRecord::new()).unwrap();
        let t = d.translate_request(&read_req(0x40_0000), &mut w).unwrap();
        assert_eq!((t.pa, w.walk_reads), (PhysAddr::new(0xC000), 1));
        // A global IOTLB invalidation drops every tag.
        let glob = InvDesc::Iotlb {
            granularity: IotlbGranularity::Global,
            drain_reads: false,
            drain_writes: false,
        };
        d.qi_submit_sync(&[glob], &mut WorkRecord::new()).unwrap();
        assert_eq!(d.iotlb_count(5), 0);
        assert_eq!(d.pscache_count(5), 0);
    }

    #[test]
    fn vtd_sm_first_stage_domain_through_the_dma_api() {
        let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), alloc()).unwrap();
        let dom = strict_domain(&d, 2);
        assert_eq!((dom.stage(), dom.levels()), (VtdStage::First, 4));
        d.attach(SID, &dom, &mut WorkRecord::new()).unwrap();
        let ce = d.read_sm_context(SID).unwrap();
        assert!(ce.present && ce.paside && !ce.dte);
        assert_eq!((ce.pdts, ce.rid_pasid), (2, 0));

        let dev = Device::new(1, 64).unwrap();
        let m = dom
            .domain()
            .map_page(
                &dev,
                PhysAddr::new(0x12_3000),
                SZ_4K,
                Direction::FromDevice,
                0,
                &mut WorkRecord::new(),
            )
            .unwrap();
        let at = Iova::new(m.dma_addr().0);
        let mut w = WorkRecord::new();
        let t = d.translate(SID, at, Access::Write, &mut w).unwrap();
        assert_eq!(t.pa, PhysAddr::new(0x12_3000));
        assert_eq!(w.walk_reads, 8);
        // DMA_FROM_DEVICE maps write-only in the IOMMU sense; first stage makes it RW.
        let mut w = WorkRecord::new();
        dom.domain().unmap_page(m, 0, 0, &mut w).unwrap();
        // One PASID-based IOTLB descriptor and a wait.
        assert_eq!(w.commands_written, 2);
        let s = d.stats();
        assert_eq!(
            (s.descriptors[4], s.descriptors[1], s.descriptors[3]),
            (1, 0, 1)
        );
        assert!(d.iotlb_probe(2, at).is_none());
        let f = d
            .translate(SID, at, Access::Write, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_FL_NOT_PRESENT);

        // Detach clears the context entry and flushes the PASID cache.
        let mut w = WorkRecord::new();
        d.detach(SID, &mut w).unwrap();
        assert_eq!(d.pasid_cache_len(), 0);
        assert!(!d.read_sm_context(SID).is_some_and(|c| c.present));
        let f = d
            .translate(SID, at, Access::Read, &mut WorkRecord::new())
            .unwrap_err();
        assert_eq!(f.reason, reason::SM_CONTEXT_NOT_PRESENT);
    }

    /// A first-stage domain's words in memory follow the release's execute control: XD on
    /// every table entry and leaf in 6.2 and 6.10, NXE in the PASID entry in 6.10 only,
    /// neither in 6.12; the walk translates the same either way.
    #[test]
    fn vtd_sm_first_stage_domain_writes_the_release_s_xd_and_nxe() {
        use iolab_iommu::linux::DmaPathVariants;
        for (v, xd, nxe) in [
            ("6.2", true, false),
            ("6.10", true, true),
            ("6.12", false, false),
        ] {
            let exec = DmaPathVariants::for_kernel(v.parse().unwrap())
                .unwrap()
                .vtd_first_stage;
            let cfg = sm_config(VtdTranslation::ScalableFirstStage).with_fl_exec(exec);
            let d = Dmar::new(cfg, alloc()).unwrap();
            let dom = strict_domain(&d, 2);
            d.attach(SID, &dom, &mut WorkRecord::new()).unwrap();
            let dev = Device::new(1, 64).unwrap();
            let m = dom
                .domain()
                .map_page(
                    &dev,
                    PhysAddr::new(0x12_3000),
                    SZ_4K,
                    Direction::Bidirectional,
                    0,
                    &mut WorkRecord::new(),
                )
                .unwrap();
            let iova = m.dma_addr().0;
            // The PASID entry at RID_PASID 0: word 2 bit 5 is NXE.
            let ce = d.read_sm_context(SID).unwrap();
            let de = PasidDirEntry::decode(read(&d, ce.pasid_dir)).unwrap();
            let words: Vec<u64> = (0..8).map(|i| read(&d, de.table + 8 * i)).collect();
            let pe = PasidEntry::decode(words.clone().try_into().unwrap()).unwrap();
            assert_eq!((words[2] >> 5 & 1 == 1, pe.nxe), (nxe, nxe), "{v}");
            // Every entry on the walk, three tables and the leaf, has XD or not.
            let mut table = pe.flptptr;
            for level in (1..=4).rev() {
                let idx = (iova >> (12 + 9 * (level - 1))) & 511;
                let e = read(&d, table + 8 * idx);
                assert_eq!(e & spec::fl::XD != 0, xd, "{v} level {level}");
                table = e & spec::PTE_ADDR_MASK;
            }
            assert_eq!(table, 0x12_3000);
            let t = d
                .translate(SID, Iova::new(iova), Access::Write, &mut WorkRecord::new())
                .unwrap();
            assert_eq!(t.pa, PhysAddr::new(0x12_3000), "{v}");
        }
    }

    #[test]
    fn vtd_sm_second_stage_domain_with_caching_mode_flushes_on_attach_and_map() {
        let cfg = sm_config(VtdTranslation::ScalableSecondStage).caching_mode();
        let d = Dmar::new(cfg, alloc()).unwrap();
        let dom = strict_domain(&d, 3);
        assert_eq!(dom.stage(), VtdStage::Second);
        let mut w = WorkRecord::new();
        d.attach(SID, &dom, &mut w).unwrap();
        // Context-cache, PASID-cache, IOTLB DSI, wait.
        assert_eq!(w.commands_written, 4);
        let s = d.stats();
        assert_eq!(
            (s.descriptors[0], s.descriptors[5], s.descriptors[1]),
            (1, 1, 1)
        );
        let dev = Device::new(1, 64).unwrap();
        let m = dom
            .domain()
            .map_page(
                &dev,
                PhysAddr::new(0x5000),
                SZ_4K,
                Direction::ToDevice,
                0,
                &mut WorkRecord::new(),
            )
            .unwrap();
        let at = Iova::new(m.dma_addr().0);
        let mut raw = WorkRecord::new();
        // A DMA to the unmapped page after it leaves a negative entry (Caching Mode,
        // second stage), which hides a later map until the driver's flush.
        let next = Iova::new(at.get() + SZ_4K);
        assert!(d.translate(SID, next, Access::Read, &mut raw).is_err());
        assert_eq!(d.stats().negative_fills, 1);
        assert!(d
            .translate(SID, at, Access::Read, &mut WorkRecord::new())
            .is_ok());
        // sync_map flushes the range (PSI), dropping the negative entry.
        dom.sync_map(next, SZ_4K, &mut WorkRecord::new()).unwrap();
        assert!(d.iotlb_probe(3, next).is_none());
    }

    #[test]
    fn vtd_devtlb_keeps_translating_until_a_device_tlb_invalidation() {
        for t in [VtdTranslation::Legacy, VtdTranslation::ScalableFirstStage] {
            let d = Dmar::new(sm_config(t), alloc()).unwrap();
            let dom = strict_domain(&d, 2);
            d.attach_ats(SID, &dom, 16, &mut WorkRecord::new()).unwrap();
            if t == VtdTranslation::Legacy {
                let ce = d.read_context(SID).unwrap();
                assert_eq!(ce.tt, TranslationType::MultiLevelDevTlb);
            } else {
                assert!(d.read_sm_context(SID).unwrap().dte);
            }
            let dev = Device::new(1, 64).unwrap();
            let mut maps = Vec::new();
            for pa in [0x10_0000u64, 0x20_0000] {
                let m = dom
                    .domain()
                    .map_page(
                        &dev,
                        PhysAddr::new(pa),
                        SZ_4K,
                        Direction::Bidirectional,
                        0,
                        &mut WorkRecord::new(),
                    )
                    .unwrap();
                maps.push(m);
            }
            let ats = |i: &Iova| d.ats_translate(SID, *i, Access::Read, &mut WorkRecord::new());
            let at: Vec<Iova> = maps.iter().map(|m| Iova::new(m.dma_addr().0)).collect();
            ats(&at[0]).unwrap();
            ats(&at[1]).unwrap();
            assert_eq!(d.devtlb_len(SID), Some(2));
            let mut w = WorkRecord::new();
            let t2 = d.ats_translate(SID, at[0], Access::Read, &mut w).unwrap();
            assert_eq!(
                (t2.pa, w.walk_reads, w.translations),
                (PhysAddr::new(0x10_0000), 0, 0)
            );
            assert_eq!(d.stats().devtlb_hits, 1);

            // A raw IOTLB-only flush after a table change leaves the ATC translating.
            let glob = InvDesc::Iotlb {
                granularity: IotlbGranularity::Global,
                drain_reads: false,
                drain_writes: false,
            };
            d.qi_submit_sync(&[glob], &mut WorkRecord::new()).unwrap();
            assert_eq!(ats(&at[0]).unwrap().pa, PhysAddr::new(0x10_0000));
            // A device-TLB invalidation of another page (S = 0) keeps it; one whose
            // S-encoded range covers it drops it.
            let other = InvDesc::DeviceTlb {
                sid: SID,
                pfsid: SID,
                qdep: 0,
                addr: at[1].get(),
                size: false,
            };
            d.qi_submit_sync(&[other], &mut WorkRecord::new()).unwrap();
            assert_eq!(d.devtlb_len(SID), Some(1));
            let (addr, s) = spec::devtlb_addr(at[0].get(), 4);
            let cover = InvDesc::DeviceTlb {
                sid: SID,
                pfsid: SID,
                qdep: 0,
                addr,
                size: s,
            };
            // A PASID-based one (type 8) for PASID 3 does not touch untagged entries.
            let p8 = InvDesc::PasidDeviceTlb {
                sid: SID,
                pfsid: SID,
                qdep: 0,
                pasid: 3,
                global: true,
                addr: 0,
                size: false,
            };
            d.qi_submit_sync(&[p8], &mut WorkRecord::new()).unwrap();
            assert_eq!(d.devtlb_len(SID), Some(1));
            d.qi_submit_sync(&[cover], &mut WorkRecord::new()).unwrap();
            assert_eq!(d.devtlb_len(SID), Some(0));
            assert_eq!(d.stats().devtlb_removed, 2);

            // The strict unmap carries the device-TLB invalidation: IOTLB + devTLB + wait.
            ats(&at[1]).unwrap();
            let mut w = WorkRecord::new();
            dom.domain()
                .unmap_page(maps.remove(1), 0, 0, &mut w)
                .unwrap();
            assert_eq!(w.commands_written, 3);
            assert_eq!(d.devtlb_len(SID), Some(0));
            assert!(ats(&at[1]).is_err());
        }
    }

    /// A mapping for the property tests: page index, size class, writable.
    fn mapping() -> impl Strategy<Value = (u64, u8, bool)> {
        (0u64..64, 0u8..3, any::<bool>())
    }

    fn map_all(t: &mut VtdPageTable, maps: &[(u64, u8, bool)]) {
        for &(i, class, w) in maps {
            let size = [SZ_4K, SZ_2M, SZ_1G][class as usize];
            let iova = map_iova(i, class);
            let pa = (i + 1) * SZ_1G;
            let prot = if w { Prot::READ_WRITE } else { Prot::READ };
            // Overlaps are refused; both tables refuse the same ones.
            let _ = t.map(
                Iova::new(iova),
                PhysAddr::new(pa),
                size,
                prot,
                &mut WorkRecord::new(),
            );
        }
    }

    /// Where mapping `i` of size class `class` goes: 4 KiB and 2 MiB pages every 16 MiB
    /// below 1 GiB, 1 GiB pages from 2 GiB.
    fn map_iova(i: u64, class: u8) -> u64 {
        if class == 2 {
            (i % 8 + 2) * SZ_1G
        } else {
            i * 8 * SZ_2M
        }
    }

    /// The addresses to probe: every mapping's start and offsets in and after it, plus
    /// random ones (mostly misses).
    fn probes(maps: &[(u64, u8, bool)], extra: &[u64]) -> Vec<u64> {
        let mut v: Vec<u64> = extra.to_vec();
        for &(i, class, _) in maps {
            let base = map_iova(i, class);
            v.extend([base, base + 0x1234, base + SZ_4K, base + SZ_2M + 0x10]);
        }
        v
    }

    type Outcome = Result<(u64, u64, Prot), ()>;

    fn outcome(
        r: Result<iolab_iommu::vtd::DmarTranslation, iolab_iommu::vtd::DmarFault>,
    ) -> Outcome {
        r.map(|t| (t.pa.get(), t.page_size, t.prot)).map_err(|_| ())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn vtd_sm_second_stage_equals_legacy_over_the_same_table(
            maps in proptest::collection::vec(mapping(), 1..12),
            extra in proptest::collection::vec(0u64..1 << 40, 4),
        ) {
            let a = alloc();
            let legacy = Dmar::new(DmarConfig::cascade_lake(), a.clone()).unwrap();
            let sm = Dmar::new(sm_config(VtdTranslation::ScalableSecondStage), a.clone()).unwrap();
            let mut t = VtdPageTable::new(VtdTableConfig::second_stage(4), a).unwrap();
            map_all(&mut t, &maps);
            let root = t.root_pa().get();
            legacy
                .write_context(SID, &ContextEntry {
                    present: true,
                    fpd: false,
                    tt: TranslationType::MultiLevel,
                    slptptr: root,
                    aw: 2,
                    did: 3,
                })
                .unwrap();
            sm_setup(&sm, SID, 0, ss_entry(root, 3), false);
            let mut hits = 0;
            for p in probes(&maps, &extra) {
                for access in [Access::Read, Access::Write] {
                    // Twice: the walk, then the IOTLB.
                    for _ in 0..2 {
                        let l = outcome(legacy.translate(SID, Iova::new(p), access, &mut WorkRecord::new()));
                        let s = outcome(sm.translate(SID, Iova::new(p), access, &mut WorkRecord::new()));
                        hits += usize::from(s.is_ok());
                        prop_assert_eq!(l, s, "iova {:#x} {:?}", p, access);
                    }
                }
            }
            // Every mapping's first page translates for reads at least.
            prop_assert!(hits >= 2);
        }

        #[test]
        fn vtd_sm_first_and_second_stage_agree_on_the_same_mappings(
            maps in proptest::collection::vec(mapping(), 1..12),
            extra in proptest::collection::vec(0u64..1 << 40, 4),
        ) {
            let a = alloc();
            let d = Dmar::new(sm_config(VtdTranslation::ScalableFirstStage), a.clone()).unwrap();
            let mut fs = VtdPageTable::new(VtdTableConfig::first_stage(4, true), a.clone()).unwrap();
            let mut ss = VtdPageTable::new(VtdTableConfig::second_stage(4), a).unwrap();
            map_all(&mut fs, &maps);
            map_all(&mut ss, &maps);
            sm_setup(&d, SID, 0, fs_entry(fs.root_pa().get(), 1, 0), false);
            sm_setup(&d, SID_HI, 0, ss_entry(ss.root_pa().get(), 2), false);
            let mut hits = 0;
            for p in probes(&maps, &extra) {
                for access in [Access::Read, Access::Write] {
                    for _ in 0..2 {
                        let f = outcome(d.translate(SID, Iova::new(p), access, &mut WorkRecord::new()));
                        let s = outcome(d.translate(SID_HI, Iova::new(p), access, &mut WorkRecord::new()));
                        hits += usize::from(f.is_ok());
                        prop_assert_eq!(f, s, "iova {:#x} {:?}", p, access);
                    }
                }
            }
            prop_assert!(hits >= 2);
        }
    }
}

/// The lab's units (`hw::x86_path`): the same strict map / DMA / unmap loop on a legacy, a
/// scalable second-stage and a scalable first-stage unit.
mod vtd_sm_lab_units {
    use std::sync::Arc;

    use iolab_iommu::addr::{Access, Iova, PhysAddr, SZ_4G, SZ_4K};
    use iolab_iommu::dma::{Device, Direction, DomainConfig, DomainId, DomainMode};
    use iolab_iommu::hw::x86_path::{X86DevicePath, X86Unit};
    use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use iolab_iommu::mem::{PhysAllocator, PhysMemory};
    use iolab_iommu::vtd::{Dmar, VtdTranslation};
    use iolab_iommu::work::WorkRecord;

    /// Walk reads and descriptors of 2,000 DMAs, 32 mappings live.
    fn walk_reads(t: VtdTranslation) -> (u64, [u64; 7]) {
        let X86Unit::Vtd(cfg) = X86DevicePath::vtd_unit_in(false, t) else {
            unreachable!("a VT-d unit")
        };
        let mem = Arc::new(PhysMemory::new(256 << 20).unwrap());
        let a = PhysAllocator::new(mem, PhysAddr::new(128 << 20), PhysAddr::new(256 << 20));
        let d = Dmar::new(cfg, Arc::new(a.unwrap())).unwrap();
        let iovas = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G)));
        let dom = d
            .new_domain(
                2,
                DomainConfig::new(DomainId(1), DomainMode::Strict),
                Arc::new(iovas.unwrap()),
            )
            .unwrap();
        d.attach(0x100, &dom, &mut WorkRecord::new()).unwrap();
        let dev = Device::new(1, 64).unwrap();
        let mut w = WorkRecord::new();
        let mut live = std::collections::VecDeque::new();
        for i in 0..2000u64 {
            let pa = PhysAddr::new(0x10_0000 + (i % 64) * SZ_4K);
            let m = dom
                .domain()
                .map_page(
                    &dev,
                    pa,
                    SZ_4K,
                    Direction::FromDevice,
                    0,
                    &mut WorkRecord::new(),
                )
                .unwrap();
            let t = d
                .translate(0x100, Iova::new(m.dma_addr().0), Access::Write, &mut w)
                .unwrap();
            assert_eq!(t.pa, pa);
            live.push_back(m);
            if live.len() > 32 {
                let old = live.pop_front().unwrap();
                dom.domain()
                    .unmap_page(old, 0, 0, &mut WorkRecord::new())
                    .unwrap();
            }
        }
        (w.walk_reads, d.stats().descriptors)
    }

    #[test]
    fn vtd_walk_costs_follow_the_tables_in_each_translation_mode() {
        let (legacy, ld) = walk_reads(VtdTranslation::Legacy);
        let (ss, sd) = walk_reads(VtdTranslation::ScalableSecondStage);
        let (fs, fd) = walk_reads(VtdTranslation::ScalableFirstStage);
        // Same 4-level table and descriptors: scalable second stage reads the PASID
        // directory and table entries once (one context / PASID-cache miss) on top.
        assert_eq!(ss, legacy + 2);
        assert_eq!(sd, ld);
        // Each PSI (IH masked) drops the paging-structure caches: 4 reads per DMA, less
        // the first 32 (their caches still warm).
        assert!(legacy > 3 * 2000, "{legacy}");
        // First stage: the same unmaps as PASID-based descriptors (type 6) with IH = 1,
        // so the caches survive and a DMA reads about one entry.
        assert_eq!((fd[1], fd[4]), (0, ld[1]));
        assert!(fs < 2000 + 2000 / 4, "{fs}");
    }
}
