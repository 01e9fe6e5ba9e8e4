//! How `evb run` adds the nodes' reports up: the `summary` object of the
//! run JSON (`docs/run-json.md`), with its CPU, slot clock, consumers and
//! failure parts.

use evb_control::report::{ClockReport, Latency, NodeReport};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Totals of a run, as in the `summary` object of the run JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub nodes: u16,
    pub duration_s: f64,
    pub events_per_mep: u32,
    pub meps_assigned: u64,
    pub events_generated: u64,
    pub events_built: u64,
    pub events_incomplete: u64,
    pub events_corrupt: u64,
    pub events_lost: u64,
    pub batches_built: u64,
    pub bytes_built: u64,
    /// Payload of verified built events, aggregate, in Gb/s.
    pub built_gbps: f64,
    pub built_gbps_per_node: f64,
    pub events_per_second: f64,
    pub fragments_corrupt: u64,
    pub fragments_duplicate: u64,
    pub fragments_unexpected: u64,
    pub latency_ns: Latency,
    /// Per source index: batches that timed out without its fragment.
    pub missing_by_source: Vec<u64>,
    /// Nodes that never sent their final report (crashed or killed).
    pub nodes_missing: Vec<u16>,
    /// Of `events_lost`: events of MEPs whose BU was lost before finishing
    /// them, and that could not be re-assigned.
    pub events_lost_bu_gone: u64,
    /// MEPs (and their events) of a lost BU re-assigned to another BU
    /// because every live RU still held their fragments; each is counted
    /// by its outcome at its new BU (built, or incomplete without the
    /// fragment of an RU that died with the BU).
    #[serde(default)]
    pub meps_reassigned: u64,
    #[serde(default)]
    pub events_reassigned: u64,
    /// MEPs the EM took from a BU lost while alive (re-assigned, or lost)
    /// and named to it when it came back (every incarnation of the EM);
    /// and the batches the BUs took out of their own counts for it (every
    /// incarnation of every BU). A revoked MEP is counted once: by the BU
    /// it was re-assigned to, or lost; never by the BU it was taken from.
    #[serde(default)]
    pub meps_revoked: u64,
    #[serde(default)]
    pub batches_revoked: u64,
    /// Of `events_lost` (paced readout): events read out while no BU was left.
    #[serde(default)]
    pub events_lost_no_bu: u64,
    /// Incomplete batches the BUs delivered anyway, flagged partial
    /// (`output.deliver_partial`); their events are in `events_incomplete`.
    #[serde(default)]
    pub batches_delivered_partial: u64,
    /// The EM was restarted and resumed at this MEP. MEP fates are then the
    /// BUs' own counts (the old EM's died with it), and a BU that died with
    /// the old EM counts up to its last report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub em_resumed_at_mep: Option<u64>,
    /// Paced readout (`source.mep_rate_hz`): events vetoed at the source
    /// while the readout was throttled (never read out, so not in
    /// `events_generated`), time throttled, episodes, and the most MEPs not
    /// yet built at once (bounded by `event_builder.ru_buffer_meps`).
    #[serde(default)]
    pub events_vetoed: u64,
    #[serde(default)]
    pub throttled_s: f64,
    #[serde(default)]
    pub throttle_episodes: u64,
    #[serde(default)]
    pub max_unbuilt_meps: u64,
    /// `output.sink = "store"`: objects, events and bytes written to the
    /// event store by every node (BUs, or the consumers when there are).
    #[serde(default)]
    pub store_objects: u64,
    #[serde(default)]
    pub store_events: u64,
    #[serde(default)]
    pub store_bytes: u64,
    /// `event_builder.preallocate_buffers`: the nodes' preallocated buffers
    /// (bytes, all nodes), MEPs that waited for a free MEP buffer, receive
    /// buffers allocated past a pool's bound.
    #[serde(default)]
    pub buffers_preallocated_bytes: u64,
    #[serde(default)]
    pub mep_buffer_waits: u64,
    #[serde(default)]
    pub rx_buffer_overflows: u64,
    /// What the readout wrote (`source.readout`: `ring` or `fresh`), what
    /// the BUs checked of each fragment (`event_builder.verify`, with the
    /// sample rate: `sample 1/64`), and whether the BUs read the RUs'
    /// fragments in place (shm zero copy).
    #[serde(default)]
    pub readout: String,
    #[serde(default)]
    pub verify: String,
    #[serde(default)]
    pub zero_copy: bool,
    /// CPU the nodes spent, and what it cost per GB built.
    #[serde(default)]
    pub cpu: CpuSummary,
    /// Injected faults and peers declared lost, in time order.
    pub failures: Vec<FailureEvent>,
    /// The slotted barrel's clock: how well the nodes agree on the slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_clock: Option<SlotClockSummary>,
    /// The output stage, when the run had consumers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumers: Option<ConsumersSummary>,
    /// Per step of the shift (RU s to BU (s + step) mod BUs): what the RUs
    /// shipped through the transport, and how fast.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepFigures>,
}

