//! The workload-scenario file: its TOML schema and its validation into a [`LabScenario`].
//!
//! The file is read in two passes so every error keeps its line: a first, lenient pass reads
//! only `workload.kind` and each `device[].kind`; the second deserializes the whole file
//! strictly (`deny_unknown_fields`) with the workload and device tables of those kinds, so
//! a field that belongs to another kind is reported as unknown where it stands. Checks that
//! serde cannot express (ranges, caps, combinations) name their field through
//! [`TomlDoc::field_error`]. See docs/SCENARIOS.md for every field, default and cap.
//!
//! One module per section of the file, each with its table as written (`...Spec`, serde), its
//! validated form (`...Setup`) and its checks: `machine`, `iommu`, `kernel`, `device/` (one
//! file per kind) and `workload/` (one file per kind); `fields` holds the range checks they
//! share. This module reads the file, picks the
//! device and workload kinds and puts the sections together into a [`LabScenario`].

mod device;
mod fields;
mod iommu;
mod kernel;
mod machine;
mod workload;

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::cost::PlatformProfile;
use crate::lab::LabError;
use crate::tomlfile::{InputError, TomlDoc};

use crate::lab::caps::*;
use crate::lab::defaults as d;

use device::nic::{nic, NicSpec};
use device::nvme::{hostile_needs_fio, NvmeSpec};
use device::sas::SasSpec;
use device::scsi::{scsi, virt_merge, ScsiSpec};
use device::usb::{usb, UsbSpec};
use device::{one_device, BlockSpec};
use fields::{one_of, Fields};
use iommu::{instances, iommu, sba_maps_lists, IommuSpec};
use kernel::{applicable_fields, kernel, kernel_variants, KernelSpec};
use machine::{load_profile, memory_banks, override_costs, MachineSpec};
use workload::bonnie::{bonnie, bonnie_on_block, BonnieSpec};
use workload::dma_map_benchmark::{dma_map_benchmark, DmaMapBenchmarkSpec};
use workload::fio::{fio, FioSpec};
use workload::netperf::{netperf, NetperfSpec};
use workload::reaim::{reaim, ReaimSpec};

pub use device::{Devices, NvmeSetup, ScsiSetup, SwiotlbSetup, UsbSetup};
pub use iommu::{CmdqDesign, IommuMode, IommuModel, IommuSetup};
pub use kernel::BlockKernel;
pub use workload::{
    BonnieSetup, DirectRx, DmaMapBenchmarkSetup, FioSetup, MapDirection, NetperfSetup, ReaimSetup,
    Workload,
};

#[derive(Deserialize)]
struct KindOnly {
    #[serde(default)]
    kind: Option<toml::Value>,
}

/// First pass: only what picks the second pass's types.
#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    device: Option<Vec<KindOnly>>,
    #[serde(default)]
    workload: Option<KindOnly>,
    #[serde(default)]
    kernel: Option<toml::Table>,
    #[serde(default)]
    machine: Option<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File<D, W> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    machine: MachineSpec,
    iommu: IommuSpec,
    #[serde(default)]
    kernel: KernelSpec,
    device: Vec<D>,
    workload: W,
    /// Provenance only; checked by [`check_fitted`] before this pass.
    #[serde(default, rename = "fitted")]
    _fitted: Vec<toml::Value>,
}

/// A `[[fitted]]` entry: where one field's value came from (written by `iolab fit`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FittedSpec {
    field: String,
    value: f64,
    source: String,
}

