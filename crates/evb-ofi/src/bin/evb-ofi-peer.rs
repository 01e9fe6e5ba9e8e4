//! A second process for the cross-process tests (and for trying a provider by
//! hand): it prints its endpoint address as hex on stdout, reads the peer's
//! from stdin, then echoes every message it receives back to the sender with
//! the same tag, until stdin closes or the peer sends an empty message.
//!
//! usage: `evb-ofi-peer PROVIDER [DOMAIN]`

use evb_ofi::{Completion, Endpoint, Options};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

fn main() {
    if let Err(e) = run() {
        eprintln!("evb-ofi-peer: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(provider) = args.first() else {
        return Err("usage: evb-ofi-peer PROVIDER [DOMAIN]".into());
    };
    let mut opts = Options::new(provider);
    opts.domain = args.get(1).cloned();
    let mut ep = Endpoint::open(&opts).map_err(|e| e.to_string())?;
    let hex: String = ep
        .local_address()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("{hex}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;

    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("reading the peer address: {e}"))?;
    let line = line.trim();
    if line.is_empty() || line.len() & 1 != 0 || line.len() > 1024 {
        return Err(format!(
            "peer address line `{line}` is not an even-length hex string"
        ));
    }
    let addr: Vec<u8> = (0..line.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&line[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("peer address `{line}`: {e}"))?;
    let peer = ep.add_peer(&addr).map_err(|e| e.to_string())?;
    for _ in 0..8 {
        ep.post_recv(Vec::with_capacity(ep.max_message_size()))
            .map_err(|e| e.to_string())?;
    }

    // Echoes waiting for the library to accept them, in arrival order.
    let mut backlog: std::collections::VecDeque<(u64, Vec<u8>)> = Default::default();
    let mut out = Vec::new();
    let mut done = false;
    let idle_limit = Duration::from_secs(60);
    let mut last_news = Instant::now();
    while !(done && backlog.is_empty() && ep.outstanding_sends() == 0) {
        if last_news.elapsed() > idle_limit {
            return Err("no traffic for 60 s; giving up".into());
        }
        while let Some((tag, msg)) = backlog.pop_front() {
            let copy = msg.clone();
            if !ep
                .send(peer, tag, msg, None, 0)
                .map_err(|e| e.to_string())?
            {
                backlog.push_front((tag, copy));
                break;
            }
        }
        ep.progress(&mut out).map_err(|e| e.to_string())?;
        if out.is_empty() {
            ep.wait(Duration::from_millis(10))
                .map_err(|e| e.to_string())?;
            continue;
        }
        last_news = Instant::now();
        for c in out.drain(..) {
            match c {
                Completion::Received { buf, tag, .. } => {
                    if buf.is_empty() {
                        done = true;
                    } else {
                        backlog.push_back((tag, buf));
                    }
                    ep.post_recv(Vec::with_capacity(ep.max_message_size()))
                        .map_err(|e| e.to_string())?;
                }
                Completion::Sent { .. } | Completion::PeerJoined { .. } => {}
                Completion::SendFailed { reason, .. } => {
                    return Err(format!("echo failed: {reason}"))
                }
                // evb-ofi does not report it (a lost peer shows as failed sends).
                Completion::PeerFailed { reason, .. } => {
                    return Err(format!("peer failed: {reason}"))
                }
                Completion::ReceiveFailed { reason, .. } | Completion::Unattributed { reason } => {
                    return Err(format!("receive failed: {reason}"))
                }
            }
        }
    }
    Ok(())
}