/// One step of the shift: the fragments every RU s shipped to BU
/// (s + step) mod BUs through the transport, their bytes, the time they
/// took (summed over fragments, from the hand-over to the transport until
/// it was done), and the rate of a fragment in flight: bytes x 8 / time.
/// A step slower than the others points at its flows, and through the
/// routes at the links they share (`evb fabric diagnose --run`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StepFigures {
    pub step: u32,
    pub fragments: u64,
    pub bytes: u64,
    pub transfer_s: f64,
    pub gbps: f64,
}

impl StepFigures {
    /// The steps from the RUs' reports: RU of endpoint `ru_of[n]` to BU
    /// `bu_of[to]`.
    pub fn from_reports(
        reports: &[Option<NodeReport>],
        ru_of: &[Option<u16>],
        bu_of: &[Option<u16>],
        bus: usize,
    ) -> Vec<StepFigures> {
        let mut steps: Vec<StepFigures> = (0..bus as u32)
            .map(|step| StepFigures {
                step,
                ..StepFigures::default()
            })
            .collect();
        for r in reports.iter().flatten() {
            let Some(Some(s)) = ru_of.get(r.node as usize) else {
                continue;
            };
            for b in &r.sends_by_bu {
                let Some(Some(d)) = bu_of.get(b.bu as usize) else {
                    continue;
                };
                let step = (usize::from(*d) + bus - usize::from(*s) % bus) % bus;
                let f = &mut steps[step];
                f.fragments += b.fragments;
                f.bytes += b.bytes;
                f.transfer_s += b.transfer_s;
            }
        }
        steps.retain(|f| f.fragments > 0);
        for f in &mut steps {
            f.gbps = f.bytes as f64 * 8.0 / f.transfer_s.max(1e-12) / 1e9;
        }
        steps
    }
}

/// CPU time of a run's nodes (their processes, every thread), and what it
/// cost per GB (10^9 bytes) of events built.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuSummary {
    /// Summed over every node, seconds.
    pub user_s: f64,
    pub system_s: f64,
    /// The sums over the bytes built by all BUs: for every GB built, the
    /// CPU seconds the whole event builder spent (EM and RU work
    /// included). A node of a folded builder that builds its share spends
    /// this much per GB it builds.
    pub user_s_per_gb: f64,
    pub system_s_per_gb: f64,
    /// Of the nodes that built anything, the one that spent the most per
    /// GB it built itself (user + system), and its figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_node: Option<u16>,
    #[serde(default)]
    pub max_node_user_s_per_gb: f64,
    #[serde(default)]
    pub max_node_system_s_per_gb: f64,
}

