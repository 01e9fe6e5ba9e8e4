//! Event Manager: assigns each MEP to a Builder Unit under the credit scheme.
//!
//! A BU grants credits (batches it can build at once); the EM never assigns
//! beyond them, and picks round-robin among the BUs that have credit.

use crate::layout::Layout;
use crate::wire::{MepId, Message, NodeId};

/// Counters of the Event Manager.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmStats {
    pub meps_assigned: u64,
    /// Times the EM had a MEP to assign but no BU had credit.
    pub credit_stalls: u64,
}

#[derive(Debug, Clone)]
pub struct EventManager {
    /// Credits held per BU index.
    credits: Vec<u32>,
    bu_nodes: Vec<NodeId>,
    ru_nodes: Vec<NodeId>,
    endpoints: u16,
    /// BU index the round-robin search starts from.
    next_bu: usize,
    next_mep: MepId,
    /// 0: no limit.
    max_meps: u64,
    stopped: bool,
    stalled: bool,
    pub stats: EmStats,
}

impl EventManager {
    pub fn new(layout: &Layout, max_meps: u64) -> EventManager {
        EventManager {
            credits: vec![0; layout.bus()],
            bu_nodes: layout.bu_nodes.clone(),
            ru_nodes: layout.ru_nodes.clone(),
            endpoints: layout.endpoints,
            next_bu: 0,
            next_mep: 0,
            max_meps,
            stopped: false,
            stalled: false,
            stats: EmStats::default(),
        }
    }

    /// MEPs assigned so far (ids `0..meps_assigned`).
    pub fn meps_assigned(&self) -> MepId {
        self.next_mep
    }

    pub fn credits_of(&self, bu_index: usize) -> u32 {
        self.credits[bu_index]
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// A BU grants `credits`; assigns what it can. Messages go to `out`.
    pub fn on_credit(&mut self, bu_index: usize, credits: u32, out: &mut Vec<(NodeId, Message)>) {
        if let Some(c) = self.credits.get_mut(bu_index) {
            *c = c.saturating_add(credits);
        }
        self.assign(out);
    }

    /// Stops assigning and tells every endpoint how many MEPs exist.
    pub fn stop(&mut self, out: &mut Vec<(NodeId, Message)>) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        for node in 0..self.endpoints {
            out.push((
                node,
                Message::EndOfRun {
                    meps: self.next_mep,
                },
            ));
        }
    }

    fn assign(&mut self, out: &mut Vec<(NodeId, Message)>) {
        while !self.stopped {
            if self.max_meps != 0 && self.next_mep >= self.max_meps {
                self.stop(out);
                return;
            }
            let n = self.credits.len();
            let Some(bu) = (0..n)
                .map(|k| (self.next_bu + k) % n)
                .find(|&b| self.credits[b] > 0)
            else {
                if !self.stalled {
                    self.stats.credit_stalls += 1;
                    self.stalled = true;
                }
                return;
            };
            self.stalled = false;
            self.credits[bu] -= 1;
            self.next_bu = (bu + 1) % n;
            let mep = self.next_mep;
            self.next_mep += 1;
            self.stats.meps_assigned += 1;
            let bu_node = self.bu_nodes[bu];
            let msg = Message::Assign { mep, bu: bu_node };
            // The BU first, then every RU (a folded node gets one copy).
            out.push((bu_node, msg));
            for &ru in &self.ru_nodes {
                if ru != bu_node {
                    out.push((ru, msg));
                }
            }
        }
    }
}
