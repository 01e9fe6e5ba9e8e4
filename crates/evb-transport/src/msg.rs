//! Message engines (shared memory, libfabric, UCX, MPI) as a [`Transport`].
//!
//! An engine implements the small [`Endpoint`] interface: post receive
//! buffers, send one message made of a head and a body (the body is the
//! RU's MEP buffer, kept alive until the send completes), and report
//! completions. [`MsgTransport`] adds what evb needs on top, the same for
//! every engine: the sender's rank in the tag, the start barrier (a Hello
//! from every linked peer), retries when the engine says "not now", the
//! orderly finish (an empty message with the `BYE` tag bit) and turning
//! sends to a lost peer into completions.
//!
//! Rejoin, for an engine that offers it ([`Endpoint::enable_rejoin`]: shm,
//! ucx, ofi over tcp;ofi_rxm):
//! the engine reports a new incarnation of a peer ([`Completion::PeerJoined`]);
//! the transport reports the old link closed first if it was still up, and
//! the join at the end of a poll (the one after, when it reported a close),
//! so that the runtime has handled the loss; what the new incarnation sends
//! meanwhile is held back and handed over at the next poll. When the
//! runtime drops a peer, the engine is asked to re-establish the link
//! ([`Endpoint::relink`]: shm and ucx do, when the peer's process lives); the
//! new link is reported like a join.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use evb_core::config::Config;
use evb_core::wire::{
    FragmentHeader, FrameHeader, Kind, Message, FRAGMENT_HEADER_LEN, FRAME_HEADER_LEN,
};
use evb_core::{Layout, MepId, NodeId};

use super::{linked_peers, max_message_bytes, LinkEvent, RxHandler, Transport};
use crate::mepbuf::MepBuf;
use crate::process::PeerProcess;

const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Tag bit of the message that says "this peer has finished".
pub const TAG_BYE: u64 = 1 << 15;
/// Ranks fit in 15 bits so that tags stay within MPI's guaranteed range.
pub const TAG_RANK_MASK: u64 = TAG_BYE - 1;

/// What an engine reports.
#[derive(Debug)]
pub enum Completion {
    /// A send finished; its buffers are released.
    Sent { ctx: u64 },
    /// A message arrived in a buffer given to [`Endpoint::post_recv`].
    Received { buf: Vec<u8>, len: usize, tag: u64 },
    /// Like `Received`, and the engine already computed the CRC-32C of
    /// `buf[from..len]` while the bytes were hot in cache (shm does, as it
    /// copies): the fragment check need not read them again.
    ReceivedWithCrc {
        buf: Vec<u8>,
        len: usize,
        tag: u64,
        crc_from: usize,
        crc: u32,
    },
    /// A message whose body was not copied (shm zero copy): `head` holds
    /// its first bytes (the frame and fragment headers), `view` the
    /// payload in the sender's memory. No receive buffer was used.
    ReceivedShared {
        head: Vec<u8>,
        tag: u64,
        view: super::shm::SharedView,
    },
    /// A send failed (peer gone, ...).
    SendFailed { ctx: u64, reason: String },
    /// The engine found the link to a peer (by its index) broken.
    PeerFailed { peer: usize, reason: String },
    /// Endpoint `rank` of the run is reachable at engine index `peer`: a
    /// new incarnation of it (it restarted), or, for a restarted endpoint,
    /// a live peer that took it back. Reported before anything it sends.
    PeerJoined { peer: usize, rank: NodeId },
}

/// The body of a message: a range of a shared buffer.
pub type Body = Option<(Rc<MepBuf>, Range<usize>)>;

/// One process's endpoint of a message engine.
pub trait Endpoint {
    fn name(&self) -> String;
    /// Opaque bytes other endpoints need to reach this one.
    fn local_address(&self) -> Vec<u8>;
    /// Adds a peer by its address; returns its index for `send`.
    fn add_peer(&mut self, address: &[u8]) -> Result<usize>;
    /// Hands over a buffer to receive into (its length is the largest
    /// message accepted); it comes back in a `Received` completion.
    fn post_recv(&mut self, buf: Vec<u8>) -> Result<()>;
    /// Sends `head ++ body` as one message. `Ok(false)`: the engine cannot
    /// take it now (nothing was sent; try again later).
    fn send(&mut self, peer: usize, tag: u64, head: Vec<u8>, body: Body, ctx: u64) -> Result<bool>;
    /// Drives the engine without waiting; appends completions.
    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()>;
    /// Waits until something may have happened, at most `timeout`.
    fn wait(&mut self, timeout: Duration) -> Result<()>;
    /// Every peer has reached this endpoint (the start barrier passed).
    fn setup_done(&mut self) {}
    /// The link to this peer (engine index; `tag`: the tag its messages
    /// carry) was dropped: nothing more will be received from it.
    fn drop_peer(&mut self, _peer: usize, _tag: u64) {}
    /// Messages from this peer wait to be received (if the engine can tell).
    fn peer_active(&self, _peer: usize) -> bool {
        false
    }
    /// The peer's process is on this host and runnable (see
    /// [`super::Transport::peer_runnable`]).
    fn peer_runnable(&self, _peer: usize) -> bool {
        false
    }
    /// `peer_active` for an engine that knows peers by the tag their
    /// messages carry (`tag`: the peer's).
    fn peer_active_tagged(&self, peer: usize, _tag: u64) -> bool {
        self.peer_active(peer)
    }
    /// Before any `add_peer`: take in new incarnations of peers during the
    /// run; `restarted`: this endpoint is one, and `add_peer` asks each
    /// peer to take it back (the link is up at its `PeerJoined`). False
    /// when the engine cannot (the default).
    fn enable_rejoin(&mut self, _restarted: bool) -> bool {
        false
    }
    /// The runtime gave up the link to this peer (after `drop_peer`), whose
    /// process may well be alive (stopped for a while, starved of CPU): an
    /// engine that can re-establishes the link, reported as a
    /// `PeerJoined` (shm does, through the join slots; ucx with a RELINK,
    /// see `evb_msgengine`). `tag`: the tag the peer's messages carry. The
    /// default: it stays down.
    fn relink(&mut self, _peer: usize, _tag: u64) {}
}

