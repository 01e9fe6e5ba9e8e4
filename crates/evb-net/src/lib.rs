//! `evb-net`: the evb runtime. It drives the sans-IO state machines of
//! `evb-core` over real transports, one process per endpoint (`evb node`),
//! and launches a whole event builder on one machine (`evb run`).
//!
//! - [`conn`]: one TCP connection, framing and zero-copy payload receive;
//! - [`node`]: the node process (mio event loop around `evb_core::Node`);
//! - [`launch`]: `evb run`, the local launcher, progress and summary;
//! - [`report`]: the per-node reports and the run summary (JSON).

pub mod conn;
pub mod launch;
pub mod node;
pub mod report;
