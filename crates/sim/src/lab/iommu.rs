//! Builds the DMA path a scenario's devices use: the IOMMU model in the chosen mode, and
//! for SMMUv3 in a translated mode, its command queue in virtual time.

use std::sync::Arc;

use iolab_iommu::addr::{Iova, SZ_4K};
use iolab_iommu::dma::flush_queue::FlushQueueConfig;
use iolab_iommu::dma::{Domain, DomainConfig, DomainId, DomainMode};
use iolab_iommu::hw::DmaPath;
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::magazine::{MagazineCache, MagazineConfig};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::smmuv3::ProducerKind;

use crate::engine::Handle;
use crate::experiments::smmuv3_cmdq::{CmdqInvalidator, Mode as CmdqMode, SimCmdq};
use crate::experiments::ExperimentError;

use super::spec::{CmdqDesign, IommuMode, IommuModel, LabScenario};

/// The DMA path of one run.
pub(crate) struct IommuPath {
    /// What drivers map and unmap through.
    pub path: Arc<dyn DmaPath>,
    /// SMMUv3 translated modes: the functional command builder and the timed queue.
    pub cmdq: Option<(Arc<CmdqInvalidator>, SimCmdq)>,
}

pub(crate) fn model_err(e: impl std::fmt::Display) -> ExperimentError {
    ExperimentError::Model(e.to_string())
}

/// Builds the path of `s` on the simulation of `h`.
pub(crate) fn build(s: &LabScenario, h: &Handle) -> Result<IommuPath, ExperimentError> {
    let id = DomainId(1);
    let mut cfg = DomainConfig::new(id, DomainMode::NoIommu);
    cfg.cpus = s.cpus;
    match (s.iommu.model, s.iommu.mode) {
        (_, IommuMode::Off) => Ok(IommuPath {
            path: Arc::new(Domain::direct(cfg).map_err(model_err)?),
            cmdq: None,
        }),
        (IommuModel::Smmuv3, IommuMode::Passthrough) => {
            cfg.mode = DomainMode::Identity;
            Ok(IommuPath {
                path: Arc::new(Domain::direct(cfg).map_err(model_err)?),
                cmdq: None,
            })
        }
        (IommuModel::Smmuv3, mode @ (IommuMode::Strict | IommuMode::Lazy)) => {
            cfg.mode = if mode == IommuMode::Strict {
                DomainMode::Strict
            } else {
                DomainMode::Lazy
            };
            cfg.flush_queue = FlushQueueConfig {
                ring_size: s.iommu.flush_queue_size,
                timeout_ns: s.iommu.flush_timeout_ns,
            };
            let (kind, qmode) = match s.iommu.cmdq {
                CmdqDesign::Spinlock => (ProducerKind::Spinlock, CmdqMode::Spinlock),
                CmdqDesign::LockFree => (ProducerKind::LockFree, CmdqMode::LockFree),
            };
            let inv = Arc::new(CmdqInvalidator::new(kind, s.iommu.cmdq_log2size, 1)?);
            let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).map_err(model_err)?;
            let tree = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48)))
                .map_err(model_err)?;
            let alloc = MagazineCache::new(tree, MagazineConfig::new(s.cpus)).map_err(model_err)?;
            let domain = Domain::translated(cfg, Box::new(table), Arc::new(alloc), inv.clone())
                .map_err(model_err)?;
            let q = SimCmdq::new(h, qmode, &s.profile, s.iommu.cmdq_batch_max)?;
            Ok(IommuPath {
                path: Arc::new(domain),
                cmdq: Some((inv, q)),
            })
        }
        (model, mode) => Err(model_err(format!(
            "iommu model {} in mode {} is not built (validation should have refused it)",
            model.name(),
            mode.name()
        ))),
    }
}
