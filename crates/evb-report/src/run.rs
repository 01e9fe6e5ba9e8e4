//! `evb run --json` files: accounting, throughput over time, latency.

use std::fmt::Write;

use evb_plot::{Bar, Series};

use crate::html::{count, esc, facts, fixed, nanos, opt_count, short_name, table, Cell};
use crate::json::At;
use crate::{config_details, figure, Input, Result};

/// Beyond this many nodes, per-node lines become min/mean/max lines.
const MAX_NODE_LINES: usize = 16;
/// Latency histograms have at most this many (log-spaced) bins.
const MAX_LATENCY_BINS: usize = 60;

/// A BU's latency histogram: `(value_ns, batches)` buckets.
type Buckets = Vec<(f64, u64)>;

/// The summary figures of a run.
struct Summary {
    nodes: u64,
    duration_s: f64,
    generated: u64,
    built: u64,
    incomplete: u64,
    corrupt: u64,
    lost: u64,
    built_gbps: f64,
    built_gbps_per_node: f64,
    events_per_second: f64,
    latency: [Option<f64>; 4],
}

impl Summary {
    fn read(root: &At) -> Result<Summary> {
        let s = root.get("summary");
        let lat = s.get("latency_ns");
        Ok(Summary {
            nodes: s.get("nodes").u64()?,
            duration_s: s.get("duration_s").f64()?,
            generated: s.get("events_generated").u64()?,
            built: s.get("events_built").u64()?,
            incomplete: s.get("events_incomplete").u64()?,
            corrupt: s.get("events_corrupt").u64()?,
            lost: s.get("events_lost").u64()?,
            built_gbps: s.get("built_gbps").f64()?,
            built_gbps_per_node: s.get("built_gbps_per_node").f64()?,
            events_per_second: s.get("events_per_second").f64()?,
            latency: [
                lat.get("p50").opt_f64()?,
                lat.get("p99").opt_f64()?,
                lat.get("max").opt_f64()?,
                lat.get("mean").opt_f64()?,
            ],
        })
    }

    /// `built + incomplete + corrupt + lost - generated` (0 when exact).
    fn accounting_gap(&self) -> i128 {
        i128::from(self.built)
            + i128::from(self.incomplete)
            + i128::from(self.corrupt)
            + i128::from(self.lost)
            - i128::from(self.generated)
    }
}

fn accounting_cell(s: &Summary) -> Cell {
    match s.accounting_gap() {
        0 => Cell::new("exact").with_class("ok"),
        gap => Cell::new(format!("off by {gap}")).with_class("bad"),
    }
}

