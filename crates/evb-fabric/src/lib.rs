//! `evb-fabric`: what an event builder's barrel-shift traffic does to a
//! fat-tree InfiniBand fabric.
//!
//! - [`topo`]: topology model, fat-tree generators, what-if edits;
//! - [`names`]: unique node names, GUID-to-name maps;
//! - [`rate`]: link width and speed, degraded links;
//! - [`io`]: `ibnetdiscover`, LFT dumps (both forms), hostfiles, OpenSM's
//!   ftree CA order, ibsim net files, Slurm `topology.conf`;
//! - [`ftree`], [`osm`] and [`routing`]: routing engines (`ftree`
//!   matching OpenSM's for host destinations; OpenSM's `minhop`, `updn`
//!   and `dfsssp`; OpenSM's fallback to minhop; `dmodk`, seeded `random`,
//!   and per-destination routes chosen for a shift);
//! - [`conflicts`]: traces every flow of every shift step through the LFTs
//!   and counts conflicts (see [`conflicts`] for the definition);
//! - [`optimize`]: rank orders and routes that remove conflicts;
//! - [`schedule`]: slot schedules for the slotted barrel, conflicts moved
//!   to extra slots, packed and [`tighten`]ed towards their lower bound;
//! - [`counters`]: port counter snapshots (read with `perfquery`, or from
//!   `perfquery` and ibdiagnet2 files), their widths and changes;
//! - [`diagnose`]: counters read onto links, the shift's shared links and
//!   the cabling; findings and remedies;
//! - [`plot`]: SVG/PNG plots of per-step link load;
//! - [`setup`]: what every `evb fabric` command does first: read, name,
//!   edit and route a fabric, parse the steps, resolve a rank order.
//!
//! The crate depends on no other evb crate.

pub mod conflicts;
pub mod counters;
pub mod diagnose;
pub mod error;
pub mod ftree;
pub mod io;
pub mod lft;
pub mod names;
pub mod optimize;
pub mod osm;
pub mod plot;
pub mod rate;
pub mod rated;
pub mod routing;
pub mod schedule;
pub mod setup;
pub mod tighten;
pub mod topo;

pub use error::{FabricError, Result};
pub use lft::Lfts;
pub use topo::Topology;
