//! Rejoin: a new incarnation of a sender joins a live endpoint, which then
//! hands out only the new incarnation's messages, in order from its first.

mod common;
use common::*;
use evb_ucx::{Endpoint, Options, Progress};
use std::rc::Rc;
use std::time::{Duration, Instant};

fn rejoin_opts() -> Options {
    Options {
        source_mask: 0xff,
        ..opts(Some("tcp"), Progress::Blocking)
    }
}

const S: usize = 0;
const OLD: usize = 1;
const NEW: usize = 2;

/// The old incarnation of sender 1 is still running and sending after the
/// new one joined (the worst case: the runtime lets the old one die before
/// the restart): everything it sends from then on is dropped as stale, the
/// new one's messages arrive from their first, and both directions of the
/// new link work.
#[test]
fn a_new_incarnation_joins_and_the_old_ones_messages_are_dropped() {
    let _dog = watchdog(
        "a_new_incarnation_joins_and_the_old_ones_messages_are_dropped",
        Duration::from_secs(90),
    );
    let o = rejoin_opts();
    let mut eps: Vec<Endpoint> = (0..3).map(|_| Endpoint::open(&o).unwrap()).collect();
    eps[S].enable_rejoin(0);
    let s_addr = eps[S].local_address();
    let old_addr = eps[OLD].local_address();
    let s_to_old = eps[S].add_peer(&old_addr).unwrap();
    let old_to_s = eps[OLD].add_peer(&s_addr).unwrap();
    let size = 256 * 1024;
    for ep in eps.iter_mut() {
        for _ in 0..8 {
            ep.post_recv(Vec::with_capacity(24 + size)).unwrap();
        }
    }
    let mut got: Vec<(usize, u64, u64)> = Vec::new();
    let mut joins: Vec<(usize, usize, u64)> = Vec::new();
    let send = |ep: &mut Endpoint, peer: usize, tag: u64, seq: u64, len: usize| {
        let body = Rc::new(pattern(tag, seq, len));
        assert!(ep
            .send(peer, tag, head(tag, seq, len), Some((body, 0..len)), seq)
            .unwrap());
    };
    // The old incarnation's first messages (eager and rendezvous sizes).
    for seq in 0..4 {
        send(&mut eps[OLD], old_to_s, 1, seq, 100 + seq as usize * 20_000);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 4 {
        assert!(Instant::now() < deadline, "old messages: {got:?}");
        step(&mut eps, size, &mut got, &mut joins);
    }
    assert_eq!(
        got,
        (0..4).map(|s| (S, 1, s)).collect::<Vec<_>>(),
        "in order"
    );
    got.clear();

    // The new incarnation of sender 1 asks to be taken back.
    eps[NEW].enable_rejoin(1);
    let new_to_s = eps[NEW].add_peer_rejoining(&s_addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while joins.len() < 2 {
        assert!(Instant::now() < deadline, "joins: {joins:?}");
        step(&mut eps, size, &mut got, &mut joins);
    }
    let s_to_new = joins
        .iter()
        .find(|j| j.0 == S)
        .map(|j| j.1)
        .expect("the survivor reports the join");
    assert_ne!(s_to_new, s_to_old);
    assert!(joins.contains(&(S, s_to_new, 1)), "{joins:?}");
    assert!(joins.contains(&(NEW, new_to_s, 0)), "{joins:?}");

    // Both incarnations send; the survivor answers the new one.
    for seq in 4..8 {
        send(&mut eps[OLD], old_to_s, 1, seq, 100 + seq as usize * 20_000);
    }
    for seq in 0..6 {
        send(
            &mut eps[NEW],
            new_to_s,
            1,
            100 + seq,
            50 + seq as usize * 15_000,
        );
    }
    send(&mut eps[S], s_to_new, 0, 7, 300);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 7 || eps[S].stale_dropped() < 4 {
        assert!(
            Instant::now() < deadline,
            "got {got:?}, stale {}",
            eps[S].stale_dropped()
        );
        step(&mut eps, size, &mut got, &mut joins);
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
