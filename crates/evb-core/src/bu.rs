//! Builder Unit: gathers the fragments of every MEP assigned to it from all
//! Readout Units, verifies each, and delivers complete batches.
//!
//! A fragment is checked against its header (run, source, sender, event
//! count, length) and its CRC-32C. Duplicate, unexpected and corrupt
//! fragments are counted and dropped, never built. A batch that is not
//! complete within `batch_timeout_ms` is given up and counted incomplete,
//! with the missing sources named. Each finished batch returns one credit.
//!
//! With Filter Unit consumers (`output.consumers`), a built batch is not
//! done until a consumer has it: it waits in an output queue for a consumer
//! with credit. The first `output.bu_output_batches` of the queue have
//! already returned their EM credit; the rest keep it until delivered, so
//! while every consumer is busy the EM runs out of credit for this BU and
//! stops assigning to it. Nothing is dropped for want of a consumer.
//!
//! A delivered batch stays with the BU (the driver keeps its delivery
//! copy) until the consumer's credit for it comes back: an FU works in
//! order and returns one credit per batch it finished, so each credit
//! confirms the oldest unconfirmed delivery to that FU. When an FU is lost,
//! its unconfirmed batches go back to the front of the output queue and are
//! delivered again to the others (at least once: the dead FU may have
//! finished one whose credit never arrived).
//!
//! A lost FU comes back (restarted, or its link relinked after a stall):
//! it is served again from its new grant of credits; nothing granted or
//! delivered over the old link counts. While no FU is left, built batches
//! wait for one to come back, until the drain ends.
//!
//! A BU the EM lost while it was alive (its links down, or its process
//! stopped, past the peer timeout) had its unfinished MEPs taken: the EM
//! re-assigned them or counted them lost. When the EM takes it back it
//! names them ([`BuilderUnit::on_revoked`]): a batch still open is dropped,
//! a finished one's fate is taken out of this BU's counts. So every MEP is
//! counted by one BU, and the BUs' counts add up to the EM's.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use hdrhistogram::Histogram;

use crate::config::{Config, Protocol, Schedule};
use crate::layout::Layout;
use crate::wire::{FragmentHeader, MepId, NodeId};

/// Nanoseconds on the driver's clock (real or simulated).
pub type Nanos = u64;

/// How a batch ended when it was not built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Built,
    /// Timed out; the sources (RU indices) that never delivered.
    Incomplete {
        missing: Vec<u16>,
    },
    /// All fragments arrived but at least one failed verification.
    Corrupt {
        sources: Vec<u16>,
    },
    /// Fragments arrived for a MEP that was never assigned here.
    Unexpected,
    /// The EM took the MEP from this BU while it had lost it (it was
    /// re-assigned, or counted lost): not this BU's fate to count.
    Revoked,
}

/// What the BU asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuAction {
    /// PULL: ask the RU on endpoint `ru` for its fragment of `mep`.
    Request { mep: MepId, ru: NodeId },
    /// PULL: tell the RU on endpoint `ru` that `mep` is finished without
    /// its fragment, so it frees the data.
    Abandon { mep: MepId, ru: NodeId },
    /// Grant `credits` to the EM (at the start).
    Credit { credits: u32 },
    /// Tell the EM `mep` is finished (returns one credit).
    Finished { mep: MepId, outcome: u8 },
    /// Send the built batch `mep` to the Filter Unit on endpoint `to` (a
    /// [`crate::wire::FLAG_BATCH`] fragment). The first time, a `Finish`
    /// for it follows, so the driver keeps a copy of the batch until
    /// `Confirmed`; a delivery again (its FU was lost) sends that copy.
    Deliver {
        to: NodeId,
        mep: MepId,
        events: u64,
        bytes: u64,
        /// Incomplete, delivered anyway (`output.deliver_partial`).
        partial: bool,
    },
    /// A consumer finished `mep` (its credit came back), or it can never be
    /// delivered: free the delivery copy.
    Confirmed { mep: MepId },
    /// The batch is finished: deliver it to the sink if built (or, with
    /// `output.deliver_partial` and no consumers, if incomplete with any
    /// fragment: flagged partial), then free its buffers either way.
    Finish {
        mep: MepId,
        outcome: Outcome,
        events: u64,
        bytes: u64,
        /// Incomplete, but what arrived goes to the sink, flagged partial
        /// (`output.deliver_partial`, no consumers).
        partial: bool,
    },
}

/// The driver's verdict on whether to keep a fragment's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Receive the payload into the batch of this MEP.
    Keep,
    /// Discard the payload; the fragment has been counted.
    Drop,
}

/// One recorded incomplete batch (the first few are kept for the report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incident {
    pub mep: MepId,
    pub at: Nanos,
    pub outcome: Outcome,
}

/// Counters of a Builder Unit.
#[derive(Debug, Clone)]
pub struct BuStats {
    pub batches_built: u64,
    pub events_built: u64,
    pub bytes_built: u64,
    pub batches_incomplete: u64,
    pub events_incomplete: u64,
    pub batches_corrupt: u64,
    pub events_corrupt: u64,
    pub fragments_received: u64,
    pub bytes_received: u64,
    pub fragments_corrupt: u64,
    pub fragments_duplicate: u64,
    pub fragments_unexpected: u64,
    /// Per source index: batches that timed out without its fragment.
    pub missing_by_source: Vec<u64>,
    /// The first incomplete or corrupt batches, for the report.
    pub incidents: Vec<Incident>,
    /// Batch building latency, first activity to completion, in ns.
    pub latency_ns: Histogram<u64>,
    /// Most batches open at once.
    pub max_open: u32,
    /// Batches built without a source the EM declared gone.
    pub batches_masked: u64,
    /// MEPs assigned here (re-assignments too, duplicates not); and those
    /// of them the EM took back while it had lost this BU, named when it
    /// came back: their fates are counted elsewhere. Every MEP assigned is
    /// built, incomplete, corrupt, revoked, or still open.
    pub batches_assigned: u64,
    pub batches_revoked: u64,
    /// Built batches handed to a consumer, and their payload bytes.
    pub batches_delivered: u64,
    /// Incomplete batches delivered anyway, flagged partial
    /// (`output.deliver_partial`): to a consumer, or without consumers to
    /// the sink. Also counted in `batches_incomplete` (and with consumers
    /// in `batches_delivered`).
    pub batches_delivered_partial: u64,
    pub bytes_delivered: u64,
    /// Built batches no consumer took before the drain ended (every
    /// consumer busy, or gone and not back).
    pub batches_undelivered: u64,
    /// Delivered batches the consumer confirmed (its credit came back), per
    /// FU index; and deliveries made again because their FU was lost
    /// before confirming them.
    pub batches_confirmed: Vec<u64>,
    pub batches_redelivered: u64,
    /// Delivered batches still unconfirmed when the drain period ended
    /// (their consumer or its credit was lost; they may have been consumed).
    pub batches_unconfirmed: u64,
    /// Time the output queue was full (its batches holding EM credits), ns.
    pub output_full_ns: u64,
    /// Built batches that found no consumer with credit and had to wait in
    /// the output queue (each counted once).
    pub consumer_credit_stalls: u64,
    /// Longest the output queue ever was.
    pub max_output_queue: u32,
}

const MAX_INCIDENTS: usize = 32;
/// Finished MEP ids remembered to recognise late duplicates: far more than
/// can be in flight (credits x BUs). Their tables are allocated whole at
/// the start: grown entry by entry they took minutes to fill at a paced
/// rate (8192 MEPs / 62.5 per s a BU), and the resident memory crept up.
const FINISHED_MEMORY: usize = 1 << 13;
/// Room in `finished` for twice the ids it holds: its hash table then
/// reuses deleted slots in place and never grows again.
const FINISHED_CAPACITY: usize = 2 * FINISHED_MEMORY;

