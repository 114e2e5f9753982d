//! `[[device]]` of kind `nvme`: an NVMe SSD.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::device::{BlockSpec, Devices};
use crate::lab::spec::fields::{us_to_ns, Fields};
use crate::lab::spec::{LabScenario, Workload};
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct NvmeSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    io_queues: Option<usize>,
    #[serde(default)]
    max_iops: Option<f64>,
    #[serde(default)]
    bandwidth_gb_per_s: Option<f64>,
    #[serde(default)]
    read_latency_us: Option<f64>,
    #[serde(default)]
    write_latency_us: Option<f64>,
    #[serde(default)]
    latency_distribution: Option<String>,
    #[serde(default)]
    submit_ns: Option<u64>,
    #[serde(default)]
    complete_ns: Option<u64>,
    #[serde(default)]
    iommu_instance: Option<usize>,
    #[serde(default)]
    coalesce_threshold: Option<u64>,
    #[serde(default)]
    coalesce_time_100us: Option<u64>,
    #[serde(default)]
    dma_mask_bits: Option<u32>,
    #[serde(default)]
    dma_outstanding_pages: Option<u32>,
    #[serde(default)]
    relaxed_ordering: Option<bool>,
    /// `[device.hostile]`: the device probes what it should not reach (see `hostile`).
    #[serde(default)]
    hostile: Option<HostileSpec>,
}

/// A validated NVMe SSD.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NvmeSetup {
    /// The device class (queues, rated IOPS, bandwidth, media latencies).
    pub params: crate::devices::nvme::NvmeParams,
    /// Interrupt Coalescing (Set Features, Feature ID 08h) as the driver set it; off
    /// (every completion raises its vector's interrupt) unless the scenario sets
    /// `coalesce_threshold` and `coalesce_time_100us`.
    pub coalescing: crate::devices::nvme::InterruptCoalescing,
    /// `[device.hostile]`: the device probes just-unmapped addresses and the neighbours of
    /// live buffers (fio only); `None`, an honest device, unless the table is given.
    pub hostile: Option<crate::devices::hostile::HostileParams>,
    /// The controller's DMA mask, bits (`device[i].dma_mask_bits`; every NVMe device of a
    /// scenario states the same: they share one DMA domain).
    pub dma_mask_bits: u32,
    /// How far the drive's DMA runs ahead at the IOMMU's port
    /// (`device[i].dma_outstanding_pages`, `device[i].relaxed_ordering`).
    pub dma_link: crate::iommu::port::DeviceLink,
}

impl BlockSpec for NvmeSpec {
    fn devices(doc: &TomlDoc<'_>, specs: &[Self], cpus: usize) -> Result<Devices, InputError> {
        let devs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| nvme(doc, i, s, cpus))
            .collect::<Result<Vec<NvmeSetup>, _>>()?;
        if let Some(i) = devs
            .iter()
            .position(|x| x.dma_mask_bits != devs[0].dma_mask_bits)
        {
            return Err(doc.field_error(
                &format!("device[{i}].dma_mask_bits"),
                format!(
                    "{} differs from device[0]'s {}: the lab's devices share one DMA domain, state one mask",
                    devs[i].dma_mask_bits, devs[0].dma_mask_bits
                ),
            ));
        }
        Ok(Devices::Nvme(devs))
    }

    fn driver_ns(&self, profile: &crate::cost::PlatformProfile) -> (u64, u64) {
        let ns = |c: &crate::cost::Cost| c.ns().round() as u64;
        (
            self.submit_ns.unwrap_or(ns(&profile.io_path.nvme_submit)),
            self.complete_ns
                .unwrap_or(ns(&profile.io_path.nvme_complete)),
        )
    }

    fn iommu_instance(&self) -> Option<usize> {
        self.iommu_instance
    }
}

