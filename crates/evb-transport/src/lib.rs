//! `evb-transport`: the transports a node runs over, behind one interface,
//! and the buffers they move.
//!
//! What is here: the [`Transport`] interface and its implementations
//! ([`tcp`] with [`tcp_conn`], the message engines of [`msg`]: [`shm`],
//! `ofi`, `ucx`, `mpi`), the run key that authenticates links ([`auth`]),
//! the output network towards the consumers ([`outnet`]), the MEP buffers
//! and slot stores fragments are sent from ([`mepbuf`]), the buffer plan
//! of a node ([`buffers`]) and the allocator that puts large buffers on
//! huge pages ([`hugepages`]).
//!
//! Why a crate of its own: the node (`evb-node`), the launcher
//! (`evb-launch`, which plans memory and keys) and the benchmarks
//! (`evb-bench`, which measure this very layer) all use it, and the
//! message engines that are libraries sit behind cargo features (`ofi`,
//! `ucx`, `mpi`, all on by default; see [`open_engine`]) so that a build
//! can leave out a library it does not have.
//!
//! The runtime (the `evb-node` crate) speaks in messages to endpoints: control
//! messages and fragments (a header plus a payload shared with the RU's MEP
//! buffer). A [`Transport`] moves them and hands what arrives to an
//! [`RxHandler`]. Two families:
//!
//! - byte streams ([`tcp`]): one connection per pair, framing on the wire,
//!   payloads read straight into the buffer the batch keeps;
//! - message engines ([`msg`]): libraries that deliver whole messages
//!   (shared memory, libfabric, UCX, MPI) behind the small [`msg::Endpoint`]
//!   interface; one adapter turns any of them into a [`Transport`].
//!
//! Liveness is the protocol core's ([`evb_core::liveness`]), the same for
//! all: every received message counts as a sign of life
//! ([`RxHandler::on_alive`]), the node's heartbeats fill the silences, and a
//! peer silent for `transport.peer_timeout_ms` is dropped. A transport tells
//! what only it can see: a peer's bytes waiting unread
//! ([`Transport::peer_active`]), a peer process on this host starved of
//! CPU ([`Transport::peer_runnable`]; every Hello names its sender's
//! process for that, see [`process`]).
//!
//! Rejoin is the transport's to offer ([`Transport::enable_rejoin`]): TCP
//! re-establishes connections with a lost peer (restarted, or reachable
//! again) and reports [`LinkEvent::Joined`]; shared memory takes in a
//! restarted peer's new inbox, and re-establishes a link dropped between
//! two live processes ([`shm`]); UCX a restarted peer's new worker
//! address, with an epoch that keeps the two incarnations apart ([`ucx`]);
//! libfabric the same way over tcp;ofi_rxm ([`ofi`]). MPI and libfabric's
//! other providers do not: a peer they lost stays lost for the rest of the run.

pub mod auth;
pub mod buffers;
pub mod hugepages;
pub mod mepbuf;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod msg;
#[cfg(feature = "ofi")]
pub mod ofi;
pub mod outnet;
pub mod process;
pub mod shm;
pub mod tcp;
pub mod tcp_conn;
#[cfg(feature = "ucx")]
pub mod ucx;

use std::rc::Rc;
use std::time::Duration;

use anyhow::{bail, Result};
use evb_core::config::{Config, Verify};
use evb_core::wire::{FragmentHeader, Message, FLAG_BATCH};
use evb_core::{Layout, MepId, NodeId};

use crate::mepbuf::MepBuf;

