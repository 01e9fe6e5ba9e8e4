//! Reading what evb writes: the run JSON of `evb run --json`, the `FINAL`
//! report a node prints on its stdout, and values deep in either, with
//! failures that name the missing key and show where it was looked for.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

/// The JSON in file `path`; panics with `context` (e.g. the run's output)
/// when the file is missing or not JSON.
pub fn read_json(path: &Path, context: &str) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no JSON at {} ({e}):\n{context}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}):\n{context}", path.display()))
}

/// The JSON in file `path`, or `Value::Null` when there is none (a run that
/// failed early writes none; the test's assertions then say what failed).
pub fn read_json_or_null(path: &Path) -> Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// The value at dotted `path` (`summary.events_built`) in `v`.
pub fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |cur, key| &cur[key])
}

/// The unsigned integer at dotted `path`; panics naming it when missing.
pub fn u64_at(v: &Value, path: &str) -> u64 {
    at(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

/// The number at dotted `path`; panics naming it when missing.
pub fn f64_at(v: &Value, path: &str) -> f64 {
    at(v, path)
        .as_f64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

/// `summary.KEY` of a run JSON as an unsigned integer; panics naming the
/// key, with the summary, when missing.
pub fn summary_u64(v: &Value, key: &str) -> u64 {
    v["summary"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("summary.{key} missing in {}", v["summary"]))
}

/// `summary.KEY` of a run JSON as a number; panics as [`summary_u64`].
pub fn summary_f64(v: &Value, key: &str) -> f64 {
    v["summary"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("summary.{key} missing in {}", v["summary"]))
}

/// The JSON of a node's `FINAL ` line on its stdout; panics, with the
/// node's output, when there is none.
pub fn final_report(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("FINAL "))
        .unwrap_or_else(|| {
            panic!(
                "no final report: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_paths_reach_into_the_run_json() {
        let v = serde_json::json!({"summary": {"events_built": 7, "gbps": 1.5}});
        assert_eq!(u64_at(&v, "summary.events_built"), 7);
        assert_eq!(f64_at(&v, "summary.gbps"), 1.5);
        assert_eq!(summary_u64(&v, "events_built"), 7);
        let missing = std::panic::catch_unwind(|| summary_u64(&v, "events_lost"))
            .expect_err("a missing key fails");
        let message = missing.downcast_ref::<String>().unwrap();
        assert!(message.contains("summary.events_lost missing"), "{message}");
    }
}
