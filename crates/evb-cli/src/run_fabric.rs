//! `evb run --fabric` and `evb node --fabric`: the slotted barrel on the
//! cluster's fabric, as `evb sim` runs it on a simulated one.
//!
//! Given the fabric (an `ibnetdiscover` file or a generator), its tables
//! (`--lfts`, or a routing engine) and the rank order the nodes were
//! launched in, the command computes the schedule `evb fabric schedule`
//! would write for the builder's nodes and sizes the slots for the slowest
//! path between two of them, then hands both to the nodes as
//! configuration (`event_builder.schedule_file`, `event_builder.slot_us`).
//! The computation is deterministic (a seeded search bounded in moves, not
//! time), so every `evb node` of a cluster derives the same schedule.
//! Nothing is done when the configuration names a schedule file, asks for
//! the plain barrel (`slot_schedule = "barrel"`) or another schedule.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use evb_core::config::{LocalTraffic, Schedule, SlotSchedule};
use evb_core::{Config, Layout};
use evb_fabric::setup::FabricSource;

/// Where the cluster's fabric comes from.
#[derive(Debug, Args, Default)]
pub struct FabricRunArgs {
    /// The cluster's fabric (ibnetdiscover output, or a generator such as
    /// fat-tree:radix=36,hosts=540): the slotted barrel takes the schedule `evb fabric
    /// schedule` would write for the nodes' ranks and slots sized for the slowest path
    /// between two nodes (unless the configuration names a schedule_file, a slot_us or
    /// slot_schedule = "barrel")
    #[arg(long, value_name = "TOPOLOGY")]
    pub fabric: Option<String>,
    /// With --fabric: its forwarding tables (opensm-lfts.dump, dump_lfts or ibroute output)
    #[arg(long, requires = "fabric", value_name = "FILE")]
    pub fabric_lfts: Option<PathBuf>,
    // With --fabric and no --fabric-lfts: the routing engine.
    #[arg(long, requires = "fabric", value_name = "ROUTING", help = crate::vocab::ROUTING_HELP)]
    pub fabric_routing: Option<String>,
    // With --fabric: the order the nodes' ranks run in.
    #[arg(long, requires = "fabric", value_name = "ORDER", help = crate::vocab::ORDER_HELP)]
    pub fabric_order: Option<String>,
    /// With --fabric: GUID-to-host-name map for the fabric file
    #[arg(long, requires = "fabric", value_name = "FILE")]
    pub fabric_names: Option<PathBuf>,
}

/// What `--fabric` decided: configuration overrides for the nodes, a line
/// for the user, and the schedule file it wrote (removed with this value).
#[derive(Debug, Default)]
pub struct FabricPlan {
    pub overrides: Vec<String>,
    pub summary: Option<String>,
    written: Option<PathBuf>,
}

