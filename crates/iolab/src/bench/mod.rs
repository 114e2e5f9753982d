//! `iolab bench`: the stack's native speed on host threads, against peer crates in the same run.
//!
//! Every benchmark runs the iolab operation and, where one exists, the same operation on a peer
//! crate, interleaved in one process so that both see the same machine state. Each figure is
//! the median of several timed samples; the ratio is `peer / iolab` (above 1: iolab is faster).

pub(crate) mod harness;
pub(crate) mod iolab_side;
mod peers;
mod sim_side;
mod x86_paging;
mod x86_side;

use std::collections::BTreeMap;

use serde::Serialize;

pub use harness::Sampling;

/// One benchmark's result. `cmdq_issue` rows time one issue call (two TLBIs and a sync) per
/// thread, so `ns_per_op` is per call and per thread; their `work_per_op` includes
/// `cas_failures_per_command`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BenchRecord {
    /// `iova_alloc_free/<allocator>/<live>`, `pgtable_map_unmap/<format>/<size>`,
    /// `translate/<path>`, `pgtable/<x86 format>/<operation>`, `inval/<unit>-strict-unmap`,
    /// `iotlb_lookup/<config>`, `cmdq_issue/<producer>/<threads>`, `sim/<scenario>/<cpus>`.
    pub name: String,
    /// Median nanoseconds per operation of iolab's implementation.
    pub ns_per_op: f64,
    /// The main peer crate measured on the same operation, if any.
    pub peer: Option<String>,
    /// The main peer's median nanoseconds per operation.
    pub peer_ns_per_op: Option<f64>,
    /// `peer_ns_per_op / ns_per_op`: how many times faster iolab is than the peer (below 1:
    /// slower). Two decimals from 1 up, three significant digits below (0.0269 for a row 37x
    /// slower than its peer).
    pub speedup_vs_peer: Option<f64>,
    /// Further peers measured on the same operation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_peers: Vec<PeerFigure>,
    /// For command-queue benchmarks: commands issued per second by all threads together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commands_per_sec: Option<f64>,
    /// For `sim/...` rows: simulated I/Os per second of host time (`ns_per_op` is host ns
    /// per simulated I/O).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sim_ios_per_host_sec: Option<f64>,
    /// For `sim/...` rows: host wall-clock ns per simulated I/O (`ns_per_op` is the
    /// thread's on-CPU time per simulated I/O).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_ns_per_op: Option<f64>,
    /// For `sim/...` rows: the simulated I/Os the timed run completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated_ios: Option<u64>,
    /// For the `sim/...` row run with 1 TiB of simulated RAM: the process's peak resident
    /// memory during that run, MB (see `sim_side::run_row`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
    /// Exact work counted per operation by the stack (for example tree nodes visited),
    /// averaged over the timed operations; absent for peers, which count nothing.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub work_per_op: BTreeMap<String, f64>,
}

/// A peer crate's figure.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PeerFigure {
    /// The peer crate and the API used.
    pub peer: String,
    /// Median nanoseconds per operation.
    pub ns_per_op: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// How the figures were taken.
    pub sampling: Sampling,
    /// One record per benchmark.
    pub results: Vec<BenchRecord>,
}

/// Live-allocation counts the allocator benchmarks are run at.
pub const LIVE_COUNTS: [usize; 3] = [0, 10_000, 100_000];

/// Which benchmark rows to run: all, or those whose name contains one of the given texts
/// (`iolab bench --filter`).
#[derive(Debug, Clone, Default)]
pub struct RowFilter {
    texts: Vec<String>,
}

impl RowFilter {
    /// Keeps the rows whose name contains any of `texts`; every row when `texts` is empty.
    pub fn new(texts: Vec<String>) -> Self {
        RowFilter { texts }
    }

    /// Whether the row named `name` runs.
    pub fn keeps(&self, name: &str) -> bool {
        self.texts.is_empty() || self.texts.iter().any(|t| name.contains(t.as_str()))
    }
}

