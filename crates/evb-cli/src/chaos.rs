//! `evb chaos`: a randomized fault soak of a real `evb run` (evb-chaos).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use evb_chaos::sandbox::Sandbox;
use evb_chaos::schedule::{parse_list, Kind};
use evb_chaos::{format_table, run_chaos, ChaosOptions};

#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// Event builder configuration (TOML); chaos's settings and then --set apply on top.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override a key: `--set section.key=value` (repeatable; after chaos's own settings).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// RU/BU nodes.
    #[arg(long, short, default_value_t = 4)]
    nodes: u16,
    /// Consumer (Filter Unit) processes.
    #[arg(long, default_value_t = 2)]
    consumers: u16,
    /// Transport: tcp, shm, ucx:tcp, ofi:tcp, ... (sets transport.kind; default shm).
    #[arg(short, long)]
    transport: Option<String>,
    /// Seconds each run builds.
    #[arg(long, short, default_value_t = 30.0)]
    duration: f64,
    /// The first seed (a run's schedule is drawn from its seed: same seed, same schedule).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs, with seeds SEED, SEED+1, ...
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Or: run seeds until this many minutes have passed.
    #[arg(long)]
    minutes: Option<f64>,
    /// Mean seconds between two faults.
    #[arg(long, default_value_t = 2.5)]
    every: f64,
    /// The fault kinds drawn, comma-separated (default: every kind the transport and
    /// privileges allow): kill, kill-em, kill-consumer, stop, link-down, loss, rate,
    /// store-full, stranger, garbage, wrong-key, hello-truncated, hello-replayed.
    #[arg(long, value_name = "KINDS")]
    kinds: Option<String>,
    /// Replay this schedule instead of drawing one (`kind:rank@seconds+seconds/param,...`,
    /// as printed).
    #[arg(long, value_name = "SCHEDULE")]
    faults: Option<String>,
    /// Shrink the first failing schedule to the fewest faults that still fail, with at most
    /// this many more runs; prints the command that replays it.
    #[arg(long, value_name = "RUNS", default_value_t = 0)]
    shrink: u32,
    /// One more invariant: a fault that loses (or leaves incomplete) more than this many
    /// events is a violation (e.g. 0 for "no fault loses anything").
    #[arg(long, value_name = "EVENTS")]
    max_lost: Option<u64>,
    /// Write the runs, every fault's effect and the violations as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Stay in this machine's network and mount namespaces (no network faults, no full store).
    #[arg(long)]
    no_sandbox: bool,
}

pub fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    if !(args.duration >= 8.0 && args.duration.is_finite()) {
        anyhow::bail!("--duration: at least 8 s (3 s without faults first, 2 s at the end)");
    }
    if !(args.every > 0.0 && args.every.is_finite()) {
        anyhow::bail!("--every: a positive number of seconds");
    }
    if args.nodes < 2 {
        anyhow::bail!("--nodes: at least 2");
    }
    let kinds = match &args.kinds {
        Some(list) => list
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| Kind::parse(s.trim()))
            .collect::<anyhow::Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let faults = args.faults.as_deref().map(parse_list).transpose()?;
    // Before any thread: a process with threads cannot leave its mount
    // namespace.
    let sandbox = Sandbox::enter(!args.no_sandbox)?;
    if !sandbox.net {
        eprintln!(
            "evb chaos: not in a namespace of its own (needs root, or --no-sandbox): no link, loss, \
             rate or store-full faults"
        );
    }
    let opts = ChaosOptions {
        config: args.config,
        overrides: args.overrides,
        nodes: args.nodes,
        consumers: args.consumers,
        transport: args.transport,
        duration_s: args.duration,
        seed: args.seed,
        runs: args.runs.max(1),
        minutes: args.minutes,
        interval_s: args.every,
        kinds,
        faults,
        shrink_runs: args.shrink,
        max_lost_per_fault: args.max_lost,
        json: args.json,
        exe: None,
        sandbox: !args.no_sandbox,
    };
    let result = run_chaos(&opts, &sandbox);
    sandbox.remove();
    let result = result?;
    print!("{}", format_table(&result.summary.table));
    let v = &result.summary.violations;
    println!(
        "{} runs, {} faults, {} violations",
        result.summary.runs,
        result.summary.faults.len(),
        v.len()
    );
    for x in v {
        println!("  seed {}: {}", x.seed, x.violation.what);
    }
    if let Some(s) = &result.summary.shrunk {
        println!("shrunk (seed {}): {}", s.seed, s.chaos_command);
        if let Some(c) = &s.run_command {
            println!("as evb run: {c}");
        }
    }
    Ok(if v.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
