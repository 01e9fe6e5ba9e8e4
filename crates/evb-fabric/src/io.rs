//! Readers and writers for the files of a real fabric: `ibnetdiscover`
//! output, ibsim net files, LFT dumps (`opensm-lfts.dump` and
//! `dump_lfts`/`ibroute` output), hostfiles, OpenSM's ftree CA order and
//! Slurm's `topology.conf`.

use crate::error::{io_err, parse_err, FabricError, Result};
use crate::lft::{LftOrigin, Lfts, NO_PATH};
use crate::names::guid_name;
use crate::rate::LinkRate;
use crate::topo::{NodeKind, Topology};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| io_err(path, e))
}

pub fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| io_err(path, e))
}

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if s.is_empty() {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// Text between the first pair of double quotes, and the rest after it.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let a = s.find('"')?;
    let b = s[a + 1..].find('"')? + a + 1;
    Some((&s[a + 1..b], &s[b + 1..]))
}

/// `[12]` at the start of `s`: the number and the rest.
fn bracket_num(s: &str) -> Option<(u32, &str)> {
    let s = s.trim_start().strip_prefix('[')?;
    let e = s.find(']')?;
    Some((s[..e].trim().parse().ok()?, &s[e + 1..]))
}

/// `(hex)` at the start of `s`.
fn paren_hex(s: &str) -> Option<(u64, &str)> {
    let s = s.trim_start().strip_prefix('(')?;
    let e = s.find(')')?;
    Some((parse_hex(&s[..e])?, &s[e + 1..]))
}

fn lid_after(comment: &str, key: &str) -> Option<u16> {
    let mut it = comment.split_whitespace();
    while let Some(w) = it.next() {
        if w == key {
            return it.next()?.parse().ok();
        }
    }
    None
}

/// The link width and speed in a port line's comment (`... lid 5 4xQDR`):
/// the word after the last quoted text that reads WIDTHxSPEED. A word of
/// that shape that is not a known width and speed is an error.
fn link_rate_in(comment: &str) -> std::result::Result<Option<LinkRate>, String> {
    let tail = comment.rsplit_once('"').map_or(comment, |x| x.1);
    for w in tail.split_whitespace() {
        let b = w.as_bytes();
        let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let shaped = (1..=3).contains(&digits)
            && !w.starts_with("0x")
            && matches!(b.get(digits), Some(b'x' | b'X'))
            && b.get(digits + 1).is_some_and(u8::is_ascii_alphabetic)
            && b[digits + 1..].iter().all(u8::is_ascii_alphanumeric);
        if shaped {
            return LinkRate::parse(w)
                .map(Some)
                .map_err(|e| format!("link {e}"));
        }
    }
    Ok(None)
}

/// Reads `ibnetdiscover` output (also the ibsim net format it is compatible
/// with). Nodes are named uniquely (see [`crate::names`]); link widths and
/// speeds are kept when printed.
pub fn parse_ibnetdiscover(path: &Path) -> Result<Topology> {
    let text = read_text(path)?;
    parse_ibnetdiscover_str(path, &text)
}

