//! A plan: every candidate evaluated (one fabric analysis per distinct
//! fabric, whatever its port rate), ranked, and the best simulated until
//! the simulation budget is spent, re-ranking after each round.
//!
//! Ranking: the designs that build what the requirement asks (by their
//! simulated rate where there is one, else their estimate) first, the
//! cheapest first; then the others, the fastest first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::cost::{self, Bill};
use crate::design::{candidates, Candidate};
use crate::evaluate::{self, Analysis, Estimate, SimOutcome};
use crate::requirement::Requirement;

/// A candidate, evaluated.
#[derive(Debug, Clone, Serialize)]
pub struct Design {
    pub candidate: Candidate,
    pub bill: Bill,
    pub bisection_gbps: f64,
    pub analysis: Analysis,
    pub estimate: Estimate,
    pub sim: Option<SimOutcome>,
}

impl Design {
    /// Gb/s built per node: simulated if it was and the run settled,
    /// else estimated.
    pub fn predicted(&self) -> f64 {
        match &self.sim {
            Some(s) if s.settled() => s.gbps_per_node,
            _ => self.estimate.gbps_per_node,
        }
    }
    /// Whether the prediction is a settled simulation's.
    pub fn simulated(&self) -> bool {
        self.sim.as_ref().is_some_and(|s| s.settled())
    }
    pub fn meets(&self, req: &Requirement) -> bool {
        self.predicted() >= req.gbps_per_node
    }
    /// What all nodes build, Tb/s.
    pub fn built_tbps(&self, req: &Requirement) -> f64 {
        self.predicted() * req.nodes as f64 / 1000.0
    }
    pub fn cost_per_tbps(&self, req: &Requirement) -> f64 {
        self.bill.total / self.built_tbps(req).max(1e-9)
    }
    /// Predicted over required, less one.
    pub fn margin(&self, req: &Requirement) -> f64 {
        self.predicted() / req.gbps_per_node - 1.0
    }
}

/// A candidate left out, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Dropped {
    pub name: String,
    pub spec: String,
    pub why: String,
}

/// Where the time went, seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timing {
    pub candidates: usize,
    pub fabrics_analysed: usize,
    pub analysis_wall_s: f64,
    pub simulations: usize,
    pub simulation_wall_s: f64,
    pub simulated_tbit: f64,
    pub threads: usize,
    pub total_s: f64,
}

/// The answer to a requirement.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub requirement: Requirement,
    /// Best first.
    pub designs: Vec<Design>,
    pub dropped: Vec<Dropped>,
    pub timing: Timing,
}

/// Runs `jobs` on `threads` threads, results in the jobs' order.
fn parallel<T: Send, R: Send>(threads: usize, jobs: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let jobs: Vec<Mutex<Option<T>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let results: Vec<Mutex<Option<R>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(jobs.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let job = job
                    .lock()
                    .expect("not poisoned")
                    .take()
                    .expect("taken once");
                *results[i].lock().expect("not poisoned") = Some(f(job));
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("not poisoned")
                .expect("every job ran")
        })
        .collect()
}

/// The fabric of a spec without its rates: candidates that differ only in
/// port rate have the same conflicts and schedule.
fn shape(spec: &str) -> String {
    spec.split(',')
        .filter(|p| !p.starts_with("gbps="))
        .collect::<Vec<_>>()
        .join(",")
}

/// Evaluates every candidate: one fabric analysis per shape, then each
/// candidate's bill, bisection and estimate.
fn evaluate_all(
    req: &Requirement,
    threads: usize,
    timing: &mut Timing,
) -> (Vec<Design>, Vec<Dropped>) {
    let all = candidates(req);
    timing.candidates = all.len();
    let t0 = Instant::now();
    let mut shapes: Vec<(String, Candidate)> = Vec::new();
    for c in &all {
        if !shapes.iter().any(|(s, _)| *s == shape(&c.spec)) {
            shapes.push((shape(&c.spec), c.clone()));
        }
    }
    timing.fabrics_analysed = shapes.len();
    // The largest first: the threads end together.
    shapes.sort_by_key(|(_, c)| std::cmp::Reverse(c.hosts));
    let analysed = parallel(threads, shapes, |(key, c)| {
        let r = evaluate::build(&c).and_then(|r| {
            let a = evaluate::analyse(&r, c.endpoints)?;
            Ok((r.topo, a))
        });
        (key, r.map_err(|e| format!("{e:#}")))
    });
    let by_shape: HashMap<String, _> = analysed.into_iter().collect();
    let (mut designs, mut dropped) = (Vec::new(), Vec::new());
    for c in all {
        let drop = |why: String| Dropped {
            name: c.name(),
            spec: c.spec.clone(),
            why,
        };
        match &by_shape[&shape(&c.spec)] {
            Err(e) => dropped.push(drop(e.clone())),
            Ok((topo, a)) => match evaluate::estimate(req, &c, a.slots) {
                Err(e) => dropped.push(drop(format!("{e:#}"))),
                Ok(estimate) => designs.push(Design {
                    bill: cost::bill(topo, &c, req),
                    bisection_gbps: cost::bisection_gbps(topo, &c),
                    analysis: a.clone(),
                    estimate,
                    sim: None,
                    candidate: c,
                }),
            },
        }
    }
    timing.analysis_wall_s = t0.elapsed().as_secs_f64();
    (designs, dropped)
}