impl BuStats {
    fn new(sources: usize, consumers: usize) -> BuStats {
        BuStats {
            batches_built: 0,
            events_built: 0,
            bytes_built: 0,
            batches_incomplete: 0,
            events_incomplete: 0,
            batches_corrupt: 0,
            events_corrupt: 0,
            fragments_received: 0,
            bytes_received: 0,
            fragments_corrupt: 0,
            fragments_duplicate: 0,
            fragments_unexpected: 0,
            missing_by_source: vec![0; sources],
            incidents: Vec::new(),
            latency_ns: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"),
            max_open: 0,
            batches_masked: 0,
            batches_assigned: 0,
            batches_revoked: 0,
            batches_delivered: 0,
            batches_delivered_partial: 0,
            bytes_delivered: 0,
            batches_undelivered: 0,
            batches_confirmed: vec![0; consumers],
            batches_redelivered: 0,
            batches_unconfirmed: 0,
            output_full_ns: 0,
            consumer_credit_stalls: 0,
            max_output_queue: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Batch {
    assigned: bool,
    opened_at: Nanos,
    deadline: Nanos,
    /// Per source: fragment arrived (valid or not).
    arrived: Vec<bool>,
    /// Per source: expected (false for sources gone before this MEP).
    expected: Vec<bool>,
    expected_count: usize,
    arrived_count: usize,
    corrupt_sources: Vec<u16>,
    bytes: u64,
    /// PULL: per source, request issued.
    requested: Vec<bool>,
    /// Sources no longer waited for: gone and cut off after this MEP was
    /// assigned, so their fragments will never come (the batch completes
    /// incomplete once the others are in).
    given_up: Vec<u16>,
}

impl Batch {
    /// Sources whose fragment the batch lacks, in source order.
    fn missing(&self) -> Vec<u16> {
        let mut missing: Vec<u16> = (0..self.arrived.len() as u16)
            .filter(|&s| self.expected[s as usize] && !self.arrived[s as usize])
            .chain(self.given_up.iter().copied())
            .collect();
        missing.sort_unstable();
        missing
    }
}

/// What became of a finished MEP here, remembered (for a while) to
/// recognise late duplicates and to take a revoked MEP's fate back out of
/// the counts: with what it added to them (its latency, the sources it
/// missed).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// Never assigned here: its fragments came and were given up.
    Unassigned,
    Built {
        bytes: u64,
        masked: bool,
        latency: Nanos,
    },
    /// `missing`: the sources counted in `missing_by_source` for it.
    Incomplete {
        missing: Box<[u16]>,
    },
    Corrupt,
    /// Taken by the EM ([`BuilderUnit::on_revoked`]); it may be assigned
    /// here again.
    Revoked,
}

impl Fate {
    /// The fate of `batch`, finished with `outcome` at `now`.
    fn of(outcome: &Outcome, batch: &Batch, now: Nanos) -> Fate {
        match outcome {
            Outcome::Built => Fate::Built {
                bytes: batch.bytes,
                masked: batch.expected_count < batch.expected.len(),
                latency: batch_latency(batch, now),
            },
            Outcome::Incomplete { missing } => Fate::Incomplete {
                missing: missing.as_slice().into(),
            },
            Outcome::Corrupt { .. } => Fate::Corrupt,
            Outcome::Unexpected | Outcome::Revoked => Fate::Unassigned,
        }
    }
}

/// A built batch's latency as the histogram records it: first activity
/// to completion, at least 1 ns.
fn batch_latency(batch: &Batch, now: Nanos) -> Nanos {
    (now - batch.opened_at).max(1)
}

/// Takes one recording of `value` back out of `h` (a revoked batch's
/// latency): its bucket loses one count. Nothing happens if the bucket is
/// empty (it cannot be, for a value recorded before).
fn unrecord(h: &mut Histogram<u64>, value: u64) {
    let value = value.clamp(h.low().max(1), h.high());
    // A one-value histogram of the same resolution (values 1 and up, its
    // significant figures), small: it grows to the value alone.
    let Ok(mut one) = Histogram::<u64>::new(h.sigfig()) else {
        return;
    };
    if one.record(value).is_ok() && h.count_at(value) > 0 {
        let _ = h.subtract(&one);
    }
}

/// A built batch waiting for a consumer.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    mep: MepId,
    events: u64,
    bytes: u64,
    /// Its `Finished` went to the EM already (it is within the buffer).
    reported: bool,
    /// Delivered before, to an FU lost without confirming it: its `Finish`
    /// went out then, only the delivery copy is left.
    redelivery: bool,
    /// It found no consumer credit (counted in `consumer_credit_stalls`).
    stalled: bool,
    /// Re-assigned here after its first BU was lost: that BU may have
    /// built and delivered it before it died (see
    /// [`BuilderUnit::may_be_stored`]).
    reassigned: bool,
    /// Incomplete, delivered anyway (`output.deliver_partial`): the EM
    /// hears it as incomplete.
    partial: bool,
}

impl Waiting {
    /// How the batch ended, for its `Finish`.
    fn outcome(&self) -> Outcome {
        if self.partial {
            // (Its missing sources were recorded when it timed out.)
            Outcome::Incomplete {
                missing: Vec::new(),
            }
        } else {
            Outcome::Built
        }
    }
}

/// Where built batches go when there are consumers.
#[derive(Debug, Clone)]
struct Output {
    fu_nodes: Vec<NodeId>,
    fu_of: Vec<Option<u16>>,
    /// Per FU index: batches it will still accept from this BU.
    credits: Vec<u32>,
    gone: Vec<bool>,
    /// FU index the round-robin search starts from.
    next: usize,
    queue: VecDeque<Waiting>,
    /// Per FU index: batches delivered to it and not yet confirmed, oldest
    /// first (at most its credits).
    unconfirmed: Vec<VecDeque<Waiting>>,
    /// Batches that may wait having returned their EM credit.
    buffer: usize,
    full_since: Option<Nanos>,
}

impl Output {
    /// FU index `f` takes nothing more on its current link: its credits
    /// are void, and its unconfirmed batches go first to whoever takes
    /// deliveries next (delivered again, at least once).
    fn take_back(&mut self, f: usize) {
        self.gone[f] = true;
        self.credits[f] = 0;
        let lost = std::mem::take(&mut self.unconfirmed[f]);
        for mut w in lost.into_iter().rev() {
            w.redelivery = true;
            self.queue.push_front(w);
        }
    }
}

#[derive(Debug, Clone)]
pub struct BuilderUnit {
    node: NodeId,
    run_id: u32,
    events_per_mep: u32,
    credits: u32,
    timeout_ns: Nanos,
    protocol: Protocol,
    parallel_sends: u32,
    /// This BU's index, for the PULL request order.
    index: u16,
    ru_of: Vec<Option<u16>>,
    ru_nodes: Vec<NodeId>,
    open: BTreeMap<MepId, Batch>,
    deadlines: BTreeSet<(Nanos, MepId)>,
    /// Finished MEPs (recent ones), and their fates.
    finished: HashMap<MepId, Fate>,
    finished_order: VecDeque<MepId>,
    /// PULL: requests not yet issued, in schedule order.
    to_request: VecDeque<(MepId, u16)>,
    requests_in_flight: u32,
    /// Per source: the MEP ranges built without it, `[down, up)` (its RU
    /// was gone; `up` is `None` while it still is).
    gone_from: Vec<Vec<(MepId, Option<MepId>)>>,
    /// Per source: this BU's own link from it is gone, so nothing more can
    /// arrive from it.
    link_lost: Vec<bool>,
    /// `None`: no consumers, built batches go to the sink.
    output: Option<Output>,
    /// `output.deliver_partial`.
    deliver_partial: bool,
    /// With consumers: MEPs re-assigned here (their first BU lost), until
    /// they finish.
    reassigned: BTreeSet<MepId>,
    pub stats: BuStats,
}

impl BuilderUnit {
    pub fn new(config: &Config, layout: &Layout, node: NodeId) -> BuilderUnit {
        let eb = &config.event_builder;
        BuilderUnit {
            node,
            run_id: config.run.run_id,
            events_per_mep: config.source.events_per_mep,
            credits: eb.credits,
            timeout_ns: eb.batch_timeout_ms * 1_000_000,
            protocol: eb.protocol,
            parallel_sends: match eb.schedule {
                Schedule::All => u32::MAX,
                _ => eb.parallel_sends,
            },
            index: layout.bu_of[node as usize].expect("a BU node"),
            ru_of: layout.ru_of.clone(),
            ru_nodes: layout.ru_nodes.clone(),
            open: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            finished: HashMap::with_capacity(FINISHED_CAPACITY),
            finished_order: VecDeque::with_capacity(FINISHED_MEMORY + 1),
            to_request: VecDeque::new(),
            requests_in_flight: 0,
            gone_from: vec![Vec::new(); layout.rus()],
            link_lost: vec![false; layout.rus()],
            output: (layout.fus() > 0).then(|| Output {
                fu_nodes: layout.fu_nodes.clone(),
                fu_of: layout.fu_of.clone(),
                credits: vec![0; layout.fus()],
                gone: vec![false; layout.fus()],
                // Each BU starts its round robin at its own consumer: all
                // starting at consumer 0 made every BU's first batches an
                // incast on one consumer, and they stayed in step.
                next: layout.bu_of[node as usize].map_or(0, usize::from) % layout.fus().max(1),
                queue: VecDeque::new(),
                unconfirmed: vec![VecDeque::new(); layout.fus()],
                buffer: config.output.bu_output_batches as usize,
                full_since: None,
            }),
            stats: BuStats::new(layout.rus(), layout.fus()),
            deliver_partial: config.output.deliver_partial,
            reassigned: BTreeSet::new(),
        }
    }

