//! `evb plan --json` files: the requirement, the designs ranked with
//! their switches, cables, cost, conflicts, schedule and predicted rate,
//! and the Pareto plot of cost against predicted rate.

use std::fmt::Write;

use crate::html::{esc, facts, fixed, table, Cell};
use crate::json::At;
use crate::{figure, Input, Result};

/// Designs listed.
const MAX_ROWS: usize = 40;

/// One design as the report reads it.
struct Row {
    rank: u64,
    name: String,
    cost: f64,
    predicted: f64,
    by_sim: bool,
    meets: bool,
}

fn read_row(d: &At) -> Result<Row> {
    Ok(Row {
        rank: d.get("rank").u64()?,
        name: d.get("name").str()?.to_string(),
        cost: d.get("cost").get("total").f64()?,
        predicted: d.get("predicted_gbps_per_node").f64()?,
        by_sim: d.get("predicted_by").str()? == "sim",
        meets: d.get("meets_requirement").value.as_bool().unwrap_or(false),
    })
}

pub(crate) fn section(input: &Input) -> Result<String> {
    let root = &input.root;
    let req = root.get("requirement");
    let currency = req.get("currency").str()?.to_string();
    let timing = root.get("timing");
    let mut out = facts(&[
        ("nodes", req.get("nodes").u64()?.to_string()),
        (
            "Gb/s each must build",
            format!("{:.1}", req.get("gbps_per_node").f64()?),
        ),
        (
            "aggregate",
            format!("{:.2} Tb/s", req.get("aggregate_tbps").f64()?),
        ),
        (
            "prices",
            req.get("prices").opt_str()?.unwrap_or("").to_string(),
        ),
        (
            "time",
            format!(
                "{:.1} s: {} fabrics analysed in {:.1} s, {} simulations in {:.1} s",
                timing.get("total_s").f64()?,
                timing.get("fabrics_analysed").u64()?,
                timing.get("analysis_wall_s").f64()?,
                timing.get("simulations").u64()?,
                timing.get("simulation_wall_s").f64()?
            ),
        ),
    ]);
    let designs = root.get("designs").array()?;
    let mut rows = Vec::new();
    let mut points = Vec::new();
    for d in &designs {
        let r = read_row(d)?;
        points.push(r);
        if rows.len() >= MAX_ROWS {
            continue;
        }
        let cables = d.get("cables");
        rows.push(vec![
            Cell::num(d.get("rank").u64()?.to_string()),
            Cell::new(d.get("name").str()?),
            Cell::num(d.get("switch_count").u64()?.to_string()),
            Cell::num(format!(
                "{}/{}/{}",
                cables.get("dac").u64()?,
                cables.get("active_copper").u64()?,
                cables.get("optics").u64()?
            )),
            Cell::num(format!("{:.0}", d.get("cost").get("total").f64()? / 1000.0)),
            Cell::num(format!("{:.2}", d.get("bisection_gbps").f64()? / 1000.0)),
            Cell::num(d.get("conflicts").u64()?.to_string()),
            Cell::num(format!(
                "{} ({})",
                d.get("slots").u64()?,
                d.get("lower_bound").u64()?
            )),
            Cell::num(format!(
                "{} {}",
                fixed(Some(d.get("predicted_gbps_per_node").f64()?), 2),
                if d.get("predicted_by").str()? == "sim" {
                    "sim"
                } else {
                    "est"
                }
            )),
            margin_cell(d.get("margin").f64()?),
        ]);
    }
    let cost_head = format!("cost k{currency}");
    out.push_str(&table(
        &[
            "#",
            "design",
            "switches",
            "cables DAC/AC/optics",
            &cost_head,
            "bisection Tb/s",
            "conflicts",
            "slots (bound)",
            "Gb/s per node",
            "margin",
        ],
        &rows,
    ));
    if designs.len() > MAX_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} more designs in the file.</p>",
            designs.len() - MAX_ROWS
        );
    }
    out.push_str(&pareto(
        input,
        &points,
        req.get("gbps_per_node").f64()?,
        &currency,
    )?);
    Ok(out)
}

fn margin_cell(m: f64) -> Cell {
    let c = Cell::num(format!("{:+.1} %", m * 100.0));
    if m >= 0.0 {
        c.with_class("ok")
    } else {
        c.with_class("bad")
    }
}

/// The Pareto plot: cost against predicted rate, simulated and estimated
/// designs apart, the requirement as a line.
fn pareto(input: &Input, points: &[Row], required: f64, currency: &str) -> Result<String> {
    let pick = |sim: bool| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter(|r| r.by_sim == sim)
            .map(|r| (r.cost / 1000.0, r.predicted))
            .collect()
    };
    let (x0, x1) = points.iter().fold((f64::INFINITY, 0.0f64), |(a, b), r| {
        (a.min(r.cost / 1000.0), b.max(r.cost / 1000.0))
    });
    let series = vec![
        evb_plot::Series {
            name: "simulated (evb sim)".into(),
            points: pick(true),
        },
        evb_plot::Series {
            name: "estimated".into(),
            points: pick(false),
        },
        evb_plot::Series {
            name: format!("~required {required:.1} Gb/s"),
            points: vec![(x0, required), (x1, required)],
        },
    ];
    let labels: Vec<(f64, f64, String)> = points
        .iter()
        .filter(|r| r.meets)
        .take(3)
        .map(|r| (r.cost / 1000.0, r.predicted, format!("  #{}", r.rank)))
        .collect();
    let chart = evb_plot::scatter_chart_svg(
        "Cost against predicted rate",
        &format!("cost, k{currency}"),
        "Gb/s built per node",
        &series,
        &labels,
    );
    let best = points.iter().find(|r| r.meets).map_or_else(
        || "no design builds what is required".to_string(),
        |r| {
            format!(
                "the cheapest design that builds what is required: #{} {}",
                r.rank,
                esc(&r.name)
            )
        },
    );
    Ok(format!(
        "<h3>Cost against predicted rate</h3>\n<p class=\"note\">{best}.</p>\n{}",
        figure(input.file, chart)?
    ))
}

pub(crate) fn compare(inputs: &[&Input]) -> Result<String> {
    let mut rows = Vec::new();
    for input in inputs {
        let req = input.root.get("requirement");
        let designs = input.root.get("designs").array()?;
        let best = designs.iter().map(read_row).collect::<Result<Vec<_>>>()?;
        let best = best.iter().find(|r| r.meets);
        rows.push(vec![
            Cell::new(input.file.display().to_string()),
            Cell::num(req.get("nodes").u64()?.to_string()),
            Cell::num(format!("{:.1}", req.get("gbps_per_node").f64()?)),
            Cell::new(best.map_or("none".into(), |r| r.name.clone())),
            Cell::num(best.map_or("\u{2013}".into(), |r| format!("{:.0}", r.cost / 1000.0))),
            Cell::num(fixed(best.map(|r| r.predicted), 2)),
        ]);
    }
    Ok(table(
        &[
            "file",
            "nodes",
            "Gb/s each",
            "cheapest design that builds it",
            "cost k",
            "Gb/s per node",
        ],
        &rows,
    ))
}