pub(crate) fn section(input: &Input) -> Result<String> {
    let root = &input.root;
    let s = Summary::read(root)?;
    let mut out = String::new();
    let config = root.get("config");
    let eb = config.get("event_builder");
    let _ = writeln!(
        out,
        "<p>{} nodes, {} s; {} {} {}, credits {}, parallel sends {}, {} events/MEP; evb {}</p>",
        s.nodes,
        fixed(Some(s.duration_s), 2),
        esc(eb.get("protocol").opt_str()?.unwrap_or("?")),
        esc("/"),
        esc(eb.get("schedule").opt_str()?.unwrap_or("?")),
        opt_count(eb.get("credits").opt_u64()?),
        opt_count(eb.get("parallel_sends").opt_u64()?),
        opt_count(config.get("source").get("events_per_mep").opt_u64()?),
        esc(root.get("evb_version").opt_str()?.unwrap_or("?")),
    );

    out.push_str("<h3>Event accounting</h3>\n");
    let gap = s.accounting_gap();
    let rows = vec![vec![
        Cell::num(count(s.generated)),
        Cell::num(count(s.built)),
        Cell::num(count(s.incomplete)).with_class(if s.incomplete > 0 { "bad" } else { "num" }),
        Cell::num(count(s.corrupt)).with_class(if s.corrupt > 0 { "bad" } else { "num" }),
        Cell::num(count(s.lost)).with_class(if s.lost > 0 { "bad" } else { "num" }),
        accounting_cell(&s),
    ]];
    out.push_str(&table(
        &[
            "generated",
            "built",
            "incomplete",
            "corrupt",
            "lost",
            "generated = built + incomplete + corrupt + lost",
        ],
        &rows,
    ));
    if gap != 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">The accounting does not close: the fates add up to {} events more than were generated.</p>",
            gap
        );
    }
    let [p50, p99, max, mean] = s
        .latency
        .map(|v| v.map_or_else(|| "\u{2013}".into(), nanos));
    out.push_str(&facts(&[
        ("built, aggregate", format!("{:.2} Gb/s", s.built_gbps)),
        (
            "built per node",
            format!("{:.2} Gb/s", s.built_gbps_per_node),
        ),
        (
            "events built per second",
            format!("{:.3} M", s.events_per_second / 1e6),
        ),
        (
            "latency p50 / p99 / max / mean",
            format!("{p50} / {p99} / {max} / {mean}"),
        ),
    ]));

    out.push_str("<h3>Throughput over time</h3>\n");
    out.push_str(&figure(input.file, throughput_chart(root)?)?);
    out.push_str(&consumers(input)?);

    out.push_str("<h3>Batch building latency</h3>\n");
    let nodes = node_buckets(root)?;
    out.push_str(&figure(input.file, latency_histogram(&nodes))?);
    out.push_str(&figure(input.file, latency_cdf(&nodes))?);

    out.push_str("<h3>Nodes</h3>\n");
    out.push_str(&node_table(root)?);
    out.push_str(&failures(root)?);
    out.push_str(&config_details(&config));
    Ok(out)
}

/// Built Gb/s over time: per node when the timeline has `node_built_gbps`.
fn throughput_chart(root: &At) -> Result<Result<String, evb_plot::PlotError>> {
    let timeline = root.get("timeline").opt_array()?;
    let mut aggregate = Vec::new();
    let mut per_node: Vec<Vec<(f64, f64)>> = Vec::new();
    for sample in &timeline {
        let t = sample.get("t_s").f64()?;
        aggregate.push((t, sample.get("built_gbps").f64()?));
        for (i, v) in sample
            .get("node_built_gbps")
            .opt_array()?
            .iter()
            .enumerate()
        {
            if per_node.len() <= i {
                per_node.resize(i + 1, Vec::new());
            }
            per_node[i].push((t, v.f64()?));
        }
    }
    let series = if per_node.is_empty() {
        vec![Series {
            name: "all nodes".into(),
            points: aggregate,
        }]
    } else if per_node.len() <= MAX_NODE_LINES {
        per_node
            .into_iter()
            .enumerate()
            .map(|(i, points)| Series {
                name: format!("node {i}"),
                points,
            })
            .collect()
    } else {
        spread_lines(&per_node)
    };
    let title = if series.len() > 1 {
        "Built Gb/s per node"
    } else {
        "Built Gb/s, all nodes"
    };
    Ok(evb_plot::line_chart_svg(title, "time (s)", "Gb/s", &series))
}

/// The output stage of a run with Filter Unit consumers (`summary.consumers`
/// and the consumer fields of the timeline): producer and consumer
/// throughput and the number of busy consumers over time, per consumer
/// figures. Empty for a run without consumers.
fn consumers(input: &Input) -> Result<String> {
    let root = &input.root;
    let c = root.get("summary").get("consumers");
    if c.is_null() {
        return Ok(String::new());
    }
    let consumers = c.get("consumers").u64()?;
    let mut out = String::from("<h3>Output stage: producers and consumers</h3>\n");
    let extra = newer_consumer_facts(root, &c)?;
    out.push_str(&facts(&consumer_facts(&c, consumers)?));
    if !extra.is_empty() {
        out.push_str(&facts(&extra));
    }
    out.push_str(&consumer_charts(input, consumers)?);
    out.push_str(&per_consumer_table(&c)?);
    Ok(out)
}

