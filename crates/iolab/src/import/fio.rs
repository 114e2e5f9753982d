//! fio's JSON output (`--output-format=json` and `json+`), fio 3.x.
//!
//! One [`Measurement`] per entry of `jobs` (one per job, or one per group with
//! `group_reporting`); its configuration is the job name (`name#k` when several entries
//! share a name, as the jobs of `numjobs=N` do without `group_reporting`). Metrics, per data
//! direction that did I/O (`read`, `write`, `trim`), named as the lab's fio workload names
//! them:
//!
//! | metric | unit | from |
//! |---|---|---|
//! | `<dir>.iops` | IOPS | `iops` |
//! | `<dir>.bw_bytes_per_s` | B/s | `bw_bytes` (`bw` KiB/s x 1024 if absent) |
//! | `<dir>.clat_mean_ns` | ns | `clat_ns.mean` |
//! | `<dir>.clat_p50_ns`, `<dir>.clat_p99_ns`, `<dir>.clat_p99.9_ns` | ns | `clat_ns.percentile` (when fio printed percentiles) |
//! | `cpu.usr_pct`, `cpu.sys_pct` | % | `usr_cpu`, `sys_cpu` |
//!
//! With `json+`, `clat_ns.bins` (fio's own latency buckets: value in ns -> count) of every
//! direction become the measurement's [`LatencyHistogram`]; each of fio's buckets is counted
//! in the lab histogram's bucket that holds its value, so percentiles stay within the lab
//! histogram's 1/16 precision. Attributes: `workload = fio`, `fio_version`, `jobname`,
//! `groupid` and `rw`, `rwmixread`, `bs`, `iodepth`, `numjobs`, `ioengine` (with io_uring's
//! `hipri`, `sqthread_poll`, `fixedbufs`, `registerfiles`) where the job (or global) options
//! give them. A document written by `iolab run --format json` also carries an
//! `iolab` object per job: its attributes and metrics are imported too. Text before the JSON document (fio prints notes there on standard
//! output) is skipped.

use std::collections::BTreeMap;

use iolab_sim::metrics::{LatencyHistogram, Measurement, Metric};
use serde_json::Value;

use super::ImportError;

/// Job options copied into the measurement's attributes.
const OPTION_ATTRS: [&str; 10] = [
    "rw",
    "rwmixread",
    "bs",
    "iodepth",
    "numjobs",
    "ioengine",
    "hipri",
    "sqthread_poll",
    "fixedbufs",
    "registerfiles",
];

/// Parses fio JSON or JSON+ output.
pub fn parse(text: &str) -> Result<Vec<Measurement>, ImportError> {
    // fio may print notes ("note: both iodepth >= 1 and synchronous I/O engine ...") on
    // standard output before the document: skip to the first line that opens it.
    let mut offset = 0;
    let mut skipped_lines = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with('{') {
            break;
        }
        offset += line.len();
        skipped_lines += 1;
    }
    if offset == text.len() {
        return Err(ImportError::Empty(
            "no JSON document found (expected fio --output-format=json or json+ output)".to_owned(),
        ));
    }
    let doc: Value = serde_json::from_str(&text[offset..]).map_err(|e| ImportError::Json {
        line: e.line() + skipped_lines,
        column: e.column(),
        message: if e.is_eof() {
            "the file ends inside the JSON document (truncated?)".to_owned()
        } else {
            format!("not valid JSON: {e}")
        },
    })?;
    let root = At::root(&doc);
    let version = root.get("fio version")?.str()?.to_owned();
    let jobs = root.get("jobs")?;
    let list = jobs.array()?;
    if list.is_empty() {
        return Err(ImportError::Field {
            field: "jobs".to_owned(),
            expected: "expected at least one job, found none".to_owned(),
        });
    }
    let global = doc.get("global options");
    let mut out = Vec::with_capacity(list.len());
    for i in 0..list.len() {
        out.push(job(&jobs.index(i), global, &version)?);
    }
    super::disambiguate(&mut out);
    Ok(out)
}

