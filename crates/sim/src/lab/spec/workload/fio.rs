//! `[workload]` of kind `fio`: jobs with I/Os in flight on block devices.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::fields::Fields;
use crate::lab::spec::{Common, BUFFER_BASE};
use crate::tomlfile::{InputError, TomlDoc};
use crate::workloads::fio::{EngineKind, IoEngine, RwPattern};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::lab::spec) struct FioSpec {
    #[allow(dead_code)]
    kind: String,
    rw: String,
    #[serde(default)]
    rwmixread: Option<u32>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    bs: Option<u64>,
    #[serde(default)]
    iodepth: Option<u32>,
    #[serde(default)]
    numjobs: Option<u32>,
    #[serde(default)]
    iodepth_batch_submit: Option<u32>,
    #[serde(default)]
    iodepth_batch_complete_min: Option<u32>,
    #[serde(default)]
    first_cpu: Option<usize>,
    #[serde(default)]
    size_gib: Option<u64>,
    runtime_ms: u64,
    #[serde(default)]
    ramp_ms: Option<u64>,
    #[serde(default)]
    user_ns_per_io: Option<u64>,
    #[serde(default)]
    exact_window: Option<bool>,
    #[serde(default)]
    ioengine: Option<String>,
    #[serde(default)]
    hipri: Option<bool>,
    #[serde(default)]
    sqthread_poll: Option<bool>,
    #[serde(default)]
    sqthread_poll_cpu: Option<usize>,
    #[serde(default)]
    fixedbufs: Option<bool>,
    #[serde(default)]
    registerfiles: Option<bool>,
}

/// A validated fio workload.
#[derive(Clone, Debug, PartialEq)]
pub struct FioSetup {
    /// Access pattern.
    pub rw: RwPattern,
    /// Percent reads for randrw.
    pub rwmixread: u32,
    /// Block size, bytes.
    pub bs: u64,
    /// I/Os in flight per job.
    pub iodepth: u32,
    /// Jobs.
    pub numjobs: u32,
    /// `iodepth_batch_submit`.
    pub batch_submit: u32,
    /// `iodepth_batch_complete_min`.
    pub batch_complete_min: u32,
    /// CPU of job 0 (job j runs on `first_cpu + j`).
    pub first_cpu: usize,
    /// Target size, bytes.
    pub size: u64,
    /// Measured time, ns.
    pub runtime_ns: u64,
    /// Ramp time, ns.
    pub ramp_ns: u64,
    /// fio's own user time per I/O step, ns.
    pub user_ns_per_io: u64,
    /// `exact_window`: measure right after `ramp_ns`, steady or not (otherwise the lab
    /// extends the ramp past a transient).
    pub exact_window: bool,
    /// `ioengine` and its options.
    pub engine: IoEngine,
    /// The CPU of each job's submission-polling thread (`sqthread_poll`; empty without).
    pub sq_cpus: Vec<usize>,
}

