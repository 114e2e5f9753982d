//! The HP zx1 SBA resource-map allocator (`arch/ia64/hp/common/sba_iommu.c`), rebuilt from its
//! design.
//!
//! One bit per IOMMU page of the IOVA window in a resource map, behind one lock
//! ([`LockId::SbaResource`]). Request sizes are rounded up to a power of two (the hardware
//! purges the IOTLB in power-of-two ranges, so blocks are allocated that way) and blocks are
//! naturally aligned. The search (`sba_search_bitmap`) starts at a hint (`res_hint`, a word of
//! the map, plus `res_bitshift` inside it) and runs to the end of the map; if that fails, a
//! second search covers the whole map from its start (`sba_alloc_range`), so the search is
//! circular and wraps once. A failed search resets the hint to the start.
//!
//! - one page: the first clear bit of the first word that is not full (the bit offset of the
//!   hint is not used, as in Linux);
//! - up to 32 pages: naturally aligned slots inside each word, starting in the hint word at
//!   the hint's bit offset rounded up to the alignment;
//! - 64 pages or more: runs of whole zero words. Linux steps one word at a time, so such blocks
//!   are only 64-page aligned there; here the start word is aligned to the block size, so every
//!   block is naturally aligned.
//!
//! After a success the hint is the word where the block ends and the bit offset is just past
//! it. Bit 0 is reserved (never handed out), as Linux marks the first page busy.
//!
//! The window start must be a multiple of the window size (the hardware's IBASE is aligned
//! to the IOVA space), so natural alignment inside the window is alignment of the IOVA.
//! Linux's SBA takes no device limit (its window sits below 4 GiB); here a request's limit
//! confines the search to the bits below it.
//!
//! `bitmap_words_scanned` counts the 64-bit words examined. Frees must name a block exactly as
//! allocated (a second bitmap marks block starts); anything else returns
//! [`IovaError::NotAllocated`] and changes nothing. Linux delays frees in batches before a
//! purge; that batching belongs to the DMA layer here.

use crate::addr::Iova;
use crate::iova::linux::IovaConfigError;
use crate::iova::power::BlockMap;
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Smallest IOMMU page size accepted.
pub const MIN_SBA_PAGE: u64 = 1 << 12;
/// Largest IOMMU page size accepted (the SBA uses `min(PAGE_SIZE, 64 KiB)`).
pub const MAX_SBA_PAGE: u64 = 1 << 16;
/// Most pages a window may have.
pub const MAX_SBA_PAGES: u64 = 1 << 28;

/// Configuration of an [`SbaResourceAllocator`]: the IOVA window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SbaConfig {
    /// First IOVA of the window (IBASE), a multiple of `window_size`.
    pub window_start: Iova,
    /// Window size in bytes: a power of two of at least 64 pages.
    pub window_size: u64,
    /// IOMMU page size ([`MIN_SBA_PAGE`]..=[`MAX_SBA_PAGE`], a power of two).
    pub page_size: u64,
}

#[derive(Debug)]
struct State {
    /// `res_hint`: the word to start the next search at.
    hint: u64,
    /// `res_bitshift`: the bit inside it.
    bitshift: u64,
}

/// The SBA resource-map allocator. See the module docs.
#[derive(Debug)]
pub struct SbaResourceAllocator {
    page: u64,
    page_shift: u32,
    /// First page number of the window.
    offset: u64,
    /// Pages in the window.
    pages: u64,
    bits: BlockMap,
    state: Mutex<State>,
    live: AtomicUsize,
}

