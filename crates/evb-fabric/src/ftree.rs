//! A fat-tree routing engine that computes the same forwarding tables as
//! OpenSM's `ftree` engine for host destinations.
//!
//! Written from a study of how OpenSM's engine behaves, not from its code.
//! What has to match, and why:
//! - OpenSM keeps switches in a map keyed by the node GUID in network byte
//!   order on a little-endian host, so "first switch" means smallest
//!   byte-swapped GUID; the first leaf in that order seeds the indexing.
//! - Switches get ranks (distance from the roots, roots being the switches
//!   farthest from the hosts) and index tuples by a breadth-first walk; port
//!   groups (all cables to one neighbour) are sorted by the neighbour's tuple.
//! - Hosts are routed leaf by leaf (leaves sorted by tuple), host by host in
//!   port order. For each host the leaf climbs through its least loaded
//!   up-group (load = routes sent down through it, ties by neighbour index),
//!   the chosen switch routes down to every other switch below it, and the
//!   other up-groups get down routes only. Loads are kept per group and per
//!   port; groups are re-sorted with the same bubble sorts, because the sort
//!   comparator is not a strict order and the outcome depends on the sort.
//! - Leaves with fewer hosts than the fullest leaf route dummy destinations
//!   so that loads stay balanced.

use crate::error::{FabricError, Result};
use crate::lft::{Lfts, NO_PATH};
use crate::topo::Topology;
use std::collections::HashMap;

const TUPLE_LEN: usize = 8;
type Tuple = [u8; TUPLE_LEN];
const UNASSIGNED: Tuple = [0xFF; TUPLE_LEN];

#[derive(Debug, Clone)]
struct FPort {
    port: u8,
    remote_port: u8,
    counter_up: u32,
    counter_down: u32,
}

#[derive(Debug, Clone)]
struct Group {
    /// Index into `sws` if the neighbour is a switch, else host node id.
    remote: usize,
    remote_is_sw: bool,
    remote_lid: u16,
    ports: Vec<FPort>,
    counter_up: u32,
    counter_down: u32,
}

#[derive(Debug, Clone)]
struct FSw {
    node: usize,
    lid: u16,
    rank: u32,
    tuple: Tuple,
    is_leaf: bool,
    down: Vec<usize>,
    up: Vec<usize>,
    sib: Vec<usize>,
    min_counter_down: u32,
    counter_up_changed: bool,
    hops: Vec<u8>,
    lft: Vec<u8>,
}

struct Ftree {
    sws: Vec<FSw>,
    groups: Vec<Group>,
}

/// Result of the ftree engine.
pub struct FtreeResult {
    pub lfts: Lfts,
    /// Host LIDs in the order the engine routed them (OpenSM's
    /// `opensm-ftree-ca-order.dump`).
    pub ca_order: Vec<u16>,
    /// The engine's destination positions: `ca_order` with a `None` for
    /// each dummy destination a short leaf routes in place of the hosts
    /// it lacks. A shift over these positions is what the routing balances
    /// for: consecutive positions climb through distinct up-links.
    pub positions: Vec<Option<u16>>,
}

const UNRANKED: u32 = u32::MAX;

