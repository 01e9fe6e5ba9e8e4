//! `evb fabric counters` (read every port's counters into a snapshot) and
//! `evb fabric diagnose` (why does this fabric underperform: the counters
//! mapped onto links, routes, the shift's conflicts and the cabling, and
//! the remedies ranked by the rate `evb sim` predicts after each). The
//! analysis is `evb_fabric::diagnose`; the predictions run the simulator
//! here, since evb-fabric does not depend on it. See docs/fabric.md.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use evb_fabric::counters::collect::{collect, now_s, CollectOptions};
use evb_fabric::counters::formats::{read_any, Format};
use evb_fabric::counters::place;
use evb_fabric::io;
use evb_fabric::setup;

/// Arguments of `evb fabric counters`.
#[derive(Debug, Args)]
pub struct CountersArgs {
    /// The fabric: ibnetdiscover output (LIDs, GUIDs and cables of the
    /// live fabric).
    #[arg(long)]
    topology: String,
    /// GUID-to-host-name map (as the other `evb fabric` commands).
    #[arg(long = "names")]
    names: Option<PathBuf>,
    /// The snapshot to write.
    #[arg(long)]
    out: PathBuf,
    /// Read counters the user already has instead of the live fabric:
    /// perfquery output, ibdiagnet2.pm or ibdiagnet2.db_csv.
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
    /// With --from: when the counters were read (Unix seconds); default
    /// the file's modification time.
    #[arg(long)]
    time_s: Option<f64>,
    /// Clear the counters right after reading them (`perfquery -r`).
    #[arg(long)]
    reset: bool,
    /// Read only the basic counters (no `perfquery -x`).
    #[arg(long)]
    basic_only: bool,
    /// perfquery calls at once.
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// Longest one perfquery call may take, ms.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// The perfquery program.
    #[arg(long, default_value = "perfquery")]
    perfquery: PathBuf,
    /// Local adapter and port perfquery sends from (`-C`, `-P`).
    #[arg(long)]
    ca: Option<String>,
    #[arg(long)]
    ca_port: Option<u8>,
}

/// `evb fabric counters`.
pub fn counters(a: CountersArgs) -> Result<()> {
    let (topo, notes) = setup::load_named(&a.topology, a.names.as_deref())?;
    print_notes(&notes);
    let t0 = std::time::Instant::now();
    let (snap, notes, what) = match &a.from {
        Some(f) => {
            let time_s = match a.time_s {
                Some(t) => t,
                None => file_time(f)?,
            };
            let (read, format) = read_any(f, &topo, time_s)?;
            let what = match format {
                Format::Snapshot => "an evb snapshot",
                Format::Perfquery => "perfquery output",
                Format::IbdiagnetPm => "ibdiagnet2.pm",
                Format::IbdiagnetCsv => "ibdiagnet2.db_csv",
            };
            (read.snap, read.notes, format!("{} ({what})", f.display()))
        }
        None => {
            let mut extra = Vec::new();
            if let Some(c) = &a.ca {
                extra.extend(["-C".to_string(), c.clone()]);
            }
            if let Some(p) = a.ca_port {
                extra.extend(["-P".to_string(), p.to_string()]);
            }
            let opts = CollectOptions {
                perfquery: a.perfquery.clone(),
                extra_args: extra,
                extended: !a.basic_only,
                reset: a.reset,
                timeout: Duration::from_millis(a.timeout_ms),
                jobs: a.jobs,
            };
            let (snap, notes) = collect(&topo, &opts)?;
            let what = snap.source.clone();
            (snap, notes, what)
        }
    };
    print_notes(&notes);
    // The snapshot must fit the fabric: an unknown GUID or port is an error.
    let placed = place(snap, a.from.as_deref().unwrap_or(&a.out), &topo)?;
    if !placed.uncabled.is_empty() {
        eprintln!(
            "note: {} port(s) have counters where the topology has no cable: {}",
            placed.uncabled.len(),
            placed
                .uncabled
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let snap = placed.snap;
    io::write_text(&a.out, &snap.to_json())?;
    let nodes: std::collections::BTreeSet<&str> =
        snap.ports.iter().map(|p| p.guid.as_str()).collect();
    println!(
        "{} ports of {} nodes from {what} in {:.2} s{}; written to {}",
        snap.ports.len(),
        nodes.len(),
        t0.elapsed().as_secs_f64(),
        if snap.reset_after_read {
            " (counters cleared after reading)"
        } else {
            ""
        },
        a.out.display()
    );
    Ok(())
}

/// A file's modification time, Unix seconds.
fn file_time(path: &Path) -> Result<f64> {
    let m = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .with_context(|| format!("{}: no modification time (give --time-s)", path.display()))?;
    Ok(m.duration_since(std::time::UNIX_EPOCH)
        .map_or(now_s(), |d| d.as_secs_f64()))
}

/// Prints notes for the user on stderr.
fn print_notes(notes: &[String]) {
    for n in notes {
        eprintln!("note: {n}");
    }
}
