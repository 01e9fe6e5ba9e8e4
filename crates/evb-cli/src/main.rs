//! `evb`: one binary, several subcommands. The work lives in the library
//! crates; this file only parses the command line and dispatches.

mod fabric;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "evb",
    version,
    about = "Event builders for trigger-less DAQ: run, analyse, simulate"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fabric analysis: topologies, routing, LFTs, shift conflicts.
    Fabric(fabric::FabricArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fabric(args) => fabric::run(args),
    };
    if let Err(err) = result {
        eprintln!("evb: error: {err:#}");
        std::process::exit(2);
    }
}
