//! Two endpoints in one process: every size from 64 B to 4 MiB, both
//! directions, content and order verified; for TCP, shared memory and UCX's default.

mod common;
use common::*;
use evb_ucx::{Completion, Endpoint};
use std::rc::Rc;
use std::time::Duration;

fn exchange_all_sizes(tls: Option<&str>, peer_failure_detection: bool) {
    let _dog = watchdog("exchange_all_sizes", Duration::from_secs(120));
    let o = evb_ucx::Options {
        peer_failure_detection,
        ..opts(tls, evb_ucx::Progress::Blocking)
    };
    let mut eps = vec![Endpoint::open(&o).unwrap(), Endpoint::open(&o).unwrap()];
    let peers = connect_all(&mut eps);
    let sizes: Vec<usize> = (6..=22).map(|p| 1usize << p).collect();
    let max = 24 + *sizes.last().unwrap();
    for ep in eps.iter_mut() {
        for _ in 0..4 {
            ep.post_recv(Vec::with_capacity(max)).unwrap();
        }
    }
    // Each side sends every size 3 times: head (24 B) + body slice of a shared buffer.
    let rounds = 3;
    let mut to_send: Vec<Vec<(u64, usize)>> = vec![Vec::new(); 2];
    for list in to_send.iter_mut() {
        let mut seq = 0;
        for _ in 0..rounds {
            for &s in &sizes {
                list.push((seq, s));
                seq += 1;
            }
        }
        list.reverse(); // pop() from the end = in order
    }
    let total = rounds * sizes.len();
    let mut received = [0u64; 2];
    let mut sent_ok = [0usize; 2];
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut out = Vec::new();
    while received.iter().any(|&r| r < total as u64) || sent_ok.iter().any(|&s| s < total) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out: received {received:?}, sent {sent_ok:?}"
        );
        for i in 0..2 {
            if let Some(&(seq, size)) = to_send[i].last() {
                // The body is a slice in the middle of a shared buffer.
                let body = Rc::new({
                    let mut b = vec![0xAAu8; 8];
                    b.extend_from_slice(&pattern(i as u64, seq, size));
                    b.extend_from_slice(&[0xBB; 8]);
                    b
                });
                if eps[i]
                    .send(
                        peers[i][1 - i],
                        i as u64,
                        head(i as u64, seq, size),
                        Some((body, 8..8 + size)),
                        seq,
                    )
                    .unwrap()
                {
                    to_send[i].pop();
                }
            }
            eps[i].progress(&mut out).unwrap();
            for c in out.drain(..) {
                match c {
                    Completion::Received { buf, len, tag } => {
                        assert_eq!(len, buf.len());
                        let (sender, seq) = check_message(&buf, tag);
                        assert_eq!(sender, 1 - i as u64);
                        assert_eq!(seq, received[i], "out of order");
                        received[i] += 1;
                        eps[i].post_recv(buf).unwrap();
                    }
                    Completion::Sent { .. } => sent_ok[i] += 1,
                    other => panic!("unexpected completion {other:?}"),
                }
            }
        }
    }
    for ep in &eps {
        assert_eq!(ep.outstanding_sends(), 0);
    }
}

#[test]
fn all_sizes_tcp() {
    exchange_all_sizes(Some("tcp"), true);
}

#[test]
fn all_sizes_shared_memory() {
    exchange_all_sizes(Some("posix,sysv,cma,self"), false);
}

#[test]
fn all_sizes_ucx_default() {
    exchange_all_sizes(None, true);
}

#[test]
fn missing_transport_lists_available_ones() {
    let err = match Endpoint::open(&opts(Some("rc,ud"), evb_ucx::Progress::Blocking)) {
        Ok(_) => panic!("opening with UCX_TLS=rc,ud succeeded on a machine without InfiniBand"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("`rc`"),
        "error does not name the transport: {err}"
    );
    assert!(err.contains("tcp ("), "error does not list tcp: {err}");
    assert!(
        err.contains("posix (memory)"),
        "error does not list shared memory: {err}"
    );
    let err = Endpoint::open(&opts(Some("tcp,nosuchtl"), evb_ucx::Progress::Blocking))
        .err()
        .expect("bogus transport accepted")
        .to_string();
    assert!(
        err.contains("`nosuchtl`") && err.contains("available: "),
        "{err}"
    );
}
