//! Readout Unit: holds its fragment of every assigned MEP and ships it to
//! the MEP's Builder Unit.
//!
//! PUSH: once a MEP is assigned and its data is ready, it is queued for its
//! BU; the send schedule picks which queue goes next, with at most
//! `parallel_sends` transfers in flight. PULL: the RU answers each request
//! of a BU as soon as the data is ready; the BU paces the requests.
//!
//! A lost BU: the RU stops shipping to it but keeps the fragments it has
//! not handed to the transport ("orphaned"), because the EM may re-assign
//! those MEPs to another BU. On the EM's `BuLost` the RU lists what it
//! still holds of that BU's MEPs; a later `Assign` of such a MEP retargets
//! the entry to its new BU, and `ReleaseHeld` (or the end of the run)
//! drops the rest. Orphans nobody claims are bounded per BU by its
//! credits: beyond that the oldest is released.

use std::collections::{BTreeMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::bu::Nanos;
use crate::config::{Config, LocalTraffic, Protocol, Schedule};
use crate::layout::Layout;
use crate::slots::{SlotClock, SlotEpoch, SlotPlan};
use crate::source::mix64;
use crate::wire::{FragmentHeader, MepId, NodeId};

/// What the RU asks of its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuAction {
    /// Produce the data of `mep`, then call [`ReadoutUnit::on_mep_ready`].
    Produce { mep: MepId },
    /// Ship the fragment to endpoint `to`; call
    /// [`ReadoutUnit::on_send_complete`] when the transport is done with it.
    Send { to: NodeId, header: FragmentHeader },
    /// The data of `mep` is no longer needed.
    Release { mep: MepId },
}

/// Counters of a Readout Unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuStats {
    pub meps_produced: u64,
    pub fragments_sent: u64,
    pub bytes_sent: u64,
    /// Requests for MEPs this RU was never told about, dropped.
    pub requests_unexpected: u64,
    /// Most transfers ever in flight at once.
    pub max_in_flight: u32,
    /// Most assigned MEPs held at once (the RU buffer occupancy).
    pub max_held: u64,
    /// Fragments kept for a lost BU and then shipped to the BU the EM
    /// re-assigned their MEP to.
    pub meps_retargeted: u64,
    /// Fragments kept for a lost BU and then dropped (the EM counted the
    /// MEP lost, or nobody claimed it).
    pub orphans_released: u64,
    /// Slotted barrel: fragments that started after their slot's grace
    /// (behind the RU's previous fragment, or woken late), still within
    /// their slot; and the slots passed with a fragment waiting for them
    /// that could no longer end within the slot (it waits for the slot's
    /// next turn).
    pub late_starts: u64,
    pub slots_missed: u64,
}

/// How a slotted RU's fragments fit their slots, since its last report
/// to the EM ([`crate::wire::Message::SlotReport`]).
#[derive(Debug, Clone)]
struct SlotKeeping {
    /// Fragments whose completion came in, and of those, the ones that
    /// took longer than their slot.
    served: u32,
    overran: u32,
    /// Fragments until the next report: a rotation, the first one
    /// shifted by the source index so that the RUs do not all report in
    /// the same slot.
    due_in: u64,
    /// The least time from a fragment's last byte (expected at the link
    /// rate) to its completion: the host's completion latency, which is
    /// not the slot's to hold.
    completion_floor: Option<Nanos>,
    /// How much longer than at the nominal link rate this RU's fragments
    /// take on its link, in 1/1024: the least of the last rotation's
    /// fragments (those that met no queue show the link's own rate, the
    /// others queueing too). An RU on a slower link than its peers' waits
    /// for its last fragment to leave rather than sending the next one
    /// beside it, and the EM sizes the slots for the slowest link.
    stretch: u64,
    /// The least of this rotation so far.
    least_stretch: u64,
    /// How much longer than its slots allow this RU's fragments take on
    /// its link, in 1/1024 (at least 1): the least of this rotation so far,
    /// and what the last report said.
    least_need: u64,
    need: u64,
}

impl SlotKeeping {
    fn new(source: u16) -> SlotKeeping {
        SlotKeeping {
            served: 0,
            overran: 0,
            due_in: u64::from(source),
            completion_floor: None,
            stretch: 1024,
            least_stretch: u64::MAX,
            least_need: u64::MAX,
            need: 1024,
        }
    }
}

#[derive(Debug, Clone)]
struct Held {
    bu: NodeId,
    assigned: bool,
    header: Option<FragmentHeader>,
    /// PULL: a BU asked for it.
    requested: bool,
    /// Handed to the transport.
    sent: bool,
    /// PULL: the BU gave the batch up before the assignment arrived here.
    abandoned: bool,
    /// Its BU is lost: never shipped there; kept until the EM re-assigns
    /// the MEP or says to drop it.
    orphaned: bool,
    /// The EM's decision round that listed it (`BuLost`), if any.
    round: Option<u32>,
    /// Assigned while this RU had its BU for lost: either the EM has not
    /// noticed the loss yet, or it has already seen the BU come back and
    /// this RU has not (see [`ReadoutUnit::on_bu_joined`]).
    assigned_while_gone: bool,
    /// PULL, orphaned: a request (true) or abandon (false) from another BU
    /// that overtook the EM's re-assignment to it.
    early: Option<(NodeId, bool)>,
    /// Slotted barrel: the slot it was sent in, and when.
    sent_slot: Option<(u64, Nanos)>,
}

