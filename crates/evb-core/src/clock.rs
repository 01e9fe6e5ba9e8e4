//! A node's offset to the EM's clock, measured NTP-style over the
//! connection the node already has to the EM.
//!
//! The node sends `ClockProbe { sent: t1 }`; the EM answers at once with
//! `ClockReply { sent: t1, em_time: t2 }`; the reply arrives at t4. If the
//! two directions take as long, the EM's clock read `t2` at the node's
//! `(t1 + t4) / 2`: offset = t2 - (t1 + t4) / 2.
//!
//! An answer is wrong by half the difference of the two directions'
//! queueing. At line rate one direction may wait behind a whole fragment
//! (tens of microseconds) while the slot grace is 0.5 us, so which
//! answer the estimate rests on decides everything. The shortest round
//! trip seen, `min_rtt`, is the path without queueing; an answer whose
//! round trip exceeds it by `e` is off by at most `e / 2`. That bound
//! grows as the answer ages, by [`DRIFT_PPM`] of its age (two hosts'
//! clocks run at slightly different rates: NTP's dispersion). A new
//! answer replaces the estimate only if its bound is smaller than the
//! aged bound of the one in use: a queued answer never displaces a
//! recent clean one, and a clean answer, however old, is kept until a
//! better one comes (a window of the last answers lost the clean ones of
//! the start within about 100 ms of a busy 16-host run, and the slots
//! slid apart). Probes go out in a quick burst at the start, then every
//! `interval`; the node sends them when its own link is free
//! ([`crate::node::Node`]), which is what makes clean answers common.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::bu::Nanos;

/// Spread of the probes of a burst: each waits up to this long after the
/// previous answer, so that the nodes' probes (all started together) do not
/// queue at the EM at the same instants.
const BURST_SPREAD_NS: Nanos = 20_000;

/// How fast an answer's error bound grows with its age, in ns per ms
/// (parts per million): the rate difference allowed between two hosts'
/// clocks, NTP's figure (15 ppm) for disciplined clocks.
pub const DRIFT_PPM: u64 = 15;
/// Probes sent back to back when the clock is first measured: enough
/// that some of them find the EM's link quiet (at the start of a run the
/// EM sends its first assignments to every node at once).
pub const BURST: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    rtt: Nanos,
    offset: i64,
    /// When the answer came (this node's clock).
    at: Nanos,
}

impl Sample {
    /// How far this answer may be off at `now`, given the fastest round
    /// trip seen: half its queueing, plus its age's drift.
    fn bound(&self, min_rtt: Nanos, now: Nanos) -> Nanos {
        (self.rtt - min_rtt.min(self.rtt)) / 2 + now.saturating_sub(self.at) * DRIFT_PPM / 1_000_000
    }
}

/// What a node knows of its offset to the EM's clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockStats {
    pub probes: u64,
    pub replies: u64,
    /// EM time minus this node's time, ns (the current estimate).
    pub offset_ns: i64,
    /// Half the round trip of the answer the estimate rests on: the
    /// estimate is within this of the truth if the path is symmetric.
    pub uncertainty_ns: Nanos,
    /// Largest change of the estimate from one answer to the next: how
    /// much the slots of this node moved.
    pub max_step_ns: Nanos,
}

/// The offset measurement of one node.
#[derive(Debug, Clone)]
pub struct ClockSync {
    interval: Nanos,
    next_probe: Option<Nanos>,
    /// Probes of the starting burst still to send.
    burst_left: u32,
    /// Sent, not answered: no second probe while one is out (the
    /// round trips would overlap and grow).
    outstanding: bool,
    estimate: Option<Sample>,
    /// The shortest round trip since the (re)start: the path unqueued.
    min_rtt: Nanos,
    /// Jitters the probe times (seeded per node: deterministic).
    rng: Pcg64Mcg,
    pub stats: ClockStats,
}

impl ClockSync {
    /// `seed` makes each node's probe times its own (and the run replay).
    pub fn new(interval: Nanos, seed: u64) -> ClockSync {
        ClockSync {
            rng: Pcg64Mcg::seed_from_u64(seed),
            interval: interval.max(1),
            next_probe: None,
            burst_left: BURST,
            outstanding: false,
            estimate: None,
            min_rtt: Nanos::MAX,
            stats: ClockStats::default(),
        }
    }

    /// Starts (or, after the EM came back, restarts) the measurement at
    /// `now`: what was measured against an earlier EM is forgotten.
    pub fn restart(&mut self, now: Nanos) {
        self.estimate = None;
        self.min_rtt = Nanos::MAX;
        self.burst_left = BURST;
        self.outstanding = false;
        self.next_probe = Some(now);
    }

