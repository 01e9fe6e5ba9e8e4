//! Network faults between real hosts: two `evb node` processes in their own
//! network namespaces, joined by a veth pair, while the link drops packets
//! (nftables, random 20 %), is rate-limited (tbf), goes down briefly, or
//! goes down for longer than the peer timeout. The accounting must stay
//! exact every time: every MEP the EM assigned is built, incomplete, corrupt
//! or lost with its BU, and nothing is both or neither. After an outage
//! longer than the peer timeout, the lower id re-dials (with backoff) and the
//! peers rejoin: traffic resumes. Over UCX (tcp) the same long outage
//! ends in a relink: the higher rank asks for the link again until it is
//! back, and the same over libfabric (tcp;ofi_rxm).
//! (The kernel here has no netem, so delay is rate-limit queueing.)

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use evb_testkit::netns::sh;
use evb_testkit::process::Running;
use evb_testkit::{evb_path_str, final_report};

use serde_json::Value;

/// The event builder both nodes run, whatever the transport.
const RUN_SETTINGS: [&str; 3] = [
    "nodes.count=2",
    "source.events_per_mep=64",
    "event_builder.batch_timeout_ms=1500",
];

/// Two namespaces joined by a veth pair; removed on drop.
struct Hosts {
    a: String,
    b: String,
    dev_a: String,
    ip_a: String,
    ip_b: String,
}

impl Hosts {
    fn new(tag: u8) -> Hosts {
        let id = std::process::id() % 10000;
        let h = Hosts {
            a: format!("evb{id}{tag}a"),
            b: format!("evb{id}{tag}b"),
            dev_a: format!("v{id}{tag}a"),
            ip_a: format!("10.78.{tag}.1"),
            ip_b: format!("10.78.{tag}.2"),
        };
        let dev_b = format!("v{id}{tag}b");
        sh(None, &["ip", "netns", "add", &h.a]);
        sh(None, &["ip", "netns", "add", &h.b]);
        sh(
            None,
            &[
                "ip", "link", "add", &h.dev_a, "type", "veth", "peer", "name", &dev_b,
            ],
        );
        sh(None, &["ip", "link", "set", &h.dev_a, "netns", &h.a]);
        sh(None, &["ip", "link", "set", &dev_b, "netns", &h.b]);
        sh(
            Some(&h.a),
            &[
                "ip",
                "addr",
                "add",
                &format!("{}/24", h.ip_a),
                "dev",
                &h.dev_a,
            ],
        );
        sh(
            Some(&h.b),
            &[
                "ip",
                "addr",
                "add",
                &format!("{}/24", h.ip_b),
                "dev",
                &dev_b,
            ],
        );
        for (ns, dev) in [(&h.a, &h.dev_a), (&h.b, &dev_b)] {
            sh(Some(ns), &["ip", "link", "set", dev, "up"]);
            sh(Some(ns), &["ip", "link", "set", "lo", "up"]);
        }
        h
    }

    /// Rank `rank` of a 2-rank job as under `mpirun` (rank and size in
    /// OpenMPI's variables), peers found through the rendezvous directory
    /// `rdv` (both namespaces see the same files), over `transport`.
    fn spawn_launched(
        &self,
        rank: u16,
        rdv: &std::path::Path,
        transport: &str,
        sets: &[String],
    ) -> Child {
        let ns = if rank == 0 { &self.a } else { &self.b };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, evb_path_str(), "node"])
            .args(["--control", "launcher", "--rendezvous"])
            .arg(rdv);
        let kind = format!("transport.kind=\"{transport}\"");
        for s in [kind.as_str()]
            .into_iter()
            .chain(RUN_SETTINGS)
            .chain(sets.iter().map(String::as_str))
        {
            cmd.args(["--set", s]);
        }
        cmd.env("OMPI_COMM_WORLD_RANK", rank.to_string())
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("UCX_LOG_LEVEL", "error")
            .env("EVB_STATS_LINES", "1")
            .env_remove("EVB_RUN_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn spawn(&self, rank: u16, sets: &[String]) -> Child {
        let ns = if rank == 0 { &self.a } else { &self.b };
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            ns,
            evb_path_str(),
            "node",
            "--rank",
            &rank.to_string(),
        ]);
        let addresses = format!(
            "transport.addresses=[\"{}:7100\", \"{}:7100\"]",
            self.ip_a, self.ip_b
        );
        for s in [addresses.as_str(), "transport.bind=0.0.0.0"]
            .into_iter()
            .chain(RUN_SETTINGS)
            .chain(sets.iter().map(String::as_str))
        {
            cmd.args(["--set", s]);
        }
        cmd.env_remove("EVB_RUN_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).status();
    }
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Runs both nodes for `seconds` while `fault` acts on the link; returns
/// (EM report, node 1 report, both stderr).
fn run_with_fault(
    tag: u8,
    seconds: f64,
    fault: impl FnOnce(&Hosts),
) -> (Value, Option<Value>, String) {
    let (out0, out1) = run_nodes_with_fault(tag, seconds, fault);
    let stderr = both_stderr(&out0, &out1);
    let r1 = String::from_utf8_lossy(&out1.stdout)
        .contains("FINAL ")
        .then(|| final_report(&out1));
    (final_report(&out0), r1, stderr)
}

