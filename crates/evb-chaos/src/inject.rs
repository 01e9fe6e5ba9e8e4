//! Doing the faults `evb run` does not do itself, and watching the run:
//! an [`evb_launch::RunObserver`] called from the launcher's loop. The
//! network faults are nftables rules and a tbf qdisc on the loopback of
//! the run's own network namespace ([`crate::sandbox`]), the store fills
//! up (its tmpfs shrunk to what it holds), strangers are threads that connect to the
//! nodes' listening ports. The watch records the built and lost events as
//! the nodes report them, each process's file descriptors and resident
//! memory, and whether every metrics endpoint answers.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use evb_core::Layout;
use evb_launch::{RunObserver, RunView};

use crate::schedule::{Fault, Kind};

/// What the run looked like, sampled throughout.
#[derive(Debug, Default, Clone)]
pub struct Watched {
    /// (seconds, events built so far by every BU, events incomplete or
    /// lost so far), at every pass of the launcher's loop.
    pub series: Vec<(f64, u64, u64)>,
    /// Per endpoint: (seconds, open file descriptors, resident bytes),
    /// about once a second.
    pub resources: Vec<Vec<(f64, u64, u64)>>,
    /// Metrics requests that got no answer: (seconds, rank, port, what).
    pub metrics_failures: Vec<(f64, u16, u16, String)>,
    /// Metrics requests answered.
    pub metrics_answers: u64,
    /// Faults this observer could not carry out (a missing tool, no
    /// listening port), with the reason: not violations, but said.
    pub not_done: Vec<(Fault, String)>,
    /// The time each fault was actually started (launcher time).
    pub started: HashMap<usize, f64>,
}

/// The observer of one chaos run.
pub struct Injector {
    faults: Vec<Fault>,
    /// Indices of faults started, and ended.
    begun: BTreeSet<usize>,
    ended: BTreeSet<usize>,
    /// Per active network fault: the nftables set of ports it cuts.
    cut_sets: HashMap<usize, String>,
    cut_ports: HashMap<usize, BTreeSet<u16>>,
    rules: HashMap<usize, Vec<u64>>,
    net_ready: bool,
    /// Where the store is (a file system of its own) for `store-full`.
    store_dir: Option<PathBuf>,
    /// `store-full` faults in force (the store is back to its size when
    /// the last ends).
    store_full: BTreeSet<usize>,
    metrics_base: Option<u16>,
    poller: Option<Arc<Mutex<Poll>>>,
    last_resources: Option<Instant>,
    pub watched: Watched,
    epm: u64,
    layout: Option<Layout>,
}

/// What the metrics poller thread is asked, and what it found.
#[derive(Default)]
struct Poll {
    /// The ports to ask now (rank, port); the launcher's loop updates it.
    ports: Vec<(u16, u16)>,
    elapsed_at: Option<(Instant, f64)>,
    failures: Vec<(f64, u16, u16, String)>,
    answers: u64,
    stop: bool,
}

impl Injector {
    pub fn new(
        faults: Vec<Fault>,
        store_dir: Option<PathBuf>,
        metrics_base: Option<u16>,
        net: bool,
    ) -> Injector {
        Injector {
            faults,
            begun: BTreeSet::new(),
            ended: BTreeSet::new(),
            cut_sets: HashMap::new(),
            cut_ports: HashMap::new(),
            rules: HashMap::new(),
            net_ready: !net,
            store_dir,
            store_full: BTreeSet::new(),
            metrics_base,
            poller: None,
            last_resources: None,
            watched: Watched::default(),
            epm: 0,
            layout: None,
        }
    }