/// What a transport hands to the node that owns it.
pub trait RxHandler {
    /// Something arrived from `peer` (any message, heartbeats included).
    fn on_alive(&mut self, peer: NodeId);
    fn on_control(&mut self, peer: NodeId, msg: Message);
    /// A fragment header arrived: keep its payload (true) or drop it.
    fn admit(&mut self, peer: NodeId, header: &FragmentHeader) -> bool;
    /// Whether the payload of an admitted fragment needs its CRC-32C (the
    /// transport computes it while the bytes arrive, if it can).
    fn wants_crc(&mut self, _header: &FragmentHeader) -> bool {
        true
    }
    /// A buffer to receive into, at least `min_len` bytes long (pooled).
    fn spare_buffer(&mut self, min_len: usize) -> Vec<u8>;
    /// A kept payload is complete in `buf[offset..offset + payload_len]`;
    /// `crc` is its CRC-32C when the transport computed it.
    fn on_fragment(
        &mut self,
        peer: NodeId,
        header: FragmentHeader,
        crc: Option<u32>,
        buf: Vec<u8>,
        offset: usize,
    );
    /// A kept payload that was not copied: `view` reads it in place in the
    /// sender's memory (shm zero copy) until it is dropped. By default it
    /// is copied into a spare buffer and handed over as any other.
    fn on_shared_fragment(&mut self, peer: NodeId, header: FragmentHeader, view: shm::SharedView) {
        let mut buf = self.spare_buffer(view.len());
        buf[..view.len()].copy_from_slice(&view);
        drop(view);
        self.on_fragment(peer, header, None, buf, 0);
    }
}

/// Which fragments' CRC-32C is wanted on receipt: the ones the BUs check
/// (`event_builder.verify`), and every delivered batch (the consumers
/// always check theirs). A transport that copies a payload computes the
/// CRC while the bytes are in its hands only for those.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrcPolicy {
    verify: Verify,
    sample: u32,
}

impl CrcPolicy {
    pub fn from_config(config: &Config) -> CrcPolicy {
        CrcPolicy {
            verify: config.event_builder.verify,
            sample: config.event_builder.verify_sample,
        }
    }

    /// Every payload's CRC.
    pub fn all() -> CrcPolicy {
        CrcPolicy {
            verify: Verify::Crc,
            sample: 1,
        }
    }

    pub fn wanted(&self, h: &FragmentHeader) -> bool {
        h.flags & FLAG_BATCH != 0
            || evb_core::config::crc_checked(self.verify, self.sample, h.source, h.mep)
    }
}

/// What happened to sends and links during a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A fragment of this MEP has left (or can never leave): the RU may
    /// count the transfer done.
    SendDone(MepId),
    /// The link to `peer` ended: an error, or the peer's orderly finish
    /// (`error: None`).
    Closed { peer: NodeId, error: Option<String> },
    /// `peer` said it has finished (an explicit goodbye, as the message
    /// engines send): orderly, whatever this node has heard of the end of
    /// the run (the EM's EndOfRun may still be queued behind other peers).
    Finished { peer: NodeId },
    /// A new connection with `peer` is set up during the run (it restarted,
    /// or its link came back). Reported before anything it carries is
    /// handed over; a connection it replaces was reported `Closed` first.
    Joined { peer: NodeId },
}

