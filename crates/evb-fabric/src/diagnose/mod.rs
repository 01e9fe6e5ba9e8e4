//! Why does this fabric underperform? The port counters of an interval
//! read onto the fabric's links ([`measure`]), the waiting they show
//! mapped onto the links the event builder's shift shares, with the steps
//! and rank pairs that share them ([`explain`]), what is wrong with the
//! cabling and the link rates ([`findings`]), and remedies ranked by the
//! rate they would give ([`remedies`]); the fabric drawn with its hot
//! links ([`drawing`]).
//!
//! The analysis takes the topology, its forwarding tables, the rank order
//! the event builder ran in, and one or two counter snapshots. The rate
//! after each remedy is first a synchronised-shift estimate; `evb fabric
//! diagnose` replaces it by what `evb sim` predicts and ranks again
//! ([`Diagnosis::rank`]).

pub mod drawing;
pub mod explain;
pub mod findings;
pub mod measure;
pub mod remedies;
pub mod text;

use crate::counters::Placed;
use crate::error::{FabricError, Result};
use crate::lft::Lfts;
use crate::topo::Topology;
use explain::{attribute, SharedLink};
use findings::{find, Finding};
use measure::{measure, LinkFigures, MeasureOptions};
use remedies::{effect, nominal_gbps, Current, Remedy, Variant};
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// `"kind"` of the JSON `evb fabric diagnose --json` writes.
pub const KIND: &str = "evb-fabric-diagnose";

/// A repair is ranked ahead of a workaround predicting at most this much
/// more (see [`remedies::rank`]).
pub const REPAIR_TOLERANCE: f64 = 0.02;

/// How to diagnose.
#[derive(Debug, Clone)]
pub struct Options {
    /// A port waiting for credits at least this share of the interval is
    /// hot.
    pub hot_wait: f64,
    /// Shared links and hot ports listed.
    pub top: usize,
    /// Time the order and route searches of the remedies may take.
    pub search: Duration,
    /// Engine OpenSM would route a repaired fabric with (default ftree).
    pub routing: Option<String>,
    /// `event_builder.local = "nic"`.
    pub local_nic: bool,
    pub measure: MeasureOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hot_wait: 0.05,
            top: 20,
            search: Duration::from_secs(1),
            routing: None,
            local_nic: false,
            measure: MeasureOptions::default(),
        }
    }
}

/// The fabric as it ran.
pub struct Input<'a> {
    /// `--topology` as given.
    pub topology: String,
    pub topo: &'a Topology,
    pub lfts: &'a Lfts,
    /// How the tables were made.
    pub routing: String,
    pub order: Vec<usize>,
    pub order_spec: String,
    /// The earlier snapshot (none: the later one counts from a clearing).
    pub a: Option<&'a Placed>,
    pub b: &'a Placed,
    /// The run's measured rate per step of the shift (`evb run --json`'s
    /// `summary.steps`: step, Gb/s), if given.
    pub run_steps: Vec<(usize, f64)>,
}

/// A step of the run slower than most, and the links it overloads.
#[derive(Debug, Clone, Serialize)]
pub struct SlowStep {
    pub step: usize,
    pub gbps: f64,
    /// The median over the run's steps.
    pub median_gbps: f64,
    /// Links the step overloads, and their loads (flows).
    pub links: Vec<(String, u32)>,
}

/// What the counters say in a few figures.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Data into the hosts (switch-to-host links), mean Gb/s per host
    /// (headers included), and as a share of those links' rate.
    pub host_gbps_mean: Option<f64>,
    pub host_utilisation_mean: Option<f64>,
    /// Ports waiting at least `hot_wait` of the interval, and the most.
    pub ports_waiting: usize,
    pub max_wait: f64,
    pub max_wait_link: String,
    pub links_with_errors: usize,
}

/// A port that waited, and the shared link most of its waiting is on.
#[derive(Debug, Clone, Serialize)]
pub struct HotPort {
    pub link: String,
    pub wait: f64,
    pub utilisation: Option<f64>,
    pub waits_on: Option<String>,
    /// The part of its wait on that link.
    pub waits_on_wait: f64,
}

