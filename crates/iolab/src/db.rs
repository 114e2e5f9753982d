//! The results database: every lab run kept in an embedded SQLite file.
//!
//! The schema is versioned with `PRAGMA user_version` and built by [`MIGRATIONS`], applied in
//! order, each in its own transaction. An iolab database is marked with
//! `PRAGMA application_id`, so a SQLite file of another program is refused rather than
//! altered. Each run is written in one transaction: a run killed midway leaves nothing.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use iolab_sim::experiment::ExperimentReport;
use rusqlite::{params, Connection, ErrorCode, OptionalExtension};
use serde::Serialize;

/// The default results file, in the current directory.
pub const DEFAULT_PATH: &str = "iolab-results.db";

/// `PRAGMA application_id` of an iolab results database ("IOLB").
const APPLICATION_ID: i64 = 0x494F_4C42;

/// Schema migrations; entry `i` takes the database from `user_version` `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // v1: runs, their figures and effects.
    "CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        experiment TEXT NOT NULL,
        scenario_origin TEXT,
        scenario_text TEXT,
        seed INTEGER NOT NULL,
        runs INTEGER NOT NULL,
        iolab_version TEXT NOT NULL,
        started_at TEXT NOT NULL,
        finished_at TEXT NOT NULL
    );
    CREATE TABLE figures (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        id TEXT NOT NULL,
        unit TEXT NOT NULL,
        published REAL NULL,
        lab REAL NOT NULL,
        role TEXT NOT NULL
    );
    CREATE TABLE effects (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        id TEXT NOT NULL,
        published_pct REAL NOT NULL,
        lab_pct REAL NOT NULL
    );
    CREATE INDEX figures_run ON figures(run_id);
    CREATE INDEX effects_run ON effects(run_id);",
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// A results-database failure; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The file could not be opened, read or written.
    #[error("results database {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// The file is not SQLite, or is SQLite but not an iolab results database.
    #[error("{} is not an iolab results database ({reason}); pass another file with --db or skip storing with --no-db", path.display())]
    NotResultsDb { path: PathBuf, reason: String },
    /// The file was written by a newer iolab.
    #[error("results database {} has schema version {found}, newer than the version {known} this iolab knows; use a newer iolab or another file with --db", path.display())]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    /// No run has this id.
    #[error("results database {} has no run {id}", path.display())]
    NoSuchRun { path: PathBuf, id: i64 },
}

impl DbError {
    /// The process exit code: 1 for I/O problems, 2 for a bad file or argument.
    pub fn exit_code(&self) -> u8 {
        match self {
            DbError::Io { .. } => 1,
            DbError::NotResultsDb { .. } | DbError::TooNew { .. } | DbError::NoSuchRun { .. } => 2,
        }
    }
}

/// One run to store: a report and how it was produced.
pub struct NewRun<'a> {
    /// What produced the run ("lab").
    pub kind: &'a str,
    /// Where the scenario came from (a path, or the bundled scenario).
    pub scenario_origin: Option<&'a str>,
    /// The scenario text as run.
    pub scenario_text: Option<&'a str>,
    /// Base seed.
    pub seed: u64,
    /// When the run started and finished.
    pub started_at: SystemTime,
    /// When the run finished.
    pub finished_at: SystemTime,
    /// The report.
    pub report: &'a ExperimentReport,
}

/// A line of `iolab runs list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub id: i64,
    pub experiment: String,
    pub seed: u64,
    pub runs: u32,
    pub started_at: String,
    pub figures: u64,
}

/// A stored figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredFigure {
    pub id: String,
    pub unit: String,
    pub published: Option<f64>,
    pub lab: f64,
    pub role: String,
}

/// A stored effect.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredEffect {
    pub id: String,
    pub published_pct: f64,
    pub lab_pct: f64,
}

/// A stored run, as `iolab runs show` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredRun {
    pub id: i64,
    pub kind: String,
    pub experiment: String,
    pub scenario_origin: Option<String>,
    pub seed: u64,
    pub runs: u32,
    pub iolab_version: String,
    pub started_at: String,
    pub finished_at: String,
    pub figures: Vec<StoredFigure>,
    pub effects: Vec<StoredEffect>,
}

