//! Topology model (hosts, switches, ports, links), fat-tree generators and
//! what-if edits.

use crate::error::{FabricError, Result};
use crate::rate::LinkRate;
use std::collections::HashMap;

/// Kind of a fabric node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum NodeKind {
    Host,
    Switch,
}

/// The far end of a cable, and what the cable carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRef {
    pub node: usize,
    pub port: u8,
    /// Width and speed of the link (the same at both ends); `None` when the
    /// input did not say (ibsim net files, hand-written fabrics).
    pub rate: Option<LinkRate>,
}

/// A host (channel adapter) or a switch.
#[derive(Debug, Clone)]
pub struct Node {
    pub kind: NodeKind,
    /// Unique name: the first word of the node description when no other
    /// node has it, else the GUID as `ibnetdiscover` prints it
    /// (`H-0002c90300080d28`), or the name a `--names` map gives (see
    /// [`crate::names`]). Every output names nodes by it.
    pub name: String,
    /// The node description as read (generated fabrics: the name).
    pub desc: String,
    pub guid: u64,
    /// Port GUID of the (first) connected port; equal to `guid` for switches.
    pub port_guid: u64,
    /// Base LID (switch: port 0; host: its connected port). 0 = unassigned.
    pub lid: u16,
    /// `ports[p]` for p in 1..=nports; index 0 unused.
    pub ports: Vec<Option<PortRef>>,
}

impl Node {
    pub fn nports(&self) -> usize {
        self.ports.len() - 1
    }
    pub fn is_switch(&self) -> bool {
        self.kind == NodeKind::Switch
    }
    /// First connected port (hosts send and receive through it).
    pub fn first_port(&self) -> Option<u8> {
        (1..self.ports.len())
            .find(|&p| self.ports[p].is_some())
            .map(|p| p as u8)
    }
}

/// A fabric: nodes and the cables between their ports.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    pub nodes: Vec<Node>,
}

impl Topology {
    pub fn add_node(&mut self, kind: NodeKind, name: &str, guid: u64, nports: usize) -> usize {
        self.nodes.push(Node {
            kind,
            name: name.to_string(),
            desc: name.to_string(),
            guid,
            port_guid: if kind == NodeKind::Host {
                guid + 1
            } else {
                guid
            },
            lid: 0,
            ports: vec![None; nports + 1],
        });
        self.nodes.len() - 1
    }

    /// Cables port `pa` of `a` to port `pb` of `b` (rate unknown).
    pub fn connect(&mut self, a: usize, pa: u8, b: usize, pb: u8) -> Result<()> {
        self.connect_rated(a, pa, b, pb, None)
    }

    /// Cables port `pa` of `a` to port `pb` of `b` with a link rate.
    pub fn connect_rated(
        &mut self,
        a: usize,
        pa: u8,
        b: usize,
        pb: u8,
        rate: Option<LinkRate>,
    ) -> Result<()> {
        for (n, p) in [(a, pa), (b, pb)] {
            let node = &self.nodes[n];
            if p == 0 || p as usize > node.nports() {
                return Err(FabricError::Invalid(format!(
                    "{} has no port {}",
                    node.name, p
                )));
            }
            if node.ports[p as usize].is_some() {
                return Err(FabricError::Invalid(format!(
                    "port {} of {} is cabled twice",
                    p, node.name
                )));
            }
        }
        self.nodes[a].ports[pa as usize] = Some(PortRef {
            node: b,
            port: pb,
            rate,
        });
        self.nodes[b].ports[pb as usize] = Some(PortRef {
            node: a,
            port: pa,
            rate,
        });
        Ok(())
    }

    /// Width and speed of the link at `node` port `port`, if cabled and known.
    pub fn link_rate(&self, node: usize, port: u8) -> Option<LinkRate> {
        self.nodes
            .get(node)?
            .ports
            .get(port as usize)
            .copied()
            .flatten()?
            .rate
    }

