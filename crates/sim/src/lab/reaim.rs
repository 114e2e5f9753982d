//! re-aim on a SCSI/SAS disk behind any IOMMU model: the children, workfile and re-aim table
//! of [`crate::workloads::reaim`], their synchronous writes through the block layer, the
//! scenario's DMA path and the HBA/disk model of [`crate::devices::scsi`] (the models the
//! `sba-vmerge` experiment runs: task costs are the scenario's, or a bundled workfile's of
//! [`super::defaults::REAIM_WORKFILES`], times the scenario's declared scale factors, which
//! [`fit_task_scale`] fits to measured child times).
//!
//! Each user count of the ramp is one simulation. Map and unmap calls are charged their
//! counted steps through the platform profile; the hardware waits the step costs leave out
//! are added per model: the SBA's purges (under its resource lock, an engine spin lock, as
//! in the experiment), the IPMMU's flush polls, POWER's hypervisor time, and for SMMUv3
//! the command queue's consumption and `CMD_SYNC` latency, uncontended (the timed,
//! contended queue of fio scenarios is not wired into the synchronous SCSI path).

use std::cell::RefCell;
use std::rc::Rc;

use super::LabError;
use crate::accounting::{CpuTimes, RunReport};
use crate::devices::scsi::{ScsiHost, ScsiStats};
use crate::engine::{Sim, SimConfig};
use crate::metrics::CpuBreakdown;
use crate::workloads::reaim::{
    self, ChildResult, ChildSetup, FsyncLayout, Journal, ReaimRow, TaskTotals, Workfile,
};

use super::iommu::{model_err, LabProtection, ProtectionProbe};
use super::spec::{LabScenario, ReaimSetup, ScsiSetup, BUFFER_BASE};

/// What one ramp produced.
pub(crate) struct ReaimRun {
    /// One row per user count.
    pub rows: Vec<ReaimRow>,
    /// Per user count, the children's CPU time by origin.
    pub totals: Vec<TaskTotals>,
    /// The SCSI host's totals over the ramp.
    pub scsi: ScsiStats,
    /// CPU time of every CPU over the ramp's simulations.
    pub cpu: CpuBreakdown,
    /// Disk busy time over the summed parent times, %.
    pub disk_busy_pct: f64,
    /// Spin-lock acquisitions that waited (SBA resource lock), over the ramp.
    pub lock_contended: u64,
    /// The protection report, summed over the ramp's simulations (the longest reachable
    /// time is the longest of any).
    pub protection: LabProtection,
}

/// What one re-aim run (one user count) produced.
pub(crate) struct ChildrenRun {
    /// The re-aim row.
    pub row: ReaimRow,
    /// The parent's time: the longest child's, from its fork, ns.
    pub parent_ns: u64,
    /// The simulation's report at the end.
    pub report: RunReport,
    /// The children's CPU time by origin.
    pub totals: TaskTotals,
}

