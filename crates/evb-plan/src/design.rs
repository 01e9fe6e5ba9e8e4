//! Candidate designs: for each link generation, ports per node, switch
//! model and blocking factor, the fat trees that hold the hosts (two
//! levels, three levels when two do not reach, a director with the nodes
//! cabled into it, leaves under a director spine), each with its hosts
//! filled leaf by leaf and spread over the leaves where the two differ.
//! Every design is an `evb-fabric` generator spec, so that `evb fabric`
//! and `evb sim` rebuild the very fabric the plan priced.

use serde::Serialize;

use crate::catalog::{Generation, SwitchModel};
use crate::requirement::{EmHost, Requirement};

/// How the switches are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Structure {
    /// Leaves and spines of one switch model.
    TwoLevel,
    /// Leaves, mid switches in pods, roots.
    ThreeLevel,
    /// The nodes cabled straight into a director chassis.
    Director,
    /// Leaf switches, their up-links into a director chassis.
    LeafDirector,
}

impl Structure {
    pub fn label(self) -> &'static str {
        match self {
            Structure::TwoLevel => "2-level",
            Structure::ThreeLevel => "3-level",
            Structure::Director => "director",
            Structure::LeafDirector => "leaf+director",
        }
    }
}

/// A candidate before it is evaluated: what is bought and how it is cabled.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub generation: String,
    pub port_gbps: f64,
    pub ports_per_node: usize,
    pub structure: Structure,
    /// The leaf (and spine) switch model, if any, and the director, if any.
    pub leaf_model: Option<String>,
    pub director_model: Option<String>,
    /// Leaf down-links per up-link (1: non-blocking).
    pub blocking: f64,
    /// `fill` (leaf by leaf) or `spread` (round-robin over the leaves).
    pub placement: &'static str,
    /// Hosts of the fabric (the nodes' ports, and the EM's), and the
    /// event builder's endpoints (one per node port).
    pub hosts: usize,
    pub endpoints: usize,
    pub leaves: usize,
    /// The `evb-fabric` generator spec of the fabric.
    pub spec: String,
}

impl Candidate {
    /// A one-line name: `EDR 1x 2-level EDR-36 fill`.
    pub fn name(&self) -> String {
        let mut parts = vec![
            self.generation.clone(),
            format!("{}x", self.ports_per_node),
            self.structure.label().to_string(),
        ];
        parts.extend(self.leaf_model.clone());
        parts.extend(self.director_model.clone());
        if self.blocking != 1.0 {
            parts.push(format!("{}:1", self.blocking));
        }
        parts.push(self.placement.to_string());
        parts.join(" ")
    }
}

/// Leaf ports down and up for a radix and blocking factor.
pub fn leaf_split(radix: usize, blocking: f64) -> (usize, usize) {
    let down = ((radix as f64) * blocking / (blocking + 1.0)).floor() as usize;
    let down = down.clamp(1, radix - 1);
    (down, radix - down)
}

/// The hosts a design's fabric has, and the host ports it must offer
/// (its hosts and the spare ports).
fn host_counts(req: &Requirement, ports: usize) -> (usize, usize, usize) {
    let endpoints = req.nodes * ports;
    let hosts = endpoints + usize::from(req.em == EmHost::Separate);
    let spare = (endpoints as f64 * req.spare_ports).ceil() as usize;
    (endpoints, hosts, hosts + spare)
}

/// Every candidate of the requirement.
pub fn candidates(req: &Requirement) -> Vec<Candidate> {
    let mut out = Vec::new();
    for gname in &req.generations {
        let g = req.generation(gname).expect("checked by the requirement");
        for &ports in &req.ports_per_node {
            if !worth_considering(g, ports, req.gbps_per_node) {
                continue;
            }
            let models: Vec<&SwitchModel> = req
                .switches
                .iter()
                .filter(|s| &s.generation == gname)
                .collect();
            for s in models.iter().filter(|s| !s.director) {
                for &b in &req.blocking {
                    out.extend(trees(req, g, ports, s, b));
                }
            }
            for d in models.iter().filter(|s| s.director) {
                out.extend(director_direct(req, g, ports, d));
                for s in models.iter().filter(|s| !s.director) {
                    for &b in &req.blocking {
                        out.extend(leaf_director(req, g, ports, s, d, b));
                    }
                }
            }
        }
    }
    out
}

