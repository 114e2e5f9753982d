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
    /// Text (names, modes, patterns), with aliases folded to the current name.
    Text,
}

/// Attributes whose type is fixed; any other attribute is a number when its text is one,
/// else text.
pub const TYPED_ATTRS: [(&str, AttrType); 22] = [
    ("bs", AttrType::Size),
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
    ("workload", AttrType::Text),
    ("rw", AttrType::Text),
    ("iommu_mode", AttrType::Text),
    ("iommu_model", AttrType::Text),
    ("scenario", AttrType::Text),
    ("platform", AttrType::Text),
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
/// attributes, compared as typed values. Workloads not listed pair by name only.
pub const PAIRING_ATTRS: [(&str, &[&str]); 1] = [("fio", &["rw", "bs", "iodepth", "numjobs"])];

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
        key.push(((*k).to_owned(), typed(k, attrs.get(*k)?)));
    }
    Some(key)
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
    fn an_import_and_a_lab_run_of_one_job_have_one_key() {
        let import = attrs(&[
            ("workload", "fio"),
            ("rw", "randread"),
            ("bs", "4k"),
            ("iodepth", "8"),
            ("numjobs", "2"),
            ("ioengine", "psync"),
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
}
