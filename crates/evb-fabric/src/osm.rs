//! The routing engines OpenSM falls back on or offers besides ftree:
//! `minhop` (its default), `updn` and `dfsssp`, computing the same
//! forwarding tables as OpenSM 3.3 with its default options (LMC 0, no
//! GUID or weight files, `port_shifting` and `scatter_ports` off).
//!
//! Written from a study of how OpenSM behaves, not from its code. What has
//! to match, and why:
//! - OpenSM keeps switches and ports in maps keyed by GUIDs in network byte
//!   order on a little-endian host: "switch order" is the order of the
//!   byte-swapped node GUIDs.
//! - **minhop**: hop counts between switches are shortest paths. Each
//!   switch picks, for every destination in a fixed order, the port with the
//!   fewest routes so far among its shortest-path ports (the lowest port on
//!   a tie). Routes to hosts count; routes to switches do not. The order:
//!   switches by number of cabled hosts (most first; equal ones in switch
//!   order, the sort being stable), each switch's hosts by port; switch
//!   LIDs after them.
//! - **updn**: roots are the switches whose hop histogram to the hosts has
//!   exactly one bar above 90 % of the hosts and none other above 5 %;
//!   ranks are distances from the roots; a breadth-first walk from each
//!   switch sets hop counts only along up*-down* paths (a link goes up
//!   toward a smaller rank, or at equal rank toward the larger GUID), with
//!   OpenSM's queue discipline (a switch is queued again when a new port of
//!   it improves and it is not queued, keeping the direction of that
//!   visit). The tables are then chosen as minhop chooses. No roots: the
//!   engine fails (OpenSM then falls back to minhop).
//! - **dfsssp**: a Dijkstra from every destination (hosts first, switches
//!   by host count as minhop orders them, then switch LIDs) over directed
//!   switch links weighted P^2 (P = host ports + switches), each route
//!   adding a switch's host count to every link on its path. Ties fall as
//!   OpenSM's 4-ary heap lets them fall, so the heap's moves are kept.
//!   The virtual-lane assignment that makes dfsssp deadlock-free does not
//!   change the tables and is not modelled: where OpenSM finds too few VLs
//!   it gives up and falls back to minhop, evb does not notice.

use crate::error::{FabricError, Result};
use crate::lft::{Lfts, NO_PATH};
use crate::topo::Topology;
use std::collections::VecDeque;

/// Switches in OpenSM's table order (byte-swapped node GUID).
fn switch_order(topo: &Topology) -> Vec<usize> {
    let mut s = topo.switches();
    s.sort_by_key(|&i| topo.nodes[i].guid.swap_bytes());
    s
}

/// Switches with index tables.
struct Sw {
    /// Node ids in switch order.
    nodes: Vec<usize>,
    /// Node id -> index in `nodes`.
    index: Vec<usize>,
}

impl Sw {
    fn new(topo: &Topology) -> Sw {
        let nodes = switch_order(topo);
        let mut index = vec![usize::MAX; topo.nodes.len()];
        for (i, &n) in nodes.iter().enumerate() {
            index[n] = i;
        }
        Sw { nodes, index }
    }
    /// Index of the switch at the far end of `node` port `p`, with the far port.
    fn remote(&self, topo: &Topology, node: usize, p: usize) -> Option<(usize, u8)> {
        let r = topo.nodes[node].ports[p]?;
        let i = self.index[r.node];
        (i != usize::MAX).then_some((i, r.port))
    }
}

/// A routing destination: a host's LID at its switch and port, or a
/// switch's own LID.
#[derive(Clone, Copy)]
struct Dest {
    lid: u16,
    /// Switch index the destination hangs off (or is).
    target: usize,
    /// Port of `target` toward the host; 0 for a switch.
    port: u8,
    host: bool,
}

