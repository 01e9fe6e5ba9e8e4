//! `evb-plan`: from an event builder's requirement (nodes, Gb/s each,
//! events, what may be bought, the racks) to the fabrics worth buying,
//! ranked: switches, cables by kind and length, cost, bisection, shift
//! conflicts under OpenSM-style ftree routing, the slot schedule and its
//! bound, and the rate a steady-state `evb sim` of the design builds.
//!
//! - [`requirement`]: the requirement from TOML and flags, checked;
//! - [`catalog`]: link generations and switch models, example prices;
//! - [`design`]: the candidate fabrics, as `evb-fabric` generator specs;
//! - [`cost`]: cable lengths from the rack layout, the bill, bisection;
//! - [`evaluate`]: routing, conflicts, schedule, estimate, simulation;
//! - [`plan`]: every candidate evaluated, ranked, the best simulated;
//! - [`output`]: the table, the commands, JSON, the Pareto plot;
//! - [`write`]: a chosen design's files for OpenSM, Slurm, mpirun, evb.
//!
//! Depends on `evb-fabric` (topologies, routing, conflicts, schedules,
//! file formats) and `evb-sim` (the simulator), never the other way.

pub mod catalog;
pub mod cost;
pub mod design;
pub mod evaluate;
pub mod output;
pub mod plan;
pub mod requirement;
pub mod write;

pub use plan::{plan, Design, Plan};
pub use requirement::{Flags, Requirement};
