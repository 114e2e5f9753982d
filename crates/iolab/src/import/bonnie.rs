//! bonnie++ CSV rows: the 1.03 layout (27 columns, starting with the machine name) and the
//! 1.97 / 1.98 layouts of bonnie++ 1.9x and 2.0x (starting with the format version).
//!
//! One [`Measurement`] per row; its configuration is the row's name column (machine name or
//! `-m` label). Rows may share a name (`bonnie++ -x N` repeats the test N times): `iolab
//! import bonnie` stores each row as a run of its own, the rows of a file as one group, so
//! repetitions are samples of the same configuration for `iolab compare`. `+++++` / `++++` / `+++`
//! (bonnie's "too fast to measure") and empty fields give no metric: absent, not zero.
//! Header lines (`name,...` or `format_version,...`) and blank lines are skipped.
//!
//! Metrics (the phase names of the lab's bonnie workload):
//!
//! | metric | unit | bonnie column |
//! |---|---|---|
//! | `bonnie.out_char_kps`, `bonnie.out_char_cpu_pct` | K/sec, % | putc |
//! | `bonnie.out_block_kps`, `bonnie.out_block_cpu_pct` | K/sec, % | put_block |
//! | `bonnie.rewrite_kps`, `bonnie.rewrite_cpu_pct` | K/sec, % | rewrite |
//! | `bonnie.in_char_kps`, `bonnie.in_char_cpu_pct` | K/sec, % | getc |
//! | `bonnie.in_block_kps`, `bonnie.in_block_cpu_pct` | K/sec, % | get_block |
//! | `bonnie.seeks_per_s`, `bonnie.seeks_cpu_pct` | /sec, % | seeks |
//! | `bonnie.{seq,ran}_{create,read,delete}_per_s`, `..._cpu_pct` | /sec, % | file tests |
//! | `bonnie.<phase>_latency_ns` | ns | 1.9x latency columns (`us`, `ms`, `s` suffixes) |
//!
//! Attributes: `workload = bonnie`, `name`, `size`, `num_files` and, for 1.9x,
//! `format_version`, `bonnie_version`, `concurrency`.

use iolab_sim::metrics::{Measurement, Metric};

use super::ImportError;

/// The speed phases, in bonnie's column order, and the units of their rates.
const IO_PHASES: [(&str, &str); 6] = [
    ("out_char", "K/sec"),
    ("out_block", "K/sec"),
    ("rewrite", "K/sec"),
    ("in_char", "K/sec"),
    ("in_block", "K/sec"),
    ("seeks", "/sec"),
];

/// The file-creation phases, in bonnie's column order (the names the lab's own bonnie
/// runs use, so imported and simulated runs compare metric by metric).
use iolab_sim::workloads::bonnie::FILE_PHASES;

/// Where the columns of one CSV layout are.
struct Layout {
    /// `1.03`, `1.97` or `1.98`.
    format: &'static str,
    /// Number of columns.
    columns: usize,
    /// Index of the name and size columns.
    name: usize,
    size: usize,
    /// First of the 12 speed columns (rate, CPU% per phase).
    io: usize,
    /// The `num_files` column; the 12 file-test columns follow the file-size columns.
    num_files: usize,
    files: usize,
    /// First of the 12 latency columns (1.9x only).
    latency: Option<usize>,
}

const V103: Layout = Layout {
    format: "1.03",
    columns: 27,
    name: 0,
    size: 1,
    io: 2,
    num_files: 14,
    files: 15,
    latency: None,
};

/// bonnie++ 1.96/1.97: format, version, name, concurrency, seed, file size, chunk size,
/// then the speed columns.
const V197: Layout = Layout {
    format: "1.97",
    columns: 48,
    name: 2,
    size: 5,
    io: 7,
    num_files: 19,
    files: 24,
    latency: Some(36),
};

/// bonnie++ 1.98 / 2.00: as 1.97 with the seek count and seeker process count after the
/// chunk size (the layout bonnie++ 2.00a's own `bon_csv2txt` reads).
const V198: Layout = Layout {
    format: "1.98",
    columns: 50,
    name: 2,
    size: 5,
    io: 9,
    num_files: 21,
    files: 26,
    latency: Some(38),
};

