//! The files a chosen design needs, written with the writers `evb fabric
//! export` and `evb fabric schedule` use: the topology as `ibnetdiscover`
//! prints it, the ibsim net file, the hostfile in the ftree CA order (the
//! Event Manager's host last), OpenSM's LFT dump of evb's ftree tables,
//! Slurm's topology.conf, the slot schedule and an `evb` configuration
//! that uses it. The configuration is read back with evb-core's loader,
//! schedule included, before the files are reported written.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use evb_fabric::io;

use crate::evaluate;
use crate::output::commands;
use crate::plan::{Design, Plan};

/// Writes design `rank` (1-based) of `plan` into `dir`; returns the files.
pub fn write_design(plan: &Plan, rank: usize, dir: &Path) -> Result<Vec<PathBuf>> {
    let d = plan.designs.get(rank.wrapping_sub(1)).ok_or_else(|| {
        anyhow!(
            "--design {rank}: the plan has designs 1 to {}",
            plan.designs.len()
        )
    })?;
    let c = &d.candidate;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let evaluate::Routed {
        topo, lfts, order, ..
    } = evaluate::build(c)?;
    let n = c.endpoints;
    let chosen = evb_fabric::schedule::choose(&topo, &lfts, &order[..n], "ftree", false, false)?;
    // The schedule evb sim computes: the conflict-aware one, after its
    // local search (the plan's count for a design it did not simulate is
    // the count before the search: as many or more).
    let table = &chosen.aware;
    assert!(
        table.slots.len() <= d.analysis.slots,
        "the search only shortens a schedule"
    );
    let header = format!(
        "evb plan, design #{rank} ({}): {n} ranks, {} slots (bound {}); {}\nranks in the hostfile's order (ftree); event_builder.local = \"memory\"",
        c.name(),
        table.slots.len(),
        table.lower_bound,
        chosen.shift
    );
    let mut files = Vec::new();
    let mut put = |name: &str, text: String| -> Result<()> {
        let p = dir.join(name);
        io::write_text(&p, &text)?;
        files.push(p);
        Ok(())
    };
    put("topology.ibnd", io::write_ibnetdiscover(&topo))?;
    put("ibsim.net", io::write_ibsim_net(&topo))?;
    put("hostfile", io::write_hostfile(&topo, &order))?;
    put("ca-order.dump", io::write_ca_order(&topo, &order))?;
    put("opensm-lfts.dump", io::write_opensm_lfts(&topo, &lfts))?;
    put("topology.conf", io::write_slurm_topology(&topo))?;
    put("schedule.slots", table.to_text(&header))?;
    put("evb.toml", config_text(plan, rank, d))?;
    put("README", readme(plan, rank, d))?;
    evb_core::Config::load(Some(&dir.join("evb.toml")), &[])
        .map_err(|e| anyhow!("the written configuration does not load: {e}"))?;
    Ok(files)
}

/// `section.key=value` overrides as a TOML document, by section.
fn toml_of(overrides: &[String]) -> String {
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for o in overrides {
        let (key, value) = o.split_once('=').expect("overrides are key=value");
        let (section, key) = key.split_once('.').expect("overrides are section.key");
        let line = format!("{key} = {value}");
        match sections.iter_mut().find(|(s, _)| s == section) {
            Some((_, lines)) => lines.push(line),
            None => sections.push((section.to_string(), vec![line])),
        }
    }
    let mut out = String::new();
    for (s, lines) in sections {
        let _ = writeln!(out, "\n[{s}]\n{}", lines.join("\n"));
    }
    out
}

/// The design's `evb` configuration, with its slot schedule.
fn config_text(plan: &Plan, rank: usize, d: &Design) -> String {
    let req = &plan.requirement;
    let c = &d.candidate;
    let duration = d.sim.as_ref().map_or(d.estimate.sim_us, |s| s.simulated_us);
    let mut o = evaluate::overrides(req, c, Some(duration));
    o.push("event_builder.schedule_file=\"schedule.slots\"".into());
    o.push("event_builder.local=\"memory\"".into());
    format!(
        "# evb plan, design #{rank}: {}\n# fabric: {}\n# ranks: the hostfile's order (evb sim --order hostfile; mpirun/srun with it)\n#   evb sim --config evb.toml --topology topology.ibnd --order hostfile\n{}",
        c.name(),
        c.spec,
        toml_of(&o)
    )
}

/// What the directory holds and how to use it.
fn readme(plan: &Plan, rank: usize, d: &Design) -> String {
    let req = &plan.requirement;
    let mut out = format!(
        "evb plan, design #{rank}: {}\n{} nodes, {} hosts; {} switches, {:.0} {} ({})\n\n",
        d.candidate.name(),
        req.nodes,
        d.candidate.hosts,
        d.bill.switch_count(),
        d.bill.total,
        req.currency,
        "example prices unless the requirement gave its own"
    );
    out.push_str(
        "topology.ibnd      the fabric as ibnetdiscover prints it (evb fabric ... --topology topology.ibnd)\n\
         ibsim.net          the same for ibsim (ibsim -s topology: OpenSM can route it)\n\
         hostfile           hosts in OpenSM's ftree CA order: rank i is line i (the EM's host last)\n\
         ca-order.dump      the same as opensm-ftree-ca-order.dump\n\
         opensm-lfts.dump   evb's ftree tables (OpenSM's, entry for entry)\n\
         topology.conf      Slurm's topology/tree\n\
         schedule.slots     the slot schedule (event_builder.schedule_file)\n\
         evb.toml           the event builder's configuration, with the schedule\n\n\
         the plan's numbers, reproduced:\n",
    );
    for c in commands(req, d) {
        let _ = writeln!(out, "  {c}");
    }
    out
}
