//! Platform profiles: the bundled ones load and carry sources, malformed ones fail with one
//! clear error naming the file and field, conversions are exact dot products, and
//! docs/MODEL.md shows the current tables.
//!
//! To regenerate the generated parts of docs/MODEL.md after changing a profile, run
//! `IOLAB_BLESS=1 cargo test -p iolab-sim --release --test cost_profiles`.
//!
//! Everything sits in a module named `cost` so `cargo test -p iolab-sim --release cost` runs it.

mod cost {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use iolab_iommu::work::{LockId, WorkRecord};
    use iolab_sim::cost::{
        counter_charges_markdown, Charge, CostError, PlatformProfile, TceCall, Unit,
        COUNTER_CHARGES,
    };
    use proptest::prelude::*;

    fn repo_root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// A complete profile with every cost 1 ns (all optional groups present), with some entries
    /// replaced: `overrides` maps a dotted cost path or plain field to its TOML value text.
    fn uniform_profile(overrides: &[(&str, &str)]) -> String {
        let over: BTreeMap<&str, &str> = overrides.iter().copied().collect();
        let value =
            |path: &str, default: &str| over.get(path).copied().unwrap_or(default).to_owned();
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for path in PlatformProfile::cost_paths() {
            let (group, field) = path.rsplit_once('.').unwrap();
            // The block path's totals hold their shares (1 ns each).
            let default = match path.as_str() {
                "io_path.block_submit" | "io_path.block_complete" => {
                    "{ value = 10, source = \"test\" }"
                }
                _ => "{ value = 1, source = \"test\" }",
            };
            let v = value(&path, default);
            groups
                .entry(group.to_owned())
                .or_default()
                .push(format!("{field} = {v}"));
        }
        let mut t = String::new();
        t += &format!("name = {}\n", value("name", "\"uniform\""));
        t += "description = \"every cost 1 ns\"\n";
        t += "[cpu]\n";
        t += &format!(
            "model = \"test core\"\nclock_ghz = {}\n",
            value("cpu.clock_ghz", "2.0")
        );
        t += &format!("cores = {}\nsource = \"test\"\n", value("cpu.cores", "4"));
        t += &groups["cpu"].join("\n");
        for g in ["sync", "mmio"] {
            t += &format!("\n[{g}]\n{}", groups[g].join("\n"));
        }
        for g in ["sync.far_atomics", "topology"] {
            if !over.contains_key(g) {
                t += &format!("\n[{g}]\n{}", groups[g].join("\n"));
                if g == "topology" {
                    t += "\ncores_per_cluster = 2\nclusters_per_die = 2\ndies_per_socket = 1\nsource = \"test\"";
                }
            }
        }
        t += "\n[iommu]\nmodel = \"test iommu\"\nsource = \"test\"\n";
        t += &groups["iommu"].join("\n");
        for g in ["iommu.cmdq", "iommu.register_flush", "hypervisor"] {
            if !over.contains_key(g) {
                t += &format!("\n[{g}]\n{}", groups[g].join("\n"));
            }
        }
        t += &format!(
            "\n[memory]\nmemcpy_bandwidth = {}\n",
            value(
                "memory.memcpy_bandwidth",
                "{ gb_per_s = 4, source = \"test\" }"
            )
        );
        t += &format!("\n[io_path]\n{}\n", groups["io_path"].join("\n"));
        t
    }

    fn load(text: &str) -> Result<PlatformProfile, CostError> {
        PlatformProfile::from_toml_str(text, "test.toml")
    }

