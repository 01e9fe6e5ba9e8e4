//! `evb chaos`: a short randomized soak of a real `evb run` over tcp, in
//! its own network namespace (root, as the CI runs): the faults drawn
//! from a seed are done to real processes and sockets, every invariant
//! holds, and the JSON names every fault and its effect; the schedule that
//! found the stopped EM that never came back replays clean; a failing
//! schedule is shrunk to a command that replays it; bad input is refused,
//! never a panic. The seeds are the two from 22 on, as they come: none
//! picked for passing (24, which found the EM that waited for a node
//! restarted with it, was the third until the shrink test took its time;
//! its bug has a DST test of its own).

use std::time::Duration;

use evb_testkit::process::run_bounded;
use evb_testkit::{evb, read_json, scratch_dir};

/// A readout the slowest machine keeps up with (64k events/s), so that
/// "the rate came back" compares like with like when other tests share the
/// cores (at chaos's 2000 MEPs/s a loaded 2-core machine built 275k
/// events/s before a fault and 105k after, and the run was called not
/// back).
const PACED: &str = "source.mep_rate_hz=250";

#[test]
fn a_short_chaos_run_holds_every_invariant() {
    let json = scratch_dir("chaos").join("chaos.json");
    let (out, text) = run_bounded(
        evb()
            .args(["chaos", "-t", "tcp", "-d", "8", "--every", "0.7"])
            .args(["--set", PACED])
            .args(["--seed", "22", "--runs", "2", "--json"])
            .arg(&json),
        "evb chaos",
        Duration::from_secs(120),
    );
    let v = read_json(&json, &text);
    let s = &v["summary"];
    assert_eq!(s["violations"], serde_json::json!([]), "{text}");
    assert!(out.status.success(), "{text}");
    assert_eq!(s["runs"], 2, "{text}");
    let faults = s["faults"].as_array().expect("summary.faults");
    assert!(faults.len() >= 4, "{text}");
    let mut kinds: Vec<&str> = faults.iter().map(|f| f["kind"].as_str().unwrap()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert!(kinds.len() >= 4, "{kinds:?}\n{text}");
    for f in faults {
        assert!(f["at_s"].as_f64().is_some_and(|t| t >= 3.0), "{f}");
        assert!(f["events_lost"].as_u64().is_some(), "{f}");
        assert!(f.get("recovery_s").is_some(), "{f}");
    }
    for run in v["runs"].as_array().unwrap() {
        // Exact accounting, and the store read back whole.
        let n = |k: &str| run[k].as_u64().unwrap();
        assert_eq!(
            n("events_generated"),
            n("events_built") + n("events_incomplete") + n("events_lost"),
            "{run}"
        );
        assert!(n("store_objects") > 100, "{run}");
        assert!(n("metrics_answers") > 20, "{run}");
        let replay = run["replay"].as_str().unwrap();
        assert!(replay.contains("--faults '"), "{replay}");
    }
    // The table names every kind injected.
    for k in kinds {
        assert!(text.contains(k), "{k} missing from the table:\n{text}");
    }
}

/// The EM (its own endpoint) stopped past the peer timeout, then resumed:
/// every node lost it and it lost every node. Before the fix in evb-core
/// (`EventManager::waits_for_lost_bus`) it ended the run there and nothing
/// was built after; now the run comes back.
#[test]
fn a_stopped_em_comes_back_under_chaos() {
    let json = scratch_dir("chaos-em").join("chaos.json");
    let (out, text) = run_bounded(
        evb()
            .args(["chaos", "-t", "tcp", "-d", "8"])
            .args(["--set", PACED])
            .args(["--faults", "stop:4@4.00+1.20", "--json"])
            .arg(&json),
        "evb chaos",
        Duration::from_secs(120),
    );
    let v = read_json(&json, &text);
    assert_eq!(v["summary"]["violations"], serde_json::json!([]), "{text}");
    assert!(out.status.success(), "{text}");
    let f = &v["summary"]["faults"][0];
    assert_eq!(f["kind"], "stop", "{text}");
    assert!(
        f["recovery_s"].as_f64().is_some_and(|r| r < 2.0),
        "{f}\n{text}"
    );
}

/// `--shrink` end to end: a schedule that breaks an invariant (here one
/// the test forces: `--max-lost 0`, and node kills lose the batches in
/// flight) is shrunk to fewer faults that still fail, printed as an
/// `evb chaos --faults` and an `evb run --kill/--restart` command line;
/// the fault that breaks nothing is the one dropped. Two kills, so that
/// the rare kill that loses nothing cannot make the test pass nothing.
#[test]
fn a_failing_schedule_is_shrunk_to_a_command_that_replays_it() {
    let json = scratch_dir("chaos-shrink").join("chaos.json");
    let (out, text) = run_bounded(
        evb()
            .args(["chaos", "-t", "tcp", "-d", "8"])
            .args(["--set", PACED, "--max-lost", "0", "--shrink", "1"])
            .args([
                "--faults",
                "kill:2@3.50+1.00,kill:3@5.00+1.00,stranger:0@6.00+0.50/1",
            ])
            .arg("--json")
            .arg(&json),
        "evb chaos",
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    let v = read_json(&json, &text);
    let s = &v["summary"]["shrunk"];
    assert_eq!(s["runs_tried"], 1, "{text}");
    assert_eq!(s["schedule"], "kill:2@3.50+1.00,kill:3@5.00+1.00", "{text}");
    assert!(!s["violations"].as_array().unwrap().is_empty(), "{text}");
    // Shrunk against the invariant that failed, not any.
    assert!(
        text.contains("keeping the schedule failing max-lost"),
        "{text}"
    );
    assert!(
        s["violations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["invariant"] == "max-lost"),
        "{text}"
    );
    let chaos = s["chaos_command"].as_str().unwrap();
    assert!(
        chaos.contains("--max-lost 0 --faults 'kill:2@3.50+1.00,kill:3@5.00+1.00'"),
        "{chaos}"
    );
    let run = s["run_command"].as_str().unwrap();
    for part in [
        "evb run -n 4",
        "--kill 2@3.5 --restart 2@4.5",
        "--kill 3@5 --restart 3@6",
    ] {
        assert!(run.contains(part), "{part} missing: {run}");
    }
    assert!(
        text.contains(&format!("shrunk (seed 1): {chaos}")),
        "{text}"
    );
    assert!(text.contains(&format!("as evb run: {run}")), "{text}");
}

#[test]
fn bad_schedules_and_options_are_refused() {
    for (args, says) in [
        (&["--faults", "kill:2"][..], "no `@`"),
        (&["--faults", "boom:1@4+1"][..], "unknown fault kind"),
        (&["--kinds", "kill,nope"][..], "unknown fault kind"),
        (&["-d", "2"][..], "--duration"),
    ] {
        let (out, text) = run_bounded(
            evb().arg("chaos").args(args),
            "evb chaos",
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!text.contains("panicked"), "{text}");
    }
}
