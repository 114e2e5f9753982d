//! A bonnie++ 1.03-like benchmark (`bonnie++ -d ./ -s SIZE -r RAM -b -u root`) over a
//! modelled page cache, and its CSV output.
//!
//! Phases, in bonnie's order, each timed from its first call to its last byte on the device:
//!
//! - **per-char write**: `putc` into a stdio buffer (a per-byte CPU cost, user time), one
//!   `write()` per full buffer;
//! - **block write**: `write()` of one chunk at a time;
//! - **rewrite**: per chunk, `read()`, change it, `lseek()` back, `write()`;
//! - **per-char read**: `getc` from a stdio buffer refilled by `read()`;
//! - **block read**: `read()` of one chunk at a time;
//! - **random seeks**: three seeker processes (as bonnie++ 1.03), each taking the next of
//!   the 8000 seek tickets when free, `lseek()` to a random chunk of the whole (unscaled)
//!   file and `read()` it; a seeker's first seek and every tenth after it changes the chunk,
//!   writes it back with `write()` and, under `-b`, `fsync()`s the file (bonnie++ 1.03
//!   `CFileOp::doseek`): the chunk is written and waited for, then the file system's
//!   journal commits the inode's new mtime (journal blocks, a cache flush, the commit
//!   block, a cache flush; see [`BonnieConfig::fsync_journal_blocks`]).
//!
//! The page cache: a `write()` copies into page-cache pages (allocated at scattered physical
//! addresses, as a long-running system's free pages are), marking them dirty; a flusher
//! thread writes dirty pages back in file order once more than the background threshold is
//! dirty, building block requests that the queue limits cut; a writer that finds more than
//! the dirty limit dirty or under write-back blocks until write-back catches up
//! (`balance_dirty_pages`). A `read()` of a page not in the cache starts a readahead window
//! (synchronously) and the next one (asynchronously) each time the reader reaches the first
//! page of a window it started, so one window is always in flight ahead of the reader.
//!
//! Write phases end with an `fsync()` of the file (bonnie++ 1.03 closes the file with
//! `fsync()` under `-b`, see docs/model/ipmmu-usb.md), so the timed phase includes the
//! write-back of everything it wrote; that fsync's journal commit (a few ms against the real
//! 8 GiB phase's tens of seconds) is left out, as on the lab's scaled-down file it would
//! weigh over a hundred times more than in the real run. Read phases start with a cold
//! cache: the real file is twice the RAM, so nothing
//! read sequentially is still cached when it is read again.
//!
//! CPU% is what bonnie reports: the process's CPU time (its own, the submission path of
//! the requests it submitted itself, plus interrupt time stolen while it ran, as tick
//! accounting charges it) over the phase's elapsed time.
//!
//! The device is any [`BlockQueue`]: the USB mass-storage model (its usb-storage thread
//! maps; the xHCI interrupt is stolen time, [`IrqCpu`]) or the lab's NVMe/SAS stack (the
//! submitting task maps, interrupts run on their vectors' CPUs).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use iolab_iommu::addr::PhysAddr;

use crate::block::{BlockCommand, BlockDir, BlockQueue, OnDone, Piece, QueueLimits, Request};
use crate::devices::usb::IrqCpu;
use crate::engine::{Completion, Ctx, Handle, Rng, SimDuration, SimTime};
use crate::{Account, SimError};

/// Page size of the page cache.
pub const PAGE: u64 = 4096;

/// The label of the page cache's random stream (where it allocates pages) among the run's
/// streams: [`derive_seed`](crate::engine::rng::derive_seed)`(seed, PAGE_CACHE_STREAM)`.
/// The tasks' own streams ([`Ctx::rng`]) come from the engine's per-task derivation.
pub const PAGE_CACHE_STREAM: u64 = u64::from_be_bytes(*b"pagecach");

/// The benchmark's parameters (sizes in bytes, costs in ns).
#[derive(Clone, Debug, PartialEq)]
pub struct BonnieConfig {
    /// Bytes of the file the sequential phases write and read (scaled down).
    pub file_bytes: u64,
    /// Bytes of the file as bonnie++ sizes it (`-s`): the seek range.
    pub logical_file_bytes: u64,
    /// bonnie's chunk (`write()`/`read()` size of the block phases).
    pub chunk: u64,
    /// The stdio buffer of the per-char phases.
    pub stdio_buffer: u64,
    /// Total seeks over all seekers (bonnie++ 1.03: 8000).
    pub seeks: u64,
    /// Seeker processes (bonnie++ 1.03: 3).
    pub seekers: usize,
    /// Each seeker's first seek and every this-many-th after it also writes its chunk back
    /// and, under `-b`, `fsync()`s it (bonnie++ 1.03: 10).
    pub seek_update_every: u64,
    /// Blocks an `fsync()` after an in-place overwrite logs in the journal besides the
    /// commit block (ext4/jbd2: a descriptor block and the inode-table block holding the
    /// new mtime). 0: no journal commit (and no cache flush).
    pub fsync_journal_blocks: u64,
    /// Cache flushes around the journal's commit block: 2 (a flush before it and one after,
    /// the block layer's emulation of FUA on a device without it), 1 (before it only: the
    /// device has FUA), 0 (the kernel treats the device's cache as write-through).
    pub fsync_commit_flushes: u64,
    /// CPU per byte of `putc` (user time).
    pub putc_ns_per_byte: f64,
    /// CPU per byte of `getc` (user time).
    pub getc_ns_per_byte: f64,
    /// Kernel CPU per page written by `write()` (page allocation, file system, dirty
    /// accounting), besides the copy.
    pub write_page_ns: u64,
    /// Kernel CPU per page `write()` finds already in the page cache (a rewrite's or a
    /// seek update's page, just read): the write path without the page allocation and LRU
    /// insertion, besides the copy.
    pub overwrite_page_ns: u64,
    /// Kernel CPU per page read by `read()` (readahead page allocation, LRU, lookup),
    /// besides the copy.
    pub read_page_ns: u64,
    /// Flusher CPU per page written back.
    pub writeback_page_ns: u64,
    /// One system call's entry and exit.
    pub syscall_ns: u64,
    /// `memcpy` bandwidth, bytes per ns.
    pub copy_bytes_per_ns: f64,
    /// Background write-back starts above this many dirty bytes.
    pub dirty_background: u64,
    /// Writers block above this many dirty and under-write-back bytes.
    pub dirty_limit: u64,
    /// Most bytes the flusher takes in one pass.
    pub writeback_chunk: u64,
    /// The readahead window.
    pub readahead: u64,
    /// Most requests the flusher keeps in flight.
    pub queue_depth: usize,
    /// The block queue's limits.
    pub limits: QueueLimits,
    /// Physical memory the page cache allocates from: `(base, bytes)` per bank, in address
    /// order. A page is drawn uniformly over all banks' pages (each bank in proportion to its
    /// size).
    pub ram_banks: Vec<(u64, u64)>,
    /// CPU of the bonnie process.
    pub bonnie_cpu: usize,
    /// CPU of the flusher thread.
    pub flusher_cpu: usize,
    /// CPUs of the seekers.
    pub seeker_cpus: Vec<usize>,
    /// Longest CPU slice between checks for interrupt time stolen, ns.
    pub slice_ns: u64,
    /// bonnie++'s file tests (`-n`), or `None` for `-n 0` (not run).
    pub file_tests: Option<FileTestConfig>,
}

