//! The output stage end to end: `evb run --consumers M` starts M Filter
//! Unit processes next to the nodes; every built batch must be delivered
//! over real TCP, verified and consumed exactly once. Slow consumers must
//! slow the builder down (the EM stalls for credit), never lose a batch.
//! `evb sim` must model the same stage with consumers as fabric hosts.
//! With an output network (`output.bind`, `output.interface`,
//! `output.addresses`) the deliveries take the second network: on
//! loopback addresses under `evb run`, and between real hosts (network
//! namespaces with two links each) under `evb node`, where the interface
//! counters show which link carried what.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use evb_testkit::json::{f64_at as f, u64_at as u};
use evb_testkit::netns::{dev_bytes, Lab};
use evb_testkit::scratch::scratch_file;
use evb_testkit::{evb_path_str, final_report, read_json, run_bounded, wait_all};
use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    scratch_file("fu-test", name)
}

/// Runs `evb` with `args`, killed after `limit`; returns (exit code, output).
fn evb(args: &[&str], limit: Duration) -> (i32, String) {
    let (out, text) = run_bounded(evb_testkit::evb().args(args), "evb", limit);
    (out.status.code().unwrap_or(-1), text)
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

/// `evb run` with the output network on a second loopback address: the
/// event building stays on 127.0.0.1 (transport.bind), every BU's link to
/// each consumer runs from and to 127.0.0.2, as the reports say, and the
/// accounting is exact; the summary names the network and gives the
/// figures per producer and per consumer.
#[test]
fn evb_run_delivers_over_the_output_network_address() {
    let (code, v, output) = run_with_consumers("outnet", &["output.bind=127.0.0.2"]);
    assert_eq!(code, 0, "{output}");
    check_exact(&v, &output);
    assert_eq!(
        v["config"]["transport"]["kind"], "tcp",
        "auto is tcp with an output network"
    );
    let c = &v["summary"]["consumers"];
    assert_eq!(c["network"], "output", "{c}");
    assert_eq!(u(c, "producers"), 4);
    assert!(
        output.contains(
            "deliveries over the output network (producers at 127.0.0.2, consumers at 127.0.0.2)"
        ),
        "{output}"
    );
    let nodes = v["nodes"].as_array().unwrap();
    for n in &nodes[..4] {
        let o = &n["output_network"];
        assert!(
            o["address"].as_str().unwrap().starts_with("127.0.0.2:"),
            "{n}"
        );
        let links = o["links"].as_array().unwrap();
        let peers: Vec<u64> = links.iter().map(|l| u(l, "peer")).collect();
        assert_eq!(
            peers,
            [4, 5],
            "a node's output links are its consumers: {o}"
        );
        for l in links {
            assert!(
                l["local"].as_str().unwrap().starts_with("127.0.0.2:"),
                "{l}"
            );
            assert!(
                l["remote"].as_str().unwrap().starts_with("127.0.0.2:"),
                "{l}"
            );
        }
    }
    for n in &nodes[4..] {
        // A consumer's every link runs on the output network.
        assert_eq!(
            n["output_network"]["links"].as_array().unwrap().len(),
            5,
            "{n}"
        );
    }
    // Per producer and per consumer: the aggregates over their number,
    // and each one's own figure adds up to the aggregate.
    let sum = |list: &str, key: &str| -> f64 {
        c[list].as_array().unwrap().iter().map(|p| f(p, key)).sum()
    };
    let (per_p, per_c) = (sum("per_producer", "gbps"), sum("per_consumer", "gbps"));
    assert!(
        (per_p - f(c, "producer_gbps")).abs() < 1e-6 * per_p.max(1.0),
        "{c}"
    );
    assert!(
        (per_c - f(c, "consumer_gbps")).abs() < 1e-6 * per_c.max(1.0),
        "{c}"
    );
    assert!(
        (f(c, "producer_gbps_per_producer") * 4.0 - f(c, "producer_gbps")).abs() < 1e-9,
        "{c}"
    );
    assert!(
        (f(c, "consumer_gbps_per_consumer") * 2.0 - f(c, "consumer_gbps")).abs() < 1e-9,
        "{c}"
    );
    assert_eq!(sum("per_producer", "batches"), MEPS as f64);
    // Without the output network, the summary says the deliveries shared
    // the event-building links.
    let (code, v, output) = run_with_consumers("no-outnet", &[]);
    assert_eq!(code, 0, "{output}");
    assert_eq!(v["summary"]["consumers"]["network"], "event-building");
    assert!(v["nodes"][0].get("output_network").is_none());
}

/// Bad output-network settings stop `evb run` before anything runs, with
/// the key named.
#[test]
fn bad_output_network_settings_name_their_key() {
    for (set, expect) in [
        (
            "output.bind=10.0.0.300",
            "key `output.bind`: `10.0.0.300` is not an IP address",
        ),
        (
            "output.interface=evbnope0",
            "output.interface: there is no interface `evbnope0`",
        ),
        (
            "output.bind=0.0.0.0",
            "output.bind: 0.0.0.0 is no address a peer can dial",
        ),
        (
            "output.addresses=[\"10.0.0.1\"]",
            "key `output.addresses`: entry 0, `10.0.0.1`, is not host:port",
        ),
    ] {
        let (code, output) = evb(
            &[
                "run",
                "-n",
                "2",
                "--consumers",
                "1",
                "-d",
                "1",
                "--progress",
                "never",
                "--set",
                set,
            ],
            Duration::from_secs(60),
        );
        assert_eq!(code, 2, "{set}: {output}");
        assert!(output.contains(expect), "{set}: {output}");
    }
    let (code, output) = evb(
        &[
            "run",
            "-n",
            "2",
            "--consumers",
            "1",
            "-t",
            "shm",
            "--set",
            "output.bind=127.0.0.2",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, 2, "{output}");
    assert!(output.contains("key `transport.kind`"), "{output}");
}

/// How the ranks of the namespace test learn where the others are.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Launch {
    /// As under mpirun (OpenMPI's rank variables, a rendezvous directory),
    /// with one output setting for every host: `output.interface = "out0"`.
    LauncherInterface,
    /// `evb node --rank R` with every address in the configuration:
    /// `transport.addresses` and `output.addresses`.
    ConfigAddresses,
}

const NS_MEPS: u64 = 300;

/// The runs of [`run_in_namespaces`]: each rank's final report and the
/// byte counters (rx, tx) of its `eb0` (nodes only) and `out0` links
/// over the run.
struct LabRun {
    reports: Vec<Value>,
    eb: Vec<(u64, u64)>,
    out: Vec<(u64, u64)>,
    stderr: String,
}

/// Two builder nodes (ranks 0 and 1, RU+BU, the EM on 0) and two consumers
/// (ranks 2 and 3), each in a network namespace of its own. The nodes have
/// two links: `eb0` to the event-building switch (10.81.T.0/24) and `out0`
/// to the output switch (10.82.T.0/24); the consumers only `out0`. Every
/// TCP connection proves a run key.
fn run_in_namespaces(tag: u8, launch: Launch) -> LabRun {
    let mut lab = Lab::new(tag);
    lab.switch("breb");
    lab.switch("brout");
    let hosts: Vec<String> = (0..4)
        .map(|r| {
            let ns = lab.host(&format!("h{r}"));
            if r < 2 {
                lab.link(&ns, "eb0", "breb", &format!("{}/24", eb_ip(tag, r)));
            }
            lab.link(&ns, "out0", "brout", &format!("{}/24", out_ip(tag, r)));
            ns
        })
        .collect();
    let counters = |dev: &str, ranks: std::ops::Range<usize>| -> Vec<(u64, u64)> {
        ranks.map(|r| dev_bytes(&hosts[r], dev)).collect()
    };
    let (eb0, out0) = (counters("eb0", 0..2), counters("out0", 0..4));
    let rdv = tmp(&format!("rdv-{tag}"));
    let _ = std::fs::remove_dir_all(&rdv);
    std::fs::create_dir_all(&rdv).unwrap();
    let children: Vec<_> = (0..4)
        .map(|r| {
            lab_node(r, &hosts[r], tag, launch, &rdv)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs = wait_all(children, Duration::from_secs(90));
    let stderr: String = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).to_string())
        .collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r} failed: {stderr}");
    }
    let delta = |before: Vec<(u64, u64)>, after: Vec<(u64, u64)>| -> Vec<(u64, u64)> {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| (a.0 - b.0, a.1 - b.1))
            .collect()
    };
    let run = LabRun {
        reports: outs.iter().map(final_report).collect(),
        eb: delta(eb0, counters("eb0", 0..2)),
        out: delta(out0, counters("out0", 0..4)),
        stderr,
    };
    let _ = std::fs::remove_dir_all(&rdv);
    run
}

