//! Virtual time: instants ([`SimTime`]) and spans ([`SimDuration`]) in whole nanoseconds.
//!
//! Both are plain `u64` newtypes. Arithmetic saturates instead of wrapping: 2^64 ns is
//! about 584 years of virtual time, far beyond any run, so saturation only matters for
//! "never" sentinels.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

use serde::Serialize;

/// An instant of virtual time, in nanoseconds since the start of the run.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct SimTime(pub u64);

/// A span of virtual time, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct SimDuration(pub u64);

impl SimTime {
    /// The start of every run.
    pub const ZERO: SimTime = SimTime(0);
    /// The largest representable instant ("never").
    pub const MAX: SimTime = SimTime(u64::MAX);

    /// An instant `ns` nanoseconds after the start.
    pub const fn from_ns(ns: u64) -> Self {
        SimTime(ns)
    }
    /// An instant `us` microseconds after the start.
    pub const fn from_us(us: u64) -> Self {
        SimTime(us.saturating_mul(1_000))
    }
    /// An instant `ms` milliseconds after the start.
    pub const fn from_ms(ms: u64) -> Self {
        SimTime(ms.saturating_mul(1_000_000))
    }
    /// An instant `s` seconds after the start.
    pub const fn from_secs(s: u64) -> Self {
        SimTime(s.saturating_mul(1_000_000_000))
    }
    /// Nanoseconds since the start.
    pub const fn as_ns(self) -> u64 {
        self.0
    }
    /// Seconds since the start, as a float (for reports only).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 * 1e-9
    }
    /// The span from `earlier` to `self`, or zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0.saturating_sub(earlier.0))
    }
}

impl SimDuration {
    /// No time at all.
    pub const ZERO: SimDuration = SimDuration(0);

    /// A span of `ns` nanoseconds.
    pub const fn ns(ns: u64) -> Self {
        SimDuration(ns)
    }
    /// A span of `us` microseconds.
    pub const fn us(us: u64) -> Self {
        SimDuration(us.saturating_mul(1_000))
    }
    /// A span of `ms` milliseconds.
    pub const fn ms(ms: u64) -> Self {
        SimDuration(ms.saturating_mul(1_000_000))
    }
    /// A span of `s` seconds.
    pub const fn secs(s: u64) -> Self {
        SimDuration(s.saturating_mul(1_000_000_000))
    }
    /// The span in nanoseconds.
    pub const fn as_ns(self) -> u64 {
        self.0
    }
    /// The span in seconds, as a float (for reports only).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 * 1e-9
    }
    /// Whether the span is empty.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl Add<SimDuration> for SimTime {
    type Output = SimTime;
    fn add(self, rhs: SimDuration) -> SimTime {
        SimTime(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign<SimDuration> for SimTime {
    fn add_assign(&mut self, rhs: SimDuration) {
        *self = *self + rhs;
    }
}

impl Sub<SimTime> for SimTime {
    type Output = SimDuration;
    /// The span between two instants; saturates at zero if `rhs` is later.
    fn sub(self, rhs: SimTime) -> SimDuration {
        self.saturating_since(rhs)
    }
}

impl Add for SimDuration {
    type Output = SimDuration;
    fn add(self, rhs: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for SimDuration {
    fn add_assign(&mut self, rhs: SimDuration) {
        *self = *self + rhs;
    }
}

impl Sub for SimDuration {
    type Output = SimDuration;
    /// Saturating difference.
    fn sub(self, rhs: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_sub(rhs.0))
    }
}

/// A duration for reading: whole nanoseconds below a microsecond (`954 ns`), else four
/// significant digits in the unit that suits it (`2.657 ms`, `16.90 us`, `1.500 s`).
pub fn human_ns(ns: u64) -> String {
    let (div, unit) = match ns {
        0..=999 => return format!("{ns} ns"),
        1_000..=999_999 => (1e3, "us"),
        1_000_000..=999_999_999 => (1e6, "ms"),
        _ => (1e9, "s"),
    };
    let v = ns as f64 / div;
    // Rounded up to 1000 of a unit (999,999 ns): shown as 1.000 of the next one.
    if (v * 10.0).round() >= 10_000.0 && unit != "s" {
        return format!("{:.3} {}", v / 1e3, if unit == "us" { "ms" } else { "s" });
    }
    let decimals = if v < 10.0 {
        3
    } else if v < 100.0 {
        2
    } else {
        1
    };
    format!("{v:.decimals$} {unit}")
}

fn fmt_ns(ns: u64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if ns >= 1_000_000_000 && ns % 1_000_000 == 0 {
        write!(f, "{}ms", ns / 1_000_000)
    } else if ns >= 1_000 && ns % 1_000 == 0 {
        write!(f, "{}us", ns / 1_000)
    } else {
        write!(f, "{ns}ns")
    }
}

impl fmt::Debug for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("t=")?;
        fmt_ns(self.0, f)
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_ns(self.0, f)
    }
}

impl fmt::Debug for SimDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_ns(self.0, f)
    }
}

