//! Per-CPU time accounting and the run report.
//!
//! Every nanosecond of every virtual CPU is in exactly one bucket: [`Account::User`],
//! [`Account::System`], [`Account::Spin`] (waiting for a spinlock, CPU busy) or idle.
//! Busy time is recorded interval by interval as tasks spend and spin; idle is derived as
//! the rest of the run, so `user + system + spin + idle == end` holds exactly for every
//! CPU (checked by [`CpuTimes::is_conserved`] and the conservation test).

use std::fmt;

use serde::Serialize;

use crate::time::{SimDuration, SimTime};

/// What a busy CPU is doing, for accounting. Idle is not an account: it is what is left.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Account {
    /// Application work (`%usr` in mpstat).
    User = 0,
    /// Kernel work: the DMA API, the IOMMU driver, interrupt handlers (`%sys`).
    System = 1,
    /// Spinning on a contended spinlock: the CPU is busy but does no work. Tools fold this
    /// into `%sys`; the lab keeps it apart so lock contention is visible.
    Spin = 2,
}

impl Account {
    /// The busy accounts, in index order.
    pub const ALL: [Account; 3] = [Account::User, Account::System, Account::Spin];
}

/// One CPU's time, split by account, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug, Serialize)]
pub struct CpuTimes {
    /// Time in [`Account::User`].
    pub user: u64,
    /// Time in [`Account::System`].
    pub system: u64,
    /// Time in [`Account::Spin`].
    pub spin: u64,
    /// Time with nothing to do.
    pub idle: u64,
}

impl CpuTimes {
    /// Busy time: user + system + spin.
    pub fn busy(&self) -> u64 {
        self.user + self.system + self.spin
    }
    /// All time: busy + idle (equals the run's end time for one CPU).
    pub fn total(&self) -> u64 {
        self.busy() + self.idle
    }
    /// Time in one account.
    pub fn get(&self, account: Account) -> u64 {
        match account {
            Account::User => self.user,
            Account::System => self.system,
            Account::Spin => self.spin,
        }
    }
    /// Whether the four buckets add up to `elapsed` exactly.
    pub fn is_conserved(&self, elapsed: SimDuration) -> bool {
        self.total() == elapsed.as_ns()
    }
    fn pct(part: u64, whole: u64) -> f64 {
        if whole == 0 {
            0.0
        } else {
            100.0 * part as f64 / whole as f64
        }
    }
    /// `%usr` as tools show it.
    pub fn user_pct(&self) -> f64 {
        Self::pct(self.user, self.total())
    }
    /// `%sys` as tools show it: system time plus spin time (a spinning CPU is in the
    /// kernel).
    pub fn sys_pct(&self) -> f64 {
        Self::pct(self.system + self.spin, self.total())
    }
    /// The spin part of `%sys`.
    pub fn spin_pct(&self) -> f64 {
        Self::pct(self.spin, self.total())
    }
    /// `%idle`.
    pub fn idle_pct(&self) -> f64 {
        Self::pct(self.idle, self.total())
    }
    /// CPU utilisation: 100 - `%idle`.
    pub fn busy_pct(&self) -> f64 {
        Self::pct(self.busy(), self.total())
    }
    fn add(&mut self, o: &CpuTimes) {
        self.user += o.user;
        self.system += o.system;
        self.spin += o.spin;
        self.idle += o.idle;
    }
}

/// Statistics of one lock (spin or sleeping).
#[derive(Clone, PartialEq, Eq, Default, Debug, Serialize)]
pub struct LockStats {
    /// The name given when the lock was created.
    pub name: String,
    /// Completed acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that found the lock held or other waiters queued.
    pub contended: u64,
    /// Total waiting time over all acquisitions, ns (beyond the uncontended acquire cost).
    pub wait_total_ns: u64,
    /// Longest single wait, ns.
    pub wait_max_ns: u64,
    /// Total time the lock was held (grant to release), ns.
    pub hold_total_ns: u64,
}

impl LockStats {
    /// Mean wait per acquisition, ns (0 if never acquired).
    pub fn mean_wait_ns(&self) -> f64 {
        if self.acquisitions == 0 {
            0.0
        } else {
            self.wait_total_ns as f64 / self.acquisitions as f64
        }
    }
    pub(crate) fn record_wait(&mut self, wait: u64, contended: bool) {
        self.acquisitions += 1;
        self.contended += u64::from(contended);
        self.wait_total_ns += wait;
        self.wait_max_ns = self.wait_max_ns.max(wait);
    }
}

