//! The fabric as the simulator sees it: switches with numbered ports,
//! hosts attached to switch ports, and per switch a forwarding table from
//! destination host to output port. Built from `evb-fabric` topologies and
//! LFTs, or by the small generators here.
//!
//! A fabric may hold several disjoint networks: the event-building fabric
//! and, after it ([`SimFabric::append`]), the output network that carries
//! built events to the consumers ([`output_network`]). Routes only have to
//! exist between hosts of the same network. Every link has its own rate
//! (`host_gbps`, `port_gbps`; 0 stands for `sim.link_gbps`), and every
//! switch is InfiniBand (input-queued, credits) or Ethernet (`ethernet`:
//! shared output queues, PFC or drops).

/// What is at the other end of a switch port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    None,
    Host(u32),
    Switch { switch: u32, port: u16 },
}

#[derive(Debug, Clone)]
pub struct SimFabric {
    /// Short description, e.g. `switch:hosts=16`.
    pub name: String,
    /// Host names by host index (host index = rank).
    pub host_names: Vec<String>,
    /// Switch names, for link reports.
    pub switch_names: Vec<String>,
    /// (switch, port) each host is cabled to.
    pub host_attach: Vec<(u32, u16)>,
    /// Per switch, per port: the peer.
    pub ports: Vec<Vec<Peer>>,
    /// Per switch, per destination host: the output port (`u16::MAX`:
    /// none, for a host of another network).
    pub routes: Vec<Vec<u16>>,
    /// Per host: the data rate of its link, Gb/s (0: `sim.link_gbps`).
    pub host_gbps: Vec<f64>,
    /// Per switch, per port: the data rate of the link, Gb/s (0: the
    /// host's rate on a host port, else `sim.link_gbps`).
    pub port_gbps: Vec<Vec<f64>>,
    /// Per switch: Ethernet (shared output queues, PFC or drops) rather
    /// than InfiniBand (input FIFOs, credits).
    pub ethernet: Vec<bool>,
    /// The topology, tables and order it was built from (for the slotted
    /// barrel's schedule, [`crate::schedule`]); `None` for the generators
    /// here.
    pub routed: Option<std::sync::Arc<crate::schedule::Routed>>,
}

impl SimFabric {
    pub fn hosts(&self) -> usize {
        self.host_attach.len()
    }

    /// One switch with `hosts` hosts on ports 0..hosts.
    pub fn single_switch(hosts: usize) -> SimFabric {
        SimFabric {
            name: format!("switch:hosts={hosts}"),
            host_names: (0..hosts).map(|h| format!("host{h}")).collect(),
            switch_names: vec!["switch0".into()],
            host_attach: (0..hosts).map(|h| (0, h as u16)).collect(),
            ports: vec![(0..hosts).map(|h| Peer::Host(h as u32)).collect()],
            routes: vec![(0..hosts as u16).collect()],
            host_gbps: vec![0.0; hosts],
            port_gbps: vec![vec![0.0; hosts]],
            ethernet: vec![false],
            routed: None,
        }
    }

    /// The rate of host `h`'s link, Gb/s.
    pub fn host_link_gbps(&self, h: usize, default: f64) -> f64 {
        match self.host_gbps.get(h) {
            Some(&g) if g > 0.0 => g,
            _ => default,
        }
    }

    /// The least link rate from host `src` to host `dst` along the routes;
    /// `None` if the routes do not lead there (the fabric's validation says
    /// why).
    pub fn path_gbps(&self, src: usize, dst: usize, default: f64) -> Option<f64> {
        let (mut switch, _) = self.host_attach[src];
        let mut rate = self.host_link_gbps(src, default);
        for _ in 0..=self.ports.len() {
            let port = *self.routes.get(switch as usize)?.get(dst)?;
            if port == u16::MAX {
                return None;
            }
            rate = rate.min(self.port_link_gbps(switch as usize, usize::from(port), default));
            match self.ports[switch as usize].get(usize::from(port))? {
                Peer::Host(h) if *h as usize == dst => return Some(rate),
                Peer::Switch { switch: s, .. } => switch = *s,
                _ => return None,
            }
        }
        None
    }

