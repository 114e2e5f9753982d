//! `[[device]]` of kind `scsi`: one SCSI/SAS HBA with one rotating disk, and the block
//! layer's virtual merge on its queue (`kernel.virt_merge`).

use serde::Deserialize;

use crate::cost::PlatformProfile;
use crate::lab::defaults as d;
use crate::lab::spec::fields::Fields;
use crate::lab::spec::iommu::{sba_maps_lists, IommuSetup};
use crate::lab::spec::kernel::KernelSpec;
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct ScsiSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    bus_mb_per_s: Option<f64>,
    #[serde(default)]
    hba_command_us: Option<f64>,
    #[serde(default)]
    hba_per_sge_ns: Option<f64>,
    #[serde(default)]
    sg_tablesize: Option<usize>,
    #[serde(default)]
    max_sectors: Option<u64>,
    #[serde(default)]
    max_segment_kib: Option<u64>,
    #[serde(default)]
    submit_kcycles: Option<f64>,
    #[serde(default)]
    per_sge_cycles: Option<f64>,
    #[serde(default)]
    complete_kcycles: Option<f64>,
    #[serde(default)]
    capacity_gb: Option<f64>,
    #[serde(default)]
    rpm: Option<f64>,
    #[serde(default)]
    seek_read_ms: Option<f64>,
    #[serde(default)]
    seek_write_ms: Option<f64>,
    #[serde(default)]
    media_mb_per_s: Option<f64>,
    #[serde(default)]
    dma_mask_bits: Option<u32>,
}

/// A validated SCSI/SAS HBA with its disk ([`crate::devices::scsi`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ScsiSetup {
    /// HBA, bus, driver and disk timing.
    pub params: crate::devices::scsi::ScsiParams,
    /// The block layer's queue limits.
    pub limits: crate::block::QueueLimits,
    /// Disk capacity, bytes.
    pub disk_bytes: u64,
    /// The HBA's DMA mask, bits.
    pub dma_mask_bits: u32,
}

/// `kernel.virt_merge` on a scsi device: with it the block layer counts pieces that meet at
/// an IOMMU page boundary as one segment (`BIO_VMERGE_BOUNDARY` = the SBA's page size), which
/// is only right where the IOMMU then coalesces them (the SBA with `kernel.sba_coalesce`).
pub(in crate::lab::spec) fn virt_merge(
    doc: &TomlDoc<'_>,
    k: &KernelSpec,
    iommu: &IommuSetup,
    scsi: &mut ScsiSetup,
) -> Result<(), InputError> {
    if !k.virt_merge.unwrap_or(d::VIRT_MERGE.0) {
        scsi.limits.virt_merge_granule = None;
        return Ok(());
    }
    if !sba_maps_lists(iommu) {
        return Err(doc.field_error(
            "kernel.virt_merge",
            format!(
                "needs an IOMMU that coalesces what the block layer merged: iommu.model = \"sba\" in mode translated or bypass, got {} in mode {}",
                iommu.model.name(),
                iommu.mode.name()
            ),
        ));
    }
    if !iommu.sba_coalesce {
        return Err(doc.field_error(
            "kernel.virt_merge",
            "needs kernel.sba_coalesce = true: a request the block layer counted as one segment would reach the HBA as several DMA segments, past sg_tablesize (Linux sets BIO_VMERGE_BOUNDARY only where the IOMMU merges)",
        ));
    }
    scsi.limits.virt_merge_granule = Some(iommu.sba_page_size);
    Ok(())
}

