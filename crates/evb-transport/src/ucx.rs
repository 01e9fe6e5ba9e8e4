//! UCX (UCP tag matching, `evb-ucx`) as a message engine: a thin adapter
//! from `evb_ucx::Endpoint` to [`super::msg::Endpoint`].
//!
//! Rejoin: the engine's (see the `evb_ucx` module docs). A restarted node
//! reaches each live peer with a join request carrying its new worker
//! address; the peer opens an endpoint to it, bumps its epoch for that
//! rank, starts that rank's stream afresh and answers with the epoch the
//! new incarnation stamps on everything it sends from then on; messages of
//! the dead incarnation (an older epoch) are dropped.

use std::time::Duration;

use anyhow::Result;

use super::msg::EngineFailure;
use super::msg::{Body, Completion, Endpoint, TAG_RANK_MASK};
use super::Progress;
use evb_core::config::TransportSection;
use evb_core::NodeId;

pub struct UcxEndpoint {
    ep: evb_ucx::Endpoint,
    /// This endpoint's rank: the source bits of its messages.
    rank: NodeId,
    /// A restarted endpoint: `add_peer` asks each peer to take it back.
    restarted: bool,
    tls: String,
    /// Length every posted buffer has (the largest message accepted).
    max_message: usize,
}

/// UCX 1.13's shared-memory transports cannot report a dead peer: asking
/// for it with them fails, so it is asked only when a network transport
/// may be used.
fn shared_memory_only(tls: &str) -> bool {
    tls.split(',').all(|t| {
        matches!(
            t.trim(),
            "posix" | "sysv" | "cma" | "self" | "sm" | "shm" | "knem" | "xpmem"
        )
    })
}

/// UCX's tcp send segment for evb (UCX_TCP_TX_SEG_SIZE, unless that is
/// set). Given to `ucp_config_modify` by its name within the tcp
/// transport's table, `TX_SEG_SIZE` (the full name is accepted but not
/// applied by UCX 1.13); no other transport has a setting of that name.
const TCP_TX_SEG_SIZE: &str = "32K";

/// UCX's tcp receive segment for evb (UCX_TCP_RX_SEG_SIZE, unless that is
/// set; `RX_SEG_SIZE` as above). Twice UCX's 64K: half the receive system
/// calls for a large message, and the receiver is half of a 1 MiB stream's
/// cost (`evb run -n 4 -t ucx:tcp`: 28.5-30.2 -> 30.5-31.8 Gb/s; 256K:
/// 29.6-31.0; docs/transports.md).
const TCP_RX_SEG_SIZE: &str = "128K";

/// `evb_ucx::Options::split_body_from` from `transport.ucx_split_body_from`:
/// bodies this large go as their own contiguous message (zero-copy
/// rendezvous) instead of one iov message; 0: never (the default: without
/// rendezvous, `eager_only`, every body is copied anyway).
fn split_body_from(configured: u64) -> usize {
    match configured {
        0 => usize::MAX,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    }
}

