//! Setting a node up: its buffers, its transport, its peers' addresses
//! (from the configuration, `evb run`'s stdio or a cluster launcher), and
//! the runtime that then runs it ([`run_node`]).

use std::io::{BufRead, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use evb_control::lines::{ToLauncher, ToNode};
use evb_core::config::{Config, Readout};
use evb_core::{Layout, NodeId};

use crate::mepbuf::SlotStore;
use crate::transport::{self, outnet, CrcPolicy, Transport, TransportKind};

use super::*;

/// How the node is told its peers and when to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Addresses from `transport.addresses`; stops after `run.duration_s`.
    Config,
    /// Driven by `evb run` over stdin/stdout.
    Stdio,
    /// Under a cluster launcher: tokens through a rendezvous directory
    /// (`NodeOptions::rendezvous`); stops after `run.duration_s`.
    Launcher,
}

pub struct NodeOptions {
    pub config: Config,
    pub rank: NodeId,
    pub control: Control,
    /// `Control::Launcher`: the directory where ranks exchange addresses.
    pub rendezvous: Option<PathBuf>,
    /// This process restarts a node of a run already going: it connects to
    /// the live peers without the start barrier (TCP: on the node's
    /// address again; shm: with a new inbox the peers are told of; UCX:
    /// with a new worker address it sends each peer), and the EM re-admits
    /// it (TCP, shm and UCX).
    pub rejoin: bool,
}

/// Runs one node to the end of the run. Prints the final report.
pub fn run_node(opts: NodeOptions) -> Result<()> {
    // MEP and batch buffers (up to megabytes) get their own mappings and go
    // back to the system when freed. glibc would otherwise raise its mmap
    // threshold after the first free and carve them out of the heap, where
    // they fragment it and the resident memory of a long run creeps up.
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
    let control = opts.control;
    let (mut rt, mut transport) = prepare(opts, false)?;
    // After the PEERS line was read: from here on stdin carries commands.
    let commands = (control == Control::Stdio).then(spawn_stdin_forwarder);
    rt.run(transport.as_mut(), commands.as_ref())
}

/// A node set up and connected to its peers, ready to run: its runtime and
/// its transport. `embedded`: the node lives in someone else's process (an
/// external consumer, [`crate::consumer`]): no metrics endpoint, nothing
/// on stdout, the final report to the rendezvous directory only.
pub(crate) fn prepare(opts: NodeOptions, embedded: bool) -> Result<(Runtime, Box<dyn Transport>)> {
    let config = opts.config;
    let layout = Layout::from_config(&config);
    let rank = opts.rank;
    if rank >= layout.endpoints {
        bail!(
            "rank {rank} does not exist: the run has {} endpoints",
            layout.endpoints
        );
    }
    // Before the node announces itself: the start barrier waits for it, and
    // the run's clock does not count it.
    let pools = preallocate(&config, &layout, rank)?;
    let kind = config.transport.kind.on_node();
    let mep_slots = mep_slots(&config, &layout, rank, &kind)?;
    let early_peers = peers_known_early(
        &config,
        &layout,
        &kind,
        opts.rejoin,
        opts.control,
        opts.rendezvous.as_deref(),
    )?;
    let mut transport = match &early_peers {
        Some(peers) => bind_tcp_at_own_token(&config, &layout, rank, opts.control, peers)?,
        None => open_transport(&config, &layout, rank, opts.control, mep_slots.as_ref())?,
    };
    // shm keeps its inbox's name in /dev/shm for restarted peers to find,
    // and only `evb run` removes what a killed node leaves there: rejoin is
    // offered when it plans restarts (or asked for).
    let shm_restarts = opts.control == Control::Stdio && config.transport.shm_rejoin;
    let offer_rejoin = opts.rejoin || shm_restarts || kind != TransportKind::Shm;
    let rejoin_ok = offer_rejoin && transport.enable_rejoin(opts.rejoin);
    if opts.rejoin && !rejoin_ok {
        bail!(
            "transport `{}` cannot rejoin a run: only tcp, shm, ucx and ofi:tcp can",
            transport.name()
        );
    }
    let peers = match (early_peers, opts.control) {
        (Some(peers), _) => peers,
        (None, Control::Launcher) => launcher_peers(
            &config,
            &layout,
            rank,
            opts.rendezvous.as_deref(),
            transport.as_ref(),
        )?,
        (None, control) => rendezvous(&config, &layout, rank, control, transport.as_ref())?,
    };
    let run_id = config.run.run_id;
    let metrics = match config.metrics.base_port {
        _ if embedded => None,
        0 => None,
        base => Some(crate::metrics::serve(&config.metrics.bind, base + rank)?),
    };
    let mut rt = Runtime::new(config, layout, rank, embedded)?;
    if let Some(rx_pool) = pools {
        rt.engine.rx_pool = rx_pool;
    }
    rt.engine.slots = mep_slots;
    // The ring readout's buffers are written once, before the run, as a
    // readout board's DMA ring is set up: its memory is resident and
    // stays where it is.
    rt.engine.fill_ring();
    rt.metrics = metrics;
    rt.restarted = opts.rejoin;
    if opts.rejoin {
        rt.engine.node.rejoining();
    }
    if opts.rejoin && rank == rt.layout.em {
        // The EM died and this is its new incarnation: it learns from the
        // nodes how far the run got before it assigns again. Set before
        // the transport connects: their answers can arrive during setup.
        let peer_timeout = Duration::from_millis(rt.config.transport.peer_timeout_ms);
        let wait = (3 * peer_timeout).max(EM_RESYNC_WAIT_MIN);
        rt.engine.node.resume_em(wait.as_nanos() as u64);
    }
    if opts.control == Control::Launcher {
        // Many ranks share the launcher's stdout, where long lines of
        // different ranks interleave: the final report also goes to a file.
        rt.report_file = opts.rendezvous.as_ref().map(|d| {
            d.join(format!("run{run_id}"))
                .join(format!("final-{rank}.json"))
        });
    }
    transport
        .connect(&peers, &mut rt.engine)
        .with_context(|| format!("setting up the {} transport", transport.name()))?;
    // (`evb run` says it in its summary.)
    if let Some(out) = transport
        .output_network()
        .filter(|_| opts.control != Control::Stdio)
    {
        tracing::warn!(
            "evb node {rank}: on the output network at {} ({} links there)",
            out.address,
            out.links.len()
        );
    }
    Ok((rt, transport))
}

