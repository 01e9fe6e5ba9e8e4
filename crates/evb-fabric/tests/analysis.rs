//! Conflict analysis, generators, engines and searches without OpenSM.

use evb_fabric::conflicts::{analyze, shift_steps};
use evb_fabric::ftree::route_ftree;
use evb_fabric::optimize::{
    explain, optimize_order, optimize_order_from, order_by_name, order_ftree, order_random,
    route_for_shift,
};
use evb_fabric::routing::{route, Engine};
use evb_fabric::topo::FatTreeSpec;
use std::time::Duration;

fn ft(spec: &str) -> evb_fabric::Topology {
    FatTreeSpec::parse(spec).unwrap().build().unwrap()
}

/// Two leaves of two hosts under one spine, worked out by hand: step 2
/// sends both hosts of each leaf across, so each leaf up-link and each
/// spine down-link carries 2 flows (4 conflicts); steps 1 and 3 send one
/// flow each way (none).
#[test]
fn hand_computed_two_leaves_one_spine() {
    let t = ft("fat-tree:radix=4,hosts=4,down=2,up=1");
    assert_eq!(t.switches().len(), 3);
    let lfts = route(&t, &Engine::Minhop).unwrap();
    let order = order_by_name(&t);
    let a = analyze(&t, &lfts, &order, &shift_steps(4), 10).unwrap();
    assert_eq!(a.total.flows, 12);
    assert_eq!(a.total.conflicts, 4);
    assert_eq!(a.total.steps_with_conflicts, 1);
    assert_eq!(a.total.max_link_load, 2);
    assert_eq!(a.total.flows_on_shared_links, 8);
    let per: Vec<u64> = a.per_step.iter().map(|s| s.conflicts).collect();
    assert_eq!(per, vec![0, 4, 0]);
    assert_eq!(a.worst_links.len(), 4);
    assert!(a
        .worst_links
        .iter()
        .all(|l| l.conflicts == 1 && l.max_load == 2));
    // The bound for any order and routing is reached here.
    assert_eq!(explain(&t, &shift_steps(4), 4).0, 4);
}

#[test]
fn generators_shapes() {
    let t = ft("fat-tree:radix=36,hosts=648");
    assert_eq!((t.hosts().len(), t.switches().len()), (648, 54));
    let t = ft("fat-tree:radix=36,hosts=540,spread");
    assert_eq!(t.hosts().len(), 540);
    let t = ft("fat-tree:radix=8,hosts=27,leaves=8,spread");
    let mut pops: Vec<usize> = t
        .switches()
        .iter()
        .map(|&s| {
            t.nodes[s]
                .ports
                .iter()
                .flatten()
                .filter(|r| !t.nodes[r.node].is_switch())
                .count()
        })
        .filter(|&c| c > 0)
        .collect();
    pops.sort();
    assert_eq!(pops, vec![3, 3, 3, 3, 3, 4, 4, 4]);
    let t = ft("fat-tree:radix=36,oversub=2,hosts=100");
    let leaf = t.leaf_of(t.hosts()[0]).unwrap();
    let ups = t.nodes[leaf]
        .ports
        .iter()
        .flatten()
        .filter(|r| t.nodes[r.node].is_switch())
        .count();
    assert_eq!(ups, 12);
    let t = ft("fat-tree:radix=36,levels=3,hosts=10000");
    assert_eq!(t.hosts().len(), 10000);
    assert!(
        FatTreeSpec::parse("fat-tree:radix=36,hosts=700")
            .unwrap()
            .build()
            .is_err(),
        "700 hosts do not fit 2 levels of radix 36"
    );
    assert!(FatTreeSpec::parse("fat-tree:radix=3").is_err());
    assert!(FatTreeSpec::parse("fat-tree:radix=8,bogus=1").is_err());
}