/// Runs both nodes for `seconds` while `fault` acts on the link; returns
/// the output of node 0 and node 1.
fn run_nodes_with_fault(tag: u8, seconds: f64, fault: impl FnOnce(&Hosts)) -> (Output, Output) {
    let hosts = Hosts::new(tag);
    let sets = vec![format!("run.duration_s={seconds}")];
    let node1 = hosts.spawn(1, &sets);
    let node0 = hosts.spawn(0, &sets);
    let running = watch_nodes(node0, node1);
    std::thread::sleep(Duration::from_millis(700));
    fault(&hosts);
    wait_nodes(running)
}

/// Both nodes' output, read while they run: a node whose stdout pipe
/// fills (64 KiB, a few seconds of STATS lines) blocks on the write and
/// goes silent, which its peer rightly takes for a lost node.
fn watch_nodes(node0: Child, node1: Child) -> Running {
    Running::watch_named(vec![node0, node1], vec!["node 0".into(), "node 1".into()])
}

/// (node 0's output, node 1's output), within 60 s.
fn wait_nodes(running: Running) -> (Output, Output) {
    let [out0, out1]: [Output; 2] = running.wait(Duration::from_secs(60)).try_into().unwrap();
    (out0, out1)
}

/// A node's STATS reports, in order, then its FINAL one.
fn reports(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("STATS ").or(l.strip_prefix("FINAL ")))
        .map(|j| serde_json::from_str(j).unwrap())
        .collect()
}

/// The EM's accounting adds up exactly.
/// Traffic resumed after the rejoin: `node` built events after the report
/// that first shows it. Returns (events built by then, in all).
fn built_by_and_after_rejoin(node: u16, out: &Output, stderr: &str) -> (u64, u64) {
    let all = reports(out);
    let at_rejoin = all
        .iter()
        .find(|r| r["rejoins"].as_array().is_some_and(|a| !a.is_empty()))
        .unwrap_or_else(|| panic!("node {node} never reported the rejoin\n{stderr}"));
    let (before, after) = (
        n(at_rejoin, "events_built"),
        n(all.last().unwrap(), "events_built"),
    );
    assert!(
        after > before + 64 * 20,
        "node {node} built {before} events by the rejoin and {after} in all\n{stderr}"
    );
    (before, after)
}

/// Both nodes' stderr, node 0 first.
fn both_stderr(out0: &Output, out1: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out0.stderr),
        String::from_utf8_lossy(&out1.stderr)
    )
}

/// The EM's MEP fates, for the test's log.
fn em_fates(em: &Value) -> String {
    format!(
        "assigned {} built {} incomplete {} lost {}",
        n(em, "meps_assigned"),
        n(em, "em_meps_built"),
        n(em, "em_meps_incomplete"),
        n(em, "em_meps_lost_bu_gone"),
    )
}

