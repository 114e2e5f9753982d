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

    // Plots: 1 scaling (IOPS vs threads, one experiment) + a latency plot per thread count
    // (a CDF per IOMMU mode, the 3 runs' histograms merged) + one CPU plot (a bar per mode
    // and thread count, the 3 runs averaged).
    let svgs = html.matches("<svg").count();
    assert_eq!(svgs, 1 + 4 + 1, "svg elements in the page");
    let mut files: Vec<String> = std::fs::read_dir(&svg_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), svgs);
    assert!(files.contains(&"scaling-demo-scaling-threads-iops.svg".to_owned()));
    assert!(files.contains(&"cpu-demo-scaling.svg".to_owned()));
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
    // The CPU plot: the four parts in the legend and a bar per (mode, threads), averaged.
    let cpu = svg_texts(&std::fs::read_to_string(svg_dir.join("cpu-demo-scaling.svg")).unwrap());
    for label in [
        "user",
        "system",
        "spin",
        "idle",
        "lazy, threads=8",
        "off, threads=1",
    ] {
        assert!(
            cpu.iter().any(|t| t == label),
            "cpu plot lacks {label}: {cpu:?}"
        );
    }
    assert!(cpu.iter().any(|t| t.ends_with("CPU time (mean of 3 runs)")));
    let bars = cpu.iter().filter(|t| t.contains(", threads=")).count();
    assert_eq!(bars, 12, "a labelled row per bar, no empty row: {cpu:?}");
    assert!(
        !cpu.iter().any(|t| t.contains("odd")),
        "a configuration without CPU time has no bar"
    );
    // A latency plot: a CDF per mode, each of the 3 runs' 200 samples merged.
    let lat = svg_texts(
        &std::fs::read_to_string(svg_dir.join("latency-demo-scaling-threads1.svg")).unwrap(),
    );
    for mode in MODES {
        assert!(
            lat.iter()
                .any(|t| t.starts_with(&format!("{mode}: 600 samples, p50 "))),
            "latency legend lacks {mode}: {lat:?}"
        );
    }
    assert!(lat.iter().any(|t| t == "CDF: fraction of I/Os ≤ x"));
    assert!(lat.iter().any(|t| t == "% of I/Os per bucket"));

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

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Real lab data: the bundled fio-nvme-{off,lazy,strict} examples at two `numjobs`, each
/// run with `--runs 2` (stored as groups), then `iolab report` on every run: one scaling
/// plot with exactly a series per IOMMU mode against threads, a latency plot per thread
/// count with a CDF per mode, one CPU plot with a bar per (mode, threads).
#[test]
fn report_of_workload_scenario_runs_across_iommu_modes_and_numjobs() {
    let dir = tmpdir("lab");
    let dbp = dir.join("lab.db");
    let mut ids = 0;
    for mode in ["off", "lazy", "strict"] {
        let text = std::fs::read_to_string(
            repo().join(format!("scenarios/examples/fio-nvme-{mode}.toml")),
        )
        .unwrap();
        for jobs in [1, 4] {
            let scenario = dir.join(format!("{mode}-j{jobs}.toml"));
            let lines: Vec<String> = text
                .lines()
                .map(|l| match l.split(" = ").next() {
                    Some("numjobs") => format!("numjobs = {jobs}"),
                    Some("iodepth") => "iodepth = 8".to_owned(),
                    Some("runtime_ms") => "runtime_ms = 2".to_owned(),
                    Some("ramp_ms") => "ramp_ms = 1".to_owned(),
                    _ => l.to_owned(),
                })
                .collect();
            std::fs::write(&scenario, lines.join("\n")).unwrap();
            let o = iolab()
                .arg("--db")
                .arg(&dbp)
                .arg("run")
                .arg(&scenario)
                .args(["--runs", "2"])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            ids += 2;
        }
    }
    let html = dir.join("r.html");
    let svg = dir.join("svg");
    let o = iolab()
        .arg("--db")
        .arg(&dbp)
        .arg("report")
        .arg(
            (1..=ids)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        )
        .arg("-o")
        .arg(&html)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("iolab report: runs 1-12"), "ids as a range");
    let mut files: Vec<String> = std::fs::read_dir(&svg)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let family = "fio_randread_bs_4096_on_nvme__hisilicon-d06_";
    assert_eq!(
        files,
        [
            format!("cpu-{family}.svg"),
            format!("latency-{family}-threads1.svg"),
            format!("latency-{family}-threads4.svg"),
            format!("scaling-{family}-threads-iops.svg"),
        ]
    );
    let texts = |f: &str| svg_texts(&std::fs::read_to_string(svg.join(f)).unwrap());
    // Scaling: exactly three series, named by mode (the cmdq and model attributes that
    // come with a mode and the scenario names that come with numjobs split nothing).
    let scaling = texts(&format!("scaling-{family}-threads-iops.svg"));
    for t in ["off", "lazy", "strict", "threads", "IOPS"] {
        assert!(scaling.iter().any(|x| x == t), "{t}: {scaling:?}");
    }
    assert!(
        !scaling
            .iter()
            .any(|x| x.contains('=') && !x.contains("IOPS vs threads")),
        "no attribute=value series: {scaling:?}"
    );
    // threads are whole numbers: no 0.5 or 1.5 on the axis.
    assert!(!scaling.iter().any(|x| x.ends_with(".50")), "{scaling:?}");
    assert!(scaling.iter().any(|x| x.ends_with("(mean of 2 runs)")));
    let polylines = std::fs::read_to_string(svg.join(format!("scaling-{family}-threads-iops.svg")))
        .unwrap()
        .split("<polyline")
        .skip(1)
        .filter(|p| p.split('>').next().unwrap().contains("stroke-width=\"2\""))
        .count();
    assert_eq!(polylines, 6, "a line and a legend mark per mode");
    // Latency at numjobs=4: a CDF per mode, in mode order.
    let lat = texts(&format!("latency-{family}-threads4.svg"));
    let legend: Vec<&String> = lat
        .iter()
        .filter(|t| t.contains(" samples, p50 "))
        .collect();
    assert_eq!(legend.len(), 3, "{lat:?}");
    for (line, mode) in legend.iter().zip(["off", "lazy", "strict"]) {
        assert!(line.starts_with(&format!("{mode}: ")), "{line}");
    }
    // CPU: 6 rows, each labelled once.
    let cpu = texts(&format!("cpu-{family}.svg"));
    let rows: Vec<&String> = cpu.iter().filter(|t| t.contains(", threads=")).collect();
    assert_eq!(rows.len(), 6, "{cpu:?}");
    assert_eq!(rows[0], "off, threads=1");
    assert_eq!(rows[5], "strict, threads=4");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_imported_real_run_plots_beside_the_lab_run_of_its_workload() {
    let dir = std::env::temp_dir().join(format!("iolab-report-import-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("r.db");
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fio-randread-grouped.jsonplus.json");
    // The lab twin of the real job: randread, 4 KiB, 2 jobs at iodepth 8.
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/examples/fio-nvme-strict.toml"),
    )
    .unwrap()
    .replace("iodepth = 32", "iodepth = 8")
    .replace("numjobs = 16", "numjobs = 2");
    let scenario = dir.join("twin.toml");
    std::fs::write(&scenario, example).unwrap();
    let run = |args: &[&str]| {
        let out = iolab().arg("--db").arg(&db).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["import", "fio", data.to_str().unwrap()]);
    run(&["run", scenario.to_str().unwrap()]);
    let svg = dir.join("svg");
    run(&[
        "report",
        "1-2",
        "-o",
        dir.join("r.html").to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let latency: Vec<String> = std::fs::read_dir(&svg)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("latency-")
        })
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    // One latency plot for the workload, with the lab's line and the real run's, named
    // after its source.
    assert_eq!(latency.len(), 1);
    assert!(
        latency[0].contains("real: fio-randread-grouped.jsonplus.json"),
        "the imported run is not on the lab's latency plot"
    );
    assert!(latency[0].contains("strict"), "the lab's line is missing");
}