/// bonnie++ 1.03's file tests (`-n N`, `bon_file.cpp`): N x 1024 empty files in one
/// directory, created, `stat()`ed and deleted, first in name order (the directory walked
/// with `readdir()` for stat and delete), then in random order. Under `-b` every create
/// `fsync()`s the new file and then the directory, and every `unlink()` `fsync()`s the
/// directory.
///
/// With ext4's journal, a create's file `fsync()` commits the running transaction (the
/// new inode and the directory entry: [`FileTestConfig::create_journal_blocks`]); the
/// directory's `fsync()` then finds its transaction committed and, with barriers on,
/// issues one more cache flush (`ext4_sync_file`: `jbd2_trans_will_send_data_barrier`
/// returns 0 for a committed transaction). An `unlink()`'s directory `fsync()` commits the
/// transaction holding the removal ([`FileTestConfig::delete_journal_blocks`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FileTestConfig {
    /// Files bonnie++ creates (`-n 16`: 16 x 1024): the count its too-fast rule applies to.
    pub files: u64,
    /// Files the lab creates, stats and deletes in each order (at most `files`; rates are
    /// per file, and a test's elapsed time is scaled by `files / files_run` for the rule).
    pub files_run: u64,
    /// Kernel CPU of one `open(O_CREAT | O_EXCL)` and `close()` of a new empty file, besides
    /// the system calls: path lookup, inode allocation, directory-entry insertion, journal
    /// handle.
    pub create_ns: u64,
    /// Kernel CPU of one `unlink()` of an empty file, besides the system call: entry
    /// removal, orphan list, inode freeing.
    pub unlink_ns: u64,
    /// Kernel CPU of one `stat()` of a cached file, besides the system call.
    pub stat_ns: u64,
    /// Kernel CPU per directory entry `readdir()` returns (the name-order tests).
    pub readdir_entry_ns: u64,
    /// Journal blocks a create's commit writes before its commit block (descriptor, inode
    /// bitmap, group descriptor, the new inode's table block, the directory block, the
    /// directory inode's table block).
    pub create_journal_blocks: u64,
    /// Journal blocks a delete's commit writes before its commit block (as a create's, plus
    /// the superblock: the orphan list).
    pub delete_journal_blocks: u64,
}

/// bonnie++'s `MinTime`: a test that took less than this is printed `+++++` (its %CPU
/// `+++`), too fast to measure.
pub const MIN_TIME_NS: u64 = 500_000_000;

/// The six file tests, in bonnie++'s CSV order.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FileTestResult {
    /// Create in name order.
    pub seq_create: PhaseResult,
    /// `stat()` in directory order.
    pub seq_stat: PhaseResult,
    /// Delete in directory order.
    pub seq_delete: PhaseResult,
    /// Create in random order.
    pub ran_create: PhaseResult,
    /// `stat()` in random order.
    pub ran_stat: PhaseResult,
    /// Delete in random order.
    pub ran_delete: PhaseResult,
    /// Files bonnie++ creates ([`FileTestConfig::files`]); each test ran `amount` of them.
    pub files: u64,
}

impl FileTestResult {
    /// The tests in bonnie++'s CSV order.
    pub fn tests(&self) -> [PhaseResult; 6] {
        [
            self.seq_create,
            self.seq_stat,
            self.seq_delete,
            self.ran_create,
            self.ran_stat,
            self.ran_delete,
        ]
    }

    /// Whether bonnie++ would print test `p` as `+++++`: its full-size run (the lab's
    /// elapsed time scaled from the `amount` files run to bonnie++'s `files`) took less
    /// than [`MIN_TIME_NS`].
    pub fn too_fast(&self, p: &PhaseResult) -> bool {
        let scale = self.files as f64 / p.amount.max(1.0);
        (p.elapsed_ns as f64 * scale) < MIN_TIME_NS as f64
    }
}

/// One phase's measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseResult {
    /// Bytes (or seeks) done.
    pub amount: f64,
    /// Elapsed virtual time, ns.
    pub elapsed_ns: u64,
    /// The process's CPU time, ns.
    pub cpu_ns: u64,
    /// The longest single operation of the phase, ns (bonnie++ 1.9x's latency column):
    /// one chunk of `putc` / `getc` calls, one block `write()` / `read()`, one rewrite
    /// (`read()`, `lseek()`, `write()`), one seek (`lseek()`, `read()` and, for a seeker's
    /// first seek and every tenth after it, the `write()` back and its `fsync()`, all inside
    /// bonnie++'s `doseek`). A write phase's closing `fsync()` is not an operation, as in
    /// bonnie++.
    pub max_op_ns: u64,
}

impl PhaseResult {
    /// KiB per second (bonnie's `K/sec`).
    pub fn kib_per_s(&self) -> f64 {
        self.amount / 1024.0 / (self.elapsed_ns.max(1) as f64 / 1e9)
    }

    /// Operations per second (seeks).
    pub fn per_s(&self) -> f64 {
        self.amount / (self.elapsed_ns.max(1) as f64 / 1e9)
    }

    /// CPU% as bonnie reports it.
    pub fn cpu_pct(&self) -> f64 {
        self.cpu_ns as f64 / self.elapsed_ns.max(1) as f64 * 100.0
    }
}

/// The six timed phases.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BonnieResult {
    /// Sequential output, per char.
    pub out_char: PhaseResult,
    /// Sequential output, block.
    pub out_block: PhaseResult,
    /// Sequential output, rewrite.
    pub rewrite: PhaseResult,
    /// Sequential input, per char.
    pub in_char: PhaseResult,
    /// Sequential input, block.
    pub in_block: PhaseResult,
    /// Random seeks (amount = seeks).
    pub seeks: PhaseResult,
    /// The file tests (amount = files), if run.
    pub files: Option<FileTestResult>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Page {
    Absent,
    Reading,
    Clean,
    Dirty,
    Writeback,
    WritebackRedirty,
}

/// Readahead state of one open file.
#[derive(Debug, Default)]
struct Readahead {
    next: usize,
    marker: Option<usize>,
}

struct Cache {
    state: Vec<Page>,
    pa: Vec<u64>,
    dirty: u64,
    writeback: u64,
    inflight: usize,
    cursor: usize,
    fsync: bool,
    waiters: Vec<Completion<()>>,
    rng: Rng,
    ra: Readahead,
}

type Shared = Rc<RefCell<Cache>>;

impl Cache {
    fn notify(&mut self) {
        for w in self.waiters.drain(..) {
            let _ = w.fire(());
        }
    }

    fn new_page(&mut self, banks: &[(u64, u64)], ram_pages: u64) -> u64 {
        page_address(banks, self.rng.below(ram_pages))
    }
}

/// The physical address of page `index` of the RAM made of `banks` (`(base, bytes)` each),
/// counting pages bank after bank. An index past the last page wraps to the first bank.
pub fn page_address(banks: &[(u64, u64)], index: u64) -> u64 {
    let total: u64 = banks.iter().map(|&(_, b)| b / PAGE).sum();
    let mut i = if total == 0 { 0 } else { index % total };
    for &(base, bytes) in banks {
        let n = bytes / PAGE;
        if i < n {
            return base + i * PAGE;
        }
        i -= n;
    }
    0
}

async fn wait_change(ctx: &Ctx, cache: &Shared) {
    let c = Completion::new(ctx.handle());
    cache.borrow_mut().waiters.push(c.clone());
    c.wait(ctx).await;
}

/// A simulated process: spends CPU in slices and pays interrupt time stolen while it ran.
struct Proc<'a> {
    ctx: &'a Ctx,
    irq: Option<Rc<IrqCpu>>,
    cpu_ns: Cell<u64>,
    slice: u64,
}

impl<'a> Proc<'a> {
    fn new(ctx: &'a Ctx, irq: &Rc<IrqCpu>, irq_cpu: usize, slice: u64) -> Self {
        let on_irq = ctx.cpu_id() == Some(irq_cpu);
        let irq = on_irq.then(|| irq.clone());
        if let Some(i) = &irq {
            i.set_running(true);
        }
        Proc {
            ctx,
            irq,
            cpu_ns: Cell::new(0),
            slice: slice.max(1),
        }
    }

    async fn spend(&self, ns: u64, account: Account) {
        let mut left = ns;
        while left > 0 {
            let s = left.min(self.slice);
            self.ctx.cpu().spend(SimDuration::ns(s), account).await;
            self.cpu_ns.set(self.cpu_ns.get() + s);
            left -= s;
            self.pay_stolen().await;
        }
    }

    async fn pay_stolen(&self) {
        if let Some(irq) = &self.irq {
            let st = irq.take_stolen();
            if st > 0 {
                self.ctx
                    .cpu()
                    .spend(SimDuration::ns(st), Account::System)
                    .await;
                self.cpu_ns.set(self.cpu_ns.get() + st);
            }
        }
    }

    /// Counts `ns` the process spent outside [`Proc::spend`] (a submission path).
    fn charge(&self, ns: u64) {
        self.cpu_ns.set(self.cpu_ns.get() + ns);
    }

    fn block(&self) {
        if let Some(i) = &self.irq {
            i.set_running(false);
        }
    }

