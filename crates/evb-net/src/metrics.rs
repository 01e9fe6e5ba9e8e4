//! Prometheus metrics of one node: `GET /metrics` in the text exposition
//! format, served by a small thread so that a slow scraper never stalls the
//! event loop. The loop renders a fresh text every stats interval and hands
//! it over; the server only copies it out.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::report::NodeReport;

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

/// Live gauges the report does not carry.
#[derive(Debug, Default, Clone, Copy)]
pub struct Gauges {
    /// MEPs whose data the RU still holds (sending or waiting to send).
    pub ru_meps_held: usize,
    /// Batches the BU has open.
    pub bu_open_batches: usize,
    /// Peers this node is linked to and has not lost.
    pub peers_up: usize,
}

/// The text exposition of one node's counters.
pub fn render(r: &NodeReport, g: Gauges) -> String {
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
        "evb_em_meps_lost_bu_gone_total",
        "counter",
        "MEPs lost with their Builder Unit (EM node only).",
        c(r.em_meps_lost_bu_gone),
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
        "evb_elapsed_seconds",
        "gauge",
        "Seconds since the node started its run.",
        r.elapsed_s,
    );
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
        let text = render(&r, Gauges::default());
        assert!(text.contains("evb_events_built_total{node=\"3\",role=\"RU+BU\"} 42"));
        assert!(text.contains(
            "evb_batch_latency_seconds_bucket{node=\"3\",role=\"RU+BU\",le=\"0.0001\"} 2"
        ));
        assert!(text.contains("le=\"0.0025\"} 7"));
        assert!(text.contains("le=\"2.5\"} 7"));
        assert!(text.contains("le=\"+Inf\"} 8"));
        assert!(text.contains("evb_batch_latency_seconds_count{node=\"3\",role=\"RU+BU\"} 8"));
    }
}
