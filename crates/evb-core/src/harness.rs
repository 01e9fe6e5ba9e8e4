//! A deterministic in-memory network that drives the nodes of a run under
//! simulated time: the protocol tested without sockets or threads.
//!
//! Each connection delivers in order (as TCP does) with a seeded random
//! latency; fragments take time in proportion to their size. Faults can be
//! injected: corrupt one fragment, silence one source, and the node faults
//! every driver shares ([`NodeFault`]): crash a node (and restart it: a
//! fresh incarnation that rejoins the run), hang a node (it stops, its
//! connections stay open: only the silence timers find it), or hang one
//! then resume it, a stall (a process descheduled on a loaded machine).
//! Every action is logged, so the same seed must give the same log, and
//! the harness checks the credit invariant at every step. With consumers,
//! deliveries travel like fragments and the consumer credits are checked
//! as well.
//!
//! The harness plays the transport's part in liveness as the runtime's
//! transports do: heartbeats travel like any message, a node that is done
//! says goodbye to every peer, and a link a node gives up
//! ([`Action::DropPeer`]) carries nothing more and closes, which its
//! other end learns.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::bu::{Nanos, Outcome};
use crate::config::Config;
use crate::fault::{FaultKind, NodeFault};
use crate::layout::Layout;
use crate::node::{Action, Node};
use crate::source::SourceModel;
use crate::wire::{FragmentHeader, MepId, Message, NodeId};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Message {
        to: NodeId,
        from: NodeId,
        msg: MessageKey,
    },
    Fragment {
        to: NodeId,
        from: NodeId,
        header: HeaderKey,
        crc: u32,
    },
    SendComplete {
        node: NodeId,
        mep: MepId,
    },
    Stop,
    /// The node dies: it takes no more input.
    Crash {
        node: NodeId,
    },
    /// The node stops (hung, or SIGSTOP): it takes no more input and
    /// sends nothing, but its connections stay open.
    Hang {
        node: NodeId,
    },
    /// `to` learns that `peer` is gone (heartbeat or connection loss).
    PeerLost {
        to: NodeId,
        peer: NodeId,
    },
    /// A crashed node starts again, fresh, and rejoins: every survivor
    /// learns of it before anything the new incarnation sends arrives.
    Restart {
        node: NodeId,
    },
    /// A link given up between two live nodes comes back
    /// ([`Faults::relink_ns`]).
    Relink {
        a: NodeId,
        b: NodeId,
    },
}

/// Orderable copies of wire types for the event queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct MessageKey(u8, u64, u64, u64);
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct HeaderKey(u64, u16, u16);

/// Faults to inject.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// (MEP, source index) whose fragment arrives with a bad CRC.
    pub corrupt: BTreeSet<(MepId, u16)>,
    /// Source indices whose fragments are never delivered.
    pub silent_sources: BTreeSet<u16>,
    /// Node faults, in any order, each at its time (ns):
    /// - [`FaultKind::Crash`]: the node dies; its connections close, and
    ///   every other node learns of it `detection_ns` later (after what
    ///   was already on the connection arrived).
    /// - [`FaultKind::Restart`] of a crashed node: the first one at or
    ///   after its crash brings it back, fresh, at that time or once every
    ///   survivor has noticed the death if that is later (as a real
    ///   restart on the same port can only be accepted then). Not after
    ///   the end of the run.
    /// - [`FaultKind::Hang`]: no more input or output, its connections
    ///   stay open; the others find it by its silence.
    /// - [`FaultKind::Hang`] then [`FaultKind::Resume`] of the same node: a
    ///   stall. What is sent to it waits, its timers wait, it sends
    ///   nothing; then it carries on, its timers first (a process
    ///   descheduled, then run again).
    pub nodes: Vec<NodeFault>,
    /// How long a crash takes to reach the other nodes: the transport's
    /// report of a closed connection (a hang has none: only the core's
    /// silence timers find it).
    pub detection_ns: Nanos,
    /// A link one end gave up while both ends live (a stall past the
    /// peer timeout) comes back this long after, once neither end is
    /// stalled, as the transports re-dial or relink it: both ends see the
    /// other join, and nothing sent on the old link arrives after. `None`:
    /// it stays down (a restart alone brings a node back).
    pub relink_ns: Option<Nanos>,
    /// Messages lost with their link: for each entry, the next message of
    /// that kind any node sends is lost as it leaves, and its link breaks
    /// with it (both ends lose each other `detection_ns` later; it comes
    /// back after `relink_ns`, if set, as a link given up does). A
    /// `Revoked` lost in transit, say, or its acknowledgement.
    pub lose_with_link: Vec<crate::wire::Kind>,
}