fn nvme(doc: &TomlDoc<'_>, i: usize, s: &NvmeSpec, cpus: usize) -> Result<NvmeSetup, InputError> {
    let dev = Fields::new(doc, format!("device[{i}]"));
    let io_queues = dev.int(
        "io_queues",
        s.io_queues.unwrap_or(d::NVME_IO_QUEUES.0),
        1..=MAX_DEVICE_QUEUES,
        "(cap MAX_DEVICE_QUEUES)",
    )?;
    // Interrupt Coalescing (feature 08h): both fields or neither.
    let coalescing = match (s.coalesce_threshold, s.coalesce_time_100us) {
        (None, None) => crate::devices::nvme::InterruptCoalescing {
            threshold: d::NVME_COALESCING.0 .0,
            time_100us: d::NVME_COALESCING.0 .1,
        },
        (Some(t), Some(x)) => crate::devices::nvme::InterruptCoalescing {
            threshold: dev.int(
                "coalesce_threshold",
                t,
                0..=255,
                "(the feature's 8-bit THR, 0's based)",
            )? as u8,
            time_100us: dev.int(
                "coalesce_time_100us",
                x,
                0..=255,
                "(the feature's 8-bit TIME, 100 us units)",
            )? as u8,
        },
        (t, _) => {
            // One of the two is missing: name it.
            let missing = if t.is_some() {
                "coalesce_time_100us"
            } else {
                "coalesce_threshold"
            };
            return Err(doc.field_error(
                &format!("device[{i}].{missing}"),
                "missing: Interrupt Coalescing (feature 08h) takes coalesce_threshold and coalesce_time_100us together",
            ));
        }
    };
    // A named drive gives the rated figures' defaults.
    let (iops_d, bw_d, read_d, write_d) = match s.model.as_deref() {
        None => (
            d::NVME_MAX_IOPS,
            d::NVME_BANDWIDTH_GB_PER_S,
            d::NVME_READ_LATENCY_US,
            d::NVME_WRITE_LATENCY_US,
        ),
        Some(name) => {
            use crate::lab::presets::{names, NVME};
            let p = NVME.iter().find(|p| p.name == name).ok_or_else(|| {
                doc.field_error(
                    &format!("device[{i}].model"),
                    format!(
                        "unknown NVMe drive \"{name}\": expected one of {}",
                        names(NVME, |p| p.name)
                    ),
                )
            })?;
            (
                p.max_iops,
                p.bandwidth_gb_per_s,
                p.read_latency_us,
                p.write_latency_us,
            )
        }
    };
    let [max_iops, bandwidth_gb_per_s, read_latency_us, write_latency_us] = dev.reals([
        ("max_iops", s.max_iops, iops_d, 1.0..=1e8),
        (
            "bandwidth_gb_per_s",
            s.bandwidth_gb_per_s,
            bw_d,
            0.001..=1000.0,
        ),
        ("read_latency_us", s.read_latency_us, read_d, 0.0..=1e6),
        ("write_latency_us", s.write_latency_us, write_d, 0.0..=1e6),
    ])?;
    // Media latency per command: drawn about its mean (the default), or fixed.
    let media_spread_pct = match s.latency_distribution.as_deref() {
        None | Some("uniform") => d::NVME_MEDIA_SPREAD_PCT.0,
        Some("fixed") => 0,
        Some(other) => {
            return Err(doc.field_error(
                &format!("device[{i}].latency_distribution"),
                format!(
                    "expected \"uniform\" (each command's media latency drawn from the mean +-{}%) or \"fixed\", got \"{other}\"",
                    d::NVME_MEDIA_SPREAD_PCT.0
                ),
            ))
        }
    };
    let params = crate::devices::nvme::NvmeParams {
        // Linux creates one queue pair per CPU, up to the controller's count.
        io_queues: io_queues.min(cpus),
        max_iops,
        bandwidth: bandwidth_gb_per_s * 1e9,
        read_latency_ns: us_to_ns(read_latency_us),
        write_latency_ns: us_to_ns(write_latency_us),
        media_spread_pct,
    };
    let hostile = s.hostile.as_ref().map(|h| hostile(doc, i, h)).transpose()?;
    let dma_mask_bits = dev.int(
        "dma_mask_bits",
        s.dma_mask_bits.unwrap_or(d::NVME_DMA_MASK_BITS.0),
        32..=64,
        "bits",
    )?;
    let dma_link = super::dma_link(&dev, s.dma_outstanding_pages, s.relaxed_ordering)?;
    Ok(NvmeSetup {
        params,
        coalescing,
        hostile,
        dma_mask_bits,
        dma_link,
    })
}

