//! A delivered batch read by fragment and by event, with every length
//! checked before anything is sliced: the layout of docs/wire-format.md
//! (a fragment table, then one RU fragment per source: its event sizes,
//! then its events back to back).
//!
//! The consumer verified the batch's CRC-32C and fragment table before it
//! handed the batch out; the event size tables inside the fragments are
//! checked here, when the events are first asked for, so that a consumer
//! that only moves batches on pays nothing for them.

use std::ops::Range;
use std::sync::OnceLock;

/// Where each fragment of a batch is, and (on first use) each event.
#[derive(Debug)]
pub struct BatchIndex {
    fragments: Vec<Range<usize>>,
    events: u32,
    /// Per source, `events + 1` offsets into the payload (the end of the
    /// last event last); or why a fragment's size table is wrong.
    offsets: OnceLock<Result<Vec<usize>, String>>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl BatchIndex {
    /// Indexes a batch payload of `events` events.
    pub fn new(payload: &[u8], events: u32) -> Result<BatchIndex, String> {
        let count = u32_at(payload, 0).ok_or("batch shorter than its fragment count")? as usize;
        // The count is bounded by the bytes there, before anything is
        // allocated for it.
        let table_end = count
            .checked_mul(4)
            .and_then(|t| t.checked_add(4))
            .filter(|&end| end <= payload.len())
            .ok_or_else(|| {
                format!(
                    "fragment table of {count} entries does not fit in {} bytes",
                    payload.len()
                )
            })?;
        let mut fragments = Vec::with_capacity(count);
        let mut at = table_end;
        for s in 0..count {
            let len = u32_at(payload, 4 + 4 * s).expect("inside the table") as usize;
            let end = at
                .checked_add(len)
                .filter(|&end| end <= payload.len())
                .ok_or_else(|| format!("fragment {s} ({len} bytes) runs past the batch"))?;
            fragments.push(at..end);
            at = end;
        }
        if at != payload.len() {
            return Err(format!(
                "fragments end at byte {at} of a {}-byte batch",
                payload.len()
            ));
        }
        Ok(BatchIndex {
            fragments,
            events,
            offsets: OnceLock::new(),
        })
    }

    pub fn sources(&self) -> u32 {
        self.fragments.len() as u32
    }

    pub fn events(&self) -> u32 {
        self.events
    }

    /// Source `s`'s whole fragment (its event sizes, then its events);
    /// empty for a source a partial batch was built without.
    pub fn fragment<'a>(&self, payload: &'a [u8], s: u32) -> Result<&'a [u8], String> {
        let r = self.fragments.get(s as usize).ok_or_else(|| {
            format!(
                "source {s} does not exist: the batch has {} sources",
                self.sources()
            )
        })?;
        Ok(&payload[r.clone()])
    }

    /// Event `e`'s data from source `s` (empty for a missing source).
    pub fn event<'a>(&self, payload: &'a [u8], e: u32, s: u32) -> Result<&'a [u8], String> {
        if e >= self.events {
            return Err(format!(
                "event {e} does not exist: the batch has {} events",
                self.events
            ));
        }
        self.fragment(payload, s)?;
        let offsets = self
            .offsets
            .get_or_init(|| self.event_offsets(payload))
            .as_ref()
            .map_err(Clone::clone)?;
        let at = s as usize * (self.events as usize + 1) + e as usize;
        Ok(&payload[offsets[at]..offsets[at + 1]])
    }

    /// Every event's offset, fragment by fragment, checking that each
    /// fragment's size table adds up to its length.
    fn event_offsets(&self, payload: &[u8]) -> Result<Vec<usize>, String> {
        let n = self.events as usize;
        let mut out = Vec::with_capacity(self.fragments.len() * (n + 1));
        for (s, r) in self.fragments.iter().enumerate() {
            if r.is_empty() {
                out.extend(std::iter::repeat_n(r.start, n + 1));
                continue;
            }
            let frag = &payload[r.clone()];
            let sizes = n * 4;
            if frag.len() < sizes {
                return Err(format!(
                    "fragment of source {s}: {} bytes, shorter than the sizes of {n} events",
                    frag.len()
                ));
            }
            let mut at = r.start + sizes;
            out.push(at);
            for e in 0..n {
                let size = u32_at(frag, 4 * e).expect("inside the size table") as usize;
                at = at.saturating_add(size);
                out.push(at);
            }
            if at != r.end {
                return Err(format!(
                    "fragment of source {s}: its event sizes add up to {} bytes, it has {}",
                    at - r.start - sizes,
                    r.len() - sizes
                ));
            }
        }
        Ok(out)
    }
}
