//! The discrete-event network model.
//!
//! Packets are the events (virtual cut-through): a packet's head reaches the
//! next input buffer one link latency after its transmission starts, and its
//! buffer space is returned to the sender (as credits in 64-byte blocks, per
//! virtual lane) one link latency after its tail has left. Nothing is ever
//! dropped: a sender without credits waits (counted as PortXmitWait).
//!
//! Switch: an input FIFO per port per VL (head-of-line blocking as in real
//! switches), a switch latency before the head packet may be forwarded, and
//! per output port an arbiter that serves waiting inputs in turn and picks
//! among VLs by weighted round robin. An input port reads one packet at a
//! time into the crossbar, at link rate (no internal speedup): while one of
//! its packets crosses, its other heads wait. Without that rule an input
//! could feed every free output at once, which made the input buffers act
//! as output buffers and put saturated uniform traffic at 0.73-0.76 of the
//! link instead of the input-queued limit (Karol et al.: 0.586 for large
//! N; docs/sim.md). Host: queue pairs (one per message in
//! flight) served packet by packet in turn at link rate, MTU segmentation
//! with InfiniBand header overheads, a sink that always drains, and a
//! host-side latency (PCIe + software) drawn from a histogram.
//!
//! Time is in picoseconds.

use std::collections::VecDeque;

use rand::distributions::{Distribution, WeightedIndex};
use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;

use crate::fabric::{Peer, SimFabric};
use crate::queue::EventQueue;

pub type Ps = u64;
pub const PS_PER_NS: u64 = 1000;

/// Per-packet overheads of InfiniBand, bytes.
pub const LRH: u32 = 8;
pub const BTH: u32 = 12;
pub const ICRC: u32 = 4;
pub const VCRC: u32 = 2;
/// RDMA extended transport header, on the first packet of an RDMA write.
pub const RETH: u32 = 16;
/// Credits count blocks of this many bytes.
pub const CREDIT_BLOCK: u32 = 64;

/// Link and switch parameters.
#[derive(Debug, Clone)]
pub struct Params {
    pub link_gbps: f64,
    pub link_latency_ps: Ps,
    pub switch_latency_ps: Ps,
    pub mtu: u32,
    pub vls: u8,
    pub vl_buffer_bytes: u32,
    pub vl_weights: Vec<u32>,
    /// Host latency histogram: (ps, weight).
    pub host_latency: Vec<(Ps, f64)>,
    pub seed: u64,
    /// Flit granularity: buffer space goes back to the sender one 64-byte
    /// block at a time as it drains, one event per flit, instead of once
    /// per packet when its tail has left. For validating the fast mode.
    pub flit: bool,
}

impl Params {
    /// Time to put `bytes` on a link.
    pub fn tx_ps(&self, bytes: u32) -> Ps {
        (f64::from(bytes) * 8.0 * 1000.0 / self.link_gbps).round() as Ps
    }
}

/// The built-in host latency: around 1 us with a tail, as an `ib_write_lat`
/// histogram on EDR hardware looks (PCIe + software, one side).
pub fn default_host_latency() -> Vec<(Ps, f64)> {
    [
        (800, 5.0),
        (900, 20.0),
        (1000, 40.0),
        (1100, 20.0),
        (1300, 10.0),
        (1800, 4.0),
        (3000, 1.0),
    ]
    .iter()
    .map(|&(ns, w)| (ns * PS_PER_NS, w))
    .collect()
}

pub type MsgId = u32;

/// A message posted by the traffic: segmented into packets by the host.
#[derive(Debug, Clone)]
pub struct Msg {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    /// Bytes already segmented into packets.
    pub sent: u64,
    pub vl: u8,
    /// The traffic's own reference (e.g. an index into its table).
    pub tag: u64,
    pub posted_at: Ps,
    /// Stop sending at this time (shift-window grace), if set.
    pub send_until: Option<Ps>,
}

#[derive(Debug, Clone, Copy)]
struct Packet {
    msg: MsgId,
    dst: u32,
    vl: u8,
    wire: u32,
    blocks: u32,
    payload: u32,
    last: bool,
    head_at: Ps,
}

