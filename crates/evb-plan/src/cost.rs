//! What a design costs: its switches by model, its cables by kind and
//! length class, from the racks they run between.
//!
//! Assumptions (docs/plan.md): hosts fill racks in the order the fabric
//! numbers them (a node's ports side by side); a leaf sits in the rack of
//! its first host; every other switch (spines, mid and root switches, a
//! director) sits in a network rack at the middle of the room. A cable in
//! one rack is `in_rack_m` long; one between racks runs the Manhattan
//! distance plus `slack_m`. Its length is rounded up to the next length
//! sold; passive copper up to the generation's reach, active copper up to
//! its reach, optics beyond. Cables inside a director chassis are not
//! bought (nor counted).

use std::collections::BTreeMap;

use evb_fabric::Topology;
use serde::Serialize;

use crate::catalog::Generation;
use crate::design::{Candidate, Structure};
use crate::requirement::{Layout, Requirement};

/// Lengths cables are sold in, m.
pub const LENGTHS_M: &[f64] = &[
    0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0, 70.0, 100.0,
];

/// Kinds of cable, cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CableKind {
    Dac,
    ActiveCopper,
    Optics,
}

impl CableKind {
    pub fn label(self) -> &'static str {
        match self {
            CableKind::Dac => "DAC",
            CableKind::ActiveCopper => "active copper",
            CableKind::Optics => "optics",
        }
    }
}

/// Cables of one kind and length class.
#[derive(Debug, Clone, Serialize)]
pub struct CableLine {
    pub kind: CableKind,
    pub length_m: f64,
    pub count: usize,
    pub unit_price: f64,
}

/// Switches of one model.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchLine {
    pub model: String,
    /// What they are: leaves, spines, mid, root, director.
    pub role: String,
    pub count: usize,
    pub unit_price: f64,
}

/// The bill of materials of a design and its totals.
#[derive(Debug, Clone, Serialize)]
pub struct Bill {
    pub switches: Vec<SwitchLine>,
    pub cables: Vec<CableLine>,
    pub switch_cost: f64,
    pub cable_cost: f64,
    pub total: f64,
    pub rack_units: f64,
    pub power_w: f64,
    /// Cables longer than optics reach (counted as optics all the same).
    pub over_reach: usize,
}

impl Bill {
    /// Cables by kind: (DAC, active copper, optics).
    pub fn by_kind(&self) -> BTreeMap<CableKind, usize> {
        let mut m = BTreeMap::new();
        for c in &self.cables {
            *m.entry(c.kind).or_insert(0) += c.count;
        }
        m
    }
    pub fn switch_count(&self) -> usize {
        self.switches.iter().map(|s| s.count).sum()
    }
}

/// Where a node of the fabric stands, m (x along a row, y across rows),
/// and its rack (None: the network rack).
fn positions(topo: &Topology, c: &Candidate, layout: &Layout) -> Vec<(f64, f64, Option<usize>)> {
    let hosts = topo.hosts();
    let per_rack = layout.nodes_per_rack * c.ports_per_node;
    let racks = hosts.len().div_ceil(per_rack.max(1));
    let rows = racks.div_ceil(layout.racks_per_row.max(1));
    let at = |rack: usize| {
        let (row, col) = (rack / layout.racks_per_row, rack % layout.racks_per_row);
        (
            col as f64 * layout.rack_pitch_m,
            row as f64 * layout.row_pitch_m,
        )
    };
    // The network racks: the middle of the room.
    let mid = (
        layout.racks_per_row.min(racks) as f64 / 2.0 * layout.rack_pitch_m,
        (rows.saturating_sub(1)) as f64 / 2.0 * layout.row_pitch_m,
    );
    let mut pos = vec![(mid.0, mid.1, None); topo.nodes.len()];
    for (i, &h) in hosts.iter().enumerate() {
        let rack = i / per_rack.max(1);
        pos[h] = (at(rack).0, at(rack).1, Some(rack));
    }
    if c.structure != Structure::Director {
        for (i, &h) in hosts.iter().enumerate().rev() {
            if let Some(leaf) = topo.leaf_of(h) {
                let rack = i / per_rack.max(1);
                pos[leaf] = (at(rack).0, at(rack).1, Some(rack));
            }
        }
    }
    pos
}

/// A cable's length class and kind.
fn classify(length: f64, g: &Generation) -> (CableKind, f64, bool) {
    let class = LENGTHS_M
        .iter()
        .copied()
        .find(|&l| l >= length - 1e-9)
        .unwrap_or(length.ceil());
    let kind = if class <= g.dac_max_m {
        CableKind::Dac
    } else if class <= g.active_copper_max_m {
        CableKind::ActiveCopper
    } else {
        CableKind::Optics
    };
    (kind, class, class > g.optics_max_m)
}