    /// Ends whatever is still in force (the run is over) and returns what
    /// was watched.
    pub fn finish(mut self) -> Watched {
        let open: Vec<usize> = self.begun.difference(&self.ended).copied().collect();
        for i in open {
            self.end(i);
        }
        if self.cut_sets.is_empty() && self.net_ready {
            let _ = nft(&["delete", "table", "inet", "evbchaos"]);
        }
        let _ = tc_del();
        if let Some(p) = &self.poller {
            let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
            p.stop = true;
            self.watched.metrics_failures = std::mem::take(&mut p.failures);
            self.watched.metrics_answers = p.answers;
        }
        self.watched
    }

    fn start(&mut self, i: usize, view: &RunView<'_>) {
        let f = self.faults[i];
        self.watched.started.insert(i, view.elapsed_s);
        let result = match f.kind {
            k if k.is_process() => Ok(()), // the launcher's own
            Kind::LinkDown | Kind::Loss => self.start_cut(i, &f, view),
            Kind::Rate => tc_rate(f.param),
            Kind::StoreFull => self.fill_store(i),
            _ => self.start_stranger(&f, view),
        };
        if let Err(e) = result {
            tracing::warn!("evb chaos: {f} not done: {e}");
            self.watched.not_done.push((f, e));
        }
    }

    fn end(&mut self, i: usize) {
        self.ended.insert(i);
        let f = self.faults[i];
        match f.kind {
            Kind::LinkDown | Kind::Loss => {
                for h in self.rules.remove(&i).unwrap_or_default() {
                    let _ = nft(&[
                        "delete",
                        "rule",
                        "inet",
                        "evbchaos",
                        "out",
                        "handle",
                        &h.to_string(),
                    ]);
                }
                if let Some(set) = self.cut_sets.remove(&i) {
                    let _ = nft(&["delete", "set", "inet", "evbchaos", &set]);
                }
                self.cut_ports.remove(&i);
            }
            Kind::Rate => {
                let _ = tc_del();
            }
            Kind::StoreFull => self.end_store_full(i),
            _ => {}
        }
    }

    fn ensure_table(&mut self) -> Result<(), String> {
        if self.net_ready {
            return Ok(());
        }
        nft(&["add", "table", "inet", "evbchaos"])?;
        nft(&[
            "add",
            "chain",
            "inet",
            "evbchaos",
            "out",
            "{ type filter hook output priority 0; }",
        ])?;
        self.net_ready = true;
        Ok(())
    }

    /// `link-down` and `loss` of endpoint `target`: its TCP ports (but its
    /// metrics port) in a set, and rules that drop (some of) the packets
    /// from or to them. Ports it opens later are added as they appear.
    fn start_cut(&mut self, i: usize, f: &Fault, view: &RunView<'_>) -> Result<(), String> {
        self.ensure_table()?;
        let set = format!("cut{i}");
        nft(&[
            "add",
            "set",
            "inet",
            "evbchaos",
            &set,
            "{ type inet_service; }",
        ])?;
        self.cut_sets.insert(i, set.clone());
        let odds = if f.kind == Kind::Loss {
            format!("numgen random mod 100 < {} ", f.param.min(100))
        } else {
            String::new()
        };
        let mut handles = Vec::new();
        for dir in ["sport", "dport"] {
            let rule = format!("tcp {dir} @{set} {odds}drop");
            let mut args = vec![
                "--echo", "--handle", "add", "rule", "inet", "evbchaos", "out",
            ];
            args.extend(rule.split(' '));
            let out = nft(&args)?;
            let handle = out
                .split("# handle ")
                .nth(1)
                .and_then(|h| {
                    let digits: String = h.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse::<u64>().ok()
                })
                .ok_or_else(|| format!("nft printed no handle: {}", out.trim()))?;
            handles.push(handle);
        }
        self.rules.insert(i, handles);
        self.cut_ports.insert(i, BTreeSet::new());
        self.refresh_cut(i, view);
        Ok(())
    }