/// How long a restarted endpoint waits at most for the live peers to take
/// it back before it starts; later answers are joins during the run.
/// Never more than a quarter of the peer timeout ([`rejoin_wait`]): a peer
/// that took it back expects its heartbeats from then on, and one that
/// never answers (dead, or not reachable) must not keep it silent that
/// long.
const REJOIN_WAIT: Duration = Duration::from_secs(2);

/// [`REJOIN_WAIT`], within a quarter of `peer_timeout_ms`. With 2 s against
/// the 800 ms timeout, a node restarted while another was dead waited for
/// the dead one while the live ones, which had taken it back, lost it by
/// its silence, relinked, and lost it again (`evb chaos -t ofi:tcp` with
/// `kill:1@4+2,kill-consumer:6@4.5+0.8`: back only 4.55 s after the
/// restart).
pub fn rejoin_wait(peer_timeout_ms: u64) -> Duration {
    REJOIN_WAIT.min(Duration::from_millis(peer_timeout_ms / 4))
}

struct Queued {
    peer: NodeId,
    tag: u64,
    head: Vec<u8>,
    body: Body,
    mep: Option<MepId>,
}

pub struct MsgTransport<E: Endpoint> {
    ep: E,
    rank: NodeId,
    run_id: u32,
    endpoints: u16,
    linked: Vec<NodeId>,
    /// The engine's index of each endpoint we are linked to.
    peer_index: Vec<Option<usize>>,
    /// Sends the engine could not take yet, in order, per peer.
    queued: Vec<VecDeque<Queued>>,
    queued_total: usize,
    /// Sends handed to the engine: their peer and MEP (for fragments).
    in_flight: HashMap<u64, (NodeId, Option<MepId>)>,
    next_ctx: u64,
    /// Each peer's process as its (latest) Hello named it: `None` until
    /// the peer said Hello.
    hello_from: Vec<Option<PeerProcess>>,
    bye_from: Vec<bool>,
    dropped: Vec<bool>,
    finished: bool,
    max_message: usize,
    max_body: u64,
    completions: Vec<Completion>,
    recv_buffers: usize,
    /// [`rejoin_wait`] of the run's peer timeout.
    rejoin_wait: Duration,
    /// Rejoin is enabled: a lost peer's link can come back.
    rejoin: bool,
    /// This process is a restarted endpoint (rejoin enabled).
    restarted: bool,
    /// Per endpoint: a restarted endpoint asked it to take it back and has
    /// no answer yet (no link).
    pending_link: Vec<bool>,
    /// Joins the engine reported, applied at the end of this poll, and
    /// those whose old link was reported closed in it, at the next one.
    joins: Vec<(usize, NodeId)>,
    joins_next: Vec<(usize, NodeId)>,
    /// Per endpoint: a join is under way; what it sends waits in `held`.
    joining: Vec<bool>,
    held: Vec<Completion>,
    /// What peers that had said Hello did while this endpoint was still
    /// setting up (a short run they finished first): the runtime's, handed
    /// over at the first poll.
    early_events: Vec<LinkEvent>,
}

impl<E: Endpoint> MsgTransport<E> {
    pub fn new(ep: E, config: &Config, layout: &Layout, rank: NodeId) -> Result<Self> {
        if layout.endpoints as u64 > TAG_RANK_MASK {
            bail!("message transports carry at most {TAG_RANK_MASK} endpoints");
        }
        let n = layout.endpoints as usize;
        let linked = linked_peers(config, layout, rank);
        Ok(MsgTransport {
            ep,
            rank,
            run_id: config.run.run_id,
            endpoints: layout.endpoints,
            recv_buffers: posted_receives(linked.len()),
            rejoin_wait: rejoin_wait(config.transport.peer_timeout_ms),
            linked,
            peer_index: vec![None; n],
            queued: (0..n).map(|_| VecDeque::new()).collect(),
            queued_total: 0,
            in_flight: HashMap::new(),
            next_ctx: 1,
            hello_from: vec![None; n],
            bye_from: vec![false; n],
            dropped: vec![false; n],
            finished: false,
            max_message: max_message_bytes(config),
            max_body: super::max_body_bytes(config),
            completions: Vec::new(),
            rejoin: false,
            restarted: false,
            pending_link: vec![false; n],
            joins: Vec::new(),
            joins_next: Vec::new(),
            joining: vec![false; n],
            held: Vec::new(),
            early_events: Vec::new(),
        })
    }

    pub fn endpoint(&self) -> &E {
        &self.ep
    }

    fn tag(&self) -> u64 {
        u64::from(self.rank)
    }

    fn queue(&mut self, q: Queued) -> bool {
        let p = q.peer as usize;
        if self.peer_index.get(p).copied().flatten().is_none() || self.dropped[p] {
            return false;
        }
        if self.bye_from[p] && q.mep.is_some() {
            // Data for a peer that finished: never taken (its control
            // messages and our goodbye still go: it lingers for them).
            return false;
        }
        self.queued[p].push_back(q);
        self.queued_total += 1;
        true
    }

