//! A candidate measured: its fabric built from the generator spec, routed
//! by evb's ftree engine (OpenSM's, entry for entry), the plain barrel's
//! shift conflicts over the builder's ranks in the ftree CA order, the
//! slot schedule `evb sim` would run with its lower bound, an analytic
//! estimate of the rate, and (for the designs the budget reaches) the
//! rate a steady-state `evb sim` of the design builds.

use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use evb_core::Config;
use evb_fabric::conflicts::{analyze, shift_steps};
use evb_fabric::Topology;
use serde::Serialize;

use crate::design::Candidate;
use crate::requirement::{EmHost, Requirement};

/// What the fabric analysis says about a fabric (the same for every
/// candidate that has it, whatever its port rate and prices).
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// Plain barrel over the builder's ranks (ftree CA order): conflicts
    /// (flows beyond the first on a directed link, summed over steps) and
    /// the steps that have any.
    pub conflicts: u64,
    pub steps_with_conflicts: usize,
    pub steps: usize,
    /// Slots a rotation of the conflict-aware schedule, and the fewest
    /// any schedule can have. `searched`: the schedule `evb fabric
    /// schedule` (and `evb sim`) writes, after its local search (the
    /// simulated designs, and every conflict-free one); otherwise the
    /// schedule before that search, which the search can only shorten
    /// (it took up to 20 s a fabric at 164 hosts: too slow for every
    /// candidate).
    pub slots: usize,
    pub lower_bound: usize,
    pub searched: bool,
    pub seconds: f64,
}

/// The analytic estimate of a candidate's rate.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    /// The slot, us, sized for the port rate.
    pub slot_us: f64,
    /// Gb/s built per node: port rate x the slot's payload share x
    /// endpoints / slots, x ports per node.
    pub gbps_per_node: f64,
    /// Simulated time [`ROTATIONS`] rotations take, us.
    pub sim_us: f64,
}

/// The configuration overrides of a design's event builder (shared by
/// the estimate, the simulation and the written `evb.toml`).
pub fn overrides(req: &Requirement, c: &Candidate, duration_us: Option<f64>) -> Vec<String> {
    let mean = (req.event_bytes / c.endpoints as f64).round().max(1.0);
    let std = (mean * req.event_std_fraction).round();
    let mut o = vec![
        format!("nodes.count={}", c.endpoints),
        format!(
            "nodes.em=\"{}\"",
            if req.em == EmHost::Separate {
                "separate"
            } else {
                "node0"
            }
        ),
        format!("source.events_per_mep={}", req.events_per_mep),
        "source.size=\"normal\"".into(),
        format!("source.mean_bytes={mean}"),
        format!("source.std_bytes={std}"),
        format!(
            "source.max_fragment_bytes={}",
            (8.0 * mean).max(4096.0) as u64
        ),
        format!("sim.link_gbps={}", c.port_gbps),
        // Eight packets a unit at every size: 8x fewer events, the slotted
        // builder's figures unchanged (docs/sim.md, trains of packets).
        "sim.train_packets=8".into(),
    ];
    if let Some(d) = duration_us {
        o.push(format!("sim.duration_us={d:.0}"));
    }
    o
}

/// A candidate's fabric routed by ftree: its hosts in the ftree CA
/// order, and the engine's destination positions (`None`: a dummy for a
/// host a short leaf lacks).
pub struct Routed {
    pub topo: Topology,
    pub lfts: evb_fabric::Lfts,
    pub order: Vec<usize>,
    pub positions: Vec<Option<usize>>,
}

/// The fabric of a candidate, routed by ftree. Fails where OpenSM's
/// ftree would refuse the fabric.
pub fn build(c: &Candidate) -> Result<Routed> {
    let topo = evb_fabric::topo::FatTreeSpec::parse(&c.spec)?.build()?;
    let routed =
        evb_fabric::ftree::route_ftree(&topo).with_context(|| format!("{}: ftree", c.spec))?;
    let lids = topo.lid_table();
    let host = |l: u16| lids.get(l as usize).copied().flatten();
    let order: Vec<usize> = routed.ca_order.iter().filter_map(|&l| host(l)).collect();
    let positions = routed.positions.iter().map(|p| p.and_then(host)).collect();
    assert_eq!(order.len(), c.hosts, "the CA order holds every host");
    Ok(Routed {
        topo,
        lfts: routed.lfts,
        order,
        positions,
    })
}

