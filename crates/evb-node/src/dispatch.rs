//! Carrying out the node's actions: producing RU data, shipping
//! fragments, handing them over in memory, delivering built batches to
//! consumers, finishing batches into the sink or the store.

use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use evb_core::bu::Admit;
use evb_core::config::Readout;
use evb_core::source::payload_crc;
use evb_core::wire::{FragmentHeader, Message, FLAG_BATCH, FLAG_PARTIAL};
use evb_core::{Action, MepId, NodeId, Outcome};

use crate::mepbuf::MepBuf;
use crate::transport::Transport;

use super::output::{slot_bytes, store_accepted, store_batch, store_wait, write_batch};
use super::*;

impl Runtime {
    /// Carries out what the node asked for.
    pub(super) fn process_actions(&mut self, transport: &mut dyn Transport) -> Result<()> {
        // Bounded: a node that builds alone (its peers lost, every fragment
        // local) would otherwise never leave this loop for its timers.
        let mut budget = ACTION_BUDGET;
        self.actions_left = false;
        loop {
            // Buffers given back by the last action go to waiting MEPs first.
            self.resume_waiting_production();
            let Some(action) = (budget > 0)
                .then(|| self.engine.node.poll_action())
                .flatten()
            else {
                break;
            };
            budget -= 1;
            if budget == 0 {
                // Maybe more: the loop comes back without waiting.
                self.actions_left = true;
            }
            match action {
                Action::Send {
                    to,
                    msg: Message::Heartbeat,
                } => {
                    // Judged before our heartbeat is queued: our own write
                    // must not count as the peer taking data.
                    if transport.peer_active(to) {
                        let now = self.engine.now();
                        self.engine.node.on_peer_alive(now, to);
                    }
                    // Behind queued sends a heartbeat adds nothing.
                    if !transport.has_pending_tx(Some(to)) {
                        transport.send_control(to, &Message::Heartbeat);
                    }
                }
                Action::Send { to, msg } => {
                    // A peer that is gone gets nothing; the protocol copes
                    // (timeouts, accounting).
                    transport.send_control(to, &msg);
                }
                Action::DropPeer { peer, .. } => {
                    let ms = self.config.transport.peer_timeout_ms;
                    self.give_up_link(transport, peer, format!("silent for more than {ms} ms"));
                    self.forget_deliveries_of(peer);
                }
                Action::DrainTimedOut {
                    without_em,
                    pending,
                } => {
                    if without_em {
                        tracing::warn!(
                            "evb node {}: the EM did not come back within event_builder.em_lost_wait_ms ({} ms): ending the run",
                            self.rank,
                            self.config.event_builder.em_lost_wait_ms
                        );
                    }
                    tracing::warn!("evb node {}: drain timed out: {pending}", self.rank);
                }
                Action::Produce { mep } => self.produce_or_wait(mep),
                Action::SendFragment { header, .. } | Action::HandOver { header }
                    if self.dropped(&header) =>
                {
                    let now = self.engine.now();
                    self.engine.node.on_send_complete(now, header.mep);
                }
                Action::SendFragment { to, header } => {
                    let queued = self
                        .mep_data(header.mep)
                        .is_some_and(|(d, h)| transport.send_fragment(to, &h, d));
                    if queued {
                        self.note_handed_over(header.mep, to, u64::from(header.payload_len));
                    } else {
                        // No route: complete it so the RU releases it; the BU
                        // side will count the batch incomplete.
                        let now = self.engine.now();
                        self.engine.node.on_send_complete(now, header.mep);
                    }
                }
                Action::HandOver { header } => self.hand_over(header),
                Action::Release { mep } => {
                    if let Some((data, _, _)) = self.engine.meps.remove(&mep) {
                        self.engine.give_back_shared(data);
                    } else {
                        // Released before a buffer was free for it.
                        self.engine.waiting_for_buffer.retain(|&m| m != mep);
                    }
                }
                Action::Deliver {
                    to,
                    mep,
                    events,
                    partial,
                    ..
                } => self.deliver(transport, to, mep, events, partial),
                Action::Confirmed { mep } => {
                    if let Some((rc, _)) = self.engine.deliveries.remove(&mep) {
                        // Still in the transport's hands: freed when sent.
                        self.engine.give_back_shared(rc);
                    }
                }
                Action::Consumed { mep, bu } => self.consume(mep, bu)?,
                Action::Finish {
                    mep,
                    outcome,
                    partial,
                    ..
                } => self.finish(mep, outcome, partial)?,
                Action::Done => {}
            }
        }
        Ok(())
    }

    /// Produces a MEP into a free buffer, or queues it (in order, counted)
    /// until one is given back.
    fn produce_or_wait(&mut self, mep: MepId) {
        let e = &mut self.engine;
        let buf = if e.waiting_for_buffer.is_empty() {
            e.take_mep_buffer()
        } else {
            None
        };
        match buf {
            Some(buf) => self.produce(mep, buf),
            // A fixed set of MEP buffers with none free: the
            // MEP waits for one, in order (counted).
            None => {
                e.mep_buffer_waits += 1;
                e.waiting_for_buffer.push_back(mep);
            }
        }
    }

