//! Unique node names, GUID-to-name maps (`--names FILE`) and what a user
//! typed resolved to a node.
//!
//! Production fabrics often leave node descriptions at their defaults
//! ("MT25408 ConnectX Mellanox Technologies" on every adapter, "Voltaire
//! 4036 - 36 QDR ports switch" on every switch). A hostfile or a Slurm
//! `topology.conf` built from them would name many machines alike, so a
//! node is named by the first word of its description only when no other
//! node has that word and the word is safe in hostfiles, Slurm hostlists
//! and shells (letters, digits, `.`, `_`, `-`); otherwise by its GUID as
//! `ibnetdiscover` prints it (`H-0002c90300080d28`, `S-0008f10400411a00`).
//! A names map replaces both with the cluster's host names.

use crate::error::{parse_err, FabricError, Result};
use crate::topo::{NodeKind, Topology};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The GUID name of a node, as `ibnetdiscover` prints node ids.
pub fn guid_name(kind: NodeKind, guid: u64) -> String {
    let k = if kind == NodeKind::Switch { 'S' } else { 'H' };
    format!("{k}-{guid:016x}")
}

/// A name that hostfiles, Slurm hostlists, shells and CSV take as it is:
/// letters, digits, `.`, `_`, `-`, not starting with `-`, at most 64 bytes.
pub fn is_safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn first_word(desc: &str) -> &str {
    desc.split_whitespace().next().unwrap_or("")
}

/// `H-hex`, `S-hex`, `0xhex` or bare hex: the GUID and the kind the prefix
/// says.
pub fn parse_guid_key(s: &str) -> Option<(u64, Option<NodeKind>)> {
    let (kind, hex) = if let Some(h) = s.strip_prefix("H-").or_else(|| s.strip_prefix("h-")) {
        (Some(NodeKind::Host), h)
    } else if let Some(h) = s.strip_prefix("S-").or_else(|| s.strip_prefix("s-")) {
        (Some(NodeKind::Switch), h)
    } else if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (None, h)
    } else {
        (None, s)
    };
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((u64::from_str_radix(hex, 16).ok()?, kind))
}

/// Names every node uniquely. `fixed[i]` is a name given by a map (already
/// unique among themselves); other nodes take the first word of their
/// description when it is safe and no other node has it, else their GUID
/// name.
pub fn assign_unique_names(topo: &mut Topology, fixed: &[Option<String>]) {
    let guid_names: HashMap<String, usize> = topo
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (guid_name(n.kind, n.guid), i))
        .collect();
    let cand: Vec<Option<String>> = topo
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            fixed.get(i).cloned().flatten().or_else(|| {
                let w = first_word(&n.desc);
                is_safe_name(w).then(|| w.to_string())
            })
        })
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for c in cand.iter().flatten() {
        *count.entry(c.as_str()).or_default() += 1;
    }
    let names: Vec<String> = cand
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let own = guid_name(topo.nodes[i].kind, topo.nodes[i].guid);
            match c {
                Some(c) if fixed.get(i).is_some_and(Option::is_some) => c.clone(),
                // Another node's GUID name is taken by that node.
                Some(c) if count[c.as_str()] == 1 && guid_names.get(c).is_none_or(|&j| j == i) => {
                    c.clone()
                }
                _ => own,
            }
        })
        .collect();
    for (n, name) in topo.nodes.iter_mut().zip(names) {
        n.name = name;
    }
}

/// The node a user means by `name`: its unique name, or its GUID
/// (`H-...`, `S-...`, `0x...`; a host also by its port GUID).
pub fn resolve(topo: &Topology, name: &str) -> Result<usize> {
    if let Some(i) = topo.find(name) {
        return Ok(i);
    }
    if let Some((g, kind)) = parse_guid_key(name) {
        if let Some(i) = by_guid(topo, g, kind) {
            return Ok(i);
        }
    }
    let shared: Vec<&str> = topo
        .nodes
        .iter()
        .filter(|n| first_word(&n.desc) == name || n.desc == name)
        .map(|n| n.name.as_str())
        .collect();
    if shared.len() > 1 {
        return Err(FabricError::Invalid(format!(
            "'{name}' is the description of {} nodes, not a unique name: name one as {}{} \
             (their GUIDs), or give them names with --names FILE",
            shared.len(),
            shared[..shared.len().min(3)].join(", "),
            if shared.len() > 3 { ", ..." } else { "" }
        )));
    }
    if let [one] = shared[..] {
        return Err(FabricError::Invalid(format!(
            "no node named '{name}' (the node with that description is named '{one}')"
        )));
    }
    Err(FabricError::Invalid(format!("no node named '{name}'")))
}

