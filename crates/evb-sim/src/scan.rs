//! Parameter scans: the cartesian product of configuration values, each
//! point simulated independently and in parallel (on every core, or on
//! `jobs` threads).
//!
//! With replications, every point runs with R seeds (`run.seed`,
//! `run.seed + 1`, ...) and is ranked by the mean of its R figures, with a
//! Student-t 95 % interval over them ([`crate::stats::mean_ci`]): one run's
//! figure moves by a few percent from seed to seed, more than many points
//! differ, so a single run cannot rank them.

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
    /// The first replication's summary.
    pub summary: SimSummary,
    /// The figure the scan ranks by ([`Figure`]): the mean over the
    /// replications.
    pub figure_gbps: f64,
    /// Half width of its 95 % interval over the replications (`None` with
    /// one replication).
    #[serde(default)]
    pub ci95_gbps: Option<f64>,
    /// The figure of every replication, by seed.
    #[serde(default)]
    pub replicates: Vec<f64>,
    /// What the point carried through a link as a fraction of the link's
    /// usable payload rate ([`Figure::fraction_of_usable`]), the mean over
    /// the replications.
    #[serde(default)]
    pub fraction_of_usable: Option<f64>,
}

impl ScanPoint {
    /// Whether its figure is a steady state (synthetic traffic: always).
    pub fn is_steady(&self) -> bool {
        self.summary.eb.as_ref().is_none_or(|e| e.steady)
    }
}

/// What a scan ranks points by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Figure {
    /// `eb`: built Gb/s per node (steady state); other traffic: delivered
    /// Gb/s per host.
    Built,
    /// With consumers: Gb/s sent per producer (steady state).
    Producer,
    /// With consumers: Gb/s received per consumer (steady state).
    Consumer,
}

impl Figure {
    /// What the figure is, for a table header.
    pub fn label(self) -> &'static str {
        match self {
            Figure::Built => "built per node, its own fragment included (eb), or received per host",
            Figure::Producer => "sent per producer",
            Figure::Consumer => "received per consumer",
        }
    }

    /// What the "% of usable" column is, for a table header.
    pub fn usable_label(self) -> &'static str {
        match self {
            Figure::Built => "what crossed the network per node (eb) or was received per host, of the hosts' links' usable payload rate",
            Figure::Producer => "of the producers' links' usable payload rate",
            Figure::Consumer => "of the consumers' links' usable payload rate",
        }
    }

    /// The share of its link's usable payload rate a simulation's figure
    /// stands for: for `eb` what crossed the network (a node's own
    /// fragment does not), else the figure itself; `None` when the summary
    /// predates the usable rate.
    pub fn fraction_of_usable(self, s: &SimSummary) -> Option<f64> {
        let f = match self {
            Figure::Built => match &s.eb {
                Some(e) => e.network_fraction_of_usable,
                None => s.fraction_of_usable,
            },
            Figure::Producer => s.consumers.as_ref()?.producer_fraction_of_usable,
            Figure::Consumer => s.consumers.as_ref()?.consumer_fraction_of_usable,
        };
        (s.usable_link_gbps > 0.0).then_some(f)
    }

    pub fn parse(s: &str) -> Result<Figure, String> {
        match s {
            "built" => Ok(Figure::Built),
            "producer" => Ok(Figure::Producer),
            "consumer" => Ok(Figure::Consumer),
            _ => Err(format!("--figure `{s}`: one of built, producer, consumer")),
        }
    }

    /// The figure of one simulation.
    pub fn of(self, s: &SimSummary) -> Result<f64, String> {
        let consumers = || {
            s.consumers
                .as_ref()
                .ok_or("--figure producer/consumer needs output.consumers > 0")
        };
        Ok(match self {
            Figure::Built => {
                s.eb.as_ref()
                    .map_or(s.throughput_per_host_gbps, |e| e.built_gbps_per_node)
            }
            Figure::Producer => consumers()?.producer_gbps_per_producer,
            Figure::Consumer => consumers()?.consumer_gbps_per_consumer,
        })
    }
}

/// How a scan runs its points.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    pub shard: Option<[usize; 2]>,
    /// Seeds per point (at least 1).
    pub replications: usize,
    pub figure: Figure,
    /// Simulations at once (`None`: one per core).
    pub jobs: Option<usize>,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            shard: None,
            replications: 1,
            figure: Figure::Built,
            jobs: None,
        }
    }
}

fn one() -> usize {
    1
}

