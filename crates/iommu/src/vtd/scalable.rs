//! Scalable-mode translation (RTADDR.TTM = 1): the scalable root and context entries, the
//! PASID directory and table, the PASID cache, and first-stage, second-stage, nested and
//! pass-through walks (X86.md §1.3–§1.5).
//!
//! # The walk ([`Dmar::translate_request`])
//!
//! 1. Context cache by source id; on a miss the scalable root entry (RTADDR + bus × 16; the
//!    lower half for devfn 0x00–0x7F, the upper for 0x80–0xFF) and the 256-bit context
//!    entry (table + (devfn mod 128) × 32): two `walk_reads`. Faults 0x3A / 0x39 (root
//!    reserved / not present), 0x42 / 0x41 (context reserved / not present).
//! 2. The PASID: the request's (0x45 if the context's PASIDE is clear), or RID_PASID for a
//!    request without one. Beyond the directory's 2^(PDTS+7) × 64 PASIDs: 0x46.
//! 3. PASID cache by (source id, PASID), entries tagged with the entry's DID; on a miss the
//!    directory entry (PASIDDIRPTR + (PASID >> 6) × 8) and the PASID-table entry (table +
//!    (PASID & 63) × 64): two `walk_reads`. Faults 0x52 / 0x51 (directory), 0x5A / 0x59
//!    (table entry), 0x5B (a PGTT, AW or FLPM the unit does not support). A supervisor
//!    request with PASID needs SRE (0x5D); requests without PASID have user privilege.
//! 4. PGTT pass-through: output = input. Otherwise the IOTLB, tagged by (DID, PASID,
//!    stage), then the walk from the deepest paging-structure-cache hit:
//!    - second stage (PGTT 2): the table at SLPTPTR with AW's levels; an input at or above
//!      2^width faults 0x83; an entry with R and W clear 0x79; a leaf without the
//!      permission 0x86 (read) / 0x85 (write). With Caching Mode a not-present walk leaves
//!      a negative IOTLB entry, as in legacy mode.
//!    - first stage (PGTT 1): x86-64 paging at FLPTPTR, 4 levels (FLPM 0) or 5 (FLPM 1),
//!      4 KiB / 2 MiB / 1 GiB leaves. A non-canonical input faults 0x80, a clear P 0x71.
//!      Write needs R/W on every level (else 0x85); reads need only P. A user request
//!      needs U/S on every level (else 0x81). XD is ignored, NXE or not (no execute
//!      requests); whether Linux writes them is the domain's
//!      [`FlExecControl`](super::spec::FlExecControl).
//!      Not-present first-stage entries are never cached, Caching Mode or not (VT-d §6.1
//!      exempts first-stage updates from explicit invalidation, X86.md §1.7).
//!    - nested (PGTT 3): the first-stage walk where FLPTPTR, every next-table pointer and
//!      the leaf's output are guest-physical and go through the second-stage table
//!      (uncached walks, each read counted); permissions are the intersection, the cached
//!      page the smaller of the two.
//!
//! Paging-structure-cache entries stand for a path with full rights: a first-stage
//! non-leaf entry is cached only if R/W and U/S were set on it and every level above, so a
//! hit never hides a missing right (Linux sets both on every non-leaf entry). IOTLB
//! entries a user request could not use (U/S clear somewhere) are not cached.
//!
//! # Tags and invalidation
//!
//! The IOTLB and paging-structure caches are shared with legacy mode; in scalable mode
//! each (DID, PASID, stage) gets a tag from a table of at most [`SM_TAGS_MAX`] (when full,
//! every cached translation is dropped and numbering restarts, as an ASID rollover). The
//! IOTLB descriptor (type 2) reaches the second-stage and pass-through tags of its DID,
//! the PASID-based IOTLB descriptor (type 6) the first-stage and nested tags of its DID
//! and PASID (VT-d §6.5.2.4 and §6.5.2.6 as remembered, unverified; Linux uses type 2 for
//! second-stage and type 6 for first-stage domains, so either reading serves its paths).
//! The PASID-cache descriptor (type 7) drops PASID-cache entries by DID, by DID and PASID,
//! or all, and nothing else: software follows it with an IOTLB flush.
//!
//! Not modelled: 256-bit descriptors (the queue stays 128-bit, which a real unit in
//! scalable mode rejects), A/D updates (Linux pre-sets them), SLEE/ERE (execute), SMEP,
//! WPE, page snoop, PRI.

use std::collections::{HashMap, VecDeque};

