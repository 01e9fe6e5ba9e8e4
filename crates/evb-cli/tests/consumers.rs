//! The output stage end to end: `evb run --consumers M` starts M Filter
//! Unit processes next to the nodes; every built batch must be delivered
//! over real TCP, verified and consumed exactly once. Slow consumers must
//! slow the builder down (the EM stalls for credit), never lose a batch.
//! `evb sim` must model the same stage with consumers as fabric hosts.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("evb-fu-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `evb` with `args`, killed after `limit`; returns (exit code, output).
fn evb(args: &[&str], limit: Duration) -> (i32, String) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let out_path = tmp(&format!("out-{}.txt", RUNS.fetch_add(1, Ordering::SeqCst)));
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_evb"))
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
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "evb {args:?} did not finish within {limit:?}:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (code, std::fs::read_to_string(&out_path).unwrap_or_default())
}

fn read_json(path: &PathBuf, output: &str) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no JSON at {} ({e}):\n{output}", path.display()));
    serde_json::from_str(&text).expect("valid JSON")
}

fn u(v: &Value, path: &str) -> u64 {
    let mut cur = v;
    for p in path.split('.') {
        cur = &cur[p];
    }
    cur.as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

fn f(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for p in path.split('.') {
        cur = &cur[p];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

const MEPS: u64 = 200;
const EVENTS_PER_MEP: u64 = 64;

fn run_with_consumers(name: &str, sets: &[&str]) -> (i32, Value, String) {
    let json = tmp(&format!("{name}.json"));
    let json_s = json.display().to_string();
    let mut args = vec![
        "run",
        "-n",
        "4",
        "--consumers",
        "2",
        "--progress",
        "never",
        "--json",
        &json_s,
    ];
    let meps = format!("run.max_meps={MEPS}");
    let epm = format!("source.events_per_mep={EVENTS_PER_MEP}");
    let fixed = [meps.as_str(), "run.duration_s=0", epm.as_str()];
    for s in fixed.iter().chain(sets) {
        args.push("--set");
        args.push(s);
    }
    let (code, output) = evb(&args, Duration::from_secs(120));
    let v = read_json(&json, &output);
    (code, v, output)
}

/// Checks the exact accounting of a consumer run: every MEP built, every
/// built batch delivered once and consumed once, by the consumers' counts.
fn check_exact(v: &Value, output: &str) {
    let s = &v["summary"];
    assert_eq!(u(s, "meps_assigned"), MEPS, "{output}");
    assert_eq!(u(s, "events_built"), MEPS * EVENTS_PER_MEP, "{output}");
    assert_eq!(u(s, "events_lost"), 0, "{output}");
    let c = &s["consumers"];
    assert_eq!(u(c, "consumers"), 2, "{output}");
    assert_eq!(u(c, "batches_delivered"), MEPS, "{output}");
    assert_eq!(u(c, "batches_consumed"), MEPS, "{output}");
    assert_eq!(u(c, "events_consumed"), MEPS * EVENTS_PER_MEP, "{output}");
    assert_eq!(u(c, "bytes_consumed"), u(c, "bytes_delivered"), "{output}");
    assert_eq!(u(c, "batches_not_consumed"), 0, "{output}");
    assert_eq!(u(c, "batches_undelivered"), 0, "{output}");
    assert_eq!(u(c, "batches_corrupt"), 0, "{output}");
    // The bytes consumed are the built bytes plus each batch's table.
    let table = MEPS * (4 + 4 * 4);
    assert_eq!(
        u(c, "bytes_consumed"),
        u(s, "bytes_built") + table,
        "{output}"
    );
    let per = c["per_consumer"].as_array().expect("per_consumer");
    assert_eq!(per.len(), 2);
    let total: u64 = per.iter().map(|p| u(p, "batches")).sum();
    assert_eq!(total, MEPS);
    // Round-robin over consumers with credit: both get work.
    assert!(per.iter().all(|p| u(p, "batches") > 0), "{output}");
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 6, "4 nodes + 2 consumers");
    assert!(nodes[4..]
        .iter()
        .all(|n| n["role"] == "FU" && u(n, "deliveries_unexpected") == 0));
}

#[test]
fn every_built_batch_is_consumed_exactly_once() {
    let (code, v, output) = run_with_consumers("exact", &[]);
    assert_eq!(code, 0, "{output}");
    check_exact(&v, &output);
    assert!(output.contains("consumers: 2"), "{output}");
}

#[test]
fn slow_consumers_push_back_to_the_event_manager() {
    // 20 ms a batch at each of 2 consumers: at most ~100 batches/s, far
    // below what 4 nodes build; one credit each, a one-batch output buffer.
    let (code, v, output) = run_with_consumers(
        "slow",
        &[
            "output.consumer_busy_us=20000",
            "output.consumer_credits=1",
            "output.bu_output_batches=1",
            "output.consumer_busy=exponential",
        ],
    );
    assert_eq!(code, 0, "{output}");
    check_exact(&v, &output);
    let c = &v["summary"]["consumers"];
    assert!(u(c, "em_credit_stalls") > 0, "{output}");
    assert!(f(c, "output_full_s") > 0.0, "{output}");
    // 200 batches x 20 ms over 2 consumers: about 2 s, mostly busy.
    let duration = f(&v["summary"], "duration_s");
    assert!(duration > 1.5, "the consumers set the pace: {duration} s");
    for p in c["per_consumer"].as_array().unwrap() {
        let busy = f(p, "busy_fraction");
        assert!(
            busy > 0.4,
            "a slow consumer is mostly busy: {busy}\n{output}"
        );
    }
    // The timeline shows busy consumers.
    let timeline = v["timeline"].as_array().unwrap();
    assert!(
        timeline
            .iter()
            .any(|t| t["busy_consumers"].as_f64().unwrap_or(0.0) > 1.0),
        "{timeline:?}"
    );
}

/// A consumer's busy time can come from real work: its trigger reads
/// every byte of each batch `consumer_work_passes` times. That time is
/// measured, counted busy, and slows the builder down like drawn busy
/// time does: nothing is lost, and the first run (no work) is idle.
#[test]
fn real_trigger_work_keeps_consumers_busy_and_pushes_back() {
    let (code, idle, output) = run_with_consumers("idle", &[]);
    assert_eq!(code, 0, "{output}");
    let (code, v, output) = run_with_consumers(
        "work",
        &[
            "output.consumer_work_passes=5000",
            "output.consumer_credits=1",
            "output.bu_output_batches=1",
        ],
    );
    assert_eq!(code, 0, "{output}");
    check_exact(&v, &output);
    let c = &v["summary"]["consumers"];
    assert!(u(c, "em_credit_stalls") > 0, "{output}");
    let busy = |v: &Value| -> f64 {
        v["nodes"].as_array().unwrap()[4..]
            .iter()
            .map(|n| f(n, "busy_s"))
            .sum()
    };
    // 5000 passes over 13 MB of batches (66 GB read): measured here as
    // 0.64 s of CRC work per consumer in a 0.71 s run, against none.
    let (idle_s, work_s) = (busy(&idle), busy(&v));
    assert_eq!(idle_s, 0.0, "no drawn busy time, no work");
    assert!(work_s > 0.2, "the consumers worked {work_s} s\n{output}");
    let duration = f(&v["summary"], "duration_s");
    assert!(
        work_s / 2.0 > 0.3 * duration,
        "the work sets the pace: {work_s} s busy over 2 consumers in {duration} s"
    );
}

/// A consumer killed mid-run (`kill -9`): the batches delivered to it and
/// not yet confirmed by its credit are delivered again to the other, so
/// every built batch is confirmed exactly once; the survivor's own count
/// of what it consumed equals what the BUs saw it confirm.
#[test]
fn a_killed_consumers_unconfirmed_batches_go_to_the_other() {
    let json = tmp("fu-kill.json");
    let json_s = json.display().to_string();
    let (code, output) = evb(
        &[
            "run",
            "-n",
            "3",
            "--consumers",
            "2",
            "-d",
            "2.5",
            "--progress",
            "never",
            "--kill",
            "4@1",
            "--allow-loss",
            "--json",
            &json_s,
            "--set",
            "output.consumer_busy_us=20000",
            "--set",
            "source.events_per_mep=256",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, 0, "{output}");
    let v = read_json(&json, &output);
    let s = &v["summary"];
    assert_eq!(
        v["summary"]["nodes_missing"],
        serde_json::json!([4]),
        "{output}"
    );
    assert_eq!(
        u(s, "events_lost") + u(s, "events_incomplete"),
        0,
        "{output}"
    );
    let c = &s["consumers"];
    // Busy 20 ms a batch with 2 credits per BU: the dead one held some.
    assert!(u(c, "batches_redelivered") > 0, "{output}");
    assert_eq!(u(c, "batches_delivered"), u(s, "batches_built"), "{output}");
    assert_eq!(u(c, "batches_confirmed"), u(s, "batches_built"), "{output}");
    assert_eq!(u(c, "batches_undelivered"), 0, "{output}");
    let per = c["per_consumer"].as_array().unwrap();
    let survivor = per.iter().find(|p| u(p, "node") == 3).unwrap();
    assert_eq!(u(survivor, "batches"), u(survivor, "confirmed"), "{output}");
    assert!(output.contains("delivered again: "), "{output}");
}

#[test]
fn sim_models_consumers_as_fabric_hosts() {
    let json = tmp("sim.json");
    let json_s = json.display().to_string();
    let (code, output) = evb(
        &[
            "sim",
            "--topology",
            "switch:hosts=6",
            "--set",
            "output.consumers=2",
            "--set",
            "sim.output.network=fabric",
            "--set",
            "output.consumer_busy_us=50",
            "--set",
            "source.events_per_mep=256",
            "--set",
            "sim.duration_us=3000",
            "--json",
            &json_s,
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, 0, "{output}");
    let v = read_json(&json, &output);
    let c = &v["consumers"];
    assert_eq!(u(c, "consumers"), 2, "{v}");
    // 4 nodes on the first hosts, the consumers on the last two.
    assert_eq!(u(&v["summary"], "hosts"), 6);
    assert!(u(&v["summary"]["eb"], "events_built") > 0, "{v}");
    assert!(u(c, "batches_delivered") >= u(c, "batches_consumed"), "{c}");
    assert!(u(c, "batches_consumed") > 0, "{c}");
    assert!(f(c, "consumer_gbps") > 0.0, "{c}");
    assert!(f(c, "producer_gbps") >= f(c, "consumer_gbps") * 0.5, "{c}");
    let series = c["busy_consumers"].as_array().expect("busy series");
    assert!(!series.is_empty());
    assert!(series.iter().any(|b| b.as_f64().unwrap() > 0.0), "{c}");
    assert!(series.iter().all(|b| b.as_f64().unwrap() <= 2.0), "{c}");
}
