//! `evb report`: the JSON results of runs, simulations, scans and fabric
//! analyses in one HTML page that opens anywhere, offline.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Files written by `evb run --json`, `evb sim --json`, `evb scan --json`
    /// or `evb fabric conflicts --json` (kinds are recognised from the content).
    #[arg(required = true, value_name = "RESULTS.json")]
    pub inputs: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(long, short, value_name = "report.html")]
    pub output: PathBuf,
}

pub fn run(args: ReportArgs) -> Result<()> {
    let inputs = args
        .inputs
        .iter()
        .map(|path| Ok((path.clone(), evb_report::load(path)?)))
        .collect::<Result<Vec<_>>>()?;
    let html = evb_report::render(&inputs)?;
    std::fs::write(&args.output, &html)
        .with_context(|| format!("writing {}", args.output.display()))?;
    println!(
        "wrote {} ({} inputs, {} KiB)",
        args.output.display(),
        inputs.len(),
        html.len().div_ceil(1024)
    );
    Ok(())
}
