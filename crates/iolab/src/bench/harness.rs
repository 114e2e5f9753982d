//! Timing: warm up, then take several timed samples and report the median ns per operation.

use std::time::{Duration, Instant};

use serde::Serialize;

/// How much time each benchmark gets.
#[derive(Debug, Clone, Serialize)]
pub struct Sampling {
    /// `--quick`: fewer and shorter samples, for smoke runs.
    pub quick: bool,
    /// Timed samples per figure; the median is reported.
    pub samples: usize,
    /// Target duration of one sample.
    #[serde(serialize_with = "as_millis")]
    pub sample_time: Duration,
    /// "release" or "debug": figures from a debug build are not meaningful.
    pub build_profile: &'static str,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl Sampling {
    /// Full runs: 7 samples of 200 ms each; quick runs: 3 samples of 20 ms each.
    pub fn new(quick: bool) -> Self {
        Self {
            quick,
            samples: if quick { 3 } else { 7 },
            sample_time: Duration::from_millis(if quick { 20 } else { 200 }),
            build_profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
        }
    }
}

/// Measures `op` (called with an increasing counter) and returns the median ns per call.
///
/// The number of calls per sample is calibrated once so a sample lasts about
/// `sampling.sample_time`.
pub fn median_ns_per_op(sampling: &Sampling, mut op: impl FnMut(u64)) -> f64 {
    let mut counter = 0u64;
    // Calibrate: double the batch until it takes at least a tenth of the sample time.
    let mut batch = 64u64;
    loop {
        let start = Instant::now();
        for _ in 0..batch {
            op(counter);
            counter += 1;
        }
        let took = start.elapsed();
        if took >= sampling.sample_time / 10 || batch >= 1 << 30 {
            let per_op = took.as_secs_f64() / batch as f64;
            batch = ((sampling.sample_time.as_secs_f64() / per_op.max(1e-10)) as u64).max(16);
            break;
        }
        batch *= 2;
    }
    let mut samples: Vec<f64> = (0..sampling.samples)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..batch {
                op(counter);
                counter += 1;
            }
            start.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One operation of [`median_ns_per_op_interleaved`], called with an increasing counter.
pub type Op<'a> = Box<dyn FnMut(u64) + 'a>;

/// [`median_ns_per_op`] for several implementations of the same operation, their samples
/// taken in turn (sample 1 of each, then sample 2 of each, ...) so that a change of load on a
/// shared machine falls on all of them alike and their ratios stay meaningful. Returns the
/// median ns per call of each, in order.
pub fn median_ns_per_op_interleaved(sampling: &Sampling, mut ops: Vec<Op<'_>>) -> Vec<f64> {
    let mut counters = vec![0u64; ops.len()];
    let batches: Vec<u64> = ops
        .iter_mut()
        .zip(counters.iter_mut())
        .map(|(op, counter)| {
            let mut batch = 64u64;
            loop {
                let start = Instant::now();
                for _ in 0..batch {
                    op(*counter);
                    *counter += 1;
                }
                let took = start.elapsed();
                if took >= sampling.sample_time / 10 || batch >= 1 << 30 {
                    let per_op = took.as_secs_f64() / batch as f64;
                    let target = sampling.sample_time.as_secs_f64() / per_op.max(1e-10);
                    break (target as u64).max(16);
                }
                batch *= 2;
            }
        })
        .collect();
    let mut samples = vec![Vec::with_capacity(sampling.samples); ops.len()];
    for _ in 0..sampling.samples {
        for (i, op) in ops.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..batches[i] {
                op(counters[i]);
                counters[i] += 1;
            }
            samples[i].push(start.elapsed().as_nanos() as f64 / batches[i] as f64);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect()
}

/// A batch of operations that prepares its inputs untimed and returns how long the
/// operations themselves took and how many there were.
pub type TimedBatch<'a> = Box<dyn FnMut() -> (Duration, u64) + 'a>;

/// Median ns per operation of each of several [`TimedBatch`]es, for operations that consume
/// what an earlier step built (an unmap needs a mapping) so that only the operation itself is
/// timed. One batch of each is a warm-up; each sample then runs batches until their timed
/// part reaches `sampling.sample_time` (at least one), the samples of the batches taken in
/// turn as in [`median_ns_per_op_interleaved`].
pub fn median_ns_per_timed_batch(
    sampling: &Sampling,
    mut batches: Vec<TimedBatch<'_>>,
) -> Vec<f64> {
    for b in batches.iter_mut() {
        b();
    }
    let mut samples = vec![Vec::with_capacity(sampling.samples); batches.len()];
    for _ in 0..sampling.samples {
        for (i, b) in batches.iter_mut().enumerate() {
            let (mut timed, mut ops) = (Duration::ZERO, 0u64);
            while timed < sampling.sample_time || ops == 0 {
                let (t, n) = b();
                timed += t;
                ops += n.max(1);
            }
            samples[i].push(timed.as_nanos() as f64 / ops as f64);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_positive_and_calls_the_op() {
        let sampling = Sampling {
            quick: true,
            samples: 3,
            sample_time: Duration::from_millis(1),
            build_profile: "test",
        };
        let mut calls = 0u64;
        let ns = median_ns_per_op(&sampling, |i| {
            calls += 1;
            std::hint::black_box(i);
        });
        assert!(ns > 0.0);
        assert!(calls >= 64 + 3 * 16);
    }

    #[test]
    fn interleaved_medians_come_back_in_order_for_every_op() {
        let sampling = Sampling {
            quick: true,
            samples: 3,
            sample_time: Duration::from_millis(1),
            build_profile: "test",
        };
        let (mut a, mut b) = (0u64, 0u64);
        let ns = median_ns_per_op_interleaved(
            &sampling,
            vec![
                Box::new(|i| a += std::hint::black_box(i) & 1),
                Box::new(|i| {
                    for j in 0..100 {
                        b = b.wrapping_add(std::hint::black_box(i ^ j));
                    }
                }),
            ],
        );
        assert_eq!(ns.len(), 2);
        assert!(ns.iter().all(|x| x.is_finite() && *x > 0.0), "{ns:?}");
    }

    #[test]
    fn timed_batches_report_the_time_they_return() {
        let sampling = Sampling {
            quick: true,
            samples: 3,
            sample_time: Duration::from_millis(1),
            build_profile: "test",
        };
        let mut calls = 0u64;
        let ns = median_ns_per_timed_batch(
            &sampling,
            vec![
                Box::new(|| (Duration::from_micros(100), 10)),
                Box::new(|| {
                    calls += 1;
                    (Duration::from_micros(500), 1)
                }),
            ],
        );
        assert_eq!(ns, vec![10_000.0, 500_000.0]);
        assert_eq!(calls, 1 + 3 * 2);
    }
}

/// A small deterministic PRNG (splitmix64) so every allocator sees the same request sizes.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A request size in pages: 1, 2, 4, 8 or 16 with falling probability (half of all
    /// requests are one page), roughly what a storage stack maps.
    pub fn pages(&mut self) -> u64 {
        let r = self.next_u64();
        1 << (r.trailing_ones().min(4))
    }
}

/// The allocator workload as an [`Op`]: `live` allocations held, then each operation frees a
/// random held allocation and allocates a new one of a random size (with `live == 0`:
/// allocate and free at once). Every allocator gets the same seed, so the same sequence of
/// sizes and victims. The allocator and whatever else the operation needs live in `state`.
///
/// `populate` builds the live set (untimed, before this returns); it is `alloc` for most
/// allocators, but a peer whose allocation is O(n) may place the live set directly where a
/// top-down allocator would have put it, so that setting up 100,000 live ranges does not take
/// minutes. Give the ops of several allocators to [`median_ns_per_op_interleaved`] so that
/// their samples are taken in turn.
pub fn churn_op<'a, S: 'a, T: 'a>(
    live: usize,
    mut state: S,
    mut populate: impl FnMut(&mut S, u64) -> T,
    mut alloc: impl FnMut(&mut S, u64) -> T + 'a,
    mut free: impl FnMut(&mut S, T) + 'a,
) -> Op<'a> {
    let mut rng = SplitMix64::new(0x10_1AB);
    let mut held: Vec<Option<T>> = (0..live)
        .map(|_| Some(populate(&mut state, rng.pages())))
        .collect();
    Box::new(move |_| {
        let pages = rng.pages();
        if live == 0 {
            let t = alloc(&mut state, pages);
            free(&mut state, t);
        } else {
            let victim = (rng.next_u64() % live as u64) as usize;
            if let Some(old) = held[victim].take() {
                free(&mut state, old);
            }
            held[victim] = Some(alloc(&mut state, pages));
        }
    })
}