    /// Data rate of the link at `node` port `port` in Gb/s (after encoding:
    /// 4xEDR 100), if cabled and known.
    pub fn link_gbps(&self, node: usize, port: u8) -> Option<f64> {
        self.link_rate(node, port).map(|r| r.gbps())
    }

    /// Sets the rate of the cable at `node` port `port` (both ends).
    pub fn set_link_rate(&mut self, node: usize, port: u8, rate: Option<LinkRate>) -> Result<()> {
        let r = self
            .nodes
            .get(node)
            .and_then(|n| n.ports.get(port as usize).copied().flatten())
            .ok_or_else(|| {
                FabricError::Invalid(format!(
                    "{} port {port} is not cabled",
                    self.nodes.get(node).map_or("?", |n| n.name.as_str())
                ))
            })?;
        if let Some(p) = self.nodes[node].ports[port as usize].as_mut() {
            p.rate = rate;
        }
        if let Some(p) = self.nodes[r.node].ports[r.port as usize].as_mut() {
            p.rate = rate;
        }
        Ok(())
    }

    pub fn hosts(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| !self.nodes[i].is_switch())
            .collect()
    }
    pub fn switches(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_switch())
            .collect()
    }
    pub fn max_lid(&self) -> u16 {
        self.nodes.iter().map(|n| n.lid).max().unwrap_or(0)
    }
    /// `lid -> node` table.
    pub fn lid_table(&self) -> Vec<Option<usize>> {
        let mut t = vec![None; self.max_lid() as usize + 1];
        for (i, n) in self.nodes.iter().enumerate() {
            if n.lid != 0 {
                t[n.lid as usize] = Some(i);
            }
        }
        t
    }
    pub fn by_name(&self) -> HashMap<&str, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect()
    }
    pub fn find(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }
    /// The node a user means: its unique name, or its GUID (`H-...`,
    /// `S-...`, `0x...`). A description several nodes share is refused
    /// with the GUID names to use instead.
    pub fn resolve(&self, name: &str) -> Result<usize> {
        crate::names::resolve(self, name)
    }
    /// Switch a host is cabled to.
    pub fn leaf_of(&self, host: usize) -> Option<usize> {
        let n = &self.nodes[host];
        n.first_port()
            .and_then(|p| n.ports[p as usize])
            .map(|r| r.node)
    }
    /// Assigns LIDs 1.. to hosts then switches (generated fabrics).
    pub fn assign_lids(&mut self) {
        let mut lid = 1u16;
        for kind in [NodeKind::Host, NodeKind::Switch] {
            for n in self.nodes.iter_mut().filter(|n| n.kind == kind) {
                n.lid = lid;
                lid += 1;
            }
        }
    }
    /// Offsets to number directed links: link id of (node, port) is
    /// `offsets[node] + port`.
    pub fn port_offsets(&self) -> (Vec<u32>, usize) {
        let mut off = Vec::with_capacity(self.nodes.len());
        let mut total = 0usize;
        for n in &self.nodes {
            off.push(total as u32);
            total += n.ports.len();
        }
        (off, total)
    }

    // ---- what-if edits ----

    fn unlink_port(&mut self, n: usize, p: u8) {
        if let Some(r) = self.nodes[n].ports[p as usize].take() {
            self.nodes[r.node].ports[r.port as usize] = None;
        }
    }
    /// Removes a node (host or switch) and its cables.
    pub fn remove_node(&mut self, name: &str) -> Result<()> {
        let i = self.resolve(name)?;
        for p in 1..self.nodes[i].ports.len() {
            self.unlink_port(i, p as u8);
        }
        self.nodes.remove(i);
        for n in &mut self.nodes {
            for r in n.ports.iter_mut().flatten() {
                if r.node > i {
                    r.node -= 1;
                }
            }
        }
        Ok(())
    }
    /// Removes the cable at `name` port `port`.
    pub fn remove_link(&mut self, name: &str, port: u8) -> Result<()> {
        let i = self.resolve(name)?;
        if port as usize >= self.nodes[i].ports.len()
            || self.nodes[i].ports[port as usize].is_none()
        {
            return Err(FabricError::Invalid(format!(
                "{name} port {port} is not cabled"
            )));
        }
        self.unlink_port(i, port);
        Ok(())
    }
    /// Swaps the far ends of two cables (a mis-cabling).
    pub fn swap_cables(&mut self, a: &str, pa: u8, b: &str, pb: u8) -> Result<()> {
        let ia = self.resolve(a)?;
        let ib = self.resolve(b)?;
        let ra = self.nodes[ia].ports.get(pa as usize).copied().flatten();
        let rb = self.nodes[ib].ports.get(pb as usize).copied().flatten();
        let (Some(ra), Some(rb)) = (ra, rb) else {
            return Err(FabricError::Invalid(
                "both swapped ports must be cabled".into(),
            ));
        };
        self.unlink_port(ia, pa);
        self.unlink_port(ib, pb);
        // A cable keeps its rate: it stays plugged in at its far end.
        self.connect_rated(ia, pa, rb.node, rb.port, rb.rate)?;
        self.connect_rated(ib, pb, ra.node, ra.port, ra.rate)
    }

    /// The what-if edits as users write them (`--remove NAME`,
    /// `--remove-link NAME:PORT`, `--swap-cables A:PORT,B:PORT`), in that
    /// order.
    pub fn apply_edits(
        &mut self,
        remove: &[String],
        remove_link: &[String],
        swap_cables: &[String],
    ) -> Result<()> {
        for n in remove {
            self.remove_node(n)?;
        }
        for l in remove_link {
            let (n, p) = split_port(l)?;
            self.remove_link(&n, p)?;
        }
        for s in swap_cables {
            let (a, b) = s.split_once(',').ok_or_else(|| {
                FabricError::Invalid(format!("expected A:PORT,B:PORT, got '{s}'"))
            })?;
            let ((na, pa), (nb, pb)) = (split_port(a)?, split_port(b)?);
            self.swap_cables(&na, pa, &nb, pb)?;
        }
        Ok(())
    }
}

