//! The measured waiting mapped onto the links the shift overloads.
//!
//! A port's `PortXmitWait` grows while its next hop is full, so the
//! waiting shows up upstream of a shared link (mostly at the senders'
//! host ports), not on it. Every flow of every shift step is traced
//! through the forwarding tables; a flow through a waiting port is
//! waiting on the first link at or after that port that the step
//! **overloads**: asks more of than it carries at the hosts' usual rate
//! (two flows, or one flow over a link at half that rate). Such links are
//! called shared here, as most are. A port carries many flows one after the other and
//! one delayed flow holds up the port, so each waiting port's share of
//! the interval is spread over its flows that meet a shared link and
//! credited to the links they wait on: a link's **blame** is the waiting
//! it explains. A waiting port none of whose flows meets a shared link is
//! left **unexplained** (a slow receiver, other traffic, or a rank order
//! other than the one given).
//!
//! Along the way each shared link keeps the steps it is shared in and
//! the rank pairs that share it.

use super::measure::LinkFigures;
use crate::error::Result;
use crate::lft::{link_of, trace, Lfts};
use crate::topo::Topology;
use serde::Serialize;
use std::collections::HashMap;

/// Steps listed per shared link.
const MAX_STEPS: usize = 24;
/// Rank pairs listed per shared link.
const MAX_PAIRS: usize = 8;

/// A directed link the shift shares, and what it explains.
#[derive(Debug, Clone, Serialize)]
pub struct SharedLink {
    /// `NAME:PORT->NAME:PORT`.
    pub link: String,
    pub node: String,
    pub port: u8,
    pub to: String,
    pub to_port: u8,
    #[serde(skip)]
    pub id: u32,
    /// Flows beyond the first, summed over steps, and the largest load.
    pub conflicts: u64,
    pub max_load: u32,
    /// The time it needs beyond one flow's, summed over steps, in flows'
    /// worth (its conflicts on a fabric of one rate).
    pub overload: f64,
    /// Steps it is shared in (the first [`MAX_STEPS`]), and how many.
    pub steps: Vec<usize>,
    pub steps_shared: usize,
    /// Rank pairs (sender, receiver) sharing it, from its first steps.
    pub pairs: Vec<[usize; 2]>,
    /// Share of the interval, summed over waiting ports, that waits on it.
    pub blame: f64,
    /// Measured: its own utilisation and wait, when it has counters.
    pub utilisation: Option<f64>,
    pub wait: Option<f64>,
}

/// What waits on what.
#[derive(Debug, Clone, Serialize)]
pub struct Attribution {
    /// Shared links, most blamed first (then most conflicts).
    pub shared: Vec<SharedLink>,
    /// Waiting (summed shares of the interval) explained by shared links,
    /// and not.
    pub explained_wait: f64,
    pub unexplained_wait: f64,
    /// Per waiting port (by directed link id): the shared link most of its
    /// waiting is on, and that part of its waiting.
    #[serde(skip)]
    pub waits_on: HashMap<u32, (u32, f64)>,
}

/// Per directed link: its data rate, Gb/s (`nominal` where unknown).
pub fn link_rates(topo: &Topology, nominal: f64) -> Vec<f64> {
    let (offsets, nlinks) = topo.port_offsets();
    let mut rate = vec![nominal; nlinks];
    for (i, node) in topo.nodes.iter().enumerate() {
        for p in 1..node.ports.len() {
            if let Some(g) = topo.link_gbps(i, p as u8) {
                rate[offsets[i] as usize + p] = g;
            }
        }
    }
    rate
}

/// Per step scratch: link loads, the links touched, the flows' paths.
struct Step {
    load: Vec<u32>,
    touched: Vec<u32>,
    paths: Vec<u32>,
    starts: Vec<usize>,
    /// Per link: what one flow needs of it (the hosts' usual rate over the
    /// link's), so that `load x need > 1` is an overload.
    need: Vec<f64>,
}

