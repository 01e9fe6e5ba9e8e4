//! The rejoin/relink state machine both engines run: per peer, the epoch
//! it expects on our messages and the handshake under way; per sender, the
//! epoch of its current incarnation, its ordered stream and the peer it is
//! reachable as; the RELINK requests under way with their retries; the
//! sequence numbers of our own streams. No I/O: the engine opens
//! endpoints, sends and posts buffers, and calls in with what happened;
//! each call returns what the engine must do ([`ControlMessage`]s to send,
//! buffers to post again, a source whose receives to cancel).
//!
//! **Rejoin.** A restarted process (a new incarnation of a sender, with a
//! new address) reaches each live endpoint with a JOIN
//! ([`Links::join_request`]). The live endpoint opens an endpoint to the
//! new address and calls [`Links::accept_join`]: the sender's epoch moves
//! on, its stream starts afresh (sequence 0, what the old one held back
//! is handed back to recycle), [`Completion::PeerJoined`] is reported and
//! the ACK carrying the new epoch is the first message of our stream to
//! the new incarnation. There, [`Links::accept_ack`] takes the epoch for
//! every later message and reports `PeerJoined` in stream order. A
//! receiver hands out only messages of the current epoch of their source
//! ([`Links::arrival`]): whatever the old incarnation left in flight is
//! dropped, in whatever order the two incarnations' messages arrive. The
//! epoch is per link and wraps after 256 joins of one source.
//!
//! **Relink.** When the runtime gives up the link to a peer whose process
//! may well live, the higher source of the two asks for it again
//! ([`Links::relink_wanted`]): it opens a new endpoint to the peer's
//! address, bumps its own epoch for the peer and restarts the peer's
//! stream ([`Links::relink_opened`]) and sends a RELINK, a JOIN that also
//! carries that epoch; the lower answers as it answers a JOIN, and stamps
//! its messages to the asker with the asker's epoch. So both directions
//! drop whatever the old link still delivers. A request whose endpoint
//! failed is made again after a backoff ([`RELINK_BACKOFF`] doubling to
//! [`RELINK_BACKOFF_MAX`]), at most [`RELINK_ATTEMPTS`] times (a dead
//! peer's restart joins anew); one to a peer not reachable at all (no
//! endpoint opens) is tried again for as long as it takes.
//!
//! Invariants (asserted in debug builds): peers are added in index order
//! and every peer index the state machine hands out or records is one
//! added; a peer's send epoch changes only with an ACK it awaited or a
//! JOIN/RELINK that created it; an ACK is the first message of our stream
//! to its peer; a pending RELINK names a peer that awaits its ACK.

use std::collections::HashMap;
use std::fmt::Display;
use std::time::{Duration, Instant};

use crate::stream::{Epochs, Streams};
use crate::wire::{self, CTRL_BIT, SEQ_MASK, TAG_MASK};
use crate::{Completion, Error, PeerId};

/// After this many requests whose endpoint failed (each one opens an
/// endpoint) the peer is taken for dead: no more requests; a restart of it
/// joins anew. A peer that is not reachable at all (a link down: no
/// endpoint opens) is asked again for as long as it takes.
pub const RELINK_ATTEMPTS: u32 = 10;

/// First wait before a RELINK whose endpoint failed is sent again; it
/// doubles up to [`RELINK_BACKOFF_MAX`] (as tcp re-dials).
pub const RELINK_BACKOFF: Duration = Duration::from_millis(250);
pub const RELINK_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One of the endpoint's own messages (a JOIN, a RELINK or an ACK) for
/// the engine to send; no completion is reported for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlMessage {
    pub peer: PeerId,
    pub wire_tag: u64,
    pub bytes: Vec<u8>,
}

/// What a finished receive is, by its wire tag ([`Links::arrival`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A replaced incarnation's message (its epoch is no longer current):
    /// dropped (counted in [`Links::stale_dropped`]), its buffer posted again.
    Stale,
    /// One of the endpoint's own messages (JOIN, RELINK, ACK).
    Control { tag: u64, source: u64, seq: u32 },
    /// A caller's message, message `seq` of `source`'s stream.
    Data { tag: u64, source: u64, seq: u32 },
}

/// A source's stream restarted (a join or a relink): the old link's stream
/// ends here.
#[derive(Debug)]
#[must_use = "the held-back completions' buffers must be posted again"]
pub struct Restart {
    pub source: u64,
    /// The source's new epoch.
    pub epoch: u8,
    /// What the old stream held back: dropped (counted as stale), their
    /// buffers to be posted again. The engine also cancels whatever it
    /// still awaits from the source (evb-ucx: split bodies).
    pub recycle: Vec<Completion>,
}

