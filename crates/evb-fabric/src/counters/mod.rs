//! Port counters: one snapshot of every port's performance-management
//! counters (what `perfquery` reads from each port's PMA), the counters'
//! widths, and the change between two snapshots.
//!
//! A snapshot (`evb fabric counters --out FILE`, `evb sim --counters
//! FILE`) is a JSON file (`"kind": "evb-counters"`): when it was read, and
//! per port its node GUID and port number and the counters by their IBA
//! names. The basic `PortCounters` attribute has narrow counters
//! (`PortXmitData` 32 bits, `SymbolErrorCounter` 16, `LinkDownedCounter`
//! 8, ...) that stop at all ones; `PortCountersExtended` has 64-bit data
//! and packet counters (kept as `PortXmitDataExtended`, ...). [`delta`]
//! says what a counter did between two snapshots: grew, saturated, wrapped
//! or was reset.
//!
//! Readers of what users already have are in [`formats`] (`perfquery`
//! output, ibdiagnet2's `ibdiagnet2.pm` and `ibdiagnet2.db_csv`); reading
//! a live fabric with the real `perfquery` is in [`collect`].

pub mod collect;
pub mod formats;

use crate::error::{io_err, FabricError, Result};
use crate::topo::Topology;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What a counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Octets divided by 4 (the IBA unit of `PortXmitData`).
    Data,
    Packets,
    /// Ticks with data to send and no credits (`PortXmitWait`).
    Wait,
    /// A fault: symbol errors, link downs, discards, ...
    Error,
}

/// One counter: its IBA name (as `perfquery` prints it; the extended
/// attribute's data and packet counters take an `Extended` suffix, its
/// error and wait counters `Ext`, as ibdiagnet names them), width and class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterDef {
    pub name: &'static str,
    pub bits: u8,
    pub class: Class,
}

const fn def(name: &'static str, bits: u8, class: Class) -> CounterDef {
    CounterDef { name, bits, class }
}

/// Every counter evb reads, basic (`PortCounters`) then extended
/// (`PortCountersExtended`).
pub const COUNTERS: &[CounterDef] = &[
    def("SymbolErrorCounter", 16, Class::Error),
    def("LinkErrorRecoveryCounter", 8, Class::Error),
    def("LinkDownedCounter", 8, Class::Error),
    def("PortRcvErrors", 16, Class::Error),
    def("PortRcvRemotePhysicalErrors", 16, Class::Error),
    def("PortRcvSwitchRelayErrors", 16, Class::Error),
    def("PortXmitDiscards", 16, Class::Error),
    def("PortXmitConstraintErrors", 8, Class::Error),
    def("PortRcvConstraintErrors", 8, Class::Error),
    def("LocalLinkIntegrityErrors", 4, Class::Error),
    def("ExcessiveBufferOverrunErrors", 4, Class::Error),
    def("QP1Dropped", 16, Class::Error),
    def("VL15Dropped", 16, Class::Error),
    def("PortXmitData", 32, Class::Data),
    def("PortRcvData", 32, Class::Data),
    def("PortXmitPkts", 32, Class::Packets),
    def("PortRcvPkts", 32, Class::Packets),
    def("PortXmitWait", 32, Class::Wait),
    def("PortXmitDataExtended", 64, Class::Data),
    def("PortRcvDataExtended", 64, Class::Data),
    def("PortXmitPktsExtended", 64, Class::Packets),
    def("PortRcvPktsExtended", 64, Class::Packets),
    def("PortUnicastXmitPkts", 64, Class::Packets),
    def("PortUnicastRcvPkts", 64, Class::Packets),
    def("PortMulticastXmitPkts", 64, Class::Packets),
    def("PortMulticastRcvPkts", 64, Class::Packets),
    def("SymbolErrorCounterExt", 64, Class::Error),
    def("LinkErrorRecoveryCounterExt", 64, Class::Error),
    def("LinkDownedCounterExt", 64, Class::Error),
    def("PortRcvErrorsExt", 64, Class::Error),
    def("PortRcvRemotePhysicalErrorsExt", 64, Class::Error),
    def("PortRcvSwitchRelayErrorsExt", 64, Class::Error),
    def("PortXmitDiscardsExt", 64, Class::Error),
    def("PortXmitConstraintErrorsExt", 64, Class::Error),
    def("PortRcvConstraintErrorsExt", 64, Class::Error),
    def("LocalLinkIntegrityErrorsExt", 64, Class::Error),
    def("ExcessiveBufferOverrunErrorsExt", 64, Class::Error),
    def("VL15DroppedExt", 64, Class::Error),
    def("PortXmitWaitExt", 64, Class::Wait),
];

