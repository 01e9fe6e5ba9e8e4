//! The output network: a second network between the Builder Units and the
//! Filter Unit consumers (in LHCb, the event-builder nodes' second NIC to
//! the filter farm), kept apart from the event-building network.
//!
//! Over TCP ([`super::tcp`]) the link of a pair with a consumer at either
//! end listens, dials and runs on the output network; every other link
//! stays on `transport.bind` / `transport.addresses`. So the BUs' built
//! batches (and the consumers' credits) cross the output network, the
//! fragments the event-building one. An endpoint's address on the output
//! network is `output.bind`, the address of `output.interface`, or (for
//! `evb node` with `transport.addresses`) its entry of `output.addresses`;
//! `evb run` and cluster launches publish it next to the event-building
//! address, in one token `EB,OUT`.
//!
//! This module resolves those addresses and dials from a given source.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::FromRawFd;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use evb_core::config::Config;
use evb_core::{Layout, NodeId};
use serde::{Deserialize, Serialize};

/// An endpoint on the output network.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OutputNetworkReport {
    /// Where it listened on the output network.
    pub address: String,
    /// Its links there (a node's with each consumer, a consumer's with
    /// every other endpoint), as the connections' socket addresses.
    pub links: Vec<LinkAddresses>,
}

/// One connection: its peer, its local and remote socket addresses.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LinkAddresses {
    pub peer: u16,
    pub local: String,
    pub remote: String,
}

/// Whether the link between endpoints `a` and `b` runs over the output
/// network (when there is one): a consumer is at one end.
pub fn is_output_link(layout: &Layout, a: NodeId, b: NodeId) -> bool {
    let fu = |n: NodeId| layout.fu_of.get(n as usize).copied().flatten().is_some();
    fu(a) || fu(b)
}

/// A TCP token `EB[,OUT]`: the event-building address and, with an output
/// network, the address there.
pub fn split_token(token: &str) -> (&str, Option<&str>) {
    match token.split_once(',') {
        Some((eb, out)) => (eb, Some(out)),
        None => (token, None),
    }
}

/// Resolves `host:port` (`what` names it in the error).
pub fn resolve(addr: &str, what: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("{what}: cannot resolve `{addr}`"))?
        .next()
        .ok_or_else(|| anyhow!("{what}: `{addr}` has no address"))
}

/// This host's address on the output network from `output.interface` or
/// `output.bind`, with the key it came from; `None` when neither is set.
pub fn local_ip(config: &Config) -> Result<Option<(IpAddr, &'static str)>> {
    let o = &config.output;
    if !o.interface.is_empty() {
        return Ok(Some((interface_address(&o.interface)?, "output.interface")));
    }
    if !o.bind.is_empty() {
        let ip = o
            .bind
            .parse()
            .map_err(|_| anyhow!("output.bind: `{}` is not an IP address", o.bind))?;
        return Ok(Some((ip, "output.bind")));
    }
    Ok(None)
}

/// This host's address on the output network for a node that publishes
/// it (under `evb run` or a launcher), with the key it came from: it must
/// be set and be one a peer can dial.
pub fn published_ip(config: &Config) -> Result<(IpAddr, &'static str)> {
    let (ip, key) = local_ip(config)?.ok_or_else(|| {
        anyhow!(
            "output.addresses is for evb node with transport.addresses: under evb run or a \
             launcher every node publishes its own address; set output.bind or output.interface"
        )
    })?;
    if ip.is_unspecified() {
        bail!(
            "{key}: {ip} is no address a peer can dial: give this host's address on the output \
             network (or output.interface)"
        );
    }
    Ok((ip, key))
}

/// Every endpoint's address on the output network for `evb node` without
/// a launcher: `output.addresses`, or on one host `output.bind` (or the
/// interface's address) with ports after the event-building ones
/// (`transport.base_port + endpoints + i`).
pub fn config_addresses(config: &Config, layout: &Layout) -> Result<Vec<SocketAddr>> {
    let o = &config.output;
    if !o.addresses.is_empty() {
        return o
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| resolve(a, &format!("output.addresses[{i}]")))
            .collect();
    }
    let base = config.transport.base_port;
    match local_ip(config)? {
        Some((ip, _)) if base != 0 => (0..layout.endpoints)
            .map(|i| {
                let port = u32::from(base) + u32::from(layout.endpoints) + u32::from(i);
                let port = u16::try_from(port).map_err(|_| {
                    anyhow!(
                        "transport.base_port: {base} leaves no room for the output network's ports"
                    )
                })?;
                Ok(SocketAddr::new(ip, port))
            })
            .collect(),
        _ => bail!(
            "output.addresses: evb node with transport.addresses needs every endpoint's host:port \
             on the output network too"
        ),
    }
}

