//! `libevb`: evb inside someone else's program, for C and C++ (this
//! crate's C interface, `evb.h`) and Python (`evb-py`, on the same core).
//!
//! Two things a DAQ needs from an event builder it does not write itself:
//!
//! - **a consumer**: a Filter Unit endpoint in the program's own process,
//!   that joins a running event builder (`evb run --external-consumers`,
//!   or a cluster job) and receives built batches under the same protocol,
//!   credits and liveness as evb's own Filter Units. The runtime is
//!   evb-node's ([`evb_node::consumer`]), the state machine evb-core's
//!   Filter Unit in hold mode: a batch is the program's until it gives it
//!   back, which returns its credit. Lost BUs and the end of the run are
//!   told as they happen.
//! - **a store reader**: the event store (a directory or S3) batch by
//!   batch, each object verified before it is handed out ([`store`]).
//!
//! Batches and objects are read by fragment and by event with every
//! length checked ([`batch`]). The C interface ([`capi`]) returns status
//! codes with a message per thread (`evb_last_error`), checks every
//! pointer and index it is given, and never lets a panic cross into C
//! (each call runs under `catch_unwind`). Threads: a consumer is used
//! from the thread that opened it; its batches may be read, and given
//! back, from any thread; stores and their objects are independent
//! values, each used by one thread at a time.

pub mod batch;
pub mod capi;
pub mod store;

pub use evb_node::consumer::{Consumer, ConsumerOptions, HeldBatch, Next, ReturnBox};
pub use evb_store::StoredObject;

/// `EVB_LOG=warn` (a tracing filter) sends evb's own log lines to stderr;
/// without it the library prints nothing. Once per process.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("EVB_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_env("EVB_LOG"))
                .with_writer(std::io::stderr)
                .try_init();
        }
    });
}

/// The library's version and the commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
