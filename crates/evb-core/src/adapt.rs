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
//! reported, on at least [`MIN_SERVED_PER_RU`] fragments each, the EM
//! decides ([`SlotAdapt::decide`]): more than [`GROW_ABOVE`] of the
//! fragments overran, the slot grows, to what the slowest link needs, at
//! most twice as long a window, and goes back if the overruns did not
//! halve (they were jitter, not the slots' length); with almost none, it
//! shrinks: straight to a slow link's need after one such rotation, else
//! half way back to the nominal length after [`CLEAN_WINDOWS`], never to a
//! length a shrink found to overrun. A change takes effect [`LEAD_NS`]
//! ahead, from a slot every RU has yet to reach (`SlotLength`), so that
//! all RUs switch at the same slot, and the reports of the next rotation,
//! about slots before it, are not counted.
//!
//! Measured (`bench/eb-perturb.sh`, 72 nodes, 300 ms, one host cable
//! slower than the fabric file says): the build keeps 0.95-0.97 of the
//! proportional figure at 96, 80, 64 and 50 Gb/s (docs/sim.md); the rule
//! before (half way back after 8 clean rotations, jitter never told from
//! a misfit) kept 0.75 at 96 and 0.65 at 80 Gb/s.
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
pub const CLEAN_WINDOWS: u32 = 3;
/// Windows a length found too short, or overruns found not to be the
/// slots' doing, are remembered.
pub const JITTER_HOLD: u32 = 16;
/// Windows whose slowest link's stretch the slots follow (their median).
pub const RECENT_WINDOWS: usize = 3;
/// A window is decided on once its reports cover this many fragments per
/// RU (before, a host's start-up hiccup in a handful of fragments could
/// set the slots for the run).
pub const MIN_SERVED_PER_RU: u64 = 8;
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

