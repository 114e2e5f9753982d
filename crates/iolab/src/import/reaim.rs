//! The re-aim-7 results table: a header naming the columns (`Num Forked`, `Parent Time`,
//! `Child SysTime`, `Child UTime`, `Jobs per Minute`, `Jobs/min/Child`, `Std_dev Time`,
//! `Std_dev Percent`, `JTI`), one row per user count, and a closing
//! `Max Jobs per Minute X` line. Text before the header is skipped; extra text after a row's
//! nine numbers (the lab prints `[published X]` there) is ignored.
//!
//! One [`Measurement`] per row, configuration `users_<N>`, attributes `workload = reaim`,
//! `users = N`; metrics:
//!
//! | metric | unit | column |
//! |---|---|---|
//! | `reaim.jobs_per_min` | jobs/min | Jobs per Minute |
//! | `reaim.jobs_per_min_per_child` | jobs/min | Jobs/min/Child |
//! | `reaim.parent_time_s` | s | Parent Time |
//! | `reaim.child_sys_s`, `reaim.child_user_s` | s | Child SysTime, Child UTime |
//! | `reaim.std_dev_time_s`, `reaim.std_dev_pct` | s, % | Std_dev Time, Std_dev Percent |
//! | `reaim.jti` | - | JTI |
//!
//! A table without its `Max Jobs per Minute` line is taken as truncated; one whose maximum
//! disagrees with its rows as malformed.

use iolab_sim::metrics::{Measurement, Metric};

use super::ImportError;

/// The columns after `Num Forked`: metric name, unit, column title.
const COLUMNS: [(&str, &str, &str); 8] = [
    ("parent_time_s", "s", "Parent Time"),
    ("child_sys_s", "s", "Child SysTime"),
    ("child_user_s", "s", "Child UTime"),
    ("jobs_per_min", "jobs/min", "Jobs per Minute"),
    ("jobs_per_min_per_child", "jobs/min", "Jobs/min/Child"),
    ("std_dev_time_s", "s", "Std_dev Time"),
    ("std_dev_pct", "%", "Std_dev Percent"),
    ("jti", "-", "JTI"),
];

/// Parses a re-aim-7 results table.
pub fn parse(text: &str) -> Result<Vec<Measurement>, ImportError> {
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .position(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&"Num") && w.contains(&"Parent") && w.contains(&"JTI")
        })
        .ok_or_else(|| {
            ImportError::Empty(
                "no re-aim table header found (expected a line `Num Parent Child Child \
                 Jobs per ... JTI`)"
                    .to_owned(),
            )
        })?;
    let mut out: Vec<Measurement> = Vec::new();
    let mut max_line = None;
    for (i, raw) in lines.iter().enumerate().skip(header + 1) {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with("Forked") {
            continue;
        }
        if let Some(rest) = l.strip_prefix("Max Jobs per Minute") {
            let max: f64 = rest.trim().parse().map_err(|_| ImportError::LineField {
                line,
                field: "Max Jobs per Minute".to_owned(),
                expected: format!("expected a number, found `{}`", rest.trim()),
            })?;
            max_line = Some((line, max));
            break;
        }
        out.push(row(l, line)?);
    }
    let Some((line, max)) = max_line else {
        return Err(ImportError::Line {
            line: lines.len(),
            expected: "the table ends without its `Max Jobs per Minute` line (truncated?)"
                .to_owned(),
        });
    };
    if out.is_empty() {
        return Err(ImportError::Line {
            line,
            expected: "expected at least one table row before `Max Jobs per Minute`".to_owned(),
        });
    }
    let best = out
        .iter()
        .filter_map(|m| m.get("reaim.jobs_per_min"))
        .map(|m| m.value)
        .fold(f64::NEG_INFINITY, f64::max);
    // The rows and the maximum are printed with two decimals.
    if (best - max).abs() > 0.006 {
        return Err(ImportError::LineField {
            line,
            field: "Max Jobs per Minute".to_owned(),
            expected: format!("expected the rows' maximum {best:.2}, found {max:.2}"),
        });
    }
    super::disambiguate(&mut out);
    Ok(out)
}