    /// The rate of the link on switch `s` port `p`, Gb/s.
    pub fn port_link_gbps(&self, s: usize, p: usize, default: f64) -> f64 {
        match self.port_gbps.get(s).and_then(|ps| ps.get(p)) {
            Some(&g) if g > 0.0 => g,
            _ => match self.ports[s][p] {
                Peer::Host(h) => self.host_link_gbps(h as usize, default),
                _ => default,
            },
        }
    }

    /// Adds `other` as a separate network: its hosts after ours, its
    /// switches after ours; no route leads from one network to the other.
    pub fn append(&mut self, other: SimFabric) {
        let (h0, s0) = (self.hosts() as u32, self.ports.len() as u32);
        let theirs = other.hosts();
        for r in &mut self.routes {
            r.extend(std::iter::repeat_n(u16::MAX, theirs));
        }
        for r in other.routes {
            let mut full = vec![u16::MAX; h0 as usize];
            full.extend(r);
            self.routes.push(full);
        }
        self.host_names.extend(other.host_names);
        self.switch_names.extend(other.switch_names);
        self.host_attach
            .extend(other.host_attach.into_iter().map(|(s, p)| (s + s0, p)));
        self.ports.extend(other.ports.into_iter().map(|ps| {
            ps.into_iter()
                .map(|peer| match peer {
                    Peer::None => Peer::None,
                    Peer::Host(h) => Peer::Host(h + h0),
                    Peer::Switch { switch, port } => Peer::Switch {
                        switch: switch + s0,
                        port,
                    },
                })
                .collect()
        }));
        self.host_gbps.extend(other.host_gbps);
        self.port_gbps.extend(other.port_gbps);
        self.ethernet.extend(other.ethernet);
    }

    /// Per switch: the network it belongs to (its connected component),
    /// numbered from 0 in order of first switch.
    pub fn networks(&self) -> Vec<u32> {
        let n = self.ports.len();
        let mut net = vec![u32::MAX; n];
        let mut next = 0;
        for start in 0..n {
            if net[start] != u32::MAX {
                continue;
            }
            let mut stack = vec![start];
            net[start] = next;
            while let Some(s) = stack.pop() {
                for peer in &self.ports[s] {
                    if let Peer::Switch { switch, .. } = *peer {
                        if net[switch as usize] == u32::MAX {
                            net[switch as usize] = next;
                            stack.push(switch as usize);
                        }
                    }
                }
            }
            next += 1;
        }
        net
    }

