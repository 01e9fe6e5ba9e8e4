//! What is wrong with the fabric itself, read from its cabling and link
//! rates the way a network engineer reads an `ibnetdiscover` dump against
//! the tree it should be:
//!
//! - **crossed cables**: two switches below a level each reach one switch
//!   above twice and another not at all, the other way round (their
//!   up-links were swapped); the cable whose port breaks the port pattern
//!   every other switch follows is the one named;
//! - **missing cable**: a switch reaches an upper switch fewer times than
//!   its peers do and has no extra cable elsewhere; the free ports the
//!   pattern puts it on are named;
//! - **crossed host cables**: two hosts cabled to each other's leaf, seen
//!   in a rank order that keeps each leaf's hosts together (two leaves'
//!   ranks have holes that exchanging one host each fills);
//! - **degraded link**: slower than the usual rate of its tier
//!   ([`crate::rate::degraded_links`]);
//! - **short leaf**: fewer hosts than the fullest leaves (a missing node);
//! - **oversubscribed leaf**: more hosts than up-links;
//! - **cable errors**: error counters that grew (symbol errors, link
//!   downs, receive errors): which cable to check.
//!
//! A finding that a cable can fix carries the [`Repair`].

use super::measure::LinkFigures;
use crate::io::switch_heights;
use crate::rate::{degraded_links, LinkRate};
use crate::topo::Topology;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A port: node and port number.
pub type At = (usize, u8);

/// What fixes a finding.
#[derive(Debug, Clone, PartialEq)]
pub enum Repair {
    /// Swap the far ends of the cables at these two ports.
    Swap(At, At),
    /// Cable these two ports.
    Connect(At, At, Option<LinkRate>),
    /// Bring the cable at this port back to this rate.
    Rate(At, LinkRate),
}

/// One thing wrong with the fabric.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// `crossed-cables`, `missing-cable`, `crossed-host-cables`,
    /// `degraded-link`, `short-leaf`, `oversubscribed-leaf`, `cable-errors`.
    pub kind: &'static str,
    /// The ports concerned, `NAME:PORT`.
    pub ports: Vec<String>,
    pub what: String,
    #[serde(skip)]
    pub repair: Option<Repair>,
    /// Shared links it explains (`NAME:PORT->NAME:PORT`): fewer conflicts
    /// on them once it is fixed or worked around.
    pub explains: Vec<String>,
    /// The measured waiting on those links (summed shares of the interval).
    pub blame: f64,
}

/// `NAME:PORT`.
pub fn port_name(topo: &Topology, at: At) -> String {
    format!("{}:{}", topo.nodes[at.0].name, at.1)
}

/// Both ends of the cable at `at`, `NAME:PORT` each.
fn cable_ends(topo: &Topology, at: At) -> Vec<String> {
    let mut v = vec![port_name(topo, at)];
    if let Some(r) = topo.nodes[at.0].ports[at.1 as usize] {
        v.push(port_name(topo, (r.node, r.port)));
    }
    v
}

/// Every finding, structural first, then the cables with errors.
pub fn find(topo: &Topology, order: &[usize], links: &[LinkFigures]) -> Vec<Finding> {
    let mut out = Vec::new();
    let up = UpLinks::new(topo);
    out.extend(up.crossed(topo));
    out.extend(up.missing(topo));
    out.extend(crossed_hosts(topo, order));
    out.extend(degraded(topo));
    // A leaf short of an up-link because a cable is missing is said once.
    let missing: BTreeSet<String> = out
        .iter()
        .filter(|f| f.kind == "missing-cable")
        .filter_map(|f| f.ports.first()?.split(':').next().map(str::to_string))
        .collect();
    out.extend(leaves(topo).into_iter().filter(|f| {
        f.kind != "oversubscribed-leaf"
            || !f
                .ports
                .first()
                .and_then(|p| p.split(':').next())
                .is_some_and(|l| missing.contains(l))
    }));
    out.extend(errors(topo, links));
    out
}