    /// Hands queued sends to the engine, in order per peer, until it says
    /// "not now" for a peer.
    fn push_queued(&mut self, events: &mut Vec<LinkEvent>) {
        if self.queued_total == 0 {
            return;
        }
        for p in 0..self.queued.len() {
            while let Some(q) = self.queued[p].pop_front() {
                let Some(index) = self.peer_index[p] else {
                    break;
                };
                let ctx = self.next_ctx;
                // The engine drops the buffers when it cannot take them, so
                // keep a second handle to requeue them.
                let retry_head = q.head.clone();
                let retry_body = q.body.clone();
                match self.ep.send(index, q.tag, q.head, q.body, ctx) {
                    Ok(true) => {
                        self.next_ctx += 1;
                        self.queued_total -= 1;
                        self.in_flight.insert(ctx, (q.peer, q.mep));
                    }
                    Ok(false) => {
                        self.queued[p].push_front(Queued {
                            head: retry_head,
                            body: retry_body,
                            ..q
                        });
                        break;
                    }
                    Err(e) => {
                        self.queued_total -= 1;
                        if let Some(mep) = q.mep {
                            events.push(LinkEvent::SendDone(mep));
                        }
                        self.fail_peer(q.peer, format!("{e:#}"), events);
                        break;
                    }
                }
            }
        }
    }

