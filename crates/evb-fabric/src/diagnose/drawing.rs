//! The fabric as a drawing, for plots and the report: switches level by
//! level (leaves at the bottom, the hosts of each leaf as one mark under
//! it), each cable coloured by the larger waiting share of its two
//! directions and as thick as its busier direction is used, the shared
//! links of the shift marked, the ports of the best remedy highlighted,
//! and the routes of the rank pairs that share the most waited-on link.
//! Only data here: `evb-plot` draws it.

use super::explain::SharedLink;
use super::measure::LinkFigures;
use super::remedies::Remedy;
use crate::io::switch_heights;
use crate::topo::{natural_cmp, Topology};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// A node of the drawing.
#[derive(Debug, Clone, Serialize)]
pub struct DrawNode {
    /// A switch's name, or `N hosts` under a leaf.
    pub label: String,
    /// 0: hosts, 1: leaves, 2: the switches above, ...
    pub level: u32,
    /// Position along its level, 0..1.
    pub x: f64,
}

/// A cable of the drawing.
#[derive(Debug, Clone, Serialize)]
pub struct DrawLink {
    pub a: usize,
    pub b: usize,
    /// The larger waiting share of the cable's directions (or of the hosts
    /// of a host group), and the larger utilisation.
    pub wait: f64,
    pub utilisation: f64,
    /// Flows beyond the first, summed over the shift, on either direction.
    pub conflicts: u64,
    /// One of the best remedy's ports is at an end.
    pub highlight: bool,
}

/// A route through the drawing: the nodes a flow crosses.
#[derive(Debug, Clone, Serialize)]
pub struct DrawRoute {
    /// `ranks 3 -> 7 (step 4)`.
    pub label: String,
    pub nodes: Vec<usize>,
}

/// The drawing.
#[derive(Debug, Clone, Serialize)]
pub struct Drawing {
    pub nodes: Vec<DrawNode>,
    pub links: Vec<DrawLink>,
    /// What the highlight marks.
    pub highlight: String,
    /// Routes of the flows that share the most waited-on link, and that
    /// link.
    pub routes: Vec<DrawRoute>,
    pub routes_share: String,
}

/// Draws `topo`, its cables carrying the figures of `links` and `shared`,
/// and `routes` (a label and the fabric nodes a flow crosses).
pub fn draw(
    topo: &Topology,
    links: &[LinkFigures],
    shared: &[SharedLink],
    best: Option<&Remedy>,
    routes: &[(String, Vec<usize>)],
) -> Drawing {
    let h = switch_heights(topo);
    // One drawing node per switch, and per leaf one for its hosts.
    let mut at: HashMap<usize, usize> = HashMap::new();
    let mut nodes = Vec::new();
    let mut by_level: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for s in topo.switches() {
        by_level.entry(h[s].saturating_add(1)).or_default().push(s);
    }
    for (&level, members) in &mut by_level {
        members.sort_by(|&a, &b| natural_cmp(&topo.nodes[a].name, &topo.nodes[b].name));
        for (i, &s) in members.iter().enumerate() {
            at.insert(s, nodes.len());
            nodes.push(DrawNode {
                label: topo.nodes[s].name.clone(),
                level,
                x: (i as f64 + 0.5) / members.len() as f64,
            });
        }
    }
    let mut host_group: HashMap<usize, usize> = HashMap::new();
    for (leaf, xi) in leaves(topo, &at, &nodes) {
        let count = topo
            .hosts()
            .iter()
            .filter(|&&x| topo.leaf_of(x) == Some(leaf))
            .count();
        host_group.insert(leaf, nodes.len());
        nodes.push(DrawNode {
            label: format!("{count} hosts"),
            level: 0,
            x: xi,
        });
    }
    let highlight: BTreeSet<String> = best
        .map(|r| r.ports.iter().cloned().collect())
        .unwrap_or_default();
    let links = cables(topo, links, shared, &at, &host_group, &highlight);
    // A host is drawn as its leaf's host group.
    let place = |n: usize| -> Option<usize> {
        if topo.nodes[n].is_switch() {
            at.get(&n).copied()
        } else {
            host_group.get(&topo.leaf_of(n)?).copied()
        }
    };
    let routes = routes
        .iter()
        .filter_map(|(label, path)| {
            Some(DrawRoute {
                label: label.clone(),
                nodes: path.iter().map(|&n| place(n)).collect::<Option<Vec<_>>>()?,
            })
        })
        .collect();
    Drawing {
        nodes,
        links,
        highlight: best.map_or(String::new(), |r| {
            format!("{}: {}", r.kind, r.ports.join(", "))
        }),
        routes,
        routes_share: shared.first().map_or(String::new(), |s| s.link.clone()),
    }
}

/// The leaves (switches with hosts) and where their host group goes.
fn leaves(topo: &Topology, at: &HashMap<usize, usize>, nodes: &[DrawNode]) -> Vec<(usize, f64)> {
    let mut out: Vec<(usize, f64)> = topo
        .switches()
        .into_iter()
        .filter(|&s| {
            topo.nodes[s]
                .ports
                .iter()
                .flatten()
                .any(|r| !topo.nodes[r.node].is_switch())
        })
        .map(|s| (s, nodes[at[&s]].x))
        .collect();
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    out
}

/// One drawing link per cable between switches, one per leaf to its
/// host group (the worst of its host cables).
fn cables(
    topo: &Topology,
    links: &[LinkFigures],
    shared: &[SharedLink],
    at: &HashMap<usize, usize>,
    host_group: &HashMap<usize, usize>,
    highlight: &BTreeSet<String>,
) -> Vec<DrawLink> {
    let figures: HashMap<(usize, u8), &LinkFigures> =
        links.iter().map(|l| ((l.node_id, l.port), l)).collect();
    let conflicts: HashMap<(&str, u8), u64> = shared
        .iter()
        .map(|s| ((s.node.as_str(), s.port), s.conflicts))
        .collect();
    let mut merged: HashMap<(usize, usize), DrawLink> = HashMap::new();
    for (n, node) in topo.nodes.iter().enumerate() {
        for (p, r) in node.ports.iter().enumerate() {
            let Some(r) = r else { continue };
            let ends = match (node.is_switch(), topo.nodes[r.node].is_switch()) {
                (true, true) if (n, p as u8) < (r.node, r.port) => (at[&n], at[&r.node]),
                (true, false) => (at[&n], host_group[&n]),
                _ => continue,
            };
            let dirs = [(n, p as u8), (r.node, r.port)];
            let wait = dirs
                .iter()
                .filter_map(|d| figures.get(d)?.wait)
                .fold(0.0, f64::max);
            let util = dirs
                .iter()
                .filter_map(|d| figures.get(d)?.utilisation)
                .fold(0.0, f64::max);
            let conf: u64 = dirs
                .iter()
                .map(|&(x, q)| {
                    conflicts
                        .get(&(topo.nodes[x].name.as_str(), q))
                        .copied()
                        .unwrap_or(0)
                })
                .sum();
            let lit = dirs
                .iter()
                .any(|&(x, q)| highlight.contains(&format!("{}:{q}", topo.nodes[x].name)));
            let e = merged.entry(ends).or_insert(DrawLink {
                a: ends.0,
                b: ends.1,
                wait: 0.0,
                utilisation: 0.0,
                conflicts: 0,
                highlight: false,
            });
            e.wait = e.wait.max(wait);
            e.utilisation = e.utilisation.max(util);
            e.conflicts += conf;
            e.highlight |= lit;
        }
    }
    let mut out: Vec<DrawLink> = merged.into_values().collect();
    out.sort_by_key(|l| (l.a, l.b));
    out
}
