//! MPI point-to-point as a message engine (OpenMPI, MPICH), through the raw
//! bindings of the `mpi` crate: the event loop keeps many operations
//! outstanding, which non-blocking MPI_Isend/MPI_Irecv and MPI_Testsome do
//! directly.
//!
//! Peers are ranks of MPI_COMM_WORLD (the endpoint rank must equal the MPI
//! rank: start with `evb node --control launcher`). A message is head ++
//! body sent as one MPI message of an hindexed datatype over both buffers
//! (no staging copy). The MPI tag says data or "finished"; the sender is
//! the status' source. MPI has no file descriptor to sleep on, so blocking
//! progress yields between tests while completions come, and sleeps
//! briefly between tests once idle. Errors return (MPI_ERRORS_RETURN)
//! instead of aborting; a dead rank usually makes the launcher end the
//! whole job (OpenMPI's default), which is MPI's failure model, not evb's.

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use mpi::ffi;

use super::msg::{Body, Completion, Endpoint, TAG_BYE, TAG_RANK_MASK};
use super::Progress;

const TAG_DATA: c_int = 1;
const TAG_FINISHED: c_int = 2;

enum Op {
    /// A receive posted for one source, the `seq`-th for it.
    Recv {
        buf: Vec<u8>,
        source: usize,
        seq: u64,
    },
    /// Keeps the buffers alive until MPI is done with them.
    Send {
        ctx: u64,
        _head: Vec<u8>,
        _body: Body,
    },
}

pub struct MpiEndpoint {
    rank: c_int,
    size: c_int,
    progress: Progress,
    requests: Vec<ffi::MPI_Request>,
    ops: Vec<Op>,
    sends: usize,
    /// Receives are posted per source: a large message and a small one
    /// from the same sender may complete out of order, but receives for
    /// one source are matched in the order they were posted, so handing
    /// them over in that order keeps the sender's order.
    peers: Vec<usize>,
    posted: Vec<usize>,
    next_post: Vec<u64>,
    next_deliver: Vec<u64>,
    held: std::collections::BTreeMap<(usize, u64), (Vec<u8>, usize, u64)>,
    spare: Vec<Vec<u8>>,
    /// Waits in a row with no completion in between (see `wait`).
    idle_waits: u32,
}

/// Blocking progress: how long a nap between tests once idle, and after
/// how many waits without a completion.
const NAP: Duration = Duration::from_micros(50);
const YIELDS_BEFORE_NAP: u32 = 256;

fn check(rc: c_int, what: &str) -> Result<()> {
    if rc != 0 {
        bail!("{what} failed with MPI error {rc}");
    }
    Ok(())
}

impl MpiEndpoint {
    /// Initialises MPI; the endpoint's rank must be `expected_rank`.
    pub fn open(expected_rank: u16, endpoints: u16, progress: Progress) -> Result<MpiEndpoint> {
        let (mut rank, mut size, mut provided) = (0, 0, 0);
        // SAFETY: plain MPI calls on the world communicator, once per process.
        unsafe {
            let mut initialised = 0;
            ffi::MPI_Initialized(&mut initialised);
            if initialised == 0 {
                check(
                    ffi::MPI_Init_thread(
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        ffi::RSMPI_THREAD_SINGLE,
                        &mut provided,
                    ),
                    "MPI_Init_thread",
                )?;
            }
            ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN);
            ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank);
            ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size);
        }
        if rank != c_int::from(expected_rank) || size != c_int::from(endpoints) {
            bail!(
                "MPI says rank {rank} of {size}, the node is endpoint {expected_rank} of {endpoints}: start it with mpirun/srun and `evb node --control launcher`"
            );
        }
        Ok(MpiEndpoint {
            rank,
            size,
            progress,
            requests: Vec::new(),
            ops: Vec::new(),
            sends: 0,
            peers: Vec::new(),
            posted: vec![0; size as usize],
            next_post: vec![0; size as usize],
            next_deliver: vec![0; size as usize],
            held: std::collections::BTreeMap::new(),
            spare: Vec::new(),
            idle_waits: 0,
        })
    }

    /// Posts `buf` for the peer with the fewest receives posted.
    fn post_for_neediest(&mut self, mut buf: Vec<u8>) -> Result<()> {
        let Some(&source) = self.peers.iter().min_by_key(|&&p| self.posted[p]) else {
            self.spare.push(buf);
            return Ok(());
        };
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let len = c_int::try_from(buf.len()).unwrap_or(c_int::MAX);
        // SAFETY: the buffer is kept in `ops` until the request completes
        // or is cancelled; Vec storage does not move when the Vec does.
        check(
            unsafe {
                ffi::MPI_Irecv(
                    buf.as_mut_ptr() as *mut _,
                    len,
                    ffi::RSMPI_UINT8_T,
                    source as c_int,
                    ffi::RSMPI_ANY_TAG,
                    ffi::RSMPI_COMM_WORLD,
                    &mut req,
                )
            },
            "MPI_Irecv",
        )?;
        let seq = self.next_post[source];
        self.next_post[source] += 1;
        self.posted[source] += 1;
        self.push(req, Op::Recv { buf, source, seq });
        Ok(())
    }

    fn push(&mut self, req: ffi::MPI_Request, op: Op) {
        if matches!(op, Op::Send { .. }) {
            self.sends += 1;
        }
        self.requests.push(req);
        self.ops.push(op);
    }
}

