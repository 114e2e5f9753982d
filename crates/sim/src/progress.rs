//! How far a lab run has come in virtual time, for a command line to show.
//!
//! A caller that wants to know installs a hook on its thread with [`observe`] for the
//! length of a call; the lab's runs then advance their simulations in steps
//! ([`crate::engine::Sim::run_until_observed`]) and call the hook with the virtual time done
//! and the total after each step. Without a hook a run advances in one go, as ever. Steps
//! change nothing a run computes: the engine processes the same events in the same order
//! whatever the limits it is given.

use std::cell::RefCell;

/// A hook: (virtual ns done, virtual ns in all).
type Hook = Box<dyn FnMut(u64, u64)>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Runs `f` with `hook` told the virtual time done and the total of every lab run `f` makes
/// on this thread (a run with repetitions reports each in turn).
pub fn observe<R>(hook: impl FnMut(u64, u64) + 'static, f: impl FnOnce() -> R) -> R {
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
            f(done_ns, total_ns);
        }
    });
}