/// Rank `r`'s address on the event-building switch of lab `tag`.
fn eb_ip(tag: u8, r: usize) -> String {
    format!("10.81.{tag}.{}", r + 1)
}

/// Rank `r`'s address on the output switch of lab `tag`.
fn out_ip(tag: u8, r: usize) -> String {
    format!("10.82.{tag}.{}", r + 1)
}

/// `evb node` as rank `r` in namespace `ns`, learning where the others are
/// as `launch` says (`rdv`: the rendezvous directory under a launcher).
fn lab_node(r: usize, ns: &str, tag: u8, launch: Launch, rdv: &Path) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, evb_path_str(), "node"]);
    let mut sets: Vec<String> = [
        "transport.kind=tcp",
        "nodes.count=2",
        "output.consumers=2",
        "run.duration_s=0",
        "source.events_per_mep=1024",
    ]
    .map(String::from)
    .to_vec();
    sets.push(format!("run.max_meps={NS_MEPS}"));
    // The consumers have no event-building link: they listen on
    // loopback for it, and no one dials them there.
    sets.push(format!(
        "transport.bind={}",
        if r < 2 {
            eb_ip(tag, r)
        } else {
            "127.0.0.1".into()
        }
    ));
    match launch {
        Launch::LauncherInterface => {
            cmd.args(["--control", "launcher", "--rendezvous"])
                .arg(rdv)
                .env("OMPI_COMM_WORLD_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "4");
            sets.push("output.interface=out0".into());
        }
        Launch::ConfigAddresses => {
            cmd.args(["--rank", &r.to_string()]);
            let list = |addr: &dyn Fn(usize) -> String| {
                let a: Vec<String> = (0..4).map(|p| format!("\"{}\"", addr(p))).collect();
                format!("[{}]", a.join(", "))
            };
            sets.push(format!(
                "transport.addresses={}",
                list(&|p| if p < 2 {
                    format!("{}:7100", eb_ip(tag, p))
                } else {
                    "127.0.0.1:7100".into()
                })
            ));
            sets.push(format!(
                "output.addresses={}",
                list(&|p| format!("{}:7200", out_ip(tag, p)))
            ));
        }
    }
    for s in &sets {
        cmd.args(["--set", s]);
    }
    cmd.env(
        "EVB_RUN_KEY",
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    );
    cmd
}

