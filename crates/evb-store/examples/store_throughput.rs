//! Rough throughput of a StoreWriter: how long `write_batch` holds the
//! caller (the BU's event loop) and how fast the writer thread drains.
//!
//! cargo run --release -p evb-store --example store_throughput -- TARGET [BATCHES] [EVENTS] [SOURCES] [EVENT_BYTES]
//! (S3 targets take their endpoint and credentials from AWS_* variables.)

use std::time::{Duration, Instant};

use evb_store::{StoreError, StoreTarget, StoreWriter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let target = StoreTarget::parse(
        args.first()
            .ok_or("usage: TARGET [BATCHES] [EVENTS] [SOURCES] [EVENT_BYTES]")?,
    )?;
    let arg = |i: usize, default: u64| args.get(i).map_or(Ok(default), |s| s.parse::<u64>());
    let (batches, events, sources, event_bytes) = (
        arg(1, 200)?,
        arg(2, 4096)? as u32,
        arg(3, 4)? as u32,
        arg(4, 256)? as u32,
    );

    // One fragment per source: `events` sizes of event_bytes/sources, then data.
    let size = event_bytes / sources;
    let fragment: Vec<u8> = (0..events)
        .flat_map(|_| size.to_le_bytes())
        .chain((0..u64::from(events) * u64::from(size)).map(|i| i as u8))
        .collect();
    let fragments: Vec<&[u8]> = (0..sources).map(|_| fragment.as_slice()).collect();

    let mut writer = StoreWriter::open(&target, 1, 0)?;
    let started = Instant::now();
    let mut in_call = Duration::ZERO;
    for mep in 0..batches {
        loop {
            let t = Instant::now();
            let result = writer.write_batch(mep, events, &fragments);
            in_call += t.elapsed();
            match result {
                Ok(()) => break,
                Err(StoreError::Backpressure { .. }) => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    let stats = writer.close()?;
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{} objects of {:.2} MB ({} events x {} sources): {:.2} GB/s end to end, writer thread busy {:.2} s; write_batch held the caller {:.3} ms per batch; refused {} times (backpressure)",
        stats.objects,
        stats.bytes as f64 / stats.objects as f64 / 1e6,
        events,
        sources,
        stats.bytes as f64 / wall / 1e9,
        stats.busy_seconds,
        in_call.as_secs_f64() * 1e3 / batches as f64,
        stats.refused
    );
    Ok(())
}
