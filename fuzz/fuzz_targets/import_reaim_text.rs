//! Fuzzes the importer of the re-aim-7 results table (`iolab::import::reaim::parse`): the checks of
//! `shared/import_checks.rs`.
#![no_main]

#[path = "shared/import_checks.rs"]
mod import_checks;

use iolab::import::reaim;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| import_checks::check_import(data, true, reaim::parse));