/// [`Links::accept_join`]'s result.
#[derive(Debug)]
#[must_use = "the answer must be sent and the buffers posted again"]
pub struct Accepted {
    pub restart: Restart,
    /// The ACK.
    pub answer: ControlMessage,
    /// Our own RELINK to this source was pending and is superseded: the
    /// peer it went to (an engine that queues control messages drops what
    /// it still holds for that peer).
    pub superseded: Option<PeerId>,
}

/// How many times a RELINK was tried, and how long to wait after the next
/// failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelinkAttempt {
    pub backoff: Duration,
    /// Requests whose endpoint failed so far.
    pub failures: u32,
}

impl RelinkAttempt {
    pub const FIRST: RelinkAttempt = RelinkAttempt {
        backoff: RELINK_BACKOFF,
        failures: 0,
    };
}

/// A RELINK to make now: open an endpoint to `address` and call
/// [`Links::relink_opened`], or [`Links::relink_not_sent`] if that fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelinkDue {
    pub source: u64,
    pub address: Vec<u8>,
    pub attempt: RelinkAttempt,
}

/// [`Links::forget_peer`]'s verdict.
#[derive(Debug)]
pub enum Forget {
    /// A new incarnation of the source joined as another peer since: its
    /// stream is not the old one's and stays; only the old incarnation
    /// (`old_epoch`) has messages to throw away.
    Replaced { old_epoch: u8 },
    /// The source's stream is forgotten: `held` (in order) is to be handed
    /// out; its messages of `epoch` are handed out unordered from now on.
    Forgotten { held: Vec<Completion>, epoch: u8 },
}

/// Per peer (engine index).
#[derive(Debug)]
struct PeerLink {
    /// The address it was reached at (a relink opens a new endpoint to it).
    address: Vec<u8>,
    /// The epoch it expects on our messages.
    send_epoch: u8,
    /// We asked it to take us back (JOIN or RELINK); no answer yet.
    awaiting_ack: bool,
}

/// A RELINK under way.
#[derive(Debug)]
struct PendingRelink {
    /// The peer index the request went to (`None`: not sent, the peer was
    /// not reachable).
    peer: Option<PeerId>,
    address: Vec<u8>,
    /// Ask again (from a new endpoint) at this time: the last one failed.
    retry_at: Option<Instant>,
    attempt: RelinkAttempt,
}

/// The state machine (module docs).
#[derive(Debug)]
pub struct Links {
    /// "ucx", "ofi": for the log.
    engine: &'static str,
    /// The bits of the caller's tag that name the sender.
    source_mask: u64,
    /// Rejoin enabled: the source bits of this endpoint's own messages.
    own: Option<u64>,
    peers: Vec<PeerLink>,
    /// Per source: the epoch of its current incarnation (0 at the start).
    epochs: Epochs,
    /// Per source that joined or was relinked: the peer of its current link.
    joined_as: HashMap<u64, PeerId>,
    /// Next sequence number per (destination, sender bits of the tag).
    send_seq: HashMap<(PeerId, u64), u32>,
    /// Per sender: its ordered stream.
    streams: Streams<Completion>,
    /// Per source: the RELINK this endpoint asks or will ask again.
    relinks: HashMap<u64, PendingRelink>,
    /// Messages of replaced incarnations dropped.
    stale_dropped: u64,
}

impl Links {
    /// `engine` names the engine in log lines; `source_mask`: the bits of
    /// the caller's tag that name the sender (cut to the caller's bits).
    pub fn new(engine: &'static str, source_mask: u64) -> Links {
        Links {
            engine,
            source_mask: source_mask & TAG_MASK,
            own: None,
            peers: Vec::new(),
            epochs: Epochs::default(),
            joined_as: HashMap::new(),
            send_seq: HashMap::new(),
            streams: Streams::default(),
            relinks: HashMap::new(),
            stale_dropped: 0,
        }
    }

    pub fn source_mask(&self) -> u64 {
        self.source_mask
    }

    /// The sender bits of a tag.
    pub fn source_of(&self, tag: u64) -> u64 {
        tag & self.source_mask
    }

    /// Take in new incarnations of senders during the run; `own`: the tag
    /// bits that name this endpoint's own messages.
    pub fn enable_rejoin(&mut self, own: u64) {
        self.own = Some(own & self.source_mask);
    }

