//! `evb-launch`: `evb run`, a whole event builder on this machine, one
//! `evb node` process per endpoint on loopback.
//!
//! The launcher writes the effective configuration to a file every node
//! reads, collects the nodes' listening ports and hands each the full list,
//! shows a live progress bar on a terminal, forwards Ctrl-C as a drain request to the
//! node hosting the EM, and adds the nodes' final reports up into the
//! summary table and the JSON (`docs/run-json.md`, [`summary`]). Faults
//! are injected here too (`--kill`, `--stop`, `--resume`, `--restart`:
//! [`RunOptions::faults`], core [`NodeFault`]s whose kind picks the signal).
//!
//! A crate of its own: the launcher does not link the node's event loop.
//! It starts `evb node` processes and speaks to them only through the
//! control lines and reports of `evb-control`; what it needs of the
//! transports (`evb-transport`) is the memory plan, the run key and
//! where shared memory leaves its files.

pub mod external;
pub mod summary;

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use evb_core::config::{Readout, Verify};
use evb_core::fault::{FaultKind, NodeFault, TimeUnit};
use evb_core::{Config, Layout};
use serde::Serialize;

use evb_control::lines::{ToLauncher, ToNode};
use evb_control::report::NodeReport;

use crate::summary::{
    ConsumersSummary, CpuSummary, FailureEvent, SlotClockSummary, StepFigures, Summary,
};

/// Options of `evb run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub config: Option<PathBuf>,
    pub overrides: Vec<String>,
    pub nodes: Option<u16>,
    /// Filter Unit consumer processes (`output.consumers`).
    pub consumers: Option<u16>,
    /// Consumers the launcher does not start: programs of their own
    /// (`libevb`) that join through `rendezvous` ([`external`]), the last
    /// endpoints of the run, after the `consumers` it starts.
    pub external_consumers: u16,
    /// Where external consumers join (`DIR/run<id>/`).
    pub rendezvous: Option<PathBuf>,
    pub duration_s: Option<f64>,
    pub json: Option<PathBuf>,
    pub allow_loss: bool,
    /// Show the live progress bar (default: when stderr is a terminal and
    /// CI is unset; never drawn off a terminal).
    pub progress: Option<bool>,
    /// The `evb` executable to start nodes with (default: this one).
    pub exe: Option<PathBuf>,
    /// Faults to inject, each at a time into the run (testing aid; applied
    /// in this order when due together): a crash is a real `kill -9`
    /// (`--kill`), a hang a SIGSTOP that leaves the connections open and
    /// silent (`--stop`), a resume a SIGCONT that lets a stopped node go
    /// on (`--resume`), a restart a fresh `evb node --rejoin` with the same
    /// rank and address for a node killed earlier (`--restart`).
    pub faults: Vec<NodeFault>,
}

/// The `evb run` option that injects a fault of `kind`.
pub fn fault_option(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Crash => "--kill",
        FaultKind::Hang => "--stop",
        FaultKind::Resume => "--resume",
        FaultKind::Restart => "--restart",
    }
}

/// The signal the launcher sends a node for a fault of `kind` (a restart
/// starts a process instead).
fn fault_signal(kind: FaultKind) -> Option<i32> {
    match kind {
        FaultKind::Crash => Some(libc::SIGKILL),
        FaultKind::Hang => Some(libc::SIGSTOP),
        FaultKind::Resume => Some(libc::SIGCONT),
        FaultKind::Restart => None,
    }
}

/// What the failure timeline says the launcher did.
fn fault_done(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Crash => "killed (SIGKILL)",
        FaultKind::Hang => "stopped (SIGSTOP)",
        FaultKind::Resume => "resumed (SIGCONT)",
        FaultKind::Restart => "restarted (rejoins the run)",
    }
}

/// Refuses faults the run cannot carry out: of a node it does not have, a
/// resume of a node not stopped before, a restart of a node not killed
/// before or over a transport that cannot rejoin.
fn check_faults(faults: &[NodeFault], config: &Config, endpoints: usize) -> Result<()> {
    let spelled =
        |f: &NodeFault| format!("{} {}", fault_option(f.kind), f.spelling(TimeUnit::Seconds));
    for f in faults {
        if f.node as usize >= endpoints {
            bail!(
                "{}: there is no node {} (the run has nodes 0 to {})",
                spelled(f),
                f.node,
                endpoints - 1
            );
        }
    }
    let before = |r: &NodeFault, kind: FaultKind| {
        faults
            .iter()
            .any(|f| f.node == r.node && f.kind == kind && f.at < r.at)
    };
    for r in faults.iter().filter(|f| f.kind == FaultKind::Resume) {
        if !before(r, FaultKind::Hang) {
            bail!("{}: resume a node stopped earlier with --stop", spelled(r));
        }
    }
    for r in faults.iter().filter(|f| f.kind == FaultKind::Restart) {
        if !before(r, FaultKind::Crash) {
            bail!("{}: restart a node killed earlier with --kill", spelled(r));
        }
        if !evb_transport::can_rejoin(&config.transport.kind) {
            bail!(
                "--restart: only the tcp, shm, ucx and ofi:tcp transports can rejoin, not `{}`",
                config.transport.kind
            );
        }
    }
    Ok(())
}

/// One progress sample, also kept in the JSON timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub events_built: u64,
    pub bytes_built: u64,
    pub built_gbps: f64,
    pub events_per_second: f64,
    pub events_incomplete: u64,
    pub events_corrupt: u64,
    /// Resident memory of all node processes, bytes.
    pub rss_bytes: u64,
    /// Built payload rate of each endpoint over the last second, Gb/s.
    pub node_built_gbps: Vec<f64>,
    /// With consumers, over the last second: batch bytes the BUs delivered
    /// (producer) and the consumers consumed, Gb/s, and the mean number of
    /// consumers busy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub producer_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_consumers: Option<f64>,
}

/// The JSON written by `--json`.
#[derive(Debug, Serialize)]
pub struct RunResult {
    pub evb_version: &'static str,
    pub kind: &'static str,
    pub config: Config,
    pub summary: Summary,
    pub nodes: Vec<Option<NodeReport>>,
    pub timeline: Vec<Sample>,
    /// Exit status of each node process (None: killed or not waited for).
    pub node_exit_codes: Vec<Option<i32>>,
}