/// `NAME:PORT` as a node name and a port number.
pub fn split_port(s: &str) -> Result<(String, u8)> {
    let (n, p) = s
        .rsplit_once(':')
        .ok_or_else(|| FabricError::Invalid(format!("expected NAME:PORT, got '{s}'")))?;
    let port = p
        .parse()
        .map_err(|e| FabricError::Invalid(format!("bad port in '{s}': {e}")))?;
    Ok((n.to_string(), port))
}

/// How hosts are placed when a fat tree is only partly populated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Leaf by leaf, each leaf full before the next.
    Fill,
    /// Round-robin over the leaves (populations differ by at most one).
    Spread,
}

/// Parameters of a generated fat tree.
#[derive(Debug, Clone)]
pub struct FatTreeSpec {
    pub radix: usize,
    /// 2 or 3 switch levels.
    pub levels: usize,
    pub hosts: usize,
    /// Host ports per leaf (default radix/2, or set by `oversub`).
    pub down: usize,
    /// Up-links per leaf (default radix/2).
    pub up: usize,
    /// Number of leaves (2-level) or pods (3-level); 0 = as few as needed.
    pub groups: usize,
    pub placement: Placement,
    /// Rate of the host links (default 4xEDR, 100 Gb/s).
    pub host_rate: LinkRate,
    /// Rate of the switch-to-switch links (default: the host rate).
    pub uplink_rate: LinkRate,
    /// 2 levels only: the spine is one director switch of this many ports
    /// (648, 800, ...; 0: `up` spine switches). A director is a 2-level
    /// tree of chips inside a chassis, and `ibnetdiscover` shows its chips:
    /// line chips of radix `c` with `c/2` front ports, and `c/2` fabric
    /// chips cabled to every line chip (`c*c/2` front ports: 36-port chips
    /// for 648, 40-port for 800). Only the line chips the leaves' up-links
    /// need are built (a chassis partly filled with line cards).
    pub director: usize,
}

