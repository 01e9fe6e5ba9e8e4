//! `evb node`: one endpoint of an event builder, as a process.
//!
//! Drives an [`evb_core::Node`] over TCP with a single-threaded mio loop.
//! Connection setup is blocking and simple (lower rank connects to higher,
//! every link identified by a Hello); the run itself is non-blocking.
//! Under `evb run` (`--control stdio`) the node prints `LISTEN <port>`,
//! reads `PEERS <addr>...` and later `STOP` on stdin, and prints `STATS` and
//! `FINAL` JSON lines on stdout.

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream as StdTcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use evb_core::bu::Admit;
use evb_core::config::{Config, SinkKind};
use evb_core::source::{payload_crc, SourceModel};
use evb_core::wire::{FragmentHeader, Message, FRAME_HEADER_LEN};
use evb_core::{Action, Layout, MepId, Nanos, Node, NodeId, Outcome};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::conn::{Conn, RxHandler, RxStatus};
use crate::report::NodeReport;

/// How the node is told its peers and when to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Addresses from `transport.addresses`; stops after `run.duration_s`.
    Config,
    /// Driven by `evb run` over stdin/stdout.
    Stdio,
}

pub struct NodeOptions {
    pub config: Config,
    pub rank: NodeId,
    pub control: Control,
}

const WAKER: Token = Token(usize::MAX - 1);
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an accepted connection may take to say Hello: a stranger that
/// connects and stays silent must not hold up the setup.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
const STATS_INTERVAL: Duration = Duration::from_millis(250);
/// After its own work is done, how long a node waits for its peers to close.
const LINGER: Duration = Duration::from_secs(5);
/// Every connection carries at least this often a message or a heartbeat;
/// silence is checked as often (a lost peer is seen within
/// `transport.peer_timeout_ms` + this).
const HEARTBEAT: Duration = Duration::from_millis(100);

enum Command {
    Stop,
    Eof,
}

/// Runs one node to the end of the run. Prints the final report.
pub fn run_node(opts: NodeOptions) -> Result<()> {
    let config = opts.config;
    let layout = Layout::from_config(&config);
    let rank = opts.rank;
    if rank >= layout.endpoints {
        bail!(
            "rank {rank} does not exist: the run has {} endpoints",
            layout.endpoints
        );
    }
    let (listener, addresses, commands) = rendezvous(&config, &layout, rank, opts.control)?;
    let mut poll = Poll::new()?;
    let waker = std::sync::Arc::new(Waker::new(poll.registry(), WAKER)?);
    let commands = commands.then(|| spawn_stdin_forwarder(waker));

    let mut rt = Runtime::new(config, layout, rank)?;
    rt.connect_all(&listener, &addresses, &mut poll)?;
    drop(listener);
    rt.run(&mut poll, commands.as_ref())
}