/// An output: a host's injection port or a switch port's transmit side.
#[derive(Debug, Clone)]
struct OutPort {
    /// Where packets go: a switch input (global port id) or a host.
    to: Target,
    credits: Vec<u32>,
    busy: bool,
    /// Switch outputs: (input port id, VL) whose head packet wants this output.
    waiting: VecDeque<(u32, u8)>,
    /// Weighted round robin among VLs: current VL and what it has left.
    vl_turn: u8,
    vl_left: u32,
    bytes: u64,
    xmit_wait_ps: Ps,
    blocked_since: Option<Ps>,
    /// Credits on their way back: (time they arrive, VL, blocks). Taken in
    /// when the port next looks at its credits; only a port that waits for
    /// them has an event set for the earliest (`credit_wake`). Most credits
    /// thus cost no event at all.
    incoming: Vec<(Ps, u8, u32)>,
    credit_wake: Option<Ps>,
    /// Switch outputs: the input whose packet is on the wire (it reads one
    /// packet at a time and is free again when this output is).
    fed_by: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    SwitchIn(u32),
    Host(u32),
    Nowhere,
}

/// A switch port's receive side.
#[derive(Debug, Clone)]
struct InPort {
    switch: u32,
    queues: Vec<VecDeque<u32>>,
    /// The output that feeds this input (for credit return).
    upstream: u32,
    /// A packet of this input is crossing to an output: the input reads
    /// one packet at a time, at link rate, so its other heads wait.
    busy: bool,
    /// Per VL (bit): its head packet is in its output's `waiting` list.
    requested: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A packet's head reached a switch input a switch latency ago: it
    /// joins its VL's FIFO, ready to be forwarded once at the front.
    SwitchHead {
        inp: u32,
        pkt: u32,
    },
    OutFree {
        out: u32,
    },
    /// An output that waits for credits may have them now.
    Credit {
        out: u32,
    },
    Delivered {
        host: u32,
        msg: MsgId,
    },
    SendDone {
        host: u32,
        msg: MsgId,
    },
    Timer {
        host: u32,
        token: u64,
    },
    Sample,
}

/// Per-host counters.
#[derive(Debug, Clone, Default)]
pub struct HostCounters {
    pub payload_sent: u64,
    pub payload_received: u64,
    pub messages_delivered: u64,
}

/// What the traffic sees of the network.
pub struct Net {
    pub params: Params,
    pub fabric: SimFabric,
    now: Ps,
    queue: EventQueue<Ev>,
    outs: Vec<OutPort>,
    ins: Vec<InPort>,
    /// Global port id of (switch, port 0).
    switch_base: Vec<u32>,
    packets: Vec<Packet>,
    free_packets: Vec<u32>,
    msgs: Vec<Option<Msg>>,
    /// Events still to come for each message (delivery, send completion).
    msg_refs: Vec<u8>,
    free_msgs: Vec<MsgId>,
    /// Per host: messages with packets left, served in turn.
    active: Vec<VecDeque<MsgId>>,
    pub hosts: Vec<HostCounters>,
    rng: Pcg64Mcg,
    latency_index: WeightedIndex<f64>,
    pub events_processed: u64,
    /// Payload received per host in the current sample interval, and in
    /// the next (a packet is counted when its last hop starts, in the
    /// interval its head arrives in).
    sample_rx: Vec<u64>,
    sample_rx_next: Vec<u64>,
    /// When the current sample interval ends.
    sample_end: Ps,
    /// Payload injected per host in the current sample interval.
    sample_tx: Vec<u64>,
    pub samples: Vec<Sample>,
    /// `params.tx_ps` of every packet size up to the largest (a float
    /// multiply and round per hop was a few percent of the run).
    tx_table: Vec<Ps>,
    /// Per sample, per host: (sent, received) payload Gb/s.
    pub host_samples: Vec<Vec<(f32, f32)>>,
    pub sample_ps: Ps,
}

/// One interval of the time series.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    pub t_us: f64,
    pub mean_rx_gbps: f64,
    pub min_rx_gbps: f64,
    pub max_rx_gbps: f64,
}

