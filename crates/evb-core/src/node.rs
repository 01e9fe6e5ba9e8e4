//! One endpoint of the event builder: the RU, BU and EM it hosts, composed
//! into a single sans-IO state machine.
//!
//! A driver (the real runtime, the simulator, or a test) feeds it inputs,
//! always with the current time, and drains [`Action`]s with
//! [`Node::poll_action`]. Messages between units of the same node never
//! leave it; a fragment from the node's own RU to its own BU is handed over
//! in memory or sent through the transport, as `event_builder.local` says.
//! A Filter Unit (consumer) endpoint hosts only an FU.
//!
//! The node also keeps the liveness timers ([`crate::liveness`]): it sends
//! heartbeats, declares lost a peer silent for longer than the peer
//! timeout, ends its drain when the drain period is over and lingers for
//! its peers once it is done. The driver only feeds time and I/O.

use std::collections::VecDeque;

use crate::bu::{Admit, BuAction, BuStats, BuilderUnit, Nanos, Outcome};
use crate::clock::{ClockStats, ClockSync};
use crate::config::{ClockSource, Config, LocalTraffic, Schedule};
use crate::em::{EmStats, EventManager};
use crate::fu::{FilterUnit, FuAction, FuStats};
use crate::layout::Layout;
use crate::liveness::{Beat, Drain, PeerState, PeerWatch, Timers};
use crate::pacer::ControlPacer;
use crate::ru::{ReadoutUnit, RuAction, RuStats};
use crate::wire::{FragmentHeader, MepId, Message, NodeId, FLAG_BATCH};

/// What a node asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a control message to another endpoint.
    Send { to: NodeId, msg: Message },
    /// Produce this node's RU data for `mep`, then call [`Node::on_mep_ready`].
    Produce { mep: MepId },
    /// Ship the RU's fragment to endpoint `to` through the transport (`to`
    /// may be this node with `local = "nic"`); then call
    /// [`Node::on_send_complete`].
    SendFragment { to: NodeId, header: FragmentHeader },
    /// Hand the RU's fragment to this node's BU in memory: compute the CRC
    /// of the RU's buffer and call [`Node::on_local_fragment`].
    HandOver { header: FragmentHeader },
    /// The RU no longer needs the data of `mep`.
    Release { mep: MepId },
    /// The BU finished `mep`: deliver it to the sink if `outcome` is
    /// `Built`, or if `partial` (incomplete, `output.deliver_partial`:
    /// what arrived, flagged partial), then free its buffers.
    Finish {
        mep: MepId,
        outcome: Outcome,
        events: u64,
        bytes: u64,
        partial: bool,
    },
    /// Send the built batch `mep` to the Filter Unit on endpoint `to`: a
    /// fragment with [`FLAG_BATCH`] whose payload is the batch
    /// ([`crate::wire::batch_payload_len`]); the `Finish` of `mep` follows,
    /// so keep (or copy) its buffers until the transport has them.
    /// `partial`: the batch is incomplete and delivered anyway
    /// (`output.deliver_partial`): set [`crate::wire::FLAG_PARTIAL`]; a
    /// missing source's fragment is empty.
    Deliver {
        to: NodeId,
        mep: MepId,
        events: u64,
        bytes: u64,
        partial: bool,
    },
    /// BU: a consumer confirmed built batch `mep` (or it can never be
    /// delivered): free the copy kept for delivering it again.
    Confirmed { mep: MepId },
    /// FU: done with `mep` from the BU on endpoint `bu`; free its buffer.
    Consumed { mep: MepId, bu: NodeId },
    /// The node declared endpoint `peer` lost: nothing was heard from it
    /// for `silent_ns` (of this node's running time), more than the peer
    /// timeout. The node has acted on the loss already; give up the link
    /// (nothing more from it is handed to the node until it rejoins).
    DropPeer { peer: NodeId, silent_ns: Nanos },
    /// The drain period ran out (`event_builder.drain_timeout_ms` after
    /// the end of the run; `without_em`: `em_lost_wait_ms` after the EM was
    /// lost, with no end of run): what `pending` says was still open is
    /// given up, and `Done` follows.
    DrainTimedOut { without_em: bool, pending: String },
    /// The run is over for this node: everything it held is finished.
    Done,
}

/// Counters of a node, by unit.
#[derive(Debug, Clone, Default)]
pub struct NodeStats {
    pub ru: Option<RuStats>,
    pub bu: Option<BuStats>,
    pub em: Option<EmStats>,
    pub fu: Option<FuStats>,
    /// The slot clock: this node's offset to the EM's clock, as measured
    /// (`None`: no slotted RU here, or the hosts' clocks are trusted).
    pub clock: Option<ClockStats>,
    /// Control messages dropped because they came from the wrong endpoint.
    pub control_rejected: u64,
}

/// Most MEPs one `AssignRun` may name: a run never holds more than the
/// credits of every BU, and a bound keeps a hostile count from making a
/// node loop for ever.
pub const MAX_ASSIGN_RUN: u32 = 1 << 20;

/// The roles the sender of a control message holds in the layout (an
/// endpoint may hold several): what it may send.
#[derive(Clone, Copy)]
struct SenderRoles {
    em: bool,
    bu: bool,
    /// The sender's RU index, if it hosts an RU.
    ru: Option<u16>,
    fu: bool,
}

#[derive(Debug, Clone)]
pub struct Node {
    id: NodeId,
    layout: Layout,
    local: LocalTraffic,
    em: Option<EventManager>,
    ru: Option<ReadoutUnit>,
    bu: Option<BuilderUnit>,
    fu: Option<FilterUnit>,
    /// The slotted RU's measurement of the EM's clock.
    clock: Option<ClockSync>,
    /// The EM's assignments, paced into this node's slots when it also
    /// ships fragments on them.
    pacer: ControlPacer,
    /// When the pacer has more to let out.
    pacer_wake: Option<Nanos>,
    /// The EM's answers to clock probes that came while its node's own
    /// fragment was on the link: (prober, its `sent`, when it came),
    /// answered when the fragment has left (see [`Node::answer_probe`]).
    held_replies: Vec<(NodeId, Nanos, Nanos)>,
    /// The RU reports how it keeps its slots to the EM, which adapts them.
    slot_reports: bool,
    /// How long a due clock probe waits for the RU's fragment to leave
    /// (see [`Node::probe_time`]).
    probe_wait: Nanos,
    /// The driver's clock at the last input: time never goes back.
    now: Nanos,
    actions: VecDeque<Action>,
    /// Messages between units of this node, delivered in order.
    internal: VecDeque<Message>,
    ru_out: Vec<RuAction>,
    bu_out: Vec<BuAction>,
    em_out: Vec<(NodeId, Message)>,
    fu_out: Vec<FuAction>,
    /// The BU told the consumers it delivers nothing more.
    output_ended: bool,
    end_of_run: Option<MepId>,
    /// Every MEP this node has seen assigned is below this (told to an EM
    /// that rejoins: a restarted one resumes above it).
    seen_up_to: MepId,
    /// A new incarnation of a node that died ([`Node::rejoining`]).
    rejoining: bool,
    done: bool,
    control_rejected: u64,
    timers: Timers,
    /// Heartbeats and silent peers.
    watch: PeerWatch,
    beats: Vec<Beat>,
    drain: Drain,
    /// When the lingering of a finished node ends, once it said goodbye.
    linger_until: Option<Nanos>,
    linger_over: bool,
}

