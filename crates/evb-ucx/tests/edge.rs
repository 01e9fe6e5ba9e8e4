//! Backpressure, messages larger than the receive buffer, bad input, and
//! dropping an endpoint with operations in flight.

mod common;
use common::*;
use evb_ucx::{Completion, Endpoint, Error, Options, Progress};
use std::rc::Rc;
use std::time::{Duration, Instant};

#[test]
fn slow_receiver_with_few_buffers_loses_nothing() {
    let _dog = watchdog(
        "slow_receiver_with_few_buffers_loses_nothing",
        Duration::from_secs(90),
    );
    let o = Options {
        max_outstanding_sends: 4,
        ..opts(Some("tcp"), Progress::Blocking)
    };
    let mut tx = Endpoint::open(&o).unwrap();
    let mut rx = Endpoint::open(&o).unwrap();
    let to_rx = tx.add_peer(&rx.local_address()).unwrap();
    rx.add_peer(&tx.local_address()).unwrap();
    let size = 256 * 1024; // rendezvous: a send stays in flight until the receiver takes it
    let count = 200u64;
    rx.post_recv(Vec::with_capacity(24 + size)).unwrap();
    rx.post_recv(Vec::with_capacity(24 + size)).unwrap();
    let body = Rc::new(pattern(7, 0, size));
    let (mut next, mut got, mut sent, mut try_again, mut max_outstanding) =
        (0u64, 0u64, 0u64, 0u64, 0usize);
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let mut last_repost = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while got < count || sent < count {
        assert!(
            Instant::now() < deadline,
            "timed out: got {got}, sent {sent}"
        );
        if next < count {
            if tx
                .send(
                    to_rx,
                    7,
                    head(7, 0, size),
                    Some((body.clone(), 0..size)),
                    next,
                )
                .unwrap()
            {
                next += 1;
            } else {
                try_again += 1;
            }
        }
        max_outstanding = max_outstanding.max(tx.outstanding_sends());
        tx.progress(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::Sent { ctx } => {
                    assert_eq!(ctx, sent, "send completions out of order");
                    sent += 1;
                }
                other => panic!("sender: unexpected {other:?}"),
            }
        }
        rx.progress(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::Received { buf, tag, .. } => {
                    check_message(&buf, tag);
                    got += 1;
                    spare.push(buf);
                }
                other => panic!("receiver: unexpected {other:?}"),
            }
        }
        // The slow consumer: gives a buffer back at most every 2 ms.
        if !spare.is_empty() && last_repost.elapsed() >= Duration::from_millis(2) {
            rx.post_recv(spare.pop().unwrap()).unwrap();
            last_repost = Instant::now();
        }
        rx.wait(Duration::from_micros(200)).unwrap();
    }
    assert!(try_again > 0, "the sender never had to try again");
    assert!(
        max_outstanding <= 4,
        "{max_outstanding} sends in flight with a limit of 4"
    );
    eprintln!("backpressure: {count} messages of {size} B, {try_again} try-again answers");
}

