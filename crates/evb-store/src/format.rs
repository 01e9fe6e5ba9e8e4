//! The `.evbo` object: one built batch (MEP), self-describing and
//! checksummed, so that a single object can be verified or read without any
//! other file, on a filesystem or in an object store alike. The layout is
//! documented in docs/store.md; this file and that page change together.
//!
//! Events are stored event-major (event 0 from every source, then event 1,
//! ...): a built event is one contiguous byte range, readable with one
//! ranged read, and its CRC-32C covers exactly what a consumer uses.
//!
//! Decoding never trusts a length field: every count is checked, with
//! overflow-safe arithmetic, against the bytes actually present before
//! anything is sliced, and nothing is allocated from a count.

use std::fmt;

/// First four bytes of every object.
pub const MAGIC: [u8; 4] = *b"EVBO";
/// Layout version written; changes when the header or index layout changes.
/// Version 2 added the source table (which sources an object holds: a batch
/// built after a source was lost lacks it). Version 3 added the event table
/// (which of the MEP's events an object holds: a filter unit stores only
/// the events it accepted). Older objects are still read: version 1 holds
/// every source, versions 1 and 2 every event of the MEP.
pub const VERSION: u16 = 3;
/// The oldest layout version this reader still reads.
pub const OLDEST_VERSION: u16 = 1;
/// Fixed header size in bytes.
pub const HEADER_LEN: usize = 48;
/// Bytes of one event entry in the index: offset u64, length u32, crc32c u32.
pub const EVENT_ENTRY_LEN: usize = 16;
/// Bytes of one fragment size in the index.
pub const FRAGMENT_ENTRY_LEN: usize = 4;
/// Bytes of one entry of the source table (version 2): the run's source
/// count first, then one source index per stored source.
pub const SOURCE_ENTRY_LEN: usize = 4;
/// Bytes of one entry of the event-number table (version 3): the MEP's event
/// count first, then one event number per stored event.
pub const EVENT_NUMBER_ENTRY_LEN: usize = 4;
/// File name extension of an object.
pub const EXTENSION: &str = "evbo";

/// The identity and shape of one stored batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectHeader {
    /// Layout version of the object (1 to 3).
    pub version: u16,
    pub run_id: u32,
    pub node: u16,
    pub mep: u64,
    pub event_count: u32,
    /// Sources (fragments per event) this object holds.
    pub source_count: u32,
    pub payload_len: u64,
}

impl ObjectHeader {
    /// Index size implied by the counts, `None` if it overflows u64.
    pub fn index_len(&self) -> Option<u64> {
        let events = u64::from(self.event_count);
        let fragments = events.checked_mul(u64::from(self.source_count))?;
        let source_table = if self.version >= 2 {
            (u64::from(self.source_count) + 1) * SOURCE_ENTRY_LEN as u64
        } else {
            0
        };
        let event_numbers = if self.version >= 3 {
            (events + 1) * EVENT_NUMBER_ENTRY_LEN as u64
        } else {
            0
        };
        events
            .checked_mul(EVENT_ENTRY_LEN as u64)?
            .checked_add(fragments.checked_mul(FRAGMENT_ENTRY_LEN as u64)?)?
            .checked_add(source_table)?
            .checked_add(event_numbers)
    }

    /// Whole object size implied by the header, `None` if it overflows u64.
    pub fn object_len(&self) -> Option<u64> {
        (HEADER_LEN as u64)
            .checked_add(self.index_len()?)?
            .checked_add(self.payload_len)
    }
}

/// Why an object failed verification. The `Display` text names the part
/// that failed and the values that disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectError {
    Truncated {
        len: u64,
        needed: u64,
        what: &'static str,
    },
    TrailingBytes {
        len: u64,
        expected: u64,
    },
    BadMagic([u8; 4]),
    BadVersion(u16),
    BadHeaderLen(u16),
    HeaderCrc {
        stored: u32,
        computed: u32,
    },
    IndexCrc {
        stored: u32,
        computed: u32,
    },
    IndexTooLarge {
        event_count: u32,
        source_count: u32,
    },
    EventOffset {
        event: u32,
        offset: u64,
        expected: u64,
    },
    EventLength {
        event: u32,
        length: u32,
        fragments_sum: u64,
    },
    PayloadLength {
        events_sum: u64,
        payload_len: u64,
    },
    EventCrc {
        event: u32,
        stored: u32,
        computed: u32,
    },
    /// The source table is not strictly increasing source indices below
    /// the run's source count.
    SourceTable {
        position: u32,
        source: u32,
        reason: &'static str,
    },
    /// The header holds more sources than the run has.
    SourceCount {
        source_count: u32,
        run_sources: u32,
    },
    /// The event-number table is not strictly increasing event numbers
    /// below the MEP's event count.
    EventNumbers {
        position: u32,
        event: u32,
        reason: &'static str,
    },
    /// The object holds more events than its MEP has.
    EventCount {
        event_count: u32,
        mep_events: u32,
    },
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectError::Truncated { len, needed, what } => write!(
                f,
                "truncated: {len} bytes, the {what} needs {needed}"
            ),
            ObjectError::TrailingBytes { len, expected } => write!(
                f,
                "{len} bytes, the header describes {expected}: {} trailing bytes",
                len - expected
            ),
            ObjectError::BadMagic(m) => write!(f, "header: bad magic {m:02x?} (expected \"EVBO\")"),
            ObjectError::BadVersion(v) => write!(
                f,
                "header: unsupported version {v} (this reader knows versions {OLDEST_VERSION} to {VERSION})"
            ),
            ObjectError::BadHeaderLen(l) => {
                write!(f, "header: header_len {l} (expected {HEADER_LEN})")
            }
            ObjectError::HeaderCrc { stored, computed } => write!(
                f,
                "header CRC-32C mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            ObjectError::IndexCrc { stored, computed } => write!(
                f,
                "index CRC-32C mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            ObjectError::IndexTooLarge {
                event_count,
                source_count,
            } => write!(
                f,
                "header: index of {event_count} events x {source_count} sources overflows"
            ),
            ObjectError::EventOffset {
                event,
                offset,
                expected,
            } => write!(
                f,
                "index: event {event} at offset {offset}, expected {expected} (events are contiguous)"
            ),
            ObjectError::EventLength {
                event,
                length,
                fragments_sum,
            } => write!(
                f,
                "index: event {event} has length {length} but its fragments sum to {fragments_sum}"
            ),
            ObjectError::PayloadLength {
                events_sum,
                payload_len,
            } => write!(
                f,
                "index: events sum to {events_sum} bytes, header payload_len is {payload_len}"
            ),
            ObjectError::EventCrc {
                event,
                stored,
                computed,
            } => write!(
                f,
                "payload of event {event}: CRC-32C mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            ObjectError::SourceTable {
                position,
                source,
                reason,
            } => write!(
                f,
                "index: source table entry {position} is source {source}: {reason}"
            ),
            ObjectError::SourceCount {
                source_count,
                run_sources,
            } => write!(
                f,
                "header: {source_count} sources stored but the run has {run_sources}"
            ),
            ObjectError::EventNumbers {
                position,
                event,
                reason,
            } => write!(
                f,
                "index: event table entry {position} is event {event}: {reason}"
            ),
            ObjectError::EventCount {
                event_count,
                mep_events,
            } => write!(
                f,
                "header: {event_count} events stored but the MEP has {mep_events}"
            ),
        }
    }
}

