//! `evb-report`: one self-contained HTML page from the JSON files evb writes
//! (`evb run --json`, `evb sim --json`, `evb scan --json`, `evb fabric
//! conflicts --json`, `evb fabric diagnose --json`, `evb plan --json`).
//!
//! Why a single file: reports are mailed, attached to issues and opened on
//! machines next to a DAQ with no internet access, so the page carries its
//! charts as inline SVG and its style as inline CSS, and loads nothing.
//!
//! Why it reads `serde_json::Value`s: each file's kind is recognised from its
//! content, and a file that is not one evb wrote, or lacks a field, gets an
//! error naming the file and the field instead of a panic or a blank chart.

mod diagnose;
mod fabric;
mod html;
mod json;
mod plan;
mod run;
mod scan;
mod sim;

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use html::esc;
use json::At;

/// Input files larger than this are refused before they are read.
pub const MAX_INPUT_BYTES: u64 = 512 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {size} bytes is more than the {limit} a report reads", file.display())]
    TooLarge {
        file: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{}: not a file evb wrote: not JSON ({message} at line {line}, column {column})", file.display())]
    NotJson {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: not a file evb wrote: {reason}", file.display())]
    NotEvb { file: PathBuf, reason: String },
    #[error("{}: field `{field}`: {problem}", file.display())]
    Field {
        file: PathBuf,
        field: String,
        problem: String,
    },
    #[error("drawing a chart for {}: {source}", file.display())]
    Plot {
        file: PathBuf,
        source: evb_plot::PlotError,
    },
    #[error("a report needs at least one input file")]
    NoInputs,
}

pub type Result<T, E = ReportError> = std::result::Result<T, E>;

/// What wrote a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `evb run --json` (`"kind": "evb-run"`).
    Run,
    /// `evb sim --json` (`"kind": "evb-sim"`).
    Sim,
    /// `evb scan --json` and `evb scan merge --json` (`"kind": "evb-scan"`).
    Scan,
    /// `evb fabric conflicts --json` (no `kind`; has `conflict_definition`).
    FabricConflicts,
    /// `evb fabric diagnose --json` (`"kind": "evb-fabric-diagnose"`).
    FabricDiagnose,
    /// `evb plan --json` (`"kind": "evb-plan"`).
    Plan,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Run => "evb run",
            Kind::Sim => "evb sim",
            Kind::Scan => "evb scan",
            Kind::FabricConflicts => "evb fabric conflicts",
            Kind::FabricDiagnose => "evb fabric diagnose",
            Kind::Plan => "evb plan",
        }
    }
}

/// Reads and parses one input file, with errors that name it.
pub fn load(file: &Path) -> Result<Value> {
    let read_error = |source| ReportError::Read {
        file: file.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(file).map_err(read_error)?.len();
    if size > MAX_INPUT_BYTES {
        return Err(ReportError::TooLarge {
            file: file.to_path_buf(),
            size,
            limit: MAX_INPUT_BYTES,
        });
    }
    let bytes = std::fs::read(file).map_err(read_error)?;
    parse(file, &bytes)
}

/// Parses the bytes of `file` as JSON.
pub fn parse(file: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| ReportError::NotJson {
        file: file.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e
            .to_string()
            .split(" at line ")
            .next()
            .unwrap_or_default()
            .to_string(),
    })
}

/// Recognises what wrote `value` from its content.
pub fn detect(file: &Path, value: &Value) -> Result<Kind> {
    let not_evb = |reason: String| ReportError::NotEvb {
        file: file.to_path_buf(),
        reason,
    };
    let Some(object) = value.as_object() else {
        return Err(not_evb(format!(
            "the top level is {}; evb writes a JSON object",
            json::describe(value)
        )));
    };
    match object.get("kind") {
        Some(Value::String(k)) => match k.as_str() {
            "evb-run" => Ok(Kind::Run),
            "evb-sim" => Ok(Kind::Sim),
            "evb-scan" => Ok(Kind::Scan),
            "evb-fabric-diagnose" => Ok(Kind::FabricDiagnose),
            "evb-plan" => Ok(Kind::Plan),
            other => Err(not_evb(format!(
                "`kind` is \"{}\", not one of evb-run, evb-sim, evb-scan, evb-fabric-diagnose, evb-plan",
                other.chars().take(60).collect::<String>()
            ))),
        },
        Some(other) => Err(not_evb(format!(
            "`kind` is {}, evb writes a string",
            json::describe(other)
        ))),
        None if object.contains_key("conflict_definition") && object.contains_key("per_step") => {
            Ok(Kind::FabricConflicts)
        }
        None if object.contains_key("start_conflicts") && object.contains_key("moves_tried") => {
            Err(not_evb(
                "this is an `evb fabric order --json` result; the report reads \
                 `evb fabric conflicts --json`"
                    .into(),
            ))
        }
        None if object.contains_key("search") && object.contains_key("total") => Err(not_evb(
            "this is an `evb fabric route --for-shift --json` result; the report reads \
             `evb fabric conflicts --json`"
                .into(),
        )),
        None => Err(not_evb(
            "no `kind` field (evb-run, evb-sim, evb-scan, evb-fabric-diagnose, evb-plan) and no `conflict_definition` and \
             `per_step` (evb fabric conflicts)"
                .into(),
        )),
    }
}

