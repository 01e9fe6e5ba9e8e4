//! `evb fabric counters` (read every port's counters into a snapshot) and
//! `evb fabric diagnose` (why does this fabric underperform: the counters
//! mapped onto links, routes, the shift's conflicts and the cabling, and
//! the remedies ranked by the rate `evb sim` predicts after each). The
//! analysis is `evb_fabric::diagnose`; the predictions run the simulator
//! here, since evb-fabric does not depend on it. See docs/fabric.md.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use evb_fabric::counters::collect::{collect, now_s, CollectOptions};
use evb_fabric::counters::formats::{read_any, Format};
use evb_fabric::counters::place;
use evb_fabric::diagnose as diag;
use evb_fabric::io;
use evb_fabric::setup;

use crate::fabric::{Naming, Tables};

/// Arguments of `evb fabric counters`.
#[derive(Debug, Args)]
pub struct CountersArgs {
    /// The fabric: ibnetdiscover output (LIDs, GUIDs and cables of the
    /// live fabric).
    #[arg(long)]
    topology: String,
    #[command(flatten)]
    naming: Naming,
    /// The snapshot to write.
    #[arg(long)]
    out: PathBuf,
    /// Read counters the user already has instead of the live fabric:
    /// perfquery output, ibdiagnet2.pm or ibdiagnet2.db_csv.
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
    /// With --from: when the counters were read (Unix seconds); default
    /// the file's modification time.
    #[arg(long)]
    time_s: Option<f64>,
    /// Clear the counters right after reading them (`perfquery -r`).
    #[arg(long)]
    reset: bool,
    /// Read only the basic counters (no `perfquery -x`).
    #[arg(long)]
    basic_only: bool,
    /// perfquery calls at once.
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// Longest one perfquery call may take, ms.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// The perfquery program.
    #[arg(long, default_value = "perfquery")]
    perfquery: PathBuf,
    /// Local adapter and port perfquery sends from (`-C`, `-P`).
    #[arg(long)]
    ca: Option<String>,
    #[arg(long)]
    ca_port: Option<u8>,
}

