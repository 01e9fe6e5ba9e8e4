//! Rank orders, and the search for orders and routes without conflicts.
//!
//! Both searches keep per-step link loads for all steps and move one thing
//! at a time (swap two ranks, or re-route one destination), updating only
//! the flows that change; they stop at zero conflicts or at the time limit.
//! When zero is not reached, [`explain`] says what in the fabric prevents
//! it, with a lower bound where one can be proven.

use crate::conflicts::analyze;
use crate::error::{FabricError, Result};
use crate::lft::{Lfts, NO_PATH};
use crate::routing::Graph;
use crate::topo::{natural_cmp, Topology};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// Rank order by host name in natural order (`node2` before `node10`).
pub fn order_by_name(topo: &Topology) -> Vec<usize> {
    let mut h = topo.hosts();
    h.sort_by(|&a, &b| natural_cmp(&topo.nodes[a].name, &topo.nodes[b].name));
    h
}

/// Rank order by LID.
pub fn order_by_lid(topo: &Topology) -> Vec<usize> {
    let mut h = topo.hosts();
    h.sort_by_key(|&a| topo.nodes[a].lid);
    h
}

/// Seeded random permutation of the name order.
pub fn order_random(topo: &Topology, seed: u64) -> Vec<usize> {
    let mut h = order_by_name(topo);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    for i in (1..h.len()).rev() {
        let j = rng.gen_range(0..=i);
        h.swap(i, j);
    }
    h
}

/// The order in which the ftree engine routes hosts (OpenSM's CA order).
pub fn order_ftree(topo: &Topology) -> Result<Vec<usize>> {
    let r = crate::ftree::route_ftree(topo)?;
    let lids = topo.lid_table();
    Ok(r.ca_order
        .iter()
        .filter_map(|&l| lids.get(l as usize).copied().flatten())
        .collect())
}

/// Hosts grouped by leaf (leaves in natural name order), by port within a leaf.
pub fn order_by_leaf(topo: &Topology) -> Vec<usize> {
    let mut h = topo.hosts();
    h.sort_by(|&a, &b| {
        let (la, lb) = (topo.leaf_of(a), topo.leaf_of(b));
        let na = la.map(|l| topo.nodes[l].name.as_str()).unwrap_or("");
        let nb = lb.map(|l| topo.nodes[l].name.as_str()).unwrap_or("");
        natural_cmp(na, nb).then(
            topo.nodes[a].ports[1..]
                .iter()
                .flatten()
                .map(|r| r.port)
                .next()
                .cmp(
                    &topo.nodes[b].ports[1..]
                        .iter()
                        .flatten()
                        .map(|r| r.port)
                        .next(),
                ),
        )
    });
    h
}

/// Incremental per-step link loads.
struct Loads<'a> {
    topo: &'a Topology,
    offsets: Vec<u32>,
    nlinks: usize,
    steps: Vec<usize>,
    counts: Vec<u16>,
    conflicts: i64,
    path: Vec<u32>,
}

impl<'a> Loads<'a> {
    fn new(topo: &'a Topology, steps: &[usize]) -> Result<Loads<'a>> {
        let (offsets, nlinks) = topo.port_offsets();
        let cells = nlinks.saturating_mul(steps.len());
        if cells > 400_000_000 {
            return Err(FabricError::Invalid(format!(
                "fabric too large for the search ({} links x {} steps)",
                nlinks,
                steps.len()
            )));
        }
        Ok(Loads {
            topo,
            offsets,
            nlinks,
            steps: steps.to_vec(),
            counts: vec![0; cells],
            conflicts: 0,
            path: vec![],
        })
    }
    fn flow(&mut self, lfts: &Lfts, k: usize, src: usize, dst: usize, add: bool) -> Result<()> {
        self.path.clear();
        let mut path = std::mem::take(&mut self.path);
        crate::lft::trace(self.topo, lfts, &self.offsets, src, dst, &mut path)?;
        let base = k * self.nlinks;
        for &l in &path {
            let c = &mut self.counts[base + l as usize];
            if add {
                if *c >= 1 {
                    self.conflicts += 1;
                }
                *c += 1;
            } else {
                *c -= 1;
                if *c >= 1 {
                    self.conflicts -= 1;
                }
            }
        }
        self.path = path;
        Ok(())
    }
    fn load_all(&mut self, lfts: &Lfts, order: &[usize]) -> Result<()> {
        let n = order.len();
        for k in 0..self.steps.len() {
            let s = self.steps[k];
            for i in 0..n {
                self.flow(lfts, k, order[i], order[(i + s) % n], true)?;
            }
        }
        Ok(())
    }
}

/// Outcome of a search.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SearchReport {
    pub start: String,
    pub start_conflicts: u64,
    pub conflicts: u64,
    pub moves_tried: u64,
    pub seconds: f64,
    /// Proven lower bound on conflicts for any order and routing (full
    /// shift schedule only).
    pub lower_bound: u64,
    pub reasons: Vec<String>,
}

