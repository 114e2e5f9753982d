//! `[kernel]`: the Linux release (its DMA-path algorithms), the block path's per-I/O costs
//! ([`BlockKernel`]), and which kernel fields apply to which workload and device.

use iolab_iommu::linux::{DmaPathVariants, KernelVersion};
use serde::Deserialize;

use crate::cost::{Cost, IoPathCosts, PlatformProfile};
use crate::lab::defaults as d;
use crate::lab::spec::fields::Fields;
use crate::tomlfile::{InputError, TomlDoc};
use crate::workloads::fio::{EngineKind, IoEngine};

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KernelSpec {
    #[serde(default)]
    pub(super) version: Option<String>,
    #[serde(default)]
    pub(super) block_submit_ns: Option<u64>,
    #[serde(default)]
    pub(super) block_complete_ns: Option<u64>,
    #[serde(default)]
    pub(super) irq_entry_ns: Option<u64>,
    #[serde(default)]
    pub(super) page_size: Option<u64>,
    #[serde(default)]
    pub(super) virt_merge: Option<bool>,
    #[serde(default)]
    pub(super) sba_coalesce: Option<bool>,
    #[serde(default)]
    pub(super) dirty_background_mib: Option<f64>,
    #[serde(default)]
    pub(super) dirty_limit_mib: Option<f64>,
    #[serde(default)]
    pub(super) writeback_chunk_kib: Option<u64>,
    #[serde(default)]
    pub(super) readahead_kib: Option<u64>,
    #[serde(default)]
    pub(super) block_queue_depth: Option<usize>,
    #[serde(default)]
    pub(super) fsync_journal_blocks: Option<u64>,
    #[serde(default)]
    pub(super) fsync_commit_flushes: Option<u64>,
    #[serde(default)]
    pub(super) create_journal_blocks: Option<u64>,
    #[serde(default)]
    pub(super) delete_journal_blocks: Option<u64>,
    #[serde(default)]
    pub(super) block_virt_merge: Option<bool>,
    #[serde(default)]
    pub(super) swiotlb_mib: Option<u64>,
    #[serde(default)]
    pub(super) swiotlb_slot_bytes: Option<u64>,
    #[serde(default)]
    pub(super) swiotlb_segment_slots: Option<usize>,
}

/// `[kernel]` fields of bonnie's page cache and file system (refused for other workloads).
const BONNIE_KERNEL_FIELDS: [&str; 9] = [
    "dirty_background_mib",
    "dirty_limit_mib",
    "writeback_chunk_kib",
    "readahead_kib",
    "block_queue_depth",
    "fsync_journal_blocks",
    "fsync_commit_flushes",
    "create_journal_blocks",
    "delete_journal_blocks",
];

/// `[kernel]` fields of the usb device's DMA path (refused for other devices).
const USB_KERNEL_FIELDS: [&str; 4] = [
    "block_virt_merge",
    "swiotlb_mib",
    "swiotlb_slot_bytes",
    "swiotlb_segment_slots",
];

/// Per-I/O kernel costs of the block path, ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockKernel {
    /// io_submit per iocb down to the driver (aio, bio, blk-mq request).
    pub block_submit_ns: u64,
    /// Request completion up to the waiting fio thread's wake-up.
    pub block_complete_ns: u64,
    /// Interrupt entry and exit, per interrupt.
    pub irq_entry_ns: u64,
    /// The driver's submission path per command.
    pub driver_submit_ns: u64,
    /// The driver's completion path per command.
    pub driver_complete_ns: u64,
    /// Completions are found by polling (fio's `hipri`), not by interrupts: `irq_entry_ns`
    /// is then the poll check per pass, and the CPUs waiting on them never idle.
    pub polled: bool,
}

/// IOMMU models whose Linux DMA path has no release variants in the lab (their own IOMMU
/// code, not dma-iommu): a scenario on them may state a release older than
/// [`KernelVersion::OLDEST`] (sba-vmerge's Linux 2.6.0).
const MODELS_WITHOUT_VARIANTS: [&str; 2] = ["sba", "pseries"];

