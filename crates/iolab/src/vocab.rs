//! The one vocabulary of runs (docs/VOCABULARY.md): attribute names and their types, the
//! old names accepted as aliases, and the rule by which a configuration of one side of
//! `iolab compare` pairs with a configuration of the other.
//!
//! Attributes are stored as text (a [`Measurement`](iolab_sim::metrics::Measurement)'s
//! `attrs`); this module reads them as typed values, so `bs = "4k"` (an fio import) and
//! `bs = "4096"` (a lab run) are the same size, and `iodepth = "8"` is the integer 8.

use std::collections::BTreeMap;

use serde_json::Value;

/// How an attribute's text is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrType {
    /// A byte size as fio writes it (`4096`, `"4k"`, `"1m"`): powers of 1024.
    Size,
    /// A non-negative integer.
    Integer,
    /// `true` or `false`.
    Bool,
    /// Text (names, modes, patterns), with aliases folded to the current name.
    Text,
}

/// Attributes whose type is fixed; any other attribute is a number when its text is one,
/// else text.
pub const TYPED_ATTRS: [(&str, AttrType); 28] = [
    ("bs", AttrType::Size),
    ("size", AttrType::Size),
    ("chunk_bytes", AttrType::Size),
    ("message_bytes", AttrType::Size),
    ("fs_block", AttrType::Size),
    ("iodepth", AttrType::Integer),
    ("numjobs", AttrType::Integer),
    ("rwmixread", AttrType::Integer),
    ("threads", AttrType::Integer),
    ("cpus", AttrType::Integer),
    ("memory_gib", AttrType::Integer),
    ("devices", AttrType::Integer),
    ("seed", AttrType::Integer),
    ("run", AttrType::Integer),
    ("users", AttrType::Integer),
    ("groupid", AttrType::Integer),
    ("file_mib", AttrType::Integer),
    ("concurrency", AttrType::Integer),
    ("virt_merge", AttrType::Bool),
    ("caching_mode", AttrType::Bool),
    ("usb_speed", AttrType::Text),
    ("workload", AttrType::Text),
    ("rw", AttrType::Text),
    ("iommu_mode", AttrType::Text),
    ("iommu_model", AttrType::Text),
    ("scenario", AttrType::Text),
    ("platform", AttrType::Text),
    // A release (`6.1` and `6.10` differ): never a number.
    ("kernel", AttrType::Text),
];

/// Old or other tools' names accepted for an attribute's value: (attribute, alias, name).
pub const VALUE_ALIASES: [(&str, &str, &str); 5] = [
    ("iommu_mode", "none", "off"),
    ("workload", "bonnie++", "bonnie"),
    ("workload", "re-aim", "reaim"),
    ("workload", "re-aim-7", "reaim"),
    ("rw", "readwrite", "rw"),
];

/// Metric names the published experiments' own models stored before they became data files
/// on the lab (issue 16): (old name, current name, factor from the old unit to the current,
/// the current unit). `iolab compare` reads stored runs through it, so a run stored before
/// the change sets beside a new one.
pub const METRIC_ALIASES: [(&str, &str, f64, &str); 4] = [
    (
        "netperf.throughput_mbps",
        "net.throughput_gbps",
        1e-3,
        "Gb/s",
    ),
    ("netperf.latency_us", "net.latency_mean_us", 1.0, "us"),
    (
        "tce.hypercalls_per_msg",
        "dma.hypercalls_per_msg",
        1.0,
        "count",
    ),
    ("tce.tces_per_msg", "dma.tces_per_msg", 1.0, "count"),
];

/// A stored metric `(name, unit, value)` under its current name, unit and value.
pub fn canonical_metric<'a>(name: &'a str, unit: &'a str, value: f64) -> (&'a str, &'a str, f64) {
    match METRIC_ALIASES.iter().find(|(old, ..)| *old == name) {
        Some((_, new, factor, new_unit)) => (new, new_unit, value * factor),
        None => (name, unit, value),
    }
}

