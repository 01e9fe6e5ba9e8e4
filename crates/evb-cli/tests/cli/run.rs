//! `evb run` end to end: real `evb node` processes on loopback, real TCP.
//! Every mode must build every event exactly once; injected faults must be
//! detected, counted and named.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use evb_testkit::json::u64_at as u;
use evb_testkit::scratch::scratch_file;
use evb_testkit::{evb, read_json_or_null, run_bounded};
use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    scratch_file("test", name)
}

/// Runs `evb run` with a fixed number of MEPs; returns (exit code, JSON, stdout+stderr).
fn run(name: &str, sets: &[&str], extra: &[&str]) -> (i32, Value, String) {
    let json = tmp(&format!("{name}.json"));
    let mut cmd = evb();
    cmd.args(["run", "--progress", "never", "--json"])
        .arg(&json);
    // Small MEPs, a fixed count, no time limit: exact expected totals.
    for s in [
        "run.max_meps=120",
        "run.duration_s=0",
        "source.events_per_mep=64",
        "event_builder.batch_timeout_ms=1500",
    ]
    .iter()
    .chain(sets)
    {
        cmd.args(["--set", s]);
    }
    cmd.args(extra);
    let (out, text) = run_bounded(&mut cmd, "evb run", Duration::from_secs(600));
    (
        out.status.code().unwrap_or(-1),
        read_json_or_null(&json),
        text,
    )
}

#[test]
fn every_mode_builds_every_event_exactly_once() {
    for protocol in ["push", "pull"] {
        for schedule in ["barrel", "random", "all"] {
            for local in ["memory", "nic"] {
                let name = format!("{protocol}-{schedule}-{local}");
                let sets = [
                    format!("event_builder.protocol={protocol}"),
                    format!("event_builder.schedule={schedule}"),
                    format!("event_builder.local={local}"),
                ];
                let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
                let (code, v, text) = run(&name, &sets, &["--nodes", "3"]);
                assert_eq!(code, 0, "{name}: {text}");
                assert_eq!(u(&v, "summary.meps_assigned"), 120, "{name}");
                assert_eq!(u(&v, "summary.events_built"), 120 * 64, "{name}: {text}");
                assert_eq!(u(&v, "summary.batches_built"), 120, "{name}");
                for key in [
                    "events_incomplete",
                    "events_corrupt",
                    "events_lost",
                    "fragments_duplicate",
                ] {
                    assert_eq!(u(&v, &format!("summary.{key}")), 0, "{name}: {key}");
                }
                // Each node's RU shipped one fragment per MEP.
                for node in v["nodes"].as_array().unwrap() {
                    assert_eq!(node["fragments_sent"].as_u64(), Some(120), "{name}: {node}");
                }
                assert!(v["summary"]["built_gbps"].as_f64().unwrap() > 0.0);
                assert!(u(&v, "summary.latency_ns.p99") >= u(&v, "summary.latency_ns.p50"));
                // Per step of the shift, what went through the transport:
                // every fragment but the 120 local ones handed over in
                // memory (one per MEP), and step 0 only through the NIC.
                let steps = v["summary"]["steps"].as_array().unwrap();
                let shipped: u64 = steps.iter().map(|s| s["fragments"].as_u64().unwrap()).sum();
                assert_eq!(shipped, if local == "nic" { 360 } else { 240 }, "{name}");
                let step0 = steps.iter().any(|s| s["step"] == 0);
                assert_eq!(step0, local == "nic", "{name}: {steps:?}");
                assert!(steps.iter().all(|s| s["gbps"].as_f64().unwrap() > 0.0));
            }
        }
    }
}

#[test]
fn split_roles_with_a_separate_event_manager() {
    let (code, v, text) = run(
        "split",
        &[
            "nodes.ru_only=[0]",
            "nodes.bu_only=[3]",
            "nodes.em=\"separate\"",
        ],
        &["--nodes", "4"],
    );
    assert_eq!(code, 0, "{text}");
    assert_eq!(u(&v, "summary.events_built"), 120 * 64);
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 5, "4 nodes and the EM");
    assert_eq!(nodes[0]["role"], "RU");
    assert_eq!(nodes[3]["role"], "BU");
    assert_eq!(nodes[4]["role"], "EM");
    assert_eq!(nodes[0]["events_built"].as_u64(), Some(0));
    assert_eq!(nodes[3]["fragments_sent"].as_u64(), Some(0));
}

