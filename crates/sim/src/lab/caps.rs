//! Caps on everything a workload scenario can grow. Each is checked while validating the
//! file, and exceeding one is an input error naming the field, the cap and its value.
//!
//! The caps keep one run within this machine's means (memory, a few seconds of host time
//! per configuration) whatever a scenario asks for; they are not limits of the modelled
//! hardware.

/// Virtual CPUs of the machine (`machine.cpus`).
pub const MAX_CPUS: usize = 1024;
/// Memory of the machine in GiB (`machine.memory_gib`): 64 TiB. Memory is sparse, so the
/// cap bounds address arithmetic, not host memory.
pub const MAX_MEMORY_GIB: u64 = 64 * 1024;
/// RAM banks of the machine (`machine.memory_banks`).
pub const MAX_MEMORY_BANKS: usize = 64;
/// Devices of one scenario (`[[device]]` entries).
pub const MAX_DEVICES: usize = 16;
/// I/Os each fio job keeps in flight (`workload.iodepth`), and a device queue's depth.
pub const MAX_IODEPTH: u32 = 4096;
/// Total I/Os in flight over all jobs (`numjobs * iodepth`): bounds the buffers mapped at
/// once and the engine's completion channels.
pub const MAX_INFLIGHT: u64 = 1 << 18;
/// fio jobs, bonnie seekers, netperf threads (`workload.numjobs`, `workload.threads`).
pub const MAX_THREADS: u32 = 1024;
/// Virtual run length (ramp plus measured time, or a netperf run) in ms: 10 s.
pub const MAX_RUN_MS: u64 = 10_000;
/// fio block size (`workload.bs`): 16 MiB.
pub const MAX_BLOCK_SIZE: u64 = 16 << 20;
/// fio target size (`workload.size_gib`): 1 PiB.
pub const MAX_TARGET_GIB: u64 = 1 << 20;
/// bonnie file size (`workload.file_mib`): 1 GiB moved through the modelled page cache (about
/// 16 s of host time per run).
pub const MAX_FILE_MIB: u64 = 1024;
/// Command-queue size (`iommu.cmdq_log2size`): 2^16 slots.
pub const MAX_CMDQ_LOG2SIZE: u32 = 16;
/// Lazy flush-queue slots per CPU (`iommu.flush_queue_size`).
pub const MAX_FLUSH_QUEUE: usize = 1 << 16;
/// NVMe I/O queue pairs, SAS completion queues (`device.io_queues`, `device.completion_queues`).
pub const MAX_DEVICE_QUEUES: usize = 4096;
/// Disks behind one SAS HBA (`device.disks`).
pub const MAX_DISKS: usize = 1024;
/// Repetitions of a scenario (`--runs`).
pub const MAX_RUNS: u32 = 100;
/// re-aim users of one ramp point (`workload.start`, `workload.end`).
pub const MAX_USERS: u32 = 5000;
/// User counts of one re-aim ramp (each is one simulation per run).
pub const MAX_RAMP_POINTS: usize = 64;
/// Tasks of a re-aim workfile (`[[workload.task]]`).
pub const MAX_TASKS: usize = 256;
/// Task runs of a whole re-aim ramp (the sum over user counts of users x the workfile's
/// weight): bounds host time (about 2 s per million here).
pub const MAX_TASK_RUNS: u64 = 2_000_000;
