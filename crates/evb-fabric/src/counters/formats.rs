//! Port counters in the forms users already have, read into a
//! [`Snapshot`]:
//!
//! - `perfquery` output (infiniband-diags): blocks headed `# Port
//!   counters: Lid L port P` or `# Port extended counters: ...`, one
//!   `Name:.....value` line per counter (`perfquery -l LID`, `perfquery -x
//!   -l LID`, concatenated). It names ports by LID, so the topology says
//!   which node a LID is;
//! - ibdiagnet2's `ibdiagnet2.pm`: a block per port headed `Port=P
//!   Lid=0x.. GUID=0x.. Device=D Port Name=...`, then `name=value` lines
//!   (`port_xmit_data=0x...`, `NA` where a device lacks a counter);
//! - ibdiagnet2's `ibdiagnet2.db_csv`: the `START_PM_INFO` ... `END_PM_INFO`
//!   section, a header of column names (`NodeGUID,PortGUID,PortNumber,
//!   LinkDownedCounter,...`) and a row per port.
//!
//! Errors name the file and line (a value that is not a number, a line cut
//! short, a LID the topology lacks); each reader returns notes on what it
//! left out.

use super::{counter_def, guid_text, parse_guid, PortSample, Snapshot, COUNTERS};
use crate::error::{parse_err, Result};
use crate::topo::Topology;
use std::collections::BTreeMap;
use std::path::Path;

/// The format of a counters file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// evb's own snapshot (JSON).
    Snapshot,
    Perfquery,
    IbdiagnetPm,
    IbdiagnetCsv,
}

impl Format {
    /// Recognises the format from the text.
    pub fn detect(text: &str) -> Option<Format> {
        let first = text.lines().map(str::trim).find(|l| !l.is_empty())?;
        if first.starts_with('{') {
            return Some(Format::Snapshot);
        }
        for l in text.lines().take(100_000) {
            let l = l.trim();
            if l.starts_with("START_") {
                return Some(Format::IbdiagnetCsv);
            }
            if l.starts_with("Port=") && l.contains("GUID=") {
                return Some(Format::IbdiagnetPm);
            }
            if l.starts_with("# Port counters:") || l.starts_with("# Port extended counters:") {
                return Some(Format::Perfquery);
            }
        }
        None
    }
}

/// A counter named loosely (`port_xmit_wait`, `PortXmitWait`,
/// `vl15_dropped`, `symbol_error_counter_extended`), as evb names it.
pub fn loose_counter_name(s: &str) -> Option<&'static str> {
    let key: String = s
        .chars()
        .filter(|c| *c != '_')
        .collect::<String>()
        .to_ascii_lowercase();
    let find = |k: &str| {
        COUNTERS
            .iter()
            .find(|c| c.name.to_ascii_lowercase() == k)
            .map(|c| c.name)
    };
    if let Some(n) = find(&key) {
        return Some(n);
    }
    // ibdiagnet's `_extended` error counters are IBA's `...Ext`.
    if let Some(base) = key.strip_suffix("extended") {
        if let Some(n) = find(&format!("{base}ext")) {
            return Some(n);
        }
    }
    // Spellings met in ibdiagnet files and tools built on them.
    const ALIASES: &[(&str, &str)] = &[
        ("portxmitdiscard", "PortXmitDiscards"),
        ("linkdowncounter", "LinkDownedCounter"),
        ("excessivebuffererrors", "ExcessiveBufferOverrunErrors"),
        ("portxmitdiscardextended", "PortXmitDiscardsExt"),
    ];
    ALIASES.iter().find(|a| a.0 == key).map(|a| a.1)
}

/// A counter value: decimal, or hex with `0x`; `None` for `NA` / `N/A` /
/// empty (a counter the device lacks).
fn value(s: &str) -> std::result::Result<Option<u64>, String> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("na") || s.eq_ignore_ascii_case("n/a") {
        return Ok(None);
    }
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    parsed
        .map(Some)
        .map_err(|_| format!("'{s}' is not a counter value"))
}

/// What a reader made of a file.
#[derive(Debug, Clone)]
pub struct Read {
    pub snap: Snapshot,
    pub notes: Vec<String>,
}

