//! Fewer slots for a conflict-free schedule, by local search.
//!
//! Greedy schedules ([`crate::schedule::conflict_aware`],
//! [`crate::schedule::packed`]) need more slots than their lower bound
//! (the most flows one link carries in a rotation) on fabrics whose leaves
//! are not all full: 163 hosts on leaves of 20 take 175-179 slots where the
//! bound is 162. [`search`] starts from the plain barrel, conflicts and
//! all, folded into a few slots more than the bound, and moves flows that
//! share a link with another flow of their slot to the slot where they
//! meet the fewest others (min-conflicts, as in timetabling), until no two
//! flows of a slot share a link: 164 slots there, in about 2 million
//! moves. [`tighten`] then tries one slot less at a time: the sparsest
//! slot's flows spread over the others, and the same moves. The search is
//! seeded: the same fabric and order always give the same schedule.
//!
//! Every flow's path includes its source's and its destination's host
//! links, so "no link carries two flows in a slot" also means no rank
//! sends or receives twice in a slot.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// Flows to place: `(source rank, destination rank, links of its path)`.
pub type Flow = (usize, usize, Vec<u32>);

/// Slot occupancy: per slot and link, how many flows use it and the XOR of
/// their ids (which names the one flow when the count is 1).
struct Occupancy {
    links: usize,
    count: Vec<u16>,
    xor: Vec<u32>,
}

impl Occupancy {
    fn new(slots: usize, links: usize) -> Occupancy {
        Occupancy {
            links,
            count: vec![0; slots * links],
            xor: vec![0; slots * links],
        }
    }

    fn at(&self, slot: usize, link: u32) -> usize {
        slot * self.links + link as usize
    }

    /// Flows a flow on `path` would meet in `slot` (counted per link).
    fn cost(&self, slot: usize, path: &[u32]) -> u32 {
        path.iter()
            .map(|&l| u32::from(self.count[self.at(slot, l)]))
            .sum()
    }

    /// Puts flow `f` into `slot`; returns the flows it now shares a link
    /// with that shared none before (the one occupant of a link it joins).
    fn add(&mut self, slot: usize, f: u32, path: &[u32], newly: &mut Vec<u32>) {
        for &l in path {
            let i = self.at(slot, l);
            if self.count[i] == 1 {
                newly.push(self.xor[i]);
            }
            self.count[i] += 1;
            self.xor[i] ^= f;
        }
    }

    fn remove(&mut self, slot: usize, f: u32, path: &[u32]) {
        for &l in path {
            let i = self.at(slot, l);
            debug_assert!(self.count[i] > 0, "flow {f} was not in slot {slot}");
            self.count[i] -= 1;
            self.xor[i] ^= f;
        }
    }

    /// Whether the flow on `path` in `slot` shares a link there.
    fn collides(&self, slot: usize, path: &[u32]) -> bool {
        path.iter().any(|&l| self.count[self.at(slot, l)] > 1)
    }
}

/// Moves [`tighten`] may make per flow of the slot it takes away before
/// it gives up.
const MOVES_PER_FLOW: usize = 4000;

/// Moves [`search`] may make per flow, per number of slots it tries: the
/// 163-host case settles in about 75 a flow.
const SEARCH_MOVES_PER_FLOW: usize = 150;

/// Tries to need fewer slots than `slots` (a conflict-free assignment of
/// `flows`, `slots[k]` holding flow indices), each try one slot less, no
/// fewer than `bound`. Returns the assignment with the fewest slots found.
pub fn tighten(
    flows: &[Flow],
    slots: Vec<Vec<usize>>,
    links: usize,
    bound: usize,
) -> Vec<Vec<usize>> {
    let mut best = slots;
    let mut rng = Pcg64Mcg::seed_from_u64(0x5107);
    while best.len() > bound.max(1) {
        match one_slot_less(flows, &best, links, &mut rng) {
            Some(fewer) => best = fewer,
            None => break,
        }
    }
    best
}

/// A conflict-free assignment of `flows` into fewer than `below` slots,
/// if the search finds one: `start[f]` is flow f's slot in a schedule
/// that may have conflicts (the plain barrel), folded into `t` slots for
/// `t` = `bound` + 2, + 4, + 8, ... below `below`; the first `t` that
/// settles wins.
pub fn search(
    flows: &[Flow],
    start: &[usize],
    links: usize,
    bound: usize,
    below: usize,
) -> Option<Vec<Vec<usize>>> {
    let mut rng = Pcg64Mcg::seed_from_u64(0x5e7);
    let budget = SEARCH_MOVES_PER_FLOW * flows.len();
    let mut extra = 2;
    while bound + extra < below {
        let t = bound + extra;
        let slot_of = start.iter().map(|&k| k % t).collect();
        if let Some(slots) = settle(flows, slot_of, t, links, budget, &mut rng) {
            return Some(slots);
        }
        extra *= 2;
    }
    None
}

