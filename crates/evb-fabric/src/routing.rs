//! Routing engines besides ftree: OpenSM's `minhop`, `updn` and `dfsssp`
//! (in [`crate::osm`]), evb's `dmodk` and seeded `random`, and
//! per-destination "choice" routing (used by `route --for-shift`).
//!
//! evb's own engines route only along shortest paths, which makes them
//! loop-free by construction: every hop gets one step closer to the
//! destination.
//!
//! OpenSM falls back to minhop when the engine it was asked for cannot
//! route a fabric (ftree on a fabric that is not a fat tree, updn without
//! root switches, dfsssp with detached switches); [`route_or_fallback`]
//! does the same and says why, [`route`] refuses instead.

use crate::error::{FabricError, Result};
use crate::io::switch_heights;
use crate::lft::{Lfts, NO_PATH};
use crate::topo::Topology;
use rand::{Rng, SeedableRng};

/// A routing engine by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// OpenSM's ftree (host routes entry for entry).
    Ftree,
    /// OpenSM's minhop, its default engine.
    Minhop,
    /// OpenSM's up*/down* engine.
    Updn,
    /// OpenSM's dfsssp (also `sssp`: the same tables without VLs).
    Dfsssp,
    Dmodk,
    Random(u64),
}

impl Engine {
    pub fn parse(s: &str) -> Result<Engine> {
        Ok(match s {
            "ftree" => Engine::Ftree,
            "minhop" => Engine::Minhop,
            "updn" => Engine::Updn,
            "dfsssp" | "sssp" => Engine::Dfsssp,
            "dmodk" | "d-mod-k" => Engine::Dmodk,
            "random" => Engine::Random(1),
            _ => match s.strip_prefix("random:") {
                Some(x) => Engine::Random(
                    x.parse()
                        .map_err(|_| FabricError::Invalid(format!("bad seed in '{s}'")))?,
                ),
                None => {
                    return Err(FabricError::Invalid(format!(
                        "unknown routing engine '{s}' (ftree, minhop, updn, dfsssp, dmodk, random:SEED)"
                    )))
                }
            },
        })
    }

    /// The name `parse` takes.
    pub fn name(&self) -> String {
        match self {
            Engine::Ftree => "ftree".into(),
            Engine::Minhop => "minhop".into(),
            Engine::Updn => "updn".into(),
            Engine::Dfsssp => "dfsssp".into(),
            Engine::Dmodk => "dmodk".into(),
            Engine::Random(s) => format!("random:{s}"),
        }
    }
}

/// Runs an engine; an engine that cannot route the fabric is an error
/// (see [`route_or_fallback`] for OpenSM's behaviour).
pub fn route(topo: &Topology, engine: &Engine) -> Result<Lfts> {
    match engine {
        Engine::Ftree => Ok(crate::ftree::route_ftree(topo)?.lfts),
        Engine::Minhop => Ok(crate::osm::route_minhop(topo)),
        Engine::Updn => crate::osm::route_updn(topo),
        Engine::Dfsssp => crate::osm::route_dfsssp(topo),
        Engine::Dmodk => {
            let g = Graph::new(topo);
            let strides = g.strides.clone();
            let h = g.height.clone();
            g.route_all(topo, |sw, lid, cands, _| {
                let i = (lid as usize / strides[h[sw] as usize]) % cands.len();
                cands[i]
            })
        }
        Engine::Random(seed) => {
            let g = Graph::new(topo);
            let mut rng = rand_pcg::Pcg64::seed_from_u64(*seed);
            g.route_all(topo, |_, _, cands, _| cands[rng.gen_range(0..cands.len())])
        }
    }
}

/// Tables, the engine that made them, and why the engine asked for was not
/// used.
#[derive(Debug, Clone)]
pub struct Routed {
    pub lfts: Lfts,
    pub engine: Engine,
    /// Why the requested engine gave up (then `engine` is minhop).
    pub fallback: Option<String>,
}

/// Runs an engine as OpenSM does: when ftree, updn or dfsssp cannot route
/// the fabric, minhop routes it and `fallback` says why. `strict` refuses
/// instead.
pub fn route_or_fallback(topo: &Topology, engine: &Engine, strict: bool) -> Result<Routed> {
    match route(topo, engine) {
        Ok(lfts) => Ok(Routed {
            lfts,
            engine: engine.clone(),
            fallback: None,
        }),
        Err(e) if matches!(engine, Engine::Ftree | Engine::Updn | Engine::Dfsssp) => {
            if strict {
                return Err(FabricError::Invalid(format!(
                    "{e} (refused: --strict; OpenSM would fall back to minhop)"
                )));
            }
            Ok(Routed {
                lfts: crate::osm::route_minhop(topo),
                engine: Engine::Minhop,
                fallback: Some(e.to_string()),
            })
        }
        Err(e) => Err(e),
    }
}

/// Shortest-path structure shared by the engines.
pub struct Graph {
    /// Hop distance from every switch to every switch (row per target).
    pub dist: Vec<Vec<u16>>,
    /// Index of each switch node in `dist` rows/cols.
    pub sw_index: Vec<usize>,
    pub off: Vec<usize>,
    pub offsets_len: usize,
    pub height: Vec<u32>,
    /// Divisor per height for D-mod-K.
    pub strides: Vec<usize>,
}