    /// Hands a local fragment over in memory to this node's own BU.
    fn hand_over(&mut self, header: FragmentHeader) {
        let data = self.mep_data(header.mep);
        let e = &mut self.engine;
        let now = e.now();
        if let Some((data, header)) = data {
            if e.node.admit_fragment(now, self.rank, &header) == Admit::Keep {
                let crc = e.verdict(&header, &data, None);
                let src = header.source as usize;
                e.batch(header.mep).slots[src] = Some(Slot::Local(data));
                e.node.on_fragment(now, &header, crc);
            }
        }
        e.node.on_send_complete(now, header.mep);
    }

    /// A consumer is done with a delivered batch: its work, the store,
    /// the buffer given back.
    fn consume(&mut self, mep: MepId, bu: NodeId) -> Result<()> {
        if let Some(d) = self.engine.consuming.remove(&(bu, mep)) {
            let passes = self.config.output.consumer_work_passes;
            if passes > 0 {
                let started = Instant::now();
                trigger_work(&d.buf[d.start..d.start + d.len], passes);
                let ns = started.elapsed().as_nanos() as u64;
                if let Some(fu) = self.engine.node.fu_mut() {
                    fu.record_work(ns);
                }
            }
            if let (Some(store), Some(fu)) = (self.store.as_mut(), self.engine.node.fu()) {
                // Consumed long after it came (this process was stopped),
                // its BU may have given this consumer up and delivered
                // it to another: stored only if none has.
                let late = Duration::from_millis(self.config.transport.peer_timeout_ms / 2);
                let stalled = self.stalled_until.is_some_and(|u| Instant::now() < u);
                let again = d.again || stalled || d.arrived.elapsed() > late;
                store_accepted(store, store_wait(&self.config), fu, mep, &d, again)?;
            }
            self.engine.give_back_rx(d.buf);
        }
        Ok(())
    }

    /// A batch is finished: written to the sink or the store when built (or
    /// partial and asked for), its buffers given back.
    fn finish(&mut self, mep: MepId, outcome: Outcome, partial: bool) -> Result<()> {
        let batch = self.engine.batches.remove(&mep);
        // `partial`: what arrived of an incomplete batch goes
        // to the sink too, flagged (`output.deliver_partial`).
        if outcome == Outcome::Built || partial {
            if let (Some(file), Some(b)) = (self.engine.sink.as_mut(), batch.as_ref()) {
                write_batch(file, mep, b, partial).context("writing to the output file")?;
            }
            if let (Some(store), Some(b)) = (self.store.as_mut(), batch.as_ref()) {
                let wait = store_wait(&self.config);
                store_batch(store, wait, mep, self.config.source.events_per_mep, b)?;
            }
        }
        if let Some(b) = batch {
            for slot in b.slots.into_iter().flatten() {
                match slot {
                    Slot::Received { data, .. } => self.engine.give_back_rx(data),
                    Slot::Local(rc) => self.engine.give_back_shared(rc),
                    // Released to its RU.
                    Slot::Shared(view) => drop(view),
                }
            }
        }
        Ok(())
    }

    /// RU: takes `buf` (a MEP buffer) for `mep` and tells the node the MEP
    /// is ready. The bytes are written later, just before the fragment
    /// leaves ([`Runtime::mep_data`]), so that they are still in this
    /// core's cache when the transport or the receiver reads them. A ring
    /// buffer used for the first time is filled now, once for the run.
    pub(super) fn produce(&mut self, mep: MepId, mut buf: MepBuf) {
        let e = &mut self.engine;
        let source = e.sources.as_ref().expect("only an RU is asked to produce");
        let header = match e.readout {
            Readout::Fresh => {
                let header = source.describe(mep, &mut e.size_scratch);
                buf.set_len(header.payload_len as usize);
                header
            }
            Readout::Ring => {
                let (_, index) = buf.slot().expect("the ring readout's buffers are slots");
                let i = index as usize;
                if e.ring.len() <= i {
                    e.ring.resize(i + 1, None);
                    e.ring_stale.resize(i + 1, false);
                }
                let first_use = e.ring[i].is_none();
                let t = e.ring[i].get_or_insert_with(|| source.ring_template(index));
                buf.set_len(t.payload_len as usize);
                if first_use || std::mem::take(&mut e.ring_stale[i]) {
                    source.ring_fill(t, &mut buf);
                }
                source.ring_describe(mep, t)
            }
        };
        e.meps.insert(mep, (Rc::new(buf), header, true));
        let now = e.now();
        e.node.on_mep_ready(now, header);
    }

