//! Filter Unit: a consumer of built batches, at the output of the event
//! builder.
//!
//! Consumers are the reason the builder cannot run freely: a filter farm
//! node is busy for a while with every batch it takes. Each FU grants every
//! BU `consumer_credits` batches; it verifies what arrives, works on one
//! batch at a time for a drawn busy time, and returns one credit to the BU
//! the batch came from when it is done. A BU without consumer credit keeps
//! its batches, and then its EM credits, which is how busy consumers slow
//! the whole builder down instead of losing data.
//!
//! Each FU is also a software trigger: it accepts a fraction of the events
//! it consumes (`output.accept_fraction`), a decision per event drawn from
//! the run seed and the event's number, so every run (and the simulator)
//! accepts the same events. The driver stores what was accepted.
//!
//! Time is passed in and the busy times come from a generator seeded from
//! the configuration, so runs replay exactly.
//!
//! An FU whose work is someone else's (an external consumer through
//! `libevb`: a trigger process in C++ or Python) holds its deliveries
//! instead ([`FilterUnit::hold_deliveries`]): each intact batch is the
//! application's from its arrival until the driver says it is done with it
//! ([`FilterUnit::release`]), with the same credits, accounting and end of
//! output; no busy time is drawn.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::bu::{Admit, Nanos};
use crate::config::{BusyModel, Config};
use crate::layout::Layout;
use crate::source::mix64;
use crate::wire::{FragmentHeader, MepId, NodeId, FLAG_BATCH};

/// What the FU asks of its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuAction {
    /// Grant `credits` to the BU on endpoint `bu`.
    Credit { bu: NodeId, credits: u32 },
    /// The FU is done with `mep` from the BU on endpoint `bu`: its buffer
    /// can be freed.
    Consumed { mep: MepId, bu: NodeId },
}

/// Counters of a Filter Unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FuStats {
    /// Deliveries whose payload arrived (admitted under credit), their
    /// events and payload bytes: what this consumer received, consumed or not.
    pub batches_received: u64,
    pub events_received: u64,
    pub bytes_received: u64,
    pub batches_consumed: u64,
    pub events_consumed: u64,
    /// Payload bytes of the batches consumed (fragment table included).
    pub bytes_consumed: u64,
    /// Batches whose CRC or shape did not verify (still consumed: their
    /// credit returns, the data is counted bad).
    pub batches_corrupt: u64,
    /// Deliveries flagged partial (incomplete batches a BU delivered
    /// anyway, `output.deliver_partial`): received and consumed like any.
    pub batches_partial: u64,
    /// Deliveries beyond the credit granted, from a non-BU, or another run:
    /// dropped, no credit returned.
    pub deliveries_unexpected: u64,
    /// Events of the consumed batches the trigger accepted, and the
    /// consumed batches with at least one accepted event.
    pub events_accepted: u64,
    pub batches_accepted: u64,
    /// Total time spent busy, ns.
    pub busy_ns: u64,
    /// Most batches waiting at once (not counting the one being worked on).
    pub max_queued: u32,
}

#[derive(Debug, Clone, Copy)]
struct Delivery {
    mep: MepId,
    bu_index: u16,
    /// The link to its BU it came over ([`FilterUnit::on_producer_lost`]
    /// starts a new one): only a delivery of the current link returns a
    /// credit.
    link: u32,
    events: u64,
    bytes: u64,
}

#[derive(Debug, Clone)]
pub struct FilterUnit {
    index: u16,
    run_id: u32,
    credits: u32,
    busy_mean_ns: u64,
    busy_model: BusyModel,
    /// An event is accepted when its hash is below this (`None`: all are).
    accept_below: Option<u64>,
    accept_seed: u64,
    rng: Pcg64Mcg,
    bu_nodes: Vec<NodeId>,
    bu_of: Vec<Option<u16>>,
    /// Per BU index: deliveries it may still make (credit granted, unused).
    granted: Vec<u32>,
    /// Per BU index: it said it delivers nothing more, or it is gone.
    ended: Vec<bool>,
    /// Per BU index: its link is lost (and not back).
    lost: Vec<bool>,
    /// Per BU index: links to it lost so far (the current link's number).
    link: Vec<u32>,
    queue: VecDeque<Delivery>,
    /// The batch being worked on, and when that work ends.
    current: Option<(Delivery, Nanos, Nanos)>,
    /// Per BU index: admitted deliveries whose payload has not arrived yet.
    admitted: Vec<u32>,
    /// Hold mode: the deliveries the driver's application holds, and
    /// since when.
    hold: bool,
    held: Vec<(Delivery, Nanos)>,
    pub stats: FuStats,
}

