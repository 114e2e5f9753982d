//! A re-aim-7-like workload: a workfile of weighted tasks, a user ramp, and the re-aim table.
//!
//! re-aim forks `N` children; each child runs one *job*: every task of the workfile as many
//! times as its weight, in a random order. The parent waits for all of them. Per user count
//! the table reports (re-aim's columns, in its order):
//!
//! - `Num Forked`: `N`;
//! - `Parent Time`: seconds from the fork of the first child to the exit of the last;
//! - `Child SysTime`, `Child UTime`: the children's summed system and user seconds
//!   (`tms_cstime`, `tms_cutime`);
//! - `Jobs per Minute`: `N * W * 60 / Parent Time`, with `W` the workfile's total weight
//!   (re-aim counts work in task units: every published row of SEEDS.md #3 satisfies
//!   `JPM * Parent Time / (60 * N) = 103.0`);
//! - `Jobs/min/Child`: `Jobs per Minute / N`;
//! - `Std_dev Time`: standard deviation of the children's elapsed times, seconds;
//! - `Std_dev Percent`: that deviation relative to the mean child time, percent;
//! - `JTI` (job throughput index): `100 - Std_dev Percent`, truncated to an integer.
//!
//! and a final `Max Jobs per Minute` line.

use std::cell::RefCell;
use std::fmt::Write as _;

use crate::accounting::Account;
use crate::block::Piece;
use crate::devices::scsi::{page_addr, ScsiError, ScsiHost};
use crate::engine::{Ctx, SimDuration};

/// One task of a workfile.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// AIM task name, e.g. `shared_memory`.
    pub name: String,
    /// Times the task runs per job.
    pub weight: u32,
    /// User CPU per run before calibration scaling, ns.
    pub user_ns: f64,
    /// System CPU per run before calibration scaling (syscalls, page cache), ns.
    pub sys_ns: f64,
    /// Bytes written and `fsync`ed per run (0: no synchronous I/O).
    pub sync_write_bytes: u64,
}

/// A workfile: the task mix of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct Workfile {
    /// Name, e.g. `new_dbase`.
    pub name: String,
    /// Its tasks.
    pub tasks: Vec<Task>,
}

impl Workfile {
    /// Total weight: task runs per job (re-aim's work unit).
    pub fn weight_sum(&self) -> u64 {
        self.tasks.iter().map(|t| u64::from(t.weight)).sum()
    }

    /// The job as a list of task indices (each task `weight` times), in workfile order.
    pub fn job(&self) -> Vec<usize> {
        self.tasks
            .iter()
            .enumerate()
            .flat_map(|(i, t)| std::iter::repeat(i).take(t.weight as usize))
            .collect()
    }
}

/// What one child measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildResult {
    /// From fork to exit, ns.
    pub elapsed_ns: u64,
    /// User CPU, ns.
    pub user_ns: u64,
    /// System CPU, ns.
    pub sys_ns: u64,
}

/// One row of the re-aim table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReaimRow {
    /// Children forked.
    pub forked: u32,
    /// Parent time, s.
    pub parent_time: f64,
    /// Children's summed system time, s.
    pub child_sys: f64,
    /// Children's summed user time, s.
    pub child_user: f64,
    /// Jobs per minute.
    pub jpm: f64,
    /// Jobs per minute per child.
    pub jpm_per_child: f64,
    /// Standard deviation of child elapsed times, s.
    pub std_dev_time: f64,
    /// The same relative to the mean child time, %.
    pub std_dev_pct: f64,
    /// Job throughput index.
    pub jti: u32,
}

