//! `evb fabric ...`: fabric analysis commands (issue 3).

use clap::Args;

/// Arguments of `evb fabric`.
#[derive(Debug, Args)]
pub struct FabricArgs {}

/// Runs `evb fabric`.
pub fn run(_args: FabricArgs) -> anyhow::Result<()> {
    anyhow::bail!("evb fabric is not implemented yet")
}
