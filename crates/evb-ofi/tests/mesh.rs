//! Many peers and flow control: four endpoints all-to-all with every message
//! verified; a slow receiver with few buffers; a provider that is not here.

mod common;
use common::*;
use evb_ofi::{Completion, Endpoint, Options};
use std::rc::Rc;
use std::time::{Duration, Instant};

const SMALL_MAX: usize = 64 * 1024;

fn open_small(provider: &str) -> Endpoint {
    let mut opts = Options::new(provider);
    opts.domain = Some("lo".into());
    opts.max_message = SMALL_MAX;
    Endpoint::open(&opts).unwrap_or_else(|e| panic!("prerequisite missing: {e}"))
}

#[test]
fn four_endpoints_all_to_all() {
    const N: usize = 4;
    const PER_PAIR: u64 = 1000;
    let mut eps: Vec<Endpoint> = (0..N).map(|_| open_small("tcp")).collect();
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.local_address()).collect();
    // peer ids[i][j]: endpoint i's id for endpoint j.
    let ids: Vec<Vec<usize>> = (0..N)
        .map(|i| {
            (0..N)
                .map(|j| eps[i].add_peer(&addrs[j]).unwrap())
                .collect()
        })
        .collect();
    for ep in eps.iter_mut() {
        for _ in 0..16 {
            ep.post_recv(Vec::with_capacity(SMALL_MAX)).unwrap();
        }
    }
    let deadline = Deadline::new(120, "all-to-all");
    // next[i][j]: next seq i sends to j; expect[j][i]: next seq j expects from i.
    let mut next = vec![vec![0u64; N]; N];
    let mut expect = vec![vec![0u64; N]; N];
    let mut received = 0u64;
    let total = (N * (N - 1)) as u64 * PER_PAIR;
    let mut sent_ok = 0u64;
    let mut outs: Vec<Vec<Completion>> = (0..N).map(|_| Vec::new()).collect();
    let size_of =
        |i: usize, j: usize, seq: u64| 1024 + ((seq as usize * 977 + i * 31 + j * 7) % (60 * 1024));
    while received < total || sent_ok < total {
        deadline.check();
        for i in 0..N {
            // Round-robin over destinations, at most 32 sends in flight.
            for j in (0..N).filter(|&j| j != i) {
                if next[i][j] == PER_PAIR || eps[i].outstanding_sends() >= 32 {
                    continue;
                }
                let seq = next[i][j];
                let (head, body, range) = make_message(i as u64, seq, size_of(i, j, seq) - 16);
                if eps[i]
                    .send(ids[i][j], i as u64, head, Some((body, range)), seq)
                    .unwrap()
                {
                    next[i][j] += 1;
                }
            }
        }
        let mut refs: Vec<&mut Endpoint> = eps.iter_mut().collect();
        pump(&mut refs, &mut outs);
        for (j, out) in outs.iter_mut().enumerate() {
            for c in out.drain(..) {
                match c {
                    Completion::Sent { .. } => sent_ok += 1,
                    Completion::Received { buf, tag, .. } => {
                        let i = tag as usize;
                        let (from, seq) =
                            check_message(&buf, Some(size_of(i, j, expect[j][i]) - 16));
                        assert_eq!(
                            (from, seq),
                            (i as u64, expect[j][i]),
                            "order from {i} to {j}"
                        );
                        expect[j][i] += 1;
                        received += 1;
                        eps[j].post_recv(buf).unwrap();
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }
    assert!(eps.iter().all(|e| e.outstanding_sends() == 0));
}

#[test]
fn slow_receiver_with_few_buffers_loses_nothing() {
    const COUNT: u64 = 3000;
    let mut tx = open_small("tcp");
    let mut rx = open_small("tcp");
    let to_rx = tx.add_peer(&rx.local_address()).unwrap();
    rx.add_peer(&tx.local_address()).unwrap();
    for _ in 0..2 {
        rx.post_recv(Vec::with_capacity(SMALL_MAX)).unwrap();
    }
    // One shared 32 KiB body: the sender's memory stays small however many
    // sends queue up; the head carries the sequence number.
    let body: Rc<Vec<u8>> = Rc::new((0..32 * 1024).map(|i| pattern(9, 0, i)).collect());
    let deadline = Deadline::new(90, "slow receiver");
    let (mut next, mut got, mut try_again, mut max_outstanding) = (0u64, 0u64, 0u64, 0usize);
    let (mut tx_out, mut rx_out) = (Vec::new(), Vec::new());
    let mut last_consume = Instant::now();
    while got < COUNT || tx.outstanding_sends() > 0 {
        deadline.check();
        // The sender pushes as hard as the library lets it.
        while next < COUNT {
            let mut head = 9u64.to_le_bytes().to_vec();
            head.extend_from_slice(&next.to_le_bytes());
            if !tx
                .send(to_rx, 9, head, Some((body.clone(), 0..body.len())), next)
                .unwrap()
            {
                try_again += 1;
                break;
            }
            next += 1;
        }
        max_outstanding = max_outstanding.max(tx.outstanding_sends());
        tx.progress(&mut tx_out).unwrap();
        for c in tx_out.drain(..) {
            assert!(matches!(c, Completion::Sent { .. }), "sender: {c:?}");
        }
        // The receiver looks only every 200 us.
        if last_consume.elapsed() >= Duration::from_micros(200) {
            last_consume = Instant::now();
            rx.progress(&mut rx_out).unwrap();
            for c in rx_out.drain(..) {
                let Completion::Received { buf, tag, .. } = c else {
                    panic!("receiver: {c:?}")
                };
                assert_eq!(tag, 9);
                assert_eq!(buf.len(), 16 + body.len());
                assert_eq!(
                    u64::from_le_bytes(buf[8..16].try_into().unwrap()),
                    got,
                    "order"
                );
                assert!(buf[16..] == body[..], "message {got}: body differs");
                got += 1;
                rx.post_recv(buf).unwrap();
            }
        } else {
            tx.wait(Duration::from_micros(100)).unwrap();
        }
    }
    eprintln!("slow receiver: {COUNT} messages, sender saw try-again {try_again} times, up to {max_outstanding} sends queued");
    assert!(
        try_again > 0 || max_outstanding >= 64,
        "the sender never felt the slow receiver (try-again {try_again}, max queued {max_outstanding})"
    );
    assert_eq!(got, COUNT);
}

#[test]
fn missing_provider_lists_what_is_available() {
    for (wanted, shows) in [
        ("verbs", "verbs;ofi_rxm"),
        ("no-such-fabric", "no-such-fabric"),
    ] {
        let e = Endpoint::open(&Options::new(wanted))
            .err()
            .expect("opening a missing provider must fail");
        let msg = e.to_string();
        assert!(msg.contains(shows), "{msg}");
        assert!(
            msg.contains("available:") && msg.contains("tcp;ofi_rxm") && msg.contains("shm"),
            "{msg}"
        );
    }
    let mut opts = Options::new("tcp");
    opts.domain = Some("no-such-nic".into());
    let msg = Endpoint::open(&opts)
        .err()
        .expect("missing domain")
        .to_string();
    assert!(
        msg.contains("on domain `no-such-nic`") && msg.contains("lo"),
        "{msg}"
    );
}
