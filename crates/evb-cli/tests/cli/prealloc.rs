//! Fixed buffer pools (`event_builder.preallocate_buffers`): each node
//! allocates and touches its MEP and receive buffers at start, at the
//! bounds the configuration gives, and its resident memory then stays
//! there under load. A pool smaller than the bound makes MEPs wait for a
//! buffer (counted), never allocate past it. Real processes, bounded in
//! time.

use std::time::Duration;

use evb_core::{Config, Layout};
use evb_testkit::json::summary_u64 as u;
use evb_testkit::{evb, read_json_or_null, run_bounded};
use evb_transport::buffers::BufferPlan;
use evb_transport::TransportKind;
use serde_json::Value;

/// Runs `evb run` with `args` plus `--json`; returns (exit code, output,
/// run JSON).
fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let mut cmd = evb();
    cmd.args(["run", "--progress", "never", "--json"])
        .arg(&json)
        .args(args)
        .envs(env.iter().copied());
    let (out, text) = run_bounded(&mut cmd, "evb run", Duration::from_secs(90));
    (
        out.status.code().unwrap_or(-1),
        text,
        read_json_or_null(&json),
    )
}

const MIB: f64 = (1u64 << 20) as f64;

/// Fragments of at most 4096 x 516 bytes (2 MiB buffers): 64.5 MiB a node.
const ARGS: [&str; 6] = [
    "--nodes",
    "4",
    "--set",
    "event_builder.preallocate_buffers=true",
    "--set",
    "source.max_fragment_bytes=512",
];

#[test]
fn preallocated_pools_are_resident_from_the_start_and_memory_stays_flat() {
    let mut args = ARGS.to_vec();
    args.extend(["--duration", "5"]);
    let (code, text, v) = run(&args, &[]);
    assert_eq!(code, 0, "{text}");
    // What the nodes say they allocated is the plan for this config.
    let mut config = Config::default();
    config.nodes.count = 4;
    config.source.max_fragment_bytes = 512;
    config.event_builder.preallocate_buffers = true;
    config.transport.kind = evb_transport::TransportKind::Shm;
    let layout = Layout::from_config(&config);
    let (_, planned) = BufferPlan::for_run(&config, &layout).unwrap();
    let pre = u(&v, "buffers_preallocated_bytes");
    assert_eq!(pre, planned, "{text}");
    // The credits x 4 BUs + 2 in flight, + one per BU: over shm the BUs
    // read the RUs' buffers in place (zero copy).
    let meps = BufferPlan::for_node(&config, &layout, 1, &TransportKind::Shm).mep_buffers;
    assert_eq!(meps as u32, config.event_builder.credits * 4 + 2 + 4);
    assert!(
        text.contains(&format!("preallocated {meps} MEP buffers")),
        "{text}"
    );
    assert_eq!(u(&v, "events_lost"), 0, "{text}");
    assert_eq!(u(&v, "rx_buffer_overflows"), 0, "past the bound:\n{text}");
    // One sample a second; every node reports from its first STATS line
    // on (0.25 s), after its pools were made.
    let rss: Vec<(f64, u64)> = v["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|s| (s["t_s"].as_f64().unwrap(), s["rss_bytes"].as_u64().unwrap()))
        .filter(|&(t, _)| t >= 1.0)
        .collect();
    assert!(rss.len() >= 3, "{rss:?}");
    let first = rss[0].1;
    let most = rss.iter().map(|s| s.1).max().unwrap();
    let show = |b: u64| format!("{:.1} MiB", b as f64 / MIB);
    // Allocated and touched at start: resident from the first second.
    // (On demand, the nodes start far below: their working set is some
    // 17 buffers of about 1 MiB each.)
    assert!(
        first >= pre,
        "resident {} after 1 s, below the {} preallocated",
        show(first),
        show(pre)
    );
    // Under load it does not grow past that by more than a small margin.
    assert!(
        most as f64 <= first as f64 * 1.05,
        "resident memory grew from {} to {} (more than 5%)",
        show(first),
        show(most)
    );
}

#[test]
fn a_pool_short_of_buffers_makes_meps_wait_and_loses_nothing() {
    let mut args = ARGS.to_vec();
    args.extend(["--duration", "3"]);
    // Two MEP buffers per RU where the bound is 10.
    let (code, text, v) = run(&args, &[("EVB_MEP_BUFFERS", "2")]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("preallocated 2 MEP buffers"), "{text}");
    assert!(u(&v, "events_built") > 0, "{text}");
    assert_eq!(u(&v, "events_lost"), 0, "{text}");
    assert_eq!(u(&v, "events_incomplete"), 0, "{text}");
    assert!(u(&v, "mep_buffer_waits") > 0, "no MEP waited:\n{text}");
    assert!(
        text.contains("MEPs that waited for a free MEP buffer"),
        "{text}"
    );
    // Every node still holds just its pools, 2 + 22 buffers of 2 MiB, and
    // maps its 3 peers' 2 shared MEP buffers.
    let last = v["timeline"].as_array().unwrap().last().unwrap()["rss_bytes"]
        .as_u64()
        .unwrap();
    let per_node = last as f64 / 4.0 / MIB;
    assert!(per_node < 30.0 * 2.02 + 40.0, "{per_node:.1} MiB a node");
}

/// Batches given up after 5 ms return their credits while the RUs still
/// hold those MEPs: the RUs need more MEP buffers than the credits bound,
/// so MEPs wait for one; nothing is allocated past the pools, the
/// accounting stays exact and the memory flat.
#[test]
fn batches_given_up_early_make_meps_wait_within_the_pools() {
    let mut args = ARGS.to_vec();
    args.extend([
        "--duration",
        "4",
        "--allow-loss",
        "--set",
        "event_builder.batch_timeout_ms=5",
    ]);
    let (code, text, v) = run(&args, &[]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(u(&v, "events_lost"), 0, "{text}");
    assert_eq!(u(&v, "rx_buffer_overflows"), 0, "past the bound:\n{text}");
    let rss: Vec<u64> = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["t_s"].as_f64().unwrap() >= 1.0)
        .map(|s| s["rss_bytes"].as_u64().unwrap())
        .collect();
    let most = *rss.iter().max().unwrap();
    assert!(
        most as f64 <= rss[0] as f64 * 1.05,
        "resident memory grew: {rss:?}"
    );
    eprintln!("MEPs that waited: {}", u(&v, "mep_buffer_waits"));
}

#[test]
fn preallocation_past_the_machine_memory_is_refused_naming_the_key() {
    // 4 GB fragments: 32 buffers a node.
    let (code, text, _) = run(
        &[
            "--nodes",
            "4",
            "--duration",
            "1",
            "--set",
            "event_builder.preallocate_buffers=true",
            "--set",
            "event_builder.max_message_bytes=4294967295",
            "--set",
            "source.events_per_mep=1000",
            "--set",
            "source.max_fragment_bytes=4000000",
        ],
        &[],
    );
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("event_builder.preallocate_buffers would allocate"),
        "{text}"
    );
}
