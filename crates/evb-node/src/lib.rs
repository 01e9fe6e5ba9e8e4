//! `evb-node`: `evb node`, one endpoint of an event builder, as a process.
//!
//! A crate of its own: it is the runtime that drives the sans-IO
//! `evb-core` over real transports (`evb-transport`); `evb run`
//! (`evb-launch`) only starts it as a process and reads its lines, and
//! `evb bench` (`evb-bench`) opens transports and exchanges addresses the
//! way it does ([`open_transport`], [`rendezvous`]). [`start`] turns a
//! command line into a running node.
//!
//! Drives an [`evb_core::Node`] over a [`Transport`] with a single-threaded
//! loop: time-driven inputs (the end of a timed run, the node's deadlines),
//! then the transport's input, then the actions the node asked for. The
//! node keeps its own timers, liveness included (heartbeats, silent peers,
//! the drain, the linger: [`evb_core::liveness`]); the loop feeds it time
//! and I/O, and what only the transport can see of a peer (alive, starved).
//! Under `evb run` (`--control stdio`) the node prints `LISTEN <token>`,
//! reads `PEERS <token>...` and later `STOP` on stdin, and prints `STATS`
//! and `FINAL` JSON lines on stdout. Under `mpirun`/`srun`
//! (`--control launcher`) rank and size come from the launcher's environment
//! and the tokens through a rendezvous directory ([`evb_control::cluster`]).
//! The control lines are those of [`evb_control::lines`].
//!
//! With consumers, a BU delivers each built batch to a Filter Unit endpoint
//! as one fragment-kind message flagged as a batch; an FU endpoint verifies
//! it and is busy with it for the time its state machine drew, waiting on
//! the node's deadline (sleeping or spinning, `output.consumer_wait`).
//!
//! The loop and the state it keeps are here; the other jobs are modules:
//! `setup` (buffers, transport, peers' addresses, [`run_node`]),
//! `pools` (spare and preallocated buffers), `receive` (what the
//! transport hands in), `dispatch` (carrying out the node's actions),
//! `output` (the file sink and the event store) and `stats` (STATS and
//! FINAL lines, `/metrics`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use evb_core::config::{BusyWait, Config, Readout, SinkKind};
use evb_core::liveness::PeerState;
use evb_core::source::{RingTemplate, SourceModel};
use evb_core::wire::FragmentHeader;
use evb_core::{Layout, MepId, Nanos, Node, NodeId};

// The crates a node is made of, under the names its code uses for them.
use evb_control::{cluster, report};
use evb_metrics as metrics;
use evb_transport as transport;
use evb_transport::{buffers, mepbuf};

use crate::mepbuf::{MepBuf, SlotStore};
use crate::transport::shm::SharedView;
use crate::transport::{CrcPolicy, LinkEvent, Transport};

pub mod consumer;
pub mod start;

mod dispatch;
mod output;
mod pools;
mod receive;
mod setup;
mod stats;

pub use setup::{open_transport, rendezvous};
pub use setup::{run_node, Control, NodeOptions};

use pools::{SparePool, POOL_TRIM};
use stats::{monotonic_ns, ReportLines};

const STATS_INTERVAL: Duration = Duration::from_millis(250);
/// A restarted EM waits at least this long for every node to answer: a
/// TCP peer re-dials it with a backoff of up to 1 s.
const EM_RESYNC_WAIT_MIN: Duration = Duration::from_secs(3);
/// A restarted EM waiting longer than this for the nodes says for whom.
const RESYNC_SLOW: Duration = Duration::from_secs(2);
/// Actions carried out before the loop looks at its timers again.
const ACTION_BUDGET: u32 = 4096;
/// The longest a wait for input lasts, so that commands from stdin are
/// seen promptly.
const MAX_WAIT: Duration = Duration::from_millis(50);

/// What `evb run` says on stdin (forwarded by `setup`'s reader thread).
enum Command {
    Stop,
    Eof,
}

/// A built batch's fragments, by source index, until it is delivered.
struct BatchSlots {
    slots: Vec<Option<Slot>>,
}

enum Slot {
    /// Received over the network into a pooled buffer.
    Received {
        data: Vec<u8>,
        start: usize,
        len: usize,
    },
    /// Handed over in memory from this node's RU.
    Local(Rc<MepBuf>),
    /// Read in place in its RU's shared memory (shm zero copy): released
    /// to the RU when the batch is done with it.
    Shared(SharedView),
}

