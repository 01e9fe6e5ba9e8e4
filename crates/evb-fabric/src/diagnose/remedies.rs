//! Remedies and what each would change.
//!
//! Each remedy is a fabric (a [`Variant`]: the topology, its tables, the
//! rank order and, for a schedule, its slots) to compare with the fabric
//! as it is:
//!
//! - a cable fixed (`swap-cables`, `reconnect-cable`, `replace-cable`):
//!   the finding's repair applied and the fabric routed again as OpenSM
//!   would (a rate change keeps the tables);
//! - `hostfile`: the rank order with fewest conflicts on the tables as
//!   they are (the ftree engine's CA order, or a searched one);
//! - `routes`: tables computed for the shift, to hand back to OpenSM
//!   (`opensm -R file -U`);
//! - `schedule`: the conflict-aware slot schedule
//!   (`event_builder.schedule_file`), over the ftree positions where a
//!   leaf is short;
//! - `check-cable`: a cable with errors, whose effect the model cannot
//!   say.
//!
//! The **estimate** is the rate of a synchronised shift on the variant:
//! every step lasts as long as its busiest link needs
//! ([`crate::conflicts::StepStats::slowest_link`]), so a step with two
//! flows on a link, or one over a link at half rate, takes twice as long;
//! the rate per node is the hosts' rate x steps / the steps' summed
//! lengths. `evb fabric diagnose` replaces it with the rate `evb sim`
//! predicts when it can.

use super::explain::SharedLink;
use super::findings::{port_name, Finding, Repair};
use crate::conflicts::analyze;
use crate::error::Result;
use crate::lft::{trace, Lfts};
use crate::schedule::{choose, SlotSchedule};
use crate::setup::route_like_opensm;
use crate::topo::Topology;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// A fabric to compare: topology, tables, rank order (host node ids of
/// `topo`), and a slot schedule when the remedy is one.
#[derive(Debug, Clone)]
pub struct Variant {
    pub topo: Topology,
    pub lfts: Lfts,
    pub order: Vec<usize>,
    pub schedule: Option<SlotSchedule>,
    /// How the tables were made.
    pub routing: String,
}

/// What a variant does to the shift.
#[derive(Debug, Clone, Serialize)]
pub struct Effect {
    /// Conflicts of the shift (of the schedule's slots), and weighted by
    /// link rates.
    pub conflicts: u64,
    pub weighted_conflicts: f64,
    /// The synchronised-shift estimate, Gb/s per node (module doc).
    pub estimated_gbps_per_node: f64,
    /// Per overloaded directed link (by `NAME:PORT` of its sending end):
    /// its overload ([`super::explain::SharedLink::overload`]).
    #[serde(skip)]
    pub per_link: HashMap<String, f64>,
}

/// One remedy, ranked by its predicted rate.
#[derive(Debug, Clone, Serialize)]
pub struct Remedy {
    /// `swap-cables`, `reconnect-cable`, `replace-cable`, `check-cable`,
    /// `hostfile`, `routes`, `schedule`.
    pub kind: &'static str,
    /// The ports it concerns, `NAME:PORT`: the cable's ends, or those of
    /// the findings it works around.
    pub ports: Vec<String>,
    pub what: String,
    /// Findings it addresses (indices into `findings`).
    pub addresses: Vec<usize>,
    pub conflicts: u64,
    pub estimated_gbps_per_node: f64,
    /// Filled by the caller: what `evb sim` predicts after it.
    pub predicted_gbps_per_node: Option<f64>,
    /// `evb sim` or `shift estimate`: where the rank comes from.
    pub prediction: String,
    /// Shared links (`NAME:PORT->NAME:PORT`) it relieves, most blamed
    /// first, and the measured waiting on them.
    pub relieves: Vec<String>,
    pub relieves_wait: f64,
    /// Files the caller wrote for it (hostfile, tables, schedule).
    pub files: Vec<String>,
    /// How to apply it.
    pub apply: String,
    #[serde(skip)]
    pub variant: Option<Variant>,
}

impl Remedy {
    pub(super) fn new(kind: &'static str, what: String, variant: Option<Variant>) -> Remedy {
        Remedy {
            kind,
            ports: Vec::new(),
            what,
            addresses: Vec::new(),
            conflicts: 0,
            estimated_gbps_per_node: 0.0,
            predicted_gbps_per_node: None,
            prediction: "shift estimate".into(),
            relieves: Vec::new(),
            relieves_wait: 0.0,
            files: Vec::new(),
            apply: String::new(),
            variant,
        }
    }