/// A block of `perfquery` output: which port, and whether extended.
struct PqBlock {
    lid: u16,
    port: u8,
    extended: bool,
}

/// `# Port counters: Lid 5 port 1 (CapMask: ...)` and its extended form.
fn perfquery_header(line: &str) -> Option<std::result::Result<PqBlock, String>> {
    let (extended, rest) = if let Some(r) = line.strip_prefix("# Port counters:") {
        (false, r)
    } else if let Some(r) = line.strip_prefix("# Port extended counters:") {
        (true, r)
    } else {
        return None;
    };
    let words: Vec<&str> = rest.split_whitespace().collect();
    let after = |k: &str| {
        words
            .iter()
            .position(|w| *w == k)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    let block = || -> std::result::Result<PqBlock, String> {
        let lid = after("Lid").ok_or("no `Lid` in the header")?;
        let port = after("port").ok_or("no `port` in the header")?;
        let lid = lid
            .parse::<u16>()
            .map_err(|_| format!("LID '{lid}' is not a number"))?;
        let port = port
            .parse::<u8>()
            .map_err(|_| format!("port '{port}' is not a port number"))?;
        if port == 255 {
            return Err("port 255: counters summed over all ports (perfquery -a) do not say which link; read with -l".into());
        }
        Ok(PqBlock {
            lid,
            port,
            extended,
        })
    };
    Some(block())
}

/// The evb name of a counter in a `perfquery` block.
fn perfquery_name(name: &str, extended: bool) -> Option<&'static str> {
    if !extended {
        return counter_def(name).map(|d| d.name);
    }
    match name {
        "PortXmitData" | "PortRcvData" | "PortXmitPkts" | "PortRcvPkts" => {
            counter_def(&format!("{name}Extended")).map(|d| d.name)
        }
        n if n.starts_with("PortUnicast") || n.starts_with("PortMulticast") => {
            counter_def(n).map(|d| d.name)
        }
        n => counter_def(&format!("{n}Ext")).map(|d| d.name),
    }
}

