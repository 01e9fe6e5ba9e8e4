//! The invariants of a chaos run, checked on what was watched during the
//! run and what it reported at its end, and each fault's effect: the
//! events lost in its window and the time the built rate took to come
//! back after it ended.

use std::collections::BTreeMap;

use evb_launch::RunResult;
use evb_store::ReadReport;
use serde::Serialize;

use crate::inject::Watched;
use crate::schedule::{Fault, Kind};

/// One broken invariant.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// The fault kind it is tied to, when it is tied to one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// The invariant broken ([`INVARIANTS`]).
    pub invariant: &'static str,
    pub what: String,
}

/// The invariants, the gravest first (shrinking keeps the gravest one a
/// failing run broke: `--shrink`).
pub const INVARIANTS: [&str; 8] = [
    "no-hang",
    "stored-once",
    "accounting",
    "max-lost",
    "comes-back",
    "metrics",
    "resources",
    "loss-explained",
];

fn violation(kind: Option<Kind>, what: String) -> Violation {
    let invariant = if what.contains("events lost or incomplete at") {
        "loss-explained"
    } else if what.starts_with("the run did not come back") {
        "comes-back"
    } else if what.starts_with("hang:")
        || what.contains("did not end by itself")
        || what.contains("exited with status")
        || what.starts_with("endpoints without a final report")
    {
        "no-hang"
    } else if what.starts_with("store") || what.starts_with("the store") {
        "stored-once"
    } else if what.contains("more than --max-lost") {
        "max-lost"
    } else if what.starts_with("metrics of endpoint") {
        "metrics"
    } else if what.contains("open descriptors") || what.contains("resident memory") {
        "resources"
    } else {
        "accounting"
    };
    Violation {
        kind,
        invariant,
        what,
    }
}

/// What one fault did.
#[derive(Debug, Clone, Serialize)]
pub struct FaultEffect {
    pub kind: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<u16>,
    pub at_s: f64,
    pub end_s: f64,
    /// The fault as `evb chaos --faults` spells it.
    pub spec: String,
    /// Events lost or incomplete in its window (from its start to
    /// `grace_s` after its end; a loss in the windows of several faults
    /// goes to the one that started last).
    pub events_lost: u64,
    /// Built events a second before it started (events/s).
    pub rate_before: f64,
    /// Seconds from its end until the built rate over the next second is
    /// back to 90 % of `rate_before`; none if it never was before the
    /// end of the run.
    pub recovery_s: Option<f64>,
    /// Another fault began before the rate came back (the recovery time
    /// is then an upper bound of this one's).
    pub overlapped: bool,
    /// The rate came back.
    pub survived: bool,
    /// Why it could not be done, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_done: Option<String>,
}

/// Bounds of the checks.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Seconds the run builds.
    pub duration_s: f64,
    /// Seconds after a fault's end in which a loss is still its own.
    pub grace_s: f64,
    /// Seconds after the run's end by which every process must have ended.
    pub end_bound_s: f64,
    /// Seconds before the first fault (the rate before any).
    pub warmup_s: f64,
    /// `--max-lost`: a fault that loses (or leaves incomplete) more events
    /// than this breaks an invariant of the user's.
    pub max_lost_per_fault: Option<u64>,
}

/// The built events at `t` (the latest sample at or before it).
fn built_at(series: &[(f64, u64, u64)], t: f64) -> u64 {
    let i = series.partition_point(|s| s.0 <= t);
    if i == 0 {
        0
    } else {
        series[i - 1].1
    }
}

fn rate(series: &[(f64, u64, u64)], a: f64, b: f64) -> f64 {
    (built_at(series, b).saturating_sub(built_at(series, a))) as f64 / (b - a)
}

/// The built rate over every `step` seconds until `end`: (end of the
/// step, events/s).
pub fn rate_series(series: &[(f64, u64, u64)], step: f64, end: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut t = step;
    while t <= end {
        out.push((
            (t * 100.0).round() / 100.0,
            rate(series, t - step, t).round(),
        ));
        t += step;
    }
    out
}

/// The run's invariants and every fault's effect.
pub fn evaluate(
    faults: &[Fault],
    watched: &Watched,
    run: &RunResult,
    store: Option<&Result<ReadReport, String>>,
    wall_s: f64,
    bounds: &Bounds,
) -> (Vec<FaultEffect>, Vec<Violation>) {
    let mut violations = Vec::new();
    let mut effects = effects(faults, watched, bounds);
    attribute_losses(faults, watched, run, bounds, &mut effects, &mut violations);
    check_max_lost(&effects, bounds, &mut violations);
    check_comes_back(faults, watched, bounds, &mut violations);
    check_accounting(run, &mut violations);
    check_processes(run, wall_s, bounds, &mut violations);
    check_resources(watched, &mut violations);
    check_metrics(faults, watched, &mut violations);
    if let Some(store) = store {
        check_store(store, &mut violations);
    }
    (effects, violations)
}