/// The directory where a cluster launcher's ranks exchange addresses.
fn rendezvous_dir(rendezvous: Option<&Path>) -> Result<&Path> {
    rendezvous.ok_or_else(|| anyhow!("--control launcher needs --rendezvous DIR"))
}

/// A restarted TCP node's peer tokens, needed before its transport opens
/// because it listens where its peers know it: under `evb run` the address
/// list comes first, under a cluster launcher they are where the job's
/// ranks published. `None` for any other node (a restarted shm node
/// announces its new inbox as at the start, and asks the peers to take it
/// back).
fn peers_known_early(
    config: &Config,
    layout: &Layout,
    kind: &TransportKind,
    rejoin: bool,
    control: Control,
    rendezvous: Option<&Path>,
) -> Result<Option<Vec<String>>> {
    Ok(match (rejoin, control, kind) {
        (true, Control::Stdio, TransportKind::Tcp) => Some(read_peers_line(layout)?),
        (true, Control::Launcher, TransportKind::Tcp) => Some(crate::cluster::published_tokens(
            rendezvous_dir(rendezvous)?,
            config.run.run_id,
            layout.endpoints,
        )?),
        _ => None,
    })
}

/// The TCP transport of a restarted node, listening at its own token in
/// `peers` (on both networks with an output network).
fn bind_tcp_at_own_token(
    config: &Config,
    layout: &Layout,
    rank: NodeId,
    control: Control,
    peers: &[String],
) -> Result<Box<dyn Transport>> {
    let own = &peers[rank as usize];
    let listen = outnet::split_token(own)
        .0
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| anyhow!("bad own address `{own}`"))?;
    let out_listen = output_listen(config, layout, rank, control, Some(own))?;
    Ok(Box::new(transport::tcp::TcpTransport::bind(
        config,
        layout,
        rank,
        Some(listen),
        out_listen.as_ref().map(|(a, k)| (*a, k.as_str())),
    )?))
}

/// Under a cluster launcher: every rank's token, exchanged through the
/// rendezvous directory (MPI knows every rank already: nothing to
/// exchange).
fn launcher_peers(
    config: &Config,
    layout: &Layout,
    rank: NodeId,
    rendezvous: Option<&Path>,
    transport: &dyn Transport,
) -> Result<Vec<String>> {
    if config.transport.kind.on_node() == TransportKind::Mpi {
        return Ok((0..layout.endpoints)
            .map(|r| transport::msg::to_hex(&i32::from(r).to_le_bytes()))
            .collect());
    }
    let dir = rendezvous_dir(rendezvous)?;
    let token = transport.local_token();
    let token = match outnet::split_token(&token) {
        // A TCP port: others need our address too (and with an output
        // network, after a comma, our address there).
        (port, out) if port.parse::<u16>().is_ok() => {
            let out = out.map_or(String::new(), |o| format!(",{o}"));
            format!("{}:{port}{out}", config.transport.bind)
        }
        _ => token.clone(),
    };
    crate::cluster::exchange_tokens(
        dir,
        config.run.run_id,
        rank,
        layout.endpoints,
        &token,
        Duration::from_secs(60),
    )
}

