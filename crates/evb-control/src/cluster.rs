//! Running under a cluster launcher (`mpirun`, `srun`): who am I, and where
//! are the others.
//!
//! The rank and the number of ranks come from the launcher's environment
//! (OpenMPI, MPICH/Hydra and other PMI launchers, Slurm). Addresses are
//! exchanged through a rendezvous directory that every rank can see (a
//! shared filesystem, or a local directory on one host): each rank writes
//! its token to `DIR/run<id>/<rank>` (write then rename, so a reader never
//! sees half a token) and waits until every rank's file is there.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Rank and size from the launcher's environment, if there is one.
pub fn launcher_rank() -> Option<(u16, u16, &'static str)> {
    const VARS: [(&str, &str, &str); 4] = [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OpenMPI"),
        ("PMI_RANK", "PMI_SIZE", "PMI (MPICH/Hydra)"),
        ("PMIX_RANK", "PMIX_SIZE", "PMIx"),
        ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
    ];
    VARS.iter().find_map(|(r, s, who)| {
        let rank = std::env::var(r).ok()?.parse().ok()?;
        let size = std::env::var(s).ok()?.parse().ok()?;
        Some((rank, size, *who))
    })
}

/// Rank `r`'s token in `run_dir`, if published.
fn read_token(run_dir: &Path, r: usize) -> Result<Option<String>> {
    let Ok(text) = std::fs::read_to_string(run_dir.join(r.to_string())) else {
        return Ok(None);
    };
    let text = text.trim();
    if text.is_empty() || text.len() > 4096 || text.contains(char::is_whitespace) {
        bail!(
            "rendezvous file of rank {r} in {} is malformed",
            run_dir.display()
        );
    }
    Ok(Some(text.to_string()))
}

/// How many ranks published a token for run `run_id` (ranks 0..n): the
/// size of the job a restarted rank rejoins, started on its own outside
/// the job's launcher.
pub fn published_ranks(dir: &Path, run_id: u32) -> Result<u16> {
    let run_dir = dir.join(format!("run{run_id}"));
    let mut n = 0u16;
    while read_token(&run_dir, n as usize)?.is_some() {
        n = n
            .checked_add(1)
            .context("too many ranks in the rendezvous directory")?;
    }
    if n == 0 {
        bail!(
            "no rank of run {run_id} published its address in {}: is this the job's rendezvous directory?",
            run_dir.display()
        );
    }
    Ok(n)
}

/// Every rank's published token, publishing nothing: a restarted TCP rank
/// listens again where it published (its peers re-dial that address).
pub fn published_tokens(dir: &Path, run_id: u32, size: u16) -> Result<Vec<String>> {
    let run_dir = dir.join(format!("run{run_id}"));
    (0..size as usize)
        .map(|r| {
            read_token(&run_dir, r)?
                .with_context(|| format!("rank {r} has no address in {}", run_dir.display()))
        })
        .collect()
}

/// Publishes this rank's token and returns every rank's, by rank.
pub fn exchange_tokens(
    dir: &Path,
    run_id: u32,
    rank: u16,
    size: u16,
    token: &str,
    timeout: Duration,
) -> Result<Vec<String>> {
    publish_token(dir, run_id, rank, token)?;
    wait_tokens(dir, run_id, size, timeout)
}

/// Publishes rank `rank`'s token in `DIR/run<run_id>/<rank>` (write, then
/// rename: a reader never sees half a token).
pub fn publish_token(dir: &Path, run_id: u32, rank: u16, token: &str) -> Result<()> {
    let run_dir = dir.join(format!("run{run_id}"));
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("creating the rendezvous directory {}", run_dir.display()))?;
    let tmp = run_dir.join(format!(".{rank}.{}", std::process::id()));
    std::fs::write(&tmp, token).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, run_dir.join(rank.to_string()))
        .with_context(|| format!("publishing rank {rank} in {}", run_dir.display()))
}

/// Waits up to `timeout` until ranks `0..size` have published their
/// tokens, and returns them by rank.
pub fn wait_tokens(dir: &Path, run_id: u32, size: u16, timeout: Duration) -> Result<Vec<String>> {
    let run_dir = dir.join(format!("run{run_id}"));
    let deadline = Instant::now() + timeout;
    let mut tokens: Vec<Option<String>> = vec![None; size as usize];
    loop {
        for (r, t) in tokens.iter_mut().enumerate() {
            if t.is_none() {
                *t = read_token(&run_dir, r)?;
            }
        }
        if tokens.iter().all(Option::is_some) {
            return Ok(tokens.into_iter().map(|t| t.expect("all known")).collect());
        }
        if Instant::now() > deadline {
            let missing: Vec<usize> = (0..tokens.len()).filter(|&r| tokens[r].is_none()).collect();
            bail!(
                "ranks {missing:?} did not publish their address in {} within {timeout:?}",
                run_dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `evb run --external-consumers` publishes in `DIR/run<id>/` for
/// the consumers that join it from programs of their own: the run's
/// configuration, its run key (0600, named by the configuration's
/// `transport.run_key_file`) and the ranks left to them (one line,
/// space-separated). A consumer takes a rank by creating
/// `claim-<rank>` there exclusively.
pub mod external {
    pub const CONFIG_FILE: &str = "config.toml";
    pub const KEY_FILE: &str = "run.key";
    pub const RANKS_FILE: &str = "external";
}
