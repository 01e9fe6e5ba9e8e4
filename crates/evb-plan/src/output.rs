//! What a plan prints and writes: the ranked table, the commands that
//! reproduce each design's numbers, the JSON (`designs[]`), the Pareto
//! plot of cost against predicted rate.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::cost::CableKind;
use crate::evaluate;
use crate::plan::{Design, Plan};
use crate::requirement::{EmHost, Requirement};

/// A shell word: quoted when it holds anything a shell would read.
fn sh(word: &str) -> String {
    if word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || ",.=:_-/+".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The `evb fabric schedule` and `evb sim` commands that reproduce a
/// design's conflicts, slots, bound and simulated rate.
pub fn commands(req: &Requirement, d: &Design) -> Vec<String> {
    let c = &d.candidate;
    let spec = sh(&c.spec);
    let fabric = format!(
        "evb fabric schedule --topology {spec} --order ftree --ranks {} --out schedule.slots",
        c.endpoints
    );
    let duration = d.sim.as_ref().map_or(d.estimate.sim_us, |s| s.simulated_us);
    let mut sim = format!("evb sim --topology {spec} --order ftree");
    for o in evaluate::overrides(req, c, Some(duration)) {
        let _ = write!(sim, " --set {}", sh(&o));
    }
    vec![fabric, sim]
}

fn kcost(v: f64) -> String {
    format!("{:.0}", v / 1000.0)
}

/// The ranked table, then where the time went and what was left out.
pub fn text(plan: &Plan) -> String {
    let req = &plan.requirement;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "evb plan: {} nodes x {:.1} Gb/s built = {:.2} Tb/s; events {:.0} kB, {} a MEP; the EM {}; \
         prices in k{} ({})",
        req.nodes,
        req.gbps_per_node,
        req.aggregate_tbps(),
        req.event_bytes / 1000.0,
        req.events_per_mep,
        if req.em == EmHost::Separate { "on a host of its own" } else { "in node 0" },
        req.currency,
        if req.origin == "flags" { "the shipped example prices".to_string() } else { format!("from {} and the shipped examples", req.origin) }
    );
    let _ = writeln!(
        out,
        "{:>3} {:<42} {:>5} {:>16} {:>7} {:>7} {:>9} {:>12} {:>17} {:>7} {:>8} {:>8}",
        "#",
        "design",
        "swit.",
        "cables DAC/AC/op",
        "cost",
        "bisect",
        "conflicts",
        "slots(bound)",
        "Gb/s/node",
        "Tb/s",
        "cost/Tbs",
        "margin"
    );
    for (i, d) in plan.designs.iter().enumerate() {
        let _ = writeln!(out, "{}", row(i + 1, d, req));
    }
    let _ = writeln!(
        out,
        "cost: switches and cables (k{}); bisect: Tb/s; conflicts: plain barrel over the ranks in ftree order; \
         slots*: before the schedule's local search (`evb fabric schedule` finds as many or fewer); \
         Gb/s/node: `sim` = steady-state evb sim (wall time), `est` = estimate, `est sim?`: estimate, the simulation did not settle (drift over 5 %) (slot share x ranks/slots), not simulated",
        req.currency
    );
    out.push_str(&timing(plan));
    for d in &plan.dropped {
        let _ = writeln!(out, "left out: {} ({}): {}", d.name, d.spec, d.why);
    }
    out.push_str("reproduce (the conflicts, slots and bound; the simulated rate):\n");
    for (i, d) in plan.designs.iter().enumerate() {
        for c in commands(req, d) {
            let _ = writeln!(out, "  #{}: {c}", i + 1);
        }
    }
    out
}

