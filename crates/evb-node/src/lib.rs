//! `evb-node`: `evb node`, one endpoint of an event builder, as a process.
//!
//! A crate of its own: it is the runtime that drives the sans-IO
//! `evb-core` over real transports (`evb-transport`); `evb run`
//! (`evb-launch`) only starts it as a process and reads its lines, and
//! `evb bench` (`evb-bench`) opens transports and exchanges addresses the
//! way it does ([`open_transport`], [`rendezvous`]). [`start`] turns a
//! command line into a running node.
//!
//! Drives an [`evb_core::Node`] over a [`Transport`] with a single-threaded
//! loop: time-driven inputs (deadlines, heartbeats, the end of the run),
//! then the transport's input, then the actions the node asked for.
//! Under `evb run` (`--control stdio`) the node prints `LISTEN <token>`,
//! reads `PEERS <token>...` and later `STOP` on stdin, and prints `STATS`
//! and `FINAL` JSON lines on stdout (the lines of [`evb_control::lines`]).
//! Under `mpirun`/`srun` (`--control launcher`) rank and size come from
//! the launcher's environment and the tokens through a rendezvous
//! directory ([`evb_control::cluster`]).
//!
//! With consumers, a BU delivers each built batch to a Filter Unit endpoint
//! as one fragment-kind message flagged as a batch; an FU endpoint verifies
//! it and is busy with it for the time its state machine drew, waiting on
//! the node's deadline (sleeping or spinning, `output.consumer_wait`).

pub mod start;

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use evb_core::bu::Admit;
use evb_core::config::{BusyWait, Config, Readout, SinkKind};
use evb_core::source::{payload_crc, RingTemplate, SourceModel};
use evb_core::wire::{FragmentHeader, Message, FLAG_BATCH, FLAG_PARTIAL};
use evb_core::{Action, Layout, MepId, Nanos, Node, NodeId, Outcome};

// The crates a node is made of, under the names its code uses for them.
use evb_control::{cluster, report};
use evb_metrics as metrics;
use evb_transport as transport;
use evb_transport::{buffers, mepbuf};

use crate::mepbuf::{MepBuf, SlotStore};
use crate::report::NodeReport;
use crate::transport::shm::SharedView;
use crate::transport::{outnet, CrcPolicy, LinkEvent, RxHandler, Transport, TransportKind};
use evb_control::lines::{ToLauncher, ToNode};

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

const STATS_INTERVAL: Duration = Duration::from_millis(250);
/// After its own work is done, how long a node waits for its peers to finish.
const LINGER: Duration = Duration::from_secs(5);
/// A restarted EM waits at least this long for every node to answer: a
/// TCP peer re-dials it with a backoff of up to 1 s.
const EM_RESYNC_WAIT_MIN: Duration = Duration::from_secs(3);
/// A restarted EM waiting longer than this for the nodes says for whom.
const RESYNC_SLOW: Duration = Duration::from_secs(2);
/// Every link carries at least this often a message or a heartbeat;
/// silence is checked as often (a lost peer is seen within
/// `transport.peer_timeout_ms` + this).
const HEARTBEAT: Duration = Duration::from_millis(100);
/// Actions carried out before the loop looks at its timers again.
const ACTION_BUDGET: u32 = 4096;
/// The longest a wait for input lasts, so that commands from stdin are
/// seen promptly.
const MAX_WAIT: Duration = Duration::from_millis(50);

