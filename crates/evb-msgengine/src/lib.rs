//! The message-engine layer of evb's two tag-matching engines (UCX's UCP
//! tags in `evb-ucx`, libfabric's tagged messages in `evb-ofi`): everything
//! they share above the library, so that both behave the same and a fix to
//! one is a fix to the other. No I/O and no C library here: the engines
//! post and complete the operations and call in with what finished, and
//! this crate builds and tests without UCX or libfabric.
//!
//! - [`wire`]: the layout of the 64-bit wire tag (the caller's 32 bits, a
//!   per-sender sequence number, the sender's epoch, the CTRL bit) and the
//!   endpoint's own messages (JOIN, RELINK, ACK);
//! - [`Streams`] and [`Epochs`]: each sender's ordered stream and the epoch
//!   of its current incarnation;
//! - [`Links`]: the rejoin/relink state machine (a restarted sender taken
//!   back, a link re-established), with its retries;
//! - [`Completion`] and [`Error`]: what both engines report, one type each;
//! - [`Progress`], [`PeerId`], [`Body`]: the small vocabulary of their APIs.
//!
//! Why one crate grown from `evb-tagseq` (which held the tags, the streams
//! and the handshake's messages) rather than a new one beside it: the
//! completion, the errors and the state machine that uses the tags are one
//! layer with them, and each engine then depends on one crate for all of
//! it. The runtime (evb-transport's `msg` adapter) keeps its own
//! engine-neutral completion, which also covers its shared-memory engine.
//!
//! **Why a sequence number.** Both libraries match a sender's messages in
//! order, but completions can finish out of order (a large rendezvous
//! message finishes after a small eager one sent behind it), and libfabric
//! 1.17's shm can reorder unexpected messages. So every send carries a
//! per-destination sequence number in the tag and the receiver hands a
//! sender's messages out in that order ([`Streams`]). Senders do not wait
//! for each other: a receive that never completes (matched to a dead
//! peer's message) holds back only that sender's stream, which
//! [`Streams::forget`] releases.
//!
//! **Why an epoch.** A restarted process (a new incarnation of a sender,
//! with a new address) asks each live endpoint to take it back with a
//! JOIN, outside the sequence. The endpoint bumps its epoch for that
//! sender, starts the sender's stream afresh and answers with an ACK
//! carrying the new epoch, the first message of its own stream to the new
//! incarnation. The new incarnation stamps every later message with that
//! epoch; messages of an older one (late completions of the dead
//! incarnation, in whatever order they arrive) are dropped. A RELINK does
//! the same for a link given up between two live processes. [`Links`]
//! holds the details.
//!
//! **Logging** goes through `tracing` (warnings about the handshakes); the
//! `evb` binary installs the subscriber that writes them to stderr.

mod completion;
mod error;
mod links;
mod stream;
pub mod wire;

use std::rc::Rc;

pub use completion::Completion;
pub use error::Error;
pub use links::{
    Accepted, Arrival, ControlMessage, Forget, Links, RelinkAttempt, RelinkDue, Restart,
    RELINK_ATTEMPTS, RELINK_BACKOFF, RELINK_BACKOFF_MAX,
};
pub use stream::{Epochs, Streams, HELD_EVIDENCE};
pub use wire::{
    ack_message, epoch_of, join_message, parse_control, relink_message, seq_of, wire_tag, Control,
    CTRL_BIT, EPOCH_MASK, EPOCH_SHIFT, SEQ_MASK, TAG_BITS, TAG_MASK,
};

/// Index of a peer, in the order of the engine's `add_peer` calls.
pub type PeerId = usize;

/// A send's body: any shared bytes (a `Vec<u8>`, evb's MEP buffers).
pub type Body = Rc<dyn AsRef<[u8]>>;

/// How an engine's `wait` waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// Sleep on the library's file descriptor when it has one: no CPU while
    /// idle. The default: cores are shared by several processes.
    #[default]
    Blocking,
    /// Never sleep: spin on the library, yielding the core to any other
    /// runnable process between polls (lowest latency with a core per
    /// process, and no starvation without one).
    Busy,
}