/// The cables from each switch to the switches one level up.
struct UpLinks {
    /// (lower, upper) -> the cables' ports (lower port, upper port).
    cables: BTreeMap<(usize, usize), Vec<(u8, u8)>>,
    /// Per lower switch, the upper switches its peers reach.
    expected: HashMap<usize, BTreeSet<usize>>,
    /// Cables per (lower, upper) pair on a healthy tree.
    usual: usize,
    /// Per lower port number, the upper switch most lower switches reach
    /// through it; per upper port number, the lower switch most uppers do.
    by_lower_port: PortPattern,
    by_upper_port: PortPattern,
    /// Per node: what tells switches of one kind apart in the patterns.
    kind: Vec<u32>,
}

impl UpLinks {
    fn new(topo: &Topology) -> UpLinks {
        let h = switch_heights(topo);
        let mut cables: BTreeMap<(usize, usize), Vec<(u8, u8)>> = BTreeMap::new();
        for s in topo.switches() {
            for (p, r) in topo.nodes[s].ports.iter().enumerate() {
                let Some(r) = r else { continue };
                if topo.nodes[r.node].is_switch() && h[r.node] == h[s].saturating_add(1) {
                    cables
                        .entry((s, r.node))
                        .or_default()
                        .push((p as u8, r.port));
                }
            }
        }
        let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
        for c in cables.values() {
            *counts.entry(c.len()).or_default() += 1;
        }
        let usual = counts.into_iter().max_by_key(|x| x.1).map_or(1, |x| x.0);
        let expected = expected_uppers(&cables);
        // Switches of one height and port count follow one pattern.
        let kind: Vec<u32> = topo
            .nodes
            .iter()
            .zip(&h)
            .map(|(n, &h)| h.saturating_mul(1024).saturating_add(n.nports() as u32))
            .collect();
        let (by_lower_port, by_upper_port) = port_patterns(&cables, &kind);
        UpLinks {
            cables,
            expected,
            usual,
            by_lower_port,
            by_upper_port,
            kind,
        }
    }

    fn count(&self, lo: usize, up: usize) -> usize {
        self.cables.get(&(lo, up)).map_or(0, Vec::len)
    }

    /// Per lower switch: upper switches it reaches too often, and too
    /// rarely.
    fn imbalance(&self) -> BTreeMap<usize, (Vec<usize>, Vec<usize>)> {
        let mut out: BTreeMap<usize, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
        for (&lo, ups) in &self.expected {
            for &up in ups {
                let c = self.count(lo, up);
                if c > self.usual {
                    out.entry(lo).or_default().0.push(up);
                } else if c < self.usual {
                    out.entry(lo).or_default().1.push(up);
                }
            }
        }
        out
    }

    /// Pairs of switches whose up-links were swapped.
    fn crossed(&self, topo: &Topology) -> Vec<Finding> {
        let imb = self.imbalance();
        let mut used = BTreeSet::new();
        let mut out = Vec::new();
        for (&a, (a_over, a_under)) in &imb {
            for (&b, (b_over, b_under)) in imb.range(a + 1..) {
                if used.contains(&a) || used.contains(&b) {
                    continue;
                }
                // a reaches y too often and x too rarely; b the other way.
                let pair = a_over.iter().find_map(|&y| {
                    a_under
                        .iter()
                        .find(|&&x| b_over.contains(&x) && b_under.contains(&y))
                        .map(|&x| (x, y))
                });
                let Some((x, y)) = pair else { continue };
                let pa = self.odd_cable(a, y);
                let pb = self.odd_cable(b, x);
                used.extend([a, b]);
                let mut ports = cable_ends(topo, (a, pa));
                ports.extend(cable_ends(topo, (b, pb)));
                out.push(Finding {
                    kind: "crossed-cables",
                    what: format!(
                        "crossed cables: {} reaches {} twice and {} not at all, {} the other way round: the cables at {} and {} are swapped",
                        topo.nodes[a].name, topo.nodes[y].name, topo.nodes[x].name, topo.nodes[b].name,
                        port_name(topo, (a, pa)), port_name(topo, (b, pb))
                    ),
                    ports,
                    repair: Some(Repair::Swap((a, pa), (b, pb))),
                    explains: Vec::new(),
                    blame: 0.0,
                });
            }
        }
        out
    }

