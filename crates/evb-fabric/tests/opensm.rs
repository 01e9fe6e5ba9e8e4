//! Tests against the real OpenSM running on ibsim.

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
