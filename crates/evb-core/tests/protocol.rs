//! Protocol tests over the in-memory network: every event built exactly
//! once, credits never exceeded, barrel order, determinism, and the
//! handling of corrupt and missing fragments.

use evb_core::config::{Config, EmPlacement, LocalTraffic, Protocol, Schedule};
use evb_core::harness::Harness;
use evb_core::layout::Layout;
use evb_core::ru::{ReadoutUnit, RuAction};
use evb_core::{FragmentHeader, Outcome};

fn config(protocol: Protocol, schedule: Schedule, local: LocalTraffic) -> Config {
    let mut c = Config::default();
    c.nodes.count = 4;
    c.run.max_meps = 300;
    c.source.events_per_mep = 16;
    c.event_builder.protocol = protocol;
    c.event_builder.schedule = schedule;
    c.event_builder.local = local;
    c.event_builder.credits = 3;
    c.event_builder.parallel_sends = 2;
    c
}

const SECOND: u64 = 1_000_000_000;

#[test]
fn every_event_built_exactly_once_in_every_mode() {
    for protocol in [Protocol::Push, Protocol::Pull] {
        for schedule in [
            Schedule::Barrel,
            Schedule::BarrelSkip,
            Schedule::Random,
            Schedule::All,
        ] {
            for local in [LocalTraffic::Memory, LocalTraffic::Nic] {
                for seed in 0..3 {
                    let c = config(protocol, schedule, local);
                    let report = Harness::new(c.clone(), seed).run(None, 60 * SECOND);
                    let what = format!("{protocol:?} {schedule:?} {local:?} seed {seed}");
                    assert!(report.all_done, "{what}: not all nodes finished");
                    assert_eq!(report.meps_assigned, 300, "{what}");
                    assert_eq!(
                        report.built.len(),
                        300,
                        "{what}: built {}",
                        report.built.len()
                    );
                    assert!(
                        report.built.values().all(|&n| n == 1),
                        "{what}: a MEP built twice"
                    );
                    assert!(report.built.keys().copied().eq(0..300), "{what}");
                    assert!(
                        report.max_outstanding <= c.event_builder.credits,
                        "{what}: {} batches outstanding on one BU, credits {}",
                        report.max_outstanding,
                        c.event_builder.credits
                    );
                    assert_eq!(
                        report.max_outstanding, c.event_builder.credits,
                        "{what}: credits unused"
                    );
                }
            }
        }
    }
}

#[test]
fn split_roles_and_separate_em() {
    let mut c = config(Protocol::Push, Schedule::Barrel, LocalTraffic::Memory);
    c.nodes.count = 5;
    c.nodes.ru_only = vec![0, 1];
    c.nodes.bu_only = vec![4];
    c.nodes.em = EmPlacement::Separate;
    for protocol in [Protocol::Push, Protocol::Pull] {
        c.event_builder.protocol = protocol;
        let report = Harness::new(c.clone(), 7).run(None, 60 * SECOND);
        assert!(report.all_done);
        assert_eq!(report.built.len(), 300, "{protocol:?}");
        // BUs are nodes 2, 3, 4; RUs 0..=3; the EM is endpoint 5.
        let layout = Layout::from_config(&c);
        assert_eq!(layout.bu_nodes, vec![2, 3, 4]);
        assert_eq!(layout.ru_nodes, vec![0, 1, 2, 3]);
        assert_eq!(layout.em, 5);
        for (ru, dests) in &report.send_order {
            assert!(layout.ru_of[*ru as usize].is_some());
            assert!(dests.iter().all(|d| layout.bu_nodes.contains(d)));
        }
    }
}

#[test]
fn stops_on_time_and_drains() {
    let mut c = config(Protocol::Push, Schedule::Barrel, LocalTraffic::Memory);
    c.run.max_meps = 0;
    let report = Harness::new(c, 1).run(Some(SECOND / 100), 60 * SECOND);
    assert!(report.all_done);
    assert!(report.meps_assigned > 10);
    assert_eq!(report.built.len() as u64, report.meps_assigned);
}

