//! Loopback ports and HTTP for tests that talk to evb's listeners.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A free loopback port (free when asked: another process may take it
/// before the test binds it, a small race tests accept).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The first of `n` consecutive free loopback ports (checked by binding
/// them all; the same small race as [`free_port`]).
pub fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let base = free_port();
        if base > 60000 {
            continue;
        }
        let held: Vec<TcpListener> = (0..n)
            .filter_map(|i| TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// A plain HTTP/1.0 GET of `path` on loopback `port`; returns (status
/// line, body), or `None` when nothing answers (yet) or the answer is cut.
pub fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_ports_are_free() {
        let base = free_ports(3);
        let held: Vec<TcpListener> = (0..3)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)).expect("free"))
            .collect();
        assert_eq!(held.len(), 3);
    }
}