/// The traffic that drives the network: synthetic patterns or the event
/// builder itself.
pub trait Traffic {
    fn start(&mut self, net: &mut Net);
    /// The last packet of `msg` reached its destination (plus host latency).
    fn delivered(&mut self, net: &mut Net, msg: &Msg);
    /// `msg` has left its source entirely (plus host latency).
    fn send_done(&mut self, net: &mut Net, msg: &Msg);
    fn timer(&mut self, _net: &mut Net, _host: u32, _token: u64) {}
    /// A time-series interval of `interval` ps ends at `now`.
    fn sample(&mut self, _now: Ps, _interval: Ps) {}
}

impl Net {
    pub fn new(fabric: SimFabric, params: Params, sample_ps: Ps) -> Net {
        let hosts = fabric.hosts() as u32;
        let vls = params.vls as usize;
        let buffer_blocks = params.vl_buffer_bytes / CREDIT_BLOCK;
        let mut switch_base = Vec::new();
        let mut total = hosts;
        for ports in &fabric.ports {
            switch_base.push(total);
            total += ports.len() as u32;
        }
        let port_id = |s: u32, p: u16| switch_base[s as usize] + u32::from(p);
        let mut outs = Vec::with_capacity(total as usize);
        for h in 0..hosts {
            let (s, p) = fabric.host_attach[h as usize];
            outs.push(OutPort::new(
                Target::SwitchIn(port_id(s, p)),
                vls,
                buffer_blocks,
            ));
        }
        let mut ins = Vec::with_capacity(total as usize);
        // Hosts have no input port of ours; keep ids aligned with `outs`.
        for _ in 0..hosts {
            ins.push(InPort::new(u32::MAX, 0, u32::MAX));
        }
        for (s, ports) in fabric.ports.iter().enumerate() {
            for (p, peer) in ports.iter().enumerate() {
                let (to, upstream) = match *peer {
                    Peer::Host(h) => (Target::Host(h), h),
                    Peer::Switch { switch, port } => (
                        Target::SwitchIn(port_id(switch, port)),
                        port_id(switch, port),
                    ),
                    Peer::None => (Target::Nowhere, u32::MAX),
                };
                outs.push(OutPort::new(to, vls, buffer_blocks));
                ins.push(InPort::new(s as u32, vls, upstream));
                let _ = p;
            }
        }
        let latency_index = WeightedIndex::new(params.host_latency.iter().map(|b| b.1))
            .expect("validated histogram");
        let rng = Pcg64Mcg::seed_from_u64(params.seed ^ 0x51_u64);
        let largest = params.mtu + LRH + BTH + ICRC + VCRC + RETH;
        let tx_table = (0..=largest).map(|b| params.tx_ps(b)).collect();
        let mut net = Net {
            fabric,
            now: 0,
            queue: EventQueue::new(),
            outs,
            ins,
            switch_base,
            packets: Vec::new(),
            free_packets: Vec::new(),
            msgs: Vec::new(),
            msg_refs: Vec::new(),
            free_msgs: Vec::new(),
            active: vec![VecDeque::new(); hosts as usize],
            hosts: vec![HostCounters::default(); hosts as usize],
            rng,
            latency_index,
            events_processed: 0,
            sample_rx: vec![0; hosts as usize],
            sample_rx_next: vec![0; hosts as usize],
            sample_end: sample_ps,
            sample_tx: vec![0; hosts as usize],
            samples: Vec::new(),
            tx_table,
            host_samples: Vec::new(),
            sample_ps,
            params,
        };
        net.at(sample_ps, Ev::Sample);
        net
    }

    pub fn now(&self) -> Ps {
        self.now
    }

    pub fn host_count(&self) -> u32 {
        self.hosts.len() as u32
    }

    fn at(&mut self, t: Ps, ev: Ev) {
        self.queue.push(t, ev);
    }

    /// Posts a message from `src` to `dst` on virtual lane `vl`.
    pub fn post(
        &mut self,
        src: u32,
        dst: u32,
        bytes: u64,
        vl: u8,
        tag: u64,
        send_until: Option<Ps>,
    ) -> MsgId {
        let msg = Msg {
            src,
            dst,
            bytes: bytes.max(1),
            sent: 0,
            vl: vl % self.params.vls,
            tag,
            posted_at: self.now,
            send_until,
        };
        let id = match self.free_msgs.pop() {
            Some(id) => {
                self.msgs[id as usize] = Some(msg);
                self.msg_refs[id as usize] = 2;
                id
            }
            None => {
                self.msgs.push(Some(msg));
                self.msg_refs.push(2);
                (self.msgs.len() - 1) as MsgId
            }
        };
        self.active[src as usize].push_back(id);
        self.try_inject(src);
        id
    }