/// Where a TCP node listens on the output network, and the setting that
/// says so; `None` without an output network. `published`: the token a
/// restarted node published at its start (it listens there again).
fn output_listen(
    config: &Config,
    layout: &Layout,
    rank: NodeId,
    control: Control,
    published: Option<&str>,
) -> Result<Option<(SocketAddr, String)>> {
    if !config.output_network() {
        return Ok(None);
    }
    if let Some(token) = published {
        let out = outnet::split_token(token).1.ok_or_else(|| {
            anyhow!("this node's published address `{token}` has no output-network part")
        })?;
        let addr = outnet::resolve(out, "this node's published output-network address")?;
        return Ok(Some((addr, "the published output-network address".into())));
    }
    match control {
        Control::Config => {
            let own = outnet::local_ip(config)?;
            let mine = outnet::config_addresses(config, layout)?[rank as usize];
            Ok(Some(match own {
                Some((ip, key)) => (SocketAddr::new(ip, mine.port()), key.into()),
                None => (mine, format!("output.addresses[{rank}]")),
            }))
        }
        Control::Stdio | Control::Launcher => {
            let (ip, key) = outnet::published_ip(config)?;
            Ok(Some((SocketAddr::new(ip, 0), key.into())))
        }
    }
}

/// `event_builder.preallocate_buffers`: this node's fixed receive pool
/// (`crate::buffers` derives its bounds), allocated and touched; its MEP
/// buffers are a slot store ([`mep_slots`]), touched there.
fn preallocate(config: &Config, layout: &Layout, rank: NodeId) -> Result<Option<SparePool>> {
    if !config.event_builder.preallocate_buffers {
        return Ok(None);
    }
    let kind = config.transport.kind.on_node();
    let plan = crate::buffers::BufferPlan::for_node(config, layout, rank, &kind);
    let t = Instant::now();
    let pool = SparePool::fixed(plan.rx_buffers, plan.rx_bytes);
    tracing::warn!(
        "evb node {rank}: preallocated {} receive buffers of {:.2} MiB in {:.2} s",
        plan.rx_buffers,
        plan.rx_bytes as f64 / f64::from(1u32 << 20),
        t.elapsed().as_secs_f64()
    );
    Ok(Some(pool))
}

/// The RU's MEP buffers as a fixed set of slots, when they are one: the
/// readout ring (`source.readout = "ring"`), the fixed pool
/// (`event_builder.preallocate_buffers`), or shared memory its shm peers
/// read in place (`transport.shm_zero_copy`). `None`: fresh data in
/// buffers allocated on demand (or not an RU).
fn mep_slots(
    config: &Config,
    layout: &Layout,
    rank: NodeId,
    kind: &TransportKind,
) -> Result<Option<SlotStore>> {
    let plan = crate::buffers::BufferPlan::for_node(config, layout, rank, kind);
    if plan.mep_buffers == 0 {
        return Ok(None);
    }
    let zero_copy = crate::buffers::zero_copy(config, kind);
    let prealloc = config.event_builder.preallocate_buffers;
    if !(zero_copy || prealloc || config.source.readout == Readout::Ring) {
        return Ok(None);
    }
    let slots = u32::try_from(plan.mep_buffers).context("MEP buffers")?;
    let t = Instant::now();
    let store = if zero_copy {
        let control = transport::shm::release_words_bytes(slots, layout.endpoints);
        SlotStore::shared(slots, plan.mep_bytes, control)
    } else {
        SlotStore::private(slots, plan.mep_bytes, crate::buffers::huge_pages(config))
    }
    .with_context(|| format!("evb node {rank}: MEP buffers"))?;
    if prealloc {
        store.touch_all();
        tracing::warn!(
            "evb node {rank}: preallocated {slots} MEP buffers of {:.2} MiB{} in {:.2} s",
            plan.mep_bytes as f64 / f64::from(1u32 << 20),
            if zero_copy { " (shared)" } else { "" },
            t.elapsed().as_secs_f64()
        );
    }
    Ok(Some(store))
}

