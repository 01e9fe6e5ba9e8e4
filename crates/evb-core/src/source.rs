//! The source model of a Readout Unit: what its readout board would have
//! written into memory for each MEP.
//!
//! A MEP fragment payload is `events_per_mep` little-endian u32 event sizes
//! followed by the event data. Each event's data starts with its event
//! number (`mep * events_per_mep + i`, little-endian u64, cut to the
//! event's size when it is shorter); the rest is a pattern of u64 words
//! `base + word index` (counted from the start of the data area), so a
//! receiver can check it byte for byte. The CRC-32C of the payload goes
//! into the fragment header when the fragment is one the BUs check
//! (`event_builder.verify`), else 0.
//!
//! Two readouts (`source.readout`):
//!
//! - **fresh** ([`SourceModel::produce_into`]): every MEP is written whole:
//!   sizes drawn with a generator seeded by (run seed, source, MEP), so any
//!   party can recompute them, and a pattern whose `base` comes from the
//!   same triple. What producing data costs: memory bandwidth.
//! - **ring** ([`SourceModel::ring_template`], [`SourceModel::ring_fill`],
//!   [`SourceModel::ring_stamp`]): as a readout board's DMA ring, each of
//!   the RU's buffers is filled once (sizes drawn for that buffer, a
//!   pattern whose `base` comes from (run seed, run, source)) and reused;
//!   per MEP only the event numbers are written, and the CRC computed if
//!   the fragment is checked. Fragment lengths then repeat over the ring's
//!   buffers. The payload is self-describing (its size table), so it still
//!   verifies byte for byte ([`SourceModel::verify_ring_payload`]), and a
//!   stale buffer (another MEP's) fails even the header check.

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

    pub fn events_per_mep(&self) -> u32 {
        self.events_per_mep
    }

    /// Event fragment sizes of `mep`, written into `out` (cleared first).
    pub fn event_sizes(&self, mep: MepId, out: &mut Vec<u32>) {
        self.draw_sizes(self.mep_seed(mep), out);
    }

    /// `events_per_mep` sizes from a generator seeded with `seed`.
    fn draw_sizes(&self, seed: u64, out: &mut Vec<u32>) {
        out.clear();
        let n = self.events_per_mep as usize;
        match &self.sizes {
            SizeDraw::Fixed(size) => out.resize(n, *size),
            SizeDraw::Normal { dist, max } => {
                let mut rng = Pcg64Mcg::seed_from_u64(seed);
                let max = f64::from(*max);
                // Clamped to >= 0 first, so +0.5 and truncation round
                // exactly, without a libm call (this loop is hot).
                out.extend((0..n).map(|_| (dist.sample(&mut rng).clamp(0.0, max) + 0.5) as u32));
            }
            SizeDraw::Histogram { sizes, index, .. } => {
                let mut rng = Pcg64Mcg::seed_from_u64(seed);
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
        let len = self.describe(mep, scratch).payload_len as usize;
        buf.resize(len, 0);
        self.produce_into(mep, buf, scratch, true)
    }

    /// Fresh readout: writes the whole payload of `mep` into the start of
    /// `buf` (at least `describe(mep).payload_len` bytes long) and returns
    /// its header, with the CRC-32C if `crc` (else 0).
    pub fn produce_into(
        &self,
        mep: MepId,
        buf: &mut [u8],
        scratch: &mut Vec<u32>,
        crc: bool,
    ) -> FragmentHeader {
        let mut header = self.describe(mep, scratch);
        let len = header.payload_len as usize;
        assert!(
            buf.len() >= len,
            "a buffer of {} bytes for a fragment of {len}",
            buf.len()
        );
        let buf = &mut buf[..len];
        let table_len = 4 * scratch.len();
        for (dst, size) in buf[..table_len].chunks_exact_mut(4).zip(scratch.iter()) {
            dst.copy_from_slice(&size.to_le_bytes());
        }
        let mut sum = if crc {
            crate::checksum::crc32c(&buf[..table_len])
        } else {
            0
        };
        // Fill, stamp and checksum in cache-sized chunks: one pass over memory.
        let base = self.pattern_base(mep);
        let mut stamps = Stamper::new(self.first_event(mep));
        const CHUNK: usize = 32 * 1024;
        let mut offset = 0usize;
        for chunk in buf[table_len..].chunks_mut(CHUNK) {
            fill_pattern(chunk, base, offset);
            stamps.stamp(chunk, offset, scratch);
            if crc {
                sum = crate::checksum::crc32c_append(sum, chunk);
            }
            offset += chunk.len();
        }
        header.crc32c = sum;
        header
    }

    /// The number of the first event of `mep`.
    pub fn first_event(&self, mep: MepId) -> u64 {
        mep.wrapping_mul(u64::from(self.events_per_mep))
    }

    fn pattern_base(&self, mep: MepId) -> u64 {
        mix64(self.mep_seed(mep) ^ 0x5eed)
    }

    /// The ring readout's pattern base: one per source, whatever the MEP.
    fn ring_pattern_base(&self) -> u64 {
        mix64(self.seed ^ mix64(u64::from(self.source) << 48 ^ u64::from(self.run_id) ^ RING_SEED))
    }

    /// Ring readout: the layout of ring buffer `slot` (its event sizes,
    /// drawn once for that buffer).
    pub fn ring_template(&self, slot: u32) -> RingTemplate {
        let mut sizes = Vec::new();
        let seed = mix64(
            self.seed ^ mix64(u64::from(self.source) << 48 ^ u64::from(slot) ^ RING_SEED << 1),
        );
        self.draw_sizes(seed, &mut sizes);
        let payload_len = Self::payload_len(&sizes);
        assert!(
            payload_len <= u64::from(u32::MAX),
            "validated: fragments fit a u32"
        );
        let mut stamps = Vec::with_capacity(sizes.len());
        let mut at = 4 * sizes.len() as u64;
        for (i, &size) in sizes.iter().enumerate() {
            if size > 0 {
                let len = size.min(EVENT_NUMBER_BYTES as u32) as u8;
                stamps.push((at as u32, i as u32, len));
            }
            at += u64::from(size);
        }
        RingTemplate {
            slot,
            sizes,
            stamps,
            payload_len: payload_len as u32,
        }
    }

    /// Ring readout: fills a buffer once with `t`'s size table and the
    /// source's pattern (the event numbers come with each MEP).
    pub fn ring_fill(&self, t: &RingTemplate, buf: &mut [u8]) {
        let len = t.payload_len as usize;
        assert!(
            buf.len() >= len,
            "a ring buffer of {} bytes for {len}",
            buf.len()
        );
        let table_len = 4 * t.sizes.len();
        for (dst, size) in buf[..table_len].chunks_exact_mut(4).zip(&t.sizes) {
            dst.copy_from_slice(&size.to_le_bytes());
        }
        fill_pattern(&mut buf[table_len..len], self.ring_pattern_base(), 0);
    }

    /// Ring readout: the header of `mep`'s fragment in a buffer of layout
    /// `t`, before it is written (the CRC left 0).
    pub fn ring_describe(&self, mep: MepId, t: &RingTemplate) -> FragmentHeader {
        FragmentHeader {
            run_id: self.run_id,
            source: self.source,
            flags: 0,
            mep,
            event_count: self.events_per_mep,
            payload_len: t.payload_len,
            crc32c: 0,
        }
    }

    /// Ring readout: `buf`, filled by [`Self::ring_fill`] with `t`, becomes
    /// `mep`'s fragment: its event numbers are written, and its CRC-32C
    /// computed if `crc`. Returns the header.
    pub fn ring_stamp(
        &self,
        mep: MepId,
        buf: &mut [u8],
        t: &RingTemplate,
        crc: bool,
    ) -> FragmentHeader {
        let len = t.payload_len as usize;
        assert!(buf.len() >= len);
        let first = self.first_event(mep);
        for (k, &(at, i, n)) in t.stamps.iter().enumerate() {
            // The stamps hit one cache line in a few, cold since the
            // buffer's last use: ask for the line a few stamps ahead in
            // the state a write needs (twice the stamps per second).
            if let Some(&(ahead, _, _)) = t.stamps.get(k + STAMP_PREFETCH) {
                prefetch_for_write(&buf[ahead as usize]);
            }
            let number = first.wrapping_add(u64::from(i)).to_le_bytes();
            let at = at as usize;
            if n as usize == EVENT_NUMBER_BYTES {
                // A fixed-size copy is one store; a variable one a call.
                buf[at..at + EVENT_NUMBER_BYTES].copy_from_slice(&number);
            } else {
                buf[at..at + n as usize].copy_from_slice(&number[..n as usize]);
            }
        }
        FragmentHeader {
            crc32c: if crc {
                crate::checksum::crc32c(&buf[..len])
            } else {
                0
            },
            ..self.ring_describe(mep, t)
        }
    }

    /// Checks a received payload byte for byte against what this source
    /// produces for `mep` in the fresh readout (costly; the CRC is the
    /// routine check).
    pub fn verify_payload(&self, mep: MepId, payload: &[u8], scratch: &mut Vec<u32>) -> bool {
        self.event_sizes(mep, scratch);
        if payload.len() as u64 != Self::payload_len(scratch) {
            return false;
        }
        let mut expected = vec![0u8; payload.len()];
        self.produce_into(mep, &mut expected, scratch, false);
        expected == payload
    }

    /// Checks a received payload byte for byte against what this source
    /// writes for `mep` in the ring readout: its own size table adding up
    /// to its length, every event's number, the pattern everywhere else.
    pub fn verify_ring_payload(&self, mep: MepId, payload: &[u8]) -> bool {
        let Some(sizes) = size_table(payload, self.events_per_mep) else {
            return false;
        };
        let table_len = sizes.len() * 4;
        let mut expected = payload[table_len..].to_vec();
        fill_pattern(&mut expected, self.ring_pattern_base(), 0);
        let mut at = 0usize;
        let first = self.first_event(mep);
        for (i, &size) in sizes.iter().enumerate() {
            let n = (size as usize).min(EVENT_NUMBER_BYTES);
            let number = first.wrapping_add(i as u64).to_le_bytes();
            expected[at..at + n].copy_from_slice(&number[..n]);
            at += size as usize;
        }
        expected == payload[table_len..]
    }
}

/// How many stamps ahead [`SourceModel::ring_stamp`] prefetches.
const STAMP_PREFETCH: usize = 8;

/// Brings the cache line of `byte` in for writing (a hint; nothing where
/// the CPU has no such instruction).
#[inline(always)]
fn prefetch_for_write(byte: &u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes no memory; the address
    // is that of a live reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        _mm_prefetch::<_MM_HINT_ET0>(byte as *const u8 as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = byte;
}

/// Bytes of its number at the start of every event's data (fewer in an
/// event that is shorter).
pub const EVENT_NUMBER_BYTES: usize = 8;

/// Seeds the ring readout's draws apart from the fresh readout's.
const RING_SEED: u64 = 0x7269_6e67_5eed;

/// The layout of one ring buffer: its event sizes, drawn once, and where
/// each event's number goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingTemplate {
    /// Which buffer of the ring (its sizes are drawn for it).
    pub slot: u32,
    sizes: Vec<u32>,
    /// Per non-empty event: offset of its first byte in the payload, its
    /// index in the MEP, bytes of its number written there.
    stamps: Vec<(u32, u32, u8)>,
    pub payload_len: u32,
}

