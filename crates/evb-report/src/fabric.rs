//! `evb fabric conflicts --json` files: how the shift schedule loads the
//! fabric's links, step by step, and which links are shared most.

use std::fmt::Write;

use evb_plot::{Bar, Series};

use crate::html::{count, facts, short_name, table, Cell};
use crate::json::At;
use crate::{figure, Input, Result};

/// Worst links listed and charted.
const WORST_LINKS: usize = 20;
/// Widest row of the per-step heat map.
const MAX_GRID_COLUMNS: usize = 50;
/// Links (rows) of the links x steps heat map: the most loaded ones.
const MAX_LINK_ROWS: usize = 48;
/// Step columns of the links x steps heat map; more steps are binned.
const MAX_STEP_COLUMNS: usize = 128;

/// One link's row of `link_loads`.
struct LinkRow {
    name: String,
    loads: Vec<u64>,
}

/// `link_loads` of the file: the steps and every listed link's loads, or
/// `None` when the file has none (older evb, or over the cell budget).
fn link_loads(root: &At) -> Result<Option<(Vec<u64>, Vec<LinkRow>)>> {
    let ll = root.get("link_loads");
    if ll.is_null() {
        return Ok(None);
    }
    let steps: Vec<u64> = ll
        .get("steps")
        .array()?
        .iter()
        .map(At::u64)
        .collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for link in ll.get("links").array()? {
        let loads_at = link.get("loads");
        let raw = loads_at
            .value
            .as_array()
            .ok_or_else(|| loads_at.error("expected an array of flow counts"))?;
        if raw.len() != steps.len() {
            return Err(loads_at.error(format!("{} loads for {} steps", raw.len(), steps.len())));
        }
        let mut loads = Vec::with_capacity(raw.len());
        for (i, v) in raw.iter().enumerate() {
            match v.as_u64() {
                Some(x) => loads.push(x),
                // Only a bad cell pays for a field path.
                None => return Err(loads_at.array()?[i].u64().unwrap_err()),
            }
        }
        rows.push(LinkRow {
            name: link.get("name").str()?.to_string(),
            loads,
        });
    }
    Ok(Some((steps, rows)))
}

/// The links x steps heat map: the most shared links (by conflicts summed
/// over steps, then largest load), one row each; steps binned into at most
/// [`MAX_STEP_COLUMNS`] columns, a cell showing the largest load in its bin.
fn link_heat_map(input: &Input, steps: &[u64], links: &[LinkRow]) -> Result<String> {
    let mut ranked: Vec<(&LinkRow, u64, u64)> = links
        .iter()
        .map(|l| {
            let conflicts = l.loads.iter().map(|&c| c.saturating_sub(1)).sum::<u64>();
            let max = l.loads.iter().copied().max().unwrap_or(0);
            (l, conflicts, max)
        })
        .collect();
    ranked.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(b.2.cmp(&a.2))
            .then(a.0.name.cmp(&b.0.name))
    });
    ranked.truncate(MAX_LINK_ROWS);
    // The most shared link on top (plotters counts rows from the bottom).
    ranked.reverse();
    let bin = steps.len().div_ceil(MAX_STEP_COLUMNS).max(1);
    let columns = steps.len().div_ceil(bin);
    let grid: Vec<Vec<f64>> = ranked
        .iter()
        .map(|(l, _, _)| {
            l.loads
                .chunks(bin)
                .map(|c| c.iter().copied().max().unwrap_or(0) as f64)
                .collect()
        })
        .collect();
    // A column is labelled with its first step.
    let x_ticks: Vec<String> = (0..columns).map(|c| steps[c * bin].to_string()).collect();
    let y_ticks: Vec<String> = ranked.iter().map(|(l, _, _)| l.name.clone()).collect();
    let chart = if grid.is_empty() {
        Err(evb_plot::PlotError::Empty("the file lists no loaded links"))
    } else {
        evb_plot::heat_map_svg(
            "Link load per step (flows on each directed link)",
            if bin == 1 {
                "step"
            } else {
                "steps (binned; first step of each column)"
            },
            "directed link",
            &grid,
            &x_ticks,
            &y_ticks,
        )
    };
    let mut out = figure(input.file, chart)?;
    let _ = writeln!(
        out,
        "<p class=\"note\">Each row is one directed link, each column one step of the shift \
         schedule{}; the colour is the number of flows on the link (2 or more: the flows share \
         its bandwidth). {} of {} loaded links shown, the most shared first.</p>",
        if bin == 1 {
            String::new()
        } else {
            format!(" ({bin} steps a column, the largest load of them)")
        },
        ranked.len(),
        links.len()
    );
    Ok(out)
}