/// Runs the ftree engine. Fails where OpenSM's ftree would refuse the
/// fabric (and fall back to another engine).
pub fn route_ftree(topo: &Topology) -> Result<FtreeResult> {
    let max_lid = topo.max_lid() as usize;
    let mut sw_nodes: Vec<usize> = topo
        .switches()
        .into_iter()
        .filter(|&s| topo.nodes[s].nports() > 1)
        .collect();
    // OpenSM's table order: node GUID in network byte order read as a
    // little-endian integer.
    sw_nodes.sort_by_key(|&s| topo.nodes[s].guid.swap_bytes());
    let mut hca_nodes = topo.hosts();
    hca_nodes.sort_by_key(|&h| topo.nodes[h].guid.swap_bytes());
    if sw_nodes.len() < 2 || hca_nodes.len() < 2 {
        return Err(FabricError::Invalid(
            "ftree needs at least 2 switches and 2 hosts".into(),
        ));
    }
    let sw_of: HashMap<usize, usize> = sw_nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut ft = Ftree {
        sws: sw_nodes
            .iter()
            .map(|&n| FSw {
                node: n,
                lid: topo.nodes[n].lid,
                rank: UNRANKED,
                tuple: UNASSIGNED,
                is_leaf: false,
                down: vec![],
                up: vec![],
                sib: vec![],
                min_counter_down: 0,
                counter_up_changed: false,
                hops: vec![NO_PATH; max_lid + 1],
                lft: vec![NO_PATH; max_lid + 1],
            })
            .collect(),
        groups: vec![],
    };
    let (rank, max_switch_rank) = rank_switches(topo, &sw_nodes, &hca_nodes, &sw_of)?;
    for (s, r) in rank.iter().enumerate() {
        ft.sws[s].rank = *r;
    }
    build_port_groups(&mut ft, topo, &sw_nodes, &sw_of);
    let leaf_rank = max_switch_rank;
    if leaf_rank as usize >= TUPLE_LEN {
        return Err(FabricError::Invalid("ftree: tree too deep".into()));
    }
    ft.mark_leaves(topo, &sw_nodes, &hca_nodes, &sw_of, leaf_rank)?;
    ft.make_indexing(leaf_rank)?;
    let leaves = ft.leaf_array(leaf_rank)?;
    let max_cn = ft.most_hosts_on_a_leaf(&leaves);
    ft.validate(topo, &sw_nodes, max_switch_rank + 1)?;

    let (ca_order, positions) = ft.route_to_hosts(&leaves, max_cn);
    // Route to switches (after hosts, so host routes are unaffected).
    ft.route_to_switches();
    let mut lfts = Lfts::empty(topo);
    for s in &ft.sws {
        lfts.tables[s.node] = s.lft.clone();
    }
    Ok(FtreeResult {
        lfts,
        ca_order,
        positions,
    })
}

/// Ranks the switches as OpenSM's ftree does: by distance from the hosts,
/// reversed, then by distance from the roots found. Returns each switch's
/// rank (`UNRANKED` if cut off) and the highest rank.
fn rank_switches(
    topo: &Topology,
    sw_nodes: &[usize],
    hca_nodes: &[usize],
    sw_of: &HashMap<usize, usize>,
) -> Result<(Vec<u32>, u32)> {
    let neighbours = |s: usize| -> Vec<usize> {
        let n = &topo.nodes[ft_node(sw_nodes, s)];
        (1..n.ports.len())
            .filter_map(|p| n.ports[p])
            .filter_map(|r| sw_of.get(&r.node).copied())
            .collect()
    };
    // Rank from the hosts, reverse, then rank again from the roots found.
    let mut queue = std::collections::VecDeque::new();
    let mut dist = vec![UNRANKED; sw_nodes.len()];
    for &h in hca_nodes {
        let n = &topo.nodes[h];
        for r in n.ports.iter().flatten() {
            if let Some(&s) = sw_of.get(&r.node) {
                if dist[s] == UNRANKED {
                    dist[s] = 0;
                    queue.push_back(s);
                }
            }
        }
    }
    let mut max_rank = 0;
    while let Some(s) = queue.pop_front() {
        for r in neighbours(s) {
            if dist[r] == UNRANKED || dist[r] > dist[s] + 1 {
                dist[r] = dist[s] + 1;
                max_rank = dist[r];
                queue.push_back(r);
            }
        }
    }
    let mut rank = vec![UNRANKED; sw_nodes.len()];
    for s in 0..sw_nodes.len() {
        if dist[s] != UNRANKED && max_rank - dist[s] == 0 {
            rank[s] = 0;
            queue.push_back(s);
        }
    }
    let mut max_switch_rank = 0;
    while let Some(s) = queue.pop_front() {
        for r in neighbours(s) {
            if rank[r] == UNRANKED || rank[r] > rank[s] + 1 {
                rank[r] = rank[s] + 1;
                max_switch_rank = rank[r];
                queue.push_back(r);
            }
        }
    }
    if max_switch_rank == 0 {
        return Err(FabricError::Invalid(
            "ftree: fabric has a single switch level".into(),
        ));
    }
    Ok((rank, max_switch_rank))
}

