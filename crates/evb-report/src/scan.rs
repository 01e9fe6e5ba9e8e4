//! `evb scan --json` files: the heat map over two scanned parameters
//! (credits x parallel sends when both were scanned) and the ranking.

use evb_plot::Bar;

use crate::html::{esc, fixed, short_name, table, Cell};
use crate::json::At;
use crate::{figure, Input, Result};

/// The axes the heat map prefers, when the scan has them.
const PREFERRED_ROWS: &str = "event_builder.credits";
const PREFERRED_COLUMNS: &str = "event_builder.parallel_sends";
/// Points listed in the ranking table.
const RANKED: usize = 20;

struct Point {
    params: Vec<(String, String)>,
    figure_gbps: f64,
    /// What crossed a link, of its usable payload rate (`evb scan`'s
    /// `% of usable`; absent from older files).
    fraction_of_usable: Option<f64>,
}

struct Scan {
    axes: Vec<String>,
    points: Vec<Point>,
    total_points: Option<u64>,
}

impl Scan {
    fn read(root: &At) -> Result<Scan> {
        let axes = root
            .get("axes")
            .array()?
            .iter()
            .map(|a| a.str().map(str::to_string))
            .collect::<Result<Vec<_>>>()?;
        let mut points = Vec::new();
        for p in root.get("points").array()? {
            let params_at = p.get("params");
            let mut params = Vec::new();
            for kv in params_at.array()? {
                let pair = kv.array()?;
                if pair.len() != 2 {
                    return Err(kv.error("expected [key, value]"));
                }
                params.push((pair[0].str()?.to_string(), pair[1].str()?.to_string()));
            }
            if params.len() != axes.len() {
                return Err(params_at.error(format!(
                    "{} values for {} axes",
                    params.len(),
                    axes.len()
                )));
            }
            points.push(Point {
                params,
                figure_gbps: p.get("figure_gbps").f64()?,
                fraction_of_usable: p.get("fraction_of_usable").opt_f64()?,
            });
        }
        Ok(Scan {
            axes,
            points,
            total_points: root.get("total_points").opt_u64()?,
        })
    }

    fn best(&self) -> Option<&Point> {
        self.points
            .iter()
            .max_by(|a, b| a.figure_gbps.total_cmp(&b.figure_gbps))
    }
}

/// Values of axis `a` in the order first met.
fn values(scan: &Scan, a: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in &scan.points {
        if !out.contains(&p.params[a].1) {
            out.push(p.params[a].1.clone());
        }
    }
    // Numeric axes read better in numeric order.
    if out.iter().all(|v| v.parse::<f64>().is_ok()) {
        out.sort_by(|a, b| {
            a.parse::<f64>()
                .unwrap_or(0.0)
                .total_cmp(&b.parse().unwrap_or(0.0))
        });
    }
    out
}

/// Rows and columns for the heat map: credits x parallel sends when scanned,
/// else the first two axes.
fn heat_axes(axes: &[String]) -> Option<(usize, usize)> {
    let find = |name: &str| axes.iter().position(|a| a == name);
    match (find(PREFERRED_ROWS), find(PREFERRED_COLUMNS)) {
        (Some(r), Some(c)) => Some((r, c)),
        _ if axes.len() >= 2 => Some((0, 1)),
        _ => None,
    }
}

pub(crate) fn section(input: &Input) -> Result<String> {
    let scan = Scan::read(&input.root)?;
    let mut out = String::new();
    let shard = input.root.get("shard");
    out.push_str(&format!(
        "<p>{} points{} over {}.{}</p>\n",
        scan.points.len(),
        scan.total_points
            .filter(|&t| t != scan.points.len() as u64)
            .map_or(String::new(), |t| format!(" of {t}")),
        esc(&scan.axes.join(" x ")),
        if shard.is_null() {
            String::new()
        } else {
            format!(" Shard {}.", esc(&shard.value.to_string()))
        }
    ));
    if let Some(best) = scan.best() {
        let params: Vec<String> = best
            .params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push_str(&format!(
            "<p>Best: <b>{:.2} Gb/s</b> with {}.</p>\n",
            best.figure_gbps,
            esc(&params.join(" "))
        ));
    }

    if let Some((r, c)) = heat_axes(&scan.axes) {
        let ys = values(&scan, r);
        let xs = values(&scan, c);
        let mut rows = vec![vec![0.0f64; xs.len()]; ys.len()];
        for p in &scan.points {
            let y = ys.iter().position(|v| *v == p.params[r].1);
            let x = xs.iter().position(|v| *v == p.params[c].1);
            if let (Some(y), Some(x)) = (y, x) {
                rows[y][x] = rows[y][x].max(p.figure_gbps);
            }
        }
        let title = if scan.axes.len() > 2 {
            "Gb/s, best over the other scanned parameters"
        } else {
            "Gb/s"
        };
        out.push_str("<h3>Heat map</h3>\n");
        out.push_str(&figure(
            input.file,
            evb_plot::heat_map_svg(title, &scan.axes[c], &scan.axes[r], &rows, &xs, &ys),
        )?);
    } else if let Some(axis) = scan.axes.first() {
        let xs = values(&scan, 0);
        let bars: Vec<Bar> = xs
            .iter()
            .map(|x| Bar {
                label: x.clone(),
                value: scan
                    .points
                    .iter()
                    .filter(|p| p.params[0].1 == *x)
                    .map(|p| p.figure_gbps)
                    .fold(0.0, f64::max),
            })
            .collect();
        out.push_str(&figure(
            input.file,
            evb_plot::bar_chart_svg("Gb/s by scanned value", axis, "Gb/s", &bars),
        )?);
    }

    let mut ranked: Vec<&Point> = scan.points.iter().collect();
    ranked.sort_by(|a, b| b.figure_gbps.total_cmp(&a.figure_gbps));
    let mut head = vec!["rank", "Gb/s", "% of usable"];
    head.extend(scan.axes.iter().map(String::as_str));
    let rows: Vec<Vec<Cell>> = ranked
        .iter()
        .take(RANKED)
        .enumerate()
        .map(|(i, p)| {
            let mut row = vec![
                Cell::num((i + 1).to_string()),
                Cell::num(format!("{:.2}", p.figure_gbps)),
                Cell::num(fixed(p.fraction_of_usable.map(|f| f * 100.0), 1)),
            ];
            row.extend(p.params.iter().map(|(_, v)| Cell::new(v.clone())));
            row
        })
        .collect();
    out.push_str(&format!(
        "<h3>Ranking ({} best of {})</h3>\n",
        rows.len(),
        scan.points.len()
    ));
    out.push_str(&table(&head, &rows));
    Ok(out)
}

/// Several scans: their best points side by side.
pub(crate) fn compare(inputs: &[&Input]) -> Result<String> {
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for input in inputs {
        let scan = Scan::read(&input.root)?;
        let best = scan.best();
        rows.push(vec![
            Cell::new(input.file.display().to_string()),
            Cell::new(scan.axes.join(" x ")),
            Cell::num(scan.points.len().to_string()),
            Cell::num(fixed(best.map(|b| b.figure_gbps), 2)),
            Cell::new(best.map_or(String::new(), |b| {
                b.params
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })),
        ]);
        bars.push(Bar {
            label: short_name(input.file),
            value: best.map_or(0.0, |b| b.figure_gbps),
        });
    }
    let mut out = table(
        &["file", "axes", "points", "best Gb/s", "best point"],
        &rows,
    );
    out.push_str(&figure(
        inputs[0].file,
        evb_plot::bar_chart_svg("Best Gb/s, by scan", "scan", "Gb/s", &bars),
    )?);
    Ok(out)
}
