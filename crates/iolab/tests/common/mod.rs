//! Set-up the CLI tests share: running the `iolab` binary, a fresh temporary directory per
//! test, and reading what the binary wrote. Each test file keeps what it checks.

// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the `iolab` binary built for these tests with `args` and waits for it.
pub fn iolab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args(args)
        .output()
        .expect("the iolab binary runs")
}

/// A fresh, empty directory for one test, named after the test file, the process and `name`
/// (so that test files and concurrent runs never share one).
pub fn temp_dir(name: &str) -> PathBuf {
    let file = env!("CARGO_CRATE_NAME").replace('_', "-");
    let dir = std::env::temp_dir().join(format!("iolab-{file}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A path as the `&str` an argument list takes.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// What the binary wrote on standard error.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The scenario text stored with run `id` in the results database `db`.
pub fn stored_scenario_text(db: &Path, id: i64) -> Option<String> {
    rusqlite::Connection::open(db)
        .expect("the results database opens")
        .query_row("SELECT scenario_text FROM runs WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .expect("the run is stored")
}
