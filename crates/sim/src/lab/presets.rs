//! Named devices a scenario selects with `device[i].model`: current NVMe SSDs and NICs, each
//! figure from its data sheet or a stated assumption. A preset gives the defaults of the
//! device's fields; a field the scenario sets still wins. docs/SCENARIOS.md lists them.

use super::defaults::Sourced;

/// An NVMe SSD's rated figures.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NvmePreset {
    /// The name a scenario gives (`device[i].model`).
    pub name: &'static str,
    /// 4 KiB random-read IOPS.
    pub max_iops: Sourced<f64>,
    /// Sequential read bandwidth, GB/s.
    pub bandwidth_gb_per_s: Sourced<f64>,
    /// Typical QD1 read latency, us.
    pub read_latency_us: Sourced<f64>,
    /// Typical QD1 write latency, us.
    pub write_latency_us: Sourced<f64>,
}

/// Typical QD1 4 KiB read of a current TLC drive whose sheet gives none.
const TLC_READ_US: &str = "assumption: RESEARCH.md's typical QD1 4 KiB read of current TLC data-centre drives, 60-90 us: 70 us (the sheet gives none)";
/// Typical write latency of a current drive whose sheet gives none.
const CACHED_WRITE_US: &str = "assumption: writes complete from the power-protected DRAM cache as the Micron 9550's 15 us (the sheet gives none)";

/// The NVMe presets.
pub(crate) const NVME: &[NvmePreset] = &[
    NvmePreset {
        name: "huawei-es3000-v2",
        max_iops: (
            770_000.0,
            "Huawei ES3000 V2 spec sheet: 770K 4 KiB random-read IOPS (the lab's default drive)",
        ),
        bandwidth_gb_per_s: (3.2, "assumption: PCIe 3.0 x4 less protocol overhead"),
        read_latency_us: (85.0, "assumption: as the lab's default drive"),
        write_latency_us: (20.0, "assumption: as the lab's default drive"),
    },
    NvmePreset {
        name: "micron-9400",
        max_iops: (
            1_600_000.0,
            "Micron 9400 (PCIe 4.0 x4) product brief as reported by ComputerBase (2023-01): up to 1.6M 4 KiB random-read IOPS; RESEARCH.md",
        ),
        bandwidth_gb_per_s: (7.0, "Micron 9400 product brief: 7,000 MB/s sequential read"),
        read_latency_us: (70.0, TLC_READ_US),
        write_latency_us: (15.0, CACHED_WRITE_US),
    },
    NvmePreset {
        name: "micron-9550",
        max_iops: (
            3_300_000.0,
            "Micron 9550 (PCIe 5.0 x4) data sheet as tabled by StorageReview (9550 MAX, 6.4 TB and up): 3,300K 4 KiB random-read IOPS; RESEARCH.md",
        ),
        bandwidth_gb_per_s: (14.0, "Micron 9550 data sheet: 14,000 MB/s sequential read"),
        read_latency_us: (60.0, "Micron 9550 data sheet: typical read latency 60 us"),
        write_latency_us: (15.0, "Micron 9550 data sheet: typical write latency 15 us"),
    },
    NvmePreset {
        name: "samsung-pm1743",
        max_iops: (
            2_500_000.0,
            "Samsung PM1743 (PCIe 5.0 x4): 2.5M 4 KiB random-read IOPS (RESEARCH.md)",
        ),
        bandwidth_gb_per_s: (13.0, "Samsung PM1743: 13 GB/s sequential read (RESEARCH.md)"),
        read_latency_us: (70.0, TLC_READ_US),
        write_latency_us: (15.0, CACHED_WRITE_US),
    },
];

/// A NIC's port and host link.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NicPreset {
    /// The name a scenario gives (`device[i].model`).
    pub name: &'static str,
    /// Line rate, Gb/s.
    pub link_gbps: Sourced<f64>,
    /// The DMA engine's time per 4 KiB on its PCIe link, ns (the direct-DMA path).
    pub dma_ns_per_4k: Sourced<f64>,
}

/// The NIC presets.
pub(crate) const NIC: &[NicPreset] = &[
    NicPreset {
        name: "connectx-5-100g",
        link_gbps: (100.0, "NVIDIA ConnectX-5 EN: 100 GbE (single port)"),
        dma_ns_per_4k: (
            256.0,
            "ConnectX-5 on PCIe 3.0 x16: 4 KiB at 128 Gb/s of link, 256 ns",
        ),
    },
    NicPreset {
        name: "connectx-6-dx-100g",
        link_gbps: (100.0, "NVIDIA ConnectX-6 Dx: 100 GbE (single port)"),
        dma_ns_per_4k: (
            128.0,
            "ConnectX-6 Dx on PCIe 4.0 x16: 4 KiB at 256 Gb/s of link, 128 ns",
        ),
    },
    NicPreset {
        name: "connectx-7-200g",
        link_gbps: (200.0, "NVIDIA ConnectX-7: 200 GbE (single port)"),
        dma_ns_per_4k: (
            64.0,
            "ConnectX-7 on PCIe 5.0 x16: 4 KiB at 512 Gb/s of link, 64 ns",
        ),
    },
    NicPreset {
        name: "connectx-7-400g",
        link_gbps: (400.0, "NVIDIA ConnectX-7: 400 GbE (single port)"),
        dma_ns_per_4k: (
            64.0,
            "ConnectX-7 on PCIe 5.0 x16: 4 KiB at 512 Gb/s of link, 64 ns",
        ),
    },
];

/// The names of `presets`, for error messages.
pub(crate) fn names<T>(presets: &[T], name: impl Fn(&T) -> &'static str) -> String {
    presets
        .iter()
        .map(|p| format!("\"{}\"", name(p)))
        .collect::<Vec<_>>()
        .join(", ")
}