/// The DMA-path algorithms of `kernel.version` (default [`d::KERNEL_VERSION`]) for a scenario
/// on `iommu.model = model`.
pub(super) fn kernel_variants(
    doc: &TomlDoc<'_>,
    k: &KernelSpec,
    model: &str,
) -> Result<DmaPathVariants, InputError> {
    let text = k.version.as_deref().unwrap_or(d::KERNEL_VERSION.0);
    let without_variants = MODELS_WITHOUT_VARIANTS.contains(&model);
    let refuse = |e: String| {
        let older = if without_variants {
            String::new()
        } else {
            format!(
                "; a release before {} is accepted only for iommu.model = \"sba\" or \"pseries\", whose DMA path has no release variants in the lab",
                KernelVersion::OLDEST
            )
        };
        doc.field_error(
            "kernel.version",
            format!(
                "{e}: expected a Linux release from {} to {} such as \"6.6\"{older}",
                KernelVersion::OLDEST,
                KernelVersion::NEWEST
            ),
        )
    };
    let version = KernelVersion::parse(text).map_err(|e| refuse(e.to_string()))?;
    if without_variants && version < KernelVersion::OLDEST {
        return Ok(DmaPathVariants::without_variants(version));
    }
    DmaPathVariants::for_kernel(version).map_err(|e| refuse(e.to_string()))
}

