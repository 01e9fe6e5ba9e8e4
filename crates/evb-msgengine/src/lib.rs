//! What evb's two tag-matching engines (UCX's UCP tags in `evb-ucx`,
//! libfabric's tagged messages in `evb-ofi`) share above the library: the
//! layout of the 64-bit wire tag, each sender's ordered stream, and the
//! rejoin handshake of a restarted sender. No I/O here: the engines post
//! and complete the operations and call in with what finished.
//!
//! **Why a sequence number.** Both libraries match a sender's messages in
//! order, but completions can finish out of order (a large rendezvous
//! message finishes after a small eager one sent behind it), and libfabric
//! 1.17's shm can reorder unexpected messages. So every send carries a
//! per-destination sequence number in the tag and the receiver hands a
//! sender's messages out in that order ([`Streams`]). Senders do not wait
//! for each other: a receive that never completes (matched to a dead
//! peer's message) holds back only that sender's stream, which
//! [`Streams::forget`] releases.
//!
//! **Why an epoch.** A restarted process (a new incarnation of a sender,
//! with a new address) asks each live endpoint to take it back with a JOIN
//! ([`join_message`], sent with [`CTRL_BIT`], outside the sequence). The
//! endpoint bumps its epoch for that sender ([`Epochs::bump`]), starts the
//! sender's stream afresh ([`Streams::restart`]) and answers with an ACK
//! carrying the new epoch ([`ack_message`]), the first message of its own
//! stream to the new incarnation. The new incarnation stamps every later
//! message with that epoch; messages of an older one (late completions of
//! the dead incarnation, in whatever order they arrive) are dropped.
//!
//! **Relink.** A live endpoint whose link to a live peer was given up (it
//! or the peer was stopped, starved of CPU, cut off for longer than the
//! peer timeout) asks for the link again with a RELINK ([`relink_message`]):
//! a JOIN that also names the epoch it now expects on the peer's messages
//! (it bumped its own epoch for the peer and restarted the peer's stream
//! first), so that both directions drop what the old link left in flight.
//! Only the higher of the two sources asks; the lower answers, as it
//! answers a JOIN, with its messages stamped with the asker's epoch.
//!
//! Wire tag, from the top bit: [`CTRL_BIT`] at 61 (bits 62 and 63 are the
//! engines' own), the epoch (8 bits) at [`EPOCH_SHIFT`], the sequence
//! number (21 bits) at [`TAG_BITS`], and the caller's 32 bits, of which
//! the engine's `source_mask` names the sender.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Tag bits left to the caller.
pub const TAG_BITS: u32 = 32;
pub const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Sequence numbers wrap here: far more than a receiver ever holds back
/// (at most its posted receives).
pub const SEQ_MASK: u32 = (1 << 21) - 1;
/// Where the epoch sits in the wire tag.
pub const EPOCH_SHIFT: u32 = TAG_BITS + 21;
pub const EPOCH_MASK: u64 = 0xff;
/// On the endpoint's own messages (a JOIN and its answer), which never
/// reach the caller.
pub const CTRL_BIT: u64 = 1 << 61;

/// The wire tag of message `seq` of a stream, for the caller's `tag`
/// (at most [`TAG_MASK`]), stamped with the sender's `epoch`.
pub fn wire_tag(epoch: u8, seq: u32, tag: u64) -> u64 {
    (u64::from(epoch) << EPOCH_SHIFT) | (u64::from(seq & SEQ_MASK) << TAG_BITS) | (tag & TAG_MASK)
}

/// The sequence number in a wire tag.
pub fn seq_of(wire: u64) -> u32 {
    (wire >> TAG_BITS) as u32 & SEQ_MASK
}

/// The epoch in a wire tag.
pub fn epoch_of(wire: u64) -> u8 {
    ((wire >> EPOCH_SHIFT) & EPOCH_MASK) as u8
}

/// A JOIN's payload: magic, the joiner's source (u64), its index for the
/// receiving peer (u32), its address.
const JOIN_MAGIC: &[u8; 8] = b"EVBJOIN1";
/// A RELINK's payload: magic, the asker's source (u64), its index for the
/// receiving peer (u32), the epoch it expects on the peer's messages (u8),
/// its address.
const RELINK_MAGIC: &[u8; 8] = b"EVBRLNK1";
/// The answer's payload: magic, the epoch to use (u8), the joiner's index
/// for the answering peer (u32).
const ACK_MAGIC: &[u8; 8] = b"EVBJACK1";

/// The JOIN a restarted endpoint sends each live peer.
pub fn join_message(source: u64, index: u32, address: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(20 + address.len());
    m.extend_from_slice(JOIN_MAGIC);
    m.extend_from_slice(&source.to_le_bytes());
    m.extend_from_slice(&index.to_le_bytes());
    m.extend_from_slice(address);
    m
}