    fn refresh_cut(&mut self, i: usize, view: &RunView<'_>) {
        let f = self.faults[i];
        let Some(rank) = f.target else { return };
        let Some(&pid) = view.pids.get(usize::from(rank)) else {
            return;
        };
        let metrics = self.metrics_base.map(|b| b + rank);
        let ports: Vec<u16> = tcp_sockets(pid)
            .into_iter()
            .map(|s| s.local_port)
            .filter(|&p| Some(p) != metrics)
            .collect();
        let known = self.cut_ports.entry(i).or_default();
        let new: Vec<String> = ports
            .into_iter()
            .filter(|p| known.insert(*p))
            .map(|p| p.to_string())
            .collect();
        if new.is_empty() {
            return;
        }
        let set = &self.cut_sets[&i];
        let elements = format!("{{ {} }}", new.join(", "));
        let _ = nft(&["add", "element", "inet", "evbchaos", set, &elements]);
    }

    /// `store-full`: the store's tmpfs shrunk to what it holds (every free
    /// byte gone) until the fault ends, in place and at once. (It was a
    /// ballast file taking every free byte: this runs in the launcher's
    /// loop, which stamps the nodes' reports with the time it reads them,
    /// and filling the 512 MiB took 1-2 s on a loaded machine (a tmpfs
    /// refuses a fallocate of its every free byte, after allocating and
    /// freeing them all, then 1 MiB writes filled it): the reports were
    /// read late, so nothing seemed built for 1.5-2 s after a 0.33 s
    /// store-full, then everything at once: `evb chaos -t tcp -d 12
    /// --faults 'store-full:@9.67+0.33'`, "the run did not come back",
    /// while the nodes' own metrics, polled meanwhile, showed the rate
    /// steady throughout.)
    fn fill_store(&mut self, i: usize) -> Result<(), String> {
        let dir = self
            .store_dir
            .as_ref()
            .ok_or("no store file system of its own")?;
        // What it holds grows meanwhile (the consumers write): asked again
        // until the size set is not below it.
        let mut last = String::new();
        for _ in 0..50 {
            let used = used_bytes(dir).ok_or("statvfs failed")?;
            match crate::sandbox::resize_store(dir, Some(used.max(4096))) {
                Ok(()) => {
                    self.store_full.insert(i);
                    return Ok(());
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!("resizing the store's tmpfs: {last}"))
    }

    /// The end of `store-full` `i`: the store back to its size once no
    /// other is in force.
    fn end_store_full(&mut self, i: usize) {
        if !(self.store_full.remove(&i) && self.store_full.is_empty()) {
            return;
        }
        if let Some(dir) = &self.store_dir {
            if let Err(e) = crate::sandbox::resize_store(dir, None) {
                tracing::warn!("evb chaos: the store back to its size: {e}");
            }
        }
    }

    fn start_stranger(&self, f: &Fault, view: &RunView<'_>) -> Result<(), String> {
        let rank = f.target.ok_or("no target")?;
        let pid = *view.pids.get(usize::from(rank)).ok_or("no such endpoint")?;
        let mut listening: Vec<u16> = tcp_sockets(pid)
            .into_iter()
            .filter(|s| s.listening)
            .map(|s| s.local_port)
            .collect();
        listening.sort_unstable();
        listening.dedup();
        // The node's own port (tcp: its address) for the handshake attacks.
        let node_port = |r: u16| -> Option<u16> {
            let token = view.peers.get(usize::from(r))?;
            let addr = token.split(',').next()?;
            addr.rsplit_once(':')?.1.parse().ok()
        };
        let run_id = view.config.run.run_id;
        let endpoints = view.peers.len() as u16;
        let hold = Duration::from_secs_f64(f.dur_s);
        let attack: Box<dyn FnOnce() + Send> = match f.kind {
            Kind::Stranger | Kind::Garbage => {
                if listening.is_empty() {
                    return Err(format!("endpoint {rank} has no listening TCP port"));
                }
                let port = listening[f.param as usize % listening.len()];
                let garbage = f.kind == Kind::Garbage;
                let seed = u64::from(port) ^ (f.at_s * 1000.0) as u64;
                Box::new(move || stranger(port, garbage, seed, hold))
            }
            Kind::WrongKey | Kind::HelloTruncated => {
                let port = node_port(rank).ok_or("the node has no TCP port (not tcp)")?;
                let claim = (rank + 1) % endpoints.max(1);
                let truncated = f.kind == Kind::HelloTruncated;
                Box::new(move || wrong_key(port, run_id, claim, endpoints, truncated, hold))
            }
            Kind::HelloReplayed => {
                let from = node_port(rank).ok_or("the node has no TCP port (not tcp)")?;
                let to = node_port(f.param as u16).ok_or("no TCP port to replay to")?;
                Box::new(move || replay_hello(from, to, run_id, endpoints, hold))
            }
            _ => return Ok(()),
        };
        std::thread::spawn(attack);
        Ok(())
    }

    fn sample(&mut self, view: &RunView<'_>) {
        let layout = self
            .layout
            .get_or_insert_with(|| Layout::from_config(view.config));
        self.epm = u64::from(view.config.source.events_per_mep);
        let em = usize::from(layout.em);
        let reports = view.latest.iter().chain(view.earlier_reports);
        let (mut built, mut lost) = (0u64, 0u64);
        for r in reports {
            built += r.events_built;
            lost += r.events_incomplete;
            if usize::from(r.node) == em {
                lost += (r.em_meps_lost_bu_gone + r.em_meps_lost_no_bu) * self.epm;
            }
        }
        let last = self.watched.series.last().copied();
        if last.is_none_or(|(_, b, l)| b != built || l != lost) {
            self.watched.series.push((view.elapsed_s, built, lost));
        }
        if self
            .last_resources
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.last_resources = Some(Instant::now());
            self.watched.resources.resize(view.pids.len(), Vec::new());
            for (rank, &pid) in view.pids.iter().enumerate() {
                if !view.open[rank] {
                    continue;
                }
                if let Some((fds, rss)) = fds_and_rss(pid) {
                    self.watched.resources[rank].push((view.elapsed_s, fds, rss));
                }
            }
        }
    }

    /// Hands the poller the metrics ports of the endpoints that should
    /// answer now: running, not stopped, not killed, and not within a
    /// second of a restart.
    fn update_poll(&mut self, view: &RunView<'_>) {
        let Some(base) = self.metrics_base else {
            return;
        };
        let poll = self
            .poller
            .get_or_insert_with(|| {
                let p = Arc::new(Mutex::new(Poll::default()));
                let q = p.clone();
                std::thread::spawn(move || poll_metrics(&q));
                p
            })
            .clone();
        let t = view.elapsed_s;
        let quiet = |rank: u16| {
            self.faults.iter().any(|f| {
                f.kind.is_process()
                    && f.target == Some(rank)
                    && t >= f.at_s - 0.3
                    && t <= f.end_s() + 2.0
            }) || view
                .finals
                .get(usize::from(rank))
                .is_some_and(Option::is_some)
        };
        let ports = (0..view.pids.len() as u16)
            .filter(|&r| view.open[usize::from(r)] && !quiet(r))
            .map(|r| (r, base + r))
            .collect();
        let mut p = poll.lock().unwrap_or_else(|e| e.into_inner());
        p.ports = ports;
        p.elapsed_at = Some((Instant::now(), t));
    }
}

impl RunObserver for Injector {
    fn tick(&mut self, view: &RunView<'_>) {
        let t = view.elapsed_s;
        for i in 0..self.faults.len() {
            let f = self.faults[i];
            if !self.begun.contains(&i) && t >= f.at_s {
                self.begun.insert(i);
                self.start(i, view);
            }
            if self.begun.contains(&i) && !self.ended.contains(&i) {
                if t >= f.end_s() {
                    self.end(i);
                } else if self.cut_sets.contains_key(&i) {
                    self.refresh_cut(i, view);
                }
            }
        }
        self.sample(view);
        self.update_poll(view);
    }
}

fn nft(args: &[&str]) -> Result<String, String> {
    let out = Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| format!("nft: {e} (scripts/setup.sh installs nftables)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn tc_rate(mbit: u32) -> Result<(), String> {
    let rate = format!("{mbit}mbit");
    let out = Command::new("tc")
        .args([
            "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", &rate,
        ])
        .args(["burst", "256kb", "latency", "100ms"])
        .output()
        .map_err(|e| format!("tc: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "tc: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn tc_del() -> std::io::Result<std::process::Output> {
    Command::new("tc")
        .args(["qdisc", "del", "dev", "lo", "root"])
        .output()
}

/// Bytes in use in the file system of `dir`.
fn used_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs into a zeroed struct we own, with a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| (st.f_blocks - st.f_bfree) * st.f_frsize)
}

/// One TCP socket of a process.
#[derive(Debug, Clone, Copy)]
pub struct Socket {
    pub local_port: u16,
    pub listening: bool,
}

/// The TCP sockets process `pid` holds: its descriptors' socket inodes
/// looked up in `/proc/net/tcp` and `tcp6` (of its network namespace).
pub fn tcp_sockets(pid: u32) -> Vec<Socket> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: BTreeSet<u64> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let s = l.to_string_lossy().into_owned();
            s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 {
                continue;
            }
            let Ok(inode) = cols[9].parse::<u64>() else {
                continue;
            };
            if !inodes.contains(&inode) {
                continue;
            }
            let port = cols[1]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if let Some(local_port) = port {
                out.push(Socket {
                    local_port,
                    listening: cols[3] == "0A",
                });
            }
        }
    }
    out
}

