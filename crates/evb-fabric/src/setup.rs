//! What every `evb fabric` command does first: read the fabric (naming its
//! nodes from a GUID map), apply what-if edits, get forwarding tables
//! (read, or computed as OpenSM would), parse the shift steps asked for
//! and resolve a rank order. Notes for the user (nodes named by GUID,
//! a routing engine that fell back to minhop, ...) are returned, for the
//! caller to print.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::conflicts::{shift_steps, StepConvention};
use crate::error::{FabricError, Result};
use crate::lft::{LftOrigin, Lfts};
use crate::optimize::{self, SearchReport};
use crate::routing::{route_or_fallback, Engine};
use crate::{io, names, Topology};

/// A fabric as the command line gives it.
#[derive(Debug, Clone, Default)]
pub struct FabricSource {
    /// An `ibnetdiscover` file or a generated fat tree (`fat-tree:...`).
    pub topology: String,
    /// GUID-to-name map (`--names`).
    pub names: Option<PathBuf>,
    /// Forwarding tables to read (`--lfts`); without them, `routing`.
    pub lfts: Option<PathBuf>,
    /// Routing engine (default ftree).
    pub routing: Option<String>,
    /// Refuse OpenSM's fallback to minhop.
    pub strict: bool,
    /// What-if edits ([`Topology::apply_edits`]).
    pub remove: Vec<String>,
    pub remove_link: Vec<String>,
    pub swap_cables: Vec<String>,
}

/// A fabric read, edited and routed.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub topo: Topology,
    pub lfts: Lfts,
    /// How the tables were made ("ftree routing by evb", "LFTs from F").
    pub what: String,
    /// Why the engine asked for fell back to minhop, if it did.
    pub fallback: Option<String>,
    /// Notes for the user, one per line, in the order they arose.
    pub notes: Vec<String>,
}

impl FabricSource {
    /// Reads the fabric, applies the edits, reads or computes the tables.
    pub fn load(&self) -> Result<Loaded> {
        let (orig, mut notes) = load_named(&self.topology, self.names.as_deref())?;
        let mut topo = orig.clone();
        topo.apply_edits(&self.remove, &self.remove_link, &self.swap_cables)?;
        let (lfts, what, fallback) = match &self.lfts {
            Some(f) => {
                let l = io::parse_lfts(f, &orig)?;
                (
                    l.remap(&orig, &topo),
                    format!("LFTs from {}", f.display()),
                    None,
                )
            }
            None => {
                let r = route_like_opensm(&topo, self.routing.as_deref(), self.strict)?;
                notes.extend(r.notes);
                (r.lfts, r.what, r.fallback)
            }
        };
        Ok(Loaded {
            topo,
            lfts,
            what,
            fallback,
            notes,
        })
    }
}

/// Reads the fabric and names its nodes (`names`), with notes on which
/// nodes are named by GUID and what the map did not cover.
pub fn load_named(spec: &str, names: Option<&Path>) -> Result<(Topology, Vec<String>)> {
    let (topo, rep) = io::load_topology_named(spec, names)?;
    let mut notes: Vec<String> = names::naming_notes(&topo);
    if let (Some(r), Some(f)) = (rep, names) {
        if r.not_in_fabric > 0 || r.hosts_unnamed > 0 {
            notes.push(format!(
                "{}: {} node(s) named; {} GUID(s) not in this fabric; {} host(s) not in the map keep their own names",
                f.display(),
                r.named,
                r.not_in_fabric,
                r.hosts_unnamed
            ));
        }
    }
    Ok((topo, notes))
}

/// Tables routed as OpenSM would route them.
#[derive(Debug, Clone)]
pub struct OpenSmRouting {
    pub lfts: Lfts,
    /// How: "ftree routing by evb", or the fallback to minhop.
    pub what: String,
    pub fallback: Option<String>,
    pub notes: Vec<String>,
}

/// Routes with `engine` (default ftree) as OpenSM would: where ftree, updn
/// or dfsssp cannot route the fabric, minhop does and a note says why
/// (`strict` refuses).
pub fn route_like_opensm(
    topo: &Topology,
    engine: Option<&str>,
    strict: bool,
) -> Result<OpenSmRouting> {
    let e = Engine::parse(engine.unwrap_or(optimize::DEFAULT_ROUTING))?;
    let r = route_or_fallback(topo, &e, strict)?;
    let what = match &r.fallback {
        None => format!("{} routing by evb", r.engine.name()),
        Some(_) => format!(
            "minhop routing by evb ({} fell back to minhop, as OpenSM does)",
            e.name()
        ),
    };
    let notes = match &r.fallback {
        Some(why) => vec![
            why.clone(),
            format!(
                "routed with minhop instead, as OpenSM falls back from {} (--strict refuses)",
                e.name()
            ),
        ],
        None => Vec::new(),
    };
    Ok(OpenSmRouting {
        lfts: r.lfts,
        what,
        fallback: r.fallback,
        notes,
    })
}