impl CpuSummary {
    pub fn from_reports(reports: &[Option<NodeReport>], bytes_built: u64) -> CpuSummary {
        let mut c = CpuSummary::default();
        for r in reports.iter().flatten() {
            c.user_s += r.cpu_user_s;
            c.system_s += r.cpu_system_s;
        }
        if bytes_built > 0 {
            let gb = bytes_built as f64 / 1e9;
            c.user_s_per_gb = c.user_s / gb;
            c.system_s_per_gb = c.system_s / gb;
        }
        if let Some(r) = reports
            .iter()
            .flatten()
            .filter(|r| r.bytes_built > 0)
            .max_by(|a, b| {
                (a.cpu_user_s_per_gb + a.cpu_system_s_per_gb)
                    .total_cmp(&(b.cpu_user_s_per_gb + b.cpu_system_s_per_gb))
            })
        {
            c.max_node = Some(r.node);
            c.max_node_user_s_per_gb = r.cpu_user_s_per_gb;
            c.max_node_system_s_per_gb = r.cpu_system_s_per_gb;
        }
        c
    }
}

/// How well the nodes of a slotted run agreed on the EM's clock.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SlotClockSummary {
    pub slot_us: f64,
    /// Slots a rotation: the shift's B - 1 (B with local = nic), or the
    /// schedule file's lines.
    #[serde(default)]
    pub rotation_slots: u64,
    /// `event_builder.schedule_file`, when the slots come from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_file: Option<String>,
    /// Nodes that measured their offset (the EM's node does not).
    pub nodes_measured: u16,
    /// Largest half round trip under an offset: the bound on each node's
    /// phase error if its paths are symmetric.
    pub max_uncertainty_ns: u64,
    /// Nodes on the EM's host: measured minus true offset (the true one
    /// from the processes' CLOCK_MONOTONIC epochs), largest magnitude.
    /// `None` when no node shares the EM's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_abs_phase_error_ns: Option<u64>,
    pub nodes: Vec<SlotClockNode>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SlotClockNode {
    pub node: u16,
    pub offset_ns: i64,
    pub uncertainty_ns: u64,
    pub replies: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_error_ns: Option<i64>,
}

impl SlotClockSummary {
    /// From the nodes' final reports; `None` if no node reported a clock.
    pub fn from_reports(reports: &[Option<NodeReport>], slot_us: f64) -> Option<SlotClockSummary> {
        let clocks: Vec<(u16, &ClockReport)> = reports
            .iter()
            .flatten()
            .filter_map(|r| r.clock.as_ref().map(|c| (r.node, c)))
            .collect();
        let em = clocks.iter().find(|(_, c)| c.em).map(|(_, c)| *c);
        let nodes: Vec<SlotClockNode> = clocks
            .iter()
            .filter(|(_, c)| !c.em)
            .map(|&(node, c)| SlotClockNode {
                node,
                offset_ns: c.offset_ns,
                uncertainty_ns: c.uncertainty_ns,
                replies: c.replies,
                // EM time - node time = node epoch - EM epoch (one clock).
                phase_error_ns: em.filter(|e| e.host == c.host && c.replies > 0).map(|e| {
                    let truth = c.epoch_monotonic_ns as i64 - e.epoch_monotonic_ns as i64;
                    c.offset_ns - truth
                }),
            })
            .collect();
        if nodes.is_empty() {
            return None;
        }
        let errors: Vec<u64> = nodes
            .iter()
            .filter_map(|n| n.phase_error_ns.map(i64::unsigned_abs))
            .collect();
        Some(SlotClockSummary {
            slot_us,
            rotation_slots: 0,
            schedule_file: None,
            nodes_measured: nodes.iter().filter(|n| n.replies > 0).count() as u16,
            max_uncertainty_ns: nodes.iter().map(|n| n.uncertainty_ns).max().unwrap_or(0),
            max_abs_phase_error_ns: errors.iter().copied().max(),
            nodes,
        })
    }
}