/// Opens this node's end of the configured transport.
pub fn open_transport(
    config: &Config,
    layout: &Layout,
    rank: NodeId,
    control: Control,
    mep_slots: Option<&SlotStore>,
) -> Result<Box<dyn Transport>> {
    let progress = config.transport.progress;
    match config.transport.kind.on_node() {
        TransportKind::Tcp => {
            let listen = match control {
                Control::Stdio | Control::Launcher => None,
                Control::Config => Some(config_addresses(config, layout)?[rank as usize]),
            };
            let out_listen = output_listen(config, layout, rank, control, None)?;
            Ok(Box::new(transport::tcp::TcpTransport::bind(
                config,
                layout,
                rank,
                listen,
                out_listen.as_ref().map(|(a, k)| (*a, k.as_str())),
            )?))
        }
        TransportKind::Shm => {
            let mut ep = transport::shm::ShmEndpoint::open(
                config.run.run_id,
                rank,
                layout.endpoints,
                config.transport.shm_ring_bytes,
                progress,
            )?;
            ep.set_crc_policy(CrcPolicy::from_config(config));
            ep.populate_peer_slots(config.event_builder.preallocate_buffers);
            if let Some(store) = mep_slots.filter(|s| s.store().fd().is_some()) {
                ep.share_slots(store.clone())?;
            }
            Ok(Box::new(transport::msg::MsgTransport::new(
                ep, config, layout, rank,
            )?))
        }
        TransportKind::Mpi if control != Control::Launcher => {
            bail!("transport `mpi` runs under mpirun or srun: use `evb node --control launcher`")
        }
        engine => transport::open_engine(&engine, config, layout, rank),
    }
}

/// The addresses of `transport.addresses` or `bind:base_port + i`.
fn config_addresses(config: &Config, layout: &Layout) -> Result<Vec<SocketAddr>> {
    let t = &config.transport;
    if !t.addresses.is_empty() {
        if t.addresses.len() != layout.endpoints as usize {
            bail!(
                "transport.addresses has {} entries but the run has {} endpoints",
                t.addresses.len(),
                layout.endpoints
            );
        }
        t.addresses
            .iter()
            .map(|a| {
                a.to_socket_addrs()
                    .with_context(|| format!("transport.addresses: cannot resolve `{a}`"))?
                    .next()
                    .ok_or_else(|| anyhow!("transport.addresses: `{a}` has no address"))
            })
            .collect()
    } else if t.base_port != 0 {
        (0..layout.endpoints)
            .map(|i| {
                format!("{}:{}", t.bind, t.base_port + i)
                    .parse()
                    .with_context(|| format!("transport.bind `{}` is not an IP address", t.bind))
            })
            .collect()
    } else {
        bail!("without `evb run`, set transport.addresses or transport.base_port");
    }
}

/// Learns every endpoint's token (address).
pub fn rendezvous(
    config: &Config,
    layout: &Layout,
    _rank: NodeId,
    control: Control,
    transport: &dyn Transport,
) -> Result<Vec<String>> {
    match control {
        Control::Stdio => {
            print!("{}", ToLauncher::Listen(transport.local_token()).encode());
            std::io::stdout().flush()?;
            read_peers_line(layout)
        }
        Control::Launcher => bail!("launcher rendezvous is handled by run_node"),
        Control::Config => {
            if config.transport.kind.on_node() != TransportKind::Tcp {
                bail!(
                    "transport `{}` needs `evb run` or a launcher (mpirun, srun) to exchange addresses",
                    config.transport.kind
                );
            }
            let eb = config_addresses(config, layout)?;
            if !config.output_network() {
                return Ok(eb.iter().map(|a| a.to_string()).collect());
            }
            // Every endpoint's address on both networks.
            let out = outnet::config_addresses(config, layout)?;
            Ok(eb
                .iter()
                .zip(&out)
                .map(|(e, o)| format!("{e},{o}"))
                .collect())
        }
    }
}

/// Reads the `PEERS token...` line `evb run` sends.
fn read_peers_line(layout: &Layout) -> Result<Vec<String>> {
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        bail!("stdin closed before the PEERS line");
    }
    let tokens = match ToNode::parse(&line) {
        Ok(ToNode::Peers(tokens)) => tokens,
        Ok(other) => bail!(
            "expected `PEERS token...`, got `{}`",
            other.encode().trim_end()
        ),
        Err(e) => bail!("expected `PEERS token...`: {e}"),
    };
    if tokens.len() != layout.endpoints as usize {
        bail!(
            "PEERS lists {} addresses for {} endpoints",
            tokens.len(),
            layout.endpoints
        );
    }
    Ok(tokens)
}

/// Forwards `STOP` (and the end of stdin) from a thread to the event loop.
fn spawn_stdin_forwarder() -> mpsc::Receiver<Command> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::stdin().lines();
        loop {
            let cmd = match lines.next() {
                Some(Ok(l)) if ToNode::parse(&l) == Ok(ToNode::Stop) => Command::Stop,
                Some(Ok(_)) => continue,
                _ => Command::Eof,
            };
            let eof = matches!(cmd, Command::Eof);
            if tx.send(cmd).is_err() || eof {
                return;
            }
        }
    });
    rx
}