    async fn unblock(&self) {
        if let Some(i) = &self.irq {
            i.set_running(true);
        }
        self.pay_stolen().await;
    }

    fn leave(&self) {
        self.block();
    }
}

/// Everything the phases share.
struct Env {
    cfg: BonnieConfig,
    dev: Box<dyn BlockQueue>,
    cache: Shared,
    irq: Rc<IrqCpu>,
    irq_cpu: usize,
    ram_pages: u64,
    /// Next free byte of the journal (a ring after the file's logical end).
    journal_cursor: Cell<u64>,
    /// The last progress reported, in thousandths of the whole suite.
    reported: Cell<u64>,
}

impl Env {
    /// The phases bonnie runs: five sequential ones, the seeks and, when set, the file tests.
    fn phases(&self) -> u64 {
        6 + u64::from(self.cfg.file_tests.is_some())
    }

    /// Tells a progress hook that phase `phase` (0-based) is `done` of `total` through, in
    /// thousandths of the suite, when that moved.
    fn progress(&self, phase: u64, done: u64, total: u64) {
        if !crate::progress::observed() {
            return;
        }
        let all = self.phases() * 1000;
        let at = phase * 1000 + done.saturating_mul(1000) / total.max(1);
        if at != self.reported.get() {
            self.reported.set(at);
            crate::progress::report_work(at.min(all), all, "bonnie's phases");
        }
    }

    fn copy_ns(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.cfg.copy_bytes_per_ns).round() as u64
    }

    /// Submits the pages `first..first + n` (all in one state: their physical addresses
    /// set) as block requests in direction `dir`, from the task of `ctx`. Returns the CPU
    /// time the submission path took on that task, ns.
    async fn submit(&self, ctx: &Ctx, dir: BlockDir, first: usize, n: usize) -> u64 {
        let pieces: Vec<Piece> = {
            let c = self.cache.borrow();
            (first..first + n)
                .map(|i| Piece {
                    pa: PhysAddr::new(c.pa[i]),
                    len: PAGE,
                })
                .collect()
        };
        let requests = self.cfg.limits.split(first as u64 * PAGE, &pieces);
        let count = requests.len();
        self.cache.borrow_mut().inflight += count;
        let t0 = ctx.now();
        for r in requests {
            let start = (r.offset / PAGE) as usize;
            let pages = (r.len() / PAGE) as usize;
            let cache = self.cache.clone();
            let on_done = Box::new(move || {
                let mut c = cache.borrow_mut();
                for i in start..start + pages {
                    match (dir, c.state[i]) {
                        (BlockDir::Read, Page::Reading) => c.state[i] = Page::Clean,
                        (BlockDir::Write, Page::Writeback) => {
                            c.state[i] = Page::Clean;
                            c.writeback -= 1;
                        }
                        (BlockDir::Write, Page::WritebackRedirty) => {
                            c.state[i] = Page::Dirty;
                            c.writeback -= 1;
                            c.dirty += 1;
                        }
                        _ => {}
                    }
                }
                c.inflight -= 1;
                c.notify();
            });
            self.send(ctx, dir, r, on_done).await;
        }
        elapsed(t0, ctx.now())
    }

    /// `n` fresh page-cache pages (placed as [`Cache::new_page`] places them), one piece
    /// each.
    fn fresh_pages(&self, n: u64) -> Vec<Piece> {
        let mut c = self.cache.borrow_mut();
        (0..n)
            .map(|_| Piece {
                pa: PhysAddr::new(c.new_page(&self.cfg.ram_banks, self.ram_pages)),
                len: PAGE,
            })
            .collect()
    }

    /// Hands request `r` to the device as one command in direction `dir`.
    async fn send(&self, ctx: &Ctx, dir: BlockDir, r: Request, on_done: OnDone) {
        let cmd = BlockCommand {
            dir,
            offset: r.offset,
            pieces: r.pieces,
            on_done,
        };
        self.dev.submit(ctx, cmd).await;
    }

    /// Starts a readahead of up to `window` absent pages from `first`; returns the CPU time
    /// of its submission, ns.
    async fn readahead(&self, ctx: &Ctx, first: usize, window: usize) -> u64 {
        let end = {
            let mut c = self.cache.borrow_mut();
            let npages = c.state.len();
            let mut end = first;
            while end < npages && end < first + window && c.state[end] == Page::Absent {
                let pa = c.new_page(&self.cfg.ram_banks, self.ram_pages);
                c.pa[end] = pa;
                c.state[end] = Page::Reading;
                end += 1;
            }
            end
        };
        if end > first {
            self.submit(ctx, BlockDir::Read, first, end - first).await
        } else {
            0
        }
    }

    /// `read()` of `bytes` at `offset` through the page cache.
    async fn read(&self, p: &Proc<'_>, offset: u64, bytes: u64) {
        let window = (self.cfg.readahead / PAGE).max(1) as usize;
        let first = (offset / PAGE) as usize;
        let last = ((offset + bytes - 1) / PAGE) as usize;
        p.spend(self.cfg.syscall_ns, Account::System).await;
        for page in first..=last {
            let (absent, marker) = {
                let c = self.cache.borrow();
                (c.state[page] == Page::Absent, c.ra.marker == Some(page))
            };
            if absent {
                p.charge(self.readahead(p.ctx, page, window).await);
                let mut c = self.cache.borrow_mut();
                c.ra.next = page + window;
                c.ra.marker = Some(page);
            }
            if absent || marker {
                let next = self.cache.borrow().ra.next;
                if next < self.cache.borrow().state.len() {
                    p.charge(self.readahead(p.ctx, next, window).await);
                    let mut c = self.cache.borrow_mut();
                    c.ra.marker = Some(next);
                    c.ra.next = next + window;
                }
            }
            loop {
                let st = self.cache.borrow().state[page];
                if st != Page::Reading {
                    break;
                }
                p.block();
                wait_change(p.ctx, &self.cache).await;
                p.unblock().await;
            }
            p.spend(self.cfg.read_page_ns, Account::System).await;
        }
        p.spend(self.copy_ns(bytes), Account::System).await;
    }

    /// `write()` of `bytes` at `offset` into the page cache, then `balance_dirty_pages`.
    /// A page not in the cache costs `write_page_ns`, one already there (a rewrite's page,
    /// just read) `overwrite_page_ns`.
    async fn write(&self, p: &Proc<'_>, offset: u64, bytes: u64) {
        let first = (offset / PAGE) as usize;
        let last = ((offset + bytes - 1) / PAGE) as usize;
        let new_pages = {
            let c = self.cache.borrow();
            (first..=last)
                .filter(|&i| c.state[i] == Page::Absent)
                .count() as u64
        };
        let cached_pages = (last - first + 1) as u64 - new_pages;
        p.spend(
            self.cfg.syscall_ns
                + self.copy_ns(bytes)
                + new_pages * self.cfg.write_page_ns
                + cached_pages * self.cfg.overwrite_page_ns,
            Account::System,
        )
        .await;
        {
            let mut c = self.cache.borrow_mut();
            for page in first..=last {
                match c.state[page] {
                    Page::Absent => {
                        let pa = c.new_page(&self.cfg.ram_banks, self.ram_pages);
                        c.pa[page] = pa;
                        c.state[page] = Page::Dirty;
                        c.dirty += 1;
                    }
                    Page::Clean => {
                        c.state[page] = Page::Dirty;
                        c.dirty += 1;
                    }
                    Page::Writeback => c.state[page] = Page::WritebackRedirty,
                    Page::Dirty | Page::WritebackRedirty | Page::Reading => {}
                }
            }
            if c.dirty * PAGE > self.cfg.dirty_background {
                c.notify();
            }
        }
        loop {
            let over = {
                let c = self.cache.borrow();
                (c.dirty + c.writeback) * PAGE > self.cfg.dirty_limit
            };
            if !over {
                break;
            }
            p.block();
            wait_change(p.ctx, &self.cache).await;
            p.unblock().await;
        }
    }

    /// `fsync()`: asks the flusher for everything and waits for it.
    async fn fsync(&self, p: &Proc<'_>) {
        p.spend(self.cfg.syscall_ns, Account::System).await;
        {
            let mut c = self.cache.borrow_mut();
            c.fsync = true;
            c.notify();
        }
        loop {
            let done = {
                let c = self.cache.borrow();
                c.dirty == 0 && c.writeback == 0
            };
            if done {
                break;
            }
            p.block();
            wait_change(p.ctx, &self.cache).await;
            p.unblock().await;
        }
        self.cache.borrow_mut().fsync = false;
    }

    /// Drops every clean page (a cold cache) and resets readahead.
    fn evict(&self) {
        let mut c = self.cache.borrow_mut();
        for s in c.state.iter_mut() {
            if *s == Page::Clean {
                *s = Page::Absent;
            }
        }
        c.ra = Readahead::default();
    }

    /// Drops every page (a new file).
    fn truncate(&self) {
        let mut c = self.cache.borrow_mut();
        for s in c.state.iter_mut() {
            *s = Page::Absent;
        }
        c.ra = Readahead::default();
        c.cursor = 0;
    }
}