/// The attributes by which configurations of a workload pair up in `iolab compare` when
/// their names differ: a configuration's *pairing key* is its `workload` and these
/// attributes (the job as the tool ran it: a fio job on a synchronous engine at iodepth 1),
/// compared as typed values. Workloads not
/// listed pair by name only.
pub const PAIRING_ATTRS: [(&str, &[&str]); 3] = [
    ("fio", &["rw", "bs", "iodepth", "numjobs"]),
    // bonnie++ -s: the file size its CSV row reports.
    ("bonnie", &["size"]),
    // re-aim: one configuration per user count (a lab run's rows are read as such).
    ("reaim", &["users"]),
];

/// Attributes that say which repetition or run a configuration came from, never what was
/// measured: left out when attributes break a tie between configurations of one key.
pub const RUN_ATTRS: [&str; 6] = ["seed", "run", "scenario", "name", "groupid", "label"];

/// The type of attribute `key`, if it has a fixed one.
pub fn attr_type(key: &str) -> Option<AttrType> {
    TYPED_ATTRS.iter().find(|(k, _)| *k == key).map(|&(_, t)| t)
}

/// `raw` with an alias of attribute `key`'s values replaced by the current name.
pub fn canonical<'a>(key: &str, raw: &'a str) -> &'a str {
    VALUE_ALIASES
        .iter()
        .find(|(k, alias, _)| *k == key && alias.eq_ignore_ascii_case(raw.trim()))
        .map_or(raw, |&(_, _, name)| name)
}

/// Attribute `key`'s text as a typed JSON value: sizes and integers as numbers (text that
/// does not read as one stays text), text with aliases folded, any other attribute a
/// number when its text is one.
pub fn typed(key: &str, raw: &str) -> Value {
    match attr_type(key) {
        Some(AttrType::Size) => match iolab_sim::size::parse_size(raw) {
            Ok(n) => Value::from(n),
            Err(_) => Value::from(raw),
        },
        Some(AttrType::Integer) => match raw.trim().parse::<u64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::from(raw),
        },
        Some(AttrType::Bool) => match raw.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Value::from(true),
            "false" | "0" | "no" | "off" => Value::from(false),
            _ => Value::from(raw),
        },
        Some(AttrType::Text) => Value::from(canonical(key, raw)),
        None => {
            if let Ok(n) = raw.parse::<u64>() {
                Value::from(n)
            } else if let Ok(n) = raw.parse::<i64>() {
                Value::from(n)
            } else if let Some(x) = raw.parse::<f64>().ok().filter(|x| x.is_finite()) {
                Value::from(x)
            } else {
                Value::from(raw)
            }
        }
    }
}

/// Every attribute of `attrs` as a typed value.
pub fn typed_attrs(attrs: &BTreeMap<String, String>) -> BTreeMap<String, Value> {
    attrs
        .iter()
        .map(|(k, v)| (k.clone(), typed(k, v)))
        .collect()
}

/// A configuration's pairing key: its workload and the workload's
/// [`PAIRING_ATTRS`], typed; `None` when the workload has none or an attribute is missing.
pub fn pairing_key(attrs: &BTreeMap<String, String>) -> Option<Vec<(String, Value)>> {
    let workload = canonical("workload", attrs.get("workload")?);
    let (_, keys) = PAIRING_ATTRS.iter().find(|(w, _)| *w == workload)?;
    let mut key = vec![("workload".to_owned(), Value::from(workload))];
    for k in keys.iter() {
        // A fio job on a synchronous engine runs at depth 1 whatever its iodepth says.
        let value = if workload == "fio" && *k == "iodepth" && fio_engine_is_sync(attrs) {
            Value::from(1u64)
        } else {
            typed(k, attrs.get(*k)?)
        };
        key.push(((*k).to_owned(), value));
    }
    Some(key)
}

