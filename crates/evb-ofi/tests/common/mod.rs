//! Shared by the integration tests: endpoints on loopback, a pattern that
//! makes every byte of a message checkable, and a deadline so nothing hangs.
#![allow(dead_code)]

use evb_ofi::{Completion, Endpoint, Options, Progress};
pub use evb_testkit::process::Deadline;
use std::time::Duration;

/// Opens an endpoint on loopback for tcp/udp, or the provider's own domain.
pub fn open(provider: &str) -> Endpoint {
    open_mode(provider, Progress::Blocking)
}

pub fn open_mode(provider: &str, progress: Progress) -> Endpoint {
    let mut opts = Options::new(provider);
    if provider == "tcp" || provider == "udp" {
        opts.domain = Some("lo".into());
    }
    opts.progress = progress;
    Endpoint::open(&opts).unwrap_or_else(|e| {
        panic!("prerequisite missing: cannot open libfabric provider {provider}: {e}")
    })
}

/// Byte `i` of message `seq` from sender `from`.
pub fn pattern(from: u64, seq: u64, i: usize) -> u8 {
    (i as u64)
        .wrapping_mul(31)
        .wrapping_add(seq.wrapping_mul(7))
        .wrapping_add(from * 101) as u8
}

/// A message: 16-byte head (sender, seq) and a body cut from a larger shared buffer.
pub fn make_message(
    from: u64,
    seq: u64,
    body_len: usize,
) -> (Vec<u8>, std::rc::Rc<Vec<u8>>, std::ops::Range<usize>) {
    let mut head = Vec::with_capacity(16);
    head.extend_from_slice(&from.to_le_bytes());
    head.extend_from_slice(&seq.to_le_bytes());
    // The body sits at an offset inside its buffer, as fragments do in a MEP.
    let offset = 24;
    let mut buf = vec![0xEEu8; offset + body_len + 8];
    for i in 0..body_len {
        buf[offset + i] = pattern(from, seq, i);
    }
    (head, std::rc::Rc::new(buf), offset..offset + body_len)
}

/// Checks a received message; returns (sender, seq).
pub fn check_message(buf: &[u8], expect_body_len: Option<usize>) -> (u64, u64) {
    assert!(
        buf.len() >= 16,
        "message of {} bytes is shorter than its head",
        buf.len()
    );
    let from = u64::from_le_bytes(buf[0..8].try_into().unwrap());
    let seq = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let body = &buf[16..];
    if let Some(n) = expect_body_len {
        assert_eq!(body.len(), n, "message {seq} from {from}: body length");
    }
    if let Some(i) = body
        .iter()
        .enumerate()
        .position(|(i, &b)| b != pattern(from, seq, i))
    {
        panic!(
            "message {seq} from {from}: byte {i} of {} is wrong",
            body.len()
        );
    }
    (from, seq)
}

/// Progresses every endpoint once, sleeping briefly on the first if none had news.
pub fn pump(eps: &mut [&mut Endpoint], outs: &mut [Vec<Completion>]) {
    let mut any = false;
    for (ep, out) in eps.iter_mut().zip(outs.iter_mut()) {
        let before = out.len();
        ep.progress(out).expect("progress");
        any |= out.len() > before;
    }
    if !any {
        eps[0].wait(Duration::from_micros(500)).expect("wait");
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    let s = s.trim();
    assert!(s.len() & 1 == 0, "odd hex address `{s}`");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex address"))
        .collect()
}

/// Sends, retrying while the library says "try again" (a connection being set
/// up, a full queue), progressing every endpoint meanwhile.
pub fn send_retry(
    eps: &mut [&mut Endpoint],
    outs: &mut [Vec<Completion>],
    sender: usize,
    peer: evb_ofi::PeerId,
    tag: u64,
    make: impl Fn() -> (Vec<u8>, std::rc::Rc<Vec<u8>>, std::ops::Range<usize>),
    ctx: u64,
) {
    let deadline = Deadline::new(20, "send_retry: the library kept saying try again");
    loop {
        let (head, body, range) = make();
        if eps[sender]
            .send(peer, tag, head, Some((body, range)), ctx)
            .expect("send")
        {
            return;
        }
        deadline.check();
        pump(eps, outs);
    }
}