/// One row of the table.
fn row(rank: usize, d: &Design, req: &Requirement) -> String {
    let k = d.bill.by_kind();
    let n = |kind| k.get(&kind).copied().unwrap_or(0);
    let cables = format!(
        "{}/{}/{}",
        n(CableKind::Dac),
        n(CableKind::ActiveCopper),
        n(CableKind::Optics)
    );
    let a = &d.analysis;
    let how = match &d.sim {
        Some(s) if s.settled() => format!("sim {:.0}s", s.wall_seconds),
        Some(_) => "est sim?".into(),
        None => "est".into(),
    };
    let mut name = d.candidate.name();
    name.truncate(42);
    format!(
        "{rank:>3} {name:<42} {:>5} {cables:>16} {:>7} {:>7.2} {:>9} {:>12} {:>17} {:>7.2} {:>8} {:>+7.1}%",
        d.bill.switch_count(),
        kcost(d.bill.total),
        d.bisection_gbps / 1000.0,
        a.conflicts,
        format!("{}{}({})", a.slots, if a.searched { "" } else { "*" }, a.lower_bound),
        format!("{:.2} {how}", d.predicted()),
        d.built_tbps(req),
        kcost(d.cost_per_tbps(req)),
        d.margin(req) * 100.0
    )
}

/// How the time was spent.
fn timing(plan: &Plan) -> String {
    let t = &plan.timing;
    let mut out = format!(
        "time: {:.1} s in all on {} threads: {} candidates, {} distinct fabrics routed and analysed in {:.1} s; \
         {} simulations ({:.1} Tbit simulated) in {:.1} s\n",
        t.total_s, t.threads, t.candidates, t.fabrics_analysed, t.analysis_wall_s, t.simulations, t.simulated_tbit, t.simulation_wall_s
    );
    let mut seen = Vec::new();
    for (i, d) in plan.designs.iter().enumerate() {
        let Some(s) = &d.sim else { continue };
        if seen.contains(&&d.candidate.spec) {
            continue;
        }
        seen.push(&d.candidate.spec);
        let _ = writeln!(
            out,
            "  sim of #{}: {:.1} ms simulated ({:.1} rotations), {:.1} s wall, {}, +- {:.2} Gb/s, drift {:+.1} %",
            i + 1,
            s.simulated_us / 1000.0,
            s.rotations,
            s.wall_seconds,
            match (s.steady, s.settled()) {
                (true, true) => "steady",
                (true, false) => "steady by evb sim's test but NOT settled (drift over 5 %): the estimate stands",
                _ => "NOT steady",
            },
            s.ci95_gbps,
            s.drift * 100.0
        );
    }
    out
}

/// One design as JSON.
fn design_json(rank: usize, d: &Design, req: &Requirement) -> Value {
    let k = d.bill.by_kind();
    let n = |kind| k.get(&kind).copied().unwrap_or(0);
    let c = &d.candidate;
    json!({
        "rank": rank,
        "name": c.name(),
        "generation": c.generation,
        "port_gbps": c.port_gbps,
        "ports_per_node": c.ports_per_node,
        "structure": c.structure,
        "leaf_model": c.leaf_model,
        "director_model": c.director_model,
        "blocking": c.blocking,
        "placement": c.placement,
        "hosts": c.hosts,
        "endpoints": c.endpoints,
        "topology": c.spec,
        "switches": d.bill.switches,
        "switch_count": d.bill.switch_count(),
        "cables": {
            "dac": n(CableKind::Dac),
            "active_copper": n(CableKind::ActiveCopper),
            "optics": n(CableKind::Optics),
            "lines": d.bill.cables,
            "over_reach": d.bill.over_reach,
        },
        "cost": {
            "switches": d.bill.switch_cost,
            "cables": d.bill.cable_cost,
            "total": d.bill.total,
            "currency": req.currency,
        },
        "rack_units": d.bill.rack_units,
        "power_w": d.bill.power_w,
        "bisection_gbps": d.bisection_gbps,
        "conflicts": d.analysis.conflicts,
        "steps_with_conflicts": d.analysis.steps_with_conflicts,
        "slots": d.analysis.slots,
        "lower_bound": d.analysis.lower_bound,
        "slots_searched": d.analysis.searched,
        "slot_us": d.estimate.slot_us,
        "estimate_gbps_per_node": d.estimate.gbps_per_node,
        "predicted_gbps_per_node": d.predicted(),
        "predicted_by": if d.simulated() { "sim" } else { "estimate" },
        "sim_settled": d.sim.as_ref().map(|s| s.settled()),
        "sim": d.sim,
        "built_tbps": d.built_tbps(req),
        "cost_per_tbps": d.cost_per_tbps(req),
        "margin": d.margin(req),
        "meets_requirement": d.meets(req),
        "commands": commands(req, d),
    })
}

