//! An external consumer: a Filter Unit endpoint that lives in another
//! program's process (a trigger in C++ or Python, through `libevb`) and is
//! driven by that program's calls instead of `evb node`'s loop.
//!
//! It is the same runtime as `evb node`'s, for one FU rank: the transport,
//! the rendezvous, the liveness timers, the credits and the accounting are
//! those of [`crate::run_node`], and the protocol is evb-core's
//! [`evb_core::fu::FilterUnit`] in hold mode: each intact batch is the
//! application's from its arrival until it gives it back
//! ([`Consumer::release`]), which returns the credit to its BU. The loop
//! turns while the application waits for a batch ([`Consumer::next`]) or
//! gives one back; an application that keeps a batch for long should call
//! [`Consumer::next`] (or [`Consumer::poll`]) meanwhile, or its BUs find it
//! silent after `transport.peer_timeout_ms` (on one host, a runnable
//! process gets the starved grace of 4 timeouts).
//!
//! It joins a run through a rendezvous directory: the one `evb run
//! --external-consumers K --rendezvous DIR` publishes (configuration, run
//! key, the ranks left to external consumers), or a cluster job's (`evb
//! node --control launcher`), with the job's configuration. At the end its
//! final report goes to `DIR/run<id>/final-<rank>.json`, where `evb run`
//! adds it to the run's accounting.
//!
//! A `Consumer` is single-threaded (its transport is): use it from the
//! thread that opened it. Batches it hands out are plain buffers that may
//! be read anywhere and given back from any thread through a
//! [`ReturnBox`], picked up at the consumer's next call.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use evb_core::fu::FuStats;
use evb_core::{Config, Layout, MepId, NodeId};

use crate::report::NodeReport;
use crate::setup::prepare;
use crate::transport::Transport;
use crate::{Control, NodeOptions, Runtime, Turns, MAX_WAIT};

use evb_control::cluster::external::{CONFIG_FILE, RANKS_FILE};

/// How often a consumer that holds batches looks for ones given back from
/// other threads while it waits.
const RETURN_SLICE: Duration = Duration::from_millis(1);

/// Where and as whom a consumer joins a run.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// The run's rendezvous directory.
    pub rendezvous: PathBuf,
    /// The run (`None`: the only `run<id>` in the directory).
    pub run_id: Option<u32>,
    /// This consumer's endpoint (`None`: the first external consumer rank
    /// `evb run` published that no other consumer took).
    pub rank: Option<u16>,
    /// The run's configuration (`None`: the one `evb run` published).
    pub config: Option<PathBuf>,
    /// `section.key=value` overrides on top of it.
    pub overrides: Vec<String>,
    /// How long to wait for the run to be published (a consumer may start
    /// before the event builder).
    pub wait: Duration,
}

impl ConsumerOptions {
    pub fn new(rendezvous: impl Into<PathBuf>) -> ConsumerOptions {
        ConsumerOptions {
            rendezvous: rendezvous.into(),
            run_id: None,
            rank: None,
            config: None,
            overrides: Vec::new(),
            wait: Duration::from_secs(60),
        }
    }
}

