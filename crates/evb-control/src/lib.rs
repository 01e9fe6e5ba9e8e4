//! `evb-control`: what an `evb node` process and whatever started it
//! exchange, apart from the event builder's own traffic.
//!
//! - [`cluster`]: under a cluster launcher (`mpirun`, `srun`): the rank
//!   from its environment, and the nodes' addresses through a rendezvous
//!   directory;
//! - [`report`]: what a node reports (its `STATS` and `FINAL` lines, the
//!   `final-<rank>.json` files of cluster runs).
//!
//! Its own crate because both sides use it: the node (`evb-node`) writes
//! reports and publishes its address, the launcher (`evb-launch`) and the
//! metrics endpoint (`evb-metrics`) read the reports, and none of them
//! needs the others' code for that.

pub mod cluster;
pub mod report;
