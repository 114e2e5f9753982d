//! The SMMU's translation caches (an [`Iotlb`] and a [`WalkCache`]) and the command-queue
//! consumer's effect on them ([`TlbCaches`] is the queue's [`CommandSink`]).
//!
//! Entries are tagged by ASID and translation regime ([`tlb_tag`]): a stream whose STE says
//! `STRW` = EL2 fills EL2-E2H entries, which only the EL2 TLBIs reach, and the NH TLBIs
//! only reach NS-EL1 entries. The two "all" commands (`CMD_TLBI_NSNH_ALL`,
//! `CMD_TLBI_EL2_ALL`) drop every entry, of both regimes (an over-invalidation, which no
//! path of Linux's relies on or suffers from).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::cmdq::CommandSink;
use super::spec::{Command, StreamWorld};
use crate::addr::Iova;
use crate::iotlb::{Asid, CacheConfigError, Iotlb, IotlbConfig, WalkCache, WalkCacheConfig};

/// The cache tag of `asid`'s entries in `world`: the ASID, with bit 16 set for EL2-E2H
/// entries (ASIDs are 16 bits, so the two regimes never share a tag).
#[inline]
pub fn tlb_tag(asid: u16, world: StreamWorld) -> Asid {
    match world {
        StreamWorld::NsEl1 => Asid(u32::from(asid)),
        StreamWorld::El2 => Asid(u32::from(asid) | 1 << 16),
    }
}

/// The IOTLB and walk cache, behind one lock.
#[derive(Debug)]
pub struct Caches {
    /// Leaf translations.
    pub iotlb: Iotlb,
    /// Table descriptors, per level.
    pub walk: WalkCache,
}

/// What the consumer has applied to the caches.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SinkStats {
    /// `CMD_TLBI_NH_VA` and `CMD_TLBI_EL2_VA` commands applied (single-page and range).
    pub tlbi_va: u64,
    /// Range commands (`TG != 0`) among them.
    pub tlbi_va_ranges: u64,
    /// `CMD_TLBI_NH_ASID` and `CMD_TLBI_EL2_ASID` commands applied.
    pub tlbi_asid: u64,
    /// `CMD_TLBI_NSNH_ALL` and `CMD_TLBI_EL2_ALL` commands applied.
    pub tlbi_all: u64,
    /// The EL2 forms among the TLBIs above (`CMD_TLBI_EL2_*`).
    pub tlbi_el2: u64,
    /// `CMD_CFGI_STE` and `CMD_CFGI_CD` commands (no configuration cache is modelled).
    pub cfgi: u64,
    /// `CMD_SYNC` commands.
    pub syncs: u64,
    /// IOTLB entries removed by commands.
    pub iotlb_removed: u64,
    /// Walk-cache entries removed by commands.
    pub walk_removed: u64,
}

/// The SMMU's caches as the command queue's sink: the consumer applies each TLBI to them
/// in queue order.
#[derive(Debug)]
pub struct TlbCaches {
    caches: Mutex<Caches>,
    tlbi_va: AtomicU64,
    tlbi_va_ranges: AtomicU64,
    tlbi_asid: AtomicU64,
    tlbi_all: AtomicU64,
    tlbi_el2: AtomicU64,
    cfgi: AtomicU64,
    syncs: AtomicU64,
    iotlb_removed: AtomicU64,
    walk_removed: AtomicU64,
}

impl TlbCaches {
    /// Empty caches of the given geometries.
    pub fn new(iotlb: IotlbConfig, walk: WalkCacheConfig) -> Result<Self, CacheConfigError> {
        Ok(TlbCaches {
            caches: Mutex::new(Caches {
                iotlb: Iotlb::new(iotlb)?,
                walk: WalkCache::new(walk)?,
            }),
            tlbi_va: AtomicU64::new(0),
            tlbi_va_ranges: AtomicU64::new(0),
            tlbi_asid: AtomicU64::new(0),
            tlbi_all: AtomicU64::new(0),
            tlbi_el2: AtomicU64::new(0),
            cfgi: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            iotlb_removed: AtomicU64::new(0),
            walk_removed: AtomicU64::new(0),
        })
    }

    /// Locks the caches (for the device side, reports and tests).
    pub fn lock(&self) -> MutexGuard<'_, Caches> {
        self.caches.lock()
    }

    /// Totals of what the consumer applied.
    pub fn stats(&self) -> SinkStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SinkStats {
            tlbi_va: l(&self.tlbi_va),
            tlbi_va_ranges: l(&self.tlbi_va_ranges),
            tlbi_asid: l(&self.tlbi_asid),
            tlbi_all: l(&self.tlbi_all),
            tlbi_el2: l(&self.tlbi_el2),
            cfgi: l(&self.cfgi),
            syncs: l(&self.syncs),
            iotlb_removed: l(&self.iotlb_removed),
            walk_removed: l(&self.walk_removed),
        }
    }

    fn removed(&self, iotlb: usize, walk: usize) {
        self.iotlb_removed
            .fetch_add(iotlb as u64, Ordering::Relaxed);
        self.walk_removed.fetch_add(walk as u64, Ordering::Relaxed);
    }
}

