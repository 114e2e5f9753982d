//! The experiment file (docs/EXPERIMENTS.md): its schema and the checks made before any
//! cell runs.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::experiment::Role;
use crate::tomlfile::{InputError, TomlDoc};

/// An experiment file as written (docs/EXPERIMENTS.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    /// The experiment's name.
    pub experiment: String,
    /// One line saying what is re-run.
    pub title: String,
    /// An optional second line (what the published runs were).
    #[serde(default)]
    pub summary: Option<String>,
    /// Repetitions per cell (default 1; the caller's `runs` overrides it when above 1).
    #[serde(default)]
    pub runs: Option<u32>,
    /// A complete lab workload scenario (docs/SCENARIOS.md).
    pub base: toml::Table,
    /// Configurations; a cell is a row x a column.
    #[serde(default)]
    pub columns: Vec<ColumnSpec>,
    /// The rows.
    pub rows: Vec<RowSpec>,
    /// Declared calibrations.
    #[serde(default)]
    pub calibrations: Vec<CalibrationSpec>,
    /// Figures: lab metrics of cells, with published values.
    #[serde(default)]
    pub figures: Vec<FigureSpec>,
    /// Effects: percent changes between two figures.
    #[serde(default)]
    pub effects: Vec<EffectSpec>,
    /// How the report is printed.
    #[serde(default)]
    pub report: ReportSpec,
}

/// A configuration (a column of the experiment's table).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    /// Id, the second half of a cell id.
    pub id: String,
    /// Heading in the report (default: the id).
    #[serde(default)]
    pub label: Option<String>,
    /// Fields merged into the scenario.
    #[serde(default)]
    pub set: toml::Table,
    /// Dotted paths removed from the scenario after `set`.
    #[serde(default)]
    pub unset: Vec<String>,
}

/// A row of the experiment's table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowSpec {
    /// Id, the first half of a cell id.
    pub id: String,
    /// Label in the report (default: the id).
    #[serde(default)]
    pub label: Option<String>,
    /// The columns this row runs (default: all).
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    /// Fields merged into the scenario.
    #[serde(default)]
    pub set: toml::Table,
    /// Dotted paths removed from the scenario after `set`.
    #[serde(default)]
    pub unset: Vec<String>,
}

/// A declared calibration: one parameter fitted against published figures. Either a
/// declared unknown (`range`: the tool fits it, `iolab reproduce --refit`, and keeps the
/// value in the file's lock file beside it) or a given `value` (a value taken over as
/// published, or one that is not a number, such as a workfile's name).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationSpec {
    /// A lab scenario field (dotted path), or
    #[serde(default)]
    pub field: Option<String>,
    /// a profile cost path (`iommu.cmdq.sync_latency`), applied as `machine.costs`.
    #[serde(default)]
    pub cost: Option<String>,
    /// The value, when given rather than fitted.
    #[serde(default)]
    pub value: Option<toml::Value>,
    /// The plausible range `[lo, hi]` of a declared unknown, which the tool fits; `source`
    /// says where the range comes from.
    #[serde(default)]
    pub range: Option<[f64; 2]>,
    /// For a cost: `ns` or `cycles` (default: the profile's unit for that cost).
    #[serde(default)]
    pub unit: Option<String>,
    /// Only cells on these platforms.
    #[serde(default)]
    pub platforms: Option<Vec<String>>,
    /// Only cells of these rows.
    #[serde(default)]
    pub rows: Option<Vec<String>>,
    /// Only these cells.
    #[serde(default)]
    pub cells: Option<Vec<String>>,
    /// The figures it was fitted to (each with `role = "calibration"`), or effects (the
    /// published change between two calibration figures).
    pub fitted_to: Vec<String>,
    /// How it was fitted, with its source; for a declared unknown, the range's source.
    pub source: String,
}

