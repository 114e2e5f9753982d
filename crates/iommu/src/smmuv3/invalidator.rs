//! Invalidation through the SMMUv3 command queue: the [`Invalidator`] of domains attached to
//! an [`Smmuv3`](super::Smmuv3), as Linux's `arm_smmu_tlb_inv_range_domain` and
//! `arm_smmu_tlb_inv_context` build commands.
//!
//! - A gathered leaf range becomes `CMD_TLBI_NH_VA` commands with `Leaf = 1`: without
//!   range invalidation one per page of the range's page size; with it (SMMUv3.2) as few
//!   range commands as the 5-bit `NUM` and `SCALE` fields allow ([`tlbi_va_commands`]).
//! - A freed table page becomes `CMD_TLBI_NH_VA` commands with `Leaf = 0` over the IOVA span
//!   the table translated, one per granule without range invalidation (the walk caches must
//!   forget every descriptor pointing at or into it).
//! - A whole-domain invalidation (the lazy flush) is one `CMD_TLBI_NH_ASID`.
//! - [`Invalidator::sync`] issues the calling thread's pending commands followed by one
//!   `CMD_SYNC` and waits for it.
//! - On an SMMU with E2H (`IDR0.HYP` and the kernel at EL2 with VHE:
//!   [`Smmuv3::uses_e2h`](super::Smmuv3::uses_e2h)) the domain's streams are in the EL2
//!   world, and every TLBI above takes its EL2 form (`CMD_TLBI_EL2_VA`, `CMD_TLBI_EL2_ASID`),
//!   as Linux's `arm_smmu_tlb_inv_range_domain` and `arm_smmu_tlb_inv_asid` choose them
//!   with `ARM_SMMU_FEAT_E2H` (since 5.12).
//!
//! Commands wait in a per-thread batch until the thread's next `sync` (the trait's contract:
//! requests are only known complete once `sync` returns), so a strict unmap issues its TLBIs
//! and the sync in one go, as Linux's `arm_smmu_cmdq_batch_submit` does. A batch that
//! reaches [`CMDQ_BATCH_ENTRIES`] (or what the queue can take with a sync) is issued without
//! a sync first. Keeping batches per thread means one CPU's sync never overtakes another
//! CPU's commands.
//!
//! Optionally ([`Smmuv3Config::max_tlbi_ops`](super::Smmuv3Config::max_tlbi_ops)), a range
//! that would take at least that many single-page commands is replaced by one
//! `CMD_TLBI_NH_ASID`, as Linux does for SVA since v6.6 (`CMDQ_MAX_TLBI_OPS`, 512 with 4 KiB
//! pages) to avoid soft lockups on SMMUs without range invalidation.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::batch::CMDQ_BATCH_ENTRIES;
use super::caches::TlbCaches;
use super::cmdq::CmdqProducer;
use super::spec::{Command, StreamWorld};
use crate::dma::{DomainId, Invalidator};
use crate::pgtable::{FreedTable, GatherRange};
use crate::work::WorkRecord;

/// Largest `SCALE` of a range command (5 bits).
const MAX_SCALE: u32 = 31;
/// Largest number of units of a range command (`NUM + 1`, `NUM` being 5 bits).
const MAX_NUM: u64 = 32;

/// Appends to `out` the `CMD_TLBI_NH_VA` commands that invalidate `size` bytes from
/// `start` for `asid`.
///
/// - Without `range` support: one single-page command (`TG = 0`) every `step` bytes (the
///   range's page size for leaf ranges, the granule for walk invalidations).
/// - With it: range commands over granules of `2^granule_shift` bytes, each covering
///   `NUM + 1` units of `2^SCALE` granules, chosen as Linux does: `SCALE` is the lowest set
///   bit of the granules left and `NUM + 1` the five bits above it, so 16 pages are one
///   command and 33 pages are two. Leaf commands carry the TTL hint of `step` (the level
///   of the leaf).
///
/// `start` must be aligned to `step`, and `size` a multiple of it.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tlbi_va_commands(
    asid: u16,
    start: u64,
    size: u64,
    step: u64,
    granule_shift: u32,
    leaf: bool,
    range: bool,
    out: &mut Vec<Command>,
) {
    let with = |addr: u64, ttl: u8, tg: u8, num: u8, scale: u8| Command::TlbiNhVa {
        vmid: 0,
        asid,
        addr,
        leaf,
        ttl,
        tg,
        num,
        scale,
    };
    if size == 0 || step == 0 {
        return;
    }
    if !range {
        if size <= step {
            // One page (the loop below, which stops after its first command).
            if start < start.saturating_add(size) {
                out.push(single_page_command(asid, start, leaf));
            }
            return;
        }
        let mut addr = start;
        let end = start.saturating_add(size);
        while addr < end {
            out.push(single_page_command(asid, addr, leaf));
            addr = match addr.checked_add(step) {
                Some(a) => a,
                None => break,
            };
        }
        return;
    }
    // TG: 1 for 4 KiB, 2 for 16 KiB, 3 for 64 KiB granules.
    let tg = ((granule_shift - 10) / 2) as u8;
    let ttl = if leaf {
        let step_shift = step.trailing_zeros();
        (4 - (step_shift - 3) / (granule_shift - 3)) as u8
    } else {
        0
    };
    let mut left = size >> granule_shift;
    let mut addr = start;
    while left > 0 {
        let scale = left.trailing_zeros().min(MAX_SCALE);
        let mut num = (left >> scale) & (MAX_NUM - 1);
        if num == 0 {
            // Only when SCALE was capped: at least 32 units remain.
            num = MAX_NUM;
        }
        out.push(with(addr, ttl, tg, (num - 1) as u8, scale as u8));
        left -= num << scale;
        addr = addr.wrapping_add((num << scale) << granule_shift);
    }
}

