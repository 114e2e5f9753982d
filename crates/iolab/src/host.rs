//! `iolab host`: the real machine's IOMMU state, read from sysfs and the kernel command line.
//!
//! What is read (all under a root directory, `/` unless `--sysroot` says otherwise):
//!
//! - `/sys/class/iommu/*`: one entry per IOMMU hardware unit the kernel registered (Intel
//!   `dmar0`, AMD `ivhd0`, ARM SMMU `smmu3.0x...`, ...); for Intel and AMD units, their
//!   registers as the drivers show them, decoded ([`crate::host_x86`]).
//! - `/sys/kernel/iommu_groups/<id>/type` and `/sys/kernel/iommu_groups/<id>/devices/*`: the
//!   default domain type of each group and its devices. The kernel's ABI document
//!   (Documentation/ABI/testing/sysfs-kernel-iommu_groups) lists the types: `DMA` (every DMA
//!   transaction of the group's devices is translated), `DMA-FQ` (as `DMA`, but translations
//!   are removed lazily with batched invalidation: a flush queue), `identity` (not
//!   translated), and the kernel also shows `blocked` (all DMA blocked) and `unmanaged` (the
//!   domain belongs to a user such as VFIO, not the DMA API).
//! - `/proc/cmdline`: the boot parameters of Documentation/admin-guide/kernel-parameters.txt
//!   that pick the mode: `iommu.strict=0|1` (lazy or strict invalidation),
//!   `iommu.passthrough=0|1`, `iommu=pt|nopt|off` (x86), `intel_iommu=on|off|strict` and
//!   `amd_iommu=off|fullflush` (`strict` and `fullflush` are deprecated spellings of
//!   `iommu.strict=1`). Later parameters override earlier ones, as the kernel parses them.
//!
//! The implied mode (strict, lazy, passthrough, none) comes from the group types when there
//! are groups (what the kernel actually set up), else from the command line; with neither,
//! and no IOMMU unit, it is `none`. Missing files are not errors: a machine (or container)
//! without an IOMMU simply has none of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

/// The DMA mode a configuration implies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Translated, every unmap invalidated at once (`DMA`, `iommu.strict=1`).
    Strict,
    /// Translated, unmaps invalidated in batches (`DMA-FQ`, `iommu.strict=0`).
    Lazy,
    /// Not translated (`identity`, `iommu.passthrough=1`, `iommu=pt`).
    Passthrough,
    /// DMA blocked.
    Blocked,
    /// Owned by a user of the IOMMU API (VFIO), not the DMA API.
    Unmanaged,
    /// Groups disagree.
    Mixed,
    /// No IOMMU in use.
    None,
    /// Nothing says (the kernel's built-in default applies).
    KernelDefault,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Strict => "strict",
            Mode::Lazy => "lazy",
            Mode::Passthrough => "passthrough",
            Mode::Blocked => "blocked",
            Mode::Unmanaged => "unmanaged",
            Mode::Mixed => "mixed",
            Mode::None => "none",
            Mode::KernelDefault => "kernel default",
        })
    }
}

/// One IOMMU group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    /// The group number.
    pub id: u64,
    /// The `type` file's content, if readable.
    pub domain_type: Option<String>,
    /// What the type means.
    pub mode: Option<Mode>,
    /// The group's devices (e.g. PCI addresses), sorted.
    pub devices: Vec<String>,
}

/// One boot parameter that bears on the IOMMU, and what it means.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Param {
    /// The parameter as written.
    pub param: String,
    /// What it selects.
    pub effect: String,
}

/// What `iolab host` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostReport {
    /// The root the files were read under.
    pub sysroot: PathBuf,
    /// Entries of /sys/class/iommu, sorted.
    pub iommu_units: Vec<String>,
    /// The x86 units' registers (VT-d CAP/ECAP, AMD-Vi capability header and EFR) as sysfs
    /// shows them, decoded, for the units that show them.
    pub unit_registers: Vec<crate::host_x86::UnitDecode>,
    /// IOMMU groups, by number.
    pub groups: Vec<Group>,
    /// The kernel command line, if readable.
    pub cmdline: Option<String>,
    /// The IOMMU parameters found on it.
    pub params: Vec<Param>,
    /// What the command line implies.
    pub cmdline_mode: Mode,
    /// What the groups' types imply, if there are groups.
    pub groups_mode: Option<Mode>,
    /// The overall answer (see the module docs).
    pub mode: Mode,
}

