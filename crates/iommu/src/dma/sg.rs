//! Scatter-gather layout and merging, as Linux dma-iommu does it (`iommu_dma_map_sg` and
//! `__finalise_sg`), as pure functions.
//!
//! Mapping a list takes three steps:
//!
//! 1. [`sg_layout`]: every piece is widened to granule boundaries (keeping its offset within
//!    the first granule), and the widened pieces are laid out one after another in a single
//!    IOVA range. When the device has a segment boundary, a piece that would cross the next
//!    boundary is moved up to start on it (the gap is padding, never mapped).
//! 2. The caller allocates one IOVA range of [`SgLayout::iova_len`] bytes, size-aligned
//!    (which is what lets step 1 lay pieces out without knowing the base), and maps
//!    [`SgLayout::map_runs`].
//! 3. [`sg_finalise`]: pieces are merged into DMA segments. A piece joins the current segment
//!    when it starts on a granule boundary (offset 0), the segment so far ends exactly where
//!    the piece starts (the previous piece ended on its granule end and no padding follows),
//!    the piece does not start on a segment boundary, and the merged length stays within the
//!    device's maximum segment size.
//!
//! One deliberate difference from Linux: Linux compares `max_len - cur_len >= s_length` in
//! unsigned arithmetic, which wraps and merges when a single piece is already longer than the
//! maximum segment size; here a segment never grows past the maximum by merging.

use crate::addr::{DmaAddr, Iova, PhysAddr};

use super::DmaError;

/// One element of a scatter-gather list: a physically contiguous buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SgEntry {
    /// First byte of the buffer.
    pub pa: PhysAddr,
    /// Length in bytes (at least 1).
    pub len: u64,
}

impl SgEntry {
    /// An entry of `len` bytes at `pa`.
    pub const fn new(pa: PhysAddr, len: u64) -> Self {
        Self { pa, len }
    }
}

/// A DMA segment: what the driver writes into one hardware descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DmaSegment {
    /// Bus address of the first byte.
    pub dma: DmaAddr,
    /// Length in bytes.
    pub len: u64,
}

/// Where one list entry lands in the single IOVA range of a scatter-gather mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SgPiece {
    /// Offset of the piece's first granule from the start of the IOVA range.
    pub iova_offset: u64,
    /// Physical address of the piece's first granule (the entry's address aligned down).
    pub map_pa: PhysAddr,
    /// Bytes mapped for the piece: its offset plus length, rounded up to the granule.
    pub map_len: u64,
    /// Offset of the entry's first byte within its first granule.
    pub offset: u64,
    /// The entry's length.
    pub len: u64,
}

/// The layout of a scatter-gather list in one IOVA range, from [`sg_layout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SgLayout {
    /// One piece per list entry, in list order.
    pub pieces: Vec<SgPiece>,
    /// Bytes of IOVA space the list needs (a multiple of the granule).
    pub iova_len: u64,
    /// The granule the layout was computed for.
    pub granule: u64,
}

/// A run of the layout that is contiguous in both IOVA and physical space: one page-table
/// map call, which lets the table use larger pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRun {
    /// Offset of the run from the start of the IOVA range.
    pub iova_offset: u64,
    /// Physical address of the run.
    pub pa: PhysAddr,
    /// Length in bytes (a multiple of the granule).
    pub len: u64,
}

impl SgLayout {
    /// The runs to map: consecutive pieces merged while contiguous in IOVA and physical
    /// space. Padding is never mapped.
    pub fn map_runs(&self) -> Vec<MapRun> {
        let mut runs: Vec<MapRun> = Vec::with_capacity(self.pieces.len());
        for p in &self.pieces {
            if let Some(last) = runs.last_mut() {
                if last.iova_offset + last.len == p.iova_offset
                    && last.pa.get() + last.len == p.map_pa.get()
                {
                    last.len += p.map_len;
                    continue;
                }
            }
            runs.push(MapRun {
                iova_offset: p.iova_offset,
                pa: p.map_pa,
                len: p.map_len,
            });
        }
        runs
    }

    /// Number of IOVA pages the layout needs.
    pub fn pages(&self) -> u64 {
        self.iova_len / self.granule
    }
}