/// Binds the listener and learns every endpoint's address.
fn rendezvous(
    config: &Config,
    layout: &Layout,
    rank: NodeId,
    control: Control,
) -> Result<(TcpListener, Vec<SocketAddr>, bool)> {
    match control {
        Control::Stdio => {
            let listener =
                TcpListener::bind((config.transport.bind.as_str(), 0)).with_context(|| {
                    format!("binding to transport.bind = {}", config.transport.bind)
                })?;
            let port = listener.local_addr()?.port();
            println!("LISTEN {port}");
            std::io::stdout().flush()?;
            let mut line = String::new();
            if std::io::stdin().lock().read_line(&mut line)? == 0 {
                bail!("stdin closed before the PEERS line");
            }
            let line = line.trim_end();
            let addrs = line
                .strip_prefix("PEERS ")
                .ok_or_else(|| anyhow!("expected `PEERS addr...`, got `{line}`"))?
                .split_whitespace()
                .map(|a| {
                    a.parse::<SocketAddr>()
                        .with_context(|| format!("bad peer address `{a}`"))
                })
                .collect::<Result<Vec<_>>>()?;
            if addrs.len() != layout.endpoints as usize {
                bail!(
                    "PEERS lists {} addresses for {} endpoints",
                    addrs.len(),
                    layout.endpoints
                );
            }
            Ok((listener, addrs, true))
        }
        Control::Config => {
            let t = &config.transport;
            let addrs: Vec<SocketAddr> = if !t.addresses.is_empty() {
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
                    .collect::<Result<_>>()?
            } else if t.base_port != 0 {
                (0..layout.endpoints)
                    .map(|i| {
                        format!("{}:{}", t.bind, t.base_port + i)
                            .parse()
                            .with_context(|| {
                                format!("transport.bind `{}` is not an IP address", t.bind)
                            })
                    })
                    .collect::<Result<_>>()?
            } else {
                bail!("without `evb run`, set transport.addresses or transport.base_port");
            };
            let own = addrs[rank as usize];
            let listener = TcpListener::bind((config.transport.bind.as_str(), own.port()))
                .with_context(|| format!("binding to {}:{}", config.transport.bind, own.port()))?;
            Ok((listener, addrs, false))
        }
    }
}

/// Forwards `STOP` (and the end of stdin) from a thread to the event loop.
fn spawn_stdin_forwarder(waker: std::sync::Arc<Waker>) -> mpsc::Receiver<Command> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::stdin().lines();
        loop {
            let cmd = match lines.next() {
                Some(Ok(l)) if l.trim() == "STOP" => Command::Stop,
                Some(Ok(_)) => continue,
                _ => Command::Eof,
            };
            let eof = matches!(cmd, Command::Eof);
            if tx.send(cmd).is_err() {
                return;
            }
            let _ = waker.wake();
            if eof {
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
    Received { data: Vec<u8>, len: usize },
    /// Handed over in memory from this node's RU.
    Local(Rc<Vec<u8>>),
}

/// The node's buffers and counters the receive path needs (split from the
/// connections so both can be borrowed at once).
struct Engine {
    node: Node,
    epoch: Instant,
    sources: Option<SourceModel>,
    size_scratch: Vec<u32>,
    /// RU data of MEPs not yet released.
    meps: HashMap<MepId, (Rc<Vec<u8>>, FragmentHeader)>,
    /// Spare buffers, reused for MEP data and received payloads.
    pool: Vec<Vec<u8>>,
    batches: HashMap<MepId, BatchSlots>,
    rus: usize,
    sink: Option<std::fs::File>,
}

impl Engine {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    fn take_buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_default()
    }

    fn give_back(&mut self, buf: Vec<u8>) {
        // Keep enough spares for the steady state, not every buffer ever used.
        if self.pool.len() < 256 {
            self.pool.push(buf);
        }
    }

    fn batch(&mut self, mep: MepId) -> &mut BatchSlots {
        let rus = self.rus;
        self.batches.entry(mep).or_insert_with(|| BatchSlots {
            slots: (0..rus).map(|_| None).collect(),
        })
    }
}

impl RxHandler for Engine {
    fn on_control(&mut self, conn_peer: Option<NodeId>, msg: Message) -> Result<(), String> {
        let Some(from) = conn_peer else {
            return Ok(()); // A Hello on an accepted connection: identifies the peer.
        };
        let now = self.now();
        self.node.on_message(now, from, msg);
        Ok(())
    }

    fn payload_buffer(&mut self, peer: NodeId, header: &FragmentHeader) -> Option<Vec<u8>> {
        let now = self.now();
        match self.node.admit_fragment(now, peer, header) {
            Admit::Keep => Some(self.take_buffer()),
            Admit::Drop => None,
        }
    }