    /// Time to put a packet of `wire` bytes on a link.
    fn tx(&self, wire: u32) -> Ps {
        match self.tx_table.get(wire as usize) {
            Some(&t) => t,
            None => self.params.tx_ps(wire),
        }
    }

    /// Calls the traffic's `timer(host, token)` at time `t`.
    pub fn set_timer(&mut self, host: u32, t: Ps, token: u64) {
        self.at(t.max(self.now), Ev::Timer { host, token });
    }

    /// A host-side latency drawn from the histogram.
    pub fn host_latency(&mut self) -> Ps {
        let i = self.latency_index.sample(&mut self.rng);
        self.params.host_latency[i].0
    }

    /// Runs until `end` (ps).
    pub fn run(&mut self, traffic: &mut dyn Traffic, end: Ps, mut progress: impl FnMut(Ps)) {
        traffic.start(self);
        let mut next_progress = 0;
        while let Some((t, ev)) = self.queue.pop() {
            if t > end {
                break;
            }
            self.now = t;
            self.events_processed += 1;
            if t >= next_progress {
                progress(t);
                next_progress = t + end / 100 + 1;
            }
            self.handle(ev, traffic);
        }
        self.now = end;
        for o in &mut self.outs {
            if let Some(since) = o.blocked_since.take() {
                o.xmit_wait_ps += end.saturating_sub(since);
            }
        }
    }

    fn handle(&mut self, ev: Ev, traffic: &mut dyn Traffic) {
        match ev {
            Ev::SwitchHead { inp, pkt } => {
                let vl = self.packets[pkt as usize].vl;
                let q = &mut self.ins[inp as usize].queues[vl as usize];
                q.push_back(pkt);
                if q.len() == 1 {
                    self.head_ready(inp, vl);
                }
            }
            Ev::OutFree { out } => {
                let o = &mut self.outs[out as usize];
                o.busy = false;
                let fed_by = std::mem::replace(&mut o.fed_by, u32::MAX);
                self.serve(out);
                if fed_by != u32::MAX {
                    self.input_free(fed_by);
                }
            }
            Ev::Credit { out } => {
                self.outs[out as usize].credit_wake = None;
                self.serve(out);
            }
            Ev::Delivered { msg, .. } => {
                let m = self.msgs[msg as usize].clone().expect("delivered once");
                self.hosts[m.dst as usize].messages_delivered += 1;
                self.release_msg(msg);
                traffic.delivered(self, &m);
            }
            Ev::SendDone { msg, .. } => {
                let m = self.msgs[msg as usize].clone().expect("in flight");
                self.release_msg(msg);
                traffic.send_done(self, &m);
            }
            Ev::Timer { host, token } => traffic.timer(self, host, token),
            Ev::Sample => {
                let secs = self.sample_ps as f64 * 1e-12;
                let rates: Vec<f64> = self
                    .sample_rx
                    .iter()
                    .map(|&b| b as f64 * 8.0 / secs / 1e9)
                    .collect();
                let n = rates.len().max(1) as f64;
                self.samples.push(Sample {
                    t_us: self.now as f64 * 1e-6,
                    mean_rx_gbps: rates.iter().sum::<f64>() / n,
                    min_rx_gbps: rates.iter().copied().fold(f64::INFINITY, f64::min),
                    max_rx_gbps: rates.iter().copied().fold(0.0, f64::max),
                });
                let gbps = |b: u64| (b as f64 * 8.0 / secs / 1e9) as f32;
                self.host_samples.push(
                    self.sample_tx
                        .iter()
                        .zip(&self.sample_rx)
                        .map(|(&tx, &rx)| (gbps(tx), gbps(rx)))
                        .collect(),
                );
                std::mem::swap(&mut self.sample_rx, &mut self.sample_rx_next);
                self.sample_rx_next.iter_mut().for_each(|b| *b = 0);
                self.sample_tx.iter_mut().for_each(|b| *b = 0);
                traffic.sample(self.now, self.sample_ps);
                let t = self.now + self.sample_ps;
                self.sample_end = t;
                self.at(t, Ev::Sample);
            }
        }
    }

