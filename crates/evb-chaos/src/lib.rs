//! `evb chaos`: a randomized soak of a real `evb run`. From a seed, a
//! schedule of faults of every kind ([`schedule`]) is done to the run's
//! processes, sockets, network and store while it builds ([`inject`]);
//! the run's invariants are checked during and after it, and each fault's
//! effect measured ([`check`]): the events it lost and the time the built
//! rate took to come back. A failing schedule is shrunk to the fewest
//! faults that still fail and printed as a command that replays it.

pub mod check;
pub mod inject;
pub mod sandbox;
pub mod schedule;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use evb_core::config::TransportKind;
use evb_core::fault::{NodeFault, TimeUnit};
use evb_core::{Config, Layout};
use evb_launch::{fault_option, run_local_observed, RunOptions};
use serde::Serialize;

use crate::check::{Bounds, FaultEffect, Violation};
use crate::inject::Injector;
use crate::sandbox::Sandbox;
use crate::schedule::{default_weight, Fault, Kind, Setup};

/// Options of `evb chaos`.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub config: Option<PathBuf>,
    /// The user's `--set` overrides (after chaos's own settings).
    pub overrides: Vec<String>,
    pub nodes: u16,
    pub consumers: u16,
    pub transport: Option<String>,
    pub duration_s: f64,
    pub seed: u64,
    /// Seeds run: `seed`, `seed + 1`, ...
    pub runs: u32,
    /// Or: runs until this many minutes have passed.
    pub minutes: Option<f64>,
    /// Mean seconds between faults.
    pub interval_s: f64,
    /// The kinds drawn (all that the setup allows when empty).
    pub kinds: Vec<Kind>,
    /// An explicit schedule instead of a drawn one (replay).
    pub faults: Option<Vec<Fault>>,
    /// Shrink a failing schedule, with at most this many more runs.
    pub shrink_runs: u32,
    /// A fault that loses more events than this is a violation.
    pub max_lost_per_fault: Option<u64>,
    pub json: Option<PathBuf>,
    pub exe: Option<PathBuf>,
    /// The namespaces of [`Sandbox`] (needs root).
    pub sandbox: bool,
}

impl Default for ChaosOptions {
    fn default() -> ChaosOptions {
        ChaosOptions {
            config: None,
            overrides: Vec::new(),
            nodes: 4,
            consumers: 2,
            transport: None,
            duration_s: 30.0,
            seed: 1,
            runs: 1,
            minutes: None,
            interval_s: 2.5,
            kinds: Vec::new(),
            faults: None,
            shrink_runs: 0,
            max_lost_per_fault: None,
            json: None,
            exe: None,
            sandbox: true,
        }
    }
}

/// Seconds at the start without faults, and at the end.
const WARMUP_S: f64 = 3.0;
const QUIET_END_S: f64 = 2.0;
/// The port of endpoint 0's metrics in the sandbox (free there).
const METRICS_BASE: u16 = 9400;

/// The outcome of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunOutcome {
    pub seed: u64,
    pub transport: String,
    /// The schedule, as `--faults` spells it.
    pub schedule: String,
    pub faults: Vec<FaultEffect>,
    pub violations: Vec<Violation>,
    /// Seconds the whole run took (start to the last process's end).
    pub wall_s: f64,
    pub events_generated: u64,
    pub events_built: u64,
    pub events_incomplete: u64,
    pub events_lost: u64,
    /// MEPs the EM took from a BU lost while alive and named to it when it
    /// came back, and the batches the BUs took out of their counts for it:
    /// not in built or incomplete (each such MEP is its new BU's, or lost).
    pub meps_revoked: u64,
    pub batches_revoked: u64,
    pub store_objects: u64,
    pub metrics_answers: u64,
    /// Peak open descriptors and resident MiB of any endpoint.
    pub peak_fds: u64,
    pub peak_rss_mib: u64,
    /// The command that replays this run's schedule.
    pub replay: String,
    /// The built rate, events/s, over every half second: (end of the
    /// half second, rate).
    pub built_rate: Vec<(f64, f64)>,
    /// The `evb run` summary of the run (docs/run-json.md).
    pub run: evb_launch::summary::Summary,
}