impl Held {
    fn new(bu: NodeId) -> Held {
        Held {
            bu,
            assigned: false,
            header: None,
            requested: false,
            sent: false,
            abandoned: false,
            orphaned: false,
            round: None,
            early: None,
            assigned_while_gone: false,
            sent_slot: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ReadoutUnit {
    /// This RU's source index (its position among the RUs).
    source: u16,
    protocol: Protocol,
    schedule: Schedule,
    parallel_sends: u32,
    bu_of: Vec<Option<u16>>,
    held: BTreeMap<MepId, Held>,
    /// PUSH: ready MEPs waiting to be sent, per BU index, in MEP order.
    queues: Vec<VecDeque<MepId>>,
    queued: usize,
    /// Barrel: the next phase (destination BU = source + phase mod N).
    phase: usize,
    /// Per BU index: lost, never to be served again.
    dest_gone: Vec<bool>,
    /// The run has ended: no MEP is coming that a locked barrel could wait for.
    ended: bool,
    /// The driver's clock, as of the last input (set by the node).
    now: Nanos,
    /// Phase-locked barrel: since when the phase's BU has had nothing.
    waiting_since: Option<Nanos>,
    wait_ns: Nanos,
    /// Slotted barrel: the plan, the next slot not yet served (absolute,
    /// on the EM's clock), this node's offset to that clock, and the local
    /// time at which the RU waits for the start of `cursor`'s slot.
    slots: Option<SlotPlan>,
    cursor: Option<u64>,
    clock_offset: i64,
    clock_known: bool,
    slot_wake: Option<Nanos>,
    /// Slotted barrel: the BU of this node when local fragments stay in
    /// memory (they are handed over at once, in no slot).
    local_bu: Option<usize>,
    /// Slotted barrel: where the slots lie (the EM lengthens them when
    /// RUs keep overrunning them), the slot of the fragment just picked,
    /// and what this RU saw of its slots since its last report.
    slot_clock: SlotClock,
    picked_slot: Option<u64>,
    keeping: SlotKeeping,
    rng: Pcg64Mcg,
    in_flight: u32,
    /// Of `in_flight`, fragments on the network (not handed over in
    /// memory).
    net_in_flight: u32,
    /// Slotted barrel: when the last network fragment is expected to have
    /// left the link (its start plus its size at the link rate). The next
    /// one starts no earlier, never beside it on the link.
    link_free_at: Nanos,
    /// Assigned MEPs held (data produced or to be produced, not released).
    held_assigned: u64,
    /// Unassigned requests kept at most (guards against a flood of junk).
    max_orphan_requests: usize,
    orphan_requests: usize,
    /// Orphaned fragments no `BuLost` has listed, kept at most per BU
    /// (its credits: all the EM can have outstanding there).
    max_unclaimed_orphans: usize,
    pub stats: RuStats,
}

impl ReadoutUnit {
    pub fn new(config: &Config, layout: &Layout, source: u16) -> ReadoutUnit {
        let bus = layout.bus();
        ReadoutUnit {
            source,
            protocol: config.event_builder.protocol,
            schedule: config.event_builder.schedule,
            parallel_sends: config.event_builder.parallel_sends,
            bu_of: layout.bu_of.clone(),
            held: BTreeMap::new(),
            queues: vec![VecDeque::new(); bus],
            queued: 0,
            phase: 0,
            dest_gone: vec![false; bus],
            ended: false,
            now: 0,
            waiting_since: None,
            wait_ns: config.event_builder.barrel_wait_us * 1000,
            slots: (config.event_builder.schedule == Schedule::Slotted)
                .then(|| SlotPlan::for_source(config, layout, source)),
            cursor: None,
            clock_offset: 0,
            clock_known: true,
            slot_wake: None,
            local_bu: layout.bu_of[layout.ru_nodes[source as usize] as usize]
                .filter(|_| config.event_builder.local == LocalTraffic::Memory)
                .map(usize::from),
            slot_clock: SlotClock::new(config.slot_ns()),
            picked_slot: None,
            keeping: SlotKeeping::new(source),
            rng: Pcg64Mcg::seed_from_u64(mix64(
                config.run.seed ^ (0xa11 << 20) ^ u64::from(source),
            )),
            in_flight: 0,
            net_in_flight: 0,
            link_free_at: 0,
            held_assigned: 0,
            max_orphan_requests: (config.event_builder.credits as usize * bus).max(16) * 4,
            orphan_requests: 0,
            max_unclaimed_orphans: config.event_builder.credits.max(1) as usize,
            stats: RuStats::default(),
        }
    }

    pub fn source(&self) -> u16 {
        self.source
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// What the RU still holds: (assigned MEPs not yet released, of which
    /// queued to send), for diagnostics.
    pub fn holding(&self) -> (usize, usize) {
        (
            self.held.values().filter(|h| h.assigned).count(),
            self.queued,
        )
    }

    /// The fragment of `mep` is with the transport, not yet sent.
    pub fn is_sending(&self, mep: MepId) -> bool {
        self.held.get(&mep).is_some_and(|h| h.sent)
    }

    /// Nothing held: every assigned MEP has been shipped and released.
    pub fn is_idle(&self) -> bool {
        self.held.values().all(|h| !h.assigned) && self.in_flight == 0
    }

    /// The EM assigned `mep` to the BU on endpoint `bu`.
    pub fn on_assign(&mut self, mep: MepId, bu: NodeId, out: &mut Vec<RuAction>) {
        let Some(idx) = self.bu_of.get(bu as usize).copied().flatten() else {
            return; // Not a BU: a confused or hostile EM; nothing to ship to.
        };
        let entry = self.held.entry(mep).or_insert(Held::new(bu));
        if entry.assigned {
            return; // Duplicate assignment: already in hand.
        }
        if entry.requested || entry.abandoned {
            self.orphan_requests -= 1;
        }
        if entry.bu != bu {
            // An early request or abandon from a BU other than the one
            // assigned: it was not entitled to it.
            self.stats.requests_unexpected += 1;
            entry.requested = false;
            entry.abandoned = false;
        }
        if entry.abandoned {
            // Given up already: never produced, nothing to hold.
            self.held.remove(&mep);
            return;
        }
        entry.assigned = true;
        entry.bu = bu;
        // Assigned to a BU this RU already knows is lost: keep it for the
        // EM's decision (the EM may not have noticed the loss yet).
        entry.orphaned = self.dest_gone[idx as usize] && !self.ended;
        entry.assigned_while_gone = entry.orphaned;
        self.held_assigned += 1;
        self.stats.max_held = self.stats.max_held.max(self.held_assigned);
        out.push(RuAction::Produce { mep });
        if self.dest_gone[idx as usize] && !self.ended {
            self.bound_unclaimed(bu, out);
        }
    }

    /// The EM re-assigned `mep`, kept for a lost BU, to the BU on `bu`:
    /// ship it there. Ignored unless this RU kept it.
    pub fn on_reassign(&mut self, mep: MepId, bu: NodeId, out: &mut Vec<RuAction>) {
        let Some(idx) = self.bu_of.get(bu as usize).copied().flatten() else {
            return;
        };
        let idx = idx as usize;
        let protocol = self.protocol;
        let Some(h) = self.held.get_mut(&mep).filter(|h| h.assigned && h.orphaned) else {
            return;
        };
        h.bu = bu;
        h.round = None;
        h.requested = false;
        let early = h.early.take();
        if self.dest_gone[idx] {
            // Lost too, as far as this RU knows: kept for the next decision.
            self.bound_unclaimed(bu, out);
            return;
        }
        h.orphaned = false;
        self.stats.meps_retargeted += 1;
        match early {
            Some((from, false)) if from == bu => {
                // The new BU gave the batch up before this assignment came.
                self.release_held(mep, out);
                return;
            }
            Some((from, true)) if from == bu => h.requested = true,
            _ => {}
        }
        if h.header.is_none() {
            return; // on_mep_ready ships it.
        }
        match protocol {
            Protocol::Push => {
                self.queues[idx].push_back(mep);
                self.queued += 1;
                self.pump(out);
            }
            Protocol::Pull => {
                if h.requested {
                    self.send(mep, out);
                }
            }
        }
    }

    /// Drops the assigned, unsent entry of `mep` and releases its data.
    fn release_held(&mut self, mep: MepId, out: &mut Vec<RuAction>) {
        if let Some(h) = self.held.remove(&mep) {
            debug_assert!(h.assigned && !h.sent);
            if h.orphaned {
                self.stats.orphans_released += 1;
            }
            self.held_assigned -= 1;
            out.push(RuAction::Release { mep });
        }
    }

    /// Keeps the orphans of `bu` that no `BuLost` listed within the bound,
    /// releasing the oldest first (if the EM asks for one later, it is not
    /// held: counted lost, the accounting stays exact).
    fn bound_unclaimed(&mut self, bu: NodeId, out: &mut Vec<RuAction>) {
        let unclaimed: Vec<MepId> = self
            .held
            .iter()
            .filter(|(_, h)| h.orphaned && h.round.is_none() && h.bu == bu)
            .map(|(&m, _)| m)
            .collect();
        let excess = unclaimed.len().saturating_sub(self.max_unclaimed_orphans);
        for &mep in &unclaimed[..excess] {
            self.release_held(mep, out);
        }
    }

    /// Orphans what is held for `bu` and not handed to the transport.
    fn orphan_unsent(&mut self, bu: NodeId) {
        if let Some(idx) = self.bu_of.get(bu as usize).copied().flatten() {
            let drained = self.queues[idx as usize].len();
            self.queues[idx as usize].clear();
            self.queued -= drained;
        }
        for h in self.held.values_mut() {
            if h.bu == bu && h.assigned && !h.sent {
                h.orphaned = true;
            }
        }
    }

    /// The EM's decision `round` on lost BU `bu` starts: keep everything of
    /// it not handed to the transport and list it (the MEPs to report to
    /// the EM). Every assignment the EM made to that BU before losing it
    /// has arrived here already (same connection, in order).
    pub fn on_bu_lost(&mut self, bu: NodeId, round: u32) -> Vec<MepId> {
        if self.bu_of.get(bu as usize).copied().flatten().is_none() {
            return Vec::new();
        }
        self.orphan_unsent(bu);
        let mut listed = Vec::new();
        for (&mep, h) in &mut self.held {
            if h.orphaned && h.bu == bu && h.round.is_none() {
                h.round = Some(round);
                listed.push(mep);
            }
        }
        listed
    }

    /// The EM decided `round`: what it re-assigned was retargeted already;
    /// the rest is dropped.
    pub fn on_release_held(&mut self, round: u32, out: &mut Vec<RuAction>) {
        let drop: Vec<MepId> = self
            .held
            .iter()
            .filter(|(_, h)| h.orphaned && h.round == Some(round))
            .map(|(&m, _)| m)
            .collect();
        for mep in drop {
            self.release_held(mep, out);
        }
        self.pump(out);
    }

    /// The EM is back after this node had it for lost (it restarted, or
    /// its link came back): the decision rounds this RU answered will not
    /// be closed for it (a restarted EM never opened them; a live one
    /// decided without this RU when it lost it). What it kept for them is
    /// released (the accounting counts those MEPs lost).
    pub fn release_all_held_for_rounds(&mut self, out: &mut Vec<RuAction>) {
        let drop: Vec<MepId> = self
            .held
            .iter()
            .filter(|(_, h)| h.orphaned && h.round.is_some())
            .map(|(&m, _)| m)
            .collect();
        for mep in drop {
            self.release_held(mep, out);
        }
        self.pump(out);
    }

    /// Fragments kept for lost BUs, awaiting the EM's decision.
    pub fn orphans(&self) -> usize {
        self.held.values().filter(|h| h.orphaned).count()
    }

    /// The data of `mep` is in memory, described by `header`.
    pub fn on_mep_ready(&mut self, header: FragmentHeader, out: &mut Vec<RuAction>) {
        let Some(h) = self.held.get_mut(&header.mep) else {
            return;
        };
        if h.header.is_some() {
            return;
        }
        h.header = Some(header);
        self.stats.meps_produced += 1;
        if h.orphaned {
            return; // Kept for the EM's decision, shipped nowhere yet.
        }
        match self.protocol {
            Protocol::Push => {
                let bu = self.bu_of[h.bu as usize].expect("checked on assign") as usize;
                self.queues[bu].push_back(header.mep);
                self.queued += 1;
                self.pump(out);
            }
            Protocol::Pull => {
                if h.requested {
                    self.send(header.mep, out);
                }
            }
        }
    }

    /// PULL: the BU on endpoint `bu` asks for this RU's fragment of `mep`.
    pub fn on_request(&mut self, mep: MepId, bu: NodeId, out: &mut Vec<RuAction>) {
        if self.protocol != Protocol::Pull {
            self.stats.requests_unexpected += 1;
            return;
        }
        match self.held.get_mut(&mep) {
            Some(h) if h.orphaned => {
                // Its lost BU (reconnected) gets nothing; another BU's
                // request overtook the EM's re-assignment to it.
                if h.bu != bu && h.early.is_none() {
                    h.early = Some((bu, true));
                }
            }
            Some(h) if h.bu == bu && !h.requested => {
                h.requested = true;
                if h.header.is_some() {
                    self.send(mep, out);
                }
            }
            Some(_) => self.stats.requests_unexpected += 1,
            None => {
                // The request overtook the assignment (another connection):
                // remember it, within a bound.
                self.hold_orphan(mep, bu, true);
            }
        }
    }

    /// Remembers a request (or, if not `requested`, an abandon) that came
    /// before the MEP's assignment, within a bound against junk.
    fn hold_orphan(&mut self, mep: MepId, bu: NodeId, requested: bool) {
        if self.orphan_requests >= self.max_orphan_requests {
            self.stats.requests_unexpected += 1;
            return;
        }
        self.orphan_requests += 1;
        self.held.insert(
            mep,
            Held {
                requested,
                abandoned: !requested,
                ..Held::new(bu)
            },
        );
    }

    /// PULL: the BU on endpoint `bu` finished `mep` without this RU's
    /// fragment: free the data unless it is already on its way.
    pub fn on_abandon(&mut self, mep: MepId, bu: NodeId, out: &mut Vec<RuAction>) {
        if self.protocol != Protocol::Pull {
            // PUSH data is on its way or queued: a confused BU cannot
            // take it out of the send queue.
            self.stats.requests_unexpected += 1;
            return;
        }
        match self.held.get_mut(&mep) {
            Some(h) if h.bu == bu && !h.sent => {
                if h.assigned {
                    self.release_held(mep, out);
                } else {
                    self.held.remove(&mep);
                    self.orphan_requests -= 1;
                }
            }
            Some(h) if h.orphaned => {
                if h.early.is_none() {
                    h.early = Some((bu, false));
                }
            }
            Some(_) => {}
            // Overtook the assignment: remember it.
            None => self.hold_orphan(mep, bu, false),
        }
    }

    /// The transport is done with the fragment of `mep`.
    pub fn on_send_complete(&mut self, mep: MepId, out: &mut Vec<RuAction>) {
        if let Some(h) = self.held.remove_entry(&mep).map(|(_, h)| h) {
            if h.sent {
                self.in_flight = (self.in_flight.checked_sub(1))
                    .expect("RU: a send completed with none in flight");
                if !self.is_local(h.bu) {
                    self.net_in_flight = (self.net_in_flight.checked_sub(1))
                        .expect("RU: a network send completed with none on the network");
                    if let (Some((slot, at)), Some(header)) = (h.sent_slot, h.header) {
                        self.note_slot_kept(slot, at, header.payload_len);
                    }
                }
                self.held_assigned = (self.held_assigned.checked_sub(1))
                    .expect("RU: a sent MEP was not counted as assigned");
                out.push(RuAction::Release { mep });
            } else {
                self.held.insert(mep, h);
            }
        }
        self.pump(out);
    }

    /// A destination died or the run gave up on it: ship nothing more to
    /// it. During the run, what is not yet with the transport is kept for
    /// the EM's decision (it may re-assign those MEPs); after the end of the
    /// run it is released.
    pub fn forget_bu(&mut self, bu: NodeId, out: &mut Vec<RuAction>) {
        if let Some(idx) = self.bu_of.get(bu as usize).copied().flatten() {
            self.dest_gone[idx as usize] = true;
        }
        self.orphan_unsent(bu);
        // Early requests and abandons from it will never be matched.
        let early: Vec<MepId> = self
            .held
            .iter()
            .filter(|(_, h)| h.bu == bu && !h.assigned)
            .map(|(&m, _)| m)
            .collect();
        for mep in early {
            self.held.remove(&mep);
            self.orphan_requests -= 1;
        }
        if self.ended {
            self.release_orphans(out);
        } else {
            self.bound_unclaimed(bu, out);
        }
        self.pump(out);
    }

    /// Releases every orphan (the run has ended: no decision is coming).
    fn release_orphans(&mut self, out: &mut Vec<RuAction>) {
        let orphans: Vec<MepId> = self
            .held
            .iter()
            .filter(|(_, h)| h.orphaned)
            .map(|(&m, _)| m)
            .collect();
        for mep in orphans {
            self.release_held(mep, out);
        }
    }

    /// The BU on endpoint `bu` is back (a new incarnation, or the same one
    /// reconnected): it is served again, for the MEPs assigned to it from
    /// now on. What was held for it when it was lost stays for the EM's
    /// decision. But MEPs assigned to it while this RU had it for lost, and
    /// that no decision round claimed, go to it now: the EM saw it come
    /// back before this RU did (or never lost it) and expects them there;
    /// kept back, its batches would only time out incomplete.
    pub fn on_bu_joined(&mut self, bu: NodeId, out: &mut Vec<RuAction>) {
        let Some(idx) = self.bu_of.get(bu as usize).copied().flatten() else {
            return;
        };
        self.dest_gone[idx as usize] = false;
        let mut waiting: Vec<MepId> = self
            .held
            .iter()
            .filter(|(_, h)| {
                h.bu == bu && h.assigned && h.orphaned && h.assigned_while_gone && h.round.is_none()
            })
            .map(|(&m, _)| m)
            .collect();
        waiting.sort_unstable();
        for mep in waiting {
            self.on_reassign(mep, bu, out);
        }
    }

    /// Whether a fragment for the BU on endpoint `bu` stays in memory.
    fn is_local(&self, bu: NodeId) -> bool {
        self.local_bu.is_some()
            && self
                .bu_of
                .get(bu as usize)
                .copied()
                .flatten()
                .map(usize::from)
                == self.local_bu
    }

    /// Hands the held, ready fragment of `mep` to the transport.
    fn send(&mut self, mep: MepId, out: &mut Vec<RuAction>) {
        let h = self.held.get_mut(&mep).expect("only held MEPs are sent");
        let header = h.header.expect("only ready MEPs are sent");
        assert!(!h.sent, "RU: the fragment of MEP {} sent twice", header.mep);
        h.sent = true;
        let to = h.bu;
        self.in_flight += 1;
        if !self.is_local(to) {
            self.net_in_flight += 1;
            if let Some(plan) = &self.slots {
                let wire = plan.wire_ns(header.payload_len);
                self.link_free_at = self.now + wire.saturating_mul(self.keeping.stretch) / 1024;
            }
        }
        self.stats.max_in_flight = self.stats.max_in_flight.max(self.in_flight);
        self.stats.fragments_sent += 1;
        self.stats.bytes_sent += u64::from(header.payload_len);
        out.push(RuAction::Send { to, header });
    }

    /// PUSH: starts transfers while the schedule allows.
    fn pump(&mut self, out: &mut Vec<RuAction>) {
        let limit = match self.schedule {
            // The slotted barrel limits its network sends itself.
            Schedule::All | Schedule::Slotted => u32::MAX,
            _ => self.parallel_sends,
        };
        while self.queued > 0 && self.in_flight < limit {
            let Some(dest) = self.pick_destination() else {
                return; // Phase-locked: waiting for this phase's MEP.
            };
            let mep = self.queues[dest]
                .pop_front()
                .expect("picked a non-empty queue");
            self.queued -= 1;
            self.send(mep, out);
            if let Some(slot) = self.picked_slot.take() {
                let now = self.now;
                if let Some(h) = self.held.get_mut(&mep) {
                    h.sent_slot = Some((slot, now));
                }
            }
        }
    }

    /// Advances the RU's clock (the node does this on every input).
    pub fn set_now(&mut self, now: Nanos) {
        self.now = self.now.max(now);
    }

    /// Slotted barrel: the node's offset to the EM's clock (EM time minus
    /// local time), as measured ([`crate::clock`]); `None` while it is
    /// being measured: no fragment goes out in a slot until then (only
    /// local ones), as the slots could be anywhere.
    pub fn set_clock_offset(&mut self, offset: Option<i64>) {
        self.clock_known = offset.is_some();
        let offset = offset.unwrap_or(0);
        let slot_ns = self.slots.as_ref().map_or(1, |p| p.slot_ns.max(1));
        if offset.abs_diff(self.clock_offset) >= slot_ns {
            // Another clock (a restarted EM starts its own, with slots of
            // the nominal length): the slots are numbered anew, and the
            // next one served is found again.
            self.cursor = None;
            self.slot_wake = None;
            self.slot_clock = SlotClock::new(slot_ns);
        }
        self.clock_offset = offset;
    }

    /// Slotted barrel: the slot plan, if the schedule is slotted.
    pub fn slot_plan(&self) -> Option<&SlotPlan> {
        self.slots.as_ref()
    }

    /// Slotted barrel, once the clock is known: the slot of now, and
    /// when the next one starts (local time).
    pub fn slot_now(&self) -> Option<(u64, Nanos)> {
        self.slots.as_ref()?;
        if !self.clock_known {
            return None;
        }
        let slot = self.slot_at(self.now);
        Some((slot, self.slot_start(slot + 1)))
    }

    /// Slotted barrel: control messages this node may send in the headroom
    /// of the slot in force ([`SlotPlan::control_per_slot`]).
    pub fn control_per_slot(&self) -> Option<usize> {
        let plan = self.slots.as_ref()?;
        let slot_ns = self.slot_clock.len_of(self.slot_at(self.now));
        Some(plan.control_per_slot(slot_ns))
    }

    /// Slotted barrel: whether this RU's link carries none of its
    /// fragments now (none in flight, or the last one expected to have
    /// left it), and if it does, until when it is expected to.
    pub fn link_busy_until(&self) -> Option<Nanos> {
        (self.net_in_flight > 0 && self.now < self.link_free_at).then_some(self.link_free_at)
    }

    /// Slotted barrel: the absolute slot of local time `t`.
    fn slot_at(&self, t: Nanos) -> u64 {
        let em_time = (i128::from(t) + i128::from(self.clock_offset)).max(0);
        self.slot_clock.slot_at(em_time)
    }

    /// Slotted barrel: the local time at which absolute slot `slot` starts.
    fn slot_start(&self, slot: u64) -> Nanos {
        let em_time = self.slot_clock.start_of(slot);
        (em_time - i128::from(self.clock_offset)).clamp(0, i128::from(u64::MAX)) as Nanos
    }

    /// Slotted barrel: the EM moved the slots (longer, or back towards
    /// their nominal length) from slot `epoch.from` on.
    pub fn set_slot_epoch(&mut self, epoch: SlotEpoch) {
        if self.slots.is_none() || epoch.slot_ns == 0 {
            return;
        }
        let before = self.slot_at(self.now);
        self.slot_clock.set(epoch);
        if self.slot_at(self.now).abs_diff(before) > 1 {
            // Announced too late, or by a new EM with slots of its own:
            // the slots are numbered anew, the next one served found again.
            self.cursor = None;
            self.slot_wake = None;
        }
    }

    /// Slotted barrel: the slots now in effect.
    pub fn slot_epoch(&self) -> Option<SlotEpoch> {
        self.slots.as_ref().map(|_| self.slot_clock.epoch())
    }

    /// Slotted barrel: the report due to the EM on how this RU's fragments
    /// fit their slots (served, overran, and how much longer than at the
    /// nominal link rate they take on this RU's link, in 1/1024), once a
    /// rotation.
    pub fn take_slot_report(&mut self) -> Option<(u32, u32, u32)> {
        let k = &mut self.keeping;
        if k.due_in > 0 || k.served == 0 {
            return None;
        }
        if k.least_stretch != u64::MAX {
            k.stretch = k.least_stretch;
        }
        if k.least_need != u64::MAX {
            k.need = k.least_need;
        }
        let report = (k.served, k.overran, k.need as u32);
        k.served = 0;
        k.overran = 0;
        k.least_stretch = u64::MAX;
        k.least_need = u64::MAX;
        k.due_in = self.slots.as_ref().map_or(1, SlotPlan::rotation).max(16);
        Some(report)
    }

    /// A network fragment sent in `slot` at `sent_at` (local time) with
    /// `payload` bytes completed now: did it fit its slot? Its time from
    /// the slot's start to its completion, less the completion latency
    /// (the least seen after a fragment's expected last byte), against
    /// the slot's length.
    fn note_slot_kept(&mut self, slot: u64, sent_at: Nanos, payload: u32) {
        let Some(plan) = &self.slots else { return };
        let wire = plan.wire_ns(payload);
        let latency = self.now.saturating_sub(sent_at.saturating_add(wire));
        // At most a sixteenth of a slot: a link slower than the nominal
        // rate would otherwise pass for completion latency.
        let nominal = self.slots.as_ref().map_or(1, |p| p.slot_ns);
        let floor = self
            .keeping
            .completion_floor
            .map_or(latency, |f| f.min(latency))
            .min(nominal / 16);
        let start = self.slot_start(slot);
        let used = self.now.saturating_sub(floor).saturating_sub(start);
        // The slots its fragment spans (one, unless its path is slower
        // than the slots are sized for and the schedule gave it more).
        let span = plan.span_of(slot);
        let allotted = self.slot_start(slot + span).saturating_sub(start);
        let slot_wire = plan.slot_wire_ns(payload).saturating_mul(span);
        // Overran by more than the completion's jitter may account for.
        let tolerance = (nominal / 32).max(plan.late_ns);
        let over = used.saturating_sub(allotted + tolerance);
        let k = &mut self.keeping;
        k.completion_floor = Some(floor);
        // The fragment's time on the link, against the nominal rate (how
        // long this RU's link holds a fragment), and against what its
        // slots allow (what the EM sizes the slots by).
        let took = self.now.saturating_sub(floor).saturating_sub(sent_at);
        let stretch = (took.saturating_mul(1024) / wire.max(1)).clamp(1024, 64 * 1024);
        k.least_stretch = k.least_stretch.min(stretch);
        let need = (took.saturating_mul(1024) / slot_wire.max(1)).clamp(1024, 64 * 1024);
        k.least_need = k.least_need.min(need);
        k.served += 1;
        k.due_in = k.due_in.saturating_sub(1);
        if over > 0 {
            k.overran += 1;
        }
    }

    /// When a phase-locked barrel stops waiting for its phase's MEP, or a
    /// slotted one's next slot starts.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let can_send = match self.schedule {
            Schedule::Slotted => self.queued > 0 && self.net_in_flight < self.parallel_sends,
            _ => self.queued > 0 && self.in_flight < self.parallel_sends,
        };
        match (self.schedule, self.ended, self.waiting_since) {
            (Schedule::Slotted, _, _) if can_send => self.slot_wake,
            (Schedule::Barrel, false, Some(since)) if can_send => Some(since + self.wait_ns),
            _ => None,
        }
    }

    /// The wait for the phase's MEP may be over.
    pub fn on_timeout(&mut self, out: &mut Vec<RuAction>) {
        self.pump(out);
    }

    /// The run has ended: nothing more will be assigned, so a phase-locked
    /// barrel must not wait for a MEP that will never come.
    /// Every decision of the EM on lost BUs came before it, so the orphans
    /// left are nobody's: released.
    pub fn on_end_of_run(&mut self, out: &mut Vec<RuAction>) {
        self.ended = true;
        self.release_orphans(out);
        self.pump(out);
    }

    /// Slotted barrel: the local fragment at once; else the BU of the
    /// current slot if a MEP waits for it and its fragment still ends
    /// within the slot. A fragment that cannot (this RU's previous one
    /// held the link too long) waits for the slot's next turn, a rotation
    /// later: sent late, it would overlap the next slot's fragment at its
    /// BU and the overrun would spread. Slots that passed are never served
    /// late; an RU that keeps missing its slots makes the EM lengthen them
    /// ([`crate::adapt`]), rather than fall behind the clock for good.
    fn pick_slotted(&mut self) -> Option<usize> {
        let wake = self.slot_wake.take();
        if let Some(l) = self.local_bu.filter(|&l| !self.queues[l].is_empty()) {
            return Some(l);
        }
        if !self.clock_known {
            return None; // The node pumps again once the clock is measured.
        }
        // One fragment on the link at a time: the next starts once the
        // last one has left it (expected at this RU's link rate; its
        // completion, which comes a host latency later, is not waited for
        // unless `parallel_sends` are in flight), late if the last one
        // overran, never beside it (the two would share the link, both
        // overrun, and the overrun would spread to the next slot's BU).
        if self.net_in_flight >= self.parallel_sends {
            return None; // Its completion pumps.
        }
        if self.net_in_flight > 0 && self.now < self.link_free_at {
            self.slot_wake = Some(self.link_free_at);
            return None;
        }
        let plan = self.slots.as_ref().expect("slotted RUs have a plan");
        let rotation = plan.rotation();
        let now_slot = self.slot_at(self.now);
        let slot_ns = self.slot_clock.len_of(now_slot);
        let into_slot = self.now.saturating_sub(self.slot_start(now_slot));
        let mut cursor = match self.cursor {
            // More than a rotation ahead cannot be: the clock was set back.
            Some(c) if c > now_slot + rotation => now_slot,
            Some(c) => c.max(now_slot),
            None => now_slot,
        };
        // Woken for this very slot, late (timers are not exact): the slot
        // is its own whatever the lateness.
        let woken_for = |slot: u64| wake == Some(self.slot_start(slot)) && wake <= Some(self.now);
        let (mut late_starts, mut missed) = (0, 0);
        let picked = loop {
            if cursor > now_slot {
                break None;
            }
            let slot = cursor;
            cursor += 1;
            let dest = plan.dest_of(slot).map(usize::from);
            let Some(d) = dest.filter(|&d| !self.queues[d].is_empty() && !self.dest_gone[d]) else {
                continue;
            };
            if into_slot > plan.late_ns && !woken_for(slot) {
                // At this RU's link's own pace, within the slots it spans.
                let wire = plan
                    .wire_ns(self.head_payload(d))
                    .saturating_mul(self.keeping.stretch)
                    / 1024;
                let allotted = slot_ns.saturating_mul(plan.span_of(slot));
                if !plan.fits(into_slot, wire, allotted) {
                    missed += 1;
                    continue;
                }
                late_starts += 1;
            }
            if Some(d) != self.local_bu {
                self.picked_slot = Some(slot);
            }
            break Some(d);
        };
        self.stats.late_starts += late_starts;
        self.stats.slots_missed += missed;
        self.cursor = Some(cursor);
        if picked.is_none() {
            self.slot_wake = Some(self.slot_start(cursor));
        }
        picked
    }

    /// Payload bytes of the fragment at the head of BU queue `d`.
    fn head_payload(&self, d: usize) -> u32 {
        self.queues[d]
            .front()
            .and_then(|m| self.held.get(m))
            .and_then(|h| h.header)
            .map_or(0, |h| h.payload_len)
    }

    /// Index of the BU queue to serve next, chosen by the schedule; `None`
    /// when a phase-locked barrel waits for its phase's MEP.
    fn pick_destination(&mut self) -> Option<usize> {
        let n = self.queues.len();
        Some(match self.schedule {
            Schedule::Slotted => return self.pick_slotted(),
            Schedule::Barrel if !self.ended => {
                // Phase n goes to BU (source + n) mod N, lost BUs skipped.
                let start = self.source as usize + self.phase;
                let k = (0..n).find(|k| !self.dest_gone[(start + k) % n])?;
                let dest = (start + k) % n;
                if self.queues[dest].is_empty() {
                    // Wait for it, but not for ever: a slow or stalled BU
                    // must not hold every rotation.
                    let since = *self.waiting_since.get_or_insert(self.now);
                    if self.now < since + self.wait_ns {
                        return None;
                    }
                    // Out of turn, the oldest MEP first: the first queue
                    // after the phase could win every time and starve the
                    // others (found by the DST: a rejoined BU's steady
                    // stream held another BU's MEP past its timeout).
                    self.waiting_since = Some(self.now);
                    return (1..n)
                        .map(|k| (start + k) % n)
                        .filter(|&i| !self.queues[i].is_empty())
                        .min_by_key(|&i| self.queues[i][0]);
                }
                self.waiting_since = None;
                self.phase = (self.phase + k + 1) % n;
                dest
            }
            Schedule::Barrel | Schedule::BarrelSkip => {
                // Never waits: when the phase's queue is empty the next
                // non-empty one is served out of turn, and the phase stays,
                // anchored at the source, so RUs stay offset from each other
                // instead of converging on one BU.
                let start = self.source as usize + self.phase;
                let k = (0..n)
                    .find(|k| !self.queues[(start + k) % n].is_empty())
                    .expect("queued > 0");
                if k == 0 {
                    self.phase = (self.phase + 1) % n;
                }
                (start + k) % n
            }
            Schedule::Random => {
                let nonempty = self.queues.iter().filter(|q| !q.is_empty()).count();
                let pick = self.rng.gen_range(0..nonempty);
                (0..n)
                    .filter(|&i| !self.queues[i].is_empty())
                    .nth(pick)
                    .expect("pick < nonempty")
            }
            Schedule::All => {
                // Oldest MEP first.
                (0..n)
                    .filter(|&i| !self.queues[i].is_empty())
                    .min_by_key(|&i| self.queues[i][0])
                    .expect("queued > 0")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ru(protocol: Protocol) -> ReadoutUnit {
        let mut config = Config::default();
        config.nodes.count = 3;
        config.event_builder.protocol = protocol;
        config.event_builder.schedule = Schedule::BarrelSkip;
        config.event_builder.parallel_sends = 1;
        config.event_builder.credits = 2;
        let layout = Layout::from_config(&config);
        ReadoutUnit::new(&config, &layout, 0)
    }

    fn ready(ru: &mut ReadoutUnit, mep: MepId, out: &mut Vec<RuAction>) {
        let header = FragmentHeader {
            mep,
            payload_len: 8,
            ..Default::default()
        };
        ru.on_mep_ready(header, out);
    }

    fn sends(out: &[RuAction]) -> Vec<(NodeId, MepId)> {
        out.iter()
            .filter_map(|a| match a {
                RuAction::Send { to, header } => Some((*to, header.mep)),
                _ => None,
            })
            .collect()
    }

    fn releases(out: &[RuAction]) -> Vec<MepId> {
        out.iter()
            .filter_map(|a| match a {
                RuAction::Release { mep } => Some(*mep),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn pull_keeps_a_lost_bus_fragment_and_retargets_it_to_the_new_bu() {
        let mut r = ru(Protocol::Pull);
        let mut out = Vec::new();
        r.on_assign(5, 1, &mut out);
        ready(&mut r, 5, &mut out);
        out.clear();
        // BU 1 dies before asking: the fragment is kept, not released.
        r.forget_bu(1, &mut out);
        assert!(releases(&out).is_empty(), "{out:?}");
        // The lost BU (reconnected) gets nothing.
        r.on_request(5, 1, &mut out);
        assert!(sends(&out).is_empty());
        assert_eq!(r.on_bu_lost(1, 7), vec![5]);
        assert_eq!(r.on_bu_lost(1, 8), Vec::<MepId>::new(), "listed once");
        // The new BU's request overtakes the EM's re-assignment: remembered.
        r.on_request(5, 2, &mut out);
        assert!(sends(&out).is_empty());
        r.on_reassign(5, 2, &mut out);
        assert_eq!(sends(&out), vec![(2, 5)]);
        assert_eq!(r.stats.meps_retargeted, 1);
        out.clear();
        r.on_release_held(7, &mut out);
        assert!(releases(&out).is_empty(), "re-assigned, not dropped");
        r.on_send_complete(5, &mut out);
        assert_eq!(releases(&out), vec![5]);
        assert!(r.is_idle());
    }

    #[test]
    fn pull_retarget_after_an_early_abandon_releases() {
        let mut r = ru(Protocol::Pull);
        let mut out = Vec::new();
        r.on_assign(3, 1, &mut out);
        r.forget_bu(1, &mut out);
        assert_eq!(r.on_bu_lost(1, 0), vec![3]);
        // The new BU gave the batch up before the re-assignment reached us.
        r.on_abandon(3, 2, &mut out);
        r.on_reassign(3, 2, &mut out);
        ready(&mut r, 3, &mut out);
        assert!(sends(&out).is_empty(), "{out:?}");
        assert_eq!(releases(&out), vec![3]);
        assert!(r.is_idle());
    }

    /// The EM saw BU 1 come back before this RU did and assigned it MEP 7
    /// meanwhile: when this RU sees the rejoin, 7 goes to BU 1 (kept back,
    /// the BU's batch would time out incomplete). MEP 4, held for BU 1 when
    /// it was lost, stays for the EM's decision.
    #[test]
    fn what_was_assigned_while_the_bu_was_gone_goes_to_it_when_it_is_back() {
        let mut r = ru(Protocol::Push);
        let mut out = Vec::new();
        for mep in [3, 4] {
            r.on_assign(mep, 1, &mut out);
            ready(&mut r, mep, &mut out);
        }
        assert_eq!(sends(&out), vec![(1, 3)]);
        out.clear();
        r.forget_bu(1, &mut out);
        r.on_assign(7, 1, &mut out);
        ready(&mut r, 7, &mut out);
        assert!(sends(&out).is_empty(), "not while it is lost here");
        assert_eq!(r.orphans(), 2);
        r.on_send_complete(3, &mut out);
        out.clear();
        r.on_bu_joined(1, &mut out);
        assert_eq!(sends(&out), vec![(1, 7)]);
        assert_eq!(r.orphans(), 1, "4 still waits for the EM's decision");
        assert_eq!(r.on_bu_lost(1, 0), vec![4]);
    }

    #[test]
    fn push_requeues_what_was_not_sent_and_drops_what_the_em_did_not_take() {
        let mut r = ru(Protocol::Push);
        let mut out = Vec::new();
        for mep in [3, 4, 6] {
            r.on_assign(mep, 1, &mut out);
            ready(&mut r, mep, &mut out);
        }
        // One transfer at a time: 3 is with the transport, 4 and 6 queued.
        assert_eq!(sends(&out), vec![(1, 3)]);
        out.clear();
        r.forget_bu(1, &mut out);
        assert!(releases(&out).is_empty());
        assert_eq!(r.orphans(), 2);
        // What the transport has is not held any more.
        assert_eq!(r.on_bu_lost(1, 0), vec![4, 6]);
        r.on_send_complete(3, &mut out);
        assert_eq!(releases(&out), vec![3]);
        out.clear();
        // The EM re-assigns 4 to BU 2 (and names a MEP this RU never had:
        // ignored), then drops the rest of the round.
        r.on_reassign(4, 2, &mut out);
        r.on_reassign(9, 2, &mut out);
        assert_eq!(sends(&out), vec![(2, 4)]);
        r.on_release_held(0, &mut out);
        assert_eq!(releases(&out), vec![6]);
        assert_eq!(r.stats.orphans_released, 1);
        r.on_send_complete(4, &mut out);
        assert!(r.is_idle());
    }

    #[test]
    fn orphans_nobody_claims_are_bounded_and_go_at_the_end_of_the_run() {
        let mut r = ru(Protocol::Push);
        let mut out = Vec::new();
        r.forget_bu(1, &mut out);
        // The EM, not yet aware, keeps assigning to BU 1: kept, at most its
        // credits (2) of them, the oldest released first.
        for mep in 0..5 {
            r.on_assign(mep, 1, &mut out);
            ready(&mut r, mep, &mut out);
        }
        assert!(sends(&out).is_empty());
        assert_eq!(releases(&out), vec![0, 1, 2]);
        assert_eq!(r.orphans(), 2);
        out.clear();
        r.on_end_of_run(&mut out);
        assert_eq!(releases(&out), vec![3, 4]);
        assert!(r.is_idle());
        // After the end of the run a lost BU's data goes at once.
        r.on_bu_joined(1, &mut out);
        r.on_assign(7, 1, &mut out);
        ready(&mut r, 7, &mut out);
        r.on_assign(8, 1, &mut out);
        ready(&mut r, 8, &mut out);
        out.clear();
        r.forget_bu(1, &mut out);
        assert_eq!(releases(&out), vec![8], "7 is with the transport");
    }

    /// A restarted EM has a clock of its own: the slots are numbered anew
    /// and the RU serves the next one of the new clock, not the slot it
    /// had reached on the old one (a second's wait).
    #[test]
    fn a_new_clock_numbers_the_slots_anew() {
        let mut config = Config::default();
        config.nodes.count = 3;
        config.event_builder.slot_us = 10.0;
        let layout = Layout::from_config(&config);
        let mut r = ReadoutUnit::new(&config, &layout, 0);
        let mut out = Vec::new();
        r.set_now(1_000_000_000);
        r.set_clock_offset(Some(0));
        // Slot 100000 (even) is BU 1's.
        r.on_assign(1, 1, &mut out);
        ready(&mut r, 1, &mut out);
        assert_eq!(sends(&out), vec![(1, 1)]);
        r.on_send_complete(1, &mut out);
        out.clear();
        // The EM's clock now reads 1 ms: slot 100.
        r.set_clock_offset(Some(-999_000_000));
        r.on_assign(2, 2, &mut out);
        ready(&mut r, 2, &mut out);
        assert!(sends(&out).is_empty(), "slot 100 is BU 1's");
        let wake = r.next_deadline().expect("waits for slot 101");
        assert_eq!(wake, 1_000_010_000);
        r.set_now(wake);
        r.on_timeout(&mut out);
        assert_eq!(sends(&out), vec![(2, 2)]);
    }

    #[test]
    fn a_barrel_out_of_turn_serves_the_oldest_mep() {
        let mut config = Config::default();
        config.nodes.count = 4;
        config.event_builder.schedule = Schedule::Barrel;
        config.event_builder.parallel_sends = 1;
        config.event_builder.barrel_wait_us = 1000;
        let layout = Layout::from_config(&config);
        // Source 1 starts at phase BU 1, which has nothing.
        let mut r = ReadoutUnit::new(&config, &layout, 1);
        let mut out = Vec::new();
        r.on_assign(20, 0, &mut out);
        ready(&mut r, 20, &mut out);
        r.on_assign(21, 3, &mut out);
        ready(&mut r, 21, &mut out);
        assert!(sends(&out).is_empty(), "waits for its phase's MEP");
        r.set_now(1_000_000);
        r.on_timeout(&mut out);
        // BU 3 comes first after the phase, but MEP 20 is older: a queue
        // refilled at every wait must not starve it.
        assert_eq!(sends(&out), vec![(0, 20)]);
    }
}