/// The schedule `evb fabric schedule` writes for a fabric drives `evb
/// run` through the same key as `evb sim`: 7 hosts on leaves of 2 (one
/// short), the shift over the ftree engine's 8 positions, 7 slots a
/// rotation with one idle slot per node. Every event is built once, and
/// the summary says where the slots came from. A table that misses a
/// pair is refused, naming the key and the file.
/// `evb fabric schedule --topology T --order O --out FILE`; the table.
fn fabric_schedule(topology: &str, order: &str, file: &PathBuf) -> String {
    let out = evb()
        .args([
            "fabric",
            "schedule",
            "--topology",
            topology,
            "--order",
            order,
            "--out",
        ])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(file).unwrap()
}

#[test]
fn a_schedule_from_evb_fabric_drives_evb_run() {
    let schedule = tmp("fabric7.txt");
    let table = fabric_schedule("fat-tree:radix=4,hosts=7,spread", "ftree", &schedule);
    assert_eq!(table.lines().filter(|l| l.starts_with("slot ")).count(), 7);
    let set = format!("event_builder.schedule_file=\"{}\"", schedule.display());
    let (code, v, text) = run("fabric7", &[&set], &["--nodes", "7"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(u(&v, "summary.events_built"), 120 * 64, "{text}");
    for key in ["events_incomplete", "events_lost", "fragments_duplicate"] {
        assert_eq!(u(&v, &format!("summary.{key}")), 0, "{key}");
    }
    assert_eq!(u(&v, "summary.slot_clock.rotation_slots"), 7, "{text}");
    assert_eq!(
        v["summary"]["slot_clock"]["schedule_file"].as_str(),
        Some(schedule.to_str().unwrap())
    );
    assert!(text.contains("7 a rotation (from "), "{text}");
    // Drop the last slot: some RU no longer reaches some BU.
    let short = tmp("fabric7-short.txt");
    let cut: Vec<&str> = table
        .lines()
        .filter(|l| !l.starts_with("slot 6:"))
        .collect();
    std::fs::write(&short, cut.join("\n")).unwrap();
    let set = format!("event_builder.schedule_file=\"{}\"", short.display());
    let (code, _, text) = run("fabric7-short", &[&set], &["--nodes", "7"]);
    assert_ne!(code, 0);
    assert!(
        text.contains("schedule_file") && text.contains("fabric7-short.txt"),
        "{text}"
    );
}

/// `evb run --fabric`: the run computes the fabric's schedule and slot
/// length itself, the same `evb fabric schedule` writes by hand.
#[test]
fn evb_run_on_its_fabric_takes_the_fabrics_schedule_and_slots() {
    // 7 hosts at QDR (32 Gb/s) in a random order: the plain barrel
    // conflicts; long slots (a shared 2-core machine keeps them).
    let fabric = ["fat-tree:radix=4,hosts=7,gbps=4xQDR", "random:3"];
    let by_hand = tmp("fabric7-random.txt");
    let slots = fabric_schedule(fabric[0], fabric[1], &by_hand)
        .lines()
        .filter(|l| l.starts_with("slot "))
        .count();
    assert!(
        slots > 6,
        "the plain barrel has 6 slots; this order conflicts"
    );
    let args = [
        "--nodes",
        "7",
        "--fabric",
        fabric[0],
        "--fabric-order",
        fabric[1],
    ];
    // MEPs of the default size, so that the slot's length is the link's.
    let (code, v, text) = run("fabric7-run", &["source.events_per_mep=4096"], &args);
    assert_eq!(code, 0, "{text}");
    assert_eq!(u(&v, "summary.events_built"), 120 * 4096, "{text}");
    assert_eq!(u(&v, "summary.events_lost"), 0, "{text}");
    assert_eq!(
        u(&v, "summary.slot_clock.rotation_slots"),
        slots as u64,
        "{text}"
    );
    // Slots sized for the fabric's 32 Gb/s: 100/32 of the default 88 us.
    let slot_us = v["summary"]["slot_clock"]["slot_us"].as_f64().unwrap();
    assert!((260.0..290.0).contains(&slot_us), "{slot_us} us: {text}");
    assert!(text.contains("the fabric's schedule: "), "{text}");
    // The run's copy of the schedule goes with the run.
    let file = v["summary"]["slot_clock"]["schedule_file"]
        .as_str()
        .unwrap();
    assert!(!std::path::Path::new(file).exists(), "{file} left behind");
    // An order shorter than the builder is refused, naming both.
    let (code, _, text) = run("fabric8", &[], &["--nodes", "8", "--fabric", fabric[0]]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("has 7 hosts, the event builder 8 nodes"),
        "{text}"
    );
}

#[test]
fn a_corrupted_fragment_is_detected_and_counted() {
    let (code, v, text) = run(
        "corrupt",
        &["faults.source=1", "faults.corrupt_meps=[7, 50]"],
        &["--nodes", "3"],
    );
    assert_eq!(code, 1, "a corrupt batch must fail the run: {text}");
    assert_eq!(u(&v, "summary.fragments_corrupt"), 2, "{text}");
    assert_eq!(u(&v, "summary.events_corrupt"), 2 * 64);
    assert_eq!(u(&v, "summary.events_built"), 118 * 64);
    assert_eq!(u(&v, "summary.events_lost"), 0);
    let incidents: Vec<&Value> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["incidents"].as_array().cloned().unwrap_or_default())
        .collect::<Vec<_>>()
        .leak()
        .iter()
        .collect();
    let meps: Vec<u64> = incidents
        .iter()
        .map(|i| i["mep"].as_u64().unwrap())
        .collect();
    assert!(meps.contains(&7) && meps.contains(&50), "{incidents:?}");
    assert!(incidents
        .iter()
        .all(|i| i["kind"] == "corrupt" && i["sources"] == serde_json::json!([1])));
    assert!(text.contains("corrupt 2"), "{text}");
    // --allow-loss accepts it.
    let (code, _, _) = run(
        "corrupt-allowed",
        &["faults.source=1", "faults.corrupt_meps=[7]"],
        &["--nodes", "3", "--allow-loss"],
    );
    assert_eq!(code, 0);
}

#[test]
fn a_missing_source_makes_a_batch_time_out_naming_the_source() {
    let (code, v, text) = run(
        "missing",
        &[
            "faults.source=2",
            "faults.drop_meps=[3, 4, 5]",
            "event_builder.batch_timeout_ms=300",
        ],
        &["--nodes", "3"],
    );
    assert_eq!(code, 1, "{text}");
    assert_eq!(u(&v, "summary.events_incomplete"), 3 * 64, "{text}");
    assert_eq!(u(&v, "summary.events_built"), 117 * 64);
    assert_eq!(u(&v, "summary.events_lost"), 0);
    assert_eq!(
        v["summary"]["missing_by_source"],
        serde_json::json!([0, 0, 3])
    );
    assert!(
        text.contains("source 2 was missing from 3 incomplete batches"),
        "{text}"
    );
}

/// `output.deliver_partial`: the three batches missing source 2 still
/// reach the file sink, as `EVBP` records with an empty fragment for
/// source 2 and the other two intact; every other batch is an `EVBB`
/// record. The accounting is unchanged: they are incomplete.
#[test]
fn partial_batches_reach_the_file_sink_flagged() {
    let dir = tmp("partial-out");
    let _ = std::fs::remove_dir_all(&dir);
    let dir_set = format!("output.directory=\"{}\"", dir.display());
    let (code, v, text) = run(
        "partial-file",
        &[
            "faults.source=2",
            "faults.drop_meps=[3, 4, 5]",
            "event_builder.batch_timeout_ms=300",
            "output.deliver_partial=true",
            "output.sink=file",
            &dir_set,
        ],
        &["--nodes", "3"],
    );
    assert_eq!(code, 1, "incomplete all the same: {text}");
    assert_eq!(u(&v, "summary.events_incomplete"), 3 * 64, "{text}");
    assert_eq!(u(&v, "summary.events_built"), 117 * 64, "{text}");
    assert_eq!(u(&v, "summary.batches_delivered_partial"), 3, "{text}");
    assert!(
        text.contains("flagged partial (output.deliver_partial): 3"),
        "{text}"
    );
    let (mut built, mut partial) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let mut at = 0;
        while at < data.len() {
            let mep = u64::from_le_bytes(data[at + 4..at + 12].try_into().unwrap());
            let n = u32::from_le_bytes(data[at + 12..at + 16].try_into().unwrap()) as usize;
            assert_eq!(n, 3, "one entry per source");
            let lens: Vec<usize> = (0..n)
                .map(|i| {
                    u32::from_le_bytes(data[at + 16 + 4 * i..at + 20 + 4 * i].try_into().unwrap())
                        as usize
                })
                .collect();
            match &data[at..at + 4] {
                b"EVBB" => {
                    assert!(lens.iter().all(|&l| l > 0), "{lens:?}");
                    built.push(mep);
                }
                b"EVBP" => {
                    assert_eq!(lens[2], 0, "source 2 is missing: {lens:?}");
                    assert!(lens[0] > 0 && lens[1] > 0, "{lens:?}");
                    partial.push(mep);
                }
                other => panic!("unknown record {other:?}"),
            }
            at += 16 + 4 * n + lens.iter().sum::<usize>();
        }
    }
    partial.sort_unstable();
    assert_eq!(partial, vec![3, 4, 5]);
    assert_eq!(built.len(), 117);
    assert!(!built.iter().any(|m| partial.contains(m)));
}