/// One node's view of the network.
pub trait Transport {
    /// Short name for messages (`tcp`, `shm`, `ofi:tcp;ofi_rxm`, ...).
    fn name(&self) -> String;
    /// How other nodes reach this one: one token without spaces, printed
    /// after `LISTEN` for `evb run` (a port for TCP, hex bytes otherwise).
    fn local_token(&self) -> String;
    /// Opens the links to `peers` (every endpoint's token, by rank) and
    /// returns when every linked peer is set up (the start barrier).
    /// Messages arriving meanwhile are handed to `handler`.
    fn connect(&mut self, peers: &[String], handler: &mut dyn RxHandler) -> Result<()>;
    /// Queues a control message; false when there is no link to `to`.
    fn send_control(&mut self, to: NodeId, msg: &Message) -> bool;
    /// Queues a fragment whose payload is `data[..header.payload_len]`;
    /// false when there is no link to `to` (nothing was queued).
    fn send_fragment(&mut self, to: NodeId, header: &FragmentHeader, data: Rc<MepBuf>) -> bool;
    /// Sends not yet handed to the network, to one peer or to any.
    fn has_pending_tx(&self, to: Option<NodeId>) -> bool;
    /// Moves queued sends along and waits up to `timeout` for input,
    /// which it hands to `handler`.
    fn poll(
        &mut self,
        timeout: Duration,
        handler: &mut dyn RxHandler,
        events: &mut Vec<LinkEvent>,
    ) -> Result<()>;
    /// Moves queued sends along without waiting.
    fn flush(&mut self, events: &mut Vec<LinkEvent>);
    /// Gives up the link to a peer the runtime declared lost; its queued
    /// fragments come back as `SendDone`.
    fn drop_peer(&mut self, peer: NodeId, events: &mut Vec<LinkEvent>);
    /// `peer` is evidently alive even if this node has not heard from it:
    /// its bytes wait unread (a slow receiver is not a dead sender), or it
    /// is taking what we send (a busy receiver is not a dead one).
    fn peer_active(&self, peer: NodeId) -> bool;
    /// `peer`'s process is on this host and waiting for a CPU (runnable):
    /// its silence is starvation on a loaded machine, not a hang (a stopped
    /// or dead process is not runnable). False when the transport cannot
    /// tell (the default: a remote peer).
    fn peer_runnable(&self, _peer: NodeId) -> bool {
        false
    }
    /// This node has nothing more to send: tell every peer.
    fn finish(&mut self);
    /// Every linked peer has finished too (or is gone).
    fn all_finished(&self) -> bool;
    /// Before [`Transport::connect`]: keep accepting and re-dialing peers
    /// during the run so lost ones can rejoin; `restarted`: this process
    /// joins a run already going (no start barrier; it connects to the live
    /// peers). False when the transport cannot (the default).
    fn enable_rejoin(&mut self, _restarted: bool) -> bool {
        false
    }
    /// There is a link to `peer` now (after a restarted node's connect,
    /// the peers without one are lost).
    fn has_link(&self, _peer: NodeId) -> bool {
        true
    }
    /// With an output network ([`outnet`]): this endpoint's address on it
    /// and the links that run over it. `None` without one.
    fn output_network(&self) -> Option<outnet::OutputNetworkReport> {
        None
    }
}

/// The transport a config asks for (`transport.kind`), parsed by the
/// configuration.
pub use evb_core::config::TransportKind;

/// The transport `evb run` uses for `transport.kind = "auto"`: its nodes
/// all run on this machine, where shared memory beats TCP (docs/transports.md);
/// TCP with an output network (only TCP has one, [`outnet`]).
pub fn resolve_auto(config: &Config) -> TransportKind {
    match &config.transport.kind {
        TransportKind::Auto if config.output_network() => TransportKind::Tcp,
        TransportKind::Auto => TransportKind::Shm,
        kind => kind.clone(),
    }
}

/// Whether `evb run --restart` can restart a node over the transport
/// `kind`: one whose [`Transport::enable_rejoin`] takes a restarted node
/// back (tcp, shm, ucx, ofi:tcp; not mpi, nor libfabric's other providers).
pub fn can_rejoin(kind: &TransportKind) -> bool {
    match kind.on_node() {
        TransportKind::Tcp | TransportKind::Shm | TransportKind::Ucx(_) => true,
        #[cfg(feature = "ofi")]
        TransportKind::Ofi(_) => ofi::can_rejoin(kind.ofi_provider().unwrap_or("tcp")),
        _ => false,
    }
}

