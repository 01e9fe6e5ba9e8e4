//! Prometheus metrics: Debian's real `prometheus` scrapes a running
//! `evb run` and the series it stored are checked through its HTTP API.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A plain HTTP GET on loopback; returns (status line, body).
fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// `n` consecutive free ports (checked by binding them).
fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let base = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if base > 60000 {
            continue;
        }
        let held: Vec<_> = (0..n)
            .filter_map(|i| TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
    panic!("no {n} consecutive free ports");
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let base = free_ports(4);
    let prom_port = free_ports(1);

    let run = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_evb"))
            .args(["run", "--progress", "never", "-n", "4", "-d", "12"])
            .args(["--set", &format!("metrics.base_port={base}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let targets: Vec<String> = (0..4)
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
    let _prom = KillOnDrop(
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

    // A node's endpoint answers directly, with counters and a histogram.
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

    // Prometheus stores a growing built-events series for all four nodes.
    let query = "/api/v1/query?query=evb_events_built_total";
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
    // The histogram made it too: a quantile over it is a positive latency.
    let q = "/api/v1/query?query=histogram_quantile(0.5,sum(rate(evb_batch_latency_seconds_bucket[5s]))by(le))";
    let (_, body) = get(prom_port, q).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    let p50: f64 = v["data"]["result"][0]["value"][1]
        .as_str()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0.0);
    assert!(p50 > 0.0 && p50 < 2.5, "p50 from prometheus: {body}");
    drop(run);
}

/// Every metric the shipped Grafana dashboard queries is one a node serves.
#[test]
fn grafana_dashboard_queries_served_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../grafana/evb-dashboard.json"
    );
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let served = evb_net::metrics::render(
        &evb_net::report::NodeReport {
            missing_by_source: vec![0, 1],
            ..Default::default()
        },
        evb_net::metrics::Gauges::default(),
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
