//! The shared test kit of the evb workspace: the helpers that the
//! integration tests of several crates need, in one place instead of a copy
//! in each test file. A dev-dependency only; it depends on no evb crate.
//!
//! - [`bin`]: the `evb` binary under test (and its MPICH build), as a
//!   `Command`, and the repository's root.
//! - [`process`]: running processes bounded in time, reading their output
//!   while they run, and failing with that output when they overrun; a
//!   deadline and a watchdog for loops that poll.
//! - [`scratch`]: per-process scratch directories.
//! - [`json`]: the run JSON (`evb run --json`), the nodes' `FINAL` lines,
//!   and dotted-path getters that fail naming the missing key.
//! - [`net`]: free loopback ports and a plain HTTP GET.
//! - [`netns`]: real hosts as network namespaces joined by veth links and
//!   bridges (needs root; fails, never skips, without it).
//! - [`slurm`]: a one-node Slurm made for a test (munge, slurmctld, slurmd).
//! - [`relink`]: what the message engines' relink tests check of a new link.
//!
//! Everything here fails the test with a message that says what to do
//! (install a package, which key is missing, what the process printed):
//! a missing prerequisite is a failure, never a skipped test.

pub mod bin;
pub mod json;
pub mod minio;
pub mod net;
pub mod netns;
pub mod process;
pub mod relink;
pub mod scratch;
pub mod slurm;

pub use bin::{evb, evb_path, evb_path_str, mpich_evb, repo_root};
pub use json::{final_report, read_json, read_json_or_null, summary_f64, summary_u64};
pub use process::{run_bounded, run_unpanicked, wait_all, KillOnDrop};
pub use scratch::scratch_dir;
