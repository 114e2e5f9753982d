//! `iolab calibrate`: measures the stack's native step costs on this host and writes a
//! platform profile named `host` (the schema of `scenarios/platforms/*.toml`).
//!
//! Each measured cost is a median ns per operation from the bench harness, divided by the
//! exact work the stack counted for that operation (the `WorkRecord` of an untimed pass of
//! the same operation), after subtracting the work of other kinds already measured (for
//! example the locks an allocator takes). What a host cannot measure (the IOMMU hardware's
//! table-walk reads and command consumption, MMIO, a hypervisor, cross-core transfers on a
//! loaded machine) and the steps not isolated here are copied from a bundled profile, their
//! sources prefixed `copied from <profile>:`; copied cycle counts are converted to ns at that
//! profile's clock, so the host's clock does not re-scale them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use iolab_iommu::addr::SZ_4K;
use iolab_sim::cost::PlatformProfile;

use crate::bench::harness::{median_ns_per_op, Sampling};
use crate::bench::iolab_side;

/// The bundled profile the unmeasurable values are copied from by default.
pub const DEFAULT_BASE: &str = "hisilicon-d05";

/// Errors of `iolab calibrate`.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// The base profile does not exist or does not load.
    #[error("base profile: {0}")]
    Base(String),
    /// A measurement could not be taken (an operation failed).
    #[error("measurement {what} failed: {why}")]
    Measure {
        /// What was being measured.
        what: &'static str,
        /// Why it failed.
        why: String,
    },
}

/// One measured cost: ns and how it was obtained.
#[derive(Debug, Clone)]
struct Measured {
    ns: f64,
    how: String,
}

/// The host's CPU model (`model name` in /proc/cpuinfo, or `CPU part`/`Hardware` on Arm)
/// and clock (`cpu MHz`), if readable.
fn host_cpu() -> (String, Option<f64>) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let model = field("model name")
        .or_else(|| field("Hardware"))
        .or_else(|| field("CPU part").map(|p| format!("CPU part {p}")))
        .unwrap_or_else(|| "an unidentified CPU".into());
    let mhz = field("cpu MHz").and_then(|v| v.parse::<f64>().ok());
    (
        model,
        mhz.filter(|m| m.is_finite() && *m > 0.0).map(|m| m / 1e3),
    )
}

/// The value of `key` in a bench figure's work-per-op list (0 if absent).
fn work(w: &[(String, f64)], key: &str) -> f64 {
    w.iter().find(|(k, _)| k == key).map_or(0.0, |(_, v)| *v)
}

/// Lock acquisitions per op in a bench figure's work list.
fn locks(w: &[(String, f64)]) -> f64 {
    w.iter()
        .filter(|(k, _)| k.starts_with("lock."))
        .map(|(_, v)| v)
        .sum()
}

/// `(ns - known) / units`, where `known` is what other, separately measured steps account for;
/// if that leaves nothing (the other steps' medians already exceed the total), the plain
/// quotient `ns / units` is used and the description says so.
fn residual(ns: f64, known: f64, units: f64, what: &str) -> (f64, String) {
    if units <= 0.0 {
        return (ns, format!("{what}: no units counted, whole operation"));
    }
    let r = ns - known;
    if known <= 0.0 {
        (
            ns / units,
            format!("{what}: {ns:.1} ns per operation over {units:.2} counted units"),
        )
    } else if r > 0.0 {
        (
            r / units,
            format!(
                "{what}: {ns:.1} ns per operation, minus {known:.1} ns of separately measured steps, over {units:.2} counted units"
            ),
        )
    } else {
        (
            ns / units,
            format!("{what}: {ns:.1} ns per operation over {units:.2} counted units (other steps not subtracted: they exceed the total)"),
        )
    }
}

fn find<'a>(
    figs: &'a [iolab_side::Figure],
    name: &'static str,
    what: &'static str,
) -> Result<&'a iolab_side::Figure, CalibrateError> {
    figs.iter()
        .find(|f| f.0 == name)
        .ok_or_else(|| CalibrateError::Measure {
            what,
            why: format!("the bench produced no `{name}` figure"),
        })
}