/// Refuses `[kernel]` and `[machine]` fields the scenario's workload and device do not use:
/// bonnie's page cache and file-system costs and `machine.memory_banks` (bonnie only), the
/// usb DMA path's (`block_virt_merge`, swiotlb; bonnie on usb only).
pub(super) fn applicable_fields(
    doc: &TomlDoc<'_>,
    kernel: &Option<toml::Table>,
    machine: &Option<toml::Table>,
    wkind: &str,
    dkind: &str,
) -> Result<(), InputError> {
    let has = |t: &Option<toml::Table>, k: &str| t.as_ref().is_some_and(|t| t.contains_key(k));
    if wkind != "bonnie" {
        if has(machine, "memory_banks") {
            return Err(doc.field_error(
                "machine.memory_banks",
                format!("places bonnie's page cache; a {wkind} workload has none"),
            ));
        }
        for k in BONNIE_KERNEL_FIELDS {
            if has(kernel, k) {
                return Err(doc.field_error(
                    &format!("kernel.{k}"),
                    format!("applies to bonnie's page cache and file system; a {wkind} workload has none"),
                ));
            }
        }
    }
    if wkind != "bonnie" || dkind != "usb" {
        for k in USB_KERNEL_FIELDS {
            if has(kernel, k) {
                return Err(doc.field_error(
                    &format!("kernel.{k}"),
                    format!(
                        "applies to bonnie on a usb device's DMA path, not to {wkind} on {dkind}"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The block path's per-I/O kernel costs: the scenario's `[kernel]` fields, else the platform
/// profile's `io_path` (libaio's totals; [`BlockKernel::for_engine`] adjusts them to fio's
/// engine).
pub(super) fn kernel(
    doc: &TomlDoc<'_>,
    k: &KernelSpec,
    profile: &PlatformProfile,
    driver_submit_ns: u64,
    driver_complete_ns: u64,
) -> Result<BlockKernel, InputError> {
    let (kernel, dev) = (Fields::new(doc, "kernel"), Fields::new(doc, "device[0]"));
    let ns = |t: &Fields<'_, '_>, field: &str, v: Option<u64>, default: u64| {
        t.int(field, v.unwrap_or(default), 0..=1_000_000, "ns")
    };
    let io = &profile.io_path;
    let of = |c: &Cost| c.ns().round() as u64;
    Ok(BlockKernel {
        block_submit_ns: ns(
            &kernel,
            "block_submit_ns",
            k.block_submit_ns,
            of(&io.block_submit),
        )?,
        block_complete_ns: ns(
            &kernel,
            "block_complete_ns",
            k.block_complete_ns,
            of(&io.block_complete),
        )?,
        irq_entry_ns: ns(&kernel, "irq_entry_ns", k.irq_entry_ns, of(&io.irq_entry))?,
        driver_submit_ns: ns(&dev, "submit_ns", Some(driver_submit_ns), 0)?,
        driver_complete_ns: ns(&dev, "complete_ns", Some(driver_complete_ns), 0)?,
        polled: false,
    })
}

impl BlockKernel {
    /// These costs as fio's `engine` pays them, from libaio's totals and the profile's
    /// shares (`io_path`, docs/model/io-path.md): psync does no aio work; io_uring does its
    /// own in place of aio's and saves the file reference (`registerfiles`) and the page
    /// pinning (`fixedbufs`); polled completions (`hipri`) replace the interrupt by a poll
    /// check and save the wake-up.
    pub fn for_engine(self, engine: &IoEngine, io: &IoPathCosts) -> BlockKernel {
        let of = |c: &Cost| c.ns().round() as u64;
        let mut k = self;
        match engine.kind {
            EngineKind::Psync => {
                k.block_submit_ns = k.block_submit_ns.saturating_sub(of(&io.aio_submit));
            }
            EngineKind::Libaio => {}
            EngineKind::IoUring => {
                let mut saved = of(&io.aio_submit);
                if engine.fixedbufs {
                    saved += of(&io.page_pin);
                }
                if engine.registerfiles {
                    saved += of(&io.file_ref);
                }
                k.block_submit_ns = k.block_submit_ns.saturating_sub(saved) + of(&io.uring_submit);
                if engine.hipri {
                    k.block_complete_ns = k.block_complete_ns.saturating_sub(of(&io.wakeup));
                    k.irq_entry_ns = of(&io.poll_check);
                    k.polled = true;
                }
            }
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;

    /// The profile's cost at `path`, ns, rounded as the lab takes it.
    fn profile_ns(platform: &str, path: &str) -> u64 {
        let p = PlatformProfile::bundled(platform).unwrap();
        p.cost(path).unwrap().ns().round() as u64
    }

    #[test]
    fn block_kernel_costs_default_to_the_profile_s_and_take_the_driver_s() {
        let libaio = FIO_NVME;
        let s = ok(libaio);
        let d06 = |path: &str| profile_ns("hisilicon-d06", path);
        assert_eq!(
            s.kernel,
            BlockKernel {
                block_submit_ns: d06("io_path.block_submit"),
                block_complete_ns: d06("io_path.block_complete"),
                irq_entry_ns: d06("io_path.irq_entry"),
                driver_submit_ns: d06("io_path.nvme_submit"),
                driver_complete_ns: d06("io_path.nvme_complete"),
                polled: false,
            }
        );
        // Another platform, other costs: Ice Lake's are cycles at 2.8 GHz.
        let icx = ok(&libaio
            .replace("hisilicon-d06", "intel-icelake-2s")
            .replace("\"smmuv3\"", "\"vtd\""));
        assert_eq!(
            icx.kernel.block_submit_ns,
            profile_ns("intel-icelake-2s", "io_path.block_submit")
        );
        assert_eq!(icx.kernel.block_submit_ns, (3200.0f64 / 2.8).round() as u64);
        let s = ok(&with(
            &with(FIO_SAS, "kernel", "block_submit_ns = 111\nirq_entry_ns = 0"),
            "device",
            "complete_ns = 222",
        ));
        assert_eq!((s.kernel.block_submit_ns, s.kernel.irq_entry_ns), (111, 0));
        assert_eq!(
            (s.kernel.driver_submit_ns, s.kernel.driver_complete_ns),
            (d::SAS_SUBMIT_NS.0, 222)
        );
        assert_eq!(s.iommu.kernel.kernel.to_string(), d::KERNEL_VERSION.0);
    }

    #[test]
    fn each_engine_pays_its_own_share_of_the_block_path() {
        let d06 = |path: &str| profile_ns("hisilicon-d06", path);
        let engine = |fields: &str| ok(&FIO_NVME.replace("ioengine = \"libaio\"", fields)).kernel;
        let (submit, complete) = (d06("io_path.block_submit"), d06("io_path.block_complete"));
        // psync (fio's default): no aio work.
        let psync = ok(&FIO_NVME.replace("ioengine = \"libaio\"\n", "")).kernel;
        assert_eq!(psync.block_submit_ns, submit - d06("io_path.aio_submit"));
        assert_eq!((psync.block_complete_ns, psync.polled), (complete, false));
        // io_uring: its own work in place of aio's; registered files and buffers save theirs.
        let uring = engine("ioengine = \"io_uring\"");
        let own = submit - d06("io_path.aio_submit") + d06("io_path.uring_submit");
        assert_eq!(uring.block_submit_ns, own);
        let lean = engine("ioengine = \"io_uring\"\nfixedbufs = true\nregisterfiles = true");
        assert_eq!(
            lean.block_submit_ns,
            own - d06("io_path.page_pin") - d06("io_path.file_ref")
        );
        // Polled: a poll check in place of the interrupt, no wake-up.
        let hipri = engine("ioengine = \"io_uring\"\nhipri = true");
        assert!(hipri.polled);
        assert_eq!(hipri.irq_entry_ns, d06("io_path.poll_check"));
        assert_eq!(hipri.block_complete_ns, complete - d06("io_path.wakeup"));
        // A scenario's own total is the libaio total the shares come out of.
        let given = ok(&with(
            &FIO_NVME.replace("ioengine = \"libaio\"", "ioengine = \"psync\""),
            "kernel",
            "block_submit_ns = 2000",
        ))
        .kernel;
        assert_eq!(given.block_submit_ns, 2000 - d06("io_path.aio_submit"));
    }

    #[test]
    fn kernel_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(FIO_NVME, "kernel", "block_submit_ns = 2000000"),
            "kernel.block_submit_ns",
            "expected 0..=1000000 ns, got 2000000",
        );
        refused(
            &with(FIO_NVME, "device", "submit_ns = 2000000"),
            "device[0].submit_ns",
            "expected 0..=1000000 ns, got 2000000",
        );
        refused(
            &with(FIO_NVME, "kernel", "irq_entry_ns = 1.5"),
            "kernel.irq_entry_ns",
            "invalid type: floating point `1.5`, expected a non-negative integer",
        );
        refused(
            &with(FIO_NVME, "kernel", "hz = 250"),
            "kernel.hz",
            "unknown field `hz`, expected one of `version`, `block_submit_ns`",
        );
        refused(
            &with(FIO_NVME, "kernel", "version = \"2.6\""),
            "kernel.version",
            "expected a Linux release from 4.19 to",
        );
    }

    #[test]
    fn kernel_fields_of_other_workloads_and_devices_are_refused() {
        refused(
            &with(FIO_NVME, "kernel", "page_size = 65536"),
            "kernel.page_size",
            "applies to reaim workloads only",
        );
        refused(
            &with(FIO_NVME, "kernel", "virt_merge = false"),
            "kernel.virt_merge",
            "applies to scsi devices only",
        );
        refused(
            &with(FIO_NVME, "kernel", "dirty_limit_mib = 8.0"),
            "kernel.dirty_limit_mib",
            "applies to bonnie's page cache and file system; a fio workload has none",
        );
        refused(
            &with(BONNIE_SCSI, "kernel", "swiotlb_mib = 64"),
            "kernel.swiotlb_mib",
            "applies to bonnie on a usb device's DMA path, not to bonnie on scsi",
        );
        refused(
            &with(FIO_NVME, "kernel", "sba_coalesce = true"),
            "kernel.sba_coalesce",
            "applies to iommu.model = \"sba\" in mode translated or bypass",
        );
        let s = ok(&with(BONNIE_SCSI, "kernel", "sba_coalesce = false"));
        assert!(!s.iommu.sba_coalesce);
    }
}
