//! A node dying during `evb run`: real processes, a real `kill -9` (or
//! SIGSTOP, which leaves the connections open and silent so only the
//! heartbeats can tell). The run must notice within a second, go on, and
//! account for every event exactly.

use std::time::Duration;

use evb_testkit::json::summary_u64 as n;
use evb_testkit::scratch::scratch_file;
use evb_testkit::{evb, read_json, run_bounded};
use serde_json::Value;

fn run_with(fault: &str, spec: &str, name: &str) -> (i32, Value, String) {
    run_with_settings(fault, spec, name, &[])
}

fn run_with_settings(
    fault: &str,
    spec: &str,
    name: &str,
    settings: &[&str],
) -> (i32, Value, String) {
    let json = scratch_file("fail", &format!("{name}.json"));
    let (out, text) = run_bounded(
        evb()
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
            .args(settings.iter().flat_map(|s| ["--set", s])),
        "evb run",
        Duration::from_secs(120),
    );
    let v = read_json(&json, &text);
    (out.status.code().unwrap_or(-1), v, text)
}

/// A BU's credits with the defaults (configs/default.toml's
/// `event_builder.credits`): the most MEPs a lost BU leaves unfinished.
const DEFAULT_CREDITS: u64 = 3;

/// Checks what every node death must give; returns the failure timeline.
fn check_death(
    code: i32,
    v: &Value,
    text: &str,
    victim: u64,
    fault_at: f64,
    credits: u64,
) -> Vec<Value> {
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
    // ones are exactly those of MEPs the dead BU had not finished; its
    // batches were re-assigned (the RUs still held them) or lost, at most
    // its credits in all.
    check_exact_accounting(v, text, credits);
    assert_eq!(
        n(v, "events_reassigned"),
        n(v, "meps_reassigned") * 1024,
        "{text}"
    );
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
    let failures = check_death(code, &v, &text, 2, 1.5, DEFAULT_CREDITS);
    assert!(failures
        .iter()
        .any(|f| f["seen_by"] == "launcher" && f["what"].as_str().unwrap().contains("SIGKILL")));
    assert!(text.contains("failure timeline"), "{text}");
}

/// PULL with 8 credits: a BU asks for its batches' fragments a few at a
/// time, so when it is killed the RUs still hold most of its batches. The
/// EM asks them, re-assigns what every live RU holds to the survivors and
/// counts only the rest lost; every event keeps exactly one fate.
#[test]
fn a_killed_bus_batches_are_reassigned_when_the_rus_hold_them() {
    let (code, v, text) = run_with_settings(
        "--kill",
        "2@1.5",
        "kill-reassign",
        &["event_builder.protocol=pull", "event_builder.credits=8"],
    );
    check_death(code, &v, &text, 2, 1.5, 8);
    let reassigned = n(&v, "meps_reassigned");
    eprintln!(
        "re-assigned {reassigned} MEPs, lost {} events; generated {} = built {} + incomplete {} + corrupt {} + lost {}",
        n(&v, "events_lost"),
        n(&v, "events_generated"),
        n(&v, "events_built"),
        n(&v, "events_incomplete"),
        n(&v, "events_corrupt"),
        n(&v, "events_lost")
    );
    assert!(reassigned > 0, "nothing re-assigned: {text}");
    assert!(
        text.contains(&format!("re-assigned from a dead BU: {reassigned} MEPs")),
        "printed in the summary: {text}"
    );
    // The EM's node reports it too.
    assert_eq!(v["nodes"][0]["em_meps_reassigned"], reassigned, "{text}");
    // A batch that gave up on the dead source still took every live
    // source's fragment: only source 2 is ever missing.
    for node in v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| !n.is_null())
    {
        let missing = node["missing_by_source"].as_array().unwrap();
        for (source, count) in missing.iter().enumerate() {
            if source != 2 {
                assert_eq!(
                    count, 0,
                    "node {}: source {source} missing\n{text}",
                    node["node"]
                );
            }
        }
    }
}

#[test]
fn a_silent_node_is_found_by_heartbeats() {
    let (code, v, text) = run_with("--stop", "3@1.5", "stop");
    let failures = check_death(code, &v, &text, 3, 1.5, DEFAULT_CREDITS);
    assert!(
        failures
            .iter()
            .filter(|f| f["seen_by"] != "launcher")
            .all(|f| f["what"].as_str().unwrap().contains("silent")),
        "only heartbeats can see a stopped process: {failures:?}"
    );
}

