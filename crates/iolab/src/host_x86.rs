//! `iolab host`: what sysfs shows of the x86 IOMMU units, decoded.
//!
//! - Intel VT-d: `/sys/class/iommu/dmar*/intel-iommu/{version,cap,ecap}` (Linux
//!   `drivers/iommu/intel/iommu.c` prints `version` as `major:minor` and `cap` / `ecap` as
//!   hexadecimal). CAP and ECAP are decoded with the VT-d model's own decoders
//!   ([`iolab_iommu::vtd::spec::Cap`], [`Ecap`]; fields of X86.md §1.2).
//! - AMD-Vi: `/sys/class/iommu/ivhd*/amd-iommu/{cap,features}` (Linux
//!   `drivers/iommu/amd/init.c`: `cap` is the PCI capability header, `features` the
//!   Extended Feature Register, newer kernels append `:EFR2`). Decoded by the bit positions
//!   of X86.md §3.1.
//!
//! Each unit gets the decoded fields and the lab setting that models it (`iommu.model`, and
//! `caching_mode` for a virtual VT-d unit), with what the lab leaves out noted. A value that
//! does not parse is reported as such, not an error: the rest of the report stands.

use std::path::Path;

use serde::Serialize;

use iolab_iommu::vtd::spec::{Cap, Ecap};
use iolab_iommu::vtd::DmarConfig;

/// One decoded field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Field {
    /// What it is (e.g. `"domains"`).
    pub name: String,
    /// Its value, as text.
    pub value: String,
}

/// One x86 IOMMU unit's registers as sysfs shows them, decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnitDecode {
    /// The /sys/class/iommu entry (`dmar0`, `ivhd1`, ...).
    pub unit: String,
    /// `"vtd"` or `"amd-vi"`.
    pub model: &'static str,
    /// The raw register files read, `(file, content)`.
    pub raw: Vec<Field>,
    /// The decoded fields.
    pub decoded: Vec<Field>,
    /// The lab's scenario setting for this unit, if it can be modelled.
    pub lab: Option<String>,
    /// What the lab does not model of this unit.
    pub notes: Vec<String>,
    /// Why a register could not be decoded, if one could not.
    pub error: Option<String>,
}

