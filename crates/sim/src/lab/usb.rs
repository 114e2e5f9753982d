//! bonnie++ on a USB mass-storage device behind an xHCI, with or without an IPMMU: the
//! same device and workload models the `ipmmu-usb` experiment runs (DMA mask, swiotlb
//! bounce without an IOMMU, page cache over the machine's memory banks), assembled for one
//! scenario.

use std::cell::RefCell;
use std::rc::Rc;

use iolab_iommu::dma::Device;

use super::LabError;
use crate::devices::usb::{DmaSide, IrqCpu, UsbStats, UsbStorage, USB_LINK};
use crate::engine::{Sim, SimConfig};
use crate::iommu::port::DmaStream;
use crate::metrics::CpuBreakdown;
use crate::workloads::bonnie::{self, BonnieResult};

use super::iommu::{self, model_err, LabProtection};
use super::spec::{BonnieSetup, LabScenario, UsbSetup};

/// What one bonnie run produced.
pub(crate) struct BonnieRun {
    pub result: BonnieResult,
    pub usb: UsbStats,
    pub cpu: CpuBreakdown,
    /// The protection report over the whole run.
    pub protection: LabProtection,
}

/// Runs bonnie of `s` once with `seed`.
pub(crate) fn run_bonnie(
    s: &LabScenario,
    b: &BonnieSetup,
    u: &UsbSetup,
    seed: u64,
) -> Result<BonnieRun, LabError> {
    let mut sim = Sim::for_machine(SimConfig { cpus: s.cpus, seed }, &s.profile)?;
    let built = iommu::build(s, sim.handle())?;
    // The xHCI's DMA mask (`device[0].dma_mask_bits`), with and without the IPMMU.
    let device = Device::new(1, u.dma_mask_bits)
        .and_then(|d| d.with_max_segment_size(u.max_segment_size))
        .map_err(model_err)?;
    let probe = built.protection.clone();
    let translated = built.translated;
    let irq = IrqCpu::new();
    let err = Rc::new(RefCell::new(None));
    let dev = UsbStorage::start(
        sim.handle(),
        u.config.clone(),
        DmaSide {
            path: built.path,
            device,
            poll_interval_ns: built.poll_interval_ns,
            translated: built.translated,
            // dma-direct bounces what the mask cannot reach through swiotlb; the IPMMU gives
            // every page an IOVA below the mask and never bounces.
            swiotlb: if built.translated {
                None
            } else {
                Some(RefCell::new(u.swiotlb.build().map_err(model_err)?))
            },
            copy_bytes_per_ns: s.profile.memory.memcpy_bandwidth.gb_per_s,
            port: s.profile.cpu_cost_model().dma_port(),
            stream: DmaStream::new(USB_LINK),
        },
        &s.profile,
        irq.clone(),
        err.clone(),
    )?;
    let out = bonnie::start(
        sim.handle(),
        b.config.clone(),
        dev.clone(),
        irq,
        u.config.irq_cpu,
        seed,
    )?;
    let report = sim.run()?;
    if let Some(e) = err.borrow_mut().take() {
        return Err(model_err(e));
    }
    let result = out
        .borrow_mut()
        .take()
        .ok_or_else(|| model_err("bonnie did not finish (a task blocked forever)"))?;
    let mut cpu = CpuBreakdown::default();
    for c in &report.cpus {
        cpu.user_ns += c.user;
        cpu.system_ns += c.system;
        cpu.spin_ns += c.spin;
        cpu.idle_ns += c.idle;
    }
    Ok(BonnieRun {
        result,
        usb: dev.stats(),
        cpu,
        protection: probe.read(translated, report.end.as_ns()),
    })
}
