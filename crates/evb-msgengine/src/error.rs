//! One error type for evb-ucx and evb-ofi. Variants say what went wrong in
//! the caller's terms (a bad address, a buffer too small, a library call
//! that failed); the message names what was asked for, so an operator can
//! act on it without the source.

use crate::PeerId;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What was asked for does not exist on this machine (a UCX transport,
    /// a libfabric provider or domain); the message lists what does.
    #[error("{0}")]
    Unavailable(String),
    /// A call into the library failed.
    #[error("{library} {call} failed: {reason}")]
    Call {
        /// "UCX" or "libfabric".
        library: &'static str,
        call: &'static str,
        /// The library's status code (negative).
        status: i32,
        reason: String,
    },
    /// Options or a use of the endpoint it refuses.
    #[error("{0}")]
    Config(String),
    #[error("peer address: {0}")]
    BadAddress(String),
    #[error("unknown peer {0}")]
    UnknownPeer(PeerId),
    #[error("tag {0:#x} does not fit the 32 bits left to the caller")]
    BadTag(u64),
    #[error("receive buffer has no capacity")]
    EmptyReceiveBuffer,
    #[error(
        "a {capacity}-byte buffer is smaller than the endpoint's max_message ({max_message} bytes)"
    )]
    SmallReceiveBuffer { capacity: usize, max_message: usize },
    #[error("a {len}-byte message exceeds the endpoint's max_message ({max_message} bytes)")]
    MessageTooLong { len: usize, max_message: usize },
    #[error("send range {start}..{end} is outside the body of {len} bytes")]
    BadRange {
        start: usize,
        end: usize,
        len: usize,
    },
    /// Sleeping on the library's file descriptor failed.
    #[error("poll on the {library} event fd: {source}")]
    Wait {
        library: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The library did something the endpoint cannot follow (completed an
    /// operation it never posted, ran out of memory).
    #[error("{0}")]
    Internal(String),
}