// `[device.hostile]`: a hostile NVMe device (devices::hostile), fio only.

/// `[device.hostile]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostileSpec {
    #[serde(default)]
    probe_bytes: Option<u64>,
    #[serde(default)]
    neighbour_window_bytes: Option<u64>,
    #[serde(default)]
    neighbour_every: Option<u64>,
}

/// Validates device `i`'s `[device.hostile]` table (defaults: [`d::HOSTILE_PROBE_BYTES`],
/// [`d::HOSTILE_NEIGHBOUR_WINDOW_BYTES`], [`d::HOSTILE_NEIGHBOUR_EVERY`]).
fn hostile(
    doc: &TomlDoc<'_>,
    i: usize,
    s: &HostileSpec,
) -> Result<crate::devices::hostile::HostileParams, InputError> {
    let t = Fields::new(doc, format!("device[{i}].hostile"));
    Ok(crate::devices::hostile::HostileParams {
        probe_bytes: t.int(
            "probe_bytes",
            s.probe_bytes.unwrap_or(d::HOSTILE_PROBE_BYTES.0),
            1..=1 << 20,
            "bytes",
        )?,
        neighbour_window: t.int(
            "neighbour_window_bytes",
            s.neighbour_window_bytes
                .unwrap_or(d::HOSTILE_NEIGHBOUR_WINDOW_BYTES.0),
            1..=16 << 20,
            "bytes",
        )?,
        neighbour_every: t.int(
            "neighbour_every",
            s.neighbour_every.unwrap_or(d::HOSTILE_NEIGHBOUR_EVERY.0),
            1..=1_000_000,
            "(probe around every n-th buffer mapped)",
        )?,
    })
}

