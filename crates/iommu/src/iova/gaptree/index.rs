//! The gap tree's index of allocated ranges: a byte per page, in 64-page chunks that exist
//! only where some range starts.
//!
//! A free must be refused unless its range is allocated exactly as given, so the allocator
//! needs each live range's length by its first page. A hash map from first page to length
//! answers that, but scatters neighbouring ranges over the whole table: under random churn
//! with 100,000 live ranges every free and every allocation missed the cache in it, which
//! cost more than the whole tree of holes (measured: docs/PERFORMANCE.md). Top-down
//! allocation keeps live ranges packed, so this index keeps one byte per page instead, the
//! length of the range starting there (0: none starts here), grouped in chunks of 64 pages
//! (one cache line) found through a small directory keyed by page / 64. Neighbouring ranges
//! share a line, and the live set's index is about a byte per page of the region it spans.
//!
//! Lengths from 255 pages up store 255 in their byte and the length in a separate map. A
//! chunk whose last range is removed stays as the one *idle* chunk until another chunk
//! empties (so an allocator that allocates and frees one range at a time does not create and
//! release a chunk every time), so memory is bounded by one chunk per live range (when every
//! range is alone in its chunk), plus one, plus the directory.
//!
//! The directory has two levels: a hash map from page / 4096 to a *group* of 64 chunk slots
//! (256 bytes), then the group's slot. Under random churn the few hundred groups of the live
//! region (and the map's few hundred entries) stay in the cache, where a map with one entry
//! per chunk (thousands, spread over its whole table) missed it on every lookup. A group is
//! released when its last chunk is; the worst case adds a group per live range.

use std::collections::HashMap;

use foldhash::fast::FixedState;

/// Pages per chunk, as a shift.
const CHUNK_SHIFT: u32 = 6;
/// Pages per chunk.
const CHUNK_PAGES: usize = 1 << CHUNK_SHIFT;
/// Chunks per directory group, as a shift.
const GROUP_SHIFT: u32 = 6;
/// Chunks per directory group.
const GROUP_CHUNKS: usize = 1 << GROUP_SHIFT;

/// A group of [`GROUP_CHUNKS`] consecutive chunk numbers: the slot in `chunks` of each
/// (plus one; 0: the chunk is not in the directory), and how many are present.
#[derive(Debug, Clone)]
struct Group {
    slots: [u32; GROUP_CHUNKS],
    present: u32,
}
/// The byte of a range too long for a byte: its length is in `long`.
const LONG: u8 = u8::MAX;

/// One chunk's bytes, aligned to a cache line so that reading one touches one line.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Chunk([u8; CHUNK_PAGES]);

/// Allocated ranges by first page.
#[derive(Debug)]
pub(super) struct RangeIndex {
    /// Group number (chunk number / 64) -> index in `groups`.
    directory: HashMap<u64, u32, FixedState>,
    /// The directory's groups: chunk number -> slot in `chunks`.
    groups: Vec<Group>,
    /// Indexes of `groups` free for reuse.
    spare_groups: Vec<u32>,
    /// Per page of a chunk: the length of the range starting there, 0 if none.
    chunks: Vec<Chunk>,
    /// Slots of `chunks` free for reuse.
    spare: Vec<u32>,
    /// Lengths of the ranges whose byte is [`LONG`].
    long: HashMap<u64, u64, FixedState>,
    /// An empty chunk still in the directory, `(chunk number, slot)`: the last one emptied.
    idle: Option<(u64, u32)>,
    /// The last chunk looked up, `(chunk number, slot)`, if it is still in the directory:
    /// consecutive operations often fall in the same chunk (always, with one range live).
    last: Option<(u64, u32)>,
    /// Number of ranges.
    len: usize,
}

#[inline]
fn split(lo: u64) -> (u64, usize) {
    (lo >> CHUNK_SHIFT, (lo & (CHUNK_PAGES as u64 - 1)) as usize)
}

impl RangeIndex {
    pub(super) fn new() -> Self {
        Self {
            directory: HashMap::with_hasher(FixedState::default()),
            groups: Vec::new(),
            spare_groups: Vec::new(),
            chunks: Vec::new(),
            spare: Vec::new(),
            long: HashMap::with_hasher(FixedState::default()),
            idle: None,
            last: None,
            len: 0,
        }
    }

