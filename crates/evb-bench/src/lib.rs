//! `evb-bench`: `evb bench`, transport micro-benchmarks and the transport
//! conformance checks; [`results`] turns the workers' results into the
//! tables, files and verdicts the command prints.
//!
//! A crate of its own: a benchmark is a launcher and workers of its own,
//! not an event builder; it uses the node's transports and address
//! exchange (`evb-node`, `evb-transport`) and nothing of `evb run`.
//!
//! `evb bench` starts one worker process per rank (`evb bench worker`),
//! hands them each other's addresses the way `evb run` does (`LISTEN` /
//! `PEERS` on stdio) and collects one `RESULT` JSON line from each. The
//! workers move fragments through the same [`Transport`] the event builder
//! uses, so the figures are those of evb's transport layer, not of a
//! separate code path:
//!
//! - `p2p`: rank 0 streams to rank 1 (both ways with `bidir`), a window of
//!   messages in flight, per message size; then a ping-pong for latency;
//! - `alltoall`: every rank sends to every other in shift order, without
//!   the Event Manager: the raw exchange;
//! - `conformance`: every rank sends a numbered, patterned message stream
//!   to every other; receivers check order and content; optionally one
//!   rank is slow (backpressure) or dies (dead-peer detection).
//!
//! A worker judges its peers as a node does, with the core's liveness
//! policy ([`evb_core::liveness::PeerWatch`]): heartbeats, the silence
//! timeout on the worker's own running clock, the grace of a peer starved
//! of CPU on this host.
//!
//! Between phases a worker sends an `EndOfRun` control message as a marker
//! (its meaning inside the benchmark only).

pub mod results;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use evb_core::config::Config;
use evb_core::liveness::{Beat, PeerWatch};
use evb_core::wire::{FragmentHeader, Message};
use evb_core::{Layout, Nanos, NodeId};
use serde::{Deserialize, Serialize};

use evb_control::lines::{LineError, ToLauncher, ToNode};
pub use evb_control::worker::{SizeResult, WorkerResult};
use evb_node::{open_transport, rendezvous, Control};
use evb_transport::mepbuf::MepBuf;
use evb_transport::{LinkEvent, RxHandler, Transport};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    P2p,
    Alltoall,
    Conformance,
}

/// What every worker is told (as JSON on its command line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchSpec {
    pub scenario: Scenario,
    pub transport: String,
    pub progress: String,
    pub ranks: u16,
    /// Message sizes (p2p, conformance) or the block size (alltoall: first).
    pub sizes: Vec<usize>,
    /// Messages in flight per sender.
    pub window: usize,
    /// Seconds per size (p2p) or in all (alltoall).
    pub seconds: f64,
    pub bidir: bool,
    /// Ping-pong round trips per size (p2p; 0: none).
    pub pingpong: usize,
    /// Conformance: messages each rank sends to each other rank.
    pub messages: u64,
    /// Conformance: this rank sleeps `slow_us` per message received.
    pub slow_rank: Option<u16>,
    pub slow_us: u64,
    /// Conformance: this rank kills itself after receiving `die_after`.
    pub die_rank: Option<u16>,
    pub die_after: u64,
    /// A peer silent this long is declared lost (ms). Scenarios that do
    /// not test a death raise it: on a starved 2-core machine a busy peer
    /// can go quiet for most of a second.
    #[serde(default = "default_peer_timeout_ms")]
    pub peer_timeout_ms: u64,
}

fn default_peer_timeout_ms() -> u64 {
    PEER_TIMEOUT_DEFAULT.as_millis() as u64
}

impl BenchSpec {
    pub fn new(scenario: Scenario, transport: &str) -> BenchSpec {
        BenchSpec {
            scenario,
            transport: transport.into(),
            progress: "blocking".into(),
            ranks: 2,
            sizes: (6..=22).map(|p| 1usize << p).collect(),
            window: 16,
            seconds: 0.5,
            bidir: false,
            pingpong: 200,
            messages: 1000,
            slow_rank: None,
            slow_us: 0,
            die_rank: None,
            die_after: 0,
            peer_timeout_ms: default_peer_timeout_ms(),
        }
    }

