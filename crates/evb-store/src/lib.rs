//! The event store: every built batch (one MEP) becomes one self-checking
//! object (docs/store.md), written to a local directory or an S3-compatible
//! object store by a background writer, and read back and verified by
//! `evb store read`.
//!
//! Why objects per batch: a batch is the unit the event builder completes,
//! so it is the natural unit of atomicity (an object is there whole or not
//! at all), of parallelism across nodes (each node writes only its own
//! keys, no coordination) and of verification (each object carries its own
//! header, index and CRC-32C checksums, so damage stays local to it).
//!
//! Why a background writer with a bounded queue: the builder unit runs a
//! single-threaded event loop that must not wait for a disk or a network
//! round trip. `write_batch` only copies the batch into a buffer (reused
//! from a small pool) and queues it; a full queue is reported as
//! backpressure, never absorbed by growing memory, so the caller can hold
//! the batch (and its credit) until the store catches up.

pub mod format;
pub mod reader;
pub mod s3;
pub mod target;
pub mod writer;

use std::path::PathBuf;

pub use format::{ObjectError, ObjectHeader, StoredBatch, StoredObject};
pub use reader::{read_store, verify, BadObject, ReadOptions, ReadReport, StoreObjects};
pub use target::{S3Options, S3Target, StoreTarget};
pub use writer::{StoreStats, StoreWriter, WriterOptions};

/// Everything that can go wrong while opening, writing or reading a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store target `{spec}`: {reason}")]
    Target { spec: String, reason: String },
    // Not `#[source]`: the message already includes the cause, and error
    // chains (anyhow's `{:#}`) would print it twice.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}")]
    S3(String),
    #[error("batch of MEP {mep}: {problem}")]
    InvalidBatch {
        mep: u64,
        problem: format::FragmentLayoutError,
    },
    #[error("store queue full ({queued} batches waiting to be written): backpressure")]
    Backpressure { queued: usize },
    #[error("store writer failed: {0}")]
    Failed(String),
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, error: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.into(),
            error,
        }
    }
}
