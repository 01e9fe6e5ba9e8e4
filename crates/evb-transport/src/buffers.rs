//! Fixed buffer pools (`event_builder.preallocate_buffers`): how many MEP
//! and receive buffers a node needs at the configured bounds, and of what
//! size. A node with the option on allocates and touches them all at start
//! and keeps them for the run; the same figures let `evb run` check them
//! against the machine's memory before it starts anything.
//!
//! The bounds, from the protocol:
//!
//! - **MEP buffers** (an RU's fragment of each MEP, from its `Produce` to
//!   its release). An RU produces a MEP when the EM assigns it, and the EM
//!   never has more than the BUs' credits outstanding (assigned, not yet
//!   reported finished): `credits x BUs`. With a paced readout it also
//!   keeps the MEPs not yet built within `ru_buffer_meps` (the MEPs waiting
//!   for credit are not read out yet), so the bound is the smaller of the
//!   two. A BU can finish a MEP (and its credit be re-used) before the RU's
//!   transport reports the send done, so the transfers in flight come on
//!   top. A fragment handed to the node's own BU in memory shares the
//!   buffer until that BU finishes the batch, which is within the credits.
//!   Nothing else bounds what an RU holds (a BU that gives a batch up
//!   returns its credit while the RU may still be queueing that MEP), so a
//!   `Produce` that finds no free buffer waits for one, and is counted.
//!   Over shm with zero copy a BU reads each fragment in place until its
//!   batch is done, which is also when its credit goes back: the EM's next
//!   assignment can reach an RU before that BU's release does, so each BU
//!   adds one buffer.
//! - **Receive buffers.** A message transport keeps a fixed number of
//!   receives posted, each as large as the largest message
//!   ([`msg::posted_receives`]); TCP takes a buffer only for a fragment it
//!   admits. A BU keeps at most one payload per source in each open batch,
//!   and holds at most [`BuilderUnit::max_open_batches`] (a unit test
//!   drives that worst case); over TCP a payload still being read when its
//!   batch was given up adds one per connection. A receive that finds no
//!   free buffer despite these bounds gets a new one, counted and reported
//!   (`rx_buffer_overflows`): the pool never keeps it.
//!
//! [`msg::posted_receives`]: crate::msg::posted_receives

use evb_core::bu::BuilderUnit;
use evb_core::config::{Config, LocalTraffic, Protocol, Schedule};
use evb_core::{Layout, NodeId};

use crate::TransportKind;

/// Whether an RU's fragments are read in place by its BUs: shm with
/// `transport.shm_zero_copy`.
pub fn zero_copy(config: &Config, kind: &TransportKind) -> bool {
    *kind == TransportKind::Shm && config.transport.shm_zero_copy
}

/// Whether large buffers go on huge pages: `event_builder.huge_pages`
/// (which `EVB_HUGEPAGES=0|1` overrides when the config is loaded).
pub fn huge_pages(config: &Config) -> bool {
    config.event_builder.huge_pages
}

/// The buffers one node preallocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferPlan {
    pub mep_buffers: usize,
    /// Bytes of each MEP buffer: the largest fragment a source can produce.
    pub mep_bytes: usize,
    pub rx_buffers: usize,
    /// Bytes of each receive buffer: the largest message (fragment and
    /// headers) a node can receive.
    pub rx_bytes: usize,
}

impl BufferPlan {
    /// The buffers endpoint `rank` needs; `kind` is the transport it runs
    /// over (`auto` resolved).
    pub fn for_node(config: &Config, layout: &Layout, rank: NodeId, kind: &TransportKind) -> Self {
        let eb = &config.event_builder;
        let i = rank as usize;
        let (rus, bus) = (layout.rus(), layout.bus());
        let is_ru = layout.ru_of.get(i).copied().flatten().is_some();
        let is_bu = layout.bu_of.get(i).copied().flatten().is_some();
        let mep_buffers = if is_ru && eb.mep_buffers > 0 {
            // Fewer than the bound below, to make MEPs wait (a test).
            eb.mep_buffers as usize
        } else if is_ru {
            let mut assigned = eb.credits as usize * bus;
            if config.source.mep_rate_hz > 0.0 {
                assigned = assigned.min(eb.ru_buffer_meps as usize);
            }
            let in_flight = match (eb.protocol, eb.schedule) {
                (Protocol::Push, Schedule::All) => assigned,
                (Protocol::Push, _) => eb.parallel_sends as usize,
                // Each BU keeps up to parallel_sends requests in flight.
                (Protocol::Pull, _) => bus * eb.parallel_sends as usize,
            };
            let release_race = if zero_copy(config, kind) { bus } else { 0 };
            assigned + in_flight.min(assigned) + release_race
        } else {
            0
        };
        let linked = crate::linked_peers(config, layout, rank).len();
        let tcp = *kind == TransportKind::Tcp;
        let posted = if tcp {
            0
        } else {
            crate::msg::posted_receives(linked)
        };
        let held = if is_bu {
            // The node's own RU hands its fragments over in memory.
            let local = is_ru && eb.local == LocalTraffic::Memory;
            let remote = rus - usize::from(local);
            let reading = if tcp { remote } else { 0 };
            BuilderUnit::max_open_batches(eb.protocol, eb.credits) * remote + reading
        } else {
            0
        };
        BufferPlan {
            mep_buffers,
            mep_bytes: config.max_fragment_payload() as usize,
            rx_buffers: posted + held,
            rx_bytes: if tcp {
                config.max_fragment_payload() as usize
            } else {
                crate::max_message_bytes(config)
            },
        }
    }

