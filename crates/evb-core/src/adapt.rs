//! The EM's control of the slot length: longer slots when the RUs keep
//! overrunning them, back towards the nominal length when they no longer
//! do.
//!
//! The nominal slot fits a fragment three standard deviations above the
//! mean at the link rate the configuration (or the fabric) gives. A link
//! that runs slower than that (a cable trained to half width, a host that
//! cannot feed its NIC, a clock that drifts) makes the fragments that
//! cross it overrun their slots, and an overrun lands on the next slot's
//! fragment at the same BU. Measured in `evb sim`: one of 72 nodes on a
//! half-rate link, with slots of the nominal length, builds 22 % of the
//! link and falling; with slots twice as long, 48.6 %: what that node can
//! carry, for everyone, since every batch waits for its fragment.
//!
//! Every RU tells the EM once a rotation how many of its fragments took
//! longer than their slot, and how much longer than at the nominal rate
//! its fragments take on its link (`SlotReport`). Once every live RU has
//! reported, the EM decides ([`SlotAdapt::decide`]): more than
//! [`GROW_ABOVE`] of the fragments overran, the slot grows, to what the
//! slowest link needs; [`CLEAN_WINDOWS`] rotations in a row with almost
//! none, it shrinks half way back to the nominal length. A change takes
//! effect [`LEAD_NS`] ahead, from a slot every RU has yet to reach
//! (`SlotLength`), so that all RUs switch at the same slot, and the
//! reports of the next rotation, about slots before it, are not counted.
//!
//! With the EM in a node, its assignments are paced into that node's
//! slot headroom ([`crate::pacer`]), a budget taken from the slot in
//! force: measured on 72 nodes with one unknown half-rate link, a budget
//! of the nominal slot let 10,000 assignments queue at the EM's node and
//! the rate fall to 30 % of link over 200 ms; from the lengthened slot,
//! with the EM holding new assignments while its node's backlog lasts,
//! 46.3 %, what the lengthened slots allow (docs/sim.md).

use crate::bu::Nanos;
use crate::slots::SlotEpoch;

/// Overruns above this fraction of the fragments in a rotation make the
/// slots longer.
pub const GROW_ABOVE: f64 = 0.01;
/// Overruns below this fraction count as a clean rotation.
pub const CLEAN_BELOW: f64 = 0.001;
/// Clean rotations in a row before the slots shrink.
pub const CLEAN_WINDOWS: u32 = 8;
/// How far ahead a change of the slots takes effect: long enough for the
/// `SlotLength` to reach every RU over a loaded network.
pub const LEAD_NS: Nanos = 2_000_000;
/// A report's stretch (in 1/1024) above which some RU's link is slower
/// than the slots allow: 2 % beyond them.
pub const SLOW_LINK_ABOVE: u64 = 1024 + 1024 / 50;
/// The slots never grow beyond this many times their nominal length.
pub const MAX_STRETCH: u64 = 64;

#[derive(Debug, Clone, Default)]
struct Window {
    served: u64,
    overran: u64,
    /// The most any RU's fragments take on its link against the nominal
    /// rate, in 1/1024.
    stretch: u64,
    reports: usize,
}

#[derive(Debug, Clone)]
pub struct SlotAdapt {
    nominal: Nanos,
    /// Slots in a rotation: after a change, reports wait a rotation of the
    /// new slots (those before speak of the old ones).
    rotation: u64,
    epoch: SlotEpoch,
    quiet_until: Nanos,
    window: Window,
    clean: u32,
    /// Changes of the slot length so far, and the longest slot used.
    pub changes: u64,
    pub longest_ns: Nanos,
}

impl SlotAdapt {
    pub fn new(nominal: Nanos, rotation: u64) -> SlotAdapt {
        SlotAdapt {
            nominal: nominal.max(1),
            rotation: rotation.max(1),
            epoch: SlotEpoch::nominal(nominal),
            // The first rotations are the start (clocks measured, the
            // first assignments): not what the slots are like.
            quiet_until: nominal.saturating_mul(rotation.max(1)).saturating_mul(2),
            window: Window::default(),
            clean: 0,
            changes: 0,
            longest_ns: nominal.max(1),
        }
    }

    /// The slot length a window's reports call for. The slowest RU's link
    /// sets a floor: the nominal slot stretched as its fragments are, and
    /// 10 % to spare (a backlog at a slow node drains only if its link has
    /// room). Too many overruns with a link slower than the slots allow:
    /// the floor, and at least 5 % longer. Overruns without one (host
    /// jitter, a clock off, a burst of control messages) change nothing:
    /// longer slots would not remove them, and measured under `evb run`,
    /// growing for them took 2 nodes over shm from 307 to 100 Gb/s.
    /// Clean rotations in a row: half way back, no lower than the floor.
    fn decide(&mut self, w: &Window) -> Nanos {
        let cur = self.epoch.slot_ns;
        if w.served == 0 {
            return cur;
        }
        // A link slower than the slots allow (by more than the rounding of
        // packet headers): its need, and a tenth to spare. None: the
        // nominal slots are long enough.
        let slow = w.stretch > SLOW_LINK_ABOVE;
        let stretched = self.nominal.saturating_mul(w.stretch.max(1024)) / 1024;
        let floor = if slow {
            (stretched + stretched / 10).max(self.nominal)
        } else {
            self.nominal
        };
        let fraction = w.overran as f64 / w.served as f64;
        if fraction > GROW_ABOVE {
            self.clean = 0;
            if floor <= cur {
                return cur;
            }
            return (cur + cur / 20).max(floor).min(MAX_STRETCH * self.nominal);
        }
        if fraction >= CLEAN_BELOW {
            self.clean = 0;
            return cur;
        }
        self.clean += 1;
        if self.clean < CLEAN_WINDOWS || cur <= floor {
            return cur;
        }
        self.clean = 0;
        let half = (cur - (cur - self.nominal) / 2).max(floor);
        if half - self.nominal < self.nominal / 100 {
            self.nominal
        } else {
            half
        }
    }

