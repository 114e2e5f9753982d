//! `[workload]` of kind `fio`: jobs with I/Os in flight on block devices.

use serde::Deserialize;

use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::fields::Fields;
use crate::lab::spec::{Common, BUFFER_BASE};
use crate::tomlfile::{InputError, TomlDoc};
use crate::workloads::fio::{EngineKind, IoEngine, RwPattern, SteadyState};

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
    steadystate: Option<String>,
    #[serde(default)]
    ss_dur_ms: Option<u64>,
    #[serde(default)]
    ss_ramp_ms: Option<u64>,
    #[serde(default)]
    ss_interval_ms: Option<u64>,
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
    /// fio's `steadystate` with its duration, ramp and interval, if set.
    pub steadystate: Option<SteadyState>,
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
        steadystate: steadystate(doc, s, runtime_ms)?,
        engine,
        sq_cpus,
    })
}

/// fio's `steadystate` and its `ss_*` fields (times in ms of virtual time).
fn steadystate(
    doc: &TomlDoc<'_>,
    s: &FioSpec,
    runtime_ms: u64,
) -> Result<Option<SteadyState>, InputError> {
    let Some(text) = s.steadystate.as_deref() else {
        for (field, v) in [
            ("ss_dur_ms", s.ss_dur_ms),
            ("ss_ramp_ms", s.ss_ramp_ms),
            ("ss_interval_ms", s.ss_interval_ms),
        ] {
            if v.is_some() {
                return Err(doc.field_error(
                    &format!("workload.{field}"),
                    "applies with workload.steadystate only",
                ));
            }
        }
        return Ok(None);
    };
    let (criterion, limit, percent) = SteadyState::parse_criterion(text).ok_or_else(|| {
        doc.field_error(
            "workload.steadystate",
            format!("\"{text}\": expected fio's criterion:limit, one of iops, iops_slope, bw, bw_slope with a limit >= 0, absolute or a percent, e.g. \"iops_slope:0.1%\""),
        )
    })?;
    if s.exact_window == Some(true) {
        return Err(doc.field_error(
            "workload.exact_window",
            "keeps the window after ramp_ms, which steadystate moves to where its criterion holds: set one",
        ));
    }
    let wl = Fields::new(doc, "workload");
    let dur_ms = s.ss_dur_ms.ok_or_else(|| {
        doc.field_error(
            "workload.ss_dur_ms",
            "steadystate needs the window it judges (fio's ss_dur; its default 0 turns detection off)",
        )
    })?;
    let dur_ms = wl.int(
        "ss_dur_ms",
        dur_ms,
        2..=runtime_ms.max(2),
        "ms (at most runtime_ms)",
    )?;
    let interval_ms = wl.int(
        "ss_interval_ms",
        s.ss_interval_ms.unwrap_or(d::FIO_SS_INTERVAL_MS.0),
        1..=dur_ms / 2,
        "ms (at most half of ss_dur_ms: two samples at least)",
    )?;
    let ramp_ms = wl.int(
        "ss_ramp_ms",
        s.ss_ramp_ms.unwrap_or(0),
        0..=runtime_ms,
        "ms (at most runtime_ms)",
    )?;
    Ok(Some(SteadyState {
        criterion,
        limit,
        percent,
        dur_ns: dur_ms * 1_000_000,
        ramp_ns: ramp_ms * 1_000_000,
        interval_ns: interval_ms * 1_000_000,
    }))
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
    fn engines_and_steadystate_are_checked_by_field() {
        let psync = FIO_NVME.replace("ioengine = \"libaio\"\n", "");
        // fio's default engine is psync: depth above 1 is refused with what to set.
        refused(
            &with(&psync, "workload", "iodepth = 8"),
            "workload.iodepth",
            "8 with ioengine = \"psync\" (fio's default): a synchronous engine keeps one I/O in flight per job",
        );
        refused(
            &FIO_NVME.replace("\"libaio\"", "\"posixaio\""),
            "workload.ioengine",
            "unknown engine \"posixaio\": expected psync, libaio or io_uring",
        );
        refused(
            &with(FIO_NVME, "workload", "hipri = true"),
            "workload.hipri",
            "is an option of ioengine = \"io_uring\", not of \"libaio\"",
        );
        let uring = FIO_NVME.replace("\"libaio\"", "\"io_uring\"");
        refused(
            &with(
                &with(&uring, "workload", "sqthread_poll = true\nnumjobs = 5"),
                "kernel",
                "",
            ),
            "workload.sqthread_poll",
            "needs a CPU per job for its polling thread",
        );
        refused(
            &with(&uring, "kernel", "version = \"4.19\""),
            "workload.ioengine",
            "io_uring arrived in Linux 5.1; kernel.version is 4.19",
        );
        let f = fio_of(&with(
            &uring,
            "workload",
            "sqthread_poll = true\nnumjobs = 2",
        ));
        assert_eq!(f.sq_cpus, vec![2, 3]);
        let f = fio_of(&with(
            &uring,
            "workload",
            "sqthread_poll = true\nsqthread_poll_cpu = 7\nnumjobs = 2",
        ));
        assert_eq!(f.sq_cpus, vec![7, 7]);
        // steadystate: fio's criterion:limit, with the duration it judges.
        refused(
            &with(
                FIO_NVME,
                "workload",
                "steadystate = \"lat:1%\"\nss_dur_ms = 4",
            ),
            "workload.steadystate",
            "expected fio's criterion:limit",
        );
        refused(
            &with(FIO_NVME, "workload", "steadystate = \"iops:1%\""),
            "workload.ss_dur_ms",
            "steadystate needs the window it judges",
        );
        refused(
            &with(FIO_NVME, "workload", "ss_dur_ms = 4"),
            "workload.ss_dur_ms",
            "applies with workload.steadystate only",
        );
        refused(
            &with(
                FIO_NVME,
                "workload",
                "steadystate = \"iops:1%\"\nss_dur_ms = 4\nexact_window = true",
            ),
            "workload.exact_window",
            "keeps the window after ramp_ms",
        );
        let f = fio_of(&with(
            FIO_NVME,
            "workload",
            "steadystate = \"iops_slope:0.1%\"\nss_dur_ms = 4\nss_ramp_ms = 2",
        ));
        let ss = f.steadystate.unwrap();
        assert_eq!(
            (ss.dur_ns, ss.ramp_ns, ss.interval_ns),
            (4_000_000, 2_000_000, 1_000_000)
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
