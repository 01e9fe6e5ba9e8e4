//! Event Manager: assigns each MEP to a Builder Unit under the credit scheme.
//!
//! A BU grants credits (batches it can build at once); the EM never assigns
//! beyond them, and picks round-robin among the BUs that have credit. Each
//! BU reports every MEP it finishes with its outcome, which returns the
//! credit and gives the EM the exact accounting of the run. When an RU is
//! lost, the BUs are told to build later MEPs without it.
//!
//! A lost BU's unfinished MEPs are re-assigned when the RUs still hold
//! their fragments. The EM opens a decision round: `BuLost` to every live
//! RU (after every assignment to that BU on the same connection), each
//! answers with the MEPs it still holds (`Holding`, then `HoldingDone`; an
//! RU lost meanwhile counts as answered). A MEP every live RU still holds
//! is re-assigned, ahead of new MEPs, to a BU with credit (`Reassign` to
//! it and to the RUs holding it); the rest are counted lost
//! (`meps_lost_bu_gone`). Once all of a round's MEPs are placed,
//! `ReleaseHeld` tells the RUs to drop what they still hold for it.
//! `EndOfRun` waits for every open round, so nothing stays held. A BU lost
//! after `EndOfRun` (or with no BU left) loses its MEPs as before.
//!
//! Paced readout (`source.mep_rate_hz` > 0): the detector delivers a MEP
//! every 1/rate seconds whether or not the event builder keeps up, the way
//! a readout supervisor sends its triggers. A MEP waits in the RUs' buffers
//! until a BU has credit. When the MEPs not yet built reach
//! `event_builder.ru_buffer_meps`, the readout is throttled: the MEPs of
//! the throttled time are vetoed at the source (never read out, counted
//! apart), so RU memory stays bounded and nothing already read out is lost.
//!
//! A lost endpoint can rejoin (its node restarted, or its link came back):
//! its BU is live again and gets MEPs once it grants credits, and its RU is
//! re-admitted from a MEP boundary (`SourceUp`): the MEPs assigned from then
//! on include it again. A BU lost while alive (its links down, or its
//! process stopped, past the peer timeout) is told first which of its MEPs
//! the EM took at the loss (`Revoked`): their fates are counted elsewhere
//! (re-assigned, or lost), so it does not count them as its own. Its counts
//! then add up with the other BUs' to the EM's, which is what the run's
//! accounting rests on once a restarted EM no longer has its predecessor's.
//! The EM keeps what it took until the BU acknowledges each (`RevokedAck`),
//! tells it again at each rejoin until then (a link lost again may have
//! lost them), and assigns nothing to that BU meanwhile: so what it keeps
//! is at most the BU's credits.
//!
//! The EM itself can be restarted ([`EventManager::resuming`]): the new
//! incarnation knows nothing of what its predecessor assigned, so it waits
//! until every node has said how far it saw (`SeenUpTo`), or a deadline,
//! and resumes above the highest: no MEP id is handed out twice. The MEPs
//! its predecessor assigned are finished by their BUs, which count them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::adapt::SlotAdapt;
use crate::bu::Nanos;
use crate::layout::Layout;
use crate::slots::SlotEpoch;
use crate::wire::{outcome, MepId, Message, NodeId};

/// Counters of the Event Manager, in MEPs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmStats {
    pub meps_assigned: u64,
    /// Times the EM had a MEP to assign but no BU had credit.
    pub credit_stalls: u64,
    pub meps_built: u64,
    pub meps_incomplete: u64,
    pub meps_corrupt: u64,
    /// MEPs assigned to a BU that was lost before finishing them, and that
    /// could not be re-assigned (an RU had shipped or dropped its fragment).
    pub meps_lost_bu_gone: u64,
    /// MEPs of a lost BU re-assigned to another BU (each then counted by
    /// its outcome there), and the decision rounds held.
    pub meps_reassigned: u64,
    pub reassign_rounds: u64,
    /// MEPs taken from a BU lost while alive (re-assigned or lost), named
    /// to it when it came back ([`Message::Revoked`]), each counted once;
    /// and `Revoked` told again, at a later rejoin, for want of its
    /// acknowledgement ([`Message::RevokedAck`]).
    pub meps_revoked: u64,
    pub revoked_again: u64,
    /// BU and RU endpoints lost during the run.
    pub bus_lost: Vec<NodeId>,
    pub rus_lost: Vec<NodeId>,
    /// Endpoints that rejoined after being lost, in order (one entry per
    /// rejoin).
    pub rejoined: Vec<NodeId>,
    /// Paced readout: MEPs vetoed at the source while throttled (never
    /// read out), time throttled and how many times it started.
    pub meps_vetoed: u64,
    pub throttled_ns: u64,
    pub throttle_episodes: u64,
    /// Paced readout: MEPs read out and waiting for a BU when every BU was
    /// gone (counted lost with this reason).
    pub meps_lost_no_bu: u64,
    /// Paced readout: most MEPs waiting for a BU at once, and most not yet
    /// built at once (the RU buffer occupancy the throttle bounds).
    pub max_waiting: u64,
    pub max_unbuilt: u64,
    /// A restarted EM: the MEP at which it resumed assigning, once every
    /// live node said what it had seen ([`EventManager::resuming`]). Its
    /// `meps_assigned` then counts from MEP 0, its predecessors' included.
    pub resumed_at: Option<MepId>,
    /// Slotted barrel: changes of the slot length ([`crate::adapt`]), the
    /// slot length at the end and the longest one, ns (0: not slotted).
    pub slot_changes: u64,
    pub slot_ns: u64,
    pub longest_slot_ns: u64,
}

/// The readout's clock, when it delivers MEPs at a fixed rate.
#[derive(Debug, Clone)]
struct Pacing {
    rate_hz: f64,
    /// MEPs not yet built the RUs may hold.
    buffer_meps: u64,
    /// Time of trigger slot 0 (set when the run starts).
    epoch: Option<Nanos>,
    /// Trigger slots elapsed so far.
    slots: u64,
    /// MEPs read out and not yet assigned to a BU.
    waiting: u64,
    /// Since when the readout is throttled.
    throttled_since: Option<Nanos>,
}

impl Pacing {
    fn slot_time(&self, epoch: Nanos, slot: u64) -> Nanos {
        epoch + (slot as f64 * 1e9 / self.rate_hz) as Nanos
    }
}

/// A decision round on the unfinished MEPs of a lost BU.
#[derive(Debug, Clone)]
struct Round {
    id: u32,
    /// Per source: must hold a MEP for it to be re-assigned (live when the
    /// round opened and not lost since).
    required: Vec<bool>,
    /// Per source: its `HoldingDone` is still expected.
    waiting: Vec<bool>,
    /// The lost BU's MEPs, each with the sources that still hold it.
    meps: BTreeMap<MepId, Vec<bool>>,
    /// Decided: MEPs to re-assign, in order, with their holders.
    to_place: VecDeque<(MepId, Vec<bool>)>,
}

impl Round {
    fn decided(&self) -> bool {
        !self.waiting.contains(&true)
    }
}

#[derive(Debug, Clone)]
pub struct EventManager {
    /// Credits held per BU index.
    credits: Vec<u32>,
    /// Credits each BU granted since it (re)joined. Invariant (see
    /// [`Self::assert_credits`]): held + outstanding = granted, so the EM
    /// never has more of a BU's batches in flight than the BU allowed.
    granted: Vec<u32>,
    /// MEPs assigned and not yet reported finished, per BU index.
    outstanding: Vec<BTreeSet<MepId>>,
    /// Per BU index: the MEPs taken from it when it was lost (at most its
    /// credits), named to it when it comes back ([`Message::Revoked`]) and
    /// kept until it acknowledges them ([`Message::RevokedAck`]), with
    /// whether named yet. Nothing is assigned to a BU while it has any, so
    /// a later loss finds either these or MEPs out, never both.
    taken: Vec<Vec<(MepId, bool)>>,
    /// A restarted EM: MEPs counted assigned that its predecessor assigned
    /// (their fates are the BUs' alone).
    inherited: u64,
    bu_lost: Vec<bool>,
    ru_lost: Vec<bool>,
    bu_nodes: Vec<NodeId>,
    ru_nodes: Vec<NodeId>,
    endpoints: u16,
    /// BU index the round-robin search starts from.
    next_bu: usize,
    next_mep: MepId,
    /// 0: no limit.
    max_meps: u64,
    stopped: bool,
    stalled: bool,
    /// Paced readout: the run is ending; EndOfRun goes out once the MEPs
    /// waiting for a BU are assigned.
    stop_requested: bool,
    pacing: Option<Pacing>,
    /// Open decision rounds on lost BUs' MEPs, oldest first.
    rounds: VecDeque<Round>,
    next_round: u32,
    /// A restarted EM, per endpoint: whether it still waits for that
    /// node's `SeenUpTo` before assigning. `None`: not resyncing.
    resync: Option<Vec<bool>>,
    /// How long a restarted EM waits for the nodes, from its start, and
    /// until when.
    resync_wait: Nanos,
    resync_deadline: Option<Nanos>,
    /// How long the EM waits for a BU to come back once it has lost them
    /// all (0: it ends the run at once), and until when it waits.
    orphan_wait: Nanos,
    orphaned_until: Option<Nanos>,
    /// New assignments of the current step, as (MEP, BU index), in MEP
    /// order; sent as runs ([`Message::AssignRun`]) at the end of the step,
    /// or before anything else the EM says (every message keeps its order).
    pending: Vec<(MepId, u16)>,
    /// Since when free credits wait for a batch ([`Self::hold_for_batch`]).
    pending_since: Option<Nanos>,
    assign_batch: usize,
    assign_flush_ns: Nanos,
    /// This EM's node still holds assignments it told before, paced into
    /// its slots' headroom ([`crate::pacer`]): new ones wait and join the
    /// next batch, so the runs grow instead of the queue.
    control_backlog: bool,
    /// The pending batch waited for that backlog: it goes as soon as the
    /// backlog is gone, not at the flush timer.
    held_for_backlog: bool,
    /// Slotted barrel: the slot length, lengthened when the RUs overrun
    /// their slots.
    slot_adapt: Option<SlotAdapt>,
    /// The driver's clock, as of the last input.
    now: Nanos,
    pub stats: EmStats,
}

