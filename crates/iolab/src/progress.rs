//! Progress bars with an ETA on standard error (`indicatif`), for the commands that can run
//! longer than a few seconds: `soak`, `sweep`, `reproduce`, `fit` and `run` with `--runs N`;
//! a workload run (`run`, a repetition) also says how much of its virtual time is done (fio,
//! netperf on POWER and dma_map_benchmark workloads, which run to a set virtual time;
//! `iolab_sim::progress`), or off a terminal prints that once a minute. bonnie++ and re-aim
//! runs end when their work does, so they show the elapsed time only.
//!
//! A bar is drawn only when standard error is a terminal and `--quiet` was not given;
//! otherwise it is hidden and costs nothing, so redirected output and scripts see only the
//! commands' own lines. Lines printed while a bar is shown go through [`note`], which lifts
//! the bar for them.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Hides every progress bar of this process (`--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub fn is_quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Whether bars are drawn: standard error is a terminal and `--quiet` was not given.
pub fn enabled() -> bool {
    !QUIET.load(Ordering::Relaxed) && std::io::stderr().is_terminal()
}

/// A bar of `len` steps; `template` is indicatif's (`{bar}`, `{pos}`, `{len}`, `{eta}`,
/// `{elapsed}`, `{msg}`, ...). Hidden unless [`enabled`].
pub fn bar(len: u64, template: &str) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(250));
    bar
}

/// A bar over `len` runs or repetitions: `[=====>   ] 2/5 runs, 12s elapsed, about 18s left: MSG`.
pub fn runs_bar(len: u64, what: &str) -> ProgressBar {
    bar(
        len,
        &format!(
            "{{bar:30}} {{pos}}/{{len}} {what}, {{elapsed}} elapsed, about {{eta}} left: {{msg}}"
        ),
    )
}

/// Prints `line` on standard error, lifting `bar` while it does.
pub fn note(bar: &ProgressBar, line: &str) {
    bar.suspend(|| eprintln!("{line}"));
}