    /// Number of ranges.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Records a range of `pages` pages (at least 1) starting at `lo`, where none starts.
    #[inline]
    pub(super) fn insert(&mut self, lo: u64, pages: u64) {
        let (chunk, at) = split(lo);
        let slot = match self.slot(chunk) {
            Some(slot) => slot,
            None => {
                let slot = match self.spare.pop() {
                    Some(slot) => slot,
                    None => {
                        self.chunks.push(Chunk([0; CHUNK_PAGES]));
                        (self.chunks.len() - 1) as u32
                    }
                };
                self.attach(chunk, slot);
                self.last = Some((chunk, slot));
                slot
            }
        };
        if self.idle == Some((chunk, slot)) {
            self.idle = None;
        }
        let byte = &mut self.chunks[slot as usize].0[at];
        debug_assert_eq!(*byte, 0, "a range already starts at page {lo:#x}");
        if pages < u64::from(LONG) {
            *byte = pages as u8;
        } else {
            *byte = LONG;
            self.long.insert(lo, pages);
        }
        self.len += 1;
    }

    /// Removes the range starting at `lo` if it has exactly `pages` pages; false (and no
    /// change) otherwise.
    #[inline]
    pub(super) fn remove_exact(&mut self, lo: u64, pages: u64) -> bool {
        let (chunk, at) = split(lo);
        let Some(slot) = self.slot(chunk) else {
            return false;
        };
        let codes = &mut self.chunks[slot as usize].0;
        match codes[at] {
            0 => return false,
            LONG => {
                if self.long.get(&lo) != Some(&pages) {
                    return false;
                }
                self.long.remove(&lo);
            }
            b if u64::from(b) != pages => return false,
            _ => {}
        }
        codes[at] = 0;
        // OR-ing the whole line (no early exit) compiles to a few vector instructions.
        if codes.iter().fold(0, |acc, &b| acc | b) == 0 {
            if let Some((c, s)) = self.idle.replace((chunk, slot)) {
                self.detach(c);
                self.spare.push(s);
                if self.last == Some((c, s)) {
                    self.last = None;
                }
            }
        }
        self.len -= 1;
        true
    }

    /// The slot of `chunk`, if it is in the directory.
    #[inline]
    fn slot(&mut self, chunk: u64) -> Option<u32> {
        match self.last {
            Some((c, slot)) if c == chunk => Some(slot),
            _ => {
                let slot = self.lookup(chunk)?;
                self.last = Some((chunk, slot));
                Some(slot)
            }
        }
    }

    /// The slot of `chunk` in the directory, if it is there.
    #[inline]
    fn lookup(&self, chunk: u64) -> Option<u32> {
        let g = *self.directory.get(&(chunk >> GROUP_SHIFT))?;
        let s = self.groups[g as usize].slots[chunk as usize & (GROUP_CHUNKS - 1)];
        s.checked_sub(1)
    }

    /// Puts `chunk` (not in the directory) in it at `slot`.
    fn attach(&mut self, chunk: u64, slot: u32) {
        let key = chunk >> GROUP_SHIFT;
        let g = match self.directory.get(&key) {
            Some(&g) => g,
            None => {
                let empty = Group {
                    slots: [0; GROUP_CHUNKS],
                    present: 0,
                };
                let g = match self.spare_groups.pop() {
                    Some(g) => {
                        self.groups[g as usize] = empty;
                        g
                    }
                    None => {
                        self.groups.push(empty);
                        (self.groups.len() - 1) as u32
                    }
                };
                self.directory.insert(key, g);
                g
            }
        };
        let group = &mut self.groups[g as usize];
        group.slots[chunk as usize & (GROUP_CHUNKS - 1)] = slot + 1;
        group.present += 1;
    }

    /// Takes `chunk` (in the directory) out of it, and its group when that empties.
    fn detach(&mut self, chunk: u64) {
        let key = chunk >> GROUP_SHIFT;
        let Some(&g) = self.directory.get(&key) else {
            return;
        };
        let group = &mut self.groups[g as usize];
        group.slots[chunk as usize & (GROUP_CHUNKS - 1)] = 0;
        group.present -= 1;
        if group.present == 0 {
            self.directory.remove(&key);
            self.spare_groups.push(g);
        }
    }