impl EventManager {
    pub fn new(layout: &Layout, max_meps: u64) -> EventManager {
        EventManager {
            credits: vec![0; layout.bus()],
            granted: vec![0; layout.bus()],
            outstanding: vec![BTreeSet::new(); layout.bus()],
            taken: vec![Vec::new(); layout.bus()],
            inherited: 0,
            bu_lost: vec![false; layout.bus()],
            ru_lost: vec![false; layout.rus()],
            bu_nodes: layout.bu_nodes.clone(),
            ru_nodes: layout.ru_nodes.clone(),
            endpoints: layout.endpoints,
            next_bu: 0,
            next_mep: 0,
            max_meps,
            stopped: false,
            stalled: false,
            stop_requested: false,
            pacing: None,
            rounds: VecDeque::new(),
            next_round: 0,
            resync: None,
            resync_wait: 0,
            resync_deadline: None,
            orphan_wait: 0,
            orphaned_until: None,
            pending: Vec::new(),
            pending_since: None,
            assign_batch: 1,
            assign_flush_ns: 0,
            control_backlog: false,
            held_for_backlog: false,
            slot_adapt: None,
            now: 0,
            stats: EmStats::default(),
        }
    }

    /// Once every BU is lost, waits up to `wait` for one to come back
    /// before ending the run. All of them lost at once is most often this
    /// EM cut off (its process stopped, its links down): they come back
    /// when it does, as the nodes wait `em_lost_wait_ms` for the EM.
    pub fn waits_for_lost_bus(mut self, wait: Nanos) -> EventManager {
        self.orphan_wait = wait;
        self
    }

    /// Collects up to `batch` new assignments (for at most `flush` ns)
    /// before telling them as runs.
    pub fn batched(mut self, batch: u32, flush: Nanos) -> EventManager {
        self.assign_batch = batch.max(1) as usize;
        self.assign_flush_ns = flush;
        self
    }

    /// Whether this EM's node still holds earlier assignments for its
    /// link's headroom (the node says so after each of its steps). While it
    /// does, new assignments wait for the next batch: a node whose link
    /// cannot carry one message to every RU per completed MEP (540 RUs,
    /// or slots lengthened for a slow link) then sends fewer, larger runs
    /// rather than a queue that grows until the MEPs wait on it.
    pub fn set_control_backlog(&mut self, backlogged: bool) {
        self.control_backlog = backlogged;
    }

    /// Slotted barrel: adapts the slot length (nominally `nominal` ns, in
    /// rotations of `rotation` slots) to what the RUs report
    /// ([`crate::adapt`]).
    pub fn adaptive_slots(mut self, nominal: Nanos, rotation: u64) -> EventManager {
        self.slot_adapt = Some(SlotAdapt::new(nominal, rotation));
        self.stats.slot_ns = nominal;
        self.stats.longest_slot_ns = nominal;
        self
    }

    /// The slots in effect, if the EM adapts them.
    pub fn slot_epoch(&self) -> Option<SlotEpoch> {
        self.slot_adapt.as_ref().map(SlotAdapt::epoch)
    }

    /// An RU's report on how its fragments fit their slots; once every
    /// live RU has reported, the slots may change: every live RU is told
    /// (`SlotLength`), this node's own RU too (the node routes it).
    pub fn on_slot_report(
        &mut self,
        served: u32,
        overran: u32,
        stretch: u32,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        let live = self.ru_lost.iter().filter(|&&l| !l).count();
        let now = self.now;
        let Some(adapt) = &mut self.slot_adapt else {
            return;
        };
        let Some(epoch) = adapt.report(served, overran, stretch, live, now) else {
            return;
        };
        self.stats.slot_changes = adapt.changes;
        self.stats.slot_ns = epoch.slot_ns;
        self.stats.longest_slot_ns = adapt.longest_ns;
        self.flush_assignments(out);
        let msg = slot_length(epoch);
        for (s, &ru) in self.ru_nodes.iter().enumerate() {
            if !self.ru_lost[s] {
                out.push((ru, msg));
            }
        }
    }

    /// Advances the EM's clock (the node does this on every input).
    pub fn set_now(&mut self, now: Nanos) {
        debug_assert!(now >= self.now, "time went back: {now} < {}", self.now);
        self.now = self.now.max(now);
    }

    /// Assignments collected and not yet told.
    pub fn pending_assignments(&self) -> usize {
        self.pending.len()
    }

    /// Tells the collected assignments: runs of consecutive MEPs to
    /// consecutive BU indices, to every live RU and to every BU that has a
    /// MEP among them (a folded node gets one copy).
    fn flush_assignments(&mut self, out: &mut Vec<(NodeId, Message)>) {
        if self.pending.is_empty() {
            return;
        }
        let b = self.bu_nodes.len() as u16;
        let mut runs: Vec<Message> = Vec::new();
        let mut start = 0;
        for i in 1..=self.pending.len() {
            let ends = i == self.pending.len() || {
                let (prev_mep, prev_bu) = self.pending[i - 1];
                let (mep, bu) = self.pending[i];
                mep != prev_mep + 1 || bu != (prev_bu + 1) % b
            };
            if ends {
                let (first, first_bu) = self.pending[start];
                runs.push(Message::AssignRun {
                    first,
                    count: (i - start) as u32,
                    first_bu,
                });
                start = i;
            }
        }
        let mut to = vec![false; self.endpoints as usize];
        for &(_, bu) in &self.pending {
            to[self.bu_nodes[bu as usize] as usize] = true;
        }
        for (s, &ru) in self.ru_nodes.iter().enumerate() {
            if !self.ru_lost[s] {
                to[ru as usize] = true;
            }
        }
        self.pending.clear();
        for (node, _) in to.iter().enumerate().filter(|(_, &t)| t) {
            for &run in &runs {
                out.push((node as NodeId, run));
            }
        }
    }

    /// This EM is a new incarnation taking over a run whose EM died
    /// (`own`: its endpoint). What its predecessor assigned is known only
    /// to the nodes, so it assigns nothing until every other endpoint with
    /// an RU or a BU has said how far it saw ([`Self::on_seen_up_to`]) or is
    /// lost, then resumes above the highest: no MEP id is handed out twice.
    /// MEPs its predecessor assigned are not outstanding here: their BUs
    /// count them, their credits return as the BUs grant them anew.
    ///
    /// A node it has lost is still waited for (it may only be slow to
    /// reconnect to the new incarnation), up to `wait` after
    /// [`Self::start`]; then the EM resumes with the answers it has.
    pub fn resuming(mut self, layout: &Layout, own: NodeId, wait: Nanos) -> EventManager {
        self.resync_wait = wait;
        let waiting = (0..layout.endpoints as usize)
            .map(|n| n != own as usize && (layout.ru_of[n].is_some() || layout.bu_of[n].is_some()))
            .collect();
        self.resync = Some(waiting);
        self
    }

    /// Waiting for the nodes before assigning (a restarted EM).
    pub fn is_resyncing(&self) -> bool {
        self.resync.is_some()
    }

    /// The endpoints a restarted EM still waits for.
    pub fn resync_waiting(&self) -> Vec<NodeId> {
        self.resync.as_ref().map_or_else(Vec::new, |w| {
            (0..w.len())
                .filter(|&n| w[n])
                .map(|n| n as NodeId)
                .collect()
        })
    }