#[test]
fn same_seed_same_actions() {
    for schedule in [Schedule::Barrel, Schedule::Random] {
        let c = config(Protocol::Push, schedule, LocalTraffic::Nic);
        let a = Harness::new(c.clone(), 42).run(None, 60 * SECOND);
        let b = Harness::new(c.clone(), 42).run(None, 60 * SECOND);
        assert!(a.log.len() > 1000);
        assert_eq!(a.log, b.log);
        let other = Harness::new(c, 43).run(None, 60 * SECOND);
        assert_ne!(a.log, other.log, "the network seed should change timing");
    }
    // The random schedule depends on the configured seed.
    let mut c = config(Protocol::Push, Schedule::Random, LocalTraffic::Nic);
    let a = Harness::new(c.clone(), 42).run(None, 60 * SECOND);
    c.run.seed = 99;
    let b = Harness::new(c, 42).run(None, 60 * SECOND);
    assert_ne!(a.send_order, b.send_order);
}

#[test]
fn corrupt_fragment_is_counted_and_not_built() {
    for protocol in [Protocol::Push, Protocol::Pull] {
        for local in [LocalTraffic::Memory, LocalTraffic::Nic] {
            let c = config(protocol, Schedule::Barrel, local);
            let mut h = Harness::new(c, 3);
            h.faults.corrupt.insert((17, 2));
            h.faults.corrupt.insert((18, 0));
            let report = h.run(None, 60 * SECOND);
            assert!(report.all_done);
            assert_eq!(report.built.len(), 298, "{protocol:?} {local:?}");
            assert_eq!(report.outcomes[&17], Outcome::Corrupt { sources: vec![2] });
            assert_eq!(report.outcomes[&18], Outcome::Corrupt { sources: vec![0] });
            let bu = |f| report.bu_total(f);
            assert_eq!(bu(|b| b.fragments_corrupt), 2);
            assert_eq!(bu(|b| b.batches_corrupt), 2);
            assert_eq!(bu(|b| b.events_corrupt), 32);
            assert_eq!(bu(|b| b.events_built), 298 * 16);
        }
    }
}

#[test]
fn missing_source_times_out_naming_the_source() {
    let mut c = config(Protocol::Push, Schedule::Barrel, LocalTraffic::Memory);
    c.run.max_meps = 20;
    c.event_builder.batch_timeout_ms = 50;
    let mut h = Harness::new(c, 5);
    h.faults.silent_sources.insert(1);
    let report = h.run(None, 60 * SECOND);
    assert!(report.all_done);
    assert_eq!(report.built.len(), 0);
    assert_eq!(report.outcomes.len(), 20);
    for outcome in report.outcomes.values() {
        assert_eq!(outcome, &Outcome::Incomplete { missing: vec![1] });
    }
    let missing: Vec<u64> =
        report
            .stats
            .iter()
            .filter_map(|s| s.bu.as_ref())
            .fold(vec![0; 4], |mut acc, b| {
                for (a, m) in acc.iter_mut().zip(&b.missing_by_source) {
                    *a += m;
                }
                acc
            });
    assert_eq!(missing, vec![0, 20, 0, 0]);
    // Each batch waited for its timeout before it was given up.
    assert!(report.end_time >= 50_000_000);
}

/// Runs one RU with `parallel_sends = 1`: MEP m is assigned to BU m mod 5
/// and its data becomes ready in `ready_order`; returns the destinations in
/// the order sent.
fn barrel_sends(schedule: Schedule, source: u16, ready_order: &[u64]) -> Vec<u16> {
    let mut c = config(Protocol::Push, schedule, LocalTraffic::Nic);
    c.nodes.count = 5;
    c.event_builder.parallel_sends = 1;
    let layout = Layout::from_config(&c);
    let mut ru = ReadoutUnit::new(&c, &layout, source);
    let mut out = Vec::new();
    for &mep in ready_order {
        ru.on_assign(mep, (mep % 5) as u16, &mut out);
    }
    for &mep in ready_order {
        let h = FragmentHeader {
            mep,
            source,
            event_count: 16,
            payload_len: 64,
            ..Default::default()
        };
        ru.on_mep_ready(h, &mut out);
    }
    let mut order = Vec::new();
    loop {
        let sent: Vec<_> = out
            .drain(..)
            .filter_map(|a| match a {
                RuAction::Send { to, header } => Some((to, header.mep)),
                _ => None,
            })
            .collect();
        if sent.is_empty() {
            break;
        }
        assert_eq!(sent.len(), 1, "parallel_sends = 1");
        order.push(sent[0].0);
        ru.on_send_complete(sent[0].1, &mut out);
    }
    assert_eq!(ru.stats.max_in_flight, 1);
    order
}

