//! What goes on the wire between two engines, above the library's own
//! framing: the layout of the 64-bit tag every message carries, and the
//! endpoint's own messages (JOIN, RELINK and their answer, the ACK) that
//! the rejoin handshake exchanges ([`crate::Links`] decides when).
//!
//! Wire tag, from the top bit: bits 63 and 62 are the engines' own (evb-ucx
//! marks split messages with them), [`CTRL_BIT`] at 61, the sender's epoch
//! (8 bits) at [`EPOCH_SHIFT`], the sequence number (21 bits) at
//! [`TAG_BITS`], and the caller's 32 bits, of which the engine's
//! `source_mask` names the sender.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
