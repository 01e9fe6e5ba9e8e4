//! evb over UCX: one message endpoint per process on top of UCP tag matching.
//!
//! The engine layer above the library is `evb_msgengine`'s, shared by
//! evb-ucx and evb-ofi: the wire-tag layout, the per-sender ordered
//! streams, the rejoin/relink state machine (`Links`), the [`Completion`]
//! and [`Error`] types. This crate drives the library and calls into it.
//!
//! Why UCX: it is how the event builders this project models actually move
//! data (InfiniBand RC/DC, shared memory, TCP as a fallback), and it picks the
//! transport from the standard `UCX_TLS` setting, so the same binary runs on a
//! laptop over TCP and on a cluster over verbs.
//!
//! Why tags: each message is sent with the sender's tag and received with a
//! zero tag mask, so one pool of receive buffers serves every peer and the
//! receiver still learns who sent what. UCP matches each sender's messages in
//! order, but completions can finish out of order (a large rendezvous message
//! finishes after a small eager one behind it). So every send carries a
//! per-destination sequence number in the upper 32 bits of the tag and the
//! receiver hands a sender's messages out in that order (`Options::source_mask`:
//! the bits of the caller's 32-bit tag that name the sender). Messages from
//! different senders do not wait for each other: a receive that never
//! completes (matched to a dead peer's rendezvous, which shared-memory
//! transports without error handling leave pending) only holds back that
//! peer's stream, which `forget_source` releases.
//!
//! Why large messages go as two: UCX 1.13 moves a non-contiguous (iov)
//! send with copying protocols (over tcp a bcopy pipeline after the
//! rendezvous), while a contiguous buffer gets zero-copy rendezvous. A send
//! whose body has at least `Options::split_body_from` bytes (opt-in) goes
//! as its head (a small eager message) and then its body (contiguous, same
//! sequence number, the BODY bit set). The receiver posts its buffers for
//! heads only; a head with the SPLIT bit makes it post the rest of the same
//! buffer for exactly that body, so the message lands as head ++ body as if
//! sent in one piece.
//!
//! Rejoin ([`Endpoint::enable_rejoin`]) and relink ([`Endpoint::relink`]):
//! `evb_msgengine::Links` holds the state machine, shared with evb-ofi (its
//! docs tell the handshakes). A restarted process (a new incarnation of a
//! sender, with a new worker and address) reaches each live endpoint with
//! [`Endpoint::add_peer_rejoining`]; the live endpoint opens a UCP endpoint
//! to the new address, and the stream of the old incarnation ends: bodies
//! still awaited from it are cancelled, what it left held back is posted
//! again. When the runtime gives up the link to a peer whose process may
//! well live (it was stopped, starved, cut off), the higher source of the
//! two opens a new UCP endpoint to the peer's address and sends a RELINK
//! from it; a request whose endpoint fails (a PeerFailed of that endpoint)
//! is made again from another one after a backoff, at most
//! `evb_msgengine::RELINK_ATTEMPTS` times; one to a peer not reachable at
//! all (no endpoint opens) is tried again for as long as it takes. Old
//! endpoints are left open (one per request).
//!
//! The endpoint is single-threaded (UCS_THREAD_MODE_SINGLE) and not `Send`:
//! the evb runtime runs one event loop per process. Callbacks from UCX only
//! append to a queue; all bookkeeping happens in [`Endpoint::progress`].

mod sys;
pub mod transports;

pub use transports::{available_transports, TransportResource};

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The engine layer shared with evb-ofi: `Progress::Blocking` sleeps on
/// UCX's event fd (ucp_worker_arm + poll), `Progress::Busy` spins on
/// ucp_worker_progress, yielding the core between polls.
pub use evb_msgengine::{Body, Completion, Error, PeerId, Progress};

/// How to open an [`Endpoint`].
#[derive(Debug, Clone)]
pub struct Options {
    /// The UCX_TLS value ("tcp", "posix,sysv,cma,self", "rc,ud", ...);
    /// `None` leaves the choice to UCX (and to a UCX_TLS environment variable).
    pub tls: Option<String>,
    pub progress: Progress,
    /// Sends in flight beyond this make [`Endpoint::send`] answer "try again"
    /// (UCX itself queues without limit, holding every buffer).
    pub max_outstanding_sends: usize,
    /// Further UCX settings, by name without the UCX_ prefix
    /// (e.g. ("KEEPALIVE_INTERVAL", "1s")).
    pub ucx_config: Vec<(String, String)>,
    /// Ask UCX to detect dead peers (UCP_ERR_HANDLING_MODE_PEER): sends to a
    /// dead peer then fail and a PeerFailed completion is reported. UCX 1.13's
    /// shared-memory transports (posix, sysv, cma, self) cannot do this, so
    /// with them it must be off: a dead peer then goes unnoticed by UCX.
    pub peer_failure_detection: bool,
    /// The bits of the caller's 32-bit tag that name the sender (see the
    /// module docs on ordering).
    pub source_mask: u64,
    /// Bodies of this many bytes and more are sent as their own contiguous
    /// message (module docs); `usize::MAX` (the default): never (evb sets
    /// it from `transport.ucx_split_body_from`).
    pub split_body_from: usize,
    /// Blocking mode: how long a `wait` that found nothing spins on the
    /// worker before it arms the event fd and sleeps (experimental: it
    /// helps split bodies and hurts iov sends, docs/transports.md); zero
    /// (the default): no spinning (evb: `transport.ucx_spin_us`).
    pub spin_before_sleep: Duration,
}

/// Tag bits left to the caller; above them: the sequence number (21 bits),
/// the sender's epoch (8 bits) and CTRL_BIT (`evb_msgengine`), then SPLIT_BIT
/// and BODY_BIT.
pub use evb_msgengine::TAG_BITS;
use evb_msgengine::{
    Arrival, Control, ControlMessage, Forget, Links, RelinkDue, Restart, TAG_MASK,
};
/// Blocking mode: waits with no completion before `wait` sleeps on the
/// event fd instead of yielding.
const YIELDS_BEFORE_SLEEP: u32 = 256;
/// On the head of a message whose body follows as its own message.
const SPLIT_BIT: u64 = 1 << 62;
/// On that body: the buffers posted for heads do not match it.
const BODY_BIT: u64 = 1 << 63;

impl Default for Options {
    fn default() -> Self {
        Options {
            tls: None,
            progress: Progress::Blocking,
            max_outstanding_sends: 1024,
            ucx_config: Vec::new(),
            peer_failure_detection: true,
            source_mask: TAG_MASK,
            // Over tcp UCX 1.13 switches contiguous sends to rendezvous at
            // 8 KiB; from here the saved copy outweighs a second message.
            // Opt-in: with zero-copy sends in flight UCX 1.13 can abort a
            // sender whose peer closes (docs/transports.md), and the gain
            // against ucx_perftest was not shown on a quiet machine.
            split_body_from: usize::MAX,
            spin_before_sleep: Duration::ZERO,
        }
    }
}

