//! `iolab compare A B`: two runs, groups of repeated runs, or lists of runs, compared metric
//! by metric with Welch's unequal-variance t statistics.
//!
//! Each side is a set of stored runs. Every (configuration, metric) pair that both sides
//! measured becomes one row (configurations match by name, then by the pairing rules of
//! docs/VOCABULARY.md: the only one on each side, then by attributes, [`iolab::vocab`]): the samples of a side are that metric's values in the side's
//! runs (one per run). Runs without measurements contribute their figures instead, as
//! (experiment name, figure id). For each row: n, mean and sample standard deviation per
//! side, the percent change of B's mean over A's, a 95% confidence interval of the
//! difference of means `B - A` and the two-sided p-value of Welch's t-test, with
//! Welch–Satterthwaite degrees of freedom and Student's t distribution (`statrs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use clap::ValueEnum;
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::db::{DbError, ResultsDb};
use crate::ids::RunSelection;

/// Output format of `iolab compare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompareFormat {
    /// An aligned text table.
    Text,
    /// JSON: both sides' runs and every row with all statistics.
    Json,
    /// CSV with a header line; empty fields where a statistic is undefined.
    Csv,
    /// A Markdown table.
    Markdown,
}

/// Mean and spread of one side's samples of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (divisor n - 1); none for a single sample.
    pub sd: Option<f64>,
}

impl Summary {
    /// The summary of `samples` (at least one).
    pub fn of(samples: &[f64]) -> Self {
        let n = samples.len();
        let mean = samples.iter().sum::<f64>() / n as f64;
        let sd = (n > 1).then(|| {
            let ss: f64 = samples.iter().map(|x| (x - mean) * (x - mean)).sum();
            (ss / (n - 1) as f64).sqrt()
        });
        Self { n, mean, sd }
    }
}

/// The difference of two sides' means and how sure it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Welch {
    /// `mean(B) - mean(A)`.
    pub diff: f64,
    /// Percent change of B's mean over A's (none when A's mean is 0).
    pub change_pct: Option<f64>,
    /// 95% confidence interval of `mean(B) - mean(A)`.
    pub ci95: Option<(f64, f64)>,
    /// Welch's t statistic.
    pub t: Option<f64>,
    /// Welch–Satterthwaite degrees of freedom.
    pub df: Option<f64>,
    /// Two-sided p-value of Welch's t-test.
    pub p_value: Option<f64>,
    /// Why a statistic is missing or degenerate.
    pub note: Option<String>,
}

/// Welch's unequal-variance comparison of `a` and `b`.
///
/// With a single sample on a side there is no variance estimate: no interval, no p-value
/// (note `n=1`). With zero variance on both sides the difference is exact: the interval is
/// the single point `[d, d]` and there is no p-value (note `zero variance on both sides`);
/// a spread below 1e-12 of the mean is rounding and counts as zero.
pub fn welch(a: &Summary, b: &Summary) -> Welch {
    let diff = b.mean - a.mean;
    let change_pct = (a.mean != 0.0).then(|| diff / a.mean.abs() * 100.0);
    let mut w = Welch {
        diff,
        change_pct,
        ci95: None,
        t: None,
        df: None,
        p_value: None,
        note: None,
    };
    if a.n < 2 || b.n < 2 {
        w.note = Some("n=1".to_owned());
        return w;
    }
    // A spread below 1e-12 of the mean is floating-point rounding (the same value summed in
    // another order), not variation: it counts as zero.
    let spread = |s: &Summary| s.sd.filter(|&sd| sd > 1e-12 * s.mean.abs()).unwrap_or(0.0);
    let (sa, sb) = (spread(a), spread(b));
    let va = sa * sa / a.n as f64;
    let vb = sb * sb / b.n as f64;
    let se2 = va + vb;
    if se2 == 0.0 {
        w.ci95 = Some((diff, diff));
        w.note = Some("zero variance on both sides".to_owned());
        return w;
    }
    let df = se2 * se2 / (va * va / (a.n - 1) as f64 + vb * vb / (b.n - 1) as f64);
    let se = se2.sqrt();
    let t = diff / se;
    // df >= 1 here (each term's df is at least 1), so the distribution exists.
    let Ok(dist) = StudentsT::new(0.0, 1.0, df) else {
        w.note = Some(format!("no t distribution with {df} degrees of freedom"));
        return w;
    };
    let half = dist.inverse_cdf(0.975) * se;
    w.ci95 = Some((diff - half, diff + half));
    w.t = Some(t);
    w.df = Some(df);
    w.p_value = Some((2.0 * dist.sf(t.abs())).min(1.0));
    w
}

