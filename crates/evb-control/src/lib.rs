//! `evb-control`: what an `evb node` process and whatever started it
//! exchange, apart from the event builder's own traffic.
//!
//! - [`cluster`]: under a cluster launcher (`mpirun`, `srun`): the rank
//!   from its environment, and the nodes' addresses through a rendezvous
//!   directory;
//! - [`lines`]: under `evb run` and `evb bench`, the typed control lines
//!   on the started processes' stdin and stdout (`LISTEN`, `PEERS`,
//!   `STATS`, `FINAL`, `RESULT`, `STOP`);
//! - [`report`]: what a node reports (its `STATS` and `FINAL` lines, the
//!   `final-<rank>.json` files of cluster runs);
//! - [`worker`]: what an `evb bench` worker reports (its `RESULT` line).
//!
//! Its own crate because both sides use it: the node (`evb-node`) writes
//! reports and publishes its address, the launcher (`evb-launch`) and the
//! metrics endpoint (`evb-metrics`) read the reports, and none of them
//! needs the others' code for that.

pub mod cluster;
pub mod lines;
pub mod report;
pub mod worker;
