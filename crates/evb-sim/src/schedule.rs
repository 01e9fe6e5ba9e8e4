//! The slotted barrel on the fabric it runs on: its slots sized for the
//! fabric's links, and its schedule computed from the fabric's routes.
//!
//! `evb sim` knows the topology, the forwarding tables and the rank order,
//! so unless the configuration names a schedule file it does what a user
//! would otherwise do by hand with `evb fabric schedule`: the conflict-aware
//! schedule of the builder's nodes on those routes
//! ([`evb_fabric::schedule::choose`]). Where that is the plain barrel (a
//! tree whose leaves are full, ranks in ftree order) nothing changes. And
//! the slots are sized for the slowest path between two of the builder's
//! nodes (the links' rates from the topology), not for `sim.link_gbps`: a
//! QDR fabric gets QDR slots.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use evb_core::config::{LocalTraffic, Schedule, SimTraffic};
use evb_core::slots::SlotTable;
use evb_core::{Config, Layout};
use serde::{Deserialize, Serialize};

use crate::fabric::SimFabric;

/// What a fabric was built from, for a schedule computed from it.
#[derive(Debug)]
pub struct Routed {
    pub topo: evb_fabric::Topology,
    pub lfts: evb_fabric::Lfts,
    /// Topology node of each host of the simulated fabric (its ranks).
    pub order: Vec<usize>,
    /// The rank order as the command line named it (`ftree`, a hostfile...).
    pub order_spec: String,
    /// Schedules computed already, by (nodes, local fragments through the
    /// NIC): a scan runs many points on one fabric.
    cache: Mutex<Vec<CachedSchedule>>,
}

/// A schedule computed for (nodes, local fragments through the NIC).
type CachedSchedule = ((u16, bool), Arc<SlotTable>, ScheduleSummary);

impl Routed {
    pub fn new(
        topo: evb_fabric::Topology,
        lfts: evb_fabric::Lfts,
        order: Vec<usize>,
        order_spec: &str,
    ) -> Routed {
        Routed {
            topo,
            lfts,
            order,
            order_spec: order_spec.to_string(),
            cache: Mutex::new(Vec::new()),
        }
    }
}

/// The schedule a slotted run used, for the summary.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScheduleSummary {
    /// `fabric` (computed from the fabric's routes), `file`
    /// (`event_builder.schedule_file`) or `barrel` (the plain barrel: the
    /// fabric's schedule is the barrel, or no routes are known).
    pub source: String,
    /// What the fabric's schedule started from, and what it did.
    pub what: String,
    /// Slots a rotation, and the fewest any schedule of these flows on
    /// these routes can have (the busiest link's flows).
    pub slots: usize,
    pub lower_bound: usize,
    /// The slot's length and the link rate it is sized for.
    pub slot_us: f64,
    pub slot_gbps: f64,
    /// Wall time the schedule took to compute, seconds.
    pub seconds: f64,
}

/// Sizes the slots for the fabric and, unless the configuration names a
/// schedule file, installs the fabric's schedule: what an `eb` run with
/// the slotted barrel needs before it starts. Returns what was used.
pub fn prepare(config: &mut Config, fabric: &SimFabric) -> Result<Option<ScheduleSummary>, String> {
    if config.sim.traffic != SimTraffic::Eb || config.event_builder.schedule != Schedule::Slotted {
        return Ok(None);
    }
    let layout = Layout::from_config(config);
    let nodes = usize::from(layout.nodes);
    if config.slot_gbps.is_none() {
        config.slot_gbps = slowest_path_gbps(fabric, nodes, config.sim.link_gbps);
    }
    if config.node_gbps.is_none() && config.slot_gbps.is_some() {
        config.node_gbps = Some(most_common_host_gbps(fabric, nodes, config.sim.link_gbps));
    }
    let started = Instant::now();
    let mut summary = ScheduleSummary {
        source: "barrel".into(),
        what: "the barrel in node order".into(),
        slots: 0,
        lower_bound: 0,
        slot_us: config.slot_ns() as f64 / 1e3,
        slot_gbps: config.slot_link_gbps(),
        seconds: 0.0,
    };
    if let Some(table) = &config.slot_table {
        summary.source = "file".into();
        summary.what = config.event_builder.schedule_file.clone();
        summary.slots = table.slots.len();
    } else if config.event_builder.slot_schedule == evb_core::config::SlotSchedule::Barrel {
        summary.what = "the barrel in node order (slot_schedule = \"barrel\")".into();
    } else if let Some(routed) = fabric_routes(fabric, nodes) {
        let local = config.event_builder.local == LocalTraffic::Nic;
        if let Some((table, s)) = fabric_schedule(routed, config, &layout, local)? {
            if s.slot_gbps > 0.0 {
                config.slot_gbps = Some(s.slot_gbps);
            }
            config.slot_table = Some(table);
            summary = ScheduleSummary {
                seconds: started.elapsed().as_secs_f64(),
                ..s
            };
        } else {
            summary.what = "the barrel in rank order (conflict-free on these routes)".into();
        }
    }
    if summary.slots == 0 {
        summary.slots =
            layout.bus() - usize::from(config.event_builder.local == LocalTraffic::Memory);
        summary.lower_bound = summary.slots;
    }
    summary.slot_us = config.slot_ns() as f64 / 1e3;
    summary.slot_gbps = config.slot_link_gbps();
    Ok(Some(summary))
}

