//! `evb-metrics`: the Prometheus metrics of one node, `GET /metrics`.
//!
//! The metrics are a table (`METRICS`: name, kind, help, which nodes
//! serve it, how its value is read from the node report and the live
//! gauges), plus the labelled families (consumer credits per consumer and
//! per BU, incomplete batches per source) and the latency histogram. The
//! exposition (OpenMetrics text) is prometheus-client's: a collector
//! encodes a snapshot of the report. The names are those of
//! `docs/metrics.md` (a test holds them in step).
//!
//! The loop renders a fresh text every stats interval and hands it to a
//! small thread that answers the scrapes, so that a slow scraper never
//! stalls the event loop (prometheus-client has no HTTP server of its own;
//! the one here reads a request head and answers with the latest text).
//!
//! A crate of its own because it is the node's one outside interface
//! besides its report: it reads the node report (`evb-control`) and the
//! state machines' gauges (`evb-core`), and nothing of the event loop.

use std::borrow::Cow;
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use evb_core::{Layout, Node, NodeId};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{text, DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use evb_control::report::NodeReport;

/// The latest metrics text, shared with the server thread.
#[derive(Clone, Default)]
pub struct MetricsText(Arc<Mutex<String>>);

impl MetricsText {
    pub fn set(&self, text: String) {
        if let Ok(mut t) = self.0.lock() {
            *t = text;
        }
    }

    fn get(&self) -> String {
        self.0.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

/// Binds `bind:port` and serves `/metrics` from a thread.
pub fn serve(bind: &str, port: u16) -> Result<MetricsText> {
    let listener = TcpListener::bind((bind, port)).with_context(|| {
        format!("binding the metrics endpoint to {bind}:{port} (metrics.base_port)")
    })?;
    let text = MetricsText::default();
    let shared = text.clone();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &shared);
            }
        })?;
    Ok(text)
}

/// One HTTP/1.0-style exchange: read the request head, answer, close.
fn answer(mut s: TcpStream, text: &MetricsText) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    // Bounded: a request head larger than 8 KiB is refused.
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(head.split(|&b| b == b'\r').next().unwrap_or(&[]));
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) =
        if method == "GET" && (path == "/metrics" || path.starts_with("/metrics?")) {
            (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text.get(),
            )
        } else {
            (
                "404 Not Found",
                "text/plain",
                "evb serves /metrics\n".to_string(),
            )
        };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Live gauges (and counters) the report does not carry.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    /// MEPs whose data the RU still holds (sending or waiting to send).
    pub ru_meps_held: usize,
    /// Batches the BU has open.
    pub bu_open_batches: usize,
    /// Peers this node is linked to and has not lost.
    pub peers_up: usize,
    /// A BU of a run with consumers: its output stage.
    pub bu_output: Option<BuOutputGauges>,
    /// A Filter Unit consumer.
    pub consumer: Option<ConsumerGauges>,
}

/// The output stage of a BU that delivers to consumers.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BuOutputGauges {
    /// Built batches waiting for a consumer.
    pub queue: usize,
    /// Built batches that found no consumer credit and had to wait.
    pub credit_stalls: u64,
    /// (FU endpoint, consumer credits this BU holds for it).
    pub credits_held: Vec<(NodeId, u32)>,
}

/// A Filter Unit consumer's live state and what it received.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ConsumerGauges {
    pub batches_received: u64,
    pub events_received: u64,
    pub bytes_received: u64,
    /// Working on a batch right now.
    pub busy: bool,
    /// Batches waiting behind the one being worked on.
    pub queued: usize,
    /// (BU endpoint, credits granted to it and not used yet).
    pub credits_outstanding: Vec<(NodeId, u32)>,
}

