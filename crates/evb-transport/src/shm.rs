//! Shared memory between the processes of one host.
//!
//! Every process creates an inbox in `/dev/shm`: one single-producer
//! single-consumer ring per possible sender, and a doorbell (a futex word)
//! that senders ring after writing. A message up to [`INLINE_MAX`] bytes is
//! copied into the ring; a larger one is described in the ring (the
//! sender's pid and the address of its bytes) and the receiver copies it
//! once, straight from the sender's memory into the buffer it keeps, with
//! `process_vm_readv` (cross-memory attach, as MPI's shared-memory
//! transports do). The sender's buffer stays untouched until the
//! receiver's tail has moved past the record, which is the send's
//! completion: no acknowledgement messages.
//!
//! Zero copy ([`ShmEndpoint::share_slots`], `transport.shm_zero_copy`): an
//! RU's MEP buffers are the slots of a memfd ([`crate::mepbuf::SlotStore`])
//! that its peers map read-only (they take the fd with `pidfd_getfd`,
//! which needs the same permission as `process_vm_readv`). A fragment in a
//! slot is described in the ring (slot, offset, length and a send
//! sequence number) and the receiver reads it where it is: a
//! [`SharedView`], kept by the BU's batch until the batch is done, the
//! local analogue of an RDMA read in PULL. Dropping the view releases the
//! slot: the reader writes the send's sequence number into its word of
//! the store's control area (one per slot and reader) and rings the
//! sender. The send completes then, not when the record is read, and the
//! sender keeps its handle on the buffer until that, so a slot is never
//! written while a reader may look at it. A reader that dies releases
//! everything (its views die with it: the sender drops its handles when
//! the process is gone); records a reader discards unread (a relink drops
//! what the old link left in a ring) are released as they are discarded.
//!
//! Waiting is a futex wait on the doorbell (blocking progress; while
//! traffic flows it yields the core instead, for [`YIELDS_BEFORE_SLEEP`]
//! waits that found nothing) or a spin (busy progress). A receiver that consumed records rings the sender's
//! doorbell too, so a sender waiting for ring space or completions wakes.
//!
//! Rejoin (when the runtime enables it: under `evb run --restart`): an
//! inbox keeps its name in /dev/shm for the whole run (the launcher
//! removes those of killed nodes). A restarted node creates a new inbox (its name carries
//! the new pid) and, in each live peer's inbox, writes its pid into its
//! join slot, bumps the slot's request generation and rings. The peer
//! takes it in once the old incarnation's process is gone (so nothing can
//! write into the old ring any more): it maps the new inbox, drops
//! whatever the dead incarnation left unread in its ring, resets that ring
//! to position 0, and only then answers with the generation it accepted.
//! The restarted node writes only after that answer, so the peer never
//! reads the dead incarnation's records as the new one's; the generation
//! tells one request (and so one incarnation) from the next. Inboxes stay
//! 0600 and a peer maps only one owned by its own user.
//!
//! Relink (always on): a link the runtime dropped while the peer's process
//! is still there (it was stopped, or starved of CPU, or this one was)
//! comes back through the same join slots, with the mappings both ends
//! still hold. The dropping side stops writing into the peer's ring and
//! reading the peer's ring in its own inbox, then asks with its own pid and
//! the next *link epoch*. The peer sees the same pid and a newer epoch:
//! what its ring from the asker holds was all written before the request,
//! so it drops it (tail to head), and answers with the position where its
//! own writes of the new link start in the asker's inbox (`JOIN_HEAD`,
//! before the accepted generation); the asker reads from there. No record
//! of the old link is read after the relink, none twice. Both ends asking
//! at once: the lower rank answers (the higher waits for that answer, and
//! its own request is then for the epoch the link has: ignored). A link
//! dropped again within 5 s of coming back is asked for after a backoff
//! (50 ms doubling to 1 s).

use std::collections::VecDeque;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::msg::{Body, Completion, Endpoint};
use super::{CrcPolicy, Progress};
use crate::mepbuf::{MepBuf, SlotStore};
use crate::process::process_runnable;
use evb_core::wire::{FragmentHeader, FRAGMENT_HEADER_LEN, FRAME_HEADER_LEN};
use std::cell::RefCell;
use std::rc::Rc;

/// Blocking waits that only yield the core, after progress last completed
/// something, before a wait sleeps on the doorbell. While traffic flows a
/// futex sleep per wait costs a wake-up (a system call and an IPI for the
/// sender, a context switch for both): `evb run -n 4` built 15-20 % less.
/// Fewer than the other transports' 256: idle, every wake-up spins this
/// many yields before it sleeps again.
const YIELDS_BEFORE_SLEEP: u32 = 64;
/// Messages up to this size travel inside the ring.
pub const INLINE_MAX: usize = 16 << 10;
const MAGIC: u64 = 0x6576_625f_7368_6d33; // "evb_shm3"
/// Where the join slots start in an inbox's header, and the size of one.
const JOIN_SLOTS: usize = 256;
const JOIN_SLOT_BYTES: usize = 64;
const RING_CONTROL_BYTES: usize = 256;
const RECORD_HEADER: usize = 32;
const KIND_INLINE: u32 = 1;
const KIND_REMOTE: u32 = 2;
/// A payload in one of the sender's shared slots, read in place. After the
/// record header: the send's sequence number (u64) and the slot (u32, 4
/// bytes of padding), then the inline head.
const KIND_SHARED: u32 = 3;
const SHARED_EXTRA: usize = 16;
/// Where an inbox's header says where its owner's shared slots are (u64
/// words; `NO_SLOTS` in the first when it has none): the memfd's number in
/// the owner's process, the mapping's length, where slot 0 starts, the
/// stride between slots, a slot's size, the number of slots.
const SLOTS_FD: usize = 16;
const SLOTS_MAP_LEN: usize = 24;
const SLOTS_DATA: usize = 32;
const SLOTS_STRIDE: usize = 40;
const SLOTS_BYTES: usize = 48;
const SLOTS_COUNT: usize = 56;
const NO_SLOTS: u64 = u64::MAX;

/// Bytes of the control area a shared store needs in front of its slots:
/// one release word (u64) per slot and reader endpoint.
pub fn release_words_bytes(slots: u32, endpoints: u16) -> usize {
    slots as usize * endpoints as usize * 8
}

/// One mapped inbox (ours, or a peer's that we write into).
struct Mapping {
    base: *mut u8,
    len: usize,
}

impl Mapping {
    fn create(path: &str, len: usize) -> Result<Mapping> {
        Self::map(path, len, true)
    }

    fn open(path: &str, len: usize) -> Result<Mapping> {
        Self::map(path, len, false)
    }

    fn map(path: &str, len: usize, create: bool) -> Result<Mapping> {
        let c = CString::new(path).context("shm path")?;
        let flags = if create {
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL
        } else {
            libc::O_RDWR
        };
        // SAFETY: plain syscalls on a path we own; the fd is closed below.
        unsafe {
            let fd = libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o600);
            if fd < 0 {
                bail!("opening {path}: {}", std::io::Error::last_os_error());
            }
            if create && libc::ftruncate(fd, len as libc::off_t) != 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                libc::unlink(c.as_ptr());
                bail!("sizing {path} to {len} bytes: {e}");
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 || (st.st_size as usize) < len {
                libc::close(fd);
                bail!("{path} is smaller than the {len} bytes its owner announced");
            }
            // Only an inbox of ours, that nobody else can open, is one of
            // this run's.
            if st.st_uid != libc::geteuid() || st.st_mode & 0o077 != 0 {
                libc::close(fd);
                bail!(
                    "{path} belongs to uid {} with mode {:o}: not an inbox of this user's run",
                    st.st_uid,
                    st.st_mode & 0o777
                );
            }
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            if base == libc::MAP_FAILED {
                bail!("mapping {path}: {}", std::io::Error::last_os_error());
            }
            Ok(Mapping {
                base: base as *mut u8,
                len,
            })
        }
    }

    /// Makes `len` bytes from `offset` resident now rather than page by
    /// page as a ring's positions first go round it: a ring is touched
    /// whole after its first lap anyway, and at a low message rate that
    /// lap took minutes, so the resident memory of a run crept up by the
    /// rings' size (a few MiB a node) long after its start.
    fn populate(&self, offset: usize, len: usize) {
        // SAFETY: sysconf has no preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        let start = offset / page * page;
        let end = (offset + len)
            .div_ceil(page)
            .saturating_mul(page)
            .min(self.len);
        if start >= end {
            return;
        }
        // A write fault without writing (Linux >= 5.14): the peer may be
        // using the range already.
        // SAFETY: a page-aligned range inside our mapping.
        let r = unsafe {
            libc::madvise(
                self.base.add(start) as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            // Older kernels: an atomic add of zero is a write that leaves
            // any concurrent content as it is.
            for at in (start..end).step_by(page) {
                self.atomic_u64(at).fetch_add(0, Ordering::Relaxed);
            }
        }
    }

    /// Bytes of this mapping resident in this process (from mincore).
    #[cfg(test)]
    fn resident(&self) -> usize {
        // SAFETY: sysconf has no preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        let mut vec = vec![0u8; self.len.div_ceil(page)];
        // SAFETY: base/len are our mapping; vec has one byte per page.
        let r =
            unsafe { libc::mincore(self.base as *mut libc::c_void, self.len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count() * page
    }

    fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset + 4 <= self.len && offset.is_multiple_of(4));
        // SAFETY: in bounds, aligned, and the mapping outlives the borrow.
        unsafe { &*(self.base.add(offset) as *const AtomicU32) }
    }

    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset + 8 <= self.len && offset.is_multiple_of(8));
        // SAFETY: as above.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len came from a successful mmap.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}

/// A ring's data bytes in a mapping: made only by `ShmEndpoint::ring_data`,
/// which checks they lie within it. Copy: it lives no longer than the
/// borrow of the endpoint it came from in practice (rings are only
/// unmapped when the endpoint drops).
#[derive(Clone, Copy)]
struct RingBytes {
    data: *mut u8,
    cap: usize,
}

/// Offsets inside an inbox.
#[derive(Clone, Copy)]
struct Geometry {
    endpoints: usize,
    ring_bytes: usize,
}

