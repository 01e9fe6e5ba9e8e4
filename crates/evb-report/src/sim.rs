//! `evb sim --json` files: the summary, throughput per host over time, hosts
//! and links.

use evb_plot::{Bar, Series};

use crate::html::{count, facts, fixed, opt_count, short_name, table, Cell};
use crate::json::At;
use crate::{figure, Input, Result};

/// Beyond this many hosts, per-host bars become a sorted line.
const MAX_HOST_BARS: usize = 64;

struct Summary {
    traffic: String,
    topology: String,
    hosts: u64,
    per_host_gbps: f64,
    link_rate_gbps: f64,
    fraction_of_link: f64,
    /// The links' usable payload rate and the share of it (absent from
    /// older files).
    usable_link_gbps: Option<f64>,
    fraction_of_usable: Option<f64>,
    min_host_gbps: f64,
    max_host_gbps: f64,
    simulated_s: f64,
    max_link_utilisation: Option<f64>,
    eb_built_gbps_per_node: Option<f64>,
    eb_network_gbps_per_node: Option<f64>,
    eb_network_fraction_of_usable: Option<f64>,
    eb_latency_p99_us: Option<f64>,
}

impl Summary {
    fn read(s: &At) -> Result<Summary> {
        let eb = s.get("eb");
        Ok(Summary {
            traffic: s.get("traffic").opt_str()?.unwrap_or("?").to_string(),
            topology: s.get("topology").opt_str()?.unwrap_or("?").to_string(),
            hosts: s.get("hosts").u64()?,
            per_host_gbps: s.get("throughput_per_host_gbps").f64()?,
            link_rate_gbps: s.get("link_rate_gbps").f64()?,
            fraction_of_link: s.get("fraction_of_link").f64()?,
            usable_link_gbps: s.get("usable_link_gbps").opt_f64()?,
            fraction_of_usable: s.get("fraction_of_usable").opt_f64()?,
            min_host_gbps: s.get("min_host_gbps").f64()?,
            max_host_gbps: s.get("max_host_gbps").f64()?,
            simulated_s: s.get("simulated_seconds").f64()?,
            max_link_utilisation: s.get("max_link_utilisation").opt_f64()?,
            eb_built_gbps_per_node: eb.get("built_gbps_per_node").opt_f64()?,
            eb_network_gbps_per_node: eb.get("network_gbps_per_node").opt_f64()?,
            eb_network_fraction_of_usable: eb.get("network_fraction_of_usable").opt_f64()?,
            eb_latency_p99_us: eb.get("latency_p99_us").opt_f64()?,
        })
    }
}

impl Summary {
    /// The per-host figure's share of the link: of its usable payload
    /// rate where the file has it, else of the raw rate, saying which.
    fn share(&self) -> String {
        match (self.fraction_of_usable, self.usable_link_gbps) {
            (Some(f), Some(u)) => format!(
                "{:.1}% of the usable {:.2} of {:.1} Gb/s",
                f * 100.0,
                u,
                self.link_rate_gbps
            ),
            _ => format!(
                "{:.1}% of {:.1} Gb/s",
                self.fraction_of_link * 100.0,
                self.link_rate_gbps
            ),
        }
    }
}

/// The summary table of a simulation (also used for each scan point).
pub(crate) fn summary_facts(s: &At) -> Result<String> {
    let sum = Summary::read(s)?;
    let mut rows = vec![
        ("traffic", sum.traffic.clone()),
        (
            "topology",
            format!("{} ({} hosts)", sum.topology, sum.hosts),
        ),
        ("simulated", format!("{:.1} us", sum.simulated_s * 1e6)),
        (
            "received per host, whole run",
            format!(
                "{:.2} Gb/s ({}); min {:.2}, max {:.2}",
                sum.per_host_gbps,
                sum.share(),
                sum.min_host_gbps,
                sum.max_host_gbps
            ),
        ),
        (
            "busiest link",
            fixed(sum.max_link_utilisation.map(|u| u * 100.0), 1) + " %",
        ),
        (
            "PortXmitWait, all ports",
            fixed(s.get("total_xmit_wait_s").opt_f64()?.map(|w| w * 1e3), 3) + " ms",
        ),
        (
            "wall time",
            fixed(s.get("wall_seconds").opt_f64()?, 2) + " s",
        ),
    ];
    let eb = s.get("eb");
    if !eb.is_null() {
        rows.push(("events built", opt_count(eb.get("events_built").opt_u64()?)));
        rows.push((
            "batches incomplete",
            opt_count(eb.get("batches_incomplete").opt_u64()?),
        ));
        rows.push((
            "built per node, steady state (own fragment included)",
            fixed(sum.eb_built_gbps_per_node, 2) + " Gb/s",
        ));
        rows.push((
            "crossed the network per node, steady state",
            fixed(sum.eb_network_gbps_per_node, 2)
                + " Gb/s"
                + &sum
                    .eb_network_fraction_of_usable
                    .map_or(String::new(), |f| format!(" ({:.1}% of usable)", f * 100.0)),
        ));
        rows.push((
            "batch latency p50 / p99 / max",
            format!(
                "{} / {} / {} us",
                fixed(eb.get("latency_p50_us").opt_f64()?, 1),
                fixed(sum.eb_latency_p99_us, 1),
                fixed(eb.get("latency_max_us").opt_f64()?, 1)
            ),
        ));
    }
    Ok(facts(&rows))
}

pub(crate) fn section(input: &Input) -> Result<String> {
    let root = &input.root;
    let mut out = summary_facts(&root.get("summary"))?;
    out.push_str(&throughput_over_time(input, root)?);
    out.push_str(&hosts_chart(input, root)?);
    out.push_str(&busiest_links(input, root)?);
    Ok(out)
}