fn row(l: &str, line: usize) -> Result<Measurement, ImportError> {
    let cols: Vec<&str> = l.split_whitespace().collect();
    let users: u32 = cols[0].parse().map_err(|_| ImportError::LineField {
        line,
        field: "Num Forked".to_owned(),
        expected: format!("expected a row starting with the number of users, found `{l}`"),
    })?;
    if cols.len() < 1 + COLUMNS.len() {
        return Err(ImportError::Line {
            line,
            expected: format!(
                "expected 9 columns (Num Forked ... JTI), found {} (truncated?)",
                cols.len()
            ),
        });
    }
    let mut m = Measurement::new(format!("users_{users}"))
        .attr("workload", "reaim")
        .attr("users", users);
    for (k, (name, unit, title)) in COLUMNS.iter().enumerate() {
        let field = cols[k + 1];
        let v = match field.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => v,
            _ => {
                return Err(ImportError::LineField {
                    line,
                    field: (*title).to_owned(),
                    expected: format!("expected a non-negative number, found `{field}`"),
                })
            }
        };
        m = m.metric(Metric::new(format!("reaim.{name}"), *unit, v));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "REAIM Workload
Times are in seconds - Child times from tms.cstime and tms.cutime
Num     Parent   Child   Child  Jobs per   Jobs/min/  Std_dev  Std_dev  JTI
Forked  Time     SysTime UTime   Minute     Child      Time     Percent
100     110.25   12.50   205.00  5605.19    56.05      1.20     1.10     98
200     219.07   25.00   410.00  5642.06    28.21      2.10     0.97     99   [published 5642.06]
Max Jobs per Minute 5642.06
";

    #[test]
    fn rows_become_measurements() {
        let ms = parse(TABLE).unwrap();
        assert_eq!(ms.len(), 2);
        assert_eq!(ms[1].config, "users_200");
        assert_eq!(ms[1].attrs["users"], "200");
        assert_eq!(ms[1].get("reaim.jobs_per_min").unwrap().value, 5642.06);
        assert_eq!(ms[0].get("reaim.child_user_s").unwrap().value, 205.0);
        assert_eq!(ms[0].get("reaim.jti").unwrap().value, 98.0);
        assert_eq!(ms[0].metrics.len(), 8);
    }

    #[test]
    fn the_sims_own_table_parses_the_same() {
        use iolab_sim::workloads::reaim::{format_table, parse_table};
        let rows = parse_table(TABLE);
        let text = format_table(&rows, &[]);
        let ms = parse(&text).unwrap();
        for (m, r) in ms.iter().zip(&rows) {
            assert_eq!(m.get("reaim.jobs_per_min").unwrap().value, r.jpm);
            assert_eq!(m.attrs["users"], r.forked.to_string());
        }
    }

    #[test]
    fn a_truncated_or_malformed_table_is_refused() {
        let cut: String = TABLE.lines().take(5).map(|l| format!("{l}\n")).collect();
        assert_eq!(
            parse(&cut).unwrap_err().to_string(),
            "line 5: the table ends without its `Max Jobs per Minute` line (truncated?)"
        );
        let bad = TABLE.replace("205.00", "2o5.00");
        assert_eq!(
            parse(&bad).unwrap_err().to_string(),
            "line 5, field `Child UTime`: expected a non-negative number, found `2o5.00`"
        );
        let short = TABLE.replace("   1.20     1.10     98", "");
        assert!(parse(&short)
            .unwrap_err()
            .to_string()
            .starts_with("line 5: expected 9 columns"));
        let wrong_max = TABLE.replace("Minute 5642.06", "Minute 5700.00");
        assert!(parse(&wrong_max)
            .unwrap_err()
            .to_string()
            .contains("expected the rows' maximum 5642.06"));
    }
}