    /// The source bits of this endpoint's messages, rejoin enabled.
    pub fn own_source(&self) -> Option<u64> {
        self.own
    }

    /// [`Links::own_source`], or an error saying `what` needs rejoin.
    pub fn require_rejoin(&self, what: &str) -> Result<u64, Error> {
        self.own
            .ok_or_else(|| Error::Config(format!("{what} needs enable_rejoin first")))
    }

    /// The engine added peer `peer` (its next index) at `address`.
    pub fn peer_added(&mut self, peer: PeerId, address: &[u8]) {
        assert_eq!(peer, self.peers.len(), "peers are added in index order");
        self.peers.push(PeerLink {
            address: address.to_vec(),
            send_epoch: 0,
            awaiting_ack: false,
        });
    }

    pub fn num_peers(&self) -> usize {
        self.peers.len()
    }

    // --- Sending ------------------------------------------------------------

    /// The wire tag of the next message to `peer` with the caller's `tag`
    /// (at most [`TAG_MASK`]); [`Links::sent`] once it is out.
    pub fn wire_tag(&self, peer: PeerId, tag: u64) -> u64 {
        debug_assert!(tag <= TAG_MASK, "tag {tag:#x} beyond the caller's bits");
        let seq = self.next_seq(peer, tag & self.source_mask);
        wire::wire_tag(self.peers[peer].send_epoch, seq, tag)
    }

    /// The message of [`Links::wire_tag`] is out: it has its place in the
    /// stream (one the library refused has none).
    pub fn sent(&mut self, peer: PeerId, tag: u64) {
        self.advance(peer, tag & self.source_mask);
    }

    fn next_seq(&self, peer: PeerId, source: u64) -> u32 {
        self.send_seq.get(&(peer, source)).copied().unwrap_or(0)
    }

    fn advance(&mut self, peer: PeerId, source: u64) -> u32 {
        debug_assert!(peer < self.peers.len(), "unknown peer {peer}");
        let seq = self.next_seq(peer, source);
        self.send_seq
            .insert((peer, source), seq.wrapping_add(1) & SEQ_MASK);
        seq
    }

    // --- Receiving ----------------------------------------------------------

    /// What a receive that finished with `wire` is; counts a stale one.
    /// A JOIN (and a RELINK) carries no epoch and no sequence number: it is
    /// never stale.
    pub fn arrival(&mut self, wire: u64) -> Arrival {
        let tag = wire & TAG_MASK;
        let source = tag & self.source_mask;
        let seq = wire::seq_of(wire);
        let epoch = wire::epoch_of(wire);
        let control = wire & CTRL_BIT != 0;
        let is_join = control && seq == 0 && epoch == 0;
        if epoch != self.epochs.current(source) && !is_join {
            self.stale_dropped += 1;
            return Arrival::Stale;
        }
        if control {
            Arrival::Control { tag, source, seq }
        } else {
            Arrival::Data { tag, source, seq }
        }
    }

    /// The epoch messages of `source` must carry now.
    pub fn current_epoch(&self, source: u64) -> u8 {
        self.epochs.current(source & self.source_mask)
    }

    /// Message `seq` of `source` finished (`done`: what to hand out for it,
    /// `None` if nothing): appends to `out` it and whatever waited for it,
    /// in order, or holds it back ([`Streams::finished`]).
    pub fn finished(
        &mut self,
        source: u64,
        seq: u32,
        done: Option<Completion>,
        out: &mut Vec<Completion>,
    ) {
        debug_assert_eq!(source & !self.source_mask, 0, "not a source: {source:#x}");
        self.streams.finished(source, seq, done, out);
    }

    /// Completions held back, over every sender (their buffers are still
    /// the engine's).
    pub fn held(&self) -> usize {
        self.streams.held()
    }

    /// Messages of `source` arrived lately and wait for an earlier one
    /// still in transfer: evidence that the sender is alive
    /// ([`Streams::waiting`]).
    pub fn waiting(&self, source: u64) -> bool {
        self.streams.waiting(source & self.source_mask)
    }

    /// Messages of replaced incarnations dropped so far.
    pub fn stale_dropped(&self) -> u64 {
        self.stale_dropped
    }

    /// The sender `source` is gone: returns, in order, what was held back
    /// behind a message of its that will never complete; from now on its
    /// messages are handed out as they come, unordered.
    pub fn forget_source(&mut self, source: u64) -> Vec<Completion> {
        self.streams.forget(source & self.source_mask)
    }

