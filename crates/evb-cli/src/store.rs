//! `evb store`: the event store from the command line. `read` lists and
//! verifies every object of a directory or S3 prefix, so that a run's
//! output can be checked end to end after the fact (or in CI).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use evb_store::{read_store, ReadOptions, StoreTarget};

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
        print!("{}", report.text());
    }
    Ok(if report.bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
