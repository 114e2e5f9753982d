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

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[device]\nrate = 3.5\n";

    fn message(e: InputError) -> String {
        e.to_string()
    }

    #[test]
    fn one_of_quotes_every_choice() {
        assert_eq!(one_of(&["a", "b-c"]), "expected one of \"a\", \"b-c\"");
    }

    #[test]
    fn int_checks_its_bounds_and_names_table_and_field() {
        let doc = TomlDoc::parse(TEXT, "t.toml").unwrap();
        let dev = Fields::new(&doc, "device");
        assert_eq!(dev.path("rate"), "device.rate");
        assert_eq!(dev.int("n", 4u32, 1..=4, "ns"), Ok(4));
        let e = message(dev.int("n", 5u32, 1..=4, "ns (cap X)").unwrap_err());
        assert!(
            e.contains("field `device.n`: expected 1..=4 ns (cap X), got 5"),
            "{e}"
        );
        let mut v = 7u64;
        dev.set_int(&mut v, "n", None, 1..=4, "ns").unwrap();
        assert_eq!(v, 7, "an absent field leaves the target");
        dev.set_int(&mut v, "n", Some(3), 1..=4, "ns").unwrap();
        assert_eq!(v, 3);
        assert!(dev.set_int(&mut v, "n", Some(9), 1..=4, "ns").is_err());
    }

    #[test]
    fn real_refuses_values_out_of_bounds_and_not_finite() {
        let doc = TomlDoc::parse(TEXT, "t.toml").unwrap();
        let dev = Fields::new(&doc, "device");
        assert_eq!(dev.real("rate", 3.5, 0.0..=4.0), Ok(3.5));
        let e = message(dev.real("rate", 4.5, 0.0..=4.0).unwrap_err());
        assert!(e.contains("line 2"), "the field's line: {e}");
        assert!(
            e.contains("field `device.rate`: expected a number in 0..=4, got 4.5"),
            "{e}"
        );
        for bad in [f64::NAN, f64::INFINITY] {
            assert!(dev.real("rate", bad, 0.0..=f64::MAX).is_err());
        }
        assert_eq!(dev.us_as_ns("rate", 2.0004, 0.0..=4.0), Ok(2000));
        assert_eq!(us_to_ns(0.0015), 2);
    }

    #[test]
    fn reals_take_each_value_or_default_and_report_the_first_bad_row() {
        let doc = TomlDoc::parse(TEXT, "t.toml").unwrap();
        let dev = Fields::new(&doc, "device");
        let got = dev.reals([
            ("a", Some(1.0), (9.0, "s"), 0.0..=2.0),
            ("b", None, (1.5, "s"), 0.0..=2.0),
        ]);
        assert_eq!(got, Ok([1.0, 1.5]));
        let e = message(
            dev.reals([
                ("a", Some(1.0), (9.0, "s"), 0.0..=2.0),
                ("b", Some(3.0), (1.0, "s"), 0.0..=2.0),
                ("c", Some(4.0), (1.0, "s"), 0.0..=2.0),
            ])
            .unwrap_err(),
        );
        assert!(
            e.contains("field `device.b`: expected a number in 0..=2, got 3"),
            "{e}"
        );
        // A default is checked too (a profile or defaults table could be wrong).
        assert!(dev.reals([("d", None, (5.0, "s"), 0.0..=2.0)]).is_err());
    }

    #[test]
    fn cpu_fields_must_exist_and_defaults_wrap() {
        let doc = TomlDoc::parse(TEXT, "t.toml").unwrap();
        let dev = Fields::new(&doc, "device");
        assert_eq!(dev.cpu("irq_cpu", Some(3), 0, 4), Ok(3));
        assert_eq!(dev.cpu("irq_cpu", None, 6, 4), Ok(2));
        let e = message(dev.cpu("irq_cpu", Some(4), 0, 4).unwrap_err());
        assert!(
            e.contains("field `device.irq_cpu`: expected a CPU in 0..4 (machine.cpus = 4), got 4"),
            "{e}"
        );
    }
}