/// `kill -9` of node 2 at 1.5 s, a fresh `evb node --rejoin` for it at 3 s,
/// 8 s in all, over TCP: the survivors re-dial it (backoff up to 1 s, so
/// within about a second), the EM re-admits its BU and RU, and it builds
/// again; every event keeps exactly one fate.
#[test]
fn a_killed_node_restarts_rejoins_and_builds_again() {
    check_restart("tcp");
}

/// The same over shared memory (the default of `evb run`): the new
/// incarnation has a new inbox and asks each survivor, through its slot in
/// the survivor's inbox, to take it back; the survivor drops what the dead
/// one left in its ring, resets it and answers.
#[test]
fn a_killed_node_restarts_and_rejoins_over_shm() {
    check_restart("shm");
}

/// The same over UCX (tcp): the new incarnation sends each survivor a join
/// request with its new worker address; the survivor opens an endpoint to
/// it, bumps its epoch for that rank (the dead incarnation's messages, of
/// the old epoch, are dropped), restarts the rank's stream and answers.
#[test]
fn a_killed_node_restarts_and_rejoins_over_ucx() {
    check_restart("ucx:tcp");
}

/// The same over libfabric (tcp;ofi_rxm), the way UCX does it: a join
/// request with the new address, an epoch per link. A survivor that was not
/// sending to the dead node notices it by its silence (0.8 s).
#[test]
fn a_killed_node_restarts_and_rejoins_over_ofi_tcp() {
    check_restart_noticed_within("ofi:tcp", 1.5);
}

/// `kill -9` of the EM (on its own endpoint, 4) at 1.5 s and a fresh one
/// at 2.5 s, over tcp: the nodes finish what was assigned and wait; the new
/// EM assigns nothing until each node has said how far it saw, resumes
/// above, and the run goes on to its planned end with every event
/// accounted for (the BUs' counts: the dead EM's died with it).
#[test]
fn a_killed_em_is_restarted_and_takes_the_run_over() {
    check_em_restart("tcp");
}

/// The same over shared memory (the default of `evb run`).
#[test]
fn a_killed_em_is_restarted_over_shm() {
    check_em_restart("shm");
}

/// An EM that is not brought back: every node waits for it
/// `event_builder.em_lost_wait_ms` (here 1 s), then finishes what it holds,
/// says why and ends its run; the summary names the EM as the missing node
/// and nothing is built twice or lost.
#[test]
fn nodes_cut_off_from_the_em_end_after_em_lost_wait() {
    let (code, v, text) = run_with_settings(
        "--kill",
        "4@1",
        "em-lost-wait",
        &["nodes.em=separate", "event_builder.em_lost_wait_ms=1000"],
    );
    assert_eq!(code, 1, "a node without a final report is an error\n{text}");
    assert!(text.contains("it was the Event Manager"), "{text}");
    for node in 0..4 {
        assert!(
            text.contains(&format!(
                "evb node {node}: the EM did not come back within event_builder.em_lost_wait_ms (1000 ms)"
            )),
            "{text}"
        );
        assert_eq!(v["nodes"][node]["drain_timed_out"], true, "{text}");
    }
    // The run ended at the wait, not at the 5 s asked for.
    let elapsed = v["summary"]["duration_s"].as_f64().unwrap();
    assert!(elapsed < 4.5, "ran {elapsed} s\n{text}");
    assert_eq!(n(&v, "events_generated"), n(&v, "events_built"), "{text}");
}

