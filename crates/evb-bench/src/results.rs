//! What `evb bench` makes of its workers' results: the p2p table (text,
//! CSV, JSON, plots), the alltoall figure and the conformance verdict.
//! The command line only chooses what to print and where to write it.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use serde::Serialize;

use crate::{BenchSpec, WorkerResult};

/// Every worker's result, or an error naming the first that has none.
pub fn complete(results: Vec<Option<WorkerResult>>) -> Result<Vec<WorkerResult>> {
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.ok_or_else(|| anyhow!("worker {rank} ended without a result")))
        .collect()
}

/// One row of the p2p table.
#[derive(Debug, Serialize)]
pub struct P2pRow {
    pub size: usize,
    /// Receiver-side bandwidth (sum of both directions with --bidir), Gb/s.
    pub gbps: f64,
    pub mib_per_s: f64,
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
    /// CPU seconds (both processes, user + system) per GB received, and
    /// the user and system parts.
    pub cpu_s_per_gb: f64,
    pub cpu_user_s_per_gb: f64,
    pub cpu_system_s_per_gb: f64,
}

/// The p2p table's rows, one per message size, from the two workers.
pub fn p2p_rows(spec: &BenchSpec, results: &[WorkerResult]) -> Vec<P2pRow> {
    (0..spec.sizes.len())
        .map(|i| {
            let r0 = &results[0].sizes[i];
            let r1 = &results[1].sizes[i];
            // Rank 1 receives the stream; with --bidir both directions add up.
            let gbps = r1.rx_gbps + if spec.bidir { r0.rx_gbps } else { 0.0 };
            let rx_bytes = r1.rx_bytes + if spec.bidir { r0.rx_bytes } else { 0 };
            let cpu = r0.cpu_s + r1.cpu_s;
            let per_gb = |s: f64| {
                if rx_bytes > 0 {
                    s / (rx_bytes as f64 / 1e9)
                } else {
                    0.0
                }
            };
            P2pRow {
                size: r0.size,
                gbps,
                mib_per_s: gbps * 1e9 / 8.0 / (1 << 20) as f64,
                latency_p50_us: r0.latency_p50_us,
                latency_p99_us: r0.latency_p99_us,
                cpu_s_per_gb: per_gb(cpu),
                cpu_user_s_per_gb: per_gb(r0.cpu_user_s + r1.cpu_user_s),
                cpu_system_s_per_gb: per_gb(r0.cpu_system_s + r1.cpu_system_s),
            }
        })
        .collect()
}

/// The p2p table as `evb bench p2p` prints it.
pub fn p2p_table(spec: &BenchSpec, transport: &str, rows: &[P2pRow]) -> String {
    let mut out = format!(
        "evb bench p2p over {transport} ({}, window {}{})\n",
        spec.progress,
        spec.window,
        if spec.bidir { ", bidirectional" } else { "" }
    );
    out += &format!(
        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10}\n",
        "bytes", "Gb/s", "MiB/s", "p50 us", "p99 us", "CPU s/GB", "user", "system"
    );
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    for r in rows {
        out += &format!(
            "{:>10} {:>10.3} {:>10.1} {:>10} {:>10} {:>12.3} {:>10.3} {:>10.3}\n",
            r.size,
            r.gbps,
            r.mib_per_s,
            opt(r.latency_p50_us),
            opt(r.latency_p99_us),
            r.cpu_s_per_gb,
            r.cpu_user_s_per_gb,
            r.cpu_system_s_per_gb
        );
    }
    out
}

/// The p2p table as CSV.
pub fn p2p_csv(rows: &[P2pRow]) -> String {
    let mut text = String::from(
        "size,gbps,mib_per_s,latency_p50_us,latency_p99_us,cpu_s_per_gb,cpu_user_s_per_gb,cpu_system_s_per_gb\n",
    );
    let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    for r in rows {
        text.push_str(&format!(
            "{},{:.4},{:.2},{},{},{:.4},{:.4},{:.4}\n",
            r.size,
            r.gbps,
            r.mib_per_s,
            o(r.latency_p50_us),
            o(r.latency_p99_us),
            r.cpu_s_per_gb,
            r.cpu_user_s_per_gb,
            r.cpu_system_s_per_gb
        ));
    }
    text
}

