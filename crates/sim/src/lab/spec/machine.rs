//! `[machine]`: the platform profile (bundled or a file), its cost overrides
//! (`machine.costs`), the CPU count, memory and `memory_banks`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cost::PlatformProfile;
use crate::lab::caps::*;
use crate::lab::spec::fields::range;
use crate::lab::LabError;
use crate::tomlfile::{InputError, TomlDoc};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MachineSpec {
    pub(super) platform: String,
    #[serde(default)]
    pub(super) cpus: Option<usize>,
    #[serde(default)]
    pub(super) memory_gib: Option<u64>,
    #[serde(default)]
    pub(super) memory_banks: Option<Vec<BankSpec>>,
    /// Profile costs this scenario overrides, by dotted cost path.
    #[serde(default)]
    pub(super) costs: std::collections::BTreeMap<String, CostOverride>,
}

/// `machine.costs."PATH" = { value, unit?, source }`: one profile cost replaced.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CostOverride {
    value: f64,
    #[serde(default)]
    unit: Option<crate::cost::Unit>,
    source: String,
}

/// One RAM bank of `machine.memory_banks`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BankSpec {
    base: u64,
    mib: u64,
}

/// Resolves `machine.platform`: a bundled profile name, or a path (relative to the
/// scenario file's directory when the scenario came from a file).
pub(super) fn load_profile(
    doc: &TomlDoc<'_>,
    platform: &str,
    base: Option<&Path>,
) -> Result<PlatformProfile, LabError> {
    if let Ok(p) = PlatformProfile::bundled(platform) {
        return Ok(p);
    }
    let looks_like_path = platform.ends_with(".toml") || platform.contains('/');
    if !looks_like_path {
        return Err(doc
            .field_error(
                "machine.platform",
                format!(
                    "unknown platform \"{platform}\": expected a bundled profile ({}) or a path to a profile TOML{}",
                    PlatformProfile::bundled_names().join(", "),
                    if platform == "host" {
                        " (`iolab calibrate -o host.toml` writes this machine's; then platform = \"host.toml\", relative to the scenario)"
                    } else {
                        ""
                    }
                ),
            )
            .into());
    }
    let mut path = PathBuf::from(platform);
    if path.is_relative() {
        if let Some(b) = base {
            path = b.join(path);
        }
    }
    if !path.is_file() {
        return Err(doc
            .field_error(
                "machine.platform",
                format!("no profile file at {}", path.display()),
            )
            .into());
    }
    Ok(PlatformProfile::from_file(&path)?)
}

/// `machine.costs` path of `H_PUT_TCE`'s per-TCE cost.
const TCE_PUT: &str = "hypervisor.tce_put";

/// `machine.costs` path of `H_PUT_TCE_INDIRECT`'s per-TCE cost, derived from [`TCE_PUT`].
const TCE_INDIRECT: &str = "hypervisor.tce_indirect";

/// Applies `machine.costs`: each entry replaces the profile's cost at its dotted path
/// (value, unit when given, and source), then the profile is checked again. An override of
/// `hypervisor.tce_put` moves `hypervisor.tce_indirect` with it (the profile's list-page
/// read stays on top, [`crate::cost::HypervisorCosts::set_tce_put`]) unless the scenario
/// overrides that too.
pub(super) fn override_costs(
    doc: &TomlDoc<'_>,
    profile: &mut PlatformProfile,
    costs: &std::collections::BTreeMap<String, CostOverride>,
) -> Result<(), LabError> {
    for (path, o) in costs {
        let field = format!("machine.costs.\"{path}\"");
        let Some(cost) = profile.cost_mut(path) else {
            let known: Vec<String> = profile.costs().into_iter().map(|(p, _)| p).collect();
            return Err(doc
                .field_error(
                    &field,
                    format!(
                        "platform {} has no cost \"{path}\": expected one of {}",
                        profile.name,
                        known.join(", ")
                    ),
                )
                .into());
        };
        if o.source.trim().is_empty() {
            return Err(doc
                .field_error(
                    &format!("{field}.source"),
                    "expected a citation or `assumption: ...`, found an empty source",
                )
                .into());
        }
        let unit = o.unit.unwrap_or(cost.unit);
        if path == TCE_PUT && !costs.contains_key(TCE_INDIRECT) {
            // H_PUT_TCE_INDIRECT's per-TCE cost is tce_put's plus the list-page read: it
            // moves with tce_put unless the scenario sets it too.
            let clock = profile.cpu.clock_ghz;
            if let Some(hv) = profile.hypervisor.as_mut() {
                hv.set_tce_put(clock, o.value, unit, &o.source);
            }
        } else {
            cost.value = o.value;
            cost.unit = unit;
            cost.source = o.source.clone();
        }
        if let Err(e) = profile.revalidate() {
            return Err(doc
                .field_error(&format!("{field}.value"), e.to_string())
                .into());
        }
    }
    Ok(())
}