#[test]
fn message_larger_than_the_buffer_is_an_error_completion() {
    let _dog = watchdog(
        "message_larger_than_the_buffer_is_an_error_completion",
        Duration::from_secs(60),
    );
    for tls in ["tcp", "sm,self"] {
        let o = Options {
            peer_failure_detection: tls == "tcp",
            ..opts(Some(tls), Progress::Blocking)
        };
        let mut eps = vec![Endpoint::open(&o).unwrap(), Endpoint::open(&o).unwrap()];
        let peers = connect_all(&mut eps);
        // Too large eager, too large rendezvous, then one that fits.
        for (seq, size) in [(0u64, 8 * 1024usize), (1, 1024 * 1024), (2, 1000)] {
            eps[0].post_recv(Vec::with_capacity(4096)).unwrap();
            let body = Rc::new(pattern(1, seq, size));
            assert!(eps[1]
                .send(
                    peers[1][0],
                    1,
                    head(1, seq, size),
                    Some((body, 0..size)),
                    seq
                )
                .unwrap());
        }
        let mut results = Vec::new();
        let mut sender_done = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut out = Vec::new();
        while results.len() < 3 || sender_done < 3 {
            assert!(
                Instant::now() < deadline,
                "{tls}: timed out with {results:?}, {sender_done} sends done"
            );
            eps[1].progress(&mut out).unwrap();
            for c in out.drain(..) {
                match c {
                    Completion::Sent { .. } | Completion::SendFailed { .. } => sender_done += 1,
                    other => panic!("{tls}: sender: unexpected {other:?}"),
                }
            }
            eps[0].progress(&mut out).unwrap();
            for c in out.drain(..) {
                match c {
                    Completion::ReceiveFailed { buf, tag, reason } => {
                        assert_eq!(buf.capacity(), 4096, "the buffer comes back");
                        assert_eq!(tag, 1, "the sender's tag: {reason}");
                        assert!(
                            reason.contains("larger than the 4096-byte receive buffer"),
                            "{reason}"
                        );
                        results.push(None);
                    }
                    Completion::Received { buf, tag, .. } => {
                        results.push(Some(check_message(&buf, tag)))
                    }
                    other => panic!("{tls}: receiver: unexpected {other:?}"),
                }
            }
            eps[0].wait(Duration::from_millis(1)).unwrap();
        }
        assert_eq!(results, vec![None, None, Some((1, 2))], "{tls}");
    }
}