/// Best first (see the module doc).
fn rank(designs: &mut [Design], req: &Requirement) {
    designs.sort_by(|a, b| {
        let (ma, mb) = (a.meets(req), b.meets(req));
        mb.cmp(&ma)
            .then_with(|| {
                if ma {
                    a.bill.total.total_cmp(&b.bill.total)
                } else {
                    b.predicted().total_cmp(&a.predicted())
                }
            })
            .then_with(|| b.simulated().cmp(&a.simulated()))
            .then_with(|| a.candidate.name().cmp(&b.candidate.name()))
    });
}

/// Simulates the best designs not simulated yet, `threads` at a time,
/// until the count or the budget is reached; designs of the same fabric
/// share a run.
fn simulate_best(req: &Requirement, designs: &mut [Design], threads: usize, timing: &mut Timing) {
    let budget = &req.simulate;
    let t0 = Instant::now();
    let mut done: HashMap<String, Result<SimOutcome, String>> = HashMap::new();
    loop {
        rank(designs, req);
        let mut batch: Vec<Candidate> = Vec::new();
        let mut planned = timing.simulated_tbit;
        // The cheapest fabric not simulated yet second: what the money
        // saved costs in rate is worth a simulation.
        let mut order: Vec<&Design> = designs.iter().collect();
        let best = order[0].candidate.spec.clone();
        let cheapest = (0..order.len())
            .filter(|&i| order[i].candidate.spec != best)
            .filter(|&i| !done.contains_key(&order[i].candidate.spec))
            .min_by(|&a, &b| order[a].bill.total.total_cmp(&order[b].bill.total));
        if let Some(i) = cheapest {
            let c = order.remove(i);
            order.insert(1.min(order.len()), c);
        }
        for d in order {
            let c = &d.candidate;
            let fresh = !done.contains_key(&c.spec) && !batch.iter().any(|b| b.spec == c.spec);
            if !fresh || done.len() + batch.len() >= budget.designs {
                continue;
            }
            // The first simulation runs even over the budget, but none
            // takes the total past twice the budget: a 2001-host fabric at
            // 400 Gb/s (11 Tbit) took 456 s here.
            let cost = evaluate::sim_tbit(c, d.estimate.sim_us);
            let first = done.is_empty() && batch.is_empty();
            if planned + cost > 2.0 * budget.budget_tbit
                || (planned + cost > budget.budget_tbit && !first)
            {
                continue;
            }
            planned += cost;
            batch.push(c.clone());
            if batch.len() == threads {
                break;
            }
        }
        if batch.is_empty() {
            break;
        }
        let runs = parallel(threads, batch.clone(), |c| {
            evaluate::simulate(req, &c).map_err(|e| format!("{e:#}"))
        });
        for (c, r) in batch.iter().zip(runs) {
            if let Ok(s) = &r {
                timing.simulated_tbit += s.tbit;
                timing.simulations += 1;
            }
            done.insert(c.spec.clone(), r);
        }
        for d in designs.iter_mut() {
            if let Some(Ok(s)) = done.get(&d.candidate.spec) {
                // The searched schedule the run used replaces the one
                // before the search; the estimate follows it.
                d.analysis.slots = s.slots;
                d.analysis.lower_bound = s.lower_bound;
                d.analysis.searched = true;
                if let Ok(e) = evaluate::estimate(req, &d.candidate, s.slots) {
                    d.estimate = e;
                }
                d.sim = Some(s.clone());
            }
        }
    }
    timing.simulation_wall_s = t0.elapsed().as_secs_f64();
    rank(designs, req);
}

/// The plan for `req`.
pub fn plan(req: &Requirement) -> Result<Plan> {
    let t0 = Instant::now();
    let threads = match req.simulate.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let mut timing = Timing {
        threads,
        ..Timing::default()
    };
    let (mut designs, dropped) = evaluate_all(req, threads, &mut timing);
    if designs.is_empty() {
        anyhow::bail!(
            "no design holds {} nodes with the generations and switches given ({} candidates, {} dropped{})",
            req.nodes,
            timing.candidates,
            dropped.len(),
            dropped.first().map_or(String::new(), |d| format!(": {}: {}", d.name, d.why))
        );
    }
    simulate_best(req, &mut designs, threads, &mut timing);
    timing.total_s = t0.elapsed().as_secs_f64();
    Ok(Plan {
        requirement: req.clone(),
        designs,
        dropped,
        timing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_drops_the_rate_only() {
        assert_eq!(
            shape("fat-tree:radix=32,hosts=100,spread,gbps=400"),
            "fat-tree:radix=32,hosts=100,spread"
        );
    }

    #[test]
    fn parallel_keeps_the_order() {
        let r = parallel(3, (0..20).collect(), |i: i32| i * 2);
        assert_eq!(r, (0..20).map(|i| i * 2).collect::<Vec<_>>());
    }
}
