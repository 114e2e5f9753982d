//! `iolab report`: a results database filled through the results-database API with runs
//! whose measurements are known, then the HTML page and the SVG files checked.

#[allow(dead_code)]
#[path = "../src/db.rs"]
mod db;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use db::{NewRun, ResultsDb};
use iolab_sim::experiment::{Effect, ExperimentReport, Figure, Role};
use iolab_sim::metrics::{CpuBreakdown, LatencyHistogram, Measurement, Metric};

fn iolab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iolab"))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("iolab-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const MODES: [&str; 3] = ["off", "strict", "lazy"];
const THREADS: [u32; 4] = [1, 2, 4, 8];

/// IOPS of a mode at a thread count (made-up, distinct numbers so the table can be checked).
fn iops(mode: usize, threads: u32, run: u32) -> f64 {
    [100_000.0, 60_000.0, 90_000.0][mode] * f64::from(threads) + f64::from(run) * 10.0
}

fn report(run: u32, odd_config: bool) -> ExperimentReport {
    let mut measurements = Vec::new();
    for (mi, mode) in MODES.iter().enumerate() {
        for t in THREADS {
            let lat: Vec<u64> = (0..200u64)
                .map(|i| 8_000 + mi as u64 * 3_000 + i * 37 + u64::from(t) * 500)
                .collect();
            measurements.push(
                Measurement::new(format!("nvme.{mode}.t{t}"))
                    .attr("iommu_mode", mode)
                    .attr("threads", t)
                    .attr("workload", "fio")
                    .metric(Metric::new("read.iops", "IOPS", iops(mi, t, run)))
                    .metric(Metric::new("read.clat_mean_ns", "ns", 12_345.0 + mi as f64))
                    .latency(LatencyHistogram::from_samples(&lat))
                    .cpu(CpuBreakdown {
                        user_ns: 1_000 * u64::from(t),
                        system_ns: 3_000 + 1_000 * mi as u64,
                        spin_ns: 500 * mi as u64,
                        idle_ns: 10_000,
                    }),
            );
        }
    }
    if odd_config {
        measurements.push(
            Measurement::new("<b>&\"odd\"</b>")
                .attr("note", "a<b")
                .metric(Metric::new("odd.value", "x&y", 42.0)),
        );
    }
    ExperimentReport {
        name: "demo-scaling".into(),
        title: "made-up scaling".into(),
        runs: 1,
        figures: vec![Figure {
            id: "nvme.strict.t8".into(),
            unit: "IOPS".into(),
            published: Some(500_000.0),
            lab: iops(1, 8, run),
            role: Role::Prediction,
        }],
        effects: vec![Effect {
            id: "strict_vs_off".into(),
            published_pct: -40.0,
            lab_pct: -37.5,
        }],
        calibrated: Vec::new(),
        report_text: String::new(),
        notes: Vec::new(),
        measurements,
    }
}

/// A database with run 1 (with an odd configuration name), and runs 2 and 3 in group 2.
fn fill(path: &Path) {
    let mut db = ResultsDb::open(path).unwrap();
    let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    for (run, group, odd) in [(0u32, None, true), (1, Some(2), false), (2, Some(2), false)] {
        let r = report(run, odd);
        let id = db
            .store(&NewRun {
                kind: "lab",
                group_id: group,
                label: Some("made by report_cli.rs"),
                scenario_origin: None,
                scenario_text: None,
                seed: 7,
                started_at: at,
                finished_at: at + Duration::from_secs(2),
                report: &r,
            })
            .unwrap();
        assert_eq!(id, i64::from(run) + 1);
    }
}

/// Parses `xml` to the end: tags balanced and names matched, attributes well formed.
fn assert_well_formed_xml(xml: &str, what: &str) {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut depth = 0i64;
    let mut elements = 0;
    loop {
        match reader.read_event() {
            Ok(Event::Eof) => break,
            Ok(Event::Start(e)) => {
                depth += 1;
                elements += 1;
                for a in e.attributes() {
                    a.unwrap_or_else(|err| panic!("{what}: bad attribute: {err}"));
                }
            }
            Ok(Event::Empty(e)) => {
                elements += 1;
                for a in e.attributes() {
                    a.unwrap_or_else(|err| panic!("{what}: bad attribute: {err}"));
                }
            }
            Ok(Event::End(_)) => depth -= 1,
            Ok(Event::Text(t)) => {
                t.decode()
                    .unwrap_or_else(|err| panic!("{what}: bad text: {err}"));
            }
            Ok(_) => {}
            Err(e) => panic!(
                "{what}: not well-formed XML at {}: {e}",
                reader.buffer_position()
            ),
        }
    }
    assert_eq!(depth, 0, "{what}: unbalanced");
    assert!(elements > 10, "{what}: only {elements} elements");
}

