//! evb over libfabric (OFI).
//!
//! The engine layer above the library is `evb_msgengine`'s, shared by
//! evb-ucx and evb-ofi: the wire-tag layout, the per-sender ordered
//! streams, the rejoin/relink state machine (`Links`), the [`Completion`]
//! and [`Error`] types. This crate drives the library and calls into it.
//!
//! The TCP runtime owns its sockets; on an HPC fabric (InfiniBand, Slingshot,
//! Omni-Path) the NIC is driven through libfabric instead, and the same event
//! loop must be able to use it. This crate is that transport reduced to what the
//! runtime needs: one reliable-datagram (FI_EP_RDM) endpoint per process,
//! tagged messages that arrive whole and in order per sender (FI_ORDER_SAS),
//! buffers that stay owned by Rust until their completion, and a wait that
//! sleeps on the library's file descriptor so several processes can share a
//! few cores.
//!
//! Everything is single-threaded: an [`Endpoint`] is not `Send` and every call
//! comes from the owning event loop. libfabric providers with manual data
//! progress (tcp;ofi_rxm, shm, udp;ofi_rxd) only move data while someone reads
//! the completion queue, so the caller must keep calling [`Endpoint::progress`].
//!
//! What a caller can rely on, and what it must do:
//! - Messages from one sender arrive whole and are handed out in the order
//!   sent. Providers do not guarantee this by themselves: tcp;ofi_rxm
//!   completes a large (rendezvous) message after a small one sent later,
//!   and libfabric 1.17's shm can reorder unexpected messages. So every send
//!   carries a per-destination sequence number in the upper 32 bits of the
//!   tag, and the receiver holds a completion back until its predecessors
//!   from the same sender have been handed out. Messages from different
//!   senders are not ordered with respect to each other.
//! - The caller's tag is 32 bits and opaque here, except that the bits in
//!   `Options::source_mask` must name the sender (RDM receives are posted
//!   for any source): messages that agree on them form one ordered stream.
//! - A lost peer: `forget_source` hands out what was held back for it (its
//!   stream may have a hole that never fills) and stops ordering it.
//! - `send` returns Ok(false) ("try again") while a connection to a new peer
//!   is being set up and when the transmit queue is full: progress, retry.
//! - A dead peer shows up as `SendFailed` completions (tcp: within a few
//!   milliseconds of the connection breaking).
//! - Both sides must use the same `Options::max_message`; receive buffers are
//!   at least that large, so nothing is ever truncated.
//!
//! Rejoin ([`Endpoint::enable_rejoin`]) and relink ([`Endpoint::relink`]),
//! as in evb-ucx: `evb_msgengine::Links` holds the state machine (its docs
//! tell the handshakes). A restarted process (a new incarnation of a
//! sender, with a new address) reaches each live endpoint with
//! [`Endpoint::add_peer_rejoining`]; the live endpoint inserts the new
//! address and the stream of the old incarnation ends; unexpected messages
//! of a forgotten incarnation are discarded by epoch, so the new one's are
//! never touched. The endpoint's own messages (JOIN, RELINK, ACK) queue
//! behind one another while the library says "try again".

mod sys;

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::ops::Range;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The engine layer shared with evb-ucx: `Progress::Blocking` sleeps on
/// the completion queue's wait object (an fd when the provider has one),
/// `Progress::Busy` never sleeps (`wait` yields the core and returns; the
/// caller spins on `progress`).
pub use evb_msgengine::{Body, Completion, Error, PeerId, Progress};

/// What to open.
#[derive(Clone, Debug)]
pub struct Options {
    /// As users write it: `tcp` (tcp;ofi_rxm), `udp` (udp;ofi_rxd), `shm`,
    /// `verbs` (verbs;ofi_rxm), or any exact provider name `fi_info -l` shows.
    pub provider: String,
    /// A libfabric domain (for tcp/udp the network interface, e.g. `lo`);
    /// `None` takes the provider's first.
    pub domain: Option<String>,
    pub progress: Progress,
    /// The longest message, head included. Every receive buffer must hold
    /// this much and longer sends are refused, so with the same value on
    /// both sides no message is ever truncated: providers handle truncation
    /// badly (libfabric 1.17's tcp;ofi_rxm drops the connection for eager
    /// messages, shm aborts the process).
    pub max_message: usize,
    /// The bits of the caller's 32-bit tag that name the sender; see the
    /// crate documentation on ordering. The default takes the whole tag.
    pub source_mask: u64,
}

/// Tag bits left to the caller; above them the sequence number, the
/// sender's epoch and the CTRL bit (`evb_msgengine`).
pub use evb_msgengine::TAG_BITS;
use evb_msgengine::{
    Arrival, Control, ControlMessage, Forget, Links, RelinkDue, Restart, CTRL_BIT, EPOCH_MASK,
    EPOCH_SHIFT, TAG_MASK,
};
/// The ctx of the endpoint's own sends: their completions are not reported.
const CONTROL_CTX: u64 = u64::MAX;

/// Default `Options::max_message`: a 4 MiB fragment and its header.
pub const DEFAULT_MAX_MESSAGE: usize = (4 << 20) + 4096;

impl Options {
    pub fn new(provider: &str) -> Options {
        Options {
            provider: provider.to_string(),
            domain: None,
            progress: Progress::Blocking,
            max_message: DEFAULT_MAX_MESSAGE,
            source_mask: TAG_MASK,
        }
    }
}

/// The full libfabric provider name for what users write.
pub fn provider_name(user: &str) -> String {
    match user {
        "tcp" => "tcp;ofi_rxm".into(),
        "udp" => "udp;ofi_rxd".into(),
        "verbs" => "verbs;ofi_rxm".into(),
        other => other.into(),
    }
}

/// libfabric 1.17's shm provider moves large messages with cross-memory
/// attach (CMA) by default, and with it loses single messages under an
/// all-to-all or a slow receiver (the exchange then stalls for ever; see
/// docs/transports.md). Its segmented copy through the shared region
/// (`FI_SHM_DISABLE_CMA=1`) passes the same exchanges, so that is what evb
/// asks for unless the user set the variable. libfabric reads it when it
/// first loads its providers: this runs before any other libfabric call of
/// the process (an endpoint is the first thing opened).
fn avoid_shm_cma() {
    const VAR: &str = "FI_SHM_DISABLE_CMA";
    if std::env::var_os(VAR).is_none() {
        std::env::set_var(VAR, "1");
    }
}

