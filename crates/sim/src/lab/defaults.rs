//! Defaults of every optional scenario field, each with its source (a citation, or an
//! assumption with its reasoning). The block-stack ones are those the smmuv3-cmdq experiment
//! runs with (scenarios/experiments/smmuv3-cmdq.toml; argued in docs/model/smmuv3-cmdq.md);
//! docs/SCENARIOS.md lists them all.
//!
//! Each constant is `(value, source)`.

/// A default value and where it comes from.
pub type Sourced<T> = (T, &'static str);

/// `machine.memory_gib`.
pub const MEMORY_GIB: Sourced<u64> = (
    64,
    "assumption: a server of the modelled platforms' class; memory only bounds where buffers live (memory is sparse)",
);

/// `kernel.version`: the Linux release whose DMA-path algorithms the lab runs.
pub const KERNEL_VERSION: Sourced<&str> = (
    "6.12",
    "the newest long-term release (December 2024); docs/model/kernel-versions.md lists what each release changes",
);

/// `iommu.cmdq` when the kernel release does not decide it: the release's own producer
/// (`iolab_iommu::linux::DmaPathVariants::cmdq`) is the default.
pub const CMDQ: Sourced<&str> = (
    "lockfree",
    "Linux 5.4 onwards uses the lock-free batched command queue (commit 587e6c10a7ce, docs/model/kernel-versions.md); earlier releases the spinlock one",
);
/// `iommu.cmdq_log2size`.
pub const CMDQ_LOG2SIZE: Sourced<u32> = (
    8,
    "RESEARCH.md [src]: the pre-2019 Linux driver's queue of 256 entries; the functional ring uses the same size (as scenarios/experiments/smmuv3-cmdq.toml)",
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
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): io_submit per iocb: aio set-up, direct-I/O bio build, blk-mq tag and request set-up, ~6000 cycles on Cortex-A72",
);
/// `kernel.block_complete_ns`.
pub const BLOCK_COMPLETE_NS: Sourced<u64> = (
    6450,
    "fitted in an earlier calibration of the smmuv3-cmdq experiment against its no-IOMMU SAS row (918K IOPS on D05; docs/model/smmuv3-cmdq.md, session 2), since superseded there by a fitted hisi_sas hba_command_ns, the experiment setting 3000 (scenarios/experiments/smmuv3-cmdq.toml); kept as the lab default until issue 16's re-fit: request completion, bio end, aio completion and wake-up of the fio thread",
);
/// `kernel.irq_entry_ns`.
pub const IRQ_ENTRY_NS: Sourced<u64> = (
    1000,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): GICv3 interrupt entry, acknowledge, dispatch and exit, ~2400 cycles",
);

/// NVMe `device.io_queues`.
pub const NVME_IO_QUEUES: Sourced<usize> = (
    64,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): an enterprise NVMe controller offers at least 64 I/O queue pairs",
);
/// NVMe `device.max_iops`.
pub const NVME_MAX_IOPS: Sourced<f64> = (
    770_000.0,
    "Huawei ES3000 V2 PCIe SSD spec sheet (slideplayer.com/slide/10360121): 770K stable 4 KiB random-read IOPS (as scenarios/experiments/smmuv3-cmdq.toml)",
);
/// NVMe `device.bandwidth_gb_per_s`.
pub const NVME_BANDWIDTH_GB_PER_S: Sourced<f64> =
    (3.2, "assumption: PCIe 3.0 x4 less protocol overhead");
/// NVMe `device.read_latency_us`.
pub const NVME_READ_LATENCY_US: Sourced<f64> = (
    85.0,
    "assumption: TLC/MLC NAND page read (tR ~60-80 us) plus controller overhead (as scenarios/experiments/smmuv3-cmdq.toml)",
);
/// NVMe `device.write_latency_us`.
pub const NVME_WRITE_LATENCY_US: Sourced<f64> = (
    20.0,
    "assumption: writes complete from the controller's protected DRAM cache",
);
/// NVMe `device.submit_ns`.
pub const NVME_SUBMIT_NS: Sourced<u64> = (
    600,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): nvme_queue_rq builds the command and PRP, copies it into the SQ (~1400 cycles); the doorbell is the profile's mmio.write",
);
/// NVMe `device.complete_ns`.
pub const NVME_COMPLETE_NS: Sourced<u64> = (
    500,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): nvme_process_cq per entry (~1200 cycles)",
);

