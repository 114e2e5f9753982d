//! An NVMe SSD: one submission/completion queue pair per CPU (up to the controller's queue
//! count), a controller that accepts commands at its rated rate, a media read or write
//! latency, a link/bandwidth limit, and one interrupt (MSI-X vector) per completion queue.
//!
//! The model is a timing model only: [`Nvme::service`] says when a command finishes; the
//! caller delivers the completion on the queue's interrupt vector. Every byte's DMA goes
//! through the IOMMU in the caller, which passes the translation time it cost.

use std::cell::RefCell;

/// An NVMe device class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NvmeParams {
    /// I/O queue pairs the controller offers (Linux creates min(CPUs, this)).
    pub io_queues: usize,
    /// Rated 4 KiB random-read IOPS: the controller accepts one command per `1/max_iops`.
    pub max_iops: f64,
    /// Sustained transfer bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Media latency of a 4 KiB read, ns.
    pub read_latency_ns: u64,
    /// Media latency of a 4 KiB write (to the controller's write cache), ns.
    pub write_latency_ns: u64,
}

#[derive(Debug, Default)]
struct State {
    ctrl_free_at: f64,
    link_free_at: f64,
    commands: u64,
}

/// One NVMe device.
#[derive(Debug)]
pub struct Nvme {
    params: NvmeParams,
    state: RefCell<State>,
}

impl Nvme {
    /// A device of class `params`.
    pub fn new(params: NvmeParams) -> Self {
        Nvme {
            params,
            state: RefCell::new(State::default()),
        }
    }

    /// The device's class.
    pub fn params(&self) -> &NvmeParams {
        &self.params
    }

    /// The queue pair (and interrupt vector) CPU `cpu` uses: Linux maps CPUs to queues
    /// round-robin when there are fewer queues than CPUs.
    pub fn queue_for_cpu(&self, cpu: usize) -> usize {
        cpu % self.params.io_queues.max(1)
    }

    /// Commands serviced so far.
    pub fn commands(&self) -> u64 {
        self.state.borrow().commands
    }

    /// A command of `bytes` rung in at `now_ns`: returns its completion time in ns. The
    /// controller serialises command acceptance at its rated rate; the data moves over the
    /// link after the media access, serialised by bandwidth; `dma_extra_ns` is what address
    /// translation added to the transfer.
    pub fn service(&self, now_ns: u64, bytes: u64, is_read: bool, dma_extra_ns: f64) -> u64 {
        let mut s = self.state.borrow_mut();
        s.commands += 1;
        let start = (now_ns as f64).max(s.ctrl_free_at);
        s.ctrl_free_at = start + 1e9 / self.params.max_iops.max(1.0);
        let media = if is_read {
            self.params.read_latency_ns
        } else {
            self.params.write_latency_ns
        } as f64;
        let xfer = bytes as f64 * 1e9 / self.params.bandwidth.max(1.0);
        let xfer_start = (start + media).max(s.link_free_at);
        s.link_free_at = xfer_start + xfer;
        (s.link_free_at + dma_extra_ns).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Nvme {
        Nvme::new(NvmeParams {
            io_queues: 4,
            max_iops: 1e6,
            bandwidth: 4e9,
            read_latency_ns: 80_000,
            write_latency_ns: 20_000,
        })
    }

    #[test]
    fn controller_never_exceeds_its_rated_rate() {
        let d = dev();
        let mut last = 0;
        for _ in 0..1000 {
            last = d.service(0, 4096, true, 0.0);
        }
        // 1000 commands at 1M/s: the last starts at 999 us.
        assert!(last >= 999_000 + 80_000, "{last}");
    }

    #[test]
    fn cpus_share_queues_round_robin() {
        let d = dev();
        assert_eq!(d.queue_for_cpu(5), 1);
        assert_eq!(d.queue_for_cpu(3), 3);
    }
}
