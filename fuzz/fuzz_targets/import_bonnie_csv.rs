//! Fuzzes the importer of bonnie++ CSV rows (`iolab::import::bonnie::parse`): the checks of
//! `shared/import_checks.rs`. Rows with the same machine name are repetitions
//! (`-x N`): the CLI stores them as runs of one group, so configurations may repeat here.
#![no_main]

#[path = "shared/import_checks.rs"]
mod import_checks;

use iolab::import::bonnie;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| import_checks::check_import(data, false, bonnie::parse));
