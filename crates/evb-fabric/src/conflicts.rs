//! Conflict analysis of shift schedules.
//!
//! A shift schedule has steps 1..N-1; in step `s` the host of rank `i`
//! sends to the host of rank `(i + s) mod N`. Every flow is traced through
//! the LFTs; a *directed link* is one output port of one node (a cable used
//! in one direction). Within one step, a link carrying `f` flows has
//! `max(0, f - 1)` **conflicts**: one per flow beyond the first, because
//! those flows must share the link's bandwidth. The total is the sum over
//! steps and links. Also reported: flows (all traced flows), steps with at
//! least one conflict, flows on shared links (flows on links with `f >= 2`)
//! and the maximum link load (largest `f`).
//!
//! Links of different rates: a flow asks for the rate of the slower of its
//! two host links, and a link of rate `R` carrying flows that ask `D` in
//! all has `max(0, D / R - 1)` **weighted conflicts** (`weighted_conflicts`):
//! two flows of 100 Gb/s on a 200 Gb/s uplink have none, three have half
//! of one. With every link at one rate the weighted count is the count.
//! Links of unknown rate count at the hosts' rate.
//!
//! On request ([`analyze_with_loads`]) the load of every directed link in
//! every step is kept too (the links x steps matrix of a heat map), bounded
//! by a cell budget because it grows as links times steps.

use crate::error::Result;
use crate::lft::{link_of, trace, Lfts, NO_PATH};
use crate::topo::Topology;
use serde::Serialize;

/// Per-step figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepStats {
    pub step: usize,
    pub flows: u64,
    pub conflicts: u64,
    /// Conflicts weighed by the links' rates (the module's doc).
    pub weighted_conflicts: f64,
    pub max_link_load: u32,
    pub shared_links: u64,
    pub flows_on_shared_links: u64,
    /// How long the step's busiest link needs, in units of one flow at the
    /// hosts' usual rate: its flows times that rate over its own rate (1
    /// on a fabric of one rate without conflicts, 2 for two flows or for
    /// one flow over a link at half the rate). What a synchronised shift's
    /// step takes; `diagnose` estimates rates from it. Not written out.
    #[serde(skip)]
    pub slowest_link: f64,
}

/// Totals over all steps.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Totals {
    pub flows: u64,
    pub conflicts: u64,
    /// Conflicts weighed by the links' rates (the module's doc).
    pub weighted_conflicts: f64,
    pub steps: usize,
    pub steps_with_conflicts: usize,
    pub max_link_load: u32,
    pub flows_on_shared_links: u64,
}

/// A directed link and how badly it is shared.
#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    pub node: String,
    pub port: u8,
    pub to: String,
    pub to_port: u8,
    /// Conflicts on this link summed over steps, and weighed by its rate.
    pub conflicts: u64,
    pub weighted_conflicts: f64,
    pub steps_shared: u64,
    pub max_load: u32,
    /// Width and speed (`4xEDR`) and data rate of the link, when known.
    pub rate: Option<String>,
    pub gbps: Option<f64>,
}

/// One directed link's load in every analysed step.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LinkLoad {
    /// Directed link id: the port's index in the fabric's port numbering
    /// (stable for one topology file).
    pub id: u32,
    /// `node:port->to:to_port`.
    pub name: String,
    pub node: String,
    pub port: u8,
    pub to: String,
    pub to_port: u8,
    /// Flows on the link in each step, in the order of `LinkLoads::steps`.
    pub loads: Vec<u32>,
}

/// The load of every directed link that carries a flow, per step.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LinkLoads {
    /// The steps, in column order.
    pub steps: Vec<usize>,
    /// Links that carry at least one flow in some step, by id.
    pub links: Vec<LinkLoad>,
    /// Directed links of the fabric that carry no flow in any step (not listed).
    pub idle_links: usize,
}

