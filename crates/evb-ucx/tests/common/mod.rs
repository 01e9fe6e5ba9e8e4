//! Helpers shared by the integration tests: opening endpoints, pumping them
//! with a deadline, and a watchdog so that no test can hang.
#![allow(dead_code)]

use evb_ucx::{Completion, Endpoint, Options, Progress};
use std::time::{Duration, Instant};

/// Aborts the whole test process if the test is still running after `limit`:
/// a hang inside UCX cannot be interrupted any other way.
pub use evb_testkit::process::watchdog;

pub fn opts(tls: Option<&str>, progress: Progress) -> Options {
    Options {
        tls: tls.map(str::to_string),
        progress,
        ..Options::default()
    }
}

pub fn open(tls: Option<&str>) -> Endpoint {
    Endpoint::open(&opts(tls, Progress::Blocking))
        .unwrap_or_else(|e| panic!("open UCX endpoint (tls {tls:?}): {e}"))
}

/// Connects every endpoint to every other one; peers[i][j] is i's PeerId for j.
pub fn connect_all(eps: &mut [Endpoint]) -> Vec<Vec<usize>> {
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.local_address()).collect();
    eps.iter_mut()
        .enumerate()
        .map(|(i, ep)| {
            addrs
                .iter()
                .enumerate()
                .map(|(j, a)| {
                    if i == j {
                        usize::MAX
                    } else {
                        ep.add_peer(a).expect("add_peer")
                    }
                })
                .collect()
        })
        .collect()
}

/// A recognisable payload: byte k of message (sender, seq) depends on all three.
pub fn pattern(sender: u64, seq: u64, len: usize) -> Vec<u8> {
    let seed = sender.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    (0..len)
        .map(|k| (seed >> ((k % 8) * 8)) as u8 ^ (k / 8) as u8)
        .collect()
}

/// Message header used by the tests: sender id, sequence number, total length.
pub fn head(sender: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(24);
    h.extend_from_slice(&sender.to_le_bytes());
    h.extend_from_slice(&seq.to_le_bytes());
    h.extend_from_slice(&(len as u64).to_le_bytes());
    h
}

/// Checks one received message built with head() + pattern(); returns (sender, seq).
pub fn check_message(buf: &[u8], tag: u64) -> (u64, u64) {
    assert!(
        buf.len() >= 24,
        "message of {} bytes has no test header",
        buf.len()
    );
    let sender = u64::from_le_bytes(buf[0..8].try_into().unwrap());
    let seq = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let len = u64::from_le_bytes(buf[16..24].try_into().unwrap()) as usize;
    assert_eq!(tag, sender, "tag is not the sender's id");
    assert_eq!(buf.len(), 24 + len, "length of message {seq} from {sender}");
    assert!(
        buf[24..] == pattern(sender, seq, len)[..],
        "content of message {seq} from {sender} ({len} bytes) differs"
    );
    (sender, seq)
}

/// Progresses all endpoints (waiting on the first when idle) until `done`
/// says so; panics with `what` if `limit` passes first.
pub fn pump(
    eps: &mut [Endpoint],
    limit: Duration,
    what: &str,
    mut on: impl FnMut(usize, Completion, &mut Endpoint),
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        let mut any = false;
        for (i, ep) in eps.iter_mut().enumerate() {
            ep.progress(&mut out).expect("progress");
            any |= !out.is_empty();
            for c in out.drain(..) {
                on(i, c, ep);
            }
        }
        if !any && eps.len() == 1 {
            eps[0].wait(Duration::from_millis(10)).expect("wait");
        }
    }
}

/// Progresses every endpoint once: messages received (checked, the buffer
/// posted again) go to `got` as (endpoint, sender, seq), joins to `joins`
/// as (endpoint, peer, source).
pub fn step(
    eps: &mut [Endpoint],
    size: usize,
    got: &mut Vec<(usize, u64, u64)>,
    joins: &mut Vec<(usize, usize, u64)>,
) {
    let mut out = Vec::new();
    for (i, ep) in eps.iter_mut().enumerate() {
        ep.progress(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::Received { buf, tag, .. } => {
                    let (sender, seq) = check_message(&buf, tag);
                    got.push((i, sender, seq));
                    ep.post_recv(Vec::with_capacity(24 + size)).unwrap();
                }
                Completion::PeerJoined { peer, source } => joins.push((i, peer, source)),
                Completion::Sent { .. } => {}
                other => panic!("endpoint {i}: unexpected {other:?}"),
            }
        }
    }
}