impl FilterUnit {
    pub fn new(config: &Config, layout: &Layout, node: NodeId) -> FilterUnit {
        let index = layout.fu_of[node as usize].expect("an FU endpoint");
        let out = &config.output;
        FilterUnit {
            index,
            run_id: config.run.run_id,
            credits: out.consumer_credits,
            busy_mean_ns: out.consumer_busy_us.saturating_mul(1000),
            busy_model: out.consumer_busy,
            accept_below: (out.accept_fraction < 1.0)
                .then_some((out.accept_fraction * u64::MAX as f64) as u64),
            accept_seed: mix64(config.run.seed ^ 0xacce_97ed),
            rng: Pcg64Mcg::seed_from_u64(mix64(
                config.run.seed ^ (0xf17e << 32) ^ u64::from(index),
            )),
            bu_nodes: layout.bu_nodes.clone(),
            bu_of: layout.bu_of.clone(),
            granted: vec![0; layout.bus()],
            ended: vec![false; layout.bus()],
            lost: vec![false; layout.bus()],
            link: vec![0; layout.bus()],
            queue: VecDeque::new(),
            current: None,
            admitted: vec![0; layout.bus()],
            hold: false,
            held: Vec::new(),
            stats: FuStats::default(),
        }
    }

    pub fn index(&self) -> u16 {
        self.index
    }

    /// Grants every BU its credits.
    pub fn start(&mut self, out: &mut Vec<FuAction>) {
        for (b, &bu) in self.bu_nodes.iter().enumerate() {
            self.granted[b] = self.credits;
            out.push(FuAction::Credit {
                bu,
                credits: self.credits,
            });
        }
    }

    /// Working on a batch right now.
    pub fn is_busy(&self) -> bool {
        self.current.is_some()
    }

    /// Time spent busy up to `now`, the batch in hand included, ns (in
    /// hold mode, summed over the batches held).
    pub fn busy_time(&self, now: Nanos) -> u64 {
        let current = self.current.map_or(0, |(_, started, until)| {
            now.min(until).saturating_sub(started)
        });
        let held: u64 = self
            .held
            .iter()
            .map(|(_, since)| now.saturating_sub(*since))
            .sum();
        self.stats.busy_ns + current + held
    }

    /// The driver's application decides when each batch is done: every
    /// intact delivery is held, from its arrival until
    /// [`FilterUnit::release`], with no drawn busy time (a corrupt one is
    /// consumed at once: its credit returns, it is counted bad). Call
    /// before the first delivery.
    pub fn hold_deliveries(&mut self) {
        self.hold = true;
    }

    /// Deliveries the application holds (hold mode).
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Hold mode: the application is done with `mep` from the BU on
    /// endpoint `bu`: it is consumed, and its credit returns to that BU
    /// (unless the BU ended its output or is gone). False when no such
    /// delivery is held.
    pub fn release(&mut self, now: Nanos, bu: NodeId, mep: MepId, out: &mut Vec<FuAction>) -> bool {
        let Some(b) = self.bu_of.get(bu as usize).copied().flatten() else {
            return false;
        };
        let Some(at) = self
            .held
            .iter()
            .position(|(d, _)| d.mep == mep && d.bu_index == b)
        else {
            return false;
        };
        let (d, since) = self.held.swap_remove(at);
        self.finish_delivery(d, since, now, out);
        true
    }

    /// Batches waiting behind the current one.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Per BU index: credits granted to it and not used yet.
    pub fn credits_outstanding(&self) -> &[u32] {
        &self.granted
    }

    /// The driver spent `ns` of real work on a batch (its trigger's
    /// processing, `output.consumer_work_passes`): counted as busy time.
    pub fn record_work(&mut self, ns: u64) {
        self.stats.busy_ns += ns;
    }

    /// Nothing to do and nothing more will come.
    pub fn is_finished(&self) -> bool {
        self.current.is_none()
            && self.queue.is_empty()
            && self.held.is_empty()
            && self.admitted.iter().all(|&a| a == 0)
            && self.ended.iter().all(|&e| e)
    }