fn effects(faults: &[Fault], watched: &Watched, bounds: &Bounds) -> Vec<FaultEffect> {
    let series = &watched.series;
    let run_end = bounds.duration_s;
    let baseline = rate(series, 1.0, bounds.warmup_s.max(1.5));
    faults
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let at = watched.started.get(&i).copied().unwrap_or(f.at_s);
            let end = at + f.dur_s;
            // The rate before: the second before it, unless another fault
            // was in force then (the rate with nothing wrong, then).
            let disturbed = faults[..i].iter().any(|g| g.end_s() > at - 1.0);
            let before = if disturbed || at < 2.0 {
                baseline
            } else {
                rate(series, at - 1.0, at)
            };
            let mut recovery = None;
            let mut t = end;
            while before > 0.0 && t + 1.0 <= run_end + 1e-9 {
                if rate(series, t, t + 1.0) >= 0.9 * before {
                    recovery = Some(((t - end) * 100.0).round() / 100.0);
                    break;
                }
                t += 0.05;
            }
            let back = recovery.map_or(run_end, |r| end + r);
            let overlapped = faults
                .iter()
                .enumerate()
                .any(|(j, g)| j != i && g.at_s >= at && g.at_s <= back);
            let not_done = watched
                .not_done
                .iter()
                .find(|(g, _)| g == f)
                .map(|(_, why)| why.clone());
            FaultEffect {
                kind: f.kind,
                target: f.target,
                at_s: (at * 1000.0).round() / 1000.0,
                end_s: (end * 1000.0).round() / 1000.0,
                spec: f.to_string(),
                events_lost: 0,
                rate_before: before.round(),
                recovery_s: recovery,
                overlapped,
                survived: recovery.is_some(),
                not_done,
            }
        })
        .collect()
}

/// Faults that must lose nothing: a stranger, a bad handshake, lost
/// packets and a slow link (TCP retransmits, heartbeats still flow).
fn must_not_lose(kind: Kind) -> bool {
    kind.is_stranger() || matches!(kind, Kind::Loss | Kind::Rate)
}

/// Gives every loss to the fault whose window holds it; a loss in no
/// window is a violation, and so is one in the window of faults that must
/// lose nothing only.
fn attribute_losses(
    faults: &[Fault],
    watched: &Watched,
    run: &RunResult,
    bounds: &Bounds,
    effects: &mut [FaultEffect],
    violations: &mut Vec<Violation>,
) {
    let s = &run.summary;
    let mut steps: Vec<(f64, u64)> = watched
        .series
        .windows(2)
        .filter(|w| w[1].2 > w[0].2)
        .map(|w| (w[1].0, w[1].2 - w[0].2))
        .collect();
    let seen = watched.series.last().map_or(0, |l| l.2);
    let total = s.events_incomplete + s.events_lost;
    if total > seen {
        // Found at the end (the last reports). With the EM killed, what
        // the run's accounting lacks is known only then: MEPs its dead
        // incarnation handed out that no BU built or timed out (it
        // assigned them, the RUs read them out, and let them go when the
        // new EM came). That remainder is the EM kills' (the last one's);
        // without one, it is a loss at the end of the run.
        let remainder = s
            .events_lost
            .saturating_sub(s.events_lost_bu_gone + s.events_lost_no_bu)
            .min(total - seen);
        let last_em_kill = effects
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == Kind::KillEm)
            .max_by(|a, b| a.1.at_s.total_cmp(&b.1.at_s))
            .map(|(i, _)| i);
        let rest = match last_em_kill {
            Some(i) if remainder > 0 => {
                effects[i].events_lost += remainder;
                total - seen - remainder
            }
            _ => total - seen,
        };
        if rest > 0 {
            let last = watched.series.last().map_or(bounds.duration_s, |l| l.0);
            steps.push((last, rest));
        }
    }
    for (t, lost) in steps {
        let holder = effects
            .iter()
            .enumerate()
            .filter(|(_, e)| e.at_s <= t + 0.25 && t <= e.end_s + bounds.grace_s)
            .filter(|(_, e)| !must_not_lose(e.kind))
            .max_by(|a, b| a.1.at_s.total_cmp(&b.1.at_s))
            .map(|(i, _)| i);
        match holder {
            Some(i) => effects[i].events_lost += lost,
            None => {
                let near: Vec<String> = faults
                    .iter()
                    .filter(|f| f.at_s <= t + 0.25 && t <= f.end_s() + bounds.grace_s)
                    .map(ToString::to_string)
                    .collect();
                let (kind, why) = match near.first() {
                    Some(_) => (
                        faults
                            .iter()
                            .find(|f| f.to_string() == near[0])
                            .map(|f| f.kind),
                        format!(
                            "only faults that must lose nothing were in force: {}",
                            near.join(", ")
                        ),
                    ),
                    None => (None, "no fault in force".to_string()),
                };
                violations.push(violation(
                    kind,
                    format!("{lost} events lost or incomplete at {t:.2} s: {why}"),
                ));
            }
        }
    }
}