impl CalibrationSpec {
    /// The parameter's name as reported: the field, or the cost path with the platforms; a
    /// value that is not a number (a workfile's name) is written into it, as `field = "x"`.
    pub fn parameter(&self) -> String {
        let mut base = self
            .field
            .clone()
            .or_else(|| self.cost.clone())
            .unwrap_or_default();
        if let Some(v) = self
            .value
            .as_ref()
            .filter(|_| self.numeric_value().is_nan())
        {
            base = format!("{base} = {v}");
        }
        match &self.platforms {
            Some(p) => format!("{base} ({})", p.join(", ")),
            None => base,
        }
    }

    /// The given value as a number for the report (booleans as 0/1; text, and a declared
    /// unknown, have none).
    pub fn numeric_value(&self) -> f64 {
        match &self.value {
            Some(toml::Value::Integer(i)) => *i as f64,
            Some(toml::Value::Float(f)) => *f,
            Some(toml::Value::Boolean(b)) => f64::from(u8::from(*b)),
            _ => f64::NAN,
        }
    }

    /// Whether the tool fits it (a `range`, no `value`).
    pub fn is_unknown(&self) -> bool {
        self.range.is_some()
    }
}

/// A figure: a lab metric of one cell, with its published value.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FigureSpec {
    /// Id (default: the cell id).
    #[serde(default)]
    pub id: Option<String>,
    /// The cell.
    pub cell: String,
    /// The lab metric (mean over the repetitions).
    pub metric: String,
    /// A factor applied to the metric (unit conversions).
    #[serde(default)]
    pub scale: Option<f64>,
    /// Unit as printed.
    pub unit: String,
    /// The published value.
    #[serde(default)]
    pub published: Option<f64>,
    /// Or: the published value is a metric of a run stored in the results database (a
    /// real tool's output brought in by `iolab import`).
    #[serde(default)]
    pub published_from: Option<PublishedFrom>,
    /// Calibration point or prediction (default).
    #[serde(default)]
    pub role: Option<Role>,
}

/// Where a figure's published value is stored: a run in the results database.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedFrom {
    /// The stored run's id (`iolab runs list`).
    pub run: i64,
    /// The run's configuration holding the value (for a fio import, the job's name; default:
    /// the run's only configuration).
    #[serde(default)]
    pub config: Option<String>,
    /// The stored metric (default: the figure's own `metric`).
    #[serde(default)]
    pub metric: Option<String>,
}

impl FigureSpec {
    /// The figure's id.
    pub fn id(&self) -> &str {
        self.id.as_deref().unwrap_or(&self.cell)
    }
}

/// An effect: the percent change from one figure to another.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectSpec {
    /// Id.
    pub id: String,
    /// How the `percent-list` layout names it (default: the id).
    #[serde(default)]
    pub label: Option<String>,
    /// The figure changed from.
    pub base: String,
    /// The figure changed to.
    pub new: String,
    /// The published percent change.
    pub published_pct: f64,
}

/// How the report is printed.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// The layout's name (default `figures`).
    #[serde(default)]
    pub layout: Option<String>,
    /// A heading printed above the layout.
    #[serde(default)]
    pub heading: Option<String>,
    /// The metric of a `pivot` layout's cells.
    #[serde(default)]
    pub metric: Option<String>,
    /// Print each cell's own tool output after the layout.
    #[serde(default)]
    pub native: bool,
    /// Notes, with `{fig:ID}`, `{pub:ID}` and `{eff:ID}` placeholders.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Per-cell metric tables.
    #[serde(default)]
    pub tables: Vec<TableSpec>,
}

/// A table with one line per cell and one column per metric.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// The heading of the first column.
    pub heading: String,
    /// The columns.
    pub columns: Vec<TableColumn>,
}