fn check_em_restart(transport: &str) {
    let (out, text, v) = run_for(
        &format!("em-restart-{transport}"),
        6,
        &[
            "--set",
            "nodes.em=separate",
            "--kill",
            "4@1.5",
            "--restart",
            "4@2.5",
        ],
        Some(transport),
    );
    assert!(text.contains(&format!("over {transport}")), "{text}");
    assert_eq!(
        v["summary"]["nodes_missing"],
        serde_json::json!([]),
        "{text}"
    );
    // The new EM resumed past what the first one assigned, and went on.
    let resumed = n(&v, "em_resumed_at_mep");
    assert!(resumed > 0, "{text}");
    assert!(n(&v, "meps_assigned") > resumed + 100, "{text}");
    assert!(text.contains("EM resumed the run at MEP"), "{text}");
    assert!(text.contains("the Event Manager was restarted"), "{text}");
    assert_eq!(v["nodes"][4]["restarted"], true, "{text}");
    // Every event has one fate; only MEPs the first EM was assigning as it
    // died can miss a part (at most the BUs' credits of them).
    let (generated, built, incomplete, corrupt, lost) = fates(&v, &text);
    assert_eq!(corrupt, 0, "{text}");
    assert!(incomplete + lost <= 4 * 2 * 1024, "{text}");
    let clean = generated == built;
    assert_eq!(out.status.code(), Some(if clean { 0 } else { 1 }), "{text}");
    // Every node saw the EM go within a second and come back after the
    // restart.
    let failures = v["summary"]["failures"].as_array().unwrap().clone();
    let seen = |what: &str| -> Vec<f64> {
        failures
            .iter()
            .filter(|f| f["node"] == 4 && f["seen_by"] != "launcher")
            .filter(|f| f["what"].as_str().unwrap().starts_with(what))
            .map(|f| f["at_s"].as_f64().unwrap())
            .collect()
    };
    let lost_at = seen("lost");
    assert_eq!(lost_at.len(), 4, "{failures:?}");
    assert!(
        lost_at.iter().all(|t| (1.45..2.5).contains(t)),
        "{failures:?}"
    );
    let back_at = seen("rejoined");
    assert_eq!(back_at.len(), 4, "{failures:?}");
    assert!(
        back_at.iter().all(|t| (2.5..5.0).contains(t)),
        "{failures:?}"
    );
    // Building stops without an EM and starts again with the new one.
    let timeline = v["timeline"].as_array().unwrap();
    let built_in = |from: f64, to: f64| -> Vec<f64> {
        timeline
            .iter()
            .filter(|s| (from..to).contains(&s["t_s"].as_f64().unwrap()))
            .map(|s| s["built_gbps"].as_f64().unwrap())
            .collect()
    };
    let last_back = back_at.iter().copied().fold(0.0, f64::max);
    // (Samples come about every second; the run ends at 6 s.)
    let after = built_in(last_back + 0.5, 5.95);
    assert!(
        !after.is_empty() && after.iter().all(|&g| g > 0.0),
        "nothing built after the new EM took over: {after:?}\n{text}"
    );
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["drain_timed_out"], false, "{text}");
    }
}

/// A node killed (2, at 1 s) and restarted (2.7 s) while the EM is dead
/// (killed at 2.4 s, restarted at 3.8 s), over libfabric (tcp;ofi_rxm):
/// the dead EM had told the BUs node 2's source was gone, and no EM lived
/// to say it was back. The new EM, answered by every node at once (over
/// tcp it loses and takes back each one, which says so), never said it
/// either: the BUs dropped node 2's fragments as unexpected to the end, its
/// own BU built 24 batches in 20 s, and the drain timed out (`evb chaos -t
/// ofi:tcp --seed 52`). And node 2 kept asking the dead EM's address to
/// take it back at every turn, which slowed the whole run after the EM's
/// return to about 60 % of its rate.
#[test]
fn a_node_restarted_while_the_em_is_dead_builds_again_over_ofi_tcp() {
    let (_, text, v) = run_for(
        "restart-while-em-dead-ofi",
        6,
        &[
            "--set",
            "nodes.em=separate",
            "--kill",
            "2@1",
            "--kill",
            "4@2.4",
            "--restart",
            "2@2.7",
            "--restart",
            "4@3.8",
        ],
        Some("ofi:tcp"),
    );
    assert!(text.contains("EM resumed the run at MEP"), "{text}");
    fates(&v, &text);
    // Fragments dropped as unexpected: 0 in 3 runs with the fix, hundreds
    // a second without.
    let unexpected = n(&v, "fragments_unexpected");
    assert!(unexpected < 50, "{unexpected} fragments unexpected\n{text}");
    // Node 2 built from the EM's return about a third of what each other
    // node built over the whole run; without the fix, under 1 %.
    let built = |node: usize| v["nodes"][node]["events_built"].as_u64().unwrap();
    let others = (built(0) + built(1) + built(3)) / 3;
    assert!(
        built(2) * 10 > others,
        "node 2 built {} events, the others {others} each\n{text}",
        built(2)
    );
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["drain_timed_out"], false, "{text}");
    }
}

