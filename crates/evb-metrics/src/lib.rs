//! `evb-metrics`: the Prometheus metrics of one node: `GET /metrics` in
//! the text exposition format, served by a small thread so that a slow
//! scraper never stalls the event loop. The loop renders a fresh text every
//! stats interval and hands it over; the server only copies it out. The
//! names are documented in `docs/metrics.md`.
//!
//! A crate of its own because it is the node's one outside interface
//! besides its report: it reads the node report (`evb-control`) and the
//! state machines' gauges (`evb-core`), and nothing of the event loop.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use evb_core::{Layout, Node, NodeId};

use evb_control::report::NodeReport;

/// Upper bounds of the latency histogram buckets, seconds.
const LATENCY_BOUNDS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

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
                "text/plain; version=0.0.4; charset=utf-8",
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

/// The text exposition of one node's counters.
pub fn render(r: &NodeReport, g: &Gauges) -> String {
    let mut out = String::with_capacity(4096);
    let node = r.node;
    let role = &r.role;
    let labels = format!("node=\"{node}\",role=\"{role}\"");
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
        );
    };
    let c = |v: u64| v as f64;
    metric(
        "evb_meps_assigned_total",
        "counter",
        "MEPs the Event Manager assigned (EM node only).",
        c(r.meps_assigned),
    );
    metric(
        "evb_meps_produced_total",
        "counter",
        "MEPs this Readout Unit produced.",
        c(r.meps_produced),
    );
    metric(
        "evb_fragments_sent_total",
        "counter",
        "Fragments this RU shipped, local hand-overs included.",
        c(r.fragments_sent),
    );
    metric(
        "evb_sent_bytes_total",
        "counter",
        "Fragment payload bytes this RU shipped.",
        c(r.bytes_sent),
    );
    metric(
        "evb_fragments_received_total",
        "counter",
        "Fragments this Builder Unit accepted.",
        c(r.fragments_received),
    );
    metric(
        "evb_received_bytes_total",
        "counter",
        "Fragment payload bytes this BU accepted.",
        c(r.bytes_received),
    );
    metric(
        "evb_batches_built_total",
        "counter",
        "Batches (MEPs) built complete and verified.",
        c(r.batches_built),
    );
    metric(
        "evb_events_built_total",
        "counter",
        "Events built complete and verified.",
        c(r.events_built),
    );
    metric(
        "evb_built_bytes_total",
        "counter",
        "Payload bytes of built events.",
        c(r.bytes_built),
    );
    metric(
        "evb_batches_incomplete_total",
        "counter",
        "Batches that timed out with fragments missing.",
        c(r.batches_incomplete),
    );
    metric(
        "evb_events_incomplete_total",
        "counter",
        "Events in incomplete batches.",
        c(r.events_incomplete),
    );
    metric(
        "evb_batches_corrupt_total",
        "counter",
        "Batches discarded because a fragment failed verification.",
        c(r.batches_corrupt),
    );
    metric(
        "evb_events_corrupt_total",
        "counter",
        "Events in corrupt batches.",
        c(r.events_corrupt),
    );
    metric(
        "evb_fragments_corrupt_total",
        "counter",
        "Fragments that failed verification.",
        c(r.fragments_corrupt),
    );
    metric(
        "evb_fragments_duplicate_total",
        "counter",
        "Fragments received twice.",
        c(r.fragments_duplicate),
    );
    metric(
        "evb_fragments_unexpected_total",
        "counter",
        "Fragments for no open batch.",
        c(r.fragments_unexpected),
    );
    metric(
        "evb_control_rejected_total",
        "counter",
        "Control messages from endpoints not entitled to send them.",
        c(r.control_rejected),
    );
    metric(
        "evb_em_credit_stalls_total",
        "counter",
        "Times the EM had a MEP to assign and no BU had credit (EM node only).",
        c(r.em_credit_stalls),
    );
    metric(
        "evb_em_meps_lost_bu_gone_total",
        "counter",
        "MEPs lost with their Builder Unit (EM node only).",
        c(r.em_meps_lost_bu_gone),
    );
    metric(
        "evb_em_meps_reassigned_total",
        "counter",
        "MEPs of a lost Builder Unit re-assigned to another because the RUs still held them (EM node only).",
        c(r.em_meps_reassigned),
    );
    metric(
        "evb_em_meps_vetoed_total",
        "counter",
        "Paced readout: MEPs vetoed at the source while the readout was throttled (EM node only).",
        c(r.em_meps_vetoed),
    );
    metric(
        "evb_em_throttled_seconds_total",
        "counter",
        "Paced readout: time the readout was throttled because the RU buffers were full (EM node only).",
        r.em_throttled_s,
    );
    metric(
        "evb_em_throttle_episodes_total",
        "counter",
        "Paced readout: times the throttle came on (EM node only).",
        c(r.em_throttle_episodes),
    );
    metric(
        "evb_ru_meps_held_max",
        "gauge",
        "Most assigned MEPs this RU held at once (its buffer occupancy).",
        c(r.max_meps_held),
    );
    metric(
        "evb_peers_lost",
        "gauge",
        "Peers this node declared lost.",
        r.peers_lost.len() as f64,
    );
    metric(
        "evb_peers_up",
        "gauge",
        "Peers this node is linked to and has not lost.",
        g.peers_up as f64,
    );
    metric(
        "evb_ru_meps_held",
        "gauge",
        "MEPs whose data the RU still holds (in flight or queued).",
        g.ru_meps_held as f64,
    );
    metric(
        "evb_ru_max_in_flight",
        "gauge",
        "Most transfers the RU had in flight at once.",
        f64::from(r.max_in_flight),
    );
    metric(
        "evb_bu_open_batches",
        "gauge",
        "Batches the BU has open (credits in use).",
        g.bu_open_batches as f64,
    );
    metric(
        "evb_resident_bytes",
        "gauge",
        "Resident memory of the node process.",
        c(r.rss_bytes),
    );
    metric(
        "evb_cpu_user_seconds_total",
        "counter",
        "User CPU time of the node process (all threads).",
        r.cpu_user_s,
    );
    metric(
        "evb_cpu_system_seconds_total",
        "counter",
        "System CPU time of the node process (all threads).",
        r.cpu_system_s,
    );
    metric(
        "evb_cpu_user_seconds_per_gb_built",
        "gauge",
        "User CPU seconds per GB (1e9 bytes) this node built, since its start (0 before it built anything).",
        r.cpu_user_s_per_gb,
    );
    metric(
        "evb_cpu_system_seconds_per_gb_built",
        "gauge",
        "System CPU seconds per GB (1e9 bytes) this node built, since its start (0 before it built anything).",
        r.cpu_system_s_per_gb,
    );
    metric(
        "evb_store_objects_total",
        "counter",
        "Objects this node wrote to the event store.",
        c(r.store_objects),
    );
    metric(
        "evb_store_events_total",
        "counter",
        "Events in the objects this node wrote to the event store.",
        c(r.store_events),
    );
    metric(
        "evb_store_bytes_total",
        "counter",
        "Bytes this node wrote to the event store.",
        c(r.store_bytes),
    );
    metric(
        "evb_elapsed_seconds",
        "gauge",
        "Seconds since the node started its run.",
        r.elapsed_s,
    );
    if let Some(o) = &g.bu_output {
        metric(
            "evb_bu_batches_delivered_total",
            "counter",
            "Built batches this BU handed to consumers.",
            c(r.batches_delivered),
        );
        metric(
            "evb_bu_batches_delivered_partial_total",
            "counter",
            "Incomplete batches this BU delivered anyway, flagged partial.",
            c(r.batches_delivered_partial),
        );
        metric(
            "evb_bu_delivered_bytes_total",
            "counter",
            "Bytes of the batches this BU handed to consumers (fragment table included).",
            c(r.bytes_delivered),
        );
        metric(
            "evb_bu_batches_redelivered_total",
            "counter",
            "Deliveries made again because their consumer died before confirming them.",
            c(r.batches_redelivered),
        );
        metric(
            "evb_bu_batches_undelivered_total",
            "counter",
            "Built batches no consumer could take (all gone, or the drain ended).",
            c(r.batches_undelivered),
        );
        metric(
            "evb_bu_output_queue_batches",
            "gauge",
            "Built batches waiting for a consumer.",
            o.queue as f64,
        );
        metric(
            "evb_bu_output_queue_max",
            "gauge",
            "Longest the output queue has been.",
            f64::from(r.max_output_queue),
        );
        metric(
            "evb_bu_output_full_seconds_total",
            "counter",
            "Time the output queue was full (EM credits held back).",
            r.output_full_s,
        );
        metric(
            "evb_bu_consumer_credit_stalls_total",
            "counter",
            "Built batches that found no consumer credit and had to wait.",
            c(o.credit_stalls),
        );
    }
    if let Some(f) = &g.consumer {
        metric(
            "evb_consumer_batches_received_total",
            "counter",
            "Batches delivered to this consumer (payload arrived).",
            c(f.batches_received),
        );
        metric(
            "evb_consumer_events_received_total",
            "counter",
            "Events in the batches delivered to this consumer.",
            c(f.events_received),
        );
        metric(
            "evb_consumer_received_bytes_total",
            "counter",
            "Bytes of the batches delivered to this consumer.",
            c(f.bytes_received),
        );
        metric(
            "evb_consumer_batches_consumed_total",
            "counter",
            "Batches this consumer finished working on.",
            c(r.batches_consumed),
        );
        metric(
            "evb_consumer_events_consumed_total",
            "counter",
            "Events in the batches this consumer finished.",
            c(r.events_consumed),
        );
        metric(
            "evb_consumer_events_accepted_total",
            "counter",
            "Events of the finished batches this consumer's trigger accepted.",
            c(r.events_accepted),
        );
        metric(
            "evb_consumer_consumed_bytes_total",
            "counter",
            "Bytes of the batches this consumer finished.",
            c(r.bytes_consumed),
        );
        metric(
            "evb_consumer_batches_corrupt_total",
            "counter",
            "Delivered batches that failed verification (CRC or fragment table).",
            c(r.batches_consumed_corrupt),
        );
        metric(
            "evb_consumer_deliveries_unexpected_total",
            "counter",
            "Deliveries beyond the credit granted, or from a non-BU: dropped.",
            c(r.deliveries_unexpected),
        );
        metric(
            "evb_consumer_busy_seconds_total",
            "counter",
            "Time this consumer spent working on batches.",
            r.busy_s,
        );
        metric(
            "evb_consumer_busy",
            "gauge",
            "1 while this consumer works on a batch, else 0.",
            if f.busy { 1.0 } else { 0.0 },
        );
        metric(
            "evb_consumer_queued_batches",
            "gauge",
            "Batches waiting at this consumer behind the one it works on.",
            f.queued as f64,
        );
    }
    if let Some(o) = &g.bu_output {
        let name = "evb_bu_consumer_credits";
        let _ = writeln!(
            out,
            "# HELP {name} Consumer credits this BU holds, per consumer (FU endpoint).\n# TYPE {name} gauge"
        );
        for (fu, n) in &o.credits_held {
            let _ = writeln!(out, "{name}{{{labels},consumer=\"{fu}\"}} {n}");
        }
    }
    if let Some(f) = &g.consumer {
        let name = "evb_consumer_credits_outstanding";
        let _ = writeln!(
            out,
            "# HELP {name} Credits this consumer granted a BU (endpoint) and the BU has not used yet.\n# TYPE {name} gauge"
        );
        for (bu, n) in &f.credits_outstanding {
            let _ = writeln!(out, "{name}{{{labels},bu=\"{bu}\"}} {n}");
        }
    }
    if !r.missing_by_source.is_empty() {
        let _ = writeln!(
            out,
            "# HELP evb_batches_missing_source_total Incomplete batches each source was missing from.\n# TYPE evb_batches_missing_source_total counter"
        );
        for (src, n) in r.missing_by_source.iter().enumerate() {
            let _ = writeln!(
                out,
                "evb_batches_missing_source_total{{{labels},source=\"{src}\"}} {n}"
            );
        }
    }
    // Batch building latency as a Prometheus histogram.
    let name = "evb_batch_latency_seconds";
    let _ = writeln!(out, "# HELP {name} Batch building latency (first sign of a batch to completion).\n# TYPE {name} histogram");
    let mut sum_s = 0.0;
    let mut count = 0u64;
    for &(ns, n) in &r.latency_buckets {
        sum_s += ns as f64 * 1e-9 * n as f64;
        count += n;
    }
    for le in LATENCY_BOUNDS_S {
        let below: u64 = r
            .latency_buckets
            .iter()
            .filter(|(ns, _)| *ns as f64 * 1e-9 <= le)
            .map(|(_, n)| n)
            .sum();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {below}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum_s}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
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