    /// Every chunk in the directory as `(chunk number, slot)`, in no particular order.
    fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.directory.iter().flat_map(move |(&key, &g)| {
            self.groups[g as usize]
                .slots
                .iter()
                .enumerate()
                .filter(|(_, &s)| s != 0)
                .map(move |(i, &s)| ((key << GROUP_SHIFT) + i as u64, s - 1))
        })
    }

    /// Every range as `(first page, pages)`, in address order.
    pub(super) fn sorted(&self) -> Vec<(u64, u64)> {
        let mut chunks: Vec<(u64, u32)> = self.entries().collect();
        chunks.sort_unstable();
        let mut out = Vec::with_capacity(self.len);
        for (chunk, slot) in chunks {
            for (at, &b) in self.chunks[slot as usize].0.iter().enumerate() {
                let lo = (chunk << CHUNK_SHIFT) + at as u64;
                match b {
                    0 => {}
                    LONG => out.push((lo, self.long.get(&lo).copied().unwrap_or(0))),
                    b => out.push((lo, u64::from(b))),
                }
            }
        }
        out
    }

    /// Checks the bookkeeping: no empty chunk in the directory but the idle one, every long
    /// range recorded (and long), the count right. For tests.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut n = 0;
        let mut longs = 0;
        for (&key, &g) in &self.directory {
            let group = &self.groups[g as usize];
            let present = group.slots.iter().filter(|&&s| s != 0).count();
            if present == 0 || present != group.present as usize {
                return Err(format!(
                    "group {key:#x}: {present} chunks present, {} counted",
                    group.present
                ));
            }
        }
        for (chunk, slot) in self.entries() {
            let codes = &self.chunks[slot as usize].0;
            let empty = codes.iter().all(|&b| b == 0);
            if empty != (self.idle == Some((chunk, slot))) {
                return Err(format!(
                    "chunk {chunk:#x}: empty {empty}, idle chunk {:?}",
                    self.idle
                ));
            }
            for (at, &b) in codes.iter().enumerate() {
                let lo = (chunk << CHUNK_SHIFT) + at as u64;
                if b == LONG {
                    longs += 1;
                    match self.long.get(&lo) {
                        Some(&p) if p >= u64::from(LONG) => {}
                        other => return Err(format!("long range at {lo:#x}: length {other:?}")),
                    }
                }
                n += usize::from(b != 0);
            }
        }
        if longs != self.long.len() {
            return Err(format!(
                "{} long lengths recorded, {longs} long ranges",
                self.long.len()
            ));
        }
        if n != self.len {
            return Err(format!("{n} ranges indexed, {} counted", self.len));
        }
        if let Some((c, slot)) = self.last {
            if self.lookup(c) != Some(slot) {
                return Err(format!(
                    "last chunk {c:#x} (slot {slot}) is not in the directory"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked_exactly_and_chunks_come_and_go() {
        let mut x = RangeIndex::new();
        x.insert(63, 1);
        x.insert(64, 300);
        x.insert(1 << 40, 254);
        x.check().unwrap();
        assert_eq!(x.len(), 3);
        assert_eq!(x.sorted(), vec![(63, 1), (64, 300), (1 << 40, 254)]);

        assert!(!x.remove_exact(64, 299));
        assert!(!x.remove_exact(65, 1));
        assert!(!x.remove_exact(63, 2));
        assert!(!x.remove_exact(1 << 41, 1));
        x.check().unwrap();
        assert_eq!(x.len(), 3);

        assert!(x.remove_exact(64, 300));
        x.check().unwrap();
        assert_eq!(x.entries().count(), 3, "the emptied chunk stays, idle");
        assert!(x.remove_exact(63, 1));
        assert!(!x.remove_exact(63, 1));
        x.check().unwrap();
        assert_eq!(
            x.entries().count(),
            2,
            "the previous idle chunk is released"
        );
        assert_eq!(x.directory.len(), 2, "and its group with it");
        x.insert(5, 2);
        x.check().unwrap();
        assert_eq!(x.chunks.len(), 3, "no new chunk: the idle one is used");
        x.insert(64, 1);
        x.check().unwrap();
        assert_eq!(x.chunks.len(), 3, "a released chunk is reused");
        assert_eq!(x.sorted(), vec![(5, 2), (64, 1), (1 << 40, 254)]);
    }
}
