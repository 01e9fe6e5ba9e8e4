//! Node faults: what happens to a node, and when, in every driver that
//! injects one.
//!
//! One type for the three places that break a node on purpose: the test
//! harness ([`crate::harness::Faults`]), `evb run --kill/--stop/--resume/
//! --restart RANK@SECONDS` (the launcher picks the signal from the
//! [`FaultKind`]) and the simulator's `sim.crash = "NODE@MICROSECONDS"`.
//! They share one spelling, `NODE@TIME`, read by one parser
//! ([`NodeFault::parse`]); only the unit of the time differs, and the
//! caller says which ([`TimeUnit`]).
//!
//! Fragment faults (a corrupt fragment, a silent source) are another
//! matter, kept with the harness and in the `[faults]` section.

use std::fmt;

use thiserror::Error;

use crate::bu::Nanos;
use crate::wire::NodeId;

/// What happens to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// The node dies and its connections close, so its peers' transports
    /// report the loss (`kill -9`).
    Crash,
    /// The node stops: it takes nothing in and sends nothing, but its
    /// connections stay open, so its peers find it only by its silence
    /// (SIGSTOP, a hung process; the simulator's `sim.crash`).
    Hang,
    /// A node hung earlier goes on, its timers first (SIGCONT): a hang
    /// then a resume is a stall, a process descheduled and run again.
    Resume,
    /// A node crashed earlier starts again, fresh, and rejoins the run.
    Restart,
}

/// The unit of the time in a `NODE@TIME` spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// `evb run --kill RANK@SECONDS` and its siblings.
    Seconds,
    /// `sim.crash = "NODE@MICROSECONDS"`.
    Microseconds,
}

impl TimeUnit {
    fn nanos(self) -> f64 {
        match self {
            TimeUnit::Seconds => 1e9,
            TimeUnit::Microseconds => 1e3,
        }
    }

    /// The unit as the spelling names it: `SECONDS`, `MICROSECONDS`.
    pub fn name(self) -> &'static str {
        match self {
            TimeUnit::Seconds => "SECONDS",
            TimeUnit::Microseconds => "MICROSECONDS",
        }
    }

    fn example(self) -> &'static str {
        match self {
            TimeUnit::Seconds => "2@3.5",
            TimeUnit::Microseconds => "2@300",
        }
    }
}

/// A fault of node `node` at time `at` (ns from the start of the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeFault {
    pub node: NodeId,
    pub at: Nanos,
    pub kind: FaultKind,
}

/// A `NODE@TIME` spelling that could not be read, and which part is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("`{spec}`: {problem}; expected NODE@{unit}, for example {example}", unit = .unit.name(), example = .unit.example())]
pub struct FaultSpecError {
    pub spec: String,
    pub unit: TimeUnit,
    pub problem: SpecProblem,
}

/// The part of a `NODE@TIME` spelling that is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecProblem {
    /// No `@` between the node and the time.
    NoAt,
    /// The node is not a node number.
    Node(String),
    /// The time is not a number of the unit.
    Time(String),
    /// The time is a number, but negative, not finite or too far.
    TimeOutOfRange(String),
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecProblem::NoAt => write!(f, "no `@` between the node and the time"),
            SpecProblem::Node(n) => write!(f, "the node `{n}` is not a node number (0 to 65535)"),
            SpecProblem::Time(t) => write!(f, "the time `{t}` is not a number"),
            SpecProblem::TimeOutOfRange(t) => write!(
                f,
                "the time `{t}` is not a time into the run (negative, infinite or too far)"
            ),
        }
    }
}

impl NodeFault {
    pub fn new(node: NodeId, at: Nanos, kind: FaultKind) -> NodeFault {
        NodeFault { node, at, kind }
    }

    /// `node` dies at `at` ([`FaultKind::Crash`]).
    pub fn crash(node: NodeId, at: Nanos) -> NodeFault {
        NodeFault::new(node, at, FaultKind::Crash)
    }

    /// `node`, crashed earlier, starts again at `at` ([`FaultKind::Restart`]).
    pub fn restart(node: NodeId, at: Nanos) -> NodeFault {
        NodeFault::new(node, at, FaultKind::Restart)
    }

    /// `node` stops at `at`, its links open ([`FaultKind::Hang`]).
    pub fn hang(node: NodeId, at: Nanos) -> NodeFault {
        NodeFault::new(node, at, FaultKind::Hang)
    }