/// Parses bonnie++ CSV output.
pub fn parse(text: &str) -> Result<Vec<Measurement>, ImportError> {
    // bonnie++ without -q prints its human-readable table before the CSV line: the table's
    // lines (no commas) are skipped, and a file of the table alone is named as such rather
    // than called a truncated CSV.
    let text_report = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .filter(|l| l.split_whitespace().next() == Some("Version") && !l.contains(','));
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim_end_matches('\r');
        if l.trim().is_empty() || l.starts_with("name,") || l.starts_with("format_version,") {
            continue;
        }
        if text_report.is_some() && !l.contains(',') {
            continue;
        }
        out.push(row(l, line)?);
    }
    if let (true, Some(first)) = (out.is_empty(), text_report) {
        return Err(ImportError::Empty(format!(
            "this is bonnie++'s text report (`{}`) without its CSV line: import the CSV line bonnie++ prints after the table (with -q it prints only that)",
            first.trim()
        )));
    }
    if out.is_empty() {
        return Err(ImportError::Empty(
            "no bonnie++ CSV rows found (expected the CSV line bonnie++ prints with -q)".into(),
        ));
    }
    Ok(out)
}

fn row(l: &str, line: usize) -> Result<Measurement, ImportError> {
    let cols: Vec<&str> = l.split(',').map(str::trim).collect();
    let layout = match cols[0] {
        "1.98" => &V198,
        "1.97" | "1.96" => &V197,
        f if f.starts_with("1.9") || f.starts_with("2.") => {
            return Err(ImportError::LineField {
                line,
                field: "format_version".to_owned(),
                expected: format!("expected CSV format 1.96, 1.97 or 1.98, found `{f}`"),
            })
        }
        _ => &V103,
    };
    if cols.len() != layout.columns {
        return Err(ImportError::Line {
            line,
            expected: format!(
                "expected {} comma-separated columns (bonnie++ {} CSV), found {}{}",
                layout.columns,
                layout.format,
                cols.len(),
                if cols.len() < layout.columns {
                    " (truncated?)"
                } else {
                    ""
                }
            ),
        });
    }
    let name = cols[layout.name];
    if name.is_empty() {
        return Err(ImportError::LineField {
            line,
            field: "name".to_owned(),
            expected: "expected the machine name, found an empty field".to_owned(),
        });
    }
    let mut m = Measurement::new(name)
        .attr("workload", "bonnie")
        .attr("name", name)
        .attr("size", cols[layout.size]);
    if layout.format != "1.03" {
        m = m
            .attr("format_version", cols[0])
            .attr("bonnie_version", cols[1])
            .attr("concurrency", cols[3]);
    }
    if !cols[layout.num_files].is_empty() {
        m = m.attr("num_files", cols[layout.num_files]);
    }
    for (k, (phase, unit)) in IO_PHASES.iter().enumerate() {
        let rate = if *phase == "seeks" {
            "seeks_per_s".to_owned()
        } else {
            format!("{phase}_kps")
        };
        m = push(m, &cols, line, layout.io + 2 * k, &rate, unit)?;
        m = push(
            m,
            &cols,
            line,
            layout.io + 2 * k + 1,
            &format!("{phase}_cpu_pct"),
            "%",
        )?;
    }
    for (k, phase) in FILE_PHASES.iter().enumerate() {
        m = push(
            m,
            &cols,
            line,
            layout.files + 2 * k,
            &format!("{phase}_per_s"),
            "/sec",
        )?;
        m = push(
            m,
            &cols,
            line,
            layout.files + 2 * k + 1,
            &format!("{phase}_cpu_pct"),
            "%",
        )?;
    }
    if let Some(first) = layout.latency {
        let phases = IO_PHASES.iter().map(|(p, _)| *p).chain(FILE_PHASES);
        for (k, phase) in phases.enumerate() {
            let field = cols[first + k];
            if field.is_empty() || field.starts_with('+') {
                continue;
            }
            let ns = latency_ns(field).ok_or_else(|| ImportError::LineField {
                line,
                field: format!("{phase}_latency"),
                expected: format!(
                    "expected a latency such as `850us`, `12ms` or `2s`, found `{field}`"
                ),
            })?;
            m = m.metric(Metric::new(format!("bonnie.{phase}_latency_ns"), "ns", ns));
        }
    }
    Ok(m)
}