    /// A cable fix (preferred to a workaround that predicts about as much).
    pub fn is_repair(&self) -> bool {
        matches!(
            self.kind,
            "swap-cables" | "reconnect-cable" | "replace-cable" | "check-cable"
        )
    }

    /// What ranks it: the prediction, else the estimate.
    pub fn figure(&self) -> f64 {
        self.predicted_gbps_per_node
            .unwrap_or(self.estimated_gbps_per_node)
    }
}

/// The hosts' usual rate, Gb/s (100 when unknown).
pub fn nominal_gbps(topo: &Topology) -> f64 {
    let mut c: HashMap<u64, usize> = HashMap::new();
    for h in topo.hosts() {
        if let Some(g) = topo.nodes[h]
            .first_port()
            .and_then(|p| topo.link_gbps(h, p))
        {
            *c.entry((g * 1e3) as u64).or_default() += 1;
        }
    }
    c.into_iter()
        .max_by_key(|x| (x.1, x.0))
        .map_or(100.0, |x| x.0 as f64 / 1e3)
}

/// The effect of `v` on the shift (or on its schedule's slots).
pub fn effect(v: &Variant, nominal: f64) -> Result<Effect> {
    let n = v.order.len();
    if let Some(s) = &v.schedule {
        return slot_effect(v, s, nominal);
    }
    let steps: Vec<usize> = (1..n).collect();
    let a = analyze(&v.topo, &v.lfts, &v.order, &steps, usize::MAX)?;
    let time: f64 = a.per_step.iter().map(|s| s.slowest_link.max(1.0)).sum();
    let (offsets, _) = v.topo.port_offsets();
    let per_link = a
        .overloaded
        .iter()
        .map(|&(l, o)| (port_name(&v.topo, crate::lft::link_of(&offsets, l)), o))
        .collect();
    Ok(Effect {
        conflicts: a.total.conflicts,
        weighted_conflicts: a.total.weighted_conflicts,
        estimated_gbps_per_node: nominal * steps.len() as f64 / time.max(1.0),
        per_link,
    })
}

/// The effect of a slot schedule: each slot's flows traced, each slot as
/// long as its busiest link needs.
fn slot_effect(v: &Variant, s: &SlotSchedule, nominal: f64) -> Result<Effect> {
    let (offsets, nlinks) = v.topo.port_offsets();
    let rate = super::explain::link_rates(&v.topo, nominal);
    let mut load = vec![0u32; nlinks];
    let mut per_link: HashMap<String, f64> = HashMap::new();
    let (mut conflicts, mut time) = (0u64, 0.0);
    let mut path = Vec::new();
    for row in &s.slots {
        path.clear();
        for (i, d) in row.iter().enumerate() {
            if let Some(d) = *d {
                trace(
                    &v.topo, &v.lfts, &offsets, v.order[i], v.order[d], &mut path,
                )?;
            }
        }
        let mut slowest: f64 = 1.0;
        for &l in &path {
            load[l as usize] += 1;
        }
        for &l in &path {
            let c = std::mem::take(&mut load[l as usize]);
            if c == 0 {
                continue;
            }
            let needs = f64::from(c) * nominal / rate[l as usize];
            slowest = slowest.max(needs);
            conflicts += u64::from(c - 1);
            if needs > 1.0 + 1e-9 {
                let at = crate::lft::link_of(&offsets, l);
                *per_link.entry(port_name(&v.topo, at)).or_default() += needs - 1.0;
            }
        }
        time += slowest;
    }
    let n = v.order.len();
    Ok(Effect {
        conflicts,
        weighted_conflicts: conflicts as f64,
        estimated_gbps_per_node: nominal * n.saturating_sub(1) as f64 / time.max(1.0),
        per_link,
    })
}

/// What the remedy-builders need of the fabric as it is.
pub struct Current<'a> {
    pub topo: &'a Topology,
    pub lfts: &'a Lfts,
    pub order: &'a [usize],
    pub order_spec: &'a str,
    /// Engine OpenSM would route a repaired fabric with (default ftree).
    pub routing: Option<&'a str>,
    /// `event_builder.local = "nic"`: the schedule has a slot to self.
    pub local_nic: bool,
    /// Time the order and route searches may take.
    pub search: Duration,
    /// The hosts' usual rate ([`nominal_gbps`]).
    pub nominal: f64,
    /// The ftree engine's CA order, if it routes this fabric (computed
    /// once: routing a large fabric takes a while).
    pub ftree_order: Option<Vec<usize>>,
}

