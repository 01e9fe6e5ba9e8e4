//! Small HTML building blocks: escaping, tables, number formats.

use std::fmt::Write;

/// Escapes text for HTML element content and attribute values.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A table cell: text (escaped when written) and an optional CSS class.
pub(crate) struct Cell {
    pub text: String,
    pub class: &'static str,
}

impl Cell {
    pub fn new(text: impl Into<String>) -> Self {
        Cell {
            text: text.into(),
            class: "",
        }
    }

    pub fn num(text: impl Into<String>) -> Self {
        Cell {
            text: text.into(),
            class: "num",
        }
    }

    pub fn with_class(mut self, class: &'static str) -> Self {
        self.class = class;
        self
    }
}

/// A table with a header row; `class` styles it.
pub(crate) fn table(head: &[&str], rows: &[Vec<Cell>]) -> String {
    let mut out = String::from("<table>\n<thead><tr>");
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            if cell.class.is_empty() {
                let _ = write!(out, "<td>{}</td>", esc(&cell.text));
            } else {
                let _ = write!(out, "<td class=\"{}\">{}</td>", cell.class, esc(&cell.text));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

/// A two-column key/value table.
pub(crate) fn facts(rows: &[(&str, String)]) -> String {
    let rows: Vec<Vec<Cell>> = rows
        .iter()
        .map(|(k, v)| vec![Cell::new(*k), Cell::num(v.clone())])
        .collect();
    table(&["", ""], &rows).replacen("<thead><tr><th></th><th></th></tr></thead>\n", "", 1)
}

/// A whole number with thin spaces between thousands: 79 081 472.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).unwrap_or_default())
        .collect();
    groups.join("\u{2009}")
}

pub(crate) fn opt_count(n: Option<u64>) -> String {
    n.map_or_else(|| "\u{2013}".into(), count)
}

/// A float with `decimals` places, or a dash when absent.
pub(crate) fn fixed(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "\u{2013}".into(), |v| format!("{v:.decimals$}"))
}

/// A duration in nanoseconds, in the unit that reads best.
pub(crate) fn nanos(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// A file name short enough for a chart label.
pub(crate) fn short_name(path: &std::path::Path) -> String {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    if name.chars().count() > 28 {
        let tail: String = name
            .chars()
            .rev()
            .take(27)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("\u{2026}{tail}")
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_groups_digits() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(count(0), "0");
        assert_eq!(count(1234567), "1\u{2009}234\u{2009}567");
        assert_eq!(nanos(1_500_000.0), "1.50 ms");
        assert_eq!(nanos(999.0), "999 ns");
    }
}