/// The flusher thread: writes dirty pages back in file order.
async fn flusher(ctx: Ctx, env: Rc<Env>) {
    let chunk_pages = (env.cfg.writeback_chunk / PAGE).max(1) as usize;
    loop {
        let (want, busy) = {
            let c = env.cache.borrow();
            let want = c.dirty > 0 && (c.fsync || c.dirty * PAGE > env.cfg.dirty_background);
            (want, c.inflight >= env.cfg.queue_depth)
        };
        if !want || busy {
            wait_change(&ctx, &env.cache).await;
            continue;
        }
        // The next run of dirty pages from the cursor (wrapping once).
        let run = {
            let mut c = env.cache.borrow_mut();
            let n = c.state.len();
            let mut start = None;
            for k in 0..n {
                let i = (c.cursor + k) % n;
                if c.state[i] == Page::Dirty {
                    start = Some(i);
                    break;
                }
            }
            start.map(|s| {
                let mut e = s;
                while e < n && e < s + chunk_pages && c.state[e] == Page::Dirty {
                    c.state[e] = Page::Writeback;
                    e += 1;
                }
                let len = e - s;
                c.dirty -= len as u64;
                c.writeback += len as u64;
                c.cursor = e % n;
                (s, len)
            })
        };
        let Some((start, len)) = run else {
            wait_change(&ctx, &env.cache).await;
            continue;
        };
        ctx.cpu()
            .spend(
                SimDuration::ns(len as u64 * env.cfg.writeback_page_ns),
                Account::System,
            )
            .await;
        env.submit(&ctx, BlockDir::Write, start, len).await;
    }
}

fn elapsed(from: SimTime, to: SimTime) -> u64 {
    to.saturating_since(from).as_ns()
}

/// The result of a sequential phase over the whole file that started at `t0` with the
/// process's CPU counter at `c0`.
fn sequential_result(env: &Env, p: &Proc<'_>, t0: SimTime, c0: u64, ops: &OpTimer) -> PhaseResult {
    PhaseResult {
        amount: env.cfg.file_bytes as f64,
        elapsed_ns: elapsed(t0, p.ctx.now()),
        cpu_ns: p.cpu_ns.get() - c0,
        max_op_ns: ops.max_ns,
    }
}

/// The longest operation of a phase (bonnie++ 1.9x's `Duration::getMax`): an observer of
/// virtual time only, so measuring changes no result.
#[derive(Default)]
struct OpTimer {
    start: Option<SimTime>,
    max_ns: u64,
}

impl OpTimer {
    fn start(&mut self, now: SimTime) {
        self.start = Some(now);
    }

    fn stop(&mut self, now: SimTime) {
        if let Some(t) = self.start.take() {
            self.max_ns = self.max_ns.max(elapsed(t, now));
        }
    }
}

/// The five sequential phases, in bonnie++'s order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sequential {
    /// putc() one stdio buffer at a time into an empty file.
    OutChar,
    /// write() a chunk at a time into an empty file.
    OutBlock,
    /// read() a chunk, change it, lseek() back and write() it.
    Rewrite,
    /// getc() one stdio buffer at a time.
    InChar,
    /// read() a chunk at a time.
    InBlock,
}

/// One sequential phase over the whole file. The output phases start from an empty file,
/// the others from an empty page cache; the per-character phases step a stdio buffer at a
/// time, the others a chunk. bonnie++ 1.9x times one chunk of work as one operation (a
/// chunk step starts and ends a chunk, so each is timed alone). The phases that write end
/// with fsync().
async fn sequential(env: &Env, p: &Proc<'_>, phase: Sequential) -> PhaseResult {
    use Sequential::*;
    if matches!(phase, OutChar | OutBlock) {
        env.truncate();
    } else {
        env.evict();
    }
    let t0 = p.ctx.now();
    let c0 = p.cpu_ns.get();
    let (file, chunk) = (env.cfg.file_bytes, env.cfg.chunk);
    let step = if matches!(phase, OutChar | InChar) {
        env.cfg.stdio_buffer
    } else {
        chunk
    };
    let per_byte = |n: u64, ns_per_byte: f64| (n as f64 * ns_per_byte).round() as u64;
    let mut ops = OpTimer::default();
    let mut off = 0;
    while off < file {
        let n = step.min(file - off);
        if off % chunk == 0 {
            ops.start(p.ctx.now());
        }
        match phase {
            OutChar => {
                let putc = per_byte(n, env.cfg.putc_ns_per_byte);
                p.spend(putc, Account::User).await;
                env.write(p, off, n).await;
            }
            OutBlock => env.write(p, off, n).await,
            Rewrite => {
                env.read(p, off, n).await;
                // Change the chunk, lseek() back.
                p.spend(env.cfg.syscall_ns, Account::System).await;
                env.write(p, off, n).await;
            }
            InChar => {
                env.read(p, off, n).await;
                let getc = per_byte(n, env.cfg.getc_ns_per_byte);
                p.spend(getc, Account::User).await;
            }
            InBlock => env.read(p, off, n).await,
        }
        off += n;
        if off % chunk == 0 || off >= file {
            ops.stop(p.ctx.now());
        }
        env.progress(phase as u64, off, file);
    }
    if matches!(phase, OutChar | OutBlock | Rewrite) {
        env.fsync(p).await;
    }
    sequential_result(env, p, t0, c0, &ops)
}

/// What the seekers share.
struct SeekShared {
    /// Seek tickets left: bonnie++ 1.03 writes one ticket per seek into a pipe and the
    /// next free seeker reads the next one.
    tickets: Cell<u64>,
    /// The chunks read so far (first page -> the chunk's page-cache pages): a chunk read
    /// again is a cache hit (the seek phase's reads stay cached: 8000 chunks of 8 KiB).
    cached: RefCell<BTreeMap<u64, Vec<Piece>>>,
}

/// Size of the journal ring fsync's commits write into (ext4's default journal for a
/// file system of this size is 128 MiB; only the offsets' spread depends on it).
const JOURNAL_BYTES: u64 = 128 << 20;

/// Submits `pieces` as `dir` requests at `offset` from the task of `ctx` and returns a
/// completion that fires when the last one is done, with the CPU time the submission
/// path took on that task, ns.
async fn submit_and_count(
    env: &Env,
    ctx: &Ctx,
    dir: BlockDir,
    offset: u64,
    pieces: &[Piece],
) -> (Completion<()>, u64) {
    let done: Completion<()> = Completion::new(ctx.handle());
    let requests = env.cfg.limits.split(offset, pieces);
    let left = Rc::new(Cell::new(requests.len()));
    if requests.is_empty() {
        let _ = done.fire(());
    }
    let t0 = ctx.now();
    for r in requests {
        let fire = done.clone();
        let left = left.clone();
        let on_done = Box::new(move || {
            left.set(left.get() - 1);
            if left.get() == 0 {
                let _ = fire.fire(());
            }
        });
        env.send(ctx, dir, r, on_done).await;
    }
    (done, elapsed(t0, ctx.now()))
}

/// A cache flush from the task of `ctx`; returns its completion.
async fn flush_device(env: &Env, ctx: &Ctx) -> Completion<()> {
    let done: Completion<()> = Completion::new(ctx.handle());
    let fire = done.clone();
    env.dev
        .flush(
            ctx,
            Box::new(move || {
                let _ = fire.fire(());
            }),
        )
        .await;
    done
}

