//! The metric definitions: one row per metric, in the order they are
//! served, with its documented name (`docs/metrics.md`), its type, its help
//! text and how its value is read from the node report and the gauges.
//!
//! A row's reader returns `None` (or no samples) where the metric does not
//! apply, so a node serves only what it has: the output-stage series on a
//! BU with consumers and on a Filter Unit, the missing-source series once a
//! batch went incomplete. Every sample carries the labels `node` and `role`;
//! a per-label row adds one more label (`consumer`, `bu`, `source`).

use prometheus_client::metrics::MetricType;

use evb_control::report::NodeReport;

use crate::Gauges;

/// Upper bounds of the latency histogram buckets, seconds.
pub(crate) const LATENCY_BOUNDS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// One metric: its documented name (counters with their `_total`), type,
/// help and reader.
pub(crate) struct MetricDef {
    pub name: &'static str,
    pub kind: MetricType,
    pub help: &'static str,
    pub read: Read,
}

/// How a metric's samples are read.
pub(crate) enum Read {
    /// One sample, or none where the metric does not apply.
    One(fn(&NodeReport, &Gauges) -> Option<Num>),
    /// One sample per value of one more label (an endpoint or a source).
    PerLabel {
        label: &'static str,
        read: fn(&NodeReport, &Gauges) -> Vec<(u64, Num)>,
    },
    /// A histogram of nanosecond observations `(value ns, count)` over
    /// [`LATENCY_BOUNDS_S`].
    LatencyNs(fn(&NodeReport) -> &[(u64, u64)]),
}

/// A sample's value: integers stay integers in the text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Num {
    Int(u64),
    Real(f64),
}

impl From<u64> for Num {
    fn from(v: u64) -> Self {
        Num::Int(v)
    }
}

impl From<u32> for Num {
    fn from(v: u32) -> Self {
        Num::Int(u64::from(v))
    }
}

impl From<usize> for Num {
    fn from(v: usize) -> Self {
        Num::Int(v as u64)
    }
}

impl From<f64> for Num {
    fn from(v: f64) -> Self {
        Num::Real(v)
    }
}

impl From<bool> for Num {
    fn from(v: bool) -> Self {
        Num::Int(u64::from(v))
    }
}

/// Served by every node.
fn every(v: impl Into<Num>) -> Option<Num> {
    Some(v.into())
}

/// Served by a BU of a run with consumers.
fn bu_output(g: &Gauges, v: impl Into<Num>) -> Option<Num> {
    g.bu_output.as_ref().map(|_| v.into())
}

/// Served by a Filter Unit consumer.
fn consumer(g: &Gauges, v: impl Into<Num>) -> Option<Num> {
    g.consumer.as_ref().map(|_| v.into())
}

/// (endpoint, credits) pairs as samples labelled by endpoint.
fn per_endpoint(credits: &[(evb_core::NodeId, u32)]) -> Vec<(u64, Num)> {
    credits
        .iter()
        .map(|&(node, n)| (u64::from(node), n.into()))
        .collect()
}

const fn counter(
    name: &'static str,
    help: &'static str,
    read: fn(&NodeReport, &Gauges) -> Option<Num>,
) -> MetricDef {
    MetricDef {
        name,
        kind: MetricType::Counter,
        help,
        read: Read::One(read),
    }
}

const fn gauge(
    name: &'static str,
    help: &'static str,
    read: fn(&NodeReport, &Gauges) -> Option<Num>,
) -> MetricDef {
    MetricDef {
        name,
        kind: MetricType::Gauge,
        help,
        read: Read::One(read),
    }
}

