//! Block-layer essentials shared by the storage devices: building requests from pages,
//! merging adjacent requests, and splitting by the queue's limits.
//!
//! A request is a run of sectors backed by a list of physical pieces (one per page of the
//! page cache, usually not physically contiguous). The queue limits decide how a request is
//! cut before the driver sees it: `max_segments` (pieces the HBA's scatter-gather list can
//! hold), `max_segment_size` and `max_transfer` (`max_sectors` in Linux). Whether pieces
//! that are not physically contiguous count as one segment depends on whether the IOMMU will
//! merge them ([`QueueLimits::virt_merge_granule`]): that is how SG merging in the IOMMU
//! changes what the device sees.
//!
//! [`BlockQueue`] is what a workload that builds its own requests (bonnie's page cache)
//! submits them to: the USB mass-storage model, or the lab's NVMe/SAS stack with its DMA
//! path. The workload cuts its pages into requests with [`QueueLimits::split`] and hands
//! each to the queue as a [`BlockCommand`].

use std::future::Future;
use std::pin::Pin;

use iolab_iommu::addr::PhysAddr;

use crate::engine::Ctx;

/// Transfer direction, from the host's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockDir {
    /// Device to memory (a disk read).
    Read,
    /// Memory to device (a disk write).
    Write,
}

/// What runs when a command completes (in interrupt context: it may only update state and
/// wake tasks).
pub type OnDone = Box<dyn FnOnce()>;

/// One block command: a request the queue limits already cut, with its completion.
pub struct BlockCommand {
    /// Direction.
    pub dir: BlockDir,
    /// Byte offset on the device.
    pub offset: u64,
    /// The request's physical pieces, in transfer order.
    pub pieces: Vec<Piece>,
    /// Called at completion.
    pub on_done: OnDone,
}

/// The future [`BlockQueue::submit`] returns.
pub type SubmitCommand<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// A device's request queue, as a workload that builds its own requests sees it.
///
/// `submit` runs the submission path on the caller's task and CPU (block layer, DMA map,
/// driver, doorbell) and returns once the command is on its way; it may spend CPU and spin
/// on locks but never blocks, so the virtual time it takes is the caller's CPU time. The
/// command's `on_done` runs when the device and its completion path are done.
pub trait BlockQueue {
    /// Submits `cmd` from the task of `ctx`.
    fn submit<'a>(&'a self, ctx: &'a Ctx, cmd: BlockCommand) -> SubmitCommand<'a>;

    /// Submits a cache flush (SCSI SYNCHRONIZE CACHE, NVMe Flush) from the task of `ctx`:
    /// no data moves; `on_done` runs when the device has written its volatile write cache
    /// to the medium. Like [`BlockQueue::submit`], the returned future finishes once the
    /// flush is on its way.
    ///
    /// The default is a device with no volatile write cache (or one the kernel treats as
    /// write-through): the block layer drops the flush and `on_done` runs at once.
    fn flush<'a>(&'a self, ctx: &'a Ctx, on_done: OnDone) -> SubmitCommand<'a> {
        let _ = ctx;
        on_done();
        Box::pin(std::future::ready(()))
    }
}

/// A piece of a request: physically contiguous bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Physical address of the first byte.
    pub pa: PhysAddr,
    /// Length in bytes.
    pub len: u64,
}

impl Piece {
    fn end(&self) -> u64 {
        self.pa.get() + self.len
    }
}

/// A block request: `pieces` in order, for a transfer starting at `offset` on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Byte offset on the device.
    pub offset: u64,
    /// The physical pieces, in transfer order.
    pub pieces: Vec<Piece>,
}

impl Request {
    /// Total bytes.
    pub fn len(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Whether the request moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A queue's limits, as the driver declares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Maximum segments in one request (the HBA's SG list length).
    pub max_segments: usize,
    /// Maximum bytes in one segment.
    pub max_segment_size: u64,
    /// Maximum bytes in one request (`max_sectors * 512`).
    pub max_transfer: u64,
    /// When set, the IOMMU merges pieces whose boundaries are aligned to this granule into one
    /// DMA segment, so the block layer may count them as one segment (Linux's virtual merge
    /// boundary / `BIO_VMERGE_BOUNDARY`). `None`: only physically contiguous pieces merge.
    pub virt_merge_granule: Option<u64>,
}

impl QueueLimits {
    /// Whether `next` may join the segment that ends with `prev`.
    fn joins(&self, prev: &Piece, next: &Piece, seg_len: u64) -> bool {
        if seg_len + next.len > self.max_segment_size {
            return false;
        }
        if prev.end() == next.pa.get() {
            return true;
        }
        match self.virt_merge_granule {
            Some(g) => prev.end() % g == 0 && next.pa.get() % g == 0,
            None => false,
        }
    }

    /// Counts the segments `pieces` form under these limits.
    pub fn count_segments(&self, pieces: &[Piece]) -> usize {
        let mut segments = 0;
        let mut seg_len = 0;
        let mut prev: Option<&Piece> = None;
        for p in pieces {
            match prev {
                Some(q) if self.joins(q, p, seg_len) => seg_len += p.len,
                _ => {
                    segments += 1;
                    seg_len = p.len;
                }
            }
            prev = Some(p);
        }
        segments
    }

