//! What the simulator predicts for a fabric `evb fabric diagnose`
//! proposes (a remedy's topology, tables, rank order and slot schedule):
//! the event builder's built Gb/s per node (per host for synthetic
//! traffic) under a configuration, as `evb sim` would report it.

use std::path::Path;

use anyhow::{Context, Result};
use evb_fabric::diagnose::remedies::Variant;

/// Simulates `v` with the configuration `config` (and `overrides`; for
/// `duration_us` if given, else the configuration's `sim.duration_us`),
/// sized for the fabric as `evb sim` sizes it. A slot schedule is written
/// to `schedule_file` and used.
pub fn predict(
    v: &Variant,
    config: Option<&Path>,
    overrides: &[String],
    duration_us: Option<f64>,
    schedule_file: &Path,
) -> Result<f64> {
    let fabric = crate::fabric::from_topology(&v.topo, &v.lfts, &v.order, &v.routing)
        .map_err(anyhow::Error::msg)?;
    let mut overrides = overrides.to_vec();
    if let Some(d) = duration_us {
        overrides.push(format!("sim.duration_us={d}"));
    }
    if let Some(s) = &v.schedule {
        let text = s.to_text(&format!(
            "slot schedule of a remedy: {} ranks, {} slots",
            s.ranks,
            s.slots.len()
        ));
        std::fs::write(schedule_file, text)
            .with_context(|| format!("writing {}", schedule_file.display()))?;
        overrides.push("event_builder.schedule=\"slotted\"".into());
        overrides.push(format!(
            "event_builder.schedule_file=\"{}\"",
            schedule_file.display()
        ));
    }
    let (config, _notes) = crate::setup::sized_config(config, &overrides, &fabric)?;
    let result = crate::simulate(&config, fabric, |_| {}).map_err(anyhow::Error::msg)?;
    Ok(match &result.summary.eb {
        Some(eb) => eb.built_gbps_per_node,
        None => result.summary.throughput_per_host_gbps,
    })
}
