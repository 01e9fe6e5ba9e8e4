//! Errors of the fabric crate: every input error names its file and line.

use std::path::PathBuf;

/// An error from reading, routing or analysing a fabric.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// A line of an input file could not be understood.
    #[error("{}:{line}: {msg}", file.display())]
    Parse {
        file: PathBuf,
        line: usize,
        msg: String,
    },
    /// A file could not be read or written.
    // The cause is in the message, not chained, so it is printed once.
    #[error("{}: {err}", file.display())]
    Io { file: PathBuf, err: std::io::Error },
    /// Routing tables do not deliver a flow (missing route, loop, dead port).
    #[error("{0}")]
    Route(String),
    /// A request that cannot be satisfied on this fabric.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, FabricError>;

pub(crate) fn parse_err(
    file: &std::path::Path,
    line: usize,
    msg: impl Into<String>,
) -> FabricError {
    FabricError::Parse {
        file: file.to_path_buf(),
        line,
        msg: msg.into(),
    }
}

pub(crate) fn io_err(file: &std::path::Path, err: std::io::Error) -> FabricError {
    FabricError::Io {
        file: file.to_path_buf(),
        err,
    }
}
