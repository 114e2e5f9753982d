//! Run selections as every command takes them (`runs show`, `runs rm`, `compare`,
//! `report`): a run id (`12`), a group of runs (`g12`, as `runs list` prints groups), a range
//! of run ids (`29-34`), a sweep's points (`sweep:NAME` or `sweep:ID`, as `iolab sweep`
//! prints them) or a comma list of any of these (`3,5,g12,29-34`).

use crate::db::{DbError, ResultsDb};

/// What a selection may hold, for messages.
pub const EXPECTED: &str =
    "expected a run id (12), a group (g12), a range of run ids (29-34), a sweep (sweep:NAME or sweep:ID) or a comma list of them (3,5,g12)";

/// One item of a selection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunRef {
    /// `12`: one run, which must exist.
    Run(i64),
    /// `g12`: every run of group 12.
    Group(i64),
    /// `29-34`: the stored runs with ids from 29 to 34 (at least one).
    Range(i64, i64),
    /// `sweep:NAME` or `sweep:ID`: every point of that sweep, in point order.
    Sweep(String),
}

/// A parsed selection: its items in the order written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSelection(pub Vec<RunRef>);

impl RunSelection {
    /// Parses `12`, `g12`, `29-34` or a comma list of them. Ids are positive.
    ///
    /// # Errors
    ///
    /// A message naming the text and the item at fault, with [`EXPECTED`].
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: String| format!("`{text}`: {EXPECTED}; {why}");
        let id = |s: &str| s.trim().parse::<i64>().ok().filter(|&i| i > 0);
        let mut items = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("it has an empty item".to_owned()));
            }
            let item =
                if let Some(key) = part.strip_prefix("sweep:") {
                    let key = key.trim();
                    if key.is_empty() {
                        return Err(bad("`sweep:` needs a sweep's name or id".to_owned()));
                    }
                    RunRef::Sweep(key.to_owned())
                } else if let Some(g) = part.strip_prefix(['g', 'G']) {
                    RunRef::Group(id(g).ok_or_else(|| {
                        bad(format!("`{part}` is not g followed by a group number"))
                    })?)
                } else if let Some((lo, hi)) = part.split_once('-') {
                    let (Some(lo), Some(hi)) = (id(lo), id(hi)) else {
                        return Err(bad(format!("`{part}` is not a range of two run ids")));
                    };
                    if lo > hi {
                        return Err(bad(format!("range `{part}` runs backwards")));
                    }
                    RunRef::Range(lo, hi)
                } else {
                    RunRef::Run(id(part).ok_or_else(|| bad(format!("`{part}` is not one")))?)
                };
            items.push(item);
        }
        Ok(RunSelection(items))
    }

    /// Whether the selection is one plain run id (`12`).
    pub fn is_single_run(&self) -> bool {
        matches!(self.0.as_slice(), [RunRef::Run(_)])
    }

    /// The run ids selected, in the order written, each once.
    ///
    /// # Errors
    ///
    /// [`DbError::NoSuchRun`], [`DbError::NoSuchGroup`] or [`DbError::NoRunInRange`] for an
    /// item that selects nothing; the database's own errors.
    pub fn resolve(&self, db: &ResultsDb) -> Result<Vec<i64>, DbError> {
        let mut ids = Vec::new();
        for item in &self.0 {
            let found = match item {
                RunRef::Sweep(key) => db.sweep_runs(key)?,
                _ => Vec::new(),
            };
            let found = match *item {
                RunRef::Sweep(_) => found,
                RunRef::Run(id) => {
                    if !db.has_run(id)? {
                        return Err(DbError::NoSuchRun {
                            path: db.path().to_owned(),
                            id,
                        });
                    }
                    vec![id]
                }
                RunRef::Group(g) => db.group_members(g)?,
                RunRef::Range(lo, hi) => db.runs_between(lo, hi)?,
            };
            for id in found {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_groups_ranges_and_lists_parse() {
        use RunRef::*;
        assert_eq!(RunSelection::parse("12"), Ok(RunSelection(vec![Run(12)])));
        assert_eq!(RunSelection::parse("g7"), Ok(RunSelection(vec![Group(7)])));
        assert_eq!(RunSelection::parse("G7"), Ok(RunSelection(vec![Group(7)])));
        assert_eq!(
            RunSelection::parse("29-34"),
            Ok(RunSelection(vec![Range(29, 34)]))
        );
        assert_eq!(
            RunSelection::parse("3, 5,g12,29-34"),
            Ok(RunSelection(vec![Run(3), Run(5), Group(12), Range(29, 34)]))
        );
        assert!(RunSelection::parse("12").unwrap().is_single_run());
        assert!(!RunSelection::parse("12,13").unwrap().is_single_run());
        assert!(!RunSelection::parse("g12").unwrap().is_single_run());
        assert_eq!(
            RunSelection::parse("sweep:grid,4"),
            Ok(RunSelection(vec![Sweep("grid".into()), Run(4)]))
        );
        assert!(RunSelection::parse("sweep:").is_err());
    }

    #[test]
    fn bad_selections_say_which_item_and_what_was_expected() {
        for (text, says) in [
            ("", "empty item"),
            ("1,", "empty item"),
            ("x", "`x` is not one"),
            ("0", "`0` is not one"),
            ("-3", "`-3` is not a range"),
            ("gx", "`gx` is not g followed by a group number"),
            ("g", "not g followed by a group number"),
            ("34-29", "range `34-29` runs backwards"),
            ("3-", "`3-` is not a range"),
            ("1-2-3", "`1-2-3` is not a range"),
        ] {
            let e = RunSelection::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
            assert!(e.contains(EXPECTED), "{text}: {e}");
        }
    }
}