/// The RELINK a live endpoint sends a live peer to re-establish their link
/// (module docs): like a JOIN, plus `reply_epoch`, the epoch the peer must
/// stamp its messages to the asker with from now on.
pub fn relink_message(source: u64, index: u32, reply_epoch: u8, address: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(21 + address.len());
    m.extend_from_slice(RELINK_MAGIC);
    m.extend_from_slice(&source.to_le_bytes());
    m.extend_from_slice(&index.to_le_bytes());
    m.push(reply_epoch);
    m.extend_from_slice(address);
    m
}

/// The answer to a JOIN (or a RELINK): the epoch the joiner must use from now on, and
/// the joiner's own index for the answering peer (from its JOIN).
pub fn ack_message(epoch: u8, index: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(13);
    m.extend_from_slice(ACK_MAGIC);
    m.push(epoch);
    m.extend_from_slice(&index.to_le_bytes());
    m
}

/// An endpoint message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control<'a> {
    /// A JOIN, or a RELINK (with `reply_epoch`: the epoch to stamp this
    /// endpoint's messages to the asker with).
    Join {
        /// The joiner's source bits (as it sent them: mask them).
        joiner: u64,
        /// The joiner's index for this endpoint, to return in the ACK.
        their_index: u32,
        address: &'a [u8],
        reply_epoch: Option<u8>,
    },
    Ack {
        epoch: u8,
        /// This endpoint's index for the peer that answered.
        index: u32,
    },
    /// Not a JOIN nor an ACK (a stranger, or a newer evb): ignored.
    Unknown,
}

/// Reads an endpoint message; never panics, whatever the bytes.
pub fn parse_control(msg: &[u8]) -> Control<'_> {
    if msg.len() >= 20 && &msg[..8] == JOIN_MAGIC {
        Control::Join {
            joiner: u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes")),
            their_index: u32::from_le_bytes(msg[16..20].try_into().expect("4 bytes")),
            address: &msg[20..],
            reply_epoch: None,
        }
    } else if msg.len() >= 21 && &msg[..8] == RELINK_MAGIC {
        Control::Join {
            joiner: u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes")),
            their_index: u32::from_le_bytes(msg[16..20].try_into().expect("4 bytes")),
            address: &msg[21..],
            reply_epoch: Some(msg[20]),
        }
    } else if msg.len() >= 13 && &msg[..8] == ACK_MAGIC {
        Control::Ack {
            epoch: msg[8],
            index: u32::from_le_bytes(msg[9..13].try_into().expect("4 bytes")),
        }
    } else {
        Control::Unknown
    }
}

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
    pub fn finished(&mut self, source: u64, seq: u32, done: Option<T>, out: &mut Vec<T>) {
        let stream = self.by_source.entry(source).or_default();
        if stream.forgotten {
            out.extend(done);
            return;
        }
        if seq != stream.next {
            stream.held.insert(seq, done);
            stream.last_held_at = Some(Instant::now());
            return;
        }
        out.extend(done);
        stream.next = stream.next.wrapping_add(1) & SEQ_MASK;
        while let Some(next) = stream.held.remove(&stream.next) {
            out.extend(next);
            stream.next = stream.next.wrapping_add(1) & SEQ_MASK;
        }
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
    fn wire_tags_keep_their_fields_apart() {
        let w = wire_tag(0xab, SEQ_MASK, TAG_MASK);
        assert_eq!(epoch_of(w), 0xab);
        assert_eq!(seq_of(w), SEQ_MASK);
        assert_eq!(w & TAG_MASK, TAG_MASK);
        assert_eq!(w & CTRL_BIT, 0, "the fields never reach the CTRL bit");
        assert_eq!(w >> 61, 0, "nor the engines' bits above it");
        // Out-of-range inputs are cut to their fields.
        assert_eq!(seq_of(wire_tag(0, SEQ_MASK + 5, 0)), 4);
        assert_eq!(wire_tag(0, 0, u64::MAX), TAG_MASK);
    }

    #[test]
    fn join_and_ack_round_trip_and_garbage_is_unknown() {
        let j = join_message(7, 3, b"addr");
        assert_eq!(
            parse_control(&j),
            Control::Join {
                joiner: 7,
                their_index: 3,
                address: b"addr",
                reply_epoch: None
            }
        );
        assert_eq!(
            parse_control(&ack_message(9, 4)),
            Control::Ack { epoch: 9, index: 4 }
        );
        assert_eq!(
            parse_control(&j[..19]),
            Control::Unknown,
            "a JOIN cut short"
        );
        assert_eq!(
            parse_control(b"EVBJACK1\x01"),
            Control::Unknown,
            "an ACK cut short"
        );
        assert_eq!(parse_control(b""), Control::Unknown);
        let r = relink_message(5, 2, 17, b"addr");
        assert_eq!(
            parse_control(&r),
            Control::Join {
                joiner: 5,
                their_index: 2,
                address: b"addr",
                reply_epoch: Some(17)
            }
        );
        assert_eq!(
            parse_control(&r[..20]),
            Control::Unknown,
            "a RELINK cut short"
        );
    }

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
