//! `evb`: one binary, several subcommands. The work lives in the library
//! crates; this file only parses the command line and dispatches.

mod bench;
mod chaos;
mod diagnose;
mod fabric;
mod gen;
mod log;
mod plan;
mod progress;
mod report;
mod run_fabric;
mod sim;
mod store;
mod vocab;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use evb_core::fault::{FaultKind, NodeFault, TimeUnit};
use evb_core::Config;
use evb_launch::{fault_option, format_summary, loss_error, run_local, RunOptions};
use evb_node::start::StartOptions;
use evb_node::Control;
use evb_transport::hugepages;

/// `evb --version`: the version and the commit built (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EVB_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "evb",
    version = VERSION,
    about = "Event builders for trigger-less DAQ: run, analyse, simulate"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a local event builder: one process per node on loopback.
    Run(RunArgs),
    /// Run one endpoint of an event builder (started by `evb run`, mpirun, srun or by hand).
    Node(NodeArgs),
    /// Check or print configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Fabric analysis: topologies, routing, LFTs, shift conflicts.
    Fabric(fabric::FabricArgs),
    /// Simulate an event builder or synthetic traffic on a credit-based fabric.
    Sim(sim::SimArgs),
    /// Simulate the cartesian product of parameter values, in parallel.
    Scan(sim::ScanArgs),
    /// From a requirement to ranked fabric designs: switches, cables, cost, conflicts, the rate evb sim predicts.
    Plan(plan::PlanArgs),
    /// A randomized fault soak of a real `evb run` from a seed: invariants, recovery times.
    Chaos(chaos::ChaosArgs),
    /// Transport micro-benchmarks and conformance checks (real processes).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// One self-contained HTML report from the JSON files evb writes.
    Report(report::ReportArgs),
    /// The event store: read and verify stored batches.
    Store(store::StoreArgs),
    /// Print a shell completion script (bash, zsh, fish, ...) to stdout.
    Completions(gen::CompletionsArgs),
    /// Write the man pages (evb.1 and one per subcommand) to a directory.
    Man(gen::ManArgs),
}

#[derive(Debug, Args)]
struct ConfigArgs {
    /// Event builder configuration (TOML); the documented default without it.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override a key: `--set section.key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Number of nodes (sets nodes.count).
    #[arg(long, short)]
    nodes: Option<u16>,
    /// Filter Unit consumer processes the BUs hand built batches to (sets
    /// output.consumers).
    #[arg(long)]
    consumers: Option<u16>,
    /// Consumers evb run does not start: programs of their own on libevb or its Python
    /// package, the last K consumer endpoints (after --consumers), that join through
    /// --rendezvous DIR (docs/integration.md).
    #[arg(long, value_name = "K", default_value_t = 0, requires = "rendezvous")]
    external_consumers: u16,
    /// With --external-consumers: a fresh directory where they join (configuration, run key,
    /// addresses and their final reports go to DIR/run<id>/).
    #[arg(long, value_name = "DIR")]
    rendezvous: Option<PathBuf>,
    /// Transport: tcp, shm, ofi:<provider>, ucx, ucx:<UCX_TLS> (sets transport.kind).
    #[arg(short, long)]
    transport: Option<String>,
    /// Seconds to build before draining (sets run.duration_s).
    #[arg(long, short)]
    duration: Option<f64>,
    /// Write the run's results as JSON (docs/run-json.md).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Exit 0 even if events were lost, incomplete or corrupt.
    #[arg(long)]
    allow_loss: bool,
    /// Live progress bar: auto (on a terminal, not under CI), always (on a
    /// terminal even under CI), never.
    #[arg(long, default_value = "auto")]
    progress: String,
    /// Fault injection: `kill -9` node RANK at SECONDS into the run (repeatable).
    #[arg(long, value_name = "RANK@SECONDS")]
    kill: Vec<String>,
    /// Fault injection: SIGSTOP node RANK at SECONDS (it goes silent, its connections stay open).
    #[arg(long, value_name = "RANK@SECONDS")]
    stop: Vec<String>,
    /// Fault injection: SIGCONT node RANK at SECONDS (resumes a node stopped with --stop; its links
    /// come back over tcp and shm and the EM re-admits it).
    #[arg(long, value_name = "RANK@SECONDS")]
    resume: Vec<String>,
    /// Restart node RANK (killed earlier with --kill) at SECONDS: a fresh process that rejoins
    /// the run (tcp, shm, ucx and ofi:tcp; not mpi). A restarted EM takes the run over: it waits
    /// for every node to say how far it saw, then resumes above.
    #[arg(long, value_name = "RANK@SECONDS")]
    restart: Vec<String>,
    #[command(flatten)]
    fabric: run_fabric::FabricRunArgs,
}

