//! `[workload]` of kind `dma_map_benchmark`: the kernel's DMA-mapping benchmark bound to one
//! block device.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::spec::fields::{one_of, Fields};
use crate::lab::spec::{Common, BUFFER_BASE};
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct DmaMapBenchmarkSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    threads: Option<u32>,
    runtime_ms: u64,
    #[serde(default)]
    granule: Option<u32>,
    #[serde(default)]
    dir: Option<String>,
    #[serde(default)]
    dma_trans_ns: Option<u64>,
    #[serde(default)]
    node: Option<i64>,
}

/// The direction of the benchmark's mappings (`dma_map_benchmark -d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapDirection {
    /// `DMA_BIDIRECTIONAL` (`-d 0`, the tool's default).
    Bidirectional,
    /// `DMA_TO_DEVICE` (`-d 1`).
    ToDevice,
    /// `DMA_FROM_DEVICE` (`-d 2`): the buffer is not written before each map.
    FromDevice,
}

impl MapDirection {
    /// The spellings a scenario accepts, in the tool's `-d` order.
    pub const NAMES: [&'static str; 3] = ["bidirectional", "to_device", "from_device"];

    /// The name the tool prints (`dir:BIDIRECTIONAL`).
    pub fn tool_name(self) -> &'static str {
        match self {
            MapDirection::Bidirectional => "BIDIRECTIONAL",
            MapDirection::ToDevice => "TO_DEVICE",
            MapDirection::FromDevice => "FROM_DEVICE",
        }
    }
}

/// A validated `dma_map_benchmark` workload: `threads` kernel threads, thread `i` on CPU
/// `i`, each mapping and unmapping one buffer of `granule` pages in a loop for `runtime_ns`.
#[derive(Clone, Debug, PartialEq)]
pub struct DmaMapBenchmarkSetup {
    /// Threads (`-t`).
    pub threads: u32,
    /// How long the threads run, ns (`-s`, in seconds there).
    pub runtime_ns: u64,
    /// Pages per mapping (`-g`).
    pub granule: u32,
    /// Direction (`-d`).
    pub dir: MapDirection,
    /// Busy delay between each map and its unmap, ns (`-x`).
    pub dma_trans_ns: u64,
}

/// The benchmark's parameters, with the kernel module's own limits
/// (`map_benchmark_ioctl`: 1..=1024 threads, granule 1..=1024 pages, a transmission delay
/// of at most 10 ms) and the lab's (one thread per CPU, `MAX_RUN_MS`).
pub(in crate::lab::spec) fn dma_map_benchmark(
    doc: &TomlDoc<'_>,
    s: &DmaMapBenchmarkSpec,
    c: &Common,
) -> Result<DmaMapBenchmarkSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    let max_threads = c.cpus.min(1024) as u32;
    let threads = wl.int(
        "threads",
        s.threads.unwrap_or(1),
        1..=max_threads,
        "(one thread per CPU, at most 1024 as the kernel module allows)",
    )?;
    let runtime_ms = wl.int(
        "runtime_ms",
        s.runtime_ms,
        1..=MAX_RUN_MS,
        "ms of virtual time (cap MAX_RUN_MS)",
    )?;
    let granule = wl.int(
        "granule",
        s.granule.unwrap_or(1),
        1..=1024,
        "pages per mapping (the kernel module's range)",
    )?;
    let dir = match s.dir.as_deref().unwrap_or("bidirectional") {
        "bidirectional" => MapDirection::Bidirectional,
        "to_device" => MapDirection::ToDevice,
        "from_device" => MapDirection::FromDevice,
        other => {
            return Err(doc.field_error(
                "workload.dir",
                format!(
                    "unknown direction \"{other}\": {}",
                    one_of(&MapDirection::NAMES)
                ),
            ))
        }
    };
    let dma_trans_ns = wl.int(
        "dma_trans_ns",
        s.dma_trans_ns.unwrap_or(0),
        0..=10_000_000,
        "ns (the kernel module's cap: 10 ms)",
    )?;
    if let Some(node) = s.node.filter(|&n| n != -1) {
        return Err(doc.field_error(
            "workload.node",
            format!("{node}: the lab's machines have one memory node: expected -1 (NUMA_NO_NODE)"),
        ));
    }
    let buffers = u64::from(threads) * u64::from(granule) * 4096;
    if BUFFER_BASE + buffers > c.memory_bytes {
        return Err(doc.field_error(
            "machine.memory_gib",
            format!(
                "the benchmark's buffers (threads x granule pages = {} MiB above the first 4 GiB) do not fit in {} GiB",
                buffers >> 20,
                c.memory_bytes >> 30
            ),
        ));
    }
    Ok(DmaMapBenchmarkSetup {
        threads,
        runtime_ns: runtime_ms * 1_000_000,
        granule,
        dir,
        dma_trans_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Workload;

    fn bench_of(text: &str) -> DmaMapBenchmarkSetup {
        variant!(ok(text).workload, Workload::DmaMapBenchmark)
    }

    #[test]
    fn benchmark_fields_follow_the_tool_s_defaults() {
        assert_eq!(
            bench_of(MAP_BENCH),
            DmaMapBenchmarkSetup {
                threads: 1,
                runtime_ns: 20_000_000,
                granule: 1,
                dir: MapDirection::Bidirectional,
                dma_trans_ns: 0,
            }
        );
        let b = bench_of(&with(
            MAP_BENCH,
            "workload",
            "threads = 8\ngranule = 16\ndir = \"from_device\"\ndma_trans_ns = 100\nnode = -1",
        ));
        assert_eq!(
            (b.threads, b.granule, b.dir, b.dma_trans_ns),
            (8, 16, MapDirection::FromDevice, 100)
        );
        assert_eq!(b.dir.tool_name(), "FROM_DEVICE");
    }

    #[test]
    fn benchmark_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(MAP_BENCH, "workload", "threads = 9"),
            "workload.threads",
            "expected 1..=8 (one thread per CPU, at most 1024 as the kernel module allows), got 9",
        );
        refused(
            &with(MAP_BENCH, "workload", "granule = 1025"),
            "workload.granule",
            "expected 1..=1024 pages per mapping (the kernel module's range), got 1025",
        );
        refused(
            &with(MAP_BENCH, "workload", "dir = \"sideways\""),
            "workload.dir",
            "unknown direction \"sideways\": expected one of \"bidirectional\", \"to_device\", \"from_device\"",
        );
        refused(
            &with(MAP_BENCH, "workload", "dir = 2"),
            "workload.dir",
            "invalid type: integer `2`, expected a string",
        );
        refused(
            &with(MAP_BENCH, "workload", "loops = 2"),
            "workload.loops",
            "unknown field `loops`, expected one of `kind`, `threads`",
        );
        // A NUMA node does not apply: the lab's machines have one.
        refused(
            &with(MAP_BENCH, "workload", "node = 0"),
            "workload.node",
            "0: the lab's machines have one memory node: expected -1 (NUMA_NO_NODE)",
        );
        refused(
            &format!("{MAP_BENCH}\n[[device]]\nkind = \"nvme\"\n"),
            "device",
            "a dma_map_benchmark workload drives exactly one device, got 2",
        );
    }
}