/// The output stage of a run with Filter Unit consumers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConsumersSummary {
    pub consumers: u16,
    /// The BUs, which deliver (the producers).
    #[serde(default)]
    pub producers: u16,
    /// Where the deliveries ran: `output` (the output network, a second
    /// address or interface: every BU reported its links to the consumers
    /// there) or `event-building` (the links the fragments use).
    #[serde(default)]
    pub network: String,
    /// Built batches the BUs handed to consumers, and their bytes.
    pub batches_delivered: u64,
    pub bytes_delivered: u64,
    /// Built batches no consumer could take (all gone, or the drain ended).
    pub batches_undelivered: u64,
    /// Deliveries the consumers confirmed (their credit came back to the
    /// BU): each delivered batch once, whether its consumer survived or
    /// not; and deliveries made again because a consumer died first.
    #[serde(default)]
    pub batches_confirmed: u64,
    #[serde(default)]
    pub batches_redelivered: u64,
    /// Deliveries no consumer had confirmed when the drain ended.
    #[serde(default)]
    pub batches_unconfirmed: u64,
    pub batches_consumed: u64,
    pub events_consumed: u64,
    pub bytes_consumed: u64,
    /// Events the consumers' triggers accepted (`output.accept_fraction`),
    /// and the consumed batches with any accepted event.
    #[serde(default)]
    pub events_accepted: u64,
    #[serde(default)]
    pub batches_accepted: u64,
    /// Consumed batches that failed verification (CRC or fragment table).
    pub batches_corrupt: u64,
    /// Deliveries flagged partial the consumers received (incomplete
    /// batches delivered anyway, `output.deliver_partial`).
    #[serde(default)]
    pub batches_partial: u64,
    /// Delivered and never consumed (a consumer died, or the drain ended).
    pub batches_not_consumed: u64,
    /// Producer (delivered) and consumer throughput over the run, Gb/s:
    /// aggregates over all BUs / all consumers.
    pub producer_gbps: f64,
    pub consumer_gbps: f64,
    /// The same per producer and per consumer (the aggregates over their
    /// number; each one's own figure is in `per_producer` / `per_consumer`).
    #[serde(default)]
    pub producer_gbps_per_producer: f64,
    #[serde(default)]
    pub consumer_gbps_per_consumer: f64,
    /// Times the EM had a MEP to assign and no BU had credit.
    pub em_credit_stalls: u64,
    /// Time output queues were full, summed over BUs, s.
    pub output_full_s: f64,
    pub max_output_queue: u32,
    #[serde(default)]
    pub per_producer: Vec<ProducerFigures>,
    pub per_consumer: Vec<ConsumerFigures>,
}

/// One producer's (BU's) deliveries.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProducerFigures {
    pub node: u16,
    pub batches: u64,
    pub bytes: u64,
    /// Its delivered bytes over the run, Gb/s.
    pub gbps: f64,
    /// Its address on the output network (empty without one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
}

/// One consumer's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConsumerFigures {
    pub node: u16,
    pub batches: u64,
    /// Its deliveries the BUs saw confirmed (known even if it died).
    #[serde(default)]
    pub confirmed: u64,
    pub bytes: u64,
    /// Its consumed bytes over the run, Gb/s.
    #[serde(default)]
    pub gbps: f64,
    /// Fraction of the run it was busy.
    pub busy_fraction: f64,
    /// Its address on the output network (empty without one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
}