impl Faults {
    /// The first fault of `kind` of `node` at or after `from` and before
    /// the next fault of kind `until` of that node, if any: the restart
    /// that follows a crash, the resume that ends a hang.
    fn next_of(
        &self,
        node: NodeId,
        from: Nanos,
        kind: FaultKind,
        until: FaultKind,
    ) -> Option<Nanos> {
        let next = self
            .nodes
            .iter()
            .filter(|f| f.node == node && f.kind == kind && f.at >= from)
            .map(|f| f.at)
            .min()?;
        let interrupted = self
            .nodes
            .iter()
            .any(|f| f.node == node && f.kind == until && from < f.at && f.at < next);
        (!interrupted).then_some(next)
    }

    /// The stalls: a hang and the resume that ends it, (node, from, until).
    fn stalls(&self) -> Vec<(NodeId, Nanos, Nanos)> {
        self.nodes
            .iter()
            .filter(|f| f.kind == FaultKind::Hang)
            .filter_map(|f| {
                let after = f.at.saturating_add(1);
                let until = self.next_of(f.node, after, FaultKind::Resume, FaultKind::Hang)?;
                Some((f.node, f.at, until))
            })
            .collect()
    }
}

/// What a harness run produced.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One line per action, in order: the determinism fingerprint.
    pub log: Vec<String>,
    /// MEPs built, with the number of times each was built.
    pub built: BTreeMap<MepId, u32>,
    pub outcomes: BTreeMap<MepId, Outcome>,
    pub meps_assigned: u64,
    /// Destinations of each RU's fragments, in the order they were sent.
    pub send_order: BTreeMap<NodeId, Vec<NodeId>>,
    /// Most batches ever assigned and unfinished on one BU.
    pub max_outstanding: u32,
    pub all_done: bool,
    pub end_time: Nanos,
    /// Final counters of every node.
    pub stats: Vec<crate::node::NodeStats>,
    /// Built batches delivered to a consumer, and consumed, with counts.
    pub delivered: BTreeMap<MepId, u32>,
    pub consumed: BTreeMap<MepId, u32>,
    /// Built batches a BU saw confirmed by a consumer's credit (or gave up
    /// delivering again), with counts.
    pub confirmed: BTreeMap<MepId, u32>,
    /// Deliveries made while the consumer had granted no credit to that BU.
    pub consumer_credit_violations: u64,
    /// Most batches delivered and not yet consumed on one (BU, FU) pair.
    pub max_consumer_outstanding: u32,
    /// When the crashed node restarted and rejoined, if it did.
    pub restarted_at: Option<Nanos>,
    /// Per node: whether its RU ended holding nothing (`None`: no RU).
    pub ru_idle: Vec<Option<bool>>,
    /// Links given up for silence: (by node, peer, when).
    pub drops: Vec<(NodeId, NodeId, Nanos)>,
    /// Drains that ran out: (node, when, without the EM).
    pub drain_timeouts: Vec<(NodeId, Nanos, bool)>,
    /// Per node: MEPs assigned to its BU that it never finished.
    pub unfinished: BTreeMap<NodeId, usize>,
}

impl Report {
    /// A BU counter summed over every node.
    pub fn bu_total(&self, counter: fn(&crate::bu::BuStats) -> u64) -> u64 {
        self.stats
            .iter()
            .filter_map(|s| s.bu.as_ref())
            .map(counter)
            .sum()
    }
}

