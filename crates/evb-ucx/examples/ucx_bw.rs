//! Point-to-point bandwidth of evb-ucx's Endpoint, to hold against
//! bench/peers/ucx_perftest.sh (UCX's own tag_bw): one sending and one
//! receiving thread, each with its own endpoint, for SECONDS per size;
//! bandwidth is counted at the receiver, in MB = 2^20 B like ucx_perftest.
//!
//! cargo run --release -p evb-ucx --example ucx_bw -- [TLS] [SECONDS] [SIZE...]
//!
//! UCX_BW_PROGRESS=busy spins instead of sleeping on the event fd (as
//! ucx_perftest does). UCX_BW_SPLIT_FROM=BYTES sets `Options::split_body_from` (`never`: every
//! message as one 2-entry iov, as before the split), to compare the two.

use evb_ucx::{Completion, Endpoint, Options, Progress};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn split_body_from() -> usize {
    match std::env::var("UCX_BW_SPLIT_FROM").as_deref() {
        Err(_) => Options::default().split_body_from,
        Ok("never") => usize::MAX,
        Ok(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("ucx_bw: UCX_BW_SPLIT_FROM must be a byte count or `never`");
            std::process::exit(2);
        }),
    }
}

fn options(tls: &str) -> Options {
    Options {
        split_body_from: split_body_from(),
        tls: Some(tls.to_string()),
        progress: match std::env::var("UCX_BW_PROGRESS").as_deref() {
            Ok("busy") => Progress::Busy,
            _ => Progress::Blocking,
        },
        max_outstanding_sends: 64,
        peer_failure_detection: tls.contains("tcp"),
        ..Options::default()
    }
}

fn measure(tls: &str, size: usize, seconds: f64) -> Result<f64, String> {
    let (addr_tx, addr_rx) = mpsc::channel::<Vec<u8>>();
    let (back_tx, back_rx) = mpsc::channel::<Vec<u8>>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let (drained_tx, drained_rx) = mpsc::channel::<()>();
    let tls_rx = tls.to_string();
    let receiver = std::thread::spawn(move || -> Result<f64, String> {
        let mut ep = Endpoint::open(&options(&tls_rx)).map_err(|e| e.to_string())?;
        addr_tx
            .send(ep.local_address())
            .map_err(|e| e.to_string())?;
        let sender_addr = back_rx.recv().map_err(|e| e.to_string())?;
        ep.add_peer(&sender_addr).map_err(|e| e.to_string())?;
        for _ in 0..32 {
            ep.post_recv(Vec::with_capacity(size))
                .map_err(|e| e.to_string())?;
        }
        let mut out = Vec::new();
        let (mut bytes, mut start) = (0u64, None);
        let limit = Duration::from_secs_f64(seconds);
        let mut result = None;
        loop {
            ep.progress(&mut out).map_err(|e| e.to_string())?;
            for c in out.drain(..) {
                if let Completion::Received { buf, len, .. } = c {
                    // The clock starts at the first message (connection set up).
                    let t0 = *start.get_or_insert_with(Instant::now);
                    if t0.elapsed() < limit {
                        bytes += len as u64;
                    }
                    ep.post_recv(buf).map_err(|e| e.to_string())?;
                }
            }
            if let Some(t0) = start {
                if result.is_none() && t0.elapsed() >= limit {
                    let _ = stop_tx.send(());
                    result = Some(bytes as f64 / limit.as_secs_f64() / (1u64 << 20) as f64);
                }
            }
            // Closed only once the sender has no send in flight: UCX 1.13
            // aborted a sender that was progressing zero-copy sends while
            // its peer closed (uct_iface.h `comp->count > 0`).
            if let (Some(r), Ok(())) = (result, drained_rx.try_recv()) {
                return Ok(r);
            }
            ep.wait(Duration::from_millis(10))
                .map_err(|e| e.to_string())?;
        }
    });
    let mut ep = Endpoint::open(&options(tls)).map_err(|e| e.to_string())?;
    let peer = ep
        .add_peer(&addr_rx.recv().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    back_tx
        .send(ep.local_address())
        .map_err(|e| e.to_string())?;
    let head_len = 24.min(size);
    let body = Rc::new(vec![0x5au8; size - head_len]);
    let mut out = Vec::new();
    let mut seq = 0u64;
    while stop_rx.try_recv().is_err() {
        while ep
            .send(
                peer,
                0,
                vec![0; head_len],
                Some((body.clone(), 0..body.len())),
                seq,
            )
            .map_err(|e| e.to_string())?
        {
            seq += 1;
        }
        ep.progress(&mut out).map_err(|e| e.to_string())?;
        if let Some(Completion::SendFailed { reason, .. }) = out
            .iter()
            .find(|c| matches!(c, Completion::SendFailed { .. }))
        {
            return Err(format!("send failed: {reason}"));
        }
        out.clear();
        ep.wait(Duration::from_millis(10))
            .map_err(|e| e.to_string())?;
    }
    // Let what is in flight arrive before either side closes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ep.outstanding_sends() > 0 && Instant::now() < deadline {
        ep.progress(&mut out).map_err(|e| e.to_string())?;
        out.clear();
        ep.wait(Duration::from_millis(10))
            .map_err(|e| e.to_string())?;
    }
    let _ = drained_tx.send(());
    receiver
        .join()
        .map_err(|_| "receiver thread panicked".to_string())?
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tls = args.first().cloned().unwrap_or_else(|| "tcp".into());
    let seconds: f64 = match args.get(1).map(|s| s.parse()) {
        None => 5.0,
        Some(Ok(s)) if s > 0.0 => s,
        Some(_) => {
            eprintln!("ucx_bw: SECONDS must be a positive number");
            std::process::exit(2);
        }
    };
    let mut sizes = Vec::new();
    for a in args.iter().skip(2) {
        match a.parse::<usize>() {
            Ok(s) if s > 0 => sizes.push(s),
            _ => {
                eprintln!("ucx_bw: bad size `{a}`");
                std::process::exit(2);
            }
        }
    }
    if sizes.is_empty() {
        sizes = (6..=22).map(|p| 1usize << p).collect();
    }
    println!("# evb-ucx Endpoint, UCX_TLS={tls}, {seconds} s per size; columns: bytes MB/s (MB = 2^20 B)");
    for size in sizes {
        match measure(&tls, size, seconds) {
            Ok(mbs) => println!("{size} {mbs:.1}"),
            Err(e) => {
                eprintln!("ucx_bw: size {size}: {e}");
                std::process::exit(1);
            }
        }
    }
}