/// Every metric a node can serve, in the order served.
pub(crate) const METRICS: &[MetricDef] = &[
    counter(
        "evb_meps_assigned_total",
        "MEPs the Event Manager assigned (EM node only).",
        |r, _| every(r.meps_assigned),
    ),
    counter(
        "evb_meps_produced_total",
        "MEPs this Readout Unit produced.",
        |r, _| every(r.meps_produced),
    ),
    counter(
        "evb_fragments_sent_total",
        "Fragments this RU shipped, local hand-overs included.",
        |r, _| every(r.fragments_sent),
    ),
    counter(
        "evb_sent_bytes_total",
        "Fragment payload bytes this RU shipped.",
        |r, _| every(r.bytes_sent),
    ),
    counter(
        "evb_fragments_received_total",
        "Fragments this Builder Unit accepted.",
        |r, _| every(r.fragments_received),
    ),
    counter(
        "evb_received_bytes_total",
        "Fragment payload bytes this BU accepted.",
        |r, _| every(r.bytes_received),
    ),
    counter(
        "evb_batches_built_total",
        "Batches (MEPs) built complete and verified.",
        |r, _| every(r.batches_built),
    ),
    counter(
        "evb_events_built_total",
        "Events built complete and verified.",
        |r, _| every(r.events_built),
    ),
    counter(
        "evb_built_bytes_total",
        "Payload bytes of built events.",
        |r, _| every(r.bytes_built),
    ),
    counter(
        "evb_batches_incomplete_total",
        "Batches that timed out with fragments missing.",
        |r, _| every(r.batches_incomplete),
    ),
    counter(
        "evb_events_incomplete_total",
        "Events in incomplete batches.",
        |r, _| every(r.events_incomplete),
    ),
    counter(
        "evb_batches_corrupt_total",
        "Batches discarded because a fragment failed verification.",
        |r, _| every(r.batches_corrupt),
    ),
    counter(
        "evb_events_corrupt_total",
        "Events in corrupt batches.",
        |r, _| every(r.events_corrupt),
    ),
    counter(
        "evb_fragments_corrupt_total",
        "Fragments that failed verification.",
        |r, _| every(r.fragments_corrupt),
    ),
    counter(
        "evb_fragments_duplicate_total",
        "Fragments received twice.",
        |r, _| every(r.fragments_duplicate),
    ),
    counter(
        "evb_fragments_unexpected_total",
        "Fragments for no open batch.",
        |r, _| every(r.fragments_unexpected),
    ),
    counter(
        "evb_control_rejected_total",
        "Control messages from endpoints not entitled to send them.",
        |r, _| every(r.control_rejected),
    ),
    counter(
        "evb_em_credit_stalls_total",
        "Times the EM had a MEP to assign and no BU had credit (EM node only).",
        |r, _| every(r.em_credit_stalls),
    ),
    counter(
        "evb_em_meps_lost_bu_gone_total",
        "MEPs lost with their Builder Unit (EM node only).",
        |r, _| every(r.em_meps_lost_bu_gone),
    ),
    counter(
        "evb_em_meps_reassigned_total",
        "MEPs of a lost Builder Unit re-assigned to another because the RUs still held them (EM node only).",
        |r, _| every(r.em_meps_reassigned),
    ),
    counter(
        "evb_em_meps_vetoed_total",
        "Paced readout: MEPs vetoed at the source while the readout was throttled (EM node only).",
        |r, _| every(r.em_meps_vetoed),
    ),
    counter(
        "evb_em_throttled_seconds_total",
        "Paced readout: time the readout was throttled because the RU buffers were full (EM node only).",
        |r, _| every(r.em_throttled_s),
    ),
    counter(
        "evb_em_throttle_episodes_total",
        "Paced readout: times the throttle came on (EM node only).",
        |r, _| every(r.em_throttle_episodes),
    ),
    gauge(
        "evb_ru_meps_held_max",
        "Most assigned MEPs this RU held at once (its buffer occupancy).",
        |r, _| every(r.max_meps_held),
    ),
    gauge(
        "evb_peers_lost",
        "Peers this node declared lost.",
        |r, _| every(r.peers_lost.len()),
    ),
    gauge(
        "evb_peers_up",
        "Peers this node is linked to and has not lost.",
        |_, g| every(g.peers_up),
    ),
    gauge(
        "evb_ru_meps_held",
        "MEPs whose data the RU still holds (in flight or queued).",
        |_, g| every(g.ru_meps_held),
    ),
    gauge(
        "evb_ru_max_in_flight",
        "Most transfers the RU had in flight at once.",
        |r, _| every(r.max_in_flight),
    ),
    gauge(
        "evb_bu_open_batches",
        "Batches the BU has open (credits in use).",
        |_, g| every(g.bu_open_batches),
    ),
    gauge(
        "evb_resident_bytes",
        "Resident memory of the node process.",
        |r, _| every(r.rss_bytes),
    ),
    counter(
        "evb_cpu_user_seconds_total",
        "User CPU time of the node process (all threads).",
        |r, _| every(r.cpu_user_s),
    ),
    counter(
        "evb_cpu_system_seconds_total",
        "System CPU time of the node process (all threads).",
        |r, _| every(r.cpu_system_s),
    ),
    gauge(
        "evb_cpu_user_seconds_per_gb_built",
        "User CPU seconds per GB (1e9 bytes) this node built, since its start (0 before it built anything).",
        |r, _| every(r.cpu_user_s_per_gb),
    ),
    gauge(
        "evb_cpu_system_seconds_per_gb_built",
        "System CPU seconds per GB (1e9 bytes) this node built, since its start (0 before it built anything).",
        |r, _| every(r.cpu_system_s_per_gb),
    ),
    counter(
        "evb_store_objects_total",
        "Objects this node wrote to the event store.",
        |r, _| every(r.store_objects),
    ),
    counter(
        "evb_store_events_total",
        "Events in the objects this node wrote to the event store.",
        |r, _| every(r.store_events),
    ),
    counter(
        "evb_store_bytes_total",
        "Bytes this node wrote to the event store.",
        |r, _| every(r.store_bytes),
    ),
    gauge(
        "evb_elapsed_seconds",
        "Seconds since the node started its run.",
        |r, _| every(r.elapsed_s),
    ),
    // The producer side of the output stage: a BU of a run with consumers.
    counter(
        "evb_bu_batches_delivered_total",
        "Built batches this BU handed to consumers.",
        |r, g| bu_output(g, r.batches_delivered),
    ),
    counter(
        "evb_bu_batches_delivered_partial_total",
        "Incomplete batches this BU delivered anyway, flagged partial.",
        |r, g| bu_output(g, r.batches_delivered_partial),
    ),
    counter(
        "evb_bu_delivered_bytes_total",
        "Bytes of the batches this BU handed to consumers (fragment table included).",
        |r, g| bu_output(g, r.bytes_delivered),
    ),
    counter(
        "evb_bu_batches_redelivered_total",
        "Deliveries made again because their consumer died before confirming them.",
        |r, g| bu_output(g, r.batches_redelivered),
    ),
    counter(
        "evb_bu_batches_undelivered_total",
        "Built batches no consumer could take (all gone, or the drain ended).",
        |r, g| bu_output(g, r.batches_undelivered),
    ),
    gauge(
        "evb_bu_output_queue_batches",
        "Built batches waiting for a consumer.",
        |_, g| g.bu_output.as_ref().map(|o| o.queue.into()),
    ),
    gauge(
        "evb_bu_output_queue_max",
        "Longest the output queue has been.",
        |r, g| bu_output(g, r.max_output_queue),
    ),
    counter(
        "evb_bu_output_full_seconds_total",
        "Time the output queue was full (EM credits held back).",
        |r, g| bu_output(g, r.output_full_s),
    ),
    counter(
        "evb_bu_consumer_credit_stalls_total",
        "Built batches that found no consumer credit and had to wait.",
        |_, g| g.bu_output.as_ref().map(|o| o.credit_stalls.into()),
    ),
    // A Filter Unit consumer.
    counter(
        "evb_consumer_batches_received_total",
        "Batches delivered to this consumer (payload arrived).",
        |_, g| g.consumer.as_ref().map(|f| f.batches_received.into()),
    ),
    counter(
        "evb_consumer_events_received_total",
        "Events in the batches delivered to this consumer.",
        |_, g| g.consumer.as_ref().map(|f| f.events_received.into()),
    ),
    counter(
        "evb_consumer_received_bytes_total",
        "Bytes of the batches delivered to this consumer.",
        |_, g| g.consumer.as_ref().map(|f| f.bytes_received.into()),
    ),
    counter(
        "evb_consumer_batches_consumed_total",
        "Batches this consumer finished working on.",
        |r, g| consumer(g, r.batches_consumed),
    ),
    counter(
        "evb_consumer_events_consumed_total",
        "Events in the batches this consumer finished.",
        |r, g| consumer(g, r.events_consumed),
    ),
    counter(
        "evb_consumer_events_accepted_total",
        "Events of the finished batches this consumer's trigger accepted.",
        |r, g| consumer(g, r.events_accepted),
    ),
    counter(
        "evb_consumer_consumed_bytes_total",
        "Bytes of the batches this consumer finished.",
        |r, g| consumer(g, r.bytes_consumed),
    ),
    counter(
        "evb_consumer_batches_corrupt_total",
        "Delivered batches that failed verification (CRC or fragment table).",
        |r, g| consumer(g, r.batches_consumed_corrupt),
    ),
    counter(
        "evb_consumer_deliveries_unexpected_total",
        "Deliveries beyond the credit granted, or from a non-BU: dropped.",
        |r, g| consumer(g, r.deliveries_unexpected),
    ),
    counter(
        "evb_consumer_busy_seconds_total",
        "Time this consumer spent working on batches.",
        |r, g| consumer(g, r.busy_s),
    ),
    gauge(
        "evb_consumer_busy",
        "1 while this consumer works on a batch, else 0.",
        |_, g| g.consumer.as_ref().map(|f| f.busy.into()),
    ),
    gauge(
        "evb_consumer_queued_batches",
        "Batches waiting at this consumer behind the one it works on.",
        |_, g| g.consumer.as_ref().map(|f| f.queued.into()),
    ),
    MetricDef {
        name: "evb_bu_consumer_credits",
        kind: MetricType::Gauge,
        help: "Consumer credits this BU holds, per consumer (FU endpoint).",
        read: Read::PerLabel {
            label: "consumer",
            read: |_, g| {
                g.bu_output
                    .as_ref()
                    .map_or_else(Vec::new, |o| per_endpoint(&o.credits_held))
            },
        },
    },
    MetricDef {
        name: "evb_consumer_credits_outstanding",
        kind: MetricType::Gauge,
        help: "Credits this consumer granted a BU (endpoint) and the BU has not used yet.",
        read: Read::PerLabel {
            label: "bu",
            read: |_, g| {
                g.consumer
                    .as_ref()
                    .map_or_else(Vec::new, |f| per_endpoint(&f.credits_outstanding))
            },
        },
    },
    MetricDef {
        name: "evb_batches_missing_source_total",
        kind: MetricType::Counter,
        help: "Incomplete batches each source was missing from.",
        read: Read::PerLabel {
            label: "source",
            read: |r, _| {
                (0u64..)
                    .zip(&r.missing_by_source)
                    .map(|(source, &n)| (source, n.into()))
                    .collect()
            },
        },
    },
    MetricDef {
        name: "evb_batch_latency_seconds",
        kind: MetricType::Histogram,
        help: "Batch building latency (first sign of a batch to completion).",
        read: Read::LatencyNs(|r| &r.latency_buckets),
    },
];