/// Runs every benchmark the filter keeps (a peer is measured only when one of its iolab
/// rows runs).
pub fn run_all(sampling: Sampling, filter: &RowFilter) -> BenchReport {
    let mut results = Vec::new();
    for live in LIVE_COUNTS {
        let keep = |a: &str| filter.keeps(&format!("iova_alloc_free/{a}/{live}"));
        // iolab's allocators and the peers, their samples taken in turn (the same load falls
        // on all of them, so the ratios hold on a shared machine). Peers run only beside an
        // iolab row.
        let peer_ops = || {
            vec![
                peers::vm_allocator_churn(live),
                peers::range_alloc_churn(live),
            ]
        };
        let (rows, peer_ns) = iolab_side::iova_alloc_free(live, &sampling, &keep, peer_ops);
        if rows.is_empty() {
            continue;
        }
        let peers = vec![
            PeerFigure {
                peer: "vm-allocator AddressAllocator".into(),
                ns_per_op: peer_ns[0],
            },
            PeerFigure {
                peer: "range-alloc RangeAllocator".into(),
                ns_per_op: peer_ns[1],
            },
        ];
        for (allocator, ns, work) in rows {
            results.push(record(
                format!("iova_alloc_free/{allocator}/{live}"),
                ns,
                work,
                &peers,
            ));
        }
    }
    for (size_name, size) in [("4k", 4096u64), ("2m", 2 << 20)] {
        let keep = |f: &str| filter.keeps(&format!("pgtable_map_unmap/{f}/{size_name}"));
        let rows = iolab_side::pgtable_map_unmap(size, &sampling, &keep);
        if rows.is_empty() {
            continue;
        }
        let peers = vec![PeerFigure {
            peer: "aarch64-paging IdMap".into(),
            ns_per_op: peers::aarch64_paging_map_unmap(size, &sampling),
        }];
        for (format, ns, work) in rows {
            results.push(record(
                format!("pgtable_map_unmap/{format}/{size_name}"),
                ns,
                work,
                &peers,
            ));
        }
    }
    // The two translation rows share their set-up: run both if either is kept.
    if ["lpae-4k-walk", "dma-domain-strict"]
        .iter()
        .any(|p| filter.keeps(&format!("translate/{p}")))
    {
        for (path, ns, work) in iolab_side::translate(&sampling) {
            let name = format!("translate/{path}");
            if filter.keeps(&name) {
                results.push(record(name, ns, work, &[]));
            }
        }
    }
    x86_rows(&sampling, filter, &mut results);
    let keep = |c: &str| filter.keeps(&format!("iotlb_lookup/{c}"));
    for (config, ns, work) in iolab_side::iotlb_lookup(&sampling, &keep) {
        results.push(record(format!("iotlb_lookup/{config}"), ns, work, &[]));
    }
    let keep = |p: &str, t: usize| filter.keeps(&format!("cmdq_issue/{p}/{t}"));
    for (producer, threads, ns, work) in iolab_side::cmdq_issue(&sampling, &keep) {
        let mut r = record(format!("cmdq_issue/{producer}/{threads}"), ns, work, &[]);
        let commands_per_call = r
            .work_per_op
            .get("commands_written")
            .copied()
            .unwrap_or(0.0);
        r.commands_per_sec = Some((threads as f64 * commands_per_call * 1e9 / ns).round());
        results.push(r);
    }
    let keep = |cpus: usize| filter.keeps(&format!("sim/{}/{cpus}", sim_side::SCENARIO));
    for row in sim_side::sim_rows(sampling.quick, &keep) {
        match row {
            Ok(f) => results.push(sim_record(
                &format!("sim/{}/{}", sim_side::SCENARIO, f.cpus),
                &f,
            )),
            Err(e) => eprintln!("iolab bench: sim/{}: {e}", sim_side::SCENARIO),
        }
    }
    let lab_name = format!("sim/{}/{}", sim_side::LAB_SCENARIO, sim_side::LAB_CPUS);
    if filter.keeps(&lab_name) {
        match sim_side::lab_rows(sampling.quick) {
            Ok(f) => results.push(sim_record(&lab_name, &f)),
            Err(e) => eprintln!("iolab bench: {lab_name}: {e}"),
        }
    }
    BenchReport { sampling, results }
}