impl SbaResourceAllocator {
    /// Builds an empty resource map for the configured window.
    pub fn new(config: SbaConfig) -> Result<Self, IovaConfigError> {
        let page = config.page_size;
        if !page.is_power_of_two() || !(MIN_SBA_PAGE..=MAX_SBA_PAGE).contains(&page) {
            return Err(IovaConfigError::BadPageSize {
                size: page,
                min: MIN_SBA_PAGE,
                max: MAX_SBA_PAGE,
            });
        }
        let pages = config.window_size / page;
        if !config.window_size.is_power_of_two() || !(64..=MAX_SBA_PAGES).contains(&pages) {
            return Err(IovaConfigError::OutOfBounds {
                field: "window pages (a power of two)",
                value: pages,
                min: 64,
                max: MAX_SBA_PAGES,
            });
        }
        let start = config.window_start.get();
        if start % config.window_size != 0 || start.checked_add(config.window_size).is_none() {
            return Err(IovaConfigError::Unaligned {
                field: "window_start",
                value: start,
                page: config.window_size,
            });
        }
        let bits = BlockMap::new(pages);
        // No IOVA 0: the first page is busy for good.
        bits.map.set_range(0, 1);
        Ok(Self {
            page,
            page_shift: page.trailing_zeros(),
            offset: start / page,
            pages,
            bits,
            state: Mutex::new(State {
                hint: 0,
                bitshift: 0,
            }),
            live: AtomicUsize::new(0),
        })
    }

    /// The current hint as `(word, bit)`.
    pub fn hint(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.hint, st.bitshift)
    }

    /// Word `wi` of the resource map, counted as scanned.
    #[inline]
    fn word(&self, wi: u64, w: &mut WorkRecord) -> u64 {
        w.bitmap_words_scanned += 1;
        self.bits.map.load_word(wi)
    }

    /// `sba_search_bitmap`: finds and claims `n` (a power of two) pages below `limit` bits.
    fn search(
        &self,
        st: &mut State,
        n: u64,
        use_hint: bool,
        limit: u64,
        w: &mut WorkRecord,
    ) -> Option<u64> {
        let words = self.pages / 64;
        let mut wi = if use_hint {
            st.hint
        } else {
            st.bitshift = 0;
            0
        };
        let found = if n == 1 {
            let mut found = None;
            while wi < words && wi * 64 < limit {
                let word = self.word(wi, w);
                if word != !0 {
                    let pos = wi * 64 + u64::from((!word).trailing_zeros());
                    if pos < limit {
                        st.bitshift = pos % 64 + 1;
                        found = Some(pos);
                    }
                    break;
                }
                wi += 1;
            }
            found
        } else if n <= 32 {
            let mut shift = st.bitshift.div_ceil(n) * n;
            let mut found = None;
            'words: while wi < words && wi * 64 < limit {
                let word = self.word(wi, w);
                while shift + n <= 64 {
                    let pos = wi * 64 + shift;
                    if pos + n > limit {
                        break 'words;
                    }
                    let mask = ((1u64 << n) - 1) << shift;
                    if word & mask == 0 {
                        st.bitshift = shift + n;
                        found = Some(pos);
                        break 'words;
                    }
                    shift += n;
                }
                shift = 0;
                wi += 1;
            }
            found
        } else {
            let q = n / 64;
            wi = wi.div_ceil(q) * q;
            let mut found = None;
            'runs: while wi + q <= words && wi * 64 + n <= limit {
                for i in 0..q {
                    if self.word(wi + i, w) != 0 {
                        wi += q;
                        continue 'runs;
                    }
                }
                found = Some(wi * 64);
                st.bitshift = 0;
                break;
            }
            found
        };
        match found {
            Some(pos) => {
                self.bits.claim(pos, n);
                st.hint = (pos + n - 1) / 64 + u64::from(n >= 64);
                Some(pos)
            }
            None => {
                st.hint = 0;
                st.bitshift = 0;
                None
            }
        }
    }
}

