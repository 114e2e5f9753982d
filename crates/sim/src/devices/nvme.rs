//! An NVMe SSD: one submission/completion queue pair per CPU (up to the controller's queue
//! count), a controller that accepts commands at its rated rate, a media read or write
//! latency, a link/bandwidth limit, and one interrupt (MSI-X vector) per completion queue.
//!
//! The model is a timing model only: [`Nvme::service`] says when a command finishes; the
//! caller delivers the completion on the queue's interrupt vector. Every byte's DMA goes
//! through the IOMMU in the caller, which passes the translation time it cost.
//!
//! Interrupts: by default every posted completion raises its vector's interrupt. With
//! [`InterruptCoalescing`] (Set Features, feature 08h, NVMe 1.4 section 5.21.1.8) the
//! controller holds a vector's interrupt until `threshold + 1` completions are pending
//! (THR is a 0's based count) or the oldest pending one has waited `time_100us` x 100 us
//! (TIME; 0 means no delay). The caller posts each completion with
//! [`Nvme::post_completion`] and arms a timer when told to; [`Nvme::timer_expired`] says
//! whether the timer still stands. The interrupt's CPU cost is the caller's (one handler
//! entry per interrupt, however many completions it drains).

use std::cell::RefCell;

use iolab_iommu::addr::Access;

use super::PortedDma;
use crate::iommu::port::{DeviceLink, DmaStream};

use crate::engine::rng::Rng;

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
    /// The spread of each command's media latency: drawn uniformly from the latency
    /// +-this percent (mean unchanged) by the device's seeded generator
    /// ([`Nvme::with_seed`]); the command completes its draw's deviation from the mean
    /// earlier or later than the link schedule at the mean. 0, or a device without a
    /// generator, is a fixed latency.
    pub media_spread_pct: u32,
}

/// The Interrupt Coalescing feature (08h): an aggregation threshold and time, applied to
/// every I/O completion queue's vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterruptCoalescing {
    /// THR: completions to aggregate per interrupt, 0's based (0: one per completion).
    pub threshold: u8,
    /// TIME: the longest a completion's interrupt may be delayed, in 100 us units (0: no
    /// delay, so no coalescing).
    pub time_100us: u8,
}

impl InterruptCoalescing {
    /// Whether it coalesces at all (THR and TIME both non-zero).
    pub fn is_active(&self) -> bool {
        self.threshold > 0 && self.time_100us > 0
    }

    /// The aggregation time in ns.
    pub fn time_ns(&self) -> u64 {
        u64::from(self.time_100us) * 100_000
    }
}

/// What the controller does when a completion is posted to a vector's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Post {
    /// Raise the vector's interrupt now: every pending completion is delivered.
    Interrupt,
    /// This is the first pending completion: arm the aggregation timer for `at` (ns);
    /// `token` identifies it for [`Nvme::timer_expired`].
    ArmTimer {
        /// When the aggregation time runs out, ns.
        at: u64,
        /// The timer's identity.
        token: u64,
    },
    /// Held: the threshold is not reached and the timer is already running.
    Hold,
}

#[derive(Debug, Default, Clone, Copy)]
struct Vector {
    pending: u32,
    /// The running timer's token (a new one each time a timer is armed or cancelled).
    timer: u64,
}

#[derive(Debug, Default)]
struct State {
    ctrl_free_at: f64,
    link_free_at: f64,
    commands: u64,
    vectors: Vec<Vector>,
    interrupts: u64,
    tokens: u64,
    /// Draws each command's media latency when the spread is above 0.
    rng: Option<Rng>,
}

/// One NVMe device.
#[derive(Debug)]
pub struct Nvme {
    params: NvmeParams,
    coalescing: InterruptCoalescing,
    state: RefCell<State>,
    /// The drive's DMA stream at the IOMMU's port.
    stream: DmaStream,
}

impl Nvme {
    /// A device of class `params`.
    pub fn new(params: NvmeParams) -> Self {
        Nvme {
            params,
            coalescing: InterruptCoalescing::default(),
            state: RefCell::new(State::default()),
            stream: DmaStream::new(NVME_LINK),
        }
    }

    /// The same device with its DMA running ahead at the IOMMU's port as `link` says
    /// (default [`NVME_LINK`]).
    pub fn with_dma_link(mut self, link: DeviceLink) -> Self {
        self.stream = DmaStream::new(link);
        self
    }

