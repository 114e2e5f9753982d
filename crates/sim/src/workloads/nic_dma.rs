//! What the x86 NIC's send and receive tests (`rx_stream`, `tx_stream`) share: the device's
//! DMA through the unit and the DMA port, and the driver's map and unmap work priced by the
//! profile, each counted in the measured window.

use iolab_iommu::addr::{Access, DmaAddr};
use iolab_iommu::work::WorkRecord;

use crate::devices::{DeviceDma, PortTiming, PortedDma};
use crate::iommu::port::{DmaPort, DmaStream, Translated};
use crate::workloads::rx_stream::{RxPricing, RxStreamError};

/// The NIC's side of the IOMMU in a direct-DMA test, and what it counted in the window.
pub(crate) struct NicDma<'a> {
    /// How the device's accesses reach memory.
    dma: DeviceDma<'a>,
    /// The unit's DMA port.
    port: DmaPort,
    /// How the driver's maps and unmaps are priced.
    pricing: RxPricing<'a>,
    /// The measured window, ns.
    window: (u64, u64),
    /// The device's translations in the window.
    pub translation: WorkRecord,
    /// The driver's map and unmap work in the window.
    pub dma_work: WorkRecord,
}

impl<'a> NicDma<'a> {
    /// The side of a test measured from `warmup_ns` to `run_ns`.
    pub fn new(dma: DeviceDma<'a>, pricing: RxPricing<'a>, warmup_ns: u64, run_ns: u64) -> Self {
        Self {
            dma,
            port: pricing.cost.dma_port(),
            pricing,
            window: (warmup_ns, run_ns),
            translation: WorkRecord::new(),
            dma_work: WorkRecord::new(),
        }
    }

    /// Whether `t` is in the measured window.
    pub fn in_window(&self, t: u64) -> bool {
        t >= self.window.0 && t < self.window.1
    }

    /// The device moves `len` bytes at `dma` at `now`: translated through the unit (counted
    /// in the window); what the translation did, for the port.
    pub fn translate(
        &mut self,
        dma: u64,
        len: u64,
        access: Access,
        now: u64,
    ) -> Result<Translated, RxStreamError> {
        let mut tw = WorkRecord::new();
        let t = self
            .dma
            .translate(DmaAddr(dma), len, access, &mut tw)
            .map_err(RxStreamError::Dma)?;
        if self.in_window(now) {
            self.translation += &tw;
        }
        Ok(t)
    }

    /// A DMA through the port on `stream`, its data ready at `ready` and taking `data_ns`.
    pub fn timed(
        &self,
        ready: f64,
        data_ns: f64,
        t: Translated,
        access: Access,
        stream: &DmaStream,
    ) -> PortTiming {
        let dma = PortedDma {
            port: &self.port,
            translated: t,
        };
        PortedDma::time(Some(dma), ready, data_ns, access, stream)
    }

    /// CPU time of the driver's map and unmap work `w` at `now` (counted in the window), ns.
    pub fn work_ns(&mut self, w: &WorkRecord, now: u64) -> f64 {
        if self.in_window(now) {
            self.dma_work += w;
        }
        self.pricing.cost.cpu_ns(w)
            + self.pricing.cost.locks_uncontended_ns(w)
            + (self.pricing.hardware_wait)(w)
    }
}

/// `count` per 4 KiB of `bytes` moved (0 when nothing moved).
pub(crate) fn per_4k(count: u64, bytes: u64) -> f64 {
    count as f64 / (bytes as f64 / 4096.0).max(f64::MIN_POSITIVE)
}

/// A refused map or unmap as the NIC tests report it.
pub(crate) fn dma_err(e: impl std::fmt::Display) -> RxStreamError {
    RxStreamError::Dma(e.to_string())
}