/// Port groups of each ranked switch, in port order, one per neighbour:
/// up, sibling or down by the neighbour's rank.
fn build_port_groups(
    ft: &mut Ftree,
    topo: &Topology,
    sw_nodes: &[usize],
    sw_of: &HashMap<usize, usize>,
) {
    #[allow(clippy::needless_range_loop)] // `s` indexes several tables
    for s in 0..ft.sws.len() {
        if ft.sws[s].rank == UNRANKED {
            continue;
        }
        let n = &topo.nodes[sw_nodes[s]];
        for p in 1..n.ports.len() {
            let Some(r) = n.ports[p] else { continue };
            if r.node == sw_nodes[s] {
                continue;
            }
            let rn = &topo.nodes[r.node];
            let (remote, is_sw, dir) = if rn.is_switch() {
                let Some(&rs) = sw_of.get(&r.node) else {
                    continue;
                };
                if ft.sws[rs].rank == UNRANKED {
                    continue;
                }
                let (a, b) = (ft.sws[s].rank, ft.sws[rs].rank);
                (rs, true, a.cmp(&b))
            } else {
                (r.node, false, std::cmp::Ordering::Less)
            };
            let remote_lid = rn.lid;
            let list: &Vec<usize> = match dir {
                std::cmp::Ordering::Greater => &ft.sws[s].up,
                std::cmp::Ordering::Equal => &ft.sws[s].sib,
                std::cmp::Ordering::Less => &ft.sws[s].down,
            };
            let existing = list
                .iter()
                .copied()
                .find(|&g| ft.groups[g].remote_lid == remote_lid);
            let g = match existing {
                Some(g) => g,
                None => {
                    ft.groups.push(Group {
                        remote,
                        remote_is_sw: is_sw,
                        remote_lid,
                        ports: vec![],
                        counter_up: 0,
                        counter_down: 0,
                    });
                    let g = ft.groups.len() - 1;
                    match dir {
                        std::cmp::Ordering::Greater => ft.sws[s].up.push(g),
                        std::cmp::Ordering::Equal => ft.sws[s].sib.push(g),
                        std::cmp::Ordering::Less => ft.sws[s].down.push(g),
                    }
                    g
                }
            };
            if !ft.groups[g].ports.iter().any(|x| x.port == p as u8) {
                ft.groups[g].ports.push(FPort {
                    port: p as u8,
                    remote_port: r.port,
                    counter_up: 0,
                    counter_down: 0,
                });
            }
        }
    }
}

fn ft_node(sw_nodes: &[usize], s: usize) -> usize {
    sw_nodes[s]
}

impl Ftree {
    /// Marks the switches with hosts as leaves; they must all sit at the
    /// leaf rank, or the fabric is not a fat tree.
    fn mark_leaves(
        &mut self,
        topo: &Topology,
        sw_nodes: &[usize],
        hca_nodes: &[usize],
        sw_of: &HashMap<usize, usize>,
        leaf_rank: u32,
    ) -> Result<()> {
        for &h in hca_nodes {
            for r in topo.nodes[h].ports.iter().flatten() {
                if let Some(&s) = sw_of.get(&r.node) {
                    if self.sws[s].rank != leaf_rank {
                        return Err(FabricError::Invalid(format!(
                            "ftree: host '{}' is cabled to switch '{}' of rank {} but the leaf rank is {leaf_rank}: not a fat tree",
                            topo.nodes[h].name, topo.nodes[sw_nodes[s]].name, self.sws[s].rank
                        )));
                    }
                    self.sws[s].is_leaf = true;
                }
            }
        }
        Ok(())
    }