fn status_string(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a static string for any value.
    unsafe {
        CStr::from_ptr(sys::ucs_status_string(status))
            .to_string_lossy()
            .into_owned()
    }
}

pub(crate) fn ucx_error(call: &'static str, status: sys::ucs_status_t) -> Error {
    Error::Call {
        library: "UCX",
        call,
        status: status.into(),
        reason: status_string(status),
    }
}

/// UCS_PTR_IS_ERR: UCX returns small negative status codes in pointer slots.
fn ptr_status(p: *mut c_void) -> Option<sys::ucs_status_t> {
    let raw = p as isize;
    if raw < 0 && raw >= sys::UCS_ERR_LAST as isize {
        Some(raw as sys::ucs_status_t)
    } else {
        None
    }
}

// --- Addresses -------------------------------------------------------------
//
// UCX's worker address is unpacked by UCX without much validation; bytes from
// the network that are not an address could crash it. The address we hand
// out is wrapped: magic, length and a checksum, so only what local_address()
// produced reaches UCX.

const ADDRESS_MAGIC: &[u8; 8] = b"EVBUCX01";
const MAX_ADDRESS_LEN: usize = 64 * 1024;

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn wrap_address(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + 20);
    out.extend_from_slice(ADDRESS_MAGIC);
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    out.extend_from_slice(raw);
    out.extend_from_slice(&fnv1a64(raw).to_le_bytes());
    out
}

fn unwrap_address(wrapped: &[u8]) -> Result<&[u8], Error> {
    if wrapped.len() < 20 || &wrapped[..8] != ADDRESS_MAGIC {
        return Err(Error::BadAddress(format!(
            "{} bytes that do not start with the evb-ucx address magic",
            wrapped.len()
        )));
    }
    let len = u32::from_le_bytes(wrapped[8..12].try_into().expect("4 bytes")) as usize;
    if len > MAX_ADDRESS_LEN || wrapped.len() != 12 + len + 8 {
        return Err(Error::BadAddress(format!(
            "declared length {len} does not match the {} bytes given",
            wrapped.len()
        )));
    }
    let raw = &wrapped[12..12 + len];
    let sum = u64::from_le_bytes(wrapped[12 + len..].try_into().expect("8 bytes"));
    if sum != fnv1a64(raw) {
        return Err(Error::BadAddress(
            "checksum mismatch (corrupted address)".into(),
        ));
    }
    Ok(raw)
}

// --- Callback plumbing -----------------------------------------------------

enum Done {
    Send {
        slot: usize,
        request: *mut c_void,
        status: sys::ucs_status_t,
    },
    Recv {
        slot: usize,
        status: sys::ucs_status_t,
        tag: u64,
        len: usize,
    },
    PeerFailed {
        peer: usize,
        status: sys::ucs_status_t,
    },
}

/// Where callbacks report. Owned by the Endpoint through a raw pointer (from
/// Box::into_raw) so that callbacks may write to it while an Endpoint method
/// is inside UCX; it is only touched through that pointer.
struct Shared {
    done: Vec<Done>,
}

/// What a callback's user_data points to: a stable heap cell per slot, so the
/// callback learns which operation finished even if it runs before the
/// request handle has been returned to us.
struct Cookie {
    shared: *mut Shared,
    index: usize,
}

unsafe extern "C" fn on_send_done(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    let cookie = &*(user_data as *const Cookie);
    (*cookie.shared).done.push(Done::Send {
        slot: cookie.index,
        request,
        status,
    });
}

unsafe extern "C" fn on_recv_done(
    _request: *mut c_void,
    status: sys::ucs_status_t,
    info: *const sys::ucp_tag_recv_info_t,
    user_data: *mut c_void,
) {
    let cookie = &*(user_data as *const Cookie);
    let (tag, len) = if info.is_null() {
        (0, 0)
    } else {
        ((*info).sender_tag, (*info).length)
    };
    (*cookie.shared).done.push(Done::Recv {
        slot: cookie.index,
        status,
        tag,
        len,
    });
}

unsafe extern "C" fn on_peer_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    let cookie = &*(arg as *const Cookie);
    (*cookie.shared).done.push(Done::PeerFailed {
        peer: cookie.index,
        status,
    });
}

// --- Operation slots -------------------------------------------------------

struct SendOp {
    /// The requests UCX still holds (a split send has two; null: done).
    requests: [*mut c_void; 2],
    /// The first failure of either part.
    failure: Option<String>,
    ctx: u64,
    // Kept alive (and unmoved on the heap) until UCX is done with them.
    _head: Vec<u8>,
    _body: Option<Body>,
    _iov: Box<[sys::ucp_dt_iov; 2]>,
}

struct RecvOp {
    request: *mut c_void,
    buf: Vec<u8>,
    /// A split message's head arrived and its body receive is posted:
    /// (the head's wire tag, where the body goes, the head was truncated).
    head: Option<(u64, usize, bool)>,
    /// Set when UCX finished with the buffer: (status, sender tag, length).
    result: Option<(sys::ucs_status_t, u64, usize)>,
}