impl ReaimRow {
    /// Computes a row from the children's results, the parent's elapsed time and the
    /// workfile's weight. `None` without children or with a zero parent time.
    pub fn from_children(
        children: &[ChildResult],
        parent_ns: u64,
        weight_sum: u64,
    ) -> Option<Self> {
        if children.is_empty() || parent_ns == 0 {
            return None;
        }
        let n = children.len() as f64;
        let parent = parent_ns as f64 * 1e-9;
        let times: Vec<f64> = children
            .iter()
            .map(|c| c.elapsed_ns as f64 * 1e-9)
            .collect();
        let mean = times.iter().sum::<f64>() / n;
        let var = times.iter().map(|t| (t - mean) * (t - mean)).sum::<f64>() / n;
        let sd = var.sqrt();
        let pct = if mean > 0.0 { sd / mean * 100.0 } else { 0.0 };
        let jpm = n * weight_sum as f64 * 60.0 / parent;
        Some(Self {
            forked: children.len() as u32,
            parent_time: parent,
            child_sys: children.iter().map(|c| c.sys_ns).sum::<u64>() as f64 * 1e-9,
            child_user: children.iter().map(|c| c.user_ns).sum::<u64>() as f64 * 1e-9,
            jpm,
            jpm_per_child: jpm / n,
            std_dev_time: sd,
            std_dev_pct: pct,
            jti: (100.0 - pct).max(0.0).floor() as u32,
        })
    }
}

/// The table header, as re-aim prints it.
pub const HEADER: [&str; 3] = [
    "Times are in seconds - Child times from tms.cstime and tms.cutime",
    "Num     Parent   Child   Child  Jobs per   Jobs/min/  Std_dev  Std_dev  JTI",
    "Forked  Time     SysTime UTime   Minute     Child      Time     Percent",
];

/// Renders rows in re-aim's format; when `published` gives a jobs-per-minute value for a
/// row, it is printed after the JTI column as `[published X]`.
pub fn format_table(rows: &[ReaimRow], published: &[Option<f64>]) -> String {
    let mut out = String::from("REAIM Workload\n");
    for h in HEADER {
        let _ = writeln!(out, "{h}");
    }
    for (i, r) in rows.iter().enumerate() {
        let _ = write!(
            out,
            "{:<7} {:<8.2} {:<7.2} {:<7.2} {:<10.2} {:<10.2} {:<8.2} {:<8.2} {:<3}",
            r.forked,
            r.parent_time,
            r.child_sys,
            r.child_user,
            r.jpm,
            r.jpm_per_child,
            r.std_dev_time,
            r.std_dev_pct,
            r.jti
        );
        match published.get(i).copied().flatten() {
            Some(p) => {
                let _ = writeln!(out, "   [published {p:.2}]");
            }
            None => out.push('\n'),
        }
    }
    let max = rows.iter().map(|r| r.jpm).fold(0.0, f64::max);
    let _ = writeln!(out, "Max Jobs per Minute {max:.2}");
    out
}

/// Parses the rows of a table printed by [`format_table`] (or by re-aim itself): every line
/// that starts with nine numeric columns. Extra columns are ignored.
pub fn parse_table(text: &str) -> Vec<ReaimRow> {
    text.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.len() < 9 {
                return None;
            }
            let f = |i: usize| cols[i].parse::<f64>().ok();
            Some(ReaimRow {
                forked: cols[0].parse().ok()?,
                parent_time: f(1)?,
                child_sys: f(2)?,
                child_user: f(3)?,
                jpm: f(4)?,
                jpm_per_child: f(5)?,
                std_dev_time: f(6)?,
                std_dev_pct: f(7)?,
                jti: cols[8].parse().ok()?,
            })
        })
        .collect()
}

/// Time-slices a child's CPU work the way a time-sharing scheduler does: a child keeps its
/// CPU for at most one timeslice of computing, then goes to the back of its CPU's run queue.
#[derive(Clone, Copy, Debug)]
pub struct Slicer {
    slice_ns: u64,
    left_ns: u64,
}

impl Slicer {
    /// A slicer with timeslices of `slice_ns` (at least 1).
    pub fn new(slice_ns: u64) -> Self {
        let slice_ns = slice_ns.max(1);
        Self {
            slice_ns,
            left_ns: slice_ns,
        }
    }