impl ConsumersSummary {
    /// From the node reports, by endpoint.
    pub fn from_reports(
        reports: &[Option<NodeReport>],
        layout: &evb_core::Layout,
        duration_s: f64,
    ) -> ConsumersSummary {
        let (fu_nodes, em) = (&layout.fu_nodes, layout.em as usize);
        let report = |n: u16| reports.get(n as usize).and_then(Option::as_ref);
        let address = |r: Option<&NodeReport>| {
            r.and_then(|r| r.output_network.as_ref())
                .map_or(String::new(), |o| o.address.clone())
        };
        let gbps = |bytes: u64| {
            if duration_s > 0.0 {
                bytes as f64 * 8.0 / duration_s / 1e9
            } else {
                0.0
            }
        };
        // Over the output network when every BU that reported has its
        // links to all consumers there.
        let bus: Vec<&NodeReport> = layout.bu_nodes.iter().filter_map(|&n| report(n)).collect();
        let on_output = !bus.is_empty()
            && bus.iter().all(|r| {
                r.output_network.as_ref().is_some_and(|o| {
                    fu_nodes
                        .iter()
                        .all(|&f| o.links.iter().any(|l| l.peer == f))
                })
            });
        let mut c = ConsumersSummary {
            consumers: fu_nodes.len() as u16,
            producers: layout.bus() as u16,
            network: if on_output {
                "output"
            } else {
                "event-building"
            }
            .into(),
            ..Default::default()
        };
        for r in reports.iter().flatten() {
            c.batches_delivered += r.batches_delivered;
            c.bytes_delivered += r.bytes_delivered;
            c.batches_undelivered += r.batches_undelivered;
            c.batches_confirmed += r.batches_confirmed.iter().sum::<u64>();
            c.batches_redelivered += r.batches_redelivered;
            c.batches_unconfirmed += r.batches_unconfirmed;
            c.output_full_s += r.output_full_s;
            c.max_output_queue = c.max_output_queue.max(r.max_output_queue);
            c.batches_consumed += r.batches_consumed;
            c.events_consumed += r.events_consumed;
            c.bytes_consumed += r.bytes_consumed;
            c.events_accepted += r.events_accepted;
            c.batches_accepted += r.batches_accepted;
            c.batches_corrupt += r.batches_consumed_corrupt;
            c.batches_partial += r.batches_consumed_partial;
        }
        c.batches_not_consumed = c.batches_delivered.saturating_sub(c.batches_consumed);
        c.em_credit_stalls = reports
            .get(em)
            .and_then(Option::as_ref)
            .map_or(0, |r| r.em_credit_stalls);
        c.producer_gbps = gbps(c.bytes_delivered);
        c.consumer_gbps = gbps(c.bytes_consumed);
        c.producer_gbps_per_producer = c.producer_gbps / f64::from(c.producers.max(1));
        c.consumer_gbps_per_consumer = c.consumer_gbps / f64::from(c.consumers.max(1));
        c.per_producer = layout
            .bu_nodes
            .iter()
            .map(|&n| {
                let r = report(n);
                let bytes = r.map_or(0, |r| r.bytes_delivered);
                ProducerFigures {
                    node: n,
                    batches: r.map_or(0, |r| r.batches_delivered),
                    bytes,
                    gbps: gbps(bytes),
                    address: address(r),
                }
            })
            .collect();
        c.per_consumer = fu_nodes
            .iter()
            .enumerate()
            .map(|(f, &n)| {
                let r = report(n);
                let bytes = r.map_or(0, |r| r.bytes_consumed);
                ConsumerFigures {
                    node: n,
                    batches: r.map_or(0, |r| r.batches_consumed),
                    confirmed: reports
                        .iter()
                        .flatten()
                        .filter_map(|r| r.batches_confirmed.get(f))
                        .sum(),
                    bytes,
                    gbps: gbps(bytes),
                    busy_fraction: r
                        .filter(|r| r.elapsed_s > 0.0)
                        .map_or(0.0, |r| (r.busy_s / r.elapsed_s).min(1.0)),
                    address: address(r),
                }
            })
            .collect();
        c
    }

    /// Every delivered batch consumed intact, none left undelivered.
    pub fn clean(&self) -> bool {
        self.batches_undelivered == 0
            && self.batches_not_consumed == 0
            && self.batches_corrupt == 0
            && self.batches_unconfirmed == 0
    }
}

/// One entry of the failure timeline.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FailureEvent {
    /// Seconds since the launcher started.
    pub at_s: f64,
    /// The endpoint concerned.
    pub node: u16,
    /// Who saw it (`launcher` for injected faults, else `node N`).
    pub seen_by: String,
    pub what: String,
}