    /// The configuration the workers run their transport with.
    pub fn config(&self) -> Result<Config> {
        let biggest = self.sizes.iter().copied().max().unwrap_or(64).max(64);
        let overrides = vec![
            format!("transport.kind={}", self.transport),
            format!("transport.progress={}", self.progress),
            format!("nodes.count={}", self.ranks),
            "source.size=fixed".into(),
            "source.events_per_mep=1".into(),
            format!("source.mean_bytes={}", biggest - 4),
            format!(
                "event_builder.max_message_bytes={}",
                (biggest + 4096).max(1 << 20)
            ),
        ];
        Ok(Config::load(None, &overrides)?)
    }
}

const MARKER: Message = Message::EndOfRun { meps: 0 };
/// Heartbeats, and the judgement of silent peers, as often as a node's
/// by default (`transport.heartbeat_ms`).
const HEARTBEAT: Duration = Duration::from_millis(100);
const PEER_TIMEOUT_DEFAULT: Duration = Duration::from_millis(800);

/// Receive side of a worker.
struct Rx {
    rank: u16,
    pool: Vec<Vec<u8>>,
    /// Fragments from each peer: count, bytes, the next expected sequence.
    count: Vec<u64>,
    bytes: Vec<u64>,
    next_seq: Vec<u64>,
    markers: Vec<u64>,
    /// Fragments received from each peer before its latest marker.
    count_at_marker: Vec<u64>,
    first_rx: Option<Instant>,
    last_rx_data: Option<Instant>,
    /// Heartbeats and silent peers: the node's own policy
    /// ([`evb_core::liveness`]), on a clock that starts at `epoch`.
    watch: PeerWatch,
    epoch: Instant,
    /// Order errors by sender.
    order_errors: Vec<u64>,
    content_errors: u64,
    check_content: bool,
    slow_us: u64,
    die_after: Option<u64>,
}

impl RxHandler for Rx {
    fn on_alive(&mut self, peer: NodeId) {
        let now = self.now();
        self.watch.heard(now, peer);
    }

    fn on_control(&mut self, peer: NodeId, msg: Message) {
        if matches!(msg, Message::EndOfRun { .. }) {
            self.markers[peer as usize] += 1;
            self.count_at_marker[peer as usize] = self.count[peer as usize];
        }
    }

    fn admit(&mut self, _peer: NodeId, _header: &FragmentHeader) -> bool {
        true
    }

    fn spare_buffer(&mut self, min_len: usize) -> Vec<u8> {
        match self.pool.pop() {
            Some(b) if b.len() >= min_len => b,
            _ => vec![0; min_len],
        }
    }

    fn on_fragment(
        &mut self,
        peer: NodeId,
        h: FragmentHeader,
        crc: Option<u32>,
        buf: Vec<u8>,
        at: usize,
    ) {
        let p = peer as usize;
        let now = Instant::now();
        self.first_rx.get_or_insert(now);
        self.last_rx_data = Some(now);
        self.count[p] += 1;
        self.bytes[p] += u64::from(h.payload_len);
        let seq = h.mep & 0xffff_ffff_ffff;
        if seq != self.next_seq[p] {
            self.order_errors[p] += 1;
        }
        self.next_seq[p] = seq + 1;
        if self.check_content {
            let payload = &buf[at..at + h.payload_len as usize];
            let crc = crc.unwrap_or_else(|| evb_core::checksum::crc32c(payload));
            if crc != h.crc32c || payload != pattern(peer, seq, payload.len()).as_slice() {
                self.content_errors += 1;
            }
        }
        if self.pool.len() < 64 {
            self.pool.push(buf);
        }
        if self.slow_us > 0 {
            std::thread::sleep(Duration::from_micros(self.slow_us));
        }
        if let Some(n) = self.die_after {
            if self.count.iter().sum::<u64>() >= n {
                tracing::info!("evb bench worker {}: dying on purpose", self.rank);
                // SAFETY: signalling ourselves.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
            }
        }
    }
}