/// `evb fabric counters`.
pub fn counters(a: CountersArgs) -> Result<()> {
    let (topo, notes) = setup::load_named(&a.topology, a.naming.names.as_deref())?;
    print_notes(&notes);
    let t0 = std::time::Instant::now();
    let (snap, notes, what) = match &a.from {
        Some(f) => {
            let time_s = match a.time_s {
                Some(t) => t,
                None => file_time(f)?,
            };
            let (read, format) = read_any(f, &topo, time_s)?;
            let what = match format {
                Format::Snapshot => "an evb snapshot",
                Format::Perfquery => "perfquery output",
                Format::IbdiagnetPm => "ibdiagnet2.pm",
                Format::IbdiagnetCsv => "ibdiagnet2.db_csv",
            };
            (read.snap, read.notes, format!("{} ({what})", f.display()))
        }
        None => {
            let mut extra = Vec::new();
            if let Some(c) = &a.ca {
                extra.extend(["-C".to_string(), c.clone()]);
            }
            if let Some(p) = a.ca_port {
                extra.extend(["-P".to_string(), p.to_string()]);
            }
            let opts = CollectOptions {
                perfquery: a.perfquery.clone(),
                extra_args: extra,
                env: Vec::new(),
                extended: !a.basic_only,
                reset: a.reset,
                timeout: Duration::from_millis(a.timeout_ms),
                jobs: a.jobs,
            };
            let (snap, notes) = collect(&topo, &opts)?;
            let what = snap.source.clone();
            (snap, notes, what)
        }
    };
    print_notes(&notes);
    // The snapshot must fit the fabric: an unknown GUID or port is an error.
    let placed = place(snap, a.from.as_deref().unwrap_or(&a.out), &topo)?;
    if !placed.uncabled.is_empty() {
        eprintln!(
            "note: {} port(s) have counters where the topology has no cable: {}",
            placed.uncabled.len(),
            placed
                .uncabled
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let snap = placed.snap;
    io::write_text(&a.out, &snap.to_json())?;
    let nodes: std::collections::BTreeSet<&str> =
        snap.ports.iter().map(|p| p.guid.as_str()).collect();
    println!(
        "{} ports of {} nodes from {what} in {:.2} s{}; written to {}",
        snap.ports.len(),
        nodes.len(),
        t0.elapsed().as_secs_f64(),
        if snap.reset_after_read {
            " (counters cleared after reading)"
        } else {
            ""
        },
        a.out.display()
    );
    Ok(())
}

/// A file's modification time, Unix seconds.
fn file_time(path: &Path) -> Result<f64> {
    let m = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .with_context(|| format!("{}: no modification time (give --time-s)", path.display()))?;
    Ok(m.duration_since(std::time::UNIX_EPOCH)
        .map_or(now_s(), |d| d.as_secs_f64()))
}

/// Prints notes for the user on stderr.
fn print_notes(notes: &[String]) {
    for n in notes {
        eprintln!("note: {n}");
    }
}

/// Arguments of `evb fabric diagnose`.
#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// The fabric: ibnetdiscover output (or a fat-tree: generator).
    #[arg(long)]
    topology: String,
    #[command(flatten)]
    naming: Naming,
    /// The tables the fabric ran with (--lfts), or how OpenSM routes it.
    #[command(flatten)]
    tables: Tables,
    /// Counter snapshots: EARLIER LATER, or one that counts from a
    /// clearing (evb sim --counters). evb snapshots, perfquery output,
    /// ibdiagnet2.pm or ibdiagnet2.db_csv.
    #[arg(long, num_args = 1..=2, required = true)]
    counters: Vec<PathBuf>,
    // The order the event builder's ranks ran in.
    #[arg(long, help = crate::vocab::ORDER_HELP)]
    order: Option<String>,
    /// Write the diagnosis as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the fabric with its hot links and the routes of the most
    /// waited-on link's pairs: PREFIX.svg and PREFIX.png (repeatable).
    #[arg(long, value_name = "PREFIX")]
    plot: Vec<PathBuf>,
    /// Keep the remedies' files here: hostfile, tables for OpenSM, slot schedule.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// How remedies are ranked: sim (the rate `evb sim` predicts after
    /// each) or estimate (the synchronised-shift estimate only: fast).
    #[arg(long, default_value = "sim")]
    predict: String,
    /// Simulated time of each prediction, us (default the configuration's
    /// sim.duration_us: several rotations of the barrel are needed).
    #[arg(long)]
    predict_us: Option<f64>,
    /// Event builder configuration the predictions simulate (as evb sim).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override a configuration key (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// A port waiting for credits at least this share of the time is hot.
    #[arg(long, default_value_t = 0.05)]
    hot_wait: f64,
    /// PortXmitWait tick for ports whose snapshot has none, ns (default:
    /// one symbol time of the link's speed).
    #[arg(long)]
    xmit_wait_tick_ns: Option<f64>,
    /// Time the remedies' order and route searches may take, s (they run
    /// side by side; the default keeps a 648-host diagnosis within 1 s).
    #[arg(long, default_value_t = 0.3)]
    search_s: f64,
    /// Shared links and hot ports listed.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// A run of the event builder on this fabric (`evb run --json`): its
    /// slow steps and the links they overload (same --order as the run).
    #[arg(long, value_name = "RUN.json")]
    run: Option<PathBuf>,
}

/// `evb fabric diagnose`.
pub fn diagnose(a: DiagnoseArgs) -> Result<()> {
    let t0 = std::time::Instant::now();
    let loaded = setup::FabricSource {
        topology: a.topology.clone(),
        names: a.naming.names.clone(),
        lfts: a.tables.lfts.clone(),
        routing: a.tables.routing.clone(),
        strict: a.tables.strict,
        ..Default::default()
    }
    .load()?;
    print_notes(&loaded.notes);
    let topo = &loaded.topo;
    let resolved = evb_fabric::optimize::order_or_default(a.order.as_deref(), topo)?;
    print_notes(resolved.note.as_slice());
    let order = resolved.order;
    let mut placed = Vec::new();
    for f in &a.counters {
        let (read, _) = read_any(f, topo, file_time(f)?)?;
        print_notes(&read.notes);
        placed.push(place(read.snap, f, topo)?);
    }
    let (earlier, later) = match placed.as_slice() {
        [b] => (None, b),
        [a, b] => (Some(a), b),
        _ => unreachable!("clap takes one or two"),
    };
    let input = diag::Input {
        topology: a.topology.clone(),
        topo,
        lfts: &loaded.lfts,
        routing: loaded.what.clone(),
        order,
        order_spec: resolved.spec,
        a: earlier,
        b: later,
        run_steps: match &a.run {
            Some(p) => run_steps(p)?,
            None => Vec::new(),
        },
    };
    let opts = diag::Options {
        hot_wait: a.hot_wait,
        top: a.top,
        search: Duration::from_secs_f64(a.search_s.max(0.0)),
        routing: a.tables.routing.clone(),
        local_nic: false,
        measure: diag::measure::MeasureOptions {
            tick_ns: a.xmit_wait_tick_ns,
            default_gbps: None,
        },
    };
    let mut d = diag::diagnose(&input, &opts)?;
    let analysis_s = d.analysis_seconds;
    write_remedy_files(&mut d, a.out_dir.as_deref())?;
    match a.predict.as_str() {
        "sim" => predict(&mut d, &a)?,
        "estimate" => {}
        other => bail!("--predict: `{other}` is neither sim nor estimate"),
    }
    d.rank();
    print!("{}", diag::text::summary(&d));
    println!(
        "analysis {analysis_s:.3} s, whole command {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    if let Some(j) = &a.json {
        io::write_text(j, &serde_json::to_string_pretty(&d)?)?;
    }
    for p in &a.plot {
        plot(&d, p)?;
    }
    Ok(())
}

/// Writes each remedy's file (hostfile, tables for OpenSM, slot schedule)
/// into `dir`, and says in its `apply` which file.
fn write_remedy_files(d: &mut diag::Diagnosis, dir: Option<&Path>) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (i, r) in d.remedies.iter_mut().enumerate() {
        let Some(v) = &r.variant else { continue };
        let (name, text) = match r.kind {
            "hostfile" => (
                format!("hostfile-{}", i + 1),
                io::write_hostfile(&v.topo, &v.order),
            ),
            "routes" => (
                format!("opensm-lfts-{}.dump", i + 1),
                io::write_opensm_lfts(&v.topo, &v.lfts),
            ),
            "schedule" => match &v.schedule {
                Some(s) => {
                    // The schedule's own rank order, when it is not the run's.
                    let hosts = dir.join(format!("hostfile-{}", i + 1));
                    io::write_text(&hosts, &io::write_hostfile(&v.topo, &v.order))?;
                    r.apply = r.apply.replace("HOSTFILE", &hosts.display().to_string());
                    r.files.push(hosts.display().to_string());
                    (format!("schedule-{}.txt", i + 1), schedule_text(s, d.hosts))
                }
                None => continue,
            },
            _ => continue,
        };
        let path = dir.join(name);
        io::write_text(&path, &text)?;
        r.apply = r.apply.replace("FILE", &path.display().to_string());
        r.files.push(path.display().to_string());
    }
    Ok(())
}