    /// Per FU index: consumer credits this BU holds (empty without
    /// consumers).
    pub fn consumer_credits(&self) -> &[u32] {
        self.output.as_ref().map_or(&[], |o| &o.credits)
    }

    /// Built batches waiting for a consumer.
    pub fn output_waiting(&self) -> usize {
        self.output.as_ref().map_or(0, |o| o.queue.len())
    }

    /// Delivered batches no consumer has confirmed yet.
    pub fn output_unconfirmed(&self) -> usize {
        self.output
            .as_ref()
            .map_or(0, |o| o.unconfirmed.iter().map(VecDeque::len).sum())
    }

    /// Nothing open, nothing waiting for a consumer, every delivery
    /// confirmed (so a consumer lost during the drain can still be
    /// replaced).
    pub fn is_idle(&self) -> bool {
        self.open.is_empty() && self.output_waiting() == 0 && self.output_unconfirmed() == 0
    }

    /// The FU on endpoint `fu` takes `credits` more batches.
    pub fn on_consumer_credit(
        &mut self,
        now: Nanos,
        fu: NodeId,
        credits: u32,
        out: &mut Vec<BuAction>,
    ) {
        let Some(o) = &mut self.output else { return };
        let Some(f) = o.fu_of.get(fu as usize).copied().flatten() else {
            return;
        };
        if !o.gone[f as usize] {
            o.credits[f as usize] = o.credits[f as usize].saturating_add(credits);
            // Credits beyond the deliveries outstanding are the FU's
            // initial grant; the others confirm the oldest deliveries.
            let pending = &mut o.unconfirmed[f as usize];
            for _ in 0..(credits as usize).min(pending.len()) {
                let w = pending.pop_front().expect("counted");
                self.stats.batches_confirmed[f as usize] += 1;
                out.push(BuAction::Confirmed { mep: w.mep });
            }
        }
        self.pump_output(now, out);
    }

    /// The FU on endpoint `fu` is gone: it gets nothing more until it is
    /// back ([`BuilderUnit::on_consumer_joined`]). Without any consumer
    /// left, the waiting batches wait for one to come back (a restarted
    /// consumer, or this BU's own links back after it stalled), holding
    /// their EM credits, until the drain ends ([`BuilderUnit::abandon_all`]).
    pub fn on_consumer_lost(&mut self, now: Nanos, fu: NodeId, out: &mut Vec<BuAction>) {
        let Some(o) = &mut self.output else { return };
        let Some(f) = o.fu_of.get(fu as usize).copied().flatten() else {
            return;
        };
        o.take_back(f as usize);
        self.pump_output(now, out);
    }

    /// The FU on endpoint `fu` is back after it was lost: a new incarnation
    /// of its process, or the same process over a new link. It takes
    /// deliveries again once its new grant of credits arrives: nothing it
    /// was granted or delivered on the old link counts any more (what was
    /// unconfirmed went back to the queue when it was lost, and goes back
    /// now if its loss went unnoticed, a restart quicker than the peer
    /// timeout).
    pub fn on_consumer_joined(&mut self, now: Nanos, fu: NodeId, out: &mut Vec<BuAction>) {
        let Some(o) = &mut self.output else { return };
        let Some(f) = o.fu_of.get(fu as usize).copied().flatten() else {
            return;
        };
        o.take_back(f as usize);
        o.gone[f as usize] = false;
        self.pump_output(now, out);
    }

    /// Hands waiting batches to consumers with credit (round-robin), and
    /// returns the EM credit of those within the output buffer.
    fn pump_output(&mut self, now: Nanos, out: &mut Vec<BuAction>) {
        let sources = self.ru_nodes.len();
        let Some(o) = &mut self.output else { return };
        let n = o.credits.len();
        while let Some(&w) = o.queue.front() {
            let Some(f) = (0..n).map(|k| (o.next + k) % n).find(|&f| o.credits[f] > 0) else {
                for w in o.queue.iter_mut().filter(|w| !w.stalled) {
                    w.stalled = true;
                    self.stats.consumer_credit_stalls += 1;
                }
                break;
            };
            o.credits[f] -= 1;
            o.next = (f + 1) % n;
            o.queue.pop_front();
            o.unconfirmed[f].push_back(w);
            out.push(BuAction::Deliver {
                to: o.fu_nodes[f],
                mep: w.mep,
                events: w.events,
                bytes: w.bytes,
                partial: w.partial,
            });
            if w.redelivery {
                self.stats.batches_redelivered += 1;
                continue;
            }
            self.stats.batches_delivered += 1;
            if w.partial {
                self.stats.batches_delivered_partial += 1;
            }
            let code = if w.partial {
                crate::wire::outcome::INCOMPLETE
            } else {
                crate::wire::outcome::BUILT
            };
            self.stats.bytes_delivered += crate::wire::batch_payload_len(sources, w.bytes);
            out.push(BuAction::Finish {
                mep: w.mep,
                outcome: w.outcome(),
                events: w.events,
                bytes: w.bytes,
                partial: false,
            });
            if !w.reported {
                out.push(BuAction::Finished {
                    mep: w.mep,
                    outcome: code,
                });
            }
        }
        for w in o.queue.iter_mut().take(o.buffer) {
            if !w.reported {
                w.reported = true;
                out.push(BuAction::Finished {
                    mep: w.mep,
                    outcome: if w.partial {
                        crate::wire::outcome::INCOMPLETE
                    } else {
                        crate::wire::outcome::BUILT
                    },
                });
            }
        }
        self.stats.max_output_queue = self.stats.max_output_queue.max(o.queue.len() as u32);
        let full = !o.queue.is_empty() && o.queue.len() >= o.buffer.max(1);
        match (full, o.full_since) {
            (true, None) => o.full_since = Some(now),
            (false, Some(since)) => {
                self.stats.output_full_ns += now.saturating_sub(since);
                o.full_since = None;
            }
            _ => {}
        }
    }

    /// Gives up every waiting batch: counted undelivered, buffers freed,
    /// the EM told (as incomplete, if it had not heard of it yet).
    fn drop_output(&mut self, now: Nanos, out: &mut Vec<BuAction>) {
        let Some(o) = &mut self.output else { return };
        for w in std::mem::take(&mut o.queue) {
            self.stats.batches_undelivered += 1;
            if w.redelivery {
                // Built, delivered once, and lost with its consumer.
                out.push(BuAction::Confirmed { mep: w.mep });
                continue;
            }
            out.push(BuAction::Finish {
                mep: w.mep,
                outcome: w.outcome(),
                events: w.events,
                bytes: w.bytes,
                partial: false,
            });
            if !w.reported {
                out.push(BuAction::Finished {
                    mep: w.mep,
                    outcome: crate::wire::outcome::INCOMPLETE,
                });
            }
        }
        self.pump_output(now, out);
    }

