//! Defaults of every optional scenario field, each with its source (a citation, or an
//! assumption with its reasoning). Most come from the bundled experiment scenarios
//! (scenarios/smmuv3-cmdq.toml), where they are argued; docs/SCENARIOS.md lists them all.
//!
//! Each constant is `(value, source)`.

/// A default value and where it comes from.
pub type Sourced<T> = (T, &'static str);

/// `machine.memory_gib`.
pub const MEMORY_GIB: Sourced<u64> = (
    64,
    "assumption: a server of the modelled platforms' class; memory only bounds where buffers live (memory is sparse)",
);

/// `iommu.cmdq`.
pub const CMDQ: Sourced<&str> = (
    "lockfree",
    "Linux 5.3 onwards uses the lock-free batched command queue (RESEARCH.md [mail])",
);
/// `iommu.cmdq_log2size`.
pub const CMDQ_LOG2SIZE: Sourced<u32> = (
    8,
    "RESEARCH.md [src]: the pre-2019 Linux driver's queue of 256 entries (scenarios/smmuv3-cmdq.toml)",
);
/// `iommu.cmdq_batch_max`.
pub const CMDQ_BATCH_MAX: Sourced<u32> = (
    64,
    "RESEARCH.md [mail]: the 2019 design submits commands in batches of up to 64 with one CMD_SYNC",
);
/// `iommu.flush_queue_size`.
pub const FLUSH_QUEUE_SIZE: Sourced<usize> = (
    256,
    "Linux drivers/iommu/dma-iommu.c IOVA_FQ_SIZE = 256 slots per CPU",
);
/// `iommu.flush_timeout_ms`.
pub const FLUSH_TIMEOUT_MS: Sourced<u64> = (
    10,
    "Linux drivers/iommu/dma-iommu.c IOVA_FQ_TIMEOUT = 10 ms",
);

/// `kernel.block_submit_ns`.
pub const BLOCK_SUBMIT_NS: Sourced<u64> = (
    2500,
    "assumption (scenarios/smmuv3-cmdq.toml): io_submit per iocb: aio set-up, direct-I/O bio build, blk-mq tag and request set-up, ~6000 cycles on Cortex-A72",
);
/// `kernel.block_complete_ns`.
pub const BLOCK_COMPLETE_NS: Sourced<u64> = (
    6450,
    "scenarios/smmuv3-cmdq.toml, calibrated there against one no-IOMMU row: request completion, bio end, aio completion and wake-up of the fio thread",
);
/// `kernel.irq_entry_ns`.
pub const IRQ_ENTRY_NS: Sourced<u64> = (
    1000,
    "assumption (scenarios/smmuv3-cmdq.toml): GICv3 interrupt entry, acknowledge, dispatch and exit, ~2400 cycles",
);

/// NVMe `device.io_queues`.
pub const NVME_IO_QUEUES: Sourced<usize> = (
    64,
    "assumption (scenarios/smmuv3-cmdq.toml): an enterprise NVMe controller offers at least 64 I/O queue pairs",
);
/// NVMe `device.max_iops`.
pub const NVME_MAX_IOPS: Sourced<f64> = (
    770_000.0,
    "Huawei ES3000 V2 spec sheet: 770K 4 KiB random-read IOPS (scenarios/smmuv3-cmdq.toml)",
);
/// NVMe `device.bandwidth_gb_per_s`.
pub const NVME_BANDWIDTH_GB_PER_S: Sourced<f64> =
    (3.2, "assumption: PCIe 3.0 x4 less protocol overhead");
/// NVMe `device.read_latency_us`.
pub const NVME_READ_LATENCY_US: Sourced<f64> = (
    85.0,
    "assumption: NAND page read plus controller overhead (scenarios/smmuv3-cmdq.toml)",
);
/// NVMe `device.write_latency_us`.
pub const NVME_WRITE_LATENCY_US: Sourced<f64> = (
    20.0,
    "assumption: writes complete from the controller's protected DRAM cache",
);
/// NVMe `device.submit_ns`.
pub const NVME_SUBMIT_NS: Sourced<u64> = (
    600,
    "assumption (scenarios/smmuv3-cmdq.toml): nvme_queue_rq builds the command and PRP, copies it into the SQ (~1400 cycles); the doorbell is the profile's mmio.write",
);
/// NVMe `device.complete_ns`.
pub const NVME_COMPLETE_NS: Sourced<u64> = (
    500,
    "assumption (scenarios/smmuv3-cmdq.toml): nvme_process_cq per entry (~1200 cycles)",
);

/// SAS `device.disks`.
pub const SAS_DISKS: Sourced<usize> = (8, "SEEDS.md #2: 8 SAS disks on D05");
/// SAS `device.completion_queues`.
pub const SAS_COMPLETION_QUEUES: Sourced<usize> = (
    16,
    "hisi_sas v2 hw: 16 delivery/completion queue pairs, one interrupt each",
);
/// SAS `device.hba_command_ns`.
pub const SAS_HBA_COMMAND_NS: Sourced<f64> = (
    400.0,
    "assumption (scenarios/smmuv3-cmdq.toml): hisi_sas v2 per-command processing ~0.4 us",
);
/// SAS `device.disk_read_latency_us`.
pub const SAS_DISK_READ_LATENCY_US: Sourced<f64> = (
    100.0,
    "assumption: 12 Gb/s SAS SSD 4 KiB random-read latency at depth",
);
/// SAS `device.disk_write_latency_us`.
pub const SAS_DISK_WRITE_LATENCY_US: Sourced<f64> =
    (30.0, "assumption: SAS SSD write into its protected cache");
/// SAS `device.disk_max_iops`.
pub const SAS_DISK_MAX_IOPS: Sourced<f64> = (
    200_000.0,
    "assumption: 12 Gb/s SAS SSD rated ~200K 4 KiB random-read IOPS",
);
/// SAS `device.link_gb_per_s`.
pub const SAS_LINK_GB_PER_S: Sourced<f64> = (1.2, "SAS-3: 12 Gb/s per phy with 8b/10b coding");
/// SAS `device.submit_ns`.
pub const SAS_SUBMIT_NS: Sourced<u64> = (
    2000,
    "assumption (scenarios/smmuv3-cmdq.toml): SCSI dispatch, libsas and hisi_sas slot set-up (~4800 cycles)",
);
/// SAS `device.complete_ns`.
pub const SAS_COMPLETE_NS: Sourced<u64> = (
    1500,
    "assumption (scenarios/smmuv3-cmdq.toml): hisi_sas slot completion and SCSI mid-layer completion (~3600 cycles)",
);

/// fio `workload.bs`.
pub const FIO_BS: Sourced<u64> = (4096, "fio's default block size (bs=4k)");
/// fio `workload.iodepth`.
pub const FIO_IODEPTH: Sourced<u32> = (1, "fio's default iodepth=1");
/// fio `workload.size_gib`.
pub const FIO_SIZE_GIB: Sourced<u64> = (
    100,
    "assumption: a target much larger than any cache, so random offsets do not repeat",
);
/// fio `workload.ramp_ms`.
pub const FIO_RAMP_MS: Sourced<u64> = (
    5,
    "assumption: long enough for every job to fill its queue before measuring",
);
/// fio `workload.user_ns_per_io`.
pub const FIO_USER_NS_PER_IO: Sourced<u64> = (
    500,
    "assumption (scenarios/smmuv3-cmdq.toml): fio's own issue and reap bookkeeping per I/O, ~1200 cycles",
);

/// SBA `iommu.delayed_frees`.
pub const SBA_DELAYED_FREES: Sourced<usize> = (
    64,
    "sba_iommu.c DELAYED_RESOURCE_CNT = 64 (RESEARCH.md [src]; scenarios/sba-vmerge.toml)",
);
/// SBA `iommu.page_size`.
pub const SBA_PAGE_SIZE: Sourced<u64> = (
    16384,
    "ia64 uses 16 KiB pages by default and sba_iommu.c's iovp_size is min(PAGE_SIZE, 64 KiB) (scenarios/sba-vmerge.toml)",
);
/// SBA IOV window: (base, size) in bytes.
pub const SBA_WINDOW: Sourced<(u64, u64)> = (
    (1 << 30, 1 << 30),
    "assumption (scenarios/sba-vmerge.toml): the IOV window at 1 GiB, 1 GiB large",
);
/// POWER `iommu.default_window_mib`.
pub const DEFAULT_WINDOW_MIB: Sourced<u64> = (
    2048,
    "RESEARCH.md: a 2 GB default window per host bridge on PowerVM (scenarios/pseries-ddw.toml)",
);
/// POWER `iommu.ddw_page_kib`.
pub const DDW_PAGE_KIB: Sourced<u64> = (
    64,
    "SEEDS.md #4: PowerVM offers at most 64 KiB TCEs to SR-IOV VFs' DDWs",
);
/// bonnie `workload.file_mib`.
pub const BONNIE_FILE_MIB: Sourced<u64> = (
    16,
    "assumption: a 16 MiB file runs in well under a second of host time; steady-state rates do not depend on it (the bundled ipmmu-usb scenario uses 64 MiB)",
);