/// The journal commit of an `fsync()` (jbd2, on the flusher's CPU, without async commit):
/// the journal blocks, waited for; then the commit block with a flush before it and,
/// without FUA, one after it, each step waiting for the previous (the block layer's flush
/// sequence).
async fn journal_commit(ctx: &Ctx, env: &Env, blocks: u64) {
    if blocks == 0 {
        return;
    }
    let at = |n: u64| {
        let c = env.journal_cursor.get();
        let c = if c + n * PAGE > JOURNAL_BYTES { 0 } else { c };
        env.journal_cursor.set(c + n * PAGE);
        env.cfg.logical_file_bytes + c
    };
    let log = env.fresh_pages(blocks);
    let (done, _) = submit_and_count(env, ctx, BlockDir::Write, at(blocks), &log).await;
    done.wait(ctx).await;
    if env.cfg.fsync_commit_flushes >= 1 {
        flush_device(env, ctx).await.wait(ctx).await;
    }
    let commit = env.fresh_pages(1);
    let (done, _) = submit_and_count(env, ctx, BlockDir::Write, at(1), &commit).await;
    done.wait(ctx).await;
    if env.cfg.fsync_commit_flushes >= 2 {
        flush_device(env, ctx).await.wait(ctx).await;
    }
}

/// `fsync()` after a seek's update (bonnie++ `-b`): the chunk's dirty pages are written
/// and waited for in the caller's context (`filemap_write_and_wait_range`), then the
/// journal commits the inode's new mtime on the flusher's CPU (the jbd2 thread) while the
/// caller sleeps.
async fn fsync_update(
    env: &Rc<Env>,
    p: &Proc<'_>,
    offset: u64,
    pieces: &[Piece],
) -> Result<(), SimError> {
    p.spend(env.cfg.syscall_ns, Account::System).await;
    let (written, submit_ns) = submit_and_count(env, p.ctx, BlockDir::Write, offset, pieces).await;
    p.charge(submit_ns);
    p.block();
    written.wait(p.ctx).await;
    commit_and_wait(env, p, env.cfg.fsync_journal_blocks).await?;
    p.unblock().await;
    Ok(())
}

/// Runs a journal commit of `blocks` blocks on the flusher's CPU (the jbd2 thread) and
/// waits for it; the caller is blocked (see [`Proc::block`]) meanwhile.
async fn commit_and_wait(env: &Rc<Env>, p: &Proc<'_>, blocks: u64) -> Result<(), SimError> {
    let committed: Completion<()> = Completion::new(p.ctx.handle());
    let fire = committed.clone();
    let env2 = env.clone();
    p.ctx.spawn_on(env.cfg.flusher_cpu, move |ctx| async move {
        journal_commit(&ctx, &env2, blocks).await;
        let _ = fire.fire(());
    })?;
    committed.wait(p.ctx).await;
    Ok(())
}

/// One seeker: takes seek tickets until none is left; each a random chunk read of the
/// whole logical file. Returns the seeker's CPU time and its longest seek, ns.
async fn seeker(ctx: Ctx, env: Rc<Env>, shared: Rc<SeekShared>) -> Result<(u64, u64), SimError> {
    let p = Proc::new(&ctx, &env.irq, env.irq_cpu, env.cfg.slice_ns);
    let chunks = (env.cfg.logical_file_bytes / env.cfg.chunk).max(1);
    let pages_per_chunk = (env.cfg.chunk / PAGE).max(1);
    let mut ops = OpTimer::default();
    let mut lseek_count = 0u64;
    while shared.tickets.get() > 0 {
        shared.tickets.set(shared.tickets.get() - 1);
        env.progress(5, env.cfg.seeks - shared.tickets.get(), env.cfg.seeks);
        ops.start(ctx.now());
        // bonnie++ 1.03: `if ((lseek_count++ % UpdateSeek) == 0) update = true`.
        let update = lseek_count % env.cfg.seek_update_every.max(1) == 0;
        lseek_count += 1;
        let chunk = ctx.rng().below(chunks);
        // lseek() and read().
        p.spend(2 * env.cfg.syscall_ns, Account::System).await;
        let first_page = chunk * pages_per_chunk;
        let cached = shared.cached.borrow().get(&first_page).cloned();
        let pieces = match cached {
            Some(pieces) => pieces,
            None => {
                let pieces = env.fresh_pages(pages_per_chunk);
                let (done, submit_ns) =
                    submit_and_count(&env, &ctx, BlockDir::Read, first_page * PAGE, &pieces).await;
                p.charge(submit_ns);
                p.block();
                done.wait(&ctx).await;
                p.unblock().await;
                shared
                    .cached
                    .borrow_mut()
                    .insert(first_page, pieces.clone());
                pieces
            }
        };
        p.spend(
            pages_per_chunk * env.cfg.read_page_ns + env.copy_ns(env.cfg.chunk),
            Account::System,
        )
        .await;
        if update {
            // Change the chunk, lseek() back, write() it, then fsync() (-b).
            p.spend(
                2 * env.cfg.syscall_ns
                    + env.copy_ns(env.cfg.chunk)
                    + pages_per_chunk * env.cfg.overwrite_page_ns,
                Account::System,
            )
            .await;
            fsync_update(&env, &p, first_page * PAGE, &pieces).await?;
        }
        ops.stop(ctx.now());
    }
    p.leave();
    Ok((p.cpu_ns.get(), ops.max_ns))
}

async fn phase_seeks(env: &Rc<Env>, p: &Proc<'_>) -> Result<PhaseResult, SimError> {
    let t0 = p.ctx.now();
    let n = env.cfg.seekers.max(1);
    let shared = Rc::new(SeekShared {
        tickets: Cell::new(env.cfg.seeks),
        cached: RefCell::new(BTreeMap::new()),
    });
    let mut dones = Vec::new();
    for k in 0..n {
        let cpu = env.cfg.seeker_cpus[k % env.cfg.seeker_cpus.len()];
        let done: Completion<Result<(u64, u64), SimError>> = Completion::new(p.ctx.handle());
        let fire = done.clone();
        let env2 = env.clone();
        let shared2 = shared.clone();
        p.ctx.spawn_on(cpu, move |ctx| async move {
            let out = seeker(ctx, env2, shared2).await;
            let _ = fire.fire(out);
        })?;
        dones.push(done);
    }
    p.block();
    let mut cpu = 0;
    let mut max_op_ns = 0;
    for d in &dones {
        let (c, m) = d.wait(p.ctx).await?;
        cpu += c;
        max_op_ns = max_op_ns.max(m);
    }
    p.unblock().await;
    env.progress(5, 1, 1);
    Ok(PhaseResult {
        amount: env.cfg.seeks as f64,
        elapsed_ns: elapsed(t0, p.ctx.now()),
        cpu_ns: cpu,
        max_op_ns,
    })
}

/// The file tests' operations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FileOp {
    Create,
    Stat,
    Delete,
}

/// One file test: `files_run` operations `op` from bonnie's process, in name order
/// (`walk`: stat and delete read the directory with `readdir()`) or in random order. The
/// order does not change an operation's cost in the model (one directory block per
/// operation either way).
async fn file_test(
    env: &Rc<Env>,
    p: &Proc<'_>,
    ft: &FileTestConfig,
    op: FileOp,
    walk: bool,
) -> Result<PhaseResult, SimError> {
    let cfg = &env.cfg;
    let barriers = cfg.fsync_commit_flushes >= 1;
    let t0 = p.ctx.now();
    let c0 = p.cpu_ns.get();
    let mut ops = OpTimer::default();
    let readdir_ns = if walk && op != FileOp::Create {
        ft.readdir_entry_ns
    } else {
        0
    };
    for _ in 0..ft.files_run {
        ops.start(p.ctx.now());
        match op {
            FileOp::Create => {
                // open(O_CREAT | O_EXCL); fsync(fd): the commit of the new inode and entry.
                p.spend(2 * cfg.syscall_ns + ft.create_ns, Account::System)
                    .await;
                p.block();
                commit_and_wait(env, p, ft.create_journal_blocks).await?;
                p.unblock().await;
                // fsync(dir): its transaction is committed, so only a cache flush; close().
                p.spend(2 * cfg.syscall_ns, Account::System).await;
                if barriers {
                    p.block();
                    flush_device(env, p.ctx).await.wait(p.ctx).await;
                    p.unblock().await;
                }
            }
            FileOp::Stat => {
                p.spend(cfg.syscall_ns + ft.stat_ns + readdir_ns, Account::System)
                    .await;
            }
            FileOp::Delete => {
                // unlink(); fsync(dir): the commit of the removal.
                p.spend(
                    2 * cfg.syscall_ns + ft.unlink_ns + readdir_ns,
                    Account::System,
                )
                .await;
                p.block();
                commit_and_wait(env, p, ft.delete_journal_blocks).await?;
                p.unblock().await;
            }
        }
        ops.stop(p.ctx.now());
    }
    Ok(PhaseResult {
        amount: ft.files_run as f64,
        elapsed_ns: elapsed(t0, p.ctx.now()),
        cpu_ns: p.cpu_ns.get() - c0,
        max_op_ns: ops.max_ns,
    })
}

