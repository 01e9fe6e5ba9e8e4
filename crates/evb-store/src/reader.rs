//! Reading a store back: list every object under a directory or S3 prefix,
//! verify each completely (docs/store.md), and count. A damaged object is
//! reported with its name and the part that failed, and the reading goes
//! on; only a store that cannot be listed at all is an error.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::format::{self, EXTENSION};
use crate::s3::S3Client;
use crate::target::StoreTarget;
use crate::StoreError;

/// Limits of a read.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// An object larger than this is reported bad without being read (it is
    /// held in memory whole while verified).
    pub max_object_bytes: u64,
    /// S3: timeout of one request.
    pub timeout: Duration,
    /// Keep a summary of every good object in the report (`listed`).
    pub list: bool,
}

impl Default for ReadOptions {
    fn default() -> ReadOptions {
        ReadOptions {
            max_object_bytes: 4 << 30,
            timeout: Duration::from_secs(60),
            list: false,
        }
    }
}

/// The outcome of reading a whole store.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReadReport {
    pub target: String,
    /// Objects found (good and bad).
    pub objects: u64,
    /// Objects that verified.
    pub good_objects: u64,
    /// Events in the good objects.
    pub events: u64,
    /// Bytes of the good objects.
    pub bytes: u64,
    /// Files or keys under the target that are not objects (skipped).
    pub other_files: u64,
    pub bad: Vec<BadObject>,
    /// Good objects of layout version 1 (no source table: every source).
    pub version_1_objects: u64,
    /// Good objects that lack some of the run's sources (built after a
    /// source was lost).
    pub partial_objects: u64,
    /// Good objects holding some of their MEP's events only (a filter
    /// unit's accepted events), and the events of those objects' MEPs.
    pub selection_objects: u64,
    pub selection_events: u64,
    pub selection_mep_events: u64,
    /// Per source index: good objects that lack it (counting the first
    /// [`MAX_MISSING_LISTED`] missing sources of each object).
    pub missing_by_source: std::collections::BTreeMap<u32, u64>,
    /// The first [`MAX_LISTED`] partial objects, in reading order.
    pub partial: Vec<PartialObject>,
    /// With [`ReadOptions::list`]: every good object, in reading order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listed: Vec<ObjectSummary>,
}

/// Partial objects listed in a report; the rest are only counted.
pub const MAX_LISTED: usize = 1000;
/// Missing sources listed per object; the rest are only counted.
pub const MAX_MISSING_LISTED: usize = 64;

/// A good object that lacks some of the run's sources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartialObject {
    pub name: String,
    pub mep: u64,
    pub run_sources: u32,
    pub sources_stored: u32,
    /// The missing source indices (at most [`MAX_MISSING_LISTED`]).
    pub missing: Vec<u32>,
}

/// What one good object holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectSummary {
    pub name: String,
    pub version: u16,
    pub mep: u64,
    pub events: u32,
    /// Events of the MEP (more than `events` when the object holds a
    /// filter unit's selection).
    pub mep_events: u32,
    pub bytes: u64,
    pub run_sources: u32,
    /// The source indices stored, in order.
    pub sources: Vec<u32>,
}

/// An object that failed verification, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadObject {
    pub name: String,
    pub reason: String,
}

impl ReadReport {
    fn record(&mut self, name: String, bytes: Result<Vec<u8>, String>, list: bool) {
        self.objects += 1;
        let verdict = bytes.and_then(|b| {
            let batch = verify(&name, &b)?;
            let h = batch.header;
            self.good_objects += 1;
            self.events += u64::from(h.event_count);
            self.bytes += b.len() as u64;
            self.version_1_objects += u64::from(h.version == 1);
            if batch.is_selection() {
                self.selection_objects += 1;
                self.selection_events += u64::from(h.event_count);
                self.selection_mep_events += u64::from(batch.mep_events());
            }
            if batch.missing_count() > 0 {
                self.partial_objects += 1;
                let missing = batch.missing_sources(MAX_MISSING_LISTED);
                for &s in &missing {
                    *self.missing_by_source.entry(s).or_default() += 1;
                }
                if self.partial.len() < MAX_LISTED {
                    self.partial.push(PartialObject {
                        name: name.clone(),
                        mep: h.mep,
                        run_sources: batch.run_sources(),
                        sources_stored: h.source_count,
                        missing,
                    });
                }
            }
            if list {
                self.listed.push(ObjectSummary {
                    name: name.clone(),
                    version: h.version,
                    mep: h.mep,
                    events: h.event_count,
                    mep_events: batch.mep_events(),
                    bytes: b.len() as u64,
                    run_sources: batch.run_sources(),
                    sources: batch.sources(),
                });
            }
            Ok(())
        });
        if let Err(reason) = verdict {
            self.bad.push(BadObject { name, reason });
        }
    }
}