/// Whether `ports` ports of `g` can come near the rate a node needs
/// (within 10 %: near misses are shown), without being absurdly more
/// (over 4x); two ports only where one cannot carry it.
fn worth_considering(g: &Generation, ports: usize, need: f64) -> bool {
    let line = g.gbps * ports as f64;
    let one_port_short = g.gbps * 0.97 < need;
    line >= 0.9 * need && line <= 4.0 * need && (ports == 1 || one_port_short)
}

/// The candidate with its common fields; `spec` gets the generation's rate.
#[allow(clippy::too_many_arguments)]
fn candidate(
    g: &Generation,
    ports: usize,
    structure: Structure,
    leaf: Option<&SwitchModel>,
    director: Option<&SwitchModel>,
    blocking: f64,
    placement: &'static str,
    (endpoints, hosts, leaves): (usize, usize, usize),
    spec: String,
) -> Candidate {
    let spread = if placement == "spread" { ",spread" } else { "" };
    Candidate {
        generation: g.name.clone(),
        port_gbps: g.gbps,
        ports_per_node: ports,
        structure,
        leaf_model: leaf.map(|s| s.name.clone()),
        director_model: director.map(|s| s.name.clone()),
        blocking,
        placement,
        hosts,
        endpoints,
        leaves,
        spec: format!("{spec}{spread},gbps={}", g.gbps),
    }
}

/// The placements worth telling apart: fill and spread differ only when
/// some leaf is not full; fill leaves empty leaves where there are more
/// leaves than the hosts need (spare ports), which OpenSM's ftree refuses.
fn placements(hosts: usize, leaves: usize, down: usize) -> Vec<&'static str> {
    let min_leaves = hosts.div_ceil(down);
    if leaves > min_leaves {
        vec!["spread"]
    } else if hosts == leaves * down {
        vec!["fill"]
    } else {
        vec!["fill", "spread"]
    }
}

/// Two-level trees of `s` (or three levels if two cannot hold the hosts).
fn trees(
    req: &Requirement,
    g: &Generation,
    ports: usize,
    s: &SwitchModel,
    b: f64,
) -> Vec<Candidate> {
    let k = s.ports;
    let (down, up) = leaf_split(k, b);
    let (endpoints, hosts, wanted) = host_counts(req, ports);
    let leaves = wanted.div_ceil(down);
    if leaves <= k {
        let spec = format!("fat-tree:radix={k},hosts={hosts},down={down},up={up},leaves={leaves}");
        return placements(hosts, leaves, down)
            .into_iter()
            .map(|p| {
                let c = (endpoints, hosts, leaves);
                candidate(
                    g,
                    ports,
                    Structure::TwoLevel,
                    Some(s),
                    None,
                    b,
                    p,
                    c,
                    spec.clone(),
                )
            })
            .collect();
    }
    let per_pod = (k / 2) * down;
    let pods = wanted.div_ceil(per_pod);
    if pods > k {
        return Vec::new();
    }
    let spec = format!("fat-tree:radix={k},levels=3,hosts={hosts},down={down},up={up},pods={pods}");
    let c = (endpoints, hosts, pods * (k / 2));
    // Spread only: filling leaves some leaves of the last pod empty.
    vec![candidate(
        g,
        ports,
        Structure::ThreeLevel,
        Some(s),
        None,
        b,
        "spread",
        c,
        spec,
    )]
}

/// The nodes cabled into a director: its chips are a 2-level tree.
fn director_direct(
    req: &Requirement,
    g: &Generation,
    ports: usize,
    d: &SwitchModel,
) -> Vec<Candidate> {
    let c = evb_fabric::topo::director_chip_radix(d.ports).expect("checked by the requirement");
    let (endpoints, hosts, wanted) = host_counts(req, ports);
    if wanted > d.ports {
        return Vec::new();
    }
    let lines = wanted.div_ceil(c / 2);
    // Written as the 2-level tree of the chips' radix is: the same fabric
    // gets the same spec, analysis and simulation.
    let spec = format!(
        "fat-tree:radix={c},hosts={hosts},down={},up={},leaves={lines}",
        c / 2,
        c / 2
    );
    placements(hosts, lines, c / 2)
        .into_iter()
        .map(|p| {
            let counts = (endpoints, hosts, lines);
            candidate(
                g,
                ports,
                Structure::Director,
                None,
                Some(d),
                1.0,
                p,
                counts,
                spec.clone(),
            )
        })
        .collect()
}

