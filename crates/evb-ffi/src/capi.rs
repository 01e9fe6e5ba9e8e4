//! The C interface (`evb.h`, made by cbindgen from this file).
//!
//! Every function returns a status (`EVB_OK` = 0, a positive outcome such
//! as `EVB_TIMEOUT` or `EVB_END`, or a negative error) and leaves a
//! message for the last error on the calling thread (`evb_last_error`).
//! Pointers and indices are checked; a panic inside is caught and becomes
//! `EVB_ERR_INTERNAL`, so none unwinds into C. Objects are opaque and
//! freed by their own function (`evb_consumer_close`, `evb_batch_release`
//! or `evb_consumer_release`, `evb_store_close`, `evb_object_free`).

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::thread::ThreadId;
use std::time::Duration;

use crate::batch::BatchIndex;
use crate::store::{Read, StoreReader};
use crate::{Consumer, ConsumerOptions, HeldBatch, Next, ReturnBox};

/// Success.
pub const EVB_OK: c_int = 0;
/// `evb_consumer_next`: nothing arrived within the time given.
pub const EVB_TIMEOUT: c_int = 1;
/// `evb_consumer_next`: the run is over, no batch will come;
/// `evb_store_next`: every object was read.
pub const EVB_END: c_int = 2;
/// `evb_consumer_next`: a BU was lost (`evb_consumer_lost_bu` says which);
/// nothing more comes from it, its batches already held stay valid.
pub const EVB_BU_LOST: c_int = 3;
/// A bad argument: a null pointer, an index out of range, bad UTF-8.
pub const EVB_ERR_ARG: c_int = -1;
/// The run could not be joined or went wrong (configuration, rendezvous,
/// transport, the network).
pub const EVB_ERR_RUN: c_int = -2;
/// `evb_store_next`: this object failed verification (the message names it
/// and what is wrong); the next call goes on with the next object.
pub const EVB_ERR_CORRUPT: c_int = -3;
/// The store could not be listed or read.
pub const EVB_ERR_STORE: c_int = -4;
/// A consumer used from another thread than the one that opened it.
pub const EVB_ERR_THREAD: c_int = -5;
/// A bug in libevb (a panic, caught): the message says where.
pub const EVB_ERR_INTERNAL: c_int = -6;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

type Outcome = Result<c_int, (c_int, String)>;

fn set_error(msg: String) {
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

/// Runs `f` for C: its status, with the message of an error (prefixed
/// with the function's name) left for `evb_last_error`; a panic is caught.
fn guard(name: &str, f: impl FnOnce() -> Outcome) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err((code, msg))) => {
            set_error(format!("{name}: {msg}"));
            code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_error(format!("{name}: internal error in libevb: {what}"));
            EVB_ERR_INTERNAL
        }
    }
}

