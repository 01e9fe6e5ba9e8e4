//! TCP: one connection per pair of endpoints, driven by a mio poll.
//!
//! Setup is blocking and simple: the lower rank connects to the higher and
//! opens with a Hello; the accepting side answers with its own Hello once
//! it is set up, which is the start barrier. During the run everything is
//! non-blocking. A folded node with `local = "nic"` also connects to
//! itself: it sends on the socket it opened and receives on the one it
//! accepted.
//!
//! Rejoin (when the runtime enables it): the listener stays open for the
//! whole run. A background thread accepts connections and runs the same
//! handshake (Hello with the run id, the run-key proof); strangers are still
//! rejected. The connection of a pair is always opened by its lower node id:
//! when a peer with a higher id is lost, this node re-dials it with
//! exponential backoff (50 ms doubling to 1 s) until it answers or the run
//! ends. A restarted node (`enable_rejoin(true)`) dials the higher ids
//! itself and waits a while for the lower ones to re-dial it. A new
//! connection from a peer that still has one replaces it: the old one is
//! reported closed (a loss) before the new one is reported joined.
//!
//! With an output network ([`super::outnet`]) a node has a second
//! listener there; a pair with a consumer at either end connects to it,
//! from the dialer's own address on that network, and a connection that
//! arrives on the other network's listener is rejected. The token a node
//! publishes is then `EB,OUT`.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream as StdTcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mepbuf::MepBuf;
use anyhow::{anyhow, bail, Context, Result};
use evb_core::config::Config;
use evb_core::wire::{FragmentHeader, Message, FRAME_HEADER_LEN, HELLO_BODY_LEN};
use evb_core::{Layout, MepId, NodeId};
use mio::{Events, Interest, Poll, Token};

use super::auth::{self, MAC_LEN, NONCE_LEN};
use super::outnet;
use super::tcp_conn::{Conn, RxStatus};
use super::{linked_peers, LinkEvent, RxHandler, Transport};
use crate::process::PeerProcess;

const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an accepted connection may take to say Hello: a stranger that
/// connects and stays silent must not hold up the setup.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Reads per connection per poll (a fragment takes about three).
const READ_STEPS: usize = 96;
/// Writes that progressed this recently show the peer is taking data.
const TX_PROGRESS_ALIVE: Duration = Duration::from_millis(300);
/// Re-dialing a lost peer: first wait, and the most it grows to.
const REDIAL_FIRST: Duration = Duration::from_millis(50);
const REDIAL_MAX: Duration = Duration::from_secs(1);
/// One connection attempt (connect plus handshake) during the run.
const DIAL_TIMEOUT: Duration = Duration::from_millis(800);
/// A restarted node waits this long for the lower ids to re-dial it before
/// it starts (briefly: meanwhile it sends no heartbeat on the connections it
/// has); later ones join during the run.
const REJOIN_WAIT: Duration = Duration::from_millis(300);

/// Who this node is, for handshakes on any thread.
#[derive(Clone)]
struct Handshake {
    rank: NodeId,
    run_id: u32,
    endpoints: u16,
    /// The run key: connections must prove it (see [`super::auth`]).
    key: Option<Vec<u8>>,
    /// Our own self-link proves itself with this nonce.
    self_nonce: [u8; NONCE_LEN],
    /// Per endpoint: its link with us runs over the output network.
    on_output: Arc<[bool]>,
    /// Our address on the output network, to dial from (none: any).
    out_source: Option<IpAddr>,
}

/// A connection set up off the event loop, waiting to be taken in.
struct Incoming {
    stream: StdTcpStream,
    peer: NodeId,
    /// The peer's process, as its Hello named it.
    process: PeerProcess,
}

/// Who a Hello says is speaking.
pub(crate) struct PeerHello {
    node: NodeId,
    process: PeerProcess,
}

pub struct TcpTransport {
    rank: NodeId,
    run_id: u32,
    endpoints: u16,
    hs: Handshake,
    /// Rejoin enabled by the runtime; `restarted`: this process is a new
    /// incarnation joining a run already going.
    rejoin: bool,
    restarted: bool,
    local_port: u16,
    addrs: Vec<SocketAddr>,
    /// Connections accepted or re-dialed by background threads.
    incoming_tx: mpsc::Sender<Incoming>,
    incoming_rx: mpsc::Receiver<Incoming>,
    /// New connections whose peer still had an open one: reported closed
    /// first, joined at the next poll.
    deferred: Vec<Incoming>,
    /// Per endpoint: the cancel flag of a re-dial under way.
    redials: Vec<Option<Arc<AtomicBool>>>,
    /// Tells the background threads the run is over.
    stop: Arc<AtomicBool>,
    linked: Vec<NodeId>,
    listener: Option<TcpListener>,
    /// The output network: our listener there and its address.
    out_listener: Option<TcpListener>,
    out_local: Option<SocketAddr>,
    /// Per endpoint: local and remote address of the connection we send
    /// on (for the report).
    link_addrs: Vec<Option<(SocketAddr, SocketAddr)>>,
    poll: Poll,
    events: Events,
    /// Wakes the poll at the runtime's deadline to the microsecond.
    timer: WakeTimer,
    conns: Vec<Conn>,
    /// Connection used to send to each endpoint.
    tx_conn: Vec<Option<usize>>,
    /// Connections we opened: set up when each has been answered.
    awaiting_hello: Vec<usize>,
    max_body: u64,
    socket_buffer_bytes: u32,
    finished: bool,
    /// The run key: connections must prove it (see [`super::auth`]).
    key: Option<Vec<u8>>,
    /// Connections that stopped reading at their budget (edge-triggered
    /// readiness will not tell again).
    more_to_read: Vec<usize>,
}

/// The poll token of [`WakeTimer`] (connections are numbered from 0).
const WAKE_TOKEN: Token = Token(usize::MAX);