/// Open descriptors and resident bytes of process `pid`.
fn fds_and_rss(pid: u32) -> Option<(u64, u64)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((fds, kib * 1024))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn connect(port: u16) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&loopback(port), Duration::from_secs(1)).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    Some(s)
}

/// A stranger: connects, sends nothing (or garbage), holds the connection.
fn stranger(port: u16, garbage: bool, seed: u64, hold: Duration) {
    let Some(mut s) = connect(port) else { return };
    if garbage {
        let mut rng = crate::schedule::Rng::new(seed);
        let bytes: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
        let _ = s.write_all(&bytes);
    }
    std::thread::sleep(hold);
}

fn hello(run_id: u32, node: u16, nodes: u16) -> Vec<u8> {
    let mut out = Vec::new();
    evb_core::wire::Message::Hello {
        run_id,
        node,
        nodes,
        host: 0,
        pid: 0,
    }
    .encode_into(&mut out);
    out
}

/// A Hello with the right run id claiming node `claim`, a nonce, and then
/// a made-up proof; or, `truncated`, half a Hello and silence.
fn wrong_key(port: u16, run_id: u32, claim: u16, nodes: u16, truncated: bool, hold: Duration) {
    let Some(mut s) = connect(port) else { return };
    let h = hello(run_id, claim, nodes);
    if truncated {
        let _ = s.write_all(&h[..h.len() / 2]);
        std::thread::sleep(hold);
        return;
    }
    let _ = s.write_all(&h);
    let _ = s.write_all(&[0x5a; 16]);
    let mut answer = vec![0u8; h.len() + 16 + 32];
    if s.read_exact(&mut answer).is_ok() {
        let _ = s.write_all(&[0u8; 32]);
    }
    std::thread::sleep(hold);
}