/// One input ready to render.
struct Input<'a> {
    file: &'a Path,
    kind: Kind,
    root: At<'a>,
    anchor: String,
}

/// Renders the report for `inputs` (file name, parsed content) as one HTML
/// document. Every input's kind is detected first, so a stray file fails the
/// report before any chart is drawn.
pub fn render(inputs: &[(PathBuf, Value)]) -> Result<String> {
    if inputs.is_empty() {
        return Err(ReportError::NoInputs);
    }
    let inputs = inputs
        .iter()
        .enumerate()
        .map(|(i, (file, value))| {
            Ok(Input {
                file,
                kind: detect(file, value)?,
                root: At::root(file, value),
                anchor: format!("input-{}", i + 1),
            })
        })
        .collect::<Result<Vec<_>>>()?;

    let mut body = String::new();
    body.push_str("<h1>evb report</h1>\n");
    body.push_str(&contents(&inputs));
    for kind in [
        Kind::Run,
        Kind::Sim,
        Kind::Scan,
        Kind::FabricConflicts,
        Kind::FabricDiagnose,
        Kind::Plan,
    ] {
        let same: Vec<&Input> = inputs.iter().filter(|i| i.kind == kind).collect();
        if same.len() < 2 {
            continue;
        }
        let _ = writeln!(
            body,
            "<section id=\"compare-{}\"><h2>Comparison: {} {} files</h2>",
            kind_slug(kind),
            same.len(),
            esc(kind.describe())
        );
        body.push_str(&match kind {
            Kind::Run => run::compare(&same)?,
            Kind::Sim => sim::compare(&same)?,
            Kind::Scan => scan::compare(&same)?,
            Kind::FabricConflicts => fabric::compare(&same)?,
            Kind::FabricDiagnose => diagnose::compare(&same)?,
            Kind::Plan => plan::compare(&same)?,
        });
        body.push_str("</section>\n");
    }
    for input in &inputs {
        let _ = writeln!(
            body,
            "<section id=\"{}\"><h2>{} <span class=\"kind\">{}</span></h2>",
            input.anchor,
            esc(&input.file.display().to_string()),
            esc(input.kind.describe())
        );
        body.push_str(&match input.kind {
            Kind::Run => run::section(input)?,
            Kind::Sim => sim::section(input)?,
            Kind::Scan => scan::section(input)?,
            Kind::FabricConflicts => fabric::section(input)?,
            Kind::FabricDiagnose => diagnose::section(input)?,
            Kind::Plan => plan::section(input)?,
        });
        body.push_str("</section>\n");
    }
    Ok(page(&body))
}

fn kind_slug(kind: Kind) -> &'static str {
    match kind {
        Kind::Run => "run",
        Kind::Sim => "sim",
        Kind::Scan => "scan",
        Kind::FabricConflicts => "fabric",
        Kind::FabricDiagnose => "diagnose",
        Kind::Plan => "plan",
    }
}

/// The list of inputs at the top of the page, with links to their sections.
fn contents(inputs: &[Input]) -> String {
    let mut out = String::from("<nav><ol>\n");
    for input in inputs {
        let _ = writeln!(
            out,
            "<li><a href=\"#{}\">{}</a> <span class=\"kind\">{}</span></li>",
            input.anchor,
            esc(&input.file.display().to_string()),
            esc(input.kind.describe())
        );
    }
    out.push_str("</ol></nav>\n");
    out
}