/// Reads `perfquery` output; LIDs are placed with `topo`. Port 0 of a
/// switch (its management port) is skipped.
pub fn read_perfquery(path: &Path, text: &str, topo: &Topology, time_s: f64) -> Result<Read> {
    let lids = topo.lid_table();
    let mut snap = Snapshot::new("perfquery output", time_s);
    let mut notes = Vec::new();
    let mut index: BTreeMap<(u16, u8), usize> = BTreeMap::new();
    let mut cur: Option<(PqBlock, Option<usize>)> = None;
    let mut unknown = 0usize;
    for (i, raw) in text.lines().enumerate() {
        let ln = i + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(h) = perfquery_header(line) {
            let b = h.map_err(|e| parse_err(path, ln, e))?;
            let node = lids.get(b.lid as usize).copied().flatten().ok_or_else(|| {
                parse_err(path, ln, format!("LID {} is not in the topology", b.lid))
            })?;
            let slot = (b.port > 0).then(|| {
                *index.entry((b.lid, b.port)).or_insert_with(|| {
                    snap.ports.push(sample(topo, node, b.port, ln));
                    snap.ports.len() - 1
                })
            });
            cur = Some((b, slot));
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if line.starts_with("perfquery:") || line.starts_with("ibwarn:") {
            notes.push(format!("{}:{ln}: {line}", path.display()));
            continue;
        }
        let Some((name, rest)) = line.split_once(':') else {
            return Err(parse_err(
                path,
                ln,
                format!("'{line}' is not `Name:....value`"),
            ));
        };
        let Some((block, slot)) = &cur else {
            return Err(parse_err(
                path,
                ln,
                "a counter before any `# Port counters:` header",
            ));
        };
        let v = value(rest.trim_start_matches('.'))
            .map_err(|e| parse_err(path, ln, format!("{name}: {e}")))?
            .ok_or_else(|| parse_err(path, ln, format!("{name}: no value (a line cut short?)")))?;
        let Some(slot) = slot else { continue };
        match perfquery_name(name.trim(), block.extended) {
            Some(n) => {
                snap.ports[*slot].counters.insert(n.to_string(), v);
            }
            None if matches!(
                name.trim(),
                "PortSelect" | "CounterSelect" | "CounterSelect2"
            ) => {}
            None => unknown += 1,
        }
    }
    if unknown > 0 {
        notes.push(format!(
            "{}: {unknown} counter line(s) of names evb does not read",
            path.display()
        ));
    }
    Ok(Read { snap, notes })
}

/// An empty sample of `node` port `port`, from line `line`.
fn sample(topo: &Topology, node: usize, port: u8, line: usize) -> PortSample {
    let n = &topo.nodes[node];
    PortSample {
        guid: guid_text(n.guid),
        port,
        lid: (n.lid != 0).then_some(n.lid),
        name: Some(n.name.clone()),
        time_s: None,
        tick_ns: None,
        counters: BTreeMap::new(),
        line,
    }
}

/// `Port=1 Lid=0x0005 GUID=0x... Device=4123 Port Name=...` as (port,
/// lid, guid, name).
fn pm_header(line: &str) -> std::result::Result<(u8, Option<u16>, u64, String), String> {
    let (fields, name) = match line.split_once("Port Name=") {
        Some((f, n)) => (f, n.trim().to_string()),
        None => (line, String::new()),
    };
    let mut port = None;
    let mut lid = None;
    let mut guid = None;
    for w in fields.split_whitespace() {
        match w.split_once('=') {
            Some(("Port", v)) => {
                port = Some(
                    v.parse::<u8>()
                        .map_err(|_| format!("Port={v} is not a port number"))?,
                )
            }
            Some(("Lid", v)) => lid = value(v).ok().flatten().and_then(|l| u16::try_from(l).ok()),
            Some(("GUID", v)) => {
                guid = Some(parse_guid(v).ok_or(format!("GUID={v} is not a GUID"))?)
            }
            _ => {}
        }
    }
    let port = port.ok_or("no Port= in the header")?;
    let guid = guid.ok_or("no GUID= in the header")?;
    Ok((port, lid, guid, name))
}

/// Reads ibdiagnet2's `ibdiagnet2.pm`.
pub fn read_ibdiagnet_pm(path: &Path, text: &str, time_s: f64) -> Result<Read> {
    let mut snap = Snapshot::new("ibdiagnet2.pm", time_s);
    let mut skipped = 0usize;
    for (i, raw) in text.lines().enumerate() {
        let ln = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('-') {
            continue;
        }
        if line.starts_with("Port=") {
            let (port, lid, guid, name) = pm_header(line).map_err(|e| parse_err(path, ln, e))?;
            snap.ports.push(PortSample {
                guid: guid_text(guid),
                port,
                lid,
                name: (!name.is_empty()).then_some(name),
                time_s: None,
                tick_ns: None,
                counters: BTreeMap::new(),
                line: ln,
            });
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(parse_err(
                path,
                ln,
                format!("'{line}' is neither a `Port=` header nor `name=value`"),
            ));
        };
        let port = snap
            .ports
            .last_mut()
            .ok_or_else(|| parse_err(path, ln, "a counter before any `Port=` header"))?;
        let v = value(v).map_err(|e| parse_err(path, ln, format!("{}: {e}", k.trim())))?;
        match (loose_counter_name(k.trim()), v) {
            (Some(n), Some(v)) => {
                port.counters.insert(n.to_string(), v);
            }
            _ => skipped += 1,
        }
    }
    let notes = if skipped > 0 {
        vec![format!(
            "{}: {skipped} value(s) not read (NA, or counters evb does not use)",
            path.display()
        )]
    } else {
        Vec::new()
    };
    Ok(Read { snap, notes })
}

/// Reads the `PM_INFO` section of ibdiagnet2's `ibdiagnet2.db_csv`.
pub fn read_ibdiagnet_csv(path: &Path, text: &str, time_s: f64) -> Result<Read> {
    let mut snap = Snapshot::new("ibdiagnet2.db_csv", time_s);
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    let start = lines
        .by_ref()
        .find(|(_, l)| *l == "START_PM_INFO")
        .ok_or_else(|| {
            parse_err(
                path,
                text.lines().count(),
                "no START_PM_INFO section (ibdiagnet run without port counters?)",
            )
        })?;
    let (hl, header) = lines
        .by_ref()
        .find(|(_, l)| !l.is_empty())
        .ok_or_else(|| parse_err(path, start.0, "START_PM_INFO without a header line"))?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| c.eq_ignore_ascii_case(name));
    let (Some(g), Some(p)) = (col("NodeGUID"), col("PortNumber")) else {
        return Err(parse_err(
            path,
            hl,
            "the PM_INFO header lacks NodeGUID or PortNumber",
        ));
    };
    let named: Vec<Option<&'static str>> = cols.iter().map(|c| loose_counter_name(c)).collect();
    let mut ended = false;
    for (ln, line) in lines {
        if line == "END_PM_INFO" {
            ended = true;
            break;
        }
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != cols.len() {
            return Err(parse_err(
                path,
                ln,
                format!("{} fields where the header has {}", f.len(), cols.len()),
            ));
        }
        let guid = parse_guid(f[g])
            .ok_or_else(|| parse_err(path, ln, format!("NodeGUID '{}' is not a GUID", f[g])))?;
        let port = f[p].trim().parse::<u8>().map_err(|_| {
            parse_err(
                path,
                ln,
                format!("PortNumber '{}' is not a port number", f[p]),
            )
        })?;
        let mut counters = BTreeMap::new();
        for (k, name) in named.iter().enumerate() {
            let Some(name) = name else { continue };
            let v = value(f[k]).map_err(|e| parse_err(path, ln, format!("{}: {e}", cols[k])))?;
            if let Some(v) = v {
                counters.insert(name.to_string(), v);
            }
        }
        snap.ports.push(PortSample {
            guid: guid_text(guid),
            port,
            lid: None,
            name: None,
            time_s: None,
            tick_ns: None,
            counters,
            line: ln,
        });
    }
    if !ended {
        return Err(parse_err(
            path,
            text.lines().count(),
            "no END_PM_INFO: the file is cut short",
        ));
    }
    Ok(Read {
        snap,
        notes: Vec::new(),
    })
}