/// A column of a metric table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableColumn {
    /// The lab metric.
    pub metric: String,
    /// The column's heading.
    pub header: String,
    /// A factor applied to the metric.
    #[serde(default)]
    pub scale: Option<f64>,
    /// Decimals printed (default: as figures are printed).
    #[serde(default)]
    pub decimals: Option<usize>,
    /// A column id: print the metric's percent change against the cell of the same row in
    /// that column (`vs = "off"`: each row against its own no-IOMMU cell) instead of its
    /// value.
    #[serde(default)]
    pub vs: Option<String>,
}

/// Layouts the report knows.
pub const LAYOUTS: [&str; 6] = [
    "figures",
    "tables",
    "pivot",
    "percent-list",
    "bonnie-csv",
    "reaim-table",
];

/// Cap on the cells of one experiment file (rows x the columns each runs): every cell's
/// scenario is built and validated before anything runs. A stated assumption: the
/// published tables the lab re-runs have tens of cells (smmuv3-cmdq: 7); 1024 leaves room
/// for a user's sweep-like table while bounding what a parse builds.
pub const MAX_CELLS: usize = 1024;

/// One cell: a row, and a column when the file has columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellRef {
    /// `ROW.COLUMN`, or `ROW`.
    pub id: String,
    /// Index into `rows`.
    pub row: usize,
    /// Index into `columns`.
    pub column: Option<usize>,
}

fn check_id(doc: &TomlDoc<'_>, path: &str, id: &str) -> Result<(), InputError> {
    let ok = !id.is_empty()
        && id.len() <= 100
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(doc.field_error(
            path,
            format!("expected 1-100 letters, digits, '-', '_' or '.', found \"{id}\""),
        ))
    }
}

fn unique<'s>(
    doc: &TomlDoc<'_>,
    table: &str,
    ids: impl Iterator<Item = &'s str>,
) -> Result<(), InputError> {
    let mut seen = BTreeSet::new();
    for (i, id) in ids.enumerate() {
        if !seen.insert(id) {
            return Err(doc.field_error(
                &format!("{table}[{i}].id"),
                format!("expected a unique id, \"{id}\" is used twice"),
            ));
        }
    }
    Ok(())
}

impl ExperimentFile {
    /// The cells in report order: row by row, each row's columns in the file's column order.
    pub fn cells(&self) -> Vec<CellRef> {
        let mut out = Vec::new();
        for (r, row) in self.rows.iter().enumerate() {
            if self.columns.is_empty() {
                out.push(CellRef {
                    id: row.id.clone(),
                    row: r,
                    column: None,
                });
                continue;
            }
            for (c, col) in self.columns.iter().enumerate() {
                let runs = row
                    .columns
                    .as_ref()
                    .map_or(true, |list| list.iter().any(|x| x == &col.id));
                if runs {
                    out.push(CellRef {
                        id: format!("{}.{}", row.id, col.id),
                        row: r,
                        column: Some(c),
                    });
                }
            }
        }
        out
    }

