//! Relink: two live endpoints re-establish a link one of them gave up (a
//! stop, a cut cable). The higher source asks with a RELINK from a new UCP
//! endpoint; what the old link still delivers is dropped in both
//! directions and the new link's messages arrive in order from their first.

mod common;
use common::*;
use evb_testkit::relink::new_link;
use evb_ucx::{Endpoint, Options, Progress};
use std::rc::Rc;
use std::time::{Duration, Instant};

fn relink_opts() -> Options {
    Options {
        source_mask: 0xff,
        ..opts(Some("tcp"), Progress::Blocking)
    }
}

/// Endpoint indices in the test; their sources are the same numbers.
const LOW: usize = 0;
const HIGH: usize = 1;

#[test]
fn the_higher_source_relinks_and_the_old_links_messages_are_dropped() {
    let _dog = watchdog(
        "the_higher_source_relinks_and_the_old_links_messages_are_dropped",
        Duration::from_secs(90),
    );
    let o = relink_opts();
    let mut eps: Vec<Endpoint> = (0..2).map(|_| Endpoint::open(&o).unwrap()).collect();
    eps[LOW].enable_rejoin(LOW as u64);
    eps[HIGH].enable_rejoin(HIGH as u64);
    let low_addr = eps[LOW].local_address();
    let high_addr = eps[HIGH].local_address();
    let low_to_high = eps[LOW].add_peer(&high_addr).unwrap();
    let high_to_low = eps[HIGH].add_peer(&low_addr).unwrap();
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
    // The link works both ways.
    send(&mut eps[LOW], low_to_high, 0, 1, 100);
    send(&mut eps[HIGH], high_to_low, 1, 2, 40_000);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "first messages: {got:?}");
        step(&mut eps, size, &mut got, &mut joins);
    }
    got.sort();
    assert_eq!(got, vec![(LOW, 1, 2), (HIGH, 0, 1)]);
    got.clear();

    // LOW sends on the old link; before HIGH reads any of it, both give
    // the link up and ask for it again: only HIGH's request goes out.
    for seq in 10..14 {
        send(
            &mut eps[LOW],
            low_to_high,
            0,
            seq,
            100 + (seq - 10) as usize * 60_000,
        );
    }
    eps[LOW].progress(&mut Vec::new()).unwrap();
    eps[LOW].relink(low_to_high, HIGH as u64).unwrap();
    eps[HIGH].relink(high_to_low, LOW as u64).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while joins.len() < 2 || eps[HIGH].stale_dropped() < 4 {
        assert!(
            Instant::now() < deadline,
            "joins {joins:?}, got {got:?}, stale at HIGH {}",
            eps[HIGH].stale_dropped()
        );
        step(&mut eps, size, &mut got, &mut joins);
    }
    assert!(
        got.is_empty(),
        "the old link's messages are dropped: {got:?}"
    );
    assert_eq!(eps[HIGH].stale_dropped(), 4);
    let (low_to_high2, high_to_low2) = new_link(&joins, (LOW, HIGH), (low_to_high, high_to_low));

    // The new link, both ways, in order from its first message; one more
    // old-link message from LOW after the relink is dropped too.
    send(&mut eps[LOW], low_to_high, 0, 99, 300);
    for seq in 100..106 {
        send(
            &mut eps[LOW],
            low_to_high2,
            0,
            seq,
            50 + (seq - 100) as usize * 40_000,
        );
        send(
            &mut eps[HIGH],
            high_to_low2,
            1,
            seq + 100,
            70 + (seq - 100) as usize * 45_000,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 12 || eps[HIGH].stale_dropped() < 5 {
        assert!(
            Instant::now() < deadline,
            "got {got:?}, stale at HIGH {}",
            eps[HIGH].stale_dropped()
        );
        step(&mut eps, size, &mut got, &mut joins);
    }
    let at = |e: usize| -> Vec<u64> { got.iter().filter(|g| g.0 == e).map(|g| g.2).collect() };
    assert_eq!(at(HIGH), (100..106).collect::<Vec<_>>());
    assert_eq!(at(LOW), (200..206).collect::<Vec<_>>());
    assert_eq!(joins.len(), 2, "no second relink: {joins:?}");
}