/// The routes the fabric was built from, if it was built from a
/// topology and its nodes are its first hosts.
fn fabric_routes(fabric: &SimFabric, nodes: usize) -> Option<&Routed> {
    fabric
        .routed
        .as_deref()
        .filter(|r| r.order.len() >= nodes && nodes >= 2)
}

/// The fabric's schedule for the builder's `layout.nodes` first ranks,
/// from the cache or computed; `None` when it is the plain barrel.
fn fabric_schedule(
    routed: &Routed,
    config: &Config,
    layout: &Layout,
    local: bool,
) -> Result<Option<(Arc<SlotTable>, ScheduleSummary)>, String> {
    let key = (layout.nodes, local);
    let cached = routed
        .cache
        .lock()
        .expect("not poisoned")
        .iter()
        .find(|c| c.0 == key)
        .cloned();
    if let Some((_, table, summary)) = cached {
        return Ok(Some((table, summary)));
    }
    let order = &routed.order[..usize::from(layout.nodes)];
    let rated = evb_fabric::rated::choose_slot_rate(
        &routed.topo,
        &routed.lfts,
        order,
        &routed.order_spec,
        local,
        false,
    )
    .map_err(|e| format!("the fabric's slot schedule: {e}"))?;
    let (chosen, slot_gbps) = (rated.chosen, rated.slot_gbps);
    let s = chosen.aware;
    if s.slots == evb_fabric::schedule::SlotSchedule::plain(order.len(), local).slots {
        return Ok(None);
    }
    let table = SlotTable {
        nodes: layout.nodes,
        slots: s
            .slots
            .iter()
            .map(|row| row.iter().map(|d| d.map(|d| d as u16)).collect())
            .collect(),
        spans: s.spans.clone(),
    };
    if let Err(e) = table.check(layout, config.event_builder.local) {
        return Err(format!(
            "the fabric's slot schedule does not fit the builder: {e}"
        ));
    }
    let moved = if s.flows_moved > 0 {
        format!(", {} flows moved out of their step", s.flows_moved)
    } else {
        String::new()
    };
    let summary = ScheduleSummary {
        source: "fabric".into(),
        what: format!("{}{moved}", chosen.shift),
        slots: s.slots.len(),
        lower_bound: s.lower_bound,
        slot_us: 0.0,
        // The rate the schedule's slots are for (faster than the slowest
        // path where a rate-aware schedule won): the caller sizes them.
        slot_gbps: slot_gbps.unwrap_or(0.0),
        seconds: 0.0,
    };
    let table = Arc::new(table);
    routed
        .cache
        .lock()
        .expect("not poisoned")
        .push((key, table.clone(), summary.clone()));
    Ok(Some((table, summary)))
}

/// The slowest path's rate between any two of the first `nodes` hosts:
/// the least rate of a link on it. `None` when every link has the default
/// rate (`sim.link_gbps`, which the slots use anyway).
pub fn slowest_path_gbps(fabric: &SimFabric, nodes: usize, default: f64) -> Option<f64> {
    let known = fabric.host_gbps.iter().any(|&g| g > 0.0)
        || fabric.port_gbps.iter().flatten().any(|&g| g > 0.0);
    if !known {
        return None;
    }
    let nodes = nodes.min(fabric.hosts());
    let mut slowest = f64::INFINITY;
    for src in 0..nodes {
        let mut path_min = fabric.host_link_gbps(src, default);
        for dst in (0..nodes).filter(|&d| d != src) {
            let rate = fabric.path_gbps(src, dst, default)?;
            path_min = path_min.min(rate);
        }
        slowest = slowest.min(path_min);
    }
    slowest.is_finite().then_some(slowest)
}

/// The link rate most of the first `nodes` hosts have.
fn most_common_host_gbps(fabric: &SimFabric, nodes: usize, default: f64) -> f64 {
    let mut rates: Vec<u64> = (0..nodes.min(fabric.hosts()))
        .map(|h| (fabric.host_link_gbps(h, default) * 1000.0).round() as u64)
        .collect();
    rates.sort_unstable();
    let mut best = (0usize, default);
    let mut i = 0;
    while i < rates.len() {
        let j = rates[i..].iter().take_while(|&&r| r == rates[i]).count();
        if j > best.0 {
            best = (j, rates[i] as f64 / 1000.0);
        }
        i += j;
    }
    best.1
}