/// One compared (configuration, metric).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Configuration (or, for figures, the experiment).
    pub config: String,
    /// Metric name (or figure id).
    pub metric: String,
    /// Unit.
    pub unit: String,
    /// Side A.
    pub a: Summary,
    /// Side B.
    pub b: Summary,
    /// The comparison.
    #[serde(flatten)]
    pub welch: Welch,
}

/// A side as resolved against the database.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResolvedSide {
    /// As given on the command line.
    pub spec: String,
    /// Its runs.
    pub runs: Vec<i64>,
}

/// A whole comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Side A.
    pub a: ResolvedSide,
    /// Side B.
    pub b: ResolvedSide,
    /// One row per (configuration, metric) on both sides, in A's order.
    pub rows: Vec<Row>,
    /// (configuration, metric) pairs only A has.
    pub only_in_a: usize,
    /// (configuration, metric) pairs only B has.
    pub only_in_b: usize,
    /// When each side is lab runs that measured a single configuration under different names
    /// (two variants of one scenario, say `fio-nvme-strict` against `fio-nvme-lazy`), they
    /// are paired:
    /// (A's configuration, B's configuration). Rows carry A's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paired: Option<(String, String)>,
    /// Configurations whose names differ but whose pairing keys (workload and the
    /// workload's defining attributes, typed: docs/VOCABULARY.md) are equal and unique on
    /// each side, such as a real fio import and the lab run of the same job. Rows carry A's
    /// name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paired_by_attributes: Vec<AttrPair>,
}

/// A configuration of A paired with one of B by their attributes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttrPair {
    /// A's configuration.
    pub a: String,
    /// B's configuration.
    pub b: String,
    /// The pairing key both have, as `workload=fio rw=randread bs=4096 ...`.
    pub key: String,
}

/// The samples of one side: per (config, metric), the unit and one value per run.
#[derive(Default)]
struct Samples {
    /// Whether every run of the side is a lab run (not an import).
    all_lab: bool,
    order: Vec<(String, String)>,
    values: BTreeMap<(String, String), (String, Vec<f64>)>,
    /// Each configuration's attributes (its first measurement's).
    attrs: BTreeMap<String, BTreeMap<String, String>>,
}

impl Samples {
    /// The distinct configurations, in first-seen order.
    fn configs(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (c, _) in &self.order {
            if !out.contains(&c.as_str()) {
                out.push(c);
            }
        }
        out
    }

    /// The same samples with every configuration renamed to `config`.
    fn renamed(&self, config: &str) -> Samples {
        let mut out = Samples {
            all_lab: self.all_lab,
            ..Samples::default()
        };
        for key in &self.order {
            let (unit, values) = &self.values[key];
            for v in values {
                out.push(config, &key.1, unit, *v);
            }
        }
        out
    }

    /// Renames configuration `from` to `to` (which the side does not have).
    fn rename(&mut self, from: &str, to: &str) {
        for key in &mut self.order {
            if key.0 == from {
                let old = std::mem::replace(&mut key.0, to.to_owned());
                if let Some(v) = self.values.remove(&(old, key.1.clone())) {
                    self.values.insert(key.clone(), v);
                }
            }
        }
        if let Some(a) = self.attrs.remove(from) {
            self.attrs.insert(to.to_owned(), a);
        }
    }

    /// Configurations of this side that `other` lacks, each with its pairing key.
    fn unmatched_keys(&self, other: &Samples) -> Vec<(String, Vec<(String, serde_json::Value)>)> {
        let theirs = other.configs();
        self.configs()
            .into_iter()
            .filter(|c| !theirs.contains(c))
            .filter_map(|c| {
                let key = iolab::vocab::pairing_key(self.attrs.get(c)?)?;
                Some((c.to_owned(), key))
            })
            .collect()
    }

    /// Whether some configuration is a re-aim row of one user count (`users` an integer),
    /// as `iolab import reaim` stores them.
    fn has_reaim_rows(&self) -> bool {
        self.attrs.values().any(|a| {
            a.get("workload")
                .is_some_and(|w| iolab::vocab::canonical("workload", w) == "reaim")
                && a.get("users")
                    .is_some_and(|u| iolab::vocab::typed("users", u).is_u64())
        })
    }

