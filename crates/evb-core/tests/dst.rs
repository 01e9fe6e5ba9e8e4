//! Deterministic simulation testing: random event-builder configurations,
//! each under many network seeds (random latencies, per-connection order
//! kept), with invariants checked on every run. A failing case prints its
//! configuration and seed and replays exactly.

use evb_core::config::{Config, EmPlacement, LocalTraffic, Protocol, Schedule};
use evb_core::harness::Harness;
use evb_core::Outcome;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// A random valid configuration, derived from `case`.
fn random_config(case: u64) -> Config {
    let mut rng = Pcg64Mcg::seed_from_u64(case);
    let mut c = Config::default();
    c.run.seed = rng.gen();
    c.nodes.count = rng.gen_range(1..=7);
    let n = c.nodes.count;
    // Some nodes RU-only or BU-only, keeping at least one of each unit.
    if n >= 3 && rng.gen_bool(0.3) {
        c.nodes.ru_only = vec![0];
        c.nodes.bu_only = vec![n - 1];
    }
    if rng.gen_bool(0.3) {
        c.nodes.em = EmPlacement::Separate;
    }
    let (rus, bus) = c.unit_counts();
    c.event_builder.protocol = if rng.gen_bool(0.5) {
        Protocol::Push
    } else {
        Protocol::Pull
    };
    c.event_builder.schedule = [
        Schedule::Barrel,
        Schedule::BarrelSkip,
        Schedule::Random,
        Schedule::All,
    ][rng.gen_range(0..4)];
    c.event_builder.local = if rng.gen_bool(0.5) {
        LocalTraffic::Memory
    } else {
        LocalTraffic::Nic
    };
    c.event_builder.credits = rng.gen_range(1..=4);
    let peers = if c.event_builder.protocol == Protocol::Push {
        bus
    } else {
        rus
    };
    c.event_builder.parallel_sends = rng.gen_range(1..=peers as u32);
    c.source.events_per_mep = rng.gen_range(1..=32);
    c.run.max_meps = rng.gen_range(1..=60);
    c
}

#[test]
fn invariants_hold_over_thousands_of_runs() {
    let mut runs = 0;
    for case in 0..250u64 {
        let config = random_config(case);
        for seed in 0..8u64 {
            let report = Harness::new(config.clone(), seed).run(None, 600_000_000_000);
            let what = format!("case {case} seed {seed}: {config:?}");
            let meps = config.run.max_meps;
            assert!(report.all_done, "not all nodes finished: {what}");
            assert_eq!(report.meps_assigned, meps, "{what}");
            // Every MEP built exactly once, nothing else happened to any.
            assert_eq!(
                report.built.len() as u64,
                meps,
                "{what}: outcomes {:?}",
                report.outcomes
            );
            assert!(report.built.values().all(|&n| n == 1), "{what}");
            assert!(
                report.outcomes.values().all(|o| *o == Outcome::Built),
                "{what}"
            );
            assert!(
                report.max_outstanding <= config.event_builder.credits,
                "{what}"
            );
            // Accounting adds up on the BUs.
            let events: u64 = report
                .stats
                .iter()
                .filter_map(|s| s.bu.as_ref())
                .map(|b| b.events_built)
                .sum();
            assert_eq!(
                events,
                meps * u64::from(config.source.events_per_mep),
                "{what}"
            );
            let dropped: u64 = report
                .stats
                .iter()
                .filter_map(|s| s.bu.as_ref())
                .map(|b| b.fragments_duplicate + b.fragments_unexpected + b.fragments_corrupt)
                .sum();
            assert_eq!(dropped, 0, "{what}");
            assert!(
                report.stats.iter().all(|s| s.control_rejected == 0),
                "{what}"
            );
            runs += 1;
        }
    }
    assert_eq!(runs, 2000);
}