fn job(job: &At<'_>, global: Option<&Value>, version: &str) -> Result<Measurement, ImportError> {
    let name = job.get("jobname")?.str()?;
    let mut m = Measurement::new(name)
        .attr("workload", "fio")
        .attr("fio_version", version)
        .attr("jobname", name)
        .attr("groupid", job.get("groupid")?.f64()?);
    let options = job.v.get("job options");
    for key in OPTION_ATTRS {
        let value = options
            .and_then(|o| o.get(key))
            .or_else(|| global.and_then(|g| g.get(key)));
        match value {
            Some(Value::String(s)) => m = m.attr(key, s),
            Some(Value::Number(n)) => m = m.attr(key, n),
            _ => {}
        }
    }
    let mut histogram: Option<BTreeMap<u64, u64>> = None;
    for dir in ["read", "write", "trim"] {
        // fio writes all three directions; a direction that is absent did no I/O.
        let Some(d) = job.opt(dir) else { continue };
        if d.get("total_ios")?.f64()? == 0.0 {
            continue;
        }
        let bw = match d.opt("bw_bytes") {
            Some(b) => b.f64()?,
            None => d.get("bw")?.f64()? * 1024.0,
        };
        let clat = d.get("clat_ns")?;
        m = m
            .metric(Metric::new(
                format!("{dir}.iops"),
                "IOPS",
                d.get("iops")?.f64()?,
            ))
            .metric(Metric::new(format!("{dir}.bw_bytes_per_s"), "B/s", bw))
            .metric(Metric::new(
                format!("{dir}.clat_mean_ns"),
                "ns",
                clat.get("mean")?.f64()?,
            ));
        if let Some(pct) = clat.opt("percentile") {
            for (key, name) in [
                ("50.000000", "p50"),
                ("99.000000", "p99"),
                ("99.900000", "p99.9"),
            ] {
                if let Some(v) = pct.opt(key) {
                    m = m.metric(Metric::new(format!("{dir}.clat_{name}_ns"), "ns", v.f64()?));
                }
            }
        }
        if let Some(bins) = clat.opt("bins") {
            let h = histogram.get_or_insert_with(BTreeMap::new);
            for (key, count) in bins.object()? {
                let ns: u64 = key.parse().map_err(|_| ImportError::Field {
                    field: bins.path.clone(),
                    expected: format!("expected latency values in ns as keys, found `{key}`"),
                })?;
                let count = At {
                    v: count,
                    path: format!("{}.{key}", bins.path),
                }
                .count()?;
                // The lab bucket holding `ns`, keyed by its upper bound.
                let upper = LatencyHistogram::from_samples(&[ns]).buckets[0].0;
                *h.entry(upper).or_default() += count;
            }
        }
    }
    m = m
        .metric(Metric::new("cpu.usr_pct", "%", job.get("usr_cpu")?.f64()?))
        .metric(Metric::new("cpu.sys_pct", "%", job.get("sys_cpu")?.f64()?));
    if let Some(extra) = job.opt("iolab") {
        m = lab_extra(m, &extra)?;
    }
    if let Some(h) = histogram {
        m = m.latency(LatencyHistogram {
            buckets: h.into_iter().filter(|&(_, n)| n > 0).collect(),
        });
    }
    Ok(m)
}

/// The `iolab` object `iolab run --format json` adds to a job: its `attributes` become the
/// measurement's (fio's job options keep theirs) and its `metrics` (`{"value", "unit"}`)
/// are added, so an imported lab document holds what the lab run stored.
fn lab_extra(mut m: Measurement, extra: &At<'_>) -> Result<Measurement, ImportError> {
    if let Some(attrs) = extra.opt("attributes") {
        for (key, value) in attrs.object()? {
            if m.attrs.contains_key(key) {
                continue;
            }
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(At {
                        v: value,
                        path: format!("{}.{key}", attrs.path),
                    }
                    .error("a string or a number"))
                }
            };
            m = m.attr(key, text);
        }
    }
    if let Some(metrics) = extra.opt("metrics") {
        for (name, _) in metrics.object()? {
            let metric = metrics.get(name)?;
            m = m.metric(Metric::new(
                name.clone(),
                metric.get("unit")?.str()?,
                metric.get("value")?.f64()?,
            ));
        }
    }
    Ok(m)
}

/// A JSON value and the path it was reached by, for errors that name the field.
struct At<'a> {
    v: &'a Value,
    path: String,
}

impl<'a> At<'a> {
    fn root(v: &'a Value) -> Self {
        Self {
            v,
            path: String::new(),
        }
    }

    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn error(&self, expected: &str) -> ImportError {
        ImportError::Field {
            field: if self.path.is_empty() {
                "(top level)".to_owned()
            } else {
                self.path.clone()
            },
            expected: format!("expected {expected}, found {}", kind(self.v)),
        }
    }