/// libfabric's shm provider does not take a restarted node back: `--restart`
/// over it is refused before any node starts, with the transports that can.
#[test]
fn a_restart_over_ofi_shm_is_refused() {
    let mut cmd = evb();
    cmd.args([
        "run",
        "--nodes",
        "4",
        "--duration",
        "2",
        "--progress",
        "never",
        "--kill",
        "2@0.5",
        "--restart",
        "2@1",
        "--transport",
        "ofi:shm",
    ]);
    let (out, text) = run_bounded(&mut cmd, "evb run", Duration::from_secs(30));
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("only the tcp, shm, ucx and ofi:tcp transports can rejoin, not `ofi:shm`"),
        "{text}"
    );
}

/// The default transport stays shm when a node is restarted.
#[test]
fn restarts_keep_the_default_shm_transport() {
    let json = scratch_file("fail", "restart-auto.json");
    let mut cmd = evb();
    cmd.args([
        "run",
        "--nodes",
        "3",
        "--duration",
        "4",
        "--progress",
        "never",
        "--kill",
        "2@1",
        "--restart",
        "2@2",
        "--allow-loss",
        "--json",
    ])
    .arg(&json)
    .args(["--set", "source.events_per_mep=1024"]);
    let (out, text) = run_bounded(&mut cmd, "evb run", Duration::from_secs(90));
    assert_eq!(out.status.code(), Some(0), "{text}");
    let v = read_json(&json, &text);
    assert_eq!(v["config"]["transport"]["kind"], "shm", "{text}");
    assert!(text.contains("over shm"), "{text}");
    let generated = n(&v, "events_generated");
    let accounted = n(&v, "events_built")
        + n(&v, "events_incomplete")
        + n(&v, "events_corrupt")
        + n(&v, "events_lost");
    assert_eq!(generated, accounted, "{text}");
    let rejoined = v["summary"]["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["node"] == 2 && f["what"] == "rejoined")
        .count();
    assert_eq!(rejoined, 2, "both survivors see the rejoin: {text}");
    assert!(
        v["nodes"][2]["events_built"].as_u64().unwrap() > 0,
        "{text}"
    );
}

/// What a kill and a restart of node 2 over `transport` must give.
/// `evb run --nodes 4 --duration 8 --progress never FAULTS --json` with
/// 1024 events a MEP, over `transport` (None: the default), bounded in
/// time: its exit, its output and the run JSON (written as `name`.json).
fn run_8s(
    name: &str,
    faults: &[&str],
    transport: Option<&str>,
) -> (std::process::Output, String, Value) {
    run_for(name, 8, faults, transport)
}

/// [`run_8s`] for `seconds`.
fn run_for(
    name: &str,
    seconds: u32,
    faults: &[&str],
    transport: Option<&str>,
) -> (std::process::Output, String, Value) {
    let json = scratch_file("fail", &format!("{name}.json"));
    let started = std::time::Instant::now();
    let mut cmd = evb();
    cmd.args(["run", "--nodes", "4", "--duration"])
        .arg(seconds.to_string())
        .args(["--progress", "never"])
        .args(faults)
        .arg("--json")
        .arg(&json)
        .args(["--set", "source.events_per_mep=1024"]);
    if let Some(t) = transport {
        cmd.args(["--set", &format!("transport.kind={t}")]);
    }
    let (out, text) = run_bounded(&mut cmd, "evb run", Duration::from_secs(120));
    assert!(started.elapsed() < Duration::from_secs(40), "{text}");
    let v = read_json(&json, &text);
    (out, text, v)
}

fn check_restart(transport: &str) {
    check_restart_noticed_within(transport, 1.0);
}

/// `check_restart`, every survivor noticing the death within `notice_s`.
fn check_restart_noticed_within(transport: &str, notice_s: f64) {
    let (out, text, v) = run_8s(
        &format!("restart-{transport}"),
        &["--kill", "2@1.5", "--restart", "2@3"],
        Some(transport),
    );
    assert!(text.contains(&format!("over {transport}")), "{text}");
    // Events of the dead incarnation's unfinished MEPs are lost: a failure.
    assert_eq!(out.status.code(), Some(1), "{text}");
    // The restarted node reported: nobody is missing at the end.
    assert_eq!(
        v["summary"]["nodes_missing"],
        serde_json::json!([]),
        "{text}"
    );
    check_exact_accounting(&v, &text, DEFAULT_CREDITS);
    let failures = v["summary"]["failures"].as_array().unwrap().clone();
    // The death is seen by every survivor within `notice_s` (a second).
    let seen: Vec<f64> = failures
        .iter()
        .filter(|f| f["node"] == 2 && f["seen_by"] != "launcher")
        .filter(|f| f["what"].as_str().unwrap().starts_with("lost"))
        .map(|f| f["at_s"].as_f64().unwrap())
        .collect();
    assert_eq!(seen.len(), 3, "every survivor notices: {failures:?}");
    assert!(
        seen.iter().all(|t| *t - 1.5 < notice_s && *t >= 1.45),
        "{failures:?}"
    );
    assert!(failures
        .iter()
        .any(|f| f["seen_by"] == "launcher" && f["what"].as_str().unwrap().contains("restarted")));
    // Every survivor records the rejoin, after the restart.
    let rejoined: Vec<f64> = failures
        .iter()
        .filter(|f| f["node"] == 2 && f["what"] == "rejoined")
        .map(|f| f["at_s"].as_f64().unwrap())
        .collect();
    assert_eq!(
        rejoined.len(),
        3,
        "every survivor sees the rejoin: {failures:?}"
    );
    let rejoin_at = rejoined.iter().copied().fold(0.0, f64::max);
    assert!(
        rejoined.iter().all(|&t| t >= 3.0) && rejoin_at < 6.0,
        "{failures:?}"
    );
    assert!(text.contains("rejoined"), "printed in the summary: {text}");
    // The new incarnation reported, and built events (all after it rejoined).
    let node2 = &v["nodes"][2];
    assert_eq!(node2["restarted"], true, "{node2}");
    let built2 = node2["events_built"].as_u64().unwrap();
    assert!(built2 > 0, "node 2 built nothing after the rejoin: {text}");
    assert_eq!(node2["events_incomplete"], 0, "{text}");
    // It appears in the timeline too: node 2 builds in the samples after
    // the rejoin, and it built nothing while it was dead.
    let timeline = v["timeline"].as_array().unwrap();
    let node2_gbps = |from: f64, to: f64| -> Vec<f64> {
        timeline
            .iter()
            .filter(|s| (from..to).contains(&s["t_s"].as_f64().unwrap()))
            .map(|s| s["node_built_gbps"][2].as_f64().unwrap())
            .collect()
    };
    let dead = node2_gbps(2.6, 3.0 + 0.05);
    assert!(
        dead.iter().all(|&g| g == 0.0),
        "dead yet building? {dead:?}"
    );
    let after = node2_gbps(rejoin_at + 1.0, 7.9);
    assert!(
        !after.is_empty() && after.iter().all(|&g| g > 0.0),
        "node 2 does not build after the rejoin: {after:?}\n{text}"
    );
    // Measured, not asserted: on a small shared machine three processes
    // may well build faster than four.
    let mean = |from: f64, to: f64| -> f64 {
        let g: Vec<f64> = timeline
            .iter()
            .filter(|s| (from..to).contains(&s["t_s"].as_f64().unwrap()))
            .map(|s| s["built_gbps"].as_f64().unwrap())
            .collect();
        g.iter().sum::<f64>() / g.len().max(1) as f64
    };
    eprintln!(
        "{transport}: built Gb/s, mean of 1 s samples: while node 2 was dead (2.5-3.05 s) {:.2}; after its rejoin ({:.1}-7.9 s) {:.2}; node 2 alone after: {after:?}",
        mean(2.5, 3.05),
        rejoin_at + 1.0,
        mean(rejoin_at + 1.0, 7.9)
    );
    // The survivors and the new incarnation finished normally.
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["drain_timed_out"], false, "{text}");
    }
}

