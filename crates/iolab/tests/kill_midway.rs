//! No lost results: `iolab reproduce` killed with SIGKILL at any point — between
//! experiments, during a simulation, or inside the transaction that stores a run — leaves the
//! results database consistent, with every run it stored complete and the runs stored before
//! it untouched; iolab reopens the file and adds runs to it.
//!
//! The kill points are a spread of delays after start (landing before, during and between
//! experiments) plus kills inside a store transaction: `IOLAB_TEST_STORE_PAUSE_MS` holds the
//! transaction open after the run and its figures are written (changing wall time only), and
//! the test kills iolab once the rollback journal exists, that is with the write under way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// The experiments one killed invocation runs, in order (the fast ones, twice each, so
/// there are several stores to land between and inside).
const SEQUENCE: [&str; 4] = ["pseries-ddw", "ipmmu-usb", "pseries-ddw", "ipmmu-usb"];

/// One stored run's content, as compared across databases: (figures, effects), each row
/// rendered exactly.
type Content = (Vec<String>, Vec<String>);

fn iolab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_iolab"));
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iolab-kill-midway-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn reproduce_to(db: &Path, names: &[&str]) {
    let out = iolab()
        .arg("--db")
        .arg(db)
        .arg("reproduce")
        .args(names)
        .output()
        .expect("iolab runs");
    assert!(
        out.status.success(),
        "iolab reproduce {names:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every run in the database: id -> (experiment, content).
fn runs(conn: &Connection) -> BTreeMap<i64, (String, Content)> {
    let mut stmt = conn
        .prepare("SELECT id, experiment FROM runs ORDER BY id")
        .unwrap();
    let ids: Vec<(i64, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    ids.into_iter()
        .map(|(id, exp)| {
            let figures = rows(
                conn,
                "SELECT id || '|' || unit || '|' || ifnull(published, 'null') || '|' || lab || '|' || role
                 FROM figures WHERE run_id = ?1 ORDER BY rowid",
                id,
            );
            let effects = rows(
                conn,
                "SELECT id || '|' || published_pct || '|' || lab_pct
                 FROM effects WHERE run_id = ?1 ORDER BY rowid",
                id,
            );
            (id, (exp, (figures, effects)))
        })
        .collect()
}

fn rows(conn: &Connection, sql: &str, id: i64) -> Vec<String> {
    let mut stmt = conn.prepare(sql).unwrap();
    let v: Vec<String> = stmt
        .query_map([id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    v
}

/// Checks a database after a kill; returns how many runs it holds.
fn check(
    db: &Path,
    earlier: &BTreeMap<i64, (String, Content)>,
    reference: &BTreeMap<String, Content>,
    label: &str,
) -> usize {
    // Opening rolls back a hot journal left by the killed writer, as iolab's own open does.
    let conn = Connection::open(db).expect("the database opens");
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok", "{label}: integrity check");
    let orphans: i64 = conn
        .query_row(
            "SELECT (SELECT count(*) FROM figures WHERE run_id NOT IN (SELECT id FROM runs))
                  + (SELECT count(*) FROM effects WHERE run_id NOT IN (SELECT id FROM runs))",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 0, "{label}: figures or effects without their run");
    let all = runs(&conn);
    for (id, before) in earlier {
        assert_eq!(
            all.get(id),
            Some(before),
            "{label}: earlier run {id} changed"
        );
    }
    for (id, (exp, content)) in &all {
        let want = &reference[exp];
        assert!(!want.0.is_empty(), "reference run of {exp} has figures");
        assert_eq!(
            content, want,
            "{label}: run {id} ({exp}) is incomplete or altered"
        );
    }
    all.len()
}

/// Starts the killed invocation on `db`.
fn start(db: &Path, pause_ms: Option<u64>) -> std::process::Child {
    let mut c = iolab();
    c.arg("--db").arg(db).arg("reproduce").args(SEQUENCE);
    if let Some(ms) = pause_ms {
        c.env("IOLAB_TEST_STORE_PAUSE_MS", ms.to_string());
    }
    c.spawn().expect("iolab starts")
}

fn kill(mut child: std::process::Child) -> bool {
    let finished = child.try_wait().expect("try_wait").is_some();
    // `Child::kill` sends SIGKILL on Unix.
    let _ = child.kill();
    child.wait().expect("wait");
    !finished
}

#[test]
fn a_killed_reproduce_leaves_a_consistent_database_with_complete_runs() {
    let dir = temp_dir();

    // Reference content of each experiment's run (runs are deterministic for a seed).
    let reference_db = dir.join("reference.db");
    reproduce_to(&reference_db, &["pseries-ddw", "ipmmu-usb"]);
    let reference: BTreeMap<String, Content> = runs(&Connection::open(&reference_db).unwrap())
        .into_values()
        .collect();
    assert_eq!(reference.len(), 2);

    // The database every killed run starts from: one earlier run already stored.
    let base = dir.join("base.db");
    reproduce_to(&base, &["ipmmu-usb"]);
    let earlier = runs(&Connection::open(&base).unwrap());
    assert_eq!(earlier.len(), 1);

    // How long the whole sequence takes here, to spread the kill delays over it.
    let full = dir.join("full.db");
    std::fs::copy(&base, &full).unwrap();
    let t0 = Instant::now();
    let status = start(&full, None).wait().unwrap();
    assert!(status.success());
    let total = t0.elapsed();
    assert_eq!(
        check(&full, &earlier, &reference, "uninterrupted"),
        1 + SEQUENCE.len()
    );

    let mut killed_while_running = 0;
    for i in 0..6u32 {
        let label = format!("killed after {i}/6 of the run time");
        let db = dir.join(format!("delay{i}.db"));
        std::fs::copy(&base, &db).unwrap();
        let child = start(&db, None);
        std::thread::sleep(total * i / 6);
        killed_while_running += usize::from(kill(child));
        check(&db, &earlier, &reference, &label);
    }

    // Kills inside the store transaction: wait until the rollback journal exists (the
    // transaction has written), then kill. The first and the second store.
    for nth in 1..=2usize {
        let label = format!("killed inside store {nth}");
        let db = dir.join(format!("store{nth}.db"));
        std::fs::copy(&base, &db).unwrap();
        let journal = PathBuf::from(format!("{}-journal", db.display()));
        let mut child = start(&db, Some(800));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = 0;
        loop {
            assert!(Instant::now() < deadline, "{label}: no store began in time");
            assert!(
                child.try_wait().unwrap().is_none(),
                "{label}: iolab exited first"
            );
            if journal.exists() {
                seen += 1;
                if seen == nth {
                    break;
                }
                // Let this store finish (its pause is 0.8 s) before looking for the next.
                while journal.exists() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(kill(child), "{label}: iolab had already finished");
        assert!(journal.exists(), "{label}: the hot journal is left behind");
        let n = check(&db, &earlier, &reference, &label);
        assert_eq!(
            n, nth,
            "{label}: the stores before the killed one are kept, the killed one is not"
        );

        // iolab reopens the file and adds runs after a kill.
        reproduce_to(&db, &["pseries-ddw"]);
        assert_eq!(check(&db, &earlier, &reference, &label), n + 1);
    }

    assert!(
        killed_while_running >= 3,
        "most delayed kills should land while iolab runs ({killed_while_running} did)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