impl Geometry {
    /// The header: identity, doorbell, and one join slot per sender.
    fn header(&self) -> usize {
        (JOIN_SLOTS + self.endpoints * JOIN_SLOT_BYTES).next_multiple_of(4096)
    }
    fn total(&self) -> usize {
        self.header() + self.endpoints * (RING_CONTROL_BYTES + self.ring_bytes)
    }
    fn ring(&self, sender: usize) -> usize {
        self.header() + sender * (RING_CONTROL_BYTES + self.ring_bytes)
    }
    /// The slot where a new incarnation of `sender` asks to join.
    fn join_slot(&self, sender: usize) -> usize {
        JOIN_SLOTS + sender * JOIN_SLOT_BYTES
    }
    const DOORBELL: usize = 64;
    const WAITERS: usize = 128;
    /// Counts join requests, so that a poll reads one word to know of any.
    const JOIN_BELL: usize = 192;
    // Within a join slot: the joiner's generation of requests (it adds one
    // per request, after writing its pid and the link epoch it asks for),
    // its pid, the generation the inbox's owner accepted (written after it
    // reset the sender's ring), the epoch asked for, and where the owner's
    // writes of the new link start in the joiner's inbox (written before
    // the accepted generation).
    const JOIN_GEN: usize = 0;
    const JOIN_PID: usize = 8;
    const JOIN_ACK: usize = 16;
    const JOIN_EPOCH: usize = 24;
    const JOIN_HEAD: usize = 32;
    // Within a ring's control block: producer and consumer positions on
    // separate cache lines.
    const HEAD: usize = 0;
    const TAIL: usize = 128;
}

/// A ring we write into: in a peer's inbox, the ring for our rank.
struct Peer {
    map: Mapping,
    ring: usize,
    pid: i32,
    /// The peer's rank: which of our rings it writes into.
    rank: usize,
    /// Our next write position (we are the only producer).
    head: u64,
    /// Sends waiting for the consumer to pass their end: (end, ctx, body).
    pending: VecDeque<(u64, u64, Body)>,
    last_tail: u64,
    /// A pidfd of the peer's process: readable once it has exited, so a
    /// crash is noticed at once instead of after the heartbeat timeout.
    exit_fd: Option<OwnedFd>,
    exit_reported: bool,
    /// This endpoint (restarted, or relinking) asked the peer to take it
    /// back with this request generation and has no answer yet: nothing
    /// goes either way.
    awaiting: Option<u64>,
    /// The link epoch that request asks for.
    asked_epoch: u64,
    /// The runtime dropped the link while the process is alive: ask the
    /// peer to re-establish it at this time (after a backoff).
    relink_at: Option<Instant>,
    /// When the link last came back (a relink or a join), and the backoff
    /// before the next request if it is dropped again soon.
    linked_at: Option<Instant>,
    backoff: Duration,
    /// The peer's shared slots, mapped read-only (it sends from them).
    slots: Option<Rc<PeerSlots>>,
    /// Our sends from our shared slots that this peer reads in place: the
    /// slot, the send's sequence number and our handle on the buffer, kept
    /// until the peer releases it (or its process ends). The send itself
    /// completes as the others do, when the peer has read its record: the
    /// RU paces its transfers by that, the slot's reuse waits for this.
    shared_held: Vec<(u32, u64, Rc<MepBuf>)>,
    /// Its process has exited (seen on its pidfd).
    exited: bool,
}

/// A peer's shared slots as mapped here: the whole store read-only, and
/// its control area (the release words) writable.
pub struct PeerSlots {
    data: *const u8,
    map_len: usize,
    control: *mut u8,
    control_len: usize,
    data_offset: usize,
    stride: usize,
    slot_bytes: usize,
    slots: u32,
    endpoints: usize,
}

impl PeerSlots {
    /// Maps the store whose memfd is `fd` in process `pidfd`'s, as that
    /// process's inbox header `inbox` describes it.
    fn map(
        pidfd: &OwnedFd,
        inbox: &Mapping,
        endpoints: usize,
        populate: bool,
    ) -> Result<Option<PeerSlots>> {
        let word = |at: usize| inbox.atomic_u64(at).load(Ordering::Acquire);
        let fd = word(SLOTS_FD);
        if fd == NO_SLOTS {
            return Ok(None);
        }
        let (map_len, data_offset, stride, slot_bytes, slots) = (
            word(SLOTS_MAP_LEN) as usize,
            word(SLOTS_DATA) as usize,
            word(SLOTS_STRIDE) as usize,
            word(SLOTS_BYTES) as usize,
            word(SLOTS_COUNT),
        );
        let control_len = release_words_bytes(slots as u32, endpoints as u16);
        let fits = slots > 0
            && slots <= u64::from(u32::MAX)
            && slot_bytes <= stride
            && control_len <= data_offset
            && (slots as usize)
                .checked_mul(stride)
                .and_then(|d| d.checked_add(data_offset))
                == Some(map_len);
        if !fits || fd > i32::MAX as u64 {
            bail!("its shared MEP buffers are described inconsistently");
        }
        // SAFETY: a plain system call on a pidfd we own; a non-negative
        // result is a new fd of ours.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as i32, 0) };
        if raw < 0 {
            bail!(
                "taking its shared MEP buffers (pidfd_getfd): {} (set transport.shm_zero_copy = false to copy instead)",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: raw is a new fd of ours.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat fills `st`.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || (st.st_size as usize) < map_len {
            bail!("its shared MEP buffers are smaller than announced");
        }
        // SAFETY: mappings of the memfd within its size; checked below.
        let data = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if data == libc::MAP_FAILED {
            bail!(
                "mapping its shared MEP buffers: {}",
                std::io::Error::last_os_error()
            );
        }
        if populate {
            // Its slots are all written already (preallocated): map them
            // now rather than page by page as fragments first arrive.
            // Linux >= 5.14; without it they are mapped on first read.
            // SAFETY: advice on our own mapping; allocates nothing new.
            unsafe {
                libc::madvise(data, map_len, libc::MADV_POPULATE_READ);
            }
        }
        let control = if control_len == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: as above; the control area is the first control_len bytes.
            let c = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    control_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if c == libc::MAP_FAILED {
                // SAFETY: the data mapping made above.
                unsafe { libc::munmap(data, map_len) };
                bail!(
                    "mapping its release words: {}",
                    std::io::Error::last_os_error()
                );
            }
            c as *mut u8
        };
        Ok(Some(PeerSlots {
            data: data as *const u8,
            map_len,
            control,
            control_len,
            data_offset,
            stride,
            slot_bytes,
            slots: slots as u32,
            endpoints,
        }))
    }

    /// Whether `len` bytes at `offset` lie within slot `slot`.
    fn holds(&self, slot: u32, offset: usize, len: usize) -> bool {
        let start = self.data_offset + slot as usize * self.stride;
        slot < self.slots
            && offset >= start
            && len <= self.slot_bytes
            && offset - start <= self.slot_bytes - len
    }

    /// Reader `reader` is done with the send `seq` from `slot`.
    fn release(&self, slot: u32, reader: usize, seq: u64) {
        let at = (slot as usize * self.endpoints + reader) * 8;
        assert!(at + 8 <= self.control_len);
        // SAFETY: in bounds (checked), 8-aligned (page-aligned base), the
        // mapping lives as long as self; shared with the sender, hence
        // atomic.
        let word = unsafe { &*(self.control.add(at) as *const AtomicU64) };
        word.fetch_max(seq, Ordering::AcqRel);
    }
}

impl Drop for PeerSlots {
    fn drop(&mut self) {
        // SAFETY: the mappings made in PeerSlots::map.
        unsafe {
            libc::munmap(self.data as *mut libc::c_void, self.map_len);
            if !self.control.is_null() {
                libc::munmap(self.control as *mut libc::c_void, self.control_len);
            }
        }
    }
}

/// A fragment read in place in a peer's shared slot (zero copy). Reads as
/// the payload's bytes; dropping it releases the slot to its sender.
pub struct SharedView {
    slots: Rc<PeerSlots>,
    slot: u32,
    offset: usize,
    len: usize,
    seq: u64,
    reader: usize,
    /// Whom to ring once released: the sender's rank, on our endpoint's list.
    sender: usize,
    wake: Rc<RefCell<Vec<usize>>>,
}

impl std::fmt::Debug for SharedView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedView")
            .field("slot", &self.slot)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("seq", &self.seq)
            .finish()
    }
}

impl std::ops::Deref for SharedView {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `holds` checked the range against the mapping when the
        // view was made; the Rc keeps it mapped; the sender does not write
        // the slot before the release (it holds its buffer until then).
        unsafe { std::slice::from_raw_parts(self.slots.data.add(self.offset), self.len) }
    }
}

impl Drop for SharedView {
    fn drop(&mut self) {
        self.slots.release(self.slot, self.reader, self.seq);
        self.wake.borrow_mut().push(self.sender);
    }
}

/// A relink requested within this long of the previous one waits a
/// backoff, from the first value doubling to the last: a link that keeps
/// dropping (a peer starved for seconds) is not re-established in a loop.
const RELINK_STABLE: Duration = Duration::from_secs(5);
const RELINK_FIRST: Duration = Duration::from_millis(50);
const RELINK_MAX: Duration = Duration::from_secs(1);

/// How often the peers' pidfds are polled.
const EXIT_CHECK: Duration = Duration::from_millis(20);

/// A pidfd for `pid` (Linux >= 5.3); `None` where unsupported.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: a plain system call; a non-negative result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether process `pid` is still there: it has no exited pidfd, or (where
/// pidfds are unsupported) it can be signalled.
fn process_alive(pid: i32, fd: Option<&OwnedFd>) -> bool {
    match fd {
        Some(fd) => !exited(fd),
        // SAFETY: signal 0 only checks that the process exists.
        None => pid > 0 && unsafe { libc::kill(pid, 0) } == 0,
    }
}

/// A pidfd is readable once its process has exited.
fn exited(fd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; timeout 0 never blocks.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}

/// The name of an inbox in /dev/shm: the run, the rank and the process
/// that owns it (a restarted node's is new).
pub fn inbox_path(run_id: u32, rank: usize, pid: u32) -> String {
    format!("/dev/shm/evb-{run_id}-{rank}-{pid}")
}

pub struct ShmEndpoint {
    path: String,
    inbox: Mapping,
    geo: Geometry,
    rank: usize,
    progress: Progress,
    peers: Vec<Peer>,
    /// Which peer index sent on each of our rings (by sender rank).
    sender_peer: Vec<Option<usize>>,
    /// Our consumer position of each ring.
    tails: Vec<u64>,
    recv_buffers: Vec<Vec<u8>>,
    unlinked: bool,
    failed_reads: u64,
    next_exit_check: Instant,
    run_id: u32,
    /// Rejoin enabled: the inbox keeps its name for the whole run, and a new
    /// incarnation of a peer may ask to join through its slot.
    rejoin: bool,
    /// This process restarts a node of a run already going.
    restarted: bool,
    /// Per sender: the join request generation last handled.
    join_seen: Vec<u64>,
    /// The join bell at the last look at the join slots.
    join_bell_seen: u64,
    /// Per endpoint: the epoch of our link with it (one more each time the
    /// link is re-established, as both ends agree through the join slots).
    epochs: Vec<u64>,
    /// Blocking waits in a row since progress last completed anything.
    idle_waits: u32,
    /// Our shared slots (zero copy), if we send from them.
    slots: Option<SlotStore>,
    /// Sequence number of our last send from a shared slot.
    shared_seq: u64,
    /// Senders whose slots we released since the last progress: rung then.
    wake: Rc<RefCell<Vec<usize>>>,
    /// Which received fragments' CRC to compute while copying them.
    crc: CrcPolicy,
    /// The peers' shared slots are all written at their start
    /// (preallocated): map them whole when attaching.
    populate_slots: bool,
}

