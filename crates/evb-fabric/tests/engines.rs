//! OpenSM's minhop, updn and dfsssp, and its fallback from ftree to
//! minhop, against the real OpenSM on ibsim: every switch's entry for every
//! LID (hosts and switches) must equal OpenSM's, on fat trees and on an
//! irregular fabric built here (shared descriptions, a degraded link, a
//! missing cable, an odd leaf).

mod common;
use common::*;
use evb_fabric::io::{parse_ibnetdiscover, parse_lfts};
use evb_fabric::lft::Lfts;
use evb_fabric::routing::{route, route_or_fallback, Engine};
use evb_fabric::topo::FatTreeSpec;
use evb_fabric::Topology;

/// Entries compared, and the differing ones (described).
fn diff(real: &Topology, osm: &Lfts, ours: &Lfts) -> (usize, Vec<String>) {
    let lids = real.lid_table();
    let mut n = 0;
    let mut d = vec![];
    for sw in real.switches() {
        for (lid, node) in lids.iter().enumerate() {
            let Some(node) = node else { continue };
            let lid = lid as u16;
            n += 1;
            let (a, b) = (osm.get(sw, lid), ours.get(sw, lid));
            if a != b {
                d.push(format!(
                    "{} LID {lid} ({}): opensm {a} evb {b}",
                    real.nodes[sw].name, real.nodes[*node].name
                ));
            }
        }
    }
    (n, d)
}

/// Runs `engine` in OpenSM, checks it configured the tables itself (or
/// fell back to `expect_used`), and compares evb's tables for `ours`.
fn compare(sim: &Sim, real: &Topology, engine: &str, expect_used: &str, ours: &Lfts, what: &str) {
    let dump = sim.opensm(engine, &[]);
    let (used, errors) = sim.engine_used(engine);
    assert_eq!(
        used, expect_used,
        "{what}: OpenSM -R {engine} configured the tables with {used}; errors: {errors:?}"
    );
    let osm = parse_lfts(&dump.join("opensm-lfts.dump"), real).unwrap();
    let (n, d) = diff(real, &osm, ours);
    assert!(n > 0);
    assert!(
        d.is_empty(),
        "{what} {engine}: {} of {n} entries differ from OpenSM:\n{}",
        d.len(),
        d[..d.len().min(30)].join("\n")
    );
    eprintln!("{what} {engine}: {n} entries equal OpenSM's");
}

fn engines_match(spec: &str, tag: &str) {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let topo = FatTreeSpec::parse(spec).unwrap().build().unwrap();
    let dir = test_dir(tag);
    let sim = Sim::start(&topo, &dir, tag);
    sim.opensm_tagged("minhop", "lids", &[]);
    let real = parse_ibnetdiscover(&sim.ibnetdiscover()).unwrap();
    let mut tables = vec![];
    for (engine, e) in [
        ("minhop", Engine::Minhop),
        ("updn", Engine::Updn),
        ("dfsssp", Engine::Dfsssp),
    ] {
        let ours = route(&real, &e).unwrap();
        compare(&sim, &real, engine, engine, &ours, spec);
        tables.push((engine, ours));
    }
    // The comparisons have teeth: the engines' tables differ from each
    // other (and evb's own D-mod-K from all three).
    tables.push(("dmodk", route(&real, &Engine::Dmodk).unwrap()));
    let mut differing = vec![];
    for i in 0..tables.len() {
        for j in i + 1..tables.len() {
            let (_, d) = diff(&real, &tables[i].1, &tables[j].1);
            differing.push(format!("{}/{}: {}", tables[i].0, tables[j].0, d.len()));
            if tables[j].0 == "dmodk" {
                assert!(!d.is_empty(), "{spec}: {} equals dmodk", tables[i].0);
            }
        }
    }
    eprintln!(
        "{spec}: entries differing between engines: {}",
        differing.join(", ")
    );
}

#[test]
fn engines_partial_spread_radix8() {
    engines_match("fat-tree:radix=8,hosts=27,leaves=8,spread", "eng8");
}

#[test]
fn engines_3level_radix8_spread() {
    engines_match("fat-tree:radix=8,levels=3,hosts=100,spread", "eng3l");
}

#[test]
fn engines_oversubscribed_radix12() {
    engines_match("fat-tree:radix=12,hosts=64,oversub=2", "engover");
}

#[test]
fn engines_few_hundred_hosts_radix24() {
    engines_match("fat-tree:radix=24,hosts=270,spread", "eng270");
}

const HCA_DESC: &str = "MT25408 ConnectX Mellanox Technologies";
const SWITCH_DESC: &str = "Voltaire 4036 - 36 QDR ports switch";

/// A QDR fabric as production fabrics come: a 2-level radix-8 tree of 4
/// leaves and 4 spines with 14 hosts, every adapter and switch left at its
/// default description, one host link trained to 4xDDR, one leaf up-link
/// missing, and an odd fifth leaf of 2 hosts cabled to 2 spines only.
fn irregular() -> Topology {
    let mut t = FatTreeSpec::parse("fat-tree:radix=8,hosts=14,leaves=4,spread,gbps=4xQDR")
        .unwrap()
        .build()
        .unwrap();
    let ddr = evb_fabric::rate::LinkRate::parse("4xDDR").unwrap();
    let node002 = t.find("node002").unwrap();
    t.set_link_rate(node002, 1, Some(ddr)).unwrap();
    t.remove_link("leaf002", 7).unwrap();
    let qdr = Some(evb_fabric::rate::LinkRate::parse("4xQDR").unwrap());
    let odd = t.add_node(
        evb_fabric::topo::NodeKind::Switch,
        "leaf005",
        0x0008_f104_0041_1a05,
        8,
    );
    for (i, guid) in [0x0002_c903_0008_0d28u64, 0x0002_c903_0008_0d2a]
        .into_iter()
        .enumerate()
    {
        let h = t.add_node(
            evb_fabric::topo::NodeKind::Host,
            &format!("odd{i}"),
            guid,
            1,
        );
        t.connect_rated(h, 1, odd, (i + 1) as u8, qdr).unwrap();
    }
    for (p, spine) in [(5u8, "spine01"), (6, "spine02")] {
        let s = t.find(spine).unwrap();
        t.connect_rated(odd, p, s, 5, qdr).unwrap();
    }
    for n in &mut t.nodes {
        n.desc = if n.is_switch() { SWITCH_DESC } else { HCA_DESC }.to_string();
    }
    evb_fabric::names::assign_unique_names(&mut t, &[]);
    t.assign_lids();
    t
}