/// Rewrites `cmds` into the TLBI forms that reach `world` ([`Command::in_world`]); nothing
/// to do for [`StreamWorld::NsEl1`], whose forms the builders above produce.
#[inline]
fn into_world(cmds: &mut [Command], world: StreamWorld) {
    if world != StreamWorld::NsEl1 {
        for c in cmds {
            *c = c.in_world(world);
        }
    }
}

/// The single-page `CMD_TLBI_NH_VA` (`TG = 0`, no TTL hint) for the page at `addr`.
#[inline]
fn single_page_command(asid: u16, addr: u64, leaf: bool) -> Command {
    Command::TlbiNhVa {
        vmid: 0,
        asid,
        addr,
        leaf,
        ttl: 0,
        tg: 0,
        num: 0,
        scale: 0,
    }
}

/// No invalidator: the value of [`Pending::owner`] when nothing is pending (identities
/// start at 1).
const NO_OWNER: u64 = 0;
/// Several invalidators: [`Pending::ids`] tells their commands apart.
const MIXED: u64 = u64::MAX;

/// The commands built on one thread and not yet issued.
///
/// Usually they all belong to one invalidator (one strict unmap pushes its TLBIs and syncs
/// them at once), and then they are kept as a plain command list that is built in place and
/// issued as it is. Only while several invalidators have commands pending does `ids` tag
/// each command with its invalidator.
struct Pending {
    /// The commands, in the order they were pushed.
    cmds: Vec<Command>,
    /// The invalidator of each command of `cmds` when `owner` is [`MIXED`] (empty
    /// otherwise).
    ids: Vec<u64>,
    /// The invalidator all of `cmds` belong to, [`NO_OWNER`] when there are none, or
    /// [`MIXED`].
    owner: u64,
    /// The buffer swapped in for `cmds` while a batch is issued (reused: no allocation per
    /// sync).
    spare: Vec<Command>,
}

impl Pending {
    /// Tags every command with its invalidator, so another invalidator can add its own.
    fn make_mixed(&mut self) {
        if self.owner != MIXED {
            self.ids.clear();
            self.ids.resize(self.cmds.len(), self.owner);
            self.owner = MIXED;
        }
    }

    /// Back to the untagged form when one invalidator (or none) is left.
    fn normalize(&mut self) {
        if self.owner == MIXED {
            match self.ids.first() {
                None => self.owner = NO_OWNER,
                Some(&first) if self.ids.iter().all(|&id| id == first) => {
                    self.owner = first;
                    self.ids.clear();
                }
                Some(_) => {}
            }
        }
    }

    /// How many of the pending commands belong to invalidator `id`.
    fn count_of(&self, id: u64) -> usize {
        match self.owner {
            MIXED => self.ids.iter().filter(|&&i| i == id).count(),
            owner if owner == id => self.cmds.len(),
            _ => 0,
        }
    }

    /// Moves invalidator `id`'s pending commands, in order, into a buffer (the spare one)
    /// and returns it.
    fn take_own(&mut self, id: u64) -> Vec<Command> {
        let mut out = std::mem::take(&mut self.spare);
        out.clear();
        match self.owner {
            MIXED => {
                out.extend(
                    self.cmds
                        .iter()
                        .zip(&self.ids)
                        .filter(|&(_, &i)| i == id)
                        .map(|(&c, _)| c),
                );
                let mut ids = self.ids.iter();
                self.cmds.retain(|_| ids.next() != Some(&id));
                self.ids.retain(|&i| i != id);
                self.normalize();
            }
            owner if owner == id => {
                // The usual case: hand over the whole list, keep the spare for the next one.
                std::mem::swap(&mut out, &mut self.cmds);
                self.owner = NO_OWNER;
            }
            _ => {}
        }
        out
    }