/// bonnie++'s file tests in its order: create, stat, delete by name, then at random.
async fn file_tests(
    env: &Rc<Env>,
    p: &Proc<'_>,
    ft: &FileTestConfig,
) -> Result<FileTestResult, SimError> {
    let run = |k: u64| env.progress(6, k, 6);
    let seq_create = file_test(env, p, ft, FileOp::Create, true).await?;
    run(1);
    let seq_stat = file_test(env, p, ft, FileOp::Stat, true).await?;
    run(2);
    let seq_delete = file_test(env, p, ft, FileOp::Delete, true).await?;
    run(3);
    let ran_create = file_test(env, p, ft, FileOp::Create, false).await?;
    run(4);
    let ran_stat = file_test(env, p, ft, FileOp::Stat, false).await?;
    run(5);
    let ran_delete = file_test(env, p, ft, FileOp::Delete, false).await?;
    run(6);
    Ok(FileTestResult {
        seq_create,
        seq_stat,
        seq_delete,
        ran_create,
        ran_stat,
        ran_delete,
        files: ft.files,
    })
}

/// Starts bonnie (and its flusher) on `dev`. Interrupt time `irq` records on CPU `irq_cpu`
/// is stolen from a bonnie process running there (a CPU no process runs on, such as
/// `usize::MAX`, steals nothing). The result appears in the returned cell when the
/// simulation has run to its end.
pub fn start(
    h: &Handle,
    cfg: BonnieConfig,
    dev: impl BlockQueue + 'static,
    irq: Rc<IrqCpu>,
    irq_cpu: usize,
    seed: u64,
) -> Result<Rc<RefCell<Option<BonnieResult>>>, SimError> {
    let npages = cfg.file_bytes.div_ceil(PAGE) as usize;
    let ram_pages = cfg
        .ram_banks
        .iter()
        .map(|&(_, bytes)| bytes / PAGE)
        .sum::<u64>()
        .max(1);
    let cache = Rc::new(RefCell::new(Cache {
        state: vec![Page::Absent; npages],
        pa: vec![0; npages],
        dirty: 0,
        writeback: 0,
        inflight: 0,
        cursor: 0,
        fsync: false,
        waiters: Vec::new(),
        rng: Rng::seed_from_u64(crate::engine::rng::derive_seed(seed, PAGE_CACHE_STREAM)),
        ra: Readahead::default(),
    }));
    let bonnie_cpu = cfg.bonnie_cpu;
    let flusher_cpu = cfg.flusher_cpu;
    let env = Rc::new(Env {
        cfg,
        dev: Box::new(dev),
        cache,
        irq,
        irq_cpu,
        ram_pages,
        journal_cursor: Cell::new(0),
        reported: Cell::new(u64::MAX),
    });
    let out = Rc::new(RefCell::new(None));
    let env_f = env.clone();
    h.spawn_on(flusher_cpu, move |ctx| flusher(ctx, env_f))?;
    let out2 = out.clone();
    h.spawn_on(bonnie_cpu, move |ctx| async move {
        let p = Proc::new(&ctx, &env.irq, env.irq_cpu, env.cfg.slice_ns);
        let out_char = sequential(&env, &p, Sequential::OutChar).await;
        let out_block = sequential(&env, &p, Sequential::OutBlock).await;
        let rewrite = sequential(&env, &p, Sequential::Rewrite).await;
        let in_char = sequential(&env, &p, Sequential::InChar).await;
        let in_block = sequential(&env, &p, Sequential::InBlock).await;
        let seeks = match phase_seeks(&env, &p).await {
            Ok(s) => s,
            Err(_) => return,
        };
        let files = match &env.cfg.file_tests {
            Some(ft) => match file_tests(&env, &p, ft).await {
                Ok(f) => Some(f),
                Err(_) => return,
            },
            None => None,
        };
        p.leave();
        *out2.borrow_mut() = Some(BonnieResult {
            out_char,
            out_block,
            rewrite,
            in_char,
            in_block,
            seeks,
            files,
        });
    })?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// bonnie++ 1.03 CSV
// ---------------------------------------------------------------------------------------

/// The measured phases in bonnie++'s CSV order (per-char and block output, rewrite, per-char
/// and block input, random seeks): the metric stem of each phase (`<phase>_kps`,
/// `<phase>_cpu_pct`, ...).
pub const PHASES: [&str; 6] = [
    "out_char",
    "out_block",
    "rewrite",
    "in_char",
    "in_block",
    "seeks",
];

/// The columns of a bonnie++ 1.03 CSV row, in bonnie's order.
pub const CSV_COLUMNS: [&str; 27] = [
    "name",
    "size",
    "putc_kps",
    "putc_cpu",
    "write_kps",
    "write_cpu",
    "rewrite_kps",
    "rewrite_cpu",
    "getc_kps",
    "getc_cpu",
    "read_kps",
    "read_cpu",
    "seeks_per_s",
    "seeks_cpu",
    "files",
    "seq_create",
    "seq_create_cpu",
    "seq_read",
    "seq_read_cpu",
    "seq_delete",
    "seq_delete_cpu",
    "ran_create",
    "ran_create_cpu",
    "ran_read",
    "ran_read_cpu",
    "ran_delete",
    "ran_delete_cpu",
];

/// The twelve sequential and seek values of a row (K/s and %CPU per phase, seeks/s and
/// %CPU) and the file tests' columns, if run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CsvValues {
    /// putc K/s, %CPU, write K/s, %CPU, rewrite K/s, %CPU, getc K/s, %CPU, read K/s, %CPU,
    /// seeks/s, %CPU.
    pub v: [f64; 12],
    /// The file tests, or `None` when they were not run (`-n 0`).
    pub files: Option<FileValues>,
}

/// The file tests' columns of a row, per test in bonnie++'s order (sequential create,
/// stat, delete, random create, stat, delete).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FileValues {
    /// bonnie++'s `-n`: files in units of 1024 (the `files` column).
    pub files_k: u64,
    /// Files per second, `None` where the value is not known (a published row that gives
    /// only some of them).
    pub rate: [Option<f64>; 6],
    /// %CPU, `None` where not known.
    pub cpu: [Option<f64>; 6],
    /// Too fast to measure (bonnie++ prints `+++++` and `+++`).
    pub too_fast: [bool; 6],
}

/// The file tests in bonnie++'s CSV order, as metric stems (`bonnie.<test>_per_s`,
/// `bonnie.<test>_cpu_pct`; the stat tests keep bonnie++ 1.03's column name, `read`).
pub const FILE_PHASES: [&str; 6] = [
    "seq_create",
    "seq_read",
    "seq_delete",
    "ran_create",
    "ran_read",
    "ran_delete",
];

impl FileValues {
    /// The known values as metrics (`bonnie.<test>_per_s` in /sec, `bonnie.<test>_cpu_pct`
    /// in %), without the tests too fast to measure (bonnie++ prints no number for them).
    pub fn metrics(&self) -> Vec<crate::metrics::Metric> {
        use crate::metrics::Metric;
        let mut out = Vec::new();
        for (i, phase) in FILE_PHASES.iter().enumerate() {
            if self.too_fast[i] {
                continue;
            }
            if let Some(r) = self.rate[i] {
                out.push(Metric::new(format!("bonnie.{phase}_per_s"), "/sec", r));
            }
            if let Some(c) = self.cpu[i] {
                out.push(Metric::new(format!("bonnie.{phase}_cpu_pct"), "%", c));
            }
        }
        out
    }

