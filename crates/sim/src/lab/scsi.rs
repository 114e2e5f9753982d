//! bonnie++ on the SCSI disk of re-aim scenarios ([`crate::devices::scsi`]) behind any IOMMU
//! model.
//!
//! The SCSI host's [`ScsiHost::submit`] is synchronous: it maps a transfer, queues it to the
//! HBA, waits for the disk and unmaps, all in the caller's task (re-aim's `fsync` writers
//! wait for their I/O anyway). bonnie's page cache needs a [`BlockQueue`] that returns once a
//! command is on its way, so [`ScsiQueue`] runs the submission half ([`ScsiHost::issue`]:
//! `dma_map_sg`, the driver, the HBA queue) in the submitting task, as the block path of
//! nvme/sas does, and the completion half ([`ScsiHost::complete`]: the wait, the driver's
//! completion, `dma_unmap_sg`) in a task of its own on the submitter's CPU, which calls the
//! command's `on_done` once the command has completed and been unmapped. So the map time is
//! in the CPU% of the bonnie process that submitted the command (its readahead, the
//! seekers' reads; the flusher's write-back is the flusher's), the unmap time in the run's
//! system time only.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::LabError;
use crate::block::{BlockCommand, BlockDir, BlockQueue, SubmitCommand};
use crate::devices::scsi::{HostDma, ScsiHost, ScsiStats};
use crate::devices::usb::IrqCpu;
use crate::engine::{Ctx, Handle, Sim, SimConfig};
use crate::metrics::CpuBreakdown;
use crate::workloads::bonnie::{self, BonnieResult};

use super::block::lock_params;
use super::iommu::{self, model_err, LabProtection};
use super::spec::{BonnieSetup, IommuModel, LabScenario, ScsiSetup};

/// bonnie's view of a [`ScsiHost`]: each command's synchronous I/O in a task of its own on
/// the submitting CPU. The first error is kept (the command still completes, so bonnie
/// finishes and the run reports the error).
struct ScsiQueue {
    host: ScsiHost,
    error: Rc<RefCell<Option<String>>>,
    /// Bytes submitted: (reads, writes).
    bytes: Rc<Cell<(u64, u64)>>,
}

impl BlockQueue for ScsiQueue {
    fn submit<'a>(&'a self, ctx: &'a Ctx, cmd: BlockCommand) -> SubmitCommand<'a> {
        Box::pin(async move {
            let n: u64 = cmd.pieces.iter().map(|p| p.len).sum();
            let (r, w) = self.bytes.get();
            let write = cmd.dir == BlockDir::Write;
            self.bytes.set(if write { (r, w + n) } else { (r + n, w) });
            let pending = match self.host.issue(ctx, cmd.offset, &cmd.pieces, write).await {
                Ok((pending, _)) => pending,
                Err(e) => {
                    self.error.borrow_mut().get_or_insert(e.to_string());
                    (cmd.on_done)();
                    return;
                }
            };
            let (host, error) = (self.host.clone(), self.error.clone());
            let on_done = cmd.on_done;
            let spawned = ctx
                .handle()
                .spawn_on(ctx.cpu().id(), move |ctx| async move {
                    if let Err(e) = host.complete(&ctx, pending).await {
                        error.borrow_mut().get_or_insert(e.to_string());
                    }
                    on_done();
                });
            if let Err(e) = spawned {
                self.error.borrow_mut().get_or_insert(e.to_string());
            }
        })
    }
}

/// What one bonnie run on the SCSI disk produced.
pub(crate) struct BonnieScsiRun {
    pub result: BonnieResult,
    pub scsi: ScsiStats,
    pub cpu: CpuBreakdown,
    /// Bytes bonnie's page cache submitted: (reads, writes).
    pub submitted_bytes: (u64, u64),
    /// The protection report over the whole run.
    pub protection: LabProtection,
}

/// The scenario's SCSI host on `h`, its DMA through the scenario's IOMMU (the SBA's resource
/// lock where the model is SBA), with the probe that reads the run's protection report and
/// whether the path translates device addresses. Shared by bonnie and re-aim on scsi.
pub(crate) fn start_host(
    s: &LabScenario,
    disk: &ScsiSetup,
    h: &Handle,
) -> Result<(ScsiHost, iommu::ProtectionProbe, bool), LabError> {
    let built = iommu::build(s, h)?;
    let (probe, translated) = (built.protection.clone(), built.translated);
    let dma = HostDma {
        path: built.path,
        extra_ns: iommu::hardware_wait(s, built.poll_interval_ns),
        lock: (s.iommu.model == IommuModel::Sba).then(|| ("sba_res_lock", lock_params(s))),
    };
    let host = ScsiHost::start_on(
        h,
        disk.params,
        disk.limits,
        dma,
        iommu::lab_device(disk.dma_mask_bits)?
            .with_max_segment_size(disk.limits.max_segment_size)
            .map_err(model_err)?,
        s.profile.cpu_cost_model(),
    )?;
    Ok((host, probe, translated))
}

/// Runs bonnie of `s` once with `seed` on its SCSI disk.
pub(crate) fn run_bonnie(
    s: &LabScenario,
    b: &BonnieSetup,
    disk: &ScsiSetup,
    seed: u64,
) -> Result<BonnieScsiRun, LabError> {
    let mut sim = Sim::for_machine(SimConfig { cpus: s.cpus, seed }, &s.profile)?;
    let h = sim.handle().clone();
    let (host, probe, translated) = start_host(s, disk, &h)?;
    let error = Rc::new(RefCell::new(None));
    let bytes = Rc::new(Cell::new((0, 0)));
    let queue = ScsiQueue {
        host: host.clone(),
        error: error.clone(),
        bytes: bytes.clone(),
    };
    // No interrupt time is stolen from bonnie's processes: completions run as tasks.
    let out = bonnie::start(&h, b.config.clone(), queue, IrqCpu::new(), usize::MAX, seed)?;
    let report = sim.run()?;
    if let Some(e) = error.borrow_mut().take() {
        return Err(model_err(e));
    }
    let result = out
        .borrow_mut()
        .take()
        .ok_or_else(|| model_err("bonnie did not finish (a task blocked forever)"))?;
    if host.live_mappings() != 0 {
        return Err(model_err(format!(
            "{} DMA mappings leaked after the run",
            host.live_mappings()
        )));
    }
    Ok(BonnieScsiRun {
        result,
        scsi: host.stats(),
        cpu: CpuBreakdown::from(report.total),
        submitted_bytes: bytes.get(),
        protection: probe.read(translated, report.end.as_ns()),
    })
}