    /// The leaf array: leaf-rank switches sorted by tuple, trimmed to the
    /// span holding hosts.
    fn leaf_array(&self, leaf_rank: u32) -> Result<Vec<usize>> {
        let mut all: Vec<usize> = (0..self.sws.len())
            .filter(|&s| self.sws[s].rank == leaf_rank)
            .collect();
        all.sort_by(|&a, &b| self.sws[a].tuple.cmp(&self.sws[b].tuple));
        let first = all.iter().position(|&s| self.sws[s].is_leaf);
        let last = all.iter().rposition(|&s| self.sws[s].is_leaf);
        let (Some(first), Some(last)) = (first, last) else {
            return Err(FabricError::Invalid("ftree: no leaf switches".into()));
        };
        if first >= last {
            return Err(FabricError::Invalid(
                "ftree: failed to find leaf switches, not a fat tree".into(),
            ));
        }
        Ok(all[first..=last].to_vec())
    }

    /// The most hosts any leaf holds: shorter leaves route dummy
    /// destinations up to this count.
    fn most_hosts_on_a_leaf(&self, leaves: &[usize]) -> usize {
        leaves
            .iter()
            .map(|&s| {
                self.sws[s]
                    .down
                    .iter()
                    .filter(|&&g| !self.groups[g].remote_is_sw)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// Routes every host, leaf by leaf, host by host in port order, then
    /// `max_cn` minus the leaf's hosts dummy destinations. Returns the host
    /// LIDs in routing order and the destination positions (`None`: dummy).
    fn route_to_hosts(&mut self, leaves: &[usize], max_cn: usize) -> (Vec<u16>, Vec<Option<u16>>) {
        let mut ca_order = vec![];
        let mut positions = vec![];
        for &leaf in leaves {
            let mut routed = 0;
            let downs = self.sws[leaf].down.clone();
            for g in downs {
                if self.groups[g].remote_is_sw {
                    continue;
                }
                let lid = self.groups[g].remote_lid;
                let port = self.groups[g].ports[0].port;
                self.sws[leaf].lft[lid as usize] = port;
                self.sws[leaf].hops[lid as usize] = 1;
                self.down_by_up(leaf, None, lid, true, 1);
                ca_order.push(lid);
                positions.push(Some(lid));
                routed += 1;
            }
            for _ in routed..max_cn {
                positions.push(None);
                self.sws[leaf].hops[0] = 1;
                self.down_by_up(leaf, None, 0, true, 1);
                for s in self.sws.iter_mut() {
                    s.hops[0] = NO_PATH;
                    s.lft[0] = NO_PATH;
                }
            }
        }
        (ca_order, positions)
    }

    /// Routes to every ranked switch's own LID.
    fn route_to_switches(&mut self) {
        for s in 0..self.sws.len() {
            if self.sws[s].rank == UNRANKED {
                continue;
            }
            let lid = self.sws[s].lid;
            self.sws[s].lft[lid as usize] = 0;
            self.sws[s].hops[lid as usize] = 0;
            self.down_by_up(s, None, lid, false, 0);
        }
    }

    fn remote_tuple(&self, g: usize) -> Tuple {
        let gr = &self.groups[g];
        if gr.remote_is_sw {
            self.sws[gr.remote].tuple
        } else {
            UNASSIGNED
        }
    }
    fn cmp_index(&self, a: usize, b: usize) -> i32 {
        match self.remote_tuple(a).cmp(&self.remote_tuple(b)) {
            std::cmp::Ordering::Less => -1,
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Greater => 1,
        }
    }
    fn cmp_load_up(&self, a: usize, b: usize) -> i32 {
        let t = self.groups[a].counter_up as i64 - self.groups[b].counter_up as i64;
        if t > 0 {
            return 1;
        }
        if t < 0 {
            return -1;
        }
        self.cmp_index(a, b)
    }
    /// Down-load comparison; note the second key only ever says "greater",
    /// as in the engine we match.
    fn cmp_load_down(&self, a: usize, b: usize) -> i32 {
        let t = self.groups[a].counter_down as i64 - self.groups[b].counter_down as i64;
        if t > 0 {
            return 1;
        }
        if t < 0 {
            return -1;
        }
        let l1 = self.min_down_of(a);
        let l2 = self.min_down_of(b);
        if (l1.wrapping_sub(l2) as i32) > 0 {
            return 1;
        }
        self.cmp_index(a, b)
    }
    fn min_down_of(&self, g: usize) -> u32 {
        let gr = &self.groups[g];
        if gr.remote_is_sw {
            self.sws[gr.remote].min_counter_down
        } else {
            0
        }
    }
    fn bubble(&self, arr: &mut [usize], cmp: impl Fn(&Self, usize, usize) -> i32) {
        let n = arr.len();
        let mut i = 0;
        loop {
            let mut swapped = false;
            for j in 1..n.saturating_sub(i) {
                if cmp(self, arr[j], arr[j - 1]) < 0 {
                    arr.swap(j, j - 1);
                    swapped = true;
                }
            }
            i += 1;
            if !swapped || i >= n {
                break;
            }
        }
    }
    fn sort_down_groups_by_up(&mut self, s: usize) {
        if self.sws[s].down.is_empty() || !self.sws[s].counter_up_changed {
            return;
        }
        let mut arr = std::mem::take(&mut self.sws[s].down);
        self.bubble(&mut arr, Self::cmp_load_up);
        self.sws[s].down = arr;
        self.sws[s].counter_up_changed = false;
    }

    fn min_port(&self, g: usize, up: bool) -> usize {
        let ports = &self.groups[g].ports;
        let mut m = 0;
        for (j, p) in ports.iter().enumerate().skip(1) {
            let (a, b) = if up {
                (p.counter_up, ports[m].counter_up)
            } else {
                (p.counter_down, ports[m].counter_down)
            };
            if a < b {
                m = j;
            }
        }
        m
    }

    /// Sets routes on switches below `s` toward `target`.
    fn up_by_down(&mut self, s: usize, prev: Option<usize>, target: u16, hops: u8) -> bool {
        if self.sws[s].down.is_empty() {
            return false;
        }
        self.sort_down_groups_by_up(s);
        if !self.sws[s].sib.is_empty() {
            let mut arr = std::mem::take(&mut self.sws[s].sib);
            self.bubble(&mut arr, Self::cmp_load_up);
            self.sws[s].sib = arr;
        }
        // Index the live arrays (recursion below never re-sorts this
        // switch's groups), without copying them for every visit.
        let nd = self.sws[s].down.len();
        let total = nd
            + if target != 0 {
                self.sws[s].sib.len()
            } else {
                0
            };
        let mut created = false;
        let t = target as usize;
        for k in 0..total {
            let g = if k < nd {
                self.sws[s].down[k]
            } else {
                self.sws[s].sib[k - nd]
            };
            if !self.groups[g].remote_is_sw {
                created = true;
                continue;
            }
            let r = self.groups[g].remote;
            if let Some(p) = prev {
                if self.groups[g].remote_lid == self.sws[p].lid {
                    continue;
                }
            }
            if self.groups[g].ports.is_empty() {
                continue;
            }
            let mp = self.min_port(g, true);
            let least = self.sws[r].hops[t];
            if least != NO_PATH && hops as u32 + 1 >= least as u32 {
                continue;
            }
            self.sws[r].lft[t] = self.groups[g].ports[mp].remote_port;
            self.sws[r].hops[t] = hops.saturating_add(1);
            let routed = self.up_by_down(r, None, target, hops.saturating_add(1));
            created |= routed;
            if routed {
                self.groups[g].ports[mp].counter_up += 1;
                self.groups[g].counter_up += 1;
                self.sws[s].counter_up_changed = true;
            }
        }
        created
    }

    fn recalc_min_down(&mut self, s: usize) {
        let m = self.sws[s]
            .down
            .iter()
            .map(|&g| self.groups[g].counter_down)
            .min()
            .unwrap_or(1 << 30);
        self.sws[s].min_counter_down = m;
    }

    /// Routes `target` from switch `s` upwards (and, through each switch
    /// reached, downwards).
    fn down_by_up(
        &mut self,
        s: usize,
        prev: Option<usize>,
        target: u16,
        main: bool,
        hops: u8,
    ) -> bool {
        let mut created = self.up_by_down(s, prev, target, hops);
        if self.sws[s].rank == 0 || self.sws[s].up.is_empty() {
            return created;
        }
        let t = target as usize;
        let mut ups = std::mem::take(&mut self.sws[s].up);
        self.bubble(&mut ups, Self::cmp_load_down);
        self.sws[s].up = ups.clone();
        let min_g = ups[0];
        let min_p = self.min_port(min_g, false);
        if main {
            let r = self.groups[min_g].remote;
            self.groups[min_g].counter_down += 1;
            self.groups[min_g].ports[min_p].counter_down += 1;
            if self.groups[min_g].counter_down == self.sws[r].min_counter_down + 1 {
                self.recalc_min_down(r);
            }
            if self.sws[r].lft[t] == NO_PATH || (hops as u32 + 1) < self.sws[r].hops[t] as u32 {
                self.sws[r].lft[t] = self.groups[min_g].ports[min_p].remote_port;
                self.sws[r].hops[t] = hops.saturating_add(1);
            }
            created |= self.down_by_up(r, Some(s), target, main, hops.saturating_add(1));
        }
        for &g in ups.iter().skip(if main { 1 } else { 0 }) {
            let r = self.groups[g].remote;
            if self.sws[r].lft[t] != NO_PATH && hops as u32 + 1 >= self.sws[r].hops[t] as u32 {
                continue;
            }
            if self.groups[g].ports.is_empty() {
                continue;
            }
            let p = self.min_port(g, false);
            self.sws[r].lft[t] = self.groups[g].ports[p].remote_port;
            self.sws[r].hops[t] = hops.saturating_add(1);
            created |= self.down_by_up(r, Some(s), target, false, hops.saturating_add(1));
        }
        if !self.sws[s].sib.is_empty() {
            let mut sib = std::mem::take(&mut self.sws[s].sib);
            self.bubble(&mut sib, Self::cmp_load_down);
            self.sws[s].sib = sib.clone();
            for g in sib {
                let r = self.groups[g].remote;
                if self.sws[r].lft[t] != NO_PATH && hops as u32 + 1 >= self.sws[r].hops[t] as u32 {
                    continue;
                }
                if self.groups[g].ports.is_empty() {
                    continue;
                }
                let min_p = self.min_port(g, false);
                self.sws[r].lft[t] = self.groups[g].ports[min_p].remote_port;
                self.sws[r].hops[t] = hops.saturating_add(1);
                let routed = self.down_by_up(r, Some(s), target, false, hops.saturating_add(1));
                created |= routed;
                if routed {
                    // The engine we match charges the main up-group here.
                    self.groups[min_g].counter_down += 1;
                    self.groups[g].ports[min_p].counter_down += 1;
                }
            }
        }
        created
    }

    fn new_tuple(
        &self,
        by_tuple: &HashMap<Tuple, usize>,
        from: Tuple,
        down: bool,
    ) -> Option<Tuple> {
        let mut t = from;
        let var = if down {
            t[0] += 1;
            from[0] as usize + 1
        } else {
            t[0] -= 1;
            from[0] as usize
        };
        if var >= TUPLE_LEN {
            return None;
        }
        for i in 0..0xFFu8 {
            t[var] = i;
            if !by_tuple.contains_key(&t) {
                return Some(t);
            }
        }
        None
    }

    fn make_indexing(&mut self, leaf_rank: u32) -> Result<()> {
        let Some(first) = (0..self.sws.len()).find(|&s| self.sws[s].is_leaf) else {
            return Err(FabricError::Invalid("ftree: no leaf switch".into()));
        };
        let mut by_tuple: HashMap<Tuple, usize> = HashMap::new();
        let mut t = UNASSIGNED;
        t[0] = self.sws[first].rank as u8;
        for x in t.iter_mut().take(leaf_rank as usize + 1).skip(1) {
            *x = 0;
        }
        self.sws[first].tuple = t;
        by_tuple.insert(t, first);
        let first_rank = self.sws[first].rank;
        let mut q = std::collections::VecDeque::from([first]);
        while let Some(s) = q.pop_front() {
            if self.sws[s].rank < leaf_rank {
                for g in self.sws[s].down.clone() {
                    if !self.groups[g].remote_is_sw {
                        continue;
                    }
                    let r = self.groups[g].remote;
                    if self.sws[r].tuple != UNASSIGNED {
                        continue;
                    }
                    let nt = self
                        .new_tuple(&by_tuple, self.sws[s].tuple, true)
                        .ok_or_else(|| FabricError::Invalid("ftree: indexing failed".into()))?;
                    self.sws[r].tuple = nt;
                    by_tuple.insert(nt, r);
                    q.push_back(r);
                }
                let mut d = std::mem::take(&mut self.sws[s].down);
                d.sort_by_key(|&a| self.remote_tuple(a));
                self.sws[s].down = d;
            }
            if self.sws[s].rank != 0 && (first_rank != 0 || !self.sws[s].is_leaf) {
                for g in self.sws[s].up.clone() {
                    let r = self.groups[g].remote;
                    if self.sws[r].tuple != UNASSIGNED {
                        continue;
                    }
                    let nt = self
                        .new_tuple(&by_tuple, self.sws[s].tuple, false)
                        .ok_or_else(|| FabricError::Invalid("ftree: indexing failed".into()))?;
                    self.sws[r].tuple = nt;
                    by_tuple.insert(nt, r);
                    q.push_back(r);
                }
                let mut u = std::mem::take(&mut self.sws[s].up);
                u.sort_by_key(|&a| self.remote_tuple(a));
                self.sws[s].up = u;
            }
        }
        Ok(())
    }

    /// The checks after which OpenSM's ftree gives up on a fabric.
    fn validate(&self, topo: &Topology, sw_nodes: &[usize], tree_rank: u32) -> Result<()> {
        let mut reference: Vec<Option<usize>> = vec![None; tree_rank as usize];
        for s in 0..self.sws.len() {
            let sw = &self.sws[s];
            if sw.rank == UNRANKED {
                continue;
            }
            let Some(r) = reference[sw.rank as usize] else {
                reference[sw.rank as usize] = Some(s);
                continue;
            };
            let rf = &self.sws[r];
            let name = |x: usize| topo.nodes[sw_nodes[x]].name.clone();
            let bad = |what: &str| {
                Err(FabricError::Invalid(format!(
                    "ftree: switches '{}' and '{}' of rank {} differ in {what}; OpenSM's ftree would refuse this fabric",
                    name(r),
                    name(s),
                    sw.rank
                )))
            };
            if rf.up.len() != sw.up.len() {
                return bad("number of up-going neighbours");
            }
            if sw.rank != tree_rank - 1 && rf.down.len() != sw.down.len() {
                return bad("number of down-going neighbours");
            }
            if let Some(&g0) = rf.up.first() {
                if sw
                    .up
                    .iter()
                    .any(|&g| self.groups[g].ports.len() != self.groups[g0].ports.len())
                {
                    return bad("cables per up-going neighbour");
                }
            }
            if let Some(&g0) = rf.down.first() {
                if sw.rank != tree_rank - 1
                    && !sw.down.is_empty()
                    && self.groups[sw.down[0]].ports.len() != self.groups[g0].ports.len()
                {
                    return bad("cables per down-going neighbour");
                }
            }
        }
        Ok(())
    }
}
