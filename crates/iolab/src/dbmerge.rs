//! `iolab db merge OUT IN...`: join results databases (typically the shards of one sweep).
//!
//! Every input is opened read-only and must be an iolab results database with exactly the
//! schema version this iolab writes (an older one is upgraded by opening it once with any
//! iolab command, e.g. `iolab --db IN runs list`; a newer one needs a newer iolab). The copy
//! is generic: `runs` rows get new ids in OUT, and every row of every other table that refers
//! to a run by a `run_id` column follows its run, so tables added by later schema versions
//! come along without changes here. A table this scheme cannot renumber (one that refers to
//! anything but `runs`) is refused rather than silently dropped.
//!
//! `runs.group_id` (a run group named by its first run's id) is renumbered with the runs.
//!
//! A run that is a sweep point whose sweep id and point index are already in OUT (or earlier
//! in the inputs) is a duplicate and is skipped, with everything hanging off it. All writes
//! happen in one transaction: on any failure OUT is left as it was (and removed, if the
//! merge created it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, OpenFlags};

use crate::db::{DbError, ResultsDb, APPLICATION_ID, SCHEMA_VERSION};

/// Why a merge failed; every variant names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// An input is missing, unreadable, or not an iolab results database.
    #[error("{}: {problem}", path.display())]
    BadInput {
        /// The input.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The output database could not be opened or written.
    #[error(transparent)]
    Db(#[from] DbError),
    /// SQLite failed while reading an input or writing the output.
    #[error("{}: {source}", path.display())]
    Sql {
        /// The file being read or written.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
}

impl MergeError {
    /// 2 for bad input, 1 for I/O failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            MergeError::BadInput { .. } => 2,
            MergeError::Db(e) => e.exit_code(),
            MergeError::Sql { .. } => 1,
        }
    }
}

/// What a merge did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MergeSummary {
    /// Runs copied into OUT.
    pub copied: u64,
    /// Runs skipped as duplicate sweep points.
    pub duplicates: u64,
}

/// A table's shape: its columns, and which of them to copy.
#[derive(Debug, Clone)]
struct TableShape {
    name: String,
    /// Columns copied as they are (everything but `run_id` and an integer primary key).
    columns: Vec<String>,
}

/// One input, read into memory.
struct InputData {
    /// `runs` rows: old id and the other columns' values.
    runs: Vec<(i64, Vec<Value>)>,
    /// Per old run id: rows of other tables, `(table index, values)`.
    children: BTreeMap<i64, Vec<(usize, Vec<Value>)>>,
    /// Per old run id: its sweep id and point, if it is a sweep point.
    sweep_keys: BTreeMap<i64, (String, i64)>,
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> MergeError + '_ {
    move |source| MergeError::Sql {
        path: path.to_owned(),
        source,
    }
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The shapes of the tables to copy, sorted by name, `runs` first; refuses unknown shapes.
fn shapes(conn: &Connection, path: &Path) -> Result<Vec<TableShape>, MergeError> {
    let e = sql(path);
    let mut names: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        .map_err(&e)?
        .query_map([], |r| r.get(0))
        .map_err(&e)?
        .collect::<Result<_, _>>()
        .map_err(&e)?;
    names.sort_by_key(|n| (n != "runs", n.clone()));
    let mut out = Vec::new();
    for name in names {
        // (name, declared type, pk position)
        let cols: Vec<(String, String, i64)> = conn
            .prepare(&format!("PRAGMA table_info({})", quote(&name)))
            .map_err(&e)?
            .query_map([], |r| Ok((r.get(1)?, r.get(2)?, r.get(5)?)))
            .map_err(&e)?
            .collect::<Result<_, _>>()
            .map_err(&e)?;
        let refs: Vec<String> = conn
            .prepare(&format!("PRAGMA foreign_key_list({})", quote(&name)))
            .map_err(&e)?
            .query_map([], |r| r.get(2))
            .map_err(&e)?
            .collect::<Result<_, _>>()
            .map_err(&e)?;
        let unknown = |why: &str| MergeError::BadInput {
            path: path.to_owned(),
            problem: format!("table `{name}` {why}, so merge cannot renumber it"),
        };
        if let Some(other) = refs.iter().find(|t| *t != "runs") {
            return Err(unknown(&format!("refers to table `{other}`")));
        }
        let is_runs = name == "runs";
        if !is_runs && !cols.iter().any(|c| c.0 == "run_id") {
            return Err(unknown("has no `run_id` column"));
        }
        // A lone INTEGER PRIMARY KEY is the rowid: renumbered, not copied. A column of a
        // composite key (e.g. `measurements (run_id, position)`) is data.
        let key_columns = cols.iter().filter(|c| c.2 > 0).count();
        let int_pk = |c: &(String, String, i64)| {
            key_columns == 1 && c.2 > 0 && c.1.eq_ignore_ascii_case("INTEGER")
        };
        let columns = cols
            .iter()
            .filter(|c| c.0 != "run_id" && !int_pk(c))
            .map(|c| c.0.clone())
            .collect();
        if is_runs && !cols.iter().any(|c| c.0 == "id" && int_pk(c)) {
            return Err(unknown("has no integer `id` key"));
        }
        out.push(TableShape { name, columns });
    }
    if out.first().map(|t| t.name.as_str()) != Some("runs") {
        return Err(MergeError::BadInput {
            path: path.to_owned(),
            problem: "has no `runs` table".to_owned(),
        });
    }
    Ok(out)
}

/// Opens an input read-only and checks it is an iolab database of this schema version.
fn open_input(path: &Path) -> Result<Connection, MergeError> {
    let bad = |problem: String| MergeError::BadInput {
        path: path.to_owned(),
        problem,
    };
    if !path.exists() {
        return Err(DbError::Missing {
            path: path.to_owned(),
        }
        .into());
    }
    if !path.is_file() {
        return Err(bad("not a file".to_owned()));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| bad(format!("cannot open it: {e}")))?;
    let app_id: i64 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(|e| bad(format!("not a SQLite database ({e})")))?;
    if app_id != APPLICATION_ID {
        return Err(bad("not an iolab results database".to_owned()));
    }
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(unreadable(path))?;
    if version != SCHEMA_VERSION {
        let hint = if version < SCHEMA_VERSION {
            format!(
                "open it once with this iolab to upgrade it (`iolab --db {} runs list`)",
                path.display()
            )
        } else {
            "use a newer iolab".to_owned()
        };
        return Err(bad(format!(
            "schema version {version}, but this iolab writes version {SCHEMA_VERSION}: {hint}"
        )));
    }
    Ok(conn)
}

/// A read failure of an input is bad input (a truncated or damaged file), exit code 2.
fn unreadable(path: &Path) -> impl Fn(rusqlite::Error) -> MergeError + '_ {
    move |e| MergeError::BadInput {
        path: path.to_owned(),
        problem: format!("cannot read it: {e}"),
    }
}