/// Checks every `[[fitted]]` entry against the scenario: its field is present and holds the
/// value the entry states, so a provenance note cannot outlive an edit of the value.
fn check_fitted(doc: &TomlDoc<'_>) -> Result<(), InputError> {
    #[derive(Deserialize)]
    struct Only {
        #[serde(default)]
        fitted: Vec<toml::Value>,
    }
    let only: Only = doc.deserialize()?;
    if only.fitted.is_empty() {
        return Ok(());
    }
    let table: toml::Table = doc.deserialize()?;
    for (i, entry) in only.fitted.iter().enumerate() {
        let at = format!("fitted[{i}]");
        let e: FittedSpec = entry.clone().try_into().map_err(|e: toml::de::Error| {
            doc.field_error(
                &at,
                format!(
                    "expected {{ field = \"PATH\", value = NUMBER, source = \"...\" }}: {}",
                    e.message()
                ),
            )
        })?;
        if e.source.trim().is_empty() {
            return Err(doc.field_error(&format!("{at}.source"), "expected a non-empty source"));
        }
        let steps = crate::tomlpatch::parse_path(&e.field)
            .map_err(|p| doc.field_error(&format!("{at}.field"), p))?;
        let held = crate::tomlpatch::get_field(&table, &steps).and_then(|v| match v {
            toml::Value::Integer(n) => Some(*n as f64),
            toml::Value::Float(f) => Some(*f),
            toml::Value::Table(t) => match t.get("value") {
                Some(toml::Value::Integer(n)) => Some(*n as f64),
                Some(toml::Value::Float(f)) => Some(*f),
                _ => None,
            },
            _ => None,
        });
        match held {
            None => {
                return Err(doc.field_error(
                    &format!("{at}.field"),
                    format!("the scenario has no number at `{}` to say where it came from", e.field),
                ))
            }
            Some(v) if v != e.value => {
                return Err(doc.field_error(
                    &format!("{at}.value"),
                    format!(
                        "the scenario's `{}` is {v}, the fit gave {}: refit, or remove this entry if the value was changed on purpose",
                        e.field, e.value
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A validated workload scenario: everything a run needs.
#[derive(Clone, Debug)]
pub struct LabScenario {
    /// The scenario's label (`name`, default `lab`).
    pub name: String,
    /// The scenario's description, if any.
    pub description: Option<String>,
    /// The scenario's own seed (`--seed` overrides it).
    pub seed: Option<u64>,
    /// The platform profile.
    pub profile: PlatformProfile,
    /// Virtual CPUs.
    pub cpus: usize,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// The IOMMU.
    pub iommu: IommuSetup,
    /// Block-path kernel costs (block workloads).
    pub kernel: BlockKernel,
    /// The devices.
    pub devices: Devices,
    /// The workload.
    pub workload: Workload,
}

const DEVICE_KINDS: [&str; 5] = ["nvme", "sas", "usb", "nic", "scsi"];

const WORKLOAD_KINDS: [&str; 5] = ["fio", "bonnie", "netperf", "reaim", "dma_map_benchmark"];

fn kind_of(
    doc: &TomlDoc<'_>,
    path: &str,
    k: &KindOnly,
    kinds: &[&str],
) -> Result<String, InputError> {
    match &k.kind {
        Some(toml::Value::String(s)) if kinds.contains(&s.as_str()) => Ok(s.clone()),
        Some(toml::Value::String(s)) => Err(doc.field_error(
            &format!("{path}.kind"),
            format!("unknown kind \"{s}\": {}", one_of(kinds)),
        )),
        Some(_) => Err(doc.field_error(&format!("{path}.kind"), one_of(kinds))),
        None => Err(doc.field_error(path, format!("missing field `kind`: {}", one_of(kinds)))),
    }
}

fn deserialize_as<D: DeserializeOwned, W: DeserializeOwned>(
    doc: &TomlDoc<'_>,
) -> Result<File<D, W>, InputError> {
    doc.deserialize::<File<D, W>>()
}

/// Validates a workload scenario. `base` is the directory relative profile paths are
/// resolved against (the scenario file's directory).
pub fn validate(text: &str, origin: &str, base: Option<&Path>) -> Result<LabScenario, LabError> {
    let doc = TomlDoc::parse(text, origin)?;
    let probe: Probe = doc.deserialize()?;
    let Some(devices) = probe.device else {
        return Err(doc
            .field_error(
                "device",
                "missing: expected at least one [[device]] table (docs/SCENARIOS.md)",
            )
            .into());
    };
    let Some(workload) = probe.workload else {
        return Err(doc
            .field_error(
                "workload",
                "missing: expected a [workload] table with a `kind`",
            )
            .into());
    };
    let wkind = kind_of(&doc, "workload", &workload, &WORKLOAD_KINDS)?;
    check_fitted(&doc)?;
    if devices.is_empty() {
        return Err(doc
            .field_error("device", "expected at least one [[device]]")
            .into());
    }
    if devices.len() > MAX_DEVICES {
        return Err(doc
            .field_error(
                "device",
                format!(
                    "expected at most {MAX_DEVICES} devices (cap MAX_DEVICES), got {}",
                    devices.len()
                ),
            )
            .into());
    }
    let mut dkind = String::new();
    for (i, dev) in devices.iter().enumerate() {
        let k = kind_of(&doc, &format!("device[{i}]"), dev, &DEVICE_KINDS)?;
        if i == 0 {
            dkind = k;
        } else if k != dkind {
            return Err(doc
                .field_error(
                    &format!("device[{i}].kind"),
                    format!("expected \"{dkind}\" like device[0]: the devices of one scenario are of one kind"),
                )
                .into());
        }
    }
    applicable_fields(&doc, &probe.kernel, &probe.machine, &wkind, &dkind)?;
    if let Some(k) = &probe.kernel {
        if k.contains_key("page_size") && wkind != "reaim" {
            return Err(doc
                .field_error(
                    "kernel.page_size",
                    "applies to reaim workloads only (the page size of re-aim's page cache; the other workloads' buffers are 4 KiB pages)",
                )
                .into());
        }
        if k.contains_key("virt_merge") && dkind != "scsi" {
            return Err(doc
                .field_error(
                    "kernel.virt_merge",
                    "applies to scsi devices only (the block layer's virtual merge on the SCSI host's queue)",
                )
                .into());
        }
    }
    let scenario = match (wkind.as_str(), dkind.as_str()) {
        ("fio", "nvme") => fio_on::<NvmeSpec>(&doc, base),
        ("fio", "sas") => fio_on::<SasSpec>(&doc, base),
        ("dma_map_benchmark", "nvme") => dma_map_benchmark_on::<NvmeSpec>(&doc, base),
        ("dma_map_benchmark", "sas") => dma_map_benchmark_on::<SasSpec>(&doc, base),
        ("bonnie", "nvme") => bonnie_on::<NvmeSpec>(&doc, base),
        ("bonnie", "sas") => bonnie_on::<SasSpec>(&doc, base),
        ("bonnie", "scsi") => {
            let f: File<ScsiSpec, BonnieSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "bonnie")?;
            instances(&doc, &common.iommu, &[None])?;
            let mut scsi = scsi(&doc, &f.device[0], &common.profile)?;
            virt_merge(&doc, &f.kernel, &common.iommu, &mut scsi)?;
            let bonnie = bonnie(&doc, &f.workload, &f.kernel, &common, scsi.limits)?;
            let kernel = kernel(&doc, &f.kernel, &common.profile, 0, 0)?;
            Ok(common.finish(kernel, Devices::Scsi(Box::new(scsi)), Workload::Bonnie(Box::new(bonnie))))
        }
        ("bonnie", "usb") => {
            let f: File<UsbSpec, BonnieSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "bonnie")?;
            instances(&doc, &common.iommu, &[None])?;
            if !matches!(common.iommu.model, IommuModel::None | IommuModel::Ipmmu) {
                return Err(doc
                    .field_error(
                        "iommu.model",
                        "bonnie on usb is modelled behind the R-Car xHCI: expected \"none\" or \"ipmmu\"",
                    )
                    .into());
            }
            let usb = usb(&doc, &f.device[0], &f.kernel, &common)?;
            let virt_merge = f.kernel.block_virt_merge.unwrap_or(d::BLOCK_VIRT_MERGE.0);
            if virt_merge && common.iommu.mode == IommuMode::Off {
                return Err(doc
                    .field_error(
                        "kernel.block_virt_merge",
                        "true needs an IOMMU that merges page-aligned pieces (iommu.model = \"ipmmu\"): without one nothing merges",
                    )
                    .into());
            }
            let limits = crate::block::QueueLimits {
                max_segments: usb.max_segments,
                max_segment_size: usb.max_segment_size,
                max_transfer: usb.config.link.max_transfer,
                virt_merge_granule: virt_merge.then_some(4096),
            };
            let mut bonnie = bonnie(&doc, &f.workload, &f.kernel, &common, limits)?;
            if common.memory_banks.is_some() {
                // The swiotlb pool was taken from the start of the first bank at boot: the
                // page cache has the rest.
                let first = &mut bonnie.config.ram_banks[0];
                first.0 += usb.swiotlb.bytes;
                first.1 -= usb.swiotlb.bytes;
            }
            let kernel = kernel(&doc, &f.kernel, &common.profile, 0, 0)?;
            Ok(common.finish(kernel, Devices::Usb(Box::new(usb)), Workload::Bonnie(Box::new(bonnie))))
        }
        ("netperf", "nic") => {
            let f: File<NicSpec, NetperfSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "netperf")?;
            instances(&doc, &common.iommu, &[None])?;
            let (link, nic, direct) = nic(&doc, &f.device[0])?;
            let direct = match (common.iommu.model, common.iommu.mode) {
                // A direct DDW is a static map: the NIC path maps by offset, with no pools
                // and no per-I/O hypercalls (devices::nic::TceDma).
                (_, IommuMode::DefaultWindow | IommuMode::DdwDynamic | IommuMode::DdwDirect) => {
                    if let Some(field) = direct.given {
                        return Err(doc
                            .field_error(
                                &format!("device[0].{field}"),
                                "applies to the direct-DMA receive path (iommu.model = \"vtd\", \"amd-vi\" or \"none\"), not to the POWER TCE path",
                            )
                            .into());
                    }
                    None
                }
                // The direct-DMA receive path: the NIC's DMA through an x86 unit's caches,
                // or untranslated (workloads::rx_stream).
                (IommuModel::None, IommuMode::Off)
                | (
                    IommuModel::Vtd | IommuModel::AmdVi,
                    IommuMode::Strict | IommuMode::Lazy | IommuMode::Passthrough,
                ) => Some(direct),
                _ => {
                    return Err(doc
                        .field_error(
                            "iommu.model",
                            "the NIC model's DMA paths are the POWER TCE path (\"pseries\") and the direct-DMA receive path (\"vtd\", \"amd-vi\" or \"none\")",
                        )
                        .into())
                }
            };
            let netperf = netperf(&doc, &f.workload, &common, nic, direct)?;
            let kernel = kernel(&doc, &f.kernel, &common.profile, 0, 0)?;
            Ok(common.finish(kernel, Devices::Nic(link), Workload::Netperf(Box::new(netperf))))
        }
        ("reaim", "scsi") => {
            let f: File<ScsiSpec, ReaimSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "reaim")?;
            instances(&doc, &common.iommu, &[None])?;
            let mut scsi = scsi(&doc, &f.device[0], &common.profile)?;
            virt_merge(&doc, &f.kernel, &common.iommu, &mut scsi)?;
            let reaim = reaim(&doc, &f.workload, &f.kernel, &common, &scsi)?;
            let kernel = kernel(&doc, &f.kernel, &common.profile, 0, 0)?;
            Ok(common.finish(kernel, Devices::Scsi(Box::new(scsi)), Workload::Reaim(Box::new(reaim))))
        }
        (w, dv) => Err(doc
            .field_error(
                "workload.kind",
                format!(
                    "a {w} workload does not run on {dv} devices: fio runs on nvme or sas, bonnie on nvme, sas, scsi or usb, netperf on nic, reaim on scsi"
                ),
            )
            .into()),
    }?;
    hostile_needs_fio(&doc, &scenario)?;
    Ok(scenario)
}

/// The parts of a block-device scenario every workload shares, validated in order: the
/// file's shape, the common tables, (for a workload that drives one device) the device
/// count, the devices, the block kernel costs.
fn block_parts<D: BlockSpec, W: DeserializeOwned>(
    doc: &TomlDoc<'_>,
    base: Option<&Path>,
    one_device_for: Option<&str>,
) -> Result<(File<D, W>, Common, Devices, BlockKernel), LabError> {
    let f: File<D, W> = deserialize_as(doc)?;
    let mut common = common(doc, &f, base)?;
    if let Some(workload) = one_device_for {
        one_device(doc, f.device.len(), workload)?;
    }
    let devices = D::devices(doc, &f.device, common.cpus)?;
    let named: Vec<Option<usize>> = f.device.iter().map(|d| d.iommu_instance()).collect();
    common.iommu.device_instance = instances(doc, &common.iommu, &named)?;
    let (drv_s, drv_c) = f.device[0].driver_ns(&common.profile);
    let kernel = kernel(doc, &f.kernel, &common.profile, drv_s, drv_c)?;
    Ok((f, common, devices, kernel))
}

/// fio on NVMe SSDs or SAS HBAs.
fn fio_on<D: BlockSpec>(doc: &TomlDoc<'_>, base: Option<&Path>) -> Result<LabScenario, LabError> {
    let (f, common, devices, kernel) = block_parts::<D, FioSpec>(doc, base, None)?;
    let fio = fio(doc, &f.workload, &common)?;
    let kernel = kernel.for_engine(&fio.engine, &common.profile.io_path);
    Ok(common.finish(kernel, devices, Workload::Fio(fio)))
}

/// The kernel's DMA-mapping benchmark bound to one NVMe SSD or SAS HBA (its IOMMU domain).
fn dma_map_benchmark_on<D: BlockSpec>(
    doc: &TomlDoc<'_>,
    base: Option<&Path>,
) -> Result<LabScenario, LabError> {
    let (f, common, devices, kernel) =
        block_parts::<D, DmaMapBenchmarkSpec>(doc, base, Some("dma_map_benchmark"))?;
    let b = dma_map_benchmark(doc, &f.workload, &common)?;
    Ok(common.finish(kernel, devices, Workload::DmaMapBenchmark(b)))
}

/// bonnie on one NVMe SSD or SAS HBA.
fn bonnie_on<D: BlockSpec>(
    doc: &TomlDoc<'_>,
    base: Option<&Path>,
) -> Result<LabScenario, LabError> {
    let (f, common, devices, kernel) = block_parts::<D, BonnieSpec>(doc, base, Some("bonnie"))?;
    let bonnie = bonnie_on_block(doc, &f.workload, &f.kernel, &common, &devices)?;
    Ok(common.finish(kernel, devices, Workload::Bonnie(Box::new(bonnie))))
}

/// The parts every kind shares, validated.
struct Common {
    name: String,
    description: Option<String>,
    seed: Option<u64>,
    profile: PlatformProfile,
    cpus: usize,
    memory_bytes: u64,
    /// `machine.memory_banks`: `(base, bytes)` each, ascending.
    memory_banks: Option<Vec<(u64, u64)>>,
    iommu: IommuSetup,
}

impl Common {
    fn finish(self, kernel: BlockKernel, devices: Devices, workload: Workload) -> LabScenario {
        LabScenario {
            name: self.name,
            description: self.description,
            seed: self.seed,
            profile: self.profile,
            cpus: self.cpus,
            memory_bytes: self.memory_bytes,
            iommu: self.iommu,
            kernel,
            devices,
            workload,
        }
    }
}

fn common<D, W>(
    doc: &TomlDoc<'_>,
    f: &File<D, W>,
    base: Option<&Path>,
) -> Result<Common, LabError> {
    let machine = Fields::new(doc, "machine");
    let name = match &f.name {
        Some(n) if n.trim().is_empty() || n.len() > 200 => {
            return Err(doc
                .field_error(
                    "name",
                    "expected a non-empty label of at most 200 characters",
                )
                .into())
        }
        Some(n) => n.clone(),
        None => "lab".to_owned(),
    };
    let mut profile = load_profile(doc, &f.machine.platform, base)?;
    override_costs(doc, &mut profile, &f.machine.costs)?;
    let cpus = match f.machine.cpus {
        Some(c) => machine.int("cpus", c, 1..=MAX_CPUS, "(cap MAX_CPUS)")?,
        None => (profile.cpu.cores as usize).clamp(1, MAX_CPUS),
    };
    let memory_gib = machine.int(
        "memory_gib",
        f.machine.memory_gib.unwrap_or(d::MEMORY_GIB.0),
        1..=MAX_MEMORY_GIB,
        "GiB (cap MAX_MEMORY_GIB)",
    )?;
    let memory_banks = f
        .machine
        .memory_banks
        .as_deref()
        .map(|b| memory_banks(doc, b, memory_gib))
        .transpose()?;
    let kernel = kernel_variants(doc, &f.kernel, &f.iommu.model)?;
    let mut iommu = iommu(doc, &f.iommu, &profile, memory_gib, kernel)?;
    if let Some(coalesce) = f.kernel.sba_coalesce {
        if !sba_maps_lists(&iommu) {
            return Err(doc
                .field_error(
                    "kernel.sba_coalesce",
                    "applies to iommu.model = \"sba\" in mode translated or bypass (the SBA driver's sba_map_sg)",
                )
                .into());
        }
        iommu.sba_coalesce = coalesce;
    }
    // The profile describes this machine: its core count is the scenario's.
    profile.cpu.cores = cpus as u32;
    Ok(Common {
        name,
        description: f.description.clone(),
        seed: f.seed,
        profile,
        cpus,
        memory_bytes: memory_gib << 30,
        memory_banks,
        iommu,
    })
}

/// Physical address where I/O buffers and the page cache start: above the first 4 GiB, where
/// the 32-bit windows of the SBA and POWER live (assumption of docs/model/sba-vmerge.md: no
/// DMA buffers there), so a bypass reaches them.
pub(crate) const BUFFER_BASE: u64 = 4 << 30;

/// Scenarios and checks the sections' unit tests share: a minimal valid scenario per device
/// and workload kind, a way to add one line to one table, and the assertion that an error
/// names its field and says what was expected.
#[cfg(test)]
pub(super) mod testing {
    use super::{validate, LabScenario};

    /// The value inside variant `$variant` of `$value` (a `Workload` or `Devices`); panics
    /// naming the kind it holds instead.
    macro_rules! variant {
        ($value:expr, $variant:path) => {
            match $value {
                $variant(v) => v,
                other => panic!("expected {}, got {}", stringify!($variant), other.kind()),
            }
        };
    }
    pub(in crate::lab::spec) use variant;

    /// fio on one NVMe SSD behind an SMMUv3 in strict mode.
    pub const FIO_NVME: &str = "[machine]\nplatform = \"hisilicon-d06\"\ncpus = 8\nmemory_gib = 16\n\n[iommu]\nmodel = \"smmuv3\"\nmode = \"strict\"\n\n[[device]]\nkind = \"nvme\"\n\n[workload]\nkind = \"fio\"\nioengine = \"libaio\"\nrw = \"randread\"\nruntime_ms = 10\n";
    /// fio on one SAS HBA without an IOMMU.
    pub const FIO_SAS: &str = "[machine]\nplatform = \"hisilicon-d05\"\ncpus = 16\nmemory_gib = 16\n\n[iommu]\nmodel = \"none\"\n\n[[device]]\nkind = \"sas\"\n\n[workload]\nkind = \"fio\"\nioengine = \"libaio\"\nrw = \"randread\"\nruntime_ms = 10\n";
    /// bonnie++ on a USB disk behind the R-Car IPMMU.
    pub const BONNIE_USB: &str = "[machine]\nplatform = \"rcar-h3\"\ncpus = 4\nmemory_gib = 8\n\n[iommu]\nmodel = \"ipmmu\"\nmode = \"strict\"\n\n[[device]]\nkind = \"usb\"\n\n[workload]\nkind = \"bonnie\"\nfile_mib = 16\n";
    /// bonnie++ on a SCSI disk behind the SBA.
    pub const BONNIE_SCSI: &str = "[machine]\nplatform = \"hp-zx1\"\ncpus = 2\nmemory_gib = 8\n\n[iommu]\nmodel = \"sba\"\nmode = \"translated\"\n\n[[device]]\nkind = \"scsi\"\n\n[workload]\nkind = \"bonnie\"\nfile_mib = 16\n";
    /// netperf on a NIC in a POWER partition, default window.
    pub const NETPERF_NIC: &str = "[machine]\nplatform = \"power-lpar\"\ncpus = 16\nmemory_gib = 128\n\n[iommu]\nmodel = \"pseries\"\nmode = \"default-window\"\n\n[[device]]\nkind = \"nic\"\nqueues = 16\n\n[workload]\nkind = \"netperf\"\nrun_ms = 20\n";
    /// re-aim on a SCSI disk behind the SBA.
    pub const REAIM_SCSI: &str = "[machine]\nplatform = \"hp-zx1\"\ncpus = 2\nmemory_gib = 8\n\n[iommu]\nmodel = \"sba\"\nmode = \"translated\"\n\n[[device]]\nkind = \"scsi\"\n\n[workload]\nkind = \"reaim\"\nstart = 2\nend = 8\nincrement = 2\n";
    /// The kernel's DMA-mapping benchmark on one NVMe SSD behind an SMMUv3 in strict mode.
    pub const MAP_BENCH: &str = "[machine]\nplatform = \"hisilicon-d06\"\ncpus = 8\n\n[iommu]\nmodel = \"smmuv3\"\nmode = \"strict\"\n\n[[device]]\nkind = \"nvme\"\n\n[workload]\nkind = \"dma_map_benchmark\"\nruntime_ms = 20\n";

    /// `text` with `line` added to its table `table` (`device` is the first `[[device]]`); a
    /// table the text lacks is appended.
    pub fn with(text: &str, table: &str, line: &str) -> String {
        let header = if table == "device" {
            "[[device]]".to_owned()
        } else {
            format!("[{table}]")
        };
        match text.find(&format!("{header}\n")) {
            Some(at) => {
                let after = at + header.len() + 1;
                format!("{}{line}\n{}", &text[..after], &text[after..])
            }
            None => format!("{text}\n{header}\n{line}\n"),
        }
    }

    /// The validated scenario; panics with the error when `text` is refused.
    pub fn ok(text: &str) -> LabScenario {
        validate(text, "t.toml", None).unwrap_or_else(|e| panic!("refused: {e}\n{text}"))
    }

    /// Asserts `text` is refused with an error that names `field` and contains `expected`.
    pub fn refused(text: &str, field: &str, expected: &str) {
        let e = match validate(text, "t.toml", None) {
            Ok(_) => panic!("accepted, expected an error on {field}:\n{text}"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(&format!("field `{field}`: ")),
            "names another field: {e}"
        );
        assert!(e.contains(expected), "does not say {expected:?}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;

    #[test]
    fn every_minimal_scenario_validates_to_its_kinds() {
        for (text, device, workload) in [
            (FIO_NVME, "nvme", "fio"),
            (FIO_SAS, "sas", "fio"),
            (BONNIE_USB, "usb", "bonnie"),
            (BONNIE_SCSI, "scsi", "bonnie"),
            (NETPERF_NIC, "nic", "netperf"),
            (REAIM_SCSI, "scsi", "reaim"),
            (MAP_BENCH, "nvme", "dma_map_benchmark"),
        ] {
            let s = ok(text);
            assert_eq!((s.devices.kind(), s.workload.kind()), (device, workload));
            assert_eq!(s.devices.len(), 1);
        }
    }

    #[test]
    fn top_level_fields_default_and_are_checked() {
        let s = ok(FIO_NVME);
        assert_eq!(
            (s.name.as_str(), s.seed, s.description),
            ("lab", None, None)
        );
        let s = ok(&format!("name = \"mine\"\nseed = 7\n{FIO_NVME}"));
        assert_eq!((s.name.as_str(), s.seed), ("mine", Some(7)));
        refused(
            &format!("name = \" \"\n{FIO_NVME}"),
            "name",
            "expected a non-empty label of at most 200 characters",
        );
        refused(
            &format!("seed = \"one\"\n{FIO_NVME}"),
            "seed",
            "invalid type: string \"one\", expected a non-negative integer",
        );
        refused(
            &format!("colour = 1\n{FIO_NVME}"),
            "colour",
            "unknown field `colour`, expected one of `name`",
        );
    }

    #[test]
    fn kinds_are_checked_before_the_tables() {
        refused(
            &FIO_NVME.replace("kind = \"fio\"", "kind = \"iozone\""),
            "workload.kind",
            "unknown kind \"iozone\": expected one of \"fio\", \"bonnie\"",
        );
        refused(
            &FIO_NVME.replace("kind = \"nvme\"", "kind = 3"),
            "device[0].kind",
            "expected one of \"nvme\", \"sas\", \"usb\", \"nic\", \"scsi\"",
        );
        refused(
            &format!("{FIO_NVME}\n[[device]]\nkind = \"sas\"\n"),
            "device[1].kind",
            "expected \"nvme\" like device[0]",
        );
        refused(
            &FIO_NVME.replace("[[device]]\nkind = \"nvme\"\n", ""),
            "device",
            "missing: expected at least one [[device]] table",
        );
        refused(
            &NETPERF_NIC.replace("kind = \"netperf\"", "kind = \"fio\"\nrw = \"read\""),
            "workload.kind",
            "a fio workload does not run on nic devices",
        );
    }

    #[test]
    fn a_field_of_another_kind_is_unknown_where_it_stands() {
        // `disks` is a sas field: on an nvme device it is unknown, with nvme's fields listed.
        refused(
            &with(FIO_NVME, "device", "disks = 8"),
            "device[0].disks",
            "unknown field `disks`, expected one of `kind`, `model`, `io_queues`",
        );
        refused(
            &with(FIO_NVME, "workload", "file_mib = 8"),
            "workload.file_mib",
            "unknown field `file_mib`, expected one of `kind`, `rw`",
        );
    }

    #[test]
    fn workloads_that_drive_one_device_refuse_two() {
        refused(
            &format!("{BONNIE_SCSI}\n[[device]]\nkind = \"scsi\"\n"),
            "device",
            "a bonnie workload drives exactly one device, got 2",
        );
    }
}