#[test]
fn full_tree_ftree_is_conflict_free_in_ftree_and_name_order() {
    let t = ft("fat-tree:radix=16,hosts=128");
    let r = route_ftree(&t).unwrap();
    for order in [order_by_name(&t), order_ftree(&t).unwrap()] {
        let a = analyze(&t, &r.lfts, &order, &shift_steps(128), 5).unwrap();
        assert_eq!(a.total.conflicts, 0);
        assert_eq!(a.total.max_link_load, 1);
    }
    let a = analyze(&t, &r.lfts, &order_random(&t, 9), &shift_steps(128), 5).unwrap();
    assert!(a.total.conflicts > 0, "a random order should collide");
    assert!(a.worst_links[0].conflicts >= a.worst_links.last().unwrap().conflicts);
}

#[test]
fn what_if_edits_change_the_count() {
    let mut t = ft("fat-tree:radix=8,hosts=32");
    let base = analyze(
        &t,
        &route_ftree(&t).unwrap().lfts,
        &order_by_name(&t),
        &shift_steps(32),
        5,
    )
    .unwrap();
    assert_eq!(base.total.conflicts, 0);
    // A failed up-link: minhop reroutes around it and must share links.
    t.remove_link("leaf001", 8).unwrap();
    let l = route(&t, &Engine::Minhop).unwrap();
    let a = analyze(&t, &l, &order_by_name(&t), &shift_steps(32), 5).unwrap();
    assert!(a.total.conflicts > 0);
    assert_eq!(
        explain(&t, &shift_steps(32), 32).0,
        2 * (4 * 28 - 3 * 31),
        "bound for a leaf of 4 hosts and 3 up-links"
    );
    // Swapped cables keep the count finite and the analysis working.
    let mut t2 = ft("fat-tree:radix=8,hosts=32");
    t2.swap_cables("leaf001", 1, "leaf002", 1).unwrap();
    let l2 = route(&t2, &Engine::Minhop).unwrap();
    analyze(&t2, &l2, &order_by_name(&t2), &shift_steps(32), 5).unwrap();
    let mut t3 = ft("fat-tree:radix=8,hosts=32");
    t3.remove_node("node003").unwrap();
    t3.remove_node("spine02").unwrap();
    assert_eq!(t3.hosts().len(), 31);
    let l3 = route(&t3, &Engine::Dmodk).unwrap();
    analyze(&t3, &l3, &order_by_name(&t3), &shift_steps(31), 5).unwrap();
}

#[test]
fn engines_deliver_every_flow() {
    for spec in [
        "fat-tree:radix=8,hosts=27,leaves=8,spread",
        "fat-tree:radix=8,levels=3,hosts=100,spread",
        "fat-tree:radix=12,hosts=60,oversub=2",
    ] {
        let t = ft(spec);
        let n = t.hosts().len();
        for e in [
            Engine::Minhop,
            Engine::Dmodk,
            Engine::Random(3),
            Engine::Ftree,
        ] {
            let l = route(&t, &e).unwrap();
            let a = analyze(&t, &l, &order_by_name(&t), &shift_steps(n), 3).unwrap();
            assert_eq!(a.total.flows, (n * (n - 1)) as u64, "{spec} {e:?}");
        }
        // Same seed, same tables; another seed, other tables.
        assert_eq!(
            route(&t, &Engine::Random(5)).unwrap().tables,
            route(&t, &Engine::Random(5)).unwrap().tables
        );
        assert_ne!(
            route(&t, &Engine::Random(5)).unwrap().tables,
            route(&t, &Engine::Random(6)).unwrap().tables
        );
    }
}