fn schedule_text(s: &evb_fabric::schedule::SlotSchedule, ranks: usize) -> String {
    s.to_text(&format!(
        "evb slot schedule written by evb fabric diagnose: {ranks} ranks, {} slots; use with the same rank order",
        s.slots.len()
    ))
}

/// One simulation to run: which remedy (None: the fabric as it is).
struct Job<'a> {
    remedy: Option<usize>,
    variant: &'a diag::remedies::Variant,
}

/// Fills in what `evb sim` predicts for the fabric as it is and after each
/// remedy, several at a time.
fn predict(d: &mut diag::Diagnosis, a: &DiagnoseArgs) -> Result<()> {
    let mut jobs: Vec<Job> = Vec::new();
    if let Some(v) = &d.baseline_variant {
        jobs.push(Job {
            remedy: None,
            variant: v,
        });
    }
    for (i, r) in d.remedies.iter().enumerate() {
        if let Some(v) = &r.variant {
            jobs.push(Job {
                remedy: Some(i),
                variant: v,
            });
        }
    }
    let scratch = std::env::temp_dir().join(format!("evb-diagnose-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(k) else { break };
                let r = simulate(job, a, &scratch, k);
                results.lock().expect("not poisoned").push((job.remedy, r));
            });
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let how = match a.predict_us {
        Some(us) => format!("evb sim, {us} us"),
        None => "evb sim".to_string(),
    };
    for (which, r) in results.into_inner().expect("not poisoned") {
        let g = match r {
            Ok(g) => Some(g),
            Err(e) => {
                d.notes.push(format!(
                    "prediction failed ({}): {e:#}",
                    which.map_or("as it is".to_string(), |i| d.remedies[i].kind.to_string())
                ));
                None
            }
        };
        match which {
            None => {
                d.baseline.predicted_gbps_per_node = g;
                d.baseline.prediction = how.clone();
            }
            Some(i) => {
                d.remedies[i].predicted_gbps_per_node = g;
                if g.is_some() {
                    d.remedies[i].prediction = how.clone();
                }
            }
        }
    }
    // A remedy with nothing to simulate (a cable with errors) keeps the
    // fabric's rate.
    let base = d.baseline.predicted_gbps_per_node;
    for r in d.remedies.iter_mut().filter(|r| r.variant.is_none()) {
        r.predicted_gbps_per_node = base;
    }
    Ok(())
}

