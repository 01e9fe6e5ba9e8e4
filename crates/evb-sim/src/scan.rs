//! Parameter scans: the cartesian product of configuration values, each
//! point simulated independently and in parallel on all cores.

use evb_core::Config;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanPoint {
    /// Position in the full cartesian product (stable across shards).
    pub index: usize,
    /// `key=value` for every axis.
    pub params: Vec<(String, String)>,
    pub summary: SimSummary,
    /// The figure the scan ranks by: built Gb/s per node for `eb`,
    /// delivered Gb/s per host otherwise.
    pub figure_gbps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanResult {
    pub kind: String,
    pub axes: Vec<String>,
    /// Points in the whole scan (all shards).
    pub total_points: usize,
    /// `[i, n]`: this result holds shard i of n (points with index mod n = i).
    pub shard: Option<[usize; 2]>,
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

/// Runs every point. `load` turns a point's `(key, value)` pairs into a
/// validated configuration and the fabric to run it on (so errors name the
/// offending `--param`, and axes such as the rank order can change the fabric).
pub fn run_scan(
    axes: &[Axis],
    load: impl Fn(&[(String, String)]) -> Result<(Config, SimFabric), String> + Sync,
    shard: Option<[usize; 2]>,
    on_point_done: impl Fn() + Sync,
) -> Result<ScanResult, String> {
    let start = std::time::Instant::now();
    let all = combinations(axes);
    let total_points = all.len();
    if let Some([i, n]) = shard {
        if n == 0 || i >= n {
            return Err(format!("--shard {i}/{n}: needs 0 <= i < n"));
        }
    }
    let (indices, combos): (Vec<usize>, Vec<_>) = all
        .into_iter()
        .enumerate()
        .filter(|(k, _)| shard.is_none_or(|[i, n]| k % n == i))
        .unzip();
    // Validate every point before spending time on any.
    let configs: Vec<(Config, SimFabric)> = combos
        .iter()
        .map(|params| load(params))
        .collect::<Result<_, _>>()?;
    let points: Vec<ScanPoint> = combos
        .into_par_iter()
        .zip(configs.into_par_iter())
        .zip(indices.into_par_iter())
        .map(|((params, (config, fabric)), index)| {
            let r = simulate(&config, fabric, |_| {})?;
            on_point_done();
            let figure = r
                .summary
                .eb
                .as_ref()
                .map_or(r.summary.throughput_per_host_gbps, |e| {
                    e.built_gbps_per_node
                });
            Ok(ScanPoint {
                index,
                params,
                summary: r.summary,
                figure_gbps: figure,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(summarise(
        axes.iter().map(|a| a.key.clone()).collect(),
        total_points,
        shard,
        points,
        start.elapsed().as_secs_f64(),
    ))
}

fn summarise(
    axes: Vec<String>,
    total_points: usize,
    shard: Option<[usize; 2]>,
    mut points: Vec<ScanPoint>,
    wall_seconds: f64,
) -> ScanResult {
    points.sort_by_key(|p| p.index);
    let best = (0..points.len())
        .max_by(|&a, &b| points[a].figure_gbps.total_cmp(&points[b].figure_gbps))
        .unwrap_or(0);
    let top = points.get(best).map_or(0.0, |p| p.figure_gbps);
    let within = points
        .iter()
        .filter(|p| p.figure_gbps >= 0.98 * top)
        .count();
    ScanResult {
        kind: "evb-scan".into(),
        axes,
        total_points,
        shard,
        fraction_within_2pct_of_best: within as f64 / points.len().max(1) as f64,
        points,
        best,
        wall_seconds,
    }
}

/// Joins the shards of one scan; every point must be there exactly once.
pub fn merge(shards: Vec<ScanResult>) -> Result<ScanResult, String> {
    let first = shards.first().ok_or("nothing to merge")?;
    let (axes, total) = (first.axes.clone(), first.total_points);
    let mut points = Vec::with_capacity(total);
    let mut wall = 0.0f64;
    for (k, s) in shards.into_iter().enumerate() {
        if s.kind != "evb-scan" {
            return Err(format!(
                "input {k}: not an evb scan result (kind {})",
                s.kind
            ));
        }
        if s.axes != axes || s.total_points != total {
            return Err(format!(
                "input {k}: another scan (axes {:?}, {} points; expected {axes:?}, {total})",
                s.axes, s.total_points
            ));
        }
        wall = wall.max(s.wall_seconds);
        points.extend(s.points);
    }
    let mut seen = vec![false; total];
    for p in &points {
        match seen.get_mut(p.index) {
            Some(false) => seen[p.index] = true,
            Some(true) => return Err(format!("point {} appears twice", p.index)),
            None => return Err(format!("point {} is outside the scan of {total}", p.index)),
        }
    }
    if let Some(missing) = seen.iter().position(|&s| !s) {
        let count = seen.iter().filter(|&&s| !s).count();
        return Err(format!(
            "{count} points missing (first: point {missing}): a shard is absent"
        ));
    }
    Ok(summarise(axes, total, None, points, wall))
}

/// Figures over the first two axes of a scan.
pub struct HeatGrid {
    /// Values of the second axis (columns).
    pub xs: Vec<String>,
    /// Values of the first axis (rows).
    pub ys: Vec<String>,
    /// `rows[y][x]`: the best figure over the other axes.
    pub rows: Vec<Vec<f64>>,
}

/// The heat-map grid of a scan with at least two axes.
pub fn heat_grid(result: &ScanResult) -> Option<HeatGrid> {
    if result.axes.len() < 2 {
        return None;
    }
    let mut xs: Vec<String> = Vec::new();
    let mut ys: Vec<String> = Vec::new();
    for p in &result.points {
        if !xs.contains(&p.params[1].1) {
            xs.push(p.params[1].1.clone());
        }
        if !ys.contains(&p.params[0].1) {
            ys.push(p.params[0].1.clone());
        }
    }
    let mut rows = vec![vec![0.0f64; xs.len()]; ys.len()];
    for p in &result.points {
        let x = xs.iter().position(|v| *v == p.params[1].1)?;
        let y = ys.iter().position(|v| *v == p.params[0].1)?;
        rows[y][x] = rows[y][x].max(p.figure_gbps);
    }
    Some(HeatGrid { xs, ys, rows })
}