    /// The EM re-assigned `mep` here (its first BU was lost, the RUs still
    /// hold its fragments): call before [`BuilderUnit::on_assign`].
    pub fn on_reassigned(&mut self, mep: MepId) {
        let finished = self.finished.get(&mep).is_some_and(|f| *f != Fate::Revoked);
        if self.output.is_some() && !finished {
            self.reassigned.insert(mep);
        }
    }

    /// The EM took `mep` from this BU when it lost it (this BU lived on:
    /// its links went down, or its process was stopped) and re-assigned it
    /// or counted it lost: its fate is not this BU's. A batch still open is
    /// dropped (its buffers freed; the RUs were told by the EM); a finished
    /// one comes out of the counts (its delivery, if built, stands; the EM
    /// ignored its `Finished`). A MEP never assigned here (a new
    /// incarnation, or its assignment lost with the link) is ignored.
    pub fn on_revoked(&mut self, mep: MepId, out: &mut Vec<BuAction>) {
        let events = u64::from(self.events_per_mep);
        if self.open.get(&mep).is_some_and(|b| b.assigned) {
            let batch = self.close_batch(mep).expect("just looked up");
            self.remember_finished(mep, Fate::Revoked);
            out.push(BuAction::Finish {
                mep,
                outcome: Outcome::Revoked,
                events,
                bytes: batch.bytes,
                partial: false,
            });
            self.issue_requests(out);
        } else {
            match self.finished.get_mut(&mep) {
                Some(f @ (Fate::Built { .. } | Fate::Incomplete { .. } | Fate::Corrupt)) => {
                    let fate = std::mem::replace(f, Fate::Revoked);
                    self.uncount(mep, &fate);
                }
                Some(Fate::Unassigned | Fate::Revoked) | None => return,
            }
        }
        self.stats.batches_revoked += 1;
        self.assert_accounting();
    }

    /// Takes finished `mep`'s `fate` out of every count it entered: its
    /// outcome's, its latency, the sources it missed, its incident.
    fn uncount(&mut self, mep: MepId, fate: &Fate) {
        let events = u64::from(self.events_per_mep);
        let s = &mut self.stats;
        match *fate {
            Fate::Built {
                bytes,
                masked,
                latency,
            } => {
                s.batches_built -= 1;
                s.events_built -= events;
                s.bytes_built -= bytes;
                s.batches_masked -= u64::from(masked);
                unrecord(&mut s.latency_ns, latency);
            }
            Fate::Incomplete { ref missing } => {
                s.batches_incomplete -= 1;
                s.events_incomplete -= events;
                for &m in missing.iter() {
                    if let Some(c) = s.missing_by_source.get_mut(m as usize) {
                        *c = c.saturating_sub(1);
                    }
                }
            }
            Fate::Corrupt => {
                s.batches_corrupt -= 1;
                s.events_corrupt -= events;
            }
            Fate::Unassigned | Fate::Revoked => return,
        }
        s.incidents.retain(|i| i.mep != mep);
    }

    /// Every MEP assigned here has one fate or is still open: built,
    /// incomplete, corrupt, revoked. Checked in every build where it is
    /// cheap (a revocation, the end of the drain), at every finished batch
    /// in debug builds.
    fn assert_accounting(&self) {
        let s = &self.stats;
        let open = self.open.values().filter(|b| b.assigned).count() as u64;
        let fates = s.batches_built + s.batches_incomplete + s.batches_corrupt + s.batches_revoked;
        assert_eq!(
            fates + open,
            s.batches_assigned,
            "BU {}: {fates} batches with a fate and {open} open, of {} assigned \
             (built {}, incomplete {}, corrupt {}, revoked {})",
            self.node,
            s.batches_assigned,
            s.batches_built,
            s.batches_incomplete,
            s.batches_corrupt,
            s.batches_revoked
        );
        let epm = u64::from(self.events_per_mep);
        assert_eq!(
            (s.events_built, s.events_incomplete, s.events_corrupt),
            (
                s.batches_built * epm,
                s.batches_incomplete * epm,
                s.batches_corrupt * epm
            ),
            "BU {}: events counted apart from their batches",
            self.node
        );
    }

    /// Whether the delivery of `mep` just made may find it stored already
    /// (for [`crate::wire::FLAG_AGAIN`]): a delivery again (its first
    /// consumer was lost before confirming it), or a batch re-assigned
    /// here whose first BU may have delivered it before it was lost.
    pub fn may_be_stored(&self, mep: MepId) -> bool {
        self.output.as_ref().is_some_and(|o| {
            o.unconfirmed
                .iter()
                .flatten()
                .any(|w| w.mep == mep && (w.redelivery || w.reassigned))
        })
    }

    /// Credits to grant when the run starts.
    pub fn start(&mut self, out: &mut Vec<BuAction>) {
        out.push(BuAction::Credit {
            credits: self.credits,
        });
    }

    pub fn open_batches(&self) -> usize {
        self.open.len()
    }

    /// Most batches a BU holds open at once, whatever the order in which
    /// assignments and fragments arrive (and whatever its peers send): the
    /// EM assigns at most `credits` MEPs to it, and under PUSH a fragment
    /// that overtakes its assignment opens a provisional batch only while
    /// fewer than `credits` are open, so at most `credits` more. Each open
    /// batch keeps at most one payload per source ([`BuilderUnit::admit`]
    /// drops duplicates): what bounds a BU's receive buffers.
    pub fn max_open_batches(protocol: Protocol, credits: u32) -> usize {
        match protocol {
            Protocol::Push => 2 * credits as usize,
            Protocol::Pull => credits as usize,
        }
    }

    /// Earliest batch deadline, for the driver's timer.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.deadlines.first().map(|&(t, _)| t)
    }

    /// Whether the batch of `mep` has a fragment from `source`: not when the
    /// EM declared the source gone for a range holding `mep`.
    fn expects(&self, mep: MepId, source: u16) -> bool {
        self.gone_from.get(source as usize).is_some_and(|ranges| {
            !ranges
                .iter()
                .any(|&(down, up)| mep >= down && up.is_none_or(|up| mep < up))
        })
    }

    /// The MEP from which `source` is currently gone, if it is.
    fn gone_now(&self, source: u16) -> Option<MepId> {
        match self.gone_from.get(source as usize)?.last()? {
            &(down, None) => Some(down),
            _ => None,
        }
    }

    fn open_batch(&mut self, now: Nanos, mep: MepId, assigned: bool) -> &mut Batch {
        let sources = self.ru_nodes.len();
        let deadline = now + self.timeout_ns;
        self.deadlines.insert((deadline, mep));
        let expected: Vec<bool> = (0..sources as u16).map(|s| self.expects(mep, s)).collect();
        let expected_count = expected.iter().filter(|&&e| e).count();
        self.open.entry(mep).or_insert(Batch {
            assigned,
            opened_at: now,
            deadline,
            arrived: vec![false; sources],
            expected,
            expected_count,
            arrived_count: 0,
            corrupt_sources: Vec::new(),
            bytes: 0,
            requested: vec![false; sources],
            given_up: Vec::new(),
        });
        let open = self.open.len() as u32;
        self.stats.max_open = self.stats.max_open.max(open);
        self.open.get_mut(&mep).expect("just inserted")
    }

