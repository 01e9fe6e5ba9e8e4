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
