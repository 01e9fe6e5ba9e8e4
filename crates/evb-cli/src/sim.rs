//! `evb sim`: simulate an event builder (or synthetic traffic) on a fabric.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use clap::Args;
use evb_core::Config;
use evb_sim::fabric::SimFabric;
use evb_sim::output;
use evb_sim::scan::ScanResult;
use evb_sim::setup::{default_topology, sized_config, FabricSpec};

#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Event builder and simulation configuration (TOML, `[sim]` section).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Override a key: `--set section.key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Fabric: `switch:hosts=N` (one switch), `fat-tree:radix=36,hosts=72[,...]`
    /// (see docs/fabric.md), or an `ibnetdiscover` file. Default: one switch
    /// with a host for every endpoint the configuration puts on the fabric
    /// when it sets nodes.count (nodes, a separate EM, consumers with
    /// sim.output.network = "fabric"), else `switch:hosts=16`.
    #[arg(long)]
    pub topology: Option<String>,
    /// Forwarding tables to use (OpenSM `opensm-lfts.dump` or `dump_lfts`
    /// output); without it, `--routing` computes them.
    #[arg(long)]
    pub lfts: Option<PathBuf>,
    #[arg(long, help = crate::vocab::ROUTING_HELP)]
    pub routing: Option<String>,
    #[arg(long, help = crate::vocab::ORDER_HELP)]
    pub order: Option<String>,
    /// What-if: remove a host or switch by name (repeatable), as `evb fabric`.
    #[arg(long = "remove")]
    pub remove: Vec<String>,
    /// What-if: remove the cable at NAME:PORT (repeatable).
    #[arg(long = "remove-link")]
    pub remove_link: Vec<String>,
    /// What-if: swap the far ends of two cables, A:PORT,B:PORT (repeatable).
    #[arg(long = "swap-cables")]
    pub swap_cables: Vec<String>,
    /// Traffic (sets sim.traffic): eb, shift-fixed, shift-window, uniform, permutation, incast, all-to-all.
    #[arg(long)]
    pub traffic: Option<String>,
    /// Simulated time in microseconds (sets sim.duration_us).
    #[arg(long)]
    pub duration_us: Option<f64>,
    /// Offered load for `uniform` (sets sim.load).
    #[arg(long)]
    pub load: Option<f64>,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the throughput time series as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write every host's sent and received payload over time as CSV
    /// (t_us, then `<host>.tx`, `<host>.rx` per host, Gb/s).
    #[arg(long)]
    pub csv_hosts: Option<PathBuf>,
    /// Write plots: PREFIX-throughput.{svg,png}, PREFIX-links.{svg,png} and,
    /// with consumers, PREFIX-consumers.{svg,png} and PREFIX-busy.{svg,png}.
    #[arg(long, value_name = "PREFIX")]
    pub plot: Option<PathBuf>,
    /// Write the run's port counters as a counters snapshot, the format of
    /// `evb fabric counters` (for `evb fabric diagnose`).
    #[arg(long, value_name = "FILE")]
    pub counters: Option<PathBuf>,
}

/// The topology `--topology` names or, without it, the default sized for
/// the configuration and its overrides ([`default_topology`]), with a
/// note when it was sized so.
fn topology(args: &SimArgs, overrides: &[String]) -> Result<(String, Option<String>)> {
    match &args.topology {
        Some(t) => Ok((t.clone(), None)),
        None => default_topology(args.config.as_deref(), overrides),
    }
}

/// The fabric `topology`, `--lfts`/`--routing`, `--order` and the edits
/// describe.
fn fabric_spec(args: &SimArgs, topology: &str) -> FabricSpec {
    FabricSpec {
        topology: topology.to_string(),
        lfts: args.lfts.clone(),
        routing: args.routing.clone(),
        order: args.order.clone(),
        remove: args.remove.clone(),
        remove_link: args.remove_link.clone(),
        swap_cables: args.swap_cables.clone(),
    }
}

/// `--set` and the options that set `sim.*` keys, as overrides.
fn overrides(args: &SimArgs) -> Vec<String> {
    let mut overrides = args.overrides.clone();
    if let Some(t) = &args.traffic {
        overrides.push(format!("sim.traffic=\"{t}\""));
    }
    if let Some(d) = args.duration_us {
        overrides.push(format!("sim.duration_us={d}"));
    }
    if let Some(l) = args.load {
        overrides.push(format!("sim.load={l}"));
    }
    overrides
}

