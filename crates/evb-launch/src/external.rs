//! External consumers: Filter Units that `evb run` does not start
//! (`--external-consumers K`), programs of their own built on `libevb` or
//! its Python package, that join the run through a rendezvous directory.
//!
//! The last K consumer endpoints are theirs. Before the nodes start, the
//! launcher publishes in `DIR/run<id>/` what a consumer needs to join: the
//! run's configuration (`config.toml`), the run key (`run.key`, 0600: the
//! configuration names it in `transport.run_key_file`, and the nodes read
//! the same file) and the ranks left to external consumers (`external`).
//! Once its own nodes listen, it publishes their addresses there (as a
//! cluster job's ranks do, [`evb_control::cluster`]) and waits for the
//! external consumers' addresses before it hands every node the full list.
//! At the end each external consumer leaves its final report in
//! `DIR/run<id>/final-<rank>.json`, which the summary counts like any
//! node's.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use evb_control::cluster;
use evb_control::report::NodeReport;
use evb_core::Config;

use evb_control::cluster::external::{CONFIG_FILE, KEY_FILE, RANKS_FILE};

/// How long the launcher waits for the external consumers to join, and
/// for their final reports once its own nodes are done.
const JOIN_WAIT: Duration = Duration::from_secs(60);
const REPORT_WAIT: Duration = Duration::from_secs(20);

/// The external consumers of a run and where they meet it.
#[derive(Debug, Clone)]
pub struct External {
    /// The rendezvous directory and this run's directory in it.
    pub dir: PathBuf,
    pub run_dir: PathBuf,
    pub run_id: u32,
    /// Their ranks: the last of the run's endpoints.
    pub first: u16,
    pub endpoints: u16,
}

impl External {
    /// Prepares `DIR/run<id>` for `count` external consumers of a run of
    /// `endpoints` endpoints: refuses one a run used already (its
    /// addresses would be taken for this run's), writes the run key and
    /// sets `transport.run_key_file` in `config` to it.
    pub fn prepare(
        dir: &Path,
        count: u16,
        endpoints: u16,
        config: &mut Config,
        run_key: &str,
    ) -> Result<External> {
        let run_id = config.run.run_id;
        let dir = std::path::absolute(dir)
            .with_context(|| format!("rendezvous directory {}", dir.display()))?;
        let run_dir = dir.join(format!("run{run_id}"));
        let used = std::fs::read_dir(&run_dir).is_ok_and(|mut d| d.next().is_some());
        if used {
            bail!(
                "--rendezvous: {} holds an earlier run's files: use a fresh directory or another run.run_id",
                run_dir.display()
            );
        }
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("creating {}", run_dir.display()))?;
        let key_path = run_dir.join(KEY_FILE);
        write_private(&key_path, run_key.as_bytes())?;
        config.transport.run_key_file = key_path.display().to_string();
        let first = endpoints - count;
        let ranks: Vec<String> = (first..endpoints).map(|r| r.to_string()).collect();
        std::fs::write(run_dir.join(RANKS_FILE), ranks.join(" ") + "\n")
            .with_context(|| format!("writing {}", run_dir.join(RANKS_FILE).display()))?;
        Ok(External {
            dir,
            run_dir,
            run_id,
            first,
            endpoints,
        })
    }

    /// Publishes the configuration the consumers join with (the nodes'
    /// own, run key file included).
    pub fn publish_config(&self, config: &Config) -> Result<()> {
        let path = self.run_dir.join(CONFIG_FILE);
        let tmp = self.run_dir.join(format!(".{CONFIG_FILE}.tmp"));
        std::fs::write(&tmp, toml::to_string(config)?)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Publishes the launched nodes' addresses and returns every
    /// endpoint's, once the external consumers published theirs.
    pub fn exchange(&self, launched: &[String]) -> Result<Vec<String>> {
        for (rank, token) in launched.iter().enumerate() {
            cluster::publish_token(&self.dir, self.run_id, rank as u16, token)?;
        }
        tracing::warn!(
            "evb run: waiting for {} external consumer(s), endpoints {}..{}, to join through {}",
            self.endpoints - self.first,
            self.first,
            self.endpoints - 1,
            self.dir.display()
        );
        cluster::wait_tokens(&self.dir, self.run_id, self.endpoints, JOIN_WAIT)
            .context("external consumers (--external-consumers) did not join")
    }

    /// The external consumers' final reports, waiting up to 20 s for the
    /// ones not written yet (`None`: never written: the consumer died, or
    /// never closed its end).
    pub fn final_reports(&self) -> Vec<Option<NodeReport>> {
        let deadline = Instant::now() + REPORT_WAIT;
        let read = |rank: u16| -> Option<NodeReport> {
            let path = self.run_dir.join(format!("final-{rank}.json"));
            let text = std::fs::read_to_string(path).ok()?;
            serde_json::from_str(&text).ok()
        };
        let mut reports: Vec<Option<NodeReport>> =
            (self.first..self.endpoints).map(|_| None).collect();
        loop {
            for (i, r) in reports.iter_mut().enumerate() {
                if r.is_none() {
                    *r = read(self.first + i as u16);
                }
            }
            if reports.iter().all(Option::is_some) || Instant::now() > deadline {
                return reports;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Writes a file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}