    /// Returns a buffer [`Pending::take_own`] handed out.
    fn give_back(&mut self, mut buf: Vec<Command>) {
        buf.clear();
        if buf.capacity() <= KEEP_BUILT && buf.capacity() >= self.spare.capacity() {
            self.spare = buf;
        }
    }
}

thread_local! {
    /// Commands built on this thread and not yet issued.
    static PENDING: RefCell<Pending> = const {
        RefCell::new(Pending {
            cmds: Vec::new(),
            ids: Vec::new(),
            owner: NO_OWNER,
            spare: Vec::new(),
        })
    };
}

/// Largest command buffer kept between calls (a huge range's buffer is freed).
const KEEP_BUILT: usize = 4096;

/// Source of invalidator identities (to tell their pending commands apart).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The [`Invalidator`] of one SMMUv3 domain (one ASID). See the module docs.
pub struct Smmuv3Invalidator {
    id: u64,
    asid: u16,
    granule_shift: u32,
    range: bool,
    max_tlbi_ops: Option<u64>,
    limit: usize,
    world: StreamWorld,
    cmdq: Arc<dyn CmdqProducer<Sink = Arc<TlbCaches>>>,
    errors: AtomicU64,
}

impl std::fmt::Debug for Smmuv3Invalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Smmuv3Invalidator")
            .field("asid", &self.asid)
            .field("range", &self.range)
            .field("world", &self.world)
            .field("producer", &self.cmdq.kind())
            .finish_non_exhaustive()
    }
}

impl Smmuv3Invalidator {
    /// An invalidator for `asid`, whose table has `2^granule_shift`-byte granules.
    pub(crate) fn new(
        asid: u16,
        granule_shift: u32,
        range: bool,
        max_tlbi_ops: Option<u64>,
        cmdq: Arc<dyn CmdqProducer<Sink = Arc<TlbCaches>>>,
    ) -> Self {
        let limit = CMDQ_BATCH_ENTRIES
            .min(cmdq.cmdq().capacity().saturating_sub(1))
            .max(1);
        Smmuv3Invalidator {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            asid,
            granule_shift,
            range,
            max_tlbi_ops,
            limit,
            world: StreamWorld::NsEl1,
            cmdq,
            errors: AtomicU64::new(0),
        }
    }

    /// The same invalidating the entries of streams in `world` (the TLBI forms that reach
    /// it: NH for NS-EL1, the default; EL2 for EL2-E2H).
    pub(crate) fn with_world(mut self, world: StreamWorld) -> Self {
        self.world = world;
        self
    }

    /// The ASID it invalidates.
    pub fn asid(&self) -> u16 {
        self.asid
    }

    /// The translation regime whose entries it invalidates, and so its TLBIs' forms.
    pub fn world(&self) -> StreamWorld {
        self.world
    }

