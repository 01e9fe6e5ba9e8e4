//! How an `evb node` process starts: its rank and the number of endpoints
//! (from the command line, or from a cluster launcher's environment and
//! rendezvous directory), its configuration with them, huge pages as
//! configured, then [`run_node`].

use std::path::PathBuf;

use anyhow::{anyhow, bail, ensure, Result};
use evb_core::{Config, Layout};

use crate::{run_node, Control, NodeOptions};

/// What `evb node` was asked for, as the command line says it.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// The configuration file (the documented default without one).
    pub config: Option<PathBuf>,
    /// `section.key=value` overrides, in order.
    pub overrides: Vec<String>,
    /// This endpoint's index; under a cluster launcher, from its
    /// environment when not given.
    pub rank: Option<u16>,
    pub control: Control,
    /// `Control::Launcher`: the directory where ranks exchange addresses.
    pub rendezvous: Option<PathBuf>,
    /// Join a run already going, as a restarted node.
    pub rejoin: bool,
}

/// Starts the node `opts` describes and runs it to the end of the run.
pub fn start(opts: StartOptions) -> Result<()> {
    if opts.rejoin && opts.control == Control::Launcher {
        return rejoin_cluster_job(opts);
    }
    let mut overrides = opts.overrides.clone();
    let launcher = evb_control::cluster::launcher_rank();
    let rank = match (opts.rank, launcher, opts.control) {
        (Some(r), _, _) => r,
        (None, Some((r, size, who)), Control::Launcher) => {
            // The launcher's size is the number of endpoints.
            overrides.insert(0, format!("nodes.count={size}"));
            tracing::info!("evb node: rank {r} of {size} from {who}");
            r
        }
        (None, None, Control::Launcher) => bail!(
            "no launcher environment (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID): give --rank"
        ),
        (None, _, _) => bail!("--rank is required outside a launcher"),
    };
    let config = Config::load(opts.config.as_deref(), &overrides)?;
    evb_transport::hugepages::choose(config.event_builder.huge_pages);
    if let (Control::Launcher, Some((_, size, who))) = (opts.control, launcher) {
        let endpoints = Layout::from_config(&config).endpoints;
        ensure!(
            endpoints == size,
            "{who} started {size} ranks but the configuration has {endpoints} endpoints (nodes.count, nodes.em, output.consumers)"
        );
    }
    run_node(NodeOptions {
        config,
        rank,
        control: opts.control,
        rendezvous: opts.rendezvous,
        rejoin: opts.rejoin,
    })
}

/// A rank of a cluster job (`--control launcher`) restarted on its own,
/// outside the job's launcher: the rank is given, the size is what the
/// job's ranks published in the rendezvous directory.
fn rejoin_cluster_job(opts: StartOptions) -> Result<()> {
    let rank = opts.rank.ok_or_else(|| {
        anyhow!(
            "--rejoin under --control launcher: give --rank (a restarted process is not one of \
             the launcher's ranks)"
        )
    })?;
    let dir = opts
        .rendezvous
        .clone()
        .ok_or_else(|| anyhow!("--control launcher needs --rendezvous DIR"))?;
    let path = opts.config.as_deref();
    let mut overrides = opts.overrides;
    let run_id = Config::load(path, &overrides)?.run.run_id;
    let size = evb_control::cluster::published_ranks(&dir, run_id)?;
    overrides.insert(0, format!("nodes.count={size}"));
    let config = Config::load(path, &overrides)?;
    evb_transport::hugepages::choose(config.event_builder.huge_pages);
    tracing::info!(
        "evb node: rank {rank} of {size} rejoins run {run_id} of {}",
        dir.display()
    );
    run_node(NodeOptions {
        config,
        rank,
        control: Control::Launcher,
        rendezvous: Some(dir),
        rejoin: true,
    })
}