impl Lfts {
    /// These tables, read for `orig`, on the edited `topo` (nodes matched
    /// by GUID and kind; a removed node's table is dropped).
    pub fn remap(&self, orig: &Topology, topo: &Topology) -> Lfts {
        let mut out = Lfts::empty(topo);
        out.origin = self.origin.as_ref().map(|o| LftOrigin {
            file: o.file.clone(),
            header_line: vec![0; topo.nodes.len()],
        });
        for (i, n) in orig.nodes.iter().enumerate() {
            if let Some(j) = topo
                .nodes
                .iter()
                .position(|m| m.guid == n.guid && m.kind == n.kind)
            {
                out.tables[j] = self.tables[i].clone();
                if let (Some(o), Some(src)) = (out.origin.as_mut(), self.origin.as_ref()) {
                    o.header_line[j] = src.header_line[i];
                }
            }
        }
        out
    }
}

/// The shift steps of `spec` (`1,3,5-7`; every step 1..n-1 without one),
/// as evb's send steps (what the analysis traces) under `convention`.
pub fn send_steps(spec: Option<&str>, n: usize, convention: StepConvention) -> Result<Vec<usize>> {
    Ok(convention.to_send_steps(&parse_steps(spec, n)?, n))
}

/// The steps of `spec` as written (`1,3,5-7`), each in 1..n-1; every
/// step without one.
pub fn parse_steps(spec: Option<&str>, n: usize) -> Result<Vec<usize>> {
    if n < 2 {
        return Err(FabricError::Invalid(format!(
            "a shift schedule needs at least 2 ranks, the order has {n}"
        )));
    }
    let Some(s) = spec else {
        return Ok(shift_steps(n));
    };
    let number = |x: &str, part: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|e| FabricError::Invalid(format!("bad step '{part}': {e}")))
    };
    let mut out = vec![];
    for part in s.split(',').filter(|x| !x.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (number(a, part)?, number(b, part)?),
            None => {
                let v = number(part, part)?;
                (v, v)
            }
        };
        for v in a..=b {
            if v == 0 || v >= n {
                return Err(FabricError::Invalid(format!(
                    "step {v} out of range 1..{}",
                    n - 1
                )));
            }
            out.push(v);
        }
    }
    if out.is_empty() {
        return Err(FabricError::Invalid("no steps given".into()));
    }
    Ok(out)
}

/// The rank order `spec` names: `optimized` searches one (for up to
/// `limit`, from `seed`; it needs the tables), anything else is
/// [`optimize::order_or_default`] (no `spec`: the default order).
pub fn resolve_order(
    spec: Option<&str>,
    topo: &Topology,
    lfts: Option<&Lfts>,
    steps: &[usize],
    limit: Duration,
    seed: u64,
) -> Result<(optimize::ResolvedOrder, Option<SearchReport>)> {
    Ok(match spec {
        Some(s @ ("optimized" | "optimised")) => {
            let lfts = lfts.ok_or_else(|| {
                FabricError::Invalid("--order optimized needs routing tables".into())
            })?;
            let (o, r) = optimize::optimize_order(topo, lfts, steps, limit, seed)?;
            let order = optimize::ResolvedOrder {
                order: o,
                spec: s.to_string(),
                note: None,
            };
            (order, Some(r))
        }
        other => (optimize::order_or_default(other, topo)?, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_lists_and_ranges_within_the_ranks() {
        assert_eq!(parse_steps(None, 4).unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_steps(Some("1,3-5"), 8).unwrap(), vec![1, 3, 4, 5]);
        let e = |spec: &str, n: usize| parse_steps(Some(spec), n).unwrap_err().to_string();
        assert_eq!(e("0", 4), "step 0 out of range 1..3");
        assert_eq!(e("2-4", 4), "step 4 out of range 1..3");
        assert_eq!(e(",", 4), "no steps given");
        assert_eq!(e("x", 4), "bad step 'x': invalid digit found in string");
        assert_eq!(
            parse_steps(None, 1).unwrap_err().to_string(),
            "a shift schedule needs at least 2 ranks, the order has 1"
        );
    }
}