/// The output-stage gauges of `node`: its BU's (with consumers) and its FU's.
pub fn output_gauges(
    node: &Node,
    layout: &Layout,
) -> (Option<BuOutputGauges>, Option<ConsumerGauges>) {
    let bu = node
        .bu()
        .filter(|b| !b.consumer_credits().is_empty())
        .map(|b| BuOutputGauges {
            queue: b.output_waiting(),
            credit_stalls: b.stats.consumer_credit_stalls,
            credits_held: layout
                .fu_nodes
                .iter()
                .copied()
                .zip(b.consumer_credits().iter().copied())
                .collect(),
        });
    let fu = node.fu().map(|f| ConsumerGauges {
        batches_received: f.stats.batches_received,
        events_received: f.stats.events_received,
        bytes_received: f.stats.bytes_received,
        busy: f.is_busy(),
        queued: f.queued(),
        credits_outstanding: layout
            .bu_nodes
            .iter()
            .copied()
            .zip(f.credits_outstanding().iter().copied())
            .collect(),
    });
    (bu, fu)
}

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Only goes up; its name ends in `_total`.
    Counter,
    Gauge,
}

/// Which nodes serve a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    Always,
    /// A BU of a run with consumers (its output stage).
    BuOutput,
    /// A Filter Unit consumer.
    Consumer,
}

/// A metric's value: a count (written as an integer) or a real number.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Int(u64),
    Float(f64),
}

fn int(v: u64) -> Value {
    Value::Int(v)
}

/// What a metric reads its value from.
struct Sample<'a> {
    r: &'a NodeReport,
    g: &'a Gauges,
    /// The BU's output stage and the consumer's state (empty where the
    /// node has none: such metrics are not served there).
    bu: &'a BuOutputGauges,
    fu: &'a ConsumerGauges,
}

/// One metric: its name (as in docs/metrics.md), kind, help text, where it
/// is served and how its value is read.
struct Metric {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    served: Served,
    read: fn(&Sample) -> Value,
}

