//! Reads every port's counters from a live fabric with the real
//! `perfquery` (infiniband-diags): for each node of the topology that has
//! a LID, `perfquery -l LID PORTS` (basic `PortCounters`) and `perfquery
//! -x -l LID PORTS` (`PortCountersExtended`), over the node's cabled ports,
//! a few nodes at a time, each call bounded in time. With `reset`, `-r`
//! clears the counters right after they are read (left to the user: other
//! tools may be reading them too). The `PortXmitWait` tick comes from
//! `PortSamplesControl` (`perfquery -c`) when the PMA answers it.

use super::formats::read_perfquery;
use super::{PortSample, Snapshot};
use crate::error::{FabricError, Result};
use crate::topo::Topology;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use wait_timeout::ChildExt;

/// How to run `perfquery`.
#[derive(Debug, Clone)]
pub struct CollectOptions {
    /// The program (`perfquery` on PATH by default).
    pub perfquery: PathBuf,
    /// Arguments before the others (`-C mlx5_0 -P 1`: which local port).
    pub extra_args: Vec<String>,
    /// Environment for perfquery (ibsim's `LD_PRELOAD`, `IBSIM_SOCKNAME`).
    pub env: Vec<(String, String)>,
    /// Also read the extended (64-bit) counters.
    pub extended: bool,
    /// Clear the counters after reading them (`perfquery -r`).
    pub reset: bool,
    /// Longest one `perfquery` call may take.
    pub timeout: Duration,
    /// Calls run at once.
    pub jobs: usize,
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions {
            perfquery: PathBuf::from("perfquery"),
            extra_args: Vec::new(),
            env: Vec::new(),
            extended: true,
            reset: false,
            timeout: Duration::from_secs(10),
            jobs: 4,
        }
    }
}

/// Seconds since the Unix epoch.
pub fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What one `perfquery` call printed, or why it failed.
fn run(opts: &CollectOptions, args: &[String]) -> std::result::Result<String, String> {
    let mut cmd = Command::new(&opts.perfquery);
    cmd.args(&opts.extra_args)
        .args(args)
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{} {}", opts.perfquery.display(), args.join(" "));
    let mut child = cmd.spawn().map_err(|e| format!("{shown}: {e}"))?;
    // Read both pipes while waiting: a large switch prints more than a pipe holds.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = match child.wait_timeout(opts.timeout) {
        Ok(Some(st)) => st,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{shown}: no answer in {:?}", opts.timeout));
        }
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    let text = reader.join().unwrap_or_default();
    let errors = err_reader.join().unwrap_or_default();
    if !status.success() {
        let why = errors.lines().next().unwrap_or("").trim();
        return Err(format!("{shown}: {status}: {why}"));
    }
    Ok(text)
}

/// The `perfquery` version line (`perfquery 44.0`), for the snapshot.
fn version(opts: &CollectOptions) -> String {
    match Command::new(&opts.perfquery)
        .arg("-V")
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            let v = text
                .lines()
                .find_map(|l| l.split("VERSION:").nth(1))
                .map(str::trim)
                .unwrap_or("");
            format!("perfquery {v}").trim().to_string()
        }
        Err(_) => "perfquery".into(),
    }
}

/// One node to read: its LID and cabled ports.
struct Target {
    node: usize,
    lid: u16,
    ports: String,
}

fn targets(topo: &Topology) -> Vec<Target> {
    topo.nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.lid != 0)
        .filter_map(|(i, n)| {
            let ports: Vec<String> = (1..n.ports.len())
                .filter(|&p| n.ports[p].is_some())
                .map(|p| p.to_string())
                .collect();
            (!ports.is_empty()).then(|| Target {
                node: i,
                lid: n.lid,
                ports: ports.join(","),
            })
        })
        .collect()
}