/// An open results database.
pub struct ResultsDb {
    conn: Connection,
    path: PathBuf,
}

impl ResultsDb {
    /// Opens (creating if needed) the results database at `path` and brings its schema up to
    /// date. A file that is not an iolab database, or has a newer schema, is refused and left
    /// as it was.
    pub fn open(path: &Path) -> Result<Self, DbError> {
        let conn = Connection::open(path).map_err(|e| classify(path, e))?;
        let db = ResultsDb {
            conn,
            path: path.to_owned(),
        };
        db.check_and_migrate()?;
        Ok(db)
    }

    /// The file this database lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: rusqlite::Error) -> DbError {
        classify(&self.path, e)
    }

    fn check_and_migrate(&self) -> Result<(), DbError> {
        // Reading the header is the first access: a file that is not SQLite fails here,
        // before anything is written.
        let app_id: i64 = self
            .conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let version: i64 = self
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let objects: i64 = self
            .conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        if app_id != APPLICATION_ID {
            if app_id != 0 || version != 0 || objects != 0 {
                return Err(DbError::NotResultsDb {
                    path: self.path.clone(),
                    reason: "a SQLite database of another program".to_owned(),
                });
            }
        } else if version > SCHEMA_VERSION {
            return Err(DbError::TooNew {
                path: self.path.clone(),
                found: version,
                known: SCHEMA_VERSION,
            });
        }
        self.conn
            .pragma_update(None, "foreign_keys", true)
            .map_err(|e| self.err(e))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
            tx.execute_batch(sql).map_err(|e| self.err(e))?;
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(|e| self.err(e))?;
            tx.pragma_update(None, "user_version", i as i64 + 1)
                .map_err(|e| self.err(e))?;
            tx.commit().map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Stores one run with its figures and effects in a single transaction; returns its id.
    pub fn store(&mut self, run: &NewRun<'_>) -> Result<i64, DbError> {
        let path = self.path.clone();
        let e = |e| classify(&path, e);
        let tx = self.conn.transaction().map_err(e)?;
        let r = run.report;
        tx.execute(
            "INSERT INTO runs (kind, experiment, scenario_origin, scenario_text, seed, runs,
                               iolab_version, started_at, finished_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                run.kind,
                r.name,
                run.scenario_origin,
                run.scenario_text,
                // SQLite integers are i64: seeds are stored bit for bit.
                run.seed as i64,
                r.runs,
                env!("CARGO_PKG_VERSION"),
                rfc3339(run.started_at),
                rfc3339(run.finished_at),
            ],
        )
        .map_err(e)?;
        let id = tx.last_insert_rowid();
        {
            let mut fig = tx
                .prepare(
                    "INSERT INTO figures (run_id, id, unit, published, lab, role)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(e)?;
            for f in &r.figures {
                fig.execute(params![
                    id,
                    f.id,
                    f.unit,
                    f.published,
                    f.lab,
                    f.role.to_string()
                ])
                .map_err(e)?;
            }
            pause_for_kill_test();
            let mut eff = tx
                .prepare(
                    "INSERT INTO effects (run_id, id, published_pct, lab_pct)
                     VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(e)?;
            for x in &r.effects {
                eff.execute(params![id, x.id, x.published_pct, x.lab_pct])
                    .map_err(e)?;
            }
        }
        tx.commit().map_err(e)?;
        Ok(id)
    }

    /// Every stored run, oldest first.
    pub fn list(&self) -> Result<Vec<RunSummary>, DbError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.id, r.experiment, r.seed, r.runs, r.started_at,
                        (SELECT count(*) FROM figures f WHERE f.run_id = r.id)
                 FROM runs r ORDER BY r.id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |row| {
                Ok(RunSummary {
                    id: row.get(0)?,
                    experiment: row.get(1)?,
                    seed: row.get::<_, i64>(2)? as u64,
                    runs: row.get(3)?,
                    started_at: row.get(4)?,
                    figures: row.get::<_, i64>(5)? as u64,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// One stored run with its figures and effects.
    pub fn show(&self, id: i64) -> Result<StoredRun, DbError> {
        let run = self
            .conn
            .query_row(
                "SELECT id, kind, experiment, scenario_origin, seed, runs, iolab_version,
                        started_at, finished_at
                 FROM runs WHERE id = ?1",
                [id],
                |row| {
                    Ok(StoredRun {
                        id: row.get(0)?,
                        kind: row.get(1)?,
                        experiment: row.get(2)?,
                        scenario_origin: row.get(3)?,
                        seed: row.get::<_, i64>(4)? as u64,
                        runs: row.get(5)?,
                        iolab_version: row.get(6)?,
                        started_at: row.get(7)?,
                        finished_at: row.get(8)?,
                        figures: Vec::new(),
                        effects: Vec::new(),
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let Some(mut run) = run else {
            return Err(DbError::NoSuchRun {
                path: self.path.clone(),
                id,
            });
        };
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, unit, published, lab, role FROM figures
                 WHERE run_id = ?1 ORDER BY rowid",
            )
            .map_err(|e| self.err(e))?;
        run.figures = stmt
            .query_map([id], |row| {
                Ok(StoredFigure {
                    id: row.get(0)?,
                    unit: row.get(1)?,
                    published: row.get(2)?,
                    lab: row.get(3)?,
                    role: row.get(4)?,
                })
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, published_pct, lab_pct FROM effects
                 WHERE run_id = ?1 ORDER BY rowid",
            )
            .map_err(|e| self.err(e))?;
        run.effects = stmt
            .query_map([id], |row| {
                Ok(StoredEffect {
                    id: row.get(0)?,
                    published_pct: row.get(1)?,
                    lab_pct: row.get(2)?,
                })
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))?;
        Ok(run)
    }

    /// Removes a run; its figures and effects go with it.
    pub fn remove(&self, id: i64) -> Result<(), DbError> {
        let n = self
            .conn
            .execute("DELETE FROM runs WHERE id = ?1", [id])
            .map_err(|e| self.err(e))?;
        if n == 0 {
            return Err(DbError::NoSuchRun {
                path: self.path.clone(),
                id,
            });
        }
        Ok(())
    }
}

/// Splits SQLite failures into "not a database" (bad input) and everything else (I/O).
/// Environment variable that pauses [`ResultsDb::store`] inside its transaction (after the
/// run and its figures are written, before its effects and the commit) for that many
/// milliseconds, so `tests/kill_midway.rs` can kill iolab inside the window. It changes
/// wall time only, never what is stored.
pub const STORE_PAUSE_ENV: &str = "IOLAB_TEST_STORE_PAUSE_MS";

fn pause_for_kill_test() {
    let ms = std::env::var(STORE_PAUSE_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

fn classify(path: &Path, e: rusqlite::Error) -> DbError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => DbError::NotResultsDb {
            path: path.to_owned(),
            reason: "not a SQLite file".to_owned(),
        },
        _ => DbError::Io {
            path: path.to_owned(),
            source: e,
        },
    }
}

/// Formats a time as RFC 3339 UTC with whole seconds, e.g. `2026-11-29T21:07:33Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use iolab_sim::experiment::{Effect, Figure, Role};
    use std::time::Duration;

    fn temp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("iolab-db-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join("results.db")
    }

    fn report() -> ExperimentReport {
        ExperimentReport {
            name: "sba-vmerge".to_owned(),
            title: "test".to_owned(),
            runs: 3,
            figures: vec![
                Figure {
                    id: "a".to_owned(),
                    unit: "us".to_owned(),
                    published: Some(1.5),
                    lab: 1.25,
                    role: Role::Calibration,
                },
                Figure {
                    id: "b".to_owned(),
                    unit: "MB/s".to_owned(),
                    published: None,
                    lab: 7.0,
                    role: Role::Prediction,
                },
            ],
            effects: vec![Effect {
                id: "speedup".to_owned(),
                published_pct: 12.0,
                lab_pct: 10.5,
            }],
            calibrated: Vec::new(),
            report_text: String::new(),
            notes: Vec::new(),
            measurements: Vec::new(),
        }
    }

    fn store(db: &mut ResultsDb, r: &ExperimentReport) -> i64 {
        db.store(&NewRun {
            kind: "lab",
            scenario_origin: Some("scenarios/sba-vmerge.toml (bundled)"),
            scenario_text: Some("experiment = \"sba-vmerge\"\n"),
            seed: u64::MAX,
            started_at: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            finished_at: UNIX_EPOCH + Duration::from_secs(1_700_000_001),
            report: r,
        })
        .expect("stored")
    }

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let at = |s| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn migration_sets_user_version_and_application_id() {
        let path = temp_path("migrate");
        drop(ResultsDb::open(&path).expect("opens"));
        let conn = Connection::open(&path).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let a: i64 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .unwrap();
        assert_eq!(a, APPLICATION_ID);
        drop(conn);
        // Reopening an up-to-date database changes nothing.
        let before = std::fs::read(&path).unwrap();
        drop(ResultsDb::open(&path).expect("reopens"));
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn a_report_round_trips() {
        let path = temp_path("roundtrip");
        let mut db = ResultsDb::open(&path).unwrap();
        let r = report();
        let id = store(&mut db, &r);
        let list = db.list().unwrap();
        assert_eq!(
            list,
            vec![RunSummary {
                id,
                experiment: "sba-vmerge".to_owned(),
                seed: u64::MAX,
                runs: 3,
                started_at: "2023-11-14T22:13:20Z".to_owned(),
                figures: 2,
            }]
        );
        let run = db.show(id).unwrap();
        assert_eq!(run.kind, "lab");
        assert_eq!(run.finished_at, "2023-11-14T22:13:21Z");
        assert_eq!(run.iolab_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            run.scenario_origin.as_deref(),
            Some("scenarios/sba-vmerge.toml (bundled)")
        );
        assert_eq!(run.figures.len(), 2);
        for (s, f) in run.figures.iter().zip(&r.figures) {
            assert_eq!(
                (&s.id, &s.unit, s.published, s.lab, s.role.as_str()),
                (
                    &f.id,
                    &f.unit,
                    f.published,
                    f.lab,
                    f.role.to_string().as_str()
                )
            );
        }
        assert_eq!(
            run.effects,
            vec![StoredEffect {
                id: "speedup".to_owned(),
                published_pct: 12.0,
                lab_pct: 10.5
            }]
        );
    }

    #[test]
    fn rm_cascades_to_figures_and_effects() {
        let path = temp_path("rm");
        let mut db = ResultsDb::open(&path).unwrap();
        let r = report();
        let a = store(&mut db, &r);
        let b = store(&mut db, &r);
        db.remove(a).unwrap();
        let count = |table: &str| -> i64 {
            db.conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(count("runs"), 1);
        assert_eq!(count("figures"), 2);
        assert_eq!(count("effects"), 1);
        assert!(matches!(db.show(a), Err(DbError::NoSuchRun { .. })));
        assert!(db.show(b).is_ok());
        let err = db.remove(a).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn a_future_schema_is_refused_and_left_unchanged() {
        let path = temp_path("future");
        let mut db = ResultsDb::open(&path).unwrap();
        store(&mut db, &report());
        db.conn
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(db);
        let before = std::fs::read(&path).unwrap();
        let err = ResultsDb::open(&path).err().expect("refused");
        assert!(matches!(err, DbError::TooNew { found, .. } if found == SCHEMA_VERSION + 1));
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn a_non_sqlite_file_is_refused_and_left_unchanged() {
        let path = temp_path("text");
        let text = "not a database, just some notes\n".repeat(20);
        std::fs::write(&path, &text).unwrap();
        let err = ResultsDb::open(&path).err().expect("refused");
        assert!(matches!(err, DbError::NotResultsDb { .. }), "{err:?}");
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn another_programs_sqlite_file_is_refused_and_left_unchanged() {
        let path = temp_path("other");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        drop(conn);
        let before = std::fs::read(&path).unwrap();
        let err = ResultsDb::open(&path).err().expect("refused");
        assert!(matches!(err, DbError::NotResultsDb { .. }), "{err:?}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }
}