    /// Issues that the queue refused (never expected: commands are built valid and
    /// batches sized to the queue).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    fn issue(&self, cmds: &[Command], sync: bool, work: &mut WorkRecord) {
        if let Err(e) = self.cmdq.issue(cmds, sync, work) {
            self.errors.fetch_add(1, Ordering::Relaxed);
            debug_assert!(false, "SMMUv3 invalidation issue failed: {e}");
        }
    }

    /// Issues this invalidator's pending commands (with a `CMD_SYNC` if `sync`).
    fn issue_pending(&self, sync: bool, work: &mut WorkRecord) {
        // A small closure, so `with` inlines into a direct thread-local access (the rare
        // mixed batch is handled out of line).
        PENDING.with(|p| self.issue_pending_in(&mut p.borrow_mut(), sync, work));
    }

    /// [`Smmuv3Invalidator::issue_pending`] on the thread's batch.
    #[inline]
    fn issue_pending_in(&self, p: &mut Pending, sync: bool, work: &mut WorkRecord) {
        if p.owner == self.id {
            // The usual case: the batch is this invalidator's alone, and is issued in
            // place. (Issuing never comes back to an invalidator: the queue's sink is the
            // TLB caches.)
            self.issue(&p.cmds, sync, work);
            p.cmds.clear();
            p.owner = NO_OWNER;
            if p.cmds.capacity() > KEEP_BUILT {
                p.cmds = Vec::new();
            }
        } else {
            self.issue_own_of_mixed(p, sync, work);
        }
    }

    /// [`Smmuv3Invalidator::issue_pending_in`] when the batch is not this invalidator's
    /// alone (out of line: the usual case stays small enough to inline).
    #[inline(never)]
    fn issue_own_of_mixed(&self, p: &mut Pending, sync: bool, work: &mut WorkRecord) {
        let batch = p.take_own(self.id);
        self.issue(&batch, sync, work);
        p.give_back(batch);
    }

    /// Adds the commands `build` appends to its vector to the thread's batch, issuing this
    /// invalidator's commands without a sync each time they fill a batch (`limit`), as if
    /// the commands were pushed one at a time.
    fn push_with(&self, work: &mut WorkRecord, build: impl FnOnce(&mut Vec<Command>)) {
        // A small closure, as in `issue_pending`.
        let full = PENDING.with(|p| self.add_pending(&mut p.borrow_mut(), build));
        if full {
            self.issue_full_batches(work);
        }
    }

    /// [`Smmuv3Invalidator::push_with`]'s additions to the thread's batch `p`; returns
    /// whether this invalidator now has a full batch pending. Out of line, like
    /// [`Smmuv3Invalidator::issue_pending_in`].
    #[inline(never)]
    fn add_pending(&self, p: &mut Pending, build: impl FnOnce(&mut Vec<Command>)) -> bool {
        let id = self.id;
        // Usually nothing of another invalidator is pending (and with no owner, nothing
        // is pending at all), and the list stays untagged.
        let mixed = p.owner != id && p.owner != NO_OWNER;
        if mixed {
            p.make_mixed();
        }
        // One call of `build`, so that it inlines here.
        build(&mut p.cmds);
        if mixed {
            p.ids.resize(p.cmds.len(), id);
            // Only this invalidator's commands count. Before this call it had fewer than
            // `limit` pending (a full batch is issued at once).
            return p.count_of(id) >= self.limit;
        }
        if !p.cmds.is_empty() {
            p.owner = id;
        }
        p.cmds.len() >= self.limit
    }

    /// [`Smmuv3Invalidator::push_with`] of one command, with the usual case (no other
    /// invalidator's commands pending) inline.
    #[inline]
    fn push_one(&self, work: &mut WorkRecord, cmd: Command) {
        // A small closure, as in `issue_pending`.
        let full = PENDING.with(|p| self.add_one(&mut p.borrow_mut(), cmd));
        if full {
            self.issue_full_batches(work);
        }
    }

    /// [`Smmuv3Invalidator::push_one`]'s addition to the thread's batch `p`; returns whether
    /// this invalidator now has a full batch pending.
    #[inline(never)]
    fn add_one(&self, p: &mut Pending, cmd: Command) -> bool {
        if p.owner == self.id || p.owner == NO_OWNER {
            p.cmds.push(cmd);
            p.owner = self.id;
            p.cmds.len() >= self.limit
        } else {
            self.add_pending(p, move |out| out.push(cmd))
        }
    }

    /// Issues this invalidator's pending commands without a sync in batches of `limit`,
    /// leaving fewer than `limit` pending.
    fn issue_full_batches(&self, work: &mut WorkRecord) {
        let mut own = PENDING.with(|p| p.borrow_mut().take_own(self.id));
        let mut chunks = own.chunks_exact(self.limit);
        for chunk in &mut chunks {
            self.issue(chunk, false, work);
        }
        let rest = chunks.remainder().len();
        if rest > 0 {
            own.drain(..own.len() - rest);
            self.push_with(work, |out| out.extend_from_slice(&own));
        }
        if own.capacity() <= KEEP_BUILT {
            PENDING.with(|p| p.borrow_mut().give_back(own));
        }
    }

    /// Queues the commands for `size` bytes from `start`, or one by-ASID command when the
    /// range would take too many single-page commands.
    fn push_range(&self, start: u64, size: u64, step: u64, leaf: bool, work: &mut WorkRecord) {
        if self.whole_asid(size, step) {
            self.push_one(work, self.asid_command());
            return;
        }
        let (asid, granule_shift, range) = (self.asid, self.granule_shift, self.range);
        if !range && size != 0 && size <= step && start < start.saturating_add(size) {
            // One page: the one command `tlbi_va_commands` would build, pushed directly.
            let cmd = single_page_command(asid, start, leaf).in_world(self.world);
            self.push_one(work, cmd);
            return;
        }
        let world = self.world;
        // `move`: the closure holds the values, not references to them.
        self.push_with(work, move |out| {
            let from = out.len();
            tlbi_va_commands(asid, start, size, step, granule_shift, leaf, range, out);
            into_world(&mut out[from..], world);
        });
    }

    /// Whether `size` bytes in `step`-byte pages take one by-ASID command instead of
    /// single-page ones (no range invalidation, and at least `max_tlbi_ops` pages).
    #[inline]
    fn whole_asid(&self, size: u64, step: u64) -> bool {
        !self.range
            && self
                .max_tlbi_ops
                .is_some_and(|max| size / step.max(1) >= max)
    }

    /// Appends to `out` the commands [`Smmuv3Invalidator::push_range`] queues for `size`
    /// bytes from `start` (the same commands: one by-ASID command when the range would take
    /// too many single-page commands, else those of [`tlbi_va_commands`]).
    #[inline]
    fn build_range(&self, start: u64, size: u64, step: u64, leaf: bool, out: &mut Vec<Command>) {
        if self.whole_asid(size, step) {
            out.push(self.asid_command());
            return;
        }
        let (asid, granule_shift, range) = (self.asid, self.granule_shift, self.range);
        let from = out.len();
        tlbi_va_commands(asid, start, size, step, granule_shift, leaf, range, out);
        into_world(&mut out[from..], self.world);
    }

    /// [`Invalidator::invalidate_range_and_sync`] on the thread's batch `p`: when nothing
    /// of another invalidator is pending and the range's commands do not fill a batch,
    /// builds them in place and issues the batch with its sync (what `push_range` then
    /// `issue_pending` do, in one access to the batch). Otherwise leaves `p` as it was
    /// (`Other`) or with the commands added (`Full`) for the caller to finish the old way.
    #[inline]
    fn range_and_sync_in(
        &self,
        p: &mut Pending,
        range: &GatherRange,
        work: &mut WorkRecord,
    ) -> RangeAndSync {
        if p.owner != self.id && p.owner != NO_OWNER {
            return RangeAndSync::Other;
        }
        self.build_range(
            range.start.get(),
            range.size,
            range.page_size,
            true,
            &mut p.cmds,
        );
        if p.cmds.len() >= self.limit {
            // `push_range` would issue full batches without a sync first.
            p.owner = self.id;
            return RangeAndSync::Full;
        }
        // (Also with no commands at all: the sync alone is issued, as `sync` would.)
        p.owner = self.id;
        self.issue_pending_in(p, true, work);
        RangeAndSync::Done
    }

    fn asid_command(&self) -> Command {
        Command::TlbiNhAsid {
            vmid: 0,
            asid: self.asid,
        }
        .in_world(self.world)
    }
}

