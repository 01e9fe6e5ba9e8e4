//! Scratch directories: one per test process and tag, under the system's
//! temporary directory, kept after the run so a failure can be looked at.
//! (For a directory removed at the end, use the `tempfile` crate.)

use std::path::PathBuf;

/// `$TMPDIR/evb-TAG-PID`, created if needed.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("evb-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// A path named `name` in [`scratch_dir`]`(tag)`.
pub fn scratch_file(tag: &str, name: &str) -> PathBuf {
    scratch_dir(tag).join(name)
}