/// Result of an analysis.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub hosts: usize,
    pub total: Totals,
    pub per_step: Vec<StepStats>,
    pub worst_links: Vec<LinkReport>,
    /// Per-link per-step loads, when asked for and within the budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_loads: Option<LinkLoads>,
    /// Every directed link some step asks more of than it carries, at
    /// the hosts' usual rate (two flows, or one flow over a link slower
    /// than the hosts), by id: the time it needs beyond one flow's, summed
    /// over the steps, in flows' worth. Not written out.
    #[serde(skip)]
    pub overloaded: Vec<(u32, f64)>,
}

/// The full shift schedule for `n` ranks.
pub fn shift_steps(n: usize) -> Vec<usize> {
    (1..n).collect()
}

/// What "step s" means. evb's own convention is [`StepConvention::Send`]:
/// in step s rank i sends to rank i + s. Papers that number steps by the
/// rank received from ([`StepConvention::Receive`]: rank i receives from
/// rank i + s, i.e. sends to i - s) call evb's step N - s their step s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepConvention {
    #[default]
    Send,
    Receive,
}

impl StepConvention {
    pub fn parse(s: &str) -> Result<StepConvention> {
        match s {
            "send" => Ok(StepConvention::Send),
            "receive" | "recv" => Ok(StepConvention::Receive),
            _ => Err(crate::FabricError::Invalid(format!(
                "step convention '{s}': send (i -> i+s) or receive (i <- i+s)"
            ))),
        }
    }
    /// evb's (send) step for step `s` of this convention among `n` ranks.
    pub fn to_send(self, s: usize, n: usize) -> usize {
        match self {
            StepConvention::Receive if n > 0 => (n - s % n) % n,
            _ => s,
        }
    }
    /// `to_send` over a list.
    pub fn to_send_steps(self, steps: &[usize], n: usize) -> Vec<usize> {
        steps.iter().map(|&s| self.to_send(s, n)).collect()
    }
}

impl Analysis {
    /// Renumbers the steps of an analysis of send steps in `conv` (the map
    /// is its own inverse), per-step lists and load columns in the new order.
    pub fn relabel_steps(&mut self, conv: StepConvention) {
        if conv == StepConvention::Send {
            return;
        }
        let n = self.hosts;
        for st in &mut self.per_step {
            st.step = conv.to_send(st.step, n);
        }
        self.per_step.sort_by_key(|s| s.step);
        if let Some(ll) = &mut self.link_loads {
            let mut cols: Vec<(usize, usize)> = ll
                .steps
                .iter()
                .enumerate()
                .map(|(k, &s)| (conv.to_send(s, n), k))
                .collect();
            cols.sort();
            ll.steps = cols.iter().map(|c| c.0).collect();
            for l in &mut ll.links {
                l.loads = cols.iter().map(|c| l.loads[c.1]).collect();
            }
        }
    }
}

/// The figures of a share of the steps, per step and per directed link;
/// the shares of all threads add up to the analysis ([`Partial::absorb`]).
struct Partial {
    steps: Vec<StepStats>,
    link_conf: Vec<u64>,
    link_weighted: Vec<f64>,
    link_overload: Vec<f64>,
    link_steps: Vec<u64>,
    link_max: Vec<u32>,
    /// With loads: per step, (link, flows) of every link used.
    loads: Vec<(usize, Vec<(u32, u32)>)>,
}

impl Partial {
    fn new(nlinks: usize) -> Partial {
        Partial {
            steps: vec![],
            link_conf: vec![0; nlinks],
            link_weighted: vec![0.0; nlinks],
            link_overload: vec![0.0; nlinks],
            link_steps: vec![0; nlinks],
            link_max: vec![0; nlinks],
            loads: vec![],
        }
    }

    /// Adds another share's steps and per-link figures to these.
    fn absorb(&mut self, other: Partial) {
        self.steps.extend(other.steps);
        self.loads.extend(other.loads);
        for l in 0..self.link_conf.len() {
            self.link_conf[l] += other.link_conf[l];
            self.link_weighted[l] += other.link_weighted[l];
            self.link_overload[l] += other.link_overload[l];
            self.link_steps[l] += other.link_steps[l];
            self.link_max[l] = self.link_max[l].max(other.link_max[l]);
        }
    }
}

