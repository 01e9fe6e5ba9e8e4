//! `evb sim`: simulate an event builder (or synthetic traffic) on a fabric.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use evb_core::Config;
use evb_sim::fabric::SimFabric;

#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Event builder and simulation configuration (TOML, `[sim]` section).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Override a key: `--set section.key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Fabric: `switch:hosts=N` (one switch), `fat-tree:radix=36,hosts=72[,...]`
    /// (see docs/fabric.md), or an `ibnetdiscover` file.
    #[arg(long, default_value = "switch:hosts=16")]
    pub topology: String,
    /// Forwarding tables to use (OpenSM `opensm-lfts.dump` or `dump_lfts`
    /// output); without it, `--routing` computes them.
    #[arg(long)]
    pub lfts: Option<PathBuf>,
    /// Routing engine when no --lfts: ftree, minhop, dmodk, random:SEED.
    #[arg(long, default_value = "ftree")]
    pub routing: String,
    /// Rank order: name, lid, leaf, random:SEED, ftree, or a hostfile.
    #[arg(long, default_value = "name")]
    pub order: String,
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
}

/// Builds the simulated fabric from `--topology`, `--lfts`/`--routing`, `--order`.
pub fn build_fabric(args: &SimArgs) -> Result<SimFabric> {
    if let Some(params) = args.topology.strip_prefix("switch:") {
        let mut hosts = None;
        for kv in params.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').with_context(|| {
                format!("--topology {}: `{kv}` is not key=value", args.topology)
            })?;
            match k {
                "hosts" => {
                    hosts = Some(v.parse::<usize>().with_context(|| {
                        format!("--topology {}: hosts needs a whole number", args.topology)
                    })?)
                }
                other => bail!("--topology {}: unknown parameter `{other}`", args.topology),
            }
        }
        let hosts =
            hosts.with_context(|| format!("--topology {}: needs hosts=N", args.topology))?;
        if !(2..=4096).contains(&hosts) {
            bail!(
                "--topology {}: hosts must be between 2 and 4096",
                args.topology
            );
        }
        if !(args.remove.is_empty() && args.remove_link.is_empty() && args.swap_cables.is_empty()) {
            bail!("--remove, --remove-link and --swap-cables edit fat trees and ibnetdiscover fabrics, not switch:hosts=N");
        }
        return Ok(SimFabric::single_switch(hosts));
    }
    if !args.topology.starts_with("fat-tree") && !std::path::Path::new(&args.topology).exists() {
        bail!(
            "--topology: unknown kind `{}` (switch:hosts=N, fat-tree:radix=R,hosts=N, or an ibnetdiscover file)",
            args.topology
        );
    }
    let mut topo = evb_fabric::io::load_topology(&args.topology)?;
    crate::fabric::apply_edits(
        &mut topo,
        &args.remove,
        &args.remove_link,
        &args.swap_cables,
    )?;
    let lfts = match &args.lfts {
        Some(path) => evb_fabric::io::parse_lfts(path, &topo)?,
        None => {
            // As OpenSM does: an engine that cannot route the fabric falls
            // back to minhop, and says why.
            let engine = evb_fabric::routing::Engine::parse(&args.routing)?;
            let routed = evb_fabric::routing::route_or_fallback(&topo, &engine, false)?;
            if let Some(why) = &routed.fallback {
                eprintln!("evb sim: {why}");
            }
            routed.lfts
        }
    };
    let order = evb_fabric::optimize::order_from_spec(&args.order, &topo)?;
    let routing = match &args.lfts {
        Some(p) => format!("lfts {}", p.display()),
        None => args.routing.clone(),
    };
    let name = format!("{} ({routing}, order {})", args.topology, args.order);
    evb_sim::fabric::from_topology(&topo, &lfts, &order, &name).map_err(anyhow::Error::msg)
}