    /// The checks of the file's own structure (ids, references, roles, layout), before
    /// any cell's scenario is built.
    pub fn check(&self, doc: &TomlDoc<'_>) -> Result<(), InputError> {
        check_id(doc, "experiment", &self.experiment)?;
        if self.title.trim().is_empty() {
            return Err(doc.field_error("title", "expected a non-empty line"));
        }
        if let Some(r) = self.runs {
            if r == 0 || r > crate::lab::caps::MAX_RUNS {
                return Err(doc.field_error(
                    "runs",
                    format!(
                        "expected 1..={} (cap MAX_RUNS), got {r}",
                        crate::lab::caps::MAX_RUNS
                    ),
                ));
            }
        }
        if self.base.contains_key("seed") {
            return Err(doc.field_error(
                "base.seed",
                "the seed of every cell is the run's (`--seed`, default 1): remove it here",
            ));
        }
        if self.rows.is_empty() {
            return Err(doc.field_error("rows", "expected at least one [[rows]] table"));
        }
        for (i, c) in self.columns.iter().enumerate() {
            check_id(doc, &format!("columns[{i}].id"), &c.id)?;
            if c.set.contains_key("seed") {
                return Err(doc.field_error(
                    &format!("columns[{i}].set.seed"),
                    "the seed of every cell is the run's: remove it",
                ));
            }
        }
        for (i, r) in self.rows.iter().enumerate() {
            check_id(doc, &format!("rows[{i}].id"), &r.id)?;
            if r.set.contains_key("seed") {
                return Err(doc.field_error(
                    &format!("rows[{i}].set.seed"),
                    "the seed of every cell is the run's: remove it",
                ));
            }
            if let Some(list) = &r.columns {
                if self.columns.is_empty() {
                    return Err(doc.field_error(
                        &format!("rows[{i}].columns"),
                        "the file has no [[columns]] to choose from",
                    ));
                }
                for (k, c) in list.iter().enumerate() {
                    if !self.columns.iter().any(|x| &x.id == c) {
                        return Err(doc.field_error(
                            &format!("rows[{i}].columns[{k}]"),
                            format!(
                                "unknown column \"{c}\": expected one of {}",
                                self.column_ids()
                            ),
                        ));
                    }
                }
            }
        }
        unique(doc, "columns", self.columns.iter().map(|c| c.id.as_str()))?;
        unique(doc, "rows", self.rows.iter().map(|r| r.id.as_str()))?;
        let cells = self.cells();
        if cells.len() > MAX_CELLS {
            return Err(doc.field_error(
                "rows",
                format!(
                    "{} cells (rows x their columns): expected at most {MAX_CELLS} (cap MAX_CELLS)",
                    cells.len()
                ),
            ));
        }
        let cell_ids: Vec<&str> = cells.iter().map(|c| c.id.as_str()).collect();
        let known_cells = || cell_ids.join(", ");
        for (i, f) in self.figures.iter().enumerate() {
            if !cell_ids.contains(&f.cell.as_str()) {
                return Err(doc.field_error(
                    &format!("figures[{i}].cell"),
                    format!(
                        "unknown cell \"{}\": expected one of {}",
                        f.cell,
                        known_cells()
                    ),
                ));
            }
            if let Some(id) = &f.id {
                check_id(doc, &format!("figures[{i}].id"), id)?;
            }
            if let Some(s) = f.scale {
                if !s.is_finite() || s == 0.0 {
                    return Err(doc.field_error(
                        &format!("figures[{i}].scale"),
                        "expected a finite, non-zero factor",
                    ));
                }
            }
            if let Some(from) = &f.published_from {
                if f.published.is_some() {
                    return Err(doc.field_error(
                        &format!("figures[{i}].published_from"),
                        "expected either `published` or `published_from`, not both",
                    ));
                }
                if from.run < 1 {
                    return Err(doc.field_error(
                        &format!("figures[{i}].published_from.run"),
                        format!("expected a stored run id (1 or more), got {}", from.run),
                    ));
                }
            }
            if let Some(p) = f.published {
                if !p.is_finite() {
                    return Err(doc.field_error(
                        &format!("figures[{i}].published"),
                        "expected a finite number",
                    ));
                }
            }
        }
        let mut seen = BTreeSet::new();
        for (i, f) in self.figures.iter().enumerate() {
            if !seen.insert(f.id()) {
                return Err(doc.field_error(
                    &format!("figures[{i}].id"),
                    format!("expected a unique figure id, \"{}\" is used twice", f.id()),
                ));
            }
        }
        let figure = |id: &str| self.figures.iter().find(|f| f.id() == id);
        for (i, e) in self.effects.iter().enumerate() {
            check_id(doc, &format!("effects[{i}].id"), &e.id)?;
            for (field, id) in [("base", &e.base), ("new", &e.new)] {
                if figure(id).is_none() {
                    return Err(doc.field_error(
                        &format!("effects[{i}].{field}"),
                        format!("unknown figure \"{id}\": an effect compares two [[figures]]"),
                    ));
                }
            }
            if !e.published_pct.is_finite() {
                return Err(doc.field_error(
                    &format!("effects[{i}].published_pct"),
                    "expected a finite number",
                ));
            }
        }
        unique(doc, "effects", self.effects.iter().map(|e| e.id.as_str()))?;
        self.check_calibrations(doc, &cell_ids)?;
        self.check_report(doc)
    }

