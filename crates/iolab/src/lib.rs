//! The parts of the `iolab` command that other programs (fuzzers, tests) call directly.
//!
//! Everything else of the command lives in the binary; this library holds the importers of
//! real tools' outputs ([`import`]), pure functions from text to
//! [`iolab_sim::metrics::Measurement`]s, and the vocabulary of attributes and pairing rules
//! they share with lab runs ([`vocab`]).

pub mod import;
pub mod vocab;