/// A built batch the application holds: its payload (the fragment
/// table, then one fragment per source: docs/wire-format.md) in a buffer
/// of its own, until given back.
#[derive(Debug)]
pub struct HeldBatch {
    /// The BU's endpoint and BU index.
    pub bu: NodeId,
    pub bu_index: u16,
    pub mep: MepId,
    pub events: u32,
    /// Incomplete, delivered anyway (`output.deliver_partial`): a missing
    /// source's fragment is empty.
    pub partial: bool,
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl HeldBatch {
    /// The batch payload, verified (CRC-32C and fragment table).
    pub fn payload(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    /// What identifies it to its consumer: its BU's endpoint and its MEP.
    pub fn key(&self) -> (NodeId, MepId) {
        (self.bu, self.mep)
    }
}

/// What [`Consumer::next`] found.
#[derive(Debug)]
pub enum Next {
    Batch(HeldBatch),
    /// A BU was lost (its process died, or it fell silent): nothing more
    /// comes from it; batches of it already held stay valid.
    BuLost {
        bu_index: u16,
        endpoint: NodeId,
        reason: String,
    },
    /// Nothing within the time given.
    Timeout,
    /// The run is over for this consumer: every BU ended its output and
    /// no batch is left to hand out.
    End,
}

/// A batch given back: its key, and its buffer unless something else
/// still reads it (a Python memoryview: it is freed with the last one).
type Returned = ((NodeId, MepId), Option<Vec<u8>>);

/// Batches given back from other threads, until the consumer's thread
/// takes them in: cheap to clone, `Send` and `Sync`.
#[derive(Debug, Clone, Default)]
pub struct ReturnBox(Arc<Mutex<Vec<Returned>>>);

impl ReturnBox {
    pub fn give_back(&self, batch: HeldBatch) {
        self.push((batch.key(), Some(batch.buf)));
    }

    /// Gives back the batch of `key` whose buffer stays with its readers.
    pub fn give_back_key(&self, key: (NodeId, MepId)) {
        self.push((key, None));
    }

    fn push(&self, r: Returned) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    fn take(&self) -> Vec<Returned> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A Filter Unit endpoint in this process (see the module's doc).
pub struct Consumer {
    rt: Runtime,
    transport: Box<dyn Transport>,
    turns: Turns,
    /// Losses of [`Runtime::lost`] already told.
    losses_told: usize,
    /// The loop is over: finished and lingered.
    over: bool,
    returns: ReturnBox,
    closed: bool,
}

impl Consumer {
    /// Joins the run: reads its configuration, takes a consumer rank,
    /// exchanges addresses with every endpoint and connects to them (the
    /// start barrier), and grants every BU its credits.
    pub fn open(opts: ConsumerOptions) -> Result<Consumer> {
        let (run_id, run_dir) = wait_for(opts.wait, || {
            let (id, dir) = find_run(&opts.rendezvous, opts.run_id)?;
            // The configuration is published last: then all is there.
            let published = opts.config.is_some() || dir.join(CONFIG_FILE).is_file();
            ensure!(published, "{} has no {CONFIG_FILE} yet", dir.display());
            Ok((id, dir))
        })?;
        let config_path = opts.config.clone().unwrap_or(run_dir.join(CONFIG_FILE));
        ensure!(
            config_path.is_file(),
            "no configuration at {}: is {} the rendezvous directory of a run started with \
             `evb run --external-consumers`? (else give the run's configuration)",
            config_path.display(),
            opts.rendezvous.display()
        );
        let config = Config::load(Some(&config_path), &opts.overrides)?;
        ensure!(
            config.run.run_id == run_id,
            "{} is for run {}, the rendezvous directory has run {run_id}",
            config_path.display(),
            config.run.run_id
        );
        let layout = Layout::from_config(&config);
        let rank = claim_rank(&run_dir, &layout, opts.rank)?;
        let node = NodeOptions {
            config,
            rank,
            control: Control::Launcher,
            rendezvous: Some(opts.rendezvous),
            rejoin: false,
        };
        let (mut rt, mut transport) = prepare(node, true)?;
        rt.start_run(transport.as_mut())?;
        let turns = rt.turns();
        Ok(Consumer {
            rt,
            transport,
            turns,
            losses_told: 0,
            over: false,
            returns: ReturnBox::default(),
            closed: false,
        })
    }

    /// This consumer's endpoint and its FU index.
    pub fn rank(&self) -> NodeId {
        self.rt.rank
    }

    pub fn fu_index(&self) -> u16 {
        self.rt.layout.fu_of[self.rt.rank as usize].expect("a consumer is an FU")
    }

    pub fn config(&self) -> &Config {
        &self.rt.config
    }

    pub fn layout(&self) -> &Layout {
        &self.rt.layout
    }

    /// Where batches given back from other threads go.
    pub fn return_box(&self) -> ReturnBox {
        self.returns.clone()
    }

    /// The next batch, a lost BU, or the end of the run; waits up to
    /// `timeout` for one (the loop turns meanwhile: heartbeats, credits).
    pub fn next(&mut self, timeout: Duration) -> Result<Next> {
        let deadline = Instant::now() + timeout;
        loop {
            self.take_returns()?;
            if let Some(lost) = self.new_loss() {
                return Ok(lost);
            }
            if let Some(batch) = self.take_handed() {
                return Ok(Next::Batch(batch));
            }
            if self.over || self.rt.engine.node.is_done() {
                if !self.over {
                    // Say goodbye and linger, as a node does.
                    self.turn(Duration::ZERO)?;
                }
                return Ok(Next::End);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Next::Timeout);
            }
            self.turn(left)?;
        }
    }

    /// Turns the loop for up to `timeout` without taking a batch: for an
    /// application busy with the ones it holds (heartbeats, credits of
    /// batches given back from other threads).
    pub fn poll(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.take_returns()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if self.over || left.is_zero() {
                return Ok(());
            }
            self.turn(left)?;
        }
    }

    /// The application is done with `batch`: it is consumed, its credit
    /// goes back to its BU now, and its buffer is used again. False if
    /// this consumer did not hold it.
    pub fn release(&mut self, batch: HeldBatch) -> Result<bool> {
        self.release_key(batch.key(), Some(batch.buf))
    }

    /// [`Consumer::release`] by key; `buf`, the batch's buffer, is used
    /// again (`None`: it stays with whatever still reads it).
    pub fn release_key(
        &mut self,
        (bu, mep): (NodeId, MepId),
        buf: Option<Vec<u8>>,
    ) -> Result<bool> {
        let now = self.rt.engine.now();
        let held = self.rt.engine.node.release_delivery(now, bu, mep);
        if let Some(buf) = buf {
            self.rt.engine.give_back_rx(buf);
        }
        self.rt.process_actions(self.transport.as_mut())?;
        self.transport.flush(&mut self.rt.events);
        self.rt.handle_link_events(self.transport.as_mut())?;
        Ok(held)
    }

    /// This consumer's counters.
    pub fn stats(&self) -> FuStats {
        self.rt
            .engine
            .node
            .fu()
            .map(|f| f.stats.clone())
            .unwrap_or_default()
    }

    /// Batches the application holds.
    pub fn held(&self) -> usize {
        self.rt.engine.node.fu().map_or(0, |f| f.held())
    }

    /// Leaves the run: at its end, after the goodbye and the linger (as a
    /// node does); before it, at once (the BUs take it for lost and give
    /// the batches it did not consume to other consumers). Writes the
    /// final report to the rendezvous directory and returns it.
    pub fn close(mut self) -> Result<NodeReport> {
        self.take_returns()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.rt.engine.node.is_done() && !self.over && Instant::now() < deadline {
            self.turn(MAX_WAIT)?;
        }
        self.closed = true;
        self.rt.finish_run(self.transport.as_mut())?;
        Ok(self.rt.final_report())
    }

    /// One turn of the loop, waiting up to `wait` for input (in short
    /// slices while batches are out that other threads may give back).
    fn turn(&mut self, wait: Duration) -> Result<()> {
        let out = self.held() > 0 && Arc::strong_count(&self.returns.0) > 1;
        let slice = if out { RETURN_SLICE } else { MAX_WAIT };
        if self
            .rt
            .turn(self.transport.as_mut(), &mut self.turns, wait.min(slice))?
        {
            self.over = true;
        }
        Ok(())
    }

    fn take_returns(&mut self) -> Result<()> {
        for (key, buf) in self.returns.take() {
            self.release_key(key, buf)?;
        }
        Ok(())
    }

    /// The oldest held batch not handed out yet.
    fn take_handed(&mut self) -> Option<HeldBatch> {
        let e = &mut self.rt.engine;
        while let Some((bu, mep)) = e.handed.pop_front() {
            let Some(d) = e.consuming.remove(&(bu, mep)) else {
                continue;
            };
            return Some(HeldBatch {
                bu,
                bu_index: self.rt.layout.bu_of[bu as usize].unwrap_or(u16::MAX),
                mep,
                events: d.events,
                partial: d.partial,
                buf: d.buf,
                start: d.start,
                len: d.len,
            });
        }
        None
    }

    /// A BU lost since the last call, if any.
    fn new_loss(&mut self) -> Option<Next> {
        while let Some(loss) = self.rt.lost.get(self.losses_told) {
            self.losses_told += 1;
            if let Some(bu_index) = self.rt.layout.bu_of[loss.peer as usize] {
                return Some(Next::BuLost {
                    bu_index,
                    endpoint: loss.peer,
                    reason: loss.reason.clone(),
                });
            }
        }
        None
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if !self.closed {
            // Dropped without close: the report is written all the same.
            let _ = self.rt.finish_run(self.transport.as_mut());
        }
    }
}

/// `f`'s answer, asking again every 20 ms while it fails, for up to
/// `wait`; then its last error.
fn wait_for<T>(wait: Duration, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = Instant::now() + wait;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("the run was not published within {wait:?}")))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The run directory `DIR/run<id>` and its id: the one asked for, or the
/// only one there.
fn find_run(dir: &Path, run_id: Option<u32>) -> Result<(u32, PathBuf)> {
    if let Some(id) = run_id {
        let run_dir = dir.join(format!("run{id}"));
        ensure!(
            run_dir.is_dir(),
            "no run {id} in the rendezvous directory {} (no {})",
            dir.display(),
            run_dir.display()
        );
        return Ok((id, run_dir));
    }
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("rendezvous directory {}", dir.display()))?;
    let mut runs: Vec<u32> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("run")?.parse().ok())
        .collect();
    runs.sort_unstable();
    match runs.as_slice() {
        [id] => Ok((*id, dir.join(format!("run{id}")))),
        [] => bail!(
            "no run in the rendezvous directory {} yet (no run<id> directory): is the run started?",
            dir.display()
        ),
        _ => bail!(
            "the rendezvous directory {} has runs {runs:?}: say which (run id)",
            dir.display()
        ),
    }
}

