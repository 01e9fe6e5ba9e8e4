//! Reading fields out of a parsed JSON file so that every mistake names the
//! file and the field (`run.json: field `summary.events_built`: ...`).
//!
//! The report reads `serde_json::Value`s rather than the writers' structs:
//! the files come from several evb versions and crates, and a report should
//! show what a file has and explain what it lacks, not refuse it wholesale.

use std::path::Path;

use serde_json::Value;

use crate::ReportError;

static NULL: Value = Value::Null;

/// A value in a file, with the key path that led to it.
#[derive(Clone)]
pub(crate) struct At<'a> {
    pub file: &'a Path,
    pub field: String,
    pub value: &'a Value,
}

impl<'a> At<'a> {
    pub fn root(file: &'a Path, value: &'a Value) -> Self {
        At {
            file,
            field: String::new(),
            value,
        }
    }

    /// The member `key` (null when absent or when this is not an object).
    pub fn get(&self, key: &str) -> At<'a> {
        let field = if self.field.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.field)
        };
        At {
            file: self.file,
            field,
            value: self.value.get(key).unwrap_or(&NULL),
        }
    }

    pub fn is_null(&self) -> bool {
        self.value.is_null()
    }

    pub fn error(&self, problem: impl Into<String>) -> ReportError {
        ReportError::Field {
            file: self.file.to_path_buf(),
            field: if self.field.is_empty() {
                "(top level)".into()
            } else {
                self.field.clone()
            },
            problem: problem.into(),
        }
    }

    fn expected(&self, what: &str) -> ReportError {
        if self.value.is_null() {
            self.error(format!("missing (expected {what})"))
        } else {
            self.error(format!("expected {what}, found {}", describe(self.value)))
        }
    }

    pub fn u64(&self) -> Result<u64, ReportError> {
        self.value
            .as_u64()
            .ok_or_else(|| self.expected("a whole number >= 0"))
    }

    pub fn f64(&self) -> Result<f64, ReportError> {
        self.value
            .as_f64()
            .filter(|v| v.is_finite())
            .ok_or_else(|| self.expected("a number"))
    }

    pub fn str(&self) -> Result<&'a str, ReportError> {
        self.value.as_str().ok_or_else(|| self.expected("a string"))
    }

    pub fn array(&self) -> Result<Vec<At<'a>>, ReportError> {
        let items = self
            .value
            .as_array()
            .ok_or_else(|| self.expected("an array"))?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, value)| At {
                file: self.file,
                field: format!("{}[{i}]", self.field),
                value,
            })
            .collect())
    }

    /// Absent or null is `None`; present with the wrong type is an error.
    pub fn opt_u64(&self) -> Result<Option<u64>, ReportError> {
        if self.is_null() {
            Ok(None)
        } else {
            self.u64().map(Some)
        }
    }

    pub fn opt_f64(&self) -> Result<Option<f64>, ReportError> {
        if self.is_null() {
            Ok(None)
        } else {
            self.f64().map(Some)
        }
    }

    pub fn opt_str(&self) -> Result<Option<&'a str>, ReportError> {
        if self.is_null() {
            Ok(None)
        } else {
            self.str().map(Some)
        }
    }

    pub fn opt_array(&self) -> Result<Vec<At<'a>>, ReportError> {
        if self.is_null() {
            Ok(Vec::new())
        } else {
            self.array()
        }
    }
}

/// A short description of a value for error messages (never the whole value).
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => {
            format!("a string \"{}...\"", s.chars().take(40).collect::<String>())
        }
        Value::String(s) => format!("the string \"{s}\""),
        Value::Array(a) => format!("an array of {} items", a.len()),
        Value::Object(_) => "an object".into(),
    }
}