/// The received payload per host over time (max, mean and min over the
/// hosts), as a chart.
fn throughput_over_time(input: &Input, root: &At) -> Result<String> {
    let mut out = String::new();
    out.push_str("<h3>Received payload per host over time</h3>\n");
    let mut lines = [Vec::new(), Vec::new(), Vec::new()];
    for sample in root.get("timeseries").opt_array()? {
        let t = sample.get("t_us").f64()?;
        lines[0].push((t, sample.get("max_rx_gbps").f64()?));
        lines[1].push((t, sample.get("mean_rx_gbps").f64()?));
        lines[2].push((t, sample.get("min_rx_gbps").f64()?));
    }
    let [max, mean, min] = lines;
    let series = [
        Series {
            name: "max".into(),
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
    ];
    out.push_str(&figure(
        input.file,
        evb_plot::line_chart_svg(
            "Received payload per host",
            "simulated time (us)",
            "Gb/s",
            &series,
        ),
    )?);
    Ok(out)
}

/// What each host received: a bar per host, or with more hosts than
/// MAX_HOST_BARS a line of them sorted, slowest first.
fn hosts_chart(input: &Input, root: &At) -> Result<String> {
    let mut out = String::new();
    out.push_str("<h3>Hosts</h3>\n");
    let mut hosts = Vec::new();
    for h in root.get("hosts").opt_array()? {
        hosts.push((
            h.get("host").opt_str()?.unwrap_or("?").to_string(),
            h.get("received_gbps").f64()?,
        ));
    }
    let chart = if hosts.len() <= MAX_HOST_BARS {
        let bars: Vec<Bar> = hosts
            .into_iter()
            .map(|(label, value)| Bar { label, value })
            .collect();
        evb_plot::bar_chart_svg("Received payload by host", "host", "Gb/s", &bars)
    } else {
        let mut values: Vec<f64> = hosts.into_iter().map(|h| h.1).collect();
        values.sort_by(f64::total_cmp);
        let points = values
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i as f64, v))
            .collect();
        evb_plot::line_chart_svg(
            "Received payload by host, sorted",
            "hosts, slowest first",
            "Gb/s",
            &[Series {
                name: "received".into(),
                points,
            }],
        )
    };
    out.push_str(&figure(input.file, chart)?);
    Ok(out)
}

/// Link utilisation, busiest first, as a chart and a table of the ten
/// busiest links (with their credit wait).
fn busiest_links(input: &Input, root: &At) -> Result<String> {
    let mut out = String::new();
    out.push_str("<h3>Links</h3>\n");
    let mut links = Vec::new();
    for l in root.get("links").opt_array()? {
        links.push((
            l.get("link").opt_str()?.unwrap_or("?").to_string(),
            l.get("utilisation").f64()?,
            l.get("xmit_wait_s").f64()?,
        ));
    }
    links.sort_by(|a, b| b.1.total_cmp(&a.1));
    let util: Vec<(f64, f64)> = links
        .iter()
        .enumerate()
        .map(|(i, l)| (i as f64, l.1 * 100.0))
        .collect();
    out.push_str(&figure(
        input.file,
        evb_plot::line_chart_svg(
            "Link utilisation, busiest first",
            "links (output ports), sorted",
            "% busy",
            &[Series {
                name: "utilisation".into(),
                points: util,
            }],
        ),
    )?);
    let rows: Vec<Vec<Cell>> = links
        .iter()
        .take(10)
        .map(|(name, u, w)| {
            vec![
                Cell::new(name.clone()),
                Cell::num(format!("{:.1}", u * 100.0)),
                Cell::num(format!("{:.3}", w * 1e3)),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str(&format!(
            "<p>The {} busiest of {} links:</p>\n",
            rows.len(),
            count(links.len() as u64)
        ));
        out.push_str(&table(&["link", "utilisation %", "PortXmitWait ms"], &rows));
    }
    Ok(out)
}

/// Several simulations side by side.
pub(crate) fn compare(inputs: &[&Input]) -> Result<String> {
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for input in inputs {
        let s = Summary::read(&input.root.get("summary"))?;
        let figure_gbps = s.eb_built_gbps_per_node.unwrap_or(s.per_host_gbps);
        rows.push(vec![
            Cell::new(input.file.display().to_string()),
            Cell::new(format!("{} on {}", s.traffic, s.topology)),
            Cell::num(s.hosts.to_string()),
            Cell::num(format!("{:.1}", s.simulated_s * 1e6)),
            Cell::num(format!("{:.2}", s.per_host_gbps)),
            Cell::num(format!(
                "{:.1}",
                s.fraction_of_usable.unwrap_or(s.fraction_of_link) * 100.0
            )),
            Cell::num(fixed(s.eb_built_gbps_per_node, 2)),
            Cell::num(fixed(s.eb_latency_p99_us, 1)),
        ]);
        bars.push(Bar {
            label: short_name(input.file),
            value: figure_gbps,
        });
    }
    let mut out = table(
        &[
            "file",
            "traffic",
            "hosts",
            "simulated us",
            "received Gb/s per host, whole run",
            "% of usable (older files: of link)",
            "built Gb/s per node, steady state",
            "latency p99 us",
        ],
        &rows,
    );
    out.push_str(&figure(
        inputs[0].file,
        evb_plot::bar_chart_svg(
            "Built Gb/s per node (event builder, steady state) or received Gb/s per host",
            "simulation",
            "Gb/s",
            &bars,
        ),
    )?);
    Ok(out)
}