impl std::error::Error for ObjectError {}

/// A fragment payload (docs/wire-format.md) that does not hold what its
/// event-size table says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FragmentLayoutError {
    pub source: usize,
    pub reason: String,
}

impl fmt::Display for FragmentLayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fragment of source {}: {}", self.source, self.reason)
    }
}

impl std::error::Error for FragmentLayoutError {}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks a fragment payload against its event-size table and returns the
/// byte size of its event data (without the table).
fn fragment_data_len(
    source: usize,
    payload: &[u8],
    events: u32,
) -> Result<u64, FragmentLayoutError> {
    let err = |reason: String| FragmentLayoutError { source, reason };
    let table = u64::from(events) * 4;
    if (payload.len() as u64) < table {
        return Err(err(format!(
            "{} bytes cannot hold the size table of {events} events ({table} bytes)",
            payload.len()
        )));
    }
    let sizes: u64 = payload[..table as usize]
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
        .sum();
    let data = payload.len() as u64 - table;
    if sizes != data {
        return Err(err(format!(
            "event sizes sum to {sizes} bytes but {data} bytes of event data follow the size table"
        )));
    }
    Ok(data)
}

/// Lays out an object for the batch `mep` in `out` (cleared first, its
/// capacity reused) with every checksum left zero: call [`seal`] before
/// storing it. Split from sealing so that the copy happens on the caller's
/// thread and the checksums on the writer's.
///
/// `fragments` are the fragment payloads of the batch in source order, each
/// an event-size table of `events` u32 then the event data; every source of
/// the run is there (see [`layout_sources`] for a batch without some).
pub fn layout(
    out: &mut Vec<u8>,
    run_id: u32,
    node: u16,
    mep: u64,
    events: u32,
    fragments: &[&[u8]],
) -> Result<(), FragmentLayoutError> {
    let sources = u32::try_from(fragments.len()).map_err(|_| FragmentLayoutError {
        source: fragments.len(),
        reason: "more than 2^32 sources".into(),
    })?;
    let all: Vec<u32> = (0..sources).collect();
    layout_sources(out, run_id, node, mep, events, sources, &all, fragments)
}

/// Like [`layout`] for a batch built from some of the run's `run_sources`
/// sources: `sources[i]` is the source index of `fragments[i]`, strictly
/// increasing and below `run_sources` (a batch built after a source was
/// lost lacks that source). The object records which sources it holds.
#[allow(clippy::too_many_arguments)]
pub fn layout_sources(
    out: &mut Vec<u8>,
    run_id: u32,
    node: u16,
    mep: u64,
    events: u32,
    run_sources: u32,
    sources: &[u32],
    fragments: &[&[u8]],
) -> Result<(), FragmentLayoutError> {
    let batch = BatchParts {
        run_id,
        node,
        mep,
        mep_events: events,
        run_sources,
        sources,
        fragments,
    };
    layout_selected(out, &batch, None)
}

/// A built batch as the fragments of its sources: what [`layout_selected`]
/// stores.
#[derive(Debug, Clone, Copy)]
pub struct BatchParts<'a> {
    pub run_id: u32,
    /// The endpoint writing the object (a builder or a filter unit).
    pub node: u16,
    pub mep: u64,
    /// Events in the MEP: every fragment's size table has this many entries.
    pub mep_events: u32,
    pub run_sources: u32,
    /// The source index of each fragment, strictly increasing, below
    /// `run_sources`.
    pub sources: &'a [u32],
    /// Fragment payloads (an event-size table then the event data).
    pub fragments: &'a [&'a [u8]],
}

