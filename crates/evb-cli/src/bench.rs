//! `evb bench`: transport micro-benchmarks (p2p, alltoall) and the
//! transport conformance checks, run as real worker processes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use evb_bench::{launch, run_worker, BenchSpec, Scenario, WorkerResult};
use serde::Serialize;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Point-to-point bandwidth, latency and CPU per message size (like ib_write_bw, osu_bw).
    P2p(P2pArgs),
    /// The shift exchange between N ranks without the Event Manager: the raw fabric.
    Alltoall(AlltoallArgs),
    /// Transport conformance: order, content, many peers, backpressure, dead peer.
    Conformance(ConformanceArgs),
    /// One rank of a benchmark (started by the commands above).
    #[command(hide = true)]
    Worker {
        /// The rank (default: from the launcher's environment, with --rendezvous).
        #[arg(long)]
        rank: Option<u16>,
        #[arg(long)]
        spec: String,
        /// Under mpirun/srun: exchange addresses and write results in DIR.
        #[arg(long)]
        rendezvous: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct Common {
    /// tcp, shm, ofi:<provider>, ucx, ucx:<UCX_TLS>.
    #[arg(short, long, default_value = "tcp")]
    transport: String,
    /// blocking (sleep on the transport's wait object) or busy (spin).
    #[arg(long, default_value = "blocking")]
    progress: String,
    /// Messages in flight per sender.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct P2pArgs {
    #[command(flatten)]
    common: Common,
    /// Smallest message size, bytes (a power of two).
    #[arg(long, default_value_t = 64)]
    min_size: usize,
    /// Largest message size, bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_size: usize,
    /// Seconds of streaming per size.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Both ranks send at once.
    #[arg(long)]
    bidir: bool,
    /// Ping-pong round trips per size, for latency.
    #[arg(long, default_value_t = 200)]
    pingpong: usize,
    /// Write the table as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write bandwidth and latency plots (PREFIX-bandwidth.svg/.png, PREFIX-latency.svg/.png).
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct AlltoallArgs {
    #[command(flatten)]
    common: Common,
    /// Ranks.
    #[arg(short, long, default_value_t = 4)]
    ranks: u16,
    /// Bytes per message (block per pair).
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
    /// Seconds of exchange.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
}

#[derive(Debug, Args)]
pub struct ConformanceArgs {
    #[command(flatten)]
    common: Common,
    /// Ranks.
    #[arg(short, long, default_value_t = 4)]
    ranks: u16,
    /// Messages each rank sends to each other rank.
    #[arg(long, default_value_t = 400)]
    messages: u64,
    /// Rank 1 sleeps this long per message received (backpressure).
    #[arg(long, default_value_t = 0)]
    slow_us: u64,
    /// The last rank kills itself after receiving this many messages (dead peer).
    #[arg(long)]
    die_after: Option<u64>,
    /// A peer silent this long is declared lost, in ms.
    #[arg(long, default_value_t = 800)]
    peer_timeout_ms: u64,
}

/// One row of the p2p table.
#[derive(Debug, Serialize)]
struct P2pRow {
    size: usize,
    /// Receiver-side bandwidth (sum of both directions with --bidir), Gb/s.
    gbps: f64,
    mib_per_s: f64,
    latency_p50_us: Option<f64>,
    latency_p99_us: Option<f64>,
    /// CPU seconds (both processes, user + system) per GB received, and
    /// the user and system parts.
    cpu_s_per_gb: f64,
    cpu_user_s_per_gb: f64,
    cpu_system_s_per_gb: f64,
}

pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("locating the evb executable")?;
    match cmd {
        BenchCommand::Worker {
            rank,
            spec,
            rendezvous,
        } => {
            // Buffers as a node has them (EVB_HUGEPAGES overrides).
            crate::hugepages::choose(evb_core::Config::default().event_builder.huge_pages);
            let spec: BenchSpec = serde_json::from_str(&spec).context("--spec")?;
            let rank = match (rank, evb_control::cluster::launcher_rank()) {
                (Some(r), _) => r,
                (None, Some((r, _, _))) if rendezvous.is_some() => r,
                _ => bail!("give --rank, or run under a launcher with --rendezvous"),
            };
            run_worker(&spec, rank, rendezvous.as_deref())?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::P2p(a) => {
            if !a.min_size.is_power_of_two() || a.max_size < a.min_size {
                bail!("--min-size must be a power of two and at most --max-size");
            }
            let mut spec = spec_from(Scenario::P2p, &a.common, 2);
            spec.sizes = std::iter::successors(Some(a.min_size), |s| Some(s * 2))
                .take_while(|&s| s <= a.max_size)
                .collect();
            spec.seconds = a.seconds;
            spec.bidir = a.bidir;
            spec.pingpong = a.pingpong;
            let limit =
                Duration::from_secs_f64(60.0 + spec.sizes.len() as f64 * (a.seconds + 10.0));
            let results = complete(launch(&exe, &spec, limit)?)?;
            let rows = p2p_rows(&spec, &results);
            println!(
                "evb bench p2p over {} ({}, window {}{})",
                results[0].transport,
                spec.progress,
                spec.window,
                if spec.bidir { ", bidirectional" } else { "" }
            );
            println!(
                "{:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10}",
                "bytes", "Gb/s", "MiB/s", "p50 us", "p99 us", "CPU s/GB", "user", "system"
            );
            let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
            for r in &rows {
                println!(
                    "{:>10} {:>10.3} {:>10.1} {:>10} {:>10} {:>12.3} {:>10.3} {:>10.3}",
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
            if let Some(path) = &a.common.json {
                write_json(
                    path,
                    &serde_json::json!({"kind": "evb-bench-p2p", "spec": spec, "rows": rows, "workers": results}),
                )?;
            }
            if let Some(path) = &a.csv {
                let mut text = String::from(
                    "size,gbps,mib_per_s,latency_p50_us,latency_p99_us,cpu_s_per_gb,cpu_user_s_per_gb,cpu_system_s_per_gb\n",
                );
                let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
                for r in &rows {
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
                std::fs::write(path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            if let Some(prefix) = &a.plot {
                plot_p2p(prefix, &results[0].transport, &rows)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Alltoall(a) => {
            let mut spec = spec_from(Scenario::Alltoall, &a.common, a.ranks);
            spec.sizes = vec![a.size];
            spec.seconds = a.seconds;
            let results = complete(launch(
                &exe,
                &spec,
                Duration::from_secs_f64(a.seconds + 90.0),
            )?)?;
            let total_bytes: u64 = results.iter().map(|r| r.sizes[0].rx_bytes).sum();
            let seconds = results
                .iter()
                .map(|r| r.sizes[0].rx_seconds)
                .fold(0.0, f64::max);
            let gbps = total_bytes as f64 * 8.0 / seconds / 1e9;
            println!(
                "alltoall transport={} ranks={} block={} seconds={seconds:.2} gbps={gbps:.3} per_rank_gbps={:.3}",
                results[0].transport,
                a.ranks,
                a.size,
                gbps / f64::from(a.ranks)
            );
            if let Some(path) = &a.common.json {
                write_json(
                    path,
                    &serde_json::json!({"kind": "evb-bench-alltoall", "spec": spec, "gbps": gbps, "workers": results}),
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Conformance(a) => {
            let mut spec = spec_from(Scenario::Conformance, &a.common, a.ranks);
            spec.messages = a.messages;
            spec.peer_timeout_ms = a.peer_timeout_ms;
            spec.sizes = vec![64, 1000, 4096, 65536, 1 << 20, 4 << 20, 100];
            if a.slow_us > 0 {
                spec.slow_rank = Some(1);
                spec.slow_us = a.slow_us;
            }
            if let Some(n) = a.die_after {
                spec.die_rank = Some(a.ranks - 1);
                spec.die_after = n;
            }
            let results = launch(&exe, &spec, Duration::from_secs(150))?;
            let text = serde_json::to_string_pretty(
                &serde_json::json!({"kind": "evb-bench-conformance", "spec": spec, "workers": results}),
            )?;
            if let Some(path) = &a.common.json {
                std::fs::write(path, &text)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            let mut bad = 0;
            for (rank, r) in results.iter().enumerate() {
                match r {
                    None if spec.die_rank == Some(rank as u16) => {
                        println!("rank {rank}: died on purpose")
                    }
                    None => {
                        bad += 1;
                        println!("rank {rank}: no result");
                    }
                    Some(r) => {
                        println!(
                            "rank {rank}: received {:?}, order errors {}, content errors {}, lost peers {:?}, clean finish {}",
                            r.received_from, r.order_errors, r.content_errors, r.lost_peers, r.finished_clean
                        );
                        bad += usize::from(r.order_errors + r.content_errors > 0);
                    }
                }
            }
            Ok(if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn spec_from(scenario: Scenario, c: &Common, ranks: u16) -> BenchSpec {
    let mut spec = BenchSpec::new(scenario, &c.transport);
    spec.progress = c.progress.clone();
    spec.window = c.window;
    spec.ranks = ranks;
    spec
}

fn complete(results: Vec<Option<WorkerResult>>) -> Result<Vec<WorkerResult>> {
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.ok_or_else(|| anyhow::anyhow!("worker {rank} ended without a result")))
        .collect()
}

fn p2p_rows(spec: &BenchSpec, results: &[WorkerResult]) -> Vec<P2pRow> {
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

fn write_json(path: &std::path::Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn plot_p2p(prefix: &std::path::Path, transport: &str, rows: &[P2pRow]) -> Result<()> {
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
