//! `evb-plot`: the charts evb writes (line charts of throughput over time,
//! heat maps of link load, bar charts), each as an SVG and a PNG beside it,
//! or as an SVG string to inline in an HTML report (`*_svg`).
//!
//! Text is laid out with a TrueType font found at run time (Debian's
//! `fonts-dejavu-core`, installed by `scripts/setup.sh`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("no TrueType font for PNG text: install fonts-dejavu-core (looked in {0})")]
    NoFont(String),
    #[error("drawing {path}: {message}")]
    Draw { path: PathBuf, message: String },
    #[error("nothing to plot: {0}")]
    Empty(&'static str),
}

const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers the font PNG text is drawn with, once per process.
fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let bytes = FONT_PATHS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| FONT_PATHS.join(", "))?;
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| "bad font file".to_string())
    })
    .clone()
    .map_err(PlotError::NoFont)
}

/// One line of a line chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart: writes `base.svg` and `base.png`; returns both paths.
pub fn line_chart(
    base: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<[PathBuf; 2], PlotError> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(PlotError::Empty("a line chart needs points"));
    }
    render(
        base,
        (1000, 600),
        &LineChart {
            title,
            x_label,
            y_label,
            series,
        },
    )
}

/// A heat map of `rows` (each a row of cells), e.g. link load per step:
/// writes `base.svg` and `base.png`. Cells are labelled by their index.
pub fn heat_map(
    base: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    rows: &[Vec<f64>],
) -> Result<[PathBuf; 2], PlotError> {
    heat_map_labelled(base, title, x_label, y_label, rows, &[], &[])
}

/// A heat map whose columns and rows are labelled with `x_ticks` and
/// `y_ticks` (e.g. the scanned parameter values).
pub fn heat_map_labelled(
    base: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    rows: &[Vec<f64>],
    x_ticks: &[String],
    y_ticks: &[String],
) -> Result<[PathBuf; 2], PlotError> {
    if rows.is_empty() || rows.iter().all(Vec::is_empty) {
        return Err(PlotError::Empty("a heat map needs cells"));
    }
    let picture = HeatMap {
        title,
        x_label,
        y_label,
        rows,
        x_ticks,
        y_ticks,
    };
    render(base, (1000, 700), &picture)
}

/// One bar of a bar chart: a category and its value.
pub struct Bar {
    pub label: String,
    pub value: f64,
}

/// A bar chart, one bar per category (e.g. latency bins, runs compared):
/// writes `base.svg` and `base.png`.
pub fn bar_chart(
    base: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    bars: &[Bar],
) -> Result<[PathBuf; 2], PlotError> {
    if bars.is_empty() {
        return Err(PlotError::Empty("a bar chart needs bars"));
    }
    render(
        base,
        (1000, 600),
        &BarChart {
            title,
            x_label,
            y_label,
            bars,
        },
    )
}

/// [`line_chart`] as an SVG document in a string (for inlining in HTML).
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<String, PlotError> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(PlotError::Empty("a line chart needs points"));
    }
    render_svg_string(
        (1000, 500),
        &LineChart {
            title,
            x_label,
            y_label,
            series,
        },
    )
}

/// [`heat_map_labelled`] as an SVG document in a string.
pub fn heat_map_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    rows: &[Vec<f64>],
    x_ticks: &[String],
    y_ticks: &[String],
) -> Result<String, PlotError> {
    if rows.is_empty() || rows.iter().all(Vec::is_empty) {
        return Err(PlotError::Empty("a heat map needs cells"));
    }
    render_svg_string(
        (1000, 600),
        &HeatMap {
            title,
            x_label,
            y_label,
            rows,
            x_ticks,
            y_ticks,
        },
    )
}

/// [`bar_chart`] as an SVG document in a string.
pub fn bar_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    bars: &[Bar],
) -> Result<String, PlotError> {
    if bars.is_empty() {
        return Err(PlotError::Empty("a bar chart needs bars"));
    }
    render_svg_string(
        (1000, 500),
        &BarChart {
            title,
            x_label,
            y_label,
            bars,
        },
    )
}