#[test]
fn barrel_order_is_i_plus_n_mod_n() {
    for schedule in [Schedule::Barrel, Schedule::BarrelSkip] {
        for source in 0..5u16 {
            // Data for the phase-0 destination first: a clean shift.
            let ready: Vec<u64> = (0..10).map(|k| (u64::from(source) + k) % 10).collect();
            let expected: Vec<u16> = (0..10).map(|n| (source + n) % 5).collect();
            assert_eq!(
                barrel_sends(schedule, source, &ready),
                expected,
                "{schedule:?} RU {source}"
            );
        }
    }
    // Only MEP 0 (for BU 0) is ready at first. Phase-locked, RU 2 waits for
    // its phase-0 MEP (BU 2) and keeps the shift exactly.
    let ready: Vec<u64> = (0..10).collect();
    assert_eq!(
        barrel_sends(Schedule::Barrel, 2, &ready),
        vec![2, 3, 4, 0, 1, 2, 3, 4, 0, 1]
    );
    // Never waiting, it ships MEP 0 out of turn, then resumes its own
    // phases (2, 3, 4, 0, 1, ...) rather than following BU 0.
    assert_eq!(
        barrel_sends(Schedule::BarrelSkip, 2, &ready),
        vec![0, 2, 3, 4, 0, 1, 2, 3, 4, 1]
    );
}

/// Found by reading the code: an Abandon under PUSH took a queued MEP out
/// of the RU's table but not out of its send queue, and the next send
/// panicked. It is now refused and counted.
#[test]
fn abandon_under_push_is_refused() {
    let c = config(Protocol::Push, Schedule::All, LocalTraffic::Nic);
    let layout = Layout::from_config(&c);
    let mut ru = ReadoutUnit::new(&c, &layout, 0);
    let mut out = Vec::new();
    for mep in 0..4 {
        ru.on_assign(mep, 1, &mut out);
        ru.on_mep_ready(
            FragmentHeader {
                mep,
                payload_len: 64,
                ..Default::default()
            },
            &mut out,
        );
    }
    ru.on_abandon(3, 1, &mut out);
    assert_eq!(ru.stats.requests_unexpected, 1);
    // Everything still ships.
    let mut sent = 0;
    for _ in 0..10 {
        let meps: Vec<u64> = out
            .drain(..)
            .filter_map(|a| match a {
                RuAction::Send { header, .. } => Some(header.mep),
                _ => None,
            })
            .collect();
        sent += meps.len();
        for m in meps {
            ru.on_send_complete(m, &mut out);
        }
    }
    assert_eq!(sent, 4);
}

/// PULL: a request that overtook the assignment but came from another BU
/// than the one assigned is not honoured.
#[test]
fn early_request_from_the_wrong_bu_is_dropped() {
    let c = config(Protocol::Pull, Schedule::Barrel, LocalTraffic::Nic);
    let layout = Layout::from_config(&c);
    let mut ru = ReadoutUnit::new(&c, &layout, 0);
    let mut out = Vec::new();
    ru.on_request(5, 2, &mut out);
    ru.on_assign(5, 1, &mut out);
    ru.on_mep_ready(
        FragmentHeader {
            mep: 5,
            payload_len: 64,
            ..Default::default()
        },
        &mut out,
    );
    assert!(
        !out.iter().any(|a| matches!(a, RuAction::Send { .. })),
        "{out:?}"
    );
    assert_eq!(ru.stats.requests_unexpected, 1);
    // The assigned BU's own request is served.
    ru.on_request(5, 1, &mut out);
    assert!(
        out.iter()
            .any(|a| matches!(a, RuAction::Send { to: 1, .. })),
        "{out:?}"
    );
}