/// Lays `entries` out in one IOVA range with granule `granule` and the device's segment
/// boundary mask `boundary_mask` (`u64::MAX`: no boundary). See the module docs.
///
/// Errors: an empty list, an entry of length zero or wrapping the address space, a list
/// whose total does not fit in 64 bits, or a boundary smaller than the granule.
pub fn sg_layout(
    entries: &[SgEntry],
    granule: u64,
    boundary_mask: u64,
) -> Result<SgLayout, DmaError> {
    debug_assert!(granule.is_power_of_two());
    if entries.is_empty() {
        return Err(DmaError::EmptySgList);
    }
    if boundary_mask < granule - 1 {
        return Err(DmaError::SegmentBoundaryTooSmall {
            mask: boundary_mask,
            granule,
        });
    }
    let mut pieces = Vec::with_capacity(entries.len());
    let mut iova_len: u64 = 0;
    for (index, e) in entries.iter().enumerate() {
        let bad = DmaError::BadSgEntry {
            index,
            pa: e.pa.get(),
            len: e.len,
        };
        if e.len == 0 || e.pa.checked_add(e.len).is_none() {
            return Err(bad);
        }
        let offset = e.pa.offset_in(granule);
        let map_len = align_up(offset + e.len, granule).ok_or(bad)?;
        // Distance to the next segment boundary (0 when on one, or with no boundary at the
        // start). The whole range is size-aligned, so this is known before allocation.
        let pad = boundary_mask.wrapping_sub(iova_len).wrapping_add(1) & boundary_mask;
        // Linux writes `pad_len < s_length - 1`; both are granule multiples here.
        if pad != 0 && pad < map_len {
            iova_len = iova_len.checked_add(pad).ok_or(DmaError::SgTooLarge)?;
        }
        pieces.push(SgPiece {
            iova_offset: iova_len,
            map_pa: e.pa.align_down(granule),
            map_len,
            offset,
            len: e.len,
        });
        iova_len = iova_len.checked_add(map_len).ok_or(DmaError::SgTooLarge)?;
    }
    Ok(SgLayout {
        pieces,
        iova_len,
        granule,
    })
}

/// Merges a laid-out list mapped at `base` into DMA segments. See the module docs.
pub fn sg_finalise(
    layout: &SgLayout,
    base: Iova,
    max_segment_size: u64,
    boundary_mask: u64,
) -> Vec<DmaSegment> {
    let mut segments: Vec<DmaSegment> = Vec::new();
    // Length of the open segment; 0 when the next piece must start a new one.
    let mut cur_len: u64 = 0;
    for (i, p) in layout.pieces.iter().enumerate() {
        let start = base.get() + p.iova_offset;
        let merge = cur_len != 0
            && p.offset == 0
            && start & boundary_mask != 0
            && cur_len
                .checked_add(p.len)
                .is_some_and(|n| n <= max_segment_size);
        match (merge, segments.last_mut()) {
            (true, Some(seg)) => {
                cur_len += p.len;
                seg.len = cur_len;
            }
            _ => {
                segments.push(DmaSegment {
                    dma: DmaAddr(start + p.offset),
                    len: p.len,
                });
                cur_len = p.len;
            }
        }
        // The span of this piece includes any padding after it; a segment can only continue
        // when the data runs right up to the next piece.
        let next = layout
            .pieces
            .get(i + 1)
            .map_or(layout.iova_len, |n| n.iova_offset);
        if p.offset + p.len < next - p.iova_offset {
            cur_len = 0;
        }
    }
    segments
}