/// Takes every measurement. Keys are profile cost paths (`cpu.pte_write`, ...) or
/// `memory.memcpy_bandwidth` (GB/s in `ns`).
fn measure(sampling: &Sampling) -> Result<BTreeMap<&'static str, Measured>, CalibrateError> {
    let mut m = BTreeMap::new();

    // Atomic RMW on an owned line.
    let counter = AtomicU64::new(0);
    let ns = median_ns_per_op(sampling, |i| {
        counter.fetch_add(std::hint::black_box(i) | 1, Ordering::SeqCst);
    });
    m.insert(
        "sync.atomic_rmw",
        Measured {
            ns,
            how: "AtomicU64::fetch_add (SeqCst) on a line owned by the thread".into(),
        },
    );

    // Uncontended lock: acquire, touch the data, release.
    let lock = parking_lot::Mutex::new(0u64);
    let ns = median_ns_per_op(sampling, |i| {
        *lock.lock() += std::hint::black_box(i);
    });
    m.insert(
        "sync.lock_acquire_release",
        Measured {
            ns,
            how: "parking_lot::Mutex lock, increment, unlock, uncontended (the lock type of the iolab-iommu crate)"
                .into(),
        },
    );
    let lock_ns = ns;

    // Page-table entry reads: a software walk of a 4-level LPAE table.
    let tr = iolab_side::translate(sampling);
    let (_, walk_ns, walk_work) = find(&tr, "lpae-4k-walk", "LPAE walk")?;
    let reads = work(walk_work, "pte_reads");
    let (pte_read, how) = residual(
        *walk_ns,
        locks(walk_work) * lock_ns,
        reads,
        "LPAE 4 KiB software walk (translate), per PTE read",
    );
    m.insert("cpu.pte_read", Measured { ns: pte_read, how });

    // PTE writes and clears: map + unmap of one 4 KiB page (steady state, tables kept).
    let pg = iolab_side::pgtable_map_unmap(SZ_4K, sampling, &|f| f == "lpae-4k");
    let (_, mu_ns, mu_work) = find(&pg, "lpae-4k", "LPAE map/unmap")?;
    let units = work(mu_work, "ptes_written") + work(mu_work, "ptes_cleared");
    let known = work(mu_work, "pte_reads") * pte_read + locks(mu_work) * lock_ns;
    let (pte, how) = residual(
        *mu_ns,
        known,
        units,
        "LPAE 4 KiB map+unmap, per PTE written or cleared (the two are not separated: both get this value)",
    );
    m.insert(
        "cpu.pte_write",
        Measured {
            ns: pte,
            how: how.clone(),
        },
    );
    m.insert("cpu.pte_clear", Measured { ns: pte, how });

    // IOVA tree: alloc+free churn with 10,000 live allocations, per node visited or rotated.
    let live = iolab_side::iova_alloc_free(10_000, sampling, &|a| a == "linux", Vec::new).0;
    let (_, tree_ns, tree_work) = find(&live, "linux", "IOVA tree churn")?;
    let units = work(tree_work, "tree_nodes_visited") + work(tree_work, "tree_rotations");
    let (node, how) = residual(
        *tree_ns,
        locks(tree_work) * lock_ns,
        units,
        "Linux IOVA tree alloc+free churn at 10,000 live, per node visited or rotation (not separated: both get this value)",
    );
    m.insert(
        "cpu.tree_node_visit",
        Measured {
            ns: node,
            how: how.clone(),
        },
    );
    m.insert("cpu.tree_rotation", Measured { ns: node, how });

    // Magazine hit: alloc+free with nothing live, served by the per-CPU magazines.
    let idle = iolab_side::iova_alloc_free(0, sampling, &|a| a == "magazine", Vec::new).0;
    let (_, mag_ns, mag_work) = find(&idle, "magazine", "magazine churn")?;
    let units = work(mag_work, "magazine_hits")
        + work(mag_work, "magazine_misses")
        + work(mag_work, "depot_exchanges");
    let known = locks(mag_work) * lock_ns
        + (work(mag_work, "tree_nodes_visited") + work(mag_work, "tree_rotations")) * node;
    let (hit, how) = residual(
        *mag_ns,
        known,
        units,
        "magazine-cached IOVA alloc+free with nothing live, per magazine hit (misses and depot exchanges, if any, counted as hits)",
    );
    m.insert("cpu.magazine_hit", Measured { ns: hit, how });

    // IOTLB lookup: the software IOTLB model's hit path on this CPU.
    let tl = iolab_side::iotlb_lookup(sampling, &|c| c == "main-tlb-hit");
    let (_, tlb_ns, tlb_work) = find(&tl, "main-tlb-hit", "IOTLB lookup")?;
    let units = work(tlb_work, "iotlb_hits") + work(tlb_work, "iotlb_misses");
    let (tlb, how) = residual(
        *tlb_ns,
        0.0,
        units,
        "the lab's software IOTLB (gem5 main-TLB geometry) hit lookup, per lookup; a host-software figure standing in for the IOMMU's hardware lookup",
    );
    m.insert("iommu.iotlb_lookup", Measured { ns: tlb, how });

    // memcpy bandwidth: one thread copying 1 MiB buffers.
    const LEN: usize = 1 << 20;
    let src = vec![0x5au8; LEN];
    let mut dst = vec![0u8; LEN];
    let ns = median_ns_per_op(sampling, |i| {
        dst[(i as usize) % 64] = 1;
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
    });
    m.insert(
        "memory.memcpy_bandwidth",
        Measured {
            ns: LEN as f64 / ns,
            how: "copy_from_slice of 1 MiB between two warm buffers, one thread (value: GB/s)"
                .into(),
        },
    );
    Ok(m)
}