impl ShmEndpoint {
    pub fn open(
        run_id: u32,
        rank: u16,
        endpoints: u16,
        ring_bytes: u32,
        progress: Progress,
    ) -> Result<ShmEndpoint> {
        let geo = Geometry {
            endpoints: endpoints as usize,
            ring_bytes: ring_bytes as usize,
        };
        let path = inbox_path(run_id, rank as usize, std::process::id());
        let inbox = Mapping::create(&path, geo.total())
            .with_context(|| format!("creating the shm inbox {path}"))?;
        inbox.atomic_u64(0).store(MAGIC, Ordering::Release);
        inbox.atomic_u64(8).store(
            (u64::from(endpoints) << 32) | u64::from(ring_bytes),
            Ordering::Release,
        );
        // No shared slots unless `share_slots` says where they are.
        inbox
            .atomic_u64(SLOTS_FD)
            .store(NO_SLOTS, Ordering::Release);
        // Peers read our memory with process_vm_readv: allow it even under
        // a restrictive Yama ptrace policy.
        // SAFETY: prctl with constant arguments.
        unsafe {
            libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
        }
        Ok(ShmEndpoint {
            path,
            inbox,
            geo,
            rank: rank as usize,
            progress,
            peers: Vec::new(),
            sender_peer: vec![None; endpoints as usize],
            tails: vec![0; endpoints as usize],
            recv_buffers: Vec::new(),
            unlinked: false,
            failed_reads: 0,
            next_exit_check: Instant::now(),
            run_id,
            rejoin: false,
            restarted: false,
            join_seen: vec![0; endpoints as usize],
            join_bell_seen: 0,
            epochs: vec![0; endpoints as usize],
            idle_waits: 0,
            slots: None,
            shared_seq: 0,
            wake: Rc::new(RefCell::new(Vec::new())),
            crc: CrcPolicy::all(),
            populate_slots: false,
        })
    }

    /// The peers' shared slots are written whole at their start
    /// (`event_builder.preallocate_buffers`): map them whole as a peer is
    /// added, so that this process's resident memory does not creep up as
    /// their fragments first arrive.
    pub fn populate_peer_slots(&mut self, yes: bool) {
        self.populate_slots = yes;
    }

    /// Zero copy: fragments sent from `store`'s slots are read in place by
    /// the peers (see the module doc). Before any peer is added: the
    /// inbox's header tells them where the slots are.
    pub fn share_slots(&mut self, store: SlotStore) -> Result<()> {
        let s = store.store();
        let Some(fd) = s.fd() else {
            bail!("zero copy needs a shared slot store");
        };
        let (_, control_len) = s.control();
        if control_len < release_words_bytes(s.slots(), self.geo.endpoints as u16) {
            bail!("the shared slot store has no room for the release words");
        }
        assert!(
            self.peers.is_empty(),
            "slots are shared before any peer is added"
        );
        let h = &self.inbox;
        h.atomic_u64(SLOTS_MAP_LEN)
            .store(s.map_len() as u64, Ordering::Release);
        h.atomic_u64(SLOTS_DATA)
            .store(s.data_offset() as u64, Ordering::Release);
        h.atomic_u64(SLOTS_STRIDE)
            .store(s.stride() as u64, Ordering::Release);
        h.atomic_u64(SLOTS_BYTES)
            .store(s.slot_bytes() as u64, Ordering::Release);
        h.atomic_u64(SLOTS_COUNT)
            .store(u64::from(s.slots()), Ordering::Release);
        h.atomic_u64(SLOTS_FD).store(fd as u64, Ordering::Release);
        self.slots = Some(store);
        Ok(())
    }

    /// Which fragments' CRC-32C to compute while copying them in (the
    /// default: all).
    pub fn set_crc_policy(&mut self, crc: CrcPolicy) {
        self.crc = crc;
    }

    /// Whether the head of a message is a fragment's whose CRC is wanted.
    fn crc_wanted(&self, head: &[u8]) -> bool {
        let at = FRAME_HEADER_LEN;
        match head
            .get(at..at + FRAGMENT_HEADER_LEN)
            .and_then(|h| <&[u8; FRAGMENT_HEADER_LEN]>::try_from(h).ok())
        {
            Some(h) => self.crc.wanted(&FragmentHeader::decode(h)),
            None => true,
        }
    }

    /// The release word of our slot `slot` for reader `rank`.
    fn released(&self, slot: u32, rank: usize) -> u64 {
        let store = self.slots.as_ref().expect("only shared sends are pending");
        let (control, len) = store.store().control();
        let at = (slot as usize * self.geo.endpoints + rank) * 8;
        assert!(at + 8 <= len);
        // SAFETY: in bounds (checked) and 8-aligned in our own mapping;
        // readers write it, hence atomic.
        unsafe { &*(control.add(at) as *const AtomicU64) }.load(Ordering::Acquire)
    }

    /// Drops our handles on the buffers the readers released, and on those
    /// lent to peers whose process is gone: their slots are free again.
    /// Returns whether any was.
    fn release_shared(&mut self) -> bool {
        if self.slots.is_none() {
            return false;
        }
        let mut any = false;
        for i in 0..self.peers.len() {
            if self.peers[i].shared_held.is_empty() {
                continue;
            }
            let rank = self.peers[i].rank;
            let gone = self.peers[i].exited;
            let mut held = std::mem::take(&mut self.peers[i].shared_held);
            let before = held.len();
            held.retain(|&(slot, seq, _)| !gone && self.released(slot, rank) < seq);
            any |= held.len() < before;
            self.peers[i].shared_held = held;
        }
        any
    }

    /// Any lent buffer released (for `has_work`: a MEP may wait for it).
    fn shared_released(&self) -> bool {
        self.peers.iter().any(|p| {
            p.exited && !p.shared_held.is_empty()
                || p.shared_held
                    .iter()
                    .any(|&(slot, seq, _)| self.released(slot, p.rank) >= seq)
        })
    }

    /// Rings the senders whose slots were released here.
    fn ring_released(&mut self) {
        let mut wake = std::mem::take(&mut *self.wake.borrow_mut());
        wake.sort_unstable();
        wake.dedup();
        for rank in wake {
            if let Some(p) = self.peers.iter().find(|p| p.rank == rank) {
                Self::ring_doorbell(&p.map);
            }
        }
    }

    /// Records of sender `s`'s ring from `from` to `to` are dropped unread
    /// (a relink): release the shared slots among them.
    fn release_discarded(&mut self, s: usize, from: u64, to: u64) {
        let Some(i) = self.sender_peer[s].or_else(|| self.peers.iter().position(|p| p.rank == s))
        else {
            return;
        };
        let Some(slots) = self.peers[i].slots.clone() else {
            return;
        };
        let data = self.ring_data(&self.inbox, self.geo.ring(s));
        let mut pos = from;
        while pos < to {
            let mut rec = [0u8; RECORD_HEADER + SHARED_EXTRA];
            Self::ring_read(data, pos, &mut rec);
            let kind = u32::from_le_bytes(rec[0..4].try_into().expect("4"));
            let inline_len = u32::from_le_bytes(rec[4..8].try_into().expect("4")) as usize;
            let len = record_len(kind, inline_len) as u64;
            if !matches!(kind, KIND_INLINE | KIND_REMOTE | KIND_SHARED) || pos + len > to {
                return; // Not a record: nothing more can be read of it.
            }
            if kind == KIND_SHARED {
                let seq = u64::from_le_bytes(rec[32..40].try_into().expect("8"));
                let slot = u32::from_le_bytes(rec[40..44].try_into().expect("4"));
                if slot < slots.slots {
                    slots.release(slot, self.rank, seq);
                }
                self.wake.borrow_mut().push(s);
            }
            pos += len;
        }
    }

    fn unlink(&mut self) {
        if !self.unlinked {
            self.unlinked = true;
            if let Ok(c) = CString::new(self.path.as_str()) {
                // SAFETY: plain syscall.
                unsafe {
                    libc::unlink(c.as_ptr());
                }
            }
        }
    }

    /// The data bytes of the ring at offset `ring` of `map`, checked to lie
    /// within the mapping, their length a power of two (the positions wrap
    /// with a mask).
    fn ring_data(&self, map: &Mapping, ring: usize) -> RingBytes {
        let cap = self.geo.ring_bytes;
        assert!(cap.is_power_of_two(), "shm ring of {cap} bytes");
        let start = ring + RING_CONTROL_BYTES;
        assert!(start + cap <= map.len, "shm ring past its mapping");
        RingBytes {
            // SAFETY: within the mapping (just checked).
            data: unsafe { map.base.add(start) },
            cap,
        }
    }