/// `v` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(v: u64, align: u64) -> Option<u64> {
    Some(v.checked_add(align - 1)? & !(align - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_16K, SZ_4K, SZ_64K};
    use proptest::prelude::*;

    const NO_BOUNDARY: u64 = u64::MAX;

    fn e(pa: u64, len: u64) -> SgEntry {
        SgEntry::new(PhysAddr::new(pa), len)
    }

    fn segs(entries: &[SgEntry], base: u64, max: u64, mask: u64) -> Vec<DmaSegment> {
        let l = sg_layout(entries, SZ_4K, mask).unwrap();
        sg_finalise(&l, Iova::new(base), max, mask)
    }

    fn seg(dma: u64, len: u64) -> DmaSegment {
        DmaSegment {
            dma: DmaAddr(dma),
            len,
        }
    }

    #[test]
    fn four_page_aligned_pages_merge_into_one_segment() {
        let list = [
            e(0x10000, 4096),
            e(0x50000, 4096),
            e(0x30000, 4096),
            e(0x90000, 4096),
        ];
        let s = segs(&list, 0x100000, SZ_64K, NO_BOUNDARY);
        assert_eq!(s, vec![seg(0x100000, 0x4000)]);
    }

    #[test]
    fn a_piece_with_an_offset_starts_a_new_segment() {
        let list = [e(0x10000, 4096), e(0x50010, 100), e(0x30000, 4096)];
        let s = segs(&list, 0x100000, SZ_64K, NO_BOUNDARY);
        // The second piece has an offset; it also ends short of its granule, so the third
        // starts a new segment as well.
        assert_eq!(
            s,
            vec![seg(0x100000, 4096), seg(0x101010, 100), seg(0x102000, 4096)]
        );
    }

    #[test]
    fn a_short_piece_ends_its_segment() {
        let list = [e(0x10000, 100), e(0x50000, 4096)];
        let s = segs(&list, 0x100000, SZ_64K, NO_BOUNDARY);
        assert_eq!(s, vec![seg(0x100000, 100), seg(0x101000, 4096)]);
    }

    #[test]
    fn an_offset_first_piece_running_to_its_granule_end_is_merged_with_the_next() {
        let list = [e(0x10800, 0x800), e(0x50000, 4096)];
        let s = segs(&list, 0x100000, SZ_64K, NO_BOUNDARY);
        assert_eq!(s, vec![seg(0x100800, 0x1800)]);
    }

    #[test]
    fn max_segment_size_splits_segments() {
        let list = [
            e(0x10000, 4096),
            e(0x20000, 4096),
            e(0x30000, 4096),
            e(0x40000, 4096),
        ];
        let s = segs(&list, 0x100000, 8192, NO_BOUNDARY);
        assert_eq!(s, vec![seg(0x100000, 8192), seg(0x102000, 8192)]);
    }

    #[test]
    fn segment_boundary_splits_and_pads() {
        // 20 pages with a 64K boundary: the IOVA range is size-aligned to 32 pages, so the
        // boundary falls after the 16th piece and a new segment starts there.
        let list: Vec<_> = (0..20).map(|i| e(0x100_0000 + i * 0x2000, 4096)).collect();
        let l = sg_layout(&list, SZ_4K, SZ_64K - 1).unwrap();
        assert_eq!(l.iova_len, 20 * SZ_4K);
        let s = sg_finalise(&l, Iova::new(0x20_0000), 1 << 20, SZ_64K - 1);
        assert_eq!(s, vec![seg(0x20_0000, SZ_64K), seg(0x21_0000, 4 * SZ_4K)]);
        // Without the boundary everything merges.
        let s = segs(&list, 0x20_0000, 1 << 20, NO_BOUNDARY);
        assert_eq!(s, vec![seg(0x20_0000, 20 * SZ_4K)]);
    }

    #[test]
    fn a_piece_that_would_cross_the_boundary_is_padded_up_to_it() {
        let list = [e(0x10000, 3 * 4096), e(0x50000, 2 * 4096)];
        let l = sg_layout(&list, SZ_4K, SZ_16K - 1).unwrap();
        assert_eq!(l.pieces[1].iova_offset, SZ_16K);
        assert_eq!(l.iova_len, SZ_16K + 2 * SZ_4K);
        let s = sg_finalise(&l, Iova::new(0x40000), SZ_64K, SZ_16K - 1);
        assert_eq!(s, vec![seg(0x40000, 3 * 4096), seg(0x44000, 2 * 4096)]);
        // Padding is not mapped.
        assert_eq!(l.map_runs().iter().map(|r| r.len).sum::<u64>(), 5 * SZ_4K);
    }

    #[test]
    fn physically_contiguous_pieces_map_in_one_run() {
        let list = [e(0x10000, 4096), e(0x11000, 4096), e(0x20000, 4096)];
        let l = sg_layout(&list, SZ_4K, NO_BOUNDARY).unwrap();
        let runs = l.map_runs();
        assert_eq!(runs.len(), 2);
        assert_eq!(
            runs[0],
            MapRun {
                iova_offset: 0,
                pa: PhysAddr::new(0x10000),
                len: 8192
            }
        );
    }

    #[test]
    fn errors_name_the_bad_entry() {
        assert_eq!(
            sg_layout(&[], SZ_4K, NO_BOUNDARY),
            Err(DmaError::EmptySgList)
        );
        assert_eq!(
            sg_layout(&[e(0, 1), e(0x1000, 0)], SZ_4K, NO_BOUNDARY),
            Err(DmaError::BadSgEntry {
                index: 1,
                pa: 0x1000,
                len: 0
            })
        );
        assert_eq!(
            sg_layout(&[e(u64::MAX - 10, 20)], SZ_4K, NO_BOUNDARY),
            Err(DmaError::BadSgEntry {
                index: 0,
                pa: u64::MAX - 10,
                len: 20
            })
        );
        let huge = [e(0, u64::MAX / 2), e(0, u64::MAX / 2), e(0, u64::MAX / 2)];
        assert_eq!(
            sg_layout(&huge, SZ_4K, NO_BOUNDARY),
            Err(DmaError::SgTooLarge)
        );
        assert_eq!(
            sg_layout(&[e(0, 1)], SZ_64K, SZ_4K - 1),
            Err(DmaError::SegmentBoundaryTooSmall {
                mask: SZ_4K - 1,
                granule: SZ_64K
            })
        );
    }

    // ---- Reference implementation: a direct, byte-position formulation. ----

    /// Places pieces one by one with a cursor, jumping to the next boundary when a piece
    /// would straddle one; returns each piece's absolute granule-aligned IOVA and the length.
    fn ref_place(entries: &[SgEntry], g: u64, mask: u64, base: u64) -> (Vec<u64>, u64) {
        let mut cursor = 0u64;
        let mut starts = Vec::new();
        for en in entries {
            let off = en.pa.get() % g;
            let span = (off + en.len).div_ceil(g) * g;
            if mask != u64::MAX {
                let b = mask + 1;
                let first_window = cursor / b;
                let last_window = (cursor + span - 1) / b;
                if cursor % b != 0 && first_window != last_window {
                    cursor = cursor.div_ceil(b) * b;
                }
            }
            starts.push(base + cursor);
            cursor += span;
        }
        (starts, cursor)
    }

    /// Segments: each piece's data lives at start+offset; a piece extends the previous
    /// segment when its data begins exactly where that segment's data ends, on a granule
    /// boundary that is not a segment boundary, and the sum stays within the maximum.
    fn ref_segments(
        entries: &[SgEntry],
        g: u64,
        mask: u64,
        max: u64,
        starts: &[u64],
    ) -> Vec<DmaSegment> {
        let mut out: Vec<DmaSegment> = Vec::new();
        for (en, &s) in entries.iter().zip(starts) {
            let off = en.pa.get() % g;
            let data = s + off;
            let joinable = out.last().is_some_and(|last| {
                last.dma.0 + last.len == data
                    && off == 0
                    && (mask == u64::MAX || data % (mask + 1) != 0)
                    && last.len + en.len <= max
            });
            if joinable {
                out.last_mut().unwrap().len += en.len;
            } else {
                out.push(DmaSegment {
                    dma: DmaAddr(data),
                    len: en.len,
                });
            }
        }
        out
    }

    fn arb_case() -> impl Strategy<Value = (Vec<SgEntry>, u64, u64, u64, u64)> {
        let granule = prop::sample::select(vec![SZ_4K, SZ_16K, SZ_64K]);
        granule.prop_flat_map(|g| {
            let entry = (
                0u64..64,
                0u64..g,
                prop_oneof![1u64..=64, Just(g), 1u64..=4 * g],
            )
                .prop_map(move |(page, off_sel, len)| {
                    // Half the entries are granule aligned, as real lists mostly are.
                    let off = if off_sel % 2 == 0 { 0 } else { off_sel };
                    let off = if off + len > 8 * g { 0 } else { off };
                    SgEntry::new(PhysAddr::new(page * 8 * g + off), len)
                });
            let mask = prop::sample::select(vec![
                u64::MAX,
                g - 1,
                2 * g - 1,
                SZ_64K.max(g) - 1,
                (1 << 20) - 1,
            ]);
            let max = prop::sample::select(vec![g, 2 * g, SZ_64K, 1 << 20, 3 * SZ_4K]);
            (
                prop::collection::vec(entry, 1..24),
                Just(g),
                mask,
                max,
                1u64..64,
            )
        })
    }

    proptest! {
        #[test]
        fn layout_and_merge_match_the_reference((list, g, mask, max, slot) in arb_case()) {
            let l = sg_layout(&list, g, mask).unwrap();
            // A size-aligned base, as the allocator hands out for this many pages.
            let align = l.pages().next_power_of_two() * g;
            let base = slot * align;
            let (starts, total) = ref_place(&list, g, mask, base);
            prop_assert_eq!(l.iova_len, total);
            let got: Vec<u64> = l.pieces.iter().map(|p| base + p.iova_offset).collect();
            prop_assert_eq!(&got, &starts);
            let segs = sg_finalise(&l, Iova::new(base), max, mask);
            prop_assert_eq!(segs, ref_segments(&list, g, mask, max, &starts));
        }

        #[test]
        fn segments_respect_device_limits_when_pieces_do((list, g, mask, max, slot) in arb_case()) {
            let l = sg_layout(&list, g, mask).unwrap();
            let base = slot * l.pages().next_power_of_two() * g;
            let segs = sg_finalise(&l, Iova::new(base), max, mask);
            let data: u64 = list.iter().map(|e| e.len).sum();
            prop_assert_eq!(segs.iter().map(|s| s.len).sum::<u64>(), data);
            for (i, s) in segs.iter().enumerate() {
                // A merged segment never exceeds the maximum.
                let single = list.iter().any(|e| e.len == s.len);
                prop_assert!(s.len <= max || single, "segment {} too long", i);
                // Pieces that fit a boundary window never straddle one, and merging never
                // crosses one.
                if mask != u64::MAX && list.iter().all(|e| e.pa.offset_in(g) + e.len <= mask + 1) {
                    prop_assert_eq!(s.dma.0 / (mask + 1), (s.dma.0 + s.len - 1) / (mask + 1));
                }
            }
            let mapped: u64 = l.map_runs().iter().map(|r| r.len).sum();
            prop_assert_eq!(mapped, l.pieces.iter().map(|p| p.map_len).sum::<u64>());
        }
    }
}
