//! HP zx1 SBA model: bypass, batched purges, and scatter-gather virtual merging, through
//! the platform-neutral `DmaPath` trait. Tests live in `mod hw` so `cargo test hw` runs them.

mod common;

mod hw {
    use crate::common::map_to_device;
    use iolab_iommu::addr::{Access, DmaAddr, PhysAddr, SZ_1G, SZ_4K};
    use iolab_iommu::dma::{Device, Direction, DmaError, DomainId, PhysRange, SgEntry};
    use iolab_iommu::hw::sba::{coalesce_chunks, SbaIommu, SbaIommuConfig};
    use iolab_iommu::hw::{DmaPath, MappedBuffer};
    use iolab_iommu::iova::IovaAllocator;
    use iolab_iommu::work::{LockId, WorkRecord};
    use proptest::prelude::*;

    const P: u64 = SZ_4K;

    fn sba(f: impl FnOnce(&mut SbaIommuConfig)) -> SbaIommu {
        let mut c = SbaIommuConfig::new(DomainId(1), SZ_1G, SZ_1G, P);
        f(&mut c);
        SbaIommu::new(c).unwrap()
    }

    fn dev32() -> Device {
        Device::new(1, 32).unwrap()
    }

    fn page(i: u64) -> SgEntry {
        // Scattered 4 KiB pages above 4 GiB (a 32-bit device cannot bypass for them).
        SgEntry::new(PhysAddr::new(0x1_0000_0000 + i * 0x10_0000), P)
    }

    fn segments(s: &SbaIommu, list: &[SgEntry], dev: &Device) -> Vec<u64> {
        let mut w = WorkRecord::new();
        let m = s.map_sg(dev, list, Direction::ToDevice, 0, &mut w).unwrap();
        let lens = m.segments().iter().map(|g| g.len).collect();
        s.unmap_sg(m, 0, 0, &mut w).unwrap();
        lens
    }

    #[test]
    fn bypass_gives_the_physical_address_and_no_pdir_entries() {
        let s = sba(|_| {});
        let dev = Device::new(1, 64).unwrap();
        let mut w = WorkRecord::new();
        let b = map_to_device(&s, &dev, 0x3_0000_0000, 3 * P, 0, &mut w).unwrap();
        assert_eq!(b.dma_addr(), DmaAddr(0x3_0000_0000));
        assert_eq!((w.ptes_written, w.bitmap_words_scanned), (0, 0));
        assert_eq!(w.lock_count(LockId::SbaResource), 0);
        assert_eq!(s.pdir_entries_in_use(), 0);
        let mut w = WorkRecord::new();
        let r = s
            .translate(&dev, b.dma_addr(), 3 * P, Access::Read, &mut w)
            .unwrap();
        assert_eq!(
            r,
            vec![PhysRange {
                pa: PhysAddr::new(0x3_0000_0000),
                len: 3 * P
            }]
        );
        assert_eq!((w.pte_reads, w.walk_reads), (0, 0));
        s.unmap_single(b, 0, 0, &mut w).unwrap();
        assert_eq!(s.stats().bypass_maps, 1);
        assert_eq!(s.stats().queued, 0, "a bypassed unmap queues nothing");
    }