impl Node {
    pub fn new(config: &Config, layout: &Layout, id: NodeId) -> Node {
        let i = id as usize;
        Node {
            id,
            layout: layout.clone(),
            local: config.event_builder.local,
            em: (id == layout.em).then(|| {
                let em = EventManager::new(layout, config.run.max_meps)
                    .paced(
                        config.source.mep_rate_hz,
                        config.event_builder.ru_buffer_meps,
                    )
                    .batched(
                        config.assign_batch(),
                        config.event_builder.assign_flush_us * 1000,
                    )
                    .waits_for_lost_bus(config.event_builder.em_lost_wait_ms * 1_000_000);
                if config.event_builder.schedule == Schedule::Slotted
                    && config.event_builder.adaptive_slots
                {
                    let rotation = config
                        .slot_table
                        .as_ref()
                        .map_or(layout.bus().saturating_sub(1), |t| t.slots.len());
                    em.adaptive_slots(config.slot_ns(), rotation as u64)
                } else {
                    em
                }
            }),
            ru: layout.ru_of[i].map(|s| ReadoutUnit::new(config, layout, s)),
            bu: layout.bu_of[i].map(|_| BuilderUnit::new(config, layout, id)),
            fu: layout.fu_of[i].map(|_| FilterUnit::new(config, layout, id)),
            clock: (config.event_builder.schedule == Schedule::Slotted
                && config.event_builder.clock == ClockSource::Em
                && layout.ru_of[i].is_some()
                && id != layout.em)
                .then(|| {
                    ClockSync::new(
                        config.event_builder.clock_probe_ms * 1_000_000,
                        crate::source::mix64(config.run.seed ^ 0xc10c << 16 ^ u64::from(id)),
                    )
                }),
            pacer: ControlPacer::default(),
            pacer_wake: None,
            held_replies: Vec::new(),
            slot_reports: config.event_builder.schedule == Schedule::Slotted
                && config.event_builder.adaptive_slots,
            probe_wait: 2 * config.slot_ns(),
            now: 0,
            actions: VecDeque::new(),
            internal: VecDeque::new(),
            ru_out: Vec::new(),
            bu_out: Vec::new(),
            em_out: Vec::new(),
            fu_out: Vec::new(),
            output_ended: false,
            end_of_run: None,
            seen_up_to: 0,
            rejoining: false,
            done: false,
            control_rejected: 0,
            timers: Timers::from_config(config),
            watch: Self::peer_watch(layout, id, &Timers::from_config(config)),
            beats: Vec::new(),
            drain: Drain::default(),
            linger_until: None,
            linger_over: false,
        }
    }

    fn peer_watch(layout: &Layout, id: NodeId, timers: &Timers) -> PeerWatch {
        PeerWatch::new(layout.endpoints, id, timers.heartbeat, timers.peer_timeout)
    }

    /// Other liveness timers than the configuration's (the simulator's
    /// time scale). Call before [`Node::start`].
    pub fn set_timers(&mut self, timers: Timers) {
        self.timers = timers;
        self.watch = Self::peer_watch(&self.layout, self.id, &timers);
    }

    pub fn timers(&self) -> &Timers {
        &self.timers
    }

    /// This node's EM is a new incarnation taking over a run whose EM died
    /// (the node was restarted): it waits for the other nodes to say how
    /// far the run got before it assigns ([`EventManager::resuming`]).
    /// `wait`: how long it waits at most for a node to answer. Call
    /// before [`Node::start`].
    pub fn resume_em(&mut self, wait: Nanos) {
        let (layout, id) = (&self.layout, self.id);
        self.em = self.em.take().map(|em| em.resuming(layout, id, wait));
    }

    /// This node is a new incarnation of one that died, rejoining a run
    /// under way: at [`Node::start`] it tells the EM it has seen nothing
    /// (an EM restarted at the same time waits for every node's word
    /// before it assigns, and would otherwise wait its whole resync wait
    /// for this one, which never lost it). Call before [`Node::start`].
    pub fn rejoining(&mut self) {
        self.rejoining = true;
    }

    /// Every input brings the time: the RU keeps it for its phase waits
    /// and slots, the EM for its batches, the liveness timers their
    /// running clock.
    ///
    /// Time never goes back: a driver whose clock does is broken, and
    /// every timer (silence, drain, batches) would silently go wrong with
    /// it. Checked in every build, not only debug ones: it costs one
    /// comparison an input, and the test suite runs optimised.
    fn tick(&mut self, now: Nanos) {
        self.clock_in(now);
        if let Some(ru) = &mut self.ru {
            ru.set_now(now);
            if let Some(clock) = &self.clock {
                ru.set_clock_offset(clock.is_settled().then(|| clock.offset_at(now)));
            }
        }
        if let Some(em) = &mut self.em {
            em.set_now(now);
        }
    }

