//! `[[device]]` of kind `sas`: a SAS HBA with its disks.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::device::{BlockSpec, Devices};
use crate::lab::spec::fields::{us_to_ns, Fields};
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct SasSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    disks: Option<usize>,
    #[serde(default)]
    completion_queues: Option<usize>,
    #[serde(default)]
    hba_command_ns: Option<f64>,
    #[serde(default)]
    disk_read_latency_us: Option<f64>,
    #[serde(default)]
    disk_write_latency_us: Option<f64>,
    #[serde(default)]
    disk_max_iops: Option<f64>,
    #[serde(default)]
    link_gb_per_s: Option<f64>,
    #[serde(default)]
    submit_ns: Option<u64>,
    #[serde(default)]
    complete_ns: Option<u64>,
    #[serde(default)]
    iommu_instance: Option<usize>,
}

impl BlockSpec for SasSpec {
    fn devices(doc: &TomlDoc<'_>, specs: &[Self], _cpus: usize) -> Result<Devices, InputError> {
        let devs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| sas(doc, i, s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Devices::Sas(devs))
    }

    fn driver_ns(&self, _profile: &crate::cost::PlatformProfile) -> (u64, u64) {
        (
            self.submit_ns.unwrap_or(d::SAS_SUBMIT_NS.0),
            self.complete_ns.unwrap_or(d::SAS_COMPLETE_NS.0),
        )
    }

    fn iommu_instance(&self) -> Option<usize> {
        self.iommu_instance
    }
}

fn sas(
    doc: &TomlDoc<'_>,
    i: usize,
    s: &SasSpec,
) -> Result<crate::devices::sas::SasParams, InputError> {
    let dev = Fields::new(doc, format!("device[{i}]"));
    let disks = dev.int(
        "disks",
        s.disks.unwrap_or(d::SAS_DISKS.0),
        1..=MAX_DISKS,
        "(cap MAX_DISKS)",
    )?;
    let completion_queues = dev.int(
        "completion_queues",
        s.completion_queues.unwrap_or(d::SAS_COMPLETION_QUEUES.0),
        1..=MAX_DEVICE_QUEUES,
        "(cap MAX_DEVICE_QUEUES)",
    )?;
    #[rustfmt::skip]
    let [hba_command_ns, read_us, write_us, disk_max_iops, link_gb_per_s] = dev.reals([
        ("hba_command_ns", s.hba_command_ns, d::SAS_HBA_COMMAND_NS, 0.0..=1e6),
        ("disk_read_latency_us", s.disk_read_latency_us, d::SAS_DISK_READ_LATENCY_US, 0.0..=1e6),
        ("disk_write_latency_us", s.disk_write_latency_us, d::SAS_DISK_WRITE_LATENCY_US, 0.0..=1e6),
        ("disk_max_iops", s.disk_max_iops, d::SAS_DISK_MAX_IOPS, 1.0..=1e8),
        ("link_gb_per_s", s.link_gb_per_s, d::SAS_LINK_GB_PER_S, 0.001..=1000.0),
    ])?;
    Ok(crate::devices::sas::SasParams {
        disks,
        completion_queues,
        hba_command_ns,
        disk_read_latency_ns: us_to_ns(read_us),
        disk_write_latency_ns: us_to_ns(write_us),
        disk_max_iops,
        link_bandwidth: link_gb_per_s * 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;

    fn sas_of(text: &str) -> crate::devices::sas::SasParams {
        variant!(ok(text).devices, Devices::Sas)[0]
    }

    #[test]
    fn sas_fields_set_the_hba_with_defaults() {
        let p = sas_of(FIO_SAS);
        assert_eq!(
            (p.disks, p.completion_queues),
            (d::SAS_DISKS.0, d::SAS_COMPLETION_QUEUES.0)
        );
        assert_eq!(p.hba_command_ns, d::SAS_HBA_COMMAND_NS.0);
        assert_eq!(p.link_bandwidth, d::SAS_LINK_GB_PER_S.0 * 1e9);
        let p = sas_of(&with(
            FIO_SAS,
            "device",
            "disks = 4\ndisk_read_latency_us = 100\ndisk_write_latency_us = 0.25\nlink_gb_per_s = 2",
        ));
        assert_eq!(p.disks, 4);
        assert_eq!(
            (p.disk_read_latency_ns, p.disk_write_latency_ns),
            (100_000, 250)
        );
        assert_eq!(p.link_bandwidth, 2e9);
    }

    #[test]
    fn sas_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(FIO_SAS, "device", "disks = 0"),
            "device[0].disks",
            &format!("expected 1..={MAX_DISKS} (cap MAX_DISKS), got 0"),
        );
        // Two bad reals: the first in the table is the one reported.
        refused(
            &with(FIO_SAS, "device", "link_gb_per_s = 0\ndisk_max_iops = 0"),
            "device[0].disk_max_iops",
            "expected a number in 1..=100000000, got 0",
        );
        refused(
            &with(FIO_SAS, "device", "hba_command_ns = \"x\""),
            "device[0].hba_command_ns",
            "invalid type: string \"x\", expected a number",
        );
        refused(
            &with(FIO_SAS, "device", "io_queues = 4"),
            "device[0].io_queues",
            "unknown field `io_queues`, expected one of `kind`, `disks`",
        );
    }
}