/// The address of interface `name`: its IPv4 address, else its first IPv6
/// one that is not link-local. Errors name `output.interface`.
pub fn interface_address(name: &str) -> Result<IpAddr> {
    let mut names: Vec<String> = Vec::new();
    let mut v4 = None;
    let mut v6 = None;
    let mut found = false;
    // SAFETY: getifaddrs fills a list we walk read-only and free once.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return Err(io::Error::last_os_error())
                .context("output.interface: listing this host's interfaces");
        }
        let mut p = head;
        while !p.is_null() {
            let ifa = &*p;
            p = ifa.ifa_next;
            let ifname = std::ffi::CStr::from_ptr(ifa.ifa_name)
                .to_string_lossy()
                .into_owned();
            if !names.contains(&ifname) {
                names.push(ifname.clone());
            }
            if ifname != name {
                continue;
            }
            found = true;
            if ifa.ifa_addr.is_null() {
                continue;
            }
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET if v4.is_none() => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    v4 = Some(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()));
                }
                libc::AF_INET6 if v6.is_none() => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    // fe80::/10 needs a scope id to be dialed: not one to publish.
                    if ip.segments()[0] & 0xffc0 != 0xfe80 {
                        v6 = Some(IpAddr::V6(ip));
                    }
                }
                _ => {}
            }
        }
        libc::freeifaddrs(head);
    }
    if !found {
        bail!(
            "output.interface: there is no interface `{name}` on this host (it has {})",
            names.join(", ")
        );
    }
    v4.or(v6).ok_or_else(|| {
        anyhow!("output.interface: interface `{name}` has no IPv4 or global IPv6 address")
    })
}

/// A TCP connection to `addr` within `timeout`, from `from` (a port the OS
/// picks) when given: the output network's links leave from this host's
/// address on it.
pub fn connect_from(
    addr: SocketAddr,
    from: Option<IpAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let Some(from) = from else {
        return TcpStream::connect_timeout(&addr, timeout);
    };
    let (domain, local, remote) = match (from, addr) {
        (IpAddr::V4(_), SocketAddr::V4(_)) => (libc::AF_INET, SocketAddr::new(from, 0), addr),
        (IpAddr::V6(_), SocketAddr::V6(_)) => (libc::AF_INET6, SocketAddr::new(from, 0), addr),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot reach {addr} from {from}: one is IPv4, the other IPv6"),
            ))
        }
    };
    // SAFETY: a socket we own (closed by `TcpStream` or on error), plain
    // calls with sockaddr buffers of the right length.
    unsafe {
        let fd = libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let (sa, len) = sockaddr(&local);
        if libc::bind(fd, &sa as *const _ as *const libc::sockaddr, len) != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("binding to {from}: {e}")));
        }
        let (sa, len) = sockaddr(&remote);
        if libc::connect(fd, &sa as *const _ as *const libc::sockaddr, len) != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
            match libc::poll(&mut pfd, 1, ms) {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "connection timed out",
                    ))
                }
                n if n < 0 => return Err(io::Error::last_os_error()),
                _ => {}
            }
            if let Some(e) = stream.take_error()? {
                return Err(e);
            }
        }
        stream.set_nonblocking(false)?;
        Ok(stream)
    }
}

/// `addr` as a C socket address and its length.
fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage; the casts stay within it.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in);
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6);
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr.s6_addr = a.ip().octets();
                sin6.sin6_flowinfo = a.flowinfo();
                sin6.sin6_scope_id = a.scope_id();
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        (ss, len as libc::socklen_t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dials_from_the_given_source_address() {
        // 127.0.0.2 is loopback too: the connection must come from it.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = l.local_addr().unwrap();
        let from: IpAddr = "127.0.0.2".parse().unwrap();
        let s = connect_from(to, Some(from), Duration::from_secs(2)).unwrap();
        assert_eq!(s.local_addr().unwrap().ip(), from);
        let (_, peer) = l.accept().unwrap();
        assert_eq!(peer.ip(), from);
        // Nothing listens here once the listener is gone: refused, fast.
        drop(l);
        let e = connect_from(to, Some(from), Duration::from_secs(2)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        let e = connect_from(to, Some("::1".parse().unwrap()), Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("IPv4"), "{e}");
    }

    #[test]
    fn interfaces_by_name() {
        assert_eq!(
            interface_address("lo").unwrap(),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        let e = interface_address("evbnope0").unwrap_err().to_string();
        assert!(
            e.contains("output.interface") && e.contains("`evbnope0`"),
            "{e}"
        );
        assert!(e.contains("lo"), "the interfaces there are named: {e}");
    }

    #[test]
    fn tokens_split_at_the_comma() {
        assert_eq!(split_token("7100"), ("7100", None));
        assert_eq!(
            split_token("10.0.0.1:7100,10.1.0.1:7200"),
            ("10.0.0.1:7100", Some("10.1.0.1:7200"))
        );
        assert_eq!(split_token("[::1]:1,[::1]:2"), ("[::1]:1", Some("[::1]:2")));
    }
}