struct Totals {
    conflicts: u64,
    flows: u64,
    flows_on_shared_links: u64,
    max_link_load: u64,
    steps: u64,
    steps_with_conflicts: u64,
}

impl Totals {
    fn read(t: &At) -> Result<Totals> {
        Ok(Totals {
            conflicts: t.get("conflicts").u64()?,
            flows: t.get("flows").u64()?,
            flows_on_shared_links: t.get("flows_on_shared_links").u64()?,
            max_link_load: t.get("max_link_load").u64()?,
            steps: t.get("steps").u64()?,
            steps_with_conflicts: t.get("steps_with_conflicts").u64()?,
        })
    }
}

struct Step {
    step: u64,
    conflicts: u64,
    max_link_load: u64,
}

fn steps(root: &At) -> Result<Vec<Step>> {
    root.get("per_step")
        .array()?
        .iter()
        .map(|s| {
            Ok(Step {
                step: s.get("step").u64()?,
                conflicts: s.get("conflicts").u64()?,
                max_link_load: s.get("max_link_load").u64()?,
            })
        })
        .collect()
}

fn label(root: &At, key: &str) -> Result<String> {
    Ok(match root.get(key).value {
        serde_json::Value::Null => "?".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// `136 x 4xQDR (32 Gb/s), 23 x 4xDDR (16 Gb/s)` from `link_rates`, if
/// the file has them (evb before issue 19 did not write them).
fn link_rates(root: &At) -> Result<Option<String>> {
    let rates = root.get("link_rates").opt_array()?;
    if rates.is_empty() {
        return Ok(None);
    }
    let mut parts = Vec::new();
    for r in &rates {
        parts.push(format!(
            "{} x {} ({} Gb/s)",
            count(r.get("cables").u64()?),
            r.get("rate").str()?,
            gbps(r.get("gbps").f64()?)
        ));
    }
    Ok(Some(parts.join(", ")))
}

fn gbps(g: f64) -> String {
    if (g - g.round()).abs() < 1e-9 {
        format!("{}", g.round() as i64)
    } else {
        format!("{g:.2}")
    }
}

pub(crate) fn section(input: &Input) -> Result<String> {
    let root = &input.root;
    let totals = Totals::read(&root.get("total"))?;
    let mut rows = vec![
        ("topology", label(root, "topology")?),
        ("routing", label(root, "routing")?),
        ("rank order", label(root, "order")?),
        ("hosts", count(root.get("hosts").u64()?)),
        ("flows", count(totals.flows)),
        ("conflicts", count(totals.conflicts)),
        (
            "steps with conflicts",
            format!(
                "{} of {}",
                count(totals.steps_with_conflicts),
                count(totals.steps)
            ),
        ),
        ("flows on shared links", count(totals.flows_on_shared_links)),
        (
            "largest link load",
            format!("{} flows", totals.max_link_load),
        ),
        ("definition", label(root, "conflict_definition")?),
    ];
    if let Some(why) = root.get("routing_fallback").opt_str()? {
        rows.push(("why not the engine asked for", why.to_string()));
    }
    if let Some(conv) = root.get("step_convention").opt_str()? {
        rows.push(("step convention", conv.to_string()));
    }
    if let Some(rates) = link_rates(root)? {
        rows.push(("links", rates));
    }
    let mut out = facts(&rows);
    out.push_str(&degraded_links(root)?);

    let steps = steps(root)?;
    out.push_str("<h3>Link load per step</h3>\n");
    if let Some((load_steps, links)) = link_loads(root)? {
        out.push_str(&link_heat_map(input, &load_steps, &links)?);
    } else {
        out.push_str(&busiest_link_grid(input, &steps)?);
    }
    let conflicts: Vec<(f64, f64)> = steps
        .iter()
        .map(|s| (s.step as f64, s.conflicts as f64))
        .collect();
    out.push_str(&figure(
        input.file,
        evb_plot::line_chart_svg(
            "Conflicts per step",
            "step",
            "conflicts",
            &[Series {
                name: "conflicts".into(),
                points: conflicts,
            }],
        ),
    )?);

    out.push_str(&most_shared_links(input, root)?);
    Ok(out)
}

/// The links shared by the most flows (`worst_links`, the first
/// WORST_LINKS): a bar chart of their conflicts and a table; nothing when
/// no link is shared.
fn most_shared_links(input: &Input, root: &At) -> Result<String> {
    let mut out = String::new();
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for l in root
        .get("worst_links")
        .opt_array()?
        .iter()
        .take(WORST_LINKS)
    {
        let name = format!(
            "{} port {} -> {} port {}",
            l.get("node").str()?,
            l.get("port").u64()?,
            l.get("to").str()?,
            l.get("to_port").u64()?
        );
        let conflicts = l.get("conflicts").u64()?;
        let rate = match (l.get("rate").opt_str()?, l.get("gbps").opt_f64()?) {
            (Some(r), Some(g)) => format!("{r} ({} Gb/s)", gbps(g)),
            _ => "?".into(),
        };
        rows.push(vec![
            Cell::new(name.clone()),
            Cell::new(rate),
            Cell::num(count(conflicts)),
            Cell::num(count(l.get("steps_shared").u64()?)),
            Cell::num(l.get("max_load").u64()?.to_string()),
        ]);
        bars.push(Bar {
            label: format!("{}:{}", l.get("node").str()?, l.get("port").u64()?),
            value: conflicts as f64,
        });
    }
    if !rows.is_empty() {
        out.push_str("<h3>Most shared links</h3>\n");
        out.push_str(&figure(
            input.file,
            evb_plot::bar_chart_svg(
                "Conflicts on the most shared links, over all steps",
                "link (switch:port)",
                "conflicts",
                &bars,
            ),
        )?);
        out.push_str(&table(
            &[
                "directed link",
                "rate",
                "conflicts",
                "steps shared",
                "max load",
            ],
            &rows,
        ));
    }
    Ok(out)
}

/// Links slower than most of their tier (`degraded_links`), as a table.
fn degraded_links(root: &At) -> Result<String> {
    let links = root.get("degraded_links").opt_array()?;
    if links.is_empty() {
        return Ok(String::new());
    }
    let mut rows = Vec::new();
    for l in &links {
        rows.push(vec![
            Cell::new(format!(
                "{} port {} -> {} port {}",
                l.get("node").str()?,
                l.get("port").u64()?,
                l.get("to").str()?,
                l.get("to_port").u64()?
            )),
            Cell::new(format!(
                "{} ({} Gb/s)",
                l.get("rate").str()?,
                gbps(l.get("gbps").f64()?)
            )),
            Cell::new(format!(
                "{} ({} Gb/s): {} of {} {}",
                l.get("usual_rate").str()?,
                gbps(l.get("usual_gbps").f64()?),
                count(l.get("tier_usual").u64()?),
                count(l.get("tier_links").u64()?),
                l.get("tier").str()?
            )),
        ]);
    }
    let mut out = format!(
        "<h3>Degraded links</h3>\n<p class=\"note\">{} link(s) run slower than most links of their tier.</p>\n",
        count(links.len() as u64)
    );
    out.push_str(&table(&["link", "rate", "usual in its tier"], &rows));
    Ok(out)
}

/// Without per-link loads: the busiest link's load in each step, the steps
/// wrapped into a grid row by row.
fn busiest_link_grid(input: &Input, steps: &[Step]) -> Result<String> {
    let mut out = String::new();
    // Steps wrapped into a grid, row by row, so that thousands of steps fit.
    let columns = (steps.len() as f64)
        .sqrt()
        .ceil()
        .clamp(1.0, MAX_GRID_COLUMNS as f64) as usize;
    let grid_rows = steps.len().div_ceil(columns);
    let mut grid = vec![vec![0.0; columns]; grid_rows];
    for (i, s) in steps.iter().enumerate() {
        grid[i / columns][i % columns] = s.max_link_load as f64;
    }
    let x_ticks: Vec<String> = (0..columns).map(|c| format!("+{c}")).collect();
    let y_ticks: Vec<String> = (0..grid_rows)
        .map(|r| {
            steps
                .get(r * columns)
                .map_or(String::new(), |s| s.step.to_string())
        })
        .collect();
    let chart = if steps.is_empty() {
        Err(evb_plot::PlotError::Empty("the file has no steps"))
    } else {
        evb_plot::heat_map_svg(
            "Most loaded link in each step (flows on it)",
            "step offset in the row",
            "first step of the row",
            &grid,
            &x_ticks,
            &y_ticks,
        )
    };
    out.push_str(&figure(input.file, chart)?);
    out.push_str(
        "<p class=\"note\">Each cell is one step of the shift schedule; its colour is the load \
         of the busiest directed link in that step (1 = no sharing). Cells after the last step are 0.</p>\n",
    );
    out.push_str(
        "<p class=\"note\">This file has no per-link loads (<code>link_loads</code>: written by an older evb, or more \
         links x steps than <code>--link-loads-max-cells</code>).</p>\n",
    );
    Ok(out)
}

/// Several fabric analyses (orders, routings) side by side.
pub(crate) fn compare(inputs: &[&Input]) -> Result<String> {
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for input in inputs {
        let root = &input.root;
        let t = Totals::read(&root.get("total"))?;
        rows.push(vec![
            Cell::new(input.file.display().to_string()),
            Cell::new(label(root, "topology")?),
            Cell::new(label(root, "routing")?),
            Cell::new(label(root, "order")?),
            Cell::num(count(t.conflicts)),
            Cell::num(format!("{} / {}", t.steps_with_conflicts, t.steps)),
            Cell::num(t.max_link_load.to_string()),
        ]);
        bars.push(Bar {
            label: short_name(input.file),
            value: t.conflicts as f64,
        });
    }
    let mut out = table(
        &[
            "file",
            "topology",
            "routing",
            "order",
            "conflicts",
            "steps with conflicts",
            "max link load",
        ],
        &rows,
    );
    out.push_str(&figure(
        inputs[0].file,
        evb_plot::bar_chart_svg("Conflicts, by analysis", "analysis", "conflicts", &bars),
    )?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use std::path::PathBuf;

    /// Rates, the fallback and degraded links show when the file has them.
    #[test]
    fn rates_fallback_and_degraded_links() {
        let fabric = json!({"conflict_definition": "d", "hosts": 2,
            "topology": "t", "routing": "minhop routing by evb (ftree fell back to minhop, as OpenSM does)",
            "routing_fallback": "ftree: not a fat tree",
            "step_convention": "receive: in step s rank i receives from rank i+s",
            "link_rates": [{"rate": "4xQDR", "gbps": 32.0, "cables": 136},
                           {"rate": "4xFDR", "gbps": 54.54545454, "cables": 2}],
            "degraded_links": [{"node": "r422node2", "port": 1, "to": "S-0008f10500200b50",
                "to_port": 4, "rate": "4xDDR", "gbps": 16.0, "usual_rate": "4xQDR",
                "usual_gbps": 32.0, "tier": "host links", "tier_links": 89, "tier_usual": 66}],
            "worst_links": [{"node": "a", "port": 1, "to": "b", "to_port": 2, "conflicts": 3,
                "steps_shared": 2, "max_load": 2, "rate": "4xQDR", "gbps": 32.0}],
            "per_step": [{"step": 1, "conflicts": 0, "max_link_load": 1}],
            "total": {"conflicts": 3, "flows": 2, "flows_on_shared_links": 2,
                "max_link_load": 2, "steps": 1, "steps_with_conflicts": 1}});
        let html = crate::render(&[(PathBuf::from("f.json"), fabric)]).unwrap();
        for want in [
            "136 x 4xQDR (32 Gb/s), 2 x 4xFDR (54.55 Gb/s)",
            "ftree: not a fat tree",
            "receive: in step s rank i receives from rank i+s",
            "<h3>Degraded links</h3>",
            "r422node2 port 1 -&gt; S-0008f10500200b50 port 4",
            "4xQDR (32 Gb/s): 66 of 89 host links",
            "<td>4xQDR (32 Gb/s)</td>",
        ] {
            assert!(html.contains(want), "no {want}");
        }
    }
}