/// NVMe `device.coalesce_threshold` and `device.coalesce_time_100us`: Interrupt
/// Coalescing (Set Features, Feature ID 08h) off.
pub const NVME_COALESCING: Sourced<(u8, u8)> = (
    (0, 0),
    "NVMe 1.4 section 5.21.1.8: Interrupt Coalescing (feature 08h) resets to THR 0 and TIME 0, no coalescing; Linux nvme-pci never sets the feature",
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
    "assumption: hisi_sas v2 per-command processing ~0.4 us (the smmuv3-cmdq experiment fits 1089 ns for its D05 array instead, scenarios/experiments/smmuv3-cmdq.toml)",
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
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): SCSI dispatch, libsas and hisi_sas slot set-up (~4800 cycles)",
);
/// SAS `device.complete_ns`.
pub const SAS_COMPLETE_NS: Sourced<u64> = (
    1500,
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): hisi_sas slot completion and SCSI mid-layer completion (~3600 cycles)",
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
    "assumption (as scenarios/experiments/smmuv3-cmdq.toml): fio's own issue and reap bookkeeping per I/O, ~1200 cycles",
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

// ---------------------------------------------------------------------------------------
// The SCSI/SAS disk of re-aim scenarios (devices::scsi): the zx1 set-up's LSI 53c1030 HBA
// and Seagate Cheetah 15K.3 of scenarios/sba-vmerge.toml, whose values are datasheet and
// driver facts or stated assumptions there (none is fitted to a published result).
// ---------------------------------------------------------------------------------------

/// scsi `device.bus_mb_per_s`.
pub const SCSI_BUS_MB_PER_S: Sourced<f64> = (
    160.0,
    "Ultra160 data phase, 160 MB/s (scenarios/sba-vmerge.toml); a SAS-2 link is 600 MB/s (6 Gb/s, 8b/10b)",
);
/// scsi `device.hba_command_us`.
pub const SCSI_HBA_COMMAND_US: Sourced<f64> = (
    25.0,
    "assumption (scenarios/sba-vmerge.toml): LSI Fusion-MPT firmware handles ~40K commands/s",
);
/// scsi `device.hba_per_sge_ns`.
pub const SCSI_HBA_PER_SGE_NS: Sourced<f64> = (
    150.0,
    "assumption (scenarios/sba-vmerge.toml): the IOC reads one SG element and programs its DMA engine",
);
/// scsi `device.sg_tablesize`.
pub const SCSI_SG_TABLESIZE: Sourced<usize> = (
    40,
    "drivers/message/fusion/mptbase.h MPT_SCSI_SG_DEPTH = 40 (scenarios/sba-vmerge.toml)",
);
/// scsi `device.max_sectors`.
pub const SCSI_MAX_SECTORS: Sourced<u64> =
    (8192, "mptscsih host template .max_sectors = 8192 (4 MiB)");
/// scsi `device.max_segment_kib`.
pub const SCSI_MAX_SEGMENT_KIB: Sourced<u64> = (64, "Linux block layer MAX_SEGMENT_SIZE = 65536");
/// scsi `device.submit_kcycles`.
pub const SCSI_SUBMIT_KCYCLES: Sourced<f64> = (
    15.0,
    "assumption (scenarios/sba-vmerge.toml): make_request, elevator, SCSI mid-layer and the driver's queuecommand, ~15,000 cycles at the profile's clock",
);
/// scsi `device.per_sge_cycles`.
pub const SCSI_PER_SGE_CYCLES: Sourced<f64> = (
    60.0,
    "assumption (scenarios/sba-vmerge.toml): the driver writes one 64-bit SG element into the frame, ~60 cycles",
);
/// scsi `device.complete_kcycles`.
pub const SCSI_COMPLETE_KCYCLES: Sourced<f64> = (
    20.0,
    "assumption (scenarios/sba-vmerge.toml): interrupt, reply handling, scsi_done and bio end_io, ~20,000 cycles",
);
/// scsi `device.capacity_gb`.
pub const SCSI_CAPACITY_GB: Sourced<f64> =
    (73.4, "Seagate Cheetah 15K.3 ST373453LC data sheet: 73.4 GB");
