//! Rank orders, and the search for orders and routes without conflicts.
//!
//! Both searches keep per-step link loads for all steps and move one thing
//! at a time (swap two ranks, or re-route one destination), updating only
//! the flows that change; they stop at zero conflicts or at the time limit.
//! When zero is not reached, [`explain`] says what in the fabric prevents
//! it, with a lower bound where one can be proven.

use crate::conflicts::analyze;
use crate::error::{FabricError, Result};
use crate::lft::Lfts;
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

/// The rank order every command takes when none is given (`--order`,
/// `--fabric-order`): the ftree engine's CA order, the order OpenSM's
/// ftree routing balances its routes for, in which a shift over a tree of
/// full leaves has no conflict; on a fabric that engine cannot route (it
/// falls back to minhop, and OpenSM writes no CA order), the order by name.
pub const DEFAULT_ORDER: &str = "ftree";

/// The routing engine every command takes when neither tables nor an
/// engine are given (`--routing`, `--fabric-routing`).
pub const DEFAULT_ROUTING: &str = "ftree";

/// A rank order as the command line gives it, or the default.
#[derive(Debug, Clone)]
pub struct ResolvedOrder {
    /// Topology node of each rank.
    pub order: Vec<usize>,
    /// The order's name as given, or the default's (`ftree`, or `name`
    /// where the ftree engine cannot route the fabric).
    pub spec: String,
    /// Why the default is not `ftree` on this fabric, for the user.
    pub note: Option<String>,
}

/// The rank order `given` names ([`order_from_spec`]), or without one the
/// default ([`DEFAULT_ORDER`]): the ftree CA order, or the order by name
/// (with a note saying why) where the ftree engine cannot route the fabric.
/// An order given by name is never replaced: `--order ftree` on such a
/// fabric is an error that says so.
pub fn order_or_default(given: Option<&str>, topo: &Topology) -> Result<ResolvedOrder> {
    if let Some(spec) = given {
        return Ok(ResolvedOrder {
            order: order_from_spec(spec, topo)?,
            spec: spec.to_string(),
            note: None,
        });
    }
    match order_ftree(topo) {
        Ok(order) => Ok(ResolvedOrder {
            order,
            spec: DEFAULT_ORDER.into(),
            note: None,
        }),
        Err(_) => Ok(ResolvedOrder {
            order: order_by_name(topo),
            spec: "name".into(),
            note: Some(
                "rank order: name (the default, ftree, is the ftree engine's CA order, and that engine cannot route this fabric; --order ftree says why)"
                    .into(),
            ),
        }),
    }
}

