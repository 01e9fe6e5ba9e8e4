//! The transport conformance suite: every transport this machine can run
//! passes the same checks, with real worker processes (`evb bench
//! conformance`) and a real event builder (`evb run --transport`):
//! order and content per peer over small and large messages, many peers,
//! backpressure from a slow receiver, clean shutdown, a dead peer noticed
//! within a bound, and an event builder with exact counts.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn evb() -> Command {
    Command::new(env!("CARGO_BIN_EXE_evb"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("evb-transports-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `evb bench conformance`; returns (exit code, workers, output).
fn conformance(transport: &str, args: &[&str]) -> (i32, Vec<Value>, String) {
    let name: String = transport.chars().filter(|c| c.is_alphanumeric()).collect();
    let json = tmp(&format!(
        "conf-{name}-{}.json",
        args.join("_").replace('-', "")
    ));
    let out = evb()
        .args(["bench", "conformance", "--transport", transport, "--json"])
        .arg(&json)
        .args(args)
        .output()
        .expect("evb runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("{transport}: no JSON result\n{text}"));
    let workers = v["workers"].as_array().cloned().unwrap_or_default();
    (out.status.code().unwrap_or(-1), workers, text)
}

fn received(w: &Value) -> Vec<u64> {
    w["received_from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Four ranks, every pair both ways, 64 B to 4 MiB: every message
/// arrives once, in order, intact; everyone finishes cleanly.
fn all_to_all_in_order(transport: &str) {
    let (code, workers, text) = conformance(transport, &["--ranks", "4", "--messages", "150"]);
    assert_eq!(code, 0, "{transport}\n{text}");
    assert_eq!(workers.len(), 4);
    for (rank, w) in workers.iter().enumerate() {
        let mut expected = vec![150u64; 4];
        expected[rank] = 0;
        assert_eq!(received(w), expected, "{transport} rank {rank}\n{text}");
        assert_eq!(w["order_errors"], 0, "{transport} rank {rank}");
        assert_eq!(w["content_errors"], 0, "{transport} rank {rank}");
        assert_eq!(w["finished_clean"], true, "{transport} rank {rank}\n{text}");
        assert!(
            w["lost_peers"].as_array().unwrap().is_empty(),
            "{transport}\n{text}"
        );
    }
}

/// Rank 1 takes 3 ms per message: senders hold at most their window,
/// nobody is declared dead, nothing is lost.
fn slow_receiver_backpressure(transport: &str) {
    let (code, workers, text) = conformance(
        transport,
        &[
            "--ranks",
            "3",
            "--messages",
            "150",
            "--slow-us",
            "3000",
            "--window",
            "4",
        ],
    );
    assert_eq!(code, 0, "{transport}\n{text}");
    for (rank, w) in workers.iter().enumerate() {
        let mut expected = vec![150u64; 3];
        expected[rank] = 0;
        assert_eq!(received(w), expected, "{transport} rank {rank}\n{text}");
        assert!(
            w["max_outstanding"].as_u64().unwrap() <= 4,
            "{transport}: window exceeded"
        );
        assert!(
            w["lost_peers"].as_array().unwrap().is_empty(),
            "{transport}\n{text}"
        );
    }
}

/// The last rank kills itself mid-exchange: the others notice within a
/// bound, get everything from the living, and finish.
fn dead_peer_detected(transport: &str) {
    let (code, workers, text) = conformance(
        transport,
        &["--ranks", "4", "--messages", "300", "--die-after", "100"],
    );
    assert_eq!(code, 0, "{transport}\n{text}");
    assert!(workers[3].is_null(), "rank 3 should have died\n{text}");
    for (rank, w) in workers.iter().take(3).enumerate() {
        let got = received(w);
        for (p, &n) in got.iter().enumerate().take(3) {
            assert_eq!(
                n,
                if p == rank { 0 } else { 300 },
                "{transport} rank {rank}\n{text}"
            );
        }
        let lost = w["lost_peers"].as_array().unwrap();
        assert_eq!(lost.len(), 1, "{transport} rank {rank}: {lost:?}\n{text}");
        assert_eq!(lost[0][0], 3);
        let after = lost[0][1].as_f64().unwrap();
        assert!(
            after < 1.5,
            "{transport}: dead peer noticed after {after} s"
        );
    }
}

/// A real event builder over the transport: exact counts, zero loss.
fn event_builder_exact(transport: &str) {
    let json = tmp(&format!(
        "run-{}.json",
        transport.replace([':', ';', ','], "_")
    ));
    let out = evb()
        .args([
            "run",
            "--progress",
            "never",
            "-n",
            "4",
            "--transport",
            transport,
            "--json",
        ])
        .arg(&json)
        .args(["--set", "run.max_meps=400", "--set", "run.duration_s=0"])
        .args(["--set", "source.events_per_mep=256"])
        .output()
        .expect("evb runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{transport}\n{text}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let s = &v["summary"];
    assert_eq!(s["meps_assigned"], 400, "{text}");
    assert_eq!(s["events_generated"], 400 * 256);
    assert_eq!(s["events_built"], 400 * 256, "{text}");
    for k in ["events_incomplete", "events_corrupt", "events_lost"] {
        assert_eq!(s[k], 0, "{k}\n{text}");
    }
    assert_eq!(v["config"]["transport"]["kind"], transport);
}

macro_rules! transport_suite {
    ($name:ident, $kind:expr) => {
        mod $name {
            #[test]
            fn all_to_all_in_order() {
                super::all_to_all_in_order($kind);
            }
            #[test]
            fn slow_receiver_backpressure() {
                super::slow_receiver_backpressure($kind);
            }
            #[test]
            fn dead_peer_detected() {
                super::dead_peer_detected($kind);
            }
            #[test]
            fn event_builder_exact() {
                super::event_builder_exact($kind);
            }
        }
    };
}

transport_suite!(tcp, "tcp");
transport_suite!(shm, "shm");

#[test]
fn p2p_benchmark_writes_table_json_csv_and_plots() {
    let json = tmp("p2p.json");
    let csv = tmp("p2p.csv");
    let plot = tmp("p2p");
    let out = evb()
        .args([
            "bench",
            "p2p",
            "--transport",
            "shm",
            "--max-size",
            "65536",
            "--seconds",
            "0.05",
        ])
        .args(["--pingpong", "20", "--json"])
        .arg(&json)
        .arg("--csv")
        .arg(&csv)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 11, "64 B .. 64 KiB");
    for r in rows {
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["latency_p50_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["latency_p99_us"].as_f64().unwrap() >= r["latency_p50_us"].as_f64().unwrap());
    }
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 12);
    for suffix in ["-bandwidth.svg", "-bandwidth.png", "-latency.svg"] {
        let mut p = plot.as_os_str().to_owned();
        p.push(suffix);
        assert!(
            std::fs::metadata(PathBuf::from(p)).unwrap().len() > 1000,
            "{suffix}"
        );
    }
}

#[test]
fn unknown_transport_is_a_clear_error() {
    let out = evb()
        .args([
            "run",
            "--progress",
            "never",
            "--transport",
            "carrier-pigeon",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("transport.kind") && err.contains("carrier-pigeon"),
        "{err}"
    );
}
