//! Byte sizes written as fio writes them: a plain integer (`4096`) or an integer with a
//! `k`, `m`, `g` or `t` prefix in either case, alone or followed by `b` or `ib` (`4k`, `1M`,
//! `128KiB`, `4kB`), in powers of 1024 as fio reads `bs` under its default `kb_base=1024`
//! (fio takes the IEC `KiB` as 1024 always, and `kB` as 1024 under that default).
//!
//! One parser, [`parse_size`], serves every scenario field that holds a byte size (through
//! [`bytes`] and [`opt_bytes`], serde's `deserialize_with` helpers, which accept a TOML
//! integer or string) and any command-line flag that takes one.
//!
//! ```
//! use iolab_sim::size::parse_size;
//!
//! assert_eq!(parse_size("4k"), Ok(4096));
//! assert_eq!(parse_size("1M"), Ok(1 << 20));
//! assert_eq!(parse_size("512"), Ok(512));
//! assert!(parse_size("4x").is_err());
//! ```

use std::fmt;

use serde::de::{self, Deserializer, Visitor};

/// What [`parse_size`] expects, for messages.
pub const EXPECTED: &str =
    "expected a size in bytes: an integer, or an integer with a k, m, g or t suffix, optionally followed by b or ib (powers of 1024, as fio's bs), e.g. 4096, \"4k\", \"4KiB\", \"1m\"";

/// Why a size was refused. Each message ends with what was expected ([`EXPECTED`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Nothing was written.
    #[error("Empty size: {EXPECTED}")]
    Empty,
    /// A minus sign: sizes are not negative.
    #[error("Negative size \"{0}\": {EXPECTED}")]
    Negative(String),
    /// Not digits followed by a known suffix.
    #[error("Invalid size \"{0}\": {EXPECTED}")]
    Invalid(String),
    /// The value does not fit in 64 bits.
    #[error("Size \"{0}\" is too large: at most 2^64 - 1 bytes")]
    Overflow(String),
}

/// Parses a byte size: digits with an optional `k`, `m`, `g` or `t` suffix (case-insensitive,
/// powers of 1024). Spaces around the text are ignored; nothing else is accepted.
///
/// # Errors
///
/// [`SizeError`] for empty text, a minus sign, anything but digits and one known suffix,
/// or a value above `u64::MAX`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    if s.starts_with('-') {
        return Err(SizeError::Negative(text.to_owned()));
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() {
        return Err(SizeError::Invalid(text.to_owned()));
    }
    let lower = suffix.to_ascii_lowercase();
    let prefix = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .filter(|p| !p.is_empty())
        .unwrap_or(&lower);
    let shift = match prefix {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(SizeError::Invalid(text.to_owned())),
    };
    let overflow = || SizeError::Overflow(text.to_owned());
    let n: u64 = digits.parse().map_err(|_| overflow())?;
    n.checked_mul(1u64 << shift).ok_or_else(overflow)
}

struct SizeVisitor;

impl<'de> Visitor<'de> for SizeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a size in bytes (an integer, or a string such as \"4k\" or \"1m\")")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(SizeError::Negative(v.to_string())))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse_size(v).map_err(E::custom)
    }
}

/// serde `deserialize_with` helper: a byte size from a TOML integer or a [`parse_size`]
/// string.
///
/// # Errors
///
/// The deserializer's error carrying the [`SizeError`] message.
pub fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(SizeVisitor)
}

/// serde `deserialize_with` helper for an optional byte size (use with `#[serde(default)]`).
///
/// # Errors
///
/// As [`bytes`].
pub fn opt_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bytes(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_powers_of_1024_in_either_case() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("128k"), Ok(131_072));
        assert_eq!(parse_size("1m"), Ok(1_048_576));
        assert_eq!(parse_size("1M"), Ok(1_048_576));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert_eq!(parse_size(" 8k "), Ok(8192));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn fio_unit_spellings_with_b_and_ib_are_powers_of_1024() {
        for (text, want) in [
            ("4KiB", 4096),
            ("4kib", 4096),
            ("4kB", 4096),
            ("4KB", 4096),
            ("1MiB", 1 << 20),
            ("2GB", 2 << 30),
            ("1TiB", 1 << 40),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for bad in ["4ib", "4b", "4kibb", "4kiB2", "4Ki"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_text_is_refused_with_its_reason() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("  "), Err(SizeError::Empty));
        assert_eq!(parse_size("4x"), Err(SizeError::Invalid("4x".into())));
        assert_eq!(parse_size("k"), Err(SizeError::Invalid("k".into())));
        assert_eq!(parse_size("4 k"), Err(SizeError::Invalid("4 k".into())));
        assert_eq!(parse_size("4kk"), Err(SizeError::Invalid("4kk".into())));
        assert_eq!(parse_size("1.5k"), Err(SizeError::Invalid("1.5k".into())));
        assert_eq!(parse_size("-4k"), Err(SizeError::Negative("-4k".into())));
        assert_eq!(
            parse_size("99999999999999999999"),
            Err(SizeError::Overflow("99999999999999999999".into()))
        );
        assert_eq!(
            parse_size("16777216t"),
            Err(SizeError::Overflow("16777216t".into()))
        );
        assert!(parse_size("4x").unwrap_err().to_string().contains("4k"));
    }

    #[derive(serde::Deserialize)]
    struct T {
        #[serde(default, deserialize_with = "opt_bytes")]
        bs: Option<u64>,
    }

    #[test]
    fn toml_integers_and_strings_both_read() {
        let t: T = toml::from_str("bs = 4096").unwrap();
        assert_eq!(t.bs, Some(4096));
        let t: T = toml::from_str("bs = \"64k\"").unwrap();
        assert_eq!(t.bs, Some(65536));
        let t: T = toml::from_str("").unwrap();
        assert_eq!(t.bs, None);
        let e = toml::from_str::<T>("bs = -4").err().unwrap().to_string();
        assert!(e.contains("Negative size \"-4\""), "{e}");
        let e = toml::from_str::<T>("bs = 1.5").err().unwrap().to_string();
        assert!(e.contains("a size in bytes"), "{e}");
    }
}