    fn opt(&self, key: &str) -> Option<At<'a>> {
        self.v.get(key).map(|v| At {
            v,
            path: self.child(key),
        })
    }

    fn get(&self, key: &str) -> Result<At<'a>, ImportError> {
        if !self.v.is_object() {
            return Err(self.error("an object"));
        }
        self.opt(key).ok_or_else(|| ImportError::Field {
            field: self.child(key),
            expected: "missing".to_owned(),
        })
    }

    fn index(&self, i: usize) -> At<'a> {
        At {
            v: &self.v[i],
            path: format!("{}[{i}]", self.path),
        }
    }

    fn array(&self) -> Result<&'a Vec<Value>, ImportError> {
        self.v.as_array().ok_or_else(|| self.error("an array"))
    }

    fn object(&self) -> Result<&'a serde_json::Map<String, Value>, ImportError> {
        self.v.as_object().ok_or_else(|| self.error("an object"))
    }

    fn str(&self) -> Result<&'a str, ImportError> {
        self.v.as_str().ok_or_else(|| self.error("a string"))
    }

    fn f64(&self) -> Result<f64, ImportError> {
        match self.v.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            _ => Err(self.error("a number")),
        }
    }

    fn count(&self) -> Result<u64, ImportError> {
        self.v
            .as_u64()
            .ok_or_else(|| self.error("a non-negative integer"))
    }
}

fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("`{b}`"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() <= 40 => format!("the string \"{s}\""),
        Value::String(_) => "a string".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_JOB: &str = r#"{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "rr",
      "groupid" : 0,
      "job options" : { "rw" : "randread", "bs" : "4k" },
      "read" : {
        "bw_bytes" : 4096000, "bw" : 4000, "iops" : 1000.5, "total_ios" : 2001,
        "clat_ns" : { "mean" : 950.25, "percentile" : { "50.000000" : 900, "99.000000" : 2000 },
                      "bins" : { "900" : 1500, "2000" : 500, "70000" : 1 } }
      },
      "write" : { "bw_bytes" : 0, "bw" : 0, "iops" : 0.0, "total_ios" : 0,
                  "clat_ns" : { "mean" : 0.0 } },
      "usr_cpu" : 1.5, "sys_cpu" : 20.25
    }
  ]
}"#;

    #[test]
    fn a_job_becomes_a_measurement_with_the_lab_metric_names() {
        let ms = parse(ONE_JOB).unwrap();
        assert_eq!(ms.len(), 1);
        let m = &ms[0];
        assert_eq!(m.config, "rr");
        assert_eq!(m.attrs["rw"], "randread");
        assert_eq!(m.attrs["fio_version"], "fio-3.33");
        let v = |n: &str| m.get(n).map(|x| x.value);
        assert_eq!(v("read.iops"), Some(1000.5));
        assert_eq!(v("read.bw_bytes_per_s"), Some(4_096_000.0));
        assert_eq!(v("read.clat_mean_ns"), Some(950.25));
        assert_eq!(v("read.clat_p50_ns"), Some(900.0));
        assert_eq!(v("read.clat_p99_ns"), Some(2000.0));
        assert_eq!(v("read.clat_p99.9_ns"), None);
        assert_eq!(
            v("write.iops"),
            None,
            "a direction without I/O has no metrics"
        );
        assert_eq!(
            (v("cpu.usr_pct"), v("cpu.sys_pct")),
            (Some(1.5), Some(20.25))
        );
        let h = m.latency.as_ref().expect("json+ bins make a histogram");
        assert_eq!(h.count(), 2001);
        // 900 ns lies in the lab bucket [896, 927].
        assert_eq!(h.percentile(50.0), 927);
        assert_eq!(
            h.percentile(100.0),
            LatencyHistogram::from_samples(&[70_000]).buckets[0].0
        );
    }

    #[test]
    fn a_missing_field_is_named_with_its_path() {
        let text = ONE_JOB.replace("\"iops\" : 1000.5,", "");
        let err = parse(&text).unwrap_err();
        assert_eq!(
            err,
            ImportError::Field {
                field: "jobs[0].read.iops".to_owned(),
                expected: "missing".to_owned()
            }
        );
        let text = ONE_JOB.replace("\"usr_cpu\" : 1.5", "\"usr_cpu\" : \"high\"");
        let err = parse(&text).unwrap_err().to_string();
        assert_eq!(
            err,
            "field `jobs[0].usr_cpu`: expected a number, found the string \"high\""
        );
    }

    #[test]
    fn truncated_json_names_the_line() {
        let cut = &ONE_JOB[..ONE_JOB.len() / 2];
        let text = format!("note: a note\n{cut}");
        match parse(&text).unwrap_err() {
            ImportError::Json { line, message, .. } => {
                assert_eq!(line, cut.lines().count() + 1);
                assert!(message.contains("truncated"), "{message}");
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn text_without_json_is_refused() {
        assert!(matches!(
            parse("fio: no jobs\n"),
            Err(ImportError::Empty(_))
        ));
    }
}
