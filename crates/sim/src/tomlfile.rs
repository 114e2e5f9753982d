//! Reading TOML input files (scenarios, platform profiles) with errors that name the file,
//! the line, the field's dotted path and what was expected.

use std::ops::Range;

use serde::de::DeserializeOwned;
use toml::de::{DeTable, DeValue};

/// Why an input file was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The file could not be read.
    #[error("Cannot read {origin}: {message}")]
    Read {
        /// The file.
        origin: String,
        /// The operating system's message.
        message: String,
    },
    /// The text is not valid TOML.
    #[error("Invalid TOML in {origin} at line {line}, column {column}: {message}")]
    Syntax {
        /// The file.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A field is missing, of the wrong type, unknown, or out of range.
    #[error("Invalid {origin}{}: field `{field}`: {problem}", at(*line, *column))]
    Field {
        /// The file.
        origin: String,
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// Dotted path of the field, e.g. `workload.iodepth`.
        field: String,
        /// What was expected.
        problem: String,
    },
}

/// A parsed TOML document that remembers its text, for locating fields in later errors.
pub struct TomlDoc<'a> {
    text: &'a str,
    origin: String,
    doc: toml::Spanned<DeTable<'a>>,
}

impl<'a> TomlDoc<'a> {
    /// Parses `text` (from `origin`, a file name for messages) as TOML.
    pub fn parse(text: &'a str, origin: &str) -> Result<Self, InputError> {
        match DeTable::parse(text) {
            Ok(doc) => Ok(Self {
                text,
                origin: origin.to_owned(),
                doc,
            }),
            Err(e) => {
                let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
                Err(InputError::Syntax {
                    origin: origin.to_owned(),
                    line,
                    column,
                    message: e.message().to_owned(),
                })
            }
        }
    }

    /// Deserializes the whole document into `T`, naming the field on error.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, InputError> {
        toml::from_str(self.text).map_err(|e| {
            let message = e.message();
            let span = e.span();
            let mut path = span
                .clone()
                .map(|s| path_at(self.doc.get_ref(), &s))
                .unwrap_or_default();
            if let Some(missing) = backticked_after(message, "missing field ") {
                path.push(missing.to_owned());
            }
            let field = if path.is_empty() {
                "(document)".to_owned()
            } else {
                path.join(".")
            };
            let (line, column) = match span {
                Some(s) => {
                    let (l, c) = line_col(self.text, s.start);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            InputError::Field {
                origin: self.origin.clone(),
                line,
                column,
                field,
                problem: message
                    .replace("expected f64", "expected a number")
                    .replace("expected u64", "expected a non-negative integer")
                    .replace("expected u32", "expected a non-negative integer")
                    .replace("expected usize", "expected a non-negative integer"),
            }
        })
    }

    /// An error about the field at dotted `path` (for checks done after deserializing).
    pub fn field_error(&self, path: &str, problem: impl Into<String>) -> InputError {
        let (line, column) = match span_of_path(self.doc.get_ref(), path) {
            Some(s) => {
                let (l, c) = line_col(self.text, s.start);
                (Some(l), Some(c))
            }
            None => (None, None),
        };
        InputError::Field {
            origin: self.origin.clone(),
            line,
            column,
            field: path.to_owned(),
            problem: problem.into(),
        }
    }
}

/// Parses and deserializes `text` in one step.
pub fn parse<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, InputError> {
    TomlDoc::parse(text, origin)?.deserialize()
}

fn at(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" at line {l}, column {c}"),
        (Some(l), None) => format!(" at line {l}"),
        _ => String::new(),
    }
}

/// 1-based line and column (in characters) of byte offset `pos` in `text`.
pub(crate) fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let mut pos = pos.min(text.len());
    while !text.is_char_boundary(pos) {
        pos -= 1;
    }
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..pos].chars().count() + 1;
    (line, column)
}

/// The text between the first pair of backticks after `prefix`, if `message` starts so.
pub(crate) fn backticked_after<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = message.strip_prefix(prefix)?.strip_prefix('`')?;
    rest.split('`').next()
}

/// The dotted path of the most specific key or value whose span contains `span.start`.
pub(crate) fn path_at(doc: &DeTable<'_>, span: &Range<usize>) -> Vec<String> {
    let mut best: Option<(usize, Vec<String>)> = None;
    let mut stack = Vec::new();
    search(doc, span, &mut stack, &mut best);
    best.map(|(_, p)| p).unwrap_or_default()
}

fn contains(s: &Range<usize>, target: &Range<usize>) -> bool {
    if s == target {
        return true;
    }
    // An empty span (the document root, for a missing top-level field) matches no entry.
    !target.is_empty() && s.start <= target.start && target.start < s.end
}