/// What newer runs also report about the output stage: the trigger, the
/// event store and re-deliveries (each only when present).
fn newer_consumer_facts(root: &At, c: &At) -> Result<Vec<(&'static str, String)>> {
    let mut extra = Vec::new();
    if let (Some(consumed), Some(accepted)) = (
        c.get("events_consumed").opt_u64()?,
        c.get("events_accepted").opt_u64()?,
    ) {
        let percent = 100.0 * accepted as f64 / consumed.max(1) as f64;
        extra.push((
            "trigger: events accepted / consumed",
            format!("{} / {} ({percent:.1} %)", count(accepted), count(consumed)),
        ));
    }
    if let Some(objects) = root.get("summary").get("store_objects").opt_u64()? {
        if objects > 0 {
            let s = root.get("summary");
            extra.push((
                "event store: objects / events / bytes",
                format!(
                    "{} / {} / {}",
                    count(objects),
                    count(s.get("store_events").u64()?),
                    count(s.get("store_bytes").u64()?)
                ),
            ));
        }
    }
    if let Some(again) = c.get("batches_redelivered").opt_u64()? {
        if again > 0 {
            extra.push(("delivered again (their consumer died)", count(again)));
        }
    }
    Ok(extra)
}

/// The output stage's figures every run with consumers has: counts,
/// throughput and backpressure.
fn consumer_facts(c: &At, consumers: u64) -> Result<Vec<(&'static str, String)>> {
    Ok(vec![
        ("consumers", count(consumers)),
        (
            "batches delivered / consumed",
            format!(
                "{} / {}",
                count(c.get("batches_delivered").u64()?),
                count(c.get("batches_consumed").u64()?)
            ),
        ),
        (
            "not consumed / undelivered / corrupt",
            format!(
                "{} / {} / {}",
                count(c.get("batches_not_consumed").u64()?),
                count(c.get("batches_undelivered").u64()?),
                count(c.get("batches_corrupt").u64()?)
            ),
        ),
        (
            "producer / consumer throughput",
            format!(
                "{:.2} / {:.2} Gb/s",
                c.get("producer_gbps").f64()?,
                c.get("consumer_gbps").f64()?
            ),
        ),
        (
            "backpressure",
            format!(
                "EM credit stalls {}, BU output queues full {} s, longest queue {}",
                count(c.get("em_credit_stalls").u64()?),
                fixed(Some(c.get("output_full_s").f64()?), 3),
                count(c.get("max_output_queue").u64()?)
            ),
        ),
    ])
}

/// Producer and consumer throughput, and the busy consumers against the
/// run's consumer count, over time.
fn consumer_charts(input: &Input, consumers: u64) -> Result<String> {
    let root = &input.root;
    let mut out = String::new();
    let mut producer = Vec::new();
    let mut consumer = Vec::new();
    let mut busy = Vec::new();
    for sample in root.get("timeline").opt_array()? {
        let t = sample.get("t_s").f64()?;
        if let Some(v) = sample.get("producer_gbps").opt_f64()? {
            producer.push((t, v));
        }
        if let Some(v) = sample.get("consumer_gbps").opt_f64()? {
            consumer.push((t, v));
        }
        if let Some(v) = sample.get("busy_consumers").opt_f64()? {
            busy.push((t, v));
        }
    }
    out.push_str(&figure(
        input.file,
        evb_plot::line_chart_svg(
            "Producer (BUs delivering) and consumer throughput",
            "time (s)",
            "Gb/s",
            &[
                Series {
                    name: "producer: delivered by the BUs".into(),
                    points: producer,
                },
                Series {
                    name: "consumer: consumed by the FUs".into(),
                    points: consumer,
                },
            ],
        ),
    )?);
    let ceiling = match (busy.first(), busy.last()) {
        (Some(first), Some(last)) => vec![(first.0, consumers as f64), (last.0, consumers as f64)],
        _ => Vec::new(),
    };
    out.push_str(&figure(
        input.file,
        evb_plot::line_chart_svg(
            "Busy consumers over time (mean over each interval)",
            "time (s)",
            "consumers busy",
            &[
                Series {
                    name: "busy consumers".into(),
                    points: busy,
                },
                Series {
                    name: "consumers in the run".into(),
                    points: ceiling,
                },
            ],
        ),
    )?);
    Ok(out)
}

