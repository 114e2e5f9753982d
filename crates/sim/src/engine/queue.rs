//! The future-event queue: a hierarchical timing wheel (a radix heap).
//!
//! A discrete-event simulation never schedules into its past, which is what radix heaps
//! and timing wheels rely on. Times are split into digits: the low 10 bits (level 0) and
//! 6-bit digits above them (levels 1 to 9); an event lives at the *level* of the highest
//! digit in which its time differs from the queue's `base` (a lower bound of every queued
//! time), in the *slot* given by that digit. So:
//! - a push appends a node (from a reused arena) to the FIFO list of one slot and sets an
//!   occupancy bit: level 0 has one slot per nanosecond of the base's aligned 1,024-ns
//!   block (a two-word-deep bitmap finds the first), each level above has 64 slots;
//! - the earliest event is in the lowest non-empty slot of the lowest non-empty level,
//!   found with two or three `trailing_zeros`; no comparisons between events;
//! - taking a slot of a level above 0 *cascades* it: the base moves to the slot's earliest
//!   time (kept per slot) and its events fall to lower levels, the earliest to level 0.
//!   An event cascades at most once per level it started above 0: a wake-up a few hundred
//!   ns ahead (a CPU's spend) mostly lands at level 0 at once and never cascades, a
//!   device completion 100 us ahead cascades once or twice. (Level 0 was 64 slots wide
//!   until session 3; see docs/ENGINE.md for the measured choice of 1,024.)
//!
//! The cost per event barely depends on how many events are pending, which keeps the
//! simulation's cost per event flat from 1 to 1024 virtual CPUs.
//!
//! Order: events with equal times come out in the order they were pushed. A slot only
//! receives a cascade while it is empty (every level below the cascading one is empty),
//! and later pushes come after everything already queued; so every slot stays in push
//! order, no sequence number is stored, and the total order is `(time, push order)`.

use super::kernel::TaskRef;

/// Bits of the level-0 digit: level 0 covers the base's aligned 1,024-ns block with one
/// slot per nanosecond, so a wake-up a few hundred ns ahead (a CPU's spend) usually goes
/// straight to its final slot and is never cascaded. (4,096 slots saved a few more
/// instructions but took more L1 misses: docs/ENGINE.md.)
const BITS0: u32 = 10;
const SLOTS0: usize = 1 << BITS0;
/// Level-0 occupancy words (64 slots each).
const WORDS0: usize = SLOTS0 / 64;
/// Bits of the digits above level 0.
const BITS: u32 = 6;
const SLOTS: usize = 1 << BITS;
/// Levels above 0: 10 + 9 * 6 = 64 bits.
const LEVELS: usize = 1 + 9;
/// Arrays are sized to a power of two so that masked indices need no bounds checks.
const LEVELS_POW2: usize = 16;
const _: () = assert!(BITS0 as usize + (LEVELS - 1) * BITS as usize >= 64 && LEVELS <= LEVELS_POW2);
const _: () = assert!(WORDS0 <= 64);
const NIL: u32 = u32::MAX;

/// A queued event: an entry of the node arena, linked into one slot's FIFO list.
#[derive(Clone, Copy)]
struct Node {
    at: u64,
    task: TaskRef,
    next: u32,
}

/// A slot's FIFO list above level 0: first and last node (`NIL` when empty), and the
/// earliest time in it. Nodes leave such a slot only all together (a cascade or a lone
/// event's pop), so the minimum never needs recomputing.
#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    min: u64,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
    min: u64::MAX,
};

/// A level-0 slot's FIFO list (every event in it has the same time).
#[derive(Clone, Copy)]
struct Fifo {
    head: u32,
    tail: u32,
}

const EMPTY0: Fifo = Fifo {
    head: NIL,
    tail: NIL,
};

#[inline]
fn slot_index(level: usize, digit: usize) -> usize {
    (level * SLOTS + digit) & (LEVELS_POW2 * SLOTS - 1)
}