fn arg<T>(p: *const T, what: &str) -> Result<*const T, (c_int, String)> {
    if p.is_null() {
        Err((EVB_ERR_ARG, format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text(p: *const c_char, what: &str) -> Result<String, (c_int, String)> {
    let p = arg(p, what)?;
    // SAFETY: not NULL, NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_string)
        .map_err(|_| (EVB_ERR_ARG, format!("{what} is not UTF-8")))
}

/// Writes `describe(*p)` to `out`: the `*_get_info` functions.
///
/// # Safety
/// `p` is NULL or points to a live `T`, `out` is NULL or writable.
unsafe fn describe<T, O>(
    name: &str,
    p: *const T,
    what: &str,
    out: *mut O,
    describe: impl FnOnce(&T) -> O,
) -> c_int {
    guard(name, || {
        let out = arg(out, "info")?.cast_mut();
        // SAFETY: a live `T` by the caller's contract.
        let value = describe(unsafe { &*arg(p, what)? });
        // SAFETY: `out` is writable.
        unsafe { out.write(value) };
        Ok(EVB_OK)
    })
}

fn run_error(e: anyhow::Error) -> (c_int, String) {
    (EVB_ERR_RUN, format!("{e:#}"))
}

/// Bytes inside a batch or an object: valid while it is held.
#[repr(C)]
pub struct evb_bytes {
    pub data: *const u8,
    pub len: usize,
}

impl evb_bytes {
    fn of(b: &[u8]) -> evb_bytes {
        evb_bytes {
            data: b.as_ptr(),
            len: b.len(),
        }
    }
}

/// The message of the last error on this thread ("" if none): valid until
/// the next failing call on this thread.
#[no_mangle]
pub extern "C" fn evb_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library's version, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn evb_version() -> *const c_char {
    crate::VERSION.as_ptr().cast()
}

/// The name of a status code ("EVB_OK", "EVB_ERR_RUN", ...).
#[no_mangle]
pub extern "C" fn evb_status_name(status: c_int) -> *const c_char {
    let name: &'static [u8] = match status {
        EVB_OK => b"EVB_OK\0",
        EVB_TIMEOUT => b"EVB_TIMEOUT\0",
        EVB_END => b"EVB_END\0",
        EVB_BU_LOST => b"EVB_BU_LOST\0",
        EVB_ERR_ARG => b"EVB_ERR_ARG\0",
        EVB_ERR_RUN => b"EVB_ERR_RUN\0",
        EVB_ERR_CORRUPT => b"EVB_ERR_CORRUPT\0",
        EVB_ERR_STORE => b"EVB_ERR_STORE\0",
        EVB_ERR_THREAD => b"EVB_ERR_THREAD\0",
        EVB_ERR_INTERNAL => b"EVB_ERR_INTERNAL\0",
        _ => b"unknown status\0",
    };
    name.as_ptr().cast()
}

// ---------------------------------------------------------------- consumer

/// How a consumer joins a run. Fill with `evb_consumer_options_init`,
/// then set what differs.
#[repr(C)]
pub struct evb_consumer_options {
    /// The run's rendezvous directory (`evb run --rendezvous DIR`, or a
    /// cluster job's). Required.
    pub rendezvous: *const c_char,
    /// The run id; negative: the only run in the directory.
    pub run_id: i64,
    /// This consumer's endpoint; negative: the first external consumer
    /// rank `evb run` left that no other consumer took.
    pub rank: i32,
    /// The run's configuration file; NULL: the one `evb run` published.
    pub config: *const c_char,
    /// `section.key=value` overrides (`n_overrides` strings).
    pub overrides: *const *const c_char,
    pub n_overrides: usize,
    /// How long to wait for the run to be published, ms (the consumer
    /// may start before the event builder); 60000 by default.
    pub wait_ms: u32,
}

/// A Filter Unit endpoint in this process.
pub struct evb_consumer {
    inner: Consumer,
    owner: ThreadId,
    /// The last lost BU `evb_consumer_next` told of.
    lost_bu: Option<(u16, CString)>,
}

/// A built batch this program holds, until released.
pub struct evb_batch {
    held: HeldBatch,
    index: BatchIndex,
    returns: ReturnBox,
}

/// What a batch is.
#[repr(C)]
pub struct evb_batch_info {
    pub mep: u64,
    pub events: u32,
    /// Fragments per event (the run's sources).
    pub sources: u32,
    /// The BU that built it (BU index) and its endpoint.
    pub bu: u16,
    pub bu_endpoint: u16,
    /// 1: incomplete, delivered anyway (`output.deliver_partial`): a
    /// missing source's fragment is empty.
    pub partial: c_int,
    /// The whole batch payload (fragment table, then the fragments).
    pub payload: evb_bytes,
}

/// A consumer's counters: what it handed out and what came back.
#[repr(C)]
pub struct evb_consumer_stats {
    /// This consumer's endpoint and consumer index.
    pub rank: u16,
    pub fu_index: u16,
    /// Batches done with (released, or corrupt and never handed out),
    /// their events and payload bytes.
    pub batches: u64,
    pub events: u64,
    pub bytes: u64,
    /// Batches handed out and not released yet.
    pub held: u64,
    /// Batches that failed verification (never handed out), and batches
    /// flagged partial (handed out: a missing source's fragment is empty).
    pub corrupt: u64,
    pub partial: u64,
    /// Deliveries refused: beyond the credit granted, from a non-BU, or
    /// of another run.
    pub unexpected: u64,
}

/// Sets the defaults: no rendezvous, the only run, any free rank, the
/// published configuration, no overrides, a 60 s wait for the run.
///
/// # Safety
/// `options` is NULL or points to a writable `evb_consumer_options`.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_options_init(options: *mut evb_consumer_options) -> c_int {
    guard("evb_consumer_options_init", || {
        let o = arg(options, "options")?.cast_mut();
        // SAFETY: checked not NULL; writable by the caller's contract.
        unsafe {
            o.write(evb_consumer_options {
                rendezvous: std::ptr::null(),
                run_id: -1,
                rank: -1,
                config: std::ptr::null(),
                overrides: std::ptr::null(),
                n_overrides: 0,
                wait_ms: 60_000,
            });
        }
        Ok(EVB_OK)
    })
}

/// The options as the Rust side takes them.
///
/// # Safety
/// `o`'s strings are NUL-terminated, `overrides` has `n_overrides` of them.
unsafe fn consumer_options(o: &evb_consumer_options) -> Result<ConsumerOptions, (c_int, String)> {
    // SAFETY: the caller's contract on `o`.
    let mut opts = ConsumerOptions::new(unsafe { text(o.rendezvous, "options->rendezvous")? });
    opts.run_id = match o.run_id {
        r if r < 0 => None,
        r => Some(u32::try_from(r).map_err(|_| (EVB_ERR_ARG, format!("run_id {r} is too large")))?),
    };
    opts.rank = match o.rank {
        r if r < 0 => None,
        r => Some(u16::try_from(r).map_err(|_| (EVB_ERR_ARG, format!("rank {r} is too large")))?),
    };
    opts.wait = Duration::from_millis(u64::from(o.wait_ms));
    if !o.config.is_null() {
        // SAFETY: not NULL, the caller's contract.
        opts.config = Some(PathBuf::from(unsafe { text(o.config, "options->config")? }));
    }
    if o.n_overrides > 0 {
        let list = arg(o.overrides, "options->overrides")?;
        for i in 0..o.n_overrides {
            // SAFETY: `overrides` has `n_overrides` entries.
            let p = unsafe { *list.add(i) };
            // SAFETY: each is a NUL-terminated string.
            opts.overrides
                .push(unsafe { text(p, &format!("options->overrides[{i}]"))? });
        }
    }
    Ok(opts)
}

/// Joins a run as a Filter Unit: reads its configuration, takes a
/// consumer rank, exchanges addresses and connects to every endpoint (the
/// start barrier: returns once the run can start), and grants every BU
/// its credits. The consumer belongs to the calling thread.
///
/// # Safety
/// `options` points to an `evb_consumer_options`, `out` to a writable
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_open(
    options: *const evb_consumer_options,
    out: *mut *mut evb_consumer,
) -> c_int {
    guard("evb_consumer_open", || {
        let out = arg(out, "out")?.cast_mut();
        // SAFETY: checked not NULL, valid by the caller's contract.
        let o = unsafe { &*arg(options, "options")? };
        // SAFETY: the caller's contract on `options`.
        let opts = unsafe { consumer_options(o)? };
        crate::init_logging();
        let inner = Consumer::open(opts).map_err(run_error)?;
        let c = Box::new(evb_consumer {
            inner,
            owner: std::thread::current().id(),
            lost_bu: None,
        });
        // SAFETY: `out` is writable.
        unsafe { out.write(Box::into_raw(c)) };
        Ok(EVB_OK)
    })
}

/// The consumer behind `c`, on its own thread only.
///
/// # Safety
/// `c` is NULL or a consumer from `evb_consumer_open` not closed yet.
unsafe fn consumer<'a>(c: *mut evb_consumer) -> Result<&'a mut evb_consumer, (c_int, String)> {
    let c = arg(c, "consumer")?.cast_mut();
    // SAFETY: a live consumer by the caller's contract.
    let c = unsafe { &mut *c };
    if c.owner != std::thread::current().id() {
        return Err((
            EVB_ERR_THREAD,
            "called from another thread than the one that opened the consumer".into(),
        ));
    }
    Ok(c)
}

fn millis(timeout_ms: i32) -> Duration {
    Duration::from_millis(timeout_ms.max(0) as u64)
}

/// Waits up to `timeout_ms` for the next built batch: `EVB_OK` with
/// `*out` set (the program holds it until it releases it), `EVB_TIMEOUT`,
/// `EVB_BU_LOST` (a BU was lost; `*out` is NULL), or `EVB_END` (the run is
/// over: close the consumer). Heartbeats and credits go on meanwhile.
///
/// # Safety
/// `c` is an open consumer, `out` a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_next(
    c: *mut evb_consumer,
    timeout_ms: i32,
    out: *mut *mut evb_batch,
) -> c_int {
    guard("evb_consumer_next", || {
        let out = arg(out, "out")?.cast_mut();
        // SAFETY: `out` is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller's contract on `c`.
        let c = unsafe { consumer(c)? };
        match c.inner.next(millis(timeout_ms)).map_err(run_error)? {
            Next::Batch(held) => {
                let index = BatchIndex::new(held.payload(), held.events)
                    .map_err(|e| (EVB_ERR_RUN, format!("MEP {}: {e}", held.mep)))?;
                let b = Box::new(evb_batch {
                    held,
                    index,
                    returns: c.inner.return_box(),
                });
                // SAFETY: `out` is writable.
                unsafe { out.write(Box::into_raw(b)) };
                Ok(EVB_OK)
            }
            Next::BuLost {
                bu_index, reason, ..
            } => {
                let reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
                c.lost_bu = Some((bu_index, reason));
                Ok(EVB_BU_LOST)
            }
            Next::Timeout => Ok(EVB_TIMEOUT),
            Next::End => Ok(EVB_END),
        }
    })
}