/// Batches, bytes and busy fraction per consumer (empty when the run has
/// no per-consumer figures).
fn per_consumer_table(c: &At) -> Result<String> {
    let mut out = String::new();
    let mut rows = Vec::new();
    for p in c.get("per_consumer").opt_array()? {
        rows.push(vec![
            Cell::num(p.get("node").u64()?.to_string()),
            Cell::num(count(p.get("batches").u64()?)),
            Cell::num(count(p.get("bytes").u64()?)),
            Cell::num(format!("{:.0} %", p.get("busy_fraction").f64()? * 100.0)),
        ]);
    }
    if !rows.is_empty() {
        out.push_str(&table(
            &["consumer (endpoint)", "batches consumed", "bytes", "busy"],
            &rows,
        ));
    }
    Ok(out)
}

/// Min, mean and max over many per-node lines sampled at the same times.
fn spread_lines(per_node: &[Vec<(f64, f64)>]) -> Vec<Series> {
    let samples = per_node.iter().map(Vec::len).max().unwrap_or(0);
    let mut lines = [Vec::new(), Vec::new(), Vec::new()];
    for k in 0..samples {
        let values: Vec<(f64, f64)> = per_node.iter().filter_map(|n| n.get(k).copied()).collect();
        let t = values[0].0;
        let ys = values.iter().map(|v| v.1);
        let min = ys.clone().fold(f64::INFINITY, f64::min);
        let max = ys.clone().fold(f64::NEG_INFINITY, f64::max);
        let mean = ys.sum::<f64>() / values.len() as f64;
        lines[0].push((t, max));
        lines[1].push((t, mean));
        lines[2].push((t, min));
    }
    let [max, mean, min] = lines;
    vec![
        Series {
            name: "max over nodes".into(),
            points: max,
        },
        Series {
            name: "mean".into(),
            points: mean,
        },
        Series {
            name: "min".into(),
            points: min,
        },
    ]
}

/// Each node's latency histogram buckets `(value_ns, count)`, by node index.
fn node_buckets(root: &At) -> Result<Vec<(usize, Buckets)>> {
    let mut out = Vec::new();
    for (i, node) in root.get("nodes").opt_array()?.iter().enumerate() {
        let mut buckets = Vec::new();
        for b in node.get("latency_buckets").opt_array()? {
            let pair = b.array()?;
            if pair.len() != 2 {
                return Err(b.error(format!(
                    "expected [value_ns, count], found {} items",
                    pair.len()
                )));
            }
            buckets.push((pair[0].f64()?.max(0.0), pair[1].u64()?));
        }
        if !buckets.is_empty() {
            out.push((i, buckets));
        }
    }
    Ok(out)
}

/// Batches per latency bin, all nodes merged, bins spaced evenly in log(latency).
fn latency_histogram(nodes: &[(usize, Buckets)]) -> Result<String, evb_plot::PlotError> {
    let all = nodes.iter().flat_map(|(_, b)| b.iter().copied());
    let lo = all
        .clone()
        .map(|b| b.0)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let hi = all
        .clone()
        .map(|b| b.0)
        .fold(0.0f64, f64::max)
        .max(lo * 1.01);
    let decades = (hi / lo).log10();
    let bins = ((decades * 10.0).ceil() as usize).clamp(1, MAX_LATENCY_BINS);
    let mut counts = vec![0u64; bins];
    for (v, n) in all {
        let x = (v.max(lo) / lo).log10() / decades * bins as f64;
        let i = (x as usize).min(bins - 1);
        counts[i] = counts[i].saturating_add(n);
    }
    let edge = |i: usize| lo * 10f64.powf(decades * i as f64 / bins as f64);
    let bars: Vec<Bar> = if nodes.is_empty() {
        Vec::new()
    } else {
        counts
            .iter()
            .enumerate()
            .map(|(i, &n)| Bar {
                label: nanos(edge(i)),
                value: n as f64,
            })
            .collect()
    };
    evb_plot::bar_chart_svg(
        "Batches by building latency (all BUs, log-spaced bins)",
        "latency (bin start)",
        "batches",
        &bars,
    )
}