/// The summary's (generated, built, incomplete, corrupt, lost) events,
/// checked to add up: every generated event has exactly one fate.
fn fates(v: &Value, text: &str) -> (u64, u64, u64, u64, u64) {
    let generated = n(v, "events_generated");
    let (built, incomplete, corrupt, lost) = (
        n(v, "events_built"),
        n(v, "events_incomplete"),
        n(v, "events_corrupt"),
        n(v, "events_lost"),
    );
    assert_eq!(generated, built + incomplete + corrupt + lost, "{text}");
    (generated, built, incomplete, corrupt, lost)
}

/// Every generated event has exactly one fate, and the lost ones are those
/// of MEPs a BU that was declared lost had not finished (at most its
/// `credits` MEPs of 1024 events each, lost or re-assigned).
fn check_exact_accounting(v: &Value, text: &str, credits: u64) {
    let (_, _, _, corrupt, lost) = fates(v, text);
    assert_eq!(lost, n(v, "events_lost_bu_gone"), "{text}");
    assert!(
        lost + n(v, "meps_reassigned") * 1024 <= credits * 1024,
        "at most the lost BU's credits, lost or re-assigned: {text}"
    );
    assert_eq!(corrupt, 0, "{text}");
}

/// A run whose stopped nodes all came back: every node reported, every
/// event has one fate (at most `credits` MEPs of lost BUs lost or
/// re-assigned), and the exit says whether anything was not built.
fn check_every_node_reported(out: &std::process::Output, v: &Value, text: &str, credits: u64) {
    assert_eq!(
        v["summary"]["nodes_missing"],
        serde_json::json!([]),
        "{text}"
    );
    check_exact_accounting(v, text, credits);
    let clean = n(v, "events_generated") == n(v, "events_built");
    assert_eq!(out.status.code(), Some(if clean { 0 } else { 1 }), "{text}");
}