impl Invalidator for Smmuv3Invalidator {
    fn invalidate_range(&self, _domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        work.inval_ranges += 1;
        work.inval_pages += range.size / range.page_size.max(1);
        self.push_range(range.start.get(), range.size, range.page_size, true, work);
    }

    fn invalidate_walk(&self, _domain: DomainId, table: &FreedTable, work: &mut WorkRecord) {
        work.inval_walks += 1;
        let granule = 1u64 << self.granule_shift;
        self.push_range(table.iova.get(), table.size, granule, false, work);
    }

    fn invalidate_domain(&self, _domain: DomainId, work: &mut WorkRecord) {
        work.inval_domains += 1;
        self.push_one(work, self.asid_command());
    }

    fn sync(&self, work: &mut WorkRecord) {
        self.issue_pending(true, work);
    }

    fn invalidate_range_and_sync(
        &self,
        _domain: DomainId,
        range: &GatherRange,
        work: &mut WorkRecord,
    ) {
        work.inval_ranges += 1;
        work.inval_pages += range.size / range.page_size.max(1);
        // A small closure, as in `issue_pending`.
        let done = PENDING.with(|p| self.range_and_sync_in(&mut p.borrow_mut(), range, work));
        match done {
            RangeAndSync::Done => {}
            RangeAndSync::Full => {
                self.issue_full_batches(work);
                self.issue_pending(true, work);
            }
            RangeAndSync::Other => {
                self.push_range(range.start.get(), range.size, range.page_size, true, work);
                self.issue_pending(true, work);
            }
        }
    }
}