/// The BU the last `EVB_BU_LOST` was about: its index (and why, in
/// `*reason` if not NULL, valid until the next loss); -1 if none was lost.
///
/// # Safety
/// `c` is an open consumer, `reason` NULL or a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_lost_bu(
    c: *mut evb_consumer,
    reason: *mut *const c_char,
) -> c_int {
    guard("evb_consumer_lost_bu", || {
        // SAFETY: the caller's contract on `c`.
        let c = unsafe { consumer(c)? };
        let Some((bu, why)) = &c.lost_bu else {
            return Ok(-1);
        };
        if !reason.is_null() {
            // SAFETY: not NULL, writable.
            unsafe { reason.write(why.as_ptr()) };
        }
        Ok(c_int::from(*bu))
    })
}

/// Lets the consumer work (heartbeats, credits of batches released from
/// other threads) for up to `timeout_ms` without taking a batch: call it
/// while the program works on batches longer than the peer timeout.
///
/// # Safety
/// `c` is an open consumer.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_poll(c: *mut evb_consumer, timeout_ms: i32) -> c_int {
    guard("evb_consumer_poll", || {
        // SAFETY: the caller's contract on `c`.
        let c = unsafe { consumer(c)? };
        c.inner.poll(millis(timeout_ms)).map_err(run_error)?;
        Ok(EVB_OK)
    })
}

