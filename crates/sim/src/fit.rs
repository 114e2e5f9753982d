//! Fitting a lab's unknowns to observed figures: bounded, deterministic, derivative-free.
//!
//! A fit has a few [`Unknown`]s (a scenario field or a profile cost, each with the range its
//! sources allow) and [`Target`]s (observed figures: a real run's IOPS, a published table's
//! cell). An [`Evaluate`] implementation runs the lab at a batch of parameter vectors and
//! returns every target's lab value at each; the fitter never looks inside the lab.
//!
//! - **Scale.** An unknown with `lo > 0` is searched on a log scale (latencies, costs and
//!   counts span orders of magnitude and act multiplicatively), otherwise linearly. Each
//!   unknown is mapped to `u` in `[0, 1]`; an integer unknown is rounded, a real one kept to
//!   [`SIGNIFICANT_DIGITS`], so every value the lab ran is a short number that a scenario
//!   file holds exactly.
//! - **Objective.** The sum over the targets of the squared relative residual
//!   `(lab / observed - 1)^2`, so IOPS and microseconds weigh alike.
//! - **Search.** A fixed grid first (9 points for one unknown, 5 per axis for two, 3 for
//!   three or four; the centre alone for five or more), evaluated as one batch, finds the
//!   basin; then cyclic coordinate search, each step a golden-section line search on one
//!   unknown within a grid step of the best point (the whole range from the centre), until
//!   no unknown moves by more than [`TOLERANCE`] of its range or after [`MAX_CYCLES`]. Nothing is random and the batches do not depend on how many threads
//!   run them, so a fit is a pure function of its targets and the lab.
//! - **Identifiability.** At the fit each unknown is moved by [`PROBE`] of its range either
//!   way (an integer one by 1) and each target's elasticity measured: the percent change of
//!   the figure per percent change of the unknown. An unknown no target responds to
//!   ([`FLAT`]) is not identifiable from these targets; one that ends within
//!   [`AT_BOUND`] of an end of its range is reported as bound-hitting.
//! - **Leave-one-out.** With targets in two or more groups (runs), [`Fitter::leave_one_out`]
//!   refits without each group in turn and predicts it.
//!
//! Every evaluated point is cached, so repeated points (the grid of a leave-one-out refit)
//! cost no lab run.

use std::collections::BTreeMap;

/// A real value the fitter evaluates is kept to this many significant digits.
pub const SIGNIFICANT_DIGITS: i32 = 4;
/// A line search stops when its bracket is this fraction of the unknown's range.
pub const TOLERANCE: f64 = 1e-3;
/// Coordinate-search cycles at most (for two or more unknowns).
pub const MAX_CYCLES: usize = 6;
/// The move, as a fraction of the range, that measures a target's sensitivity.
pub const PROBE: f64 = 0.02;
/// Below this largest |elasticity| an unknown is reported as not identifiable.
pub const FLAT: f64 = 0.05;
/// A fit within this fraction of the range from an end is reported as bound-hitting.
pub const AT_BOUND: f64 = 0.005;
/// Two unknowns whose elasticity vectors have a |cosine| above this are reported as
/// confounded.
pub const CONFOUNDED: f64 = 0.995;
/// Unknowns in one fit at most.
pub const MAX_UNKNOWNS: usize = 8;

const GOLDEN: f64 = 0.618_033_988_749_894_8;

/// One unknown: a name (the field or cost it sets) and its range.
#[derive(Clone, Debug, PartialEq)]
pub struct Unknown {
    /// What it sets, as the caller names it (`device[0].read_latency_us`).
    pub name: String,
    /// Lower end of the range.
    pub lo: f64,
    /// Upper end of the range.
    pub hi: f64,
    /// Whether only whole numbers are valid (a job count, a queue depth).
    pub integer: bool,
}

impl Unknown {
    /// Whether the search runs on a log scale (`lo > 0`).
    pub fn log_scale(&self) -> bool {
        self.lo > 0.0
    }

    /// The value at `u` in `[0, 1]` of the range, rounded as the fitter evaluates it.
    pub fn at(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        let x = if self.log_scale() {
            self.lo * (self.hi / self.lo).powf(u)
        } else {
            self.lo + (self.hi - self.lo) * u
        };
        self.round(x)
    }