/// After the last fault the run builds again: over the second before its
/// last half second, at least half its rate over the second before the
/// first fault (not from the start: the readout's catch-up burst of the
/// first seconds is no rate a loaded machine keeps).
fn check_comes_back(
    faults: &[Fault],
    watched: &Watched,
    bounds: &Bounds,
    violations: &mut Vec<Violation>,
) {
    let series = &watched.series;
    let first = faults
        .iter()
        .map(|f| f.at_s)
        .fold(f64::INFINITY, f64::min)
        .min(bounds.duration_s - 1.0)
        .max(1.5);
    let before = rate(series, (first - 1.0).max(0.5), first);
    let end = bounds.duration_s - 0.5;
    let tail = rate(series, end - 1.0, end);
    if before > 0.0 && tail < 0.5 * before {
        let last = faults
            .iter()
            .filter(|f| f.end_s() < end)
            .max_by(|a, b| a.end_s().total_cmp(&b.end_s()));
        violations.push(violation(
            last.map(|f| f.kind),
            format!(
                "the run did not come back: {tail:.0} events/s built at the end against {before:.0} before the first fault (last fault {})",
                last.map_or("none".to_string(), ToString::to_string)
            ),
        ));
    }
}

fn check_accounting(run: &RunResult, violations: &mut Vec<Violation>) {
    let s = &run.summary;
    let fates = s.events_built + s.events_incomplete + s.events_corrupt;
    if fates > s.events_generated {
        violations.push(violation(
            None,
            format!(
                "accounting: built {} + incomplete {} + corrupt {} = {fates} > generated {} (something counted twice)",
                s.events_built, s.events_incomplete, s.events_corrupt, s.events_generated
            ),
        ));
    }
    // A MEP the EM took from a BU lost while alive is counted by its new
    // BU, or lost: the BU it was taken from counts it in none of its fates
    // (`batches_revoked`), and only what the EM named. (Known only while
    // the EM's counts cover the whole run.)
    if s.em_resumed_at_mep.is_none()
        && s.nodes_missing.is_empty()
        && s.batches_revoked > s.meps_revoked
    {
        violations.push(violation(
            None,
            format!(
                "accounting: the BUs took {} batches out of their counts as revoked, the EM revoked {} MEPs",
                s.batches_revoked, s.meps_revoked
            ),
        ));
    }
    if s.events_corrupt > 0 || s.fragments_corrupt > 0 {
        violations.push(violation(
            None,
            format!(
                "corrupt: {} events, {} fragments (no fault corrupts data)",
                s.events_corrupt, s.fragments_corrupt
            ),
        ));
    }
    if let Some(c) = &s.consumers {
        if c.batches_corrupt > 0 {
            violations.push(violation(
                None,
                format!("consumers received {} corrupt batches", c.batches_corrupt),
            ));
        }
        if c.batches_confirmed > c.batches_delivered {
            violations.push(violation(
                None,
                format!(
                    "consumers confirmed {} batches of {} delivered",
                    c.batches_confirmed, c.batches_delivered
                ),
            ));
        }
    }
}

fn check_processes(run: &RunResult, wall_s: f64, bounds: &Bounds, violations: &mut Vec<Violation>) {
    let over = wall_s - bounds.duration_s;
    if over > bounds.end_bound_s {
        violations.push(violation(
            None,
            format!(
                "hang: the run ended {over:.1} s after its {:.0} s, more than {:.0} s",
                bounds.duration_s, bounds.end_bound_s
            ),
        ));
    }
    for (rank, code) in run.node_exit_codes.iter().enumerate() {
        match code {
            Some(0) => {}
            Some(c) => violations.push(violation(
                None,
                format!("endpoint {rank} exited with status {c}"),
            )),
            None => violations.push(violation(
                None,
                format!("endpoint {rank} did not end by itself (killed by the launcher)"),
            )),
        }
    }
    if !run.summary.nodes_missing.is_empty() {
        violations.push(violation(
            None,
            format!(
                "endpoints without a final report: {:?}",
                run.summary.nodes_missing
            ),
        ));
    }
}

