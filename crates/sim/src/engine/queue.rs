//! The future-event queue: a radix heap over virtual time.
//!
//! A discrete-event simulation never schedules into its past, which is exactly the
//! condition a radix heap needs (every key at least the last extracted one). Compared with
//! a binary heap its cost hardly grows with the number of pending events: a push is a
//! `Vec::push` into the bucket chosen by the highest bit in which the event's time differs
//! from the queue's base time, and extracting the minimum redistributes one bucket into
//! lower ones (each event moves down a few times at most over its life).
//!
//! Order: events with equal times come out in the order they were pushed. Every bucket
//! stays in push order because a bucket only receives a redistribution while it is empty,
//! and later pushes come after everything already queued. So no sequence number is stored
//! and the total order is `(time, push order)`.

use std::collections::VecDeque;

use super::kernel::TaskRef;

pub(crate) struct EventQueue {
    /// Lower bound of every queued time; the time of the events in `now`.
    base: u64,
    /// Events at time `base`, in push order.
    now: VecDeque<TaskRef>,
    /// `buckets[k]`: events whose time differs from `base` first at bit `k`.
    buckets: [Vec<(u64, TaskRef)>; 64],
    /// Bit `k` set when `buckets[k]` is not empty.
    mask: u64,
    len: usize,
}

impl EventQueue {
    pub(crate) fn new() -> Self {
        EventQueue {
            base: 0,
            now: VecDeque::new(),
            buckets: std::array::from_fn(|_| Vec::new()),
            mask: 0,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Queues `task` for time `at`, which must not be earlier than the queue's base (the
    /// time of the last [`EventQueue::advance`]).
    #[inline]
    pub(crate) fn push(&mut self, at: u64, task: TaskRef) {
        debug_assert!(at >= self.base, "event scheduled in the past");
        self.len += 1;
        let x = at ^ self.base;
        if x == 0 {
            self.now.push_back(task);
        } else {
            let k = 63 - x.leading_zeros() as usize;
            self.buckets[k].push((at, task));
            self.mask |= 1 << k;
        }
    }

    /// The next event at the base time, if any.
    #[inline]
    pub(crate) fn pop_at_base(&mut self) -> Option<TaskRef> {
        let t = self.now.pop_front()?;
        self.len -= 1;
        Some(t)
    }

    /// Takes the earliest event if its time is at most `limit` (call when
    /// [`EventQueue::pop_at_base`] is empty). The base moves to that time: the other events
    /// of that instant follow through `pop_at_base`, and no earlier event may be pushed
    /// afterwards.
    #[inline]
    pub(crate) fn pop_next(&mut self, limit: u64) -> Option<(u64, TaskRef)> {
        debug_assert!(self.now.is_empty());
        if self.mask == 0 {
            return None;
        }
        let k = self.mask.trailing_zeros() as usize;
        let b = &mut self.buckets[k];
        if b.len() == 1 {
            // Common case: a lone event, no redistribution needed.
            let (at, task) = b[0];
            if at > limit {
                return None;
            }
            b.clear();
            self.mask &= !(1 << k);
            self.base = at;
            self.len -= 1;
            return Some((at, task));
        }
        let t = b.iter().map(|e| e.0).min().expect("non-empty bucket");
        if t > limit {
            return None;
        }
        let mut v = std::mem::take(b);
        self.mask &= !(1 << k);
        self.base = t;
        for &(at, task) in &v {
            let x = at ^ t;
            if x == 0 {
                self.now.push_back(task);
            } else {
                let j = 63 - x.leading_zeros() as usize;
                self.buckets[j].push((at, task));
                self.mask |= 1 << j;
            }
        }
        v.clear();
        self.buckets[k] = v;
        self.pop_at_base().map(|task| (t, task))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng::Rng;
    use std::collections::BTreeMap;

    /// Against a reference model: a `BTreeMap` keyed by `(time, push index)`.
    #[test]
    fn pops_in_time_then_push_order() {
        let mut rng = Rng::seed_from_u64(9);
        let mut q = EventQueue::new();
        let mut model = BTreeMap::new();
        let mut now = 0u64;
        let mut n = 0u64;
        for round in 0..2_000 {
            for _ in 0..rng.below(8) {
                let at = now + 1 + rng.below(if round % 3 == 0 { 4 } else { 5_000 });
                q.push(at, n);
                model.insert((at, n), n);
                n += 1;
            }
            // Take every event of the next instant, as the executor does.
            let limit = if round % 5 == 0 { now + 100 } else { u64::MAX };
            if let Some((t, first)) = q.pop_next(limit) {
                assert!(t <= limit);
                now = t;
                let (&(mt, _), &mv) = model.iter().next().unwrap();
                assert_eq!((t, first), (mt, mv));
                model.remove(&(mt, mv));
                while let Some(task) = q.pop_at_base() {
                    let (&(mt, _), &mv) = model.iter().next().unwrap();
                    assert_eq!((t, task), (mt, mv));
                    model.remove(&(mt, mv));
                }
            }
        }
        assert_eq!(q.len(), model.len());
    }
}