/// PUSH: fragments opened a provisional batch that timed out before its
/// assignment arrived. The late assignment must still reach the EM as a
/// finished (incomplete) MEP, or the EM would wait for it and the BU lose
/// a credit.
#[test]
fn a_late_assignment_of_a_given_up_batch_is_reported() {
    use evb_core::bu::{Admit, BuAction, BuilderUnit};
    let mut c = config(Protocol::Push, Schedule::Barrel, LocalTraffic::Nic);
    c.event_builder.batch_timeout_ms = 1;
    let layout = Layout::from_config(&c);
    let mut bu = BuilderUnit::new(&c, &layout, 1);
    let mut out = Vec::new();
    let h = FragmentHeader {
        run_id: 1,
        source: 0,
        mep: 9,
        event_count: 16,
        payload_len: 64,
        ..Default::default()
    };
    assert_eq!(bu.admit(0, 0, &h), Admit::Keep);
    bu.on_fragment(0, &h, 0, &mut out);
    bu.on_timeout(2_000_000, &mut out);
    assert!(
        out.iter().all(|a| !matches!(a, BuAction::Finished { .. })),
        "not ours yet: {out:?}"
    );
    out.clear();
    bu.on_assign(3_000_000, 9, &mut out);
    assert!(
        out.contains(&BuAction::Finished {
            mep: 9,
            outcome: evb_core::wire::outcome::INCOMPLETE
        }),
        "{out:?}"
    );
    assert_eq!(bu.stats.batches_incomplete, 1);
    // A second copy of the assignment changes nothing.
    out.clear();
    bu.on_assign(3_000_001, 9, &mut out);
    assert!(out.is_empty());
}

/// The EM re-admits a rejoined node: its RU from the next MEP on, told to
/// the live BUs before any assignment that includes it; its BU only once
/// it grants credits, told which sources are still down.
#[test]
fn em_readmits_a_rejoined_node_at_a_mep_boundary() {
    use evb_core::em::EventManager;
    use evb_core::wire::Message;
    let c = config(Protocol::Push, Schedule::Barrel, LocalTraffic::Memory);
    let layout = Layout::from_config(&c);
    let mut em = EventManager::new(&layout, 0);
    let mut out = Vec::new();
    for b in 0..4 {
        em.on_credit(b, 2, &mut out);
    }
    out.clear();
    em.on_node_lost(2, &layout, &mut out);
    em.on_node_lost(3, &layout, &mut out);
    assert!(out.contains(&(
        0,
        Message::SourceDown {
            source: 2,
            from_mep: 8
        }
    )));
    out.clear();
    // Node 2 comes back: BUs 0 and 1 (live) hear SourceUp from MEP 8; the
    // rejoined BU hears that source 3 is down; nothing assigned to it yet.
    em.on_node_joined(2, &layout, &mut out);
    for bu in [0, 1] {
        assert!(
            out.contains(&(
                bu,
                Message::SourceUp {
                    source: 2,
                    from_mep: 8
                }
            )),
            "{out:?}"
        );
    }
    assert!(out.contains(&(
        2,
        Message::SourceDown {
            source: 3,
            from_mep: 0
        }
    )));
    assert!(!out
        .iter()
        .any(|(_, m)| !m.assignments(&layout.bu_nodes).is_empty()));
    assert_eq!(em.stats.rejoined, vec![2]);
    // It was lost with MEPs 4 and 5: they are named to it first.
    let revoked = |out: &[(u16, Message)]| -> Vec<u64> {
        out.iter()
            .filter_map(|(to, m)| match m {
                Message::Revoked { mep } if *to == 2 => Some(*mep),
                _ => None,
            })
            .collect()
    };
    assert_eq!(revoked(&out), vec![4, 5], "{out:?}");
    // A second join of a live node changes nothing but naming them again
    // (not acknowledged yet).
    out.clear();
    em.on_node_joined(2, &layout, &mut out);
    assert_eq!(revoked(&out), vec![4, 5], "{out:?}");
    assert_eq!(out.len(), 2, "{out:?}");
    out.clear();
    for mep in [4, 5] {
        em.on_revoked_ack(2, mep, &mut out);
    }
    // Credits: the rejoined BU gets MEPs, and its RU is in every Assign.
    em.on_credit(2, 1, &mut out);
    em.on_finished(0, 0, 0, &mut out);
    let assigns: Vec<_> = out
        .iter()
        .flat_map(|(to, m)| {
            m.assignments(&layout.bu_nodes)
                .into_iter()
                .map(move |(mep, bu)| (*to, mep, bu))
        })
        .collect();
    assert!(assigns.contains(&(2, 8, 2)), "{assigns:?}");
    let mep9_to: Vec<u16> = assigns.iter().filter(|a| a.1 == 9).map(|a| a.0).collect();
    assert!(mep9_to.contains(&2) && !mep9_to.contains(&3), "{assigns:?}");
}

