//! Helpers shared by the integration tests that start nodes and launchers.

// Each test file is its own crate and uses some of these.
#![allow(dead_code)]

pub mod netns;
pub mod slurm;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// evb built against MPICH (scripts/evb-mpich.sh: the `mpi` crate binds one
/// MPI at build time, and the default build is OpenMPI's).
pub fn mpich_evb() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/evb-mpich.sh");
    let out = Command::new("bash")
        .arg(script)
        .stderr(Stdio::inherit())
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{script} failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The JSON of a node's `FINAL ` line on its stdout; panics, with the
/// node's output, when there is none.
pub fn final_report(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("FINAL "))
        .unwrap_or_else(|| {
            panic!(
                "no final report: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(&line[6..]).unwrap()
}

/// Runs `cmd` to its end, reading its output while waiting (it can be more
/// than a pipe holds); kills it and panics after `limit`. `what` names it.
pub fn run_bounded(cmd: &mut Command, what: &str, limit: Duration) -> (Output, String) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(limit) else {
        // SAFETY: signalling the process we started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        panic!("{what} did not finish within {limit:?}");
    };
    let out = out.unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out, text)
}

/// Waits for every child, reading their output meanwhile (more than a pipe
/// holds would block them); after `limit` kills those still running and
/// panics. The outputs come in the children's order.
pub fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, child) in children.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((i, child.wait_with_output()));
        });
    }
    let deadline = Instant::now() + limit;
    let mut outs: Vec<Option<Output>> = pids.iter().map(|_| None).collect();
    for _ in 0..pids.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, out)) => outs[i] = Some(out.expect("waiting for a child")),
            Err(_) => {
                let running: Vec<usize> = (0..pids.len()).filter(|&i| outs[i].is_none()).collect();
                for &i in &running {
                    // SAFETY: signalling a child of ours not yet reaped.
                    unsafe { libc::kill(pids[i] as i32, libc::SIGKILL) };
                }
                panic!("processes {running:?} did not finish within {limit:?}");
            }
        }
    }
    outs.into_iter().map(|o| o.expect("all finished")).collect()
}
