//! A hostile NVMe device: while it serves the workload's I/O like any SSD, its controller
//! (compromised or buggy) probes memory it should not reach. It is an option of the lab's
//! NVMe device (`[device.hostile]`, docs/SCENARIOS.md), run by the lab's one block stack
//! (`lab/block.rs`), and tries two things:
//!
//! - **recently unmapped addresses**: right after the driver unmaps a completed I/O's
//!   buffer, the device tries to read and to write `probe_bytes` at the address it just
//!   used, before anything else can map it again;
//! - **neighbours of live mappings**: every `neighbour_every`-th buffer mapped, the device
//!   tries to read and to write the bytes after the buffer, up to `neighbour_window` bytes,
//!   in pieces that end on 4 KiB boundaries.
//!
//! Every probe is a real device-side translation through the same route as the device's
//! own DMA (the SMMUv3 or x86 unit's IOTLB and walk cache, or the DMA path's translation):
//! it succeeds exactly when the platform's IOMMU (or its bypass) lets the access through,
//! and a refused probe is a real fault (over SMMUv3, an event record in its event queue).
//! The probes cost the host no CPU time (the device does them).

use std::cell::Cell;

use iolab_iommu::addr::Access;

/// What the hostile device tries (`[device.hostile]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostileParams {
    /// Bytes per probe of a just-unmapped buffer (read and write).
    pub probe_bytes: u64,
    /// Bytes after a live buffer the device tries to reach.
    pub neighbour_window: u64,
    /// Probe the neighbours of every n-th mapped buffer (at least 1).
    pub neighbour_every: u64,
}

/// What the hostile device reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExposureReport {
    /// Reads tried at just-unmapped addresses.
    pub stale_read_attempts: u64,
    /// Those that succeeded.
    pub stale_reads: u64,
    /// Bytes they could read.
    pub stale_read_bytes: u64,
    /// Writes tried at just-unmapped addresses.
    pub stale_write_attempts: u64,
    /// Those that succeeded.
    pub stale_writes: u64,
    /// Bytes they could write.
    pub stale_write_bytes: u64,
    /// Neighbour pieces tried (each read and write).
    pub neighbour_attempts: u64,
    /// Neighbour bytes readable.
    pub neighbour_readable_bytes: u64,
    /// Neighbour bytes writable.
    pub neighbour_writable_bytes: u64,
}

impl ExposureReport {
    /// Adds `other`'s counts to these (several hostile devices of one run).
    pub fn add(&mut self, o: &ExposureReport) {
        self.stale_read_attempts += o.stale_read_attempts;
        self.stale_reads += o.stale_reads;
        self.stale_read_bytes += o.stale_read_bytes;
        self.stale_write_attempts += o.stale_write_attempts;
        self.stale_writes += o.stale_writes;
        self.stale_write_bytes += o.stale_write_bytes;
        self.neighbour_attempts += o.neighbour_attempts;
        self.neighbour_readable_bytes += o.neighbour_readable_bytes;
        self.neighbour_writable_bytes += o.neighbour_writable_bytes;
    }

    /// The report as `(metric name, unit, count)`, the names the lab's measurements carry
    /// (`hostile.*`).
    pub fn metrics(&self) -> [(&'static str, &'static str, u64); 9] {
        [
            (
                "hostile.stale_read_attempts",
                "count",
                self.stale_read_attempts,
            ),
            ("hostile.stale_reads", "count", self.stale_reads),
            ("hostile.stale_read_bytes", "B", self.stale_read_bytes),
            (
                "hostile.stale_write_attempts",
                "count",
                self.stale_write_attempts,
            ),
            ("hostile.stale_writes", "count", self.stale_writes),
            ("hostile.stale_write_bytes", "B", self.stale_write_bytes),
            (
                "hostile.neighbour_attempts",
                "count",
                self.neighbour_attempts,
            ),
            (
                "hostile.neighbour_readable_bytes",
                "B",
                self.neighbour_readable_bytes,
            ),
            (
                "hostile.neighbour_writable_bytes",
                "B",
                self.neighbour_writable_bytes,
            ),
        ]
    }
}