/// A random order on a full tree collides under ftree routing; the order
/// search finds a conflict-free order.
#[test]
fn order_search_reaches_zero_when_possible() {
    // D-mod-K picks the spine by LID mod 4; rotate the LIDs on each leaf so
    // that blocks of consecutive names collide, while an order that sorts
    // each leaf's hosts by LID is conflict-free.
    let mut t = ft("fat-tree:radix=8,hosts=32");
    for (i, h) in order_by_name(&t).into_iter().enumerate() {
        let (leaf, j) = (i / 4, i % 4);
        t.nodes[h].lid = (1 + leaf * 4 + (j + leaf) % 4) as u16;
    }
    let l = route(&t, &Engine::Dmodk).unwrap();
    let steps = shift_steps(32);
    let start = analyze(&t, &l, &order_by_name(&t), &steps, 1)
        .unwrap()
        .total
        .conflicts;
    // The search itself, from the name order.
    let (o, rep) = optimize_order_from(
        &t,
        &l,
        &steps,
        vec![("name".into(), order_by_name(&t))],
        Duration::from_secs(20),
        1,
    )
    .unwrap();
    eprintln!("order search: {rep:?}");
    assert!(
        rep.start_conflicts > 0,
        "the start must have conflicts for this test to mean something"
    );
    let a = analyze(&t, &l, &o, &steps, 1).unwrap();
    assert_eq!(a.total.conflicts, rep.conflicts);
    assert_eq!(a.total.conflicts, 0, "start {start}, report {rep:?}");
    // And the command's entry point finds zero too.
    assert_eq!(
        optimize_order(&t, &l, &steps, Duration::from_secs(20), 1)
            .unwrap()
            .1
            .conflicts,
        0
    );
}

/// Route for a random order on a full tree: conflict-free tables exist
/// (destination-based, one leaf's senders to distinct spines).
#[test]
fn route_for_shift_makes_an_order_conflict_free() {
    // Round-robin over the leaves: D-mod-K by rank sends one leaf's senders
    // to one spine, but routing by position within the leaf is conflict-free.
    let t = ft("fat-tree:radix=8,hosts=32");
    let by_name = order_by_name(&t);
    let order: Vec<usize> = (0..32).map(|r| by_name[(r % 8) * 4 + r / 8]).collect();
    let steps = shift_steps(32);
    let (l, rep) = route_for_shift(&t, &order, &steps, Duration::from_secs(20)).unwrap();
    eprintln!("for-shift on the round-robin order: {rep:?}");
    assert!(rep.start_conflicts > 0);
    assert_eq!(
        analyze(&t, &l, &order, &steps, 1).unwrap().total.conflicts,
        0,
        "{rep:?}"
    );
    // A partially populated 3-level tree: better than plain D-mod-K.
    let t = ft("fat-tree:radix=8,levels=3,hosts=100,spread");
    let order = order_by_name(&t);
    let steps = shift_steps(100);
    let dmodk = analyze(&t, &route(&t, &Engine::Dmodk).unwrap(), &order, &steps, 1)
        .unwrap()
        .total
        .conflicts;
    let (l, rep) = route_for_shift(&t, &order, &steps, Duration::from_secs(5)).unwrap();
    let got = analyze(&t, &l, &order, &steps, 1).unwrap().total.conflicts;
    assert_eq!(got, rep.conflicts);
    assert!(got < dmodk, "for-shift {got} vs dmodk {dmodk}");
}

/// Oversubscription: the bound is proven and the search reports why.
#[test]
fn oversubscribed_reports_bound() {
    let t = ft("fat-tree:radix=12,hosts=60,oversub=2");
    let l = route_ftree(&t).unwrap().lfts;
    let steps = shift_steps(60);
    let (o, rep) = optimize_order(&t, &l, &steps, Duration::from_secs(3), 1).unwrap();
    assert!(rep.lower_bound > 0);
    assert!(rep.conflicts >= rep.lower_bound);
    assert!(rep.reasons.iter().any(|r| r.contains("oversubscribed")));
    assert_eq!(
        analyze(&t, &l, &o, &steps, 1).unwrap().total.conflicts,
        rep.conflicts
    );
}

#[test]
fn big_fabrics_analyse_quickly_enough() {
    let t = ft("fat-tree:radix=36,hosts=648");
    let l = route_ftree(&t).unwrap().lfts;
    let t0 = std::time::Instant::now();
    let a = analyze(&t, &l, &order_by_name(&t), &shift_steps(648), 5).unwrap();
    assert_eq!(a.total.flows, 648 * 647);
    assert!(t0.elapsed() < Duration::from_secs(20));
}

