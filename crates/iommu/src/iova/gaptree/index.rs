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

use std::collections::HashMap;

use foldhash::fast::FixedState;

/// Pages per chunk, as a shift.
const CHUNK_SHIFT: u32 = 6;
/// Pages per chunk.
const CHUNK_PAGES: usize = 1 << CHUNK_SHIFT;
/// The byte of a range too long for a byte: its length is in `long`.
const LONG: u8 = u8::MAX;

/// Allocated ranges by first page.
#[derive(Debug)]
pub(super) struct RangeIndex {
    /// Chunk number (page / 64) -> slot in `chunks`.
    directory: HashMap<u64, u32, FixedState>,
    /// Per page of a chunk: the length of the range starting there, 0 if none.
    chunks: Vec<[u8; CHUNK_PAGES]>,
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
                        self.chunks.push([0; CHUNK_PAGES]);
                        (self.chunks.len() - 1) as u32
                    }
                };
                self.directory.insert(chunk, slot);
                self.last = Some((chunk, slot));
                slot
            }
        };
        if self.idle == Some((chunk, slot)) {
            self.idle = None;
        }
        let byte = &mut self.chunks[slot as usize][at];
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
        let codes = &mut self.chunks[slot as usize];
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
                self.directory.remove(&c);
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
                let slot = *self.directory.get(&chunk)?;
                self.last = Some((chunk, slot));
                Some(slot)
            }
        }
    }

    /// Every range as `(first page, pages)`, in address order.
    pub(super) fn sorted(&self) -> Vec<(u64, u64)> {
        let mut chunks: Vec<(u64, u32)> = self.directory.iter().map(|(&c, &s)| (c, s)).collect();
        chunks.sort_unstable();
        let mut out = Vec::with_capacity(self.len);
        for (chunk, slot) in chunks {
            for (at, &b) in self.chunks[slot as usize].iter().enumerate() {
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
        for (&chunk, &slot) in &self.directory {
            let codes = &self.chunks[slot as usize];
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
            if self.directory.get(&c) != Some(&slot) {
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
        assert_eq!(x.directory.len(), 3, "the emptied chunk stays, idle");
        assert!(x.remove_exact(63, 1));
        assert!(!x.remove_exact(63, 1));
        x.check().unwrap();
        assert_eq!(x.directory.len(), 2, "the previous idle chunk is released");
        x.insert(5, 2);
        x.check().unwrap();
        assert_eq!(x.chunks.len(), 3, "no new chunk: the idle one is used");
        x.insert(64, 1);
        x.check().unwrap();
        assert_eq!(x.chunks.len(), 3, "a released chunk is reused");
        assert_eq!(x.sorted(), vec![(5, 2), (64, 1), (1 << 40, 254)]);
    }
}