    /// Adds, for every lab re-aim configuration `C` (one configuration holding every user
    /// count's row as `reaim.usersN.*`), a configuration `C.usersN` per user count with
    /// attribute `users = N` and the row's metrics under the names `iolab import reaim`
    /// gives them (`reaim.jobs_per_min`, ...), so each row pairs with an imported row.
    fn expand_reaim_rows(&mut self) {
        let mut added: Vec<(String, String, String, Vec<f64>)> = Vec::new();
        let mut new_attrs = Vec::new();
        for (config, metric) in &self.order {
            let Some(rest) = metric.strip_prefix("reaim.users") else {
                continue;
            };
            let Some((users, what)) = rest.split_once('.') else {
                continue;
            };
            if users.parse::<u64>().is_err() {
                continue;
            }
            let Some(attrs) = self.attrs.get(config) else {
                continue;
            };
            let name = match what {
                "jpm" => "jobs_per_min",
                "jpm_per_child" => "jobs_per_min_per_child",
                w => w,
            };
            let row = format!("{config}.users{users}");
            let (unit, values) = &self.values[&(config.clone(), metric.clone())];
            added.push((
                row.clone(),
                format!("reaim.{name}"),
                unit.clone(),
                values.clone(),
            ));
            let mut a = attrs.clone();
            a.insert("users".to_owned(), users.to_owned());
            new_attrs.push((row, a));
        }
        for (row, metric, unit, values) in added {
            for v in values {
                self.push(&row, &metric, &unit, v);
            }
        }
        for (row, a) in new_attrs {
            self.attrs.entry(row).or_insert(a);
        }
    }

    fn push(&mut self, config: &str, metric: &str, unit: &str, value: f64) {
        let key = (config.to_owned(), metric.to_owned());
        let entry = self.values.entry(key.clone()).or_insert_with(|| {
            self.order.push(key);
            (unit.to_owned(), Vec::new())
        });
        entry.1.push(value);
    }
}

/// The configurations of A and B, left without a partner by name, that pair by their
/// attributes: equal pairing keys, unique on each side; or, where a key is not unique,
/// the one configuration of each side that agrees with the other on every attribute both
/// carry ([`iolab::vocab::agree`]), each the other's only such partner.
/// Also gives, for the first configuration of A whose key several of B's share with no
/// attribute telling them apart, what to say about it.
fn pair_by_attributes(sa: &Samples, sb: &Samples) -> (Vec<AttrPair>, Option<String>) {
    let keys_a = sa.unmatched_keys(sb);
    let keys_b = sb.unmatched_keys(sa);
    let attrs = |s: &Samples, c: &str| s.attrs.get(c).cloned().unwrap_or_default();
    let mut out: Vec<AttrPair> = Vec::new();
    let mut ambiguous = None;
    for (config_a, key) in &keys_a {
        let same_a: Vec<&String> = keys_a
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(c, _)| c)
            .collect();
        let same_b: Vec<&String> = keys_b
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(c, _)| c)
            .collect();
        let mut text = iolab::vocab::key_text(key);
        let partner = if same_a.len() == 1 && same_b.len() == 1 {
            Some(same_b[0])
        } else {
            let aa = attrs(sa, config_a);
            let fits_b: Vec<&String> = same_b
                .iter()
                .copied()
                .filter(|b| iolab::vocab::agree(&aa, &attrs(sb, b)))
                .collect();
            match fits_b[..] {
                [b] => {
                    let ab = attrs(sb, b);
                    let fits_a = same_a
                        .iter()
                        .filter(|a| iolab::vocab::agree(&attrs(sa, a), &ab))
                        .count();
                    let tie = iolab::vocab::shared_text(&aa, &ab, key);
                    text.push_str(&format!(
                        ", of {} on its side told apart by {tie}",
                        same_b.len()
                    ));
                    (fits_a == 1).then_some(b)
                }
                _ => {
                    if ambiguous.is_none() && same_b.len() > 1 {
                        let names: Vec<&str> = same_b.iter().map(|b| b.as_str()).collect();
                        ambiguous = Some(format!(
                            "A's {config_a} has the key {} of B's {}, and no attribute both \
                             carry tells them apart (say which with `iolab import --attr \
                             KEY=VALUE`)",
                            iolab::vocab::key_text(key),
                            names.join(", ")
                        ));
                    }
                    None
                }
            }
        };
        if let Some(b) = partner {
            if !out.iter().any(|p| &p.b == b) {
                out.push(AttrPair {
                    a: config_a.clone(),
                    b: b.clone(),
                    key: text,
                });
            }
        }
    }
    (out, ambiguous)
}