fn field(name: &str, value: impl ToString) -> Field {
    Field {
        name: name.to_owned(),
        value: value.to_string(),
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// A hexadecimal register value as sysfs prints it: optional `0x`, surrounding blanks.
pub fn parse_hex(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if t.is_empty() {
        return None;
    }
    u64::from_str_radix(t, 16).ok()
}

fn read(dir: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Decodes the units under `class` (`<root>/sys/class/iommu`) among `units`: those whose
/// register files are present.
pub fn decode_units(class: &Path, units: &[String]) -> Vec<UnitDecode> {
    units
        .iter()
        .filter_map(|u| {
            let dir = class.join(u);
            if dir.join("intel-iommu").is_dir() {
                Some(vtd(u, &dir.join("intel-iommu")))
            } else if dir.join("amd-iommu").is_dir() {
                Some(amdvi(u, &dir.join("amd-iommu")))
            } else {
                None
            }
        })
        .collect()
}

/// Decodes a VT-d unit's `version`, `cap` and `ecap` files in `dir`.
pub fn vtd(unit: &str, dir: &Path) -> UnitDecode {
    let mut d = UnitDecode {
        unit: unit.to_owned(),
        model: "vtd",
        raw: Vec::new(),
        decoded: Vec::new(),
        lab: None,
        notes: Vec::new(),
        error: None,
    };
    let files: Vec<(&str, Option<String>)> = ["version", "cap", "ecap"]
        .into_iter()
        .map(|f| (f, read(dir, f)))
        .collect();
    for (f, v) in &files {
        if let Some(v) = v {
            d.raw.push(field(f, v));
        }
    }
    if let Some(v) = &files[0].1 {
        d.decoded.push(field("version", v));
    }
    let reg = |i: usize| -> Result<u64, String> {
        let (f, v) = &files[i];
        let v = v.as_deref().ok_or_else(|| format!("{f}: unreadable"))?;
        parse_hex(v).ok_or_else(|| format!("{f}: \"{v}\" is not a hexadecimal register value"))
    };
    let (cap, ecap) = match (reg(1), reg(2)) {
        (Ok(c), Ok(e)) => (Cap(c), Ecap(e)),
        (Err(e), _) | (_, Err(e)) => {
            d.error = Some(e);
            return d;
        }
    };
    let levels: Vec<String> = (3..=5)
        .filter(|l| cap.sagaw() & (1 << (l - 2)) != 0)
        .map(|l| l.to_string())
        .collect();
    let pages = [(0, "2 MiB"), (1, "1 GiB")]
        .iter()
        .filter(|(b, _)| cap.sllps() & (1 << b) != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>();
    let used = DmarConfig::levels_of(cap);
    d.decoded.extend([
        field("domains", cap.domains()),
        field("caching_mode", yes(cap.cm())),
        field(
            "second_stage_levels",
            if levels.is_empty() {
                "none".to_owned()
            } else {
                levels.join(", ")
            },
        ),
        field(
            "linux_levels",
            used.map_or("none".to_owned(), |l| l.to_string()),
        ),
        field("mgaw_bits", cap.mgaw()),
        field(
            "superpages",
            if pages.is_empty() {
                "none".to_owned()
            } else {
                pages.join(", ")
            },
        ),
        field(
            "psi",
            if cap.psi() {
                format!(
                    "yes, MAMV {} (up to {} pages)",
                    cap.mamv(),
                    1u64 << cap.mamv()
                )
            } else {
                "no (every invalidation is domain-selective)".to_owned()
            },
        ),
        field("fault_records", cap.nfr()),
        field(
            "drain",
            format!("read {}, write {}", yes(cap.drd()), yes(cap.dwd())),
        ),
        field("coherent_walks", yes(ecap.c())),
        field("queued_invalidation", yes(ecap.qi())),
        field("device_tlb", yes(ecap.dt())),
        field("interrupt_remapping", yes(ecap.ir())),
        field("pass_through", yes(ecap.pt())),
        field("snoop_control", yes(ecap.sc())),
        field(
            "scalable_mode",
            if ecap.smts() {
                format!(
                    "yes (first stage {}, second stage {}, PASID {} bits)",
                    yes(ecap.flts()),
                    yes(ecap.slts()),
                    if ecap.pasid() { ecap.pasid_bits() } else { 0 }
                )
            } else {
                "no (legacy mode only)".to_owned()
            },
        ),
        field("nested", yes(ecap.nest())),
    ]);
    let mut lab = "iommu.model = \"vtd\"".to_owned();
    if ecap.smts() {
        // Linux 5.6+ maps DMA through first-stage tables where the unit offers them
        // (docs/model/vtd.md).
        lab.push_str(if ecap.flts() {
            ", vtd_translation = \"scalable-first-stage\""
        } else {
            ", vtd_translation = \"scalable-second-stage\""
        });
    }
    if cap.cm() {
        lab.push_str(", caching_mode = true (a virtual IOMMU: Linux forces strict)");
    }
    d.lab = Some(lab);
    if !ecap.qi() {
        d.notes.push(
            "no queued invalidation: Linux uses register-based invalidation, which the lab does not model"
                .to_owned(),
        );
    }
    if used.is_some_and(|l| l != 4) {
        d.notes.push(format!(
            "Linux uses {}-level tables here; the lab's unit has 4",
            used.unwrap_or(4)
        ));
    }
    if !ecap.c() {
        d.notes.push(
            "non-coherent walks: Linux flushes every table write from the CPU caches; the lab's x86 profiles assume coherent walks"
                .to_owned(),
        );
    }
    d
}

/// Decodes an AMD-Vi unit's `cap` (PCI capability header) and `features` (EFR, optionally
/// `EFR:EFR2`) files in `dir`.
pub fn amdvi(unit: &str, dir: &Path) -> UnitDecode {
    let mut d = UnitDecode {
        unit: unit.to_owned(),
        model: "amd-vi",
        raw: Vec::new(),
        decoded: Vec::new(),
        lab: None,
        notes: Vec::new(),
        error: None,
    };
    let cap_s = read(dir, "cap");
    let efr_s = read(dir, "features");
    for (f, v) in [("cap", &cap_s), ("features", &efr_s)] {
        if let Some(v) = v {
            d.raw.push(field(f, v));
        }
    }
    let cap = match cap_s.as_deref().map(|v| (v, parse_hex(v))) {
        Some((_, Some(c))) => c,
        Some((v, None)) => {
            d.error = Some(format!("cap: \"{v}\" is not a hexadecimal register value"));
            return d;
        }
        None => {
            d.error = Some("cap: unreadable".to_owned());
            return d;
        }
    };
    let efr_text = efr_s.unwrap_or_default();
    let first = efr_text.split(':').next().unwrap_or("");
    let Some(efr) = parse_hex(first) else {
        d.error = Some(format!(
            "features: \"{efr_text}\" is not a hexadecimal register value (EFR, or EFR:EFR2)"
        ));
        return d;
    };
    let bit = |v: u64, b: u32| v >> b & 1 == 1;
    let hats = (efr >> 10) & 3;
    let gats = (efr >> 12) & 3;
    let np_cache = bit(cap, 26);
    d.decoded.extend([
        field("iotlb_support", yes(bit(cap, 24))),
        field("np_cache", yes(np_cache)),
        field("efr_support", yes(bit(cap, 27))),
        field(
            "host_levels",
            if hats == 3 {
                "reserved (HATS = 3: no v1 tables)".to_owned()
            } else {
                format!("up to {}", 4 + hats)
            },
        ),
        field(
            "guest_levels",
            match gats {
                0 => "4".to_owned(),
                1 => "5".to_owned(),
                g => format!("reserved (GATS = {g})"),
            },
        ),
        field("invalidate_all", yes(bit(efr, 6))),
        field("prefetch", yes(bit(efr, 0))),
        field("ppr", yes(bit(efr, 1))),
        field("x2apic", yes(bit(efr, 2))),
        field("nx", yes(bit(efr, 3))),
        field("guest_translation", yes(bit(efr, 4))),
        field("guest_apic", yes(bit(efr, 7))),
        field("perf_counters", yes(bit(efr, 9))),
        field("pasid_bits", ((efr >> 32) & 0x1f) + 1),
        field("host_dirty", yes(bit(efr, 52))),
        field("snp", yes(bit(efr, 63))),
    ]);
    d.lab = Some("iommu.model = \"amd-vi\"".to_owned());
    if np_cache {
        d.notes.push(
            "NpCache: a virtual IOMMU; Linux forces strict and flushes after maps (X86.md §3.7), which the lab's amd-vi model does not do"
                .to_owned(),
        );
    }
    if hats == 3 {
        d.notes.push(
            "no host (v1) tables: Linux uses v2 tables, which the lab does not model".to_owned(),
        );
    }
    d
}

/// The decoded units as text lines (indented under the units line).
pub fn render(units: &[UnitDecode]) -> String {
    let mut s = String::new();
    for u in units {
        s.push_str(&format!("  {} ({}):", u.unit, u.model));
        for f in &u.raw {
            s.push_str(&format!(" {}={}", f.name, f.value));
        }
        s.push('\n');
        if let Some(e) = &u.error {
            s.push_str(&format!("    cannot decode: {e}\n"));
            continue;
        }
        for f in &u.decoded {
            s.push_str(&format!("    {:<20} {}\n", f.name, f.value));
        }
        if let Some(l) = &u.lab {
            s.push_str(&format!("    lab: {l}\n"));
        }
        for n in &u.notes {
            s.push_str(&format!("    note: {n}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("iolab-host-x86-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in files {
            std::fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
        d
    }

    fn get<'a>(u: &'a UnitDecode, name: &str) -> &'a str {
        &u.decoded
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .value
    }

    #[test]
    fn hex_values_parse_with_or_without_a_prefix() {
        assert_eq!(parse_hex("8d2078c106f0466\n"), Some(0x8d2078c106f0466));
        assert_eq!(parse_hex("0xf020df"), Some(0xf020df));
        assert_eq!(parse_hex(""), None);
        assert_eq!(parse_hex("zz"), None);
    }

    #[test]
    fn the_cascade_lake_unit_of_x86_md_decodes_as_it_says() {
        // X86.md §1.2: 'cap 8d2078c106f0466 ecap f020df'.
        let d = dir(
            "clx",
            &[
                ("version", "1:0"),
                ("cap", "8d2078c106f0466"),
                ("ecap", "f020df"),
            ],
        );
        let u = vtd("dmar0", &d);
        assert_eq!(u.error, None);
        assert_eq!(get(&u, "domains"), "65536");
        assert_eq!(get(&u, "caching_mode"), "no");
        assert_eq!(get(&u, "second_stage_levels"), "4");
        assert_eq!(get(&u, "linux_levels"), "4");
        assert_eq!(get(&u, "mgaw_bits"), "48");
        assert_eq!(get(&u, "superpages"), "2 MiB, 1 GiB");
        assert_eq!(get(&u, "psi"), "yes, MAMV 18 (up to 262144 pages)");
        assert_eq!(get(&u, "fault_records"), "8");
        assert_eq!(get(&u, "queued_invalidation"), "yes");
        assert_eq!(get(&u, "pass_through"), "yes");
        assert_eq!(get(&u, "scalable_mode"), "no (legacy mode only)");
        assert_eq!(u.lab.as_deref(), Some("iommu.model = \"vtd\""));
        assert!(u.notes.is_empty(), "{:?}", u.notes);
    }

    #[test]
    fn caching_mode_and_a_bad_value_are_reported() {
        // The same unit with CM (bit 7) set, as a virtual IOMMU shows it.
        let d = dir("cm", &[("cap", "0x8d2078c106f04e6"), ("ecap", "f020df")]);
        let u = vtd("dmar0", &d);
        assert_eq!(get(&u, "caching_mode"), "yes");
        assert!(u.lab.unwrap().contains("caching_mode = true"));
        let d = dir("bad", &[("cap", "not-hex"), ("ecap", "f020df")]);
        let u = vtd("dmar1", &d);
        assert!(u.error.unwrap().contains("cap: \"not-hex\""));
    }

    #[test]
    fn a_scalable_mode_unit_names_the_lab_translation_to_use() {
        // The Ice Lake unit with SMTS (bit 43) and SLTS (bit 46) set, then FLTS (bit 47) too.
        let second = 0xf020df_u64 | 1 << 43 | 1 << 46;
        let d = dir(
            "sm-ss",
            &[("cap", "8d2078c106f0466"), ("ecap", &format!("{second:x}"))],
        );
        let u = vtd("dmar0", &d);
        assert_eq!(
            u.lab.as_deref(),
            Some("iommu.model = \"vtd\", vtd_translation = \"scalable-second-stage\"")
        );
        let first = second | 1 << 47;
        let d = dir(
            "sm-fs",
            &[("cap", "8d2078c106f0466"), ("ecap", &format!("{first:x}"))],
        );
        let u = vtd("dmar0", &d);
        assert!(get(&u, "scalable_mode").starts_with("yes (first stage yes"));
        assert_eq!(
            u.lab.as_deref(),
            Some("iommu.model = \"vtd\", vtd_translation = \"scalable-first-stage\"")
        );
        assert!(u.notes.is_empty(), "{:?}", u.notes);
    }

    #[test]
    fn a_milan_efr_decodes() {
        // X86.md §3.1: EPYC Milan EFR 0x841f77e022094ace (HATS = 2: 6 levels, IA, PC, SNP).
        let d = dir(
            "milan",
            &[("cap", "190b640f"), ("features", "841f77e022094ace:0")],
        );
        let u = amdvi("ivhd0", &d);
        assert_eq!(u.error, None);
        assert_eq!(get(&u, "host_levels"), "up to 6");
        assert_eq!(get(&u, "guest_levels"), "4");
        assert_eq!(get(&u, "invalidate_all"), "yes");
        assert_eq!(get(&u, "perf_counters"), "yes");
        assert_eq!(get(&u, "guest_translation"), "no");
        assert_eq!(get(&u, "host_dirty"), "yes");
        assert_eq!(get(&u, "snp"), "yes");
        assert_eq!(get(&u, "np_cache"), "no");
        assert_eq!(u.lab.as_deref(), Some("iommu.model = \"amd-vi\""));
        // NpCache (capability header bit 26): a virtual IOMMU.
        let d = dir(
            "np",
            &[("cap", "0x4000000"), ("features", "841f77e022094ace")],
        );
        let u = amdvi("ivhd0", &d);
        assert_eq!(get(&u, "np_cache"), "yes");
        assert!(u.notes.iter().any(|n| n.contains("NpCache")));
    }
}