    /// Where `x` sits in the range, in `[0, 1]`.
    pub fn position(&self, x: f64) -> f64 {
        let u = if self.log_scale() {
            (x / self.lo).ln() / (self.hi / self.lo).ln()
        } else {
            (x - self.lo) / (self.hi - self.lo)
        };
        u.clamp(0.0, 1.0)
    }

    /// `x` rounded as the fitter keeps values: whole for an integer unknown, else to
    /// [`SIGNIFICANT_DIGITS`]; never outside the range.
    pub fn round(&self, x: f64) -> f64 {
        let r = if self.integer {
            x.round()
        } else if x == 0.0 || !x.is_finite() {
            x
        } else {
            let magnitude = x.abs().log10().floor() as i32;
            let scale = 10f64.powi(SIGNIFICANT_DIGITS - 1 - magnitude);
            (x * scale).round() / scale
        };
        r.clamp(self.lo, self.hi)
    }

    /// Checks the range: finite, `lo < hi`, and for an integer unknown whole ends.
    pub fn check(&self) -> Result<(), String> {
        if !self.lo.is_finite() || !self.hi.is_finite() {
            return Err(format!(
                "{}: the range's ends must be finite numbers",
                self.name
            ));
        }
        if self.lo >= self.hi {
            return Err(format!(
                "{}: expected a range LO..HI with LO < HI, found {}..{}",
                self.name, self.lo, self.hi
            ));
        }
        if self.integer && (self.lo.fract() != 0.0 || self.hi.fract() != 0.0) {
            return Err(format!(
                "{}: the field takes whole numbers, so the range's ends must be whole ({}..{})",
                self.name, self.lo, self.hi
            ));
        }
        Ok(())
    }
}

/// One observed figure the lab is fitted to.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// How the caller names it (`run 1 read.iops`).
    pub name: String,
    /// The observed value (never zero).
    pub observed: f64,
    /// Its group for leave-one-out: targets of one group (one run) are left out together.
    pub group: usize,
}

/// Runs the lab: every target's value at each parameter vector.
pub trait Evaluate {
    /// Why the lab could not give a value.
    type Error;
    /// For each parameter vector (one value per unknown, in order, already rounded), the lab
    /// value of every target, in target order.
    fn evaluate(&mut self, points: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, Self::Error>;
}

/// What the fitter says about one unknown at the fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some target responds to it and the fit is inside its range.
    Identified,
    /// No target responds to it anywhere in its range (largest |elasticity| below
    /// [`FLAT`] at the fit, and no figure moves by 1% at either end).
    Flat,
    /// The targets do not respond to it near the fit but do elsewhere in its range: the fit
    /// sits on a plateau where nearby values fit as well.
    Plateau,
    /// The fit sits at the low end of the range.
    AtLowerBound,
    /// The fit sits at the high end of the range.
    AtUpperBound,
}

impl Verdict {
    /// How the report words it.
    pub fn describe(self) -> &'static str {
        match self {
            Verdict::Identified => "identified",
            Verdict::Flat => "NOT identifiable: no figure responds to it",
            Verdict::Plateau => {
                "NOT identified: on a plateau (the figures respond only further away)"
            }
            Verdict::AtLowerBound => "at the range's low end: widen it, or a mechanism is missing",
            Verdict::AtUpperBound => "at the range's high end: widen it, or a mechanism is missing",
        }
    }
}

/// One unknown's sensitivity at the fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Sensitivity {
    /// Per target: percent change of the lab figure per percent change of the unknown
    /// (`NaN` where the probe could not move the unknown).
    pub elasticity: Vec<f64>,
    /// The verdict.
    pub verdict: Verdict,
}

/// A finished fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    /// The fitted value of each unknown.
    pub values: Vec<f64>,
    /// Each target's lab value at the fit.
    pub lab: Vec<f64>,
    /// The objective at the fit (sum of squared relative residuals over the fitted targets).
    pub objective: f64,
    /// Each unknown's sensitivity (empty when not measured).
    pub sensitivity: Vec<Sensitivity>,
    /// Pairs of unknowns (indices) that move the figures alike (elasticity vectors within
    /// [`CONFOUNDED`] of parallel): the figures identify a combination of the two, not each.
    pub confounded: Vec<(usize, usize)>,
}