fn collect(db: &ResultsDb, runs: &[i64], metric: Option<&str>) -> Result<Samples, DbError> {
    let mut s = Samples {
        all_lab: true,
        ..Samples::default()
    };
    let wanted = |name: &str| match metric {
        Some(g) => glob_match(g, name),
        None => true,
    };
    let shown: Vec<_> = runs
        .iter()
        .map(|&id| db.show(id))
        .collect::<Result<_, _>>()?;
    // A configuration whose measurements differ in an attribute other than the seed (the
    // points of a sweep, runs of edited scenarios under one name) is one configuration per
    // value of those attributes: its runs are never pooled as repetitions.
    let varying = varying_attributes(shown.iter().flat_map(|r| r.measurements.iter()));
    for run in &shown {
        s.all_lab &= run.kind == "lab";
        if run.measurements.is_empty() {
            for f in run.figures.iter().filter(|f| wanted(&f.id)) {
                s.push(&run.experiment, &f.id, &f.unit, f.lab);
            }
        }
        for m in &run.measurements {
            let config = match varying.get(&m.config) {
                Some(keys) => point_label(&m.config, keys, &m.attrs),
                None => m.config.clone(),
            };
            s.attrs
                .entry(config.clone())
                .or_insert_with(|| m.attrs.clone());
            for x in &m.metrics {
                let (name, unit, value) = iolab::vocab::canonical_metric(&x.name, &x.unit, x.value);
                // A pattern selects a renamed metric by either name.
                if !wanted(name) && !wanted(&x.name) {
                    continue;
                }
                s.push(&config, name, unit, value);
            }
        }
    }
    Ok(s)
}

/// Attributes that tell repetitions of one configuration apart, never a reason to split it.
const REPETITION_ATTRS: [&str; 2] = ["seed", "run"];

/// Per configuration name, the attributes (other than [`REPETITION_ATTRS`]) whose values
/// differ among its measurements, in name order; configurations whose measurements agree
/// are absent.
fn varying_attributes<'a>(
    measurements: impl Iterator<Item = &'a iolab_sim::metrics::Measurement>,
) -> BTreeMap<String, Vec<String>> {
    let mut seen: BTreeMap<&str, Vec<&BTreeMap<String, String>>> = BTreeMap::new();
    for m in measurements {
        seen.entry(&m.config).or_default().push(&m.attrs);
    }
    let mut out = BTreeMap::new();
    for (config, all) in seen {
        let keys: std::collections::BTreeSet<&String> = all.iter().flat_map(|a| a.keys()).collect();
        let differ: Vec<String> = keys
            .into_iter()
            .filter(|k| !REPETITION_ATTRS.contains(&k.as_str()))
            .filter(|k| all.iter().any(|a| a.get(*k) != all[0].get(*k)))
            .cloned()
            .collect();
        if !differ.is_empty() {
            out.insert(config.to_owned(), differ);
        }
    }
    out
}

/// A configuration's name for one point: `config [k1=v1 k2=v2]` with the attributes that
/// vary (`-` for one a measurement lacks).
fn point_label(config: &str, keys: &[String], attrs: &BTreeMap<String, String>) -> String {
    let values: Vec<String> = keys
        .iter()
        .map(|k| format!("{k}={}", attrs.get(k).map_or("-", String::as_str)))
        .collect();
    format!("{config} [{}]", values.join(" "))
}

/// Why a comparison could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The database failed or lacks a run or group.
    #[error(transparent)]
    Db(#[from] DbError),
    /// Nothing on both sides.
    #[error("nothing to compare: {0}")]
    Nothing(String),
}

