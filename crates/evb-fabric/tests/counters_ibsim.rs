//! Reading port counters with the real `perfquery` from ibsim's PMAs
//! (OpenSM having brought the fabric up): every cabled port read, the
//! counters growing with the management traffic, clearing with `-r`, and
//! `perfquery` run by hand agreeing with the snapshot.

mod common;
use common::*;
use evb_fabric::counters::collect::{collect, CollectOptions};
use evb_fabric::counters::{place, Snapshot};
use evb_fabric::diagnose::measure::{measure, MeasureOptions};
use evb_fabric::io::parse_ibnetdiscover;
use evb_fabric::topo::FatTreeSpec;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn xmit(s: &Snapshot, guid: &str, port: u8) -> u64 {
    s.ports
        .iter()
        .find(|p| p.guid == guid && p.port == port)
        .and_then(|p| p.get("PortXmitDataExtended"))
        .unwrap_or_else(|| panic!("no PortXmitDataExtended of {guid} port {port}"))
}

/// `perfquery -x LID PORT` run by hand: its PortXmitData.
fn by_hand(sim: &Sim, lid: u16, port: u8) -> u64 {
    let out = Command::new(require("perfquery"))
        .envs(sim.env())
        .args(["-x", &lid.to_string(), &port.to_string()])
        .output()
        .expect("run perfquery");
    assert!(out.status.success(), "perfquery failed: {:?}", out);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("PortXmitData:"))
        .expect("a PortXmitData line");
    line.rsplit('.').next().unwrap().trim().parse().unwrap()
}

#[test]
fn perfquery_reads_every_port_of_ibsim() {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let spec = FatTreeSpec::parse("fat-tree:radix=4,hosts=4,down=2,up=1").unwrap();
    let dir = test_dir("counters_ibsim");
    let sim = Sim::start(&spec.build().unwrap(), &dir, "cnt");
    sim.opensm("ftree", &[]);
    let topo = parse_ibnetdiscover(&sim.ibnetdiscover()).unwrap();
    let opts = CollectOptions {
        env: sim.env(),
        timeout: Duration::from_secs(30),
        ..CollectOptions::default()
    };
    let (a, notes) = collect(&topo, &opts).unwrap();
    assert!(a.source.starts_with("perfquery 44"), "{}", a.source);
    // ibsim does not answer PortSamplesControl: the note says what is assumed.
    assert!(
        notes.iter().any(|n| n.contains("PortSamplesControl")),
        "{notes:?}"
    );
    let cabled: usize = topo
        .nodes
        .iter()
        .map(|n| n.ports.iter().flatten().count())
        .sum();
    assert_eq!(a.ports.len(), cabled);
    for p in &a.ports {
        for c in [
            "PortXmitData",
            "PortRcvData",
            "PortXmitWait",
            "SymbolErrorCounter",
            "PortXmitDataExtended",
        ] {
            assert!(p.get(c).is_some(), "{} port {} lacks {c}", p.guid, p.port);
        }
    }
    let pa = place(a.clone(), Path::new("a"), &topo).unwrap();
    // Read again: nothing went down, and the first reading's management
    // packets crossed some links.
    let (b, _) = collect(&topo, &opts).unwrap();
    let grew: u64 = b
        .ports
        .iter()
        .map(|p| {
            let before = xmit(&a, &p.guid, p.port);
            let after = p.get("PortXmitDataExtended").unwrap();
            assert!(after >= before, "{} port {} went down", p.guid, p.port);
            after - before
        })
        .sum();
    assert!(grew > 0, "no counter grew between two readings");
    let pb = place(b, Path::new("b"), &topo).unwrap();
    let (links, _) = measure(&topo, Some(&pa), &pb, &MeasureOptions::default()).unwrap();
    assert_eq!(links.len(), cabled);
    assert!(links
        .iter()
        .all(|l| l.interval_s > 0.0 && l.utilisation.unwrap() < 0.01));
    cleared_and_by_hand(&sim, &topo, &opts);
}

/// `reset` clears the counters after reading; a reading by hand agrees
/// with the snapshot taken just before it.
fn cleared_and_by_hand(sim: &Sim, topo: &evb_fabric::Topology, opts: &CollectOptions) {
    let reset = CollectOptions {
        reset: true,
        ..opts.clone()
    };
    let (r, _) = collect(topo, &reset).unwrap();
    assert!(r.reset_after_read);
    let (c, _) = collect(topo, opts).unwrap();
    let busiest = r
        .ports
        .iter()
        .max_by_key(|p| p.get("PortXmitDataExtended"))
        .unwrap();
    let (g, p) = (busiest.guid.clone(), busiest.port);
    assert!(
        xmit(&c, &g, p) < xmit(&r, &g, p),
        "{g} port {p}: {} after clearing, {} before",
        xmit(&c, &g, p),
        xmit(&r, &g, p)
    );
    let lid = busiest.lid.unwrap();
    let hand = by_hand(sim, lid, p);
    let snap = xmit(&c, &g, p);
    // Only the reading's own management packets in between.
    assert!(
        hand >= snap && hand < snap + 20_000,
        "by hand {hand}, snapshot {snap}"
    );
}