    /// `peer` said it finished the run: it builds and consumes nothing more,
    /// and soon its process is gone. The fragments and batches queued or in
    /// flight to it are done (`SendDone`), never to complete (the rest, our
    /// goodbye first, still goes: it lingers for it): an engine says "try
    /// again" to a gone peer's address for ever (tcp;ofi_rxm), or never
    /// completes a send to it, and an RU waiting for those ended its drain
    /// holding them, its process killed by the launcher (`evb chaos -t
    /// ofi:tcp --seed 7`: RUs far behind under load still had fragments for
    /// BU 2 when BU 2 had finished its batches and left).
    fn abandon_sends(&mut self, peer: NodeId, events: &mut Vec<LinkEvent>) {
        let p = peer as usize;
        let (data, rest): (VecDeque<Queued>, VecDeque<Queued>) =
            self.queued[p].drain(..).partition(|q| q.mep.is_some());
        self.queued[p] = rest;
        for q in data {
            self.queued_total -= 1;
            if let Some(mep) = q.mep {
                events.push(LinkEvent::SendDone(mep));
            }
        }
        let gone: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, (to, mep))| *to == peer && mep.is_some())
            .map(|(&ctx, _)| ctx)
            .collect();
        for ctx in gone {
            if let Some((_, Some(mep))) = self.in_flight.remove(&ctx) {
                events.push(LinkEvent::SendDone(mep));
            }
        }
    }

    /// The link to `peer` failed: forget its sends, tell the runtime.
    fn fail_peer(&mut self, peer: NodeId, reason: String, events: &mut Vec<LinkEvent>) {
        if self.dropped[peer as usize] {
            return;
        }
        self.drop_peer(peer, events);
        events.push(LinkEvent::Closed {
            peer,
            error: Some(reason),
        });
    }

    fn handle_completions(&mut self, handler: &mut dyn RxHandler, events: &mut Vec<LinkEvent>) {
        let completions = std::mem::take(&mut self.completions);
        for c in completions {
            // What a joining peer sends waits until the runtime knows of
            // the join (its failure too, to keep the order).
            let from = match &c {
                Completion::Received { tag, .. }
                | Completion::ReceivedWithCrc { tag, .. }
                | Completion::ReceivedShared { tag, .. } => Some((tag & TAG_RANK_MASK) as usize),
                Completion::PeerFailed { peer, .. } => self
                    .joins
                    .iter()
                    .chain(&self.joins_next)
                    .find(|(i, _)| i == peer)
                    .map(|&(_, rank)| rank as usize),
                _ => None,
            };
            if from.is_some_and(|r| self.joining.get(r).copied().unwrap_or(false)) {
                self.held.push(c);
                continue;
            }
            match c {
                Completion::PeerJoined { peer, rank } => {
                    if (rank as usize) < self.joining.len() && rank != self.rank {
                        self.joining[rank as usize] = true;
                        self.joins.push((peer, rank));
                    }
                }
                Completion::Sent { ctx } => {
                    if let Some((_, Some(mep))) = self.in_flight.remove(&ctx) {
                        events.push(LinkEvent::SendDone(mep));
                    }
                }
                Completion::SendFailed { ctx, reason } => {
                    if let Some((peer, mep)) = self.in_flight.remove(&ctx) {
                        if let Some(mep) = mep {
                            events.push(LinkEvent::SendDone(mep));
                        }
                        if !self.finished && !self.bye_from[peer as usize] {
                            self.fail_peer(peer, reason, events);
                        }
                    }
                }
                Completion::PeerFailed { peer, reason } => {
                    let rank = self.peer_index.iter().position(|&i| i == Some(peer));
                    if let Some(rank) = rank {
                        let rank = rank as NodeId;
                        if !self.finished && !self.bye_from[rank as usize] {
                            self.fail_peer(rank, reason, events);
                        }
                    }
                }
                Completion::Received { buf, len, tag } => {
                    let keep = self.on_message(buf, len, tag, None, handler, events);
                    let buf = keep.unwrap_or_else(|| handler.spare_buffer(self.max_message));
                    if let Err(e) = self.ep.post_recv(buf) {
                        tracing::warn!("evb node {}: posting a receive buffer: {e:#}", self.rank);
                    }
                }
                Completion::ReceivedShared { head, tag, view } => {
                    self.on_shared(head, tag, view, handler, events);
                }
                Completion::ReceivedWithCrc {
                    buf,
                    len,
                    tag,
                    crc_from,
                    crc,
                } => {
                    let known = Some((crc_from, crc));
                    let keep = self.on_message(buf, len, tag, known, handler, events);
                    let buf = keep.unwrap_or_else(|| handler.spare_buffer(self.max_message));
                    if let Err(e) = self.ep.post_recv(buf) {
                        tracing::warn!("evb node {}: posting a receive buffer: {e:#}", self.rank);
                    }
                }
            }
        }
    }

    /// Handles one received message; returns the buffer if it can be
    /// posted again (the payload was not kept).
    fn on_message(
        &mut self,
        buf: Vec<u8>,
        len: usize,
        tag: u64,
        known_crc: Option<(usize, u32)>,
        handler: &mut dyn RxHandler,
        events: &mut Vec<LinkEvent>,
    ) -> Option<Vec<u8>> {
        let peer = (tag & TAG_RANK_MASK) as NodeId;
        if peer >= self.endpoints || self.dropped[peer as usize] {
            return Some(buf);
        }
        handler.on_alive(peer);
        if tag & TAG_BYE != 0 {
            if !self.bye_from[peer as usize] {
                self.bye_from[peer as usize] = true;
                events.push(LinkEvent::Finished { peer });
                self.abandon_sends(peer, events);
            }
            return Some(buf);
        }
        match self.decode(&buf[..len.min(buf.len())]) {
            Ok(Message::Fragment(header)) => {
                if handler.admit(peer, &header) {
                    let at = FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN;
                    let end = at + header.payload_len as usize;
                    let crc = match known_crc {
                        Some((from, crc)) if from == at && end == len => Some(crc),
                        _ if handler.wants_crc(&header) => {
                            Some(evb_core::checksum::crc32c(&buf[at..end]))
                        }
                        _ => None,
                    };
                    handler.on_fragment(peer, header, crc, buf, at);
                    return None;
                }
            }
            Ok(Message::Hello { host, pid, .. }) => {
                self.hello_from[peer as usize] = Some(PeerProcess { host, pid });
            }
            // Goodbye is the byte streams' word; engines send TAG_BYE.
            Ok(Message::Heartbeat | Message::Goodbye) => {}
            Ok(msg) => handler.on_control(peer, msg),
            Err(e) => {
                // A peer that speaks garbage is not one of ours any more.
                self.fail_peer(peer, format!("protocol error: {e:#}"), events);
            }
        }
        Some(buf)
    }

    /// A fragment read in place (shm zero copy): `head` is its frame and
    /// fragment headers, `view` its payload. Dropping the view (not
    /// admitted, or when the batch is done with it) releases the sender's
    /// buffer.
    fn on_shared(
        &mut self,
        head: Vec<u8>,
        tag: u64,
        view: super::shm::SharedView,
        handler: &mut dyn RxHandler,
        events: &mut Vec<LinkEvent>,
    ) {
        let peer = (tag & TAG_RANK_MASK) as NodeId;
        if peer >= self.endpoints || self.dropped[peer as usize] || tag & TAG_BYE != 0 {
            return;
        }
        handler.on_alive(peer);
        let header = self.decode_shared_head(&head, view.len());
        match header {
            Ok(header) => {
                if handler.admit(peer, &header) {
                    handler.on_shared_fragment(peer, header, view);
                }
            }
            Err(e) => self.fail_peer(peer, format!("protocol error: {e:#}"), events),
        }
    }

    /// The fragment header of a message whose payload (`payload_len`
    /// bytes) came apart from its head.
    fn decode_shared_head(&self, head: &[u8], payload_len: usize) -> Result<FragmentHeader> {
        let frame: &[u8; FRAME_HEADER_LEN] = head
            .get(..FRAME_HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| anyhow!("a shared fragment's head of {} bytes", head.len()))?;
        let frame = FrameHeader::decode(frame, self.max_body)?;
        let body = &head[FRAME_HEADER_LEN..];
        if frame.kind != Kind::Fragment || body.len() != FRAGMENT_HEADER_LEN {
            bail!("a shared payload must follow a fragment header");
        }
        let Message::Fragment(h) = Message::decode_body(&frame, body)? else {
            bail!("a shared payload must follow a fragment header");
        };
        if frame.body_len as usize != FRAGMENT_HEADER_LEN + payload_len
            || h.payload_len as usize != payload_len
        {
            bail!(
                "fragment payload_len {} does not match its shared payload of {payload_len} bytes",
                h.payload_len
            );
        }
        Ok(h)
    }

    fn decode(&self, msg: &[u8]) -> Result<Message> {
        let head: &[u8; FRAME_HEADER_LEN] = msg
            .get(..FRAME_HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| anyhow!("message of {} bytes is too short", msg.len()))?;
        let frame = FrameHeader::decode(head, self.max_body)?;
        let body = &msg[FRAME_HEADER_LEN..];
        if body.len() != frame.body_len as usize {
            bail!(
                "{} frame says {} body bytes, the message has {}",
                frame.kind.name(),
                frame.body_len,
                body.len()
            );
        }
        let msg = Message::decode_body(&frame, body)?;
        if let Message::Fragment(h) = &msg {
            if FRAGMENT_HEADER_LEN + h.payload_len as usize != body.len() {
                bail!(
                    "fragment payload_len {} does not match its frame",
                    h.payload_len
                );
            }
        }
        if frame.kind == Kind::Hello {
            super::tcp::check_hello(&msg, self.run_id, self.endpoints)?;
        }
        Ok(msg)
    }

    /// At the end of a poll: the joins reported during it. A peer whose
    /// old link is still up is reported closed now and joined at the end
    /// of the next poll, once the runtime has handled the loss.
    fn apply_joins(&mut self, events: &mut Vec<LinkEvent>) {
        for (index, rank) in std::mem::take(&mut self.joins_next) {
            self.join(index, rank, events);
        }
        for (index, rank) in std::mem::take(&mut self.joins) {
            let p = rank as usize;
            let live = self.peer_index[p].is_some() && !self.dropped[p] && !self.pending_link[p];
            if live {
                self.drop_peer(rank, events);
                events.push(LinkEvent::Closed {
                    peer: rank,
                    error: Some(
                        "replaced by a new link from the endpoint (it restarted, or lost this one)"
                            .into(),
                    ),
                });
                self.joins_next.push((index, rank));
            } else {
                self.join(index, rank, events);
            }
        }
    }

    fn join(&mut self, index: usize, rank: NodeId, events: &mut Vec<LinkEvent>) {
        let p = rank as usize;
        self.joining[p] = false;
        self.pending_link[p] = false;
        if self.finished {
            // The run is over for us: it stays dropped (what it sent too).
            self.dropped[p] = true;
            return;
        }
        self.peer_index[p] = Some(index);
        self.dropped[p] = false;
        self.bye_from[p] = false;
        events.push(LinkEvent::Joined { peer: rank });
    }

    /// At the start of a poll: what joined peers sent before the runtime
    /// knew of their join.
    fn release_held(&mut self, handler: &mut dyn RxHandler, events: &mut Vec<LinkEvent>) {
        if self.held.is_empty() {
            return;
        }
        let mut held = std::mem::take(&mut self.held);
        held.append(&mut self.completions);
        self.completions = held;
        self.handle_completions(handler, events);
    }

    /// A restarted endpoint's setup: ask every peer to take it back (the
    /// live ones answer at once) and wait a while for their answers. Peers
    /// without a link at the end are the runtime's to declare lost.
    fn connect_restarted(&mut self, peers: &[String], handler: &mut dyn RxHandler) -> Result<()> {
        for &p in &self.linked.clone() {
            let addr = if p == self.rank {
                // Our address in the list is the old incarnation's.
                self.ep.local_address()
            } else {
                from_hex(&peers[p as usize]).with_context(|| format!("address of endpoint {p}"))?
            };
            match self.ep.add_peer(&addr) {
                Ok(index) => {
                    self.peer_index[p as usize] = Some(index);
                    self.pending_link[p as usize] = p != self.rank;
                }
                Err(e) => {
                    tracing::warn!("evb node {}: endpoint {p} is not there: {e:#}", self.rank)
                }
            }
        }
        for _ in 0..self.recv_buffers {
            let buf = handler.spare_buffer(self.max_message);
            self.ep.post_recv(buf)?;
        }
        let deadline = Instant::now() + self.rejoin_wait;
        let mut events = Vec::new();
        loop {
            let waiting: Vec<NodeId> = (0..self.endpoints)
                .filter(|&p| self.pending_link[p as usize] && !self.dropped[p as usize])
                .collect();
            if waiting.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!(
                    "evb node {}: endpoints {waiting:?} did not take it back at the rejoin",
                    self.rank
                );
                break;
            }
            self.poll(Duration::from_millis(20), handler, &mut events)?;
            events.clear();
        }
        self.ep.setup_done();
        Ok(())
    }

    fn pump(&mut self, handler: &mut dyn RxHandler, events: &mut Vec<LinkEvent>) -> Result<bool> {
        self.push_queued(events);
        self.ep.progress(&mut self.completions)?;
        let any = !self.completions.is_empty();
        self.handle_completions(handler, events);
        self.push_queued(events);
        Ok(any)
    }
}