fn built() -> Figure {
    Figure::Built
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
    /// Seeds per point, and what the points are ranked by.
    #[serde(default = "one")]
    pub replications: usize,
    #[serde(default = "built")]
    pub figure: Figure,
    /// With replications: points whose interval overlaps the best's (not
    /// told apart from it at 95 %), the best included.
    #[serde(default)]
    pub tied_with_best: usize,
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

/// One run of a point: (point, summary, figure, fraction of usable).
type Run = (usize, SimSummary, f64, Option<f64>);

/// Runs every point. `load` turns a point's `(key, value)` pairs into a
/// validated configuration and the fabric to run it on (so errors name the
/// offending `--param`, and axes such as the rank order can change the fabric).
pub fn run_scan(
    axes: &[Axis],
    load: impl Fn(&[(String, String)]) -> Result<(Config, SimFabric), String> + Sync,
    options: ScanOptions,
    on_run_done: impl Fn() + Sync,
) -> Result<ScanResult, String> {
    let ScanOptions {
        shard,
        replications,
        figure,
        jobs,
    } = options;
    if replications == 0 {
        return Err("--replications must be at least 1".into());
    }
    if jobs == Some(0) {
        return Err("--jobs must be at least 1".into());
    }
    if replications > 1 && axes.iter().any(|a| a.key == "run.seed") {
        return Err(
            "--replications runs every point with its own seeds: do not also scan run.seed".into(),
        );
    }
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
    // Every (point, replication) is a job of its own, so that the cores
    // stay busy however few points there are.
    let work: Vec<(usize, usize)> = (0..configs.len())
        .flat_map(|p| (0..replications).map(move |r| (p, r)))
        .collect();
    let run_all = || {
        work.into_par_iter()
            .map(|(p, r)| {
                let (config, fabric) = &configs[p];
                let mut config = config.clone();
                config.run.seed = config.run.seed.wrapping_add(r as u64);
                let result = simulate(&config, fabric.clone(), |_| {})?;
                on_run_done();
                let value = figure.of(&result.summary)?;
                let usable = figure.fraction_of_usable(&result.summary);
                Ok((p, result.summary, value, usable))
            })
            .collect::<Result<Vec<Run>, String>>()
    };
    // `jobs` threads of a pool of the scan's own (a schedule computed
    // inside a run parallelises within it too).
    let runs = match jobs {
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| format!("--jobs {n}: {e}"))?
            .install(run_all)?,
        None => run_all()?,
    };
    type PerPoint = (Option<SimSummary>, Vec<f64>, Vec<Option<f64>>);
    let mut per_point: Vec<PerPoint> = vec![(None, Vec::new(), Vec::new()); configs.len()];
    for (p, summary, value, usable) in runs {
        let slot = &mut per_point[p];
        // Jobs come back in order: the first is the base seed's.
        slot.0.get_or_insert(summary);
        slot.1.push(value);
        slot.2.push(usable);
    }
    let points = combos
        .into_iter()
        .zip(indices)
        .zip(per_point)
        .map(|((params, index), (summary, replicates, usable))| {
            let stats = crate::stats::mean_ci(&replicates);
            let usable: Option<Vec<f64>> = usable.into_iter().collect();
            ScanPoint {
                index,
                params,
                summary: summary.expect("every point ran"),
                figure_gbps: stats.mean,
                ci95_gbps: (replicates.len() > 1).then_some(stats.ci95),
                replicates,
                fraction_of_usable: usable.map(|u| u.iter().sum::<f64>() / u.len().max(1) as f64),
            }
        })
        .collect();
    let mut result = summarise(
        axes.iter().map(|a| a.key.clone()).collect(),
        total_points,
        shard,
        points,
        start.elapsed().as_secs_f64(),
    );
    result.replications = replications;
    result.figure = figure;
    Ok(result)
}

fn summarise(
    axes: Vec<String>,
    total_points: usize,
    shard: Option<[usize; 2]>,
    mut points: Vec<ScanPoint>,
    wall_seconds: f64,
) -> ScanResult {
    points.sort_by_key(|p| p.index);
    // A point without a steady state is a start-up transient: never the
    // best, whatever its figure (unless no point is steady).
    let best = (0..points.len())
        .max_by(|&a, &b| {
            (points[a].is_steady(), points[a].figure_gbps)
                .partial_cmp(&(points[b].is_steady(), points[b].figure_gbps))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .unwrap_or(0);
    let top = points.get(best).map_or(0.0, |p| p.figure_gbps);
    let within = points
        .iter()
        .filter(|p| p.figure_gbps >= 0.98 * top)
        .count();
    let best_low = points
        .get(best)
        .map_or(0.0, |p| p.figure_gbps - p.ci95_gbps.unwrap_or(0.0));
    let tied = points
        .iter()
        .filter(|p| p.ci95_gbps.is_some() && p.figure_gbps + p.ci95_gbps.unwrap_or(0.0) >= best_low)
        .count();
    let replications = points.first().map_or(1, |p| p.replicates.len().max(1));
    ScanResult {
        kind: "evb-scan".into(),
        axes,
        total_points,
        shard,
        fraction_within_2pct_of_best: within as f64 / points.len().max(1) as f64,
        points,
        best,
        replications,
        figure: Figure::Built,
        tied_with_best: tied,
        wall_seconds,
    }
}

/// Joins the shards of one scan; every point must be there exactly once.
pub fn merge(shards: Vec<ScanResult>) -> Result<ScanResult, String> {
    let first = shards.first().ok_or("nothing to merge")?;
    let (axes, total) = (first.axes.clone(), first.total_points);
    let (first_figure, first_replications) = (first.figure, first.replications);
    let mut points = Vec::with_capacity(total);
    let mut wall = 0.0f64;
    for (k, s) in shards.into_iter().enumerate() {
        if s.kind != "evb-scan" {
            return Err(format!(
                "input {k}: not an evb scan result (kind {})",
                s.kind
            ));
        }
        if s.figure != first_figure || s.replications != first_replications {
            return Err(format!(
                "input {k}: ranked by {:?} over {} replications, the first by {first_figure:?} over {first_replications}",
                s.figure, s.replications
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
    let figure = first_figure;
    let mut merged = summarise(axes, total, None, points, wall);
    merged.figure = figure;
    Ok(merged)
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
