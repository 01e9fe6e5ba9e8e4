//! Tests against the real OpenSM running on ibsim, and the port counters
//! `perfquery` reads from ibsim once OpenSM has brought the fabric up.

mod common;
use common::*;
use evb_fabric::io::{parse_ibnetdiscover, parse_lfts};
use evb_fabric::topo::FatTreeSpec;

fn ftree_matches(spec: &str, tag: &str) {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let topo = FatTreeSpec::parse(spec).unwrap().build().unwrap();
    let dir = test_dir(tag);
    let sim = Sim::start(&topo, &dir, tag);
    let dump = sim.opensm("ftree", &[]);
    assert!(
        dump.join("opensm-ftree-ca-order.dump").exists(),
        "OpenSM did not route with ftree (fell back?)"
    );
    let ibnd = sim.ibnetdiscover();
    let real = parse_ibnetdiscover(&ibnd).unwrap();
    assert_eq!(real.hosts().len(), topo.hosts().len());
    let osm = parse_lfts(&dump.join("opensm-lfts.dump"), &real).unwrap();
    let ours = evb_fabric::ftree::route_ftree(&real).unwrap();
    let mut compared = 0;
    let mut diffs = vec![];
    for sw in real.switches() {
        for h in real.hosts() {
            let lid = real.nodes[h].lid;
            compared += 1;
            if osm.get(sw, lid) != ours.lfts.get(sw, lid) {
                diffs.push(format!(
                    "{} lid {} ({}): opensm {} evb {}",
                    real.nodes[sw].name,
                    lid,
                    real.nodes[h].name,
                    osm.get(sw, lid),
                    ours.lfts.get(sw, lid)
                ));
            }
        }
    }
    assert!(
        diffs.is_empty(),
        "{spec}: {} of {compared} host entries differ:\n{}",
        diffs.len(),
        diffs[..diffs.len().min(30)].join("\n")
    );
    // The CA order (the routing order) must match too.
    let osm_order =
        evb_fabric::io::parse_order(&dump.join("opensm-ftree-ca-order.dump"), &real).unwrap();
    let osm_lids: Vec<u16> = osm_order.iter().map(|&h| real.nodes[h].lid).collect();
    assert_eq!(osm_lids, ours.ca_order, "{spec}: ftree CA order differs");
    // And its positions: a DUMMY line where a short leaf routes a dummy
    // (the shift `evb fabric schedule` runs over).
    let osm_positions =
        evb_fabric::io::parse_order_positions(&dump.join("opensm-ftree-ca-order.dump"), &real)
            .unwrap();
    let osm_positions: Vec<Option<u16>> = osm_positions
        .iter()
        .map(|p| p.map(|h| real.nodes[h].lid))
        .collect();
    assert_eq!(
        osm_positions, ours.positions,
        "{spec}: ftree positions differ"
    );
    // The comparison has teeth: D-mod-K tables differ from OpenSM's ftree.
    let dmodk = evb_fabric::routing::route(&real, &evb_fabric::routing::Engine::Dmodk).unwrap();
    let differing = real
        .switches()
        .iter()
        .flat_map(|&sw| real.hosts().into_iter().map(move |h| (sw, h)))
        .filter(|&(sw, h)| dmodk.get(sw, real.nodes[h].lid) != osm.get(sw, real.nodes[h].lid))
        .count();
    assert!(
        differing > 0,
        "{spec}: dmodk equals ftree everywhere; the comparison cannot fail"
    );
}

#[test]
fn ftree_full_2level_radix8() {
    ftree_matches("fat-tree:radix=8,hosts=32", "ft_full8");
}

#[test]
fn ftree_partial_fill_radix8() {
    ftree_matches("fat-tree:radix=8,hosts=27", "ft_fill8");
}

#[test]
fn ftree_partial_spread_radix8() {
    ftree_matches("fat-tree:radix=8,hosts=27,leaves=8,spread", "ft_spread8");
}

#[test]
fn ftree_oversubscribed_radix12() {
    ftree_matches("fat-tree:radix=12,hosts=64,oversub=2", "ft_over12");
}

/// A director spine (`evb plan`'s leaf+director designs): OpenSM routes
/// the leaves and the director's chips as evb's ftree does.
#[test]
fn ftree_director_spine_radix12() {
    ftree_matches(
        "fat-tree:radix=12,hosts=57,down=6,up=6,leaves=10,director=72",
        "ft_dir72",
    );
}

#[test]
fn ftree_3level_radix8_spread() {
    ftree_matches("fat-tree:radix=8,levels=3,hosts=100,spread", "ft_3l8");
}

#[test]
fn ftree_3level_radix8_full() {
    ftree_matches("fat-tree:radix=8,levels=3", "ft_3l8full");
}

