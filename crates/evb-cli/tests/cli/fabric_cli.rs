//! `evb fabric` end to end: every subcommand, every output format, and a
//! production-like dump (default descriptions, a degraded link) whose
//! topology.conf the real slurmctld reads.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use evb_testkit::slurm::Cluster;
use evb_testkit::{evb_path, run_bounded, run_unpanicked};

/// `evb fabric ARGS`, bounded in time (a guard against a hang only);
/// returns (success, stdout, stderr), failing on a panic.
fn evb(args: &[&str]) -> (bool, String, String) {
    run_unpanicked(
        evb_testkit::evb().arg("fabric").args(args),
        "evb fabric",
        Duration::from_secs(600),
    )
}

fn ok(args: &[&str]) -> String {
    let (s, o, e) = evb(args);
    assert!(s, "evb fabric {args:?} failed:\n{o}\n{e}");
    o
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The conflicts of `order` on `topology` routed by `lfts`, as
/// `evb fabric conflicts` writes them to `json_out`.
fn conflicts_with(topology: &str, lfts: &str, order: &str, json_out: &str) -> u64 {
    ok(&[
        "conflicts",
        "--topology",
        topology,
        "--lfts",
        lfts,
        "--order",
        order,
        "--json",
        json_out,
    ]);
    json(Path::new(json_out))["total"]["conflicts"]
        .as_u64()
        .unwrap()
}

#[test]
fn conflicts_outputs() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("c.json");
    let csv = d.path().join("c.csv");
    let svg = d.path().join("c.svg");
    let png = d.path().join("c.png");
    let out = ok(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=36,hosts=540",
        "--routing",
        "ftree",
        "--order",
        "random:5",
        "--json",
        j.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    let v = json(&j);
    let t = &v["total"];
    assert_eq!(t["flows"], 540 * 539);
    assert!(t["conflicts"].as_u64().unwrap() > 0);
    assert!(t["steps_with_conflicts"].as_u64().unwrap() > 0);
    assert!(t["max_link_load"].as_u64().unwrap() >= 2);
    assert_eq!(v["per_step"].as_array().unwrap().len(), 539);
    let worst = &v["worst_links"][0];
    assert!(
        worst["node"].as_str().unwrap().starts_with("leaf")
            || worst["node"].as_str().unwrap().starts_with("spine")
    );
    assert!(
        out.contains("worst links") && out.contains(" port "),
        "{out}"
    );
    let c = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(c.lines().count(), 540);
    assert!(c.starts_with("step,flows,conflicts"));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.contains("<svg") && s.contains("conflicts per step"));
    let p = std::fs::read(&png).unwrap();
    assert_eq!(&p[1..4], b"PNG");
    assert!(p.len() > 10_000);
    // The same fabric in ftree order is conflict-free.
    ok(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=36,hosts=540",
        "--order",
        "ftree",
        "--json",
        j.to_str().unwrap(),
    ]);
    assert_eq!(json(&j)["total"]["conflicts"], 0);
}

#[test]
fn export_then_read_back_and_fix() {
    let d = tempfile::tempdir().unwrap();
    let f = |n: &str| d.path().join(n).to_str().unwrap().to_string();
    let spec = "fat-tree:radix=8,hosts=32";
    ok(&[
        "export",
        "--topology",
        spec,
        "--ibsim",
        &f("net"),
        "--ibnetdiscover",
        &f("ibnd"),
        "--lfts-out",
        &f("lfts"),
        "--routing",
        "minhop",
        "--hostfile",
        &f("hosts"),
        "--slurm",
        &f("topology.conf"),
    ]);
    let net = std::fs::read_to_string(f("net")).unwrap();
    assert!(
        net.contains("Switch\t8 \"S-0002c90200100000\"\t# \"leaf001\"")
            && net.contains("Hca\t1 \"H-0002c90300000002\"\t# \"node001\""),
        "{net}"
    );
    let slurm = std::fs::read_to_string(f("topology.conf")).unwrap();
    assert!(
        slurm.contains("SwitchName=leaf001 Nodes=node[001-004]\n"),
        "{slurm}"
    );
    assert!(
        slurm.contains("SwitchName=spine01 Switches=leaf[001-008]\n"),
        "{slurm}"
    );
    assert_eq!(
        std::fs::read_to_string(f("hosts")).unwrap().lines().count(),
        32
    );
    // Read back the exported files; a bad rank order has conflicts...
    ok(&[
        "export",
        "--topology",
        spec,
        "--hostfile",
        &f("rr"),
        "--order",
        "random:3",
    ]);
    let before = conflicts_with(&f("ibnd"), &f("lfts"), &f("rr"), &f("a.json"));
    assert!(before > 0);
    // ...`route --for-shift` gives tables without them...
    let out = ok(&[
        "route",
        "--for-shift",
        "--topology",
        &f("ibnd"),
        "--order",
        &f("rr"),
        "--out",
        &f("shift.lfts"),
        "--time-limit",
        "4",
    ]);
    let after = conflicts_with(&f("ibnd"), &f("shift.lfts"), &f("rr"), &f("b.json"));
    assert!(after < before, "{out}");
    // ...and `order` finds an order without them for the original tables.
    let out = ok(&[
        "order",
        "--topology",
        &f("ibnd"),
        "--lfts",
        &f("lfts"),
        "--out",
        &f("best"),
        "--time-limit",
        "20",
    ]);
    let best = conflicts_with(&f("ibnd"), &f("lfts"), &f("best"), &f("c.json"));
    assert_eq!(best, 0, "{out}");
}