impl Current<'_> {
    fn variant(&self, lfts: Lfts, routing: &str) -> Variant {
        Variant {
            topo: self.topo.clone(),
            lfts,
            order: self.order.to_vec(),
            schedule: None,
            routing: routing.into(),
        }
    }
}

/// The repair of finding `f` as a remedy, if it has one.
pub fn repair(cur: &Current, f: &Finding, index: usize) -> Result<Option<Remedy>> {
    let Some(r) = &f.repair else {
        return Ok(None);
    };
    let mut topo = cur.topo.clone();
    let (kind, apply, reroute) = match r {
        Repair::Swap(a, b) => {
            let (na, nb) = (
                cur.topo.nodes[a.0].name.clone(),
                cur.topo.nodes[b.0].name.clone(),
            );
            topo.swap_cables(&na, a.1, &nb, b.1)?;
            (
                "swap-cables",
                format!(
                    "swap the cables at {} and {}",
                    port_name(cur.topo, *a),
                    port_name(cur.topo, *b)
                ),
                true,
            )
        }
        Repair::Connect(a, b, rate) => {
            topo.connect_rated(a.0, a.1, b.0, b.1, *rate)?;
            (
                "reconnect-cable",
                format!(
                    "cable {} to {} (or bring that link up)",
                    port_name(cur.topo, *a),
                    port_name(cur.topo, *b)
                ),
                true,
            )
        }
        Repair::Rate(a, rate) => {
            topo.set_link_rate(a.0, a.1, Some(*rate))?;
            (
                "replace-cable",
                format!(
                    "reseat or replace the cable at {} until it trains at {rate}",
                    port_name(cur.topo, *a)
                ),
                false,
            )
        }
    };
    let (lfts, routing) = if reroute {
        let r = route_like_opensm(&topo, cur.routing, false)?;
        (r.lfts, r.what)
    } else {
        (cur.lfts.clone(), "the same tables".into())
    };
    let mut rem = Remedy::new(kind, f.what.clone(), None);
    rem.variant = Some(Variant {
        topo,
        lfts,
        order: cur.order.to_vec(),
        schedule: None,
        routing,
    });
    rem.ports = f.ports.clone();
    rem.addresses = vec![index];
    rem.apply = apply;
    Ok(Some(rem))
}

/// The rank order with fewest conflicts on the tables as they are: the
/// best of the name, LID, leaf and ftree CA orders, then searched for
/// (`search` long; none without a search budget).
pub fn hostfile(cur: &Current) -> Result<Option<Remedy>> {
    use crate::optimize::{order_by_leaf, order_by_lid, order_by_name};
    let n = cur.order.len();
    let steps: Vec<usize> = (1..n).collect();
    let mut cands: Vec<(String, Vec<usize>)> = vec![
        ("name".into(), order_by_name(cur.topo)),
        ("lid".into(), order_by_lid(cur.topo)),
        ("leaf".into(), order_by_leaf(cur.topo)),
    ];
    if let Some(o) = &cur.ftree_order {
        cands.push(("ftree".into(), o.clone()));
    }
    cands.retain(|c| c.1.len() == n);
    let (order, what) = if cur.search.is_zero() {
        let mut best: Option<(u64, String, Vec<usize>)> = None;
        for (name, o) in cands {
            let c = analyze(cur.topo, cur.lfts, &o, &steps, 0)?.total.conflicts;
            if best.as_ref().is_none_or(|b| c < b.0) {
                best = Some((c, name, o));
            }
        }
        let Some((c, name, o)) = best else {
            return Ok(None);
        };
        (
            o,
            format!("the {name} order ({c} conflicts on these tables)"),
        )
    } else {
        let (o, rep) =
            crate::optimize::optimize_order_from(cur.topo, cur.lfts, &steps, cands, cur.search, 1)?;
        let what = format!(
            "a rank order searched from the {} order ({} conflicts on these tables, from {})",
            rep.start, rep.conflicts, rep.start_conflicts
        );
        (o, what)
    };
    if order == cur.order {
        return Ok(None);
    }
    let mut v = cur.variant(cur.lfts.clone(), "the same tables");
    v.order = order;
    let mut rem = Remedy::new("hostfile", format!("ranks in {what}"), Some(v));
    rem.apply =
        "start the ranks in the order of FILE (mpirun --hostfile, srun --distribution=arbitrary)"
            .into();
    Ok(Some(rem))
}