    /// The EM assigned `mep` to this BU.
    pub fn on_assign(&mut self, now: Nanos, mep: MepId, out: &mut Vec<BuAction>) {
        match self.finished.get(&mep) {
            Some(Fate::Revoked) => {
                // Taken from this BU, and now given to it again.
                self.finished.remove(&mep);
            }
            Some(Fate::Unassigned) => {
                // Its fragments came first and were given up before this
                // assignment arrived: it cannot be built any more, but the
                // EM must hear its fate (and get the credit back).
                self.stats.batches_assigned += 1;
                // (Counted in no source's misses: see below.)
                self.finished.insert(
                    mep,
                    Fate::Incomplete {
                        missing: Box::default(),
                    },
                );
                let sources = self.ru_nodes.len() as u16;
                let outcome = Outcome::Incomplete {
                    missing: (0..sources).collect(),
                };
                let events = u64::from(self.events_per_mep);
                self.stats.batches_incomplete += 1;
                self.stats.events_incomplete += events;
                if self.stats.incidents.len() < MAX_INCIDENTS {
                    self.stats.incidents.push(Incident {
                        mep,
                        at: now,
                        outcome: outcome.clone(),
                    });
                }
                out.push(BuAction::Finish {
                    mep,
                    outcome,
                    events,
                    bytes: 0,
                    partial: false,
                });
                out.push(BuAction::Finished {
                    mep,
                    outcome: crate::wire::outcome::INCOMPLETE,
                });
                return;
            }
            Some(_) => return, // A duplicate assignment.
            None => {}
        }
        self.stats.batches_assigned += 1;
        match self.open.get_mut(&mep) {
            Some(b) => b.assigned = true,
            None => {
                self.open_batch(now, mep, true);
            }
        }
        if self.protocol == Protocol::Pull {
            // Barrel order for requests: phase n asks RU (index + n) mod N.
            let n = self.ru_nodes.len();
            let expected = self.open[&mep].expected.clone();
            for k in 0..n {
                let src = (self.index as usize + k) % n;
                if expected[src] {
                    self.to_request.push_back((mep, src as u16));
                }
            }
            self.issue_requests(out);
        }
        // A re-assigned MEP predates the loss of a source: if that source
        // is both gone and cut off, its fragment will never come.
        for source in 0..self.link_lost.len() as u16 {
            if self.link_lost[source as usize] {
                self.give_up_waiting_for(now, source, out);
            }
        }
        self.check_complete(now, mep, out);
    }

    /// A fragment header arrived from endpoint `from`: keep its payload?
    /// Counts and drops what can be rejected before the payload is read.
    pub fn admit(&mut self, now: Nanos, from: NodeId, h: &FragmentHeader) -> Admit {
        let source_ok = self.ru_of.get(from as usize).copied().flatten() == Some(h.source);
        if h.run_id != self.run_id || !source_ok || self.finished.contains_key(&h.mep) {
            // Another run, an impostor, or a batch already given up.
            self.stats.fragments_unexpected += 1;
            return Admit::Drop;
        }
        let protocol = self.protocol;
        let credits = self.credits as usize;
        let open_len = self.open.len();
        match self.open.get(&h.mep) {
            Some(b) if !b.expected[h.source as usize] => {
                // From a source declared gone for this MEP.
                self.stats.fragments_unexpected += 1;
                Admit::Drop
            }
            Some(b) if b.arrived[h.source as usize] => {
                self.stats.fragments_duplicate += 1;
                Admit::Drop
            }
            Some(b) if protocol == Protocol::Pull && !b.requested[h.source as usize] => {
                self.stats.fragments_unexpected += 1;
                Admit::Drop
            }
            Some(_) => Admit::Keep,
            // PUSH: the fragment may overtake its assignment (it travels on
            // another connection). Open a provisional batch, but never more
            // than the credits could justify.
            None if protocol == Protocol::Push
                && open_len < credits
                && self.expects(h.mep, h.source) =>
            {
                self.open_batch(now, h.mep, false);
                Admit::Keep
            }
            None => {
                self.stats.fragments_unexpected += 1;
                Admit::Drop
            }
        }
    }

    /// The payload of an admitted fragment is in; `crc` is its computed
    /// CRC-32C.
    pub fn on_fragment(
        &mut self,
        now: Nanos,
        h: &FragmentHeader,
        crc: u32,
        out: &mut Vec<BuAction>,
    ) {
        let events_per_mep = self.events_per_mep;
        let Some(batch) = self.open.get_mut(&h.mep) else {
            self.stats.fragments_unexpected += 1;
            return;
        };
        let src = h.source as usize;
        if batch.arrived[src] {
            self.stats.fragments_duplicate += 1;
            return;
        }
        batch.arrived[src] = true;
        batch.arrived_count += 1;
        self.stats.fragments_received += 1;
        self.stats.bytes_received += u64::from(h.payload_len);
        let well_formed = h.event_count == events_per_mep
            && u64::from(h.payload_len) >= 4 * u64::from(h.event_count);
        if crc != h.crc32c || !well_formed {
            self.stats.fragments_corrupt += 1;
            batch.corrupt_sources.push(h.source);
        } else {
            batch.bytes += u64::from(h.payload_len);
        }
        if self.protocol == Protocol::Pull && batch.requested[src] {
            self.requests_in_flight -= 1;
        }
        self.check_complete(now, h.mep, out);
        self.issue_requests(out);
    }

    /// Gives up every batch whose deadline is at or before `now`.
    pub fn on_timeout(&mut self, now: Nanos, out: &mut Vec<BuAction>) {
        while let Some(&(deadline, mep)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(batch) = self.open.get(&mep) else {
                continue;
            };
            let outcome = if !batch.assigned {
                Outcome::Unexpected
            } else if !batch.corrupt_sources.is_empty()
                && batch.arrived_count == batch.expected_count
            {
                Outcome::Corrupt {
                    sources: batch.corrupt_sources.clone(),
                }
            } else {
                Outcome::Incomplete {
                    missing: batch.missing(),
                }
            };
            self.finish(now, mep, outcome, out);
        }
        self.issue_requests(out);
    }

    /// Gives up every open batch now (end of the drain period).
    pub fn abandon_all(&mut self, now: Nanos, out: &mut Vec<BuAction>) {
        // Deliveries no consumer confirmed by now never will be: free
        // their copies (counted; the consumer may have finished them).
        if let Some(o) = &mut self.output {
            for pending in &mut o.unconfirmed {
                for w in pending.drain(..) {
                    self.stats.batches_unconfirmed += 1;
                    out.push(BuAction::Confirmed { mep: w.mep });
                }
            }
        }
        let deadlines: Vec<(Nanos, MepId)> = self.deadlines.iter().copied().collect();
        for (_, mep) in deadlines {
            if let Some(b) = self.open.get_mut(&mep) {
                b.deadline = now;
            }
        }
        let rewritten: BTreeSet<(Nanos, MepId)> = self.open.keys().map(|&m| (now, m)).collect();
        self.deadlines = rewritten;
        self.on_timeout(now, out);
        self.drop_output(now, out);
        self.assert_accounting();
    }

    fn check_complete(&mut self, now: Nanos, mep: MepId, out: &mut Vec<BuAction>) {
        let Some(batch) = self.open.get(&mep) else {
            return;
        };
        if !batch.assigned || batch.arrived_count < batch.expected_count {
            return;
        }
        let outcome = if !batch.given_up.is_empty() {
            Outcome::Incomplete {
                missing: batch.missing(),
            }
        } else if batch.corrupt_sources.is_empty() {
            Outcome::Built
        } else {
            Outcome::Corrupt {
                sources: batch.corrupt_sources.clone(),
            }
        };
        self.finish(now, mep, outcome, out);
    }

    /// Takes the open batch of `mep` out of the deadlines and, PULL, the
    /// requests.
    fn close_batch(&mut self, mep: MepId) -> Option<Batch> {
        let batch = self.open.remove(&mep)?;
        self.deadlines.remove(&(batch.deadline, mep));
        if self.protocol == Protocol::Pull {
            let outstanding = (0..batch.arrived.len())
                .filter(|&s| batch.requested[s] && !batch.arrived[s])
                .count() as u32;
            self.requests_in_flight -= outstanding;
            self.to_request.retain(|&(m, _)| m != mep);
        }
        Some(batch)
    }