/// A scatter chart: each series' points as marks (a series named with a
/// leading `~` is drawn as a line instead, e.g. a Pareto front or a
/// requirement), each point of `labels` (x, y, text) labelled. Writes
/// `base.svg` and `base.png`.
pub fn scatter_chart(
    base: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    labels: &[(f64, f64, String)],
) -> Result<[PathBuf; 2], PlotError> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(PlotError::Empty("a scatter chart needs points"));
    }
    let picture = Scatter {
        title,
        x_label,
        y_label,
        series,
        labels,
    };
    render(base, (1000, 650), &picture)
}

/// [`scatter_chart`] as an SVG document in a string.
pub fn scatter_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    labels: &[(f64, f64, String)],
) -> Result<String, PlotError> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(PlotError::Empty("a scatter chart needs points"));
    }
    let picture = Scatter {
        title,
        x_label,
        y_label,
        series,
        labels,
    };
    render_svg_string((1000, 600), &picture)
}

/// A node of a fabric map: a switch, or a leaf's hosts.
pub struct MapNode {
    pub label: String,
    /// Row from the bottom (0: hosts).
    pub level: u32,
    /// Position along its row, 0..1.
    pub x: f64,
}

/// A cable of a fabric map.
pub struct MapLink {
    pub a: usize,
    pub b: usize,
    /// Colour, 0 (idle, green) .. 1 (red): e.g. the share of time waiting.
    pub heat: f64,
    /// Thickness, 0..1: e.g. utilisation.
    pub weight: f64,
    /// Drawn over a wide blue band (e.g. the cable a remedy concerns).
    pub highlight: bool,
}

/// What a fabric map shows: its nodes and cables, and routes (node
/// indices) drawn over them in purple.
pub struct FabricMap<'a> {
    pub title: &'a str,
    pub legend: &'a str,
    pub nodes: &'a [MapNode],
    pub links: &'a [MapLink],
    pub routes: &'a [Vec<usize>],
}

/// A fabric drawn level by level with its cables coloured by `heat`:
/// writes `base.svg` and `base.png`.
pub fn fabric_map(base: &Path, map: &FabricMap) -> Result<[PathBuf; 2], PlotError> {
    if map.nodes.is_empty() {
        return Err(PlotError::Empty("a fabric map needs nodes"));
    }
    render(base, (1200, 700), map)
}

/// [`fabric_map`] as an SVG document in a string.
pub fn fabric_map_svg(map: &FabricMap) -> Result<String, PlotError> {
    if map.nodes.is_empty() {
        return Err(PlotError::Empty("a fabric map needs nodes"));
    }
    render_svg_string((1200, 700), map)
}

