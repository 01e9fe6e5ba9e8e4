//! The source model of a Readout Unit: what its readout board would have
//! written into memory for each MEP.
//!
//! A MEP fragment payload is `events_per_mep` little-endian u32 event sizes
//! followed by the event data. Sizes are drawn from the configured
//! distribution with a generator seeded by (run seed, source, MEP), so any
//! party can recompute them; data is a pattern derived from (run, source,
//! MEP), so a receiver can check it byte for byte. The CRC-32C of the
//! payload goes into the fragment header.

use rand::distributions::{Distribution, WeightedIndex};
use rand::SeedableRng;
use rand_distr::Normal;
use rand_pcg::Pcg64Mcg;

use crate::config::{Config, SizeModel};
use crate::wire::{FragmentHeader, MepId};

/// Produces the fragments of one Readout Unit.
#[derive(Debug, Clone)]
pub struct SourceModel {
    run_id: u32,
    seed: u64,
    source: u16,
    events_per_mep: u32,
    sizes: SizeDraw,
}

#[derive(Debug, Clone)]
enum SizeDraw {
    Fixed(u32),
    Normal {
        dist: Normal<f64>,
        max: u32,
    },
    Histogram {
        sizes: Vec<u32>,
        weights: Vec<f64>,
        index: WeightedIndex<f64>,
    },
}