/// Compares side `a` with side `b` (`metric`: only metric names matching this glob).
pub fn compare(
    db: &ResultsDb,
    a: (&str, &RunSelection),
    b: (&str, &RunSelection),
    metric: Option<&str>,
) -> Result<Comparison, CompareError> {
    let runs_a = a.1.resolve(db)?;
    let runs_b = b.1.resolve(db)?;
    let mut sa = collect(db, &runs_a, metric)?;
    let mut sb = collect(db, &runs_b, metric)?;
    let mut paired = None;
    let (ca, cb) = (sa.configs(), sb.configs());
    // Only lab runs pair: an imported fio job's name says which workload it ran.
    if sa.all_lab && sb.all_lab && ca.len() == 1 && cb.len() == 1 && ca[0] != cb[0] {
        paired = Some((ca[0].to_owned(), cb[0].to_owned()));
        sb = sb.renamed(ca[0]);
    }
    // Then configurations whose names differ pair by their attributes: a real fio import
    // and the lab run of the same job (docs/VOCABULARY.md, "Pairing").
    let mut paired_by_attributes = Vec::new();
    let mut ambiguous = None;
    if paired.is_none() {
        // A lab re-aim run's rows meet an imported re-aim table's rows.
        if sb.has_reaim_rows() {
            sa.expand_reaim_rows();
        }
        if sa.has_reaim_rows() {
            sb.expand_reaim_rows();
        }
        let (pairs, why) = pair_by_attributes(&sa, &sb);
        ambiguous = why;
        for p in pairs {
            sb.rename(&p.b, &p.a);
            paired_by_attributes.push(p);
        }
    }
    let mut rows = Vec::new();
    for key in &sa.order {
        let Some((_, vb)) = sb.values.get(key) else {
            continue;
        };
        let (unit, va) = &sa.values[key];
        let (a, b) = (Summary::of(va), Summary::of(vb));
        rows.push(Row {
            config: key.0.clone(),
            metric: key.1.clone(),
            unit: unit.clone(),
            a,
            b,
            welch: welch(&a, &b),
        });
    }
    let only_in_a = sa.order.len() - rows.len();
    let only_in_b = sb.order.len() - rows.len();
    if rows.is_empty() {
        let filter = metric.map_or(String::new(), |g| format!(" matching `{g}`"));
        return Err(CompareError::Nothing(format!(
            "A ({}) and B ({}) have no (configuration, metric) in common{filter} \
             (A has {only_in_a}, B has {only_in_b}); configurations match by name, then \
             by their workload's attributes (fio: rw, bs, iodepth, numjobs; bonnie: size; \
             reaim: users; ties broken by the attributes both carry, which `iolab import \
             --attr KEY=VALUE` adds; docs/VOCABULARY.md){}",
            a.0,
            b.0,
            ambiguous.map_or(String::new(), |w| format!("; {w}"))
        )));
    }
    Ok(Comparison {
        a: ResolvedSide {
            spec: a.0.to_owned(),
            runs: runs_a,
        },
        b: ResolvedSide {
            spec: b.0.to_owned(),
            runs: runs_b,
        },
        rows,
        only_in_a,
        only_in_b,
        paired,
        paired_by_attributes,
    })
}

/// `*` matches any run of characters, `?` any one character; everything else itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// `x` with `digits` significant digits (no exponent): `2.605`, `389.2`, `0.003891`.
fn significant(x: f64, digits: i32) -> String {
    if x == 0.0 {
        return "0".to_owned();
    }
    let mag = x.abs().log10().floor() as i32;
    let mut decimals = (digits - 1 - mag).max(0);
    // Rounding may carry into one more digit (999.96 -> 1000.0): drop a decimal then.
    let scale = 10f64.powi(decimals);
    let rounded = (x * scale).round() / scale;
    if decimals > 0 && rounded.abs() >= 10f64.powi(mag + 1) {
        decimals -= 1;
    }
    format!("{x:.prec$}", prec = decimals as usize)
}

/// An integer with thousands separators: `16,328`.
fn grouped(x: f64) -> String {
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 && digits != "0" {
        out.insert(0, '-');
    }
    out
}

/// Nanoseconds per unit of a time unit, if `unit` is one.
fn time_scale(unit: &str) -> Option<f64> {
    match unit {
        "ns" => Some(1.0),
        "us" | "µs" => Some(1e3),
        "ms" => Some(1e6),
        "s" => Some(1e9),
        _ => None,
    }
}

/// A value of a metric in `unit` for reading (text and Markdown tables; JSON and CSV keep
/// raw numbers), about four significant digits: times in the unit that suits them
/// (`389.2 ns`, `1.250 ms`), integers below a million in full with separators (`16,328`),
/// larger values with a decimal prefix (`2.605 G`, `16.33 M`), tiny ones with an exponent.
pub(crate) fn num(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == 0.0 {
        return "0".to_owned();
    }
    if let Some(scale) = time_scale(unit) {
        let ns = v * scale;
        let a = ns.abs();
        let (div, u) = if a < 1e3 {
            (1.0, "ns")
        } else if a < 1e6 {
            (1e3, "us")
        } else if a < 1e9 {
            (1e6, "ms")
        } else {
            (1e9, "s")
        };
        if a >= 1e-3 {
            return format!("{} {u}", significant(ns / div, 4));
        }
    }
    let a = v.abs();
    if a >= 1e6 {
        let prefixes = [
            (1e18, "E"),
            (1e15, "P"),
            (1e12, "T"),
            (1e9, "G"),
            (1e6, "M"),
        ];
        let (div, p) = prefixes
            .into_iter()
            .find(|(d, _)| a >= *d)
            .unwrap_or((1e6, "M"));
        // Rounding may reach the next prefix (999,960,000 -> 1000 M): print it there.
        let shown = significant(v / div, 4);
        if shown.trim_start_matches('-').starts_with("1000") && p != "E" {
            return format!("{} {}", significant(v / (div * 1e3), 4), next_prefix(p));
        }
        return format!("{shown} {p}");
    }
    if a >= 1e3 || v.fract() == 0.0 {
        return grouped(v);
    }
    if a >= 1e-3 {
        let shown = significant(v, 4);
        // Rounded up to 1000 (999.96): print it as the integer it now is.
        if shown.trim_start_matches('-').len() >= 4 && !shown.contains('.') {
            return grouped(v);
        }
        return shown;
    }
    format!("{v:.3e}")
}

