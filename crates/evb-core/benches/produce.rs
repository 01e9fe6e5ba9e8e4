//! Source model speed: `SourceModel::produce` (size table, data pattern and
//! CRC-32C in one pass, the fresh readout) and `SourceModel::ring_stamp`
//! (the ring readout's per-MEP work: the event numbers) against the MPI
//! peer's loop (`send[i] = seed + i`
//! over u64 words, bench/peers/mpi_alltoall.c) on the same MEP sizes and
//! the same rotating set of buffers, in one run. Prints GB/s and the ratio.
//!
//!     cargo bench -p evb-core --bench produce

use std::hint::black_box;
use std::time::Instant;

use evb_core::config::Config;
use evb_core::source::SourceModel;

/// Buffers written in turn: a MEP pool's worth, larger than a core's L2.
const BUFFERS: usize = 8;

fn gbps(
    mut f: impl FnMut(&mut Vec<u8>, u64),
    bufs: &mut [Vec<u8>],
    bytes: usize,
    rounds: usize,
) -> f64 {
    let t = Instant::now();
    for r in 0..rounds {
        let b = &mut bufs[r % BUFFERS];
        f(b, r as u64);
        black_box(&b[b.len() / 2]);
    }
    (rounds * bytes) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    for events in [1024u32, 4096, 16384] {
        let mut config = Config::default();
        config.source.events_per_mep = events;
        config.source.size = evb_core::config::SizeModel::Fixed;
        config.source.mean_bytes = 252;
        let source = SourceModel::new(&config, 1);
        let mut scratch = Vec::new();
        let bytes = 256 * events as usize;
        let mut bufs: Vec<Vec<u8>> = (0..BUFFERS).map(|_| vec![0u8; bytes]).collect();
        let rounds = ((8usize << 30) / bytes).max(BUFFERS);
        let produce = |b: &mut Vec<u8>, r: u64| {
            black_box(source.produce(r, b, &mut scratch));
        };
        let _warm = gbps(produce, &mut bufs, bytes, rounds / 8);
        let ours = gbps(
            |b, r| {
                black_box(source.produce(r, b, &mut Vec::new()));
            },
            &mut bufs,
            bytes,
            rounds,
        );
        let peer = gbps(
            |b, r| {
                let seed = r.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                // SAFETY: any bytes are valid u64s; the ends are left alone.
                let (_, words, _) = unsafe { b.align_to_mut::<u64>() };
                for (i, w) in words.iter_mut().enumerate() {
                    *w = seed.wrapping_add(i as u64);
                }
            },
            &mut bufs,
            bytes,
            rounds,
        );
        // The ring readout: buffers filled once, then per MEP only the
        // event numbers (no CRC: the default `sample` level checks one
        // fragment in 64).
        let templates: Vec<_> = (0..BUFFERS as u32)
            .map(|i| source.ring_template(i))
            .collect();
        for (b, t) in bufs.iter_mut().zip(&templates) {
            b.resize(t.payload_len as usize, 0);
            source.ring_fill(t, b);
        }
        let ring = gbps(
            |b, r| {
                let t = &templates[r as usize % BUFFERS];
                black_box(source.ring_stamp(r, b, t, false));
            },
            &mut bufs,
            bytes,
            rounds,
        );
        println!(
            "{bytes:>9} B MEPs: produce {ours:6.1} GB/s, MPI peer's fill {peer:6.1} GB/s, ratio {:.2}; ring stamp {ring:6.1} GB/s",
            ours / peer
        );
    }
}
