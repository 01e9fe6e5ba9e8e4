//! Paces a node's bursts of control messages into the headroom of its
//! slots.
//!
//! With the EM in a node that also ships fragments, the EM's assignments
//! of a batch go to every RU at once: at 288 nodes, 288 messages on that
//! node's link within a microsecond or two. Its RU's fragment of that slot
//! shares the link with them, overruns its slot by the burst (the headroom
//! of a slot is ~1 % of it), and the overrun spreads from the BU it lands
//! on to the next slot's RU there. The assignments are needed a rotation
//! ahead (credits), so nothing is lost by spreading them: the pacer holds
//! them and lets out at most [`crate::slots::SlotPlan::control_per_slot`]
//! a slot (a quarter of the headroom of the slot in force), when the
//! node's own fragment has left the link. While it holds any, the EM
//! collects new assignments instead of telling them
//! ([`crate::em::EventManager::set_control_backlog`]): the next batch is
//! larger, still one run to each RU, so the held messages never outgrow
//! what the headroom carries (at 1024 RUs a batch every 500 us is 1023
//! messages, more than the slots between two batches let out).
//!
//! Only the EM's `AssignRun`s are paced. A later message to an endpoint
//! that still has paced messages waiting takes them along first, so that
//! every endpoint sees the EM's messages in the order they were said.

use std::collections::VecDeque;

use crate::wire::{Message, NodeId};

#[derive(Debug, Clone, Default)]
pub struct ControlPacer {
    held: VecDeque<(NodeId, Message)>,
    /// The slot whose budget is being spent, and how much of it is.
    slot: u64,
    sent_in_slot: usize,
    /// Messages paced out in all (statistics).
    pub paced: u64,
}

impl ControlPacer {
    /// Whether a message of this kind waits for the slots' headroom.
    pub fn paces(msg: &Message) -> bool {
        matches!(msg, Message::AssignRun { .. })
    }

    pub fn hold(&mut self, to: NodeId, msg: Message) {
        self.held.push_back((to, msg));
        self.paced += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Takes out, in order, what is held for `to` (a message to `to` that
    /// is not paced goes after them).
    pub fn take_for(&mut self, to: NodeId) -> Vec<Message> {
        if !self.held.iter().any(|(t, _)| *t == to) {
            return Vec::new();
        }
        let mut taken = Vec::new();
        self.held.retain(|(t, m)| {
            if *t == to {
                taken.push(*m);
                false
            } else {
                true
            }
        });
        taken
    }

    /// Lets out what the budget of `slot` allows (`per_slot` a slot), into
    /// `out`; returns whether anything is still held because the slot's
    /// budget is spent (then the next slot's start is the deadline).
    pub fn release(
        &mut self,
        slot: u64,
        per_slot: usize,
        out: &mut VecDeque<(NodeId, Message)>,
    ) -> bool {
        if slot != self.slot {
            self.slot = slot;
            self.sent_in_slot = 0;
        }
        while self.sent_in_slot < per_slot.max(1) {
            let Some(m) = self.held.pop_front() else {
                return false;
            };
            out.push_back(m);
            self.sent_in_slot += 1;
        }
        !self.held.is_empty()
    }

    /// Lets everything out (the node cannot pace: no slot clock).
    pub fn release_all(&mut self, out: &mut VecDeque<(NodeId, Message)>) {
        out.extend(self.held.drain(..));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64) -> Message {
        Message::AssignRun {
            first,
            count: 1,
            first_bu: 0,
        }
    }

    #[test]
    fn a_slot_lets_out_its_budget_in_order_and_the_next_slot_the_rest() {
        let mut p = ControlPacer::default();
        for to in 1..=5 {
            p.hold(to, run(u64::from(to)));
        }
        let mut out = VecDeque::new();
        assert!(p.release(7, 2, &mut out), "three still held");
        assert!(p.release(7, 2, &mut out), "the slot's budget is spent");
        assert_eq!(out.iter().map(|m| m.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!(!p.release(8, 3, &mut out));
        assert_eq!(
            out.iter().map(|m| m.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
        assert!(p.is_empty());
    }

    #[test]
    fn a_later_message_takes_what_is_held_for_its_endpoint_along() {
        let mut p = ControlPacer::default();
        p.hold(3, run(10));
        p.hold(4, run(10));
        p.hold(3, run(11));
        assert_eq!(p.take_for(3), vec![run(10), run(11)]);
        assert!(p.take_for(3).is_empty());
        assert!(!p.is_empty(), "4's is still held");
    }
}