/// The same with consumers: the partial batches are delivered to the
/// Filter Units flagged, and each consumer counts what it got.
#[test]
fn partial_batches_reach_the_consumers_flagged() {
    let (code, v, text) = run(
        "partial-fu",
        &[
            "faults.source=1",
            "faults.drop_meps=[10, 20]",
            "event_builder.batch_timeout_ms=300",
            "output.deliver_partial=true",
            "output.consumers=2",
        ],
        &["--nodes", "3"],
    );
    assert_eq!(code, 1, "{text}");
    assert_eq!(u(&v, "summary.events_incomplete"), 2 * 64, "{text}");
    assert_eq!(u(&v, "summary.batches_delivered_partial"), 2, "{text}");
    let c = &v["summary"]["consumers"];
    assert_eq!(c["batches_partial"], 2, "{text}");
    // Every batch reached a consumer once: the built and the partial.
    assert_eq!(c["batches_delivered"], 120, "{text}");
    assert_eq!(c["batches_consumed"], 120, "{text}");
}

#[test]
fn pull_with_a_missing_source_finishes_and_counts_it() {
    let (code, v, text) = run(
        "missing-pull",
        &[
            "event_builder.protocol=pull",
            "faults.source=1",
            "faults.drop_meps=[10, 11]",
            "event_builder.batch_timeout_ms=300",
        ],
        &["--nodes", "3"],
    );
    assert_eq!(code, 1, "{text}");
    assert_eq!(u(&v, "summary.events_incomplete"), 2 * 64, "{text}");
    assert_eq!(u(&v, "summary.events_built"), 118 * 64, "{text}");
    assert_eq!(u(&v, "summary.events_lost"), 0);
    assert_eq!(v["summary"]["missing_by_source"][1], 2);
    assert!(
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["drain_timed_out"] == false),
        "{text}"
    );
}