/// The p2p results as JSON (`--json`).
pub fn p2p_json(spec: &BenchSpec, rows: &[P2pRow], results: &[WorkerResult]) -> serde_json::Value {
    serde_json::json!({"kind": "evb-bench-p2p", "spec": spec, "rows": rows, "workers": results})
}

/// Bandwidth and latency plots: PREFIX-bandwidth.svg/.png and, with a
/// ping-pong, PREFIX-latency.svg/.png.
pub fn plot_p2p(prefix: &Path, transport: &str, rows: &[P2pRow]) -> Result<()> {
    use evb_plot::{line_chart, Series};
    let name = |suffix: &str| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    let x = |r: &P2pRow| (r.size as f64).log2();
    line_chart(
        &name("-bandwidth"),
        &format!("evb bench p2p over {transport}: bandwidth"),
        "message size (log2 bytes)",
        "Gb/s",
        &[Series {
            name: transport.into(),
            points: rows.iter().map(|r| (x(r), r.gbps)).collect(),
        }],
    )?;
    let lat: Vec<&P2pRow> = rows.iter().filter(|r| r.latency_p50_us.is_some()).collect();
    if !lat.is_empty() {
        line_chart(
            &name("-latency"),
            &format!("evb bench p2p over {transport}: one-way latency"),
            "message size (log2 bytes)",
            "microseconds",
            &[
                Series {
                    name: "p50".into(),
                    points: lat
                        .iter()
                        .map(|r| (x(r), r.latency_p50_us.unwrap_or(0.0)))
                        .collect(),
                },
                Series {
                    name: "p99".into(),
                    points: lat
                        .iter()
                        .map(|r| (x(r), r.latency_p99_us.unwrap_or(0.0)))
                        .collect(),
                },
            ],
        )?;
    }
    Ok(())
}

/// The exchange's aggregate: bytes all ranks received over the longest
/// rank's time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alltoall {
    pub seconds: f64,
    pub gbps: f64,
}

impl Alltoall {
    pub fn of(results: &[WorkerResult]) -> Alltoall {
        let total_bytes: u64 = results.iter().map(|r| r.sizes[0].rx_bytes).sum();
        let seconds = results
            .iter()
            .map(|r| r.sizes[0].rx_seconds)
            .fold(0.0, f64::max);
        Alltoall {
            seconds,
            gbps: total_bytes as f64 * 8.0 / seconds / 1e9,
        }
    }

    /// The line `evb bench alltoall` prints.
    pub fn line(&self, spec: &BenchSpec, transport: &str) -> String {
        format!(
            "alltoall transport={transport} ranks={} block={} seconds={:.2} gbps={:.3} per_rank_gbps={:.3}\n",
            spec.ranks,
            spec.sizes[0],
            self.seconds,
            self.gbps,
            self.gbps / f64::from(spec.ranks)
        )
    }

    /// The results as JSON (`--json`).
    pub fn json(&self, spec: &BenchSpec, results: &[WorkerResult]) -> serde_json::Value {
        serde_json::json!({"kind": "evb-bench-alltoall", "spec": spec, "gbps": self.gbps, "workers": results})
    }
}

/// The conformance check's verdict: a line per rank, and how many ranks
/// failed (no result without having been told to die, or order or content
/// errors).
pub fn conformance(spec: &BenchSpec, results: &[Option<WorkerResult>]) -> (String, usize) {
    let mut text = String::new();
    let mut bad = 0;
    for (rank, r) in results.iter().enumerate() {
        match r {
            None if spec.die_rank == Some(rank as u16) => {
                text += &format!("rank {rank}: died on purpose\n")
            }
            None => {
                bad += 1;
                text += &format!("rank {rank}: no result\n");
            }
            Some(r) => {
                text += &format!(
                    "rank {rank}: received {:?}, order errors {}, content errors {}, lost peers {:?}, clean finish {}\n",
                    r.received_from, r.order_errors, r.content_errors, r.lost_peers, r.finished_clean
                );
                bad += usize::from(r.order_errors + r.content_errors > 0);
            }
        }
    }
    (text, bad)
}