/// Gives batch `b` back on the consumer's thread: its credit returns to
/// its BU at once, its buffer is used again. `b` is freed.
///
/// # Safety
/// `c` is an open consumer, `b` a batch it handed out, not released yet.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_release(c: *mut evb_consumer, b: *mut evb_batch) -> c_int {
    guard("evb_consumer_release", || {
        let b = arg(b, "batch")?.cast_mut();
        // SAFETY: the caller's contract on `c`.
        let c = unsafe { consumer(c)? };
        // SAFETY: a live batch from `Box::into_raw`, given up by the caller.
        let b = unsafe { Box::from_raw(b) };
        c.inner.release(b.held).map_err(run_error)?;
        Ok(EVB_OK)
    })
}

/// Gives batch `b` back from any thread: its credit returns at the
/// consumer's next call on its own thread (`evb_consumer_next` or
/// `evb_consumer_poll`, which look for such batches every millisecond
/// while they wait). `b` is freed.
///
/// # Safety
/// `b` is a batch a consumer handed out, not released yet.
#[no_mangle]
pub unsafe extern "C" fn evb_batch_release(b: *mut evb_batch) -> c_int {
    guard("evb_batch_release", || {
        let b = arg(b, "batch")?.cast_mut();
        // SAFETY: a live batch from `Box::into_raw`, given up by the caller.
        let b = unsafe { Box::from_raw(b) };
        b.returns.give_back(b.held);
        Ok(EVB_OK)
    })
}