pub fn run(args: SimArgs) -> Result<()> {
    let overrides = overrides(&args);
    let (topology, sized) = topology(&args, &overrides)?;
    let spec = fabric_spec(&args, &topology);
    let fabric = spec.build()?;
    let (config, more) = sized_config(args.config.as_deref(), &overrides, &fabric)?;
    let notes: Vec<String> = sized.into_iter().chain(more).collect();
    let bar = crate::progress::bar(1000, "simulating");
    let mut result = evb_sim::simulate(&config, fabric, |f| bar.set_position((f * 1000.0) as u64))
        .map_err(anyhow::Error::msg)?;
    result.summary.notes = notes;
    bar.finish_and_clear();
    print!("{}", output::summary_text(&result));
    if let Some(path) = &args.json {
        write(path, &serde_json::to_string_pretty(&result)?)?;
    }
    if let Some(path) = &args.csv_hosts {
        write(path, &output::hosts_csv(&result))?;
    }
    if let Some(prefix) = &args.plot {
        for p in output::write_plots(prefix, &result)? {
            println!("wrote {}", p.display());
        }
    }
    if let Some(path) = &args.csv {
        write(path, &output::timeseries_csv(&result))?;
    }
    if let Some(path) = &args.counters {
        let Some(topo) = spec.topology()? else {
            bail!("--counters: switch:hosts=N has no ports to name; give a fat-tree: or ibnetdiscover topology");
        };
        let snap = output::counters_snapshot(&result, &topo)?;
        write(path, &snap.to_json())?;
        println!(
            "wrote {} ({} ports' counters)",
            path.display(),
            snap.ports.len()
        );
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ScanArgs {
    #[command(subcommand)]
    pub command: Option<ScanCommand>,
    #[command(flatten)]
    pub sim: SimArgs,
    /// A scanned key and its values: `--param event_builder.credits=1,2,4`
    /// (repeatable); `order` and `routing` scan the rank order and routing
    /// engine (`--param order=name,ftree,random:1`).
    #[arg(long = "param", value_name = "KEY=V1,V2,...")]
    pub params: Vec<String>,
    /// Run only shard I of N (points whose index mod N is I), e.g. from a
    /// Slurm job array: `--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Run every point with R seeds (run.seed, run.seed + 1, ...) and rank
    /// by their mean, with a 95 % interval.
    #[arg(long, default_value_t = 1, value_name = "R")]
    pub replications: usize,
    /// What to rank by: built (Gb/s per node, or per host for synthetic
    /// traffic), producer or consumer (Gb/s per producer / per consumer of
    /// the distribution to consumers).
    #[arg(long, default_value = "built")]
    pub figure: String,
    /// Simulations run at once, each on a thread of its own (default: one
    /// per core).
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<usize>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ScanCommand {
    /// Join the JSON results of the shards of one scan.
    Merge(MergeArgs),
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Shard results (`evb scan --shard ... --json FILE`).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write the heat map: PREFIX-heatmap.{svg,png}.
    #[arg(long, value_name = "PREFIX")]
    pub plot: Option<PathBuf>,
}

/// The configuration of one scan point: the base overrides, then the point's.
fn point_overrides(base: &[String], point: &[String]) -> Vec<String> {
    base.iter().chain(point).cloned().collect()
}

pub fn scan(args: ScanArgs) -> Result<()> {
    if let Some(ScanCommand::Merge(m)) = args.command {
        return merge(m);
    }
    if args.params.is_empty() {
        bail!("evb scan needs at least one --param KEY=V1,V2,...");
    }
    let shard = args.shard.as_deref().map(parse_shard).transpose()?;
    if args.jobs == Some(0) {
        bail!("--jobs must be at least 1");
    }
    let sim = args.sim;
    let axes = args
        .params
        .iter()
        .map(|p| evb_sim::scan::Axis::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let base = overrides(&sim);
    let figure = evb_sim::scan::Figure::parse(&args.figure).map_err(anyhow::Error::msg)?;
    let total: usize = axes.iter().map(|a| a.values.len()).product::<usize>() * args.replications;
    let bar = crate::progress::bar(total as u64, "scan points");
    // One fabric per (topology, order, routing) met in the scan: the
    // topology is sized for each point's configuration when --topology is
    // not given, as `evb sim` sizes it.
    type Key = (String, Option<String>, Option<String>);
    let fabrics = Mutex::new(HashMap::<Key, SimFabric>::new());
    let notes = Mutex::new(Vec::<String>::new());
    let load = |point: &[(String, String)]| -> Result<(Config, SimFabric), String> {
        let mut args = sim.clone();
        let mut overrides = Vec::new();
        for (k, v) in point {
            match k.as_str() {
                "order" => args.order = Some(v.clone()),
                "routing" => args.routing = Some(v.clone()),
                _ => overrides.push(format!("{k}={v}")),
            }
        }
        let all = point_overrides(&base, &overrides);
        let (topology, sized) = topology(&args, &all).map_err(|e| format!("{e:#}"))?;
        let key = (topology.clone(), args.order.clone(), args.routing.clone());
        let cached = fabrics.lock().expect("not poisoned").get(&key).cloned();
        let fabric = match cached {
            Some(f) => f,
            None => {
                let f = fabric_spec(&args, &topology)
                    .build()
                    .map_err(|e| format!("{e:#}"))?;
                fabrics.lock().expect("not poisoned").insert(key, f.clone());
                f
            }
        };
        let (config, more) =
            sized_config(sim.config.as_deref(), &all, &fabric).map_err(|e| format!("{e:#}"))?;
        let mut said = notes.lock().expect("not poisoned");
        for n in sized.into_iter().chain(more) {
            if !said.contains(&n) {
                said.push(n);
            }
        }
        Ok((config, fabric))
    };
    let options = evb_sim::scan::ScanOptions {
        shard,
        replications: args.replications,
        figure,
        jobs: args.jobs,
    };
    let result =
        evb_sim::scan::run_scan(&axes, load, options, || bar.inc(1)).map_err(anyhow::Error::msg)?;
    bar.finish_and_clear();
    let mut names: Vec<String> = fabrics
        .into_inner()
        .expect("not poisoned")
        .into_values()
        .map(|f| f.name)
        .collect();
    names.sort();
    let fabric = match names.len() {
        1..=3 => names.join(" | "),
        n => format!("{n} fabrics"),
    };
    print_scan(&result, &fabric);
    for n in notes.into_inner().expect("not poisoned") {
        println!("note: {n}");
    }
    write_scan(
        &result,
        sim.json.as_deref(),
        sim.csv.as_deref(),
        sim.plot.as_deref(),
    )
}

/// `--shard I/N`.
fn parse_shard(s: &str) -> Result<[usize; 2]> {
    let (i, n) = s
        .split_once('/')
        .with_context(|| format!("--shard {s}: expected I/N"))?;
    Ok([
        i.trim()
            .parse()
            .with_context(|| format!("--shard {s}: bad I"))?,
        n.trim()
            .parse()
            .with_context(|| format!("--shard {s}: bad N"))?,
    ])
}

fn merge(m: MergeArgs) -> Result<()> {
    let shards = m
        .inputs
        .iter()
        .map(|p| -> Result<ScanResult> {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{}: not an evb scan result", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let result = evb_sim::scan::merge(shards).map_err(anyhow::Error::msg)?;
    print_scan(&result, "merged shards");
    write_scan(
        &result,
        m.json.as_deref(),
        m.csv.as_deref(),
        m.plot.as_deref(),
    )
}

fn print_scan(result: &ScanResult, fabric: &str) {
    print!("{}", output::scan_text(result, fabric));
}

fn write_scan(
    result: &ScanResult,
    json: Option<&Path>,
    csv: Option<&Path>,
    plot: Option<&Path>,
) -> Result<()> {
    if let Some(path) = json {
        write(path, &serde_json::to_string_pretty(result)?)?;
    }
    if let Some(path) = csv {
        write(path, &output::scan_csv(result))?;
    }
    if let Some(prefix) = plot {
        for p in output::write_heat_map(prefix, result)? {
            println!("wrote {}", p.display());
        }
    }
    Ok(())
}