fn price(kind: CableKind, g: &Generation) -> f64 {
    match kind {
        CableKind::Dac => g.dac_price,
        CableKind::ActiveCopper => g.active_copper_price,
        CableKind::Optics => g.optics_price,
    }
}

/// Whether the cable between switches `a` and `b` is inside a director.
fn internal(topo: &Topology, c: &Candidate, a: usize, b: usize) -> bool {
    let chip = |n: usize| topo.nodes[n].name.starts_with("dir");
    match c.structure {
        Structure::Director => topo.nodes[a].is_switch() && topo.nodes[b].is_switch(),
        Structure::LeafDirector => chip(a) && chip(b),
        _ => false,
    }
}

/// The cables of `topo` by kind and length class.
fn cables(topo: &Topology, c: &Candidate, req: &Requirement) -> (Vec<CableLine>, usize) {
    let g = req
        .generation(&c.generation)
        .expect("a candidate's generation is known");
    let pos = positions(topo, c, &req.layout);
    let mut lines: BTreeMap<(CableKind, u64), usize> = BTreeMap::new();
    let mut over = 0;
    for (a, node) in topo.nodes.iter().enumerate() {
        for r in node.ports.iter().flatten() {
            // Each cable once: from its lower-numbered end.
            if r.node < a || internal(topo, c, a, r.node) {
                continue;
            }
            let (pa, pb) = (pos[a], pos[r.node]);
            let length = if pa.2.is_some() && pa.2 == pb.2 || (pa.2.is_none() && pb.2.is_none()) {
                req.layout.in_rack_m
            } else {
                (pa.0 - pb.0).abs() + (pa.1 - pb.1).abs() + req.layout.slack_m
            };
            let (kind, class, too_long) = classify(length, g);
            over += usize::from(too_long);
            *lines
                .entry((kind, (class * 10.0).round() as u64))
                .or_insert(0) += 1;
        }
    }
    let out = lines
        .into_iter()
        .map(|((kind, dm), count)| CableLine {
            kind,
            length_m: dm as f64 / 10.0,
            count,
            unit_price: price(kind, g),
        })
        .collect();
    (out, over)
}

/// The switches bought: the leaf model's leaves and spines (mid, root),
/// or a director.
fn switches(topo: &Topology, c: &Candidate, req: &Requirement) -> Vec<SwitchLine> {
    let model = |name: &Option<String>| {
        let name = name.as_deref().expect("the structure has this model");
        req.switches
            .iter()
            .find(|s| s.name == name)
            .expect("a candidate's models are known")
    };
    let count = |prefix: &str| {
        topo.switches()
            .iter()
            .filter(|&&s| topo.nodes[s].name.starts_with(prefix))
            .count()
    };
    let line = |m: &crate::catalog::SwitchModel, role: &str, n: usize| SwitchLine {
        model: m.name.clone(),
        role: role.into(),
        count: n,
        unit_price: m.price,
    };
    let mut out = Vec::new();
    if c.structure != Structure::Director {
        let leaf = model(&c.leaf_model);
        out.push(line(leaf, "leaf", count("leaf")));
        for (prefix, role) in [("spine", "spine"), ("mid", "mid"), ("root", "root")] {
            let n = count(prefix);
            if n > 0 {
                out.push(line(leaf, role, n));
            }
        }
    }
    if c.director_model.is_some() {
        out.push(line(model(&c.director_model), "director", 1));
    }
    out
}

/// The bill of materials of candidate `c`, built as `topo`.
pub fn bill(topo: &Topology, c: &Candidate, req: &Requirement) -> Bill {
    let switches = switches(topo, c, req);
    let (cables, over_reach) = cables(topo, c, req);
    let model_of = |name: &str| req.switches.iter().find(|s| s.name == name);
    let (mut ru, mut power) = (0.0, 0.0);
    for s in &switches {
        let m = model_of(&s.model).expect("known model");
        ru += m.rack_units() * s.count as f64;
        power += m.power_w * s.count as f64;
    }
    let switch_cost: f64 = switches.iter().map(|s| s.unit_price * s.count as f64).sum();
    let cable_cost: f64 = cables.iter().map(|c| c.unit_price * c.count as f64).sum();
    let cabled: usize = cables.iter().map(|c| c.count).sum();
    debug_assert!(cabled >= topo.hosts().len(), "every host has a cable");
    Bill {
        switches,
        cables,
        switch_cost,
        cable_cost,
        total: switch_cost + cable_cost,
        rack_units: ru,
        power_w: power,
        over_reach,
    }
}

