//! The results database: every lab run kept in an embedded SQLite file.
//!
//! The schema is versioned with `PRAGMA user_version` and built by [`MIGRATIONS`], applied in
//! order, each in its own transaction. An iolab database is marked with
//! `PRAGMA application_id`, so a SQLite file of another program is refused rather than
//! altered. Each run is written in one transaction: a run killed midway leaves nothing.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use iolab_sim::experiment::ExperimentReport;
use iolab_sim::metrics::{CpuBreakdown, LatencyHistogram, Measurement, Metric};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};
use serde::Serialize;

/// The default results file, in the current directory.
pub const DEFAULT_PATH: &str = "iolab-results.db";

/// `PRAGMA application_id` of an iolab results database ("IOLB").
pub(crate) const APPLICATION_ID: i64 = 0x494F_4C42;

/// How long an access waits for another process's lock on the file before it fails.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

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
    // v2: measured configurations (metrics, latency histograms, CPU time), run groups
    // (repetitions of one scenario) and a free label (import source, sweep point ...).
    "ALTER TABLE runs ADD COLUMN group_id INTEGER NULL;
    ALTER TABLE runs ADD COLUMN label TEXT NULL;
    CREATE TABLE measurements (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        config TEXT NOT NULL,
        attrs TEXT NOT NULL,
        latency TEXT NULL,
        cpu_user_ns INTEGER NULL,
        cpu_system_ns INTEGER NULL,
        cpu_spin_ns INTEGER NULL,
        cpu_idle_ns INTEGER NULL,
        PRIMARY KEY (run_id, position)
    );
    CREATE TABLE metrics (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        name TEXT NOT NULL,
        unit TEXT NOT NULL,
        value REAL NOT NULL
    );
    CREATE INDEX metrics_run ON metrics(run_id, position);
    CREATE INDEX runs_group ON runs(group_id);",
    // v3: sweep points: which sweep (a hash of the grid) and which point of it a run is, with
    // the point's axis values as a JSON object (written by `iolab sweep`, read by
    // `iolab db merge` to skip duplicates).
    "CREATE TABLE sweep_points (
        run_id INTEGER NOT NULL UNIQUE REFERENCES runs(id) ON DELETE CASCADE,
        sweep_id TEXT NOT NULL,
        sweep_name TEXT NOT NULL,
        point INTEGER NOT NULL,
        points INTEGER NOT NULL,
        axes TEXT NOT NULL
    );
    CREATE INDEX sweep_points_key ON sweep_points(sweep_id, point);",
    // v4: run ids are never reused: `runs.id` becomes AUTOINCREMENT, so a run stored after
    // `iolab runs rm` of the newest run does not take the removed run's id (which a note or
    // a report may still name). SQLite cannot add AUTOINCREMENT to a column: the table is
    // rebuilt with its rows and ids as they are (foreign keys are off while migrating, so
    // dropping the old table cascades nothing; the children's `REFERENCES runs` resolve to
    // the new table once it is renamed).
    "CREATE TABLE runs_v4 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        experiment TEXT NOT NULL,
        scenario_origin TEXT,
        scenario_text TEXT,
        seed INTEGER NOT NULL,
        runs INTEGER NOT NULL,
        iolab_version TEXT NOT NULL,
        started_at TEXT NOT NULL,
        finished_at TEXT NOT NULL,
        group_id INTEGER NULL,
        label TEXT NULL
    );
    INSERT INTO runs_v4 (id, kind, experiment, scenario_origin, scenario_text, seed, runs,
                         iolab_version, started_at, finished_at, group_id, label)
        SELECT id, kind, experiment, scenario_origin, scenario_text, seed, runs,
               iolab_version, started_at, finished_at, group_id, label FROM runs;
    DROP TABLE runs;
    ALTER TABLE runs_v4 RENAME TO runs;
    CREATE INDEX runs_group ON runs(group_id);",
    // v5: typed attributes (docs/VOCABULARY.md, Attributes). Each attribute of a measured
    // configuration is a row with its type (`kind`) and its value in that SQLite storage
    // class: INTEGER for integers and sizes in bytes, REAL, INTEGER 0/1 for booleans, TEXT
    // (an integer beyond SQLite's 64-bit range stays text). The column `value` has no
    // declared type, so SQLite keeps each value's class. After this SQL,
    // [`ResultsDb::check_and_migrate`] fills the table from the JSON text of the older
    // `measurements.attrs` column ([`typed_attr`]) and drops that column, in the same
    // transaction.
    "CREATE TABLE attrs (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        key TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('integer', 'real', 'bool', 'text')),
        value NOT NULL,
        PRIMARY KEY (run_id, position, key)
    );",
];

/// The schema version whose migration moves attributes from `measurements.attrs` (JSON
/// text) into the typed `attrs` table.
const TYPED_ATTRS_VERSION: usize = 5;