/// A timerfd in the poll set. `epoll_wait` counts whole milliseconds (mio
/// rounds a timeout up to the next one), so a deadline 90 us away (a
/// slotted RU waiting for its slot's start) would be served up to a
/// millisecond late, which over loopback cost the slotted barrel a quarter
/// of its throughput. The timer wakes the poll at the deadline itself; the
/// poll's own timeout, a millisecond later, only backs it up.
struct WakeTimer {
    fd: std::os::fd::OwnedFd,
}

impl WakeTimer {
    fn new(poll: &Poll) -> Result<WakeTimer> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain system call; the descriptor is owned from here on.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error()).context("timerfd_create");
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        poll.registry().register(
            &mut mio::unix::SourceFd(&fd.as_raw_fd()),
            WAKE_TOKEN,
            Interest::READABLE,
        )?;
        Ok(WakeTimer { fd })
    }

    /// Sets the timer `after` from now (zero: nothing to set) and returns
    /// the timeout to give the poll: `after` rounded up by a millisecond,
    /// the timer being the one that wakes it. Should the timer fail, the
    /// poll's timeout still ends the wait.
    fn arm(&mut self, after: Duration) -> Duration {
        use std::os::fd::AsRawFd;
        if after.is_zero() {
            return after;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: a valid timerfd and itimerspec; no old value asked for.
        let set =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if set == 0 {
            after + Duration::from_millis(1)
        } else {
            after
        }
    }

    /// Reads the expirations off a timer that fired.
    fn clear(&mut self) {
        use std::os::fd::AsRawFd;
        let mut n = [0u8; 8];
        // SAFETY: reads 8 bytes into an 8-byte buffer; non-blocking.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), n.as_mut_ptr().cast(), n.len()) };
    }
}

impl TcpTransport {
    /// Binds the listening socket: on `listen` if given (a fixed address
    /// from the config), else on `transport.bind` with a port the OS picks;
    /// with `out_listen`, a second one on the output network (`key` names
    /// the setting its address came from).
    pub fn bind(
        config: &Config,
        layout: &Layout,
        rank: NodeId,
        listen: Option<SocketAddr>,
        out_listen: Option<(SocketAddr, &str)>,
    ) -> Result<TcpTransport> {
        let bind = config.transport.bind.as_str();
        let port = listen.map(|a| a.port()).unwrap_or(0);
        let listener = TcpListener::bind((bind, port))
            .with_context(|| format!("binding to transport.bind = {bind}, port {port}"))?;
        let out_listener = match out_listen {
            Some((addr, key)) => Some(TcpListener::bind(addr).with_context(|| {
                format!(
                    "{key}: binding the output network's listener to {addr} (an address of this host?)"
                )
            })?),
            None => None,
        };
        let out_local = match &out_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let on_output: Arc<[bool]> = (0..layout.endpoints)
            .map(|p| out_local.is_some() && outnet::is_output_link(layout, rank, p))
            .collect();
        let key = auth::load_key(&config.transport.run_key_file)?;
        let (incoming_tx, incoming_rx) = mpsc::channel();
        let poll = Poll::new()?;
        let timer = WakeTimer::new(&poll)?;
        Ok(TcpTransport {
            rank,
            run_id: config.run.run_id,
            endpoints: layout.endpoints,
            hs: Handshake {
                rank,
                run_id: config.run.run_id,
                endpoints: layout.endpoints,
                key: key.clone(),
                self_nonce: auth::nonce(),
                on_output,
                out_source: out_local.map(|a| a.ip()).filter(|ip| !ip.is_unspecified()),
            },
            rejoin: false,
            restarted: false,
            local_port: listener.local_addr()?.port(),
            addrs: Vec::new(),
            incoming_tx,
            incoming_rx,
            deferred: Vec::new(),
            redials: vec![None; layout.endpoints as usize],
            stop: Arc::new(AtomicBool::new(false)),
            linked: linked_peers(config, layout, rank),
            listener: Some(listener),
            out_listener,
            out_local,
            link_addrs: vec![None; layout.endpoints as usize],
            poll,
            events: Events::with_capacity(256),
            timer,
            conns: Vec::new(),
            tx_conn: vec![None; layout.endpoints as usize],
            awaiting_hello: Vec::new(),
            max_body: super::max_body_bytes(config),
            socket_buffer_bytes: config.transport.socket_buffer_bytes,
            finished: false,
            key,
            more_to_read: Vec::new(),
        })
    }

    fn hello(&self) -> Vec<u8> {
        self.hs.hello()
    }

