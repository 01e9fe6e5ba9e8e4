//! `evb fabric` end to end: every subcommand, every output format.

use std::path::Path;
use std::process::Command;

fn evb(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_evb"))
        .arg("fabric")
        .args(args)
        .output()
        .expect("run evb");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!e.contains("panicked"), "evb panicked: {e}");
    (out.status.success(), o, e)
}

fn ok(args: &[&str]) -> String {
    let (s, o, e) = evb(args);
    assert!(s, "evb fabric {args:?} failed:\n{o}\n{e}");
    o
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
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
    assert!(net.contains("Switch\t8 \"leaf001\"") && net.contains("Hca\t1 \"node001\""));
    let slurm = std::fs::read_to_string(f("topology.conf")).unwrap();
    assert!(
        slurm.contains("SwitchName=leaf001 Nodes=node001,node002,node003,node004"),
        "{slurm}"
    );
    assert!(
        slurm.contains("SwitchName=spine01 Switches=leaf001"),
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
    ok(&[
        "conflicts",
        "--topology",
        &f("ibnd"),
        "--lfts",
        &f("lfts"),
        "--order",
        &f("rr"),
        "--json",
        &f("a.json"),
    ]);
    let before = json(Path::new(&f("a.json")))["total"]["conflicts"]
        .as_u64()
        .unwrap();
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
    ok(&[
        "conflicts",
        "--topology",
        &f("ibnd"),
        "--lfts",
        &f("shift.lfts"),
        "--order",
        &f("rr"),
        "--json",
        &f("b.json"),
    ]);
    let after = json(Path::new(&f("b.json")))["total"]["conflicts"]
        .as_u64()
        .unwrap();
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
    ok(&[
        "conflicts",
        "--topology",
        &f("ibnd"),
        "--lfts",
        &f("lfts"),
        "--order",
        &f("best"),
        "--json",
        &f("c.json"),
    ]);
    assert_eq!(
        json(Path::new(&f("c.json")))["total"]["conflicts"],
        0,
        "{out}"
    );
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

/// The command line on files written by the real OpenSM on ibsim: the
/// issue's example command, and tables from `route --for-shift` handed to
/// OpenSM's file engine. Fails (never skips) without opensm/ibsim.
#[test]
fn with_real_opensm_files() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
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
    let umad = [
        "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so",
        "/usr/lib/aarch64-linux-gnu/umad2sim/libumad2sim.so",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("libumad2sim.so missing: install ibsim-utils (scripts/setup.sh)");
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
export IBSIM_SOCKNAME=evbcli$$ SIM_HOST=node001 OSM_CACHE_DIR={d} OSM_TMP_DIR={d}
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
        evb = env!("CARGO_BIN_EXE_evb")
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
    ok(&[
        "conflicts",
        "--topology",
        &f("topo"),
        "--lfts",
        &f("dump/opensm-lfts.dump"),
        "--order",
        "random:4",
        "--json",
        &f("d.json"),
    ]);
    let promised = json(Path::new(&f("b.json")))["total"].clone();
    assert_eq!(json(Path::new(&f("c.json")))["total"], promised);
    let ftree = json(Path::new(&f("d.json")))["total"]["conflicts"]
        .as_u64()
        .unwrap();
    assert!(
        promised["conflicts"].as_u64().unwrap() < ftree,
        "for-shift tables should beat ftree on a random order"
    );
}
