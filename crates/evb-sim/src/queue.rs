//! The simulator's event queue: a calendar of 4 ns buckets over the next
//! 67 us, and a heap for events further out.
//!
//! A fabric at line rate has events every few picoseconds somewhere and
//! almost all of them land within a microsecond of now (a packet time, a
//! link latency, a switch latency), so a binary heap of all pending events
//! spent half the simulator's time popping. Here a push is an append to its
//! bucket, and a pop takes the earliest of the first non-empty bucket
//! (found through a bitmap). Events of the same time come out in the order
//! they were pushed, exactly as from the heap, so results do not change.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Bucket width: 2^12 ps (4 ns).
const SHIFT: u32 = 10;
/// Buckets: 2^14, a horizon of 2^26 ps (67 us).
const BUCKETS: usize = 1 << 11;
#[cfg(test)]
const HORIZON: u64 = (BUCKETS as u64) << SHIFT;

/// A pending event: its time, the push order that breaks ties, the event.
type Entry<E> = (u64, u64, E);

/// A priority queue of events by time, first pushed first among equals.
pub struct EventQueue<E> {
    buckets: Vec<Vec<Entry<E>>>,
    /// One bit per bucket: it holds events.
    occupied: Vec<u64>,
    /// Events at or beyond `base + HORIZON` when pushed.
    far: BinaryHeap<Reverse<Entry<E>>>,
    /// No pending event is earlier than this (the time of the last pop).
    base: u64,
    /// The bucket being consumed, kept sorted latest first (a pop takes
    /// its last entry); the others are unsorted until their turn.
    current: Option<usize>,
    seq: u64,
    len: usize,
}

impl<E: Copy + Ord> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Copy + Ord> EventQueue<E> {
    pub fn new() -> EventQueue<E> {
        EventQueue {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            occupied: vec![0; BUCKETS / 64],
            far: BinaryHeap::new(),
            base: 0,
            current: None,
            seq: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `ev` at time `t` (not before the last event popped).
    pub fn push(&mut self, t: u64, ev: E) {
        debug_assert!(t >= self.base, "event at {t} before now {}", self.base);
        let t = t.max(self.base);
        self.seq += 1;
        self.len += 1;
        if self.in_ring(t) {
            self.put_near((t, self.seq, ev));
        } else {
            self.far.push(Reverse((t, self.seq, ev)));
        }
    }

    /// Whether time `t` (not before `base`) falls in the ring's one lap:
    /// the bucket of `base` and the `BUCKETS - 1` after it.
    fn in_ring(&self, t: u64) -> bool {
        (t >> SHIFT) - (self.base >> SHIFT) < BUCKETS as u64
    }

    fn put_near(&mut self, e: Entry<E>) {
        let b = ((e.0 >> SHIFT) as usize) & (BUCKETS - 1);
        let bucket = &mut self.buckets[b];
        if self.current == Some(b) {
            // Keep the bucket being consumed sorted, latest first.
            let key = (e.0, e.1);
            let at = bucket.partition_point(|x| (x.0, x.1) > key);
            bucket.insert(at, e);
        } else {
            bucket.push(e);
        }
        self.occupied[b / 64] |= 1 << (b % 64);
    }

    /// The first occupied bucket at or after the bucket of `base`, in ring
    /// order; `None` if no bucket is occupied.
    fn first_occupied(&self) -> Option<usize> {
        let start = ((self.base >> SHIFT) as usize) & (BUCKETS - 1);
        let words = self.occupied.len();
        let (w0, bit0) = (start / 64, start % 64);
        let first = self.occupied[w0] & (!0u64 << bit0);
        if first != 0 {
            return Some(w0 * 64 + first.trailing_zeros() as usize);
        }
        for k in 1..=words {
            let w = (w0 + k) % words;
            let mut word = self.occupied[w];
            if w == w0 {
                // Wrapped round to the start word: only the bits before it.
                word &= (1u64 << bit0).wrapping_sub(1);
            }
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
        }
        None
    }

    /// Removes and returns the earliest event (first pushed among equals).
    pub fn pop(&mut self) -> Option<(u64, E)> {
        if self.len == 0 {
            return None;
        }
        // The ring's earliest event is the last of its first occupied
        // bucket, once that bucket is sorted (the ring holds one lap only).
        let near = self.first_occupied();
        if let Some(b) = near {
            if self.current != Some(b) {
                self.buckets[b].sort_unstable_by_key(|x| std::cmp::Reverse((x.0, x.1)));
                self.current = Some(b);
            }
        }
        let near_min = near.map(|b| {
            let e = self.buckets[b]
                .last()
                .expect("occupied buckets are not empty");
            (b, e.0, e.1)
        });
        let far_first = self
            .far
            .peek()
            .is_some_and(|Reverse(f)| near_min.is_none_or(|(_, t, s)| (f.0, f.1) < (t, s)));
        let (t, ev) = if far_first {
            let Reverse((t, _, ev)) = self.far.pop().expect("peeked");
            (t, ev)
        } else {
            let (b, _, _) = near_min.expect("not empty and no far event first");
            let (t, _, ev) = self.buckets[b].pop().expect("not empty");
            if self.buckets[b].is_empty() {
                self.occupied[b / 64] &= !(1 << (b % 64));
                self.current = None;
            }
            (t, ev)
        };
        self.len -= 1;
        self.base = t;
        // Far events now within the ring's lap move into it, so that the
        // ring never holds two laps.
        while let Some(Reverse(f)) = self.far.peek() {
            if !self.in_ring(f.0) {
                break;
            }
            let Reverse(e) = self.far.pop().expect("peeked");
            self.put_near(e);
        }
        Some((t, ev))
    }

    /// The time of the earliest event.
    pub fn peek_time(&mut self) -> Option<u64> {
        let near = self
            .first_occupied()
            .and_then(|b| self.buckets[b].iter().map(|e| e.0).min());
        let far = self.far.peek().map(|Reverse(f)| f.0);
        match (near, far) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64Mcg;

    /// Same order as a binary heap of (time, push order), for random
    /// pushes near and far, interleaved with pops.
    #[test]
    fn pops_in_time_then_push_order_like_a_heap() {
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        let mut q = EventQueue::new();
        let mut heap = BinaryHeap::new();
        let (mut now, mut seq) = (0u64, 0u64);
        for round in 0..200_000u32 {
            if rng.gen_bool(0.55) {
                let dt = match rng.gen_range(0..10) {
                    0 => rng.gen_range(0..4 * HORIZON),
                    1 => 0,
                    _ => rng.gen_range(0..5_000_000),
                };
                seq += 1;
                q.push(now + dt, round);
                heap.push(Reverse((now + dt, seq, round)));
            } else {
                let got = q.pop();
                let want = heap.pop().map(|Reverse((t, _, e))| (t, e));
                assert_eq!(got, want, "round {round}");
                if let Some((t, _)) = got {
                    now = t;
                }
            }
            assert_eq!(q.len(), heap.len());
        }
        while let Some(Reverse((t, _, e))) = heap.pop() {
            assert_eq!(q.pop(), Some((t, e)));
        }
        assert!(q.pop().is_none());
    }
}