impl Summary {
    /// Adds up the node reports: finals, or the latest `STATS` of a node
    /// listed in `missing` (it died), and the last reports of incarnations
    /// that a restart replaced (`earlier`). MEP fates come from the EM's
    /// accounting when its final report is there (endpoint `em`) and it ran
    /// the whole run; else from the BUs' own counts.
    pub fn from_reports(
        reports: &[Option<NodeReport>],
        earlier: &[NodeReport],
        missing: &[u16],
        em: usize,
        events_per_mep: u32,
        nodes: u16,
    ) -> Summary {
        let mut s = Summary {
            nodes,
            events_per_mep,
            nodes_missing: missing.to_vec(),
            ..Default::default()
        };
        let epm = u64::from(events_per_mep);
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds");
        for (r, replaced) in reports
            .iter()
            .flatten()
            .map(|r| (r, false))
            .chain(earlier.iter().map(|r| (r, true)))
        {
            if !replaced {
                // A restarted EM counts its predecessors' MEPs too.
                s.duration_s = s.duration_s.max(r.elapsed_s);
                s.meps_assigned += r.meps_assigned;
            }
            s.events_built += r.events_built;
            s.events_incomplete += r.events_incomplete;
            s.events_corrupt += r.events_corrupt;
            s.batches_built += r.batches_built;
            s.batches_delivered_partial += r.batches_delivered_partial;
            s.batches_revoked += r.batches_revoked;
            s.meps_revoked += r.em_meps_revoked;
            s.bytes_built += r.bytes_built;
            s.fragments_corrupt += r.fragments_corrupt;
            s.fragments_duplicate += r.fragments_duplicate;
            s.fragments_unexpected += r.fragments_unexpected;
            s.store_objects += r.store_objects;
            s.store_events += r.store_events;
            s.store_bytes += r.store_bytes;
            s.buffers_preallocated_bytes += r.buffers_preallocated_bytes;
            s.mep_buffer_waits += r.mep_buffer_waits;
            s.rx_buffer_overflows += r.rx_buffer_overflows;
            for &(v, c) in &r.latency_buckets {
                let _ = hist.record_n(v.max(1), c);
            }
            if s.missing_by_source.len() < r.missing_by_source.len() {
                s.missing_by_source.resize(r.missing_by_source.len(), 0);
            }
            for (a, b) in s.missing_by_source.iter_mut().zip(&r.missing_by_source) {
                *a += b;
            }
        }
        // The EM heard the fate of every MEP from the BUs, including BUs
        // that died later: its counts are the exact ones. Not those of a
        // restarted EM: the fates its predecessor heard died with it.
        let em_final = reports
            .get(em)
            .and_then(Option::as_ref)
            .filter(|r| !missing.contains(&(em as u16)) && !r.restarted);
        if let Some(r) = em_final {
            s.events_built = r.em_meps_built * epm;
            s.events_incomplete = r.em_meps_incomplete * epm;
            s.events_corrupt = r.em_meps_corrupt * epm;
            s.events_lost_bu_gone = r.em_meps_lost_bu_gone * epm;
            s.meps_reassigned = r.em_meps_reassigned;
            s.events_reassigned = r.em_meps_reassigned * epm;
        }
        if let Some(r) = reports.get(em).and_then(Option::as_ref) {
            s.em_resumed_at_mep = r.em_resumed_at;
            s.events_lost_no_bu = r.em_meps_lost_no_bu * epm;
            s.events_vetoed = r.em_meps_vetoed * epm;
            s.throttled_s = r.em_throttled_s;
            s.throttle_episodes = r.em_throttle_episodes;
            s.max_unbuilt_meps = r.em_max_unbuilt;
        }
        if em_final.is_none() {
            // The EM died: its assignments after its last STATS are gone
            // with it, but every assigned MEP was produced by the RUs
            // (whose reports remain), so the most any RU produced bounds
            // them from below and nothing built is left without a MEP.
            let produced = reports
                .iter()
                .flatten()
                .chain(earlier)
                .map(|r| r.meps_produced)
                .max()
                .unwrap_or(0);
            s.meps_assigned = s.meps_assigned.max(produced);
        }
        s.events_generated = s.meps_assigned * epm + s.events_lost_no_bu;
        s.events_lost = s
            .events_generated
            .saturating_sub(s.events_built + s.events_incomplete + s.events_corrupt);
        s.latency_ns = Latency::of(&hist);
        if s.duration_s > 0.0 {
            s.built_gbps = s.bytes_built as f64 * 8.0 / s.duration_s / 1e9;
            s.built_gbps_per_node = s.built_gbps / f64::from(nodes.max(1));
            s.events_per_second = s.events_built as f64 / s.duration_s;
        }
        s
    }