/// The node's buffers and counters the receive path needs (split from the
/// transport so both can be borrowed at once).
struct Engine {
    node: Node,
    /// The start of the run: the node's time 0.
    epoch: Instant,
    /// The run has started: before, during the setup, the node's time
    /// stays 0 (it never goes back).
    running: bool,
    /// CLOCK_MONOTONIC at `epoch`, ns: lets `evb run` compare the clocks
    /// of its nodes (the slotted barrel's phase error).
    epoch_monotonic_ns: u64,
    sources: Option<SourceModel>,
    size_scratch: Vec<u32>,
    /// RU data of MEPs not yet released.
    /// The flag: its bytes are not written yet ([`Runtime::mep_data`]).
    meps: HashMap<MepId, (Rc<MepBuf>, FragmentHeader, bool)>,
    /// Spare heap buffers: fresh MEP data on demand, delivered batches.
    pool: SparePool,
    /// The RU's MEP buffers when they are a fixed set ([`mep_slots`]).
    slots: Option<SlotStore>,
    /// `source.readout`.
    readout: Readout,
    /// Ring readout: each slot's layout once it was filled, and whether
    /// its content must be written again (a fault damaged more than the
    /// event numbers).
    ring: Vec<Option<RingTemplate>>,
    ring_stale: Vec<bool>,
    /// MEPs that found no free MEP buffer and waited for one.
    mep_buffer_waits: u64,
    /// Which fragments' CRC-32C is checked (`event_builder.verify`).
    crc_policy: CrcPolicy,
    /// Spare receive buffers. Kept apart from `pool` so that they keep
    /// their length: growing a buffer again would clear it byte by byte.
    rx_pool: SparePool,
    /// Fixed pools: MEPs assigned to this RU waiting for a free MEP buffer
    /// (produced, in order, as buffers come back).
    waiting_for_buffer: std::collections::VecDeque<MepId>,
    batches: HashMap<MepId, BatchSlots>,
    rus: usize,
    sink: Option<std::fs::File>,
    /// BU: copies of delivered batches (and their headers), kept until a
    /// consumer confirms them, to deliver again if their consumer dies.
    deliveries: HashMap<MepId, (Rc<MepBuf>, FragmentHeader)>,
    /// FU: received batches, by (BU endpoint, MEP), until consumed.
    consuming: HashMap<(NodeId, MepId), Delivered>,
    /// FU holding its deliveries for an embedding application: the
    /// batches held and not handed to it yet, in arrival order.
    handed: std::collections::VecDeque<(NodeId, MepId)>,
}

/// A batch delivered to this FU: the receive buffer and where the payload
/// is in it.
struct Delivered {
    buf: Vec<u8>,
    start: usize,
    len: usize,
    events: u32,
    /// CRC and fragment table verified: only an intact batch is stored.
    intact: bool,
    /// An incomplete batch delivered anyway (`output.deliver_partial`).
    partial: bool,
    /// Delivered again ([`evb_core::wire::FLAG_AGAIN`]): stored only if no
    /// consumer stored it yet.
    again: bool,
    /// When it arrived: one consumed long after (this process was stopped
    /// meanwhile) may have been delivered again to another consumer.
    arrived: Instant,
}

struct Runtime {
    engine: Engine,
    layout: Layout,
    rank: NodeId,
    config: Config,
    /// The endpoints this one has a link to.
    linked: Vec<NodeId>,
    /// Peers declared lost, with when and why.
    lost: Vec<crate::report::PeerLoss>,
    /// Lost peers that came back, with when (a peer is down while it has
    /// more losses than rejoins).
    rejoins: Vec<crate::report::PeerRejoin>,
    /// This process is a restarted node joining a run already going.
    restarted: bool,
    /// A restarted EM's resync was logged.
    em_resync_logged: bool,
    /// This node told its peers it has finished.
    finished: bool,
    events: Vec<LinkEvent>,
    /// Where the final report is also written (launcher mode).
    report_file: Option<PathBuf>,
    /// Launcher mode: print STATS lines all the same (`metrics.stats_lines`).
    stats_under_launcher: bool,
    /// Where STATS and FINAL lines go (stdout, from a thread of its own).
    report_lines: ReportLines,
    /// What `/metrics` serves from (the latest report), when metrics are on.
    metrics: Option<crate::metrics::Metrics>,
    /// process_actions stopped at its budget with actions maybe left.
    actions_left: bool,
    /// After this process was stopped, starved or blocked in a call past
    /// half the peer timeout ([`stalled_until`]), until two peer timeouts
    /// later: a BU may have given this
    /// consumer up and delivered what it holds to another, so what it
    /// consumes is stored only if no consumer has stored it.
    stalled_until: Option<Instant>,
    /// `output.sink = "store"`: this node's event-store writer (a BU's, or
    /// with consumers an FU's).
    store: Option<evb_store::StoreWriter>,
    /// What the store wrote, once it is closed.
    store_closed: Option<evb_store::StoreStats>,
    /// The output network's addresses, for the final report.
    output_network: Option<crate::report::OutputNetworkReport>,
    /// (RU) Fragments with the transport: their BU, bytes and hand-over
    /// time (ns since the epoch); and per BU what finished (per-step
    /// throughput).
    sending: HashMap<MepId, (NodeId, u64, u64)>,
    sent_by_bu: std::collections::BTreeMap<NodeId, crate::report::BuSends>,
    /// The node lives in another program's process (an external
    /// consumer): nothing goes to stdout, the FU holds its deliveries for
    /// the application, which stores what it wants itself.
    embedded: bool,
}

