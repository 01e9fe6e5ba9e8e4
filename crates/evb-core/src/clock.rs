//! A node's offset to the EM's clock, measured NTP-style over the
//! connection the node already has to the EM, and how fast it changes.
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
//! grows as the answer ages, by what is not known of the rate at which
//! the two clocks part: NTP's dispersion ([`DRIFT_PPM`]) and the skew's
//! own error. A new answer replaces the estimate only if its bound is
//! smaller than the aged bound of the one in use: a queued answer never
//! displaces a recent clean one, and a clean answer is kept until a
//! better one comes (a window of the last answers lost the clean ones of
//! the start within about 100 ms of a busy 16-host run, and the slots
//! slid apart).
//!
//! **Skew.** Two hosts' crystals run at rates up to 200 ppm apart when no
//! NTP or PTP disciplines them: 4 us in 20 ms, eight slot graces. The node
//! fits the rate at which its offset changes over its last [`HISTORY`]
//! clean answers (least squares), and once the fit shows a skew (beyond
//! its error) it takes the offset from that line, carried forward to the
//! time asked ([`ClockSync::offset_at`]). Until the skew is known to
//! [`SKEW_OK_PPB`] the probes go out every [`FAST_PROBE_NS`] rather than
//! every `interval`: a skew from answers 20 ms apart comes too late.
//!
//! Probes go out in a quick burst at the start, then as above. The node
//! sends them when its own fragment has left the link, and the EM answers
//! when its own has ([`crate::node::Node`]): that is what makes clean
//! answers common.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::bu::Nanos;

/// Spread of the probes of a burst: each waits up to this long after the
/// previous answer, so that the nodes' probes (all started together) do not
/// queue at the EM at the same instants.
const BURST_SPREAD_NS: Nanos = 20_000;

/// How fast an answer's error bound grows with its age once the skew is
/// known, in ns per ms (parts per million): NTP's figure (15 ppm) for the
/// rate difference of disciplined clocks.
pub const DRIFT_PPM: u64 = 15;
/// Probes sent back to back when the clock is first measured: enough
/// that some of them find the EM's link quiet (at the start of a run the
/// EM sends its first assignments to every node at once).
pub const BURST: u32 = 8;
/// The probe interval while the skew is not yet known to [`SKEW_OK_PPB`]:
/// at 200 ppm, 0.25 us of drift between two answers.
pub const FAST_PROBE_NS: Nanos = 1_250_000;
/// At most this many fast probes, then the configured interval whatever
/// the fit (a path so noisy that no clean answers come).
pub const FAST_PROBES: u32 = 48;
/// A skew known this exactly (ppb either way) ends the fast probes.
pub const SKEW_OK_PPB: u64 = 10_000;
/// Clean answers the skew is fitted over (the oldest go first): 32 of
/// them span 40 ms of fast probes, then 640 ms of the default interval.
pub const HISTORY: usize = 32;
/// An answer that queued at most this (half its round trip's excess over
/// the fastest) is clean enough to fit the skew by.
const CLEAN_NS: Nanos = 500;
/// The fit needs this many clean answers over this span at least.
const FIT_MIN_ANSWERS: usize = 8;
const FIT_MIN_SPAN_NS: Nanos = 4_000_000;
/// A slope within this many standard errors of 0 is no skew.
const SKEW_SIGMAS: f64 = 4.0;
/// The least spread the answers are taken to have, ns.
const MIN_SIGMA_NS: f64 = 5.0;
/// The skews a clock may have, ppb: 10 %, far beyond any crystal.
pub const MAX_SKEW_PPB: i64 = 100_000_000;

/// A least-squares line of offset (ns) against local time (ns).
#[derive(Debug, Clone, Copy)]
struct Fit {
    slope: f64,
    /// One standard error of the slope.
    slope_error: f64,
    /// The answers' spread about the line, ns.
    sigma: f64,
    /// The answers' mean time and offset: the line passes through them.
    at: f64,
    offset: f64,
    n: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    rtt: Nanos,
    offset: i64,
    /// When the answer came (this node's clock).
    at: Nanos,
}

