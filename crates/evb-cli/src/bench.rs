//! `evb bench`: transport micro-benchmarks (p2p, alltoall) and the
//! transport conformance checks, run as real worker processes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use evb_bench::results::{
    complete, conformance, conformance_json, p2p_csv, p2p_json, p2p_rows, p2p_table, plot_p2p,
    Alltoall,
};
use evb_bench::{launch, run_worker, BenchSpec, Scenario};

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

pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("locating the evb executable")?;
    match cmd {
        BenchCommand::Worker {
            rank,
            spec,
            rendezvous,
        } => {
            let spec: BenchSpec = serde_json::from_str(&spec).context("--spec")?;
            // Buffers as a node has them (the environment's overrides
            // applied), chosen before any is allocated.
            evb_transport::hugepages::choose(spec.config()?.event_builder.huge_pages);
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
            print!("{}", p2p_table(&spec, &results[0].transport, &rows));
            if let Some(path) = &a.common.json {
                write_json(path, &p2p_json(&spec, &rows, &results))?;
            }
            if let Some(path) = &a.csv {
                write(path, &p2p_csv(&rows))?;
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
            let all = Alltoall::of(&results);
            print!("{}", all.line(&spec, &results[0].transport));
            if let Some(path) = &a.common.json {
                write_json(path, &all.json(&spec, &results))?;
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
            if let Some(path) = &a.common.json {
                write_json(path, &conformance_json(&spec, &results))?;
            }
            let (verdict, bad) = conformance(&spec, &results);
            print!("{verdict}");
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

fn write_json(path: &std::path::Path, v: &serde_json::Value) -> Result<()> {
    write(path, &serde_json::to_string_pretty(v)?)
}

fn write(path: &std::path::Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