/// Tables computed for the shift of the current order.
pub fn routes(cur: &Current) -> Result<Option<Remedy>> {
    let n = cur.order.len();
    let steps: Vec<usize> = (1..n).collect();
    let (lfts, rep) = crate::optimize::route_for_shift(cur.topo, cur.order, &steps, cur.search)?;
    let mut rem = Remedy::new(
        "routes",
        format!(
            "forwarding tables for the shift of this order ({} conflicts; D-mod-K by rank: {})",
            rep.conflicts, rep.start_conflicts
        ),
        Some(cur.variant(lfts, "routes for the shift")),
    );
    rem.apply = "load the tables into OpenSM: opensm -R file -U FILE".into();
    Ok(Some(rem))
}

/// The conflict-aware slot schedule on the current tables: of the
/// current order, or of the ftree engine's order over its positions (the
/// shift its routes were balanced for, idle where a short leaf lacks a
/// host), whichever the estimate prefers.
pub fn schedule(cur: &Current) -> Result<Option<Remedy>> {
    let mut cands = vec![(cur.order.to_vec(), cur.order_spec.to_string())];
    if let Some(o) = &cur.ftree_order {
        // Also when it is the current order: the positions come with it.
        if o.len() == cur.order.len() && cur.order_spec != "ftree" {
            cands.push((o.clone(), "ftree".to_string()));
        }
    }
    // Fewest slots a rotation: the slots of either carry no conflict.
    let mut best: Option<(usize, Remedy)> = None;
    for (order, spec) in cands {
        let chosen = choose(cur.topo, cur.lfts, &order, &spec, cur.local_nic, false)?;
        let s = chosen.aware;
        let reorder = order != cur.order;
        let what = format!(
            "conflict-aware slot schedule{} from {}: {} slots a rotation for {} ranks, {} flows moved",
            if reorder { " in the ftree engine's rank order" } else { "" },
            chosen.shift,
            s.slots.len(),
            s.ranks,
            s.flows_moved
        );
        let slots = s.slots.len();
        let mut v = cur.variant(cur.lfts.clone(), "the same tables");
        v.order = order;
        v.schedule = Some(s);
        let mut rem = Remedy::new("schedule", what, Some(v));
        rem.apply = format!(
            "event_builder.schedule = \"slotted\", event_builder.schedule_file = FILE{}",
            if reorder {
                ", ranks in the order of HOSTFILE"
            } else {
                " (same rank order)"
            }
        );
        if best.as_ref().is_none_or(|b| slots < b.0) {
            best = Some((slots, rem));
        }
    }
    Ok(best.map(|b| b.1))
}

/// Which shared links a remedy relieves (fewer conflicts on them than as
/// the fabric is), most blamed first, and the waiting on them.
pub fn relieved(base: &Effect, after: &Effect, shared: &[SharedLink]) -> (Vec<String>, f64) {
    let mut names = Vec::new();
    let mut wait = 0.0;
    for s in shared {
        let key = format!("{}:{}", s.node, s.port);
        let before = base.per_link.get(&key).copied().unwrap_or(s.overload);
        if after.per_link.get(&key).copied().unwrap_or(0.0) < before - 1e-9 {
            names.push(s.link.clone());
            wait += s.blame;
        }
    }
    (names, wait)
}

/// Ranks remedies best first: by predicted rate (else the estimate), a
/// repair ahead of a workaround that predicts at most `tolerance` more
/// (a fixed cable removes the cause; the simulator's figures move by a
/// percent or two from seed to seed).
pub fn rank(remedies: &mut [Remedy], tolerance: f64) {
    let key = |r: &Remedy| {
        if r.is_repair() {
            r.figure() * (1.0 + tolerance)
        } else {
            r.figure()
        }
    };
    remedies.sort_by(|a, b| key(b).total_cmp(&key(a)));
}

/// The findings a workaround addresses: those without a repair of their
/// own that it relieves (or that no repair covers), and the repairable
/// ones whose links it relieves too.
pub fn addressed(
    findings: &[Finding],
    explains: &[Vec<String>],
    relieves: &[String],
) -> Vec<usize> {
    let mine: BTreeSet<&String> = relieves.iter().collect();
    findings
        .iter()
        .enumerate()
        .filter(|(i, f)| {
            f.kind != "cable-errors"
                && (explains[*i].iter().any(|l| mine.contains(l))
                    || (f.repair.is_none() && explains[*i].is_empty() && !mine.is_empty()))
        })
        .map(|(i, _)| i)
        .collect()
}
