//! bonnie on block devices (NVMe, SAS with N disks) through the lab's block stack and the
//! scenario's DMA path: the bundled examples run and print bonnie++ 1.03 rows, every byte
//! the page cache writes reaches the device once, an IOMMU costs CPU, runs are
//! deterministic, and validation still refuses what bonnie cannot drive.

mod common;
use common::{metric, run};

use iolab_sim::lab::LabError;
use iolab_sim::lab::{self, examples, LabOptions, LabRun};
use iolab_sim::workloads::bonnie::{CSV_COLUMNS, FILE_PHASES};

const BLOCK_EXAMPLES: [&str; 3] = [
    "bonnie-sas-smmuv3-strict",
    "bonnie-sas-off",
    "bonnie-nvme-smmuv3-strict",
];

#[test]
fn block_examples_print_rows_in_bonnies_column_order() {
    for name in BLOCK_EXAMPLES {
        let r = run(examples::example(name).unwrap());
        let row = r.report.report_text.lines().next().unwrap();
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols.len(), CSV_COLUMNS.len(), "{name}: {row}");
        let col = |c: &str| cols[CSV_COLUMNS.iter().position(|x| *x == c).unwrap()];
        assert_eq!(col("name"), name);
        assert_eq!(col("size"), "8G", "{name}: the logical file size (-s 8192)");
        // Every sequential and seek column is a number and agrees with its metric.
        for (c, m) in [
            ("putc_kps", "bonnie.out_char_kps"),
            ("putc_cpu", "bonnie.out_char_cpu_pct"),
            ("write_kps", "bonnie.out_block_kps"),
            ("write_cpu", "bonnie.out_block_cpu_pct"),
            ("rewrite_kps", "bonnie.rewrite_kps"),
            ("rewrite_cpu", "bonnie.rewrite_cpu_pct"),
            ("getc_kps", "bonnie.in_char_kps"),
            ("getc_cpu", "bonnie.in_char_cpu_pct"),
            ("read_kps", "bonnie.in_block_kps"),
            ("read_cpu", "bonnie.in_block_cpu_pct"),
            ("seeks_per_s", "bonnie.seeks_per_s"),
            ("seeks_cpu", "bonnie.seeks_cpu_pct"),
        ] {
            let v: f64 = col(c)
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {c} = {:?} is not a number", col(c)));
            assert!(
                (v - metric(&r, m)).abs() <= 0.5 + 1e-9,
                "{name}: {c} {v} vs {m} {}",
                metric(&r, m)
            );
            assert!(v > 0.0, "{name}: {c} = {v}");
        }
        assert_eq!(col("files"), "16");
        // File tests: a rate that agrees with its metric, or too fast to measure
        // (`+++++` and `+++`, and no metric).
        let metrics = &r.report.measurements[0].metrics;
        for (k, phase) in FILE_PHASES.iter().enumerate() {
            let (rate, cpu) = (col(CSV_COLUMNS[15 + 2 * k]), col(CSV_COLUMNS[16 + 2 * k]));
            let m = format!("bonnie.{phase}_per_s");
            if rate == "+++++" {
                assert_eq!(cpu, "+++", "{name}: {phase}");
                assert!(metrics.iter().all(|x| x.name != m), "{name}: {m}");
            } else {
                let v: f64 = rate.parse().unwrap();
                assert!((v - metric(&r, &m)).abs() <= 0.5 + 1e-9, "{name}: {phase}");
                let _: f64 = cpu.parse().unwrap();
            }
        }
        for phase in ["seq_create", "seq_delete", "ran_create", "ran_delete"] {
            assert!(metric(&r, &format!("bonnie.{phase}_per_s")) > 0.0, "{name}");
        }
        let m = &r.report.measurements[0];
        assert_eq!(m.attrs["workload"], "bonnie");
        assert!(
            r.report.title.contains("bonnie++ 1.03 CSV"),
            "{}",
            r.report.title
        );
    }
}

