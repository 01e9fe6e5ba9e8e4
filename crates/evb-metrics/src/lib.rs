//! `evb-metrics`: the Prometheus metrics of one node, `GET /metrics` in
//! the Prometheus text format (version 0.0.4). The names are documented in
//! `docs/metrics.md`.
//!
//! The metrics are a table of definitions ([`table`]: name, type, help,
//! how the value is read from the node report and the gauges), walked by
//! one `prometheus-client` collector registered once in a `Registry`; that
//! crate's text encoder writes the exposition (names, label escaping,
//! histogram buckets, number formats). The event loop only publishes its
//! latest report every stats interval ([`Metrics::update`]); the endpoint's
//! own thread ([`http`]) encodes it when a scraper asks, so a slow scraper
//! never stalls the node.
//!
//! A crate of its own because it is the node's one outside interface
//! besides its report: it reads the node report (`evb-control`) and the
//! state machines' gauges (`evb-core`), and nothing of the event loop.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use evb_core::{Layout, Node, NodeId};

use evb_control::report::NodeReport;

mod http;
mod table;

use table::{MetricDef, Num, Read, LATENCY_BOUNDS_S, METRICS};

/// A node's metrics: the registry its endpoint encodes, and the latest
/// report the event loop published to it. Clones share both.
#[derive(Clone)]
pub struct Metrics {
    latest: Latest,
    registry: Arc<Registry>,
}

/// The latest published report and gauges, swapped whole so that neither
/// side holds the lock for longer than a pointer copy.
type Latest = Arc<Mutex<Option<Arc<Snapshot>>>>;

#[derive(Debug)]
struct Snapshot {
    report: NodeReport,
    gauges: Gauges,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The registry with the node's collector, and nothing published yet
    /// (an empty exposition).
    pub fn new() -> Self {
        let latest = Latest::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(NodeCollector {
            latest: latest.clone(),
        }));
        Metrics {
            latest,
            registry: Arc::new(registry),
        }
    }

    /// Publishes the node's latest report and gauges (the event loop, every
    /// stats interval).
    pub fn update(&self, report: &NodeReport, gauges: &Gauges) {
        let mut report = report.clone();
        // Not metrics: no need to keep a copy.
        report.incidents = Vec::new();
        let snapshot = Arc::new(Snapshot {
            report,
            gauges: gauges.clone(),
        });
        let previous = self
            .latest
            .lock()
            .map(|mut latest| latest.replace(snapshot));
        drop(previous);
    }

    /// The text exposition of what was published last.
    pub fn encode(&self) -> String {
        let mut text = String::with_capacity(8192);
        // Writing into a String fails only if a collector does, and ours
        // does not.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }
}

/// Binds `bind:port` and serves `/metrics` from a thread; publish to the
/// returned handle.
pub fn serve(bind: &str, port: u16) -> Result<Metrics> {
    let listener = TcpListener::bind((bind, port)).with_context(|| {
        format!("binding the metrics endpoint to {bind}:{port} (metrics.base_port)")
    })?;
    let metrics = Metrics::new();
    http::spawn(listener, metrics.clone()).context("starting the metrics thread")?;
    Ok(metrics)
}

/// The text exposition of one report and its gauges, as the endpoint
/// would serve it.
pub fn render(report: &NodeReport, gauges: &Gauges) -> String {
    let metrics = Metrics::new();
    metrics.update(report, gauges);
    metrics.encode()
}

/// Encodes the latest snapshot through the metric table.
#[derive(Debug)]
struct NodeCollector {
    latest: Latest,
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.latest.lock().ok().and_then(|latest| latest.clone());
        let Some(snapshot) = snapshot else {
            return Ok(());
        };
        let (r, g) = (&snapshot.report, &snapshot.gauges);
        let node = r.node.to_string();
        let labels = [("node", node.as_str()), ("role", r.role.as_str())];
        for def in METRICS {
            encode_metric(&mut encoder, def, r, g, &labels)?;
        }
        Ok(())
    }
}