/// The plan as JSON (`"kind": "evb-plan"`).
pub fn to_json(plan: &Plan) -> Value {
    let req = &plan.requirement;
    json!({
        "kind": "evb-plan",
        "requirement": {
            "nodes": req.nodes,
            "gbps_per_node": req.gbps_per_node,
            "aggregate_tbps": req.aggregate_tbps(),
            "event_bytes": req.event_bytes,
            "events_per_mep": req.events_per_mep,
            "em": req.em,
            "ports_per_node": req.ports_per_node,
            "generations": req.generations,
            "blocking": req.blocking,
            "spare_ports": req.spare_ports,
            "currency": req.currency,
            "layout": req.layout,
            "simulate": req.simulate,
            "origin": req.origin,
            "prices": "examples unless the requirement file gave its own: see docs/plan.md",
        },
        "designs": plan.designs.iter().enumerate().map(|(i, d)| design_json(i + 1, d, req)).collect::<Vec<_>>(),
        "dropped": plan.dropped,
        "timing": plan.timing,
    })
}

/// The Pareto front: designs no other design beats on both cost and rate.
pub fn pareto(designs: &[Design]) -> Vec<usize> {
    let mut front: Vec<usize> = (0..designs.len())
        .filter(|&i| {
            let (ci, ri) = (designs[i].bill.total, designs[i].predicted());
            !designs.iter().any(|o| {
                let (c, r) = (o.bill.total, o.predicted());
                (c <= ci && r > ri) || (c < ci && r >= ri)
            })
        })
        .collect();
    front.sort_by(|&a, &b| designs[a].bill.total.total_cmp(&designs[b].bill.total));
    front
}

/// The points of the Pareto plot: simulated and estimated designs, the
/// front, the requirement; labels `#rank` on the front.
pub fn pareto_series(plan: &Plan) -> (Vec<evb_plot::Series>, Vec<(f64, f64, String)>) {
    let req = &plan.requirement;
    let point = |d: &Design| (d.bill.total / 1000.0, d.predicted());
    let pick = |sim: bool| {
        plan.designs
            .iter()
            .filter(|d| d.simulated() == sim)
            .map(point)
            .collect()
    };
    let front = pareto(&plan.designs);
    let xs: Vec<f64> = plan.designs.iter().map(|d| d.bill.total / 1000.0).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(0.0, f64::max),
    );
    let series = vec![
        evb_plot::Series {
            name: "simulated (evb sim)".into(),
            points: pick(true),
        },
        evb_plot::Series {
            name: "estimated".into(),
            points: pick(false),
        },
        evb_plot::Series {
            name: "~Pareto front".into(),
            points: front.iter().map(|&i| point(&plan.designs[i])).collect(),
        },
        evb_plot::Series {
            name: format!("~required {:.1} Gb/s", req.gbps_per_node),
            points: vec![(x0, req.gbps_per_node), (x1, req.gbps_per_node)],
        },
    ];
    let labels = front
        .iter()
        .map(|&i| {
            let (x, y) = point(&plan.designs[i]);
            (x, y, format!("  #{}", i + 1))
        })
        .collect();
    (series, labels)
}

/// Writes the Pareto plot: `base.svg` and `base.png`.
pub fn plot(plan: &Plan, base: &Path) -> anyhow::Result<[PathBuf; 2]> {
    let (series, labels) = pareto_series(plan);
    let req = &plan.requirement;
    let title = format!(
        "evb plan: {} nodes x {:.0} Gb/s: cost against predicted rate",
        req.nodes, req.gbps_per_node
    );
    let x = format!("cost, k{}", req.currency);
    Ok(evb_plot::scatter_chart(
        base,
        &title,
        &x,
        "Gb/s built per node",
        &series,
        &labels,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words() {
        assert_eq!(
            sh("fat-tree:radix=36,hosts=540"),
            "fat-tree:radix=36,hosts=540"
        );
        assert_eq!(sh("nodes.em=\"separate\""), "'nodes.em=\"separate\"'");
    }
}