/// What batch `b` is.
///
/// # Safety
/// `b` is a held batch, `info` writable.
#[no_mangle]
pub unsafe extern "C" fn evb_batch_get_info(
    b: *const evb_batch,
    info: *mut evb_batch_info,
) -> c_int {
    let what = |b: &evb_batch| evb_batch_info {
        mep: b.held.mep,
        events: b.held.events,
        sources: b.index.sources(),
        bu: b.held.bu_index,
        bu_endpoint: b.held.bu,
        partial: c_int::from(b.held.partial),
        payload: evb_bytes::of(b.held.payload()),
    };
    // SAFETY: the caller's contract.
    unsafe { describe("evb_batch_get_info", b, "batch", info, what) }
}

/// Writes to `out` the part of batch `b` that `pick` finds in it.
///
/// # Safety
/// `b` is NULL or a held batch, `out` NULL or writable.
unsafe fn batch_part(
    name: &str,
    b: *const evb_batch,
    out: *mut evb_bytes,
    pick: impl for<'a> FnOnce(&BatchIndex, &'a [u8]) -> Result<&'a [u8], String>,
) -> c_int {
    guard(name, || {
        let out = arg(out, "out")?.cast_mut();
        // SAFETY: a live batch by the caller's contract.
        let b = unsafe { &*arg(b, "batch")? };
        let part = pick(&b.index, b.held.payload()).map_err(|e| (EVB_ERR_ARG, e))?;
        // SAFETY: `out` is writable.
        unsafe { out.write(evb_bytes::of(part)) };
        Ok(EVB_OK)
    })
}

/// Source `source`'s fragment of batch `b` (its event sizes as u32
/// little-endian, then its events); empty for a source a partial batch
/// lacks.
///
/// # Safety
/// `b` is a held batch, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn evb_batch_fragment(
    b: *const evb_batch,
    source: u32,
    out: *mut evb_bytes,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { batch_part("evb_batch_fragment", b, out, |i, p| i.fragment(p, source)) }
}

/// Event `event`'s data from source `source` in batch `b` (each event
/// starts with its number, `mep * events + event`, as a u64
/// little-endian).
///
/// # Safety
/// `b` is a held batch, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn evb_batch_event(
    b: *const evb_batch,
    event: u32,
    source: u32,
    out: *mut evb_bytes,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { batch_part("evb_batch_event", b, out, |i, p| i.event(p, event, source)) }
}

/// This consumer's counters.
///
/// # Safety
/// `c` is an open consumer, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_get_stats(
    c: *mut evb_consumer,
    out: *mut evb_consumer_stats,
) -> c_int {
    guard("evb_consumer_get_stats", || {
        let out = arg(out, "out")?.cast_mut();
        // SAFETY: the caller's contract on `c`.
        let c = unsafe { consumer(c)? };
        let s = c.inner.stats();
        // SAFETY: `out` is writable.
        unsafe {
            out.write(evb_consumer_stats {
                rank: c.inner.rank(),
                fu_index: c.inner.fu_index(),
                batches: s.batches_consumed,
                events: s.events_consumed,
                bytes: s.bytes_consumed,
                held: c.inner.held() as u64,
                corrupt: s.batches_corrupt,
                partial: s.batches_partial,
                unexpected: s.deliveries_unexpected,
            });
        }
        Ok(EVB_OK)
    })
}

