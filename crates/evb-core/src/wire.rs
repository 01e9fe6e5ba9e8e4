//! Wire format: versioned, little-endian frames (see `docs/wire-format.md`).
//!
//! Every message is a frame: an 8-byte [`FrameHeader`] followed by a body of
//! `body_len` bytes. Control bodies have a fixed length per kind; a fragment
//! body is a 32-byte [`FragmentHeader`] followed by its payload. Decoding
//! checks every length against a configured maximum before anything is
//! allocated, and never panics on any input.

use thiserror::Error;

/// First two bytes of every frame: ASCII "EB".
pub const MAGIC: [u8; 2] = *b"EB";
/// Version of the frame format this build speaks.
pub const VERSION: u8 = 2;
/// Size of [`FrameHeader`] on the wire.
pub const FRAME_HEADER_LEN: usize = 8;
/// Size of [`FragmentHeader`] on the wire.
pub const FRAGMENT_HEADER_LEN: usize = 32;
/// Size of a [`Message::Hello`]'s body on the wire (its whole frame is
/// [`FRAME_HEADER_LEN`] more): what a byte stream reads before anything else.
pub const HELLO_BODY_LEN: usize = 24;

/// [`FragmentHeader::flags`] bit: this is a built batch a BU delivers to a
/// Filter Unit, not an RU's fragment. `source` is then the BU index and the
/// payload is laid out as [`batch_payload_len`] describes.
pub const FLAG_BATCH: u16 = 1;
/// [`FragmentHeader::flags`] bit, with [`FLAG_BATCH`]: the batch timed
/// out with fragments missing and is delivered anyway
/// (`output.deliver_partial`); a missing source's fragment is empty.
pub const FLAG_PARTIAL: u16 = 2;
/// [`FragmentHeader::flags`] bit, with [`FLAG_BATCH`]: the batch is
/// delivered again (its first consumer was lost before confirming it, and
/// may have stored it): a consumer stores it only if no consumer has yet.
pub const FLAG_AGAIN: u16 = 4;

/// Payload length of a delivered batch of `sources` fragments totalling
/// `fragment_bytes`: a u32 fragment count, a u32 length per fragment, then
/// the fragments in source order (all little-endian).
pub fn batch_payload_len(sources: usize, fragment_bytes: u64) -> u64 {
    4 + 4 * sources as u64 + fragment_bytes
}

/// Checks the fragment table at the front of a delivered batch against its
/// length: the receiver's structural check before it trusts the batch.
pub fn check_batch_payload(payload: &[u8]) -> Result<usize, WireError> {
    let bad = || WireError::BadLength {
        kind: "Batch",
        expected: 0,
        got: payload.len() as u64,
    };
    let count = payload
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(bad)?;
    let table = payload
        .get(4..4 + 4 * count.min(payload.len()))
        .ok_or_else(bad)?;
    if table.len() != 4 * count {
        return Err(bad());
    }
    let sum: u64 = table
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
        .sum();
    if batch_payload_len(count, sum) != payload.len() as u64 {
        return Err(WireError::BadLength {
            kind: "Batch",
            expected: batch_payload_len(count, sum),
            got: payload.len() as u64,
        });
    }
    Ok(count)
}

/// The fragments of a delivered batch, in source order (an empty one for a
/// source the batch was built without), after [`check_batch_payload`].
pub fn batch_fragments(payload: &[u8]) -> Result<Vec<&[u8]>, WireError> {
    let count = check_batch_payload(payload)?;
    let mut at = 4 + 4 * count;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let len = u32::from_le_bytes(payload[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes"));
        out.push(&payload[at..at + len as usize]);
        at += len as usize;
    }
    Ok(out)
}

/// Node index within a run (endpoint number).
pub type NodeId = u16;
/// Multi-event packet (batch) number; the unit that is scheduled and built.
pub type MepId = u64;

/// What went wrong while decoding bytes from the wire.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("bad magic {0:02x?} (not an evb frame)")]
    BadMagic([u8; 2]),
    #[error("unsupported wire version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("frame body of {len} bytes exceeds the maximum message size {max}")]
    TooLarge { len: u64, max: u64 },
    #[error("{kind}: reserved bytes must be zero")]
    NonZeroReserved { kind: &'static str },
    #[error("{kind} body must be {expected} bytes, got {got}")]
    BadLength {
        kind: &'static str,
        expected: u64,
        got: u64,
    },
}

/// Message kinds, the fourth byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Credit = 2,
    Assign = 3,
    Request = 4,
    Fragment = 5,
    EndOfRun = 6,
    Heartbeat = 7,
    Abandon = 8,
    Finished = 9,
    SourceDown = 10,
    ConsumerCredit = 11,
    OutputEnd = 12,
    SourceUp = 13,
    BuLost = 14,
    Holding = 15,
    HoldingDone = 16,
    ReleaseHeld = 17,
    Reassign = 18,
    Goodbye = 19,
    SeenUpTo = 20,
    AssignRun = 21,
    ClockProbe = 22,
    ClockReply = 23,
    SlotReport = 24,
    SlotLength = 25,
    Revoked = 26,
    RevokedAck = 27,
}