/// A rank order from its name: `name`, `lid`, `leaf`, `ftree`, `random` or
/// `random:SEED`, or a file (hostfile or `opensm-ftree-ca-order.dump`).
/// (`optimized` needs routing tables: see [`optimize_order`].)
pub fn order_from_spec(spec: &str, topo: &Topology) -> Result<Vec<usize>> {
    Ok(match spec {
        "name" => order_by_name(topo),
        "lid" => order_by_lid(topo),
        "leaf" => order_by_leaf(topo),
        // The CA order exists only where the ftree engine routes (OpenSM
        // writes no CA order after falling back to minhop either).
        "ftree" => order_ftree(topo).map_err(|e| {
            FabricError::Invalid(format!(
                "order 'ftree': the ftree engine cannot route this fabric, so it has no CA order ({e}); use name, lid, leaf, random:SEED or a file"
            ))
        })?,
        s if s == "random" || s.starts_with("random:") => {
            let seed = match s.strip_prefix("random:") {
                Some(x) => x
                    .parse()
                    .map_err(|_| FabricError::Invalid(format!("order '{s}': bad random seed")))?,
                None => 1,
            };
            order_random(topo, seed)
        }
        f => {
            if !std::path::Path::new(f).exists() {
                return Err(FabricError::Invalid(format!(
                    "order '{f}': not name, lid, leaf, random:SEED, ftree, optimized, nor an existing file"
                )));
            }
            crate::io::parse_order(std::path::Path::new(f), topo)?
        }
    })
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

/// The destination positions an order spec gives: the ftree engine's
/// (`ftree`), or an order file's (an OpenSM CA order dump's `0xFFFF DUMMY`
/// lines are `None`). `None` for the other specs, whose positions are the
/// ranks.
pub fn positions_from_spec(spec: &str, topo: &Topology) -> Result<Option<Vec<Option<usize>>>> {
    let positions = if spec == "ftree" {
        ftree_positions(topo)?
    } else if std::path::Path::new(spec).is_file() {
        crate::io::parse_order_positions(std::path::Path::new(spec), topo)?
    } else {
        return Ok(None);
    };
    Ok(Some(positions))
}

/// The ftree engine's destination positions as hosts: its CA order with
/// `None` for each dummy a leaf with fewer hosts than the fullest routes.
pub fn ftree_positions(topo: &Topology) -> Result<Vec<Option<usize>>> {
    let r = crate::ftree::route_ftree(topo)?;
    let lids = topo.lid_table();
    Ok(r.positions
        .iter()
        .map(|p| p.and_then(|l| lids.get(l as usize).copied().flatten()))
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
    /// Adds (or removes) the flows `ranks` gives as (step index, source
    /// rank) under `order`.
    fn load_ranks(
        &mut self,
        lfts: &Lfts,
        order: &[usize],
        ranks: &[(usize, usize)],
        add: bool,
    ) -> Result<()> {
        let n = order.len();
        for &(k, r) in ranks {
            let s = self.steps[k];
            self.flow(lfts, k, order[r], order[(r + s) % n], add)?;
        }
        Ok(())
    }
    /// Swaps ranks `a` and `b` of `order`, and swaps them back if that
    /// adds conflicts. Only the flows from or to either rank are moved
    /// (`affected` is scratch space for them).
    fn try_swap(
        &mut self,
        lfts: &Lfts,
        order: &mut [usize],
        a: usize,
        b: usize,
        affected: &mut Vec<(usize, usize)>,
    ) -> Result<()> {
        let n = order.len();
        // Flows touching ranks a or b, per step: (step index, source rank).
        affected.clear();
        for (k, &s) in self.steps.iter().enumerate() {
            for r in [a, b, (a + n - s % n) % n, (b + n - s % n) % n] {
                if !affected.contains(&(k, r)) {
                    affected.push((k, r));
                }
            }
        }
        let before = self.conflicts;
        self.load_ranks(lfts, order, affected, false)?;
        order.swap(a, b);
        self.load_ranks(lfts, order, affected, true)?;
        if self.conflicts > before {
            self.load_ranks(lfts, order, affected, false)?;
            order.swap(a, b);
            self.load_ranks(lfts, order, affected, true)?;
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
    optimize_order_from(topo, lfts, steps, cands, limit, seed)
}

/// Like [`optimize_order`], starting from the best of the given orders.
pub fn optimize_order_from(
    topo: &Topology,
    lfts: &Lfts,
    steps: &[usize],
    cands: Vec<(String, Vec<usize>)>,
    limit: Duration,
    seed: u64,
) -> Result<(Vec<usize>, SearchReport)> {
    let t0 = Instant::now();
    let (start_conf, start, mut order) = best_start(topo, lfts, steps, cands)?;
    let n = order.len();
    let mut moves = 0u64;
    let mut conf = start_conf;
    if conf > 0 && n > 2 {
        if let Ok(mut loads) = Loads::new(topo, steps) {
            loads.load_all(lfts, &order)?;
            let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
            let mut affected: Vec<(usize, usize)> = vec![];
            let mut path = vec![];
            while loads.conflicts > 0 && t0.elapsed() < limit {
                // Prefer moving a rank whose flow shares a link.
                let k = rng.gen_range(0..loads.steps.len());
                let i = rng.gen_range(0..n);
                let st = loads.steps[k];
                path.clear();
                crate::lft::trace(
                    topo,
                    lfts,
                    &loads.offsets,
                    order[i],
                    order[(i + st) % n],
                    &mut path,
                )?;
                let base = k * loads.nlinks;
                if !path.iter().any(|&l| loads.counts[base + l as usize] > 1) {
                    continue;
                }
                let a = if rng.gen_bool(0.5) { i } else { (i + st) % n };
                let b = rng.gen_range(0..n);
                if a == b {
                    continue;
                }
                moves += 1;
                loads.try_swap(lfts, &mut order, a, b, &mut affected)?;
            }
            conf = loads.conflicts as u64;
        }
    }
    let (lower_bound, mut reasons) = explain(topo, steps, n);
    if conf > 0 {
        if lower_bound >= conf {
            reasons.push("the order found reaches the proven lower bound".into());
        }
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

/// The candidate order with the fewest conflicts (the first of equals),
/// where the search starts: (its conflicts, its name, the order).
fn best_start(
    topo: &Topology,
    lfts: &Lfts,
    steps: &[usize],
    cands: Vec<(String, Vec<usize>)>,
) -> Result<(u64, String, Vec<usize>)> {
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
    Ok(best.expect("at least one candidate"))
}

/// Computes LFTs that route a given order with as few conflicts as
/// possible. Start: every host destination routed D-mod-K by its rank
/// (consecutive ranks, the destinations of one leaf's senders in a shift
/// step, get different up-ports). Then a min-conflicts search: take a flow
/// that shares a link, pick a switch on its path where it could go up
/// another way, and set that switch's entry for the destination to the port
/// giving the fewest conflicts over all steps (ties broken at random).
/// Entries stay on shortest paths, so the tables remain loop-free.
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
    for (r, &h) in order.iter().enumerate() {
        g.set_choice(topo, &mut lfts, h, r, &mut cands);
    }
    let mut loads = Loads::new(topo, steps)?;
    loads.load_all(&lfts, order)?;
    let start_conf = loads.conflicts as u64;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(0x5eed);
    let mut moves = 0u64;
    let nsteps = loads.steps.len();
    let mut path = vec![];
    let mut tries = vec![];
    while loads.conflicts > 0 && t0.elapsed() < limit {
        // A random flow; keep it only if it shares a link.
        let k = rng.gen_range(0..nsteps);
        let i = rng.gen_range(0..n);
        let s = loads.steps[k];
        let (src, dst) = (order[i], order[(i + s) % n]);
        path.clear();
        crate::lft::trace(topo, &lfts, &loads.offsets, src, dst, &mut path)?;
        let base = k * loads.nlinks;
        if !path.iter().any(|&l| loads.counts[base + l as usize] > 1) {
            continue;
        }
        // Switches on the path with a choice of shortest-path ports.
        let lid = topo.nodes[dst].lid;
        let dleaf = topo.leaf_of(dst).expect("traced host is cabled");
        let mut choice_points = vec![];
        for &l in &path[1..] {
            let (sw, _) = crate::lft::link_of(&loads.offsets, l);
            g.candidates(topo, sw, dleaf, &mut cands);
            if cands.len() > 1 {
                choice_points.push((sw, cands.clone()));
            }
        }
        if choice_points.is_empty() {
            continue;
        }
        let (sw, ports) = choice_points.swap_remove(rng.gen_range(0..choice_points.len()));
        let d = order.iter().position(|&h| h == dst).expect("dst in order");
        // Remove every flow to dst, try each port, keep the best.
        for kk in 0..nsteps {
            let ss = loads.steps[kk] % n;
            loads.flow(&lfts, kk, order[(d + n - ss) % n], dst, false)?;
        }
        let base_conf = loads.conflicts;
        tries.clear();
        for &p in &ports {
            moves += 1;
            lfts.set(sw, lid, p);
            for kk in 0..nsteps {
                let ss = loads.steps[kk] % n;
                loads.flow(&lfts, kk, order[(d + n - ss) % n], dst, true)?;
            }
            tries.push((loads.conflicts - base_conf, p));
            for kk in 0..nsteps {
                let ss = loads.steps[kk] % n;
                loads.flow(&lfts, kk, order[(d + n - ss) % n], dst, false)?;
            }
        }
        let best = tries.iter().map(|t| t.0).min().expect("ports");
        let ties: Vec<u8> = tries.iter().filter(|t| t.0 == best).map(|t| t.1).collect();
        let p = ties[rng.gen_range(0..ties.len())];
        lfts.set(sw, lid, p);
        for kk in 0..nsteps {
            let ss = loads.steps[kk] % n;
            loads.flow(&lfts, kk, order[(d + n - ss) % n], dst, true)?;
        }
    }
    let conf = loads.conflicts as u64;
    let (lower_bound, mut reasons) = explain(topo, steps, n);
    if conf > 0 {
        reasons.push(format!(
            "best routing found has {conf} conflicts (D-mod-K by rank: {start_conf}; {moves} entries tried in {:.1} s){}",
            t0.elapsed().as_secs_f64(),
            if lower_bound >= conf { "; this equals the proven lower bound" } else { "; not proven optimal" }
        ));
    }
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
            reasons.push(format!("leaves carry unequal numbers of hosts ({a} to {b}): blocks of consecutive ranks cannot match every leaf, so some shift steps send more flows off a leaf than the routing spreads evenly (not a proof that zero is impossible)"));
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

#[cfg(test)]
mod default_order_tests {
    use super::*;

    /// The default order is the ftree CA order where the ftree engine
    /// routes the fabric, else the order by name with a note; an order
    /// given by name is never replaced.
    #[test]
    fn the_default_order_is_ftree_or_by_name_where_ftree_cannot_route() {
        let full = crate::io::load_topology("fat-tree:radix=4,hosts=8").unwrap();
        let d = order_or_default(None, &full).unwrap();
        assert_eq!((d.spec.as_str(), d.note), ("ftree", None));
        assert_eq!(d.order, order_ftree(&full).unwrap());
        let mut cut = full.clone();
        cut.apply_edits(&[], &["leaf001:3".into()], &[]).unwrap();
        let d = order_or_default(None, &cut).unwrap();
        assert_eq!(d.spec, "name");
        assert!(d.note.unwrap().contains("cannot route"));
        assert_eq!(d.order, order_by_name(&cut));
        assert!(order_or_default(Some("ftree"), &cut).is_err());
        let given = order_or_default(Some("lid"), &cut).unwrap();
        assert_eq!((given.spec.as_str(), given.note), ("lid", None));
    }
}