    /// The time of an input, for the node and its liveness timers only
    /// (inputs that concern no unit: a sign of life, a goodbye).
    fn clock_in(&mut self, now: Nanos) {
        assert!(
            now >= self.now,
            "evb-core node {}: time went back, an input at {now} ns after one at {} ns \
             (the driver's clock must never go back)",
            self.id,
            self.now
        );
        self.now = now;
        self.watch.observe(now);
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        let action = self.actions.pop_front()?;
        if let Action::Send { to, .. }
        | Action::SendFragment { to, .. }
        | Action::Deliver { to, .. } = &action
        {
            // The link carries something: no heartbeat needed on it.
            self.watch.sent(self.now, *to);
        }
        Some(action)
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The run has ended (the EM said how many MEPs there are).
    pub fn end_of_run(&self) -> Option<MepId> {
        self.end_of_run
    }

    /// Starts the run: the BU grants its credits.
    pub fn start(&mut self, now: Nanos) {
        self.tick(now);
        self.watch.start(now);
        if self.rejoining && self.layout.em != self.id && (self.ru.is_some() || self.bu.is_some()) {
            // A new incarnation has seen nothing of the run: a restarted
            // EM (restarted with it) need not wait for it to say so.
            self.actions.push_back(Action::Send {
                to: self.layout.em,
                msg: Message::SeenUpTo {
                    next_mep: 0,
                    ended: false,
                },
            });
        }
        if let Some(em) = &mut self.em {
            em.start(now);
        }
        if let Some(clock) = &mut self.clock {
            clock.restart(now);
        }
        self.probe_clock(now);
        if let Some(bu) = &mut self.bu {
            bu.start(&mut self.bu_out);
        }
        if let Some(fu) = &mut self.fu {
            fu.start(&mut self.fu_out);
        }
        self.flush(now);
    }

    /// Ends the run (on the node hosting the EM): stop assigning, drain.
    pub fn stop(&mut self, now: Nanos) {
        self.tick(now);
        if let Some(em) = &mut self.em {
            em.end_throttle(now);
            em.stop(&mut self.em_out);
        }
        self.flush(now);
    }

    /// A control message from endpoint `from`.
    pub fn on_message(&mut self, now: Nanos, from: NodeId, msg: Message) {
        self.tick(now);
        self.watch.heard(now, from);
        self.dispatch(now, from, msg);
        self.flush(now);
    }

    /// A fragment header from `from` arrived: should its payload be kept?
    pub fn admit_fragment(&mut self, now: Nanos, from: NodeId, header: &FragmentHeader) -> Admit {
        self.tick(now);
        self.watch.heard(now, from);
        if header.flags & FLAG_BATCH != 0 {
            return match &mut self.fu {
                Some(fu) => fu.admit(from, header),
                None => {
                    self.control_rejected += 1;
                    Admit::Drop
                }
            };
        }
        match &mut self.bu {
            Some(bu) => bu.admit(now, from, header),
            None => {
                self.control_rejected += 1;
                Admit::Drop
            }
        }
    }

    /// The payload of an admitted fragment is in; `crc` was computed over it.
    pub fn on_fragment(&mut self, now: Nanos, header: &FragmentHeader, crc: u32) {
        self.tick(now);
        if header.flags & FLAG_BATCH != 0 {
            self.on_delivery(now, header, crc == header.crc32c);
            return;
        }
        if let Some(bu) = &mut self.bu {
            bu.on_fragment(now, header, crc, &mut self.bu_out);
        }
        self.flush(now);
    }

    /// FU: the payload of an admitted delivery is in; `intact` says whether
    /// its CRC and fragment table verified.
    pub fn on_delivery(&mut self, now: Nanos, header: &FragmentHeader, intact: bool) {
        self.tick(now);
        if let Some(fu) = &mut self.fu {
            fu.on_delivery(now, header, intact, &mut self.fu_out);
        }
        self.flush(now);
    }

    /// FU in hold mode ([`FilterUnit::hold_deliveries`]): the application
    /// is done with delivery `mep` from the BU on endpoint `bu` (its
    /// `Consumed` and the credit follow). False when no such delivery is
    /// held.
    pub fn release_delivery(&mut self, now: Nanos, bu: NodeId, mep: MepId) -> bool {
        self.tick(now);
        let released = match &mut self.fu {
            Some(fu) => fu.release(now, bu, mep, &mut self.fu_out),
            None => false,
        };
        self.flush(now);
        released
    }

    /// A [`Action::HandOver`] is done: `crc` was computed over the RU's data.
    pub fn on_local_fragment(&mut self, now: Nanos, header: &FragmentHeader, crc: u32) {
        self.tick(now);
        if let Some(bu) = &mut self.bu {
            if bu.admit(now, self.id, header) == Admit::Keep {
                bu.on_fragment(now, header, crc, &mut self.bu_out);
            }
        }
        if let Some(ru) = &mut self.ru {
            ru.on_send_complete(header.mep, &mut self.ru_out);
        }
        self.flush(now);
    }

    /// The data asked for by [`Action::Produce`] is ready.
    pub fn on_mep_ready(&mut self, now: Nanos, header: FragmentHeader) {
        self.tick(now);
        if let Some(ru) = &mut self.ru {
            ru.on_mep_ready(header, &mut self.ru_out);
        }
        self.flush(now);
    }

    /// The transport is done with the fragment of `mep`.
    pub fn on_send_complete(&mut self, now: Nanos, mep: MepId) {
        self.tick(now);
        if let Some(ru) = &mut self.ru {
            ru.on_send_complete(mep, &mut self.ru_out);
            if let Some((served, overran, stretch)) =
                ru.take_slot_report().filter(|_| self.slot_reports)
            {
                let msg = Message::SlotReport {
                    served,
                    overran,
                    stretch,
                };
                self.route(self.layout.em, msg);
            }
        }
        // The link may be free now: a probe that waited for it goes.
        self.probe_clock(now);
        self.flush(now);
    }

    /// Earliest time at which [`Node::on_timeout`] has work.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let bu = self.bu.as_ref().and_then(BuilderUnit::next_deadline);
        let ru = self.ru.as_ref().and_then(ReadoutUnit::next_deadline);
        let fu = self.fu.as_ref().and_then(FilterUnit::next_deadline);
        let em = self.em.as_ref().and_then(EventManager::next_deadline);
        let clock = self.probe_time();
        let heartbeat = self.watch.next_deadline();
        let drain = self.drain.deadline().filter(|_| !self.done);
        let linger = self.linger_until.filter(|_| !self.linger_over);
        let replies = self.replies_due();
        bu.into_iter()
            .chain(self.pacer_wake)
            .chain(replies)
            .chain(ru)
            .chain(fu)
            .chain(em)
            .chain(clock)
            .chain(heartbeat)
            .chain(drain)
            .chain(linger)
            .min()
    }

    /// Sends a clock probe to the EM if one is due. Not once the node is
    /// done: the EM may be gone, and a probe it never reads would hold
    /// this node's finish (its transport waits for every send to end).
    fn probe_clock(&mut self, now: Nanos) {
        if self.probe_time().is_none_or(|t| now < t) {
            return;
        }
        if let Some(sent) = self.clock.as_mut().and_then(|c| c.probe(now)) {
            self.actions.push_back(Action::Send {
                to: self.layout.em,
                msg: Message::ClockProbe { sent },
            });
        }
    }

    /// When the next clock probe goes out. A probe that falls due while
    /// the RU's fragment is on the link waits for it to leave (at most
    /// `probe_wait`): then this node's link is free until its next slot,
    /// and so are the EM's (its RU is in the same phase of its slot), so
    /// the probe and its answer queue behind no fragment. An answer that
    /// queued in one direction only is off by half that wait: at line rate
    /// that would be tens of microseconds, the slot grace is 0.5. The
    /// fragment's expected last byte, not its completion, ends the wait
    /// (the completion comes a host latency later, often after the next
    /// slot's fragment has started: measured in `evb sim`, 72 nodes, 82 %
    /// of the answers had queued more than 10 us).
    fn probe_time(&self) -> Option<Nanos> {
        if self.done {
            return None;
        }
        let due = self.clock.as_ref()?.next_deadline()?;
        Some(match self.link_busy_until() {
            Some(until) => due.max(until.min(due.saturating_add(self.probe_wait))),
            None => due,
        })
    }