impl Kind {
    fn from_u8(v: u8) -> Result<Kind, WireError> {
        Ok(match v {
            1 => Kind::Hello,
            2 => Kind::Credit,
            3 => Kind::Assign,
            4 => Kind::Request,
            5 => Kind::Fragment,
            6 => Kind::EndOfRun,
            7 => Kind::Heartbeat,
            8 => Kind::Abandon,
            9 => Kind::Finished,
            10 => Kind::SourceDown,
            11 => Kind::ConsumerCredit,
            12 => Kind::OutputEnd,
            13 => Kind::SourceUp,
            14 => Kind::BuLost,
            15 => Kind::Holding,
            16 => Kind::HoldingDone,
            17 => Kind::ReleaseHeld,
            18 => Kind::Reassign,
            19 => Kind::Goodbye,
            20 => Kind::SeenUpTo,
            21 => Kind::AssignRun,
            22 => Kind::ClockProbe,
            23 => Kind::ClockReply,
            24 => Kind::SlotReport,
            25 => Kind::SlotLength,
            26 => Kind::Revoked,
            27 => Kind::RevokedAck,
            other => return Err(WireError::UnknownKind(other)),
        })
    }

    /// Body length of the fixed-size control kinds; `None` for fragments.
    fn fixed_body_len(self) -> Option<usize> {
        match self {
            Kind::Hello => Some(HELLO_BODY_LEN),
            Kind::Credit => Some(8),
            Kind::Assign => Some(12),
            Kind::Request => Some(12),
            Kind::Fragment => None,
            Kind::EndOfRun => Some(8),
            Kind::Heartbeat => Some(0),
            Kind::Abandon => Some(12),
            Kind::Finished => Some(12),
            Kind::SourceDown => Some(12),
            Kind::ConsumerCredit => Some(8),
            Kind::OutputEnd => Some(4),
            Kind::SourceUp => Some(12),
            Kind::BuLost => Some(8),
            Kind::Holding => Some(12),
            Kind::HoldingDone => Some(4),
            Kind::ReleaseHeld => Some(4),
            Kind::Reassign => Some(12),
            Kind::Goodbye => Some(0),
            Kind::SeenUpTo => Some(12),
            Kind::AssignRun => Some(16),
            Kind::ClockProbe => Some(8),
            Kind::ClockReply => Some(16),
            Kind::SlotReport => Some(12),
            Kind::SlotLength => Some(24),
            Kind::Revoked | Kind::RevokedAck => Some(8),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "Hello",
            Kind::Credit => "Credit",
            Kind::Assign => "Assign",
            Kind::Request => "Request",
            Kind::Fragment => "Fragment",
            Kind::EndOfRun => "EndOfRun",
            Kind::Heartbeat => "Heartbeat",
            Kind::Abandon => "Abandon",
            Kind::Finished => "Finished",
            Kind::SourceDown => "SourceDown",
            Kind::ConsumerCredit => "ConsumerCredit",
            Kind::OutputEnd => "OutputEnd",
            Kind::SourceUp => "SourceUp",
            Kind::BuLost => "BuLost",
            Kind::Holding => "Holding",
            Kind::HoldingDone => "HoldingDone",
            Kind::ReleaseHeld => "ReleaseHeld",
            Kind::Reassign => "Reassign",
            Kind::Goodbye => "Goodbye",
            Kind::SeenUpTo => "SeenUpTo",
            Kind::AssignRun => "AssignRun",
            Kind::ClockProbe => "ClockProbe",
            Kind::ClockReply => "ClockReply",
            Kind::SlotReport => "SlotReport",
            Kind::SlotLength => "SlotLength",
            Kind::Revoked => "Revoked",
            Kind::RevokedAck => "RevokedAck",
        }
    }
}

/// The 8 bytes in front of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: Kind,
    pub body_len: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.body_len.to_le_bytes());
        b
    }

    /// Decodes and validates a frame header; `max_body` bounds the body.
    pub fn decode(b: &[u8; FRAME_HEADER_LEN], max_body: u64) -> Result<FrameHeader, WireError> {
        if b[0..2] != MAGIC {
            return Err(WireError::BadMagic([b[0], b[1]]));
        }
        if b[2] != VERSION {
            return Err(WireError::BadVersion(b[2]));
        }
        let kind = Kind::from_u8(b[3])?;
        let body_len = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if u64::from(body_len) > max_body {
            return Err(WireError::TooLarge {
                len: body_len.into(),
                max: max_body,
            });
        }
        match kind.fixed_body_len() {
            Some(expected) if expected != body_len as usize => Err(WireError::BadLength {
                kind: kind.name(),
                expected: expected as u64,
                got: body_len.into(),
            }),
            None if (body_len as usize) < FRAGMENT_HEADER_LEN => Err(WireError::BadLength {
                kind: kind.name(),
                expected: FRAGMENT_HEADER_LEN as u64,
                got: body_len.into(),
            }),
            _ => Ok(FrameHeader { kind, body_len }),
        }
    }
}

/// Describes one Readout Unit's fragment of one MEP. The payload that
/// follows is `event_count` little-endian u32 event sizes, then the event
/// data; `crc32c` covers the whole payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FragmentHeader {
    pub run_id: u32,
    pub source: u16,
    pub flags: u16,
    pub mep: MepId,
    pub event_count: u32,
    pub payload_len: u32,
    pub crc32c: u32,
}