/// A node by GUID: node GUID first, then a host's port GUID.
fn by_guid(topo: &Topology, g: u64, kind: Option<NodeKind>) -> Option<usize> {
    let fits = |k: NodeKind| kind.is_none_or(|want| want == k);
    topo.nodes
        .iter()
        .position(|n| n.guid == g && fits(n.kind))
        .or_else(|| {
            topo.nodes
                .iter()
                .position(|n| !n.is_switch() && n.port_guid == g && fits(n.kind))
        })
}

/// One line of a names map.
#[derive(Debug, Clone)]
pub struct NameEntry {
    pub line: usize,
    pub guid: u64,
    /// What the key's prefix says (`H-` host, `S-` switch), if anything.
    pub kind: Option<NodeKind>,
    pub name: String,
}

/// A GUID-to-name map: `H-0002c90300080d28 r510gluster4` lines (also
/// `0x0002c90300080d28 "r510gluster4"`, OpenSM's node-name-map form).
#[derive(Debug, Clone)]
pub struct NameMap {
    pub file: PathBuf,
    pub entries: Vec<NameEntry>,
}

/// What applying a map did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameMapReport {
    /// Nodes of the fabric named by the map.
    pub named: usize,
    /// Map entries for GUIDs this fabric does not have.
    pub not_in_fabric: usize,
    /// Hosts of the fabric the map does not name.
    pub hosts_unnamed: usize,
}

pub fn parse_name_map(path: &Path) -> Result<NameMap> {
    let text = crate::io::read_text(path)?;
    parse_name_map_str(path, &text)
}

/// Text before a `#` that is not inside double quotes.
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

pub fn parse_name_map_str(path: &Path, text: &str) -> Result<NameMap> {
    let mut entries: Vec<NameEntry> = vec![];
    let mut by_key: HashMap<(u64, Option<NodeKind>), usize> = HashMap::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let ln = i + 1;
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        let (key, rest) = line
            .split_once(char::is_whitespace)
            .map(|(k, r)| (k, r.trim()))
            .unwrap_or((line, ""));
        let (guid, kind) = parse_guid_key(key).ok_or_else(|| {
            parse_err(
                path,
                ln,
                format!(
                    "'{key}' is not a GUID (expected H-0002c90300080d28, S-0008f10400411a00 or 0x0002c90300080d28)"
                ),
            )
        })?;
        if rest.is_empty() {
            return Err(parse_err(path, ln, format!("no name after '{key}'")));
        }
        let name = map_name(path, ln, rest)?;
        if let Some(&j) = by_key.get(&(guid, kind)) {
            if entries[j].name == name {
                continue;
            }
            return Err(parse_err(
                path,
                ln,
                format!(
                    "{key} is named '{}' at line {} already",
                    entries[j].name, entries[j].line
                ),
            ));
        }
        if let Some(&j) = by_name.get(&name) {
            return Err(parse_err(
                path,
                ln,
                format!(
                    "name '{name}' is given to GUID 0x{:016x} at line {} already",
                    entries[j].guid, entries[j].line
                ),
            ));
        }
        by_key.insert((guid, kind), entries.len());
        by_name.insert(name.clone(), entries.len());
        entries.push(NameEntry {
            line: ln,
            guid,
            kind,
            name,
        });
    }
    if entries.is_empty() {
        return Err(parse_err(
            path,
            text.lines().count(),
            "no 'GUID NAME' lines (expected e.g. 'H-0002c90300080d28 r510gluster4')",
        ));
    }
    Ok(NameMap {
        file: path.to_path_buf(),
        entries,
    })
}

/// The name part of a name map line (`rest`, after the GUID): one word,
/// or a quoted node description whose first word is taken; it must be a
/// name hostfiles and Slurm take and must not look like a GUID name.
fn map_name(path: &Path, ln: usize, rest: &str) -> Result<String> {
    let name = if let Some(q) = rest.strip_prefix('"') {
        let (inner, after) = q
            .split_once('"')
            .ok_or_else(|| parse_err(path, ln, "unterminated quoted name"))?;
        if !after.trim().is_empty() {
            return Err(parse_err(
                path,
                ln,
                format!("unexpected text after the name: '{}'", after.trim()),
            ));
        }
        // A quoted node description: its first word, as for descriptions.
        first_word(inner).to_string()
    } else {
        let mut words = rest.split_whitespace();
        let w = words.next().unwrap_or("").to_string();
        if let Some(extra) = words.next() {
            return Err(parse_err(
                path,
                ln,
                format!("unexpected text after the name '{w}': '{extra}' (one GUID and one name a line)"),
            ));
        }
        w
    };
    if !is_safe_name(&name) {
        return Err(parse_err(
            path,
            ln,
            format!(
                "name '{name}' cannot go into hostfiles and Slurm hostlists: \
                 use letters, digits, '.', '_' and '-' (not first), at most 64"
            ),
        ));
    }
    if parse_guid_key(&name).is_some_and(|(_, k)| k.is_some()) {
        return Err(parse_err(
            path,
            ln,
            format!("name '{name}' looks like a GUID name; give a host name"),
        ));
    }
    Ok(name)
}