    /// Of `lo`'s cables to `up`, the one whose port the other switches use
    /// for another upper switch (the last one if none stands out).
    fn odd_cable(&self, lo: usize, up: usize) -> u8 {
        let h = self.kind[lo];
        let cables = &self.cables[&(lo, up)];
        cables
            .iter()
            .find(|(p, _)| self.by_lower_port.get(&(h, *p)).is_some_and(|&u| u != up))
            .or_else(|| cables.last())
            .map_or(0, |c| c.0)
    }

    /// Cables missing between a switch and an upper one, where the switch
    /// has no extra cable elsewhere.
    fn missing(&self, topo: &Topology) -> Vec<Finding> {
        let mut out = Vec::new();
        for (lo, (over, under)) in self.imbalance() {
            if !over.is_empty() {
                continue;
            }
            for up in under {
                for _ in self.count(lo, up)..self.usual {
                    out.push(self.missing_one(topo, lo, up));
                }
            }
        }
        out
    }

    fn missing_one(&self, topo: &Topology, lo: usize, up: usize) -> Finding {
        let (hl, hu) = (self.kind[lo], self.kind[up]);
        let free = |n: usize| {
            (1..topo.nodes[n].ports.len())
                .filter(move |&p| topo.nodes[n].ports[p].is_none())
                .map(|p| p as u8)
        };
        let pl = free(lo).find(|&p| self.by_lower_port.get(&(hl, p)) == Some(&up));
        let pu = free(up).find(|&p| self.by_upper_port.get(&(hu, p)) == Some(&lo));
        let rate = self
            .cables
            .iter()
            .find(|((l, _), _)| *l != lo)
            .and_then(|((l, _), c)| topo.link_rate(*l, c[0].0));
        let (lname, uname) = (&topo.nodes[lo].name, &topo.nodes[up].name);
        match (pl, pu) {
            (Some(pl), Some(pu)) => Finding {
                kind: "missing-cable",
                ports: vec![port_name(topo, (lo, pl)), port_name(topo, (up, pu))],
                what: format!(
                    "missing cable: {lname} reaches {uname} {} time(s) where its peers do {}: the cable {} - {} is missing or down",
                    self.count(lo, up), self.usual, port_name(topo, (lo, pl)), port_name(topo, (up, pu))
                ),
                repair: Some(Repair::Connect((lo, pl), (up, pu), rate)),
                explains: Vec::new(),
                blame: 0.0,
            },
            _ => Finding {
                kind: "missing-cable",
                ports: vec![lname.clone(), uname.clone()],
                what: format!(
                    "missing cable: {lname} reaches {uname} {} time(s) where its peers do {} (no free port pair stands out)",
                    self.count(lo, up), self.usual
                ),
                repair: None,
                explains: Vec::new(),
                blame: 0.0,
            },
        }
    }
}

/// Per lower switch: the upper switches reached by at least half of the
/// lower switches that share an upper switch with it (its pod or tier).
fn expected_uppers(
    cables: &BTreeMap<(usize, usize), Vec<(u8, u8)>>,
) -> HashMap<usize, BTreeSet<usize>> {
    let mut ups: HashMap<usize, BTreeSet<usize>> = HashMap::new();
    let mut downs: HashMap<usize, BTreeSet<usize>> = HashMap::new();
    for &(lo, up) in cables.keys() {
        ups.entry(lo).or_default().insert(up);
        downs.entry(up).or_default().insert(lo);
    }
    let mut out = HashMap::new();
    for (&lo, mine) in &ups {
        let peers: BTreeSet<usize> = mine.iter().flat_map(|u| downs[u].iter().copied()).collect();
        let mut reach: BTreeMap<usize, usize> = BTreeMap::new();
        for p in &peers {
            for &u in &ups[p] {
                *reach.entry(u).or_default() += 1;
            }
        }
        let want: BTreeSet<usize> = reach
            .into_iter()
            .filter(|&(_, c)| 2 * c >= peers.len())
            .map(|(u, _)| u)
            .collect();
        out.insert(lo, want);
    }
    out
}

/// (kind of switch, port number) -> the switch reached through it.
type PortPattern = HashMap<(u32, u8), usize>;