/// One table row's descriptor and samples; nothing where it does not apply.
fn encode_metric(
    encoder: &mut DescriptorEncoder,
    def: &MetricDef,
    r: &NodeReport,
    g: &Gauges,
    labels: &[(&str, &str); 2],
) -> Result<(), std::fmt::Error> {
    // The encoder appends a counter's `_total` itself.
    let name = match def.kind {
        MetricType::Counter => def.name.strip_suffix("_total").unwrap_or(def.name),
        _ => def.name,
    };
    match &def.read {
        Read::One(read) => {
            let Some(value) = read(r, g) else {
                return Ok(());
            };
            let mut metric = encoder.encode_descriptor(name, def.help, None, def.kind)?;
            encode_sample(def.kind, value, metric.encode_family(labels)?)
        }
        Read::PerLabel { label, read } => {
            let samples = read(r, g);
            if samples.is_empty() {
                return Ok(());
            }
            let mut metric = encoder.encode_descriptor(name, def.help, None, def.kind)?;
            for (label_value, value) in samples {
                let all = (*labels, [(*label, label_value)]);
                encode_sample(def.kind, value, metric.encode_family(&all)?)?;
            }
            Ok(())
        }
        Read::LatencyNs(read) => {
            let (buckets, sum_s, count) = latency_buckets(read(r));
            let mut metric = encoder.encode_descriptor(name, def.help, None, def.kind)?;
            metric
                .encode_family(labels)?
                .encode_histogram::<NoLabelSet>(sum_s, count, &buckets, None)
        }
    }
}

fn encode_sample(
    kind: MetricType,
    value: Num,
    encoder: prometheus_client::encoding::MetricEncoder,
) -> Result<(), std::fmt::Error> {
    match (kind, value) {
        (MetricType::Counter, Num::Int(v)) => ConstCounter::new(v).encode(encoder),
        (MetricType::Counter, Num::Real(v)) => ConstCounter::new(v).encode(encoder),
        (_, Num::Int(v)) => ConstGauge::new(v).encode(encoder),
        (_, Num::Real(v)) => ConstGauge::new(v).encode(encoder),
    }
}

