//! The DMA port: where a device's DMA meets the IOMMU, and what translation adds to it in
//! time.
//!
//! Every device model hands its DMAs here after translating them through the unit's model
//! (IOTLB, paging-structure caches, device TLB: the functional stack counts the hits,
//! misses and walk reads, [`Translated`]). The port times the transfer with one model for
//! every device kind:
//!
//! - The device moves a DMA's data in page order at its own rate (`data_ns` for the whole
//!   DMA, from the device's model: its link, its DMA engine). A page whose translation hits
//!   costs nothing more: the lookup is pipelined with the data (pcie-bench: IOTLB hits add
//!   no measurable latency, RESEARCH.md).
//! - A page whose translation misses waits for a page walk: `walk_cache_lookup` plus its
//!   share of the walk's dependent table reads at `walk_read` each. Walks run on the
//!   unit's walkers (`iommu.walkers` in the profile), shared by every device behind the
//!   unit; a walk takes the walker that can start it first. Walkers keep their bookings
//!   (devices time their DMAs ahead of the engine's clock, and not in time order across
//!   devices), and one device stream's walks start in that stream's order ([`DmaStream`]).
//! - How far the device's requests run ahead of a stalled page is its outstanding window:
//!   a read of memory (a non-posted request) may have [`DeviceLink::outstanding_pages`]
//!   pages' requests in flight, so their walks overlap each other and the data; a write to
//!   memory (a posted request) may not pass an earlier one (PCIe ordering, unless the
//!   device sets Relaxed Ordering), so a missing page holds the device's write stream for
//!   its walk, as F&S's serial model `T = p / (l_0 + M * l_m)` of their receive runs has it.
//! - Data leaves in order: a page is done once its translation is and the page before it
//!   is, plus its own data time.
//!
//! With no misses the port adds nothing (the transfer ends exactly when the data does, as
//! with the IOMMU off). The port returns when the DMA's last byte is through; for ordered
//! writes the device keeps that as its stream's next free time, so a stall delays what the
//! device writes next (`devices::PortedDma::time` gives both times). Every parameter's source is in docs/MODEL.md ("DMA port").

use std::cell::RefCell;
use std::rc::Rc;

use iolab_iommu::addr::Access;

/// What translating one DMA did in the unit's caches: the pages it spans and the IOTLB
/// misses and table reads among them (from the work record of the device-side translation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Translated {
    /// Translation pages the DMA spans (one lookup each).
    pub pages: u64,
    /// Lookups that missed the IOTLB and walked.
    pub misses: u64,
    /// Table reads of those walks (after the paging-structure caches).
    pub walk_reads: u64,
}

impl Translated {
    /// Adds another DMA's translation (the segments of one command, counted together).
    pub fn add(&mut self, o: Translated) {
        self.pages += o.pages;
        self.misses += o.misses;
        self.walk_reads += o.walk_reads;
    }
}

/// The unit's side of the port: how many walks it serves at once and what a walk costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PortParams {
    /// Page walks the unit serves concurrently (`iommu.walkers`); at least 1.
    pub walkers: usize,
    /// One table read by the walker, ns (`iommu.walk_read`).
    pub walk_read_ns: f64,
    /// One paging-structure (walk) cache lookup per miss, ns (`iommu.walk_cache_lookup`).
    pub walk_cache_lookup_ns: f64,
}

/// The device's side of the port: how far its requests run ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLink {
    /// Pages of read requests (non-posted) the device keeps in flight: its PCIe tags times
    /// its read request size, in translation pages; at least 1.
    pub outstanding_pages: u32,
    /// Whether the device's writes to memory carry Relaxed Ordering (then they may pass
    /// each other, and overlap as reads do).
    pub relaxed_ordering: bool,
}

/// One device's DMA stream at the port: its [`DeviceLink`] and where its translation
/// requests have got to. A device's requests reach the unit in the order it issues them, so
/// the unit starts the walks of one stream in that order (walks of other streams may fill
/// the gaps between). Each device owns one.
#[derive(Debug)]
pub struct DmaStream {
    link: DeviceLink,
    /// The start of this stream's latest walk, ns.
    last_walk: std::cell::Cell<f64>,
}

impl DmaStream {
    /// A stream of a device with `link`, no walk asked for yet.
    pub fn new(link: DeviceLink) -> Self {
        Self {
            link,
            last_walk: std::cell::Cell::new(0.0),
        }
    }

    /// The device's side of the port.
    pub fn link(&self) -> DeviceLink {
        self.link
    }
}

impl DeviceLink {
    /// Pages whose requests may be in flight for a DMA of `access` (as memory sees it).
    fn window(&self, access: Access) -> usize {
        match access {
            Access::Write if !self.relaxed_ordering => 1,
            _ => self.outstanding_pages.max(1) as usize,
        }
    }
}