/// Bisection bandwidth, Gb/s: half the narrowest layer of the folded Clos
/// (host links, leaf up-links, mid up-links) at the port rate; a
/// director's inside is non-blocking.
pub fn bisection_gbps(topo: &Topology, c: &Candidate) -> f64 {
    let hosts = topo.hosts().len();
    let mut narrowest = hosts;
    if c.structure != Structure::Director {
        let up_of = |prefix: &str, above: &dyn Fn(&str) -> bool| -> usize {
            topo.nodes
                .iter()
                .filter(|n| n.is_switch() && n.name.starts_with(prefix))
                .flat_map(|n| n.ports.iter().flatten())
                .filter(|r| above(&topo.nodes[r.node].name))
                .count()
        };
        let leaf_up = up_of("leaf", &|n: &str| {
            !n.starts_with("leaf") && topo_is_switch(topo, n)
        });
        narrowest = narrowest.min(leaf_up);
        if c.structure == Structure::ThreeLevel {
            narrowest = narrowest.min(up_of("mid", &|n: &str| n.starts_with("root")));
        }
    }
    narrowest as f64 / 2.0 * c.port_gbps
}

fn topo_is_switch(topo: &Topology, name: &str) -> bool {
    topo.find(name).is_some_and(|i| topo.nodes[i].is_switch())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::candidates;
    use crate::requirement::{resolve, EmHost, Flags};

    fn build(c: &Candidate) -> Topology {
        evb_fabric::topo::FatTreeSpec::parse(&c.spec)
            .unwrap()
            .build()
            .unwrap()
    }

    /// The published hand count: 512 nodes on 36-port switches, 29
    /// leaves, 18 spines, 512 host cables and 29 x 18 up-links.
    #[test]
    fn hand_count_512_on_36_ports() {
        let req = resolve(
            None,
            &Flags {
                nodes: Some(512),
                gbps: Some(80.0),
                em: Some(EmHost::Node0),
                generations: Some(vec!["EDR".into()]),
                ..Flags::default()
            },
        )
        .unwrap();
        let c = candidates(&req);
        let c = c
            .iter()
            .find(|c| {
                c.structure == Structure::TwoLevel && c.leaf_model.as_deref() == Some("EDR-36")
            })
            .unwrap();
        let topo = build(c);
        let b = bill(&topo, c, &req);
        assert_eq!(b.switch_count(), 29 + 18);
        let cables: usize = b.cables.iter().map(|c| c.count).sum();
        assert_eq!(cables, 512 + 29 * 18);
        // Hosts in or next to their leaf's rack on copper; leaves to the
        // spines in the middle of the room: copper from the racks beside
        // it, optics from the others.
        let k = b.by_kind();
        let (dac, optics) = (k[&CableKind::Dac], k[&CableKind::Optics]);
        assert!(
            dac >= 512 && optics > 300 && dac + optics == 1034,
            "{:?}",
            b.cables
        );
        assert!(b
            .cables
            .iter()
            .all(|l| (l.kind == CableKind::Dac) == (l.length_m <= 3.0)));
        let want = 47.0 * 12_000.0 + dac as f64 * 150.0 + optics as f64 * 500.0;
        assert_eq!(b.total, want);
        assert_eq!(bisection_gbps(&topo, c), 512.0 / 2.0 * 100.0);
    }

    #[test]
    fn director_cables_inside_are_not_bought() {
        let req = resolve(
            None,
            &Flags {
                nodes: Some(540),
                gbps: Some(80.0),
                generations: Some(vec!["EDR".into()]),
                ..Flags::default()
            },
        )
        .unwrap();
        for c in candidates(&req) {
            let topo = build(&c);
            let b = bill(&topo, &c, &req);
            let cables: usize = b.cables.iter().map(|c| c.count).sum();
            let want = match c.structure {
                Structure::Director => 541,
                Structure::LeafDirector => 541 + c.leaves * 18,
                _ => continue,
            };
            assert_eq!(cables, want, "{}", c.name());
            assert_eq!(
                bisection_gbps(&topo, &c),
                541.0 / 2.0 * 100.0,
                "{}",
                c.name()
            );
        }
    }

    #[test]
    fn lengths_round_up_to_what_is_sold() {
        let g = &crate::catalog::default_generations()[0];
        assert_eq!(classify(2.1, g), (CableKind::Dac, 2.5, false));
        assert_eq!(classify(3.2, g), (CableKind::Optics, 4.0, false));
        assert_eq!(classify(120.0, g), (CableKind::Optics, 120.0, true));
    }
}
