//! TCP: one connection per pair of endpoints, driven by a mio poll.
//!
//! Setup is blocking and simple: the lower rank connects to the higher and
//! opens with a Hello; the accepting side answers with its own Hello once
//! it is set up, which is the start barrier. During the run everything is
//! non-blocking. A folded node with `local = "nic"` also connects to
//! itself: it sends on the socket it opened and receives on the one it
//! accepted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream as StdTcpStream, ToSocketAddrs};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use evb_core::config::Config;
use evb_core::wire::{FragmentHeader, Message, FRAME_HEADER_LEN};
use evb_core::{Layout, MepId, NodeId};
use mio::{Events, Interest, Poll, Token};

use super::auth::{self, MAC_LEN, NONCE_LEN};
use super::tcp_conn::{Conn, RxStatus};
use super::{linked_peers, LinkEvent, RxHandler, Transport};

const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an accepted connection may take to say Hello: a stranger that
/// connects and stays silent must not hold up the setup.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Reads per connection per poll (a fragment takes about three).
const READ_STEPS: usize = 96;
/// Writes that progressed this recently show the peer is taking data.
const TX_PROGRESS_ALIVE: Duration = Duration::from_millis(300);

pub struct TcpTransport {
    rank: NodeId,
    run_id: u32,
    endpoints: u16,
    linked: Vec<NodeId>,
    listener: Option<TcpListener>,
    poll: Poll,
    events: Events,
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

impl TcpTransport {
    /// Binds the listening socket: on `listen` if given (a fixed address
    /// from the config), else on `transport.bind` with a port the OS picks.
    pub fn bind(
        config: &Config,
        layout: &Layout,
        rank: NodeId,
        listen: Option<SocketAddr>,
    ) -> Result<TcpTransport> {
        let bind = config.transport.bind.as_str();
        let port = listen.map(|a| a.port()).unwrap_or(0);
        let listener = TcpListener::bind((bind, port))
            .with_context(|| format!("binding to transport.bind = {bind}, port {port}"))?;
        Ok(TcpTransport {
            rank,
            run_id: config.run.run_id,
            endpoints: layout.endpoints,
            linked: linked_peers(config, layout, rank),
            listener: Some(listener),
            poll: Poll::new()?,
            events: Events::with_capacity(256),
            conns: Vec::new(),
            tx_conn: vec![None; layout.endpoints as usize],
            awaiting_hello: Vec::new(),
            max_body: super::max_body_bytes(config),
            socket_buffer_bytes: config.transport.socket_buffer_bytes,
            finished: false,
            key: auth::load_key(&config.transport.run_key_file)?,
            more_to_read: Vec::new(),
        })
    }

    fn hello(&self) -> Vec<u8> {
        let mut hello = Vec::new();
        Message::Hello {
            run_id: self.run_id,
            node: self.rank,
            nodes: self.endpoints,
        }
        .encode_into(&mut hello);
        hello
    }