/// Green (0) through yellow to red (1).
fn heat_colour(h: f64) -> RGBColor {
    let h = if h.is_finite() {
        h.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (r, g) = if h < 0.5 {
        (2.0 * h, 1.0)
    } else {
        (1.0, 2.0 * (1.0 - h))
    };
    RGBColor((40.0 + 200.0 * r) as u8, (40.0 + 160.0 * g) as u8, 40)
}

impl Picture for FabricMap<'_> {
    fn draw<DB: DrawingBackend>(&self, area: DrawingArea<DB, Shift>) -> Result<(), String> {
        let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
        area.fill(&WHITE).map_err(e)?;
        let (w, h) = area.dim_in_pixel();
        let (w, h) = (f64::from(w), f64::from(h));
        area.draw(&Text::new(
            self.title,
            (15, 10),
            ("sans-serif", 22).into_font(),
        ))
        .map_err(e)?;
        // The legend's lines, the last at the bottom.
        let legend: Vec<&str> = self.legend.lines().collect();
        for (i, line) in legend.iter().enumerate() {
            let y = h as i32 - 25 - 18 * (legend.len() - 1 - i) as i32;
            area.draw(&Text::new(*line, (15, y), ("sans-serif", 14).into_font()))
                .map_err(e)?;
        }
        let bottom = 52.0 + 18.0 * legend.len() as f64;
        let top = self.nodes.iter().map(|n| n.level).max().unwrap_or(0).max(1);
        let at = |n: &MapNode| -> (i32, i32) {
            let x = 40.0 + n.x.clamp(0.0, 1.0) * (w - 80.0);
            let y = h - bottom - f64::from(n.level) / f64::from(top) * (h - bottom - 70.0);
            (x as i32, y as i32)
        };
        for l in self.links.iter().filter(|l| l.highlight) {
            let (Some(a), Some(b)) = (self.nodes.get(l.a), self.nodes.get(l.b)) else {
                continue;
            };
            area.draw(&PathElement::new(
                vec![at(a), at(b)],
                RGBColor(60, 110, 230).mix(0.45).stroke_width(11),
            ))
            .map_err(e)?;
        }
        for l in self.links {
            let (Some(a), Some(b)) = (self.nodes.get(l.a), self.nodes.get(l.b)) else {
                continue;
            };
            let width = 1 + (l.weight.clamp(0.0, 1.0) * 5.0) as u32;
            area.draw(&PathElement::new(
                vec![at(a), at(b)],
                heat_colour(l.heat).stroke_width(width),
            ))
            .map_err(e)?;
        }
        // Routes, each a little apart from the others so that they show.
        for (k, r) in self.routes.iter().enumerate() {
            let dx = 3 * (k as i32) - 4;
            let pts: Vec<(i32, i32)> = r
                .iter()
                .filter_map(|&i| self.nodes.get(i))
                .map(|n| {
                    let (x, y) = at(n);
                    (x + dx, y)
                })
                .collect();
            area.draw(&PathElement::new(
                pts,
                RGBColor(140, 40, 190).stroke_width(2),
            ))
            .map_err(e)?;
        }
        let crowded: std::collections::BTreeMap<u32, usize> =
            self.nodes.iter().fold(Default::default(), |mut m, n| {
                *m.entry(n.level).or_default() += 1;
                m
            });
        for n in self.nodes {
            let (x, y) = at(n);
            area.draw(&Rectangle::new(
                [(x - 4, y - 4), (x + 4, y + 4)],
                BLACK.filled(),
            ))
            .map_err(e)?;
            if crowded[&n.level] <= 40 {
                let style = ("sans-serif", 11).into_font().color(&BLACK);
                area.draw(&Text::new(n.label.clone(), (x - 12, y + 7), style))
                    .map_err(e)?;
            }
        }
        area.present().map_err(e)
    }
}

/// Something drawn the same way on any backend.
trait Picture {
    fn draw<DB: DrawingBackend>(&self, area: DrawingArea<DB, Shift>) -> Result<(), String>;
}

struct LineChart<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    series: &'a [Series],
}

impl Picture for LineChart<'_> {
    fn draw<DB: DrawingBackend>(&self, area: DrawingArea<DB, Shift>) -> Result<(), String> {
        let all: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .collect();
        let (x0, x1) = bounds(all.iter().map(|p| p.0));
        let (_, y1) = bounds(all.iter().map(|p| p.1));
        let y0 = 0.0f64.min(all.iter().map(|p| p.1).fold(f64::INFINITY, f64::min));
        area.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&area)
            .caption(self.title, ("sans-serif", 24))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(x0..x1, y0..y1 * 1.05)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, s) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        if self.series.len() > 1 {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(|e| e.to_string())?;
        }
        area.present().map_err(|e| e.to_string())
    }
}

struct Scatter<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    series: &'a [Series],
    labels: &'a [(f64, f64, String)],
}

impl Picture for Scatter<'_> {
    fn draw<DB: DrawingBackend>(&self, area: DrawingArea<DB, Shift>) -> Result<(), String> {
        let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
        let all: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .collect();
        let (x0, x1) = bounds(all.iter().map(|p| p.0));
        let (y0, y1) = bounds(all.iter().map(|p| p.1));
        // Room around the marks, and for the labels right of them.
        let (dx, dy) = ((x1 - x0).max(1e-9) * 0.08, (y1 - y0).max(1e-9) * 0.1);
        area.fill(&WHITE).map_err(e)?;
        let mut chart = ChartBuilder::on(&area)
            .caption(self.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d((x0 - dx)..(x1 + 2.0 * dx), (y0 - dy).max(0.0)..(y1 + dy))
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, s) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            if let Some(name) = s.name.strip_prefix('~') {
                chart
                    .draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| e.to_string())?
                    .label(name.to_string())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                continue;
            }
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 5, color.filled())))
                .map_err(|e| e.to_string())?
                .label(s.name.clone())
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
        }
        let style = ("sans-serif", 13).into_font().color(&BLACK);
        for (x, y, text) in self.labels {
            chart
                .draw_series(std::iter::once(Text::new(
                    text.clone(),
                    (*x, *y),
                    style.clone(),
                )))
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
        area.present().map_err(e)
    }
}