/// A row of the fault table.
#[derive(Debug, Clone, Serialize)]
pub struct KindRow {
    pub kind: String,
    pub injected: u64,
    pub survived: u64,
    pub events_lost_per_fault: f64,
    /// Median and largest recovery time of the faults that did not
    /// overlap another, s.
    pub recovery_median_s: Option<f64>,
    pub recovery_max_s: Option<f64>,
    pub violations: u64,
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
pub struct ChaosResult {
    pub evb_version: &'static str,
    pub kind: &'static str,
    pub runs: Vec<RunOutcome>,
    pub summary: ChaosSummary,
}

#[derive(Debug, Serialize)]
pub struct ChaosSummary {
    pub runs: usize,
    pub violations: Vec<SeedViolation>,
    pub faults: Vec<SeedFault>,
    pub table: Vec<KindRow>,
    /// When a failing seed was shrunk: the fewest faults that still fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shrunk: Option<Shrunk>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SeedViolation {
    pub seed: u64,
    #[serde(flatten)]
    pub violation: Violation,
}

#[derive(Debug, Clone, Serialize)]
pub struct SeedFault {
    pub seed: u64,
    #[serde(flatten)]
    pub fault: FaultEffect,
}

#[derive(Debug, Clone, Serialize)]
pub struct Shrunk {
    pub seed: u64,
    pub schedule: String,
    pub violations: Vec<Violation>,
    /// `evb chaos --faults ...` that replays it.
    pub chaos_command: String,
    /// `evb run ... --kill ...` when every fault is one `evb run` does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_command: Option<String>,
    pub runs_tried: u32,
}

/// The run's settings chaos brings (before the user's `--set`s): the EM
/// on its own endpoint (exact accounting across its restart), the store
/// on, consumers that store 2 % of the events, metrics on, a paced
/// readout, small MEPs (a fine-grained built rate).
fn chaos_settings(opts: &ChaosOptions, sandbox: &Sandbox) -> Vec<String> {
    let mut s = vec![
        "nodes.em=separate".to_string(),
        "output.sink=store".into(),
        format!("output.store={}", sandbox.store.display()),
        "output.accept_fraction=0.02".into(),
        "source.events_per_mep=256".into(),
        "source.mep_rate_hz=2000".into(),
    ];
    if sandbox.net {
        s.push(format!("metrics.base_port={METRICS_BASE}"));
    } else {
        s.push(format!(
            "metrics.base_port={}",
            free_ports(opts.nodes + opts.consumers + 2)
        ));
    }
    if let Some(t) = &opts.transport {
        s.push(format!("transport.kind={t}"));
    }
    s
}

/// The first of `n` consecutive ports free on loopback now.
fn free_ports(n: u16) -> u16 {
    for base in (20000..60000).step_by(97) {
        let held: Vec<_> = (0..n)
            .filter_map(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == usize::from(n) {
            return base;
        }
    }
    METRICS_BASE
}

/// Everything one run needs besides its schedule.
struct Prepared {
    config: Config,
    overrides: Vec<String>,
    setup: Setup,
    metrics_base: u16,
}

fn prepare(opts: &ChaosOptions, sandbox: &Sandbox) -> Result<Prepared> {
    let mut overrides = chaos_settings(opts, sandbox);
    overrides.extend(opts.overrides.iter().cloned());
    overrides.push(format!("nodes.count={}", opts.nodes));
    overrides.push(format!("output.consumers={}", opts.consumers));
    overrides.push(format!("run.duration_s={}", opts.duration_s));
    let config = Config::load(opts.config.as_deref(), &overrides)?;
    let metrics_base = config.metrics.base_port;
    let layout = Layout::from_config(&config);
    let transport = evb_transport_kind(&config);
    let kind = &config.transport.kind;
    // Over TCP sockets (nftables and tbf reach them).
    let tcp_based = match kind {
        TransportKind::Tcp => true,
        TransportKind::Ofi(_) => kind.ofi_provider() == Some("tcp"),
        TransportKind::Ucx(Some(tls)) => tls == "tcp",
        _ => false,
    };
    let rejoins = match kind {
        TransportKind::Tcp | TransportKind::Shm | TransportKind::Auto | TransportKind::Ucx(_) => {
            true
        }
        TransportKind::Ofi(_) => kind.ofi_provider() == Some("tcp"),
        TransportKind::Mpi => false,
    };
    let em_separate = (usize::from(layout.em) >= usize::from(config.nodes.count)
        && layout.fu_of[usize::from(layout.em)].is_none())
    .then_some(layout.em);
    let allowed = |k: Kind| -> bool {
        match k {
            Kind::Kill | Kind::KillConsumer | Kind::KillEm => rejoins,
            Kind::LinkDown | Kind::Loss | Kind::Rate => sandbox.net && tcp_based,
            Kind::StoreFull => sandbox.small_fs,
            Kind::WrongKey | Kind::HelloTruncated | Kind::HelloReplayed => transport == "tcp",
            _ => true,
        }
    };
    let wanted: Vec<Kind> = if opts.kinds.is_empty() {
        // Every kind, a full store too: the disk a DAQ's buffer fills is
        // among the commonest faults it meets, and a full store costs its
        // objects (counted as the writer's `failed`), not the run.
        Kind::ALL.to_vec()
    } else {
        opts.kinds.clone()
    };
    let setup = Setup {
        nodes: config.nodes.count,
        em_separate,
        consumers: layout.fu_nodes.clone(),
        duration_s: opts.duration_s,
        warmup_s: WARMUP_S,
        quiet_end_s: QUIET_END_S,
        interval_s: opts.interval_s,
        kinds: wanted
            .into_iter()
            .filter(|&k| allowed(k))
            .map(|k| (k, default_weight(k)))
            .collect(),
        max_nodes_down: 1,
    };
    Ok(Prepared {
        config,
        overrides,
        setup,
        metrics_base,
    })
}

/// The transport's name as the configuration resolves it.
fn evb_transport_kind(config: &Config) -> String {
    let t = config.transport.kind.to_string();
    if t == "auto" {
        "shm".into()
    } else {
        t
    }
}

/// The `evb run` faults of a schedule's process faults.
fn node_faults(faults: &[Fault]) -> Vec<NodeFault> {
    let ns = |s: f64| (s * 1e9).round() as u64;
    let mut out = Vec::new();
    for f in faults.iter().filter(|f| f.kind.is_process()) {
        let Some(node) = f.target else { continue };
        if f.kind == Kind::Stop {
            out.extend(NodeFault::stall(node, ns(f.at_s), ns(f.end_s())));
        } else {
            out.push(NodeFault::crash(node, ns(f.at_s)));
            out.push(NodeFault::restart(node, ns(f.end_s())));
        }
    }
    out
}

/// Runs the event builder once under `faults`.
fn run_once(
    opts: &ChaosOptions,
    sandbox: &Sandbox,
    prep: &Prepared,
    seed: u64,
    faults: &[Fault],
) -> Result<RunOutcome> {
    sandbox.clear_store()?;
    let run_opts = RunOptions {
        config: opts.config.clone(),
        overrides: prep.overrides.clone(),
        allow_loss: true,
        progress: Some(false),
        exe: opts.exe.clone(),
        faults: node_faults(faults),
        ..RunOptions::default()
    };
    let mut injector = Injector::new(
        faults.to_vec(),
        sandbox.small_fs.then(|| sandbox.store.clone()),
        (prep.metrics_base > 0).then_some(prep.metrics_base),
        sandbox.net,
    );
    let started = Instant::now();
    let result = run_local_observed(&run_opts, &mut injector);
    let wall_s = started.elapsed().as_secs_f64();
    let watched = injector.finish();
    let (run, _) = result.context("the run")?;
    let store = evb_store::StoreTarget::parse(&sandbox.store.display().to_string())
        .map_err(|e| e.to_string())
        .and_then(|t| {
            let o = evb_store::ReadOptions {
                list: true,
                ..evb_store::ReadOptions::default()
            };
            evb_store::read_store(&t, &o).map_err(|e| e.to_string())
        });
    let eb = &prep.config.event_builder;
    let bounds = Bounds {
        duration_s: opts.duration_s,
        grace_s: (eb.batch_timeout_ms as f64 + 3.0 * prep.config.transport.peer_timeout_ms as f64)
            / 1000.0
            + 1.0,
        end_bound_s: eb.drain_timeout_ms.max(eb.em_lost_wait_ms) as f64 / 1000.0 + 10.0,
        warmup_s: WARMUP_S,
        max_lost_per_fault: opts.max_lost_per_fault,
    };
    let (effects, violations) =
        check::evaluate(faults, &watched, &run, Some(&store), wall_s, &bounds);
    let s = &run.summary;
    let peak = |f: fn(&(f64, u64, u64)) -> u64| {
        watched.resources.iter().flatten().map(f).max().unwrap_or(0)
    };
    Ok(RunOutcome {
        seed,
        transport: evb_transport_kind(&prep.config),
        schedule: schedule::spell(faults),
        faults: effects,
        violations,
        wall_s: (wall_s * 100.0).round() / 100.0,
        events_generated: s.events_generated,
        events_built: s.events_built,
        events_incomplete: s.events_incomplete,
        events_lost: s.events_lost,
        meps_revoked: s.meps_revoked,
        batches_revoked: s.batches_revoked,
        store_objects: store.as_ref().map_or(0, |r| r.good_objects),
        metrics_answers: watched.metrics_answers,
        peak_fds: peak(|x| x.1),
        peak_rss_mib: peak(|x| x.2) >> 20,
        replay: chaos_command(opts, seed, faults),
        built_rate: check::rate_series(&watched.series, 0.5, wall_s),
        run: run.summary,
    })
}

/// `evb chaos` replaying `faults` with this run's options.
fn chaos_command(opts: &ChaosOptions, seed: u64, faults: &[Fault]) -> String {
    let mut c = format!(
        "evb chaos -n {} --consumers {} -d {} --seed {seed}",
        opts.nodes, opts.consumers, opts.duration_s
    );
    if let Some(t) = &opts.transport {
        c += &format!(" -t {t}");
    }
    if let Some(cfg) = &opts.config {
        c += &format!(" --config {}", cfg.display());
    }
    for s in &opts.overrides {
        c += &format!(" --set {s}");
    }
    if let Some(m) = opts.max_lost_per_fault {
        c += &format!(" --max-lost {m}");
    }
    c + &format!(" --faults '{}'", schedule::spell(faults))
}

/// `evb run` with the `--kill/--restart/--stop/--resume` of `faults`, when
/// `evb run` can do all of them.
fn run_command(opts: &ChaosOptions, prep: &Prepared, faults: &[Fault]) -> Option<String> {
    if !faults.iter().all(|f| f.kind.is_process()) {
        return None;
    }
    let mut c = format!(
        "evb run -n {} --consumers {} -d {} --allow-loss",
        opts.nodes, opts.consumers, opts.duration_s
    );
    if let Some(cfg) = &opts.config {
        c += &format!(" --config {}", cfg.display());
    }
    for s in &prep.overrides {
        // The sandbox's store and metrics ports are gone with it: a store
        // of its own (in the directory it is run from), no metrics.
        if s.starts_with("output.store=") {
            c += " --set output.store=evb-chaos-store";
        } else if !s.starts_with("nodes.count=")
            && !s.starts_with("output.consumers=")
            && !s.starts_with("run.duration_s=")
            && !s.starts_with("metrics.base_port=")
        {
            c += &format!(" --set {s}");
        }
    }
    for f in node_faults(faults) {
        c += &format!(
            " {} {}",
            fault_option(f.kind),
            f.spelling(TimeUnit::Seconds)
        );
    }
    Some(c)
}

/// Runs `evb chaos`: the seeds, then the shrinking of the first failing
/// one. Returns the result (also written to `--json`).
pub fn run_chaos(opts: &ChaosOptions, sandbox: &Sandbox) -> Result<ChaosResult> {
    let prep = prepare(opts, sandbox)?;
    let started = Instant::now();
    let mut runs: Vec<RunOutcome> = Vec::new();
    let mut seed = opts.seed;
    loop {
        let faults = match &opts.faults {
            Some(f) => f.clone(),
            None => schedule::draw(seed, &prep.setup),
        };
        eprintln!(
            "evb chaos: seed {seed}, {} faults: {}",
            faults.len(),
            schedule::spell(&faults)
        );
        let outcome = run_once(opts, sandbox, &prep, seed, &faults)?;
        eprintln!("{}", format_run(&outcome));
        runs.push(outcome);
        seed += 1;
        let more = match opts.minutes {
            Some(m) => started.elapsed().as_secs_f64() + opts.duration_s + 15.0 < m * 60.0,
            None => runs.len() < opts.runs as usize,
        };
        if !more || opts.faults.is_some() && opts.minutes.is_none() {
            break;
        }
    }
    let shrunk = match runs.iter().find(|r| !r.violations.is_empty()) {
        Some(failing) if opts.shrink_runs > 0 => Some(shrink(opts, sandbox, &prep, failing)?),
        _ => None,
    };
    let summary = ChaosSummary {
        runs: runs.len(),
        violations: runs
            .iter()
            .flat_map(|r| {
                r.violations.iter().map(|v| SeedViolation {
                    seed: r.seed,
                    violation: v.clone(),
                })
            })
            .collect(),
        faults: runs
            .iter()
            .flat_map(|r| {
                r.faults.iter().map(|f| SeedFault {
                    seed: r.seed,
                    fault: f.clone(),
                })
            })
            .collect(),
        table: table(&runs),
        shrunk,
    };
    let result = ChaosResult {
        evb_version: env!("CARGO_PKG_VERSION"),
        kind: "evb-chaos",
        runs,
        summary,
    };
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(result)
}

/// Greedy shrinking: drops one fault at a time, keeping each drop after
/// which the run still breaks the gravest invariant the failing run broke
/// ([`check::INVARIANTS`]), within `shrink_runs` runs.
fn shrink(
    opts: &ChaosOptions,
    sandbox: &Sandbox,
    prep: &Prepared,
    failing: &RunOutcome,
) -> Result<Shrunk> {
    let mut current = schedule::parse_list(&failing.schedule)?;
    let mut violations = failing.violations.clone();
    // The gravest invariant the run broke: a smaller schedule still fails
    // if it breaks that one (not any: on a loaded machine a loss with no
    // fault in force would keep every drop).
    let target = check::INVARIANTS
        .into_iter()
        .find(|i| violations.iter().any(|v| v.invariant == *i))
        .unwrap_or("accounting");
    eprintln!("evb chaos: shrink: keeping the schedule failing {target}");
    let mut tried = 0;
    let mut i = current.len();
    while i > 0 && tried < opts.shrink_runs {
        i -= 1;
        let mut candidate = current.clone();
        let dropped = candidate.remove(i);
        tried += 1;
        let outcome = run_once(opts, sandbox, prep, failing.seed, &candidate)?;
        let fails = outcome.violations.iter().any(|v| v.invariant == target);
        eprintln!(
            "evb chaos: shrink: without {dropped}: {}",
            if fails {
                format!(
                    "still fails {target} ({} violations)",
                    outcome.violations.len()
                )
            } else {
                format!(
                    "no longer fails {target} (kept; {} other violations)",
                    outcome.violations.len()
                )
            }
        );
        if fails {
            current = candidate;
            violations = outcome.violations;
        }
    }
    let shrunk = Shrunk {
        seed: failing.seed,
        schedule: schedule::spell(&current),
        violations,
        chaos_command: chaos_command(opts, failing.seed, &current),
        run_command: run_command(opts, prep, &current),
        runs_tried: tried,
    };
    eprintln!(
        "evb chaos: shrunk to {} faults: {}",
        current.len(),
        shrunk.chaos_command
    );
    if let Some(c) = &shrunk.run_command {
        eprintln!("evb chaos: the same with evb run: {c}");
    }
    Ok(shrunk)
}

/// The fault table of `runs`: per kind, what was injected and survived,
/// the events lost per fault, the recovery times and the violations.
pub fn table(runs: &[RunOutcome]) -> Vec<KindRow> {
    let mut rows: Vec<KindRow> = Vec::new();
    for kind in Kind::ALL {
        let of: Vec<&FaultEffect> = runs
            .iter()
            .flat_map(|r| &r.faults)
            .filter(|f| f.kind == kind && f.not_done.is_none())
            .collect();
        if of.is_empty() {
            continue;
        }
        let mut rec: Vec<f64> = of
            .iter()
            .filter(|f| !f.overlapped)
            .filter_map(|f| f.recovery_s)
            .collect();
        rec.sort_by(f64::total_cmp);
        let violations = runs
            .iter()
            .flat_map(|r| &r.violations)
            .filter(|v| v.kind == Some(kind))
            .count() as u64;
        rows.push(KindRow {
            kind: kind.name().into(),
            injected: of.len() as u64,
            survived: of.iter().filter(|f| f.survived).count() as u64,
            events_lost_per_fault: of.iter().map(|f| f.events_lost).sum::<u64>() as f64
                / of.len() as f64,
            recovery_median_s: rec.get(rec.len() / 2).copied(),
            recovery_max_s: rec.last().copied(),
            violations,
        });
    }
    let other = runs
        .iter()
        .flat_map(|r| &r.violations)
        .filter(|v| v.kind.is_none())
        .count() as u64;
    rows.push(KindRow {
        kind: "(run)".into(),
        injected: runs.len() as u64,
        survived: runs.iter().filter(|r| r.violations.is_empty()).count() as u64,
        events_lost_per_fault: 0.0,
        recovery_median_s: None,
        recovery_max_s: None,
        violations: other,
    });
    rows
}

/// The table as text.
pub fn format_table(rows: &[KindRow]) -> String {
    let mut out = format!(
        "{:<16} {:>8} {:>8} {:>14} {:>12} {:>10} {:>10}\n",
        "fault kind", "injected", "survived", "lost/fault", "recovery p50", "max s", "violations"
    );
    let s = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in rows {
        out += &format!(
            "{:<16} {:>8} {:>8} {:>14.0} {:>12} {:>10} {:>10}\n",
            r.kind,
            r.injected,
            r.survived,
            r.events_lost_per_fault,
            s(r.recovery_median_s),
            s(r.recovery_max_s),
            r.violations
        );
    }
    out
}

/// One run in a few lines.
pub fn format_run(r: &RunOutcome) -> String {
    let mut out = format!(
        "evb chaos: seed {} over {}: {} faults, generated {} = built {} + incomplete {} + lost {} ({} MEPs revoked); {} objects stored; ended {:.1} s after its start; {} violations\n",
        r.seed,
        r.transport,
        r.faults.len(),
        r.events_generated,
        r.events_built,
        r.events_incomplete,
        r.events_lost,
        r.meps_revoked,
        r.store_objects,
        r.wall_s,
        r.violations.len()
    );
    for f in &r.faults {
        let rec = f
            .recovery_s
            .map_or("not back".to_string(), |s| format!("back in {s:.2} s"));
        let note = f
            .not_done
            .as_ref()
            .map_or(String::new(), |w| format!(" (not done: {w})"));
        out += &format!(
            "  {:<28} lost {:>8}  {}{}{}\n",
            f.spec,
            f.events_lost,
            rec,
            if f.overlapped { " (overlapped)" } else { "" },
            note
        );
    }
    for v in &r.violations {
        out += &format!("  VIOLATION: {}\n", v.what);
    }
    out
}
