//! `evb report` end to end: real inputs written by the `evb` binary (a short
//! loopback run, a simulation, a scan, a fabric analysis), the report opened
//! in a real browser (headless Chromium), bad inputs named, and the progress
//! bars of `evb sim`/`evb scan` shown on a terminal only.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use evb_testkit::evb_path;
use serde_json::Value;

const CHROMIUM: &str = "/usr/bin/chromium";
const SCREEN: (u32, u32) = (1400, 3000);

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` in its own process group with output to files; kills the
/// whole group and fails the test when it takes longer than `limit`.
/// (Not the test kit's `run_bounded`: Chromium starts helper processes of
/// its own; on a timeout a group kill ends them all, and with files for
/// output none of them can hold the test's pipes open.)
fn run_bounded(mut cmd: Command, dir: &Path, limit: Duration) -> Output {
    let n = std::fs::read_dir(dir).map_or(0, |d| d.count());
    let out_path = dir.join(format!("cmd{n}.stdout"));
    let err_path = dir.join(format!("cmd{n}.stderr"));
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            // SAFETY: signalling the process group this test started.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

fn evb(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = evb_testkit::evb();
    cmd.args(args).current_dir(dir);
    run_bounded(cmd, dir, Duration::from_secs(90))
}

fn evb_ok(dir: &Path, args: &[&str]) -> Output {
    let out = evb(dir, args);
    assert_eq!(
        out.code,
        Some(0),
        "evb {args:?} failed:\n{}{}",
        out.stdout,
        out.stderr
    );
    out
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The real inputs: two runs, a simulation, a scan, a fabric analysis.
fn make_inputs(dir: &Path) {
    evb_ok(
        dir,
        &[
            "run",
            "--nodes",
            "2",
            "--duration",
            "2",
            "--json",
            "run-2.json",
        ],
    );
    evb_ok(
        dir,
        &[
            "run",
            "--nodes",
            "3",
            "--duration",
            "2",
            "--json",
            "run-3.json",
        ],
    );
    evb_ok(
        dir,
        &[
            "sim",
            "--topology",
            "switch:hosts=8",
            "--traffic",
            "eb",
            "--duration-us",
            "1000",
            "--json",
            "sim.json",
        ],
    );
    evb_ok(
        dir,
        &[
            "scan",
            "--topology",
            "switch:hosts=4",
            "--traffic",
            "eb",
            "--duration-us",
            "500",
            "--param",
            "event_builder.credits=1,2,4",
            "--param",
            "event_builder.parallel_sends=1,2,4",
            "--json",
            "scan.json",
        ],
    );
    evb_ok(
        dir,
        &[
            "fabric",
            "conflicts",
            "--topology",
            "fat-tree:radix=8,hosts=32",
            "--routing",
            "ftree",
            "--order",
            "random:1",
            "--json",
            "fabric.json",
        ],
    );
}

/// A count as the report prints it (thin spaces between thousands).
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).unwrap())
        .collect();
    groups.join("\u{2009}")
}

/// No reference that would need the network: the only URL is the SVG namespace.
fn assert_self_contained(html: &str) {
    let stripped = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for needle in [
        "http://", "https://", "<script", "<link", " src=", "@import", "url(",
    ] {
        assert!(
            !stripped.contains(needle),
            "the report refers to something outside itself: `{needle}`"
        );
    }
}

fn chromium(dir: &Path, args: &[&str], url: &str) -> Output {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install the Debian package `chromium` (scripts/setup.sh does)"
    );
    let profile = tempfile::tempdir_in(dir).unwrap();
    let mut cmd = Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .arg(url);
    run_bounded(cmd, dir, Duration::from_secs(60))
}

/// Screenshot of `html` in headless Chromium, decoded: (width, height, RGB pixels).
fn screenshot(dir: &Path, html: &Path, name: &str) -> (u32, u32, Vec<[u8; 3]>) {
    let png_path = dir.join(name);
    let out = chromium(
        dir,
        &[
            &format!("--screenshot={}", png_path.display()),
            &format!("--window-size={},{}", SCREEN.0, SCREEN.1),
        ],
        &format!("file://{}", html.display()),
    );
    assert!(
        png_path.exists(),
        "chromium wrote no screenshot (exit {:?}):\n{}",
        out.code,
        out.stderr
    );
    let decoder = png::Decoder::new(std::fs::File::open(&png_path).unwrap());
    let mut reader = decoder.read_info().expect("the screenshot is a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("the screenshot decodes");
    let step = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let pixels = buf[..info.buffer_size()]
        .chunks_exact(step)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    (info.width, info.height, pixels)
}

/// Pixels of strong colour (not white, grey or black): chart lines, bars, cells.
fn colourful(pixels: &[[u8; 3]]) -> usize {
    pixels
        .iter()
        .filter(|p| {
            let max = p.iter().max().unwrap();
            let min = p.iter().min().unwrap();
            max - min > 60
        })
        .count()
}

fn distinct(pixels: &[[u8; 3]]) -> usize {
    let mut seen: Vec<[u8; 3]> = pixels.to_vec();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

#[test]
fn report_of_real_outputs_renders_in_chromium() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_inputs(dir);
    let files = [
        "run-2.json",
        "run-3.json",
        "sim.json",
        "scan.json",
        "fabric.json",
    ];
    let mut args = vec!["report"];
    args.extend(files);
    args.extend(["-o", "report.html"]);
    let out = evb_ok(dir, &args);
    assert!(
        out.stdout.contains("wrote report.html (5 inputs"),
        "{}",
        out.stdout
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_self_contained(&html);

    // Every input has its section, and the runs a comparison.
    for f in files {
        assert!(
            html.contains(&format!(">{f} <span class=\"kind\">")),
            "no section for {f}"
        );
    }
    assert!(html.contains("Comparison: 2 evb run files"));
    // The exact accounting of each run, with the figures of its file.
    for f in ["run-2.json", "run-3.json"] {
        let s = &read_json(&dir.join(f))["summary"];
        let cells: Vec<String> = [
            "events_generated",
            "events_built",
            "events_incomplete",
            "events_corrupt",
            "events_lost",
        ]
        .iter()
        .map(|k| format!("<td class=\"num\">{}</td>", grouped(s[k].as_u64().unwrap())))
        .collect();
        assert!(
            html.contains(&cells.join("")),
            "{f}: accounting row missing"
        );
    }
    assert_eq!(html.matches("<td class=\"ok\">exact</td>").count(), 2 + 2);
    // Charts: runs (comparison 2, each 3) + sim 3 + scan 1 + fabric 3.
    let svgs = html.matches("<svg").count();
    assert_eq!(svgs, 2 + 2 * 3 + 3 + 1 + 3, "charts in the report");
    // The scan heat map: 3 x 3 cells (credits x parallel sends) and a
    // 100-step colour scale, axes named.
    let heat = &html[html.find("<h3>Heat map</h3>").expect("a scan heat map")..];
    let heat = &heat[..heat.find("</svg>").unwrap()];
    assert!(
        heat.contains("event_builder.parallel_sends") && heat.contains("event_builder.credits")
    );
    assert!(heat.matches("<rect").count() >= 9 + 100, "heat map cells");

    // The browser parses every SVG.
    let dom = chromium(
        dir,
        &["--dump-dom"],
        &format!("file://{}", dir.join("report.html").display()),
    );
    assert_eq!(dom.code, Some(0), "chromium --dump-dom: {}", dom.stderr);
    assert_eq!(dom.stdout.matches("<svg").count(), svgs, "SVGs in the DOM");
    assert_eq!(dom.stdout.matches("</svg>").count(), svgs);
    assert!(dom.stdout.matches("<rect").count() > 100);

    // The top of the page (comparison and first run) as a person sees it.
    let (w, h, pixels) = screenshot(dir, &dir.join("report.html"), "report.png");
    assert_eq!((w, h), SCREEN);
    let non_white = pixels.iter().filter(|p| **p != [255, 255, 255]).count();
    eprintln!(
        "report screenshot: {non_white} non-white, {} strongly coloured, {} distinct colours",
        colourful(&pixels),
        distinct(&pixels)
    );
    assert!(
        non_white > pixels.len() / 20,
        "only {non_white} non-white pixels"
    );
    assert!(
        colourful(&pixels) > 100_000,
        "too little colour: no plots drawn?"
    );
    assert!(distinct(&pixels) > 200, "{} colours", distinct(&pixels));

    assert_per_node_chart(dir);
    assert_heat_maps_drawn(dir);
}

/// Per-node throughput when the timeline has `node_built_gbps`: a line
/// for each node in the throughput chart.
fn assert_per_node_chart(dir: &Path) {
    let mut run = read_json(&dir.join("run-3.json"));
    for sample in run["timeline"].as_array_mut().unwrap() {
        let total = sample["built_gbps"].as_f64().unwrap();
        sample["node_built_gbps"] = serde_json::json!([total / 2.0, total / 3.0, total / 6.0]);
    }
    std::fs::write(dir.join("per-node.json"), run.to_string()).unwrap();
    evb_ok(dir, &["report", "per-node.json", "-o", "per-node.html"]);
    let html = std::fs::read_to_string(dir.join("per-node.html")).unwrap();
    let chart = &html[html.find("<h3>Throughput over time</h3>").unwrap()..];
    let chart = &chart[..chart.find("</svg>").unwrap()];
    assert!(chart.contains("Built Gb/s per node"), "no per-node chart");
    for node in ["node 0", "node 1", "node 2"] {
        assert!(chart.contains(node), "no line for {node}");
    }
}

/// The heat maps (a report of the scan and the fabric analysis alone)
/// drawn as a person sees them: large blocks of strong colour.
fn assert_heat_maps_drawn(dir: &Path) {
    evb_ok(
        dir,
        &["report", "scan.json", "fabric.json", "-o", "heat.html"],
    );
    let (_, _, pixels) = screenshot(dir, &dir.join("heat.html"), "heat.png");
    eprintln!(
        "heat-map screenshot: {} strongly coloured",
        colourful(&pixels)
    );
    // Viridis cells are large blocks of strong colour.
    assert!(
        colourful(&pixels) > 400_000,
        "heat maps: {} strongly coloured pixels",
        colourful(&pixels)
    );
}

#[test]
fn files_evb_did_not_write_are_named_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert_foreign_files_named(dir);
    assert_other_evb_json_and_missing_files_named(dir);
    assert_mangled_fabric_json_refused(dir);
}

/// JSON (or not) that evb did not write: refused with the reason, and no
/// report written.
fn assert_foreign_files_named(dir: &Path) {
    let cases: [(&str, &str, &str); 7] = [
        (
            "package.json",
            r#"{"name": "left-pad", "version": "1.3.0"}"#,
            "package.json: not a file evb wrote: no `kind` field",
        ),
        (
            "notes.json",
            "these are notes, not JSON",
            "notes.json: not a file evb wrote: not JSON",
        ),
        (
            "empty.json",
            "",
            "empty.json: not a file evb wrote: not JSON",
        ),
        (
            "other.json",
            r#"{"kind": "evb-frobnicate"}"#,
            "other.json: not a file evb wrote: `kind` is \"evb-frobnicate\"",
        ),
        (
            "list.json",
            "[1, 2, 3]",
            "list.json: not a file evb wrote: the top level is an array of 3 items",
        ),
        (
            "short-run.json",
            r#"{"kind": "evb-run", "summary": {"nodes": 2, "duration_s": 1.0}}"#,
            "short-run.json: field `summary.events_generated`: missing",
        ),
        (
            "bad-buckets.json",
            r#"{"kind": "evb-run", "summary": {"nodes": 1, "duration_s": 1.0, "events_generated": 4,
               "events_built": 4, "events_incomplete": 0, "events_corrupt": 0, "events_lost": 0,
               "built_gbps": 1.0, "built_gbps_per_node": 1.0, "events_per_second": 4.0},
               "timeline": [], "nodes": [{"latency_buckets": [[1000, -3]]}]}"#,
            "bad-buckets.json: field `nodes[0].latency_buckets[0][1]`: expected a whole number >= 0, found the number -3",
        ),
    ];
    for (name, content, expected) in cases {
        std::fs::write(dir.join(name), content).unwrap();
        let out = evb(dir, &["report", name, "-o", "out.html"]);
        assert_eq!(out.code, Some(2), "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains(expected),
            "{name}: expected `{expected}` in:\n{}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
        assert!(
            !dir.join("out.html").exists(),
            "{name}: wrote a report anyway"
        );
    }
}

/// The other JSON evb writes, named for what it is; a missing file and
/// deeply nested input named too.
fn assert_other_evb_json_and_missing_files_named(dir: &Path) {
    evb_ok(
        dir,
        &[
            "fabric",
            "order",
            "--topology",
            "fat-tree:radix=4,hosts=8",
            "--out",
            "hosts.txt",
            "--json",
            "order.json",
            "--time-limit",
            "1",
        ],
    );
    let out = evb(dir, &["report", "order.json", "-o", "out.html"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "order.json: not a file evb wrote: this is an `evb fabric order --json` result"
        ),
        "{}",
        out.stderr
    );
    let out = evb(dir, &["report", "absent.json", "-o", "out.html"]);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.contains("absent.json: No such file"),
        "{}",
        out.stderr
    );

    // Deeply nested input is refused by the parser, not by a stack overflow.
    std::fs::write(dir.join("deep.json"), "[".repeat(100_000)).unwrap();
    let out = evb(dir, &["report", "deep.json", "-o", "out.html"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("deep.json: not a file evb wrote: not JSON"),
        "{}",
        out.stderr
    );
}

/// Mangled real files: errors or reports, never a panic or a hang.
fn assert_mangled_fabric_json_refused(dir: &Path) {
    evb_ok(
        dir,
        &[
            "fabric",
            "conflicts",
            "--topology",
            "fat-tree:radix=4,hosts=8",
            "--json",
            "fabric.json",
        ],
    );
    let good = std::fs::read(dir.join("fabric.json")).unwrap();
    for cut in (0..good.len()).step_by(good.len() / 25 + 1) {
        std::fs::write(dir.join("cut.json"), &good[..cut]).unwrap();
        let out = evb(dir, &["report", "cut.json", "-o", "cut.html"]);
        assert_eq!(out.code, Some(2), "cut at {cut}: {}", out.stderr);
        assert!(out.stderr.contains("cut.json: "), "{}", out.stderr);
    }
    let text = String::from_utf8(good).unwrap();
    for (from, to) in [
        ("\"conflicts\": ", "\"conflicts\": -"),
        ("\"per_step\": [", "\"per_step\": [\"x\", "),
        ("\"max_link_load\": ", "\"max_link_load\": 1e400, \"x\": "),
        ("\"worst_links\": [", "\"worst_links\": {}, \"y\": ["),
        ("\"loads\": [", "\"loads\": [7,"),
        ("\"loads\": [1", "\"loads\": [-1"),
    ] {
        std::fs::write(dir.join("mangled.json"), text.replacen(from, to, 1)).unwrap();
        let out = evb(dir, &["report", "mangled.json", "-o", "m.html"]);
        assert_eq!(out.code, Some(2), "{to}: {}", out.stderr);
        assert!(
            out.stderr.contains("mangled.json: "),
            "{to}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
    // The per-link loads: a row of the wrong length, a negative cell.
    for (from, to, expected) in [
        (
            "\"loads\": [",
            "\"loads\": [7,",
            "field `link_loads.links[0].loads`: 8 loads for 7 steps",
        ),
        (
            "\"loads\": [1",
            "\"loads\": [-1",
            "field `link_loads.links[0].loads[0]`: expected a whole number >= 0, found the number -1",
        ),
    ] {
        std::fs::write(dir.join("mangled.json"), text.replacen(from, to, 1)).unwrap();
        let out = evb(dir, &["report", "mangled.json", "-o", "m.html"]);
        assert_eq!(out.code, Some(2), "{to}: {}", out.stderr);
        assert!(out.stderr.contains(expected), "{}", out.stderr);
    }
}

/// `evb scan` under a pseudo-terminal (`script` from util-linux), with `ci`
/// as the value of CI (None: unset); returns what the terminal saw.
fn scan_on_a_terminal(dir: &Path, ci: Option<&str>) -> String {
    let script = PathBuf::from("/usr/bin/script");
    assert!(
        script.exists(),
        "/usr/bin/script is missing: install the Debian package bsdutils"
    );
    let line = format!(
        "{} scan --topology switch:hosts=4 --traffic eb --duration-us 300 \
         --param event_builder.credits=1,2 --param event_builder.parallel_sends=1,2",
        evb_path().display()
    );
    let mut cmd = Command::new(script);
    cmd.args(["-qec", &line, "/dev/null"]).env_remove("CI");
    if let Some(v) = ci {
        cmd.env("CI", v);
    }
    let out = run_bounded(cmd, dir, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("evb scan: 4 points"), "{}", out.stdout);
    out.stdout
}

#[test]
fn progress_bars_only_on_a_terminal_outside_ci() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let shown = scan_on_a_terminal(dir, None);
    assert!(
        shown.contains("scan points [") && shown.contains("100%"),
        "no progress bar on a terminal:\n{shown}"
    );
    let ci = scan_on_a_terminal(dir, Some("true"));
    assert!(!ci.contains("scan points ["), "a bar under CI:\n{ci}");
    // A pipe: stderr stays empty.
    let mut cmd = evb_testkit::evb();
    cmd.args([
        "sim",
        "--topology",
        "switch:hosts=4",
        "--traffic",
        "eb",
        "--duration-us",
        "300",
    ])
    .env_remove("CI");
    let out = run_bounded(cmd, dir, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("evb sim:"), "{}", out.stdout);
    assert_eq!(out.stderr, "", "progress output in a pipe");
}

/// `evb run` under a pseudo-terminal: a bar of the run's time with its
/// rates; under CI none, and in a pipe stderr holds no bar.
#[test]
fn evb_run_shows_a_bar_on_a_terminal_outside_ci() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let on_terminal = |ci: Option<&str>| {
        let line = format!(
            "{} run -n 2 -d 1.5 --set source.events_per_mep=256",
            evb_path().display()
        );
        let mut cmd = Command::new("/usr/bin/script");
        cmd.args(["-qec", &line, "/dev/null"]).env_remove("CI");
        if let Some(v) = ci {
            cmd.env("CI", v);
        }
        let out = run_bounded(cmd, dir, Duration::from_secs(60));
        assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("events: generated"), "{}", out.stdout);
        out.stdout
    };
    let shown = on_terminal(None);
    assert!(
        shown.contains("] 100%") && shown.contains("Gb/s") && shown.contains("[====="),
        "no progress bar on a terminal:\n{shown}"
    );
    let ci = on_terminal(Some("true"));
    assert!(!ci.contains("] 100%"), "a bar under CI:\n{ci}");
    let mut cmd = evb_testkit::evb();
    cmd.args([
        "run",
        "-n",
        "2",
        "-d",
        "1",
        "--set",
        "source.events_per_mep=256",
    ])
    .env_remove("CI");
    let out = run_bounded(cmd, dir, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        !out.stderr.contains("100%"),
        "a bar in a pipe: {}",
        out.stderr
    );
}

/// The SVG of the chart titled `title` in `html`.
fn chart_titled<'a>(html: &'a str, title: &str) -> &'a str {
    let at = html
        .find(title)
        .unwrap_or_else(|| panic!("no chart titled `{title}`"));
    let start = html[..at].rfind("<svg").expect("the title is in an SVG");
    let end = at + html[at..].find("</svg>").unwrap();
    &html[start..end]
}

/// A run with Filter Unit consumers gets the output-stage figures (producer
/// and consumer throughput, busy consumers over time); a fabric analysis
/// with per-link loads gets a links x steps heat map. Both in Chromium.
#[test]
fn consumer_figures_and_link_heat_map_render_in_chromium() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_consumer_run_and_small_fabric(dir);
    let shared = assert_small_fabric_link_loads(dir);
    let run = assert_consumer_run_figures(dir);

    evb_ok(
        dir,
        &[
            "report",
            "run-fu.json",
            "fabric-small.json",
            "-o",
            "fu.html",
        ],
    );
    let html = std::fs::read_to_string(dir.join("fu.html")).unwrap();
    assert_self_contained(&html);
    assert_output_stage_charts(&html, &run);
    assert_link_heat_map(&html, &shared);
    assert_chromium_draws_consumer_charts_and_heat_map(dir, &html);
}

/// The inputs: a 4 s run of 2 nodes with 2 slow consumers that accept a
/// quarter of the events (run-fu.json), and the conflicts of a small
/// fabric with per-link loads (fabric-small.json).
fn make_consumer_run_and_small_fabric(dir: &Path) {
    evb_ok(
        dir,
        &[
            "run",
            "--nodes",
            "2",
            "--duration",
            "4",
            "--consumers",
            "2",
            "--set",
            "output.consumer_busy_us=5000",
            "--set",
            "output.accept_fraction=0.25",
            "--json",
            "run-fu.json",
        ],
    );
    // Two leaves of two hosts under one spine, minhop, name order: in step
    // 2 both hosts of a leaf send across, so the 2 leaf up-links and the 2
    // spine down-links carry 2 flows each; steps 1 and 3 carry 1 per link.
    evb_ok(
        dir,
        &[
            "fabric",
            "conflicts",
            "--topology",
            "fat-tree:radix=4,hosts=4,down=2,up=1",
            "--routing",
            "minhop",
            "--order",
            "name",
            "--json",
            "fabric-small.json",
        ],
    );
}

/// The small fabric's per-link loads are as worked out by hand; returns the
/// 4 links that carry 2 flows in step 2.
fn assert_small_fabric_link_loads(dir: &Path) -> Vec<Value> {
    let fabric = read_json(&dir.join("fabric-small.json"));
    let loads = &fabric["link_loads"];
    assert_eq!(loads["steps"], serde_json::json!([1, 2, 3]));
    let links = loads["links"].as_array().expect("link_loads.links");
    assert_eq!(links.len(), 12, "{loads}");
    let shared: Vec<&Value> = links.iter().filter(|l| l["loads"][1] == 2).collect();
    assert_eq!(shared.len(), 4, "{loads}");
    for l in &shared {
        assert_eq!(l["loads"], serde_json::json!([1, 2, 1]), "{l}");
        assert!(l["name"].as_str().unwrap().contains("->"));
    }
    assert_eq!(fabric["total"]["conflicts"], 4);
    shared.into_iter().cloned().collect()
}

/// The run consumed batches and its timeline shows busy consumers; returns
/// the run's JSON.
fn assert_consumer_run_figures(dir: &Path) -> Value {
    let run = read_json(&dir.join("run-fu.json"));
    let c = &run["summary"]["consumers"];
    assert!(c["batches_consumed"].as_u64().unwrap() > 0, "{c}");
    let timeline = run["timeline"].as_array().unwrap();
    let with_busy = timeline
        .iter()
        .filter(|s| s["busy_consumers"].as_f64().is_some_and(|b| b > 0.0))
        .count();
    assert!(
        with_busy >= 2,
        "busy consumers in the timeline: {timeline:?}"
    );
    run
}

/// The report's output stage: the trigger's figures, the throughput and
/// busy-consumer charts and the per-consumer table, as `run` counted them.
fn assert_output_stage_charts(html: &str, run: &Value) {
    let c = &run["summary"]["consumers"];
    let timeline = run["timeline"].as_array().unwrap();
    assert!(html.contains("<h3>Output stage: producers and consumers</h3>"));
    // The trigger's figures, as the run counted them.
    let trigger = format!(
        "trigger: events accepted / consumed</td><td class=\"num\">{} / {}",
        grouped(c["events_accepted"].as_u64().unwrap()),
        grouped(c["events_consumed"].as_u64().unwrap())
    );
    assert!(html.contains(&trigger), "no {trigger}");
    // Each series is a line through one point per timeline sample, in the
    // first and second colours of the palette.
    let samples = |key: &str| timeline.iter().filter(|s| s[key].is_number()).count();
    let throughput = chart_titled(html, THROUGHPUT_CHART);
    assert!(throughput.contains("producer: delivered by the BUs"));
    assert!(throughput.contains("consumer: consumed by the FUs"));
    assert_eq!(line_points(throughput, RED), samples("producer_gbps"));
    assert_eq!(line_points(throughput, GREEN), samples("consumer_gbps"));
    let busy = chart_titled(html, BUSY_CHART);
    assert!(busy.contains("busy consumers") && busy.contains("consumers in the run"));
    assert_eq!(line_points(busy, RED), samples("busy_consumers"));
    assert_eq!(line_points(busy, GREEN), 2, "the ceiling line");
    // The per-consumer table: both FU endpoints (2 and 3 after 2 nodes).
    for p in c["per_consumer"].as_array().unwrap() {
        let row = format!(
            "<td class=\"num\">{}</td><td class=\"num\">{}</td>",
            p["node"],
            grouped(p["batches"].as_u64().unwrap())
        );
        assert!(html.contains(&row), "no row {row}");
    }
}

/// The heat map: one row per loaded link (12), one column per step (3),
/// the `shared` link names on the axis, and the colour scale.
fn assert_link_heat_map(html: &str, shared: &[Value]) {
    let heat = chart_titled(html, HEAT_MAP_CHART);
    assert!(
        heat.matches("<rect").count() >= 12 * 3 + 100,
        "heat map cells"
    );
    for l in shared {
        let name = l["name"].as_str().unwrap().replace('>', "&gt;");
        assert!(heat.contains(&name), "no row for {name}");
    }
}

/// Chromium parses every chart of `html` and draws the three new ones.
fn assert_chromium_draws_consumer_charts_and_heat_map(dir: &Path, html: &str) {
    let svgs = html.matches("<svg").count();
    let dom = chromium(
        dir,
        &["--dump-dom"],
        &format!("file://{}", dir.join("fu.html").display()),
    );
    assert_eq!(dom.code, Some(0), "chromium --dump-dom: {}", dom.stderr);
    assert_eq!(dom.stdout.matches("<svg").count(), svgs, "SVGs in the DOM");
    assert!(dom.stdout.contains(BUSY_CHART));
    assert!(dom.stdout.contains(HEAT_MAP_CHART));
    // The three new charts alone on a page, as Chromium draws them: the
    // lines in their colours, the heat map in strong colour.
    let page = |charts: &[&str]| {
        format!(
            "<!DOCTYPE html><html><body>{}</svg></body></html>",
            charts.join("</svg>")
        )
    };
    let throughput = chart_titled(html, THROUGHPUT_CHART);
    let busy = chart_titled(html, BUSY_CHART);
    let heat = chart_titled(html, HEAT_MAP_CHART);
    std::fs::write(dir.join("lines.html"), page(&[throughput, busy])).unwrap();
    std::fs::write(dir.join("heat.html"), page(&[heat])).unwrap();
    let (_, _, pixels) = screenshot(dir, &dir.join("lines.html"), "lines.png");
    let near = |c: [u8; 3]| {
        pixels
            .iter()
            .filter(|p| p.iter().zip(c).all(|(a, b)| a.abs_diff(b) < 40))
            .count()
    };
    let (red, green) = (near([0xE6, 0x19, 0x4B]), near([0x3C, 0xB4, 0x4B]));
    eprintln!(
        "consumer charts screenshot: {red} red (producer, busy) and {green} green \
         (consumer, ceiling) line pixels"
    );
    assert!(
        red > 1000 && green > 1000,
        "lines not drawn: {red} red, {green} green"
    );
    let (_, _, pixels) = screenshot(dir, &dir.join("heat.html"), "heat.png");
    eprintln!(
        "link heat map screenshot: {} strongly coloured pixels",
        colourful(&pixels)
    );
    // 12 x 3 cells over most of a 1000 x 600 chart.
    assert!(
        colourful(&pixels) > 200_000,
        "heat map: {} strongly coloured pixels",
        colourful(&pixels)
    );
}

/// The titles of the output-stage charts and of the link heat map.
const THROUGHPUT_CHART: &str = "Producer (BUs delivering) and consumer throughput";
const BUSY_CHART: &str = "Busy consumers over time";
const HEAT_MAP_CHART: &str = "Link load per step (flows on each directed link)";

const RED: &str = "#E6194B";
const GREEN: &str = "#3CB44B";

/// Points of the longest line drawn in `colour` in an SVG chart (legend
/// samples are 2-point lines).
fn line_points(svg: &str, colour: &str) -> usize {
    svg.split("<polyline")
        .skip(1)
        .filter(|p| p.contains(&format!("stroke=\"{colour}\"")))
        .filter_map(|p| {
            let pts = p.split("points=\"").nth(1)?.split('"').next()?;
            Some(pts.split_whitespace().count())
        })
        .max()
        .unwrap_or(0)
}
