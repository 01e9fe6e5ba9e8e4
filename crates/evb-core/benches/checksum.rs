//! CRC-32C speed: evb's checksum (crc-fast) against the SSE4.2 `crc32c`
//! crate, on MEP-sized buffers, in one run. Prints GB/s and the ratio.
//!
//!     cargo bench -p evb-core --bench checksum

use std::hint::black_box;
use std::time::Instant;

fn gbps(f: impl Fn(&[u8]) -> u32, buf: &[u8], rounds: usize) -> f64 {
    let mut x = 0;
    let t = Instant::now();
    for _ in 0..rounds {
        x ^= f(black_box(buf));
    }
    black_box(x);
    (rounds * buf.len()) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    for size in [4096usize, 65_536, 1 << 20, 4 << 20] {
        let buf: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        let rounds = (4usize << 30) / size;
        let _warm = gbps(evb_core::checksum::crc32c, &buf, rounds / 8);
        let ours = gbps(evb_core::checksum::crc32c, &buf, rounds);
        let peer = gbps(crc32c::crc32c, &buf, rounds);
        println!(
            "{size:>8} B: evb (crc-fast) {ours:6.1} GB/s, crc32c crate {peer:6.1} GB/s, ratio {:.2}",
            ours / peer
        );
    }
}