impl Sample {
    /// Half this answer's queueing, given the fastest round trip seen.
    fn queued(&self, min_rtt: Nanos) -> Nanos {
        (self.rtt - min_rtt.min(self.rtt)) / 2
    }

    /// How far this answer may be off at `now`: half its queueing, plus
    /// its age's drift at `drift_ppb`.
    fn bound(&self, min_rtt: Nanos, now: Nanos, drift_ppb: u64) -> Nanos {
        let age = u128::from(now.saturating_sub(self.at));
        let drift = (age * u128::from(drift_ppb) / 1_000_000_000).min(u128::from(Nanos::MAX));
        self.queued(min_rtt).saturating_add(drift as Nanos)
    }
}

/// What a node knows of its offset to the EM's clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockStats {
    pub probes: u64,
    pub replies: u64,
    /// EM time minus this node's time, ns (the current estimate, at the
    /// last answer).
    pub offset_ns: i64,
    /// Half the round trip of the answer the estimate rests on: the
    /// estimate is within this of the truth if the path is symmetric.
    pub uncertainty_ns: Nanos,
    /// Largest change of the estimate from one answer to the next: how
    /// much the slots of this node moved.
    pub max_step_ns: Nanos,
    /// How much faster the EM's clock runs than this node's, parts per
    /// billion (0: none measured, or within its error).
    pub skew_ppb: i64,
    /// How far that skew may be off, ppb (`u64::MAX`: not fitted yet).
    pub skew_error_ppb: u64,
}