impl Rx {
    /// The receive side of worker `rank`, before anything arrived; its
    /// clock starts now.
    fn new(spec: &BenchSpec, rank: NodeId) -> Rx {
        let n = spec.ranks as usize;
        Rx {
            rank,
            pool: Vec::new(),
            count: vec![0; n],
            bytes: vec![0; n],
            next_seq: vec![0; n],
            markers: vec![0; n],
            first_rx: None,
            last_rx_data: None,
            watch: PeerWatch::new(
                spec.ranks,
                rank,
                HEARTBEAT.as_nanos() as Nanos,
                Duration::from_millis(spec.peer_timeout_ms.max(1)).as_nanos() as Nanos,
            ),
            epoch: Instant::now(),
            order_errors: vec![0; n],
            content_errors: 0,
            check_content: false,
            slow_us: if spec.slow_rank == Some(rank) {
                spec.slow_us
            } else {
                0
            },
            die_after: (spec.die_rank == Some(rank)).then_some(spec.die_after),
            count_at_marker: vec![0; n],
        }
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }
}

/// The bytes of message `seq` from `rank` (conformance).
fn pattern(rank: NodeId, seq: u64, len: usize) -> Vec<u8> {
    let mut x = (u64::from(rank) << 48) ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// CPU seconds (user, system) this process has spent.
fn cpu_seconds() -> (f64, f64) {
    evb_control::report::cpu_times()
}

struct Worker {
    rank: NodeId,
    ranks: u16,
    t: Box<dyn Transport>,
    rx: Rx,
    events: Vec<LinkEvent>,
    /// Sends queued or in flight per peer (fragments).
    outstanding: Vec<usize>,
    max_outstanding: usize,
    seq: Vec<u64>,
    lost: Vec<bool>,
    lost_report: Vec<(u16, f64)>,
    closed: Vec<bool>,
    finishing: bool,
}

impl Worker {
    fn pump(&mut self, timeout: Duration) -> Result<()> {
        self.t.poll(timeout, &mut self.rx, &mut self.events)?;
        self.t.flush(&mut self.events);
        for e in std::mem::take(&mut self.events) {
            match e {
                LinkEvent::SendDone(mep) => {
                    let p = (mep >> 48) as usize;
                    self.outstanding[p] = self.outstanding[p].saturating_sub(1);
                }
                // Rejoin is not enabled for benchmarks.
                LinkEvent::Joined { .. } => {}
                LinkEvent::Finished { peer } => {
                    self.closed[peer as usize] = true;
                    self.rx.watch.finished(peer);
                }
                LinkEvent::Closed { peer, error } => {
                    self.closed[peer as usize] = true;
                    self.rx.watch.finished(peer);
                    // Once we finished, a peer closing its end is expected.
                    if let (Some(e), false) = (error, self.finishing) {
                        self.declare_lost(peer, e);
                    }
                }
            }
        }
        let now = self.rx.now();
        if self.rx.watch.is_due(now) {
            // What the transport sees of the peers about to be judged
            // silent, as a node does: alive (bytes waiting unread, or
            // taking ours), or starved of CPU on this host.
            for p in self.rx.watch.silent_peers(now) {
                if self.t.peer_active(p) {
                    self.rx.watch.heard(now, p);
                } else if self.t.peer_runnable(p) {
                    self.rx.watch.starved(p);
                }
            }
            let mut beats = Vec::new();
            self.rx.watch.on_timeout(now, &mut beats);
            for beat in beats {
                match beat {
                    Beat::Heartbeat(p) => {
                        // Judged before our heartbeat is queued (see node.rs).
                        if self.t.peer_active(p) {
                            self.rx.watch.heard(now, p);
                        }
                        if !self.t.has_pending_tx(Some(p)) {
                            self.t.send_control(p, &Message::Heartbeat);
                        }
                    }
                    Beat::Silent { peer, silent_ns } => {
                        let silent = Duration::from_nanos(silent_ns);
                        self.declare_lost(peer, format!("silent for {silent:?}"));
                    }
                }
            }
        }
        Ok(())
    }

    fn declare_lost(&mut self, peer: NodeId, reason: String) {
        let p = peer as usize;
        if self.lost[p] {
            return;
        }
        self.lost[p] = true;
        self.rx.watch.lost(peer);
        let now = self.rx.now();
        let after = self.rx.watch.silent_for(now, peer).unwrap_or(0) as f64 * 1e-9;
        tracing::warn!(
            "evb bench worker {}: peer {peer} lost after {after:.3} s: {reason}",
            self.rank
        );
        self.lost_report.push((peer, after));
        let mut ev = Vec::new();
        self.t.drop_peer(peer, &mut ev);
        self.outstanding[p] = 0;
    }

    fn live(&self, p: NodeId) -> bool {
        p != self.rank && !self.lost[p as usize]
    }

    /// Sends one fragment of `data` to `to` with the next sequence number.
    fn send(&mut self, to: NodeId, data: &Rc<MepBuf>, crc: u32) -> bool {
        let seq = self.seq[to as usize];
        let header = FragmentHeader {
            run_id: 0,
            source: self.rank,
            flags: 0,
            mep: (u64::from(to) << 48) | seq,
            event_count: 1,
            payload_len: data.len() as u32,
            crc32c: crc,
        };
        if !self.t.send_fragment(to, &header, data.clone()) {
            return false;
        }
        self.seq[to as usize] += 1;
        self.outstanding[to as usize] += 1;
        self.max_outstanding = self.max_outstanding.max(self.outstanding[to as usize]);
        true
    }

    /// Waits until `cond` holds, pumping; fails after `limit`.
    fn wait_for(
        &mut self,
        limit: Duration,
        what: &str,
        cond: impl Fn(&Worker) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        while !cond(self) {
            if Instant::now() > deadline {
                bail!("worker {}: timed out waiting for {what}", self.rank);
            }
            self.pump(Duration::from_millis(5))?;
        }
        Ok(())
    }

    fn marker_to(&mut self, peers: &[NodeId]) {
        for &p in peers {
            self.t.send_control(p, &MARKER);
        }
    }

    fn p2p(&mut self, spec: &BenchSpec) -> Result<Vec<SizeResult>> {
        let peer = 1 - self.rank;
        let sending = self.rank == 0 || spec.bidir;
        let mut out = Vec::new();
        for (phase, &size) in spec.sizes.iter().enumerate() {
            let data = Rc::new(MepBuf::from_vec(vec![0xa5u8; size]));
            let crc = evb_core::checksum::crc32c(&data);
            self.rx.first_rx = None;
            self.rx.last_rx_data = None;
            let bytes_before = self.rx.bytes[peer as usize];
            let count_before = self.rx.count[peer as usize];
            let cpu0 = cpu_seconds();
            let start = Instant::now();
            let mut tx_bytes = 0u64;
            if sending {
                while start.elapsed().as_secs_f64() < spec.seconds {
                    while self.outstanding[peer as usize] < spec.window
                        && self.send(peer, &data, crc)
                    {
                        tx_bytes += size as u64;
                    }
                    // Wait only with a full window (then for a completion).
                    let full = self.outstanding[peer as usize] >= spec.window;
                    self.pump(if full {
                        Duration::from_millis(1)
                    } else {
                        Duration::ZERO
                    })?;
                }
                self.wait_for(Duration::from_secs(60), "send completions", |w| {
                    w.outstanding[peer as usize] == 0
                })?;
            }
            // Markers count phases: the peer's may have come long ago.
            self.marker_to(&[peer]);
            self.wait_for(Duration::from_secs(60), "the peer's phase marker", |w| {
                w.rx.markers[peer as usize] > phase as u64
            })?;
            let cpu1 = cpu_seconds();
            let (user, system) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
            let rx_bytes = self.rx.bytes[peer as usize] - bytes_before;
            let rx_count = self.rx.count[peer as usize] - count_before;
            // From the first arrival to the last: n - 1 messages' worth.
            let rx_seconds = match (self.rx.first_rx, self.rx.last_rx_data) {
                (Some(a), Some(b)) => (b - a).as_secs_f64(),
                _ => 0.0,
            };
            let counted = rx_bytes.saturating_sub(if rx_count > 0 { size as u64 } else { 0 });
            let rx_gbps = if rx_seconds > 0.0 {
                counted as f64 * 8.0 / rx_seconds / 1e9
            } else {
                0.0
            };
            let (p50, p99) = self.pingpong(spec, peer, &data, crc)?;
            out.push(SizeResult {
                size,
                rx_bytes,
                rx_seconds,
                rx_gbps,
                tx_bytes,
                cpu_s: user + system,
                cpu_user_s: user,
                cpu_system_s: system,
                latency_p50_us: p50,
                latency_p99_us: p99,
            });
        }
        Ok(out)
    }

    /// Rank 0 sends, rank 1 echoes; rank 0 records half round trips.
    fn pingpong(
        &mut self,
        spec: &BenchSpec,
        peer: NodeId,
        data: &Rc<MepBuf>,
        crc: u32,
    ) -> Result<(Option<f64>, Option<f64>)> {
        if spec.pingpong == 0 {
            return Ok((None, None));
        }
        let mut samples = Vec::with_capacity(spec.pingpong);
        // Counted from the marker that ended the bandwidth phase (messages
        // arrive in order, so nothing of that phase comes after it).
        let base = self.rx.count_at_marker[peer as usize];
        for i in 0..spec.pingpong as u64 {
            let t0 = Instant::now();
            if self.rank == 0 {
                self.send(peer, data, crc);
            }
            self.wait_for(Duration::from_secs(30), "a ping-pong message", |w| {
                w.rx.count[peer as usize] > base + i
            })?;
            if self.rank == 1 {
                self.send(peer, data, crc);
            } else {
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
        self.wait_for(Duration::from_secs(30), "ping-pong completions", |w| {
            w.outstanding[peer as usize] == 0
        })?;
        if samples.is_empty() {
            return Ok((None, None));
        }
        samples.sort_by(f64::total_cmp);
        let q = |f: f64| samples[((samples.len() - 1) as f64 * f).round() as usize];
        Ok((Some(q(0.5)), Some(q(0.99))))
    }

    fn alltoall(&mut self, spec: &BenchSpec) -> Result<Vec<SizeResult>> {
        let size = spec.sizes.first().copied().unwrap_or(1 << 20);
        let n = self.ranks;
        let data = Rc::new(MepBuf::from_vec(vec![0x3cu8; size]));
        let crc = evb_core::checksum::crc32c(&data);
        let others: Vec<NodeId> = (1..n).map(|k| (self.rank + k) % n).collect();
        let cpu0 = cpu_seconds();
        let start = Instant::now();
        let mut next = 0;
        let mut tx_bytes = 0u64;
        let total_window = spec.window.max(1);
        while start.elapsed().as_secs_f64() < spec.seconds {
            // Barrel shift: the next destination in turn, while the window allows.
            let mut stalled = 0;
            while self.outstanding.iter().sum::<usize>() < total_window && stalled < others.len() {
                let to = others[next % others.len()];
                next += 1;
                if self.live(to)
                    && self.outstanding[to as usize] < total_window
                    && self.send(to, &data, crc)
                {
                    tx_bytes += size as u64;
                    stalled = 0;
                } else {
                    stalled += 1;
                }
            }
            let full = self.outstanding.iter().sum::<usize>() >= total_window;
            self.pump(if full {
                Duration::from_millis(1)
            } else {
                Duration::ZERO
            })?;
        }
        self.wait_for(Duration::from_secs(60), "send completions", |w| {
            w.outstanding.iter().all(|&o| o == 0)
        })?;
        self.marker_to(&others);
        self.wait_for(Duration::from_secs(60), "every peer's marker", |w| {
            others
                .iter()
                .all(|&p| w.rx.markers[p as usize] > 0 || w.lost[p as usize])
        })?;
        let rx_bytes: u64 = self.rx.bytes.iter().sum();
        let rx_seconds = start.elapsed().as_secs_f64();
        let cpu1 = cpu_seconds();
        let (user, system) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
        Ok(vec![SizeResult {
            size,
            rx_bytes,
            rx_seconds,
            rx_gbps: rx_bytes as f64 * 8.0 / rx_seconds / 1e9,
            tx_bytes,
            cpu_s: user + system,
            cpu_user_s: user,
            cpu_system_s: system,
            latency_p50_us: None,
            latency_p99_us: None,
        }])
    }

    fn conformance(&mut self, spec: &BenchSpec) -> Result<()> {
        self.rx.check_content = true;
        let others: Vec<NodeId> = (0..self.ranks).filter(|&p| p != self.rank).collect();
        let sizes = if spec.sizes.is_empty() {
            vec![64]
        } else {
            spec.sizes.clone()
        };
        let mut sent = vec![0u64; self.ranks as usize];
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut progress = false;
            for &p in &others {
                let pi = p as usize;
                if !self.live(p) || sent[pi] >= spec.messages || self.outstanding[pi] >= spec.window
                {
                    continue;
                }
                let seq = self.seq[pi];
                let size = sizes[(seq as usize) % sizes.len()];
                let data = Rc::new(MepBuf::from_vec(pattern(self.rank, seq, size)));
                let crc = evb_core::checksum::crc32c(&data);
                if self.send(p, &data, crc) {
                    sent[pi] += 1;
                    progress = true;
                }
            }
            // A peer that closed before sending everything died (a killed
            // process's socket closes as cleanly as a finished one's).
            for &p in &others {
                let pi = p as usize;
                if self.closed[pi] && !self.lost[pi] && self.rx.count[pi] < spec.messages {
                    self.declare_lost(p, "closed before sending everything".into());
                }
            }
            let all_sent = others
                .iter()
                .all(|&p| !self.live(p) || sent[p as usize] >= spec.messages);
            let all_received = others
                .iter()
                .all(|&p| !self.live(p) || self.rx.count[p as usize] >= spec.messages);
            let all_done = others
                .iter()
                .all(|&p| !self.live(p) || self.outstanding[p as usize] == 0);
            if all_sent && all_received && all_done {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "worker {}: conformance exchange did not finish within 120 s",
                    self.rank
                );
            }
            self.pump(if progress {
                Duration::ZERO
            } else {
                Duration::from_millis(2)
            })?;
        }
    }

    /// Orderly end: tell every peer, wait for theirs (bounded).
    fn finish(&mut self) -> bool {
        self.finishing = true;
        self.rx.watch.stop();
        self.t.finish();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.t.all_finished() {
            if Instant::now() > deadline {
                return false;
            }
            if self.pump(Duration::from_millis(5)).is_err() {
                return false;
            }
        }
        true
    }
}

/// `evb bench worker`: one rank of a benchmark, driven over stdio.
///
/// Under a cluster launcher (`launcher_dir`: Some), the rank comes from the
/// caller, addresses go through that directory (or MPI itself) and the
/// result is written to `DIR/result-<rank>.json`.
pub fn run_worker(
    spec: &BenchSpec,
    rank: NodeId,
    launcher_dir: Option<&std::path::Path>,
) -> Result<()> {
    let config = spec.config()?;
    let layout = Layout::from_config(&config);
    let control = if launcher_dir.is_some() {
        Control::Launcher
    } else {
        Control::Stdio
    };
    let mut t = open_transport(&config, &layout, rank, control, None)?;
    let peers = match launcher_dir {
        None => rendezvous(&config, &layout, rank, Control::Stdio, t.as_ref())?,
        Some(_) if config.transport.kind.on_node() == evb_transport::TransportKind::Mpi => (0
            ..spec.ranks)
            .map(|r| evb_transport::msg::to_hex(&i32::from(r).to_le_bytes()))
            .collect(),
        Some(dir) => {
            let mut token = t.local_token();
            if token.parse::<u16>().is_ok() {
                token = format!("{}:{token}", config.transport.bind);
            }
            evb_control::cluster::exchange_tokens(
                dir,
                0,
                rank,
                spec.ranks,
                &token,
                Duration::from_secs(60),
            )?
        }
    };
    let n = spec.ranks as usize;
    let mut rx = Rx::new(spec, rank);
    t.connect(&peers, &mut rx)
        .with_context(|| format!("setting up the {} transport", t.name()))?;
    // Silence counts from the end of the setup; the first heartbeat and
    // judgement a period later.
    let now = rx.now();
    rx.watch.start(now);
    let mut w = Worker {
        rank,
        ranks: spec.ranks,
        t,
        rx,
        events: Vec::new(),
        outstanding: vec![0; n],
        max_outstanding: 0,
        seq: vec![0; n],
        lost: vec![false; n],
        lost_report: Vec::new(),
        closed: vec![false; n],
        finishing: false,
    };
    let sizes = match spec.scenario {
        Scenario::P2p => w.p2p(spec)?,
        Scenario::Alltoall => w.alltoall(spec)?,
        Scenario::Conformance => {
            w.conformance(spec)?;
            Vec::new()
        }
    };
    let finished_clean = w.finish();
    let result = WorkerResult {
        rank,
        transport: w.t.name(),
        sizes,
        received_from: w.rx.count.clone(),
        order_errors: (0..n)
            .filter(|&p| !w.lost[p])
            .map(|p| w.rx.order_errors[p])
            .sum(),
        content_errors: w.rx.content_errors,
        lost_peers: w.lost_report.clone(),
        finished_clean,
        max_outstanding: w.max_outstanding,
    };
    if let Some(dir) = launcher_dir {
        let line = serde_json::to_string(&result)?;
        let path = dir.join(format!("result-{rank}.json"));
        std::fs::write(&path, &line).with_context(|| format!("writing {}", path.display()))?;
    }
    print!("{}", ToLauncher::Result(Box::new(result)).encode());
    std::io::stdout().flush()?;
    // The transport (MPI in particular) is finalised before the process ends.
    drop(w);
    Ok(())
}

/// Starts `spec.ranks` workers of `exe` and collects their results, by
/// rank; `None` for a worker that died without one.
pub fn launch(
    exe: &std::path::Path,
    spec: &BenchSpec,
    limit: Duration,
) -> Result<Vec<Option<WorkerResult>>> {
    let json = serde_json::to_string(spec)?;
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..spec.ranks {
        let child = Command::new(exe)
            .args([
                "bench",
                "worker",
                "--rank",
                &rank.to_string(),
                "--spec",
                &json,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        children.push(child);
    }
    let result = collect(&mut children, spec, limit);
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    result
}

fn collect(
    children: &mut [Child],
    spec: &BenchSpec,
    limit: Duration,
) -> Result<Vec<Option<WorkerResult>>> {
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Option<String>)>();
    for (rank, c) in children.iter_mut().enumerate() {
        let out = c.stdout.take().expect("piped");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send((rank, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((rank, None));
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let n = children.len();
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut results: Vec<Option<WorkerResult>> = vec![None; n];
    let mut ended = vec![false; n];
    let mut peers_sent = false;
    while ended.iter().any(|e| !e) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rank, line) = rx.recv_timeout(left).map_err(|_| {
            anyhow!(
                "the {:?} benchmark did not finish within {limit:?}",
                spec.scenario
            )
        })?;
        let Some(line) = line else {
            ended[rank] = true;
            if !peers_sent && tokens[rank].is_none() {
                bail!("worker {rank} exited during setup (see its messages above)");
            }
            continue;
        };
        match ToLauncher::parse(&line) {
            Ok(ToLauncher::Listen(t)) => {
                tokens[rank] = Some(t);
                if !peers_sent && tokens.iter().all(Option::is_some) {
                    let list: Vec<String> = tokens
                        .iter()
                        .map(|t| {
                            let t = t.clone().expect("all known");
                            match t.parse::<u16>() {
                                Ok(port) => format!("127.0.0.1:{port}"),
                                Err(_) => t,
                            }
                        })
                        .collect();
                    let line = ToNode::Peers(list).encode();
                    for c in children.iter_mut() {
                        let s = c.stdin.as_mut().expect("piped");
                        s.write_all(line.as_bytes())?;
                        s.flush()?;
                    }
                    peers_sent = true;
                }
            }
            Ok(ToLauncher::Result(r)) => results[rank] = Some(*r),
            Err(e @ LineError::Json { tag: "RESULT", .. }) => {
                return Err(anyhow::Error::new(e).context("a worker's RESULT line"))
            }
            Ok(ToLauncher::Stats(_) | ToLauncher::Final(_)) | Err(_) => {
                tracing::info!("worker {rank}: {line}")
            }
        }
    }
    Ok(results)
}