#[test]
fn oversubscribed_order_explains_why() {
    let d = tempfile::tempdir().unwrap();
    let h = d.path().join("h");
    let out = ok(&[
        "order",
        "--topology",
        "fat-tree:radix=12,hosts=60,oversub=2",
        "--out",
        h.to_str().unwrap(),
        "--time-limit",
        "2",
    ]);
    assert!(
        out.contains("zero conflicts not reached")
            && out.contains("oversubscribed")
            && out.contains("lower bound"),
        "{out}"
    );
}

#[test]
fn what_if_and_errors() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("w.json");
    ok(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=32",
        "--routing",
        "minhop",
        "--remove-link",
        "leaf001:8",
        "--json",
        j.to_str().unwrap(),
    ]);
    assert!(json(&j)["total"]["conflicts"].as_u64().unwrap() > 0);
    ok(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=32",
        "--routing",
        "dmodk",
        "--remove",
        "node005",
        "--swap-cables",
        "leaf001:2,leaf002:2",
    ]);
    // Bad input: error names the file and line, exit status is non-zero.
    let bad = d.path().join("bad.lfts");
    std::fs::write(&bad, "Unicast lids [0-3] of switch Lid 1 guid 0x1 ('x'):\n").unwrap();
    let ibnd = d.path().join("ibnd");
    ok(&[
        "export",
        "--topology",
        "fat-tree:radix=8,hosts=32",
        "--ibnetdiscover",
        ibnd.to_str().unwrap(),
    ]);
    let (s, _, e) = evb(&[
        "conflicts",
        "--topology",
        ibnd.to_str().unwrap(),
        "--lfts",
        bad.to_str().unwrap(),
    ]);
    assert!(!s);
    assert!(e.contains(&format!("{}:1", bad.display())), "{e}");
    let (s, _, e) = evb(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=32",
        "--order",
        "/no/such/file",
    ]);
    assert!(!s && e.contains("/no/such/file"), "{e}");
    let (s, _, e) = evb(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=32",
        "--routing",
        "bogus",
    ]);
    assert!(!s && e.contains("bogus"), "{e}");
}

/// The OpenSM and ibsim tools the test runs (it fails, never skips,
/// without them): the path of ibsim's libumad2sim, which puts OpenSM and
/// the diagnostics on the simulated fabric.
fn umad2sim() -> &'static str {
    for p in [
        "/usr/sbin/opensm",
        "/usr/bin/ibsim",
        "/usr/sbin/ibnetdiscover",
        "/usr/sbin/dump_lfts",
    ] {
        assert!(
            Path::new(p).exists(),
            "{p} missing: install opensm, ibsim-utils, infiniband-diags (scripts/setup.sh)"
        );
    }
    [
        "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so",
        "/usr/lib/aarch64-linux-gnu/umad2sim/libumad2sim.so",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("libumad2sim.so missing: install ibsim-utils (scripts/setup.sh)")
}