/// Nanosecond observations `(value, count)` as per-bucket counts over
/// [`LATENCY_BOUNDS_S`] (the encoder makes them cumulative and adds
/// `+Inf`), their sum in seconds and their count.
fn latency_buckets(observations: &[(u64, u64)]) -> (Vec<(f64, u64)>, f64, u64) {
    let mut buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_S.iter().map(|&le| (le, 0)).collect();
    let (mut sum_s, mut count) = (0.0, 0u64);
    for &(ns, n) in observations {
        let s = ns as f64 * 1e-9;
        sum_s += s * n as f64;
        count += n;
        // Above the last bound: only in `+Inf`, that is in `count`.
        if let Some(bucket) = buckets.iter_mut().find(|(le, _)| s <= *le) {
            bucket.1 += n;
        }
    }
    (buckets, sum_s, count)
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

    /// A node that is a BU with consumers and a consumer, with incomplete
    /// batches: it serves every metric.
    fn every_series() -> (NodeReport, Gauges) {
        let r = NodeReport {
            node: 1,
            role: "RU+BU".into(),
            missing_by_source: vec![0, 4],
            latency_buckets: vec![(300_000, 1)],
            ..Default::default()
        };
        let g = Gauges {
            bu_output: Some(BuOutputGauges {
                credits_held: vec![(4, 1)],
                ..Default::default()
            }),
            consumer: Some(ConsumerGauges {
                credits_outstanding: vec![(0, 1)],
                ..Default::default()
            }),
            ..Default::default()
        };
        (r, g)
    }

    /// (name, type) of every metric docs/metrics.md lists in its tables.
    fn documented() -> Vec<(String, String)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let mut out = Vec::new();
        for line in doc.lines().filter(|l| l.starts_with("| `evb_")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let kind = cells[2].to_string();
            for name in cells[1].split('`').filter(|s| s.starts_with("evb_")) {
                // `name{label}`: the label is the series' extra one.
                let name = name.split('{').next().unwrap();
                out.push((name.to_string(), kind.clone()));
            }
        }
        out
    }

    #[test]
    fn every_documented_metric_is_served_with_its_type_and_nothing_else() {
        let docs = documented();
        assert!(docs.len() >= 60, "{} documented metrics", docs.len());
        let (r, g) = every_series();
        let text = render(&r, &g);
        for (name, kind) in &docs {
            assert!(
                text.contains(&format!("\n# TYPE {name} {kind}\n")),
                "no `# TYPE {name} {kind}` in\n{text}"
            );
            let sample = match kind.as_str() {
                "histogram" => format!("\n{name}_bucket{{node=\"1\",role=\"RU+BU\","),
                _ => format!("\n{name}{{node=\"1\",role=\"RU+BU\""),
            };
            assert!(text.contains(&sample), "no sample of {name} in\n{text}");
        }
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert_eq!(
            types.len(),
            docs.len(),
            "served but not documented:\n{types:#?}"
        );
        assert_eq!(METRICS.len(), docs.len());
    }

    #[test]
    fn the_table_is_consistent() {
        let mut names: Vec<&str> = METRICS.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len(), "a name twice");
        for def in METRICS {
            // The encoder appends `_total` to a counter: it is stripped once.
            assert_eq!(
                def.name.ends_with("_total"),
                def.kind == MetricType::Counter,
                "{}",
                def.name
            );
            assert_eq!(
                matches!(def.read, Read::LatencyNs(_)),
                def.kind == MetricType::Histogram,
                "{}",
                def.name
            );
            assert!(def.help.ends_with('.') && !def.help.contains('\n'));
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_up_to_the_count() {
        let r = NodeReport {
            latency_buckets: vec![
                (20_000, 3),
                (700_000, 1),
                (700_001, 2),
                (40_000_000, 9),
                (1_000_000_000, 1),
                (9_000_000_000, 4),
            ],
            ..Default::default()
        };
        let text = render(&r, &Gauges::default());
        let buckets: Vec<(String, u64)> = text
            .lines()
            .filter(|l| l.starts_with("evb_batch_latency_seconds_bucket{"))
            .map(|l| {
                let le = l.split(",le=\"").nth(1).unwrap().split('"').next().unwrap();
                (
                    le.to_string(),
                    l.rsplit(' ').next().unwrap().parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(buckets.len(), LATENCY_BOUNDS_S.len() + 1);
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
        let at = |le: &str| buckets.iter().find(|b| b.0 == le).expect(le).1;
        assert_eq!(at("0.0001"), 3);
        assert_eq!(at("0.001"), 6);
        assert_eq!(at("0.05"), 15);
        // 1 s is its own bucket's upper bound: inside it.
        assert_eq!(at("1"), 16);
        assert_eq!(at("2.5"), 16);
        assert_eq!(at("+Inf"), 20);
        assert!(text.contains("\nevb_batch_latency_seconds_count{node=\"0\",role=\"\"} 20\n"));
        let sum: f64 = text
            .lines()
            .find(|l| l.starts_with("evb_batch_latency_seconds_sum{"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap();
        let expected = 3.0 * 20e-6 + 700e-6 + 2.0 * 700.001e-6 + 9.0 * 0.04 + 1.0 + 36.0;
        assert!(
            (sum - expected).abs() < 1e-9,
            "sum {sum}, expected {expected}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let r = NodeReport {
            node: 2,
            role: "RU\"BU\\x\ny".into(),
            ..Default::default()
        };
        let text = render(&r, &Gauges::default());
        assert!(
            text.contains("\nevb_events_built_total{node=\"2\",role=\"RU\\\"BU\\\\x\\ny\"} 0\n"),
            "{text}"
        );
        // Every line is a comment or a sample: no label broke a line.
        for line in text.lines() {
            assert!(
                line.starts_with("# HELP evb_")
                    || line.starts_with("# TYPE evb_")
                    || (line.starts_with("evb_") && line.contains("{node=\"2\",role=\"")),
                "{line}"
            );
        }
    }

    #[test]
    fn nothing_is_served_before_the_first_report() {
        let metrics = Metrics::new();
        assert_eq!(metrics.encode(), "");
        metrics.update(&NodeReport::default(), &Gauges::default());
        assert!(metrics.encode().contains("\nevb_events_built_total{"));
        metrics.update(
            &NodeReport {
                events_built: 7,
                ..Default::default()
            },
            &Gauges::default(),
        );
        // The latest report, through the same registry.
        assert!(metrics
            .encode()
            .contains("\nevb_events_built_total{node=\"0\",role=\"\"} 7\n"));
    }

    #[test]
    fn request_lines_are_classified() {
        use http::{classify, Request};
        for (head, expected) in [
            (&b"GET /metrics HTTP/1.1\r\nHost: x"[..], Request::Metrics),
            (b"GET /metrics?x=1 HTTP/1.0", Request::Metrics),
            (b"GET /metrics/ HTTP/1.1", Request::OtherPath),
            (b"GET / HTTP/1.1", Request::OtherPath),
            (b"POST /metrics HTTP/1.1", Request::OtherMethod),
            (b"get /metrics HTTP/1.1", Request::OtherMethod),
            (b"GET /metrics", Request::Malformed),
            (b"GET metrics HTTP/1.1", Request::Malformed),
            (b"GET /metrics HTTP/1.1 extra", Request::Malformed),
            (b"GET /metrics SPDY/3", Request::Malformed),
            (b" /metrics HTTP/1.1", Request::Malformed),
            (b"\xff\xfe /metrics HTTP/1.1", Request::Malformed),
            (b"", Request::Malformed),
        ] {
            assert_eq!(
                classify(head),
                expected,
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }
}

/// The endpoint over real sockets: answers, refusals, and a client that
/// holds it up only until the deadline.
#[cfg(test)]
mod endpoint {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::{Duration, Instant};

    fn start() -> (SocketAddr, Metrics) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::new();
        metrics.update(
            &NodeReport {
                node: 3,
                role: "RU+BU".into(),
                events_built: 11,
                ..Default::default()
            },
            &Gauges::default(),
        );
        http::spawn(listener, metrics.clone()).unwrap();
        (addr, metrics)
    }

    /// Sends `request` and returns the whole answer (empty if the server
    /// reset the connection).
    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(request);
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    }

    fn status(answer: &str) -> &str {
        answer.lines().next().unwrap_or("")
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let (addr, metrics) = start();
        let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert_eq!(status(head), "HTTP/1.1 200 OK");
        assert!(head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(head.contains(&format!("\r\nContent-Length: {}\r\n", body.len())));
        assert_eq!(body, metrics.encode());
        assert!(body.contains("\nevb_events_built_total{node=\"3\",role=\"RU+BU\"} 11\n"));

        for (request, expected) in [
            (
                &b"GET /nothing HTTP/1.0\r\n\r\n"[..],
                "HTTP/1.1 404 Not Found",
            ),
            (
                b"POST /metrics HTTP/1.1\r\n\r\n",
                "HTTP/1.1 405 Method Not Allowed",
            ),
            (b"\x00\xff\xfe\r\n\r\n", "HTTP/1.1 400 Bad Request"),
            // Cut short: the client closed its side before the blank line.
            (b"GET /metrics HTTP/1.1\r\n", "HTTP/1.1 400 Bad Request"),
        ] {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(request).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            assert_eq!(status(&answer), expected, "{request:?}");
        }
        // A head of exactly the bound without its end is refused.
        let long = vec![b'a'; http::MAX_HEAD];
        assert_eq!(
            status(&exchange(addr, &long)),
            "HTTP/1.1 431 Request Header Fields Too Large"
        );
        // A megabyte is refused or cut off, and the endpoint goes on.
        let huge = vec![b'a'; 1 << 20];
        let answer = exchange(addr, &huge);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
        let answer = exchange(addr, b"GET /metrics HTTP/1.0\r\n\r\n");
        assert_eq!(status(&answer), "HTTP/1.1 200 OK");
    }

    #[test]
    fn a_silent_client_holds_the_endpoint_only_until_the_deadline() {
        let (addr, _metrics) = start();
        let mut silent = TcpStream::connect(addr).unwrap();
        silent
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let t0 = Instant::now();
        let answer = exchange(addr, b"GET /metrics HTTP/1.0\r\n\r\n");
        let waited = t0.elapsed();
        assert_eq!(status(&answer), "HTTP/1.1 200 OK");
        assert!(
            waited < http::DEADLINE + Duration::from_secs(2),
            "waited {waited:?}"
        );
        let mut told = String::new();
        silent.read_to_string(&mut told).unwrap();
        assert_eq!(status(&told), "HTTP/1.1 408 Request Timeout");
    }
}