    fn field_error(text: &str) -> (String, Option<usize>, String) {
        match load(text) {
            Err(e @ CostError::Field { .. }) => {
                let msg = e.to_string();
                (e.field().unwrap().to_owned(), e.line(), msg)
            }
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    /// 1-based line of the first line containing `needle`.
    fn line_of(text: &str, needle: &str) -> usize {
        text.lines().position(|l| l.contains(needle)).unwrap() + 1
    }

    // ---------------------------------------------------------------------------------------------
    // Bundled profiles
    // ---------------------------------------------------------------------------------------------

    #[test]
    fn every_bundled_profile_has_every_io_path_cost_and_lacking_one_is_refused_by_name() {
        use iolab_sim::cost::IoPathCosts;
        for name in PlatformProfile::bundled_names() {
            let text = PlatformProfile::bundled_toml(name).unwrap();
            let p = PlatformProfile::bundled(name).unwrap();
            for field in IoPathCosts::FIELDS {
                let path = format!("io_path.{field}");
                let c = p.cost(&path).unwrap_or_else(|| panic!("{name}: no {path}"));
                assert!(c.ns() > 0.0, "{name}: {path} is {} ns", c.ns());
                assert!(!c.source.trim().is_empty(), "{name}: {path} has no source");
                // The same profile without that line is refused, naming the cost.
                assert!(text.contains("\n[io_path]\n"), "{name}: no [io_path] group");
                let without: String = text
                    .lines()
                    .filter(|l| !l.starts_with(&format!("{field} = ")))
                    .collect::<Vec<_>>()
                    .join("\n");
                let err = load(&without).expect_err(&format!("{name} without {path}"));
                assert!(
                    err.to_string().contains(field),
                    "{name} without {path}: {err}"
                );
            }
        }
        // A share larger than its total is refused, naming the total.
        let (field, _, msg) = field_error(&uniform_profile(&[(
            "io_path.block_submit",
            "{ value = 2, source = \"s\" }",
        )]));
        assert_eq!(field, "io_path.block_submit.value");
        assert!(msg.contains("aio_submit + file_ref + page_pin"), "{msg}");
    }

    #[test]
    fn bundled_profiles_parse_validate_and_carry_sources() {
        let names = PlatformProfile::bundled_names();
        assert_eq!(
            names,
            [
                "rcar-h3",
                "hisilicon-d05",
                "hisilicon-d06",
                "hp-zx1",
                "power-lpar",
                "nvidia-grace",
                "intel-icelake-2s",
                "intel-sapphire-rapids-2s",
                "amd-epyc-genoa-2s",
                "intel-cascadelake-4s"
            ]
        );
        for name in names {
            let p = PlatformProfile::bundled(name).unwrap();
            assert_eq!(p.name, name);
            assert!(p.cpu.clock_ghz > 0.0 && p.cpu.cores > 0);
            assert!(!p.cpu.source.trim().is_empty() && !p.iommu.source.trim().is_empty());
            assert!(!p.memory.memcpy_bandwidth.source.trim().is_empty());
            let costs = p.costs();
            assert!(costs.len() >= 30, "{name}: {} costs", costs.len());
            for (path, c) in costs {
                assert!(!c.source.trim().is_empty(), "{name}: {path} has no source");
                assert!(c.ns().is_finite() && c.ns() >= 0.0, "{name}: {path}");
                let expected_ns = match c.unit {
                    Unit::Ns => c.value,
                    Unit::Cycles => c.value / p.cpu.clock_ghz,
                };
                assert_eq!(c.ns(), expected_ns, "{name}: {path}");
            }
        }
    }

    #[test]
    fn bundled_files_on_disk_are_the_embedded_ones() {
        for name in PlatformProfile::bundled_names() {
            let path = repo_root().join(format!("scenarios/platforms/{name}.toml"));
            let on_disk = std::fs::read_to_string(&path).unwrap();
            assert_eq!(on_disk, PlatformProfile::bundled_toml(name).unwrap());
            let from_file = PlatformProfile::from_file(&path).unwrap();
            assert_eq!(from_file.name, name);
            assert!(from_file.origin().ends_with(&format!("{name}.toml")));
        }
    }

    #[test]
    fn optional_groups_match_each_platform_iommu() {
        let has = |name: &str| {
            let p = PlatformProfile::bundled(name).unwrap();
            (
                p.require_cmdq().is_ok(),
                p.require_register_flush().is_ok(),
                p.require_hypervisor().is_ok(),
            )
        };
        assert_eq!(has("rcar-h3"), (false, true, false)); // IPMMU: register flush + poll
        assert_eq!(has("hisilicon-d05"), (true, false, false)); // SMMUv3 command queue
        assert_eq!(has("hisilicon-d06"), (true, false, false));
        assert_eq!(has("hp-zx1"), (false, true, false)); // SBA purge + read-back
        assert_eq!(has("power-lpar"), (false, false, true)); // TCE hypercalls
        assert_eq!(has("nvidia-grace"), (true, false, false)); // SMMUv3 + CMDQV
                                                               // x86: VT-d's invalidation queue and AMD-Vi's command buffer use the queue costs.
        assert_eq!(has("intel-icelake-2s"), (true, false, false));
        assert_eq!(has("intel-sapphire-rapids-2s"), (true, false, false));
        assert_eq!(has("amd-epyc-genoa-2s"), (true, false, false));
        assert_eq!(has("intel-cascadelake-4s"), (true, false, false));
    }

    #[test]
    fn anchored_facts_are_what_the_sources_say() {
        let p = |n| PlatformProfile::bundled(n).unwrap();
        let h3 = p("rcar-h3");
        assert_eq!(
            (h3.cpu.model.as_str(), h3.cpu.clock_ghz),
            ("Cortex-A57", 1.5)
        );
        let flush = h3.require_register_flush().unwrap();
        assert_eq!(flush.poll_interval.ns(), 1000.0); // RESEARCH.md: polled in 1 us steps
        let d05 = p("hisilicon-d05");
        assert_eq!((d05.cpu.clock_ghz, d05.cpu.cores), (2.4, 64));
        let d06 = p("hisilicon-d06");
        assert_eq!((d06.cpu.clock_ghz, d06.cpu.cores), (2.6, 128));
        let grace = p("nvidia-grace");
        assert_eq!((grace.cpu.clock_ghz, grace.cpu.cores), (3.3, 144));
        // Grace's VCMDQs take CMD_SYNC with CS_NONE only: the CPU polls CONS, no MSI.
        let sync_msi = grace.require_cmdq().unwrap().sync_msi.as_ref().unwrap();
        assert!(!sync_msi.is_set());
        // X86.md §6: Ice Lake Platinum 8362 (32 cores per socket), two sockets.
        let icl = p("intel-icelake-2s");
        assert_eq!((icl.cpu.clock_ghz, icl.cpu.cores), (2.8, 64));
        // X86.md §5 [paper: F&S]: 197 ns per IOMMU memory read.
        assert_eq!(icl.iommu.walk_read.ns(), 197.0);
        let spr = p("intel-sapphire-rapids-2s");
        assert_eq!((spr.cpu.clock_ghz, spr.cpu.cores), (2.0, 112));
        let genoa = p("amd-epyc-genoa-2s");
        assert_eq!((genoa.cpu.clock_ghz, genoa.cpu.cores), (2.4, 192));
        let power = p("power-lpar");
        let hv = power.require_hypervisor().unwrap();
        assert_eq!((hv.call.value, hv.call.unit), (136.0, Unit::Cycles));
        // X86.md §6 [paper: F&S]: 4 x Xeon Gold 6234, 8 cores at 3.3 GHz each. Its walk read
        // is pcie-bench's IOTLB-miss penalty, not F&S's fit (which fands-iotlb declares as a
        // calibration).
        let clx = p("intel-cascadelake-4s");
        assert_eq!((clx.cpu.clock_ghz, clx.cpu.cores), (3.3, 32));
        assert_eq!(clx.iommu.walk_read.ns(), 250.0);
        for name in PlatformProfile::bundled_names() {
            if name == "intel-cascadelake-4s" {
                continue;
            }
            assert_eq!(
                p(name).iommu.walk_read.ns(),
                197.0,
                "{name}: F&S SOSP'24 fitted value"
            );
        }
    }

    #[test]
    fn missing_optional_groups_are_clear_errors() {
        let h3 = PlatformProfile::bundled("rcar-h3").unwrap();
        let e = h3.require_hypervisor().unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("rcar-h3") && msg.contains("hypervisor"),
            "{msg}"
        );
        assert_eq!(e.field(), Some("hypervisor"));
        let e = h3.require_cmdq().unwrap_err().to_string();
        assert!(e.contains("iommu.cmdq"), "{e}");
        let e = PlatformProfile::bundled("power-lpar")
            .unwrap()
            .require_register_flush()
            .unwrap_err()
            .to_string();
        assert!(e.contains("iommu.register_flush"), "{e}");
    }

    #[test]
    fn unknown_bundled_name_lists_the_known_ones() {
        let e = PlatformProfile::bundled("vax").unwrap_err().to_string();
        assert!(
            e.contains("vax") && e.contains("rcar-h3") && e.contains("power-lpar"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_file_names_the_path() {
        let e = PlatformProfile::from_file("/nonexistent/dir/x.toml").unwrap_err();
        assert!(matches!(e, CostError::Read { .. }));
        assert!(e.to_string().contains("/nonexistent/dir/x.toml"), "{e}");
    }

    // ---------------------------------------------------------------------------------------------
    // Malformed profiles: one clear error each, never a panic
    // ---------------------------------------------------------------------------------------------

    #[test]
    fn uniform_fixture_is_valid() {
        let p = load(&uniform_profile(&[])).unwrap();
        assert_eq!(p.costs().len(), PlatformProfile::cost_paths().len());
    }

    #[test]
    fn syntax_error_reports_file_and_line() {
        let good = PlatformProfile::bundled_toml("hisilicon-d05").unwrap();
        let broken = good.replacen("[sync]", "[sync", 1);
        let e =
            PlatformProfile::from_toml_str(&broken, "scenarios/platforms/broken.toml").unwrap_err();
        let line = line_of(&broken, "[sync");
        assert!(matches!(e, CostError::Syntax { .. }), "{e:?}");
        assert_eq!(e.line(), Some(line));
        let msg = e.to_string();
        assert!(msg.contains("scenarios/platforms/broken.toml"), "{msg}");
        assert!(msg.contains(&format!("line {line}")), "{msg}");
    }

    #[test]
    fn missing_cost_is_named() {
        let good = PlatformProfile::bundled_toml("hisilicon-d05").unwrap();
        let text: String = good
            .lines()
            .filter(|l| !l.starts_with("sync_latency ="))
            .map(|l| format!("{l}\n"))
            .collect();
        let (field, line, msg) = field_error(&text);
        assert_eq!(field, "iommu.cmdq.sync_latency");
        assert_eq!(line, Some(line_of(&text, "[iommu.cmdq]")));
        assert!(
            msg.contains("test.toml") && msg.contains("missing field"),
            "{msg}"
        );
    }

    #[test]
    fn missing_value_or_source_inside_a_cost_is_named() {
        let (field, _, _) = field_error(&uniform_profile(&[(
            "cpu.pte_write",
            "{ source = \"no value\" }",
        )]));
        assert_eq!(field, "cpu.pte_write.value");
        let (field, _, _) =
            field_error(&uniform_profile(&[("sync.lock_handoff", "{ value = 3 }")]));
        assert_eq!(field, "sync.lock_handoff.source");
    }

    #[test]
    fn missing_top_level_field_is_named() {
        let text = uniform_profile(&[]).replacen("name = \"uniform\"\n", "", 1);
        let (field, _, msg) = field_error(&text);
        assert_eq!(field, "name");
        assert!(msg.contains("missing field"), "{msg}");
    }

    #[test]
    fn wrong_type_names_field_and_expected_type() {
        let text = uniform_profile(&[("cpu.clock_ghz", "\"fast\"")]);
        let (field, line, msg) = field_error(&text);
        assert_eq!(field, "cpu.clock_ghz");
        assert_eq!(line, Some(line_of(&text, "clock_ghz")));
        assert!(msg.contains("expected a number"), "{msg}");

        let (field, _, msg) = field_error(&uniform_profile(&[("mmio.read", "150")]));
        assert_eq!(field, "mmio.read");
        assert!(msg.contains("expected a cost table"), "{msg}");

        let (field, _, msg) = field_error(&uniform_profile(&[(
            "cpu.pte_read",
            "{ value = \"20\", source = \"s\" }",
        )]));
        assert_eq!(field, "cpu.pte_read.value");
        assert!(msg.contains("expected a number"), "{msg}");

        let (field, _, msg) = field_error(&uniform_profile(&[(
            "cpu.pte_read",
            "{ value = 20, unit = \"us\", source = \"s\" }",
        )]));
        assert_eq!(field, "cpu.pte_read.unit");
        assert!(msg.contains("ns") && msg.contains("cycles"), "{msg}");

        let (field, _, _) = field_error(&uniform_profile(&[("cpu.cores", "-3")]));
        assert_eq!(field, "cpu.cores");
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let text = uniform_profile(&[]).replacen("[sync]\n", "[sync]\nbogus = 1\n", 1);
        let (field, line, msg) = field_error(&text);
        assert_eq!(field, "sync.bogus");
        assert_eq!(line, Some(line_of(&text, "bogus")));
        assert!(msg.contains("unknown field"), "{msg}");

        let (field, _, _) = field_error(&uniform_profile(&[(
            "cpu.pte_write",
            "{ value = 1, source = \"s\", note = \"x\" }",
        )]));
        assert_eq!(field, "cpu.pte_write.note");

        let text = uniform_profile(&[]).replacen("[memory]", "[gpu]\nx = 1\n[memory]", 1);
        let (field, _, _) = field_error(&text);
        assert_eq!(field, "gpu");
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        for bad in ["-1", "nan", "inf", "-inf"] {
            let text = uniform_profile(&[(
                "iommu.walk_read",
                &format!("{{ value = {bad}, source = \"s\" }}"),
            )]);
            let (field, line, msg) = field_error(&text);
            assert_eq!(field, "iommu.walk_read.value", "{bad}");
            assert_eq!(line, Some(line_of(&text, "walk_read")), "{bad}");
            assert!(msg.contains(">= 0"), "{msg}");
        }
        let (field, _, _) = field_error(&uniform_profile(&[("cpu.clock_ghz", "0")]));
        assert_eq!(field, "cpu.clock_ghz");
        let (field, _, _) = field_error(&uniform_profile(&[("cpu.cores", "0")]));
        assert_eq!(field, "cpu.cores");
        let (field, _, _) = field_error(&uniform_profile(&[(
            "memory.memcpy_bandwidth",
            "{ gb_per_s = -2, source = \"s\" }",
        )]));
        assert_eq!(field, "memory.memcpy_bandwidth.gb_per_s");
    }

    #[test]
    fn empty_sources_are_rejected_by_field() {
        let (field, _, msg) = field_error(&uniform_profile(&[(
            "hypervisor.tce_put",
            "{ value = 1, source = \"  \" }",
        )]));
        assert_eq!(field, "hypervisor.tce_put.source");
        assert!(msg.contains("non-empty"), "{msg}");
        let (field, _, _) = field_error(&uniform_profile(&[(
            "memory.memcpy_bandwidth",
            "{ gb_per_s = 2, source = \"\" }",
        )]));
        assert_eq!(field, "memory.memcpy_bandwidth.source");
        let (field, _, _) = field_error(&uniform_profile(&[("name", "\"\"")]));
        assert_eq!(field, "name");
    }

    #[test]
    fn the_port_facts_are_checked_and_named() {
        // A profile with `extra` added to its [iommu] group: the error's field.
        let with = |extra: &str| {
            let good = PlatformProfile::bundled_toml("intel-icelake-2s").unwrap();
            let text = good
                .lines()
                .filter(|l| l.split(" = ").next() != extra.split(" = ").next())
                .collect::<Vec<_>>()
                .join("\n");
            text.replacen("[iommu]\n", &format!("[iommu]\n{extra}\n"), 1)
        };
        let walkers = |v: u32| with(&format!("walkers = {{ value = {v}, source = \"t\" }}"));
        assert_eq!(load(&walkers(3)).unwrap().port_params().walkers, 3);
        assert_eq!(field_error(&walkers(0)).0, "iommu.walkers.value");
        let iotlb = |e: u32, w: u32, i: &str| {
            with(&format!(
                "iotlb = {{ entries = {e}, ways = {w}, index = \"{i}\", source = \"t\" }}"
            ))
        };
        let p = load(&iotlb(128, 8, "folded")).unwrap();
        let c = p.iommu.iotlb.as_ref().and_then(|g| g.config()).unwrap();
        assert_eq!((c.entries, c.ways), (128, 8));
        for (e, w, i) in [(64, 5, "folded"), (64, 4, "hashed"), (0, 1, "low-bits")] {
            let (field, _, message) = field_error(&iotlb(e, w, i));
            assert_eq!(field, "iommu.iotlb", "{message}");
            assert!(message.contains("low-bits"), "{message}");
        }
    }

    #[test]
    fn every_field_of_a_bundled_profile_is_required_or_named() {
        // Dropping any one cost line from a bundled profile gives an error naming that cost;
        // the optional facts (the DMA port's walkers, the IOTLB geometry) fall back to their
        // stated defaults.
        const OPTIONAL: &[&str] = &["walkers", "iotlb"];
        let good = PlatformProfile::bundled_toml("rcar-h3").unwrap();
        for (i, line) in good.lines().enumerate() {
            let Some((key, _)) = line.split_once(" = {") else {
                continue;
            };
            let text: String = good
                .lines()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, l)| format!("{l}\n"))
                .collect();
            if OPTIONAL.contains(&key) {
                assert!(load(&text).is_ok(), "dropping optional {key} refused");
                continue;
            }
            let (field, _, _) = field_error(&text);
            assert!(field.ends_with(key), "dropping {key}: error names {field}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn random_text_never_panics(text in "\\PC{0,400}") {
            let _ = load(&text);
        }

        #[test]
        fn mutated_profiles_never_panic(
            cut in 0usize..8000,
            len in 0usize..40,
            insert in "[ -~\\n]{0,12}",
        ) {
            let good = PlatformProfile::bundled_toml("power-lpar").unwrap();
            let mut start = cut.min(good.len());
            while !good.is_char_boundary(start) { start -= 1; }
            let mut end = (start + len).min(good.len());
            while !good.is_char_boundary(end) { end -= 1; }
            let mutated = format!("{}{}{}", &good[..start], insert, &good[end..]);
            match load(&mutated) {
                Ok(p) => prop_assert!(p.costs().iter().all(|(_, c)| c.ns().is_finite())),
                Err(e) => prop_assert!(e.to_string().contains("test.toml")),
            }
        }
    }

    // ---------------------------------------------------------------------------------------------
    // Conversions
    // ---------------------------------------------------------------------------------------------

    fn conversion_fixture() -> PlatformProfile {
        load(&uniform_profile(&[
            ("cpu.clock_ghz", "2.0"),
            (
                "cpu.pte_write",
                "{ value = 10, unit = \"cycles\", source = \"s\" }",
            ), // 5 ns
            ("cpu.tree_node_visit", "{ value = 3, source = \"s\" }"),
            ("cpu.command_write", "{ value = 0.5, source = \"s\" }"),
            (
                "sync.atomic_rmw",
                "{ value = 8, unit = \"cycles\", source = \"s\" }",
            ), // 4 ns
            ("sync.cacheline_transfer", "{ value = 40, source = \"s\" }"),
            (
                "sync.lock_acquire_release",
                "{ value = 25, source = \"s\" }",
            ),
            ("mmio.read", "{ value = 100, source = \"s\" }"),
            ("iommu.iotlb_lookup", "{ value = 2, source = \"s\" }"),
            ("iommu.walk_cache_lookup", "{ value = 3, source = \"s\" }"),
            ("iommu.walk_read", "{ value = 200, source = \"s\" }"),
            ("hypervisor.call", "{ value = 100, source = \"s\" }"),
            (
                "hypervisor.tce_invalidate",
                "{ value = 50, source = \"s\" }",
            ),
            ("hypervisor.tce_put", "{ value = 7, source = \"s\" }"),
            ("hypervisor.tce_stuff", "{ value = 2, source = \"s\" }"),
        ]))
        .unwrap()
    }

    fn sample_work() -> WorkRecord {
        let mut w = WorkRecord::new();
        w.ptes_written = 3;
        w.tree_nodes_visited = 7;
        w.commands_written = 4;
        w.cas_attempts = 2;
        w.cas_failures = 1;
        w.mmio_reads = 1;
        // Not CPU: engine waits, translation, hypervisor, uncharged.
        w.inval_syncs = 5;
        w.polls = 9;
        w.purges = 2;
        w.hypercalls = 2;
        w.tces_touched = 10;
        w.iotlb_hits = 6;
        w.iotlb_misses = 2;
        w.iotlb_stale_hits = 1;
        w.walk_reads = 3;
        w.dma_bytes = 1 << 20;
        w.translations = 8;
        w.lock(LockId::IovaTree);
        w.lock(LockId::IovaTree);
        w.lock(LockId::CmdqLock);
        w
    }

    #[test]
    fn cpu_ns_is_the_exact_dot_product() {
        let model = conversion_fixture().cpu_cost_model();
        let w = sample_work();
        // By hand: 3 PTE writes x 5 ns + 7 visits x 3 ns + 4 commands x 0.5 ns
        //        + 2 CAS x 4 ns + 1 failed CAS x 40 ns + 1 MMIO read x 100 ns.
        let expected = 3.0 * 5.0 + 7.0 * 3.0 + 4.0 * 0.5 + 2.0 * 4.0 + 40.0 + 100.0;
        assert_eq!(expected, 186.0);
        assert_eq!(model.cpu_ns(&w), expected);
        assert_eq!(model.cpu_ns(&WorkRecord::new()), 0.0);
        assert_eq!(model.cpu_weight("ptes_written"), Some(5.0));
        assert_eq!(model.cpu_weight("inval_syncs"), Some(0.0));
        assert_eq!(model.cpu_weight("no_such_counter"), None);
    }

    #[test]
    fn cpu_ns_adds_up_over_records() {
        let model = conversion_fixture().cpu_cost_model();
        let a = sample_work();
        let mut b = WorkRecord::new();
        b.ptes_cleared = 11;
        b.bitmap_words_scanned = 13;
        let mut sum = a;
        sum += &b;
        assert_eq!(model.cpu_ns(&sum), model.cpu_ns(&a) + model.cpu_ns(&b));
    }

    #[test]
    fn translation_hypervisor_and_locks_are_separate() {
        let model = conversion_fixture().cpu_cost_model();
        let w = sample_work();
        // 6 hits x 2 + 2 misses x (2 + 3) + 3 walk reads x 200.
        assert_eq!(
            model.translation_ns(&w),
            6.0 * 2.0 + 2.0 * 5.0 + 3.0 * 200.0
        );
        // 2 calls x (100 + 50) + 10 TCEs x 7.
        assert_eq!(model.hypervisor_ns(&w).unwrap(), 2.0 * 150.0 + 10.0 * 7.0);
        assert_eq!(model.lock_uncontended_ns(LockId::TcePool), 25.0);
        assert_eq!(model.locks_uncontended_ns(&w), 3.0 * 25.0);

        let p = conversion_fixture();
        let hv = p.require_hypervisor().unwrap();
        assert_eq!(hv.call_ns(TceCall::Stuff, 512), 150.0 + 512.0 * 2.0);
        assert_eq!(hv.call_ns(TceCall::Put, 1), 157.0);
    }

    #[test]
    fn edits_are_revalidated_and_re_resolved() {
        let mut p = PlatformProfile::bundled("rcar-h3").unwrap();
        assert_eq!(p.cpu.pte_write.ns(), 10.0); // 15 cycles at 1.5 GHz
        p.cpu.clock_ghz = 3.0;
        p.cpu.pte_write.value = 30.0;
        p.revalidate().unwrap();
        assert_eq!(p.cpu.pte_write.ns(), 10.0); // 30 cycles at 3 GHz
        assert_eq!(p.cpu_cost_model().cpu_weight("ptes_written"), Some(10.0));
        p.sync.lock_handoff.source = String::new();
        let e = p.revalidate().unwrap_err();
        assert_eq!(e.field(), Some("sync.lock_handoff.source"));
        assert!(e.to_string().contains("rcar-h3.toml"), "{e}");
    }

    #[test]
    fn hypervisor_time_needs_a_hypervisor_group() {
        let d05 = PlatformProfile::bundled("hisilicon-d05")
            .unwrap()
            .cpu_cost_model();
        assert_eq!(d05.hypervisor_ns(&WorkRecord::new()).unwrap(), 0.0);
        let mut w = WorkRecord::new();
        w.hypercalls = 1;
        let e = d05.hypervisor_ns(&w).unwrap_err().to_string();
        assert!(
            e.contains("hisilicon-d05") && e.contains("hypervisor"),
            "{e}"
        );
    }

    #[test]
    fn every_counter_is_classified() {
        let names: Vec<&str> = WorkRecord::new()
            .counters()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        let charged: Vec<&str> = COUNTER_CHARGES.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, charged);
        // Each CPU-charged counter, alone, costs exactly its weight.
        let model = PlatformProfile::bundled("rcar-h3")
            .unwrap()
            .cpu_cost_model();
        for (i, (name, charge)) in COUNTER_CHARGES.iter().enumerate() {
            let mut w = WorkRecord::new();
            set_nth(&mut w, i);
            let ns = model.cpu_ns(&w);
            match charge {
                Charge::Cpu(_) => assert_eq!(Some(ns), model.cpu_weight(name), "{name}"),
                _ => assert_eq!(ns, 0.0, "{name} is not CPU time"),
            }
        }
    }

    /// Sets the `i`-th plain counter of `w` to 1 (field order of `WorkRecord::counters`).
    fn set_nth(w: &mut WorkRecord, i: usize) {
        let fields: [&mut u64; 42] = [
            &mut w.ptes_written,
            &mut w.ptes_cleared,
            &mut w.pte_reads,
            &mut w.tables_allocated,
            &mut w.tables_freed,
            &mut w.cache_cleans,
            &mut w.tree_nodes_visited,
            &mut w.tree_rotations,
            &mut w.magazine_hits,
            &mut w.magazine_misses,
            &mut w.depot_exchanges,
            &mut w.rcache_flushes,
            &mut w.bitmap_words_scanned,
            &mut w.alloc_failures,
            &mut w.inval_ranges,
            &mut w.inval_pages,
            &mut w.inval_walks,
            &mut w.inval_domains,
            &mut w.inval_syncs,
            &mut w.flush_queue_adds,
            &mut w.flush_queue_flushes,
            &mut w.flush_queue_frees,
            &mut w.dma_bytes,
            &mut w.translations,
            &mut w.commands_written,
            &mut w.cas_attempts,
            &mut w.cas_failures,
            &mut w.owner_elections,
            &mut w.polls,
            &mut w.hypercalls,
            &mut w.tces_touched,
            &mut w.purges,
            &mut w.iotlb_hits,
            &mut w.iotlb_misses,
            &mut w.iotlb_stale_hits,
            &mut w.walk_reads,
            &mut w.full_walks,
            &mut w.mmio_writes,
            &mut w.mmio_reads,
            &mut w.iova_tree_retries,
            &mut w.iova_32bit_failures,
            &mut w.iova_full_range_allocs,
        ];
        *fields[i] = 1;
        let names: Vec<&str> = WorkRecord::new()
            .counters()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        let set: Vec<&str> = w
            .counters()
            .iter()
            .filter(|(_, v)| *v == 1)
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(set, [names[i]], "set_nth field list is out of date");
    }

    // ---------------------------------------------------------------------------------------------
    // docs/MODEL.md shows the current tables
    // ---------------------------------------------------------------------------------------------

    fn generated_blocks() -> Vec<(String, String)> {
        let mut blocks = vec![("counter-charges".to_owned(), counter_charges_markdown())];
        for name in PlatformProfile::bundled_names() {
            let p = PlatformProfile::bundled(name).unwrap();
            blocks.push((format!("profile {name}"), p.markdown_table()));
        }
        blocks
    }

    #[test]
    fn model_md_contains_the_current_tables() {
        let path = repo_root().join("docs/MODEL.md");
        let mut doc = std::fs::read_to_string(&path).expect("docs/MODEL.md exists");
        let bless = std::env::var_os("IOLAB_BLESS").is_some();
        let mut stale = Vec::new();
        for (id, body) in generated_blocks() {
            let begin = format!("<!-- BEGIN GENERATED: {id} -->\n");
            let end = format!("<!-- END GENERATED: {id} -->");
            let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end)) else {
                panic!("docs/MODEL.md lacks the markers for `{id}`: add\n{begin}{end}");
            };
            let current = &doc[b + begin.len()..e];
            if current != body {
                if bless {
                    doc = format!("{}{}{}", &doc[..b + begin.len()], body, &doc[e..]);
                } else {
                    stale.push(id);
                }
            }
        }
        if bless {
            std::fs::write(&path, doc).unwrap();
        }
        assert!(
            stale.is_empty(),
            "docs/MODEL.md is stale for {stale:?}; regenerate with \
         IOLAB_BLESS=1 cargo test -p iolab-sim --release --test cost_profiles"
        );
    }
}