impl IovaAllocator for SbaResourceAllocator {
    fn name(&self) -> &'static str {
        "sba"
    }

    fn granule(&self) -> u64 {
        self.page
    }

    fn range(&self) -> (Iova, Iova) {
        (
            Iova::new((self.offset + 1) << self.page_shift),
            Iova::new((self.offset + self.pages) << self.page_shift),
        )
    }

    fn alloc(&self, req: AllocRequest, work: &mut WorkRecord) -> Result<IovaBlock, IovaError> {
        if req.pages == 0 || req.pages > self.pages / 2 {
            work.alloc_failures += 1;
            return Err(IovaError::BadSize { pages: req.pages });
        }
        let n = req.pages.next_power_of_two();
        let limit_page = req.limit.get() >> self.page_shift;
        let limit = limit_page.saturating_sub(self.offset).min(self.pages);
        if limit <= 1 {
            work.alloc_failures += 1;
            return Err(IovaError::LimitTooLow {
                limit: req.limit.get(),
                start: (self.offset + 1) << self.page_shift,
            });
        }
        work.lock(LockId::SbaResource);
        let mut st = self.state.lock();
        let pos = match self.search(&mut st, n, true, limit, work) {
            Some(p) => Some(p),
            None => self.search(&mut st, n, false, limit, work),
        };
        match pos {
            Some(p) => {
                self.live.fetch_add(1, Ordering::Relaxed);
                Ok(IovaBlock {
                    start: Iova::new((self.offset + p) << self.page_shift),
                    pages: n,
                })
            }
            None => {
                work.alloc_failures += 1;
                Err(IovaError::Exhausted {
                    pages: n,
                    limit: req.limit.get(),
                })
            }
        }
    }

    fn free(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError> {
        let _ = cpu;
        let err = IovaError::NotAllocated {
            start: block.start.get(),
            pages: block.pages,
        };
        let s = block.start.get();
        if s & (self.page - 1) != 0 || block.pages == 0 {
            return Err(err);
        }
        let Some(p) = (s >> self.page_shift).checked_sub(self.offset) else {
            return Err(err);
        };
        if p == 0 || p >= self.pages || block.pages > self.pages - p {
            return Err(err);
        }
        work.lock(LockId::SbaResource);
        let _st = self.state.lock();
        if !self.bits.is_block(p, block.pages) {
            return Err(err);
        }
        self.bits.release(p, block.pages);
        self.live.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    fn live_blocks(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_4G, SZ_4K};
    use crate::iova::test_support::assert_bad_frees_refused;

    const P: u64 = SZ_4K;

    /// A window of `pages` 4 KiB pages at 0.
    fn sba(pages: u64) -> SbaResourceAllocator {
        let cfg = SbaConfig {
            window_start: Iova::new(0),
            window_size: pages * P,
            page_size: P,
        };
        SbaResourceAllocator::new(cfg).unwrap()
    }

    fn req(pages: u64) -> AllocRequest {
        AllocRequest::new(pages, Iova::new(SZ_4G), 0)
    }

    fn page(b: IovaBlock) -> u64 {
        b.start.get() / P
    }

    #[test]
    fn bit_zero_is_never_handed_out() {
        let a = sba(64);
        let mut w = WorkRecord::new();

        let got: Vec<_> = std::iter::from_fn(|| a.alloc(req(1), &mut w).ok()).collect();

        assert_eq!(got.len(), 63);
        assert!(got.iter().all(|b| b.start.get() != 0));
    }

    #[test]
    fn sizes_round_up_to_a_power_of_two_and_align_naturally() {
        let a = sba(1024);
        let mut w = WorkRecord::new();
        a.alloc(req(1), &mut w).unwrap();

        let b = a.alloc(req(3), &mut w).unwrap();
        let big = a.alloc(req(100), &mut w).unwrap();

        assert_eq!(b.pages, 4);
        assert_eq!(page(b) % 4, 0);
        assert_eq!(big.pages, 128);
        assert_eq!(page(big) % 128, 0);
    }

    #[test]
    fn search_continues_from_the_hint() {
        let a = sba(1024);
        let mut w = WorkRecord::new();
        let b1 = a.alloc(req(4), &mut w).unwrap(); // 4..8, hint bit 8
        a.free(b1, 0, &mut w).unwrap();

        let b2 = a.alloc(req(4), &mut w).unwrap();

        // Not back at 4: the hint has moved past it.
        assert_eq!((page(b1), page(b2)), (4, 8));
        assert_eq!(a.hint(), (0, 12));
    }

    #[test]
    fn search_wraps_once_to_the_start() {
        let a = sba(128);
        let mut w = WorkRecord::new();
        let first = a.alloc(req(32), &mut w).unwrap(); // 32..64
        let second = a.alloc(req(32), &mut w).unwrap(); // 64..96
        let third = a.alloc(req(32), &mut w).unwrap(); // 96..128, hint at word 1 bit 64
        a.free(first, 0, &mut w).unwrap();

        let again = a.alloc(req(32), &mut w).unwrap();

        assert_eq!((page(first), page(second), page(third)), (32, 64, 96));
        assert_eq!(again, first);
    }

    #[test]
    fn failure_resets_the_hint() {
        let a = sba(64);
        let mut w = WorkRecord::new();
        a.alloc(req(32), &mut w).unwrap();

        let r = a.alloc(req(32), &mut w);

        assert!(matches!(r, Err(IovaError::Exhausted { pages: 32, .. })));
        assert_eq!(a.hint(), (0, 0));
        assert_eq!(w.lock_count(LockId::SbaResource), 2);
    }

    #[test]
    fn words_scanned_are_counted() {
        let a = sba(1024);
        let mut w = WorkRecord::new();

        a.alloc(req(256), &mut w).unwrap();

        // Words 0..4 hold bit 0, so the first run is words 4..8.
        assert_eq!(w.bitmap_words_scanned, 1 + 4);
    }

    #[test]
    fn limit_confines_the_search() {
        let a = sba(1024);
        let mut w = WorkRecord::new();
        let lim = Iova::new(40 * P);

        let got: Vec<_> =
            std::iter::from_fn(|| a.alloc(AllocRequest::new(8, lim, 0), &mut w).ok()).collect();

        assert_eq!(
            got.iter().map(|b| page(*b)).collect::<Vec<_>>(),
            vec![8, 16, 24, 32]
        );
    }

    #[test]
    fn bad_frees_are_rejected_and_change_nothing() {
        let a = sba(1024);
        let mut w = WorkRecord::new();
        let b = a.alloc(req(4), &mut w).unwrap();
        let c = a.alloc(req(4), &mut w).unwrap();
        a.free(b, 0, &mut w).unwrap();

        let bad = [
            b,
            IovaBlock {
                start: c.start,
                pages: 3,
            },
            IovaBlock {
                start: c.start,
                pages: 8,
            },
            IovaBlock {
                start: Iova::new(0),
                pages: 1,
            },
            IovaBlock {
                start: Iova::new(1024 * P),
                pages: 1,
            },
        ];
        assert_bad_frees_refused(&a, &bad, &mut w);
        a.free(c, 0, &mut w).unwrap();
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn zero_pages_oversize_and_too_low_limits_are_rejected() {
        let a = sba(64);
        let mut w = WorkRecord::new();

        assert_eq!(
            a.alloc(req(0), &mut w),
            Err(IovaError::BadSize { pages: 0 })
        );
        assert_eq!(
            a.alloc(req(33), &mut w),
            Err(IovaError::BadSize { pages: 33 })
        );
        let low = a.alloc(AllocRequest::new(1, Iova::new(P), 0), &mut w);
        assert!(matches!(low, Err(IovaError::LimitTooLow { .. })), "{low:?}");
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn bad_configs_are_errors() {
        let ok = SbaConfig {
            window_start: Iova::new(1 << 30),
            window_size: 1 << 30,
            page_size: P,
        };
        assert!(SbaResourceAllocator::new(ok).is_ok());
        let bad = [
            SbaConfig {
                page_size: 1 << 17,
                ..ok
            },
            SbaConfig {
                window_size: 3 << 20,
                ..ok
            },
            SbaConfig {
                window_start: Iova::new(1 << 20),
                ..ok
            },
            SbaConfig {
                window_size: 16 * P,
                ..ok
            },
        ];
        for c in bad {
            assert!(SbaResourceAllocator::new(c).is_err(), "{c:?}");
        }
    }
}