pub(in crate::lab::spec) fn scsi(
    doc: &TomlDoc<'_>,
    s: &ScsiSpec,
    profile: &PlatformProfile,
) -> Result<ScsiSetup, InputError> {
    let dev = Fields::new(doc, "device[0]");
    let ghz = profile.cpu.clock_ghz;
    #[rustfmt::skip]
    let [bus, per_cmd, hba_sge, submit, drv_sge, complete, cap, rpm, seek_r, seek_w, media] =
        dev.reals([
            ("bus_mb_per_s", s.bus_mb_per_s, d::SCSI_BUS_MB_PER_S, 1.0..=1e6),
            ("hba_command_us", s.hba_command_us, d::SCSI_HBA_COMMAND_US, 0.0..=1e6),
            ("hba_per_sge_ns", s.hba_per_sge_ns, d::SCSI_HBA_PER_SGE_NS, 0.0..=1e6),
            ("submit_kcycles", s.submit_kcycles, d::SCSI_SUBMIT_KCYCLES, 0.0..=1e6),
            ("per_sge_cycles", s.per_sge_cycles, d::SCSI_PER_SGE_CYCLES, 0.0..=1e6),
            ("complete_kcycles", s.complete_kcycles, d::SCSI_COMPLETE_KCYCLES, 0.0..=1e6),
            ("capacity_gb", s.capacity_gb, d::SCSI_CAPACITY_GB, 1.0..=1e6),
            ("rpm", s.rpm, d::SCSI_RPM, 1000.0..=30_000.0),
            ("seek_read_ms", s.seek_read_ms, d::SCSI_SEEK_READ_MS, 0.0..=100.0),
            ("seek_write_ms", s.seek_write_ms, d::SCSI_SEEK_WRITE_MS, 0.0..=100.0),
            ("media_mb_per_s", s.media_mb_per_s, d::SCSI_MEDIA_MB_PER_S, 1.0..=1e5),
        ])?;
    let sg_tablesize = dev.int(
        "sg_tablesize",
        s.sg_tablesize.unwrap_or(d::SCSI_SG_TABLESIZE.0),
        1..=4096,
        "SG elements",
    )?;
    let max_sectors = dev.int(
        "max_sectors",
        s.max_sectors.unwrap_or(d::SCSI_MAX_SECTORS.0),
        8..=1 << 20,
        "sectors of 512 bytes",
    )?;
    let max_segment_kib = dev.int(
        "max_segment_kib",
        s.max_segment_kib.unwrap_or(d::SCSI_MAX_SEGMENT_KIB.0),
        4..=1 << 20,
        "KiB",
    )?;
    let dma_mask_bits = dev.int(
        "dma_mask_bits",
        s.dma_mask_bits.unwrap_or(d::SCSI_DMA_MASK_BITS.0),
        32..=64,
        "bits",
    )?;
    Ok(ScsiSetup {
        params: crate::devices::scsi::ScsiParams {
            bus_bytes_per_s: bus * 1e6,
            hba_per_command_ns: per_cmd * 1e3,
            hba_per_sge_ns: hba_sge,
            driver_submit_ns: submit * 1e3 / ghz,
            driver_per_sge_ns: drv_sge / ghz,
            driver_complete_ns: complete * 1e3 / ghz,
            seek_read_ns: seek_r * 1e6,
            seek_write_ns: seek_w * 1e6,
            revolution_ns: 60e9 / rpm,
            media_bytes_per_s: media * 1e6,
        },
        limits: crate::block::QueueLimits {
            max_segments: sg_tablesize,
            max_segment_size: max_segment_kib << 10,
            max_transfer: max_sectors * 512,
            virt_merge_granule: None,
        },
        disk_bytes: (cap * 1e9) as u64,
        dma_mask_bits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Devices;

    fn scsi_of(text: &str) -> ScsiSetup {
        *variant!(ok(text).devices, Devices::Scsi)
    }

    #[test]
    fn scsi_fields_set_the_hba_and_disk_with_defaults() {
        let s = scsi_of(REAIM_SCSI);
        assert_eq!(s.limits.max_segments, d::SCSI_SG_TABLESIZE.0);
        assert_eq!(s.limits.max_transfer, d::SCSI_MAX_SECTORS.0 * 512);
        assert_eq!(s.disk_bytes, (d::SCSI_CAPACITY_GB.0 * 1e9) as u64);
        assert_eq!(s.dma_mask_bits, d::SCSI_DMA_MASK_BITS.0);
        assert_eq!(s.limits.virt_merge_granule, None);
        let s = scsi_of(&with(
            REAIM_SCSI,
            "device",
            "rpm = 10000\nhba_command_us = 2.5\nseek_read_ms = 4\nbus_mb_per_s = 320",
        ));
        assert_eq!(s.params.revolution_ns, 6e6);
        assert_eq!(s.params.hba_per_command_ns, 2500.0);
        assert_eq!(s.params.seek_read_ns, 4e6);
        assert_eq!(s.params.bus_bytes_per_s, 320e6);
    }

    #[test]
    fn scsi_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(REAIM_SCSI, "device", "rpm = 100"),
            "device[0].rpm",
            "expected a number in 1000..=30000, got 100",
        );
        refused(
            &with(REAIM_SCSI, "device", "sg_tablesize = 0"),
            "device[0].sg_tablesize",
            "expected 1..=4096 SG elements, got 0",
        );
        refused(
            &with(REAIM_SCSI, "device", "sg_tablesize = \"x\""),
            "device[0].sg_tablesize",
            "invalid type: string \"x\", expected a non-negative integer",
        );
        refused(
            &with(REAIM_SCSI, "device", "disks = 2"),
            "device[0].disks",
            "unknown field `disks`, expected one of `kind`, `bus_mb_per_s`",
        );
    }

    #[test]
    fn virt_merge_needs_an_iommu_that_coalesces() {
        let s = scsi_of(&with(BONNIE_SCSI, "kernel", "virt_merge = true"));
        assert_eq!(s.limits.virt_merge_granule, Some(d::SBA_PAGE_SIZE.0));
        refused(
            &with(
                BONNIE_SCSI,
                "kernel",
                "virt_merge = true\nsba_coalesce = false",
            ),
            "kernel.virt_merge",
            "needs kernel.sba_coalesce = true",
        );
        let off = BONNIE_SCSI.replace("model = \"sba\"\nmode = \"translated\"", "model = \"none\"");
        refused(
            &with(&off, "kernel", "virt_merge = true"),
            "kernel.virt_merge",
            "needs an IOMMU that coalesces what the block layer merged: iommu.model = \"sba\" in mode translated or bypass, got none in mode off",
        );
    }
}
