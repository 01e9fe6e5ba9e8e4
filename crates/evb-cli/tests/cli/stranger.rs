//! A hostile surrounding: strangers on a node's port (one that connects and
//! stays silent, one that sends garbage: both rejected and logged), and a
//! stdout nobody reads. The run is not disturbed. Real `evb node`
//! processes configured by address, real TCP on loopback.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use evb_testkit::net::free_ports;
use evb_testkit::{evb, final_report, wait_all};

/// `evb node --rank RANK` with `sets`, stdout and stderr piped.
fn node_command(rank: u16, sets: &[String]) -> Command {
    let mut cmd = evb();
    cmd.args(["node", "--rank", &rank.to_string()]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

#[test]
fn strangers_are_rejected_and_the_run_goes_on() {
    let port = free_ports(2);
    let sets = [
        format!("transport.base_port={port}"),
        "nodes.count=2".into(),
        "run.max_meps=60".into(),
        "run.duration_s=0".into(),
        "source.events_per_mep=64".into(),
    ];
    let spawn = |rank: u16| node_command(rank, &sets).spawn().unwrap();
    // Node 1 accepts node 0's connection; the strangers get there first.
    let node1 = spawn(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let silent = loop {
        match TcpStream::connect(("127.0.0.1", port + 1)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("node 1 never listened: {e}"),
        }
    };
    let mut garbage = TcpStream::connect(("127.0.0.1", port + 1)).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let node0 = spawn(0);
    let started = Instant::now();
    let [out1, out0]: [_; 2] = wait_all(vec![node1, node0], Duration::from_secs(60))
        .try_into()
        .unwrap();
    drop(silent);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "the strangers held up the run"
    );
    let err1 = String::from_utf8_lossy(&out1.stderr);
    assert!(out0.status.success() && out1.status.success(), "{err1}");
    assert_eq!(
        err1.matches("rejected a connection").count(),
        2,
        "both strangers logged: {err1}"
    );
    // Exact counts: every event built.
    let built: u64 = [&out0, &out1]
        .iter()
        .map(|o| final_report(o)["events_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, 60 * 64);
}

/// Nobody reads the nodes' stdout while they run (a stalled log collector;
/// here each pipe shrunk to one page). Before, a node blocked on its next
/// STATS line once the pipe was full, went silent and was lost by its
/// peer; now STATS lines that cannot be written are dropped and counted,
/// the run goes on, and the FINAL line is still written.
#[test]
fn a_stdout_nobody_reads_does_not_stop_a_node() {
    use std::os::fd::AsRawFd;
    let port = free_ports(2);
    let sets = [
        format!("transport.base_port={port}"),
        "nodes.count=2".into(),
        "run.duration_s=3".into(),
        "source.events_per_mep=64".into(),
    ];
    let spawn = |rank: u16| {
        let child = node_command(rank, &sets)
            .env_remove("EVB_RUN_KEY")
            .spawn()
            .unwrap();
        let fd = child.stdout.as_ref().unwrap().as_raw_fd();
        // SAFETY: F_SETPIPE_SZ on a pipe this process holds.
        let size = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, 4096) };
        assert!(
            size >= 4096,
            "F_SETPIPE_SZ: {}",
            std::io::Error::last_os_error()
        );
        child
    };
    let node1 = spawn(1);
    let node0 = spawn(0);
    // The run lasts 3 s; read nothing until it is over.
    std::thread::sleep(Duration::from_secs(5));
    let readers: Vec<_> = [node0, node1]
        .into_iter()
        .map(|child| std::thread::spawn(move || child.wait_with_output().unwrap()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while readers.iter().any(|r| !r.is_finished()) {
        assert!(Instant::now() < deadline, "the nodes did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let outs: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let stderr: String = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert!(stderr.contains("STATS lines dropped"), "{stderr}");
    for (node, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "node {node}\n{stderr}");
        let v = final_report(out);
        assert!(
            v["peers_lost"].is_null(),
            "node {node} lost a peer: {v}\n{stderr}"
        );
        assert_eq!(v["drain_timed_out"], false, "{stderr}");
        assert!(v["events_built"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["events_incomplete"], 0, "{v}\n{stderr}");
    }
}