    /// Splits a stream of pieces into requests that respect every limit, in order. A piece
    /// larger than a limit is cut.
    pub fn split(&self, offset: u64, pieces: &[Piece]) -> Vec<Request> {
        let mut out = Vec::new();
        let mut cur = Request {
            offset,
            pieces: Vec::new(),
        };
        let (mut cur_len, mut segments, mut seg_len) = (0u64, 0usize, 0u64);
        let mut queue: std::collections::VecDeque<Piece> = pieces.iter().copied().collect();
        while let Some(mut p) = queue.pop_front() {
            let room = self.max_transfer - cur_len;
            if room == 0 {
                let next_offset = cur.offset + cur_len;
                out.push(std::mem::replace(
                    &mut cur,
                    Request {
                        offset: next_offset,
                        pieces: Vec::new(),
                    },
                ));
                (cur_len, segments, seg_len) = (0, 0, 0);
                queue.push_front(p);
                continue;
            }
            let joins = cur
                .pieces
                .last()
                .is_some_and(|q| self.joins(q, &p, seg_len));
            if !joins && segments == self.max_segments {
                let next_offset = cur.offset + cur_len;
                out.push(std::mem::replace(
                    &mut cur,
                    Request {
                        offset: next_offset,
                        pieces: Vec::new(),
                    },
                ));
                (cur_len, segments, seg_len) = (0, 0, 0);
                queue.push_front(p);
                continue;
            }
            let seg_room = if joins {
                self.max_segment_size - seg_len
            } else {
                self.max_segment_size
            };
            let take = p.len.min(room).min(seg_room);
            if take < p.len {
                queue.push_front(Piece {
                    pa: PhysAddr::new(p.pa.get() + take),
                    len: p.len - take,
                });
                p.len = take;
            }
            if joins {
                seg_len += take;
            } else {
                segments += 1;
                seg_len = take;
            }
            cur_len += take;
            cur.pieces.push(p);
        }
        if !cur.pieces.is_empty() {
            out.push(cur);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    fn scattered(n: u64) -> Vec<Piece> {
        // Every other physical page: no two pieces are physically contiguous.
        (0..n)
            .map(|i| Piece {
                pa: PhysAddr::new(0x100_0000 + 2 * i * PAGE),
                len: PAGE,
            })
            .collect()
    }

    fn limits(max_segments: usize, virt: Option<u64>) -> QueueLimits {
        QueueLimits {
            max_segments,
            max_segment_size: 1 << 16,
            max_transfer: 1 << 20,
            virt_merge_granule: virt,
        }
    }

    #[test]
    fn scattered_pages_are_one_segment_each_without_virtual_merging() {
        assert_eq!(limits(128, None).count_segments(&scattered(8)), 8);
    }

    #[test]
    fn virtual_merging_joins_page_aligned_pieces_up_to_the_segment_size() {
        // 32 pages of 4 KiB = 128 KiB, two 64 KiB segments.
        assert_eq!(limits(128, Some(PAGE)).count_segments(&scattered(32)), 2);
    }

    #[test]
    fn max_segments_bounds_a_request_without_virtual_merging() {
        let reqs = limits(16, None).split(0, &scattered(64));
        assert_eq!(reqs.len(), 4);
        assert!(reqs.iter().all(|r| r.len() == 16 * PAGE));
        assert_eq!(reqs[1].offset, 16 * PAGE);
    }

    #[test]
    fn virtual_merging_makes_requests_larger_under_the_same_segment_limit() {
        let reqs = limits(2, Some(PAGE)).split(0, &scattered(64));
        // Two 64 KiB segments per request: 128 KiB requests.
        assert_eq!(reqs.len(), 2);
        assert!(reqs.iter().all(|r| r.len() == 32 * PAGE));
    }

    #[test]
    fn max_transfer_cuts_a_contiguous_piece() {
        let l = QueueLimits {
            max_segments: 128,
            max_segment_size: 1 << 20,
            max_transfer: 3 * PAGE,
            virt_merge_granule: None,
        };
        let reqs = l.split(
            0,
            &[Piece {
                pa: PhysAddr::new(0),
                len: 8 * PAGE,
            }],
        );
        assert_eq!(
            reqs.iter().map(Request::len).collect::<Vec<_>>(),
            vec![3 * PAGE, 3 * PAGE, 2 * PAGE]
        );
    }

    #[test]
    fn split_conserves_bytes_and_order() {
        let pieces = scattered(37);
        let reqs = limits(5, Some(PAGE)).split(512, &pieces);
        let total: u64 = reqs.iter().map(Request::len).sum();
        assert_eq!(total, 37 * PAGE);
        let flat: Vec<u64> = reqs
            .iter()
            .flat_map(|r| r.pieces.iter().map(|p| p.pa.get()))
            .collect();
        assert!(flat.windows(2).all(|w| w[0] < w[1]));
        for r in &reqs {
            assert!(limits(5, Some(PAGE)).count_segments(&r.pieces) <= 5);
        }
    }
}