/// The counter of that name, if evb knows it.
pub fn counter_def(name: &str) -> Option<&'static CounterDef> {
    COUNTERS.iter().find(|c| c.name == name)
}

/// The largest value a counter of `bits` holds.
pub fn max_value(bits: u8) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Files larger than this are refused before they are read.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// `"kind"` of a snapshot file.
pub const KIND: &str = "evb-counters";

/// One snapshot of the fabric's port counters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    /// Always [`KIND`].
    pub kind: String,
    pub version: u32,
    /// What read the counters: `perfquery 44.0 (evb fabric counters)`,
    /// `evb sim`, `ibdiagnet2.pm`, ...
    pub source: String,
    /// When the counters were read, seconds: Unix time, or simulated time
    /// (`clock`).
    pub time_s: f64,
    /// `unix` or `simulated`.
    #[serde(default = "unix")]
    pub clock: String,
    /// When every counter was last zero (cleared, or the start of a
    /// simulation), on the same clock; a single snapshot with it gives
    /// rates over `time_s - reset_at_s`.
    #[serde(default)]
    pub reset_at_s: Option<f64>,
    /// The counters were cleared right after this snapshot was read
    /// (`perfquery -r`): the next snapshot counts from zero.
    #[serde(default)]
    pub reset_after_read: bool,
    pub ports: Vec<PortSample>,
}

fn unix() -> String {
    "unix".into()
}

/// One port's counters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PortSample {
    /// The node's GUID (`0x0002c90300000002`); a channel adapter's port
    /// GUID is accepted too.
    pub guid: String,
    pub port: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lid: Option<u16>,
    /// The node's name, for people (matching is by GUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When this port was read, if not `time_s` (reading a large fabric
    /// takes seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_s: Option<f64>,
    /// Length of one `PortXmitWait` tick in ns, when known (the port's
    /// `PortSamplesControl.Tick`, or the simulator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_ns: Option<f64>,
    pub counters: BTreeMap<String, u64>,
    /// Where the port came from, for errors: the line of a text file.
    #[serde(skip)]
    pub line: usize,
}

impl Snapshot {
    /// An empty snapshot read at `time_s` by `source`.
    pub fn new(source: &str, time_s: f64) -> Snapshot {
        Snapshot {
            kind: KIND.into(),
            version: 1,
            source: source.into(),
            time_s,
            clock: "unix".into(),
            reset_at_s: None,
            reset_after_read: false,
            ports: Vec::new(),
        }
    }

    /// The snapshot as JSON, one port a line (a fabric of 648 hosts has
    /// 2,600 ports: a pretty-printed file would be 100,000 lines).
    pub fn to_json(&self) -> String {
        let head = Snapshot {
            ports: Vec::new(),
            ..self.clone()
        };
        let mut text = serde_json::to_string_pretty(&head).expect("a snapshot serialises");
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|p| serde_json::to_string(p).expect("a port serialises"))
            .collect();
        if !ports.is_empty() {
            // `ports` is the last field; a quote inside a string is escaped,
            // so only the key itself matches.
            let key = "\"ports\": []";
            if let Some(at) = text.rfind(key) {
                let list = format!("\"ports\": [\n    {}\n  ]", ports.join(",\n    "));
                text.replace_range(at..at + key.len(), &list);
            }
        }
        text.push('\n');
        text
    }

    /// Reads a snapshot file and checks it: errors name the file and the
    /// port (`ports[12]`) or the JSON line.
    pub fn load(path: &Path) -> Result<Snapshot> {
        let text = read_bounded(path)?;
        let snap: Snapshot = serde_json::from_str(&text).map_err(|e| {
            crate::error::parse_err(path, e.line(), format!("not an evb counters snapshot: {e}"))
        })?;
        snap.check(path)?;
        Ok(snap)
    }

    /// The checks every snapshot passes: its kind and version, times that
    /// are numbers, GUIDs that parse, counters within their widths.
    pub fn check(&self, path: &Path) -> Result<()> {
        let bad = |what: String| FabricError::Invalid(format!("{}: {what}", path.display()));
        if self.kind != KIND {
            return Err(bad(format!(
                "`kind` is \"{}\", not \"{KIND}\"",
                self.kind.chars().take(40).collect::<String>()
            )));
        }
        if self.version != 1 {
            return Err(bad(format!(
                "version {} (this evb reads version 1)",
                self.version
            )));
        }
        if !self.time_s.is_finite() || self.reset_at_s.is_some_and(|r| !r.is_finite()) {
            return Err(bad("`time_s` and `reset_at_s` must be numbers".into()));
        }
        for (i, p) in self.ports.iter().enumerate() {
            p.check()
                .map_err(|e| bad(format!("{}: {e}", p.where_(i))))?;
        }
        Ok(())
    }
}

