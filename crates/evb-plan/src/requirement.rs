//! The requirement a plan answers, from a TOML file and/or command-line
//! flags (flags win): how many nodes, how much each must build, the
//! events, what to consider buying, the racks, the simulation budget.
//! Errors name the file, the line and the field (`evb_core`'s
//! [`ConfigError`]), never panic.

use std::path::Path;

use evb_core::config::{locate_key, ConfigError};
use serde::{Deserialize, Serialize};

use crate::catalog::{self, Generation, SwitchModel};

/// Where the Event Manager runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmHost {
    /// On a host of its own (one more host port), as configs/lhcb-540.toml.
    Separate,
    /// In node 0, which also builds.
    Node0,
}

/// The rack layout cable lengths follow from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Layout {
    /// Nodes (servers) per rack; a leaf sits in the rack of its first host.
    pub nodes_per_rack: usize,
    /// Distance between neighbouring racks of a row, m.
    pub rack_pitch_m: f64,
    /// Racks per row (rows fill one after the other).
    pub racks_per_row: usize,
    /// Distance between rows, m.
    pub row_pitch_m: f64,
    /// Added to every cable that leaves its rack: up into the tray, down
    /// at the far end, and slack, m.
    pub slack_m: f64,
    /// A cable within one rack, m.
    pub in_rack_m: f64,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            nodes_per_rack: 20,
            rack_pitch_m: 0.6,
            racks_per_row: 12,
            row_pitch_m: 3.0,
            slack_m: 1.5,
            in_rack_m: 2.0,
        }
    }
}

/// How much simulation a plan runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimBudget {
    /// At most this many distinct fabrics simulated (best first).
    pub designs: usize,
    /// And no more than about this much simulated payload in all, Tbit
    /// (hosts x link rate x simulated time; the first is always run).
    pub budget_tbit: f64,
    /// Simulations run at once (0: the machine's cores).
    pub threads: usize,
}

impl Default for SimBudget {
    fn default() -> Self {
        SimBudget {
            designs: 4,
            budget_tbit: 4.5,
            threads: 0,
        }
    }
}

/// The requirement as the file writes it (every field optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequirementFile {
    pub nodes: Option<usize>,
    pub gbps_per_node: Option<f64>,
    pub aggregate_tbps: Option<f64>,
    pub event_bytes: Option<f64>,
    pub event_std_fraction: Option<f64>,
    pub events_per_mep: Option<u32>,
    pub em: Option<EmHost>,
    pub ports_per_node: Option<Vec<usize>>,
    pub generations: Option<Vec<String>>,
    pub blocking: Option<Vec<f64>>,
    pub spare_ports: Option<f64>,
    pub currency: Option<String>,
    pub layout: Option<Layout>,
    pub simulate: Option<SimBudget>,
    #[serde(default)]
    pub generation: Vec<Generation>,
    #[serde(default)]
    pub switch: Vec<SwitchModel>,
}

/// A complete, checked requirement.
#[derive(Debug, Clone, Serialize)]
pub struct Requirement {
    /// Event-builder nodes (each a readout and a builder unit).
    pub nodes: usize,
    /// What each node must build, Gb/s (aggregate / nodes when the
    /// aggregate was given).
    pub gbps_per_node: f64,
    /// Mean event size, bytes, and its spread (standard deviation over
    /// mean) across a node's fragments.
    pub event_bytes: f64,
    pub event_std_fraction: f64,
    /// Events a multi-event packet carries (LHCb: ~1000).
    pub events_per_mep: u32,
    pub em: EmHost,
    pub ports_per_node: Vec<usize>,
    pub generations: Vec<String>,
    /// Leaf blocking factors considered (down-links per up-link: 1, 2...).
    pub blocking: Vec<f64>,
    /// Host ports kept free for growth, as a fraction of the nodes' ports.
    pub spare_ports: f64,
    pub currency: String,
    pub layout: Layout,
    pub simulate: SimBudget,
    /// Every generation and switch model known (defaults and the user's).
    pub generation_table: Vec<Generation>,
    pub switches: Vec<SwitchModel>,
    /// Where the requirement came from (the file, flags).
    pub origin: String,
}

impl Requirement {
    /// The aggregate the nodes must build, Tb/s.
    pub fn aggregate_tbps(&self) -> f64 {
        self.gbps_per_node * self.nodes as f64 / 1000.0
    }

    /// A generation by name.
    pub fn generation(&self, name: &str) -> Option<&Generation> {
        self.generation_table.iter().find(|g| g.name == name)
    }
}