/// `iolab calibrate`: measures, then prints the profile or writes it to `output` (refusing
/// to replace an existing file unless `force`). Exit codes: 0 done, 1 failure, 2 bad input.
pub fn run(output: Option<&Path>, force: bool, quick: bool, base: &str) -> ExitCode {
    if let Some(path) = output {
        if path.exists() && !force {
            eprintln!(
                "iolab calibrate: {} already exists; pass --force to overwrite it",
                path.display()
            );
            return ExitCode::from(2);
        }
    }
    if PlatformProfile::bundled_toml(base).is_none() {
        eprintln!(
            "iolab calibrate: unknown base profile `{base}`; expected one of {}",
            PlatformProfile::bundled_names().join(", ")
        );
        return ExitCode::from(2);
    }
    let text = match host_profile_toml(&Sampling::new(quick), base) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("iolab calibrate: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = PlatformProfile::from_toml_str(&text, "host (generated)") {
        eprintln!("iolab calibrate: the generated profile does not load: {e}");
        return ExitCode::from(1);
    }
    match output {
        None => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Some(path) => match std::fs::write(path, &text) {
            Ok(()) => {
                eprintln!("iolab calibrate: wrote {}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("iolab calibrate: cannot write {}: {e}", path.display());
                ExitCode::from(1)
            }
        },
    }
}

/// A TOML basic string.
fn q(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A finite, non-negative number for TOML, with enough digits.
fn num(x: f64) -> String {
    let x = if x.is_finite() && x >= 0.0 { x } else { 0.0 };
    let r = (x * 1000.0).round() / 1000.0;
    if r == r.trunc() {
        format!("{r:.1}")
    } else {
        format!("{r}")
    }
}

/// Measures and renders the `host` profile. `base` names the bundled profile the values the
/// host cannot measure are copied from.
pub fn host_profile_toml(sampling: &Sampling, base: &str) -> Result<String, CalibrateError> {
    let base_profile =
        PlatformProfile::bundled(base).map_err(|e| CalibrateError::Base(e.to_string()))?;
    let measured = measure(sampling)?;
    let (cpu_model, clock) = host_cpu();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let tail = format!("median of {} samples", sampling.samples);
    let measured_src =
        |how: &str| format!("measured by iolab calibrate on {cpu_model}, {how}, {tail}");
    let copied_src = |c: &iolab_sim::cost::Cost| {
        let conv = match c.unit {
            iolab_sim::cost::Unit::Cycles => format!(
                " [{} cycles at {} GHz = {} ns]",
                num(c.value),
                base_profile.cpu.clock_ghz,
                num(c.ns())
            ),
            iolab_sim::cost::Unit::Ns => String::new(),
        };
        format!("copied from {base}: {}{conv}", c.source)
    };

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Platform profile: this host, measured by `iolab calibrate` (values the host cannot\n\
         # measure are copied from the bundled profile {base}). Every value has a source.\n"
    );
    let _ = writeln!(out, "name = \"host\"");
    let _ = writeln!(
        out,
        "description = {}",
        q(&format!(
            "this host ({cpu_model}, {cores} logical CPUs): CPU steps measured by iolab calibrate; IOMMU, MMIO and hypervisor costs copied from {base}"
        ))
    );

    // Group the base profile's costs by section, keeping its order.
    let mut sections: Vec<(String, Vec<(String, &iolab_sim::cost::Cost)>)> = Vec::new();
    for (path, cost) in base_profile.costs() {
        let (group, field) = path.rsplit_once('.').unwrap_or(("", &path));
        match sections.last_mut() {
            Some((g, v)) if g == group => v.push((field.to_owned(), cost)),
            _ => sections.push((group.to_owned(), vec![(field.to_owned(), cost)])),
        }
    }
    for (group, fields) in &sections {
        let _ = writeln!(out, "\n[{group}]");
        match group.as_str() {
            "cpu" => {
                let _ = writeln!(out, "model = {}", q(&cpu_model));
                let _ = writeln!(
                    out,
                    "clock_ghz = {}",
                    num(clock.unwrap_or(base_profile.cpu.clock_ghz))
                );
                let _ = writeln!(out, "cores = {cores}");
                let clock_src = match clock {
                    Some(_) => "clock: `cpu MHz` of /proc/cpuinfo when calibrated (every cost here is written in ns, so the clock converts nothing)".to_owned(),
                    None => format!("clock: unreadable, {base}'s clock kept (every cost here is written in ns, so it converts nothing)"),
                };
                let _ = writeln!(
                    out,
                    "source = {}",
                    q(&format!(
                        "/proc/cpuinfo `model name` and std::thread::available_parallelism on the calibrating host; {clock_src}"
                    ))
                );
            }
            "iommu" => {
                let _ = writeln!(out, "model = {}", q(&base_profile.iommu.model));
                let _ = writeln!(
                    out,
                    "source = {}",
                    q(&format!(
                        "copied from {base}: {} (the host has no IOMMU the lab can time; the IOTLB lookup below is the lab's software IOTLB timed on the host)",
                        base_profile.iommu.source
                    ))
                );
            }
            _ => {}
        }
        for (field, cost) in fields {
            let path = format!("{group}.{field}");
            let (value, source) = match measured.get(path.as_str()) {
                Some(mm) => (mm.ns, measured_src(&mm.how)),
                None => (cost.ns(), copied_src(cost)),
            };
            let _ = writeln!(
                out,
                "{field} = {{ value = {}, unit = \"ns\", source = {} }}",
                num(value),
                q(&source)
            );
        }
    }
    let _ = writeln!(out, "\n[memory]");
    let bw = match measured.get("memory.memcpy_bandwidth") {
        Some(mm) => (mm.ns, measured_src(&mm.how)),
        None => {
            let b = &base_profile.memory.memcpy_bandwidth;
            (b.gb_per_s, format!("copied from {base}: {}", b.source))
        }
    };
    let _ = writeln!(
        out,
        "memcpy_bandwidth = {{ gb_per_s = {}, source = {} }}",
        num(bw.0.max(0.001)),
        q(&bw.1)
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn tiny() -> Sampling {
        Sampling {
            quick: true,
            samples: 3,
            sample_time: Duration::from_millis(2),
            build_profile: "test",
        }
    }

    #[test]
    fn the_host_profile_loads_and_names_every_source() {
        let text = host_profile_toml(&tiny(), DEFAULT_BASE).expect("calibrates");
        let p = PlatformProfile::from_toml_str(&text, "host.toml").expect(&text);
        assert_eq!(p.name, "host");
        let base = PlatformProfile::bundled(DEFAULT_BASE).expect("bundled");
        assert_eq!(p.costs().len(), base.costs().len());
        for (path, c) in p.costs() {
            assert!(
                c.source.starts_with("measured by iolab calibrate on ")
                    || c.source.starts_with("copied from hisilicon-d05: "),
                "{path}: {}",
                c.source
            );
            assert!(c.ns() >= 0.0);
        }
        for path in ["cpu.pte_write", "cpu.tree_node_visit", "sync.atomic_rmw"] {
            let c = p.cost(path).expect(path);
            assert!(c.source.starts_with("measured by"), "{path}");
            assert!(c.source.ends_with("median of 3 samples"), "{path}");
            assert!(c.ns() > 0.0, "{path}");
        }
        // Copied values keep their nanoseconds.
        let walk = p.cost("iommu.walk_read").expect("walk_read");
        assert_eq!(walk.ns(), base.cost("iommu.walk_read").expect("base").ns());
        assert!(p.memory.memcpy_bandwidth.gb_per_s > 0.0);
    }

    #[test]
    fn an_unknown_base_is_an_error() {
        assert!(matches!(
            host_profile_toml(&tiny(), "no-such"),
            Err(CalibrateError::Base(_))
        ));
    }
}
