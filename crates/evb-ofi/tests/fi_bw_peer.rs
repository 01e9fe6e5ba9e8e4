//! The C reference peer (bench/peers/fi_bw.sh) builds and measures something
//! sensible over loopback, so the comparison with evb's ofi transport has a
//! working baseline.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn fi_bw_runs_over_tcp_loopback() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/peers/fi_bw.sh");
    let started = Instant::now();
    // fi_bw's own alarm (-t) bounds the run; `timeout` guards the script too.
    let out = Command::new("timeout")
        .args(["120", script, "tcp", "-B", "-m", "65536", "-t", "100"])
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