/// Every metric of one value per node, in the order they are served. The
/// labelled ones (per consumer, per BU, per source) and the latency
/// histogram follow them ([`Snapshot`]).
const METRICS: &[Metric] = &[
    Metric {
        name: "evb_meps_assigned_total",
        kind: Kind::Counter,
        help: "MEPs the Event Manager assigned (EM node only).",
        served: Served::Always,
        read: |s| int(s.r.meps_assigned),
    },
    Metric {
        name: "evb_meps_produced_total",
        kind: Kind::Counter,
        help: "MEPs this Readout Unit produced.",
        served: Served::Always,
        read: |s| int(s.r.meps_produced),
    },
    Metric {
        name: "evb_fragments_sent_total",
        kind: Kind::Counter,
        help: "Fragments this RU shipped, local hand-overs included.",
        served: Served::Always,
        read: |s| int(s.r.fragments_sent),
    },
    Metric {
        name: "evb_sent_bytes_total",
        kind: Kind::Counter,
        help: "Fragment payload bytes this RU shipped.",
        served: Served::Always,
        read: |s| int(s.r.bytes_sent),
    },
    Metric {
        name: "evb_fragments_received_total",
        kind: Kind::Counter,
        help: "Fragments this Builder Unit accepted.",
        served: Served::Always,
        read: |s| int(s.r.fragments_received),
    },
    Metric {
        name: "evb_received_bytes_total",
        kind: Kind::Counter,
        help: "Fragment payload bytes this BU accepted.",
        served: Served::Always,
        read: |s| int(s.r.bytes_received),
    },
    Metric {
        name: "evb_batches_built_total",
        kind: Kind::Counter,
        help: "Batches (MEPs) built complete and verified.",
        served: Served::Always,
        read: |s| int(s.r.batches_built),
    },
    Metric {
        name: "evb_events_built_total",
        kind: Kind::Counter,
        help: "Events built complete and verified.",
        served: Served::Always,
        read: |s| int(s.r.events_built),
    },
    Metric {
        name: "evb_built_bytes_total",
        kind: Kind::Counter,
        help: "Payload bytes of built events.",
        served: Served::Always,
        read: |s| int(s.r.bytes_built),
    },
    Metric {
        name: "evb_batches_incomplete_total",
        kind: Kind::Counter,
        help: "Batches that timed out with fragments missing.",
        served: Served::Always,
        read: |s| int(s.r.batches_incomplete),
    },
    Metric {
        name: "evb_events_incomplete_total",
        kind: Kind::Counter,
        help: "Events in incomplete batches.",
        served: Served::Always,
        read: |s| int(s.r.events_incomplete),
    },
    Metric {
        name: "evb_batches_corrupt_total",
        kind: Kind::Counter,
        help: "Batches discarded because a fragment failed verification.",
        served: Served::Always,
        read: |s| int(s.r.batches_corrupt),
    },
    Metric {
        name: "evb_events_corrupt_total",
        kind: Kind::Counter,
        help: "Events in corrupt batches.",
        served: Served::Always,
        read: |s| int(s.r.events_corrupt),
    },
    Metric {
        name: "evb_fragments_corrupt_total",
        kind: Kind::Counter,
        help: "Fragments that failed verification.",
        served: Served::Always,
        read: |s| int(s.r.fragments_corrupt),
    },
    Metric {
        name: "evb_fragments_duplicate_total",
        kind: Kind::Counter,
        help: "Fragments received twice.",
        served: Served::Always,
        read: |s| int(s.r.fragments_duplicate),
    },
    Metric {
        name: "evb_fragments_unexpected_total",
        kind: Kind::Counter,
        help: "Fragments for no open batch.",
        served: Served::Always,
        read: |s| int(s.r.fragments_unexpected),
    },
    Metric {
        name: "evb_control_rejected_total",
        kind: Kind::Counter,
        help: "Control messages from endpoints not entitled to send them.",
        served: Served::Always,
        read: |s| int(s.r.control_rejected),
    },
    Metric {
        name: "evb_em_credit_stalls_total",
        kind: Kind::Counter,
        help: "Times the EM had a MEP to assign and no BU had credit (EM node only).",
        served: Served::Always,
        read: |s| int(s.r.em_credit_stalls),
    },
    Metric {
        name: "evb_em_meps_lost_bu_gone_total",
        kind: Kind::Counter,
        help: "MEPs lost with their Builder Unit (EM node only).",
        served: Served::Always,
        read: |s| int(s.r.em_meps_lost_bu_gone),
    },
    Metric {
        name: "evb_em_meps_reassigned_total",
        kind: Kind::Counter,
        help: "MEPs of a lost Builder Unit re-assigned to another because the RUs still held them (EM node only).",
        served: Served::Always,
        read: |s| int(s.r.em_meps_reassigned),
    },
    Metric {
        name: "evb_em_meps_vetoed_total",
        kind: Kind::Counter,
        help: "Paced readout: MEPs vetoed at the source while the readout was throttled (EM node only).",
        served: Served::Always,
        read: |s| int(s.r.em_meps_vetoed),
    },
    Metric {
        name: "evb_em_throttled_seconds_total",
        kind: Kind::Counter,
        help: "Paced readout: time the readout was throttled because the RU buffers were full (EM node only).",
        served: Served::Always,
        read: |s| Value::Float(s.r.em_throttled_s),
    },
    Metric {
        name: "evb_em_throttle_episodes_total",
        kind: Kind::Counter,
        help: "Paced readout: times the throttle came on (EM node only).",
        served: Served::Always,
        read: |s| int(s.r.em_throttle_episodes),
    },
    Metric {
        name: "evb_ru_meps_held_max",
        kind: Kind::Gauge,
        help: "Most assigned MEPs this RU held at once (its buffer occupancy).",
        served: Served::Always,
        read: |s| int(s.r.max_meps_held),
    },
    Metric {
        name: "evb_peers_lost",
        kind: Kind::Gauge,
        help: "Peers this node declared lost.",
        served: Served::Always,
        read: |s| int(s.r.peers_lost.len() as u64),
    },
    Metric {
        name: "evb_peers_up",
        kind: Kind::Gauge,
        help: "Peers this node is linked to and has not lost.",
        served: Served::Always,
        read: |s| int(s.g.peers_up as u64),
    },
    Metric {
        name: "evb_ru_meps_held",
        kind: Kind::Gauge,
        help: "MEPs whose data the RU still holds (in flight or queued).",
        served: Served::Always,
        read: |s| int(s.g.ru_meps_held as u64),
    },
    Metric {
        name: "evb_ru_max_in_flight",
        kind: Kind::Gauge,
        help: "Most transfers the RU had in flight at once.",
        served: Served::Always,
        read: |s| int(u64::from(s.r.max_in_flight)),
    },
    Metric {
        name: "evb_bu_open_batches",
        kind: Kind::Gauge,
        help: "Batches the BU has open (credits in use).",
        served: Served::Always,
        read: |s| int(s.g.bu_open_batches as u64),
    },
    Metric {
        name: "evb_resident_bytes",
        kind: Kind::Gauge,
        help: "Resident memory of the node process.",
        served: Served::Always,
        read: |s| int(s.r.rss_bytes),
    },
    Metric {
        name: "evb_cpu_user_seconds_total",
        kind: Kind::Counter,
        help: "User CPU time of the node process (all threads).",
        served: Served::Always,
        read: |s| Value::Float(s.r.cpu_user_s),
    },
    Metric {
        name: "evb_cpu_system_seconds_total",
        kind: Kind::Counter,
        help: "System CPU time of the node process (all threads).",
        served: Served::Always,
        read: |s| Value::Float(s.r.cpu_system_s),
    },
    Metric {
        name: "evb_cpu_user_seconds_per_gb_built",
        kind: Kind::Gauge,
        help: "User CPU seconds per GB (1e9 bytes) this node built, since its start (0 before it built anything).",
        served: Served::Always,
        read: |s| Value::Float(s.r.cpu_user_s_per_gb),
    },
    Metric {
        name: "evb_cpu_system_seconds_per_gb_built",
        kind: Kind::Gauge,
        help: "System CPU seconds per GB (1e9 bytes) this node built, since its start (0 before it built anything).",
        served: Served::Always,
        read: |s| Value::Float(s.r.cpu_system_s_per_gb),
    },
    Metric {
        name: "evb_store_objects_total",
        kind: Kind::Counter,
        help: "Objects this node wrote to the event store.",
        served: Served::Always,
        read: |s| int(s.r.store_objects),
    },
    Metric {
        name: "evb_store_events_total",
        kind: Kind::Counter,
        help: "Events in the objects this node wrote to the event store.",
        served: Served::Always,
        read: |s| int(s.r.store_events),
    },
    Metric {
        name: "evb_store_bytes_total",
        kind: Kind::Counter,
        help: "Bytes this node wrote to the event store.",
        served: Served::Always,
        read: |s| int(s.r.store_bytes),
    },
    Metric {
        name: "evb_elapsed_seconds",
        kind: Kind::Gauge,
        help: "Seconds since the node started its run.",
        served: Served::Always,
        read: |s| Value::Float(s.r.elapsed_s),
    },
    Metric {
        name: "evb_bu_batches_delivered_total",
        kind: Kind::Counter,
        help: "Built batches this BU handed to consumers.",
        served: Served::BuOutput,
        read: |s| int(s.r.batches_delivered),
    },
    Metric {
        name: "evb_bu_batches_delivered_partial_total",
        kind: Kind::Counter,
        help: "Incomplete batches this BU delivered anyway, flagged partial.",
        served: Served::BuOutput,
        read: |s| int(s.r.batches_delivered_partial),
    },
    Metric {
        name: "evb_bu_delivered_bytes_total",
        kind: Kind::Counter,
        help: "Bytes of the batches this BU handed to consumers (fragment table included).",
        served: Served::BuOutput,
        read: |s| int(s.r.bytes_delivered),
    },
    Metric {
        name: "evb_bu_batches_redelivered_total",
        kind: Kind::Counter,
        help: "Deliveries made again because their consumer died before confirming them.",
        served: Served::BuOutput,
        read: |s| int(s.r.batches_redelivered),
    },
    Metric {
        name: "evb_bu_batches_undelivered_total",
        kind: Kind::Counter,
        help: "Built batches no consumer could take (all gone, or the drain ended).",
        served: Served::BuOutput,
        read: |s| int(s.r.batches_undelivered),
    },
    Metric {
        name: "evb_bu_output_queue_batches",
        kind: Kind::Gauge,
        help: "Built batches waiting for a consumer.",
        served: Served::BuOutput,
        read: |s| int(s.bu.queue as u64),
    },
    Metric {
        name: "evb_bu_output_queue_max",
        kind: Kind::Gauge,
        help: "Longest the output queue has been.",
        served: Served::BuOutput,
        read: |s| int(u64::from(s.r.max_output_queue)),
    },
    Metric {
        name: "evb_bu_output_full_seconds_total",
        kind: Kind::Counter,
        help: "Time the output queue was full (EM credits held back).",
        served: Served::BuOutput,
        read: |s| Value::Float(s.r.output_full_s),
    },
    Metric {
        name: "evb_bu_consumer_credit_stalls_total",
        kind: Kind::Counter,
        help: "Built batches that found no consumer credit and had to wait.",
        served: Served::BuOutput,
        read: |s| int(s.bu.credit_stalls),
    },
    Metric {
        name: "evb_consumer_batches_received_total",
        kind: Kind::Counter,
        help: "Batches delivered to this consumer (payload arrived).",
        served: Served::Consumer,
        read: |s| int(s.fu.batches_received),
    },
    Metric {
        name: "evb_consumer_events_received_total",
        kind: Kind::Counter,
        help: "Events in the batches delivered to this consumer.",
        served: Served::Consumer,
        read: |s| int(s.fu.events_received),
    },
    Metric {
        name: "evb_consumer_received_bytes_total",
        kind: Kind::Counter,
        help: "Bytes of the batches delivered to this consumer.",
        served: Served::Consumer,
        read: |s| int(s.fu.bytes_received),
    },
    Metric {
        name: "evb_consumer_batches_consumed_total",
        kind: Kind::Counter,
        help: "Batches this consumer finished working on.",
        served: Served::Consumer,
        read: |s| int(s.r.batches_consumed),
    },
    Metric {
        name: "evb_consumer_events_consumed_total",
        kind: Kind::Counter,
        help: "Events in the batches this consumer finished.",
        served: Served::Consumer,
        read: |s| int(s.r.events_consumed),
    },
    Metric {
        name: "evb_consumer_events_accepted_total",
        kind: Kind::Counter,
        help: "Events of the finished batches this consumer's trigger accepted.",
        served: Served::Consumer,
        read: |s| int(s.r.events_accepted),
    },
    Metric {
        name: "evb_consumer_consumed_bytes_total",
        kind: Kind::Counter,
        help: "Bytes of the batches this consumer finished.",
        served: Served::Consumer,
        read: |s| int(s.r.bytes_consumed),
    },
    Metric {
        name: "evb_consumer_batches_corrupt_total",
        kind: Kind::Counter,
        help: "Delivered batches that failed verification (CRC or fragment table).",
        served: Served::Consumer,
        read: |s| int(s.r.batches_consumed_corrupt),
    },
    Metric {
        name: "evb_consumer_deliveries_unexpected_total",
        kind: Kind::Counter,
        help: "Deliveries beyond the credit granted, or from a non-BU: dropped.",
        served: Served::Consumer,
        read: |s| int(s.r.deliveries_unexpected),
    },
    Metric {
        name: "evb_consumer_busy_seconds_total",
        kind: Kind::Counter,
        help: "Time this consumer spent working on batches.",
        served: Served::Consumer,
        read: |s| Value::Float(s.r.busy_s),
    },
    Metric {
        name: "evb_consumer_busy",
        kind: Kind::Gauge,
        help: "1 while this consumer works on a batch, else 0.",
        served: Served::Consumer,
        read: |s| int(u64::from(s.fu.busy)),
    },
    Metric {
        name: "evb_consumer_queued_batches",
        kind: Kind::Gauge,
        help: "Batches waiting at this consumer behind the one it works on.",
        served: Served::Consumer,
        read: |s| int(s.fu.queued as u64),
    },
];