impl Step {
    fn overloaded(&self, l: u32) -> bool {
        f64::from(self.load[l as usize]) * self.need[l as usize] > 1.0 + 1e-9
    }
}

/// Traces the shift of `order` over `steps` and credits the measured
/// waiting of `links` to the shared links.
pub fn attribute(
    topo: &Topology,
    lfts: &Lfts,
    order: &[usize],
    steps: &[usize],
    links: &[LinkFigures],
    nominal: f64,
) -> Result<Attribution> {
    let (offsets, nlinks) = topo.port_offsets();
    let mut wait = vec![0f64; nlinks];
    for l in links {
        if let Some(w) = l.wait.filter(|w| *w > 0.0) {
            wait[(offsets[l.node_id] + u32::from(l.port)) as usize] = w;
        }
    }
    let n = order.len();
    let mut st = Step {
        load: vec![0; nlinks],
        touched: Vec::new(),
        paths: Vec::with_capacity(n * 6),
        starts: Vec::with_capacity(n + 1),
        need: link_rates(topo, nominal)
            .iter()
            .map(|r| nominal / r)
            .collect(),
    };
    let mut shared: HashMap<u32, SharedLink> = HashMap::new();
    // (waiting port, shared link) -> flows; per waiting port: flows, and
    // flows that meet no shared link.
    let mut on: HashMap<(u32, u32), u32> = HashMap::new();
    let mut flows = vec![0u32; nlinks];
    let mut free = vec![0u32; nlinks];
    for &s in steps {
        trace_step(topo, lfts, &offsets, order, s, &mut st)?;
        note_shared(topo, &offsets, &st, s, n, &mut shared);
        for f in 0..n {
            let path = &st.paths[st.starts[f]..st.starts[f + 1]];
            let mut culprit = None;
            for &l in path.iter().rev() {
                if st.overloaded(l) {
                    culprit = Some(l);
                }
                if wait[l as usize] > 0.0 {
                    flows[l as usize] += 1;
                    match culprit {
                        Some(c) => *on.entry((l, c)).or_default() += 1,
                        None => free[l as usize] += 1,
                    }
                }
            }
        }
        for &l in &st.touched {
            st.load[l as usize] = 0;
        }
    }
    Ok(blame(&wait, &flows, &free, on, shared, links, &offsets))
}

/// The links step `s` of the shift of `order` overloads, with their loads
/// (most loaded first).
pub fn overloaded_in_step(
    topo: &Topology,
    lfts: &Lfts,
    order: &[usize],
    s: usize,
    nominal: f64,
) -> Result<Vec<(String, u32)>> {
    let (offsets, nlinks) = topo.port_offsets();
    let mut st = Step {
        load: vec![0; nlinks],
        touched: Vec::new(),
        paths: Vec::new(),
        starts: Vec::new(),
        need: link_rates(topo, nominal)
            .iter()
            .map(|r| nominal / r)
            .collect(),
    };
    trace_step(topo, lfts, &offsets, order, s, &mut st)?;
    let mut out: Vec<(String, u32)> = st
        .touched
        .iter()
        .filter(|&&l| st.overloaded(l))
        .map(|&l| (new_shared(topo, &offsets, l).link, st.load[l as usize]))
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(out)
}

/// Traces every flow of step `s` and loads the links.
fn trace_step(
    topo: &Topology,
    lfts: &Lfts,
    offsets: &[u32],
    order: &[usize],
    s: usize,
    st: &mut Step,
) -> Result<()> {
    let n = order.len();
    st.touched.clear();
    st.paths.clear();
    st.starts.clear();
    for i in 0..n {
        st.starts.push(st.paths.len());
        trace(
            topo,
            lfts,
            offsets,
            order[i],
            order[(i + s) % n],
            &mut st.paths,
        )?;
    }
    st.starts.push(st.paths.len());
    for &l in &st.paths {
        let c = &mut st.load[l as usize];
        if *c == 0 {
            st.touched.push(l);
        }
        *c += 1;
    }
    Ok(())
}