fn assert_exact(em: &Value, stderr: &str) -> u64 {
    let assigned = n(em, "meps_assigned");
    assert!(
        assigned > 20,
        "too few MEPs to mean anything: {assigned}\n{stderr}"
    );
    let accounted = n(em, "em_meps_built")
        + n(em, "em_meps_incomplete")
        + n(em, "em_meps_corrupt")
        + n(em, "em_meps_lost_bu_gone");
    assert_eq!(accounted, assigned, "accounting off\n{em}\n{stderr}");
    assigned
}

#[test]
fn packet_loss_and_rate_limit_lose_nothing() {
    let (em, r1, stderr) = run_with_fault(1, 3.0, |h| {
        sh(Some(&h.a), &["nft", "add", "table", "inet", "evbfault"]);
        sh(
            Some(&h.a),
            &[
                "nft",
                "add",
                "chain",
                "inet",
                "evbfault",
                "out",
                "{ type filter hook output priority 0; }",
            ],
        );
        sh(
            Some(&h.a),
            &[
                "nft", "add", "rule", "inet", "evbfault", "out", "ip", "daddr", &h.ip_b, "numgen",
                "random", "mod", "100", "<", "20", "drop",
            ],
        );
        sh(
            Some(&h.a),
            &[
                "tc", "qdisc", "add", "dev", &h.dev_a, "root", "tbf", "rate", "400mbit", "burst",
                "64kb", "latency", "50ms",
            ],
        );
    });
    let assigned = assert_exact(&em, &stderr);
    assert_eq!(
        n(&em, "em_meps_built"),
        assigned,
        "TCP retransmits: nothing may be lost\n{stderr}"
    );
    assert!(em.get("peers_lost").is_none(), "{em}");
    assert!(r1.is_some());
}

#[test]
fn short_link_outage_loses_nothing() {
    let (em, _, stderr) = run_with_fault(2, 3.0, |h| {
        sh(Some(&h.a), &["ip", "link", "set", &h.dev_a, "down"]);
        std::thread::sleep(Duration::from_millis(400));
        sh(Some(&h.a), &["ip", "link", "set", &h.dev_a, "up"]);
    });
    let assigned = assert_exact(&em, &stderr);
    assert_eq!(
        n(&em, "em_meps_built"),
        assigned,
        "a 400 ms outage is under the peer timeout\n{stderr}"
    );
    assert!(em.get("peers_lost").is_none(), "{em}\n{stderr}");
}

#[test]
fn long_link_outage_is_a_lost_peer_that_rejoins_with_exact_accounting() {
    let (out0, out1) = run_nodes_with_fault(3, 7.0, |h| {
        sh(Some(&h.a), &["ip", "link", "set", &h.dev_a, "down"]);
        std::thread::sleep(Duration::from_millis(2500));
        sh(Some(&h.a), &["ip", "link", "set", &h.dev_a, "up"]);
    });
    let stderr = both_stderr(&out0, &out1);
    let em = final_report(&out0);
    assert_exact(&em, &stderr);
    let lost = em["peers_lost"]
        .as_array()
        .unwrap_or_else(|| panic!("EM did not lose node 1\n{em}\n{stderr}"));
    assert_eq!(lost[0]["peer"], 1);
    assert!(
        lost[0]["reason"].as_str().unwrap().contains("silent"),
        "{lost:?}"
    );
    // The other side lost the EM; it reports it too.
    let r1 = final_report(&out1);
    assert_eq!(r1["peers_lost"][0]["peer"], 0, "{r1}");
    // Something was not built: incomplete or lost with the BU, and counted.
    assert!(
        n(&em, "em_meps_incomplete") + n(&em, "em_meps_lost_bu_gone") > 0,
        "{em}"
    );
    // The link came back: node 0 (the lower id) re-dialed with backoff,
    // and each side saw the other rejoin.
    assert!(
        stderr.contains("evb node 0: reconnected to endpoint 1"),
        "{stderr}"
    );
    assert_eq!(em["rejoins"][0]["peer"], 1, "{em}\n{stderr}");
    assert_eq!(r1["rejoins"][0]["peer"], 0, "{r1}\n{stderr}");
    let outage_s =
        em["rejoins"][0]["at_unix_s"].as_f64().unwrap() - lost[0]["at_unix_s"].as_f64().unwrap();
    assert!(
        outage_s > 1.0 && outage_s < 4.0,
        "rejoined {outage_s} s after the loss\n{stderr}"
    );
    // Traffic resumed: both BUs built events after the rejoin, and the EM
    // counted them.
    for (node, out) in [(0, &out0), (1, &out1)] {
        let (before, after) = built_by_and_after_rejoin(node, out, &stderr);
        assert_eq!(
            final_report(out)["drain_timed_out"],
            false,
            "node {node}\n{stderr}"
        );
        eprintln!("node {node}: {before} events built by the rejoin, {after} in all");
    }
    eprintln!(
        "rejoined {outage_s:.2} s after the loss; EM: {}; {}",
        em_fates(&em),
        stderr
            .lines()
            .find(|l| l.contains("reconnected"))
            .unwrap_or_default()
    );
}