/// What the event loop keeps from one turn to the next.
struct Turns {
    next_stats: Instant,
    next_trim: Instant,
    /// When the EM ends a timed run.
    stop_at: Option<Instant>,
    stopped: bool,
    /// The latest the loop's last wait should have returned.
    wake_by: Instant,
}

impl Runtime {
    fn new(config: Config, layout: Layout, rank: NodeId, embedded: bool) -> Result<Runtime> {
        let mut node = Node::new(&config, &layout, rank);
        if embedded {
            if let Some(fu) = node.fu_mut() {
                fu.hold_deliveries();
            }
        }
        let sources = layout.ru_of[rank as usize].map(|s| SourceModel::new(&config, s));
        let (sink, store) = if embedded {
            (None, None)
        } else {
            output::open_outputs(&config, &layout, rank)?
        };
        let stats_under_launcher = config.metrics.stats_lines;
        Ok(Runtime {
            engine: Engine {
                node,
                epoch: Instant::now(),
                running: false,
                epoch_monotonic_ns: 0,
                sources,
                size_scratch: Vec::new(),
                meps: HashMap::new(),
                pool: SparePool::default(),
                slots: None,
                readout: config.source.readout,
                ring: Vec::new(),
                ring_stale: Vec::new(),
                mep_buffer_waits: 0,
                crc_policy: CrcPolicy::from_config(&config),
                rx_pool: SparePool::default(),
                waiting_for_buffer: std::collections::VecDeque::new(),
                batches: HashMap::new(),
                rus: layout.rus(),
                sink,
                deliveries: HashMap::new(),
                consuming: HashMap::new(),
                handed: std::collections::VecDeque::new(),
            },
            linked: transport::linked_peers(&config, &layout, rank),
            layout,
            rank,
            config,
            lost: Vec::new(),
            rejoins: Vec::new(),
            restarted: false,
            em_resync_logged: false,
            finished: false,
            events: Vec::new(),
            report_file: None,
            stats_under_launcher,
            report_lines: if embedded {
                ReportLines::off()
            } else {
                ReportLines::start()
            },
            metrics: None,
            actions_left: false,
            stalled_until: None,
            store,
            store_closed: None,
            output_network: None,
            sending: HashMap::new(),
            sent_by_bu: std::collections::BTreeMap::new(),
            embedded,
        })
    }

    /// A fragment for `to` went to the transport.
    fn note_handed_over(&mut self, mep: MepId, to: NodeId, bytes: u64) {
        let now = self.engine.now();
        self.sending.insert(mep, (to, bytes, now));
    }

    /// The transport is done with the fragment of `mep` (if it had one).
    fn note_sent(&mut self, mep: MepId) {
        if let Some((to, bytes, at)) = self.sending.remove(&mep) {
            let s = self.sent_by_bu.entry(to).or_default();
            s.bu = to;
            s.fragments += 1;
            s.bytes += bytes;
            s.transfer_s += self.engine.now().saturating_sub(at) as f64 * 1e-9;
        }
    }

    fn run(
        &mut self,
        transport: &mut dyn Transport,
        commands: Option<&mpsc::Receiver<Command>>,
    ) -> Result<()> {
        self.start_run(transport)?;
        let mut turns = self.turns();
        while !self.turn(transport, &mut turns, MAX_WAIT)? {
            // Commands every turn.
            if let Some(rx) = commands {
                while let Ok(cmd) = rx.try_recv() {
                    // STOP, or our parent is gone: drain.
                    if matches!(cmd, Command::Stop | Command::Eof) && !turns.stopped {
                        turns.stopped = true;
                        let now = self.engine.now();
                        self.engine.node.stop(now);
                    }
                }
            }
        }
        self.finish_run(transport)
    }

