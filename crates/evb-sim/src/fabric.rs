//! The fabric as the simulator sees it: switches with numbered ports,
//! hosts attached to switch ports, and per switch a forwarding table from
//! destination host to output port. Built from `evb-fabric` topologies and
//! LFTs, or by the small generators here.

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
    /// Per switch, per destination host: the output port.
    pub routes: Vec<Vec<u16>>,
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
        }
    }

    /// Checks that every host reaches every other host through the
    /// routing tables, without loops; names the first broken route.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.hosts();
        if self.routes.len() != self.ports.len() {
            return Err("a routing table per switch is required".into());
        }
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
    let mut ports = Vec::with_capacity(switches.len());
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
        ports,
        routes,
    };
    fabric.validate()?;
    Ok(fabric)
}