/// Reads a requirement file, with errors that name the file, the line
/// and the field.
pub fn read_file(path: &Path) -> Result<(RequirementFile, String), ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        origin: origin.clone(),
        line: None,
        key: None,
        message: e.to_string(),
    })?;
    let file = toml::from_str::<RequirementFile>(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        ConfigError {
            origin: origin.clone(),
            line,
            key: line.and_then(|l| key_on_line(&text, l)),
            message: e.message().trim().to_string(),
        }
    })?;
    Ok((file, text))
}

/// The key set on 1-based `line` (`a = 1` gives `a`), for messages.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let l = text.lines().nth(line - 1)?.trim();
    let key = l.split('=').next()?.trim().trim_matches(['[', ']']);
    (!key.is_empty()).then(|| key.to_string())
}

/// The command line's part of a requirement (flags win over the file).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub nodes: Option<usize>,
    pub gbps: Option<f64>,
    pub aggregate_tbps: Option<f64>,
    pub event_bytes: Option<f64>,
    pub generations: Option<Vec<String>>,
    pub ports_per_node: Option<Vec<usize>>,
    pub blocking: Option<Vec<f64>>,
    pub spare_ports: Option<f64>,
    pub em: Option<EmHost>,
    pub simulate: Option<usize>,
}

/// The requirement from a file (optional) and flags, checked.
pub fn resolve(file: Option<&Path>, flags: &Flags) -> Result<Requirement, ConfigError> {
    let (f, text, origin) = match file {
        Some(p) => {
            let (f, text) = read_file(p)?;
            (f, text, p.display().to_string())
        }
        None => (RequirementFile::default(), String::new(), "flags".into()),
    };
    let err = |key: &str, message: String| ConfigError {
        origin: origin.clone(),
        line: locate_key(&text, key),
        key: Some(key.into()),
        message,
    };
    let nodes = flags
        .nodes
        .or(f.nodes)
        .ok_or_else(|| err("nodes", "how many nodes? (`nodes = N` or --nodes N)".into()))?;
    let aggregate = flags.aggregate_tbps.or(if flags.gbps.is_some() {
        None
    } else {
        f.aggregate_tbps
    });
    let per_node = flags.gbps.or(if flags.aggregate_tbps.is_some() {
        None
    } else {
        f.gbps_per_node
    });
    let gbps_per_node = match (per_node, aggregate) {
        (Some(_), Some(_)) => {
            return Err(err("aggregate_tbps", "give gbps_per_node or aggregate_tbps, not both".into()))
        }
        (Some(g), None) => g,
        (None, Some(t)) => t * 1000.0 / nodes.max(1) as f64,
        (None, None) => {
            return Err(err("gbps_per_node", "how much must each node build? (`gbps_per_node = G`, `aggregate_tbps = T`, --gbps or --aggregate-tbps)".into()))
        }
    };
    let generation_table =
        catalog::merged(catalog::default_generations(), &f.generation, |g| &g.name);
    let switches = catalog::merged(catalog::default_switches(), &f.switch, |s| &s.name);
    let r = Requirement {
        nodes,
        gbps_per_node,
        event_bytes: flags.event_bytes.or(f.event_bytes).unwrap_or(100_000.0),
        event_std_fraction: f.event_std_fraction.unwrap_or(0.32),
        events_per_mep: f.events_per_mep.unwrap_or(1000),
        em: flags.em.or(f.em).unwrap_or(EmHost::Separate),
        ports_per_node: flags
            .ports_per_node
            .clone()
            .or(f.ports_per_node)
            .unwrap_or(vec![1, 2]),
        generations: flags
            .generations
            .clone()
            .or(f.generations)
            .unwrap_or_else(|| generation_table.iter().map(|g| g.name.clone()).collect()),
        blocking: flags.blocking.clone().or(f.blocking).unwrap_or(vec![1.0]),
        spare_ports: flags.spare_ports.or(f.spare_ports).unwrap_or(0.0),
        currency: f.currency.unwrap_or_else(|| "CHF".into()),
        layout: f.layout.unwrap_or_default(),
        simulate: f.simulate.unwrap_or_default(),
        generation_table,
        switches,
        origin: origin.clone(),
    };
    let mut r = r;
    if let Some(n) = flags.simulate {
        r.simulate.designs = n;
    }
    check(&r, &err)?;
    Ok(r)
}

