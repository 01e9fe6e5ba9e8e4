//! Event Manager: assigns each MEP to a Builder Unit under the credit scheme.
//!
//! A BU grants credits (batches it can build at once); the EM never assigns
//! beyond them, and picks round-robin among the BUs that have credit. Each
//! BU reports every MEP it finishes with its outcome, which returns the
//! credit and gives the EM the exact accounting of the run: when a BU is
//! lost, the MEPs it had not finished are counted lost, by name. When an RU
//! is lost, the BUs are told to build later MEPs without it.
//!
//! A lost endpoint can rejoin (its node restarted, or its link came back):
//! its BU is live again and gets MEPs once it grants credits, and its RU is
//! re-admitted from a MEP boundary (`SourceUp`): the MEPs assigned from then
//! on include it again. The EM's own node (node 0) cannot rejoin.

use std::collections::BTreeSet;

use crate::layout::Layout;
use crate::wire::{outcome, MepId, Message, NodeId};

/// Counters of the Event Manager, in MEPs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmStats {
    pub meps_assigned: u64,
    /// Times the EM had a MEP to assign but no BU had credit.
    pub credit_stalls: u64,
    pub meps_built: u64,
    pub meps_incomplete: u64,
    pub meps_corrupt: u64,
    /// MEPs assigned to a BU that was lost before finishing them.
    pub meps_lost_bu_gone: u64,
    /// BU and RU endpoints lost during the run.
    pub bus_lost: Vec<NodeId>,
    pub rus_lost: Vec<NodeId>,
    /// Endpoints that rejoined after being lost, in order (one entry per
    /// rejoin).
    pub rejoined: Vec<NodeId>,
}

#[derive(Debug, Clone)]
pub struct EventManager {
    /// Credits held per BU index.
    credits: Vec<u32>,
    /// MEPs assigned and not yet reported finished, per BU index.
    outstanding: Vec<BTreeSet<MepId>>,
    bu_lost: Vec<bool>,
    ru_lost: Vec<bool>,
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
            outstanding: vec![BTreeSet::new(); layout.bus()],
            bu_lost: vec![false; layout.bus()],
            ru_lost: vec![false; layout.rus()],
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
        if self.bu_lost.get(bu_index) != Some(&false) {
            return;
        }
        self.credits[bu_index] = self.credits[bu_index].saturating_add(credits);
        self.assign(out);
    }

    /// A BU finished `mep`: count its outcome, take the credit back.
    pub fn on_finished(
        &mut self,
        bu_index: usize,
        mep: MepId,
        code: u8,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        let Some(set) = self.outstanding.get_mut(bu_index) else {
            return;
        };
        if !set.remove(&mep) {
            return; // Not outstanding there: a duplicate or a confused BU.
        }
        match code {
            outcome::BUILT => self.stats.meps_built += 1,
            outcome::CORRUPT => self.stats.meps_corrupt += 1,
            _ => self.stats.meps_incomplete += 1,
        }
        self.on_credit(bu_index, 1, out);
    }

    /// MEPs assigned and not yet finished, over all BUs.
    pub fn outstanding(&self) -> usize {
        self.outstanding.iter().map(BTreeSet::len).sum()
    }

    /// Endpoint `node` is gone. Its BU gets nothing more, and what it had
    /// not finished is lost; without its RU, BUs build later MEPs from the
    /// other sources.
    pub fn on_node_lost(
        &mut self,
        node: NodeId,
        layout: &Layout,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        if let Some(b) = layout.bu_of.get(node as usize).copied().flatten() {
            let b = b as usize;
            if !self.bu_lost[b] {
                self.bu_lost[b] = true;
                self.credits[b] = 0;
                self.stats.meps_lost_bu_gone += self.outstanding[b].len() as u64;
                self.outstanding[b].clear();
                self.stats.bus_lost.push(node);
            }
        }
        if let Some(s) = layout.ru_of.get(node as usize).copied().flatten() {
            if !self.ru_lost[s as usize] {
                self.ru_lost[s as usize] = true;
                self.stats.rus_lost.push(node);
                for (b, &bu) in self.bu_nodes.iter().enumerate() {
                    if !self.bu_lost[b] {
                        out.push((
                            bu,
                            Message::SourceDown {
                                source: s,
                                from_mep: self.next_mep,
                            },
                        ));
                    }
                }
            }
        }
        if self.bu_lost.iter().all(|&l| l) && !self.stopped {
            // Nobody left to build: the run is over.
            self.stop(out);
        } else {
            self.assign(out);
        }
    }

    /// Endpoint `node` is back after it was lost (a new incarnation of the
    /// process, or the same one reconnected). Its BU is live again with no
    /// credit until it grants some, and is told which sources are down; its
    /// RU is in every assignment from the next MEP on, and the BUs are told
    /// so (`SourceUp`) before any such assignment. Nothing happens for an
    /// endpoint that was not lost; once the run has stopped, it is only
    /// told so (it missed the `EndOfRun`).
    pub fn on_node_joined(
        &mut self,
        node: NodeId,
        layout: &Layout,
        out: &mut Vec<(NodeId, Message)>,
    ) {
        if self.stopped {
            out.push((
                node,
                Message::EndOfRun {
                    meps: self.next_mep,
                },
            ));
            return;
        }
        let mut rejoined = false;
        if let Some(b) = layout.bu_of.get(node as usize).copied().flatten() {
            let b = b as usize;
            if self.bu_lost[b] {
                self.bu_lost[b] = false;
                self.credits[b] = 0;
                rejoined = true;
                // A new BU expects every source: name the ones still down
                // (none of its MEPs will have them).
                for (s, &lost) in self.ru_lost.iter().enumerate() {
                    if lost && self.ru_nodes[s] != node {
                        out.push((
                            node,
                            Message::SourceDown {
                                source: s as u16,
                                from_mep: 0,
                            },
                        ));
                    }
                }
            }
        }
        if let Some(s) = layout.ru_of.get(node as usize).copied().flatten() {
            if self.ru_lost[s as usize] {
                self.ru_lost[s as usize] = false;
                rejoined = true;
                for (b, &bu) in self.bu_nodes.iter().enumerate() {
                    if !self.bu_lost[b] {
                        out.push((
                            bu,
                            Message::SourceUp {
                                source: s,
                                from_mep: self.next_mep,
                            },
                        ));
                    }
                }
            }
        }
        if rejoined {
            self.stats.rejoined.push(node);
        }
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
            self.outstanding[bu].insert(mep);
            let bu_node = self.bu_nodes[bu];
            let msg = Message::Assign { mep, bu: bu_node };
            // The BU first, then every live RU (a folded node gets one copy).
            out.push((bu_node, msg));
            for (s, &ru) in self.ru_nodes.iter().enumerate() {
                if ru != bu_node && !self.ru_lost[s] {
                    out.push((ru, msg));
                }
            }
        }
    }
}
