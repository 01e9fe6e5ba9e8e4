//! `evb._evb`: the native module of the evb Python package, on libevb's
//! core (`evb-ffi`): a consumer of a running event builder and a reader
//! of the event store, whose data Python reads in place.
//!
//! Every byte range handed to Python (a batch's payload, a fragment, an
//! event, a stored object's event) is a [`Bytes`]: an object with the
//! buffer protocol over memory it keeps alive, so `memoryview(x)` and
//! `numpy.frombuffer(x)` read it without a copy, and stay valid after the
//! batch is released (its buffer is then freed with the last view instead
//! of being used again). A consumer is single-threaded (`unsendable`: used
//! from the thread that opened it); it lets go of the GIL while it waits.

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use evb::batch::BatchIndex;
use evb::store::{Read, StoreReader};
use evb::{Consumer, ConsumerOptions, HeldBatch, Next, ReturnBox};
use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// What a [`Bytes`] reads: a held batch, or a stored object.
enum Owner {
    Batch(Arc<HeldBatch>),
    Object(Arc<evb::StoredObject>),
}

impl Owner {
    fn bytes(&self) -> &[u8] {
        match self {
            Owner::Batch(b) => b.payload(),
            Owner::Object(o) => o.bytes(),
        }
    }
}

/// Read-only bytes inside a batch or a stored object, without a copy
/// (the buffer protocol: `memoryview`, `numpy.frombuffer`, `bytes`).
#[pyclass(frozen, module = "evb._evb")]
struct Bytes {
    owner: Owner,
    start: usize,
    len: usize,
}

impl Bytes {
    /// `part`, a slice of `owner`'s bytes, as a Python object.
    fn of(py: Python<'_>, owner: Owner, part: &[u8]) -> PyResult<Py<Bytes>> {
        let base = owner.bytes().as_ptr() as usize;
        let start = part.as_ptr() as usize - base;
        let len = part.len();
        Py::new(py, Bytes { owner, start, len })
    }
}

#[pymethods]
impl Bytes {
    fn __len__(&self) -> usize {
        self.len
    }

    /// # Safety
    /// Called by Python with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if flags & pyo3::ffi::PyBUF_WRITABLE != 0 {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "evb data is read-only",
            ));
        }
        let this = slf.get();
        let data = &this.owner.bytes()[this.start..this.start + this.len];
        // SAFETY: `view` is Python's to fill; the memory stays valid while
        // the view holds a reference to `slf` (its `obj`), which owns it.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::ffi::c_void,
                data.len() as pyo3::ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// A built batch this program holds until it releases it (or until the
/// batch is garbage collected: its credit returns then).
#[pyclass(frozen, module = "evb._evb")]
struct Batch {
    /// `None` once released.
    held: std::sync::Mutex<Option<Arc<HeldBatch>>>,
    index: BatchIndex,
    returns: ReturnBox,
    #[pyo3(get)]
    mep: u64,
    #[pyo3(get)]
    events: u32,
    /// The BU (its index) that built it.
    #[pyo3(get)]
    bu: u16,
    /// Incomplete, delivered anyway: a missing source's fragment is empty.
    #[pyo3(get)]
    partial: bool,
}

impl Batch {
    fn held(&self) -> PyResult<Arc<HeldBatch>> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                PyRuntimeError::new_err(format!("batch of MEP {} was released", self.mep))
            })
    }

    /// A part of the payload, as `Bytes` that keep the batch's memory.
    fn part(
        &self,
        py: Python<'_>,
        pick: impl for<'a> FnOnce(&'a [u8]) -> Result<&'a [u8], String>,
    ) -> PyResult<Py<Bytes>> {
        let held = self.held()?;
        let part = pick(held.payload()).map_err(PyIndexError::new_err)?;
        let (start, len) = (
            part.as_ptr() as usize - held.payload().as_ptr() as usize,
            part.len(),
        );
        let all = held.payload();
        Bytes::of(py, Owner::Batch(held.clone()), &all[start..start + len])
    }

    /// Gives the batch back once: with its buffer (used again) unless
    /// views of it are still alive (then it is freed with the last one).
    fn give_back(&self) {
        let taken = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        match taken.map(Arc::try_unwrap) {
            Some(Ok(held)) => self.returns.give_back(held),
            Some(Err(shared)) => self.returns.give_back_key(shared.key()),
            None => {}
        }
    }
}

#[pymethods]
impl Batch {
    #[getter]
    fn sources(&self) -> u32 {
        self.index.sources()
    }

    /// The whole batch payload: fragment table, then the fragments.
    #[getter]
    fn payload(&self, py: Python<'_>) -> PyResult<Py<Bytes>> {
        self.part(py, |p| Ok(p))
    }

    /// Source `source`'s fragment: its event sizes (u32), then its events.
    fn fragment(&self, py: Python<'_>, source: u32) -> PyResult<Py<Bytes>> {
        self.part(py, |p| self.index.fragment(p, source))
    }

