//! `iolab trace`: runs a workload scenario (a file or a bundled example) the way `iolab run`
//! does, with the engine's timeline
//! recorder on for the first simulations it creates, and writes the slices as Chrome /
//! Perfetto trace-event JSON (`{"traceEvents": [...], "displayTimeUnit": "ns"}`), loadable in
//! ui.perfetto.dev or chrome://tracing.
//!
//! Layout: for the k-th traced simulation, three processes: `sim k: CPUs` (a thread per
//! virtual CPU: spends named by their label or account, spinlock spins, command-queue
//! waits), `sim k: IOMMU` (the command consumer) and `sim k: devices` (a thread per device
//! queue with its in-flight I/Os). Slices are complete events (`ph: "X"`) with `ts` and
//! `dur` in microseconds written with three decimals, so virtual nanoseconds are exact.
//! Slices that overlap without nesting (in-flight I/Os on one queue) go on extra lanes:
//! threads named `<track> #2`, `#3` ...; every thread's slices nest or are disjoint.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use iolab_sim::lab::{self, LabOptions};
use iolab_sim::trace::{self, SimTrace, TraceEvent, TraceOptions, Track};

/// What `iolab trace` was asked for.
#[derive(Debug)]
pub struct TraceArgs {
    /// The scenario file (None: `example` names a bundled one).
    pub scenario: Option<PathBuf>,
    /// A bundled example workload scenario (`iolab run --example NAME`'s names).
    pub example: Option<String>,
    /// The JSON file to write.
    pub output: PathBuf,
    /// Base seed (None: the scenario's `seed` for a workload scenario, else 1).
    pub seed: Option<u64>,
    /// Slices kept per simulation (within the window).
    pub max_events: usize,
    /// Virtual-time window, ns: only slices overlapping `from_ns..to_ns` are kept.
    pub from_ns: u64,
    /// End of the window, ns (`u64::MAX`: the end of the run).
    pub to_ns: u64,
    /// Simulations traced.
    pub sims: usize,
}