    /// The EM answers a clock probe from `from`. While its node's own
    /// fragment is on the link the answer would queue behind it (off by
    /// half of up to a fragment's time): it waits for the fragment to
    /// leave, carries the EM's time of leaving, and gives back the probe's
    /// `sent` moved on by the wait. The node's round trip is then the
    /// network's alone and its midpoint falls where the EM read its clock,
    /// as NTP's four timestamps would have it (measured in `evb sim`, 72
    /// nodes: answers had waited a whole fragment at the EM's side, 74 us
    /// on average, and 82 % were too queued to tell a skew from).
    fn answer_probe(&mut self, now: Nanos, from: NodeId, sent: Nanos) {
        if self.link_busy_until().is_some() {
            // One answer held a prober (a prober has one probe out; a
            // second is a restarted one's, and only its latest counts).
            match self.held_replies.iter_mut().find(|(to, ..)| *to == from) {
                Some(held) => *held = (from, sent, now),
                None => self.held_replies.push((from, sent, now)),
            }
            debug_assert!(self.held_replies.len() <= usize::from(self.layout.endpoints));
            return;
        }
        self.actions.push_back(Action::Send {
            to: from,
            msg: Message::ClockReply { sent, em_time: now },
        });
    }

    /// Sends the held answers once the node's fragment has left the link.
    fn release_replies(&mut self, now: Nanos) {
        if self.held_replies.is_empty() || self.link_busy_until().is_some() {
            return;
        }
        for (to, sent, came) in std::mem::take(&mut self.held_replies) {
            debug_assert!(came <= now, "time never goes back");
            self.actions.push_back(Action::Send {
                to,
                msg: Message::ClockReply {
                    sent: sent.saturating_add(now - came),
                    em_time: now,
                },
            });
        }
    }

    /// When the held answers go: when the node's fragment is expected to
    /// have left the link.
    fn replies_due(&self) -> Option<Nanos> {
        (!self.held_replies.is_empty()).then(|| self.link_busy_until().unwrap_or(self.now))
    }

    /// Until when this node's own fragment is expected to be on its link
    /// (slotted barrel), if it is now.
    fn link_busy_until(&self) -> Option<Nanos> {
        self.ru.as_ref().and_then(ReadoutUnit::link_busy_until)
    }

    /// The slot clock's measurement, if this node makes one.
    pub fn clock(&self) -> Option<&ClockSync> {
        self.clock.as_ref()
    }

    pub fn on_timeout(&mut self, now: Nanos) {
        self.tick(now);
        self.probe_clock(now);
        if let Some(bu) = &mut self.bu {
            bu.on_timeout(now, &mut self.bu_out);
        }
        if let Some(ru) = &mut self.ru {
            ru.on_timeout(&mut self.ru_out);
        }
        if let Some(fu) = &mut self.fu {
            fu.on_timeout(now, &mut self.fu_out);
        }
        if let Some(em) = &mut self.em {
            em.on_timeout(now, &mut self.em_out);
        }
        self.flush(now);
        self.liveness_timeout(now);
    }

    /// The liveness timers due at `now`: heartbeats and silent peers, the
    /// end of the drain, the end of the lingering.
    fn liveness_timeout(&mut self, now: Nanos) {
        let mut beats = std::mem::take(&mut self.beats);
        self.watch.on_timeout(now, &mut beats);
        for beat in beats.drain(..) {
            match beat {
                Beat::Heartbeat(to) => self.actions.push_back(Action::Send {
                    to,
                    msg: Message::Heartbeat,
                }),
                Beat::Silent { peer, silent_ns } => {
                    self.actions.push_back(Action::DropPeer { peer, silent_ns });
                    self.lose_peer(now, peer);
                }
            }
        }
        self.beats = beats;
        if !self.done && self.drain.expire(now) {
            self.actions.push_back(Action::DrainTimedOut {
                without_em: self.end_of_run.is_none(),
                pending: self.pending_work(),
            });
            self.abandon(now);
        }
        if self.linger_until.is_some_and(|t| t <= now) {
            self.linger_over = true;
        }
    }

    /// Something arrived from endpoint `peer` (a heartbeat included), or
    /// the transport sees it alive: its bytes wait unread, or it takes
    /// what this node sends.
    pub fn on_peer_alive(&mut self, now: Nanos, peer: NodeId) {
        self.clock_in(now);
        self.watch.heard(now, peer);
    }

    /// Endpoint `peer`'s process is on this host and runnable, waiting for
    /// a CPU: at the judgement due now its silence is starvation on a
    /// loaded machine, not a hang, up to
    /// [`crate::liveness::STARVED_GRACE`] peer timeouts. Tell it about the
    /// peers of [`Node::silent_peers`] before [`Node::on_timeout`].
    pub fn on_peer_starved(&mut self, now: Nanos, peer: NodeId) {
        self.clock_in(now);
        self.watch.starved(peer);
    }

    /// The peers [`Node::on_timeout`] at `now` would declare lost for
    /// their silence: a driver that can see more of them (bytes waiting
    /// unread, a starved process) vouches for them first
    /// ([`Node::on_peer_alive`], [`Node::on_peer_starved`]). Empty unless
    /// a heartbeat is due.
    pub fn silent_peers(&self, now: Nanos) -> Vec<NodeId> {
        self.watch.silent_peers(now)
    }

    /// Endpoint `peer` said it finished with the run (its goodbye): its
    /// silence and its closing are expected.
    pub fn on_peer_finished(&mut self, now: Nanos, peer: NodeId) {
        self.clock_in(now);
        self.watch.finished(peer);
    }

    /// How this node sees endpoint `peer`.
    pub fn peer_state(&self, peer: NodeId) -> Option<PeerState> {
        self.watch.state(peer)
    }

    pub fn is_peer_lost(&self, peer: NodeId) -> bool {
        self.watch.state(peer) == Some(PeerState::Lost)
    }

    /// The driver told every peer this node finished (after
    /// [`Action::Done`], once its last sends went out): the node lingers
    /// for its peers to finish too, until [`Node::linger_over`].
    pub fn on_goodbye_sent(&mut self, now: Nanos) {
        self.tick(now);
        self.linger_until.get_or_insert(now + self.timers.linger);
    }

    /// The node lingered long enough after its goodbye: the driver stops
    /// even if some peers have not finished.
    pub fn linger_over(&self) -> bool {
        self.linger_over
    }