/// The fabric as it is, under the same estimate as the remedies.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    pub conflicts: u64,
    pub weighted_conflicts: f64,
    pub estimated_gbps_per_node: f64,
    pub predicted_gbps_per_node: Option<f64>,
    pub prediction: String,
}

/// The whole diagnosis (`evb fabric diagnose --json`).
#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    pub kind: &'static str,
    pub topology: String,
    pub routing: String,
    pub order: String,
    pub hosts: usize,
    pub switches: usize,
    pub counters: Vec<String>,
    /// The interval the figures cover (the median over ports), seconds.
    pub interval_s: f64,
    /// How `PortXmitWait` ticks were turned into time.
    pub xmit_wait_tick: String,
    pub measured: Measured,
    pub hot_ports: Vec<HotPort>,
    /// Steps of the run (`--run`) below 85 % of its median rate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slow_steps: Vec<SlowStep>,
    /// The most blamed shared links, and how many the shift has.
    pub shared_links: Vec<SharedLink>,
    pub shared_links_total: usize,
    pub explained_wait: f64,
    pub unexplained_wait: f64,
    pub findings: Vec<Finding>,
    pub baseline: Baseline,
    /// Best first.
    pub remedies: Vec<Remedy>,
    pub links: Vec<LinkFigures>,
    pub drawing: drawing::Drawing,
    pub notes: Vec<String>,
    pub analysis_seconds: f64,
    #[serde(skip)]
    pub baseline_variant: Option<Variant>,
}

/// Diagnoses the fabric of `input` from its counters.
pub fn diagnose(input: &Input, opts: &Options) -> Result<Diagnosis> {
    let t0 = Instant::now();
    let topo = input.topo;
    if input.order.len() < 2 {
        return Err(FabricError::Invalid(
            "a shift needs at least 2 ranks".into(),
        ));
    }
    let (links, mut notes) = measure(topo, input.a, input.b, &opts.measure)?;
    let steps: Vec<usize> = (1..input.order.len()).collect();
    let nominal = nominal_gbps(topo);
    let attr = attribute(topo, input.lfts, &input.order, &steps, &links, nominal)?;
    let mut found = find(topo, &input.order, &links);
    let cur = Current {
        topo,
        lfts: input.lfts,
        order: &input.order,
        order_spec: &input.order_spec,
        routing: opts.routing.as_deref(),
        local_nic: opts.local_nic,
        search: opts.search,
        nominal,
        ftree_order: crate::optimize::order_ftree(topo).ok(),
    };
    let base = Variant {
        topo: topo.clone(),
        lfts: input.lfts.clone(),
        order: input.order.clone(),
        schedule: None,
        routing: input.routing.clone(),
    };
    let base_effect = effect(&base, nominal)?;
    let mut rems = build_remedies(&cur, &found, &mut notes)?;
    evaluate(&mut rems, &base_effect, &attr.shared, nominal)?;
    explain_findings(&mut found, &rems, &attr.shared);
    address(&found, &mut rems);
    remedies::rank(&mut rems, REPAIR_TOLERANCE);
    let interval_s = median(links.iter().map(|l| l.interval_s).collect());
    let tick = tick_note(&links, opts);
    let measured = measured(&links, opts.hot_wait);
    if measured.ports_waiting > 0 {
        notes.extend(unexplained_note(&attr));
    }
    let hot_ports = hot_ports(topo, &links, &attr, opts);
    let routes = top_routes(topo, input.lfts, &input.order, attr.shared.first())?;
    let drawing = drawing::draw(topo, &links, &attr.shared, rems.first(), &routes);
    Ok(Diagnosis {
        kind: KIND,
        topology: input.topology.clone(),
        routing: input.routing.clone(),
        order: input.order_spec.clone(),
        hosts: input.order.len(),
        switches: topo.switches().len(),
        counters: input
            .a
            .iter()
            .map(|a| a.file.display().to_string())
            .chain([input.b.file.display().to_string()])
            .collect(),
        interval_s,
        xmit_wait_tick: tick,
        measured,
        hot_ports,
        slow_steps: slow_steps(input, nominal)?,
        shared_links_total: attr.shared.len(),
        shared_links: attr.shared.iter().take(opts.top).cloned().collect(),
        explained_wait: attr.explained_wait,
        unexplained_wait: attr.unexplained_wait,
        findings: found,
        baseline: Baseline {
            conflicts: base_effect.conflicts,
            weighted_conflicts: base_effect.weighted_conflicts,
            estimated_gbps_per_node: base_effect.estimated_gbps_per_node,
            predicted_gbps_per_node: None,
            prediction: "shift estimate".into(),
        },
        remedies: rems,
        links,
        drawing,
        notes,
        analysis_seconds: t0.elapsed().as_secs_f64(),
        baseline_variant: Some(base),
    })
}

