//! Across real processes: messages echoed by a separate `evb-ofi-peer`
//! process come back whole and in order; a peer killed mid-stream makes the
//! survivor's sends fail instead of hanging it.

mod common;
use common::*;
use evb_ofi::{Completion, Endpoint};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the peer process and swaps addresses with it over its stdin/stdout.
fn spawn_peer(ep: &mut Endpoint, provider: &str) -> (Peer, evb_ofi::PeerId) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_evb-ofi-peer"));
    cmd.arg(provider);
    if provider == "tcp" {
        cmd.arg("lo");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning evb-ofi-peer");
    let stdout = child.stdout.take().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // A reader thread so a silent child cannot hang the test.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("evb-ofi-peer did not print its address in 20 s");
    assert!(
        !line.trim().is_empty(),
        "evb-ofi-peer exited without an address (see its stderr)"
    );
    let peer = ep.add_peer(&unhex(&line)).unwrap();
    writeln!(stdin, "{}", hex(&ep.local_address())).unwrap();
    stdin.flush().unwrap();
    (
        Peer {
            child,
            stdin: Some(stdin),
        },
        peer,
    )
}

fn echo_round_trip(provider: &str) {
    let mut ep = open(provider);
    let (mut peer, pid) = spawn_peer(&mut ep, provider);
    for _ in 0..8 {
        ep.post_recv(Vec::with_capacity(ep.max_message_size()))
            .unwrap();
    }
    // 64 B .. 4 MiB, four of each, up to 6 in flight.
    let sizes: Vec<usize> = (6..=22).flat_map(|s| [1usize << s; 4]).collect();
    let deadline = Deadline::new(90, "echo across processes");
    let (mut next, mut back, mut out) = (0usize, 0usize, Vec::new());
    while back < sizes.len() {
        deadline.check();
        while next < sizes.len() && next - back < 6 {
            let (head, body, range) = make_message(3, next as u64, sizes[next]);
            if !ep
                .send(
                    pid,
                    500 + next as u64,
                    head,
                    Some((body, range)),
                    next as u64,
                )
                .unwrap()
            {
                break;
            }
            next += 1;
        }
        ep.progress(&mut out).unwrap();
        if out.is_empty() {
            ep.wait(Duration::from_millis(5)).unwrap();
        }
        for c in out.drain(..) {
            match c {
                Completion::Received { buf, tag, .. } => {
                    assert_eq!(tag, 500 + back as u64, "echo tag");
                    assert_eq!(
                        check_message(&buf, Some(sizes[back])),
                        (3, back as u64),
                        "echo order"
                    );
                    back += 1;
                    ep.post_recv(buf).unwrap();
                }
                Completion::Sent { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    // An empty message tells the peer to finish; it must exit cleanly.
    send_retry(
        &mut [&mut ep],
        &mut [Vec::new()],
        0,
        pid,
        0,
        || (Vec::new(), std::rc::Rc::new(Vec::new()), 0..0),
        0,
    );
    drop(peer.stdin.take());
    let deadline = Deadline::new(20, "peer exit");
    loop {
        ep.progress(&mut out).unwrap();
        if let Some(status) = peer.child.try_wait().unwrap() {
            assert!(status.success(), "evb-ofi-peer failed: {status}");
            break;
        }
        deadline.check();
        ep.wait(Duration::from_millis(5)).unwrap();
    }
}

#[test]
fn tcp_echo_across_processes() {
    echo_round_trip("tcp");
}

#[test]
fn shm_echo_across_processes() {
    echo_round_trip("shm");
}

#[test]
fn killed_peer_makes_sends_fail_not_hang() {
    let mut ep = open("tcp");
    let (mut peer, pid) = spawn_peer(&mut ep, "tcp");
    for _ in 0..4 {
        ep.post_recv(Vec::with_capacity(ep.max_message_size()))
            .unwrap();
    }
    let mut outs = [Vec::new()];
    // One round trip proves the connection works.
    send_retry(
        &mut [&mut ep],
        &mut outs,
        0,
        pid,
        1,
        || make_message(0, 0, 1000),
        0,
    );
    let deadline = Deadline::new(20, "first echo");
    while !outs[0]
        .iter()
        .any(|c| matches!(c, Completion::Received { .. }))
    {
        deadline.check();
        pump(&mut [&mut ep], &mut outs);
    }
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();

    // Keep sending: within the bound, sends must fail (error completion or
    // error return), and no call may block.
    let deadline = Deadline::new(30, "sends to a killed peer neither failed nor completed");
    let mut failures = Vec::new();
    let mut seq = 1u64;
    while failures.is_empty() {
        deadline.check();
        let (head, body, range) = make_message(0, seq, 1 << 20);
        match ep.send(pid, 1, head, Some((body, range)), seq) {
            Ok(true) => seq += 1,
            Ok(false) => {}
            Err(e) => failures.push(e.to_string()),
        }
        let mut out = Vec::new();
        ep.progress(&mut out).unwrap();
        for c in out {
            if let Completion::SendFailed { reason, .. } = c {
                failures.push(reason);
            }
        }
        ep.wait(Duration::from_millis(10)).unwrap();
    }
    eprintln!(
        "after the kill: {} sends posted, first failure: {}",
        seq - 1,
        failures[0]
    );
    // Dropping with whatever is still queued must not hang either.
    let t = std::time::Instant::now();
    drop(ep);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "closing took {:?}",
        t.elapsed()
    );
}