pub(in crate::lab::spec) fn fio(
    doc: &TomlDoc<'_>,
    s: &FioSpec,
    c: &Common,
) -> Result<FioSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    let rw = RwPattern::parse(&s.rw).ok_or_else(|| {
        doc.field_error(
            "workload.rw",
            format!(
                "unknown pattern \"{}\": expected read, write, randread, randwrite or randrw",
                s.rw
            ),
        )
    })?;
    if s.rwmixread.is_some() && rw != RwPattern::RandRw {
        return Err(doc.field_error("workload.rwmixread", "applies to rw = \"randrw\" only"));
    }
    let rwmixread = wl.int(
        "rwmixread",
        s.rwmixread.unwrap_or(50),
        0..=100,
        "percent reads",
    )?;
    let bs = s.bs.unwrap_or(d::FIO_BS.0);
    if bs == 0 || bs % 512 != 0 {
        return Err(doc.field_error(
            "workload.bs",
            format!("expected a non-zero multiple of 512 bytes, got {bs}"),
        ));
    }
    let bs = wl.int("bs", bs, 512..=MAX_BLOCK_SIZE, "bytes (cap MAX_BLOCK_SIZE)")?;
    let iodepth = wl.int(
        "iodepth",
        s.iodepth.unwrap_or(d::FIO_IODEPTH.0),
        1..=MAX_IODEPTH,
        "(cap MAX_IODEPTH)",
    )?;
    let engine = engine(doc, s, c)?;
    if engine.is_sync() && iodepth > 1 {
        return Err(doc.field_error(
            "workload.iodepth",
            format!(
                "{iodepth} with ioengine = \"{}\"{}: a synchronous engine keeps one I/O in flight per job (fio ignores iodepth); set workload.ioengine = \"libaio\" or \"io_uring\" for depth",
                engine.kind.name(),
                if s.ioengine.is_none() { " (fio's default)" } else { "" }
            ),
        ));
    }
    let first_cpu = s.first_cpu.unwrap_or(0);
    if first_cpu >= c.cpus {
        return Err(doc.field_error(
            "workload.first_cpu",
            format!("expected 0..{} (machine.cpus = {})", c.cpus, c.cpus),
        ));
    }
    let max_jobs = (c.cpus - first_cpu).min(MAX_THREADS as usize) as u32;
    let numjobs = wl.int(
        "numjobs",
        s.numjobs.unwrap_or(1),
        1..=max_jobs,
        "(one job per CPU from first_cpu; cap MAX_THREADS)",
    )?;
    let inflight = u64::from(numjobs) * u64::from(iodepth);
    if inflight > MAX_INFLIGHT {
        return Err(doc.field_error(
            "workload.iodepth",
            format!("numjobs x iodepth = {inflight} I/Os in flight exceeds the cap MAX_INFLIGHT = {MAX_INFLIGHT}"),
        ));
    }
    let buffers = inflight * bs.next_multiple_of(4096);
    if BUFFER_BASE + buffers > c.memory_bytes {
        return Err(doc.field_error(
            "machine.memory_gib",
            format!(
                "the workload's I/O buffers (numjobs x iodepth x bs = {} MiB above the first 4 GiB) do not fit in {} GiB",
                buffers >> 20,
                c.memory_bytes >> 30
            ),
        ));
    }
    let size_gib = wl.int(
        "size_gib",
        s.size_gib.unwrap_or(d::FIO_SIZE_GIB.0),
        1..=MAX_TARGET_GIB,
        "GiB (cap MAX_TARGET_GIB)",
    )?;
    let runtime_ms = wl.int(
        "runtime_ms",
        s.runtime_ms,
        1..=MAX_RUN_MS,
        "ms of virtual time (cap MAX_RUN_MS)",
    )?;
    let ramp_ms = s.ramp_ms.unwrap_or(d::FIO_RAMP_MS.0);
    if runtime_ms + ramp_ms > MAX_RUN_MS {
        return Err(doc.field_error(
            "workload.ramp_ms",
            format!(
                "ramp_ms + runtime_ms = {} ms exceeds the cap MAX_RUN_MS = {MAX_RUN_MS} ms",
                runtime_ms + ramp_ms
            ),
        ));
    }
    let batch_submit = wl.int(
        "iodepth_batch_submit",
        s.iodepth_batch_submit.unwrap_or(1),
        1..=iodepth,
        "(at most iodepth)",
    )?;
    let batch_complete_min = wl.int(
        "iodepth_batch_complete_min",
        s.iodepth_batch_complete_min.unwrap_or(1),
        1..=iodepth,
        "(at most iodepth)",
    )?;
    let user_ns_per_io = wl.int(
        "user_ns_per_io",
        s.user_ns_per_io
            .unwrap_or(c.profile.io_path.fio_user.ns().round() as u64),
        0..=1_000_000,
        "ns",
    )?;
    let sq_cpus = if engine.sqthread_poll {
        match s.sqthread_poll_cpu {
            Some(cpu) => {
                if cpu >= c.cpus {
                    return Err(doc.field_error(
                        "workload.sqthread_poll_cpu",
                        format!("expected 0..{} (machine.cpus = {})", c.cpus, c.cpus),
                    ));
                }
                vec![cpu; numjobs as usize]
            }
            None => {
                // Each job's thread on a CPU of its own after the jobs' CPUs.
                let last = first_cpu + 2 * numjobs as usize;
                if last > c.cpus {
                    return Err(doc.field_error(
                        "workload.sqthread_poll",
                        format!(
                            "needs a CPU per job for its polling thread after the jobs' (first_cpu + 2 x numjobs = {last} > machine.cpus = {}): set workload.sqthread_poll_cpu or use fewer jobs",
                            c.cpus
                        ),
                    ));
                }
                (first_cpu + numjobs as usize..last).collect()
            }
        }
    } else {
        if s.sqthread_poll_cpu.is_some() {
            return Err(doc.field_error(
                "workload.sqthread_poll_cpu",
                "applies with sqthread_poll = true only",
            ));
        }
        Vec::new()
    };
    Ok(FioSetup {
        rw,
        rwmixread,
        bs,
        iodepth,
        numjobs,
        batch_submit,
        batch_complete_min,
        first_cpu,
        size: size_gib << 30,
        runtime_ns: runtime_ms * 1_000_000,
        ramp_ns: ramp_ms * 1_000_000,
        user_ns_per_io,
        exact_window: s.exact_window.unwrap_or(false),
        engine,
        sq_cpus,
    })
}

/// First Linux release with io_uring (and its polled and SQ-thread modes).
const IO_URING_SINCE: iolab_iommu::linux::KernelVersion =
    iolab_iommu::linux::KernelVersion::new(5, 1);