    /// The link to `peer`, whose messages carry `source`, was given up:
    /// the source is forgotten, unless a new incarnation of it joined as
    /// another peer since (its stream is not the old one's).
    pub fn forget_peer(&mut self, peer: PeerId, source: u64) -> Forget {
        let source = source & self.source_mask;
        match self.joined_as.get(&source) {
            Some(&current) if current != peer => Forget::Replaced {
                old_epoch: self.epochs.current(source).wrapping_sub(1),
            },
            _ => Forget::Forgotten {
                held: self.streams.forget(source),
                epoch: self.epochs.current(source),
            },
        }
    }

    // --- The handshakes -----------------------------------------------------

    /// A new link with `source` starts (a join or a relink): a new epoch for
    /// its messages; the old link's stream ends.
    fn restart(&mut self, source: u64) -> Restart {
        let before = self.epochs.current(source);
        let epoch = self.epochs.bump(source);
        debug_assert_ne!(epoch, before, "a new link has a new epoch");
        let recycle = self.streams.restart(source);
        self.stale_dropped += recycle.len() as u64;
        Restart {
            source,
            epoch,
            recycle,
        }
    }

    /// For a restarted endpoint (rejoin enabled): the JOIN asking `peer`,
    /// just added, to take this endpoint (reachable at `local_address`)
    /// back. Send nothing else to the peer before its `PeerJoined`.
    pub fn join_request(&mut self, peer: PeerId, local_address: &[u8]) -> ControlMessage {
        let own = self.own.expect("join_request needs rejoin enabled");
        self.peers[peer].awaiting_ack = true;
        ControlMessage {
            peer,
            wire_tag: CTRL_BIT | own,
            bytes: wire::join_message(own, peer as u32, local_address),
        }
    }

    /// The link to `peer` (whose messages carry `source`) was given up while
    /// both processes may live: the RELINK to make, if this side asks (the
    /// higher source of the two, rejoin enabled, none under way for it).
    pub fn relink_wanted(&self, peer: PeerId, source: u64) -> Option<RelinkDue> {
        let own = self.own?;
        let source = source & self.source_mask;
        if own < source || self.relinks.contains_key(&source) {
            return None;
        }
        let address = self.peers.get(peer)?.address.clone();
        Some(RelinkDue {
            source,
            address,
            attempt: RelinkAttempt::FIRST,
        })
    }

    /// The engine opened a new endpoint for `due`, peer `new_peer`: the
    /// source's stream restarts under a new epoch, and the RELINK carrying
    /// it is returned to send.
    pub fn relink_opened(
        &mut self,
        due: &RelinkDue,
        new_peer: PeerId,
        local_address: &[u8],
    ) -> (Restart, ControlMessage) {
        let own = self.own.expect("relink needs rejoin enabled");
        let source = due.source;
        let restart = self.restart(source);
        self.joined_as.insert(source, new_peer);
        self.peers[new_peer].awaiting_ack = true;
        self.relinks.insert(
            source,
            PendingRelink {
                peer: Some(new_peer),
                address: due.address.clone(),
                retry_at: None,
                attempt: due.attempt,
            },
        );
        let request = ControlMessage {
            peer: new_peer,
            wire_tag: CTRL_BIT | own,
            bytes: wire::relink_message(own, new_peer as u32, restart.epoch, local_address),
        };
        (restart, request)
    }

    /// The RELINK of `due` could not go out (no endpoint opens: a link
    /// down; or the library refused it): the same again after its backoff,
    /// as often as it takes (not counted as a failure).
    pub fn relink_not_sent(&mut self, due: RelinkDue, reason: &dyn Display, now: Instant) {
        if due.attempt.backoff == RELINK_BACKOFF {
            tracing::warn!(
                "evb {}: asking source {:#x} for the link again: {reason} (trying again with backoff)",
                self.engine,
                due.source
            );
        }
        self.relinks.insert(
            due.source,
            PendingRelink {
                peer: None,
                address: due.address,
                retry_at: Some(now + due.attempt.backoff),
                attempt: due.attempt,
            },
        );
    }

    /// RELINKs under way (the engine calls [`Links::relinks_due`] only then).
    pub fn relinks_pending(&self) -> bool {
        !self.relinks.is_empty()
    }