    /// The loop's timers, as the run starts.
    fn turns(&self) -> Turns {
        let duration = self.config.run.duration_s;
        Turns {
            next_stats: Instant::now() + STATS_INTERVAL,
            next_trim: Instant::now() + POOL_TRIM,
            stop_at: (self.rank == self.layout.em && duration > 0.0)
                .then(|| self.engine.epoch + Duration::from_secs_f64(duration)),
            stopped: false,
            wake_by: Instant::now(),
        }
    }

    /// One turn of the event loop: the time-driven inputs, the actions,
    /// then a wait for input of at most `max_wait`. True when this node's
    /// run is over (it finished, and its peers did or the linger ended).
    fn turn(
        &mut self,
        transport: &mut dyn Transport,
        t: &mut Turns,
        max_wait: Duration,
    ) -> Result<bool> {
        // Time-driven inputs first: the end of a timed run, then the
        // node's own timers (batches, slots, heartbeats, silent peers,
        // the drain, the linger).
        let now_i = Instant::now();
        let peer_timeout = Duration::from_millis(self.config.transport.peer_timeout_ms);
        if let Some(until) = stalled_until(t.wake_by, now_i, peer_timeout) {
            // This process was stopped (or starved) for a while: its peers
            // may have given it up meanwhile (see `Runtime::stalled_until`).
            self.stalled_until = Some(until);
        }
        if !t.stopped && t.stop_at.is_some_and(|s| now_i >= s) {
            t.stopped = true;
            let now = self.engine.now();
            self.engine.node.stop(now);
        }
        if now_i >= t.next_trim {
            t.next_trim = now_i + POOL_TRIM;
            self.engine.trim_pools();
            if self.config.metrics.log_memory {
                self.engine.print_memory(self.rank);
            }
        }
        let now = self.engine.now();
        if self.engine.node.next_deadline().is_some_and(|d| d <= now) {
            self.vouch_for_silent_peers(transport, now);
            self.engine.node.on_timeout(now);
        }
        self.process_actions(transport)?;
        transport.flush(&mut self.events);
        self.handle_link_events(transport)?;
        if now_i >= t.next_stats {
            if !self.engine.node.is_done() {
                self.log_em_resync();
            }
            self.print_report(false);
            t.next_stats = now_i + STATS_INTERVAL;
        }
        if self.engine.node.is_done() && !self.finished && !transport.has_pending_tx(None) {
            self.finished = true;
            transport.finish();
            let now = self.engine.now();
            self.engine.node.on_goodbye_sent(now);
        }
        if self.finished && (transport.all_finished() || self.engine.node.linger_over()) {
            return Ok(true);
        }
        // Wait until the next thing that can happen.
        let mut wake = t.next_stats;
        if let Some(s) = t.stop_at.filter(|_| !t.stopped) {
            wake = wake.min(s);
        }
        if let Some(d) = self.engine.node.next_deadline() {
            wake = wake.min(self.engine.epoch + Duration::from_nanos(d));
        }
        let mut timeout = if self.actions_left {
            Duration::ZERO
        } else {
            wake.saturating_duration_since(Instant::now()).min(max_wait)
        };
        if self.config.output.consumer_wait == BusyWait::Spin
            && self.engine.node.fu().is_some_and(|f| f.is_busy())
        {
            // A consumer at work burns its core, as a real filter does.
            timeout = Duration::ZERO;
        }
        // This turn's own work took that long (a call into the transport
        // blocked: evb-ucx's ucp_ep_create of a RELINK to a peer whose
        // packets were dropped took 2.04 s), or the poll came back that
        // late: as after a late wake (above), what comes in now may have
        // waited as long, and the peers may have given this node up while
        // its timers could not run to say so. Over ucx:tcp a consumer so
        // blocked consumed, as first deliveries, batches its BUs had meanwhile
        // given to the other consumer: stored twice (`evb chaos -t ucx:tcp
        // --seed 10`, `link-down:5@6.09+2.15`: consumer 6 blocked relinking
        // to consumer 5).
        let before_poll = Instant::now();
        if let Some(until) = stalled_until(now_i, before_poll, peer_timeout) {
            self.stalled_until = Some(until);
        }
        t.wake_by = before_poll + timeout;
        transport.poll(timeout, &mut self.engine, &mut self.events)?;
        if let Some(until) = stalled_until(t.wake_by, Instant::now(), peer_timeout) {
            self.stalled_until = Some(until);
        }
        self.handle_link_events(transport)?;
        Ok(false)
    }