impl FragmentHeader {
    pub fn encode(&self) -> [u8; FRAGMENT_HEADER_LEN] {
        let mut b = [0u8; FRAGMENT_HEADER_LEN];
        b[0..4].copy_from_slice(&self.run_id.to_le_bytes());
        b[4..6].copy_from_slice(&self.source.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.mep.to_le_bytes());
        b[16..20].copy_from_slice(&self.event_count.to_le_bytes());
        b[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b[24..28].copy_from_slice(&self.crc32c.to_le_bytes());
        // 28..32 reserved, zero.
        b
    }

    pub fn decode(b: &[u8; FRAGMENT_HEADER_LEN]) -> FragmentHeader {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        FragmentHeader {
            run_id: u32_at(0),
            source: u16::from_le_bytes([b[4], b[5]]),
            flags: u16::from_le_bytes([b[6], b[7]]),
            mep: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            event_count: u32_at(16),
            payload_len: u32_at(20),
            crc32c: u32_at(24),
        }
    }

    /// Frame header announcing this fragment and its payload.
    pub fn frame_header(&self) -> FrameHeader {
        FrameHeader {
            kind: Kind::Fragment,
            body_len: FRAGMENT_HEADER_LEN as u32 + self.payload_len,
        }
    }

    /// Checks that the fragment header agrees with its frame header.
    pub fn check_frame(&self, frame: &FrameHeader) -> Result<(), WireError> {
        let expected = FRAGMENT_HEADER_LEN as u64 + u64::from(self.payload_len);
        if u64::from(frame.body_len) != expected {
            return Err(WireError::BadLength {
                kind: "Fragment",
                expected,
                got: frame.body_len.into(),
            });
        }
        Ok(())
    }
}

/// Control messages, and the header of a fragment (its payload travels
/// separately so that it can be received straight into a batch buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// First message on every connection: who is speaking, in which run,
    /// and from which process: `host` names the kernel and process-id
    /// namespace the sender runs in (0: unknown) and `pid` its process
    /// there, so that a peer on the same host can tell a process starved
    /// of CPU from a hung one when it falls silent.
    Hello {
        run_id: u32,
        node: NodeId,
        nodes: u16,
        host: u64,
        pid: u32,
    },
    /// BU -> EM: the BU can take `credits` more batches.
    Credit { bu: NodeId, credits: u32 },
    /// EM -> RUs and the BU: MEP `mep` is built on node `bu`.
    Assign { mep: MepId, bu: NodeId },
    /// BU -> RU (PULL): send me your fragment of `mep`.
    Request { mep: MepId, bu: NodeId },
    /// RU -> BU: a fragment; `payload_len` bytes of payload follow.
    Fragment(FragmentHeader),
    /// EM -> everyone: no MEP at or above `meps` will be assigned; drain.
    EndOfRun { meps: MepId },
    /// Liveness on an otherwise idle connection.
    Heartbeat,
    /// Transport level, on byte streams: the sender has finished this run
    /// and closes its side next. The close that follows is orderly even if
    /// the receiver has not seen the EM's EndOfRun yet; a close without it
    /// (a killed process) is a loss.
    Goodbye,
    /// BU -> RU (PULL): the batch of `mep` is finished without your
    /// fragment; drop it.
    Abandon { mep: MepId, bu: NodeId },
    /// BU -> EM: `mep` is finished with `outcome` ([`outcome`] codes); one
    /// credit returns with it.
    Finished { mep: MepId, bu: NodeId, outcome: u8 },
    /// EM -> BUs: the RU of `source` is gone; MEPs from `from_mep` on are
    /// built without it.
    SourceDown { source: u16, from_mep: MepId },
    /// FU -> BU: the Filter Unit on endpoint `fu` takes `credits` more
    /// batches from this BU.
    ConsumerCredit { fu: NodeId, credits: u32 },
    /// BU -> FU: the BU on endpoint `bu` delivers nothing more this run.
    OutputEnd { bu: NodeId },
    /// EM -> BUs: the RU of `source` is back (its node rejoined); MEPs from
    /// `from_mep` on are built with it again.
    SourceUp { source: u16, from_mep: MepId },
    /// EM -> live RUs: the BU on endpoint `bu` is lost; decision `round`
    /// on its unfinished MEPs starts. Keep what you hold for it and list it
    /// (`Holding`, then `HoldingDone`).
    BuLost { bu: NodeId, round: u32 },
    /// RU -> EM: for `round`, this RU still holds its fragment of `mep`
    /// (not handed to the transport). One message per MEP: at most the
    /// lost BU's credits of them.
    Holding { round: u32, mep: MepId },
    /// RU -> EM: every `Holding` of `round` has been sent.
    HoldingDone { round: u32 },
    /// EM -> RUs: `round` is decided; drop what you still hold for it
    /// (its MEPs were counted lost; the reassigned ones were re-assigned
    /// before this message).
    ReleaseHeld { round: u32 },
    /// EM -> the new BU and the RUs that kept it: MEP `mep` of a lost BU
    /// is now built on node `bu` (for the BU, an `Assign`; an RU ships the
    /// fragment it kept there, and ignores it if it kept none).
    Reassign { mep: MepId, bu: NodeId },
    /// Node -> an EM that (re)joined it: every MEP this node has seen
    /// assigned is below `next_mep`; `ended`: it had the EM's EndOfRun
    /// (`next_mep` is then at least its count). A restarted EM resumes
    /// above what every live node saw, so no MEP id is handed out twice,
    /// and ends the run at once if any node had seen it end.
    SeenUpTo { next_mep: MepId, ended: bool },
    /// EM -> RUs and BUs: MEPs `first .. first + count` are assigned, in
    /// order, to the BUs of index `first_bu`, `first_bu + 1`, ... (mod the
    /// number of BUs): one message for a run of round-robin assignments,
    /// so the EM's traffic does not grow with the MEP rate times the
    /// number of RUs. Each MEP is then handled as an `Assign`.
    AssignRun {
        first: MepId,
        count: u32,
        first_bu: u16,
    },
    /// Node -> EM: what time is it? `sent` is the node's clock when it
    /// sent this (NTP-style offset measurement for the slot clock).
    ClockProbe { sent: u64 },
    /// EM -> node: the answer to a `ClockProbe`: its `sent` echoed, and the
    /// EM's clock when it answered.
    ClockReply { sent: u64, em_time: u64 },
    /// RU -> EM (slotted barrel): since its last report, `served` of the
    /// RU's fragments completed, `overran` of them after the end of their
    /// slot (the host's completion latency aside); its fragments take at
    /// least `stretch` / 1024 times as long as at the nominal link rate
    /// (the least of them: those that met no queue). The EM lengthens the slots when RUs keep
    /// overrunning them ([`crate::adapt`]).
    SlotReport {
        served: u32,
        overran: u32,
        stretch: u32,
    },
    /// EM -> RUs (slotted barrel): from slot `from` on, slot S starts at
    /// `start_ns + (S - from) * slot_ns` on the EM's clock.
    SlotLength {
        from: u64,
        start_ns: u64,
        slot_ns: u64,
    },
    /// EM -> a BU it had lost and now re-admits (the same process, its
    /// links back): `mep` was assigned to it and unfinished when the EM
    /// lost it, and the EM took it (re-assigned it to another BU, or
    /// counted it lost): its fate is not this BU's to count. One message
    /// per MEP, at most that BU's credits of them, before anything else
    /// the EM tells it on the new link. Told again at each rejoin until
    /// the BU acknowledges it ([`Message::RevokedAck`]).
    Revoked { mep: MepId },
    /// BU -> EM: the BU had `Revoked{mep}` (and counts `mep` in none of its
    /// fates, or never had it): the EM forgets it and, once every MEP it
    /// took from that BU is acknowledged, assigns to it again.
    RevokedAck { mep: MepId },
}