    /// Whether anything was lost, incomplete or corrupt.
    pub fn clean(&self) -> bool {
        self.events_lost == 0
            && self.events_incomplete == 0
            && self.events_corrupt == 0
            && self.nodes_missing.is_empty()
            && self.consumers.as_ref().is_none_or(ConsumersSummary::clean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(node: u16, produced: u64, built: u64) -> NodeReport {
        NodeReport {
            node,
            role: "RU+BU".into(),
            elapsed_s: 4.0,
            meps_produced: produced,
            batches_built: built,
            events_built: built * 16,
            ..NodeReport::default()
        }
    }

    #[test]
    fn cpu_per_gb_is_the_nodes_cpu_over_the_bytes_built() {
        let mut a = node(0, 1, 1);
        a.bytes_built = 2_000_000_000;
        (a.cpu_user_s, a.cpu_system_s) = (1.0, 3.0);
        (a.cpu_user_s_per_gb, a.cpu_system_s_per_gb) = (0.5, 1.5);
        let mut b = node(1, 1, 1);
        b.bytes_built = 2_000_000_000;
        (b.cpu_user_s, b.cpu_system_s) = (2.0, 2.0);
        (b.cpu_user_s_per_gb, b.cpu_system_s_per_gb) = (1.0, 0.5);
        // An EM of its own builds nothing: its CPU counts, it has no figure.
        let mut em = node(2, 0, 0);
        (em.cpu_user_s, em.cpu_system_s) = (1.0, 0.0);
        let c = CpuSummary::from_reports(&[Some(a), Some(b), Some(em), None], 4_000_000_000);
        assert_eq!((c.user_s, c.system_s), (4.0, 5.0));
        assert_eq!((c.user_s_per_gb, c.system_s_per_gb), (1.0, 1.25));
        assert_eq!(c.max_node, Some(0));
        assert_eq!(
            (c.max_node_user_s_per_gb, c.max_node_system_s_per_gb),
            (0.5, 1.5)
        );
        assert_eq!(CpuSummary::from_reports(&[], 0), CpuSummary::default());
    }

    /// The EM (endpoint 2) was killed: its last STATS said 10 MEPs were
    /// assigned, but the RUs went on producing what it assigned after that
    /// (12 and 11), and the BUs built 11 of them: generated counts the 12,
    /// one MEP is lost, none is built out of nothing.
    #[test]
    fn a_dead_ems_assignments_are_bounded_by_what_the_rus_produced() {
        let mut em = NodeReport {
            node: 2,
            role: "EM".into(),
            meps_assigned: 10,
            ..NodeReport::default()
        };
        em.elapsed_s = 1.5;
        let reports = vec![Some(node(0, 12, 6)), Some(node(1, 11, 5)), Some(em.clone())];
        let s = Summary::from_reports(&reports, &[], &[2], 2, 16, 2);
        assert_eq!(s.meps_assigned, 12);
        assert_eq!(s.events_generated, 12 * 16);
        assert_eq!(s.events_built, 11 * 16);
        assert_eq!(s.events_lost, 16);
        assert!(!s.clean());

        // With the EM's final report its own count stands.
        em.meps_assigned = 12;
        em.em_meps_built = 11;
        let reports = vec![Some(node(0, 12, 6)), Some(node(1, 11, 5)), Some(em)];
        let s = Summary::from_reports(&reports, &[], &[], 2, 16, 2);
        assert_eq!(s.events_generated, 12 * 16);
        assert_eq!(s.events_built, 11 * 16);
    }
}
