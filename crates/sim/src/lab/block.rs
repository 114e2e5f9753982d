//! fio on block devices (NVMe SSDs, SAS HBAs) behind any DMA path.
//!
//! Each I/O takes the path Linux takes: on the submitting CPU, the block layer
//! (`kernel.block_submit_ns`), `dma_map` through the scenario's IOMMU (the work the stack
//! really did, priced by the platform profile), the driver's submission and the doorbell
//! write; the device's DMA is translated by the IOMMU (its translation time added to the
//! transfer); the completion interrupt lands on the CPU its queue's vector is affine to,
//! where the driver completes the command, `dma_unmap` runs (with SMMUv3, the invalidation
//! commands and `CMD_SYNC` go through the timed command queue of the `smmuv3-cmdq`
//! experiment) and the block layer completes the request to fio.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use iolab_iommu::addr::{Access, PhysAddr, SZ_4K};
use iolab_iommu::dma::{Device, Direction};
use iolab_iommu::hw::{DmaPath, MappedBuffer};
use iolab_iommu::work::WorkRecord;

use super::cmdq_invalidator::CmdqInvalidator;
use crate::accounting::{Account, RunReport};
use crate::cost::CpuCostModel;
use crate::devices::nvme::Nvme;
use crate::devices::sas::SasHba;
use crate::engine::{Channel, Ctx, Handle, Sim, SimConfig, SimDuration, SimTime};
use crate::experiments::smmuv3_cmdq::SimCmdq;
use crate::experiments::ExperimentError;
use crate::metrics::CpuBreakdown;
use crate::workloads::fio::{
    self, BlockTarget, FioJob, GroupStats, IoCompletion, IoRequest, JobJson, SharedStats,
    SubmitFuture,
};

use super::iommu::{self, model_err};
use super::spec::{BlockKernel, Devices, FioSetup, LabScenario, BUFFER_BASE};

/// One block device's timing model.
enum BlockDev {
    Nvme(Nvme),
    Sas(SasHba),
}

struct InFlight {
    req: IoRequest,
    mapping: MappedBuffer,
}

/// Counters of the DMA path over the whole run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DmaCounters {
    pub maps: u64,
    pub unmaps: u64,
    pub map_ns: f64,
    pub unmap_ns: f64,
    pub translation_ns: f64,
    pub inval_syncs: u64,
    pub flush_queue_flushes: u64,
}

struct Stack {
    path: Arc<dyn DmaPath>,
    cmdq: Option<(Arc<CmdqInvalidator>, SimCmdq)>,
    cost: CpuCostModel,
    devs: Vec<BlockDev>,
    /// Per device, per interrupt vector: the completions it delivers.
    vectors: Vec<Vec<Channel<InFlight>>>,
    device: Device,
    k: BlockKernel,
    mmio_write_ns: u64,
    poll_interval_ns: u64,
    iodepth: u64,
    slot_bytes: u64,
    counters: RefCell<DmaCounters>,
    error: RefCell<Option<String>>,
    h: Handle,
}

impl Stack {
    fn fail(&self, e: String) -> String {
        self.error.borrow_mut().get_or_insert(e).clone()
    }

    /// CPU time of a map or unmap: the counted steps, their locks (uncontended), the
    /// hypervisor's time for TCE hypercalls (POWER) and the IPMMU's flush polling.
    fn work_ns(&self, w: &WorkRecord) -> Result<f64, String> {
        let hv = self
            .cost
            .hypervisor_ns(w)
            .map_err(|e| self.fail(e.to_string()))?;
        let polls = w.polls.saturating_sub(w.inval_domains) * self.poll_interval_ns;
        Ok(self.cost.cpu_ns(w) + self.cost.locks_uncontended_ns(w) + hv + polls as f64)
    }