/// Runs `iolab trace`: a workload scenario file or `--example NAME`, validated as `iolab run`
/// validates it (a file with a top-level `experiment` key is refused, saying what to run),
/// one repetition, with the recorder on.
pub fn run(args: &TraceArgs) -> ExitCode {
    let (text, origin) = match (&args.scenario, &args.example) {
        (Some(path), _) => {
            let origin = path.display().to_string();
            match std::fs::read_to_string(path) {
                Ok(t) => (t, origin),
                Err(e) => {
                    eprintln!("iolab trace: cannot read {origin}: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        (None, Some(name)) => match lab::examples::example(name) {
            Some(t) => (
                t.to_owned(),
                format!("scenarios/examples/{name}.toml (bundled)"),
            ),
            None => {
                eprintln!(
                    "iolab trace: unknown example '{name}': expected one of {}",
                    lab::examples::example_names().join(", ")
                );
                return ExitCode::from(2);
            }
        },
        (None, None) => {
            eprintln!("iolab trace: expected a scenario file or --example NAME");
            return ExitCode::from(2);
        }
    };
    if args.from_ns >= args.to_ns {
        eprintln!(
            "iolab trace: --from {} is not before --to {}: expected a window that ends after it starts",
            fmt_ns(args.from_ns),
            fmt_ns(args.to_ns)
        );
        return ExitCode::from(2);
    }
    let trace_options = TraceOptions {
        sims: args.sims,
        max_events: args.max_events,
        from_ns: args.from_ns,
        to_ns: args.to_ns,
    };
    // Validated completely before anything runs, as `iolab run` does.
    let scenario = match crate::reproduce::validate_workload(&text, &origin) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("iolab trace: {e}");
            return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
        }
    };
    let options = LabOptions {
        runs: 1,
        seed: args.seed,
    };
    let (result, traces) = trace::capture(trace_options, || lab::run(&scenario, &options));
    if let Err(e) = result {
        eprintln!("iolab trace: {origin}: {e}");
        return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
    }
    let what = format!("workload scenario {}", scenario.name);
    if traces.is_empty() {
        eprintln!(
            "iolab trace: {origin}: its {} workload on a {} device ({}) runs in a model \
             without the engine's timeline (the direct-DMA send and receive models of x86 NICs), so there \
             is nothing to record and nothing was written: expected a workload the engine \
             runs (fio, bonnie, reaim, dma_map_benchmark, or netperf on POWER)",
            scenario.workload.kind(),
            scenario.devices.kind(),
            scenario.profile.name
        );
        return ExitCode::from(2);
    }
    let json = to_json(&traces);
    if let Err(e) = write_file(&args.output, &json) {
        eprintln!("iolab trace: cannot write {}: {e}", args.output.display());
        return ExitCode::from(1);
    }
    let slices: usize = traces.iter().map(|t| t.events.len()).sum();
    let dropped: u64 = traces.iter().map(|t| t.dropped).sum();
    let windowed = args.from_ns > 0 || args.to_ns < u64::MAX;
    let window = if windowed {
        let outside: u64 = traces.iter().map(|t| t.outside).sum();
        let end = traces.iter().map(|t| t.end_ns).max().unwrap_or(0);
        let to = if args.to_ns == u64::MAX {
            "the end".to_owned()
        } else {
            fmt_ns(args.to_ns)
        };
        let mut w = format!(
            " between {} and {to} ({outside} outside not kept)",
            fmt_ns(args.from_ns)
        );
        if slices == 0 {
            let _ = write!(
                w,
                "; nothing in the window: the run ended at {}",
                fmt_ns(end)
            );
        }
        w
    } else {
        String::new()
    };
    eprintln!(
        "wrote {}: {slices} slices from {} simulation(s) of {what}{window}{}",
        args.output.display(),
        traces.len(),
        if dropped > 0 {
            format!(" ({dropped} more not kept: raise --max-events)")
        } else {
            String::new()
        }
    );
    ExitCode::SUCCESS
}

/// Parses a virtual time for `--from` / `--to`: a non-negative number with a unit, `ns`,
/// `us`, `ms` or `s` (`5ms`, `250us`, `1000ns`, `0.5s`), as whole nanoseconds.
///
/// # Errors
///
/// A message saying what was expected, for clap to print (exit code 2).
pub fn parse_virtual_time(text: &str) -> Result<u64, String> {
    let expected =
        "expected a virtual time: a number with a unit ns, us, ms or s (e.g. 5ms, 250us, 1000ns)";
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit: {expected}"))?;
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(format!("`{text}`: {expected}")),
    };
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return Err(format!("`{text}`: {expected}"));
    }
    let too_large = || format!("`{text}` is too large: at most {} ns", u64::MAX - 1);
    let ns = match num.split_once('.') {
        None => num
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .ok_or_else(too_large)?,
        Some((whole, frac)) => {
            let whole = whole
                .parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(scale))
                .ok_or_else(too_large)?;
            // The fraction, exact to the nanosecond or refused.
            let digits = scale.ilog10() as usize;
            if frac.len() > digits || frac.contains('.') {
                return Err(format!(
                    "`{text}`: expected at most {digits} decimals with {unit} (whole nanoseconds)"
                ));
            }
            let frac_ns: u64 = format!("{frac:0<digits$}")
                .parse()
                .map_err(|_| format!("`{text}`: {expected}"))?;
            whole.checked_add(frac_ns).ok_or_else(too_large)?
        }
    };
    if ns == u64::MAX {
        return Err(too_large());
    }
    Ok(ns)
}