/// One re-aim run, shared by the `sba-vmerge` experiment and the workload scenarios: forks
/// `users` children of `wf` (child `n` pinned to CPU `n % cpus`, its clock starting at the
/// fork), their synchronous I/O going to `host`; runs `sim` to the end; checks that every
/// child finished and no DMA mapping is left, and builds the re-aim row. With `progress`
/// (children finished before this point, children of the whole ramp) each child that
/// finishes is reported to the thread's progress hook.
pub(crate) fn run_children(
    sim: &mut Sim,
    host: &ScsiHost,
    wf: &Workfile,
    child: &ChildSetup,
    users: u32,
    cpus: usize,
    progress: Option<(u64, u64)>,
) -> Result<ChildrenRun, LabError> {
    let h = sim.handle().clone();
    let results: Rc<RefCell<Vec<ChildResult>>> = Rc::new(RefCell::new(Vec::new()));
    let totals = Rc::new(RefCell::new(TaskTotals::default()));
    let errors: Rc<RefCell<Option<String>>> = Rc::new(RefCell::new(None));
    let journal = Rc::new(RefCell::new(Journal::new(&child.layout)));
    let wf_rc = Rc::new(wf.clone());
    let child = *child;
    for n in 0..users {
        let (wf, host, results, totals, errors, journal) = (
            wf_rc.clone(),
            host.clone(),
            results.clone(),
            totals.clone(),
            errors.clone(),
            journal.clone(),
        );
        // The child's clock starts at its fork, not at its first run.
        let start = h.now();
        sim.spawn_on(n as usize % cpus, move |ctx| async move {
            match reaim::run_child(&ctx, &wf, &child, &host, &journal, &totals).await {
                Ok((user, sys)) => {
                    let mut r = results.borrow_mut();
                    r.push(ChildResult {
                        elapsed_ns: (ctx.now() - start).as_ns(),
                        user_ns: user,
                        sys_ns: sys,
                    });
                    if let Some((before, all)) = progress {
                        crate::progress::report_work(
                            before + r.len() as u64,
                            all,
                            "re-aim's children",
                        );
                    }
                }
                Err(e) => {
                    errors.borrow_mut().get_or_insert(e.to_string());
                }
            }
        })?;
    }
    let report = sim.run()?;
    if let Some(e) = errors.borrow_mut().take() {
        return Err(model_err(e));
    }
    let kids = results.borrow().clone();
    if kids.len() != users as usize {
        return Err(model_err(format!(
            "{} of {users} re-aim children finished",
            kids.len()
        )));
    }
    if host.live_mappings() != 0 {
        return Err(model_err(format!(
            "{} DMA mappings leaked after the run",
            host.live_mappings()
        )));
    }
    debug_assert!(report.is_conserved());
    let parent_ns = kids.iter().map(|k| k.elapsed_ns).max().unwrap_or(0);
    let row = ReaimRow::from_children(&kids, parent_ns, wf.weight_sum())
        .ok_or_else(|| model_err("an empty re-aim run"))?;
    let totals = *totals.borrow();
    Ok(ChildrenRun {
        row,
        parent_ns,
        report,
        totals,
    })
}

/// Runs the ramp of `r` once with `seed`.
pub(crate) fn run_reaim(
    s: &LabScenario,
    r: &ReaimSetup,
    disk: &ScsiSetup,
    seed: u64,
) -> Result<ReaimRun, LabError> {
    let child = child_setup(s, r, disk, r.scale);
    let mut rows = Vec::with_capacity(r.users.len());
    let mut totals = Vec::with_capacity(r.users.len());
    let mut scsi = ScsiStats::default();
    let mut cpu = CpuTimes::default();
    let (mut parent_total, mut contended) = (0u64, 0u64);
    let mut protection = LabProtection::default();
    let all: u64 = r.users.iter().map(|&u| u64::from(u)).sum();
    let mut before = 0u64;
    for (i, &users) in r.users.iter().enumerate() {
        let (
            ChildrenRun {
                row,
                parent_ns: parent,
                report,
                totals: t,
            },
            host,
            probe,
            translated,
        ) = run_point(
            s,
            disk,
            &child,
            &r.workfile,
            users,
            crate::lab::run_seed(seed, i as u32),
            crate::progress::observed().then_some((before, all)),
        )?;
        before += u64::from(users);
        rows.push(row);
        totals.push(t);
        protection.merge(&probe.read(translated, report.end.as_ns()));
        scsi.add(&host.stats());
        parent_total += parent;
        contended += report.spin_lock("sba_res_lock").map_or(0, |l| l.contended);
        for c in &report.cpus {
            cpu.user += c.user;
            cpu.system += c.system;
            cpu.spin += c.spin;
            cpu.idle += c.idle;
        }
    }
    Ok(ReaimRun {
        rows,
        totals,
        scsi,
        cpu: CpuBreakdown::between(&CpuTimes::default(), &cpu),
        disk_busy_pct: scsi.disk_busy_ns as f64 / parent_total.max(1) as f64 * 100.0,
        lock_contended: contended,
        protection,
    })
}

