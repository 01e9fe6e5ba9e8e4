//! `evb fabric diagnose --json` files: what the counters measured, the
//! fabric drawn with its waiting cables, the remedies best first with
//! the rate each is predicted to give, what is wrong with the fabric and
//! the links the shift overloads.

use std::fmt::Write;

use crate::html::{esc, facts, fixed, table, Cell};
use crate::json::At;
use crate::{figure, Input, Result};

/// Shared links and hot ports listed.
const MAX_ROWS: usize = 12;

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "\u{2013}".into(), |x| format!("{:.1} %", 100.0 * x))
}

/// The ports of an entry, comma separated.
fn ports(at: &At) -> Result<String> {
    let v: Vec<&str> = at
        .get("ports")
        .array()?
        .iter()
        .map(At::str)
        .collect::<Result<_>>()?;
    Ok(v.join(", "))
}

pub(crate) fn section(input: &Input) -> Result<String> {
    let root = &input.root;
    let m = root.get("measured");
    let b = root.get("baseline");
    let rows = vec![
        ("topology", root.get("topology").str()?.to_string()),
        ("routing", root.get("routing").str()?.to_string()),
        ("rank order", root.get("order").str()?.to_string()),
        ("ranks", root.get("hosts").u64()?.to_string()),
        (
            "interval",
            format!("{:.6} s", root.get("interval_s").f64()?),
        ),
        (
            "PortXmitWait tick",
            root.get("xmit_wait_tick").str()?.to_string(),
        ),
        (
            "hosts receive (mean)",
            format!(
                "{} Gb/s ({})",
                fixed(m.get("host_gbps_mean").opt_f64()?, 1),
                pct(m.get("host_utilisation_mean").opt_f64()?)
            ),
        ),
        (
            "ports waiting for credits",
            format!(
                "{} (most: {} at {})",
                m.get("ports_waiting").u64()?,
                pct(Some(m.get("max_wait").f64()?)),
                m.get("max_wait_link").str()?
            ),
        ),
        (
            "shift conflicts on these tables",
            b.get("conflicts").u64()?.to_string(),
        ),
        (
            "predicted now",
            format!(
                "{} Gb/s per node ({}); shift estimate {}",
                fixed(b.get("predicted_gbps_per_node").opt_f64()?, 1),
                b.get("prediction").str()?,
                fixed(Some(b.get("estimated_gbps_per_node").f64()?), 1)
            ),
        ),
    ];
    let mut out = facts(&rows);
    out.push_str("<h3>The fabric: cables by time waiting for credits</h3>\n");
    out.push_str(&map(input)?);
    out.push_str("<h3>Remedies, best first</h3>\n");
    out.push_str(&remedies(root)?);
    out.push_str("<h3>Findings</h3>\n");
    out.push_str(&findings(root)?);
    out.push_str(&slow_steps(root)?);
    out.push_str("<h3>Links the shift overloads, most waited on first</h3>\n");
    out.push_str(&shared(root)?);
    for n in root.get("notes").opt_array()? {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(n.str()?));
    }
    Ok(out)
}