pub fn parse_ibnetdiscover_str(path: &Path, text: &str) -> Result<Topology> {
    let mut topo = Topology::default();
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut cables: Vec<Cable> = vec![];
    let mut cur: Option<usize> = None;
    let mut pending_guid: Option<u64> = None;
    let mut synthetic = 1u64;
    let mut lines = 0;
    for (i, raw) in text.lines().enumerate() {
        let ln = i + 1;
        lines = ln;
        let line = raw.trim();
        if line.is_empty() {
            cur = None;
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            if !line.starts_with('[') && !line.contains('"') {
                if matches!(k.trim(), "switchguid" | "caguid" | "rtguid") {
                    let v = v.split('(').next().unwrap_or("");
                    pending_guid = Some(
                        parse_hex(v)
                            .ok_or_else(|| parse_err(path, ln, format!("bad GUID in '{line}'")))?,
                    );
                }
                continue;
            }
        }
        let first = line.split_whitespace().next().unwrap_or("");
        let kind = match first {
            "Switch" => Some(NodeKind::Switch),
            "Ca" | "Hca" => Some(NodeKind::Host),
            "Rt" => return Err(parse_err(path, ln, "routers are not supported")),
            _ => None,
        };
        if let Some(kind) = kind {
            let rest = line[first.len()..].trim_start();
            let nports: usize = rest
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .filter(|&n: &usize| (1..=254).contains(&n))
                .ok_or_else(|| parse_err(path, ln, format!("bad port count in '{line}'")))?;
            let (id, after) =
                quoted(rest).ok_or_else(|| parse_err(path, ln, "missing quoted node id"))?;
            let comment = after.split_once('#').map(|x| x.1).unwrap_or("");
            let desc = quoted(comment).map(|x| x.0);
            let guid = record_guid(id, pending_guid.take(), &mut synthetic);
            // Unique names are given once all nodes are read.
            let desc = match desc {
                Some(d) if !d.trim().is_empty() => d.trim(),
                _ => id,
            };
            if ids.contains_key(id) {
                return Err(parse_err(path, ln, format!("node '{id}' appears twice")));
            }
            let n = topo.add_node(kind, id, guid, nports);
            topo.nodes[n].desc = desc.to_string();
            if kind == NodeKind::Switch {
                topo.nodes[n].lid = lid_after(comment, "lid").unwrap_or(0);
            }
            ids.insert(id.to_string(), n);
            cur = Some(n);
            continue;
        }
        if line.starts_with('[') {
            cables.push(parse_port_line(path, ln, line, &mut topo, cur)?);
            continue;
        }
        if ["vendid", "devid", "sysimgguid"]
            .iter()
            .any(|k| line.starts_with(k))
        {
            continue;
        }
        return Err(parse_err(
            path,
            ln,
            format!("not ibnetdiscover format: '{line}'"),
        ));
    }
    if topo.nodes.is_empty() {
        return Err(parse_err(
            path,
            lines,
            "no Switch or Ca records (empty or not an ibnetdiscover file)",
        ));
    }
    connect_cables(path, &mut topo, &ids, cables)?;
    crate::names::assign_unique_names(&mut topo, &[]);
    check_lids(path, lines, &topo)?;
    Ok(topo)
}

/// The GUID of a node record: the `switchguid=`/`caguid=` line before it
/// (`pending`), else the one in an `S-`/`H-` id, else a made-up one, unique
/// in the file (`synthetic` counts them).
fn record_guid(id: &str, pending: Option<u64>, synthetic: &mut u64) -> u64 {
    pending
        .or_else(|| {
            id.get(2..).and_then(|g| {
                if id.starts_with("S-") || id.starts_with("H-") {
                    parse_hex(g)
                } else {
                    None
                }
            })
        })
        .unwrap_or_else(|| {
            *synthetic += 1;
            0x00e0_0000_0000_0000 + *synthetic * 2
        })
}

/// Hosts whose LID was not printed keep LID 0 and are unusable: an error
/// that says so (at `lines`, the end of the file).
fn check_lids(path: &Path, lines: usize, topo: &Topology) -> Result<()> {
    for n in &topo.nodes {
        if n.lid == 0 && n.first_port().is_some() {
            return Err(parse_err(
                path,
                lines,
                format!(
                    "node '{}' has no LID (run ibnetdiscover on a configured subnet)",
                    n.name
                ),
            ));
        }
    }
    Ok(())
}

/// One cable end as an ibnetdiscover port line gives it: (line, node,
/// port, remote node id, remote port, link rate). Connected once every
/// node is read.
type Cable = (usize, usize, u8, String, u8, Option<LinkRate>);