/// Traces all flows of `steps` for the rank order `order` (host node ids).
pub fn analyze(
    topo: &Topology,
    lfts: &Lfts,
    order: &[usize],
    steps: &[usize],
    top: usize,
) -> Result<Analysis> {
    analyze_with_loads(topo, lfts, order, steps, top, 0)
}

/// The directed links of `topo` times `steps`: the cells of a full
/// per-link load matrix.
pub fn load_cells(topo: &Topology, steps: usize) -> usize {
    topo.port_offsets().1.saturating_mul(steps)
}

/// Like [`analyze`], and keeps every link's load per step in
/// `link_loads` when the fabric's directed links times the steps are at
/// most `max_cells` (0: never).
pub fn analyze_with_loads(
    topo: &Topology,
    lfts: &Lfts,
    order: &[usize],
    steps: &[usize],
    top: usize,
    max_cells: usize,
) -> Result<Analysis> {
    let (offsets, nlinks) = topo.port_offsets();
    let keep_loads = max_cells > 0 && nlinks.saturating_mul(steps.len()) <= max_cells;
    let tracer = StepTracer::new(topo, lfts, order, &offsets, nlinks, keep_loads)?;
    let mut sum = Partial::new(nlinks);
    for part in tracer.trace_in_threads(steps) {
        sum.absorb(part?);
    }
    let mut per_step = std::mem::take(&mut sum.steps);
    per_step.sort_by_key(|s| s.step);
    let total = totals(&per_step);
    let worst_links = worst_link_ids(&sum, top)
        .into_iter()
        .map(|l| link_report(topo, &offsets, &sum, l))
        .collect();
    let link_loads =
        keep_loads.then(|| link_loads(topo, &offsets, nlinks, std::mem::take(&mut sum.loads)));
    let overloaded = (0..nlinks)
        .filter(|&l| sum.link_overload[l] > 0.0)
        .map(|l| (l as u32, sum.link_overload[l]))
        .collect();
    Ok(Analysis {
        hosts: order.len(),
        total,
        per_step,
        worst_links,
        link_loads,
        overloaded,
    })
}

/// Where each rank's flows enter the fabric, precomputed so that the inner
/// loop is table lookups only.
struct HostEntries {
    /// Per rank: the directed link out of its host.
    first_link: Vec<u32>,
    /// Per rank: the node at the far end of that link (its switch).
    first_node: Vec<usize>,
    /// Per rank: its host's LID.
    lids: Vec<u16>,
}

impl HostEntries {
    fn new(topo: &Topology, order: &[usize], offsets: &[u32]) -> Result<HostEntries> {
        let n = order.len();
        let mut first_link = vec![0u32; n];
        let mut first_node = vec![0usize; n];
        for (i, &h) in order.iter().enumerate() {
            let node = &topo.nodes[h];
            let p = node.first_port().ok_or_else(|| {
                crate::FabricError::Route(format!("host '{}' is not cabled", node.name))
            })?;
            first_link[i] = offsets[h] + p as u32;
            first_node[i] = node.ports[p as usize].expect("cabled").node;
        }
        let lids = order.iter().map(|&h| topo.nodes[h].lid).collect();
        Ok(HostEntries {
            first_link,
            first_node,
            lids,
        })
    }
}

/// What flows ask and links offer, in Gb/s. Unknown rates count at the
/// hosts' most common rate, or 1 when none is known: only ratios count.
struct Rates {
    /// Per rank: its host link's rate.
    host: Vec<f64>,
    /// Per directed link.
    link: Vec<f64>,
    /// Every host at one rate: every flow asks the same, so the weighted
    /// count follows from the flow counts; otherwise each link sums what
    /// its flows ask.
    uniform: bool,
    /// The hosts' most common rate (what a flow needs to run at full
    /// speed, for [`StepStats::slowest_link`]).
    nominal: f64,
}