/// Hosts by switch (most cabled hosts first, stable in switch order), each
/// switch's hosts by port; then every switch's own LID in switch order.
fn minhop_order(topo: &Topology, sw: &Sw) -> Vec<Dest> {
    let hosts_on = |s: usize| {
        let n = &topo.nodes[sw.nodes[s]];
        (1..n.ports.len())
            .filter(|&p| n.ports[p].is_some_and(|r| !topo.nodes[r.node].is_switch()))
            .count()
    };
    let mut by_load: Vec<usize> = (0..sw.nodes.len()).collect();
    // Stable, as glibc's merge-sort qsort is.
    by_load.sort_by_key(|&s| std::cmp::Reverse(hosts_on(s)));
    let mut out = vec![];
    let mut seen = vec![false; topo.nodes.len()];
    for s in by_load {
        let n = &topo.nodes[sw.nodes[s]];
        for p in 1..n.ports.len() {
            if let Some(d) = host_dest(topo, s, sw.nodes[s], p, &mut seen) {
                out.push(d);
            }
        }
    }
    for (s, &node) in sw.nodes.iter().enumerate() {
        let lid = topo.nodes[node].lid;
        if lid != 0 {
            out.push(Dest {
                lid,
                target: s,
                port: 0,
                host: false,
            });
        }
    }
    out
}

/// The host at `sw_node` port `p` as a destination, once per host, through
/// the port evb routes it by (its first cabled port).
fn host_dest(
    topo: &Topology,
    s: usize,
    sw_node: usize,
    p: usize,
    seen: &mut [bool],
) -> Option<Dest> {
    let r = topo.nodes[sw_node].ports[p]?;
    let h = &topo.nodes[r.node];
    if h.is_switch() || seen[r.node] || h.lid == 0 || h.first_port() != Some(r.port) {
        return None;
    }
    seen[r.node] = true;
    Some(Dest {
        lid: h.lid,
        target: s,
        port: p as u8,
        host: true,
    })
}

/// Per-target hop counts of every switch port: `hops[s * stride + p]`, and
/// each switch's least count.
struct HopTable {
    stride: usize,
    hops: Vec<u8>,
    least: Vec<u8>,
}

impl HopTable {
    fn new(nsw: usize, stride: usize) -> HopTable {
        HopTable {
            stride,
            hops: vec![NO_PATH; nsw * stride],
            least: vec![NO_PATH; nsw],
        }
    }
    fn get(&self, s: usize, p: usize) -> u8 {
        self.hops[s * self.stride + p]
    }
    fn set(&mut self, s: usize, p: usize, h: u8) {
        self.hops[s * self.stride + p] = h;
        if self.least[s] > h {
            self.least[s] = h;
        }
    }
}

fn max_ports(topo: &Topology) -> usize {
    topo.nodes.iter().map(|n| n.ports.len()).max().unwrap_or(1)
}

/// Hop distances between switches (breadth-first), `dist[t][s]`.
fn switch_distances(topo: &Topology, sw: &Sw) -> Vec<Vec<u8>> {
    let n = sw.nodes.len();
    let mut dist = vec![vec![NO_PATH; n]; n];
    for t in 0..n {
        let row = &mut dist[t];
        row[t] = 0;
        let mut q = VecDeque::from([t]);
        while let Some(s) = q.pop_front() {
            let node = sw.nodes[s];
            for p in 1..topo.nodes[node].ports.len() {
                if let Some((r, _)) = sw.remote(topo, node, p) {
                    if row[r] == NO_PATH && row[s] < NO_PATH - 1 {
                        row[r] = row[s] + 1;
                        q.push_back(r);
                    }
                }
            }
        }
    }
    dist
}

/// Minhop's hop table toward switch `t`: a port's count is one more than
/// its neighbour's distance to `t`.
fn minhop_table(topo: &Topology, sw: &Sw, dist_t: &[u8], t: usize, stride: usize) -> HopTable {
    let mut h = HopTable::new(sw.nodes.len(), stride);
    h.set(t, 0, 0);
    for (s, &node) in sw.nodes.iter().enumerate() {
        for p in 1..topo.nodes[node].ports.len() {
            if let Some((r, _)) = sw.remote(topo, node, p) {
                if r != s && dist_t[r] != NO_PATH {
                    h.set(s, p, dist_t[r] + 1);
                }
            }
        }
    }
    h
}