/// Memory and descriptors bounded: per endpoint, the peak of the last
/// third of the run at most the peak of the first third plus a margin
/// (a leak grows; a restarted process starts lower).
fn check_resources(watched: &Watched, violations: &mut Vec<Violation>) {
    for (rank, samples) in watched.resources.iter().enumerate() {
        if samples.len() < 9 {
            continue;
        }
        let third = samples.len() / 3;
        let peak = |s: &[(f64, u64, u64)]| {
            (
                s.iter().map(|x| x.1).max().unwrap_or(0),
                s.iter().map(|x| x.2).max().unwrap_or(0),
            )
        };
        let (fd0, rss0) = peak(&samples[..third]);
        let (fd2, rss2) = peak(&samples[samples.len() - third..]);
        if fd2 > fd0 + 32 + fd0 / 2 {
            violations.push(violation(
                None,
                format!("endpoint {rank}: open descriptors grew from at most {fd0} to {fd2}"),
            ));
        }
        if rss2 > rss0 + (256 << 20) + rss0 / 2 {
            violations.push(violation(
                None,
                format!(
                    "endpoint {rank}: resident memory grew from at most {} MiB to {} MiB",
                    rss0 >> 20,
                    rss2 >> 20
                ),
            ));
        }
    }
}

fn check_metrics(faults: &[Fault], watched: &Watched, violations: &mut Vec<Violation>) {
    for (t, rank, port, what) in &watched.metrics_failures {
        let active: Vec<Kind> = faults
            .iter()
            .filter(|f| f.at_s <= *t && *t <= f.end_s() + 0.5)
            .map(|f| f.kind)
            .collect();
        violations.push(violation(
            active.first().copied(),
            format!("metrics of endpoint {rank} (port {port}) at {t:.2} s: {what}; faults in force: {active:?}"),
        ));
    }
}

/// `--max-lost`: no fault lost more events than the user allows.
fn check_max_lost(effects: &[FaultEffect], bounds: &Bounds, violations: &mut Vec<Violation>) {
    let Some(max) = bounds.max_lost_per_fault else {
        return;
    };
    for e in effects.iter().filter(|e| e.events_lost > max) {
        violations.push(violation(
            Some(e.kind),
            format!(
                "{} lost {} events, more than --max-lost {max}",
                e.spec, e.events_lost
            ),
        ));
    }
}

/// Every object verifies and no MEP is stored twice.
fn check_store(store: &Result<ReadReport, String>, violations: &mut Vec<Violation>) {
    let report = match store {
        Ok(r) => r,
        Err(e) => {
            violations.push(violation(None, format!("the store cannot be read: {e}")));
            return;
        }
    };
    for bad in report.bad.iter().take(5) {
        violations.push(violation(
            None,
            format!("store: bad object {}: {}", bad.name, bad.reason),
        ));
    }
    let mut by_mep: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for o in &report.listed {
        by_mep.entry(o.mep).or_default().push(&o.name);
    }
    let twice: Vec<(u64, Vec<&str>)> = by_mep.into_iter().filter(|(_, v)| v.len() > 1).collect();
    if !twice.is_empty() {
        let shown: Vec<String> = twice
            .iter()
            .take(3)
            .map(|(m, names)| format!("MEP {m}: {}", names.join(" and ")))
            .collect();
        violations.push(violation(
            None,
            format!(
                "store: {} MEPs stored twice ({})",
                twice.len(),
                shown.join("; ")
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_read_off_the_staircase_of_samples() {
        let s = vec![(0.5, 100, 0), (1.0, 200, 0), (2.0, 400, 0)];
        assert_eq!(built_at(&s, 0.4), 0);
        assert_eq!(built_at(&s, 1.5), 200);
        assert_eq!(rate(&s, 1.0, 2.0), 200.0);
    }

    /// The BUs leave out of their counts only what the EM revoked: more
    /// breaks the accounting, unless the EM's counts do not cover the run
    /// (it was restarted: its dead incarnation's last report may be late).
    #[test]
    fn batches_revoked_beyond_the_ems_revocations_break_the_accounting() {
        let mut run = RunResult {
            evb_version: "",
            kind: "",
            config: evb_core::Config::default(),
            summary: evb_launch::summary::Summary::default(),
            nodes: Vec::new(),
            timeline: Vec::new(),
            node_exit_codes: Vec::new(),
        };
        run.summary.meps_revoked = 3;
        run.summary.batches_revoked = 3;
        let mut v = Vec::new();
        check_accounting(&run, &mut v);
        assert!(v.is_empty(), "{v:?}");
        run.summary.batches_revoked = 4;
        check_accounting(&run, &mut v);
        assert_eq!(
            v.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            ["accounting"]
        );
        v.clear();
        run.summary.em_resumed_at_mep = Some(10);
        check_accounting(&run, &mut v);
        assert!(v.is_empty(), "{v:?}");
    }
}