    /// The drain period ran out before the node finished
    /// ([`Action::DrainTimedOut`]).
    pub fn drain_timed_out(&self) -> bool {
        self.drain.timed_out()
    }

    /// The drain period is over: give up whatever is still open.
    pub fn abandon(&mut self, now: Nanos) {
        self.tick(now);
        if let Some(bu) = &mut self.bu {
            bu.abandon_all(now, &mut self.bu_out);
        }
        if let Some(fu) = &mut self.fu {
            fu.abandon();
        }
        self.flush(now);
        if !self.done {
            self.set_done();
        }
    }

    /// Endpoint `peer` is gone (its connection failed; the node finds a
    /// silent one itself, [`Action::DropPeer`]): stop shipping to its BU
    /// (keeping what was not yet sent, which the EM may re-assign); the EM
    /// decides on its MEPs and accounts.
    pub fn on_peer_lost(&mut self, now: Nanos, peer: NodeId) {
        self.tick(now);
        self.lose_peer(now, peer);
    }

    fn lose_peer(&mut self, now: Nanos, peer: NodeId) {
        self.watch.lost(peer);
        if let Some(ru) = &mut self.ru {
            ru.forget_bu(peer, &mut self.ru_out);
        }
        if let Some(em) = &mut self.em {
            em.on_node_lost(peer, &self.layout, &mut self.em_out);
        }
        if let (Some(bu), Some(source)) = (
            &mut self.bu,
            self.layout.ru_of.get(peer as usize).copied().flatten(),
        ) {
            bu.on_source_link_lost(now, source, &mut self.bu_out);
        }
        if let Some(bu) = &mut self.bu {
            bu.on_consumer_lost(now, peer, &mut self.bu_out);
        }
        if let Some(fu) = &mut self.fu {
            fu.on_producer_lost(now, peer, &mut self.fu_out);
        }
        self.flush(now);
    }

    /// Endpoint `peer` is back after it was lost: a new incarnation of its
    /// process (restarted, same node id), or the same process reconnected
    /// after a network fault. The driver calls this before handing over
    /// anything the new connection carries. Its BU is served again and its
    /// RU sends again; the EM re-admits it (see
    /// [`EventManager::on_node_joined`]). When the EM comes back to this
    /// node, this node's BU grants its credits again: the EM forgot them
    /// when it lost this node.
    pub fn on_peer_joined(&mut self, now: Nanos, peer: NodeId) {
        self.tick(now);
        self.watch.joined(now, peer);
        if let Some(ru) = &mut self.ru {
            ru.on_bu_joined(peer, &mut self.ru_out);
        }
        if let (Some(bu), Some(source)) = (
            &mut self.bu,
            self.layout.ru_of.get(peer as usize).copied().flatten(),
        ) {
            bu.on_source_link_up(source);
        }
        if peer == self.layout.em && peer != self.id && (self.ru.is_some() || self.bu.is_some()) {
            // A restarted EM waits for this before assigning; told too
            // after the end of the run, which it must not start again.
            self.actions.push_back(Action::Send {
                to: peer,
                msg: Message::SeenUpTo {
                    next_mep: self.seen_up_to.max(self.end_of_run.unwrap_or(0)),
                    ended: self.end_of_run.is_some(),
                },
            });
        }
        if peer == self.layout.em && peer != self.id {
            // A new EM process has a clock of its own.
            if let Some(clock) = &mut self.clock {
                clock.restart(now);
            }
            self.probe_clock(now);
        }
        if peer == self.layout.em && peer != self.id && self.end_of_run.is_none() {
            if let Some(ru) = &mut self.ru {
                // Decisions of an EM that lost this node (or died) will
                // not come: what was kept for them is given up.
                ru.release_all_held_for_rounds(&mut self.ru_out);
            }
            if let Some(bu) = &mut self.bu {
                bu.start(&mut self.bu_out);
            }
        }
        if let Some(em) = &mut self.em {
            em.on_node_joined(peer, &self.layout, &mut self.em_out);
        }
        self.consumer_joined(now, peer);
        self.flush(now);
    }

    /// The output side of a rejoin: a BU serves a consumer that is back
    /// (once its new credits come), a consumer grants a BU that is back
    /// its credits again. A BU that already told the consumers it is
    /// through tells the one that is back again (it may be a new
    /// incarnation, or have dropped the old link before the news).
    fn consumer_joined(&mut self, now: Nanos, peer: NodeId) {
        if self
            .layout
            .fu_of
            .get(peer as usize)
            .copied()
            .flatten()
            .is_some()
        {
            if let Some(bu) = &mut self.bu {
                bu.on_consumer_joined(now, peer, &mut self.bu_out);
                if self.output_ended {
                    self.actions.push_back(Action::Send {
                        to: peer,
                        msg: Message::OutputEnd { bu: self.id },
                    });
                }
            }
        }
        if self.done {
            return;
        }
        if let Some(fu) = &mut self.fu {
            fu.on_producer_joined(now, peer, &mut self.fu_out);
        }
    }

    /// Why the node is not done, for diagnostics: empty when nothing is left.
    pub fn pending_work(&self) -> String {
        let mut parts = Vec::new();
        if let Some(bu) = &self.bu {
            if bu.open_batches() > 0 {
                parts.push(format!("{} batches open", bu.open_batches()));
            }
            if bu.output_waiting() > 0 {
                parts.push(format!(
                    "{} built batches wait for a consumer",
                    bu.output_waiting()
                ));
            }
        }
        if let Some(fu) = &self.fu {
            if !fu.is_finished() {
                parts.push(format!(
                    "FU busy {}, {} queued, {} held by the application, {} producers not ended",
                    fu.is_busy(),
                    fu.queued(),
                    fu.held(),
                    fu.producers_open()
                ));
            }
        }
        if let Some(ru) = &self.ru {
            let (held, queued) = ru.holding();
            if held > 0 || ru.in_flight() > 0 {
                parts.push(format!(
                    "RU holds {held} MEPs ({queued} queued, {} in flight, {} kept for lost BUs)",
                    ru.in_flight(),
                    ru.orphans()
                ));
            }
        }
        if let Some(em) = &self.em {
            if em.outstanding() > 0 {
                parts.push(format!("EM waits for {} MEPs", em.outstanding()));
            }
            if em.open_rounds() > 0 {
                parts.push(format!("EM decides on {} lost BUs' MEPs", em.open_rounds()));
            }
        }
        if self.end_of_run.is_none() {
            parts.push("no end of run yet".into());
        }
        parts.join(", ")
    }