/// The port patterns of the tree: which upper switch lower switches of a
/// kind reach through each port number, and which lower switch upper
/// switches reach through each of theirs (by majority).
fn port_patterns(
    cables: &BTreeMap<(usize, usize), Vec<(u8, u8)>>,
    kind: &[u32],
) -> (PortPattern, PortPattern) {
    let mut lower: HashMap<(u32, u8), BTreeMap<usize, usize>> = HashMap::new();
    let mut upper: HashMap<(u32, u8), BTreeMap<usize, usize>> = HashMap::new();
    for (&(lo, up), cs) in cables {
        for &(pl, pu) in cs {
            let (kl, ku) = ((kind[lo], pl), (kind[up], pu));
            *lower.entry(kl).or_default().entry(up).or_default() += 1;
            *upper.entry(ku).or_default().entry(lo).or_default() += 1;
        }
    }
    let majority = |m: HashMap<(u32, u8), BTreeMap<usize, usize>>| -> PortPattern {
        m.into_iter()
            .filter_map(|(k, c)| {
                let total: usize = c.values().sum();
                let (&best, &n) = c.iter().max_by_key(|x| x.1)?;
                (2 * n > total).then_some((k, best))
            })
            .collect()
    };
    (majority(lower), majority(upper))
}

/// Ranks missing between the lowest and the highest of `ranks`.
fn holes(ranks: impl Iterator<Item = usize> + Clone) -> usize {
    match (ranks.clone().min(), ranks.clone().max()) {
        (Some(lo), Some(hi)) => hi - lo + 1 - ranks.count(),
        _ => 0,
    }
}

/// Hosts cabled to each other's leaf, seen in a rank order that keeps
/// each leaf's hosts together (a batch scheduler's order by name, on a
/// tree cabled in name order): two leaves whose ranks have holes, which
/// exchanging one host each fills. Such a host is the lowest or highest
/// rank of its leaf, so only those are tried.
fn crossed_hosts(topo: &Topology, order: &[usize]) -> Vec<Finding> {
    let mut ranks: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (r, &h) in order.iter().enumerate() {
        if let Some(l) = topo.leaf_of(h) {
            ranks.entry(l).or_default().push(r);
        }
    }
    let ends: Vec<(usize, usize)> = ranks
        .iter()
        .filter(|(_, rs)| holes(rs.iter().copied()) > 0)
        .flat_map(|(&l, rs)| {
            let (lo, hi) = (rs.iter().min().copied(), rs.iter().max().copied());
            [lo, hi].into_iter().flatten().map(move |r| (r, l))
        })
        .collect();
    // (rank, its leaf, the leaf it belongs with), two per crossed pair.
    let mut strays: Vec<(usize, usize, usize)> = Vec::new();
    for (i, &(r1, l1)) in ends.iter().enumerate() {
        for &(r2, l2) in &ends[i + 1..] {
            if l1 == l2 {
                continue;
            }
            let swapped = |mine: &Vec<usize>, out: usize, into: usize| {
                holes(
                    mine.iter()
                        .copied()
                        .filter(move |&r| r != out)
                        .chain([into]),
                )
            };
            if swapped(&ranks[&l1], r1, r2) == 0 && swapped(&ranks[&l2], r2, r1) == 0 {
                strays.push((r1, l1, l2));
                strays.push((r2, l2, l1));
            }
        }
    }
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for (i, &(r1, l1, t1)) in strays.iter().enumerate() {
        let Some(&(r2, _, _)) = strays[i + 1..]
            .iter()
            .find(|&&(r2, l2, t2)| l2 == t1 && t2 == l1 && !used.contains(&r2))
        else {
            continue;
        };
        if used.contains(&r1) {
            continue;
        }
        used.extend([r1, r2]);
        let (h1, h2) = (order[r1], order[r2]);
        let p1 = topo.nodes[h1]
            .first_port()
            .and_then(|p| topo.nodes[h1].ports[p as usize]);
        let p2 = topo.nodes[h2]
            .first_port()
            .and_then(|p| topo.nodes[h2].ports[p as usize]);
        let (Some(p1), Some(p2)) = (p1, p2) else {
            continue;
        };
        let (a, b) = ((p1.node, p1.port), (p2.node, p2.port));
        let mut ports = cable_ends(topo, a);
        ports.extend(cable_ends(topo, b));
        out.push(Finding {
            kind: "crossed-host-cables",
            what: format!(
                "crossed host cables: {} (rank {r1}) is on {} among the ranks of {}, and {} (rank {r2}) the other way round: the cables at {} and {} are swapped",
                topo.nodes[h1].name, topo.nodes[l1].name, topo.nodes[t1].name, topo.nodes[h2].name,
                port_name(topo, a), port_name(topo, b)
            ),
            ports,
            repair: Some(Repair::Swap(a, b)),
            explains: Vec::new(),
            blame: 0.0,
        });
    }
    out
}

