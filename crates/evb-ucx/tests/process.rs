//! Two real processes: the test binary re-runs itself as the peer (role in
//! EVB_UCX_CHILD), addresses go over the child's stdin/stdout. One exchange
//! in both directions with every message verified, and one where the peer is
//! killed and the survivor must notice within a bound instead of hanging.

mod common;
use common::*;
use evb_ucx::{Completion, Endpoint, Options, Progress};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ADDR_PREFIX: &str = "EVBUCX-ADDR ";
const MESSAGES: u64 = 400;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex address"))
        .collect()
}

fn size_of(seq: u64) -> usize {
    64usize << (seq % 15) // 64 B .. 1 MiB
}

fn child_options(tls: &str) -> Options {
    Options {
        peer_failure_detection: tls.contains("tcp"),
        ..opts(Some(tls), Progress::Blocking)
    }
}

/// The child's side. Not a test on its own: returns at once unless spawned by one.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("EVB_UCX_CHILD") else {
        return;
    };
    let tls = std::env::var("EVB_UCX_TLS").expect("EVB_UCX_TLS");
    let _dog = watchdog("child_entry", Duration::from_secs(60));
    let mut ep = Endpoint::open(&child_options(&tls)).expect("child: open");
    println!("\n{ADDR_PREFIX}{}", hex(&ep.local_address()));
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("child: read parent address");
    let parent = ep.add_peer(&unhex(line.trim())).expect("child: add_peer");
    for _ in 0..8 {
        ep.post_recv(Vec::with_capacity(24 + (1 << 20))).unwrap();
    }
    let mut out = Vec::new();
    let (mut got, mut next, mut sent) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(50);
    // "echo": receive MESSAGES and send MESSAGES of its own; "sink": receive forever.
    while role == "sink" || got < MESSAGES || sent < MESSAGES {
        assert!(
            Instant::now() < deadline,
            "child: timed out (got {got}, sent {sent})"
        );
        if role == "echo" && next < MESSAGES {
            let size = size_of(next);
            let body = Rc::new(pattern(1, next, size));
            if ep
                .send(parent, 1, head(1, next, size), Some((body, 0..size)), next)
                .unwrap()
            {
                next += 1;
            }
        }
        ep.progress(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::Received { buf, tag, .. } => {
                    let (sender, seq) = check_message(&buf, tag);
                    assert_eq!((sender, seq), (0, got), "child: wrong message");
                    got += 1;
                    ep.post_recv(buf).unwrap();
                }
                Completion::Sent { .. } => sent += 1,
                other => panic!("child: unexpected {other:?}"),
            }
        }
        ep.wait(Duration::from_millis(5)).unwrap();
    }
    // Let the last sends leave before the endpoint closes.
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        ep.progress(&mut out).unwrap();
        ep.wait(Duration::from_millis(5)).unwrap();
    }
}

struct Peer {
    child: Child,
    address: Vec<u8>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_peer(role: &str, tls: &str, parent_address: &[u8]) -> Peer {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("EVB_UCX_CHILD", role)
        .env("EVB_UCX_TLS", tls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child process");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The test harness may have printed on the same line first.
            if let Some(at) = line.find(ADDR_PREFIX) {
                let _ = tx.send(line[at + ADDR_PREFIX.len()..].trim().to_string());
            }
        }
    });
    let mut peer = Peer {
        child,
        address: Vec::new(),
    };
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the child did not print its address within 20 s");
    peer.address = unhex(&addr);
    let stdin = peer.child.stdin.as_mut().unwrap();
    writeln!(stdin, "{}", hex(parent_address)).unwrap();
    stdin.flush().unwrap();
    peer
}

fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the child did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn exchange_with_child(tls: &str) {
    let mut ep = Endpoint::open(&child_options(tls)).unwrap();
    let mut peer = spawn_peer("echo", tls, &ep.local_address());
    let child = ep.add_peer(&peer.address).unwrap();
    for _ in 0..8 {
        ep.post_recv(Vec::with_capacity(24 + (1 << 20))).unwrap();
    }
    let mut out = Vec::new();
    let (mut got, mut next, mut sent) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(50);
    while got < MESSAGES || sent < MESSAGES {
        assert!(
            Instant::now() < deadline,
            "parent: timed out (got {got}, sent {sent})"
        );
        if next < MESSAGES {
            let size = size_of(next);
            let body = Rc::new(pattern(0, next, size));
            if ep
                .send(child, 0, head(0, next, size), Some((body, 0..size)), next)
                .unwrap()
            {
                next += 1;
            }
        }
        ep.progress(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::Received { buf, tag, .. } => {
                    let (sender, seq) = check_message(&buf, tag);
                    assert_eq!((sender, seq), (1, got), "parent: wrong message");
                    got += 1;
                    ep.post_recv(buf).unwrap();
                }
                Completion::Sent { .. } => sent += 1,
                other => panic!("parent: unexpected {other:?}"),
            }
        }
        ep.wait(Duration::from_millis(5)).unwrap();
    }
    let status = wait_exit(&mut peer.child, Duration::from_secs(20));
    assert!(status.success(), "the child failed: {status}");
}