struct HeatMap<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    rows: &'a [Vec<f64>],
    x_ticks: &'a [String],
    y_ticks: &'a [String],
}

impl Picture for HeatMap<'_> {
    fn draw<DB: DrawingBackend>(&self, area: DrawingArea<DB, Shift>) -> Result<(), String> {
        let rows = self.rows;
        let height = rows.len();
        let width = rows.iter().map(Vec::len).max().unwrap_or(1);
        let max = rows
            .iter()
            .flatten()
            .copied()
            .fold(0.0f64, f64::max)
            .max(1e-12);
        area.fill(&WHITE).map_err(|e| e.to_string())?;
        let (w, _) = area.dim_in_pixel();
        let (main, legend) = area.split_horizontally(w.saturating_sub(90));
        // Room for the longest row label (link names are long), within reason.
        let longest = self
            .y_ticks
            .iter()
            .map(|t| t.chars().count())
            .max()
            .unwrap_or(0);
        let y_area = (longest as u32 * 8 + 30).clamp(65, 280);
        // Segmented axes: one segment per cell, labelled at its centre.
        let mut chart = ChartBuilder::on(&main)
            .caption(self.title, ("sans-serif", 24))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(y_area)
            .build_cartesian_2d(
                // A segmented range a..b has b - a + 1 segments.
                (0..width.saturating_sub(1).max(1)).into_segmented(),
                (0..height.saturating_sub(1).max(1)).into_segmented(),
            )
            .map_err(|e| e.to_string())?;
        let label = |ticks: &[String], v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) => ticks.get(*i).cloned().unwrap_or_else(|| i.to_string()),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .x_labels(width.min(40))
            .y_labels(height.min(40))
            .x_label_formatter(&|v| label(self.x_ticks, v))
            .y_label_formatter(&|v| label(self.y_ticks, v))
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| e.to_string())?;
        let cells = rows.iter().enumerate().flat_map(|(y, row)| {
            row.iter().enumerate().map(move |(x, &v)| {
                let c = ViridisRGB::get_color(v / max);
                Rectangle::new(
                    [
                        (SegmentValue::Exact(x), SegmentValue::Exact(y)),
                        (SegmentValue::Exact(x + 1), SegmentValue::Exact(y + 1)),
                    ],
                    c.filled(),
                )
            })
        });
        chart.draw_series(cells).map_err(|e| e.to_string())?;
        // Colour scale.
        let mut scale = ChartBuilder::on(&legend)
            .margin_top(50)
            .margin_bottom(57)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..1.0, 0.0..max)
            .map_err(|e| e.to_string())?;
        scale
            .configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|e| e.to_string())?;
        let steps = 100;
        scale
            .draw_series((0..steps).map(|i| {
                let lo = max * i as f64 / steps as f64;
                let hi = max * (i + 1) as f64 / steps as f64;
                Rectangle::new(
                    [(0.0, lo), (1.0, hi)],
                    ViridisRGB::get_color(lo / max).filled(),
                )
            }))
            .map_err(|e| e.to_string())?;
        area.present().map_err(|e| e.to_string())
    }
}

struct BarChart<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    bars: &'a [Bar],
}

impl Picture for BarChart<'_> {
    fn draw<DB: DrawingBackend>(&self, area: DrawingArea<DB, Shift>) -> Result<(), String> {
        let n = self.bars.len();
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        let top = self
            .bars
            .iter()
            .map(|b| finite(b.value))
            .fold(0.0f64, f64::max);
        let top = if top > 0.0 { top * 1.05 } else { 1.0 };
        area.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&area)
            .caption(self.title, ("sans-serif", 24))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d((0..n.saturating_sub(1).max(1)).into_segmented(), 0.0..top)
            .map_err(|e| e.to_string())?;
        let labels = self.bars;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .x_labels(n)
            // Every bar up to 12, then every k-th, so that labels never overlap.
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if i % n.div_ceil(12) == 0 => {
                    labels.get(*i).map_or(String::new(), |b| b.label.clone())
                }
                _ => String::new(),
            })
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| e.to_string())?;
        let color = Palette99::pick(0).to_rgba();
        chart
            .draw_series(self.bars.iter().enumerate().map(|(i, b)| {
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), finite(b.value)),
                    ],
                    color.filled(),
                );
                bar.set_margin(0, 0, 2, 2);
                bar
            }))
            .map_err(|e| e.to_string())?;
        area.present().map_err(|e| e.to_string())
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    }
}