/// Adds metric `bonnie.<name>` from column `index`, unless the column is empty or `+++`.
fn push(
    m: Measurement,
    cols: &[&str],
    line: usize,
    index: usize,
    name: &str,
    unit: &str,
) -> Result<Measurement, ImportError> {
    let field = cols[index];
    if field.is_empty() || (field.len() >= 3 && field.bytes().all(|b| b == b'+')) {
        return Ok(m);
    }
    match field.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => {
            Ok(m.metric(Metric::new(format!("bonnie.{name}"), unit, v)))
        }
        _ => Err(ImportError::LineField {
            line,
            field: name.to_owned(),
            expected: format!(
                "expected a non-negative number or `+++++` (too fast to measure), found `{field}`"
            ),
        }),
    }
}

/// A bonnie++ 1.9x latency (`16077us`, `221ms`, `3s`; a bare number is in microseconds) in ns.
fn latency_ns(field: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = field.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = field.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = field.strip_suffix('s') {
        (n, 1e9)
    } else {
        (field, 1e3)
    };
    let v: f64 = number.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_report_is_named_as_such() {
        let text =
            "Version  2.00a      ------Sequential Output------ --Sequential Input- --Random-\n\
                    -Per Chr- --Block-- -Rewrite- -Per Chr- --Block-- --Seeks--\n";
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains("text report") && e.contains("CSV"), "{e}");
        assert!(!e.contains("truncated"), "{e}");
        // The whole standard output (table, then the CSV line) imports the CSV line.
        let both = format!(
            "{text}host,512M,82598,99,242161,58,102489,25,73719,98,254089,32,2133.3,6,\
             16,385,20,+++++,+++,390,15,380,19,+++++,+++,300,12\n"
        );
        assert_eq!(parse(&both).unwrap().len(), 1);
    }

    #[test]
    fn a_103_row_with_plus_fields_has_those_metrics_absent() {
        let text = "name,size,putc\n\
            box,8G,82598,99,242161,58,102489,25,73719,98,254089,32,2133.3,6,\
            16,385,20,+++++,+++,390,15,380,19,+++++,+++,300,12\n";
        let ms = parse(text).unwrap();
        assert_eq!(ms.len(), 1);
        let m = &ms[0];
        assert_eq!((m.config.as_str(), m.attrs["size"].as_str()), ("box", "8G"));
        let v = |n: &str| m.get(n).map(|x| x.value);
        assert_eq!(v("bonnie.out_char_kps"), Some(82598.0));
        assert_eq!(v("bonnie.out_block_cpu_pct"), Some(58.0));
        assert_eq!(v("bonnie.in_block_kps"), Some(254089.0));
        assert_eq!(v("bonnie.seeks_per_s"), Some(2133.3));
        assert_eq!(v("bonnie.seq_create_per_s"), Some(385.0));
        assert_eq!(v("bonnie.seq_read_per_s"), None);
        assert_eq!(v("bonnie.seq_read_cpu_pct"), None);
        assert_eq!(v("bonnie.ran_delete_cpu_pct"), Some(12.0));
        assert_eq!(m.metrics.len(), 12 + 8);
    }

    #[test]
    fn latencies_carry_their_units() {
        assert_eq!(latency_ns("221ms"), Some(221e6));
        assert_eq!(latency_ns("16077us"), Some(16_077e3));
        assert_eq!(latency_ns("2s"), Some(2e9));
        assert_eq!(latency_ns("12"), Some(12e3));
        assert_eq!(latency_ns("fast"), None);
    }

    #[test]
    fn a_bad_field_is_named_with_its_line() {
        let text = "\nbox,8G,82598,99,2421x1,58,102489,25,73719,98,254089,32,2133.3,6,\
            16,,,,,,,,,,,,\n";
        assert_eq!(
            parse(text).unwrap_err().to_string(),
            "line 2, field `out_block_kps`: expected a non-negative number or `+++++` \
             (too fast to measure), found `2421x1`"
        );
        let text = "box,8G,82598,99,242161,58\n";
        assert_eq!(
            parse(text).unwrap_err().to_string(),
            "line 1: expected 27 comma-separated columns (bonnie++ 1.03 CSV), found 6 (truncated?)"
        );
    }
}