    #[test]
    fn a_buffer_straddling_the_mask_is_translated() {
        let s = sba(|_| {});
        let mut w = WorkRecord::new();
        let b = map_to_device(&s, &dev32(), 0xffff_f000, 2 * P, 0, &mut w).unwrap();
        assert!(!b.is_untranslated());
        assert_eq!(w.ptes_written, 2);
        s.unmap_single(b, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn purge_happens_at_the_64th_free_with_one_read_back() {
        let s = sba(|_| {});
        let dev = dev32();
        let mut w = WorkRecord::new();
        let bufs: Vec<MappedBuffer> = (0..64)
            .map(|i| {
                s.map_single(&dev, page(i).pa, P, Direction::ToDevice, 0, &mut w)
                    .unwrap()
            })
            .collect();
        assert_eq!(s.resource_map().live_blocks(), 64);
        let mut bufs = bufs.into_iter();
        let mut w = WorkRecord::new();
        for b in bufs.by_ref().take(63) {
            s.unmap_single(b, 0, 0, &mut w).unwrap();
        }
        assert_eq!((w.purges, w.mmio_writes, w.mmio_reads), (0, 0, 0));
        assert_eq!(w.ptes_cleared, 63, "pdir entries are cleared at unmap");
        assert_eq!(
            s.resource_map().live_blocks(),
            64,
            "bits held until the purge"
        );
        assert_eq!(s.stats().queued, 63);
        let mut w = WorkRecord::new();
        s.unmap_single(bufs.next().unwrap(), 0, 0, &mut w).unwrap();
        assert_eq!((w.purges, w.mmio_writes, w.mmio_reads), (1, 64, 1));
        assert_eq!(s.resource_map().live_blocks(), 0);
        assert_eq!(s.stats().queued, 0);
        assert_eq!((s.stats().purges, s.stats().purged_ranges), (1, 64));
    }

    /// A window of 64 pages: page 0 is reserved, so 63 single-page mappings fill it.
    fn tiny() -> SbaIommu {
        sba(|c| {
            c.iova_size = 64 * P;
            c.iova_base = SZ_1G;
            c.chunk_size = 32 * P;
        })
    }

    #[test]
    fn queued_ranges_are_not_reused_before_their_purge() {
        let s = tiny();
        let dev = dev32();
        let mut w = WorkRecord::new();
        let mut bufs: Vec<MappedBuffer> = (0..62)
            .map(|i| {
                s.map_single(&dev, page(i).pa, P, Direction::ToDevice, 0, &mut w)
                    .unwrap()
            })
            .collect();
        let freed = bufs.remove(10);
        let freed_dma = freed.dma_addr();
        s.unmap_single(freed, 0, 0, &mut w).unwrap();
        // One page is free and one is queued: the new mapping takes the free one.
        let b = s
            .map_single(&dev, page(100).pa, P, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_ne!(b.dma_addr(), freed_dma);
        assert_eq!(s.stats().forced_purges, 0);
        bufs.push(b);
        // Now the window is full except for the queued page: the next allocation purges
        // the queue (one read-back) and retries, as Linux does.
        let mut w = WorkRecord::new();
        let b = s
            .map_single(&dev, page(101).pa, P, Direction::ToDevice, 0, &mut w)
            .unwrap();
        assert_eq!(b.dma_addr(), freed_dma);
        assert_eq!((w.purges, w.mmio_writes, w.mmio_reads), (1, 1, 1));
        assert_eq!(s.stats().forced_purges, 1);
        bufs.push(b);
        // Full, nothing queued: exhausted.
        let e = s
            .map_single(&dev, page(102).pa, P, Direction::ToDevice, 0, &mut w)
            .unwrap_err();
        assert!(matches!(e, DmaError::IovaSpace { .. }));
        for b in bufs {
            s.unmap_single(b, 0, 0, &mut w).unwrap();
        }
        s.purge_all(&mut w);
        assert_eq!(s.resource_map().live_blocks(), 0);
        assert_eq!(s.pdir_entries_in_use(), 0);
    }

    #[test]
    fn eight_page_aligned_pieces_are_one_segment_with_merge_and_eight_without() {
        let list: Vec<_> = (0..8).map(page).collect();
        let on = sba(|_| {});
        assert_eq!(segments(&on, &list, &dev32()), vec![8 * P]);
        let off = sba(|c| c.merge = false);
        assert_eq!(segments(&off, &list, &dev32()), vec![P; 8]);
    }

    #[test]
    fn a_piece_with_an_offset_breaks_the_stream() {
        let mut list: Vec<_> = (0..8).map(page).collect();
        list[4] = SgEntry::new(PhysAddr::new(0x2_0000_0200), P - 0x200);
        let s = sba(|_| {});
        // Pieces 0-3 merge; piece 4 starts mid-page; it ends on a page boundary, so 5-7 join it.
        assert_eq!(segments(&s, &list, &dev32()), vec![4 * P, 4 * P - 0x200]);
        // A piece ending mid-page stops the next one from joining.
        list[4] = SgEntry::new(PhysAddr::new(0x2_0000_0000), P - 0x200);
        assert_eq!(segments(&s, &list, &dev32()), vec![5 * P - 0x200, 3 * P]);
    }

    #[test]
    fn max_segment_size_and_chunk_size_cap_a_stream() {
        let list: Vec<_> = (0..8).map(page).collect();
        let s = sba(|_| {});
        let dev = dev32().with_max_segment_size(3 * P).unwrap();
        assert_eq!(segments(&s, &list, &dev), vec![3 * P, 3 * P, 2 * P]);
        let list: Vec<_> = (0..70).map(page).collect();
        let dev = dev32().with_max_segment_size(1 << 30).unwrap();
        assert_eq!(segments(&s, &list, &dev), vec![64 * P, 6 * P]);
        // The default 64 KiB maximum segment size caps first.
        assert_eq!(
            segments(&s, &list, &dev32()),
            vec![16 * P; 4]
                .into_iter()
                .chain([6 * P])
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn merged_streams_translate_back_to_every_piece() {
        let s = sba(|_| {});
        let list = [
            SgEntry::new(PhysAddr::new(0x1_0000_0400), 0xc00),
            SgEntry::new(PhysAddr::new(0x1_0004_0000), 2 * P),
            SgEntry::new(PhysAddr::new(0x1_0002_0000), 0x80),
        ];
        let dev = dev32();
        let mut w = WorkRecord::new();
        let m = s
            .map_sg(&dev, &list, Direction::FromDevice, 0, &mut w)
            .unwrap();
        assert_eq!(m.segment_count(), 1);
        let seg = m.segments()[0];
        let r = s
            .translate(&dev, seg.dma, seg.len, Access::Write, &mut w)
            .unwrap();
        let want: Vec<_> = list
            .iter()
            .map(|e| PhysRange {
                pa: e.pa,
                len: e.len,
            })
            .collect();
        assert_eq!(r, want);
        s.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(s.live_mappings(), 0);
    }

    fn arb_list() -> impl Strategy<Value = Vec<SgEntry>> {
        // Pages from a small pool (so contiguity happens), random offsets and lengths.
        prop::collection::vec((0u64..24, 0u64..3, 1u64..3 * P), 1..24).prop_map(|v| {
            v.into_iter()
                .map(|(pg, off_kind, len)| {
                    let off = match off_kind {
                        0 => 0,
                        1 => 0x200,
                        _ => P - 0x100,
                    };
                    SgEntry::new(PhysAddr::new(0x1_0000_0000 + pg * P + off), len)
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every segment translates back to exactly its pieces, the plan obeys its limits,
        /// and everything is released after a purge.
        #[test]
        fn sg_mappings_round_trip(list in arb_list(), merge in any::<bool>(), max_seg in prop::sample::select(vec![P, 16 * P, 1 << 30])) {
            let s = sba(|c| c.merge = merge);
            let dev = dev32().with_max_segment_size(max_seg).unwrap();
            let plan = coalesce_chunks(&list, &s.coalesce_params(&dev)).unwrap();
            let mut w = WorkRecord::new();
            let m = s.map_sg(&dev, &list, Direction::ToDevice, 0, &mut w).unwrap();
            if list.len() > 1 {
                prop_assert_eq!(m.segment_count(), plan.len());
            }
            if !merge {
                prop_assert_eq!(m.segment_count(), list.len());
            }
            let mut next = 0;
            for (i, seg) in m.segments().iter().enumerate() {
                if list.len() > 1 {
                    let st = &plan[i];
                    prop_assert_eq!(st.first, next);
                    prop_assert!(st.entries == 1 || st.len <= max_seg);
                    prop_assert!(st.pages <= 64);
                    next += st.entries;
                }
                let got = s.translate(&dev, seg.dma, seg.len, Access::Read, &mut w).unwrap();
                let total: u64 = got.iter().map(|r| r.len).sum();
                prop_assert_eq!(total, seg.len);
            }
            // The concatenation of all translations is the list itself.
            let mut all: Vec<PhysRange> = Vec::new();
            for seg in m.segments() {
                for r in s.translate(&dev, seg.dma, seg.len, Access::Read, &mut w).unwrap() {
                    match all.last_mut() {
                        Some(l) if l.pa.get() + l.len == r.pa.get() => l.len += r.len,
                        _ => all.push(r),
                    }
                }
            }
            let mut want: Vec<PhysRange> = Vec::new();
            for e in &list {
                match want.last_mut() {
                    Some(l) if l.pa.get() + l.len == e.pa.get() => l.len += e.len,
                    _ => want.push(PhysRange { pa: e.pa, len: e.len }),
                }
            }
            prop_assert_eq!(all, want);
            s.unmap_sg(m, 0, 0, &mut w).unwrap();
            s.purge_all(&mut w);
            prop_assert_eq!(s.resource_map().live_blocks(), 0);
            prop_assert_eq!(s.pdir_entries_in_use(), 0);
        }
    }
}