/// One try: the sparsest slot's flows spread over the others, then
/// [`settle`].
fn one_slot_less(
    flows: &[Flow],
    slots: &[Vec<usize>],
    links: usize,
    rng: &mut Pcg64Mcg,
) -> Option<Vec<Vec<usize>>> {
    let t = slots.len() - 1;
    let sparsest = (0..slots.len()).min_by_key(|&k| slots[k].len())?;
    let mut slot_of = vec![usize::MAX; flows.len()];
    for (k, members) in slots.iter().enumerate().filter(|&(k, _)| k != sparsest) {
        let k = if k > sparsest { k - 1 } else { k };
        for &f in members {
            slot_of[f] = k;
        }
    }
    let budget = MOVES_PER_FLOW * slots[sparsest].len().max(1);
    settle(flows, slot_of, t, links, budget, rng)
}

/// Min-conflicts: `slot_of` places every flow in one of `t` slots (a flow
/// at `usize::MAX` is placed where it collides least first); flows that
/// share a link in their slot are moved, one at a time, to the slot where
/// they collide least, until none do (the slots are returned) or `budget`
/// moves are spent (`None`).
pub fn settle(
    flows: &[Flow],
    mut slot_of: Vec<usize>,
    t: usize,
    links: usize,
    budget: usize,
    rng: &mut Pcg64Mcg,
) -> Option<Vec<Vec<usize>>> {
    let mut occ = Occupancy::new(t, links);
    let mut colliding: Vec<u32> = Vec::new();
    for (f, &k) in slot_of.iter().enumerate() {
        if k != usize::MAX {
            occ.add(k, f as u32, &flows[f].2, &mut colliding);
        }
    }
    for f in 0..flows.len() {
        if slot_of[f] == usize::MAX {
            let k = least_collisions(&occ, &flows[f].2, t, usize::MAX, rng);
            slot_of[f] = k;
            occ.add(k, f as u32, &flows[f].2, &mut colliding);
        }
        if occ.collides(slot_of[f], &flows[f].2) {
            colliding.push(f as u32);
        }
    }
    // The slot each flow last left and until which move it may not go back.
    let mut tabu: Vec<(usize, usize)> = vec![(usize::MAX, 0); flows.len()];
    for step in 0..budget {
        // Colliding flows are kept lazily: a flow that no longer collides
        // is dropped when picked.
        let f = loop {
            if colliding.is_empty() {
                return Some(regroup(&slot_of, t));
            }
            let i = rng.gen_range(0..colliding.len());
            let f = colliding[i] as usize;
            if occ.collides(slot_of[f], &flows[f].2) {
                break f;
            }
            colliding.swap_remove(i);
        };
        let from = slot_of[f];
        occ.remove(from, f as u32, &flows[f].2);
        let avoid = if tabu[f].1 > step {
            tabu[f].0
        } else {
            usize::MAX
        };
        let to = least_collisions(&occ, &flows[f].2, t, avoid, rng);
        tabu[f] = (from, step + 8);
        slot_of[f] = to;
        let before = colliding.len();
        occ.add(to, f as u32, &flows[f].2, &mut colliding);
        if colliding.len() > before {
            colliding.push(f as u32);
        }
    }
    None
}

/// The slot (not `avoid`) where a flow on `path` meets the fewest others;
/// ties broken at random, so that the search does not cycle.
fn least_collisions(
    occ: &Occupancy,
    path: &[u32],
    t: usize,
    avoid: usize,
    rng: &mut Pcg64Mcg,
) -> usize {
    let mut best = (u32::MAX, 0usize);
    let mut ties = 0u32;
    for k in (0..t).filter(|&k| k != avoid) {
        let c = occ.cost(k, path);
        if c < best.0 {
            best = (c, k);
            ties = 1;
        } else if c == best.0 {
            ties += 1;
            if rng.gen_range(0..ties) == 0 {
                best.1 = k;
            }
        }
    }
    best.1
}

/// Flow indices per slot, from each flow's slot.
fn regroup(slot_of: &[usize], t: usize) -> Vec<Vec<usize>> {
    let mut slots = vec![Vec::new(); t];
    for (f, &k) in slot_of.iter().enumerate() {
        slots[k].push(f);
    }
    slots
}
