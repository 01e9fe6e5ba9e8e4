//! Where built events go: the file sink (`output.sink = "file"`) and the
//! event store (`"store"`), for a BU's built batches or an FU's accepted
//! events.

use std::io::Write;

use anyhow::{anyhow, Context, Result};
use evb_core::MepId;

use super::*;

/// Hands a built batch to the event store. The writer works in the
/// background with a bounded queue; when it is full this waits for it
/// (the BU's credits then stay in use: backpressure reaches the EM).
pub(super) fn store_batch(
    store: &mut evb_store::StoreWriter,
    wait: Duration,
    mep: MepId,
    events_per_mep: u32,
    b: &BatchSlots,
) -> Result<()> {
    let (sources, parts): (Vec<u32>, Vec<&[u8]>) = b
        .slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Some(Slot::Received { data, start, len }) => {
                Some((i as u32, &data[*start..*start + *len]))
            }
            Some(Slot::Local(rc)) => Some((i as u32, &rc[..])),
            Some(Slot::Shared(view)) => Some((i as u32, &view[..])),
            // A source that is down is absent from the object, which
            // records the sources it holds.
            None => None,
        })
        .unzip();
    let run_sources = b.slots.len() as u32;
    with_room(store, wait, |store| {
        store.write_batch_sources(mep, events_per_mep, run_sources, &sources, &parts)
    })
}

/// Runs `write` until the store takes it, waiting for room up to `wait`
/// (the writer's queue bounds memory; a store too slow for longer than
/// that costs the batch, counted, rather than freezing the node's event
/// loop past its peers' patience). A write that fails (a full disk) costs
/// its object only: the writer counts it and goes on (`keep_going`).
fn with_room(
    store: &mut evb_store::StoreWriter,
    wait: Duration,
    mut write: impl FnMut(&mut evb_store::StoreWriter) -> Result<(), evb_store::StoreError>,
) -> Result<()> {
    loop {
        match write(store) {
            Ok(()) => return Ok(()),
            Err(evb_store::StoreError::Backpressure { .. }) => {
                if !store.wait_for_room(wait) {
                    store.note_dropped();
                    return Ok(());
                }
            }
            Err(e) => return Err(anyhow!("the event store: {e}")),
        }
    }
}

/// How long a node's event loop may wait for its store's writer: a
/// quarter of the peer timeout, so its peers never take it for hung.
pub(super) fn store_wait(config: &Config) -> Duration {
    Duration::from_millis((config.transport.peer_timeout_ms / 4).max(1))
}

/// A Filter Unit stores the events of a consumed batch its trigger
/// accepted (an object only if it accepted any), waiting for the writer
/// when its queue is full: the FU stays busy, so its credits, and through
/// them the BUs and the EM, wait too. A batch delivered again is stored
/// only if no consumer stored it yet.
pub(super) fn store_accepted(
    store: &mut evb_store::StoreWriter,
    wait: Duration,
    fu: &evb_core::fu::FilterUnit,
    mep: MepId,
    d: &Delivered,
    again: bool,
) -> Result<()> {
    if !d.intact {
        return Ok(());
    }
    let mut accepted = Vec::new();
    fu.accepted_events(mep, d.events, &mut accepted);
    if accepted.is_empty() {
        return Ok(());
    }
    let all = evb_core::wire::batch_fragments(&d.buf[d.start..d.start + d.len])
        .map_err(|e| anyhow!("a verified batch no longer parses: {e}"))?;
    // A source the batch was built without has an empty fragment.
    let (sources, parts): (Vec<u32>, Vec<&[u8]>) = all
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.is_empty())
        .map(|(i, f)| (i as u32, *f))
        .unzip();
    let run_sources = all.len() as u32;
    with_room(store, wait, |store| {
        if again {
            store.write_events_again(
                mep,
                d.events,
                run_sources,
                &sources,
                &parts,
                Some(&accepted),
            )
        } else {
            store.write_events(
                mep,
                d.events,
                run_sources,
                &sources,
                &parts,
                Some(&accepted),
            )
        }
    })
}

/// Appends a built batch: `EVBB`, MEP (u64), fragment count (u32), each
/// fragment's length (u32), then the fragments in source order; all
/// little-endian (see docs/run-json.md).
pub(super) fn write_batch(
    file: &mut std::fs::File,
    mep: MepId,
    b: &BatchSlots,
    partial: bool,
) -> std::io::Result<()> {
    let parts: Vec<&[u8]> = b.slots.iter().map(slot_bytes).collect();
    let mut head = Vec::with_capacity(16 + 4 * parts.len());
    head.extend_from_slice(if partial { b"EVBP" } else { b"EVBB" });
    head.extend_from_slice(&mep.to_le_bytes());
    head.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in &parts {
        head.extend_from_slice(&(p.len() as u32).to_le_bytes());
    }
    file.write_all(&head)?;
    for p in parts {
        file.write_all(p)?;
    }
    Ok(())
}

/// The bytes of one source's fragment in a batch (empty if it never came).
pub(super) fn slot_bytes(s: &Option<Slot>) -> &[u8] {
    match s {
        Some(Slot::Received { data, start, len }) => &data[*start..*start + *len],
        Some(Slot::Local(rc)) => &rc[..],
        Some(Slot::Shared(view)) => &view[..],
        None => &[][..],
    }
}

/// This node's outputs: the file it writes its built batches to
/// (`output.sink = "file"`, a BU), and its event-store writer (`"store"`:
/// a BU's, or with consumers an FU's).
pub(super) fn open_outputs(
    config: &Config,
    layout: &Layout,
    rank: NodeId,
) -> Result<(Option<std::fs::File>, Option<evb_store::StoreWriter>)> {
    let sink = match config.output.sink {
        SinkKind::File if layout.bu_of[rank as usize].is_some() => {
            let dir = PathBuf::from(&config.output.directory);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("output.directory {}", dir.display()))?;
            let path = dir.join(format!("run{}-node{rank}.evb", config.run.run_id));
            Some(
                std::fs::File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?,
            )
        }
        _ => None,
    };
    // With consumers the FUs store what they accept, else the BUs
    // store every built batch.
    let stores = if config.output.consumers > 0 {
        layout.fu_of[rank as usize].is_some()
    } else {
        layout.bu_of[rank as usize].is_some()
    };
    let store = match config.output.sink {
        SinkKind::Store if stores => {
            let spec = if config.output.store.is_empty() {
                &config.output.directory
            } else {
                &config.output.store
            };
            let target = evb_store::StoreTarget::parse(spec)
                .with_context(|| format!("output.store `{spec}`"))?;
            // A full or failing store costs the objects it cannot take,
            // counted, not the run. Consumers claim each MEP before they
            // store it: a batch a BU delivered again (its first consumer
            // given up, maybe alive and storing it all the same) is then
            // stored by one of them, whatever the timing.
            let options = evb_store::WriterOptions {
                keep_going: true,
                claim: config.output.consumers > 0,
                ..evb_store::WriterOptions::default()
            };
            let mut writer =
                evb_store::StoreWriter::open_with(&target, config.run.run_id, rank, options)
                    .with_context(|| format!("opening the event store `{spec}`"))?;
            writer.check_stored_by(&layout.fu_nodes);
            Some(writer)
        }
        _ => None,
    };
    Ok((sink, store))
}