/// Collects node A's genuine answer (its Hello, nonce and proof) and
/// replays it to node B as if it were A's opening.
fn replay_hello(from: u16, to: u16, run_id: u32, nodes: u16, hold: Duration) {
    let Some(mut a) = connect(from) else { return };
    let h = hello(run_id, nodes.saturating_sub(1), nodes);
    let _ = a.write_all(&h);
    let _ = a.write_all(&[0x33; 16]);
    let mut answer = vec![0u8; h.len() + 16 + 32];
    if a.read_exact(&mut answer).is_err() {
        return;
    }
    drop(a);
    let Some(mut b) = connect(to) else { return };
    // A's Hello and nonce as the opening, then A's proof as the answer.
    let _ = b.write_all(&answer[..h.len() + 16]);
    let mut theirs = vec![0u8; h.len() + 16 + 32];
    if b.read_exact(&mut theirs).is_ok() {
        let _ = b.write_all(&answer[h.len() + 16..]);
    }
    std::thread::sleep(hold);
}

/// Asks every listed metrics endpoint for /metrics about once a second.
fn poll_metrics(poll: &Arc<Mutex<Poll>>) {
    loop {
        let (ports, clock) = {
            let p = poll.lock().unwrap_or_else(|e| e.into_inner());
            if p.stop {
                return;
            }
            (p.ports.clone(), p.elapsed_at)
        };
        let now = |c: Option<(Instant, f64)>| c.map_or(0.0, |(i, t)| t + i.elapsed().as_secs_f64());
        for (rank, port) in ports {
            let asked = now(clock);
            let result = metrics_get(port);
            let mut p = poll.lock().unwrap_or_else(|e| e.into_inner());
            // Still expected to answer (not stopped or killed meanwhile)?
            let still = p.ports.contains(&(rank, port));
            match result {
                Ok(()) => p.answers += 1,
                Err(e) if still => p.failures.push((asked, rank, port, e)),
                Err(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
}

fn metrics_get(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&loopback(port), Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    if text.starts_with("HTTP/1.") && text.lines().next().is_some_and(|l| l.contains(" 200 ")) {
        Ok(())
    } else {
        Err(format!(
            "answer: {}",
            text.lines().next().unwrap_or("(nothing)")
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::*;

    /// `store-full` makes the store full at once and gives it back at its
    /// end. The ballast file it replaced took 1-2 s to fill the 512 MiB
    /// tmpfs in the launcher's loop, so that the nodes' reports were read
    /// late and a run seemed to build nothing for 2 s after a short
    /// store-full (tcp seed 24, shm seed 11 of the long run: "did not come
    /// back"). Root only (as the CI runs): the test runs itself again in a
    /// mount namespace of its own, as `evb chaos` does, for the tmpfs.
    #[test]
    fn a_store_full_fault_fills_the_store_at_once_and_gives_it_back() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (a tmpfs in a mount namespace)");
            return;
        }
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "private"])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", "inject::tests::store_full_in_a_namespace"])
            .args(["--ignored", "--nocapture"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    #[ignore = "run in a mount namespace by a_store_full_fault_fills_the_store_at_once_and_gives_it_back"]
    fn store_full_in_a_namespace() {
        let dir = std::env::temp_dir().join(format!("evb-chaos-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        crate::sandbox::mount_tmpfs(&dir).unwrap();
        std::fs::write(dir.join("held"), vec![1u8; 3 << 20]).unwrap();
        let fault = Fault::parse("store-full:@1+1").unwrap();
        let mut injector = Injector::new(vec![fault], Some(dir.clone()), None, false);
        let started = Instant::now();
        injector.fill_store(0).unwrap();
        let took = started.elapsed();
        let refused = std::fs::write(dir.join("object"), vec![2u8; 64 << 10]);
        injector.end(0);
        let taken = std::fs::write(dir.join("object"), vec![2u8; 64 << 10]);
        crate::sandbox::resize_store(&dir, None).unwrap();
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: unmounting the tmpfs this test mounted.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir_all(&dir);
        assert!(took < Duration::from_millis(100), "filled in {took:?}");
        let err = refused.expect_err("a write while the store is full");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        taken.expect("a write once the fault ended");
    }
}