#[derive(Debug, Args)]
struct NodeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// This endpoint's index (under mpirun/srun: from the launcher's environment).
    #[arg(long)]
    rank: Option<u16>,
    /// `config`: peers from transport.addresses or base_port; `stdio`: driven by `evb run`;
    /// `launcher`: under mpirun/srun, addresses exchanged in --rendezvous DIR.
    #[arg(long, default_value = "config")]
    control: String,
    /// `--control launcher`: a directory every rank can see (shared filesystem).
    #[arg(long)]
    rendezvous: Option<PathBuf>,
    /// Join a run already going, as a restarted node (same rank; tcp: same address, shm: a new
    /// inbox, ucx and ofi:tcp: a new address): no start barrier, connect to the live peers, the
    /// EM re-admits it (tcp, shm, ucx and ofi:tcp). A restarted EM takes the run over. With
    /// --control launcher: started outside the job, give --rank; the size comes from the
    /// rendezvous directory.
    #[arg(long)]
    rejoin: bool,
    #[command(flatten)]
    fabric: run_fabric::FabricRunArgs,
}

#[derive(Debug, Args)]
struct ConfigFileArgs {
    /// The configuration file (same as --config).
    file: Option<PathBuf>,
    #[command(flatten)]
    config: ConfigArgs,
}

impl ConfigFileArgs {
    fn load(&self) -> anyhow::Result<(String, Config)> {
        let path = self.file.as_ref().or(self.config.config.as_ref());
        let name = path.map_or("<default>".into(), |p| p.display().to_string());
        Ok((
            name,
            Config::load(path.map(PathBuf::as_path), &self.config.overrides)?,
        ))
    }
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a configuration file (and overrides); print the problem with its line.
    Check(ConfigFileArgs),
    /// Print the effective configuration as TOML.
    Show(ConfigFileArgs),
}

#[global_allocator]
static ALLOCATOR: hugepages::MaybeHuge = hugepages::MaybeHuge;