    fn open_links(&mut self, addrs: &[SocketAddr]) -> Result<()> {
        let listener = self.listener.take().expect("connect runs once");
        let out_listener = self.out_listener.take();
        let deadline = Instant::now() + SETUP_TIMEOUT;
        let me = self.rank;
        let hello = self.hello();
        // Each with its peer and the peer's process (for those we opened,
        // known from the answer: in the handshake with a run key, else
        // from the Hello that arrives on the connection).
        let mut opened: Vec<(StdTcpStream, Option<NodeId>, PeerProcess)> = Vec::new();
        // Connections whose handshake already included the peer's answer.
        let mut answered = Vec::new();
        let self_nonce = self.hs.self_nonce;
        for &peer in self.linked.iter().filter(|&&p| p >= me) {
            let addr = addrs[peer as usize];
            let mut process = PeerProcess::default();
            let mut s =
                connect_retry(addr, self.hs.source_for(peer), deadline).with_context(|| {
                    format!(
                        "connecting to endpoint {peer} at {addr}{}",
                        self.hs.network_of(peer)
                    )
                })?;
            s.write_all(&hello)?;
            if let Some(key) = &self.key {
                if peer == me {
                    // Our own acceptor checks this nonce: only we know it.
                    s.write_all(&self_nonce)?;
                } else {
                    process = self
                        .hs
                        .prove_as_connector(&mut s, key, peer, deadline)
                        .with_context(|| {
                            format!("run-key handshake with endpoint {peer} at {addr}")
                        })?;
                    answered.push(opened.len());
                }
            }
            opened.push((s, Some(peer), process));
        }
        let outgoing = opened.len();
        let expected_accepts = self.linked.iter().filter(|&&p| p <= me).count();
        listener.set_nonblocking(true)?;
        if let Some(l) = &out_listener {
            l.set_nonblocking(true)?;
        }
        let mut accepted = 0;
        while accepted < expected_accepts {
            match accept_either(&listener, out_listener.as_ref()) {
                Ok((s, on_output)) => {
                    s.set_nonblocking(false)?;
                    let left = deadline.saturating_duration_since(Instant::now());
                    s.set_read_timeout(Some(
                        left.min(HELLO_TIMEOUT).max(Duration::from_millis(1)),
                    ))?;
                    let checked =
                        read_hello(&s, self.run_id, self.endpoints).and_then(|hello_in| {
                            let peer = hello_in.node;
                            self.hs.check_network(peer, on_output)?;
                            match &self.key {
                                Some(key) => self.hs.check_as_acceptor(&s, key, peer, &hello)?,
                                // The answer: tells the peer we are set up (not
                                // on the receive-only self-link).
                                None if peer != me => (&s).write_all(&hello)?,
                                None => {}
                            }
                            Ok(hello_in)
                        });
                    match checked {
                        Ok(PeerHello {
                            node: peer,
                            process,
                        }) => {
                            // With another node the accepted socket carries
                            // both directions; the self-link only receives.
                            opened.push((s, (peer != me).then_some(peer), process));
                            accepted += 1;
                        }
                        Err(e) => tracing::warn!("evb node {me}: rejected a connection: {e:#}"),
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
        for (k, (s, peer, process)) in opened.into_iter().enumerate() {
            let i = self.add_conn(s, peer, process)?;
            if let Some(p) = peer {
                if k < outgoing && p != me {
                    self.awaiting_hello.push(i);
                }
            }
            self.conns[i].hello_seen = answered.contains(&k);
        }
        // Kept for connections during the run (rejoin), else closed.
        self.listener = Some(listener);
        self.out_listener = out_listener;
        Ok(())
    }

    /// Takes in a set-up connection: `peer` is who we send to on it
    /// (`None`: the receive-only self-link), `process` the peer's process
    /// as far as its Hello was read. Returns its index.
    fn add_conn(
        &mut self,
        s: StdTcpStream,
        peer: Option<NodeId>,
        process: PeerProcess,
    ) -> Result<usize> {
        s.set_read_timeout(None)?;
        s.set_nodelay(true)?;
        if let Some(p) = peer {
            self.link_addrs[p as usize] = s.local_addr().ok().zip(s.peer_addr().ok());
        }
        if self.socket_buffer_bytes > 0 {
            set_socket_buffers(&s, self.socket_buffer_bytes);
        }
        s.set_nonblocking(true)?;
        let i = self.conns.len();
        let mut stream = mio::net::TcpStream::from_std(s);
        self.poll.registry().register(
            &mut stream,
            Token(i),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        // Receive-only self-link: the peer is us, but we never send on it.
        let rx_peer = peer.or(Some(self.rank));
        if let Some(p) = peer {
            self.tx_conn[p as usize] = Some(i);
        }
        let mut conn = Conn::new(stream, rx_peer, self.max_body);
        conn.peer_process = process;
        self.conns.push(conn);
        Ok(i)
    }

    /// From now on, connections are accepted in the background.
    fn start_acceptor(&mut self) -> Result<()> {
        let Some(listener) = self.listener.take() else {
            return Ok(());
        };
        listener.set_nonblocking(true)?;
        let out_listener = self.out_listener.take();
        if let Some(l) = &out_listener {
            l.set_nonblocking(true)?;
        }
        let hs = self.hs.clone();
        let tx = self.incoming_tx.clone();
        let stop = self.stop.clone();
        std::thread::Builder::new()
            .name("evb-accept".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match accept_either(&listener, out_listener.as_ref()) {
                        Ok((s, on_output)) => {
                            let from = s
                                .peer_addr()
                                .map_or("an unknown address".into(), |a| a.to_string());
                            let hs = hs.clone();
                            let tx = tx.clone();
                            // Off this thread: a silent stranger must not
                            // hold up the next connection.
                            std::thread::spawn(move || match hs.accept(&s, on_output) {
                                Ok(PeerHello {
                                    node: peer,
                                    process,
                                }) => {
                                    let _ = tx.send(Incoming {
                                        stream: s,
                                        peer,
                                        process,
                                    });
                                }
                                Err(e) => tracing::warn!(
                                    "evb node {}: rejected a connection from {from}: {e:#}",
                                    hs.rank
                                ),
                            });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => {
                            tracing::warn!("evb node {}: accepting: {e}", hs.rank);
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })?;
        Ok(())
    }

    /// Re-dials `peer` in the background until it answers, the run ends,
    /// or it comes back some other way.
    fn start_redial(&mut self, peer: NodeId) {
        let Some(&addr) = self.addrs.get(peer as usize) else {
            return;
        };
        if self.redials[peer as usize].is_some() || self.stop.load(Ordering::Relaxed) {
            return;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        self.redials[peer as usize] = Some(cancel.clone());
        let hs = self.hs.clone();
        let tx = self.incoming_tx.clone();
        let stop = self.stop.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("evb-redial-{peer}"))
            .spawn(move || {
                let mut delay = REDIAL_FIRST;
                let mut attempts = 0u32;
                loop {
                    std::thread::sleep(delay);
                    if stop.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    attempts += 1;
                    match hs.dial(addr, peer, DIAL_TIMEOUT) {
                        Ok((stream, process)) => {
                            tracing::info!(
                                "evb node {}: reconnected to endpoint {peer} at {addr} (attempt {attempts})",
                                hs.rank
                            );
                            let _ = tx.send(Incoming {
                                stream,
                                peer,
                                process,
                            });
                            return;
                        }
                        Err(_) => delay = (delay * 2).min(REDIAL_MAX),
                    }
                }
            });
        if spawned.is_err() {
            self.redials[peer as usize] = None;
        }
    }

    /// Takes in the connections set up in the background: a peer's new
    /// connection replaces its old one (reported closed now, joined at the
    /// next poll, so the runtime handles the loss first).
    fn take_incoming(&mut self, events: &mut Vec<LinkEvent>) {
        for inc in std::mem::take(&mut self.deferred) {
            self.join(inc, events);
        }
        while let Ok(inc) = self.incoming_rx.try_recv() {
            if self.finished {
                continue; // Dropped: the run is over for us.
            }
            let old = self
                .tx_conn
                .get(inc.peer as usize)
                .copied()
                .flatten()
                .filter(|&i| !self.conns[i].closed && inc.peer != self.rank);
            match old {
                Some(i) => {
                    self.close_conn(
                        i,
                        Some("replaced by a new connection from the same endpoint".into()),
                        events,
                    );
                    self.deferred.push(inc);
                }
                // Its old connection closed in this poll (a peer resumed
                // after SIGSTOP reads the end of the connection we dropped
                // and our re-dial at once): the runtime handles that loss,
                // and drops the peer, before it learns of the join, or the
                // drop would close the new connection too.
                None if events
                    .iter()
                    .any(|e| matches!(e, LinkEvent::Closed { peer, .. } if *peer == inc.peer)) =>
                {
                    self.deferred.push(inc)
                }
                None => self.join(inc, events),
            }
        }
    }

    fn join(&mut self, inc: Incoming, events: &mut Vec<LinkEvent>) {
        let peer = inc.peer;
        if let Some(cancel) = self.redials[peer as usize].take() {
            cancel.store(true, Ordering::Relaxed);
        }
        let tx_peer = (peer != self.rank).then_some(peer);
        match self.add_conn(inc.stream, tx_peer, inc.process) {
            Ok(i) => {
                self.conns[i].hello_seen = true;
                if peer != self.rank {
                    events.push(LinkEvent::Joined { peer });
                }
            }
            Err(e) => tracing::warn!(
                "evb node {}: taking in endpoint {peer}'s connection: {e:#}",
                self.rank
            ),
        }
    }

    /// A restarted node's setup: dial the higher ids (those alive answer at
    /// once), then wait a while for the lower ids to re-dial us. Peers not
    /// linked at the end are the runtime's to declare lost.
    fn connect_restarted(&mut self) -> Result<()> {
        let me = self.rank;
        self.start_acceptor()?;
        let higher: Vec<NodeId> = self.linked.iter().copied().filter(|&p| p >= me).collect();
        for peer in higher {
            let addr = self.addrs[peer as usize];
            let dialed = if peer == me {
                connect_self(&self.hs, addr).map(|s| (s, PeerProcess::ours()))
            } else {
                self.hs.dial(addr, peer, DIAL_TIMEOUT)
            };
            match dialed {
                Ok((s, process)) => {
                    let i = self.add_conn(s, Some(peer), process)?;
                    self.conns[i].hello_seen = true;
                }
                Err(e) => {
                    tracing::warn!("evb node {me}: endpoint {peer} at {addr} is not there: {e:#}")
                }
            }
        }
        let deadline = Instant::now() + REJOIN_WAIT;
        let mut waiting: Vec<NodeId> = self.linked.iter().copied().filter(|&p| p <= me).collect();
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    "evb node {me}: endpoints {waiting:?} did not connect at the rejoin"
                );
                break;
            }
            let Ok(inc) = self.incoming_rx.recv_timeout(left) else {
                continue;
            };
            let tx_peer = (inc.peer != me).then_some(inc.peer);
            waiting.retain(|&p| p != inc.peer);
            let i = self.add_conn(inc.stream, tx_peer, inc.process)?;
            self.conns[i].hello_seen = true;
        }
        Ok(())
    }

    fn close_conn(&mut self, i: usize, error: Option<String>, events: &mut Vec<LinkEvent>) {
        let c = &mut self.conns[i];
        if c.closed {
            return;
        }
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        // Kept in place (its position is its poll token), just marked.
        c.closed = true;
        // Fragments waiting to go on it never will: their sends are done.
        for mep in c.abort_tx() {
            events.push(LinkEvent::SendDone(mep));
        }
        if let Some(p) = c.peer {
            if self.tx_conn[p as usize] == Some(i) {
                self.tx_conn[p as usize] = None;
            }
            if p != self.rank {
                events.push(LinkEvent::Closed { peer: p, error });
            }
        }
    }

    fn read_events(&mut self, handler: &mut dyn RxHandler, events: &mut Vec<LinkEvent>) {
        let mut ready: Vec<usize> = std::mem::take(&mut self.more_to_read);
        ready.extend(
            self.events
                .iter()
                .filter(|e| e.is_readable() || e.is_read_closed() || e.is_error())
                .map(|e| e.token().0),
        );
        ready.sort_unstable();
        ready.dedup();
        for i in ready {
            if i >= self.conns.len() || self.conns[i].closed {
                continue;
            }
            let status = self.conns[i].read_ready(handler, READ_STEPS);
            // A goodbye is news before the close that follows it.
            if std::mem::take(&mut self.conns[i].goodbye_seen) {
                if let Some(peer) = self.conns[i].peer.filter(|&p| p != self.rank) {
                    events.push(LinkEvent::Finished { peer });
                }
            }
            match status {
                Ok(RxStatus::Open) => {}
                Ok(RxStatus::MoreToRead) => self.more_to_read.push(i),
                Ok(RxStatus::Closed) => self.close_conn(i, None, events),
                Err(e) => self.close_conn(i, Some(e), events),
            }
        }
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> String {
        "tcp".into()
    }

    fn local_token(&self) -> String {
        match self.out_local {
            Some(out) => format!("{},{out}", self.local_port),
            None => self.local_port.to_string(),
        }
    }

    fn output_network(&self) -> Option<crate::outnet::OutputNetworkReport> {
        let address = self.out_local?.to_string();
        let links = (0..self.endpoints)
            .filter(|&p| self.hs.on_output[p as usize])
            .filter_map(|p| {
                let (local, remote) = self.link_addrs[p as usize]?;
                Some(crate::outnet::LinkAddresses {
                    peer: p,
                    local: local.to_string(),
                    remote: remote.to_string(),
                })
            })
            .collect();
        Some(crate::outnet::OutputNetworkReport { address, links })
    }

    fn enable_rejoin(&mut self, restarted: bool) -> bool {
        self.rejoin = true;
        self.restarted = restarted;
        true
    }

    fn has_link(&self, peer: NodeId) -> bool {
        self.tx_conn
            .get(peer as usize)
            .copied()
            .flatten()
            .is_some_and(|i| !self.conns[i].closed)
    }

    fn connect(&mut self, peers: &[String], handler: &mut dyn RxHandler) -> Result<()> {
        if peers.len() != self.endpoints as usize {
            bail!("{} addresses for {} endpoints", peers.len(), self.endpoints);
        }
        // Each peer is dialed on the network its link with us runs over.
        let me = self.rank;
        let addrs = peers
            .iter()
            .enumerate()
            .map(|(p, token)| match outnet::split_token(token) {
                (_, Some(out)) if self.hs.on_output[p] => {
                    outnet::resolve(out, &format!("endpoint {p}'s output-network address"))
                }
                (_, None) if self.hs.on_output[p] => bail!(
                    "endpoint {p} has no address on the output network, where its link with \
                     endpoint {me} runs: set output.bind or output.interface on every endpoint"
                ),
                (eb, _) => outnet::resolve(eb, "endpoint address"),
            })
            .collect::<Result<Vec<_>>>()?;
        self.addrs = addrs.clone();
        if self.restarted {
            return self.connect_restarted();
        }
        self.open_links(&addrs)?;
        // Start barrier: every peer we connected to has answered.
        let deadline = Instant::now() + SETUP_TIMEOUT;
        let mut events = Vec::new();
        loop {
            let waiting: Vec<usize> = self
                .awaiting_hello
                .iter()
                .copied()
                .filter(|&i| !self.conns[i].hello_seen && !self.conns[i].closed)
                .collect();
            if waiting.is_empty() {
                if self.rejoin {
                    self.start_acceptor()?;
                } else {
                    self.listener = None;
                    self.out_listener = None;
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let peers: Vec<Option<NodeId>> =
                    waiting.iter().map(|&i| self.conns[i].peer).collect();
                bail!("endpoints {peers:?} did not finish their setup within {SETUP_TIMEOUT:?}");
            }
            self.poll(Duration::from_millis(50), handler, &mut events)?;
            if let Some(LinkEvent::Closed { peer, error }) = events
                .iter()
                .find(|e| matches!(e, LinkEvent::Closed { .. }))
            {
                bail!(
                    "endpoint {peer} closed during setup: {}",
                    error.as_deref().unwrap_or("connection closed")
                );
            }
        }
    }

    fn send_control(&mut self, to: NodeId, msg: &Message) -> bool {
        match self.tx_conn.get(to as usize).copied().flatten() {
            Some(c) => {
                self.conns[c].queue_control(msg);
                true
            }
            None => false,
        }
    }

    fn send_fragment(&mut self, to: NodeId, header: &FragmentHeader, data: Rc<MepBuf>) -> bool {
        match self.tx_conn.get(to as usize).copied().flatten() {
            Some(c) => {
                self.conns[c].queue_fragment(header, data);
                true
            }
            None => false,
        }
    }

    fn has_pending_tx(&self, to: Option<NodeId>) -> bool {
        match to {
            Some(p) => self
                .tx_conn
                .get(p as usize)
                .copied()
                .flatten()
                .is_some_and(|c| self.conns[c].has_pending_tx()),
            None => self.conns.iter().any(|c| !c.closed && c.has_pending_tx()),
        }
    }

    fn poll(
        &mut self,
        timeout: Duration,
        handler: &mut dyn RxHandler,
        events: &mut Vec<LinkEvent>,
    ) -> Result<()> {
        let before = events.len();
        self.flush(events);
        // Sends that completed are news for the caller, and unread input
        // is waiting: do not sleep on either.
        let news = events.len() > before || !self.deferred.is_empty();
        let timeout = if news || !self.more_to_read.is_empty() {
            Duration::ZERO
        } else {
            self.timer.arm(timeout)
        };
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        if self.events.iter().any(|e| e.token() == WAKE_TOKEN) {
            self.timer.clear();
        }
        self.read_events(handler, events);
        self.flush(events);
        // After reading: the runtime learns of a join before anything the
        // new connection carries is read (at the next poll).
        self.take_incoming(events);
        Ok(())
    }

    fn flush(&mut self, events: &mut Vec<LinkEvent>) {
        let mut completed: Vec<MepId> = Vec::new();
        let mut failed = Vec::new();
        for (i, c) in self.conns.iter_mut().enumerate() {
            if !c.closed && c.has_pending_tx() {
                if let Err(e) = c.flush(&mut completed) {
                    failed.push((i, e.to_string()));
                    continue;
                }
            }
            if c.shut_when_flushed && !c.has_pending_tx() && !c.write_shut {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                c.write_shut = true;
            }
        }
        events.extend(completed.into_iter().map(LinkEvent::SendDone));
        for (i, e) in failed {
            self.close_conn(i, Some(e), events);
        }
    }

    fn drop_peer(&mut self, peer: NodeId, events: &mut Vec<LinkEvent>) {
        let ids: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].peer == Some(peer) && !self.conns[i].closed)
            .collect();
        let mut ignored = Vec::new();
        for i in ids {
            self.close_conn(i, None, &mut ignored);
        }
        // Only the completed sends matter: the runtime already knows.
        events.extend(
            ignored
                .into_iter()
                .filter(|e| matches!(e, LinkEvent::SendDone(_))),
        );
        // The lower id re-dials: the peer may only be cut off, or restart.
        if self.rejoin && peer > self.rank && !self.finished {
            self.start_redial(peer);
        }
    }

    /// From the process the peer's Hello named (on this host or not).
    fn peer_runnable(&self, peer: NodeId) -> bool {
        self.conns
            .iter()
            .any(|c| c.peer == Some(peer) && !c.closed && c.peer_process.runnable())
    }

    fn peer_active(&self, peer: NodeId) -> bool {
        use std::os::fd::AsRawFd;
        self.conns
            .iter()
            .filter(|c| c.peer == Some(peer) && !c.closed)
            .any(|c| {
                // Data we queued earlier is still being taken: the peer reads.
                if c.last_tx_progress.elapsed() < TX_PROGRESS_ALIVE && c.has_pending_tx() {
                    return true;
                }
                let mut n: libc::c_int = 0;
                // SAFETY: FIONREAD writes one c_int.
                let rc = unsafe { libc::ioctl(c.stream.as_raw_fd(), libc::FIONREAD, &mut n) };
                rc == 0 && n > 0
            })
    }

    fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.stop.store(true, Ordering::Relaxed);
        // Goodbye first: a close alone is what a killed process leaves, and
        // a peer that has not seen the EM's EndOfRun yet would count it a loss.
        for c in &mut self.conns {
            if !c.closed && c.peer != Some(self.rank) {
                c.queue_control(&Message::Goodbye);
            }
            c.shut_when_flushed = true;
        }
        let mut ignored = Vec::new();
        self.flush(&mut ignored);
    }

    fn all_finished(&self) -> bool {
        self.conns.iter().all(|c| c.closed)
    }
}

impl Handshake {
    fn hello(&self) -> Vec<u8> {
        let mut hello = Vec::new();
        let ours = PeerProcess::ours();
        Message::Hello {
            run_id: self.run_id,
            node: self.rank,
            nodes: self.endpoints,
            host: ours.host,
            pid: ours.pid,
        }
        .encode_into(&mut hello);
        hello
    }

    /// The address to dial `peer` from: ours on the output network when
    /// the link runs there.
    fn source_for(&self, peer: NodeId) -> Option<IpAddr> {
        self.out_source.filter(|_| self.on_output[peer as usize])
    }

    /// For messages: " on the output network" when the link runs there.
    fn network_of(&self, peer: NodeId) -> &'static str {
        if self.on_output[peer as usize] {
            " on the output network"
        } else {
            ""
        }
    }

    /// A connection from `peer` arrived on the output network's listener
    /// (`on_output`) or the event-building one: it must be the network
    /// their link runs over.
    fn check_network(&self, peer: NodeId, on_output: bool) -> Result<()> {
        let net = |out: bool| if out { "output" } else { "event-building" };
        let expected = self.on_output[peer as usize];
        if expected != on_output {
            bail!(
                "endpoint {peer} connected on the {} network, but its link with endpoint {} runs \
                 over the {} network (check output.bind, output.interface, output.addresses)",
                net(on_output),
                self.rank,
                net(expected)
            );
        }
        Ok(())
    }

    /// Opens a connection to `peer` during the run and goes through the
    /// whole handshake before returning it (the peer answers at once),
    /// with the peer's process its answer named.
    fn dial(
        &self,
        addr: SocketAddr,
        peer: NodeId,
        timeout: Duration,
    ) -> Result<(StdTcpStream, PeerProcess)> {
        let deadline = Instant::now() + timeout;
        let mut s = outnet::connect_from(addr, self.source_for(peer), timeout)?;
        s.write_all(&self.hello())?;
        let process = match &self.key {
            Some(key) => self.prove_as_connector(&mut s, key, peer, deadline)?,
            None => {
                s.set_read_timeout(Some(timeout))?;
                let answered =
                    read_hello(&s, self.run_id, self.endpoints).context("reading the answer")?;
                if answered.node != peer {
                    bail!(
                        "endpoint {peer}'s address answered as endpoint {}",
                        answered.node
                    );
                }
                s.set_read_timeout(None)?;
                answered.process
            }
        };
        Ok((s, process))
    }

    /// Accepting side during the run: the peer's Hello, our answer, the
    /// run-key proof. Returns who the peer is. `on_output`: it arrived on
    /// the output network's listener.
    fn accept(&self, s: &StdTcpStream, on_output: bool) -> Result<PeerHello> {
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(HELLO_TIMEOUT))?;
        let hello_in = read_hello(s, self.run_id, self.endpoints)?;
        let peer = hello_in.node;
        self.check_network(peer, on_output)?;
        let hello = self.hello();
        match &self.key {
            Some(key) => self.check_as_acceptor(s, key, peer, &hello)?,
            None if peer != self.rank => (&*s).write_all(&hello)?,
            None => {}
        }
        Ok(hello_in)
    }

    /// Connecting side of the run-key handshake (after our Hello). Returns
    /// the peer's process its answer named.
    fn prove_as_connector(
        &self,
        s: &mut StdTcpStream,
        key: &[u8],
        peer: NodeId,
        deadline: Instant,
    ) -> Result<PeerProcess> {
        let nonce_c = auth::nonce();
        s.write_all(&nonce_c)?;
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        let answered = read_hello(s, self.run_id, self.endpoints).context("reading the answer")?;
        if answered.node != peer {
            bail!(
                "endpoint {peer}'s address answered as endpoint {}",
                answered.node
            );
        }
        let mut challenge = [0u8; NONCE_LEN + MAC_LEN];
        s.read_exact(&mut challenge)
            .context("reading the peer's proof")?;
        let nonce_a: [u8; NONCE_LEN] = challenge[..NONCE_LEN].try_into().expect("16");
        let mac_a: [u8; MAC_LEN] = challenge[NONCE_LEN..].try_into().expect("32");
        if !auth::verify(
            key,
            "evb-accept",
            self.run_id,
            peer,
            self.rank,
            &nonce_c,
            &nonce_a,
            &mac_a,
        ) {
            bail!("endpoint {peer} did not prove the run key");
        }
        s.write_all(&auth::proof(
            key,
            "evb-connect",
            self.run_id,
            self.rank,
            peer,
            &nonce_a,
            &nonce_c,
        ))?;
        s.set_read_timeout(None)?;
        Ok(answered.process)
    }

    /// Accepting side: the peer's Hello was read; answer and check its proof.
    fn check_as_acceptor(
        &self,
        s: &StdTcpStream,
        key: &[u8],
        peer: NodeId,
        hello: &[u8],
    ) -> Result<()> {
        let mut nonce_c = [0u8; NONCE_LEN];
        (&*s)
            .read_exact(&mut nonce_c)
            .context("reading the nonce")?;
        if peer == self.rank {
            if nonce_c != self.self_nonce {
                bail!("a connection claiming to be this node did not come from it");
            }
            return Ok(());
        }
        let nonce_a = auth::nonce();
        let mut answer = hello.to_vec();
        answer.extend_from_slice(&nonce_a);
        answer.extend_from_slice(&auth::proof(
            key,
            "evb-accept",
            self.run_id,
            self.rank,
            peer,
            &nonce_c,
            &nonce_a,
        ));
        (&*s).write_all(&answer)?;
        let mut mac_c = [0u8; MAC_LEN];
        (&*s)
            .read_exact(&mut mac_c)
            .context("reading the run-key proof")?;
        if !auth::verify(
            key,
            "evb-connect",
            self.run_id,
            peer,
            self.rank,
            &nonce_a,
            &nonce_c,
            &mac_c,
        ) {
            bail!("endpoint {peer} (claimed) did not prove the run key");
        }
        Ok(())
    }
}

/// A restarted node's link to itself (`local = "nic"`): Hello and, with a
/// run key, the nonce only this process knows.
fn connect_self(hs: &Handshake, addr: SocketAddr) -> Result<StdTcpStream> {
    let mut s = StdTcpStream::connect_timeout(&addr, DIAL_TIMEOUT)?;
    s.write_all(&hs.hello())?;
    if hs.key.is_some() {
        s.write_all(&hs.self_nonce)?;
    }
    Ok(s)
}

/// The next connection waiting on the event-building listener or the
/// output network's (non-blocking both), and whether it came on the latter.
fn accept_either(
    listener: &TcpListener,
    out_listener: Option<&TcpListener>,
) -> std::io::Result<(StdTcpStream, bool)> {
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && out_listener.is_some() => {
            let (s, _) = out_listener.expect("checked").accept()?;
            Ok((s, true))
        }
        r => r.map(|(s, _)| (s, false)),
    }
}