/// A BU builds MEPs in a source's down range without it and expects it
/// again from its `SourceUp` on; junk SourceUp never panics.
#[test]
fn bu_expects_a_source_again_after_source_up() {
    use evb_core::bu::{BuAction, BuilderUnit};
    let c = config(Protocol::Push, Schedule::Barrel, LocalTraffic::Nic);
    let layout = Layout::from_config(&c);
    let mut bu = BuilderUnit::new(&c, &layout, 0);
    let mut out = Vec::new();
    bu.on_source_down(0, 3, 10, &mut out);
    bu.on_source_up(3, 20, &mut out);
    bu.on_source_up(3, 30, &mut out); // Not down any more: ignored.
    bu.on_source_up(999, 5, &mut out); // No such source.
    let fragment = |mep: u64, source: u16| FragmentHeader {
        run_id: c.run.run_id,
        mep,
        source,
        event_count: 16,
        payload_len: 64,
        crc32c: 7,
        ..Default::default()
    };
    let feed = |bu: &mut BuilderUnit, mep: u64, sources: &[u16], out: &mut Vec<BuAction>| {
        bu.on_assign(0, mep, out);
        for &s in sources {
            let h = fragment(mep, s);
            let from = layout.ru_nodes[s as usize];
            assert_eq!(
                bu.admit(0, from, &h),
                evb_core::bu::Admit::Keep,
                "{mep} {s}"
            );
            bu.on_fragment(0, &h, 7, out);
        }
    };
    let built = |out: &[BuAction], mep: u64| {
        out.iter().any(
            |a| matches!(a, BuAction::Finish { mep: m, outcome: Outcome::Built, .. } if *m == mep),
        )
    };
    feed(&mut bu, 5, &[0, 1, 2, 3], &mut out);
    assert!(built(&out, 5));
    feed(&mut bu, 15, &[0, 1, 2], &mut out);
    assert!(built(&out, 15), "built without the down source");
    feed(&mut bu, 25, &[0, 1, 2], &mut out);
    assert!(!built(&out, 25), "source 3 is expected again");
    let h = fragment(25, 3);
    assert_eq!(bu.admit(0, 3, &h), evb_core::bu::Admit::Keep);
    bu.on_fragment(0, &h, 7, &mut out);
    assert!(built(&out, 25));
}

/// A node that is done sends nothing more: its peers may have finished and
/// gone. (A slotted node kept probing the EM's clock after its Done; a
/// probe the EM never read, having left, held the node's finish for the
/// runtime's linger time, 5 s: one `evb run` in ten took twice as long and
/// reported half its throughput.)
#[test]
fn a_done_node_sends_nothing_more() {
    use evb_core::{Action, Message, Node};
    let c = config(Protocol::Push, Schedule::Slotted, LocalTraffic::Memory);
    let layout = Layout::from_config(&c);
    let id = (0..c.nodes.count).find(|&n| n != layout.em).unwrap();
    let mut node = Node::new(&c, &layout, id);
    // Carries out the node's actions, the EM answering its clock probes at
    // once; returns how many probes there were and whether it said Done.
    let answer = |node: &mut Node, t: u64| {
        let (mut probes, mut done) = (0, false);
        while let Some(a) = node.poll_action() {
            match a {
                Action::Send {
                    msg: Message::ClockProbe { sent },
                    ..
                } => {
                    probes += 1;
                    let reply = Message::ClockReply {
                        sent,
                        em_time: sent,
                    };
                    node.on_message(t, layout.em, reply);
                }
                Action::Done => done = true,
                _ => {}
            }
        }
        (probes, done)
    };
    node.start(0);
    let mut probes = answer(&mut node, 0).0;
    let mut t = 0;
    while probes < 3 {
        t = node.next_deadline().expect("the next probe");
        node.on_timeout(t);
        probes += answer(&mut node, t).0;
    }
    node.on_message(t, layout.em, Message::EndOfRun { meps: 0 });
    assert!(answer(&mut node, t).1 && node.is_done());
    // The EM is gone: whatever time passes, nothing is sent to it.
    for _ in 0..100 {
        t = node.next_deadline().unwrap_or(t + SECOND / 100).max(t + 1);
        node.on_timeout(t);
        if let Some(a) = node.poll_action() {
            panic!("at {t} ns, after its Done: {a:?}");
        }
    }
}

