//! What an engine's `progress` reports: one type for evb-ucx and evb-ofi,
//! so that the runtime's adapters read them the same way. Each variant
//! says which engine reports it; a caller matches them all.

use crate::PeerId;

/// Something that finished.
#[derive(Debug)]
pub enum Completion {
    /// A send finished: its buffers are released; `ctx` is the caller's.
    Sent { ctx: u64 },
    /// A message arrived into a buffer given with `post_recv`
    /// (`buf.len() == len`); `tag` is the sender's (the caller's 32 bits).
    Received { buf: Vec<u8>, len: usize, tag: u64 },
    /// A send failed (peer gone, ...): ctx of the send and a readable reason.
    SendFailed { ctx: u64, reason: String },
    /// A message could not be received into `buf`, typically one larger
    /// than the buffer; the buffer comes back to be posted again. evb-ucx
    /// empties it; evb-ofi leaves the first bytes the provider wrote.
    /// `tag`: the sender's tag, as the library reported it (a broken
    /// connection on libfabric reports none of ours: then it means nothing).
    ReceiveFailed {
        buf: Vec<u8>,
        tag: u64,
        reason: String,
    },
    /// The library reported the connection to this peer broken; sends to
    /// it fail from now on (evb-ucx, with peer failure detection).
    PeerFailed { peer: PeerId, reason: String },
    /// Rejoin ([`crate::Links`]): a new incarnation of the sender `source`
    /// (tag bits) is reachable as `peer`, and what it sends from now on is
    /// handed out; or, on a restarted endpoint, the peer `peer` (whose
    /// messages carry `source`) took it back; or a relinked peer is
    /// reachable again as `peer`.
    PeerJoined { peer: PeerId, source: u64 },
    /// The library reported a failure it did not tie to any operation the
    /// endpoint posted (a null or internal context; evb-ofi). libfabric
    /// 1.17's tcp;ofi_rxm does this when a message from a peer whose
    /// connection is already gone is matched to a posted receive: that
    /// receive is never completed, so the caller should post a replacement
    /// buffer.
    Unattributed { reason: String },
}

impl Completion {
    /// The receive buffer this completion carries, if any (to post it
    /// again when the completion is dropped rather than handed out).
    pub fn into_buffer(self) -> Option<Vec<u8>> {
        match self {
            Completion::Received { buf, .. } | Completion::ReceiveFailed { buf, .. } => Some(buf),
            _ => None,
        }
    }
}