use super::device::DmarTranslation;
use super::device::{CachedContext, Caches, Dmar, DmarDomain, DmarError, DmarFault};
use super::devtlb::{AtcEntry, DevTlb};
use super::pgtable::{read_u64, VtdStage};
use super::spec::{
    self, fl, reason, CcGranularity, Ecap, FlPte, InvDesc, IotlbGranularity, PasidDirEntry,
    PasidEntry, PasidIotlbGranularity, PcGranularity, Pgtt, SlPte, SmContextEntry, SmRootEntry,
    TranslationType,
};
use crate::addr::{Access, Iova, PhysAddr, Prot, SZ_4K};
use crate::iotlb::Asid;
use crate::work::WorkRecord;

/// How a unit translates: legacy root/context tables, or scalable mode with domains on the
/// second or the first stage (the PASID entry's PGTT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VtdTranslation {
    /// RTADDR.TTM = 0: root and context entries, second-stage tables.
    #[default]
    Legacy,
    /// Scalable mode, PGTT = 2 (second stage only).
    ScalableSecondStage,
    /// Scalable mode, PGTT = 1 (first stage only): what Linux prefers when ECAP.FLTS is
    /// set (X86.md §2.2).
    ScalableFirstStage,
}

impl VtdTranslation {
    /// Whether RTADDR.TTM selects scalable mode.
    pub const fn is_scalable(self) -> bool {
        !matches!(self, Self::Legacy)
    }

    /// Checks the ECAP bits the mode needs: SMTS, and SLTS or FLTS for the stage.
    ///
    /// # Errors
    ///
    /// [`DmarError::NoScalableMode`] naming the first missing field.
    pub fn check(self, ecap: Ecap) -> Result<(), DmarError> {
        let missing = match self {
            Self::Legacy => None,
            _ if !ecap.smts() => Some("SMTS"),
            Self::ScalableSecondStage if !ecap.slts() => Some("SLTS"),
            Self::ScalableFirstStage if !ecap.flts() => Some("FLTS"),
            _ => None,
        };
        match missing {
            Some(missing) => Err(DmarError::NoScalableMode {
                translation: self,
                missing,
            }),
            None => Ok(()),
        }
    }
}

/// A DMA request as the unit sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VtdRequest {
    /// Source id (bus << 8 | devfn).
    pub sid: u16,
    /// The PASID of a request with PASID.
    pub pasid: Option<u32>,
    /// Supervisor privilege (only a request with PASID can carry it).
    pub supervisor: bool,
    /// The input address.
    pub iova: Iova,
    /// Read or write.
    pub access: Access,
}

impl VtdRequest {
    /// A request without PASID (user privilege).
    pub const fn new(sid: u16, iova: Iova, access: Access) -> Self {
        Self {
            sid,
            pasid: None,
            supervisor: false,
            iova,
            access,
        }
    }

    /// The same request with PASID `pasid` and the given privilege.
    pub const fn with_pasid(mut self, pasid: u32, supervisor: bool) -> Self {
        self.pasid = Some(pasid);
        self.supervisor = supervisor;
        self
    }
}

/// Most (DID, PASID, stage) tags live at once.
pub const SM_TAGS_MAX: usize = 4096;
/// Scalable-mode tags are numbered from here (legacy tags are DIDs, below 2^16).
const SM_TAG_BASE: u32 = 1 << 16;

/// What a scalable-mode IOTLB tag stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct SmTag {
    pub(super) did: u16,
    pub(super) pasid: u32,
    /// First-stage or nested (reached by PASID-based descriptors).
    pub(super) first_stage: bool,
}

/// A PASID-cache entry: what the PASID-table entry said, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CachedPasid {
    sid: u16,
    pasid: u32,
    did: u16,
    pgtt: Pgtt,
    fpd: bool,
    sre: bool,
    sl_root: u64,
    sl_levels: u32,
    fl_root: u64,
    fl_levels: u32,
}

/// The scalable-mode caches: the PASID cache and the tag table.
pub(super) struct SmCaches {
    /// Fully associative, FIFO replacement.
    pasid: VecDeque<CachedPasid>,
    pasid_capacity: usize,
    tags: Vec<SmTag>,
    index: HashMap<SmTag, u32>,
}