/// The decimal prefix after `p`.
fn next_prefix(p: &str) -> &'static str {
    match p {
        "M" => "G",
        "G" => "T",
        "T" => "P",
        _ => "E",
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |p| format!("{p:+.2}%"))
}

fn ci(w: &Welch, unit: &str) -> String {
    w.ci95.map_or_else(
        || "-".to_owned(),
        // "to", not a comma: the numbers have thousands separators.
        |(lo, hi)| format!("{} to {}", num(lo, unit), num(hi, unit)),
    )
}

fn p_value(w: &Welch) -> String {
    match (w.p_value, &w.note) {
        (Some(p), _) if p < 1e-4 => format!("{p:.1e}"),
        (Some(p), _) => format!("{p:.4}"),
        (None, Some(n)) => format!("- ({n})"),
        (None, None) => "-".to_owned(),
    }
}

fn side_line(s: &ResolvedSide) -> String {
    let ids: Vec<String> = s.runs.iter().map(i64::to_string).collect();
    format!(
        "{} (run{} {})",
        s.spec,
        if ids.len() == 1 { "" } else { "s" },
        ids.join(", ")
    )
}

/// The table cells of a row, shared by the text and Markdown renderings.
fn cells(r: &Row) -> [String; 12] {
    [
        r.config.clone(),
        r.metric.clone(),
        r.unit.clone(),
        r.a.n.to_string(),
        num(r.a.mean, &r.unit),
        r.a.sd.map_or_else(|| "-".to_owned(), |v| num(v, &r.unit)),
        r.b.n.to_string(),
        num(r.b.mean, &r.unit),
        r.b.sd.map_or_else(|| "-".to_owned(), |v| num(v, &r.unit)),
        pct(r.welch.change_pct),
        ci(&r.welch, &r.unit),
        p_value(&r.welch),
    ]
}

const HEADER: [&str; 12] = [
    "config",
    "metric",
    "unit",
    "n A",
    "mean A",
    "sd A",
    "n B",
    "mean B",
    "sd B",
    "change",
    "95% CI of B-A",
    "p (Welch)",
];

fn footer(c: &Comparison) -> String {
    let mut out = String::new();
    if let Some((a, b)) = &c.paired {
        let _ = writeln!(
            out,
            "paired: configuration {a} (A) with {b} (B), the only one on each side"
        );
    }
    for p in &c.paired_by_attributes {
        let _ = writeln!(
            out,
            "paired by attributes: configuration {} (A) with {} (B): {}",
            p.a, p.b, p.key
        );
    }
    if c.only_in_a + c.only_in_b > 0 {
        let _ = writeln!(
            out,
            "not compared: {} (configuration, metric) only in A, {} only in B",
            c.only_in_a, c.only_in_b
        );
    }
    out
}