/// A `[port] ... "remote" [rport]` line of node `cur`: the cable end it
/// describes (and the host's LID and port GUID it may carry).
fn parse_port_line(
    path: &Path,
    ln: usize,
    line: &str,
    topo: &mut Topology,
    cur: Option<usize>,
) -> Result<Cable> {
    let n = cur.ok_or_else(|| parse_err(path, ln, "port line outside a Switch/Ca record"))?;
    let (port, mut rest) =
        bracket_num(line).ok_or_else(|| parse_err(path, ln, format!("bad port in '{line}'")))?;
    if port == 0 || port as usize > topo.nodes[n].nports() {
        return Err(parse_err(
            path,
            ln,
            format!("port {port} out of range for '{}'", topo.nodes[n].name),
        ));
    }
    // Some versions print an extra [ext port]; Ca lines carry (portguid).
    if let Some((_, r)) = bracket_num(rest) {
        rest = r;
    }
    if let Some((g, r)) = paren_hex(rest) {
        if !topo.nodes[n].is_switch() {
            topo.nodes[n].port_guid = g;
        }
        rest = r;
    }
    let (rid, after) = quoted(rest)
        .ok_or_else(|| parse_err(path, ln, format!("missing remote node in '{line}'")))?;
    let (rport, after) = bracket_num(after)
        .ok_or_else(|| parse_err(path, ln, format!("missing remote port in '{line}'")))?;
    if rport == 0 || rport > 254 {
        return Err(parse_err(path, ln, format!("bad remote port {rport}")));
    }
    let comment = after.split_once('#').map(|x| x.1).unwrap_or("");
    if !topo.nodes[n].is_switch() {
        if let Some(l) = lid_after(comment, "lid") {
            topo.nodes[n].lid = l;
        }
    }
    let rate = link_rate_in(comment).map_err(|e| parse_err(path, ln, e))?;
    Ok((ln, n, port as u8, rid.to_string(), rport as u8, rate))
}