/// The drawing of the file, drawn.
fn map(input: &Input) -> Result<String> {
    let d = input.root.get("drawing");
    let nodes = d
        .get("nodes")
        .array()?
        .iter()
        .map(|n| {
            Ok(evb_plot::MapNode {
                label: n.get("label").str()?.to_string(),
                level: u32::try_from(n.get("level").u64()?).unwrap_or(u32::MAX),
                x: n.get("x").f64()?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let count = nodes.len();
    let links = d
        .get("links")
        .array()?
        .iter()
        .map(|l| {
            let end = |k: &str| -> Result<usize> {
                let at = l.get(k);
                let i = at.u64()? as usize;
                if i >= count {
                    return Err(at.error(format!("node {i} of {count}")));
                }
                Ok(i)
            };
            Ok(evb_plot::MapLink {
                a: end("a")?,
                b: end("b")?,
                heat: (l.get("wait").f64()? * 2.0).min(1.0),
                weight: l.get("utilisation").f64()?,
                highlight: l.get("highlight").value.as_bool().unwrap_or(false),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut routes = Vec::new();
    let mut labels = Vec::new();
    for r in d.get("routes").opt_array()? {
        let hops = r
            .get("nodes")
            .array()?
            .iter()
            .map(|n| n.u64().map(|i| i as usize))
            .collect::<Result<Vec<_>>>()?;
        routes.push(hops);
        labels.push(r.get("label").str()?.to_string());
    }
    let mut legend = format!(
        "colour: time waiting (green 0, red 50 % or more); width: utilisation\nblue: {}",
        d.get("highlight").str()?
    );
    if !labels.is_empty() {
        legend += &format!(
            "\npurple: {} sharing {}",
            labels.join(", "),
            d.get("routes_share").str()?
        );
    }
    let map = evb_plot::FabricMap {
        title: "Waiting for credits per cable",
        legend: &legend,
        nodes: &nodes,
        links: &links,
        routes: &routes,
    };
    figure(input.file, evb_plot::fabric_map_svg(&map))
}

fn remedies(root: &At) -> Result<String> {
    let mut rows = Vec::new();
    for (i, r) in root.get("remedies").array()?.iter().enumerate() {
        rows.push(vec![
            Cell::num((i + 1).to_string()),
            Cell::new(r.get("kind").str()?),
            Cell::new(ports(r)?),
            Cell::num(fixed(r.get("predicted_gbps_per_node").opt_f64()?, 1)),
            Cell::num(fixed(Some(r.get("estimated_gbps_per_node").f64()?), 1)),
            Cell::num(r.get("conflicts").u64()?.to_string()),
            Cell::new(format!(
                "{} \u{2014} {}",
                r.get("what").str()?,
                r.get("apply").str()?
            )),
        ]);
    }
    if rows.is_empty() {
        return Ok("<p class=\"note\">None: no remedy changes the shift.</p>\n".into());
    }
    Ok(table(
        &[
            "#",
            "kind",
            "ports",
            "predicted Gb/s per node",
            "estimate",
            "conflicts",
            "what, and how to apply it",
        ],
        &rows,
    ))
}

/// The measured waiting, summed over ports, that the links carry (a
/// share of it: `blame` over that).
fn total_wait(root: &At) -> Result<f64> {
    Ok(root.get("explained_wait").f64()? + root.get("unexplained_wait").f64()?)
}

fn share(blame: f64, total: f64) -> String {
    pct((total > 0.0).then(|| blame / total))
}

fn findings(root: &At) -> Result<String> {
    let total = total_wait(root)?;
    let mut rows = Vec::new();
    for f in root.get("findings").array()? {
        rows.push(vec![
            Cell::new(f.get("kind").str()?),
            Cell::new(ports(&f)?),
            Cell::new(f.get("what").str()?),
            Cell::num(f.get("explains").array()?.len().to_string()),
            Cell::num(share(f.get("blame").f64()?, total)),
        ]);
    }
    if rows.is_empty() {
        return Ok(
            "<p class=\"note\">None: the cabling is regular, the rates as usual, no errors.</p>\n"
                .into(),
        );
    }
    Ok(table(
        &[
            "kind",
            "ports",
            "what",
            "links it explains",
            "of the waiting measured",
        ],
        &rows,
    ))
}

fn shared(root: &At) -> Result<String> {
    let total = total_wait(root)?;
    let mut rows = Vec::new();
    for s in root.get("shared_links").array()?.iter().take(MAX_ROWS) {
        let steps: Vec<String> = s
            .get("steps")
            .array()?
            .iter()
            .take(8)
            .map(|x| x.u64().map(|v| v.to_string()))
            .collect::<Result<_>>()?;
        let pairs: Vec<String> = s
            .get("pairs")
            .array()?
            .iter()
            .take(4)
            .map(|p| {
                let a = p.array()?;
                match a.as_slice() {
                    [x, y] => Ok(format!("{}\u{2192}{}", x.u64()?, y.u64()?)),
                    _ => Err(p.error("expected a pair of ranks")),
                }
            })
            .collect::<Result<_>>()?;
        rows.push(vec![
            Cell::new(s.get("link").str()?),
            Cell::num(s.get("conflicts").u64()?.to_string()),
            Cell::new(format!(
                "{} ({} in all)",
                steps.join(", "),
                s.get("steps_shared").u64()?
            )),
            Cell::new(pairs.join(", ")),
            Cell::num(share(s.get("blame").f64()?, total)),
            Cell::num(pct(s.get("utilisation").opt_f64()?)),
        ]);
    }
    if rows.is_empty() {
        return Ok("<p class=\"note\">None: no step of the shift asks more of a link than it carries.</p>\n".into());
    }
    Ok(table(
        &[
            "link",
            "conflicts",
            "steps",
            "rank pairs",
            "of the waiting measured",
            "utilisation",
        ],
        &rows,
    ))
}

/// Several diagnoses side by side: the rate predicted now and after the
/// best remedy of each.
pub(crate) fn compare(inputs: &[&Input]) -> Result<String> {
    let mut rows = Vec::new();
    for input in inputs {
        let root = &input.root;
        let first = root.get("remedies").opt_array()?.into_iter().next();
        let (kind, after) = match &first {
            Some(r) => (
                format!("{} [{}]", r.get("kind").str()?, ports(r)?),
                r.get("predicted_gbps_per_node").opt_f64()?,
            ),
            None => ("none".to_string(), None),
        };
        rows.push(vec![
            Cell::new(crate::html::short_name(input.file)),
            Cell::num(fixed(
                root.get("baseline")
                    .get("predicted_gbps_per_node")
                    .opt_f64()?,
                1,
            )),
            Cell::new(kind),
            Cell::num(fixed(after, 1)),
        ]);
    }
    Ok(table(
        &[
            "file",
            "predicted now, Gb/s per node",
            "best remedy",
            "predicted after it",
        ],
        &rows,
    ))
}

/// The run's slow steps (`--run`), each with the links it overloads.
fn slow_steps(root: &At) -> Result<String> {
    let steps = root.get("slow_steps").opt_array()?;
    if steps.is_empty() {
        return Ok(String::new());
    }
    let mut rows = Vec::new();
    for st in &steps {
        let links: Vec<String> = st
            .get("links")
            .array()?
            .iter()
            .take(6)
            .map(|l| {
                let pair = l.array()?;
                match pair.as_slice() {
                    [name, flows] => Ok(format!("{} ({} flows)", name.str()?, flows.u64()?)),
                    _ => Err(l.error("expected a link and its flows")),
                }
            })
            .collect::<Result<_>>()?;
        rows.push(vec![
            Cell::num(st.get("step").u64()?.to_string()),
            Cell::num(format!("{:.1}", st.get("gbps").f64()?)),
            Cell::num(format!("{:.1}", st.get("median_gbps").f64()?)),
            Cell::new(links.join(", ")),
        ]);
    }
    Ok(format!(
        "<h3>Slow steps of the run</h3>\n{}",
        table(
            &["step", "Gb/s", "median Gb/s", "links it overloads"],
            &rows
        )
    ))
}
