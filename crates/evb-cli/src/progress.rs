//! Progress bars for long commands (`evb sim`, `evb scan`, `evb run`).
//!
//! A bar is for a person watching a terminal. In pipes, log files and CI it
//! would only add escape codes and carriage returns to the output, so there
//! the bar is hidden and every call on it does nothing.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps labelled `what`, drawn on stderr when stderr is a
/// terminal and the `CI` variable is not set; hidden otherwise.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    bar_when(None, len, what)
}

/// As [`bar`], with the automatic choice overridden by `show`
/// (`Some(true)`: draw even under CI, e.g. `--progress always`; `Some(false)`:
/// never). indicatif itself never draws when stderr is not a terminal.
pub fn bar_when(show: Option<bool>, len: u64, what: &str) -> ProgressBar {
    let visible = show.unwrap_or_else(|| {
        let ci = matches!(std::env::var_os("CI"), Some(v) if !v.is_empty());
        std::io::stderr().is_terminal() && !ci
    });
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {percent:>3}% {elapsed} (eta {eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