/// The name a lab re-aim run gives to metric `metric` of the row of `users` users, as `iolab
/// import reaim` names it in that row: `reaim.jobs_per_min` -> `reaim.users100.jpm`,
/// `reaim.jobs_per_min_per_child` -> `reaim.users100.jpm_per_child`, `reaim.X` ->
/// `reaim.users100.X` (a lab run holds every row in one measurement).
pub fn reaim_row_metric(users: u64, metric: &str) -> String {
    let Some(what) = metric.strip_prefix("reaim.") else {
        return metric.to_owned();
    };
    let lab = match what {
        "jobs_per_min" => "jpm",
        "jobs_per_min_per_child" => "jpm_per_child",
        w => w,
    };
    format!("reaim.users{users}.{lab}")
}

/// fio's engines that complete each I/O before issuing the next (`FIO_SYNCIO` in fio's
/// engines/sync.c, mmap.c, splice.c): fio caps their queue depth at 1 and says so.
pub const FIO_SYNC_ENGINES: [&str; 7] = [
    "sync", "psync", "vsync", "pvsync", "pvsync2", "mmap", "splice",
];

/// Whether a fio configuration's `ioengine` is synchronous ([`FIO_SYNC_ENGINES`]).
pub fn fio_engine_is_sync(attrs: &BTreeMap<String, String>) -> bool {
    attrs
        .get("ioengine")
        .is_some_and(|e| FIO_SYNC_ENGINES.contains(&e.as_str()))
}

/// Whether two configurations agree on every attribute both carry (typed, aliases folded),
/// leaving out [`RUN_ATTRS`]: what breaks a tie when a pairing key is not unique.
pub fn agree(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter()
        .filter(|(k, _)| !RUN_ATTRS.contains(&k.as_str()))
        .all(|(k, va)| b.get(k).map_or(true, |vb| typed(k, va) == typed(k, vb)))
}