/// Outcome codes of [`Message::Finished`].
pub mod outcome {
    pub const BUILT: u8 = 0;
    pub const INCOMPLETE: u8 = 1;
    pub const CORRUPT: u8 = 2;
}

impl Message {
    /// The (MEP, BU endpoint) assignments an `Assign` or `AssignRun`
    /// carries (`bu_nodes`: the endpoint of each BU index); none for other
    /// messages, or for a run that names a BU index that does not exist.
    pub fn assignments(&self, bu_nodes: &[NodeId]) -> Vec<(MepId, NodeId)> {
        match *self {
            Message::Assign { mep, bu } => vec![(mep, bu)],
            Message::AssignRun {
                first,
                count,
                first_bu,
            } if usize::from(first_bu) < bu_nodes.len() => (0..u64::from(count))
                .map(|k| {
                    let b = (usize::from(first_bu) + k as usize) % bu_nodes.len();
                    (first.wrapping_add(k), bu_nodes[b])
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello { .. } => Kind::Hello,
            Message::Credit { .. } => Kind::Credit,
            Message::Assign { .. } => Kind::Assign,
            Message::Request { .. } => Kind::Request,
            Message::Fragment(_) => Kind::Fragment,
            Message::EndOfRun { .. } => Kind::EndOfRun,
            Message::Heartbeat => Kind::Heartbeat,
            Message::Goodbye => Kind::Goodbye,
            Message::SeenUpTo { .. } => Kind::SeenUpTo,
            Message::AssignRun { .. } => Kind::AssignRun,
            Message::ClockProbe { .. } => Kind::ClockProbe,
            Message::ClockReply { .. } => Kind::ClockReply,
            Message::SlotReport { .. } => Kind::SlotReport,
            Message::SlotLength { .. } => Kind::SlotLength,
            Message::Revoked { .. } => Kind::Revoked,
            Message::RevokedAck { .. } => Kind::RevokedAck,
            Message::Abandon { .. } => Kind::Abandon,
            Message::Finished { .. } => Kind::Finished,
            Message::SourceDown { .. } => Kind::SourceDown,
            Message::ConsumerCredit { .. } => Kind::ConsumerCredit,
            Message::OutputEnd { .. } => Kind::OutputEnd,
            Message::SourceUp { .. } => Kind::SourceUp,
            Message::BuLost { .. } => Kind::BuLost,
            Message::Holding { .. } => Kind::Holding,
            Message::HoldingDone { .. } => Kind::HoldingDone,
            Message::ReleaseHeld { .. } => Kind::ReleaseHeld,
            Message::Reassign { .. } => Kind::Reassign,
        }
    }

    /// Appends the frame header and body (for a fragment: its header, not
    /// the payload) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let frame = match self {
            Message::Fragment(h) => h.frame_header(),
            other => FrameHeader {
                kind: other.kind(),
                body_len: other.kind().fixed_body_len().unwrap_or(0) as u32,
            },
        };
        out.extend_from_slice(&frame.encode());
        match *self {
            Message::Hello {
                run_id,
                node,
                nodes,
                host,
                pid,
            } => {
                out.extend_from_slice(&run_id.to_le_bytes());
                out.extend_from_slice(&node.to_le_bytes());
                out.extend_from_slice(&nodes.to_le_bytes());
                out.extend_from_slice(&host.to_le_bytes());
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
            }
            Message::Credit { bu: id, credits } | Message::ConsumerCredit { fu: id, credits } => {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&credits.to_le_bytes());
            }
            Message::Assign { mep, bu }
            | Message::Request { mep, bu }
            | Message::Abandon { mep, bu }
            | Message::Reassign { mep, bu } => {
                out.extend_from_slice(&mep.to_le_bytes());
                out.extend_from_slice(&bu.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Message::Fragment(h) => out.extend_from_slice(&h.encode()),
            Message::EndOfRun { meps }
            | Message::Revoked { mep: meps }
            | Message::RevokedAck { mep: meps } => {
                out.extend_from_slice(&meps.to_le_bytes());
            }
            Message::SeenUpTo { next_mep, ended } => {
                out.extend_from_slice(&next_mep.to_le_bytes());
                out.extend_from_slice(&[u8::from(ended), 0, 0, 0]);
            }
            Message::Finished { mep, bu, outcome } => {
                out.extend_from_slice(&mep.to_le_bytes());
                out.extend_from_slice(&bu.to_le_bytes());
                out.extend_from_slice(&[outcome, 0]);
            }
            Message::SourceDown { source, from_mep } | Message::SourceUp { source, from_mep } => {
                out.extend_from_slice(&from_mep.to_le_bytes());
                out.extend_from_slice(&source.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Message::OutputEnd { bu } => {
                out.extend_from_slice(&bu.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Message::BuLost { bu, round } => {
                out.extend_from_slice(&bu.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&round.to_le_bytes());
            }
            Message::Holding { round, mep } => {
                out.extend_from_slice(&mep.to_le_bytes());
                out.extend_from_slice(&round.to_le_bytes());
            }
            Message::HoldingDone { round } | Message::ReleaseHeld { round } => {
                out.extend_from_slice(&round.to_le_bytes());
            }
            Message::AssignRun {
                first,
                count,
                first_bu,
            } => {
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(&first_bu.to_le_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Message::ClockProbe { .. }
            | Message::ClockReply { .. }
            | Message::SlotReport { .. }
            | Message::SlotLength { .. } => self.encode_slot_clock(out),
            Message::Heartbeat | Message::Goodbye => {}
        }
    }

    /// Decodes the body of a validated frame. For a fragment, `body` must
    /// hold at least the fragment header; the payload is not looked at.
    pub fn decode_body(frame: &FrameHeader, body: &[u8]) -> Result<Message, WireError> {
        Self::check_body(frame, body)?;
        let u16_at = |i: usize| u16::from_le_bytes([body[i], body[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        Ok(match frame.kind {
            Kind::Hello => Message::Hello {
                run_id: u32_at(0),
                node: u16_at(4),
                nodes: u16_at(6),
                host: u64_at(8),
                pid: u32_at(16),
            },
            Kind::Credit => Message::Credit {
                bu: u16_at(0),
                credits: u32_at(4),
            },
            Kind::Assign => Message::Assign {
                mep: u64_at(0),
                bu: u16_at(8),
            },
            Kind::Request => Message::Request {
                mep: u64_at(0),
                bu: u16_at(8),
            },
            Kind::Fragment => {
                let h = FragmentHeader::decode(
                    body[..FRAGMENT_HEADER_LEN]
                        .try_into()
                        .expect("length checked above"),
                );
                h.check_frame(frame)?;
                Message::Fragment(h)
            }
            Kind::EndOfRun => Message::EndOfRun { meps: u64_at(0) },
            Kind::Revoked => Message::Revoked { mep: u64_at(0) },
            Kind::RevokedAck => Message::RevokedAck { mep: u64_at(0) },
            Kind::SeenUpTo => {
                if body[8] > 1 || body[9..12] != [0, 0, 0] {
                    return Err(WireError::NonZeroReserved { kind: "SeenUpTo" });
                }
                Message::SeenUpTo {
                    next_mep: u64_at(0),
                    ended: body[8] == 1,
                }
            }
            Kind::Heartbeat => Message::Heartbeat,
            Kind::Goodbye => Message::Goodbye,
            Kind::Abandon => Message::Abandon {
                mep: u64_at(0),
                bu: u16_at(8),
            },
            Kind::Finished => Message::Finished {
                mep: u64_at(0),
                bu: u16_at(8),
                outcome: body[10],
            },
            Kind::SourceDown => Message::SourceDown {
                from_mep: u64_at(0),
                source: u16_at(8),
            },
            Kind::ConsumerCredit => Message::ConsumerCredit {
                fu: u16_at(0),
                credits: u32_at(4),
            },
            Kind::OutputEnd => Message::OutputEnd { bu: u16_at(0) },
            Kind::SourceUp => Message::SourceUp {
                from_mep: u64_at(0),
                source: u16_at(8),
            },
            Kind::BuLost => Message::BuLost {
                bu: u16_at(0),
                round: u32_at(4),
            },
            Kind::Holding => Message::Holding {
                mep: u64_at(0),
                round: u32_at(8),
            },
            Kind::HoldingDone => Message::HoldingDone { round: u32_at(0) },
            Kind::ReleaseHeld => Message::ReleaseHeld { round: u32_at(0) },
            Kind::Reassign => Message::Reassign {
                mep: u64_at(0),
                bu: u16_at(8),
            },
            Kind::AssignRun => Message::AssignRun {
                first: u64_at(0),
                count: u32_at(8),
                first_bu: u16_at(12),
            },
            Kind::ClockProbe | Kind::ClockReply | Kind::SlotReport | Kind::SlotLength => {
                Self::decode_slot_clock(frame.kind, body)
            }
        })
    }

    /// The bodies of the slot clock's messages (probes, replies, slot
    /// reports and lengths).
    fn encode_slot_clock(&self, out: &mut Vec<u8>) {
        match *self {
            Message::ClockProbe { sent } => out.extend_from_slice(&sent.to_le_bytes()),
            Message::ClockReply { sent, em_time } => {
                out.extend_from_slice(&sent.to_le_bytes());
                out.extend_from_slice(&em_time.to_le_bytes());
            }
            Message::SlotReport {
                served,
                overran,
                stretch,
            } => {
                out.extend_from_slice(&served.to_le_bytes());
                out.extend_from_slice(&overran.to_le_bytes());
                out.extend_from_slice(&stretch.to_le_bytes());
            }
            Message::SlotLength {
                from,
                start_ns,
                slot_ns,
            } => {
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&start_ns.to_le_bytes());
                out.extend_from_slice(&slot_ns.to_le_bytes());
            }
            _ => unreachable!("only the slot clock's messages come here"),
        }
    }

    /// Decodes a slot clock message's body (its length already checked).
    fn decode_slot_clock(kind: Kind, body: &[u8]) -> Message {
        let u32_at =
            |i: usize| u32::from_le_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        match kind {
            Kind::ClockProbe => Message::ClockProbe { sent: u64_at(0) },
            Kind::ClockReply => Message::ClockReply {
                sent: u64_at(0),
                em_time: u64_at(8),
            },
            Kind::SlotReport => Message::SlotReport {
                served: u32_at(0),
                overran: u32_at(4),
                stretch: u32_at(8),
            },
            Kind::SlotLength => Message::SlotLength {
                from: u64_at(0),
                start_ns: u64_at(8),
                slot_ns: u64_at(16),
            },
            _ => unreachable!("only the slot clock's kinds come here"),
        }
    }

    /// What every body must pass before its fields are read: long enough
    /// for its kind, and zero in its padding and reserved bytes.
    fn check_body(frame: &FrameHeader, body: &[u8]) -> Result<(), WireError> {
        let need = frame.kind.fixed_body_len().unwrap_or(FRAGMENT_HEADER_LEN);
        if body.len() < need {
            return Err(WireError::BadLength {
                kind: frame.kind.name(),
                expected: need as u64,
                got: body.len() as u64,
            });
        }
        // Padding and reserved bytes must be zero: anything else is
        // corruption or a peer speaking another dialect.
        let reserved: &[usize] = match frame.kind {
            Kind::Credit | Kind::ConsumerCredit | Kind::OutputEnd | Kind::BuLost => &[2, 3],
            Kind::Assign
            | Kind::Request
            | Kind::Abandon
            | Kind::SourceDown
            | Kind::SourceUp
            | Kind::Reassign => &[10, 11],
            Kind::Finished => &[11],
            Kind::AssignRun => &[14, 15],
            Kind::Fragment => &[28, 29, 30, 31],
            Kind::Hello => &[20, 21, 22, 23],
            _ => &[],
        };
        if reserved.iter().any(|&i| body[i] != 0) {
            return Err(WireError::NonZeroReserved {
                kind: frame.kind.name(),
            });
        }
        Ok(())
    }
}

/// Decodes one message from the front of `buf` (a stream of frames).
///
/// Returns `Ok(None)` if more bytes are needed, or the message and the
/// number of bytes it occupies including any fragment payload. Used by the
/// fuzz target and by tests; the runtime decodes incrementally.
pub fn decode_stream(buf: &[u8], max_body: u64) -> Result<Option<(Message, usize)>, WireError> {
    let Some(head) = buf.get(..FRAME_HEADER_LEN) else {
        return Ok(None);
    };
    let frame = FrameHeader::decode(head.try_into().expect("8 bytes"), max_body)?;
    let total = FRAME_HEADER_LEN + frame.body_len as usize;
    let Some(body) = buf.get(FRAME_HEADER_LEN..total) else {
        return Ok(None);
    };
    Ok(Some((Message::decode_body(&frame, body)?, total)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (
                any::<u32>(),
                any::<u16>(),
                any::<u16>(),
                any::<u64>(),
                any::<u32>()
            )
                .prop_map(|(run_id, node, nodes, host, pid)| Message::Hello {
                    run_id,
                    node,
                    nodes,
                    host,
                    pid,
                }),
            (any::<u16>(), any::<u32>()).prop_map(|(bu, credits)| Message::Credit { bu, credits }),
            (any::<u64>(), any::<u16>()).prop_map(|(mep, bu)| Message::Assign { mep, bu }),
            (any::<u64>(), any::<u16>()).prop_map(|(mep, bu)| Message::Request { mep, bu }),
            (any::<u64>(), any::<u16>()).prop_map(|(mep, bu)| Message::Abandon { mep, bu }),
            (any::<u64>(), any::<u16>(), any::<u8>())
                .prop_map(|(mep, bu, outcome)| Message::Finished { mep, bu, outcome }),
            (any::<u16>(), any::<u64>())
                .prop_map(|(source, from_mep)| Message::SourceDown { source, from_mep }),
            (any::<u16>(), any::<u64>())
                .prop_map(|(source, from_mep)| Message::SourceUp { source, from_mep }),
            (
                any::<u32>(),
                any::<u16>(),
                any::<u16>(),
                any::<u64>(),
                any::<u32>(),
                0u32..4096,
                any::<u32>()
            )
                .prop_map(
                    |(run_id, source, flags, mep, event_count, payload_len, crc32c)| {
                        Message::Fragment(FragmentHeader {
                            run_id,
                            source,
                            flags,
                            mep,
                            event_count,
                            payload_len,
                            crc32c,
                        })
                    }
                ),
            any::<u64>().prop_map(|meps| Message::EndOfRun { meps }),
            (any::<u16>(), any::<u32>())
                .prop_map(|(fu, credits)| Message::ConsumerCredit { fu, credits }),
            any::<u16>().prop_map(|bu| Message::OutputEnd { bu }),
            (any::<u16>(), any::<u32>()).prop_map(|(bu, round)| Message::BuLost { bu, round }),
            (any::<u32>(), any::<u64>()).prop_map(|(round, mep)| Message::Holding { round, mep }),
            any::<u32>().prop_map(|round| Message::HoldingDone { round }),
            any::<u32>().prop_map(|round| Message::ReleaseHeld { round }),
            (any::<u64>(), any::<u16>()).prop_map(|(mep, bu)| Message::Reassign { mep, bu }),
            any::<u64>().prop_map(|mep| Message::Revoked { mep }),
            any::<u64>().prop_map(|mep| Message::RevokedAck { mep }),
            Just(Message::Heartbeat),
            Just(Message::Goodbye),
            (any::<u64>(), any::<bool>())
                .prop_map(|(next_mep, ended)| Message::SeenUpTo { next_mep, ended }),
            (any::<u64>(), any::<u32>(), any::<u16>()).prop_map(|(first, count, first_bu)| {
                Message::AssignRun {
                    first,
                    count,
                    first_bu,
                }
            }),
            any::<u64>().prop_map(|sent| Message::ClockProbe { sent }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(sent, em_time)| Message::ClockReply { sent, em_time }),
            (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(served, overran, stretch)| {
                Message::SlotReport {
                    served,
                    overran,
                    stretch,
                }
            }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(from, start_ns, slot_ns)| {
                Message::SlotLength {
                    from,
                    start_ns,
                    slot_ns,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(msg in any_message(), payload_byte in any::<u8>()) {
            let mut buf = Vec::new();
            msg.encode_into(&mut buf);
            if let Message::Fragment(h) = msg {
                buf.resize(buf.len() + h.payload_len as usize, payload_byte);
            }
            let (decoded, used) = decode_stream(&buf, 1 << 20).unwrap().unwrap();
            prop_assert_eq!(decoded, msg);
            prop_assert_eq!(used, buf.len());
            // Every strict prefix asks for more bytes rather than failing.
            for cut in [0, 1, FRAME_HEADER_LEN - 1, buf.len() - 1] {
                if cut < buf.len() {
                    prop_assert_eq!(decode_stream(&buf[..cut], 1 << 20).unwrap(), None);
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_stream(&bytes, 1 << 16);
        }
    }

    #[test]
    fn rejects_oversized_body_before_reading_it() {
        let h = FragmentHeader {
            payload_len: u32::MAX - 64,
            ..Default::default()
        };
        let mut buf = Vec::new();
        Message::Fragment(h).encode_into(&mut buf);
        let err = decode_stream(&buf, 1 << 20).unwrap_err();
        assert!(matches!(err, WireError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn rejects_bad_magic_version_kind_and_length() {
        let mut buf = Vec::new();
        Message::Heartbeat.encode_into(&mut buf);
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert!(matches!(
            decode_stream(&bad, 64),
            Err(WireError::BadMagic(_))
        ));
        let mut bad = buf.clone();
        bad[2] = 9;
        assert_eq!(decode_stream(&bad, 64), Err(WireError::BadVersion(9)));
        let mut bad = buf.clone();
        bad[3] = 200;
        assert_eq!(decode_stream(&bad, 64), Err(WireError::UnknownKind(200)));
        let mut bad = buf.clone();
        bad[4] = 3;
        assert!(matches!(
            decode_stream(&bad, 64),
            Err(WireError::BadLength { .. })
        ));
    }

    /// Found by `cargo fuzz` (wire_decode): an Assign whose padding was
    /// not zero decoded, and re-encoded to other bytes.
    #[test]
    fn nonzero_padding_is_rejected() {
        let crash = [
            69, 66, VERSION, 3, 12, 0, 0, 0, 12, 0, 0, 0, 0, 255, 255, 105, 105, 105, 105, 105,
        ];
        assert_eq!(
            decode_stream(&crash, 1 << 16),
            Err(WireError::NonZeroReserved { kind: "Assign" })
        );
        let mut frag = Vec::new();
        Message::Fragment(FragmentHeader::default()).encode_into(&mut frag);
        frag[FRAME_HEADER_LEN + 30] = 1;
        assert!(matches!(
            decode_stream(&frag, 64),
            Err(WireError::NonZeroReserved { .. })
        ));
    }

    #[test]
    fn batch_table_must_add_up() {
        let mut p = Vec::new();
        p.extend_from_slice(&2u32.to_le_bytes());
        p.extend_from_slice(&3u32.to_le_bytes());
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&[7, 7, 7, 9]);
        assert_eq!(check_batch_payload(&p), Ok(2));
        assert_eq!(
            batch_fragments(&p).unwrap(),
            vec![&[7u8, 7, 7][..], &[9u8][..]]
        );
        assert_eq!(p.len() as u64, batch_payload_len(2, 4));
        assert!(batch_fragments(&p[..p.len() - 1]).is_err());
        assert!(check_batch_payload(&p[..p.len() - 1]).is_err());
        // A count far beyond the payload is an error, not an allocation.
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 12]);
        assert!(check_batch_payload(&huge).is_err());
        assert!(check_batch_payload(&[1, 0]).is_err());
    }

    #[test]
    fn fragment_header_must_match_frame_length() {
        let h = FragmentHeader {
            payload_len: 10,
            ..Default::default()
        };
        let mut buf = Vec::new();
        Message::Fragment(h).encode_into(&mut buf);
        // Frame says 32 + 11 bytes, fragment header says 10 bytes of payload.
        buf[4] += 1;
        buf.resize(buf.len() + 11, 0);
        assert!(matches!(
            decode_stream(&buf, 1 << 20),
            Err(WireError::BadLength { .. })
        ));
    }

    /// The reassignment kinds (14..=18, 26, 27): fixed lengths, so a hostile length
    /// is an error before anything is read, and reserved bytes are checked.
    #[test]
    fn reassignment_kinds_decode_and_reject_bad_frames() {
        let msgs = [
            Message::BuLost { bu: 3, round: 7 },
            Message::Holding {
                round: 7,
                mep: 0x0102_0304_0506_0708,
            },
            Message::HoldingDone { round: u32::MAX },
            Message::ReleaseHeld { round: 1 },
            Message::Reassign { mep: 9, bu: 2 },
            Message::Revoked { mep: u64::MAX - 1 },
            Message::RevokedAck { mep: 5 },
        ];
        let layout = [
            (14u8, 8u8),
            (15, 12),
            (16, 4),
            (17, 4),
            (18, 12),
            (26, 8),
            (27, 8),
        ];
        for (msg, (kind, len)) in msgs.iter().zip(layout) {
            let mut buf = Vec::new();
            msg.encode_into(&mut buf);
            assert_eq!((buf[3], buf[4]), (kind, len), "{msg:?}");
            assert_eq!(buf.len(), FRAME_HEADER_LEN + len as usize);
            assert_eq!(
                decode_stream(&buf, 64),
                Ok(Some((*msg, buf.len()))),
                "{msg:?}"
            );
            // Any other body length is rejected from the frame header alone,
            // even one claiming far more than the bound.
            for bad_len in [0u32, u32::from(len) - 1, u32::from(len) + 1, u32::MAX] {
                let mut bad = buf.clone();
                bad[4..8].copy_from_slice(&bad_len.to_le_bytes());
                let err = decode_stream(&bad, 1 << 16).unwrap_err();
                assert!(
                    matches!(
                        err,
                        WireError::BadLength { .. } | WireError::TooLarge { .. }
                    ),
                    "{msg:?} with body_len {bad_len}: {err}"
                );
            }
            // A truncated body asks for more bytes.
            assert_eq!(decode_stream(&buf[..buf.len() - 1], 64), Ok(None));
        }
        // BuLost's padding must be zero.
        let mut buf = Vec::new();
        Message::BuLost { bu: 1, round: 2 }.encode_into(&mut buf);
        buf[FRAME_HEADER_LEN + 2] = 1;
        assert_eq!(
            decode_stream(&buf, 64),
            Err(WireError::NonZeroReserved { kind: "BuLost" })
        );
        // Reassign's too.
        let mut buf = Vec::new();
        Message::Reassign { mep: 1, bu: 2 }.encode_into(&mut buf);
        buf[FRAME_HEADER_LEN + 11] = 1;
        assert_eq!(
            decode_stream(&buf, 64),
            Err(WireError::NonZeroReserved { kind: "Reassign" })
        );
        // AssignRun's padding too.
        let mut buf = Vec::new();
        Message::AssignRun {
            first: 7,
            count: 3,
            first_bu: 1,
        }
        .encode_into(&mut buf);
        buf[FRAME_HEADER_LEN + 15] = 1;
        assert_eq!(
            decode_stream(&buf, 64),
            Err(WireError::NonZeroReserved { kind: "AssignRun" })
        );
        // Hello's padding too.
        let mut buf = Vec::new();
        Message::Hello {
            run_id: 1,
            node: 0,
            nodes: 2,
            host: 3,
            pid: 4,
        }
        .encode_into(&mut buf);
        buf[FRAME_HEADER_LEN + 23] = 1;
        assert_eq!(
            decode_stream(&buf, 64),
            Err(WireError::NonZeroReserved { kind: "Hello" })
        );
        // The next kind number is still unknown.
        buf[3] = 28;
        assert_eq!(decode_stream(&buf, 64), Err(WireError::UnknownKind(28)));
    }

    #[test]
    fn an_assign_run_names_consecutive_bus_and_a_bad_one_names_none() {
        let run = Message::AssignRun {
            first: 10,
            count: 4,
            first_bu: 2,
        };
        assert_eq!(
            run.assignments(&[5, 6, 7]),
            vec![(10, 7), (11, 5), (12, 6), (13, 7)]
        );
        let bad = Message::AssignRun {
            first: 10,
            count: 4,
            first_bu: 3,
        };
        assert!(bad.assignments(&[5, 6, 7]).is_empty());
    }
}