    /// The columns of a lab result.
    pub fn from_result(f: &FileTestResult) -> Self {
        let mut v = FileValues {
            files_k: f.files / 1024,
            ..Default::default()
        };
        for (i, p) in f.tests().iter().enumerate() {
            v.rate[i] = Some(p.per_s());
            v.cpu[i] = Some(p.cpu_pct());
            v.too_fast[i] = f.too_fast(p);
        }
        v
    }

    /// The 12 file-test columns as bonnie++ prints them: `+++++` and `+++` for a test too
    /// fast to measure, empty for a value not known, else `fmt` of the value.
    pub fn columns(&self, fmt: impl Fn(f64) -> String) -> Vec<String> {
        let mut cols = Vec::with_capacity(12);
        for i in 0..6 {
            if self.too_fast[i] {
                cols.push("+++++".to_owned());
                cols.push("+++".to_owned());
            } else {
                cols.push(self.rate[i].map(&fmt).unwrap_or_default());
                cols.push(self.cpu[i].map(&fmt).unwrap_or_default());
            }
        }
        cols
    }
}

impl CsvValues {
    /// The values of a lab result (the file tests' `files` column from the result's own
    /// count, in units of 1024).
    pub fn from_result(r: &BonnieResult) -> Self {
        let ph = [r.out_char, r.out_block, r.rewrite, r.in_char, r.in_block];
        let mut v = [0.0; 12];
        for (i, p) in ph.iter().enumerate() {
            v[2 * i] = p.kib_per_s();
            v[2 * i + 1] = p.cpu_pct();
        }
        v[10] = r.seeks.per_s();
        v[11] = r.seeks.cpu_pct();
        let files = r.files.as_ref().map(FileValues::from_result);
        Self { v, files }
    }

    /// The mean of the rows of repeated runs: every value averaged (file tests over the
    /// rows that have them; too fast where the last such row was).
    pub fn mean(rows: &[CsvValues]) -> Self {
        let n = rows.len().max(1) as f64;
        let mut out = CsvValues::default();
        for r in rows {
            for i in 0..12 {
                out.v[i] += r.v[i] / n;
            }
        }
        let with_files: Vec<&FileValues> = rows.iter().filter_map(|r| r.files.as_ref()).collect();
        if let Some(last) = with_files.last() {
            let k = with_files.len() as f64;
            let mut f = FileValues {
                files_k: last.files_k,
                too_fast: last.too_fast,
                ..Default::default()
            };
            for i in 0..6 {
                let rates = with_files.iter().map(|x| x.rate[i]);
                f.rate[i] = rates.sum::<Option<f64>>().map(|s| s / k);
                let cpus = with_files.iter().map(|x| x.cpu[i]);
                f.cpu[i] = cpus.sum::<Option<f64>>().map(|s| s / k);
            }
            out.files = Some(f);
        }
        out
    }
}

/// A bonnie++ 1.03 CSV row: K/s and %CPU as integers, seeks/s with one decimal; the file
/// tests' files/s and %CPU as integers, `+++++` and `+++` for a test that took less than
/// bonnie++'s `MinTime`, all 13 file columns empty when they were not run (`-n 0`).
pub fn csv_row(name: &str, size: &str, v: &CsvValues) -> String {
    let mut cols: Vec<String> = vec![name.to_owned(), size.to_owned()];
    for i in 0..5 {
        cols.push(format!("{:.0}", v.v[2 * i]));
        cols.push(format!("{:.0}", v.v[2 * i + 1]));
    }
    cols.push(format!("{:.1}", v.v[10]));
    cols.push(format!("{:.0}", v.v[11]));
    match &v.files {
        Some(f) => {
            cols.push(f.files_k.to_string());
            cols.extend(f.columns(|x| format!("{x:.0}")));
        }
        None => cols.extend(std::iter::repeat(String::new()).take(13)),
    }
    cols.join(",")
}

// ---------------------------------------------------------------------------------------
// bonnie++ 1.98 / 2.00 CSV
// ---------------------------------------------------------------------------------------

/// The CSV layouts the lab prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CsvLayout {
    /// bonnie++ 1.03: 27 columns, starting with the machine name ([`csv_row`]).
    #[default]
    V103,
    /// bonnie++ 1.98 / 2.00: 50 columns, starting with the format version, ending with the
    /// 12 latency columns ([`csv_row_198`]).
    V198,
}

impl CsvLayout {
    /// The names a scenario gives the layouts (`[workload] csv`).
    pub const NAMES: [&'static str; 2] = ["1.03", "1.98"];

    /// The layout named `name` (one of [`CsvLayout::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "1.03" => Some(Self::V103),
            "1.98" => Some(Self::V198),
            _ => None,
        }
    }

    /// The layout's name, as in [`CsvLayout::NAMES`].
    pub fn name(self) -> &'static str {
        match self {
            Self::V103 => "1.03",
            Self::V198 => "1.98",
        }
    }
}

/// The columns of a bonnie++ 1.98 CSV row, in bonnie's order (the header `bonnie++` prints
/// with `-q`, as `bon_csv2txt` of bonnie++ 1.98 / 2.00 reads it).
pub const CSV_198_COLUMNS: [&str; 50] = [
    "format_version",
    "bonnie_version",
    "name",
    "concurrency",
    "seed",
    "file_size",
    "chunk_size",
    "seeks",
    "seek_proc_count",
    "putc",
    "putc_cpu",
    "put_block",
    "put_block_cpu",
    "rewrite",
    "rewrite_cpu",
    "getc",
    "getc_cpu",
    "get_block",
    "get_block_cpu",
    "seeks",
    "seeks_cpu",
    "num_files",
    "max_size",
    "min_size",
    "num_dirs",
    "file_chunk_size",
    "seq_create",
    "seq_create_cpu",
    "seq_stat",
    "seq_stat_cpu",
    "seq_del",
    "seq_del_cpu",
    "ran_create",
    "ran_create_cpu",
    "ran_stat",
    "ran_stat_cpu",
    "ran_del",
    "ran_del_cpu",
    "putc_latency",
    "put_block_latency",
    "rewrite_latency",
    "getc_latency",
    "get_block_latency",
    "seeks_latency",
    "seq_create_latency",
    "seq_stat_latency",
    "seq_del_latency",
    "ran_create_latency",
    "ran_stat_latency",
    "ran_del_latency",
];

/// bonnie++'s default chunk size: its CSV leaves the chunk column empty for it.
pub const BONNIE_DEFAULT_CHUNK: u64 = 8192;

/// What a 1.98 row says besides the results: the run's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Csv198Params<'a> {
    /// The machine name column (`-m`).
    pub name: &'a str,
    /// The file size column, MiB (`-s`).
    pub size_mib: u64,
    /// The chunk size, bytes.
    pub chunk: u64,
    /// The random seed column.
    pub seed: u64,
    /// Total seeks.
    pub seeks: u64,
    /// Seeker processes.
    pub seekers: usize,
}

