//! Rejoin over tcp;ofi_rxm: a new incarnation of a sender joins a live
//! endpoint, which then hands out only the new incarnation's messages, in
//! order from its first.

mod common;
use common::*;
use evb_ofi::{Completion, Endpoint, Options, Progress};
use evb_testkit::relink::new_link;

const S: usize = 0;
const OLD: usize = 1;
const NEW: usize = 2;
/// The endpoints of the relink test; their sources are the same numbers.
const LOW: usize = 0;
const HIGH: usize = 1;

fn open_rejoin() -> Endpoint {
    let mut opts = Options::new("tcp");
    opts.domain = Some("lo".into());
    opts.progress = Progress::Blocking;
    opts.source_mask = 0xff;
    Endpoint::open(&opts).expect("open tcp;ofi_rxm")
}

/// Progresses every endpoint once: messages received (checked, the buffer
/// posted again) go to `got` as (endpoint, sender, seq), joins to `joins`
/// as (endpoint, peer, source).
fn step(
    eps: &mut [Endpoint],
    got: &mut Vec<(usize, u64, u64)>,
    joins: &mut Vec<(usize, usize, u64)>,
) {
    let mut out = Vec::new();
    for (i, ep) in eps.iter_mut().enumerate() {
        ep.progress(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::Received { buf, tag, .. } => {
                    let (from, seq) = check_message(&buf, None);
                    assert_eq!(from, tag, "tag is the sender");
                    got.push((i, from, seq));
                    ep.post_recv(buf).unwrap();
                }
                Completion::PeerJoined { peer, source } => joins.push((i, peer, source)),
                Completion::Sent { .. } => {}
                other => panic!("endpoint {i}: unexpected {other:?}"),
            }
        }
    }
}

/// Sends one test message (retrying while the library says "try again").
#[allow(clippy::too_many_arguments)]
fn send(
    eps: &mut [Endpoint],
    from: usize,
    peer: usize,
    tag: u64,
    seq: u64,
    len: usize,
    got: &mut Vec<(usize, u64, u64)>,
    joins: &mut Vec<(usize, usize, u64)>,
) {
    let deadline = Deadline::new(30, "a send");
    loop {
        let (head, body, range) = make_message(tag, seq, len);
        if eps[from]
            .send(peer, tag, head, Some((body, range)), seq)
            .unwrap()
        {
            return;
        }
        deadline.check();
        step(eps, got, joins);
    }
}

/// The old incarnation of sender 1 still runs and sends after the new one
/// joined: all of that is dropped as stale, the new one's messages arrive
/// from their first, and both directions of the new link work.
#[test]
fn a_new_incarnation_joins_and_the_old_ones_messages_are_dropped() {
    let mut eps: Vec<Endpoint> = (0..3).map(|_| open_rejoin()).collect();
    eps[S].enable_rejoin(0);
    let s_addr = eps[S].local_address();
    let old_addr = eps[OLD].local_address();
    let s_to_old = eps[S].add_peer(&old_addr).unwrap();
    let old_to_s = eps[OLD].add_peer(&s_addr).unwrap();
    for ep in eps.iter_mut() {
        for _ in 0..8 {
            ep.post_recv(Vec::with_capacity(evb_ofi::DEFAULT_MAX_MESSAGE))
                .unwrap();
        }
    }
    let (mut got, mut joins) = (Vec::new(), Vec::new());
    for seq in 0..4 {
        let len = 100 + seq as usize * 40_000;
        send(&mut eps, OLD, old_to_s, 1, seq, len, &mut got, &mut joins);
    }
    let deadline = Deadline::new(30, "the old incarnation's messages");
    while got.len() < 4 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    assert_eq!(got, (0..4).map(|s| (S, 1, s)).collect::<Vec<_>>());
    got.clear();

    eps[NEW].enable_rejoin(1);
    let new_to_s = eps[NEW].add_peer_rejoining(&s_addr).unwrap();
    let deadline = Deadline::new(30, "the joins");
    while joins.len() < 2 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    let s_to_new = joins
        .iter()
        .find(|j| j.0 == S)
        .map(|j| j.1)
        .expect("the survivor reports the join");
    assert_ne!(s_to_new, s_to_old);
    assert!(joins.contains(&(S, s_to_new, 1)), "{joins:?}");
    assert!(joins.contains(&(NEW, new_to_s, 0)), "{joins:?}");

    for seq in 4..8 {
        let len = 100 + seq as usize * 40_000;
        send(&mut eps, OLD, old_to_s, 1, seq, len, &mut got, &mut joins);
    }
    for seq in 0..6 {
        let len = 50 + seq as usize * 30_000;
        send(
            &mut eps,
            NEW,
            new_to_s,
            1,
            100 + seq,
            len,
            &mut got,
            &mut joins,
        );
    }
    send(&mut eps, S, s_to_new, 0, 7, 300, &mut got, &mut joins);
    let deadline = Deadline::new(30, "the new incarnation's messages");
    while got.len() < 7 || eps[S].stale_dropped() < 4 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    let at_s: Vec<u64> = got.iter().filter(|g| g.0 == S).map(|g| g.2).collect();
    assert_eq!(
        at_s,
        (100..106).collect::<Vec<_>>(),
        "only the new one's, in order"
    );
    assert!(got.contains(&(NEW, 0, 7)), "{got:?}");
    assert_eq!(eps[S].stale_dropped(), 4);
}

