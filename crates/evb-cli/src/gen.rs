//! What a package installs besides the binary, made from the command line
//! itself so that it never drifts from it: man pages (`evb man DIR`:
//! clap_mangen, one page per command and subcommand) and shell
//! completions (`evb completions SHELL`: clap_complete).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory to write the pages to (evb.1, evb-run.1, ...).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: Shell,
}

/// Writes the completion script for `shell` to stdout.
pub fn completions(cmd: clap::Command, args: &CompletionsArgs) -> Result<()> {
    let mut cmd = cmd;
    clap_complete::generate(args.shell, &mut cmd, "evb", &mut std::io::stdout());
    Ok(())
}

/// Writes a page for `evb` and one for each of its subcommands, nested
/// ones named with dashes (`evb-fabric-order.1`).
pub fn man(cmd: clap::Command, args: &ManArgs) -> Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut cmd = cmd;
    cmd.build();
    write_pages(&cmd, "evb", &args.dir)
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &Path) -> Result<()> {
    // A page names its command in full (`evb-fabric-order`); clap takes
    // static names, and this runs once.
    let full: &'static str = Box::leak(name.to_string().into_boxed_str());
    let page = cmd.clone().name(full);
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}

/// The `evb` command line, for the generators.
pub fn command<C: CommandFactory>() -> clap::Command {
    C::command()
}
