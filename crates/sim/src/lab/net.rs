//! netperf-like TCP streams on a NIC (an mlx5 SR-IOV VF) in a PowerVM partition: the NIC,
//! TCE path and stream models the `pseries-ddw` experiment's cells run, for one scenario.
//! On x86 IOMMUs (or none) a netperf scenario runs the direct-DMA receive test instead
//! ([`run_direct_rx`], the `fands-iotlb` experiment's cells). [`netperf_parts`] builds what a stream test runs on; the lab's run and the soak
//! (`crate::soak`) both start from it.

use std::cell::RefCell;
use std::sync::Arc;

use iolab_iommu::dma::Device;
use iolab_iommu::hw::PseriesIommu;

use super::LabError;
use crate::cost::PlatformProfile;
use crate::devices::nic::{HvSerialisation, LinkConfig, NicError};
use crate::devices::DeviceDma;
use crate::engine::Sim;
use crate::engine::SimConfig;
use crate::resources::LockKind;
use crate::workloads::netperf::{run_stream, StackCosts, StreamConfig, StreamResult};
use crate::workloads::rx_stream::{run_rx_stream, RxPricing, RxStreamResult};

use super::iommu::{self, model_err, LabProtection, ProtectionProbe};
use super::spec::{Devices, LabScenario, Workload};

/// What a netperf scenario's stream test runs on, built from the validated scenario: its
/// platform profile, stack costs, wire, stream configuration and TCE serialisation, and a
/// fresh partition IOMMU (in the scenario's window mode, built as every lab run builds
/// it) with the NIC's DMA identity.
pub struct NetperfParts {
    /// The platform profile (with the scenario's `machine.costs` applied).
    pub profile: PlatformProfile,
    /// The network stack's CPU costs.
    pub costs: StackCosts,
    /// The wire.
    pub link: LinkConfig,
    /// The stream workload as the scenario configures it (threads, direction, sizes, rings,
    /// moderation, run length).
    pub stream: StreamConfig,
    /// How the hypervisor serialises TCE updates.
    pub serialisation: HvSerialisation,
    /// The partition kernel's spinlock algorithm (the TCE pool locks).
    pub pool_lock: LockKind,
    /// The partition's IOMMU, nothing mapped yet.
    pub iommu: Arc<PseriesIommu>,
    /// The NIC's DMA identity.
    pub dev: Device,
    /// Where the run's protection report is read from.
    probe: ProtectionProbe,
    /// Whether the window translates device addresses (not a direct DDW).
    translated: bool,
}

/// Builds the [`NetperfParts`] of `s`: a netperf workload on a NIC, which validation has
/// put on the POWER TCE model (any other scenario is a [`LabError::Model`]).
pub fn netperf_parts(s: &LabScenario) -> Result<NetperfParts, LabError> {
    let (Workload::Netperf(n), Devices::Nic(link)) = (&s.workload, &s.devices) else {
        return Err(model_err(format!(
            "a stream test needs a netperf workload on a nic device, not a {} workload on {} devices",
            s.workload.kind(),
            s.devices.kind()
        )));
    };
    // The IOMMU model has no time of its own; a throw-away engine gives `build` a handle.
    let scratch = crate::trace::untraced(|| Sim::new(SimConfig { cpus: 1, seed: 1 }))?;
    let built = iommu::build(s, scratch.handle())?;
    let iommu = built
        .pseries
        .ok_or_else(|| model_err("netperf's NIC path needs the POWER TCE model"))?;
    Ok(NetperfParts {
        profile: s.profile.clone(),
        costs: n.costs,
        link: *link,
        stream: n.stream,
        serialisation: n.serialisation,
        pool_lock: super::block::kernel_lock_kind(s),
        iommu,
        dev: super::iommu::lab_device(64)?,
        probe: built.protection,
        translated: built.translated,
    })
}

/// Runs the stream test of `s` once with `seed`; returns its result and the protection
/// report of the partition IOMMU the NIC's DMA went through.
pub(crate) fn run_netperf(
    s: &LabScenario,
    seed: u64,
) -> Result<(StreamResult, LabProtection), LabError> {
    let p = netperf_parts(s)?;
    let result = run_stream(
        &p.stream,
        &p.costs,
        p.link,
        p.iommu,
        p.dev,
        &p.profile,
        p.serialisation,
        p.pool_lock,
        seed,
    )
    .map_err(|e| match e {
        NicError::Sim(s) => LabError::Sim(s),
        e => model_err(e),
    })?;
    Ok((result, p.probe.read(p.translated, p.stream.run_ns)))
}

/// Builds the IOMMU the lab's builder makes for `s` (the NIC's DMA through its unit, the
/// driver's maps and unmaps priced by the profile) and runs `test` on it; returns what the
/// test gave and the unit's protection report over `run_ns`.
fn direct_nic<R, E: std::fmt::Display>(
    s: &LabScenario,
    run_ns: u64,
    test: impl FnOnce(
        RxPricing<'_>,
        &dyn iolab_iommu::hw::DmaPath,
        DeviceDma<'_>,
        &Device,
    ) -> Result<R, E>,
) -> Result<(R, LabProtection), LabError> {
    // The IOMMU model has no time of its own; a throw-away engine gives `build` a handle.
    let scratch = crate::trace::untraced(|| Sim::new(SimConfig { cpus: 1, seed: 1 }))?;
    let built = iommu::build(s, scratch.handle())?;
    let dev = iommu::lab_device(64)?;
    let ranges = RefCell::new(Vec::new());
    let dma = DeviceDma {
        path: &*built.path,
        device: &dev,
        ranges: &ranges,
    };
    let cost = s.profile.cpu_cost_model();
    let wait = iommu::hardware_wait(s, built.poll_interval_ns);
    let pricing = RxPricing {
        cost: &cost,
        hardware_wait: &*wait,
    };
    let out = test(pricing, &*built.path, dma, &dev).map_err(model_err)?;
    Ok((out, built.protection.read(built.translated, run_ns)))
}

/// Runs the direct-DMA receive test of `s` (a netperf scenario on an x86 IOMMU or none,
/// [`crate::workloads::rx_stream`]) once: the NIC's DMA through the unit the lab's IOMMU
/// builder makes for `s` (its IOTLB and paging-structure caches), the driver's maps and
/// unmaps priced by the profile. Returns the result and the unit's protection report.
pub(crate) fn run_direct_rx(
    s: &LabScenario,
    d: &crate::lab::spec::DirectRx,
    link: LinkConfig,
) -> Result<(RxStreamResult, LabProtection), LabError> {
    direct_nic(s, d.config.run_ns, |pricing, path, dma, dev| {
        run_rx_stream(&d.config, link, d.costs, pricing, path, dma, dev)
    })
}

/// Runs the direct-DMA send test of `s` (a netperf scenario with `direction = "write"` on an
/// x86 IOMMU or none, [`crate::workloads::tx_stream`]) once: the driver's per-fragment maps
/// and the completions' unmaps priced by the profile, the NIC's reads and writes through the
/// unit the lab's IOMMU builder makes for `s`. Returns the result and the unit's protection
/// report.
pub(crate) fn run_direct_tx(
    s: &LabScenario,
    d: &crate::lab::spec::DirectRx,
    tx: crate::workloads::tx_stream::TxParams,
    link: LinkConfig,
) -> Result<(crate::workloads::tx_stream::TxStreamResult, LabProtection), LabError> {
    direct_nic(s, d.config.run_ns, |pricing, path, dma, dev| {
        crate::workloads::tx_stream::run_tx_stream(&d.config, tx, link, pricing, path, dma, dev)
    })
}