    /// The same device with interrupt coalescing set (Set Features 08h); without it every
    /// completion raises an interrupt.
    pub fn with_coalescing(mut self, coalescing: InterruptCoalescing) -> Self {
        self.coalescing = coalescing;
        self
    }

    /// The same device drawing its media latencies from a generator seeded with `seed`
    /// (the run's, derived per device): the same seed gives the same latencies.
    pub fn with_seed(self, seed: u64) -> Self {
        self.state.borrow_mut().rng = Some(Rng::seed_from_u64(seed));
        self
    }

    /// The interrupt coalescing setting.
    pub fn coalescing(&self) -> InterruptCoalescing {
        self.coalescing
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

    /// Interrupts raised so far (all vectors).
    pub fn interrupts(&self) -> u64 {
        self.state.borrow().interrupts
    }

    fn raise(s: &mut State, vector: usize) -> Post {
        s.interrupts += 1;
        s.tokens += 1;
        let v = &mut s.vectors[vector];
        v.pending = 0;
        v.timer = s.tokens; // cancels the running timer
        Post::Interrupt
    }

    /// A completion is posted to `vector`'s queue at `now_ns`: whether the interrupt is
    /// raised now, held with a timer to arm, or held.
    pub fn post_completion(&self, vector: usize, now_ns: u64) -> Post {
        let mut s = self.state.borrow_mut();
        if s.vectors.len() <= vector {
            s.vectors.resize(vector + 1, Vector::default());
        }
        let c = self.coalescing;
        if !c.is_active() {
            return Self::raise(&mut s, vector);
        }
        let v = &mut s.vectors[vector];
        v.pending += 1;
        if v.pending > u32::from(c.threshold) {
            return Self::raise(&mut s, vector);
        }
        if v.pending == 1 {
            s.tokens += 1;
            let token = s.tokens;
            s.vectors[vector].timer = token;
            return Post::ArmTimer {
                at: now_ns + c.time_ns(),
                token,
            };
        }
        Post::Hold
    }

    /// The aggregation timer `token` of `vector` ran out: `true` if it still stands (no
    /// interrupt since it was armed), in which case the interrupt is raised now for the
    /// pending completions.
    pub fn timer_expired(&self, vector: usize, token: u64) -> bool {
        let mut s = self.state.borrow_mut();
        let stands = s
            .vectors
            .get(vector)
            .is_some_and(|v| v.timer == token && v.pending > 0);
        if stands {
            Self::raise(&mut s, vector);
        }
        stands
    }

    /// A command of `bytes` rung in at `now_ns`: returns its completion time in ns. The
    /// controller serialises command acceptance at its rated rate; the data moves over the
    /// link after the media access, serialised by bandwidth, through the IOMMU's DMA port
    /// (`dma`: what translation adds, [`crate::iommu::port`]; `None` without an IOMMU).
    pub fn service(&self, now_ns: u64, bytes: u64, is_read: bool, dma: Option<PortedDma>) -> u64 {
        let mut s = self.state.borrow_mut();
        s.commands += 1;
        let start = (now_ns as f64).max(s.ctrl_free_at);
        s.ctrl_free_at = start + 1e9 / self.params.max_iops.max(1.0);
        let base = if is_read {
            self.params.read_latency_ns
        } else {
            self.params.write_latency_ns
        };
        // The media latency's draw about its mean: the link is scheduled at the mean (so the
        // controller's rate and the link's bandwidth stay what they were), and the command
        // completes its deviation earlier or later. A simplification: a real drive moves
        // data in the order its media reads finish.
        let spread = self.params.media_spread_pct;
        let deviation = match s.rng.as_mut() {
            Some(rng) if spread > 0 => rng.jitter(base, spread) as f64 - base as f64,
            _ => 0.0,
        };
        let media = base as f64;
        let xfer = bytes as f64 * 1e9 / self.params.bandwidth.max(1.0);
        let xfer_start = (start + media).max(s.link_free_at);
        // A read writes memory (posted writes), a write reads it.
        let access = if is_read { Access::Write } else { Access::Read };
        let t = PortedDma::time(dma, xfer_start, xfer, access, &self.stream);
        s.link_free_at = t.stream_free;
        crate::time::ceil_ns(t.done + deviation)
    }
}

/// How far an NVMe drive's DMA requests run ahead, for the [DMA port](crate::iommu::port):
/// assumption: 256 PCIe tags (Extended Tag, which Linux enables on capable devices;
/// RESEARCH.md "PCIe tags") of 512-byte read requests (a common MRRS) keep 128 KiB, 32
/// pages, of reads in flight; writes to memory are ordered (no Relaxed Ordering).
pub const NVME_LINK: DeviceLink = DeviceLink {
    outstanding_pages: 32,
    relaxed_ordering: false,
};

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
            media_spread_pct: 0,
        })
    }

    #[test]
    fn without_coalescing_every_completion_interrupts() {
        let d = dev();
        for t in 0..5 {
            assert_eq!(d.post_completion(1, t), Post::Interrupt);
        }
        assert_eq!(d.interrupts(), 5);
    }

    #[test]
    fn coalescing_raises_at_the_threshold_or_the_time() {
        let d = dev().with_coalescing(InterruptCoalescing {
            threshold: 3, // 4 completions
            time_100us: 2,
        });
        // Four completions: the first arms the timer, the fourth interrupts.
        let Post::ArmTimer { at, token } = d.post_completion(0, 1_000) else {
            panic!("first completion arms the timer")
        };
        assert_eq!(at, 201_000);
        assert_eq!(d.post_completion(0, 2_000), Post::Hold);
        assert_eq!(d.post_completion(0, 3_000), Post::Hold);
        assert_eq!(d.post_completion(0, 4_000), Post::Interrupt);
        // The threshold interrupt cancelled that timer.
        assert!(!d.timer_expired(0, token));
        assert_eq!(d.interrupts(), 1);
        // One lone completion: the timer delivers it.
        let Post::ArmTimer { token, .. } = d.post_completion(0, 10_000) else {
            panic!("arms")
        };
        assert!(d.timer_expired(0, token));
        assert!(!d.timer_expired(0, token), "fires once");
        assert_eq!(d.interrupts(), 2);
        // Vectors are independent.
        assert!(matches!(d.post_completion(1, 0), Post::ArmTimer { .. }));
        assert_eq!(d.interrupts(), 2);
    }

    #[test]
    fn controller_never_exceeds_its_rated_rate() {
        let d = dev();
        let mut last = 0;
        for _ in 0..1000 {
            last = d.service(0, 4096, true, None);
        }
        // 1000 commands at 1M/s: the last starts at 999 us.
        assert!(last >= 999_000 + 80_000, "{last}");
    }

    #[test]
    fn a_seeded_spread_varies_media_latency_deterministically_about_the_same_mean() {
        let spread = |seed: u64| {
            let d = Nvme::new(NvmeParams {
                media_spread_pct: 24,
                // A fast controller and link: the completion time is the media latency.
                max_iops: 1e12,
                bandwidth: 1e18,
                ..*dev().params()
            })
            .with_seed(seed);
            (0..4000)
                .map(|i| d.service(i * 1_000_000, 4096, true, None) - i * 1_000_000)
                .collect::<Vec<u64>>()
        };
        let a = spread(1);
        assert_eq!(a, spread(1), "same seed, same latencies");
        assert_ne!(a, spread(2));
        let (lo, hi) = (a.iter().min().unwrap(), a.iter().max().unwrap());
        assert!(*lo >= 60_800 && *hi <= 99_200, "{lo} {hi}");
        assert!(hi - lo > 30_000, "spread over most of +-24%: {lo} {hi}");
        let mean = a.iter().sum::<u64>() as f64 / a.len() as f64;
        assert!((mean - 80_000.0).abs() < 800.0, "{mean}");
        // Without a generator, or with no spread, the latency is fixed.
        let fixed = Nvme::new(NvmeParams {
            media_spread_pct: 24,
            max_iops: 1e12,
            bandwidth: 1e18,
            ..*dev().params()
        });
        assert_eq!(fixed.service(0, 4096, true, None), 80_001);
    }

    #[test]
    fn cpus_share_queues_round_robin() {
        let d = dev();
        assert_eq!(d.queue_for_cpu(5), 1);
        assert_eq!(d.queue_for_cpu(3), 3);
    }
}
