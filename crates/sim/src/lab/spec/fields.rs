//! The table-driven field checks every section shares: a value or its default, checked
//! against its range and named `{table}.{field}` in the error ([`Fields`], [`range`], [`real`],
//! [`cpu`]), and the wording of a list of choices ([`one_of`]).

use std::ops::RangeInclusive;

use crate::lab::defaults::Sourced;
use crate::tomlfile::{InputError, TomlDoc};

/// One row of a table of real fields ([`Fields::reals`]): the field's name, its value as the
/// file gives it, its default and the bounds it must lie in.
pub(super) type RealField<'n> = (&'n str, Option<f64>, Sourced<f64>, RangeInclusive<f64>);

pub(super) fn one_of(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!("expected one of {}", q.join(", "))
}

/// A range check on an integer field.
pub(super) fn range<T: PartialOrd + Copy + std::fmt::Display>(
    doc: &TomlDoc<'_>,
    path: &str,
    v: T,
    lo: T,
    hi: T,
    what: &str,
) -> Result<T, InputError> {
    if v < lo || v > hi {
        return Err(doc.field_error(path, format!("expected {lo}..={hi} {what}, got {v}")));
    }
    Ok(v)
}

/// A range check on a real field (finite, within bounds).
fn real(doc: &TomlDoc<'_>, path: &str, v: f64, lo: f64, hi: f64) -> Result<f64, InputError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(doc.field_error(path, format!("expected a number in {lo}..={hi}, got {v}")));
    }
    Ok(v)
}

/// Microseconds as whole nanoseconds.
pub(super) fn us_to_ns(us: f64) -> u64 {
    (us * 1e3).round() as u64
}

/// The checks of one table's optional fields (`device[0]`, `workload`, ...): each takes
/// the field's value or its default, checks it with [`range`], [`real`] or [`cpu`], and
/// names `{table}.{field}` in its error.
pub(super) struct Fields<'a, 'd> {
    doc: &'a TomlDoc<'d>,
    table: String,
}

impl<'a, 'd> Fields<'a, 'd> {
    pub(super) fn new(doc: &'a TomlDoc<'d>, table: impl Into<String>) -> Self {
        Fields {
            doc,
            table: table.into(),
        }
    }

    /// The field's path in errors.
    pub(super) fn path(&self, field: &str) -> String {
        format!("{}.{field}", self.table)
    }

    /// An integer field's value `v`, which must be in `bounds` (`what` names its unit or
    /// cap).
    pub(super) fn int<T: PartialOrd + Copy + std::fmt::Display>(
        &self,
        field: &str,
        v: T,
        bounds: RangeInclusive<T>,
        what: &str,
    ) -> Result<T, InputError> {
        let (lo, hi) = bounds.into_inner();
        range(self.doc, &self.path(field), v, lo, hi, what)
    }

    /// Replaces `target` with an integer field the table sets (checked as by
    /// [`Fields::int`]); leaves it as it is when the field is absent.
    pub(super) fn set_int<T: PartialOrd + Copy + std::fmt::Display>(
        &self,
        target: &mut T,
        field: &str,
        v: Option<T>,
        bounds: RangeInclusive<T>,
        what: &str,
    ) -> Result<(), InputError> {
        if let Some(v) = v {
            *target = self.int(field, v, bounds, what)?;
        }
        Ok(())
    }

    /// A real field's value `v`, which must be finite and in `bounds`.
    pub(super) fn real(
        &self,
        field: &str,
        v: f64,
        bounds: RangeInclusive<f64>,
    ) -> Result<f64, InputError> {
        let (lo, hi) = bounds.into_inner();
        real(self.doc, &self.path(field), v, lo, hi)
    }

    /// A table of real fields, one row each: `(field, value as written, default, bounds)`.
    /// Each field's value (or its default) is checked as by [`Fields::real`], in the rows'
    /// order, so the first bad field is the one reported.
    pub(super) fn reals<const N: usize>(
        &self,
        rows: [RealField<'_>; N],
    ) -> Result<[f64; N], InputError> {
        let mut out = [0.0; N];
        for (slot, (field, v, default, bounds)) in out.iter_mut().zip(rows) {
            *slot = self.real(field, v.unwrap_or(default.0), bounds)?;
        }
        Ok(out)
    }

    /// A time field written in microseconds (checked as by [`Fields::real`]), as whole
    /// nanoseconds.
    pub(super) fn us_as_ns(
        &self,
        field: &str,
        v: f64,
        bounds: RangeInclusive<f64>,
    ) -> Result<u64, InputError> {
        Ok(us_to_ns(self.real(field, v, bounds)?))
    }

    /// A CPU index field, as [`cpu`] checks it.
    pub(super) fn cpu(
        &self,
        field: &str,
        v: Option<usize>,
        default: usize,
        cpus: usize,
    ) -> Result<usize, InputError> {
        cpu(self.doc, &self.path(field), v, default, cpus)
    }
}

/// A CPU index field: explicit values must exist; defaults wrap onto the machine.
fn cpu(
    doc: &TomlDoc<'_>,
    path: &str,
    v: Option<usize>,
    default: usize,
    cpus: usize,
) -> Result<usize, InputError> {
    match v {
        Some(c) if c >= cpus => Err(doc.field_error(
            path,
            format!("expected a CPU in 0..{cpus} (machine.cpus = {cpus}), got {c}"),
        )),
        Some(c) => Ok(c),
        None => Ok(default % cpus),
    }
}
