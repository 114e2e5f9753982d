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

/// Measures `op` on items that `prepare` makes untimed, `batch` at a time, and returns the
/// median ns per `op` call: for operations that consume what an earlier step built (an
/// unmap needs a mapping), so that only the operation itself is timed.
///
/// One batch is a warm-up; each sample then runs batches until its timed part reaches
/// `sampling.sample_time` (at least one batch).
pub fn median_ns_per_prepared_op<T>(
    sampling: &Sampling,
    batch: usize,
    mut prepare: impl FnMut(usize) -> Vec<T>,
    mut op: impl FnMut(T),
) -> f64 {
    let mut run_batch = || {
        let items = prepare(batch);
        let n = items.len() as u64;
        let start = Instant::now();
        for item in items {
            op(item);
        }
        (start.elapsed(), n)
    };
    run_batch();
    let mut samples: Vec<f64> = (0..sampling.samples)
        .map(|_| {
            let (mut timed, mut ops) = (Duration::ZERO, 0u64);
            while timed < sampling.sample_time || ops == 0 {
                let (t, n) = run_batch();
                timed += t;
                ops += n;
            }
            timed.as_nanos() as f64 / ops.max(1) as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
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
    fn prepared_ops_time_only_the_op_and_use_every_item() {
        let sampling = Sampling {
            quick: true,
            samples: 3,
            sample_time: Duration::from_millis(1),
            build_profile: "test",
        };
        let (mut made, mut used) = (0usize, 0usize);
        let ns = median_ns_per_prepared_op(
            &sampling,
            8,
            |n| {
                made += n;
                vec![1u64; n]
            },
            |x| {
                used += 1;
                std::hint::black_box(x);
            },
        );
        assert!(ns.is_finite() && ns >= 0.0);
        assert_eq!(made, used);
        assert!(used >= 8 * 4);
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

/// The allocator workload: `live` allocations held, then each operation frees a random held
/// allocation and allocates a new one of a random size (with `live == 0`: allocate and free
/// at once). Every allocator gets the same seed, so the same sequence of sizes and victims.
///
/// `populate` builds the live set (untimed); it is `alloc` for most allocators, but a peer
/// whose allocation is O(n) may place the live set directly where a top-down allocator would
/// have put it, so that setting up 100,000 live ranges does not take minutes.
pub fn churn_ns_per_op<T>(
    sampling: &Sampling,
    live: usize,
    mut populate: impl FnMut(u64) -> T,
    mut alloc: impl FnMut(u64) -> T,
    mut free: impl FnMut(T),
) -> f64 {
    let mut rng = SplitMix64::new(0x10_1AB);
    let mut held: Vec<Option<T>> = (0..live).map(|_| Some(populate(rng.pages()))).collect();
    let ns = median_ns_per_op(sampling, |_| {
        let pages = rng.pages();
        if live == 0 {
            let t = alloc(pages);
            free(t);
        } else {
            let victim = (rng.next_u64() % live as u64) as usize;
            if let Some(old) = held[victim].take() {
                free(old);
            }
            held[victim] = Some(alloc(pages));
        }
    });
    for t in held.into_iter().flatten() {
        free(t);
    }
    ns
}