    /// `faults.corrupt_meps`: damages the fragment after its CRC was
    /// taken: the first byte of its event data (the first event's number,
    /// which every verification level checks), or with no event data a
    /// byte of its size table (a ring buffer is then written again before
    /// its next use).
    pub(super) fn corrupt_on_purpose(&mut self, mep: MepId) {
        let faults = &self.config.faults;
        let e = &mut self.engine;
        let Some((data, header, _)) = e.meps.get_mut(&mep) else {
            return;
        };
        if faults.source != header.source || !faults.corrupt_meps.contains(&mep) {
            return;
        }
        let table = 4 * header.event_count as usize;
        let at = if (header.payload_len as usize) > table {
            table
        } else {
            0
        };
        let Some(buf) = Rc::get_mut(data) else {
            return;
        };
        if let Some(b) = buf.get_mut(at) {
            *b ^= 0x5a;
        }
        if let (Readout::Ring, Some((_, index))) = (e.readout, buf.slot()) {
            if at < table {
                e.ring_stale[index as usize] = true;
            }
        }
    }

    /// The data of `mep` and its header (with the CRC if it is checked),
    /// written now if it was not yet: the whole fragment (fresh readout)
    /// or its event numbers (ring). `None`: the MEP was released.
    pub(super) fn mep_data(&mut self, mep: MepId) -> Option<(Rc<MepBuf>, FragmentHeader)> {
        let e = &mut self.engine;
        let (data, header, unwritten) = e.meps.get_mut(&mep)?;
        if *unwritten {
            let source = e.sources.as_ref().expect("an RU holds MEPs");
            let buf = Rc::get_mut(data).expect("an unwritten MEP was never sent");
            let crc = e.crc_policy.wanted(header);
            *header = match e.readout {
                Readout::Fresh => source.produce_into(mep, buf, &mut e.size_scratch, crc),
                Readout::Ring => {
                    let (_, index) = buf.slot().expect("ring buffers are slots");
                    let t = e.ring[index as usize].as_ref().expect("filled at produce");
                    source.ring_stamp(mep, buf, t, crc)
                }
            };
            *unwritten = false;
            self.corrupt_on_purpose(mep);
        }
        self.engine.meps.get(&mep).map(|(d, h, _)| (d.clone(), *h))
    }

    /// MEPs that waited for a buffer are produced, in order, as buffers
    /// come back.
    pub(super) fn resume_waiting_production(&mut self) {
        while !self.engine.waiting_for_buffer.is_empty() {
            let Some(buf) = self.engine.take_mep_buffer() else {
                return;
            };
            let mep = self.engine.waiting_for_buffer.pop_front().expect("checked");
            self.produce(mep, buf);
        }
    }

    /// Sends built batch `mep` to the FU on endpoint `to`: the fragment
    /// table and the fragments, copied into one buffer (the transport takes
    /// one payload buffer per message), with its CRC-32C.
    pub(super) fn deliver(
        &mut self,
        transport: &mut dyn Transport,
        to: NodeId,
        mep: MepId,
        events: u64,
        partial: bool,
    ) {
        let e = &mut self.engine;
        if let Some((data, header)) = e.deliveries.get(&mep) {
            // Again: its first consumer was lost before confirming it,
            // and may have stored it.
            let again = FragmentHeader {
                flags: header.flags | evb_core::wire::FLAG_AGAIN,
                ..*header
            };
            transport.send_fragment(to, &again, data.clone());
            return;
        }
        let Some(b) = e.batches.get(&mep) else {
            return;
        };
        // Re-assigned after its first BU was lost, which may have
        // delivered it: stored only if no consumer has.
        let again = e.node.bu().is_some_and(|bu| bu.may_be_stored(mep));
        let parts: Vec<&[u8]> = b.slots.iter().map(slot_bytes).collect();
        let mut buf = e.pool.take().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(&(parts.len() as u32).to_le_bytes());
        for p in &parts {
            buf.extend_from_slice(&(p.len() as u32).to_le_bytes());
        }
        for p in &parts {
            buf.extend_from_slice(p);
        }
        let header = FragmentHeader {
            run_id: self.config.run.run_id,
            source: self.layout.bu_of[self.rank as usize].expect("a BU delivers"),
            flags: FLAG_BATCH
                | if partial { FLAG_PARTIAL } else { 0 }
                | if again { evb_core::wire::FLAG_AGAIN } else { 0 },
            mep,
            event_count: events as u32,
            payload_len: buf.len() as u32,
            crc32c: payload_crc(&buf),
        };
        let data = Rc::new(MepBuf::from_vec(buf));
        // Kept until confirmed, sent or not: a send refused because `to`
        // is gone is followed by its loss, and the batch goes to another.
        transport.send_fragment(to, &header, data.clone());
        e.deliveries.insert(mep, (data, header));
    }

    /// Fault injection: this fragment is never sent.
    pub(super) fn dropped(&self, h: &FragmentHeader) -> bool {
        let f = &self.config.faults;
        f.source == h.source && f.drop_meps.contains(&h.mep)
    }
}

/// A consumer's real processing cost: `passes` CRC-32C passes over every
/// byte of the batch, as a trigger reading its data would make. Runs on the
/// event loop, so the consumer takes nothing else (and returns no credit)
/// meanwhile.
fn trigger_work(payload: &[u8], passes: u32) -> u32 {
    let mut crc = 0;
    for _ in 0..passes {
        crc = evb_core::checksum::crc32c_append(crc, std::hint::black_box(payload));
    }
    std::hint::black_box(crc)
}