/// Leaves of `s` with their up-links into director `d`, as many leaves
/// in each of the director's line-chip groups (OpenSM's ftree refuses
/// line chips with different numbers of leaves below).
fn leaf_director(
    req: &Requirement,
    g: &Generation,
    ports: usize,
    s: &SwitchModel,
    d: &SwitchModel,
    b: f64,
) -> Vec<Candidate> {
    let c = evb_fabric::topo::director_chip_radix(d.ports).expect("checked by the requirement");
    let k = s.ports;
    let (down, up) = leaf_split(k, b);
    let (endpoints, hosts, wanted) = host_counts(req, ports);
    let min_leaves = wanted.div_ceil(down);
    let pods = min_leaves.div_ceil(c / 2);
    let leaves = pods * min_leaves.div_ceil(pods);
    if leaves * up > d.ports || pods * up > c || leaves < 2 {
        return Vec::new();
    }
    let spec = format!(
        "fat-tree:radix={k},hosts={hosts},down={down},up={up},leaves={leaves},director={}",
        d.ports
    );
    placements(hosts, leaves, down)
        .into_iter()
        .map(|p| {
            let counts = (endpoints, hosts, leaves);
            let st = Structure::LeafDirector;
            candidate(g, ports, st, Some(s), Some(d), b, p, counts, spec.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requirement::{resolve, Flags};

    fn req(nodes: usize, gbps: f64, em: EmHost) -> Requirement {
        resolve(
            None,
            &Flags {
                nodes: Some(nodes),
                gbps: Some(gbps),
                em: Some(em),
                ..Flags::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn published_hand_counts_are_candidates() {
        let c = candidates(&req(540, 80.0, EmHost::Node0));
        let edr36 = c
            .iter()
            .find(|c| {
                c.structure == Structure::TwoLevel && c.leaf_model.as_deref() == Some("EDR-36")
            })
            .unwrap();
        assert_eq!(edr36.leaves, 30);
        assert!(edr36
            .spec
            .starts_with("fat-tree:radix=36,hosts=540,down=18,up=18,leaves=30"));
        let c = candidates(&req(528, 80.0, EmHost::Node0));
        let edr48 = c
            .iter()
            .find(|c| {
                c.structure == Structure::TwoLevel && c.leaf_model.as_deref() == Some("EDR-48")
            })
            .unwrap();
        assert_eq!(edr48.leaves, 22);
        // 512 nodes on 36-port leaves: 29 leaves, filled or spread.
        let c = candidates(&req(512, 80.0, EmHost::Node0));
        let n: Vec<&Candidate> = c
            .iter()
            .filter(|c| {
                c.structure == Structure::TwoLevel && c.leaf_model.as_deref() == Some("EDR-36")
            })
            .collect();
        assert_eq!(n.len(), 2);
        assert!(n.iter().all(|c| c.leaves == 29));
    }

    #[test]
    fn two_ports_only_where_one_is_short() {
        let c = candidates(&req(100, 80.0, EmHost::Separate));
        assert!(c.iter().all(|c| c.ports_per_node == 1));
        let c = candidates(&req(100, 150.0, EmHost::Separate));
        assert!(c
            .iter()
            .any(|c| c.ports_per_node == 2 && c.generation == "EDR"));
        assert!(c
            .iter()
            .any(|c| c.ports_per_node == 1 && c.generation == "HDR"));
        assert!(
            !c.iter().any(|c| c.generation == "XDR"),
            "800 for 150 is over 4x"
        );
    }

    #[test]
    fn leaf_director_balances_its_pods() {
        let c = candidates(&req(540, 80.0, EmHost::Separate));
        let d = c
            .iter()
            .find(|c| {
                c.structure == Structure::LeafDirector && c.leaf_model.as_deref() == Some("EDR-36")
            })
            .unwrap();
        // 541 hosts need 31 leaves of 18; two line-chip groups of 16.
        assert_eq!(d.leaves, 32);
        let topo = evb_fabric::topo::FatTreeSpec::parse(&d.spec)
            .unwrap()
            .build()
            .unwrap();
        assert!(evb_fabric::ftree::route_ftree(&topo).is_ok(), "{}", d.spec);
    }
}