/// How the children of `r` run on `s`'s machine and `disk`, their task costs scaled by
/// `scale`.
fn child_setup(s: &LabScenario, r: &ReaimSetup, disk: &ScsiSetup, scale: (f64, f64)) -> ChildSetup {
    let page = r.page;
    ChildSetup {
        slice_ns: r.slice_ns,
        jitter: r.jitter,
        scale,
        layout: FsyncLayout {
            page,
            first_pfn: BUFFER_BASE / page,
            mem_pages: (s.memory_bytes - BUFFER_BASE) / page,
            disk_bytes: disk.disk_bytes,
            fs_block: r.fs_block,
            journal_blocks: r.journal_blocks,
        },
    }
}

/// One point of a ramp: `users` children on a fresh simulation seeded `seed`, their I/O
/// through the scenario's SCSI host. Returns the run, the host, the protection probe and
/// whether the path translates.
fn run_point(
    s: &LabScenario,
    disk: &ScsiSetup,
    child: &ChildSetup,
    wf: &Workfile,
    users: u32,
    seed: u64,
    progress: Option<(u64, u64)>,
) -> Result<(ChildrenRun, ScsiHost, ProtectionProbe, bool), LabError> {
    let mut sim = Sim::for_machine(SimConfig { cpus: s.cpus, seed }, &s.profile)?;
    let h = sim.handle().clone();
    let (host, probe, translated) = super::scsi::start_host(s, disk, &h)?;
    let run = run_children(&mut sim, &host, wf, child, users, s.cpus, progress)?;
    Ok((run, host, probe, translated))
}

/// The task-cost scale factors that make one point of a re-aim ramp give the children's
/// user and system times `target` (seconds): a declared calibration's fitting procedure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaskScaleFit {
    /// Factor on every task's user CPU cost (`workload.user_scale`).
    pub user_scale: f64,
    /// Factor on every task's system CPU cost (`workload.sys_scale`).
    pub sys_scale: f64,
}

/// Fits `workload.user_scale` and `workload.sys_scale` of the re-aim scenario `s` so that
/// its ramp point of `users` children gives the children's summed user time `target_user_s`
/// and system time `target_sys_s`: one probe run of that point (the ramp's own seed for it,
/// from `seed`) with both factors at 1 measures the tasks' own user time `U`, their system
/// time `S` and the I/O path's system time `I` (block layer, driver, IOMMU; not scaled);
/// then `user_scale = target_user / U` and `sys_scale = max(0, (target_sys - I) / S)`.
/// Child times are sums of the scaled costs, so the fit is exact up to what the scale
/// changes in the run's interleaving (the jitter draws are per task run).
///
/// # Errors
///
/// [`LabError::Model`] when `s` is not a re-aim scenario, `users` is not a point of its ramp,
/// a target is not finite and positive, or the probe's tasks spent no time; any error of the
/// run itself.
pub fn fit_task_scale(
    s: &LabScenario,
    users: u32,
    target_user_s: f64,
    target_sys_s: f64,
    seed: u64,
) -> Result<TaskScaleFit, LabError> {
    let (super::spec::Workload::Reaim(r), super::spec::Devices::Scsi(disk)) =
        (&s.workload, &s.devices)
    else {
        return Err(model_err(
            "the task-cost fit needs a re-aim scenario on a scsi device",
        ));
    };
    let Some(i) = r.users.iter().position(|&u| u == users) else {
        return Err(model_err(format!(
            "{users} users is not a point of the scenario's ramp {:?}",
            r.users
        )));
    };
    if !(target_user_s.is_finite() && target_sys_s.is_finite())
        || target_user_s <= 0.0
        || target_sys_s <= 0.0
    {
        return Err(model_err(format!(
            "expected finite positive target times, got user {target_user_s} s and sys {target_sys_s} s"
        )));
    }
    let child = child_setup(s, r, disk, (1.0, 1.0));
    let (run, ..) = run_point(
        s,
        disk,
        &child,
        &r.workfile,
        users,
        crate::lab::run_seed(seed, i as u32),
        None,
    )?;
    let t = run.totals;
    if t.task_user == 0 || t.task_sys == 0 {
        return Err(model_err(
            "the probe's tasks spent no user or no system time",
        ));
    }
    Ok(TaskScaleFit {
        user_scale: target_user_s / (t.task_user as f64 * 1e-9),
        sys_scale: ((target_sys_s - t.io_sys as f64 * 1e-9) / (t.task_sys as f64 * 1e-9)).max(0.0),
    })
}