/// Fills the tables the way OpenSM's minhop does, from hop tables per
/// target switch: destinations in `order`, each switch's least-loaded
/// least-hop port, lowest port on a tie; only host routes count.
fn build_lfts(
    topo: &Topology,
    sw: &Sw,
    order: &[Dest],
    mut table_for: impl FnMut(usize) -> HopTable,
) -> Lfts {
    let mut lfts = Lfts::empty(topo);
    let stride = max_ports(topo);
    let mut counts = vec![0u32; sw.nodes.len() * stride];
    let mut cached: Option<(usize, HopTable)> = None;
    for d in order {
        if cached.as_ref().is_none_or(|c| c.0 != d.target) {
            cached = Some((d.target, table_for(d.target)));
        }
        let table = &cached.as_ref().expect("just set").1;
        for (s, &node) in sw.nodes.iter().enumerate() {
            let port = if s == d.target {
                d.port
            } else {
                let least = table.least[s];
                if least == NO_PATH {
                    continue;
                }
                let n = &topo.nodes[node];
                let mut best = NO_PATH;
                let mut best_count = u32::MAX;
                for p in 1..n.ports.len() {
                    if n.ports[p].is_none() || table.get(s, p) != least {
                        continue;
                    }
                    let c = counts[s * stride + p];
                    if c < best_count {
                        best = p as u8;
                        best_count = c;
                    }
                }
                best
            };
            if port == NO_PATH {
                continue;
            }
            lfts.set(node, d.lid, port);
            if d.host && port != 0 {
                counts[s * stride + port as usize] += 1;
            }
        }
    }
    lfts
}

/// OpenSM's `minhop` tables.
pub fn route_minhop(topo: &Topology) -> Lfts {
    let sw = Sw::new(topo);
    let dist = switch_distances(topo, &sw);
    let stride = max_ports(topo);
    let order = minhop_order(topo, &sw);
    build_lfts(topo, &sw, &order, |t| {
        minhop_table(topo, &sw, &dist[t], t, stride)
    })
}