fn read_input(
    conn: &Connection,
    path: &Path,
    shapes: &[TableShape],
) -> Result<InputData, MergeError> {
    let e = unreadable(path);
    let mut data = InputData {
        runs: Vec::new(),
        children: BTreeMap::new(),
        sweep_keys: BTreeMap::new(),
    };
    for (ti, t) in shapes.iter().enumerate() {
        let key = if ti == 0 { "id" } else { "run_id" };
        let cols: Vec<String> = std::iter::once(quote(key))
            .chain(t.columns.iter().map(|c| quote(c)))
            .collect();
        let q = format!(
            "SELECT {} FROM {} ORDER BY rowid",
            cols.join(", "),
            quote(&t.name)
        );
        let mut stmt = conn.prepare(&q).map_err(&e)?;
        let n = cols.len();
        let rows = stmt
            .query_map([], |r| {
                let id: i64 = r.get(0)?;
                let vals = (1..n)
                    .map(|i| r.get::<_, Value>(i))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((id, vals))
            })
            .map_err(&e)?;
        for row in rows {
            let (id, vals) = row.map_err(&e)?;
            if ti == 0 {
                data.runs.push((id, vals));
            } else {
                data.children.entry(id).or_default().push((ti, vals));
            }
        }
    }
    if shapes.iter().any(|t| t.name == "sweep_points") {
        let mut stmt = conn
            .prepare("SELECT run_id, sweep_id, point FROM sweep_points")
            .map_err(&e)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .map_err(&e)?;
        for row in rows {
            let (run, sweep, point) = row.map_err(&e)?;
            data.sweep_keys.insert(run, (sweep, point));
        }
    }
    Ok(data)
}

/// Merges `inputs` into `out`; see the module docs.
pub fn merge(out: &Path, inputs: &[PathBuf]) -> Result<MergeSummary, MergeError> {
    let out_canon = out.canonicalize().ok();
    let mut read = Vec::new();
    for path in inputs {
        if out_canon.is_some() && path.canonicalize().ok() == out_canon {
            return Err(MergeError::BadInput {
                path: path.clone(),
                problem: "is the output database itself".to_owned(),
            });
        }
        let conn = open_input(path)?;
        // Any read failure of an input (a truncated or damaged file) is bad input.
        let sh = shapes(&conn, path).map_err(|e| match e {
            MergeError::Sql { path, source } => MergeError::BadInput {
                path,
                problem: format!("cannot read it: {source}"),
            },
            other => other,
        })?;
        let data = read_input(&conn, path, &sh)?;
        read.push((path, sh, data));
    }
    let created = !out.exists();
    let result = write(out, &read);
    if result.is_err() && created {
        // The merge made this file; a failed merge leaves nothing behind.
        let _ = std::fs::remove_file(out);
    }
    result
}