/// Takes a consumer rank of the run for this process: `rank` if given (it
/// must be a Filter Unit's), else the first external consumer rank `evb
/// run` published; each is taken once (`claim-<rank>`, created
/// exclusively), so two consumers never join as the same endpoint.
fn claim_rank(run_dir: &Path, layout: &Layout, rank: Option<u16>) -> Result<NodeId> {
    let candidates: Vec<NodeId> = match rank {
        Some(r) => {
            ensure!(
                layout.fu_of.get(r as usize).copied().flatten().is_some(),
                "endpoint {r} is not a consumer of this run: its consumers are endpoints {:?}",
                layout.fu_nodes
            );
            vec![r]
        }
        None => {
            let path = run_dir.join(RANKS_FILE);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "{}: no external consumer ranks published (give the rank)",
                    path.display()
                )
            })?;
            let ranks = text
                .split_whitespace()
                .map(|t| {
                    t.parse::<NodeId>()
                        .ok()
                        .filter(|r| layout.fu_of.get(*r as usize).copied().flatten().is_some())
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| anyhow!("{} is malformed: `{}`", path.display(), text.trim()))?;
            ranks
        }
    };
    for &r in &candidates {
        let claim = run_dir.join(format!("claim-{r}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&claim)
        {
            Ok(_) => return Ok(r),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(anyhow!(
                    "claiming consumer rank {r}: {}: {e}",
                    claim.display()
                ))
            }
        }
    }
    bail!(
        "every external consumer rank of this run ({candidates:?}) is taken already (claim files in {})",
        run_dir.display()
    )
}