/// Totals of a port, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PortStats {
    /// DMAs timed.
    pub dmas: u64,
    /// Page walks run.
    pub walks: u64,
    /// Walker time, ns (the walks' durations summed).
    pub walk_ns: f64,
    /// Time the DMAs' ends moved past their data because of translation, ns.
    pub stall_ns: f64,
}

/// How long a walker keeps its past reservations, ns: devices time their DMAs ahead of
/// the engine's clock (a command's data moves after its media latency), and not in time
/// order across devices, so a walk may be placed in a gap before a later reservation. A
/// request older than this behind the newest one seen is placed as if the walker were free
/// then (devices book at most a few milliseconds ahead).
const RESERVATION_HORIZON_NS: f64 = 5e6;

/// One walker's reservations, (start, end) ns, in start order, none overlapping.
#[derive(Debug, Default)]
struct Walker {
    busy: std::collections::VecDeque<(f64, f64)>,
}

impl Walker {
    /// The earliest start at or after `at` with `len` ns free.
    fn earliest(&self, at: f64, len: f64) -> f64 {
        // Free from `at` on: nothing booked ends after it (the common case).
        if self.busy.back().map_or(true, |&(_, e)| e <= at) {
            return at;
        }
        let mut t = at;
        // The reservations ending after `at`, in order: slide past each one in the way.
        let first = self.busy.partition_point(|&(_, e)| e <= at);
        for &(s, e) in self.busy.range(first..) {
            if t + len <= s {
                break;
            }
            t = t.max(e);
        }
        t
    }

    /// Books `start..start + len` (free, as [`Walker::earliest`] found it).
    fn book(&mut self, start: f64, len: f64, newest: f64) {
        if self.busy.back().map_or(true, |&(s, _)| s < start) {
            self.busy.push_back((start, start + len));
        } else {
            let at = self.busy.partition_point(|&(s, _)| s < start);
            self.busy.insert(at, (start, start + len));
        }
        while self
            .busy
            .front()
            .is_some_and(|&(_, e)| e < newest - RESERVATION_HORIZON_NS)
        {
            self.busy.pop_front();
        }
    }
}

#[derive(Debug)]
struct PortState {
    params: PortParams,
    walkers: Vec<Walker>,
    /// The latest time a walk was asked for, ns.
    newest: f64,
    stats: PortStats,
    /// Every walk's (start, end), when recording (tests).
    log: Option<Vec<(f64, f64)>>,
    /// Scratch for the pages' finish times (kept to save an allocation per DMA).
    finish: Vec<f64>,
}

/// One IOMMU unit's DMA port. Clones share the unit's walkers (every device behind the
/// unit holds one). Single-threaded, as the lab's engine is.
#[derive(Clone, Debug)]
pub struct DmaPort {
    st: Rc<RefCell<PortState>>,
}

impl DmaPort {
    /// A port of a unit with `params`' walkers, all free.
    pub fn new(params: PortParams) -> Self {
        let walkers = params.walkers.max(1);
        Self {
            st: Rc::new(RefCell::new(PortState {
                params: PortParams { walkers, ..params },
                walkers: (0..walkers).map(|_| Walker::default()).collect(),
                newest: 0.0,
                stats: PortStats::default(),
                log: None,
                finish: Vec::new(),
            })),
        }
    }

    /// The unit's parameters.
    pub fn params(&self) -> PortParams {
        self.st.borrow().params
    }

    /// Totals so far.
    pub fn stats(&self) -> PortStats {
        self.st.borrow().stats
    }

    /// Keeps every walk's start and end from now on ([`DmaPort::walks`]).
    pub fn record_walks(&self) {
        self.st.borrow_mut().log.get_or_insert_with(Vec::new);
    }

    /// The walks recorded since [`DmaPort::record_walks`], as (start, end) ns.
    pub fn walks(&self) -> Vec<(f64, f64)> {
        self.st.borrow().log.clone().unwrap_or_default()
    }

    /// One walk's duration for a DMA whose misses did `t.walk_reads` table reads in all.
    fn walk_ns(p: &PortParams, t: Translated) -> f64 {
        p.walk_cache_lookup_ns + t.walk_reads as f64 / t.misses as f64 * p.walk_read_ns
    }