/// Writes the event numbers into the data area chunk by chunk as the
/// fresh readout fills it (`sizes`: the MEP's event sizes).
struct Stamper {
    /// Next event to stamp, and where its data starts in the data area.
    event: usize,
    at: usize,
    first: u64,
}

impl Stamper {
    fn new(first: u64) -> Stamper {
        Stamper {
            event: 0,
            at: 0,
            first,
        }
    }

    /// Stamps the part of every event number that falls in `chunk`, which
    /// starts at `offset` in the data area (chunks come in order).
    fn stamp(&mut self, chunk: &mut [u8], offset: usize, sizes: &[u32]) {
        let end = offset + chunk.len();
        while self.event < sizes.len() && self.at < end {
            let size = sizes[self.event] as usize;
            let n = size.min(EVENT_NUMBER_BYTES);
            let number = self.first.wrapping_add(self.event as u64).to_le_bytes();
            if n == EVENT_NUMBER_BYTES && self.at >= offset && self.at + n <= end {
                // The whole number in this chunk (nearly every event): a
                // fixed-size copy is one store, a variable one a call.
                let i = self.at - offset;
                chunk[i..i + EVENT_NUMBER_BYTES].copy_from_slice(&number);
            } else {
                // The part of [at, at + n) inside [offset, end).
                let from = self.at.max(offset);
                let to = (self.at + n).min(end);
                if from < to {
                    chunk[from - offset..to - offset]
                        .copy_from_slice(&number[from - self.at..to - self.at]);
                }
                if self.at + n > end {
                    return; // The rest of this number is in the next chunk.
                }
            }
            self.at += size;
            self.event += 1;
        }
    }
}