    /// Endpoint `node` saw every assigned MEP below `next_mep` (and the
    /// end of the run, if `ended`). A live EM knows better already; a
    /// restarted one resumes above the highest, and ends the run at once
    /// if its predecessor had ended it.
    pub fn on_seen_up_to(
        &mut self,
        node: NodeId,
        next_mep: MepId,
        ended: bool,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        if ended && self.resync.is_some() {
            self.stop_requested = true;
        }
        if next_mep > self.next_mep {
            // Only a restarted EM learns of MEPs it did not assign (a node
            // that rejoins after the resync may have seen more than the
            // others): they count as assigned, so the accounting has them.
            self.stats.meps_assigned += next_mep - self.next_mep;
            self.inherited += next_mep - self.next_mep;
            self.next_mep = next_mep;
        }
        if let Some(w) = self.resync.as_mut().and_then(|w| w.get_mut(node as usize)) {
            *w = false;
        }
        self.end_resync(out);
    }

    /// Every node answered (or the wait is over): assign again, unless no
    /// BU is left.
    fn end_resync(&mut self, out: &mut Vec<(NodeId, Message)>) {
        if self.resync.as_ref().is_some_and(|w| w.iter().all(|&x| !x)) {
            self.resync = None;
            self.stats.resumed_at = Some(self.next_mep);
            if self.bu_lost.iter().all(|&l| l) {
                self.stop(out);
            }
            // The BUs may still mask a source the dead EM declared gone
            // and that came back while no EM lived to say so: every
            // source this EM takes for live is up from here, before any
            // of its assignments.
            for b in 0..self.bu_nodes.len() {
                if !self.bu_lost[b] {
                    self.sources_up_for(self.bu_nodes[b], out);
                }
            }
            self.assign(out);
        }
    }

    /// Tells BU node `bu` that every source this EM takes for live is up
    /// from the next MEP on (`SourceUp`; a BU that never masked it ignores
    /// it). A BU that was away, or heard from a dead EM, may mask a source
    /// that came back meanwhile: it would drop that source's fragments as
    /// unexpected and build without it for ever.
    fn sources_up_for(&self, bu: NodeId, out: &mut Vec<(NodeId, Message)>) {
        for (s, &lost) in self.ru_lost.iter().enumerate() {
            if !lost {
                out.push((
                    bu,
                    Message::SourceUp {
                        source: s as u16,
                        from_mep: self.next_mep,
                    },
                ));
            }
        }
    }

    /// Paces the readout at `rate_hz` MEPs per second with at most
    /// `buffer_meps` MEPs not yet built (0 Hz: unpaced).
    pub fn paced(mut self, rate_hz: f64, buffer_meps: u32) -> EventManager {
        self.pacing = (rate_hz > 0.0).then_some(Pacing {
            rate_hz,
            buffer_meps: u64::from(buffer_meps.max(1)),
            epoch: None,
            slots: 0,
            waiting: 0,
            throttled_since: None,
        });
        self
    }

    /// The run starts at `now`: the readout's first trigger slot.
    pub fn start(&mut self, now: Nanos) {
        if let Some(p) = &mut self.pacing {
            p.epoch.get_or_insert(now);
        }
        if self.resync.is_some() {
            self.resync_deadline = Some(now.saturating_add(self.resync_wait));
        }
    }

    /// Paced readout: MEPs read out and waiting for a BU.
    pub fn waiting(&self) -> u64 {
        self.pacing.as_ref().map_or(0, |p| p.waiting)
    }

