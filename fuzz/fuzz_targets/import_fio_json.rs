//! Fuzzes the importer of fio --output-format=json / json+ (`iolab::import::fio::parse`): the checks of
//! `shared/import_checks.rs`.
#![no_main]

#[path = "shared/import_checks.rs"]
mod import_checks;

use iolab::import::fio;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| import_checks::check_import(data, true, fio::parse));