/// With empty leaves OpenSM's ftree refuses the fabric; so must evb's.
#[test]
fn ftree_refuses_what_opensm_refuses() {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let topo = FatTreeSpec::parse("fat-tree:radix=8,levels=3,hosts=100")
        .unwrap()
        .build()
        .unwrap();
    let dir = test_dir("ft_refuse");
    let sim = Sim::start(&topo, &dir, "ft_refuse");
    let dump = sim.opensm("ftree", &[]);
    assert!(
        !dump.join("opensm-ftree-ca-order.dump").exists(),
        "OpenSM accepted a fabric with empty leaves"
    );
    let real = parse_ibnetdiscover(&sim.ibnetdiscover()).unwrap();
    let err = evb_fabric::ftree::route_ftree(&real)
        .err()
        .expect("evb ftree accepted it");
    assert!(err.to_string().contains("refuse"), "{err}");
}

#[test]
fn ftree_few_hundred_hosts_radix24() {
    ftree_matches("fat-tree:radix=24,hosts=270,spread", "ft_270");
}

// ---------------------------------------------------------------------
// An independent conflict counter: its own parsing of ibnetdiscover and
// dump_lfts text, its own tracing, a hash map of link loads per step.
// ---------------------------------------------------------------------

use std::collections::HashMap;

struct Indep {
    /// (node id, port) -> (remote node id, remote port)
    cable: HashMap<(String, u32), (String, u32)>,
    /// host description -> (node id, lid)
    hosts: HashMap<String, (String, u32)>,
    /// (switch node id, lid) -> port
    lft: HashMap<(String, u32), u32>,
}

fn between(s: &str, a: char, b: char) -> Option<&str> {
    let i = s.find(a)?;
    let j = s[i + 1..].find(b)? + i + 1;
    Some(&s[i + 1..j])
}

fn indep_load(ibnd: &std::path::Path, lfts: &std::path::Path) -> Indep {
    let mut x = Indep {
        cable: HashMap::new(),
        hosts: HashMap::new(),
        lft: HashMap::new(),
    };
    let mut cur = String::new();
    let mut cur_desc = String::new();
    let mut is_ca = false;
    for line in std::fs::read_to_string(ibnd).unwrap().lines() {
        if line.starts_with("Switch") || line.starts_with("Ca") {
            is_ca = line.starts_with("Ca");
            cur = between(line, '"', '"').unwrap().to_string();
            let comment = &line[line.find('#').unwrap() + 1..];
            cur_desc = between(comment, '"', '"').unwrap().to_string();
        } else if line.starts_with('[') {
            let port: u32 = between(line, '[', ']').unwrap().parse().unwrap();
            let rest = &line[line.find('"').unwrap()..];
            let rid = between(rest, '"', '"').unwrap().to_string();
            let after = &rest[rid.len() + 2..];
            let rport: u32 = between(after, '[', ']').unwrap().parse().unwrap();
            x.cable.insert((cur.clone(), port), (rid, rport));
            if is_ca {
                let comment = &line[line.find('#').unwrap()..];
                let lid: u32 = comment.split_whitespace().nth(2).unwrap().parse().unwrap();
                x.hosts.insert(cur_desc.clone(), (cur.clone(), lid));
            }
        }
    }
    let mut sw = String::new();
    for line in std::fs::read_to_string(lfts).unwrap().lines() {
        if line.starts_with("Unicast lids") {
            let g = line
                .split(" guid 0x")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            sw = format!("S-{g}");
        } else if line.starts_with("0x") {
            let mut it = line.split_whitespace();
            let lid = u32::from_str_radix(&it.next().unwrap()[2..], 16).unwrap();
            let port: u32 = it.next().unwrap().parse().unwrap();
            x.lft.insert((sw.clone(), lid), port);
        }
    }
    x
}

/// Conflicts of the full shift schedule over `names` (rank order).
fn indep_conflicts(x: &Indep, names: &[String]) -> u64 {
    let n = names.len();
    let mut total = 0u64;
    for s in 1..n {
        let mut load: HashMap<(String, u32), u64> = HashMap::new();
        for i in 0..n {
            let (src, _) = &x.hosts[&names[i]];
            let (dst, dlid) = &x.hosts[&names[(i + s) % n]];
            let mut node = src.clone();
            let mut port = 1u32;
            for _ in 0..64 {
                *load.entry((node.clone(), port)).or_default() += 1;
                let (next, _) = x.cable[&(node.clone(), port)].clone();
                if &next == dst {
                    break;
                }
                port = x.lft[&(next.clone(), *dlid)];
                node = next;
            }
        }
        total += load.values().map(|&c| c.saturating_sub(1)).sum::<u64>();
    }
    total
}