/// A slab whose slots keep their cookie for life (cookies must not move
/// while UCX may hold a pointer to them).
struct Slab<T> {
    ops: Vec<Option<T>>,
    #[allow(clippy::vec_box)] // boxed: a cookie must not move when the Vec grows
    cookies: Vec<Box<Cookie>>,
    free: Vec<usize>,
    live: usize,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Slab {
            ops: Vec::new(),
            cookies: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
    /// Reserves a slot; returns its index and its cookie pointer.
    fn reserve(&mut self, shared: *mut Shared) -> (usize, *mut c_void) {
        let index = self.free.pop().unwrap_or_else(|| {
            self.ops.push(None);
            self.cookies.push(Box::new(Cookie {
                shared,
                index: self.cookies.len(),
            }));
            self.ops.len() - 1
        });
        (index, &*self.cookies[index] as *const Cookie as *mut c_void)
    }
    fn fill(&mut self, index: usize, op: T) {
        self.ops[index] = Some(op);
        self.live += 1;
    }
    fn unreserve(&mut self, index: usize) {
        self.free.push(index);
    }
    fn take(&mut self, index: usize) -> Option<T> {
        let op = self.ops.get_mut(index)?.take()?;
        self.live -= 1;
        self.free.push(index);
        Some(op)
    }
}

struct Peer {
    ep: sys::ucp_ep_h,
    failed: Option<String>,
    _cookie: Box<Cookie>,
}

/// One UCP context + worker; see the module docs.
pub struct Endpoint {
    context: sys::ucp_context_h,
    worker: sys::ucp_worker_h,
    event_fd: c_int,
    progress_mode: Progress,
    /// Waits in a row with no completion in between: blocking waits only
    /// yield until there were `YIELDS_BEFORE_SLEEP` of them.
    idle_waits: u32,
    max_outstanding_sends: usize,
    peer_failure_detection: bool,
    tls: Option<String>,
    address: Vec<u8>,
    shared: *mut Shared,
    peers: Vec<Peer>,
    sends: Slab<SendOp>,
    recvs: Slab<RecvOp>,
    /// Receive slots in posting (= matching) order.
    recv_order: VecDeque<usize>,
    /// Completions known outside callbacks (immediate completions), handed out by progress.
    ready: Vec<Completion>,
    /// Sequence numbers, epochs, ordered streams, the rejoin and relink
    /// handshakes (`evb_msgengine`).
    links: Links,
    split_body_from: usize,
    spin_before_sleep: Duration,
    /// Drop has begun: no more body receives are posted.
    closing: bool,
}

const REQUEST_FREED_MARK: *mut c_void = ptr::null_mut();
/// The ctx of the endpoint's own sends: their completions are not reported.
const CONTROL_CTX: u64 = u64::MAX;

impl Endpoint {
    pub fn open(opts: &Options) -> Result<Endpoint, Error> {
        if let Some(tls) = &opts.tls {
            let available = available_transports()?;
            transports::check_tls(tls, &available)?;
        }
        if opts.max_outstanding_sends == 0 {
            return Err(Error::Config(
                "max_outstanding_sends must be at least 1".into(),
            ));
        }
        let (context, worker, event_fd) = open_worker(opts)?;
        let address = match worker_address(worker) {
            Ok(address) => address,
            Err(e) => {
                // SAFETY: both handles were just created and nothing else holds them.
                unsafe {
                    sys::ucp_worker_destroy(worker);
                    sys::ucp_cleanup(context);
                }
                return Err(e);
            }
        };
        Ok(Endpoint {
            context,
            worker,
            event_fd,
            progress_mode: opts.progress,
            idle_waits: 0,
            max_outstanding_sends: opts.max_outstanding_sends,
            peer_failure_detection: opts.peer_failure_detection,
            tls: opts.tls.clone(),
            address,
            shared: Box::into_raw(Box::new(Shared { done: Vec::new() })),
            peers: Vec::new(),
            sends: Slab::new(),
            recvs: Slab::new(),
            recv_order: VecDeque::new(),
            ready: Vec::new(),
            links: Links::new("ucx", opts.source_mask),
            split_body_from: opts.split_body_from,
            spin_before_sleep: opts.spin_before_sleep,
            closing: false,
        })
    }

    /// Opaque bytes that let a peer's [`Endpoint::add_peer`] reach this endpoint.
    pub fn local_address(&self) -> Vec<u8> {
        self.address.clone()
    }