    /// Event `event`'s data from source `source` (it starts with the
    /// event's number, `mep * events + event`, as a little-endian u64).
    fn event(&self, py: Python<'_>, event: u32, source: u32) -> PyResult<Py<Bytes>> {
        self.part(py, |p| self.index.event(p, event, source))
    }

    /// Gives the batch back: its credit returns to its BU at the
    /// consumer's next call. Views of it stay valid.
    fn release(&self) {
        self.give_back();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _t: Option<Bound<'_, PyAny>>,
        _v: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.give_back();
        false
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// A consumer used with the GIL let go: it stays on this thread (the
/// closure of `Python::detach` runs here), which `Send` cannot say.
struct OnThisThread<T>(T);
// SAFETY: `Python::detach` runs the closure on the calling thread; the
// consumer never leaves it.
unsafe impl<T> Send for OnThisThread<T> {}

/// A Filter Unit in this process: joins a running event builder through
/// its rendezvous directory and receives built batches.
#[pyclass(unsendable, module = "evb._evb")]
struct ConsumerHandle {
    inner: Option<Consumer>,
    /// BUs lost so far: (BU index, reason).
    lost: Vec<(u16, String)>,
    ended: bool,
}

impl ConsumerHandle {
    fn consumer(&mut self) -> PyResult<&mut Consumer> {
        self.inner
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("the consumer is closed"))
    }
}

fn run_err(e: anyhow::Error) -> PyErr {
    PyRuntimeError::new_err(format!("{e:#}"))
}

#[pymethods]
impl ConsumerHandle {
    #[new]
    #[pyo3(signature = (rendezvous, rank=None, run_id=None, config=None, overrides=Vec::new(), wait=60.0))]
    fn new(
        py: Python<'_>,
        rendezvous: std::path::PathBuf,
        rank: Option<u16>,
        run_id: Option<u32>,
        config: Option<std::path::PathBuf>,
        overrides: Vec<String>,
        wait: f64,
    ) -> PyResult<ConsumerHandle> {
        evb::init_logging();
        let mut opts = ConsumerOptions::new(rendezvous);
        opts.rank = rank;
        opts.run_id = run_id;
        opts.config = config;
        opts.overrides = overrides;
        opts.wait =
            Duration::try_from_secs_f64(wait).map_err(|e| PyValueError::new_err(e.to_string()))?;
        // Joining waits for the other endpoints: without the GIL.
        let consumer = py.detach(|| {
            Consumer::open(opts)
                .map(OnThisThread)
                .map_err(|e| format!("{e:#}"))
        });
        let consumer = consumer.map_err(PyRuntimeError::new_err)?.0;
        Ok(ConsumerHandle {
            inner: Some(consumer),
            lost: Vec::new(),
            ended: false,
        })
    }

    /// The next batch within `timeout` seconds, or None (nothing came, or
    /// the run is over: see `ended`). Lost BUs go to `lost_bus`.
    #[pyo3(signature = (timeout=1.0))]
    fn next(&mut self, py: Python<'_>, timeout: f64) -> PyResult<Option<Batch>> {
        if !(timeout >= 0.0 && timeout.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "timeout must be a number of seconds >= 0, not {timeout}"
            )));
        }
        let c = self.consumer()?;
        let returns = c.return_box();
        let wait = OnThisThread(c);
        let next = py.detach(move || {
            let wait = wait;
            wait.0
                .next(Duration::from_secs_f64(timeout))
                .map_err(|e| format!("{e:#}"))
        });
        match next.map_err(PyRuntimeError::new_err)? {
            Next::Batch(held) => {
                let index = BatchIndex::new(held.payload(), held.events)
                    .map_err(PyRuntimeError::new_err)?;
                Ok(Some(Batch {
                    mep: held.mep,
                    events: held.events,
                    bu: held.bu_index,
                    partial: held.partial,
                    held: std::sync::Mutex::new(Some(Arc::new(held))),
                    index,
                    returns,
                }))
            }
            Next::BuLost {
                bu_index, reason, ..
            } => {
                self.lost.push((bu_index, reason));
                Ok(None)
            }
            Next::Timeout => Ok(None),
            Next::End => {
                self.ended = true;
                Ok(None)
            }
        }
    }

    /// Lets the consumer work (heartbeats, credits) for up to `timeout`
    /// seconds without taking a batch.
    fn poll(&mut self, timeout: f64) -> PyResult<()> {
        let d = Duration::try_from_secs_f64(timeout)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.consumer()?.poll(d).map_err(run_err)
    }

    /// The run is over for this consumer.
    #[getter]
    fn ended(&self) -> bool {
        self.ended
    }

    #[getter]
    fn lost_bus(&self) -> Vec<(u16, String)> {
        self.lost.clone()
    }

    #[getter]
    fn rank(&mut self) -> PyResult<u16> {
        Ok(self.consumer()?.rank())
    }

    /// Counters: received, consumed, corrupt, held...
    fn stats(&mut self) -> PyResult<std::collections::HashMap<&'static str, u64>> {
        let c = self.consumer()?;
        let s = c.stats();
        Ok([
            ("batches_received", s.batches_received),
            ("events_received", s.events_received),
            ("bytes_received", s.bytes_received),
            ("batches_consumed", s.batches_consumed),
            ("events_consumed", s.events_consumed),
            ("bytes_consumed", s.bytes_consumed),
            ("batches_corrupt", s.batches_corrupt),
            ("batches_partial", s.batches_partial),
            ("deliveries_unexpected", s.deliveries_unexpected),
            ("held", c.held() as u64),
        ]
        .into_iter()
        .collect())
    }

    /// Leaves the run (at its end, after the goodbyes) and writes the
    /// final report where `evb run` counts it.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(c) = self.inner.take() else {
            return Ok(());
        };
        // The goodbyes and the linger take a while: without the GIL.
        let c = OnThisThread(c);
        let closed = py.detach(move || {
            let c = c;
            c.0.close().map(|_| ()).map_err(|e| format!("{e:#}"))
        });
        closed.map_err(PyRuntimeError::new_err)
    }
}