fn engines_on(spec: &str, tag: &str) {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let topo = FatTreeSpec::parse(spec).unwrap().build().unwrap();
    let dir = test_dir(tag);
    let sim = Sim::start(&topo, &dir, tag);
    sim.opensm_tagged("ftree", "initial", &[]); // assigns LIDs
    let ibnd = sim.ibnetdiscover();
    let real = parse_ibnetdiscover(&ibnd).unwrap();
    let order = evb_fabric::optimize::order_by_name(&real);
    let names: Vec<String> = order.iter().map(|&h| real.nodes[h].name.clone()).collect();
    let steps = evb_fabric::conflicts::shift_steps(order.len());
    let mut seen = vec![];
    for engine in ["ftree", "minhop", "updn", "dfsssp"] {
        let dump = sim.opensm(engine, &[]);
        let dl = sim.dump_lfts(&format!("dump_lfts-{engine}.out"));
        // Both LFT forms read the same tables.
        let a = parse_lfts(&dump.join("opensm-lfts.dump"), &real).unwrap();
        let b = parse_lfts(&dl, &real).unwrap();
        for sw in real.switches() {
            for h in real.hosts() {
                let lid = real.nodes[h].lid;
                assert_eq!(
                    a.get(sw, lid),
                    b.get(sw, lid),
                    "{engine}: opensm-lfts.dump and dump_lfts disagree"
                );
            }
        }
        let ours = evb_fabric::conflicts::analyze(&real, &b, &order, &steps, 5).unwrap();
        let theirs = indep_conflicts(&indep_load(&ibnd, &dl), &names);
        assert_eq!(
            ours.total.conflicts, theirs,
            "{spec} {engine}: evb counts {} conflicts, independent counter {}",
            ours.total.conflicts, theirs
        );
        assert_eq!(ours.total.flows, (order.len() * (order.len() - 1)) as u64);
        seen.push((engine, theirs));
    }
    eprintln!("{spec}: conflicts by engine (name order): {seen:?}");
}

#[test]
fn engines_conflicts_match_independent_count_partial() {
    engines_on("fat-tree:radix=8,hosts=27,leaves=8,spread", "eng_spread");
}

#[test]
fn engines_conflicts_match_independent_count_oversubscribed() {
    engines_on("fat-tree:radix=12,hosts=60,oversub=2", "eng_over");
}

/// LFTs exported by evb load into OpenSM's file engine and come back
/// unchanged (read back from the simulated switches with dump_lfts).
#[test]
fn file_engine_round_trip() {
    let _g = SIM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let topo = FatTreeSpec::parse("fat-tree:radix=8,hosts=30,spread,leaves=8")
        .unwrap()
        .build()
        .unwrap();
    let dir = test_dir("file_rt");
    let sim = Sim::start(&topo, &dir, "file_rt");
    sim.opensm("minhop", &[]); // assigns LIDs
    let real = parse_ibnetdiscover(&sim.ibnetdiscover()).unwrap();
    let order = evb_fabric::optimize::order_by_name(&real);
    let steps = evb_fabric::conflicts::shift_steps(order.len());
    let (shift, _) = evb_fabric::optimize::route_for_shift(
        &real,
        &order,
        &steps,
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    let candidates = [
        (
            "random",
            evb_fabric::routing::route(&real, &evb_fabric::routing::Engine::Random(7)).unwrap(),
        ),
        (
            "dmodk",
            evb_fabric::routing::route(&real, &evb_fabric::routing::Engine::Dmodk).unwrap(),
        ),
        ("for-shift", shift),
    ];
    for (name, lfts) in candidates {
        let file = dir.join(format!("evb-{name}.lfts"));
        std::fs::write(&file, evb_fabric::io::write_opensm_lfts(&real, &lfts)).unwrap();
        sim.opensm_tagged(
            "file",
            &format!("file-{name}"),
            &["-U", file.to_str().unwrap()],
        );
        let back = parse_lfts(&sim.dump_lfts(&format!("back-{name}.out")), &real).unwrap();
        let mut n = 0;
        for sw in real.switches() {
            for lid in 1..=real.max_lid() {
                assert_eq!(
                    back.get(sw, lid),
                    lfts.get(sw, lid),
                    "{name}: switch {} LID {lid} changed on the way through OpenSM",
                    real.nodes[sw].name
                );
                n += 1;
            }
        }
        assert!(n > 0);
    }
}

#[test]
fn ftree_648_hosts_radix36() {
    ftree_matches("fat-tree:radix=36,hosts=648", "ft_648");
}

#[test]
fn engines_conflicts_match_independent_count_few_hundred() {
    engines_on("fat-tree:radix=24,hosts=250,spread", "eng_250");
}

#[test]
fn ftree_3level_radix12_432_hosts() {
    ftree_matches("fat-tree:radix=12,levels=3", "ft_3l12");
}

#[test]
fn ftree_3level_radix16_spread_1000_hosts() {
    ftree_matches("fat-tree:radix=16,levels=3,hosts=1000,spread", "ft_3l16");
}

#[test]
fn ftree_3level_oversubscribed() {
    ftree_matches(
        "fat-tree:radix=12,levels=3,oversub=2,hosts=300,spread",
        "ft_3lover",
    );
}

// ---------------------------------------------------------------------
// Reading port counters with the real `perfquery` from ibsim's PMAs
// (OpenSM having brought the fabric up): every cabled port read, the
// counters growing with the management traffic, clearing with `-r`, and
// `perfquery` run by hand agreeing with the snapshot.
// ---------------------------------------------------------------------

use evb_fabric::counters::collect::{collect, CollectOptions};
use evb_fabric::counters::{place, Snapshot};
use evb_fabric::diagnose::measure::{measure, MeasureOptions};
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
