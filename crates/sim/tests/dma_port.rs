//! The DMA port (`iolab_sim::iommu::port`): the properties every device's DMA timing rests
//! on, and a check that no device prices translation on its own.

use iolab_iommu::addr::Access;
use iolab_sim::iommu::port::{DeviceLink, DmaPort, DmaStream, PortParams, Translated};
use proptest::prelude::*;

fn port(walkers: usize) -> DmaPort {
    DmaPort::new(PortParams {
        walkers,
        walk_read_ns: 197.0,
        walk_cache_lookup_ns: 4.0,
    })
}

/// One DMA of a device's stream: its data time, translation and direction.
#[derive(Clone, Debug)]
struct Dma {
    gap_ns: f64,
    data_ns: f64,
    pages: u64,
    misses: u64,
    reads_per_miss: u64,
    write: bool,
}

fn dma() -> impl Strategy<Value = Dma> {
    (
        0.0..2_000.0f64,
        1.0..20_000.0f64,
        1u64..40,
        0u64..40,
        1u64..5,
        any::<bool>(),
    )
        .prop_map(
            |(gap_ns, data_ns, pages, misses, reads_per_miss, write)| Dma {
                gap_ns,
                data_ns,
                pages,
                misses: misses.min(pages),
                reads_per_miss,
                write,
            },
        )
}

fn access(d: &Dma) -> Access {
    if d.write {
        Access::Write
    } else {
        Access::Read
    }
}

/// Runs `dmas` as one device's stream through `p` with `link`: each DMA is ready `gap_ns`
/// after the stream is free again (writes to memory hold the stream through their stalls,
/// reads only through their data). Returns every DMA's end.
fn stream(p: &DmaPort, link: DeviceLink, dmas: &[Dma], misses: bool) -> Vec<f64> {
    let on = DmaStream::new(link);
    let mut free = 0.0;
    dmas.iter()
        .map(|d| {
            let ready = free + d.gap_ns;
            let t = Translated {
                pages: d.pages,
                misses: if misses { d.misses } else { 0 },
                walk_reads: if misses {
                    d.misses * d.reads_per_miss
                } else {
                    0
                },
            };
            let done = p.transfer(ready, d.data_ns, t, access(d), &on);
            free = if d.write && !link.relaxed_ordering {
                done
            } else {
                ready + d.data_ns
            };
            done
        })
        .collect()
}

fn link(outstanding_pages: u32) -> DeviceLink {
    DeviceLink {
        outstanding_pages,
        relaxed_ordering: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Without misses a DMA ends exactly when its data does: the same time as with the
    /// IOMMU off. With misses it never ends earlier.
    #[test]
    fn zero_misses_cost_nothing_and_misses_never_help(
        dmas in prop::collection::vec(dma(), 1..30),
        walkers in 1usize..9,
        window in 1u32..64,
    ) {
        let off = stream(&port(walkers), link(window), &dmas, false);
        let mut free = 0.0;
        for (d, end) in dmas.iter().zip(&off) {
            let ready = free + d.gap_ns;
            prop_assert_eq!(*end, ready + d.data_ns);
            free = ready + d.data_ns;
        }
        let on = stream(&port(walkers), link(window), &dmas, true);
        prop_assert!(on.iter().sum::<f64>() >= off.iter().sum::<f64>() - 1e-6);
        prop_assert!(on.last() >= off.last());
    }

    /// More outstanding requests never lower a device's throughput: the stream's DMAs are
    /// all through no later with a wider window (its walks start in its own order, so an
    /// earlier request never takes a walker a later one of the stream would have had first).
    #[test]
    fn a_wider_window_never_lowers_throughput(
        dmas in prop::collection::vec(dma(), 1..30),
        walkers in 1usize..9,
        window in 1u32..32,
        extra in 1u32..32,
    ) {
        let narrow = stream(&port(walkers), link(window), &dmas, true);
        let wide = stream(&port(walkers), link(window + extra), &dmas, true);
        let through = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let (n, w) = (through(&narrow), through(&wide));
        prop_assert!(w <= n, "window {} ends at {}, window {} at {}", window, n, window + extra, w);
    }

    /// However many devices and DMAs ask, no more walks are in flight at once than the unit
    /// has walkers.
    #[test]
    fn walks_never_exceed_the_walkers(
        devices in prop::collection::vec(prop::collection::vec(dma(), 1..15), 1..5),
        walkers in 1usize..6,
        window in 1u32..64,
    ) {
        let p = port(walkers);
        p.record_walks();
        for dmas in &devices {
            // Each device's stream starts at time 0: their requests interleave in time but
            // reach the port one device after another, as the lab's devices book ahead.
            stream(&p, link(window), dmas, true);
        }
        let mut edges: Vec<(f64, i32)> = Vec::new();
        for (s, e) in p.walks() {
            prop_assert!(e > s);
            edges.push((s, 1));
            edges.push((e, -1));
        }
        // Ends before starts at the same instant: a walker freed at t can start again at t.
        edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut live = 0;
        for (_, d) in edges {
            live += d;
            prop_assert!(live <= walkers as i32, "{} walks in flight, {} walkers", live, walkers);
        }
    }
}

#[test]
fn a_posted_write_stream_pays_its_walks_in_series_as_f_and_s_fit_it() {
    // F&S's T = p / (l_0 + M * l_m): a 4 KiB packet with one miss of two reads takes
    // l_0 + 2 * l_m (plus the walk-cache lookup) however many walkers there are.
    for walkers in [1, 5, 64] {
        let p = port(walkers);
        let t = Translated {
            pages: 1,
            misses: 1,
            walk_reads: 2,
        };
        let mut free = 0.0;
        let on = DmaStream::new(link(32));
        for _ in 0..100 {
            free = p.transfer(free, 65.0, t, Access::Write, &on);
        }
        assert!(
            (free - 100.0 * (65.0 + 4.0 + 2.0 * 197.0)).abs() < 1e-6,
            "{free}"
        );
    }
}

#[test]
fn reads_overlap_their_walks_up_to_the_walker_count() {
    // 32 pages of reads, every page a miss of one read: with one walker the walks run in
    // series; with 8 they overlap about eightfold.
    let t = Translated {
        pages: 32,
        misses: 32,
        walk_reads: 32,
    };
    let on = |w| {
        port(w).transfer(0.0, 32.0 * 65.0, t, Access::Read, &DmaStream::new(link(32))) - 32.0 * 65.0
    };
    let (one, eight) = (on(1), on(8));
    assert!(one >= 32.0 * 201.0 - 32.0 * 65.0, "{one}");
    assert!(eight < one / 4.0, "{eight} vs {one}");
}

/// Every device's DMA is timed by the port: no device, workload or lab stack prices
/// translation with the cost model's serial sum (`translation_ns`) on its own.
#[test]
fn no_device_prices_translation_on_its_own() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    for dir in ["devices", "workloads", "lab", "iommu"] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (n, line) in text.lines().enumerate() {
                        let code = line.split("//").next().unwrap_or("");
                        if code.contains("translation_ns(") || code.contains("translation_ns_of(") {
                            offenders.push(format!("{}:{}", path.display(), n + 1));
                        }
                    }
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "translation priced outside the DMA port at {offenders:?}"
    );
}