impl Endpoint for MpiEndpoint {
    fn name(&self) -> String {
        "mpi".into()
    }

    fn local_address(&self) -> Vec<u8> {
        self.rank.to_le_bytes().to_vec()
    }

    fn add_peer(&mut self, address: &[u8]) -> Result<usize> {
        let Ok(bytes) = <[u8; 4]>::try_from(address) else {
            bail!(
                "an MPI address is a 4-byte rank, got {} bytes",
                address.len()
            );
        };
        let rank = c_int::from_le_bytes(bytes);
        if rank < 0 || rank >= self.size {
            bail!("MPI rank {rank} does not exist (world size {})", self.size);
        }
        if !self.peers.contains(&(rank as usize)) {
            self.peers.push(rank as usize);
            // Buffers given before any peer was known go to work now.
            for buf in std::mem::take(&mut self.spare) {
                self.post_for_neediest(buf)?;
            }
        }
        Ok(rank as usize)
    }

    fn post_recv(&mut self, buf: Vec<u8>) -> Result<()> {
        self.post_for_neediest(buf)
    }

    fn send(&mut self, peer: usize, tag: u64, head: Vec<u8>, body: Body, ctx: u64) -> Result<bool> {
        let mpi_tag = if tag & TAG_BYE != 0 {
            TAG_FINISHED
        } else {
            TAG_DATA
        };
        let dest = peer as c_int;
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: head and body live in `ops` until the request completes.
        unsafe {
            match &body {
                None => check(
                    ffi::MPI_Isend(
                        head.as_ptr() as *const _,
                        head.len() as c_int,
                        ffi::RSMPI_UINT8_T,
                        dest,
                        mpi_tag,
                        ffi::RSMPI_COMM_WORLD,
                        &mut req,
                    ),
                    "MPI_Isend",
                )?,
                Some((data, range)) => {
                    // Both buffers by absolute address: one message, no copy.
                    let lens = [head.len() as c_int, range.len() as c_int];
                    let displs = [
                        head.as_ptr() as ffi::MPI_Aint,
                        data[range.clone()].as_ptr() as ffi::MPI_Aint,
                    ];
                    let mut dtype = ffi::RSMPI_DATATYPE_NULL;
                    check(
                        ffi::MPI_Type_create_hindexed(
                            2,
                            lens.as_ptr(),
                            displs.as_ptr(),
                            ffi::RSMPI_UINT8_T,
                            &mut dtype,
                        ),
                        "MPI_Type_create_hindexed",
                    )?;
                    ffi::MPI_Type_commit(&mut dtype);
                    // MPI_BOTTOM is the null address in OpenMPI and MPICH.
                    let rc = ffi::MPI_Isend(
                        std::ptr::null(),
                        1,
                        dtype,
                        dest,
                        mpi_tag,
                        ffi::RSMPI_COMM_WORLD,
                        &mut req,
                    );
                    // Freeing now is allowed: MPI keeps it until the send ends.
                    ffi::MPI_Type_free(&mut dtype);
                    check(rc, "MPI_Isend")?;
                }
            }
        }
        self.push(
            req,
            Op::Send {
                ctx,
                _head: head,
                _body: body,
            },
        );
        Ok(true)
    }

    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        if self.requests.is_empty() {
            return Ok(());
        }
        let n = self.requests.len();
        let mut done: c_int = 0;
        let mut indices: Vec<c_int> = vec![0; n];
        // SAFETY: MPI_Status is plain data.
        let mut statuses: Vec<ffi::MPI_Status> = vec![unsafe { std::mem::zeroed() }; n];
        // SAFETY: arrays of `n` elements each.
        let rc = unsafe {
            ffi::MPI_Testsome(
                n as c_int,
                self.requests.as_mut_ptr(),
                &mut done,
                indices.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        if rc != 0 && done <= 0 {
            bail!("MPI_Testsome failed with MPI error {rc}");
        }
        if done <= 0 {
            return Ok(());
        }
        self.idle_waits = 0;
        let mut finished: Vec<(usize, ffi::MPI_Status)> = (0..done as usize)
            .map(|k| (indices[k] as usize, statuses[k]))
            .collect();
        // Requests stay in the order they were posted (removal keeps it),
        // and MPI matches a sender's messages to receives in that order:
        // handing completions over by position keeps each peer's order.
        // Remove from the back so positions stay valid, then reverse.
        finished.sort_by_key(|f| std::cmp::Reverse(f.0));
        let mut completions = Vec::new();
        for (i, status) in finished {
            self.requests.remove(i);
            let op = self.ops.remove(i);
            match op {
                Op::Send { ctx, .. } => {
                    self.sends -= 1;
                    if status.MPI_ERROR != 0 && rc != 0 {
                        completions.push(Completion::SendFailed {
                            ctx,
                            reason: format!("MPI send failed with error {}", status.MPI_ERROR),
                        });
                    } else {
                        completions.push(Completion::Sent { ctx });
                    }
                }
                Op::Recv { buf, source, seq } => {
                    self.posted[source] -= 1;
                    let mut count: c_int = 0;
                    // SAFETY: the status of a completed receive.
                    unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
                    let from = source as u64 & TAG_RANK_MASK;
                    let tag = if status.MPI_TAG == TAG_FINISHED {
                        from | TAG_BYE
                    } else {
                        from
                    };
                    self.held
                        .insert((source, seq), (buf, count.max(0) as usize, tag));
                }
            }
        }
        completions.reverse();
        out.extend(completions);
        // Receives in posting order per source.
        for &p in &self.peers {
            while let Some((buf, len, tag)) = self.held.remove(&(p, self.next_deliver[p])) {
                self.next_deliver[p] += 1;
                out.push(Completion::Received { buf, len, tag });
            }
        }
        Ok(())
    }

    fn peer_active(&self, peer: usize) -> bool {
        let mut flag: c_int = 0;
        // SAFETY: a probe with a status we ignore.
        unsafe {
            let mut status: ffi::MPI_Status = std::mem::zeroed();
            ffi::MPI_Iprobe(
                peer as c_int,
                ffi::RSMPI_ANY_TAG,
                ffi::RSMPI_COMM_WORLD,
                &mut flag,
                &mut status,
            );
        }
        flag != 0
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        // No descriptor to sleep on. Busy: yield once (any other runnable
        // process gets the core first) and let the caller test again.
        // Blocking: the same while completions keep coming, a short nap
        // once the endpoint has been idle for a while (a nap per wait
        // throttles a stream of large messages).
        match self.progress {
            Progress::Busy => std::thread::yield_now(),
            Progress::Blocking if self.idle_waits < YIELDS_BEFORE_NAP => {
                self.idle_waits += 1;
                std::thread::yield_now();
            }
            Progress::Blocking => std::thread::sleep(timeout.min(NAP)),
        }
        Ok(())
    }
}

impl Drop for MpiEndpoint {
    fn drop(&mut self) {
        // SAFETY: cancelling and completing our own requests, then leaving MPI.
        unsafe {
            let deadline = Instant::now() + Duration::from_secs(2);
            // Let sends finish (the peers are finishing too), then cancel the rest.
            while self.sends > 0 && Instant::now() < deadline {
                let mut scratch = Vec::new();
                if self.progress(&mut scratch).is_err() {
                    break;
                }
            }
            for req in self.requests.iter_mut() {
                ffi::MPI_Cancel(req);
            }
            for req in self.requests.iter_mut() {
                let mut flag = 0;
                let mut status: ffi::MPI_Status = std::mem::zeroed();
                let end = Instant::now() + Duration::from_millis(200);
                while flag == 0 && Instant::now() < end {
                    ffi::MPI_Test(req, &mut flag, &mut status);
                }
            }
            ffi::MPI_Finalize();
        }
    }
}