/// Damaged fabrics (random links and switches removed, cables swapped)
/// give results or errors from every engine and the analysis, never panics.
#[test]
fn damaged_fabrics_never_panic() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64::seed_from_u64(11);
    let mut errors = 0;
    for round in 0..600 {
        let spec = [
            "fat-tree:radix=8,hosts=32",
            "fat-tree:radix=8,levels=3,hosts=60,spread",
            "fat-tree:radix=6,hosts=14,spread",
        ][round % 3];
        let mut t = ft(spec);
        for _ in 0..rng.gen_range(1..6) {
            let names: Vec<String> = t.nodes.iter().map(|n| n.name.clone()).collect();
            let a = &names[rng.gen_range(0..names.len())];
            let na = t.find(a).unwrap();
            let pa = rng.gen_range(1..t.nodes[na].ports.len()) as u8;
            match rng.gen_range(0..4) {
                0 => {
                    let _ = t.remove_link(a, pa);
                }
                1 if t.nodes[na].is_switch() => {
                    let _ = t.remove_node(a);
                }
                _ => {
                    let b = &names[rng.gen_range(0..names.len())];
                    let nb = t.find(b).unwrap();
                    let pb = rng.gen_range(1..t.nodes[nb].ports.len()) as u8;
                    let _ = t.swap_cables(a, pa, b, pb);
                }
            }
        }
        let order = order_by_name(&t);
        if order.len() < 2 {
            continue;
        }
        for e in [
            Engine::Ftree,
            Engine::Minhop,
            Engine::Dmodk,
            Engine::Random(round as u64),
        ] {
            match route(&t, &e) {
                Ok(l) => {
                    let steps = shift_steps(order.len());
                    if analyze(&t, &l, &order, &steps, 3).is_err() {
                        errors += 1;
                    }
                    if round % 20 == 0 {
                        let _ = optimize_order(&t, &l, &steps, Duration::from_millis(20), 1);
                        let _ = route_for_shift(&t, &order, &steps, Duration::from_millis(20));
                    }
                }
                Err(_) => errors += 1,
            }
        }
    }
    // Damage must show up somewhere (unroutable hosts, refused fabrics).
    assert!(errors > 0);
}

/// Unique names: a shared or unusable first word gives GUID names, a map
/// wins over descriptions, a shared description is refused as a name, and
/// what a user types resolves by name or GUID.
#[test]
fn unique_names_and_resolve() {
    use evb_fabric::names::{apply_name_map, assign_unique_names, guid_name, parse_name_map_str};
    use evb_fabric::topo::NodeKind;
    let mut t = ft("fat-tree:radix=4,hosts=4,down=2,up=1");
    let hosts = t.hosts();
    for (k, &h) in hosts.iter().enumerate() {
        t.nodes[h].desc = match k {
            0 | 1 => "MT25408 ConnectX Mellanox Technologies".into(),
            2 => "MF0;sw:x/U1 HCA".into(),
            _ => "r510gluster4 HCA-1".into(),
        };
    }
    assign_unique_names(&mut t, &[]);
    let guids: Vec<u64> = t.nodes.iter().map(|n| n.guid).collect();
    let g = |i: usize| guid_name(NodeKind::Host, guids[i]);
    assert_eq!(t.nodes[hosts[0]].name, g(hosts[0]));
    assert_eq!(t.nodes[hosts[1]].name, g(hosts[1]));
    assert_eq!(t.nodes[hosts[2]].name, g(hosts[2]), "unsafe characters");
    assert_eq!(t.nodes[hosts[3]].name, "r510gluster4");
    assert_eq!(t.resolve("r510gluster4").unwrap(), hosts[3]);
    assert_eq!(t.resolve(&g(hosts[1])).unwrap(), hosts[1]);
    let port_guid = format!("0x{:x}", t.nodes[hosts[1]].port_guid);
    assert_eq!(t.resolve(&port_guid).unwrap(), hosts[1]);
    let e = t.resolve("MT25408").unwrap_err().to_string();
    assert!(
        e.contains("description of 2 nodes") && e.contains(&g(hosts[0])),
        "{e}"
    );
    assert!(t.resolve("nobody").is_err());
    let notes = evb_fabric::names::naming_notes(&t);
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains("2 hosts are named by GUID"), "{notes:?}");
    // A map names two hosts; the one it calls r510gluster4 takes that name
    // and the description-named host gives it up.
    let text = format!(
        "H-{:016x} daq01\n0x{:016x} \"r510gluster4 HCA-1\"\n",
        t.nodes[hosts[0]].guid, t.nodes[hosts[1]].guid
    );
    let map = parse_name_map_str(std::path::Path::new("m"), &text).unwrap();
    let rep = apply_name_map(&mut t, &map).unwrap();
    assert_eq!((rep.named, rep.not_in_fabric, rep.hosts_unnamed), (2, 0, 2));
    assert_eq!(t.nodes[hosts[0]].name, "daq01");
    assert_eq!(t.nodes[hosts[1]].name, "r510gluster4");
    assert_eq!(t.nodes[hosts[3]].name, g(hosts[3]));
    // Generated fabrics keep their names.
    let mut f = ft("fat-tree:radix=8,hosts=32");
    let before: Vec<String> = f.nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(f.hosts().len(), 32);
    assign_unique_names(&mut f, &[]);
    assert_eq!(
        before,
        f.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>()
    );
}