#[test]
fn every_byte_written_reaches_the_device_once() {
    for name in BLOCK_EXAMPLES {
        let r = run(examples::example(name).unwrap());
        let file_bytes = r.report.measurements[0].attrs["file_mib"]
            .parse::<f64>()
            .unwrap()
            * 1048576.0;
        let written = metric(&r, "block.write_bytes");
        let device_written = metric(&r, "device.write_bytes");
        // Three write phases (per-char, block, rewrite), each ending with fsync(); then
        // the seekers' updates (a seeker's first seek and every tenth after it), each
        // fsync()ed under -b: the 8 KiB chunk, two journal blocks and the commit block
        // (the lab's default chunk_bytes and fsync_journal_blocks, as ipmmu-usb argues them).
        let per_update = 8192.0 + 2.0 * 4096.0 + 4096.0;
        // Then the file tests: 1,024 files per test; each create's commit writes 6
        // journal blocks and the commit block, each delete's 7 and the commit block
        // (the bundled [files] section).
        let file_writes = 2.0 * 1024.0 * ((6.0 + 1.0) + (7.0 + 1.0)) * 4096.0;
        let seek_writes = written - 3.0 * file_bytes - file_writes;
        let updates = seek_writes / per_update;
        assert_eq!(
            updates.fract(),
            0.0,
            "{name}: {seek_writes} B of seek writes"
        );
        // 8000 seeks over 3 seekers: sum of ceil(n_i / 10) is 800 to 802.
        assert!(
            (800.0..=802.0).contains(&updates),
            "{name}: {updates} updates"
        );
        assert_eq!(
            device_written, written,
            "{name}: the device saw every byte written"
        );
        let read = metric(&r, "block.read_bytes");
        assert_eq!(metric(&r, "device.read_bytes"), read, "{name}");
        // Three read phases over a cold cache, plus the seekers' uncached chunks.
        assert!(read >= 3.0 * file_bytes, "{name}: {read}");
        assert!(read <= 3.0 * file_bytes + 8000.0 * 8192.0, "{name}: {read}");
        assert!(metric(&r, "block.commands") > 0.0);
    }
}

#[test]
fn a_strict_iommu_costs_cpu_that_no_iommu_does_not() {
    let strict = run(examples::example("bonnie-sas-smmuv3-strict").unwrap());
    let off = run(examples::example("bonnie-sas-off").unwrap());
    let sys = |r: &LabRun| r.report.measurements[0].cpu.unwrap().system_ns;
    assert!(
        sys(&strict) > sys(&off),
        "machine system time: strict {} vs off {}",
        sys(&strict),
        sys(&off)
    );
    assert!(metric(&strict, "dma.map_ns") > metric(&off, "dma.map_ns"));
    assert!(metric(&strict, "dma.unmap_ns") > metric(&off, "dma.unmap_ns"));
    assert!(metric(&strict, "dma.inval_syncs") > 0.0);
    assert_eq!(metric(&off, "dma.inval_syncs"), 0.0);
    // bonnie maps its own reads (readahead is submitted from its read()): its CPU per KiB
    // read is higher with the IOMMU.
    let per_kib = |r: &LabRun, p: &str| {
        metric(r, &format!("bonnie.{p}_cpu_pct")) / metric(r, &format!("bonnie.{p}_kps"))
    };
    for p in ["in_block", "rewrite"] {
        assert!(
            per_kib(&strict, p) > per_kib(&off, p),
            "{p}: {} vs {}",
            per_kib(&strict, p),
            per_kib(&off, p)
        );
    }
    // The IOMMU merges the page cache's scattered pages into fewer DMA segments.
    assert!(metric(&strict, "dma.segments_per_command") < metric(&off, "dma.segments_per_command"));
}

#[test]
fn bonnie_on_a_block_device_is_deterministic() {
    let text = examples::example("bonnie-nvme-smmuv3-strict").unwrap();
    let json = |seed: Option<u64>| {
        let r = lab::run_scenario(text, "t.toml", &LabOptions { runs: 1, seed }).unwrap();
        (
            r.report.report_text.clone(),
            serde_json::to_string(&r.json()).unwrap(),
        )
    };
    let a = json(None);
    assert_eq!(a, json(None), "same scenario and seed, same bytes");
    let b = json(Some(99));
    assert_ne!(a.1, b.1, "another seed places pages and seeks elsewhere");
}

#[test]
fn bonnie_still_refuses_devices_it_cannot_drive() {
    let nvme = examples::example("bonnie-nvme-smmuv3-strict").unwrap();
    // A second [[device]]: bonnie's file system lives on one device.
    let two = nvme.replacen("[workload]", "[[device]]\nkind = \"nvme\"\n\n[workload]", 1);
    match lab::run_scenario(&two, "two.toml", &LabOptions::default()) {
        Err(LabError::Input(e)) => {
            assert!(e.to_string().contains("device"), "{e}");
        }
        Err(e) => panic!("expected an input error, got {e}"),
        Ok(_) => panic!("bonnie on two devices must be refused"),
    }
    let nic = r#"
name = "bonnie-nic"
[machine]
platform = "power-lpar"
cpus = 4
memory_gib = 64
[iommu]
model = "pseries"
mode = "ddw-dynamic"
[[device]]
kind = "nic"
[workload]
kind = "bonnie"
"#;
    match lab::run_scenario(nic, "nic.toml", &LabOptions::default()) {
        Err(LabError::Input(e)) => {
            let msg = e.to_string();
            assert!(msg.contains("bonnie on nvme, sas, scsi or usb"), "{msg}");
            assert!(msg.contains("fio runs on nvme or sas"), "{msg}");
        }
        Err(e) => panic!("expected an input error, got {e}"),
        Ok(_) => panic!("bonnie on a NIC must be refused"),
    }
}
