//! How far a lab run has come, for a command line to show.
//!
//! A caller that wants to know installs a hook on its thread with [`observe`] for the
//! length of a call. A run whose length is set in virtual time (fio, netperf,
//! `dma_map_benchmark`) advances its simulation in steps
//! ([`crate::engine::Sim::run_until_observed`]) and tells the hook the virtual time done and
//! the total after each step; a run whose length is its work (bonnie's phases, re-aim's
//! children) tells it the work done and the total ([`Measure::Work`]). Without a hook a run
//! advances in one go, as ever. Steps and reports change nothing a run computes: the engine
//! processes the same events in the same order whatever the limits it is given.

use std::cell::RefCell;

/// What a progress report counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Virtual time, ns.
    VirtualTime,
    /// Units of a workload's own work, named (e.g. `"bonnie's phases"`).
    Work(&'static str),
}

/// A hook: (done, in all, what they count).
type Hook = Box<dyn FnMut(u64, u64, Measure)>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Runs `f` with `hook` told how far every lab run `f` makes on this thread has come (a run
/// with repetitions reports each in turn).
pub fn observe<R>(hook: impl FnMut(u64, u64, Measure) + 'static, f: impl FnOnce() -> R) -> R {
    let previous = HOOK.with(|h| h.borrow_mut().replace(Box::new(hook)));
    let out = f();
    HOOK.with(|h| *h.borrow_mut() = previous);
    out
}

/// Whether a hook is installed on this thread.
pub(crate) fn observed() -> bool {
    HOOK.with(|h| h.borrow().is_some())
}

/// Tells the hook, if any, that `done_ns` of `total_ns` of virtual time are done.
pub(crate) fn report(done_ns: u64, total_ns: u64) {
    HOOK.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(done_ns, total_ns, Measure::VirtualTime);
        }
    });
}

/// Tells the hook, if any, that `done` of `total` units of `what` are done.
pub(crate) fn report_work(done: u64, total: u64, what: &'static str) {
    HOOK.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(done, total, Measure::Work(what));
        }
    });
}