fn connect_retry(
    addr: SocketAddr,
    from: Option<IpAddr>,
    deadline: Instant,
) -> Result<StdTcpStream> {
    let mut delay = Duration::from_millis(5);
    loop {
        match outnet::connect_from(addr, from, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(_) if Instant::now() + delay < deadline => {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads and checks the Hello that opens every connection.
fn read_hello(mut s: &StdTcpStream, run_id: u32, endpoints: u16) -> Result<PeerHello> {
    let mut buf = [0u8; FRAME_HEADER_LEN + HELLO_BODY_LEN];
    s.read_exact(&mut buf).context("reading Hello")?;
    let (msg, _) =
        evb_core::wire::decode_stream(&buf, 64)?.ok_or_else(|| anyhow!("short Hello"))?;
    check_hello(&msg, run_id, endpoints)
}

/// The peer a Hello names, if it belongs to this run.
pub(crate) fn check_hello(msg: &Message, run_id: u32, endpoints: u16) -> Result<PeerHello> {
    match *msg {
        Message::Hello {
            run_id: r,
            node,
            nodes,
            host,
            pid,
        } => {
            if r != run_id {
                bail!("peer is in run {r}, this node in run {run_id}");
            }
            if nodes != endpoints || node >= endpoints {
                bail!("peer says it is endpoint {node} of {nodes}; this run has {endpoints}");
            }
            Ok(PeerHello {
                node,
                process: PeerProcess { host, pid },
            })
        }
        ref other => bail!("expected Hello, got {other:?}"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rx::Seen;

    /// A poll's timeout is kept to the microsecond, not rounded up to the
    /// millisecond `epoll_wait` counts in (a slotted RU waits some 90 us
    /// for its slot's start). The fastest of 20 polls: a loaded machine
    /// may be late now and then, never early.
    #[test]
    fn a_short_poll_timeout_is_kept() {
        let overrides = ["nodes.count=2".into(), "transport.bind=127.0.0.1".into()];
        let config = Config::load(None, &overrides).unwrap();
        let layout = Layout::from_config(&config);
        let mut t = TcpTransport::bind(&config, &layout, 0, None, None).unwrap();
        let mut events = Vec::new();
        let want = Duration::from_micros(200);
        let took: Vec<Duration> = (0..20)
            .map(|_| {
                let t0 = Instant::now();
                t.poll(want, &mut Seen::default(), &mut events).unwrap();
                t0.elapsed()
            })
            .collect();
        let fastest = *took.iter().min().unwrap();
        assert!(fastest >= want, "woke early: {took:?}");
        assert!(fastest < Duration::from_micros(900), "{took:?}");
        assert!(events.is_empty(), "{events:?}");
    }

    /// Nodes 0 and 1 linked on loopback, node 1 in a thread of its own
    /// that hands its set-up transport to `node1`. Returns node 0's
    /// transport and node 1's thread.
    fn linked_pair<T: Send + 'static>(
        node1: impl FnOnce(TcpTransport) -> T + Send + 'static,
    ) -> (TcpTransport, std::thread::JoinHandle<T>) {
        let overrides = ["nodes.count=2".into(), "transport.bind=127.0.0.1".into()];
        let config = Config::load(None, &overrides).unwrap();
        let layout = Layout::from_config(&config);
        let (port_tx, port_rx) = mpsc::channel();
        let (addr_tx, addr_rx) = mpsc::channel::<Vec<String>>();
        let thread = {
            let (config, layout) = (config.clone(), layout.clone());
            std::thread::spawn(move || {
                let mut t = TcpTransport::bind(&config, &layout, 1, None, None).unwrap();
                port_tx.send(t.local_token()).unwrap();
                t.connect(&addr_rx.recv().unwrap(), &mut Seen::default())
                    .unwrap();
                node1(t)
            })
        };
        let mut t = TcpTransport::bind(&config, &layout, 0, None, None).unwrap();
        let addrs: Vec<String> = [t.local_token(), port_rx.recv().unwrap()]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        addr_tx.send(addrs.clone()).unwrap();
        t.connect(&addrs, &mut Seen::default()).unwrap();
        (t, thread)
    }

    /// Two linked endpoints on loopback; node 0 ends its side with
    /// `finish` (orderly) or by dropping its transport (as a killed process
    /// does). Returns what node 1 saw of node 0, in order, until the close.
    fn node1_sees(orderly: bool) -> Vec<LinkEvent> {
        let (mut t, node1) = linked_pair(|mut t| {
            let mut events = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !events.iter().any(|e| matches!(e, LinkEvent::Closed { .. })) {
                assert!(Instant::now() < deadline, "no close seen: {events:?}");
                t.poll(Duration::from_millis(20), &mut Seen::default(), &mut events)
                    .unwrap();
            }
            events
        });
        if orderly {
            t.finish();
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut events = Vec::new();
            while !t.all_finished() {
                assert!(Instant::now() < deadline, "node 0 never finished");
                t.poll(Duration::from_millis(20), &mut Seen::default(), &mut events)
                    .unwrap();
            }
        }
        drop(t);
        node1.join().unwrap()
    }

    /// Each end of a link knows the other's process from its Hello (the
    /// connecting end from the answer, the accepting end from the opening
    /// Hello): here both are this running process, so each finds the other
    /// runnable, which a peer silent on a loaded host needs to be spared.
    #[test]
    fn each_end_knows_the_other_process_from_its_hello() {
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let (t, node1) = linked_pair(move |t| {
            let knows = t.peer_runnable(0);
            // Open until node 0 has read our answer.
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
            knows
        });
        let knows = t.peer_runnable(1);
        done_tx.send(()).unwrap();
        assert!(knows, "node 0 knows node 1's process");
        assert!(node1.join().unwrap(), "node 1 knows node 0's process");
    }

    /// The regression: a peer that finished before this node heard the
    /// EM's EndOfRun closed its connection, and that clean close was
    /// counted a loss. Its goodbye now says it finished, ahead of the close.
    #[test]
    fn an_orderly_finish_says_goodbye_before_the_close() {
        assert_eq!(
            node1_sees(true),
            vec![
                LinkEvent::Finished { peer: 0 },
                LinkEvent::Closed {
                    peer: 0,
                    error: None
                }
            ]
        );
    }

    /// A node (endpoint 0) and a consumer (endpoint 1) with an output
    /// network on 127.0.0.2: `wrong` tells the node the consumer's
    /// event-building address in place of its output one. Returns the
    /// node's transport (or its setup error).
    fn node_to_consumer(wrong: bool) -> Result<TcpTransport> {
        let overrides: Vec<String> = [
            "nodes.count=1",
            "event_builder.parallel_sends=1",
            "output.consumers=1",
            "output.bind=127.0.0.2",
            "transport.kind=tcp",
        ]
        .map(String::from)
        .to_vec();
        let config = Config::load(None, &overrides).unwrap();
        let layout = Layout::from_config(&config);
        let out = Some((SocketAddr::from(([127, 0, 0, 2], 0)), "output.bind"));
        // As `evb run` makes them: `127.0.0.1:PORT,OUT`.
        let addr = |t: &TcpTransport| {
            let token = t.local_token();
            let (port, out) = outnet::split_token(&token);
            format!("127.0.0.1:{port},{}", out.unwrap())
        };
        let (addr_tx, addr_rx) = mpsc::channel();
        let (peers_tx, peers_rx) = mpsc::channel::<Vec<String>>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        // The consumer waits for the node, and keeps its end open until the
        // node is set up; not joined when it is refused (it would wait out
        // the setup timeout).
        let consumer = {
            let (config, layout) = (config.clone(), layout.clone());
            std::thread::spawn(move || {
                let mut t1 = TcpTransport::bind(&config, &layout, 1, None, out).unwrap();
                addr_tx.send(addr(&t1)).unwrap();
                let r = t1.connect(&peers_rx.recv().unwrap(), &mut Seen::default());
                let _ = done_rx.recv_timeout(Duration::from_secs(10));
                (r.is_ok(), t1.output_network())
            })
        };
        let mut t0 = TcpTransport::bind(&config, &layout, 0, None, out).unwrap();
        let peers = vec![addr(&t0), addr_rx.recv().unwrap()];
        peers_tx.send(peers.clone()).unwrap();
        let mut told = peers.clone();
        if wrong {
            let eb = outnet::split_token(&peers[1]).0.to_string();
            told[1] = format!("{eb},{eb}");
        }
        t0.connect(&told, &mut Seen::default())?;
        done_tx.send(()).unwrap();
        let (ok, out1) = consumer.join().unwrap();
        assert!(ok);
        let out1 = out1.unwrap();
        assert_eq!(out1.links.len(), 1);
        assert_eq!(out1.links[0].peer, 0);
        Ok(t0)
    }

    #[test]
    fn a_consumer_link_runs_on_the_output_network() {
        let t0 = node_to_consumer(false).unwrap();
        let o = t0.output_network().unwrap();
        assert!(o.address.starts_with("127.0.0.2:"), "{o:?}");
        assert_eq!(o.links.len(), 1, "{o:?}");
        let l = &o.links[0];
        assert_eq!(l.peer, 1);
        // Dialed from the node's output address to the consumer's.
        assert!(l.local.starts_with("127.0.0.2:"), "{l:?}");
        assert!(l.remote.starts_with("127.0.0.2:"), "{l:?}");
        assert_ne!(l.local, o.address, "the node dialed: an ephemeral port");
    }

    #[test]
    fn a_consumer_link_dialed_on_the_event_building_network_is_refused() {
        let e = node_to_consumer(true).err().expect("refused");
        assert!(format!("{e:#}").contains("closed during setup"), "{e:#}");
    }

    /// A close with no goodbye (the process died) stays a bare close.
    #[test]
    fn a_close_without_goodbye_is_not_a_finish() {
        let events = node1_sees(false);
        assert!(
            matches!(&events[..], [LinkEvent::Closed { peer: 0, .. }]),
            "{events:?}"
        );
    }
}