/// Leaves the run and frees the consumer: after `EVB_END`, once the peers
/// said goodbye (as evb's own consumers do); before it, at once (the BUs
/// give the batches it did not consume to other consumers). Writes its
/// final report to the rendezvous directory, where `evb run` counts it.
/// Batches still held are not freed (release them first).
///
/// # Safety
/// `c` is an open consumer; it is freed whatever the status, unless the
/// status is `EVB_ERR_ARG` or `EVB_ERR_THREAD` (not a consumer of this
/// thread).
#[no_mangle]
pub unsafe extern "C" fn evb_consumer_close(c: *mut evb_consumer) -> c_int {
    guard("evb_consumer_close", || {
        // SAFETY: the caller's contract on `c`.
        unsafe { consumer(c)? };
        // SAFETY: a live consumer from `Box::into_raw`, given up.
        let c = unsafe { Box::from_raw(c) };
        c.inner.close().map_err(run_error)?;
        Ok(EVB_OK)
    })
}

// ------------------------------------------------------------------- store

/// An event store being read, object by object.
pub struct evb_store {
    reader: StoreReader,
}

/// One verified stored object (a batch, or a filter unit's selection of
/// one).
pub struct evb_object {
    name: CString,
    object: crate::StoredObject,
}

/// What a stored object is.
#[repr(C)]
pub struct evb_object_info {
    /// Its name under the store (`run<id>/node<n>/<mep>.evbo`).
    pub name: *const c_char,
    pub run_id: u32,
    /// The endpoint that wrote it (a BU, or a consumer).
    pub node: u16,
    pub version: u16,
    pub mep: u64,
    /// Events stored, and the MEP's events (more for a selection).
    pub events: u32,
    pub mep_events: u32,
    /// Sources stored (fragments per event), of the run's.
    pub sources: u32,
    pub run_sources: u32,
}

/// Lists a store: a directory, an object file, or
/// `s3://bucket/prefix?endpoint=URL` (credentials from AWS_ACCESS_KEY_ID
/// and AWS_SECRET_ACCESS_KEY). `max_object_mib`: objects larger are
/// reported bad without being read (0: 4096).
///
/// # Safety
/// `target` is a NUL-terminated string, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn evb_store_open(
    target: *const c_char,
    max_object_mib: u32,
    out: *mut *mut evb_store,
) -> c_int {
    guard("evb_store_open", || {
        let out = arg(out, "out")?.cast_mut();
        // SAFETY: the caller's contract on `target`.
        let target = unsafe { text(target, "target")? };
        let max = u64::from(max_object_mib) << 20;
        let reader = StoreReader::open(&target, max).map_err(|e| (EVB_ERR_STORE, e))?;
        // SAFETY: `out` is writable.
        unsafe { out.write(Box::into_raw(Box::new(evb_store { reader }))) };
        Ok(EVB_OK)
    })
}

/// Objects not read yet.
///
/// # Safety
/// `s` is an open store.
#[no_mangle]
pub unsafe extern "C" fn evb_store_remaining(s: *const evb_store) -> usize {
    // SAFETY: NULL or an open store by the caller's contract.
    unsafe { s.as_ref() }.map_or(0, |s| s.reader.remaining())
}

/// Reads and verifies the next object: `EVB_OK` with `*out` set (free it
/// with `evb_object_free`), `EVB_END` when all were read, or
/// `EVB_ERR_CORRUPT` for a bad object (`evb_last_error` names it and what
/// is wrong; call again for the next).
///
/// # Safety
/// `s` is an open store, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn evb_store_next(s: *mut evb_store, out: *mut *mut evb_object) -> c_int {
    guard("evb_store_next", || {
        let out = arg(out, "out")?.cast_mut();
        // SAFETY: `out` is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: an open store by the caller's contract.
        let s = unsafe { &mut *arg(s, "store")?.cast_mut() };
        match s.reader.next() {
            None => Ok(EVB_END),
            Some(Read::Bad { name, reason }) => Err((EVB_ERR_CORRUPT, format!("{name}: {reason}"))),
            Some(Read::Good { name, object }) => {
                let name = CString::new(name.replace('\0', " ")).unwrap_or_default();
                // SAFETY: `out` is writable.
                unsafe { out.write(Box::into_raw(Box::new(evb_object { name, object }))) };
                Ok(EVB_OK)
            }
        }
    })
}