/// The header of a fragment of 16 events and `payload_len` bytes that
/// RU `source` produced for `mep`.
fn produced(c: &Config, mep: u64, source: u16, payload_len: u32) -> FragmentHeader {
    FragmentHeader {
        run_id: c.run.run_id,
        mep,
        source,
        event_count: 16,
        payload_len,
        ..Default::default()
    }
}

/// A clock probe that falls due while the RU's fragment is on the link
/// waits for the fragment's last byte to leave: sent behind the fragment,
/// the probe's way out would be longer than its answer's by the
/// fragment's time, and the offset off by half of it (at line rate tens
/// of microseconds, against a slot grace of 0.5). Its completion, a host
/// latency later, is not waited for: by then the next slot's fragment may
/// be on the link.
#[test]
fn a_due_clock_probe_waits_for_the_fragment_on_the_link() {
    use evb_core::{Action, Message, Node};
    let mut c = config(Protocol::Push, Schedule::Slotted, LocalTraffic::Nic);
    c.event_builder.clock = evb_core::config::ClockSource::Em;
    let layout = Layout::from_config(&c);
    let id = (0..c.nodes.count)
        .find(|&n| n != layout.em && layout.ru_of[n as usize].is_some())
        .unwrap();
    let source = layout.ru_of[id as usize].unwrap();
    let mut node = Node::new(&c, &layout, id);
    let slot = c.slot_ns();
    // Fragments three slots long on the wire.
    let payload = (3 * slot) as f64 * c.sim.link_gbps / 8.0;
    let wire_ns = |p: u32| (f64::from(p) * 8.0 / c.sim.link_gbps) as u64;
    // Carries out the node's actions at `t`: probes answered at once (an
    // EM whose clock agrees), data produced at once, fragments kept in
    // flight (with when they went). Returns the probes sent.
    let mut in_flight: Vec<(u64, u64)> = Vec::new();
    let step = |node: &mut Node, t: u64, in_flight: &mut Vec<(u64, u64)>| {
        let mut probes = 0;
        while let Some(a) = node.poll_action() {
            match a {
                Action::Send {
                    msg: Message::ClockProbe { sent },
                    ..
                } => {
                    probes += 1;
                    let reply = Message::ClockReply {
                        sent,
                        em_time: sent,
                    };
                    node.on_message(t, layout.em, reply);
                }
                Action::Produce { mep } => {
                    node.on_mep_ready(t, produced(&c, mep, source, payload as u32));
                }
                Action::SendFragment { header, .. } => in_flight.push((header.mep, t)),
                _ => {}
            }
        }
        probes
    };
    node.start(0);
    let mut t = 0;
    step(&mut node, t, &mut in_flight);
    while !node.clock().unwrap().is_settled() {
        t = node.next_deadline().expect("the burst's next probe");
        node.on_timeout(t);
        step(&mut node, t, &mut in_flight);
    }
    let due = node
        .clock()
        .unwrap()
        .next_deadline()
        .expect("a probe later");
    assert!(
        due > t + 4 * slot,
        "the burst is over: the next probe is a fast one (the skew is not known yet), not the burst's"
    );
    // Two slots before the probe is due, MEPs are assigned: the RU ships
    // the first at the next slot's start, and it is on the link at `due`.
    t = due - 2 * slot;
    let assign = Message::AssignRun {
        first: 0,
        count: 4,
        first_bu: 0,
    };
    node.on_message(t, layout.em, assign);
    assert_eq!(step(&mut node, t, &mut in_flight), 0);
    while t < due {
        t = node.next_deadline().expect("slots").min(due);
        node.on_timeout(t);
        assert_eq!(step(&mut node, t, &mut in_flight), 0, "at {t}, due {due}");
    }
    let (_, went) = *in_flight.first().expect("a fragment went");
    let leaves = went + wire_ns(payload as u32);
    assert!(leaves > due, "the fragment is on the link at {due}");
    assert!(
        node.next_deadline().unwrap() > due,
        "the due probe does not wake the node while the link is busy"
    );
    // The probe goes once the fragment's last byte is expected to have
    // left, before its completion comes back.
    let mut probes = 0;
    while probes == 0 {
        t = node.next_deadline().expect("the probe's wait");
        assert!(
            t <= leaves + slot / 10,
            "at {t}: the fragment left at {leaves}"
        );
        node.on_timeout(t);
        probes = step(&mut node, t, &mut in_flight);
    }
    assert!(
        t >= leaves,
        "sent at {t}, behind the fragment leaving at {leaves}"
    );
    assert_eq!(probes, 1);
}

