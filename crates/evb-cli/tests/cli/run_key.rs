//! The run key: an impostor that knows the run id and claims to be node 0,
//! with a well-formed Hello, is rejected because it cannot prove the key;
//! the real node 0 joins and every event is built. Real `evb node`
//! processes, real TCP on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use evb_core::wire::Message;
use evb_testkit::net::free_ports;
use evb_testkit::{evb, final_report, wait_all};

/// Only a guard against a hang: the runs take a second or two.
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn impostor_without_the_key_is_rejected() {
    let dir = std::env::temp_dir().join(format!("evb-runkey-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("run.key");
    std::fs::write(&key_file, "a secret run key, 32+ bytes long\n").unwrap();
    let port = free_ports(2);
    let sets = [
        format!("transport.base_port={port}"),
        format!("transport.run_key_file={}", key_file.display()),
        "nodes.count=2".into(),
        "run.max_meps=60".into(),
        "run.duration_s=0".into(),
        "source.events_per_mep=64".into(),
    ];
    let spawn = |rank: u16| {
        let mut cmd = evb();
        cmd.args(["node", "--rank", &rank.to_string()])
            .env_remove("EVB_RUN_KEY");
        for s in &sets {
            cmd.args(["--set", s]);
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let node1 = spawn(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut impostor = loop {
        match TcpStream::connect(("127.0.0.1", port + 1)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("node 1 never listened: {e}"),
        }
    };
    // A perfect Hello for run 1 as node 0 of 2, a nonce, then a made-up proof.
    let mut hello = Vec::new();
    Message::Hello {
        run_id: 1,
        node: 0,
        nodes: 2,
        host: 0,
        pid: 0,
    }
    .encode_into(&mut hello);
    impostor.write_all(&hello).unwrap();
    impostor.write_all(&[7u8; 16]).unwrap();
    // Node 1 answers with its own Hello, nonce and proof (it cannot know yet).
    impostor
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = vec![0u8; hello.len() + 16 + 32];
    impostor.read_exact(&mut answer).unwrap();
    impostor.write_all(&[0u8; 32]).unwrap();

    let node0 = spawn(0);
    let [out1, out0]: [_; 2] = wait_all(vec![node1, node0], LIMIT).try_into().unwrap();
    let err1 = String::from_utf8_lossy(&out1.stderr);
    let err0 = String::from_utf8_lossy(&out0.stderr);
    assert!(
        out0.status.success() && out1.status.success(),
        "{err0}\n{err1}"
    );
    assert!(
        err1.contains("rejected a connection") && err1.contains("did not prove the run key"),
        "{err1}"
    );
    let built: u64 = [&out0, &out1]
        .iter()
        .map(|o| final_report(o)["events_built"].as_u64().unwrap())
        .sum();
    assert_eq!(built, 60 * 64);
}

#[test]
fn nodes_with_different_keys_do_not_connect() {
    let dir = std::env::temp_dir().join(format!("evb-runkey2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_ports(2);
    let spawn = |rank: u16, key: &str| {
        let key_file = dir.join(format!("key{rank}"));
        std::fs::write(&key_file, key).unwrap();
        evb()
            .args(["node", "--rank", &rank.to_string()])
            .args(["--set", &format!("transport.base_port={port}")])
            .args([
                "--set",
                &format!("transport.run_key_file={}", key_file.display()),
            ])
            .args(["--set", "nodes.count=2", "--set", "run.duration_s=1"])
            .env_remove("EVB_RUN_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let node1 = spawn(1, "the key of node one, long enough");
    let node0 = spawn(0, "another key entirely, long enough");
    let [out0]: [_; 1] = wait_all(vec![node0], LIMIT).try_into().unwrap();
    let err0 = String::from_utf8_lossy(&out0.stderr);
    assert!(!out0.status.success(), "{err0}");
    assert!(err0.contains("did not prove the run key"), "{err0}");
    let mut node1 = node1;
    let _ = node1.kill();
    let _ = node1.wait();
}
