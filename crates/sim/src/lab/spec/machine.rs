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
                    "unknown platform \"{platform}\": expected a bundled profile ({}) or a path to a profile TOML",
                    PlatformProfile::bundled_names().join(", ")
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