fn search(
    table: &DeTable<'_>,
    target: &Range<usize>,
    stack: &mut Vec<String>,
    best: &mut Option<(usize, Vec<String>)>,
) {
    for (k, v) in table.iter() {
        stack.push(k.get_ref().to_string());
        for s in [k.span(), v.span()] {
            consider(&s, target, stack, best);
        }
        match v.get_ref() {
            DeValue::Table(t) => search(t, target, stack, best),
            // Arrays (of tables, `[[name]]`): elements are named `name[i]`.
            DeValue::Array(items) => {
                let key = stack.pop().unwrap_or_default();
                for (i, item) in items.iter().enumerate() {
                    stack.push(format!("{key}[{i}]"));
                    consider(&item.span(), target, stack, best);
                    if let DeValue::Table(t) = item.get_ref() {
                        search(t, target, stack, best);
                    }
                    stack.pop();
                }
                stack.push(key);
            }
            _ => {}
        }
        stack.pop();
    }
}

/// Keeps `stack` as the best path if span `s` holds the target more tightly.
fn consider(
    s: &Range<usize>,
    target: &Range<usize>,
    stack: &[String],
    best: &mut Option<(usize, Vec<String>)>,
) {
    if contains(s, target) {
        let len = s.end - s.start;
        let better = match best {
            None => true,
            Some((l, p)) => len < *l || (len == *l && stack.len() > p.len()),
        };
        if better {
            *best = Some((len, stack.to_vec()));
        }
    }
}

/// The span of the value at dotted `path` (or of its deepest existing ancestor).
/// The keys of a dotted path: `a.b` is two keys, `a."b.c"` is `a` and `b.c` (a quoted key
/// may contain dots).
pub(crate) fn path_segments(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in path.chars() {
        match ch {
            '"' => quoted = !quoted,
            '.' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(ch),
        }
    }
    out.push(cur);
    out
}

pub(crate) fn span_of_path(doc: &DeTable<'_>, path: &str) -> Option<Range<usize>> {
    let mut table = doc;
    let mut found = None;
    for segment in path_segments(path) {
        let segment = segment.as_str();
        // `name[i]` names element i of an array (of tables).
        let (key, index) = match segment.strip_suffix(']').and_then(|s| s.split_once('[')) {
            Some((k, i)) => (k, i.parse::<usize>().ok()),
            None => (segment, None),
        };
        let Some((_, v)) = table.iter().find(|(k, _)| k.get_ref() == key) else {
            break;
        };
        found = Some(v.span());
        let v = match (v.get_ref(), index) {
            (DeValue::Array(items), Some(i)) => match items.get(i) {
                Some(item) => {
                    found = Some(item.span());
                    item
                }
                None => break,
            },
            _ => v,
        };
        match v.get_ref() {
            DeValue::Table(t) => table = t,
            _ => break,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Inner,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        depth: u32,
    }

    #[test]
    fn a_wrong_type_names_the_field_and_line() {
        let err =
            parse::<Outer>("name = \"x\"\n[inner]\ndepth = \"deep\"\n", "s.toml").unwrap_err();
        match err {
            InputError::Field { field, line, .. } => {
                assert_eq!(field, "inner.depth");
                assert_eq!(line, Some(3));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_missing_field_is_named() {
        let err = parse::<Outer>("name = \"x\"\n[inner]\n", "s.toml").unwrap_err();
        assert!(err.to_string().contains("inner.depth"), "{err}");
    }

    #[test]
    fn syntax_errors_give_the_line() {
        let err = parse::<Outer>("name = \"x\"\nbroken = \n", "s.toml").unwrap_err();
        assert!(matches!(err, InputError::Syntax { line: 2, .. }), "{err:?}");
    }

    #[test]
    fn fields_in_arrays_of_tables_are_named_by_index() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Doc {
            dev: Vec<Inner>,
        }
        let text = "[[dev]]\ndepth = 1\n[[dev]]\ndepht = 2\n";
        match parse::<Doc>(text, "s.toml").unwrap_err() {
            InputError::Field { field, line, .. } => {
                assert_eq!(field, "dev[1].depht");
                assert_eq!(line, Some(4));
            }
            other => panic!("unexpected {other:?}"),
        }
        let doc = TomlDoc::parse(text, "s.toml").unwrap();
        let err = doc.field_error("dev[0].depth", "expected at least 2");
        assert!(err.to_string().contains("at line 2"), "{err}");
    }

    #[test]
    fn checks_after_parsing_locate_the_field() {
        let text = "name = \"x\"\n[inner]\ndepth = 0\n";
        let doc = TomlDoc::parse(text, "s.toml").unwrap();
        let err = doc.field_error("inner.depth", "expected at least 1");
        assert_eq!(
            err.to_string(),
            "Invalid s.toml at line 3, column 9: field `inner.depth`: expected at least 1"
        );
    }
}
