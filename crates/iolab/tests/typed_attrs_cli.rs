//! Attributes are stored typed (schema version 5, docs/VOCABULARY.md, Attributes): an
//! integer as an SQLite INTEGER, a size in bytes, a boolean as 0/1 with kind `bool`, text
//! as TEXT; a database written before (version 4, attributes as JSON text) is migrated
//! when opened and reads as before.

use std::path::Path;

use rusqlite::Connection;

mod common;

use common::{iolab, s, stderr, temp_dir};

/// `(kind, SQLite type of the value, the value as text)` of attribute `key` of run `run`'s
/// first measurement.
fn stored(db: &Path, run: i64, key: &str) -> (String, String, String) {
    Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT kind, typeof(value), CAST(value AS TEXT) FROM attrs
             WHERE run_id = ?1 AND position = 0 AND key = ?2",
            rusqlite::params![run, key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap_or_else(|e| panic!("attribute {key} of run {run}: {e}"))
}

fn show(db: &Path, run: &str) -> serde_json::Value {
    let out = iolab(&["--db", s(db), "runs", "show", run, "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn an_old_schema_file_is_migrated_to_typed_attributes_and_reads_as_before() {
    let dir = temp_dir("v4");
    let db = dir.join("old.db");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/results-v4.db");
    std::fs::copy(&fixture, &db).unwrap();
    let version = |db: &Path| -> i64 {
        Connection::open(db)
            .unwrap()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap()
    };
    assert_eq!(version(&db), 4, "the fixture is a version-4 file");
    let run = show(&db, "1");
    assert_eq!(version(&db), 5);
    let attrs = &run["measurements"][0]["attrs"];
    // fio's `--bs=4k` is the size 4096; numbers are numbers.
    assert_eq!(attrs["bs"], 4096, "{attrs}");
    assert_eq!(attrs["iodepth"], 8);
    assert_eq!(attrs["rw"], "randread");
    assert_eq!(
        stored(&db, 1, "iodepth"),
        ("integer".into(), "integer".into(), "8".into())
    );
    assert_eq!(
        stored(&db, 1, "bs"),
        ("integer".into(), "integer".into(), "4096".into())
    );
    assert_eq!(
        stored(&db, 1, "workload"),
        ("text".into(), "text".into(), "fio".into())
    );
    assert_eq!(
        stored(&db, 2, "users"),
        ("text".into(), "text".into(), "2..=8 step 2".into())
    );
    // The metrics and the JSON column are gone from `measurements`, not the runs.
    let cols: Vec<String> = Connection::open(&db)
        .unwrap()
        .prepare("SELECT name FROM pragma_table_info('measurements')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!cols.contains(&"attrs".to_owned()), "{cols:?}");
    let reaim = show(&db, "2");
    assert_eq!(reaim["measurements"][0]["attrs"]["workload"], "reaim");
    assert!(
        reaim["measurements"][0]["metrics"]
            .as_array()
            .unwrap()
            .len()
            > 10
    );
    // The migrated import still pairs with a lab run by its typed attributes (its psync job
    // ran at depth 1, whatever its iodepth=8 said).
    let scenario = dir.join("lab.toml");
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/examples/fio-nvme-strict.toml"),
    )
    .unwrap();
    let mut text = example.clone();
    for (field, value) in [
        ("rw", "\"randread\""),
        ("bs", "\"4k\""),
        ("iodepth", "1"),
        ("numjobs", "2"),
    ] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{field} =")))
            .map(str::to_owned);
        match line {
            Some(l) => text = text.replace(&l, &format!("{field} = {value}")),
            None => text = text.replace("[workload]", &format!("[workload]\n{field} = {value}")),
        }
    }
    std::fs::write(&scenario, text).unwrap();
    let out = iolab(&["--db", s(&db), "run", s(&scenario)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = iolab(&["--db", s(&db), "compare", "1", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("paired by attributes: configuration randread (A)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn new_runs_store_integers_booleans_and_text_typed() {
    let dir = temp_dir("new");
    let db = dir.join("new.db");
    let out = iolab(&["--db", s(&db), "run", "--example", "reaim-scsi-sba"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stored(&db, 1, "cpus"),
        ("integer".into(), "integer".into(), "2".into())
    );
    assert_eq!(stored(&db, 1, "virt_merge").0, "bool");
    assert_eq!(stored(&db, 1, "virt_merge").1, "integer");
    assert_eq!(
        stored(&db, 1, "iommu_model"),
        ("text".into(), "text".into(), "sba".into())
    );
    let run = show(&db, "1");
    let attrs = &run["measurements"][0]["attrs"];
    assert!(attrs["virt_merge"].is_boolean(), "{attrs}");
    assert_eq!(attrs["cpus"], 2);
    // The text view keeps the value as written.
    let out = iolab(&["--db", s(&db), "runs", "show", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("virt_merge=") && text.contains("cpus=2"),
        "{text}"
    );
}