/// Receive buffers a message transport keeps posted (each of
/// [`max_message_bytes`]) with links to `linked` peers: enough to keep
/// every peer busy, bounded in memory.
pub fn posted_receives(linked: usize) -> usize {
    (2 * linked + 4).min(64)
}

/// A receive buffer an engine gave back shortened to the message, at its
/// full length `max` again. Every buffer handed to an engine comes from
/// `vec![0; max]` (see `RxHandler::spare_buffer`) and engines only write
/// bytes, so the bytes past the received length are initialised.
/// What a message engine's completion asks of its adapter beyond the
/// runtime's completions: a receive buffer to post again.
#[cfg(any(feature = "ofi", feature = "ucx"))]
pub(crate) enum EngineFailure {
    /// A message could not be received into `buf` (a peer died mid-message,
    /// or a message too large): the buffer goes back to the engine.
    Receive { buf: Vec<u8>, reason: String },
    /// The library reported an error tied to no operation of ours.
    Unattributed { reason: String },
}

/// The completions evb-ucx and evb-ofi share ([`evb_msgengine::Completion`])
/// as the runtime's; the failures that need the engine are returned, for
/// the adapter's own policy.
#[cfg(any(feature = "ofi", feature = "ucx"))]
pub(crate) fn engine_completion(
    c: evb_msgengine::Completion,
    max_message: usize,
    out: &mut Vec<Completion>,
) -> Option<EngineFailure> {
    use evb_msgengine::Completion as E;
    match c {
        E::Sent { ctx } => out.push(Completion::Sent { ctx }),
        E::SendFailed { ctx, reason } => out.push(Completion::SendFailed { ctx, reason }),
        E::Received { buf, len, tag } => out.push(Completion::Received {
            buf: full_length(buf, max_message),
            len,
            tag,
        }),
        E::PeerFailed { peer, reason } => out.push(Completion::PeerFailed { peer, reason }),
        E::PeerJoined { peer, source } => out.push(Completion::PeerJoined {
            peer,
            rank: source as NodeId,
        }),
        E::ReceiveFailed { buf, reason, .. } => {
            return Some(EngineFailure::Receive {
                buf: full_length(buf, max_message),
                reason,
            })
        }
        E::Unattributed { reason } => return Some(EngineFailure::Unattributed { reason }),
    }
    None
}

pub fn full_length(mut buf: Vec<u8>, max: usize) -> Vec<u8> {
    if buf.capacity() >= max && buf.len() < max {
        // SAFETY: initialised u8s within the capacity, as explained above.
        unsafe { buf.set_len(max) };
    } else if buf.len() < max {
        buf.resize(max, 0);
    }
    buf
}

/// Hex for the `LISTEN` token of an engine address.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(token: &str) -> Result<Vec<u8>> {
    if !token.len().is_multiple_of(2) || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("`{token}` is not an endpoint address (hex digits)");
    }
    (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).map_err(Into::into))
        .collect()
}

impl<E: Endpoint> Transport for MsgTransport<E> {
    fn name(&self) -> String {
        self.ep.name()
    }

    fn local_token(&self) -> String {
        to_hex(&self.ep.local_address())
    }