/// Refuses `[device.hostile]` outside fio: only fio's block path runs the probes.
pub(in crate::lab::spec) fn hostile_needs_fio(
    doc: &TomlDoc<'_>,
    s: &LabScenario,
) -> Result<(), InputError> {
    if let (Devices::Nvme(devs), false) = (&s.devices, matches!(s.workload, Workload::Fio(_))) {
        if let Some(i) = devs.iter().position(|d| d.hostile.is_some()) {
            return Err(doc.field_error(
                &format!("device[{i}].hostile"),
                format!(
                    "applies to fio workloads only (the probes run on fio's block path), not {}",
                    s.workload.kind()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;

    fn nvme_of(text: &str) -> Vec<NvmeSetup> {
        variant!(ok(text).devices, Devices::Nvme)
    }

    #[test]
    fn nvme_fields_set_the_device_with_defaults() {
        let d0 = nvme_of(FIO_NVME)[0];
        assert_eq!(d0.params.io_queues, d::NVME_IO_QUEUES.0.min(8));
        assert_eq!(d0.params.max_iops, d::NVME_MAX_IOPS.0);
        assert_eq!(d0.params.bandwidth, d::NVME_BANDWIDTH_GB_PER_S.0 * 1e9);
        assert_eq!(d0.coalescing.threshold, d::NVME_COALESCING.0 .0);
        let text = with(
            FIO_NVME,
            "device",
            "io_queues = 64\nread_latency_us = 80.5\ncoalesce_threshold = 7\ncoalesce_time_100us = 2",
        );
        let d0 = nvme_of(&text)[0];
        // Linux creates one queue pair per CPU, up to the controller's count.
        assert_eq!(d0.params.io_queues, 8);
        assert_eq!(d0.params.read_latency_ns, 80_500);
        assert_eq!((d0.coalescing.threshold, d0.coalescing.time_100us), (7, 2));
    }

    #[test]
    fn a_named_drive_gives_its_data_sheet_figures_and_fields_still_win() {
        let d0 = nvme_of(&with(FIO_NVME, "device", "model = \"micron-9550\""))[0];
        assert_eq!(d0.params.max_iops, 3_300_000.0);
        assert_eq!(d0.params.bandwidth, 14.0e9);
        assert_eq!(d0.params.read_latency_ns, 60_000);
        assert_eq!(d0.params.write_latency_ns, 15_000);
        let d0 = nvme_of(&with(
            FIO_NVME,
            "device",
            "model = \"samsung-pm1743\"\nmax_iops = 2000000",
        ))[0];
        assert_eq!(d0.params.max_iops, 2_000_000.0);
        assert_eq!(d0.params.bandwidth, 13.0e9);
        // Every preset's figures pass the fields' own checks and have sources.
        for p in crate::lab::presets::NVME {
            let d0 = nvme_of(&with(
                FIO_NVME,
                "device",
                &format!("model = \"{}\"", p.name),
            ))[0];
            assert_eq!(d0.params.max_iops, p.max_iops.0, "{}", p.name);
            for src in [p.max_iops.1, p.bandwidth_gb_per_s.1, p.read_latency_us.1] {
                assert!(!src.is_empty(), "{}", p.name);
            }
        }
        refused(
            &with(FIO_NVME, "device", "model = \"floppy\""),
            "device[0].model",
            "unknown NVMe drive \"floppy\": expected one of \"huawei-es3000-v2\", \"micron-9400\"",
        );
    }

    #[test]
    fn nvme_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(FIO_NVME, "device", "io_queues = 0"),
            "device[0].io_queues",
            &format!("expected 1..={MAX_DEVICE_QUEUES} (cap MAX_DEVICE_QUEUES), got 0"),
        );
        refused(
            &with(FIO_NVME, "device", "max_iops = 0.5"),
            "device[0].max_iops",
            "expected a number in 1..=100000000, got 0.5",
        );
        refused(
            &with(
                FIO_NVME,
                "device",
                "coalesce_threshold = 256\ncoalesce_time_100us = 1",
            ),
            "device[0].coalesce_threshold",
            "expected 0..=255 (the feature's 8-bit THR, 0's based), got 256",
        );
        refused(
            &with(FIO_NVME, "device", "max_iops = \"fast\""),
            "device[0].max_iops",
            "invalid type: string \"fast\", expected a number",
        );
        refused(
            &with(FIO_NVME, "device", "namespaces = 2"),
            "device[0].namespaces",
            "unknown field `namespaces`, expected one of `kind`, `model`, `io_queues`",
        );
    }

    #[test]
    fn a_hostile_device_is_an_option_of_fio_s_nvme() {
        assert_eq!(
            nvme_of(FIO_NVME)[0].hostile,
            None,
            "an honest device by default"
        );
        let d0 = nvme_of(&with(FIO_NVME, "device", "hostile = { probe_bytes = 64 }"))[0];
        let h = d0.hostile.expect("hostile");
        assert_eq!(h.probe_bytes, 64);
        assert_eq!(
            (h.neighbour_window, h.neighbour_every),
            (
                d::HOSTILE_NEIGHBOUR_WINDOW_BYTES.0,
                d::HOSTILE_NEIGHBOUR_EVERY.0
            )
        );
        refused(
            &with(FIO_NVME, "device", "hostile = { probe_bytes = 0 }"),
            "device[0].hostile.probe_bytes",
            "expected 1..=1048576 bytes, got 0",
        );
        refused(
            &with(FIO_NVME, "device", "hostile = { probes = 1 }"),
            "device[0].hostile.probes",
            "unknown field `probes`, expected one of `probe_bytes`",
        );
        refused(
            &with(MAP_BENCH, "device", "hostile = {}"),
            "device[0].hostile",
            "applies to fio workloads only (the probes run on fio's block path), not dma_map_benchmark",
        );
    }

    #[test]
    fn interrupt_coalescing_takes_both_fields() {
        refused(
            &with(FIO_NVME, "device", "coalesce_threshold = 7"),
            "device[0].coalesce_time_100us",
            "missing: Interrupt Coalescing (feature 08h) takes coalesce_threshold and coalesce_time_100us together",
        );
        refused(
            &with(FIO_NVME, "device", "coalesce_time_100us = 1"),
            "device[0].coalesce_threshold",
            "missing: Interrupt Coalescing",
        );
    }
}
