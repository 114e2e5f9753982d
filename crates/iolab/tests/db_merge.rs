//! `iolab db merge`: shard databases joined into one, duplicates skipped, bad inputs refused
//! with the output left unchanged.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

mod common;

use common::{iolab, s, stderr, temp_dir};

/// A 3-point sweep of the bundled bonnie-usb-ipmmu example over seeds.
fn write_grid(dir: &Path) -> PathBuf {
    let grid = dir.join("grid.toml");
    std::fs::write(
        &grid,
        "scenario = \"bonnie-usb-ipmmu\"\nseeds = [1, 2, 3]\n",
    )
    .unwrap();
    grid
}

fn sweep(grid: &Path, db: &Path, shard: &str) {
    let out = iolab(&[
        "--db",
        s(db),
        "sweep",
        s(grid),
        "--shard",
        shard,
        "--jobs",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A stored run as (sweep point, seed, its metrics).
type RunContent = (Option<i64>, i64, Vec<(String, f64)>);

/// Every run, ordered by point: what a merge must keep.
fn content(db: &Path) -> Vec<RunContent> {
    let c = Connection::open(db).unwrap();
    let mut st = c
        .prepare(
            "SELECT r.id, p.point, r.seed FROM runs r LEFT JOIN sweep_points p ON p.run_id = r.id
             ORDER BY p.point, r.seed",
        )
        .unwrap();
    let runs: Vec<(i64, Option<i64>, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    runs.into_iter()
        .map(|(id, point, seed)| {
            let mut f = c
                .prepare("SELECT name, value FROM metrics WHERE run_id = ?1 ORDER BY rowid")
                .unwrap();
            let figs = f
                .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            (point, seed, figs)
        })
        .collect()
}

fn count(db: &Path, table: &str) -> i64 {
    let c = Connection::open(db).unwrap();
    c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

#[test]
fn shards_merge_into_the_whole_sweep_and_duplicates_are_skipped() {
    let dir = temp_dir("whole");
    let grid = write_grid(&dir);
    let whole = dir.join("whole.db");
    sweep(&grid, &whole, "0/1");
    let shards: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("shard-{i}.db"))).collect();
    for (i, db) in shards.iter().enumerate() {
        sweep(&grid, db, &format!("{i}/2"));
    }
    // The output already holds an unrelated run, which the merge keeps.
    let out_db = dir.join("merged.db");
    let r = iolab(&["--db", s(&out_db), "reproduce", "pseries-ddw"]);
    assert!(r.status.success(), "{}", stderr(&r));

    let r = iolab(&["db", "merge", s(&out_db), s(&shards[1]), s(&shards[0])]);
    assert!(r.status.success(), "{}", stderr(&r));
    // A note about what changed: on standard error, as every command's.
    assert!(r.stdout.is_empty());
    let stdout = String::from_utf8_lossy(&r.stderr);
    assert!(
        stdout.contains("merged 3 runs from 2 databases"),
        "{stdout}"
    );
    assert!(stdout.contains("0 duplicate"), "{stdout}");

    let merged = content(&out_db);
    let (plain, swept): (Vec<_>, Vec<_>) = merged.into_iter().partition(|r| r.0.is_none());
    assert_eq!(plain.len(), 1, "the run that was there stays");
    assert_eq!(
        swept,
        content(&whole),
        "the shards together are the whole sweep"
    );
    assert_eq!(count(&out_db, "runs"), 4);
    assert_eq!(count(&out_db, "sweep_points"), 3);

    // Merging a shard again adds nothing: every point is already there.
    let r = iolab(&["db", "merge", s(&out_db), s(&shards[0]), s(&whole)]);
    assert!(r.status.success(), "{}", stderr(&r));
    let stdout = String::from_utf8_lossy(&r.stderr);
    assert!(
        stdout.contains("merged 0 runs") && stdout.contains("5 duplicate"),
        "{stdout}"
    );
    assert_eq!(count(&out_db, "runs"), 4);
}

#[test]
fn a_bad_input_leaves_the_output_unchanged() {
    let dir = temp_dir("bad");
    let grid = write_grid(&dir);
    let good = dir.join("good.db");
    sweep(&grid, &good, "0/2");
    let out_db = dir.join("out.db");
    sweep(&grid, &out_db, "1/2");
    let before = std::fs::read(&out_db).unwrap();

    // Not a database at all.
    let text = dir.join("notes.db");
    std::fs::write(&text, "just notes\n".repeat(50)).unwrap();
    let r = iolab(&["db", "merge", s(&out_db), s(&good), s(&text)]);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains(s(&text)), "{}", stderr(&r));
    assert_eq!(std::fs::read(&out_db).unwrap(), before);

    // An iolab database of another schema version.
    let old = dir.join("old.db");
    std::fs::copy(&good, &old).unwrap();
    Connection::open(&old)
        .unwrap()
        .pragma_update(None, "user_version", 1)
        .unwrap();
    let r = iolab(&["db", "merge", s(&out_db), s(&good), s(&old)]);
    assert_eq!(r.status.code(), Some(2));
    let err = stderr(&r);
    assert!(
        err.contains(s(&old)) && err.contains("schema version 1"),
        "{err}"
    );
    assert_eq!(std::fs::read(&out_db).unwrap(), before);

    // A truncated copy of a good shard.
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.join("cut.db");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let r = iolab(&["db", "merge", s(&out_db), s(&good), s(&cut)]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains(s(&cut)), "{}", stderr(&r));
    assert_eq!(std::fs::read(&out_db).unwrap(), before);

    // A missing input, and the output given as an input.
    let r = iolab(&["db", "merge", s(&out_db), s(&dir.join("none.db"))]);
    assert_eq!(r.status.code(), Some(2));
    let r = iolab(&["db", "merge", s(&out_db), s(&out_db)]);
    assert_eq!(r.status.code(), Some(2));
    assert_eq!(std::fs::read(&out_db).unwrap(), before);

    // A failed merge into a new file leaves no file behind.
    let fresh = dir.join("fresh.db");
    let r = iolab(&["db", "merge", s(&fresh), s(&good), s(&text)]);
    assert_eq!(r.status.code(), Some(2));
    assert!(!fresh.exists());
}

#[test]
fn run_groups_are_renumbered_with_their_runs() {
    let dir = temp_dir("groups");
    let input = dir.join("in.db");
    for _ in 0..3 {
        let r = iolab(&["--db", s(&input), "reproduce", "pseries-ddw"]);
        assert!(r.status.success(), "{}", stderr(&r));
    }
    // Runs 2 and 3 are one group, named by its first run.
    Connection::open(&input)
        .unwrap()
        .execute("UPDATE runs SET group_id = 2 WHERE id IN (2, 3)", [])
        .unwrap();
    let out_db = dir.join("out.db");
    for _ in 0..2 {
        let r = iolab(&["--db", s(&out_db), "reproduce", "pseries-ddw"]);
        assert!(r.status.success(), "{}", stderr(&r));
    }
    let r = iolab(&["db", "merge", s(&out_db), s(&input)]);
    assert!(r.status.success(), "{}", stderr(&r));
    let c = Connection::open(&out_db).unwrap();
    let groups: Vec<(i64, Option<i64>)> = c
        .prepare("SELECT id, group_id FROM runs ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Input runs 1, 2, 3 became 3, 4, 5: the group is now named 4.
    assert_eq!(
        groups,
        [(1, None), (2, None), (3, None), (4, Some(4)), (5, Some(4))]
    );
    // Measurements came along with their runs.
    let per_run = |db: &Path, id: i64| -> i64 {
        Connection::open(db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM metrics WHERE run_id = ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert!(per_run(&input, 2) > 0);
    assert_eq!(per_run(&out_db, 4), per_run(&input, 2));
}