fn write(
    out: &Path,
    read: &[(&PathBuf, Vec<TableShape>, InputData)],
) -> Result<MergeSummary, MergeError> {
    let mut db = ResultsDb::open(out)?;
    let conn = db.connection_mut();
    let out_shapes = shapes(conn, out)?;
    let e = sql(out);
    let tx = conn.transaction().map_err(&e)?;
    let mut seen: BTreeSet<(String, i64)> = BTreeSet::new();
    {
        let mut stmt = tx
            .prepare("SELECT sweep_id, point FROM sweep_points")
            .map_err(&e)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(&e)?;
        for row in rows {
            seen.insert(row.map_err(&e)?);
        }
    }
    let mut summary = MergeSummary::default();
    for (path, shapes, data) in read {
        // The same schema version implies the same tables; check anyway, naming the file.
        for t in shapes.iter() {
            let same = out_shapes
                .iter()
                .any(|o| o.name == t.name && o.columns == t.columns);
            if !same {
                return Err(MergeError::BadInput {
                    path: (*path).clone(),
                    problem: format!("table `{}` differs from {}'s", t.name, out.display()),
                });
            }
        }
        let inserts: Vec<String> = shapes
            .iter()
            .enumerate()
            .map(|(ti, t)| {
                let mut cols: Vec<String> = t.columns.iter().map(|c| quote(c)).collect();
                if ti > 0 {
                    cols.insert(0, quote("run_id"));
                }
                let marks = vec!["?"; cols.len()].join(", ");
                format!(
                    "INSERT INTO {} ({}) VALUES ({marks})",
                    quote(&t.name),
                    cols.join(", ")
                )
            })
            .collect();
        // `runs.group_id` names a run (the group's first) without a declared foreign key:
        // renumber it with the runs, keeping each group together.
        let group_col = shapes[0].columns.iter().position(|c| c == "group_id");
        let mut new_ids: BTreeMap<i64, i64> = BTreeMap::new();
        let mut new_groups: BTreeMap<i64, i64> = BTreeMap::new();
        for (old_id, vals) in &data.runs {
            if let Some(key) = data.sweep_keys.get(old_id) {
                if !seen.insert(key.clone()) {
                    summary.duplicates += 1;
                    continue;
                }
            }
            let old_group = group_col.and_then(|i| match vals[i] {
                Value::Integer(g) => Some(g),
                _ => None,
            });
            let mut vals = vals.clone();
            if let (Some(i), Some(g)) = (group_col, old_group) {
                // The group's new id is known once its first copied run is in.
                if let Some(&ng) = new_groups.get(&g).or_else(|| new_ids.get(&g)) {
                    vals[i] = Value::Integer(ng);
                } else {
                    vals[i] = Value::Null; // set to this run's own new id below
                }
            }
            tx.execute(&inserts[0], params_from_iter(vals.iter()))
                .map_err(&e)?;
            let new_id = tx.last_insert_rowid();
            new_ids.insert(*old_id, new_id);
            if let (Some(_), Some(g)) = (group_col, old_group) {
                let ng = *new_groups
                    .entry(g)
                    .or_insert(new_ids.get(&g).copied().unwrap_or(new_id));
                tx.execute(
                    "UPDATE runs SET group_id = ?1 WHERE id = ?2",
                    rusqlite::params![ng, new_id],
                )
                .map_err(&e)?;
            }
            for (ti, row) in data.children.get(old_id).map_or(&[][..], Vec::as_slice) {
                let params = std::iter::once(Value::Integer(new_id)).chain(row.iter().cloned());
                tx.execute(&inserts[*ti], params_from_iter(params))
                    .map_err(&e)?;
            }
            summary.copied += 1;
        }
    }
    tx.commit().map_err(&e)?;
    Ok(summary)
}

/// `iolab db merge`: merges and reports, or prints the error and picks the exit code.
pub fn run(out: &Path, inputs: &[PathBuf]) -> ExitCode {
    match merge(out, inputs) {
        Ok(s) => {
            eprintln!(
                "merged {} runs from {} databases into {} ({} duplicate sweep points skipped)",
                s.copied,
                inputs.len(),
                out.display(),
                s.duplicates
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iolab db merge: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