/// Simulates one variant with the configuration of the command line.
fn simulate(job: &Job, a: &DiagnoseArgs, scratch: &Path, k: usize) -> Result<f64> {
    evb_sim::predict::predict(
        job.variant,
        a.config.as_deref(),
        &a.overrides,
        a.predict_us,
        &scratch.join(format!("schedule-{k}.txt")),
    )
}

/// Draws the fabric with its hot links: PREFIX.svg and PREFIX.png.
fn plot(d: &diag::Diagnosis, prefix: &Path) -> Result<()> {
    let nodes: Vec<evb_plot::MapNode> = d
        .drawing
        .nodes
        .iter()
        .map(|n| evb_plot::MapNode {
            label: n.label.clone(),
            level: n.level,
            x: n.x,
        })
        .collect();
    let links: Vec<evb_plot::MapLink> = d
        .drawing
        .links
        .iter()
        .map(|l| evb_plot::MapLink {
            a: l.a,
            b: l.b,
            heat: (l.wait * 2.0).min(1.0),
            weight: l.utilisation,
            highlight: l.highlight,
        })
        .collect();
    let title = format!("{}: waiting for credits per cable", d.topology);
    let legend = map_legend(&d.drawing);
    let routes: Vec<Vec<usize>> = d.drawing.routes.iter().map(|r| r.nodes.clone()).collect();
    let map = evb_plot::FabricMap {
        title: &title,
        legend: &legend,
        nodes: &nodes,
        links: &links,
        routes: &routes,
    };
    for p in evb_plot::fabric_map(&prefix.with_extension(""), &map)? {
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// What the map's colours mean, and which remedy and routes it marks.
fn map_legend(d: &diag::drawing::Drawing) -> String {
    let mut s =
        "colour: share of time waiting (green 0, red 50% or more); width: utilisation".to_string();
    if !d.highlight.is_empty() {
        s += &format!("\nblue: {}", d.highlight);
    }
    if !d.routes.is_empty() {
        let labels: Vec<&str> = d.routes.iter().map(|r| r.label.as_str()).collect();
        s += &format!("\npurple: {} sharing {}", labels.join(", "), d.routes_share);
    }
    s
}

/// The per-step rates of a run (`summary.steps` of `evb run --json`).
fn run_steps(path: &Path) -> Result<Vec<(usize, f64)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    if v["kind"] != "evb-run" {
        bail!("{}: not an `evb run --json` file", path.display());
    }
    let Some(steps) = v["summary"]["steps"].as_array() else {
        bail!(
            "{}: no summary.steps (a run of an older evb, or one whose RUs shipped nothing)",
            path.display()
        );
    };
    steps
        .iter()
        .enumerate()
        .map(|(i, s)| match (s["step"].as_u64(), s["gbps"].as_f64()) {
            (Some(step), Some(g)) => Ok((step as usize, g)),
            _ => bail!(
                "{}: summary.steps[{i}]: needs `step` and `gbps`",
                path.display()
            ),
        })
        .collect()
}