impl Fit {
    /// Target `i`'s relative residual, `lab / observed - 1`.
    pub fn residual(&self, targets: &[Target], i: usize) -> f64 {
        self.lab[i] / targets[i].observed - 1.0
    }
}

/// One leave-one-out refit: group `group` left out, then predicted.
#[derive(Clone, Debug, PartialEq)]
pub struct LeftOut {
    /// The group left out.
    pub group: usize,
    /// The unknowns fitted without it.
    pub values: Vec<f64>,
    /// The left-out targets: (target index, the lab's prediction).
    pub predicted: Vec<(usize, f64)>,
}

/// A fit's state: its unknowns, targets, the lab and every point evaluated so far.
pub struct Fitter<'a, E: Evaluate> {
    unknowns: Vec<Unknown>,
    targets: Vec<Target>,
    lab: &'a mut E,
    cache: BTreeMap<Vec<u64>, Vec<f64>>,
    /// Called after each batch: (points evaluated so far, best objective so far).
    observer: Option<Box<dyn FnMut(usize, f64) + 'a>>,
    best_seen: f64,
}

impl<'a, E: Evaluate> Fitter<'a, E> {
    /// A fitter; checks the unknowns' ranges and that every observed value is finite and
    /// non-zero.
    pub fn new(
        unknowns: Vec<Unknown>,
        targets: Vec<Target>,
        lab: &'a mut E,
    ) -> Result<Self, String> {
        if unknowns.is_empty() {
            return Err("expected at least one unknown".to_owned());
        }
        if unknowns.len() > MAX_UNKNOWNS {
            return Err(format!(
                "expected at most {MAX_UNKNOWNS} unknowns in one fit, found {}",
                unknowns.len()
            ));
        }
        for u in &unknowns {
            u.check()?;
        }
        if targets.is_empty() {
            return Err("expected at least one figure to fit to".to_owned());
        }
        for t in &targets {
            if !t.observed.is_finite() || t.observed == 0.0 {
                return Err(format!(
                    "{}: the observed value is {}, and a relative residual needs a finite, non-zero one",
                    t.name, t.observed
                ));
            }
        }
        Ok(Self {
            unknowns,
            targets,
            lab,
            cache: BTreeMap::new(),
            observer: None,
            best_seen: f64::INFINITY,
        })
    }

    /// Calls `f(points evaluated, best objective)` after every batch (progress bars).
    pub fn observe(&mut self, f: impl FnMut(usize, f64) + 'a) {
        self.observer = Some(Box::new(f));
    }

    /// The lab points evaluated so far (each a run of every target's scenario).
    pub fn evaluations(&self) -> usize {
        self.cache.len()
    }

    /// The unknowns.
    pub fn unknowns(&self) -> &[Unknown] {
        &self.unknowns
    }

    /// The targets.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// A rough count of the points a fit evaluates (the grid, the line searches, the
    /// sensitivity probes), for progress bars.
    pub fn expected_evaluations(&self) -> usize {
        let d = self.unknowns.len();
        let line = ((2.0 * TOLERANCE).ln() / GOLDEN.ln()).ceil() as usize;
        let cycles = if d == 1 { 1 } else { 3 };
        grid_side(d).pow(d as u32) + d * line * cycles + 2 * d
    }

    fn key(x: &[f64]) -> Vec<u64> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    fn values_at(&self, u: &[f64]) -> Vec<f64> {
        self.unknowns.iter().zip(u).map(|(k, &u)| k.at(u)).collect()
    }

