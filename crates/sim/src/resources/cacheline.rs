//! A contended cache line: the cost model of atomics on shared data.
//!
//! The line is a resource with a *last owner CPU* and a *busy-until* time. An atomic
//! read-modify-write by CPU `c` arriving at `t`:
//! - starts when the line is free: `start = max(t, busy_until)` (simultaneous RMWs by `k`
//!   CPUs serialise, in arrival order);
//! - costs [`LineParams::base_ns`], plus [`LineParams::transfer_ns`] if the previous access
//!   came from another CPU (the line must move);
//! - keeps the line until `start + cost`, and the issuing CPU busy from `t` until then
//!   (a stalled core is a busy core), charged to the caller's account.
//!
//! So one CPU hammering a line pays `base_ns` per operation, and `k` CPUs hammering it pay
//! about `k * (base_ns + transfer_ns)` each. A compare-and-swap loop is modelled by the
//! caller as repeated RMWs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::accounting::{Account, LineStats};
use crate::engine::kernel::{Burn, Kernel, TaskRef, NO_CPU};
use crate::engine::{Ctx, Handle, SimError};

/// Costs of atomics on a shared cache line, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LineParams {
    /// An atomic read-modify-write on a line already owned by the issuing CPU. Assumed
    /// 10 ns (about 20-30 cycles).
    pub base_ns: u64,
    /// Extra cost when the line must come from another CPU's cache. Assumed 70 ns
    /// (same socket, cross-core).
    pub transfer_ns: u64,
}

impl Default for LineParams {
    fn default() -> Self {
        LineParams {
            base_ns: 10,
            transfer_ns: 70,
        }
    }
}

pub(crate) struct LineState {
    params: LineParams,
    last_cpu: u32,
    busy_until: u64,
    pub(crate) stats: LineStats,
}

/// A shared cache line registered with a simulation. Clones share the line.
#[derive(Clone)]
pub struct CacheLine {
    h: Handle,
    idx: usize,
}

impl fmt::Debug for CacheLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLine")
            .field("name", &self.stats().name)
            .finish()
    }
}

impl CacheLine {
    /// A line no CPU has touched yet (its first access pays no transfer).
    pub fn new(h: &Handle, name: impl Into<String>, params: LineParams) -> Result<Self, SimError> {
        let mut st = h.0.st.borrow_mut();
        st.check_resource_cap()?;
        st.lines.push(LineState {
            params,
            last_cpu: NO_CPU,
            busy_until: 0,
            stats: LineStats {
                name: name.into(),
                ..LineStats::default()
            },
        });
        Ok(CacheLine {
            h: h.clone(),
            idx: st.lines.len() - 1,
        })
    }

    /// The line's costs.
    pub fn params(&self) -> LineParams {
        self.h.0.st.borrow().lines[self.idx].params
    }

    /// The line's statistics so far.
    pub fn stats(&self) -> LineStats {
        self.h.0.st.borrow().lines[self.idx].stats.clone()
    }

    /// One atomic read-modify-write by the task's CPU, charged to `account`. The future
    /// resolves to the operation's cost (waiting for the line included).
    ///
    /// # Panics
    ///
    /// If the task is an agent (when called).
    pub fn rmw<'a>(&'a self, ctx: &'a Ctx, account: Account) -> Rmw<'a> {
        ctx.debug_assert_no_debt();
        Rmw {
            k: &self.h.0,
            idx: self.idx,
            task: ctx.task,
            cpu: ctx.cpu_index(),
            account,
            cost: None,
            burn: Burn::default(),
        }
    }
}

/// Future of [`CacheLine::rmw`]; resolves to the operation's cost in nanoseconds.
#[must_use = "futures do nothing unless awaited"]
pub struct Rmw<'a> {
    /// The kernel, the line's index, the task and its CPU, copied when the operation is
    /// created (a poll then reads only the future itself and the kernel).
    k: &'a Kernel,
    idx: usize,
    task: TaskRef,
    cpu: u32,
    account: Account,
    cost: Option<u64>,
    burn: Burn,
}

impl Future for Rmw<'_> {
    type Output = u64;
    /// As for [`crate::engine::Spend`], the poll that resumes the operation at its end is
    /// inlined at each await and the first poll is a call.
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<u64> {
        let this = &mut *self;
        let Some(cost) = this.cost else {
            return this.first_poll();
        };
        let mut st = this.k.st.borrow_mut();
        if this.burn.poll(&mut st, this.cpu) {
            Poll::Ready(cost)
        } else {
            Poll::Pending
        }
    }
}

impl Rmw<'_> {
    /// Takes the line and starts the operation's span (at once if its end is the next
    /// event).
    #[inline(never)]
    fn first_poll(&mut self) -> Poll<u64> {
        let cpu = self.cpu;
        let mut st = self.k.st.borrow_mut();
        let now = st.now;
        let l = &mut st.lines[self.idx];
        let start = now.max(l.busy_until);
        let transfer = l.last_cpu != NO_CPU && l.last_cpu != cpu;
        let op = l.params.base_ns + if transfer { l.params.transfer_ns } else { 0 };
        l.busy_until = start + op;
        l.last_cpu = cpu;
        let cost = l.busy_until - now;
        l.stats.ops += 1;
        l.stats.transfers += u64::from(transfer);
        l.stats.total_ns += cost;
        l.stats.max_ns = l.stats.max_ns.max(cost);
        self.cost = Some(cost);
        if self.burn.begin(&mut st, cpu, self.task, self.account, cost) {
            Poll::Ready(cost)
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Rmw<'_> {
    /// Inlined: the usual drop (the operation is over) is one test.
    #[inline]
    fn drop(&mut self) {
        self.burn.release(self.k, self.cpu);
    }
}