    /// The run begins: the node's clock starts, a restarted node gives up
    /// the peers that did not connect, and the protocol core starts.
    fn start_run(&mut self, transport: &mut dyn Transport) -> Result<()> {
        // The node's time starts with the run: what arrived during the
        // setup was stamped 0.
        self.engine.epoch = Instant::now();
        self.engine.epoch_monotonic_ns = monotonic_ns();
        self.engine.running = true;
        if self.restarted {
            // The peers that did not connect are down for this incarnation
            // (dead, or slow to re-dial us): they may join later.
            let missing: Vec<NodeId> = self
                .linked
                .iter()
                .copied()
                .filter(|&p| p != self.rank && !transport.has_link(p))
                .collect();
            for p in missing {
                self.declare_lost(transport, p, "not connected when this node rejoined".into());
            }
        }
        let now = self.engine.now();
        self.engine.node.start(now);
        self.process_actions(transport)?;
        Ok(())
    }

    /// The run is over: the event store closed, then the final report
    /// written (and the STATS lines that had to be dropped counted).
    fn finish_run(&mut self, transport: &mut dyn Transport) -> Result<()> {
        if let Some(store) = self.store.take() {
            // Everything queued is written before the final report.
            let stats = store.close().context("closing the event store")?;
            tracing::warn!("evb node {}: event store: {stats:?}", self.rank);
            self.store_closed = Some(stats);
        }
        self.output_network = transport.output_network();
        self.print_report(true);
        let dropped = self.report_lines.finish();
        if dropped > 0 {
            tracing::warn!(
                "evb node {}: {dropped} STATS lines dropped: stdout was not read fast enough",
                self.rank
            );
        }
        Ok(())
    }

    /// Completed sends go to the node; closed links are judged orderly
    /// (the peer finished with the run) or a loss.
    fn handle_link_events(&mut self, transport: &mut dyn Transport) -> Result<()> {
        while !self.events.is_empty() {
            let events = std::mem::take(&mut self.events);
            for event in events {
                match event {
                    LinkEvent::SendDone(mep) => {
                        // The same MEP can be both the RU's fragment and a
                        // delivered batch: the RU's transfer is told first.
                        let ru_sending = self.engine.node.ru().is_some_and(|r| r.is_sending(mep));
                        if !ru_sending && self.engine.deliveries.contains_key(&mep) {
                            // A delivery: its copy stays until confirmed.
                            continue;
                        }
                        self.note_sent(mep);
                        let now = self.engine.now();
                        self.engine.node.on_send_complete(now, mep);
                    }
                    LinkEvent::Closed { peer, error } => self.link_closed(transport, peer, error),
                    LinkEvent::Joined { peer } => self.peer_joined(peer),
                    LinkEvent::Finished { peer } => {
                        let now = self.engine.now();
                        self.engine.node.on_peer_finished(now, peer);
                    }
                }
            }
            self.process_actions(transport)?;
            transport.flush(&mut self.events);
        }
        Ok(())
    }

    fn link_closed(&mut self, transport: &mut dyn Transport, peer: NodeId, error: Option<String>) {
        if let Some(e) = &error {
            tracing::warn!(
                "evb node {}: link to endpoint {peer} failed: {e}",
                self.rank
            );
        }
        let end = self.engine.node.end_of_run().is_some();
        // A clean close after the end of the run, or after the peer said it
        // finished (its goodbye can overtake the EM's EndOfRun), is how
        // peers finish.
        let said_goodbye = self.engine.node.peer_state(peer) == Some(PeerState::Finished);
        let orderly = self.engine.node.is_done()
            || self.finished
            || (error.is_none() && (end || said_goodbye));
        if !orderly && peer != self.rank && !self.is_lost(peer) {
            let reason = error.unwrap_or_else(|| "connection closed".into());
            self.declare_lost(transport, peer, reason);
        }
    }