    /// The lab values at each of `points` (values, not positions), running only the points
    /// not yet cached, as one batch.
    fn lab_at(&mut self, points: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, E::Error> {
        let mut fresh: Vec<Vec<f64>> = Vec::new();
        for p in points {
            if !self.cache.contains_key(&Self::key(p)) && !fresh.contains(p) {
                fresh.push(p.clone());
            }
        }
        if !fresh.is_empty() {
            let out = self.lab.evaluate(&fresh)?;
            for (p, v) in fresh.into_iter().zip(out) {
                self.cache.insert(Self::key(&p), v);
            }
        }
        Ok(points
            .iter()
            .map(|p| self.cache[&Self::key(p)].clone())
            .collect())
    }

    fn objective(&self, lab: &[f64], active: &[bool]) -> f64 {
        let mut sum = 0.0;
        for (i, t) in self.targets.iter().enumerate() {
            if !active[i] {
                continue;
            }
            let r = lab[i] / t.observed - 1.0;
            sum += if r.is_finite() { r * r } else { 1e12 };
        }
        sum
    }

    /// Objectives at positions `us`, as one batch.
    fn objectives(&mut self, us: &[Vec<f64>], active: &[bool]) -> Result<Vec<f64>, E::Error> {
        let points: Vec<Vec<f64>> = us.iter().map(|u| self.values_at(u)).collect();
        let labs = self.lab_at(&points)?;
        let out: Vec<f64> = labs.iter().map(|l| self.objective(l, active)).collect();
        for &o in &out {
            self.best_seen = self.best_seen.min(o);
        }
        let (n, best) = (self.cache.len(), self.best_seen);
        if let Some(f) = self.observer.as_mut() {
            f(n, best);
        }
        Ok(out)
    }

    /// Fits the unknowns to all targets and measures each unknown's sensitivity.
    pub fn fit(&mut self) -> Result<Fit, E::Error> {
        let active = vec![true; self.targets.len()];
        let u = self.minimise(&active)?;
        let values = self.values_at(&u);
        let lab = self.lab_at(std::slice::from_ref(&values))?.remove(0);
        let objective = self.objective(&lab, &active);
        let sensitivity = self.sensitivity(&values, &lab)?;
        let confounded = confounded(&sensitivity);
        Ok(Fit {
            values,
            lab,
            objective,
            sensitivity,
            confounded,
        })
    }

    /// Refits without each group of targets in turn and predicts the group left out; empty
    /// when the targets form fewer than two groups.
    pub fn leave_one_out(&mut self) -> Result<Vec<LeftOut>, E::Error> {
        let mut groups: Vec<usize> = self.targets.iter().map(|t| t.group).collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.len() < 2 {
            return Ok(Vec::new());
        }
        groups
            .into_iter()
            .map(|g| self.leave_group_out(g))
            .collect()
    }

    /// Refits without the targets of group `group` and predicts them.
    pub fn leave_group_out(&mut self, group: usize) -> Result<LeftOut, E::Error> {
        let active: Vec<bool> = self.targets.iter().map(|t| t.group != group).collect();
        let u = self.minimise(&active)?;
        let values = self.values_at(&u);
        let lab = self.lab_at(std::slice::from_ref(&values))?.remove(0);
        let predicted = (0..self.targets.len())
            .filter(|&i| !active[i])
            .map(|i| (i, lab[i]))
            .collect();
        Ok(LeftOut {
            group,
            values,
            predicted,
        })
    }

    /// The best position found for the active targets.
    fn minimise(&mut self, active: &[bool]) -> Result<Vec<f64>, E::Error> {
        let d = self.unknowns.len();
        let side = grid_side(d);
        let grid: Vec<Vec<f64>> = (0..side.pow(d as u32))
            .map(|mut k| {
                (0..d)
                    .map(|_| {
                        let i = k % side;
                        k /= side;
                        if side == 1 {
                            0.5
                        } else {
                            i as f64 / (side - 1) as f64
                        }
                    })
                    .collect()
            })
            .collect();
        let scores = self.objectives(&grid, active)?;
        // The first best in enumeration order: ties break the same way every time.
        let mut best = 0;
        for (i, s) in scores.iter().enumerate() {
            if *s < scores[best] {
                best = i;
            }
        }
        let mut u = grid[best].clone();
        let mut score = scores[best];
        let mut step = vec![
            if side == 1 {
                0.5
            } else {
                1.0 / (side - 1) as f64
            };
            d
        ];
        let cycles = if d == 1 { 1 } else { MAX_CYCLES };
        for _ in 0..cycles {
            let mut moved: f64 = 0.0;
            for j in 0..d {
                let before = u[j];
                let (a, b) = ((u[j] - step[j]).max(0.0), (u[j] + step[j]).min(1.0));
                let (uj, s) = self.line_search(&u, j, a, b, score, active)?;
                u[j] = uj;
                score = s;
                let delta = (uj - before).abs();
                moved = moved.max(delta);
                step[j] = (2.0 * delta).max(4.0 * TOLERANCE).min(step[j]);
            }
            if moved < TOLERANCE {
                break;
            }
        }
        Ok(u)
    }

    /// Golden-section search of unknown `j` over `[a, b]` from position `u` (objective
    /// `score` there): the best position seen and its objective.
    fn line_search(
        &mut self,
        u: &[f64],
        j: usize,
        mut a: f64,
        mut b: f64,
        score: f64,
        active: &[bool],
    ) -> Result<(f64, f64), E::Error> {
        let at = |x: f64| {
            let mut p = u.to_vec();
            p[j] = x;
            p
        };
        let (mut best_u, mut best) = (u[j], score);
        let mut c = b - GOLDEN * (b - a);
        let mut d = a + GOLDEN * (b - a);
        let both = self.objectives(&[at(c), at(d)], active)?;
        let (mut fc, mut fd) = (both[0], both[1]);
        for (x, f) in [(c, fc), (d, fd)] {
            if f < best {
                (best_u, best) = (x, f);
            }
        }
        while b - a > TOLERANCE {
            if fc <= fd {
                b = d;
                d = c;
                fd = fc;
                c = b - GOLDEN * (b - a);
                fc = self.objectives(&[at(c)], active)?[0];
                if fc < best {
                    (best_u, best) = (c, fc);
                }
            } else {
                a = c;
                c = d;
                fc = fd;
                d = a + GOLDEN * (b - a);
                fd = self.objectives(&[at(d)], active)?[0];
                if fd < best {
                    (best_u, best) = (d, fd);
                }
            }
        }
        Ok((best_u, best))
    }

    /// Each unknown's elasticities at `values` (lab values `lab`) and its verdict.
    fn sensitivity(&mut self, values: &[f64], lab: &[f64]) -> Result<Vec<Sensitivity>, E::Error> {
        let d = self.unknowns.len();
        let mut probes = Vec::with_capacity(2 * d);
        for (j, k) in self.unknowns.iter().enumerate() {
            let (down, up) = if k.integer {
                ((values[j] - 1.0).max(k.lo), (values[j] + 1.0).min(k.hi))
            } else {
                let u = k.position(values[j]);
                (k.at(u - PROBE), k.at(u + PROBE))
            };
            for x in [down, up] {
                let mut p = values.to_vec();
                p[j] = x;
                probes.push(p);
            }
        }
        let labs = self.lab_at(&probes)?;
        let mut out = Vec::with_capacity(d);
        let unknowns = self.unknowns.clone();
        for (j, k) in unknowns.iter().enumerate() {
            let (down, up) = (&labs[2 * j], &labs[2 * j + 1]);
            let (xd, xu) = (probes[2 * j][j], probes[2 * j + 1][j]);
            let elasticity: Vec<f64> = (0..self.targets.len())
                .map(|i| {
                    if xu == xd {
                        return f64::NAN;
                    }
                    // Relative change of the figure per relative change of the unknown,
                    // both against the fit (central where the probe could go both ways).
                    let dy = (up[i] - down[i]) / lab[i];
                    let scale = if values[j] != 0.0 {
                        values[j]
                    } else {
                        k.hi - k.lo
                    };
                    dy / ((xu - xd) / scale)
                })
                .collect();
            let largest = elasticity
                .iter()
                .filter(|e| e.is_finite())
                .fold(0.0f64, |m, e| m.max(e.abs()));
            let u = k.position(values[j]);
            let at_low = u <= AT_BOUND;
            let at_high = u >= 1.0 - AT_BOUND;
            // A figure flat here may still respond elsewhere in the range (both ends tell):
            // at an end, the fit then wants a value beyond the range; inside, the fit sits
            // on a plateau where any nearby value fits as well.
            let responds_elsewhere = if largest < FLAT {
                let ends: Vec<Vec<f64>> = [0.0, 1.0]
                    .iter()
                    .map(|&e| {
                        let mut p = values.to_vec();
                        p[j] = k.at(e);
                        p
                    })
                    .collect();
                let far = self.lab_at(&ends)?;
                far.iter()
                    .any(|f| f.iter().zip(lab).any(|(a, b)| ((a - b) / b).abs() > 0.01))
            } else {
                false
            };
            let verdict = if largest < FLAT && !responds_elsewhere {
                Verdict::Flat
            } else if at_low {
                Verdict::AtLowerBound
            } else if at_high {
                Verdict::AtUpperBound
            } else if largest < FLAT {
                Verdict::Plateau
            } else {
                Verdict::Identified
            };
            out.push(Sensitivity {
                elasticity,
                verdict,
            });
        }
        Ok(out)
    }
}

/// The pairs of identified-or-bound unknowns whose elasticity vectors are near parallel.
fn confounded(sensitivity: &[Sensitivity]) -> Vec<(usize, usize)> {
    let norm = |v: &[f64]| {
        v.iter()
            .filter(|x| x.is_finite())
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt()
    };
    let mut out = Vec::new();
    for a in 0..sensitivity.len() {
        for b in a + 1..sensitivity.len() {
            let (sa, sb) = (&sensitivity[a], &sensitivity[b]);
            if sa.verdict == Verdict::Flat || sb.verdict == Verdict::Flat {
                continue;
            }
            let dot: f64 = sa
                .elasticity
                .iter()
                .zip(&sb.elasticity)
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|(x, y)| x * y)
                .sum();
            let (na, nb) = (norm(&sa.elasticity), norm(&sb.elasticity));
            if na > 0.0 && nb > 0.0 && (dot / (na * nb)).abs() > CONFOUNDED {
                out.push((a, b));
            }
        }
    }
    out
}