/// Upper bounds of the latency histogram buckets, seconds.
const LATENCY_BOUNDS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

static NO_BU: BuOutputGauges = BuOutputGauges {
    queue: 0,
    credit_stalls: 0,
    credits_held: Vec::new(),
};
static NO_FU: ConsumerGauges = ConsumerGauges {
    batches_received: 0,
    events_received: 0,
    bytes_received: 0,
    busy: false,
    queued: 0,
    credits_outstanding: Vec::new(),
};

/// One node's report and gauges at one instant, as prometheus-client
/// collects them.
#[derive(Debug)]
struct Snapshot {
    r: NodeReport,
    g: Gauges,
}

impl Snapshot {
    fn sample(&self) -> Sample<'_> {
        Sample {
            r: &self.r,
            g: &self.g,
            bu: self.g.bu_output.as_ref().unwrap_or(&NO_BU),
            fu: self.g.consumer.as_ref().unwrap_or(&NO_FU),
        }
    }

    fn serves(&self, served: Served) -> bool {
        match served {
            Served::Always => true,
            Served::BuOutput => self.g.bu_output.is_some(),
            Served::Consumer => self.g.consumer.is_some(),
        }
    }
}

/// A metric family of gauges, one series per `(label value, value)`.
fn gauge_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    series: &[(NodeId, u32)],
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (key, value) in series {
        let labels = [(label, key.to_string())];
        family
            .encode_family(&labels)?
            .encode_gauge(&i64::from(*value))?;
    }
    Ok(())
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let s = self.sample();
        for m in METRICS.iter().filter(|m| self.serves(m.served)) {
            match m.kind {
                Kind::Counter => {
                    // prometheus-client writes the `_total` itself.
                    let base = m.name.strip_suffix("_total").unwrap_or(m.name);
                    let mut e =
                        encoder.encode_descriptor(base, m.help, None, MetricType::Counter)?;
                    match (m.read)(&s) {
                        Value::Int(v) => e.encode_counter::<NoLabelSet, _, u64>(&v, None)?,
                        Value::Float(v) => e.encode_counter::<NoLabelSet, _, f64>(&v, None)?,
                    }
                }
                Kind::Gauge => {
                    let mut e =
                        encoder.encode_descriptor(m.name, m.help, None, MetricType::Gauge)?;
                    match (m.read)(&s) {
                        Value::Int(v) => e.encode_gauge(&i64::try_from(v).unwrap_or(i64::MAX))?,
                        Value::Float(v) => e.encode_gauge(&v)?,
                    }
                }
            }
        }
        if let Some(o) = &self.g.bu_output {
            gauge_family(
                &mut encoder,
                "evb_bu_consumer_credits",
                "Consumer credits this BU holds, per consumer (FU endpoint).",
                "consumer",
                &o.credits_held,
            )?;
        }
        if let Some(f) = &self.g.consumer {
            gauge_family(
                &mut encoder,
                "evb_consumer_credits_outstanding",
                "Credits this consumer granted a BU (endpoint) and the BU has not used yet.",
                "bu",
                &f.credits_outstanding,
            )?;
        }
        if !self.r.missing_by_source.is_empty() {
            let mut family = encoder.encode_descriptor(
                "evb_batches_missing_source",
                "Incomplete batches each source was missing from.",
                None,
                MetricType::Counter,
            )?;
            for (source, n) in self.r.missing_by_source.iter().enumerate() {
                let labels = [("source", source.to_string())];
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(n, None)?;
            }
        }
        // Batch building latency: the report's buckets (ns, count) put
        // into the histogram's (upper bound s, count), +Inf last.
        let mut buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_S.iter().map(|&le| (le, 0)).collect();
        buckets.push((f64::MAX, 0));
        let (mut sum_s, mut count) = (0.0, 0u64);
        for &(ns, n) in &self.r.latency_buckets {
            let s = ns as f64 * 1e-9;
            sum_s += s * n as f64;
            count += n;
            let i = LATENCY_BOUNDS_S
                .iter()
                .position(|&le| s <= le)
                .unwrap_or(LATENCY_BOUNDS_S.len());
            buckets[i].1 += n;
        }
        encoder
            .encode_descriptor(
                "evb_batch_latency_seconds",
                "Batch building latency (first sign of a batch to completion).",
                None,
                MetricType::Histogram,
            )?
            .encode_histogram::<NoLabelSet>(sum_s, count, &buckets, None)
    }
}