    /// Copies `src` into the ring at position `pos`, wrapping around.
    fn ring_write(ring: RingBytes, pos: u64, src: &[u8]) {
        assert!(src.len() <= ring.cap, "a record larger than its ring");
        let at = (pos as usize) & (ring.cap - 1);
        let first = src.len().min(ring.cap - at);
        // SAFETY: both pieces are within the ring's `cap` bytes (checked
        // above and in `ring_data`); the consumer does not read past head,
        // which we publish after.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), ring.data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), ring.data, src.len() - first);
        }
    }

    fn ring_read(ring: RingBytes, pos: u64, dst: &mut [u8]) {
        assert!(dst.len() <= ring.cap, "a record larger than its ring");
        let at = (pos as usize) & (ring.cap - 1);
        let first = dst.len().min(ring.cap - at);
        // SAFETY: as in ring_write; the producer does not overwrite before
        // we publish the tail.
        unsafe {
            std::ptr::copy_nonoverlapping(ring.data.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(
                ring.data,
                dst.as_mut_ptr().add(first),
                dst.len() - first,
            );
        }
    }

    fn ring_doorbell(map: &Mapping) {
        map.atomic_u32(Geometry::DOORBELL)
            .fetch_add(1, Ordering::SeqCst);
        if map.atomic_u32(Geometry::WAITERS).load(Ordering::SeqCst) > 0 {
            // SAFETY: futex wake on a shared, aligned u32.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    map.atomic_u32(Geometry::DOORBELL).as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0,
                );
            }
        }
    }

    /// Anything to do: a record in one of our rings, or a peer's tail moved.
    fn has_work(&self) -> bool {
        if !self.wake.borrow().is_empty() || self.shared_released() {
            return true;
        }
        for s in 0..self.geo.endpoints {
            if self.sender_peer[s].is_none() {
                continue;
            }
            let ring = self.geo.ring(s);
            let head = self
                .inbox
                .atomic_u64(ring + Geometry::HEAD)
                .load(Ordering::Acquire);
            if head != self.tails[s] && !self.recv_buffers.is_empty() {
                return true;
            }
        }
        if self
            .inbox
            .atomic_u64(Geometry::JOIN_BELL)
            .load(Ordering::Acquire)
            != self.join_bell_seen
        {
            return true;
        }
        let slot = self.geo.join_slot(self.rank);
        self.peers.iter().any(|p| match p.awaiting {
            Some(gen) => {
                p.map
                    .atomic_u64(slot + Geometry::JOIN_ACK)
                    .load(Ordering::Acquire)
                    == gen
            }
            None => {
                p.map
                    .atomic_u64(p.ring + Geometry::TAIL)
                    .load(Ordering::Acquire)
                    != p.last_tail
            }
        })
    }

    /// Reads one record from sender `s`'s ring, if there is one and a
    /// buffer to put it in (a shared payload needs none). Returns whether
    /// it consumed one.
    fn receive_one(&mut self, s: usize, out: &mut Vec<Completion>) -> bool {
        let ring = self.geo.ring(s);
        let head = self
            .inbox
            .atomic_u64(ring + Geometry::HEAD)
            .load(Ordering::Acquire);
        let tail = self.tails[s];
        if head == tail {
            return false;
        }
        let data = self.ring_data(&self.inbox, ring);
        let mut rec = [0u8; RECORD_HEADER];
        Self::ring_read(data, tail, &mut rec);
        let kind = u32::from_le_bytes(rec[0..4].try_into().expect("4"));
        let inline_len = u32::from_le_bytes(rec[4..8].try_into().expect("4")) as usize;
        let tag = u64::from_le_bytes(rec[8..16].try_into().expect("8"));
        let remote_addr = u64::from_le_bytes(rec[16..24].try_into().expect("8"));
        let remote_len = u64::from_le_bytes(rec[24..32].try_into().expect("8")) as usize;
        let record_len = record_len(kind, inline_len);
        let avail = (head - tail) as usize;
        if kind == KIND_SHARED && record_len <= avail {
            return self.receive_shared(s, tail, inline_len, tag, remote_addr, remote_len, out);
        }
        if self.recv_buffers.is_empty() {
            return false;
        }
        let total = inline_len + if kind == KIND_REMOTE { remote_len } else { 0 };
        let mut buf = self.recv_buffers.pop().expect("checked");
        let valid = (kind == KIND_INLINE || kind == KIND_REMOTE)
            && record_len <= avail
            && total <= buf.len();
        if valid {
            Self::ring_read(data, tail + RECORD_HEADER as u64, &mut buf[..inline_len]);
            let copied = if kind == KIND_INLINE {
                Some(None)
            } else {
                let pid = self.sender_peer[s].map(|i| self.peers[i].pid).unwrap_or(0);
                let (head, body) = buf[..total].split_at_mut(inline_len);
                if self.crc_wanted(head) {
                    read_remote_crc(pid, remote_addr, body).map(Some)
                } else {
                    read_remote(pid, remote_addr, body).then_some(None)
                }
            };
            if let Some(crc) = copied {
                out.push(match crc {
                    Some(crc) => Completion::ReceivedWithCrc {
                        buf,
                        len: total,
                        tag,
                        crc_from: inline_len,
                        crc,
                    },
                    None => Completion::Received {
                        buf,
                        len: total,
                        tag,
                    },
                });
            } else {
                // The sender is gone: the message is lost; the protocol's
                // timeouts account for it.
                self.failed_reads += 1;
                self.recv_buffers.push(buf);
            }
        } else {
            self.discard_corrupt(s, head, kind, total);
            self.recv_buffers.push(buf);
            return true;
        }
        self.tails[s] = tail + record_len as u64;
        self.publish_tail(s);
        true
    }

    /// A corrupt ring cannot be resynchronised: its content is dropped.
    fn discard_corrupt(&mut self, s: usize, head: u64, kind: u32, total: usize) {
        tracing::warn!(
            "evb shm: ring of endpoint {s} is corrupt (kind {kind}, {total} bytes); discarding it"
        );
        self.tails[s] = head;
        self.publish_tail(s);
    }

    /// A record of sender `s` at `tail` describing a payload in one of its
    /// shared slots: handed over as a view, nothing copied.
    #[allow(clippy::too_many_arguments)]
    fn receive_shared(
        &mut self,
        s: usize,
        tail: u64,
        inline_len: usize,
        tag: u64,
        offset: u64,
        len: usize,
        out: &mut Vec<Completion>,
    ) -> bool {
        let ring = self.geo.ring(s);
        let data = self.ring_data(&self.inbox, ring);
        let mut extra = [0u8; SHARED_EXTRA];
        Self::ring_read(data, tail + RECORD_HEADER as u64, &mut extra);
        let seq = u64::from_le_bytes(extra[0..8].try_into().expect("8"));
        let slot = u32::from_le_bytes(extra[8..12].try_into().expect("4"));
        let slots = self.sender_peer[s].and_then(|i| self.peers[i].slots.clone());
        let head_at = tail + (RECORD_HEADER + SHARED_EXTRA) as u64;
        let Some(slots) = slots.filter(|p| {
            usize::try_from(offset).is_ok_and(|o| p.holds(slot, o, len)) && inline_len <= INLINE_MAX
        }) else {
            let head = self
                .inbox
                .atomic_u64(ring + Geometry::HEAD)
                .load(Ordering::Acquire);
            self.discard_corrupt(s, head, KIND_SHARED, len);
            return true;
        };
        let mut head = vec![0u8; inline_len];
        Self::ring_read(data, head_at, &mut head);
        out.push(Completion::ReceivedShared {
            head,
            tag,
            view: SharedView {
                slots,
                slot,
                offset: offset as usize,
                len,
                seq,
                reader: self.rank,
                sender: s,
                wake: self.wake.clone(),
            },
        });
        self.tails[s] = tail + record_len(KIND_SHARED, inline_len) as u64;
        self.publish_tail(s);
        true
    }

    /// Reports peers whose process has exited, once everything they wrote
    /// into our inbox has been read (their last words may be a goodbye).
    fn check_exits(&mut self, out: &mut Vec<Completion>) {
        let now = Instant::now();
        if now < self.next_exit_check {
            return;
        }
        self.next_exit_check = now + EXIT_CHECK;
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut which = Vec::new();
        for (i, p) in self.peers.iter().enumerate() {
            if let (Some(fd), false) = (&p.exit_fd, p.exit_reported) {
                fds.push(libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                which.push(i);
            }
        }
        if fds.is_empty() {
            return;
        }
        // SAFETY: `fds` is a valid array of pollfd; timeout 0 never blocks.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        if n <= 0 {
            return;
        }
        for (pfd, i) in fds.iter().zip(which) {
            if pfd.revents & libc::POLLIN == 0 {
                continue;
            }
            // Its views of our slots died with it.
            self.peers[i].exited = true;
            let rank = self.peers[i].rank;
            let head = self
                .inbox
                .atomic_u64(self.geo.ring(rank) + Geometry::HEAD)
                .load(Ordering::Acquire);
            if head != self.tails[rank] {
                continue; // Read what it left first.
            }
            let p = &mut self.peers[i];
            p.exit_reported = true;
            out.push(Completion::PeerFailed {
                peer: i,
                reason: format!("process {} exited", p.pid),
            });
        }
    }

    /// Maps the inbox of endpoint `rank` (process `pid`) to write into it.
    fn attach(&self, path: &str, pid: i32, rank: usize) -> Result<Peer> {
        let map = Mapping::open(path, self.geo.total())?;
        let magic = map.atomic_u64(0).load(Ordering::Acquire);
        let shape = map.atomic_u64(8).load(Ordering::Acquire);
        let expected = ((self.geo.endpoints as u64) << 32) | self.geo.ring_bytes as u64;
        if magic != MAGIC || shape != expected {
            bail!("{path} is not an inbox of this run (different magic or geometry)");
        }
        let ring = self.geo.ring(self.rank);
        let head = map
            .atomic_u64(ring + Geometry::HEAD)
            .load(Ordering::Acquire);
        let last_tail = map
            .atomic_u64(ring + Geometry::TAIL)
            .load(Ordering::Acquire);
        // The two rings of this link, the one we write in the peer's inbox
        // and the one we read in ours, are resident from the start.
        map.populate(ring, RING_CONTROL_BYTES + self.geo.ring_bytes);
        self.inbox.populate(
            self.geo.ring(rank),
            RING_CONTROL_BYTES + self.geo.ring_bytes,
        );
        let exit_fd = pidfd_open(pid);
        let slots = match &exit_fd {
            Some(fd) => PeerSlots::map(fd, &map, self.geo.endpoints, self.populate_slots)
                .with_context(|| format!("endpoint {rank} (process {pid})"))?
                .map(Rc::new),
            None if map.atomic_u64(SLOTS_FD).load(Ordering::Acquire) != NO_SLOTS => {
                bail!("endpoint {rank} shares its MEP buffers, and this kernel has no pidfd to take them with (set transport.shm_zero_copy = false)")
            }
            None => None,
        };
        Ok(Peer {
            slots,
            shared_held: Vec::new(),
            exited: false,
            map,
            ring,
            pid,
            rank,
            head,
            pending: VecDeque::new(),
            last_tail,
            exit_fd,
            exit_reported: false,
            awaiting: None,
            asked_epoch: 0,
            relink_at: None,
            linked_at: None,
            backoff: Duration::ZERO,
        })
    }

    /// Asks peer `i` to (re)link: our pid, the link epoch asked for and a
    /// new request generation in our slot of its inbox, then its bell.
    /// Nothing goes either way until it answers ([`Self::check_answers`]).
    fn request_link(&mut self, i: usize) {
        let slot = self.geo.join_slot(self.rank);
        let epoch = self.epochs[self.peers[i].rank] + 1;
        let p = &mut self.peers[i];
        let map = &p.map;
        map.atomic_u64(slot + Geometry::JOIN_PID)
            .store(u64::from(std::process::id()), Ordering::Release);
        map.atomic_u64(slot + Geometry::JOIN_EPOCH)
            .store(epoch, Ordering::Release);
        let gen = map
            .atomic_u64(slot + Geometry::JOIN_GEN)
            .fetch_add(1, Ordering::AcqRel)
            + 1;
        map.atomic_u64(Geometry::JOIN_BELL)
            .fetch_add(1, Ordering::SeqCst);
        Self::ring_doorbell(map);
        p.awaiting = Some(gen);
        p.asked_epoch = epoch;
        p.relink_at = None;
    }

    /// Relinks that are due: the runtime dropped the link, the peer's
    /// process is still there. We stop reading its ring (what is in it
    /// belongs to the dropped link; the answer says where the new one
    /// starts) and, since our writes stop too, ask.
    fn start_relinks(&mut self) {
        let now = Instant::now();
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if p.relink_at.is_none_or(|t| t > now) {
                continue;
            }
            if !process_alive(p.pid, p.exit_fd.as_ref()) {
                // Gone: only a new incarnation can come back (it asks us).
                p.relink_at = None;
                continue;
            }
            self.sender_peer[p.rank] = None;
            self.request_link(i);
        }
    }

    /// A restarted endpoint's link to a live peer: it writes its pid in
    /// its slot of the peer's inbox and rings; the link is up when the
    /// peer answers ([`Self::check_answers`]).
    fn ask_to_join(&mut self, path: &str, pid: i32, rank: usize) -> Result<usize> {
        let exit_fd = pidfd_open(pid);
        if !process_alive(pid, exit_fd.as_ref()) {
            bail!("process {pid} has exited");
        }
        let peer = self.attach(path, pid, rank)?;
        self.peers.push(peer);
        let i = self.peers.len() - 1;
        self.request_link(i);
        Ok(i)
    }

    /// The peers that answered this endpoint's request (a restarted one's,
    /// or a relink): the ring we write in their inbox is reset, our reading
    /// of theirs starts where the answer says, the link is up.
    fn check_answers(&mut self, out: &mut Vec<Completion>) {
        let slot = self.geo.join_slot(self.rank);
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            let Some(gen) = p.awaiting else {
                continue;
            };
            if p.map
                .atomic_u64(slot + Geometry::JOIN_ACK)
                .load(Ordering::Acquire)
                != gen
            {
                continue;
            }
            p.awaiting = None;
            p.linked_at = Some(Instant::now());
            p.head = p
                .map
                .atomic_u64(p.ring + Geometry::HEAD)
                .load(Ordering::Acquire);
            p.last_tail = p
                .map
                .atomic_u64(p.ring + Geometry::TAIL)
                .load(Ordering::Acquire);
            // What the peer wrote into our inbox before its answer belongs
            // to the old link: never read.
            let from = p
                .map
                .atomic_u64(slot + Geometry::JOIN_HEAD)
                .load(Ordering::Acquire);
            let rank = p.rank;
            let pid = p.pid;
            self.epochs[rank] = p.asked_epoch;
            let old_tail = self.tails[rank];
            if from > old_tail {
                self.release_discarded(rank, old_tail, from);
            }
            self.tails[rank] = from;
            self.publish_tail(rank);
            self.sender_peer[rank] = Some(i);
            // The peer (the same process) already gave up the link it
            // answered with, and asks for a newer one: take that at once,
            // one join, rather than a join, a loss and a join.
            let (gen, asker, epoch) = self.join_request(rank);
            if gen != self.join_seen[rank] && asker == pid && epoch > self.epochs[rank] {
                self.join_seen[rank] = gen;
                self.accept_relink(i, gen, epoch, out);
                continue;
            }
            out.push(Completion::PeerJoined {
                peer: i,
                rank: rank as u16,
            });
        }
    }

    /// The request in `rank`'s join slot of our inbox: its generation, the
    /// asking process and the link epoch it asks for.
    fn join_request(&self, rank: usize) -> (u64, i32, u64) {
        let slot = self.geo.join_slot(rank);
        let read = |field: usize| self.inbox.atomic_u64(slot + field).load(Ordering::Acquire);
        (
            read(Geometry::JOIN_GEN),
            read(Geometry::JOIN_PID) as i32,
            read(Geometry::JOIN_EPOCH),
        )
    }

    /// Takes in the peers that asked to (re)link: new incarnations, and
    /// live processes that lost the link.
    fn check_joins(&mut self, out: &mut Vec<Completion>, retry: bool) {
        let bell = self
            .inbox
            .atomic_u64(Geometry::JOIN_BELL)
            .load(Ordering::Acquire);
        if bell == self.join_bell_seen && !retry {
            return;
        }
        // Requests not taken now are looked at again on the next retry.
        self.join_bell_seen = bell;
        let me = self.rank;
        for r in (0..self.geo.endpoints).filter(|&r| r != me) {
            let (gen, pid, epoch) = self.join_request(r);
            if gen == self.join_seen[r] {
                continue;
            }
            if self.accept_join(r, pid, gen, epoch, out) {
                self.join_seen[r] = gen;
            }
        }
    }

    /// Process `pid` asks to be endpoint `r`'s link again (request `gen`,
    /// link epoch `epoch`). The same process as before: a relink. Another:
    /// a new incarnation, taken once the old one is gone (it could still
    /// write into its ring). False: not yet.
    fn accept_join(
        &mut self,
        r: usize,
        pid: i32,
        gen: u64,
        epoch: u64,
        out: &mut Vec<Completion>,
    ) -> bool {
        let index = self.peers.iter().position(|p| p.rank == r);
        if let Some(i) = index {
            let old = &self.peers[i];
            if old.pid == pid {
                if old.awaiting.is_some() {
                    // Both ends asked: the lower rank's answer links both
                    // ways; the higher waits for it (then this request is
                    // one for the epoch it already has).
                    if self.rank > r {
                        return false;
                    }
                } else if epoch <= self.epochs[r] {
                    // The link is at that epoch already (both ends asked,
                    // and ours was answered).
                    return true;
                }
                self.accept_relink(i, gen, epoch, out);
                return true;
            }
            if process_alive(old.pid, old.exit_fd.as_ref()) {
                // It could still write into its ring: wait for its end.
                return false;
            }
        }
        if !self.rejoin {
            tracing::warn!("evb shm: endpoint {r} asked to join as process {pid}, and this run does not restart nodes");
            return true;
        }
        let path = inbox_path(self.run_id, r, pid as u32);
        let new_fd = pidfd_open(pid);
        if pid <= 0 || !process_alive(pid, new_fd.as_ref()) {
            tracing::warn!("evb shm: endpoint {r} asked to join as process {pid}, which is gone");
            return true;
        }
        let mut peer = match self.attach(&path, pid, r) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("evb shm: endpoint {r} asked to join as process {pid}: {e:#}");
                return true;
            }
        };
        peer.linked_at = Some(Instant::now());
        // Whatever the dead incarnation left in our ring is never read:
        // the new one writes from position 0 once it sees the answer.
        let ring = self.geo.ring(r);
        self.inbox
            .atomic_u64(ring + Geometry::HEAD)
            .store(0, Ordering::Relaxed);
        self.tails[r] = 0;
        self.publish_tail(r);
        let index = match index {
            Some(i) => {
                // Its pending sends go with it (the transport gave them up
                // when it dropped the peer, or does so now).
                self.peers[i] = peer;
                i
            }
            None => {
                self.peers.push(peer);
                self.peers.len() - 1
            }
        };
        self.answer(index, gen, epoch, out);
        true
    }

    /// Peer `i`, the same process as before, asks to re-establish the link
    /// (it lost it, or both ends did): it stopped writing into our ring
    /// before it asked, so what is in there now is all the old link's and
    /// is dropped; our writes so far are the old link's too, and the
    /// answer tells it where ours of the new link start.
    fn accept_relink(&mut self, i: usize, gen: u64, epoch: u64, out: &mut Vec<Completion>) {
        let r = self.peers[i].rank;
        let head = self
            .inbox
            .atomic_u64(self.geo.ring(r) + Geometry::HEAD)
            .load(Ordering::Acquire);
        let old_tail = self.tails[r];
        self.release_discarded(r, old_tail, head);
        self.tails[r] = head;
        self.publish_tail(r);
        let p = &mut self.peers[i];
        // Our own request, if any, is answered by this.
        p.awaiting = None;
        p.relink_at = None;
        p.linked_at = Some(Instant::now());
        self.answer(i, gen, epoch, out);
    }

    /// Answers request `gen` of peer `i`: where our writes of the new link
    /// start in its inbox, then the generation; the link is up.
    fn answer(&mut self, i: usize, gen: u64, epoch: u64, out: &mut Vec<Completion>) {
        let r = self.peers[i].rank;
        let slot = self.geo.join_slot(r);
        self.inbox
            .atomic_u64(slot + Geometry::JOIN_HEAD)
            .store(self.peers[i].head, Ordering::Release);
        self.epochs[r] = epoch;
        self.sender_peer[r] = Some(i);
        self.inbox
            .atomic_u64(slot + Geometry::JOIN_ACK)
            .store(gen, Ordering::Release);
        Self::ring_doorbell(&self.peers[i].map);
        out.push(Completion::PeerJoined {
            peer: i,
            rank: r as u16,
        });
    }

    fn publish_tail(&self, s: usize) {
        self.inbox
            .atomic_u64(self.geo.ring(s) + Geometry::TAIL)
            .store(self.tails[s], Ordering::Release);
    }
}