pub struct Harness {
    pub config: Config,
    pub layout: Layout,
    pub nodes: Vec<Node>,
    pub faults: Faults,
    /// The stalls of `faults` (a hang, then a resume), found at the start
    /// of the run: (node, from, until).
    stalls: Vec<(NodeId, Nanos, Nanos)>,
    rng: Pcg64Mcg,
    now: Nanos,
    seq: u64,
    queue: BinaryHeap<Reverse<(Nanos, u64, Event)>>,
    /// Per (from, to): time of the last delivery, for per-connection order.
    last_delivery: BTreeMap<(NodeId, NodeId), Nanos>,
    headers: BTreeMap<(MepId, u16, u16), FragmentHeader>,
    sources: Vec<SourceModel>,
    /// Assigned-but-unfinished batches per BU node.
    outstanding: BTreeMap<NodeId, BTreeSet<MepId>>,
    scratch: Vec<u32>,
    pub bytes_per_ns: f64,
    crashed: BTreeSet<NodeId>,
    /// Per restarted node: events queued up to this sequence number were
    /// meant for its earlier incarnation, and are dropped.
    restart_mark: BTreeMap<NodeId, u64>,
    /// Per (to, from): events scheduled up to this sequence number were
    /// sent on a link that was given up and relinked since.
    relink_mark: BTreeMap<(NodeId, NodeId), u64>,
    /// Per (BU, FU): credit granted (as sent) and not yet used.
    consumer_credit: BTreeMap<(NodeId, NodeId), i64>,
    /// Per (BU, FU): delivered, not yet consumed.
    consumer_outstanding: BTreeMap<(NodeId, NodeId), u32>,
    /// Links given up: (to, from) carries nothing more from `from`.
    cut: BTreeSet<(NodeId, NodeId)>,
    report: Report,
}