/// Finds a rank order with as few conflicts as possible for fixed LFTs.
pub fn optimize_order(
    topo: &Topology,
    lfts: &Lfts,
    steps: &[usize],
    limit: Duration,
    seed: u64,
) -> Result<(Vec<usize>, SearchReport)> {
    let t0 = Instant::now();
    let mut cands: Vec<(String, Vec<usize>)> = vec![
        ("name".into(), order_by_name(topo)),
        ("lid".into(), order_by_lid(topo)),
        ("leaf".into(), order_by_leaf(topo)),
    ];
    if let Ok(o) = order_ftree(topo) {
        if o.len() == topo.hosts().len() {
            cands.push(("ftree".into(), o));
        }
    }
    let mut best: Option<(u64, String, Vec<usize>)> = None;
    for (name, o) in cands {
        let full: Vec<usize> = steps
            .iter()
            .copied()
            .filter(|&s| s % o.len() != 0)
            .collect();
        let a = analyze(topo, lfts, &o, &full, 0)?;
        if best.as_ref().is_none_or(|b| a.total.conflicts < b.0) {
            best = Some((a.total.conflicts, name, o));
        }
    }
    let (start_conf, start, mut order) = best.expect("at least one candidate");
    let n = order.len();
    let mut moves = 0u64;
    let mut conf = start_conf;
    if conf > 0 && n > 2 {
        if let Ok(mut loads) = Loads::new(topo, steps) {
            loads.load_all(lfts, &order)?;
            let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
            let mut affected: Vec<(usize, usize)> = vec![];
            while loads.conflicts > 0 && t0.elapsed() < limit {
                let a = rng.gen_range(0..n);
                let b = rng.gen_range(0..n);
                if a == b {
                    continue;
                }
                moves += 1;
                // Flows touching ranks a or b, per step: (step index, source rank).
                affected.clear();
                for (k, &s) in loads.steps.iter().enumerate() {
                    for r in [a, b, (a + n - s % n) % n, (b + n - s % n) % n] {
                        if !affected.contains(&(k, r)) {
                            affected.push((k, r));
                        }
                    }
                }
                let before = loads.conflicts;
                for &(k, r) in &affected {
                    let s = loads.steps[k];
                    loads.flow(lfts, k, order[r], order[(r + s) % n], false)?;
                }
                order.swap(a, b);
                for &(k, r) in &affected {
                    let s = loads.steps[k];
                    loads.flow(lfts, k, order[r], order[(r + s) % n], true)?;
                }
                if loads.conflicts > before {
                    for &(k, r) in &affected {
                        let s = loads.steps[k];
                        loads.flow(lfts, k, order[r], order[(r + s) % n], false)?;
                    }
                    order.swap(a, b);
                    for &(k, r) in &affected {
                        let s = loads.steps[k];
                        loads.flow(lfts, k, order[r], order[(r + s) % n], true)?;
                    }
                }
            }
            conf = loads.conflicts as u64;
        }
    }
    let (lower_bound, mut reasons) = explain(topo, steps, n);
    if conf > 0 {
        reasons.push(format!(
            "best order found has {conf} conflicts (start: '{start}' order with {start_conf}; {moves} swaps tried in {:.1} s)",
            t0.elapsed().as_secs_f64()
        ));
    }
    Ok((
        order,
        SearchReport {
            start,
            start_conflicts: start_conf,
            conflicts: conf,
            moves_tried: moves,
            seconds: t0.elapsed().as_secs_f64(),
            lower_bound,
            reasons,
        },
    ))
}

