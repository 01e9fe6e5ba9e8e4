//! Steady-state figures from a time series: what a simulated throughput
//! is worth.
//!
//! A run starts empty and takes a while to fill (credits, first batches,
//! the first rotation of the barrel): that warm-up is left out. What
//! remains is cut into `k` consecutive batches; their means are close to
//! independent when a batch is much longer than the system's memory (a few
//! rotations), so the mean of the batch means comes with a Student-t
//! confidence interval (the method of batch means). The drift compares the
//! second quarter of the run with the last: a figure that still moves
//! between them is not a steady state.

use serde::{Deserialize, Serialize};

/// A steady-state mean with its 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Steady {
    pub mean: f64,
    /// Half width of the 95 % confidence interval of `mean`.
    pub ci95: f64,
    /// Batches the interval rests on (0: too few samples for one).
    pub batches: usize,
    /// Where the steady window starts and ends (ps), once known (the
    /// callers that know the sample interval set them; `to_ps` 0: unknown).
    #[serde(default)]
    pub from_ps: u64,
    #[serde(default)]
    pub to_ps: u64,
}

/// Batch means wanted over a steady window.
pub const BATCHES: usize = 10;

/// Two-sided 95 % quantile of Student's t with `df` degrees of freedom.
pub fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.96,
    }
}