/// A libfabric call that failed (`ret`: its negative return).
fn fabric_error(call: &'static str, ret: isize) -> Error {
    Error::Call {
        library: "libfabric",
        call,
        status: ret as i32,
        reason: strerror(ret),
    }
}

fn strerror(ret: isize) -> String {
    let code = ret.unsigned_abs() as c_int;
    // SAFETY: fi_strerror returns a static string for any code.
    let text = unsafe { CStr::from_ptr(sys::fi_strerror(code)) };
    format!("{} (-{code})", text.to_string_lossy())
}

/// The per-operation state libfabric hands back in a completion. The
/// fi_context2 must come first: its address is the operation's context.
#[repr(C)]
struct Op {
    fi_ctx: sys::fi_context2,
    kind: OpKind,
    regions: Vec<*mut sys::fid_mr>,
}

enum OpKind {
    Send {
        ctx: u64,
        // Held only to keep the memory alive until the completion.
        _head: Vec<u8>,
        _body: Option<Body>,
    },
    Recv {
        buf: Vec<u8>,
    },
    /// FI_PEEK | FI_DISCARD of one unexpected message from a forgotten
    /// sender (the tag's source bits).
    Discard {
        source: u64,
        epoch: u8,
    },
    /// Failed: its buffers are gone, the context stays reserved.
    Dead,
}

enum Waiter {
    /// The CQ's fd, polled after fi_trywait says sleeping is safe.
    Fd(c_int),
    /// No fd (or Busy mode): no sleeping in the library. fi_cq_sread is not
    /// used: with some providers' yield-based wait (shm in 1.17) it ignores its
    /// timeout and would hang a single-threaded loop.
    None,
}

const CQ_BATCH: usize = 64;
/// How many stale unexpected messages one `post_recv` may skip (see there).
const MAX_STALE_UNEXPECTED: usize = 4096;
/// How long `wait` sleeps when the provider has no wait fd.
const NAP: Duration = Duration::from_micros(100);
/// Waits with no completion before `wait` naps instead of yielding, when
/// the provider has no wait fd.
const YIELDS_BEFORE_NAP: u32 = 256;
const FI_ADDR_UNSPEC: u64 = u64::MAX;

/// One libfabric RDM endpoint with its fabric, domain, address vector and
/// completion queue.
pub struct Endpoint {
    info: *mut sys::fi_info,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    ep: *mut sys::fid_ep,
    waiter: Waiter,
    progress_mode: Progress,
    /// Waits in a row with no completion in between (no wait fd: the
    /// first ones only yield, see [`Endpoint::wait`]).
    idle_waits: u32,
    provider: String,
    address: Vec<u8>,
    peers: Vec<sys::fi_addr_t>,
    ops: HashMap<usize, Box<Op>>,
    sends: usize,
    /// Sequence numbers, epochs, ordered streams, the rejoin and relink
    /// handshakes (`evb_msgengine`).
    links: Links,
    /// Completions ready to be handed out by the next `progress`.
    ready: Vec<Completion>,
    /// Operations that failed, kept allocated so that their context address
    /// is never reused: libfabric 1.17's tcp;ofi_rxm can report a failed
    /// operation twice (once per failed piece of a rendezvous transfer, or
    /// an error and then a completion); a second report must not hit a newer
    /// operation that happens to live at the same address.
    dead: HashMap<usize, Box<Op>>,
    register_local: bool,
    iov_limit: usize,
    max_message: usize,
    /// The endpoint's own messages the library could not take yet, in order.
    pending_control: std::collections::VecDeque<ControlMessage>,
}

/// Owns a malloc'd C string until libfabric takes it (fi_freeinfo frees it).
fn c_strdup(s: &str, field: &str) -> Result<*mut libc::c_char, Error> {
    let c =
        CString::new(s).map_err(|_| Error::Config(format!("{field} `{s}` contains a NUL byte")))?;
    // SAFETY: c is a valid C string; strdup copies it with malloc.
    let p = unsafe { libc::strdup(c.as_ptr()) };
    if p.is_null() {
        return Err(Error::Internal("out of memory".into()));
    }
    Ok(p)
}

fn fi_version() -> u32 {
    // SAFETY: a constant from the headers.
    unsafe { sys::evb_fi_version() }
}

/// Hints shared by `open` and the listing of what is available.
fn base_hints() -> Result<*mut sys::fi_info, Error> {
    // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with all sub-attributes.
    let hints = unsafe { sys::fi_dupinfo(ptr::null()) };
    if hints.is_null() {
        return Err(Error::Internal("libfabric fi_allocinfo failed".into()));
    }
    // SAFETY: hints and its attribute pointers were allocated just above.
    unsafe {
        (*hints).caps = sys::FI_TAGGED as u64;
        (*(*hints).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
    }
    Ok(hints)
}

/// Provider names (and their domains) offering RDM tagged endpoints here.
pub fn available_providers() -> Vec<String> {
    let Ok(hints) = base_hints() else {
        return Vec::new();
    };
    let mut list: Vec<(String, Vec<String>)> = Vec::new();
    let mut info: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: valid hints; info is freed below.
    let ret =
        unsafe { sys::fi_getinfo(fi_version(), ptr::null(), ptr::null(), 0, hints, &mut info) };
    if ret == 0 {
        let mut cur = info;
        while !cur.is_null() {
            // SAFETY: walking the list libfabric returned.
            unsafe {
                let prov = cstr((*(*cur).fabric_attr).prov_name);
                let dom = cstr((*(*cur).domain_attr).name);
                match list.iter_mut().find(|(p, _)| *p == prov) {
                    Some((_, doms)) => {
                        if !doms.contains(&dom) {
                            doms.push(dom)
                        }
                    }
                    None => list.push((prov, vec![dom])),
                }
                cur = (*cur).next;
            }
        }
        // SAFETY: info came from fi_getinfo.
        unsafe { sys::fi_freeinfo(info) };
    }
    // SAFETY: hints came from fi_dupinfo.
    unsafe { sys::fi_freeinfo(hints) };
    list.into_iter()
        .map(|(p, d)| format!("{p} (domains: {})", d.join(", ")))
        .collect()
}

/// From a list fi_getinfo returned, a copy of the first entry on `domain`
/// (null if none); the list is freed.
fn take_domain(list: *mut sys::fi_info, domain: &str) -> *mut sys::fi_info {
    let mut found = ptr::null_mut();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: walking the list libfabric returned; fi_dupinfo copies one entry.
        unsafe {
            if cstr((*(*cur).domain_attr).name) == domain {
                found = sys::fi_dupinfo(cur);
                break;
            }
            cur = (*cur).next;
        }
    }
    // SAFETY: list came from fi_getinfo.
    unsafe { sys::fi_freeinfo(list) };
    found
}