/// The command line on files written by the real OpenSM on ibsim: the
/// issue's example command, and tables from `route --for-shift` handed to
/// OpenSM's file engine. Fails (never skips) without opensm/ibsim.
#[test]
fn with_real_opensm_files() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let umad = umad2sim();
    ok(&[
        "export",
        "--topology",
        "fat-tree:radix=12,hosts=60",
        "--ibsim",
        &f("net"),
    ]);
    // One shell script, bounded by `timeout`, cleans up its ibsim.
    let script = format!(
        r#"set -e
export IBSIM_SOCKNAME=evbcli$$ SIM_HOST=H-0002c90300000002 OSM_CACHE_DIR={d} OSM_TMP_DIR={d}
ibsim -s -n {d}/net > {d}/ibsim.log 2>&1 & SIM=$!
trap 'kill $SIM' EXIT INT TERM
for i in $(seq 200); do grep -qs "simulator ready" {d}/ibsim.log && break; sleep 0.05; done
mkdir -p {d}/dump
export LD_PRELOAD={umad}
opensm --once -R ftree -D 0x40 --dump_files_dir {d}/dump -f {d}/osm.log > /dev/null
ibnetdiscover > {d}/topo
unset LD_PRELOAD
{evb} fabric route --for-shift --topology {d}/topo --order random:4 --out {d}/shift.lfts --time-limit 5 > {d}/route.out
export LD_PRELOAD={umad}
opensm --once -R file -U {d}/shift.lfts -f {d}/osm-file.log > /dev/null
dump_lfts > {d}/back.lfts
"#,
        d = dir.display(),
        umad = umad,
        evb = evb_path().display()
    );
    let st = Command::new("timeout")
        .args(["120", "bash", "-c", &script])
        .status()
        .unwrap();
    assert!(st.success(), "OpenSM script failed: see {}", dir.display());
    // The issue's command line.
    ok(&[
        "conflicts",
        "--topology",
        &f("topo"),
        "--lfts",
        &f("dump/opensm-lfts.dump"),
        "--order",
        &f("dump/opensm-ftree-ca-order.dump"),
        "--json",
        &f("a.json"),
    ]);
    let v = json(Path::new(&f("a.json")));
    assert_eq!(
        v["total"]["conflicts"], 0,
        "a full tree in OpenSM's ftree order is conflict-free"
    );
    assert_eq!(v["total"]["flows"], 60 * 59);
    // Tables for a random order, through OpenSM and back, give what evb promised.
    ok(&[
        "conflicts",
        "--topology",
        &f("topo"),
        "--lfts",
        &f("shift.lfts"),
        "--order",
        "random:4",
        "--json",
        &f("b.json"),
    ]);
    ok(&[
        "conflicts",
        "--topology",
        &f("topo"),
        "--lfts",
        &f("back.lfts"),
        "--order",
        "random:4",
        "--json",
        &f("c.json"),
    ]);
    let ftree = conflicts_with(
        &f("topo"),
        &f("dump/opensm-lfts.dump"),
        "random:4",
        &f("d.json"),
    );
    let promised = json(Path::new(&f("b.json")))["total"].clone();
    assert_eq!(json(Path::new(&f("c.json")))["total"], promised);
    assert!(
        promised["conflicts"].as_u64().unwrap() < ftree,
        "for-shift tables should beat ftree on a random order"
    );
}

const HCA_DESC: &str = "MT25408 ConnectX Mellanox Technologies";
const SWITCH_DESC: &str = "Voltaire 4036 - 36 QDR ports switch";

/// An ibnetdiscover dump as a production QDR fabric comes: 14 hosts on 4
/// leaves under 4 spines, every adapter and switch at its default
/// description, host 2 (GUID 0x0002c90300000004) trained to 4xDDR.
fn production_dump(dir: &Path) -> std::path::PathBuf {
    let clean = dir.join("clean.ibnd");
    ok(&[
        "export",
        "--topology",
        "fat-tree:radix=8,hosts=14,leaves=4,spread,gbps=4xQDR",
        "--ibnetdiscover",
        clean.to_str().unwrap(),
    ]);
    let mut text = std::fs::read_to_string(&clean).unwrap();
    for i in 1..=14 {
        text = text.replace(&format!("\"node{i:03}\""), &format!("\"{HCA_DESC}\""));
    }
    for i in 1..=4 {
        text = text.replace(&format!("\"leaf{i:03}\""), &format!("\"{SWITCH_DESC}\""));
        text = text.replace(&format!("\"spine{i:02}\""), &format!("\"{SWITCH_DESC}\""));
    }
    // Both ends of host 2's link print the rate it trained to.
    let mut in_host2 = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("Ca") || line.starts_with("Switch") {
            in_host2 = line.contains("\"H-0002c90300000004\"");
        }
        let degraded =
            line.contains("\"H-0002c90300000004\"[1]") || (in_host2 && line.starts_with('['));
        out.push_str(&if degraded {
            line.replace("4xQDR", "4xDDR")
        } else {
            line.to_string()
        });
        out.push('\n');
    }
    assert_eq!(out.matches("4xDDR").count(), 2, "{out}");
    let p = dir.join("production.ibnd");
    std::fs::write(&p, out).unwrap();
    p
}