/// Mean and 95 % interval of independent values (replications, or batch
/// means).
pub fn mean_ci(values: &[f64]) -> Steady {
    let n = values.len();
    if n == 0 {
        return Steady {
            mean: 0.0,
            ci95: 0.0,
            batches: 0,
            from_ps: 0,
            to_ps: 0,
        };
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let ci95 = if n < 2 {
        f64::INFINITY
    } else {
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        t975(n - 1) * (var / n as f64).sqrt()
    };
    Steady {
        mean,
        ci95,
        batches: n,
        from_ps: 0,
        to_ps: 0,
    }
}

/// The steady-state mean of `series[first..]` by the method of batch
/// means: at most [`BATCHES`] batches of equal length (the samples left
/// over at the start of the window are dropped with the warm-up).
pub fn batch_means(series: &[f64], first: usize) -> Steady {
    let window = series.get(first..).unwrap_or(&[]);
    let k = BATCHES.min(window.len());
    if k == 0 {
        return mean_ci(&[]);
    }
    let len = window.len() / k;
    let skip = window.len() - k * len;
    let means: Vec<f64> = window[skip..]
        .chunks(len)
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect();
    mean_ci(&means)
}

/// How `k` whole rotations are cut into batches of equal length: the
/// most batches (at most [`BATCHES`], at least 5 when there are 5
/// rotations or more) that leave at most a tenth of the rotations over,
/// else the count that leaves the fewest; and the rotations per batch.
/// The rotations left over (fewer than the batches) go with the warm-up.
pub fn rotation_batches(k: usize) -> (usize, usize) {
    if k == 0 {
        return (0, 0);
    }
    let counts = k.min(5)..=k.min(BATCHES);
    let batches = counts
        .clone()
        .rev()
        .find(|&b| (k % b) * 10 <= k)
        .or_else(|| counts.min_by_key(|&b| (k % b, usize::MAX - b)))
        .expect("at least one count");
    (batches, k / batches)
}

/// Batch means over whole periods of a periodic schedule (a slotted
/// barrel's rotation, `period` ps), the series sampled every `sample` ps:
/// a window that cuts a rotation counts some of its slots and not others,
/// which for a schedule whose slots are not all alike (extra slots of a
/// conflict-aware schedule) swings the figure. The window starts at the
/// first rotation boundary after `warmup` and holds whole rotations, cut
/// into equal batches by [`rotation_batches`] (the few rotations left over
/// go with the warm-up); with fewer than two rotations, plain batch means.
pub fn batch_means_periodic(series: &[f64], warmup: u64, period: u64, sample: u64) -> Steady {
    let at = |t: u64| ((t as f64 / sample.max(1) as f64).round() as usize).min(series.len());
    let end = series.len() as u64 * sample;
    let start = warmup.div_ceil(period.max(1)) * period;
    let k = if period == 0 || start >= end {
        0
    } else {
        ((end - start) / period) as usize
    };
    if k < 2 {
        let first = warmup.div_ceil(sample.max(1));
        let mut st = batch_means(series, first as usize);
        st.from_ps = first * sample;
        st.to_ps = end;
        return st;
    }
    let (batches, per) = rotation_batches(k);
    // Extra rotations (fewer than the batches) go with the warm-up.
    let first = start + (k - batches * per) as u64 * period;
    let means: Vec<f64> = (0..batches)
        .map(|j| {
            let a = at(first + (j * per) as u64 * period);
            let b = at(first + ((j + 1) * per) as u64 * period);
            let s = &series[a..b.max(a + 1).min(series.len())];
            s.iter().sum::<f64>() / s.len().max(1) as f64
        })
        .collect();
    Steady {
        from_ps: first,
        to_ps: first + (batches * per) as u64 * period,
        ..mean_ci(&means)
    }
}

/// The drift over whole periods: the first whole rotation that starts in
/// the second quarter of the run against the last whole rotation, which
/// must come after it (a rotation's batches complete in bursts, so a
/// window that cuts rotations would swing); 0 when the run holds no two
/// such rotations (no evidence either way: `summary.eb.steady` tells a
/// run too short), plain [`drift`] without a period.
pub fn drift_periodic(series: &[f64], period: u64, sample: u64) -> f64 {
    if period == 0 {
        return drift(series);
    }
    let end = series.len() as u64 * sample;
    let at = |t: u64| ((t as f64 / sample.max(1) as f64).round() as usize).min(series.len());
    let mean = |from: u64| {
        let s = &series[at(from)..at(from + period)];
        s.iter().sum::<f64>() / s.len().max(1) as f64
    };
    let early = (end / 4).div_ceil(period) * period;
    let late = (end / period).saturating_sub(1) * period;
    if late < early + period {
        return 0.0;
    }
    let (q2, q4) = (mean(early), mean(late));
    if q2 == 0.0 {
        0.0
    } else {
        (q4 - q2) / q2
    }
}

/// Relative change of the mean from the second quarter of `series` to
/// its last: (Q4 - Q2) / Q2. Zero when the series is too short or Q2 is 0.
pub fn drift(series: &[f64]) -> f64 {
    let n = series.len();
    if n < 4 {
        return 0.0;
    }
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64;
    let q2 = mean(&series[n / 4..n / 2]);
    let q4 = mean(&series[n - n / 4..]);
    if q2 == 0.0 {
        0.0
    } else {
        (q4 - q2) / q2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_means_of_a_constant_have_no_spread() {
        let s = vec![5.0; 103];
        let st = batch_means(&s, 20);
        assert_eq!(st.mean, 5.0);
        assert_eq!(st.ci95, 0.0);
        assert_eq!(st.batches, 10);
    }

    #[test]
    fn the_interval_covers_the_mean_of_a_noisy_series() {
        // A deterministic, zero-mean wiggle around 10.
        let s: Vec<f64> = (0..1000)
            .map(|i| 10.0 + ((i * 7919) % 101) as f64 / 50.0 - 1.0)
            .collect();
        let st = batch_means(&s, 100);
        assert!((st.mean - 10.0).abs() <= st.ci95 + 0.02, "{st:?}");
        assert!(st.ci95 > 0.0 && st.ci95 < 0.5, "{st:?}");
    }

    /// A series that repeats every 7 samples (a busy part and an idle
    /// part): whole periods give its exact mean, cut ones would not.
    #[test]
    fn whole_rotations_give_a_periodic_series_its_mean() {
        let period = [90.0, 90.0, 90.0, 90.0, 10.0, 10.0, 10.0];
        let s: Vec<f64> = (0..700).map(|i| period[i % 7]).collect();
        let exact = 390.0 / 7.0;
        let st = batch_means_periodic(&s, 100, 7, 1);
        assert!((st.mean - exact).abs() < 1e-9, "{st:?}");
        assert!(st.ci95 < 1e-9, "{st:?}");
        let cut = batch_means(&s, 100);
        assert!((cut.mean - exact).abs() > 0.1 || cut.ci95 > 1.0, "{cut:?}");
        assert!(drift_periodic(&s, 7, 1).abs() < 1e-9);
        // Too short for two periods: plain batch means.
        assert_eq!(batch_means_periodic(&s[..10], 0, 7, 1).batches, 10);
    }

    /// Whole rotations are cut into 5 to 10 equal batches, at most a
    /// tenth left over: 19 rotations are 9 batches of 2 (one over), not 10
    /// of 1 (nine over, as the rule was); 301 are 10 of 30.
    #[test]
    fn rotations_go_into_batches_with_few_left_over() {
        assert_eq!(rotation_batches(19), (9, 2));
        assert_eq!(rotation_batches(20), (10, 2));
        assert_eq!(rotation_batches(13), (6, 2));
        assert_eq!(rotation_batches(301), (10, 30));
        assert_eq!(rotation_batches(3), (3, 1));
        assert_eq!(rotation_batches(0), (0, 0));
        for k in 5..2000 {
            let (b, per) = rotation_batches(k);
            let over = k - b * per;
            assert!((5..=10).contains(&b) && over < b, "{k}: {b} x {per}");
            assert!(over * 10 <= k, "{k}: {over} of {k} over");
        }
        // 19 rotations of 7 samples after a warm-up of one: the window
        // starts at the third (one left over) and ends with the series.
        let s = vec![1.0; 7 * 20];
        let st = batch_means_periodic(&s, 1, 7, 1);
        assert_eq!((st.batches, st.from_ps, st.to_ps), (9, 14, 140));
    }

    #[test]
    fn drift_compares_the_second_and_last_quarters() {
        let mut s = vec![0.0; 10];
        s.extend(vec![100.0; 10]);
        s.extend(vec![100.0; 10]);
        s.extend(vec![90.0; 10]);
        assert!((drift(&s) + 0.10).abs() < 1e-12);
        assert_eq!(drift(&[1.0, 2.0]), 0.0);
        assert_eq!(t975(1), 12.706);
        assert_eq!(t975(100), 1.96);
    }
}