/// The probing side of one device: what it tries, and what it reached so far. The probes
/// go through `reaches(dma, len, access)`, the device's own DMA route, which says whether
/// the access got through.
#[derive(Debug)]
pub struct HostileDevice {
    params: HostileParams,
    mapped: Cell<u64>,
    report: Cell<ExposureReport>,
}

impl HostileDevice {
    /// A device that probes as `params` says.
    pub fn new(params: HostileParams) -> Self {
        Self {
            params,
            mapped: Cell::new(0),
            report: Cell::new(ExposureReport::default()),
        }
    }

    /// What it reached so far.
    pub fn report(&self) -> ExposureReport {
        self.report.get()
    }

    /// Probes the buffer of `len` bytes at `dma` the driver has just unmapped.
    pub fn probe_unmapped(&self, dma: u64, len: u64, reaches: impl Fn(u64, u64, Access) -> bool) {
        let n = len.min(self.params.probe_bytes).max(1);
        let read = reaches(dma, n, Access::Read);
        let write = reaches(dma, n, Access::Write);
        let mut r = self.report.get();
        r.stale_read_attempts += 1;
        r.stale_write_attempts += 1;
        if read {
            r.stale_reads += 1;
            r.stale_read_bytes += n;
        }
        if write {
            r.stale_writes += 1;
            r.stale_write_bytes += n;
        }
        self.report.set(r);
    }

    /// Called for each buffer mapped (`len` bytes at `dma`): every `neighbour_every`-th
    /// time, probes the bytes after it.
    pub fn on_mapped(&self, dma: u64, len: u64, reaches: impl Fn(u64, u64, Access) -> bool) {
        let n = self.mapped.get() + 1;
        self.mapped.set(n);
        if n % self.params.neighbour_every.max(1) != 0 {
            return;
        }
        let Some(mut cur) = dma.checked_add(len) else {
            return;
        };
        let end = cur.saturating_add(self.params.neighbour_window);
        let mut r = self.report.get();
        while cur < end {
            let piece = ((cur | 0xfff) + 1).min(end) - cur;
            let read = reaches(cur, piece, Access::Read);
            let write = reaches(cur, piece, Access::Write);
            r.neighbour_attempts += 1;
            if read {
                r.neighbour_readable_bytes += piece;
            }
            if write {
                r.neighbour_writable_bytes += piece;
            }
            cur += piece;
        }
        self.report.set(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(every: u64) -> HostileParams {
        HostileParams {
            probe_bytes: 64,
            neighbour_window: 8192,
            neighbour_every: every,
        }
    }

    #[test]
    fn a_just_unmapped_buffer_is_probed_for_read_and_write() {
        let h = HostileDevice::new(params(1));
        // Reads get through, writes do not (a read-only stale entry).
        h.probe_unmapped(0x1000, 2048, |_, _, a| a == Access::Read);
        let r = h.report();
        assert_eq!((r.stale_read_attempts, r.stale_reads), (1, 1));
        assert_eq!(r.stale_read_bytes, 64, "probe_bytes caps the probe");
        assert_eq!((r.stale_write_attempts, r.stale_writes), (1, 0));
    }

    #[test]
    fn neighbours_are_probed_every_nth_map_in_pieces_ending_on_4k() {
        let h = HostileDevice::new(params(2));
        let tried = std::cell::RefCell::new(Vec::new());
        let reach = |dma, len, a| {
            if a == Access::Read {
                tried.borrow_mut().push((dma, len));
            }
            dma < 0x3000
        };
        h.on_mapped(0x1800, 0x800, reach);
        assert!(tried.borrow().is_empty(), "the first map is not probed");
        h.on_mapped(0x1800, 0x800, reach);
        // From 0x2000: 0x2000..0x3000, 0x3000..0x4000 (8 KiB window).
        assert_eq!(*tried.borrow(), vec![(0x2000, 0x1000), (0x3000, 0x1000)]);
        let r = h.report();
        assert_eq!(r.neighbour_attempts, 2);
        assert_eq!(r.neighbour_readable_bytes, 0x1000);
        assert_eq!(r.neighbour_writable_bytes, 0x1000);
    }
}