/// ftree refuses the irregular fabric and falls back to minhop, in OpenSM
/// and in evb, with the same tables; updn and dfsssp route it, the same
/// in both. What evb read back from ibnetdiscover keeps the degraded link,
/// names every node uniquely, and refuses the shared description as a name.
#[test]
fn irregular_fabric_ftree_falls_back_like_opensm() {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let topo = irregular();
    let dir = test_dir("irregular");
    let sim = Sim::start(&topo, &dir, "irregular");
    sim.opensm_tagged("minhop", "lids", &[]);
    let real = parse_ibnetdiscover(&sim.ibnetdiscover()).unwrap();
    assert_eq!(real.hosts().len(), 16);
    assert_eq!(real.switches().len(), 9);
    // Every node named by GUID, uniquely.
    let mut names: Vec<&str> = real.nodes.iter().map(|n| n.name.as_str()).collect();
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("H-") || n.starts_with("S-")),
        "{names:?}"
    );
    names.sort();
    names.dedup();
    assert_eq!(names.len(), real.nodes.len());
    let err = real.resolve("MT25408").unwrap_err().to_string();
    assert!(err.contains("16 nodes") && err.contains("H-"), "{err}");
    // The degraded link, as ibsim trained it and ibnetdiscover printed it.
    let bad = evb_fabric::rate::degraded_links(&real);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(
        (bad[0].rate.as_str(), bad[0].usual_rate.as_str()),
        ("4xDDR", "4xQDR")
    );
    let h = real.resolve(&bad[0].node).unwrap();
    // node002 of the generator: GUID 0x0002c903_00000000 + 2 x 2.
    assert_eq!(real.nodes[h].guid, 0x0002_c903_0000_0004);
    assert_eq!(real.link_gbps(h, 1), Some(16.0));

    // ftree: refused by both, both fall back to minhop.
    let r = route_or_fallback(&real, &Engine::Ftree, false).unwrap();
    assert_eq!(r.engine, Engine::Minhop);
    let why = r.fallback.clone().expect("a reason");
    assert!(why.contains("ftree"), "{why}");
    compare(&sim, &real, "ftree", "minhop", &r.lfts, "irregular");
    let (_, errors) = sim.engine_used("ftree");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("ftree: cannot build lid matrices")),
        "{errors:?}"
    );
    let strict = route_or_fallback(&real, &Engine::Ftree, true)
        .unwrap_err()
        .to_string();
    assert!(strict.contains("--strict"), "{strict}");
    for (engine, e) in [
        ("minhop", Engine::Minhop),
        ("updn", Engine::Updn),
        ("dfsssp", Engine::Dfsssp),
    ] {
        let ours = route(&real, &e).unwrap();
        compare(&sim, &real, engine, engine, &ours, "irregular");
    }
}

/// A ring of 4 switches with 2 hosts each has no updn roots: OpenSM's updn
/// gives up and minhop routes it; evb's too. ftree falls back as well.
#[test]
fn ring_updn_without_roots_falls_back_like_opensm() {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Topology::default();
    let sws: Vec<usize> = (0..4)
        .map(|i| {
            t.add_node(
                evb_fabric::topo::NodeKind::Switch,
                &format!("ring{i}"),
                0x0008_f104_0042_0000 + i as u64,
                8,
            )
        })
        .collect();
    for i in 0..4 {
        t.connect(sws[i], 5, sws[(i + 1) % 4], 6).unwrap();
        for j in 0..2 {
            let h = t.add_node(
                evb_fabric::topo::NodeKind::Host,
                &format!("r{i}h{j}"),
                0x0002_c903_0009_0000 + 2 * (2 * i + j) as u64,
                1,
            );
            t.connect(h, 1, sws[i], (j + 1) as u8).unwrap();
        }
    }
    t.assign_lids();
    let dir = test_dir("ring");
    let sim = Sim::start(&t, &dir, "ring");
    sim.opensm_tagged("minhop", "lids", &[]);
    let real = parse_ibnetdiscover(&sim.ibnetdiscover()).unwrap();
    for (engine, e) in [("updn", Engine::Updn), ("ftree", Engine::Ftree)] {
        let r = route_or_fallback(&real, &e, false).unwrap();
        assert_eq!(r.engine, Engine::Minhop, "{engine}");
        assert!(r.fallback.is_some());
        compare(&sim, &real, engine, "minhop", &r.lfts, "ring");
    }
    let ours = route(&real, &Engine::Dfsssp).unwrap();
    compare(&sim, &real, "dfsssp", "dfsssp", &ours, "ring");
}

#[test]
fn engines_648_hosts_radix36() {
    engines_match("fat-tree:radix=36,hosts=648", "eng648");
}