/// Node 2 stopped (SIGSTOP) at 1.5 s and resumed (SIGCONT) at 3.5 s, 8 s
/// in all, over `transport`: the survivors declare it lost by its silence
/// within a second; after the resume the links come back (the survivors
/// and node 2 each report the others' rejoin), the EM re-admits it and it
/// builds again; every event keeps exactly one fate, nothing times out.
fn check_stop_resume(transport: &str) {
    let (out, text, v) = run_8s(
        &format!("resume-{transport}"),
        &["--stop", "2@1.5", "--resume", "2@3.5"],
        Some(transport),
    );
    assert!(text.contains(&format!("over {transport}")), "{text}");
    // Node 2 lived through it and reported.
    check_every_node_reported(&out, &v, &text, DEFAULT_CREDITS);
    check_revocations(&v, &text);
    let failures = v["summary"]["failures"].as_array().unwrap().clone();
    let what = |f: &Value| f["what"].as_str().unwrap().to_string();
    assert!(
        failures.iter().any(|f| f["node"] == 2
            && f["seen_by"] == "launcher"
            && what(f) == "resumed (SIGCONT)"),
        "{failures:?}"
    );
    // Lost by its silence, seen by every survivor within a second.
    let lost: Vec<f64> = failures
        .iter()
        .filter(|f| f["node"] == 2 && f["seen_by"] != "launcher" && what(f).starts_with("lost"))
        .map(|f| f["at_s"].as_f64().unwrap())
        .collect();
    assert_eq!(lost.len(), 3, "every survivor notices: {failures:?}");
    assert!(
        failures
            .iter()
            .filter(|f| f["node"] == 2 && what(f).starts_with("lost"))
            .all(|f| what(f).contains("silent")),
        "{failures:?}"
    );
    // Within a second over shm and tcp. Over the message engines (ucx,
    // ofi) once, with other test runs sharing the 2 cores, a survivor took
    // longer (not seen in 22 runs alone or beside one other run): there,
    // before the resume.
    let detection = if ["shm", "tcp"].contains(&transport) {
        1.0
    } else {
        2.1
    };
    assert!(
        lost.iter().all(|t| *t >= 1.5 && *t - 1.5 < detection),
        "{failures:?}"
    );
    // After the resume, every survivor sees node 2 rejoin, and node 2 sees
    // each of them rejoin, within a second and a half.
    for peer in [0, 1, 3] {
        for (node, seen_by) in [(2, format!("node {peer}")), (peer, "node 2".to_string())] {
            let back: Vec<f64> = failures
                .iter()
                .filter(|f| f["node"] == node && f["seen_by"] == *seen_by && what(f) == "rejoined")
                .map(|f| f["at_s"].as_f64().unwrap())
                .collect();
            assert_eq!(back.len(), 1, "node {node} seen by {seen_by}: {failures:?}");
            assert!(
                back[0] >= 3.5 && back[0] < 5.0,
                "node {node} rejoined at {} s: {failures:?}",
                back[0]
            );
        }
    }
    assert!(text.contains("rejoined"), "printed in the summary: {text}");
    // Node 2 built nothing while stopped, and builds again after.
    let timeline = v["timeline"].as_array().unwrap();
    let node2 = |from: f64, to: f64| -> Vec<f64> {
        timeline
            .iter()
            .filter(|s| (from..to).contains(&s["t_s"].as_f64().unwrap()))
            .map(|s| s["node_built_gbps"][2].as_f64().unwrap())
            .collect()
    };
    let stopped = node2(2.6, 3.5);
    assert!(
        stopped.iter().all(|&g| g == 0.0),
        "stopped yet building? {stopped:?}"
    );
    let after = node2(4.5, 9.0);
    assert!(
        after.iter().sum::<f64>() > 1.0,
        "node 2 does not build after the resume: {after:?}\n{text}"
    );
    eprintln!(
        "{transport}: node 2 built Gb/s per 1 s sample: {:?}; generated {} = built {} + incomplete {} + lost {}",
        node2(0.0, 9.0),
        n(&v, "events_generated"),
        n(&v, "events_built"),
        n(&v, "events_incomplete"),
        n(&v, "events_lost")
    );
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["drain_timed_out"], false, "{text}");
    }
}