    fn open_links(&mut self, addrs: &[SocketAddr]) -> Result<()> {
        let listener = self.listener.take().expect("connect runs once");
        let deadline = Instant::now() + SETUP_TIMEOUT;
        let me = self.rank;
        let hello = self.hello();
        let mut opened: Vec<(StdTcpStream, Option<NodeId>)> = Vec::new();
        // Connections whose handshake already included the peer's answer.
        let mut answered = Vec::new();
        let self_nonce = auth::nonce();
        for &peer in self.linked.iter().filter(|&&p| p >= me) {
            let addr = addrs[peer as usize];
            let mut s = connect_retry(addr, deadline)
                .with_context(|| format!("connecting to endpoint {peer} at {addr}"))?;
            s.write_all(&hello)?;
            if let Some(key) = &self.key {
                if peer == me {
                    // Our own acceptor checks this nonce: only we know it.
                    s.write_all(&self_nonce)?;
                } else {
                    self.prove_as_connector(&mut s, key, peer, deadline)
                        .with_context(|| {
                            format!("run-key handshake with endpoint {peer} at {addr}")
                        })?;
                    answered.push(opened.len());
                }
            }
            opened.push((s, Some(peer)));
        }
        let outgoing = opened.len();
        let expected_accepts = self.linked.iter().filter(|&&p| p <= me).count();
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
                    let checked = read_hello(&s, self.run_id, self.endpoints).and_then(|peer| {
                        match &self.key {
                            Some(key) => {
                                self.check_as_acceptor(&s, key, peer, &hello, &self_nonce)?
                            }
                            // The answer: tells the peer we are set up (not
                            // on the receive-only self-link).
                            None if peer != me => (&s).write_all(&hello)?,
                            None => {}
                        }
                        Ok(peer)
                    });
                    match checked {
                        Ok(peer) => {
                            // With another node the accepted socket carries
                            // both directions; the self-link only receives.
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
        for (i, (s, peer)) in opened.into_iter().enumerate() {
            s.set_read_timeout(None)?;
            s.set_nodelay(true)?;
            if self.socket_buffer_bytes > 0 {
                set_socket_buffers(&s, self.socket_buffer_bytes);
            }
            s.set_nonblocking(true)?;
            let mut stream = mio::net::TcpStream::from_std(s);
            self.poll.registry().register(
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
            let mut conn = Conn::new(stream, rx_peer, self.max_body);
            conn.hello_seen = answered.contains(&i);
            self.conns.push(conn);
        }
        Ok(())
    }

    /// Connecting side of the run-key handshake (after our Hello).
    fn prove_as_connector(
        &self,
        s: &mut StdTcpStream,
        key: &[u8],
        peer: NodeId,
        deadline: Instant,
    ) -> Result<()> {
        let nonce_c = auth::nonce();
        s.write_all(&nonce_c)?;
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        let answered = read_hello(s, self.run_id, self.endpoints).context("reading the answer")?;
        if answered != peer {
            bail!("endpoint {peer}'s address answered as endpoint {answered}");
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
        Ok(())
    }

    /// Accepting side: the peer's Hello was read; answer and check its proof.
    fn check_as_acceptor(
        &self,
        s: &StdTcpStream,
        key: &[u8],
        peer: NodeId,
        hello: &[u8],
        self_nonce: &[u8; NONCE_LEN],
    ) -> Result<()> {
        let mut nonce_c = [0u8; NONCE_LEN];
        (&*s)
            .read_exact(&mut nonce_c)
            .context("reading the nonce")?;
        if peer == self.rank {
            if &nonce_c != self_nonce {
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
            match self.conns[i].read_ready(handler, READ_STEPS) {
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
        let port = self
            .listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port())
            .unwrap_or(0);
        port.to_string()
    }

    fn connect(&mut self, peers: &[String], handler: &mut dyn RxHandler) -> Result<()> {
        let addrs = peers
            .iter()
            .map(|a| {
                a.to_socket_addrs()
                    .with_context(|| format!("cannot resolve endpoint address `{a}`"))?
                    .next()
                    .ok_or_else(|| anyhow!("endpoint address `{a}` has no address"))
            })
            .collect::<Result<Vec<_>>>()?;
        if addrs.len() != self.endpoints as usize {
            bail!("{} addresses for {} endpoints", addrs.len(), self.endpoints);
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

    fn send_fragment(&mut self, to: NodeId, header: &FragmentHeader, data: Rc<Vec<u8>>) -> bool {
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
        let timeout = if events.len() > before || !self.more_to_read.is_empty() {
            Duration::ZERO
        } else {
            timeout
        };
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        self.read_events(handler, events);
        self.flush(events);
        Ok(())
    }

    fn flush(&mut self, events: &mut Vec<LinkEvent>) {
        let mut completed: Vec<MepId> = Vec::new();
        let mut failed = Vec::new();
        for (i, c) in self.conns.iter_mut().enumerate() {
            if !c.closed && c.has_pending_tx() {
                if let Err(e) = c.flush(&mut completed) {
                    failed.push((i, e.to_string()));
                }
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
        for c in &mut self.conns {
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
            c.write_shut = true;
        }
    }

    fn all_finished(&self) -> bool {
        self.conns.iter().all(|c| c.closed)
    }
}

fn connect_retry(addr: SocketAddr, deadline: Instant) -> Result<StdTcpStream> {
    let mut delay = Duration::from_millis(5);
    loop {
        match StdTcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
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
fn read_hello(mut s: &StdTcpStream, run_id: u32, endpoints: u16) -> Result<NodeId> {
    let mut buf = [0u8; FRAME_HEADER_LEN + 8];
    s.read_exact(&mut buf).context("reading Hello")?;
    let (msg, _) =
        evb_core::wire::decode_stream(&buf, 64)?.ok_or_else(|| anyhow!("short Hello"))?;
    check_hello(&msg, run_id, endpoints)
}

/// The peer a Hello names, if it belongs to this run.
pub(crate) fn check_hello(msg: &Message, run_id: u32, endpoints: u16) -> Result<NodeId> {
    match *msg {
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