impl Rates {
    /// `order`'s hosts are cabled ([`HostEntries::new`] checked).
    fn new(topo: &Topology, order: &[usize], offsets: &[u32], nlinks: usize) -> Rates {
        let host_gbps: Vec<Option<f64>> = order
            .iter()
            .map(|&h| {
                let p = topo.nodes[h].first_port().expect("checked above");
                topo.link_gbps(h, p)
            })
            .collect();
        let base = most_common_rate(host_gbps.iter().flatten().copied().collect());
        let host: Vec<f64> = host_gbps.iter().map(|g| g.unwrap_or(base)).collect();
        let mut link = vec![base; nlinks];
        for (i, node) in topo.nodes.iter().enumerate() {
            for p in 0..node.ports.len() {
                if let Some(g) = topo.link_gbps(i, p as u8) {
                    link[offsets[i] as usize + p] = g;
                }
            }
        }
        let uniform = host.iter().all(|&g| g == host[0]);
        Rates {
            host,
            link,
            uniform,
            nominal: base,
        }
    }
}

/// The most common of the `known` rates (of equally common ones the
/// slowest), or 1 when none is known.
fn most_common_rate(mut known: Vec<f64>) -> f64 {
    known.sort_by(f64::total_cmp);
    let mut best = (0usize, 1.0);
    let mut k = 0;
    while k < known.len() {
        let run = known[k..].iter().take_while(|&&g| g == known[k]).count();
        if run > best.0 {
            best = (run, known[k]);
        }
        k += run;
    }
    best.1
}

/// The LFTs and the cabling as flat tables for the inner loop: the LFTs one
/// switch after another (consecutive flows of a step have consecutive
/// destinations, so they reuse cache lines of each switch's table) and the
/// far end of every directed link.
struct FlatRoutes {
    /// Per node: its index among the switches (`u32::MAX`: a host).
    switch_index: Vec<u32>,
    /// Entries per switch in `lft`: the largest analysed LID + 1.
    lids_per_switch: usize,
    /// The output port of each switch for each LID.
    lft: Vec<u8>,
    /// Per directed link: the node at its far end (`u32::MAX`: uncabled).
    far_node: Vec<u32>,
    /// Per node: the end of its range of directed link ids.
    links_end: Vec<u32>,
}

impl FlatRoutes {
    fn new(topo: &Topology, lfts: &Lfts, lids: &[u16], offsets: &[u32], nlinks: usize) -> Self {
        let switches = topo.switches();
        let mut switch_index = vec![u32::MAX; topo.nodes.len()];
        for (i, &s) in switches.iter().enumerate() {
            switch_index[s] = i as u32;
        }
        let lids_per_switch = lids.iter().copied().max().unwrap_or(0) as usize + 1;
        let mut lft = vec![NO_PATH; lids_per_switch * switches.len()];
        for (i, &s) in switches.iter().enumerate() {
            let table = lfts.tables[s].iter().take(lids_per_switch);
            for (lid, &p) in table.enumerate() {
                lft[i * lids_per_switch + lid] = p;
            }
        }
        let mut far_node = vec![u32::MAX; nlinks];
        let mut links_end = vec![0u32; topo.nodes.len()];
        for (i, node) in topo.nodes.iter().enumerate() {
            links_end[i] = offsets[i] + node.ports.len() as u32;
            for (p, r) in node.ports.iter().enumerate() {
                if let Some(r) = r {
                    far_node[offsets[i] as usize + p] = r.node as u32;
                }
            }
        }
        FlatRoutes {
            switch_index,
            lids_per_switch,
            lft,
            far_node,
            links_end,
        }
    }
}

/// The flows on each directed link in the step being traced. `touched`
/// lists the links used, so clearing costs what the step used, not the
/// fabric's size.
struct StepLoad {
    counts: Vec<u32>,
    /// What the flows on each link ask (empty when all hosts ask the same).
    demand: Vec<f64>,
    touched: Vec<u32>,
}

/// Traces the flows of shift steps through [`FlatRoutes`] and scores each
/// step from the load of its links.
struct StepTracer<'a> {
    topo: &'a Topology,
    lfts: &'a Lfts,
    order: &'a [usize],
    offsets: &'a [u32],
    hosts: HostEntries,
    rates: Rates,
    routes: FlatRoutes,
    keep_loads: bool,
}