/// The offset measurement of one node.
#[derive(Debug, Clone)]
pub struct ClockSync {
    interval: Nanos,
    next_probe: Option<Nanos>,
    /// Probes of the starting burst still to send.
    burst_left: u32,
    /// Fast probes sent since the burst (while the skew is unknown).
    fast_sent: u32,
    /// Sent, not answered: no second probe while one is out (the
    /// round trips would overlap and grow).
    outstanding: bool,
    estimate: Option<Sample>,
    /// The clean answers the skew is fitted over, oldest first.
    history: VecDeque<Sample>,
    /// The line fitted through them at the last clean answer.
    line: Option<Fit>,
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
            fast_sent: 0,
            outstanding: false,
            estimate: None,
            history: VecDeque::with_capacity(HISTORY),
            line: None,
            min_rtt: Nanos::MAX,
            stats: ClockStats {
                skew_error_ppb: u64::MAX,
                ..ClockStats::default()
            },
        }
    }

    /// Starts (or, after the EM came back, restarts) the measurement at
    /// `now`: what was measured against an earlier EM is forgotten.
    pub fn restart(&mut self, now: Nanos) {
        self.estimate = None;
        self.history.clear();
        self.line = None;
        self.min_rtt = Nanos::MAX;
        self.burst_left = BURST;
        self.fast_sent = 0;
        self.outstanding = false;
        self.next_probe = Some(now);
        self.stats.skew_ppb = 0;
        self.stats.skew_error_ppb = u64::MAX;
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
        let before = self.estimate.map(|old| self.extrapolate(&old, now));
        self.learn_skew(sample);
        let drift = self.drift_ppb();
        let best = match (self.fitted(now), self.estimate) {
            // A skew shown: the line through every answer's interval.
            (Some(fit), _) => fit,
            (None, Some(old))
                if old.bound(self.min_rtt, now, drift) < sample.bound(self.min_rtt, now, drift) =>
            {
                old
            }
            _ => sample,
        };
        self.estimate = Some(best);
        let after = self.extrapolate(&best, now);
        if let Some(before) = before {
            self.stats.max_step_ns = self.stats.max_step_ns.max(before.abs_diff(after));
        }
        self.stats.offset_ns = after;
        self.stats.uncertainty_ns = best.rtt / 2;
        self.next_probe = Some(self.next_probe_after(now));
    }

    /// When the probe after an answer at `now` goes out: the burst's next
    /// soon; fast ones while the skew is not known well enough; then the
    /// interval, 0.5 to 1.5 of it (the nodes do not probe in step).
    fn next_probe_after(&mut self, now: Nanos) -> Nanos {
        if self.burst_left > 1 {
            self.burst_left -= 1;
            return now + self.rng.gen_range(0..BURST_SPREAD_NS);
        }
        self.burst_left = 0;
        let fast = FAST_PROBE_NS.min(self.interval);
        if self.stats.skew_error_ppb > SKEW_OK_PPB
            && self.fast_sent < FAST_PROBES
            && fast < self.interval
        {
            self.fast_sent += 1;
            return now + fast / 2 + self.rng.gen_range(0..fast);
        }
        now + self.interval / 2 + self.rng.gen_range(0..self.interval)
    }

    /// How fast an estimate ages, ppb: NTP's dispersion, and once the
    /// answers show a skew, what is not known of it. Until then the clocks are taken as disciplined: an answer aged
    /// at a crystal's unknown 200 ppm was displaced by queued ones during
    /// the fast probes and the slots of ideal clocks slid apart (72 nodes:
    /// 60 % of link).
    fn drift_ppb(&self) -> u64 {
        let unknown = if self.stats.skew_ppb == 0 {
            0
        } else {
            self.stats.skew_error_ppb
        };
        (DRIFT_PPM * 1000).saturating_add(unknown)
    }

    /// `s`'s offset carried forward to local time `now` at the skew.
    fn extrapolate(&self, s: &Sample, now: Nanos) -> i64 {
        let age = i128::from(now) - i128::from(s.at);
        let drift = age * i128::from(self.stats.skew_ppb) / 1_000_000_000;
        (i128::from(s.offset) + drift).clamp(i64::MIN.into(), i64::MAX.into()) as i64
    }

    /// Keeps `s` if it is clean and fits the skew anew: the least-squares
    /// line of offset against time through the clean answers (re-judged
    /// against the fastest round trip now known), its error
    /// [`SKEW_SIGMAS`] standard errors. A skew within its error is taken as
    /// none: disciplined clocks keep their offsets as they are. (Hard
    /// bounds from each answer's queueing were tried first: an answer's
    /// host latencies differ from message to message, answers 80 us apart
    /// then bounded the skew away from 0 for ideal clocks, and the slots
    /// of 163 nodes at 200 Gb/s slid apart.)
    fn learn_skew(&mut self, s: Sample) {
        if s.queued(self.min_rtt) > CLEAN_NS {
            return;
        }
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(s);
        self.line = self.fit();
        let Some(fit) = self.line else { return };
        let error = SKEW_SIGMAS * fit.slope_error;
        self.stats.skew_error_ppb = (error * 1e9).min(u64::MAX as f64) as u64;
        self.stats.skew_ppb = if fit.slope.abs() > error {
            (fit.slope * 1e9).clamp(-(MAX_SKEW_PPB as f64), MAX_SKEW_PPB as f64) as i64
        } else {
            0
        };
        debug_assert!(self.stats.skew_ppb.abs() <= MAX_SKEW_PPB);
    }

    /// The least-squares line through the clean answers kept, if there
    /// are enough of them over a long enough span.
    fn fit(&self) -> Option<Fit> {
        let min_rtt = self.min_rtt;
        let clean: Vec<&Sample> = self
            .history
            .iter()
            .filter(|x| x.queued(min_rtt) <= CLEAN_NS)
            .collect();
        let (first, last) = (clean.first()?, clean.last()?);
        if clean.len() < FIT_MIN_ANSWERS || last.at - first.at < FIT_MIN_SPAN_NS {
            return None;
        }
        // Relative to the first answer: exact in f64 over any run.
        let n = clean.len() as f64;
        let xs: Vec<f64> = clean.iter().map(|x| (x.at - first.at) as f64).collect();
        let ys: Vec<f64> = clean
            .iter()
            .map(|x| (x.offset - first.offset) as f64)
            .collect();
        let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
        let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
        let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        let slope = sxy / sxx;
        let residuals: f64 = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| (y - my - slope * (x - mx)).powi(2))
            .sum();
        // The answers' spread, at least a few ns (they are rounded to the
        // ns, and a few may happen to line up).
        let sigma = (residuals / (n - 2.0)).sqrt().max(MIN_SIGMA_NS);
        Some(Fit {
            slope,
            slope_error: sigma / sxx.sqrt(),
            sigma,
            at: first.at as f64 + mx,
            offset: first.offset as f64 + my,
            n,
        })
    }

    /// Once a skew is shown, the offset at `now` on the fitted line, as an
    /// answer whose bound is the line's error there.
    fn fitted(&self, now: Nanos) -> Option<Sample> {
        if self.stats.skew_ppb == 0 {
            return None;
        }
        let fit = self.line?;
        let dt = now as f64 - fit.at;
        let offset = fit.offset + fit.slope * dt;
        let error = fit.sigma / fit.n.sqrt() + fit.slope_error * dt.abs();
        Some(Sample {
            rtt: self.min_rtt.saturating_add(2 * error as Nanos),
            offset: offset.round() as i64,
            at: now,
        })
    }

    /// EM time minus local time at local time `now`, ns: the estimate
    /// carried forward at the measured skew (0 until the first answer).
    pub fn offset_at(&self, now: Nanos) -> i64 {
        self.estimate.map_or(0, |s| self.extrapolate(&s, now))
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

    /// The estimate's offset at the answer it rests on.
    fn offset(c: &ClockSync) -> i64 {
        c.estimate.map_or(0, |s| c.offset_at(s.at))
    }

    #[test]
    fn the_fastest_answer_sets_the_offset() {
        let mut c = ClockSync::new(10_000_000, 7);
        c.restart(0);
        // The EM's clock is 5000 ns ahead. A slow return path skews one
        // answer; the symmetric one with the shortest round trip wins.
        let em = |t: Nanos| t + 5000;
        let t1 = c.probe(0).unwrap();
        c.on_reply(t1, em(t1 + 100), t1 + 900); // 100 out, 800 back
        assert_eq!(offset(&c), 5000 + 100 - 450);
        let t1 = c.next_deadline().unwrap();
        assert!(t1 < 900 + BURST_SPREAD_NS, "burst: soon");
        assert_eq!(c.probe(t1), Some(t1));
        c.on_reply(t1, em(t1 + 200), t1 + 400); // symmetric, faster
        assert_eq!(offset(&c), 5000);
        assert_eq!(c.stats.uncertainty_ns, 200);
        let t1 = c.probe(c.next_deadline().unwrap()).unwrap();
        c.on_reply(t1, em(t1 + 500), t1 + 600); // skewed, slower
        assert_eq!(offset(&c), 5000, "a slower answer does not replace it");
        assert!(!c.is_settled(), "the burst is not over");
        let mut t = t1 + 600;
        for _ in 3..BURST {
            let t1 = c.probe(c.next_deadline().unwrap()).expect("burst");
            t = t1 + 600;
            c.on_reply(t1, em(t1 + 300), t);
        }
        assert!(c.is_settled());
        // The skew is not known yet: fast probes, not the interval.
        let next = c.next_deadline().unwrap();
        let fast = FAST_PROBE_NS;
        assert!((t + fast / 2..t + fast * 3 / 2).contains(&next), "{next}");
        assert!(c.probe(t + 1).is_none(), "not due yet");
    }

    /// Answers to `c` of the EM's clock `em` (of this node's time), each
    /// queued `out` on the way there and `back` on the way back, every
    /// `every` ns from `t` on; returns the time of the last.
    fn answers(
        c: &mut ClockSync,
        em: impl Fn(Nanos) -> Nanos,
        mut t: Nanos,
        until: Nanos,
        queued: impl Fn(u64) -> (Nanos, Nanos),
    ) -> Nanos {
        let mut k = 0;
        while t < until {
            let at = c.next_deadline().expect("a probe is due").max(t);
            let t1 = c.probe(at).expect("due");
            let (out, back) = queued(k);
            let t2 = t1 + 1000 + out;
            t = t2 + 1000 + back;
            c.on_reply(t1, em(t2), t);
            k += 1;
        }
        t
    }

    /// The EM's clock runs 100 ppm fast and a third of the answers queued
    /// up to 20 us one way or the other: the skew is found within the fast
    /// probes, and the estimate, carried forward at it, stays within a
    /// slot grace (0.5 us) up to the next answer; the offset of the last
    /// kept answer alone would be microseconds off.
    #[test]
    fn a_clock_running_fast_is_followed_at_its_skew() {
        let mut c = ClockSync::new(20_000_000, 7);
        c.restart(0);
        let em = |t: Nanos| t + 5000 + t / 10_000; // +100 ppm
        let queued = |k: u64| match k % 3 {
            0 => ((k * 7919) % 20_000, 0),
            1 => (0, (k * 104_729) % 20_000),
            _ => (k % 50, 0),
        };
        let t = answers(&mut c, em, 0, 60_000_000, queued);
        assert!(c.stats.skew_error_ppb <= SKEW_OK_PPB, "{:?}", c.stats);
        assert!(
            (90_000..=110_000).contains(&c.stats.skew_ppb),
            "{:?}",
            c.stats
        );
        let fast_probes = c.stats.probes;
        // On at the interval: 200 ms more, then 30 ms past the last answer.
        let t = answers(&mut c, em, t, t + 200_000_000, queued);
        assert!(c.stats.probes - fast_probes < 20, "{:?}", c.stats);
        let later = t + 30_000_000;
        let truth = i128::from(em(later)) - i128::from(later);
        let off = (i128::from(c.offset_at(later)) - truth).abs();
        assert!(off < 500, "{off} ns off, {:?}", c.stats);
        let unextrapolated = (i128::from(offset(&c)) - truth).abs();
        assert!(unextrapolated > 2_500, "{unextrapolated}");
    }

    /// Ideal clocks, answers queued as above: no skew is read into them,
    /// and the estimate is the clean answers' offset.
    #[test]
    fn no_skew_is_read_into_queued_answers() {
        let mut c = ClockSync::new(20_000_000, 7);
        c.restart(0);
        let em = |t: Nanos| t + 5000;
        let t = answers(&mut c, em, 0, 300_000_000, |k| match k % 3 {
            0 => ((k * 7919) % 20_000, 0),
            1 => (0, (k * 104_729) % 20_000),
            _ => (k % 50, 0),
        });
        assert_eq!(c.stats.skew_ppb, 0, "{:?}", c.stats);
        assert!(c.stats.skew_error_ppb <= SKEW_OK_PPB, "{:?}", c.stats);
        assert!((c.offset_at(t) - 5000).abs() <= 25, "{:?}", c.stats);
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
        assert_eq!(offset(&c), 5000);
        // 40 us later, one that waited 80 us on its way out (off by 40 us).
        let t = answer(&mut c, t + 40_000, 81_000, 1000);
        assert_eq!(offset(&c), 5000, "the queued answer is not used");
        // 1 ms on, one 0.2 us slower than the clean one: its bound (0.1 us)
        // is below the clean one's aged bound? Not yet (1 ms x 15 ppm = 15 ns).
        let t = answer(&mut c, t + 1_000_000, 1100, 1100);
        assert_eq!(offset(&c), 5000, "the clean one is still the best");
        // 100 ms on (1.5 us of drift allowed), the same slightly slower
        // answer, now with its own small skew, replaces it.
        let t = answer(&mut c, t + 100_000_000, 1200, 1000);
        assert_eq!(offset(&c), 5000 + 100, "a fresh, nearly clean answer wins");
        // Whatever the age, an answer that queued 80 us does not come in
        // while a fresher clean one is there.
        answer(&mut c, t + 10_000, 1000, 81_000);
        assert_eq!(offset(&c), 5000 + 100);
        assert_eq!(c.stats.replies, 5);
    }
}