/// A change of the slot length whose effect the next window shows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Change {
    #[default]
    None,
    Grew {
        from: Nanos,
        fraction: f64,
    },
    Shrunk {
        from: Nanos,
    },
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
    /// The last windows' stretch (the slowest link's), oldest first.
    recent: Vec<u64>,
    /// Clean windows in a row.
    clean: u32,
    /// The last change, judged by the window after it.
    change: Change,
    /// The longest length a shrink found to overrun (0: none known).
    too_short: Nanos,
    /// Windows left before `too_short` is forgotten and overruns alone may
    /// grow the slots again after a growth that did not pay.
    hold: u32,
    /// The last growth did not pay.
    jitter: bool,
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
            recent: Vec::with_capacity(RECENT_WINDOWS),
            clean: 0,
            change: Change::None,
            too_short: 0,
            hold: 0,
            jitter: false,
            changes: 0,
            longest_ns: nominal.max(1),
        }
    }

    /// The slot length a window's reports call for.
    ///
    /// The slowest RU's link sets a floor: the nominal slot stretched as
    /// that link's fragments are (the median of the last
    /// [`RECENT_WINDOWS`] windows), 10 % to spare.
    ///
    /// Too many overruns: the slots grow, to the floor, at least 5 %
    /// (without a slow link measured, only once a shrink has overrun). A
    /// growth must pay: if the next window's overruns are not at most half
    /// of those that caused it, they are not the slots' doing (host jitter,
    /// a clock off, a burst of control messages: measured under `evb run`,
    /// growing for them took 2 nodes over shm from 307 to 100 Gb/s), the
    /// slots go back, and overruns alone grow them no more for
    /// [`JITTER_HOLD`] windows.
    ///
    /// A clean window (almost no overrun) with a slow link: straight down
    /// to its floor. Without one, [`CLEAN_WINDOWS`] in a row: half way
    /// back towards the nominal. Never to a length that a shrink has
    /// already shown to overrun (`too_short`, forgotten after
    /// [`JITTER_HOLD`] windows); a shrink that overruns goes back to the
    /// length before it at once. So the slots close in on the shortest
    /// length that holds, as a fraction of a slow link's rate costs that
    /// fraction of the rate, not a collapse.
    fn decide(&mut self, w: &Window) -> Nanos {
        let cur = self.epoch.slot_ns;
        if w.served == 0 {
            return cur;
        }
        let max = MAX_STRETCH * self.nominal;
        if self.recent.len() == RECENT_WINDOWS {
            self.recent.remove(0);
        }
        self.recent.push(w.stretch.max(1024));
        let mut sorted = self.recent.clone();
        sorted.sort_unstable();
        // The median; of two, the lesser.
        let stretch = sorted[(sorted.len() - 1) / 2];
        let floor = if stretch > SLOW_LINK_ABOVE {
            let stretched = self.nominal.saturating_mul(stretch) / 1024;
            (stretched + stretched / 10).clamp(self.nominal, max)
        } else {
            self.nominal
        };
        let slow = floor > self.nominal;
        self.hold = self.hold.saturating_sub(1);
        if self.hold == 0 {
            self.too_short = 0;
        }
        let fraction = w.overran as f64 / w.served as f64;
        let change = std::mem::take(&mut self.change);
        if fraction > GROW_ABOVE {
            self.clean = 0;
            match change {
                // A shrink that overran: back, and no lower than this.
                Change::Shrunk { from } => {
                    self.too_short = self.too_short.max(cur);
                    self.hold = JITTER_HOLD;
                    return from.max(floor);
                }
                // A growth that did not halve the overruns: back.
                Change::Grew {
                    from,
                    fraction: before,
                } if fraction > before / 2.0 => {
                    self.hold = JITTER_HOLD;
                    self.jitter = true;
                    return from.max(floor);
                }
                _ => {}
            }
            // Overruns with no slow link measured grow the slots only
            // where a shrink has shown that their length matters (else
            // they are the start's, or jitter: measured, growing for the
            // start's overruns lengthened the rate-aware slots of a fabric
            // of mixed rates for good); with one, beyond its need too (a
            // half-rate link on 24 nodes still overran 1-4 % of the
            // fragments at its need and 10 %). Never while a growth that
            // did not pay is remembered.
            if floor <= cur && ((self.jitter && self.hold > 0) || (!slow && self.too_short == 0)) {
                return cur;
            }
            self.jitter = false;
            // At most twice as long a window: one window's figure may be a
            // host's start-up hiccup (measured under `evb run` over shm:
            // 14 times the nominal in the first window, nothing like it
            // after).
            let next = (cur + cur / 20).max(floor).min(2 * cur).min(max);
            if next > cur {
                self.change = Change::Grew {
                    from: cur,
                    fraction,
                };
            }
            return next;
        }
        if fraction >= CLEAN_BELOW {
            self.clean = 0;
            return cur.max(floor);
        }
        self.clean += 1;
        if floor > cur {
            return floor;
        }
        // A slow link's measured need is a length that holds: one clean
        // window is enough to go to it. Towards the nominal, which may not
        // hold, CLEAN_WINDOWS.
        if self.clean < CLEAN_WINDOWS && !slow {
            return cur;
        }
        self.clean = 0;
        let target = floor.max(self.too_short + self.too_short / 50);
        if target >= cur {
            return cur;
        }
        // Straight to a slow link's need; else half way.
        let half = cur - (cur - target) / 2;
        let next = if slow || half - target < self.nominal / 100 {
            target
        } else {
            half
        };
        // A step of less than 3 % gains less than the overrun it risks.
        if cur - next < cur / 32 {
            return cur;
        }
        self.change = Change::Shrunk { from: cur };
        next
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
        if w.reports < live_rus.max(1) || w.served < MIN_SERVED_PER_RU * live_rus.max(1) as u64 {
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

    /// Later than a change's lead and a rotation of 1 us slots.
    const STEP: Nanos = 10_000_000;

    /// Clean windows of one RU, no slow link, until the slots shrink (at
    /// most `2 + CLEAN_WINDOWS`: the median forgets a slow link in two).
    fn clean_until_shrunk(a: &mut SlotAdapt, now: &mut Nanos) -> Option<SlotEpoch> {
        for _ in 0..(2 + CLEAN_WINDOWS) {
            *now += STEP;
            if let Some(e) = a.report(100, 0, 1024, 1, *now) {
                return Some(e);
            }
        }
        None
    }

    /// A window of `live` reports alike at `now`; the change it makes.
    fn window(
        a: &mut SlotAdapt,
        live: usize,
        served: u32,
        overran: u32,
        stretch: u32,
        now: Nanos,
    ) -> Option<SlotEpoch> {
        let mut got = None;
        for r in 0..live {
            let e = a.report(served, overran, stretch, live, now);
            if r + 1 < live {
                assert_eq!(e, None, "decided before every RU reported");
            }
            got = e;
        }
        got
    }

    #[test]
    fn overruns_lengthen_the_slots_from_a_slot_ahead_and_clean_rotations_shorten_them() {
        let mut a = SlotAdapt::new(1000, 10);
        // The first two rotations (20 slots) are not counted.
        assert_eq!(a.report(100, 100, 2048, 1, 19_999), None);
        // Three RUs, one of them on a link at half the rate, overrunning.
        assert_eq!(a.report(100, 0, 1024, 3, 50_000), None);
        assert_eq!(a.report(100, 0, 1030, 3, 50_000), None);
        let e = a.report(100, 100, 2048, 3, 50_000).expect("grows");
        // Twice the nominal (what the window allows at most), not the
        // 2200 the slow link needs with 10 % to spare.
        assert_eq!(e.slot_ns, 2000);
        // 2 ms ahead at 1 us slots: slot 50 + 2000.
        assert_eq!(e.from, 2050);
        assert_eq!(e.start_ns, 2_050_000);
        // Reports until a rotation of the new slots has passed speak of
        // the old ones: not counted.
        let quiet = 2_050_000 + 10 * 2000;
        assert_eq!(a.report(10, 10, 1024, 1, quiet - 1), None);
        // Fewer overruns (a half), the link still slow: to its need.
        let e2 = window(&mut a, 3, 100, 30, 2048, quiet).expect("grows");
        assert_eq!(e2.slot_ns, 2200);
        assert!(e2.from > e.from);
        // Clean rotations with the link at 1.5 times the nominal: straight
        // to its need (10 % to spare) once the median of the recent
        // windows says so, the second of them (the first still has two
        // windows of 2048 beside it).
        let later = 100_000_000;
        assert_eq!(window(&mut a, 3, 100, 0, 1536, later), None);
        let shrunk = window(&mut a, 3, 100, 0, 1536, later);
        assert_eq!(shrunk.expect("shrinks").slot_ns, 1650);
        assert_eq!(a.changes, 3);
        assert_eq!(a.longest_ns, 2200);
    }

    #[test]
    fn a_slow_link_sets_a_floor_the_slots_do_not_shrink_below() {
        let mut a = SlotAdapt::new(1000, 1);
        let e = a.report(10, 10, 2048, 1, 10_000).expect("grows");
        assert_eq!(e.slot_ns, 2000);
        let mut now = 10_000_000;
        // Still overrunning: the need (2200) is more, and the growth paid.
        let e = a.report(10, 2, 2048, 1, now).expect("grows");
        assert_eq!(e.slot_ns, 2200);
        for _ in 0..(4 * CLEAN_WINDOWS) {
            now += 1_000_000;
            assert_eq!(a.report(100, 0, 2048, 1, now), None, "the floor holds");
        }
    }

    #[test]
    fn overruns_without_a_slow_link_grow_nothing_until_a_shrink_overran() {
        // The start's overruns, no link slower than the slots allow.
        let mut a = SlotAdapt::new(1000, 1);
        let mut now = 10_000;
        for _ in 0..4 {
            assert_eq!(a.report(100, 33, 1024, 1, now), None);
            now += STEP;
        }
    }

    #[test]
    fn a_growth_the_overruns_do_not_follow_is_taken_back() {
        let mut a = SlotAdapt::new(1000, 1);
        let mut now = 10_000;
        // A slow link (twice the nominal): 2000, then its need, 2200.
        assert_eq!(
            a.report(100, 90, 2048, 1, now).expect("grows").slot_ns,
            2000
        );
        now += STEP;
        assert_eq!(
            a.report(100, 30, 2048, 1, now).expect("grows").slot_ns,
            2200
        );
        // It is gone (the median follows after two windows); clean
        // rotations: half way back after CLEAN_WINDOWS.
        let shrunk = clean_until_shrunk(&mut a, &mut now);
        assert_eq!(shrunk.expect("half way").slot_ns, 1600);
        // The shrink overran: back to 2200, and 1600 is known too short.
        now += STEP;
        assert_eq!(a.report(100, 30, 1024, 1, now).expect("back").slot_ns, 2200);
        // Host jitter now: a third of the fragments overrun whatever the
        // slots. A growth (the length has been seen to matter) that does
        // not halve them is taken back.
        now += STEP;
        assert_eq!(
            a.report(100, 33, 1024, 1, now).expect("grows").slot_ns,
            2310
        );
        now += STEP;
        assert_eq!(a.report(100, 30, 1024, 1, now).expect("back").slot_ns, 2200);
        // Overruns alone grow them no more for a while.
        for _ in 0..(JITTER_HOLD - 4) {
            now += STEP;
            assert_eq!(a.report(100, 33, 1024, 1, now), None);
        }
        // A slow link still does, once the median of the recent windows
        // says so (one window's figure is not enough).
        now += STEP;
        assert_eq!(a.report(100, 33, 3072, 1, now), None);
        now += STEP;
        let e = a.report(100, 33, 3072, 1, now).expect("a slow link");
        assert_eq!(e.slot_ns, 3300);
    }

    #[test]
    fn a_shrink_that_overruns_goes_back_and_is_not_tried_again() {
        let mut a = SlotAdapt::new(1000, 1);
        let mut now = 10_000;
        // A link 5 % slow: 1049 x 1.1 = 1153 with its spare.
        assert_eq!(
            a.report(100, 90, 1075, 1, now).expect("grows").slot_ns,
            1153
        );
        // It speeds up (its need is gone): after CLEAN_WINDOWS clean
        // windows with the median at the nominal, half way (1077).
        let shrunk = clean_until_shrunk(&mut a, &mut now);
        assert_eq!(shrunk.expect("half way back").slot_ns, 1077);
        // It overran: back to 1153 at once.
        now += STEP;
        let e = a.report(100, 20, 1024, 1, now).expect("back");
        assert_eq!(e.slot_ns, 1153);
        // Clean again: 1076 overran, so never that low again.
        let mut steps = Vec::new();
        for _ in 0..(4 * CLEAN_WINDOWS) {
            now += STEP;
            if let Some(e) = a.report(100, 0, 1024, 1, now) {
                steps.push(e.slot_ns);
            }
        }
        assert!(steps.iter().all(|&s| s > 1077), "{steps:?}");
    }

    #[test]
    fn a_few_overruns_change_nothing() {
        let mut a = SlotAdapt::new(1000, 10);
        // 0.5 % of the fragments overran: neither grow nor clean.
        for _ in 0..(CLEAN_WINDOWS * 4) {
            assert_eq!(a.report(1000, 5, 1024, 1, 10_000), None);
        }
        assert_eq!(a.epoch().slot_ns, 1000);
    }

    #[test]
    fn a_window_of_a_handful_of_fragments_waits_for_more() {
        let mut a = SlotAdapt::new(1000, 1);
        // Two RUs, 3 fragments each, all overrunning 14 times: not yet.
        assert_eq!(window(&mut a, 2, 3, 3, 14 * 1024, 10_000), None);
        // With more (at least MIN_SERVED_PER_RU each in all), decided on
        // all of them, and at most twice as long.
        let e = window(&mut a, 2, 8, 8, 14 * 1024, 10_000).expect("grows");
        assert_eq!(e.slot_ns, 2000);
    }
}