/// The EM answers a clock probe that comes while its own node's fragment
/// is on the link once the fragment has left, with its time then, and
/// gives back the probe's `sent` moved on by the wait: the prober's round
/// trip is the network's alone and its midpoint falls where the EM read
/// its clock (NTP's four timestamps in two). Answered at once, the answer
/// would queue behind the fragment, off by half its time.
#[test]
fn the_em_answers_a_probe_once_its_fragment_has_left() {
    use evb_core::{Action, Message, Node};
    let mut c = config(Protocol::Push, Schedule::Slotted, LocalTraffic::Nic);
    c.event_builder.clock = evb_core::config::ClockSource::Em;
    let layout = Layout::from_config(&c);
    let em = layout.em;
    let source = layout.ru_of[em as usize].expect("the EM's node has an RU");
    let prober = (0..c.nodes.count).find(|&n| n != em).unwrap();
    let mut node = Node::new(&c, &layout, em);
    let slot = c.slot_ns();
    let payload = (3 * slot) as f64 * c.sim.link_gbps / 8.0;
    // Carries out the node's actions at `t`: assignments to itself and
    // data produced at once; returns the fragments it sent and its answers.
    let step = |node: &mut Node, t: u64| {
        let (mut sent, mut replies) = (Vec::new(), Vec::new());
        while let Some(a) = node.poll_action() {
            match a {
                Action::Produce { mep } => {
                    node.on_mep_ready(t, produced(&c, mep, source, payload as u32));
                }
                Action::SendFragment { header, .. } => sent.push(header.mep),
                Action::Send {
                    msg: m @ Message::ClockReply { .. },
                    to,
                } => {
                    assert_eq!(to, prober);
                    replies.push(m);
                }
                _ => {}
            }
        }
        (sent, replies)
    };
    node.start(0);
    let mut t = 0;
    let went = loop {
        let (sent, _) = step(&mut node, t);
        if !sent.is_empty() {
            break t;
        }
        t = node.next_deadline().expect("the EM assigns, its RU ships");
        node.on_timeout(t);
    };
    // A probe a microsecond after the fragment went.
    t = went + 1_000;
    let probe_sent = 777;
    node.on_message(t, prober, Message::ClockProbe { sent: probe_sent });
    let came = t;
    assert!(
        step(&mut node, t).1.is_empty(),
        "not answered behind the fragment"
    );
    let replies = loop {
        t = node.next_deadline().expect("the held answer's time");
        assert!(t < went + 4 * slot, "held for ever: {t}");
        node.on_timeout(t);
        let (_, replies) = step(&mut node, t);
        if !replies.is_empty() {
            break replies;
        }
    };
    assert!(
        t >= went + 2 * slot,
        "answered at {t}, the fragment left at ~{}",
        went + 3 * slot
    );
    assert_eq!(
        replies,
        vec![Message::ClockReply {
            sent: probe_sent + (t - came),
            em_time: t
        }]
    );
}
