//! The receive side: the [`Engine`] the transport hands what arrives to
//! (control messages, fragment headers to admit, payloads into pooled
//! buffers), and its buffer bookkeeping.

use std::rc::Rc;

use evb_core::bu::Admit;
use evb_core::config::Readout;
use evb_core::source::payload_crc;
use evb_core::wire::{FragmentHeader, Message, FLAG_BATCH, FLAG_PARTIAL};
use evb_core::{MepId, Nanos, NodeId};

use crate::mepbuf::MepBuf;
use crate::transport::shm::SharedView;
use crate::transport::RxHandler;

use super::*;

impl Engine {
    /// The node's time: since the start of the run (0 before it).
    pub(super) fn now(&self) -> Nanos {
        if !self.running {
            return 0;
        }
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Ring readout: fills every buffer of the ring now (their layouts
    /// drawn, sizes and pattern written: some 20-50 ms for 14 buffers).
    pub(super) fn fill_ring(&mut self) {
        let (Readout::Ring, Some(store), Some(source)) = (self.readout, &self.slots, &self.sources)
        else {
            return;
        };
        let mut all = Vec::new();
        while let Some(buf) = store.take(0) {
            all.push(buf);
        }
        let slots = store.store().slots() as usize;
        self.ring = vec![None; slots];
        self.ring_stale = vec![false; slots];
        for buf in &mut all {
            let (_, index) = buf.slot().expect("a store's buffers are slots");
            let t = source.ring_template(index);
            buf.set_len(t.payload_len as usize);
            source.ring_fill(&t, buf);
            self.ring[index as usize] = Some(t);
        }
    }

    /// A buffer for a MEP's fragment: a free slot of the fixed set (none
    /// free: `None`, the MEP waits), or a heap buffer (fresh data on
    /// demand).
    pub(super) fn take_mep_buffer(&mut self) -> Option<MepBuf> {
        match &self.slots {
            Some(store) => store.take(0),
            None => Some(MepBuf::from_vec(self.pool.take().unwrap_or_default())),
        }
    }

    /// The last handle on a MEP buffer, or on a delivered batch: a heap
    /// buffer goes back to the spares (a store's slot goes back to its
    /// store by itself, when its last handle is dropped).
    pub(super) fn give_back_shared(&mut self, data: Rc<MepBuf>) {
        if let Some(v) = Rc::try_unwrap(data).ok().and_then(MepBuf::into_vec) {
            self.pool.give(v);
        }
    }

    /// The CRC to hand the BU for a received fragment: the BU counts a
    /// fragment intact when it is the header's CRC. It is, when the
    /// fragment passed the checks of `event_builder.verify`: the header
    /// check always ([`evb_core::source::check_fragment`]), and the CRC-32C
    /// (`crc`, computed by the transport, or now) where the level wants it.
    /// Otherwise it is not.
    pub(super) fn verdict(&self, header: &FragmentHeader, payload: &[u8], crc: Option<u32>) -> u32 {
        let mut intact = evb_core::source::check_fragment(header, payload);
        if intact && self.crc_policy.wanted(header) {
            intact = crc.unwrap_or_else(|| payload_crc(payload)) == header.crc32c;
        }
        if intact {
            header.crc32c
        } else {
            !header.crc32c
        }
    }

    pub(super) fn give_back_rx(&mut self, buf: Vec<u8>) {
        self.rx_pool.give(buf);
    }

    /// Frees the spare buffers no one needed since the last call, and
    /// gives the memory back to the system: after a burst (a backlog, a
    /// slow consumer) the resident memory returns to the steady state.
    pub(super) fn trim_pools(&mut self) {
        let freed = self.pool.trim() + self.rx_pool.trim();
        if freed > 0 {
            // SAFETY: glibc's malloc_trim only returns free heap pages.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    /// `EVB_MEMDEBUG`: where this process's memory is, on stderr.
    pub(super) fn print_memory(&self, rank: NodeId) {
        // SAFETY: mallinfo2 only reads allocator statistics.
        let m = unsafe { libc::mallinfo2() };
        tracing::warn!(
            "evb node {rank} memory: t {:.0} s rss {} KiB, heap {} KiB ({} KiB in use), \
             mmapped {} chunks {} KiB, spares {}+{}, meps {}, batches {}, deliveries {}, consuming {}, \
             buffer waits {} overflows {}",
            self.epoch.elapsed().as_secs_f64(),
            crate::report::resident_bytes() >> 10,
            m.arena >> 10,
            m.uordblks >> 10,
            m.hblks,
            m.hblkhd >> 10,
            self.pool.spares.len(),
            self.rx_pool.spares.len(),
            self.meps.len(),
            self.batches.len(),
            self.deliveries.len(),
            self.consuming.len(),
            self.mep_buffer_waits,
            self.rx_pool.fixed.map_or(0, |f| f.short),
        );
    }

    pub(super) fn batch(&mut self, mep: MepId) -> &mut BatchSlots {
        let rus = self.rus;
        self.batches.entry(mep).or_insert_with(|| BatchSlots {
            slots: (0..rus).map(|_| None).collect(),
        })
    }
}

impl RxHandler for Engine {
    fn on_alive(&mut self, peer: NodeId) {
        let now = self.now();
        self.node.on_peer_alive(now, peer);
    }

    fn on_control(&mut self, peer: NodeId, msg: Message) {
        let now = self.now();
        self.node.on_message(now, peer, msg);
    }

    fn admit(&mut self, peer: NodeId, header: &FragmentHeader) -> bool {
        let now = self.now();
        self.node.admit_fragment(now, peer, header) == Admit::Keep
    }

    fn wants_crc(&mut self, header: &FragmentHeader) -> bool {
        self.crc_policy.wanted(header)
    }

    fn on_shared_fragment(&mut self, _peer: NodeId, header: FragmentHeader, view: SharedView) {
        let now = self.now();
        let crc = self.verdict(&header, &view, None);
        let src = header.source as usize;
        if let Some(slot) = self.batch(header.mep).slots.get_mut(src) {
            *slot = Some(Slot::Shared(view));
        }
        self.node.on_fragment(now, &header, crc);
    }

    fn spare_buffer(&mut self, min_len: usize) -> Vec<u8> {
        match (self.rx_pool.take(), self.rx_pool.fixed) {
            (Some(b), _) if b.len() >= min_len => b,
            // A pool buffer whose length a transport shortened: its
            // capacity is touched already.
            (Some(mut b), Some(_)) if b.capacity() >= min_len => {
                b.resize(min_len, 0);
                b
            }
            (None, Some(f)) => {
                // Past the bound the protocol guarantees: not silent.
                if f.short == 1 {
                    tracing::warn!(
                        "evb node: no free receive buffer in the preallocated pool of {}: \
                         allocating past it (counted in rx_buffer_overflows)",
                        f.buffers
                    );
                }
                vec![0; min_len.max(f.len)]
            }
            // A new zeroed allocation: large ones come from the kernel as
            // untouched pages, so a generous size costs only what is used.
            _ => vec![0; min_len],
        }
    }

    fn on_fragment(
        &mut self,
        peer: NodeId,
        header: FragmentHeader,
        crc: Option<u32>,
        buf: Vec<u8>,
        offset: usize,
    ) {
        let now = self.now();
        let len = header.payload_len as usize;
        if header.flags & FLAG_BATCH != 0 {
            let payload = buf.get(offset..offset + len).unwrap_or(&[]);
            let crc = crc.unwrap_or_else(|| payload_crc(payload));
            let intact = crc == header.crc32c
                && payload.len() == len
                && evb_core::wire::check_batch_payload(payload).is_ok();
            let delivered = Delivered {
                buf,
                start: offset,
                len,
                events: header.event_count,
                intact,
                partial: header.flags & FLAG_PARTIAL != 0,
                again: header.flags & evb_core::wire::FLAG_AGAIN != 0,
                arrived: std::time::Instant::now(),
            };
            self.consuming.insert((peer, header.mep), delivered);
            let held = |e: &Self| e.node.fu().map_or(0, |f| f.held());
            let before = held(self);
            self.node.on_delivery(now, &header, intact);
            if held(self) > before {
                // Held for an embedding application: handed out in order.
                self.handed.push_back((peer, header.mep));
            }
            return;
        }
        let payload = buf.get(offset..offset + len).unwrap_or(&[]);
        let crc = self.verdict(&header, payload, crc);
        let src = header.source as usize;
        if let Some(slot) = self.batch(header.mep).slots.get_mut(src) {
            *slot = Some(Slot::Received {
                data: buf,
                start: offset,
                len,
            });
        }
        self.node.on_fragment(now, &header, crc);
    }
}