/// The x86 IOMMU rows (see [`x86_side`]): `pgtable/<format>/map-unmap-{seq,rand}` and
/// `pgtable/<format>/translate` against the `x86_64` crate's `OffsetPageTable` on the same
/// pages, with iolab's LPAE table on the same work as an in-house reference, their samples
/// interleaved; then `inval/<unit>-strict-unmap`, which have no peer crate.
fn x86_rows(sampling: &Sampling, filter: &RowFilter, results: &mut Vec<BenchRecord>) {
    use harness::{median_ns_per_op_interleaved, Op};
    use x86_side::{lpae_table, PA_BASE};
    const PEER: &str = "x86_64 OffsetPageTable";
    const LPAE: &str = "iolab LPAE (in-house ref)";
    let tables = x86_side::x86_tables();
    let figures = |ns: &[f64]| {
        [
            PeerFigure {
                peer: PEER.into(),
                ns_per_op: ns[0],
            },
            PeerFigure {
                peer: LPAE.into(),
                ns_per_op: ns[1],
            },
        ]
    };
    let patterns = [x86_side::Pattern::Sequential, x86_side::Pattern::Random];
    for pattern in patterns {
        let kept: Vec<_> = tables
            .iter()
            .filter(|(f, _)| filter.keeps(&format!("pgtable/{f}/{}", pattern.row())))
            .collect();
        if kept.is_empty() {
            continue;
        }
        let iovas = pattern.iovas();
        let mut ops: Vec<Op<'_>> = vec![
            x86_paging::map_unmap_op(&iovas, PA_BASE),
            x86_side::map_unmap_op(&lpae_table, &iovas),
        ];
        ops.extend(
            kept.iter()
                .map(|(_, make)| x86_side::map_unmap_op(make, &iovas)),
        );
        let per_page: Vec<f64> = median_ns_per_op_interleaved(sampling, ops)
            .into_iter()
            .map(|round| round / iovas.len() as f64)
            .collect();
        let peers = figures(&per_page);
        for ((format, make), ns) in kept.into_iter().zip(&per_page[2..]) {
            let work = x86_side::map_unmap_work(make, &iovas);
            let name = format!("pgtable/{format}/{}", pattern.row());
            results.push(record(name, *ns, work, &peers));
        }
    }
    let kept: Vec<_> = tables
        .iter()
        .filter(|(f, _)| filter.keeps(&format!("pgtable/{f}/translate")))
        .collect();
    if !kept.is_empty() {
        let iovas = x86_side::Pattern::Random.iovas();
        let mut ops: Vec<Op<'_>> = vec![
            x86_paging::translate_op(&iovas, PA_BASE),
            x86_side::translate_op(&lpae_table, &iovas),
        ];
        ops.extend(
            kept.iter()
                .map(|(_, make)| x86_side::translate_op(make, &iovas)),
        );
        let ns = median_ns_per_op_interleaved(sampling, ops);
        let peers = figures(&ns);
        for ((format, make), ns) in kept.into_iter().zip(&ns[2..]) {
            let work = x86_side::translate_work(make, &iovas);
            let name = format!("pgtable/{format}/translate");
            results.push(record(name, *ns, work, &peers));
        }
    }
    let keep = |u: &str| filter.keeps(&format!("inval/{u}-strict-unmap"));
    for (unit, ns, work) in x86_side::strict_unmap(sampling, &keep) {
        results.push(record(format!("inval/{unit}-strict-unmap"), ns, work, &[]));
    }
}

fn record(name: String, ns: f64, work: Vec<(String, f64)>, peers: &[PeerFigure]) -> BenchRecord {
    let main = peers.first();
    BenchRecord {
        name,
        ns_per_op: round2(ns),
        peer: main.map(|p| p.peer.clone()),
        peer_ns_per_op: main.map(|p| round2(p.ns_per_op)),
        speedup_vs_peer: main.map(|p| round_ratio(p.ns_per_op / ns)),
        other_peers: peers
            .iter()
            .skip(1)
            .map(|p| PeerFigure {
                peer: p.peer.clone(),
                ns_per_op: round2(p.ns_per_op),
            })
            .collect(),
        commands_per_sec: None,
        sim_ios_per_host_sec: None,
        simulated_ios: None,
        wall_ns_per_op: None,
        peak_rss_mb: None,
        work_per_op: work.into_iter().collect(),
    }
}