/// 64-bit mix (splitmix64 finaliser): decorrelates nearby seeds.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SourceModel {
    pub fn new(config: &Config, source: u16) -> SourceModel {
        let s = &config.source;
        let sizes = match s.size {
            SizeModel::Fixed => SizeDraw::Fixed(s.mean_bytes),
            SizeModel::Normal => SizeDraw::Normal {
                dist: Normal::new(f64::from(s.mean_bytes), f64::from(s.std_bytes))
                    .expect("std_bytes is a finite u32"),
                max: s.max_fragment_bytes,
            },
            SizeModel::Histogram => SizeDraw::Histogram {
                sizes: config.histogram_bins.iter().map(|b| b.0).collect(),
                weights: config.histogram_bins.iter().map(|b| b.1).collect(),
                index: WeightedIndex::new(config.histogram_bins.iter().map(|b| b.1))
                    .expect("validated: at least one positive weight"),
            },
        };
        SourceModel {
            run_id: config.run.run_id,
            seed: config.run.seed,
            source,
            events_per_mep: s.events_per_mep,
            sizes,
        }
    }

    pub fn source(&self) -> u16 {
        self.source
    }

    fn mep_seed(&self, mep: MepId) -> u64 {
        mix64(self.seed ^ mix64(u64::from(self.source) << 48 ^ mep ^ u64::from(self.run_id) << 32))
    }

    /// Event fragment sizes of `mep`, written into `out` (cleared first).
    pub fn event_sizes(&self, mep: MepId, out: &mut Vec<u32>) {
        out.clear();
        let n = self.events_per_mep as usize;
        match &self.sizes {
            SizeDraw::Fixed(size) => out.resize(n, *size),
            SizeDraw::Normal { dist, max } => {
                let mut rng = Pcg64Mcg::seed_from_u64(self.mep_seed(mep));
                let max = f64::from(*max);
                // Clamped to >= 0 first, so +0.5 and truncation round
                // exactly, without a libm call (this loop is hot).
                out.extend((0..n).map(|_| (dist.sample(&mut rng).clamp(0.0, max) + 0.5) as u32));
            }
            SizeDraw::Histogram { sizes, index, .. } => {
                let mut rng = Pcg64Mcg::seed_from_u64(self.mep_seed(mep));
                out.extend((0..n).map(|_| sizes[index.sample(&mut rng)]));
            }
        }
    }

    /// Payload length of a fragment with these event sizes.
    pub fn payload_len(sizes: &[u32]) -> u64 {
        4 * sizes.len() as u64 + sizes.iter().map(|&s| u64::from(s)).sum::<u64>()
    }

    /// Mean and variance of one event's size, and its bounds.
    fn event_moments(&self) -> (f64, f64, f64, f64) {
        match &self.sizes {
            SizeDraw::Fixed(size) => {
                let s = f64::from(*size);
                (s, 0.0, s, s)
            }
            SizeDraw::Normal { dist, max } => {
                let (m, v) = clamped_normal_moments(dist.mean(), dist.std_dev(), f64::from(*max));
                // Rounding to a whole byte adds a uniform error.
                (m, v + 1.0 / 12.0, 0.0, f64::from(*max))
            }
            SizeDraw::Histogram { sizes, weights, .. } => {
                let w = weights;
                let total = w.iter().sum::<f64>().max(f64::MIN_POSITIVE);
                let m = sizes
                    .iter()
                    .zip(w)
                    .map(|(&x, p)| f64::from(x) * p)
                    .sum::<f64>()
                    / total;
                let v = sizes
                    .iter()
                    .zip(w)
                    .map(|(&x, p)| (f64::from(x) - m).powi(2) * p)
                    .sum::<f64>()
                    / total;
                let lo = sizes.iter().copied().min().unwrap_or(0);
                let hi = sizes.iter().copied().max().unwrap_or(0);
                (m, v, f64::from(lo), f64::from(hi))
            }
        }
    }

    /// Header of `mep`'s fragment whose length is drawn at once, as the sum
    /// of `events_per_mep` sizes (a normal draw with their mean and
    /// variance), not event by event: the simulator's source, which needs
    /// lengths only. Same distribution to within the central limit (from
    /// 64 events a MEP; below that, event by event as [`Self::describe`]);
    /// drawing 2048 sizes for every fragment was half of a 540-node
    /// simulation's time.
    pub fn describe_length(&self, mep: MepId, scratch: &mut Vec<u32>) -> FragmentHeader {
        let n = f64::from(self.events_per_mep);
        if self.events_per_mep < 64 {
            return self.describe(mep, scratch);
        }
        let (m, v, lo, hi) = self.event_moments();
        let mut rng = Pcg64Mcg::seed_from_u64(mix64(self.mep_seed(mep) ^ 0x5a3d));
        let z: f64 = rand_distr::StandardNormal.sample(&mut rng);
        let data = (n * m + (n * v).sqrt() * z).round().clamp(n * lo, n * hi);
        FragmentHeader {
            run_id: self.run_id,
            source: self.source,
            flags: 0,
            mep,
            event_count: self.events_per_mep,
            payload_len: (4.0 * n + data) as u32,
            crc32c: 0,
        }
    }

    /// Header of `mep`'s fragment without producing its bytes (the CRC is
    /// left 0): what the simulator needs.
    pub fn describe(&self, mep: MepId, scratch: &mut Vec<u32>) -> FragmentHeader {
        self.event_sizes(mep, scratch);
        FragmentHeader {
            run_id: self.run_id,
            source: self.source,
            flags: 0,
            mep,
            event_count: self.events_per_mep,
            payload_len: Self::payload_len(scratch) as u32,
            crc32c: 0,
        }
    }

    /// Writes the payload of `mep` into `buf` (resized to fit, reusing its
    /// allocation) and returns the fragment header with its CRC-32C.
    pub fn produce(&self, mep: MepId, buf: &mut Vec<u8>, scratch: &mut Vec<u32>) -> FragmentHeader {
        let mut header = self.describe(mep, scratch);
        let len = header.payload_len as usize;
        buf.resize(len, 0);
        let table_len = 4 * scratch.len();
        for (dst, size) in buf[..table_len].chunks_exact_mut(4).zip(scratch.iter()) {
            dst.copy_from_slice(&size.to_le_bytes());
        }
        let mut crc = crate::checksum::crc32c(&buf[..table_len]);
        // Fill and checksum in cache-sized chunks: one pass over memory.
        let base = self.pattern_base(mep);
        const CHUNK: usize = 32 * 1024;
        let mut offset = 0usize;
        for chunk in buf[table_len..].chunks_mut(CHUNK) {
            fill_pattern(chunk, base, offset);
            crc = crate::checksum::crc32c_append(crc, chunk);
            offset += chunk.len();
        }
        header.crc32c = crc;
        header
    }

    fn pattern_base(&self, mep: MepId) -> u64 {
        mix64(self.mep_seed(mep) ^ 0x5eed)
    }

    /// Checks a received payload byte for byte against what this source
    /// produces for `mep` (costly; the CRC is the routine check).
    pub fn verify_payload(&self, mep: MepId, payload: &[u8], scratch: &mut Vec<u32>) -> bool {
        self.event_sizes(mep, scratch);
        let table_len = 4 * scratch.len();
        if payload.len() as u64 != Self::payload_len(scratch) {
            return false;
        }
        let table_ok = payload[..table_len]
            .chunks_exact(4)
            .zip(scratch.iter())
            .all(|(b, s)| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == *s);
        let mut expected = vec![0u8; payload.len() - table_len];
        fill_pattern(&mut expected, self.pattern_base(mep), 0);
        table_ok && expected == payload[table_len..]
    }
}

/// Writes the data pattern: little-endian u64 words `base + word_index`,
/// where `offset` (bytes, a multiple of 8 except at the very end) is where
/// `dst` starts in the data area.
fn fill_pattern(dst: &mut [u8], base: u64, offset: usize) {
    let first_word = (offset / 8) as u64;
    let full_words = (dst.len() / 8) as u64;
    let mut words = dst.chunks_exact_mut(8);
    for (i, w) in (&mut words).enumerate() {
        w.copy_from_slice(&base.wrapping_add(first_word + i as u64).to_le_bytes());
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        let idx = first_word + full_words;
        let bytes = base.wrapping_add(idx).to_le_bytes();
        let n = tail.len();
        tail.copy_from_slice(&bytes[..n]);
    }
}