impl Harness {
    pub fn new(config: Config, seed: u64) -> Harness {
        let layout = Layout::from_config(&config);
        let nodes = (0..layout.endpoints)
            .map(|i| Node::new(&config, &layout, i))
            .collect();
        let sources = (0..layout.rus() as u16)
            .map(|s| SourceModel::new(&config, s))
            .collect();
        Harness {
            config,
            layout,
            nodes,
            faults: Faults::default(),
            stalls: Vec::new(),
            rng: Pcg64Mcg::seed_from_u64(seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            last_delivery: BTreeMap::new(),
            headers: BTreeMap::new(),
            sources,
            outstanding: BTreeMap::new(),
            scratch: Vec::new(),
            bytes_per_ns: 10.0,
            crashed: BTreeSet::new(),
            restart_mark: BTreeMap::new(),
            relink_mark: BTreeMap::new(),
            consumer_credit: BTreeMap::new(),
            consumer_outstanding: BTreeMap::new(),
            cut: BTreeSet::new(),
            report: Report::default(),
        }
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, event)));
    }

    /// Delivery time on connection (from, to): random latency, in order.
    fn delivery_time(&mut self, from: NodeId, to: NodeId, extra: Nanos) -> Nanos {
        let latency = self.rng.gen_range(1_000..20_000) + extra;
        let last = self.last_delivery.entry((from, to)).or_insert(0);
        let at = (self.now + latency).max(*last + 1);
        *last = at;
        at
    }

    /// Runs until every node is done or `limit` of simulated time passes;
    /// stops the EM at `stop_at` (if the run has no MEP limit).
    pub fn run(mut self, stop_at: Option<Nanos>, limit: Nanos) -> Report {
        if let Some(t) = stop_at {
            self.schedule(t, Event::Stop);
        }
        self.stalls = self.faults.stalls();
        for fault in self.faults.nodes.clone() {
            let NodeFault { node, at, kind } = fault;
            match kind {
                FaultKind::Crash => self.schedule(at, Event::Crash { node }),
                // A hang that a resume ends is a stall, not an event.
                FaultKind::Hang if !self.stalls.iter().any(|s| (s.0, s.1) == (node, at)) => {
                    self.schedule(at, Event::Hang { node });
                }
                // Resumes end stalls; restarts follow their crash.
                FaultKind::Hang | FaultKind::Resume | FaultKind::Restart => {}
            }
        }
        for i in 0..self.nodes.len() {
            self.nodes[i].start(0);
            self.drain(i as NodeId);
        }
        let mut spins = 0u64;
        while self.alive().any(|i| !self.nodes[i].is_done()) {
            let next_timer = self
                .alive()
                .filter_map(|i| {
                    let d = self.nodes[i].next_deadline()?;
                    Some(self.thawed(i as NodeId, d))
                })
                .min();
            let next_event = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let t = match (next_timer, next_event) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => break,
            };
            if t > limit {
                break;
            }
            // A node whose deadline never clears would spin here for ever:
            // fail loudly instead, with what each node still waits for.
            if t <= self.now {
                spins += 1;
                assert!(
                    spins < 1_000_000,
                    "no progress at t={t}: {:?}\n{}",
                    self.alive()
                        .map(|i| (i, self.nodes[i].pending_work()))
                        .collect::<Vec<_>>(),
                    self.report.log[self.report.log.len().saturating_sub(40)..].join("\n")
                );
            } else {
                spins = 0;
            }
            self.now = self.now.max(t);
            if next_timer == Some(t) {
                for i in 0..self.nodes.len() {
                    if self.crashed.contains(&(i as NodeId)) || self.frozen(i as NodeId, self.now) {
                        continue;
                    }
                    if self.nodes[i].next_deadline().is_some_and(|d| d <= self.now) {
                        self.nodes[i].on_timeout(self.now);
                        self.drain(i as NodeId);
                    }
                }
                continue;
            }
            let Reverse((_, seq, event)) = self.queue.pop().expect("peeked");
            self.handle(event, seq);
        }
        let all_done = self.alive().all(|i| self.nodes[i].is_done());
        self.report.all_done = all_done;
        self.report.meps_assigned = self.nodes[self.layout.em as usize]
            .em()
            .map_or(0, |e| e.meps_assigned());
        self.report.end_time = self.now;
        self.report.stats = self.nodes.iter().map(Node::stats).collect();
        self.report.ru_idle = self
            .nodes
            .iter()
            .map(|n| n.ru().map(crate::ru::ReadoutUnit::is_idle))
            .collect();
        self.report.unfinished = self
            .outstanding
            .iter()
            .map(|(&n, set)| (n, set.len()))
            .collect();
        self.report
    }

    /// The stall of node `node` at `t`, if it is stalled then: its end.
    fn stall_end(&self, node: NodeId, t: Nanos) -> Option<Nanos> {
        self.stalls
            .iter()
            .find(|&&(n, from, until)| n == node && from <= t && t < until)
            .map(|s| s.2)
    }

    /// Node `node` is stalled at `t` (a hang that a resume ends).
    fn frozen(&self, node: NodeId, t: Nanos) -> bool {
        self.stall_end(node, t).is_some()
    }

    /// When something due at `t` for `node` happens: at `t`, or when its
    /// stall ends.
    fn thawed(&self, node: NodeId, t: Nanos) -> Nanos {
        self.stall_end(node, t).unwrap_or(t)
    }

    /// Indices of the nodes that have not crashed.
    fn alive(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|i| !self.crashed.contains(&(*i as NodeId)))
    }

    fn handle(&mut self, event: Event, seq: u64) {
        let now = self.now;
        let target = match &event {
            Event::Message { to, .. } | Event::Fragment { to, .. } | Event::PeerLost { to, .. } => {
                Some(*to)
            }
            Event::SendComplete { node, .. } => Some(*node),
            Event::Stop => Some(self.layout.em),
            Event::Crash { .. }
            | Event::Hang { .. }
            | Event::Restart { .. }
            | Event::Relink { .. } => None,
        };
        if target.is_some_and(|t| self.crashed.contains(&t)) {
            return; // The dead take no input.
        }
        // (The operator's stop is for whichever incarnation of the EM runs.)
        let on_a_link = !matches!(event, Event::Stop);
        if on_a_link && target.is_some_and(|t| self.restart_mark.get(&t).is_some_and(|&m| seq <= m))
        {
            return; // Meant for an earlier incarnation: its connections are gone.
        }
        if let Some(t) = target.filter(|&t| self.frozen(t, now)) {
            // Waits for the stalled node, in order.
            let at = self.thawed(t, now);
            self.schedule(at, event);
            return;
        }
        if let Event::Message { to, from, .. } | Event::Fragment { to, from, .. } = &event {
            if self.cut.contains(&(*to, *from)) {
                return; // The link was given up: nothing more from it.
            }
            if self
                .relink_mark
                .get(&(*to, *from))
                .is_some_and(|&m| seq <= m)
            {
                return; // Sent on the old link, which is gone.
            }
        }
        match event {
            Event::Hang { node } => {
                self.crashed.insert(node);
            }
            Event::Crash { node } => self.crash(node),
            Event::Restart { node } => self.restart(node),
            Event::Relink { a, b } => self.relink(a, b),
            Event::PeerLost { to, peer } => {
                self.nodes[to as usize].on_peer_lost(now, peer);
                self.drain(to);
            }
            Event::Stop => {
                let em = self.layout.em;
                self.nodes[em as usize].stop(now);
                self.drain(em);
            }
            Event::Message { to, from, msg } => {
                let msg = decode_key(msg);
                self.nodes[to as usize].on_message(now, from, msg);
                self.drain(to);
            }
            Event::Fragment {
                to,
                from,
                header,
                crc,
            } => {
                let h = self.headers[&(header.0, header.1, header.2)];
                let node = &mut self.nodes[to as usize];
                if node.admit_fragment(now, from, &h) == crate::bu::Admit::Keep {
                    node.on_fragment(now, &h, crc);
                }
                self.drain(to);
            }
            Event::SendComplete { node, mep } => {
                self.nodes[node as usize].on_send_complete(now, mep);
                self.drain(node);
            }
        }
    }

    /// Node `node` crashes now: each peer notices the lost connection
    /// after the detection time (and after what was already on the
    /// connection), and a restart planned for it comes after all of them have.
    fn crash(&mut self, node: NodeId) {
        let now = self.now;
        self.crashed.insert(node);
        let at = now + self.faults.detection_ns;
        let mut all_noticed = at;
        for to in 0..self.nodes.len() as NodeId {
            if to != node {
                // A connection reports its loss after delivering what
                // was already on it.
                let last = self.last_delivery.get(&(node, to)).copied().unwrap_or(0);
                let lost_at = at.max(last + 1);
                all_noticed = all_noticed.max(lost_at);
                self.schedule(lost_at, Event::PeerLost { to, peer: node });
            }
        }
        let restart = self
            .faults
            .next_of(node, now, FaultKind::Restart, FaultKind::Crash);
        if let Some(t) = restart {
            self.schedule(t.max(all_noticed + 1), Event::Restart { node });
        }
    }

    /// The link between `a` and `b` breaks now: nothing more crosses it,
    /// both ends learn it after the detection time, and it comes back as
    /// a link given up does.
    fn break_link(&mut self, a: NodeId, b: NodeId) {
        let now = self.now;
        self.report.drops.push((a, b, now));
        self.cut.insert((a, b));
        self.cut.insert((b, a));
        let at = now + self.faults.detection_ns;
        self.schedule(at, Event::PeerLost { to: a, peer: b });
        self.schedule(at, Event::PeerLost { to: b, peer: a });
        if let Some(d) = self.faults.relink_ns {
            self.schedule(at + d, Event::Relink { a, b });
        }
    }

    /// The link between live nodes `a` and `b`, given up, comes back: once
    /// neither is stalled, both see the other join.
    fn relink(&mut self, a: NodeId, b: NodeId) {
        let now = self.now;
        if self.crashed.contains(&a) || self.crashed.contains(&b) {
            return; // A restart brings a dead node back, not a relink.
        }
        let thawed = self.thawed(a, now).max(self.thawed(b, now));
        if thawed > now {
            let again = thawed + self.faults.relink_ns.unwrap_or(0);
            self.schedule(again, Event::Relink { a, b });
            return;
        }
        if !self.cut.remove(&(a, b)) & !self.cut.remove(&(b, a)) {
            return; // Already back (the other end gave it up too).
        }
        self.relink_mark.insert((a, b), self.seq);
        self.relink_mark.insert((b, a), self.seq);
        self.forget_consumer_link(a, b);
        self.nodes[a as usize].on_peer_joined(now, b);
        self.drain(a);
        self.nodes[b as usize].on_peer_joined(now, a);
        self.drain(b);
    }

    /// The consumer credit granted and the deliveries made over the link
    /// between `a` and `b` are void once it is gone: a new link (or a new
    /// incarnation) starts from a new grant.
    fn forget_consumer_link(&mut self, a: NodeId, b: NodeId) {
        for key in [(a, b), (b, a)] {
            self.consumer_credit.remove(&key);
            self.consumer_outstanding.remove(&key);
        }
    }

    /// Node `node` comes back as a new incarnation, unless the run it would
    /// rejoin is over.
    fn restart(&mut self, node: NodeId) {
        let now = self.now;
        let em = self.layout.em as usize;
        // A restarted EM takes the run over; another node rejoins
        // only a run that goes on.
        let ended = node as usize != em
            && (self.crashed.contains(&(em as NodeId))
                || self.nodes[em].em().is_none_or(|e| e.is_stopped()));
        if ended {
            return; // Too late: the run is over.
        }
        self.crashed.remove(&node);
        self.cut.retain(|&(to, from)| to != node && from != node);
        self.restart_mark.insert(node, self.seq);
        self.outstanding.remove(&node);
        for other in 0..self.nodes.len() as NodeId {
            self.forget_consumer_link(node, other);
        }
        self.report.restarted_at = Some(now);
        // The survivors accept the new incarnation's connections
        // before anything arrives on them.
        for to in 0..self.nodes.len() as NodeId {
            if to != node && !self.crashed.contains(&to) {
                self.nodes[to as usize].on_peer_joined(now, node);
                self.drain(to);
            }
        }
        self.nodes[node as usize] = Node::new(&self.config, &self.layout, node);
        self.nodes[node as usize].rejoining();
        if node as usize == em {
            // It learns from the survivors how far the run got.
            let wait = 3 * self.faults.detection_ns.max(1);
            self.nodes[node as usize].resume_em(wait);
        }
        self.nodes[node as usize].start(now);
        self.drain(node);
    }

    fn crc_for(&self, h: &FragmentHeader) -> u32 {
        if self.faults.corrupt.contains(&(h.mep, h.source)) {
            h.crc32c ^ 0xdead_beef
        } else {
            h.crc32c
        }
    }

    /// Node `id` sends `msg` to `to`: the consumer credit and BU
    /// assignments it carries are counted, and it arrives after the link's
    /// latency.
    fn send_message(&mut self, id: NodeId, to: NodeId, msg: Message) {
        if let Some(i) = self
            .faults
            .lose_with_link
            .iter()
            .position(|&k| k == msg.kind())
        {
            self.faults.lose_with_link.remove(i);
            self.report.log.push(format!(
                "t={} lost with its link: n{id} -> n{to} {msg:?}",
                self.now
            ));
            self.break_link(id, to);
            return;
        }
        if let Message::ConsumerCredit { fu, credits } = msg {
            *self.consumer_credit.entry((to, fu)).or_insert(0) += i64::from(credits);
        }
        let mut assigned = msg.assignments(&self.layout.bu_nodes);
        if let Message::Reassign { mep, bu } = msg {
            assigned.push((mep, bu));
        }
        for (mep, bu) in assigned {
            if to == bu {
                let set = self.outstanding.entry(bu).or_default();
                set.insert(mep);
                self.report.max_outstanding = self.report.max_outstanding.max(set.len() as u32);
            }
        }
        let at = self.delivery_time(id, to, 0);
        self.schedule(
            at,
            Event::Message {
                to,
                from: id,
                msg: encode_key(msg),
            },
        );
    }

    /// RU `id` reads out MEP `mep`: its header (with a stand-in CRC) is
    /// kept for the fragments and the RU learns the MEP is ready.
    fn produce(&mut self, id: NodeId, mep: u64) {
        let now = self.now;
        let source = self.layout.ru_of[id as usize].expect("an RU produces");
        let mut h = self.sources[source as usize].describe(mep, &mut self.scratch);
        // No bytes here: a stand-in CRC that corruption can break.
        h.crc32c = crate::source::mix64(mep ^ u64::from(source)) as u32;
        self.headers.insert((mep, source, 0), h);
        self.nodes[id as usize].on_mep_ready(now, h);
    }

    /// Node `id` sends a fragment to `to`: the send completes after the
    /// transfer, and the fragment arrives then unless its source is silent.
    fn send_fragment(&mut self, id: NodeId, to: NodeId, header: &FragmentHeader) {
        self.report.send_order.entry(id).or_default().push(to);
        let transfer = (f64::from(header.payload_len) / self.bytes_per_ns) as Nanos;
        let at = self.delivery_time(id, to, transfer);
        self.schedule(
            at,
            Event::SendComplete {
                node: id,
                mep: header.mep,
            },
        );
        if !self.faults.silent_sources.contains(&header.source) {
            let crc = self.crc_for(header);
            self.schedule(
                at,
                Event::Fragment {
                    to,
                    from: id,
                    header: HeaderKey(header.mep, header.source, header.flags),
                    crc,
                },
            );
        }
    }

    /// BU `id` delivers batch `mep` to consumer `to`: the consumer's credit
    /// and the batches it holds are counted, and the batch arrives as a
    /// fragment after its transfer.
    fn deliver_batch(
        &mut self,
        id: NodeId,
        to: NodeId,
        mep: u64,
        events: u64,
        bytes: u64,
        partial: bool,
    ) {
        *self.report.delivered.entry(mep).or_insert(0) += 1;
        let credit = self.consumer_credit.entry((id, to)).or_insert(0);
        if *credit <= 0 {
            self.report.consumer_credit_violations += 1;
        }
        *credit -= 1;
        let held = self.consumer_outstanding.entry((id, to)).or_insert(0);
        *held += 1;
        self.report.max_consumer_outstanding = self.report.max_consumer_outstanding.max(*held);
        let sources = self.layout.rus();
        let h = FragmentHeader {
            run_id: self.config.run.run_id,
            source: self.layout.bu_of[id as usize].expect("a BU delivers"),
            flags: crate::wire::FLAG_BATCH
                | if partial {
                    crate::wire::FLAG_PARTIAL
                } else {
                    0
                },
            mep,
            event_count: events as u32,
            payload_len: crate::wire::batch_payload_len(sources, bytes) as u32,
            crc32c: crate::source::mix64(mep ^ 0xba7c) as u32,
        };
        self.headers.insert((mep, h.source, h.flags), h);
        let transfer = (f64::from(h.payload_len) / self.bytes_per_ns) as Nanos;
        let at = self.delivery_time(id, to, transfer);
        self.schedule(
            at,
            Event::Fragment {
                to,
                from: id,
                header: HeaderKey(mep, h.source, h.flags),
                crc: h.crc32c,
            },
        );
    }

    /// Carries out every action node `id` has queued.
    fn drain(&mut self, id: NodeId) {
        while let Some(action) = self.nodes[id as usize].poll_action() {
            self.report
                .log
                .push(format!("t={} n{id} {action:?}", self.now));
            let now = self.now;
            match action {
                Action::Send { to, msg } => self.send_message(id, to, msg),
                Action::Produce { mep } => self.produce(id, mep),
                Action::SendFragment { to, header } => self.send_fragment(id, to, &header),
                Action::HandOver { header } => {
                    self.report.send_order.entry(id).or_default().push(id);
                    if self.faults.silent_sources.contains(&header.source) {
                        self.nodes[id as usize].on_send_complete(now, header.mep);
                    } else {
                        let crc = self.crc_for(&header);
                        self.nodes[id as usize].on_local_fragment(now, &header, crc);
                    }
                }
                Action::Release { .. } => {}
                Action::Done => {
                    // The transport's goodbye, after everything sent.
                    for to in 0..self.nodes.len() as NodeId {
                        if to != id {
                            let at = self.delivery_time(id, to, 0);
                            let msg = encode_key(Message::Goodbye);
                            self.schedule(at, Event::Message { to, from: id, msg });
                        }
                    }
                }
                Action::DropPeer { peer, .. } => {
                    self.report.drops.push((id, peer, now));
                    self.cut.insert((id, peer));
                    // Closing the link: its other end learns of it.
                    let at = self.delivery_time(id, peer, 0);
                    self.schedule(at, Event::PeerLost { to: peer, peer: id });
                    if let Some(d) = self.faults.relink_ns {
                        self.schedule(at + d, Event::Relink { a: id, b: peer });
                    }
                }
                Action::DrainTimedOut { without_em, .. } => {
                    self.report.drain_timeouts.push((id, now, without_em));
                }
                Action::Deliver {
                    to,
                    mep,
                    events,
                    bytes,
                    partial,
                } => self.deliver_batch(id, to, mep, events, bytes, partial),
                Action::Confirmed { mep } => {
                    *self.report.confirmed.entry(mep).or_insert(0) += 1;
                }
                Action::Consumed { mep, bu } => {
                    *self.report.consumed.entry(mep).or_insert(0) += 1;
                    if let Some(held) = self.consumer_outstanding.get_mut(&(bu, id)) {
                        *held = held.saturating_sub(1);
                    }
                }
                Action::Finish { mep, outcome, .. } => {
                    if let Some(set) = self.outstanding.get_mut(&id) {
                        set.remove(&mep);
                    }
                    if outcome == Outcome::Built {
                        *self.report.built.entry(mep).or_insert(0) += 1;
                    }
                    // A revoked batch's fate is its new BU's (or lost).
                    if outcome != Outcome::Revoked {
                        self.report.outcomes.insert(mep, outcome);
                    }
                }
            }
        }
    }
}