/// Slurm hostlists: ranges, padded and natural numbers, duplicates.
#[test]
fn hostlist_forms() {
    use evb_fabric::io::hostlist;
    let h = |v: &[&str]| hostlist(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(
        h(&["node1", "node2", "node3", "node4", "node7"]),
        "node[1-4,7]"
    );
    assert_eq!(h(&["node001", "node002", "node004"]), "node[001-002,004]");
    // n9 is not n09: a padded run does not take it.
    assert_eq!(h(&["n9", "n10", "n08"]), "n[08,9-10]");
    assert_eq!(h(&["n09", "n10", "n08"]), "n[08-10]");
    assert_eq!(h(&["n9", "n10", "n8"]), "n[8-10]");
    assert_eq!(h(&["n1", "n01"]), "n[1,01]");
    assert_eq!(h(&["a", "b1", "b1"]), "b1,a");
    assert_eq!(h(&["x5"]), "x5");
    assert_eq!(h(&["H-0002c90300080d28"]), "H-0002c90300080d28");
    assert_eq!(
        h(&["S-0002c90200100000", "S-0002c90200100001"]),
        "S-0002c90200100000,S-0002c90200100001"
    );
    assert_eq!(h(&[]), "");
}

/// Generated rates, the rate of a link by node and port, and degraded links
/// found per tier (host links against host links, up-links against
/// up-links).
#[test]
fn link_rates_and_degraded_links() {
    use evb_fabric::rate::{degraded_links, rate_census, LinkRate};
    let mut t = ft("fat-tree:radix=8,hosts=32,uplink_gbps=200");
    let leaf = t.find("leaf001").unwrap();
    assert_eq!(t.link_gbps(leaf, 1), Some(100.0));
    assert_eq!(t.link_gbps(leaf, 5), Some(200.0));
    assert_eq!(t.link_gbps(leaf, 9), None, "no port 9");
    let (census, unknown) = rate_census(&t);
    assert_eq!(
        census,
        vec![
            (LinkRate::parse("4xHDR").unwrap(), 32),
            (LinkRate::EDR4, 32)
        ]
    );
    assert_eq!(unknown, 0);
    assert!(
        degraded_links(&t).is_empty(),
        "faster up-links are not degraded host links"
    );
    t.set_link_rate(leaf, 6, Some(LinkRate::EDR4)).unwrap();
    t.set_link_rate(leaf, 2, Some(LinkRate::parse("1xEDR").unwrap()))
        .unwrap();
    let d = degraded_links(&t);
    assert_eq!(d.len(), 2, "{d:?}");
    let up = d.iter().find(|x| x.rate == "4xEDR").unwrap();
    assert_eq!(
        (up.node.as_str(), up.port, up.usual_rate.as_str()),
        ("leaf001", 6, "4xHDR")
    );
    assert_eq!((up.tier_links, up.tier_usual), (32, 31));
    let host = d.iter().find(|x| x.rate == "1xEDR").unwrap();
    assert_eq!(
        (host.node.as_str(), host.to.as_str(), host.gbps),
        ("node002", "leaf001", 25.0)
    );
    assert_eq!(host.tier, "host links");
    // Swapped at the leaves, each cable keeps its rate (and its host).
    t.swap_cables("leaf001", 2, "leaf002", 1).unwrap();
    let n2 = t.find("node002").unwrap();
    assert_eq!(t.link_gbps(n2, 1), Some(25.0));
    assert_eq!(t.leaf_of(n2), t.find("leaf002"));
    let n5 = t.find("node005").unwrap();
    assert_eq!(t.link_gbps(n5, 1), Some(100.0));
}

/// The receive convention is the send convention read backwards: receive
/// step s is send step N - s, labelled s, loads and all.
#[test]
fn step_convention_relabels() {
    use evb_fabric::conflicts::{analyze_with_loads, StepConvention};
    let t = ft("fat-tree:radix=8,hosts=27,leaves=8,spread");
    let l = route(&t, &Engine::Minhop).unwrap();
    let o = order_random(&t, 4);
    let send = analyze_with_loads(&t, &l, &o, &shift_steps(27), 5, 1 << 20).unwrap();
    let conv = StepConvention::Receive;
    let mut recv = analyze_with_loads(
        &t,
        &l,
        &o,
        &conv.to_send_steps(&shift_steps(27), 27),
        5,
        1 << 20,
    )
    .unwrap();
    recv.relabel_steps(conv);
    assert_eq!(recv.total, send.total);
    for s in 1..27 {
        let r = &recv.per_step[s - 1];
        let x = &send.per_step[27 - s - 1];
        assert_eq!(r.step, s);
        assert_eq!(
            (r.conflicts, r.max_link_load),
            (x.conflicts, x.max_link_load)
        );
    }
    let (ls, lr) = (send.link_loads.unwrap(), recv.link_loads.unwrap());
    assert_eq!(lr.steps, (1..27).collect::<Vec<_>>());
    for (a, b) in ls.links.iter().zip(&lr.links) {
        assert_eq!(a.name, b.name);
        let back: Vec<u32> = b.loads.iter().rev().copied().collect();
        assert_eq!(a.loads, back);
    }
    assert_eq!(StepConvention::parse("receive").unwrap(), conv);
    assert!(StepConvention::parse("up").is_err());
}

/// Conflicts weighed by link rate: on a 2:1 tree, two 100 Gb/s flows on a
/// 100 Gb/s uplink are one conflict, on a 200 Gb/s uplink none; three on
/// 200 Gb/s would be half of one. With one rate everywhere the weighted
/// count is the count.
#[test]
fn conflicts_weigh_less_on_faster_links() {
    use evb_fabric::conflicts::{analyze, shift_steps};
    use evb_fabric::routing::{route, Engine};
    let run = |spec: &str| {
        let topo = evb_fabric::io::load_topology(spec).unwrap();
        let lfts = route(&topo, &Engine::Ftree).unwrap();
        let order = evb_fabric::optimize::order_from_spec("ftree", &topo).unwrap();
        analyze(&topo, &lfts, &order, &shift_steps(order.len()), 3).unwrap()
    };
    let slow = run("fat-tree:radix=12,hosts=32,oversub=2");
    let fast = run("fat-tree:radix=12,hosts=32,oversub=2,uplink_gbps=200");
    assert!(slow.total.conflicts > 0);
    assert_eq!(slow.total.weighted_conflicts, slow.total.conflicts as f64);
    assert_eq!(fast.total.conflicts, slow.total.conflicts);
    assert_eq!(fast.total.weighted_conflicts, 0.0);
    assert!(fast.summary().contains("weighted by link rate: 0.0"));
    // Hosts at 200 Gb/s behind 200 Gb/s uplinks weigh as 100 behind 100.
    let both = run("fat-tree:radix=12,hosts=32,oversub=2,gbps=200,uplink_gbps=200");
    assert_eq!(both.total.weighted_conflicts, slow.total.weighted_conflicts);
}

/// The two published counts evb misses by a little (docs/fabric.md, "The
/// published near misses"). On leaves of 18 filled leaf by leaf with m hosts
/// on the last, every engine and every leaf-by-leaf order gives
/// (full leaves - 1) x m x (18 - m) conflicts: 27 x 8 x 10 = 2160 for 512
/// hosts, never the published 2157 (not a multiple of 27). For 45 hosts
/// (2 x 18 + 9) the published pairs node020 -> node037 and node029 ->
/// node001 share leaf002 -> spine01 in send step 17 (receive step 28), which
/// has 8 conflicts; the 9 is send step 18 (receive 27), whose pairs on
/// leaf002 -> spine02 are node020 -> node038 and node029 -> node002.
#[test]
fn published_near_misses_512_and_45_hosts() {
    use evb_fabric::conflicts::StepConvention;
    use evb_fabric::lft::{link_of, trace};
    let t = ft("fat-tree:radix=36,hosts=512");
    let ftree = route(&t, &Engine::Ftree).unwrap();
    let name = order_by_name(&t);
    for o in [&name, &order_ftree(&t).unwrap()] {
        let a = analyze(&t, &ftree, o, &shift_steps(512), 1).unwrap();
        assert_eq!(a.total.conflicts, 2160);
    }
    for e in [Engine::Minhop, Engine::Updn, Engine::Dfsssp, Engine::Dmodk] {
        let l = route(&t, &e).unwrap();
        let a = analyze(&t, &l, &name, &shift_steps(512), 1).unwrap();
        assert_eq!(a.total.conflicts, 2160, "{e:?}");
    }
    for (n, m) in [(505, 1), (513, 9)] {
        let t = ft(&format!("fat-tree:radix=36,hosts={n}"));
        let l = route(&t, &Engine::Ftree).unwrap();
        let a = analyze(&t, &l, &order_by_name(&t), &shift_steps(n), 1).unwrap();
        assert_eq!(a.total.conflicts, 27 * m * (18 - m), "{n} hosts");
    }

    let t = ft("fat-tree:radix=36,hosts=45");
    let o = order_by_name(&t);
    for e in [Engine::Ftree, Engine::Minhop, Engine::Updn, Engine::Dfsssp] {
        let l = route(&t, &e).unwrap();
        let a = analyze(&t, &l, &o, &shift_steps(45), 1).unwrap();
        let per: Vec<u64> = a.per_step.iter().map(|s| s.conflicts).collect();
        let mut want = vec![0u64; 44];
        for s in 10..=26 {
            want[s - 1] = 9 - (s as i64 - 18).unsigned_abs();
        }
        assert_eq!(per, want, "{e:?}");
        assert_eq!(a.total.conflicts, 81);
    }
    let l = route(&t, &Engine::Ftree).unwrap();
    let conv = StepConvention::Receive;
    assert_eq!((conv.to_send(28, 45), conv.to_send(27, 45)), (17, 18));
    let (offsets, _) = t.port_offsets();
    let h = |s: &str| t.resolve(s).unwrap();
    let up_link = |a: &str, b: &str| {
        let mut path = vec![];
        trace(&t, &l, &offsets, h(a), h(b), &mut path).unwrap();
        let (node, port) = link_of(&offsets, path[1]);
        let far = t.nodes[node].ports[port as usize].unwrap().node;
        (t.nodes[node].name.clone(), t.nodes[far].name.clone())
    };
    let spine = |s: &str| ("leaf002".to_string(), s.to_string());
    // Send step 17: node i -> node i + 17 (names from 1).
    assert_eq!(up_link("node020", "node037"), spine("spine01"));
    assert_eq!(up_link("node029", "node001"), spine("spine01"));
    // Send step 18.
    assert_eq!(up_link("node020", "node038"), spine("spine02"));
    assert_eq!(up_link("node029", "node002"), spine("spine02"));
}
