//! libfabric (`evb-ofi`: RDM endpoints, tagged messages) as a message
//! engine: a thin adapter from `evb_ofi::Endpoint` to
//! [`super::msg::Endpoint`]. Providers as users write them: `tcp`
//! (tcp;ofi_rxm), `udp` (udp;ofi_rxd), `shm`, `verbs`, or any `fi_info` name.
//!
//! Rejoin: the engine's (see the `evb_ofi` crate docs), as over UCX: a
//! restarted node sends each live peer a join request with its new address;
//! the peer inserts it, bumps its epoch for that rank, starts that rank's
//! stream afresh and answers with the epoch the new incarnation stamps on
//! everything it sends from then on; messages of an older epoch are dropped.

use std::time::Duration;

use anyhow::Result;

use super::msg::EngineFailure;
use super::msg::{Body, Completion, Endpoint, TAG_RANK_MASK};
use super::Progress;
use evb_core::NodeId;

pub struct OfiEndpoint {
    ep: evb_ofi::Endpoint,
    /// This endpoint's rank: the source bits of its messages.
    rank: NodeId,
    /// A restarted endpoint: `add_peer` asks each peer to take it back.
    restarted: bool,
    max_message: usize,
    /// Failed receives so far (reported up to REPORT_LIMIT).
    recv_failures: usize,
}

const REPORT_LIMIT: usize = 8;

/// Rejoin is offered on tcp;ofi_rxm only (provider as users write it):
/// it is what was tested; over libfabric 1.17's shm a restarted node was
/// taken back, but in one of two runs did not build again (not investigated).
pub fn can_rejoin(provider: &str) -> bool {
    evb_ofi::provider_name(provider) == "tcp;ofi_rxm"
}

impl OfiEndpoint {
    pub fn open(
        provider: &str,
        progress: Progress,
        max_message: usize,
        rank: NodeId,
    ) -> Result<OfiEndpoint> {
        let mut opts = evb_ofi::Options::new(provider);
        opts.progress = match progress {
            Progress::Blocking => evb_ofi::Progress::Blocking,
            Progress::Busy => evb_ofi::Progress::Busy,
        };
        opts.max_message = max_message;
        // The sender's rank: each rank's messages (its BYE included) form
        // one ordered stream.
        opts.source_mask = TAG_RANK_MASK;
        Ok(OfiEndpoint {
            ep: evb_ofi::Endpoint::open(&opts)?,
            rank,
            restarted: false,
            max_message,
            recv_failures: 0,
        })
    }
}

impl Endpoint for OfiEndpoint {
    fn name(&self) -> String {
        format!("ofi:{}", self.ep.provider())
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
        let body = body.map(|(data, range)| (data as evb_ofi::Body, range));
        Ok(self.ep.send_bytes(peer, tag, head, body, ctx)?)
    }

    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let mut done = Vec::new();
        self.ep.progress(&mut done)?;
        for c in done {
            match super::msg::engine_completion(c, self.max_message, out) {
                None => {}
                Some(EngineFailure::Receive { buf, reason }) => {
                    // A connection that broke mid-message (the peer died;
                    // the runtime learns it from the failed sends or the
                    // silence) or a message too large: keep the buffer working.
                    if self.recv_failures < REPORT_LIMIT {
                        tracing::warn!("evb ofi: a message could not be received: {reason}");
                    }
                    self.recv_failures += 1;
                    self.ep.post_recv(buf)?;
                }
                Some(EngineFailure::Unattributed { reason }) => {
                    // The provider may have swallowed one of our receives
                    // with it: post a replacement so the pool does not shrink.
                    if self.recv_failures < REPORT_LIMIT {
                        tracing::warn!("evb ofi: the provider reported an error for no operation of ours (a lost peer's message): {reason}");
                    }
                    self.recv_failures += 1;
                    self.ep.post_recv(vec![0; self.max_message])?;
                }
            }
        }
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        Ok(self.ep.wait(timeout)?)
    }

    /// A message from the peer arrived but waits for an earlier one of its
    /// (a large transfer still in progress): the peer is alive.
    fn peer_active_tagged(&self, _peer: usize, tag: u64) -> bool {
        self.ep.source_waiting(tag)
    }

    /// (A link replaced by a new incarnation's leaves the new stream be.)
    fn drop_peer(&mut self, peer: usize, tag: u64) {
        self.ep.forget_peer(peer, tag);
    }

    /// Both processes may live (a stop, a cut link): the higher rank asks
    /// for the link again with a RELINK, the lower answers it.
    fn relink(&mut self, peer: usize, tag: u64) {
        if let Err(e) = self.ep.relink(peer, tag) {
            tracing::warn!("evb ofi: asking peer {peer} for the link again: {e}");
        }
    }

    fn enable_rejoin(&mut self, restarted: bool) -> bool {
        if !can_rejoin(self.ep.provider()) {
            return false;
        }
        self.ep.enable_rejoin(u64::from(self.rank));
        self.restarted = restarted;
        true
    }
}