/// A split message (body sent as its own message) whose head does not fit
/// the buffer: an error completion, its body does not stay queued in UCX
/// (the send completes), and the sender's next message arrives intact.
#[test]
fn split_message_with_a_head_larger_than_the_buffer() {
    let _dog = watchdog(
        "split_message_with_a_head_larger_than_the_buffer",
        Duration::from_secs(60),
    );
    for tls in ["tcp", "sm,self"] {
        let o = Options {
            peer_failure_detection: tls == "tcp",
            split_body_from: 1024,
            ..opts(Some(tls), Progress::Blocking)
        };
        let mut eps = vec![Endpoint::open(&o).unwrap(), Endpoint::open(&o).unwrap()];
        let peers = connect_all(&mut eps);
        eps[0].post_recv(Vec::with_capacity(16)).unwrap();
        let size = 256 * 1024;
        for seq in 0..2u64 {
            let body = Rc::new(pattern(1, seq, size));
            assert!(eps[1]
                .send(
                    peers[1][0],
                    1,
                    head(1, seq, size),
                    Some((body, 0..size)),
                    seq
                )
                .unwrap());
        }
        let (mut failed, mut received, mut sent) = (0, Vec::new(), 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut out = Vec::new();
        while received.is_empty() || sent < 2 {
            assert!(
                Instant::now() < deadline,
                "{tls}: timed out: {failed} failed, {received:?} received, {sent} sent"
            );
            eps[1].progress(&mut out).unwrap();
            for c in out.drain(..) {
                match c {
                    Completion::Sent { .. } => sent += 1,
                    other => panic!("{tls}: sender: unexpected {other:?}"),
                }
            }
            eps[0].progress(&mut out).unwrap();
            for c in out.drain(..) {
                match c {
                    Completion::ReceiveFailed { buf, tag, reason } => {
                        assert_eq!(buf.capacity(), 16, "{reason}");
                        assert_eq!(tag, 1, "the sender's tag: {reason}");
                        failed += 1;
                        eps[0].post_recv(Vec::with_capacity(24 + size)).unwrap();
                    }
                    Completion::Received { buf, tag, .. } => {
                        received.push(check_message(&buf, tag))
                    }
                    other => panic!("{tls}: receiver: unexpected {other:?}"),
                }
            }
            eps[0].wait(Duration::from_millis(1)).unwrap();
        }
        assert_eq!((failed, received), (1, vec![(1, 1)]), "{tls}");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let _dog = watchdog("bad_input_is_a_clear_error", Duration::from_secs(30));
    let mut ep = open(Some("tcp"));
    for junk in [&b""[..], b"hello", &[0xffu8; 300][..]] {
        match ep.add_peer(junk) {
            Err(Error::BadAddress(msg)) => assert!(!msg.is_empty()),
            other => panic!("junk address accepted: {other:?}"),
        }
    }
    let mut corrupted = ep.local_address();
    let mid = corrupted.len() / 2;
    corrupted[mid] ^= 0x40;
    let err = ep.add_peer(&corrupted).unwrap_err().to_string();
    assert!(err.contains("checksum"), "{err}");
    assert!(matches!(
        ep.send(3, 0, vec![1], None, 0),
        Err(Error::UnknownPeer(3))
    ));
    let other = open(Some("tcp"));
    let p = ep.add_peer(&other.local_address()).unwrap();
    let err = ep
        .send(p, 0, vec![], Some((Rc::new(vec![0; 10]), 5..11)), 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("5..11") && err.contains("10 bytes"), "{err}");
    assert!(matches!(
        ep.post_recv(Vec::new()),
        Err(Error::EmptyReceiveBuffer)
    ));
    let err = Endpoint::open(&Options {
        ucx_config: vec![("KEEPALIVE_INTERVAL".into(), "banana".into())],
        ..Options::default()
    })
    .err()
    .expect("bad UCX setting value accepted")
    .to_string();
    assert!(err.contains("UCX_KEEPALIVE_INTERVAL=banana"), "{err}");
}

#[test]
fn dropping_with_operations_in_flight_is_clean_and_bounded() {
    let _dog = watchdog(
        "dropping_with_operations_in_flight_is_clean_and_bounded",
        Duration::from_secs(60),
    );
    for tls in ["tcp", "sm,self"] {
        let o = Options {
            peer_failure_detection: tls == "tcp",
            ..opts(Some(tls), Progress::Blocking)
        };
        let mut a = Endpoint::open(&o).unwrap();
        let mut b = Endpoint::open(&o).unwrap();
        let to_b = a.add_peer(&b.local_address()).unwrap();
        b.add_peer(&a.local_address()).unwrap();
        for _ in 0..8 {
            a.post_recv(vec![0; 1 << 20]).unwrap();
        }
        // Large sends b never receives: they stay in flight (rendezvous).
        let body = Rc::new(vec![5u8; 1 << 20]);
        for k in 0..8 {
            assert!(a
                .send(to_b, 0, vec![0; 24], Some((body.clone(), 0..body.len())), k)
                .unwrap());
        }
        let mut out = Vec::new();
        a.progress(&mut out).unwrap();
        b.progress(&mut out).unwrap();
        let start = Instant::now();
        drop(a);
        assert_eq!(
            Rc::strong_count(&body),
            1,
            "{tls}: the endpoint kept a reference to a send buffer"
        );
        drop(b);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{tls}: drop took {:?}",
            start.elapsed()
        );
    }
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn blocking_wait_sleeps_and_wakes_on_a_message() {
    let _dog = watchdog(
        "blocking_wait_sleeps_and_wakes_on_a_message",
        Duration::from_secs(60),
    );
    let mut rx = open(Some("tcp"));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let sender = std::thread::spawn(move || {
        let mut tx = open(Some("tcp"));
        addr_tx.send(tx.local_address()).unwrap();
        let peer = tx.add_peer(&go_rx.recv().unwrap()).unwrap();
        // Keep progressing until the signal to send, as every node of a run
        // does: UCX's tcp connection handshake needs both workers, and the
        // receiver's half-open endpoint stays writable-ready (a busy event fd)
        // for as long as this side sits on an unread connection request.
        let mut early = Vec::new();
        loop {
            match go_rx.try_recv() {
                Ok(_) => break,
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(e) => panic!("sender: signal channel: {e}"),
            }
            tx.wait(Duration::from_millis(20)).unwrap();
            tx.progress(&mut early).unwrap();
        }
        assert!(
            early.is_empty(),
            "sender: completions before sending: {early:?}"
        );
        let sent_at = Instant::now();
        assert!(tx
            .send(
                peer,
                9,
                head(9, 0, 100),
                Some((Rc::new(pattern(9, 0, 100)), 0..100)),
                0
            )
            .unwrap());
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.is_empty() {
            assert!(Instant::now() < deadline, "sender: no completion");
            tx.progress(&mut out).unwrap();
            tx.wait(Duration::from_millis(50)).unwrap();
        }
        // Stay open until the receiver has had time to take the message.
        std::thread::sleep(Duration::from_millis(500));
        sent_at
    });
    go_tx.send(rx.local_address()).unwrap();
    rx.add_peer(&addr_rx.recv().unwrap()).unwrap();
    rx.post_recv(Vec::with_capacity(1024)).unwrap();
    let mut out = Vec::new();
    // Idle: waiting must not burn CPU.
    let (cpu0, wall0) = (thread_cpu_time(), Instant::now());
    while wall0.elapsed() < Duration::from_millis(400) {
        rx.wait(Duration::from_millis(400).saturating_sub(wall0.elapsed()))
            .unwrap();
        rx.progress(&mut out).unwrap();
    }
    let cpu = thread_cpu_time() - cpu0;
    assert!(out.is_empty(), "{out:?}");
    assert!(
        cpu < Duration::from_millis(100),
        "idle wait used {cpu:?} of CPU in 400 ms"
    );
    // A message wakes the waiter.
    go_tx.send(Vec::new()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let received_at = loop {
        assert!(
            Instant::now() < deadline,
            "the message never woke the receiver"
        );
        rx.wait(Duration::from_secs(5)).unwrap();
        rx.progress(&mut out).unwrap();
        if let Some(Completion::Received { buf, tag, .. }) = out.pop() {
            check_message(&buf, tag);
            break Instant::now();
        }
    };
    let sent_at = sender.join().unwrap();
    let latency = received_at.saturating_duration_since(sent_at);
    assert!(
        latency < Duration::from_secs(1),
        "woke {latency:?} after the send"
    );
}

/// A receiver dropped while rendezvous messages stream into it: UCX aborts
/// the process if a worker is destroyed with such transfers pending, so Drop
/// must cancel them; the sender then sees its sends fail, not a hang.
#[test]
fn dropping_a_receiver_mid_stream() {
    let _dog = watchdog("dropping_a_receiver_mid_stream", Duration::from_secs(60));
    let mut tx = open(Some("tcp"));
    let mut rx = open(Some("tcp"));
    let to_rx = tx.add_peer(&rx.local_address()).unwrap();
    rx.add_peer(&tx.local_address()).unwrap();
    for _ in 0..8 {
        rx.post_recv(Vec::with_capacity(1 << 20)).unwrap();
    }
    let body = Rc::new(vec![3u8; (1 << 20) - 24]);
    let mut out = Vec::new();
    let mut received = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seq = 0;
    while received < 20 {
        assert!(Instant::now() < deadline, "no traffic");
        while tx
            .send(
                to_rx,
                0,
                vec![0; 24],
                Some((body.clone(), 0..body.len())),
                seq,
            )
            .unwrap()
        {
            seq += 1;
        }
        tx.progress(&mut out).unwrap();
        out.clear();
        rx.progress(&mut out).unwrap();
        for c in out.drain(..) {
            if let Completion::Received { buf, .. } = c {
                received += 1;
                rx.post_recv(buf).unwrap();
            }
        }
    }
    let start = Instant::now();
    drop(rx);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        start.elapsed()
    );
    let mut failed = false;
    while !failed {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sender never noticed the receiver left"
        );
        let _ = tx
            .send(
                to_rx,
                0,
                vec![0; 24],
                Some((body.clone(), 0..body.len())),
                seq,
            )
            .unwrap();
        seq += 1;
        tx.progress(&mut out).unwrap();
        failed = out.drain(..).any(|c| {
            matches!(
                c,
                Completion::SendFailed { .. } | Completion::PeerFailed { .. }
            )
        });
        tx.wait(Duration::from_millis(5)).unwrap();
    }
}
