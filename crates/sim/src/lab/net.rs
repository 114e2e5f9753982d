//! netperf-like TCP streams on a NIC (an mlx5 SR-IOV VF) in a PowerVM partition: the same
//! NIC, TCE path and stream models the `pseries-ddw` experiment runs, for one scenario.

use iolab_iommu::dma::Device;

use super::LabError;
use crate::devices::nic::{LinkConfig, NicError};
use crate::engine::Sim;
use crate::engine::SimConfig;
use crate::workloads::netperf::{run_stream, StreamResult};

use super::iommu::{self, model_err, LabProtection};
use super::spec::{LabScenario, NetperfSetup};

/// Runs the stream test of `s` once with `seed`; returns its result and the protection
/// report of the partition IOMMU the NIC's DMA went through.
pub(crate) fn run_netperf(
    s: &LabScenario,
    n: &NetperfSetup,
    link: LinkConfig,
    seed: u64,
) -> Result<(StreamResult, LabProtection), LabError> {
    // The IOMMU model has no time of its own; a throw-away engine gives `build` a handle.
    let scratch = crate::trace::untraced(|| Sim::new(SimConfig { cpus: 1, seed }))?;
    let built = iommu::build(s, scratch.handle())?;
    let probe = built.protection.clone();
    let translated = built.translated;
    let iommu = built
        .pseries
        .ok_or_else(|| model_err("netperf's NIC path needs the POWER TCE model"))?;
    let dev = Device::new(1, 64).map_err(model_err)?;
    let result = run_stream(
        &n.stream,
        &n.costs,
        link,
        iommu,
        dev,
        &s.profile,
        n.serialisation,
        seed,
    )
    .map_err(|e| match e {
        NicError::Sim(s) => LabError::Sim(s),
        e => model_err(e),
    })?;
    Ok((result, probe.read(translated, n.stream.run_ns)))
}