    /// A restarted EM says when it resumed, and whom it still waits for.
    fn log_em_resync(&mut self) {
        let Some(em) = self.engine.node.em() else {
            return;
        };
        match (em.stats.resumed_at, self.em_resync_logged) {
            (Some(mep), false) => {
                self.em_resync_logged = true;
                tracing::warn!(
                    "evb node {}: EM resumed the run at MEP {mep} (by {:.1} s after its restart)",
                    self.rank,
                    self.engine.epoch.elapsed().as_secs_f64()
                );
            }
            (None, false) if em.is_resyncing() && self.engine.epoch.elapsed() > RESYNC_SLOW => {
                self.em_resync_logged = true;
                tracing::warn!(
                    "evb node {}: restarted EM still waits for endpoints {:?} to say how far the run got",
                    self.rank,
                    em.resync_waiting()
                );
            }
            _ => {}
        }
    }

    /// `peer` is down: lost and not back.
    fn is_lost(&self, peer: NodeId) -> bool {
        self.engine.node.is_peer_lost(peer)
    }

    /// A lost peer is connected again: a new incarnation, or the same
    /// process after a network fault. The node serves it again (and the EM
    /// re-admits it).
    fn peer_joined(&mut self, peer: NodeId) {
        if self.engine.node.is_done() || self.finished || !self.is_lost(peer) {
            return;
        }
        tracing::warn!("evb node {}: endpoint {peer} rejoined", self.rank);
        self.rejoins.push(crate::report::PeerRejoin::now(peer));
        let now = self.engine.now();
        self.engine.node.on_peer_joined(now, peer);
    }

    /// The transport saw `peer` fail: the node is told.
    fn declare_lost(&mut self, transport: &mut dyn Transport, peer: NodeId, reason: String) {
        self.give_up_link(transport, peer, reason);
        let now = self.engine.now();
        self.engine.node.on_peer_lost(now, peer);
        self.forget_deliveries_of(peer);
    }

    /// Records the loss of `peer` and gives up its link.
    fn give_up_link(&mut self, transport: &mut dyn Transport, peer: NodeId, reason: String) {
        tracing::warn!("evb node {}: endpoint {peer} lost: {reason}", self.rank);
        self.lost.push(crate::report::PeerLoss::now(peer, reason));
        transport.drop_peer(peer, &mut self.events);
    }

    /// After the node learned of `peer`'s loss: the batches its consumer
    /// dropped unconsumed (they come again, from that BU once it is back
    /// or to another consumer) give their buffers back.
    fn forget_deliveries_of(&mut self, peer: NodeId) {
        let e = &mut self.engine;
        let Some(fu) = e.node.fu() else { return };
        let gone: Vec<(NodeId, MepId)> = e
            .consuming
            .keys()
            .copied()
            .filter(|&(bu, mep)| bu == peer && !fu.holds(bu, mep))
            .collect();
        for key in gone {
            if let Some(d) = e.consuming.remove(&key) {
                e.give_back_rx(d.buf);
            }
        }
    }

    /// Before the node judges its peers: those it would find silent are
    /// alive after all if their bytes wait unread or they take ours, and
    /// starved rather than hung if their process on this host is runnable.
    fn vouch_for_silent_peers(&mut self, transport: &dyn Transport, now: Nanos) {
        for p in self.engine.node.silent_peers(now) {
            if transport.peer_active(p) {
                self.engine.node.on_peer_alive(now, p);
            } else if transport.peer_runnable(p) {
                self.engine.node.on_peer_starved(now, p);
            }
        }
    }
}

/// A node that was due at `due` and got to `now` more than half a peer
/// timeout later (stopped, starved, or blocked in a call) may have been
/// given up by its peers meanwhile, its timers not having run to say so:
/// until the returned time, what it consumes is stored only if no
/// consumer has it ([`Runtime::stalled_until`]).
fn stalled_until(due: Instant, now: Instant, peer_timeout: Duration) -> Option<Instant> {
    (now.saturating_duration_since(due) > peer_timeout / 2).then_some(now + 2 * peer_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ucx:tcp consumer of `evb chaos --seed 10`: its turn blocked
    /// 2.04 s in ucp_ep_create (a RELINK to a peer whose packets were
    /// dropped), then took in batches delivered before; a turn that
    /// merely ran long stays fresh.
    #[test]
    fn a_turn_blocked_past_half_the_peer_timeout_is_a_stall() {
        let timeout = Duration::from_millis(800);
        let start = Instant::now();
        let after = start + Duration::from_millis(2040);
        assert_eq!(
            stalled_until(start, after, timeout),
            Some(after + Duration::from_millis(1600))
        );
        let quick = start + Duration::from_millis(300);
        assert_eq!(stalled_until(start, quick, timeout), None);
        // Early is never late.
        assert_eq!(stalled_until(after, start, timeout), None);
    }
}