fn encode_key(msg: Message) -> MessageKey {
    match msg {
        Message::Credit { bu, credits } => MessageKey(2, bu.into(), credits.into(), 0),
        Message::Assign { mep, bu } => MessageKey(3, mep, bu.into(), 0),
        Message::Request { mep, bu } => MessageKey(4, mep, bu.into(), 0),
        Message::EndOfRun { meps } => MessageKey(6, meps, 0, 0),
        Message::Abandon { mep, bu } => MessageKey(8, mep, bu.into(), 0),
        Message::Finished { mep, bu, outcome } => {
            MessageKey(9, mep, u64::from(bu) | u64::from(outcome) << 16, 0)
        }
        Message::SourceDown { source, from_mep } => MessageKey(10, from_mep, source.into(), 0),
        Message::ConsumerCredit { fu, credits } => MessageKey(11, fu.into(), credits.into(), 0),
        Message::OutputEnd { bu } => MessageKey(12, bu.into(), 0, 0),
        Message::SourceUp { source, from_mep } => MessageKey(13, from_mep, source.into(), 0),
        Message::BuLost { bu, round } => MessageKey(14, bu.into(), round.into(), 0),
        Message::Holding { round, mep } => MessageKey(15, mep, round.into(), 0),
        Message::HoldingDone { round } => MessageKey(16, round.into(), 0, 0),
        Message::ReleaseHeld { round } => MessageKey(17, round.into(), 0, 0),
        Message::Reassign { mep, bu } => MessageKey(18, mep, bu.into(), 0),
        Message::SeenUpTo { next_mep, ended } => MessageKey(20, next_mep, ended.into(), 0),
        Message::AssignRun {
            first,
            count,
            first_bu,
        } => MessageKey(21, first, u64::from(count) | u64::from(first_bu) << 32, 0),
        Message::ClockProbe { sent } => MessageKey(22, sent, 0, 0),
        Message::ClockReply { sent, em_time } => MessageKey(23, sent, em_time, 0),
        Message::Goodbye => MessageKey(24, 0, 0, 0),
        Message::SlotReport {
            served,
            overran,
            stretch,
        } => MessageKey(25, served.into(), overran.into(), stretch.into()),
        Message::SlotLength {
            from,
            start_ns,
            slot_ns,
        } => MessageKey(26, from, start_ns, slot_ns),
        Message::Revoked { mep } => MessageKey(27, mep, 0, 0),
        Message::RevokedAck { mep } => MessageKey(28, mep, 0, 0),
        Message::Hello { .. } | Message::Heartbeat | Message::Fragment(_) => MessageKey(7, 0, 0, 0),
    }
}