/// A stored object (a batch, or a filter unit's selection of one),
/// verified.
#[pyclass(frozen, module = "evb._evb")]
struct StoredObject {
    object: Arc<evb::StoredObject>,
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    run_id: u32,
    /// The endpoint that wrote it.
    #[pyo3(get)]
    node: u16,
    #[pyo3(get)]
    mep: u64,
    /// Events stored, and the MEP's (more for a selection).
    #[pyo3(get)]
    events: u32,
    #[pyo3(get)]
    mep_events: u32,
}

#[pymethods]
impl StoredObject {
    /// The run's source indices stored, in column order.
    #[getter]
    fn sources(&self) -> Vec<u32> {
        self.object.view().sources()
    }

    /// The number within the MEP of stored event `event`.
    fn event_number(&self, event: u32) -> PyResult<u32> {
        self.check(event, 0)?;
        Ok(self.object.view().event_number(event))
    }

    /// Stored event `event`: its fragments back to back, in column order.
    fn event(&self, py: Python<'_>, event: u32) -> PyResult<Py<Bytes>> {
        self.check(event, 0)?;
        let part = self.object.view().event(event);
        Bytes::of(py, Owner::Object(self.object.clone()), part)
    }

    /// The fragment in column `column` of stored event `event`.
    fn fragment(&self, py: Python<'_>, event: u32, column: u32) -> PyResult<Py<Bytes>> {
        self.check(event, column)?;
        let part = self.object.view().fragment(event, column);
        Bytes::of(py, Owner::Object(self.object.clone()), part)
    }
}

impl StoredObject {
    fn check(&self, event: u32, column: u32) -> PyResult<()> {
        let h = self.object.view().header;
        if event >= h.event_count || (column > 0 && column >= h.source_count) {
            return Err(PyIndexError::new_err(format!(
                "event {event}, column {column} of {} events and {} sources",
                h.event_count, h.source_count
            )));
        }
        Ok(())
    }
}

/// An event store read object by object, each verified first.
#[pyclass(unsendable, module = "evb._evb")]
struct StoreHandle {
    reader: StoreReader,
    /// Objects that failed verification: (name, reason).
    bad: Vec<(String, String)>,
}

#[pymethods]
impl StoreHandle {
    #[new]
    #[pyo3(signature = (target, max_object_mib=0))]
    fn new(py: Python<'_>, target: String, max_object_mib: u32) -> PyResult<StoreHandle> {
        let max = u64::from(max_object_mib) << 20;
        let reader = py
            .detach(|| StoreReader::open(&target, max))
            .map_err(PyRuntimeError::new_err)?;
        Ok(StoreHandle {
            reader,
            bad: Vec::new(),
        })
    }

    /// The next good object, or None when every object was read (bad
    /// ones are skipped and listed in `bad`).
    fn next(&mut self) -> Option<StoredObject> {
        loop {
            match self.reader.next()? {
                Read::Good { name, object } => {
                    let v = object.view();
                    let (h, mep_events) = (v.header, v.mep_events());
                    return Some(StoredObject {
                        object: Arc::new(object),
                        name,
                        run_id: h.run_id,
                        node: h.node,
                        mep: h.mep,
                        events: h.event_count,
                        mep_events,
                    });
                }
                Read::Bad { name, reason } => self.bad.push((name, reason)),
            }
        }
    }

    #[getter]
    fn bad(&self) -> Vec<(String, String)> {
        self.bad.clone()
    }

    #[getter]
    fn remaining(&self) -> usize {
        self.reader.remaining()
    }
}

#[pymodule]
fn _evb(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Bytes>()?;
    m.add_class::<Batch>()?;
    m.add_class::<ConsumerHandle>()?;
    m.add_class::<StoredObject>()?;
    m.add_class::<StoreHandle>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