fn mode_of_type(t: &str) -> Option<Mode> {
    Some(match t {
        "DMA" => Mode::Strict,
        "DMA-FQ" => Mode::Lazy,
        "identity" => Mode::Passthrough,
        "blocked" => Mode::Blocked,
        "unmanaged" => Mode::Unmanaged,
        _ => return None,
    })
}

fn sorted_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Reads the command line's IOMMU parameters and what they imply, in order.
pub fn parse_cmdline(cmdline: &str) -> (Vec<Param>, Mode) {
    // Strictness and passthrough are separate settings; passthrough or off wins.
    let mut strict: Option<bool> = None;
    let mut passthrough: Option<bool> = None;
    let mut off = false;
    let mut params = Vec::new();
    for word in cmdline.split_whitespace() {
        let (key, value) = word.split_once('=').unwrap_or((word, ""));
        let mut note = |effect: &str| {
            params.push(Param {
                param: word.to_owned(),
                effect: effect.to_owned(),
            })
        };
        match (key, value) {
            ("iommu.strict", "1") => {
                strict = Some(true);
                note("strict: invalidate the IOTLB on every unmap");
            }
            ("iommu.strict", "0") => {
                strict = Some(false);
                note("lazy: batch IOTLB invalidations (flush queue)");
            }
            ("iommu.passthrough", "1") => {
                passthrough = Some(true);
                note("passthrough: DMA bypasses translation");
            }
            ("iommu.passthrough", "0") => {
                passthrough = Some(false);
                note("translated DMA (no passthrough)");
            }
            ("iommu", v) => {
                for opt in v.split(',') {
                    match opt {
                        "pt" => {
                            passthrough = Some(true);
                            note("passthrough (x86)");
                        }
                        "nopt" => {
                            passthrough = Some(false);
                            note("translated DMA, no passthrough (x86)");
                        }
                        "off" => {
                            off = true;
                            note("no IOMMU (x86)");
                        }
                        _ => {}
                    }
                }
            }
            ("intel_iommu" | "amd_iommu", v) => {
                for opt in v.split(',') {
                    match opt {
                        "off" => {
                            off = true;
                            note("driver disabled: no IOMMU");
                        }
                        "on" => {
                            off = false;
                            note("driver enabled");
                        }
                        "strict" | "fullflush" => {
                            strict = Some(true);
                            note("strict (deprecated spelling of iommu.strict=1)");
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let mode = if off {
        Mode::None
    } else if passthrough == Some(true) {
        Mode::Passthrough
    } else {
        match strict {
            Some(true) => Mode::Strict,
            Some(false) => Mode::Lazy,
            None => Mode::KernelDefault,
        }
    };
    (params, mode)
}

/// Reads the IOMMU state under `root`.
pub fn inspect(root: &Path) -> HostReport {
    let iommu_units = sorted_entries(&root.join("sys/class/iommu"));
    let unit_registers = crate::host_x86::decode_units(&root.join("sys/class/iommu"), &iommu_units);
    let groups_dir = root.join("sys/kernel/iommu_groups");
    let mut by_id: BTreeMap<u64, Group> = BTreeMap::new();
    for name in sorted_entries(&groups_dir) {
        let Ok(id) = name.parse::<u64>() else {
            continue;
        };
        let dir = groups_dir.join(&name);
        let domain_type = std::fs::read_to_string(dir.join("type"))
            .ok()
            .map(|s| s.trim().to_owned());
        let mode = domain_type.as_deref().and_then(mode_of_type);
        by_id.insert(
            id,
            Group {
                id,
                domain_type,
                mode,
                devices: sorted_entries(&dir.join("devices")),
            },
        );
    }
    let groups: Vec<Group> = by_id.into_values().collect();
    let cmdline = std::fs::read_to_string(root.join("proc/cmdline"))
        .ok()
        .map(|s| s.trim().to_owned());
    let (params, cmdline_mode) = parse_cmdline(cmdline.as_deref().unwrap_or(""));
    let mut modes: Vec<Mode> = groups.iter().filter_map(|g| g.mode).collect();
    modes.dedup();
    let groups_mode = match modes.as_slice() {
        [] => None,
        [one] => Some(*one),
        _ => {
            let mut uniq = modes.clone();
            uniq.sort_by_key(|m| *m as u8);
            uniq.dedup();
            Some(if uniq.len() == 1 {
                uniq[0]
            } else {
                Mode::Mixed
            })
        }
    };
    let mode = match groups_mode {
        Some(m) => m,
        None if iommu_units.is_empty()
            && matches!(cmdline_mode, Mode::KernelDefault | Mode::None) =>
        {
            Mode::None
        }
        None => cmdline_mode,
    };
    HostReport {
        sysroot: root.to_owned(),
        iommu_units,
        unit_registers,
        groups,
        cmdline,
        params,
        cmdline_mode,
        groups_mode,
        mode,
    }
}

/// The report as text.
pub fn render_text(r: &HostReport) -> String {
    let mut s = String::new();
    let units = if r.iommu_units.is_empty() {
        "none".to_owned()
    } else {
        r.iommu_units.join(", ")
    };
    s.push_str(&format!("IOMMU units (/sys/class/iommu): {units}\n"));
    s.push_str(&crate::host_x86::render(&r.unit_registers));
    if r.groups.is_empty() {
        s.push_str("IOMMU groups (/sys/kernel/iommu_groups): none\n");
    } else {
        s.push_str(&format!(
            "IOMMU groups (/sys/kernel/iommu_groups): {}\n",
            r.groups.len()
        ));
        for g in &r.groups {
            let t = g.domain_type.as_deref().unwrap_or("(type unreadable)");
            let m = g.mode.map_or("unknown".to_owned(), |m| m.to_string());
            let devs = if g.devices.is_empty() {
                "no devices".to_owned()
            } else {
                g.devices.join(" ")
            };
            s.push_str(&format!("  group {:>3}  {t:<9} ({m})  {devs}\n", g.id));
        }
    }
    match &r.cmdline {
        Some(c) => s.push_str(&format!("kernel command line: {c}\n")),
        None => s.push_str("kernel command line: unreadable (/proc/cmdline)\n"),
    }
    if r.params.is_empty() {
        s.push_str("  no IOMMU parameters\n");
    }
    for p in &r.params {
        s.push_str(&format!("  {}: {}\n", p.param, p.effect));
    }
    s.push_str(&format!("command line implies: {}\n", r.cmdline_mode));
    if let Some(g) = r.groups_mode {
        s.push_str(&format!("group types imply: {g}\n"));
    }
    s.push_str(&format!("DMA mode: {}\n", r.mode));
    s
}

/// `iolab host`.
pub fn run(root: &Path, json: bool) -> ExitCode {
    if !root.is_dir() {
        eprintln!("iolab host: --sysroot {}: not a directory", root.display());
        return ExitCode::from(2);
    }
    let report = inspect(root);
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("iolab host: cannot encode the report as JSON: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        print!("{}", render_text(&report));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_parameters_imply_modes() {
        assert_eq!(parse_cmdline("ro quiet").1, Mode::KernelDefault);
        assert_eq!(parse_cmdline("iommu.strict=1").1, Mode::Strict);
        assert_eq!(parse_cmdline("iommu.strict=0").1, Mode::Lazy);
        assert_eq!(
            parse_cmdline("intel_iommu=on iommu=pt").1,
            Mode::Passthrough
        );
        assert_eq!(parse_cmdline("intel_iommu=on,strict").1, Mode::Strict);
        assert_eq!(parse_cmdline("amd_iommu=off").1, Mode::None);
        assert_eq!(parse_cmdline("amd_iommu=fullflush").1, Mode::Strict);
        assert_eq!(
            parse_cmdline("iommu.passthrough=1 iommu.passthrough=0 iommu.strict=0").1,
            Mode::Lazy
        );
        assert_eq!(parse_cmdline("iommu.strict=0 intel_iommu=on").0.len(), 2);
    }
}