fn cstr(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric strings are NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Endpoint {
    pub fn open(opts: &Options) -> Result<Endpoint, Error> {
        let provider = provider_name(&opts.provider);
        if provider == "shm" {
            avoid_shm_cma();
        }
        let hints = base_hints()?;
        // SAFETY: hints is a fresh fi_info; strings are malloc'd and freed by fi_freeinfo.
        unsafe {
            (*hints).mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            (*(*hints).tx_attr).msg_order = sys::FI_ORDER_SAS as u64;
            (*(*hints).rx_attr).msg_order = sys::FI_ORDER_SAS as u64;
            (*(*hints).domain_attr).threading = sys::fi_threading_FI_THREAD_DOMAIN;
            // Registration for local buffers is handled; the other bits only
            // concern RMA, which this endpoint never exposes.
            (*(*hints).domain_attr).mr_mode = (sys::FI_MR_LOCAL
                | sys::FI_MR_ALLOCATED
                | sys::FI_MR_PROV_KEY
                | sys::FI_MR_VIRT_ADDR) as c_int;
            match c_strdup(&provider, "provider") {
                Ok(p) => (*(*hints).fabric_attr).prov_name = p,
                Err(e) => {
                    sys::fi_freeinfo(hints);
                    return Err(e);
                }
            }
            if let Some(d) = &opts.domain {
                match c_strdup(d, "domain") {
                    Ok(p) => (*(*hints).domain_attr).name = p,
                    Err(e) => {
                        sys::fi_freeinfo(hints);
                        return Err(e);
                    }
                }
            }
        }
        let mut info: *mut sys::fi_info = ptr::null_mut();
        // SAFETY: valid hints.
        let ret =
            unsafe { sys::fi_getinfo(fi_version(), ptr::null(), ptr::null(), 0, hints, &mut info) };
        // SAFETY: hints came from fi_dupinfo.
        unsafe { sys::fi_freeinfo(hints) };
        // Some layered providers (tcp;ofi_rxm) ignore the domain hint: pick the
        // matching entry ourselves and free the rest.
        if ret == 0 && !info.is_null() {
            if let Some(d) = &opts.domain {
                info = take_domain(info, d);
            }
        }
        if ret != 0 || info.is_null() {
            let wanted = match &opts.domain {
                Some(d) => format!("provider `{}` ({provider}) on domain `{d}`", opts.provider),
                None => format!("provider `{}` ({provider})", opts.provider),
            };
            let avail = available_providers();
            let avail = if avail.is_empty() {
                "none".to_string()
            } else {
                avail.join("; ")
            };
            return Err(Error::Unavailable(format!(
                "libfabric has no {wanted} with reliable tagged messages (FI_EP_RDM, FI_TAGGED, FI_ORDER_SAS) on this machine: {}; available: {avail}",
                strerror(ret as isize)
            )));
        }
        let mut ep = Endpoint {
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            ep: ptr::null_mut(),
            waiter: Waiter::None,
            progress_mode: opts.progress,
            idle_waits: 0,
            provider: cstr(unsafe { (*(*info).fabric_attr).prov_name }),
            address: Vec::new(),
            peers: Vec::new(),
            ops: HashMap::new(),
            sends: 0,
            links: Links::new("ofi", opts.source_mask),
            ready: Vec::new(),
            dead: HashMap::new(),
            register_local: false,
            iov_limit: 1,
            max_message: opts.max_message,
            pending_control: std::collections::VecDeque::new(),
        };
        // On error the partly built endpoint is dropped, which closes what was opened.
        ep.setup()?;
        Ok(ep)
    }

    fn setup(&mut self) -> Result<(), Error> {
        let info = self.info;
        // SAFETY: info is the first entry fi_getinfo returned; every fid is
        // checked before use and closed in Drop.
        unsafe {
            self.register_local = (*(*info).domain_attr).mr_mode & sys::FI_MR_LOCAL as c_int != 0
                || (*info).mode & sys::FI_LOCAL_MR != 0;
            self.iov_limit = (*(*info).tx_attr).iov_limit.max(1);
            let provider_max = (*(*info).ep_attr).max_msg_size;
            if self.max_message > provider_max {
                return Err(Error::Config(format!(
                    "max_message of {} bytes exceeds provider {}'s limit of {provider_max} bytes",
                    self.max_message, self.provider
                )));
            }

            let ret = sys::fi_fabric((*info).fabric_attr, &mut self.fabric, ptr::null_mut());
            check("fi_fabric", ret as isize)?;
            let ret = sys::evb_fi_domain(self.fabric, info, &mut self.domain, ptr::null_mut());
            check("fi_domain", ret as isize)?;

            let mut av_attr = sys::fi_av_attr {
                type_: sys::fi_av_type_FI_AV_TABLE,
                ..Default::default()
            };
            let ret = sys::evb_fi_av_open(self.domain, &mut av_attr, &mut self.av, ptr::null_mut());
            check("fi_av_open", ret as isize)?;

            self.open_cq()?;

            let ret = sys::evb_fi_endpoint(self.domain, info, &mut self.ep, ptr::null_mut());
            check("fi_endpoint", ret as isize)?;
            let ret = sys::evb_fi_ep_bind(self.ep, &mut (*self.av).fid, 0);
            check("fi_ep_bind(av)", ret as isize)?;
            let ret = sys::evb_fi_ep_bind(
                self.ep,
                &mut (*self.cq).fid,
                (sys::FI_TRANSMIT | sys::FI_RECV) as u64,
            );
            check("fi_ep_bind(cq)", ret as isize)?;
            let ret = sys::evb_fi_enable(self.ep);
            check("fi_enable", ret as isize)?;

            let mut len: usize = 256;
            let mut name = vec![0u8; len];
            let mut ret =
                sys::evb_fi_getname(&mut (*self.ep).fid, name.as_mut_ptr().cast(), &mut len);
            if ret == -(sys::FI_ETOOSMALL as c_int) && len <= 64 * 1024 {
                name.resize(len, 0);
                ret = sys::evb_fi_getname(&mut (*self.ep).fid, name.as_mut_ptr().cast(), &mut len);
            }
            check("fi_getname", ret as isize)?;
            name.truncate(len);
            self.address = name;
        }
        Ok(())
    }

    /// Opens the CQ with the best wait object the provider accepts.
    fn open_cq(&mut self) -> Result<(), Error> {
        let choices: &[sys::fi_wait_obj] = match self.progress_mode {
            Progress::Busy => &[sys::fi_wait_obj_FI_WAIT_NONE],
            Progress::Blocking => &[sys::fi_wait_obj_FI_WAIT_FD, sys::fi_wait_obj_FI_WAIT_NONE],
        };
        let mut last = 0isize;
        for &wait_obj in choices {
            let mut attr = sys::fi_cq_attr {
                format: sys::fi_cq_format_FI_CQ_FORMAT_TAGGED,
                wait_obj,
                ..Default::default()
            };
            // SAFETY: domain is open; attr lives across the call.
            let ret = unsafe {
                sys::evb_fi_cq_open(self.domain, &mut attr, &mut self.cq, ptr::null_mut())
            };
            if ret != 0 {
                last = ret as isize;
                self.cq = ptr::null_mut();
                continue;
            }
            self.waiter = if wait_obj == sys::fi_wait_obj_FI_WAIT_FD {
                let mut fd: c_int = -1;
                // SAFETY: FI_GETWAIT on an FD CQ writes an int.
                let ret = unsafe {
                    sys::evb_fi_control(
                        &mut (*self.cq).fid,
                        sys::FI_GETWAIT as c_int,
                        (&mut fd as *mut c_int).cast(),
                    )
                };
                if ret == 0 && fd >= 0 {
                    Waiter::Fd(fd)
                } else {
                    Waiter::None
                }
            } else {
                Waiter::None
            };
            return Ok(());
        }
        Err(fabric_error("fi_cq_open", last))
    }

    /// The full libfabric provider name in use (e.g. `tcp;ofi_rxm`).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Opaque bytes for peers' `add_peer`, to exchange out of band.
    pub fn local_address(&self) -> Vec<u8> {
        self.address.clone()
    }

    /// `Options::max_message`: the longest message sent or received.
    pub fn max_message_size(&self) -> usize {
        self.max_message
    }

    pub fn add_peer(&mut self, address: &[u8]) -> Result<PeerId, Error> {
        if address.is_empty() || address.len() > 64 * 1024 {
            return Err(Error::BadAddress(format!(
                "{} bytes long: not a libfabric address",
                address.len()
            )));
        }
        if address.len() != self.address.len() {
            return Err(Error::BadAddress(format!(
                "{} bytes long: does not fit provider {} (its addresses are {} bytes)",
                address.len(),
                self.provider,
                self.address.len()
            )));
        }
        let mut fi_addr: sys::fi_addr_t = FI_ADDR_UNSPEC;
        // SAFETY: one address of the provider's length; av is open.
        let ret = unsafe {
            sys::evb_fi_av_insert(
                self.av,
                address.as_ptr().cast(),
                1,
                &mut fi_addr,
                0,
                ptr::null_mut(),
            )
        };
        if ret != 1 {
            return Err(Error::BadAddress(format!(
                "libfabric fi_av_insert rejected it: {}",
                if ret < 0 {
                    strerror(ret as isize)
                } else {
                    "not inserted".into()
                }
            )));
        }
        self.peers.push(fi_addr);
        let peer = self.peers.len() - 1;
        self.links.peer_added(peer, address);
        debug_assert_eq!(self.links.num_peers(), self.peers.len());
        Ok(peer)
    }

    /// Rejoin (crate docs): take in new incarnations of senders during the
    /// run. `source`: the tag bits (within `Options::source_mask`) that name
    /// this endpoint's own messages.
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
        self.pending_control.push_back(join);
        self.push_control()?;
        Ok(peer)
    }

    /// The link to `peer` (whose messages carry `source`) was given up
    /// while both processes may live: ask for it again (`evb_msgengine`
    /// docs, relink). The higher source of the two asks, under a new peer
    /// index (the same address added again) and a new epoch for the peer's
    /// messages; the lower waits for the request. The link is up again at
    /// the [`Completion::PeerJoined`] of the answer. An address the library
    /// refuses now is asked again after a backoff; a request the library
    /// fails to deliver is not made again.
    pub fn relink(&mut self, peer: PeerId, source: u64) -> Result<(), Error> {
        match self.links.relink_wanted(peer, source) {
            Some(due) => self.try_relink(due),
            None => Ok(()),
        }
    }

    /// Adds the peer's address again, restarts its stream under a new
    /// epoch and queues the RELINK; if the address cannot be added now, the
    /// same again after the backoff.
    fn try_relink(&mut self, due: RelinkDue) -> Result<(), Error> {
        let new = match self.add_peer(&due.address) {
            Ok(p) => p,
            Err(e) => {
                self.links.relink_not_sent(due, &e, Instant::now());
                return Ok(());
            }
        };
        let (restart, request) = self.links.relink_opened(&due, new, &self.address);
        self.end_old_stream(restart)?;
        self.pending_control.push_back(request);
        self.links.debug_check();
        self.push_control()
    }

    /// Messages of replaced incarnations dropped so far.
    pub fn stale_dropped(&self) -> u64 {
        self.links.stale_dropped()
    }

    /// Hands the endpoint's own queued messages to the library, in order
    /// per peer: a peer the library says "try again" for keeps its
    /// messages (in order) for the next call, and the other peers' go out.
    /// tcp;ofi_rxm says "try again" for as long as it cannot connect, and
    /// for ever to a dead peer's address: one queue for all peers held
    /// every JOIN and answer behind a request to a dead peer (a restarted
    /// consumer, asking a node killed meanwhile first, was taken back by
    /// none of the others; `evb chaos -t ofi:tcp --seed 2` hung).
    fn push_control(&mut self) -> Result<(), Error> {
        let mut blocked: Vec<PeerId> = Vec::new();
        let mut kept = std::collections::VecDeque::new();
        while let Some(msg) = self.pending_control.pop_front() {
            if blocked.contains(&msg.peer) {
                kept.push_back(msg);
                continue;
            }
            let retry = msg.clone();
            let ControlMessage {
                peer,
                wire_tag,
                bytes,
            } = msg;
            match self.post_send(peer, wire_tag, bytes, None, 0..0, CONTROL_CTX) {
                Ok(true) => {}
                Ok(false) => {
                    blocked.push(peer);
                    kept.push_back(retry);
                }
                Err(e) => {
                    kept.push_back(retry);
                    kept.append(&mut self.pending_control);
                    self.pending_control = kept;
                    return Err(e);
                }
            }
        }
        self.pending_control = kept;
        Ok(())
    }

    /// An endpoint message (CTRL bit) arrived from `source`, message `seq`
    /// of its stream: a JOIN or its answer.
    fn on_control(
        &mut self,
        buf: Vec<u8>,
        source: u64,
        seq: u32,
        out: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        match evb_msgengine::parse_control(&buf) {
            Control::Join {
                joiner,
                their_index,
                address,
                reply_epoch,
            } if self.links.own_source().is_some() => {
                let address = address.to_vec();
                self.post_recv(buf)?;
                self.accept_join(joiner, their_index, &address, reply_epoch, out)?;
            }
            Control::Ack { epoch, index } => {
                self.post_recv(buf)?;
                if !self
                    .links
                    .accept_ack(source, seq, epoch, index as PeerId, out)
                {
                    tracing::warn!("evb ofi: an answer to a join request this endpoint did not make (peer {index})");
                }
                self.links.debug_check();
            }
            _ => {
                tracing::warn!(
                    "evb ofi: an endpoint message of {} bytes from source {source:#x} not understood",
                    buf.len()
                );
                self.post_recv(buf)?;
            }
        }
        Ok(())
    }

    /// A new incarnation of `joiner` asks to be taken back, or (with
    /// `reply_epoch`, a RELINK) a live one asks for the link again
    /// (`evb_msgengine` docs).
    fn accept_join(
        &mut self,
        joiner: u64,
        their_index: u32,
        address: &[u8],
        reply_epoch: Option<u8>,
        out: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        let source = self.links.source_of(joiner);
        let peer = match self.add_peer(address) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    "evb ofi: source {source:#x} asked to join from an address not usable: {e}"
                );
                return Ok(());
            }
        };
        let accepted = self
            .links
            .accept_join(joiner, their_index, peer, reply_epoch, out);
        self.end_old_stream(accepted.restart)?;
        if let Some(old) = accepted.superseded {
            // Our own request went to the old incarnation (dead, or it
            // would not join anew): still queued, it would hold up every
            // control message behind it, this answer included.
            self.pending_control.retain(|m| m.peer != old);
        }
        self.pending_control.push_back(accepted.answer);
        self.links.debug_check();
        self.push_control()
    }

    /// A new link with a source started (a join or a relink): what the old
    /// link's stream held back waiting for its missing messages is posted
    /// again.
    fn end_old_stream(&mut self, restart: Restart) -> Result<(), Error> {
        for done in restart.recycle {
            if let Some(buf) = done.into_buffer() {
                self.post_recv(buf)?;
            }
        }
        Ok(())
    }

    /// The link to `peer`, whose messages carry `source`, was given up:
    /// [`Endpoint::forget_source`], unless a new incarnation of that source
    /// joined as another peer since: then only the old incarnation's
    /// unexpected messages (the previous epoch) are discarded.
    ///
    /// Our own messages still queued for it (a JOIN, a RELINK, an answer)
    /// go too: the library says "try again" to a dead peer's address for
    /// as long as it is dead, and each `progress` would ask again. A
    /// restarted node that found the EM dead kept its JOIN to it, retried
    /// at every turn (its system time about twice its peers' per second)
    /// until the run's end: the new EM joins it anew.
    pub fn forget_peer(&mut self, peer: PeerId, source: u64) {
        self.pending_control.retain(|m| m.peer != peer);
        let source = self.links.source_of(source);
        match self.links.forget_peer(peer, source) {
            Forget::Replaced { old_epoch } => self.discard_unexpected(source, old_epoch),
            Forget::Forgotten { held, epoch } => {
                // As forget_source.
                self.ready.extend(held);
                self.discard_unexpected(source, epoch);
            }
        }
    }

    fn register(&self, ptr: *const u8, len: usize, access: u64) -> Result<*mut sys::fid_mr, Error> {
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: ptr/len describe memory that outlives the registration (owned by the Op).
        let ret = unsafe {
            sys::evb_fi_mr_reg(
                self.domain,
                ptr.cast(),
                len,
                access,
                0,
                0,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        check("fi_mr_reg", ret as isize)?;
        Ok(mr)
    }

    /// Hands a receive buffer to the endpoint; its capacity is the largest
    /// message it accepts. It comes back in a Received or ReceiveFailed completion.
    pub fn post_recv(&mut self, mut buf: Vec<u8>) -> Result<(), Error> {
        buf.clear();
        let cap = buf.capacity();
        if cap < self.max_message {
            return Err(Error::SmallReceiveBuffer {
                capacity: cap,
                max_message: self.max_message,
            });
        }
        let mut op = Box::new(Op {
            fi_ctx: Default::default(),
            kind: OpKind::Recv { buf },
            regions: Vec::new(),
        });
        let data = match &mut op.kind {
            OpKind::Recv { buf } => buf.as_mut_ptr(),
            _ => unreachable!("just built as a receive"),
        };
        let mut desc: *mut c_void = ptr::null_mut();
        if self.register_local {
            let mr = self.register(data, cap, sys::FI_RECV as u64)?;
            op.regions.push(mr);
            // SAFETY: mr was just registered.
            desc = unsafe { sys::evb_fi_mr_desc(mr) };
        }
        let ctx_ptr = (&mut *op as *mut Op).cast::<c_void>();
        let mut ret = 0;
        // libfabric 1.17's tcp;ofi_rxm matches a new receive against its
        // queue of unexpected messages at once; when the first one came from
        // a connection that has since gone (a dead peer's rendezvous or
        // segmented message) it discards that message and fails the call with
        // FI_EOTHER, without touching the buffer. Each retry takes the next
        // unexpected message, so a bounded loop gets past a dead peer's queue.
        for _ in 0..MAX_STALE_UNEXPECTED {
            // SAFETY: the buffer and context live in `op`, kept in self.ops until the completion.
            ret = unsafe {
                sys::evb_fi_trecv(
                    self.ep,
                    data.cast(),
                    cap,
                    desc,
                    FI_ADDR_UNSPEC,
                    0,
                    u64::MAX,
                    ctx_ptr,
                )
            };
            if ret != -(sys::FI_EOTHER as isize) {
                break;
            }
        }
        if ret != 0 {
            self.release(op);
            return Err(fabric_error("fi_trecv", ret));
        }
        self.ops.insert(ctx_ptr as usize, op);
        Ok(())
    }

    /// Sends `head ++ body[range]` as one message with `tag`. The endpoint keeps
    /// `head` and the Rc until the Sent/SendFailed completion. Ok(false): the
    /// library said "try again" (buffers dropped, nothing sent); call
    /// `progress` and retry. Never blocks.
    pub fn send(
        &mut self,
        peer: PeerId,
        tag: u64,
        head: Vec<u8>,
        body: Option<(Rc<Vec<u8>>, Range<usize>)>,
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
        body: Option<(Body, Range<usize>)>,
        ctx: u64,
    ) -> Result<bool, Error> {
        if peer >= self.peers.len() {
            return Err(Error::UnknownPeer(peer));
        }
        let (body_rc, range) = match body {
            Some((rc, range)) => {
                let len = (*rc).as_ref().len();
                if range.start > range.end || range.end > len {
                    return Err(Error::BadRange {
                        start: range.start,
                        end: range.end,
                        len,
                    });
                }
                (Some(rc), range)
            }
            None => (None, 0..0),
        };
        if tag > TAG_MASK {
            return Err(Error::BadTag(tag));
        }
        let wire_tag = self.links.wire_tag(peer, tag);
        if !self.post_send(peer, wire_tag, head, body_rc, range, ctx)? {
            return Ok(false);
        }
        self.links.sent(peer, tag);
        Ok(true)
    }

    /// Posts one message with its full tag; Ok(false): "try again".
    fn post_send(
        &mut self,
        peer: PeerId,
        wire_tag: u64,
        head: Vec<u8>,
        body_rc: Option<Body>,
        range: Range<usize>,
        ctx: u64,
    ) -> Result<bool, Error> {
        let dest = self.peers[peer];
        let total = head.len() + range.len();
        if total > self.max_message {
            return Err(Error::MessageTooLong {
                len: total,
                max_message: self.max_message,
            });
        }
        // Two pieces need two iov entries; a provider with one gets a copy.
        let mut pieces: Vec<(*const u8, usize)> = Vec::with_capacity(2);
        let (head, body_rc) = match body_rc {
            Some(rc) if self.iov_limit < 2 && !range.is_empty() => {
                let mut flat = head;
                flat.extend_from_slice(&(*rc).as_ref()[range.clone()]);
                (flat, None)
            }
            body_rc => (head, body_rc),
        };
        if !head.is_empty() || body_rc.is_none() {
            pieces.push((head.as_ptr(), head.len()));
        }
        if let Some(rc) = &body_rc {
            if !range.is_empty() {
                pieces.push(((**rc).as_ref()[range.clone()].as_ptr(), range.len()));
            }
        }
        if pieces.is_empty() {
            pieces.push((head.as_ptr(), 0));
        }
        let mut op = Box::new(Op {
            fi_ctx: Default::default(),
            kind: OpKind::Send {
                ctx,
                _head: head,
                _body: body_rc,
            },
            regions: Vec::new(),
        });
        let mut descs: Vec<*mut c_void> = vec![ptr::null_mut(); pieces.len()];
        if self.register_local {
            for (i, &(p, len)) in pieces.iter().enumerate() {
                match self.register(p, len.max(1), sys::FI_SEND as u64) {
                    Ok(mr) => {
                        op.regions.push(mr);
                        // SAFETY: mr was just registered.
                        descs[i] = unsafe { sys::evb_fi_mr_desc(mr) };
                    }
                    Err(e) => {
                        self.release(op);
                        return Err(e);
                    }
                }
            }
        }
        let iov: Vec<libc::iovec> = pieces
            .iter()
            .map(|&(p, len)| libc::iovec {
                iov_base: p as *mut c_void,
                iov_len: len,
            })
            .collect();
        let ctx_ptr = (&mut *op as *mut Op).cast::<c_void>();
        // SAFETY: the memory behind iov is owned by `op` (Vec heap data and the Rc),
        // which stays in self.ops until the completion.
        let ret = unsafe {
            sys::evb_fi_tsendv(
                self.ep,
                iov.as_ptr().cast(),
                descs.as_mut_ptr(),
                iov.len(),
                dest,
                wire_tag,
                ctx_ptr,
            )
        };
        if ret == -(sys::FI_EAGAIN as isize) {
            self.release(op);
            return Ok(false);
        }
        if ret != 0 {
            self.release(op);
            return Err(fabric_error("fi_tsendv", ret as isize));
        }
        self.ops.insert(ctx_ptr as usize, op);
        self.sends += 1;
        Ok(true)
    }

    /// Sends in flight (posted, no completion yet).
    pub fn outstanding_sends(&self) -> usize {
        self.sends
    }

    /// Receive buffers posted and not yet returned (including completed
    /// ones held back for order).
    pub fn posted_recvs(&self) -> usize {
        debug_assert!(
            self.sends <= self.ops.len(),
            "every send in flight is an op"
        );
        self.ops.len() - self.sends + self.links.held()
    }

    /// Messages from `source` (tag & source_mask) arrived lately and wait
    /// for an earlier one still in transfer: evidence that the sender is
    /// alive. Only lately: libfabric 1.17's tcp;ofi_rxm can leave the
    /// receive of a dead sender's rendezvous message pending for ever, and
    /// the messages held behind it must not keep the sender alive.
    pub fn source_waiting(&self, source: u64) -> bool {
        self.links.waiting(source)
    }

    /// The peer whose messages carry `source` (tag & source_mask) is gone:
    /// hands out, with the next `progress`, whatever of its stream was held
    /// back behind a message that will now never arrive, and from then on
    /// hands out its messages as they come, unordered.
    pub fn forget_source(&mut self, source: u64) {
        let source = self.links.source_of(source);
        let held = self.links.forget_source(source);
        self.ready.extend(held);
        let epoch = self.links.current_epoch(source);
        self.discard_unexpected(source, epoch);
    }

    /// Drops one message from `source` the provider holds as unexpected (no
    /// receive matched it yet); the completion posts the next one until none
    /// is left. libfabric 1.17's tcp;ofi_rxm keeps a dead peer's unexpected
    /// rendezvous and segmented messages after freeing their connection, and
    /// matching one later with a posted receive fails (FI_EOTHER) or, once
    /// no connection is left, crashes inside the library. Providers without
    /// FI_PEEK refuse the call: nothing to do then. Only done on rxm: 1.17's
    /// shm starts the transfer of the message it should discard into the
    /// (absent) buffer, looping in process_vm_readv with its region lock
    /// held, which deadlocks every process on the node.
    /// Only messages of incarnation `epoch` of the source (and no endpoint
    /// message) are discarded: a new incarnation's are left alone.
    fn discard_unexpected(&mut self, source: u64, epoch: u8) {
        if !self.provider.contains("ofi_rxm") {
            return;
        }
        let mut op = Box::new(Op {
            fi_ctx: Default::default(),
            kind: OpKind::Discard { source, epoch },
            regions: Vec::new(),
        });
        let ctx_ptr = (&mut *op as *mut Op).cast::<c_void>();
        // Match the source, epoch and CTRL bits only: any sequence number,
        // any other bits.
        let ignore = !(self.links.source_mask() | (EPOCH_MASK << EPOCH_SHIFT) | CTRL_BIT);
        let tag = source | (u64::from(epoch) << EPOCH_SHIFT);
        // SAFETY: the context lives in self.ops until its completion.
        let ret = unsafe { sys::evb_fi_tdiscard(self.ep, tag, ignore, ctx_ptr) };
        if ret == 0 {
            self.ops.insert(ctx_ptr as usize, op);
        }
    }

    #[allow(clippy::boxed_local)] // ops live boxed: their address is the libfabric context
    fn release(&self, op: Box<Op>) -> OpKind {
        for &mr in &op.regions {
            // SAFETY: registered by us, no operation uses it any more.
            unsafe { sys::evb_fi_close(&mut (*mr).fid) };
        }
        op.kind
    }

    /// Non-blocking: drives the library and appends completions to `out`.
    pub fn progress(&mut self, out: &mut Vec<Completion>) -> Result<(), Error> {
        if self.links.relinks_pending() {
            // Relinks to an address the library refused, due again.
            for due in self.links.relinks_due(&[], Instant::now()) {
                self.try_relink(due)?;
            }
        }
        self.push_control()?;
        out.append(&mut self.ready);
        let mut entries = [sys::fi_cq_tagged_entry::default(); CQ_BATCH];
        loop {
            // SAFETY: entries has room for CQ_BATCH tagged entries.
            let n = unsafe { sys::evb_fi_cq_read(self.cq, entries.as_mut_ptr().cast(), CQ_BATCH) };
            if n > 0 {
                self.idle_waits = 0;
                for e in &entries[..n as usize] {
                    self.complete(e, out)?;
                }
                if (n as usize) < CQ_BATCH {
                    return self.unblock_held();
                }
            } else if n == -(sys::FI_EAGAIN as isize) {
                return self.unblock_held();
            } else if n == -(sys::FI_EAVAIL as isize) {
                self.complete_error(out)?;
            } else {
                return Err(fabric_error("fi_cq_read", n));
            }
        }
    }

    /// Completions held back for order wait for a message that no posted
    /// receive can take any more: every buffer posted is held (libfabric
    /// 1.17's shm can match later messages of a sender while an earlier
    /// one sits in its unexpected queue). Post one more buffer so the
    /// missing message can land; it goes to the caller like any other.
    fn unblock_held(&mut self) -> Result<(), Error> {
        if self.links.held() == 0 {
            return Ok(());
        }
        let posted = self
            .ops
            .values()
            .filter(|op| matches!(op.kind, OpKind::Recv { .. }))
            .count();
        if posted == 0 {
            self.post_recv(Vec::with_capacity(self.max_message))?;
        }
        Ok(())
    }

    /// The operation behind a completion's context; None when it is not one
    /// of ours (see `Completion::Unattributed`).
    fn take_op(&mut self, context: *mut c_void) -> Option<OpKind> {
        if self.dead.contains_key(&(context as usize)) {
            return Some(OpKind::Dead);
        }
        let op = self.ops.remove(&(context as usize))?;
        if matches!(op.kind, OpKind::Send { .. }) {
            self.sends -= 1;
        }
        Some(self.release(op))
    }

    /// Like `take_op` for a failed operation, whose context address stays
    /// reserved (see `dead`).
    fn take_failed(&mut self, context: *mut c_void) -> Option<OpKind> {
        if self.dead.contains_key(&(context as usize)) {
            return Some(OpKind::Dead);
        }
        let mut op = self.ops.remove(&(context as usize))?;
        if matches!(op.kind, OpKind::Send { .. }) {
            self.sends -= 1;
        }
        for mr in op.regions.drain(..) {
            // SAFETY: registered by us; the operation is over.
            unsafe { sys::evb_fi_close(&mut (*mr).fid) };
        }
        let kind = std::mem::replace(&mut op.kind, OpKind::Dead);
        self.dead.insert(context as usize, op);
        Some(kind)
    }

    fn complete(
        &mut self,
        e: &sys::fi_cq_tagged_entry,
        out: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        match self.take_op(e.op_context) {
            Some(OpKind::Send { ctx, .. }) if ctx == CONTROL_CTX => {}
            Some(OpKind::Send { ctx, .. }) => out.push(Completion::Sent { ctx }),
            Some(OpKind::Recv { mut buf }) => {
                let len = e.len.min(buf.capacity());
                // SAFETY: the provider wrote `len` bytes into the buffer.
                unsafe { buf.set_len(len) };
                // A replaced incarnation's message (crate docs on rejoin) is
                // dropped.
                match self.links.arrival(e.tag) {
                    Arrival::Stale => self.post_recv(buf)?,
                    Arrival::Control { source, seq, .. } => {
                        self.on_control(buf, source, seq, out)?
                    }
                    Arrival::Data { tag, source, seq } => {
                        let done = Completion::Received { buf, len, tag };
                        self.links.finished(source, seq, Some(done), out);
                    }
                }
            }
            // One stale message dropped: look for the next.
            Some(OpKind::Discard { source, epoch }) => self.discard_unexpected(source, epoch),
            // A late report of an operation that already failed.
            Some(OpKind::Dead) => {}
            None => {
                // A successful completion for something we never posted would
                // be a provider bug we cannot recover from.
                return Err(Error::Internal(format!(
                    "libfabric completed an operation this endpoint did not post (context {:p}, flags {:#x})",
                    e.op_context, e.flags
                )));
            }
        }
        Ok(())
    }

    fn complete_error(&mut self, out: &mut Vec<Completion>) -> Result<(), Error> {
        let mut err = sys::fi_cq_err_entry::default();
        // SAFETY: err is a valid error entry buffer.
        let ret = unsafe { sys::evb_fi_cq_readerr(self.cq, &mut err, 0) };
        if ret == -(sys::FI_EAGAIN as isize) {
            return Ok(());
        }
        if ret < 0 {
            return Err(fabric_error("fi_cq_readerr", ret));
        }
        let mut reason = strerror(err.err as isize);
        if err.prov_errno != 0 {
            let mut text = [0 as libc::c_char; 256];
            // SAFETY: the provider formats into `text` (or returns its own string).
            let detail = unsafe {
                cstr(sys::evb_fi_cq_strerror(
                    self.cq,
                    err.prov_errno,
                    err.err_data,
                    text.as_mut_ptr(),
                    text.len(),
                ))
            };
            if !detail.is_empty() {
                reason = format!("{reason}: {detail}");
            }
        }
        let is_discard = |op: &Op| matches!(op.kind, OpKind::Discard { .. });
        if self
            .ops
            .get(&(err.op_context as usize))
            .is_some_and(|op| is_discard(op))
        {
            // A discard that found nothing (more) to drop (FI_ENOMSG).
            self.take_op(err.op_context);
            return Ok(());
        }
        match self.take_failed(err.op_context) {
            Some(OpKind::Send { ctx, .. }) if ctx == CONTROL_CTX => {
                tracing::warn!("evb ofi: an endpoint message (join or answer) failed: {reason}");
            }
            Some(OpKind::Send { ctx, .. }) => out.push(Completion::SendFailed { ctx, reason }),
            Some(OpKind::Recv { mut buf }) => {
                let truncated = err.err == sys::FI_ETRUNC as c_int;
                if truncated {
                    reason = format!(
                        "message of {} bytes truncated to the {}-byte receive buffer",
                        err.len + err.olen,
                        buf.capacity()
                    );
                }
                let len = err.len.min(buf.capacity());
                // SAFETY: the provider wrote `len` bytes before failing.
                unsafe { buf.set_len(len) };
                let failed = Completion::ReceiveFailed {
                    buf,
                    tag: err.tag & TAG_MASK,
                    reason,
                };
                let source = self.links.source_of(err.tag);
                let epoch = evb_msgengine::epoch_of(err.tag);
                if truncated && epoch == self.links.current_epoch(source) {
                    // The tag is the message's: it takes its place in the stream.
                    let seq = evb_msgengine::seq_of(err.tag);
                    self.links.finished(source, seq, Some(failed), out);
                } else {
                    // A broken connection: the entry carries no tag of ours.
                    out.push(failed);
                }
            }
            Some(OpKind::Discard { .. }) | Some(OpKind::Dead) => {}
            None => out.push(Completion::Unattributed {
                reason: format!(
                    "{reason} (context {:p}, flags {:#x})",
                    err.op_context, err.flags
                ),
            }),
        }
        Ok(())
    }

    /// Blocks until something may have happened or `timeout` passed. In Busy
    /// mode returns at once. Spurious wake-ups happen; call `progress` after.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), Error> {
        if self.progress_mode == Progress::Busy {
            // The caller polls again: let any other runnable process have
            // the core first (as OpenMPI does when oversubscribed).
            std::thread::yield_now();
            return Ok(());
        }
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as c_int;
        match self.waiter {
            Waiter::Fd(fd) => {
                let mut fids = [unsafe { &mut (*self.cq).fid as *mut sys::fid }];
                // SAFETY: one open CQ fid.
                let ret = unsafe { sys::evb_fi_trywait(self.fabric, fids.as_mut_ptr(), 1) };
                if ret == -(sys::FI_EAGAIN as c_int) {
                    return Ok(()); // completions or internal work pending: don't sleep
                }
                check("fi_trywait", ret as isize)?;
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
                if ret < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    return Err(Error::Wait {
                        library: "libfabric",
                        source: std::io::Error::last_os_error(),
                    });
                }
                Ok(())
            }
            Waiter::None => {
                // The provider cannot sleep for us (shm). While traffic
                // flows (completions came within the last few waits) only
                // yield: a nap per wait cost shm p2p most of its bandwidth
                // (1 MiB messages: 3.4 against 8.9 GB/s busy). Idle, a
                // short nap keeps the core mostly free at the price of up
                // to NAP of added latency.
                if self.idle_waits < YIELDS_BEFORE_NAP {
                    self.idle_waits += 1;
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(timeout.min(NAP));
                }
                Ok(())
            }
        }
    }
}

fn check(what: &'static str, ret: isize) -> Result<(), Error> {
    if ret == 0 {
        Ok(())
    } else {
        Err(fabric_error(what, ret))
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: every fid was opened by setup (null ones are skipped); closing
        // the endpoint first ends all its operations, so their buffers and
        // registrations can go after it.
        unsafe {
            if !self.ep.is_null() {
                sys::evb_fi_close(&mut (*self.ep).fid);
            }
            for (_, op) in std::mem::take(&mut self.ops) {
                self.release(op);
            }
            self.sends = 0;
            if !self.av.is_null() {
                sys::evb_fi_close(&mut (*self.av).fid);
            }
            if !self.cq.is_null() {
                sys::evb_fi_close(&mut (*self.cq).fid);
            }
            if !self.domain.is_null() {
                sys::evb_fi_close(&mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                sys::evb_fi_close(&mut (*self.fabric).fid);
            }
            if !self.info.is_null() {
                sys::fi_freeinfo(self.info);
            }
        }
    }
}
