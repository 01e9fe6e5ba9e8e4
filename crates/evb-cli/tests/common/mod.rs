//! Helpers shared by the integration tests that start nodes and launchers.

// Each test file is its own crate and uses some of these.
#![allow(dead_code)]

pub mod slurm;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

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