enum FromNode {
    /// The node's address token: a port (TCP) or hex bytes.
    Listen(usize, String),
    Stats(usize, NodeReport),
    Final(usize, NodeReport),
    Closed(usize),
    Garbage(usize, String),
}

/// Watches a run from inside the launcher's loop (`evb chaos`): called on
/// every pass of the supervision loop (every node line, at least every
/// 100 ms), once the nodes have their peers, with what the launcher knows.
pub trait RunObserver {
    fn tick(&mut self, run: &RunView<'_>);
}

/// No observer.
impl RunObserver for () {
    fn tick(&mut self, _: &RunView<'_>) {}
}

/// What a [`RunObserver`] sees of a run going on.
pub struct RunView<'a> {
    /// Seconds since the nodes were handed their peers (the time of
    /// `--kill RANK@SECONDS` and of the failure timeline).
    pub elapsed_s: f64,
    pub config: &'a Config,
    /// The current process of each endpoint started here (a restart
    /// replaces it).
    pub pids: Vec<u32>,
    /// The endpoint's output has not ended (its process runs).
    pub open: &'a [bool],
    /// Each endpoint's address, as the PEERS line gives it.
    pub peers: &'a [String],
    /// The latest report of each endpoint's current process.
    pub latest: &'a [NodeReport],
    /// The last reports of the processes restarts replaced.
    pub earlier_reports: &'a [NodeReport],
    /// The final report of each endpoint that has written one.
    pub finals: &'a [Option<NodeReport>],
}

/// Runs the event builder; returns the result and whether it was clean.
pub fn run_local(opts: &RunOptions) -> Result<(RunResult, bool)> {
    run_local_observed(opts, &mut ())
}

/// [`run_local`], with `observer` called throughout the run.
pub fn run_local_observed(
    opts: &RunOptions,
    observer: &mut dyn RunObserver,
) -> Result<(RunResult, bool)> {
    let mut config = effective_config(opts)?;
    let restarts = opts.faults.iter().any(|f| f.kind == FaultKind::Restart);
    // shm nodes keep their inboxes for a rejoin only when one is planned.
    config.transport.shm_rejoin = restarts;
    let layout = Layout::from_config(&config);
    let endpoints = layout.endpoints as usize;
    // The endpoints started here: all but the external consumers.
    let launched = endpoints - usize::from(opts.external_consumers);
    check_memory(&config, machine_memory_bytes())?;
    if config.output_network() {
        // Every node runs here: one look at the address before starting them.
        evb_transport::outnet::published_ip(&config)?;
    }
    check_faults(&opts.faults, &config, launched)?;
    // A fresh run key for this run's nodes (unless the config names one):
    // a stranger on a node port cannot join even with the right run id.
    let run_key = match std::env::var(evb_transport::auth::KEY_ENV) {
        Ok(k) => k,
        Err(_) => evb_transport::auth::fresh_key_hex(),
    };
    let external = external_consumers(opts, &mut config, &run_key)?;
    let workdir = std::env::temp_dir().join(format!("evb-run-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)?;
    let config_path = workdir.join("config.toml");
    std::fs::write(&config_path, toml::to_string(&config)?)?;
    if let Some(ext) = &external {
        ext.publish_config(&config)?;
    }

    let exe = match &opts.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe().context("locating the evb executable")?,
    };
    let (tx, rx) = mpsc::channel();
    let starter = NodeStarter {
        exe,
        config_path,
        run_key,
        tx,
        spawned: std::cell::RefCell::new(Vec::new()),
        em: layout.em as usize,
        duration_s: config.run.duration_s,
        external,
    };
    let mut children: Vec<Child> = Vec::new();
    let mut stdins: Vec<Option<ChildStdin>> = Vec::new();
    for rank in 0..launched {
        let (child, stdin) = starter.start(rank, false, &[])?;
        stdins.push(stdin);
        children.push(child);
    }
    let result = supervise(
        opts,
        &config,
        &layout,
        &mut children,
        &mut stdins,
        &rx,
        &starter,
        observer,
    );
    // Whatever happened, no node outlives the launcher.
    for c in &mut children {
        let _ = c.kill();
    }
    let codes: Vec<Option<i32>> = children
        .iter_mut()
        .map(|c| c.wait().ok().and_then(|s| s.code()))
        .collect();
    let _ = std::fs::remove_dir_all(&workdir);
    if config.transport.kind == evb_transport::TransportKind::Shm {
        // With rejoin, an shm inbox keeps its name until its process ends
        // normally: remove those of the nodes that were killed.
        for &(rank, pid) in starter.spawned.borrow().iter() {
            let path = evb_transport::shm::inbox_path(config.run.run_id, rank, pid);
            let _ = std::fs::remove_file(path);
        }
    }
    let supervised = result?;
    let summary = summarize(&config, &layout, &supervised)?;
    let clean = summary.clean() && codes.iter().all(|c| *c == Some(0));
    let result = RunResult {
        evb_version: env!("CARGO_PKG_VERSION"),
        kind: "evb-run",
        config,
        summary,
        nodes: supervised.finals,
        timeline: supervised.timeline,
        node_exit_codes: codes,
    };
    if let Some(path) = &opts.json {
        let text = serde_json::to_string_pretty(&result)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok((result, clean))
}

/// `--external-consumers K`: the rendezvous directory prepared for them
/// (the run key in a file the configuration names), or `None` without.
fn external_consumers(
    opts: &RunOptions,
    config: &mut Config,
    run_key: &str,
) -> Result<Option<external::External>> {
    let k = opts.external_consumers;
    if k == 0 {
        return Ok(None);
    }
    let Some(dir) = &opts.rendezvous else {
        bail!("--external-consumers needs --rendezvous DIR: where the consumers join the run");
    };
    let endpoints = Layout::from_config(config).endpoints;
    Ok(Some(external::External::prepare(
        dir, k, endpoints, config, run_key,
    )?))
}

/// The configuration the nodes run: the file and overrides with the
/// command line's options, the files it names made absolute (the nodes
/// read it again from elsewhere), `auto` transport resolved.
fn effective_config(opts: &RunOptions) -> Result<Config> {
    let mut overrides = opts.overrides.clone();
    if let Some(n) = opts.nodes {
        overrides.push(format!("nodes.count={n}"));
    }
    if let Some(d) = opts.duration_s {
        overrides.push(format!("run.duration_s={d}"));
    }
    if let Some(m) = opts.consumers {
        overrides.push(format!("output.consumers={m}"));
    }
    if opts.external_consumers > 0 {
        // The external consumers come after the ones started here.
        let started = Config::load(opts.config.as_deref(), &overrides)?
            .output
            .consumers;
        let all = u32::from(started) + u32::from(opts.external_consumers);
        overrides.push(format!("output.consumers={all}"));
    }
    let mut config = Config::load(opts.config.as_deref(), &overrides)?;
    let base = opts
        .config
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    for file in [&mut config.source.histogram, &mut config.sim.host_latency] {
        if !file.is_empty() {
            *file = std::path::absolute(base.join(&*file))?
                .display()
                .to_string();
        }
    }
    // `auto` is shm on one machine (restarted nodes rejoin over it too),
    // tcp with an output network.
    config.transport.kind = evb_transport::resolve_auto(&config);
    Ok(config)
}

/// Starts `evb node` processes for this run, and remembers each one.
struct NodeStarter {
    exe: PathBuf,
    config_path: PathBuf,
    run_key: String,
    /// Where each node's output goes, read by a thread per node.
    tx: mpsc::Sender<FromNode>,
    /// Every node process started: (rank, pid).
    spawned: std::cell::RefCell<Vec<(usize, u32)>>,
    /// The EM's node and the run's length (`run.duration_s`), for a
    /// restarted EM.
    em: usize,
    duration_s: f64,
    /// The consumers started elsewhere, and where they join.
    external: Option<external::External>,
}

impl NodeStarter {
    /// Starts node `rank` (`rejoin`: a restarted node joining the run).
    /// `extra`: more arguments (a restarted EM's remaining run time).
    fn start(
        &self,
        rank: usize,
        rejoin: bool,
        extra: &[String],
    ) -> Result<(Child, Option<ChildStdin>)> {
        let mut cmd = Command::new(&self.exe);
        cmd.args([
            "node",
            "--control",
            "stdio",
            "--rank",
            &rank.to_string(),
            "--config",
        ])
        .arg(&self.config_path)
        .env(evb_transport::auth::KEY_ENV, &self.run_key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if rejoin {
            cmd.arg("--rejoin");
        }
        cmd.args(extra);
        // Own process group: Ctrl-C reaches the launcher only, which then
        // asks for an orderly drain.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting node {rank} ({})", self.exe.display()))?;
        self.spawned.borrow_mut().push((rank, child.id()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let tx = self.tx.clone();
        std::thread::spawn(move || read_node_output(rank, stdout, tx));
        Ok((child, stdin))
    }

    /// Starts node `rank` again, `elapsed` seconds into the run, to rejoin
    /// it; a restarted EM ends the run when the first one would have.
    fn restart(&self, rank: usize, elapsed: f64) -> Result<(Child, Option<ChildStdin>)> {
        let extra = if rank == self.em && self.duration_s > 0.0 {
            let left = (self.duration_s - elapsed).max(0.001);
            vec!["--set".to_string(), format!("run.duration_s={left}")]
        } else {
            Vec::new()
        };
        self.start(rank, true, &extra)
    }
}

/// The run's summary from what the nodes reported: a node without a
/// final report died, and what it last reported counts.
fn summarize(config: &Config, layout: &Layout, run: &Supervised) -> Result<Summary> {
    let finals = &run.finals;
    let missing: Vec<u16> = (0..finals.len())
        .filter(|&i| finals[i].is_none())
        .map(|i| i as u16)
        .collect();
    let reports: Vec<Option<NodeReport>> = finals
        .iter()
        .zip(&run.latest)
        .map(|(f, l)| f.clone().or((l.elapsed_s > 0.0).then(|| l.clone())))
        .collect();
    let mut summary = Summary::from_reports(
        &reports,
        &run.earlier_reports,
        &missing,
        layout.em as usize,
        config.source.events_per_mep,
        config.nodes.count,
    );
    summary.failures = failure_timeline(&reports, run.failures.clone(), run.started_unix);
    summary.cpu = CpuSummary::from_reports(&reports, summary.bytes_built);
    summary.readout = match config.source.readout {
        Readout::Ring => "ring".into(),
        Readout::Fresh => "fresh".into(),
    };
    summary.verify = match config.event_builder.verify {
        Verify::Header => "header".into(),
        Verify::Crc => "crc".into(),
        Verify::Sample => format!("sample 1/{}", config.event_builder.verify_sample),
    };
    summary.zero_copy =
        evb_transport::buffers::zero_copy(config, &evb_transport::resolve_auto(config));
    summary.slot_clock = SlotClockSummary::from_reports(&reports, config.slot_ns() as f64 / 1000.0)
        .map(|mut c| {
            c.rotation_slots = evb_core::slots::SlotPlan::for_source(config, layout, 0).rotation();
            if !config.event_builder.schedule_file.is_empty() {
                c.schedule_file = Some(config.event_builder.schedule_file.clone());
            }
            c
        });
    summary.steps = StepFigures::from_reports(&reports, &layout.ru_of, &layout.bu_of, layout.bus());
    if layout.fus() > 0 {
        summary.consumers = Some(ConsumersSummary::from_reports(
            &reports,
            layout,
            summary.duration_s,
        ));
    }
    Ok(summary)
}

/// The launcher's own failure events (`injected`) with what the nodes saw
/// (peers lost, peers back), in time order.
fn failure_timeline(
    reports: &[Option<NodeReport>],
    mut injected: Vec<FailureEvent>,
    started_unix: f64,
) -> Vec<FailureEvent> {
    for r in reports.iter().flatten() {
        for loss in &r.peers_lost {
            injected.push(FailureEvent {
                at_s: loss.at_unix_s - started_unix,
                node: loss.peer,
                seen_by: format!("node {}", r.node),
                what: format!("lost: {}", loss.reason),
            });
        }
        for back in &r.rejoins {
            injected.push(FailureEvent {
                at_s: back.at_unix_s - started_unix,
                node: back.peer,
                seen_by: format!("node {}", r.node),
                what: "rejoined".into(),
            });
        }
    }
    injected.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    injected
}

fn read_node_output(rank: usize, stdout: std::process::ChildStdout, tx: mpsc::Sender<FromNode>) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        // What is not a node's control line is passed on as it is.
        let msg = match ToLauncher::parse(&line) {
            Ok(ToLauncher::Listen(token)) => FromNode::Listen(rank, token),
            Ok(ToLauncher::Stats(r)) => FromNode::Stats(rank, *r),
            Ok(ToLauncher::Final(r)) => FromNode::Final(rank, *r),
            Ok(ToLauncher::Result(_)) | Err(_) => FromNode::Garbage(rank, line),
        };
        if tx.send(msg).is_err() {
            return;
        }
    }
    let _ = tx.send(FromNode::Closed(rank));
}

type Finals = Vec<Option<NodeReport>>;

struct Supervised {
    finals: Finals,
    latest: Vec<NodeReport>,
    earlier_reports: Vec<NodeReport>,
    timeline: Vec<Sample>,
    failures: Vec<FailureEvent>,
    started_unix: f64,
}

/// Where node `token` (its LISTEN line) is reached: a TCP node announces
/// its port (and with an output network, `,` and its address there) on
/// `bind`; other transports an opaque token.
fn peer_address(bind: &str, token: String) -> String {
    match evb_transport::outnet::split_token(&token) {
        (port, None) if port.parse::<u16>().is_ok() => format!("{bind}:{port}"),
        (port, Some(out)) if port.parse::<u16>().is_ok() => format!("{bind}:{port},{out}"),
        _ => token,
    }
}

/// Rendezvous: every node's address, as its LISTEN line gives it.
fn collect_addresses(
    config: &Config,
    endpoints: usize,
    rx: &mpsc::Receiver<FromNode>,
) -> Result<Vec<String>> {
    let mut ports = vec![None; endpoints];
    let setup_deadline = Instant::now() + Duration::from_secs(30);
    while ports.iter().any(Option::is_none) {
        let left = setup_deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(FromNode::Listen(rank, token)) => ports[rank] = Some(token),
            Ok(FromNode::Closed(rank)) => {
                bail!("node {rank} exited during start-up (see its messages above)")
            }
            Ok(FromNode::Garbage(rank, line)) => tracing::info!("node {rank}: {line}"),
            Ok(_) => {}
            Err(_) => bail!("nodes did not report their ports within 30 s"),
        }
    }
    Ok(ports
        .into_iter()
        .map(|p| peer_address(&config.transport.bind, p.expect("all known")))
        .collect())
}

/// Counts Ctrl-C presses: the first asks for a drain, the second kills.
fn count_interrupts() -> Arc<AtomicUsize> {
    let interrupts = Arc::new(AtomicUsize::new(0));
    let counter = interrupts.clone();
    // Only the first handler registration in a process succeeds; a
    // second `run_local` in the same process (tests) keeps the first.
    let _ = ctrlc::set_handler(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    interrupts
}

/// What the launcher knows of its nodes while the run goes on.
struct Watch {
    latest: Vec<NodeReport>,
    finals: Finals,
    /// The node's output has not ended.
    open: Vec<bool>,
    last_heard: Vec<Instant>,
    /// Every node's address, and the PEERS line that lists them (sent to
    /// a restarted node).
    peers: Vec<String>,
    peers_line: String,
    /// Counters of earlier incarnations of restarted nodes, so the
    /// timeline does not step back: (events_built, bytes_built) per node.
    earlier: Vec<(u64, u64)>,
    /// The last reports of the incarnations that restarts replaced: what
    /// their BUs built counts when the EM's own accounting is incomplete.
    earlier_reports: Vec<NodeReport>,
    failures: Vec<FailureEvent>,
}

impl Watch {
    fn new(peers: Vec<String>) -> Watch {
        let endpoints = peers.len();
        Watch {
            latest: vec![NodeReport::default(); endpoints],
            finals: vec![None; endpoints],
            open: vec![true; endpoints],
            last_heard: vec![Instant::now(); endpoints],
            peers_line: ToNode::Peers(peers.clone()).encode(),
            peers,
            earlier: vec![(0, 0); endpoints],
            earlier_reports: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// Takes in what a node said (or that nothing came).
    fn take(&mut self, msg: Result<FromNode, mpsc::RecvTimeoutError>, bind: &str) {
        if let Ok(FromNode::Stats(r, _) | FromNode::Final(r, _) | FromNode::Garbage(r, _)) = &msg {
            self.last_heard[*r] = Instant::now();
        }
        match msg {
            Ok(FromNode::Stats(rank, r)) => self.latest[rank] = r,
            Ok(FromNode::Final(rank, r)) => {
                self.latest[rank] = r.clone();
                self.finals[rank] = Some(r);
            }
            Ok(FromNode::Closed(rank)) => self.open[rank] = false,
            Ok(FromNode::Garbage(rank, line)) => tracing::info!("node {rank}: {line}"),
            // A restarted shm node has a new inbox: a node restarted after
            // it must find that one.
            Ok(FromNode::Listen(rank, token)) => {
                self.peers[rank] = peer_address(bind, token);
                self.peers_line = ToNode::Peers(self.peers.clone()).encode();
            }
            Err(_) => {}
        }
    }

    /// What an observer sees of the run now.
    fn view<'a>(&'a self, elapsed_s: f64, config: &'a Config, children: &[Child]) -> RunView<'a> {
        RunView {
            elapsed_s,
            config,
            pids: children.iter().map(Child::id).collect(),
            open: &self.open,
            peers: &self.peers,
            latest: &self.latest,
            earlier_reports: &self.earlier_reports,
            finals: &self.finals,
        }
    }

    /// Everyone else is finished and a node has gone quiet (stopped,
    /// hung): it will not finish; end it.
    fn end_quiet_nodes(&self, children: &mut [Child]) {
        let endpoints = children.len();
        let others_done = (0..endpoints).all(|i| {
            self.finals[i].is_some() || self.last_heard[i].elapsed() > Duration::from_secs(3)
        });
        if others_done {
            for i in (0..endpoints).filter(|&i| self.finals[i].is_none() && self.open[i]) {
                let _ = children[i].kill();
            }
        }
    }

    /// Signals the nodes whose faults are due at `elapsed` (s), and takes
    /// them off `pending`.
    fn signal_due(&mut self, pending: &mut Vec<NodeFault>, children: &[Child], elapsed: f64) {
        let due = |f: &NodeFault| f.at_in(TimeUnit::Seconds) <= elapsed;
        for f in pending.iter().filter(|f| due(f)) {
            let (Some(child), Some(signal)) = (children.get(f.node as usize), fault_signal(f.kind))
            else {
                continue;
            };
            // SAFETY: signalling our own child process by its pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, signal);
            }
            self.failures.push(FailureEvent {
                at_s: elapsed,
                node: f.node,
                seen_by: "launcher".into(),
                what: fault_done(f.kind).into(),
            });
        }
        pending.retain(|f| !due(f));
    }

    /// Restarts the nodes whose restart is due at `elapsed` (s) once the
    /// killed process's output has ended, and takes them off `pending`.
    fn restart_due(
        &mut self,
        pending: &mut Vec<NodeFault>,
        children: &mut [Child],
        stdins: &mut [Option<ChildStdin>],
        starter: &NodeStarter,
        elapsed: f64,
    ) -> Result<()> {
        let due: Vec<NodeFault> = pending
            .iter()
            .copied()
            .filter(|r| r.at_in(TimeUnit::Seconds) <= elapsed && !self.open[r.node as usize])
            .collect();
        pending.retain(|r| !due.contains(r));
        for r in due {
            let rank = r.node as usize;
            let _ = children[rank].wait();
            let (child, mut stdin) = starter.restart(rank, elapsed)?;
            if let Some(s) = stdin.as_mut() {
                s.write_all(self.peers_line.as_bytes())
                    .and_then(|_| s.flush())
                    .with_context(|| format!("sending the peer list to restarted node {rank}"))?;
            }
            children[rank] = child;
            stdins[rank] = stdin;
            self.open[rank] = true;
            self.last_heard[rank] = Instant::now();
            self.earlier[rank].0 += self.latest[rank].events_built;
            self.earlier[rank].1 += self.latest[rank].bytes_built;
            self.earlier_reports
                .push(std::mem::take(&mut self.latest[rank]));
            self.failures.push(FailureEvent {
                at_s: elapsed,
                node: r.node,
                seen_by: "launcher".into(),
                what: fault_done(r.kind).into(),
            });
        }
        Ok(())
    }
}

/// The once-a-second progress samples: the counters at the last one.
struct Sampler {
    last_tick: Instant,
    last_bytes: u64,
    last_node_bytes: Vec<u64>,
    last_events: u64,
    /// Delivered bytes, consumed bytes, busy seconds, at the last sample.
    last_output: (u64, u64, f64),
}

impl Sampler {
    fn new() -> Sampler {
        Sampler {
            last_tick: Instant::now(),
            last_bytes: 0,
            last_node_bytes: Vec::new(),
            last_events: 0,
            last_output: (0, 0, 0.0),
        }
    }

    /// A sample of the rates since the last one, if a second has passed.
    fn sample(&mut self, watch: &Watch, layout: &Layout, start: Instant) -> Option<Sample> {
        if self.last_tick.elapsed() < Duration::from_secs(1) {
            return None;
        }
        let latest = &watch.latest;
        let dt = self.last_tick.elapsed().as_secs_f64();
        self.last_tick = Instant::now();
        let node_bytes: Vec<u64> = latest
            .iter()
            .zip(&watch.earlier)
            .map(|(r, e)| r.bytes_built + e.1)
            .collect();
        let bytes: u64 = node_bytes.iter().sum();
        let events: u64 = latest
            .iter()
            .zip(&watch.earlier)
            .map(|(r, e)| r.events_built + e.0)
            .sum();
        self.last_node_bytes.resize(node_bytes.len(), 0);
        let node_built_gbps = node_bytes
            .iter()
            .zip(&self.last_node_bytes)
            .map(|(&now, &before)| (now - before.min(now)) as f64 * 8.0 / dt / 1e9)
            .collect();
        self.last_node_bytes = node_bytes;
        let output = (
            latest.iter().map(|r| r.bytes_delivered).sum::<u64>(),
            latest.iter().map(|r| r.bytes_consumed).sum::<u64>(),
            latest.iter().map(|r| r.busy_s).sum::<f64>(),
        );
        let gbps = |now: u64, before: u64| (now - before.min(now)) as f64 * 8.0 / dt / 1e9;
        let with_consumers = layout.fus() > 0;
        let last_output = self.last_output;
        let producer_gbps = with_consumers.then(|| gbps(output.0, last_output.0));
        let consumer_gbps = with_consumers.then(|| gbps(output.1, last_output.1));
        let busy_consumers = with_consumers.then(|| ((output.2 - last_output.2) / dt).max(0.0));
        self.last_output = output;
        let sample = Sample {
            producer_gbps,
            consumer_gbps,
            busy_consumers,
            node_built_gbps,
            t_s: start.elapsed().as_secs_f64(),
            events_built: events,
            bytes_built: bytes,
            built_gbps: (bytes - self.last_bytes.min(bytes)) as f64 * 8.0 / dt / 1e9,
            events_per_second: (events - self.last_events.min(events)) as f64 / dt,
            events_incomplete: latest.iter().map(|r| r.events_incomplete).sum(),
            events_corrupt: latest.iter().map(|r| r.events_corrupt).sum(),
            rss_bytes: latest.iter().map(|r| r.rss_bytes).sum(),
        };
        self.last_bytes = bytes;
        self.last_events = events;
        Some(sample)
    }
}

/// Shows the latest sample on the bar.
fn show_sample(
    bar: &indicatif::ProgressBar,
    sample: &Sample,
    config: &Config,
    em_report: Option<&NodeReport>,
) {
    let per_node = sample.built_gbps / f64::from(config.nodes.count.max(1));
    if config.run.duration_s == 0.0 {
        bar.set_position(em_report.map_or(0, |r| r.meps_assigned));
    }
    bar.set_message(format!(
        "{:>8.3} M events/s  built {:7.2} Gb/s ({:6.2} per node)  incomplete {}  corrupt {}",
        sample.events_per_second / 1e6,
        sample.built_gbps,
        per_node,
        sample.events_incomplete,
        sample.events_corrupt
    ));
}

/// Hands the nodes their peers, then watches the run until every node's
/// output has ended: progress, injected faults and restarts, Ctrl-C, and
/// the observer's ticks.
#[allow(clippy::too_many_arguments)]
fn supervise(
    opts: &RunOptions,
    config: &Config,
    layout: &Layout,
    children: &mut [Child],
    stdins: &mut [Option<ChildStdin>],
    rx: &mpsc::Receiver<FromNode>,
    starter: &NodeStarter,
    observer: &mut dyn RunObserver,
) -> Result<Supervised> {
    let external = starter.external.as_ref();
    let launched = children.len();
    let bind = &config.transport.bind;
    let mut peers = collect_addresses(config, launched, rx)?;
    if let Some(ext) = external {
        peers = ext.exchange(&peers)?;
    }
    let mut watch = Watch::new(peers);
    // The external consumers are not watched here: their final reports
    // come from the rendezvous directory at the end.
    watch.open[launched..].fill(false);
    for (rank, s) in stdins.iter_mut().enumerate() {
        let s = s.as_mut().expect("piped");
        s.write_all(watch.peers_line.as_bytes())
            .and_then(|_| s.flush())
            .with_context(|| format!("sending the peer list to node {rank}"))?;
    }
    let interrupts = count_interrupts();
    // A bar is for a person at a terminal: not in pipes, logs or CI.
    let progress = opts.progress.unwrap_or_else(|| {
        let ci = matches!(std::env::var_os("CI"), Some(v) if !v.is_empty());
        std::io::stderr().is_terminal() && !ci
    });
    let bar = progress.then(|| progress_bar(config));
    let start = Instant::now();
    let started_unix = evb_control::report::unix_now();
    let (mut pending_restarts, mut pending_signals): (Vec<NodeFault>, Vec<NodeFault>) = opts
        .faults
        .iter()
        .partition(|f| f.kind == FaultKind::Restart);
    let run_for = Duration::from_secs_f64(config.run.duration_s);
    let hard_deadline = start
        + run_for
        + Duration::from_millis(
            config
                .event_builder
                .drain_timeout_ms
                .max(config.event_builder.em_lost_wait_ms),
        )
        + Duration::from_secs(30);
    let mut timeline = Vec::new();
    let mut sampler = Sampler::new();
    let mut stop_sent = false;
    let em = layout.em as usize;
    while watch.open.iter().any(|&o| o) {
        let msg = rx.recv_timeout(Duration::from_millis(100));
        if let Some(bar) = bar.as_ref().filter(|_| config.run.duration_s > 0.0) {
            bar.set_position((start.elapsed().as_secs_f64() * 10.0) as u64);
        }
        watch.take(msg, bind);
        watch.end_quiet_nodes(children);
        let elapsed = start.elapsed().as_secs_f64();
        watch.signal_due(&mut pending_signals, children, elapsed);
        watch.restart_due(&mut pending_restarts, children, stdins, starter, elapsed)?;
        observer.tick(&watch.view(elapsed, config, children));
        let n_int = interrupts.load(Ordering::SeqCst);
        if n_int >= 1 && !stop_sent {
            stop_sent = true;
            if let Some(bar) = &bar {
                bar.println("evb run: interrupted, draining (Ctrl-C again to kill)");
            }
            if let Some(s) = stdins[em].as_mut() {
                let _ = s
                    .write_all(ToNode::Stop.encode().as_bytes())
                    .and_then(|_| s.flush());
            }
        }
        if n_int >= 2 || Instant::now() > hard_deadline {
            tracing::warn!("evb run: killing the nodes");
            for c in children.iter_mut() {
                let _ = c.kill();
            }
            break;
        }
        if let Some(sample) = sampler.sample(&watch, layout, start) {
            if let Some(bar) = &bar {
                show_sample(bar, &sample, config, watch.latest.get(em));
            }
            timeline.push(sample);
        }
    }
    if let Some(bar) = bar {
        // The last figures stay on screen above the summary; a run that
        // ended on its own is complete.
        if !stop_sent {
            bar.set_position(bar.length().unwrap_or(0));
        }
        bar.abandon();
    }
    if let Some(ext) = external {
        for (i, report) in ext.final_reports().into_iter().enumerate() {
            watch.finals[launched + i] = report;
        }
    }
    Ok(Supervised {
        finals: watch.finals,
        latest: watch.latest,
        earlier_reports: watch.earlier_reports,
        timeline,
        failures: watch.failures,
        started_unix,
    })
}

/// Total memory of this machine (`MemTotal`), if known.
fn machine_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses a configuration whose nodes, all on this machine, could hold
/// more event data than it has memory: better a clear error now than an
/// out-of-memory kill in the middle of a run.
fn check_memory(config: &Config, machine: Option<u64>) -> Result<()> {
    if config.event_builder.preallocate_buffers {
        check_preallocation(config, machine)?;
    }
    let Some(machine) = machine else {
        return Ok(());
    };
    let per_node = config.node_memory_bound();
    let nodes = u64::from(config.nodes.count);
    let total = per_node.saturating_mul(nodes);
    if total > machine {
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        bail!(
            "configuration: each of the {nodes} nodes may hold up to {:.1} GiB of event data \
             (MEP fragments up to {:.1} MiB from source.events_per_mep = {} and the event sizes; \
             event_builder.credits = {}, event_builder.ru_buffer_meps = {}, output.bu_output_batches = {}), \
             {:.1} GiB in all, more than this machine's {:.1} GiB of memory: \
             lower event_builder.credits, source.events_per_mep or nodes.count",
            gib(per_node),
            config.max_fragment_payload() as f64 / f64::from(1u32 << 20),
            config.source.events_per_mep,
            config.event_builder.credits,
            config.event_builder.ru_buffer_meps,
            config.output.bu_output_batches,
            gib(total),
            gib(machine)
        );
    }
    Ok(())
}

/// `event_builder.preallocate_buffers`: says what the nodes will allocate
/// and touch at start, and refuses more than this machine's memory.
fn check_preallocation(config: &Config, machine: Option<u64>) -> Result<()> {
    let layout = Layout::from_config(config);
    let (plans, total) = evb_transport::buffers::BufferPlan::for_run(config, &layout)?;
    let largest = plans
        .iter()
        .max_by_key(|p| p.total_bytes())
        .expect("a run has endpoints");
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    tracing::info!(
        "evb run: event_builder.preallocate_buffers: {:.2} GiB in all {} endpoints; the largest node: {}",
        gib(total),
        plans.len(),
        largest.describe()
    );
    if let Some(machine) = machine.filter(|&m| total > m) {
        bail!(
            "configuration: event_builder.preallocate_buffers would allocate {:.1} GiB of buffers \
             in all nodes (the largest node: {}), more than this machine's {:.1} GiB of memory: \
             turn it off, or lower event_builder.credits, source.events_per_mep or \
             source.max_fragment_bytes",
            gib(total),
            largest.describe(),
            gib(machine)
        );
    }
    Ok(())
}

/// The summary table printed at the end of `evb run`.
pub fn format_summary(result: &RunResult) -> String {
    let s = &result.summary;
    let mut out = format_node_table(result);
    if s.batches_delivered_partial > 0 {
        out += &format!(
            "incomplete batches delivered anyway, flagged partial (output.deliver_partial): {}\n",
            s.batches_delivered_partial
        );
    }
    if let Some(mep) = s.em_resumed_at_mep {
        out += &format!(
            "the Event Manager was restarted and resumed at MEP {mep}: MEP fates are the BUs' own \
             counts (a BU that died with the old EM counts up to its last report)\n"
        );
    }
    out += &format_totals(s);
    out += &format_steps(&s.steps);
    if !s.failures.is_empty() {
        out += "failure timeline:\n";
        for f in &s.failures {
            out += &format!(
                "  {:8.3} s  node {:<3} {} (seen by {})\n",
                f.at_s, f.node, f.what, f.seen_by
            );
        }
    }
    if let Some(c) = &s.consumers {
        out += &format_consumers(c);
    }
    out += &format_losses(s);
    out
}

/// The run's line and a line per node, and the nodes that did not report
/// at the end.
fn format_node_table(result: &RunResult) -> String {
    let c = &result.config;
    let s = &result.summary;
    let eb = &c.event_builder;
    let mut out = String::new();
    out += &format!(
        "evb run: {} nodes over {}, {:?}/{:?}, parallel_sends {}, credits {}, local {:?}, {} events/MEP, {:.1} s\n",
        c.nodes.count,
        c.transport.kind,
        eb.protocol,
        eb.schedule,
        eb.parallel_sends,
        eb.credits,
        eb.local,
        c.source.events_per_mep,
        s.duration_s
    )
    .to_lowercase();
    out += &format!(
        "{:>4} {:<8} {:>10} {:>10} {:>10} {:>12} {:>10} {:>8} {:>10} {:>10}\n",
        "node",
        "role",
        "sent Gb/s",
        "recv Gb/s",
        "built Gb/s",
        "events",
        "incompl.",
        "corrupt",
        "p50 ms",
        "p99 ms"
    );
    for r in result.nodes.iter().flatten() {
        let t = r.elapsed_s.max(1e-9);
        out += &format!(
            "{:>4} {:<8} {:>10.2} {:>10.2} {:>10.2} {:>12} {:>10} {:>8} {:>10.3} {:>10.3}\n",
            r.node,
            r.role,
            r.bytes_sent as f64 * 8.0 / t / 1e9,
            r.bytes_received as f64 * 8.0 / t / 1e9,
            r.bytes_built as f64 * 8.0 / t / 1e9,
            r.events_built,
            r.events_incomplete,
            r.events_corrupt,
            r.latency_ns.p50 as f64 / 1e6,
            r.latency_ns.p99 as f64 / 1e6
        );
    }
    let em = Layout::from_config(&result.config).em;
    for n in &s.nodes_missing {
        out += &format!("{n:>4} (no final report: the node died or was killed)\n");
        if *n == em {
            // Nothing is assigned without the EM: say so, and how the
            // accounting was made without its report.
            out +=
                "     it was the Event Manager: no MEP was assigned after it died (a restarted EM \
                    takes over: --restart, docs/reliability.md); MEPs generated are what the RUs \
                    produced\n";
        }
    }
    out
}

/// Events, throughput, latency, CPU, the slot clock and dropped fragments.
/// The steps' rates in a line: the median and the slowest three.
fn format_steps(steps: &[StepFigures]) -> String {
    if steps.len() < 2 {
        return String::new();
    }
    let mut by_rate: Vec<&StepFigures> = steps.iter().collect();
    by_rate.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
    let median = by_rate[by_rate.len() / 2].gbps;
    let slow: Vec<String> = by_rate
        .iter()
        .take(3)
        .map(|f| format!("{} ({:.1})", f.step, f.gbps))
        .collect();
    format!(
        "per step (RU s to BU s+step), Gb/s of a fragment in flight: median {median:.1}; slowest steps {}\n",
        slow.join(", ")
    )
}

fn format_totals(s: &Summary) -> String {
    let mut out = format!(
        "events: generated {}  built {}  incomplete {}  corrupt {}  lost {}\n",
        s.events_generated, s.events_built, s.events_incomplete, s.events_corrupt, s.events_lost
    );
    out += &format!(
        "built {:.2} Gb/s aggregate, {:.2} Gb/s per node, {:.3} M events/s; latency p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms\n",
        s.built_gbps,
        s.built_gbps_per_node,
        s.events_per_second / 1e6,
        s.latency_ns.p50 as f64 / 1e6,
        s.latency_ns.p99 as f64 / 1e6,
        s.latency_ns.max as f64 / 1e6
    );
    out += &format!(
        "readout {}, verify {}{}; CPU per GB built: {:.3} s user + {:.3} s system (all nodes: {:.2} + {:.2} s)\n",
        s.readout,
        s.verify,
        if s.zero_copy { ", zero copy" } else { "" },
        s.cpu.user_s_per_gb,
        s.cpu.system_s_per_gb,
        s.cpu.user_s,
        s.cpu.system_s
    );
    if let Some(c) = &s.slot_clock {
        let error = c
            .max_abs_phase_error_ns
            .map_or("unknown (nodes on other hosts)".to_string(), |e| {
                format!("{:.1} us", e as f64 / 1e3)
            });
        let from = c
            .schedule_file
            .as_ref()
            .map_or(String::new(), |f| format!(" (from {f})"));
        out += &format!(
            "slot clock: {:.1} us slots, {} a rotation{from}; {} nodes measured the EM's clock, phase error at most {error}, uncertainty at most {:.1} us\n",
            c.slot_us,
            c.rotation_slots,
            c.nodes_measured,
            c.max_uncertainty_ns as f64 / 1e3
        );
    }
    if s.fragments_corrupt + s.fragments_duplicate + s.fragments_unexpected > 0 {
        out += &format!(
            "fragments dropped: corrupt {}  duplicate {}  unexpected {}\n",
            s.fragments_corrupt, s.fragments_duplicate, s.fragments_unexpected
        );
    }
    out
}

/// The output stage: deliveries, their network, backpressure, the trigger.
fn format_consumers(c: &ConsumersSummary) -> String {
    let mut out = format!(
        "consumers: {}  delivered {} batches ({:.2} Gb/s)  consumed {} ({:.2} Gb/s)  not consumed {}  undelivered {}  corrupt {}\n",
        c.consumers,
        c.batches_delivered,
        c.producer_gbps,
        c.batches_consumed,
        c.consumer_gbps,
        c.batches_not_consumed,
        c.batches_undelivered,
        c.batches_corrupt
    );
    let network = if c.network == "output" {
        let at = |addrs: Vec<&str>| {
            let mut a: Vec<&str> = addrs
                .into_iter()
                .map(|a| a.rsplit_once(':').map_or(a, |(ip, _)| ip))
                .collect();
            a.dedup();
            a.join(" ")
        };
        format!(
            "over the output network (producers at {}, consumers at {})",
            at(c.per_producer.iter().map(|p| p.address.as_str()).collect()),
            at(c.per_consumer.iter().map(|p| p.address.as_str()).collect())
        )
    } else {
        "over the event-building links".into()
    };
    out += &format!(
        "deliveries {network}: {:.2} Gb/s per producer ({} BUs), {:.2} Gb/s per consumer\n",
        c.producer_gbps_per_producer, c.producers, c.consumer_gbps_per_consumer
    );
    let busy: Vec<String> = c
        .per_consumer
        .iter()
        .map(|f| format!("{}:{:.0}%", f.node, f.busy_fraction * 100.0))
        .collect();
    out += &format!(
        "backpressure: EM credit stalls {}  BU output full {:.3} s  longest output queue {}; consumers busy {}\n",
        c.em_credit_stalls,
        c.output_full_s,
        c.max_output_queue,
        busy.join(" ")
    );
    if c.batches_redelivered > 0 {
        out += &format!(
            "delivered again: {} batches a dead consumer had not confirmed; confirmed {} of {} delivered\n",
            c.batches_redelivered, c.batches_confirmed, c.batches_delivered
        );
    }
    if c.events_accepted < c.events_consumed {
        out += &format!(
            "trigger: accepted {} of {} events consumed ({:.1} %), in {} batches\n",
            c.events_accepted,
            c.events_consumed,
            100.0 * c.events_accepted as f64 / c.events_consumed.max(1) as f64,
            c.batches_accepted
        );
    }
    out
}

/// The store, what was re-assigned or lost, the readout throttle, the
/// preallocated buffers and the sources missing from incomplete batches.
fn format_losses(s: &Summary) -> String {
    let mut out = String::new();
    if s.store_objects > 0 {
        out += &format!(
            "event store: {} objects, {} events, {:.3} GB written\n",
            s.store_objects,
            s.store_events,
            s.store_bytes as f64 / 1e9
        );
    }
    if s.meps_reassigned > 0 {
        out += &format!(
            "re-assigned from a dead BU: {} MEPs ({} events), the RUs still held them\n",
            s.meps_reassigned, s.events_reassigned
        );
    }
    if s.meps_revoked > 0 || s.batches_revoked > 0 {
        out += &format!(
            "taken from a BU lost while alive: {} MEPs, {} of its batches not counted as its own\n",
            s.meps_revoked, s.batches_revoked
        );
    }
    if s.events_lost_bu_gone > 0 {
        out += &format!("lost with a dead BU: {} events\n", s.events_lost_bu_gone);
    }
    if s.events_lost_no_bu > 0 {
        out += &format!("lost with no BU left: {} events\n", s.events_lost_no_bu);
    }
    if s.throttle_episodes > 0 || s.max_unbuilt_meps > 0 {
        out += &format!(
            "readout throttle: {:.3} s throttled ({:.1}% of the run) in {} episodes, {} events vetoed at the source; at most {} MEPs not yet built\n",
            s.throttled_s,
            if s.duration_s > 0.0 { 100.0 * s.throttled_s / s.duration_s } else { 0.0 },
            s.throttle_episodes,
            s.events_vetoed,
            s.max_unbuilt_meps
        );
    }
    if s.buffers_preallocated_bytes > 0 {
        out += &format!(
            "preallocated buffers: {:.1} MiB in all nodes; MEPs that waited for a free MEP buffer {}, receive buffers allocated past the pool {}\n",
            s.buffers_preallocated_bytes as f64 / f64::from(1u32 << 20),
            s.mep_buffer_waits,
            s.rx_buffer_overflows
        );
    }
    for (src, &m) in s.missing_by_source.iter().enumerate() {
        if m > 0 {
            out += &format!("source {src} was missing from {m} incomplete batches\n");
        }
    }
    out
}

/// Error for a failed run, for the exit status.
pub fn loss_error(result: &RunResult) -> anyhow::Error {
    let s = &result.summary;
    let output = s.consumers.as_ref().map_or(String::new(), |c| {
        format!(
            ", batches not consumed {}, undelivered {}, corrupt at the consumers {}",
            c.batches_not_consumed, c.batches_undelivered, c.batches_corrupt
        )
    });
    anyhow!(
        "events lost {}, incomplete {}, corrupt {}, nodes without a final report {:?}{output} (use --allow-loss to accept)",
        s.events_lost,
        s.events_incomplete,
        s.events_corrupt,
        s.nodes_missing
    )
}

/// The live bar of `evb run` on a terminal: the run's time (or its MEPs,
/// for a run of `run.max_meps`), with the latest rates as its message.
fn progress_bar(config: &Config) -> indicatif::ProgressBar {
    let (len, template) = if config.run.duration_s > 0.0 {
        (
            (config.run.duration_s * 10.0).ceil() as u64,
            "[{elapsed_precise}] [{bar:20}] {percent:>3}% {wide_msg}",
        )
    } else {
        (
            config.run.max_meps.max(1),
            "[{elapsed_precise}] [{bar:20}] {pos}/{len} MEPs {wide_msg}",
        )
    };
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(500));
    bar
}
