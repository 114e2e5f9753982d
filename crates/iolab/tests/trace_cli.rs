//! `iolab trace` on the bundled experiment scenarios, the cells of experiment files (written
//! by `iolab reproduce --emit-scenarios`) and workload scenarios (files and
//! `--example NAME`): the trace-event JSON is checked
//! strictly in Rust (shape, metadata, per-thread nesting, expected tracks and slice names)
//! and, where python3 with the `perfetto` package and its trace processor are available,
//! loaded by Perfetto's own trace processor (tests/perfetto/check_trace.py).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn iolab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iolab"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("iolab-trace-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn trace(scenario: &str, out: &Path, extra: &[&str]) -> String {
    let mut cmd = iolab();
    cmd.arg("trace");
    match scenario.strip_prefix("--example=") {
        Some(name) => cmd.args(["--example", name]),
        None => cmd.arg(repo().join("scenarios").join(scenario)),
    };
    let o = cmd.arg("-o").arg(out).args(extra).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{scenario}: {err}");
    err
}

/// Writes the cells of bundled experiment file `name` under `dir` (`iolab reproduce NAME
/// --emit-scenarios DIR`) and gives the path of cell `cell`'s scenario.
fn emitted_cell(dir: &Path, name: &str, cell: &str) -> PathBuf {
    let o = iolab()
        .args(["--no-db", "reproduce", name, "--emit-scenarios"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let path = dir.join(name).join(format!("{cell}.toml"));
    assert!(path.is_file(), "{} was not written", path.display());
    path
}

/// Microseconds with three decimals back to integer nanoseconds.
fn ns(v: &Value, what: &str) -> u64 {
    let f = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"));
    assert!(f >= 0.0, "{what}: negative: {f}");
    (f * 1000.0).round() as u64
}

/// A slice on one thread: start ns, duration ns, name.
type Slice = (u64, u64, String);

/// What a trace holds, after every structural check passed.
#[derive(Debug, Default)]
struct Summary {
    /// Process name by pid.
    processes: BTreeMap<u64, String>,
    /// Thread name by (pid, tid).
    threads: BTreeMap<(u64, u64), String>,
    /// Slice count by (process name, thread name, slice name).
    slices: BTreeMap<(String, String, String), usize>,
    total: usize,
}

impl Summary {
    fn names_on(&self, process_prefix: &str) -> BTreeSet<String> {
        self.slices
            .keys()
            .filter(|(p, _, _)| p.starts_with(process_prefix))
            .map(|(_, _, n)| n.clone())
            .collect()
    }

    fn threads_of(&self, process_prefix: &str) -> Vec<String> {
        self.threads
            .iter()
            .filter(|((pid, _), _)| self.processes[pid].starts_with(process_prefix))
            .map(|(_, t)| t.clone())
            .collect()
    }
}

/// The strict structural check: the Trace Event Format's JSON object form with complete
/// (`X`) and metadata (`M`) events only; every thread and process used is named; on every
/// thread the slices nest or are disjoint (as Perfetto's importer requires).
fn check(text: &str) -> Summary {
    // Timestamps are written with exactly three decimals (exact nanoseconds).
    for line in text.lines().filter(|l| l.contains("\"ph\":\"X\"")) {
        for key in ["\"ts\":", "\"dur\":"] {
            let v = line.split(key).nth(1).unwrap();
            let v: String = v
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let (_, frac) = v
                .split_once('.')
                .unwrap_or_else(|| panic!("{key} {v}: no fraction"));
            assert_eq!(frac.len(), 3, "{line}");
        }
    }
    let doc: Value = serde_json::from_str(text).expect("valid JSON");
    let obj = doc.as_object().expect("a JSON object");
    assert_eq!(obj["displayTimeUnit"], "ns");
    let events = obj["traceEvents"].as_array().expect("traceEvents array");
    let mut s = Summary::default();
    let mut per_thread: BTreeMap<(u64, u64), Vec<Slice>> = BTreeMap::new();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        let pid = e["pid"].as_u64().expect("pid");
        let tid = e["tid"].as_u64().expect("tid");
        let name = e["name"].as_str().expect("name").to_owned();
        match ph {
            "M" => {
                let arg = &e["args"];
                match name.as_str() {
                    "process_name" => {
                        let n = arg["name"].as_str().expect("process name");
                        assert!(
                            s.processes.insert(pid, n.to_owned()).is_none(),
                            "pid {pid} named twice"
                        );
                    }
                    "thread_name" => {
                        let n = arg["name"].as_str().expect("thread name");
                        assert!(
                            s.threads.insert((pid, tid), n.to_owned()).is_none(),
                            "tid {tid} named twice"
                        );
                    }
                    "process_sort_index" | "thread_sort_index" => {
                        assert!(arg["sort_index"].is_u64());
                    }
                    other => panic!("unexpected metadata {other}"),
                }
            }
            "X" => {
                let ts = ns(&e["ts"], "ts");
                let dur = ns(&e["dur"], "dur");
                assert!(!name.is_empty());
                assert!(e["cat"].is_string());
                if let Some(args) = e.get("args") {
                    assert!(args.as_object().unwrap().values().all(Value::is_u64));
                }
                per_thread
                    .entry((pid, tid))
                    .or_default()
                    .push((ts, dur, name));
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    for ((pid, tid), mut slices) in per_thread {
        let process = s
            .processes
            .get(&pid)
            .unwrap_or_else(|| panic!("pid {pid} has no process_name"))
            .clone();
        let thread = s
            .threads
            .get(&(pid, tid))
            .unwrap_or_else(|| panic!("tid {tid} has no thread_name"))
            .clone();
        slices.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut open: Vec<u64> = Vec::new();
        for (ts, dur, name) in slices {
            while open.last().is_some_and(|&end| end <= ts) {
                open.pop();
            }
            if let Some(&end) = open.last() {
                assert!(
                    ts + dur <= end,
                    "{process}/{thread}: {name} at {ts}+{dur} overlaps an enclosing slice ending at {end}"
                );
            }
            open.push(ts + dur);
            *s.slices
                .entry((process.clone(), thread.clone(), name))
                .or_default() += 1;
            s.total += 1;
        }
    }
    s
}

#[test]
fn smmuv3_trace_has_cpu_iommu_and_device_tracks() {
    let dir = tmpdir("smmuv3");
    let out = dir.join("t.json");
    // The smmuv3-cmdq experiment's first cell: the SAS array with the spinlock command
    // queue on 64 CPUs (an absolute path: `trace` joins it unchanged).
    let cell = emitted_cell(&dir, "smmuv3-cmdq", "d05_sas8.spinlock");
    let err = trace(cell.to_str().unwrap(), &out, &["--max-events", "30000"]);
    assert!(err.contains("raise --max-events"), "the cap was hit: {err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let s = check(&text);
    assert_eq!(s.total, 30_000, "exactly the cap is kept");
    let cpus = s.threads_of("sim 1: CPUs");
    assert_eq!(cpus.len(), 64, "a track per CPU");
    assert!(cpus.contains(&"cpu 63".to_owned()));
    let names = s.names_on("sim 1: CPUs");
    for n in [
        "dma map + driver submit",
        "dma unmap",
        "cmdq issue",
        "cmdq sync wait",
        "system",
        "user",
    ] {
        assert!(names.contains(n), "CPU slices lack {n}: {names:?}");
    }
    assert_eq!(s.threads_of("sim 1: IOMMU"), vec!["cmdq consumer"]);
    assert_eq!(
        s.names_on("sim 1: IOMMU"),
        BTreeSet::from(["consume".to_owned()])
    );
    let queues = s.threads_of("sim 1: devices");
    assert!(
        queues.iter().any(|q| q.starts_with("sas0 cq")),
        "{queues:?}"
    );
    assert_eq!(
        s.names_on("sim 1: devices"),
        BTreeSet::from(["read".to_owned()])
    );
    // Every command-queue issue encloses its sync wait on the same CPU: as many of each.
    let count = |name: &str| -> usize {
        s.slices
            .iter()
            .filter(|((_, _, n), _)| n == name)
            .map(|(_, c)| c)
            .sum()
    };
    assert!(count("cmdq issue") > 100);
    assert!(count("cmdq sync wait") >= count("cmdq issue") - 64);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_bundled_scenario_traces_with_its_dma_path_visible() {
    let dir = tmpdir("all");
    // (scenario, simulations, a slice name expected on the CPU tracks)
    for (scenario, sims, expect, queue) in [
        (
            "experiments/ipmmu-usb/superspeed.iommu.toml",
            "1",
            "dma map_sg",
            "usb bot",
        ),
        // sba-vmerge runs from its experiment file: its novmerge cell is a lab scenario.
        (
            "experiments/sba-vmerge/novmerge.toml",
            "1",
            "dma unmap_sg",
            "scsi hba",
        ),
        // pseries-ddw likewise: its 64-thread write through the default window.
        (
            "experiments/pseries-ddw/64t.write.default.toml",
            "1",
            "spin phyp_tce_table",
            "nic tx q0",
        ),
    ] {
        let out = dir.join(scenario.replace(".toml", ".json").replace('/', "_"));
        trace(scenario, &out, &["--sims", sims, "--max-events", "20000"]);
        let s = check(&std::fs::read_to_string(&out).unwrap());
        let sims: usize = sims.parse().unwrap();
        let cpu_processes = s
            .processes
            .values()
            .filter(|p| p.contains(": CPUs"))
            .count();
        assert_eq!(cpu_processes, sims, "{scenario}");
        assert!(s.total <= 20_000 * sims, "{scenario}: the cap holds");
        let names: BTreeSet<String> = s.slices.keys().map(|k| k.2.clone()).collect();
        assert!(names.contains(expect), "{scenario}: {names:?}");
        let queues = s.threads_of("sim 1: devices");
        assert!(queues.contains(&queue.to_owned()), "{scenario}: {queues:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// How many slices named `name` lie on threads of processes starting with `process`.
fn count(s: &Summary, process: &str, name: &str) -> usize {
    s.slices
        .iter()
        .filter(|((p, _, n), _)| p.starts_with(process) && n == name)
        .map(|(_, c)| c)
        .sum()
}

#[test]
fn nvme_workload_scenario_shows_map_unmap_cmdq_waits_and_its_queues() {
    let dir = tmpdir("nvme");
    let out = dir.join("t.json");
    let err = trace(
        "examples/fio-nvme-strict.toml",
        &out,
        &["--max-events", "40000"],
    );
    assert!(err.contains("workload scenario fio-nvme-strict"), "{err}");
    let s = check(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(s.total, 40_000);
    // A track per CPU of the scenario's machine (32), busy or not.
    assert_eq!(s.threads_of("sim 1: CPUs").len(), 32);
    for name in [
        "dma map",
        "dma map + driver submit",
        "dma unmap",
        "cmdq issue",
        "cmdq sync wait",
        "user",
        "system",
    ] {
        assert!(count(&s, "sim 1: CPUs", name) > 0, "no {name} on the CPUs");
    }
    // Each map is drawn inside its submit spend; an unmap of a strict domain is followed by
    // a command-queue issue, unless another CPU's issue took its commands along, or the
    // issue ended past the cap (slices are kept as they end).
    assert_eq!(
        count(&s, "sim 1: CPUs", "dma map"),
        count(&s, "sim 1: CPUs", "dma map + driver submit")
    );
    let (unmaps, issues) = (
        count(&s, "sim 1: CPUs", "dma unmap"),
        count(&s, "sim 1: CPUs", "cmdq issue"),
    );
    assert!(
        issues * 10 >= unmaps * 9 && issues <= unmaps,
        "{unmaps} {issues}"
    );
    assert_eq!(s.threads_of("sim 1: IOMMU"), vec!["cmdq consumer"]);
    // The NVMe queues (one per fio job's CPU: 16), with their in-flight reads on lanes.
    let queues: BTreeSet<String> = s
        .threads_of("sim 1: devices")
        .iter()
        .map(|t| t.split(" #").next().unwrap().to_owned())
        .collect();
    assert_eq!(queues.len(), 16, "{queues:?}");
    assert!(
        queues.iter().all(|q| q.starts_with("nvme0 q")),
        "{queues:?}"
    );
    assert!(count(&s, "sim 1: devices", "read") > 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bundled_examples_trace_by_name_with_their_dma_paths_and_devices() {
    let dir = tmpdir("examples");
    // (example, CPU slice names expected, a device queue expected)
    for (example, names, queue) in [
        (
            "netperf-pseries-ddw",
            &["dma map", "dma unmap", "spin phyp_tce_table"][..],
            "nic tx q0",
        ),
        (
            "bonnie-usb-ipmmu",
            &["dma map_sg", "irq: dma unmap_sg"][..],
            "usb bot",
        ),
        ("fio-sas-sba", &["dma map", "dma unmap"][..], "sas0 cq0"),
        (
            "fio-sas-spinlock",
            &["dma map", "dma unmap", "cmdq issue", "cmdq sync wait"][..],
            "sas0 cq0",
        ),
    ] {
        let out = dir.join(format!("{example}.json"));
        let err = trace(
            &format!("--example={example}"),
            &out,
            &["--max-events", "20000"],
        );
        assert!(err.contains(example), "{err}");
        let s = check(&std::fs::read_to_string(&out).unwrap());
        for name in names {
            assert!(
                count(&s, "sim 1: CPUs", name) > 0,
                "{example}: no {name}: {:?}",
                s.names_on("sim 1: CPUs")
            );
        }
        let queues = s.threads_of("sim 1: devices");
        assert!(queues.contains(&queue.to_owned()), "{example}: {queues:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn same_seed_same_bytes_and_the_seed_matters() {
    let dir = tmpdir("det");
    let (a, b, c) = (dir.join("a.json"), dir.join("b.json"), dir.join("c.json"));
    let scenario = "experiments/sba-vmerge/novmerge.toml";
    trace(scenario, &a, &["--max-events", "5000"]);
    trace(scenario, &b, &["--max-events", "5000"]);
    trace(scenario, &c, &["--max-events", "5000", "--seed", "2"]);
    let (a, b, c) = (
        std::fs::read(a).unwrap(),
        std::fs::read(b).unwrap(),
        std::fs::read(c).unwrap(),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_scenarios_are_refused_with_exit_code_2() {
    let dir = tmpdir("bad");
    let not_exp = dir.join("x.toml");
    std::fs::write(&not_exp, "experiment = \"nope\"\n").unwrap();
    let broken = dir.join("y.toml");
    std::fs::write(&broken, "experiment = \n").unwrap();
    let bad_workload = dir.join("w.toml");
    std::fs::write(
        &bad_workload,
        std::fs::read_to_string(repo().join("scenarios/examples/fio-nvme-strict.toml"))
            .unwrap()
            .replace("iodepth = 32", "iodepth = \"deep\""),
    )
    .unwrap();
    for (args, expect) in [
        (vec![dir.join("missing.toml")], "cannot read"),
        (vec![not_exp], "experiment"),
        (vec![broken], "y.toml"),
        (vec![bad_workload], "iodepth"),
        (
            vec!["--example".into(), "no-such-example".into()],
            "fio-nvme-strict",
        ),
    ] {
        let path = args.last().unwrap().clone();
        let out = iolab()
            .arg("trace")
            .args(&args)
            .arg("-o")
            .arg(dir.join("t.json"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", path.display());
        assert!(err.contains(expect), "{err}");
        assert!(!dir.join("t.json").exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Loads a trace with Perfetto's trace processor through tests/perfetto/check_trace.py when
/// python3, the `perfetto` package and a trace processor are available; says why not
/// otherwise.
#[test]
fn perfetto_trace_processor_loads_the_trace() {
    let script = repo().join("tests/perfetto/check_trace.py");
    let probe = Command::new("python3").arg(&script).arg("--probe").output();
    let probe = match probe {
        Ok(p) => p,
        Err(e) => {
            println!("skipped: python3 is not available ({e})");
            return;
        }
    };
    if !probe.status.success() {
        println!(
            "skipped: {}",
            String::from_utf8_lossy(&probe.stdout).trim().to_owned()
                + String::from_utf8_lossy(&probe.stderr).trim()
        );
        return;
    }
    let dir = tmpdir("perfetto");
    println!("{}", String::from_utf8_lossy(&probe.stdout).trim());
    // An experiment and a workload scenario; the trace processor must find every slice,
    // the named slices and the queue tracks.
    let cell = emitted_cell(&dir, "smmuv3-cmdq", "d05_sas8.spinlock");
    for (scenario, names, threads) in [
        (
            cell.to_str().unwrap(),
            "dma unmap,cmdq issue,cmdq sync wait",
            &["cpu 0", "cmdq consumer", "sas0 cq0"][..],
        ),
        (
            "examples/fio-nvme-strict.toml",
            "dma map,dma map + driver submit,dma unmap,cmdq issue,cmdq sync wait",
            &["cpu 0", "cmdq consumer", "nvme0 q0"][..],
        ),
    ] {
        let out = dir.join("t.json");
        trace(scenario, &out, &["--max-events", "10000"]);
        let s = check(&std::fs::read_to_string(&out).unwrap());
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .arg(&out)
            .args(["--expect-slices", &s.total.to_string()])
            .args(["--expect-names", names]);
        for t in threads {
            cmd.args(["--expect-thread", t]);
        }
        let o = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{scenario}: {stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        println!("{scenario}:\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every complete slice of a trace file: (ts ns, dur ns).
fn slices_of(path: &Path) -> Vec<(u64, u64)> {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| (ns(&e["ts"], "ts"), ns(&e["dur"], "dur")))
        .collect()
}

#[test]
fn a_virtual_time_window_keeps_the_slices_that_overlap_it() {
    let dir = tmpdir("window");
    let (all, win) = (dir.join("all.json"), dir.join("win.json"));
    let scenario = "--example=fio-nvme-strict";
    trace(scenario, &all, &["--max-events", "2000000"]);
    // fio-nvme-strict ramps for 5 ms and measures 20 ms: a window in steady state.
    let (from, to) = (10_000_000u64, 10_250_000u64);
    let err = trace(scenario, &win, &["--from", "10ms", "--to", "10250us"]);
    assert!(err.contains("between 10ms and 10250us"), "{err}");
    let inside = |&(ts, dur): &(u64, u64)| ts < to && (ts + dur > from || (dur == 0 && ts >= from));
    let want: Vec<(u64, u64)> = slices_of(&all).into_iter().filter(inside).collect();
    let got = slices_of(&win);
    assert!(!got.is_empty());
    assert!(
        got.iter().all(inside),
        "a slice outside the window was kept"
    );
    let (mut got_sorted, mut want_sorted) = (got.clone(), want);
    got_sorted.sort_unstable();
    want_sorted.sort_unstable();
    assert_eq!(got_sorted, want_sorted, "every slice in the window is kept");
    check(&std::fs::read_to_string(&win).unwrap());
    // The cap counts within the window.
    let capped = dir.join("capped.json");
    let err = trace(
        scenario,
        &capped,
        &["--from", "10ms", "--to", "10250us", "--max-events", "10"],
    );
    assert_eq!(slices_of(&capped).len(), 10);
    assert!(err.contains("raise --max-events"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_windows_are_refused_with_exit_code_2() {
    let dir = tmpdir("badwindow");
    let out = dir.join("t.json");
    for (args, says) in [
        (vec!["--from", "5"], "no unit"),
        (vec!["--to", "3xs"], "expected a virtual time"),
        (
            vec!["--from", "2ms", "--to", "1ms"],
            "--from 2ms is not before --to 1ms",
        ),
        (vec!["--from", "1ms", "--to", "1ms"], "is not before"),
    ] {
        let o = iolab()
            .args(["trace", "--example", "fio-nvme-strict", "-o"])
            .arg(&out)
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote a trace");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_workload_without_an_engine_timeline_is_refused_and_nothing_is_written() {
    let dir = tmpdir("trace-rx-stream");
    // An x86 NIC receive stream (the fands-iotlb experiment's cell): the receive-stream
    // model runs no engine simulation.
    let cells = dir.join("cells");
    let out = iolab()
        .args(["--no-db", "reproduce", "fands-iotlb", "--emit-scenarios"])
        .arg(&cells)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = dir.join("t.json");
    let out = iolab()
        .arg("trace")
        .arg(cells.join("fands-iotlb/f10.off.toml"))
        .arg("-o")
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("netperf workload") && err.contains("nothing was written"),
        "{err}"
    );
    assert!(!trace.exists());
    // The x86 NIC's send test runs outside the engine too.
    let out = iolab()
        .args(["trace", "--example", "netperf-tx-vtd-strict", "-o"])
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("send and receive models"), "{err}");
    assert!(!trace.exists());
}