    /// Spends `ns` on the child's CPU in `account`, yielding at the end of each timeslice.
    pub async fn spend(&mut self, ctx: &Ctx, mut ns: u64, account: Account) {
        while ns > 0 {
            if self.left_ns == 0 {
                ctx.yield_now().await;
                self.left_ns = self.slice_ns;
            }
            let d = ns.min(self.left_ns);
            ctx.cpu().spend(SimDuration::ns(d), account).await;
            self.left_ns -= d;
            ns -= d;
        }
    }

    /// Charges time spent outside [`Slicer::spend`] (kernel paths) against the timeslice.
    pub fn charge(&mut self, ns: u64) {
        self.left_ns = self.left_ns.saturating_sub(ns);
    }
}

/// Where a child's synchronous writes go: an ext3-like file system on one disk, its page
/// cache in scattered page frames.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FsyncLayout {
    /// Page size, bytes.
    pub page: u64,
    /// First page frame of the RAM page-cache pages are drawn from.
    pub first_pfn: u64,
    /// Page frames page-cache pages are drawn from (uniformly).
    pub mem_pages: u64,
    /// Disk capacity, bytes.
    pub disk_bytes: u64,
    /// File-system block size, bytes.
    pub fs_block: u64,
    /// Journal blocks written per commit besides the commit block.
    pub journal_blocks: u64,
}

/// How one child runs its job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChildSetup {
    /// Scheduler timeslice, ns.
    pub slice_ns: u64,
    /// Per-run cost variation: each task's CPU cost is scaled by a uniform factor in
    /// `1 +- jitter`.
    pub jitter: f64,
    /// Factors applied to every task's user and system CPU cost.
    pub scale: (f64, f64),
    /// The file system the synchronous writes go to.
    pub layout: FsyncLayout,
}

/// The journal area (the last 1% of the disk, written sequentially) and its write cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Journal {
    base: u64,
    len: u64,
    cursor: u64,
}

impl Journal {
    /// The journal of a file system laid out as `l`.
    pub fn new(l: &FsyncLayout) -> Self {
        Journal {
            base: (l.disk_bytes / 100 * 99) / l.fs_block * l.fs_block,
            len: (l.disk_bytes / 100).max(l.fs_block * 1024),
            cursor: 0,
        }
    }

    /// Reserves `bytes` of journal and returns their disk offset (wrapping at the end).
    fn reserve(&mut self, bytes: u64) -> u64 {
        if self.cursor + bytes > self.len {
            self.cursor = 0;
        }
        let o = self.base + self.cursor;
        self.cursor += bytes;
        o
    }
}

/// CPU time of all children of a run by origin, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskTotals {
    /// User time of the tasks' own work.
    pub task_user: u64,
    /// System time of the tasks' own work.
    pub task_sys: u64,
    /// System time of the synchronous-write I/O path (block layer, driver, IOMMU).
    pub io_sys: u64,
}