/// `machine.memory_banks`: page-aligned, ascending, non-overlapping banks below 2^48 whose
/// total fits in `machine.memory_gib`.
pub(super) fn memory_banks(
    doc: &TomlDoc<'_>,
    banks: &[BankSpec],
    memory_gib: u64,
) -> Result<Vec<(u64, u64)>, InputError> {
    if banks.is_empty() || banks.len() > MAX_MEMORY_BANKS {
        return Err(doc.field_error(
            "machine.memory_banks",
            format!("expected 1..={MAX_MEMORY_BANKS} banks (cap MAX_MEMORY_BANKS)"),
        ));
    }
    let mut out = Vec::with_capacity(banks.len());
    let mut prev_end = 0u64;
    let mut total_mib = 0u64;
    for (i, b) in banks.iter().enumerate() {
        let path = format!("machine.memory_banks[{i}]");
        let bytes = range(
            doc,
            &format!("{path}.mib"),
            b.mib,
            1,
            MAX_MEMORY_GIB << 10,
            "MiB",
        )? << 20;
        let end = b.base.checked_add(bytes).filter(|&e| e <= 1 << 48);
        if b.base % 4096 != 0 || b.base < prev_end || end.is_none() {
            return Err(doc.field_error(
                &format!("{path}.base"),
                format!(
                    "expected a page-aligned address at or above the previous bank's end ({prev_end:#x}) with the bank ending at or below 2^48, got {:#x}",
                    b.base
                ),
            ));
        }
        prev_end = end.unwrap_or(u64::MAX);
        total_mib += b.mib;
        out.push((b.base, bytes));
    }
    if total_mib > memory_gib << 10 {
        return Err(doc.field_error(
            "machine.memory_banks",
            format!("the banks hold {total_mib} MiB, more than machine.memory_gib = {memory_gib}"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::cost::PlatformProfile;
    use crate::lab::caps::{MAX_CPUS, MAX_MEMORY_GIB};
    use crate::lab::defaults as d;
    use crate::lab::spec::testing::*;

    #[test]
    fn machine_sets_cpus_memory_and_the_profile() {
        let s = ok(FIO_NVME);
        assert_eq!((s.cpus, s.memory_bytes), (8, 16 << 30));
        assert_eq!(s.profile.name, "hisilicon-d06");
        // The profile describes this machine: its core count is the scenario's.
        assert_eq!(s.profile.cpu.cores, 8);
        let s = ok(&FIO_NVME.replace("cpus = 8\nmemory_gib = 16\n", ""));
        let cores = PlatformProfile::bundled("hisilicon-d06").unwrap().cpu.cores as usize;
        assert_eq!(s.cpus, cores.clamp(1, MAX_CPUS));
        assert_eq!(s.memory_bytes, d::MEMORY_GIB.0 << 30);
    }

    #[test]
    fn machine_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &FIO_NVME.replace("cpus = 8", "cpus = 0"),
            "machine.cpus",
            &format!("expected 1..={MAX_CPUS} (cap MAX_CPUS), got 0"),
        );
        refused(
            &FIO_NVME.replace("memory_gib = 16", "memory_gib = 0"),
            "machine.memory_gib",
            &format!("expected 1..={MAX_MEMORY_GIB} GiB (cap MAX_MEMORY_GIB), got 0"),
        );
        refused(
            &FIO_NVME.replace("memory_gib = 16", "memory_gib = \"x\""),
            "machine.memory_gib",
            "invalid type: string \"x\", expected a non-negative integer",
        );
        refused(
            &with(FIO_NVME, "machine", "sockets = 2"),
            "machine.sockets",
            "unknown field `sockets`, expected one of `platform`, `cpus`, `memory_gib`",
        );
        refused(
            &FIO_NVME.replace("hisilicon-d06", "pdp-11"),
            "machine.platform",
            "unknown platform \"pdp-11\": expected a bundled profile (",
        );
        refused(
            &FIO_NVME.replace("hisilicon-d06", "profiles/none.toml"),
            "machine.platform",
            "no profile file at profiles/none.toml",
        );
    }

    #[test]
    fn a_cost_override_replaces_the_profile_cost_with_its_source() {
        let line = "costs.\"cpu.pte_write\" = { value = 7.5, unit = \"ns\", source = \"assumption: a test\" }";
        let s = ok(&with(FIO_NVME, "machine", line));
        assert_eq!(s.profile.cpu.pte_write.value, 7.5);
        assert_eq!(s.profile.cpu.pte_write.ns(), 7.5);
        assert_eq!(s.profile.cpu.pte_write.source, "assumption: a test");
        refused(
            &with(
                FIO_NVME,
                "machine",
                "costs.\"cpu.nope\" = { value = 1, source = \"x\" }",
            ),
            "machine.costs.\"cpu.nope\"",
            "platform hisilicon-d06 has no cost \"cpu.nope\": expected one of cpu.pte_write",
        );
        refused(
            &with(
                FIO_NVME,
                "machine",
                "costs.\"cpu.pte_write\" = { value = 1, source = \" \" }",
            ),
            "machine.costs.\"cpu.pte_write\".source",
            "expected a citation or `assumption: ...`, found an empty source",
        );
        refused(
            &with(
                FIO_NVME,
                "machine",
                "costs.\"cpu.pte_write\" = { value = 1 }",
            ),
            "machine.costs.cpu.pte_write.source",
            "missing field `source`",
        );
    }

    #[test]
    fn memory_banks_are_bonnie_s_ascending_and_fit_in_memory() {
        let banks = "memory_banks = [{ base = 0x40000000, mib = 1024 }, { base = 0x600000000, mib = 2048 }]";
        let s = ok(&with(BONNIE_USB, "machine", banks));
        let crate::lab::spec::Workload::Bonnie(b) = &s.workload else {
            panic!("bonnie expected")
        };
        // The swiotlb pool was taken from the start of the first bank: the page cache has the
        // rest.
        let pool = d::SWIOTLB_MIB.0 << 20;
        assert_eq!(
            b.config.ram_banks,
            vec![
                (0x4000_0000 + pool, (1 << 30) - pool),
                (0x6_0000_0000, 2 << 30)
            ]
        );
        refused(
            &with(BONNIE_USB, "machine", "memory_banks = [{ base = 0x40000000, mib = 1024 }, { base = 0x40001000, mib = 1 }]"),
            "machine.memory_banks[1].base",
            "expected a page-aligned address at or above the previous bank's end (0x80000000)",
        );
        refused(
            &with(
                BONNIE_USB,
                "machine",
                "memory_banks = [{ base = 0, mib = 9000 }]",
            ),
            "machine.memory_banks",
            "the banks hold 9000 MiB, more than machine.memory_gib = 8",
        );
        refused(
            &with(
                BONNIE_USB,
                "machine",
                "memory_banks = [{ base = 0, mib = 0 }]",
            ),
            "machine.memory_banks[0].mib",
            "MiB, got 0",
        );
        // A field that does not apply: only bonnie has a page cache to place.
        refused(
            &with(
                FIO_NVME,
                "machine",
                "memory_banks = [{ base = 0, mib = 1024 }]",
            ),
            "machine.memory_banks",
            "places bonnie's page cache; a fio workload has none",
        );
    }
}
