//! A node dying during `evb run`: real processes, a real `kill -9` (or
//! SIGSTOP, which leaves the connections open and silent so only the
//! heartbeats can tell). The run must notice within a second, go on, and
//! account for every event exactly.

use std::process::Command;

use serde_json::Value;

fn run_with(fault: &str, spec: &str, name: &str) -> (i32, Value, String) {
    let dir = std::env::temp_dir().join(format!("evb-fail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join(format!("{name}.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_evb"))
        .args([
            "run",
            "--nodes",
            "4",
            "--duration",
            "5",
            "--progress",
            "never",
            fault,
            spec,
            "--json",
        ])
        .arg(&json)
        .args(["--set", "source.events_per_mep=1024"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (out.status.code().unwrap_or(-1), v, text)
}

fn n(v: &Value, key: &str) -> u64 {
    v["summary"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("summary.{key}"))
}

/// Checks what every node death must give; returns the failure timeline.
fn check_death(code: i32, v: &Value, text: &str, victim: u64, fault_at: f64) -> Vec<Value> {
    assert_eq!(
        code, 1,
        "a death loses events, so the run fails without --allow-loss: {text}"
    );
    assert_eq!(
        v["summary"]["nodes_missing"],
        serde_json::json!([victim]),
        "{text}"
    );
    // Exact accounting: every generated event has one fate, and the lost
    // ones are exactly those of MEPs the dead BU had not finished.
    let generated = n(v, "events_generated");
    let (built, incomplete, corrupt, lost) = (
        n(v, "events_built"),
        n(v, "events_incomplete"),
        n(v, "events_corrupt"),
        n(v, "events_lost"),
    );
    assert_eq!(generated, built + incomplete + corrupt + lost, "{text}");
    assert_eq!(lost, n(v, "events_lost_bu_gone"), "{text}");
    assert!(lost <= 2 * 1024, "at most the dead BU's credits: {text}");
    assert_eq!(corrupt, 0);
    // Detected by every survivor within a second.
    let failures = v["summary"]["failures"].as_array().unwrap().clone();
    let seen: Vec<f64> = failures
        .iter()
        .filter(|f| f["node"] == victim && f["seen_by"] != "launcher")
        .map(|f| f["at_s"].as_f64().unwrap())
        .collect();
    assert_eq!(seen.len(), 3, "every survivor notices: {failures:?}");
    for t in &seen {
        assert!(
            *t - fault_at < 1.0 && *t >= fault_at - 0.05,
            "detected at {t} s, fault at {fault_at} s: {text}"
        );
    }
    // The run goes on: events are built well after the death.
    let after: f64 = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["t_s"].as_f64().unwrap() > fault_at + 1.5)
        .map(|s| s["built_gbps"].as_f64().unwrap())
        .sum();
    assert!(after > 1.0, "nothing built after the death: {text}");
    // The survivors finished normally.
    for node in v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| !x.is_null() && x["node"] != victim)
    {
        assert_eq!(node["drain_timed_out"], false, "{text}");
    }
    failures
}

#[test]
fn kill_9_of_a_node_is_survived_and_accounted_for() {
    let (code, v, text) = run_with("--kill", "2@1.5", "kill");
    let failures = check_death(code, &v, &text, 2, 1.5);
    assert!(failures
        .iter()
        .any(|f| f["seen_by"] == "launcher" && f["what"].as_str().unwrap().contains("SIGKILL")));
    assert!(text.contains("failure timeline"), "{text}");
}

#[test]
fn a_silent_node_is_found_by_heartbeats() {
    let (code, v, text) = run_with("--stop", "3@1.5", "stop");
    let failures = check_death(code, &v, &text, 3, 1.5);
    assert!(
        failures
            .iter()
            .filter(|f| f["seen_by"] != "launcher")
            .all(|f| f["what"].as_str().unwrap().contains("silent")),
        "only heartbeats can see a stopped process: {failures:?}"
    );
}
