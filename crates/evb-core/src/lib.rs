//! `evb-core`: the sans-IO protocol core of the evb event builder.
//!
//! The Event Manager ([`em`]), Readout Unit ([`ru`]) and Builder Unit
//! ([`bu`]) are deterministic state machines: they take inputs (a message
//! arrived, a send completed, a timer fired, a MEP's data is ready), always
//! with the current time passed in, and emit actions (send this, produce
//! that, deliver this batch). They never touch a socket, a thread, a clock or
//! a global random generator. [`node::Node`] composes the units an endpoint
//! hosts. The real runtime (`evb-node`) drives nodes over transports; the
//! simulator drives the very same nodes over a simulated fabric; the
//! [`harness`] drives them over an in-memory network for tests.
//!
//! Also here: the wire format ([`wire`]), the configuration file shared by
//! every driver ([`config`]), the source model that fills fragments with
//! verifiable data ([`source`]), the slotted barrel's schedule ([`slots`]),
//! the measurement of each node's offset to the EM's clock ([`clock`]), the
//! pacing of the EM's bursts into its node's slots ([`pacer`]), the EM's
//! control of the slot length ([`adapt`]) and
//! the liveness timers: heartbeats, silent peers, the drain and the linger
//! ([`liveness`]), which every driver runs through the same [`node::Node`].
//! A node broken on purpose (crashed, hung, resumed, restarted) is one
//! [`fault::NodeFault`] in the harness, the launcher and the simulator.

pub mod adapt;
pub mod bu;
pub mod checksum;
pub mod clock;
pub mod config;
pub mod em;
pub mod fault;
pub mod fu;
pub mod harness;
pub mod layout;
pub mod liveness;
pub mod node;
pub mod pacer;
pub mod ru;
pub mod slots;
pub mod source;
pub mod wire;

pub use bu::{Admit, Nanos, Outcome};
pub use config::{Config, ConfigError};
pub use layout::Layout;
pub use node::{Action, Node, NodeStats};
pub use wire::{FragmentHeader, MepId, Message, NodeId};