/// Draws the same picture to SVG and PNG.
fn render(
    base: &Path,
    size: (u32, u32),
    picture: &impl Picture,
) -> Result<[PathBuf; 2], PlotError> {
    let svg = base.with_extension("svg");
    let png = base.with_extension("png");
    // Both backends lay text out with the registered font.
    ensure_font()?;
    picture
        .draw(SVGBackend::new(&svg, size).into_drawing_area())
        .map_err(|message| PlotError::Draw {
            path: svg.clone(),
            message,
        })?;
    picture
        .draw(BitMapBackend::new(&png, size).into_drawing_area())
        .map_err(|message| PlotError::Draw {
            path: png.clone(),
            message,
        })?;
    Ok([svg, png])
}

/// Draws a picture to an SVG document held in memory.
fn render_svg_string(size: (u32, u32), picture: &impl Picture) -> Result<String, PlotError> {
    ensure_font()?;
    let mut text = String::new();
    // The backend writes into `text` when it is dropped at the end of `draw`.
    picture
        .draw(SVGBackend::with_string(&mut text, size).into_drawing_area())
        .map_err(|message| PlotError::Draw {
            path: PathBuf::from("<svg string>"),
            message,
        })?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_svg_and_png() {
        let dir = std::env::temp_dir().join(format!("evb-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let series = [Series {
            name: "a".into(),
            points: (0..50).map(|i| (f64::from(i), f64::from(i * i))).collect(),
        }];
        let [svg, png] =
            line_chart(&dir.join("line"), "Throughput", "t (us)", "Gb/s", &series).unwrap();
        let text = std::fs::read_to_string(svg).unwrap();
        assert!(text.contains("<svg") && text.contains("Throughput"));
        let bytes = std::fs::read(png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let rows: Vec<Vec<f64>> = (0..10)
            .map(|y| (0..20).map(|x| f64::from(x * y)).collect())
            .collect();
        let [svg, png] = heat_map(&dir.join("heat"), "Load", "link", "step", &rows).unwrap();
        assert!(std::fs::read_to_string(svg).unwrap().contains("<rect"));
        assert!(std::fs::metadata(png).unwrap().len() > 1000);
        assert!(matches!(
            line_chart(&dir.join("e"), "t", "x", "y", &[]),
            Err(PlotError::Empty(_))
        ));
    }

    #[test]
    fn svg_strings_are_whole_documents() {
        let series = [Series {
            name: "a".into(),
            points: vec![(0.0, 1.0), (1.0, 3.0)],
        }];
        let line = line_chart_svg("Rate", "t", "Gb/s", &series).unwrap();
        assert!(line.starts_with("<svg") && line.trim_end().ends_with("</svg>"));
        assert!(line.contains("Rate"));
        let heat = heat_map_svg(
            "Grid",
            "x",
            "y",
            &[vec![1.0, 2.0], vec![3.0, 4.0]],
            &["a".into(), "b".into()],
            &["c".into(), "d".into()],
        )
        .unwrap();
        assert!(heat.matches("<rect").count() >= 4, "{heat}");
        let bars = [
            Bar {
                label: "first".into(),
                value: 2.0,
            },
            Bar {
                label: "second".into(),
                value: f64::NAN,
            },
        ];
        let svg = bar_chart_svg("Bars", "what", "n", &bars).unwrap();
        assert!(svg.contains("first") && svg.contains("second") && !svg.contains("NaN"));
        assert!(matches!(
            bar_chart_svg("t", "x", "y", &[]),
            Err(PlotError::Empty(_))
        ));
    }
}
