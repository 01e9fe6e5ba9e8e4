//! What `evb sim` and `evb scan` set up before they simulate: the fabric
//! from its description (`switch:hosts=N`, a generated fat tree or an
//! `ibnetdiscover` file, with forwarding tables read or computed, a rank
//! order and what-if edits), and the configuration sized for that fabric.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use evb_core::config::EmPlacement;
use evb_core::{Config, Layout};

use crate::fabric::SimFabric;

/// The fabric to simulate, as the command line describes it.
#[derive(Debug, Clone)]
pub struct FabricSpec {
    /// `switch:hosts=N`, `fat-tree:radix=R,hosts=N[,...]` or an
    /// `ibnetdiscover` file.
    pub topology: String,
    /// Forwarding tables to use; without them, `routing` computes them.
    pub lfts: Option<PathBuf>,
    /// Routing engine (ftree, minhop, updn, dfsssp, dmodk, random:SEED);
    /// `None`: the default, [`evb_fabric::optimize::DEFAULT_ROUTING`].
    pub routing: Option<String>,
    /// Rank order (ftree, name, lid, leaf, random:SEED, or a file);
    /// `None`: the default ([`evb_fabric::optimize::order_or_default`]).
    pub order: Option<String>,
    /// What-if edits: hosts or switches removed, cables removed
    /// (`NAME:PORT`), cables swapped (`A:PORT,B:PORT`).
    pub remove: Vec<String>,
    pub remove_link: Vec<String>,
    pub swap_cables: Vec<String>,
}

impl FabricSpec {
    /// The simulated fabric this describes.
    pub fn build(&self) -> Result<SimFabric> {
        if let Some(params) = self.topology.strip_prefix("switch:") {
            return self.single_switch(params);
        }
        let topo = self.topology()?.expect("not switch:, which returned above");
        let lfts = match &self.lfts {
            Some(path) => evb_fabric::io::parse_lfts(path, &topo)?,
            None => {
                // As OpenSM does: an engine that cannot route the fabric falls
                // back to minhop, and says why.
                let engine = evb_fabric::routing::Engine::parse(self.routing())?;
                let routed = evb_fabric::routing::route_or_fallback(&topo, &engine, false)?;
                if let Some(why) = &routed.fallback {
                    eprintln!("evb sim: {why}");
                }
                routed.lfts
            }
        };
        let resolved = evb_fabric::optimize::order_or_default(self.order.as_deref(), &topo)?;
        if let Some(note) = &resolved.note {
            eprintln!("evb sim: note: {note}");
        }
        let (order, order_spec) = (resolved.order, resolved.spec);
        let routing = match &self.lfts {
            Some(p) => format!("lfts {}", p.display()),
            None => self.routing().to_string(),
        };
        let name = format!("{} ({routing}, order {order_spec})", self.topology);
        let mut fabric = crate::fabric::from_topology(&topo, &lfts, &order, &name)
            .map_err(anyhow::Error::msg)?;
        fabric.routed = Some(std::sync::Arc::new(crate::schedule::Routed::new(
            topo,
            lfts,
            order,
            &order_spec,
        )));
        Ok(fabric)
    }

    /// The routing engine asked for, or the default.
    pub fn routing(&self) -> &str {
        self.routing
            .as_deref()
            .unwrap_or(evb_fabric::optimize::DEFAULT_ROUTING)
    }

    /// The fabric as `evb-fabric` models it, edits applied; `None` for
    /// `switch:hosts=N`, which is no such fabric. Port counters of a run
    /// ([`crate::output::counters_snapshot`]) are placed on it.
    pub fn topology(&self) -> Result<Option<evb_fabric::Topology>> {
        if self.topology.starts_with("switch:") {
            return Ok(None);
        }
        if !self.topology.starts_with("fat-tree") && !Path::new(&self.topology).exists() {
            bail!(
                "--topology: unknown kind `{}` (switch:hosts=N, fat-tree:radix=R,hosts=N, or an ibnetdiscover file)",
                self.topology
            );
        }
        let mut topo = evb_fabric::io::load_topology(&self.topology)?;
        topo.apply_edits(&self.remove, &self.remove_link, &self.swap_cables)?;
        Ok(Some(topo))
    }

    /// `switch:hosts=N`: one switch, N hosts (edits do not apply).
    fn single_switch(&self, params: &str) -> Result<SimFabric> {
        let mut hosts = None;
        for kv in params.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').with_context(|| {
                format!("--topology {}: `{kv}` is not key=value", self.topology)
            })?;
            match k {
                "hosts" => {
                    hosts = Some(v.parse::<usize>().with_context(|| {
                        format!("--topology {}: hosts needs a whole number", self.topology)
                    })?)
                }
                other => bail!("--topology {}: unknown parameter `{other}`", self.topology),
            }
        }
        let hosts =
            hosts.with_context(|| format!("--topology {}: needs hosts=N", self.topology))?;
        if !(2..=MAX_SWITCH_HOSTS).contains(&hosts) {
            bail!(
                "--topology {}: hosts must be between 2 and {MAX_SWITCH_HOSTS}",
                self.topology
            );
        }
        if !(self.remove.is_empty() && self.remove_link.is_empty() && self.swap_cables.is_empty()) {
            bail!("--remove, --remove-link and --swap-cables edit fat trees and ibnetdiscover fabrics, not switch:hosts=N");
        }
        Ok(SimFabric::single_switch(hosts))
    }
}

/// The most hosts `switch:hosts=N` takes.
pub const MAX_SWITCH_HOSTS: usize = 4096;

