//! bonnie++ and re-aim imports meet the lab runs of the same job in `iolab compare` by
//! their typed attributes, not by name (docs/VOCABULARY.md, Pairing): bonnie by its file
//! size, re-aim per user count; where several lab configurations share the key (the cells
//! of a published experiment), by the attributes both sides carry, which `iolab import
//! --attr KEY=VALUE` declares.

use std::path::{Path, PathBuf};

mod common;

use common::{iolab, s, stderr, temp_dir};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn ok(out: &std::process::Output) {
    assert!(out.status.success(), "{}", stderr(out));
}

/// `compare A B --format json`.
fn compare(db: &Path, a: &str, b: &str) -> serde_json::Value {
    let out = iolab(&["--db", s(db), "compare", a, b, "--format", "json"]);
    ok(&out);
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `(A's configuration, B's configuration)` of every pair made by attributes.
fn pairs(c: &serde_json::Value) -> Vec<(String, String)> {
    c["paired_by_attributes"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (
                        p["a"].as_str().unwrap().to_owned(),
                        p["b"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The rows of configuration `config` and metric `metric`.
fn row<'a>(c: &'a serde_json::Value, config: &str, metric: &str) -> &'a serde_json::Value {
    c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["config"] == config && r["metric"] == metric)
        .unwrap_or_else(|| panic!("no row {config} {metric}"))
}

/// A real bonnie++ 2.00a CSV row (`-s 512M`) and the lab's bonnie run of a 512 MiB file
/// pair by `workload=bonnie size=512M`, whatever the machine and scenario are called.
#[test]
fn a_real_bonnie_csv_pairs_with_the_lab_run_of_the_same_file_size() {
    let dir = temp_dir("bonnie");
    let db = dir.join("p.db");
    let example = std::fs::read_to_string(repo(
        "scenarios/examples/bonnie-nvme-smmuv3-strict-198.toml",
    ))
    .unwrap();
    let scenario = dir.join("lab-bonnie.toml");
    std::fs::write(
        &scenario,
        example
            .replace(
                "name = \"bonnie-nvme-smmuv3-strict-198\"",
                "name = \"lab-bonnie\"",
            )
            .replace("csv = \"1.98\"", "csv = \"1.98\"\nlogical_file_mib = 512"),
    )
    .unwrap();
    ok(&iolab(&[
        "--db",
        s(&db),
        "import",
        "bonnie",
        s(&data("bonnie-2.00a.csv")),
    ]));
    ok(&iolab(&["--db", s(&db), "run", s(&scenario)]));
    let c = compare(&db, "1", "2");
    assert_eq!(pairs(&c), [("vm".to_owned(), "lab-bonnie".to_owned())]);
    assert!(
        c["paired_by_attributes"][0]["key"]
            .as_str()
            .unwrap()
            .starts_with("workload=bonnie size=536870912"),
        "{c}"
    );
    // The real row's block write rate (369,242 K/sec) stands beside the lab's.
    let r = row(&c, "vm", "bonnie.out_block_kps");
    assert_eq!(r["a"]["mean"], 369242.0);
    assert!(r["b"]["mean"].as_f64().unwrap() > 0.0);
    // A lab file of another size is another job: nothing pairs.
    let other = dir.join("other.toml");
    std::fs::write(
        &other,
        example.replace("name = \"bonnie-nvme", "name = \"x-bonnie-nvme"),
    )
    .unwrap();
    ok(&iolab(&["--db", s(&db), "run", s(&other)]));
    let out = iolab(&["--db", s(&db), "compare", "1", "3"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bonnie: size"), "{}", stderr(&out));
}

/// A re-aim table (user counts 100..500, SEEDS.md #3's published novmerge table) pairs
/// row by row with the lab run of that job: each lab user count's row (`reaim.usersN.*`)
/// meets the import's `users_N` under the import's metric names.
#[test]
fn a_reaim_table_pairs_row_by_row_with_the_lab_run_of_the_same_user_counts() {
    let dir = temp_dir("reaim");
    let db = dir.join("p.db");
    ok(&iolab(&[
        "--db",
        s(&db),
        "import",
        "reaim",
        s(&data("reaim-sba-vmerge-novmerge.txt")),
    ]));
    ok(&iolab(&[
        "--db",
        s(&db),
        "run",
        s(&repo("scenarios/experiments/sba-vmerge/novmerge.toml")),
    ]));
    let c = compare(&db, "1", "2");
    let want: Vec<(String, String)> = (1..=5)
        .map(|k| {
            (
                format!("users_{}", k * 100),
                format!("novmerge.users{}", k * 100),
            )
        })
        .collect();
    assert_eq!(pairs(&c), want);
    let r = row(&c, "users_100", "reaim.jobs_per_min");
    assert_eq!(r["a"]["mean"], 5605.19);
    let lab = r["b"]["mean"].as_f64().unwrap();
    assert!((lab - 5605.19).abs() / 5605.19 < 0.1, "{lab}");
}

/// The seed's published tables against `reproduce` runs: several cells share the key
/// (sba-vmerge's novmerge and vmerge rows at each user count; ipmmu-usb's four bonnie
/// cells of one file size), so nothing pairs until the import says which machine it was
/// (`--attr`); then each row pairs with the one cell that agrees.
#[test]
fn published_tables_pair_with_reproduce_cells_by_the_attributes_the_import_declares() {
    let dir = temp_dir("published");
    let db = dir.join("p.db");
    ok(&iolab(&[
        "--db",
        s(&db),
        "reproduce",
        "sba-vmerge",
        "ipmmu-usb",
    ]));
    // 1: sba-vmerge, 2: ipmmu-usb.
    let table = data("reaim-sba-vmerge-vmerge.txt");
    ok(&iolab(&["--db", s(&db), "import", "reaim", s(&table)]));
    let out = iolab(&["--db", s(&db), "compare", "3", "1"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "two cells per user count: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("A's users_100 has the key workload=reaim users=100 of B's novmerge.users100, vmerge.users100"),
        "{}",
        stderr(&out)
    );
    ok(&iolab(&[
        "--db",
        s(&db),
        "import",
        "reaim",
        s(&table),
        "--attr",
        "virt_merge=true",
    ]));
    let c = compare(&db, "4", "1");
    let got = pairs(&c);
    assert_eq!(got.len(), 5, "{got:?}");
    assert!(
        got.iter().all(|(_, b)| b.starts_with("vmerge.users")),
        "{got:?}"
    );
    let key = c["paired_by_attributes"][0]["key"].as_str().unwrap();
    assert!(key.contains("told apart by virt_merge=true"), "{key}");
    // A published bonnie row: IOMMU on, SuperSpeed.
    ok(&iolab(&[
        "--db",
        s(&db),
        "import",
        "bonnie",
        s(&data("bonnie-1.03-ipmmu-usb-superspeed-iommu.csv")),
        "--attr",
        "iommu_mode=strict",
        "--attr",
        "usb_speed=superspeed",
    ]));
    let c = compare(&db, "5", "2");
    assert_eq!(
        pairs(&c),
        [("superspeed".to_owned(), "superspeed.iommu".to_owned())]
    );
    assert_eq!(
        row(&c, "superspeed", "bonnie.out_block_kps")["a"]["mean"],
        276686.0
    );
}

/// A bad `--attr` is bad input naming it, and stores nothing.
#[test]
fn a_bad_attr_is_bad_input() {
    let dir = temp_dir("bad-attr");
    let db = dir.join("p.db");
    for bad in ["novalue", "Bad Key=1", "k="] {
        let out = iolab(&[
            "--db",
            s(&db),
            "import",
            "reaim",
            s(&data("reaim-sba-vmerge-vmerge.txt")),
            "--attr",
            bad,
        ]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("--attr"), "{}", stderr(&out));
    }
    assert!(!db.exists(), "nothing stored");
}

/// `(metric name, unit)` of every metric of run `id`'s measurements.
fn units(db: &Path, id: &str) -> std::collections::BTreeMap<String, String> {
    let out = iolab(&["--db", s(db), "runs", "show", id, "--format", "json"]);
    ok(&out);
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    run["measurements"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["metrics"].as_array().cloned().unwrap_or_default())
        .map(|x| {
            let field = |k: &str| x[k].as_str().unwrap_or_default().to_owned();
            (field("name"), field("unit"))
        })
        .collect()
}

#[test]
fn a_bonnie_metric_has_one_unit_in_lab_runs_imports_and_experiment_figures() {
    let dir = temp_dir("bonnie-units");
    let db = dir.join("r.db");
    ok(&iolab(&[
        "--db",
        s(&db),
        "run",
        "--example",
        "bonnie-usb-ipmmu",
    ]));
    ok(&iolab(&[
        "--db",
        s(&db),
        "import",
        "bonnie",
        s(&data("bonnie-2.00a.csv")),
    ]));
    let (lab, import) = (units(&db, "1"), units(&db, "2"));
    let shared: Vec<&String> = lab.keys().filter(|k| import.contains_key(*k)).collect();
    assert!(shared.len() >= 10, "{shared:?}");
    for name in shared {
        assert_eq!(lab[name], import[name], "{name}");
    }
    assert_eq!(lab["bonnie.seeks_per_s"], "/sec");
    // The published figures of the bonnie experiment read in bonnie's own unit too.
    let text = std::fs::read_to_string(repo("scenarios/experiments/ipmmu-usb.toml")).unwrap();
    assert!(!text.contains("unit = \"K/s\""));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_row_of_a_multi_row_bonnie_csv_pairs_by_its_own_attributes() {
    let dir = temp_dir("bonnie-rows");
    let db = dir.join("r.db");
    let csv = data("bonnie-1.03-ipmmu-usb-noiommu.csv");
    ok(&iolab(&[
        "--db",
        s(&db),
        "import",
        "bonnie",
        s(&csv),
        "--attr",
        "iommu_mode=off",
        "--attr",
        "superspeed:usb_speed=superspeed",
        "--attr",
        "highspeed:usb_speed=highspeed",
    ]));
    ok(&iolab(&["--db", s(&db), "reproduce", "ipmmu-usb"]));
    let json = compare(&db, "g1", "3");
    let pairs = json["paired_by_attributes"].as_array().expect("pairs");
    let pair = |a: &str| {
        pairs
            .iter()
            .find(|p| p["a"] == a)
            .unwrap_or_else(|| panic!("{a} unpaired: {json}"))["b"]
            .clone()
    };
    assert_eq!(pair("superspeed"), "superspeed.no_iommu");
    assert_eq!(pair("highspeed"), "highspeed.no_iommu");
    // A row the file does not have is refused, and nothing is stored.
    let out = iolab(&[
        "--db",
        s(&db),
        "import",
        "bonnie",
        s(&csv),
        "--attr",
        "superfast:usb_speed=x",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no configuration \"superfast\""),
        "{}",
        stderr(&out)
    );
    let listed = iolab(&["--db", s(&db), "runs", "list"]);
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).lines().count(),
        1 + 3
    );
}