/// OpenSM's `updn` tables, or why OpenSM's updn would give up.
pub fn route_updn(topo: &Topology) -> Result<Lfts> {
    let sw = Sw::new(topo);
    let n = sw.nodes.len();
    if n == 0 {
        return Err(FabricError::Invalid("updn: not a switched fabric".into()));
    }
    let dist = switch_distances(topo, &sw);
    // Roots by hop histogram: host ports per switch, and how far they are.
    let mut cas = vec![0usize; n];
    for h in topo.hosts() {
        for r in topo.nodes[h].ports.iter().flatten() {
            let i = sw.index[r.node];
            if i != usize::MAX {
                cas[i] += 1;
            }
        }
    }
    let total: usize = cas.iter().sum();
    let (thd1, thd2) = (total as f64 * 0.9, total as f64 * 0.05);
    let mut rank = vec![u32::MAX; n];
    for s in 0..n {
        let mut hist = [0usize; 64];
        for t in 0..n {
            let d = dist[t][s];
            if cas[t] > 0 && (d as usize) < hist.len() {
                hist[d as usize] += cas[t];
            }
        }
        let over1 = hist.iter().filter(|&&c| c as f64 > thd1).count();
        let over2 = hist.iter().filter(|&&c| c as f64 > thd2).count();
        if over1 == 1 && over2 == 1 {
            rank[s] = 0;
        }
    }
    if !rank.contains(&0) {
        return Err(FabricError::Invalid(
            "updn: no root switches found (no switch sees more than 90 % of the hosts at one \
             distance and no other distance above 5 %); OpenSM's updn gives up here"
                .into(),
        ));
    }
    // Ranks: distance from the nearest root.
    let mut q: VecDeque<usize> = (0..n).filter(|&s| rank[s] == 0).collect();
    while let Some(u) = q.pop_front() {
        let node = sw.nodes[u];
        for p in 1..topo.nodes[node].ports.len() {
            if let Some((r, _)) = sw.remote(topo, node, p) {
                if rank[r] > rank[u] + 1 {
                    rank[r] = rank[u] + 1;
                    q.push_back(r);
                }
            }
        }
    }
    let id: Vec<u64> = sw.nodes.iter().map(|&s| topo.nodes[s].guid).collect();
    // Going from `a` to `b` is up: toward a smaller rank, at equal rank
    // toward the smaller GUID (from the larger), between roots always.
    let up = |a: usize, b: usize| -> bool {
        if rank[a] == 0 && rank[b] == 0 {
            return true;
        }
        match rank[a].cmp(&rank[b]) {
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => id[a] > id[b],
        }
    };
    let stride = max_ports(topo);
    let order = minhop_order(topo, &sw);
    Ok(build_lfts(topo, &sw, &order, |t| {
        let mut h = HopTable::new(n, stride);
        h.set(t, 0, 0);
        let mut going_up = vec![true; n];
        let mut queued = vec![false; n];
        let mut q = VecDeque::from([t]);
        while let Some(u) = q.pop_front() {
            queued[u] = false;
            let node = sw.nodes[u];
            for p in 1..topo.nodes[node].ports.len() {
                let Some((r, rp)) = sw.remote(topo, node, p) else {
                    continue;
                };
                let next_up = up(u, r);
                // The only illegal turn: down, then up.
                if !going_up[u] && next_up {
                    continue;
                }
                let cur = h.least[u] as u16;
                if cur + 1 < h.get(r, rp as usize) as u16 {
                    h.set(r, rp as usize, (cur + 1) as u8);
                    if !queued[r] {
                        going_up[r] = next_up;
                        queued[r] = true;
                        q.push_back(r);
                    }
                }
            }
        }
        h
    }))
}

/// A 4-ary min-heap that moves elements exactly as OpenSM's `cl_heap` does
/// (ties fall where its sift-up and sift-down leave them).
struct Heap {
    /// (key, vertex)
    a: Vec<(u64, usize)>,
    /// vertex -> position
    pos: Vec<usize>,
}

const D: usize = 4;

impl Heap {
    fn new(vertices: usize) -> Heap {
        Heap {
            a: Vec::with_capacity(vertices),
            pos: vec![usize::MAX; vertices],
        }
    }
    fn put(&mut self, i: usize, e: (u64, usize)) {
        self.a[i] = e;
        self.pos[e.1] = i;
    }
    fn up(&mut self, index: usize) {
        if index == 0 {
            return;
        }
        let tmp = self.a[index];
        let mut parent = index;
        let mut hole = None;
        loop {
            let child = parent;
            parent = (child - 1) / D;
            if tmp.0 < self.a[parent].0 {
                let e = self.a[parent];
                self.put(child, e);
                hole = Some(parent);
            } else {
                break;
            }
            if parent == 0 {
                break;
            }
        }
        if let Some(h) = hole {
            self.put(h, tmp);
        }
    }
    fn down(&mut self, index: usize) {
        let size = self.a.len();
        let tmp = self.a[index];
        let mut parent = index;
        let mut moved = false;
        while parent * D + 1 < size {
            let first = parent * D + 1;
            let mut swap = first;
            // `<=`: on equal keys the later child is taken.
            for child in first + 1..(first + D).min(size) {
                if self.a[child].0 <= self.a[swap].0 {
                    swap = child;
                }
            }
            if tmp.0 > self.a[swap].0 {
                let e = self.a[swap];
                self.put(parent, e);
                parent = swap;
                moved = true;
            } else {
                break;
            }
        }
        if moved {
            self.put(parent, tmp);
        }
    }
    fn insert(&mut self, key: u64, v: usize) {
        self.a.push((key, v));
        self.pos[v] = self.a.len() - 1;
        self.up(self.a.len() - 1);
    }
    fn decrease(&mut self, v: usize, key: u64) {
        let i = self.pos[v];
        let old = self.a[i].0;
        self.a[i].0 = key;
        if key < old {
            self.up(i);
        } else if key > old {
            self.down(i);
        }
    }
    fn pop(&mut self) -> Option<usize> {
        match self.a.len() {
            0 => None,
            1 => self.a.pop().map(|e| e.1),
            n => {
                // The last element moves to the root and sinks.
                let root = self.a[0];
                let last = self.a[n - 1];
                self.a.truncate(n - 1);
                self.put(0, last);
                self.down(0);
                Some(root.1)
            }
        }
    }
}