    fn column_ids(&self) -> String {
        self.columns
            .iter()
            .map(|c| format!("\"{}\"", c.id))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn check_calibrations(&self, doc: &TomlDoc<'_>, cell_ids: &[&str]) -> Result<(), InputError> {
        let mut fitted: BTreeSet<&str> = BTreeSet::new();
        for (i, c) in self.calibrations.iter().enumerate() {
            let at = |f: &str| format!("calibrations[{i}].{f}");
            match (&c.field, &c.cost) {
                (Some(_), None) | (None, Some(_)) => {}
                _ => {
                    return Err(doc.field_error(
                        &format!("calibrations[{i}]"),
                        "expected exactly one of `field` (a lab scenario field) or `cost` (a profile cost path)",
                    ))
                }
            }
            if let Some(f) = &c.field {
                crate::tomlpatch::parse_path(f).map_err(|e| doc.field_error(&at("field"), e))?;
            }
            if let Some(p) = &c.cost {
                if !crate::cost::PlatformProfile::cost_paths().contains(p) {
                    return Err(doc.field_error(
                        &at("cost"),
                        format!(
                            "unknown cost path \"{p}\": expected one of {}",
                            crate::cost::PlatformProfile::cost_paths().join(", ")
                        ),
                    ));
                }
                if c.value
                    .as_ref()
                    .is_some_and(|v| !v.is_integer() && !v.is_float())
                {
                    return Err(doc.field_error(&at("value"), "expected a number for a cost"));
                }
                if let Some(u) = &c.unit {
                    if u != "ns" && u != "cycles" {
                        return Err(doc.field_error(&at("unit"), "expected \"ns\" or \"cycles\""));
                    }
                }
            } else if c.unit.is_some() {
                return Err(doc.field_error(&at("unit"), "`unit` applies to a `cost` only"));
            }
            match (&c.value, &c.range) {
                (Some(_), None) => {}
                (None, Some([lo, hi])) => {
                    if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                        return Err(doc.field_error(
                            &at("range"),
                            format!("expected [LO, HI] with LO < HI, found [{lo}, {hi}]"),
                        ));
                    }
                }
                _ => {
                    return Err(doc.field_error(
                        &format!("calibrations[{i}]"),
                        "expected exactly one of `range` (a declared unknown the tool fits, `iolab reproduce --refit`) or `value` (a value given with its source)",
                    ))
                }
            }
            if c.source.trim().is_empty() {
                return Err(doc.field_error(
                    &at("source"),
                    "expected how the value was fitted, with its source",
                ));
            }
            if let Some(rows) = &c.rows {
                for (k, r) in rows.iter().enumerate() {
                    if !self.rows.iter().any(|x| &x.id == r) {
                        return Err(doc.field_error(
                            &format!("calibrations[{i}].rows[{k}]"),
                            format!("unknown row \"{r}\""),
                        ));
                    }
                }
            }
            if let Some(cells) = &c.cells {
                for (k, r) in cells.iter().enumerate() {
                    if !cell_ids.contains(&r.as_str()) {
                        return Err(doc.field_error(
                            &format!("calibrations[{i}].cells[{k}]"),
                            format!("unknown cell \"{r}\""),
                        ));
                    }
                }
            }
            if c.fitted_to.is_empty() {
                return Err(doc.field_error(
                    &at("fitted_to"),
                    "expected the figures the value was fitted to",
                ));
            }
            for (k, id) in c.fitted_to.iter().enumerate() {
                if let Some(e) = self.effects.iter().find(|e| &e.id == id) {
                    // An effect: its two figures are what was fitted.
                    for fig in [&e.base, &e.new] {
                        match self.figures.iter().find(|f| f.id() == fig) {
                            Some(f) if f.role == Some(Role::Calibration) => {
                                fitted.insert(f.id());
                            }
                            _ => {
                                return Err(doc.field_error(
                                    &format!("calibrations[{i}].fitted_to[{k}]"),
                                    format!(
                                        "effect \"{id}\" was fitted to, so its figure \"{fig}\" must say role = \"calibration\""
                                    ),
                                ))
                            }
                        }
                    }
                    continue;
                }
                match self.figures.iter().find(|f| f.id() == id) {
                    None => {
                        return Err(doc.field_error(
                            &format!("calibrations[{i}].fitted_to[{k}]"),
                            format!("unknown figure or effect \"{id}\""),
                        ))
                    }
                    Some(f) if f.role != Some(Role::Calibration) => {
                        return Err(doc.field_error(
                            &format!("calibrations[{i}].fitted_to[{k}]"),
                            format!(
                                "figure \"{id}\" was fitted to, so it must say role = \"calibration\" (it is not a prediction)"
                            ),
                        ))
                    }
                    Some(_) => {
                        fitted.insert(id.as_str());
                    }
                }
            }
        }
        for (i, f) in self.figures.iter().enumerate() {
            if f.role == Some(Role::Calibration) && !fitted.contains(f.id()) {
                return Err(doc.field_error(
                    &format!("figures[{i}].role"),
                    format!(
                        "figure \"{}\" says calibration, but no [[calibrations]] lists it in fitted_to",
                        f.id()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_report(&self, doc: &TomlDoc<'_>) -> Result<(), InputError> {
        let layout = self.report.layout.as_deref().unwrap_or("figures");
        if !LAYOUTS.contains(&layout) {
            let q: Vec<String> = LAYOUTS.iter().map(|l| format!("\"{l}\"")).collect();
            return Err(doc.field_error(
                "report.layout",
                format!(
                    "unknown layout \"{layout}\": expected one of {}",
                    q.join(", ")
                ),
            ));
        }
        if layout == "pivot" {
            if self.columns.is_empty() {
                return Err(doc.field_error(
                    "report.layout",
                    "a pivot needs [[columns]] (rows x columns)",
                ));
            }
            if self.report.metric.is_none() {
                return Err(
                    doc.field_error("report.metric", "a pivot needs the metric its cells show")
                );
            }
        }
        if layout == "tables" && self.report.tables.is_empty() {
            return Err(doc.field_error(
                "report.layout",
                "the tables layout prints [[report.tables]]: expected at least one",
            ));
        }
        for (t, table) in self.report.tables.iter().enumerate() {
            for (c, col) in table.columns.iter().enumerate() {
                if let Some(vs) = &col.vs {
                    if !self.columns.iter().any(|k| &k.id == vs) {
                        return Err(doc.field_error(
                            &format!("report.tables[{t}].columns[{c}].vs"),
                            format!(
                                "unknown column \"{vs}\": expected the id of one of [[columns]]"
                            ),
                        ));
                    }
                }
            }
        }
        for (i, n) in self.report.notes.iter().enumerate() {
            for p in placeholders(n) {
                let ok = match p.split_once(':') {
                    Some(("fig" | "pub", id)) => self.figures.iter().any(|f| f.id() == id),
                    Some(("eff", id)) => self.effects.iter().any(|e| e.id == id),
                    _ => false,
                };
                if !ok {
                    return Err(doc.field_error(
                        &format!("report.notes[{i}]"),
                        format!(
                            "unknown placeholder {{{p}}}: expected {{fig:ID}} or {{pub:ID}} with a figure id, or {{eff:ID}} with an effect id"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The `{...}` placeholders of a note, without their braces.
pub fn placeholders(note: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = note;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push(&rest[open + 1..open + close]);
        rest = &rest[open + close + 1..];
    }
    out
}
