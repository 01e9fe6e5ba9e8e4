//! The words every command that reads a fabric shares: what `--order` and
//! `--routing` (and `evb run`'s `--fabric-order`, `--fabric-routing`)
//! accept and default to, in one place so that their help and defaults
//! cannot drift apart. The defaults themselves are evb-fabric's
//! ([`evb_fabric::optimize::DEFAULT_ORDER`], [`DEFAULT_ROUTING`]).
//!
//! [`DEFAULT_ROUTING`]: evb_fabric::optimize::DEFAULT_ROUTING

/// `--order` (and `--fabric-order`).
pub const ORDER_HELP: &str = "Rank order, rank i = host i of the order: ftree (the default: \
the ftree engine's CA order; by name where that engine cannot route the fabric), name (host \
names in natural order, as a batch scheduler numbers them), lid, leaf (hosts by leaf, leaves \
by name), random or random:SEED, or a file (a hostfile, or OpenSM's \
opensm-ftree-ca-order.dump)";

/// `evb fabric conflicts --order`, which can also search for an order.
pub const CONFLICTS_ORDER_HELP: &str = "Rank order, rank i = host i of the order: ftree (the \
default: the ftree engine's CA order; by name where that engine cannot route the fabric), name \
(host names in natural order, as a batch scheduler numbers them), lid, leaf (hosts by leaf, \
leaves by name), random or random:SEED, optimized (searched for the fewest conflicts, see \
--time-limit), or a file (a hostfile, or OpenSM's opensm-ftree-ca-order.dump)";

/// `--routing` (and `--fabric-routing`).
pub const ROUTING_HELP: &str = "Routing engine when no forwarding tables are given: ftree (the \
default), minhop, updn, dfsssp, dmodk, random or random:SEED; ftree, updn and dfsssp fall back \
to minhop where OpenSM does (with a note)";