/// Hosts of the event-building fabric when the command line names none
/// and the configuration sets no node count: `switch:hosts=16`.
pub const DEFAULT_HOSTS: usize = 16;

/// The fabric's hosts a configuration needs: its endpoints, less the
/// consumers when they are on an output network of their own.
fn hosts_needed(c: &Config) -> usize {
    let layout = Layout::from_config(c);
    let all = usize::from(layout.endpoints);
    if crate::separate_output(c) {
        all - layout.fus()
    } else {
        all
    }
}

/// Whether the file or the overrides set the node count.
fn sets_node_count(path: Option<&Path>, overrides: &[String]) -> bool {
    overrides.iter().any(|o| o.starts_with("nodes.count")) || Config::file_sets(path, "nodes.count")
}

/// The topology when `--topology` is not given: one switch with a host for
/// every endpoint the configuration puts on the fabric (its nodes, a
/// separate EM, consumers on the fabric) when it sets `nodes.count`, else
/// [`DEFAULT_HOSTS`]; and, when sized from the configuration, a note
/// saying so.
pub fn default_topology(
    path: Option<&Path>,
    overrides: &[String],
) -> Result<(String, Option<String>)> {
    if !sets_node_count(path, overrides) {
        return Ok((format!("switch:hosts={DEFAULT_HOSTS}"), None));
    }
    let mut probe = overrides.to_vec();
    probe.push("event_builder.schedule_file=\"\"".into());
    let config = Config::load(path, &probe)?;
    let need = hosts_needed(&config);
    if need > MAX_SWITCH_HOSTS {
        bail!(
            "nodes.count = {}{} needs {need} hosts, more than one switch has (at most {MAX_SWITCH_HOSTS}): give a --topology",
            config.nodes.count,
            extras(&config)
        );
    }
    let hosts = need.max(2);
    let spec = format!("switch:hosts={hosts}");
    Ok((
        spec.clone(),
        Some(format!(
            "no --topology: {spec}, one switch with a host for each of the configuration's {need} endpoints on the fabric (nodes.count = {}{})",
            config.nodes.count,
            extras(&config)
        )),
    ))
}

/// The configuration of a simulation on `fabric`, and notes for the user
/// on how it was sized. The file and the overrides decide the node count
/// when either sets `nodes.count`: their endpoints (nodes, a separate EM,
/// consumers on the fabric) may not outnumber the fabric's hosts, and the
/// hosts they leave over stay idle (the rank order, or a hostfile, says
/// which take part: the first ones). Otherwise there is one event-builder
/// node per host, less a separate EM's host and the consumers' (with
/// `sim.output.network = "fabric"` they take the last hosts).
pub fn sized_config(
    path: Option<&Path>,
    overrides: &[String],
    fabric: &SimFabric,
) -> Result<(Config, Vec<String>)> {
    let mut overrides = overrides.to_vec();
    let by_set = overrides.iter().any(|o| o.starts_with("nodes.count"));
    let by_file = Config::file_sets(path, "nodes.count");
    let on_fabric = hosts_needed;
    let mut notes = Vec::new();
    if by_set || by_file {
        // Without the schedule file, which is checked against the count.
        let mut probe = overrides.clone();
        probe.push("event_builder.schedule_file=\"\"".into());
        let config = Config::load(path, &probe)?;
        let (need, hosts) = (on_fabric(&config), fabric.hosts());
        let whose = if by_set {
            "--set nodes.count".to_string()
        } else {
            path.map_or(String::new(), |p| p.display().to_string())
        };
        if need > hosts {
            bail!(
                "{whose}: nodes.count = {}{} needs {need} hosts of the fabric, but it has {hosts} \
                 (set nodes.count = {} or fewer{}, or give a --topology of {need} hosts or more)",
                config.nodes.count,
                extras(&config),
                config.nodes.count as usize - (need - hosts),
                if config.nodes.em == EmPlacement::Separate {
                    ", or nodes.em = \"node0\""
                } else {
                    ""
                }
            );
        }
        if need < hosts {
            notes.push(format!(
                "{whose}: {need} of the fabric's {hosts} hosts take part, the first in the rank order; {} stay idle",
                hosts - need
            ));
        }
    } else {
        let probe = vec![
            format!("nodes.count={}", fabric.hosts()),
            "event_builder.schedule_file=\"\"".into(),
        ];
        let first = Config::load(path, &[probe, overrides.clone()].concat())?;
        let consumers = if crate::separate_output(&first) {
            0
        } else {
            usize::from(first.output.consumers)
        };
        let em_host = usize::from(first.nodes.em == EmPlacement::Separate);
        if consumers + em_host + 1 > fabric.hosts() {
            bail!(
                "output.consumers = {consumers} leaves no host of the fabric ({} hosts) for the event builder",
                fabric.hosts()
            );
        }
        let count = fabric.hosts() - consumers - em_host;
        overrides.insert(0, format!("nodes.count={count}"));
        notes.push(format!(
            "nodes.count = {count}: one node a host of the fabric{}",
            extras(&first)
                .replace(" and", ", and")
                .replacen(" plus", ", less the hosts of", 1)
        ));
    }
    Ok((Config::load(path, &overrides)?, notes))
}

/// What a configuration adds to its nodes on the fabric, for messages.
fn extras(c: &Config) -> String {
    let mut parts = Vec::new();
    if c.nodes.em == EmPlacement::Separate {
        parts.push("a separate EM".to_string());
    }
    if !crate::separate_output(c) && c.output.consumers > 0 {
        parts.push(format!("{} consumers", c.output.consumers));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" plus {}", parts.join(" and "))
    }
}
