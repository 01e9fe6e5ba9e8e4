//! The `GET /metrics` endpoint: one thread, one request per connection,
//! answered and closed.
//!
//! std's `TcpListener` rather than an HTTP crate. The usual small candidate,
//! `tiny_http` 0.12, reads header lines without a length bound, sets no socket
//! timeouts (a client that connects and says nothing holds a thread for
//! good) and starts a thread per waiting connection without a limit, plus
//! four idle threads per endpoint; what it would add (keep-alive, chunked
//! bodies, many headers) a scraper asking once a second does not need. Here
//! a request head is bounded ([`MAX_HEAD`]) and so is the time one
//! connection may take ([`DEADLINE`]), so a slow or hostile client delays
//! the next scrape by at most that, and never the node: the event loop only
//! publishes its report (see [`crate::Metrics::update`]) and the text is
//! encoded here, at scrape time.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

use crate::Metrics;

/// Largest request head read (request line and headers); longer is refused.
pub(crate) const MAX_HEAD: usize = 8 * 1024;

/// Most time one connection may take to send its head and read the answer.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

/// Serves `listener` from a thread named `metrics`.
pub(crate) fn spawn(listener: TcpListener, metrics: Metrics) -> io::Result<()> {
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    // A client that went away is its own problem.
                    let _ = answer(stream, &metrics);
                }
                // Out of descriptors, say: wait instead of spinning.
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        })?;
    Ok(())
}

/// What a request head amounts to.
#[derive(Debug, PartialEq)]
pub(crate) enum Request {
    Metrics,
    OtherPath,
    OtherMethod,
    Malformed,
    TooLarge,
    TimedOut,
}

fn answer(mut stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    let request = read_request(&mut stream, deadline)?;
    let (status, content_type, body) = match request {
        Request::Metrics => ("200 OK", CONTENT_TYPE, metrics.encode()),
        Request::OtherPath => (
            "404 Not Found",
            "text/plain",
            "evb serves /metrics\n".into(),
        ),
        Request::OtherMethod => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics only\n".into(),
        ),
        Request::Malformed => ("400 Bad Request", "text/plain", "bad request\n".into()),
        Request::TooLarge => (
            "431 Request Header Fields Too Large",
            "text/plain",
            format!("request head over {MAX_HEAD} bytes\n"),
        ),
        Request::TimedOut => ("408 Request Timeout", "text/plain", "too slow\n".into()),
    };
    let allow = if request == Request::OtherMethod {
        "Allow: GET\r\n"
    } else {
        ""
    };
    stream.set_write_timeout(Some(remaining(deadline).max(Duration::from_millis(100))))?;
    // One write: the whole answer in as few segments as the kernel likes.
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes())
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Reads the request head (up to its blank line) within `deadline` and
/// [`MAX_HEAD`] bytes, and classifies it. Only an I/O error other than the
/// deadline's is an error.
fn read_request(stream: &mut TcpStream, deadline: Instant) -> io::Result<Request> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(classify(&head[..end]));
        }
        if head.len() >= MAX_HEAD {
            return Ok(Request::TooLarge);
        }
        let left = remaining(deadline);
        if left.is_zero() {
            return Ok(Request::TimedOut);
        }
        stream.set_read_timeout(Some(left))?;
        let want = buf.len().min(MAX_HEAD - head.len());
        match stream.read(&mut buf[..want]) {
            // The client stopped sending before its head ended.
            Ok(0) => return Ok(Request::Malformed),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(Request::TimedOut)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Classifies a request head (without its final blank line) by its request
/// line, `METHOD TARGET HTTP/x.y`.
pub(crate) fn classify(head: &[u8]) -> Request {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Request::Malformed;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Malformed;
    };
    if method.is_empty() || !target.starts_with('/') || !version.starts_with("HTTP/1.") {
        return Request::Malformed;
    }
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    match (method, path) {
        ("GET", "/metrics") => Request::Metrics,
        ("GET", _) => Request::OtherPath,
        _ => Request::OtherMethod,
    }
}