/// The event sizes at the start of `payload` if there are `events` of
/// them and they add up to its length.
fn size_table(payload: &[u8], events: u32) -> Option<Vec<u32>> {
    let table_len = 4 * events as usize;
    let table = payload.get(..table_len)?;
    let sizes: Vec<u32> = table
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let sum: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    (table_len as u64 + sum == payload.len() as u64).then_some(sizes)
}

/// The header check of a received fragment (`event_builder.verify =
/// "header"`, and under the CRC at the other levels): the payload has the
/// header's length, its event-size table (`event_count` entries) adds up
/// to it, and the first and last non-empty events carry their numbers
/// (`mep * event_count + i`). Reads the table and two events, not the
/// data: a stale or misplaced buffer fails, a damaged data byte does not.
pub fn check_fragment(header: &FragmentHeader, payload: &[u8]) -> bool {
    if payload.len() != header.payload_len as usize {
        return false;
    }
    let n = header.event_count as usize;
    let Some(table) = payload.get(..4 * n) else {
        return false;
    };
    let size = |i: usize| {
        let b = &table[4 * i..4 * i + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
    };
    let sum: u64 = table
        .chunks_exact(4)
        .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .sum();
    if 4 * n as u64 + sum != payload.len() as u64 {
        return false;
    }
    let first = header.mep.wrapping_mul(u64::from(header.event_count));
    let number_ok = |i: usize, at: usize| {
        let k = size(i).min(EVENT_NUMBER_BYTES);
        let number = first.wrapping_add(i as u64).to_le_bytes();
        payload[at..at + k] == number[..k]
    };
    // The first non-empty event starts right after the table; the last
    // non-empty one ends where the payload does.
    if let Some(i) = (0..n).find(|&i| size(i) > 0) {
        if !number_ok(i, 4 * n) {
            return false;
        }
        let last = (0..n).rev().find(|&i| size(i) > 0).expect("one exists");
        if last != i && !number_ok(last, payload.len() - size(last)) {
            return false;
        }
    }
    true
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

    /// The reference of the fresh readout: pattern everywhere, then every
    /// event's number over the start of its data.
    fn fresh_by_hand(s: &SourceModel, mep: MepId) -> Vec<u8> {
        let mut sizes = Vec::new();
        s.event_sizes(mep, &mut sizes);
        let table_len = 4 * sizes.len();
        let mut buf = vec![0u8; SourceModel::payload_len(&sizes) as usize];
        for (d, v) in buf.chunks_exact_mut(4).zip(&sizes) {
            d.copy_from_slice(&v.to_le_bytes());
        }
        fill_pattern(&mut buf[table_len..], s.pattern_base(mep), 0);
        let mut at = table_len;
        for (i, &size) in sizes.iter().enumerate() {
            let n = (size as usize).min(EVENT_NUMBER_BYTES);
            let number = s.first_event(mep) + i as u64;
            buf[at..at + n].copy_from_slice(&number.to_le_bytes()[..n]);
            at += size as usize;
        }
        buf
    }

    /// Event numbers are stamped right where chunks of the fill end too,
    /// and cut short in events under 8 bytes.
    #[test]
    fn fresh_data_carries_every_event_number_across_chunks() {
        for (size, mean, std) in [
            (SizeModel::Fixed, 5, 0),
            (SizeModel::Fixed, 3, 0),
            (SizeModel::Fixed, 32 * 1024 - 4, 0),
            (SizeModel::Normal, 700, 600),
        ] {
            let mut cfg = Config::default();
            cfg.source.events_per_mep = 300;
            cfg.source.size = size;
            cfg.source.mean_bytes = mean;
            cfg.source.std_bytes = std;
            let s = SourceModel::new(&cfg, 2);
            let (mut buf, mut scratch) = (Vec::new(), Vec::new());
            for mep in [0, 9] {
                let h = s.produce(mep, &mut buf, &mut scratch);
                assert_eq!(buf, fresh_by_hand(&s, mep), "{size:?} {mean}");
                assert!(check_fragment(&h, &buf));
                assert!(s.verify_payload(mep, &buf, &mut scratch));
                // Without the CRC, the same bytes and a zero CRC.
                let mut other = vec![7u8; buf.len() + 5];
                let h2 = s.produce_into(mep, &mut other, &mut scratch, false);
                assert_eq!(&other[..buf.len()], &buf[..]);
                assert_eq!(h2.crc32c, 0);
                assert_eq!(h2.payload_len, h.payload_len);
            }
        }
    }

    #[test]
    fn the_header_check_catches_stale_and_misnumbered_fragments() {
        let mut cfg = Config::default();
        cfg.source.events_per_mep = 64;
        let s = SourceModel::new(&cfg, 1);
        let (mut buf, mut scratch) = (Vec::new(), Vec::new());
        let h = s.produce(5, &mut buf, &mut scratch);
        assert!(check_fragment(&h, &buf));
        // Another MEP's header on this payload (a stale buffer).
        assert!(!check_fragment(&FragmentHeader { mep: 6, ..h }, &buf));
        // The first and the last event's number.
        let table = 4 * 64;
        for at in [table, buf.len() - scratch[63] as usize] {
            let mut bad = buf.clone();
            bad[at] ^= 1;
            assert!(!check_fragment(&h, &bad), "byte {at}");
        }
        // A size that no longer adds up, a short payload.
        let mut bad = buf.clone();
        bad[0] ^= 1;
        assert!(!check_fragment(&h, &bad));
        assert!(!check_fragment(&h, &buf[..buf.len() - 1]));
        // A data byte is the CRC's to catch, not the header check's.
        let mut bad = buf.clone();
        bad[table + 100] ^= 1;
        assert!(check_fragment(&h, &bad));
        assert_ne!(payload_crc(&bad), h.crc32c);
    }

    #[test]
    fn a_ring_buffer_is_filled_once_and_stamped_per_mep() {
        let mut cfg = Config::default();
        cfg.source.events_per_mep = 256;
        let s = SourceModel::new(&cfg, 3);
        let t = s.ring_template(2);
        assert_eq!(t, s.ring_template(2), "a buffer's layout replays");
        assert_ne!(t.payload_len, s.ring_template(3).payload_len);
        let mut buf = vec![0u8; t.payload_len as usize + 10];
        s.ring_fill(&t, &mut buf);
        let h = s.ring_stamp(40, &mut buf, &t, true);
        let payload = &buf[..t.payload_len as usize];
        assert_eq!(h.payload_len, t.payload_len);
        assert_eq!(h.crc32c, payload_crc(payload));
        assert!(check_fragment(&h, payload));
        assert!(s.verify_ring_payload(40, payload));
        // The same buffer reused for MEP 41: only the numbers changed,
        // and the old fragment no longer passes for itself.
        let before = payload.to_vec();
        let h41 = s.ring_stamp(41, &mut buf, &t, false);
        let payload = &buf[..t.payload_len as usize];
        assert_eq!(h41.crc32c, 0);
        assert!(s.verify_ring_payload(41, payload));
        assert!(!s.verify_ring_payload(40, payload));
        assert!(!check_fragment(&h, payload));
        let changed = before.iter().zip(payload).filter(|(a, b)| a != b).count();
        assert!(
            changed > 0 && changed <= 256 * EVENT_NUMBER_BYTES,
            "{changed}"
        );
        // A damaged data byte fails the byte-for-byte check.
        let mut bad = payload.to_vec();
        bad[4 * 256 + 20] ^= 1;
        assert!(!s.verify_ring_payload(41, &bad));
    }

    #[test]
    fn the_sample_level_checks_about_one_fragment_in_k() {
        let mut cfg = Config::default();
        let eb = &mut cfg.event_builder;
        eb.verify_sample = 16;
        let checked = (0..4u16)
            .flat_map(|src| (0..4000u64).map(move |m| (src, m)))
            .filter(|&(src, m)| eb.crc_checked(src, m))
            .count();
        assert!((800..1200).contains(&checked), "{checked} of 16000");
        eb.verify = crate::config::Verify::Crc;
        assert!((0..100).all(|m| eb.crc_checked(1, m)));
        eb.verify = crate::config::Verify::Header;
        assert!((0..100).all(|m| !eb.crc_checked(1, m)));
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
