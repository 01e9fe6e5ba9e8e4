//! The C reference peer (bench/peers/fi_bw.sh) builds and measures something
//! sensible over loopback, so the comparison with evb's ofi transport has a
//! working baseline.

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One test at a time: each runs `make fi_bw`, and in a fresh checkout one
/// would exec the binary while the other is still writing it ("Text file
/// busy").
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn fi_bw_runs_over_tcp_loopback() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/peers/fi_bw.sh");
    let started = Instant::now();
    // fi_bw's own alarm (-t) bounds the run; `timeout` guards the script too.
    // 16 MiB a size (-V; the benchmark's default of 256 MiB took 45 s of the
    // suite at 64 B messages): what is checked is that every size is
    // measured, with a positive bandwidth and latency.
    let out = Command::new("timeout")
        .args([
            "120", script, "tcp", "-B", "-m", "65536", "-V", "16", "-t", "100",
        ])
        .output()
        .expect("running bench/peers/fi_bw.sh (needs coreutils timeout, make, cc, libfabric-dev)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fi_bw.sh failed: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<f64>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            l.split_whitespace()
                .map(|f| f.parse().expect("numeric column"))
                .collect()
        })
        .collect();
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(
        sizes,
        (6..=16).map(|s| (1u64 << s) as f64).collect::<Vec<_>>(),
        "{stdout}"
    );
    for r in &rows {
        assert_eq!(r.len(), 3, "{stdout}");
        assert!(
            r[1] > 0.0 && r[2] > 0.0,
            "bandwidth and latency must be positive: {stdout}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(120));
}

/// `-s`/`-m` pick the sizes and `-V` the volume (what
/// bench/peers/ofi_vs_evb.sh uses for runs of seconds at one size); a size
/// that is not a power of two is refused before anything starts.
#[test]
fn fi_bw_runs_one_size_for_a_given_volume() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/peers/fi_bw.sh");
    let out = Command::new("timeout")
        .args([
            "120", script, "tcp", "-B", "-s", "4096", "-m", "8192", "-V", "16", "-t", "100",
        ])
        .output()
        .expect("running bench/peers/fi_bw.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sizes: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(sizes, ["4096", "8192"], "{stdout}");

    let bad = Command::new("timeout")
        .args(["60", script, "tcp", "-s", "5000", "-t", "30"])
        .output()
        .expect("running bench/peers/fi_bw.sh");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("-s must be a power of two"), "{err}");
}