/// Names the nodes of `topo` from `map`, then names the rest uniquely
/// ([`assign_unique_names`]).
pub fn apply_name_map(topo: &mut Topology, map: &NameMap) -> Result<NameMapReport> {
    let mut fixed: Vec<Option<String>> = vec![None; topo.nodes.len()];
    let mut line_of: Vec<usize> = vec![0; topo.nodes.len()];
    let mut rep = NameMapReport::default();
    for e in &map.entries {
        let found = by_guid(topo, e.guid, None);
        let Some(i) = found else {
            rep.not_in_fabric += 1;
            continue;
        };
        let n = &topo.nodes[i];
        if let Some(k) = e.kind {
            if k != n.kind {
                return Err(parse_err(
                    &map.file,
                    e.line,
                    format!(
                        "GUID 0x{:016x} is a {} in this fabric (named {}), not a {}",
                        e.guid,
                        kind_word(n.kind),
                        guid_name(n.kind, n.guid),
                        kind_word(k)
                    ),
                ));
            }
        }
        if let Some(prev) = &fixed[i] {
            if prev != &e.name {
                return Err(parse_err(
                    &map.file,
                    e.line,
                    format!(
                        "{} is named '{prev}' at line {} already (by its node or port GUID)",
                        guid_name(n.kind, n.guid),
                        line_of[i]
                    ),
                ));
            }
            continue;
        }
        fixed[i] = Some(e.name.clone());
        line_of[i] = e.line;
        rep.named += 1;
    }
    rep.hosts_unnamed = topo
        .nodes
        .iter()
        .zip(&fixed)
        .filter(|(n, f)| !n.is_switch() && f.is_none())
        .count();
    assign_unique_names(topo, &fixed);
    Ok(rep)
}

fn kind_word(k: NodeKind) -> &'static str {
    match k {
        NodeKind::Host => "host",
        NodeKind::Switch => "switch",
    }
}

/// Notes on nodes named by GUID because their description was shared or
/// unusable, one per first word of the descriptions: what a user should
/// know before using a hostfile or a Slurm file.
pub fn naming_notes(topo: &Topology) -> Vec<String> {
    // (kind, first word) -> GUID-named nodes, and one of their descriptions.
    let mut groups: Vec<(NodeKind, String, Vec<&str>, &str)> = vec![];
    for n in &topo.nodes {
        let w = first_word(&n.desc);
        if n.name != guid_name(n.kind, n.guid) || w.is_empty() || w == n.name {
            continue;
        }
        match groups.iter_mut().find(|g| g.0 == n.kind && g.1 == w) {
            Some(g) => g.2.push(&n.name),
            None => groups.push((n.kind, w.to_string(), vec![&n.name], &n.desc)),
        }
    }
    groups
        .into_iter()
        .map(|(kind, word, names, desc)| {
            let what = match (kind, names.len()) {
                (NodeKind::Host, 1) => "1 host is".to_string(),
                (NodeKind::Host, k) => format!("{k} hosts are"),
                (NodeKind::Switch, 1) => "1 switch is".to_string(),
                (NodeKind::Switch, k) => format!("{k} switches are"),
            };
            let why = if is_safe_name(&word) {
                let shared = topo
                    .nodes
                    .iter()
                    .filter(|n| first_word(&n.desc) == word)
                    .count();
                format!("{shared} nodes' descriptions begin with '{word}'")
            } else {
                format!("'{word}' has characters a name cannot take")
            };
            format!(
                "{what} named by GUID ({}{}): {why} (e.g. \"{desc}\"){}",
                names[0],
                if names.len() > 1 { ", ..." } else { "" },
                if kind == NodeKind::Host {
                    "; --names FILE maps GUIDs to host names"
                } else {
                    ""
                }
            )
        })
        .collect()
}
