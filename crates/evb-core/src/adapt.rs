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
//! none, it shrinks towards that need (measured in clean rotations, with
//! [`SPARE_PERCENT`] to spare), never below a length that overran (a
//! bracket, since a small slowness hides in the completion latency the
//! measure subtracts), back up half way if a shrink overruns. A change takes
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
//! 46.3 %, what the lengthened slots allow; with 3 % to spare (was 10)
//! and the shrink to the measured need, 48.3 % (docs/sim.md).

use crate::bu::Nanos;
use crate::slots::SlotEpoch;

/// Overruns above this fraction of the fragments in a rotation make the
/// slots longer.
pub const GROW_ABOVE: f64 = 0.01;
/// Overruns below this fraction count as a clean rotation.
pub const CLEAN_BELOW: f64 = 0.001;
/// Clean rotations in a row before the slots shrink.
pub const CLEAN_WINDOWS: u32 = 3;
/// How far ahead a change of the slots takes effect: long enough for the
/// `SlotLength` to reach every RU over a loaded network.
pub const LEAD_NS: Nanos = 2_000_000;
/// A report's stretch (in 1/1024) above which some RU's link is slower
/// than the slots allow: 2 % beyond them.
pub const SLOW_LINK_ABOVE: u64 = 1024 + 1024 / 50;
/// What the slots keep beyond the slowest link's measured need, percent.
pub const SPARE_PERCENT: u64 = 3;
/// Clean windows of [`CLEAN_WINDOWS`] rotations at a settled length after
/// which the length that overran is forgotten (the slots try shorter).
pub const FORGET_AFTER: u32 = 8;
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
    /// The longest slot that saw too many overruns, and the shortest that
    /// stayed clean for [`CLEAN_WINDOWS`] rotations since: the slots
    /// shrink towards the first, come back to the second if a shrink went
    /// too far (0: none). A slow link's need is measured from the least
    /// time its fragments take, which a completion latency of the same
    /// order hides (a link 4 % slow at 100 Gb/s adds 3.6 us to a fragment
    /// of 1 MiB): the bracket finds its length where the measure cannot.
    overran_at: Nanos,
    clean_at: Nanos,
    /// Clean rotations in a row at a settled length: after
    /// [`FORGET_AFTER`] of them the overrun length is forgotten, so the
    /// slots go back towards the nominal if the slow link is gone.
    settled: u32,
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
            overran_at: 0,
            clean_at: 0,
            settled: 0,
            changes: 0,
            longest_ns: nominal.max(1),
        }
    }

    /// The slot length a window's reports call for. The slowest RU's link
    /// sets a floor: the nominal slot stretched as its fragments are, and
    /// [`SPARE_PERCENT`] to spare. Too many overruns: back to the shortest
    /// length that was clean if the slots shrank below it; else, with a
    /// link slower than the slots allow, the floor and at least 5 % longer.
    /// Overruns with no slow link and nothing to go back to (host jitter,
    /// a clock off, a burst of control messages) change nothing: longer
    /// slots would not remove them, and measured under `evb run`, growing
    /// for them took 2 nodes over shm from 307 to 100 Gb/s. After
    /// [`CLEAN_WINDOWS`] clean rotations the slots shrink to the most of
    /// the floor, the nominal length and 5 % above the longest length that
    /// overran: at once with a slow link measured, else half way (to the
    /// bound once within 1 % of the nominal from it). A shrink that
    /// overruns goes half way back up. The loss is then about what the
    /// slowest link's slowness costs it.
    fn decide(&mut self, w: &Window) -> Nanos {
        let cur = self.epoch.slot_ns;
        if w.served == 0 {
            return cur;
        }
        // A link slower than the slots allow (by more than the rounding of
        // packet headers): its need and a little to spare. None: the
        // nominal slots are long enough.
        let slow = w.stretch > SLOW_LINK_ABOVE;
        let stretched = self.nominal.saturating_mul(w.stretch.max(1024)) / 1024;
        let floor = if slow {
            (stretched + stretched * SPARE_PERCENT / 100).max(self.nominal)
        } else {
            self.nominal
        };
        let fraction = w.overran as f64 / w.served as f64;
        if fraction > GROW_ABOVE {
            self.clean = 0;
            self.settled = 0;
            self.overran_at = self.overran_at.max(cur);
            if self.clean_at > cur {
                // A shrink went too far: half way back up (at least 5 %).
                let up = (self.clean_at - cur).div_ceil(2).max(cur / 20);
                return (cur + up).min(self.clean_at);
            }
            self.clean_at = 0;
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
        if self.clean < CLEAN_WINDOWS {
            return cur;
        }
        self.clean = 0;
        self.clean_at = cur;
        let above_overrun = if self.overran_at > 0 {
            self.overran_at + self.nominal / 20
        } else {
            0
        };
        let bound = floor.max(self.nominal).max(above_overrun);
        if cur <= bound + self.nominal / 100 {
            // Settled: after a while, try without the overrun bound.
            self.settled += 1;
            if self.settled >= FORGET_AFTER {
                self.settled = 0;
                self.overran_at = 0;
            }
            return cur;
        }
        // A slow link measured over clean rotations: its floor at once.
        // Else (only the overrun length bounds it) half way, probing.
        let half = cur - (cur - bound) / 2;
        if slow || half - bound < self.nominal / 100 {
            bound
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
        // Twice the nominal, 3 % to spare.
        assert_eq!(e.slot_ns, 2060);
        // 2 ms ahead at 1 us slots: slot 50 + 2000.
        assert_eq!(e.from, 2050);
        assert_eq!(e.start_ns, 2_050_000);
        // Reports until a rotation of the new slots has passed speak of
        // the old ones: not counted.
        let quiet = 2_050_000 + 10 * 2060;
        assert_eq!(a.report(10, 10, 1024, 1, quiet - 1), None);
        // Still overrunning with no link slower than the slots allow and
        // no clean length to go back to: unchanged (jitter is not what
        // longer slots cure).
        for _ in 0..3 {
            assert_eq!(a.report(10, 10, 1024, 3, quiet), None);
        }
        // The slow link slower still: 5 % more than the slots if that is
        // more than its need.
        for _ in 0..2 {
            assert_eq!(a.report(10, 10, 1024, 3, quiet), None);
        }
        let e2 = a.report(10, 10, 2100, 3, quiet).expect("grows");
        assert_eq!(e2.slot_ns, 2163);
        assert!(e2.from > e.from);
        // Clean rotations with no slow link measured: after CLEAN_WINDOWS
        // of them, half way to 5 % above the longest length that overran.
        let clean = |a: &mut SlotAdapt| {
            let mut changed = None;
            for w in 0..CLEAN_WINDOWS {
                for r in 0..3 {
                    let got = a.report(100, 0, 1024, 3, 100_000_000);
                    if r < 2 || w + 1 < CLEAN_WINDOWS {
                        assert_eq!(got, None);
                    } else {
                        changed = got;
                    }
                }
            }
            changed
        };
        let bound = 2060 + 1000 / 20;
        let shrunk = clean(&mut a).expect("shrinks").slot_ns;
        assert_eq!(shrunk, 2163 - (2163 - bound) / 2);
        // A shrink that overruns goes half way back up.
        let back = a.report(100, 100, 1024, 1, 200_000_000).expect("back up");
        assert!(back.slot_ns > shrunk && back.slot_ns <= 2163, "{back:?}");
        assert_eq!(a.longest_ns, 2163);
    }

    #[test]
    fn a_slow_link_sets_a_floor_the_slots_go_to_and_stay_at() {
        let mut a = SlotAdapt::new(1000, 1);
        // In the start's overruns a slow link reads slower than it is.
        let e = a.report(10, 10, 3072, 1, 10_000).expect("grows");
        assert_eq!(e.slot_ns, 3090);
        // Clean rotations measure it at twice the nominal: its floor at
        // once, and there the slots stay.
        let mut now = 10_000_000;
        let mut last = None;
        for _ in 0..CLEAN_WINDOWS {
            last = a.report(100, 0, 2048, 1, now);
            now += 1_000_000;
        }
        assert_eq!(last.expect("shrinks to the floor").slot_ns, 2060);
        for _ in 0..(4 * CLEAN_WINDOWS * FORGET_AFTER) {
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
