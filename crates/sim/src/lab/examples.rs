//! The example workload scenarios of scenarios/examples/, compiled into the binary so
//! `iolab run --example NAME` works from anywhere. Each runs in well under a second.

/// `(name, scenario text)` of every bundled example, in name order.
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "bonnie-nvme-smmuv3-strict",
        include_str!("../../../../scenarios/examples/bonnie-nvme-smmuv3-strict.toml"),
    ),
    (
        "bonnie-nvme-smmuv3-strict-198",
        include_str!("../../../../scenarios/examples/bonnie-nvme-smmuv3-strict-198.toml"),
    ),
    (
        "bonnie-sas-off",
        include_str!("../../../../scenarios/examples/bonnie-sas-off.toml"),
    ),
    (
        "bonnie-sas-smmuv3-strict",
        include_str!("../../../../scenarios/examples/bonnie-sas-smmuv3-strict.toml"),
    ),
    (
        "bonnie-scsi-off",
        include_str!("../../../../scenarios/examples/bonnie-scsi-off.toml"),
    ),
    (
        "bonnie-scsi-sba",
        include_str!("../../../../scenarios/examples/bonnie-scsi-sba.toml"),
    ),
    (
        "bonnie-usb-ipmmu",
        include_str!("../../../../scenarios/examples/bonnie-usb-ipmmu.toml"),
    ),
    (
        "bonnie-usb-off",
        include_str!("../../../../scenarios/examples/bonnie-usb-off.toml"),
    ),
    (
        "dma-map-benchmark-strict",
        include_str!("../../../../scenarios/examples/dma-map-benchmark-strict.toml"),
    ),
    (
        "fio-nvme-amdvi-strict",
        include_str!("../../../../scenarios/examples/fio-nvme-amdvi-strict.toml"),
    ),
    (
        "fio-nvme-lazy",
        include_str!("../../../../scenarios/examples/fio-nvme-lazy.toml"),
    ),
    (
        "fio-nvme-off",
        include_str!("../../../../scenarios/examples/fio-nvme-off.toml"),
    ),
    (
        "fio-nvme-smmuv3-lazy",
        include_str!("../../../../scenarios/examples/fio-nvme-smmuv3-lazy.toml"),
    ),
    (
        "fio-nvme-smmuv3-strict",
        include_str!("../../../../scenarios/examples/fio-nvme-smmuv3-strict.toml"),
    ),
    (
        "fio-nvme-strict",
        include_str!("../../../../scenarios/examples/fio-nvme-strict.toml"),
    ),
    (
        "fio-nvme-vtd-lazy",
        include_str!("../../../../scenarios/examples/fio-nvme-vtd-lazy.toml"),
    ),
    (
        "fio-nvme-vtd-strict",
        include_str!("../../../../scenarios/examples/fio-nvme-vtd-strict.toml"),
    ),
    (
        "fio-sas-lockfree",
        include_str!("../../../../scenarios/examples/fio-sas-lockfree.toml"),
    ),
    (
        "fio-sas-sba",
        include_str!("../../../../scenarios/examples/fio-sas-sba.toml"),
    ),
    (
        "fio-sas-spinlock",
        include_str!("../../../../scenarios/examples/fio-sas-spinlock.toml"),
    ),
    (
        "netperf-pseries-ddw",
        include_str!("../../../../scenarios/examples/netperf-pseries-ddw.toml"),
    ),
    (
        "netperf-pseries-default",
        include_str!("../../../../scenarios/examples/netperf-pseries-default.toml"),
    ),
    (
        "reaim-sas-smmuv3",
        include_str!("../../../../scenarios/examples/reaim-sas-smmuv3.toml"),
    ),
    (
        "reaim-scsi-off",
        include_str!("../../../../scenarios/examples/reaim-scsi-off.toml"),
    ),
    (
        "reaim-scsi-sba",
        include_str!("../../../../scenarios/examples/reaim-scsi-sba.toml"),
    ),
];

/// The text of the bundled example `name`.
pub fn example(name: &str) -> Option<&'static str> {
    EXAMPLES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The names of the bundled examples.
pub fn example_names() -> Vec<&'static str> {
    EXAMPLES.iter().map(|(n, _)| *n).collect()
}