/// Renders a comparison.
pub fn render(c: &Comparison, format: CompareFormat) -> String {
    match format {
        CompareFormat::Json => {
            let mut s = serde_json::to_string_pretty(c).unwrap_or_default();
            s.push('\n');
            s
        }
        CompareFormat::Csv => {
            let mut out = String::from(
                "config,metric,unit,n_a,mean_a,sd_a,n_b,mean_b,sd_b,diff,change_pct,\
                 ci95_low,ci95_high,t,df,p_value,note\n",
            );
            let opt = |v: Option<f64>| v.map_or_else(String::new, |x| x.to_string());
            for r in &c.rows {
                let w = &r.welch;
                let fields = [
                    csv_field(&r.config),
                    csv_field(&r.metric),
                    csv_field(&r.unit),
                    r.a.n.to_string(),
                    r.a.mean.to_string(),
                    opt(r.a.sd),
                    r.b.n.to_string(),
                    r.b.mean.to_string(),
                    opt(r.b.sd),
                    w.diff.to_string(),
                    opt(w.change_pct),
                    opt(w.ci95.map(|c| c.0)),
                    opt(w.ci95.map(|c| c.1)),
                    opt(w.t),
                    opt(w.df),
                    opt(w.p_value),
                    csv_field(w.note.as_deref().unwrap_or("")),
                ];
                let _ = writeln!(out, "{}", fields.join(","));
            }
            out
        }
        CompareFormat::Markdown => {
            let mut out = format!(
                "A: {}  \nB: {}\n\n| {} |\n|{}\n",
                side_line(&c.a),
                side_line(&c.b),
                HEADER.join(" | "),
                "---|".repeat(HEADER.len())
            );
            for r in &c.rows {
                let cells = cells(r).map(|s| s.replace('|', "\\|"));
                let _ = writeln!(out, "| {} |", cells.join(" | "));
            }
            let f = footer(c);
            if !f.is_empty() {
                let _ = write!(out, "\n{f}");
            }
            out
        }
        CompareFormat::Text => {
            let rows: Vec<[String; 12]> = c.rows.iter().map(cells).collect();
            let mut width = HEADER.map(str::len);
            for r in &rows {
                for (w, cell) in width.iter_mut().zip(r) {
                    *w = (*w).max(cell.chars().count());
                }
            }
            let line = |cells: &[String]| {
                let mut s = String::new();
                for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
                    // Names left-aligned, numbers right-aligned.
                    if i < 3 {
                        let _ = write!(s, "{cell:<w$}  ");
                    } else {
                        let _ = write!(s, "{cell:>w$}  ");
                    }
                }
                s.trim_end().to_owned()
            };
            let mut out = format!("A: {}\nB: {}\n\n", side_line(&c.a), side_line(&c.b));
            let _ = writeln!(out, "{}", line(&HEADER.map(str::to_owned)));
            for r in &rows {
                let _ = writeln!(out, "{}", line(r));
            }
            out.push_str(&footer(c));
            out
        }
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// `iolab compare`: prints the comparison; exit code 2 for a bad side, an unknown run or
/// group, or nothing in common.
pub fn run(path: &Path, a: &str, b: &str, metric: Option<&str>, format: CompareFormat) -> ExitCode {
    let sides = RunSelection::parse(a).and_then(|sa| RunSelection::parse(b).map(|sb| (sa, sb)));
    let (sa, sb) = match sides {
        Ok(s) => s,
        Err(e) => {
            eprintln!("iolab compare: {e}");
            return ExitCode::from(2);
        }
    };
    let result = ResultsDb::open_existing(path)
        .map_err(CompareError::from)
        .and_then(|db| compare(&db, (a, &sa), (b, &sb), metric));
    match result {
        Ok(c) => {
            print!("{}", render(&c, format));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iolab compare: {e}");
            ExitCode::from(match &e {
                CompareError::Db(d) => d.exit_code(),
                CompareError::Nothing(_) => 2,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, rel: f64) -> bool {
        (got - want).abs() <= rel * want.abs().max(1e-300)
    }

    // Reference values computed on this machine with SciPy 1.17.1 (Python 3.11.7):
    // `res = scipy.stats.ttest_ind(b, a, equal_var=False)` for t (`res.statistic`), p
    // (`res.pvalue`) and df (`res.df`), `res.confidence_interval(0.95)` for the interval of
    // mean(b) - mean(a).
    // Generated by the script in crates/iolab/tests/data/README.md (scipy 1.17.1 python 3.11.7).
    const T1: f64 = 9.668947269888987;
    const DF1: f64 = 6.785421156719478;
    const P1: f64 = 3.2639042113079277e-05;
    const CI1: (f64, f64) = (13.558259256260058, 22.411740743740083);
    const T2: f64 = 1.3199091933711364;
    const DF2: f64 = 6.804093905400716;
    const P2: f64 = 0.2295362832193233;
    const CI2: (f64, f64) = (-1.3366917019058198, 4.670025035239153);
    const T3: f64 = 0.22549380840084865;
    const DF3: f64 = 3.0;
    const P3: f64 = 0.8360832258079628;
    const CI3: (f64, f64) = (-3.278307858930696, 3.778307858930696);

    #[test]
    fn welch_matches_scipy() {
        struct Case {
            a: &'static [f64],
            b: &'static [f64],
            t: f64,
            df: f64,
            p: f64,
            ci: (f64, f64),
        }
        let cases = [
            Case {
                a: &[454.0, 451.5, 457.2, 449.9, 455.1],
                b: &[472.3, 470.1, 474.9, 468.8],
                t: T1,
                df: DF1,
                p: P1,
                ci: CI1,
            },
            Case {
                a: &[1.0, 2.0, 3.0],
                b: &[1.5, 2.5, 9.0, 4.0, 3.0, 2.0],
                t: T2,
                df: DF2,
                p: P2,
                ci: CI2,
            },
            Case {
                a: &[100.0, 100.0, 100.0],
                b: &[101.0, 99.0, 103.0, 98.0],
                t: T3,
                df: DF3,
                p: P3,
                ci: CI3,
            },
        ];
        for (i, c) in cases.iter().enumerate() {
            let w = welch(&Summary::of(c.a), &Summary::of(c.b));
            assert!(close(w.t.unwrap(), c.t, 1e-9), "case {i}: t {:?}", w.t);
            assert!(close(w.df.unwrap(), c.df, 1e-9), "case {i}: df {:?}", w.df);
            assert!(
                close(w.p_value.unwrap(), c.p, 1e-6),
                "case {i}: p {:?}",
                w.p_value
            );
            let (lo, hi) = w.ci95.unwrap();
            assert!(close(lo, c.ci.0, 1e-6), "case {i}: ci low {lo}");
            assert!(close(hi, c.ci.1, 1e-6), "case {i}: ci high {hi}");
            assert!(w.note.is_none());
        }
    }

    #[test]
    fn single_samples_and_zero_variance_are_said_so() {
        let one = Summary::of(&[10.0]);
        let three = Summary::of(&[9.0, 10.0, 11.0]);
        let w = welch(&one, &three);
        assert_eq!(
            (w.ci95, w.p_value, w.note.as_deref()),
            (None, None, Some("n=1"))
        );
        assert_eq!(w.change_pct, Some(0.0));
        let flat_a = Summary::of(&[5.0, 5.0]);
        let flat_b = Summary::of(&[6.0, 6.0, 6.0]);
        let w = welch(&flat_a, &flat_b);
        assert_eq!(w.ci95, Some((1.0, 1.0)));
        assert_eq!(w.p_value, None);
        assert_eq!(w.note.as_deref(), Some("zero variance on both sides"));
        assert_eq!(w.change_pct, Some(20.0));
        // Zero variance on one side only is an ordinary Welch test (df from the other side).
        let w = welch(&flat_a, &three);
        assert!((w.df.unwrap() - 2.0).abs() < 1e-12);
        // SciPy 1.17.1: ttest_ind([9, 10, 11], [5, 5], equal_var=False).pvalue.
        assert!(close(w.p_value.unwrap(), 0.013072457560346515, 1e-6));
        assert!(close(w.t.unwrap(), 8.660254037844387, 1e-9));
        // Rounding noise in the last bits is no variance.
        let w = welch(
            &Summary::of(&[94.0631, 94.0631 + 1.4e-14, 94.0631]),
            &Summary::of(&[94.0631; 3]),
        );
        assert_eq!(w.note.as_deref(), Some("zero variance on both sides"));
        // A zero mean on side A leaves the percent change undefined.
        let w = welch(&Summary::of(&[0.0, 0.0]), &flat_b);
        assert_eq!(w.change_pct, None);
    }

    #[test]
    fn summary_uses_the_sample_standard_deviation() {
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((s.n, s.mean), (8, 5.0));
        assert!((s.sd.unwrap() - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(Summary::of(&[3.0]).sd, None);
    }

    #[test]
    fn globs() {
        assert!(glob_match("read.*", "read.iops"));
        assert!(glob_match("*.iops", "write.iops"));
        assert!(glob_match("read.clat_p??_ns", "read.clat_p99_ns"));
        assert!(!glob_match("read.clat_p??_ns", "read.clat_p99.9_ns"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("read.*", "write.iops"));
        assert!(glob_match("*a*b*", "xxaxxbxx"));
    }

    #[test]
    fn numbers_print_human_readably_with_their_units() {
        // The mix issue 20 shows: 2.6050e9, 16328.0, 3.8919e-7 (seconds).
        assert_eq!(num(2.605e9, "IOPS"), "2.605 G");
        assert_eq!(num(16328.0, "count"), "16,328");
        assert_eq!(num(3.8919e-7, "s"), "389.2 ns");
        assert_eq!(num(454123.4567, "IOPS"), "454,123");
        assert_eq!(num(-1234567.0, "bytes"), "-1.235 M");
        assert_eq!(num(999_999_999.0, "bytes"), "1.000 G");
        assert_eq!(num(12.345678, "%"), "12.35");
        assert_eq!(num(32.0, "count"), "32");
        assert_eq!(num(-0.5, "%"), "-0.5000");
        assert_eq!(num(0.0, "ns"), "0");
        assert_eq!(num(1.5e12, "B/s"), "1.500 T");
        assert_eq!(num(1250.0, "us"), "1.250 ms");
        assert_eq!(num(85.0, "ns"), "85.00 ns");
        assert_eq!(num(2.5, "s"), "2.500 s");
        assert_eq!(num(-16328.0, "ns"), "-16.33 us");
        assert_eq!(num(0.00002, "%"), "2.000e-5");
        assert_eq!(num(999.96, "%"), "1,000");
        assert_eq!(num(9.99996, "%"), "10.00");
    }
}