    pub fn stats(&self) -> NodeStats {
        NodeStats {
            ru: self.ru.as_ref().map(|r| r.stats.clone()),
            bu: self.bu.as_ref().map(|b| b.stats.clone()),
            em: self.em.as_ref().map(|e| e.stats.clone()),
            fu: self.fu.as_ref().map(|f| f.stats.clone()),
            clock: self.clock.as_ref().map(|c| c.stats),
            control_rejected: self.control_rejected,
        }
    }

    pub fn bu(&self) -> Option<&BuilderUnit> {
        self.bu.as_ref()
    }

    pub fn ru(&self) -> Option<&ReadoutUnit> {
        self.ru.as_ref()
    }

    pub fn em(&self) -> Option<&EventManager> {
        self.em.as_ref()
    }

    pub fn fu(&self) -> Option<&FilterUnit> {
        self.fu.as_ref()
    }

    /// The Filter Unit, for a driver reporting the real work it did
    /// ([`FilterUnit::record_work`]).
    pub fn fu_mut(&mut self) -> Option<&mut FilterUnit> {
        self.fu.as_mut()
    }

    /// The roles endpoint `from` holds in the layout: which control
    /// messages it may send.
    #[inline]
    fn roles_of(&self, from: NodeId) -> SenderRoles {
        let role = |of: &[Option<u16>]| of.get(from as usize).copied().flatten();
        SenderRoles {
            em: from == self.layout.em,
            bu: role(&self.layout.bu_of).is_some(),
            ru: role(&self.layout.ru_of),
            fu: role(&self.layout.fu_of).is_some(),
        }
    }

    /// Sends `msg` to endpoint `to`, or keeps it for this node's own units
    /// when `to` is this node.
    #[inline]
    fn route(&mut self, to: NodeId, msg: Message) {
        if to == self.id {
            self.internal.push_back(msg);
        } else if ControlPacer::paces(&msg)
            && self.ru.as_ref().is_some_and(|r| r.slot_now().is_some())
        {
            self.pacer.hold(to, msg);
        } else {
            for held in self.pacer.take_for(to) {
                self.actions.push_back(Action::Send { to, msg: held });
            }
            self.actions.push_back(Action::Send { to, msg });
        }
    }

    /// Lets out the paced messages this slot's headroom allows, once this
    /// node's fragment has left the link; returns when to try again.
    fn release_paced(&mut self) -> Option<Nanos> {
        if self.pacer.is_empty() {
            return None;
        }
        let mut out = VecDeque::new();
        let slot = self
            .ru
            .as_ref()
            .and_then(|r| r.slot_now().zip(r.control_per_slot()));
        let wait = match slot {
            // No slot clock any more (a new EM's being measured): no pacing.
            None => {
                self.pacer.release_all(&mut out);
                None
            }
            Some(((slot, next_start), per_slot)) => {
                let busy = self.link_busy_until();
                match busy {
                    Some(until) => Some(until),
                    None => self
                        .pacer
                        .release(slot, per_slot, &mut out)
                        .then_some(next_start),
                }
            }
        };
        for (to, msg) in out {
            self.actions.push_back(Action::Send { to, msg });
        }
        wait
    }

    /// Handles a control message from endpoint `from`: one its roles do not
    /// allow counts as rejected.
    fn dispatch(&mut self, now: Nanos, from: NodeId, msg: Message) {
        let SenderRoles {
            em: from_em,
            bu: from_bu,
            ru: from_ru,
            fu: from_fu,
        } = self.roles_of(from);
        match msg {
            // A re-assignment is an assignment to the BU; the RUs treat it
            // apart (they ship what they kept instead of producing).
            Message::Assign { mep, bu } if from_em => self.on_assigned(now, mep, bu, false),
            Message::Reassign { mep, bu } if from_em => self.on_assigned(now, mep, bu, true),
            Message::AssignRun {
                first,
                count,
                first_bu,
            } if from_em => self.on_assign_run(now, first, count, first_bu),
            Message::ClockProbe { sent } => match &self.em {
                Some(_) => self.answer_probe(now, from, sent),
                None => self.control_rejected += 1,
            },
            Message::ClockReply { sent, em_time } if from_em => {
                self.on_clock_reply(now, sent, em_time);
            }
            Message::SlotReport { .. } | Message::SlotLength { .. } => {
                self.on_slot_control(msg, from_em, from_ru.is_some());
            }
            Message::EndOfRun { meps } if from_em => {
                self.end_of_run.get_or_insert(meps);
                if let Some(r) = &mut self.ru {
                    r.on_end_of_run(&mut self.ru_out);
                }
            }
            Message::Credit { .. } | Message::Finished { .. } | Message::RevokedAck { .. }
                if from_bu =>
            {
                self.on_bu_to_em(from, msg);
            }
            Message::Request { mep, bu } if from_bu && bu == from => match &mut self.ru {
                Some(r) => r.on_request(mep, bu, &mut self.ru_out),
                None => self.control_rejected += 1,
            },
            Message::BuLost { bu, round } if from_em => self.on_bu_lost(bu, round),
            Message::ReleaseHeld { round } if from_em => match &mut self.ru {
                Some(r) => r.on_release_held(round, &mut self.ru_out),
                None => self.control_rejected += 1,
            },
            Message::Holding { round, mep } if from_ru.is_some() => match &mut self.em {
                Some(em) => em.on_holding(from_ru.expect("checked"), round, mep),
                None => self.control_rejected += 1,
            },
            Message::HoldingDone { round } if from_ru.is_some() => match &mut self.em {
                Some(em) => em.on_holding_done(from_ru.expect("checked"), round, &mut self.em_out),
                None => self.control_rejected += 1,
            },
            Message::SourceDown { .. } | Message::SourceUp { .. } | Message::Revoked { .. }
                if from_em =>
            {
                self.on_em_to_bu(now, msg);
            }
            Message::Abandon { mep, bu } if from_bu && bu == from => match &mut self.ru {
                Some(r) => r.on_abandon(mep, bu, &mut self.ru_out),
                None => self.control_rejected += 1,
            },
            Message::ConsumerCredit { fu, credits } if from_fu && fu == from => {
                match &mut self.bu {
                    Some(b) => b.on_consumer_credit(now, fu, credits, &mut self.bu_out),
                    None => self.control_rejected += 1,
                }
            }
            Message::OutputEnd { bu } if from_bu && bu == from => match &mut self.fu {
                Some(f) => f.on_output_end(bu),
                None => self.control_rejected += 1,
            },
            Message::SeenUpTo { next_mep, ended } if from_bu || from_ru.is_some() => {
                match &mut self.em {
                    Some(em) => em.on_seen_up_to(from, next_mep, ended, &mut self.em_out),
                    None => self.control_rejected += 1,
                }
            }
            Message::Goodbye => self.watch.finished(from),
            Message::Hello { .. } | Message::Heartbeat => {}
            _ => self.control_rejected += 1,
        }
    }