#[test]
fn two_processes_tcp() {
    let _dog = watchdog("two_processes_tcp", Duration::from_secs(90));
    exchange_with_child("tcp");
}

#[test]
fn two_processes_shared_memory() {
    let _dog = watchdog("two_processes_shared_memory", Duration::from_secs(90));
    exchange_with_child("posix,sysv,cma,self");
}

#[test]
fn killed_peer_is_noticed_within_a_bound() {
    let _dog = watchdog(
        "killed_peer_is_noticed_within_a_bound",
        Duration::from_secs(60),
    );
    let mut ep = Endpoint::open(&child_options("tcp")).unwrap();
    let mut peer = spawn_peer("sink", "tcp", &ep.local_address());
    let child = ep.add_peer(&peer.address).unwrap();
    let body = Rc::new(pattern(0, 0, 64 * 1024));
    let mut out = Vec::new();
    let mut seq = 0u64;
    let mut delivered = 0u64;
    // First, messages that get through.
    let deadline = Instant::now() + Duration::from_secs(20);
    while delivered < 20 {
        assert!(Instant::now() < deadline, "no traffic to the child");
        if ep
            .send(
                child,
                0,
                head(0, seq, 1024),
                Some((Rc::new(pattern(0, seq, 1024)), 0..1024)),
                seq,
            )
            .unwrap()
        {
            seq += 1;
        }
        ep.progress(&mut out).unwrap();
        delivered += out
            .drain(..)
            .filter(|c| matches!(c, Completion::Sent { .. }))
            .count() as u64;
        ep.wait(Duration::from_millis(1)).unwrap();
    }
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let killed = Instant::now();
    let mut failure = None;
    while failure.is_none() {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "20 s after the peer was killed, nothing failed"
        );
        let _ = ep
            .send(
                child,
                0,
                head(0, seq, body.len()),
                Some((body.clone(), 0..body.len())),
                seq,
            )
            .unwrap();
        seq += 1;
        ep.progress(&mut out).unwrap();
        for c in out.drain(..) {
            match c {
                Completion::SendFailed { reason, .. } | Completion::PeerFailed { reason, .. } => {
                    failure = Some(reason)
                }
                Completion::Sent { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        ep.wait(Duration::from_millis(5)).unwrap();
    }
    eprintln!(
        "peer loss noticed after {:?}: {}",
        killed.elapsed(),
        failure.unwrap()
    );
    // Every later send fails at once rather than piling up.
    let mut failed_after = 0;
    let until = Instant::now() + Duration::from_secs(10);
    while failed_after < 5 && Instant::now() < until {
        let _ = ep.send(child, 0, vec![0; 24], None, seq).unwrap();
        ep.progress(&mut out).unwrap();
        failed_after += out
            .drain(..)
            .filter(|c| matches!(c, Completion::SendFailed { .. }))
            .count();
        ep.wait(Duration::from_millis(5)).unwrap();
    }
    assert!(failed_after >= 5, "sends to the dead peer do not fail");
    let start = Instant::now();
    drop(ep);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "closing took {:?}",
        start.elapsed()
    );
}

/// Shared memory in UCX 1.13 cannot detect a dead peer; the survivor must
/// still never block: sends queue up to the limit and then say "try again",
/// and closing is bounded.
#[test]
fn killed_peer_over_shared_memory_does_not_hang_the_survivor() {
    let _dog = watchdog(
        "killed_peer_over_shared_memory_does_not_hang_the_survivor",
        Duration::from_secs(60),
    );
    let tls = "posix,sysv,cma,self";
    let o = Options {
        max_outstanding_sends: 16,
        ..child_options(tls)
    };
    let mut ep = Endpoint::open(&o).unwrap();
    let mut peer = spawn_peer("sink", tls, &ep.local_address());
    let child = ep.add_peer(&peer.address).unwrap();
    let mut out = Vec::new();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while sent < 20 {
        assert!(Instant::now() < deadline, "no traffic to the child");
        let _ = ep
            .send(
                child,
                0,
                head(0, sent, 8),
                Some((Rc::new(pattern(0, sent, 8)), 0..8)),
                sent,
            )
            .unwrap();
        ep.progress(&mut out).unwrap();
        sent += out
            .drain(..)
            .filter(|c| matches!(c, Completion::Sent { .. }))
            .count() as u64;
        ep.wait(Duration::from_millis(1)).unwrap();
    }
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let body = Rc::new(vec![1u8; 1 << 20]);
    let start = Instant::now();
    let mut try_again = 0;
    for seq in 0..200u64 {
        if !ep
            .send(
                child,
                0,
                vec![0; 24],
                Some((body.clone(), 0..body.len())),
                seq,
            )
            .unwrap()
        {
            try_again += 1;
        }
        ep.progress(&mut out).unwrap();
        ep.wait(Duration::from_millis(1)).unwrap();
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "sending to a dead peer took {:?}",
        start.elapsed()
    );
    assert!(
        try_again > 0 && ep.outstanding_sends() <= 16,
        "sends to the dead peer were not bounded"
    );
    let start = Instant::now();
    drop(ep);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "closing took {:?}",
        start.elapsed()
    );
    assert_eq!(
        Rc::strong_count(&body),
        1,
        "a send buffer outlived the endpoint"
    );
}