#[test]
fn runs_for_its_duration_and_drains() {
    let json = tmp("duration.json");
    let out = evb()
        .args([
            "run",
            "--nodes",
            "2",
            "--duration",
            "1.5",
            "--progress",
            "never",
            "--json",
        ])
        .arg(&json)
        .args(["--set", "source.events_per_mep=256"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let d = v["summary"]["duration_s"].as_f64().unwrap();
    assert!((1.4..10.0).contains(&d), "duration {d}");
    assert!(u(&v, "summary.events_built") > 0);
    assert_eq!(
        u(&v, "summary.events_built"),
        u(&v, "summary.events_generated")
    );
    assert!(text.contains("events: generated"), "{text}");
}

#[test]
fn file_sink_writes_every_built_batch() {
    let dir = tmp("out");
    let _ = std::fs::remove_dir_all(&dir);
    let dir_set = format!("output.directory=\"{}\"", dir.display());
    let (code, _, text) = run("file", &["output.sink=file", &dir_set], &["--nodes", "2"]);
    assert_eq!(code, 0, "{text}");
    let mut batches = 0;
    let mut meps = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let mut at = 0;
        while at < data.len() {
            assert_eq!(&data[at..at + 4], b"EVBB");
            meps.push(u64::from_le_bytes(
                data[at + 4..at + 12].try_into().unwrap(),
            ));
            let n = u32::from_le_bytes(data[at + 12..at + 16].try_into().unwrap()) as usize;
            assert_eq!(n, 2, "one fragment per source");
            let lens: Vec<usize> = (0..n)
                .map(|i| {
                    u32::from_le_bytes(data[at + 16 + 4 * i..at + 20 + 4 * i].try_into().unwrap())
                        as usize
                })
                .collect();
            let mut p = at + 16 + 4 * n;
            for len in lens {
                // Each fragment: 64 event sizes, then data; checksum-free check of the table.
                let table: usize = (0..64)
                    .map(|e| {
                        u32::from_le_bytes(data[p + 4 * e..p + 4 * e + 4].try_into().unwrap())
                            as usize
                    })
                    .sum();
                assert_eq!(len, 4 * 64 + table);
                p += len;
            }
            at = p;
            batches += 1;
        }
    }
    meps.sort_unstable();
    assert_eq!(batches, 120);
    assert!(meps.iter().copied().eq(0..120));
}

#[test]
fn config_errors_name_the_key_and_line() {
    let path = tmp("bad.toml");
    std::fs::write(&path, "[run]\nseed = 1\n[event_builder]\ncredits = 0\n").unwrap();
    let out = evb().args(["config", "check"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:4: key `event_builder.credits`: must be at least 1"),
        "{err}"
    );
    // The same through `evb run`, which must not start anything.
    let out = evb().args(["run", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    std::fs::write(&path, "[event_builder]\ncredits = 2\nprotocl = \"push\"\n").unwrap();
    let out = evb().args(["config", "check"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:3: key `event_builder.protocl`"),
        "{err}"
    );
    let out = evb()
        .args(["config", "check", "--set", "event_builder.schedule=zigzag"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--set") && err.contains("schedule"), "{err}");
    let out = evb().args(["config", "check"]).output().unwrap();
    assert!(out.status.success());
}

#[test]
fn ctrl_c_drains_and_reports() {
    let json = tmp("sigint.json");
    let child = evb()
        .args([
            "run",
            "--nodes",
            "3",
            "--duration",
            "120",
            "--progress",
            "never",
            "--json",
        ])
        .arg(&json)
        .args(["--set", "source.events_per_mep=128"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed().as_secs() < 30, "draining took too long");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(u(&v, "summary.events_built") > 0);
    assert_eq!(
        u(&v, "summary.events_built"),
        u(&v, "summary.events_generated")
    );
    assert!(v["summary"]["duration_s"].as_f64().unwrap() < 60.0);
}

#[test]
fn histogram_sizes_through_the_launcher() {
    let dir = tmp("hist");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("sizes.txt"), "# size weight\n100 1\n300 1\n").unwrap();
    std::fs::write(
        dir.join("eb.toml"),
        "[source]\nsize = \"histogram\"\nhistogram = \"sizes.txt\"\nevents_per_mep = 1000\n",
    )
    .unwrap();
    let cfg = dir.join("eb.toml");
    let cfg = cfg.to_str().unwrap();
    // --set wins over the file: the helper's 64 events/MEP is set back to 1000.
    let (code, v, text) = run(
        "hist",
        &["source.events_per_mep=1000"],
        &["--nodes", "2", "--config", cfg],
    );
    assert_eq!(code, 0, "{text}");
    assert_eq!(u(&v, "summary.events_built"), 120 * 1000);
    // Mean event fragment 200 B + 4 B of size table: ~204 kB per fragment.
    let per_fragment = u(&v, "summary.bytes_built") as f64 / (120.0 * 2.0);
    assert!(
        (190_000.0..218_000.0).contains(&per_fragment),
        "{per_fragment}"
    );
}