    /// What a BU tells the EM, over its own connection (`from`, a BU's
    /// endpoint): its credits, a finished MEP, that it had a `Revoked`.
    /// Anything else, or to a node without the EM, is rejected.
    fn on_bu_to_em(&mut self, from: NodeId, msg: Message) {
        let (Some(em), Some(Some(idx))) = (&mut self.em, self.layout.bu_of.get(from as usize))
        else {
            self.control_rejected += 1;
            return;
        };
        let idx = *idx as usize;
        match msg {
            Message::Credit { bu, credits } if bu == from => {
                em.on_credit(idx, credits, &mut self.em_out);
            }
            Message::Finished { mep, bu, outcome } if bu == from => {
                em.on_finished(idx, mep, outcome, &mut self.em_out);
            }
            Message::RevokedAck { mep } => em.on_revoked_ack(idx, mep, &mut self.em_out),
            _ => self.control_rejected += 1,
        }
    }

    /// What the EM tells the BUs of the run's sources and of the MEPs it
    /// took from a BU it had lost (acknowledged, whether this BU had them
    /// or not); a node without a BU ignores the former and rejects the
    /// latter.
    fn on_em_to_bu(&mut self, now: Nanos, msg: Message) {
        let Some(b) = &mut self.bu else {
            if matches!(msg, Message::Revoked { .. }) {
                self.control_rejected += 1;
            }
            return;
        };
        match msg {
            Message::SourceDown { source, from_mep } => {
                b.on_source_down(now, source, from_mep, &mut self.bu_out);
            }
            Message::SourceUp { source, from_mep } => {
                b.on_source_up(source, from_mep, &mut self.bu_out);
            }
            Message::Revoked { mep } => {
                b.on_revoked(mep, &mut self.bu_out);
                self.route(self.layout.em, Message::RevokedAck { mep });
            }
            _ => {}
        }
    }

    /// The adaptive slots' messages: an RU's report to the EM, the EM's
    /// new slot length to the RU. From anyone else: rejected.
    fn on_slot_control(&mut self, msg: Message, from_em: bool, from_ru: bool) {
        match msg {
            Message::SlotReport {
                served,
                overran,
                stretch,
            } if from_ru => match &mut self.em {
                Some(em) => em.on_slot_report(served, overran, stretch, &mut self.em_out),
                None => self.control_rejected += 1,
            },
            Message::SlotLength {
                from,
                start_ns,
                slot_ns,
            } if from_em => {
                if let Some(r) = &mut self.ru {
                    r.set_slot_epoch(crate::slots::SlotEpoch {
                        from,
                        start_ns,
                        slot_ns,
                    });
                    r.on_timeout(&mut self.ru_out);
                }
            }
            _ => self.control_rejected += 1,
        }
    }

    /// The EM assigned `count` consecutive MEPs from `first` to the BUs in
    /// turn, starting at BU index `first_bu`; a run out of bounds is
    /// rejected whole.
    fn on_assign_run(&mut self, now: Nanos, first: MepId, count: u32, first_bu: u16) {
        let b = self.layout.bus();
        if count > MAX_ASSIGN_RUN
            || usize::from(first_bu) >= b
            || first.checked_add(u64::from(count)).is_none()
        {
            self.control_rejected += 1;
            return;
        }
        for k in 0..u64::from(count) {
            let bu = self.layout.bu_nodes[(usize::from(first_bu) + k as usize) % b];
            self.on_assigned(now, first + k, bu, false);
        }
    }

    /// The EM answered a clock probe: the clock takes the sample, the RU
    /// its slot offset once the clock has settled, and the next probe is
    /// planned.
    fn on_clock_reply(&mut self, now: Nanos, sent: u64, em_time: u64) {
        if let Some(clock) = &mut self.clock {
            clock.on_reply(sent, em_time, now);
            if let Some(ru) = &mut self.ru {
                ru.set_clock_offset(clock.is_settled().then(|| clock.offset_at(now)));
                // Held fragments may go now that the slots are known.
                ru.on_timeout(&mut self.ru_out);
            }
        }
        self.probe_clock(now);
    }

    /// The EM asks which MEPs of lost BU `bu` this RU still holds (decision
    /// round `round`).
    fn on_bu_lost(&mut self, bu: NodeId, round: u32) {
        let Some(r) = &mut self.ru else {
            self.control_rejected += 1;
            return;
        };
        // Listed to the EM on this node's connection to it, in order,
        // closed by HoldingDone.
        let held = r.on_bu_lost(bu, round);
        let replies = held
            .into_iter()
            .map(|mep| Message::Holding { round, mep })
            .chain([Message::HoldingDone { round }]);
        for msg in replies {
            self.route(self.layout.em, msg);
        }
    }

    /// MEP `mep` is built on node `bu` (`again`: re-assigned from a lost BU).
    fn on_assigned(&mut self, now: Nanos, mep: MepId, bu: NodeId, again: bool) {
        self.seen_up_to = self.seen_up_to.max(mep.saturating_add(1));
        if bu == self.id {
            if let Some(b) = &mut self.bu {
                if again {
                    b.on_reassigned(mep);
                }
                b.on_assign(now, mep, &mut self.bu_out);
            }
        }
        if let Some(r) = &mut self.ru {
            if again {
                r.on_reassign(mep, bu, &mut self.ru_out);
            } else {
                r.on_assign(mep, bu, &mut self.ru_out);
            }
        }
    }

    /// Turns the units' outputs into actions, delivering messages between
    /// units of this node directly, until nothing is left.
    fn flush(&mut self, now: Nanos) {
        loop {
            let mut progressed = false;
            for (to, msg) in std::mem::take(&mut self.em_out) {
                progressed = true;
                self.route(to, msg);
            }
            for a in std::mem::take(&mut self.ru_out) {
                progressed = true;
                let action = self.ru_action(a);
                self.actions.push_back(action);
            }
            for a in std::mem::take(&mut self.bu_out) {
                progressed = true;
                self.on_bu_action(a);
            }
            for a in std::mem::take(&mut self.fu_out) {
                progressed = true;
                self.actions.push_back(match a {
                    FuAction::Credit { bu, credits } => Action::Send {
                        to: bu,
                        msg: Message::ConsumerCredit {
                            fu: self.id,
                            credits,
                        },
                    },
                    FuAction::Consumed { mep, bu } => Action::Consumed { mep, bu },
                });
            }
            while let Some(msg) = self.internal.pop_front() {
                progressed = true;
                self.dispatch(now, self.id, msg);
            }
            if !progressed {
                break;
            }
        }
        self.pacer_wake = self.release_paced();
        self.release_replies(now);
        // The EM holds new assignments while its node still holds old ones.
        if let Some(em) = &mut self.em {
            em.set_control_backlog(!self.pacer.is_empty());
        }
        self.check_done();
        let em_lost = self.is_peer_lost(self.layout.em);
        let ended = self.end_of_run.is_some();
        if !self.done {
            self.drain.update(now, &self.timers, ended, em_lost);
        }
    }