fn decode_key(k: MessageKey) -> Message {
    match k.0 {
        2 => Message::Credit {
            bu: k.1 as u16,
            credits: k.2 as u32,
        },
        3 => Message::Assign {
            mep: k.1,
            bu: k.2 as u16,
        },
        4 => Message::Request {
            mep: k.1,
            bu: k.2 as u16,
        },
        6 => Message::EndOfRun { meps: k.1 },
        8 => Message::Abandon {
            mep: k.1,
            bu: k.2 as u16,
        },
        9 => Message::Finished {
            mep: k.1,
            bu: k.2 as u16,
            outcome: (k.2 >> 16) as u8,
        },
        10 => Message::SourceDown {
            from_mep: k.1,
            source: k.2 as u16,
        },
        11 => Message::ConsumerCredit {
            fu: k.1 as u16,
            credits: k.2 as u32,
        },
        12 => Message::OutputEnd { bu: k.1 as u16 },
        13 => Message::SourceUp {
            from_mep: k.1,
            source: k.2 as u16,
        },
        14 => Message::BuLost {
            bu: k.1 as u16,
            round: k.2 as u32,
        },
        15 => Message::Holding {
            mep: k.1,
            round: k.2 as u32,
        },
        16 => Message::HoldingDone { round: k.1 as u32 },
        17 => Message::ReleaseHeld { round: k.1 as u32 },
        18 => Message::Reassign {
            mep: k.1,
            bu: k.2 as u16,
        },
        20 => Message::SeenUpTo {
            next_mep: k.1,
            ended: k.2 != 0,
        },
        21 => Message::AssignRun {
            first: k.1,
            count: k.2 as u32,
            first_bu: (k.2 >> 32) as u16,
        },
        22 => Message::ClockProbe { sent: k.1 },
        23 => Message::ClockReply {
            sent: k.1,
            em_time: k.2,
        },
        24 => Message::Goodbye,
        25 => Message::SlotReport {
            served: k.1 as u32,
            overran: k.2 as u32,
            stretch: k.3 as u32,
        },
        26 => Message::SlotLength {
            from: k.1,
            start_ns: k.2,
            slot_ns: k.3,
        },
        27 => Message::Revoked { mep: k.1 },
        28 => Message::RevokedAck { mep: k.1 },
        _ => Message::Heartbeat,
    }
}