impl UcxEndpoint {
    pub fn open(
        tls: Option<&str>,
        transport: &TransportSection,
        max_message: usize,
        rank: NodeId,
    ) -> Result<UcxEndpoint> {
        let shm_only = tls.is_some_and(shared_memory_only);
        let mut ucx_config = Vec::new();
        let eager_only = shm_only && std::env::var_os("UCX_RNDV_THRESH").is_none();
        if eager_only {
            // Eager only (bcopy through the shared-memory FIFO): a rendezvous
            // (cma get, then an acknowledgement) needs both processes in
            // their event loops, and on a loaded machine two busy peers then
            // went silent for longer than the peer timeout; a dead peer's
            // rendezvous also never completes without error handling.
            ucx_config.push(("RNDV_THRESH".to_string(), "inf".to_string()));
        }
        if !shm_only {
            // UCX 1.13 sends an iov message (evb's header + fragment) over
            // tcp as a copy, in segments of 8 KiB by default: one send
            // system call and its TCP overhead per 8 KiB. 32 KiB segments:
            // 1 MiB messages 1.8 -> 4.3 GB/s, `evb run -n 4` 22-24 -> 29
            // Gb/s (64 KiB: 4.1 GB/s but 20 Gb/s; docs/transports.md).
            // The receive side: see TCP_RX_SEG_SIZE.
            for (name, value) in [
                ("TX_SEG_SIZE", TCP_TX_SEG_SIZE),
                ("RX_SEG_SIZE", TCP_RX_SEG_SIZE),
            ] {
                // The user's UCX_TCP_<name> wins.
                if std::env::var_os(format!("UCX_TCP_{name}")).is_none() {
                    ucx_config.push((name.to_string(), value.to_string()));
                }
            }
        }
        let opts = evb_ucx::Options {
            split_body_from: split_body_from(transport.ucx_split_body_from),
            spin_before_sleep: Duration::from_micros(transport.ucx_spin_us),
            ucx_config,
            tls: tls.map(str::to_string),
            progress: match transport.progress {
                Progress::Blocking => evb_ucx::Progress::Blocking,
                Progress::Busy => evb_ucx::Progress::Busy,
            },
            peer_failure_detection: !shm_only,
            // The sender's rank: each rank's messages (its BYE included)
            // form one ordered stream.
            source_mask: TAG_RANK_MASK,
            ..evb_ucx::Options::default()
        };
        Ok(UcxEndpoint {
            ep: evb_ucx::Endpoint::open(&opts)?,
            rank,
            restarted: false,
            tls: tls.unwrap_or("default").to_string(),
            max_message,
        })
    }
}

impl Endpoint for UcxEndpoint {
    fn name(&self) -> String {
        format!("ucx:{}", self.tls)
    }

    fn local_address(&self) -> Vec<u8> {
        self.ep.local_address()
    }

    fn add_peer(&mut self, address: &[u8]) -> Result<usize> {
        // A restarted endpoint's own address is no peer to ask.
        if self.restarted && address != self.ep.local_address() {
            return Ok(self.ep.add_peer_rejoining(address)?);
        }
        Ok(self.ep.add_peer(address)?)
    }

    fn post_recv(&mut self, buf: Vec<u8>) -> Result<()> {
        Ok(self.ep.post_recv(buf)?)
    }

    fn send(&mut self, peer: usize, tag: u64, head: Vec<u8>, body: Body, ctx: u64) -> Result<bool> {
        let body = body.map(|(data, range)| (data as evb_ucx::Body, range));
        Ok(self.ep.send_bytes(peer, tag, head, body, ctx)?)
    }

    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let mut done = Vec::new();
        self.ep.progress(&mut done)?;
        for c in done {
            match super::msg::engine_completion(c, self.max_message, out) {
                None => {}
                Some(EngineFailure::Receive { buf, reason }) => {
                    // A message too large for any buffer: a peer not
                    // speaking our protocol. Keep the buffer working.
                    tracing::warn!("evb ucx: a message could not be received: {reason}");
                    self.ep.post_recv(buf)?;
                }
                // evb-ofi's kind; evb-ucx ties every failure to an operation.
                Some(EngineFailure::Unattributed { reason }) => tracing::warn!("evb ucx: {reason}"),
            }
        }
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        Ok(self.ep.wait(timeout)?)
    }

    /// A message from the peer arrived but waits for an earlier one of its
    /// (a rendezvous still in transfer): the peer is alive.
    fn peer_active_tagged(&self, _peer: usize, tag: u64) -> bool {
        self.ep.source_waiting(tag)
    }

    /// Without UCX error handling (shared-memory UCX_TLS) a receive matched
    /// to the dead peer's rendezvous never completes: release what waits
    /// behind it.
    /// (A link replaced by a new incarnation's leaves the new stream be.)
    fn drop_peer(&mut self, peer: usize, tag: u64) {
        self.ep.forget_peer(peer, tag);
    }

    /// Both processes may live (a stop, a cut link): the higher rank asks
    /// for the link again with a RELINK, the lower answers it.
    fn relink(&mut self, peer: usize, tag: u64) {
        if let Err(e) = self.ep.relink(peer, tag) {
            tracing::warn!("evb ucx: asking peer {peer} for the link again: {e}");
        }
    }

    fn enable_rejoin(&mut self, restarted: bool) -> bool {
        self.ep.enable_rejoin(u64::from(self.rank));
        self.restarted = restarted;
        true
    }
}