pub(crate) struct EventQueue {
    /// Lower bound of every queued time.
    base: u64,
    /// The earliest queued time, exactly (`u64::MAX` when empty): kept up to date by every
    /// push and pop, so [`EventQueue::earliest`] (asked by every spend, for the shortcut)
    /// is one load and a level-0 pop needs no bitmap search.
    next_at: u64,
    /// The list of events at time `base` being handed out.
    cur: u32,
    /// Level 0: one FIFO per nanosecond of the base's 1,024-ns block (8 KiB).
    slots0: Box<[Fifo; SLOTS0]>,
    /// Level-0 occupancy: bit `b` of word `w` set when slot `w * 64 + b` is not empty.
    words0: [u64; WORDS0],
    /// Bit `w` set when `words0[w]` is not zero.
    summary0: u64,
    /// `slots[level * 64 + digit]` for levels 1 and up: small list headers in one block.
    slots: Box<[List; LEVELS_POW2 * SLOTS]>,
    /// Per level (1 and up), bit `d` set when slot `d` is not empty.
    masks: [u64; LEVELS_POW2],
    /// Bit `l` set when level `l` has a non-empty slot.
    levels: u16,
    /// Node arena, with a LIFO free list so recently used (cached) nodes are reused.
    nodes: Vec<Node>,
    free: u32,
    len: usize,
}