/// Lays out an object holding the events `selected` (event numbers within
/// the MEP, strictly increasing, below `mep_events`; `None`: every event) of
/// a batch, checksums left zero as with [`layout`]. A filter unit stores
/// only the events it accepted this way; the object's event table says
/// which they are.
pub fn layout_selected(
    out: &mut Vec<u8>,
    batch: &BatchParts<'_>,
    selected: Option<&[u32]>,
) -> Result<(), FragmentLayoutError> {
    let BatchParts {
        run_id,
        node,
        mep,
        mep_events,
        run_sources,
        sources,
        fragments,
    } = *batch;
    check_batch_parts(batch)?;
    let all: Vec<u32>;
    let selected = match selected {
        Some(list) => {
            check_selected_events(list, mep_events)?;
            list
        }
        None => {
            all = (0..mep_events).collect();
            &all
        }
    };
    let (starts, payload_len) = selected_event_starts(fragments, selected, mep_events);
    let event_count = selected.len() as u32;
    let header = ObjectHeader {
        version: VERSION,
        run_id,
        node,
        mep,
        event_count,
        source_count: sources.len() as u32,
        payload_len,
    };
    // Fragments are in memory, so these sizes are bounded by what exists.
    let index_len = header.index_len().expect("index of in-memory fragments") as usize;
    let total = HEADER_LEN + index_len + payload_len as usize;
    out.clear();
    out.reserve(total);
    write_header(out, &header, 0, 0);

    // Event table: offsets and lengths now, CRCs when sealing.
    let mut offset = 0u64;
    for (i, &e) in selected.iter().enumerate() {
        let len: u64 = fragments
            .iter()
            .map(|f| u64::from(u32_at(f, e as usize * 4)))
            .sum();
        let len32 = u32::try_from(len).map_err(|_| FragmentLayoutError {
            source: 0,
            reason: format!("event {i} would be {len} bytes, over the 4 GiB an index entry holds"),
        })?;
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&len32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        offset += len;
    }
    // Fragment sizes, event-major.
    for &e in selected {
        let e = e as usize;
        for f in fragments {
            out.extend_from_slice(&f[e * 4..e * 4 + 4]);
        }
    }
    // Source table: the run's source count, then the sources held.
    out.extend_from_slice(&run_sources.to_le_bytes());
    for s in sources {
        out.extend_from_slice(&s.to_le_bytes());
    }
    // Event-number table: the MEP's event count, then the events held.
    out.extend_from_slice(&mep_events.to_le_bytes());
    for e in selected {
        out.extend_from_slice(&e.to_le_bytes());
    }
    // Payload, event-major.
    for (i, &e) in selected.iter().enumerate() {
        for (k, f) in fragments.iter().enumerate() {
            let start = starts[i * fragments.len() + k];
            let size = u32_at(f, e as usize * 4) as usize;
            out.extend_from_slice(&f[start..start + size]);
        }
    }
    debug_assert_eq!(out.len(), total);
    Ok(())
}

/// Checks that a batch's fragments match its source indices (one each,
/// strictly increasing, below the run's source count) and that each
/// fragment's size table accounts for its data.
fn check_batch_parts(batch: &BatchParts<'_>) -> Result<(), FragmentLayoutError> {
    let BatchParts {
        mep_events,
        run_sources,
        sources,
        fragments,
        ..
    } = *batch;
    if sources.len() != fragments.len() {
        return Err(FragmentLayoutError {
            source: fragments.len(),
            reason: format!(
                "{} fragments but {} source indices",
                fragments.len(),
                sources.len()
            ),
        });
    }
    let mut previous: Option<u32> = None;
    for &s in sources {
        if s >= run_sources || previous.is_some_and(|p| p >= s) {
            return Err(FragmentLayoutError {
                source: s as usize,
                reason: format!(
                    "source indices must increase strictly and stay below the run's {run_sources} sources"
                ),
            });
        }
        previous = Some(s);
    }
    for (&source, fragment) in sources.iter().zip(fragments) {
        fragment_data_len(source as usize, fragment, mep_events)?;
    }
    Ok(())
}

/// Checks that the selected event numbers increase strictly and stay below
/// the MEP's event count.
fn check_selected_events(selected: &[u32], mep_events: u32) -> Result<(), FragmentLayoutError> {
    let mut previous: Option<u32> = None;
    for &e in selected {
        if e >= mep_events || previous.is_some_and(|p| p >= e) {
            return Err(FragmentLayoutError {
                source: 0,
                reason: format!(
                    "selected event {e}: event numbers must increase strictly and stay below the MEP's {mep_events} events"
                ),
            });
        }
        previous = Some(e);
    }
    Ok(())
}

/// Where each fragment's data for each selected event starts (event-major:
/// entry `i * fragments.len() + k` is fragment `k`'s event `selected[i]`),
/// and the payload length of the selected events. Walks the selected
/// events in order with one cursor per fragment.
fn selected_event_starts(
    fragments: &[&[u8]],
    selected: &[u32],
    mep_events: u32,
) -> (Vec<usize>, u64) {
    let table_len = mep_events as usize * 4;
    let mut starts: Vec<usize> = Vec::with_capacity(selected.len() * fragments.len());
    let mut cursors: Vec<usize> = vec![table_len; fragments.len()];
    let mut next_event = 0u32;
    let mut payload_len = 0u64;
    for &e in selected {
        for (f, cursor) in fragments.iter().zip(cursors.iter_mut()) {
            for skipped in next_event..e {
                *cursor += u32_at(f, skipped as usize * 4) as usize;
            }
            starts.push(*cursor);
            let size = u32_at(f, e as usize * 4) as usize;
            *cursor += size;
            payload_len += size as u64;
        }
        next_event = e + 1;
    }
    (starts, payload_len)
}

fn write_header(out: &mut Vec<u8>, h: &ObjectHeader, index_crc: u32, header_crc: u32) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&h.version.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    out.extend_from_slice(&h.run_id.to_le_bytes());
    out.extend_from_slice(&h.node.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&h.mep.to_le_bytes());
    out.extend_from_slice(&h.event_count.to_le_bytes());
    out.extend_from_slice(&h.source_count.to_le_bytes());
    out.extend_from_slice(&h.payload_len.to_le_bytes());
    out.extend_from_slice(&index_crc.to_le_bytes());
    out.extend_from_slice(&header_crc.to_le_bytes());
}