/// Statistics of one contended cache line.
#[derive(Clone, PartialEq, Eq, Default, Debug, Serialize)]
pub struct LineStats {
    /// The name given when the line was created.
    pub name: String,
    /// Read-modify-write operations (atomics, stores and compare-and-swaps).
    pub ops: u64,
    /// Plain loads (hits on the CPU's own copy included).
    pub reads: u64,
    /// Compare-and-swap attempts (counted in `ops` too).
    pub cas_attempts: u64,
    /// Compare-and-swaps that failed because another CPU changed the line first.
    pub cas_failures: u64,
    /// Operations that had to pull the line from another CPU.
    pub transfers: u64,
    /// Total cost of all operations (waiting for the line included), ns.
    pub total_ns: u64,
    /// Most expensive single operation, ns.
    pub max_ns: u64,
}

impl LineStats {
    /// Mean cost per operation, ns (0 if none).
    pub fn mean_ns(&self) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            self.total_ns as f64 / self.ops as f64
        }
    }
}

/// Task counts at the end of a run.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug, Serialize)]
pub struct TaskCounts {
    /// Tasks spawned.
    pub spawned: u64,
    /// Tasks that ran to completion.
    pub finished: u64,
    /// Tasks still alive (blocked forever, or cut off by `run_until`).
    pub live: u64,
}

/// What a run produced: time, events, per-CPU accounting and resource statistics.
///
/// A pure function of the scenario and seed: two runs of the same scenario produce equal
/// reports (and equal `Debug` and JSON text).
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct RunReport {
    /// Virtual time at the end of the run.
    pub end: SimTime,
    /// Events processed (task wake-ups that polled a task).
    pub events: u64,
    /// Per-CPU accounting, indexed by CPU.
    pub cpus: Vec<CpuTimes>,
    /// Sum over all CPUs.
    pub total: CpuTimes,
    /// Spinlocks, in creation order.
    pub spin_locks: Vec<LockStats>,
    /// Sleeping locks, in creation order.
    pub sleep_locks: Vec<LockStats>,
    /// Contended cache lines, in creation order.
    pub cache_lines: Vec<LineStats>,
    /// Task counts.
    pub tasks: TaskCounts,
}

impl RunReport {
    pub(crate) fn total_of(cpus: &[CpuTimes]) -> CpuTimes {
        let mut t = CpuTimes::default();
        for c in cpus {
            t.add(c);
        }
        t
    }

    /// Whether every CPU's buckets add up to the run's end time exactly.
    pub fn is_conserved(&self) -> bool {
        let end = self.end.saturating_since(SimTime::ZERO);
        self.cpus.iter().all(|c| c.is_conserved(end))
    }

    /// The spinlock with this name, if any.
    pub fn spin_lock(&self, name: &str) -> Option<&LockStats> {
        self.spin_locks.iter().find(|l| l.name == name)
    }

    /// The sleeping lock with this name, if any.
    pub fn sleep_lock(&self, name: &str) -> Option<&LockStats> {
        self.sleep_locks.iter().find(|l| l.name == name)
    }

    /// The cache line with this name, if any.
    pub fn cache_line(&self, name: &str) -> Option<&LineStats> {
        self.cache_lines.iter().find(|l| l.name == name)
    }
}

impl fmt::Display for RunReport {
    /// An mpstat-like table: one row per CPU and an `all` row (averaged, as mpstat does).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "end {}  events {}", self.end, self.events)?;
        writeln!(
            f,
            "{:>5} {:>7} {:>7} {:>7} {:>7}",
            "CPU", "%usr", "%sys", "%spin", "%idle"
        )?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, c: &CpuTimes| {
            writeln!(
                f,
                "{:>5} {:>7.2} {:>7.2} {:>7.2} {:>7.2}",
                name,
                c.user_pct(),
                c.sys_pct(),
                c.spin_pct(),
                c.idle_pct()
            )
        };
        row(f, "all", &self.total)?;
        for (i, c) in self.cpus.iter().enumerate() {
            row(f, &i.to_string(), c)?;
        }
        for l in self.spin_locks.iter().chain(&self.sleep_locks) {
            writeln!(
                f,
                "lock {}: {} acq, {} contended, wait mean {:.1}ns max {}ns",
                l.name,
                l.acquisitions,
                l.contended,
                l.mean_wait_ns(),
                l.wait_max_ns
            )?;
        }
        for l in &self.cache_lines {
            writeln!(
                f,
                "line {}: {} ops, {} transfers, mean {:.1}ns max {}ns",
                l.name,
                l.ops,
                l.transfers,
                l.mean_ns(),
                l.max_ns
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_follow_tool_conventions() {
        let c = CpuTimes {
            user: 10,
            system: 20,
            spin: 30,
            idle: 40,
        };
        assert_eq!(c.total(), 100);
        assert!((c.sys_pct() - 50.0).abs() < 1e-9);
        assert!((c.busy_pct() - 60.0).abs() < 1e-9);
        assert!(c.is_conserved(SimDuration::ns(100)));
        assert_eq!(CpuTimes::default().idle_pct(), 0.0);
    }
}
