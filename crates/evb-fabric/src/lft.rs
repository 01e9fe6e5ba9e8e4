//! Linear forwarding tables and flow tracing.

use crate::error::{FabricError, Result};
use crate::topo::Topology;
use std::path::PathBuf;

/// Port value meaning "no route".
pub const NO_PATH: u8 = 255;

/// Where imported tables came from, to name file and line in errors.
#[derive(Debug, Clone)]
pub struct LftOrigin {
    pub file: PathBuf,
    /// Per node: line of the table header (0 = not in the file).
    pub header_line: Vec<usize>,
}

/// Linear forwarding tables of all switches: `tables[node][lid] = out port`.
#[derive(Debug, Clone)]
pub struct Lfts {
    pub tables: Vec<Vec<u8>>,
    pub origin: Option<LftOrigin>,
}

impl Lfts {
    /// Empty tables (every entry `NO_PATH`) sized for the topology.
    pub fn empty(topo: &Topology) -> Lfts {
        let size = topo.max_lid() as usize + 1;
        Lfts {
            tables: topo
                .nodes
                .iter()
                .map(|n| {
                    if n.is_switch() {
                        vec![NO_PATH; size]
                    } else {
                        vec![]
                    }
                })
                .collect(),
            origin: None,
        }
    }
    pub fn get(&self, sw: usize, lid: u16) -> u8 {
        self.tables[sw]
            .get(lid as usize)
            .copied()
            .unwrap_or(NO_PATH)
    }
    pub fn set(&mut self, sw: usize, lid: u16, port: u8) {
        let t = &mut self.tables[sw];
        if t.len() <= lid as usize {
            t.resize(lid as usize + 1, NO_PATH);
        }
        t[lid as usize] = port;
    }

    /// Names the file/line of the table entry of `sw` for `lid`, if imported.
    pub fn where_is(&self, topo: &Topology, sw: usize, lid: u16) -> String {
        let name = &topo.nodes[sw].name;
        let Some(o) = &self.origin else {
            return format!("switch '{name}'");
        };
        let h = o.header_line.get(sw).copied().unwrap_or(0);
        if h == 0 {
            return format!("switch '{name}' (no table in {})", o.file.display());
        }
        // Find the entry line by reading the block again (errors are rare).
        if let Ok(text) = std::fs::read_to_string(&o.file) {
            for (i, l) in text.lines().enumerate().skip(h) {
                let t = l.trim_start();
                if t.starts_with("Unicast lids") || t.starts_with("Switch") {
                    break;
                }
                if let Some(tok) = t.split_whitespace().next() {
                    if let Some(v) = tok
                        .strip_prefix("0x")
                        .and_then(|x| u16::from_str_radix(x, 16).ok())
                    {
                        if v == lid {
                            return format!("{}:{} (switch '{name}')", o.file.display(), i + 1);
                        }
                    }
                }
            }
        }
        format!(
            "{}:{} (table of switch '{name}', no entry for LID {lid})",
            o.file.display(),
            h
        )
    }
}

/// Follows a flow from `src` to `dst` host, pushing the directed link id of
/// every hop (including the source host's own port).
pub fn trace(
    topo: &Topology,
    lfts: &Lfts,
    offsets: &[u32],
    src: usize,
    dst: usize,
    out: &mut Vec<u32>,
) -> Result<()> {
    let dst_lid = topo.nodes[dst].lid;
    let s = &topo.nodes[src];
    let p = s
        .first_port()
        .ok_or_else(|| FabricError::Route(format!("host '{}' is not cabled", s.name)))?;
    out.push(offsets[src] + p as u32);
    let mut cur = s.ports[p as usize].expect("first_port is cabled").node;
    let limit = topo.nodes.len();
    for _ in 0..=limit {
        if cur == dst {
            return Ok(());
        }
        let n = &topo.nodes[cur];
        if !n.is_switch() {
            return Err(FabricError::Route(format!(
                "flow {} -> {} (LID {dst_lid}) is delivered to host '{}' ({})",
                s.name,
                topo.nodes[dst].name,
                n.name,
                lfts.where_is(topo, out_switch(topo, offsets, out), dst_lid)
            )));
        }
        let port = lfts.get(cur, dst_lid);
        if port == NO_PATH
            || port == 0
            || port as usize > n.nports()
            || n.ports[port as usize].is_none()
        {
            let why = if port == NO_PATH {
                "no route".to_string()
            } else {
                format!("route to port {port}, which is not cabled")
            };
            return Err(FabricError::Route(format!(
                "flow {} -> {} (LID {dst_lid}): {why} at {}",
                s.name,
                topo.nodes[dst].name,
                lfts.where_is(topo, cur, dst_lid)
            )));
        }
        out.push(offsets[cur] + port as u32);
        cur = n.ports[port as usize].expect("checked").node;
    }
    Err(FabricError::Route(format!(
        "routing loop for LID {dst_lid} ({}), flow from {}: {}",
        topo.nodes[dst].name,
        s.name,
        lfts.where_is(topo, cur, dst_lid)
    )))
}

fn out_switch(topo: &Topology, offsets: &[u32], out: &[u32]) -> usize {
    let last = *out.last().unwrap_or(&0);
    let n = offsets.partition_point(|&o| o <= last).saturating_sub(1);
    n.min(topo.nodes.len() - 1)
}

/// Inverse of link numbering: (node, port) of a directed link id.
pub fn link_of(offsets: &[u32], id: u32) -> (usize, u8) {
    let n = offsets.partition_point(|&o| o <= id) - 1;
    (n, (id - offsets[n]) as u8)
}
