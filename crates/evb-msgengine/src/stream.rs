//! The receive side's bookkeeping per sender: its current epoch
//! ([`Epochs`]) and its ordered stream ([`Streams`]), which hands a
//! sender's messages out in the order of their sequence numbers however
//! the library completes them.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::wire::SEQ_MASK;

/// Each sender's current epoch, as a receiver keeps them.
#[derive(Debug, Default)]
pub struct Epochs {
    current: HashMap<u64, u8>,
}

impl Epochs {
    /// The epoch messages of `source` must carry now (0 until it rejoins).
    pub fn current(&self, source: u64) -> u8 {
        self.current.get(&source).copied().unwrap_or(0)
    }

    /// A new incarnation of `source` joined: its epoch moves on (wrapping
    /// after 256 joins) and is returned, for the ACK.
    pub fn bump(&mut self, source: u64) -> u8 {
        let next = self.current(source).wrapping_add(1);
        self.current.insert(source, next);
        next
    }
}

/// How recently a completion must have been held back for
/// [`Streams::waiting`] to call its sender alive.
pub const HELD_EVIDENCE: Duration = Duration::from_millis(250);

/// The receive side of one sender's ordered stream.
#[derive(Debug)]
struct Stream<T> {
    next: u32,
    /// What arrived before its predecessors (None: a failed receive that
    /// only takes its place).
    held: BTreeMap<u32, Option<T>>,
    /// The sender is gone: hand out as things come.
    forgotten: bool,
    /// When the latest completion was held back.
    last_held_at: Option<Instant>,
}

impl<T> Default for Stream<T> {
    fn default() -> Self {
        Stream {
            next: 0,
            held: BTreeMap::new(),
            forgotten: false,
            last_held_at: None,
        }
    }
}

/// Every sender's ordered stream; `T` is the engine's completion.
#[derive(Debug)]
pub struct Streams<T> {
    by_source: HashMap<u64, Stream<T>>,
}

impl<T> Default for Streams<T> {
    fn default() -> Self {
        Streams {
            by_source: HashMap::new(),
        }
    }
}

impl<T> Streams<T> {
    /// Message `seq` of `source` finished (`done`: what to hand out for it,
    /// `None` if nothing): appends to `out` it and whatever waited for it,
    /// in order, or holds it back until its predecessors are in.
    ///
    /// Each sequence number finishes once per incarnation: the epoch of
    /// the wire tag keeps a replaced incarnation's messages out.
    pub fn finished(&mut self, source: u64, seq: u32, done: Option<T>, out: &mut Vec<T>) {
        debug_assert!(seq <= SEQ_MASK, "sequence number {seq:#x} beyond SEQ_MASK");
        let stream = self.by_source.entry(source).or_default();
        if stream.forgotten {
            out.extend(done);
            return;
        }
        if seq != stream.next {
            let earlier = stream.held.insert(seq, done);
            debug_assert!(
                earlier.is_none(),
                "message {seq} of source {source:#x} finished twice"
            );
            stream.last_held_at = Some(Instant::now());
            return;
        }
        out.extend(done);
        stream.next = stream.next.wrapping_add(1) & SEQ_MASK;
        while let Some(next) = stream.held.remove(&stream.next) {
            out.extend(next);
            stream.next = stream.next.wrapping_add(1) & SEQ_MASK;
        }
        debug_assert!(
            !stream.held.contains_key(&stream.next),
            "what is held waits for a missing message"
        );
    }

    /// A new incarnation of `source` joined: its stream starts again at 0;
    /// returns what the old one left held back (to recycle, not to hand out).
    pub fn restart(&mut self, source: u64) -> Vec<T> {
        self.by_source
            .insert(source, Stream::default())
            .map(|old| old.held.into_values().flatten().collect())
            .unwrap_or_default()
    }

    /// `source` is gone: returns, in order, what was held back behind a
    /// message of its that will never complete; from now on its messages
    /// are handed out as they come, unordered.
    pub fn forget(&mut self, source: u64) -> Vec<T> {
        let stream = self.by_source.entry(source).or_default();
        stream.forgotten = true;
        std::mem::take(&mut stream.held)
            .into_values()
            .flatten()
            .collect()
    }

    /// Completions held back, over every sender (their buffers are still
    /// the engine's).
    pub fn held(&self) -> usize {
        self.by_source.values().map(|s| s.held.len()).sum()
    }

    /// Messages of `source` arrived lately and wait for an earlier one
    /// still in transfer: evidence that the sender is alive. Only lately:
    /// a receive matched to a dead sender's message can stay pending for
    /// ever, and what waits behind it is no evidence.
    pub fn waiting(&self, source: u64) -> bool {
        self.by_source.get(&source).is_some_and(|s| {
            !s.held.is_empty() && s.last_held_at.is_some_and(|t| t.elapsed() < HELD_EVIDENCE)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn epochs_start_at_zero_and_wrap() {
        let mut e = Epochs::default();
        assert_eq!(e.current(5), 0);
        assert_eq!(e.bump(5), 1);
        assert_eq!(e.current(5), 1);
        assert_eq!(e.current(6), 0, "per source");
        for _ in 0..255 {
            e.bump(5);
        }
        assert_eq!(e.current(5), 0, "wraps after 256 joins");
    }

    #[test]
    fn restart_and_forget_release_what_was_held() {
        let mut s = Streams::default();
        let mut out = Vec::new();
        s.finished(1, 1, Some("b"), &mut out);
        s.finished(1, 2, None, &mut out);
        s.finished(1, 3, Some("d"), &mut out);
        assert!(out.is_empty());
        assert!(s.waiting(1));
        assert!(!s.waiting(2));
        assert_eq!(s.held(), 3);
        assert_eq!(s.restart(1), ["b", "d"]);
        assert!(!s.waiting(1));
        // The new incarnation starts at 0.
        s.finished(1, 0, Some("new"), &mut out);
        assert_eq!(out, ["new"]);
        s.finished(1, 2, Some("x"), &mut out);
        assert_eq!(s.forget(1), ["x"]);
        s.finished(1, 7, Some("late"), &mut out);
        assert_eq!(out, ["new", "late"], "forgotten: as it comes");
    }

    proptest! {
        /// Whatever order a stream's completions finish in (some of them
        /// failed receives), they are handed out once each, in sequence
        /// order, across the sequence numbers' wrap.
        #[test]
        fn any_completion_order_is_handed_out_in_sequence(
            start in (SEQ_MASK - 40)..=SEQ_MASK,
            order in Just((0u32..64).collect::<Vec<_>>()).prop_shuffle(),
            failed in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let mut s = Streams::default();
            let mut out = Vec::new();
            // Bring the stream to `start` first.
            for i in 0..start {
                s.finished(0, i, None::<u32>, &mut out);
            }
            for &i in &order {
                let seq = (start + i) & SEQ_MASK;
                s.finished(0, seq, (!failed[i as usize]).then_some(i), &mut out);
            }
            let expected: Vec<u32> = (0..64).filter(|&i| !failed[i as usize]).collect();
            prop_assert_eq!(out, expected);
        }
    }
}
