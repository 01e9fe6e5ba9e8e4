//! The `evb` binary under test.
//!
//! Cargo builds a package's binaries before its integration tests and tells
//! them where with `CARGO_BIN_EXE_<name>`, but only to tests of the package
//! that owns the binary (evb-cli) and, in older cargo, only at compile
//! time: a helper in another crate cannot use `env!` for it. So the path
//! is taken from the variable at run time when cargo sets it, and
//! otherwise from where cargo puts binaries: beside the `deps/` directory
//! that holds the running test executable.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The repository's root (the workspace directory).
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .canonicalize()
            .expect("the workspace root")
    })
}

/// Path of the `evb` binary of this build (same profile as the test).
pub fn evb_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = match std::env::var_os("CARGO_BIN_EXE_evb") {
            Some(p) => PathBuf::from(p),
            None => {
                let exe = std::env::current_exe().expect("the test executable's path");
                // target/<profile>/deps/<test>-<hash> -> target/<profile>/evb
                let profile_dir = exe
                    .parent()
                    .and_then(Path::parent)
                    .expect("the test executable sits in target/<profile>/deps");
                profile_dir.join(format!("evb{}", std::env::consts::EXE_SUFFIX))
            }
        };
        assert!(
            path.is_file(),
            "{} is not there: run the evb-cli tests through cargo (`cargo test -p evb-cli`), \
             which builds the binary first",
            path.display()
        );
        path
    })
}

/// [`evb_path`] as text, for argument lists (`ip netns exec NS EVB ...`).
pub fn evb_path_str() -> &'static str {
    evb_path().to_str().expect("the evb binary's path is UTF-8")
}

/// A `Command` for the `evb` binary under test.
pub fn evb() -> Command {
    Command::new(evb_path())
}

/// evb built against MPICH (scripts/evb-mpich.sh: the `mpi` crate binds one
/// MPI at build time, and the default build is OpenMPI's). The first call
/// builds it; concurrent callers wait for that build.
pub fn mpich_evb() -> PathBuf {
    let script = repo_root().join("scripts/evb-mpich.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{} failed", script.display());
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}