/// The checks a requirement must pass, each naming its field.
fn check(r: &Requirement, err: &dyn Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
    if !(2..=20_000).contains(&r.nodes) {
        return Err(err(
            "nodes",
            format!("{} nodes: between 2 and 20000", r.nodes),
        ));
    }
    let positive = |key: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(err(key, format!("must be a positive number, not {v}")))
        }
    };
    positive("gbps_per_node", r.gbps_per_node)?;
    positive("event_bytes", r.event_bytes)?;
    if !(0.0..=2.0).contains(&r.event_std_fraction) {
        return Err(err("event_std_fraction", "between 0 and 2".into()));
    }
    if r.events_per_mep == 0 {
        return Err(err("events_per_mep", "at least 1".into()));
    }
    if r.ports_per_node.is_empty() || r.ports_per_node.iter().any(|&p| p != 1 && p != 2) {
        return Err(err("ports_per_node", "a list of 1 and/or 2".into()));
    }
    if r.blocking.is_empty() || r.blocking.iter().any(|&b| !(1.0..=8.0).contains(&b)) {
        return Err(err(
            "blocking",
            "a list of blocking factors between 1 and 8".into(),
        ));
    }
    if !(0.0..1.0).contains(&r.spare_ports) {
        return Err(err(
            "spare_ports",
            "a fraction, 0 <= spare_ports < 1".into(),
        ));
    }
    for g in &r.generations {
        if r.generation(g).is_none() {
            let known: Vec<&str> = r.generation_table.iter().map(|g| g.name.as_str()).collect();
            return Err(err(
                "generations",
                format!(
                    "unknown generation `{g}` (known: {}; add a [[generation]])",
                    known.join(", ")
                ),
            ));
        }
    }
    check_tables(r, err)
}

/// The generation and switch tables: rates and prices that make sense,
/// switches of known generations, directors of a size evb can draw.
fn check_tables(
    r: &Requirement,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    for g in &r.generation_table {
        if evb_fabric::rate::LinkRate::parse_gbps_or_name(&format!("{}", g.gbps)).is_err() {
            return Err(err(
                "generation.gbps",
                format!(
                    "{}: {} Gb/s is not a 4x InfiniBand rate evb simulates (100, 200, 400, 800)",
                    g.name, g.gbps
                ),
            ));
        }
        let prices = [
            g.dac_price,
            g.active_copper_price,
            g.optics_price,
            g.dac_max_m,
            g.optics_max_m,
        ];
        if prices.iter().any(|p| !p.is_finite() || *p < 0.0) || g.optics_max_m < g.dac_max_m {
            return Err(err("generation", format!("{}: lengths and prices must be >= 0, optics reaching at least as far as copper", g.name)));
        }
    }
    for s in &r.switches {
        if r.generation(&s.generation).is_none() {
            return Err(err(
                "switch.generation",
                format!("switch {}: unknown generation `{}`", s.name, s.generation),
            ));
        }
        let bad_size = if s.director {
            evb_fabric::topo::director_chip_radix(s.ports).is_err()
        } else {
            !(4..=254).contains(&s.ports)
        };
        if bad_size {
            return Err(err("switch.ports", format!("switch {}: {} ports (a switch: 4 to 254; a director: c*c/2 for chips of radix c, 648 or 800)", s.name, s.ports)));
        }
        if !(s.price >= 0.0 && s.ports_per_ru > 0.0 && s.power_w >= 0.0) {
            return Err(err(
                "switch",
                format!("switch {}: price and power >= 0, ports_per_ru > 0", s.name),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile_path::Tmp {
        tempfile_path::Tmp::new(text)
    }

    /// A file in the temporary directory, removed on drop.
    mod tempfile_path {
        pub struct Tmp(pub std::path::PathBuf);
        impl Tmp {
            pub fn new(text: &str) -> Tmp {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "evb-plan-req-{}-{}.toml",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&p, text).unwrap();
                Tmp(p)
            }
        }
        impl Drop for Tmp {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn flags_and_aggregate() {
        let f = Flags {
            nodes: Some(163),
            aggregate_tbps: Some(32.0),
            ..Flags::default()
        };
        let r = resolve(None, &f).unwrap();
        assert!((r.gbps_per_node - 196.3).abs() < 0.1, "{}", r.gbps_per_node);
        assert!((r.aggregate_tbps() - 32.0).abs() < 1e-9);
        assert_eq!(r.em, EmHost::Separate);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let t = write("nodes = 540\ngbps_per_node = 100\nblocking = [0.5]\n");
        let e = resolve(Some(&t.0), &Flags::default()).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.key.as_deref(), Some("blocking"), "{e}");
        let t = write("nodes = 540\ngbps_per_node = \"fast\"\n");
        let e = resolve(Some(&t.0), &Flags::default()).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert_eq!(e.key.as_deref(), Some("gbps_per_node"), "{e}");
        let t = write("nodes = 540\n\n[layout]\nracks = 3\n");
        let e = resolve(Some(&t.0), &Flags::default()).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("unknown field `racks`"), "{e}");
        let t = write("nodes = 540\ngbps_per_node = 100\n[[switch]]\nname = \"x\"\ngeneration = \"QDR\"\nports = 36\nprice = 1\nports_per_ru = 36\npower_w = 1\n");
        let e = resolve(Some(&t.0), &Flags::default()).unwrap_err();
        assert!(e.to_string().contains("unknown generation `QDR`"), "{e}");
    }
}
