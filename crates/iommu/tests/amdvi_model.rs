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
}
