//! A slow network path: every byte between two real `evb node` processes
//! goes through a relay that holds it for a fixed time in each direction
//! (this machine's kernel has no `tc netem`; the relay is a real TCP hop in
//! user space that does the delay part of it). The run must build every
//! event exactly, declare nobody lost (heartbeats are late, not missing),
//! and the delay must show in the batch latency.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use evb_testkit::net::free_port;
use evb_testkit::{evb, final_report, wait_all};

/// Relays one connection from `listener` to `upstream`, holding every
/// chunk `delay` in each direction. Returns when both directions end.
fn delay_relay(
    listener: TcpListener,
    upstream: u16,
    delay: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (down, _) = listener.accept().expect("node 0 connects");
        // Node 1 may not listen yet when node 0 dials: retry for a while.
        let deadline = Instant::now() + Duration::from_secs(15);
        let up = loop {
            match TcpStream::connect(("127.0.0.1", upstream)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => panic!("node 1 never listened: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let _ = down.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let pipes = [
            (down.try_clone().unwrap(), up.try_clone().unwrap()),
            (up, down),
        ];
        let handles: Vec<_> = pipes
            .into_iter()
            .map(|(mut from, mut to)| {
                let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
                let reader = std::thread::spawn(move || {
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
                let writer = std::thread::spawn(move || {
                    for (at, bytes) in rx {
                        let due = at + delay;
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                        if to.write_all(&bytes).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                });
                (reader, writer)
            })
            .collect();
        for (r, w) in handles {
            let _ = r.join();
            let _ = w.join();
        }
    })
}

#[test]
fn a_delayed_link_builds_everything_and_loses_nobody() {
    let delay = Duration::from_millis(40);
    let relay = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_port = relay.local_addr().unwrap().port();
    let (p0, p1) = (free_port(), free_port());
    let relay_thread = delay_relay(relay, p1, delay);
    // Node 0 dials node 1 (the lower rank dials), through the relay.
    let addresses =
        |second: u16| format!("transport.addresses=[\"127.0.0.1:{p0}\",\"127.0.0.1:{second}\"]");
    let spawn = |rank: u16, second: u16| {
        evb()
            .args(["node", "--rank", &rank.to_string()])
            .args(["--set", "transport.kind=tcp"])
            .args(["--set", &addresses(second)])
            .args(["--set", "nodes.count=2"])
            .args(["--set", "run.max_meps=200"])
            .args(["--set", "run.duration_s=0"])
            .args(["--set", "source.events_per_mep=64"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let node1 = spawn(1, p1);
    let node0 = spawn(0, relay_port);
    let outs = wait_all(vec![node0, node1], Duration::from_secs(60));
    let _ = relay_thread.join();
    let mut built = 0;
    let mut p50_ms = Vec::new();
    for (rank, out) in outs.iter().enumerate() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "node {rank}: {err}");
        let v = final_report(out);
        assert!(
            v["peers_lost"].as_array().is_none_or(Vec::is_empty),
            "node {rank} lost a peer on a slow link: {v}"
        );
        assert_eq!(v["events_incomplete"], 0, "node {rank}: {v}");
        built += v["events_built"].as_u64().unwrap();
        p50_ms.push(v["latency_ns"]["p50"].as_f64().unwrap() / 1e6);
    }
    eprintln!("median batch latency per node, ms: {p50_ms:?}");
    assert_eq!(built, 200 * 64, "every event built exactly once");
    // Node 0's batches wait for node 1's fragments: the EM's assignment
    // crosses the link, then the fragment comes back (2 x 40 ms).
    assert!(
        p50_ms[0] >= 70.0,
        "node 0 median batch latency {:.1} ms: the delay did not act",
        p50_ms[0]
    );
}
