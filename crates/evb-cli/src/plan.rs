//! `evb plan`: from a requirement to ranked fabric designs (issue 33). The
//! work is evb-plan's; this parses the flags and writes what was asked.
//! See docs/plan.md.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use evb_plan::requirement::{self, EmHost, Flags};

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Requirement file (TOML, docs/plan.md); flags override its fields.
    #[arg(long, short)]
    requirement: Option<PathBuf>,
    /// Event-builder nodes.
    #[arg(long)]
    nodes: Option<usize>,
    /// Gb/s each node must build.
    #[arg(long, conflicts_with = "aggregate_tbps")]
    gbps: Option<f64>,
    /// Tb/s all nodes together must build (instead of --gbps).
    #[arg(long)]
    aggregate_tbps: Option<f64>,
    /// Mean event size, bytes (default 100000).
    #[arg(long)]
    event_bytes: Option<f64>,
    /// Link generations to consider, e.g. EDR,HDR,400GbE (default all known).
    #[arg(long, value_delimiter = ',')]
    generations: Option<Vec<String>>,
    /// Ports per node to consider: 1, 2 or 1,2 (default 1,2; two only where one is short).
    #[arg(long, value_delimiter = ',')]
    ports_per_node: Option<Vec<usize>>,
    /// Leaf blocking factors to consider, e.g. 1,2 (default 1: non-blocking).
    #[arg(long, value_delimiter = ',')]
    blocking: Option<Vec<f64>>,
    /// Host ports kept free for growth, a fraction of the nodes' ports.
    #[arg(long)]
    spare_ports: Option<f64>,
    /// Where the Event Manager runs: separate (a host of its own, the default) or node0.
    #[arg(long)]
    em: Option<String>,
    /// Simulate at most this many distinct fabrics, best first (0: estimates only).
    #[arg(long)]
    simulate: Option<usize>,
    /// Write the plan as JSON (`designs[]`; `evb report` reads it).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the Pareto plot of cost against predicted rate: PREFIX.svg and PREFIX.png.
    #[arg(long, value_name = "PREFIX")]
    plot: Option<PathBuf>,
    /// Write the files of design --design (topology, ibsim net, hostfile,
    /// LFTs, topology.conf, slot schedule, evb.toml) into DIR.
    #[arg(long, value_name = "DIR")]
    write: Option<PathBuf>,
    /// The design --write writes, by its rank in the table.
    #[arg(long, default_value_t = 1, requires = "write")]
    design: usize,
}

/// Runs `evb plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    let em = match a.em.as_deref() {
        None => None,
        Some("separate") => Some(EmHost::Separate),
        Some("node0") => Some(EmHost::Node0),
        Some(other) => bail!("--em: `{other}` is neither separate nor node0"),
    };
    let flags = Flags {
        nodes: a.nodes,
        gbps: a.gbps,
        aggregate_tbps: a.aggregate_tbps,
        event_bytes: a.event_bytes,
        generations: a.generations,
        ports_per_node: a.ports_per_node,
        blocking: a.blocking,
        spare_ports: a.spare_ports,
        em,
        simulate: a.simulate,
    };
    let req = requirement::resolve(a.requirement.as_deref(), &flags)?;
    let plan = evb_plan::plan(&req)?;
    print!("{}", evb_plan::output::text(&plan));
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&evb_plan::output::to_json(&plan))?;
        evb_fabric::io::write_text(p, &text)?;
        println!("wrote {}", p.display());
    }
    if let Some(prefix) = &a.plot {
        for p in evb_plan::output::plot(&plan, prefix)? {
            println!("wrote {}", p.display());
        }
    }
    if let Some(dir) = &a.write {
        let files = evb_plan::write::write_design(&plan, a.design, dir)?;
        println!(
            "design #{} written to {}: {}",
            a.design,
            dir.display(),
            files
                .iter()
                .filter_map(|f| f.file_name()?.to_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