impl<'a> StepTracer<'a> {
    fn new(
        topo: &'a Topology,
        lfts: &'a Lfts,
        order: &'a [usize],
        offsets: &'a [u32],
        nlinks: usize,
        keep_loads: bool,
    ) -> Result<Self> {
        let hosts = HostEntries::new(topo, order, offsets)?;
        let rates = Rates::new(topo, order, offsets, nlinks);
        let routes = FlatRoutes::new(topo, lfts, &hosts.lids, offsets, nlinks);
        Ok(StepTracer {
            topo,
            lfts,
            order,
            offsets,
            hosts,
            rates,
            routes,
            keep_loads,
        })
    }

    fn nlinks(&self) -> usize {
        self.rates.link.len()
    }

    /// Traces `steps` dealt round-robin to up to 8 threads: one share's
    /// figures per thread, in thread order.
    fn trace_in_threads(&self, steps: &[usize]) -> Vec<Result<Partial>> {
        let threads = std::thread::available_parallelism()
            .map(|x| x.get())
            .unwrap_or(1)
            .clamp(1, 8)
            .min(steps.len().max(1));
        let shares: Vec<Vec<usize>> = (0..threads)
            .map(|t| steps.iter().copied().skip(t).step_by(threads).collect())
            .collect();
        if threads <= 1 {
            return shares.iter().map(|s| self.trace_share(s)).collect();
        }
        std::thread::scope(|sc| {
            let hs: Vec<_> = shares
                .iter()
                .map(|s| sc.spawn(|| self.trace_share(s)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("analysis thread panicked"))
                .collect()
        })
    }

    /// Traces and scores every step of `mine`.
    fn trace_share(&self, mine: &[usize]) -> Result<Partial> {
        let nlinks = self.nlinks();
        let mut load = StepLoad {
            counts: vec![0u32; nlinks],
            demand: vec![0f64; if self.rates.uniform { 0 } else { nlinks }],
            touched: Vec::with_capacity(self.order.len() * 6),
        };
        let mut part = Partial::new(nlinks);
        for &s in mine {
            load.touched.clear();
            self.trace_step(s, &mut load)?;
            self.score_step(s, &mut load, &mut part);
        }
        Ok(part)
    }

    /// Adds every flow of step `s` to the load of the links it crosses.
    fn trace_step(&self, s: usize, load: &mut StepLoad) -> Result<()> {
        let (hosts, rates, routes) = (&self.hosts, &self.rates, &self.routes);
        let n = self.order.len();
        let limit = self.topo.nodes.len();
        for i in 0..n {
            let j = (i + s) % n;
            let dst = self.order[j];
            let dl = hosts.lids[j] as usize;
            let mut link = hosts.first_link[i];
            let mut cur = hosts.first_node[i];
            let mut hops = 0;
            let asks = if rates.uniform {
                0.0
            } else {
                rates.host[i].min(rates.host[j])
            };
            loop {
                let c = &mut load.counts[link as usize];
                if *c == 0 {
                    load.touched.push(link);
                }
                *c += 1;
                if !rates.uniform {
                    load.demand[link as usize] += asks;
                }
                if cur == dst {
                    break;
                }
                let swi = routes.switch_index[cur];
                let port = if swi == u32::MAX {
                    NO_PATH
                } else {
                    routes.lft[swi as usize * routes.lids_per_switch + dl]
                };
                let l = self.offsets[cur] + port as u32;
                hops += 1;
                let nx =
                    if port == 0 || port == NO_PATH || l >= routes.links_end[cur] || hops > limit {
                        u32::MAX
                    } else {
                        routes.far_node[l as usize]
                    };
                if nx == u32::MAX {
                    return Err(self.undelivered(self.order[i], dst));
                }
                link = l;
                cur = nx as usize;
            }
        }
        Ok(())
    }

    /// The error for a flow from host `src` to host `dst` the tables do not
    /// deliver: the slow path, [`trace`], explains what is wrong.
    fn undelivered(&self, src: usize, dst: usize) -> crate::FabricError {
        let mut hops = vec![];
        if let Err(e) = trace(self.topo, self.lfts, self.offsets, src, dst, &mut hops) {
            return e;
        }
        crate::FabricError::Route(format!(
            "flow {} -> {} is not delivered (routing loop?)",
            self.topo.nodes[src].name, self.topo.nodes[dst].name
        ))
    }

    /// Scores step `s` from the load of its links into `part`, and clears
    /// the load for the next step.
    fn score_step(&self, s: usize, load: &mut StepLoad, part: &mut Partial) {
        let uniform = self.rates.uniform;
        let mut st = StepStats {
            step: s,
            flows: self.order.len() as u64,
            conflicts: 0,
            weighted_conflicts: 0.0,
            max_link_load: 0,
            shared_links: 0,
            flows_on_shared_links: 0,
            slowest_link: 0.0,
        };
        if self.keep_loads {
            let used = load
                .touched
                .iter()
                .map(|&l| (l, load.counts[l as usize]))
                .collect();
            part.loads.push((s, used));
        }
        for &l in &load.touched {
            let c = load.counts[l as usize];
            load.counts[l as usize] = 0;
            let asked = if uniform {
                f64::from(c) * self.rates.host[0]
            } else {
                std::mem::take(&mut load.demand[l as usize])
            };
            let link_rate = self.rates.link[l as usize];
            let needs = f64::from(c) * self.rates.nominal / link_rate;
            st.slowest_link = st.slowest_link.max(needs);
            if needs > 1.0 + 1e-9 {
                part.link_overload[l as usize] += needs - 1.0;
            }
            // A hair of slack: sums of rates are not exact.
            let over = (asked / link_rate - 1.0).max(0.0);
            if over > 1e-9 {
                st.weighted_conflicts += over;
                part.link_weighted[l as usize] += over;
            }
            st.max_link_load = st.max_link_load.max(c);
            if c > 1 {
                st.conflicts += (c - 1) as u64;
                st.shared_links += 1;
                st.flows_on_shared_links += c as u64;
                part.link_conf[l as usize] += (c - 1) as u64;
                part.link_steps[l as usize] += 1;
            }
            part.link_max[l as usize] = part.link_max[l as usize].max(c);
        }
        part.steps.push(st);
    }
}

/// The totals over `per_step`.
fn totals(per_step: &[StepStats]) -> Totals {
    let mut total = Totals {
        steps: per_step.len(),
        ..Default::default()
    };
    for s in per_step {
        total.flows += s.flows;
        total.conflicts += s.conflicts;
        total.weighted_conflicts += s.weighted_conflicts;
        total.steps_with_conflicts += (s.conflicts > 0) as usize;
        total.max_link_load = total.max_link_load.max(s.max_link_load);
        total.flows_on_shared_links += s.flows_on_shared_links;
    }
    total
}

/// The `top` links with conflicts, worst first by weighted conflicts (a
/// conflict on a faster link weighs less), then by count.
fn worst_link_ids(sum: &Partial, top: usize) -> Vec<usize> {
    let (conf, weighted) = (&sum.link_conf, &sum.link_weighted);
    let mut worst: Vec<usize> = (0..conf.len())
        .filter(|&l| conf[l] > 0 || weighted[l] > 0.0)
        .collect();
    worst.sort_by(|&a, &b| {
        weighted[b]
            .total_cmp(&weighted[a])
            .then(conf[b].cmp(&conf[a]))
            .then(a.cmp(&b))
    });
    worst.truncate(top);
    worst
}

/// The far end of `node`'s `port`: node name and port ("" and 0 when uncabled).
fn far_end(topo: &Topology, node: usize, port: u8) -> (String, u8) {
    let r = topo.nodes[node].ports[port as usize];
    let to = r
        .map(|r| topo.nodes[r.node].name.clone())
        .unwrap_or_default();
    (to, r.map(|r| r.port).unwrap_or(0))
}

/// Directed link `l` and its figures summed over the steps.
fn link_report(topo: &Topology, offsets: &[u32], sum: &Partial, l: usize) -> LinkReport {
    let (node, port) = link_of(offsets, l as u32);
    let (to, to_port) = far_end(topo, node, port);
    LinkReport {
        node: topo.nodes[node].name.clone(),
        port,
        to,
        to_port,
        conflicts: sum.link_conf[l],
        weighted_conflicts: sum.link_weighted[l],
        steps_shared: sum.link_steps[l],
        max_load: sum.link_max[l],
        rate: topo.link_rate(node, port).map(|r| r.to_string()),
        gbps: topo.link_gbps(node, port),
    }
}

/// The links x steps matrix from each step's used links, steps in order,
/// links by id; links no step uses are only counted.
fn link_loads(
    topo: &Topology,
    offsets: &[u32],
    nlinks: usize,
    mut step_loads: Vec<(usize, Vec<(u32, u32)>)>,
) -> LinkLoads {
    step_loads.sort_by_key(|s| s.0);
    let columns = step_loads.len();
    let mut dense: Vec<Option<Vec<u32>>> = vec![None; nlinks];
    for (column, (_, used)) in step_loads.iter().enumerate() {
        for &(l, c) in used {
            dense[l as usize].get_or_insert_with(|| vec![0; columns])[column] = c;
        }
    }
    let links: Vec<LinkLoad> = dense
        .into_iter()
        .enumerate()
        .filter_map(|(l, loads)| {
            let loads = loads?;
            let (node, port) = link_of(offsets, l as u32);
            let name = &topo.nodes[node].name;
            let (to, to_port) = far_end(topo, node, port);
            Some(LinkLoad {
                id: l as u32,
                name: format!("{name}:{port}->{to}:{to_port}"),
                node: name.clone(),
                port,
                to,
                to_port,
                loads,
            })
        })
        .collect();
    let cabled = topo
        .nodes
        .iter()
        .map(|n| n.ports.iter().filter(|p| p.is_some()).count())
        .sum::<usize>();
    LinkLoads {
        steps: step_loads.iter().map(|s| s.0).collect(),
        idle_links: cabled.saturating_sub(links.len()),
        links,
    }
}

impl Analysis {
    /// Per-step CSV.
    pub fn csv(&self) -> String {
        let mut s =
            String::from("step,flows,conflicts,max_link_load,shared_links,flows_on_shared_links\n");
        for st in &self.per_step {
            s.push_str(&format!(
                "{},{},{},{},{},{}\n",
                st.step,
                st.flows,
                st.conflicts,
                st.max_link_load,
                st.shared_links,
                st.flows_on_shared_links
            ));
        }
        s
    }