/// Records the links step `s` shares: its conflicts, the step, the pairs.
fn note_shared(
    topo: &Topology,
    offsets: &[u32],
    st: &Step,
    s: usize,
    n: usize,
    shared: &mut HashMap<u32, SharedLink>,
) {
    for &l in &st.touched {
        if !st.overloaded(l) {
            continue;
        }
        let c = st.load[l as usize];
        let e = shared
            .entry(l)
            .or_insert_with(|| new_shared(topo, offsets, l));
        e.conflicts += u64::from(c - 1);
        e.overload += f64::from(c) * st.need[l as usize] - 1.0;
        e.max_load = e.max_load.max(c);
        e.steps_shared += 1;
        if e.steps.len() < MAX_STEPS {
            e.steps.push(s);
        }
    }
    for f in 0..n {
        for &l in &st.paths[st.starts[f]..st.starts[f + 1]] {
            if !st.overloaded(l) {
                continue;
            }
            if let Some(e) = shared.get_mut(&l) {
                if e.pairs.len() < MAX_PAIRS {
                    e.pairs.push([f, (f + s) % n]);
                }
            }
        }
    }
}

fn new_shared(topo: &Topology, offsets: &[u32], l: u32) -> SharedLink {
    let (node, port) = link_of(offsets, l);
    let r = topo.nodes[node].ports[port as usize].expect("a traced link is cabled");
    let (name, to) = (&topo.nodes[node].name, &topo.nodes[r.node].name);
    SharedLink {
        link: format!("{name}:{port}->{to}:{}", r.port),
        node: name.clone(),
        port,
        to: to.clone(),
        to_port: r.port,
        id: l,
        conflicts: 0,
        max_load: 0,
        overload: 0.0,
        steps: Vec::new(),
        steps_shared: 0,
        pairs: Vec::new(),
        blame: 0.0,
        utilisation: None,
        wait: None,
    }
}

/// Spreads each waiting port's waiting over its flows and sums it per
/// shared link.
fn blame(
    wait: &[f64],
    flows: &[u32],
    free: &[u32],
    on: HashMap<(u32, u32), u32>,
    mut shared: HashMap<u32, SharedLink>,
    links: &[LinkFigures],
    offsets: &[u32],
) -> Attribution {
    let mut explained = 0.0;
    let mut unexplained = 0.0;
    let mut waits_on: HashMap<u32, (u32, f64)> = HashMap::new();
    // A port that waits waits on its flows that meet a shared link: its
    // waiting is spread over those (one delayed flow holds the port up
    // for the others); a port none of whose flows meets one is not
    // explained.
    for ((p, c), k) in on {
        let meeting = flows[p as usize] - free[p as usize];
        let part = wait[p as usize] * f64::from(k) / f64::from(meeting.max(1));
        explained += part;
        if let Some(e) = shared.get_mut(&c) {
            e.blame += part;
        }
        let w = waits_on.entry(p).or_insert((c, 0.0));
        if part > w.1 {
            *w = (c, part);
        }
    }
    // Ports waiting with no flow of the shift through them, or none that
    // meets a shared link.
    for (p, &w) in wait.iter().enumerate() {
        if w > 0.0 && free[p] == flows[p] {
            unexplained += w;
        }
    }
    let by_id: HashMap<u32, &LinkFigures> = links
        .iter()
        .map(|l| (offsets[l.node_id] + u32::from(l.port), l))
        .collect();
    let mut shared: Vec<SharedLink> = shared.into_values().collect();
    for s in &mut shared {
        if let Some(l) = by_id.get(&s.id) {
            s.utilisation = l.utilisation;
            s.wait = l.wait;
        }
    }
    shared.sort_by(|a, b| {
        b.blame
            .total_cmp(&a.blame)
            .then(b.overload.total_cmp(&a.overload))
            .then(a.id.cmp(&b.id))
    });
    Attribution {
        shared,
        explained_wait: explained,
        unexplained_wait: unexplained,
        waits_on,
    }
}