/// Opens this node's end of a message engine that is a library (libfabric,
/// UCX, MPI), each behind the cargo feature of its name (`ofi`, `ucx`,
/// `mpi`; all on by default). An evb built without one says so here.
pub fn open_engine(
    kind: &TransportKind,
    config: &Config,
    layout: &Layout,
    rank: NodeId,
) -> Result<Box<dyn Transport>> {
    #[cfg(any(feature = "ofi", feature = "ucx", feature = "mpi"))]
    let progress = config.transport.progress;
    #[cfg(not(any(feature = "ofi", feature = "ucx", feature = "mpi")))]
    let _ = (layout, rank);
    match kind {
        #[cfg(feature = "ofi")]
        TransportKind::Ofi(_) => {
            let provider = kind.ofi_provider().unwrap_or("tcp");
            let ep = ofi::OfiEndpoint::open(provider, progress, max_message_bytes(config), rank)?;
            Ok(Box::new(msg::MsgTransport::new(ep, config, layout, rank)?))
        }
        #[cfg(feature = "ucx")]
        TransportKind::Ucx(tls) => {
            let ep = ucx::UcxEndpoint::open(
                tls.as_deref(),
                &config.transport,
                max_message_bytes(config),
                rank,
            )?;
            Ok(Box::new(msg::MsgTransport::new(ep, config, layout, rank)?))
        }
        #[cfg(feature = "mpi")]
        TransportKind::Mpi => {
            let ep = mpi::MpiEndpoint::open(rank, layout.endpoints, progress)?;
            Ok(Box::new(msg::MsgTransport::new(ep, config, layout, rank)?))
        }
        TransportKind::Auto | TransportKind::Tcp | TransportKind::Shm => {
            bail!(
                "`{}` is not a message engine library",
                config.transport.kind
            )
        }
        #[allow(unreachable_patterns)]
        other => {
            let feature = match other {
                TransportKind::Ofi(_) => "ofi",
                TransportKind::Ucx(_) => "ucx",
                _ => "mpi",
            };
            bail!(
                "transport `{}`: this evb was built without it (cargo feature `{feature}`, on by default)",
                config.transport.kind
            )
        }
    }
}

/// Whether this node spins on its transport or sleeps on it (`transport.progress`).
pub use evb_core::config::Progress;

/// Which endpoints `rank` has a link to: every other one, and itself only
/// for a folded node that sends its own fragments through the NIC.
pub fn linked_peers(config: &Config, layout: &Layout, rank: NodeId) -> Vec<NodeId> {
    (0..layout.endpoints)
        .filter(|&p| {
            if p != rank {
                return true;
            }
            let i = rank as usize;
            config.event_builder.local == evb_core::config::LocalTraffic::Nic
                && layout.ru_of[i].is_some()
                && layout.bu_of[i].is_some()
        })
        .collect()
}

/// The largest frame body a node accepts: `event_builder.max_message_bytes`,
/// or a whole batch when there are consumers.
pub fn max_body_bytes(config: &Config) -> u64 {
    let eb = config.event_builder.max_message_bytes;
    if config.output.consumers > 0 {
        eb.max(config.max_batch_payload() + evb_core::wire::FRAGMENT_HEADER_LEN as u64)
    } else {
        eb
    }
}

/// The largest message a node can receive: a fragment of the biggest MEP
/// the sources can produce, with its headers.
pub fn max_message_bytes(config: &Config) -> usize {
    let frame = evb_core::wire::FRAME_HEADER_LEN + evb_core::wire::FRAGMENT_HEADER_LEN;
    let fragment = config.max_fragment_payload() as usize + frame;
    let largest = fragment
        .max(4096)
        .min(config.event_builder.max_message_bytes as usize + frame);
    // Consumers receive whole batches (bounded by validation to 4 GiB).
    if config.output.consumers > 0 {
        largest.max(config.max_batch_payload() as usize + frame)
    } else {
        largest
    }
}

/// What the transports' unit tests hand received traffic to: it records
/// which peers were heard from and takes no fragment.
#[cfg(test)]
pub(crate) mod test_rx {
    use super::{FragmentHeader, Message, NodeId, RxHandler};

    #[derive(Default)]
    pub struct Seen {
        pub alive: Vec<NodeId>,
    }

    impl RxHandler for Seen {
        fn on_alive(&mut self, peer: NodeId) {
            self.alive.push(peer);
        }
        fn on_control(&mut self, _peer: NodeId, _msg: Message) {}
        fn admit(&mut self, _peer: NodeId, _header: &FragmentHeader) -> bool {
            false
        }
        fn spare_buffer(&mut self, min_len: usize) -> Vec<u8> {
            vec![0; min_len]
        }
        fn on_fragment(
            &mut self,
            _: NodeId,
            _: FragmentHeader,
            _: Option<u32>,
            _: Vec<u8>,
            _: usize,
        ) {
        }
    }
}
