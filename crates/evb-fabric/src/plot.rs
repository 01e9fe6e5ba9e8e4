//! Plots of per-step conflicts and link load (SVG or PNG), readable at any
//! number of hosts: one point per step, two panels.

use crate::conflicts::Analysis;
use crate::error::{FabricError, Result};
use plotters::prelude::*;
use std::path::Path;

/// Fonts tried for text in PNG output (Debian `fonts-dejavu-core` first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers a system font for plotters' text; false if none is found.
fn ensure_font() -> bool {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONCE.get_or_init(|| {
        for f in FONTS {
            if let Ok(bytes) = std::fs::read(f) {
                let b: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, b).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// A panel: title, value per step, colour.
type Series<'a> = (
    &'a str,
    Box<dyn Fn(&crate::conflicts::StepStats) -> u64>,
    RGBColor,
);

fn perr<E: std::fmt::Display>(e: E) -> FabricError {
    FabricError::Invalid(format!("plot: {e}"))
}

/// Writes the plot; the format follows the extension (`.svg` or `.png`).
pub fn plot(a: &Analysis, title: &str, path: &Path) -> Result<()> {
    let text = ensure_font();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let size = (1400u32, 900u32);
    match ext.as_str() {
        "svg" => draw(
            SVGBackend::new(path, size).into_drawing_area(),
            a,
            title,
            text,
        ),
        "png" => draw(
            BitMapBackend::new(path, size).into_drawing_area(),
            a,
            title,
            text,
        ),
        _ => Err(FabricError::Invalid(format!(
            "{}: plot file must end in .svg or .png",
            path.display()
        ))),
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    a: &Analysis,
    title: &str,
    text: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(perr)?;
    let root = if text {
        root.titled(title, ("sans-serif", 26)).map_err(perr)?
    } else {
        root
    };
    let panels = root.split_evenly((2, 1));
    let xmax = a.per_step.iter().map(|s| s.step).max().unwrap_or(1) + 1;
    let series: [Series; 2] = [
        ("conflicts per step", Box::new(|s| s.conflicts), RED),
        (
            "max link load per step (flows on the busiest link)",
            Box::new(|s| s.max_link_load as u64),
            BLUE,
        ),
    ];
    for (area, (name, f, color)) in panels.iter().zip(series.iter()) {
        let ymax = a.per_step.iter().map(f).max().unwrap_or(0).max(1) + 1;
        let mut b = ChartBuilder::on(area);
        b.margin(15);
        if text {
            b.caption(*name, ("sans-serif", 20))
                .x_label_area_size(40)
                .y_label_area_size(60);
        }
        let mut chart = b
            .build_cartesian_2d(0usize..xmax, 0u64..ymax)
            .map_err(perr)?;
        if text {
            chart
                .configure_mesh()
                .x_desc("shift step")
                .y_desc(*name)
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(perr)?;
        } else {
            chart
                .configure_mesh()
                .disable_x_mesh()
                .disable_y_mesh()
                .x_labels(0)
                .y_labels(0)
                .draw()
                .map_err(perr)?;
        }
        chart
            .draw_series(a.per_step.iter().map(|s| {
                let v = f(s);
                Rectangle::new([(s.step, 0), (s.step + 1, v)], color.mix(0.8).filled())
            }))
            .map_err(perr)?;
    }
    root.present().map_err(perr)?;
    Ok(())
}
