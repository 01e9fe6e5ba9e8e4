//! The writer a builder unit feeds: copies each batch into an object on the
//! caller's thread (one memcpy), and leaves checksums and I/O to one
//! background thread behind a bounded queue, so that the caller's event
//! loop never waits on a disk or a network.
//!
//! One thread per writer also makes each node's output one sequential
//! stream: objects are written one after the other, in the order queued.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::format;
use crate::s3::S3Client;
use crate::target::StoreTarget;
use crate::StoreError;

/// Tuning of a writer.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Batches accepted but not yet written; one more is refused with
    /// [`StoreError::Backpressure`]. Memory held is at most this many
    /// objects plus one spare buffer.
    pub queue_depth: usize,
    /// Local directory: `fsync` each object before it becomes visible
    /// (durable against power loss, slower).
    pub sync: bool,
    /// S3: timeout of one request.
    pub timeout: Duration,
    /// S3: attempts after a failed PUT before the writer gives up.
    pub retries: u32,
    /// A failed write (a full disk, an unreachable S3) costs only its
    /// object: counted in [`StoreStats::failed`], the error kept in
    /// [`StoreStats::last_error`], and the writer goes on with the next
    /// (the space may come back). Off: the first failure stops the writer
    /// and every later call returns it.
    pub keep_going: bool,
    /// Several writers of the run may be handed the same MEP (consumers:
    /// a batch a BU delivers again after giving its first consumer up,
    /// who may live on and store it all the same): each object is claimed
    /// first, atomically, at [`format::claim_key`] (a file created
    /// exclusively; on S3 a conditional PUT, `If-None-Match: *`). The
    /// first writer to claim a MEP stores it, any other counts it in
    /// [`StoreStats::already_stored`], whatever the timing: a MEP is never
    /// stored twice. A local object is claimed once written to its
    /// temporary name, before it is renamed into place, so a write that
    /// fails (a full disk) claims nothing and another writer may still
    /// store the MEP; an S3 object is claimed before its PUT and the claim
    /// deleted if the PUT fails.
    pub claim: bool,
}

impl Default for WriterOptions {
    fn default() -> WriterOptions {
        WriterOptions {
            queue_depth: 4,
            sync: false,
            timeout: Duration::from_secs(60),
            retries: 2,
            keep_going: false,
            claim: false,
        }
    }
}

/// What a writer has done.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StoreStats {
    /// Objects written.
    pub objects: u64,
    /// Events in the objects written.
    pub events: u64,
    /// Bytes of the objects written.
    pub bytes: u64,
    /// Calls of `write_batch` refused because the queue was full.
    pub refused: u64,
    /// Batches accepted but not written because a write failed.
    pub failed: u64,
    /// The last write error (with `keep_going`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Batches delivered again ([`StoreWriter::write_events_again`]) found
    /// already stored, by this node or another consumer, or (with
    /// [`WriterOptions::claim`]) any batch another writer claimed: not
    /// written twice.
    pub already_stored: u64,
    /// Batches given up because the writer had no room for longer than
    /// [`StoreWriter::wait_for_room`] allows (a store too slow).
    pub dropped_slow: u64,
    /// Seconds the background thread spent checksumming and writing.
    pub busy_seconds: f64,
}

struct Job {
    mep: u64,
    events: u32,
    object: Vec<u8>,
    /// Skip it if one of these nodes stored this MEP already.
    unless_stored_by: Vec<u16>,
}

#[derive(Default)]
struct State {
    queued: usize,
    stats: StoreStats,
    error: Option<String>,
    /// Since when the queue is full without a write finishing.
    full_since: Option<Instant>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    drained: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in the other thread cannot leave State inconsistent
        // (plain counters), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

enum Sink {
    Dir { root: PathBuf, sync: bool },
    S3 { client: S3Client, retries: u32 },
}

/// Where an object goes: its name, and the claim it must win first
/// ([`WriterOptions::claim`]).
struct Dest<'a> {
    name: &'a str,
    claim: Option<&'a str>,
}

