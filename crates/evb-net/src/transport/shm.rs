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
//! Waiting is a futex wait on the doorbell (blocking progress) or a spin
//! (busy progress). A receiver that consumed records rings the sender's
//! doorbell too, so a sender waiting for ring space or completions wakes.

use std::collections::VecDeque;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::msg::{Body, Completion, Endpoint};
use super::Progress;

/// Messages up to this size travel inside the ring.
pub const INLINE_MAX: usize = 16 << 10;
const MAGIC: u64 = 0x6576_625f_7368_6d31; // "evb_shm1"
const HEADER_BYTES: usize = 4096;
const RING_CONTROL_BYTES: usize = 256;
const RECORD_HEADER: usize = 32;
const KIND_INLINE: u32 = 1;
const KIND_REMOTE: u32 = 2;

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

/// Offsets inside an inbox.
#[derive(Clone, Copy)]
struct Geometry {
    endpoints: usize,
    ring_bytes: usize,
}

impl Geometry {
    fn total(&self) -> usize {
        HEADER_BYTES + self.endpoints * (RING_CONTROL_BYTES + self.ring_bytes)
    }
    fn ring(&self, sender: usize) -> usize {
        HEADER_BYTES + sender * (RING_CONTROL_BYTES + self.ring_bytes)
    }
    const DOORBELL: usize = 64;
    const WAITERS: usize = 128;
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
}

/// How often the peers' pidfds are polled.
const EXIT_CHECK: Duration = Duration::from_millis(20);