/// Each remedy's effect on the shift (side by side), the overloaded links
/// it relieves; a workaround that changes nothing for the shift is
/// dropped.
fn evaluate(
    rems: &mut Vec<Remedy>,
    base_effect: &remedies::Effect,
    shared: &[SharedLink],
    nominal: f64,
) -> Result<()> {
    let effects: Vec<Option<Result<remedies::Effect>>> = std::thread::scope(|s| {
        let hs: Vec<_> = rems
            .iter()
            .map(|r| {
                r.variant
                    .as_ref()
                    .map(|v| s.spawn(move || effect(v, nominal)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.map(|h| h.join().expect("an effect panicked")))
            .collect()
    });
    for (r, e) in rems.iter_mut().zip(effects) {
        let e = match e {
            Some(e) => e?,
            None => base_effect.clone(),
        };
        if r.variant.is_some() {
            (r.relieves, r.relieves_wait) = remedies::relieved(base_effect, &e, shared);
        }
        r.conflicts = e.conflicts;
        r.estimated_gbps_per_node = e.estimated_gbps_per_node;
    }
    rems.retain(|r| {
        r.is_repair()
            || r.conflicts < base_effect.conflicts
            || r.estimated_gbps_per_node > base_effect.estimated_gbps_per_node * 1.005
    });
    Ok(())
}

/// Every remedy: each finding's repair, `check-cable` for cables with
/// errors, then the workarounds (order, routes, schedule).
fn build_remedies(
    cur: &Current,
    found: &[Finding],
    notes: &mut Vec<String>,
) -> Result<Vec<Remedy>> {
    let mut rems = Vec::new();
    for (i, f) in found.iter().enumerate() {
        if let Some(r) = remedies::repair(cur, f, i)? {
            rems.push(r);
        } else if f.kind == "cable-errors" {
            let mut r = Remedy::new("check-cable", f.what.clone(), None);
            r.ports = f.ports.clone();
            r.addresses = vec![i];
            r.apply =
                "check, reseat or replace the cable; the model cannot say what its errors cost"
                    .into();
            r.prediction = "no change modelled".into();
            rems.push(r);
        }
    }
    type Build = fn(&Current) -> Result<Option<Remedy>>;
    let software: [(&str, Build); 3] = [
        ("hostfile", remedies::hostfile),
        ("routes", remedies::routes),
        ("schedule", remedies::schedule),
    ];
    // Each builds and evaluates a fabric of its own: side by side.
    let built: Vec<(&str, Result<Option<Remedy>>)> = std::thread::scope(|s| {
        let hs: Vec<_> = software
            .iter()
            .map(|&(name, build)| (name, s.spawn(move || build(cur))))
            .collect();
        hs.into_iter()
            .map(|(name, h)| (name, h.join().expect("a remedy builder panicked")))
            .collect()
    });
    for (name, r) in built {
        match r {
            Ok(Some(r)) => rems.push(r),
            Ok(None) => {}
            Err(e) => notes.push(format!("remedy {name} left out: {e}")),
        }
    }
    Ok(rems)
}

/// Which shared links each finding explains, and the waiting on them: a
/// repair's relieved links; a short leaf's, those the schedule over the
/// ftree positions relieves; an oversubscribed leaf's, its own shared
/// links. Links no finding explains make an `order-conflicts` finding.
fn explain_findings(found: &mut Vec<Finding>, rems: &[Remedy], shared: &[SharedLink]) {
    let blame = |links: &[String]| -> f64 {
        shared
            .iter()
            .filter(|s| links.contains(&s.link))
            .map(|s| s.blame)
            .sum()
    };
    let schedule = rems.iter().find(|r| r.kind == "schedule");
    for (i, f) in found.iter_mut().enumerate() {
        f.explains = match f.kind {
            "short-leaf" => schedule.map(|r| r.relieves.clone()).unwrap_or_default(),
            "oversubscribed-leaf" => {
                let leaf = f
                    .ports
                    .first()
                    .and_then(|p| p.rsplit_once(':'))
                    .map(|x| x.0.to_string());
                shared
                    .iter()
                    .filter(|s| Some(&s.node) == leaf.as_ref() || Some(&s.to) == leaf.as_ref())
                    .map(|s| s.link.clone())
                    .collect()
            }
            _ => rems
                .iter()
                .find(|r| r.is_repair() && r.addresses == [i])
                .map(|r| r.relieves.clone())
                .unwrap_or_default(),
        };
        f.blame = blame(&f.explains);
    }
    let covered: BTreeSet<&String> = found.iter().flat_map(|f| f.explains.iter()).collect();
    let rest: Vec<&SharedLink> = shared
        .iter()
        .filter(|s| !covered.contains(&s.link))
        .collect();
    if rest.iter().any(|s| s.blame > 0.0) || (found.is_empty() && !rest.is_empty()) {
        let top: Vec<&&SharedLink> = rest.iter().take(6).collect();
        found.push(Finding {
            kind: "order-conflicts",
            ports: top.iter().map(|s| format!("{}:{}", s.node, s.port)).collect(),
            what: format!(
                "the rank order shares {} link(s) on these tables that no cabling fault explains (most blamed: {})",
                rest.len(),
                top.iter().map(|s| s.link.as_str()).collect::<Vec<_>>().join(", ")
            ),
            repair: None,
            explains: rest.iter().map(|s| s.link.clone()).collect(),
            blame: rest.iter().map(|s| s.blame).sum(),
        });
    }
}

/// Sets the findings each workaround addresses, and the ports it concerns:
/// those findings' ports, or else the sending ends of the links it relieves.
fn address(found: &[Finding], rems: &mut [Remedy]) {
    let explains: Vec<Vec<String>> = found.iter().map(|f| f.explains.clone()).collect();
    for r in rems.iter_mut().filter(|r| !r.is_repair()) {
        r.addresses = remedies::addressed(found, &explains, &r.relieves);
        let mut ports: Vec<String> = Vec::new();
        for &i in &r.addresses {
            for p in &found[i].ports {
                if !ports.contains(p) {
                    ports.push(p.clone());
                }
            }
        }
        if ports.is_empty() {
            ports = r
                .relieves
                .iter()
                .take(4)
                .filter_map(|l| l.split_once("->").map(|x| x.0.to_string()))
                .collect();
        }
        r.ports = ports;
    }
}

impl Diagnosis {
    /// Ranks the remedies again (after predictions were filled in).
    pub fn rank(&mut self) {
        remedies::rank(&mut self.remedies, REPAIR_TOLERANCE);
    }
}

/// The routes (fabric nodes crossed) of the rank pairs that share `top`
/// in its first shared step.
fn top_routes(
    topo: &Topology,
    lfts: &Lfts,
    order: &[usize],
    top: Option<&SharedLink>,
) -> Result<Vec<(String, Vec<usize>)>> {
    let Some(top) = top else {
        return Ok(Vec::new());
    };
    let (offsets, _) = topo.port_offsets();
    let n = order.len();
    let step = top.steps.first().copied().unwrap_or(0);
    let mut out = Vec::new();
    let mut path = Vec::new();
    for p in top
        .pairs
        .iter()
        .filter(|p| (p[0] + step) % n == p[1])
        .take(4)
    {
        path.clear();
        crate::lft::trace(topo, lfts, &offsets, order[p[0]], order[p[1]], &mut path)?;
        let mut nodes = vec![order[p[0]]];
        for &l in &path {
            let (node, port) = crate::lft::link_of(&offsets, l);
            nodes.extend(topo.nodes[node].ports[port as usize].map(|r| r.node));
        }
        out.push((format!("ranks {} -> {} (step {step})", p[0], p[1]), nodes));
    }
    Ok(out)
}

/// The run's steps below 85 % of its median rate (the ten slowest), each
/// with the links it overloads.
fn slow_steps(input: &Input, nominal: f64) -> Result<Vec<SlowStep>> {
    let median_gbps = median(input.run_steps.iter().map(|s| s.1).collect());
    let n = input.order.len();
    let mut slow: Vec<(usize, f64)> = input
        .run_steps
        .iter()
        .copied()
        .filter(|&(s, g)| s > 0 && s < n && g < 0.85 * median_gbps)
        .collect();
    slow.sort_by(|a, b| a.1.total_cmp(&b.1));
    slow.truncate(10);
    slow.into_iter()
        .map(|(step, gbps)| {
            let links =
                explain::overloaded_in_step(input.topo, input.lfts, &input.order, step, nominal)?;
            Ok(SlowStep {
                step,
                gbps,
                median_gbps,
                links,
            })
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// How the `PortXmitWait` ticks were read.
fn tick_note(links: &[LinkFigures], opts: &Options) -> String {
    let mut ticks: Vec<f64> = links.iter().filter_map(|l| l.tick_ns).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    let list: Vec<String> = ticks.iter().take(4).map(|t| format!("{t:.3} ns")).collect();
    let how = match opts.measure.tick_ns {
        Some(t) => format!("{t} ns where the snapshot has none (--xmit-wait-tick-ns)"),
        None => "the snapshot's per port (PortSamplesControl, or the simulator's), else one symbol time of the link's speed".into(),
    };
    format!("{} ({how})", list.join(", "))
}

fn unexplained_note(attr: &explain::Attribution) -> Option<String> {
    let total = attr.explained_wait + attr.unexplained_wait;
    (total > 0.0 && attr.unexplained_wait > 0.25 * total).then(|| {
        format!(
            "{:.0}% of the measured waiting is on flows that share no link in the shift: a slow receiver, other traffic, or a rank order other than the one given",
            100.0 * attr.unexplained_wait / total
        )
    })
}

fn measured(links: &[LinkFigures], hot: f64) -> Measured {
    let down: Vec<&LinkFigures> = links.iter().filter(|l| l.tier == "host down").collect();
    let mean = |f: &dyn Fn(&LinkFigures) -> Option<f64>| {
        let v: Vec<f64> = down.iter().filter_map(|l| f(l)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let max = links
        .iter()
        .filter_map(|l| Some((l.wait?, l)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    Measured {
        host_gbps_mean: mean(&|l| l.data_gbps),
        host_utilisation_mean: mean(&|l| l.utilisation),
        ports_waiting: links
            .iter()
            .filter(|l| l.wait.is_some_and(|w| w >= hot))
            .count(),
        max_wait: max.map_or(0.0, |m| m.0),
        max_wait_link: max.map_or(String::new(), |m| m.1.link.clone()),
        links_with_errors: links.iter().filter(|l| !l.errors.is_empty()).count(),
    }
}

fn hot_ports(
    topo: &Topology,
    links: &[LinkFigures],
    attr: &explain::Attribution,
    opts: &Options,
) -> Vec<HotPort> {
    let (offsets, _) = topo.port_offsets();
    let by_id: std::collections::HashMap<u32, &SharedLink> =
        attr.shared.iter().map(|s| (s.id, s)).collect();
    let mut hot: Vec<HotPort> = links
        .iter()
        .filter(|l| l.wait.is_some_and(|w| w >= opts.hot_wait))
        .map(|l| {
            let id = offsets[l.node_id] + u32::from(l.port);
            let on = attr.waits_on.get(&id);
            HotPort {
                link: l.link.clone(),
                wait: l.wait.unwrap_or(0.0),
                utilisation: l.utilisation,
                waits_on: on.and_then(|(c, _)| by_id.get(c)).map(|s| s.link.clone()),
                waits_on_wait: on.map_or(0.0, |x| x.1),
            }
        })
        .collect();
    hot.sort_by(|a, b| b.wait.total_cmp(&a.wait));
    hot.truncate(opts.top);
    hot
}