/// Fills in the checksums of an object made by [`layout`]: each event's
/// CRC-32C, then the index's, then the header's (which covers the index CRC).
pub fn seal(object: &mut [u8]) {
    let version = u16_at(object, 4);
    let events = u32_at(object, 24) as usize;
    let sources = u32_at(object, 28) as usize;
    let source_table = if version >= 2 {
        (sources + 1) * SOURCE_ENTRY_LEN
    } else {
        0
    };
    let event_numbers = if version >= 3 {
        (events + 1) * EVENT_NUMBER_ENTRY_LEN
    } else {
        0
    };
    let index_len = events * EVENT_ENTRY_LEN
        + events * sources * FRAGMENT_ENTRY_LEN
        + source_table
        + event_numbers;
    let (head, payload) = object.split_at_mut(HEADER_LEN + index_len);
    for e in 0..events {
        let entry = HEADER_LEN + e * EVENT_ENTRY_LEN;
        let offset = u64_at(head, entry) as usize;
        let len = u32_at(head, entry + 8) as usize;
        let crc = crc32c::crc32c(&payload[offset..offset + len]);
        head[entry + 12..entry + 16].copy_from_slice(&crc.to_le_bytes());
    }
    let index_crc = crc32c::crc32c(&head[HEADER_LEN..]);
    head[40..44].copy_from_slice(&index_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&head[..44]);
    head[44..48].copy_from_slice(&header_crc.to_le_bytes());
}

/// Builds a complete, sealed object in a new buffer.
pub fn encode(
    run_id: u32,
    node: u16,
    mep: u64,
    events: u32,
    fragments: &[&[u8]],
) -> Result<Vec<u8>, FragmentLayoutError> {
    let mut out = Vec::new();
    layout(&mut out, run_id, node, mep, events, fragments)?;
    seal(&mut out);
    Ok(out)
}

/// Builds a complete, sealed object of a batch holding only `sources` of
/// the run's `run_sources` (see [`layout_sources`]).
pub fn encode_sources(
    run_id: u32,
    node: u16,
    mep: u64,
    events: u32,
    run_sources: u32,
    sources: &[u32],
    fragments: &[&[u8]],
) -> Result<Vec<u8>, FragmentLayoutError> {
    let mut out = Vec::new();
    layout_sources(
        &mut out,
        run_id,
        node,
        mep,
        events,
        run_sources,
        sources,
        fragments,
    )?;
    seal(&mut out);
    Ok(out)
}

/// A verified object, borrowed from its bytes: every checksum and length has
/// been checked, so its accessors cannot fail.
#[derive(Debug, Clone, Copy)]
pub struct StoredBatch<'a> {
    pub header: ObjectHeader,
    index: &'a [u8],
    payload: &'a [u8],
}

impl<'a> StoredBatch<'a> {
    /// Built event `e` (its fragments in source order, back to back).
    pub fn event(&self, e: u32) -> &'a [u8] {
        let entry = e as usize * EVENT_ENTRY_LEN;
        let offset = u64_at(self.index, entry) as usize;
        let len = u32_at(self.index, entry + 8) as usize;
        &self.payload[offset..offset + len]
    }

    /// The run's number of sources (version 1: every source is stored).
    pub fn run_sources(&self) -> u32 {
        match self.source_table() {
            Some(t) => u32_at(t, 0),
            None => self.header.source_count,
        }
    }

    /// The source index of stored column `s` (`s < source_count`).
    pub fn source(&self, s: u32) -> u32 {
        match self.source_table() {
            Some(t) => u32_at(t, (s as usize + 1) * SOURCE_ENTRY_LEN),
            None => s,
        }
    }

    /// The source indices stored, in column order (increasing).
    pub fn sources(&self) -> Vec<u32> {
        (0..self.header.source_count)
            .map(|s| self.source(s))
            .collect()
    }

    /// How many of the run's sources the object lacks.
    pub fn missing_count(&self) -> u32 {
        self.run_sources() - self.header.source_count
    }

    /// The source indices the object lacks, at most `limit` of them (the
    /// run's source count comes from the object: it may be large).
    pub fn missing_sources(&self, limit: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let mut next = 0u32;
        for s in (0..self.header.source_count)
            .map(|c| self.source(c))
            .chain([self.run_sources()])
        {
            while next < s && out.len() < limit {
                out.push(next);
                next += 1;
            }
            if out.len() >= limit {
                break;
            }
            next = s + 1;
        }
        out
    }

    /// The MEP's event count (versions 1 and 2: every event is stored).
    pub fn mep_events(&self) -> u32 {
        match self.event_number_table() {
            Some(t) => u32_at(t, 0),
            None => self.header.event_count,
        }
    }

    /// The event number within the MEP of stored event `e`
    /// (`e < event_count`).
    pub fn event_number(&self, e: u32) -> u32 {
        match self.event_number_table() {
            Some(t) => u32_at(t, (e as usize + 1) * EVENT_NUMBER_ENTRY_LEN),
            None => e,
        }
    }

    /// The object holds some of its MEP's events only (a filter unit's
    /// accepted events).
    pub fn is_selection(&self) -> bool {
        self.header.event_count < self.mep_events()
    }

    /// Version 3: the event-number table (the MEP's event count, then the
    /// event numbers).
    fn event_number_table(&self) -> Option<&'a [u8]> {
        (self.header.version >= 3).then(|| {
            let at =
                self.index.len() - (self.header.event_count as usize + 1) * EVENT_NUMBER_ENTRY_LEN;
            &self.index[at..]
        })
    }

    /// Version 2: the source table (run's source count, then the sources).
    fn source_table(&self) -> Option<&'a [u8]> {
        (self.header.version >= 2).then(|| {
            let e = self.header.event_count as usize;
            let at =
                e * EVENT_ENTRY_LEN + e * self.header.source_count as usize * FRAGMENT_ENTRY_LEN;
            &self.index[at..]
        })
    }

    /// Size of the fragment in stored column `s` (source [`Self::source`]`(s)`)
    /// of event `e`.
    pub fn fragment_len(&self, e: u32, s: u32) -> u32 {
        let table = self.header.event_count as usize * EVENT_ENTRY_LEN;
        let at = table
            + (e as usize * self.header.source_count as usize + s as usize) * FRAGMENT_ENTRY_LEN;
        u32_at(self.index, at)
    }

    /// The fragment in stored column `s` of event `e`.
    pub fn fragment(&self, e: u32, s: u32) -> &'a [u8] {
        let start: usize = (0..s).map(|i| self.fragment_len(e, i) as usize).sum();
        &self.event(e)[start..start + self.fragment_len(e, s) as usize]
    }
}