/// scsi `device.rpm`.
pub const SCSI_RPM: Sourced<f64> = (15000.0, "Seagate Cheetah 15K.3 data sheet: 15,000 rpm");
/// scsi `device.seek_read_ms`.
pub const SCSI_SEEK_READ_MS: Sourced<f64> = (
    3.6,
    "Seagate Cheetah 15K.3 data sheet: average read seek 3.6 ms",
);
/// scsi `device.seek_write_ms`.
pub const SCSI_SEEK_WRITE_MS: Sourced<f64> = (
    4.0,
    "Seagate Cheetah 15K.3 data sheet: average write seek 4.0 ms",
);
/// scsi `device.media_mb_per_s`.
pub const SCSI_MEDIA_MB_PER_S: Sourced<f64> = (
    58.0,
    "Seagate Cheetah 15K.3 data sheet: sustained 49-75 MB/s; assumption: ~58 MB/s over random offsets",
);

// ---------------------------------------------------------------------------------------
// re-aim workload
// ---------------------------------------------------------------------------------------

/// reaim `workload.timeslice_ms`.
pub const REAIM_TIMESLICE_MS: Sourced<f64> = (
    10.0,
    "assumption: a CFS slice with a few runnable tasks per CPU (sched_latency 6 ms x (1 + log2 CPUs), divided among them) is of the order of 10 ms",
);
/// reaim `workload.jitter_pct`.
pub const REAIM_JITTER_PCT: Sourced<f64> = (
    20.0,
    "assumption (scenarios/sba-vmerge.toml): a task's CPU cost varies +-20% from run to run (cache and TLB state)",
);
/// reaim `workload.fs_block`.
pub const REAIM_FS_BLOCK: Sourced<u64> = (4096, "assumption: mke2fs's default 4 KiB blocks");
/// reaim `workload.journal_blocks`.
pub const REAIM_JOURNAL_BLOCKS: Sourced<u64> = (
    3,
    "assumption (scenarios/sba-vmerge.toml): an ext3 fsync of a small file journals the inode, a bitmap and a descriptor block, then a commit block",
);
/// The kernel's page size for re-aim's page cache, bytes.
pub const REAIM_PAGE: Sourced<u64> = (4096, "assumption: 4 KiB kernel pages");

/// One task of the default re-aim workfile: name, class, weight, user and system CPU per run
/// in thousands of cycles (converted at the profile's `cpu.clock_ghz`), bytes written and
/// fsynced per run, source.
pub type DefaultTask = (&'static str, u32, f64, f64, u64, &'static str);

/// The default workfile `lab_mix`: AIM7 task classes (CPU, IPC, fork/exec, page-cache and
/// synchronous disk) with absolute costs, each an assumption stated with its reasoning. No
/// published result is an input (the sba-vmerge experiment instead scales its workfile's
/// relative costs to one published row).
pub const REAIM_TASKS: &[DefaultTask] = &[
    ("add_int", 6, 2000.0, 5.0, 0, "assumption (CPU): AIM's integer loop, ~10^6 iterations of ~2 cycles"),
    ("sort_rtns_1", 6, 4000.0, 10.0, 0, "assumption (CPU): in-memory sort of ~10^5 keys, n log n ~ 1.7M compares at ~2.5 cycles"),
    ("string_rtns", 6, 3000.0, 10.0, 0, "assumption (CPU): string routines over ~1 MB, ~3 cycles a byte"),
    ("shared_memory", 10, 1000.0, 400.0, 0, "assumption (IPC): ~1000 semaphore and shared-memory operations, ~400 cycles of syscall each"),
    ("tcp_test", 6, 200.0, 1500.0, 0, "assumption (IPC): ~100 loopback TCP round trips, ~15,000 cycles of stack each"),
    ("fork_test", 4, 50.0, 300.0, 0, "assumption (fork/exec): fork, exit and wait of a small process, ~300,000 cycles (lmbench's fork latency is of the order of 100 us on a 2-3 GHz core)"),
    ("exec_test", 3, 100.0, 800.0, 0, "assumption (fork/exec): fork, execve of a small binary, exit and wait, ~3x a fork"),
    ("disk_rr", 6, 300.0, 600.0, 0, "assumption (page cache): random reads of a cached file, ~600,000 cycles of copy and lookup"),
    ("sync_disk_update", 3, 200.0, 300.0, 80 << 10, "assumption (disk): update an 80 KiB file and fsync it (FILESIZE 80k of the OSDL STP re-aim configuration, scenarios/sba-vmerge.toml)"),
    ("sync_disk_wrt", 3, 200.0, 300.0, 80 << 10, "assumption (disk): write an 80 KiB file sequentially and fsync it"),
];
