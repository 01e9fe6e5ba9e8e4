//! `evb-net`: the evb runtime. It drives the sans-IO state machines of
//! `evb-core` over real transports, one process per endpoint (`evb node`),
//! and launches a whole event builder on one machine (`evb run`).
//!
//! - [`transport`]: the transports behind one interface: TCP, shared
//!   memory, and message engines (libfabric, UCX, MPI);
//! - [`node`]: the node process (an event loop around `evb_core::Node`);
//! - [`launch`]: `evb run`, the local launcher, progress and summary;
//! - [`report`]: the per-node reports and the run summary (JSON).

/// `eprintln!` in one `write`: the nodes of `evb run` share the launcher's
/// stderr, and `eprintln!` writes a line in pieces, which interleave
/// between processes ("evb node 1evb node : drain timed out: 3: ...").
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        let line = format!("{}\n", format_args!($($arg)*));
        eprint!("{line}");
    }};
}

pub mod bench;
pub mod buffers;
pub mod cluster;
pub mod launch;
pub mod mepbuf;
pub mod metrics;
pub mod node;
pub mod report;
pub mod transport;