impl TlbCaches {
    /// The invalidation commands: they take the caches' lock and search them.
    #[inline(never)]
    fn apply_invalidation(&self, cmd: &Command) {
        let bump = |a: &AtomicU64| {
            a.fetch_add(1, Ordering::Relaxed);
        };
        let world = match *cmd {
            Command::TlbiEl2Va { .. } | Command::TlbiEl2Asid { .. } | Command::TlbiEl2All => {
                bump(&self.tlbi_el2);
                StreamWorld::El2
            }
            _ => StreamWorld::NsEl1,
        };
        match *cmd {
            Command::TlbiNhVa {
                asid,
                addr,
                leaf,
                tg,
                ..
            }
            | Command::TlbiEl2Va {
                asid,
                addr,
                leaf,
                tg,
                ..
            } => {
                bump(&self.tlbi_va);
                let (asid, va) = (tlb_tag(asid, world), Iova::new(addr));
                let mut c = self.caches.lock();
                let (i, w) = if tg == 0 {
                    (
                        c.iotlb.invalidate_va(asid, va, leaf),
                        c.walk.invalidate_va(asid, va, leaf),
                    )
                } else {
                    bump(&self.tlbi_va_ranges);
                    let bytes = cmd.tlbi_range_bytes().unwrap_or(0);
                    let i = c.iotlb.invalidate_range(asid, va, bytes);
                    let w = if leaf {
                        0
                    } else {
                        c.walk.invalidate_range(asid, va, bytes)
                    };
                    (i, w)
                };
                drop(c);
                self.removed(i, w);
            }
            Command::TlbiNhAsid { asid, .. } | Command::TlbiEl2Asid { asid } => {
                bump(&self.tlbi_asid);
                let asid = tlb_tag(asid, world);
                let mut c = self.caches.lock();
                let (i, w) = (c.iotlb.invalidate_asid(asid), c.walk.invalidate_asid(asid));
                drop(c);
                self.removed(i, w);
            }
            Command::TlbiNsnhAll | Command::TlbiEl2All => {
                bump(&self.tlbi_all);
                let mut c = self.caches.lock();
                let (i, w) = (c.iotlb.invalidate_all(), c.walk.invalidate_all());
                drop(c);
                self.removed(i, w);
            }
            // Not invalidations: `apply` counts them without coming here.
            Command::CfgiSte { .. } | Command::CfgiCd { .. } | Command::Sync { .. } => {}
        }
    }
}

impl CommandSink for TlbCaches {
    // Inline: the consumer applies a `CMD_SYNC` after every batch, and that is one counter.
    #[inline]
    fn apply(&self, cmd: &Command) {
        match *cmd {
            Command::CfgiSte { .. } | Command::CfgiCd { .. } => {
                self.cfgi.fetch_add(1, Ordering::Relaxed);
            }
            Command::Sync { .. } => {
                self.syncs.fetch_add(1, Ordering::Relaxed);
            }
            Command::TlbiNhVa { .. }
            | Command::TlbiNhAsid { .. }
            | Command::TlbiNsnhAll
            | Command::TlbiEl2Va { .. }
            | Command::TlbiEl2Asid { .. }
            | Command::TlbiEl2All => {
                self.apply_invalidation(cmd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{PhysAddr, Prot, SZ_4K};
    use crate::iotlb::Replacement;

    fn caches() -> TlbCaches {
        TlbCaches::new(
            IotlbConfig::new(64, 4, Replacement::Lru),
            WalkCacheConfig::gem5(),
        )
        .unwrap()
    }

    fn fill(c: &TlbCaches, asid: u32, pages: u64) {
        let mut g = c.lock();
        for n in 0..pages {
            g.iotlb
                .insert(
                    Asid(asid),
                    Iova::new(n * SZ_4K),
                    PhysAddr::new(n * SZ_4K),
                    SZ_4K,
                    Prot::READ,
                )
                .unwrap();
        }
    }

    #[test]
    fn range_tlbi_removes_the_covered_pages_only() {
        let c = caches();
        fill(&c, 1, 20);
        c.apply(&Command::TlbiNhVa {
            vmid: 0,
            asid: 1,
            addr: 2 * SZ_4K,
            leaf: true,
            ttl: 3,
            tg: 1,
            num: 15,
            scale: 0,
        });
        assert_eq!(c.lock().iotlb.len(), 4);
        let s = c.stats();
        assert_eq!((s.tlbi_va, s.tlbi_va_ranges, s.iotlb_removed), (1, 1, 16));
    }

    #[test]
    fn asid_tlbi_leaves_other_asids() {
        let c = caches();
        fill(&c, 1, 3);
        fill(&c, 2, 3);
        c.apply(&Command::TlbiNhAsid { vmid: 0, asid: 1 });
        assert_eq!(c.lock().iotlb.count_asid(Asid(2)), 3);
        assert_eq!(c.lock().iotlb.count_asid(Asid(1)), 0);
        c.apply(&Command::TlbiNsnhAll);
        assert!(c.lock().iotlb.is_empty());
    }

    /// NH TLBIs reach NS-EL1 entries only, EL2 TLBIs EL2-E2H entries only.
    #[test]
    fn tlbis_reach_their_own_world_only() {
        let c = caches();
        let el2 = tlb_tag(1, StreamWorld::El2);
        fill(&c, 1, 2);
        fill(&c, el2.0, 2);
        c.apply(&Command::TlbiNhAsid { vmid: 0, asid: 1 });
        assert_eq!(c.lock().iotlb.count_asid(Asid(1)), 0);
        assert_eq!(c.lock().iotlb.count_asid(el2), 2);
        c.apply(&Command::TlbiEl2Va {
            asid: 1,
            addr: 0,
            leaf: true,
            ttl: 0,
            tg: 0,
            num: 0,
            scale: 0,
        });
        assert_eq!(c.lock().iotlb.count_asid(el2), 1);
        c.apply(&Command::TlbiEl2Asid { asid: 1 });
        assert!(c.lock().iotlb.is_empty());
        let s = c.stats();
        assert_eq!((s.tlbi_va, s.tlbi_asid, s.tlbi_el2), (1, 2, 2));
        fill(&c, el2.0, 2);
        c.apply(&Command::TlbiEl2All);
        assert!(c.lock().iotlb.is_empty());
    }
}