/// A directed switch link of the dfsssp graph.
struct Link {
    from: usize,
    to: usize,
    /// Port at `to` toward `from`: the route out of `to`.
    to_port: u8,
    weight: u64,
}

const INF: u64 = 0x7FFF_FFFF;

/// OpenSM's dry run: every switch must be reachable from the first one
/// over switch links, or dfsssp gives up.
fn check_all_switches_reachable(
    topo: &Topology,
    sw: &Sw,
    links: &[Link],
    out_links: &[Vec<usize>],
) -> Result<()> {
    let n = sw.nodes.len();
    let mut seen = vec![false; n];
    let mut q = VecDeque::from([0usize]);
    seen[0] = true;
    while let Some(s) = q.pop_front() {
        for &l in &out_links[s + 1] {
            let t = links[l].to - 1;
            if !seen[t] {
                seen[t] = true;
                q.push_back(t);
            }
        }
    }
    if let Some(s) = seen.iter().position(|&x| !x) {
        return Err(FabricError::Invalid(format!(
            "dfsssp: switch '{}' cannot be reached from switch '{}' (detached switches); \
             OpenSM's dfsssp gives up here",
            topo.nodes[sw.nodes[s]].name, topo.nodes[sw.nodes[0]].name
        )));
    }
    Ok(())
}

/// The dfsssp graph: vertex 0 is the host a round starts from; switches
/// are 1..=n.
struct SwitchGraph {
    /// Per vertex: 1 plus the hosts cabled to the switch (what its routes
    /// add to the weight of the links they use).
    num_hca: Vec<u64>,
    links: Vec<Link>,
    /// Per vertex: its links (indices into `links`) leaving it.
    out_links: Vec<Vec<usize>>,
}

/// The switch-to-switch links with their starting weight (host ports plus
/// switches, squared) and each switch's host count.
fn switch_graph(topo: &Topology, sw: &Sw) -> SwitchGraph {
    let n = sw.nodes.len();
    let mut num_hca = vec![0u64; n + 1];
    let mut links: Vec<Link> = vec![];
    let mut out_links: Vec<Vec<usize>> = vec![vec![]; n + 1];
    let host_ports: u64 = topo
        .hosts()
        .iter()
        .map(|&h| topo.nodes[h].ports.iter().flatten().count() as u64)
        .sum();
    let p_total = host_ports + n as u64;
    for (s, &node) in sw.nodes.iter().enumerate() {
        let v = s + 1;
        num_hca[v] = 1;
        let nd = &topo.nodes[node];
        for p in 1..nd.ports.len() {
            let Some(r) = nd.ports[p] else { continue };
            if r.node == node {
                continue;
            }
            if !topo.nodes[r.node].is_switch() {
                num_hca[v] += 1;
                continue;
            }
            out_links[v].push(links.len());
            links.push(Link {
                from: v,
                to: sw.index[r.node] + 1,
                to_port: r.port,
                weight: p_total * p_total,
            });
        }
    }
    SwitchGraph {
        num_hca,
        links,
        out_links,
    }
}