/// The names map of the production dump: hosts `evbn01`..`evbn14` (host i
/// has GUID 0x0002c903_00000000 + 2i), in both accepted forms, and one spine.
fn names_map(dir: &Path) -> std::path::PathBuf {
    let mut m = String::from("# GUID-to-host-name map\n");
    for i in 1..=14u64 {
        let guid = 0x0002_c903_0000_0000 + 2 * i;
        if i % 2 == 0 {
            m.push_str(&format!("H-{guid:016x} evbn{i:02}\n"));
        } else {
            m.push_str(&format!(
                "0x{guid:016x} \"evbn{i:02}\"   # node-name-map form\n"
            ));
        }
    }
    m.push_str("S-0002c90200200000 spine-a\n");
    m.push_str("H-00000000deadbeef gone01\n");
    let p = dir.join("names");
    std::fs::write(&p, m).unwrap();
    p
}

fn expand(cluster: &Cluster, hostlist: &str) -> BTreeSet<String> {
    cluster
        .client("scontrol", &["show", "hostnames", hostlist])
        .lines()
        .map(str::to_string)
        .collect()
}

/// `scontrol show topology`: switch -> (level, nodes expanded by Slurm).
fn slurm_topology(cluster: &Cluster) -> Vec<(String, u32, BTreeSet<String>)> {
    let text = cluster.client("scontrol", &["show", "topology"]);
    text.lines()
        .filter(|l| l.starts_with("SwitchName="))
        .map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap_or_else(|| panic!("no {k} in {l}"))
                    .to_string()
            };
            (
                field("SwitchName="),
                field("Level=").parse().unwrap(),
                expand(cluster, &field("Nodes=")),
            )
        })
        .collect()
}

/// A production dump gives a hostfile and a topology.conf with one name per
/// machine: GUID names without a map (and a note saying so), the cluster's
/// names with `--names`. The real slurmctld reads that topology.conf
/// without a complaint and sees each leaf's hosts as the fabric has them;
/// the GUID-named file it reads too, and says its hosts are unknown.
#[test]
fn production_dump_hostfile_and_slurm_topology() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let ibnd = production_dump(dir);
    let names = names_map(dir);
    let guid_conf = export_named_by_guid(dir, &ibnd);
    let (want, conf) = export_named_by_map(dir, &ibnd, &names);
    assert_conflicts_report_uses_names(dir, &ibnd, &names);

    // The real slurmctld reads it.
    let extra = "TopologyPlugin=topology/tree\n\
                 NodeName=evbn[01-14] NodeAddr=127.0.0.1 CPUs=1 State=FUTURE\n";
    let cluster = Cluster::start_with("topo", extra, &[("topology.conf", &conf)]);
    assert_slurmctld_sees_fabric_leaves(&cluster, &want);
    assert_hostlists_expand_in_slurm(&cluster);
    assert_slurmctld_finds_guid_hosts_unknown(&cluster, &guid_conf);
}

