//! A device-TLB (PCIe ATS address translation cache, ATC) in an endpoint behind a
//! [`Dmar`](super::Dmar): what makes device-TLB invalidation descriptors observable.
//!
//! A device attached with ATS ([`Dmar::attach_ats`](super::Dmar::attach_ats)) sends
//! translated requests from its ATC and asks the unit only on a miss
//! ([`Dmar::ats_translate`](super::Dmar::ats_translate)); the completion (output page,
//! size, permissions) fills the ATC. Nothing but a device-TLB invalidation removes an
//! entry: an unmap that invalidates only the IOTLB leaves the device translating through
//! the old page. Descriptors (X86.md §1.6):
//!
//! - type 3 (device-TLB): the entries of requests without PASID overlapping the range
//!   [`devtlb_range`](super::spec::devtlb_range) decodes from ADDR and S;
//! - type 8 (PASID-based device-TLB): the entries of one PASID in the range, or with G
//!   the entries of every PASID.
//!
//! The ATC is fully associative with FIFO replacement and a fixed capacity (the size of
//! real ATCs is device-specific and rarely published).

use std::collections::VecDeque;

use crate::addr::Prot;

/// One cached translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtcEntry {
    /// The PASID of the request that filled it (`None`: a request without PASID).
    pub pasid: Option<u32>,
    /// Input page base.
    pub base: u64,
    /// Page size.
    pub size: u64,
    /// Output page base.
    pub pa: u64,
    /// Permissions the completion granted.
    pub prot: Prot,
}

impl AtcEntry {
    fn overlaps(&self, start: u64, len: u64) -> bool {
        // len 0 means the whole address space.
        len == 0 || (self.base < start.saturating_add(len) && start < self.base + self.size)
    }
}

/// Which entries a device-TLB invalidation selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtcSelect {
    /// Entries of requests without PASID (type 3).
    NoPasid,
    /// Entries of every PASID (type 8 with G).
    AnyPasid,
    /// Entries of one PASID (type 8).
    Pasid(u32),
}

/// A device's ATC. See the module docs.
#[derive(Clone, Debug)]
pub struct DevTlb {
    entries: VecDeque<AtcEntry>,
    capacity: usize,
}

impl DevTlb {
    /// An empty ATC of `capacity` entries (0 caches nothing).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
        }
    }

    /// The entry of `pasid` covering `iova`.
    pub fn lookup(&self, pasid: Option<u32>, iova: u64) -> Option<AtcEntry> {
        self.entries
            .iter()
            .find(|e| e.pasid == pasid && e.base <= iova && iova - e.base < e.size)
            .copied()
    }

    /// Caches a completion, evicting the oldest entry when full.
    pub fn insert(&mut self, entry: AtcEntry) {
        if self.capacity == 0 {
            return;
        }
        self.entries
            .retain(|e| !(e.pasid == entry.pasid && e.overlaps(entry.base, entry.size)));
        if self.entries.len() >= self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    /// Drops the selected entries overlapping `start..start + len` (`len` 0: everything).
    /// Returns how many.
    pub fn invalidate(&mut self, which: AtcSelect, start: u64, len: u64) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| {
            let selected = match which {
                AtcSelect::NoPasid => e.pasid.is_none(),
                AtcSelect::AnyPasid => e.pasid.is_some(),
                AtcSelect::Pasid(p) => e.pasid == Some(p),
            };
            !(selected && e.overlaps(start, len))
        });
        before - self.entries.len()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pasid: Option<u32>, base: u64, size: u64) -> AtcEntry {
        AtcEntry {
            pasid,
            base,
            size,
            pa: 0x8000_0000 + base,
            prot: Prot::READ_WRITE,
        }
    }

    #[test]
    fn invalidation_drops_only_the_selected_overlapping_entries() {
        let mut atc = DevTlb::new(8);
        atc.insert(entry(None, 0x1_0000, 0x1000));
        atc.insert(entry(None, 0x1_3000, 0x1000));
        atc.insert(entry(Some(5), 0x1_0000, 0x1000));
        atc.insert(entry(None, 0x20_0000, 0x20_0000));
        // 0x1_0000..0x1_2000 (an 8 KiB S-encoded range): one untagged entry.
        assert_eq!(atc.invalidate(AtcSelect::NoPasid, 0x1_0000, 0x2000), 1);
        assert!(atc.lookup(None, 0x1_0000).is_none());
        assert!(atc.lookup(None, 0x1_3000).is_some());
        assert!(atc.lookup(Some(5), 0x1_0000).is_some());
        // A 4 KiB range inside the 2 MiB entry drops the whole entry.
        assert_eq!(atc.invalidate(AtcSelect::NoPasid, 0x30_0000, 0x1000), 1);
        assert_eq!(atc.invalidate(AtcSelect::Pasid(6), 0, 0), 0);
        assert_eq!(atc.invalidate(AtcSelect::AnyPasid, 0, 0), 1);
        assert_eq!(atc.len(), 1);
    }

    #[test]
    fn fifo_replacement_at_capacity() {
        let mut atc = DevTlb::new(2);
        atc.insert(entry(None, 0x1000, 0x1000));
        atc.insert(entry(None, 0x2000, 0x1000));
        atc.insert(entry(None, 0x3000, 0x1000));
        assert!(atc.lookup(None, 0x1000).is_none());
        assert!(atc.lookup(None, 0x2000).is_some() && atc.lookup(None, 0x3fff).is_some());
        let mut none = DevTlb::new(0);
        none.insert(entry(None, 0x1000, 0x1000));
        assert!(none.is_empty());
    }
}