    /// Checks that every host reaches every other host through the
    /// routing tables, without loops; names the first broken route.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.hosts();
        if self.routes.len() != self.ports.len() {
            return Err("a routing table per switch is required".into());
        }
        if self.host_gbps.len() != n
            || self.port_gbps.len() != self.ports.len()
            || self.ethernet.len() != self.ports.len()
        {
            return Err(
                "link rates and switch kinds for every host and switch are required".into(),
            );
        }
        for (s, ports) in self.ports.iter().enumerate() {
            for peer in ports {
                if let Peer::Switch { switch, .. } = *peer {
                    if self.ethernet[switch as usize] != self.ethernet[s] {
                        return Err(format!(
                            "switch {} (Ethernet: {}) is cabled to switch {} (Ethernet: {})",
                            self.switch_names[s],
                            self.ethernet[s],
                            self.switch_names[switch as usize],
                            self.ethernet[switch as usize]
                        ));
                    }
                }
            }
        }
        let network = self.networks();
        for (s, r) in self.routes.iter().enumerate() {
            if r.len() != n {
                return Err(format!(
                    "switch {} routes {} of {n} hosts",
                    self.switch_names[s],
                    r.len()
                ));
            }
        }
        for (h, &(s, p)) in self.host_attach.iter().enumerate() {
            if self.ports.get(s as usize).and_then(|ps| ps.get(p as usize))
                != Some(&Peer::Host(h as u32))
            {
                return Err(format!(
                    "host {} is not cabled where it says",
                    self.host_names[h]
                ));
            }
        }
        for src in 0..n {
            for dst in 0..n {
                let (mut s, _) = self.host_attach[src];
                if network[s as usize] != network[self.host_attach[dst].0 as usize] {
                    continue; // Another network: no route wanted.
                }
                let mut hops = 0;
                loop {
                    let port = self.routes[s as usize][dst];
                    match self.ports[s as usize]
                        .get(port as usize)
                        .copied()
                        .unwrap_or(Peer::None)
                    {
                        Peer::Host(h) if h as usize == dst => break,
                        Peer::Host(h) => {
                            return Err(format!(
                                "route {} -> {} ends at {} (switch {} port {port})",
                                self.host_names[src],
                                self.host_names[dst],
                                self.host_names[h as usize],
                                self.switch_names[s as usize]
                            ))
                        }
                        Peer::None => {
                            return Err(format!(
                                "route {} -> {} leaves switch {} by unconnected port {port}",
                                self.host_names[src],
                                self.host_names[dst],
                                self.switch_names[s as usize]
                            ))
                        }
                        Peer::Switch { switch, .. } => s = switch,
                    }
                    hops += 1;
                    if hops > self.ports.len() + 1 {
                        return Err(format!(
                            "route {} -> {} loops",
                            self.host_names[src], self.host_names[dst]
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Builds the simulated fabric from an `evb-fabric` topology, its
/// forwarding tables and a rank order (host node indices; rank r is host
/// `order[r]`).
pub fn from_topology(
    topo: &evb_fabric::Topology,
    lfts: &evb_fabric::Lfts,
    order: &[usize],
    name: &str,
) -> Result<SimFabric, String> {
    let switches = topo.switches();
    let mut switch_index = vec![usize::MAX; topo.nodes.len()];
    for (i, &s) in switches.iter().enumerate() {
        switch_index[s] = i;
    }
    let mut rank_of = vec![usize::MAX; topo.nodes.len()];
    for (r, &h) in order.iter().enumerate() {
        if topo.nodes.get(h).is_none_or(|n| n.is_switch()) {
            return Err(format!("rank {r}: node {h} is not a host"));
        }
        rank_of[h] = r;
    }
    let mut host_attach = Vec::with_capacity(order.len());
    for &h in order {
        let node = &topo.nodes[h];
        let peer = node
            .first_port()
            .and_then(|p| node.ports[p as usize])
            .ok_or_else(|| format!("host {} is not cabled", node.name))?;
        if !topo.nodes[peer.node].is_switch() {
            return Err(format!("host {} is cabled to a host", node.name));
        }
        host_attach.push((switch_index[peer.node] as u32, u16::from(peer.port) - 1));
    }
    let mut ports: Vec<Vec<Peer>> = Vec::with_capacity(switches.len());
    let mut routes = Vec::with_capacity(switches.len());
    for &s in &switches {
        let node = &topo.nodes[s];
        ports.push(
            (1..=node.nports())
                .map(|p| match node.ports[p] {
                    None => Peer::None,
                    Some(r) if topo.nodes[r.node].is_switch() => Peer::Switch {
                        switch: switch_index[r.node] as u32,
                        port: u16::from(r.port) - 1,
                    },
                    // A host outside the rank order takes no part.
                    Some(r) if rank_of[r.node] == usize::MAX => Peer::None,
                    Some(r) => Peer::Host(rank_of[r.node] as u32),
                })
                .collect(),
        );
        routes.push(
            order
                .iter()
                .map(|&h| match lfts.get(s, topo.nodes[h].lid) {
                    // Port 0 is the switch itself; the validation names it.
                    0 | 255 => u16::MAX,
                    p => u16::from(p) - 1,
                })
                .collect(),
        );
    }
    let fabric = SimFabric {
        name: name.to_string(),
        host_names: order.iter().map(|&h| topo.nodes[h].name.clone()).collect(),
        switch_names: switches
            .iter()
            .map(|&s| topo.nodes[s].name.clone())
            .collect(),
        host_attach,
        // The cables' rates where the topology knows them (ibnetdiscover's
        // width and speed, a generator's gbps/uplink_gbps); 0: sim.link_gbps.
        host_gbps: order
            .iter()
            .map(|&h| {
                let node = &topo.nodes[h];
                node.first_port()
                    .and_then(|p| topo.link_gbps(h, p))
                    .unwrap_or(0.0)
            })
            .collect(),
        port_gbps: switches
            .iter()
            .map(|&s| {
                (1..=topo.nodes[s].nports())
                    .map(|p| topo.link_gbps(s, p as u8).unwrap_or(0.0))
                    .collect()
            })
            .collect(),
        ethernet: vec![false; ports.len()],
        ports,
        routes,
        routed: None,
    };
    fabric.validate()?;
    Ok(fabric)
}

/// The output network (`[sim.output]`): the BUs' second NICs (`producers`,
/// named after their nodes) and the consumers, on one Ethernet switch
/// (`topology = "switch"`) or an Ethernet fat tree (`"fat-tree:radix=R"`,
/// any `evb-fabric` fat-tree option but `hosts`, routed by ftree),
/// producers first. Producer and consumer links run at their own rates,
/// links between switches at `uplink_gbps`.
pub fn output_network(
    topology: &str,
    producers: &[String],
    consumers: usize,
    producer_gbps: f64,
    consumer_gbps: f64,
    uplink_gbps: f64,
) -> Result<SimFabric, String> {
    let hosts = producers.len() + consumers;
    let mut f = if topology == "switch" {
        let mut f = SimFabric::single_switch(hosts);
        f.name = format!("ethernet switch:hosts={hosts}");
        f.switch_names = vec!["eth-switch".into()];
        f
    } else if topology.starts_with("fat-tree") {
        use evb_fabric::routing::{route, Engine};
        let spec = format!("{topology},hosts={hosts}");
        let topo = evb_fabric::io::load_topology(&spec)
            .map_err(|e| format!("sim.output.topology `{topology}`: {e:#}"))?;
        let lfts = route(&topo, &Engine::Ftree)
            .map_err(|e| format!("sim.output.topology `{topology}`: {e:#}"))?;
        let order = evb_fabric::optimize::order_from_spec("name", &topo)
            .map_err(|e| format!("sim.output.topology `{topology}`: {e:#}"))?;
        if order.len() != hosts {
            return Err(format!(
                "sim.output.topology `{topology}`: {} hosts for {hosts} producers and consumers",
                order.len()
            ));
        }
        let mut f = from_topology(&topo, &lfts, &order, &format!("ethernet {spec}"))?;
        for (s, ports) in f.ports.iter().enumerate() {
            for (p, peer) in ports.iter().enumerate() {
                if matches!(peer, Peer::Switch { .. }) {
                    f.port_gbps[s][p] = uplink_gbps;
                }
            }
        }
        f.switch_names = f.switch_names.iter().map(|n| format!("eth-{n}")).collect();
        f
    } else {
        return Err(format!(
            "sim.output.topology `{topology}`: `switch` or `fat-tree:radix=R[,...]`"
        ));
    };
    f.ethernet = vec![true; f.ports.len()];
    f.host_names = producers
        .iter()
        .map(|p| format!("{p}/out"))
        .chain((0..consumers).map(|c| format!("consumer{c}")))
        .collect();
    f.host_gbps = (0..hosts)
        .map(|h| {
            if h < producers.len() {
                producer_gbps
            } else {
                consumer_gbps
            }
        })
        .collect();
    Ok(f)
}