pub fn run(args: SimArgs) -> Result<()> {
    let fabric = build_fabric(&args)?;
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
    // The event builder has one node per host unless the file or --set
    // says otherwise; a separate EM takes the last host, and the consumers
    // are on the output network or (sim.output.network = "fabric") take
    // the last hosts.
    let explicit_nodes = overrides.iter().any(|o| o.starts_with("nodes.count"));
    if !explicit_nodes {
        // A first look, for the consumers and the EM's placement only:
        // without the schedule file (checked against the node count this
        // decides), and sized for the fabric (a check such as
        // parallel_sends against the BUs must not see the default 4 nodes).
        let mut probe = overrides.clone();
        probe.push("event_builder.schedule_file=\"\"".into());
        // The fabric's hosts a configuration needs: its endpoints, less
        // the consumers when they are on the output network.
        let on_fabric = |c: &Config| {
            let layout = evb_core::Layout::from_config(c);
            let all = usize::from(layout.endpoints);
            if evb_sim::separate_output(c) {
                all - layout.fus()
            } else {
                all
            }
        };
        let as_is = Config::load(args.config.as_deref(), &probe).ok();
        let fits = as_is
            .as_ref()
            .is_some_and(|c| on_fabric(c) == fabric.hosts());
        if !fits {
            let mut sized = probe.clone();
            sized.insert(0, format!("nodes.count={}", fabric.hosts()));
            let first = Config::load(args.config.as_deref(), &sized)?;
            let consumers = if evb_sim::separate_output(&first) {
                0
            } else {
                usize::from(first.output.consumers)
            };
            let em_host = usize::from(first.nodes.em == evb_core::config::EmPlacement::Separate);
            if consumers + em_host + 1 > fabric.hosts() {
                bail!(
                    "output.consumers = {consumers} leaves no host of the fabric ({} hosts) for the event builder",
                    fabric.hosts()
                );
            }
            // A file that sizes the builder for this fabric keeps its count.
            overrides.insert(
                0,
                format!("nodes.count={}", fabric.hosts() - consumers - em_host),
            );
        }
    }
    let config = Config::load(args.config.as_deref(), &overrides)?;
    let bar = crate::progress::bar(1000, "simulating");
    let result = evb_sim::simulate(&config, fabric, |f| bar.set_position((f * 1000.0) as u64))
        .map_err(anyhow::Error::msg)?;
    bar.finish_and_clear();
    let s = &result.summary;
    println!(
        "evb sim: {} on {} ({} hosts), {:.1} us simulated in {:.2} s ({} events, {:.0} us/s)",
        s.traffic,
        s.topology,
        s.hosts,
        s.simulated_seconds * 1e6,
        s.wall_seconds,
        s.events_processed,
        s.speed_us_per_s
    );
    println!(
        "throughput per host: mean {:.2} Gb/s ({:.1}% of {:.1} Gb/s), min {:.2}, max {:.2}; max link utilisation {:.1}%; PortXmitWait total {:.3} ms",
        s.throughput_per_host_gbps,
        s.fraction_of_link * 100.0,
        s.link_rate_gbps,
        s.min_host_gbps,
        s.max_host_gbps,
        s.max_link_utilisation * 100.0,
        s.total_xmit_wait_s * 1e3
    );
    if let Some(eb) = &s.eb {
        println!(
            "event builder: {} events built, {} batches incomplete; latency p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            eb.events_built, eb.batches_incomplete, eb.latency_p50_us, eb.latency_p99_us, eb.latency_max_us
        );
        println!(
            "steady state (after {:.0} us, {} batch means): built {:.2} +- {:.2} Gb/s per node, of which {:.2} Gb/s through the network ({:.1}% of link); drift {:+.1}%",
            eb.warmup_us,
            eb.batch_means,
            eb.built_gbps_per_node,
            eb.built_ci95_gbps,
            eb.network_gbps_per_node,
            eb.network_fraction_of_link * 100.0,
            eb.drift * 100.0
        );
        if let Some(c) = &eb.crash {
            println!(
                "node {} died at {:.1} us (noticed at {:.1} us): built {:.2} Gb/s before, {:.2} Gb/s after: {:.3} of before (expected {:.3})",
                c.node, c.at_us, c.detected_us, c.built_gbps_before, c.built_gbps_after, c.ratio, c.expected_ratio
            );
        }
        if let Some(c) = &eb.slot_clock {
            println!(
                "slot clock (measured, clock = \"em\"): {} nodes; phase error at the end max {} ns, resting on round trips of at most {} ns; largest step {} ns; {} probes",
                c.nodes, c.max_phase_error_ns, 2 * c.max_uncertainty_ns, c.max_step_ns, c.probes
            );
        }
        if eb.throttled_fraction > 0.0 || eb.events_vetoed > 0 {
            println!(
                "readout throttle: {:.1}% of the time, {} events vetoed at the source",
                eb.throttled_fraction * 100.0,
                eb.events_vetoed
            );
        }
    }
    if let Some(o) = &s.consumers {
        println!(
            "distribution ({}, {} producers at {} Gb/s -> {} consumers at {} Gb/s, steady state): {:.2} +- {:.2} Gb/s per producer, {:.2} +- {:.2} Gb/s per consumer ({:.1} / {:.1} Gb/s in all); consumers busy {:.0}%; pause frames {}, drops {}, resent {:.1} MB",
            o.network,
            o.producers,
            o.producer_link_gbps,
            o.consumers,
            o.consumer_link_gbps,
            o.producer_gbps_per_producer,
            o.producer_ci95_gbps,
            o.consumer_gbps_per_consumer,
            o.consumer_ci95_gbps,
            o.producer_gbps_total,
            o.consumer_gbps_total,
            o.busy_fraction_mean * 100.0,
            o.pause_frames,
            o.drops,
            o.retransmitted_bytes as f64 * 1e-6
        );
    }
    if let Some(c) = &result.consumers {
        println!(
            "consumers: {}  delivered {} batches ({:.2} Gb/s)  consumed {} ({:.2} Gb/s); EM credit stalls {}, BU output full {:.1} us; busy {}",
            c.consumers,
            c.batches_delivered,
            c.producer_gbps,
            c.batches_consumed,
            c.consumer_gbps,
            c.em_credit_stalls,
            c.output_full_s * 1e6,
            c.busy_fraction
                .iter()
                .map(|b| format!("{:.0}%", b * 100.0))
                .collect::<Vec<_>>()
                .join(" ")
        );
        if c.events_accepted < c.events_consumed {
            println!(
                "trigger: accepted {} of {} events consumed ({:.1} %)",
                c.events_accepted,
                c.events_consumed,
                100.0 * c.events_accepted as f64 / c.events_consumed.max(1) as f64
            );
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.csv_hosts {
        let mut text = String::from("t_us");
        for h in &result.hosts {
            text += &format!(",{0}.tx,{0}.rx", h.host);
        }
        text.push('\n');
        for (sample, rates) in result.timeseries.iter().zip(&result.host_series) {
            text += &format!("{:.3}", sample.t_us);
            for (tx, rx) in rates {
                text += &format!(",{tx:.3},{rx:.3}");
            }
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(prefix) = &args.plot {
        for p in write_plots(prefix, &result)? {
            println!("wrote {}", p.display());
        }
    }
    if let Some(path) = &args.csv {
        let mut text = String::from("t_us,mean_rx_gbps,min_rx_gbps,max_rx_gbps\n");
        for p in &result.timeseries {
            text += &format!(
                "{:.3},{:.4},{:.4},{:.4}\n",
                p.t_us, p.mean_rx_gbps, p.min_rx_gbps, p.max_rx_gbps
            );
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Throughput over time and link utilisation, as SVG and PNG.
fn write_plots(prefix: &std::path::Path, r: &evb_sim::SimResult) -> Result<Vec<PathBuf>> {
    use evb_plot::{line_chart, Series};
    let name = |suffix: &str| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    let ts = &r.timeseries;
    let pick = |f: fn(&evb_sim::engine::Sample) -> f64| ts.iter().map(|p| (p.t_us, f(p))).collect();
    let s = &r.summary;
    let title = format!("{} on {}: received payload per host", s.traffic, s.topology);
    let mut out = Vec::new();
    out.extend(line_chart(
        &name("-throughput"),
        &title,
        "simulated time (us)",
        "Gb/s",
        &[
            Series {
                name: "max".into(),
                points: pick(|p| p.max_rx_gbps),
            },
            Series {
                name: "mean".into(),
                points: pick(|p| p.mean_rx_gbps),
            },
            Series {
                name: "min".into(),
                points: pick(|p| p.min_rx_gbps),
            },
        ],
    )?);
    if let Some(c) = &r.consumers {
        // Busy periods are often longer than a sample: average over about
        // a thirtieth of the run so that the curves show rates, not bursts.
        let k = (c.t_us.len() / 30).max(1);
        let smooth = |ys: &[f64]| -> Vec<(f64, f64)> {
            c.t_us
                .chunks(k)
                .zip(ys.chunks(k))
                .map(|(t, y)| (t[t.len() - 1], y.iter().sum::<f64>() / y.len() as f64))
                .collect()
        };
        out.extend(line_chart(
            &name("-consumers"),
            &format!(
                "{} on {}: producer and consumer throughput",
                s.traffic, s.topology
            ),
            "simulated time (us)",
            "Gb/s (all BUs / all consumers)",
            &[
                Series {
                    name: "producers (delivered)".into(),
                    points: smooth(&c.producer_gbps_series),
                },
                Series {
                    name: "consumers (consumed)".into(),
                    points: smooth(&c.consumer_gbps_series),
                },
            ],
        )?);
        out.extend(line_chart(
            &name("-busy"),
            &format!(
                "{} on {}: busy consumers (of {})",
                s.traffic, s.topology, c.consumers
            ),
            "simulated time (us)",
            "consumers busy (mean)",
            &[Series {
                name: "busy consumers".into(),
                points: smooth(&c.busy_consumers),
            }],
        )?);
    }
    let mut util: Vec<f64> = r.links.iter().map(|l| l.utilisation * 100.0).collect();
    util.sort_by(|a, b| b.total_cmp(a));
    let mut wait: Vec<f64> = r
        .links
        .iter()
        .map(|l| l.xmit_wait_s / s.simulated_seconds * 100.0)
        .collect();
    wait.sort_by(|a, b| b.total_cmp(a));
    out.extend(line_chart(
        &name("-links"),
        &format!(
            "{} on {}: link utilisation and credit wait, links sorted",
            s.traffic, s.topology
        ),
        "links (sorted, busiest first)",
        "% of simulated time",
        &[
            Series {
                name: "utilisation".into(),
                points: util
                    .iter()
                    .enumerate()
                    .map(|(i, &u)| (i as f64, u))
                    .collect(),
            },
            Series {
                name: "waiting for credits (PortXmitWait)".into(),
                points: wait
                    .iter()
                    .enumerate()
                    .map(|(i, &w)| (i as f64, w))
                    .collect(),
            },
        ],
    )?);
    Ok(out)
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
    let shard = args
        .shard
        .as_deref()
        .map(|s| -> Result<[usize; 2]> {
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
        })
        .transpose()?;
    let sim = args.sim;
    let fabric = build_fabric(&sim)?;
    let axes = args
        .params
        .iter()
        .map(|p| evb_sim::scan::Axis::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let mut base = sim.overrides.clone();
    if let Some(t) = &sim.traffic {
        base.push(format!("sim.traffic=\"{t}\""));
    }
    if let Some(d) = sim.duration_us {
        base.push(format!("sim.duration_us={d}"));
    }
    if let Some(l) = sim.load {
        base.push(format!("sim.load={l}"));
    }
    if !base.iter().any(|o| o.starts_with("nodes.count")) {
        base.insert(0, format!("nodes.count={}", fabric.hosts()));
    }
    let figure = evb_sim::scan::Figure::parse(&args.figure).map_err(anyhow::Error::msg)?;
    let total: usize = axes.iter().map(|a| a.values.len()).product::<usize>() * args.replications;
    let bar = crate::progress::bar(total as u64, "scan points");
    // One fabric per (order, routing) met in the scan.
    let fabrics = std::sync::Mutex::new(std::collections::HashMap::new());
    let load = |point: &[(String, String)]| -> Result<(Config, SimFabric), String> {
        let mut args = sim.clone();
        let mut overrides = Vec::new();
        for (k, v) in point {
            match k.as_str() {
                "order" => args.order = v.clone(),
                "routing" => args.routing = v.clone(),
                _ => overrides.push(format!("{k}={v}")),
            }
        }
        let key = (args.order.clone(), args.routing.clone());
        let cached = fabrics.lock().expect("not poisoned").get(&key).cloned();
        let fabric = match cached {
            Some(f) => f,
            None => {
                let f = build_fabric(&args).map_err(|e| format!("{e:#}"))?;
                fabrics.lock().expect("not poisoned").insert(key, f.clone());
                f
            }
        };
        let config = Config::load(sim.config.as_deref(), &point_overrides(&base, &overrides))
            .map_err(|e| e.to_string())?;
        Ok((config, fabric))
    };
    let options = evb_sim::scan::ScanOptions {
        shard,
        replications: args.replications,
        figure,
    };
    let result =
        evb_sim::scan::run_scan(&axes, load, options, || bar.inc(1)).map_err(anyhow::Error::msg)?;
    bar.finish_and_clear();
    print_scan(&result, &fabric.name);
    write_scan(
        &result,
        sim.json.as_deref(),
        sim.csv.as_deref(),
        sim.plot.as_deref(),
    )
}

fn merge(m: MergeArgs) -> Result<()> {
    let shards = m
        .inputs
        .iter()
        .map(|p| -> Result<evb_sim::scan::ScanResult> {
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

fn print_scan(result: &evb_sim::scan::ScanResult, fabric: &str) {
    let mut order: Vec<usize> = (0..result.points.len()).collect();
    order.sort_by(|&a, &b| {
        result.points[b]
            .figure_gbps
            .total_cmp(&result.points[a].figure_gbps)
    });
    let shard = result.shard.map_or(String::new(), |[i, n]| {
        format!(" (shard {i}/{n} of {})", result.total_points)
    });
    let replications = if result.replications > 1 {
        format!(
            ", {} seeds each: {} points not told apart from the best at 95 %",
            result.replications, result.tied_with_best
        )
    } else {
        String::new()
    };
    println!(
        "evb scan: {} points{shard} on {fabric} in {:.1} s, ranked by Gb/s {}; {:.0}% of points within 2% of the best{replications}",
        result.points.len(),
        result.wall_seconds,
        result.figure.label(),
        result.fraction_within_2pct_of_best * 100.0
    );
    println!(
        "{:>10}  {:>8}  {:>10}  parameters",
        "Gb/s", "+- 95%", "% of link"
    );
    for &i in &order {
        let p = &result.points[i];
        let params: Vec<String> = p.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let ci = p.ci95_gbps.map_or("-".to_string(), |c| format!("{c:.2}"));
        println!(
            "{:>10.2}  {ci:>8}  {:>9.1}%  {}",
            p.figure_gbps,
            p.figure_gbps / p.summary.link_rate_gbps * 100.0,
            params.join(" ")
        );
    }
}

fn write_scan(
    result: &evb_sim::scan::ScanResult,
    json: Option<&std::path::Path>,
    csv: Option<&std::path::Path>,
    plot: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = csv {
        let mut text = String::from("index,")
            + &result.axes.join(",")
            + ",figure_gbps,ci95_gbps,replications,throughput_per_host_gbps\n";
        for p in &result.points {
            let vals: Vec<&str> = p.params.iter().map(|(_, v)| v.as_str()).collect();
            text += &format!(
                "{},{},{:.4},{},{},{:.4}\n",
                p.index,
                vals.join(","),
                p.figure_gbps,
                p.ci95_gbps.map_or(String::new(), |c| format!("{c:.4}")),
                p.replicates.len().max(1),
                p.summary.throughput_per_host_gbps
            );
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(prefix) = plot {
        let Some(evb_sim::scan::HeatGrid { xs, ys, rows }) = evb_sim::scan::heat_grid(result)
        else {
            bail!("a heat map needs at least two --param axes");
        };
        let mut base = prefix.as_os_str().to_owned();
        base.push("-heatmap");
        let title = if result.axes.len() > 2 {
            "best Gb/s over the other parameters"
        } else {
            "Gb/s"
        };
        for p in evb_plot::heat_map_labelled(
            std::path::Path::new(&base),
            title,
            &result.axes[1],
            &result.axes[0],
            &rows,
            &xs,
            &ys,
        )? {
            println!("wrote {}", p.display());
        }
    }
    Ok(())
}