/// Without a names map: GUID host names, with a note and warnings saying
/// so, one per machine in the hostfile and topology.conf. Returns that
/// topology.conf.
fn export_named_by_guid(dir: &Path, ibnd: &Path) -> String {
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let (st, out, err) = evb(&[
        "export",
        "--topology",
        ibnd.to_str().unwrap(),
        "--hostfile",
        &f("guid.hosts"),
        "--slurm",
        &f("guid.conf"),
    ]);
    assert!(st, "{out}{err}");
    assert!(out.contains("14 host(s) are named by GUID"), "{out}");
    assert!(
        out.contains("degraded link: H-0002c90300000004 port 1"),
        "{out}"
    );
    assert!(
        err.contains("14 hosts are named by GUID (H-0002c903")
            && err.contains("14 nodes' descriptions begin with 'MT25408'"),
        "{err}"
    );
    let hosts: Vec<String> = std::fs::read_to_string(f("guid.hosts"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(hosts.len(), 14);
    assert_eq!(hosts.iter().collect::<BTreeSet<_>>().len(), 14, "{hosts:?}");
    assert!(
        hosts.iter().all(|h| h.starts_with("H-0002c903")),
        "{hosts:?}"
    );
    let guid_conf = std::fs::read_to_string(f("guid.conf")).unwrap();
    let switch_names: Vec<&str> = guid_conf
        .lines()
        .filter_map(|l| l.strip_prefix("SwitchName="))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(switch_names.len(), 8, "{guid_conf}");
    assert_eq!(switch_names.iter().collect::<BTreeSet<_>>().len(), 8);
    assert!(!guid_conf.contains("Voltaire"), "{guid_conf}");
    guid_conf
}

/// With `--names`: the cluster's names in the hostfile and topology.conf.
/// Returns the host names (evbn01..evbn14) and that topology.conf.
fn export_named_by_map(dir: &Path, ibnd: &Path, names: &Path) -> (Vec<String>, String) {
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let (st, out, err) = evb(&[
        "export",
        "--topology",
        ibnd.to_str().unwrap(),
        "--names",
        names.to_str().unwrap(),
        "--hostfile",
        &f("named.hosts"),
        "--slurm",
        &f("topology.conf"),
    ]);
    assert!(st, "{out}{err}");
    assert!(!out.contains("named by GUID"), "{out}");
    assert!(err.contains("1 GUID(s) not in this fabric"), "{err}");
    let named: Vec<String> = std::fs::read_to_string(f("named.hosts"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let want: Vec<String> = (1..=14).map(|i| format!("evbn{i:02}")).collect();
    assert_eq!(named, want);
    let conf = std::fs::read_to_string(f("topology.conf")).unwrap();
    assert!(conf.contains("SwitchName=spine-a Switches="), "{conf}");
    // Leaves of 4, 4, 3 and 3 hosts (spread populations).
    assert!(conf.contains(" Nodes=evbn[09-11]\n"), "{conf}");
    (want, conf)
}

/// The conflicts report names hosts and the degraded link by the map.
fn assert_conflicts_report_uses_names(dir: &Path, ibnd: &Path, names: &Path) {
    let report = dir.join("c.json");
    ok(&[
        "conflicts",
        "--topology",
        ibnd.to_str().unwrap(),
        "--names",
        names.to_str().unwrap(),
        "--json",
        report.to_str().unwrap(),
    ]);
    let v = json(&report);
    let bad = &v["degraded_links"][0];
    assert_eq!(bad["node"], "evbn02", "{bad}");
    assert_eq!(
        (bad["rate"].as_str(), bad["gbps"].as_f64()),
        (Some("4xDDR"), Some(16.0))
    );
    assert_eq!(bad["usual_rate"], "4xQDR");
    assert_eq!(v["link_rates"][0]["rate"], "4xQDR");
    assert_eq!(v["link_rates"][0]["cables"], 29);
}

/// slurmctld read the named topology.conf without a complaint, and each of
/// its leaf switches holds the hosts the fabric's leaf has; the spines
/// reach every host (`want`).
fn assert_slurmctld_sees_fabric_leaves(cluster: &Cluster, want: &[String]) {
    let topo = slurm_topology(cluster);
    let log = cluster.ctld_log();
    for complaint in [
        "Invalid hostnames",
        "Invalid node name",
        "not a tree",
        "both child switches and nodes",
        "already been defined",
        "invalid child",
        "lacks children",
        "Multiple leaf switches",
    ] {
        assert!(!log.contains(complaint), "slurmctld: {complaint}\n{log}");
    }
    // Only the test's own node is outside the fabric.
    for l in log.lines().filter(|l| l.contains("lack access")) {
        assert!(l.ends_with(&format!("1 nodes: {}", cluster.host)), "{l}");
    }
    let all: BTreeSet<String> = want.iter().cloned().collect();
    let mut leaves = 0;
    for (name, level, nodes) in &topo {
        match level {
            0 => {
                // Leaf l holds hosts first[l]..first[l+1]-1 (4, 4, 3, 3).
                let l: usize = name.trim_start_matches("S-0002c902001000").parse().unwrap();
                let first = [1, 5, 9, 12, 15];
                let expect: BTreeSet<String> = (first[l]..first[l + 1])
                    .map(|i| format!("evbn{i:02}"))
                    .collect();
                assert_eq!(nodes, &expect, "{name}");
                leaves += 1;
            }
            1 => assert_eq!(nodes, &all, "{name} reaches every host"),
            _ => panic!("{name} at level {level}"),
        }
    }
    assert_eq!((leaves, topo.len()), (4, 8), "{topo:?}");
    assert!(topo.iter().any(|t| t.0 == "spine-a"));
}

/// evb's hostlists expand, in Slurm, to exactly the names given:
/// padded and natural numbers, runs across digit counts, long numbers.
fn assert_hostlists_expand_in_slurm(cluster: &Cluster) {
    let tricky: Vec<String> = [
        "n9",
        "n10",
        "n11",
        "n01",
        "n02",
        "n007",
        "n099",
        "n100",
        "rack2-n3",
        "rack2-n4",
        "solo",
        "H-0002c90300080d28",
        "x1",
        "x1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let compressed = evb_fabric::io::hostlist(&tricky);
    assert_eq!(
        expand(cluster, &compressed),
        tricky.iter().cloned().collect::<BTreeSet<_>>(),
        "{compressed}"
    );
    assert!(
        compressed.contains("n[01-02,007,9-11,099-100]"),
        "{compressed}"
    );
}

/// GUID names are valid Slurm names but not slurm.conf's nodes: Slurm
/// reads the file and says so.
fn assert_slurmctld_finds_guid_hosts_unknown(cluster: &Cluster, guid_conf: &str) {
    std::fs::write(cluster.dir.join("topology.conf"), guid_conf).unwrap();
    cluster.client("scontrol", &["reconfigure"]);
    let t0 = std::time::Instant::now();
    while !cluster
        .ctld_log()
        .contains("Invalid hostnames in switch configuration")
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "slurmctld did not re-read topology.conf:\n{}",
            cluster.ctld_log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// ftree on a fabric that is not a fat tree falls back to minhop as OpenSM
/// does, saying why; `--strict` refuses. updn and dfsssp route it.
#[test]
fn ftree_fallback_and_strict() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("f.json");
    let args = [
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=32",
        "--remove-link",
        "leaf001:8",
        "--json",
        j.to_str().unwrap(),
    ];
    let (st, out, err) = evb(&args);
    assert!(st, "{out}{err}");
    assert!(
        err.contains("ftree:") && err.contains("routed with minhop instead"),
        "{err}"
    );
    assert!(out.contains("ftree fell back to minhop"), "{out}");
    let v = json(&j);
    assert!(
        v["routing_fallback"].as_str().unwrap().contains("ftree"),
        "{v}"
    );
    let mut strict = args.to_vec();
    strict.push("--strict");
    let (st, _, err) = evb(&strict);
    assert!(!st && err.contains("--strict"), "{err}");
    for e in ["updn", "dfsssp", "minhop"] {
        let (st, out, err) = evb(&[
            "conflicts",
            "--topology",
            "fat-tree:radix=8,hosts=32",
            "--remove-link",
            "leaf001:8",
            "--routing",
            e,
        ]);
        assert!(
            st && out.contains(&format!("{e} routing by evb")),
            "{out}{err}"
        );
        assert!(!err.contains("fell back"), "{err}");
    }
}

/// Step s of the receive convention (rank i receives from i+s) is evb's
/// send step N-s: same figures, other label.
#[test]
fn step_convention_receive() {
    let d = tempfile::tempdir().unwrap();
    let run = |conv: &str, steps: Option<&str>| {
        let j = d
            .path()
            .join(format!("{conv}-{}.json", steps.unwrap_or("all")));
        let mut a = vec![
            "conflicts",
            "--topology",
            "fat-tree:radix=8,hosts=27,leaves=8,spread",
            "--order",
            "random:2",
            "--step-convention",
            conv,
            "--json",
            j.to_str().unwrap(),
        ];
        if let Some(s) = steps {
            a.extend(["--steps", s]);
        }
        ok(&a);
        json(&j)
    };
    let send = run("send", None);
    let recv = run("receive", None);
    assert_eq!(send["total"], recv["total"]);
    let per = |v: &serde_json::Value| v["per_step"].as_array().unwrap().clone();
    let (ps, pr) = (per(&send), per(&recv));
    assert_eq!(ps.len(), 26);
    let mut asymmetric = 0;
    for s in 1..=26usize {
        let r = &pr[s - 1];
        let x = &ps[27 - s - 1];
        assert_eq!(r["step"], s);
        assert_eq!(
            r["conflicts"],
            x["conflicts"],
            "receive step {s} = send step {}",
            27 - s
        );
        assert_eq!(r["max_link_load"], x["max_link_load"]);
        asymmetric += (ps[s - 1]["conflicts"] != x["conflicts"]) as usize;
    }
    assert!(asymmetric > 0, "the test cannot tell the conventions apart");
    let one = run("receive", Some("1"));
    assert_eq!(one["per_step"][0]["step"], 1);
    assert_eq!(one["per_step"][0]["conflicts"], ps[25]["conflicts"]);
    assert!(recv["step_convention"]
        .as_str()
        .unwrap()
        .starts_with("receive"));
    let loads = &recv["link_loads"];
    assert_eq!(loads["steps"][0], 1);
    let (st, _, err) = evb(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=27",
        "--step-convention",
        "sideways",
    ]);
    assert!(!st && err.contains("sideways"), "{err}");
}

/// Bad names files and odd dumps: errors name the file and line.
#[test]
fn names_and_rates_errors_name_file_and_line() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let ibnd = production_dump(dir);
    let cases: &[(&str, &str)] = &[
        ("H-xyz node1\n", ":1: 'H-xyz' is not a GUID"),
        ("# ok\nH-0002c90300000002\n", ":2: no name after"),
        (
            "H-0002c90300000002 node;1\n",
            ":1: name 'node;1' cannot go into hostfiles",
        ),
        (
            "H-0002c90300000002 a\nH-0002c90300000004 a\n",
            ":2: name 'a' is given to",
        ),
        (
            "H-0002c90300000002 a\nH-0002c90300000002 b\n",
            ":2: H-0002c90300000002 is named 'a' at line 1",
        ),
        (
            "H-0002c90300000002 a b\n",
            ":1: unexpected text after the name",
        ),
        (
            "H-0002c90200100000 a\n",
            ":1: GUID 0x0002c90200100000 is a switch",
        ),
        (
            "0x0002c90300000002 \"unterminated\n",
            ":1: unterminated quoted name",
        ),
        ("\n# nothing\n", "no 'GUID NAME' lines"),
    ];
    for (k, (text, want)) in cases.iter().enumerate() {
        let p = dir.join(format!("names{k}"));
        std::fs::write(&p, text).unwrap();
        let (st, _, err) = evb(&[
            "export",
            "--topology",
            ibnd.to_str().unwrap(),
            "--names",
            p.to_str().unwrap(),
            "--hostfile",
            dir.join("h").to_str().unwrap(),
        ]);
        assert!(!st, "{text}");
        assert!(
            err.contains(&format!("{}{want}", p.display())) || (k == 8 && err.contains(want)),
            "{text}: {err}"
        );
    }
    // A shared description is not a name.
    let (st, _, err) = evb(&[
        "conflicts",
        "--topology",
        ibnd.to_str().unwrap(),
        "--remove",
        "MT25408",
    ]);
    assert!(
        !st && err.contains("description of 14 nodes") && err.contains("H-0002c903"),
        "{err}"
    );
    // A width no link has.
    let text = std::fs::read_to_string(&ibnd).unwrap();
    let line = text.lines().position(|l| l.contains("4xDDR")).unwrap() + 1;
    let weird = dir.join("weird.ibnd");
    std::fs::write(&weird, text.replacen("4xDDR", "5xDDR", 1)).unwrap();
    let (st, _, err) = evb(&["conflicts", "--topology", weird.to_str().unwrap()]);
    assert!(!st, "{err}");
    assert!(
        err.contains(&format!(
            "{}:{line}: link '5xDDR': width '5x'",
            weird.display()
        )),
        "{err}"
    );
    // Ends of one cable that disagree.
    let odd = dir.join("odd.ibnd");
    std::fs::write(&odd, text.replacen("4xDDR", "4xQDR", 1)).unwrap();
    let (st, _, err) = evb(&["conflicts", "--topology", odd.to_str().unwrap()]);
    assert!(
        !st && err.contains("is 4xDDR here but 4xQDR at line"),
        "{err}"
    );
}

/// Generated fat trees carry link rates: uniform by default, faster
/// up-links on request, in the JSON and the worst links.
#[test]
fn generated_rates() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("r.json");
    let out = ok(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=32,uplink_gbps=200",
        "--order",
        "random:1",
        "--json",
        j.to_str().unwrap(),
    ]);
    assert!(
        out.contains("links: 32 x 4xHDR (200 Gb/s), 32 x 4xEDR (100 Gb/s)"),
        "{out}"
    );
    assert!(!out.contains("degraded"), "{out}");
    let v = json(&j);
    let rates: Vec<(String, u64)> = v["link_rates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["rate"].as_str().unwrap().to_string(),
                r["cables"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rates,
        vec![("4xHDR".to_string(), 32), ("4xEDR".to_string(), 32)]
    );
    for w in v["worst_links"].as_array().unwrap() {
        let up = w["node"].as_str().unwrap().starts_with("leaf")
            && w["to"].as_str().unwrap().starts_with("spine")
            || w["node"].as_str().unwrap().starts_with("spine");
        let want = if up { 200.0 } else { 100.0 };
        assert_eq!(w["gbps"].as_f64(), Some(want), "{w}");
    }
    let (st, _, err) = evb(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=8,hosts=32,gbps=150",
    ]);
    assert!(
        !st && err.contains("150 Gb/s is not the rate of a 4x link"),
        "{err}"
    );
}

/// `--order` and `--routing` mean the same in every command that takes
/// them: one help listing every accepted value, one default (ftree, the
/// order falling back to name where the ftree engine cannot route).
#[test]
fn order_and_routing_are_one_vocabulary() {
    let help = |cmd: &[&str]| -> String {
        let (out, _) = run_bounded(
            evb_testkit::evb().args(cmd).arg("--help"),
            "evb --help",
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{cmd:?}");
        // Help wraps at the terminal's width: compare the words.
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let order = "ftree (the default: the ftree engine's CA order; by name where that engine \
                 cannot route the fabric), name";
    let orders = [
        "lid, leaf (hosts by leaf",
        "random or random:SEED",
        "a hostfile",
    ];
    let routing = "ftree (the default), minhop, updn, dfsssp, dmodk, random or random:SEED";
    // (scan shares sim's flags, node run's, and route and order the
    // fabric commands' texts.)
    for (cmd, has_order, has_routing) in [
        (&["sim"][..], true, true),
        (&["fabric", "conflicts"][..], true, true),
        (&["fabric", "schedule"][..], true, true),
        (&["fabric", "export"][..], true, true),
        (&["fabric", "diagnose"][..], true, true),
        (&["run"][..], true, true),
    ] {
        let text = help(cmd);
        if has_order {
            assert!(text.contains(order), "{cmd:?}: {text}");
            for o in orders {
                assert!(text.contains(o), "{cmd:?} lacks {o}: {text}");
            }
        }
        if has_routing {
            assert!(text.contains(routing), "{cmd:?}: {text}");
        }
    }
    // The default order: ftree where the ftree engine routes the fabric...
    let out = ok(&["conflicts", "--topology", "fat-tree:radix=4,hosts=8"]);
    assert!(out.contains("order 'ftree'"), "{out}");
    let d = tempfile::tempdir().unwrap();
    let slots = d.path().join("s.txt");
    let slots = slots.to_str().unwrap();
    let out = ok(&[
        "schedule",
        "--topology",
        "fat-tree:radix=4,hosts=8",
        "--out",
        slots,
    ]);
    assert!(out.contains("in order ftree"), "{out}");
    // ... by name, with a note, where it cannot (a cable removed).
    let (s, out, err) = evb(&[
        "conflicts",
        "--topology",
        "fat-tree:radix=4,hosts=8",
        "--remove-link",
        "leaf001:3",
    ]);
    assert!(s && out.contains("order 'name'"), "{out}{err}");
    assert!(
        err.contains("note: rank order: name (the default, ftree,"),
        "{err}"
    );
}