#[test]
fn faults_are_always_accounted_for() {
    for case in 0..150u64 {
        let mut config = random_config(1000 + case);
        config.event_builder.batch_timeout_ms = 5;
        let rus = config.unit_counts().0 as u16;
        let meps = config.run.max_meps;
        for seed in 0..4u64 {
            let mut h = Harness::new(config.clone(), seed);
            let mut rng = Pcg64Mcg::seed_from_u64(case * 31 + seed);
            let corrupt_mep = rng.gen_range(0..meps);
            let corrupt_src = rng.gen_range(0..rus);
            h.faults.corrupt.insert((corrupt_mep, corrupt_src));
            let silent = (rus > 1 && rng.gen_bool(0.3)).then(|| rng.gen_range(0..rus));
            if let Some(s) = silent {
                h.faults.silent_sources.insert(s);
            }
            let report = h.run(None, 600_000_000_000);
            let what = format!("case {case} seed {seed}: silent {silent:?}, corrupt ({corrupt_mep}, {corrupt_src}): {config:?}");
            assert!(report.all_done, "{what}");
            // Every MEP has exactly one outcome and none is built twice.
            assert_eq!(report.outcomes.len() as u64, meps, "{what}");
            assert!(report.built.values().all(|&n| n == 1), "{what}");
            let bu = |f| report.bu_total(f);
            let epm = u64::from(config.source.events_per_mep);
            assert_eq!(
                bu(|b| b.events_built) + bu(|b| b.events_incomplete) + bu(|b| b.events_corrupt),
                meps * epm,
                "{what}"
            );
            match silent {
                Some(s) => {
                    // Nothing can be complete without source s.
                    assert!(report.built.is_empty(), "{what}");
                    for o in report.outcomes.values() {
                        match o {
                            // PUSH: everyone else delivered. PULL: a silent
                            // source stalls the BU's request slots, so others
                            // may not have been asked in time; it is always named.
                            Outcome::Incomplete { missing }
                                if config.event_builder.protocol == Protocol::Push =>
                            {
                                assert_eq!(missing, &vec![s], "{what}")
                            }
                            Outcome::Incomplete { missing } => {
                                assert!(missing.contains(&s), "{what}")
                            }
                            other => panic!("{what}: {other:?}"),
                        }
                    }
                }
                None => {
                    assert_eq!(
                        report.outcomes[&corrupt_mep],
                        Outcome::Corrupt {
                            sources: vec![corrupt_src]
                        },
                        "{what}"
                    );
                    assert_eq!(report.built.len() as u64, meps - 1, "{what}");
                }
            }
        }
    }
}

#[test]
fn a_node_dying_is_survived_and_accounted_for() {
    let mut checked = 0;
    let mut detected = 0;
    for case in 0..300u64 {
        let mut config = random_config(5000 + case);
        config.event_builder.batch_timeout_ms = 5;
        config.run.max_meps = 80;
        let layout = evb_core::Layout::from_config(&config);
        // Any node but the EM's may die; needs a BU left standing.
        let candidates: Vec<u16> = (0..layout.nodes)
            .filter(|&n| n != layout.em)
            .filter(|&n| layout.bu_nodes.iter().any(|&b| b != n))
            .filter(|&n| layout.ru_nodes.iter().any(|&r| r != n))
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let mut rng = Pcg64Mcg::seed_from_u64(case);
        let victim = candidates[rng.gen_range(0..candidates.len())];
        for seed in 0..3u64 {
            let mut h = Harness::new(config.clone(), seed);
            let crash_at = rng.gen_range(0..400_000);
            h.faults.crash = Some((victim, crash_at));
            h.faults.detection_ns = 1_000_000;
            let report = h.run(None, 600_000_000_000);
            let what = format!("case {case} seed {seed}: node {victim} dies: {config:?}");
            assert!(report.all_done, "survivors must finish: {what}");
            assert!(report.built.values().all(|&n| n == 1), "{what}");
            let em = report.stats[layout.em as usize].em.clone().unwrap();
            assert_eq!(em.meps_assigned, 80, "the run goes on: {what}");
            // Exact accounting at the EM: every MEP has one fate.
            assert_eq!(
                em.meps_built + em.meps_incomplete + em.meps_corrupt + em.meps_lost_bu_gone,
                em.meps_assigned,
                "{what}: {em:?}"
            );
            assert_eq!(em.meps_built, report.built.len() as u64, "{what}");
            // Only what was in flight around the death can be missing.
            let in_flight = u64::from(config.event_builder.credits) * layout.bus() as u64;
            assert!(em.meps_built + 2 * in_flight >= 80, "{what}: {em:?}");
            let victim_is_bu = layout.bu_of[victim as usize].is_some();
            let victim_is_ru = layout.ru_of[victim as usize].is_some();
            if report.end_time >= crash_at + 1_000_000 {
                // The death happened during the run and was noticed.
                assert_eq!(em.bus_lost.contains(&victim), victim_is_bu, "{what}");
                assert_eq!(em.rus_lost.contains(&victim), victim_is_ru, "{what}");
                detected += 1;
            }
            checked += 1;
        }
    }
    assert!(checked > 500, "only {checked} runs");
    assert!(
        detected > checked / 2,
        "only {detected} of {checked} deaths during the run"
    );
}