impl FatTreeSpec {
    /// Parses `fat-tree:radix=36,hosts=540[,levels=3][,oversub=2][,down=32,up=15][,leaves=N|pods=N][,spread][,gbps=100][,uplink_gbps=200][,director=648]`.
    pub fn parse(s: &str) -> Result<FatTreeSpec> {
        let body = s
            .strip_prefix("fat-tree:")
            .or_else(|| s.strip_prefix("fat-tree"))
            .ok_or_else(|| FabricError::Invalid(format!("not a fat-tree spec: {s}")))?;
        let mut radix = 36;
        let mut hosts = None;
        let mut levels = 2;
        let mut down = None;
        let mut up = None;
        let mut oversub: Option<f64> = None;
        let (mut groups, mut director) = (0, 0);
        let mut placement = Placement::Fill;
        let mut host_rate = LinkRate::EDR4;
        let mut uplink_rate = None;
        for kv in body.split(',').filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let num = || -> Result<usize> {
                v.parse()
                    .map_err(|_| FabricError::Invalid(format!("bad value in fat-tree spec: {kv}")))
            };
            match k {
                "radix" | "k" => radix = num()?,
                "hosts" | "n" => hosts = Some(num()?),
                "levels" => levels = num()?,
                "down" => down = Some(num()?),
                "up" => up = Some(num()?),
                "leaves" | "pods" => groups = num()?,
                "director" => director = num()?,
                "oversub" => {
                    let r = v.trim_end_matches(":1");
                    oversub =
                        Some(r.parse().map_err(|_| {
                            FabricError::Invalid(format!("bad oversubscription: {kv}"))
                        })?)
                }
                "gbps" | "uplink_gbps" => {
                    let r = LinkRate::parse_gbps_or_name(v)
                        .map_err(|e| FabricError::Invalid(format!("fat-tree spec {k}: {e}")))?;
                    if k == "gbps" {
                        host_rate = r;
                    } else {
                        uplink_rate = Some(r);
                    }
                }
                "spread" => placement = Placement::Spread,
                "fill" => placement = Placement::Fill,
                "placement" => {
                    placement = match v {
                        "spread" => Placement::Spread,
                        "fill" => Placement::Fill,
                        _ => return Err(FabricError::Invalid(format!("bad placement: {v}"))),
                    }
                }
                _ => {
                    return Err(FabricError::Invalid(format!(
                        "unknown fat-tree parameter: {k}"
                    )))
                }
            }
        }
        if !(4..=254).contains(&radix) {
            return Err(FabricError::Invalid(format!(
                "radix {radix} out of range 4..254"
            )));
        }
        let (mut d, mut u) = (radix / 2, radix - radix / 2);
        if let Some(r) = oversub {
            if r < 1.0 {
                return Err(FabricError::Invalid("oversubscription must be >= 1".into()));
            }
            d = ((radix as f64) * r / (r + 1.0)).floor() as usize;
            u = radix - d;
        }
        let down = down.unwrap_or(d);
        let up = up.unwrap_or(u);
        if down == 0 || up == 0 || down + up > radix {
            return Err(FabricError::Invalid(format!(
                "leaf ports down={down} up={up} do not fit radix {radix}"
            )));
        }
        if levels != 2 && levels != 3 {
            return Err(FabricError::Invalid("levels must be 2 or 3".into()));
        }
        let hosts = match hosts {
            Some(h) => h,
            None if levels == 2 => radix * down,
            None => radix * (radix / 2) * down,
        };
        Ok(FatTreeSpec {
            radix,
            levels,
            hosts,
            down,
            up,
            groups,
            placement,
            host_rate,
            uplink_rate: uplink_rate.unwrap_or(host_rate),
            director,
        })
    }

    /// Builds the fabric.
    pub fn build(&self) -> Result<Topology> {
        if self.hosts < 2 {
            return Err(FabricError::Invalid(
                "a fabric needs at least 2 hosts".into(),
            ));
        }
        if self.director > 0 {
            director_chip_radix(self.director)?;
            if self.levels != 2 {
                return Err(FabricError::Invalid(
                    "director=PORTS is the spine of a 2-level tree (levels=2)".into(),
                ));
            }
        }
        let mut t = Topology::default();
        let (leaves, spines_per_group) = self.leaves_and_spines_per_group()?;
        let per_leaf = self.hosts_per_leaf(leaves);
        let leaf_ids = self.add_leaves_with_hosts(&mut t, &per_leaf)?;
        if self.director > 0 {
            self.add_director(&mut t, &leaf_ids)?;
        } else if self.levels == 2 {
            self.add_spines(&mut t, &leaf_ids)?;
        } else {
            self.add_mids_and_roots(&mut t, &leaf_ids, spines_per_group)?;
        }
        t.assign_lids();
        Ok(t)
    }

    /// How many leaves the fabric has and, in 3 levels, how many roots sit
    /// above each mid position (0 in 2 levels): all leaves in 2 levels,
    /// k/2 per pod in 3 levels. Fails if the hosts do not fit the radix.
    fn leaves_and_spines_per_group(&self) -> Result<(usize, usize)> {
        let k = self.radix;
        if self.levels == 2 {
            let min_leaves = self.hosts.div_ceil(self.down);
            let leaves = if self.groups > 0 {
                self.groups
            } else {
                min_leaves
            };
            // A director's spine takes as many leaves as it has ports for.
            let most = if self.director > 0 {
                self.director / self.up
            } else {
                k
            };
            if leaves < min_leaves || leaves > most {
                return Err(FabricError::Invalid(format!(
                    "{} hosts need {min_leaves} leaves of {} hosts; a 2-level tree of radix {k} has at most {k} leaves (use levels=3)",
                    self.hosts, self.down
                )));
            }
            Ok((leaves, 0))
        } else {
            let mid_down = k / 2;
            let per_pod = mid_down * self.down;
            let min_pods = self.hosts.div_ceil(per_pod);
            let pods = if self.groups > 0 {
                self.groups
            } else {
                min_pods
            };
            if pods < min_pods || pods > k {
                return Err(FabricError::Invalid(format!(
                    "{} hosts need {min_pods} pods; radix {k} allows at most {k}",
                    self.hosts
                )));
            }
            Ok((pods * mid_down, k - mid_down))
        }
    }

    /// The host count of each leaf, as the placement spreads them.
    fn hosts_per_leaf(&self, leaves: usize) -> Vec<usize> {
        let mut per_leaf = vec![0usize; leaves];
        match self.placement {
            Placement::Fill => {
                let mut left = self.hosts;
                for c in per_leaf.iter_mut() {
                    *c = left.min(self.down);
                    left -= *c;
                }
            }
            Placement::Spread => {
                for i in 0..self.hosts {
                    per_leaf[i % leaves] += 1;
                }
            }
        }
        per_leaf
    }

    /// Adds the leaves and their hosts (numbered across leaves, cabled to
    /// the leaf's first ports); returns the leaves' node ids.
    fn add_leaves_with_hosts(&self, t: &mut Topology, per_leaf: &[usize]) -> Result<Vec<usize>> {
        let k = self.radix;
        let width = self.hosts.to_string().len().max(3);
        let mut hostno = 0usize;
        let mut leaf_ids = Vec::new();
        for (l, &count) in per_leaf.iter().enumerate() {
            let leaf = t.add_node(
                NodeKind::Switch,
                &format!("leaf{:03}", l + 1),
                0x0002_c902_0010_0000 + l as u64,
                k,
            );
            leaf_ids.push(leaf);
            for p in 0..count {
                hostno += 1;
                let h = t.add_node(
                    NodeKind::Host,
                    &format!("node{:0width$}", hostno),
                    0x0002_c903_0000_0000 + 2 * hostno as u64,
                    1,
                );
                t.connect_rated(h, 1, leaf, (p + 1) as u8, Some(self.host_rate))?;
            }
        }
        Ok(leaf_ids)
    }

    /// 2 levels: `up` spines, each cabled to every leaf.
    fn add_spines(&self, t: &mut Topology, leaf_ids: &[usize]) -> Result<()> {
        for s in 0..self.up {
            let sp = t.add_node(
                NodeKind::Switch,
                &format!("spine{:02}", s + 1),
                0x0002_c902_0020_0000 + s as u64,
                self.radix,
            );
            for (l, &leaf) in leaf_ids.iter().enumerate() {
                t.connect_rated(
                    leaf,
                    (self.down + s + 1) as u8,
                    sp,
                    (l + 1) as u8,
                    Some(self.uplink_rate),
                )?;
            }
        }
        Ok(())
    }

    /// The director spine, cabled as a 3-level fat tree inside: the leaves
    /// in as few groups (pods) of at most `c/2` as will do, as even as can
    /// be, up-link `j` of every leaf of pod `p` to line chip `p * up + j`
    /// (its front port: the leaf's place in the pod), and every fabric chip
    /// cabled to every line chip. OpenSM's ftree routes this without
    /// conflicts when the pods are the same size (it refuses line chips
    /// with different numbers of leaves below, and falls back to minhop);
    /// spreading a leaf's up-links over line chips at random is worse.
    fn add_director(&self, t: &mut Topology, leaf_ids: &[usize]) -> Result<()> {
        let c = director_chip_radix(self.director)?;
        let front = c / 2;
        let pods = leaf_ids.len().div_ceil(front);
        let per_pod = leaf_ids.len().div_ceil(pods);
        if pods * self.up > c {
            return Err(FabricError::Invalid(format!(
                "director={}: {} leaves of {} up-links need {} line chips of {front} front ports; it has {c}",
                self.director,
                leaf_ids.len(),
                self.up,
                pods * self.up
            )));
        }
        let lines: Vec<usize> = (0..pods * self.up)
            .map(|i| {
                let name = format!("dirL{:02}", i + 1);
                t.add_node(NodeKind::Switch, &name, 0x0002_c902_0050_0000 + i as u64, c)
            })
            .collect();
        for (l, &leaf) in leaf_ids.iter().enumerate() {
            let (pod, place) = (l / per_pod, l % per_pod);
            for j in 0..self.up {
                let port = (self.down + j + 1) as u8;
                let line = lines[pod * self.up + j];
                t.connect_rated(leaf, port, line, (place + 1) as u8, Some(self.uplink_rate))?;
            }
        }
        for f in 0..c - front {
            let name = format!("dirF{:02}", f + 1);
            let fc = t.add_node(NodeKind::Switch, &name, 0x0002_c902_0060_0000 + f as u64, c);
            for (i, &line) in lines.iter().enumerate() {
                let (lp, fp) = ((front + f + 1) as u8, (i + 1) as u8);
                t.connect_rated(line, lp, fc, fp, Some(self.uplink_rate))?;
            }
        }
        Ok(())
    }

    /// 3 levels: the mid switches of each pod, then the roots above them.
    fn add_mids_and_roots(
        &self,
        t: &mut Topology,
        leaf_ids: &[usize],
        spines_per_group: usize,
    ) -> Result<()> {
        let k = self.radix;
        let mid_down = k / 2;
        let pods = leaf_ids.len() / mid_down;
        // Mid switches: `up` per pod, each cabled to every leaf of its pod.
        let mut mids = vec![];
        for pod in 0..pods {
            let mut row = vec![];
            for m in 0..self.up {
                let id = pod * self.up + m;
                let mid = t.add_node(
                    NodeKind::Switch,
                    &format!("mid{:03}", id + 1),
                    0x0002_c902_0030_0000 + id as u64,
                    k,
                );
                for j in 0..mid_down {
                    let leaf = leaf_ids[pod * mid_down + j];
                    t.connect_rated(
                        leaf,
                        (self.down + m + 1) as u8,
                        mid,
                        (j + 1) as u8,
                        Some(self.uplink_rate),
                    )?;
                }
                row.push(mid);
            }
            mids.push(row);
        }
        // Roots: group m holds the roots above mid m of every pod.
        for m in 0..self.up {
            for r in 0..spines_per_group {
                let id = m * spines_per_group + r;
                let root = t.add_node(
                    NodeKind::Switch,
                    &format!("root{:03}", id + 1),
                    0x0002_c902_0040_0000 + id as u64,
                    k,
                );
                for (pod, row) in mids.iter().enumerate() {
                    t.connect_rated(
                        row[m],
                        (mid_down + r + 1) as u8,
                        root,
                        (pod + 1) as u8,
                        Some(self.uplink_rate),
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// The radix of a director's chips: `c` with `c * c / 2` front ports
/// (648: 36, 800: 40).
pub fn director_chip_radix(ports: usize) -> Result<usize> {
    let c = ((2 * ports) as f64).sqrt().round() as usize;
    if c < 4 || !c.is_multiple_of(2) || c * c / 2 != ports || c > 254 {
        return Err(FabricError::Invalid(format!(
            "director={ports}: a director of chips of radix c has c*c/2 front ports (648, 800, 1152, ...)"
        )));
    }
    Ok(c)
}

/// Sorts names the way people expect: `node2` before `node10`.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = vec![];
        let mut start = 0;
        let b = s.as_bytes();
        for i in 1..=b.len() {
            if i == b.len() || b[i].is_ascii_digit() != b[i - 1].is_ascii_digit() {
                out.push((b[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(cb.iter()) {
        let o = if x.0 && y.0 {
            let (tx, ty) = (x.1.trim_start_matches('0'), y.1.trim_start_matches('0'));
            tx.len().cmp(&ty.len()).then(tx.cmp(ty))
        } else {
            x.1.cmp(y.1)
        };
        if o != std::cmp::Ordering::Equal {
            return o;
        }
    }
    ca.len().cmp(&cb.len()).then(a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A director spine: only the line chips the leaves need, every fabric
    /// chip on every line chip, each leaf's up-links on distinct chips.
    #[test]
    fn director_spine() {
        let t = FatTreeSpec::parse("fat-tree:radix=12,hosts=60,down=6,up=6,leaves=10,director=72")
            .unwrap()
            .build()
            .unwrap();
        let named = |p: &str| {
            t.switches()
                .into_iter()
                .filter(|&s| t.nodes[s].name.starts_with(p))
                .count()
        };
        // 10 leaves in two pods of 5, 6 line chips each; 6 fabric chips.
        assert_eq!((named("leaf"), named("dirL"), named("dirF")), (10, 12, 6));
        for leaf in t
            .switches()
            .into_iter()
            .filter(|&s| t.nodes[s].name.starts_with("leaf"))
        {
            let mut lines: Vec<usize> = t.nodes[leaf]
                .ports
                .iter()
                .flatten()
                .map(|r| r.node)
                .filter(|&n| t.nodes[n].is_switch())
                .collect();
            lines.sort_unstable();
            lines.dedup();
            assert_eq!(lines.len(), 6, "{}", t.nodes[leaf].name);
        }
        assert_eq!(director_chip_radix(648).unwrap(), 36);
        assert_eq!(director_chip_radix(800).unwrap(), 40);
        assert!(director_chip_radix(700).is_err());
        let too_many = FatTreeSpec::parse("fat-tree:radix=12,hosts=80,down=6,up=6,director=72");
        assert!(
            too_many.unwrap().build().is_err(),
            "14 leaves x 6 up-links > 72 ports"
        );
    }
}
