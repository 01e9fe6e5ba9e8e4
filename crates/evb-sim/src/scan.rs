//! Parameter scans: the cartesian product of configuration values, each
//! point simulated independently and in parallel on all cores.

use evb_core::Config;
use rayon::prelude::*;
use serde::Serialize;

use crate::fabric::SimFabric;
use crate::{simulate, SimSummary};

/// One scanned key and its values, from `key=v1,v2,...`.
#[derive(Debug, Clone)]
pub struct Axis {
    pub key: String,
    pub values: Vec<String>,
}

impl Axis {
    pub fn parse(spec: &str) -> Result<Axis, String> {
        let (key, values) = spec
            .split_once('=')
            .ok_or_else(|| format!("--param `{spec}` is not of the form key=v1,v2,..."))?;
        let values: Vec<String> = values
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(format!("--param `{spec}` has no values"));
        }
        Ok(Axis {
            key: key.trim().to_string(),
            values,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScanPoint {
    /// `key=value` for every axis.
    pub params: Vec<(String, String)>,
    pub summary: SimSummary,
    /// The figure the scan ranks by: built Gb/s per node for `eb`,
    /// delivered Gb/s per host otherwise.
    pub figure_gbps: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScanResult {
    pub kind: &'static str,
    pub axes: Vec<String>,
    pub points: Vec<ScanPoint>,
    pub best: usize,
    /// Fraction of points within 2% of the best figure.
    pub fraction_within_2pct_of_best: f64,
    pub wall_seconds: f64,
}

/// Every combination of the axes' values, as override lists.
pub fn combinations(axes: &[Axis]) -> Vec<Vec<(String, String)>> {
    let mut out = vec![Vec::new()];
    for axis in axes {
        let mut next = Vec::with_capacity(out.len() * axis.values.len());
        for prefix in &out {
            for v in &axis.values {
                let mut p = prefix.clone();
                p.push((axis.key.clone(), v.clone()));
                next.push(p);
            }
        }
        out = next;
    }
    out
}

/// Runs every point. `load` turns a point's overrides into a validated
/// configuration (so errors name the offending `--param`).
pub fn run_scan(
    axes: &[Axis],
    load: impl Fn(&[String]) -> Result<Config, String> + Sync,
    fabric: &SimFabric,
    on_point_done: impl Fn() + Sync,
) -> Result<ScanResult, String> {
    let start = std::time::Instant::now();
    let combos = combinations(axes);
    // Validate every point before spending time on any.
    let configs: Vec<Config> = combos
        .iter()
        .map(|params| {
            let ov: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            load(&ov)
        })
        .collect::<Result<_, _>>()?;
    let points: Vec<ScanPoint> = combos
        .into_par_iter()
        .zip(configs.into_par_iter())
        .map(|(params, config)| {
            let r = simulate(&config, fabric.clone(), |_| {})?;
            on_point_done();
            let figure = r
                .summary
                .eb
                .as_ref()
                .map_or(r.summary.throughput_per_host_gbps, |e| {
                    e.built_gbps_per_node
                });
            Ok(ScanPoint {
                params,
                summary: r.summary,
                figure_gbps: figure,
            })
        })
        .collect::<Result<_, String>>()?;
    let best = (0..points.len())
        .max_by(|&a, &b| points[a].figure_gbps.total_cmp(&points[b].figure_gbps))
        .unwrap_or(0);
    let top = points.get(best).map_or(0.0, |p| p.figure_gbps);
    let within = points
        .iter()
        .filter(|p| p.figure_gbps >= 0.98 * top)
        .count();
    Ok(ScanResult {
        kind: "evb-scan",
        axes: axes.iter().map(|a| a.key.clone()).collect(),
        fraction_within_2pct_of_best: within as f64 / points.len().max(1) as f64,
        points,
        best,
        wall_seconds: start.elapsed().as_secs_f64(),
    })
}