impl PortSample {
    /// `ports[i] (guid G port P)`, or the line it came from.
    pub fn where_(&self, i: usize) -> String {
        if self.line > 0 {
            format!("line {} (guid {} port {})", self.line, self.guid, self.port)
        } else {
            format!("ports[{i}] (guid {} port {})", self.guid, self.port)
        }
    }

    fn check(&self) -> std::result::Result<(), String> {
        parse_guid(&self.guid).ok_or_else(|| format!("`guid` '{}' is not a GUID", self.guid))?;
        if self.port == 0 {
            return Err("port 0 (a switch's management port) carries no link".into());
        }
        if let Some(t) = self.tick_ns {
            if !(t.is_finite() && t > 0.0 && t < 1e6) {
                return Err(format!("`tick_ns` {t} is not a tick length in ns"));
            }
        }
        for (name, &v) in &self.counters {
            if let Some(d) = counter_def(name) {
                if v > max_value(d.bits) {
                    return Err(format!("{name} = {v} does not fit its {} bits", d.bits));
                }
            }
        }
        Ok(())
    }

    /// A counter's value, if read.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.counters.get(name).copied()
    }
}

/// `0x0002c90300000002` (or without `0x`) as a number.
pub fn parse_guid(s: &str) -> Option<u64> {
    let s = s.trim();
    let h = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if h.is_empty() || h.len() > 16 {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

/// A GUID as snapshots write it.
pub fn guid_text(g: u64) -> String {
    format!("0x{g:016x}")
}

/// The text of `path`, refused above [`MAX_FILE_BYTES`] before it is read
/// (and never more read than that, should it grow meanwhile).
pub fn read_bounded(path: &Path) -> Result<String> {
    use std::io::Read;
    let too_big = |size: u64| {
        FabricError::Invalid(format!(
            "{}: {size} bytes is more than the {MAX_FILE_BYTES} a counters file may have",
            path.display()
        ))
    };
    let size = std::fs::metadata(path).map_err(|e| io_err(path, e))?.len();
    if size > MAX_FILE_BYTES {
        return Err(too_big(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| io_err(path, e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes)
        .map_err(|e| FabricError::Invalid(format!("{}: not text: {e}", path.display())))
}

/// A snapshot's ports placed on a topology: per node and port, the index
/// of its sample.
#[derive(Debug, Clone)]
pub struct Placed {
    pub file: PathBuf,
    pub snap: Snapshot,
    /// `at[node][port]`: index into `snap.ports`.
    pub at: Vec<Vec<Option<usize>>>,
    /// Ports with counters that the topology has no cable on (ignored).
    pub uncabled: Vec<String>,
}

impl Placed {
    /// The sample of `node` port `port`, if the snapshot has one.
    pub fn sample(&self, node: usize, port: u8) -> Option<&PortSample> {
        let i = (*self.at.get(node)?.get(port as usize)?)?;
        self.snap.ports.get(i)
    }

    /// When `node`'s `port` was read.
    pub fn time_of(&self, node: usize, port: u8) -> f64 {
        self.sample(node, port)
            .and_then(|p| p.time_s)
            .unwrap_or(self.snap.time_s)
    }
}

/// Places every port of `snap` on `topo`. A GUID the topology does not
/// have, a port beyond its node's ports, or a port given twice is an
/// error naming it; a port with counters where the topology has no cable
/// is listed in `uncabled`.
pub fn place(snap: Snapshot, file: &Path, topo: &Topology) -> Result<Placed> {
    let mut by_guid: HashMap<u64, usize> = HashMap::new();
    for (i, n) in topo.nodes.iter().enumerate() {
        by_guid.insert(n.guid, i);
        by_guid.entry(n.port_guid).or_insert(i);
    }
    let mut at: Vec<Vec<Option<usize>>> = topo
        .nodes
        .iter()
        .map(|n| vec![None; n.ports.len()])
        .collect();
    let mut uncabled = Vec::new();
    for (i, p) in snap.ports.iter().enumerate() {
        let err = |what: String| {
            FabricError::Invalid(format!("{}: {}: {what}", file.display(), p.where_(i)))
        };
        let g = parse_guid(&p.guid).ok_or_else(|| err("not a GUID".into()))?;
        let Some(&n) = by_guid.get(&g) else {
            return Err(err(
                "unknown GUID: no node of the topology has it (counters of another fabric, or an older ibnetdiscover file?)".into(),
            ));
        };
        let node = &topo.nodes[n];
        if p.port as usize > node.nports() {
            return Err(err(format!(
                "{} has {} ports, not a port {}",
                node.name,
                node.nports(),
                p.port
            )));
        }
        let slot = &mut at[n][p.port as usize];
        if let Some(first) = *slot {
            return Err(err(format!(
                "{} port {} is given twice (first at {})",
                node.name,
                p.port,
                snap.ports[first].where_(first)
            )));
        }
        *slot = Some(i);
        if node.ports[p.port as usize].is_none() {
            uncabled.push(format!("{}:{}", node.name, p.port));
        }
    }
    Ok(Placed {
        file: file.to_path_buf(),
        snap,
        at,
        uncabled,
    })
}

/// What a counter did between two readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Grew by the amount (the usual case).
    Grew,
    /// At all ones in the later reading: a basic counter stops there, so
    /// the amount is a lower bound.
    Saturated,
    /// Went down and is taken as one wrap at its width.
    Wrapped,
    /// Went down and is taken as cleared in between: the amount is the
    /// later value, a lower bound.
    Reset,
}

impl Change {
    /// `grew`, `saturated`, `wrapped`, `reset`.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Grew => "grew",
            Change::Saturated => "saturated",
            Change::Wrapped => "wrapped",
            Change::Reset => "reset",
        }
    }
}

/// The change of a counter of `bits` from `a` to `b`. A value that went
/// down wrapped if `plausible` accepts the wrapped amount (a rate a link
/// can carry), and was cleared in between otherwise.
pub fn delta(a: u64, b: u64, bits: u8, plausible: impl Fn(u64) -> bool) -> (u64, Change) {
    if bits < 64 && b == max_value(bits) {
        return (b.saturating_sub(a), Change::Saturated);
    }
    if b >= a {
        return (b - a, Change::Grew);
    }
    if bits < 64 {
        let wrapped = b + (max_value(bits) - a) + 1;
        if plausible(wrapped) {
            return (wrapped, Change::Wrapped);
        }
    }
    (b, Change::Reset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_grow_saturate_wrap_and_reset() {
        let any = |_: u64| true;
        let none = |_: u64| false;
        assert_eq!(delta(10, 25, 32, any), (15, Change::Grew));
        assert_eq!(
            delta(10, u32::MAX as u64, 32, any),
            (u32::MAX as u64 - 10, Change::Saturated)
        );
        // 8-bit LinkDownedCounter from 250 to 3: 9 more, if plausible.
        assert_eq!(delta(250, 3, 8, any), (9, Change::Wrapped));
        assert_eq!(delta(250, 3, 8, none), (3, Change::Reset));
        // A 64-bit counter never wraps in practice: it was cleared.
        assert_eq!(delta(1 << 40, 7, 64, any), (7, Change::Reset));
        assert_eq!(delta(5, u64::MAX, 64, any), (u64::MAX - 5, Change::Grew));
        assert_eq!(max_value(4), 15);
    }

    #[test]
    fn snapshot_round_trips_one_port_a_line() {
        let mut s = Snapshot::new("test", 12.5);
        s.reset_at_s = Some(2.0);
        for port in 1..=3u8 {
            let mut counters = BTreeMap::new();
            counters.insert("PortXmitData".to_string(), 1000 * port as u64);
            counters.insert("PortXmitWait".to_string(), 7);
            s.ports.push(PortSample {
                guid: guid_text(0x0002_c902_0010_0000),
                port,
                lid: Some(3),
                name: Some("leaf001".into()),
                time_s: None,
                tick_ns: Some(0.32),
                counters,
                line: 0,
            });
        }
        let text = s.to_json();
        assert_eq!(text.lines().filter(|l| l.contains("\"guid\"")).count(), 3);
        let back: Snapshot = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        back.check(Path::new("x")).unwrap();
    }

    #[test]
    fn checks_name_the_port() {
        let mut s = Snapshot::new("test", 1.0);
        s.ports.push(PortSample {
            guid: "0x12".into(),
            port: 2,
            lid: None,
            name: None,
            time_s: None,
            tick_ns: None,
            counters: [("LinkDownedCounter".to_string(), 256)].into(),
            line: 0,
        });
        let e = s.check(Path::new("snap.json")).unwrap_err().to_string();
        assert!(e.contains("snap.json: ports[0] (guid 0x12 port 2): LinkDownedCounter = 256 does not fit its 8 bits"), "{e}");
        s.ports[0].counters.clear();
        s.ports[0].guid = "0xnothex".into();
        let e = s.check(Path::new("snap.json")).unwrap_err().to_string();
        assert!(e.contains("is not a GUID"), "{e}");
        s.kind = "evb-sim".into();
        let e = s.check(Path::new("snap.json")).unwrap_err().to_string();
        assert!(e.contains("not \"evb-counters\""), "{e}");
    }
}