impl Drop for FabricPlan {
    fn drop(&mut self) {
        if let Some(p) = &self.written {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl FabricPlan {
    /// Writes `s` where the nodes read it and points the configuration at
    /// it; returns what to tell the user.
    fn write_schedule(
        &mut self,
        s: &evb_fabric::schedule::SlotSchedule,
        header: &str,
        shift: &str,
    ) -> Result<String> {
        let path =
            std::env::temp_dir().join(format!("evb-fabric-schedule-{}.txt", std::process::id()));
        std::fs::write(&path, s.to_text(header))
            .with_context(|| format!("writing {}", path.display()))?;
        let quoted = toml::Value::String(path.display().to_string()).to_string();
        self.overrides
            .push(format!("event_builder.schedule_file={quoted}"));
        self.written = Some(path);
        Ok(format!(
            "the fabric's schedule: {} slots a rotation (no schedule on these routes has fewer than {}), from {shift}",
            s.slots.len(),
            s.lower_bound
        ))
    }
}

impl FabricRunArgs {
    /// The overrides that put the fabric's schedule and slot length into
    /// the configuration `config`/`overrides` describe (`nodes`: `--nodes`).
    pub fn plan(
        &self,
        config: Option<&Path>,
        overrides: &[String],
        nodes: Option<u16>,
    ) -> Result<FabricPlan> {
        let Some(spec) = &self.fabric else {
            return Ok(FabricPlan::default());
        };
        let mut all = overrides.to_vec();
        if let Some(n) = nodes {
            all.push(format!("nodes.count={n}"));
        }
        let mut cfg = Config::load(config, &all)?;
        let eb = &cfg.event_builder;
        if eb.schedule != Schedule::Slotted {
            return Ok(FabricPlan::default());
        }
        let wants_schedule =
            eb.schedule_file.is_empty() && eb.slot_schedule == SlotSchedule::Fabric;
        let wants_slot = eb.slot_us == 0.0;
        if !wants_schedule && !wants_slot {
            return Ok(FabricPlan::default());
        }
        let loaded = FabricSource {
            topology: spec.clone(),
            names: self.fabric_names.clone(),
            lfts: self.fabric_lfts.clone(),
            routing: self.fabric_routing.clone(),
            ..FabricSource::default()
        }
        .load()
        .with_context(|| format!("--fabric {spec}"))?;
        for note in &loaded.notes {
            eprintln!("{note}");
        }
        let (topo, lfts) = (&loaded.topo, &loaded.lfts);
        let resolved = evb_fabric::optimize::order_or_default(self.fabric_order.as_deref(), topo)
            .with_context(|| {
            format!(
                "--fabric-order {}",
                self.fabric_order.as_deref().unwrap_or("(default)")
            )
        })?;
        if let Some(note) = &resolved.note {
            eprintln!("note: --fabric {spec}: {note}");
        }
        let (mut order, order_spec) = (resolved.order, resolved.spec);
        let ranks = usize::from(Layout::from_config(&cfg).nodes);
        if order.len() < ranks {
            bail!(
                "--fabric {spec}: the order {} has {} hosts, the event builder {ranks} nodes",
                order_spec,
                order.len()
            );
        }
        order.truncate(ranks);
        let mut plan = FabricPlan::default();
        let mut said = Vec::new();
        let local = cfg.event_builder.local == LocalTraffic::Nic;
        // The schedule decides the slots' rate where the fabric's paths run
        // at several (a rate-aware schedule may size them for a faster one).
        let rated =
            evb_fabric::rated::choose_slot_rate(topo, lfts, &order, &order_spec, local, false)?;
        let slot_gbps = if wants_schedule {
            rated.slot_gbps
        } else {
            rated.slowest_gbps
        };
        if wants_slot {
            if let Some(gbps) = slot_gbps {
                cfg.slot_gbps = Some(gbps);
                let slot_us = cfg.slot_ns() as f64 / 1e3;
                plan.overrides
                    .push(format!("event_builder.slot_us={slot_us}"));
                said.push(format!(
                    "slots of {slot_us:.2} us sized for {gbps} Gb/s (the slowest path between two nodes: {} Gb/s)",
                    rated.slowest_gbps.unwrap_or(gbps)
                ));
            }
        }
        if wants_schedule {
            let chosen = rated.chosen;
            let s = chosen.aware;
            if s.slots == evb_fabric::schedule::SlotSchedule::plain(order.len(), local).slots {
                said.push(format!(
                    "the plain barrel ({}: no conflict on these routes)",
                    chosen.shift
                ));
            } else {
                let header = format!(
                    "evb slot schedule for {ranks} ranks of {spec} ({}), order {}",
                    loaded.what, order_spec
                );
                said.push(plan.write_schedule(&s, &header, &chosen.shift)?);
            }
        }
        plan.summary = Some(format!(
            "slotted barrel on {spec} ({}, order {}): {}",
            loaded.what,
            order_spec,
            said.join("; ")
        ));
        Ok(plan)
    }
}