impl EventQueue {
    pub(crate) fn new() -> Self {
        EventQueue {
            base: 0,
            next_at: u64::MAX,
            cur: NIL,
            slots0: Box::new([EMPTY0; SLOTS0]),
            words0: [0; WORDS0],
            summary0: 0,
            slots: Box::new([EMPTY; LEVELS_POW2 * SLOTS]),
            masks: [0; LEVELS_POW2],
            levels: 0,
            nodes: Vec::new(),
            free: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends node `i`, whose time `at` is in the base's aligned 1,024-ns block, to its
    /// level-0 slot (the caller sets the node's `next` to `NIL` and level 0's bit in
    /// `levels`).
    #[inline(always)]
    fn place0(&mut self, i: u32, at: u64) {
        let digit = (at as usize) & (SLOTS0 - 1);
        let slot = &mut self.slots0[digit];
        if slot.head == NIL {
            slot.head = i;
        } else {
            let tail = slot.tail;
            self.nodes[tail as usize].next = i;
        }
        slot.tail = i;
        let w = digit / 64;
        self.words0[w] |= 1 << (digit % 64);
        self.summary0 |= 1 << w;
    }

    /// Appends node `i` to the slot its time belongs in, relative to the base.
    #[inline]
    fn place(&mut self, i: u32) {
        let at = self.nodes[i as usize].at;
        self.nodes[i as usize].next = NIL;
        self.place_at(i, at);
    }

    /// [`EventQueue::place`] of node `i`, whose time `at` is known and whose `next` is
    /// already `NIL` (a node just written by a push).
    #[inline]
    fn place_at(&mut self, i: u32, at: u64) {
        let x = at ^ self.base;
        if x < SLOTS0 as u64 {
            // Level 0: the base's own block, including `at == base`.
            self.place0(i, at);
            self.levels |= 1;
            return;
        }
        // Level of the highest differing digit above level 0.
        let level = ((63 - x.leading_zeros() - BITS0) / BITS + 1) as usize & (LEVELS_POW2 - 1);
        let shift = BITS0 + BITS * (level as u32 - 1);
        let digit = ((at >> shift) & (SLOTS as u64 - 1)) as usize;
        let slot = &mut self.slots[slot_index(level, digit)];
        if slot.head == NIL {
            slot.head = i;
            slot.min = at;
        } else {
            let tail = slot.tail;
            self.nodes[tail as usize].next = i;
            slot.min = slot.min.min(at);
        }
        slot.tail = i;
        self.masks[level] |= 1 << digit;
        self.levels |= 1 << level;
    }

    /// Queues `task` for time `at`, which must not be earlier than the time of the last
    /// event taken (the queue's base).
    #[inline]
    pub(crate) fn push(&mut self, at: u64, task: TaskRef) {
        debug_assert!(at >= self.base, "event scheduled in the past");
        let node = Node {
            at,
            task,
            next: NIL,
        };
        // The free list ends with `NIL`, never an arena index: one test takes a free node
        // or finds there is none.
        let i = self.free;
        let i = if let Some(n) = self.nodes.get_mut(i as usize) {
            self.free = n.next;
            *n = node;
            i
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        self.len += 1;
        self.next_at = self.next_at.min(at);
        // The node was just written with its time and no successor.
        self.place_at(i, at);
    }

    #[inline]
    fn release(&mut self, i: u32) -> TaskRef {
        let n = &mut self.nodes[i as usize];
        let task = n.task;
        n.next = self.free;
        self.free = i;
        self.len -= 1;
        task
    }

    /// The lowest non-empty level-0 slot (call only when level 0 is not empty).
    #[inline]
    fn first0(&self) -> usize {
        let w = self.summary0.trailing_zeros() as usize & (WORDS0 - 1);
        w * 64 + self.words0[w].trailing_zeros() as usize
    }

    /// The time of level-0 slot `digit` (in the base's block).
    #[inline]
    fn time0(&self, digit: usize) -> u64 {
        (self.base & !(SLOTS0 as u64 - 1)) | digit as u64
    }

    /// The earliest queued time, exactly (`u64::MAX` when the queue is empty).
    #[inline(always)]
    pub(crate) fn earliest(&self) -> u64 {
        self.next_at
    }

    /// The earliest queued time computed from the structure, when no event of the base's
    /// instant is being handed out (`cur` is `NIL`): the time of the lowest non-empty
    /// level-0 slot, else the minimum of the lowest non-empty slot of the lowest non-empty
    /// level (every event in a later slot or a higher level is later, by the radix order),
    /// else `u64::MAX`.
    #[inline]
    fn scan_earliest(&self) -> u64 {
        if self.levels == 0 {
            return u64::MAX;
        }
        if self.levels & 1 != 0 {
            return self.time0(self.first0());
        }
        let level = self.levels.trailing_zeros() as usize & (LEVELS_POW2 - 1);
        let digit = self.masks[level].trailing_zeros() as usize & (SLOTS - 1);
        self.slots[slot_index(level, digit)].min
    }

    /// The next event at the current base time, if any.
    #[inline]
    pub(crate) fn pop_at_base(&mut self) -> Option<TaskRef> {
        if self.cur == NIL {
            return None;
        }
        let i = self.cur;
        self.cur = self.nodes[i as usize].next;
        if self.cur == NIL {
            // The instant is over: the next earliest time is elsewhere.
            self.next_at = self.scan_earliest();
        }
        Some(self.release(i))
    }

    #[inline]
    fn clear_slot(&mut self, level: usize, digit: usize) {
        self.slots[slot_index(level, digit)] = EMPTY;
        self.masks[level] &= !(1 << digit);
        if self.masks[level] == 0 {
            self.levels &= !(1 << level);
        }
    }

    #[inline]
    fn clear_slot0(&mut self, digit: usize) {
        self.slots0[digit] = EMPTY0;
        let w = digit / 64;
        self.words0[w] &= !(1 << (digit % 64));
        if self.words0[w] == 0 {
            self.summary0 &= !(1 << w);
            if self.summary0 == 0 {
                self.levels &= !1;
            }
        }
    }

    /// Takes the earliest event if its time is at most `limit` (call when
    /// [`EventQueue::pop_at_base`] is empty). The base moves to that time: the other events
    /// of that instant follow through `pop_at_base`, and no earlier event may be pushed
    /// afterwards. Returns `None`, leaving the base at or below `limit`, otherwise.
    #[inline]
    pub(crate) fn pop_next(&mut self, limit: u64) -> Option<(u64, TaskRef)> {
        debug_assert!(self.cur == NIL);
        loop {
            if self.levels == 0 {
                return None;
            }
            if self.levels & 1 != 0 {
                // Every event in a level-0 slot has the same time; the lowest non-empty
                // slot's is the earliest queued time, known.
                let at = self.next_at;
                debug_assert_eq!(at, self.time0(self.first0()));
                if at > limit {
                    return None;
                }
                let digit = (at as usize) & (SLOTS0 - 1);
                self.base = at;
                // The slot's first event is taken at once; the rest of the instant's
                // follow through `pop_at_base`.
                let head = self.slots0[digit].head;
                self.clear_slot0(digit);
                self.cur = self.nodes[head as usize].next;
                if self.cur == NIL {
                    self.next_at = self.scan_earliest();
                }
                return Some((at, self.release(head)));
            }
            let level = self.levels.trailing_zeros() as usize & (LEVELS_POW2 - 1);
            let digit = self.masks[level].trailing_zeros() as usize & (SLOTS - 1);
            let List { head, tail, min } = self.slots[slot_index(level, digit)];
            if head == tail {
                // A lone event: take it directly, the base jumps to its time.
                let at = self.nodes[head as usize].at;
                if at > limit {
                    return None;
                }
                self.clear_slot(level, digit);
                self.base = at;
                self.next_at = self.scan_earliest();
                return Some((at, self.release(head)));
            }
            // Cascade: move the base to the slot's earliest time (a lower bound of every
            // queued time) and re-place its events below; the earliest lands at level 0.
            // Every level below this one is empty, so each slot they land in receives them
            // in list (push) order.
            if min > limit {
                return None;
            }
            self.base = min;
            self.clear_slot(level, digit);
            let mut i = head;
            if level == 1 {
                // A level-1 slot holds one aligned 1,024-ns block, now the base's: every
                // event in it goes to level 0.
                while i != NIL {
                    let n = &mut self.nodes[i as usize];
                    let (next, at) = (n.next, n.at);
                    n.next = NIL;
                    self.place0(i, at);
                    i = next;
                }
                self.levels |= 1;
                continue;
            }
            while i != NIL {
                let next = self.nodes[i as usize].next;
                self.place(i);
                i = next;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng::Rng;
    use std::collections::BTreeMap;

    /// Against a reference model: a `BTreeMap` keyed by `(time, push index)`, with delays
    /// from a few ns to hours, ties, and limits that stop short.
    #[test]
    fn pops_in_time_then_push_order() {
        let mut rng = Rng::seed_from_u64(9);
        let mut q = EventQueue::new();
        let mut model = BTreeMap::new();
        let mut now = 0u64;
        let mut n = 0u64;
        for round in 0..20_000u64 {
            for _ in 0..rng.below(6) {
                let span = match round % 4 {
                    0 => 4,
                    1 => 5_000,
                    2 => 1 << 20,
                    _ => 1 << 42,
                };
                let at = now + 1 + rng.below(span);
                q.push(at, n);
                model.insert((at, n), n);
                n += 1;
            }
            // Take every event of the next instant at or before the limit, as the
            // executor does; a short limit may stop before the next event.
            let limit = if round % 7 == 0 {
                now + rng.below(64)
            } else {
                u64::MAX
            };
            match q.pop_next(limit) {
                Some((t, first)) => {
                    assert!(t <= limit);
                    now = t;
                    let (&(mt, mi), _) = model.iter().next().unwrap();
                    assert_eq!((t, first), (mt, mi));
                    model.remove(&(mt, mi));
                    while let Some(task) = q.pop_at_base() {
                        let (&(mt, mi), _) = model.iter().next().unwrap();
                        assert_eq!((t, task), (mt, mi));
                        model.remove(&(mt, mi));
                    }
                }
                None => {
                    if let Some((&(mt, _), _)) = model.iter().next() {
                        assert!(mt > limit, "an event at {mt} was due by {limit}");
                    }
                    now = now.max(limit.min(now + 64));
                }
            }
            assert_eq!(q.len(), model.len());
            // The earliest time is known exactly (the engine's spend shortcut relies on it).
            let earliest = model.keys().next().map_or(u64::MAX, |k| k.0);
            assert_eq!(q.earliest(), earliest);
            // The kept earliest time agrees with the structure's.
            if q.cur == NIL {
                assert_eq!(q.scan_earliest(), earliest);
            }
        }
    }

    #[test]
    fn far_future_and_max_times_work() {
        let mut q = EventQueue::new();
        q.push(u64::MAX, 1);
        q.push(1 << 63, 2);
        q.push(5, 3);
        assert_eq!(q.pop_next(u64::MAX), Some((5, 3)));
        assert_eq!(q.pop_next(u64::MAX), Some((1 << 63, 2)));
        assert_eq!(q.pop_next(u64::MAX - 1), None);
        assert_eq!(q.pop_next(u64::MAX), Some((u64::MAX, 1)));
        assert_eq!(q.pop_next(u64::MAX), None);
        assert_eq!(q.len(), 0);
    }
}