    pub fn mep_total(&self) -> u64 {
        self.mep_buffers as u64 * self.mep_bytes as u64
    }

    pub fn rx_total(&self) -> u64 {
        self.rx_buffers as u64 * self.rx_bytes as u64
    }

    pub fn total_bytes(&self) -> u64 {
        self.mep_total() + self.rx_total()
    }

    /// The plan of every endpoint of a run, and their sum in bytes.
    pub fn for_run(config: &Config, layout: &Layout) -> anyhow::Result<(Vec<BufferPlan>, u64)> {
        let kind = crate::resolve_auto(config);
        let plans: Vec<BufferPlan> = (0..layout.endpoints)
            .map(|r| BufferPlan::for_node(config, layout, r, &kind))
            .collect();
        let total = plans.iter().map(BufferPlan::total_bytes).sum();
        Ok((plans, total))
    }

    /// One line for the logs.
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        format!(
            "{} MEP buffers of {:.2} MiB + {} receive buffers of {:.2} MiB = {:.1} MiB",
            self.mep_buffers,
            mib(self.mep_bytes as u64),
            self.rx_buffers,
            mib(self.rx_bytes as u64),
            mib(self.total_bytes())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_run_plan_follows_the_bounds() {
        let config = Config::default();
        let layout = Layout::from_config(&config);
        let shm = TransportKind::Shm;
        let c = config.event_builder.credits as usize;
        // 4 nodes, EM on node 0: every node is RU and BU, linked to 3.
        let p = BufferPlan::for_node(&config, &layout, 1, &shm);
        let fragment = 4096 * (4 + 4096);
        assert_eq!(p.mep_bytes, fragment);
        // credits x 4 BUs assigned, + 2 sends in flight, + one per BU
        // for the zero-copy release race.
        assert_eq!(p.mep_buffers, c * 4 + 2 + 4);
        let mut copying = config.clone();
        copying.transport.shm_zero_copy = false;
        let p = BufferPlan::for_node(&copying, &layout, 1, &shm);
        assert_eq!(p.mep_buffers, c * 4 + 2);
        // 10 posted + 2 x credits open batches x 3 remote sources.
        assert_eq!(p.rx_buffers, 10 + 2 * c * 3);
        assert!(p.rx_bytes > fragment);
        // Paced: the readout buffer bounds the RU when it is smaller.
        let mut paced = config.clone();
        paced.source.mep_rate_hz = 100.0;
        paced.event_builder.ru_buffer_meps = 3;
        let p = BufferPlan::for_node(&paced, &layout, 1, &TransportKind::Tcp);
        assert_eq!(p.mep_buffers, 3 + 2);
        // TCP posts nothing; it reads a payload per connection.
        let p = BufferPlan::for_node(&config, &layout, 1, &TransportKind::Tcp);
        assert_eq!(p.rx_buffers, 2 * c * 3 + 3);
        assert_eq!(p.rx_bytes, fragment);
    }

    #[test]
    fn roles_need_only_their_buffers() {
        let mut config = Config::default();
        config.nodes.count = 3;
        config.nodes.ru_only = vec![1];
        config.nodes.bu_only = vec![2];
        config.event_builder.protocol = Protocol::Pull;
        let layout = Layout::from_config(&config);
        let shm = TransportKind::Shm;
        let c = config.event_builder.credits as usize;
        let ru = BufferPlan::for_node(&config, &layout, 1, &shm);
        let bu = BufferPlan::for_node(&config, &layout, 2, &shm);
        let posted = crate::msg::posted_receives(2);
        assert_eq!(ru.rx_buffers, posted, "an RU only posts receives");
        // PULL: credits x BUs, + each BU's requests in flight (capped),
        // + one per BU (zero copy).
        assert_eq!(ru.mep_buffers, c * 2 + 2 * 2 + 2);
        assert_eq!(bu.mep_buffers, 0);
        // 2 RUs, both remote; PULL opens only assigned batches.
        assert_eq!(bu.rx_buffers, posted + c * 2);
    }
}