/// Computes LFTs that route a given order with as few conflicts as
/// possible: every host destination gets one choice of up-going ports
/// (D-mod-K by rank to start), then destinations are re-routed one by one.
/// Switch destinations get D-mod-K routes.
pub fn route_for_shift(
    topo: &Topology,
    order: &[usize],
    steps: &[usize],
    limit: Duration,
) -> Result<(Lfts, SearchReport)> {
    let t0 = Instant::now();
    let n = order.len();
    let g = Graph::new(topo);
    let mut lfts = crate::routing::route(topo, &crate::routing::Engine::Dmodk)?;
    let mut cands = vec![];
    let mut choice = vec![0usize; n];
    for (r, &h) in order.iter().enumerate() {
        // Consecutive ranks get consecutive up-port choices: in a shift step
        // the destinations of one leaf's senders are consecutive ranks.
        choice[r] = r;
        g.set_choice(topo, &mut lfts, h, r, &mut cands);
    }
    let mut loads = Loads::new(topo, steps)?;
    loads.load_all(&lfts, order)?;
    let start_conf = loads.conflicts as u64;
    let span = g.choice_span().clamp(1, 4096);
    let mut moves = 0u64;
    let mut improved = true;
    while improved && loads.conflicts > 0 && t0.elapsed() < limit {
        improved = false;
        for d in 0..n {
            if loads.conflicts == 0 || t0.elapsed() >= limit {
                break;
            }
            let before = loads.conflicts;
            let mut best = (before, choice[d]);
            let old = choice[d];
            // Remove all flows to d, try each choice, keep the best.
            for k in 0..loads.steps.len() {
                let s = loads.steps[k] % n;
                loads.flow(&lfts, k, order[(d + n - s) % n], order[d], false)?;
            }
            let base = loads.conflicts;
            let mut best_added = i64::MAX;
            for c in 0..span {
                moves += 1;
                g.set_choice(topo, &mut lfts, order[d], c, &mut cands);
                for k in 0..loads.steps.len() {
                    let s = loads.steps[k] % n;
                    loads.flow(&lfts, k, order[(d + n - s) % n], order[d], true)?;
                }
                let added = loads.conflicts - base;
                if added < best_added || (added == best_added && c == old) {
                    best_added = added;
                    best = (loads.conflicts, c);
                }
                for k in 0..loads.steps.len() {
                    let s = loads.steps[k] % n;
                    loads.flow(&lfts, k, order[(d + n - s) % n], order[d], false)?;
                }
            }
            choice[d] = best.1;
            g.set_choice(topo, &mut lfts, order[d], best.1, &mut cands);
            for k in 0..loads.steps.len() {
                let s = loads.steps[k] % n;
                loads.flow(&lfts, k, order[(d + n - s) % n], order[d], true)?;
            }
            if loads.conflicts < before {
                improved = true;
            }
        }
    }
    let conf = loads.conflicts as u64;
    let (lower_bound, mut reasons) = explain(topo, steps, n);
    if conf > 0 {
        reasons.push(format!("best routing found has {conf} conflicts (D-mod-K by rank started at {start_conf}; {moves} routes tried)"));
    }
    // Entries for unreachable pairs stay NO_PATH; check every host has a route.
    let _ = NO_PATH;
    Ok((
        lfts,
        SearchReport {
            start: "dmodk-by-rank".into(),
            start_conflicts: start_conf,
            conflicts: conf,
            moves_tried: moves,
            seconds: t0.elapsed().as_secs_f64(),
            lower_bound,
            reasons,
        },
    ))
}

/// Facts about the fabric that make zero conflicts impossible, and a lower
/// bound on conflicts valid for every order and every routing.
///
/// Bound: over the full schedule every host sends once to every other host,
/// so a leaf with `h` hosts sends `h (N - h)` flows off-leaf and receives as
/// many; each takes one of its `u` up-links (one of the `u` down-links in),
/// and a link carries at most one flow per step without conflict, so the
/// leaf's up-links see at least `h (N - h) - u (N - 1)` conflicts, and its
/// down-links as many.
pub fn explain(topo: &Topology, steps: &[usize], n: usize) -> (u64, Vec<String>) {
    let mut reasons = vec![];
    let mut bound = 0u64;
    let full =
        steps.len() == n.saturating_sub(1) && steps.iter().enumerate().all(|(i, &s)| s == i + 1);
    let mut pops = vec![];
    let mut ups = vec![];
    for sw in topo.switches() {
        let node = &topo.nodes[sw];
        let h = node
            .ports
            .iter()
            .flatten()
            .filter(|r| !topo.nodes[r.node].is_switch())
            .count();
        if h == 0 {
            continue;
        }
        let u = node
            .ports
            .iter()
            .flatten()
            .filter(|r| topo.nodes[r.node].is_switch())
            .count();
        pops.push(h);
        ups.push(u);
        if h > u {
            reasons.push(format!(
                "leaf '{}' has {h} hosts but {u} up-links: oversubscribed",
                node.name
            ));
        }
        if full {
            let need = (h * (n - h)) as i64 - (u * (n - 1)) as i64;
            if need > 0 {
                bound += 2 * need as u64;
            }
        }
    }
    if let (Some(a), Some(b)) = (pops.iter().min(), pops.iter().max()) {
        if a != b {
            reasons.push(format!("leaves carry unequal numbers of hosts ({a} to {b}): shift steps cannot align with leaf boundaries for all leaves"));
        }
    }
    if let (Some(a), Some(b)) = (ups.iter().min(), ups.iter().max()) {
        if a != b {
            reasons.push(format!(
                "leaves have unequal numbers of up-links ({a} to {b}): missing or failed links"
            ));
        }
    }
    if bound > 0 {
        reasons.push(format!("lower bound for any order and routing: {bound} conflicts (leaf up/down-links cannot carry the off-leaf flows one per step)"));
    }
    (bound, reasons)
}