/// Mean and variance of a normal N(mu, sigma) clamped to [0, max].
fn clamped_normal_moments(mu: f64, sigma: f64, max: f64) -> (f64, f64) {
    if sigma <= 0.0 {
        let x = mu.clamp(0.0, max);
        return (x, 0.0);
    }
    let pdf = |z: f64| (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let cdf = |z: f64| 0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2));
    let (a, b) = ((0.0 - mu) / sigma, (max - mu) / sigma);
    let (pa, pb, fa, fb) = (cdf(a), cdf(b), pdf(a), pdf(b));
    let inside = pb - pa;
    let mean = mu * inside + sigma * (fa - fb) + max * (1.0 - pb);
    let second = (mu * mu + sigma * sigma) * inside
        + 2.0 * mu * sigma * (fa - fb)
        + sigma * sigma * (a * fa - b * fb)
        + max * max * (1.0 - pb);
    (mean, (second - mean * mean).max(0.0))
}

/// The error function (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let y = 1.0 - poly * (-x * x).exp();
    if x >= 0.0 {
        y
    } else {
        -y
    }
}

/// CRC-32C of a payload, as the BU computes it on receipt.
pub fn payload_crc(payload: &[u8]) -> u32 {
    crate::checksum::crc32c(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn produce_is_deterministic_and_verifiable() {
        let mut cfg = Config::default();
        cfg.source.events_per_mep = 100;
        let s = SourceModel::new(&cfg, 3);
        let (mut a, mut b, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
        let ha = s.produce(7, &mut a, &mut scratch);
        let hb = s.produce(7, &mut b, &mut scratch);
        assert_eq!(ha, hb);
        assert_eq!(a, b);
        assert_eq!(ha.payload_len as usize, a.len());
        assert_eq!(payload_crc(&a), ha.crc32c);
        assert!(s.verify_payload(7, &a, &mut scratch));
        a[500] ^= 1;
        assert!(!s.verify_payload(7, &a, &mut scratch));
        assert_ne!(payload_crc(&a), ha.crc32c);
        // Another MEP or source gives other data.
        let hc = s.produce(8, &mut b, &mut scratch);
        assert_ne!(hc.crc32c, ha.crc32c);
        assert_eq!(s.describe(7, &mut scratch).payload_len, ha.payload_len);
    }

    #[test]
    fn normal_sizes_have_the_configured_mean() {
        let mut cfg = Config::default();
        cfg.source.events_per_mep = 20000;
        let s = SourceModel::new(&cfg, 0);
        let mut sizes = Vec::new();
        s.event_sizes(1, &mut sizes);
        let mean = sizes.iter().map(|&x| f64::from(x)).sum::<f64>() / sizes.len() as f64;
        assert!((mean - 256.0).abs() < 3.0, "mean {mean}");
        assert!(sizes.iter().all(|&x| x <= 4096));
    }

    /// The simulator's lengths, drawn at once, have the mean and spread of
    /// the lengths drawn event by event.
    #[test]
    fn lengths_drawn_at_once_match_event_by_event() {
        for (size, mean, std, max) in [
            (SizeModel::Normal, 256, 64, 4096),
            (SizeModel::Normal, 100, 80, 150), // clamped at both ends
            (SizeModel::Fixed, 200, 0, 4096),
            (SizeModel::Histogram, 0, 0, 0),
        ] {
            let mut cfg = Config {
                histogram_bins: vec![(100, 1.0), (300, 3.0), (2000, 0.1)],
                ..Config::default()
            };
            cfg.source.events_per_mep = 512;
            cfg.source.size = size;
            cfg.source.mean_bytes = mean;
            cfg.source.std_bytes = std;
            cfg.source.max_fragment_bytes = max;
            let s = SourceModel::new(&cfg, 2);
            let stats = |f: &dyn Fn(u64) -> u32| {
                let v: Vec<f64> = (0..2000).map(|m| f64::from(f(m))).collect();
                let m = v.iter().sum::<f64>() / v.len() as f64;
                let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
                (m, sd)
            };
            let exact = stats(&|m| s.describe(m, &mut Vec::new()).payload_len);
            let fast = stats(&|m| s.describe_length(m, &mut Vec::new()).payload_len);
            assert!(
                (exact.0 - fast.0).abs() < 0.002 * exact.0,
                "{size:?}: {exact:?} {fast:?}"
            );
            assert!(
                (exact.1 - fast.1).abs() <= 0.1 * exact.1.max(1.0),
                "{size:?}: {exact:?} {fast:?}"
            );
        }
    }

    #[test]
    fn histogram_sizes_come_from_the_bins() {
        let mut cfg = Config::default();
        cfg.source.size = SizeModel::Histogram;
        cfg.histogram_bins = vec![(100, 1.0), (300, 3.0), (999, 0.0)];
        cfg.source.events_per_mep = 4000;
        let s = SourceModel::new(&cfg, 0);
        let mut sizes = Vec::new();
        s.event_sizes(1, &mut sizes);
        assert!(sizes.iter().all(|&x| x == 100 || x == 300));
        let big = sizes.iter().filter(|&&x| x == 300).count() as f64 / 4000.0;
        assert!((big - 0.75).abs() < 0.05, "{big}");
    }
}