/// Nanoseconds as the shortest of `ns`, `us`, `ms`, `s` that shows them exactly.
fn fmt_ns(ns: u64) -> String {
    for (scale, unit) in [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns >= scale && ns % scale == 0 {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

/// Microseconds with three decimals: exact for integer nanoseconds.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A JSON string literal.
fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".to_owned())
}

/// Orders track names so that `q2` comes before `q10`.
fn natural_key(s: &str) -> (String, u64, String) {
    let digits_at = s
        .char_indices()
        .find(|(_, c)| c.is_ascii_digit())
        .map(|(i, _)| i);
    match digits_at {
        Some(i) => {
            let rest = &s[i..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let n = rest[..end].parse().unwrap_or(u64::MAX);
            (s[..i].to_owned(), n, rest[end..].to_owned())
        }
        None => (s.to_owned(), 0, String::new()),
    }
}

/// Splits one track's slices into lanes in which every pair of slices nests or is disjoint.
/// Returns, per lane, the indices of its slices (into `events`).
fn lanes(events: &[&TraceEvent]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..events.len()).collect();
    // Start ascending; at equal starts the longer (enclosing) slice first.
    order.sort_by(|&a, &b| {
        let (x, y) = (events[a], events[b]);
        x.start_ns
            .cmp(&y.start_ns)
            .then(y.dur_ns.cmp(&x.dur_ns))
            .then(a.cmp(&b))
    });
    // Per lane: the stack of open slices' end times, and its members.
    let mut stacks: Vec<Vec<u64>> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let e = events[i];
        let end = e.start_ns + e.dur_ns;
        let mut placed = false;
        for (stack, m) in stacks.iter_mut().zip(members.iter_mut()) {
            while stack.last().is_some_and(|&top| top <= e.start_ns) {
                stack.pop();
            }
            if stack.last().map_or(true, |&top| end <= top) {
                stack.push(end);
                m.push(i);
                placed = true;
                break;
            }
        }
        if !placed {
            stacks.push(vec![end]);
            members.push(vec![i]);
        }
    }
    members
}

fn track_label(track: &Track) -> String {
    match track {
        Track::Cpu(c) => format!("cpu {c}"),
        Track::Iommu(n) | Track::Device(n) => n.to_string(),
    }
}

/// The traces as trace-event JSON; the same traces give the same bytes.
pub fn to_json(traces: &[SimTrace]) -> String {
    let mut out = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    let mut first = true;
    let mut push = |out: &mut String, line: String| {
        if !first {
            out.push_str(",\n");
        }
        first = false;
        out.push_str(&line);
    };
    let mut next_tid: u64 = 1;
    for t in traces {
        let k = t.index as u64;
        let sim = t.index + 1;
        let pids = [3 * k + 1, 3 * k + 2, 3 * k + 3];
        let dropped = if t.dropped > 0 {
            format!(" ({} slices not kept)", t.dropped)
        } else {
            String::new()
        };
        // Group slices by track; every CPU gets a track even if idle throughout.
        let mut by_track: BTreeMap<Track, Vec<&TraceEvent>> = BTreeMap::new();
        for cpu in 0..t.cpus as u32 {
            by_track.entry(Track::Cpu(cpu)).or_default();
        }
        for e in &t.events {
            by_track.entry(e.track.clone()).or_default().push(e);
        }
        let mut tracks: Vec<(Track, Vec<&TraceEvent>)> = by_track.into_iter().collect();
        tracks.sort_by_key(|(track, _)| match track {
            Track::Cpu(c) => (0u8, (String::new(), u64::from(*c), String::new())),
            Track::Iommu(n) => (1, natural_key(n)),
            Track::Device(n) => (2, natural_key(n)),
        });
        // Name the processes that have tracks (the CPUs always do).
        let has = |kind: u8| {
            tracks.iter().any(|(t, _)| {
                matches!(
                    (kind, t),
                    (0, Track::Cpu(_)) | (1, Track::Iommu(_)) | (2, Track::Device(_))
                )
            })
        };
        for (i, (pid, what)) in pids.iter().zip(["CPUs", "IOMMU", "devices"]).enumerate() {
            if !has(i as u8) {
                continue;
            }
            push(
                &mut out,
                format!(
                    "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":{}}}}}",
                    js(&format!("sim {sim}: {what}{dropped}"))
                ),
            );
            push(
                &mut out,
                format!(
                    "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{pid},\"tid\":0,\"args\":{{\"sort_index\":{}}}}}",
                    3 * k + i as u64
                ),
            );
        }
        for (sort, (track, events)) in tracks.iter().enumerate() {
            let pid = match track {
                Track::Cpu(_) => pids[0],
                Track::Iommu(_) => pids[1],
                Track::Device(_) => pids[2],
            };
            let label = track_label(track);
            let lane_list = if events.is_empty() {
                vec![Vec::new()]
            } else {
                lanes(events)
            };
            for (lane, members) in lane_list.iter().enumerate() {
                let tid = next_tid;
                next_tid += 1;
                let name = if lane == 0 {
                    label.clone()
                } else {
                    format!("{label} #{}", lane + 1)
                };
                push(
                    &mut out,
                    format!(
                        "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                        js(&name)
                    ),
                );
                push(
                    &mut out,
                    format!(
                        "{{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"sort_index\":{}}}}}",
                        sort * 1000 + lane
                    ),
                );
                let mut members = members.clone();
                members
                    .sort_by_key(|&i| (events[i].start_ns, std::cmp::Reverse(events[i].dur_ns), i));
                for i in members {
                    let e = events[i];
                    let mut line = format!(
                        "{{\"ph\":\"X\",\"name\":{},\"cat\":{},\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"dur\":{}",
                        js(&e.name),
                        js(match track {
                            Track::Cpu(_) => "cpu",
                            Track::Iommu(_) => "iommu",
                            Track::Device(_) => "device",
                        }),
                        us(e.start_ns),
                        us(e.dur_ns)
                    );
                    if !e.args.is_empty() {
                        line.push_str(",\"args\":{");
                        for (j, (key, value)) in e.args.iter().enumerate() {
                            if j > 0 {
                                line.push(',');
                            }
                            let _ = write!(line, "{}:{value}", js(key));
                        }
                        line.push('}');
                    }
                    line.push('}');
                    push(&mut out, line);
                }
            }
        }
    }
    out.push_str("\n]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(start: u64, dur: u64) -> TraceEvent {
        TraceEvent {
            track: Track::Device("q".into()),
            name: "io".into(),
            start_ns: start,
            dur_ns: dur,
            args: Vec::new(),
        }
    }

    #[test]
    fn virtual_times_read_with_their_units_exactly() {
        assert_eq!(parse_virtual_time("5ms"), Ok(5_000_000));
        assert_eq!(parse_virtual_time("250us"), Ok(250_000));
        assert_eq!(parse_virtual_time("1000ns"), Ok(1_000));
        assert_eq!(parse_virtual_time("2s"), Ok(2_000_000_000));
        assert_eq!(parse_virtual_time("0.5s"), Ok(500_000_000));
        assert_eq!(parse_virtual_time("1.25ms"), Ok(1_250_000));
        assert_eq!(parse_virtual_time("0ns"), Ok(0));
        for (bad, says) in [
            ("5", "no unit"),
            ("", "no unit"),
            ("5x", "expected a virtual time"),
            ("5 ms", "expected a virtual time"),
            ("-5ms", "expected a virtual time"),
            ("ms", "expected a virtual time"),
            (".5ms", "expected a virtual time"),
            ("1.5ns", "at most 0 decimals"),
            ("1.0000001ms", "at most 6 decimals"),
            ("99999999999999999999s", "too large"),
        ] {
            let e = parse_virtual_time(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(fmt_ns(5_000_000), "5ms");
        assert_eq!(fmt_ns(1_250_000), "1250us");
        assert_eq!(fmt_ns(7), "7ns");
    }

    #[test]
    fn overlapping_slices_get_lanes_nested_ones_do_not() {
        let evs = [ev(0, 100), ev(10, 20), ev(50, 100), ev(200, 5), ev(60, 10)];
        let refs: Vec<&TraceEvent> = evs.iter().collect();
        let l = lanes(&refs);
        // 0..100 holds 10..30 and 60..70 nested; 50..150 overlaps 0..100 without nesting ->
        // a second lane; 200..205 fits the first lane again (members in placement order).
        assert_eq!(l, vec![vec![0, 1, 4, 3], vec![2]]);
    }

    #[test]
    fn microseconds_are_exact() {
        assert_eq!(us(0), "0.000");
        assert_eq!(us(1), "0.001");
        assert_eq!(us(123_456_789), "123456.789");
    }

    #[test]
    fn natural_order_of_queue_names() {
        let mut v = vec!["nvme q10", "nvme q2", "nvme q1", "cmdq"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["cmdq", "nvme q1", "nvme q2", "nvme q10"]);
    }
}