    async fn submit(&self, ctx: &Ctx, req: IoRequest) -> Result<(), String> {
        let cpu = ctx.cpu().id();
        ctx.cpu()
            .spend(SimDuration::ns(self.k.block_submit_ns), Account::System)
            .await;
        let pa =
            BUFFER_BASE + (req.job as u64 * self.iodepth + u64::from(req.slot)) * self.slot_bytes;
        let dir = if req.is_read {
            Direction::FromDevice
        } else {
            Direction::ToDevice
        };
        let mut w = WorkRecord::new();
        let mapping = self
            .path
            .map_single(&self.device, PhysAddr::new(pa), req.len, dir, cpu, &mut w)
            .map_err(|e| self.fail(format!("dma map failed: {e}")))?;
        let map_ns = self.work_ns(&w)?;
        {
            let mut c = self.counters.borrow_mut();
            c.maps += 1;
            c.map_ns += map_ns;
        }
        crate::trace::cpu_part(ctx, "dma map", ctx.now().as_ns(), map_ns.round() as u64);
        ctx.cpu()
            .spend_labeled(
                SimDuration::ns(
                    map_ns.round() as u64 + self.k.driver_submit_ns + self.mmio_write_ns,
                ),
                Account::System,
                "dma map + driver submit",
            )
            .await;
        // The device's DMA goes through the IOMMU (or its bypass).
        let mut tw = WorkRecord::new();
        let access = if req.is_read {
            Access::Write
        } else {
            Access::Read
        };
        self.path
            .translate(&self.device, mapping.dma_addr(), req.len, access, &mut tw)
            .map_err(|e| self.fail(format!("device DMA faulted: {e}")))?;
        let tr_ns = self.cost.translation_ns(&tw);
        self.counters.borrow_mut().translation_ns += tr_ns;
        let now = ctx.now().as_ns();
        let devno = req.job % self.devs.len();
        let (at, vector) = match &self.devs[devno] {
            BlockDev::Nvme(d) => (
                d.service(now, req.len, req.is_read, tr_ns),
                d.queue_for_cpu(cpu),
            ),
            BlockDev::Sas(hba) => {
                let disk = hba.disk_for(req.offset, req.len);
                (
                    hba.service(now, disk, req.len, req.is_read, tr_ns),
                    hba.queue_for_disk(disk),
                )
            }
        };
        self.h.tracer().device(
            || match self.devs[devno] {
                BlockDev::Nvme(_) => format!("nvme{devno} q{}", vector % self.vectors[devno].len()),
                BlockDev::Sas(_) => format!("sas{devno} cq{}", vector % self.vectors[devno].len()),
            },
            if req.is_read { "read" } else { "write" },
            now,
            at.saturating_sub(now),
            &[("bytes", req.len)],
        );
        let vecs = &self.vectors[devno];
        let chan = vecs[vector % vecs.len()].clone();
        let item = InFlight { req, mapping };
        self.h
            .spawn_agent(move |actx| async move {
                actx.sleep_until(SimTime::from_ns(at)).await;
                let _ = chan.send(item);
            })
            .map_err(|e| self.fail(e.to_string()))?;
        Ok(())
    }

    /// The interrupt handler of one vector, on its CPU: drains every completion queued.
    async fn irq_loop(self: Rc<Self>, ctx: Ctx, dev: usize, v: usize) {
        let chan = self.vectors[dev][v].clone();
        loop {
            let first = chan.recv(&ctx).await;
            ctx.cpu()
                .spend(SimDuration::ns(self.k.irq_entry_ns), Account::System)
                .await;
            let mut next = Some(first);
            while let Some(f) = next {
                self.complete(&ctx, f).await;
                next = chan.try_recv();
            }
        }
    }

    async fn complete(&self, ctx: &Ctx, f: InFlight) {
        let cpu = ctx.cpu().id();
        ctx.cpu()
            .spend(SimDuration::ns(self.k.driver_complete_ns), Account::System)
            .await;
        let mut w = WorkRecord::new();
        if let Err(e) = self
            .path
            .unmap_single(f.mapping, cpu, ctx.now().as_ns(), &mut w)
        {
            self.fail(format!("dma unmap failed: {}", e.error));
        }
        let unmap_ns = self.work_ns(&w).unwrap_or(0.0);
        {
            let mut c = self.counters.borrow_mut();
            c.unmaps += 1;
            c.unmap_ns += unmap_ns;
            c.inval_syncs += w.inval_syncs;
            c.flush_queue_flushes += w.flush_queue_flushes;
        }
        ctx.cpu()
            .spend_labeled(
                SimDuration::ns(unmap_ns.round() as u64),
                Account::System,
                "dma unmap",
            )
            .await;
        if let Some((inv, q)) = &self.cmdq {
            let issued = inv.take();
            if issued.syncs > 0 {
                q.issue(ctx, issued.cmds, issued.prod_writes).await;
            }
            if let Some(e) = inv.error() {
                self.fail(e);
            }
        }
        ctx.cpu()
            .spend(SimDuration::ns(self.k.block_complete_ns), Account::System)
            .await;
        let r = f.req;
        let _ = r.done.send(IoCompletion {
            slot: r.slot,
            is_read: r.is_read,
            len: r.len,
            issued_at: r.issued_at,
        });
    }
}

struct Target(Rc<Stack>);

impl BlockTarget for Target {
    fn submit<'a>(&'a self, ctx: &'a Ctx, req: IoRequest) -> SubmitFuture<'a> {
        Box::pin(async move { self.0.submit(ctx, req).await })
    }
}

/// What one fio run produced.
pub(crate) struct FioRun {
    pub job: FioJob,
    pub stats: GroupStats,
    pub json: JobJson,
    pub cpu: CpuBreakdown,
    pub dma: DmaCounters,
    pub cmdq: Option<crate::experiments::smmuv3_cmdq::CmdqStats>,
    pub irq_cpus: usize,
}