/// `f` of every item, on up to `jobs` threads, results in the items' order: how an
/// [`Evaluate`] runs a batch's lab runs (each a single-threaded, independent simulation).
pub fn in_parallel<T: Sync, R: Send>(
    jobs: usize,
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let out = f(item);
                if let Ok(mut slot) = slots[i].lock() {
                    *slot = Some(out);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .ok()
                .flatten()
                .expect("every item ran to a result")
        })
        .collect()
}

/// Grid points per axis for `d` unknowns.
fn grid_side(d: usize) -> usize {
    match d {
        1 => 9,
        2 => 5,
        3 | 4 => 3,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic lab: figure i = a_i * x0^p_i * (1 + x1), counting its runs.
    struct Toy {
        runs: usize,
        batch_sizes: Vec<usize>,
        f: fn(&[f64]) -> Vec<f64>,
    }

    impl Evaluate for Toy {
        type Error = String;
        fn evaluate(&mut self, points: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, String> {
            self.runs += points.len();
            self.batch_sizes.push(points.len());
            Ok(points.iter().map(|p| (self.f)(p)).collect())
        }
    }

    fn unknown(name: &str, lo: f64, hi: f64) -> Unknown {
        Unknown {
            name: name.into(),
            lo,
            hi,
            integer: false,
        }
    }

    fn target(name: &str, observed: f64, group: usize) -> Target {
        Target {
            name: name.into(),
            observed,
            group,
        }
    }

    #[test]
    fn one_unknown_is_recovered_from_a_service_time_figure() {
        // IOPS at depth 1 = 1e6 / (latency + 8 us of software).
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| vec![1e6 / (p[0] + 8.0)],
        };
        let observed = 1e6 / (150.0 + 8.0);
        let mut fitter = Fitter::new(
            vec![unknown("lat", 10.0, 500.0)],
            vec![target("iops", observed, 0)],
            &mut lab,
        )
        .unwrap();
        let fit = fitter.fit().unwrap();
        assert!(
            (fit.values[0] / 150.0 - 1.0).abs() < 0.005,
            "{:?}",
            fit.values
        );
        assert_eq!(fit.sensitivity[0].verdict, Verdict::Identified);
        let e = fit.sensitivity[0].elasticity[0];
        assert!((e + 150.0 / 158.0).abs() < 0.02, "elasticity {e}");
        assert!(fitter.evaluations() <= fitter.expected_evaluations() + 2);
        drop(fitter);
        // The grid runs as one batch of nine.
        assert_eq!(lab.batch_sizes[0], 9);
    }

    #[test]
    fn a_figure_that_ignores_the_unknown_is_reported_flat() {
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| vec![1e6 / (p[0] + 8.0), 42.0],
        };
        let mut fitter = Fitter::new(
            vec![unknown("lat", 10.0, 500.0), unknown("ignored", 1.0, 100.0)],
            vec![target("iops", 1e6 / 108.0, 0), target("const", 42.0, 0)],
            &mut lab,
        )
        .unwrap();
        let fit = fitter.fit().unwrap();
        assert!(
            (fit.values[0] / 100.0 - 1.0).abs() < 0.005,
            "{:?}",
            fit.values
        );
        assert_eq!(fit.sensitivity[0].verdict, Verdict::Identified);
        assert_eq!(fit.sensitivity[1].verdict, Verdict::Flat);
    }

    #[test]
    fn an_observation_beyond_the_range_is_reported_at_the_bound() {
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| vec![1e6 / (p[0] + 8.0)],
        };
        // 1e6 / 1008 would need latency 1000, above the range's 500.
        let mut fitter = Fitter::new(
            vec![unknown("lat", 10.0, 500.0)],
            vec![target("iops", 1e6 / 1008.0, 0)],
            &mut lab,
        )
        .unwrap();
        let fit = fitter.fit().unwrap();
        assert_eq!(fit.values[0], 500.0);
        assert_eq!(fit.sensitivity[0].verdict, Verdict::AtUpperBound);
    }

    #[test]
    fn a_fit_at_an_end_where_the_figure_turns_flat_is_bound_hitting_not_flat() {
        // Flat below 300, falling above: the observation asks more than the model gives.
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| vec![1000.0 - (p[0] - 300.0).max(0.0)],
        };
        let mut fitter = Fitter::new(
            vec![unknown("sync", 0.0, 1000.0)],
            vec![target("iops", 1100.0, 0)],
            &mut lab,
        )
        .unwrap();
        let fit = fitter.fit().unwrap();
        assert_eq!(fit.values[0], 0.0);
        assert_eq!(fit.sensitivity[0].verdict, Verdict::AtLowerBound);
    }

    #[test]
    fn two_unknowns_and_two_figures_are_recovered_together() {
        // A read and a write figure, each led by its own latency, sharing CPU time.
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| {
                vec![
                    1e6 / (p[0] + 0.1 * p[1] + 5.0),
                    1e6 / (p[1] + 0.2 * p[0] + 5.0),
                ]
            },
        };
        let (r, w) = (80.0, 20.0);
        let obs = (lab.f)(&[r, w]);
        let mut fitter = Fitter::new(
            vec![unknown("read", 10.0, 500.0), unknown("write", 1.0, 200.0)],
            vec![
                target("read.iops", obs[0], 0),
                target("write.iops", obs[1], 1),
            ],
            &mut lab,
        )
        .unwrap();
        let fit = fitter.fit().unwrap();
        assert!((fit.values[0] / r - 1.0).abs() < 0.01, "{:?}", fit.values);
        assert!((fit.values[1] / w - 1.0).abs() < 0.01, "{:?}", fit.values);
        assert!(fit.confounded.is_empty());
        let loo = fitter.leave_one_out().unwrap();
        assert_eq!(loo.len(), 2);
        assert_eq!(loo[0].predicted.len(), 1);
    }

    #[test]
    fn two_unknowns_the_figures_see_only_as_a_product_are_confounded() {
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| vec![10.0 * p[0] * p[1], 12.0 * p[0] * p[1]],
        };
        let mut fitter = Fitter::new(
            vec![unknown("jobs", 1.0, 64.0), unknown("depth", 1.0, 128.0)],
            vec![target("a", 4000.0, 0), target("b", 4800.0, 1)],
            &mut lab,
        )
        .unwrap();
        let fit = fitter.fit().unwrap();
        assert_eq!(fit.confounded, vec![(0, 1)]);
        let product = fit.values[0] * fit.values[1];
        assert!((product / 400.0 - 1.0).abs() < 0.01, "{:?}", fit.values);
    }

    #[test]
    fn integer_unknowns_take_whole_values_and_probe_by_one() {
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| vec![1000.0 * p[0].min(12.0)],
        };
        let mut fitter = Fitter::new(
            vec![Unknown {
                name: "jobs".into(),
                lo: 1.0,
                hi: 64.0,
                integer: true,
            }],
            vec![target("iops", 7000.0, 0)],
            &mut lab,
        )
        .unwrap();
        let fit = fitter.fit().unwrap();
        assert_eq!(fit.values[0], 7.0);
        assert_eq!(fit.sensitivity[0].verdict, Verdict::Identified);
    }

    #[test]
    fn the_same_targets_give_the_same_fit_and_runs() {
        let run = || {
            let mut lab = Toy {
                runs: 0,
                batch_sizes: vec![],
                f: |p| vec![1e6 / (p[0] + 8.0), 3e5 / (p[1] + 2.0)],
            };
            let mut fitter = Fitter::new(
                vec![unknown("a", 10.0, 500.0), unknown("b", 0.0, 50.0)],
                vec![target("x", 9000.0, 0), target("y", 20000.0, 1)],
                &mut lab,
            )
            .unwrap();
            let fit = fitter.fit().unwrap();
            drop(fitter);
            (fit, lab.runs)
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn bad_ranges_and_observations_are_refused() {
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| vec![p[0]],
        };
        let e = Fitter::new(
            vec![unknown("a", 5.0, 5.0)],
            vec![target("x", 1.0, 0)],
            &mut lab,
        )
        .err()
        .unwrap();
        assert!(e.contains("LO < HI"), "{e}");
        let e = Fitter::new(
            vec![unknown("a", 1.0, 5.0)],
            vec![target("x", 0.0, 0)],
            &mut lab,
        )
        .err()
        .unwrap();
        assert!(e.contains("non-zero"), "{e}");
        let e = Fitter::new(vec![unknown("a", 1.0, 5.0)], vec![], &mut lab)
            .err()
            .unwrap();
        assert!(e.contains("at least one figure"), "{e}");
    }

    #[test]
    fn five_unknowns_start_from_the_centre_and_are_recovered() {
        let mut lab = Toy {
            runs: 0,
            batch_sizes: vec![],
            f: |p| p.iter().map(|x| 1e3 / (x + 1.0)).collect(),
        };
        let truth = [3.0, 7.0, 20.0, 40.0, 90.0];
        let targets = (0..5)
            .map(|i| target(&format!("t{i}"), 1e3 / (truth[i] + 1.0), i))
            .collect();
        let unknowns = (0..5)
            .map(|i| unknown(&format!("u{i}"), 1.0, 100.0))
            .collect();
        let mut fitter = Fitter::new(unknowns, targets, &mut lab).unwrap();
        let fit = fitter.fit().unwrap();
        drop(fitter);
        assert_eq!(lab.batch_sizes[0], 1, "the centre alone");
        for (v, t) in fit.values.iter().zip(truth) {
            assert!((v / t - 1.0).abs() < 0.01, "{:?}", fit.values);
        }
    }

    #[test]
    fn in_parallel_keeps_the_items_order_at_any_thread_count() {
        let items: Vec<u64> = (0..37).collect();
        let square = |x: &u64| x * x;
        let one = in_parallel(1, &items, square);
        assert_eq!(one, items.iter().map(square).collect::<Vec<_>>());
        assert_eq!(in_parallel(4, &items, square), one);
        assert!(in_parallel(3, &[] as &[u64], square).is_empty());
    }

    #[test]
    fn values_are_short_numbers_inside_the_range() {
        let k = unknown("a", 10.0, 500.0);
        for i in 0..=100 {
            let x = k.at(i as f64 / 100.0);
            assert!((10.0..=500.0).contains(&x));
            let text = format!("{x}");
            assert!(text.len() <= 6, "{text}");
        }
        assert_eq!(k.at(0.0), 10.0);
        assert_eq!(k.at(1.0), 500.0);
    }
}