/// What [`Smmuv3Invalidator::range_and_sync_in`] did.
enum RangeAndSync {
    /// Pushed the range's commands and issued them with the sync.
    Done,
    /// Pushed the commands, which fill a batch: full batches and the sync are left to do.
    Full,
    /// Nothing (another invalidator's commands are pending): all is left to do.
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_2M, SZ_4K};

    fn cmds(start: u64, size: u64, step: u64, leaf: bool, range: bool) -> Vec<Command> {
        let mut out = Vec::new();
        tlbi_va_commands(9, start, size, step, 12, leaf, range, &mut out);
        out
    }

    fn covered(cmds: &[Command]) -> u64 {
        cmds.iter().map(|c| c.tlbi_range_bytes().unwrap()).sum()
    }

    #[test]
    fn sixteen_pages_are_one_range_command_or_sixteen_single_ones() {
        let r = cmds(0x10_0000, 16 * SZ_4K, SZ_4K, true, true);
        assert_eq!(
            r,
            vec![Command::TlbiNhVa {
                vmid: 0,
                asid: 9,
                addr: 0x10_0000,
                leaf: true,
                ttl: 3,
                tg: 1,
                num: 0,
                scale: 4
            }]
        );
        let s = cmds(0x10_0000, 16 * SZ_4K, SZ_4K, true, false);
        assert_eq!(s.len(), 16);
        assert!(s
            .iter()
            .enumerate()
            .all(|(i, c)| matches!(*c, Command::TlbiNhVa { addr, tg: 0, .. } if addr == 0x10_0000 + i as u64 * SZ_4K)));
    }

    #[test]
    fn range_commands_cover_exactly_the_range() {
        for pages in [1u64, 2, 3, 31, 32, 33, 63, 64, 100, 511, 512, 1000, 4097] {
            let r = cmds(0x4000_0000, pages * SZ_4K, SZ_4K, true, true);
            assert_eq!(covered(&r), pages * SZ_4K, "{pages} pages");
            assert!(r.len() <= 1 + (64 - pages.leading_zeros() as usize) / 5 + 1);
            let mut addr = 0x4000_0000;
            for c in &r {
                let Command::TlbiNhVa { addr: a, .. } = *c else {
                    panic!()
                };
                assert_eq!(a, addr, "contiguous");
                addr += c.tlbi_range_bytes().unwrap();
            }
        }
        assert_eq!(cmds(0, 33 * SZ_4K, SZ_4K, true, true).len(), 2);
    }

    /// Hand-worked from the SMMUv3 command layout: unmapping 1 MiB + 4 KiB (257 pages) at
    /// IOVA 0x4010_0000 for ASID 9 with range support. 257 = 0b1_0000_0001: SCALE is its
    /// lowest set bit (0) and NUM + 1 the five bits from there (0b00001 = 1), so the first
    /// command covers one page; 256 pages remain: SCALE 8, NUM + 1 = 1.
    ///
    /// - command 1: word 0 = opcode 0x12 | NUM 0 | SCALE 0 | ASID 9 << 48
    ///   = 0x0009_0000_0000_0012; word 1 = VA 0x4010_0000 | LEAF 1 | TTL 3 << 8 | TG 1 << 10
    ///   = 0x4010_0701.
    /// - command 2: word 0 = 0x12 | SCALE 8 << 20 (0x80_0000) | ASID 9 << 48
    ///   = 0x0009_0000_0080_0012; word 1 = 0x4010_1000 | 0x701 = 0x4010_1701.
    #[test]
    fn a_1_mib_and_one_page_unmap_is_two_range_commands_bit_for_bit() {
        let r = cmds(0x4010_0000, 257 * SZ_4K, SZ_4K, true, true);
        let words: Vec<[u64; 2]> = r.iter().map(|c| c.encode().unwrap()).collect();
        assert_eq!(
            words,
            vec![
                [0x0009_0000_0000_0012, 0x4010_0701],
                [0x0009_0000_0080_0012, 0x4010_1701],
            ]
        );
        // Without range support: 257 single-page commands, TG = 0, no TTL.
        let s = cmds(0x4010_0000, 257 * SZ_4K, SZ_4K, true, false);
        assert_eq!(s.len(), 257);
        assert_eq!(s[1].encode().unwrap(), [0x0009_0000_0000_0012, 0x4010_1001]);
    }

    /// A producer that records every issue (commands and sync flag) and writes nothing.
    struct Recorder {
        q: super::super::cmdq::Cmdq<Arc<TlbCaches>>,
        log: std::sync::Mutex<Vec<(Vec<Command>, bool)>>,
    }

    impl Recorder {
        /// A recorder over a queue of `2^log2size` slots feeding fresh caches.
        fn with_log2size(log2size: u32) -> Arc<Recorder> {
            use super::super::cmdq::{Cmdq, CmdqConfig};
            let caches = Arc::new(
                TlbCaches::new(
                    crate::iotlb::IotlbConfig::new(64, 4, crate::iotlb::Replacement::Lru),
                    crate::iotlb::WalkCacheConfig::gem5(),
                )
                .unwrap(),
            );
            Arc::new(Recorder {
                q: Cmdq::new(CmdqConfig::with_log2size(log2size), caches).unwrap(),
                log: std::sync::Mutex::new(Vec::new()),
            })
        }
    }

    impl CmdqProducer for Recorder {
        type Sink = Arc<TlbCaches>;
        fn kind(&self) -> super::super::cmdq::ProducerKind {
            super::super::cmdq::ProducerKind::Spinlock
        }
        fn cmdq(&self) -> &super::super::cmdq::Cmdq<Arc<TlbCaches>> {
            &self.q
        }
        fn issue(
            &self,
            cmds: &[Command],
            sync: bool,
            _work: &mut WorkRecord,
        ) -> Result<(), super::super::cmdq::CmdqError> {
            self.log.lock().unwrap().push((cmds.to_vec(), sync));
            Ok(())
        }
    }

    /// The thread's batch as first written: one command at a time, each tagged with its
    /// invalidator, a batch issued as soon as one invalidator has `limit` pending.
    #[derive(Default)]
    struct Reference {
        pending: Vec<(usize, Command)>,
        log: Vec<(Vec<Command>, bool)>,
    }

    impl Reference {
        fn issue_pending(&mut self, who: usize, sync: bool) {
            let own = self
                .pending
                .iter()
                .filter(|(w, _)| *w == who)
                .map(|&(_, c)| c)
                .collect();
            self.pending.retain(|(w, _)| *w != who);
            self.log.push((own, sync));
        }

        fn push(&mut self, who: usize, cmds: &[Command], limit: usize) {
            for &c in cmds {
                self.pending.push((who, c));
                if self.pending.iter().filter(|(w, _)| *w == who).count() >= limit {
                    self.issue_pending(who, false);
                }
            }
        }
    }

    proptest::proptest! {
        /// Pending commands of several invalidators on one thread are issued exactly as
        /// the one-command-at-a-time batch issues them.
        #[test]
        fn batching_matches_the_one_at_a_time_reference(
            ops in proptest::collection::vec((0usize..3, 0u64..200, proptest::bool::ANY), 1..60),
            log2size in 2u32..8,
        ) {
            let rec = Recorder::with_log2size(log2size);
            let invs: Vec<_> = (0..3u16)
                .map(|a| Smmuv3Invalidator::new(a + 1, 12, false, None, rec.clone()))
                .collect();
            let limit = invs[0].limit;
            let mut reference = Reference::default();
            let mut work = WorkRecord::new();
            for &(who, pages, sync) in &ops {
                if sync {
                    invs[who].sync(&mut work);
                    reference.issue_pending(who, true);
                } else {
                    let size = pages * SZ_4K;
                    invs[who].push_range(0x10_0000, size, SZ_4K, true, &mut work);
                    let mut built = Vec::new();
                    tlbi_va_commands(who as u16 + 1, 0x10_0000, size, SZ_4K, 12, true, false, &mut built);
                    reference.push(who, &built, limit);
                }
            }
            for (who, inv) in invs.iter().enumerate() {
                inv.sync(&mut work);
                reference.issue_pending(who, true);
            }
            proptest::prop_assert_eq!(&*rec.log.lock().unwrap(), &reference.log);
        }
    }

    /// The opcodes an invalidator in `world` issues for: a one-page range, a 16-page range,
    /// a freed table and a whole-domain flush (each synced), with or without range
    /// invalidation.
    fn opcodes_in(world: StreamWorld, range: bool) -> Vec<u8> {
        use super::super::spec::opcode;
        let rec = Recorder::with_log2size(8);
        let inv = Smmuv3Invalidator::new(3, 12, range, None, rec.clone()).with_world(world);
        assert_eq!(inv.world(), world);
        let mut work = WorkRecord::new();
        let r = |pages| GatherRange {
            start: crate::addr::Iova::new(0x10_0000),
            size: pages * SZ_4K,
            page_size: SZ_4K,
        };
        inv.invalidate_range_and_sync(DomainId(1), &r(1), &mut work);
        inv.invalidate_range(DomainId(1), &r(16), &mut work);
        inv.sync(&mut work);
        let freed = FreedTable {
            table_pa: crate::addr::PhysAddr::new(0x8000),
            level: 2,
            iova: crate::addr::Iova::new(0),
            size: SZ_2M,
        };
        inv.invalidate_walk(DomainId(1), &freed, &mut work);
        inv.invalidate_domain(DomainId(1), &mut work);
        inv.sync(&mut work);
        let log = std::mem::take(&mut *rec.log.lock().unwrap());
        let ops: Vec<u8> = log
            .iter()
            .flat_map(|(c, _)| c)
            .map(|c| c.opcode())
            .collect();
        // Every command encodes (the EL2 forms have no VMID to carry).
        for (cmds, _) in &log {
            for c in cmds {
                assert!(c.encode().is_ok(), "{c:?}");
            }
        }
        assert!(ops.iter().all(|&o| o != opcode::CMD_SYNC));
        ops
    }

    /// On an E2H SMMU (the domain's streams in the EL2 world) every TLBI takes its EL2
    /// form, `CMD_TLBI_EL2_VA` (0x22) and `CMD_TLBI_EL2_ASID` (0x21); otherwise the NH forms
    /// (0x12, 0x11), the same number of them.
    #[test]
    fn e2h_domains_issue_el2_tlbis_and_others_nh_ones() {
        for range in [false, true] {
            let nh = opcodes_in(StreamWorld::NsEl1, range);
            let el2 = opcodes_in(StreamWorld::El2, range);
            assert_eq!(nh.len(), el2.len());
            assert_eq!(*nh.last().unwrap(), 0x11);
            assert_eq!(*el2.last().unwrap(), 0x21);
            assert!(nh[..nh.len() - 1].iter().all(|&o| o == 0x12), "{nh:x?}");
            assert!(el2[..el2.len() - 1].iter().all(|&o| o == 0x22), "{el2:x?}");
            if range {
                // One page, 16 pages, the freed table's span: one range command each.
                assert_eq!(el2.len(), 4);
            } else {
                // 1 + 16 single pages, 512 granules of the freed table, the ASID.
                assert_eq!(el2.len(), 1 + 16 + 512 + 1);
            }
        }
        // The by-ASID replacement of a long range takes the EL2 form too.
        let rec = Recorder::with_log2size(8);
        let inv =
            Smmuv3Invalidator::new(3, 12, false, Some(8), rec.clone()).with_world(StreamWorld::El2);
        let r = GatherRange {
            start: crate::addr::Iova::new(0),
            size: 8 * SZ_4K,
            page_size: SZ_4K,
        };
        inv.invalidate_range_and_sync(DomainId(1), &r, &mut WorkRecord::new());
        let log = std::mem::take(&mut *rec.log.lock().unwrap());
        assert_eq!(log, vec![(vec![Command::TlbiEl2Asid { asid: 3 }], true)]);
    }

    proptest::proptest! {
        /// `invalidate_range_and_sync` issues exactly what `invalidate_range` then `sync`
        /// issue (commands, order, batches, sync flags) and counts the same, whatever the
        /// other invalidators on the thread have pending.
        #[test]
        fn range_and_sync_matches_the_two_calls(
            ops in proptest::collection::vec((0usize..3, 0u64..200, 0u8..3), 1..60),
            log2size in 2u32..8,
            range in proptest::bool::ANY,
            max_tlbi_ops in proptest::option::of(1u64..100),
        ) {
            let run = |combined: bool| {
                let rec = Recorder::with_log2size(log2size);
                let invs: Vec<_> = (0..3u16)
                    .map(|a| Smmuv3Invalidator::new(a + 1, 12, range, max_tlbi_ops, rec.clone()))
                    .collect();
                let mut work = WorkRecord::new();
                for &(who, pages, op) in &ops {
                    let r = GatherRange {
                        start: crate::addr::Iova::new(0x10_0000),
                        size: pages * SZ_4K,
                        page_size: SZ_4K,
                    };
                    match op {
                        0 => invs[who].invalidate_range(DomainId(1), &r, &mut work),
                        1 => invs[who].sync(&mut work),
                        _ if combined => invs[who].invalidate_range_and_sync(DomainId(1), &r, &mut work),
                        _ => {
                            invs[who].invalidate_range(DomainId(1), &r, &mut work);
                            invs[who].sync(&mut work);
                        }
                    }
                }
                for inv in &invs {
                    inv.sync(&mut work);
                }
                let log = std::mem::take(&mut *rec.log.lock().unwrap());
                (log, format!("{work:?}"))
            };
            let two_calls = run(false);
            let combined = run(true);
            proptest::prop_assert_eq!(combined, two_calls);
        }
    }

    proptest::proptest! {
        /// Single-page commands (with the one-page shortcut) are those of the plain loop:
        /// one every `step` bytes while below `start + size` (saturating), stopping on
        /// overflow.
        #[test]
        fn single_page_commands_match_the_plain_loop(
            start in proptest::prop_oneof![0u64..1 << 20, u64::MAX - (1 << 20)..=u64::MAX],
            size in 0u64..1 << 16,
            step in 0u64..1 << 14,
        ) {
            let mut got = Vec::new();
            tlbi_va_commands(5, start, size, step, 12, true, false, &mut got);
            let mut want = Vec::new();
            if size != 0 && step != 0 {
                let end = start.saturating_add(size);
                let mut addr = start;
                while addr < end {
                    want.push(addr);
                    match addr.checked_add(step) {
                        Some(a) => addr = a,
                        None => break,
                    }
                }
            }
            let got: Vec<u64> = got
                .iter()
                .map(|c| match *c {
                    Command::TlbiNhVa { addr, asid: 5, tg: 0, .. } => addr,
                    _ => panic!("unexpected {c:?}"),
                })
                .collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn huge_ranges_cap_the_scale() {
        let r = cmds(0, 1 << 47, SZ_4K, false, true);
        assert_eq!(covered(&r), 1 << 47);
        assert!(r.iter().all(|c| c.encode().is_ok()));
    }

    #[test]
    fn block_ranges_step_by_their_page_size() {
        assert_eq!(cmds(0, 4 * SZ_2M, SZ_2M, true, false).len(), 4);
        let r = cmds(0, 4 * SZ_2M, SZ_2M, true, true);
        assert_eq!(r.len(), 1);
        assert!(matches!(r[0], Command::TlbiNhVa { ttl: 2, tg: 1, .. }));
    }
}
