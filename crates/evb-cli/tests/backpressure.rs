//! A paced readout (`source.mep_rate_hz`) meeting a slow output: the
//! detector delivers MEPs at a fixed rate, the consumers cannot keep up,
//! credits stop the EM, the MEPs wait in the RUs up to
//! `event_builder.ru_buffer_meps` and then the readout is throttled. The
//! RU buffer stays bounded, the throttled time and the vetoed events are
//! counted, and nothing that was read out is lost. Real processes over
//! real TCP; bounded in time.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("evb-bp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `evb run` with `args` plus `--json`, killed after 60 s; returns
/// (exit code, output, run JSON).
fn run(name: &str, args: &[&str]) -> (i32, String, Value) {
    let json = tmp(&format!("{name}.json"));
    let out_path = tmp(&format!("{name}.txt"));
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_evb"))
        .args(["run", "--progress", "never", "--json"])
        .arg(&json)
        .args(args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("evb starts");
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "evb run {args:?} did not finish within 60 s:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("no JSON ({e}):\n{text}")),
    )
    .expect("valid JSON");
    (code, text, v)
}

fn u(v: &Value, key: &str) -> u64 {
    v["summary"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("summary.{key} in {}", v["summary"]))
}

fn f(v: &Value, key: &str) -> f64 {
    v["summary"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("summary.{key} in {}", v["summary"]))
}

#[test]
fn slow_consumers_throttle_a_paced_readout_with_bounded_buffers_and_no_loss() {
    // One consumer busy 20 ms per batch takes at most ~50 batches/s; the
    // readout delivers 400 MEPs/s into buffers of 6 MEPs.
    let (code, text, v) = run(
        "throttle",
        &[
            "--nodes",
            "2",
            "--consumers",
            "1",
            "--duration",
            "3",
            "--set",
            "output.consumer_busy_us=20000",
            "--set",
            "source.mep_rate_hz=400",
            "--set",
            "event_builder.ru_buffer_meps=6",
            "--set",
            "source.events_per_mep=256",
        ],
    );
    assert_eq!(code, 0, "throttling is not a loss: {text}");
    let duration = f(&v, "duration_s");
    let throttled = f(&v, "throttled_s");
    assert!(
        throttled > 0.5 * duration && throttled <= duration + 0.1,
        "throttled {throttled} s of {duration} s: {text}"
    );
    assert!(u(&v, "throttle_episodes") >= 1, "{text}");
    let vetoed = u(&v, "events_vetoed");
    let generated = u(&v, "events_generated");
    assert!(vetoed > generated, "most of the readout is vetoed: {text}");
    // The RU buffers never held more than the bound.
    let max_unbuilt = u(&v, "max_unbuilt_meps");
    assert!(
        (1..=6).contains(&max_unbuilt),
        "max unbuilt {max_unbuilt}: {text}"
    );
    // Everything read out was built and consumed, exactly.
    assert!(generated > 0, "{text}");
    assert_eq!(generated, u(&v, "events_built"), "{text}");
    assert_eq!(
        u(&v, "events_lost") + u(&v, "events_incomplete"),
        0,
        "{text}"
    );
    let c = &v["summary"]["consumers"];
    assert_eq!(c["batches_delivered"], c["batches_consumed"], "{text}");
    assert_eq!(c["batches_undelivered"], 0, "{text}");
    assert!(text.contains("readout throttle:"), "{text}");
    // Every node reports the RU held at most the bound.
    for node in v["nodes"].as_array().unwrap() {
        assert!(
            node["max_meps_held"].as_u64().unwrap() <= 6,
            "node {}: {text}",
            node["node"]
        );
    }
}

#[test]
fn a_readout_the_builder_keeps_up_with_is_never_throttled() {
    // 100 MEPs/s of 64 events: far below what two nodes build.
    let (code, text, v) = run(
        "paced",
        &[
            "--nodes",
            "2",
            "--duration",
            "2",
            "--set",
            "source.mep_rate_hz=100",
            "--set",
            "source.events_per_mep=64",
        ],
    );
    assert_eq!(code, 0, "{text}");
    assert_eq!(f(&v, "throttled_s"), 0.0, "{text}");
    assert_eq!(u(&v, "events_vetoed"), 0, "{text}");
    assert_eq!(u(&v, "events_generated"), u(&v, "events_built"), "{text}");
    // The readout sets the pace: about 100 MEPs per second of the run, not
    // as many as the builder could take.
    let meps = u(&v, "meps_assigned") as f64;
    let duration = f(&v, "duration_s");
    assert!(
        meps > 50.0 * duration.min(2.0) && meps < 110.0 * duration + 5.0,
        "{meps} MEPs in {duration} s at 100 MEPs/s: {text}"
    );
}

#[test]
fn a_configuration_needing_more_memory_than_the_machine_is_refused_up_front() {
    // 4 GB fragments, 64 credits: terabytes per node.
    let out = Command::new(env!("CARGO_BIN_EXE_evb"))
        .args(["run", "--nodes", "4", "--progress", "never"])
        .args(["--set", "event_builder.credits=64"])
        .args(["--set", "event_builder.max_message_bytes=4294967295"])
        .args(["--set", "source.events_per_mep=1000000"])
        .args(["--set", "source.max_fragment_bytes=4000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("more than this machine's") && text.contains("event_builder.credits = 64"),
        "{text}"
    );
}