impl SmCaches {
    pub(super) fn new(pasid_capacity: usize) -> Self {
        Self {
            pasid: VecDeque::with_capacity(pasid_capacity.min(4096)),
            pasid_capacity,
            tags: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// The tags whose meaning satisfies `f`, in numbering order.
    pub(super) fn tags_where(&self, f: impl Fn(&SmTag) -> bool) -> Vec<Asid> {
        self.tags
            .iter()
            .enumerate()
            .filter(|(_, t)| f(t))
            .map(|(i, _)| Asid(SM_TAG_BASE + i as u32))
            .collect()
    }

    /// Drops PASID-cache entries (type 7); returns how many.
    pub(super) fn invalidate_pasid_cache(&mut self, did: u16, g: PcGranularity) -> usize {
        let before = self.pasid.len();
        match g {
            PcGranularity::Global => self.pasid.clear(),
            PcGranularity::Domain => self.pasid.retain(|e| e.did != did),
            PcGranularity::Pasid { pasid } => {
                self.pasid.retain(|e| !(e.did == did && e.pasid == pasid))
            }
        }
        before - self.pasid.len()
    }
}

/// The tag of (DID, PASID, stage), numbering a new one if needed (and rolling over when
/// the table is full).
fn sm_tag(c: &mut Caches, tag: SmTag) -> Asid {
    if let Some(&i) = c.sm.index.get(&tag) {
        return Asid(SM_TAG_BASE + i);
    }
    if c.sm.tags.len() >= SM_TAGS_MAX {
        c.iotlb.invalidate_all();
        c.walk.invalidate_all();
        c.sm.tags.clear();
        c.sm.index.clear();
    }
    let i = c.sm.tags.len() as u32;
    c.sm.tags.push(tag);
    c.sm.index.insert(tag, i);
    Asid(SM_TAG_BASE + i)
}

/// A leaf the walk found.
#[derive(Clone, Copy, Debug)]
pub(super) struct Leaf {
    /// Output page base.
    pub(super) pa: u64,
    /// Page size.
    pub(super) size: u64,
    /// Read / write along the whole walk.
    pub(super) prot: Prot,
    /// U/S on every first-stage level (always true for the second stage).
    pub(super) user: bool,
}

impl Dmar {
    fn read_words<const N: usize>(&self, pa: u64) -> [u64; N] {
        std::array::from_fn(|i| read_u64(self.memory(), pa + 8 * i as u64))
    }

    /// The scalable-mode context entry of `sid` as memory holds it (`None` if the root
    /// half is clear or an entry does not decode).
    pub fn read_sm_context(&self, sid: u16) -> Option<SmContextEntry> {
        let (bus, devfn) = (u64::from(sid >> 8), (sid & 0xFF) as u8);
        let root = SmRootEntry::decode(
            self.read_words(self.root_table().get() + bus * spec::ROOT_ENTRY_BYTES),
        )?;
        let (present, table, idx) = root.table_for(devfn);
        if !present {
            return None;
        }
        SmContextEntry::decode(self.read_words(table + idx * spec::SM_CONTEXT_ENTRY_BYTES))
    }

    /// Looks up (or reads and caches) the scalable-mode context entry of `sid`.
    fn sm_context(&self, sid: u16, work: &mut WorkRecord) -> Result<SmContextEntry, (u8, bool)> {
        {
            let c = self.caches.lock();
            if let Some(sm) = c.context.iter().find(|c| c.sid == sid).and_then(|c| c.sm) {
                drop(c);
                self.stats.lock().context_hits += 1;
                return Ok(sm);
            }
        }
        self.stats.lock().context_misses += 1;
        let (bus, devfn) = (u64::from(sid >> 8), (sid & 0xFF) as u8);
        work.walk_reads += 1;
        let raw = self.read_words(self.root_table().get() + bus * spec::ROOT_ENTRY_BYTES);
        let root = SmRootEntry::decode(raw).ok_or((reason::SM_ROOT_RESERVED, false))?;
        let (present, table, idx) = root.table_for(devfn);
        if !present {
            return Err((reason::SM_ROOT_NOT_PRESENT, false));
        }
        work.walk_reads += 1;
        let raw = self.read_words(table + idx * spec::SM_CONTEXT_ENTRY_BYTES);
        let ce = SmContextEntry::decode(raw).ok_or((reason::SM_CONTEXT_RESERVED, false))?;
        if !ce.present {
            return Err((reason::SM_CONTEXT_NOT_PRESENT, ce.fpd));
        }
        let mut c = self.caches.lock();
        if c.context_capacity > 0 {
            if c.context.len() >= c.context_capacity {
                c.context.pop_front();
            }
            c.context.push_back(CachedContext {
                sid,
                did: 0,
                fpd: ce.fpd,
                tt: TranslationType::MultiLevel,
                root: 0,
                levels: 0,
                sm: Some(ce),
            });
        }
        Ok(ce)
    }

    /// Looks up (or reads, checks and caches) the PASID-table entry of `pasid` for `sid`.
    fn sm_pasid(
        &self,
        sid: u16,
        pasid: u32,
        ctx: &SmContextEntry,
        work: &mut WorkRecord,
    ) -> Result<CachedPasid, (u8, bool)> {
        {
            let c = self.caches.lock();
            let hit =
                c.sm.pasid
                    .iter()
                    .find(|e| e.sid == sid && e.pasid == pasid)
                    .copied();
            if let Some(e) = hit {
                drop(c);
                self.stats.lock().pasid_hits += 1;
                return Ok(e);
            }
        }
        self.stats.lock().pasid_misses += 1;
        let mut fpd = ctx.fpd;
        work.walk_reads += 1;
        let raw = read_u64(self.memory(), ctx.pasid_dir + u64::from(pasid >> 6) * 8);
        let dir = PasidDirEntry::decode(raw).ok_or((reason::SM_DIR_RESERVED, fpd))?;
        fpd |= dir.fpd;
        if !dir.present {
            return Err((reason::SM_DIR_NOT_PRESENT, fpd));
        }
        work.walk_reads += 1;
        let at = dir.table + u64::from(pasid & 63) * spec::PASID_ENTRY_BYTES;
        let pe = PasidEntry::decode(self.read_words(at)).ok_or((reason::SM_PASID_RESERVED, fpd))?;
        fpd |= pe.fpd;
        if !pe.present {
            return Err((reason::SM_PASID_NOT_PRESENT, fpd));
        }
        let (cap, ecap) = (self.config.cap, self.config.ecap);
        let ss_ok = pe.aw <= 3 && cap.sagaw() & (1 << pe.aw) != 0;
        let fs_ok = pe.flpm == 0 || cap.fl5lp();
        let valid = match pe.pgtt {
            Pgtt::FirstStage => ecap.flts() && fs_ok,
            Pgtt::SecondStage => ecap.slts() && ss_ok,
            Pgtt::Nested => ecap.nest() && ss_ok && fs_ok,
            Pgtt::PassThrough => ecap.pt(),
        };
        if !valid {
            return Err((reason::SM_PASID_INVALID, fpd));
        }
        let entry = CachedPasid {
            sid,
            pasid,
            did: pe.did,
            pgtt: pe.pgtt,
            fpd,
            sre: pe.sre,
            sl_root: pe.slptptr,
            sl_levels: spec::levels_of_agaw(u32::from(pe.aw)),
            fl_root: pe.flptptr,
            fl_levels: 4 + u32::from(pe.flpm),
        };
        let mut c = self.caches.lock();
        if c.sm.pasid_capacity > 0 {
            if c.sm.pasid.len() >= c.sm.pasid_capacity {
                c.sm.pasid.pop_front();
            }
            c.sm.pasid.push_back(entry);
        }
        Ok(entry)
    }

    /// The unit translates `req` (see the module docs). In legacy mode a request without
    /// PASID is [`Dmar::translate`]; one with PASID faults 0x31 (TTM 0 for a request with
    /// PASID). Counts as [`Dmar::translate`] does, PASID-entry reads included in
    /// `walk_reads`.
    ///
    /// # Errors
    ///
    /// The fault the unit raises (and records unless FPD or overflow).
    pub fn translate_request(
        &self,
        req: &VtdRequest,
        work: &mut WorkRecord,
    ) -> Result<DmarTranslation, DmarFault> {
        let addr = req.iova.get();
        let fault =
            |r: u8, fpd: bool| self.fault_pasid(r, req.sid, req.pasid, addr, req.access, fpd);
        if !self.is_scalable() {
            if req.pasid.is_some() {
                work.translations += 1;
                return Err(fault(reason::SM_TTM0_WITH_PASID, false));
            }
            return self.translate(req.sid, req.iova, req.access, work);
        }
        work.translations += 1;
        let ctx = self
            .sm_context(req.sid, work)
            .map_err(|(r, fpd)| fault(r, fpd))?;
        let pasid = match req.pasid {
            Some(_) if !ctx.paside => return Err(fault(reason::SM_PASIDE_CLEAR, ctx.fpd)),
            Some(p) => p,
            None => ctx.rid_pasid,
        };
        if u64::from(pasid >> 6) >= ctx.dir_entries() {
            return Err(fault(reason::SM_PASID_TOO_LARGE, ctx.fpd));
        }
        let pe = self
            .sm_pasid(req.sid, pasid, &ctx, work)
            .map_err(|(r, fpd)| fault(r, fpd))?;
        let supervisor = req.pasid.is_some() && req.supervisor;
        if supervisor && !pe.sre {
            return Err(fault(reason::SM_SRE_CLEAR, pe.fpd));
        }
        if pe.pgtt == Pgtt::PassThrough {
            return Ok(DmarTranslation::passthrough(addr));
        }
        let first = matches!(pe.pgtt, Pgtt::FirstStage | Pgtt::Nested);
        if first {
            let w = spec::width_of_levels(pe.fl_levels);
            let top = (addr as i64) >> (w - 1);
            if top != 0 && top != -1 {
                return Err(fault(reason::SM_NOT_CANONICAL, pe.fpd));
            }
        } else if addr >> spec::width_of_levels(pe.sl_levels) != 0 {
            return Err(fault(reason::SM_BEYOND_MAX, pe.fpd));
        }
        let denied = match req.access {
            Access::Read => reason::SM_NO_READ,
            Access::Write => reason::SM_NO_WRITE,
        };
        let mut caches = self.caches.lock();
        let tag = sm_tag(
            &mut caches,
            SmTag {
                did: pe.did,
                pasid,
                first_stage: first,
            },
        );
        if let Some(hit) = caches.iotlb.lookup(tag, req.iova, work) {
            drop(caches);
            if !hit.prot.allows(req.access.prot()) {
                return Err(fault(denied, pe.fpd));
            }
            return Ok(DmarTranslation {
                pa: hit.pa,
                page_size: hit.page_size,
                iotlb_hit: true,
                stale: hit.stale,
                prot: hit.prot,
            });
        }
        let walked = if first {
            self.walk_first(&mut caches, tag, &pe, addr, work)
        } else {
            let (root, levels) = (pe.sl_root, pe.sl_levels);
            self.walk_second(
                &mut caches,
                tag,
                (root, levels),
                addr,
                reason::SM_SL_NOT_PRESENT,
                work,
            )
        };
        let leaf = match walked {
            Ok(leaf) => leaf,
            Err(r) => {
                drop(caches);
                return Err(fault(r, pe.fpd));
            }
        };
        if !supervisor && !leaf.user {
            drop(caches);
            return Err(fault(reason::SM_US_CLEAR, pe.fpd));
        }
        let base = addr & !(leaf.size - 1);
        let ok = caches.iotlb.insert(
            tag,
            Iova::new(base),
            PhysAddr::new(leaf.pa),
            leaf.size,
            leaf.prot,
        );
        debug_assert!(ok.is_ok());
        drop(caches);
        if !leaf.prot.allows(req.access.prot()) {
            return Err(fault(denied, pe.fpd));
        }
        Ok(DmarTranslation {
            pa: PhysAddr::new(leaf.pa + (addr - base)),
            page_size: leaf.size,
            iotlb_hit: false,
            stale: false,
            prot: leaf.prot,
        })
    }

    /// The second-stage walk of `addr` in the table `(root, levels)`, from the deepest
    /// paging-structure-cache hit (legacy and scalable mode alike); a not-present entry
    /// fails with `not_present` (its fault reason in the caller's mode), after a negative
    /// IOTLB fill under Caching Mode. The caller fills the IOTLB with the leaf.
    pub(super) fn walk_second(
        &self,
        c: &mut Caches,
        tag: Asid,
        (root, levels): (u64, u32),
        addr: u64,
        not_present: u8,
        work: &mut WorkRecord,
    ) -> Result<Leaf, u8> {
        let iova = Iova::new(addr);
        // The paging-structure caches are built for the unit's levels; a table with fewer
        // levels walks without them.
        let use_ps = levels == self.levels;
        let deepest = if use_ps {
            c.walk.lookup_deepest(tag, iova)
        } else {
            None
        };
        let (mut level, mut table) = match deepest {
            Some(e) => (levels - 1 - e.level as u32, e.table_pa.get()),
            None => {
                work.full_walks += 1;
                (levels, root)
            }
        };
        loop {
            let shift = 12 + 9 * (level - 1);
            work.walk_reads += 1;
            let raw = read_u64(self.memory(), table + ((addr >> shift) & 511) * 8);
            match SlPte::decode(raw, level) {
                SlPte::NotPresent => {
                    if self.config.cap.cm() {
                        // Caching Mode: remember the not-present translation.
                        let ok = c.iotlb.insert(
                            tag,
                            iova.align_down(SZ_4K),
                            PhysAddr::new(0),
                            SZ_4K,
                            Prot::NONE,
                        );
                        debug_assert!(ok.is_ok());
                        self.stats.lock().negative_fills += 1;
                    }
                    return Err(not_present);
                }
                SlPte::Table { next } => {
                    if use_ps {
                        let depth = (levels - level) as usize;
                        let ok = c.walk.insert(tag, depth, iova, PhysAddr::new(next));
                        debug_assert!(ok.is_ok());
                    }
                    table = next;
                    level -= 1;
                }
                SlPte::Leaf { pa, prot } => {
                    return Ok(Leaf {
                        pa,
                        size: 1 << shift,
                        prot,
                        user: true,
                    })
                }
            }
        }
    }

    /// A second-stage translation of guest-physical `gpa` for a nested walk: no caches,
    /// one `walk_reads` per entry. Returns the host-physical address and the leaf.
    fn nested_gpa(
        &self,
        pe: &CachedPasid,
        gpa: u64,
        work: &mut WorkRecord,
    ) -> Result<(u64, Leaf), u8> {
        if gpa >> spec::width_of_levels(pe.sl_levels) != 0 {
            return Err(reason::SM_BEYOND_MAX);
        }
        let (mut level, mut table) = (pe.sl_levels, pe.sl_root);
        loop {
            let shift = 12 + 9 * (level - 1);
            work.walk_reads += 1;
            let raw = read_u64(self.memory(), table + ((gpa >> shift) & 511) * 8);
            match SlPte::decode(raw, level) {
                SlPte::NotPresent => return Err(reason::SM_SL_NOT_PRESENT),
                SlPte::Table { next } => {
                    table = next;
                    level -= 1;
                }
                SlPte::Leaf { pa, prot } => {
                    let size = 1u64 << shift;
                    let leaf = Leaf {
                        pa,
                        size,
                        prot,
                        user: true,
                    };
                    return Ok((pa + (gpa & (size - 1)), leaf));
                }
            }
        }
    }

    /// The first-stage (or nested) walk of `addr` from the deepest paging-structure-cache
    /// hit.
    fn walk_first(
        &self,
        c: &mut Caches,
        tag: Asid,
        pe: &CachedPasid,
        addr: u64,
        work: &mut WorkRecord,
    ) -> Result<Leaf, u8> {
        let iova = Iova::new(addr);
        let levels = pe.fl_levels;
        let nested = pe.pgtt == Pgtt::Nested;
        // A table pointer as the walk reads it: host-physical, or guest-physical to
        // translate through the second stage when nested.
        let host = |gpa: u64, work: &mut WorkRecord| -> Result<u64, u8> {
            if nested {
                self.nested_gpa(pe, gpa, work).map(|(hpa, _)| hpa)
            } else {
                Ok(gpa)
            }
        };
        let use_ps = levels == self.levels;
        let deepest = if use_ps {
            c.walk.lookup_deepest(tag, iova)
        } else {
            None
        };
        // A cached non-leaf entry implies full rights above it (see the module docs).
        let (mut level, mut table) = match deepest {
            Some(e) => (levels - 1 - e.level as u32, e.table_pa.get()),
            None => {
                work.full_walks += 1;
                (levels, host(pe.fl_root, work)?)
            }
        };
        let (mut write, mut user) = (true, true);
        loop {
            let shift = 12 + 9 * (level - 1);
            work.walk_reads += 1;
            let raw = read_u64(self.memory(), table + ((addr >> shift) & 511) * 8);
            user &= raw & fl::US != 0;
            match FlPte::decode(raw, level) {
                FlPte::NotPresent => return Err(reason::SM_FL_NOT_PRESENT),
                FlPte::Table { next, write: w } => {
                    write &= w;
                    let next = host(next, work)?;
                    if use_ps && write && user {
                        let depth = (levels - level) as usize;
                        let ok = c.walk.insert(tag, depth, iova, PhysAddr::new(next));
                        debug_assert!(ok.is_ok());
                    }
                    table = next;
                    level -= 1;
                }
                FlPte::Leaf { pa, write: w } => {
                    write &= w;
                    let size = 1u64 << shift;
                    let prot = Prot { read: true, write };
                    if !nested {
                        return Ok(Leaf {
                            pa,
                            size,
                            prot,
                            user,
                        });
                    }
                    let gpa = pa + (addr & (size - 1));
                    let (hpa, sl) = self.nested_gpa(pe, gpa, work)?;
                    let eff = size.min(sl.size);
                    return Ok(Leaf {
                        pa: hpa & !(eff - 1),
                        size: eff,
                        prot: Prot {
                            read: sl.prot.read,
                            write: write && sl.prot.write,
                        },
                        user,
                    });
                }
            }
        }
    }

    /// PASID-cache entries.
    pub fn pasid_cache_len(&self) -> usize {
        self.caches.lock().sm.pasid.len()
    }

    /// Whether the IOTLB holds an entry of (`did`, `pasid`) covering `iova`, either
    /// stage, without counting or touching replacement state (scalable mode).
    pub fn iotlb_probe_pasid(
        &self,
        did: u16,
        pasid: u32,
        iova: Iova,
    ) -> Option<crate::iotlb::IotlbHit> {
        let c = self.caches.lock();
        c.sm.tags_where(|t| t.did == did && t.pasid == pasid)
            .into_iter()
            .find_map(|t| c.iotlb.probe(t, iova))
    }

    /// Writes `domain`'s PASID-table entry for RID_PASID, the PASID directory entry and
    /// `sid`'s scalable-mode context entry (allocating the context table, directory and
    /// PASID table), then, with Caching Mode, invalidates as Linux does after a new entry
    /// (context-cache, PASID-cache and IOTLB or PASID-IOTLB, one wait). `ats` sets DTE.
    pub(super) fn attach_sm(
        &self,
        sid: u16,
        domain: &DmarDomain,
        ats: bool,
        work: &mut WorkRecord,
    ) -> Result<(), DmarError> {
        if self.read_sm_context(sid).is_some_and(|c| c.present) {
            return Err(DmarError::AlreadyAttached { sid });
        }
        let page = || -> Result<u64, DmarError> {
            Ok(self
                .alloc
                .alloc(1, 1, PhysAddr::new(u64::MAX), &mut WorkRecord::new())?
                .get())
        };
        let (bus, devfn) = (u64::from(sid >> 8), (sid & 0xFF) as u8);
        let root_pa = self.root_table().get() + bus * spec::ROOT_ENTRY_BYTES;
        let mut root = SmRootEntry::decode(self.read_words(root_pa)).unwrap_or_default();
        let (present, table, idx) = root.table_for(devfn);
        let table = if present {
            table
        } else {
            let t = page()?;
            if devfn < 0x80 {
                (root.lower_present, root.lower_table) = (true, t);
            } else {
                (root.upper_present, root.upper_table) = (true, t);
            }
            self.write_u64s(root_pa, &root.encode());
            t
        };
        let (dir, ptable) = (page()?, page()?);
        let first = domain.stage == VtdStage::First;
        let pasid = spec::RID_PASID_LINUX;
        let pe = PasidEntry {
            present: true,
            aw: if first {
                spec::agaw_of_levels(self.levels) as u8
            } else {
                domain.agaw
            },
            pgtt: if first {
                Pgtt::FirstStage
            } else {
                Pgtt::SecondStage
            },
            slptptr: if first { 0 } else { domain.root.get() },
            flptptr: if first { domain.root.get() } else { 0 },
            flpm: u8::from(first && domain.levels == 5),
            nxe: first && domain.exec.nxe,
            did: domain.did,
            ..PasidEntry::default()
        };
        let pe_at = ptable + u64::from(pasid & 63) * spec::PASID_ENTRY_BYTES;
        self.write_u64s(pe_at, &pe.encode());
        let de = PasidDirEntry {
            present: true,
            fpd: false,
            table: ptable,
        };
        self.write_u64s(dir + u64::from(pasid >> 6) * 8, &[de.encode()]);
        let ce = SmContextEntry {
            present: true,
            fpd: false,
            dte: ats,
            paside: self.config.ecap.pasid(),
            pre: false,
            // 2^(2+7) = 512 directory entries: one 4 KiB page.
            pdts: 2,
            pasid_dir: dir,
            rid_pasid: pasid,
        };
        self.write_u64s(table + idx * spec::SM_CONTEXT_ENTRY_BYTES, &ce.encode());
        if self.config.cap.cm() {
            let descs = [
                InvDesc::ContextCache(CcGranularity::Device { did: 0, sid, fm: 0 }),
                InvDesc::PasidCache {
                    did: domain.did,
                    granularity: PcGranularity::Pasid { pasid },
                },
                flush_all_desc(domain.did, pasid, first),
            ];
            self.qi_submit_sync(&descs, work)?;
        }
        Ok(())
    }

    /// Clears `sid`'s scalable-mode context entry and its PASID entry, invalidates as
    /// Linux's teardown does (PASID-cache, IOTLB or PASID-IOTLB, context-cache, one wait),
    /// then frees the directory and PASID table.
    pub(super) fn detach_sm(&self, sid: u16, work: &mut WorkRecord) -> Result<(), DmarError> {
        let Some(ce) = self.read_sm_context(sid).filter(|c| c.present) else {
            return Ok(());
        };
        let pasid = ce.rid_pasid;
        let dir_at = ce.pasid_dir + u64::from(pasid >> 6) * 8;
        let dir = PasidDirEntry::decode(read_u64(self.memory(), dir_at)).filter(|d| d.present);
        let pe = dir.and_then(|d| {
            PasidEntry::decode(
                self.read_words(d.table + u64::from(pasid & 63) * spec::PASID_ENTRY_BYTES),
            )
        });
        let (bus, devfn) = (u64::from(sid >> 8), (sid & 0xFF) as u8);
        let root = SmRootEntry::decode(
            self.read_words(self.root_table().get() + bus * spec::ROOT_ENTRY_BYTES),
        )
        .unwrap_or_default();
        let (_, table, idx) = root.table_for(devfn);
        self.write_u64s(table + idx * spec::SM_CONTEXT_ENTRY_BYTES, &[0; 4]);
        let mut descs = Vec::with_capacity(3);
        if let Some(pe) = pe.filter(|p| p.present) {
            let first = matches!(pe.pgtt, Pgtt::FirstStage | Pgtt::Nested);
            descs.push(InvDesc::PasidCache {
                did: pe.did,
                granularity: PcGranularity::Pasid { pasid },
            });
            descs.push(flush_all_desc(pe.did, pasid, first));
        }
        descs.push(InvDesc::ContextCache(CcGranularity::Device {
            did: 0,
            sid,
            fm: 0,
        }));
        self.qi_submit_sync(&descs, work)?;
        let mut scratch = WorkRecord::new();
        if let Some(d) = dir {
            self.alloc.free(PhysAddr::new(d.table), 1, &mut scratch)?;
        }
        self.alloc
            .free(PhysAddr::new(ce.pasid_dir), 1, &mut scratch)?;
        Ok(())
    }

    /// Attaches `sid` to `domain` as [`Dmar::attach`] does, with ATS: the context entry
    /// allows translation requests (legacy TT = 1, scalable DTE = 1), the device gets an
    /// ATC of `atc_entries` ([`super::devtlb`]), and the domain's invalidator adds a
    /// device-TLB invalidation for it to every flush (Linux's DEVTLB cache tag).
    ///
    /// # Errors
    ///
    /// As [`Dmar::attach`].
    pub fn attach_ats(
        &self,
        sid: u16,
        domain: &DmarDomain,
        atc_entries: usize,
        work: &mut WorkRecord,
    ) -> Result<(), DmarError> {
        if domain.unit != self as *const Self as usize {
            return Err(DmarError::ForeignDomain { did: domain.did });
        }
        if self.is_scalable() {
            self.attach_sm(sid, domain, true, work)?;
        } else {
            self.attach_legacy(sid, domain, TranslationType::MultiLevelDevTlb, work)?;
        }
        self.devtlbs.lock().insert(sid, DevTlb::new(atc_entries));
        domain.invalidator.add_ats_device(sid);
        Ok(())
    }

    /// A device's DMA through its ATC: a hit that grants the access translates at the
    /// device; otherwise a translation request to the unit ([`Dmar::translate`]) whose
    /// completion fills the ATC. A source id attached without ATS goes to the unit every
    /// time. Counts `devtlb_hits` / `devtlb_misses` in [`DmarStats`](super::DmarStats).
    ///
    /// # Errors
    ///
    /// The unit's fault on a miss.
    pub fn ats_translate(
        &self,
        sid: u16,
        iova: Iova,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<DmarTranslation, DmarFault> {
        let addr = iova.get();
        {
            let atcs = self.devtlbs.lock();
            let Some(atc) = atcs.get(&sid) else {
                drop(atcs);
                return self.translate(sid, iova, access, work);
            };
            if let Some(e) = atc
                .lookup(None, addr)
                .filter(|e| e.prot.allows(access.prot()))
            {
                drop(atcs);
                self.stats.lock().devtlb_hits += 1;
                return Ok(DmarTranslation {
                    pa: PhysAddr::new(e.pa + (addr - e.base)),
                    page_size: e.size,
                    iotlb_hit: false,
                    stale: false,
                    prot: e.prot,
                });
            }
        }
        self.stats.lock().devtlb_misses += 1;
        let t = self.translate(sid, iova, access, work)?;
        let base = addr & !(t.page_size - 1);
        if let Some(atc) = self.devtlbs.lock().get_mut(&sid) {
            atc.insert(AtcEntry {
                pasid: None,
                base,
                size: t.page_size,
                pa: t.pa.get() - (addr - base),
                prot: t.prot,
            });
        }
        Ok(t)
    }

    /// Entries in `sid`'s ATC (`None` without ATS).
    pub fn devtlb_len(&self, sid: u16) -> Option<usize> {
        self.devtlbs.lock().get(&sid).map(DevTlb::len)
    }
}

/// The whole-PASID flush of a domain's stage: a PASID-based IOTLB invalidation of every
/// entry of the PASID (first stage) or a domain-selective IOTLB invalidation (second).
pub(super) fn flush_all_desc(did: u16, pasid: u32, first_stage: bool) -> InvDesc {
    if first_stage {
        InvDesc::PasidIotlb {
            did,
            pasid,
            granularity: PasidIotlbGranularity::AllOfPasid,
        }
    } else {
        InvDesc::Iotlb {
            granularity: IotlbGranularity::Domain { did },
            drain_reads: false,
            drain_writes: false,
        }
    }
}