/// Node 2 was lost to the EM while alive (stopped past the peer timeout):
/// the EM took its unfinished MEPs (at most its credits) and named them to
/// it when it took it back (`Revoked`). Each MEP is counted by one BU: the
/// BUs' fates add up to the EM's, the revoked batches are in none of node
/// 2's counts (fates, latency, missing sources), and the run JSON has the
/// revocations, summed.
fn check_revocations(v: &Value, text: &str) {
    let nodes = v["nodes"].as_array().unwrap();
    let node = |i: usize, k: &str| nodes[i][k].as_u64().unwrap_or(0);
    let sum = |k: &str| (0..nodes.len()).map(|i| node(i, k)).sum::<u64>();
    let (revoked, taken) = (n(v, "batches_revoked"), n(v, "meps_revoked"));
    assert_eq!(revoked, sum("batches_revoked"), "{text}");
    assert_eq!(taken, sum("em_meps_revoked"), "{text}");
    assert!(
        (1..=DEFAULT_CREDITS).contains(&taken) && revoked <= taken,
        "revoked {revoked} of {taken} taken: {text}"
    );
    assert_eq!(revoked, node(2, "batches_revoked"), "{text}");
    for k in ["built", "incomplete", "corrupt"] {
        assert_eq!(
            sum(&format!("events_{k}")),
            sum(&format!("em_meps_{k}")) * 1024,
            "the BUs' {k} against the EM's: {text}"
        );
    }
    for (i, r) in nodes.iter().enumerate() {
        let missing: u64 = r["missing_by_source"]
            .as_array()
            .map_or(0, |m| m.iter().map(|x| x.as_u64().unwrap()).sum());
        let incomplete = node(i, "batches_incomplete");
        assert_eq!(
            r["latency_ns"]["count"].as_u64().unwrap(),
            node(i, "batches_built"),
            "node {i}: a latency for each batch built: {text}"
        );
        assert!(
            missing >= incomplete && (incomplete > 0 || missing == 0),
            "node {i}: {missing} sources missing from {incomplete} incomplete batches: {text}"
        );
    }
}

/// Over shared memory (the default): the survivors ask node 2, through
/// their join slots in its inbox, to re-establish the links; it takes the
/// requests when it runs again, drops what the old links left in its
/// rings and answers with where its new writes start.
#[test]
fn a_stopped_node_resumes_and_relinks_over_shm() {
    check_stop_resume("shm");
}

/// The same over TCP: the lower id re-dials with backoff.
#[test]
fn a_stopped_node_resumes_and_relinks_over_tcp() {
    check_stop_resume("tcp");
}

/// The same over UCX (tcp): the higher rank of each pair asks for the
/// link again with a RELINK from a new UCP endpoint, under a new epoch for
/// the peer's messages; the lower answers, and both drop whatever the old
/// link still delivers.
#[test]
fn a_stopped_node_resumes_and_relinks_over_ucx() {
    check_stop_resume("ucx:tcp");
}

/// The same over libfabric (tcp;ofi_rxm): a RELINK to the peer's address
/// added again.
#[test]
fn a_stopped_node_resumes_and_relinks_over_ofi_tcp() {
    check_stop_resume("ofi:tcp");
}