    /// Paced readout: when the next MEP arrives from the detector.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let resync = self.resync.as_ref().and(self.resync_deadline);
        let p = self.pacing.as_ref();
        let slot = p
            .filter(|_| !self.stopped && !self.stop_requested)
            .and_then(|p| Some(p.slot_time(p.epoch?, p.slots + 1)));
        // Held behind the node's backlog, the batch waits for the node to
        // say it has drained (its next step), not for the flush timer.
        let flush = self
            .pending_since
            .filter(|_| !self.control_backlog)
            .map(|t| self.flush_time(t));
        let orphaned = self.orphaned_until.filter(|_| !self.stopped);
        resync
            .into_iter()
            .chain(slot)
            .chain(flush)
            .chain(orphaned)
            .min()
    }

    /// Paced readout: the trigger slots up to `now` deliver their MEPs, or
    /// are vetoed while the RU buffers are full.
    pub fn on_timeout(&mut self, now: Nanos, out: &mut Vec<(NodeId, Message)>) {
        self.set_now(now);
        if self
            .pending_since
            .is_some_and(|t| now >= self.flush_time(t))
        {
            self.assign(out);
        }
        if self.resync.is_some() && self.resync_deadline.is_some_and(|d| now >= d) {
            // Who has not answered by now is gone for this EM.
            self.resync = Some(Vec::new());
            self.end_resync(out);
        }
        if self.orphaned_until.is_some_and(|d| now >= d) {
            self.orphaned_until = None;
            if !self.stopped && self.bu_lost.iter().all(|&l| l) {
                self.end_without_bus(out);
            }
        }
        if self.stopped || self.stop_requested {
            return;
        }
        let unbuilt = self.outstanding() as u64;
        let Some(p) = &mut self.pacing else {
            return;
        };
        let Some(epoch) = p.epoch else {
            return;
        };
        // The last slot whose time has come, by the same rounding as
        // `slot_time` (a float estimate could disagree by one and leave a
        // deadline that is due but delivers nothing: a busy loop).
        let mut due_slots = ((now.saturating_sub(epoch)) as f64 * p.rate_hz / 1e9) as u64;
        while p.slot_time(epoch, due_slots + 1) <= now {
            due_slots += 1;
        }
        while due_slots > 0 && p.slot_time(epoch, due_slots) > now {
            due_slots -= 1;
        }
        let mut due = due_slots.saturating_sub(p.slots);
        if self.max_meps != 0 {
            // Slots past the MEP budget deliver nothing: the run stops.
            due = due.min(self.max_meps.saturating_sub(self.next_mep + p.waiting));
        }
        if due == 0 {
            if self.max_meps != 0 && self.next_mep + p.waiting >= self.max_meps {
                self.stop(out);
            }
            return;
        }
        let room = p.buffer_meps.saturating_sub(p.waiting + unbuilt);
        let accepted = due.min(room);
        if accepted > 0 {
            if let Some(since) = p.throttled_since.take() {
                // The first slot with room ends the throttle.
                let end = p.slot_time(epoch, p.slots + 1);
                self.stats.throttled_ns += end.saturating_sub(since);
            }
            p.waiting += accepted;
        }
        if due > accepted {
            self.stats.meps_vetoed += due - accepted;
            if p.throttled_since.is_none() {
                self.stats.throttle_episodes += 1;
                p.throttled_since = Some(p.slot_time(epoch, p.slots + accepted + 1));
            }
        }
        p.slots += due;
        self.stats.max_waiting = self.stats.max_waiting.max(p.waiting);
        self.stats.max_unbuilt = self.stats.max_unbuilt.max(p.waiting + unbuilt);
        self.assign(out);
        if self.max_meps != 0 {
            let p = self.pacing.as_ref().expect("paced");
            if self.next_mep + p.waiting >= self.max_meps {
                self.stop(out);
            }
        }
    }

    /// Time throttled up to `now`, including a throttle still on.
    pub fn throttled_ns_at(&self, now: Nanos) -> u64 {
        let open = self
            .pacing
            .as_ref()
            .and_then(|p| p.throttled_since)
            .map_or(0, |since| now.saturating_sub(since));
        self.stats.throttled_ns + open
    }

    /// Closes the throttle bookkeeping at the end of the run.
    pub fn end_throttle(&mut self, now: Nanos) {
        if let Some(since) = self.pacing.as_mut().and_then(|p| p.throttled_since.take()) {
            self.stats.throttled_ns += now.saturating_sub(since);
        }
    }

    /// MEPs assigned so far (ids `0..meps_assigned`).
    pub fn meps_assigned(&self) -> MepId {
        self.next_mep
    }

    pub fn credits_of(&self, bu_index: usize) -> u32 {
        self.credits[bu_index]
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// A BU grants `credits`; assigns what it can. Messages go to `out`.
    pub fn on_credit(&mut self, bu_index: usize, credits: u32, out: &mut Vec<(NodeId, Message)>) {
        if self.bu_lost.get(bu_index) != Some(&false) {
            return;
        }
        self.credits[bu_index] = self.credits[bu_index].saturating_add(credits);
        self.granted[bu_index] = self.granted[bu_index].saturating_add(credits);
        self.assert_credits(bu_index);
        self.assign(out);
    }

    /// A BU's credits are conserved: each is either held here or lent out
    /// with a MEP not yet finished; only the BU adds to them.
    fn assert_credits(&self, b: usize) {
        assert_eq!(
            u64::from(self.credits[b]) + self.outstanding[b].len() as u64,
            u64::from(self.granted[b]),
            "EM: BU index {b} holds {} credits with {} MEPs out, of {} granted",
            self.credits[b],
            self.outstanding[b].len(),
            self.granted[b]
        );
    }

    /// Every MEP this EM assigned has one fate, or is still out: built,
    /// incomplete, corrupt or lost with its BU, else outstanding (at a BU,
    /// or awaiting a decision or re-assignment); a restarted EM's other
    /// MEPs are its predecessor's. Cheap enough for the EM's rare events
    /// (a loss, a rejoin, the end of the run) in every build, and checked
    /// at every `Finished` in debug builds.
    fn assert_accounting(&self) {
        let s = &self.stats;
        let fates = s.meps_built + s.meps_incomplete + s.meps_corrupt + s.meps_lost_bu_gone;
        assert_eq!(
            fates + self.outstanding() as u64 + self.inherited,
            s.meps_assigned,
            "EM: the MEPs' fates ({fates}), the MEPs out ({}) and those of a predecessor ({}) \
             do not add up to the MEPs assigned: {s:?}",
            self.outstanding(),
            self.inherited
        );
    }

    /// The BU of index `bu_index` had the `Revoked` of `mep`: forgotten;
    /// once it has nothing left to acknowledge, it gets MEPs again.
    pub fn on_revoked_ack(
        &mut self,
        bu_index: usize,
        mep: MepId,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        let Some(taken) = self.taken.get_mut(bu_index) else {
            return;
        };
        let before = taken.len();
        taken.retain(|&(m, named)| !(named && m == mep));
        if taken.len() < before && taken.is_empty() {
            self.assign(out);
        }
    }

    /// MEPs taken from the BU of index `b` that it has not acknowledged.
    pub fn revocations_pending(&self, b: usize) -> usize {
        self.taken.get(b).map_or(0, Vec::len)
    }

    /// Whether the BU of index `b` can take a MEP now: it has credit, and
    /// has acknowledged every MEP taken from it (until then what it has
    /// not may still be counted as its own).
    fn assignable(&self, b: usize) -> bool {
        self.credits[b] > 0 && self.taken[b].is_empty()
    }

    /// A BU finished `mep`: count its outcome, take the credit back.
    pub fn on_finished(
        &mut self,
        bu_index: usize,
        mep: MepId,
        code: u8,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        let Some(set) = self.outstanding.get_mut(bu_index) else {
            return;
        };
        if !set.remove(&mep) {
            return; // Not outstanding there: a duplicate or a confused BU.
        }
        match code {
            outcome::BUILT => self.stats.meps_built += 1,
            outcome::CORRUPT => self.stats.meps_corrupt += 1,
            _ => self.stats.meps_incomplete += 1,
        }
        // The credit lent with the MEP comes back: not a new grant.
        self.credits[bu_index] += 1;
        self.assert_credits(bu_index);
        if cfg!(debug_assertions) {
            self.assert_accounting();
        }
        self.assign(out);
    }

    /// MEPs assigned and not yet finished, over all BUs, including those
    /// of lost BUs awaiting a decision or re-assignment.
    pub fn outstanding(&self) -> usize {
        let held: usize = self
            .rounds
            .iter()
            .map(|r| r.meps.len() + r.to_place.len())
            .sum();
        self.outstanding.iter().map(BTreeSet::len).sum::<usize>() + held
    }

    /// Decision rounds on lost BUs not yet closed.
    pub fn open_rounds(&self) -> usize {
        self.rounds.len()
    }

    /// The RU of `source` still holds its fragment of `mep` for `round`.
    pub fn on_holding(&mut self, source: u16, round: u32, mep: MepId) {
        let s = source as usize;
        let Some(r) = self.rounds.iter_mut().find(|r| r.id == round) else {
            return; // Decided already, or junk.
        };
        if !r.waiting.get(s).copied().unwrap_or(false) {
            return;
        }
        if let Some(holders) = r.meps.get_mut(&mep) {
            holders[s] = true;
        }
    }

    /// The RU of `source` listed all it holds for `round`.
    pub fn on_holding_done(&mut self, source: u16, round: u32, out: &mut Vec<(NodeId, Message)>) {
        if let Some(r) = self.rounds.iter_mut().find(|r| r.id == round) {
            if let Some(w) = r.waiting.get_mut(source as usize) {
                *w = false;
            }
        }
        self.decide(out);
    }

    /// Decides every round whose answers are all in: a MEP every required
    /// RU holds waits for re-assignment, the rest are lost. Closes rounds
    /// with nothing left to place, then assigns.
    fn decide(&mut self, out: &mut Vec<(NodeId, Message)>) {
        for r in &mut self.rounds {
            if !r.decided() || r.meps.is_empty() {
                continue;
            }
            for (mep, holders) in std::mem::take(&mut r.meps) {
                let all_hold = r.required.iter().any(|&q| q)
                    && r.required.iter().zip(&holders).all(|(&q, &h)| !q || h);
                if all_hold {
                    r.to_place.push_back((mep, holders));
                } else {
                    self.stats.meps_lost_bu_gone += 1;
                }
            }
        }
        self.close_placed_rounds(out);
        self.assign(out);
    }

    /// Rounds decided with every re-assignment made are closed: the RUs
    /// drop what they still hold for them.
    fn close_placed_rounds(&mut self, out: &mut Vec<(NodeId, Message)>) {
        if self
            .rounds
            .iter()
            .any(|r| r.decided() && r.meps.is_empty() && r.to_place.is_empty())
        {
            self.flush_assignments(out);
        }
        let ru_lost = &self.ru_lost;
        let ru_nodes = &self.ru_nodes;
        self.rounds.retain(|r| {
            let closed = r.decided() && r.meps.is_empty() && r.to_place.is_empty();
            if closed {
                for (s, &ru) in ru_nodes.iter().enumerate() {
                    if !ru_lost[s] {
                        out.push((ru, Message::ReleaseHeld { round: r.id }));
                    }
                }
            }
            !closed
        });
    }

    /// Opens a decision round on the unfinished MEPs of lost BU `b`.
    fn open_round(&mut self, b: usize, out: &mut Vec<(NodeId, Message)>) {
        self.flush_assignments(out);
        let meps = std::mem::take(&mut self.outstanding[b]);
        if meps.is_empty() {
            return;
        }
        let live: Vec<bool> = self.ru_lost.iter().map(|&l| !l).collect();
        let id = self.next_round;
        self.next_round = self.next_round.wrapping_add(1);
        self.stats.reassign_rounds += 1;
        let bu = self.bu_nodes[b];
        for (s, &ru) in self.ru_nodes.iter().enumerate() {
            if live[s] {
                out.push((ru, Message::BuLost { bu, round: id }));
            }
        }
        let sources = self.ru_nodes.len();
        self.rounds.push_back(Round {
            id,
            required: live.clone(),
            waiting: live,
            meps: meps
                .into_iter()
                .map(|m| (m, vec![false; sources]))
                .collect(),
            to_place: VecDeque::new(),
        });
    }

    /// No BU is left: every MEP awaiting a decision or re-assignment is
    /// lost, and the rounds close (the RUs drop their orphans at EndOfRun).
    fn lose_all_rounds(&mut self) {
        for r in self.rounds.drain(..) {
            self.stats.meps_lost_bu_gone += (r.meps.len() + r.to_place.len()) as u64;
        }
    }

    /// Endpoint `node` is gone. Its BU gets nothing more, and what it had
    /// not finished is lost; without its RU, BUs build later MEPs from the
    /// other sources.
    pub fn on_node_lost(
        &mut self,
        node: NodeId,
        layout: &Layout,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        // Everything assigned before the loss goes out before what follows
        // from it (the RUs list what they hold after every assignment).
        self.flush_assignments(out);
        let mut new_round = None;
        if let Some(b) = layout.bu_of.get(node as usize).copied().flatten() {
            let b = b as usize;
            if !self.bu_lost[b] {
                self.bu_lost[b] = true;
                self.credits[b] = 0;
                self.granted[b] = 0;
                // Whatever becomes of them, they are no longer its own.
                debug_assert!(self.taken[b].is_empty() || self.outstanding[b].is_empty());
                let taken = &mut self.taken[b];
                for &mep in &self.outstanding[b] {
                    if !taken.iter().any(|&(m, _)| m == mep) {
                        taken.push((mep, false));
                    }
                }
                if self.stopped {
                    // After EndOfRun nothing can be re-assigned.
                    self.stats.meps_lost_bu_gone += self.outstanding[b].len() as u64;
                    self.outstanding[b].clear();
                } else {
                    // Once this node's RU, if any, is marked lost too: it
                    // is not asked.
                    new_round = Some(b);
                }
                self.stats.bus_lost.push(node);
            }
        }
        if let Some(s) = layout.ru_of.get(node as usize).copied().flatten() {
            if !self.ru_lost[s as usize] {
                self.ru_lost[s as usize] = true;
                self.stats.rus_lost.push(node);
                // Its answers are in, as far as they will ever be.
                for r in &mut self.rounds {
                    r.required[s as usize] = false;
                    r.waiting[s as usize] = false;
                }
                for (b, &bu) in self.bu_nodes.iter().enumerate() {
                    if !self.bu_lost[b] {
                        out.push((
                            bu,
                            Message::SourceDown {
                                source: s,
                                from_mep: self.next_mep,
                            },
                        ));
                    }
                }
            }
        }
        if let Some(b) = new_round {
            self.open_round(b, out);
        }
        if self.bu_lost.iter().all(|&l| l) && !self.stopped && self.resync.is_none() {
            // Nobody left to build. (A restarted EM that has not heard
            // from the nodes yet waits: they may be reconnecting.)
            if self.orphan_wait > 0 {
                // The RUs give up what they held for its rounds when they
                // see this EM again: those MEPs are lost now.
                self.lose_all_rounds();
                let until = self.now.saturating_add(self.orphan_wait);
                self.orphaned_until.get_or_insert(until);
            } else {
                self.end_without_bus(out);
            }
        } else {
            self.decide(out);
        }
        self.assert_accounting();
    }

    /// No BU is left (or came back in time): the run is over, and what the
    /// readout holds for a BU can never be built.
    fn end_without_bus(&mut self, out: &mut Vec<(NodeId, Message)>) {
        if let Some(p) = &mut self.pacing {
            self.stats.meps_lost_no_bu += p.waiting;
            p.waiting = 0;
        }
        self.lose_all_rounds();
        self.stop(out);
    }

    /// Endpoint `node` is back after it was lost (a new incarnation of the
    /// process, or the same one reconnected). Its BU is live again with no
    /// credit until it grants some, and is told which sources are down; its
    /// RU is in every assignment from the next MEP on, and the BUs are told
    /// so (`SourceUp`) before any such assignment. Nothing happens for an
    /// endpoint that was not lost; once the run has stopped, it is only
    /// told so (it missed the `EndOfRun`).
    pub fn on_node_joined(
        &mut self,
        node: NodeId,
        layout: &Layout,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        self.flush_assignments(out);
        if let Some(b) = layout.bu_of.get(node as usize).copied().flatten() {
            // First of all on the new link: what the EM took from it when
            // it lost it and it has not acknowledged (a new incarnation
            // never heard of them: it ignores them, and acknowledges).
            for (mep, named) in &mut self.taken[b as usize] {
                if std::mem::replace(named, true) {
                    self.stats.revoked_again += 1;
                } else {
                    self.stats.meps_revoked += 1;
                }
                out.push((node, Message::Revoked { mep: *mep }));
            }
        }
        if self.stopped {
            out.push((
                node,
                Message::EndOfRun {
                    meps: self.next_mep,
                },
            ));
            return;
        }
        let changed = self.slot_adapt.as_ref().is_some_and(|a| a.changes > 0);
        let has_ru = layout.ru_of.get(node as usize).is_some_and(Option::is_some);
        if let Some(epoch) = self.slot_epoch().filter(|_| changed && has_ru) {
            // A node that comes back knows only the nominal slots.
            out.push((node, slot_length(epoch)));
        }
        let mut rejoined = false;
        if let Some(b) = layout.bu_of.get(node as usize).copied().flatten() {
            let b = b as usize;
            if self.bu_lost[b] {
                self.bu_lost[b] = false;
                self.orphaned_until = None;
                self.credits[b] = 0;
                self.granted[b] = 0;
                rejoined = true;
                // A new BU expects every source: name the ones still down
                // (none of its MEPs will have them).
                for (s, &lost) in self.ru_lost.iter().enumerate() {
                    if lost && self.ru_nodes[s] != node {
                        out.push((
                            node,
                            Message::SourceDown {
                                source: s as u16,
                                from_mep: 0,
                            },
                        ));
                    }
                }
                // One that was only away missed the `SourceUp` of the
                // sources that came back meanwhile.
                self.sources_up_for(node, out);
            }
        }
        if let Some(s) = layout.ru_of.get(node as usize).copied().flatten() {
            if self.ru_lost[s as usize] {
                self.ru_lost[s as usize] = false;
                rejoined = true;
                for (b, &bu) in self.bu_nodes.iter().enumerate() {
                    if !self.bu_lost[b] {
                        out.push((
                            bu,
                            Message::SourceUp {
                                source: s,
                                from_mep: self.next_mep,
                            },
                        ));
                    }
                }
            }
        }
        if rejoined {
            self.stats.rejoined.push(node);
        }
        self.assert_accounting();
    }

    /// Stops assigning and tells every endpoint how many MEPs exist.
    /// Paced readout: MEPs already read out are assigned first; and every
    /// decision round on a lost BU's MEPs is closed first (its MEPs
    /// re-assigned or counted lost), so no RU is left holding them.
    pub fn stop(&mut self, out: &mut Vec<(NodeId, Message)>) {
        if self.stopped {
            return;
        }
        // A restarted EM does not know yet how many MEPs exist.
        if self.waiting() > 0 || !self.rounds.is_empty() || self.resync.is_some() {
            self.stop_requested = true;
            return;
        }
        self.stopped = true;
        self.assert_accounting();
        self.flush_assignments(out);
        for node in 0..self.endpoints {
            out.push((
                node,
                Message::EndOfRun {
                    meps: self.next_mep,
                },
            ));
        }
    }

    /// Whether a new MEP may be assigned now; ends the run when the budget
    /// is spent or a requested stop can go ahead.
    fn new_mep_allowed(&mut self, out: &mut Vec<(NodeId, Message)>) -> bool {
        match &self.pacing {
            // Paced: only MEPs the readout delivered are assigned.
            Some(p) if p.waiting == 0 => {
                if self.stop_requested {
                    self.stop_requested = false;
                    self.stop(out);
                }
                false
            }
            Some(_) => true,
            None if self.stop_requested
                || (self.max_meps != 0 && self.next_mep >= self.max_meps) =>
            {
                self.stop_requested = false;
                self.stop(out);
                false
            }
            None => true,
        }
    }

    /// New MEPs wait for the batch: fewer free credits than
    /// `assign_batch` (or than there are live BUs) and the oldest has not
    /// waited `assign_flush_ns`. Choosing the BUs of a whole batch at once,
    /// round robin, makes consecutive runs: one `AssignRun` for the batch
    /// rather than a message per MEP when credits come back in any order.
    fn hold_for_batch(&mut self) -> bool {
        if self.stop_requested {
            return false;
        }
        if self.control_backlog {
            self.pending_since.get_or_insert(self.now);
            self.held_for_backlog = true;
            return true;
        }
        if self.assign_batch <= 1 {
            self.pending_since = None;
            self.held_for_backlog = false;
            return false;
        }
        let live = self.bu_lost.iter().filter(|&&l| !l).count();
        let free: usize = (0..self.credits.len())
            .filter(|&b| self.taken[b].is_empty())
            .map(|b| self.credits[b] as usize)
            .sum();
        let due = self
            .pending_since
            .is_some_and(|t| self.now >= self.flush_time(t));
        if free == 0 || self.next_run_has_credit(self.assign_batch.min(live)) || due {
            self.pending_since = None;
            self.held_for_backlog = false;
            return false;
        }
        self.pending_since.get_or_insert(self.now);
        true
    }

    /// When a batch opened at `since` goes: at the flush timer, or at once
    /// if it waited for the node's backlog (which is gone when this is
    /// asked: a backlogged EM has no flush deadline).
    fn flush_time(&self, since: Nanos) -> Nanos {
        if self.held_for_backlog {
            since
        } else {
            since + self.assign_flush_ns
        }
    }

    /// Whether the next `count` live BUs in round-robin order, from
    /// `next_bu`, all have a credit: then the batch is one run of
    /// consecutive BUs, one `AssignRun` to every RU. Assigning as soon as
    /// enough credits are free, whichever BUs hold them, cut a batch into
    /// as many runs as there were gaps: at 540 BUs whose credits came in
    /// network order, about 100 runs to each RU, 3.4 MB from the EM's node
    /// at every rotation (276 us at 100 Gb/s, three slots of its own RU).
    fn next_run_has_credit(&self, count: usize) -> bool {
        let n = self.credits.len();
        (0..n)
            .map(|k| (self.next_bu + k) % n)
            .filter(|&b| !self.bu_lost[b])
            .take(count)
            .all(|b| self.assignable(b))
    }

    fn assign(&mut self, out: &mut Vec<(NodeId, Message)>) {
        if self.resync.is_some() {
            return;
        }
        if self.stopped {
            self.pending_since = None;
        }
        self.assign_new(out);
        self.flush_assignments(out);
    }

    fn assign_new(&mut self, out: &mut Vec<(NodeId, Message)>) {
        // Once released, a batch takes every free credit.
        let held = self.rounds.iter().all(|r| r.to_place.is_empty()) && self.hold_for_batch();
        while !self.stopped {
            // A lost BU's MEPs the RUs still hold go first.
            let again = self.rounds.iter().position(|r| !r.to_place.is_empty());
            if again.is_none() && (held || !self.new_mep_allowed(out)) {
                return;
            }
            let n = self.credits.len();
            let Some(bu) = (0..n)
                .map(|k| (self.next_bu + k) % n)
                .find(|&b| self.assignable(b))
            else {
                if !self.stalled {
                    self.stats.credit_stalls += 1;
                    self.stalled = true;
                }
                return;
            };
            self.stalled = false;
            self.credits[bu] -= 1;
            self.next_bu = (bu + 1) % n;
            let bu_node = self.bu_nodes[bu];
            let (mep, holders) = match again {
                Some(i) => {
                    let (mep, holders) = self.rounds[i].to_place.pop_front().expect("non-empty");
                    self.stats.meps_reassigned += 1;
                    (mep, Some(holders))
                }
                None => {
                    if let Some(p) = &mut self.pacing {
                        p.waiting -= 1;
                    }
                    let mep = self.next_mep;
                    self.next_mep += 1;
                    self.stats.meps_assigned += 1;
                    (mep, None)
                }
            };
            let new = self.outstanding[bu].insert(mep);
            assert!(new, "EM: MEP {mep} assigned twice to BU index {bu}");
            self.assert_credits(bu);
            let Some(holders) = holders else {
                // A new MEP: told with the others of its batch.
                self.pending.push((mep, bu as u16));
                continue;
            };
            // A re-assignment: to the BU, then only to the RUs that kept
            // the MEP (a folded node gets one copy), after what came before.
            self.flush_assignments(out);
            let msg = Message::Reassign { mep, bu: bu_node };
            out.push((bu_node, msg));
            for (s, &ru) in self.ru_nodes.iter().enumerate() {
                if ru != bu_node && !self.ru_lost[s] && holders[s] {
                    out.push((ru, msg));
                }
            }
            self.close_placed_rounds(out);
        }
    }
}