fn degraded(topo: &Topology) -> Vec<Finding> {
    degraded_links(topo)
        .into_iter()
        .filter_map(|d| {
            let n = topo.find(&d.node)?;
            let usual = LinkRate::parse(&d.usual_rate).ok()?;
            Some(Finding {
                kind: "degraded-link",
                ports: cable_ends(topo, (n, d.port)),
                what: format!("degraded link: {}", d.describe()),
                repair: Some(Repair::Rate((n, d.port), usual)),
                explains: Vec::new(),
                blame: 0.0,
            })
        })
        .collect()
}

/// Short and oversubscribed leaves.
fn leaves(topo: &Topology) -> Vec<Finding> {
    let mut hosts: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    let mut ups: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    for s in topo.switches() {
        for (p, r) in topo.nodes[s].ports.iter().enumerate() {
            let Some(r) = r else { continue };
            let into = if topo.nodes[r.node].is_switch() {
                &mut ups
            } else {
                &mut hosts
            };
            into.entry(s).or_default().push(p as u8);
        }
    }
    let full = hosts.values().map(Vec::len).max().unwrap_or(0);
    // Host ports of the full leaves: where a missing host would be.
    let host_ports: BTreeSet<u8> = hosts
        .values()
        .filter(|v| v.len() == full)
        .flatten()
        .copied()
        .collect();
    let mut out = Vec::new();
    let short = hosts.values().filter(|v| v.len() < full).count();
    for (&leaf, hs) in &hosts {
        let name = &topo.nodes[leaf].name;
        let up = ups.get(&leaf).map_or(0, Vec::len);
        if hs.len() < full && 2 * short <= hosts.len() {
            let empty: Vec<String> = host_ports
                .iter()
                .filter(|&&p| {
                    topo.nodes[leaf]
                        .ports
                        .get(p as usize)
                        .is_some_and(Option::is_none)
                })
                .map(|&p| port_name(topo, (leaf, p)))
                .collect();
            out.push(Finding {
                kind: "short-leaf",
                what: format!(
                    "short leaf: {name} has {} hosts where the fullest leaves have {full} (missing node{}: {})",
                    hs.len(),
                    if full - hs.len() > 1 { "s" } else { "" },
                    if empty.is_empty() { "no free host port".to_string() } else { empty.join(", ") }
                ),
                ports: if empty.is_empty() { vec![name.clone()] } else { empty },
                repair: None,
                explains: Vec::new(),
                blame: 0.0,
            });
        }
        if up > 0 && hs.len() > up {
            out.push(Finding {
                kind: "oversubscribed-leaf",
                what: format!(
                    "oversubscribed leaf: {name} has {} hosts and {up} up-links",
                    hs.len()
                ),
                ports: ups[&leaf]
                    .iter()
                    .map(|&p| port_name(topo, (leaf, p)))
                    .collect(),
                repair: None,
                explains: Vec::new(),
                blame: 0.0,
            });
        }
    }
    out
}

/// Cables whose error counters grew: which to check.
fn errors(topo: &Topology, links: &[LinkFigures]) -> Vec<Finding> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for l in links.iter().filter(|l| !l.errors.is_empty()) {
        let (x, y) = ((l.node_id, l.port), (l.to_id, l.to_port));
        if !seen.insert((x.min(y), x.max(y))) {
            continue;
        }
        let counts: Vec<String> = l.errors.iter().map(|(k, v)| format!("{k} +{v}")).collect();
        out.push(Finding {
            kind: "cable-errors",
            ports: cable_ends(topo, (l.node_id, l.port)),
            what: format!(
                "errors on {}: {}: check or reseat the cable",
                l.link,
                counts.join(", ")
            ),
            repair: None,
            explains: Vec::new(),
            blame: 0.0,
        });
    }
    out
}