    fn finish(&mut self, now: Nanos, mep: MepId, outcome: Outcome, out: &mut Vec<BuAction>) {
        let batch = self.close_batch(mep).expect("finishing an open batch");
        if self.protocol == Protocol::Pull {
            // RUs hold PULL data until asked: release what will never be.
            if batch.assigned {
                for s in
                    (0..batch.arrived.len()).filter(|&s| batch.expected[s] && !batch.arrived[s])
                {
                    out.push(BuAction::Abandon {
                        mep,
                        ru: self.ru_nodes[s],
                    });
                }
            }
        }
        let reassigned = self.remember_finished(mep, Fate::of(&outcome, &batch, now));
        let events = u64::from(self.events_per_mep);
        let s = &mut self.stats;
        match &outcome {
            Outcome::Built => {
                if batch.expected_count < batch.expected.len() {
                    s.batches_masked += 1;
                }
                s.batches_built += 1;
                s.events_built += events;
                s.bytes_built += batch.bytes;
                s.latency_ns.saturating_record(batch_latency(&batch, now));
            }
            Outcome::Incomplete { missing } => {
                s.batches_incomplete += 1;
                s.events_incomplete += events;
                for &m in missing {
                    s.missing_by_source[m as usize] += 1;
                }
            }
            Outcome::Corrupt { .. } => {
                s.batches_corrupt += 1;
                s.events_corrupt += events;
            }
            Outcome::Unexpected => {
                s.fragments_unexpected += batch.arrived_count as u64;
            }
            Outcome::Revoked => unreachable!("a revoked batch is dropped, not finished"),
        }
        if cfg!(debug_assertions) {
            self.assert_accounting();
        }
        let s = &mut self.stats;
        if matches!(
            outcome,
            Outcome::Incomplete { .. } | Outcome::Corrupt { .. }
        ) && s.incidents.len() < MAX_INCIDENTS
        {
            s.incidents.push(Incident {
                mep,
                at: now,
                outcome: outcome.clone(),
            });
        }
        // What did arrive of an incomplete batch still goes out, flagged.
        // (Not with a fragment that failed verification: nothing corrupt
        // goes out as if it were good.)
        let partial = self.deliver_partial
            && batch.assigned
            && batch.arrived_count > 0
            && batch.corrupt_sources.is_empty()
            && matches!(outcome, Outcome::Incomplete { .. });
        if (outcome == Outcome::Built || partial) && self.output.is_some() {
            let o = self.output.as_mut().expect("checked");
            o.queue.push_back(Waiting {
                mep,
                events,
                bytes: batch.bytes,
                reported: false,
                stalled: false,
                redelivery: false,
                reassigned,
                partial,
            });
            self.pump_output(now, out);
            return;
        }
        if partial {
            // The driver hands it to the sink (see [`BuAction::Finish`]).
            self.stats.batches_delivered_partial += 1;
        }
        out.push(BuAction::Finish {
            mep,
            outcome: outcome.clone(),
            events,
            bytes: batch.bytes,
            partial,
        });
        if batch.assigned {
            let code = match outcome {
                Outcome::Built => crate::wire::outcome::BUILT,
                Outcome::Corrupt { .. } => crate::wire::outcome::CORRUPT,
                _ => crate::wire::outcome::INCOMPLETE,
            };
            out.push(BuAction::Finished { mep, outcome: code });
        }
    }

    /// Remembers `mep` finished (for late duplicates), within bounds;
    /// whether it had been re-assigned here.
    fn remember_finished(&mut self, mep: MepId, fate: Fate) -> bool {
        self.finished.insert(mep, fate);
        self.finished_order.push_back(mep);
        if self.finished_order.len() > FINISHED_MEMORY {
            let old = self.finished_order.pop_front().expect("non-empty");
            self.finished.remove(&old);
        }
        self.reassigned.remove(&mep)
    }

    fn issue_requests(&mut self, out: &mut Vec<BuAction>) {
        while self.requests_in_flight < self.parallel_sends {
            let Some((mep, src)) = self.to_request.pop_front() else {
                return;
            };
            let Some(batch) = self.open.get_mut(&mep) else {
                continue;
            };
            if batch.arrived[src as usize] || batch.requested[src as usize] {
                continue;
            }
            batch.requested[src as usize] = true;
            self.requests_in_flight += 1;
            out.push(BuAction::Request {
                mep,
                ru: self.ru_nodes[src as usize],
            });
        }
    }

    /// The EM says the RU of `source` is gone: MEPs from `from_mep` on are
    /// built without it; earlier ones still wait for it (and time out).
    pub fn on_source_down(
        &mut self,
        now: Nanos,
        source: u16,
        from_mep: MepId,
        out: &mut Vec<BuAction>,
    ) {
        let Some(ranges) = self.gone_from.get_mut(source as usize) else {
            return;
        };
        if matches!(ranges.last(), Some((_, None))) {
            return;
        }
        // After a rejoin, a later loss cannot reach back before the rejoin.
        let from_mep = match ranges.last() {
            Some(&(_, Some(up))) => from_mep.max(up),
            _ => from_mep,
        };
        ranges.push((from_mep, None));
        let affected: Vec<MepId> = self.open.range(from_mep..).map(|(&m, _)| m).collect();
        for mep in &affected {
            let b = self.open.get_mut(mep).expect("in range");
            let s = source as usize;
            if b.expected[s] && !b.arrived[s] {
                b.expected[s] = false;
                b.expected_count -= 1;
                if b.requested[s] {
                    b.requested[s] = false;
                    self.requests_in_flight -= 1;
                }
            }
        }
        self.to_request
            .retain(|&(m, s)| !(s == source && m >= from_mep));
        for mep in affected {
            self.check_complete(now, mep, out);
        }
        self.give_up_waiting_for(now, source, out);
        self.issue_requests(out);
    }

    /// The EM says the RU of `source` is back: MEPs from `from_mep` on are
    /// built with it again (batches already open among them wait for it).
    pub fn on_source_up(&mut self, source: u16, from_mep: MepId, out: &mut Vec<BuAction>) {
        let Some(ranges) = self.gone_from.get_mut(source as usize) else {
            return;
        };
        let Some(last) = ranges.last_mut() else {
            return; // Never gone here (a new BU): expected all along.
        };
        let (down, None) = *last else {
            return; // Not gone: a duplicate.
        };
        let up = from_mep.max(down);
        last.1 = Some(up);
        let s = source as usize;
        let reopened: Vec<MepId> = self
            .open
            .range(up..)
            .filter(|(_, b)| !b.expected[s])
            .map(|(&m, _)| m)
            .collect();
        for mep in reopened {
            let b = self.open.get_mut(&mep).expect("in range");
            b.expected[s] = true;
            b.expected_count += 1;
            if self.protocol == Protocol::Pull && b.assigned {
                self.to_request.push_back((mep, source));
            }
        }
        self.issue_requests(out);
    }

    /// This BU's own connection from the RU of `source` is back (the node
    /// rejoined): fragments can arrive from it again.
    pub fn on_source_link_up(&mut self, source: u16) {
        if let Some(l) = self.link_lost.get_mut(source as usize) {
            *l = false;
        }
    }

    /// This BU's own connection from the RU of `source` is gone: nothing
    /// more will arrive from it.
    pub fn on_source_link_lost(&mut self, now: Nanos, source: u16, out: &mut Vec<BuAction>) {
        if let Some(l) = self.link_lost.get_mut(source as usize) {
            *l = true;
        }
        self.give_up_waiting_for(now, source, out);
        self.issue_requests(out);
    }

