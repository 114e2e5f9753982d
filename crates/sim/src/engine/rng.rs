//! The lab's pseudo-random number generator: xoshiro256** seeded through splitmix64.
//!
//! The algorithm is implemented here, not taken from a crate, so that a run's results can
//! never change with a dependency upgrade. Both algorithms are by Blackman and Vigna
//! (<https://prng.di.unimi.it/>); the test vectors below were computed from their reference
//! C code.

/// One step of splitmix64: advances `state` and returns the next output.
///
/// Used to expand a 64-bit seed into xoshiro's 256-bit state and (after [`mix64`] of the
/// run seed, see [`task_seed`]) to derive independent per-task seeds.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    mix64(*state)
}

/// The splitmix64 output function (Stafford's "Mix13"): a bijection on 64-bit words in
/// which every input bit affects every output bit, so inputs that differ by a constant, a
/// multiple or a bit give outputs with no arithmetic relation.
#[inline]
pub fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Keeps the seeds [`task_seed`] and [`derive_seed`] make apart even for equal arguments.
const TASK_DOMAIN: u64 = 0x7a5c_0000_0000_0001;
/// See [`TASK_DOMAIN`].
const DERIVE_DOMAIN: u64 = 0xd371_0000_0000_0002;

/// The seed of the stream of task number `index` (spawn order) in a run seeded with
/// `run_seed`.
///
/// The run seed is mixed first, then task `index` takes output `index` of the splitmix64
/// stream that starts at the mixed value. Mixing first matters: without it, run seed
/// `s + k * 0x9e3779b97f4a7c15` would give task `i` exactly the stream of task `i + k` of
/// run `s`, so runs whose seeds differ by a multiple of the golden-ratio increment (as
/// `s * 0x9e3779b97f4a7c15 + c` derivations do for consecutive `s`) would share most of
/// their random numbers.
#[inline]
pub fn task_seed(run_seed: u64, index: u64) -> u64 {
    let mut state =
        mix64(run_seed ^ TASK_DOMAIN).wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    splitmix64(&mut state)
}

/// A run seed derived from a base seed and a label (a configuration or repetition index):
/// the one way experiments and scenarios derive the seeds of their runs.
///
/// Distinct `(base, label)` pairs give unrelated seeds, whatever the arithmetic relation
/// between the bases (consecutive base seeds, as `iolab run --runs N` uses, included).
#[inline]
pub fn derive_seed(base: u64, label: u64) -> u64 {
    mix64(mix64(base ^ DERIVE_DOMAIN).wrapping_add(mix64(label)))
}

/// The seed of repetition `r` of a run with base seed `base`: the base itself for the first
/// (so `--seed S` reruns it), [`derive_seed`] for the others.
pub fn repetition_seed(base: u64, r: u32) -> u64 {
    if r == 0 {
        base
    } else {
        derive_seed(base, u64::from(r))
    }
}

/// A xoshiro256** generator. Deterministic: the same seed gives the same sequence on every
/// platform and every version of this crate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose 256-bit state is expanded from `seed` with splitmix64.
    pub fn seed_from_u64(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Rng { s }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform integer in `0..n` (Lemire's multiply-shift with rejection; unbiased).
    /// Returns 0 when `n == 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            let lo = m as u64;
            if lo >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform integer in `lo..=hi` (`lo` if `hi < lo`).
    #[inline]
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// A uniform float in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `base` nanoseconds jittered uniformly by up to `±pct` percent (rounded to whole ns).
    pub fn jitter(&mut self, base: u64, pct: u32) -> u64 {
        let spread = base.saturating_mul(u64::from(pct)) / 100;
        self.range_inclusive(base.saturating_sub(spread), base.saturating_add(spread))
    }

    /// An exponentially distributed integer with the given mean (inverse-transform
    /// sampling; rounded to whole ns). Useful for Poisson arrivals.
    pub fn exponential(&mut self, mean: u64) -> u64 {
        let u = 1.0 - self.next_f64(); // in (0, 1]
        (-(u.ln()) * mean as f64).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_reference() {
        // Reference outputs of splitmix64 seeded with 0.
        let mut s = 0u64;
        assert_eq!(splitmix64(&mut s), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(&mut s), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(splitmix64(&mut s), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn xoshiro256starstar_matches_reference() {
        // Reference: state {1, 2, 3, 4} gives 11520, 0, 1509978240, 1215971899390074240.
        let mut r = Rng { s: [1, 2, 3, 4] };
        assert_eq!(r.next_u64(), 11520);
        assert_eq!(r.next_u64(), 0);
        assert_eq!(r.next_u64(), 1_509_978_240);
        assert_eq!(r.next_u64(), 1_215_971_899_390_074_240);
    }

    #[test]
    fn bounded_draws_stay_in_range() {
        let mut r = Rng::seed_from_u64(7);
        for _ in 0..10_000 {
            assert!(r.below(10) < 10);
            let j = r.jitter(1_000, 10);
            assert!((900..=1_100).contains(&j));
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.range_inclusive(5, 5), 5);
    }

    #[test]
    fn exponential_mean_is_close() {
        let mut r = Rng::seed_from_u64(1);
        let n = 100_000u64;
        let sum: u64 = (0..n).map(|_| r.exponential(1_000)).sum();
        let mean = sum / n;
        assert!((970..=1_030).contains(&mean), "mean {mean}");
    }
}