/// The cumulative latency distribution, merged and per node.
fn latency_cdf(nodes: &[(usize, Buckets)]) -> Result<String, evb_plot::PlotError> {
    let cdf = |buckets: &mut Vec<(f64, u64)>| -> Vec<(f64, f64)> {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = buckets.iter().map(|b| b.1 as f64).sum();
        let mut seen = 0.0;
        buckets
            .iter()
            .map(|&(v, n)| {
                seen += n as f64;
                (v / 1e6, 100.0 * seen / total.max(1.0))
            })
            .collect()
    };
    let mut merged: Vec<(f64, u64)> = nodes.iter().flat_map(|(_, b)| b.iter().copied()).collect();
    let mut series = Vec::new();
    if !merged.is_empty() {
        series.push(Series {
            name: "all BUs".into(),
            points: cdf(&mut merged),
        });
    }
    if nodes.len() > 1 && nodes.len() <= MAX_NODE_LINES {
        for (i, buckets) in nodes {
            series.push(Series {
                name: format!("node {i}"),
                points: cdf(&mut buckets.clone()),
            });
        }
    }
    evb_plot::line_chart_svg(
        "Cumulative latency distribution",
        "latency (ms)",
        "% of batches",
        &series,
    )
}

fn node_table(root: &At) -> Result<String> {
    let exit_codes = root.get("node_exit_codes").opt_array()?;
    let mut rows = Vec::new();
    for (i, node) in root.get("nodes").opt_array()?.iter().enumerate() {
        let exit = exit_codes.get(i).map_or(Ok(None), |c| {
            c.value.as_i64().map_or_else(
                || {
                    if c.is_null() {
                        Ok(Some("killed".to_string()))
                    } else {
                        Err(c.error("expected an exit status or null"))
                    }
                },
                |c| Ok(Some(c.to_string())),
            )
        })?;
        let exit = exit.unwrap_or_else(|| "\u{2013}".into());
        if node.is_null() {
            rows.push(vec![
                Cell::num(i.to_string()),
                Cell::new("no final report (died or killed)").with_class("bad"),
                Cell::new(""),
                Cell::new(""),
                Cell::new(""),
                Cell::new(""),
                Cell::new(""),
                Cell::new(""),
                Cell::new(""),
                Cell::new(""),
                Cell::num(exit),
            ]);
            continue;
        }
        let elapsed = node.get("elapsed_s").opt_f64()?.filter(|e| *e > 0.0);
        let gbps =
            |bytes: Option<u64>| -> Option<f64> { Some(bytes? as f64 * 8.0 / elapsed? / 1e9) };
        let latency = node.get("latency_ns");
        let lat = |key: &str| -> Result<String> {
            Ok(latency
                .get(key)
                .opt_f64()?
                .map_or_else(|| "\u{2013}".into(), nanos))
        };
        let bad = |v: Option<u64>| if v.unwrap_or(0) > 0 { "bad" } else { "num" };
        let incomplete = node.get("events_incomplete").opt_u64()?;
        let corrupt = node.get("events_corrupt").opt_u64()?;
        rows.push(vec![
            Cell::num(i.to_string()),
            Cell::new(node.get("role").opt_str()?.unwrap_or("?")),
            Cell::num(fixed(node.get("elapsed_s").opt_f64()?, 2)),
            Cell::num(fixed(gbps(node.get("bytes_sent").opt_u64()?), 2)),
            Cell::num(fixed(gbps(node.get("bytes_received").opt_u64()?), 2)),
            Cell::num(fixed(gbps(node.get("bytes_built").opt_u64()?), 2)),
            Cell::num(opt_count(node.get("events_built").opt_u64()?)),
            Cell::num(opt_count(incomplete)).with_class(bad(incomplete)),
            Cell::num(opt_count(corrupt)).with_class(bad(corrupt)),
            Cell::num(format!("{} / {}", lat("p50")?, lat("p99")?)),
            Cell::num(exit),
        ]);
    }
    Ok(table(
        &[
            "node",
            "role",
            "elapsed s",
            "sent Gb/s",
            "received Gb/s",
            "built Gb/s",
            "events built",
            "incomplete",
            "corrupt",
            "latency p50 / p99",
            "exit",
        ],
        &rows,
    ))
}