fn record_len(kind: u32, inline_len: usize) -> usize {
    let extra = if kind == KIND_SHARED { SHARED_EXTRA } else { 0 };
    (RECORD_HEADER + extra + inline_len + 7) & !7
}

/// Bytes copied from the sender per system call before they are
/// checksummed: small enough to still be in this core's cache for the CRC.
const COPY_CHUNK: usize = 256 * 1024;

/// One copy from another process's memory into ours, with the CRC-32C of
/// what was copied computed chunk by chunk while it is hot in cache.
/// `None`: the sender is gone.
fn read_remote_crc(pid: i32, addr: u64, dst: &mut [u8]) -> Option<u32> {
    let mut crc = 0;
    let mut at = 0;
    for chunk in dst.chunks_mut(COPY_CHUNK) {
        if !read_remote(pid, addr + at as u64, chunk) {
            return None;
        }
        crc = evb_core::checksum::crc32c_append(crc, chunk);
        at += chunk.len();
    }
    Some(crc)
}

/// One copy from another process's memory into ours.
fn read_remote(pid: i32, addr: u64, dst: &mut [u8]) -> bool {
    let mut done = 0;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr() as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: the local iovec is our own buffer; the remote one is only
        // read by the kernel, which checks it.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

impl Endpoint for ShmEndpoint {
    fn name(&self) -> String {
        "shm".into()
    }

    fn local_address(&self) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&(std::process::id() as i32).to_le_bytes());
        a.extend_from_slice(&(self.rank as u16).to_le_bytes());
        a.extend_from_slice(self.path.as_bytes());
        a
    }

    fn add_peer(&mut self, address: &[u8]) -> Result<usize> {
        if address.len() < 7 {
            bail!("shm address of {} bytes is too short", address.len());
        }
        let pid = i32::from_le_bytes(address[0..4].try_into().expect("4"));
        let rank = u16::from_le_bytes(address[4..6].try_into().expect("2")) as usize;
        let path = std::str::from_utf8(&address[6..]).context("shm path is not UTF-8")?;
        if !path.starts_with("/dev/shm/evb-") || path.contains("..") {
            bail!("`{path}` is not an evb shm inbox");
        }
        if rank >= self.geo.endpoints {
            bail!(
                "shm peer says it is endpoint {rank} of {}",
                self.geo.endpoints
            );
        }
        if self.restarted && rank != self.rank {
            return self.ask_to_join(path, pid, rank);
        }
        let peer = self.attach(path, pid, rank)?;
        self.peers.push(peer);
        let index = self.peers.len() - 1;
        self.sender_peer[rank] = Some(index);
        Ok(index)
    }

    fn post_recv(&mut self, buf: Vec<u8>) -> Result<()> {
        self.recv_buffers.push(buf);
        Ok(())
    }

    fn send(&mut self, peer: usize, tag: u64, head: Vec<u8>, body: Body, ctx: u64) -> Result<bool> {
        let cap = self.geo.ring_bytes;
        let body_len = body.as_ref().map_or(0, |(_, r)| r.len());
        let inline = head.len() + body_len <= INLINE_MAX.min(cap / 4);
        // A body in one of our shared slots is read in place by the peer.
        let shared = match (&body, &self.slots) {
            (Some((b, r)), Some(store)) if !inline => b.slot().and_then(|(s, index)| {
                std::ptr::eq(s, store.store())
                    .then(|| (index, s.slot_offset(index) + r.start, r.len()))
            }),
            _ => None,
        };
        let kind = match (inline, shared) {
            (true, _) => KIND_INLINE,
            (false, Some(_)) => KIND_SHARED,
            (false, None) => KIND_REMOTE,
        };
        let inline_len = if inline {
            head.len() + body_len
        } else {
            head.len()
        };
        let need = record_len(kind, inline_len) as u64;
        let data = {
            let p = &self.peers[peer];
            self.ring_data(&p.map, p.ring)
        };
        let seq = self.shared_seq + 1;
        let p = &mut self.peers[peer];
        if p.awaiting.is_some() || p.relink_at.is_some() {
            return Ok(false);
        }
        let tail = p
            .map
            .atomic_u64(p.ring + Geometry::TAIL)
            .load(Ordering::Acquire);
        if p.head + need - tail > cap as u64 {
            return Ok(false);
        }
        let mut rec = [0u8; RECORD_HEADER + SHARED_EXTRA];
        rec[0..4].copy_from_slice(&kind.to_le_bytes());
        rec[4..8].copy_from_slice(&(inline_len as u32).to_le_bytes());
        rec[8..16].copy_from_slice(&tag.to_le_bytes());
        let mut rec_len = RECORD_HEADER;
        match (kind, &body, shared) {
            (KIND_REMOTE, Some((b, r)), _) => {
                let addr = b[r.clone()].as_ptr() as u64;
                rec[16..24].copy_from_slice(&addr.to_le_bytes());
                rec[24..32].copy_from_slice(&(r.len() as u64).to_le_bytes());
            }
            (KIND_SHARED, _, Some((slot, offset, len))) => {
                rec[16..24].copy_from_slice(&(offset as u64).to_le_bytes());
                rec[24..32].copy_from_slice(&(len as u64).to_le_bytes());
                rec[32..40].copy_from_slice(&seq.to_le_bytes());
                rec[40..44].copy_from_slice(&slot.to_le_bytes());
                rec_len += SHARED_EXTRA;
            }
            _ => {}
        }
        Self::ring_write(data, p.head, &rec[..rec_len]);
        let mut pos = p.head + rec_len as u64;
        Self::ring_write(data, pos, &head);
        pos += head.len() as u64;
        if let (true, Some((b, r))) = (inline, &body) {
            Self::ring_write(data, pos, &b[r.clone()]);
        }
        p.head += need;
        p.map
            .atomic_u64(p.ring + Geometry::HEAD)
            .store(p.head, Ordering::Release);
        // Inline messages are copied: done. Remote and shared ones wait for
        // the tail (the reader has the data); a shared one's buffer stays
        // ours until the reader releases it (our handle keeps the slot
        // from being written meanwhile).
        let end = p.head;
        let body = match (shared, body) {
            (Some((slot, _, _)), Some((b, _))) => {
                p.shared_held.push((slot, seq, b));
                self.shared_seq = seq;
                None
            }
            (_, body) if !inline => body,
            _ => None,
        };
        p.pending.push_back((end, ctx, body));
        Self::ring_doorbell(&self.peers[peer].map);
        Ok(true)
    }

    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let before = out.len();
        // Released slots first: an assignment read below may need one.
        self.release_shared();
        // Joins first: a reset ring is read only after the join is told.
        self.start_relinks();
        let retry = Instant::now() >= self.next_exit_check;
        self.check_joins(out, retry);
        self.check_answers(out);
        // Receive: a bounded number per ring per call, round robin.
        let mut consumed_from = Vec::new();
        for s in 0..self.geo.endpoints {
            if self.sender_peer[s].is_none() {
                continue;
            }
            let mut n = 0;
            while n < 64 && self.receive_one(s, out) {
                n += 1;
            }
            if n > 0 {
                consumed_from.push(s);
            }
        }
        // Wake senders that may be waiting for space or completions.
        for s in consumed_from {
            if let Some(i) = self.sender_peer[s] {
                Self::ring_doorbell(&self.peers[i].map);
            }
        }
        self.check_exits(out);
        if self.release_shared() {
            self.idle_waits = 0;
        }
        self.ring_released();
        // Complete sends the consumers have passed.
        for p in self.peers.iter_mut().filter(|p| p.awaiting.is_none()) {
            let tail = p
                .map
                .atomic_u64(p.ring + Geometry::TAIL)
                .load(Ordering::Acquire);
            p.last_tail = tail;
            while p.pending.front().is_some_and(|(end, _, _)| *end <= tail) {
                let (_, ctx, _) = p.pending.pop_front().expect("checked");
                out.push(Completion::Sent { ctx });
            }
        }
        if out.len() > before {
            self.idle_waits = 0;
        }
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let bell = self.inbox.atomic_u32(Geometry::DOORBELL);
            let seen = bell.load(Ordering::SeqCst);
            if self.has_work() {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            match self.progress {
                // A spin that hands the core to any other runnable process
                // (four busy nodes on two cores would otherwise starve
                // each other); alone, it is a short syscall per poll.
                Progress::Busy => std::thread::yield_now(),
                Progress::Blocking if self.idle_waits < YIELDS_BEFORE_SLEEP => {
                    self.idle_waits += 1;
                    std::thread::yield_now();
                    return Ok(());
                }
                Progress::Blocking => {
                    let waiters = self.inbox.atomic_u32(Geometry::WAITERS);
                    waiters.fetch_add(1, Ordering::SeqCst);
                    let ts = libc::timespec {
                        tv_sec: left.as_secs() as libc::time_t,
                        tv_nsec: left.subsec_nanos() as libc::c_long,
                    };
                    // SAFETY: futex wait on a shared, aligned u32; returns
                    // at once if the doorbell rang since `seen`.
                    unsafe {
                        libc::syscall(
                            libc::SYS_futex,
                            bell.as_ptr(),
                            libc::FUTEX_WAIT,
                            seen,
                            &ts as *const libc::timespec,
                            std::ptr::null::<u32>(),
                            0,
                        );
                    }
                    waiters.fetch_sub(1, Ordering::SeqCst);
                    return Ok(());
                }
            }
        }
    }

    fn peer_runnable(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|p| process_runnable(p.pid))
    }

    fn peer_active(&self, peer: usize) -> bool {
        let Some(p) = self.peers.get(peer) else {
            return false;
        };
        let s = p.rank;
        let head = self
            .inbox
            .atomic_u64(self.geo.ring(s) + Geometry::HEAD)
            .load(Ordering::Acquire);
        head != self.tails[s]
    }

    fn setup_done(&mut self) {
        // Every peer has mapped our inbox: the name is no longer needed,
        // unless a restarted peer will look for it.
        if !self.rejoin {
            self.unlink();
        }
    }

    /// The runtime dropped the link to this peer. If its process is still
    /// there (it was stopped, or starved of CPU, or we were), ask it to
    /// re-establish the link: at once the first time, after a growing
    /// backoff when the link came back only a moment ago.
    fn relink(&mut self, peer: usize, _tag: u64) {
        let Some(p) = self.peers.get_mut(peer) else {
            return;
        };
        if p.awaiting.is_some() || p.relink_at.is_some() {
            return;
        }
        let now = Instant::now();
        p.backoff = match p.linked_at {
            Some(t) if now.duration_since(t) < RELINK_STABLE => {
                (p.backoff * 2).clamp(RELINK_FIRST, RELINK_MAX)
            }
            _ => Duration::ZERO,
        };
        p.relink_at = Some(now + p.backoff);
    }

    fn enable_rejoin(&mut self, restarted: bool) -> bool {
        self.rejoin = true;
        self.restarted = restarted;
        true
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        self.unlink();
        if self.failed_reads > 0 {
            tracing::warn!(
                "evb shm: {} messages lost because their sender was gone",
                self.failed_reads
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Soak regression: a link's two rings are resident once the link is
    /// made, not only after their first lap (which took minutes at a low
    /// message rate, and showed as resident memory growing for that long).
    #[test]
    fn linked_rings_are_resident_at_once() {
        let ring_bytes = 1u32 << 20;
        let run_id = 0x5000_0000 | (std::process::id() & 0xffff);
        let mut a = ShmEndpoint::open(run_id, 0, 3, ring_bytes, Progress::Blocking).unwrap();
        let mut b = ShmEndpoint::open(run_id, 1, 3, ring_bytes, Progress::Blocking).unwrap();
        let geo = a.geo;
        let ring = RING_CONTROL_BYTES + geo.ring_bytes;
        assert!(a.inbox.resident() < ring / 2, "nothing linked yet");
        a.add_peer(&b.local_address()).unwrap();
        b.add_peer(&a.local_address()).unwrap();
        // a's inbox: the ring b writes; b's inbox: the ring a writes. The
        // ring of the unlinked endpoint 2 stays untouched.
        let resident = a.inbox.resident();
        assert!(resident >= ring, "{resident} bytes resident");
        assert!(resident < 2 * ring, "{resident} bytes resident");
        let resident = b.inbox.resident();
        assert!(resident >= ring, "{resident} bytes resident");
        assert!(resident < 2 * ring, "{resident} bytes resident");
        a.setup_done();
        b.setup_done();
    }

    fn received(ep: &mut ShmEndpoint) -> (Vec<Vec<u8>>, Vec<(usize, u16)>) {
        let mut out = Vec::new();
        ep.progress(&mut out).unwrap();
        let mut msgs = Vec::new();
        let mut joins = Vec::new();
        for c in out {
            match c {
                Completion::Received { buf, len, .. } => msgs.push(buf[..len].to_vec()),
                Completion::PeerJoined { peer, rank } => joins.push((peer, rank)),
                _ => {}
            }
        }
        (msgs, joins)
    }

    /// A restarted endpoint asks a survivor to take it back: the survivor
    /// never reads what the dead incarnation left in its ring, and the two
    /// new rings carry messages both ways.
    #[test]
    fn a_new_incarnation_joins_and_stale_records_are_dropped() {
        let ring_bytes = 1u32 << 16;
        let run_id = 0x6000_0000 | (std::process::id() & 0xffff);
        let mut s = ShmEndpoint::open(run_id, 0, 2, ring_bytes, Progress::Blocking).unwrap();
        assert!(s.enable_rejoin(false));
        let mut old = ShmEndpoint::open(run_id, 1, 2, ring_bytes, Progress::Blocking).unwrap();
        // The old incarnation's process is gone: a reaped child's pid.
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id() as i32;
        dead.wait().unwrap();
        let mut old_addr = old.local_address();
        old_addr[0..4].copy_from_slice(&dead_pid.to_le_bytes());
        let s_to_old = s.add_peer(&old_addr).unwrap();
        let old_to_s = old.add_peer(&s.local_address()).unwrap();
        for _ in 0..8 {
            s.post_recv(vec![0; 4096]).unwrap();
        }
        // One message read, two left unread when it dies.
        for m in [&b"old-1"[..], b"old-2", b"old-3"] {
            assert!(old.send(old_to_s, 1, m.to_vec(), None, 0).unwrap());
        }
        let mut out = Vec::new();
        s.receive_one(1, &mut out);
        assert!(matches!(&out[..], [Completion::Received { len: 5, .. }]));
        drop(old);
        // The new incarnation (a new inbox, here under the same name).
        let mut new = ShmEndpoint::open(run_id, 1, 2, ring_bytes, Progress::Blocking).unwrap();
        assert!(new.enable_rejoin(true));
        let new_to_s = new.add_peer(&s.local_address()).unwrap();
        for _ in 0..8 {
            new.post_recv(vec![0; 4096]).unwrap();
        }
        assert!(!new.send(new_to_s, 1, b"early".to_vec(), None, 0).unwrap());
        let (msgs, joins) = received(&mut s);
        assert_eq!(joins, vec![(s_to_old, 1)]);
        assert!(msgs.is_empty(), "stale records read: {msgs:?}");
        let (msgs, joins) = received(&mut new);
        assert_eq!(joins, vec![(new_to_s, 0)]);
        assert!(msgs.is_empty());
        assert!(new.send(new_to_s, 1, b"new-1".to_vec(), None, 0).unwrap());
        assert!(s.send(s_to_old, 0, b"hello".to_vec(), None, 0).unwrap());
        let (msgs, _) = received(&mut s);
        assert_eq!(msgs, vec![b"new-1".to_vec()]);
        let (msgs, _) = received(&mut new);
        assert_eq!(msgs, vec![b"hello".to_vec()]);
        // The same request is not taken twice.
        let (msgs, joins) = received(&mut s);
        assert!(msgs.is_empty() && joins.is_empty());
    }

    /// While the old incarnation's process still runs (it could still
    /// write into its ring), a join request waits; it is taken once that
    /// process is gone.
    #[test]
    fn a_join_waits_for_the_old_process_to_end() {
        let ring_bytes = 1u32 << 16;
        let run_id = 0x7000_0000 | (std::process::id() & 0xffff);
        let mut s = ShmEndpoint::open(run_id, 0, 2, ring_bytes, Progress::Blocking).unwrap();
        assert!(s.enable_rejoin(false));
        let old = ShmEndpoint::open(run_id, 1, 2, ring_bytes, Progress::Blocking).unwrap();
        let mut alive = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut old_addr = old.local_address();
        old_addr[0..4].copy_from_slice(&(alive.id() as i32).to_le_bytes());
        s.add_peer(&old_addr).unwrap();
        drop(old);
        let mut new = ShmEndpoint::open(run_id, 1, 2, ring_bytes, Progress::Blocking).unwrap();
        assert!(new.enable_rejoin(true));
        new.add_peer(&s.local_address()).unwrap();
        for _ in 0..3 {
            std::thread::sleep(EXIT_CHECK);
            assert_eq!(received(&mut s).1, vec![], "taken while the old one runs");
            assert_eq!(received(&mut new).1, vec![]);
        }
        alive.kill().unwrap();
        alive.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let joins = loop {
            std::thread::sleep(EXIT_CHECK);
            let joins = received(&mut s).1;
            if !joins.is_empty() || Instant::now() > deadline {
                break joins;
            }
        };
        assert_eq!(joins, vec![(0, 1)]);
        assert_eq!(received(&mut new).1, vec![(0, 0)]);
    }

    fn sent(ep: &mut ShmEndpoint, peer: usize, msg: &[u8]) -> bool {
        ep.send(peer, 1, msg.to_vec(), None, 0).unwrap()
    }

    /// Two live endpoints, linked, with receive buffers.
    fn linked_pair(run_id: u32) -> (ShmEndpoint, ShmEndpoint, usize, usize) {
        let ring_bytes = 1u32 << 16;
        let mut a = ShmEndpoint::open(run_id, 0, 2, ring_bytes, Progress::Blocking).unwrap();
        let mut b = ShmEndpoint::open(run_id, 1, 2, ring_bytes, Progress::Blocking).unwrap();
        let a_to_b = a.add_peer(&b.local_address()).unwrap();
        let b_to_a = b.add_peer(&a.local_address()).unwrap();
        for _ in 0..16 {
            a.post_recv(vec![0; 4096]).unwrap();
            b.post_recv(vec![0; 4096]).unwrap();
        }
        a.setup_done();
        b.setup_done();
        (a, b, a_to_b, b_to_a)
    }

    /// A link dropped while both processes live (here: the same one): the
    /// side that dropped it asks through its join slot; the other takes it,
    /// drops what the old link left in its ring and answers with where its
    /// new writes start. Neither reads a record of the old link after that,
    /// none is read twice, and the new link carries messages both ways.
    #[test]
    fn a_dropped_link_between_live_endpoints_relinks() {
        let run_id = 0x4000_0000 | (std::process::id() & 0xffff);
        let (mut a, mut b, a_to_b, b_to_a) = linked_pair(run_id);
        assert_eq!(received(&mut a), (vec![], vec![]));
        assert!(sent(&mut b, b_to_a, b"b-old-read"));
        assert_eq!(received(&mut a).0, vec![b"b-old-read".to_vec()]);
        // Unread when a drops the link (b was silent, say, and these are
        // late): both directions hold old records.
        assert!(sent(&mut a, a_to_b, b"a-old-1"));
        assert!(sent(&mut a, a_to_b, b"a-old-2"));
        assert!(sent(&mut b, b_to_a, b"b-old-1"));
        a.relink(a_to_b, 1);
        // Nothing goes from a until b answers.
        assert!(!sent(&mut a, a_to_b, b"a-early"));
        assert_eq!(received(&mut a), (vec![], vec![]), "b has not answered");
        assert!(sent(&mut b, b_to_a, b"b-old-2"));
        // b takes the request: a join, and a's old records are never read.
        let (msgs, joins) = received(&mut b);
        assert_eq!(joins, vec![(b_to_a, 0)]);
        assert!(msgs.is_empty(), "old records read: {msgs:?}");
        assert!(sent(&mut b, b_to_a, b"b-new-1"));
        // a sees the answer, skips b's old records, reads the new one.
        let (msgs, joins) = received(&mut a);
        assert_eq!(joins, vec![(a_to_b, 1)]);
        assert_eq!(msgs, vec![b"b-new-1".to_vec()]);
        assert!(sent(&mut a, a_to_b, b"a-new-1"));
        assert_eq!(received(&mut b), (vec![b"a-new-1".to_vec()], vec![]));
        // Once only; both at epoch 1.
        assert_eq!(received(&mut a), (vec![], vec![]));
        assert_eq!(received(&mut b), (vec![], vec![]));
        assert_eq!((a.epochs[1], b.epochs[0]), (1, 1));
        // b's sends of the old link completed (a's tail passed them).
        let mut out = Vec::new();
        b.progress(&mut out).unwrap();
        assert!(b.peers[b_to_a].pending.is_empty());
    }

    /// Both ends dropped the link and asked at the same time: the lower
    /// rank answers, the higher one's request is then one for the epoch it
    /// has, and is not taken again. One join each side, and no second one.
    #[test]
    fn both_ends_relinking_at_once_join_once() {
        let run_id = 0x4100_0000 | (std::process::id() & 0xffff);
        let (mut a, mut b, a_to_b, b_to_a) = linked_pair(run_id);
        assert!(sent(&mut a, a_to_b, b"a-old"));
        assert!(sent(&mut b, b_to_a, b"b-old"));
        a.relink(a_to_b, 1);
        b.relink(b_to_a, 0);
        // b (rank 1) sees a's request first: it waits for a's answer.
        let mut joins_a = Vec::new();
        let mut joins_b = Vec::new();
        let mut msgs = Vec::new();
        for _ in 0..3 {
            let (m, j) = received(&mut b);
            msgs.extend(m);
            joins_b.extend(j);
            let (m, j) = received(&mut a);
            msgs.extend(m);
            joins_a.extend(j);
            std::thread::sleep(EXIT_CHECK);
        }
        assert!(msgs.is_empty(), "old records read: {msgs:?}");
        assert_eq!(joins_a, vec![(a_to_b, 1)]);
        assert_eq!(joins_b, vec![(b_to_a, 0)]);
        assert_eq!((a.epochs[1], b.epochs[0]), (1, 1));
        assert!(sent(&mut a, a_to_b, b"a-new"));
        assert!(sent(&mut b, b_to_a, b"b-new"));
        assert_eq!(received(&mut b), (vec![b"a-new".to_vec()], vec![]));
        assert_eq!(received(&mut a), (vec![b"b-new".to_vec()], vec![]));
        // A second drop soon after: a relinks again after a backoff.
        a.relink(a_to_b, 1);
        let asked = a.peers[a_to_b].relink_at.expect("scheduled");
        assert!(asked >= Instant::now() + RELINK_FIRST / 2);
        std::thread::sleep(RELINK_FIRST + EXIT_CHECK);
        assert_eq!(received(&mut a).1, vec![]);
        assert_eq!(received(&mut b).1, vec![(b_to_a, 0)]);
        assert_eq!(received(&mut a).1, vec![(a_to_b, 1)]);
        assert_eq!((a.epochs[1], b.epochs[0]), (2, 2));
    }

    /// An answer to a link the peer has given up again already (it
    /// answered our request while we were stopped, then dropped the link
    /// and asked for a newer one): we go straight to the newer link, one
    /// join, and never read what the peer wrote on the link in between.
    #[test]
    fn an_answer_already_superseded_is_one_join() {
        let run_id = 0x4300_0000 | (std::process::id() & 0xffff);
        let (mut a, mut b, a_to_b, b_to_a) = linked_pair(run_id);
        b.relink(b_to_a, 0);
        assert_eq!(received(&mut b), (vec![], vec![]));
        // a answers (epoch 1), writes on that link, then drops it again.
        assert_eq!(received(&mut a).1, vec![(a_to_b, 1)]);
        assert!(sent(&mut a, a_to_b, b"a-epoch-1"));
        a.relink(a_to_b, 1);
        std::thread::sleep(RELINK_FIRST + EXIT_CHECK);
        assert_eq!(received(&mut a), (vec![], vec![]));
        assert!(a.peers[a_to_b].awaiting.is_some(), "a asked again");
        // b runs again: one join, at epoch 2, nothing of epoch 1 read.
        let (msgs, joins) = received(&mut b);
        assert_eq!(joins, vec![(b_to_a, 0)]);
        assert!(msgs.is_empty(), "{msgs:?}");
        assert_eq!(b.epochs[0], 2);
        assert_eq!(received(&mut a).1, vec![(a_to_b, 1)]);
        assert_eq!(a.epochs[1], 2);
        std::thread::sleep(EXIT_CHECK);
        assert_eq!(received(&mut b), (vec![], vec![]), "no second join");
        assert!(sent(&mut a, a_to_b, b"a-epoch-2"));
        assert!(sent(&mut b, b_to_a, b"b-epoch-2"));
        assert_eq!(received(&mut b).0, vec![b"a-epoch-2".to_vec()]);
        assert_eq!(received(&mut a).0, vec![b"b-epoch-2".to_vec()]);
    }

    /// Endpoint 0 of 2 sharing a slot store of two 64 KiB slots.
    fn sharing(run_id: u32) -> (ShmEndpoint, SlotStore) {
        let ring_bytes = 1u32 << 16;
        let store = SlotStore::shared(2, 64 << 10, release_words_bytes(2, 2)).unwrap();
        let mut a = ShmEndpoint::open(run_id, 0, 2, ring_bytes, Progress::Blocking).unwrap();
        a.share_slots(store.clone()).unwrap();
        (a, store)
    }

    /// A 40 KiB fragment from one of `store`'s slots, `fill` throughout.
    fn slot_message(store: &SlotStore, fill: u8) -> Rc<MepBuf> {
        let mut b = store.take(40 << 10).unwrap();
        b.fill(fill);
        Rc::new(b)
    }

    fn shared_views(ep: &mut ShmEndpoint) -> Vec<SharedView> {
        let mut out = Vec::new();
        ep.progress(&mut out).unwrap();
        out.into_iter()
            .filter_map(|c| match c {
                Completion::ReceivedShared { head, view, .. } => {
                    assert_eq!(head, b"head");
                    Some(view)
                }
                _ => None,
            })
            .collect()
    }

    fn sent_ctxs(ep: &mut ShmEndpoint) -> Vec<u64> {
        let mut out = Vec::new();
        ep.progress(&mut out).unwrap();
        out.into_iter()
            .filter_map(|c| match c {
                Completion::Sent { ctx } => Some(ctx),
                _ => None,
            })
            .collect()
    }

    /// Zero copy: the receiver reads the fragment in the sender's slot;
    /// the send completes when the record is read, the slot is free again
    /// only when the reader drops its view.
    #[test]
    fn a_shared_slot_is_read_in_place_and_freed_when_released() {
        let run_id = 0x4400_0000 | (std::process::id() & 0xffff);
        let (mut a, store) = sharing(run_id);
        let mut b = ShmEndpoint::open(run_id, 1, 2, 1 << 16, Progress::Blocking).unwrap();
        let a_to_b = a.add_peer(&b.local_address()).unwrap();
        b.add_peer(&a.local_address()).unwrap();
        let msg = slot_message(&store, 0x3c);
        let len = msg.len();
        let body = Some((msg.clone(), 0..len));
        assert!(a.send(a_to_b, 1, b"head".to_vec(), body, 7).unwrap());
        // The RU releases its MEP: the endpoint still holds the slot.
        drop(msg);
        assert_eq!(store.store().free_slots(), 1);
        // b has no receive buffer posted: nothing can be copied.
        assert!(b.recv_buffers.is_empty());
        let views = shared_views(&mut b);
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].len(), len);
        assert!(views[0].iter().all(|&x| x == 0x3c));
        assert_eq!(sent_ctxs(&mut a), vec![7], "read: the send is done");
        assert_eq!(store.store().free_slots(), 1, "still read in place");
        drop(views);
        // The reader rings the sender when it progresses next.
        assert!(shared_views(&mut b).is_empty());
        assert!(a.has_work(), "a release is work for the sender");
        assert!(sent_ctxs(&mut a).is_empty());
        assert_eq!(store.store().free_slots(), 2);
    }

    /// Records the reader drops unread (the link is re-established: what
    /// the old link left in its ring is never read) release their slots.
    #[test]
    fn a_relink_releases_the_slots_of_records_left_unread() {
        let run_id = 0x4500_0000 | (std::process::id() & 0xffff);
        let (mut a, store) = sharing(run_id);
        let mut b = ShmEndpoint::open(run_id, 1, 2, 1 << 16, Progress::Blocking).unwrap();
        let a_to_b = a.add_peer(&b.local_address()).unwrap();
        b.add_peer(&a.local_address()).unwrap();
        for fill in [1, 2] {
            let msg = slot_message(&store, fill);
            let len = msg.len();
            assert!(a
                .send(a_to_b, 1, b"head".to_vec(), Some((msg, 0..len)), 0)
                .unwrap());
        }
        assert_eq!(store.store().free_slots(), 0);
        // a drops the link and asks for it again; b drops a's old records.
        a.relink(a_to_b, 1);
        let _ = received(&mut a);
        let (msgs, joins) = received(&mut b);
        assert_eq!(joins.len(), 1);
        assert!(msgs.is_empty());
        let _ = received(&mut a);
        assert_eq!(store.store().free_slots(), 2, "released as discarded");
    }

    /// A reader whose process is gone releases nothing itself: its views
    /// died with it, and the sender frees their slots.
    #[test]
    fn the_slots_a_dead_reader_held_are_freed() {
        let run_id = 0x4600_0000 | (std::process::id() & 0xffff);
        let (mut a, store) = sharing(run_id);
        let mut b = ShmEndpoint::open(run_id, 1, 2, 1 << 16, Progress::Blocking).unwrap();
        // b as a's peer: the pid of a process that exits (not reaped yet,
        // so its pidfd can be taken and then reads as exited).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let mut addr = b.local_address();
        addr[0..4].copy_from_slice(&(child.id() as i32).to_le_bytes());
        let a_to_b = a.add_peer(&addr).unwrap();
        b.add_peer(&a.local_address()).unwrap();
        let msg = slot_message(&store, 9);
        let len = msg.len();
        assert!(a
            .send(a_to_b, 1, b"head".to_vec(), Some((msg, 0..len)), 3)
            .unwrap());
        let views = shared_views(&mut b);
        assert_eq!(views.len(), 1);
        assert_eq!(store.store().free_slots(), 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        while store.store().free_slots() < 2 && Instant::now() < deadline {
            std::thread::sleep(EXIT_CHECK);
            let _ = received(&mut a);
        }
        assert_eq!(store.store().free_slots(), 2, "freed with the reader gone");
        child.wait().unwrap();
        drop(views);
    }

    /// A record naming bytes outside the sender's slots is not read: the
    /// ring is dropped as corrupt and no view is made.
    #[test]
    fn a_shared_record_outside_the_slots_is_refused() {
        let run_id = 0x4700_0000 | (std::process::id() & 0xffff);
        let (mut a, store) = sharing(run_id);
        let mut b = ShmEndpoint::open(run_id, 1, 2, 1 << 16, Progress::Blocking).unwrap();
        let a_to_b = a.add_peer(&b.local_address()).unwrap();
        b.add_peer(&a.local_address()).unwrap();
        let msg = slot_message(&store, 5);
        let len = msg.len();
        assert!(a
            .send(a_to_b, 1, b"head".to_vec(), Some((msg, 0..len)), 0)
            .unwrap());
        // Damage the record's length in b's ring: past the slot's end.
        let ring = b.geo.ring(0);
        let data = b.ring_data(&b.inbox, ring);
        let huge = (1u64 << 40).to_le_bytes();
        ShmEndpoint::ring_write(data, 24, &huge);
        assert!(shared_views(&mut b).is_empty());
        assert_eq!(b.tails[0], b.inbox.atomic_u64(ring).load(Ordering::Acquire));
    }

    /// A relink with a peer whose process is gone is not asked for: only a
    /// new incarnation can come back.
    #[test]
    fn no_relink_with_a_dead_process() {
        let run_id = 0x4200_0000 | (std::process::id() & 0xffff);
        let ring_bytes = 1u32 << 16;
        let mut a = ShmEndpoint::open(run_id, 0, 2, ring_bytes, Progress::Blocking).unwrap();
        let b = ShmEndpoint::open(run_id, 1, 2, ring_bytes, Progress::Blocking).unwrap();
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id() as i32;
        dead.wait().unwrap();
        let mut addr = b.local_address();
        addr[0..4].copy_from_slice(&dead_pid.to_le_bytes());
        let a_to_b = a.add_peer(&addr).unwrap();
        a.relink(a_to_b, 1);
        let _ = received(&mut a);
        assert_eq!(a.peers[a_to_b].awaiting, None);
        let slot = a.geo.join_slot(0);
        assert_eq!(
            b.inbox
                .atomic_u64(slot + Geometry::JOIN_GEN)
                .load(Ordering::Acquire),
            0
        );
    }
}