/// Frees a store.
///
/// # Safety
/// `s` is NULL or an open store; it is freed.
#[no_mangle]
pub unsafe extern "C" fn evb_store_close(s: *mut evb_store) {
    if !s.is_null() {
        // SAFETY: from `Box::into_raw`, given up by the caller.
        drop(unsafe { Box::from_raw(s) });
    }
}

/// What object `o` is.
///
/// # Safety
/// `o` is a live object, `info` writable.
#[no_mangle]
pub unsafe extern "C" fn evb_object_get_info(
    o: *const evb_object,
    info: *mut evb_object_info,
) -> c_int {
    let what = |o: &evb_object| {
        let v = o.object.view();
        evb_object_info {
            name: o.name.as_ptr(),
            run_id: v.header.run_id,
            node: v.header.node,
            version: v.header.version,
            mep: v.header.mep,
            events: v.header.event_count,
            mep_events: v.mep_events(),
            sources: v.header.source_count,
            run_sources: v.run_sources(),
        }
    };
    // SAFETY: the caller's contract.
    unsafe { describe("evb_object_get_info", o, "object", info, what) }
}

/// Writes to `out` the part `pick` takes of object `o` once `event` (and
/// `column`) are in range, and the number it gives to `number` (if not
/// NULL).
///
/// # Safety
/// `o` is NULL or a live object, `out` NULL or writable, `number` NULL or
/// writable.
unsafe fn object_part(
    name: &str,
    o: *const evb_object,
    (event, column): (u32, Option<u32>),
    out: *mut evb_bytes,
    number: *mut u32,
    pick: impl FnOnce(::evb_store::StoredBatch<'_>) -> (evb_bytes, u32),
) -> c_int {
    guard(name, || {
        let out = arg(out, "out")?.cast_mut();
        // SAFETY: a live object by the caller's contract.
        let v = unsafe { &*arg(o, "object")? }.object.view();
        let (events, sources) = (v.header.event_count, v.header.source_count);
        if event >= events || column.is_some_and(|c| c >= sources) {
            let column = column.map_or(String::new(), |c| format!(", column {c}"));
            let msg = format!("event {event}{column} of {events} events and {sources} sources");
            return Err((EVB_ERR_ARG, msg));
        }
        let (part, n) = pick(v);
        // SAFETY: `out` writable, `number` NULL or writable.
        unsafe {
            out.write(part);
            if !number.is_null() {
                number.write(n);
            }
        }
        Ok(EVB_OK)
    })
}

/// Stored event `event` of object `o`: its fragments back to back, in
/// source order; `*number` (if not NULL) its number within the MEP.
///
/// # Safety
/// `o` is a live object, `out` writable, `number` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn evb_object_event(
    o: *const evb_object,
    event: u32,
    out: *mut evb_bytes,
    number: *mut u32,
) -> c_int {
    let pick =
        |v: ::evb_store::StoredBatch<'_>| (evb_bytes::of(v.event(event)), v.event_number(event));
    // SAFETY: the caller's contract.
    unsafe { object_part("evb_object_event", o, (event, None), out, number, pick) }
}

/// The fragment in stored column `column` of event `event` of object `o`;
/// `*source` (if not NULL) the run's source index of that column.
///
/// # Safety
/// `o` is a live object, `out` writable, `source` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn evb_object_fragment(
    o: *const evb_object,
    event: u32,
    column: u32,
    out: *mut evb_bytes,
    source: *mut u32,
) -> c_int {
    let pick = |v: ::evb_store::StoredBatch<'_>| {
        (evb_bytes::of(v.fragment(event, column)), v.source(column))
    };
    let at = (event, Some(column));
    // SAFETY: the caller's contract.
    unsafe { object_part("evb_object_fragment", o, at, out, source, pick) }
}

/// Frees an object.
///
/// # Safety
/// `o` is NULL or a live object; it is freed.
#[no_mangle]
pub unsafe extern "C" fn evb_object_free(o: *mut evb_object) {
    if !o.is_null() {
        // SAFETY: from `Box::into_raw`, given up by the caller.
        drop(unsafe { Box::from_raw(o) });
    }
}