/// Verifies one object's bytes: a view of it, or why it is bad. The name
/// is checked against the header when it has the `runR/nodeN/MEP.evbo`
/// form, so that an object copied under the wrong key is noticed.
pub fn verify<'a>(name: &str, bytes: &'a [u8]) -> Result<format::StoredBatch<'a>, String> {
    let batch = format::decode(bytes).map_err(|e| e.to_string())?;
    let h = batch.header;
    if let Some((run, node, mep)) = format::parse_object_key(name) {
        if (run, node, mep) != (h.run_id, h.node, h.mep) {
            return Err(format!(
                "header says run {} node {} MEP {}, the name says run {run} node {node} MEP {mep}",
                h.run_id, h.node, h.mep
            ));
        }
    }
    Ok(batch)
}

/// Reads and verifies every object of a store.
pub fn read_store(target: &StoreTarget, options: &ReadOptions) -> Result<ReadReport, StoreError> {
    let mut report = ReadReport {
        target: target.to_string(),
        ..ReadReport::default()
    };
    let objects = StoreObjects::open(target, options)?;
    report.other_files = objects.other_files();
    for (name, bytes) in objects {
        report.record(name, bytes, options.list);
    }
    Ok(report)
}

/// Where a listed object is.
enum Location {
    File(PathBuf),
    Key {
        key: String,
        size: u64,
    },
    /// A temporary file an interrupted writer left.
    Unfinished,
}

/// The objects of a store, in listing order (a directory's sorted paths,
/// S3's key order), read one at a time: each item is the object's name
/// under the target and its bytes, or why they could not be had (an
/// unfinished write, over the size limit, a failed read). Listing happens
/// at [`StoreObjects::open`]; nothing else is held in memory but the
/// object being read. Verification is the caller's ([`verify`]).
pub struct StoreObjects {
    entries: std::vec::IntoIter<(String, Location)>,
    client: Option<S3Client>,
    max_object_bytes: u64,
    other_files: u64,
}

impl StoreObjects {
    /// Lists the target: a directory (every `.evbo` under it, without
    /// following symbolic links), a single object file, or an S3 prefix.
    pub fn open(target: &StoreTarget, options: &ReadOptions) -> Result<StoreObjects, StoreError> {
        let mut entries = Vec::new();
        let mut other_files = 0;
        let client = match target {
            StoreTarget::Dir(root) => {
                list_dir(root, &mut entries, &mut other_files)?;
                None
            }
            StoreTarget::S3(t) => {
                let client = S3Client::new(t, options.timeout);
                let prefix = if t.prefix.is_empty() {
                    String::new()
                } else {
                    format!("{}/", t.prefix)
                };
                for listed in client.list(&prefix)? {
                    let name = listed.key.strip_prefix(&prefix).unwrap_or(&listed.key);
                    if format::is_claim_key(name) {
                        continue;
                    }
                    if !name.ends_with(&format!(".{EXTENSION}")) {
                        other_files += 1;
                        continue;
                    }
                    let location = Location::Key {
                        key: listed.key.clone(),
                        size: listed.size,
                    };
                    entries.push((name.to_string(), location));
                }
                Some(client)
            }
        };
        Ok(StoreObjects {
            entries: entries.into_iter(),
            client,
            max_object_bytes: options.max_object_bytes,
            other_files,
        })
    }

    /// Files or keys under the target that are not objects (skipped).
    pub fn other_files(&self) -> u64 {
        self.other_files
    }

    /// Objects not read yet.
    pub fn remaining(&self) -> usize {
        self.entries.len()
    }
}

impl Iterator for StoreObjects {
    type Item = (String, Result<Vec<u8>, String>);

    fn next(&mut self) -> Option<Self::Item> {
        let (name, location) = self.entries.next()?;
        let max = self.max_object_bytes;
        let bytes = match location {
            Location::File(path) => read_file(&path, max),
            Location::Key { size, .. } if size > max => Err(too_large(size, max)),
            Location::Key { key, .. } => self
                .client
                .as_ref()
                .expect("an S3 listing has its client")
                .get_object(&key, max)
                .map_err(|e| e.to_string()),
            Location::Unfinished => {
                Err("unfinished write: temporary file of an interrupted writer".into())
            }
        };
        Some((name, bytes))
    }
}