/// Writes the batches of one node of one run; see the module docs.
pub struct StoreWriter {
    run_id: u32,
    node: u16,
    queue_depth: usize,
    keep_going: bool,
    /// Nodes whose objects a batch delivered again is checked against.
    stored_by: Vec<u16>,
    jobs: Option<SyncSender<Job>>,
    spare_buffers: Receiver<Vec<u8>>,
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl StoreWriter {
    /// Opens a writer with default options.
    pub fn open(target: &StoreTarget, run_id: u32, node: u16) -> Result<StoreWriter, StoreError> {
        StoreWriter::open_with(target, run_id, node, WriterOptions::default())
    }

    /// Opens a writer: creates the node's directory, or checks that the S3
    /// bucket answers (so a wrong endpoint, bucket or key fails here, at
    /// start, and not at the first batch), then starts the writer thread.
    pub fn open_with(
        target: &StoreTarget,
        run_id: u32,
        node: u16,
        options: WriterOptions,
    ) -> Result<StoreWriter, StoreError> {
        if options.queue_depth == 0 {
            return Err(StoreError::Target {
                spec: target.to_string(),
                reason: "queue_depth must be at least 1".into(),
            });
        }
        let sink = match target {
            StoreTarget::Dir(root) => {
                let dir = root.join(format::object_key(run_id, node, 0));
                let dir = dir.parent().expect("object key has a directory");
                std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
                remove_unfinished(dir);
                if options.claim {
                    let claims = root.join(format::claim_key(run_id, 0));
                    let claims = claims.parent().expect("claim key has a directory");
                    std::fs::create_dir_all(claims).map_err(|e| StoreError::io(claims, e))?;
                }
                Sink::Dir {
                    root: root.clone(),
                    sync: options.sync,
                }
            }
            StoreTarget::S3(t) => {
                let client = S3Client::new(t, options.timeout);
                client.check_bucket()?;
                Sink::S3 {
                    client,
                    retries: options.retries,
                }
            }
        };
        let (jobs, job_rx) = mpsc::sync_channel::<Job>(options.queue_depth);
        let (spare_tx, spare_buffers) = mpsc::sync_channel::<Vec<u8>>(1);
        let shared = Arc::new(Shared::default());
        let worker_shared = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name(format!("evb-store-{node}"))
            .spawn(move || {
                let (keep_going, claim) = (options.keep_going, options.claim);
                write_loop(
                    (run_id, node),
                    &sink,
                    (keep_going, claim),
                    &job_rx,
                    &spare_tx,
                    &worker_shared,
                )
            })
            .map_err(|e| StoreError::Failed(format!("cannot start the writer thread: {e}")))?;
        Ok(StoreWriter {
            run_id,
            node,
            queue_depth: options.queue_depth,
            keep_going: options.keep_going,
            stored_by: vec![node],
            jobs: Some(jobs),
            spare_buffers,
            shared,
            worker: Some(worker),
        })
    }

    /// Queues the batch `mep` for writing: `fragments` are its fragment
    /// payloads in source order, each an event-size table of
    /// `events_per_mep` u32 then the event data (docs/wire-format.md).
    ///
    /// Returns at once. [`StoreError::Backpressure`] if the queue is full
    /// (nothing was copied: call again later with the same batch);
    /// [`StoreError::InvalidBatch`] if a fragment's size table disagrees
    /// with its length; [`StoreError::Failed`] once an earlier write failed
    /// (the writer stops then: a store with holes must be noticed).
    pub fn write_batch(
        &mut self,
        mep: u64,
        events_per_mep: u32,
        fragments: &[&[u8]],
    ) -> Result<(), StoreError> {
        let run_sources = u32::try_from(fragments.len()).map_err(|_| StoreError::InvalidBatch {
            mep,
            problem: format::FragmentLayoutError {
                source: fragments.len(),
                reason: "more than 2^32 sources".into(),
            },
        })?;
        let all: Vec<u32> = (0..run_sources).collect();
        self.write_batch_sources(mep, events_per_mep, run_sources, &all, fragments)
    }

    /// Like [`Self::write_batch`] for a batch built from some of the run's
    /// `run_sources` sources (others were lost): `sources[i]` is the source
    /// index of `fragments[i]`, strictly increasing. The object records
    /// which sources it holds (docs/store.md, source table).
    pub fn write_batch_sources(
        &mut self,
        mep: u64,
        events_per_mep: u32,
        run_sources: u32,
        sources: &[u32],
        fragments: &[&[u8]],
    ) -> Result<(), StoreError> {
        self.write_events(mep, events_per_mep, run_sources, sources, fragments, None)
    }

    /// Like [`Self::write_batch_sources`], storing only the events
    /// `selected` of the MEP (event numbers, strictly increasing; `None`:
    /// all): a filter unit stores the events it accepted. The object records
    /// which events it holds (docs/store.md, event-number table).
    pub fn write_events(
        &mut self,
        mep: u64,
        events_per_mep: u32,
        run_sources: u32,
        sources: &[u32],
        fragments: &[&[u8]],
        selected: Option<&[u32]>,
    ) -> Result<(), StoreError> {
        let batch = (mep, events_per_mep, run_sources);
        self.queue(batch, sources, fragments, selected, Vec::new())
    }

    /// The nodes (this one included) whose objects
    /// [`Self::write_events_again`] looks for: the consumers of the run,
    /// any of which may have stored a batch delivered again.
    pub fn check_stored_by(&mut self, nodes: &[u16]) {
        self.stored_by = nodes.to_vec();
        if !self.stored_by.contains(&self.node) {
            self.stored_by.push(self.node);
        }
    }

    /// [`Self::write_events`] for a batch delivered again (its first
    /// consumer was lost before confirming it, and may have stored it):
    /// the writer's thread writes it only if none of the nodes of
    /// [`Self::check_stored_by`] has an object of this MEP already
    /// ([`StoreStats::already_stored`] counts those it skips).
    pub fn write_events_again(
        &mut self,
        mep: u64,
        events_per_mep: u32,
        run_sources: u32,
        sources: &[u32],
        fragments: &[&[u8]],
        selected: Option<&[u32]>,
    ) -> Result<(), StoreError> {
        let batch = (mep, events_per_mep, run_sources);
        let by = self.stored_by.clone();
        self.queue(batch, sources, fragments, selected, by)
    }

    /// Waits up to `bound` for room in the queue; false if there is none
    /// by then, or if the queue has been full without a write finishing
    /// for `bound` already (a stuck store costs its caller at most `bound`
    /// once, not once per batch).
    pub fn wait_for_room(&self, bound: Duration) -> bool {
        let mut state = self.shared.lock();
        let since = *state.full_since.get_or_insert_with(Instant::now);
        let until = since + bound;
        while state.queued >= self.queue_depth {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            state = self
                .shared
                .drained
                .wait_timeout(state, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// A batch given up for want of room ([`Self::wait_for_room`]).
    pub fn note_dropped(&self) {
        self.shared.lock().stats.dropped_slow += 1;
    }

    fn queue(
        &mut self,
        (mep, events_per_mep, run_sources): (u64, u32, u32),
        sources: &[u32],
        fragments: &[&[u8]],
        selected: Option<&[u32]>,
        unless_stored_by: Vec<u16>,
    ) -> Result<(), StoreError> {
        {
            let mut state = self.shared.lock();
            if let Some(err) = &state.error {
                return Err(StoreError::Failed(err.clone()));
            }
            if state.queued >= self.queue_depth {
                state.stats.refused += 1;
                return Err(StoreError::Backpressure {
                    queued: state.queued,
                });
            }
        }
        let mut object = self.spare_buffers.try_recv().unwrap_or_default();
        let batch = format::BatchParts {
            run_id: self.run_id,
            node: self.node,
            mep,
            mep_events: events_per_mep,
            run_sources,
            sources,
            fragments,
        };
        format::layout_selected(&mut object, &batch, selected)
            .map_err(|problem| StoreError::InvalidBatch { mep, problem })?;
        self.shared.lock().queued += 1;
        let job = Job {
            mep,
            events: selected.map_or(events_per_mep, |s| s.len() as u32),
            object,
            unless_stored_by,
        };
        // Never blocks: fewer than queue_depth jobs are queued.
        self.jobs
            .as_ref()
            .expect("jobs sender lives until close")
            .send(job)
            .map_err(|_| StoreError::Failed("the writer thread has stopped".into()))
    }

    /// True if `write_batch` would accept a batch now.
    pub fn has_room(&self) -> bool {
        let state = self.shared.lock();
        state.error.is_none() && state.queued < self.queue_depth
    }

    /// Batches accepted and not yet written.
    pub fn queued(&self) -> usize {
        self.shared.lock().queued
    }

    /// What has been written so far.
    pub fn stats(&self) -> StoreStats {
        self.shared.lock().stats.clone()
    }

    /// Waits until every accepted batch is written (blocks: not for the
    /// event loop's hot path). Error if any write failed.
    pub fn flush(&mut self) -> Result<StoreStats, StoreError> {
        let mut state = self.shared.lock();
        while state.queued > 0 {
            state = self
                .shared
                .drained
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        match &state.error {
            Some(err) => Err(StoreError::Failed(err.clone())),
            None => Ok(state.stats.clone()),
        }
    }

    /// Writes what is queued, stops the writer thread and returns the
    /// totals. Error if any write failed (unless `keep_going`: then the
    /// totals count the failures).
    pub fn close(mut self) -> Result<StoreStats, StoreError> {
        self.stop();
        let state = self.shared.lock();
        if self.keep_going {
            return Ok(state.stats.clone());
        }
        match &state.error {
            Some(err) => Err(StoreError::Failed(format!(
                "{err} ({} objects written, {} batches not written)",
                state.stats.objects, state.stats.failed
            ))),
            None => Ok(state.stats.clone()),
        }
    }

    fn stop(&mut self) {
        self.jobs = None;
        if let Some(worker) = self.worker.take() {
            if worker.join().is_err() {
                let mut state = self.shared.lock();
                state
                    .error
                    .get_or_insert_with(|| "the writer thread panicked".into());
            }
        }
    }
}

impl Drop for StoreWriter {
    /// Dropping without `close` still writes what was accepted.
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_loop(
    (run_id, node): (u32, u16),
    sink: &Sink,
    (keep_going, claim): (bool, bool),
    jobs: &Receiver<Job>,
    spare: &SyncSender<Vec<u8>>,
    shared: &Shared,
) {
    while let Ok(mut job) = jobs.recv() {
        let failed_before = shared.lock().error.is_some();
        let started = Instant::now();
        // With claims the claim decides (below); the look at the other
        // consumers' objects is for writers without.
        let stored = !claim
            && job
                .unless_stored_by
                .iter()
                .any(|&n| is_stored(sink, &format::object_key(run_id, n, job.mep)));
        let result = if failed_before {
            Err(String::new())
        } else if stored {
            Ok(false)
        } else {
            format::seal(&mut job.object);
            let name = format::object_key(run_id, node, job.mep);
            let claim_key = claim.then(|| format::claim_key(run_id, job.mep));
            let dest = Dest {
                name: &name,
                claim: claim_key.as_deref(),
            };
            write_object(sink, &dest, &job.object)
        };
        let busy = started.elapsed();
        {
            let mut state = shared.lock();
            state.queued -= 1;
            state.full_since = None;
            state.stats.busy_seconds += busy.as_secs_f64();
            match result {
                Ok(true) => {
                    state.stats.objects += 1;
                    state.stats.events += u64::from(job.events);
                    state.stats.bytes += job.object.len() as u64;
                }
                Ok(false) => state.stats.already_stored += 1,
                Err(err) if keep_going => {
                    state.stats.failed += 1;
                    state.stats.last_error = Some(err);
                }
                Err(err) => {
                    state.stats.failed += 1;
                    if state.error.is_none() {
                        state.error = Some(err);
                    }
                }
            }
        }
        shared.drained.notify_all();
        // Hand the buffer back for the next batch; drop it if one is
        // already waiting (bounds memory at queue_depth + 1 buffers).
        let _ = spare.try_send(job.object);
    }
}

/// The `.tmp` files a writer of this node left when it was killed in the
/// middle of a write: a new writer of the node (its restarted process)
/// owns the directory, and an unfinished object is no object.
fn remove_unfinished(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether the object `name` is in the store (an object is there whole or
/// not at all). An S3 store that cannot say is taken as not having it.
fn is_stored(sink: &Sink, name: &str) -> bool {
    match sink {
        Sink::Dir { root, .. } => root.join(name).is_file(),
        Sink::S3 { client, .. } => {
            let key = client.target().key(name);
            client
                .list(&key)
                .is_ok_and(|objects| objects.iter().any(|o| o.key == key))
        }
    }
}

/// Writes the object; false if another writer holds its claim (nothing
/// written then).
fn write_object(sink: &Sink, dest: &Dest<'_>, object: &[u8]) -> Result<bool, String> {
    match sink {
        Sink::Dir { root, sync } => write_file(root, dest, object, *sync),
        Sink::S3 { client, retries } => {
            let key = client.target().key(dest.name);
            let claim = dest.claim.map(|c| client.target().key(c));
            if let Some(claim) = &claim {
                if !client.put_if_absent(claim).map_err(|e| e.to_string())? {
                    return Ok(false);
                }
            }
            let mut attempt = 0;
            loop {
                match client.put_object(&key, object) {
                    Ok(()) => return Ok(true),
                    Err(err) if attempt >= *retries => {
                        // Not stored: the MEP is free for another writer.
                        if let Some(claim) = &claim {
                            let _ = client.delete_object(claim);
                        }
                        return Err(err.to_string());
                    }
                    Err(_) => {
                        attempt += 1;
                        std::thread::sleep(Duration::from_millis(200 << attempt));
                    }
                }
            }
        }
    }
}

/// Writes to a hidden temporary name and renames it into place, so that an
/// object is either absent or complete; an interrupted write leaves only a
/// `.tmp` file, which `evb store read` reports. With a claim to win, the
/// claim is made (a file created exclusively: atomic between processes)
/// between the two: after the bytes are down, so a failed write claims
/// nothing, and before the object is visible, so two writers never both
/// make it visible. False if the claim was taken already (looked at
/// first too, to save the write).
fn write_file(root: &Path, dest: &Dest<'_>, object: &[u8], sync: bool) -> Result<bool, String> {
    use std::io::Write;
    let path = root.join(dest.name);
    let claim = dest.claim.map(|c| root.join(c));
    if claim.as_ref().is_some_and(|c| c.exists()) {
        return Ok(false);
    }
    let file_name = path.file_name().expect("object name").to_string_lossy();
    let tmp = path.with_file_name(format!(".{file_name}.tmp"));
    let mut claimed = false;
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(object)?;
        if sync {
            file.sync_data()?;
        }
        if let Some(claim) = &claim {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(claim)
            {
                Ok(_) => claimed = true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        std::fs::rename(&tmp, &path).map(|()| true)
    })();
    if !matches!(result, Ok(true)) {
        // A full disk, or a MEP another writer claimed, leaves no half
        // object behind, nor a claim of an object not stored.
        let _ = std::fs::remove_file(&tmp);
        if claimed {
            if let Some(claim) = &claim {
                let _ = std::fs::remove_file(claim);
            }
        }
    }
    result.map_err(|e| format!("{}: {e}", path.display()))
}