    /// BUs that may still deliver, for diagnostics.
    pub fn producers_open(&self) -> usize {
        self.ended.iter().filter(|&&e| !e).count()
    }

    /// The trigger's decision on event `event` (0-based within the MEP) of
    /// `mep`: the same in every run with this seed, on every FU.
    pub fn accepts(&self, mep: MepId, event: u32) -> bool {
        match self.accept_below {
            None => true,
            Some(below) => {
                let key = mix64(self.accept_seed ^ mep.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                mix64(key ^ u64::from(event)) < below
            }
        }
    }

    /// The accepted events of a batch of `events` events, in order.
    pub fn accepted_events(&self, mep: MepId, events: u32, out: &mut Vec<u32>) {
        out.clear();
        out.extend((0..events).filter(|&e| self.accepts(mep, e)));
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        self.current.map(|(_, _, until)| until)
    }

    /// A delivery header from endpoint `from`: keep its payload? Takes the
    /// credit it uses.
    pub fn admit(&mut self, from: NodeId, h: &FragmentHeader) -> Admit {
        let bu = self.bu_of.get(from as usize).copied().flatten();
        let ok = h.flags & FLAG_BATCH != 0 && h.run_id == self.run_id && bu == Some(h.source);
        match bu {
            Some(b) if ok && !self.ended[b as usize] && self.granted[b as usize] > 0 => {
                self.granted[b as usize] -= 1;
                self.admitted[b as usize] += 1;
                Admit::Keep
            }
            _ => {
                self.stats.deliveries_unexpected += 1;
                Admit::Drop
            }
        }
    }

    /// The payload of an admitted delivery is in. `intact`: its CRC and
    /// fragment table verified.
    pub fn on_delivery(
        &mut self,
        now: Nanos,
        h: &FragmentHeader,
        intact: bool,
        out: &mut Vec<FuAction>,
    ) {
        if let Some(a) = self.admitted.get_mut(h.source as usize) {
            *a = a.saturating_sub(1);
        }
        self.stats.batches_received += 1;
        self.stats.events_received += u64::from(h.event_count);
        self.stats.bytes_received += u64::from(h.payload_len);
        if !intact {
            self.stats.batches_corrupt += 1;
        }
        if h.flags & crate::wire::FLAG_PARTIAL != 0 {
            self.stats.batches_partial += 1;
        }
        let d = Delivery {
            mep: h.mep,
            bu_index: h.source,
            link: self.link.get(h.source as usize).copied().unwrap_or(0),
            events: u64::from(h.event_count),
            bytes: u64::from(h.payload_len),
        };
        if self.hold {
            if intact {
                self.held.push((d, now));
            } else {
                self.finish_delivery(d, now, now, out);
            }
            return;
        }
        self.queue.push_back(d);
        self.stats.max_queued = self.stats.max_queued.max(self.queue.len() as u32);
        self.work(now, out);
    }

    /// The BU on endpoint `bu` delivers nothing more.
    pub fn on_output_end(&mut self, bu: NodeId) {
        if let Some(b) = self.bu_of.get(bu as usize).copied().flatten() {
            self.ended[b as usize] = true;
        }
    }

    /// Endpoint `peer` is gone: if it was a BU, expect nothing more from it
    /// (a delivery it admitted but never finished sending is forgotten).
    /// What it delivered and this FU has not started on is dropped
    /// unconsumed (the driver frees it: [`FilterUnit::holds`]), the batch
    /// in hand too: the BU delivers every batch it has no credit back for
    /// again, to another consumer or to this one when the link is back,
    /// and a batch consumed here as well would be consumed (and stored)
    /// twice. A batch the application holds stays its own, but its credit
    /// no longer returns.
    pub fn on_producer_lost(&mut self, now: Nanos, peer: NodeId, out: &mut Vec<FuAction>) {
        let Some(b) = self.bu_of.get(peer as usize).copied().flatten() else {
            return;
        };
        let b = b as usize;
        self.ended[b] = true;
        if self.lost[b] {
            return;
        }
        self.lost[b] = true;
        self.link[b] += 1;
        self.granted[b] = 0;
        self.admitted[b] = 0;
        self.queue.retain(|d| d.bu_index as usize != b);
        if let Some((d, started, _)) = self.current {
            if d.bu_index as usize == b {
                // Its work is undone; the time spent on it still counts.
                self.stats.busy_ns += now.saturating_sub(started);
                self.current = None;
                self.work(now, out);
            }
        }
    }

    /// Endpoint `peer`, a BU lost before, is back (restarted, or over a
    /// new link): it gets a fresh grant of credits, and delivers until it
    /// says it is through.
    pub fn on_producer_joined(&mut self, now: Nanos, peer: NodeId, out: &mut Vec<FuAction>) {
        let Some(b) = self.bu_of.get(peer as usize).copied().flatten() else {
            return;
        };
        // A loss that went unnoticed (a restart quicker than the peer
        // timeout) is a loss all the same.
        self.on_producer_lost(now, peer, out);
        let b = b as usize;
        self.lost[b] = false;
        self.ended[b] = false;
        self.granted[b] = self.credits;
        out.push(FuAction::Credit {
            bu: peer,
            credits: self.credits,
        });
    }

    /// Whether this FU still has batch `mep` of the BU on endpoint `bu`
    /// (queued, in hand, or held by the application): a delivery it no
    /// longer has and never consumed was dropped with its BU's link.
    pub fn holds(&self, bu: NodeId, mep: MepId) -> bool {
        let Some(b) = self.bu_of.get(bu as usize).copied().flatten() else {
            return false;
        };
        let is = |d: &Delivery| d.bu_index == b && d.mep == mep;
        self.queue.iter().any(is)
            || self.current.is_some_and(|(d, _, _)| is(&d))
            || self.held.iter().any(|(d, _)| is(d))
    }

    /// The drain period is over: stop waiting for anyone.
    pub fn abandon(&mut self) {
        self.ended.fill(true);
        self.admitted.fill(0);
    }

    pub fn on_timeout(&mut self, now: Nanos, out: &mut Vec<FuAction>) {
        self.work(now, out);
    }

    /// Finishes the current batch if its time is up, then starts the next.
    fn work(&mut self, now: Nanos, out: &mut Vec<FuAction>) {
        loop {
            if let Some((d, started, until)) = self.current {
                if until > now {
                    return;
                }
                self.current = None;
                self.finish_delivery(d, started, until, out);
            }
            let Some(next) = self.queue.pop_front() else {
                return;
            };
            // Work starts when the previous batch ended, or now if idle.
            let busy = self.draw_busy();
            self.current = Some((next, now, now + busy));
        }
    }

    /// Delivery `d`, worked on from `started` to `ended`, is consumed: its
    /// buffer can go, and its credit returns to a BU still delivering.
    fn finish_delivery(
        &mut self,
        d: Delivery,
        started: Nanos,
        ended: Nanos,
        out: &mut Vec<FuAction>,
    ) {
        self.stats.busy_ns += ended.saturating_sub(started);
        self.stats.batches_consumed += 1;
        self.stats.events_consumed += d.events;
        self.stats.bytes_consumed += d.bytes;
        let accepted = (0..d.events as u32)
            .filter(|&e| self.accepts(d.mep, e))
            .count() as u64;
        self.stats.events_accepted += accepted;
        self.stats.batches_accepted += u64::from(accepted > 0);
        let bu = self.bu_nodes[d.bu_index as usize];
        out.push(FuAction::Consumed { mep: d.mep, bu });
        if !self.ended[d.bu_index as usize] && d.link == self.link[d.bu_index as usize] {
            self.granted[d.bu_index as usize] += 1;
            out.push(FuAction::Credit { bu, credits: 1 });
        }
    }

    fn draw_busy(&mut self) -> Nanos {
        match self.busy_model {
            _ if self.busy_mean_ns == 0 => 0,
            BusyModel::Fixed => self.busy_mean_ns,
            BusyModel::Exponential => {
                let u: f64 = self.rng.gen_range(f64::EPSILON..1.0);
                // Capped at 50 means: a tail that long is the same stall.
                (-u.ln() * self.busy_mean_ns as f64).min(50.0 * self.busy_mean_ns as f64) as Nanos
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(busy_us: u64) -> (Config, Layout, FilterUnit) {
        let mut c = Config::default();
        c.nodes.count = 2;
        c.output.consumers = 2;
        c.output.consumer_busy_us = busy_us;
        let l = Layout::from_config(&c);
        let fu = FilterUnit::new(&c, &l, l.fu_nodes[1]);
        (c, l, fu)
    }

    fn batch(mep: MepId, bu_index: u16) -> FragmentHeader {
        FragmentHeader {
            run_id: 1,
            source: bu_index,
            flags: FLAG_BATCH,
            mep,
            event_count: 10,
            payload_len: 100,
            crc32c: 0,
        }
    }

    #[test]
    fn works_one_batch_at_a_time_and_returns_credits() {
        let (_, l, mut fu) = setup(10);
        assert_eq!(fu.index(), 1);
        let mut out = Vec::new();
        fu.start(&mut out);
        assert_eq!(out.len(), 2);
        out.clear();
        for mep in [1, 2] {
            assert_eq!(fu.admit(l.bu_nodes[0], &batch(mep, 0)), Admit::Keep);
            fu.on_delivery(0, &batch(mep, 0), true, &mut out);
        }
        // A third one exceeds the credit granted.
        assert_eq!(fu.admit(l.bu_nodes[0], &batch(3, 0)), Admit::Drop);
        assert!(fu.is_busy() && out.is_empty());
        assert_eq!(fu.next_deadline(), Some(10_000));
        fu.on_timeout(10_000, &mut out);
        assert_eq!(
            out,
            vec![
                FuAction::Consumed { mep: 1, bu: 0 },
                FuAction::Credit { bu: 0, credits: 1 }
            ]
        );
        assert_eq!(fu.credits_outstanding(), &[1, 2]);
        fu.on_timeout(20_000, &mut out);
        assert_eq!(fu.stats.batches_received, 2);
        assert_eq!(fu.stats.events_received, 20);
        assert_eq!(fu.stats.bytes_received, 200);
        assert_eq!(fu.stats.batches_consumed, 2);
        assert_eq!(fu.stats.busy_ns, 20_000);
        assert_eq!(fu.stats.deliveries_unexpected, 1);
        assert!(!fu.is_finished());
        fu.on_output_end(0);
        fu.on_output_end(1);
        assert!(fu.is_finished());
    }

    #[test]
    fn rejects_impostors_and_other_runs() {
        let (_, l, mut fu) = setup(0);
        fu.start(&mut Vec::new());
        // Claims BU index 1 but comes from BU 0.
        assert_eq!(fu.admit(l.bu_nodes[0], &batch(1, 1)), Admit::Drop);
        let mut other = batch(1, 0);
        other.run_id = 9;
        assert_eq!(fu.admit(l.bu_nodes[0], &other), Admit::Drop);
        let mut plain = batch(1, 0);
        plain.flags = 0;
        assert_eq!(fu.admit(l.bu_nodes[0], &plain), Admit::Drop);
        // From the FU endpoint itself: not a BU.
        assert_eq!(fu.admit(l.fu_nodes[0], &batch(1, 0)), Admit::Drop);
        assert_eq!(fu.stats.deliveries_unexpected, 4);
        // Without busy time, consumed at once; corrupt ones are counted.
        let mut out = Vec::new();
        assert_eq!(fu.admit(l.bu_nodes[1], &batch(5, 1)), Admit::Keep);
        fu.on_delivery(7, &batch(5, 1), false, &mut out);
        assert_eq!(fu.stats.batches_consumed, 1);
        assert_eq!(fu.stats.batches_corrupt, 1);
        assert!(!fu.is_busy());
    }

    #[test]
    fn the_trigger_accepts_the_configured_fraction_the_same_on_every_fu() {
        let (mut c, l, fu) = setup(0);
        let mut list = Vec::new();
        fu.accepted_events(3, 100, &mut list);
        assert_eq!(list, (0..100).collect::<Vec<u32>>(), "1.0 accepts all");
        c.output.accept_fraction = 0.25;
        let a = FilterUnit::new(&c, &l, l.fu_nodes[0]);
        let b = FilterUnit::new(&c, &l, l.fu_nodes[1]);
        let mut accepted = 0;
        for mep in 0..400u64 {
            a.accepted_events(mep, 250, &mut list);
            accepted += list.len();
            let mut other = Vec::new();
            b.accepted_events(mep, 250, &mut other);
            assert_eq!(
                list, other,
                "MEP {mep}: the decision depends on the event only"
            );
        }
        let fraction = accepted as f64 / 100_000.0;
        assert!((fraction - 0.25).abs() < 0.01, "accepted {fraction}");
        // Another seed, other events.
        c.run.seed ^= 1;
        let d = FilterUnit::new(&c, &l, l.fu_nodes[0]);
        let mut other = Vec::new();
        d.accepted_events(0, 250, &mut other);
        a.accepted_events(0, 250, &mut list);
        assert_ne!(list, other);
        c.output.accept_fraction = 0.0;
        let none = FilterUnit::new(&c, &l, l.fu_nodes[0]);
        none.accepted_events(0, 250, &mut list);
        assert!(list.is_empty());
    }

    #[test]
    fn consumed_batches_count_their_accepted_events() {
        let (mut c, l, _) = setup(0);
        c.output.accept_fraction = 0.5;
        let mut fu = FilterUnit::new(&c, &l, l.fu_nodes[0]);
        let mut out = Vec::new();
        fu.start(&mut out);
        let mut expected = 0;
        for mep in [1, 2] {
            assert_eq!(fu.admit(l.bu_nodes[0], &batch(mep, 0)), Admit::Keep);
            fu.on_delivery(0, &batch(mep, 0), true, &mut out);
            let mut list = Vec::new();
            fu.accepted_events(mep, 10, &mut list);
            expected += list.len() as u64;
        }
        assert_eq!(fu.stats.batches_consumed, 2);
        assert_eq!(fu.stats.events_accepted, expected);
        assert!(expected > 0 && expected < 20, "{expected}");
    }

    #[test]
    fn held_deliveries_are_the_applications_until_released() {
        let (_, l, mut fu) = setup(10);
        fu.hold_deliveries();
        let mut out = Vec::new();
        fu.start(&mut out);
        out.clear();
        for mep in [1, 2] {
            assert_eq!(fu.admit(l.bu_nodes[0], &batch(mep, 0)), Admit::Keep);
            fu.on_delivery(100, &batch(mep, 0), true, &mut out);
        }
        // Held, not worked on: no deadline, no credit back, not finished.
        assert_eq!((fu.held(), fu.next_deadline(), out.len()), (2, None, 0));
        assert_eq!(fu.admit(l.bu_nodes[0], &batch(3, 0)), Admit::Drop);
        // A corrupt one is consumed at once, its credit back.
        assert_eq!(fu.admit(l.bu_nodes[1], &batch(4, 1)), Admit::Keep);
        fu.on_delivery(100, &batch(4, 1), false, &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        out.clear();
        // Released out of order; an unknown one is refused.
        assert!(!fu.release(500, l.bu_nodes[0], 9, &mut out));
        assert!(!fu.release(500, l.fu_nodes[0], 2, &mut out));
        assert!(fu.release(600, l.bu_nodes[0], 2, &mut out));
        assert_eq!(
            out,
            vec![
                FuAction::Consumed { mep: 2, bu: 0 },
                FuAction::Credit { bu: 0, credits: 1 }
            ]
        );
        assert_eq!(fu.busy_time(700), 500 + 600);
        fu.on_output_end(0);
        fu.on_output_end(1);
        assert!(!fu.is_finished(), "MEP 1 is still held");
        out.clear();
        assert!(fu.release(800, l.bu_nodes[0], 1, &mut out));
        // The BU ended its output: no credit goes back to it.
        assert_eq!(out, vec![FuAction::Consumed { mep: 1, bu: 0 }]);
        assert!(fu.is_finished());
        assert_eq!(fu.stats.batches_consumed, 3);
        assert_eq!(fu.stats.batches_corrupt, 1);
        assert_eq!(fu.stats.busy_ns, 500 + 700);
    }

    #[test]
    fn exponential_busy_times_have_the_configured_mean() {
        let (mut c, l, _) = setup(100);
        c.output.consumer_busy = BusyModel::Exponential;
        let mut fu = FilterUnit::new(&c, &l, l.fu_nodes[0]);
        let n = 20_000;
        let total: u64 = (0..n).map(|_| fu.draw_busy()).sum();
        let mean = total as f64 / n as f64;
        assert!((mean - 100_000.0).abs() < 5_000.0, "mean {mean}");
    }
}