fn too_large(size: u64, max: u64) -> String {
    format!("{size} bytes, over the {max}-byte limit of one object")
}

fn list_dir(
    root: &Path,
    entries: &mut Vec<(String, Location)>,
    other_files: &mut u64,
) -> Result<(), StoreError> {
    let meta = std::fs::metadata(root).map_err(|e| StoreError::io(root, e))?;
    if meta.is_file() {
        entries.push((root.display().to_string(), Location::File(root.into())));
        return Ok(());
    }
    let mut files = Vec::new();
    collect_files(root, &mut files)?;
    files.sort();
    let object_suffix = format!(".{EXTENSION}");
    let unfinished_suffix = format!(".{EXTENSION}.tmp");
    for path in files {
        let name = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        if format::is_claim_key(&name) {
            // A writer's claim of a MEP (docs/store.md), not an object.
            continue;
        } else if name.ends_with(&unfinished_suffix) {
            entries.push((name, Location::Unfinished));
        } else if name.ends_with(&object_suffix) {
            entries.push((name, Location::File(path)));
        } else {
            *other_files += 1;
        }
    }
    Ok(())
}

/// Every regular file under `dir`, without following symbolic links (no
/// cycles, nothing outside the store).
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), StoreError> {
    let entries = std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(dir, e))?;
        let kind = entry
            .file_type()
            .map_err(|e| StoreError::io(entry.path(), e))?;
        if kind.is_dir() {
            collect_files(&entry.path(), out)?;
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// Reads a file whole, never more than `max` bytes (the size is re-checked
/// while reading, in case the file grows).
fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat: {e}"))?
        .len();
    if len > max {
        return Err(too_large(len, max));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64, max));
    }
    Ok(bytes)
}

/// Partial objects named in the text report.
const PARTIAL_SHOWN: usize = 20;

/// Source indices as `0,1,3`.
fn source_list(sources: &[u32]) -> String {
    sources
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl ReadReport {
    /// The report as `evb store read` prints it: totals, then partial,
    /// listed and bad objects, one per line.
    pub fn text(&self) -> String {
        let mut out = format!(
            "evb store read: {}\nobjects {} ({} good, {} bad)  events {}  bytes {} ({:.3} GB)",
            self.target,
            self.objects,
            self.good_objects,
            self.bad.len(),
            self.events,
            self.bytes,
            self.bytes as f64 / 1e9
        );
        if self.other_files > 0 {
            out.push_str(&format!("  ({} other files skipped)", self.other_files));
        }
        out.push('\n');
        if self.version_1_objects > 0 {
            out.push_str(&format!(
                "{} objects of layout version 1 (no source table: every source)\n",
                self.version_1_objects
            ));
        }
        if self.selection_objects > 0 {
            out.push_str(&format!(
                "selections {} (objects holding the events a filter unit accepted): {} of their MEPs' {} events\n",
                self.selection_objects, self.selection_events, self.selection_mep_events
            ));
        }
        if self.partial_objects > 0 {
            let by_source: Vec<String> = self
                .missing_by_source
                .iter()
                .map(|(s, n)| format!("source {s} in {n}"))
                .collect();
            out.push_str(&format!(
                "partial objects {} (built without some sources; missing: {})\n",
                self.partial_objects,
                by_source.join(", ")
            ));
            for p in self.partial.iter().take(PARTIAL_SHOWN) {
                out.push_str(&format!(
                    "partial: {}: MEP {}, sources {} of {}, missing {}\n",
                    p.name,
                    p.mep,
                    p.sources_stored,
                    p.run_sources,
                    source_list(&p.missing)
                ));
            }
            if self.partial_objects as usize > PARTIAL_SHOWN {
                out.push_str(&format!(
                    "partial: ... {} more (--json lists {} at most, --list all objects)\n",
                    self.partial_objects as usize - PARTIAL_SHOWN,
                    MAX_LISTED
                ));
            }
        }
        for o in &self.listed {
            out.push_str(&format!(
                "object: {}: v{} MEP {} events {}{} bytes {} sources {} of {}: {}\n",
                o.name,
                o.version,
                o.mep,
                o.events,
                if o.events < o.mep_events {
                    format!(" of {}", o.mep_events)
                } else {
                    String::new()
                },
                o.bytes,
                o.sources.len(),
                o.run_sources,
                source_list(&o.sources)
            ));
        }
        for bad in &self.bad {
            out.push_str(&format!("bad: {}: {}\n", bad.name, bad.reason));
        }
        if self.objects == 0 {
            out.push_str("no objects found\n");
        }
        out
    }
}