/// The fio job of a scenario.
pub(crate) fn fio_job(s: &LabScenario, f: &FioSetup) -> FioJob {
    FioJob {
        name: s.name.clone(),
        rw: f.rw,
        rwmixread: f.rwmixread,
        bs: f.bs,
        iodepth: f.iodepth,
        batch_submit: f.batch_submit,
        batch_complete_min: f.batch_complete_min,
        numjobs: f.numjobs,
        size: f.size,
        runtime: SimDuration::ns(f.runtime_ns),
        ramp: SimDuration::ns(f.ramp_ns),
        cpus: (f.first_cpu..f.first_cpu + f.numjobs as usize).collect(),
        user_ns_per_io: f.user_ns_per_io,
        syscall_ns: s.profile.cpu.syscall.ns().round() as u64,
    }
}

/// Runs fio of `s` once with `seed`.
pub(crate) fn run_fio(s: &LabScenario, f: &FioSetup, seed: u64) -> Result<FioRun, ExperimentError> {
    let mut sim = Sim::new(SimConfig { cpus: s.cpus, seed })?;
    let h = sim.handle().clone();
    let built = iommu::build(s, &h)?;
    let device = Device::new(1, 64).map_err(model_err)?;
    let job = fio_job(s, f);
    let inflight_cap = f.iodepth as usize * f.numjobs as usize + 1;
    // Interrupt vectors and the CPUs they are affine to: NVMe queue q on CPU q (managed
    // interrupts, one queue per CPU); SAS completion queue q on CPU q (mod CPUs).
    let (devs, vector_cpus): (Vec<BlockDev>, Vec<Vec<usize>>) = match &s.devices {
        Devices::Nvme(ps) => ps
            .iter()
            .map(|p| {
                (
                    BlockDev::Nvme(Nvme::new(*p)),
                    (0..p.io_queues).map(|q| q % s.cpus).collect(),
                )
            })
            .unzip(),
        Devices::Sas(ps) => ps
            .iter()
            .map(|p| {
                (
                    BlockDev::Sas(SasHba::new(*p)),
                    (0..p.completion_queues).map(|q| q % s.cpus).collect(),
                )
            })
            .unzip(),
        other => {
            return Err(model_err(format!(
                "fio needs block devices, not {}",
                other.kind()
            )))
        }
    };
    let stack = Rc::new(Stack {
        path: built.path,
        cmdq: built.cmdq,
        poll_interval_ns: built.poll_interval_ns,
        cost: s.profile.cpu_cost_model(),
        devs,
        vectors: vector_cpus
            .iter()
            .map(|v| v.iter().map(|_| Channel::new(&h, inflight_cap)).collect())
            .collect(),
        device,
        k: s.kernel,
        mmio_write_ns: s.profile.mmio.write.ns().round() as u64,
        iodepth: u64::from(f.iodepth),
        slot_bytes: f.bs.next_multiple_of(SZ_4K),
        counters: RefCell::new(DmaCounters::default()),
        error: RefCell::new(None),
        h: h.clone(),
    });
    let mut irq_cpus: Vec<usize> = Vec::new();
    for (d, cpus) in vector_cpus.iter().enumerate() {
        for (v, &cpu) in cpus.iter().enumerate() {
            let st = stack.clone();
            sim.spawn_on(cpu, move |ctx| st.irq_loop(ctx, d, v))?;
            if !irq_cpus.contains(&cpu) {
                irq_cpus.push(cpu);
            }
        }
    }
    let spec = Rc::new(job.clone());
    let stats: SharedStats = Rc::new(RefCell::new(GroupStats::default()));
    let target = Rc::new(Target(stack.clone()));
    for j in 0..spec.numjobs as usize {
        let cpu = spec.cpus[j % spec.cpus.len()];
        let (spec, target, stats) = (spec.clone(), target.clone(), stats.clone());
        sim.spawn_on(cpu, move |ctx| fio::run_job(ctx, spec, j, target, stats))?;
    }
    let t0 = SimTime::ZERO + spec.ramp;
    let t1 = t0 + spec.runtime;
    let before: RunReport = sim.run_until(t0)?;
    let after: RunReport = sim.run_until(t1)?;
    let _ = sim.run()?;
    if let Some(e) = stack
        .error
        .borrow()
        .clone()
        .or(stats.borrow().error.clone())
    {
        return Err(ExperimentError::Model(e));
    }
    let (usr, sys) = fio::cpu_usage(&before, &after, &spec.cpus);
    let cpu = CpuBreakdown::between(&sum_cpus(&before), &sum_cpus(&after));
    let g = stats.borrow().clone();
    let json = fio::job_json(&spec, &g, usr, sys);
    let dma = *stack.counters.borrow();
    let cmdq = stack.cmdq.as_ref().map(|(_, q)| q.stats());
    Ok(FioRun {
        job,
        stats: g,
        json,
        cpu,
        dma,
        cmdq,
        irq_cpus: irq_cpus.len(),
    })
}

/// CPU times summed over every CPU of a report.
fn sum_cpus(r: &RunReport) -> crate::accounting::CpuTimes {
    let mut t = crate::accounting::CpuTimes::default();
    for c in &r.cpus {
        t.user += c.user;
        t.system += c.system;
        t.spin += c.spin;
        t.idle += c.idle;
    }
    t
}