/// The long outage over UCX (tcp): both sides declare the other lost by
/// its silence; node 1 (the higher rank) asks for the link again while the
/// link is down (no endpoint opens: asked again with backoff) and gets it
/// once the link is up; traffic resumes and the accounting is exact.
#[test]
fn long_link_outage_over_ucx_relinks_with_exact_accounting() {
    let stderr = check_long_outage_relinks("ucx:tcp", 4);
    assert!(stderr.contains("trying again with backoff"), "{stderr}");
}

/// The same long outage over libfabric (tcp;ofi_rxm): node 1 adds node 0's
/// address again and asks for the link; traffic resumes, accounting exact.
#[test]
fn long_link_outage_over_ofi_tcp_relinks_with_exact_accounting() {
    check_long_outage_relinks("ofi:tcp", 5);
}

/// Two ranks over `transport` (under `--control launcher`), the link down
/// for 2.5 s: lost both ways by silence, rejoined, building again, exact
/// accounting. Returns both nodes' stderr.
fn check_long_outage_relinks(transport: &str, tag: u8) -> String {
    let hosts = Hosts::new(tag);
    let rdv = std::env::temp_dir().join(format!("evb-netfaults-rdv-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&rdv);
    std::fs::create_dir_all(&rdv).unwrap();
    let sets = vec!["run.duration_s=9".to_string()];
    let node1 = hosts.spawn_launched(1, &rdv, transport, &sets);
    let node0 = hosts.spawn_launched(0, &rdv, transport, &sets);
    let running = watch_nodes(node0, node1);
    std::thread::sleep(Duration::from_millis(1500));
    sh(Some(&hosts.a), &["ip", "link", "set", &hosts.dev_a, "down"]);
    std::thread::sleep(Duration::from_millis(2500));
    sh(Some(&hosts.a), &["ip", "link", "set", &hosts.dev_a, "up"]);
    let (out0, out1) = wait_nodes(running);
    let _ = std::fs::remove_dir_all(&rdv);
    let stderr = both_stderr(&out0, &out1);
    let em = final_report(&out0);
    assert_exact(&em, &stderr);
    let r1 = final_report(&out1);
    for (r, peer) in [(&em, 1), (&r1, 0)] {
        assert_eq!(r["peers_lost"][0]["peer"], peer, "{r}\n{stderr}");
        assert!(
            r["peers_lost"][0]["reason"]
                .as_str()
                .unwrap()
                .contains("silent"),
            "{r}"
        );
        assert_eq!(r["rejoins"][0]["peer"], peer, "{r}\n{stderr}");
        assert_eq!(r["drain_timed_out"], false, "{r}\n{stderr}");
    }
    let outage_s = em["rejoins"][0]["at_unix_s"].as_f64().unwrap()
        - em["peers_lost"][0]["at_unix_s"].as_f64().unwrap();
    assert!(
        outage_s > 1.0 && outage_s < 4.5,
        "rejoined {outage_s} s after the loss\n{stderr}"
    );
    for (node, out) in [(0, &out0), (1, &out1)] {
        built_by_and_after_rejoin(node, out, &stderr);
    }
    eprintln!(
        "{transport}: rejoined {outage_s:.2} s after the loss; EM: {}",
        em_fates(&em)
    );
    stderr
}
