//! A node's offset to the EM's clock, measured NTP-style over the
//! connection the node already has to the EM.
//!
//! The node sends `ClockProbe { sent: t1 }`; the EM answers at once with
//! `ClockReply { sent: t1, em_time: t2 }`; the reply arrives at t4. If the
//! two directions take as long, the EM's clock read `t2` at the node's
//! `(t1 + t4) / 2`: offset = t2 - (t1 + t4) / 2, wrong by at most half the
//! round trip. Of the last [`WINDOW`] answers the one with the shortest
//! round trip is kept (queueing only ever adds delay, so the fastest
//! answer is the least skewed). Probes go out in a quick burst at the
//! start, then every `interval`, so that clocks that drift apart (tens of
//! ppm on real hosts) are followed.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::bu::Nanos;

/// Spread of the probes of a burst: each waits up to this long after the
/// previous answer, so that the nodes' probes (all started together) do not
/// queue at the EM at the same instants.
const BURST_SPREAD_NS: Nanos = 20_000;

/// Answers kept; the shortest round trip among them wins.
pub const WINDOW: usize = 8;
/// Probes sent back to back when the clock is first measured: enough
/// that some of them find the EM's link quiet (at the start of a run the
/// EM sends its first assignments to every node at once).
pub const BURST: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    rtt: Nanos,
    offset: i64,
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
    samples: VecDeque<Sample>,
    interval: Nanos,
    next_probe: Option<Nanos>,
    /// Probes of the starting burst still to send.
    burst_left: u32,
    /// Sent, not answered: no second probe while one is out (the
    /// round trips would overlap and grow).
    outstanding: bool,
    estimate: Option<Sample>,
    /// Jitters the probe times (seeded per node: deterministic).
    rng: Pcg64Mcg,
    pub stats: ClockStats,
}

impl ClockSync {
    /// `seed` makes each node's probe times its own (and the run replay).
    pub fn new(interval: Nanos, seed: u64) -> ClockSync {
        ClockSync {
            rng: Pcg64Mcg::seed_from_u64(seed),
            samples: VecDeque::with_capacity(WINDOW),
            interval: interval.max(1),
            next_probe: None,
            burst_left: BURST,
            outstanding: false,
            estimate: None,
            stats: ClockStats::default(),
        }
    }

    /// Starts (or, after the EM came back, restarts) the measurement at
    /// `now`: what was measured against an earlier EM is forgotten.
    pub fn restart(&mut self, now: Nanos) {
        self.samples.clear();
        self.estimate = None;
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
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            rtt,
            offset: offset as i64,
        });
        let best = *self
            .samples
            .iter()
            .min_by_key(|s| s.rtt)
            .expect("just pushed one");
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
}