/// Runs one re-aim child on `ctx`'s CPU: the workfile's tasks, each `weight` times in a
/// random order, their CPU work time-sliced; a task with synchronous writes writes its file
/// (scattered page-cache pages) and `fsync`s it (ext3 `data=ordered`: the data, the
/// journal blocks, the commit block) through `host`. Returns the child's user and system
/// time, ns, and adds them to `totals`.
pub async fn run_child(
    ctx: &Ctx,
    wf: &Workfile,
    c: &ChildSetup,
    host: &ScsiHost,
    journal: &RefCell<Journal>,
    totals: &RefCell<TaskTotals>,
) -> Result<(u64, u64), ScsiError> {
    let l = &c.layout;
    let mut slicer = Slicer::new(c.slice_ns);
    let mut job = wf.job();
    // re-aim runs the job's tasks in a random order per child.
    for i in (1..job.len()).rev() {
        let j = ctx.rng().below(i as u64 + 1) as usize;
        job.swap(i, j);
    }
    let (mut user, mut sys) = (0u64, 0u64);
    for ti in job {
        let t = &wf.tasks[ti];
        let f = 1.0 + c.jitter * (2.0 * ctx.rng().next_f64() - 1.0);
        let u = (t.user_ns * c.scale.0 * f).round() as u64;
        let s = (t.sys_ns * c.scale.1 * f).round() as u64;
        slicer.spend(ctx, u, Account::User).await;
        slicer.spend(ctx, s, Account::System).await;
        user += u;
        sys += s;
        {
            let mut tt = totals.borrow_mut();
            tt.task_user += u;
            tt.task_sys += s;
        }
        if t.sync_write_bytes == 0 {
            continue;
        }
        // The file's page-cache pages: scattered page frames.
        let pages = t.sync_write_bytes.div_ceil(l.page);
        let mut pieces = Vec::with_capacity(pages as usize);
        let mut left = t.sync_write_bytes;
        for _ in 0..pages {
            let pfn = l.first_pfn + ctx.rng().below(l.mem_pages);
            let len = left.min(l.page);
            pieces.push(Piece {
                pa: page_addr(pfn, l.page),
                len,
            });
            left -= len;
        }
        let blocks = l.disk_bytes / l.fs_block - 1024;
        let offset = ctx.rng().below(blocks * 9 / 10) * l.fs_block;
        // fsync (ext3, data=ordered): the data, then the journal blocks (each a buffer in
        // its own page), then the commit block.
        let mut jpieces = Vec::new();
        for _ in 0..l.journal_blocks {
            let pfn = l.first_pfn + ctx.rng().below(l.mem_pages);
            let off = ctx.rng().below(l.page / l.fs_block) * l.fs_block;
            jpieces.push(Piece {
                pa: iolab_iommu::addr::PhysAddr::new(page_addr(pfn, l.page).get() + off),
                len: l.fs_block,
            });
        }
        let cpfn = l.first_pfn + ctx.rng().below(l.mem_pages);
        let commit = [Piece {
            pa: page_addr(cpfn, l.page),
            len: l.fs_block,
        }];
        let joff = journal
            .borrow_mut()
            .reserve((l.journal_blocks + 1) * l.fs_block);
        let mut io_sys = 0u64;
        for (off, list) in [
            (offset, pieces.as_slice()),
            (joff, jpieces.as_slice()),
            (joff + l.journal_blocks * l.fs_block, commit.as_slice()),
        ] {
            io_sys += host.write(ctx, off, list).await?.sys_ns;
        }
        slicer.charge(io_sys);
        sys += io_sys;
        totals.borrow_mut().io_sys += io_sys;
    }
    Ok((user, sys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jti_is_100_minus_the_deviation_percent_truncated() {
        let kids = [
            ChildResult {
                elapsed_ns: 90_000_000_000,
                ..Default::default()
            },
            ChildResult {
                elapsed_ns: 110_000_000_000,
                ..Default::default()
            },
        ];
        let r = ReaimRow::from_children(&kids, 110_000_000_000, 103).unwrap();
        assert!((r.std_dev_pct - 10.0).abs() < 1e-9);
        assert_eq!(r.jti, 90);
        assert!((r.jpm - 2.0 * 103.0 * 60.0 / 110.0).abs() < 1e-9);
    }

    #[test]
    fn a_printed_table_parses_back() {
        let kids = [ChildResult {
            elapsed_ns: 1_000_000_000,
            user_ns: 2,
            sys_ns: 1,
        }];
        let r = ReaimRow::from_children(&kids, 1_000_000_000, 10).unwrap();
        let t = format_table(&[r], &[Some(5.0)]);
        let back = parse_table(&t);
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].forked, 1);
        assert!((back[0].jpm - 600.0).abs() < 0.01);
    }
}