/// `workload.ioengine` (fio's default `psync`) and the io_uring options.
fn engine(doc: &TomlDoc<'_>, s: &FioSpec, c: &Common) -> Result<IoEngine, InputError> {
    let name = s.ioengine.as_deref().unwrap_or(d::FIO_IOENGINE.0);
    let kind = EngineKind::parse(name).ok_or_else(|| {
        doc.field_error(
            "workload.ioengine",
            format!("unknown engine \"{name}\": expected psync, libaio or io_uring"),
        )
    })?;
    let options = [
        ("hipri", s.hipri),
        ("sqthread_poll", s.sqthread_poll),
        ("fixedbufs", s.fixedbufs),
        ("registerfiles", s.registerfiles),
    ];
    if kind != EngineKind::IoUring {
        if let Some((field, _)) = options.iter().find(|(_, v)| v.is_some()) {
            return Err(doc.field_error(
                &format!("workload.{field}"),
                format!(
                    "is an option of ioengine = \"io_uring\", not of \"{}\"",
                    kind.name()
                ),
            ));
        }
    }
    let release = c.iommu.kernel.kernel;
    if kind == EngineKind::IoUring && release < IO_URING_SINCE {
        return Err(doc.field_error(
            "workload.ioengine",
            format!("io_uring arrived in Linux {IO_URING_SINCE}; kernel.version is {release}"),
        ));
    }
    Ok(IoEngine {
        kind,
        hipri: s.hipri.unwrap_or(false),
        sqthread_poll: s.sqthread_poll.unwrap_or(false),
        fixedbufs: s.fixedbufs.unwrap_or(false),
        registerfiles: s.registerfiles.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;
    use crate::lab::spec::Workload;

    fn fio_of(text: &str) -> FioSetup {
        variant!(ok(text).workload, Workload::Fio)
    }

    #[test]
    fn fio_fields_set_the_jobs_with_defaults() {
        let f = fio_of(FIO_NVME);
        assert_eq!(f.rw, RwPattern::RandRead);
        assert_eq!(
            (f.bs, f.iodepth, f.numjobs),
            (d::FIO_BS.0, d::FIO_IODEPTH.0, 1)
        );
        assert_eq!(
            (f.batch_submit, f.batch_complete_min, f.first_cpu),
            (1, 1, 0)
        );
        assert_eq!(
            (f.runtime_ns, f.ramp_ns),
            (10_000_000, d::FIO_RAMP_MS.0 * 1_000_000)
        );
        assert_eq!(f.size, d::FIO_SIZE_GIB.0 << 30);
        let f = fio_of(&with(
            &FIO_NVME.replace("\"randread\"", "\"randrw\""),
            "workload",
            "rwmixread = 70\nbs = \"64k\"\niodepth = 8\nnumjobs = 4\nfirst_cpu = 2\niodepth_batch_submit = 8",
        ));
        assert_eq!((f.rw, f.rwmixread), (RwPattern::RandRw, 70));
        assert_eq!(
            (f.bs, f.iodepth, f.numjobs, f.first_cpu, f.batch_submit),
            (65536, 8, 4, 2, 8)
        );
    }

    #[test]
    fn fio_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(FIO_NVME, "workload", "iodepth = 0"),
            "workload.iodepth",
            &format!("expected 1..={MAX_IODEPTH} (cap MAX_IODEPTH), got 0"),
        );
        refused(
            &with(FIO_NVME, "workload", "bs = 1000"),
            "workload.bs",
            "expected a non-zero multiple of 512 bytes, got 1000",
        );
        refused(
            &with(FIO_NVME, "workload", "numjobs = 5\nfirst_cpu = 4"),
            "workload.numjobs",
            "expected 1..=4 (one job per CPU from first_cpu; cap MAX_THREADS), got 5",
        );
        refused(
            &with(FIO_NVME, "workload", "first_cpu = 8"),
            "workload.first_cpu",
            "expected 0..8 (machine.cpus = 8)",
        );
        refused(
            &with(FIO_NVME, "workload", "iodepth = \"deep\""),
            "workload.iodepth",
            "invalid type: string \"deep\", expected a non-negative integer",
        );
        refused(
            &FIO_NVME.replace("\"randread\"", "\"sequential\""),
            "workload.rw",
            "unknown pattern \"sequential\": expected read, write, randread, randwrite or randrw",
        );
        refused(
            &with(FIO_NVME, "workload", "direct = 1"),
            "workload.direct",
            "unknown field `direct`, expected one of `kind`, `rw`",
        );
        refused(
            &FIO_NVME.replace("runtime_ms = 10\n", ""),
            "workload.runtime_ms",
            "missing field `runtime_ms`",
        );
    }

    #[test]
    fn fio_fields_that_do_not_apply_or_do_not_fit_are_refused() {
        refused(
            &with(FIO_NVME, "workload", "rwmixread = 70"),
            "workload.rwmixread",
            "applies to rw = \"randrw\" only",
        );
        refused(
            &with(
                FIO_NVME,
                "workload",
                "iodepth = 4\niodepth_batch_submit = 5",
            ),
            "workload.iodepth_batch_submit",
            "expected 1..=4 (at most iodepth), got 5",
        );
        refused(
            &with(FIO_NVME, "workload", "iodepth = 2048\nnumjobs = 8\nbs = 1048576"),
            "machine.memory_gib",
            "the workload's I/O buffers (numjobs x iodepth x bs = 16384 MiB above the first 4 GiB) do not fit in 16 GiB",
        );
    }
}