/// A verified object that owns its bytes: what a reader hands out batch
/// by batch ([`StoredObject::view`] reads it).
#[derive(Debug, Clone)]
pub struct StoredObject {
    bytes: Vec<u8>,
    header: ObjectHeader,
    index: std::ops::Range<usize>,
    payload: std::ops::Range<usize>,
}

impl StoredObject {
    /// Keeps `bytes` once `check` (a [`decode`], with any check of its
    /// own) verified them.
    pub fn verified<E>(
        bytes: Vec<u8>,
        check: impl FnOnce(&[u8]) -> Result<StoredBatch<'_>, E>,
    ) -> Result<StoredObject, E> {
        let (header, index, payload) = {
            let batch = check(&bytes)?;
            let base = bytes.as_ptr() as usize;
            let range = |s: &[u8]| {
                let start = s.as_ptr() as usize - base;
                start..start + s.len()
            };
            (batch.header, range(batch.index), range(batch.payload))
        };
        Ok(StoredObject {
            bytes,
            header,
            index,
            payload,
        })
    }

    pub fn view(&self) -> StoredBatch<'_> {
        StoredBatch {
            header: self.header,
            index: &self.bytes[self.index.clone()],
            payload: &self.bytes[self.payload.clone()],
        }
    }

    /// The whole object, as stored.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Parses the header alone (magic, version, header CRC); does not look at
/// the rest.
pub fn decode_header(bytes: &[u8]) -> Result<ObjectHeader, ObjectError> {
    if bytes.len() < HEADER_LEN {
        return Err(ObjectError::Truncated {
            len: bytes.len() as u64,
            needed: HEADER_LEN as u64,
            what: "header",
        });
    }
    let magic: [u8; 4] = bytes[..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(ObjectError::BadMagic(magic));
    }
    let stored = u32_at(bytes, 44);
    let computed = crc32c::crc32c(&bytes[..44]);
    if stored != computed {
        return Err(ObjectError::HeaderCrc { stored, computed });
    }
    // Version and size are checked after the CRC so that a flipped bit there
    // is reported as what it is: corruption.
    let version = u16_at(bytes, 4);
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(ObjectError::BadVersion(version));
    }
    let header_len = u16_at(bytes, 6);
    if header_len as usize != HEADER_LEN {
        return Err(ObjectError::BadHeaderLen(header_len));
    }
    Ok(ObjectHeader {
        version,
        run_id: u32_at(bytes, 8),
        node: u16_at(bytes, 12),
        mep: u64_at(bytes, 16),
        event_count: u32_at(bytes, 24),
        source_count: u32_at(bytes, 28),
        payload_len: u64_at(bytes, 32),
    })
}

/// Verifies every checksum and length of an object and returns a view of it.
pub fn decode(bytes: &[u8]) -> Result<StoredBatch<'_>, ObjectError> {
    let header = decode_header(bytes)?;
    let index_end = index_end_of_whole_object(&header, bytes.len() as u64)?;
    // From here every range is within `bytes`.
    let index = &bytes[HEADER_LEN..index_end as usize];
    let payload = &bytes[index_end as usize..];
    let stored = u32_at(bytes, 40);
    let computed = crc32c::crc32c(index);
    if stored != computed {
        return Err(ObjectError::IndexCrc { stored, computed });
    }
    check_event_table(&header, index, payload)?;
    if header.version >= 2 {
        check_source_table(&header, index)?;
    }
    if header.version >= 3 {
        check_event_number_table(&header, index)?;
    }
    Ok(StoredBatch {
        header,
        index,
        payload,
    })
}

/// Where the index of an object of `len` bytes with this header ends (the
/// payload starts), once its length is checked: the header, the index and
/// the payload the header announces, nothing missing and nothing after.
fn index_end_of_whole_object(header: &ObjectHeader, len: u64) -> Result<u64, ObjectError> {
    let index_len = header.index_len().ok_or(ObjectError::IndexTooLarge {
        event_count: header.event_count,
        source_count: header.source_count,
    })?;
    let index_end =
        (HEADER_LEN as u64)
            .checked_add(index_len)
            .ok_or(ObjectError::IndexTooLarge {
                event_count: header.event_count,
                source_count: header.source_count,
            })?;
    if len < index_end {
        return Err(ObjectError::Truncated {
            len,
            needed: index_end,
            what: "index",
        });
    }
    let expected = index_end
        .checked_add(header.payload_len)
        .ok_or(ObjectError::Truncated {
            len,
            needed: u64::MAX,
            what: "payload",
        })?;
    if len < expected {
        return Err(ObjectError::Truncated {
            len,
            needed: expected,
            what: "payload",
        });
    }
    if len > expected {
        return Err(ObjectError::TrailingBytes { len, expected });
    }
    Ok(index_end)
}