/// The attributes both carry that break a tie (for messages), as `k=v ...`, leaving out
/// [`RUN_ATTRS`], `workload` and `skip` (the pairing key's attributes).
pub fn shared_text(
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
    skip: &[(String, Value)],
) -> String {
    a.iter()
        .filter(|(k, _)| {
            !RUN_ATTRS.contains(&k.as_str())
                && *k != "workload"
                && !skip.iter().any(|(s, _)| s == *k)
                && b.contains_key(*k)
        })
        .map(|(k, v)| match typed(k, v) {
            Value::String(s) => format!("{k}={s}"),
            t => format!("{k}={t}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A pairing key as `rw=randread bs=4096 ...` (the workload first).
pub fn key_text(key: &[(String, Value)]) -> String {
    key.iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            v => format!("{k}={v}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn old_metric_names_read_as_the_current_ones_in_the_current_unit() {
        assert_eq!(
            canonical_metric("netperf.throughput_mbps", "Mb/s", 94_030.0),
            ("net.throughput_gbps", "Gb/s", 94.03)
        );
        assert_eq!(
            canonical_metric("read.iops", "IOPS", 5.0),
            ("read.iops", "IOPS", 5.0)
        );
    }

    #[test]
    fn sizes_and_integers_are_typed() {
        assert_eq!(typed("bs", "4k"), Value::from(4096u64));
        assert_eq!(typed("bs", "4096"), Value::from(4096u64));
        assert_eq!(typed("iodepth", "8"), Value::from(8u64));
        assert_eq!(typed("iommu_mode", "none"), Value::from("off"));
        assert_eq!(typed("workload", "bonnie++"), Value::from("bonnie"));
        assert_eq!(typed("something", "2.5"), Value::from(2.5));
        assert_eq!(typed("something", "x"), Value::from("x"));
        assert_eq!(typed("bs", "odd"), Value::from("odd"));
    }

    #[test]
    fn a_reaim_row_metric_is_the_lab_runs_row_metric() {
        assert_eq!(
            reaim_row_metric(100, "reaim.jobs_per_min"),
            "reaim.users100.jpm"
        );
        assert_eq!(
            reaim_row_metric(200, "reaim.jobs_per_min_per_child"),
            "reaim.users200.jpm_per_child"
        );
        assert_eq!(
            reaim_row_metric(300, "reaim.child_sys_s"),
            "reaim.users300.child_sys_s"
        );
        assert_eq!(reaim_row_metric(300, "cpu.sys_pct"), "cpu.sys_pct");
    }

    #[test]
    fn a_synchronous_engine_counts_as_depth_one() {
        let job = |engine: &str| {
            attrs(&[
                ("workload", "fio"),
                ("rw", "randread"),
                ("bs", "4k"),
                ("iodepth", "8"),
                ("numjobs", "2"),
                ("ioengine", engine),
            ])
        };
        let lab = |depth: &str| {
            attrs(&[
                ("workload", "fio"),
                ("rw", "randread"),
                ("bs", "4096"),
                ("iodepth", depth),
                ("numjobs", "2"),
            ])
        };
        for engine in FIO_SYNC_ENGINES {
            assert_eq!(
                pairing_key(&job(engine)),
                pairing_key(&lab("1")),
                "{engine}"
            );
        }
        assert_eq!(pairing_key(&job("libaio")), pairing_key(&lab("8")));
        assert_ne!(pairing_key(&job("psync")), pairing_key(&lab("8")));
    }

    #[test]
    fn an_import_and_a_lab_run_of_one_job_have_one_key() {
        let import = attrs(&[
            ("workload", "fio"),
            ("rw", "randread"),
            ("bs", "4k"),
            ("iodepth", "8"),
            ("numjobs", "2"),
            ("ioengine", "libaio"),
        ]);
        let lab = attrs(&[
            ("workload", "fio"),
            ("rw", "randread"),
            ("bs", "4096"),
            ("iodepth", "8"),
            ("numjobs", "2"),
            ("iommu_mode", "strict"),
        ]);
        let key = pairing_key(&import).unwrap();
        assert_eq!(Some(key.clone()), pairing_key(&lab));
        assert_eq!(
            key_text(&key),
            "workload=fio rw=randread bs=4096 iodepth=8 numjobs=2"
        );
        let other = attrs(&[
            ("workload", "fio"),
            ("rw", "randread"),
            ("bs", "4096"),
            ("iodepth", "32"),
            ("numjobs", "2"),
        ]);
        assert_ne!(pairing_key(&other), Some(key));
        assert_eq!(pairing_key(&attrs(&[("workload", "fio")])), None);
        assert_eq!(pairing_key(&attrs(&[("workload", "bonnie")])), None);
    }

    #[test]
    fn bonnie_pairs_by_file_size_and_reaim_by_user_count() {
        let import = attrs(&[("workload", "bonnie++"), ("size", "8G"), ("name", "x")]);
        let lab = attrs(&[("workload", "bonnie"), ("size", "8589934592")]);
        assert_eq!(pairing_key(&import), pairing_key(&lab));
        assert!(pairing_key(&import).is_some());
        let users = attrs(&[("workload", "reaim"), ("users", "100")]);
        assert_eq!(
            key_text(&pairing_key(&users).unwrap()),
            "workload=reaim users=100"
        );
    }

    #[test]
    fn ties_break_on_the_attributes_both_carry_never_on_run_attributes() {
        let import = attrs(&[("virt_merge", "false"), ("seed", "0"), ("users", "100")]);
        let novmerge = attrs(&[("virt_merge", "false"), ("seed", "1"), ("cpus", "2")]);
        let vmerge = attrs(&[("virt_merge", "true"), ("seed", "0")]);
        assert!(agree(&import, &novmerge));
        assert!(!agree(&import, &vmerge));
        let key = [("users".to_owned(), Value::from(100u64))];
        assert_eq!(shared_text(&import, &novmerge, &key), "virt_merge=false");
        assert_eq!(typed("virt_merge", "no"), Value::from(false));
    }
}
