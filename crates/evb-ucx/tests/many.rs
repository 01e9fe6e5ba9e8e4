//! Four endpoints all-to-all in one process: thousands of messages of mixed
//! sizes (eager and rendezvous), every one verified for content, sender tag
//! and per-sender order.

mod common;
use common::*;
use evb_ucx::{Completion, Endpoint, Options, Progress};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Deterministic mixed sizes: mostly small, some up to 256 KiB.
fn size_of(sender: usize, seq: u64) -> usize {
    let x = (seq.wrapping_mul(2_654_435_761) ^ (sender as u64 * 97)) % 100;
    match x {
        0..=59 => (x as usize * 37) % 2048,
        60..=89 => 4096 + (x as usize * 1013) % 60_000,
        _ => 65_536 + (x as usize * 7919) % 196_608,
    }
}

fn all_to_all(o: &Options, n: usize, per_pair: u64) {
    let mut eps: Vec<Endpoint> = (0..n).map(|_| Endpoint::open(o).expect("open")).collect();
    let peers = connect_all(&mut eps);
    let max = 24 + 65_536 + 196_608;
    for ep in eps.iter_mut() {
        for _ in 0..16 {
            ep.post_recv(Vec::with_capacity(max)).unwrap();
        }
    }
    // next_seq[i][j]: next message i sends to j; expect[j][i]: next seq j expects from i.
    let mut next_seq = vec![vec![0u64; n]; n];
    let mut expect = vec![vec![0u64; n]; n];
    let mut sent = vec![0u64; n];
    let total_per_sender = per_pair * (n as u64 - 1);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut out = Vec::new();
    let mut retries = 0u64;
    loop {
        let received: u64 = expect.iter().flatten().sum();
        if received == total_per_sender * n as u64 && sent.iter().all(|&s| s == total_per_sender) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timed out: received {received} of {}",
            total_per_sender * n as u64
        );
        for i in 0..n {
            // Round-robin over destinations, a few sends per turn.
            for j in (0..n).filter(|&j| j != i) {
                let seq = next_seq[i][j];
                if seq == per_pair {
                    continue;
                }
                // The sequence number in the message is per (sender, receiver) pair.
                let size = size_of(i, seq);
                let body = Rc::new(pattern(i as u64, seq, size));
                if eps[i]
                    .send(
                        peers[i][j],
                        i as u64,
                        head(i as u64, seq, size),
                        Some((body, 0..size)),
                        seq,
                    )
                    .unwrap()
                {
                    next_seq[i][j] += 1;
                } else {
                    retries += 1;
                }
            }
            eps[i].progress(&mut out).unwrap();
            for c in out.drain(..) {
                match c {
                    Completion::Received { buf, tag, .. } => {
                        let (sender, seq) = check_message(&buf, tag);
                        assert_eq!(
                            seq, expect[i][sender as usize],
                            "order from {sender} to {i}"
                        );
                        expect[i][sender as usize] += 1;
                        eps[i].post_recv(buf).unwrap();
                    }
                    Completion::Sent { .. } => sent[i] += 1,
                    other => panic!("endpoint {i}: unexpected {other:?}"),
                }
            }
        }
    }
    eprintln!(
        "{n} endpoints, {} messages verified, {retries} try-again answers",
        total_per_sender * n as u64
    );
}

#[test]
fn four_endpoints_all_to_all_tcp() {
    let _dog = watchdog("four_endpoints_all_to_all_tcp", Duration::from_secs(150));
    all_to_all(&opts(Some("tcp"), Progress::Blocking), 4, 1000);
}

#[test]
fn four_endpoints_all_to_all_shared_memory_busy() {
    let _dog = watchdog(
        "four_endpoints_all_to_all_shared_memory_busy",
        Duration::from_secs(150),
    );
    let o = Options {
        peer_failure_detection: false,
        max_outstanding_sends: 8,
        ..opts(Some("sm,self"), Progress::Busy)
    };
    all_to_all(&o, 4, 1000);
}