/// Checks the event table against the fragment sizes and the payload: the
/// events lie end to end, each as long as its fragments, with its CRC, and
/// together they fill the payload exactly.
fn check_event_table(
    header: &ObjectHeader,
    index: &[u8],
    payload: &[u8],
) -> Result<(), ObjectError> {
    let sources = header.source_count as usize;
    let fragment_table = &index[header.event_count as usize * EVENT_ENTRY_LEN..];
    let mut expected_offset = 0u64;
    for e in 0..header.event_count {
        let entry = e as usize * EVENT_ENTRY_LEN;
        let offset = u64_at(index, entry);
        let length = u32_at(index, entry + 8);
        if offset != expected_offset {
            return Err(ObjectError::EventOffset {
                event: e,
                offset,
                expected: expected_offset,
            });
        }
        let row = &fragment_table[e as usize * sources * FRAGMENT_ENTRY_LEN..][..sources * 4];
        let fragments_sum: u64 = row
            .chunks_exact(4)
            .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
            .sum();
        if fragments_sum != u64::from(length) {
            return Err(ObjectError::EventLength {
                event: e,
                length,
                fragments_sum,
            });
        }
        expected_offset += u64::from(length);
        if expected_offset > header.payload_len {
            return Err(ObjectError::PayloadLength {
                events_sum: expected_offset,
                payload_len: header.payload_len,
            });
        }
        let stored = u32_at(index, entry + 12);
        let computed = crc32c::crc32c(&payload[offset as usize..expected_offset as usize]);
        if stored != computed {
            return Err(ObjectError::EventCrc {
                event: e,
                stored,
                computed,
            });
        }
    }
    if expected_offset != header.payload_len {
        return Err(ObjectError::PayloadLength {
            events_sum: expected_offset,
            payload_len: header.payload_len,
        });
    }
    Ok(())
}

/// Version 2 and later: the source table holds at most the run's sources,
/// strictly increasing and below the run's source count.
fn check_source_table(header: &ObjectHeader, index: &[u8]) -> Result<(), ObjectError> {
    let sources = header.source_count as usize;
    let at = header.event_count as usize * EVENT_ENTRY_LEN
        + header.event_count as usize * sources * FRAGMENT_ENTRY_LEN;
    let table = &index[at..];
    let run_sources = u32_at(table, 0);
    if header.source_count > run_sources {
        return Err(ObjectError::SourceCount {
            source_count: header.source_count,
            run_sources,
        });
    }
    check_increasing(table, header.source_count, run_sources).map_err(
        |(position, source, below)| ObjectError::SourceTable {
            position,
            source,
            reason: if below {
                "source indices must increase strictly"
            } else {
                "not below the run's source count"
            },
        },
    )
}

/// Version 3 and later: the event-number table holds at most the MEP's
/// events, strictly increasing and below the MEP's event count.
fn check_event_number_table(header: &ObjectHeader, index: &[u8]) -> Result<(), ObjectError> {
    let at = index.len() - (header.event_count as usize + 1) * EVENT_NUMBER_ENTRY_LEN;
    let table = &index[at..];
    let mep_events = u32_at(table, 0);
    if header.event_count > mep_events {
        return Err(ObjectError::EventCount {
            event_count: header.event_count,
            mep_events,
        });
    }
    check_increasing(table, header.event_count, mep_events).map_err(|(position, event, below)| {
        ObjectError::EventNumbers {
            position,
            event,
            reason: if below {
                "event numbers must increase strictly"
            } else {
                "not below the MEP's event count"
            },
        }
    })
}

/// Checks the `count` u32 entries after the first one of `table` (the
/// source table or the event-number table) increase strictly and stay below
/// `limit`; the first that does not: its position, value, and whether it
/// was below the limit (then it failed to increase).
fn check_increasing(table: &[u8], count: u32, limit: u32) -> Result<(), (u32, u32, bool)> {
    let mut previous: Option<u32> = None;
    for position in 0..count {
        let value = u32_at(table, (position as usize + 1) * 4);
        if value >= limit {
            return Err((position, value, false));
        }
        if previous.is_some_and(|p| p >= value) {
            return Err((position, value, true));
        }
        previous = Some(value);
    }
    Ok(())
}

/// The object name of batch `mep` relative to the store root:
/// `run<run_id>/node<node>/<mep, 20 digits>.evbo`. Zero-padded so that a
/// lexicographic listing (S3's order) is MEP order.
pub fn object_key(run_id: u32, node: u16, mep: u64) -> String {
    format!("run{run_id}/node{node}/{mep:020}.{EXTENSION}")
}

/// The claim of batch `mep` relative to the store root:
/// `run<run_id>/claims/<mep, 20 digits>`, made atomically by the one
/// writer that stores the MEP when several may be handed it (consumers,
/// [`crate::WriterOptions::claim`]). Not an object: readers skip it.
pub fn claim_key(run_id: u32, mep: u64) -> String {
    format!("run{run_id}/{CLAIMS_DIR}/{mep:020}")
}

/// The directory of a run's claims ([`claim_key`]).
pub const CLAIMS_DIR: &str = "claims";