    /// Output `out` is free or may have credits: a host injects, a switch
    /// port forwards.
    fn serve(&mut self, out: u32) {
        if out < self.host_count() {
            self.try_inject(out);
        } else {
            self.try_forward(out);
        }
    }

    /// The output the front packet of input `inp`, VL `vl`, is routed to.
    fn route_of_head(&self, inp: u32, vl: u8) -> u32 {
        let port = &self.ins[inp as usize];
        let pkt = port.queues[vl as usize][0];
        let s = port.switch;
        let dst = self.packets[pkt as usize].dst;
        self.switch_base[s as usize] + u32::from(self.fabric.routes[s as usize][dst as usize])
    }

    /// The front packet of input `inp`, VL `vl`, is ready: it asks for its
    /// output.
    fn head_ready(&mut self, inp: u32, vl: u8) {
        let out = self.route_of_head(inp, vl);
        self.ins[inp as usize].requested |= 1 << vl;
        self.outs[out as usize].waiting.push_back((inp, vl));
        self.try_forward(out);
    }

    /// Input `inp` has finished reading a packet out: the next packet of
    /// that VL asks for its output, and the outputs the heads of its other
    /// VLs wait for may take them now.
    fn input_free(&mut self, inp: u32) {
        self.ins[inp as usize].busy = false;
        // First every head asks (only the VL just read from can have a new
        // one), then their outputs look: one of them takes the input.
        let mut outs = [u32::MAX; 16];
        for vl in 0..self.params.vls {
            let port = &self.ins[inp as usize];
            if port.queues[vl as usize].is_empty() {
                continue;
            }
            let out = self.route_of_head(inp, vl);
            outs[vl as usize] = out;
            if port.requested & (1 << vl) == 0 {
                self.ins[inp as usize].requested |= 1 << vl;
                self.outs[out as usize].waiting.push_back((inp, vl));
            }
        }
        for &out in &outs[..usize::from(self.params.vls)] {
            if self.ins[inp as usize].busy {
                return;
            }
            if out != u32::MAX {
                self.try_forward(out);
            }
        }
    }

