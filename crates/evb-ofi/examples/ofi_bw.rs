//! The same measurement as bench/peers/fi_bw.c, through evb-ofi's Endpoint
//! (head + shared body per message, as the runtime sends fragments), so the
//! cost of the Rust layer can be read off side by side with the C peer.
//!
//! usage: cargo run --release -p evb-ofi --example ofi_bw -- [PROVIDER] [busy] [MAX_SIZE]
//! It starts its own receiver as a second process (same binary, `--sink`).

use evb_ofi::{Completion, Endpoint, Options, Progress};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

const TAG_BW: u64 = 1;
const TAG_ACK: u64 = 2;
const TAG_LAT: u64 = 3;
const WINDOW: usize = 64;

fn iterations(size: usize) -> u64 {
    ((256usize << 20) / size).clamp(32, 20000) as u64
}

fn lat_iterations(size: usize) -> u64 {
    if size <= 65536 {
        1000
    } else if size <= 1 << 20 {
        100
    } else {
        30
    }
}

fn open(provider: &str, busy: bool) -> Endpoint {
    let mut opts = Options::new(provider);
    if provider == "tcp" || provider == "udp" {
        opts.domain = Some("lo".into());
    }
    opts.progress = if busy {
        Progress::Busy
    } else {
        Progress::Blocking
    };
    Endpoint::open(&opts).unwrap_or_else(|e| {
        eprintln!("ofi_bw: {e}");
        std::process::exit(1)
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s = s.trim();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex address"))
        .collect()
}

/// Progresses, handing each completion to `on`, until `on` says stop.
fn drive(ep: &mut Endpoint, mut on: impl FnMut(&mut Endpoint, Completion) -> bool) {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        ep.progress(&mut out).expect("progress");
        if out.is_empty() {
            assert!(Instant::now() < deadline, "ofi_bw: no progress for 120 s");
            ep.wait(Duration::from_millis(100)).expect("wait");
        }
        for c in out.drain(..) {
            if let Completion::SendFailed { reason, .. }
            | Completion::ReceiveFailed { reason, .. } = &c
            {
                panic!("ofi_bw: {reason}");
            }
            if on(ep, c) {
                return;
            }
        }
    }
}

fn send(ep: &mut Endpoint, tag: u64, len: usize, body: &Rc<Vec<u8>>) {
    let head = vec![0u8; 16];
    let range = 0..len.saturating_sub(16);
    while !ep
        .send(0, tag, head.clone(), Some((body.clone(), range.clone())), 0)
        .expect("send")
    {
        let mut out = Vec::new();
        ep.progress(&mut out).expect("progress");
        assert!(out.is_empty(), "ofi_bw: completion while retrying a send");
    }
}

fn sink(provider: &str, busy: bool, max: usize) {
    let mut ep = open(provider, busy);
    println!("{}", hex(&ep.local_address()));
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    ep.add_peer(&unhex(&line)).unwrap();
    let body = Rc::new(vec![0x5Au8; max]);
    for _ in 0..WINDOW {
        ep.post_recv(Vec::with_capacity(ep.max_message_size()))
            .unwrap();
    }
    let mut size = 64;
    while size <= max {
        let mut got = 0;
        drive(&mut ep, |ep, c| {
            if let Completion::Received { buf, tag, .. } = c {
                assert_eq!(tag, TAG_BW);
                got += 1;
                ep.post_recv(buf).unwrap();
            }
            got == iterations(size)
        });
        send(&mut ep, TAG_ACK, 16, &body);
        for _ in 0..lat_iterations(size) {
            let mut back = false;
            drive(&mut ep, |ep, c| {
                if let Completion::Received { buf, .. } = c {
                    ep.post_recv(buf).unwrap();
                    back = true;
                }
                back
            });
            send(&mut ep, TAG_LAT, size, &body);
        }
        size *= 2;
    }
    flush(&mut ep);
}

/// Waits until every send has completed.
fn flush(ep: &mut Endpoint) {
    if ep.outstanding_sends() > 0 {
        drive(ep, |ep, _| ep.outstanding_sends() == 0);
    }
}

/// Streams `n` messages of `size` bytes with up to WINDOW in flight; the
/// sink's ack ends it. Returns the seconds it took.
fn stream(ep: &mut Endpoint, body: &Rc<Vec<u8>>, size: usize, n: u64) -> f64 {
    let t0 = Instant::now();
    let mut posted = 0;
    loop {
        while posted < n && ep.outstanding_sends() < WINDOW {
            let range = 0..size - 16;
            if !ep
                .send(
                    0,
                    TAG_BW,
                    vec![0u8; 16],
                    Some((body.clone(), range)),
                    posted,
                )
                .unwrap()
            {
                break;
            }
            posted += 1;
        }
        let mut acked = false;
        let mut out = Vec::new();
        ep.progress(&mut out).unwrap();
        for c in out {
            if let Completion::Received { buf, .. } = c {
                ep.post_recv(buf).unwrap();
                acked = true;
            }
        }
        if acked {
            break;
        }
        if posted == n || ep.outstanding_sends() >= WINDOW {
            ep.wait(Duration::from_millis(100)).unwrap();
        }
    }
    t0.elapsed().as_secs_f64()
}

/// Half the mean round trip of a `size`-byte message and the sink's
/// answer, microseconds.
fn round_trip_us(ep: &mut Endpoint, body: &Rc<Vec<u8>>, size: usize) -> f64 {
    let lat_n = lat_iterations(size);
    let l0 = Instant::now();
    for _ in 0..lat_n {
        send(ep, TAG_LAT, size, body);
        let mut back = false;
        drive(ep, |ep, c| {
            if let Completion::Received { buf, .. } = c {
                ep.post_recv(buf).unwrap();
                back = true;
            }
            back && ep.outstanding_sends() == 0
        });
    }
    l0.elapsed().as_secs_f64() / lat_n as f64 / 2.0 * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let is_sink = args.first().map(|a| a == "--sink").unwrap_or(false);
    let rest = if is_sink { &args[1..] } else { &args[..] };
    let provider = rest.first().cloned().unwrap_or_else(|| "tcp".into());
    let busy = rest.get(1).map(|a| a == "busy").unwrap_or(false);
    let max: usize = rest
        .get(2)
        .and_then(|m| m.parse().ok())
        .unwrap_or(4 << 20)
        .min(4 << 20);
    if is_sink {
        return sink(&provider, busy, max);
    }
    let mut ep = open(&provider, busy);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--sink",
            &provider,
            if busy { "busy" } else { "blocking" },
            &max.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the sink");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    ep.add_peer(&unhex(&line)).unwrap();
    writeln!(
        child.stdin.as_mut().unwrap(),
        "{}",
        hex(&ep.local_address())
    )
    .unwrap();
    for _ in 0..4 {
        ep.post_recv(Vec::with_capacity(ep.max_message_size()))
            .unwrap();
    }
    let body = Rc::new(vec![0xA5u8; max]);
    println!(
        "# ofi_bw (evb-ofi) provider {} window {WINDOW} {}",
        ep.provider(),
        if busy { "busy" } else { "blocking" }
    );
    println!("# {:>10} {:>12} {:>10}", "size_B", "MB/s", "lat_us");
    let mut size = 64;
    while size <= max {
        let n = iterations(size);
        let bw_s = stream(&mut ep, &body, size, n);
        flush(&mut ep);
        let lat_us = round_trip_us(&mut ep, &body, size);
        println!(
            "{size:>12} {:>12.1} {lat_us:>10.2}",
            (size as u64 * n) as f64 / bw_s / 1e6
        );
        size *= 2;
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "sink failed: {status}");
}