    /// `node` is frozen from `from` to `until`: a hang, then a resume.
    pub fn stall(node: NodeId, from: Nanos, until: Nanos) -> [NodeFault; 2] {
        [
            NodeFault::hang(node, from),
            NodeFault::new(node, until, FaultKind::Resume),
        ]
    }

    /// Reads `NODE@TIME`, the time in `unit` (fractions allowed, rounded to
    /// the nanosecond); spaces around either part are ignored.
    pub fn parse(spec: &str, kind: FaultKind, unit: TimeUnit) -> Result<NodeFault, FaultSpecError> {
        let fail = |problem| FaultSpecError {
            spec: spec.to_string(),
            unit,
            problem,
        };
        let (node, time) = spec
            .split_once('@')
            .ok_or_else(|| fail(SpecProblem::NoAt))?;
        let (node, time) = (node.trim(), time.trim());
        let node: NodeId = node
            .parse()
            .map_err(|_| fail(SpecProblem::Node(node.to_string())))?;
        let value: f64 = time
            .parse()
            .map_err(|_| fail(SpecProblem::Time(time.to_string())))?;
        let ns = (value * unit.nanos()).round();
        // `u64::MAX as f64` rounds up to 2^64, which does not fit: refuse it.
        if !(ns.is_finite() && ns >= 0.0 && ns < u64::MAX as f64) {
            return Err(fail(SpecProblem::TimeOutOfRange(time.to_string())));
        }
        Ok(NodeFault::new(node, ns as Nanos, kind))
    }

    /// The time in `unit`.
    pub fn at_in(&self, unit: TimeUnit) -> f64 {
        self.at as f64 / unit.nanos()
    }

    /// The `NODE@TIME` spelling, the time in `unit`: what [`NodeFault::parse`]
    /// reads back.
    pub fn spelling(&self, unit: TimeUnit) -> String {
        format!("{}@{}", self.node, self.at_in(unit))
    }
}

/// Serde for `sim.crash`: `"NODE@MICROSECONDS"`, or `""` for none; the
/// simulator's death is a [`FaultKind::Hang`] (the node goes silent, its
/// links stay open, the others find it by its silence).
pub mod sim_crash_spelling {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::{FaultKind, NodeFault, TimeUnit};

    pub fn serialize<S: Serializer>(fault: &Option<NodeFault>, s: S) -> Result<S::Ok, S::Error> {
        match fault {
            Some(f) => s.serialize_str(&f.spelling(TimeUnit::Microseconds)),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<NodeFault>, D::Error> {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            return Ok(None);
        }
        NodeFault::parse(&text, FaultKind::Hang, TimeUnit::Microseconds)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_node_and_time_in_the_callers_unit() {
        let f = NodeFault::parse(" 2 @ 3.5 ", FaultKind::Crash, TimeUnit::Seconds).unwrap();
        assert_eq!(f, NodeFault::new(2, 3_500_000_000, FaultKind::Crash));
        let f = NodeFault::parse("3@8000", FaultKind::Hang, TimeUnit::Microseconds).unwrap();
        assert_eq!(f.at, 8_000_000);
        assert_eq!(f.spelling(TimeUnit::Microseconds), "3@8000");
        // Rounded to the nanosecond, not cut: 1.005 us is 1005 ns.
        let f = NodeFault::parse("1@1.005", FaultKind::Hang, TimeUnit::Microseconds).unwrap();
        assert_eq!(f.at, 1005);
        let f = NodeFault::parse("1@1.5", FaultKind::Resume, TimeUnit::Seconds).unwrap();
        assert_eq!(f.spelling(TimeUnit::Seconds), "1@1.5");
    }

    #[test]
    fn errors_name_the_bad_part() {
        let err = |spec: &str| {
            NodeFault::parse(spec, FaultKind::Crash, TimeUnit::Seconds)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("2x@1"),
            "`2x@1`: the node `2x` is not a node number (0 to 65535); \
             expected NODE@SECONDS, for example 2@3.5"
        );
        assert!(err("3@soon").contains("the time `soon` is not a number"));
        assert!(err("3").contains("no `@`"));
        assert!(err("3@-1").contains("the time `-1` is not a time into the run"));
        assert!(err("3@inf").contains("`inf`"));
        assert!(err("70000@1").contains("the node `70000`"));
        let e = NodeFault::parse("3@x", FaultKind::Hang, TimeUnit::Microseconds).unwrap_err();
        assert!(e.to_string().contains("NODE@MICROSECONDS"), "{e}");
    }
}