/// Connects the cables read, checking that both ends of each agree (on the
/// ports and on the rate).
fn connect_cables(
    path: &Path,
    topo: &mut Topology,
    ids: &HashMap<String, usize>,
    cables: Vec<Cable>,
) -> Result<()> {
    // Line of the first sighting of each cable end, for rate mismatches.
    let mut seen_at: HashMap<(usize, u8), usize> = HashMap::new();
    for (ln, n, p, rid, rp, rate) in cables {
        let r = *ids.get(&rid).ok_or_else(|| {
            parse_err(
                path,
                ln,
                format!("cable to unknown node '{rid}' (file truncated?)"),
            )
        })?;
        if rp as usize > topo.nodes[r].nports() {
            return Err(parse_err(path, ln, format!("'{rid}' has no port {rp}")));
        }
        let here = topo.nodes[n].ports[p as usize];
        let there = topo.nodes[r].ports[rp as usize];
        match (here, there) {
            (None, None) => {
                topo.connect_rated(n, p, r, rp, rate)?;
                seen_at.insert((n, p), ln);
            }
            (Some(a), Some(b)) if a.node == r && a.port == rp && b.node == n && b.port == p => {
                // Both ends print the link's rate; they must agree.
                match (a.rate, rate) {
                    (Some(x), Some(y)) if x != y => {
                        let first = seen_at.get(&(r, rp)).copied().unwrap_or(0);
                        return Err(parse_err(
                            path,
                            ln,
                            format!(
                                "cable {}[{p}] - {rid}[{rp}] is {y} here but {x} at line {first}",
                                topo.nodes[n].desc
                            ),
                        ));
                    }
                    (None, Some(_)) => topo.set_link_rate(n, p, rate)?,
                    _ => {}
                }
            }
            _ => {
                return Err(parse_err(
                    path,
                    ln,
                    format!(
                        "cable {}[{p}] - {rid}[{rp}] contradicts an earlier line",
                        topo.nodes[n].name
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// The id of a node in the net files evb writes for ibsim: its GUID name
/// (ibsim's `SIM_HOST` names the node the SM attaches to by this id).
pub fn ibsim_node_id(topo: &Topology, i: usize) -> String {
    guid_name(topo.nodes[i].kind, topo.nodes[i].guid)
}

/// A node description as a net file can quote it.
fn quotable(desc: &str) -> String {
    desc.replace('"', "'")
}

/// Writes the fabric as an ibsim net file: nodes by GUID (`caguid=` /
/// `switchguid=` before each, so ibsim gives them evb's GUIDs), their
/// descriptions, and each link's width and speed at both ends (ibsim
/// negotiates a link to what both ends enable; unset ends run 4xSDR).
pub fn write_ibsim_net(topo: &Topology) -> String {
    let mut s = String::from("# ibsim net file written by evb fabric\n\n");
    // Hosts first: ibsim attaches the SM to the first node.
    let order: Vec<usize> = topo.hosts().into_iter().chain(topo.switches()).collect();
    for i in order {
        let n = &topo.nodes[i];
        let (kind, key) = if n.is_switch() {
            ("Switch", "switchguid")
        } else {
            ("Hca", "caguid")
        };
        let _ = writeln!(s, "{key}=0x{:016x}", n.guid);
        let _ = writeln!(
            s,
            "{kind}\t{} \"{}\"\t# \"{}\"",
            n.nports(),
            ibsim_node_id(topo, i),
            quotable(&n.desc)
        );
        for p in 1..n.ports.len() {
            if let Some(r) = n.ports[p] {
                let rate = r.rate.map(|x| format!("\t# lid 0 {x}")).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "[{p}]\t\"{}\"[{}]{rate}",
                    ibsim_node_id(topo, r.node),
                    r.port
                );
            }
        }
        s.push('\n');
    }
    s
}

/// Writes `ibnetdiscover`-style text (so evb can re-read a generated fabric).
pub fn write_ibnetdiscover(topo: &Topology) -> String {
    let id = |i: usize| guid_name(topo.nodes[i].kind, topo.nodes[i].guid);
    let rate = |r: &crate::topo::PortRef| r.rate.map(|x| format!(" {x}")).unwrap_or_default();
    let mut s = String::from("#\n# Topology file: written by evb fabric\n#\n\n");
    for i in 0..topo.nodes.len() {
        let n = &topo.nodes[i];
        if n.is_switch() {
            let _ = writeln!(s, "switchguid=0x{:x}", n.guid);
            let _ = writeln!(
                s,
                "Switch\t{} \"{}\"\t\t# \"{}\" base port 0 lid {} lmc 0",
                n.nports(),
                id(i),
                quotable(&n.desc),
                n.lid
            );
            for p in 1..n.ports.len() {
                if let Some(r) = n.ports[p] {
                    let rn = &topo.nodes[r.node];
                    let g = if rn.is_switch() {
                        String::new()
                    } else {
                        format!("({:x})", rn.port_guid)
                    };
                    let _ = writeln!(
                        s,
                        "[{p}]\t\"{}\"[{}]{g}\t\t# \"{}\" lid {}{}",
                        id(r.node),
                        r.port,
                        quotable(&rn.desc),
                        rn.lid,
                        rate(&r)
                    );
                }
            }
        } else {
            let _ = writeln!(s, "caguid=0x{:x}", n.guid);
            let _ = writeln!(
                s,
                "Ca\t{} \"{}\"\t\t# \"{}\"",
                n.nports(),
                id(i),
                quotable(&n.desc)
            );
            for p in 1..n.ports.len() {
                if let Some(r) = n.ports[p] {
                    let rn = &topo.nodes[r.node];
                    let _ = writeln!(
                        s,
                        "[{p}]({:x})\t\"{}\"[{}]\t\t# lid {} lmc 0 \"{}\" lid {}{}",
                        n.port_guid,
                        id(r.node),
                        r.port,
                        n.lid,
                        quotable(&rn.desc),
                        rn.lid,
                        rate(&r)
                    );
                }
            }
        }
        s.push('\n');
    }
    s
}

/// Reads LFTs in either form: OpenSM's `opensm-lfts.dump` or the output of
/// `dump_lfts`/`ibroute`. Switches are matched by GUID.
pub fn parse_lfts(path: &Path, topo: &Topology) -> Result<Lfts> {
    let text = read_text(path)?;
    parse_lfts_str(path, &text, topo)
}

pub fn parse_lfts_str(path: &Path, text: &str, topo: &Topology) -> Result<Lfts> {
    let by_guid: HashMap<u64, usize> = topo
        .switches()
        .into_iter()
        .map(|s| (topo.nodes[s].guid, s))
        .collect();
    let lid_table = topo.lid_table();
    let mut lfts = Lfts::empty(topo);
    let mut header_line = vec![0usize; topo.nodes.len()];
    let mut cur: Option<usize> = None;
    let mut tables = 0;
    let mut lines = 0;
    for (i, raw) in text.lines().enumerate() {
        let ln = i + 1;
        lines = ln;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("Unicast lids") {
            let s = table_switch(path, ln, line, &by_guid)?;
            if header_line[s] != 0 {
                return Err(parse_err(
                    path,
                    ln,
                    format!(
                        "second table for switch '{}' (first at line {})",
                        topo.nodes[s].name, header_line[s]
                    ),
                ));
            }
            header_line[s] = ln;
            cur = Some(s);
            tables += 1;
            continue;
        }
        if line.starts_with("0x") {
            let s = cur
                .ok_or_else(|| parse_err(path, ln, "LFT entry before any 'Unicast lids' header"))?;
            let (lid, port) = lft_entry(path, ln, line, topo, &lid_table, s)?;
            lfts.set(s, lid, port);
            continue;
        }
        let l = line.to_ascii_lowercase();
        if l.contains("lids dumped")
            || l.starts_with("lid")
            || l.starts_with("port")
            || l.starts_with("multicast")
            // dump_lfts ends with a deprecation warning on stdout.
            || l.starts_with("*** warning")
        {
            continue;
        }
        return Err(parse_err(
            path,
            ln,
            format!("not an LFT dump line: '{line}'"),
        ));
    }
    if tables == 0 {
        return Err(parse_err(
            path,
            lines,
            "no 'Unicast lids' tables found (empty or not an LFT dump)",
        ));
    }
    lfts.origin = Some(LftOrigin {
        file: path.to_path_buf(),
        header_line,
    });
    Ok(lfts)
}

/// The switch whose table a `Unicast lids ... guid 0x...:` header starts.
fn table_switch(
    path: &Path,
    ln: usize,
    line: &str,
    by_guid: &HashMap<u64, usize>,
) -> Result<usize> {
    let g = line
        .split_once(" guid 0x")
        .and_then(|(_, r)| {
            parse_hex(
                r.split(|c: char| c.is_whitespace() || c == ':')
                    .next()
                    .unwrap_or(""),
            )
        })
        .ok_or_else(|| parse_err(path, ln, "cannot read the switch GUID of this table"))?;
    by_guid.get(&g).copied().ok_or_else(|| {
        parse_err(
            path,
            ln,
            format!("switch GUID 0x{g:016x} is not in the topology"),
        )
    })
}

/// A `0xLID PORT ...` entry of switch `s`'s table: the LID must be one a
/// node of the topology has, the port one the switch has.
fn lft_entry(
    path: &Path,
    ln: usize,
    line: &str,
    topo: &Topology,
    lid_table: &[Option<usize>],
    s: usize,
) -> Result<(u16, u8)> {
    let mut it = line.split_whitespace();
    let lid = it
        .next()
        .and_then(parse_hex)
        .filter(|&l| l <= 0xBFFF)
        .ok_or_else(|| parse_err(path, ln, format!("bad LID in '{line}'")))? as u16;
    let port: u8 =
        it.next()
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p < 255)
            .ok_or_else(|| parse_err(path, ln, format!("bad port in '{line}'")))? as u8;
    if lid as usize >= lid_table.len() || lid_table[lid as usize].is_none() {
        return Err(parse_err(
            path,
            ln,
            format!("unknown LID {lid} (0x{lid:04x}): no node of the topology has it"),
        ));
    }
    if port as usize > topo.nodes[s].nports() {
        return Err(parse_err(
            path,
            ln,
            format!("switch '{}' has no port {port}", topo.nodes[s].name),
        ));
    }
    Ok((lid, port))
}

/// Writes LFTs as `opensm-lfts.dump`, loadable by `opensm -R file -U FILE`.
pub fn write_opensm_lfts(topo: &Topology, lfts: &Lfts) -> String {
    let mut s = String::new();
    let max = topo.max_lid();
    let lid_table = topo.lid_table();
    for sw in topo.switches() {
        let n = &topo.nodes[sw];
        let _ = writeln!(
            s,
            "Unicast lids [0-{max}] of switch Lid {} guid 0x{:016x} ('{}'):",
            n.lid, n.guid, n.name
        );
        let mut count = 0;
        for lid in 1..=max {
            let p = lfts.get(sw, lid);
            if p == NO_PATH {
                continue;
            }
            let Some(dst) = lid_table.get(lid as usize).copied().flatten() else {
                continue;
            };
            let d = &topo.nodes[dst];
            let what = if d.is_switch() {
                "Switch"
            } else {
                "Channel Adapter"
            };
            let _ = writeln!(
                s,
                "0x{lid:04x} {p:03} # {what} portguid 0x{:016x}: '{}'",
                d.port_guid, d.name
            );
            count += 1;
        }
        let _ = writeln!(s, "{count} lids dumped");
    }
    s
}

/// Reads a rank order: a hostfile (one host name per line, `slots=` and
/// comments allowed) or OpenSM's `opensm-ftree-ca-order.dump` (LID, name).
pub fn parse_order(path: &Path, topo: &Topology) -> Result<Vec<usize>> {
    Ok(parse_order_positions(path, topo)?
        .into_iter()
        .flatten()
        .collect())
}

/// Reads a rank order keeping OpenSM's dummy positions: each
/// `0xFFFF DUMMY` line of a CA order dump (a host a short leaf lacks) is a
/// `None`.
pub fn parse_order_positions(path: &Path, topo: &Topology) -> Result<Vec<Option<usize>>> {
    let text = read_text(path)?;
    let names = topo.by_name();
    let lids = topo.lid_table();
    let mut out = vec![];
    let mut seen = vec![false; topo.nodes.len()];
    for (i, raw) in text.lines().enumerate() {
        let ln = i + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let first = line.split_whitespace().next().unwrap_or("");
        // OpenSM pads leaves with fewer hosts with "0xFFFF DUMMY" lines.
        if first.eq_ignore_ascii_case("0xffff") {
            out.push(None);
            continue;
        }
        let host = if first.starts_with("0x") {
            let lid = parse_hex(first)
                .ok_or_else(|| parse_err(path, ln, format!("bad LID '{first}'")))?;
            lids.get(lid as usize)
                .copied()
                .flatten()
                .ok_or_else(|| parse_err(path, ln, format!("unknown LID {lid} (0x{lid:04x})")))?
        } else {
            let name = first.split(':').next().unwrap_or(first);
            match names.get(name) {
                Some(&h) => h,
                // GUID names, and why a shared description is not a name.
                None => topo.resolve(name).map_err(|e| {
                    let msg = e.to_string().replace("no node named", "unknown host");
                    parse_err(path, ln, msg)
                })?,
            }
        };
        if topo.nodes[host].is_switch() {
            return Err(parse_err(
                path,
                ln,
                format!("'{}' is a switch, not a host", topo.nodes[host].name),
            ));
        }
        if seen[host] {
            return Err(parse_err(
                path,
                ln,
                format!("host '{}' listed twice", topo.nodes[host].name),
            ));
        }
        seen[host] = true;
        out.push(Some(host));
    }
    if out.iter().flatten().count() < 2 {
        return Err(parse_err(
            path,
            text.lines().count(),
            "fewer than 2 hosts in the order file",
        ));
    }
    Ok(out)
}

/// Hostfile for mpirun / Slurm (`--distribution=arbitrary`): one name a line.
pub fn write_hostfile(topo: &Topology, order: &[usize]) -> String {
    order
        .iter()
        .map(|&h| format!("{}\n", topo.nodes[h].name))
        .collect()
}

/// OpenSM's ftree CA order format: LID and host name per line.
pub fn write_ca_order(topo: &Topology, order: &[usize]) -> String {
    order
        .iter()
        .map(|&h| format!("0x{:04x}\t{}\n", topo.nodes[h].lid, topo.nodes[h].name))
        .collect()
}

/// Slurm `topology.conf` for the topology/tree plugin: one
/// `SwitchName=... Nodes=...` line per switch with hosts, then one
/// `SwitchName=... Switches=...` line per switch above them, listing its
/// neighbours nearer the hosts. Names are the unique names (no spaces, no
/// duplicates), lists in Slurm's hostlist form (`node[001-016,018]`).
/// Slurm refuses a switch with both hosts and child switches; a switch with
/// hosts is always a leaf here (it is at height 0).
pub fn write_slurm_topology(topo: &Topology) -> String {
    let mut s = String::from("# Slurm topology.conf written by evb fabric\n");
    let height = switch_heights(topo);
    let mut sws = topo.switches();
    sws.sort_by(|&a, &b| {
        height[a]
            .cmp(&height[b])
            .then_with(|| crate::topo::natural_cmp(&topo.nodes[a].name, &topo.nodes[b].name))
    });
    for sw in sws {
        let n = &topo.nodes[sw];
        let mut hosts = vec![];
        let mut kids = vec![];
        for r in n.ports.iter().flatten() {
            let rn = &topo.nodes[r.node];
            if !rn.is_switch() {
                hosts.push(rn.name.clone());
            } else if height[r.node] < height[sw] {
                kids.push(rn.name.clone());
            }
        }
        if !hosts.is_empty() {
            let _ = writeln!(s, "SwitchName={} Nodes={}", n.name, hostlist(&hosts));
        } else if !kids.is_empty() {
            let _ = writeln!(s, "SwitchName={} Switches={}", n.name, hostlist(&kids));
        }
    }
    s
}

/// Names in Slurm's hostlist form: names that differ only in a trailing
/// number share one bracket (`node[1-4,7,10-12]`). Slurm reads each
/// element with the width it is written in, so zero-padded numbers
/// (`node[001-004]`) only join runs of their own width; names without a
/// trailing number (or with more than 9 digits, as GUID names have) are
/// listed as they are. Duplicates are dropped; the order is natural.
pub fn hostlist(names: &[String]) -> String {
    // prefix -> (number, written digits, zero-padded)
    let mut groups: std::collections::BTreeMap<String, Vec<(u64, usize, bool)>> =
        Default::default();
    let mut plain: Vec<String> = vec![];
    for n in names {
        let digits = n.bytes().rev().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 || n.contains(['[', ']', ',']) {
            plain.push(n.clone());
            continue;
        }
        let (prefix, num) = n.split_at(n.len() - digits);
        groups.entry(prefix.to_string()).or_default().push((
            num.parse().expect("ASCII digits"),
            num.len(),
            num.len() > 1 && num.starts_with('0'),
        ));
    }
    /// A run of consecutive numbers: written with a fixed width once a
    /// zero-padded number is in it, else as they are.
    struct Run {
        lo: u64,
        hi: u64,
        pad: Option<usize>,
        /// The digit count all numbers share, if they do.
        len: Option<usize>,
    }
    let mut parts: Vec<String> = vec![];
    for (prefix, mut nums) in groups {
        nums.sort_unstable();
        nums.dedup();
        let mut runs: Vec<Run> = vec![];
        for &(n, len, padded) in &nums {
            let joined = match runs.last_mut() {
                Some(r) if r.hi + 1 == n => {
                    let fits = match (r.pad, padded) {
                        (Some(w), _) => len == w,
                        (None, true) => r.len == Some(len),
                        (None, false) => true,
                    };
                    if fits {
                        r.hi = n;
                        if padded {
                            r.pad = Some(len);
                        }
                        if r.len != Some(len) {
                            r.len = None;
                        }
                    }
                    fits
                }
                _ => false,
            };
            if !joined {
                runs.push(Run {
                    lo: n,
                    hi: n,
                    pad: padded.then_some(len),
                    len: Some(len),
                });
            }
        }
        let fmt = |n: u64, pad: Option<usize>| format!("{n:0w$}", w = pad.unwrap_or(0));
        let elems: Vec<String> = runs
            .iter()
            .map(|r| {
                if r.lo == r.hi {
                    fmt(r.lo, r.pad)
                } else {
                    format!("{}-{}", fmt(r.lo, r.pad), fmt(r.hi, r.pad))
                }
            })
            .collect();
        if let [one] = &elems[..] {
            if !one.contains('-') {
                parts.push(format!("{prefix}{one}"));
                continue;
            }
        }
        parts.push(format!("{prefix}[{}]", elems.join(",")));
    }
    plain.sort();
    plain.dedup();
    // Named hosts first, in natural order; GUID names after, as they sort.
    parts.sort_by(|a, b| crate::topo::natural_cmp(a, b));
    parts.extend(plain);
    parts.join(",")
}

/// Distance of each switch from the nearest host-carrying switch (hosts: 0).
pub fn switch_heights(topo: &Topology) -> Vec<u32> {
    let mut h = vec![u32::MAX; topo.nodes.len()];
    let mut q = std::collections::VecDeque::new();
    for s in topo.switches() {
        if topo.nodes[s]
            .ports
            .iter()
            .flatten()
            .any(|r| !topo.nodes[r.node].is_switch())
        {
            h[s] = 0;
            q.push_back(s);
        }
    }
    while let Some(s) = q.pop_front() {
        for r in topo.nodes[s].ports.iter().flatten() {
            if topo.nodes[r.node].is_switch() && h[r.node] == u32::MAX {
                h[r.node] = h[s] + 1;
                q.push_back(r.node);
            }
        }
    }
    for (n, hn) in topo.nodes.iter().zip(h.iter_mut()) {
        if !n.is_switch() {
            *hn = 0;
        }
    }
    h
}

/// Loads a topology from a file or a `fat-tree:` generator spec, then
/// names its nodes from a GUID-to-name map if one is given.
pub fn load_topology_named(
    spec: &str,
    names: Option<&Path>,
) -> Result<(Topology, Option<crate::names::NameMapReport>)> {
    let mut topo = load_topology(spec)?;
    let rep = match names {
        Some(p) => {
            let map = crate::names::parse_name_map(p)?;
            Some(crate::names::apply_name_map(&mut topo, &map)?)
        }
        None => None,
    };
    Ok((topo, rep))
}

/// Loads a topology from a file or a `fat-tree:` generator spec.
pub fn load_topology(spec: &str) -> Result<Topology> {
    if spec.starts_with("fat-tree") {
        return crate::topo::FatTreeSpec::parse(spec)?.build();
    }
    let p = Path::new(spec);
    if !p.exists() {
        return Err(FabricError::Invalid(format!(
            "topology '{spec}': no such file (or use fat-tree:radix=36,hosts=648)"
        )));
    }
    parse_ibnetdiscover(p)
}