/// The exposition (OpenMetrics text) of one node's metrics; every series
/// carries the labels `node` and `role`.
pub fn render(r: &NodeReport, g: &Gauges) -> String {
    let mut registry = Registry::with_labels(
        [
            (Cow::Borrowed("node"), Cow::Owned(r.node.to_string())),
            (Cow::Borrowed("role"), Cow::Owned(r.role.clone())),
        ]
        .into_iter(),
    );
    registry.register_collector(Box::new(Snapshot {
        r: r.clone(),
        g: g.clone(),
    }));
    let mut out = String::with_capacity(8192);
    text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_counts_match() {
        let r = NodeReport {
            node: 3,
            role: "RU+BU".into(),
            latency_buckets: vec![(50_000, 2), (2_000_000, 5), (3_000_000_000, 1)],
            events_built: 42,
            ..Default::default()
        };
        let text = render(&r, &Gauges::default());
        assert!(text.contains("evb_events_built_total{node=\"3\",role=\"RU+BU\"} 42"));
        assert!(text.contains(
            "evb_batch_latency_seconds_bucket{node=\"3\",role=\"RU+BU\",le=\"0.0001\"} 2"
        ));
        assert!(text.contains("le=\"0.0025\"} 7"));
        assert!(text.contains("le=\"2.5\"} 7"));
        assert!(text.contains("le=\"+Inf\"} 8"));
        assert!(text.contains("evb_batch_latency_seconds_count{node=\"3\",role=\"RU+BU\"} 8"));
        // No consumer series on a node without consumers.
        assert!(!text.contains("evb_consumer_") && !text.contains("evb_bu_consumer"));
    }

    #[test]
    fn the_table_names_each_metric_once_and_docs_metrics_md_lists_it() {
        let docs = include_str!("../../../docs/metrics.md");
        let mut seen = std::collections::HashSet::new();
        for m in METRICS {
            assert!(seen.insert(m.name), "{} twice", m.name);
            assert!(m.name.starts_with("evb_"), "{}", m.name);
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}: counters, and only they, end in _total",
                m.name
            );
            assert!(
                docs.contains(m.name),
                "{} is not in docs/metrics.md",
                m.name
            );
            assert!(m.help.ends_with('.'), "{}: {}", m.name, m.help);
        }
        // Every name is served with its value, once, on a node that has
        // every part (a BU with consumers that is a consumer too).
        let text = render(
            &NodeReport::default(),
            &Gauges {
                bu_output: Some(BuOutputGauges::default()),
                consumer: Some(ConsumerGauges::default()),
                ..Default::default()
            },
        );
        for m in METRICS {
            let series = format!("\n{}{{node=\"0\",role=\"\"}} ", m.name);
            assert_eq!(text.matches(&series).count(), 1, "{series} in\n{text}");
        }
        assert!(
            text.ends_with("# EOF\n"),
            "OpenMetrics text ends with # EOF"
        );
    }

    #[test]
    fn consumer_and_producer_series() {
        let r = NodeReport {
            node: 5,
            role: "FU".into(),
            batches_consumed: 7,
            busy_s: 1.5,
            ..Default::default()
        };
        let g = Gauges {
            consumer: Some(ConsumerGauges {
                batches_received: 9,
                busy: true,
                credits_outstanding: vec![(0, 2), (1, 0)],
                ..Default::default()
            }),
            bu_output: Some(BuOutputGauges {
                queue: 3,
                credit_stalls: 4,
                credits_held: vec![(4, 1), (5, 2)],
            }),
            ..Default::default()
        };
        let text = render(&r, &g);
        let l = "node=\"5\",role=\"FU\"";
        for line in [
            format!("evb_consumer_batches_received_total{{{l}}} 9"),
            format!("evb_consumer_batches_consumed_total{{{l}}} 7"),
            format!("evb_consumer_busy_seconds_total{{{l}}} 1.5"),
            format!("evb_consumer_busy{{{l}}} 1"),
            format!("evb_consumer_credits_outstanding{{{l},bu=\"0\"}} 2"),
            format!("evb_consumer_credits_outstanding{{{l},bu=\"1\"}} 0"),
            format!("evb_bu_output_queue_batches{{{l}}} 3"),
            format!("evb_bu_consumer_credit_stalls_total{{{l}}} 4"),
            format!("evb_bu_consumer_credits{{{l},consumer=\"5\"}} 2"),
        ] {
            assert!(
                text.contains(&format!("\n{line}\n")),
                "missing `{line}` in\n{text}"
            );
        }
    }
}