/// Reads a counters file of any of the formats, placed on `topo` where
/// the format names ports by LID. `time_s` is when the counters were read
/// (evb snapshots carry their own).
pub fn read_any(path: &Path, topo: &Topology, time_s: f64) -> Result<(Read, Format)> {
    let text = super::read_bounded(path)?;
    let format = Format::detect(&text).ok_or_else(|| {
        parse_err(
            path,
            1,
            "not a counters file: neither an evb snapshot, perfquery output, ibdiagnet2.pm nor ibdiagnet2.db_csv",
        )
    })?;
    let read = match format {
        Format::Snapshot => {
            let snap = Snapshot::load(path)?;
            Read {
                snap,
                notes: Vec::new(),
            }
        }
        Format::Perfquery => read_perfquery(path, &text, topo, time_s)?,
        Format::IbdiagnetPm => read_ibdiagnet_pm(path, &text, time_s)?,
        Format::IbdiagnetCsv => read_ibdiagnet_csv(path, &text, time_s)?,
    };
    read.snap.check(path)?;
    Ok((read, format))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_names() {
        assert_eq!(loose_counter_name("port_xmit_wait"), Some("PortXmitWait"));
        assert_eq!(loose_counter_name("vl15_dropped"), Some("VL15Dropped"));
        assert_eq!(
            loose_counter_name("port_xmit_data_extended"),
            Some("PortXmitDataExtended")
        );
        assert_eq!(
            loose_counter_name("symbol_error_counter_extended"),
            Some("SymbolErrorCounterExt")
        );
        assert_eq!(
            loose_counter_name("port_xmit_wait_extended"),
            Some("PortXmitWaitExt")
        );
        assert_eq!(
            loose_counter_name("PortXmitWaitExt"),
            Some("PortXmitWaitExt")
        );
        assert_eq!(
            loose_counter_name("port_xmit_discard"),
            Some("PortXmitDiscards")
        );
        assert_eq!(loose_counter_name("retransmission_per_sec"), None);
        assert_eq!(value("0x10"), Ok(Some(16)));
        assert_eq!(value("NA"), Ok(None));
        assert!(value("12a").is_err());
    }
}