    /// A DMA whose data is ready to move at `ready` ns and takes `data_ns` at the device's
    /// rate, translated as `t`, `access` as memory sees it (a device writing memory is
    /// [`Access::Write`]), on the device's `stream`: returns when its last byte is through.
    /// Without misses that is `ready + data_ns`. The misses are spread evenly over the
    /// DMA's pages (the work record counts them per DMA, not per page).
    pub fn transfer(
        &self,
        ready: f64,
        data_ns: f64,
        t: Translated,
        access: Access,
        stream: &DmaStream,
    ) -> f64 {
        let link = stream.link;
        let data_end = ready + data_ns;
        let mut st = self.st.borrow_mut();
        st.stats.dmas += 1;
        if t.misses == 0 {
            return data_end;
        }
        let p = st.params;
        let walk = Self::walk_ns(&p, t);
        let n = t.pages.max(t.misses) as usize;
        let m = t.misses as usize;
        let per_page = data_ns / n as f64;
        let window = link.window(access);
        // Page i's finish time; `finish[i - window]` frees the slot page i's request needs.
        let mut finish = std::mem::take(&mut st.finish);
        finish.clear();
        let mut next_miss = 0usize;
        let mut last = ready;
        for i in 0..n {
            let arrive = ready + i as f64 * per_page;
            let issue = if i >= window {
                arrive.max(finish[i - window])
            } else {
                arrive
            };
            // Miss k sits on page floor(k * n / m).
            let translated = if next_miss < m && next_miss * n / m == i {
                next_miss += 1;
                // In the stream's order; then the walker that can start it first (the
                // lowest-numbered on a tie).
                let issue = issue.max(stream.last_walk.get());
                let (mut w, mut start) = (0, f64::INFINITY);
                for (k, walker) in st.walkers.iter().enumerate() {
                    let t = walker.earliest(issue, walk);
                    if t < start {
                        (w, start) = (k, t);
                        if t <= issue {
                            break;
                        }
                    }
                }
                st.newest = st.newest.max(issue);
                let newest = st.newest;
                st.walkers[w].book(start, walk, newest);
                stream.last_walk.set(start);
                let end = start + walk;
                st.stats.walks += 1;
                st.stats.walk_ns += walk;
                if let Some(log) = st.log.as_mut() {
                    log.push((start, end));
                }
                end
            } else {
                issue
            };
            last = last.max(translated) + per_page;
            finish.push(last);
        }
        st.finish = finish;
        st.stats.stall_ns += (last - data_end).max(0.0);
        last.max(data_end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(walkers: usize) -> DmaPort {
        DmaPort::new(PortParams {
            walkers,
            walk_read_ns: 200.0,
            walk_cache_lookup_ns: 0.0,
        })
    }

    const READS: DeviceLink = DeviceLink {
        outstanding_pages: 32,
        relaxed_ordering: false,
    };

    fn on(link: DeviceLink) -> DmaStream {
        DmaStream::new(link)
    }

    #[test]
    fn without_misses_the_port_adds_nothing() {
        let p = port(4);
        let t = Translated {
            pages: 8,
            misses: 0,
            walk_reads: 0,
        };
        assert_eq!(
            p.transfer(100.0, 800.0, t, Access::Write, &on(READS)),
            900.0
        );
        assert_eq!(p.transfer(100.0, 800.0, t, Access::Read, &on(READS)), 900.0);
    }

    #[test]
    fn ordered_writes_pay_each_walk_in_turn() {
        // Four pages, four misses of one read each: posted writes stall for every walk.
        let p = port(8);
        let t = Translated {
            pages: 4,
            misses: 4,
            walk_reads: 4,
        };
        let end = p.transfer(0.0, 400.0, t, Access::Write, &on(READS));
        assert_eq!(end, 4.0 * (200.0 + 100.0));
        // The same as reads: the walks overlap (eight walkers, 32 pages of window).
        let q = port(8);
        let end = q.transfer(0.0, 400.0, t, Access::Read, &on(READS));
        assert!(end < 400.0 + 2.0 * 200.0, "{end}");
    }

    #[test]
    fn relaxed_ordering_lets_writes_overlap() {
        let t = Translated {
            pages: 4,
            misses: 4,
            walk_reads: 4,
        };
        let ro = DeviceLink {
            relaxed_ordering: true,
            ..READS
        };
        let strict = port(8).transfer(0.0, 400.0, t, Access::Write, &on(READS));
        let relaxed = port(8).transfer(0.0, 400.0, t, Access::Write, &on(ro));
        assert!(relaxed < strict, "{relaxed} vs {strict}");
    }

    #[test]
    fn one_walker_serialises_overlapping_reads() {
        let t = Translated {
            pages: 4,
            misses: 4,
            walk_reads: 4,
        };
        let one = port(1).transfer(0.0, 400.0, t, Access::Read, &on(READS));
        let four = port(4).transfer(0.0, 400.0, t, Access::Read, &on(READS));
        assert!(one >= 4.0 * 200.0, "{one}");
        assert!(four < one, "{four} vs {one}");
    }
}