    /// Once a source is both gone (EM) and cut off (own link), the batches
    /// before its masking that still wait for it will never have its
    /// fragment: they stop waiting for it and finish, incomplete, as soon
    /// as the other sources' fragments are in (the ones still on their way
    /// are not given up), rather than at their timeout.
    fn give_up_waiting_for(&mut self, now: Nanos, source: u16, out: &mut Vec<BuAction>) {
        let s = source as usize;
        let (Some(from), Some(true)) = (self.gone_now(source), self.link_lost.get(s)) else {
            return;
        };
        let waiting: Vec<MepId> = self
            .open
            .range(..from)
            .filter(|(_, b)| b.assigned && b.expected[s] && !b.arrived[s])
            .map(|(&m, _)| m)
            .collect();
        for mep in waiting {
            let b = self.open.get_mut(&mep).expect("just listed");
            b.expected[s] = false;
            b.expected_count -= 1;
            b.given_up.push(source);
            self.check_complete(now, mep, out);
        }
    }

    pub fn node(&self) -> NodeId {
        self.node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(config: &Config, source: u16, mep: MepId) -> FragmentHeader {
        FragmentHeader {
            run_id: config.run.run_id,
            source,
            flags: 0,
            mep,
            event_count: config.source.events_per_mep,
            payload_len: 64,
            crc32c: 0,
        }
    }

    /// A batch re-assigned here (its first BU lost, maybe after it
    /// delivered it) is delivered flagged: it may be stored already; one
    /// assigned here first is not. Found by `evb chaos` over shm (seed 14:
    /// a BU killed, two MEPs stored by both consumers).
    #[test]
    fn a_reassigned_batch_may_be_stored_already() {
        let mut config = Config::default();
        config.nodes.count = 2;
        config.output.consumers = 1;
        let layout = Layout::from_config(&config);
        let mut bu = BuilderUnit::new(&config, &layout, layout.bu_nodes[0]);
        let mut out = Vec::new();
        bu.start(&mut out);
        bu.on_consumer_credit(0, layout.fu_nodes[0], 4, &mut out);
        bu.on_reassigned(7);
        for mep in [6, 7] {
            bu.on_assign(0, mep, &mut out);
            for s in 0..2u16 {
                let mut h = fragment(&config, s, mep);
                h.payload_len = 4 * config.source.events_per_mep;
                assert_eq!(bu.admit(0, layout.ru_nodes[s as usize], &h), Admit::Keep);
                bu.on_fragment(0, &h, 0, &mut out);
            }
        }
        let delivered: Vec<MepId> = out
            .iter()
            .filter_map(|a| match a {
                BuAction::Deliver { mep, .. } => Some(*mep),
                _ => None,
            })
            .collect();
        assert_eq!(delivered, vec![6, 7]);
        assert!(!bu.may_be_stored(6));
        assert!(bu.may_be_stored(7));
        assert!(bu.reassigned.is_empty());
    }

    /// The EM names the MEPs it took from this BU while it had it for lost:
    /// an open batch is dropped uncounted (its buffers freed), a finished
    /// one's fate comes out of the counts, one never assigned here is
    /// ignored, and a revoked MEP assigned here again is built afresh.
    #[test]
    fn revoked_meps_are_not_counted_and_may_come_back() {
        for protocol in [Protocol::Push, Protocol::Pull] {
            let mut config = Config::default();
            config.nodes.count = 2;
            config.event_builder.protocol = protocol;
            let layout = Layout::from_config(&config);
            let mut bu = BuilderUnit::new(&config, &layout, layout.bu_nodes[0]);
            let mut out = Vec::new();
            bu.start(&mut out);
            let epm = u64::from(config.source.events_per_mep);
            let arrive = |bu: &mut BuilderUnit, now, mep, s: u16, out: &mut Vec<BuAction>| {
                let mut h = fragment(&config, s, mep);
                h.payload_len = 4 * config.source.events_per_mep;
                assert_eq!(bu.admit(now, layout.ru_nodes[s as usize], &h), Admit::Keep);
                bu.on_fragment(now, &h, 0, out);
            };
            // MEP 1 built, MEP 2 timed out, MEP 3 still open (one fragment).
            for mep in [1, 2, 3] {
                bu.on_assign(0, mep, &mut out);
            }
            arrive(&mut bu, 0, 1, 0, &mut out);
            arrive(&mut bu, 0, 1, 1, &mut out);
            bu.on_timeout(bu.next_deadline().unwrap(), &mut out);
            assert_eq!(
                (bu.stats.batches_built, bu.stats.batches_incomplete),
                (1, 2)
            );
            assert_eq!(bu.stats.latency_ns.len(), 1);
            assert_eq!(bu.stats.missing_by_source, vec![2, 2]);
            assert_eq!(bu.stats.incidents.len(), 2);
            bu.on_assign(10, 3, &mut out);
            assert_eq!(bu.stats.batches_assigned, 3, "a duplicate is not counted");
            bu.on_assign(10, 4, &mut out);
            arrive(&mut bu, 10, 4, 0, &mut out);
            out.clear();
            for mep in [1, 2, 4, 99] {
                bu.on_revoked(mep, &mut out);
            }
            let s = &bu.stats;
            assert_eq!(
                (s.batches_built, s.events_built, s.bytes_built),
                (0, 0, 0),
                "{protocol:?}"
            );
            assert_eq!((s.batches_incomplete, s.events_incomplete), (1, epm));
            assert_eq!((s.batches_revoked, s.batches_assigned), (3, 4));
            // Nor in the latency, the sources' misses or the incidents:
            // only MEP 3's are left.
            assert_eq!(s.latency_ns.len(), 0, "{protocol:?}");
            assert_eq!(s.missing_by_source, vec![1, 1]);
            assert_eq!(
                s.incidents.iter().map(|i| i.mep).collect::<Vec<_>>(),
                vec![3]
            );
            assert_eq!(bu.open_batches(), 0);
            assert!(bu.next_deadline().is_none());
            assert!(matches!(
                out.as_slice(),
                [BuAction::Finish {
                    mep: 4,
                    outcome: Outcome::Revoked,
                    ..
                }]
            ));
            // Revoked twice: nothing more.
            bu.on_revoked(1, &mut out);
            assert_eq!(bu.stats.batches_revoked, 3);
            // MEP 4 re-assigned here: built, and counted, afresh.
            bu.on_reassigned(4);
            bu.on_assign(20, 4, &mut out);
            arrive(&mut bu, 20, 4, 0, &mut out);
            arrive(&mut bu, 20, 4, 1, &mut out);
            assert_eq!(bu.stats.batches_built, 1);
            assert_eq!(bu.stats.batches_assigned, 5);
            assert_eq!(bu.stats.latency_ns.len(), 1);
            bu.abandon_all(30, &mut out);
        }
    }

    /// `output.deliver_partial`: a batch that times out with one of three
    /// fragments missing goes to the sink (no consumers) or to a consumer
    /// flagged partial, and is reported incomplete to the EM; one with a
    /// fragment that failed verification is not delivered; with the
    /// option off nothing incomplete is.
    #[test]
    fn incomplete_batches_are_delivered_flagged_partial_when_configured() {
        for (deliver, consumers) in [(true, 0), (true, 1), (false, 0), (false, 1)] {
            let mut config = Config::default();
            config.nodes.count = 3;
            config.output.deliver_partial = deliver;
            config.output.consumers = consumers;
            let layout = Layout::from_config(&config);
            let node = layout.bu_nodes[0];
            let mut bu = BuilderUnit::new(&config, &layout, node);
            let mut out = Vec::new();
            bu.start(&mut out);
            if consumers > 0 {
                bu.on_consumer_credit(0, layout.fu_nodes[0], 4, &mut out);
            }
            for mep in [1, 2] {
                bu.on_assign(0, mep, &mut out);
                for s in 0..2 {
                    let mut h = fragment(&config, s, mep);
                    // Well formed: at least a size per event.
                    h.payload_len = 4 * config.source.events_per_mep;
                    assert_eq!(bu.admit(0, layout.ru_nodes[s as usize], &h), Admit::Keep);
                    // MEP 2's fragment of source 1 fails verification.
                    let crc = if mep == 2 && s == 1 { 1 } else { 0 };
                    h.crc32c = 0;
                    bu.on_fragment(0, &h, crc, &mut out);
                }
            }
            out.clear();
            bu.on_timeout(u64::MAX, &mut out);
            let what = format!("deliver_partial {deliver}, consumers {consumers}: {out:?}");
            let to_sink: Vec<MepId> = out
                .iter()
                .filter_map(|a| match a {
                    BuAction::Finish {
                        mep, partial: true, ..
                    } => Some(*mep),
                    _ => None,
                })
                .collect();
            let delivered: Vec<MepId> = out
                .iter()
                .filter_map(|a| match a {
                    BuAction::Deliver {
                        mep, partial: true, ..
                    } => Some(*mep),
                    _ => None,
                })
                .collect();
            let expected = if deliver { vec![1] } else { vec![] };
            if consumers == 0 {
                assert_eq!(to_sink, expected, "{what}");
                assert!(delivered.is_empty(), "{what}");
            } else {
                assert_eq!(delivered, expected, "{what}");
                assert!(to_sink.is_empty(), "{what}");
            }
            assert_eq!(bu.stats.batches_delivered_partial, expected.len() as u64);
            assert_eq!(bu.stats.batches_incomplete, 2, "{what}");
            assert_eq!(bu.stats.batches_built, 0, "{what}");
            // The EM hears both as incomplete, whatever was delivered.
            let codes: Vec<u8> = out
                .iter()
                .filter_map(|a| match a {
                    BuAction::Finished { outcome, .. } => Some(*outcome),
                    _ => None,
                })
                .collect();
            assert_eq!(codes, vec![crate::wire::outcome::INCOMPLETE; 2], "{what}");
        }
    }

    /// The worst case for the fixed receive pool: fragments of `credits`
    /// MEPs overtake their assignments, then `credits` other MEPs are
    /// assigned, every payload of all of them but one (so that none
    /// completes and frees its buffers) is admitted, and nothing more: the
    /// payloads a BU keeps stay within `max_open_batches x sources`.
    #[test]
    fn admitted_payloads_stay_within_the_open_batch_bound() {
        for protocol in [Protocol::Push, Protocol::Pull] {
            let mut config = Config::default();
            config.nodes.count = 4;
            config.event_builder.credits = 3;
            config.event_builder.protocol = protocol;
            let layout = Layout::from_config(&config);
            let node = layout.bu_nodes[0];
            let mut bu = BuilderUnit::new(&config, &layout, node);
            let mut out = Vec::new();
            bu.start(&mut out);
            let credits = config.event_builder.credits;
            let bound = BuilderUnit::max_open_batches(protocol, credits);
            let sources = layout.rus() as u16;
            let mut kept = 0usize;
            let mut admit_all = |bu: &mut BuilderUnit, meps: std::ops::Range<MepId>| {
                let mut out = Vec::new();
                for mep in meps {
                    for s in 0..sources - 1 {
                        let from = layout.ru_nodes[s as usize];
                        let h = fragment(&config, s, mep);
                        if bu.admit(0, from, &h) == Admit::Keep {
                            kept += 1;
                            bu.on_fragment(0, &h, h.crc32c, &mut out);
                            // A duplicate is never kept twice.
                            assert_eq!(bu.admit(0, from, &h), Admit::Drop);
                        }
                    }
                }
                assert!(bu.open_batches() <= bound, "{protocol:?}");
            };
            // Fragments of many MEPs before any assignment.
            admit_all(&mut bu, 0..10 * credits as MepId);
            // Then assignments of as many other MEPs as the EM may make,
            // and their fragments (PULL: requested first).
            for mep in 100..100 + credits as MepId {
                bu.on_assign(0, mep, &mut out);
            }
            out.clear();
            admit_all(&mut bu, 100..100 + 10 * credits as MepId);
            assert!(kept <= bound * sources as usize, "{protocol:?}: {kept}");
            if protocol == Protocol::Push {
                assert_eq!(bu.open_batches(), bound, "the worst case is reached");
                assert_eq!(kept, bound * (sources as usize - 1));
            }
        }
    }

    /// Soak regression: the memory of finished MEPs is bounded and its
    /// tables never reallocate, however many MEPs go by.
    #[test]
    fn finished_memory_is_bounded_and_allocated_up_front() {
        let config = Config::default();
        let layout = Layout::from_config(&config);
        let node = layout.bu_nodes[0];
        let mut bu = BuilderUnit::new(&config, &layout, node);
        let mut out = Vec::new();
        bu.start(&mut out);
        let capacity = (bu.finished.capacity(), bu.finished_order.capacity());
        assert!(capacity.0 >= FINISHED_CAPACITY);
        let mut now: Nanos = 0;
        for mep in 0..4 * FINISHED_MEMORY as MepId {
            bu.on_assign(now, mep, &mut out);
            // Nothing arrives: the batch times out and is finished.
            now += 1_000_000_000_000;
            bu.on_timeout(now, &mut out);
            out.clear();
            assert!(bu.finished.len() <= FINISHED_MEMORY);
        }
        assert_eq!(bu.finished.len(), FINISHED_MEMORY);
        assert_eq!(bu.open_batches(), 0);
        // (A hash table's capacity counts out slots left deleted: it only
        // shrinks until a rehash in place, and grows if it reallocates.)
        assert!(bu.finished.capacity() <= capacity.0);
        assert_eq!(bu.finished_order.capacity(), capacity.1);
    }

    /// Deliveries stay unconfirmed until the consumer's credits come back
    /// (oldest first); a lost consumer's go to another; the end of the
    /// drain frees what is still unconfirmed.
    #[test]
    fn deliveries_are_confirmed_in_order_and_redelivered_when_a_consumer_dies() {
        let mut config = Config::default();
        config.nodes.count = 2;
        config.output.consumers = 2;
        let layout = Layout::from_config(&config);
        let mut bu = BuilderUnit::new(&config, &layout, layout.bu_nodes[0]);
        let (fu_a, fu_b) = (layout.fu_nodes[0], layout.fu_nodes[1]);
        let mut out = Vec::new();
        let queue = |bu: &mut BuilderUnit, mep: MepId| {
            let o = bu.output.as_mut().unwrap();
            o.queue.push_back(Waiting {
                mep,
                events: 1,
                bytes: 10,
                reported: false,
                stalled: false,
                redelivery: false,
                reassigned: false,
                partial: false,
            });
        };
        // Only FU a grants credit: batches 1 and 2 go to it.
        bu.on_consumer_credit(0, fu_a, 2, &mut out);
        for mep in [1, 2] {
            queue(&mut bu, mep);
        }
        bu.pump_output(0, &mut out);
        let delivered = |out: &[BuAction], to: NodeId| -> Vec<MepId> {
            out.iter()
                .filter_map(|a| match a {
                    BuAction::Deliver { to: t, mep, .. } if *t == to => Some(*mep),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(delivered(&out, fu_a), vec![1, 2]);
        assert_eq!(bu.output_unconfirmed(), 2);
        assert!(!bu.is_idle(), "unconfirmed deliveries keep the BU busy");
        // One credit back: the oldest, batch 1, is confirmed.
        out.clear();
        bu.on_consumer_credit(0, fu_a, 1, &mut out);
        assert!(out.contains(&BuAction::Confirmed { mep: 1 }));
        assert_eq!(bu.stats.batches_confirmed, vec![1, 0]);
        // FU a dies holding batch 2; FU b grants credit and gets it again,
        // without a second Finish (its buffers went with the first).
        out.clear();
        bu.on_consumer_credit(0, fu_b, 1, &mut out);
        bu.on_consumer_lost(0, fu_a, &mut out);
        assert_eq!(delivered(&out, fu_b), vec![2]);
        assert!(!out.iter().any(|a| matches!(a, BuAction::Finish { .. })));
        assert_eq!(bu.stats.batches_redelivered, 1);
        assert_eq!(bu.stats.batches_delivered, 2);
        // The drain ends before FU b confirms: its copy is freed, counted.
        out.clear();
        bu.abandon_all(0, &mut out);
        assert!(out.contains(&BuAction::Confirmed { mep: 2 }));
        assert_eq!(bu.stats.batches_unconfirmed, 1);
        assert!(bu.is_idle());
    }
}