/// A size as bonnie++ prints it: divided by 1024 while it divides evenly and a larger unit
/// is left (`units` from smallest; a space unit prints nothing): 8192 MiB with `"MG"` is
/// `8G`, 8192 bytes with `" km"` is `8k`, 512 bytes is `512`.
pub fn bonnie_size(size: u64, units: &str) -> String {
    let units: Vec<char> = units.chars().collect();
    let mut v = size;
    let mut i = 0;
    if v == 0 {
        return format!("0{}", units[0]).trim_end().to_owned();
    }
    while v % 1024 == 0 && i + 1 < units.len() {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", units[i]).trim_end().to_owned()
}

/// A latency as bonnie++ 1.9x prints it: whole seconds above 99.999999 s, whole
/// milliseconds above 0.099999 s, else whole microseconds; empty for none (a test not run
/// or not modelled).
pub fn bonnie_latency(ns: Option<u64>) -> String {
    match ns {
        None | Some(0) => String::new(),
        Some(ns) if ns > 99_999_999_000 => format!("{}s", ns / 1_000_000_000),
        Some(ns) if ns > 99_999_000 => format!("{}ms", ns / 1_000_000),
        Some(ns) => format!("{}us", ns / 1_000),
    }
}

/// A bonnie++ 1.98 CSV row (bonnie++ 1.98 / 2.00, format version 1.98): K/s and %CPU
/// truncated to integers as bonnie++ 1.9x prints them, seeks/s with one decimal below
/// 1000, the longest operation of each phase in the latency columns. The file tests are
/// not modelled: their columns are empty, as bonnie++ leaves them for tests it did not run
/// (`-n 0`). The lab's file is scaled down, so every I/O phase is printed, never `+++++`.
pub fn csv_row_198(p: &Csv198Params<'_>, r: &BonnieResult) -> String {
    let mut cols: Vec<String> = vec![
        "1.98".to_owned(),
        "1.98".to_owned(),
        p.name.to_owned(),
        "1".to_owned(),
        p.seed.to_string(),
        bonnie_size(p.size_mib, "MG"),
        if p.chunk == BONNIE_DEFAULT_CHUNK {
            String::new()
        } else {
            bonnie_size(p.chunk, " km")
        },
        p.seeks.to_string(),
        p.seekers.to_string(),
    ];
    let io = [r.out_char, r.out_block, r.rewrite, r.in_char, r.in_block];
    for ph in &io {
        cols.push(format!("{}", ph.kib_per_s().trunc() as u64));
        cols.push(format!("{}", ph.cpu_pct().trunc() as u64));
    }
    let seeks = r.seeks.per_s();
    cols.push(if seeks >= 1000.0 {
        format!("{seeks:.0}")
    } else {
        format!("{seeks:.1}")
    });
    cols.push(format!("{}", r.seeks.cpu_pct().trunc() as u64));
    // num_files, max_size, min_size, num_dirs, file_chunk_size and the 12 file-test
    // columns (all empty when they were not run).
    let files = r.files.as_ref().map(FileValues::from_result);
    match &files {
        Some(f) => {
            cols.push(f.files_k.to_string());
            cols.extend(std::iter::repeat(String::new()).take(4));
            cols.extend(f.columns(|x| format!("{}", x.trunc() as u64)));
        }
        None => cols.extend(std::iter::repeat(String::new()).take(5 + 12)),
    }
    for ph in io.iter().chain(std::iter::once(&r.seeks)) {
        cols.push(bonnie_latency(Some(ph.max_op_ns)));
    }
    match &r.files {
        Some(f) => cols.extend(f.tests().iter().map(|t| bonnie_latency(Some(t.max_op_ns)))),
        None => cols.extend(std::iter::repeat(String::new()).take(6)),
    }
    cols.join(",")
}

#[cfg(test)]
mod csv198_tests {
    use super::*;

    #[test]
    fn sizes_and_latencies_print_as_bonnie_prints_them() {
        assert_eq!(bonnie_size(8192, "MG"), "8G");
        assert_eq!(bonnie_size(16, "MG"), "16M");
        assert_eq!(bonnie_size(4096, " km"), "4k");
        assert_eq!(bonnie_size(1 << 20, " km"), "1m");
        assert_eq!(bonnie_size(512, " km"), "512");
        assert_eq!(bonnie_latency(None), "");
        assert_eq!(bonnie_latency(Some(0)), "");
        assert_eq!(bonnie_latency(Some(95_400)), "95us");
        assert_eq!(bonnie_latency(Some(99_999_000)), "99999us");
        assert_eq!(bonnie_latency(Some(221_700_000)), "221ms");
        assert_eq!(bonnie_latency(Some(120_000_000_000)), "120s");
    }

    #[test]
    fn a_198_row_has_bonnies_columns_and_leaves_unmodelled_tests_empty() {
        let ph = |kib: f64, ms: u64| PhaseResult {
            amount: kib * 1024.0,
            elapsed_ns: 1_000_000_000,
            cpu_ns: 505_000_000,
            max_op_ns: ms * 1_000_000,
        };
        let r = BonnieResult {
            out_char: ph(100.9, 1),
            out_block: ph(200.0, 2),
            rewrite: ph(300.0, 3),
            in_char: ph(400.0, 4),
            in_block: ph(500.0, 5),
            seeks: PhaseResult {
                amount: 812.34,
                ..ph(0.0, 600)
            },
            files: None,
        };
        let p = Csv198Params {
            name: "box",
            size_mib: 8192,
            chunk: 4096,
            seed: 7,
            seeks: 8000,
            seekers: 3,
        };
        let row = csv_row_198(&p, &r);
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols.len(), CSV_198_COLUMNS.len());
        assert_eq!(
            &cols[..11],
            &["1.98", "1.98", "box", "1", "7", "8G", "4k", "8000", "3", "100", "50"]
        );
        assert_eq!(&cols[19..21], &["812.3", "50"]);
        assert!(cols[21..38].iter().all(|c| c.is_empty()), "{row}");
        assert_eq!(
            &cols[38..44],
            &["1000us", "2000us", "3000us", "4000us", "5000us", "600ms"]
        );
        assert!(cols[44..].iter().all(|c| c.is_empty()), "{row}");
    }

    /// A file-test result: `n` files run of bonnie's 16,384, each test taking `ms[i]` ms
    /// with 1 ms of CPU.
    fn file_result(n: f64, ms: [u64; 6]) -> FileTestResult {
        let t = |i: usize| PhaseResult {
            amount: n,
            elapsed_ns: ms[i] * 1_000_000,
            cpu_ns: 1_000_000,
            max_op_ns: 1000 * (i as u64 + 1),
        };
        FileTestResult {
            seq_create: t(0),
            seq_stat: t(1),
            seq_delete: t(2),
            ran_create: t(3),
            ran_stat: t(4),
            ran_delete: t(5),
            files: 16 * 1024,
        }
    }

    #[test]
    fn file_tests_print_rates_or_bonnies_too_fast_marks() {
        // 1,024 files run of 16,384: the stat tests took 20 ms, i.e. 320 ms at the full
        // count (under bonnie's 0.5 s: +++++); a 40 ms test is 640 ms at the full count.
        let f = file_result(1024.0, [2048, 20, 1024, 40, 20, 4096]);
        assert!(f.too_fast(&f.seq_stat) && !f.too_fast(&f.ran_create));
        let r = BonnieResult {
            files: Some(f),
            ..Default::default()
        };
        let v = CsvValues::from_result(&r);
        let row = csv_row("box", "8G", &v);
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols.len(), CSV_COLUMNS.len());
        assert_eq!(
            &cols[14..],
            &[
                "16", "500", "0", "+++++", "+++", "1000", "0", "25600", "2", "+++++", "+++", "250",
                "0"
            ],
            "{row}"
        );
        let files = v.files.unwrap();
        let names: Vec<String> = files.metrics().iter().map(|m| m.name.clone()).collect();
        assert_eq!(names.len(), 8, "no metric for a test too fast to measure");
        assert!(!names.iter().any(|n| n.contains("_read_")), "{names:?}");

        // The 1.98 row: num_files, four empty size/dir columns, the 12 values truncated,
        // and every file test's latency.
        let p = Csv198Params {
            name: "box",
            size_mib: 8192,
            chunk: 8192,
            seed: 1,
            seeks: 8000,
            seekers: 3,
        };
        let row = csv_row_198(&p, &r);
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols.len(), CSV_198_COLUMNS.len());
        assert_eq!(&cols[21..26], &["16", "", "", "", ""]);
        assert_eq!(&cols[26..30], &["500", "0", "+++++", "+++"]);
        assert_eq!(&cols[44..], &["1us", "2us", "3us", "4us", "5us", "6us"]);

        // Without file tests (-n 0) all 13 columns are empty, as bonnie++ prints them.
        let row = csv_row("box", "8G", &CsvValues::default());
        assert!(row.split(',').skip(14).all(|c| c.is_empty()), "{row}");
        assert_eq!(row.split(',').count(), CSV_COLUMNS.len());
    }

    #[test]
    fn the_mean_of_repeated_rows_averages_the_file_tests_too() {
        let a = CsvValues::from_result(&BonnieResult {
            files: Some(file_result(1024.0, [2048; 6])),
            ..Default::default()
        });
        let b = CsvValues::from_result(&BonnieResult {
            files: Some(file_result(1024.0, [1024; 6])),
            ..Default::default()
        });
        let m = CsvValues::mean(&[a, b]);
        let f = m.files.unwrap();
        assert_eq!(f.rate[0], Some(750.0));
        assert_eq!(f.files_k, 16);
        assert_eq!(CsvValues::mean(&[CsvValues::default()]).files, None);
    }
}