/// Relink: two live endpoints re-establish a link both gave up (a stop, a
/// cut cable). Only the higher source asks (a RELINK, under a new epoch
/// for the lower's messages); what the old link still delivers is dropped
/// and the new link's messages arrive in order from their first, both ways.
#[test]
fn the_higher_source_relinks_and_the_old_links_messages_are_dropped() {
    let mut eps: Vec<Endpoint> = (0..2).map(|_| open_rejoin()).collect();
    eps[LOW].enable_rejoin(LOW as u64);
    eps[HIGH].enable_rejoin(HIGH as u64);
    let low_addr = eps[LOW].local_address();
    let high_addr = eps[HIGH].local_address();
    let low_to_high = eps[LOW].add_peer(&high_addr).unwrap();
    let high_to_low = eps[HIGH].add_peer(&low_addr).unwrap();
    for ep in eps.iter_mut() {
        for _ in 0..8 {
            ep.post_recv(Vec::with_capacity(evb_ofi::DEFAULT_MAX_MESSAGE))
                .unwrap();
        }
    }
    let (mut got, mut joins) = (Vec::new(), Vec::new());
    send(&mut eps, LOW, low_to_high, 0, 1, 100, &mut got, &mut joins);
    send(
        &mut eps,
        HIGH,
        high_to_low,
        1,
        2,
        40_000,
        &mut got,
        &mut joins,
    );
    let deadline = Deadline::new(30, "the first messages");
    while got.len() < 2 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    got.sort();
    assert_eq!(got, vec![(LOW, 1, 2), (HIGH, 0, 1)]);
    got.clear();

    // LOW sends on the old link; before HIGH reads any of it, both give
    // the link up and ask for it again: only HIGH's request goes out.
    for seq in 10..14 {
        let len = 100 + (seq - 10) as usize * 40_000;
        send(
            &mut eps,
            LOW,
            low_to_high,
            0,
            seq,
            len,
            &mut got,
            &mut joins,
        );
    }
    eps[LOW].progress(&mut Vec::new()).unwrap();
    eps[LOW].relink(low_to_high, HIGH as u64).unwrap();
    eps[HIGH].relink(high_to_low, LOW as u64).unwrap();
    let deadline = Deadline::new(30, "the relink");
    while joins.len() < 2 || eps[HIGH].stale_dropped() < 4 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    assert!(
        got.is_empty(),
        "the old link's messages are dropped: {got:?}"
    );
    assert_eq!(eps[HIGH].stale_dropped(), 4);
    let (low_to_high2, high_to_low2) = new_link(&joins, (LOW, HIGH), (low_to_high, high_to_low));

    // The new link both ways, in order from its first message; one more
    // old-link message from LOW after the relink is dropped too.
    send(&mut eps, LOW, low_to_high, 0, 99, 300, &mut got, &mut joins);
    for seq in 100..106 {
        let len = 50 + (seq - 100) as usize * 30_000;
        send(
            &mut eps,
            LOW,
            low_to_high2,
            0,
            seq,
            len,
            &mut got,
            &mut joins,
        );
        let len = 70 + (seq - 100) as usize * 35_000;
        send(
            &mut eps,
            HIGH,
            high_to_low2,
            1,
            seq + 100,
            len,
            &mut got,
            &mut joins,
        );
    }
    let deadline = Deadline::new(30, "the new link's messages");
    while got.len() < 12 || eps[HIGH].stale_dropped() < 5 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    let at = |e: usize| -> Vec<u64> { got.iter().filter(|g| g.0 == e).map(|g| g.2).collect() };
    assert_eq!(at(HIGH), (100..106).collect::<Vec<_>>());
    assert_eq!(at(LOW), (200..206).collect::<Vec<_>>());
    assert_eq!(joins.len(), 2, "no second relink: {joins:?}");
}

/// A restarted endpoint asks a dead peer (its process gone: tcp;ofi_rxm
/// says "try again" to its address for ever) before a live one: the live
/// one still takes it back at once, both ways. With one queue for every
/// peer's JOINs and answers, the JOIN to the dead peer held the others
/// behind it for ever (`evb chaos -t ofi:tcp --seed 2` hung: a consumer
/// restarted while a node was dead was taken back by none of the others).
#[test]
fn a_dead_peer_asked_first_holds_up_no_other_join() {
    let dead_addr = {
        let dead = open_rejoin();
        dead.local_address()
    };
    let mut eps: Vec<Endpoint> = (0..2).map(|_| open_rejoin()).collect();
    eps[S].enable_rejoin(0);
    let s_addr = eps[S].local_address();
    for ep in eps.iter_mut() {
        for _ in 0..8 {
            ep.post_recv(Vec::with_capacity(evb_ofi::DEFAULT_MAX_MESSAGE))
                .unwrap();
        }
    }
    let (mut got, mut joins) = (Vec::new(), Vec::new());
    let new = 1;
    eps[new].enable_rejoin(1);
    let _to_dead = eps[new].add_peer_rejoining(&dead_addr).unwrap();
    let new_to_s = eps[new].add_peer_rejoining(&s_addr).unwrap();
    let deadline = Deadline::new(10, "the live peer's join behind the dead one's");
    while joins.len() < 2 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    let s_to_new = joins
        .iter()
        .find(|j| j.0 == S)
        .map(|j| j.1)
        .expect("the live peer reports the join");
    assert!(joins.contains(&(new, new_to_s, 0)), "{joins:?}");
    send(&mut eps, new, new_to_s, 1, 1, 100, &mut got, &mut joins);
    send(&mut eps, S, s_to_new, 0, 2, 40_000, &mut got, &mut joins);
    let deadline = Deadline::new(10, "messages both ways");
    while got.len() < 2 {
        deadline.check();
        step(&mut eps, &mut got, &mut joins);
    }
    got.sort();
    assert_eq!(got, vec![(S, 1, 1), (new, 0, 2)]);
}