    fn connect(&mut self, peers: &[String], handler: &mut dyn RxHandler) -> Result<()> {
        if peers.len() != self.endpoints as usize {
            bail!("{} addresses for {} endpoints", peers.len(), self.endpoints);
        }
        if self.restarted {
            return self.connect_restarted(peers, handler);
        }
        for &p in &self.linked.clone() {
            let addr =
                from_hex(&peers[p as usize]).with_context(|| format!("address of endpoint {p}"))?;
            let index = self
                .ep
                .add_peer(&addr)
                .with_context(|| format!("reaching endpoint {p}"))?;
            self.peer_index[p as usize] = Some(index);
        }
        // After the peers: an engine may post receives per peer.
        for _ in 0..self.recv_buffers {
            let buf = handler.spare_buffer(self.max_message);
            self.ep.post_recv(buf)?;
        }
        let ours = PeerProcess::ours();
        let hello = Message::Hello {
            run_id: self.run_id,
            node: self.rank,
            nodes: self.endpoints,
            host: ours.host,
            pid: ours.pid,
        };
        for &p in &self.linked.clone() {
            if p != self.rank {
                self.send_control(p, &hello);
            }
        }
        let deadline = Instant::now() + SETUP_TIMEOUT;
        let mut events = Vec::new();
        loop {
            let missing: Vec<NodeId> = self
                .linked
                .iter()
                .copied()
                .filter(|&p| p != self.rank && self.hello_from[p as usize].is_none())
                .collect();
            if missing.is_empty() {
                self.ep.setup_done();
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("endpoints {missing:?} did not say Hello within {SETUP_TIMEOUT:?}");
            }
            self.poll(Duration::from_millis(20), handler, &mut events)?;
            for e in events.drain(..) {
                match e {
                    // A peer that said Hello is set up with us: if it has
                    // already finished (a run short enough for it to end
                    // while this endpoint was still starting), that is the
                    // runtime's to see, not a failed setup.
                    LinkEvent::Closed { peer, .. } | LinkEvent::Finished { peer }
                        if self.hello_from[peer as usize].is_some() =>
                    {
                        self.early_events.push(e);
                    }
                    LinkEvent::Closed { peer, error } => bail!(
                        "endpoint {peer} failed during setup: {}",
                        error.as_deref().unwrap_or("it finished")
                    ),
                    LinkEvent::Finished { peer } => {
                        bail!("endpoint {peer} failed during setup: it finished")
                    }
                    _ => {}
                }
            }
        }
    }

    fn send_control(&mut self, to: NodeId, msg: &Message) -> bool {
        let mut head = Vec::with_capacity(48);
        msg.encode_into(&mut head);
        let tag = self.tag();
        self.queue(Queued {
            peer: to,
            tag,
            head,
            body: None,
            mep: None,
        })
    }

    fn send_fragment(&mut self, to: NodeId, header: &FragmentHeader, data: Rc<MepBuf>) -> bool {
        let mut head = Vec::with_capacity(FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN);
        head.extend_from_slice(&header.frame_header().encode());
        head.extend_from_slice(&header.encode());
        let tag = self.tag();
        let len = header.payload_len as usize;
        self.queue(Queued {
            peer: to,
            tag,
            head,
            body: Some((data, 0..len)),
            mep: Some(header.mep),
        })
    }

    fn has_pending_tx(&self, to: Option<NodeId>) -> bool {
        match to {
            Some(p) => !self.queued[p as usize].is_empty(),
            // What waits for a peer that said goodbye (our goodbye to it,
            // a control message) does not hold this node's own goodbye:
            // the peer may be gone, its engine saying "try again" for ever.
            None => {
                self.queued_total > 0
                    && self
                        .queued
                        .iter()
                        .zip(&self.bye_from)
                        .any(|(q, &bye)| !bye && !q.is_empty())
            }
        }
    }

    fn poll(
        &mut self,
        timeout: Duration,
        handler: &mut dyn RxHandler,
        events: &mut Vec<LinkEvent>,
    ) -> Result<()> {
        events.append(&mut self.early_events);
        self.release_held(handler, events);
        if !self.pump(handler, events)? && !timeout.is_zero() && self.joins_next.is_empty() {
            self.ep.wait(timeout)?;
            self.pump(handler, events)?;
        }
        self.apply_joins(events);
        Ok(())
    }

    fn flush(&mut self, events: &mut Vec<LinkEvent>) {
        self.push_queued(events);
    }