impl fmt::Display for SimDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_ns(self.0, f)
    }
}

/// `x.round() as u64` (to nearest, halves away from zero; negative and NaN to 0, saturating
/// at `u64::MAX`) without the `round` library call, bit for bit the same result: the
/// fraction `x - trunc(x)` of a non-negative `x` is exact in floating point (below 2^52
/// it fits the significand; from 2^52 up `x` is whole and it is 0), so comparing it with
/// one half decides the rounding exactly. Used for the CPU
/// times the block stack charges per I/O.
#[inline]
pub(crate) fn round_ns(x: f64) -> u64 {
    let t = x as u64;
    if x - t as f64 >= 0.5 {
        t.saturating_add(1)
    } else {
        t
    }
}

/// `x.ceil() as u64` (negative and NaN to 0, saturating at `u64::MAX`) without the `ceil`
/// library call, bit for bit the same result: `trunc(x)` of a non-negative `x` below 2^53
/// converts back exactly, so it is below `x` exactly when `x` has a fraction (from 2^53 up
/// `x` is whole).
#[inline]
pub(crate) fn ceil_ns(x: f64) -> u64 {
    let t = x as u64;
    if (t as f64) < x {
        t.saturating_add(1)
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    /// Values around every rounding boundary and across the ranges, with the edge cases.
    fn samples() -> Vec<f64> {
        let mut v = vec![
            0.0,
            -0.0,
            0.5,
            0.49999999999999994,
            1.5,
            2.5,
            -0.5,
            -1.7,
            4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1.8446744073709552e19,
            1e30,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
            f64::MAX,
        ];
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mag = (s >> 58) as i32 - 8; // 2^-8 .. 2^55
            let frac = (s >> 11) as f64 / (1u64 << 53) as f64;
            let x = (1.0 + frac) * 2f64.powi(mag);
            v.extend([
                x,
                x.floor(),
                x.floor() + 0.5,
                f64::from_bits(x.to_bits() + 1),
                -x,
            ]);
        }
        v
    }

    #[test]
    fn round_ns_is_round_as_u64() {
        for x in samples() {
            assert_eq!(super::round_ns(x), x.round() as u64, "{x:e}");
        }
    }

    #[test]
    fn ceil_ns_is_ceil_as_u64() {
        for x in samples() {
            assert_eq!(super::ceil_ns(x), x.ceil() as u64, "{x:e}");
        }
    }

    #[test]
    fn durations_read_with_four_significant_digits() {
        use super::human_ns;
        assert_eq!(human_ns(0), "0 ns");
        assert_eq!(human_ns(954), "954 ns");
        assert_eq!(human_ns(16_904), "16.90 us");
        assert_eq!(human_ns(2_656_792), "2.657 ms");
        assert_eq!(human_ns(5_299_671), "5.300 ms");
        assert_eq!(human_ns(999_999), "1.000 ms");
        assert_eq!(human_ns(999_999_999), "1.000 s");
        assert_eq!(human_ns(123_456_789_000), "123.5 s");
    }

    use super::*;

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(SimTime::MAX + SimDuration::ns(1), SimTime::MAX);
        assert_eq!(SimTime(5) - SimTime(9), SimDuration::ZERO);
        assert_eq!(SimTime::from_us(2) + SimDuration::ns(5), SimTime(2_005));
        assert_eq!(
            SimDuration::ms(1) - SimDuration::us(1),
            SimDuration::ns(999_000)
        );
    }

    #[test]
    fn formats_in_readable_units() {
        assert_eq!(format!("{}", SimDuration::us(3)), "3us");
        assert_eq!(format!("{}", SimDuration::ns(1_500)), "1500ns");
        assert_eq!(format!("{:?}", SimTime::from_secs(2)), "t=2000ms");
    }
}