    /// Takes in the credits of `out` that have come back by now.
    fn absorb_credits(&mut self, out: u32) {
        let now = self.now;
        let o = &mut self.outs[out as usize];
        if o.incoming.is_empty() {
            return;
        }
        let mut i = 0;
        while i < o.incoming.len() {
            let (t, vl, blocks) = o.incoming[i];
            if t <= now {
                o.credits[vl as usize] += blocks;
                o.incoming.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// `out` waits for credits: wake it when the next ones come back.
    fn wait_for_credits(&mut self, out: u32) {
        let o = &mut self.outs[out as usize];
        let Some(next) = o.incoming.iter().map(|c| c.0).min() else {
            return; // None on their way: whatever frees a buffer will come.
        };
        if o.credit_wake.is_none_or(|w| w > next) {
            o.credit_wake = Some(next);
            self.at(next, Ev::Credit { out });
        }
    }

    /// Credits for packet `p`, which starts leaving a buffer at `start`,
    /// back to the output `to` that filled the buffer, a link latency later.
    fn return_credits(&mut self, to: u32, p: Packet, start: Ps) {
        let lat = self.params.link_latency_ps;
        if self.params.flit {
            for i in 1..=p.blocks {
                let drained = self.tx((i * CREDIT_BLOCK).min(p.wire));
                self.outs[to as usize]
                    .incoming
                    .push((start + drained + lat, p.vl, 1));
            }
        } else {
            let t = start + self.tx(p.wire) + lat;
            self.outs[to as usize].incoming.push((t, p.vl, p.blocks));
        }
        // The sender may be waiting for exactly these.
        if self.outs[to as usize].blocked_since.is_some() {
            self.wait_for_credits(to);
        }
    }

    fn release_msg(&mut self, id: MsgId) {
        let refs = &mut self.msg_refs[id as usize];
        *refs -= 1;
        if *refs == 0 {
            self.msgs[id as usize] = None;
            self.free_msgs.push(id);
        }
    }

    fn alloc_packet(&mut self, p: Packet) -> u32 {
        match self.free_packets.pop() {
            Some(i) => {
                self.packets[i as usize] = p;
                i
            }
            None => {
                self.packets.push(p);
                (self.packets.len() - 1) as u32
            }
        }
    }

    /// Puts a packet on output `out`: head downstream after the link
    /// latency, output free after the transmission time.
    fn transmit(&mut self, out: u32, pkt: u32) {
        let p = self.packets[pkt as usize];
        let tx = self.tx(p.wire);
        let o = &mut self.outs[out as usize];
        o.busy = true;
        o.credits[p.vl as usize] -= p.blocks;
        o.bytes += u64::from(p.wire);
        if let Some(since) = o.blocked_since.take() {
            o.xmit_wait_ps += self.now - since;
        }
        let head = self.now + self.params.link_latency_ps;
        self.packets[pkt as usize].head_at = head;
        match o.to {
            Target::SwitchIn(inp) => {
                let ready = head + self.params.switch_latency_ps;
                self.at(ready, Ev::SwitchHead { inp, pkt });
            }
            Target::Host(host) => self.arrive_at_host(out, host, pkt, head),
            Target::Nowhere => unreachable!("routes are validated"),
        }
        self.at(self.now + tx, Ev::OutFree { out });
    }

    /// The packet on its last hop, from output `from`, reaches `host` at
    /// `head`: the sink always drains, so everything about its arrival is
    /// known now (credits back as its tail arrives, the delivery of a
    /// message's last packet a host latency after its tail).
    fn arrive_at_host(&mut self, from: u32, host: u32, pkt: u32, head: Ps) {
        let p = self.packets[pkt as usize];
        let tail = head + self.tx(p.wire);
        self.return_credits(from, p, head);
        self.hosts[host as usize].payload_received += u64::from(p.payload);
        if head < self.sample_end {
            self.sample_rx[host as usize] += u64::from(p.payload);
        } else {
            self.sample_rx_next[host as usize] += u64::from(p.payload);
        }
        if p.last {
            let lat = self.host_latency();
            self.at(tail + lat, Ev::Delivered { host, msg: p.msg });
        }
        self.free_packets.push(pkt);
    }

    /// A host's injection: the next packet of the next queue pair in turn.
    fn try_inject(&mut self, host: u32) {
        if self.outs[host as usize].busy {
            return;
        }
        loop {
            let Some(&id) = self.active[host as usize].front() else {
                return;
            };
            let mtu = u64::from(self.params.mtu);
            let m = self.msgs[id as usize]
                .as_mut()
                .expect("active messages exist");
            if m.send_until.is_some_and(|t| self.now >= t) {
                // Past its window: the rest is never sent.
                // Its packets already sent are never "last": no delivery
                // event comes, only the send completion.
                m.bytes = m.sent;
                self.active[host as usize].pop_front();
                self.msg_refs[id as usize] = 1;
                if m.sent == 0 {
                    self.release_msg(id);
                } else {
                    let t = self.now;
                    self.at(t, Ev::SendDone { host, msg: id });
                }
                continue;
            }
            let payload = (m.bytes - m.sent).min(mtu) as u32;
            let first = m.sent == 0;
            let wire = payload + LRH + BTH + ICRC + VCRC + if first { RETH } else { 0 };
            let blocks = wire.div_ceil(CREDIT_BLOCK);
            let vl = m.vl;
            if self.outs[host as usize].credits[vl as usize] < blocks {
                self.absorb_credits(host);
                let o = &mut self.outs[host as usize];
                if o.credits[vl as usize] < blocks {
                    o.blocked_since.get_or_insert(self.now);
                    self.wait_for_credits(host);
                    return;
                }
            }
            let m = self.msgs[id as usize].as_mut().expect("active");
            m.sent += u64::from(payload);
            let last = m.sent >= m.bytes;
            let dst = m.dst;
            self.hosts[host as usize].payload_sent += u64::from(payload);
            self.sample_tx[host as usize] += u64::from(payload);
            let pkt = self.alloc_packet(Packet {
                msg: id,
                dst,
                vl,
                wire,
                blocks,
                payload,
                last,
                head_at: 0,
            });
            let q = &mut self.active[host as usize];
            q.pop_front();
            if last {
                let done = self.now + self.tx(wire) + self.host_latency();
                self.at(done, Ev::SendDone { host, msg: id });
            } else {
                q.push_back(id);
            }
            self.transmit(host, pkt);
            return;
        }
    }

    /// A switch output: serve a waiting input whose VL has credits.
    fn try_forward(&mut self, out: u32) {
        let vls = self.params.vls;
        let o = &self.outs[out as usize];
        if o.busy || o.waiting.is_empty() {
            return;
        }
        self.absorb_credits(out);
        let o = &self.outs[out as usize];
        // Weighted round robin among VLs; within a VL, inputs in arrival order.
        let mut chosen = None;
        let mut vl = o.vl_turn;
        for _ in 0..vls {
            let pos = o.waiting.iter().position(|&(inp, v)| {
                v == vl && {
                    let port = &self.ins[inp as usize];
                    let pkt = port.queues[v as usize][0];
                    !port.busy && o.credits[v as usize] >= self.packets[pkt as usize].blocks
                }
            });
            if let Some(pos) = pos {
                chosen = Some(pos);
                break;
            }
            vl = (vl + 1) % vls;
        }
        let Some(pos) = chosen else {
            let now = self.now;
            self.outs[out as usize].blocked_since.get_or_insert(now);
            self.wait_for_credits(out);
            return;
        };
        let weights = &self.params.vl_weights;
        let o = &mut self.outs[out as usize];
        let (inp, v) = o.waiting.remove(pos).expect("found above");
        if v != o.vl_turn {
            o.vl_turn = v;
            o.vl_left = weights.get(v as usize).copied().unwrap_or(1);
        }
        o.vl_left = o.vl_left.saturating_sub(1);
        if o.vl_left == 0 {
            o.vl_turn = (v + 1) % vls;
            o.vl_left = weights.get(o.vl_turn as usize).copied().unwrap_or(1);
        }
        o.fed_by = inp;
        let port = &mut self.ins[inp as usize];
        let pkt = port.queues[v as usize].pop_front().expect("a head packet");
        port.busy = true;
        port.requested &= !(1 << v);
        let p = self.packets[pkt as usize];
        // The buffer space is free as the packet leaves: tell the sender.
        let upstream = port.upstream;
        let start = self.now;
        self.return_credits(upstream, p, start);
        // The input is busy until the packet has crossed (`input_free` at
        // this output's `OutFree`): the next head asks for its output then.
        self.transmit(out, pkt);
    }

    /// Per output port: (name, bytes sent, PortXmitWait ps).
    pub fn link_report(&self) -> Vec<(String, u64, Ps)> {
        let h = self.host_count() as usize;
        let mut out = Vec::new();
        for (i, o) in self.outs.iter().enumerate() {
            if o.to == Target::Nowhere {
                continue;
            }
            let name = if i < h {
                format!("{} -> up", self.fabric.host_names[i])
            } else {
                let s = self.ins[i].switch as usize;
                let port = i as u32 - self.switch_base[s];
                format!("{} port {}", self.fabric.switch_names[s], port + 1)
            };
            out.push((name, o.bytes, o.xmit_wait_ps));
        }
        out
    }
}

impl OutPort {
    fn new(to: Target, vls: usize, blocks: u32) -> OutPort {
        OutPort {
            to,
            credits: vec![blocks; vls],
            busy: false,
            waiting: VecDeque::new(),
            vl_turn: 0,
            vl_left: 1,
            bytes: 0,
            xmit_wait_ps: 0,
            blocked_since: None,
            incoming: Vec::new(),
            credit_wake: None,
            fed_by: u32::MAX,
        }
    }
}

impl InPort {
    fn new(switch: u32, vls: usize, upstream: u32) -> InPort {
        InPort {
            switch,
            queues: vec![VecDeque::new(); vls],
            upstream,
            busy: false,
            requested: 0,
        }
    }
}