    fn drop_peer(&mut self, peer: NodeId, events: &mut Vec<LinkEvent>) {
        let p = peer as usize;
        if self.dropped[p] {
            return;
        }
        self.dropped[p] = true;
        if let Some(index) = self.peer_index[p] {
            self.ep.drop_peer(index, u64::from(peer));
        }
        for q in self.queued[p].drain(..) {
            self.queued_total -= 1;
            if let Some(mep) = q.mep {
                events.push(LinkEvent::SendDone(mep));
            }
        }
        // Whatever the engine still holds for it may never complete.
        let stuck: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, (to, _))| *to == peer)
            .map(|(&ctx, _)| ctx)
            .collect();
        for ctx in stuck {
            if let Some((_, Some(mep))) = self.in_flight.remove(&ctx) {
                events.push(LinkEvent::SendDone(mep));
            }
        }
        // The link may come back (unless this is the old link of a join
        // under way, or the run is over for us).
        if !self.joining[p] && !self.finished {
            if let Some(index) = self.peer_index[p] {
                self.ep.relink(index, u64::from(peer));
            }
        }
    }

    fn peer_active(&self, peer: NodeId) -> bool {
        self.peer_index[peer as usize]
            .is_some_and(|i| self.ep.peer_active_tagged(i, u64::from(peer)))
    }

    /// The engine may know the peer's process (shared memory); any other
    /// knows it from the peer's Hello, and uses it only when a lost link
    /// stays lost. With rejoin, a link the peer gave up (it found us
    /// silent: we were stopped) comes back when the higher rank of the two
    /// declares the other lost in turn and asks to relink (ucx, ofi): a
    /// grace for a peer that runs, busy with others and silent towards us
    /// because it dropped us, would hold that relink back by 3 timeouts.
    fn peer_runnable(&self, peer: NodeId) -> bool {
        self.peer_index[peer as usize].is_some_and(|i| self.ep.peer_runnable(i))
            || (!self.rejoin && self.hello_from[peer as usize].is_some_and(|p| p.runnable()))
    }

    fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let tag = self.tag() | TAG_BYE;
        for &p in &self.linked.clone() {
            if p != self.rank {
                self.queue(Queued {
                    peer: p,
                    tag,
                    head: Vec::new(),
                    body: None,
                    mep: None,
                });
            }
        }
    }

    fn enable_rejoin(&mut self, restarted: bool) -> bool {
        let enabled = self.ep.enable_rejoin(restarted);
        self.rejoin = enabled;
        self.restarted = enabled && restarted;
        enabled
    }

    fn has_link(&self, peer: NodeId) -> bool {
        let p = peer as usize;
        self.peer_index[p].is_some() && !self.dropped[p] && !self.pending_link[p]
    }

    fn all_finished(&self) -> bool {
        self.queued_total == 0
            && self.in_flight.is_empty()
            && self
                .linked
                .iter()
                .all(|&p| p == self.rank || self.bye_from[p as usize] || self.dropped[p as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rx::Seen;

    /// An engine that hands out scripted completions.
    #[derive(Default)]
    struct Scripted {
        next: VecDeque<Vec<Completion>>,
        relinks: Vec<usize>,
        /// Offers rejoin.
        rejoins: bool,
        /// Says "try again" to every send.
        refuse: bool,
    }

    impl Endpoint for Scripted {
        fn name(&self) -> String {
            "scripted".into()
        }
        fn local_address(&self) -> Vec<u8> {
            Vec::new()
        }
        fn add_peer(&mut self, _address: &[u8]) -> Result<usize> {
            Ok(0)
        }
        fn post_recv(&mut self, _buf: Vec<u8>) -> Result<()> {
            Ok(())
        }
        fn send(&mut self, _: usize, _: u64, _: Vec<u8>, _: Body, _: u64) -> Result<bool> {
            Ok(!self.refuse)
        }
        fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
            out.extend(self.next.pop_front().unwrap_or_default());
            Ok(())
        }
        fn wait(&mut self, _timeout: Duration) -> Result<()> {
            Ok(())
        }
        fn relink(&mut self, peer: usize, _tag: u64) {
            self.relinks.push(peer);
        }
        fn enable_rejoin(&mut self, _restarted: bool) -> bool {
            self.rejoins
        }
    }

    fn heartbeat_from(rank: u64) -> Completion {
        let mut buf = Vec::new();
        Message::Heartbeat.encode_into(&mut buf);
        let len = buf.len();
        Completion::Received {
            buf,
            len,
            tag: rank,
        }
    }

    /// Node 0 of 2 with a link to node 1, whose new incarnation's join and
    /// first heartbeat are the next completions.
    fn rejoining_peer() -> MsgTransport<Scripted> {
        let config = Config::load(None, &["nodes.count=2".into()]).unwrap();
        let layout = Layout::from_config(&config);
        let mut ep = Scripted::default();
        ep.next.push_back(vec![
            Completion::PeerJoined { peer: 0, rank: 1 },
            heartbeat_from(1),
        ]);
        let mut t = MsgTransport::new(ep, &config, &layout, 0).unwrap();
        t.peer_index[1] = Some(0);
        t
    }

    #[test]
    fn a_restarted_endpoint_waits_for_answers_less_than_a_quarter_peer_timeout() {
        assert_eq!(rejoin_wait(800), Duration::from_millis(200));
        assert_eq!(rejoin_wait(60_000), REJOIN_WAIT);
    }

    /// A peer that said it finished takes nothing more: what was in flight
    /// or queued to it is done at its goodbye (the engine would never
    /// complete it), and later sends to it are refused at once.
    #[test]
    fn sends_to_a_peer_that_finished_are_done_at_its_goodbye() {
        let config = Config::load(None, &["nodes.count=2".into()]).unwrap();
        let layout = Layout::from_config(&config);
        let mut t = MsgTransport::new(Scripted::default(), &config, &layout, 0).unwrap();
        t.peer_index[1] = Some(0);
        let header = |mep| FragmentHeader {
            run_id: config.run.run_id,
            source: 0,
            flags: 0,
            mep,
            event_count: 1,
            payload_len: 8,
            crc32c: 0,
        };
        let data = || Rc::new(MepBuf::from_vec(vec![0; 8]));
        let (mut seen, mut events) = (Seen::default(), Vec::new());
        // One taken by the engine (in flight), one it says "try again" to.
        assert!(t.send_fragment(1, &header(7), data()));
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        t.ep.refuse = true;
        assert!(t.send_fragment(1, &header(8), data()));
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert!(events.is_empty(), "{events:?}");
        assert!(t.has_pending_tx(Some(1)));
        let bye = Completion::Received {
            buf: Vec::new(),
            len: 0,
            tag: 1 | TAG_BYE,
        };
        t.ep.next.push_back(vec![bye]);
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert!(
            events.contains(&LinkEvent::Finished { peer: 1 }),
            "{events:?}"
        );
        assert!(events.contains(&LinkEvent::SendDone(7)), "{events:?}");
        assert!(events.contains(&LinkEvent::SendDone(8)), "{events:?}");
        assert!(!t.has_pending_tx(Some(1)));
        assert!(!t.send_fragment(1, &header(9), data()));
        // A control message still goes (it lingers for our goodbye), but
        // waiting for it does not hold this node's finish.
        assert!(t.send_control(1, &Message::Heartbeat));
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert!(t.has_pending_tx(Some(1)));
        assert!(!t.has_pending_tx(None));
    }

    /// A new incarnation of a peer whose link is still up: the old link is
    /// reported closed at the end of one poll, the join at the end of the
    /// next, and what the new one sent is handed over only after that.
    #[test]
    fn a_join_over_a_live_link_is_a_close_then_a_join() {
        let mut t = rejoining_peer();
        let mut seen = Seen::default();
        let mut events = Vec::new();
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert!(
            matches!(
                &events[..],
                [LinkEvent::Closed {
                    peer: 1,
                    error: Some(_)
                }]
            ),
            "{events:?}"
        );
        assert!(seen.alive.is_empty(), "handed over before the join");
        // The runtime declares it lost.
        events.clear();
        t.drop_peer(1, &mut events);
        assert!(!t.has_link(1));
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert_eq!(events, vec![LinkEvent::Joined { peer: 1 }]);
        assert!(seen.alive.is_empty(), "handed over before the runtime knew");
        assert!(t.has_link(1));
        events.clear();
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert_eq!(seen.alive, vec![1]);
        assert!(events.is_empty(), "{events:?}");
        // The old link dropped for the join is not one to re-establish.
        assert!(t.endpoint().relinks.is_empty());
    }

    /// A peer that said Hello and finished before this endpoint's setup
    /// looked (a short run, this endpoint slow to start): the setup
    /// succeeds and the runtime learns of the finish at its first poll; a
    /// peer that finished without a Hello is still a failed setup.
    #[test]
    fn a_peer_finished_after_its_hello_does_not_fail_the_setup() {
        let config = Config::load(None, &["nodes.count=2".into()]).unwrap();
        let layout = Layout::from_config(&config);
        let mut hello = Vec::new();
        Message::Hello {
            run_id: config.run.run_id,
            node: 1,
            nodes: layout.endpoints,
            host: 0,
            pid: 0,
        }
        .encode_into(&mut hello);
        let len = hello.len();
        let said_hello = Completion::Received {
            buf: hello,
            len,
            tag: 1,
        };
        let bye = || Completion::Received {
            buf: vec![0; 8],
            len: 0,
            tag: 1 | TAG_BYE,
        };
        let peers = vec![String::new(); layout.endpoints as usize];
        let mut seen = Seen::default();

        let mut ep = Scripted::default();
        ep.next.push_back(vec![said_hello, bye()]);
        let mut t = MsgTransport::new(ep, &config, &layout, 0).unwrap();
        t.connect(&peers, &mut seen).unwrap();
        let mut events = Vec::new();
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert_eq!(events, vec![LinkEvent::Finished { peer: 1 }]);

        let mut ep = Scripted::default();
        ep.next.push_back(vec![bye()]);
        let mut t = MsgTransport::new(ep, &config, &layout, 0).unwrap();
        let e = t.connect(&peers, &mut seen).unwrap_err().to_string();
        assert!(e.contains("endpoint 1 failed during setup"), "{e}");
    }

    /// A peer's Hello names its process: one on this host that runs is
    /// runnable (a silent peer starved, not hung), whatever the engine; a
    /// process named from another host is not ours to judge; with rejoin
    /// the engine's relink, not a grace, takes care of a live peer.
    #[test]
    fn a_peer_on_this_host_is_runnable_from_its_hello() {
        let config = Config::load(None, &["nodes.count=2".into()]).unwrap();
        let layout = Layout::from_config(&config);
        let peers = vec![String::new(); layout.endpoints as usize];
        let ours = PeerProcess::ours();
        for (host, rejoins, runnable) in [
            (ours.host, false, true),
            (ours.host ^ 1, false, false),
            (0, false, false),
            (ours.host, true, false),
        ] {
            let mut hello = Vec::new();
            Message::Hello {
                run_id: config.run.run_id,
                node: 1,
                nodes: layout.endpoints,
                host,
                pid: ours.pid,
            }
            .encode_into(&mut hello);
            let len = hello.len();
            let mut ep = Scripted {
                rejoins,
                ..Scripted::default()
            };
            ep.next.push_back(vec![Completion::Received {
                buf: hello,
                len,
                tag: 1,
            }]);
            let mut t = MsgTransport::new(ep, &config, &layout, 0).unwrap();
            assert_eq!(t.enable_rejoin(false), rejoins);
            assert!(!t.peer_runnable(1), "nothing known before the Hello");
            t.connect(&peers, &mut Seen::default()).unwrap();
            assert_eq!(
                t.peer_runnable(1),
                runnable,
                "host {host:x}, rejoin {rejoins}"
            );
        }
    }

    /// The runtime dropping a peer asks the engine to re-establish the
    /// link (an engine that cannot ignores it); not once the run is over.
    #[test]
    fn a_dropped_peer_is_relinked_unless_finished() {
        let config = Config::load(None, &["nodes.count=3".into()]).unwrap();
        let layout = Layout::from_config(&config);
        let mut t = MsgTransport::new(Scripted::default(), &config, &layout, 0).unwrap();
        t.peer_index[1] = Some(0);
        t.peer_index[2] = Some(1);
        let mut events = Vec::new();
        t.drop_peer(1, &mut events);
        t.drop_peer(1, &mut events);
        assert_eq!(t.endpoint().relinks, vec![0]);
        t.finish();
        t.drop_peer(2, &mut events);
        assert_eq!(t.endpoint().relinks, vec![0]);
    }

    /// A join after the runtime dropped the peer: reported at the end of
    /// the same poll, its messages at the next.
    #[test]
    fn a_join_of_a_dropped_peer_is_reported_at_once() {
        let mut t = rejoining_peer();
        let mut events = Vec::new();
        t.drop_peer(1, &mut events);
        let mut seen = Seen::default();
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert_eq!(events, vec![LinkEvent::Joined { peer: 1 }]);
        assert!(seen.alive.is_empty());
        t.poll(Duration::ZERO, &mut seen, &mut events).unwrap();
        assert_eq!(seen.alive, vec![1]);
    }
}