/// An attribute's stored form: its kind and its value in that kind's SQLite storage class,
/// read through [`iolab::vocab::typed`] (sizes in bytes, aliases folded).
pub(crate) fn typed_attr(key: &str, raw: &str) -> (&'static str, rusqlite::types::Value) {
    use rusqlite::types::Value as Sql;
    match iolab::vocab::typed(key, raw) {
        serde_json::Value::Bool(b) => ("bool", Sql::Integer(i64::from(b))),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                ("integer", Sql::Integer(i))
            } else if n.is_u64() {
                // Beyond i64: kept exactly, as text.
                ("text", Sql::Text(raw.to_owned()))
            } else {
                ("real", Sql::Real(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        serde_json::Value::String(t) => ("text", Sql::Text(t)),
        other => ("text", Sql::Text(other.to_string())),
    }
}

/// A stored attribute as the text a [`Measurement`]'s `attrs` holds: integers in decimal,
/// reals as Rust prints them (shortest form that reads back), booleans `true`/`false`.
fn attr_text(kind: &str, value: rusqlite::types::Value) -> String {
    use rusqlite::types::Value as Sql;
    match (kind, value) {
        ("bool", Sql::Integer(i)) => (i != 0).to_string(),
        (_, Sql::Integer(i)) => i.to_string(),
        (_, Sql::Real(x)) => x.to_string(),
        (_, Sql::Text(t)) => t,
        (_, Sql::Blob(b)) => String::from_utf8_lossy(&b).into_owned(),
        (_, Sql::Null) => String::new(),
    }
}

/// Moves every measurement's JSON `attrs` into the typed `attrs` table and drops the JSON
/// column (migration to [`TYPED_ATTRS_VERSION`], inside its transaction).
fn move_attrs_to_typed_table(tx: &rusqlite::Transaction<'_>) -> Result<(), String> {
    let rows: Vec<(i64, i64, String)> = tx
        .prepare("SELECT run_id, position, attrs FROM measurements")
        .and_then(|mut st| {
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(|e| e.to_string())?;
    let mut insert = tx
        .prepare(
            "INSERT INTO attrs (run_id, position, key, kind, value) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(|e| e.to_string())?;
    for (run_id, position, json) in rows {
        let attrs: std::collections::BTreeMap<String, String> = serde_json::from_str(&json)
            .map_err(|e| format!("run {run_id}, measurement {position}: attrs: {e}"))?;
        for (k, v) in &attrs {
            let (kind, value) = typed_attr(k, v);
            insert
                .execute(params![run_id, position, k, kind, value])
                .map_err(|e| e.to_string())?;
        }
    }
    tx.execute_batch("ALTER TABLE measurements DROP COLUMN attrs;")
        .map_err(|e| e.to_string())
}

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
    /// A stored value could not be read back (the file was altered by something else).
    #[error("results database {} is damaged: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
    /// No run has this id.
    #[error("results database {} has no run {id}", path.display())]
    NoSuchRun { path: PathBuf, id: i64 },
    /// No run belongs to this group.
    #[error("results database {} has no group g{group_id} (no run belongs to group {group_id})", path.display())]
    NoSuchGroup { path: PathBuf, group_id: i64 },
    /// The directory the file should be in does not exist (the database is created on first
    /// use, its directory is not).
    #[error("results database {}: directory {} does not exist; create it, or pass another file with --db or skip storing with --no-db", path.display(), dir.display())]
    NoDirectory { path: PathBuf, dir: PathBuf },
    /// No run has an id in this range.
    #[error("results database {} has no run with an id in {lo}-{hi}", path.display())]
    NoRunInRange { path: PathBuf, lo: i64, hi: i64 },
    /// No sweep has this id or name, or a name matches several sweeps.
    #[error("results database {}: {problem}", path.display())]
    NoSuchSweep { path: PathBuf, problem: String },
    /// A command that reads stored runs was given a database file that does not exist
    /// (only the commands that store runs create one).
    #[error("results database {} does not exist; store runs first (`iolab run`, `iolab reproduce`, `iolab import`) or pass another file with --db", path.display())]
    Missing { path: PathBuf },
}

impl DbError {
    /// The process exit code: 1 for I/O problems, 2 for a bad file or argument.
    pub fn exit_code(&self) -> u8 {
        match self {
            DbError::Io { .. } => 1,
            DbError::NotResultsDb { .. }
            | DbError::TooNew { .. }
            | DbError::NoSuchRun { .. }
            | DbError::NoSuchGroup { .. }
            | DbError::NoDirectory { .. }
            | DbError::Missing { .. }
            | DbError::NoRunInRange { .. }
            | DbError::NoSuchSweep { .. }
            | DbError::Corrupt { .. } => 2,
        }
    }
}

/// One run to store: a report and how it was produced.
#[derive(Clone, Copy)]
pub struct NewRun<'a> {
    /// What produced the run: `lab`, or `import:fio`, `import:bonnie`, `import:reaim`.
    pub kind: &'a str,
    /// The group of repetitions this run belongs to (the id of the group's first run), if any.
    pub group_id: Option<i64>,
    /// A free label: the imported file, a sweep point's axis values ...
    pub label: Option<&'a str>,
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
    pub kind: String,
    pub group_id: Option<i64>,
    pub label: Option<String>,
    pub experiment: String,
    pub seed: u64,
    pub runs: u32,
    pub started_at: String,
    pub figures: u64,
    pub measurements: u64,
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
    pub group_id: Option<i64>,
    pub label: Option<String>,
    pub experiment: String,
    pub scenario_origin: Option<String>,
    pub seed: u64,
    pub runs: u32,
    pub iolab_version: String,
    pub started_at: String,
    pub finished_at: String,
    pub figures: Vec<StoredFigure>,
    pub effects: Vec<StoredEffect>,
    /// In JSON each measurement's attributes are typed values (`"iodepth": 8`,
    /// `"virt_merge": false`), as stored.
    #[serde(serialize_with = "typed_measurements")]
    pub measurements: Vec<Measurement>,
}

/// Serializes measurements with their attributes as typed JSON values
/// ([`iolab::vocab::typed`]).
fn typed_measurements<S: serde::Serializer>(ms: &[Measurement], s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Typed<'a> {
        config: &'a str,
        attrs: std::collections::BTreeMap<String, serde_json::Value>,
        metrics: &'a [Metric],
        latency: &'a Option<LatencyHistogram>,
        cpu: &'a Option<CpuBreakdown>,
    }
    s.collect_seq(ms.iter().map(|m| Typed {
        config: &m.config,
        attrs: iolab::vocab::typed_attrs(&m.attrs),
        metrics: &m.metrics,
        latency: &m.latency,
        cpu: &m.cpu,
    }))
}

/// An open results database.
pub struct ResultsDb {
    conn: Connection,
    path: PathBuf,
}

impl ResultsDb {
    /// Opens (creating if needed) the results database at `path` and brings its schema up to
    /// date. A file that is not an iolab database, or has a newer schema, is refused and left
    /// as it was; a path whose directory does not exist is refused before anything runs.
    pub fn open(path: &Path) -> Result<Self, DbError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.is_dir() {
                return Err(DbError::NoDirectory {
                    path: path.to_owned(),
                    dir: dir.to_owned(),
                });
            }
        }
        let conn = Connection::open(path).map_err(|e| classify(path, e))?;
        // Before the first statement: another process may be creating or writing the file,
        // and every access then waits for its lock instead of failing at once.
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| classify(path, e))?;
        let mut db = ResultsDb {
            conn,
            path: path.to_owned(),
        };
        db.check_and_migrate()?;
        Ok(db)
    }

    /// Opens the results database at `path` for a command that reads stored runs (`runs`,
    /// `compare`, `report`): as [`ResultsDb::open`], but a file that does not exist is
    /// refused with [`DbError::Missing`] rather than created.
    pub fn open_existing(path: &Path) -> Result<Self, DbError> {
        if !path.exists() {
            return Err(DbError::Missing {
                path: path.to_owned(),
            });
        }
        Self::open(path)
    }

    /// The file this database lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: rusqlite::Error) -> DbError {
        classify(&self.path, e)
    }

    /// The rows `sql` selects with `params`, each made by `row`, in the order SQLite gives.
    fn select<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, DbError> {
        let mut stmt = self.conn.prepare(sql).map_err(|e| self.err(e))?;
        let rows = stmt.query_map(params, row).map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    fn check_and_migrate(&mut self) -> Result<(), DbError> {
        // Reading the header is the first access: a file that is not SQLite fails here,
        // before anything is written. The three reads share one read transaction, so they
        // see one state of a file another process is creating.
        let (app_id, version, objects) = {
            let path = self.path.clone();
            let err = |e| classify(&path, e);
            let tx = self.conn.unchecked_transaction().map_err(err)?;
            let app_id: i64 = tx
                .pragma_query_value(None, "application_id", |r| r.get(0))
                .map_err(err)?;
            let version: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(err)?;
            let objects: i64 = tx
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(err)?;
            tx.commit().map_err(err)?;
            (app_id, version, objects)
        };
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
        if version == SCHEMA_VERSION {
            return self
                .conn
                .pragma_update(None, "foreign_keys", true)
                .map_err(|e| self.err(e));
        }
        // Foreign keys are off while migrating (a migration may rebuild `runs`, see v4; the
        // bundled SQLite turns them on by default) and on for everything after.
        self.conn
            .pragma_update(None, "foreign_keys", false)
            .map_err(|e| self.err(e))?;
        loop {
            // Each step takes the write lock first (IMMEDIATE) and reads the version under
            // it: processes that open a new file together serialise here, and the ones after
            // the first find its schema instead of creating it again.
            let path = self.path.clone();
            let err = |e| classify(&path, e);
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(err)?;
            let version: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(err)?;
            let i = version.max(0) as usize;
            let Some(sql) = MIGRATIONS.get(i) else {
                tx.commit().map_err(err)?;
                break;
            };
            tx.execute_batch(sql).map_err(err)?;
            if i + 1 == TYPED_ATTRS_VERSION {
                move_attrs_to_typed_table(&tx).map_err(|what| DbError::Corrupt {
                    path: path.clone(),
                    what: format!("migrating to typed attributes: {what}"),
                })?;
            }
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(err)?;
            tx.pragma_update(None, "user_version", i as i64 + 1)
                .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        self.conn
            .pragma_update(None, "foreign_keys", true)
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Stores one run with its figures and effects in a single transaction; returns its id.
    pub fn store(&mut self, run: &NewRun<'_>) -> Result<i64, DbError> {
        self.store_with(run, |_, _| Ok(()))
    }

    /// [`ResultsDb::store`], with `extra` writing more rows about the new run (given its id)
    /// in the same transaction.
    fn store_with(
        &mut self,
        run: &NewRun<'_>,
        extra: impl FnOnce(&rusqlite::Transaction<'_>, i64) -> rusqlite::Result<()>,
    ) -> Result<i64, DbError> {
        let path = self.path.clone();
        let tx = self.conn.transaction().map_err(|e| classify(&path, e))?;
        let id = insert_run(&tx, run).map_err(|e| classify(&path, e))?;
        extra(&tx, id).map_err(|e| classify(&path, e))?;
        tx.commit().map_err(|e| classify(&path, e))?;
        Ok(id)
    }

    /// Stores `runs` as one group in a single transaction (all or nothing): when there is
    /// more than one, each gets the first one's id as its `group_id` (their own `group_id`
    /// is ignored). Returns their ids in order.
    pub fn store_group(&mut self, runs: &[NewRun<'_>]) -> Result<Vec<i64>, DbError> {
        let path = self.path.clone();
        let e = |e| classify(&path, e);
        let tx = self.conn.transaction().map_err(e)?;
        let mut ids = Vec::with_capacity(runs.len());
        for run in runs {
            let group_id = (runs.len() > 1).then(|| ids.first().copied()).flatten();
            let id = insert_run(&tx, &NewRun { group_id, ..*run }).map_err(e)?;
            if runs.len() > 1 && ids.is_empty() {
                tx.execute("UPDATE runs SET group_id = ?1 WHERE id = ?1", [id])
                    .map_err(e)?;
            }
            ids.push(id);
        }
        tx.commit().map_err(e)?;
        Ok(ids)
    }

    /// Stores a run that starts a new group of repetitions: its `group_id` is its own id, so
    /// later repetitions are stored with `group_id: Some(that id)`.
    pub fn store_group_start(&mut self, run: &NewRun<'_>) -> Result<i64, DbError> {
        let path = self.path.clone();
        let e = |e| classify(&path, e);
        let tx = self.conn.transaction().map_err(e)?;
        let id = insert_run(&tx, run).map_err(e)?;
        tx.execute("UPDATE runs SET group_id = ?1 WHERE id = ?1", [id])
            .map_err(e)?;
        tx.commit().map_err(e)?;
        Ok(id)
    }

    /// The ids of the runs of group `group_id`, in order; an error if there are none.
    pub fn group_members(&self, group_id: i64) -> Result<Vec<i64>, DbError> {
        let ids: Vec<i64> = self.select(
            "SELECT id FROM runs WHERE group_id = ?1 ORDER BY id",
            [group_id],
            |r| r.get(0),
        )?;
        if ids.is_empty() {
            return Err(DbError::NoSuchGroup {
                path: self.path.clone(),
                group_id,
            });
        }
        Ok(ids)
    }

    /// Whether run `id` is stored.
    pub fn has_run(&self, id: i64) -> Result<bool, DbError> {
        let found: Vec<i64> =
            self.select("SELECT id FROM runs WHERE id = ?1", [id], |r| r.get(0))?;
        Ok(!found.is_empty())
    }

    /// The ids of the stored runs from `lo` to `hi` (both included), in order; an error if
    /// there are none.
    pub fn runs_between(&self, lo: i64, hi: i64) -> Result<Vec<i64>, DbError> {
        let ids: Vec<i64> = self.select(
            "SELECT id FROM runs WHERE id BETWEEN ?1 AND ?2 ORDER BY id",
            [lo, hi],
            |r| r.get(0),
        )?;
        if ids.is_empty() {
            return Err(DbError::NoRunInRange {
                path: self.path.clone(),
                lo,
                hi,
            });
        }
        Ok(ids)
    }

    /// The runs of the sweep whose id or name is `key`, in point order (every shard's
    /// points, as `iolab db merge` joined them). A name several sweeps share is refused with
    /// their ids, so the caller can pick one.
    pub fn sweep_runs(&self, key: &str) -> Result<Vec<i64>, DbError> {
        let sweeps: Vec<(String, String)> = self.select(
            "SELECT DISTINCT sweep_id, sweep_name FROM sweep_points WHERE sweep_id = ?1 OR sweep_name = ?1 ORDER BY sweep_id",
            [key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let id = match sweeps.as_slice() {
            [] => {
                return Err(DbError::NoSuchSweep {
                    path: self.path.clone(),
                    problem: format!("no sweep has the id or name `{key}` (`iolab runs list` shows sweep points with their sweep)"),
                })
            }
            [(id, _)] => id.clone(),
            several => {
                return Err(DbError::NoSuchSweep {
                    path: self.path.clone(),
                    problem: format!(
                        "{} sweeps are named `{key}`: pick one by id ({})",
                        several.len(),
                        several
                            .iter()
                            .map(|(id, _)| format!("sweep:{id}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
            }
        };
        self.select(
            "SELECT run_id FROM sweep_points WHERE sweep_id = ?1 ORDER BY point, run_id",
            [id],
            |r| r.get(0),
        )
    }

    /// Every stored run, oldest first.
    pub fn list(&self) -> Result<Vec<RunSummary>, DbError> {
        self.select(
            "SELECT r.id, r.experiment, r.seed, r.runs, r.started_at,
                    (SELECT count(*) FROM figures f WHERE f.run_id = r.id),
                    r.kind, r.group_id, r.label,
                    (SELECT count(*) FROM measurements m WHERE m.run_id = r.id)
             FROM runs r ORDER BY r.id",
            [],
            |row| {
                Ok(RunSummary {
                    id: row.get(0)?,
                    experiment: row.get(1)?,
                    seed: row.get::<_, i64>(2)? as u64,
                    runs: row.get(3)?,
                    started_at: row.get(4)?,
                    figures: row.get::<_, i64>(5)? as u64,
                    kind: row.get(6)?,
                    group_id: row.get(7)?,
                    label: row.get(8)?,
                    measurements: row.get::<_, i64>(9)? as u64,
                })
            },
        )
    }

    /// One stored run with its figures and effects.
    pub fn show(&self, id: i64) -> Result<StoredRun, DbError> {
        let run = self
            .conn
            .query_row(
                "SELECT id, kind, experiment, scenario_origin, seed, runs, iolab_version,
                        started_at, finished_at, group_id, label
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
                        group_id: row.get(9)?,
                        label: row.get(10)?,
                        figures: Vec::new(),
                        effects: Vec::new(),
                        measurements: Vec::new(),
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
        run.figures = self.select(
            "SELECT id, unit, published, lab, role FROM figures
             WHERE run_id = ?1 ORDER BY rowid",
            [id],
            |row| {
                Ok(StoredFigure {
                    id: row.get(0)?,
                    unit: row.get(1)?,
                    published: row.get(2)?,
                    lab: row.get(3)?,
                    role: row.get(4)?,
                })
            },
        )?;
        run.effects = self.select(
            "SELECT id, published_pct, lab_pct FROM effects
             WHERE run_id = ?1 ORDER BY rowid",
            [id],
            |row| {
                Ok(StoredEffect {
                    id: row.get(0)?,
                    published_pct: row.get(1)?,
                    lab_pct: row.get(2)?,
                })
            },
        )?;
        run.measurements = self.measurements(id)?;
        Ok(run)
    }

    /// The measured configurations of run `id`, in the order they were stored (empty for a
    /// run stored before schema v2 or one without measurements).
    pub fn measurements(&self, id: i64) -> Result<Vec<Measurement>, DbError> {
        let bad = |what: &str, e: serde_json::Error| DbError::Corrupt {
            path: self.path.clone(),
            what: format!("run {id}: {what}: {e}"),
        };
        type Row = (
            i64,
            String,
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let rows: Vec<Row> = self.select(
            "SELECT position, config, latency, cpu_user_ns, cpu_system_ns,
                    cpu_spin_ns, cpu_idle_ns
             FROM measurements WHERE run_id = ?1 ORDER BY position",
            [id],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            },
        )?;
        let mut attr_stmt = self
            .conn
            .prepare(
                "SELECT key, kind, value FROM attrs
                 WHERE run_id = ?1 AND position = ?2 ORDER BY key",
            )
            .map_err(|e| self.err(e))?;
        let mut metric_stmt = self
            .conn
            .prepare(
                "SELECT name, unit, value FROM metrics
                 WHERE run_id = ?1 AND position = ?2 ORDER BY rowid",
            )
            .map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for (position, config, latency, user, system, spin, idle) in rows {
            let attrs = attr_stmt
                .query_map(params![id, position], |r| {
                    let kind: String = r.get(1)?;
                    Ok((r.get::<_, String>(0)?, attr_text(&kind, r.get(2)?)))
                })
                .map_err(|e| self.err(e))?
                .collect::<Result<_, _>>()
                .map_err(|e| self.err(e))?;
            let latency: Option<LatencyHistogram> = match latency {
                Some(text) => Some(serde_json::from_str(&text).map_err(|e| bad("latency", e))?),
                None => None,
            };
            let cpu = match (user, system, spin, idle) {
                (Some(u), Some(s), Some(p), Some(i)) => Some(CpuBreakdown {
                    user_ns: u as u64,
                    system_ns: s as u64,
                    spin_ns: p as u64,
                    idle_ns: i as u64,
                }),
                _ => None,
            };
            let metrics = metric_stmt
                .query_map(params![id, position], |r| {
                    Ok(Metric::new(
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get(2)?,
                    ))
                })
                .map_err(|e| self.err(e))?
                .collect::<Result<_, _>>()
                .map_err(|e| self.err(e))?;
            out.push(Measurement {
                config,
                attrs,
                metrics,
                latency,
                cpu,
            });
        }
        Ok(out)
    }

    /// Removes runs `ids` in one transaction (all or none); their figures, effects and
    /// measurements go with them. Their ids are not given to later runs.
    pub fn remove_all(&mut self, ids: &[i64]) -> Result<(), DbError> {
        let path = self.path.clone();
        let e = |e| classify(&path, e);
        let tx = self.conn.transaction().map_err(e)?;
        for &id in ids {
            let n = tx
                .execute("DELETE FROM runs WHERE id = ?1", [id])
                .map_err(e)?;
            if n == 0 {
                return Err(DbError::NoSuchRun {
                    path: self.path.clone(),
                    id,
                });
            }
        }
        tx.commit().map_err(e)?;
        Ok(())
    }
}

/// Writes one run with its figures, effects and measurements (inside the caller's
/// transaction); returns its id.
fn insert_run(tx: &rusqlite::Transaction<'_>, run: &NewRun<'_>) -> Result<i64, rusqlite::Error> {
    let r = run.report;
    tx.execute(
        "INSERT INTO runs (kind, experiment, scenario_origin, scenario_text, seed, runs,
                           iolab_version, started_at, finished_at, group_id, label)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
            run.group_id,
            run.label,
        ],
    )?;
    let id = tx.last_insert_rowid();
    insert_measurements(tx, id, &r.measurements)?;
    {
        let mut fig = tx.prepare(
            "INSERT INTO figures (run_id, id, unit, published, lab, role)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for f in &r.figures {
            fig.execute(params![
                id,
                f.id,
                f.unit,
                f.published,
                f.lab,
                f.role.to_string()
            ])?;
        }
        pause_for_kill_test();
        let mut eff = tx.prepare(
            "INSERT INTO effects (run_id, id, published_pct, lab_pct)
                 VALUES (?1, ?2, ?3, ?4)",
        )?;
        for x in &r.effects {
            eff.execute(params![id, x.id, x.published_pct, x.lab_pct])?;
        }
    }
    Ok(id)
}

/// Writes `measurements` of run `run_id` (inside the caller's transaction).
fn insert_measurements(
    tx: &rusqlite::Transaction<'_>,
    run_id: i64,
    measurements: &[Measurement],
) -> Result<(), rusqlite::Error> {
    let mut m_stmt = tx.prepare(
        "INSERT INTO measurements (run_id, position, config, latency, cpu_user_ns,
                                   cpu_system_ns, cpu_spin_ns, cpu_idle_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut a_stmt = tx.prepare(
        "INSERT INTO attrs (run_id, position, key, kind, value) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let mut v_stmt = tx.prepare(
        "INSERT INTO metrics (run_id, position, name, unit, value) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (position, m) in measurements.iter().enumerate() {
        let cpu = m.cpu.map(|c| {
            [c.user_ns, c.system_ns, c.spin_ns, c.idle_ns]
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
        });
        m_stmt.execute(params![
            run_id,
            position as i64,
            m.config,
            m.latency.as_ref().map(json_text).transpose()?,
            cpu.map(|c| c[0]),
            cpu.map(|c| c[1]),
            cpu.map(|c| c[2]),
            cpu.map(|c| c[3]),
        ])?;
        for (k, v) in &m.attrs {
            let (kind, value) = typed_attr(k, v);
            a_stmt.execute(params![run_id, position as i64, k, kind, value])?;
        }
        for metric in &m.metrics {
            v_stmt.execute(params![
                run_id,
                position as i64,
                metric.name,
                metric.unit,
                metric.value
            ])?;
        }
    }
    Ok(())
}

/// JSON text of a column value. Maps of strings and histograms of integers always
/// serialise, so this cannot fail for the types stored here.
fn json_text<T: Serialize>(value: &T) -> Result<String, rusqlite::Error> {
    serde_json::to_string(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

// ---- sweeps (`iolab sweep`, `iolab db merge`) ----

/// Where a run sits in a sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPoint {
    /// The sweep's id: a hash of its grid, equal on every machine running a shard of it.
    pub sweep_id: String,
    /// The sweep's name (the grid's `name`, or its file stem).
    pub sweep_name: String,
    /// The point's index in the grid's fixed enumeration order.
    pub point: u64,
    /// How many points the whole grid has.
    pub points: u64,
    /// The point's axis values, as a JSON object from field path to value.
    pub axes_json: String,
}

impl ResultsDb {
    /// Stores one sweep point's run and its place in the sweep in a single transaction.
    pub fn store_sweep_point(
        &mut self,
        run: &NewRun<'_>,
        point: &SweepPoint,
    ) -> Result<i64, DbError> {
        self.store_with(run, |tx, id| {
            tx.execute(
                "INSERT INTO sweep_points (run_id, sweep_id, sweep_name, point, points, axes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    id,
                    point.sweep_id,
                    point.sweep_name,
                    point.point as i64,
                    point.points as i64,
                    point.axes_json
                ],
            )
            .map(|_| ())
        })
    }

    /// The open connection, for `iolab db merge` (which copies rows generically).
    pub(crate) fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

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

/// Splits SQLite failures into "not a database" (bad input) and everything else (I/O).
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
            measurements: vec![
                Measurement::new("nvme.strict")
                    .attr("iommu_mode", "strict")
                    .attr("iodepth", 32)
                    .metric(Metric::new("read.iops", "IOPS", 1.5e5))
                    .metric(Metric::new("read.clat_mean_ns", "ns", 210_000.25))
                    .latency(LatencyHistogram::from_samples(&[9_000, 11_000, 250_000]))
                    .cpu(CpuBreakdown {
                        user_ns: 1,
                        system_ns: 2,
                        spin_ns: 3,
                        idle_ns: 1 << 50,
                    }),
                Measurement::new("nvme.off").attr("iommu_mode", "off"),
            ],
        }
    }

    fn store(db: &mut ResultsDb, r: &ExperimentReport) -> i64 {
        db.store(&NewRun {
            kind: "lab",
            group_id: None,
            label: None,
            scenario_origin: Some("scenarios/experiments/sba-vmerge.toml (bundled)"),
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
                kind: "lab".to_owned(),
                group_id: None,
                label: None,
                measurements: 2,
            }]
        );
        let run = db.show(id).unwrap();
        assert_eq!(run.kind, "lab");
        assert_eq!(run.measurements, r.measurements);
        assert_eq!(run.finished_at, "2023-11-14T22:13:21Z");
        assert_eq!(run.iolab_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            run.scenario_origin.as_deref(),
            Some("scenarios/experiments/sba-vmerge.toml (bundled)")
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
        db.remove_all(&[a]).unwrap();
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
        let err = db.remove_all(&[a]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn ids_are_not_reused_after_the_newest_run_is_removed() {
        let path = temp_path("noreuse");
        let mut db = ResultsDb::open(&path).unwrap();
        let r = report();
        let a = store(&mut db, &r);
        let b = store(&mut db, &r);
        db.remove_all(&[b]).unwrap();
        let c = store(&mut db, &r);
        assert!(c > b, "run {c} after removing run {b} (run {a} kept)");
        drop(db);
        // Still so after reopening.
        let mut db = ResultsDb::open(&path).unwrap();
        db.remove_all(&[a, c]).unwrap();
        let d = store(&mut db, &r);
        assert!(d > c, "run {d} after removing runs {a} and {c}");
    }

    #[test]
    fn a_v3_database_keeps_its_runs_and_children_and_stops_reusing_ids() {
        let path = temp_path("v3");
        {
            let conn = Connection::open(&path).unwrap();
            for m in &MIGRATIONS[..3] {
                conn.execute_batch(m).unwrap();
            }
            conn.pragma_update(None, "application_id", APPLICATION_ID)
                .unwrap();
            conn.pragma_update(None, "user_version", 3).unwrap();
            for _ in 0..2 {
                conn.execute(
                    "INSERT INTO runs (kind, experiment, seed, runs, iolab_version, started_at,
                                       finished_at, group_id)
                     VALUES ('lab', 'sba-vmerge', 7, 1, '0.1.0', 'a', 'b', 1)",
                    [],
                )
                .unwrap();
            }
            conn.execute(
                "INSERT INTO figures (run_id, id, unit, lab, role) VALUES (2, 'f', 'x', 2.0, 'prediction')",
                [],
            )
            .unwrap();
        }
        let mut db = ResultsDb::open(&path).unwrap();
        assert_eq!(db.group_members(1).unwrap(), vec![1, 2]);
        assert_eq!(db.show(2).unwrap().figures.len(), 1);
        // Foreign keys still cascade to the children after the rebuild.
        db.remove_all(&[2]).unwrap();
        let figures: i64 = db
            .conn
            .query_row("SELECT count(*) FROM figures", [], |r| r.get(0))
            .unwrap();
        assert_eq!(figures, 0);
        assert_eq!(store(&mut db, &report()), 3);
    }

    #[test]
    fn attributes_are_stored_in_their_type_and_read_back_as_text() {
        use rusqlite::types::Value as Sql;
        assert_eq!(typed_attr("iodepth", "8"), ("integer", Sql::Integer(8)));
        assert_eq!(typed_attr("bs", "4k"), ("integer", Sql::Integer(4096)));
        assert_eq!(typed_attr("virt_merge", "true"), ("bool", Sql::Integer(1)));
        assert_eq!(typed_attr("x", "2.5"), ("real", Sql::Real(2.5)));
        assert_eq!(
            typed_attr("iommu_mode", "none"),
            ("text", Sql::Text("off".into()))
        );
        // A seed beyond i64 stays exact, as text.
        let big = u64::MAX.to_string();
        assert_eq!(typed_attr("seed", &big), ("text", Sql::Text(big.clone())));
        assert_eq!(attr_text("bool", Sql::Integer(0)), "false");
        assert_eq!(attr_text("integer", Sql::Integer(4096)), "4096");
        assert_eq!(attr_text("real", Sql::Real(2.5)), "2.5");
        assert_eq!(attr_text("text", Sql::Text(big.clone())), big);
    }

    #[test]
    fn a_v1_database_is_migrated_with_its_runs_kept() {
        let path = temp_path("v1");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "application_id", APPLICATION_ID)
                .unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute(
                "INSERT INTO runs (kind, experiment, seed, runs, iolab_version, started_at,
                                   finished_at)
                 VALUES ('lab', 'sba-vmerge', 7, 1, '0.1.0', 'a', 'b')",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO figures (run_id, id, unit, lab, role) VALUES (1, 'f', 'x', 2.0, 'prediction')",
                [],
            )
            .unwrap();
        }
        let mut db = ResultsDb::open(&path).unwrap();
        let version: i64 = db
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let old = db.show(1).unwrap();
        assert_eq!((old.seed, old.figures.len()), (7, 1));
        assert!(old.measurements.is_empty() && old.group_id.is_none());
        let id = store(&mut db, &report());
        assert_eq!(db.measurements(id).unwrap().len(), 2);
    }

    #[test]
    fn a_group_is_stored_together_and_found_by_its_first_id() {
        let path = temp_path("group");
        let mut db = ResultsDb::open(&path).unwrap();
        let r = report();
        let solo = store(&mut db, &r);
        let run = |label| NewRun {
            kind: "import:bonnie",
            group_id: Some(999), // ignored: the group is the first run's id
            label: Some(label),
            scenario_origin: None,
            scenario_text: None,
            seed: 0,
            started_at: UNIX_EPOCH,
            finished_at: UNIX_EPOCH,
            report: &r,
        };
        let ids = db.store_group(&[run("x"), run("y"), run("z")]).unwrap();
        assert_eq!(ids, [solo + 1, solo + 2, solo + 3]);
        assert_eq!(db.group_members(ids[0]).unwrap(), ids);
        for id in &ids {
            assert_eq!(db.show(*id).unwrap().group_id, Some(ids[0]));
        }
        assert!(db.show(solo).unwrap().group_id.is_none());
        // A one-run group is no group.
        let one = db.store_group(&[run("w")]).unwrap();
        assert_eq!(db.show(one[0]).unwrap().group_id, None);
        let err = db.group_members(solo).unwrap_err();
        assert!(matches!(err, DbError::NoSuchGroup { group_id, .. } if group_id == solo));
        assert_eq!(err.exit_code(), 2);
        // A repetition series: the first run starts the group, the rest join it.
        let first = db.store_group_start(&run("a")).unwrap();
        let second = db
            .store(&NewRun {
                group_id: Some(first),
                ..run("b")
            })
            .unwrap();
        assert_eq!(db.group_members(first).unwrap(), [first, second]);
    }

    #[test]
    fn a_failing_group_store_leaves_nothing() {
        let path = temp_path("group-fail");
        let mut db = ResultsDb::open(&path).unwrap();
        let r = report();
        store(&mut db, &r);
        // Make the second insert fail: a trigger refusing runs labelled "bad".
        db.conn
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON runs WHEN NEW.label = 'bad'
                 BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
        let run = |label| NewRun {
            kind: "import:bonnie",
            group_id: None,
            label: Some(label),
            scenario_origin: None,
            scenario_text: None,
            seed: 0,
            started_at: UNIX_EPOCH,
            finished_at: UNIX_EPOCH,
            report: &r,
        };
        assert!(db.store_group(&[run("good"), run("bad")]).is_err());
        assert_eq!(db.list().unwrap().len(), 1, "the first row was rolled back");
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