/// `--resume` of a node that does not exist, or that was not stopped
/// before, is refused before any node starts, naming it.
#[test]
fn a_bad_resume_is_refused() {
    for (args, expected) in [
        (
            &["--stop", "7@1", "--resume", "7@2"][..],
            "--stop 7@1: there is no node 7 (the run has nodes 0 to 3)",
        ),
        (
            &["--resume", "2@1"][..],
            "--resume 2@1: resume a node stopped earlier with --stop",
        ),
        (
            &["--stop", "2@2", "--resume", "2@1"][..],
            "--resume 2@1: resume a node stopped earlier with --stop",
        ),
    ] {
        let mut cmd = evb();
        cmd.args([
            "run",
            "--nodes",
            "4",
            "--duration",
            "1",
            "--progress",
            "never",
        ])
        .args(args);
        let started = std::time::Instant::now();
        let (out, text) = run_bounded(&mut cmd, "evb run", Duration::from_secs(30));
        // 2: a usage error (1 would be a run that lost events).
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(text.contains(expected), "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused at once: {text}"
        );
    }
}

/// Two stops that overlap over shm: node 2 stopped 1.5-3.5 s, node 3
/// 3-5 s. When node 2 resumes it takes node 3's request (node 3 asked
/// before it was stopped) and then loses node 3 again by its silence, and
/// asks anew; when node 3 resumes, the answer it finds is for a link node 2
/// has given up already: it goes straight to the newer one. Every loss of
/// a link is followed by its rejoin, node 3 sees node 2 come back once, and
/// every event keeps exactly one fate.
#[test]
fn overlapping_stops_relink_every_link_over_shm() {
    // 10 s: "at the end" is then three 1 s samples after 6.5 s, not one.
    // (With 8 s, a rejoined node's first batches timing out, fixed since in
    // ReadoutUnit::on_bu_joined, once left that one sample empty.)
    let (out, text, v) = run_for(
        "resume-overlap",
        10,
        &[
            "--stop", "2@1.5", "--resume", "2@3.5", "--stop", "3@3", "--resume", "3@5",
        ],
        None,
    );
    // Two BUs lost once each (by the EM), their credits each.
    check_every_node_reported(&out, &v, &text, 2 * DEFAULT_CREDITS);
    let failures = v["summary"]["failures"].as_array().unwrap().clone();
    let events = |node: u64, seen_by: u64| -> Vec<(f64, bool)> {
        failures
            .iter()
            .filter(|f| f["node"] == node && f["seen_by"] == format!("node {seen_by}"))
            .map(|f| {
                let what = f["what"].as_str().unwrap();
                assert!(what.starts_with("lost") || what == "rejoined", "{f}");
                (f["at_s"].as_f64().unwrap(), what == "rejoined")
            })
            .collect()
    };
    for seen_by in 0..4u64 {
        for node in (0..4u64).filter(|&x| x != seen_by) {
            // Alternating: lost, rejoined, lost, rejoined...
            let e = events(node, seen_by);
            for (k, (_, rejoined)) in e.iter().enumerate() {
                assert_eq!(
                    *rejoined,
                    k % 2 == 1,
                    "node {node} seen by node {seen_by}: {e:?}\n{failures:?}"
                );
            }
            assert!(
                e.len() % 2 == 0,
                "node {node} seen by node {seen_by} ends lost: {e:?}\n{failures:?}"
            );
        }
    }
    // Stopped nodes are lost by the others; the links come back.
    for (node, by) in [(2, 0), (2, 1), (3, 0), (3, 1)] {
        assert_eq!(events(node, by).len(), 2, "{failures:?}");
    }
    let back = events(2, 3);
    assert_eq!(back.len(), 2, "node 3 sees node 2 rejoin once: {back:?}");
    assert!(back[1].0 >= 5.0 && back[1].0 < 6.5, "{back:?}");
    // Everyone builds at the end.
    let timeline = v["timeline"].as_array().unwrap();
    for node in 0..4 {
        let late: f64 = timeline
            .iter()
            .filter(|s| s["t_s"].as_f64().unwrap() > 6.5)
            .map(|s| s["node_built_gbps"][node].as_f64().unwrap())
            .sum();
        assert!(late > 0.0, "node {node} builds nothing at the end: {text}");
    }
    for node in v["nodes"].as_array().unwrap() {
        assert_eq!(node["drain_timed_out"], false, "{text}");
    }
}