enum Command {
    Stop,
    Eof,
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
    let kind = TransportKind::parse(&config.transport.kind)?;
    let mep_slots = mep_slots(&config, &layout, rank, &kind)?;
    // A restarted TCP node listens where its peers know it: under `evb
    // run`, the address list comes first. (A restarted shm node announces
    // its new inbox as at the start, and asks the peers to take it back.)
    let early_peers = match (opts.rejoin, opts.control, &kind) {
        (true, Control::Stdio, TransportKind::Tcp) => Some(read_peers_line(&layout)?),
        // Under a cluster launcher: where the job's ranks published.
        (true, Control::Launcher, TransportKind::Tcp) => {
            let dir = opts
                .rendezvous
                .as_deref()
                .ok_or_else(|| anyhow!("--control launcher needs --rendezvous DIR"))?;
            Some(crate::cluster::published_tokens(
                dir,
                config.run.run_id,
                layout.endpoints,
            )?)
        }
        _ => None,
    };
    let mut transport = match &early_peers {
        Some(peers) => {
            let own = &peers[rank as usize];
            let listen = outnet::split_token(own)
                .0
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| anyhow!("bad own address `{own}`"))?;
            let out_listen = output_listen(&config, &layout, rank, opts.control, Some(own))?;
            Box::new(transport::tcp::TcpTransport::bind(
                &config,
                &layout,
                rank,
                Some(listen),
                out_listen.as_ref().map(|(a, k)| (*a, k.as_str())),
            )?)
        }
        None => open_transport(&config, &layout, rank, opts.control, mep_slots.as_ref())?,
    };
    // shm keeps its inbox's name in /dev/shm for restarted peers to find,
    // and only `evb run` removes what a killed node leaves there: rejoin is
    // offered when it plans restarts (or asked for).
    let shm_restarts = opts.control == Control::Stdio
        && std::env::var(transport::shm::REJOIN_ENV).is_ok_and(|v| v == "1");
    let offer_rejoin = opts.rejoin || shm_restarts || kind != TransportKind::Shm;
    let rejoin_ok = offer_rejoin && transport.enable_rejoin(opts.rejoin);
    if opts.rejoin && !rejoin_ok {
        bail!(
            "transport `{}` cannot rejoin a run: only tcp, shm, ucx and ofi:tcp can",
            transport.name()
        );
    }
    let peers = match opts.control {
        _ if early_peers.is_some() => early_peers.expect("checked"),
        // MPI knows every rank already: nothing to exchange.
        Control::Launcher
            if TransportKind::parse(&config.transport.kind)? == TransportKind::Mpi =>
        {
            (0..layout.endpoints)
                .map(|r| transport::msg::to_hex(&i32::from(r).to_le_bytes()))
                .collect()
        }
        Control::Launcher => {
            let dir = opts
                .rendezvous
                .as_deref()
                .ok_or_else(|| anyhow!("--control launcher needs --rendezvous DIR"))?;
            let token = transport.local_token();
            let token = match outnet::split_token(&token) {
                // A TCP port: others need our address too (and with an
                // output network, after a comma, our address there).
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
            )?
        }
        control => rendezvous(&config, &layout, rank, control, transport.as_ref())?,
    };
    let commands = (opts.control == Control::Stdio).then(spawn_stdin_forwarder);
    let run_id = config.run.run_id;
    let metrics = match config.metrics.base_port {
        0 => None,
        base => Some(crate::metrics::serve(&config.metrics.bind, base + rank)?),
    };
    let mut rt = Runtime::new(config, layout, rank)?;
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
    if opts.rejoin && rank == rt.layout.em {
        // The EM died and this is its new incarnation: it learns from the
        // nodes how far the run got before it assigns again. Set before
        // the transport connects: their answers can arrive during setup.
        let wait = (3 * rt.peer_timeout).max(EM_RESYNC_WAIT_MIN);
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
        tracing::info!(
            "evb node {rank}: on the output network at {} ({} links there)",
            out.address,
            out.links.len()
        );
    }
    rt.run(transport.as_mut(), commands.as_ref())
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
    let kind = TransportKind::parse(&config.transport.kind)?;
    let plan = crate::buffers::BufferPlan::for_node(config, layout, rank, &kind);
    let t = Instant::now();
    let pool = SparePool::fixed(plan.rx_buffers, plan.rx_bytes);
    tracing::info!(
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
    let mut plan = crate::buffers::BufferPlan::for_node(config, layout, rank, kind);
    if plan.mep_buffers == 0 {
        return Ok(None);
    }
    let zero_copy = crate::buffers::zero_copy(config, kind);
    let prealloc = config.event_builder.preallocate_buffers;
    if !(zero_copy || prealloc || config.source.readout == Readout::Ring) {
        return Ok(None);
    }
    if let Some(n) = std::env::var("EVB_MEP_BUFFERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
    {
        // Tests: fewer MEP buffers than the bound, to make MEPs wait.
        plan.mep_buffers = n;
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
        tracing::info!(
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
    let progress = transport::Progress::from_config(config);
    match TransportKind::parse(&config.transport.kind)? {
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
            if TransportKind::parse(&config.transport.kind)? != TransportKind::Tcp {
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

/// A built batch's fragments, by source index, until it is delivered.
struct BatchSlots {
    slots: Vec<Option<Slot>>,
}

enum Slot {
    /// Received over the network into a pooled buffer.
    Received {
        data: Vec<u8>,
        start: usize,
        len: usize,
    },
    /// Handed over in memory from this node's RU.
    Local(Rc<MepBuf>),
    /// Read in place in its RU's shared memory (shm zero copy): released
    /// to the RU when the batch is done with it.
    Shared(SharedView),
}

/// The node's buffers and counters the receive path needs (split from the
/// transport so both can be borrowed at once).
struct Engine {
    node: Node,
    epoch: Instant,
    /// CLOCK_MONOTONIC at `epoch`, ns: lets `evb run` compare the clocks
    /// of its nodes (the slotted barrel's phase error).
    epoch_monotonic_ns: u64,
    sources: Option<SourceModel>,
    size_scratch: Vec<u32>,
    /// RU data of MEPs not yet released.
    /// The flag: its bytes are not written yet ([`Runtime::mep_data`]).
    meps: HashMap<MepId, (Rc<MepBuf>, FragmentHeader, bool)>,
    /// Spare heap buffers: fresh MEP data on demand, delivered batches.
    pool: SparePool,
    /// The RU's MEP buffers when they are a fixed set ([`mep_slots`]).
    slots: Option<SlotStore>,
    /// `source.readout`.
    readout: Readout,
    /// Ring readout: each slot's layout once it was filled, and whether
    /// its content must be written again (a fault damaged more than the
    /// event numbers).
    ring: Vec<Option<RingTemplate>>,
    ring_stale: Vec<bool>,
    /// MEPs that found no free MEP buffer and waited for one.
    mep_buffer_waits: u64,
    /// Which fragments' CRC-32C is checked (`event_builder.verify`).
    crc_policy: CrcPolicy,
    /// Spare receive buffers. Kept apart from `pool` so that they keep
    /// their length: growing a buffer again would clear it byte by byte.
    rx_pool: SparePool,
    /// Fixed pools: MEPs assigned to this RU waiting for a free MEP buffer
    /// (produced, in order, as buffers come back).
    waiting_for_buffer: std::collections::VecDeque<MepId>,
    batches: HashMap<MepId, BatchSlots>,
    rus: usize,
    sink: Option<std::fs::File>,
    /// When each endpoint was last heard from.
    last_rx: Vec<Instant>,
    /// BU: copies of delivered batches (and their headers), kept until a
    /// consumer confirms them, to deliver again if their consumer dies.
    deliveries: HashMap<MepId, (Rc<MepBuf>, FragmentHeader)>,
    /// FU: received batches, by (BU endpoint, MEP), until consumed.
    consuming: HashMap<(NodeId, MepId), Delivered>,
}

/// A batch delivered to this FU: the receive buffer and where the payload
/// is in it.
struct Delivered {
    buf: Vec<u8>,
    start: usize,
    len: usize,
    events: u32,
    /// CRC and fragment table verified: only an intact batch is stored.
    intact: bool,
}

/// Timeouts of silence a runnable peer on this host is given before it is
/// declared lost (see [`Transport::peer_runnable`]).
const STARVED_GRACE: u32 = 4;

/// `EVB_STATS_LINES=1`: a node under a launcher prints its periodic STATS
/// lines too (by default only FINAL: ranks share the launcher's stdout),
/// for when each rank's output is its own (`srun --output=evb-%t.out`).
pub const STATS_ENV: &str = "EVB_STATS_LINES";

/// How often spare buffers unused since the last look are freed.
const POOL_TRIM: Duration = Duration::from_secs(10);

/// Spare buffers, with the fewest spares there were since the last trim:
/// those were never needed, so [`SparePool::trim`] frees them.
///
/// Or, preallocated (`event_builder.preallocate_buffers`, [`SparePool::fixed`]):
/// a fixed set of buffers of one size, allocated and touched at start,
/// never trimmed; it keeps no more buffers than it was made with.
#[derive(Default)]
struct SparePool {
    spares: Vec<Vec<u8>>,
    low_water: usize,
    fixed: Option<Fixed>,
}

/// A preallocated pool's bound, and what went past it.
#[derive(Debug, Default, Clone, Copy)]
struct Fixed {
    buffers: usize,
    len: usize,
    /// Times a buffer was wanted and none was free.
    short: u64,
}

impl SparePool {
    /// Most spares kept, whatever the burst.
    const MAX: usize = 256;

    /// `buffers` buffers of `len` bytes, every page written now so that
    /// the memory is resident from the start.
    fn fixed(buffers: usize, len: usize) -> SparePool {
        let spares = (0..buffers)
            .map(|_| {
                let mut b = vec![0u8; len];
                // A large zeroed allocation is untouched mapped memory:
                // write one byte per page (volatile: the zeros are known).
                for i in (0..len).step_by(4096) {
                    // SAFETY: i < len, within the buffer.
                    unsafe { std::ptr::write_volatile(b.as_mut_ptr().add(i), 0) };
                }
                b
            })
            .collect();
        SparePool {
            spares,
            low_water: buffers,
            fixed: Some(Fixed {
                buffers,
                len,
                short: 0,
            }),
        }
    }

    fn take(&mut self) -> Option<Vec<u8>> {
        let b = self.spares.pop();
        self.low_water = self.low_water.min(self.spares.len());
        if b.is_none() {
            self.note_short();
        }
        b
    }

    fn give(&mut self, buf: Vec<u8>) {
        let keep = match &self.fixed {
            // Only the pool's own buffers, never more than it was made with.
            Some(f) => self.spares.len() < f.buffers && buf.capacity() >= f.len,
            None => self.spares.len() < Self::MAX,
        };
        if keep {
            self.spares.push(buf);
        }
    }

    /// A preallocated pool had no free buffer for a taker.
    fn note_short(&mut self) {
        if let Some(f) = &mut self.fixed {
            f.short += 1;
        }
    }

    /// Frees the spares unused since the last trim; returns how many.
    /// A preallocated pool keeps its buffers.
    fn trim(&mut self) -> usize {
        if self.fixed.is_some() {
            return 0;
        }
        let unused = self.low_water.min(self.spares.len());
        // The oldest spares go (taken last, they are the coldest).
        self.spares.drain(..unused);
        self.low_water = self.spares.len();
        unused
    }
}

impl Engine {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Ring readout: fills every buffer of the ring now (their layouts
    /// drawn, sizes and pattern written: some 20-50 ms for 14 buffers).
    fn fill_ring(&mut self) {
        let (Readout::Ring, Some(store), Some(source)) = (self.readout, &self.slots, &self.sources)
        else {
            return;
        };
        let mut all = Vec::new();
        while let Some(buf) = store.take(0) {
            all.push(buf);
        }
        let slots = store.store().slots() as usize;
        self.ring = vec![None; slots];
        self.ring_stale = vec![false; slots];
        for buf in &mut all {
            let (_, index) = buf.slot().expect("a store's buffers are slots");
            let t = source.ring_template(index);
            buf.set_len(t.payload_len as usize);
            source.ring_fill(&t, buf);
            self.ring[index as usize] = Some(t);
        }
    }

    /// A buffer for a MEP's fragment: a free slot of the fixed set (none
    /// free: `None`, the MEP waits), or a heap buffer (fresh data on
    /// demand).
    fn take_mep_buffer(&mut self) -> Option<MepBuf> {
        match &self.slots {
            Some(store) => store.take(0),
            None => Some(MepBuf::from_vec(self.pool.take().unwrap_or_default())),
        }
    }

    /// The last handle on a MEP buffer, or on a delivered batch: a heap
    /// buffer goes back to the spares (a store's slot goes back to its
    /// store by itself, when its last handle is dropped).
    fn give_back_shared(&mut self, data: Rc<MepBuf>) {
        if let Some(v) = Rc::try_unwrap(data).ok().and_then(MepBuf::into_vec) {
            self.pool.give(v);
        }
    }

    /// The CRC to hand the BU for a received fragment: the BU counts a
    /// fragment intact when it is the header's CRC. It is, when the
    /// fragment passed the checks of `event_builder.verify`: the header
    /// check always ([`evb_core::source::check_fragment`]), and the CRC-32C
    /// (`crc`, computed by the transport, or now) where the level wants it.
    /// Otherwise it is not.
    fn verdict(&self, header: &FragmentHeader, payload: &[u8], crc: Option<u32>) -> u32 {
        let mut intact = evb_core::source::check_fragment(header, payload);
        if intact && self.crc_policy.wanted(header) {
            intact = crc.unwrap_or_else(|| payload_crc(payload)) == header.crc32c;
        }
        if intact {
            header.crc32c
        } else {
            !header.crc32c
        }
    }

    fn give_back_rx(&mut self, buf: Vec<u8>) {
        self.rx_pool.give(buf);
    }

    /// Frees the spare buffers no one needed since the last call, and
    /// gives the memory back to the system: after a burst (a backlog, a
    /// slow consumer) the resident memory returns to the steady state.
    fn trim_pools(&mut self) {
        let freed = self.pool.trim() + self.rx_pool.trim();
        if freed > 0 {
            // SAFETY: glibc's malloc_trim only returns free heap pages.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    /// `EVB_MEMDEBUG`: where this process's memory is, on stderr.
    fn print_memory(&self, rank: NodeId) {
        // SAFETY: mallinfo2 only reads allocator statistics.
        let m = unsafe { libc::mallinfo2() };
        tracing::info!(
            "evb node {rank} memory: t {:.0} s rss {} KiB, heap {} KiB ({} KiB in use), \
             mmapped {} chunks {} KiB, spares {}+{}, meps {}, batches {}, deliveries {}, consuming {}, \
             buffer waits {} overflows {}",
            self.epoch.elapsed().as_secs_f64(),
            crate::report::resident_bytes() >> 10,
            m.arena >> 10,
            m.uordblks >> 10,
            m.hblks,
            m.hblkhd >> 10,
            self.pool.spares.len(),
            self.rx_pool.spares.len(),
            self.meps.len(),
            self.batches.len(),
            self.deliveries.len(),
            self.consuming.len(),
            self.mep_buffer_waits,
            self.rx_pool.fixed.map_or(0, |f| f.short),
        );
    }

    fn batch(&mut self, mep: MepId) -> &mut BatchSlots {
        let rus = self.rus;
        self.batches.entry(mep).or_insert_with(|| BatchSlots {
            slots: (0..rus).map(|_| None).collect(),
        })
    }
}

impl RxHandler for Engine {
    fn on_alive(&mut self, peer: NodeId) {
        if let Some(t) = self.last_rx.get_mut(peer as usize) {
            *t = Instant::now();
        }
    }

    fn on_control(&mut self, peer: NodeId, msg: Message) {
        let now = self.now();
        self.node.on_message(now, peer, msg);
    }

    fn admit(&mut self, peer: NodeId, header: &FragmentHeader) -> bool {
        let now = self.now();
        self.node.admit_fragment(now, peer, header) == Admit::Keep
    }

    fn wants_crc(&mut self, header: &FragmentHeader) -> bool {
        self.crc_policy.wanted(header)
    }

    fn on_shared_fragment(&mut self, _peer: NodeId, header: FragmentHeader, view: SharedView) {
        let now = self.now();
        let crc = self.verdict(&header, &view, None);
        let src = header.source as usize;
        if let Some(slot) = self.batch(header.mep).slots.get_mut(src) {
            *slot = Some(Slot::Shared(view));
        }
        self.node.on_fragment(now, &header, crc);
    }

    fn spare_buffer(&mut self, min_len: usize) -> Vec<u8> {
        match (self.rx_pool.take(), self.rx_pool.fixed) {
            (Some(b), _) if b.len() >= min_len => b,
            // A pool buffer whose length a transport shortened: its
            // capacity is touched already.
            (Some(mut b), Some(_)) if b.capacity() >= min_len => {
                b.resize(min_len, 0);
                b
            }
            (None, Some(f)) => {
                // Past the bound the protocol guarantees: not silent.
                if f.short == 1 {
                    tracing::warn!(
                        "evb node: no free receive buffer in the preallocated pool of {}: \
                         allocating past it (counted in rx_buffer_overflows)",
                        f.buffers
                    );
                }
                vec![0; min_len.max(f.len)]
            }
            // A new zeroed allocation: large ones come from the kernel as
            // untouched pages, so a generous size costs only what is used.
            _ => vec![0; min_len],
        }
    }

    fn on_fragment(
        &mut self,
        peer: NodeId,
        header: FragmentHeader,
        crc: Option<u32>,
        buf: Vec<u8>,
        offset: usize,
    ) {
        let now = self.now();
        let len = header.payload_len as usize;
        if header.flags & FLAG_BATCH != 0 {
            let payload = buf.get(offset..offset + len).unwrap_or(&[]);
            let crc = crc.unwrap_or_else(|| payload_crc(payload));
            let intact = crc == header.crc32c
                && payload.len() == len
                && evb_core::wire::check_batch_payload(payload).is_ok();
            let delivered = Delivered {
                buf,
                start: offset,
                len,
                events: header.event_count,
                intact,
            };
            self.consuming.insert((peer, header.mep), delivered);
            self.node.on_delivery(now, &header, intact);
            return;
        }
        let payload = buf.get(offset..offset + len).unwrap_or(&[]);
        let crc = self.verdict(&header, payload, crc);
        let src = header.source as usize;
        if let Some(slot) = self.batch(header.mep).slots.get_mut(src) {
            *slot = Some(Slot::Received {
                data: buf,
                start: offset,
                len,
            });
        }
        self.node.on_fragment(now, &header, crc);
    }
}

struct Runtime {
    engine: Engine,
    layout: Layout,
    rank: NodeId,
    config: Config,
    /// The endpoints this one has a link to.
    linked: Vec<NodeId>,
    /// Peers that said they finished: no longer expected to speak.
    peers_finished: Vec<bool>,
    /// Peers declared lost, with when and why.
    lost: Vec<crate::report::PeerLoss>,
    /// Lost peers that came back, with when (a peer is down while it has
    /// more losses than rejoins).
    rejoins: Vec<crate::report::PeerRejoin>,
    /// This process is a restarted node joining a run already going.
    restarted: bool,
    /// A restarted EM's resync was logged.
    em_resync_logged: bool,
    /// A peer silent this long is lost.
    peer_timeout: Duration,
    /// This node told its peers it has finished.
    finished: bool,
    events: Vec<LinkEvent>,
    /// Where the final report is also written (launcher mode).
    report_file: Option<PathBuf>,
    /// Launcher mode: print STATS lines all the same ([`STATS_ENV`]).
    stats_under_launcher: bool,
    /// Where STATS and FINAL lines go (stdout, from a thread of its own).
    report_lines: ReportLines,
    /// What `/metrics` serves, when metrics are on.
    metrics: Option<crate::metrics::Metrics>,
    /// process_actions stopped at its budget with actions maybe left.
    actions_left: bool,
    /// `output.sink = "store"`: this node's event-store writer (a BU's, or
    /// with consumers an FU's).
    store: Option<evb_store::StoreWriter>,
    /// What the store wrote, once it is closed.
    store_closed: Option<evb_store::StoreStats>,
    /// The output network's addresses, for the final report.
    output_network: Option<crate::report::OutputNetworkReport>,
}

impl Runtime {
    fn new(config: Config, layout: Layout, rank: NodeId) -> Result<Runtime> {
        let peer_timeout = Duration::from_millis(config.transport.peer_timeout_ms);
        let node = Node::new(&config, &layout, rank);
        let sources = layout.ru_of[rank as usize].map(|s| SourceModel::new(&config, s));
        let sink = match config.output.sink {
            SinkKind::File if layout.bu_of[rank as usize].is_some() => {
                let dir = PathBuf::from(&config.output.directory);
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("output.directory {}", dir.display()))?;
                let path = dir.join(format!("run{}-node{rank}.evb", config.run.run_id));
                Some(
                    std::fs::File::create(&path)
                        .with_context(|| format!("creating {}", path.display()))?,
                )
            }
            _ => None,
        };
        // With consumers the FUs store what they accept, else the BUs
        // store every built batch.
        let stores = if config.output.consumers > 0 {
            layout.fu_of[rank as usize].is_some()
        } else {
            layout.bu_of[rank as usize].is_some()
        };
        let store = match config.output.sink {
            SinkKind::Store if stores => {
                let spec = if config.output.store.is_empty() {
                    &config.output.directory
                } else {
                    &config.output.store
                };
                let target = evb_store::StoreTarget::parse(spec)
                    .with_context(|| format!("output.store `{spec}`"))?;
                Some(
                    evb_store::StoreWriter::open(&target, config.run.run_id, rank)
                        .with_context(|| format!("opening the event store `{spec}`"))?,
                )
            }
            _ => None,
        };
        Ok(Runtime {
            engine: Engine {
                node,
                epoch: Instant::now(),
                epoch_monotonic_ns: 0,
                sources,
                size_scratch: Vec::new(),
                meps: HashMap::new(),
                pool: SparePool::default(),
                slots: None,
                readout: config.source.readout,
                ring: Vec::new(),
                ring_stale: Vec::new(),
                mep_buffer_waits: 0,
                crc_policy: CrcPolicy::from_config(&config),
                rx_pool: SparePool::default(),
                waiting_for_buffer: std::collections::VecDeque::new(),
                batches: HashMap::new(),
                rus: layout.rus(),
                sink,
                last_rx: vec![Instant::now(); layout.endpoints as usize],
                deliveries: HashMap::new(),
                consuming: HashMap::new(),
            },
            linked: transport::linked_peers(&config, &layout, rank),
            peers_finished: vec![false; layout.endpoints as usize],
            layout,
            rank,
            config,
            lost: Vec::new(),
            rejoins: Vec::new(),
            restarted: false,
            em_resync_logged: false,
            peer_timeout,
            finished: false,
            events: Vec::new(),
            report_file: None,
            stats_under_launcher: std::env::var(STATS_ENV).is_ok_and(|v| v == "1"),
            report_lines: ReportLines::start(),
            metrics: None,
            actions_left: false,
            store,
            store_closed: None,
            output_network: None,
        })
    }

    fn run(
        &mut self,
        transport: &mut dyn Transport,
        commands: Option<&mpsc::Receiver<Command>>,
    ) -> Result<()> {
        self.engine.epoch = Instant::now();
        self.engine.epoch_monotonic_ns = monotonic_ns();
        // Silence is counted from the start of the run, not the setup.
        self.engine.last_rx.fill(Instant::now());
        if self.restarted {
            // The peers that did not connect are down for this incarnation
            // (dead, or slow to re-dial us): they may join later.
            let missing: Vec<NodeId> = self
                .linked
                .iter()
                .copied()
                .filter(|&p| p != self.rank && !transport.has_link(p))
                .collect();
            for p in missing {
                self.declare_lost(transport, p, "not connected when this node rejoined".into());
            }
        }
        let now = self.engine.now();
        self.engine.node.start(now);
        self.process_actions(transport)?;
        let mut next_stats = Instant::now() + STATS_INTERVAL;
        let mut next_heartbeat = Instant::now() + HEARTBEAT;
        let mut next_trim = Instant::now() + POOL_TRIM;
        let duration = self.config.run.duration_s;
        let stop_at = (self.rank == self.layout.em && duration > 0.0)
            .then(|| self.engine.epoch + Duration::from_secs_f64(duration));
        let mut stopped = false;
        let drain = Duration::from_millis(self.config.event_builder.drain_timeout_ms);
        let em_lost_wait = Duration::from_millis(self.config.event_builder.em_lost_wait_ms);
        let mut drain_deadline: Option<Instant> = None;
        let mut drain_timed_out = false;
        let mut done_at: Option<Instant> = None;
        loop {
            // Time-driven inputs first.
            let now_i = Instant::now();
            if !stopped && stop_at.is_some_and(|t| now_i >= t) {
                stopped = true;
                let now = self.engine.now();
                self.engine.node.stop(now);
            }
            // Without the EM nothing more will be assigned: drain.
            let em_lost = self.is_lost(self.layout.em);
            if drain_deadline.is_none() {
                if self.engine.node.end_of_run().is_some() {
                    drain_deadline = Some(now_i + drain);
                } else if em_lost {
                    drain_deadline = Some(now_i + em_lost_wait);
                }
            }
            if !em_lost && self.engine.node.end_of_run().is_none() && !drain_timed_out {
                // The EM came back (rejoin) before the drain was over.
                drain_deadline = None;
            }
            if now_i >= next_heartbeat {
                next_heartbeat = now_i + HEARTBEAT;
                self.heartbeat_and_check(transport, now_i);
            }
            if now_i >= next_trim {
                next_trim = now_i + POOL_TRIM;
                self.engine.trim_pools();
                if std::env::var_os("EVB_MEMDEBUG").is_some() {
                    self.engine.print_memory(self.rank);
                }
            }
            if let Some(dl) = drain_deadline {
                if now_i >= dl && !self.engine.node.is_done() {
                    if self.engine.node.end_of_run().is_none() {
                        tracing::warn!(
                            "evb node {}: the EM did not come back within event_builder.em_lost_wait_ms ({} ms): ending the run",
                            self.rank,
                            em_lost_wait.as_millis()
                        );
                    }
                    tracing::warn!(
                        "evb node {}: drain timed out: {}",
                        self.rank,
                        self.engine.node.pending_work()
                    );
                    drain_timed_out = true;
                    let now = self.engine.now();
                    self.engine.node.abandon(now);
                }
            }
            let now = self.engine.now();
            if self.engine.node.next_deadline().is_some_and(|d| d <= now) {
                self.engine.node.on_timeout(now);
            }
            self.process_actions(transport)?;
            transport.flush(&mut self.events);
            self.handle_link_events(transport)?;
            if now_i >= next_stats {
                self.print_report(false, drain_timed_out);
                next_stats = now_i + STATS_INTERVAL;
            }
            if self.engine.node.is_done() && done_at.is_none() && !transport.has_pending_tx(None) {
                done_at = Some(Instant::now());
                self.finished = true;
                transport.finish();
            }
            if let Some(t) = done_at {
                if transport.all_finished() || t.elapsed() > LINGER {
                    break;
                }
            }
            // Wait until the next thing that can happen.
            let mut wake = next_stats.min(next_heartbeat);
            if let Some(t) = stop_at.filter(|_| !stopped) {
                wake = wake.min(t);
            }
            if let Some(dl) = drain_deadline.filter(|_| !self.engine.node.is_done()) {
                wake = wake.min(dl);
            }
            if let Some(d) = self.engine.node.next_deadline() {
                wake = wake.min(self.engine.epoch + Duration::from_nanos(d));
            }
            if let Some(t) = done_at {
                wake = wake.min(t + LINGER);
            }
            let mut timeout = if self.actions_left {
                Duration::ZERO
            } else {
                wake.saturating_duration_since(Instant::now()).min(MAX_WAIT)
            };
            if self.config.output.consumer_wait == BusyWait::Spin
                && self.engine.node.fu().is_some_and(|f| f.is_busy())
            {
                // A consumer at work burns its core, as a real filter does.
                timeout = Duration::ZERO;
            }
            transport.poll(timeout, &mut self.engine, &mut self.events)?;
            self.handle_link_events(transport)?;
            // Commands every turn.
            if let Some(rx) = commands {
                while let Ok(cmd) = rx.try_recv() {
                    // STOP, or our parent is gone: drain.
                    if matches!(cmd, Command::Stop | Command::Eof) && !stopped {
                        stopped = true;
                        let now = self.engine.now();
                        self.engine.node.stop(now);
                    }
                }
            }
        }
        if let Some(store) = self.store.take() {
            // Everything queued is written before the final report.
            let stats = store.close().context("closing the event store")?;
            tracing::info!("evb node {}: event store: {stats:?}", self.rank);
            self.store_closed = Some(stats);
        }
        self.output_network = transport.output_network();
        self.print_report(true, drain_timed_out);
        let dropped = self.report_lines.finish();
        if dropped > 0 {
            tracing::warn!(
                "evb node {}: {dropped} STATS lines dropped: stdout was not read fast enough",
                self.rank
            );
        }
        Ok(())
    }

    /// Completed sends go to the node; closed links are judged orderly
    /// (the peer finished with the run) or a loss.
    fn handle_link_events(&mut self, transport: &mut dyn Transport) -> Result<()> {
        while !self.events.is_empty() {
            let events = std::mem::take(&mut self.events);
            for event in events {
                match event {
                    LinkEvent::SendDone(mep) => {
                        // The same MEP can be both the RU's fragment and a
                        // delivered batch: the RU's transfer is told first.
                        let ru_sending = self.engine.node.ru().is_some_and(|r| r.is_sending(mep));
                        if !ru_sending && self.engine.deliveries.contains_key(&mep) {
                            // A delivery: its copy stays until confirmed.
                            continue;
                        }
                        let now = self.engine.now();
                        self.engine.node.on_send_complete(now, mep);
                    }
                    LinkEvent::Closed { peer, error } => self.link_closed(transport, peer, error),
                    LinkEvent::Joined { peer } => self.peer_joined(peer),
                    LinkEvent::Finished { peer } => {
                        if let Some(f) = self.peers_finished.get_mut(peer as usize) {
                            *f = true;
                        }
                    }
                }
            }
            self.process_actions(transport)?;
            transport.flush(&mut self.events);
        }
        Ok(())
    }

    fn link_closed(&mut self, transport: &mut dyn Transport, peer: NodeId, error: Option<String>) {
        if let Some(e) = &error {
            tracing::warn!(
                "evb node {}: link to endpoint {peer} failed: {e}",
                self.rank
            );
        }
        let end = self.engine.node.end_of_run().is_some();
        // A clean close after the end of the run, or after the peer said it
        // finished (its goodbye can overtake the EM's EndOfRun), is how
        // peers finish.
        let said_goodbye = self.peers_finished.get(peer as usize) == Some(&true);
        let orderly = self.engine.node.is_done()
            || self.finished
            || (error.is_none() && (end || said_goodbye));
        if !orderly && peer != self.rank && !self.is_lost(peer) {
            let reason = error.unwrap_or_else(|| "connection closed".into());
            self.declare_lost(transport, peer, reason);
        }
    }

    /// A restarted EM says when it resumed, and whom it still waits for.
    fn log_em_resync(&mut self) {
        let Some(em) = self.engine.node.em() else {
            return;
        };
        match (em.stats.resumed_at, self.em_resync_logged) {
            (Some(mep), false) => {
                self.em_resync_logged = true;
                tracing::info!(
                    "evb node {}: EM resumed the run at MEP {mep} (by {:.1} s after its restart)",
                    self.rank,
                    self.engine.epoch.elapsed().as_secs_f64()
                );
            }
            (None, false) if em.is_resyncing() && self.engine.epoch.elapsed() > RESYNC_SLOW => {
                self.em_resync_logged = true;
                tracing::warn!(
                    "evb node {}: restarted EM still waits for endpoints {:?} to say how far the run got",
                    self.rank,
                    em.resync_waiting()
                );
            }
            _ => {}
        }
    }

    /// `peer` is down: lost more often than it rejoined.
    fn is_lost(&self, peer: NodeId) -> bool {
        let lost = self.lost.iter().filter(|l| l.peer == peer).count();
        lost > self.rejoins.iter().filter(|r| r.peer == peer).count()
    }

    /// A lost peer is connected again: a new incarnation, or the same
    /// process after a network fault. The node serves it again (and the EM
    /// re-admits it).
    fn peer_joined(&mut self, peer: NodeId) {
        if self.engine.node.is_done() || self.finished || !self.is_lost(peer) {
            return;
        }
        tracing::info!("evb node {}: endpoint {peer} rejoined", self.rank);
        self.rejoins.push(crate::report::PeerRejoin::now(peer));
        if let Some(t) = self.engine.last_rx.get_mut(peer as usize) {
            *t = Instant::now();
        }
        let now = self.engine.now();
        self.engine.node.on_peer_joined(now, peer);
    }

    fn declare_lost(&mut self, transport: &mut dyn Transport, peer: NodeId, reason: String) {
        tracing::warn!("evb node {}: endpoint {peer} lost: {reason}", self.rank);
        self.lost.push(crate::report::PeerLoss::now(peer, reason));
        transport.drop_peer(peer, &mut self.events);
        let now = self.engine.now();
        self.engine.node.on_peer_lost(now, peer);
    }

    /// Keeps every link alive with a heartbeat and declares lost a peer
    /// that has been silent for `transport.peer_timeout_ms`.
    fn heartbeat_and_check(&mut self, transport: &mut dyn Transport, now: Instant) {
        if self.engine.node.is_done() || self.finished {
            return;
        }
        self.log_em_resync();
        let mut silent = Vec::new();
        for &p in &self.linked {
            if p == self.rank || self.is_lost(p) || self.peers_finished[p as usize] {
                continue;
            }
            // Judge before queueing our heartbeat: our own write must not
            // count as the peer taking data.
            let quiet = now.duration_since(self.engine.last_rx[p as usize]);
            if transport.peer_active(p) {
                self.engine.last_rx[p as usize] = now;
            } else if quiet > self.peer_timeout {
                // A peer on this host that waits for a CPU is starved, not
                // hung: it gets a few more timeouts (a stopped or dead one
                // none; a death is seen at once through its pidfd anyway).
                let starved =
                    quiet <= self.peer_timeout * STARVED_GRACE && transport.peer_runnable(p);
                if !starved {
                    silent.push(p);
                }
            }
            if !transport.has_pending_tx(Some(p)) {
                transport.send_control(p, &Message::Heartbeat);
            }
        }
        for p in silent {
            let ms = self.peer_timeout.as_millis();
            self.declare_lost(transport, p, format!("silent for more than {ms} ms"));
        }
    }

    /// Carries out what the node asked for.
    fn process_actions(&mut self, transport: &mut dyn Transport) -> Result<()> {
        // Bounded: a node that builds alone (its peers lost, every fragment
        // local) would otherwise never leave this loop for its timers.
        let mut budget = ACTION_BUDGET;
        self.actions_left = false;
        loop {
            // Buffers given back by the last action go to waiting MEPs first.
            self.resume_waiting_production();
            let Some(action) = (budget > 0)
                .then(|| self.engine.node.poll_action())
                .flatten()
            else {
                break;
            };
            budget -= 1;
            if budget == 0 {
                // Maybe more: the loop comes back without waiting.
                self.actions_left = true;
            }
            match action {
                Action::Send { to, msg } => {
                    // A peer that is gone gets nothing; the protocol copes
                    // (timeouts, accounting).
                    transport.send_control(to, &msg);
                }
                Action::Produce { mep } => {
                    let e = &mut self.engine;
                    let buf = if e.waiting_for_buffer.is_empty() {
                        e.take_mep_buffer()
                    } else {
                        None
                    };
                    match buf {
                        Some(buf) => self.produce(mep, buf),
                        // A fixed set of MEP buffers with none free: the
                        // MEP waits for one, in order (counted).
                        None => {
                            e.mep_buffer_waits += 1;
                            e.waiting_for_buffer.push_back(mep);
                        }
                    }
                }
                Action::SendFragment { header, .. } | Action::HandOver { header }
                    if self.dropped(&header) =>
                {
                    let now = self.engine.now();
                    self.engine.node.on_send_complete(now, header.mep);
                }
                Action::SendFragment { to, header } => {
                    let queued = self
                        .mep_data(header.mep)
                        .is_some_and(|(d, h)| transport.send_fragment(to, &h, d));
                    if !queued {
                        // No route: complete it so the RU releases it; the BU
                        // side will count the batch incomplete.
                        let now = self.engine.now();
                        self.engine.node.on_send_complete(now, header.mep);
                    }
                }
                Action::HandOver { header } => {
                    let data = self.mep_data(header.mep);
                    let e = &mut self.engine;
                    let now = e.now();
                    if let Some((data, header)) = data {
                        if e.node.admit_fragment(now, self.rank, &header) == Admit::Keep {
                            let crc = e.verdict(&header, &data, None);
                            let src = header.source as usize;
                            e.batch(header.mep).slots[src] = Some(Slot::Local(data));
                            e.node.on_fragment(now, &header, crc);
                        }
                    }
                    e.node.on_send_complete(now, header.mep);
                }
                Action::Release { mep } => {
                    if let Some((data, _, _)) = self.engine.meps.remove(&mep) {
                        self.engine.give_back_shared(data);
                    } else {
                        // Released before a buffer was free for it.
                        self.engine.waiting_for_buffer.retain(|&m| m != mep);
                    }
                }
                Action::Deliver {
                    to,
                    mep,
                    events,
                    partial,
                    ..
                } => self.deliver(transport, to, mep, events, partial),
                Action::Confirmed { mep } => {
                    if let Some((rc, _)) = self.engine.deliveries.remove(&mep) {
                        // Still in the transport's hands: freed when sent.
                        self.engine.give_back_shared(rc);
                    }
                }
                Action::Consumed { mep, bu } => {
                    if let Some(d) = self.engine.consuming.remove(&(bu, mep)) {
                        let passes = self.config.output.consumer_work_passes;
                        if passes > 0 {
                            let started = Instant::now();
                            trigger_work(&d.buf[d.start..d.start + d.len], passes);
                            let ns = started.elapsed().as_nanos() as u64;
                            if let Some(fu) = self.engine.node.fu_mut() {
                                fu.record_work(ns);
                            }
                        }
                        if let (Some(store), Some(fu)) =
                            (self.store.as_mut(), self.engine.node.fu())
                        {
                            store_accepted(store, fu, mep, &d)?;
                        }
                        self.engine.give_back_rx(d.buf);
                    }
                }
                Action::Finish {
                    mep,
                    outcome,
                    partial,
                    ..
                } => {
                    let batch = self.engine.batches.remove(&mep);
                    // `partial`: what arrived of an incomplete batch goes
                    // to the sink too, flagged (`output.deliver_partial`).
                    if outcome == Outcome::Built || partial {
                        if let (Some(file), Some(b)) = (self.engine.sink.as_mut(), batch.as_ref()) {
                            write_batch(file, mep, b, partial)
                                .context("writing to the output file")?;
                        }
                        if let (Some(store), Some(b)) = (self.store.as_mut(), batch.as_ref()) {
                            store_batch(store, mep, self.config.source.events_per_mep, b)?;
                        }
                    }
                    if let Some(b) = batch {
                        for slot in b.slots.into_iter().flatten() {
                            match slot {
                                Slot::Received { data, .. } => self.engine.give_back_rx(data),
                                Slot::Local(rc) => self.engine.give_back_shared(rc),
                                // Released to its RU.
                                Slot::Shared(view) => drop(view),
                            }
                        }
                    }
                }
                Action::Done => {}
            }
        }
        Ok(())
    }

    /// RU: takes `buf` (a MEP buffer) for `mep` and tells the node the MEP
    /// is ready. The bytes are written later, just before the fragment
    /// leaves ([`Runtime::mep_data`]), so that they are still in this
    /// core's cache when the transport or the receiver reads them. A ring
    /// buffer used for the first time is filled now, once for the run.
    fn produce(&mut self, mep: MepId, mut buf: MepBuf) {
        let e = &mut self.engine;
        let source = e.sources.as_ref().expect("only an RU is asked to produce");
        let header = match e.readout {
            Readout::Fresh => {
                let header = source.describe(mep, &mut e.size_scratch);
                buf.set_len(header.payload_len as usize);
                header
            }
            Readout::Ring => {
                let (_, index) = buf.slot().expect("the ring readout's buffers are slots");
                let i = index as usize;
                if e.ring.len() <= i {
                    e.ring.resize(i + 1, None);
                    e.ring_stale.resize(i + 1, false);
                }
                let first_use = e.ring[i].is_none();
                let t = e.ring[i].get_or_insert_with(|| source.ring_template(index));
                buf.set_len(t.payload_len as usize);
                if first_use || std::mem::take(&mut e.ring_stale[i]) {
                    source.ring_fill(t, &mut buf);
                }
                source.ring_describe(mep, t)
            }
        };
        e.meps.insert(mep, (Rc::new(buf), header, true));
        let now = e.now();
        e.node.on_mep_ready(now, header);
    }

    /// `faults.corrupt_meps`: damages the fragment after its CRC was
    /// taken: the first byte of its event data (the first event's number,
    /// which every verification level checks), or with no event data a
    /// byte of its size table (a ring buffer is then written again before
    /// its next use).
    fn corrupt_on_purpose(&mut self, mep: MepId) {
        let faults = &self.config.faults;
        let e = &mut self.engine;
        let Some((data, header, _)) = e.meps.get_mut(&mep) else {
            return;
        };
        if faults.source != header.source || !faults.corrupt_meps.contains(&mep) {
            return;
        }
        let table = 4 * header.event_count as usize;
        let at = if (header.payload_len as usize) > table {
            table
        } else {
            0
        };
        let Some(buf) = Rc::get_mut(data) else {
            return;
        };
        if let Some(b) = buf.get_mut(at) {
            *b ^= 0x5a;
        }
        if let (Readout::Ring, Some((_, index))) = (e.readout, buf.slot()) {
            if at < table {
                e.ring_stale[index as usize] = true;
            }
        }
    }

    /// The data of `mep` and its header (with the CRC if it is checked),
    /// written now if it was not yet: the whole fragment (fresh readout)
    /// or its event numbers (ring). `None`: the MEP was released.
    fn mep_data(&mut self, mep: MepId) -> Option<(Rc<MepBuf>, FragmentHeader)> {
        let e = &mut self.engine;
        let (data, header, unwritten) = e.meps.get_mut(&mep)?;
        if *unwritten {
            let source = e.sources.as_ref().expect("an RU holds MEPs");
            let buf = Rc::get_mut(data).expect("an unwritten MEP was never sent");
            let crc = e.crc_policy.wanted(header);
            *header = match e.readout {
                Readout::Fresh => source.produce_into(mep, buf, &mut e.size_scratch, crc),
                Readout::Ring => {
                    let (_, index) = buf.slot().expect("ring buffers are slots");
                    let t = e.ring[index as usize].as_ref().expect("filled at produce");
                    source.ring_stamp(mep, buf, t, crc)
                }
            };
            *unwritten = false;
            self.corrupt_on_purpose(mep);
        }
        self.engine.meps.get(&mep).map(|(d, h, _)| (d.clone(), *h))
    }

    /// MEPs that waited for a buffer are produced, in order, as buffers
    /// come back.
    fn resume_waiting_production(&mut self) {
        while !self.engine.waiting_for_buffer.is_empty() {
            let Some(buf) = self.engine.take_mep_buffer() else {
                return;
            };
            let mep = self.engine.waiting_for_buffer.pop_front().expect("checked");
            self.produce(mep, buf);
        }
    }

    /// Sends built batch `mep` to the FU on endpoint `to`: the fragment
    /// table and the fragments, copied into one buffer (the transport takes
    /// one payload buffer per message), with its CRC-32C.
    fn deliver(
        &mut self,
        transport: &mut dyn Transport,
        to: NodeId,
        mep: MepId,
        events: u64,
        partial: bool,
    ) {
        let e = &mut self.engine;
        if let Some((data, header)) = e.deliveries.get(&mep) {
            // Again: its first consumer was lost before confirming it.
            transport.send_fragment(to, header, data.clone());
            return;
        }
        let Some(b) = e.batches.get(&mep) else {
            return;
        };
        let parts: Vec<&[u8]> = b.slots.iter().map(slot_bytes).collect();
        let mut buf = e.pool.take().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(&(parts.len() as u32).to_le_bytes());
        for p in &parts {
            buf.extend_from_slice(&(p.len() as u32).to_le_bytes());
        }
        for p in &parts {
            buf.extend_from_slice(p);
        }
        let header = FragmentHeader {
            run_id: self.config.run.run_id,
            source: self.layout.bu_of[self.rank as usize].expect("a BU delivers"),
            flags: FLAG_BATCH | if partial { FLAG_PARTIAL } else { 0 },
            mep,
            event_count: events as u32,
            payload_len: buf.len() as u32,
            crc32c: payload_crc(&buf),
        };
        let data = Rc::new(MepBuf::from_vec(buf));
        // Kept until confirmed, sent or not: a send refused because `to`
        // is gone is followed by its loss, and the batch goes to another.
        transport.send_fragment(to, &header, data.clone());
        e.deliveries.insert(mep, (data, header));
    }

    /// Fault injection: this fragment is never sent.
    fn dropped(&self, h: &FragmentHeader) -> bool {
        let f = &self.config.faults;
        f.source == h.source && f.drop_meps.contains(&h.mep)
    }

    /// `full`: the FINAL report (else a STATS one).
    fn print_report(&self, full: bool, drain_timed_out: bool) {
        let stats = self.engine.node.stats();
        let elapsed = self.engine.epoch.elapsed().as_secs_f64();
        // Metrics want the latency histogram every time.
        let mut r = NodeReport::from_stats(
            self.rank,
            self.layout.role(self.rank),
            elapsed,
            &stats,
            full || self.metrics.is_some(),
        );
        r.peers_lost = self.lost.clone();
        r.rejoins = self.rejoins.clone();
        r.restarted = self.restarted;
        if let Some(fu) = self.engine.node.fu() {
            r.busy_s = fu.busy_time(self.engine.now()) as f64 * 1e-9;
        }
        r.rss_bytes = crate::report::resident_bytes();
        (r.cpu_user_s, r.cpu_system_s) = crate::report::cpu_times();
        if r.bytes_built > 0 {
            let gb = r.bytes_built as f64 / 1e9;
            r.cpu_user_s_per_gb = r.cpu_user_s / gb;
            r.cpu_system_s_per_gb = r.cpu_system_s / gb;
        }
        if let Some(st) = self
            .store_closed
            .clone()
            .or_else(|| self.store.as_ref().map(|w| w.stats()))
        {
            r.store_objects = st.objects;
            r.store_events = st.events;
            r.store_bytes = st.bytes;
        }
        if let Some(f) = self.engine.rx_pool.fixed {
            r.buffers_preallocated_bytes += (f.buffers * f.len) as u64;
            r.rx_buffer_overflows = f.short;
        }
        if let (Some(store), true) = (
            &self.engine.slots,
            self.config.event_builder.preallocate_buffers,
        ) {
            let s = store.store();
            r.buffers_preallocated_bytes += u64::from(s.slots()) * s.slot_bytes() as u64;
        }
        r.mep_buffer_waits = self.engine.mep_buffer_waits;
        if let Some(em) = &stats.em {
            r.em_meps_built = em.meps_built;
            r.em_meps_incomplete = em.meps_incomplete;
            r.em_meps_corrupt = em.meps_corrupt;
            r.em_meps_lost_bu_gone = em.meps_lost_bu_gone;
            r.em_meps_reassigned = em.meps_reassigned;
            r.em_resumed_at = em.resumed_at;
        }
        r.drain_timed_out = drain_timed_out;
        if full {
            r.output_network = self.output_network.clone();
        }
        let slotted = self.config.event_builder.schedule == evb_core::config::Schedule::Slotted;
        let is_em = self.layout.em == self.rank;
        if slotted && (is_em || stats.clock.is_some()) {
            let c = stats.clock.unwrap_or_default();
            r.clock = Some(crate::report::ClockReport {
                host: hostname(),
                epoch_monotonic_ns: self.engine.epoch_monotonic_ns,
                offset_ns: c.offset_ns,
                uncertainty_ns: c.uncertainty_ns,
                probes: c.probes,
                replies: c.replies,
                max_step_ns: c.max_step_ns,
                em: is_em,
            });
        }
        if let Some(m) = &self.metrics {
            let (bu_output, consumer) =
                crate::metrics::output_gauges(&self.engine.node, &self.layout);
            let gauges = crate::metrics::Gauges {
                bu_output,
                consumer,
                ru_meps_held: self.engine.meps.len(),
                bu_open_batches: self.engine.batches.len(),
                peers_up: self
                    .linked
                    .iter()
                    .filter(|&&p| p != self.rank && !self.is_lost(p))
                    .count(),
            };
            m.update(&r, &gauges);
        }
        if !full {
            // STATS lines stay small: the histogram only in FINAL.
            r.latency_buckets.clear();
            r.incidents.clear();
        }
        if let (Some(path), true) = (&self.report_file, full) {
            let line = serde_json::to_string(&r).expect("report serialises");
            let written = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| std::fs::write(path, &line));
            if let Err(e) = written {
                tracing::error!("evb node {}: writing {}: {e}", self.rank, path.display());
            }
        }
        if self.report_file.is_some() && !full && !self.stats_under_launcher {
            return; // No STATS lines on a launcher's shared stdout.
        }
        if full {
            self.report_lines
                .write(ToLauncher::Final(Box::new(r)).encode());
        } else {
            self.report_lines
                .offer(ToLauncher::Stats(Box::new(r)).encode());
        }
    }
}

/// STATS and FINAL lines, written to stdout by a thread of their own. A
/// node whose stdout is not read (a stalled log collector, a launcher's
/// full pipe) would otherwise block on its next STATS line, stop building
/// and answering, and be taken for lost by its peers: STATS lines that
/// find the queue full are dropped (and counted) instead. The FINAL line
/// is always written: [`ReportLines::finish`] waits for it.
struct ReportLines {
    tx: Option<std::sync::mpsc::SyncSender<String>>,
    writer: Option<std::thread::JoinHandle<()>>,
    dropped: std::cell::Cell<u64>,
}

impl ReportLines {
    /// Lines that may wait for stdout; STATS lines past them are dropped.
    const QUEUE: usize = 4;

    fn start() -> ReportLines {
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(Self::QUEUE);
        let writer = std::thread::Builder::new()
            .name("evb-report-lines".into())
            .spawn(move || {
                for line in rx {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(line.as_bytes());
                    let _ = out.flush();
                }
            })
            .ok();
        ReportLines {
            tx: Some(tx),
            writer,
            dropped: std::cell::Cell::new(0),
        }
    }

    /// A STATS line: queued, or dropped if the queue is full.
    fn offer(&self, line: String) {
        match &self.tx {
            Some(tx) if self.writer.is_some() => {
                if tx.try_send(line).is_err() {
                    self.dropped.set(self.dropped.get() + 1);
                }
            }
            _ => Self::write_now(&line),
        }
    }

    /// A line that must be written (FINAL): waits for room in the queue.
    fn write(&self, line: String) {
        match &self.tx {
            Some(tx) if self.writer.is_some() => {
                if let Err(e) = tx.send(line) {
                    Self::write_now(&e.0);
                }
            }
            _ => Self::write_now(&line),
        }
    }

    fn write_now(line: &str) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }

    /// Waits until every queued line is written; returns the STATS lines
    /// dropped.
    fn finish(&mut self) -> u64 {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        self.dropped.get()
    }
}

/// Hands a built batch to the event store. The writer works in the
/// background with a bounded queue; when it is full this waits for it
/// (the BU's credits then stay in use: backpressure reaches the EM).
fn store_batch(
    store: &mut evb_store::StoreWriter,
    mep: MepId,
    events_per_mep: u32,
    b: &BatchSlots,
) -> Result<()> {
    let (sources, parts): (Vec<u32>, Vec<&[u8]>) = b
        .slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Some(Slot::Received { data, start, len }) => {
                Some((i as u32, &data[*start..*start + *len]))
            }
            Some(Slot::Local(rc)) => Some((i as u32, &rc[..])),
            Some(Slot::Shared(view)) => Some((i as u32, &view[..])),
            // A source that is down is absent from the object, which
            // records the sources it holds.
            None => None,
        })
        .unzip();
    let run_sources = b.slots.len() as u32;
    loop {
        match store.write_batch_sources(mep, events_per_mep, run_sources, &sources, &parts) {
            Ok(()) => return Ok(()),
            Err(evb_store::StoreError::Backpressure { .. }) => {
                store.flush().context("the event store")?;
            }
            Err(e) => return Err(anyhow!("the event store: {e}")),
        }
    }
}

/// A consumer's real processing cost: `passes` CRC-32C passes over every
/// byte of the batch, as a trigger reading its data would make. Runs on the
/// event loop, so the consumer takes nothing else (and returns no credit)
/// meanwhile.
fn trigger_work(payload: &[u8], passes: u32) -> u32 {
    let mut crc = 0;
    for _ in 0..passes {
        crc = evb_core::checksum::crc32c_append(crc, std::hint::black_box(payload));
    }
    std::hint::black_box(crc)
}

/// A Filter Unit stores the events of a consumed batch its trigger
/// accepted (an object only if it accepted any), waiting for the writer
/// when its queue is full: the FU stays busy, so its credits, and through
/// them the BUs and the EM, wait too.
fn store_accepted(
    store: &mut evb_store::StoreWriter,
    fu: &evb_core::fu::FilterUnit,
    mep: MepId,
    d: &Delivered,
) -> Result<()> {
    if !d.intact {
        return Ok(());
    }
    let mut accepted = Vec::new();
    fu.accepted_events(mep, d.events, &mut accepted);
    if accepted.is_empty() {
        return Ok(());
    }
    let all = evb_core::wire::batch_fragments(&d.buf[d.start..d.start + d.len])
        .map_err(|e| anyhow!("a verified batch no longer parses: {e}"))?;
    // A source the batch was built without has an empty fragment.
    let (sources, parts): (Vec<u32>, Vec<&[u8]>) = all
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.is_empty())
        .map(|(i, f)| (i as u32, *f))
        .unzip();
    loop {
        match store.write_events(
            mep,
            d.events,
            all.len() as u32,
            &sources,
            &parts,
            Some(&accepted),
        ) {
            Ok(()) => return Ok(()),
            Err(evb_store::StoreError::Backpressure { .. }) => {
                store.flush().context("the event store")?;
            }
            Err(e) => return Err(anyhow!("the event store: {e}")),
        }
    }
}

/// Appends a built batch: `EVBB`, MEP (u64), fragment count (u32), each
/// fragment's length (u32), then the fragments in source order; all
/// little-endian (see docs/run-json.md).
fn write_batch(
    file: &mut std::fs::File,
    mep: MepId,
    b: &BatchSlots,
    partial: bool,
) -> std::io::Result<()> {
    let parts: Vec<&[u8]> = b.slots.iter().map(slot_bytes).collect();
    let mut head = Vec::with_capacity(16 + 4 * parts.len());
    head.extend_from_slice(if partial { b"EVBP" } else { b"EVBB" });
    head.extend_from_slice(&mep.to_le_bytes());
    head.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in &parts {
        head.extend_from_slice(&(p.len() as u32).to_le_bytes());
    }
    file.write_all(&head)?;
    for p in parts {
        file.write_all(p)?;
    }
    Ok(())
}

/// The bytes of one source's fragment in a batch (empty if it never came).
fn slot_bytes(s: &Option<Slot>) -> &[u8] {
    match s {
        Some(Slot::Received { data, start, len }) => &data[*start..*start + *len],
        Some(Slot::Local(rc)) => &rc[..],
        Some(Slot::Shared(view)) => &view[..],
        None => &[][..],
    }
}

/// CLOCK_MONOTONIC now, ns: the clock `Instant` reads on Linux, shared by
/// every process of a host.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This host's name (for telling which nodes share a clock).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its whole length, which is passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod spare_pool_tests {
    use super::SparePool;

    #[test]
    fn spares_unused_for_a_whole_period_are_freed() {
        let mut p = SparePool::default();
        // A burst leaves 10 spares.
        for _ in 0..10 {
            p.give(vec![0; 16]);
        }
        assert_eq!(p.trim(), 0, "the first look only starts the count");
        // The steady state uses at most 3 at once.
        for _ in 0..5 {
            let a: Vec<_> = (0..3).map(|_| p.take().unwrap()).collect();
            a.into_iter().for_each(|b| p.give(b));
        }
        assert_eq!(p.trim(), 7, "7 spares were never needed");
        assert_eq!(p.spares.len(), 3);
        // Nothing taken in the next period: all 3 go.
        assert_eq!(p.trim(), 3);
        assert!(p.take().is_none());
    }

    #[test]
    fn a_fixed_pool_is_resident_at_once_and_keeps_its_buffers_only() {
        const MIB: usize = 1 << 20;
        let before = crate::report::resident_bytes();
        let mut p = SparePool::fixed(8, 8 * MIB);
        let grown = crate::report::resident_bytes().saturating_sub(before);
        assert!(
            grown >= 56 * MIB as u64,
            "only {grown} bytes became resident"
        );
        let taken: Vec<_> = (0..8).map(|_| p.take().unwrap()).collect();
        assert!(p.take().is_none());
        assert_eq!(p.fixed.unwrap().short, 1, "the shortage is counted");
        taken.into_iter().for_each(|b| p.give(b));
        // One allocated past the bound is not kept...
        p.give(vec![0; 8 * MIB]);
        assert_eq!(p.spares.len(), 8);
        // ...nor a smaller one that is not the pool's.
        let one = p.take().unwrap();
        p.give(vec![0; 16]);
        assert_eq!(p.spares.len(), 7);
        p.give(one);
        assert_eq!(p.spares.len(), 8);
        // Never trimmed, however long unused.
        assert_eq!(p.trim(), 0);
        assert_eq!(p.trim(), 0);
        assert_eq!(p.spares.len(), 8);
    }
}
