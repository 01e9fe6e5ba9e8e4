//! Prometheus metrics: Debian's real `prometheus` scrapes a running
//! `evb run` (4 nodes and 2 Filter Unit consumers) and the series it stored
//! are checked through its HTTP API, the consumer and producer series
//! against the run's own JSON.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use evb_testkit::net::{free_ports, http_get as get};
use evb_testkit::{evb, KillOnDrop};
use serde_json::Value;

/// One cluster and one prometheus for the whole test: the checks below
/// share them, in the order the run goes (while it runs, then after).
#[test]
fn prometheus_scrapes_every_node() {
    let prometheus = Command::new("prometheus").arg("--version").output();
    assert!(
        prometheus.is_ok_and(|o| o.status.success()),
        "prometheus is missing: scripts/setup.sh installs Debian's prometheus"
    );
    let dir = std::env::temp_dir().join(format!("evb-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let scrape = Scrape::start(&dir);

    assert_node_serves_counters_and_histogram(scrape.base);
    wait_for_growing_built_series(scrape.prom_port);
    assert_prometheus_stored_histogram(scrape.prom_port);
    assert_consumer_and_producer_series(scrape.base);

    // Wait for the run to end, then compare what prometheus stored last
    // with the run's final figures.
    let Scrape {
        mut run,
        prom,
        prom_port,
        json,
        ..
    } = scrape;
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "evb run did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    let result: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let received = assert_scraped_deliveries_match_run(prom_port, &result);
    assert_scraped_busy_credits_and_stalls(prom_port, &received, &result);
    drop(run);
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running `evb run` and the prometheus that scrapes its endpoints.
struct Scrape {
    /// The first metrics port: endpoint `i` listens on `base + i`.
    base: u16,
    prom_port: u16,
    /// Where the run writes its JSON.
    json: PathBuf,
    run: KillOnDrop,
    prom: KillOnDrop,
}

impl Scrape {
    fn start(dir: &Path) -> Scrape {
        // 4 nodes (endpoints 0..4) and 2 consumers (endpoints 4 and 5), each
        // busy 10 ms per batch: slow enough that BUs wait for consumer credit.
        let base = free_ports(6);
        let prom_port = free_ports(1);
        let json = dir.join("run.json");

        let run = KillOnDrop(
            evb()
                .args(["run", "--progress", "never", "-n", "4", "-d", "12"])
                .args(["--consumers", "2"])
                .args(["--set", "output.consumer_busy_us=10000"])
                .args(["--set", &format!("metrics.base_port={base}")])
                .arg("--json")
                .arg(&json)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let targets: Vec<String> = (0..6)
            .map(|i| format!("'127.0.0.1:{}'", base + i))
            .collect();
        let config: PathBuf = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: evb\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let prom = KillOnDrop(
            Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        Scrape {
            base,
            prom_port,
            json,
            run,
            prom,
        }
    }
}

/// A node's endpoint answers directly, with counters and a histogram.
fn assert_node_serves_counters_and_histogram(base: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        if let Some((status, body)) = get(base + 2, "/metrics") {
            if status.contains("200") && body.contains("evb_events_built_total") {
                break body;
            }
        }
        assert!(Instant::now() < deadline, "node 2 never served /metrics");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        body.contains("# TYPE evb_batch_latency_seconds histogram"),
        "{body}"
    );
    assert!(
        body.contains("evb_batch_latency_seconds_bucket{node=\"2\",role=\"RU+BU\",le=\"+Inf\"}")
    );
    assert!(get(base, "/nothing").unwrap().0.contains("404"));
    // CPU time, and its cost per GB built.
    for name in [
        "evb_cpu_user_seconds_total",
        "evb_cpu_system_seconds_total",
        "evb_cpu_user_seconds_per_gb_built",
        "evb_cpu_system_seconds_per_gb_built",
    ] {
        let line = body
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{node=\"2\"")))
            .unwrap_or_else(|| panic!("{name} not served:\n{body}"));
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value >= 0.0 && value.is_finite(), "{line}");
    }
}

/// Prometheus stores a growing built-events series for all four nodes.
fn wait_for_growing_built_series(prom_port: u16) {
    let query = "/api/v1/query?query=evb_events_built_total{role!=%22FU%22}";
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut first: Option<Vec<f64>> = None;
    loop {
        let values: Option<Vec<f64>> = get(prom_port, query).and_then(|(_, b)| {
            let v: Value = serde_json::from_str(&b).ok()?;
            let mut series: Vec<(u64, f64)> = v["data"]["result"]
                .as_array()?
                .iter()
                .map(|s| {
                    let node = s["metric"]["node"].as_str().unwrap().parse().unwrap();
                    let value = s["value"][1].as_str().unwrap().parse().unwrap();
                    (node, value)
                })
                .collect();
            series.sort_by_key(|s| s.0);
            (series.len() == 4).then(|| series.into_iter().map(|s| s.1).collect())
        });
        if let Some(vals) = values {
            match &first {
                None if vals.iter().all(|&x| x > 0.0) => first = Some(vals),
                Some(f) if vals.iter().zip(f).all(|(now, then)| now > then) => break,
                _ => {}
            }
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never stored 4 growing series; last: {first:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The histogram made it too: a quantile over it is a positive latency.
fn assert_prometheus_stored_histogram(prom_port: u16) {
    let q = "/api/v1/query?query=histogram_quantile(0.5,sum(rate(evb_batch_latency_seconds_bucket[5s]))by(le))";
    let (_, body) = get(prom_port, q).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    let p50: f64 = v["data"]["result"][0]["value"][1]
        .as_str()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0.0);
    assert!(p50 > 0.0 && p50 < 2.5, "p50 from prometheus: {body}");
}

/// A consumer's endpoint serves the consumer series, a BU's the producer side.
fn assert_consumer_and_producer_series(base: u16) {
    let fu = get(base + 4, "/metrics")
        .expect("consumer 4 serves /metrics")
        .1;
    for name in [
        "evb_consumer_batches_received_total{node=\"4\",role=\"FU\"}",
        "evb_consumer_busy_seconds_total{node=\"4\",role=\"FU\"}",
        "evb_consumer_busy{node=\"4\",role=\"FU\"}",
        "evb_consumer_credits_outstanding{node=\"4\",role=\"FU\",bu=\"3\"}",
    ] {
        assert!(fu.contains(name), "no {name} in\n{fu}");
    }
    let bu = get(base + 1, "/metrics").expect("node 1 serves /metrics").1;
    for name in [
        "evb_bu_batches_delivered_total{node=\"1\",role=\"RU+BU\"}",
        "evb_bu_output_queue_batches{",
        "evb_bu_consumer_credit_stalls_total{",
        "evb_bu_consumer_credits{node=\"1\",role=\"RU+BU\",consumer=\"5\"}",
    ] {
        assert!(bu.contains(name), "no {name} in\n{bu}");
    }
    assert!(!bu.contains("evb_consumer_"), "consumer series on a BU");
}

/// Per series, the last value prometheus scraped (max over the run:
/// counters), labelled by `label`, in label order.
fn last_scraped(prom_port: u16, metric: &str, label: &str) -> Vec<(String, f64)> {
    let q = format!("/api/v1/query?query=max_over_time({metric}[5m])");
    let (_, body) = get(prom_port, &q).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    let mut out: Vec<(String, f64)> = v["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{q}: {body}"))
        .iter()
        .map(|s| {
            (
                s["metric"][label].as_str().unwrap_or("").to_string(),
                s["value"][1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The batches the consumers received and the BUs delivered, as last
/// scraped, against the run JSON's final figures. Returns the consumers'
/// last scraped batches received.
fn assert_scraped_deliveries_match_run(prom_port: u16, result: &Value) -> Vec<(String, f64)> {
    let c = &result["summary"]["consumers"];
    let per_consumer: Vec<(u64, u64)> = c["per_consumer"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["node"].as_u64().unwrap(), p["batches"].as_u64().unwrap()))
        .collect();
    let delivered = c["batches_delivered"].as_u64().unwrap();
    assert_eq!(per_consumer.len(), 2);
    assert_eq!(
        per_consumer.iter().map(|p| p.1).sum::<u64>(),
        delivered,
        "consumed = delivered in the run JSON"
    );
    let received = last_scraped(prom_port, "evb_consumer_batches_received_total", "node");
    eprintln!("consumer batches received, last scraped: {received:?}; final per consumer {per_consumer:?}");
    assert_eq!(received.len(), 2, "{received:?}");
    for ((node, scraped), (fin_node, fin)) in received.iter().zip(&per_consumer) {
        assert_eq!(node, &fin_node.to_string());
        // Scraped up to a second or two before the end of a 12 s run.
        assert!(
            *scraped > 0.0 && *scraped <= *fin as f64 && *scraped >= 0.5 * *fin as f64,
            "consumer {node}: scraped {scraped}, final {fin}"
        );
    }
    let scraped_delivered: f64 = last_scraped(prom_port, "evb_bu_batches_delivered_total", "node")
        .iter()
        .map(|s| s.1)
        .sum();
    let scraped_received: f64 = received.iter().map(|s| s.1).sum();
    eprintln!("BU batches delivered, last scraped sum: {scraped_delivered}; final {delivered}");
    assert!(scraped_delivered <= delivered as f64 && scraped_delivered >= 0.5 * delivered as f64);
    assert!(
        (scraped_delivered - scraped_received).abs() <= 0.2 * delivered as f64,
        "delivered {scraped_delivered} vs received {scraped_received}"
    );
    received
}

/// The consumers' busy time follows from the batches they `received`,
/// credits stay within `consumer_credits`, and the slow consumers made the
/// BUs wait for credit.
fn assert_scraped_busy_credits_and_stalls(
    prom_port: u16,
    received: &[(String, f64)],
    result: &Value,
) {
    let busy = last_scraped(prom_port, "evb_consumer_busy_seconds_total", "node");
    eprintln!("consumer busy seconds, last scraped: {busy:?}");
    // 10 ms per batch: busy time is the batches received times 10 ms,
    // less those still queued (at most 2 credits x 4 BUs).
    for ((_, b), (_, n)) in busy.iter().zip(received) {
        assert!(
            (b - n * 0.01).abs() <= 0.1 * n * 0.01 + 0.1,
            "busy {b} s for {n} batches"
        );
    }
    let credits = last_scraped(prom_port, "evb_consumer_credits_outstanding", "bu");
    assert_eq!(credits.len(), 2 * 4, "per consumer and BU: {credits:?}");
    assert!(
        credits.iter().all(|c| c.1 <= 2.0),
        "at most consumer_credits: {credits:?}"
    );
    let held = last_scraped(prom_port, "evb_bu_consumer_credits", "consumer");
    assert_eq!(held.len(), 4 * 2, "per BU and consumer: {held:?}");
    assert!(held.iter().all(|c| c.1 <= 2.0), "{held:?}");
    let stalls: f64 = last_scraped(prom_port, "evb_bu_consumer_credit_stalls_total", "node")
        .iter()
        .map(|s| s.1)
        .sum();
    let queue_max: f64 = last_scraped(prom_port, "evb_bu_output_queue_batches", "node")
        .iter()
        .map(|s| s.1)
        .fold(0.0, f64::max);
    eprintln!("consumer-credit stalls {stalls}, deepest output queue scraped {queue_max}");
    assert!(stalls > 0.0, "slow consumers: BUs wait for consumer credit");
    assert!(
        result["summary"]["consumers"]["em_credit_stalls"]
            .as_u64()
            .unwrap()
            > 0
    );
}

/// Every metric the shipped Grafana dashboard queries is one a node serves.
#[test]
fn grafana_dashboard_queries_served_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../grafana/evb-dashboard.json"
    );
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // A node that is both a BU with consumers and a consumer serves every series.
    let served = evb_metrics::render(
        &evb_control::report::NodeReport {
            missing_by_source: vec![0, 1],
            ..Default::default()
        },
        &evb_metrics::Gauges {
            bu_output: Some(evb_metrics::BuOutputGauges {
                credits_held: vec![(4, 1)],
                ..Default::default()
            }),
            consumer: Some(evb_metrics::ConsumerGauges {
                credits_outstanding: vec![(0, 1)],
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    let mut checked = 0;
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if word.starts_with("evb_") {
                    assert!(
                        served.contains(&format!("\n{word}{{")),
                        "{word} in {expr} is not served"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 15, "only {checked} metric references");
}