fn main() -> ExitCode {
    let cli = Cli::parse();
    log::init();
    if matches!(
        cli.command,
        Command::Sim(_)
            | Command::Scan(_)
            | Command::Plan(_)
            | Command::Fabric(_)
            | Command::Config(_)
            | Command::Report(_)
            | Command::Completions(_)
    ) {
        // Commands that only print may die quietly when their reader goes
        // away (`| head`). Not `run` and `node`: they write to sockets and
        // pipes where a vanished peer must be an error, not a signal.
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.command {
        Command::Run(args) => cmd_run(args),
        Command::Node(args) => cmd_node(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Chaos(args) => chaos::run(args),
        Command::Config(cmd) => cmd_config(cmd),
        Command::Fabric(args) => fabric::run(args).map(|_| ExitCode::SUCCESS),
        Command::Sim(args) => sim::run(args).map(|_| ExitCode::SUCCESS),
        Command::Scan(args) => sim::scan(args).map(|_| ExitCode::SUCCESS),
        Command::Plan(args) => plan::run(args).map(|_| ExitCode::SUCCESS),
        Command::Report(args) => report::run(args).map(|_| ExitCode::SUCCESS),
        Command::Store(args) => store::run(args),
        Command::Completions(args) => {
            gen::completions(gen::command::<Cli>(), &args).map(|_| ExitCode::SUCCESS)
        }
        Command::Man(args) => gen::man(gen::command::<Cli>(), &args).map(|_| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            tracing::error!("evb: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn cmd_run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let progress = match args.progress.as_str() {
        "auto" => None,
        "always" => Some(true),
        "never" => Some(false),
        other => anyhow::bail!("--progress takes auto, always or never, not `{other}`"),
    };
    let faults = run_faults(&args)?;
    let mut overrides = args.config.overrides;
    if let Some(t) = &args.transport {
        overrides.push(format!("transport.kind={t}"));
    }
    // Kept to the end of the run: it owns the schedule file the nodes read.
    let fabric = args
        .fabric
        .plan(args.config.config.as_deref(), &overrides, args.nodes)?;
    if let Some(s) = &fabric.summary {
        eprintln!("evb run: {s}");
    }
    overrides.extend(fabric.overrides.iter().cloned());
    let opts = RunOptions {
        config: args.config.config,
        overrides,
        nodes: args.nodes,
        consumers: args.consumers,
        external_consumers: args.external_consumers,
        rendezvous: args.rendezvous,
        duration_s: args.duration,
        json: args.json,
        allow_loss: args.allow_loss,
        progress,
        exe: None,
        faults,
    };
    let (result, clean) = run_local(&opts)?;
    print!("{}", format_summary(&result));
    if clean || opts.allow_loss {
        Ok(ExitCode::SUCCESS)
    } else {
        tracing::error!("evb: error: {:#}", loss_error(&result));
        Ok(ExitCode::from(1))
    }
}

/// The faults of `--kill`, `--stop`, `--resume` and `--restart`, in that
/// order (the order the launcher applies those due together).
fn run_faults(args: &RunArgs) -> anyhow::Result<Vec<NodeFault>> {
    let mut faults = Vec::new();
    for (specs, kind) in [
        (&args.kill, FaultKind::Crash),
        (&args.stop, FaultKind::Hang),
        (&args.resume, FaultKind::Resume),
        (&args.restart, FaultKind::Restart),
    ] {
        for spec in specs {
            let fault = NodeFault::parse(spec, kind, TimeUnit::Seconds)
                .map_err(|e| anyhow::anyhow!("{} {e}", fault_option(kind)))?;
            faults.push(fault);
        }
    }
    Ok(faults)
}

fn cmd_node(args: NodeArgs) -> anyhow::Result<ExitCode> {
    let control = match args.control.as_str() {
        "config" => Control::Config,
        "stdio" => Control::Stdio,
        "launcher" => Control::Launcher,
        other => anyhow::bail!("--control takes config, stdio or launcher, not `{other}`"),
    };
    let fabric = args
        .fabric
        .plan(args.config.config.as_deref(), &args.config.overrides, None)?;
    if let Some(s) = &fabric.summary {
        eprintln!("evb node: {s}");
    }
    let mut overrides = args.config.overrides;
    overrides.extend(fabric.overrides.iter().cloned());
    evb_node::start::start(StartOptions {
        config: args.config.config,
        overrides,
        rank: args.rank,
        control,
        rendezvous: args.rendezvous,
        rejoin: args.rejoin,
    })?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_config(cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ConfigCommand::Check(a) => {
            let (name, c) = a.load()?;
            let (rus, bus) = c.unit_counts();
            println!(
                "{name}: ok ({} nodes: {rus} RUs, {bus} BUs; {:?}/{:?})",
                c.nodes.count, c.event_builder.protocol, c.event_builder.schedule
            );
        }
        ConfigCommand::Show(a) => {
            let (_, c) = a.load()?;
            print!("{}", toml::to_string(&c)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