/// Whether `key` (relative to the store root) is a claim ([`claim_key`]).
pub fn is_claim_key(key: &str) -> bool {
    let mut parts = key.rsplit('/');
    let (Some(file), Some(dir), Some(run)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    dir == CLAIMS_DIR
        && run
            .strip_prefix("run")
            .is_some_and(|r| r.parse::<u32>().is_ok())
        && file.len() == 20
        && file.bytes().all(|b| b.is_ascii_digit())
}

/// The (run, node, mep) a key made by [`object_key`] names, if it is one.
pub fn parse_object_key(key: &str) -> Option<(u32, u16, u64)> {
    let mut parts = key.rsplit('/');
    let file = parts.next()?;
    let node = parts.next()?.strip_prefix("node")?.parse().ok()?;
    let run = parts.next()?.strip_prefix("run")?.parse().ok()?;
    let mep = file.strip_suffix(".evbo")?.parse().ok()?;
    Some((run, node, mep))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(sizes: &[u32], fill: u8) -> Vec<u8> {
        let mut f: Vec<u8> = sizes.iter().flat_map(|s| s.to_le_bytes()).collect();
        for (i, s) in sizes.iter().enumerate() {
            f.extend(std::iter::repeat_n(fill.wrapping_add(i as u8), *s as usize));
        }
        f
    }

    #[test]
    fn events_are_stored_event_major() {
        let a = fragment(&[3, 0, 2], 10);
        let b = fragment(&[1, 4, 0], 20);
        let obj = encode(7, 2, 99, 3, &[&a, &b]).unwrap();
        let batch = decode(&obj).unwrap();
        assert_eq!(batch.header.mep, 99);
        assert_eq!(batch.event(0), &[10, 10, 10, 20]);
        assert_eq!(batch.event(1), &[21, 21, 21, 21]);
        assert_eq!(batch.fragment(2, 0), &[12, 12]);
        assert_eq!(batch.fragment(2, 1), &[] as &[u8]);
    }

    #[test]
    fn fragment_whose_sizes_disagree_with_its_length_is_refused() {
        let mut a = fragment(&[3, 1], 0);
        a.pop();
        let err = encode(1, 0, 0, 2, &[&a]).unwrap_err();
        assert_eq!(err.source, 0);
        assert!(err.reason.contains("sum to 4"), "{err}");
        let short = [1u8, 0, 0];
        let err = encode(1, 0, 0, 2, &[&fragment(&[0, 0], 0), &short]).unwrap_err();
        assert_eq!(err.source, 1);
    }

    #[test]
    fn an_object_without_a_lost_source_records_which_sources_it_holds() {
        // Run of 4 sources; source 2 was lost before this batch was built.
        let a = fragment(&[3, 0], 10);
        let b = fragment(&[1, 2], 20);
        let d = fragment(&[0, 5], 40);
        let obj = encode_sources(7, 2, 99, 2, 4, &[0, 1, 3], &[&a, &b, &d]).unwrap();
        let batch = decode(&obj).unwrap();
        assert_eq!(batch.header.version, VERSION);
        assert_eq!(batch.header.source_count, 3);
        assert_eq!(batch.run_sources(), 4);
        assert_eq!(batch.sources(), vec![0, 1, 3]);
        assert_eq!(batch.missing_count(), 1);
        assert_eq!(batch.missing_sources(10), vec![2]);
        assert_eq!(batch.source(2), 3);
        assert_eq!(batch.fragment(1, 2), &[41, 41, 41, 41, 41]);
        assert_eq!(batch.event(0), &[10, 10, 10, 20]);
        // A complete batch lacks nothing.
        let full = decode(&encode(7, 2, 100, 2, &[&a, &b]).unwrap())
            .unwrap()
            .missing_sources(10);
        assert!(full.is_empty());
        // Edges: missing at both ends, and the limit.
        let obj = encode_sources(7, 2, 1, 2, 6, &[2, 3], &[&a, &b]).unwrap();
        let batch = decode(&obj).unwrap();
        assert_eq!(batch.missing_sources(10), vec![0, 1, 4, 5]);
        assert_eq!(batch.missing_sources(3), vec![0, 1, 4]);
    }

    #[test]
    fn source_lists_that_do_not_fit_are_refused() {
        let a = fragment(&[1], 0);
        for (run, list) in [(2, vec![2u32]), (4, vec![1, 1]), (4, vec![3, 1])] {
            let two = [&a[..], &a[..]];
            let frags = &two[..list.len()];
            let err = encode_sources(1, 0, 0, 1, run, &list, frags).unwrap_err();
            assert!(err.reason.contains("increase strictly"), "{err}");
        }
        let err = encode_sources(1, 0, 0, 1, 4, &[0, 1], &[&a]).unwrap_err();
        assert!(err.reason.contains("1 fragments but 2 source"), "{err}");
        // A sealed object whose table is damaged consistently (CRCs redone).
        let mut obj = encode_sources(1, 0, 0, 1, 4, &[0, 2], &[&a, &a]).unwrap();
        // The source table, then the event-number table (2 entries), then
        // 2 payload bytes.
        let table = obj.len() - 2 - 2 * 4 - 3 * 4;
        obj[table + 8..table + 12].copy_from_slice(&0u32.to_le_bytes());
        seal(&mut obj);
        let err = decode(&obj).unwrap_err().to_string();
        assert_eq!(
            err,
            "index: source table entry 1 is source 0: source indices must increase strictly"
        );
        obj[table..table + 4].copy_from_slice(&1u32.to_le_bytes());
        seal(&mut obj);
        let err = decode(&obj).unwrap_err().to_string();
        assert_eq!(err, "header: 2 sources stored but the run has 1");
    }

    /// An object of an older layout, as earlier writers made them: version
    /// 2 has no event-number table, version 1 no source table either.
    fn older_version(version: u16, fragments: &[&[u8]], events: u32) -> Vec<u8> {
        let v3 = encode(3, 1, 5, events, fragments).unwrap();
        let e = events as usize;
        let sources_at =
            HEADER_LEN + e * EVENT_ENTRY_LEN + e * fragments.len() * FRAGMENT_ENTRY_LEN;
        let numbers_at = sources_at + (fragments.len() + 1) * SOURCE_ENTRY_LEN;
        let payload_at = numbers_at + (e + 1) * EVENT_NUMBER_ENTRY_LEN;
        let mut old = v3[..if version == 1 { sources_at } else { numbers_at }].to_vec();
        old.extend_from_slice(&v3[payload_at..]);
        old[4..6].copy_from_slice(&version.to_le_bytes());
        seal(&mut old);
        old
    }

    #[test]
    fn older_objects_are_still_read_and_newer_ones_refused() {
        let a = fragment(&[3, 0], 10);
        let b = fragment(&[1, 2], 20);
        let v1 = older_version(1, &[&a, &b], 2);
        let batch = decode(&v1).unwrap();
        assert_eq!(batch.header.version, 1);
        assert_eq!(batch.sources(), vec![0, 1]);
        assert_eq!(batch.run_sources(), 2);
        assert_eq!(batch.event(1), &[21, 21]);
        assert_eq!((batch.mep_events(), batch.event_number(1)), (2, 1));
        let v2 = older_version(2, &[&a, &b], 2);
        let batch = decode(&v2).unwrap();
        assert_eq!(batch.header.version, 2);
        assert_eq!(batch.sources(), vec![0, 1]);
        assert_eq!(batch.event(0), &[10, 10, 10, 20]);
        assert!(!batch.is_selection());
        let mut v4 = encode(3, 1, 5, 2, &[&a, &b]).unwrap();
        v4[4..6].copy_from_slice(&4u16.to_le_bytes());
        seal(&mut v4);
        assert_eq!(
            decode(&v4).unwrap_err().to_string(),
            "header: unsupported version 4 (this reader knows versions 1 to 3)"
        );
    }

    fn select(fragments: &[&[u8]], mep_events: u32, selected: &[u32]) -> Vec<u8> {
        let sources: Vec<u32> = (0..fragments.len() as u32).collect();
        let batch = BatchParts {
            run_id: 4,
            node: 6,
            mep: 77,
            mep_events,
            run_sources: fragments.len() as u32,
            sources: &sources,
            fragments,
        };
        let mut out = Vec::new();
        layout_selected(&mut out, &batch, Some(selected)).unwrap();
        seal(&mut out);
        out
    }

    #[test]
    fn a_selection_holds_the_chosen_events_and_says_which() {
        // 4 events per source; event e is `sizes[e]` bytes of value
        // fill + e (see `fragment`).
        let a = fragment(&[1, 2, 0, 3], 0);
        let b = fragment(&[2, 0, 1, 1], 10);
        let obj = select(&[&a, &b], 4, &[1, 3]);
        let batch = decode(&obj).unwrap();
        assert_eq!(batch.header.event_count, 2);
        assert_eq!(batch.mep_events(), 4);
        assert!(batch.is_selection());
        assert_eq!((batch.event_number(0), batch.event_number(1)), (1, 3));
        assert_eq!(batch.event(0), &[1, 1]);
        assert_eq!(batch.event(1), &[3, 3, 3, 13]);
        assert_eq!(batch.fragment(1, 1), &[13]);
        // Every event selected is the same as the whole batch.
        let all = select(&[&a, &b], 4, &[0, 1, 2, 3]);
        assert_eq!(all, encode(4, 6, 77, 4, &[&a, &b]).unwrap());
        // Nothing selected: an empty, valid object.
        let none = decode(&select(&[&a, &b], 4, &[])).map(|b| b.header.payload_len);
        assert_eq!(none, Ok(0));
        // Selections that do not fit are refused, naming the event.
        let sources = [0u32, 1];
        let frags: [&[u8]; 2] = [&a, &b];
        let batch = BatchParts {
            run_id: 4,
            node: 6,
            mep: 77,
            mep_events: 4,
            run_sources: 2,
            sources: &sources,
            fragments: &frags,
        };
        for bad in [&[4u32][..], &[2, 2], &[3, 1]] {
            let err = layout_selected(&mut Vec::new(), &batch, Some(bad)).unwrap_err();
            assert!(err.reason.contains("increase strictly"), "{err}");
        }
    }

    #[test]
    fn a_damaged_event_number_table_is_named() {
        let a = fragment(&[1, 2, 0, 3], 0);
        // Event table at the end of the index: MEP events, then 1 and 3;
        // 5 payload bytes follow (events 1 and 3 of one source: 2 + 3).
        let mut obj = select(&[&a], 4, &[1, 3]);
        let table = obj.len() - 5 - 3 * 4;
        obj[table + 8..table + 12].copy_from_slice(&1u32.to_le_bytes());
        seal(&mut obj);
        assert_eq!(
            decode(&obj).unwrap_err().to_string(),
            "index: event table entry 1 is event 1: event numbers must increase strictly"
        );
        obj[table + 8..table + 12].copy_from_slice(&9u32.to_le_bytes());
        seal(&mut obj);
        assert_eq!(
            decode(&obj).unwrap_err().to_string(),
            "index: event table entry 1 is event 9: not below the MEP's event count"
        );
        obj[table + 8..table + 12].copy_from_slice(&3u32.to_le_bytes());
        obj[table..table + 4].copy_from_slice(&1u32.to_le_bytes());
        seal(&mut obj);
        assert_eq!(
            decode(&obj).unwrap_err().to_string(),
            "header: 2 events stored but the MEP has 1"
        );
    }

    #[test]
    fn keys_round_trip() {
        let key = object_key(12, 3, 456);
        assert_eq!(key, "run12/node3/00000000000000000456.evbo");
        assert_eq!(parse_object_key(&format!("a/b/{key}")), Some((12, 3, 456)));
        assert_eq!(parse_object_key("run1/node2/x.evbo"), None);
    }
}