    fn on_fragment(&mut self, _peer: NodeId, header: FragmentHeader, crc: u32, payload: Vec<u8>) {
        let now = self.now();
        let len = header.payload_len as usize;
        let src = header.source as usize;
        if let Some(slot) = self.batch(header.mep).slots.get_mut(src) {
            *slot = Some(Slot::Received { data: payload, len });
        }
        self.node.on_fragment(now, &header, crc);
    }
}

struct Runtime {
    engine: Engine,
    layout: Layout,
    rank: NodeId,
    config: Config,
    conns: Vec<Conn>,
    /// Connection used to send to each endpoint.
    tx_conn: Vec<Option<usize>>,
    /// Peers declared lost, with when and why.
    lost: Vec<crate::report::PeerLoss>,
    /// A peer silent this long is lost.
    peer_timeout: Duration,
    /// Connections we opened to other endpoints: the run starts when each
    /// has been answered with a Hello (the peer finished its own setup).
    awaiting_hello: Vec<usize>,
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
        Ok(Runtime {
            engine: Engine {
                node,
                epoch: Instant::now(),
                sources,
                size_scratch: Vec::new(),
                meps: HashMap::new(),
                pool: Vec::new(),
                batches: HashMap::new(),
                rus: layout.rus(),
                sink,
            },
            tx_conn: vec![None; layout.endpoints as usize],
            layout,
            rank,
            config,
            conns: Vec::new(),
            lost: Vec::new(),
            peer_timeout,
            awaiting_hello: Vec::new(),
        })
    }

    /// Which endpoints this one talks to directly.
    fn needs_link(&self, peer: NodeId) -> bool {
        if peer == self.rank {
            // Only a folded node sending its own fragments through the NIC.
            let i = self.rank as usize;
            return self.config.event_builder.local == evb_core::config::LocalTraffic::Nic
                && self.layout.ru_of[i].is_some()
                && self.layout.bu_of[i].is_some();
        }
        true
    }

    /// Opens one connection per pair: the lower rank connects, the higher
    /// accepts; a folded node with `local = "nic"` also connects to itself.
    fn connect_all(
        &mut self,
        listener: &TcpListener,
        addrs: &[SocketAddr],
        poll: &mut Poll,
    ) -> Result<()> {
        let deadline = Instant::now() + SETUP_TIMEOUT;
        let me = self.rank;
        let run_id = self.config.run.run_id;
        let endpoints = self.layout.endpoints;
        let mut opened: Vec<(StdTcpStream, Option<NodeId>)> = Vec::new();
        // Our Hello: first on every connection we open, and the answer on
        // every one we accept.
        let mut hello = Vec::new();
        Message::Hello {
            run_id,
            node: me,
            nodes: endpoints,
        }
        .encode_into(&mut hello);
        for peer in me..endpoints {
            if !self.needs_link(peer) {
                continue;
            }
            let mut s = connect_retry(addrs[peer as usize], deadline).with_context(|| {
                format!("connecting to endpoint {peer} at {}", addrs[peer as usize])
            })?;
            s.write_all(&hello)?;
            opened.push((s, Some(peer)));
        }
        // The connections opened so far are ours; the rest will be accepted.
        let outgoing = opened.len();
        let expected_accepts = (0..=me).filter(|&p| self.needs_link(p)).count();
        listener.set_nonblocking(true)?;
        let mut accepted = 0;
        while accepted < expected_accepts {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    let left = deadline.saturating_duration_since(Instant::now());
                    s.set_read_timeout(Some(
                        left.min(HELLO_TIMEOUT).max(Duration::from_millis(1)),
                    ))?;
                    match read_hello(&s, run_id, endpoints) {
                        Ok(peer) => {
                            // With another node the accepted socket carries
                            // both directions; the self-link only receives on
                            // it (we send on the socket we opened).
                            if peer != me {
                                // Answer: tells the peer we are set up.
                                (&s).write_all(&hello)?;
                            }
                            opened.push((s, (peer != me).then_some(peer)));
                            accepted += 1;
                        }
                        Err(e) => eprintln!("evb node {me}: rejected a connection: {e:#}"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        bail!("only {accepted} of {expected_accepts} peers connected within {SETUP_TIMEOUT:?}");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let max_body = self.config.event_builder.max_message_bytes;
        let bufsize = self.config.transport.socket_buffer_bytes;
        for (i, (s, peer)) in opened.into_iter().enumerate() {
            s.set_read_timeout(None)?;
            s.set_nodelay(true)?;
            if bufsize > 0 {
                set_socket_buffers(&s, bufsize);
            }
            s.set_nonblocking(true)?;
            let mut stream = mio::net::TcpStream::from_std(s);
            poll.registry().register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            // Receive-only self-link: the peer is us, but we never send on it.
            let rx_peer = peer.or(Some(me));
            if let Some(p) = peer {
                self.tx_conn[p as usize] = Some(i);
                if i < outgoing && p != me {
                    self.awaiting_hello.push(i);
                }
            }
            self.conns.push(Conn::new(stream, rx_peer, max_body));
        }
        Ok(())
    }

    /// Waits until every peer we connected to has answered our Hello, so
    /// that no batch opens (and starts its timeout) while a peer is still
    /// setting up. Messages that arrive meanwhile are handled as usual.
    fn wait_for_peers(&mut self, poll: &mut Poll) -> Result<()> {
        let deadline = Instant::now() + SETUP_TIMEOUT;
        let mut events = Events::with_capacity(64);
        let mut completed = Vec::new();
        loop {
            let waiting: Vec<usize> = self
                .awaiting_hello
                .iter()
                .copied()
                .filter(|&i| !self.conns[i].hello_seen && !self.conns[i].closed)
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let peers: Vec<Option<NodeId>> =
                    waiting.iter().map(|&i| self.conns[i].peer).collect();
                bail!("endpoints {peers:?} did not finish their setup within {SETUP_TIMEOUT:?}");
            }
            poll.poll(&mut events, Some(Duration::from_millis(50)))?;
            for event in events.iter() {
                let i = event.token().0;
                if i >= self.conns.len() || self.conns[i].closed {
                    continue;
                }
                match self.conns[i].read_ready(&mut self.engine) {
                    Ok(RxStatus::Open) => {}
                    Ok(RxStatus::Closed) => self.close_conn(i, None),
                    Err(e) => self.close_conn(i, Some(e)),
                }
            }
            self.process_actions()?;
            self.flush_all(&mut completed);
        }
    }

    fn run(&mut self, poll: &mut Poll, commands: Option<&mpsc::Receiver<Command>>) -> Result<()> {
        self.wait_for_peers(poll)?;
        self.engine.epoch = Instant::now();
        let now = self.engine.now();
        self.engine.node.start(now);
        self.process_actions()?;
        let mut events = Events::with_capacity(256);
        let mut next_stats = Instant::now() + STATS_INTERVAL;
        let mut next_heartbeat = Instant::now() + HEARTBEAT;
        let duration = self.config.run.duration_s;
        let stop_at = (self.rank == self.layout.em && duration > 0.0)
            .then(|| self.engine.epoch + Duration::from_secs_f64(duration));
        let mut stopped = false;
        let drain = Duration::from_millis(self.config.event_builder.drain_timeout_ms);
        let mut drain_deadline: Option<Instant> = None;
        let mut drain_timed_out = false;
        let mut done_at: Option<Instant> = None;
        let mut completed = Vec::new();
        loop {
            // Time-driven inputs first.
            let now_i = Instant::now();
            if !stopped && stop_at.is_some_and(|t| now_i >= t) {
                stopped = true;
                let now = self.engine.now();
                self.engine.node.stop(now);
            }
            // Without the EM nothing more will be assigned: drain.
            let em_lost = self.lost.iter().any(|l| l.peer == self.layout.em);
            if drain_deadline.is_none() && (self.engine.node.end_of_run().is_some() || em_lost) {
                drain_deadline = Some(now_i + drain);
            }
            if now_i >= next_heartbeat {
                next_heartbeat = now_i + HEARTBEAT;
                self.heartbeat_and_check(now_i);
            }
            if let Some(dl) = drain_deadline {
                if now_i >= dl && !self.engine.node.is_done() {
                    eprintln!(
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
            self.process_actions()?;
            self.flush_all(&mut completed);
            if now_i >= next_stats {
                self.print_report("STATS", false, drain_timed_out);
                next_stats = now_i + STATS_INTERVAL;
            }
            if self.engine.node.is_done()
                && done_at.is_none()
                && self.conns.iter().all(|c| c.closed || !c.has_pending_tx())
            {
                done_at = Some(Instant::now());
                for c in &mut self.conns {
                    let _ = c.stream.shutdown(std::net::Shutdown::Write);
                    c.write_shut = true;
                }
            }
            if let Some(t) = done_at {
                let all_closed = self.conns.iter().all(|c| c.closed);
                if all_closed || t.elapsed() > LINGER {
                    break;
                }
            }
            // Sleep until the next thing that can happen.
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
            let timeout = wake.saturating_duration_since(Instant::now());
            poll.poll(&mut events, Some(timeout))?;
            for event in events.iter() {
                if event.token() == WAKER {
                    continue;
                }
                let i = event.token().0;
                if i >= self.conns.len() || self.conns[i].closed {
                    continue;
                }
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    match self.conns[i].read_ready(&mut self.engine) {
                        Ok(RxStatus::Open) => {}
                        Ok(RxStatus::Closed) => self.close_conn(i, None),
                        Err(e) => self.close_conn(i, Some(e)),
                    }
                }
            }
            // Commands every turn (a wake-up may have been taken during setup).
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
        self.print_report("FINAL", true, drain_timed_out);
        Ok(())
    }

    fn close_conn(&mut self, i: usize, error: Option<String>) {
        let peer = self.conns[i].peer;
        let expected = self.engine.node.is_done() || self.conns[i].write_shut;
        if let Some(e) = &error {
            eprintln!(
                "evb node {}: connection to endpoint {peer:?} failed: {e}",
                self.rank
            );
        }
        if let Some(p) = peer {
            let end = self.engine.node.end_of_run().is_some();
            // A clean close after the end of the run is how peers finish.
            let orderly = expected || (end && error.is_none());
            if !orderly && p != self.rank && !self.lost.iter().any(|l| l.peer == p) {
                let reason = error.clone().unwrap_or_else(|| "connection closed".into());
                eprintln!("evb node {}: endpoint {p} lost: {reason}", self.rank);
                self.lost.push(crate::report::PeerLoss::now(p, reason));
                let now = self.engine.now();
                self.engine.node.on_peer_lost(now, p);
            }
            if self.tx_conn[p as usize] == Some(i) {
                self.tx_conn[p as usize] = None;
            }
        }
        let _ = self.conns[i].stream.shutdown(std::net::Shutdown::Both);
        // Kept in place (its position is its poll token), just marked.
        self.conns[i].closed = true;
        // Fragments that were waiting to go on it never will: complete
        // their sends so the RU frees them and its transfer slots.
        let now = self.engine.now();
        for mep in self.conns[i].abort_tx() {
            self.engine.node.on_send_complete(now, mep);
        }
    }

    /// Keeps every connection alive with a heartbeat and declares lost a
    /// peer that has been silent for `transport.peer_timeout_ms`.
    fn heartbeat_and_check(&mut self, now: Instant) {
        if self.engine.node.is_done() {
            return;
        }
        let mut silent = Vec::new();
        for (i, c) in self.conns.iter_mut().enumerate() {
            if c.closed || c.write_shut {
                continue;
            }
            if c.peer != Some(self.rank) {
                if !c.has_pending_tx() {
                    c.queue_control(&Message::Heartbeat);
                }
                if now.duration_since(c.last_rx) > self.peer_timeout {
                    silent.push(i);
                }
            }
        }
        for i in silent {
            let ms = self.peer_timeout.as_millis();
            self.close_conn(i, Some(format!("silent for more than {ms} ms")));
        }
    }

    fn flush_all(&mut self, completed: &mut Vec<MepId>) {
        loop {
            completed.clear();
            let mut failed = Vec::new();
            for (i, c) in self.conns.iter_mut().enumerate() {
                if !c.closed && c.has_pending_tx() {
                    if let Err(e) = c.flush(completed) {
                        failed.push((i, e.to_string()));
                    }
                }
            }
            for (i, e) in failed {
                self.close_conn(i, Some(e));
            }
            if completed.is_empty() {
                return;
            }
            let now = self.engine.now();
            for &mep in completed.iter() {
                self.engine.node.on_send_complete(now, mep);
            }
            if self.process_actions().is_err() {
                return;
            }
        }
    }

    /// Carries out what the node asked for.
    fn process_actions(&mut self) -> Result<()> {
        while let Some(action) = self.engine.node.poll_action() {
            match action {
                Action::Send { to, msg } => {
                    // A peer that is gone gets nothing; the protocol copes
                    // (timeouts, accounting).
                    if let Some(c) = self.tx_conn.get(to as usize).copied().flatten() {
                        self.conns[c].queue_control(&msg);
                    }
                }
                Action::Produce { mep } => {
                    let e = &mut self.engine;
                    let source = e.sources.as_ref().expect("only an RU is asked to produce");
                    let mut buf = e.pool.pop().unwrap_or_default();
                    let header = source.produce(mep, &mut buf, &mut e.size_scratch);
                    let faults = &self.config.faults;
                    if faults.source == header.source && faults.corrupt_meps.contains(&mep) {
                        // After the CRC: the receiver must notice.
                        if let Some(b) = buf.last_mut() {
                            *b ^= 0x5a;
                        }
                    }
                    e.meps.insert(mep, (Rc::new(buf), header));
                    let now = e.now();
                    e.node.on_mep_ready(now, header);
                }
                Action::SendFragment { header, .. } | Action::HandOver { header }
                    if self.dropped(&header) =>
                {
                    let now = self.engine.now();
                    self.engine.node.on_send_complete(now, header.mep);
                }
                Action::SendFragment { to, header } => {
                    let data = self.engine.meps.get(&header.mep).map(|(d, _)| d.clone());
                    match (data, self.tx_conn.get(to as usize).copied().flatten()) {
                        (Some(data), Some(c)) => self.conns[c].queue_fragment(&header, data),
                        _ => {
                            // No route: complete it so the RU releases it; the BU
                            // side will count the batch incomplete.
                            let now = self.engine.now();
                            self.engine.node.on_send_complete(now, header.mep);
                        }
                    }
                }
                Action::HandOver { header } => {
                    let e = &mut self.engine;
                    let now = e.now();
                    let data = e.meps.get(&header.mep).map(|(d, _)| d.clone());
                    if let Some(data) = data {
                        if e.node.admit_fragment(now, self.rank, &header) == Admit::Keep {
                            let crc = payload_crc(&data[..header.payload_len as usize]);
                            let src = header.source as usize;
                            e.batch(header.mep).slots[src] = Some(Slot::Local(data));
                            e.node.on_fragment(now, &header, crc);
                        }
                    }
                    e.node.on_send_complete(now, header.mep);
                }
                Action::Release { mep } => {
                    if let Some((data, _)) = self.engine.meps.remove(&mep) {
                        if let Ok(buf) = Rc::try_unwrap(data) {
                            self.engine.give_back(buf);
                        }
                    }
                }
                Action::Finish { mep, outcome, .. } => {
                    let batch = self.engine.batches.remove(&mep);
                    if outcome == Outcome::Built {
                        if let (Some(file), Some(b)) = (self.engine.sink.as_mut(), batch.as_ref()) {
                            write_batch(file, mep, b).context("writing to the output file")?;
                        }
                    }
                    if let Some(b) = batch {
                        for slot in b.slots.into_iter().flatten() {
                            match slot {
                                Slot::Received { data, .. } => self.engine.give_back(data),
                                Slot::Local(rc) => {
                                    if let Ok(buf) = Rc::try_unwrap(rc) {
                                        self.engine.give_back(buf);
                                    }
                                }
                            }
                        }
                    }
                }
                Action::Done => {}
            }
        }
        Ok(())
    }

    /// Fault injection: this fragment is never sent.
    fn dropped(&self, h: &FragmentHeader) -> bool {
        let f = &self.config.faults;
        f.source == h.source && f.drop_meps.contains(&h.mep)
    }

    fn print_report(&self, tag: &str, full: bool, drain_timed_out: bool) {
        let stats = self.engine.node.stats();
        let elapsed = self.engine.epoch.elapsed().as_secs_f64();
        let mut r = NodeReport::from_stats(
            self.rank,
            self.layout.role(self.rank),
            elapsed,
            &stats,
            full,
        );
        r.peers_lost = self.lost.clone();
        r.rss_bytes = crate::report::resident_bytes();
        if let Some(em) = &stats.em {
            r.em_meps_built = em.meps_built;
            r.em_meps_incomplete = em.meps_incomplete;
            r.em_meps_corrupt = em.meps_corrupt;
            r.em_meps_lost_bu_gone = em.meps_lost_bu_gone;
        }
        r.drain_timed_out = drain_timed_out;
        let line = serde_json::to_string(&r).expect("report serialises");
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{tag} {line}");
        let _ = out.flush();
    }
}

/// Appends a built batch: `EVBB`, MEP (u64), fragment count (u32), each
/// fragment's length (u32), then the fragments in source order; all
/// little-endian (see docs/run-json.md).
fn write_batch(file: &mut std::fs::File, mep: MepId, b: &BatchSlots) -> std::io::Result<()> {
    let parts: Vec<&[u8]> = b
        .slots
        .iter()
        .map(|s| match s {
            Some(Slot::Received { data, len }) => &data[..*len],
            Some(Slot::Local(rc)) => &rc[..],
            None => &[][..],
        })
        .collect();
    let mut head = Vec::with_capacity(16 + 4 * parts.len());
    head.extend_from_slice(b"EVBB");
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

fn connect_retry(addr: SocketAddr, deadline: Instant) -> Result<StdTcpStream> {
    let mut delay = Duration::from_millis(5);
    loop {
        match StdTcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() + delay < deadline => {
                let _ = e;
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads and checks the Hello that opens every connection.
fn read_hello(mut s: &StdTcpStream, run_id: u32, endpoints: u16) -> Result<NodeId> {
    let mut buf = [0u8; FRAME_HEADER_LEN + 8];
    s.read_exact(&mut buf).context("reading Hello")?;
    let (msg, _) =
        evb_core::wire::decode_stream(&buf, 64)?.ok_or_else(|| anyhow!("short Hello"))?;
    match msg {
        Message::Hello {
            run_id: r,
            node,
            nodes,
        } => {
            if r != run_id {
                bail!("peer is in run {r}, this node in run {run_id}");
            }
            if nodes != endpoints || node >= endpoints {
                bail!("peer says it is endpoint {node} of {nodes}; this run has {endpoints}");
            }
            Ok(node)
        }
        other => bail!("expected Hello, got {other:?}"),
    }
}

fn set_socket_buffers(s: &StdTcpStream, bytes: u32) {
    use std::os::fd::AsRawFd;
    let v = bytes as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: valid fd, pointer to a c_int of the right size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}