/// The message that tells an RU where the slots lie.
fn slot_length(epoch: SlotEpoch) -> Message {
    Message::SlotLength {
        from: epoch.from,
        start_ns: epoch.start_ns,
        slot_ns: epoch.slot_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn layout(nodes: u16) -> Layout {
        let mut config = Config::default();
        config.nodes.count = nodes;
        Layout::from_config(&config)
    }

    /// Every (destination, MEP, BU) an assignment message in `out` names.
    fn expanded(out: &[(NodeId, Message)]) -> Vec<(NodeId, MepId, NodeId)> {
        // The tests' layouts are folded: BU index i is on node i.
        let bu_nodes: Vec<NodeId> = (0..64).collect();
        out.iter()
            .flat_map(|(to, m)| {
                m.assignments(&bu_nodes)
                    .into_iter()
                    .map(move |(mep, bu)| (*to, mep, bu))
            })
            .collect()
    }

    fn assigns(out: &[(NodeId, Message)], bu: NodeId) -> usize {
        expanded(out).iter().filter(|a| a.0 == bu).count()
    }

    const MS: Nanos = 1_000_000;

    fn assigned_meps(out: &[(NodeId, Message)]) -> Vec<MepId> {
        let mut meps: Vec<MepId> = expanded(out).iter().map(|a| a.1).collect();
        meps.sort_unstable();
        meps.dedup();
        meps
    }

    /// A restarted EM (on node 0 of 4) assigns nothing until nodes 1, 2
    /// and 3 have said how far they saw, then goes on above the highest:
    /// no MEP id is handed out twice.
    #[test]
    fn a_restarted_em_resumes_above_what_every_node_saw() {
        let l = layout(4);
        let mut em = EventManager::new(&l, 0).resuming(&l, 0, 1_000);
        let mut out = Vec::new();
        em.start(0);
        em.on_credit(1, 2, &mut out);
        em.on_seen_up_to(1, 10, false, &mut out);
        em.on_seen_up_to(2, 12, false, &mut out);
        assert!(em.is_resyncing());
        assert_eq!(em.resync_waiting(), vec![3]);
        assert!(assigned_meps(&out).is_empty(), "{out:?}");
        em.on_seen_up_to(3, 11, false, &mut out);
        assert!(!em.is_resyncing());
        assert_eq!(em.stats.resumed_at, Some(12));
        assert_eq!(assigned_meps(&out), vec![12, 13]);
        // Counted from MEP 0: the predecessor's MEPs are in the accounting.
        assert_eq!(em.stats.meps_assigned, 14);
        // A later, lower report changes nothing.
        out.clear();
        em.on_seen_up_to(2, 5, false, &mut out);
        assert_eq!(em.meps_assigned(), 14);
        assert!(out.is_empty());
    }

    /// The `SourceUp`s in `out` to node `bu`, as (source, from_mep).
    fn sources_up(out: &[(NodeId, Message)], bu: NodeId) -> Vec<(u16, MepId)> {
        out.iter()
            .filter_map(|(to, m)| match *m {
                Message::SourceUp { source, from_mep } if *to == bu => Some((source, from_mep)),
                _ => None,
            })
            .collect()
    }

    /// A restarted EM tells every BU, before its first assignment, that
    /// each source it takes for live is up from where it resumes: a BU may
    /// still mask a source its dead predecessor declared gone and that came
    /// back while no EM lived to say so (over ofi:tcp, `evb chaos --seed
    /// 52`: the BUs dropped the restarted node's fragments as unexpected
    /// for the rest of the run, and its own BU built 24 batches in 20 s).
    #[test]
    fn a_restarted_em_says_every_live_source_is_up_before_it_assigns() {
        let l = layout(4);
        let mut em = EventManager::new(&l, 0).resuming(&l, 0, 1_000);
        let mut out = Vec::new();
        em.start(0);
        em.on_credit(1, 2, &mut out);
        for node in 1..4 {
            em.on_seen_up_to(node, 12, false, &mut out);
        }
        assert!(!em.is_resyncing());
        assert_eq!(assigned_meps(&out), vec![12, 13]);
        let first_assignment = out
            .iter()
            .position(|(_, m)| !m.assignments(&[0, 1, 2, 3]).is_empty())
            .unwrap();
        for bu in 0..4 {
            assert_eq!(
                sources_up(&out[..first_assignment], bu),
                vec![(0, 12), (1, 12), (2, 12), (3, 12)],
                "{out:?}"
            );
        }
    }

    /// A BU lost and taken back hears that every live source is up: a
    /// source that came back while it was away told only the BUs then live.
    #[test]
    fn a_bu_taken_back_hears_that_the_sources_back_meanwhile_are_up() {
        let l = layout(4);
        let mut em = EventManager::new(&l, 0);
        let mut out = Vec::new();
        em.start(0);
        em.on_node_lost(1, &l, &mut out);
        em.on_node_lost(2, &l, &mut out);
        em.on_node_joined(2, &l, &mut out);
        assert!(sources_up(&out, 1).is_empty(), "{out:?}");
        out.clear();
        em.on_node_joined(1, &l, &mut out);
        assert!(sources_up(&out, 1).iter().any(|&(s, _)| s == 2), "{out:?}");
    }

    /// A node the restarted EM lost may only be slow to reconnect: it is
    /// waited for until the deadline, not stopped for; a stop requested
    /// meanwhile waits for the resync, so EndOfRun names the right count.
    #[test]
    fn a_lost_node_holds_the_resync_until_its_deadline() {
        let l = layout(3);
        let mut em = EventManager::new(&l, 0).resuming(&l, 0, 1_000);
        let mut out = Vec::new();
        em.start(500);
        assert_eq!(em.next_deadline(), Some(1_500));
        em.on_seen_up_to(1, 7, false, &mut out);
        em.on_node_lost(2, &l, &mut out);
        em.stop(&mut out);
        assert!(em.is_resyncing(), "still waits for node 2");
        assert!(!em.is_stopped());
        assert!(!out
            .iter()
            .any(|(_, m)| matches!(m, Message::EndOfRun { .. })));
        em.on_timeout(1_499, &mut out);
        assert!(em.is_resyncing());
        em.on_timeout(1_500, &mut out);
        assert!(!em.is_resyncing());
        assert_eq!(em.stats.resumed_at, Some(7));
        assert!(em.is_stopped());
        assert!(out.iter().any(|(_, m)| *m == Message::EndOfRun { meps: 7 }));
    }

    /// While its node still holds earlier assignments for its link's
    /// headroom, the EM tells no new ones: the credits that come back
    /// meanwhile go out together, as one run to each RU, as soon as the
    /// node has drained (not at the flush timer), so the EM's messages do
    /// not outgrow its link however slowly the node lets them out.
    #[test]
    fn assignments_wait_for_the_nodes_backlog_and_go_as_one_run() {
        let l = layout(4);
        let mut em = EventManager::new(&l, 0).batched(1, 500_000);
        let mut out = Vec::new();
        em.start(0);
        em.set_control_backlog(true);
        for bu in 0..4 {
            em.on_credit(bu, 1, &mut out);
        }
        assert!(out.is_empty(), "held behind the backlog: {out:?}");
        assert_eq!(em.next_deadline(), None, "no flush timer while backlogged");
        em.set_control_backlog(false);
        assert_eq!(em.next_deadline(), Some(0), "due at once once drained");
        em.on_timeout(10, &mut out);
        assert_eq!(assigned_meps(&out), vec![0, 1, 2, 3]);
        let runs: Vec<_> = out
            .iter()
            .filter(|(to, m)| *to == 1 && matches!(m, Message::AssignRun { .. }))
            .collect();
        assert_eq!(runs.len(), 1, "one run to RU 1: {out:?}");
        // Without a backlog, a batch of 1 goes at once, message by message.
        out.clear();
        em.on_credit(2, 1, &mut out);
        assert_eq!(assigned_meps(&out), vec![4]);
    }

    /// A live EM knows how far it got: a node's report cannot move it.
    #[test]
    fn a_live_em_ignores_seen_up_to() {
        let l = layout(2);
        let mut em = EventManager::new(&l, 0);
        let mut out = Vec::new();
        em.start(0);
        em.on_credit(1, 3, &mut out);
        assert_eq!(em.meps_assigned(), 3);
        em.on_seen_up_to(1, 2, false, &mut out);
        assert_eq!(em.meps_assigned(), 3);
        assert_eq!(em.stats.resumed_at, None);
    }

    #[test]
    fn paced_readout_delivers_at_its_rate_and_throttles_when_the_buffer_is_full() {
        let l = layout(2);
        // 1000 MEPs/s, at most 4 MEPs not yet built.
        let mut em = EventManager::new(&l, 0).paced(1000.0, 4);
        let mut out = Vec::new();
        em.start(0);
        em.on_credit(0, 2, &mut out);
        assert!(out.is_empty(), "nothing read out yet, nothing to assign");
        assert_eq!(em.next_deadline(), Some(MS));
        em.on_timeout(3 * MS, &mut out);
        // Three MEPs arrived, two BU credits: two assigned, one waits.
        assert_eq!(assigns(&out, 0), 2);
        assert_eq!(em.waiting(), 1);
        assert_eq!(em.stats.meps_vetoed, 0);
        // 5 more slots: room for 1 (4 - 2 outstanding - 1 waiting); 4 vetoed
        // from slot 5 on.
        em.on_timeout(8 * MS, &mut out);
        assert_eq!(em.waiting(), 2);
        assert_eq!(em.stats.meps_vetoed, 4);
        assert_eq!(em.stats.throttle_episodes, 1);
        assert_eq!(em.stats.max_unbuilt, 4);
        // A BU finishes one MEP: a waiting one takes its credit.
        out.clear();
        em.on_finished(0, 0, outcome::BUILT, &mut out);
        assert_eq!(assigns(&out, 0), 1);
        assert_eq!(em.waiting(), 1);
        // Slot 9 finds room: the throttle (since slot 5, 5 ms) ends at 9 ms.
        em.on_timeout(9 * MS, &mut out);
        assert_eq!(em.stats.throttled_ns, 4 * MS);
        assert_eq!(em.stats.meps_vetoed, 4);
        assert_eq!(em.waiting(), 2);
        // Stop: the waiting MEPs are assigned before EndOfRun goes out.
        out.clear();
        em.stop(&mut out);
        assert!(!em.is_stopped());
        assert!(out.is_empty());
        for mep in [1, 2] {
            em.on_finished(0, mep, outcome::BUILT, &mut out);
        }
        assert!(em.waiting() == 0 && em.is_stopped(), "{out:?}");
        let end = out.iter().find_map(|(_, m)| match m {
            Message::EndOfRun { meps } => Some(*meps),
            _ => None,
        });
        // Slots 1..=9 read out 9 MEPs, 4 vetoed: 5 exist.
        assert_eq!(end, Some(5));
        assert_eq!(em.stats.meps_assigned, 5);
        assert_eq!(em.next_deadline(), None);
    }

    #[test]
    fn paced_readout_stops_at_max_meps_and_accounts_waiting_meps_when_all_bus_die() {
        let l = layout(2);
        let mut em = EventManager::new(&l, 3).paced(1000.0, 16);
        let mut out = Vec::new();
        em.start(0);
        em.on_timeout(10 * MS, &mut out);
        assert_eq!(em.waiting(), 3, "no more than max_meps read out");
        em.on_credit(1, 1, &mut out);
        assert_eq!(em.waiting(), 2);
        assert!(!em.is_stopped(), "waits to assign what was read out");
        for node in [0, 1] {
            em.on_node_lost(node, &l, &mut out);
        }
        assert!(em.is_stopped());
        assert_eq!(em.stats.meps_lost_no_bu, 2);
        assert_eq!(em.stats.meps_lost_bu_gone, 1);
    }

    #[test]
    fn every_paced_deadline_delivers_its_slot() {
        // Found by the DST: a float estimate of the due slot one below the
        // slot whose deadline had come left the node spinning on it.
        let l = layout(2);
        for rate in [3.0, 7.0, 1e3 / 3.0, 12_345.678, 1e6 / 7.0, 9_999_999.0] {
            let mut em = EventManager::new(&l, 0).paced(rate, 1_000_000);
            let mut out = Vec::new();
            em.start(17);
            let mut last = 0;
            for _ in 0..5000 {
                let d = em.next_deadline().expect("paced");
                assert!(d > last, "rate {rate}: deadline {d} after {last}");
                em.on_timeout(d, &mut out);
                last = d;
            }
            assert_eq!(em.waiting(), 5000, "rate {rate}");
        }
    }

    #[test]
    fn unpaced_manager_has_no_clock() {
        let l = layout(2);
        let mut em = EventManager::new(&l, 0).paced(0.0, 4);
        em.start(5);
        assert_eq!(em.next_deadline(), None);
        let mut out = Vec::new();
        em.on_credit(0, 2, &mut out);
        assert_eq!(assigns(&out, 0), 2);
    }

    fn count(out: &[(NodeId, Message)], f: impl Fn(&Message) -> bool) -> usize {
        out.iter().filter(|(_, m)| f(m)).count()
    }

    /// Three nodes, each an RU and a BU; BU 1 (node 1) takes MEPs 0 and 1,
    /// then node 1 dies. Returns the EM and what it said on the loss.
    fn lose_node_1_with_two_meps() -> (EventManager, Layout, Vec<(NodeId, Message)>) {
        let l = layout(3);
        let mut em = EventManager::new(&l, 0);
        let mut out = Vec::new();
        em.on_credit(1, 2, &mut out);
        assert_eq!(assigns(&out, 1), 2);
        out.clear();
        em.on_node_lost(1, &l, &mut out);
        (em, l, out)
    }

    #[test]
    fn meps_every_live_ru_holds_are_reassigned_ahead_of_new_ones() {
        let (mut em, _l, out) = lose_node_1_with_two_meps();
        // The live RUs (nodes 0 and 2) are asked; node 1's RU died with it.
        let asked: Vec<NodeId> = out
            .iter()
            .filter(|(_, m)| matches!(m, Message::BuLost { bu: 1, round: 0 }))
            .map(|(to, _)| *to)
            .collect();
        assert_eq!(asked, vec![0, 2]);
        assert_eq!(em.outstanding(), 2, "still to be decided");
        let mut out = Vec::new();
        em.stop(&mut out);
        assert!(!em.is_stopped(), "EndOfRun waits for the decision");
        for ru in [0, 2] {
            em.on_holding(ru, 0, 0);
            em.on_holding(ru, 0, 1);
            em.on_holding(ru, 0, 99); // Not the lost BU's: ignored.
            em.on_holding_done(ru, 0, &mut out);
        }
        assert!(out.is_empty(), "no BU has credit yet: {out:?}");
        // BU 2 grants one credit: MEP 0 goes there, to BU 2 and RU 0 (node
        // 2's RU gets the copy on its node); no new MEP.
        em.on_credit(2, 1, &mut out);
        assert_eq!(
            out,
            vec![
                (2, Message::Reassign { mep: 0, bu: 2 }),
                (0, Message::Reassign { mep: 0, bu: 2 })
            ]
        );
        out.clear();
        em.on_credit(0, 1, &mut out);
        assert_eq!(
            count(&out, |m| matches!(m, Message::Reassign { mep: 1, bu: 0 })),
            2
        );
        // The round is closed: the RUs drop what is left, then EndOfRun.
        assert_eq!(
            count(&out, |m| matches!(m, Message::ReleaseHeld { round: 0 })),
            2
        );
        assert!(expanded(&out).is_empty());
        assert!(em.is_stopped());
        assert_eq!(em.meps_assigned(), 2, "no new MEP after the stop");
        let release = out
            .iter()
            .position(|(_, m)| matches!(m, Message::ReleaseHeld { .. }));
        let end = out
            .iter()
            .position(|(_, m)| matches!(m, Message::EndOfRun { .. }));
        assert!(release < end, "{out:?}");
        em.on_finished(2, 0, outcome::BUILT, &mut out);
        em.on_finished(0, 1, outcome::INCOMPLETE, &mut out);
        assert_eq!(em.stats.meps_reassigned, 2);
        assert_eq!(em.stats.meps_lost_bu_gone, 0);
        assert_eq!((em.stats.meps_built, em.stats.meps_incomplete), (1, 1));
        assert_eq!(em.outstanding(), 0);
    }

    #[test]
    fn a_mep_one_ru_no_longer_holds_is_lost() {
        let (mut em, _l, _) = lose_node_1_with_two_meps();
        let mut out = Vec::new();
        em.on_holding(0, 0, 0);
        em.on_holding(0, 0, 1);
        em.on_holding_done(0, 0, &mut out);
        // RU 2 had shipped MEP 1 to the dead BU.
        em.on_holding(2, 0, 0);
        em.on_holding_done(2, 0, &mut out);
        em.on_credit(2, 1, &mut out);
        assert_eq!(em.stats.meps_lost_bu_gone, 1);
        assert_eq!(em.stats.meps_reassigned, 1);
        assert_eq!(
            count(&out, |m| matches!(m, Message::Reassign { mep: 0, .. })),
            2
        );
        assert_eq!(
            count(&out, |m| matches!(m, Message::Reassign { mep: 1, .. })),
            0
        );
        assert_eq!(
            count(&out, |m| matches!(m, Message::ReleaseHeld { round: 0 })),
            2
        );
        // Exact: every MEP assigned is lost, finished, or outstanding (the
        // returned credit took MEP 2).
        em.on_finished(2, 0, outcome::BUILT, &mut out);
        let s = &em.stats;
        assert_eq!(s.meps_assigned, 3);
        assert_eq!(
            s.meps_built + s.meps_lost_bu_gone + em.outstanding() as u64,
            s.meps_assigned
        );
    }

    #[test]
    fn an_ru_lost_during_the_decision_counts_as_answered() {
        let (mut em, l, _) = lose_node_1_with_two_meps();
        let mut out = Vec::new();
        em.on_holding(0, 0, 0);
        em.on_holding(0, 0, 1);
        em.on_holding_done(0, 0, &mut out);
        assert_eq!(em.open_rounds(), 1, "RU 2 has not answered");
        // Node 2 (RU 2 and BU 2) dies before answering: RU 0 alone decides;
        // BU 0 is left to build.
        em.on_node_lost(2, &l, &mut out);
        assert_eq!(em.stats.meps_lost_bu_gone, 0);
        out.clear();
        em.on_credit(0, 2, &mut out);
        assert_eq!(em.stats.meps_reassigned, 2);
        assert_eq!(
            count(&out, |m| matches!(m, Message::Reassign { bu: 0, .. })),
            2
        );
        // Only the live RU is told to drop the rest.
        assert_eq!(
            out.iter()
                .filter(|(_, m)| matches!(m, Message::ReleaseHeld { .. }))
                .map(|(to, _)| *to)
                .collect::<Vec<_>>(),
            vec![0]
        );
        assert_eq!(em.open_rounds(), 0);
        // A late answer of a closed round changes nothing.
        em.on_holding_done(2, 0, &mut out);
        assert_eq!(em.stats.meps_reassigned, 2);
    }

    #[test]
    fn with_no_bu_left_the_undecided_meps_are_lost_and_the_run_ends() {
        let (mut em, l, _) = lose_node_1_with_two_meps();
        let mut out = Vec::new();
        em.on_node_lost(2, &l, &mut out);
        assert!(!em.is_stopped());
        // BU 0 lives on the EM's node; losing every other BU and then it
        // (as a test: the EM's node cannot really be lost) ends the run.
        em.on_node_lost(0, &l, &mut out);
        assert!(em.is_stopped());
        assert_eq!(em.stats.meps_lost_bu_gone, 2);
        assert_eq!(em.outstanding(), 0);
    }

    /// A BU lost while alive comes back: before anything else on the new
    /// link it hears which MEPs the EM took from it (re-assigned or lost).
    /// Until it acknowledges them it gets no MEP, and hears them again at
    /// each rejoin (the link may have dropped them); once acknowledged,
    /// never again. A BU that was not lost hears nothing.
    #[test]
    fn a_bu_taken_back_hears_which_meps_were_taken_from_it_until_it_acknowledges() {
        let (mut em, l, _) = lose_node_1_with_two_meps();
        let revoked = |out: &[(NodeId, Message)]| {
            out.iter()
                .filter(|(to, m)| *to == 1 && matches!(m, Message::Revoked { .. }))
                .map(|(_, m)| *m)
                .collect::<Vec<_>>()
        };
        // MEPs assigned to the BU of node `bu` (told to it).
        let to_bu = |out: &[(NodeId, Message)], bu: NodeId| {
            expanded(out)
                .iter()
                .filter(|a| a.0 == bu && a.2 == bu)
                .count()
        };
        let both = vec![Message::Revoked { mep: 0 }, Message::Revoked { mep: 1 }];
        let mut out = Vec::new();
        em.on_node_joined(1, &l, &mut out);
        assert_eq!(
            out.iter()
                .filter(|(to, _)| *to == 1)
                .take(2)
                .map(|(_, m)| *m)
                .collect::<Vec<_>>(),
            both
        );
        assert_eq!((em.stats.meps_revoked, em.stats.revoked_again), (2, 0));
        // Its credit waits for the acknowledgements: its MEPs go elsewhere.
        out.clear();
        em.on_credit(1, 2, &mut out);
        em.on_credit(2, 1, &mut out);
        assert_eq!((to_bu(&out, 1), to_bu(&out, 2)), (0, 1), "{out:?}");
        // The link drops again before they arrive: lost with nothing out,
        // told again when it comes back.
        out.clear();
        em.on_node_lost(1, &l, &mut out);
        em.on_node_joined(1, &l, &mut out);
        assert_eq!(revoked(&out), both);
        assert_eq!((em.stats.meps_revoked, em.stats.revoked_again), (2, 2));
        assert_eq!(em.revocations_pending(1), 2);
        // Acknowledged (one of them twice): forgotten; then it gets MEPs.
        out.clear();
        em.on_credit(1, 2, &mut out);
        em.on_revoked_ack(1, 0, &mut out);
        em.on_revoked_ack(1, 0, &mut out);
        assert_eq!(to_bu(&out, 1), 0);
        em.on_revoked_ack(1, 1, &mut out);
        assert_eq!(em.revocations_pending(1), 0);
        assert_eq!(to_bu(&out, 1), 2, "{out:?}");
        out.clear();
        em.on_node_joined(1, &l, &mut out);
        em.on_node_joined(2, &l, &mut out);
        assert_eq!(
            count(&out, |m| matches!(m, Message::Revoked { .. })),
            0,
            "{out:?}"
        );
        // Lost again with two MEPs out: those are taken now.
        em.on_node_lost(1, &l, &mut out);
        em.on_node_joined(1, &l, &mut out);
        assert_eq!(revoked(&out).len(), 2);
        assert_eq!(em.stats.meps_revoked, 4);
    }

    #[test]
    fn after_end_of_run_a_lost_bus_meps_are_lost_at_once() {
        let l = layout(3);
        let mut em = EventManager::new(&l, 2);
        let mut out = Vec::new();
        em.on_credit(1, 2, &mut out);
        assert!(em.is_stopped());
        out.clear();
        em.on_node_lost(1, &l, &mut out);
        assert_eq!(em.stats.meps_lost_bu_gone, 2);
        assert_eq!(count(&out, |m| matches!(m, Message::BuLost { .. })), 0);
    }
}