/// Reads one node: basic counters, then extended ones; its samples and
/// notes.
fn read_node(
    topo: &Topology,
    opts: &CollectOptions,
    t: &Target,
) -> std::result::Result<(Vec<PortSample>, Vec<String>), String> {
    let mut args: Vec<String> = Vec::new();
    if opts.reset {
        args.push("-r".into());
    }
    args.extend(["-l".into(), t.lid.to_string(), t.ports.clone()]);
    let mut text = run(opts, &args)?;
    let mut notes = Vec::new();
    if opts.extended {
        let mut x = vec!["-x".to_string()];
        x.extend(args.iter().cloned());
        match run(opts, &x) {
            Ok(more) => text.push_str(&more),
            Err(e) => notes.push(format!("extended counters not read: {e}")),
        }
    }
    let at = now_s();
    let path = PathBuf::from(format!("perfquery -l {} {}", t.lid, t.ports));
    let read = read_perfquery(&path, &text, topo, at).map_err(|e| e.to_string())?;
    notes.extend(read.notes);
    let mut ports = read.snap.ports;
    for p in &mut ports {
        p.time_s = Some(at);
        p.line = 0;
    }
    Ok((ports, notes))
}

/// `Tick` of `PortSamplesControl` of one port (`perfquery -c LID PORT`).
fn samples_tick(opts: &CollectOptions, lid: u16, port: &str) -> Option<u32> {
    let first = port.split(',').next()?;
    let text = run(opts, &["-c".into(), lid.to_string(), first.to_string()]).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k.trim() != "Tick" {
            return None;
        }
        let v = v.trim_start_matches('.').trim();
        let v = v.strip_prefix("0x").unwrap_or(v);
        u32::from_str_radix(v, 16).ok()
    })
}

/// Reads every cabled port of every node with a LID.
pub fn collect(topo: &Topology, opts: &CollectOptions) -> Result<(Snapshot, Vec<String>)> {
    let targets = targets(topo);
    if targets.is_empty() {
        return Err(FabricError::Invalid(
            "no node of the topology has a LID: give the ibnetdiscover output of the fabric (a generated fat tree has no live ports)".into(),
        ));
    }
    let started = now_s();
    let mut snap = Snapshot::new(&format!("{} (evb fabric counters)", version(opts)), started);
    snap.reset_after_read = opts.reset;
    let mut notes = Vec::new();
    // PortSamplesControl is optional: asked once, and of every node only if
    // the first answers (ibsim, for one, does not).
    let first = &targets[0];
    let tick_known = samples_tick(opts, first.lid, &first.ports).is_some();
    if !tick_known {
        notes.push(format!(
            "PortSamplesControl (perfquery -c) not answered by LID {}: PortXmitWait ticks are taken as one symbol time of each link (docs/fabric.md)",
            first.lid
        ));
    }
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.clamp(1, 64) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(t) = targets.get(i) else { break };
                let mut r = read_node(topo, opts, t);
                if let (Ok((ports, _)), true) = (&mut r, tick_known) {
                    let tick = samples_tick(opts, t.lid, &t.ports);
                    for p in ports.iter_mut() {
                        p.tick_ns = tick.and_then(|k| tick_ns(topo, t.node, p.port, k));
                    }
                }
                results.lock().expect("not poisoned").push((i, r));
            });
        }
    });
    let mut results = results.into_inner().expect("not poisoned");
    results.sort_by_key(|r| r.0);
    let mut failed = 0;
    for (i, r) in results {
        match r {
            Ok((ports, n)) => {
                snap.ports.extend(ports);
                notes.extend(n);
            }
            Err(e) => {
                failed += 1;
                notes.push(format!(
                    "{} not read: {e}",
                    topo.nodes[targets[i].node].name
                ));
            }
        }
    }
    if failed == targets.len() {
        return Err(FabricError::Invalid(format!(
            "perfquery read no node of the fabric: {}",
            notes.last().map_or("", String::as_str)
        )));
    }
    snap.time_s = now_s();
    cap_notes(&mut notes);
    Ok((snap, notes))
}

/// A tick of `(k + 1)` symbol times of the link at `node` port `port`.
fn tick_ns(topo: &Topology, node: usize, port: u8, k: u32) -> Option<f64> {
    let rate = topo.link_rate(node, port)?;
    Some(f64::from(k + 1) * rate.speed.symbol_ns())
}

/// At most this many notes are kept; the rest are counted.
const MAX_NOTES: usize = 12;

/// Keeps the first [`MAX_NOTES`] notes and says how many more there were
/// (a dead leaf makes one note per host).
fn cap_notes(notes: &mut Vec<String>) {
    if notes.len() > MAX_NOTES {
        let more = notes.len() - MAX_NOTES;
        notes.truncate(MAX_NOTES);
        notes.push(format!("... and {more} more notes like these"));
    }
}