#[test]
fn report_page_has_tables_and_a_plot_per_kind_and_is_self_contained() {
    let dir = tmpdir("page");
    let dbp = dir.join("r.db");
    fill(&dbp);
    let html_path = dir.join("out").join("report.html");
    std::fs::create_dir_all(html_path.parent().unwrap()).unwrap();
    let svg_dir = dir.join("svg");
    let out = iolab()
        .arg("--db")
        .arg(&dbp)
        .args(["report", "1", "g2", "-o"])
        .arg(&html_path)
        .arg("--svg")
        .arg(&svg_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One file, nothing beside it.
    let files: Vec<_> = std::fs::read_dir(html_path.parent().unwrap())
        .unwrap()
        .collect();
    assert_eq!(files.len(), 1);
    let html = std::fs::read_to_string(&html_path).unwrap();

    // Self-contained: no reference to the network but the SVG namespace, no scripts.
    let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(!without_ns.contains("http://") && !without_ns.contains("https://"));
    assert!(!html.contains("<script"));
    assert!(
        !html.contains("<?xml"),
        "XML declarations stripped inside HTML"
    );

    // Plots: 1 scaling (IOPS vs threads, one experiment) + a latency plot per measurement
    // with a histogram (12 per run, 3 runs) + a CPU plot per run.
    let svgs = html.matches("<svg").count();
    assert_eq!(svgs, 1 + 3 * 12 + 3, "svg elements in the page");
    let mut files: Vec<String> = std::fs::read_dir(&svg_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), svgs);
    assert!(files.contains(&"scaling-demo-scaling-threads-iops.svg".to_owned()));
    assert!(files.contains(&"cpu-run1.svg".to_owned()));
    for f in &files {
        let text = std::fs::read_to_string(svg_dir.join(f)).unwrap();
        assert_well_formed_xml(&text, f);
        assert!(html.contains(strip_decl(&text)), "{f} inlined as written");
    }
    // The scaling plot: a series per IOMMU mode (a line and a legend mark each, in three
    // colours), axes named; group 2's runs were plotted with run 1 (3 runs averaged).
    let scaling =
        std::fs::read_to_string(svg_dir.join("scaling-demo-scaling-threads-iops.svg")).unwrap();
    let texts = svg_texts(&scaling);
    for label in ["off", "strict", "lazy", "threads", "IOPS"] {
        assert!(
            texts.iter().any(|t| t == label),
            "scaling plot lacks {label}: {texts:?}"
        );
    }
    assert!(texts.iter().any(|t| t.ends_with("(mean of 3 runs)")));
    let mut strokes: Vec<&str> = scaling
        .split("<polyline")
        .skip(1)
        .filter_map(|p| p.split("stroke=\"").nth(1)?.split('"').next())
        .filter(|c| *c != "#000000")
        .collect();
    strokes.sort_unstable();
    let distinct: std::collections::BTreeSet<&str> = strokes.iter().copied().collect();
    assert_eq!((strokes.len(), distinct.len()), (6, 3), "{strokes:?}");
    // The CPU plot: the four parts in the legend and each configuration on the y axis.
    let cpu = svg_texts(&std::fs::read_to_string(svg_dir.join("cpu-run1.svg")).unwrap());
    for label in [
        "user",
        "system",
        "spin",
        "idle",
        "nvme.lazy.t8",
        "<b>&\"odd\"</b>",
    ] {
        if label.starts_with('<') {
            // Has no CPU time: not a bar.
            assert!(!cpu.iter().any(|t| t == label), "{label} has no CPU time");
        } else {
            assert!(
                cpu.iter().any(|t| t == label),
                "cpu plot lacks {label}: {cpu:?}"
            );
        }
    }
    // A latency plot: CDF and histogram of the known samples (200, p50 in its caption).
    let lat = files
        .iter()
        .find(|f| f.starts_with("latency-run2-0-"))
        .expect("latency plot of run 2's first measurement");
    let lat = svg_texts(&std::fs::read_to_string(svg_dir.join(lat)).unwrap());
    assert!(
        lat.iter().any(|t| t.contains(": 200 samples, p50 ")),
        "latency caption: {lat:?}"
    );
    assert!(lat.iter().any(|t| t == "CDF: fraction of I/Os ≤ x"));
    assert!(lat.iter().any(|t| t == "I/Os per bucket"));

    // Tables: figures published vs lab, effects, metrics of every measurement.
    for v in [
        "500000",
        &format!("{:.0}", iops(1, 8, 0)),
        "-37.5",
        "-40",
        "read.iops",
        &format!("{:.0}", iops(2, 4, 1)),
        "12347",
        "made by report_cli.rs",
        "2027-01-15T08:00:00Z",
    ] {
        assert!(html.contains(v), "page lacks {v}");
    }
    // Text from the database is escaped.
    assert!(html.contains("&lt;b&gt;&amp;&quot;odd&quot;&lt;/b&gt;"));
    assert!(html.contains("x&amp;y"));
    assert!(!html.contains("<b>&"));

    // Deterministic: the same database gives the same bytes.
    let again = dir.join("again.html");
    let out = iolab()
        .arg("--db")
        .arg(&dbp)
        .args(["report", "1,2,3", "-o"])
        .arg(&again)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read(&again).unwrap(), html.into_bytes());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The text content of every `<text>` element, trimmed and unescaped.