/// A pidfd for `pid` (Linux >= 5.3); `None` where unsupported.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: a plain system call; a non-negative result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
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
        let pid = std::process::id();
        let path = format!("/dev/shm/evb-{run_id}-{rank}-{pid}");
        let inbox = Mapping::create(&path, geo.total())
            .with_context(|| format!("creating the shm inbox {path}"))?;
        inbox.atomic_u64(0).store(MAGIC, Ordering::Release);
        inbox.atomic_u64(8).store(
            (u64::from(endpoints) << 32) | u64::from(ring_bytes),
            Ordering::Release,
        );
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
        })
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

    fn ring_data(&self, map: &Mapping, ring: usize) -> *mut u8 {
        // SAFETY: the ring lies within the mapping (checked by geometry).
        unsafe { map.base.add(ring + RING_CONTROL_BYTES) }
    }

    /// Copies `src` into the ring at position `pos`, wrapping around.
    fn ring_write(data: *mut u8, cap: usize, pos: u64, src: &[u8]) {
        let at = (pos as usize) & (cap - 1);
        let first = src.len().min(cap - at);
        // SAFETY: both pieces are within the ring's `cap` bytes; the
        // consumer does not read past head, which we publish after.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
        }
    }

    fn ring_read(data: *const u8, cap: usize, pos: u64, dst: &mut [u8]) {
        let at = (pos as usize) & (cap - 1);
        let first = dst.len().min(cap - at);
        // SAFETY: as in ring_write; the producer does not overwrite before
        // we publish the tail.
        unsafe {
            std::ptr::copy_nonoverlapping(data.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(data, dst.as_mut_ptr().add(first), dst.len() - first);
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
        self.peers.iter().any(|p| {
            p.map
                .atomic_u64(p.ring + Geometry::TAIL)
                .load(Ordering::Acquire)
                != p.last_tail
        })
    }

    /// Reads one record from sender `s`'s ring, if there is one and a
    /// buffer to put it in. Returns whether it consumed one.
    fn receive_one(&mut self, s: usize, out: &mut Vec<Completion>) -> bool {
        let cap = self.geo.ring_bytes;
        let ring = self.geo.ring(s);
        let head = self
            .inbox
            .atomic_u64(ring + Geometry::HEAD)
            .load(Ordering::Acquire);
        let tail = self.tails[s];
        if head == tail || self.recv_buffers.is_empty() {
            return false;
        }
        let data = self.ring_data(&self.inbox, ring);
        let mut rec = [0u8; RECORD_HEADER];
        Self::ring_read(data, cap, tail, &mut rec);
        let kind = u32::from_le_bytes(rec[0..4].try_into().expect("4"));
        let inline_len = u32::from_le_bytes(rec[4..8].try_into().expect("4")) as usize;
        let tag = u64::from_le_bytes(rec[8..16].try_into().expect("8"));
        let remote_addr = u64::from_le_bytes(rec[16..24].try_into().expect("8"));
        let remote_len = u64::from_le_bytes(rec[24..32].try_into().expect("8")) as usize;
        let record_len = record_len(inline_len);
        let avail = (head - tail) as usize;
        let total = inline_len + if kind == KIND_REMOTE { remote_len } else { 0 };
        let mut buf = self.recv_buffers.pop().expect("checked");
        let valid = (kind == KIND_INLINE || kind == KIND_REMOTE)
            && record_len <= avail
            && total <= buf.len();
        if valid {
            Self::ring_read(
                data,
                cap,
                tail + RECORD_HEADER as u64,
                &mut buf[..inline_len],
            );
            let copied = if kind == KIND_INLINE {
                Some(None)
            } else {
                let pid = self.sender_peer[s].map(|i| self.peers[i].pid).unwrap_or(0);
                read_remote_crc(pid, remote_addr, &mut buf[inline_len..total]).map(Some)
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
            // A corrupt ring cannot be resynchronised: drop its content.
            eprintln!("evb shm: ring of endpoint {s} is corrupt (kind {kind}, {total} bytes); discarding it");
            self.recv_buffers.push(buf);
            self.tails[s] = head;
            self.publish_tail(s);
            return true;
        }
        self.tails[s] = tail + record_len as u64;
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

    fn publish_tail(&self, s: usize) {
        self.inbox
            .atomic_u64(self.geo.ring(s) + Geometry::TAIL)
            .store(self.tails[s], Ordering::Release);
    }
}

fn record_len(inline_len: usize) -> usize {
    (RECORD_HEADER + inline_len + 7) & !7
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
        self.peers.push(Peer {
            map,
            ring,
            pid,
            rank,
            head,
            pending: VecDeque::new(),
            last_tail,
            exit_fd: pidfd_open(pid),
            exit_reported: false,
        });
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
        let inline_len = if inline {
            head.len() + body_len
        } else {
            head.len()
        };
        let need = record_len(inline_len) as u64;
        let data = {
            let p = &self.peers[peer];
            self.ring_data(&p.map, p.ring)
        };
        let p = &mut self.peers[peer];
        let tail = p
            .map
            .atomic_u64(p.ring + Geometry::TAIL)
            .load(Ordering::Acquire);
        if p.head + need - tail > cap as u64 {
            return Ok(false);
        }
        let mut rec = [0u8; RECORD_HEADER];
        let kind = if inline { KIND_INLINE } else { KIND_REMOTE };
        rec[0..4].copy_from_slice(&kind.to_le_bytes());
        rec[4..8].copy_from_slice(&(inline_len as u32).to_le_bytes());
        rec[8..16].copy_from_slice(&tag.to_le_bytes());
        if let (false, Some((b, r))) = (inline, &body) {
            let addr = b[r.clone()].as_ptr() as u64;
            rec[16..24].copy_from_slice(&addr.to_le_bytes());
            rec[24..32].copy_from_slice(&(r.len() as u64).to_le_bytes());
        }
        Self::ring_write(data, cap, p.head, &rec);
        let mut pos = p.head + RECORD_HEADER as u64;
        Self::ring_write(data, cap, pos, &head);
        pos += head.len() as u64;
        if let (true, Some((b, r))) = (inline, &body) {
            Self::ring_write(data, cap, pos, &b[r.clone()]);
        }
        p.head += need;
        p.map
            .atomic_u64(p.ring + Geometry::HEAD)
            .store(p.head, Ordering::Release);
        // Inline messages are copied: done. Remote ones wait for the tail.
        let end = p.head;
        p.pending
            .push_back((end, ctx, if inline { None } else { body }));
        Self::ring_doorbell(&p.map);
        Ok(true)
    }

    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
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
        // Complete sends the consumers have passed.
        for p in &mut self.peers {
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
                Progress::Busy => std::hint::spin_loop(),
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
        // Every peer has mapped our inbox: the name is no longer needed.
        self.unlink();
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        self.unlink();
        if self.failed_reads > 0 {
            eprintln!(
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
}