    /// Human-readable summary.
    pub fn summary(&self) -> String {
        let t = &self.total;
        let mut s = format!(
            "hosts {}, steps {}, flows {}\nconflicts {} (flows beyond the first on a directed link, summed over steps)\nsteps with conflicts {} of {}\nflows on shared links {}\nmax link load {}\n",
            self.hosts, t.steps, t.flows, t.conflicts, t.steps_with_conflicts, t.steps, t.flows_on_shared_links, t.max_link_load
        );
        if (t.weighted_conflicts - t.conflicts as f64).abs() > 1e-6 {
            s.push_str(&format!(
                "weighted by link rate: {:.1} conflicts (flows asking more than a link's rate, in links' worth)\n",
                t.weighted_conflicts
            ));
        }
        if !self.worst_links.is_empty() {
            s.push_str("worst links (conflicts summed over steps):\n");
            for l in &self.worst_links {
                let rate = l
                    .rate
                    .as_ref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default();
                let weighted = if (l.weighted_conflicts - l.conflicts as f64).abs() > 1e-6 {
                    format!(" ({:.1} weighted by rate)", l.weighted_conflicts)
                } else {
                    String::new()
                };
                s.push_str(&format!(
                    "  {} port {} -> {} port {}{rate}: {} conflicts{weighted} in {} steps, max load {}\n",
                    l.node, l.port, l.to, l.to_port, l.conflicts, l.steps_shared, l.max_load
                ));
            }
        }
        s
    }
}

/// Pretty JSON of an analysis, except that each link's `loads` array stays on one line
/// (pretty-printed, a links x steps matrix would be one line per number).
pub fn pretty_with_compact_loads(mut v: serde_json::Value) -> Result<String> {
    let mut compact = Vec::new();
    if let Some(links) = v
        .pointer_mut("/link_loads/links")
        .and_then(serde_json::Value::as_array_mut)
    {
        for (i, link) in links.iter_mut().enumerate() {
            if let Some(loads) = link.get_mut("loads") {
                compact.push(loads.to_string());
                *loads = serde_json::Value::String(format!("@@loads{i}@@"));
            }
        }
    }
    let text = serde_json::to_string_pretty(&v).expect("a JSON value serialises");
    // The markers come out in order, as strings (a name holding one would
    // have its quotes escaped, so it cannot match).
    let mut out =
        String::with_capacity(text.len() + compact.iter().map(String::len).sum::<usize>());
    let mut rest = text.as_str();
    for (i, c) in compact.iter().enumerate() {
        let marker = format!("\"@@loads{i}@@\"");
        let at = rest.find(&marker).ok_or_else(|| {
            crate::FabricError::Invalid("link loads lost while writing the JSON".into())
        })?;
        out.push_str(&rest[..at]);
        out.push_str(c);
        rest = &rest[at + marker.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimize::order_by_name;
    use crate::routing::{route, Engine};
    use crate::topo::FatTreeSpec;

    /// Two leaves of two hosts under one spine (worked out by hand in
    /// tests/analysis.rs): in step 2 both hosts of a leaf send across, so
    /// each leaf up-link and each spine down-link carries 2 flows; in steps
    /// 1 and 3 one flow each way crosses. Host links carry 1 flow a step.
    #[test]
    fn link_loads_per_step_by_hand() {
        let t = FatTreeSpec::parse("fat-tree:radix=4,hosts=4,down=2,up=1")
            .unwrap()
            .build()
            .unwrap();
        let lfts = route(&t, &Engine::Minhop).unwrap();
        let order = order_by_name(&t);
        let steps = shift_steps(4);
        let a = analyze_with_loads(&t, &lfts, &order, &steps, 10, 1 << 20).unwrap();
        let loads = a.link_loads.as_ref().expect("within the budget");
        assert_eq!(loads.steps, vec![1, 2, 3]);
        // 4 host up-links, 4 leaf down-links to hosts, 2 leaf up-links, 2
        // spine down-links; nothing idle.
        assert_eq!(loads.links.len(), 12);
        assert_eq!(loads.idle_links, 0);
        let shared: Vec<&LinkLoad> = loads.links.iter().filter(|l| l.loads[1] == 2).collect();
        assert_eq!(shared.len(), 4, "{loads:?}");
        for l in &shared {
            assert_eq!(l.loads, vec![1, 2, 1], "{}", l.name);
        }
        // The shared links are exactly the worst links, by name.
        let mut worst: Vec<String> = a
            .worst_links
            .iter()
            .map(|w| format!("{}:{}->{}:{}", w.node, w.port, w.to, w.to_port))
            .collect();
        let mut names: Vec<String> = shared.iter().map(|l| l.name.clone()).collect();
        worst.sort();
        names.sort();
        assert_eq!(worst, names);
        let unshared = loads.links.iter().filter(|l| l.loads == vec![1, 1, 1]);
        assert_eq!(unshared.count(), 8);
        // Every step's figures follow from its column.
        for (k, st) in a.per_step.iter().enumerate() {
            let column: Vec<u32> = loads.links.iter().map(|l| l.loads[k]).collect();
            assert_eq!(st.max_link_load, *column.iter().max().unwrap());
            let conflicts: u64 = column.iter().map(|&c| u64::from(c.saturating_sub(1))).sum();
            assert_eq!(st.conflicts, conflicts);
        }
        // Over the budget, or not asked for: no matrix.
        let cells = load_cells(&t, steps.len());
        assert!(analyze_with_loads(&t, &lfts, &order, &steps, 10, cells - 1)
            .unwrap()
            .link_loads
            .is_none());
        assert!(analyze(&t, &lfts, &order, &steps, 10)
            .unwrap()
            .link_loads
            .is_none());
    }
}