const FAR: u16 = u16::MAX;

impl Graph {
    pub fn new(topo: &Topology) -> Graph {
        let sws = topo.switches();
        let mut sw_index = vec![usize::MAX; topo.nodes.len()];
        for (i, &s) in sws.iter().enumerate() {
            sw_index[s] = i;
        }
        let mut dist = vec![vec![FAR; sws.len()]; sws.len()];
        for (ti, &t) in sws.iter().enumerate() {
            let row = &mut dist[ti];
            row[ti] = 0;
            let mut q = std::collections::VecDeque::from([t]);
            while let Some(s) = q.pop_front() {
                let d = row[sw_index[s]];
                for r in topo.nodes[s].ports.iter().flatten() {
                    let ri = sw_index[r.node];
                    if ri != usize::MAX && row[ri] == FAR {
                        row[ri] = d + 1;
                        q.push_back(r.node);
                    }
                }
            }
        }
        let mut off = vec![0; topo.nodes.len()];
        let mut total = 0;
        for (i, n) in topo.nodes.iter().enumerate() {
            off[i] = total;
            total += n.ports.len();
        }
        let height = switch_heights(topo);
        let maxh = sws
            .iter()
            .map(|&s| height[s])
            .filter(|&h| h != u32::MAX)
            .max()
            .unwrap_or(0) as usize;
        let mut ups = vec![1usize; maxh + 2];
        for &s in &sws {
            let h = height[s];
            if h == u32::MAX {
                continue;
            }
            let u = topo.nodes[s]
                .ports
                .iter()
                .flatten()
                .filter(|r| topo.nodes[r.node].is_switch() && height[r.node] > h)
                .count();
            ups[h as usize] = ups[h as usize].max(u.max(1));
        }
        let mut strides = vec![1usize; maxh + 2];
        for h in 1..strides.len() {
            strides[h] = strides[h - 1] * ups[h - 1];
        }
        Graph {
            dist,
            sw_index,
            off,
            offsets_len: total,
            height,
            strides,
        }
    }

    /// Ports of `sw` on a shortest path toward switch `target` (sorted).
    pub fn candidates(&self, topo: &Topology, sw: usize, target: usize, out: &mut Vec<u8>) {
        out.clear();
        // Either end may not be a switch on a mis-cabled fabric.
        let (ti, si) = (self.sw_index[target], self.sw_index[sw]);
        if ti == usize::MAX || si == usize::MAX {
            return;
        }
        let row = &self.dist[ti];
        let d = row[si];
        if d == FAR || d == 0 {
            return;
        }
        let n = &topo.nodes[sw];
        for p in 1..n.ports.len() {
            if let Some(r) = n.ports[p] {
                let ri = self.sw_index[r.node];
                if ri != usize::MAX && row[ri] == d - 1 {
                    out.push(p as u8);
                }
            }
        }
    }

    /// Fills every switch's entry for every LID with `pick` among the
    /// shortest-path candidates (destinations in LID order).
    fn route_all(
        &self,
        topo: &Topology,
        mut pick: impl FnMut(usize, u16, &[u8], &Graph) -> u8,
    ) -> Result<Lfts> {
        let mut lfts = Lfts::empty(topo);
        let lids = topo.lid_table();
        let mut cands = vec![];
        for (lid, node) in lids.iter().enumerate() {
            let Some(dst) = *node else { continue };
            let lid = lid as u16;
            let (target, last_port) = if topo.nodes[dst].is_switch() {
                (dst, 0u8)
            } else {
                let Some(p) = topo.nodes[dst].first_port() else {
                    continue;
                };
                let r = topo.nodes[dst].ports[p as usize].expect("cabled");
                (r.node, r.port)
            };
            for sw in topo.switches() {
                if sw == target {
                    lfts.set(sw, lid, last_port);
                    continue;
                }
                self.candidates(topo, sw, target, &mut cands);
                if cands.is_empty() {
                    continue;
                }
                let p = pick(sw, lid, &cands, self);
                lfts.set(sw, lid, p);
            }
        }
        Ok(lfts)
    }

    /// Sets the entries for host `dst` on every switch from a per-destination
    /// choice value `c`: at a switch of height h the candidate index is
    /// `(c / stride[h]) mod #candidates` (D-mod-K with `c = LID`).
    pub fn set_choice(
        &self,
        topo: &Topology,
        lfts: &mut Lfts,
        dst: usize,
        c: usize,
        cands: &mut Vec<u8>,
    ) {
        let lid = topo.nodes[dst].lid;
        let Some(p) = topo.nodes[dst].first_port() else {
            return;
        };
        let r = topo.nodes[dst].ports[p as usize].expect("cabled");
        for sw in topo.switches() {
            if sw == r.node {
                lfts.set(sw, lid, r.port);
                continue;
            }
            self.candidates(topo, sw, r.node, cands);
            let port = if cands.is_empty() {
                NO_PATH
            } else {
                let h = self.height[sw].min(self.strides.len() as u32 - 1) as usize;
                cands[(c / self.strides[h]) % cands.len()]
            };
            lfts.set(sw, lid, port);
        }
    }

    /// Number of distinct choice values worth trying.
    pub fn choice_span(&self) -> usize {
        *self.strides.last().unwrap_or(&1)
    }
}