fn failures(root: &At) -> Result<String> {
    let list = root.get("summary").get("failures").opt_array()?;
    if list.is_empty() {
        return Ok(String::new());
    }
    let mut rows = Vec::new();
    for f in &list {
        rows.push(vec![
            Cell::num(fixed(f.get("at_s").opt_f64()?, 3)),
            Cell::num(opt_count(f.get("node").opt_u64()?)),
            Cell::new(describe_scalar(&f.get("seen_by"))),
            Cell::new(f.get("what").opt_str()?.unwrap_or("")),
        ]);
    }
    Ok(format!(
        "<h3>Failures</h3>\n{}",
        table(&["at s", "node", "seen by", "what"], &rows)
    ))
}

/// A string or number field as text.
fn describe_scalar(at: &At) -> String {
    match at.value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Several runs side by side: figures table, built Gb/s bars, timelines overlaid.
pub(crate) fn compare(inputs: &[&Input]) -> Result<String> {
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    let mut lines = Vec::new();
    for input in inputs {
        let s = Summary::read(&input.root)?;
        let name = short_name(input.file);
        let not_built = s
            .incomplete
            .saturating_add(s.corrupt)
            .saturating_add(s.lost);
        let [p50, p99, max, _] = s
            .latency
            .map(|v| v.map_or_else(|| "\u{2013}".into(), nanos));
        rows.push(vec![
            Cell::new(input.file.display().to_string()),
            Cell::num(s.nodes.to_string()),
            Cell::num(fixed(Some(s.duration_s), 2)),
            Cell::num(fixed(Some(s.built_gbps), 2)),
            Cell::num(fixed(Some(s.built_gbps_per_node), 2)),
            Cell::num(fixed(Some(s.events_per_second / 1e6), 3)),
            Cell::num(format!("{p50} / {p99} / {max}")),
            Cell::num(count(s.generated)),
            Cell::num(count(s.built)),
            Cell::num(count(not_built)).with_class(if not_built > 0 { "bad" } else { "num" }),
            accounting_cell(&s),
        ]);
        bars.push(Bar {
            label: name.clone(),
            value: s.built_gbps_per_node,
        });
        let mut points = Vec::new();
        for sample in input.root.get("timeline").opt_array()? {
            points.push((sample.get("t_s").f64()?, sample.get("built_gbps").f64()?));
        }
        lines.push(Series { name, points });
    }
    let mut out = table(
        &[
            "file",
            "nodes",
            "duration s",
            "built Gb/s",
            "per node",
            "M events/s",
            "latency p50 / p99 / max",
            "generated",
            "built",
            "not built",
            "accounting",
        ],
        &rows,
    );
    let file = inputs[0].file;
    out.push_str(&figure(
        file,
        evb_plot::bar_chart_svg("Built Gb/s per node, by run", "run", "Gb/s per node", &bars),
    )?);
    out.push_str(&figure(
        file,
        evb_plot::line_chart_svg(
            "Built Gb/s over time, all nodes, by run",
            "time (s)",
            "Gb/s",
            &lines,
        ),
    )?);
    Ok(out)
}