const STYLE: &str = "
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1150px; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; border-bottom: 2px solid #ccd; padding-bottom: .2em; margin-top: 2em; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
.kind { font-size: .75em; color: #fff; background: #4a5a8a; border-radius: 3px; padding: .1em .4em; font-weight: normal; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { border: 1px solid #ccd; padding: .25em .6em; text-align: left; }
th { background: #eef0f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.ok { color: #11691f; font-weight: bold; } td.bad { color: #b00020; font-weight: bold; }
figure.chart { margin: .8em 0; } figure.chart svg { width: 100%; height: auto; max-width: 1000px; display: block; }
p.note { color: #555; font-size: .9em; }
details { margin: .6em 0; } summary { cursor: pointer; }
";

fn page(body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>evb report</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\
         <p class=\"note\">Written by evb-report {}.</p>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// A chart as a figure, or a note saying why there is none (nothing to plot).
fn figure(file: &Path, chart: Result<String, evb_plot::PlotError>) -> Result<String> {
    match chart {
        Ok(svg) => Ok(format!(
            "<figure class=\"chart\">\n{}\n</figure>\n",
            svg.trim()
        )),
        Err(evb_plot::PlotError::Empty(why)) => {
            Ok(format!("<p class=\"note\">No chart: {}.</p>\n", esc(why)))
        }
        Err(source) => Err(ReportError::Plot {
            file: file.to_path_buf(),
            source,
        }),
    }
}

/// The configuration object of a file, flattened to `section.key = value`
/// lines, folded away under a `<details>`.
fn config_details(config: &At) -> String {
    fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flatten(&key, v, out);
                }
            }
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    if config.is_null() {
        return String::new();
    }
    let mut lines = Vec::new();
    flatten("", config.value, &mut lines);
    let mut out = String::from("<details><summary>Configuration</summary>\n<table>\n");
    for (k, v) in lines.iter().take(2000) {
        let _ = writeln!(out, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(v));
    }
    out.push_str("</table></details>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(name: &str) -> PathBuf {
        PathBuf::from(name)
    }

    #[test]
    fn detects_kinds_and_names_strangers() {
        assert_eq!(
            detect(&p("a"), &json!({"kind": "evb-run"})).unwrap(),
            Kind::Run
        );
        assert_eq!(
            detect(&p("a"), &json!({"kind": "evb-scan"})).unwrap(),
            Kind::Scan
        );
        assert_eq!(
            detect(
                &p("a"),
                &json!({"conflict_definition": "x", "per_step": []})
            )
            .unwrap(),
            Kind::FabricConflicts
        );
        let e = detect(&p("pkg.json"), &json!({"name": "left-pad"})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("pkg.json: not a file evb wrote: no `kind`"),
            "{e}"
        );
        let e = detect(&p("x.json"), &json!({"kind": "evb-fly"})).unwrap_err();
        assert!(e.to_string().contains("\"evb-fly\""), "{e}");
        let e = detect(&p("x.json"), &json!([1, 2])).unwrap_err();
        assert!(e.to_string().contains("an array of 2 items"), "{e}");
        let e = parse(&p("t.json"), b"{\"kind\": ").unwrap_err();
        assert!(
            e.to_string()
                .contains("t.json: not a file evb wrote: not JSON"),
            "{e}"
        );
        assert!(matches!(render(&[]), Err(ReportError::NoInputs)));
    }

    #[test]
    fn degenerate_files_render_without_panicking() {
        let max = u64::MAX;
        let run = json!({"kind": "evb-run",
            "summary": {"nodes": 2, "duration_s": 0.0, "events_generated": max,
                "events_built": max, "events_incomplete": max, "events_corrupt": max,
                "events_lost": max, "built_gbps": 0.0, "built_gbps_per_node": 0.0,
                "events_per_second": 0.0, "latency_ns": null},
            "nodes": [null, {"elapsed_s": 0.0, "bytes_sent": max,
                "latency_buckets": [[1e300, max], [0, 1]]}],
            "timeline": [{"t_s": 1.0, "built_gbps": 0.0, "node_built_gbps": []}],
            "node_exit_codes": [null, 0]});
        let sim = json!({"kind": "evb-sim", "summary": {"hosts": 0,
            "throughput_per_host_gbps": 0.0, "link_rate_gbps": 0.0, "fraction_of_link": 0.0,
            "min_host_gbps": 0.0, "max_host_gbps": 0.0, "simulated_seconds": 0.0},
            "hosts": [], "links": [], "timeseries": []});
        let scan = json!({"kind": "evb-scan", "axes": ["a"], "points": []});
        let fabric = json!({"conflict_definition": "", "per_step": [], "hosts": 0,
            "total": {"conflicts": 0, "flows": 0, "flows_on_shared_links": 0,
                "max_link_load": 0, "steps": 0, "steps_with_conflicts": 0}});
        let inputs = [
            (p("r1.json"), run.clone()),
            (p("r2.json"), run),
            (p("s1.json"), sim.clone()),
            (p("s2.json"), sim),
            (p("c1.json"), scan.clone()),
            (p("c2.json"), scan),
            (p("f1.json"), fabric.clone()),
            (p("f2.json"), fabric),
        ];
        let html = render(&inputs).unwrap();
        assert!(
            html.contains("off by"),
            "the overflowing accounting is flagged"
        );
        assert!(html.contains("no final report"));
        assert!(!html.contains("NaN") && !html.contains("inf"));
    }

    #[test]
    fn a_missing_field_is_named() {
        let v = json!({"kind": "evb-run", "summary": {"nodes": 2}, "nodes": [], "timeline": []});
        let e = render(&[(p("run.json"), v)]).unwrap_err().to_string();
        assert!(e.starts_with("run.json: field `summary."), "{e}");
        let v = json!({"kind": "evb-scan", "axes": "credits", "points": []});
        let e = render(&[(p("scan.json"), v)]).unwrap_err().to_string();
        assert!(
            e.contains("scan.json: field `axes`: expected an array"),
            "{e}"
        );
    }
}