fn svg_texts(svg: &str) -> Vec<String> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(svg);
    let mut out = Vec::new();
    let mut inside = false;
    let mut raw = String::new();
    loop {
        match reader.read_event().unwrap() {
            Event::Eof => break,
            Event::Start(e) if e.name().as_ref() == b"text" => {
                inside = true;
                raw.clear();
            }
            Event::End(e) if e.name().as_ref() == b"text" => {
                inside = false;
                let text = quick_xml::escape::unescape(&raw).unwrap();
                out.push(text.trim().to_owned());
            }
            Event::Text(t) if inside => raw.push_str(&t.decode().unwrap()),
            Event::GeneralRef(r) if inside => {
                raw.push('&');
                raw.push_str(&r.decode().unwrap());
                raw.push(';');
            }
            _ => {}
        }
    }
    out
}

fn strip_decl(svg: &str) -> &str {
    let s = svg.trim_start();
    match s.strip_prefix("<?xml") {
        Some(rest) => rest[rest.find("?>").unwrap() + 2..].trim_start(),
        None => s,
    }
}

#[test]
fn bad_runs_arguments_are_refused_with_exit_code_2() {
    let dir = tmpdir("bad");
    let dbp = dir.join("r.db");
    fill(&dbp);
    let out_html = dir.join("x.html");
    for (args, expect) in [
        (vec!["99"], "no run 99"),
        (vec!["g9"], "group 9"),
        (vec!["gx"], "group number"),
        (vec!["1,,2"], "empty item"),
        (vec!["abc"], "run id"),
    ] {
        let out = iolab()
            .arg("--db")
            .arg(&dbp)
            .arg("report")
            .args(&args)
            .arg("-o")
            .arg(&out_html)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one message: {err}");
        assert!(!out_html.exists(), "nothing written for {args:?}");
    }
    let out = iolab()
        .arg("--db")
        .arg(dir.join("missing.db"))
        .args(["report", "1", "-o"])
        .arg(&out_html)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!dir.join("missing.db").exists(), "no database created");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runs_without_measurements_still_get_tables() {
    let dir = tmpdir("plain");
    let dbp = dir.join("r.db");
    let mut db = ResultsDb::open(&dbp).unwrap();
    let mut r = report(0, false);
    r.measurements.clear();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    db.store(&NewRun {
        kind: "lab",
        group_id: None,
        label: None,
        scenario_origin: Some("x.toml"),
        scenario_text: None,
        seed: 1,
        started_at: now,
        finished_at: now,
        report: &r,
    })
    .unwrap();
    drop(db);
    let html = dir.join("r.html");
    let out = iolab()
        .arg("--db")
        .arg(&dbp)
        .args(["report", "1", "-o"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(out.status.success());
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<svg").count(), 0);
    assert!(page.contains("No plots"));
    assert!(page.contains("strict_vs_off") && page.contains("x.toml"));
    let _ = std::fs::remove_dir_all(&dir);
}
