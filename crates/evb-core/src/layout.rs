//! Who is who in a run: which endpoints host a Readout Unit, a Builder Unit,
//! the Event Manager or a Filter Unit consumer, and their indices.
//!
//! Endpoints are numbered nodes first, then a separate EM, then the
//! `output.consumers` Filter Units, so adding consumers renumbers nothing.

use crate::config::{Config, EmPlacement};
use crate::wire::NodeId;

/// The roles of every endpoint of a run, derived from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Nodes hosting an RU and/or a BU (endpoints `0..nodes`).
    pub nodes: u16,
    /// All endpoints: the nodes, plus one for a separate EM, plus the
    /// Filter Units.
    pub endpoints: u16,
    /// Endpoint that runs the Event Manager.
    pub em: NodeId,
    /// Source index of each endpoint's RU.
    pub ru_of: Vec<Option<u16>>,
    /// BU index of each endpoint's BU.
    pub bu_of: Vec<Option<u16>>,
    /// Endpoint of each RU (by source index).
    pub ru_nodes: Vec<NodeId>,
    /// Endpoint of each BU (by BU index).
    pub bu_nodes: Vec<NodeId>,
    /// FU (consumer) index of each endpoint's Filter Unit.
    pub fu_of: Vec<Option<u16>>,
    /// Endpoint of each FU (by FU index).
    pub fu_nodes: Vec<NodeId>,
}

impl Layout {
    pub fn from_config(config: &Config) -> Layout {
        let n = config.nodes.count;
        let core = match config.nodes.em {
            EmPlacement::Node0 => n,
            EmPlacement::Separate => n + 1,
        };
        let endpoints = core + config.output.consumers;
        let mut layout = Layout {
            nodes: n,
            endpoints,
            em: if core > n { n } else { 0 },
            ru_of: vec![None; endpoints as usize],
            bu_of: vec![None; endpoints as usize],
            ru_nodes: Vec::new(),
            bu_nodes: Vec::new(),
            fu_of: vec![None; endpoints as usize],
            fu_nodes: (core..endpoints).collect(),
        };
        for (k, &fu) in layout.fu_nodes.iter().enumerate() {
            layout.fu_of[fu as usize] = Some(k as u16);
        }
        for node in 0..n {
            if !config.nodes.bu_only.contains(&node) {
                layout.ru_of[node as usize] = Some(layout.ru_nodes.len() as u16);
                layout.ru_nodes.push(node);
            }
            if !config.nodes.ru_only.contains(&node) {
                layout.bu_of[node as usize] = Some(layout.bu_nodes.len() as u16);
                layout.bu_nodes.push(node);
            }
        }
        layout
    }

    pub fn rus(&self) -> usize {
        self.ru_nodes.len()
    }

    pub fn bus(&self) -> usize {
        self.bu_nodes.len()
    }

    pub fn fus(&self) -> usize {
        self.fu_nodes.len()
    }

    /// Short role name of an endpoint, for logs and reports.
    pub fn role(&self, node: NodeId) -> String {
        let i = node as usize;
        let mut parts = Vec::new();
        if self.ru_of.get(i).copied().flatten().is_some() {
            parts.push("RU");
        }
        if self.bu_of.get(i).copied().flatten().is_some() {
            parts.push("BU");
        }
        if node == self.em {
            parts.push("EM");
        }
        if self.fu_of.get(i).copied().flatten().is_some() {
            parts.push("FU");
        }
        parts.join("+")
    }
}