/// Every batch consumed exactly once; the deliveries on the output links,
/// the fragments on the event-building links, by the interface counters.
fn check_lab(run: &LabRun, tag: u8) {
    let (r, stderr) = (&run.reports, &run.stderr);
    let em = &r[0];
    assert_eq!(u(em, "meps_assigned"), NS_MEPS, "{stderr}");
    assert_eq!(u(em, "em_meps_built"), NS_MEPS, "{em}");
    let sum =
        |ranks: std::ops::Range<usize>, key: &str| -> u64 { ranks.map(|i| u(&r[i], key)).sum() };
    // Exactly once: every built batch delivered once, consumed once,
    // confirmed once; nothing unexpected, corrupt or delivered again.
    assert_eq!(sum(0..2, "batches_built"), NS_MEPS);
    assert_eq!(sum(0..2, "batches_delivered"), NS_MEPS);
    assert_eq!(sum(2..4, "batches_consumed"), NS_MEPS);
    assert_eq!(sum(0..2, "batches_redelivered"), 0);
    let confirmed: u64 = r[..2]
        .iter()
        .flat_map(|n| n["batches_confirmed"].as_array().unwrap().iter())
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert_eq!(confirmed, NS_MEPS);
    assert_eq!(sum(2..4, "bytes_consumed"), sum(0..2, "bytes_delivered"));
    for c in &r[2..] {
        assert_eq!(u(c, "deliveries_unexpected"), 0, "{c}");
        assert_eq!(u(c, "batches_consumed_corrupt"), 0, "{c}");
        assert!(u(c, "batches_consumed") > 0, "both consumers get work: {c}");
    }
    // The reports: every output link between 10.82.T addresses.
    let out_net = format!("10.82.{tag}.");
    for (i, n) in r.iter().enumerate() {
        let o = &n["output_network"];
        assert!(o["address"].as_str().unwrap().starts_with(&out_net), "{o}");
        let links = o["links"].as_array().unwrap();
        assert_eq!(links.len(), if i < 2 { 2 } else { 3 }, "rank {i}: {o}");
        for l in links {
            assert!(l["local"].as_str().unwrap().starts_with(&out_net), "{l}");
            assert!(l["remote"].as_str().unwrap().starts_with(&out_net), "{l}");
        }
    }
    // The counters. Delivered D and fragments sent S (each RU's, its
    // own BU's included) are about equal. Half the fragment bytes cross
    // between the two nodes whatever the balance of the BUs (node 1's BU
    // takes node 0's fragment of its MEPs and the other way round). With
    // TCP/IP headers (~5 % at 1500 bytes), ACKs and heartbeats: at most
    // 10 % and 4 MB more. Had the deliveries taken eb0, it would carry
    // about 1.5 S.
    let d = sum(0..2, "bytes_delivered");
    let s = sum(0..2, "bytes_sent");
    let mb = 1u64 << 20;
    let eb_tx: u64 = run.eb.iter().map(|c| c.1).sum();
    let out_tx: u64 = run.out[..2].iter().map(|c| c.1).sum();
    let out_rx_consumers: u64 = run.out[2..].iter().map(|c| c.0).sum();
    for (i, (n, (_, tx))) in r.iter().zip(&run.out).enumerate().take(2) {
        let delivered = u(n, "bytes_delivered");
        assert!(
            *tx >= delivered,
            "node {i} delivered {delivered} B but sent {tx} B on out0"
        );
    }
    for (i, (n, (rx, _))) in r.iter().zip(&run.out).enumerate().skip(2) {
        let consumed = u(n, "bytes_consumed");
        assert!(
            *rx >= consumed,
            "consumer {i}: {consumed} B consumed, {rx} B received on out0"
        );
    }
    assert!(
        out_tx <= d + d / 10 + 4 * mb,
        "out0 carried more than the deliveries: {out_tx} B for {d} B"
    );
    assert!(
        out_rx_consumers <= d + d / 10 + 4 * mb,
        "the consumers received {out_rx_consumers} B for {d} B delivered"
    );
    assert!(
        eb_tx >= s * 2 / 5 && eb_tx <= s / 2 + s / 10 + 4 * mb,
        "eb0 carried {eb_tx} B for {s} B of fragments (half of them cross)"
    );
    eprintln!(
        "namespaces {tag}: delivered {d} B, fragments {s} B; nodes' out0 tx {out_tx} B ({:.3} of D), \
         consumers' out0 rx {out_rx_consumers} B ({:.3} of D), eb0 tx {eb_tx} B ({:.3} of S)",
        out_tx as f64 / d as f64,
        out_rx_consumers as f64 / d as f64,
        eb_tx as f64 / s as f64
    );
}

/// Real hosts launched as under mpirun, one output setting for all:
/// `output.interface = "out0"`.
#[test]
fn namespaces_deliver_over_the_output_interface_under_a_launcher() {
    let run = run_in_namespaces(1, Launch::LauncherInterface);
    check_lab(&run, 1);
}

/// Real hosts started with `evb node --rank`, every address in the
/// configuration (`transport.addresses`, `output.addresses`).
#[test]
fn namespaces_deliver_over_the_output_addresses_given_in_the_config() {
    let run = run_in_namespaces(2, Launch::ConfigAddresses);
    check_lab(&run, 2);
}