    /// The RELINKs to make again now. `failed`: peers the library reported
    /// failed since the last call: a request that went to one of them
    /// failed and is made again after its backoff, from a new endpoint,
    /// unless it failed [`RELINK_ATTEMPTS`] times (then it is given up).
    pub fn relinks_due(&mut self, failed: &[PeerId], now: Instant) -> Vec<RelinkDue> {
        let mut due = Vec::new();
        for (&source, r) in &mut self.relinks {
            if r.retry_at.is_none() && r.peer.is_some_and(|p| failed.contains(&p)) {
                r.attempt.failures += 1;
                r.retry_at = Some(now + r.attempt.backoff);
            }
            if r.retry_at.is_some_and(|t| t <= now) {
                due.push(source);
            }
        }
        let mut again = Vec::new();
        for source in due {
            let r = self.relinks.remove(&source).expect("listed above");
            if r.attempt.failures >= RELINK_ATTEMPTS {
                tracing::warn!(
                    "evb {}: source {source:#x} did not answer {} requests for the link: given up",
                    self.engine,
                    r.attempt.failures
                );
                continue;
            }
            again.push(RelinkDue {
                source,
                address: r.address,
                attempt: RelinkAttempt {
                    backoff: (r.attempt.backoff * 2).min(RELINK_BACKOFF_MAX),
                    failures: r.attempt.failures,
                },
            });
        }
        again
    }

    /// A JOIN (or, with `reply_epoch`, a RELINK) of `joiner` arrived, and
    /// the engine opened `peer` to the address in it: the joiner's stream
    /// restarts under a new epoch, `PeerJoined` goes to `out`, and the
    /// answer is returned to send.
    pub fn accept_join(
        &mut self,
        joiner: u64,
        their_index: u32,
        peer: PeerId,
        reply_epoch: Option<u8>,
        out: &mut Vec<Completion>,
    ) -> Accepted {
        let own = self.own.expect("accept_join needs rejoin enabled");
        let source = joiner & self.source_mask;
        let restart = self.restart(source);
        let previous = self.joined_as.insert(source, peer);
        // Its request supersedes one of ours (it is the higher: ours would
        // not have been made, unless the sources are misconfigured, or it
        // went to an incarnation that has since restarted).
        let superseded = self.relinks.remove(&source).and(previous);
        // A relinking peer expects its new epoch on everything we send it.
        let reply_epoch = reply_epoch.unwrap_or(0);
        self.peers[peer].send_epoch = reply_epoch;
        out.push(Completion::PeerJoined { peer, source });
        // The answer is the first message of our stream to it.
        let seq = self.advance(peer, own);
        debug_assert_eq!(seq, 0, "the ACK opens our stream to a new peer");
        let answer = ControlMessage {
            peer,
            wire_tag: CTRL_BIT | wire::wire_tag(reply_epoch, seq, own),
            bytes: wire::ack_message(restart.epoch, their_index),
        };
        Accepted {
            restart,
            answer,
            superseded,
        }
    }

    /// An ACK arrived from `source` as message `seq` of its stream, giving
    /// `epoch` for our messages to the peer we know as `index`. Its
    /// `PeerJoined` takes the ACK's place in the stream. False: this
    /// endpoint asked for no such answer (it is dropped).
    pub fn accept_ack(
        &mut self,
        source: u64,
        seq: u32,
        epoch: u8,
        index: PeerId,
        out: &mut Vec<Completion>,
    ) -> bool {
        let source = source & self.source_mask;
        let Some(p) = self.peers.get_mut(index).filter(|p| p.awaiting_ack) else {
            self.streams.finished(source, seq, None, out);
            return false;
        };
        p.awaiting_ack = false;
        p.send_epoch = epoch;
        if self
            .relinks
            .get(&source)
            .is_some_and(|r| r.peer == Some(index))
        {
            self.relinks.remove(&source);
        }
        let joined = Completion::PeerJoined {
            peer: index,
            source,
        };
        self.streams.finished(source, seq, Some(joined), out);
        true
    }

    /// The invariants of the module docs, checked in debug builds after
    /// each change the engine makes through this state machine.
    pub fn debug_check(&self) {
        if cfg!(debug_assertions) {
            for (&source, &peer) in &self.joined_as {
                assert!(
                    peer < self.peers.len(),
                    "source {source:#x} joined as unknown peer {peer}"
                );
            }
            for (&source, r) in &self.relinks {
                if let Some(peer) = r.peer {
                    assert!(
                        self.peers.get(peer).is_some_and(|p| p.awaiting_ack),
                        "the RELINK to source {source:#x} names peer {peer}, which awaits no answer"
                    );
                }
                assert!(
                    r.peer.is_some() || r.retry_at.is_some(),
                    "a RELINK neither sent nor due again"
                );
            }
            for &(peer, _) in self.send_seq.keys() {
                assert!(peer < self.peers.len(), "a stream to unknown peer {peer}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