/// The conformance results as JSON (`--json`).
pub fn conformance_json(spec: &BenchSpec, results: &[Option<WorkerResult>]) -> serde_json::Value {
    serde_json::json!({"kind": "evb-bench-conformance", "spec": spec, "workers": results})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Scenario, SizeResult};

    fn worker(rank: u16, sizes: &[(usize, u64, f64, f64)]) -> WorkerResult {
        WorkerResult {
            rank,
            transport: "tcp".into(),
            sizes: sizes
                .iter()
                .map(|&(size, rx_bytes, rx_gbps, cpu_s)| SizeResult {
                    size,
                    rx_bytes,
                    rx_seconds: 1.0,
                    rx_gbps,
                    cpu_s,
                    cpu_user_s: cpu_s / 4.0,
                    cpu_system_s: cpu_s * 3.0 / 4.0,
                    latency_p50_us: (rank == 0).then_some(2.5),
                    latency_p99_us: (rank == 0).then_some(9.0),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn p2p_rows_count_what_rank_1_received_and_both_ways_with_bidir() {
        let mut spec = BenchSpec::new(Scenario::P2p, "tcp");
        spec.sizes = vec![64, 1 << 20];
        let results = [
            worker(0, &[(64, 1_000_000_000, 8.0, 0.5), (1 << 20, 0, 0.0, 0.25)]),
            worker(
                1,
                &[(64, 2_000_000_000, 16.0, 0.5), (1 << 20, 0, 0.0, 0.25)],
            ),
        ];
        let rows = p2p_rows(&spec, &results);
        assert_eq!(rows[0].gbps, 16.0);
        // 1 CPU second for 2 GB received.
        assert_eq!(rows[0].cpu_s_per_gb, 0.5);
        assert_eq!(rows[0].cpu_user_s_per_gb, 0.125);
        assert_eq!(rows[0].latency_p50_us, Some(2.5));
        // Nothing received: no CPU per GB (not a division by zero).
        assert_eq!(rows[1].cpu_s_per_gb, 0.0);
        spec.bidir = true;
        let rows = p2p_rows(&spec, &results);
        assert_eq!(rows[0].gbps, 24.0);
        assert_eq!(rows[0].cpu_s_per_gb, 1.0 / 3.0);
        let csv = p2p_csv(&rows);
        assert_eq!(
            csv.lines().nth(1),
            Some("64,24.0000,2861.02,2.500,9.000,0.3333,0.0833,0.2500")
        );
        let table = p2p_table(&spec, "tcp", &rows);
        assert!(table.starts_with("evb bench p2p over tcp (blocking, window 16, bidirectional)\n"));
        assert_eq!(table.lines().count(), 4);
    }

    #[test]
    fn conformance_fails_on_errors_and_unplanned_deaths_only() {
        let mut spec = BenchSpec::new(Scenario::Conformance, "shm");
        spec.ranks = 4;
        spec.die_rank = Some(3);
        let clean = WorkerResult {
            received_from: vec![0, 400, 400, 120],
            finished_clean: true,
            ..Default::default()
        };
        let disordered = WorkerResult {
            order_errors: 2,
            ..clean.clone()
        };
        let (text, bad) = conformance(&spec, &[Some(clean.clone()), None, Some(disordered), None]);
        assert_eq!(bad, 2, "{text}");
        assert!(text.contains("rank 1: no result\n"), "{text}");
        assert!(text.contains("rank 3: died on purpose\n"), "{text}");
        assert!(
            text.contains("rank 2: received [0, 400, 400, 120], order errors 2"),
            "{text}"
        );
        let (_, bad) = conformance(&spec, &[Some(clean.clone()), Some(clean), None, None]);
        assert_eq!(bad, 1);
    }

    #[test]
    fn alltoall_is_all_bytes_received_over_the_slowest_rank() {
        let results = [
            worker(0, &[(1 << 20, 1_000_000_000, 0.0, 0.0)]),
            worker(1, &[(1 << 20, 3_000_000_000, 0.0, 0.0)]),
        ];
        let mut slow = results[1].clone();
        slow.sizes[0].rx_seconds = 2.0;
        let all = Alltoall::of(&[results[0].clone(), slow]);
        assert_eq!(all.seconds, 2.0);
        assert_eq!(all.gbps, 16.0);
        let mut spec = BenchSpec::new(Scenario::Alltoall, "shm");
        spec.sizes = vec![1 << 20];
        assert_eq!(
            all.line(&spec, "shm"),
            "alltoall transport=shm ranks=2 block=1048576 seconds=2.00 gbps=16.000 per_rank_gbps=8.000\n"
        );
    }
}