    /// The slots now in effect (from the EM's point of view).
    pub fn epoch(&self) -> SlotEpoch {
        self.epoch
    }

    pub fn nominal_ns(&self) -> Nanos {
        self.nominal
    }

    /// An RU's report; `live_rus` reports make a window. Returns the new
    /// slots if the window's decision changes them (`now`: EM time).
    pub fn report(
        &mut self,
        served: u32,
        overran: u32,
        stretch: u32,
        live_rus: usize,
        now: Nanos,
    ) -> Option<SlotEpoch> {
        if now < self.quiet_until {
            return None; // About slots before the last change.
        }
        let w = &mut self.window;
        w.served += u64::from(served);
        w.overran += u64::from(overran.min(served));
        w.stretch = w.stretch.max(u64::from(stretch));
        w.reports += 1;
        if w.reports < live_rus.max(1) {
            return None;
        }
        let w = std::mem::take(&mut self.window);
        let next = self.decide(&w);
        let cur = self.epoch.slot_ns;
        if next == cur {
            return None;
        }
        let lead = LEAD_NS.div_ceil(cur).max(4);
        let from = self.epoch.slot_at(i128::from(now)) + lead;
        let epoch = self.epoch.changed_at(from, next);
        debug_assert!(epoch.start_ns >= now, "a change takes effect ahead");
        self.epoch = epoch;
        self.quiet_until = epoch
            .start_of(from + self.rotation)
            .clamp(0, i128::from(u64::MAX)) as Nanos;
        self.changes += 1;
        self.longest_ns = self.longest_ns.max(next);
        Some(epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overruns_lengthen_the_slots_from_a_slot_ahead_and_clean_rotations_shorten_them() {
        let mut a = SlotAdapt::new(1000, 10);
        // The first two rotations (20 slots) are not counted.
        assert_eq!(a.report(100, 100, 2048, 1, 19_999), None);
        // Three RUs, one of them on a link at half the rate, overrunning.
        assert_eq!(a.report(100, 0, 1024, 3, 50_000), None);
        assert_eq!(a.report(100, 0, 1030, 3, 50_000), None);
        let e = a.report(100, 100, 2048, 3, 50_000).expect("grows");
        // Twice the nominal, 10 % to spare.
        assert_eq!(e.slot_ns, 2200);
        // 2 ms ahead at 1 us slots: slot 50 + 2000.
        assert_eq!(e.from, 2050);
        assert_eq!(e.start_ns, 2_050_000);
        // Reports until a rotation of the new slots has passed speak of
        // the old ones: not counted.
        let quiet = 2_050_000 + 10 * 2200;
        assert_eq!(a.report(10, 10, 1024, 1, quiet - 1), None);
        // Still overrunning with no link slower than the slots allow:
        // unchanged (jitter is not what longer slots cure).
        for _ in 0..3 {
            assert_eq!(a.report(10, 10, 1024, 3, quiet), None);
        }
        // The slow link slower still: 5 % more than its need if that is
        // less than 5 % more than the slots.
        for _ in 0..2 {
            assert_eq!(a.report(10, 10, 1024, 3, quiet), None);
        }
        let e2 = a.report(10, 10, 2100, 3, quiet).expect("grows");
        assert_eq!(e2.slot_ns, 2310);
        assert!(e2.from > e.from);
        // Clean rotations: after CLEAN_WINDOWS of them, half way back.
        let mut shrunk = None;
        for w in 0..CLEAN_WINDOWS {
            for r in 0..3 {
                let got = a.report(100, 0, 1024, 3, 100_000_000);
                if r < 2 || w + 1 < CLEAN_WINDOWS {
                    assert_eq!(got, None);
                } else {
                    shrunk = got;
                }
            }
        }
        assert_eq!(shrunk.expect("shrinks").slot_ns, 2310 - (2310 - 1000) / 2);
        assert_eq!(a.changes, 3);
        assert_eq!(a.longest_ns, 2310);
    }

    #[test]
    fn a_slow_link_sets_a_floor_the_slots_do_not_shrink_below() {
        let mut a = SlotAdapt::new(1000, 1);
        let e = a.report(10, 10, 2048, 1, 10_000).expect("grows");
        assert_eq!(e.slot_ns, 2200);
        let mut now = 10_000_000;
        for _ in 0..(4 * CLEAN_WINDOWS) {
            assert_eq!(a.report(100, 0, 2048, 1, now), None, "the floor holds");
            now += 1_000_000;
        }
    }

    #[test]
    fn a_few_overruns_change_nothing() {
        let mut a = SlotAdapt::new(1000, 10);
        // 0.5 % of the fragments overran: neither grow nor clean.
        for _ in 0..(CLEAN_WINDOWS * 2) {
            assert_eq!(a.report(1000, 5, 1024, 1, 10_000), None);
        }
        assert_eq!(a.epoch().slot_ns, 1000);
    }
}