/// Conflicts and schedule of the first `n` ranks of the CA order: the
/// conflict-aware schedule from the ranks' shift or from the shift over
/// the engine's positions, whichever is shorter (as
/// [`evb_fabric::schedule::choose`] starts), without its local search.
pub fn analyse(r: &Routed, n: usize) -> Result<Analysis> {
    use evb_fabric::schedule::{conflict_aware, SlotSchedule};
    let t0 = Instant::now();
    let ranks = &r.order[..n];
    let steps = shift_steps(n);
    let an = analyze(&r.topo, &r.lfts, ranks, &steps, 0)?;
    let mut s = conflict_aware(&r.topo, &r.lfts, ranks, SlotSchedule::plain(n, false))?;
    let rank_of: std::collections::HashMap<usize, usize> =
        ranks.iter().enumerate().map(|(i, &h)| (h, i)).collect();
    let at: Vec<Option<usize>> = r
        .positions
        .iter()
        .map(|p| p.and_then(|h| rank_of.get(&h).copied()))
        .collect();
    if at.len() > n && an.total.conflicts > 0 {
        let p = conflict_aware(
            &r.topo,
            &r.lfts,
            ranks,
            SlotSchedule::shift_over_positions(&at, false),
        )?;
        if p.slots.len() < s.slots.len() {
            s = p;
        }
    }
    assert!(
        s.lower_bound <= s.slots.len() && n - 1 <= s.slots.len(),
        "a rotation reaches every rank"
    );
    Ok(Analysis {
        conflicts: an.total.conflicts,
        steps_with_conflicts: an.total.steps_with_conflicts,
        steps: steps.len(),
        slots: s.slots.len(),
        lower_bound: s.lower_bound,
        searched: an.total.conflicts == 0,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The estimate of a candidate whose fabric has `slots` a rotation.
pub fn estimate(req: &Requirement, c: &Candidate, slots: usize) -> Result<Estimate> {
    let mut config = Config::load(None, &overrides(req, c, None))
        .map_err(|e| anyhow!("the design's configuration: {e}"))?;
    config.slot_gbps = Some(c.port_gbps);
    config.node_gbps = Some(c.port_gbps);
    let slot_ns = config.slot_ns() as f64;
    let mean_fragment =
        f64::from(config.source.mean_bytes) * f64::from(config.source.events_per_mep);
    let payload_ns = mean_fragment * 8.0 / c.port_gbps;
    let n = c.endpoints as f64;
    let per_endpoint = c.port_gbps * payload_ns / slot_ns * n / slots as f64;
    Ok(Estimate {
        slot_us: slot_ns / 1000.0,
        gbps_per_node: per_endpoint * c.ports_per_node as f64,
        sim_us: (slots as f64 * slot_ns / 1000.0 * ROTATIONS).ceil(),
    })
}

/// What `evb sim` of a design built.
#[derive(Debug, Clone, Serialize)]
pub struct SimOutcome {
    /// Gb/s built per node (all its ports), in steady state, and the
    /// half width of its 95 % interval.
    pub gbps_per_node: f64,
    pub ci95_gbps: f64,
    pub steady: bool,
    pub drift: f64,
    pub simulated_us: f64,
    pub wall_seconds: f64,
    /// Rotations of the slotted barrel simulated.
    pub rotations: f64,
    /// Hosts x link rate x simulated time, Tbit: what the budget counts.
    pub tbit: f64,
    pub port_xmit_wait_s: f64,
    /// The schedule the run used (the fabric's, as `evb fabric schedule`
    /// writes it), and how long it took to compute (in `wall_seconds`).
    pub slots: usize,
    pub lower_bound: usize,
    pub schedule_seconds: f64,
}

/// Simulated time a steady state needs: two rotations of warm-up (what
/// evb-sim leaves out), four batch means of a rotation after it, and a
/// little over. Two means gave a t(1) interval, 12.7 times their spread
/// (540 nodes: +-250 Gb/s on 215 predicted as soon as two rotations
/// differed); four give t(3), 3.2 times it.
pub const ROTATIONS: f64 = 6.3;

/// Simulates a candidate as `evb sim --topology SPEC --order ftree` with
/// the design's overrides would, for [`ROTATIONS`] rotations; once more,
/// as long as evb-sim says, if that was no steady state.
pub fn simulate(req: &Requirement, c: &Candidate) -> Result<SimOutcome> {
    let spec = evb_sim::setup::FabricSpec {
        topology: c.spec.clone(),
        lfts: None,
        routing: Some("ftree".into()),
        order: Some("ftree".into()),
        remove: Vec::new(),
        remove_link: Vec::new(),
        swap_cables: Vec::new(),
    };
    let t0 = Instant::now();
    let fabric = spec.build()?;
    let (mut config, _) = evb_sim::setup::sized_config(None, &overrides(req, c, None), &fabric)?;
    // The rotation of the schedule the run will use (computed once: the
    // fabric keeps it for the run).
    let mut probe = config.clone();
    let schedule = evb_sim::schedule::prepare(&mut probe, &fabric)
        .map_err(anyhow::Error::msg)?
        .context("a slotted barrel has a schedule")?;
    let rotation_us =
        evb_sim::rotation_ps(&probe).context("a slotted barrel has a rotation")? as f64 * 1e-6;
    config.sim.duration_us = (rotation_us * ROTATIONS).ceil();
    let mut result =
        evb_sim::simulate(&config, fabric.clone(), |_| {}).map_err(anyhow::Error::msg)?;
    let mut eb = result
        .summary
        .eb
        .clone()
        .context("an eb run has eb figures")?;
    if let (false, Some(needs)) = (eb.steady, eb.steady_needs_us) {
        config.sim.duration_us = needs.min(4.0 * config.sim.duration_us).ceil();
        result = evb_sim::simulate(&config, fabric, |_| {}).map_err(anyhow::Error::msg)?;
        eb = result
            .summary
            .eb
            .clone()
            .context("an eb run has eb figures")?;
    }
    let ports = c.ports_per_node as f64;
    let simulated_us = config.sim.duration_us;
    Ok(SimOutcome {
        gbps_per_node: eb.built_gbps_per_node * ports,
        ci95_gbps: eb.built_ci95_gbps * ports,
        steady: eb.steady,
        drift: eb.drift,
        simulated_us,
        wall_seconds: t0.elapsed().as_secs_f64(),
        rotations: simulated_us / rotation_us,
        tbit: sim_tbit(c, simulated_us),
        port_xmit_wait_s: result.summary.total_xmit_wait_s,
        slots: schedule.slots,
        lower_bound: schedule.lower_bound,
        schedule_seconds: schedule.seconds,
    })
}

impl SimOutcome {
    /// Steady, and settled: a drift within 5 % (a run can pass evb-sim's
    /// steady test, two batch means after the warm-up, and still be
    /// climbing: 1000 nodes at 800 Gb/s, 1.5 us slots, drifted +11728 %).
    /// The 95 % interval of two batch means is wide (t = 12.7) and only
    /// printed.
    pub fn settled(&self) -> bool {
        self.steady && self.drift.abs() <= 0.05
    }
}

/// Hosts x port rate x simulated time, Tbit.
pub fn sim_tbit(c: &Candidate, simulated_us: f64) -> f64 {
    c.hosts as f64 * c.port_gbps * simulated_us * 1e-6 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::candidates;
    use crate::requirement::{resolve, Flags};

    /// A small design simulated: steady, close to its estimate, and the
    /// estimate's schedule is the one the sim ran.
    #[test]
    fn a_small_design_simulates_to_a_steady_state() {
        let req = resolve(
            None,
            &Flags {
                nodes: Some(24),
                gbps: Some(80.0),
                generations: Some(vec!["EDR".into()]),
                ..Flags::default()
            },
        )
        .unwrap();
        let c = candidates(&req)
            .into_iter()
            .find(|c| c.leaf_model.as_deref() == Some("EDR-36"))
            .unwrap();
        let r = build(&c).unwrap();
        let a = analyse(&r, c.endpoints).unwrap();
        assert_eq!(a.slots, 23, "{a:?}");
        let e = estimate(&req, &c, a.slots).unwrap();
        let s = simulate(&req, &c).unwrap();
        assert_eq!((s.slots, s.lower_bound), (a.slots, a.lower_bound));
        assert!(s.steady, "{s:?}");
        assert!(s.rotations >= 4.0, "{s:?}");
        let ratio = s.gbps_per_node / e.gbps_per_node;
        assert!(
            (0.9..1.1).contains(&ratio),
            "sim {s:?} against estimate {e:?}"
        );
        assert!(s.gbps_per_node < 100.0);
    }
}