    /// What the driver does for an output of the RU: a fragment to this
    /// node's own BU goes in memory when `event_builder.local` says so.
    #[inline]
    fn ru_action(&self, a: RuAction) -> Action {
        match a {
            RuAction::Produce { mep } => Action::Produce { mep },
            RuAction::Send { to, header }
                if to == self.id && self.local == LocalTraffic::Memory =>
            {
                Action::HandOver { header }
            }
            RuAction::Send { to, header } => Action::SendFragment { to, header },
            RuAction::Release { mep } => Action::Release { mep },
        }
    }

    /// Carries out an output of the BU: a message to an RU or the EM (kept
    /// here when that unit is on this node), or an action for the driver.
    #[inline]
    fn on_bu_action(&mut self, a: BuAction) {
        match a {
            BuAction::Request { mep, ru } => self.route(ru, Message::Request { mep, bu: self.id }),
            BuAction::Abandon { mep, ru } => self.route(ru, Message::Abandon { mep, bu: self.id }),
            BuAction::Credit { credits } => {
                let msg = Message::Credit {
                    bu: self.id,
                    credits,
                };
                if self.layout.em == self.id {
                    self.internal.push_back(msg);
                } else if self.end_of_run.is_none() {
                    self.actions.push_back(Action::Send {
                        to: self.layout.em,
                        msg,
                    });
                }
            }
            BuAction::Finished { mep, outcome } => {
                // Always, even after the end of the run: it is the EM's
                // accounting.
                let msg = Message::Finished {
                    mep,
                    bu: self.id,
                    outcome,
                };
                self.route(self.layout.em, msg);
            }
            BuAction::Deliver {
                to,
                mep,
                events,
                bytes,
                partial,
            } => self.actions.push_back(Action::Deliver {
                to,
                mep,
                events,
                bytes,
                partial,
            }),
            BuAction::Confirmed { mep } => self.actions.push_back(Action::Confirmed { mep }),
            BuAction::Finish {
                mep,
                outcome,
                events,
                bytes,
                partial,
            } => self.actions.push_back(Action::Finish {
                mep,
                outcome,
                events,
                bytes,
                partial,
            }),
        }
    }

    /// The node is done: no more heartbeats, no more judging its peers
    /// (they stop expecting it to speak once it said goodbye).
    fn set_done(&mut self) {
        self.done = true;
        self.watch.stop();
        self.actions.push_back(Action::Done);
    }

    fn check_done(&mut self) {
        if self.done || self.end_of_run.is_none() {
            return;
        }
        let ru_idle = self.ru.as_ref().is_none_or(ReadoutUnit::is_idle);
        let bu_idle = self.bu.as_ref().is_none_or(BuilderUnit::is_idle);
        if bu_idle && self.bu.is_some() && !self.output_ended {
            // Ordered after every delivery on each link: the consumers'
            // signal that this BU is through.
            self.output_ended = true;
            for &fu in &self.layout.fu_nodes {
                self.actions.push_back(Action::Send {
                    to: fu,
                    msg: Message::OutputEnd { bu: self.id },
                });
            }
        }
        // The EM stays until every MEP is accounted for.
        let em_idle = self.em.as_ref().is_none_or(|e| e.outstanding() == 0);
        let fu_idle = self.fu.as_ref().is_none_or(FilterUnit::is_finished);
        if ru_idle && bu_idle && em_idle && fu_idle && self.pacer.is_empty() {
            self.set_done();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input older than the last one is a broken driver: refused in
    /// every build, naming the two times.
    #[test]
    #[should_panic(expected = "time went back, an input at 5 ns after one at 10 ns")]
    fn time_going_back_is_refused() {
        let config = Config::default();
        let layout = Layout::from_config(&config);
        let mut node = Node::new(&config, &layout, 1);
        node.start(10);
        node.on_peer_alive(5, 0);
    }

    /// The liveness timers run through the node: heartbeats to its idle
    /// peers, a silent peer dropped (and lost to its units), the drain
    /// ending a run cut off from the EM.
    #[test]
    fn a_node_keeps_its_liveness_timers() {
        let config = Config::default();
        let layout = Layout::from_config(&config);
        let mut node = Node::new(&config, &layout, 1);
        let ms = 1_000_000;
        node.start(0);
        while node.poll_action().is_some() {}
        assert_eq!(node.next_deadline(), Some(100 * ms));
        node.on_timeout(100 * ms);
        let beats: Vec<Action> = std::iter::from_fn(|| node.poll_action()).collect();
        for to in [0, 2, 3] {
            assert!(
                beats.contains(&Action::Send {
                    to,
                    msg: Message::Heartbeat
                }),
                "{beats:?}"
            );
        }
        // Nodes 0 (the EM's), 2 and 3 speak; node 2 falls silent.
        let mut t = 100 * ms;
        let mut dropped = Vec::new();
        while t < 2000 * ms {
            t += 50 * ms;
            for from in [0, 3] {
                node.on_message(t, from, Message::Heartbeat);
            }
            if node.next_deadline().is_some_and(|d| d <= t) {
                node.on_timeout(t);
            }
            while let Some(a) = node.poll_action() {
                if let Action::DropPeer { peer, silent_ns } = a {
                    dropped.push((peer, t, silent_ns));
                }
            }
        }
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        let (peer, at, silent) = dropped[0];
        assert_eq!(peer, 2);
        assert!((900 * ms..=1000 * ms).contains(&at), "{at}");
        assert!(silent > 800 * ms, "{silent}");
        assert!(node.is_peer_lost(2));
        assert!(node.em().is_none() && !node.is_done());
        // The EM's node is lost: 10 s later the drain ends the run.
        node.on_peer_lost(t, 0);
        let lost_em = t;
        let mut ended = t;
        while !node.is_done() {
            ended = node.next_deadline().expect("a timer runs");
            node.on_timeout(ended);
        }
        assert_eq!(
            ended,
            lost_em + 10_000 * ms,
            "em_lost_wait_ms after the loss"
        );
        let actions: Vec<Action> = std::iter::from_fn(|| node.poll_action()).collect();
        assert!(
            actions.iter().any(|a| matches!(
                a,
                Action::DrainTimedOut {
                    without_em: true,
                    ..
                }
            )),
            "{actions:?}"
        );
        assert_eq!(actions.last(), Some(&Action::Done));
        assert!(node.drain_timed_out());
        assert!(node
            .next_deadline()
            .is_none_or(|d| d >= lost_em + 10_000 * ms));
    }
}