/// The destinations dfsssp routes, in its order: hosts by switch (most
/// hosts first), then switch LIDs in the same switch order.
fn dfsssp_sources(topo: &Topology, sw: &Sw, num_hca: &[u64]) -> Vec<Dest> {
    let n = sw.nodes.len();
    let mut by_hca: Vec<usize> = (1..=n).collect();
    by_hca.sort_by_key(|&v| std::cmp::Reverse(num_hca[v]));
    let mut sources: Vec<Dest> = vec![];
    let mut seen = vec![false; topo.nodes.len()];
    for &v in &by_hca {
        let node = sw.nodes[v - 1];
        for p in 1..topo.nodes[node].ports.len() {
            if let Some(d) = host_dest(topo, v - 1, node, p, &mut seen) {
                sources.push(d);
            }
        }
    }
    for &v in &by_hca {
        let lid = topo.nodes[sw.nodes[v - 1]].lid;
        if lid != 0 {
            sources.push(Dest {
                lid,
                target: v - 1,
                port: 0,
                host: false,
            });
        }
    }
    sources
}

/// OpenSM's `dfsssp` (and `sssp`) tables, or why OpenSM would give up.
pub fn route_dfsssp(topo: &Topology) -> Result<Lfts> {
    let sw = Sw::new(topo);
    let n = sw.nodes.len();
    if n == 0 {
        return Err(FabricError::Invalid("dfsssp: not a switched fabric".into()));
    }
    let SwitchGraph {
        num_hca,
        mut links,
        mut out_links,
    } = switch_graph(topo, &sw);
    check_all_switches_reachable(topo, &sw, &links, &out_links)?;
    let sources = dfsssp_sources(topo, &sw, &num_hca);
    let mut lfts = Lfts::empty(topo);
    for &node in &sw.nodes {
        let lid = topo.nodes[node].lid;
        if lid != 0 {
            lfts.set(node, lid, 0);
        }
    }
    let mut dist = vec![INF; n + 1];
    let mut done = vec![false; n + 1];
    let mut used: Vec<Option<usize>> = vec![None; n + 1];
    for d in sources {
        // The host's own link, rebuilt each round (weight 1).
        let host_link = links.len();
        if d.host {
            links.push(Link {
                from: 0,
                to: d.target + 1,
                to_port: d.port,
                weight: 1,
            });
            out_links[0] = vec![host_link];
        }
        let mut heap = Heap::new(n + 1);
        for v in 1..=n {
            dist[v] = INF;
            done[v] = false;
            used[v] = None;
            heap.insert(INF, v);
        }
        let source = if d.host {
            dist[0] = INF;
            done[0] = false;
            used[0] = None;
            heap.insert(INF, 0);
            0
        } else {
            d.target + 1
        };
        dist[source] = 0;
        done[source] = true;
        heap.decrease(source, 0);
        while let Some(cur) = heap.pop() {
            done[cur] = true;
            for &l in &out_links[cur] {
                let (to, w) = (links[l].to, links[l].weight);
                if !done[to] && dist[cur] + w < dist[to] {
                    used[to] = Some(l);
                    dist[to] = dist[cur] + w;
                    heap.decrease(to, dist[to]);
                }
            }
        }
        for (v, u) in used.iter().enumerate().skip(1) {
            if let Some(l) = *u {
                lfts.set(sw.nodes[v - 1], d.lid, links[l].to_port);
            }
        }
        // Each switch's hosts weigh on every link of its route.
        for v in 1..=n {
            if used[v].is_none() {
                continue;
            }
            let add = num_hca[v];
            let mut j = v;
            while let Some(l) = used[j] {
                links[l].weight += add;
                j = links[l].from;
            }
        }
        if d.host {
            links.truncate(host_link);
            out_links[0].clear();
        }
    }
    Ok(lfts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heap hands out keys in order whatever the insertion order.
    #[test]
    fn heap_orders_keys() {
        let keys = [9u64, 3, 7, 3, 1, 12, 5, 5, 0, 8, 2];
        let mut h = Heap::new(keys.len());
        for (v, &k) in keys.iter().enumerate() {
            h.insert(INF, v);
            h.decrease(v, k);
        }
        let mut out = vec![];
        while let Some(v) = h.pop() {
            out.push(keys[v]);
        }
        let mut sorted = keys.to_vec();
        sorted.sort();
        assert_eq!(out, sorted);
    }
}