    /// When the next probe is due.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.next_probe.filter(|_| !self.outstanding)
    }

    /// A probe is due at `now`: the time to send in it, if one goes out.
    pub fn probe(&mut self, now: Nanos) -> Option<Nanos> {
        if self.outstanding || self.next_probe.is_none_or(|t| now < t) {
            return None;
        }
        self.outstanding = true;
        self.next_probe = None;
        self.stats.probes += 1;
        Some(now)
    }

    /// The EM answered the probe sent at `sent` with its time `em_time`;
    /// this node's clock reads `now`.
    pub fn on_reply(&mut self, sent: Nanos, em_time: Nanos, now: Nanos) {
        if !self.outstanding || sent > now {
            return; // Not ours, or from before a restart: ignored.
        }
        self.outstanding = false;
        self.stats.replies += 1;
        let rtt = now - sent;
        let midpoint = i128::from(sent) + i128::from(rtt / 2);
        let offset = (i128::from(em_time) - midpoint).clamp(i64::MIN.into(), i64::MAX.into());
        self.min_rtt = self.min_rtt.min(rtt);
        let sample = Sample {
            rtt,
            offset: offset as i64,
            at: now,
        };
        let best = match self.estimate {
            Some(old) if old.bound(self.min_rtt, now) < sample.bound(self.min_rtt, now) => old,
            _ => sample,
        };
        if let Some(old) = self.estimate {
            self.stats.max_step_ns = self.stats.max_step_ns.max(old.offset.abs_diff(best.offset));
        }
        self.estimate = Some(best);
        self.stats.offset_ns = best.offset;
        self.stats.uncertainty_ns = best.rtt / 2;
        self.next_probe = Some(if self.burst_left > 1 {
            self.burst_left -= 1;
            now + self.rng.gen_range(0..BURST_SPREAD_NS)
        } else {
            self.burst_left = 0;
            // 0.5 to 1.5 intervals: the nodes do not probe in step.
            now + self.interval / 2 + self.rng.gen_range(0..self.interval)
        });
    }

    /// EM time minus local time, ns (0 until the first answer).
    pub fn offset(&self) -> i64 {
        self.estimate.map_or(0, |s| s.offset)
    }

    /// Whether an answer has come yet.
    pub fn is_measured(&self) -> bool {
        self.estimate.is_some()
    }

    /// The starting burst is answered: the estimate rests on the fastest
    /// of its answers and may be used.
    pub fn is_settled(&self) -> bool {
        self.estimate.is_some() && self.burst_left == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fastest_answer_sets_the_offset() {
        let mut c = ClockSync::new(10_000_000, 7);
        c.restart(0);
        // The EM's clock is 5000 ns ahead. A slow return path skews one
        // answer; the symmetric one with the shortest round trip wins.
        let em = |t: Nanos| t + 5000;
        let t1 = c.probe(0).unwrap();
        c.on_reply(t1, em(t1 + 100), t1 + 900); // 100 out, 800 back
        assert_eq!(c.offset(), 5000 + 100 - 450);
        let t1 = c.next_deadline().unwrap();
        assert!(t1 < 900 + BURST_SPREAD_NS, "burst: soon");
        assert_eq!(c.probe(t1), Some(t1));
        c.on_reply(t1, em(t1 + 200), t1 + 400); // symmetric, faster
        assert_eq!(c.offset(), 5000);
        assert_eq!(c.stats.uncertainty_ns, 200);
        let t1 = c.probe(c.next_deadline().unwrap()).unwrap();
        c.on_reply(t1, em(t1 + 500), t1 + 600); // skewed, slower
        assert_eq!(c.offset(), 5000, "a slower answer does not replace it");
        assert!(!c.is_settled(), "the burst is not over");
        let mut t = t1 + 600;
        for _ in 3..BURST {
            let t1 = c.probe(c.next_deadline().unwrap()).expect("burst");
            t = t1 + 600;
            c.on_reply(t1, em(t1 + 300), t);
        }
        assert!(c.is_settled());
        let next = c.next_deadline().unwrap();
        assert!((t + 5_000_000..t + 15_000_000).contains(&next), "{next}");
        assert!(c.probe(t + 1).is_none(), "not due yet");
    }

    #[test]
    fn one_probe_at_a_time_and_stray_answers_are_ignored() {
        let mut c = ClockSync::new(1000, 7);
        c.restart(0);
        assert!(c.probe(0).is_some());
        assert!(c.probe(0).is_none(), "one outstanding");
        c.on_reply(50, 10, 20); // sent after now: not ours
        assert!(!c.is_measured());
        c.restart(100);
        c.on_reply(0, 10, 200); // answer to a probe before the restart
        assert!(!c.is_measured());
    }

    /// Answers that queued (in one direction only: the skew) against one
    /// clean answer, the EM 5 us ahead.
    #[test]
    fn a_queued_answer_never_displaces_a_clean_one_until_it_has_aged() {
        let mut c = ClockSync::new(20_000_000, 7);
        c.restart(0);
        let em = |t: Nanos| t + 5000;
        let answer = |c: &mut ClockSync, at: Nanos, out: Nanos, back: Nanos| {
            let t1 = c.probe(at).expect("due");
            c.on_reply(t1, em(t1 + out), t1 + out + back);
            t1 + out + back
        };
        // The clean one: 1 us each way.
        let t = answer(&mut c, 0, 1000, 1000);
        assert_eq!(c.offset(), 5000);
        // 40 us later, one that waited 80 us on its way out (off by 40 us).
        let t = answer(&mut c, t + 40_000, 81_000, 1000);
        assert_eq!(c.offset(), 5000, "the queued answer is not used");
        // 1 ms on, one 0.2 us slower than the clean one: its bound (0.1 us)
        // is below the clean one's aged bound? Not yet (1 ms x 15 ppm = 15 ns).
        let t = answer(&mut c, t + 1_000_000, 1100, 1100);
        assert_eq!(c.offset(), 5000, "the clean one is still the best");
        // 100 ms on (1.5 us of drift allowed), the same slightly slower
        // answer, now with its own small skew, replaces it.
        let t = answer(&mut c, t + 100_000_000, 1200, 1000);
        assert_eq!(c.offset(), 5000 + 100, "a fresh, nearly clean answer wins");
        // Whatever the age, an answer that queued 80 us does not come in
        // while a fresher clean one is there.
        answer(&mut c, t + 10_000, 1000, 81_000);
        assert_eq!(c.offset(), 5000 + 100);
        assert_eq!(c.stats.replies, 5);
    }
}