    pub fn add_peer(&mut self, address: &[u8]) -> Result<PeerId, Error> {
        let raw = unwrap_address(address)?;
        let peer = self.peers.len();
        let cookie = Box::new(Cookie {
            shared: self.shared,
            index: peer,
        });
        let mut field_mask = sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        if self.peer_failure_detection {
            field_mask |=
                sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
        }
        let params = sys::ucp_ep_params {
            field_mask: field_mask as u64,
            address: raw.as_ptr() as *const sys::ucp_address_t,
            err_mode: sys::UCP_ERR_HANDLING_MODE_PEER,
            err_handler: sys::ucp_err_handler {
                cb: Some(on_peer_error),
                arg: &*cookie as *const Cookie as *mut c_void,
            },
            ..Default::default()
        };
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: the address bytes are what a UCP worker produced (checked
        // by unwrap_address); the cookie outlives the ep (both live in self.peers).
        let status = unsafe { sys::ucp_ep_create(self.worker, &params, &mut ep) };
        if status == sys::UCS_ERR_UNREACHABLE && self.peer_failure_detection {
            return Err(Error::Config(format!(
                "ucp_ep_create: no transport in UCX_TLS={} reaches this peer with peer failure detection \
                 (UCX's shared-memory transports posix, sysv, cma and self cannot detect a dead peer): \
                 add tcp, or turn peer_failure_detection off",
                self.tls.as_deref().unwrap_or("<UCX default>")
            )));
        }
        if status != sys::UCS_OK {
            return Err(ucx_error("ucp_ep_create", status));
        }
        self.peers.push(Peer {
            ep,
            failed: None,
            _cookie: cookie,
        });
        self.links.peer_added(peer, address);
        debug_assert_eq!(self.links.num_peers(), self.peers.len());
        Ok(peer)
    }

    /// Rejoin (module docs): take in new incarnations of senders during the
    /// run. `source`: the tag bits (within `Options::source_mask`) that
    /// name this endpoint's own messages.
    pub fn enable_rejoin(&mut self, source: u64) {
        self.links.enable_rejoin(source);
    }

    /// For a restarted endpoint (rejoin enabled): reaches a live endpoint
    /// like [`Endpoint::add_peer`] and asks it to take this one back. Send
    /// nothing to the peer before its [`Completion::PeerJoined`] (what is
    /// sent earlier carries the wrong epoch and is dropped by the peer).
    pub fn add_peer_rejoining(&mut self, address: &[u8]) -> Result<PeerId, Error> {
        self.links.require_rejoin("add_peer_rejoining")?;
        let peer = self.add_peer(address)?;
        let join = self.links.join_request(peer, &self.address);
        self.send_control(join)?;
        Ok(peer)
    }

    /// The link to `peer` (whose messages carry `source`) was given up
    /// while both processes may live: ask for it again (module docs,
    /// relink). The higher source of the two asks; the lower waits for the
    /// request, so this does nothing there. The link is up again at the
    /// [`Completion::PeerJoined`] of the answer, under a new peer index;
    /// send nothing to the peer before it.
    pub fn relink(&mut self, peer: PeerId, source: u64) -> Result<(), Error> {
        if let Some(due) = self.links.relink_wanted(peer, source) {
            self.try_relink(due);
        }
        Ok(())
    }

    /// Opens a new endpoint to the peer's address, restarts its stream
    /// under a new epoch and sends the RELINK; if the peer cannot be
    /// reached now (no endpoint opens: a link down), the same again after
    /// the backoff.
    fn try_relink(&mut self, due: RelinkDue) {
        let sent = self.add_peer(&due.address).and_then(|peer| {
            let (restart, request) = self.links.relink_opened(&due, peer, &self.address);
            self.end_old_stream(restart);
            self.send_control(request)
        });
        if let Err(e) = sent {
            self.links.relink_not_sent(due, &e, Instant::now());
        }
        self.links.debug_check();
    }

    /// A RELINK whose endpoint failed is sent again from a new one, after
    /// a backoff; `failed`: peers reported failed by this progress.
    fn retry_relinks(&mut self, failed: &[PeerId]) {
        for due in self.links.relinks_due(failed, Instant::now()) {
            self.try_relink(due);
        }
    }

    /// Messages of replaced incarnations dropped so far.
    pub fn stale_dropped(&self) -> u64 {
        self.links.stale_dropped()
    }

    /// Sends one of the endpoint's own messages (no completion is reported).
    fn send_control(&mut self, msg: ControlMessage) -> Result<(), Error> {
        let ControlMessage {
            peer,
            wire_tag,
            bytes: mut msg,
        } = msg;
        let ep = self.peers[peer].ep;
        let (slot, cookie) = self.sends.reserve(self.shared);
        // SAFETY: `msg` is stored in the slot until the send completes.
        let request = unsafe {
            tag_send(
                ep,
                msg.as_mut_ptr() as *mut c_void,
                msg.len(),
                contig_datatype(),
                wire_tag,
                cookie,
            )
        };
        if let Some(status) = ptr_status(request) {
            self.sends.unreserve(slot);
            if is_peer_failure(status) || status == sys::UCS_ERR_NO_RESOURCE {
                tracing::warn!(
                    "evb ucx: control message to peer {peer}: {}",
                    status_string(status)
                );
                return Ok(());
            }
            return Err(ucx_error("ucp_tag_send_nbx", status));
        }
        if request.is_null() {
            self.sends.unreserve(slot);
            return Ok(());
        }
        self.sends.fill(
            slot,
            SendOp {
                requests: [request, ptr::null_mut()],
                failure: None,
                ctx: CONTROL_CTX,
                _head: msg,
                _body: None,
                _iov: Box::new(
                    [sys::ucp_dt_iov {
                        buffer: ptr::null_mut(),
                        length: 0,
                    }; 2],
                ),
            },
        );
        Ok(())
    }

    /// An endpoint message (CTRL bit) arrived from `source`, message `seq`
    /// of its stream: a JOIN or its answer.
    fn on_control(&mut self, mut buf: Vec<u8>, source: u64, seq: u32, out: &mut Vec<Completion>) {
        match evb_msgengine::parse_control(&buf) {
            Control::Join {
                joiner,
                their_index,
                address,
                reply_epoch,
            } if self.links.own_source().is_some() => {
                let address = address.to_vec();
                buf.clear();
                let _ = self.post_recv(buf);
                self.accept_join(joiner, their_index, &address, reply_epoch, out);
            }
            Control::Ack { epoch, index } => {
                buf.clear();
                let _ = self.post_recv(buf);
                if !self
                    .links
                    .accept_ack(source, seq, epoch, index as PeerId, out)
                {
                    tracing::warn!("evb ucx: an answer to a join request this endpoint did not make (peer {index})");
                }
                self.links.debug_check();
            }
            _ => {
                tracing::warn!(
                    "evb ucx: an endpoint message of {} bytes from source {source:#x} not understood",
                    buf.len()
                );
                buf.clear();
                let _ = self.post_recv(buf);
            }
        }
    }

    /// A new incarnation of `joiner` asks to be taken back, or (with
    /// `reply_epoch`, a RELINK) a live one asks for the link again (module
    /// docs).
    fn accept_join(
        &mut self,
        joiner: u64,
        their_index: u32,
        address: &[u8],
        reply_epoch: Option<u8>,
        out: &mut Vec<Completion>,
    ) {
        let source = self.links.source_of(joiner);
        let peer = match self.add_peer(address) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    "evb ucx: source {source:#x} asked to join from an address not reachable: {e}"
                );
                return;
            }
        };
        let accepted = self
            .links
            .accept_join(joiner, their_index, peer, reply_epoch, out);
        self.end_old_stream(accepted.restart);
        if let Err(e) = self.send_control(accepted.answer) {
            tracing::warn!("evb ucx: answering the join of source {source:#x}: {e}");
        }
        self.links.debug_check();
    }

    /// A new link with a source started (a join or a relink): the old
    /// link's stream ends here (bodies still awaited from it are cancelled,
    /// what waited for its missing messages is posted again).
    fn end_old_stream(&mut self, restart: Restart) {
        self.cancel_bodies_from(restart.source);
        for done in restart.recycle {
            if let Some(mut buf) = done.into_buffer() {
                buf.clear();
                let _ = self.post_recv(buf);
            }
        }
    }

    /// Hands a receive buffer to the endpoint; its capacity is the largest
    /// message it accepts. It comes back in a Received (or ReceiveFailed) completion.
    pub fn post_recv(&mut self, mut buf: Vec<u8>) -> Result<(), Error> {
        if buf.capacity() == 0 {
            return Err(Error::EmptyReceiveBuffer);
        }
        let (slot, cookie) = self.recvs.reserve(self.shared);
        // Heads only: a split message's body is received into the same
        // buffer once its head is in (module docs).
        // SAFETY: the buffer's heap storage stays put (the Vec is stored in the
        // slot and never resized) until the receive completes or is cancelled.
        let request = unsafe {
            tag_recv(
                self.worker,
                buf.as_mut_ptr(),
                buf.capacity(),
                0,
                BODY_BIT,
                cookie,
            )
        };
        let request = match request {
            Ok(r) => r,
            Err(status) => {
                self.recvs.unreserve(slot);
                return Err(ucx_error("ucp_tag_recv_nbx", status));
            }
        };
        // The callback may already have run (its report waits in `shared`).
        self.recvs.fill(
            slot,
            RecvOp {
                request,
                buf,
                head: None,
                result: None,
            },
        );
        self.recv_order.push_back(slot);
        Ok(())
    }

    /// Sends `head ++ body[range]` as one message with `tag`. The endpoint keeps
    /// the buffers until the Sent/SendFailed completion. Ok(false): too many
    /// sends in flight or UCX said "no resources": nothing was sent, the
    /// buffers are dropped, try again later. Never blocks.
    pub fn send(
        &mut self,
        peer: PeerId,
        tag: u64,
        head: Vec<u8>,
        body: Option<(Rc<Vec<u8>>, std::ops::Range<usize>)>,
        ctx: u64,
    ) -> Result<bool, Error> {
        let body = body.map(|(rc, range)| (rc as Body, range));
        self.send_bytes(peer, tag, head, body, ctx)
    }

    /// [`Self::send`] with a body of any shared bytes (evb's MEP buffers).
    pub fn send_bytes(
        &mut self,
        peer: PeerId,
        tag: u64,
        head: Vec<u8>,
        body: Option<(Body, std::ops::Range<usize>)>,
        ctx: u64,
    ) -> Result<bool, Error> {
        let Some(p) = self.peers.get(peer) else {
            return Err(Error::UnknownPeer(peer));
        };
        check_send_args(tag, body.as_ref())?;
        if let Some(reason) = &p.failed {
            self.ready.push(Completion::SendFailed {
                ctx,
                reason: format!("peer {peer} failed earlier: {reason}"),
            });
            return Ok(true);
        }
        if self.sends.live >= self.max_outstanding_sends {
            return Ok(false);
        }
        let ep = p.ep;
        let (iov, iov_count) = gather_list(&head, body.as_ref());
        let body_rc = body.map(|(data, _)| data);
        let split = iov_count == 2 && iov[1].length >= self.split_body_from;
        let (slot, cookie) = self.sends.reserve(self.shared);
        let wire_tag = self.links.wire_tag(peer, tag);
        // SAFETY (both sends): the iov array and the buffers it points to are
        // stored in the slot and outlive the operation; the Rc body is never
        // mutated meanwhile.
        let first = unsafe { send_whole_or_head(ep, &iov, iov_count, split, wire_tag, cookie) };
        if let Some(status) = ptr_status(first) {
            self.sends.unreserve(slot);
            if status == sys::UCS_ERR_NO_RESOURCE {
                return Ok(false);
            }
            if is_peer_failure(status) {
                self.ready.push(Completion::SendFailed {
                    ctx,
                    reason: status_string(status),
                });
                return Ok(true);
            }
            return Err(ucx_error("ucp_tag_send_nbx", status));
        }
        // The message (or its head) is out: it has its place in the stream.
        self.links.sent(peer, tag);
        let mut requests = [first, ptr::null_mut()];
        let mut failure = None;
        if split {
            let second = unsafe {
                tag_send(
                    ep,
                    iov[1].buffer,
                    iov[1].length,
                    contig_datatype(),
                    wire_tag | SPLIT_BIT | BODY_BIT,
                    cookie,
                )
            };
            match ptr_status(second) {
                // The head went without its body: the receiver's stream from
                // us is broken, so this is a failed send (whatever the cause).
                Some(status) => failure = Some(status_string(status)),
                None => requests[1] = second,
            }
        }
        if requests.iter().all(|r| r.is_null()) {
            self.sends.unreserve(slot);
            self.ready.push(match failure {
                None => Completion::Sent { ctx },
                Some(reason) => Completion::SendFailed { ctx, reason },
            });
            return Ok(true);
        }
        self.sends.fill(
            slot,
            SendOp {
                requests,
                failure,
                ctx,
                _head: head,
                _body: body_rc,
                _iov: iov,
            },
        );
        Ok(true)
    }

    /// Drives UCX without blocking and appends what finished to `out`.
    pub fn progress(&mut self, out: &mut Vec<Completion>) -> Result<(), Error> {
        let before = out.len();
        let result = self.progress_inner(out);
        if out.len() > before {
            self.idle_waits = 0;
        }
        if self.links.relinks_pending() {
            let failed: Vec<PeerId> = out[before..]
                .iter()
                .filter_map(|c| match c {
                    Completion::PeerFailed { peer, .. } => Some(*peer),
                    _ => None,
                })
                .collect();
            self.retry_relinks(&failed);
        }
        result
    }

    fn progress_inner(&mut self, out: &mut Vec<Completion>) -> Result<(), Error> {
        self.drive();
        out.append(&mut self.ready);
        // Posting a body receive can complete it at once (its report is
        // queued meanwhile), hence the loop.
        loop {
            // SAFETY: no UCX call is running, so no callback touches `shared`.
            let done = unsafe { std::mem::take(&mut (*self.shared).done) };
            if done.is_empty() {
                break;
            }
            for d in done {
                self.on_done(d, out);
            }
        }
        // Hand out finished receives in each sender's order (module docs).
        let mut i = 0;
        while i < self.recv_order.len() {
            let slot = self.recv_order[i];
            let finished = matches!(&self.recvs.ops[slot], Some(op) if op.result.is_some());
            if !finished {
                i += 1;
                continue;
            }
            self.recv_order.remove(i);
            let op = self.recvs.take(slot).expect("slot in recv_order is live");
            let (status, wire_tag, len) = op.result.expect("checked above");
            let mut buf = op.buf;
            // A replaced incarnation's message (module docs on rejoin) is
            // dropped and its buffer posted again.
            let (control, tag, source, seq) = match self.links.arrival(wire_tag) {
                Arrival::Stale => {
                    buf.clear();
                    self.post_recv(buf)?;
                    continue;
                }
                Arrival::Control { tag, source, seq } => (true, tag, source, seq),
                Arrival::Data { tag, source, seq } => (false, tag, source, seq),
            };
            if status == sys::UCS_OK && len <= buf.capacity() {
                // SAFETY: UCX wrote `len` bytes into the buffer's storage.
                unsafe { buf.set_len(len) };
                if control {
                    self.on_control(buf, source, seq, out);
                } else {
                    let done = Completion::Received { buf, len, tag };
                    self.links.finished(source, seq, Some(done), out);
                }
            } else {
                buf.clear();
                let truncated = status == sys::UCS_ERR_MESSAGE_TRUNCATED;
                let reason = if truncated {
                    format!(
                        "message from tag {tag:#x} is larger than the {}-byte receive buffer ({})",
                        buf.capacity(),
                        status_string(status)
                    )
                } else {
                    status_string(status)
                };
                out.push(Completion::ReceiveFailed { buf, tag, reason });
                if truncated {
                    // It had its place in the sender's stream.
                    self.links.finished(source, seq, None, out);
                }
            }
        }
        Ok(())
    }

    fn on_done(&mut self, d: Done, out: &mut Vec<Completion>) {
        match d {
            Done::Send {
                slot,
                request,
                status,
            } => {
                let Some(Some(op)) = self.sends.ops.get_mut(slot) else {
                    return;
                };
                // SAFETY: the request completed (its callback ran); freeing it is ours to do.
                unsafe { sys::ucp_request_free(request) };
                for r in op.requests.iter_mut().filter(|r| **r == request) {
                    *r = ptr::null_mut();
                }
                if status != sys::UCS_OK && op.failure.is_none() {
                    op.failure = Some(status_string(status));
                }
                if op.requests.iter().any(|r| !r.is_null()) {
                    return;
                }
                let op = self.sends.take(slot).expect("checked above");
                if op.ctx == CONTROL_CTX {
                    return;
                }
                out.push(match op.failure {
                    None => Completion::Sent { ctx: op.ctx },
                    Some(reason) => Completion::SendFailed {
                        ctx: op.ctx,
                        reason,
                    },
                });
            }
            Done::Recv {
                slot,
                status,
                tag,
                len,
            } => {
                let Some(Some(op)) = self.recvs.ops.get_mut(slot) else {
                    return;
                };
                if !op.request.is_null() {
                    // SAFETY: as above, the receive request completed.
                    unsafe { sys::ucp_request_free(op.request) };
                    op.request = REQUEST_FREED_MARK;
                }
                let truncated = status == sys::UCS_ERR_MESSAGE_TRUNCATED;
                match op.head {
                    Some((head_tag, at, head_truncated)) => {
                        let status = if head_truncated {
                            sys::UCS_ERR_MESSAGE_TRUNCATED
                        } else {
                            status
                        };
                        op.result = Some((status, head_tag, at + len));
                    }
                    None if tag & SPLIT_BIT != 0
                        && (status == sys::UCS_OK || truncated)
                        && !self.closing =>
                    {
                        // The body follows: receive it right behind the head
                        // (or, after a truncated head, receive it into
                        // nothing, so that it does not stay queued in UCX).
                        let cap = op.buf.capacity();
                        let at = if truncated { cap } else { len.min(cap) };
                        let cookie = &*self.recvs.cookies[slot] as *const Cookie as *mut c_void;
                        // SAFETY: as in post_recv; `at` is within the capacity.
                        let request = unsafe {
                            tag_recv(
                                self.worker,
                                op.buf.as_mut_ptr().add(at),
                                cap - at,
                                tag | BODY_BIT,
                                u64::MAX,
                                cookie,
                            )
                        };
                        match request {
                            Ok(r) => {
                                op.request = r;
                                op.head = Some((tag, at, truncated));
                            }
                            Err(s) => op.result = Some((s, tag, len)),
                        }
                    }
                    None => op.result = Some((status, tag, len)),
                }
            }
            Done::PeerFailed { peer, status } => {
                if let Some(p) = self.peers.get_mut(peer) {
                    if p.failed.is_none() {
                        let reason = status_string(status);
                        p.failed = Some(reason.clone());
                        out.push(Completion::PeerFailed { peer, reason });
                    }
                }
            }
        }
    }

    /// Messages from `source` (tag & source_mask) arrived and wait for an
    /// earlier one still in transfer: evidence that the sender is alive.
    pub fn source_waiting(&self, source: u64) -> bool {
        // Only lately held: a receive matched to a dead sender's message
        // can stay pending for ever (no error handling on shared memory),
        // and what waits behind it is no evidence.
        self.links.waiting(source)
    }

    /// The link to `peer`, whose messages carry `source`, was given up:
    /// [`Endpoint::forget_source`], unless a new incarnation of that source
    /// joined as another peer since (its stream is not the old one's).
    pub fn forget_peer(&mut self, peer: PeerId, source: u64) {
        match self.links.forget_peer(peer, source) {
            Forget::Replaced { .. } => {}
            Forget::Forgotten { held, .. } => {
                // As forget_source.
                self.cancel_bodies_from(self.links.source_of(source));
                self.ready.extend(held);
            }
        }
    }

    /// Cancels the receives of bodies still awaited from `source` (they
    /// come back as `ReceiveFailed` with their buffers).
    fn cancel_bodies_from(&mut self, source: u64) {
        for &slot in &self.recv_order {
            if let Some(op) = &self.recvs.ops[slot] {
                let from_source = op
                    .head
                    .is_some_and(|(tag, ..)| self.links.source_of(tag) == source);
                if from_source && op.result.is_none() && !op.request.is_null() {
                    // SAFETY: a live receive request of this worker.
                    unsafe { sys::ucp_request_cancel(self.worker, op.request) };
                }
            }
        }
    }

    /// The sender named by `source` is gone: what was held back behind a
    /// message of its that will never complete is handed out by the next
    /// `progress`, and its messages are no longer ordered.
    pub fn forget_source(&mut self, source: u64) {
        let source = self.links.source_of(source);
        // Bodies still awaited from it may never come: cancelled, their
        // buffers come back as ReceiveFailed.
        self.cancel_bodies_from(source);
        let held = self.links.forget_source(source);
        self.ready.extend(held);
    }

    /// Blocks until something may have happened or `timeout` passed
    /// (Blocking: on UCX's event fd; Busy: spinning). Spurious wake-ups happen.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        match self.progress_mode {
            Progress::Busy => loop {
                // SAFETY: worker is valid for the life of self.
                let events = unsafe { sys::ucp_worker_progress(self.worker) };
                if events > 0 || self.has_news() || Instant::now() >= deadline {
                    return Ok(());
                }
                // The core goes to any other runnable process (as OpenMPI
                // does when oversubscribed); alone, this is a short syscall.
                std::thread::yield_now();
            },
            Progress::Blocking if self.idle_waits < YIELDS_BEFORE_SLEEP => {
                // Traffic flows (completions within the last waits): a
                // sleep and a wake-up through the event fd per message
                // cost more than the message (1 MiB over tcp, split
                // bodies, one in flight: 2.1-3.3 against 5.1-5.2 GiB/s
                // spinning). Drive UCX once and yield the core instead.
                self.idle_waits += 1;
                // SAFETY: worker is valid for the life of self.
                let events = unsafe { sys::ucp_worker_progress(self.worker) };
                if events == 0 && !self.has_news() {
                    std::thread::yield_now();
                }
                Ok(())
            }
            Progress::Blocking => {
                let spin_until = Instant::now() + self.spin_before_sleep;
                while Instant::now() < spin_until.min(deadline) {
                    // SAFETY: worker is valid for the life of self.
                    let events = unsafe { sys::ucp_worker_progress(self.worker) };
                    if events > 0 || self.has_news() {
                        return Ok(());
                    }
                    std::hint::spin_loop();
                }
                if !self.arm()? {
                    return Ok(());
                }
                let remaining = deadline.saturating_duration_since(Instant::now());
                // Rounded up, so a short timeout does not become a busy loop.
                let ms = remaining
                    .as_nanos()
                    .div_ceil(1_000_000)
                    .min(i32::MAX as u128) as c_int;
                let mut pfd = libc::pollfd {
                    fd: self.event_fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
                if rc < 0 {
                    let err = std::io::Error::last_os_error();
                    if err.kind() != std::io::ErrorKind::Interrupted {
                        return Err(Error::Wait {
                            library: "UCX",
                            source: err,
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// The fd that becomes readable when UCX has events (Blocking mode only),
    /// for an event loop that sleeps on other fds too (e.g. registered with
    /// mio as a SourceFd). Before sleeping on it, call [`Endpoint::arm`].
    pub fn event_fd(&self) -> Option<c_int> {
        (self.event_fd >= 0).then_some(self.event_fd)
    }

    /// Prepares the event fd for sleeping: drives UCX, then arms the fd.
    /// Ok(true): nothing pending, sleeping on the fd is safe. Ok(false):
    /// completions or events are pending, call [`Endpoint::progress`] instead.
    /// Busy mode has no fd: always Ok(false).
    pub fn arm(&mut self) -> Result<bool, Error> {
        if self.progress_mode == Progress::Busy {
            return Ok(false);
        }
        self.drive();
        if self.has_news() {
            return Ok(false);
        }
        // SAFETY: worker is valid; armed after progress returned 0, as UCX requires.
        match unsafe { sys::ucp_worker_arm(self.worker) } {
            sys::UCS_OK => Ok(true),
            sys::UCS_ERR_BUSY => Ok(false),
            status => Err(ucx_error("ucp_worker_arm", status)),
        }
    }

    /// Sends handed to UCX whose completion has not been reported yet.
    pub fn outstanding_sends(&self) -> usize {
        self.sends.live
    }

    /// Receive buffers posted and not yet handed back.
    pub fn posted_recvs(&self) -> usize {
        self.recv_order.len()
    }

    pub fn num_peers(&self) -> usize {
        self.peers.len()
    }

    fn drive(&mut self) {
        // Bounded: under a flood UCX always has more; the caller comes back.
        for _ in 0..64 {
            // SAFETY: worker is valid for the life of self.
            if unsafe { sys::ucp_worker_progress(self.worker) } == 0 {
                break;
            }
        }
    }

    /// Progresses until every request in `requests` completed (each is then
    /// freed and removed) or `limit` passed.
    unsafe fn progress_requests(&mut self, requests: &mut Vec<*mut c_void>, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            requests.retain(|&r| {
                if sys::ucp_request_check_status(r) != sys::UCS_INPROGRESS {
                    sys::ucp_request_free(r);
                    false
                } else {
                    true
                }
            });
            if requests.is_empty() || Instant::now() >= deadline {
                return;
            }
            sys::ucp_worker_progress(self.worker);
        }
    }

    fn has_news(&self) -> bool {
        // SAFETY: read while no UCX call runs.
        !self.ready.is_empty() || unsafe { !(*self.shared).done.is_empty() }
    }
}

/// Refuses a send whose body range lies outside its buffer or whose tag has
/// bits beyond the caller's (checked before anything is reserved).
#[inline]
fn check_send_args(tag: u64, body: Option<&(Body, std::ops::Range<usize>)>) -> Result<(), Error> {
    if let Some((data, range)) = body {
        let len = (**data).as_ref().len();
        if range.start > range.end || range.end > len {
            return Err(Error::BadRange {
                start: range.start,
                end: range.end,
                len,
            });
        }
    }
    if tag > TAG_MASK {
        return Err(Error::BadTag(tag));
    }
    Ok(())
}

/// The gather list of `head ++ body[range]` and how many of its two entries
/// are used: the head, then the body's bytes if there are any. The range
/// must have passed [`check_send_args`].
#[inline]
fn gather_list(
    head: &[u8],
    body: Option<&(Body, std::ops::Range<usize>)>,
) -> (Box<[sys::ucp_dt_iov; 2]>, usize) {
    let mut iov = Box::new(
        [sys::ucp_dt_iov {
            buffer: head.as_ptr() as *mut c_void,
            length: head.len(),
        }; 2],
    );
    let mut iov_count = 1;
    if let Some((data, range)) = body {
        if !range.is_empty() {
            // SAFETY: range checked against data.len() by check_send_args.
            iov[1] = sys::ucp_dt_iov {
                buffer: unsafe { (**data).as_ref().as_ptr().add(range.start) } as *mut c_void,
                length: range.len(),
            };
            iov_count = 2;
        }
    }
    (iov, iov_count)
}

/// The first send of a message: all of it as one iov send, or, when its body
/// goes as its own message (`split`), only its head, marked SPLIT.
///
/// # Safety
/// The buffers `iov` points to stay valid until the send completes.
#[inline]
unsafe fn send_whole_or_head(
    ep: sys::ucp_ep_h,
    iov: &[sys::ucp_dt_iov; 2],
    iov_count: usize,
    split: bool,
    wire_tag: u64,
    cookie: *mut c_void,
) -> *mut c_void {
    if split {
        tag_send(
            ep,
            iov[0].buffer,
            iov[0].length,
            contig_datatype(),
            wire_tag | SPLIT_BIT,
            cookie,
        )
    } else {
        tag_send(
            ep,
            iov.as_ptr() as *mut c_void,
            iov_count,
            sys::UCP_DATATYPE_IOV as sys::ucp_datatype_t,
            wire_tag,
            cookie,
        )
    }
}

/// ucp_tag_send_nbx reporting to `cookie` (a Cookie).
///
/// # Safety
/// `buffer` (`count` items of `datatype`) stays valid until the send completes.
unsafe fn tag_send(
    ep: sys::ucp_ep_h,
    buffer: *mut c_void,
    count: usize,
    datatype: sys::ucp_datatype_t,
    wire_tag: u64,
    cookie: *mut c_void,
) -> *mut c_void {
    let mut param = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
            | sys::UCP_OP_ATTR_FIELD_USER_DATA
            | sys::UCP_OP_ATTR_FIELD_DATATYPE,
        user_data: cookie,
        datatype,
        ..Default::default()
    };
    param.cb.send = Some(on_send_done);
    sys::ucp_tag_send_nbx(ep, buffer, count, wire_tag, &param)
}

/// ucp_tag_recv_nbx of `len` bytes at `buffer` reporting to `cookie`.
///
/// # Safety
/// `buffer..buffer + len` stays valid and unmoved until the receive
/// completes or is cancelled.
unsafe fn tag_recv(
    worker: sys::ucp_worker_h,
    buffer: *mut u8,
    len: usize,
    tag: u64,
    mask: u64,
    cookie: *mut c_void,
) -> Result<*mut c_void, sys::ucs_status_t> {
    // Immediate completion is refused: UCX 1.13 does not fill recv_info on
    // that path for some unexpected messages (seen with shared memory), and
    // the callback always reports the sender's tag and the length.
    let mut param = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
            | sys::UCP_OP_ATTR_FIELD_USER_DATA
            | sys::UCP_OP_ATTR_FIELD_DATATYPE
            | sys::UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        user_data: cookie,
        datatype: contig_datatype(),
        ..Default::default()
    };
    param.cb.recv = Some(on_recv_done);
    let request = sys::ucp_tag_recv_nbx(worker, buffer as *mut c_void, len, tag, mask, &param);
    match ptr_status(request) {
        Some(status) => Err(status),
        None => Ok(request),
    }
}

fn contig_datatype() -> sys::ucp_datatype_t {
    // ucp_dt_make_contig(1): element size 1 shifted over the class bits.
    ((1u64 << sys::UCP_DATATYPE_SHIFT) | sys::UCP_DATATYPE_CONTIG as u64) as sys::ucp_datatype_t
}

fn is_peer_failure(status: sys::ucs_status_t) -> bool {
    // UCS_IS_LINK_ERROR / UCS_IS_ENDPOINT_ERROR ranges, plus the plain
    // connection errors UCX returns for a peer that went away.
    (sys::UCS_ERR_LAST_LINK_FAILURE..=sys::UCS_ERR_FIRST_LINK_FAILURE).contains(&status)
        || (sys::UCS_ERR_LAST_ENDPOINT_FAILURE..=sys::UCS_ERR_FIRST_ENDPOINT_FAILURE)
            .contains(&status)
        || status == sys::UCS_ERR_CONNECTION_RESET
        || status == sys::UCS_ERR_NOT_CONNECTED
        || status == sys::UCS_ERR_UNREACHABLE
        || status == sys::UCS_ERR_CANCELED
}

/// UCP's configuration with the endpoint's settings applied (`UCX_TLS`
/// first, then `ucx_config`, so an explicit setting wins): a setting UCX
/// rejects fails here, naming it, instead of as an obscure init error.
/// The caller releases the configuration.
fn ucp_config(opts: &Options) -> Result<*mut sys::ucp_config_t, Error> {
    let mut settings: Vec<(String, String)> = Vec::new();
    if let Some(tls) = &opts.tls {
        settings.push(("TLS".into(), tls.clone()));
    }
    settings.extend(opts.ucx_config.iter().cloned());
    // SAFETY: standard UCP configuration calls; the configuration is
    // released on every error path.
    unsafe {
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        let status = sys::ucp_config_read(ptr::null(), ptr::null(), &mut config);
        if status != sys::UCS_OK {
            return Err(ucx_error("ucp_config_read", status));
        }
        for (name, value) in &settings {
            let (Ok(c_name), Ok(c_value)) =
                (CString::new(name.as_str()), CString::new(value.as_str()))
            else {
                sys::ucp_config_release(config);
                return Err(Error::Config(format!(
                    "UCX setting {name}={value:?} contains a NUL byte"
                )));
            };
            let status = sys::ucp_config_modify(config, c_name.as_ptr(), c_value.as_ptr());
            if status != sys::UCS_OK {
                sys::ucp_config_release(config);
                return Err(Error::Config(format!(
                    "UCX rejected setting UCX_{name}={value}: {}",
                    status_string(status)
                )));
            }
        }
        Ok(config)
    }
}

/// The UCP context and its single-threaded worker, with the worker's event
/// fd when progress blocks (-1 otherwise). Whatever was created is
/// released again on an error.
fn open_worker(opts: &Options) -> Result<(sys::ucp_context_h, sys::ucp_worker_h, c_int), Error> {
    let config = ucp_config(opts)?;
    // SAFETY: standard UCP setup sequence; every handle obtained is
    // released on the error paths and in Drop.
    unsafe {
        let mut features = sys::UCP_FEATURE_TAG as u64;
        if opts.progress == Progress::Blocking {
            features |= sys::UCP_FEATURE_WAKEUP as u64;
        }
        let params = sys::ucp_params {
            field_mask: (sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_NAME) as u64,
            features,
            name: c"evb".as_ptr(),
            ..Default::default()
        };
        let mut context: sys::ucp_context_h = ptr::null_mut();
        let status = sys::ucp_init_version(
            sys::UCP_API_MAJOR,
            sys::UCP_API_MINOR,
            &params,
            config,
            &mut context,
        );
        sys::ucp_config_release(config);
        if status != sys::UCS_OK {
            return Err(init_error("ucp_init", status, opts));
        }
        let worker_params = sys::ucp_worker_params {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::UCS_THREAD_MODE_SINGLE,
            ..Default::default()
        };
        let mut worker: sys::ucp_worker_h = ptr::null_mut();
        let status = sys::ucp_worker_create(context, &worker_params, &mut worker);
        if status != sys::UCS_OK {
            sys::ucp_cleanup(context);
            return Err(init_error("ucp_worker_create", status, opts));
        }
        let mut event_fd: c_int = -1;
        if opts.progress == Progress::Blocking {
            let status = sys::ucp_worker_get_efd(worker, &mut event_fd);
            if status != sys::UCS_OK {
                sys::ucp_worker_destroy(worker);
                sys::ucp_cleanup(context);
                return Err(init_error("ucp_worker_get_efd", status, opts));
            }
        }
        Ok((context, worker, event_fd))
    }
}

/// The worker's address as peers receive it (wrapped, see `wrap_address`).
fn worker_address(worker: sys::ucp_worker_h) -> Result<Vec<u8>, Error> {
    // SAFETY: the worker is live; UCX's copy of the address is released
    // once wrapped.
    unsafe {
        let mut raw_address: *mut sys::ucp_address_t = ptr::null_mut();
        let mut address_len: usize = 0;
        let status = sys::ucp_worker_get_address(worker, &mut raw_address, &mut address_len);
        if status != sys::UCS_OK {
            return Err(ucx_error("ucp_worker_get_address", status));
        }
        let address = wrap_address(std::slice::from_raw_parts(
            raw_address as *const u8,
            address_len,
        ));
        sys::ucp_worker_release_address(worker, raw_address);
        Ok(address)
    }
}

/// An init failure with a transport list attached: "no such device" from UCX
/// mostly means the transports asked for do not work here.
fn init_error(call: &'static str, status: sys::ucs_status_t, opts: &Options) -> Error {
    let available = available_transports()
        .map(|r| transports::describe(&r))
        .unwrap_or_default();
    Error::Config(format!(
        "{call} failed: {} (UCX_TLS={}; available transports: {available})",
        status_string(status),
        opts.tls.as_deref().unwrap_or("<UCX default>")
    ))
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: teardown in UCX's order: cancel receives, close endpoints
        // (bounded in time), destroy the worker, clean up the context; only
        // then free what callbacks could still write to.
        unsafe {
            self.closing = true;
            for &slot in &self.recv_order {
                if let Some(op) = &self.recvs.ops[slot] {
                    if !op.request.is_null() && op.result.is_none() {
                        sys::ucp_request_cancel(self.worker, op.request);
                    }
                }
            }
            // Give queued sends a moment to go out before closing.
            let deadline = Instant::now() + Duration::from_millis(500);
            while self.sends.live > 0 && Instant::now() < deadline {
                let mut sink = Vec::new();
                let _ = self.progress(&mut sink);
                if sink.is_empty() {
                    std::thread::yield_now();
                }
            }
            // Flush what was sent (bounded), then close by force. A flush close
            // cannot be bounded: it waits for the peer, and UCX aborts when the
            // worker is destroyed while an endpoint still has protocol requests
            // (an incoming rendezvous, a close in progress). A forced close
            // completes every such request as cancelled. The peer sees the
            // connection drop (with peer failure detection: PeerFailed).
            let mut pending = Vec::new();
            for p in self.peers.iter().filter(|p| p.failed.is_none()) {
                let param = sys::ucp_request_param_t::default();
                let request = sys::ucp_ep_flush_nbx(p.ep, &param);
                if !request.is_null() && ptr_status(request).is_none() {
                    pending.push(request);
                }
            }
            self.progress_requests(&mut pending, Duration::from_millis(500));
            for p in &self.peers {
                let param = sys::ucp_request_param_t {
                    op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
                    flags: sys::UCP_EP_CLOSE_FLAG_FORCE,
                    ..Default::default()
                };
                let request = sys::ucp_ep_close_nbx(p.ep, &param);
                if !request.is_null() && ptr_status(request).is_none() {
                    pending.push(request);
                }
            }
            self.progress_requests(&mut pending, Duration::from_secs(1));
            let closing = pending;
            for r in closing {
                sys::ucp_request_free(r);
            }
            for op in self.sends.ops.iter().flatten() {
                for &r in op.requests.iter().filter(|r| !r.is_null()) {
                    sys::ucp_request_free(r);
                }
            }
            for op in self.recvs.ops.iter().flatten() {
                if !op.request.is_null() {
                    sys::ucp_request_free(op.request);
                }
            }
            sys::ucp_worker_destroy(self.worker);
            sys::ucp_cleanup(self.context);
            drop(Box::from_raw(self.shared));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_envelope_rejects_garbage() {
        let wrapped = wrap_address(b"some worker address");
        assert_eq!(unwrap_address(&wrapped).unwrap(), b"some worker address");
        assert!(unwrap_address(b"").is_err());
        assert!(unwrap_address(&[0u8; 100]).is_err());
        let mut bad = wrapped.clone();
        *bad.last_mut().unwrap() ^= 1;
        let err = unwrap_address(&bad).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
        let mut short = wrapped.clone();
        short.truncate(wrapped.len() - 1);
        assert!(unwrap_address(&short).is_err());
    }
}
