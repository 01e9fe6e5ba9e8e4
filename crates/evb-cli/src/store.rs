//! `evb store`: the event store from the command line. `read` lists and
//! verifies every object of a directory or S3 prefix, so that a run's
//! output can be checked end to end after the fact (or in CI).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use evb_store::{read_store, ReadOptions, ReadReport, StoreTarget};

#[derive(Debug, Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Read every object of a store and verify every checksum (exit 1 if any is bad).
    Read(ReadArgs),
}

#[derive(Debug, Args)]
struct ReadArgs {
    /// A directory (or one .evbo file), or s3://bucket/prefix[?endpoint=URL&region=R]
    /// (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, endpoint also
    /// from AWS_ENDPOINT_URL).
    target: String,
    /// Print the report as JSON on standard output.
    #[arg(long)]
    json: bool,
    /// Objects larger than this many MiB are reported bad without being read.
    #[arg(long, default_value_t = 4096)]
    max_object_mib: u64,
    /// List every good object: MEP, events, bytes and the sources it holds.
    #[arg(long)]
    list: bool,
}

pub fn run(args: StoreArgs) -> anyhow::Result<ExitCode> {
    // Only prints: may die quietly when its reader goes away (`| head`).
    // SAFETY: setting a signal disposition before this command starts any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match args.command {
        StoreCommand::Read(args) => read(args),
    }
}

fn read(args: ReadArgs) -> anyhow::Result<ExitCode> {
    let target = StoreTarget::parse(&args.target)?;
    let options = ReadOptions {
        max_object_bytes: args.max_object_mib.saturating_mul(1 << 20),
        list: args.list,
        ..ReadOptions::default()
    };
    let report = read_store(&target, &options)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", format_report(&report));
    }
    Ok(if report.bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Partial objects named in the text report.
const PARTIAL_SHOWN: usize = 20;

/// Source indices as `0,1,3`.
fn list(sources: &[u32]) -> String {
    sources
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn format_report(r: &ReadReport) -> String {
    let mut out = format!(
        "evb store read: {}\nobjects {} ({} good, {} bad)  events {}  bytes {} ({:.3} GB)",
        r.target,
        r.objects,
        r.good_objects,
        r.bad.len(),
        r.events,
        r.bytes,
        r.bytes as f64 / 1e9
    );
    if r.other_files > 0 {
        out.push_str(&format!("  ({} other files skipped)", r.other_files));
    }
    out.push('\n');
    if r.version_1_objects > 0 {
        out.push_str(&format!(
            "{} objects of layout version 1 (no source table: every source)\n",
            r.version_1_objects
        ));
    }
    if r.selection_objects > 0 {
        out.push_str(&format!(
            "selections {} (objects holding the events a filter unit accepted): {} of their MEPs' {} events\n",
            r.selection_objects, r.selection_events, r.selection_mep_events
        ));
    }
    if r.partial_objects > 0 {
        let by_source: Vec<String> = r
            .missing_by_source
            .iter()
            .map(|(s, n)| format!("source {s} in {n}"))
            .collect();
        out.push_str(&format!(
            "partial objects {} (built without some sources; missing: {})\n",
            r.partial_objects,
            by_source.join(", ")
        ));
        for p in r.partial.iter().take(PARTIAL_SHOWN) {
            out.push_str(&format!(
                "partial: {}: MEP {}, sources {} of {}, missing {}\n",
                p.name,
                p.mep,
                p.sources_stored,
                p.run_sources,
                list(&p.missing)
            ));
        }
        if r.partial_objects as usize > PARTIAL_SHOWN {
            out.push_str(&format!(
                "partial: ... {} more (--json lists {} at most, --list all objects)\n",
                r.partial_objects as usize - PARTIAL_SHOWN,
                evb_store::reader::MAX_LISTED
            ));
        }
    }
    for o in &r.listed {
        out.push_str(&format!(
            "object: {}: v{} MEP {} events {}{} bytes {} sources {} of {}: {}\n",
            o.name,
            o.version,
            o.mep,
            o.events,
            if o.events < o.mep_events {
                format!(" of {}", o.mep_events)
            } else {
                String::new()
            },
            o.bytes,
            o.sources.len(),
            o.run_sources,
            list(&o.sources)
        ));
    }
    for bad in &r.bad {
        out.push_str(&format!("bad: {}: {}\n", bad.name, bad.reason));
    }
    if r.objects == 0 {
        out.push_str("no objects found\n");
    }
    out
}