fn sim_record(name: &str, f: &sim_side::SimFigure) -> BenchRecord {
    let mut r = record(name.to_owned(), f.ns_per_io, Vec::new(), &[]);
    r.simulated_ios = Some(f.ios);
    r.wall_ns_per_op = Some(round2(f.wall_ns_per_io));
    r.sim_ios_per_host_sec = Some(f.ios_per_host_sec.round());
    r.peak_rss_mb = f.peak_rss_mb.map(round2);
    r
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A ratio for the JSON report: two decimals from 1 up, three significant digits below (so a
/// row many times slower than its peer does not round to 0).
fn round_ratio(x: f64) -> f64 {
    if !x.is_finite() || x >= 1.0 || x <= 0.0 {
        return round2(x);
    }
    let scale = 10f64.powi(2 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

/// How iolab's time compares with a peer's, both ways readable: `4.6x faster` when iolab
/// takes less time, `37.2x slower` when it takes more (the ratio of the larger to the
/// smaller time), with two decimals below 10x, one below 1000x, none above.
fn ratio_text(iolab_ns: f64, peer_ns: f64) -> String {
    let usable = |ns: f64| ns > 0.0 && ns.is_finite();
    if !(usable(iolab_ns) && usable(peer_ns)) {
        return "-".into();
    }
    let (r, how) = if peer_ns >= iolab_ns {
        (peer_ns / iolab_ns, "faster")
    } else {
        (iolab_ns / peer_ns, "slower")
    };
    let digits = if r < 10.0 {
        2
    } else if r < 1000.0 {
        1
    } else {
        0
    };
    format!("{r:.digits$}x {how}")
}

/// Renders the report as an aligned text table.
pub fn render_text(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "iolab bench: median of {} samples, {} ({} mode)",
        report.sampling.samples,
        if report.sampling.quick {
            "quick"
        } else {
            "full"
        },
        report.sampling.build_profile
    );
    let _ = writeln!(
        out,
        "{:<40} {:>10} {:>12}  {:<30} {:>14}",
        "benchmark", "ns/op", "peer ns/op", "peer", "iolab vs peer"
    );
    for r in &report.results {
        let peer_ns = r
            .peer_ns_per_op
            .map(|v| format!("{v:.1}"))
            .unwrap_or_else(|| "-".into());
        let speedup = r
            .peer_ns_per_op
            .map(|p| ratio_text(r.ns_per_op, p))
            .unwrap_or_else(|| "-".into());
        let peer_name = match (r.commands_per_sec, r.sim_ios_per_host_sec) {
            (Some(c), _) => format!("({:.2} M commands/s)", c / 1e6),
            (None, Some(s)) => match r.peak_rss_mb {
                Some(m) => format!("({:.2} M sim IO/s, {m:.0} MB)", s / 1e6),
                None => format!("({:.2} M sim IO/s)", s / 1e6),
            },
            (None, None) => r.peer.clone().unwrap_or_else(|| "-".into()),
        };
        let _ = writeln!(
            out,
            "{:<40} {:>10.1} {:>12}  {:<30} {:>14}",
            r.name, r.ns_per_op, peer_ns, peer_name, speedup
        );
        for p in &r.other_peers {
            let _ = writeln!(
                out,
                "{:<40} {:>10} {:>12.1}  {:<30} {:>14}",
                "",
                "",
                p.ns_per_op,
                p.peer,
                ratio_text(r.ns_per_op, p.ns_per_op)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ns: f64, peer_ns: f64, other_ns: f64) -> BenchRecord {
        let peers = [
            PeerFigure {
                peer: "peer-a".into(),
                ns_per_op: peer_ns,
            },
            PeerFigure {
                peer: "peer-b".into(),
                ns_per_op: other_ns,
            },
        ];
        record("x/y".into(), ns, Vec::new(), &peers)
    }

    #[test]
    fn ratios_read_right_both_ways() {
        assert_eq!(ratio_text(25.9, 119.8), "4.63x faster");
        assert_eq!(ratio_text(178.3, 32221.0), "180.7x faster");
        assert_eq!(ratio_text(3720.0, 100.0), "37.2x slower");
        assert_eq!(ratio_text(104.0, 100.0), "1.04x slower");
        assert_eq!(ratio_text(100.0, 100.0), "1.00x faster");
        assert_eq!(ratio_text(1.0, 5000.0), "5000x faster");
        assert_eq!(ratio_text(0.0, 5.0), "-");
    }

    #[test]
    fn a_row_many_times_slower_than_its_peer_is_not_printed_as_zero() {
        let report = BenchReport {
            sampling: Sampling::new(true),
            results: vec![row(3720.0, 100.0, 7440.0)],
        };
        let text = render_text(&report);
        assert!(!text.contains("0.0x"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].ends_with("37.2x slower"), "{text}");
        assert!(lines[3].ends_with("2.00x faster"), "{text}");
        // The JSON ratio keeps its digits too.
        assert_eq!(report.results[0].speedup_vs_peer, Some(0.0269));
        assert_eq!(round_ratio(180.734), 180.73);
        assert_eq!(round_ratio(0.5), 0.5);
    }
}
