//! The discrete-event network model.
//!
//! Packets are the events (virtual cut-through): a packet's head reaches the
//! next input buffer one link latency after its transmission starts, and its
//! buffer space is returned to the sender (as credits in 64-byte blocks, per
//! virtual lane) one link latency after its tail has left. Nothing is ever
//! dropped on InfiniBand: a sender without credits waits (counted as
//! PortXmitWait).
//!
//! InfiniBand switch: an input FIFO per port per VL (head-of-line blocking
//! as in real switches), a switch latency before the head packet may be
//! forwarded, and per output port an arbiter that serves waiting inputs in
//! turn and picks among VLs by weighted round robin. An input port reads one
//! packet at a time into the crossbar, at link rate (no internal speedup):
//! while one of its packets crosses, its other heads wait. Without that rule
//! an input could feed every free output at once, which made the input
//! buffers act as output buffers and put saturated uniform traffic at
//! 0.73-0.76 of the link instead of the input-queued limit (Karol et al.:
//! 0.586 for large N; docs/sim.md).
//!
//! Ethernet switch (the output network, RoCE v2): shared memory, a queue
//! per output port per priority (the VL), so no head-of-line blocking
//! inside the switch. Lossless (PFC): every input port counts the bytes it
//! holds per priority and sends PAUSE upstream above XOFF (the buffer less
//! the headroom of a round trip) and RESUME below XON; the paused sender,
//! a host NIC, stops all its traffic of that priority (head-of-line
//! blocking moves into the sender). Lossy: an output queue beyond the
//! buffer drops the packet; the receiver discards what follows a gap and
//! asks for it again (go-back-N, one NAK per gap); a sender whose message
//! is not all in a timeout after its last packet left (a lost tail, a lost
//! retransmission) goes back too. There is no congestion control (DCQCN):
//! an overloaded lossy network collapses into retransmissions.
//!
//! Every link has its own rate. A packet cannot leave a switch faster than
//! it arrives: onto a faster output it goes once enough of it is in for its
//! tail to keep up (store-and-forward in effect), so that the faster link
//! carries it in its own, shorter time and has room for others.
//!
//! Host: queue pairs (one per message in flight) served packet by packet in
//! turn at link rate, MTU segmentation with the header overheads of the
//! network (InfiniBand or RoCE v2), and a host-side latency (PCIe +
//! software) drawn from a histogram. Between the NIC and memory, DMA at
//! the PCIe rate (`sim.host.pcie_gbps`), one server per direction: a
//! packet leaves no sooner than its payload has been read, and an arriving
//! packet's buffer in the NIC (its credits) is free once its payload has
//! been written, so a receive path slower than the wire backs up into the
//! fabric. A message to the host itself never reaches the wire: the NIC
//! loops it back through both DMA directions (a whole message at a time,
//! first come first served with the packets).
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
    /// MTU packets of a message moved as one unit on InfiniBand links
    /// (`sim.train_packets`): its wire size counts every packet's headers.
    pub train: u32,
    /// InfiniBand hosts inject a message at its path's rate, the least
    /// link rate on its route (`sim.static_rate`).
    pub static_rate: bool,
    /// The hosts' NIC-to-memory path (`[sim.host]`).
    pub host: evb_core::config::SimHostSection,
    /// Ethernet switches and the hosts on them.
    pub eth: EthParams,
}

/// The Ethernet (RoCE v2) part of the model: the output network.
#[derive(Debug, Clone)]
pub struct EthParams {
    /// Bytes on the wire per packet besides the payload (and RETH).
    pub header_bytes: u32,
    pub mtu: u32,
    pub switch_latency_ps: Ps,
    /// Per switch port per priority: the buffer PFC guards (lossless) or
    /// the output queue's limit (lossy), bytes.
    pub buffer_bytes: u32,
    /// PFC (pause frames); otherwise packets are dropped.
    pub lossless: bool,
    /// Lossy: the sender's ACK timeout, from its sending a message's last
    /// packet to going back to what the receiver lacks.
    pub rto_ps: Ps,
}

/// RoCE v2 per packet: preamble and gap 20, Ethernet 14 + VLAN tag 4 (the
/// priority PFC acts on) + FCS 4, IPv4 20, UDP 8, BTH 12, ICRC 4.
pub const ROCE_HEADER_BYTES: u32 = 20 + 14 + 4 + 4 + 20 + 8 + 12 + 4;

impl Default for EthParams {
    fn default() -> Self {
        EthParams {
            header_bytes: ROCE_HEADER_BYTES,
            mtu: 4096,
            switch_latency_ps: 400 * PS_PER_NS,
            buffer_bytes: 512 * 1024,
            lossless: true,
            rto_ps: 100_000 * PS_PER_NS,
        }
    }
}

impl Params {
    /// Time to put `bytes` on a link of `sim.link_gbps`.
    pub fn tx_ps(&self, bytes: u32) -> Ps {
        tx_ps_at(bytes, self.link_gbps)
    }
}

/// Time to put `bytes` on a link of `gbps`.
pub fn tx_ps_at(bytes: u32, gbps: f64) -> Ps {
    (f64::from(bytes) * 8.0 * 1000.0 / gbps).round() as Ps
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
    /// Bytes the receiver has taken in sequence (lossy networks: what
    /// follows a lost packet is discarded until it comes again).
    pub received: u64,
    /// The send completion is on its way (a retransmitted last packet
    /// does not announce it again).
    done_posted: bool,
    /// In its host's list of messages with packets to send.
    queued: bool,
    /// The receiver asked for the bytes from here again (one NAK per gap).
    nak_at: u64,
    /// Its retransmission timeout is set (one at a time).
    rto_armed: bool,
    /// Queued again after a NAK or timeout (holding a reference).
    requeued: bool,
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
    /// Where its payload starts in the message.
    offset: u64,
    /// When its tail arrives (or arrived) at the input it is in.
    tail_at: Ps,
    /// Ethernet: the input port whose buffer it counts against.
    inp: u32,
}

/// Most virtual lanes a port has (`sim.vls` is at most 15).
const MAX_VLS: usize = 16;

const _: () = assert!(std::mem::offset_of!(OutPort, credits) == 64);
const _: () = assert!(std::mem::offset_of!(OutPort, waiting) == 128);
const _: () = assert!(std::mem::offset_of!(InPort, queues) == 64);

/// An output: a host's injection port or a switch port's transmit side.
///
/// Laid out by hand (`repr(C)`, cache-line aligned): what every packet
/// touches first (one line), its credits (the next), its queues' headers
/// (the third), the rest after. The fabric's ports are far more than the
/// cache holds, and the simulator's time was mostly waiting for them.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct OutPort {
    /// When the earliest and the latest of `incoming` arrive (`Ps::MAX`
    /// and 0: none).
    next_credit: Ps,
    last_credit: Ps,
    /// Host outputs under static rate: free again no sooner than this (the
    /// gap after a packet that keeps a message at its path's rate).
    pace_until: Ps,
    blocked_since: Option<Ps>,
    /// Switch outputs: the input whose packet is on the wire (it reads one
    /// packet at a time and is free again when this output is), and that
    /// packet's priority and size (Ethernet: its buffer is freed then).
    fed_by: u32,
    /// Where the rate's transmission times start in `Net::tx_table`.
    tx_base: u32,
    /// Weighted round robin among VLs: current VL and what it has left.
    vl_left: u32,
    /// Per priority (bit): the receiver sent PAUSE.
    paused: u16,
    vl_turn: u8,
    /// Index of its link rate in `Net::rates`.
    rate: u8,
    busy: bool,
    /// InfiniBand: credits per VL; Ethernet ports have none (PFC pauses).
    credit_based: bool,
    /// A port of an Ethernet switch: output queues, not input FIFOs.
    eth_switch: bool,
    _pad: [u8; 5],
    /// Per VL (`MAX_VLS`, of which `sim.vls` are used).
    credits: [u32; MAX_VLS],
    /// InfiniBand switch outputs: (input port id, VL, the credit blocks it
    /// needs) whose head packet wants this output.
    waiting: VecDeque<(u32, u8, u32)>,
    /// Credits on their way back: (time they arrive, VL, blocks), in time
    /// order. Taken in when the port next looks at its credits; only a port
    /// that waits for them has an event set for the earliest
    /// (`credit_wake`). Most credits thus cost no event at all.
    incoming: VecDeque<(Ps, u8, u32)>,
    /// Where packets go: a switch input (global port id) or a host.
    to: Target,
    /// From the start of a transmission to the packet's head being ready
    /// downstream: the link latency, plus the switch latency there.
    head_delay: Ps,
    bytes: u64,
    xmit_wait_ps: Ps,
    credit_wake: Option<Ps>,
    fed_vl: u8,
    fed_wire: u32,
    /// Ethernet switch outputs: the packets queued here, per priority, and
    /// their bytes (the one on the wire included).
    egress: Vec<VecDeque<u32>>,
    egress_bytes: u64,
    /// Packets dropped here (lossy Ethernet), and their bytes.
    drops: u64,
    dropped_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    SwitchIn(u32),
    Host(u32),
    Nowhere,
}

/// A switch port's receive side (laid out as `OutPort`: what a packet
/// touches first in one line, then the FIFOs, in place).
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct InPort {
    switch: u32,
    /// The output that feeds this input (for credit return, PAUSE).
    upstream: u32,
    /// Per VL (bit): its head packet is in its output's `waiting` list.
    requested: u16,
    /// A packet of this input is crossing to an output: the input reads
    /// one packet at a time, at link rate, so its other heads wait.
    busy: bool,
    /// The VL of the packet being read out.
    reading_vl: u8,
    /// On an Ethernet switch.
    eth: bool,
    /// Per VL whose bit is set in `requested`: the port of this switch its
    /// head packet is routed to.
    head_port: [u16; MAX_VLS],
    /// Ethernet, per priority: the PAUSE thresholds, and (bit) PAUSE sent
    /// upstream.
    pausing: u16,
    xoff: u32,
    xon: u32,
    _pad: u64,
    /// Per VL (`sim.vls` of them; none on Ethernet).
    queues: [VecDeque<u32>; MAX_VLS],
    /// Ethernet, per priority: bytes in the switch that came in here.
    held: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A packet's head reached a switch input a switch latency ago: it
    /// joins its VL's FIFO (InfiniBand) or its output's queue (Ethernet).
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
    /// Links of different rates: input `inp` has read its packet out.
    InFree {
        inp: u32,
    },
    /// A PAUSE (or its end) reaches output `out` for priority `vl`.
    Pause {
        out: u32,
        vl: u8,
        on: bool,
    },
    /// The receiver's NAK reaches the sender of `msg`: go back to what
    /// it has (go-back-N).
    Nak {
        msg: MsgId,
    },
    /// The retransmission timeout of `msg`, armed when its last packet
    /// left (lossy Ethernet).
    Rto {
        msg: MsgId,
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
    /// Payload put on the wire, retransmissions included.
    pub payload_sent: u64,
    /// Payload taken in sequence (each byte once).
    pub payload_received: u64,
    pub messages_delivered: u64,
    /// Lossy networks: payload that arrived out of sequence or twice and
    /// was discarded.
    pub payload_discarded: u64,
}

/// What one output port did over the run.
#[derive(Debug, Clone)]
pub struct PortReport {
    pub name: String,
    pub gbps: f64,
    pub bytes: u64,
    /// PortXmitWait: time with a packet to send and no credits or paused.
    pub xmit_wait_ps: Ps,
    pub drops: u64,
    pub dropped_bytes: u64,
}

/// Network-wide counters of the Ethernet part.
#[derive(Debug, Clone, Default)]
pub struct EthCounters {
    pub pause_frames: u64,
    pub drops: u64,
    pub naks: u64,
    pub timeouts: u64,
    /// Payload sent again after a NAK or a timeout.
    pub retransmitted_bytes: u64,
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
    /// Events still to come for each message (delivery, send completion,
    /// NAK, timeout), and on lossy networks its packets on their way (a
    /// copy sent twice may arrive after the message is complete).
    msg_refs: Vec<u32>,
    free_msgs: Vec<MsgId>,
    /// Per host: messages with packets left, served in turn.
    active: Vec<VecDeque<MsgId>>,
    /// Per host: how many VL 0 (data) messages its NIC works on at once
    /// (0: all), those in `active` and those waiting their turn in order.
    data_limit: Vec<u32>,
    data_active: Vec<u32>,
    data_waiting: Vec<VecDeque<MsgId>>,
    /// Per host: on an Ethernet network (RoCE v2 headers and MTU).
    host_eth: Vec<bool>,
    /// Some Ethernet switch drops: receivers check sequence.
    lossy: bool,
    /// Links run at different rates (packets may have to wait for their
    /// tails before going on).
    mixed_rates: bool,
    /// Static rate: per (source, destination) host, the path's rate where
    /// it is below the source's link rate (0: none), `hosts x hosts`;
    /// empty when no path is slower than its source's link.
    path_rate: Vec<f32>,
    /// Per host: ps per payload byte of its NIC's DMA (0: no limit), and
    /// when its read (send) and write (receive) directions are free.
    dma_ps_per_byte: Vec<f64>,
    dma_read_free: Vec<Ps>,
    dma_write_free: Vec<Ps>,
    pub hosts: Vec<HostCounters>,
    pub eth_counters: EthCounters,
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
    /// Per link rate met in the fabric (`rates`), the transmission time of
    /// every packet size up to the largest, one rate after the other in one
    /// table (a float multiply and round per hop was a few percent of the
    /// run).
    rates: Vec<f64>,
    tx_table: Vec<Ps>,
    tx_stride: u32,
    /// Per sample, per host: (sent, received) payload Gb/s.
    pub host_samples: Vec<Vec<(f32, f32)>>,
    pub sample_ps: Ps,
    /// The time series' mean, min and max cover hosts `0..series_hosts`
    /// (the event-building fabric's, not the output network's).
    pub series_hosts: usize,
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

/// The fabric's ports as the engine keeps them: one output port per host
/// and per switch port, the input ports aligned with them (a host's is a
/// placeholder), and the distinct link rates they run at.
struct Ports {
    /// Per switch: the id of its port 0 (hosts come first, ids `0..hosts`).
    switch_base: Vec<u32>,
    outs: Vec<OutPort>,
    ins: Vec<InPort>,
    /// Every distinct link rate, Gb/s, in the order met; `OutPort::rate`
    /// indexes it.
    rates: Vec<f64>,
    /// Per host: on an Ethernet network.
    host_eth: Vec<bool>,
}

impl Ports {
    fn of(fabric: &SimFabric, params: &Params) -> Ports {
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
        // Every distinct link rate gets its table of transmission times.
        let mut rates: Vec<f64> = Vec::new();
        let mut rate_index = |gbps: f64| -> u8 {
            match rates.iter().position(|&r| r == gbps) {
                Some(i) => i as u8,
                None => {
                    rates.push(gbps);
                    (rates.len() - 1) as u8
                }
            }
        };
        let host_eth: Vec<bool> = fabric
            .host_attach
            .iter()
            .map(|&(s, _)| fabric.ethernet[s as usize])
            .collect();
        let mut outs = Vec::with_capacity(total as usize);
        for h in 0..hosts {
            let (s, p) = fabric.host_attach[h as usize];
            let rate = rate_index(fabric.host_link_gbps(h as usize, params.link_gbps));
            let mut o = OutPort::new(Target::SwitchIn(port_id(s, p)), vls, buffer_blocks, rate);
            o.credit_based = !host_eth[h as usize];
            outs.push(o);
        }
        let mut ins = Vec::with_capacity(total as usize);
        // Hosts have no input port of ours; keep ids aligned with `outs`.
        for _ in 0..hosts {
            ins.push(InPort::new(u32::MAX, 0, u32::MAX, false));
        }
        for (s, ports) in fabric.ports.iter().enumerate() {
            let eth = fabric.ethernet[s];
            for (p, peer) in ports.iter().enumerate() {
                let (to, upstream) = match *peer {
                    Peer::Host(h) => (Target::Host(h), h),
                    Peer::Switch { switch, port } => (
                        Target::SwitchIn(port_id(switch, port)),
                        port_id(switch, port),
                    ),
                    Peer::None => (Target::Nowhere, u32::MAX),
                };
                let gbps = fabric.port_link_gbps(s, p, params.link_gbps);
                let mut o = OutPort::new(to, vls, buffer_blocks, rate_index(gbps));
                let mut inp = InPort::new(s as u32, vls, upstream, eth);
                if eth {
                    o.credit_based = false;
                    o.eth_switch = true;
                    o.egress = vec![VecDeque::new(); vls];
                    (inp.xoff, inp.xon) = pfc_thresholds(params, gbps);
                }
                outs.push(o);
                ins.push(inp);
            }
        }
        Ports {
            switch_base,
            outs,
            ins,
            rates,
            host_eth,
        }
    }
}

impl Net {
    pub fn new(fabric: SimFabric, params: Params, sample_ps: Ps) -> Net {
        let hosts = fabric.hosts() as u32;
        let Ports {
            switch_base,
            mut outs,
            ins,
            rates,
            host_eth,
        } = Ports::of(&fabric, &params);
        let latency_index = WeightedIndex::new(params.host_latency.iter().map(|b| b.1))
            .expect("validated histogram");
        let rng = Pcg64Mcg::seed_from_u64(params.seed ^ 0x51_u64);
        let largest = (params.train.max(1) * (params.mtu + LRH + BTH + ICRC + VCRC))
            .max(params.eth.mtu + params.eth.header_bytes)
            + RETH;
        let tx_stride = largest + 1;
        let tx_table = rates
            .iter()
            .flat_map(|&g| (0..=largest).map(move |b| tx_ps_at(b, g)))
            .collect();
        for o in &mut outs {
            o.tx_base = u32::from(o.rate) * tx_stride;
            o.head_delay = params.link_latency_ps
                + match o.to {
                    Target::SwitchIn(inp) if ins[inp as usize].eth => params.eth.switch_latency_ps,
                    Target::SwitchIn(_) => params.switch_latency_ps,
                    _ => 0,
                };
        }
        let lossy = !params.eth.lossless && fabric.ethernet.iter().any(|&e| e);
        let mixed_rates = rates.len() > 1;
        let path_rate = if params.static_rate && mixed_rates {
            slower_paths(&fabric, params.link_gbps)
        } else {
            Vec::new()
        };
        let dma_ps_per_byte = (0..hosts as usize)
            .map(|h| {
                let link = fabric.host_link_gbps(h, params.link_gbps);
                8000.0 / params.host.pcie_gbps_for(link)
            })
            .collect();
        let mut net = Net {
            dma_ps_per_byte,
            dma_read_free: vec![0; hosts as usize],
            dma_write_free: vec![0; hosts as usize],
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
            data_limit: vec![0; hosts as usize],
            data_active: vec![0; hosts as usize],
            data_waiting: vec![VecDeque::new(); hosts as usize],
            host_eth,
            lossy,
            mixed_rates,
            path_rate,
            hosts: vec![HostCounters::default(); hosts as usize],
            eth_counters: EthCounters::default(),
            rng,
            latency_index,
            events_processed: 0,
            sample_rx: vec![0; hosts as usize],
            sample_rx_next: vec![0; hosts as usize],
            sample_end: sample_ps,
            sample_tx: vec![0; hosts as usize],
            samples: Vec::new(),
            rates,
            tx_table,
            tx_stride,
            host_samples: Vec::new(),
            sample_ps,
            series_hosts: hosts as usize,
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

    /// Host `h`'s NIC works on at most `k` data (VL 0) messages at once,
    /// the others wait in the order posted (0: no limit). Control messages
    /// (other VLs) always go at once.
    pub fn limit_data_messages(&mut self, h: u32, k: u32) {
        self.data_limit[h as usize] = k;
    }

    /// The rate host `h` injects packets for host `dst` at, where the
    /// path is slower than `h`'s link and static rate is on.
    fn static_rate_of(&self, h: u32, dst: u32) -> Option<f64> {
        if self.path_rate.is_empty() || !self.outs[h as usize].credit_based {
            return None;
        }
        let r = self.path_rate[h as usize * self.hosts.len() + dst as usize];
        (r > 0.0).then_some(f64::from(r))
    }

    /// The data rate of host `h`'s link, Gb/s.
    pub fn host_gbps(&self, h: u32) -> f64 {
        self.rates[self.outs[h as usize].rate as usize]
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
        let vl = vl % self.params.vls;
        let msg = Msg {
            src,
            dst,
            bytes: bytes.max(1),
            sent: 0,
            vl,
            tag,
            posted_at: self.now,
            send_until,
            received: 0,
            done_posted: false,
            queued: true,
            nak_at: u64::MAX,
            rto_armed: false,
            requeued: false,
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
        if src == dst {
            self.loop_back(id);
            return id;
        }
        let s = src as usize;
        if self.data_limit[s] > 0 && vl == 0 {
            if self.data_active[s] >= self.data_limit[s] {
                self.msgs[id as usize].as_mut().expect("posted").queued = false;
                self.data_waiting[s].push_back(id);
                return id;
            }
            self.data_active[s] += 1;
        }
        self.active[s].push_back(id);
        self.try_inject(src);
        id
    }

    /// A message from a host to itself: its NIC reads it from memory and
    /// writes it back (each direction in turn with the packets it serves),
    /// the wire untouched. Sent when read, delivered when written.
    fn loop_back(&mut self, id: MsgId) {
        let m = self.msgs[id as usize].as_mut().expect("just posted");
        let (h, bytes) = (m.src as usize, m.bytes);
        m.sent = bytes;
        m.received = bytes;
        m.queued = false;
        m.done_posted = true;
        let dma = (bytes as f64 * self.dma_ps_per_byte[h]).round() as Ps;
        let read = self.now.max(self.dma_read_free[h]) + dma;
        self.dma_read_free[h] = read;
        // The write follows the read as it streams; it ends once both have.
        let written = (self.now.max(self.dma_write_free[h]) + dma).max(read);
        self.dma_write_free[h] = written;
        let host = h as u32;
        let sent_at = read + self.host_latency();
        self.at(sent_at, Ev::SendDone { host, msg: id });
        let delivered_at = written + self.host_latency();
        self.at(delivered_at, Ev::Delivered { host, msg: id });
    }

    /// A data message of `host` has sent its last packet: the next one
    /// waiting for the NIC starts.
    fn data_message_sent(&mut self, host: u32) {
        let h = host as usize;
        if self.data_limit[h] == 0 {
            return;
        }
        match self.data_waiting[h].pop_front() {
            Some(next) => {
                self.msgs[next as usize].as_mut().expect("waiting").queued = true;
                self.active[h].push_back(next);
            }
            None => self.data_active[h] -= 1,
        }
    }

    /// Time to put a packet of `wire` bytes on output `out`.
    fn tx(&self, out: u32, wire: u32) -> Ps {
        let o = &self.outs[out as usize];
        if wire < self.tx_stride {
            self.tx_table[(o.tx_base + wire) as usize]
        } else {
            tx_ps_at(wire, self.rates[o.rate as usize])
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
                if self.mixed_rates && self.too_early(inp, pkt) {
                    return;
                }
                if self.ins[inp as usize].eth {
                    self.eth_arrive(inp, pkt);
                    return;
                }
                let vl = self.packets[pkt as usize].vl;
                let q = &mut self.ins[inp as usize].queues[vl as usize];
                q.push_back(pkt);
                if q.len() == 1 {
                    self.head_ready(inp, vl);
                }
            }
            Ev::OutFree { out } => {
                let o = &mut self.outs[out as usize];
                if o.pace_until > self.now {
                    // Static rate: the gap after the packet is not over.
                    let t = o.pace_until;
                    self.at(t, Ev::OutFree { out });
                    return;
                }
                o.busy = false;
                let fed_by = std::mem::replace(&mut o.fed_by, u32::MAX);
                if o.eth_switch {
                    self.eth_left(out, fed_by);
                    self.eth_forward(out);
                    return;
                }
                self.serve(out);
                if fed_by != u32::MAX {
                    self.input_free(fed_by);
                }
            }
            Ev::Credit { out } => {
                self.outs[out as usize].credit_wake = None;
                self.serve(out);
            }
            Ev::InFree { inp } => self.input_free(inp),
            Ev::Pause { out, vl, on } => {
                let o = &mut self.outs[out as usize];
                if on {
                    o.paused |= 1 << vl;
                } else {
                    o.paused &= !(1 << vl);
                    self.serve(out);
                }
            }
            Ev::Nak { msg } => {
                self.eth_counters.naks += 1;
                self.go_back(msg);
                self.release_msg(msg);
            }
            Ev::Rto { msg } => {
                if let Some(m) = self.msgs[msg as usize].as_mut() {
                    m.rto_armed = false;
                }
                if self.msgs[msg as usize]
                    .as_ref()
                    .is_some_and(|m| m.received < m.bytes)
                {
                    self.eth_counters.timeouts += 1;
                    self.go_back(msg);
                }
                self.release_msg(msg);
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
            Ev::Sample => self.take_sample(traffic),
        }
    }

    /// The end of a sampling period: the receive rates of the period as a
    /// sample (mean, min and max over the hosts in the series), every
    /// host's rates, the traffic told; the next sample comes a period on.
    fn take_sample(&mut self, traffic: &mut dyn Traffic) {
        let secs = self.sample_ps as f64 * 1e-12;
        let rates: Vec<f64> = self.sample_rx[..self.series_hosts]
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

    /// Output `out` is free, may have credits or is no longer paused: a
    /// host injects, a switch port forwards.
    fn serve(&mut self, out: u32) {
        if out < self.host_count() {
            self.try_inject(out);
        } else if self.outs[out as usize].eth_switch {
            self.eth_forward(out);
        } else {
            self.try_forward(out);
        }
    }

    /// Links of different rates: a packet is not forwarded onto a faster
    /// link before enough of it has come in for its tail to keep up
    /// (store-and-forward in effect); its `SwitchHead` comes again then.
    fn too_early(&mut self, inp: u32, pkt: u32) -> bool {
        let p = self.packets[pkt as usize];
        let out = self.route(self.ins[inp as usize].switch, p.dst);
        let tx = self.tx(out, p.wire);
        if self.now + tx >= p.tail_at {
            return false;
        }
        self.at(p.tail_at - tx, Ev::SwitchHead { inp, pkt });
        true
    }

    /// The output of switch `s` towards host `dst`.
    fn route(&self, s: u32, dst: u32) -> u32 {
        self.switch_base[s as usize] + u32::from(self.fabric.routes[s as usize][dst as usize])
    }

    /// The front packet of input `inp`, VL `vl`, is ready: it asks for its
    /// output.
    fn head_ready(&mut self, inp: u32, vl: u8) {
        self.ask(inp, vl);
        let out = self.head_out(inp, vl);
        self.try_forward(out);
    }

    /// The head packet of input `inp`, VL `vl`, asks for its output: it
    /// waits in the output's list, and the input notes where it goes.
    fn ask(&mut self, inp: u32, vl: u8) {
        let port = &self.ins[inp as usize];
        let pkt = port.queues[vl as usize][0];
        let p = &self.packets[pkt as usize];
        let s = port.switch as usize;
        let (local, blocks) = (self.fabric.routes[s][p.dst as usize], p.blocks);
        let out = self.switch_base[s] + u32::from(local);
        let port = &mut self.ins[inp as usize];
        port.requested |= 1 << vl;
        port.head_port[vl as usize] = local;
        self.outs[out as usize].waiting.push_back((inp, vl, blocks));
    }

    /// The output the head packet of input `inp`, VL `vl`, asked for.
    fn head_out(&self, inp: u32, vl: u8) -> u32 {
        let port = &self.ins[inp as usize];
        self.switch_base[port.switch as usize] + u32::from(port.head_port[vl as usize])
    }

    /// Input `inp` has finished reading a packet out: the next packet of
    /// that VL asks for its output, and the outputs the heads of its other
    /// VLs wait for may take them now.
    fn input_free(&mut self, inp: u32) {
        let port = &mut self.ins[inp as usize];
        port.busy = false;
        // Only the VL just read from can have a head that has not asked
        // yet: it asks first, then the outputs of every waiting head look
        // (one of them takes the input).
        let v = port.reading_vl;
        if !port.queues[v as usize].is_empty() && port.requested & (1 << v) == 0 {
            self.ask(inp, v);
        }
        let mut bits = self.ins[inp as usize].requested;
        while bits != 0 {
            let port = &self.ins[inp as usize];
            if port.busy {
                return;
            }
            let vl = bits.trailing_zeros() as u8;
            bits &= bits - 1;
            let out = self.head_out(inp, vl);
            self.try_forward(out);
        }
    }

    /// Takes in the credits of `out` that have come back by now.
    fn absorb_credits(&mut self, out: u32) {
        let now = self.now;
        let o = &mut self.outs[out as usize];
        if o.next_credit > now {
            return;
        }
        // `incoming` is in time order: what is due is at its front.
        while let Some(&(t, vl, blocks)) = o.incoming.front() {
            if t > now {
                o.next_credit = t;
                return;
            }
            o.credits[vl as usize] += blocks;
            o.incoming.pop_front();
        }
        // Empty: the next credits go at the buffer's start again (a ring
        // that only turns walks through all its lines, cold by then).
        o.incoming.clear();
        o.next_credit = Ps::MAX;
        o.last_credit = 0;
    }

    /// `out` waits for credits: wake it when the next ones come back.
    fn wait_for_credits(&mut self, out: u32) {
        let o = &mut self.outs[out as usize];
        let next = o.next_credit;
        if next == Ps::MAX {
            return; // None on their way: whatever frees a buffer will come.
        }
        if o.credit_wake.is_none_or(|w| w > next) {
            o.credit_wake = Some(next);
            self.at(next, Ev::Credit { out });
        }
    }

    /// Credits for packet `p`, which leaves a buffer from `start` to `end`
    /// (on the next link, or into the host), back to the output `to` that
    /// filled the buffer, a link latency later.
    fn return_credits(&mut self, to: u32, p: Packet, start: Ps, end: Ps) {
        if !self.outs[to as usize].credit_based {
            return;
        }
        let lat = self.params.link_latency_ps;
        if self.params.flit {
            let span = end - start;
            for i in 1..=p.blocks {
                let bytes = (i * CREDIT_BLOCK).min(p.wire);
                // Block by block as the packet drains, at the pace it goes.
                let drained = (span as u128 * u128::from(bytes) / u128::from(p.wire)) as Ps;
                self.outs[to as usize].credit_back(start + drained + lat, p.vl, 1);
            }
        } else if p.payload > self.params.mtu && !self.host_eth_out(to) {
            // A train: each packet's blocks come back as its tail leaves,
            // as they would packet by packet (a train holding its whole
            // buffer until its last packet left starves a link whose
            // buffer holds two trains or fewer).
            let k = p.payload.div_ceil(self.params.mtu);
            let span = end - start;
            let per = p.blocks / k;
            for i in 1..=k {
                let blocks = if i == k {
                    p.blocks - per * (k - 1)
                } else {
                    per
                };
                let left = start + span * Ps::from(i) / Ps::from(k);
                self.outs[to as usize].credit_back(left + lat, p.vl, blocks);
            }
        } else {
            self.outs[to as usize].credit_back(end + lat, p.vl, p.blocks);
        }
        // The sender may be waiting for exactly these.
        if self.outs[to as usize].blocked_since.is_some() {
            self.wait_for_credits(to);
        }
    }

    /// Output `out` belongs to an Ethernet host or switch (no trains).
    fn host_eth_out(&self, out: u32) -> bool {
        !self.outs[out as usize].credit_based
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
    /// latency, output free after the transmission time, or when the
    /// packet's tail has come in if that is later (a faster output cannot
    /// overtake its input). Returns when the output is free.
    fn transmit(&mut self, out: u32, pkt: u32) -> Ps {
        let p = self.packets[pkt as usize];
        let end = (self.now + self.tx(out, p.wire)).max(p.tail_at);
        let lat = self.params.link_latency_ps;
        let o = &mut self.outs[out as usize];
        let ready = self.now + o.head_delay;
        o.busy = true;
        if o.credit_based {
            o.credits[p.vl as usize] -= p.blocks;
        }
        o.bytes += u64::from(p.wire);
        if let Some(since) = o.blocked_since.take() {
            o.xmit_wait_ps += self.now - since;
        }
        let head = self.now + lat;
        self.packets[pkt as usize].tail_at = end + lat;
        match o.to {
            Target::SwitchIn(inp) => self.at(ready, Ev::SwitchHead { inp, pkt }),
            Target::Host(host) => self.arrive_at_host(out, host, pkt, head, end + lat),
            Target::Nowhere => unreachable!("routes are validated"),
        }
        self.at(end, Ev::OutFree { out });
        end
    }

    /// The packet on its last hop, from output `from`, reaches `host` from
    /// `head` to `tail`: the sink always drains, so everything about its
    /// arrival is known now (credits back as its tail arrives, the
    /// delivery of a message's last packet a host latency after its tail).
    fn arrive_at_host(&mut self, from: u32, host: u32, pkt: u32, head: Ps, tail: Ps) {
        let p = self.packets[pkt as usize];
        // Its buffer in the NIC is free once DMA has written it to memory.
        let h = host as usize;
        let tail = if self.dma_ps_per_byte[h] > 0.0 {
            let dma = (f64::from(p.payload) * self.dma_ps_per_byte[h]).round() as Ps;
            let written = tail.max(self.dma_write_free[h] + dma);
            self.dma_write_free[h] = written;
            written
        } else {
            tail
        };
        self.return_credits(from, p, head, tail);
        self.free_packets.push(pkt);
        let complete = if self.lossy && self.host_eth[host as usize] {
            // Go-back-N: only the next bytes in sequence are taken.
            let m = self.msgs[p.msg as usize].as_mut().expect("in flight");
            if p.offset != m.received {
                self.hosts[host as usize].payload_discarded += u64::from(p.payload);
                if p.offset > m.received && m.nak_at != m.received {
                    // A gap: one NAK for it, back at the sender a link
                    // round trip and a switch later.
                    m.nak_at = m.received;
                    self.msg_refs[p.msg as usize] += 1;
                    let back =
                        tail + 2 * self.params.link_latency_ps + self.params.eth.switch_latency_ps;
                    self.at(back, Ev::Nak { msg: p.msg });
                }
                self.release_msg(p.msg);
                return;
            }
            m.received += u64::from(p.payload);
            let complete = m.received >= m.bytes;
            // Its packet's reference, after the delivery took its own.
            if complete {
                let lat = self.host_latency();
                self.at(tail + lat, Ev::Delivered { host, msg: p.msg });
            }
            self.release_msg(p.msg);
            self.count_received(host, head, p.payload);
            return;
        } else {
            p.last
        };
        self.count_received(host, head, p.payload);
        if complete {
            let lat = self.host_latency();
            self.at(tail + lat, Ev::Delivered { host, msg: p.msg });
        }
    }

    /// Payload taken in by `host`, its head arriving at `head`.
    fn count_received(&mut self, host: u32, head: Ps, payload: u32) {
        self.hosts[host as usize].payload_received += u64::from(payload);
        if head < self.sample_end {
            self.sample_rx[host as usize] += u64::from(payload);
        } else {
            self.sample_rx_next[host as usize] += u64::from(payload);
        }
    }

    /// Lossy Ethernet: arms the ACK timeout of `msg` unless it is armed;
    /// says whether it was.
    fn rto_armed(&mut self, msg: MsgId) -> bool {
        let m = self.msgs[msg as usize].as_mut().expect("in flight");
        std::mem::replace(&mut m.rto_armed, true)
    }

    /// Lossy Ethernet: the sender of `msg` goes back to the first byte the
    /// receiver lacks.
    fn go_back(&mut self, msg: MsgId) {
        let Some(m) = self.msgs[msg as usize].as_mut() else {
            return;
        };
        if m.received >= m.bytes || m.sent <= m.received {
            return; // Complete, or already sending from there.
        }
        self.eth_counters.retransmitted_bytes += m.sent - m.received;
        m.sent = m.received;
        let src = m.src;
        if !m.queued {
            // Back in the NIC's queue after its send completion: it holds a
            // reference of its own, or a delivery of packets still on their
            // way could free it while queued.
            m.queued = true;
            m.requeued = true;
            self.msg_refs[msg as usize] += 1;
            self.active[src as usize].push_back(msg);
        }
        self.try_inject(src);
    }

    /// A message sent again leaves its NIC's queue: its own reference goes.
    fn leave_queue(&mut self, id: MsgId) {
        let m = self.msgs[id as usize].as_mut().expect("queued");
        m.queued = false;
        if std::mem::replace(&mut m.requeued, false) {
            self.release_msg(id);
        }
    }

    /// Takes message `id`, at the front of `host`'s queue, off the queue
    /// if nothing more of it is to be sent: sent again but completed by
    /// what was on its way, or past its send window. Says whether it did.
    fn drop_unsendable(&mut self, host: u32, id: MsgId) -> bool {
        let m = self.msgs[id as usize]
            .as_mut()
            .expect("active messages exist");
        if m.requeued && m.received >= m.bytes {
            // Sent again, but what was on its way completed it.
            self.active[host as usize].pop_front();
            self.leave_queue(id);
            return true;
        }
        if m.send_until.is_some_and(|t| self.now >= t) {
            // Past its window: the rest is never sent.
            // Its packets already sent are never "last": no delivery
            // event comes, only the send completion.
            m.bytes = m.sent;
            m.queued = false;
            self.active[host as usize].pop_front();
            self.msg_refs[id as usize] = 1;
            if m.sent == 0 {
                self.release_msg(id);
            } else {
                let t = self.now;
                self.at(t, Ev::SendDone { host, msg: id });
            }
            return true;
        }
        false
    }

    /// A host's injection: the next packet of the next queue pair in turn.
    fn try_inject(&mut self, host: u32) {
        if self.outs[host as usize].busy {
            return;
        }
        // A host port without credits is an Ethernet NIC.
        let eth = !self.outs[host as usize].credit_based;
        let (mtu, header) = if eth {
            (self.params.eth.mtu, self.params.eth.header_bytes)
        } else {
            (self.params.mtu, LRH + BTH + ICRC + VCRC)
        };
        loop {
            let Some(&id) = self.active[host as usize].front() else {
                return;
            };
            if self.drop_unsendable(host, id) {
                continue;
            }
            let m = self.msgs[id as usize]
                .as_mut()
                .expect("active messages exist");
            // InfiniBand: a train of up to `train` packets, each with its
            // headers (the RETH on the message's first only).
            let train = if eth { 1 } else { self.params.train.max(1) };
            let payload = (m.bytes - m.sent).min(u64::from(mtu) * u64::from(train)) as u32;
            let first = m.sent == 0;
            let wire =
                payload + payload.div_ceil(mtu).max(1) * header + if first { RETH } else { 0 };
            let blocks = wire.div_ceil(CREDIT_BLOCK);
            let vl = m.vl;
            let o = &self.outs[host as usize];
            if o.paused & (1 << vl) != 0 {
                // PAUSE: the NIC sends nothing of this priority.
                let now = self.now;
                self.outs[host as usize].blocked_since.get_or_insert(now);
                return;
            }
            if o.credit_based && o.credits[vl as usize] < blocks {
                self.absorb_credits(host);
                let o = &mut self.outs[host as usize];
                if o.credits[vl as usize] < blocks {
                    o.blocked_since.get_or_insert(self.now);
                    self.wait_for_credits(host);
                    return;
                }
            }
            let m = self.msgs[id as usize].as_mut().expect("active");
            let offset = m.sent;
            m.sent += u64::from(payload);
            let last = m.sent >= m.bytes;
            let dst = m.dst;
            let announce = last && !m.done_posted;
            if last {
                m.done_posted = true;
            }
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
                offset,
                tail_at: 0,
                inp: u32::MAX,
            });
            let q = &mut self.active[host as usize];
            q.pop_front();
            if !last {
                q.push_back(id);
            }
            if eth && self.lossy {
                // The packet holds its message until it arrives or is lost.
                self.msg_refs[id as usize] += 1;
            }
            let rto = last && eth && self.lossy && !self.rto_armed(id);
            if announce {
                let done = self.now + self.tx(host, wire) + self.host_latency();
                self.at(done, Ev::SendDone { host, msg: id });
                if vl == 0 {
                    self.data_message_sent(host);
                }
            }
            if rto {
                // The sender's ACK timeout: if the receiver does not have
                // it all by then (a lost retransmission, or a lost tail
                // with nothing after it to reveal the gap), go back.
                self.msg_refs[id as usize] += 1;
                let t = self.now + self.params.eth.rto_ps;
                self.at(t, Ev::Rto { msg: id });
            }
            if last {
                self.leave_queue(id);
            }
            self.transmit(host, pkt);
            self.pace_injection(host, dst, wire, payload);
            return;
        }
    }

    /// After a packet of `payload` bytes (`wire` on the wire) to `dst`
    /// left `host`: its next packet leaves no sooner than the path's static
    /// rate and the NIC's DMA reads allow.
    fn pace_injection(&mut self, host: u32, dst: u32, wire: u32, payload: u32) {
        if let Some(r) = self.static_rate_of(host, dst) {
            // As if this one had gone at the path's rate (the HCA's
            // inter-packet delay).
            self.outs[host as usize].pace_until = self.now + tx_ps_at(wire, r);
        }
        let h = host as usize;
        if self.dma_ps_per_byte[h] > 0.0 {
            // The next packet's payload is read after this one's: the NIC
            // sends no faster than DMA reads (loopbacks included).
            let dma = (f64::from(payload) * self.dma_ps_per_byte[h]).round() as Ps;
            let read = self.now.max(self.dma_read_free[h]) + dma;
            self.dma_read_free[h] = read;
            let o = &mut self.outs[h];
            o.pace_until = o.pace_until.max(read);
        }
    }

    /// An InfiniBand switch output: serve a waiting input whose VL has
    /// credits.
    fn try_forward(&mut self, out: u32) {
        let vls = self.params.vls;
        let o = &self.outs[out as usize];
        if o.busy || o.waiting.is_empty() {
            return;
        }
        self.absorb_credits(out);
        let o = &self.outs[out as usize];
        // Weighted round robin among VLs; within a VL, inputs in arrival
        // order: the first entry that may go of the VL nearest in turn.
        let turn = u32::from(o.vl_turn);
        let vls32 = u32::from(vls);
        let mut chosen = None;
        let mut best = vls32;
        for (pos, &(inp, v, blocks)) in o.waiting.iter().enumerate() {
            let rank = (u32::from(v) + vls32 - turn) % vls32;
            if rank < best && o.credits[v as usize] >= blocks && !self.ins[inp as usize].busy {
                chosen = Some(pos);
                best = rank;
                if rank == 0 {
                    break;
                }
            }
        }
        let Some(pos) = chosen else {
            let now = self.now;
            self.outs[out as usize].blocked_since.get_or_insert(now);
            self.wait_for_credits(out);
            return;
        };
        let o = &mut self.outs[out as usize];
        let (inp, v, _) = o.waiting.remove(pos).expect("found above");
        if o.waiting.is_empty() {
            o.waiting.clear(); // Back to the buffer's start, as `incoming`.
        }
        next_vl_turn(o, v, &self.params.vl_weights, vls);
        o.fed_by = inp;
        let port = &mut self.ins[inp as usize];
        let q = &mut port.queues[v as usize];
        let pkt = q.pop_front().expect("a head packet");
        if q.is_empty() {
            q.clear(); // Back to the buffer's start, as `incoming`.
        }
        port.busy = true;
        port.reading_vl = v;
        port.requested &= !(1 << v);
        let p = self.packets[pkt as usize];
        let upstream = port.upstream;
        // The input is busy until the packet has crossed (`input_free` at
        // this output's `OutFree`): the next head asks for its output then.
        let start = self.now;
        let end = self.transmit(out, pkt);
        let mut left = end;
        if self.mixed_rates && self.outs[upstream as usize].rate != self.outs[out as usize].rate {
            // Links of different rates: the input reads the packet out at
            // its own link's rate (into the output's staging), so it is
            // free when that is done, not when the output is.
            left = start + self.tx(upstream, p.wire);
            self.outs[out as usize].fed_by = u32::MAX;
            self.at(left, Ev::InFree { inp });
        }
        // The buffer space is free as the packet leaves: tell the sender.
        self.return_credits(upstream, p, start, left);
    }

    /// Ethernet: a packet's head is in the switch (a switch latency ago):
    /// it joins its output's queue, or is dropped if that is full (lossy);
    /// its input sends PAUSE upstream if it now holds too much (lossless).
    fn eth_arrive(&mut self, inp: u32, pkt: u32) {
        let p = self.packets[pkt as usize];
        let out = self.route(self.ins[inp as usize].switch, p.dst);
        let eth = &self.params.eth;
        let o = &mut self.outs[out as usize];
        if !eth.lossless && o.egress_bytes + u64::from(p.wire) > u64::from(eth.buffer_bytes) {
            o.drops += 1;
            o.dropped_bytes += u64::from(p.wire);
            self.eth_counters.drops += 1;
            self.free_packets.push(pkt);
            self.release_msg(p.msg);
            return;
        }
        o.egress[p.vl as usize].push_back(pkt);
        o.egress_bytes += u64::from(p.wire);
        self.packets[pkt as usize].inp = inp;
        if eth.lossless {
            let port = &mut self.ins[inp as usize];
            port.held[p.vl as usize] += p.wire;
            if port.held[p.vl as usize] > port.xoff && port.pausing & (1 << p.vl) == 0 {
                port.pausing |= 1 << p.vl;
                let upstream = port.upstream;
                self.eth_counters.pause_frames += 1;
                let t = self.now + self.params.link_latency_ps;
                self.at(
                    t,
                    Ev::Pause {
                        out: upstream,
                        vl: p.vl,
                        on: true,
                    },
                );
            }
        }
        self.eth_forward(out);
    }

    /// Ethernet: the packet from input `inp` has left output `out`: its
    /// buffer is free, and its input may send RESUME.
    fn eth_left(&mut self, out: u32, inp: u32) {
        if inp == u32::MAX {
            return;
        }
        let o = &mut self.outs[out as usize];
        let (vl, wire) = (o.fed_vl, o.fed_wire);
        o.egress_bytes -= u64::from(wire);
        if !self.params.eth.lossless {
            return;
        }
        let port = &mut self.ins[inp as usize];
        port.held[vl as usize] -= wire;
        if port.pausing & (1 << vl) != 0 && port.held[vl as usize] <= port.xon {
            port.pausing &= !(1 << vl);
            let upstream = port.upstream;
            let t = self.now + self.params.link_latency_ps;
            self.at(
                t,
                Ev::Pause {
                    out: upstream,
                    vl,
                    on: false,
                },
            );
        }
    }

    /// Ethernet: output `out` sends the next packet of its queues, by
    /// weighted round robin among the priorities not paused.
    fn eth_forward(&mut self, out: u32) {
        let vls = self.params.vls;
        let o = &mut self.outs[out as usize];
        if o.busy {
            return;
        }
        let mut vl = o.vl_turn;
        let mut chosen = None;
        let mut waiting = false;
        for _ in 0..vls {
            if !o.egress[vl as usize].is_empty() {
                if o.paused & (1 << vl) == 0 {
                    chosen = Some(vl);
                    break;
                }
                waiting = true;
            }
            vl = (vl + 1) % vls;
        }
        let Some(v) = chosen else {
            if waiting {
                o.blocked_since.get_or_insert(self.now);
            }
            return;
        };
        next_vl_turn(o, v, &self.params.vl_weights, vls);
        let pkt = o.egress[v as usize].pop_front().expect("not empty");
        let p = self.packets[pkt as usize];
        o.fed_by = p.inp;
        o.fed_vl = v;
        o.fed_wire = p.wire;
        self.transmit(out, pkt);
    }

    /// Per output port: its name, rate, bytes sent, PortXmitWait, drops.
    pub fn link_report(&self) -> Vec<PortReport> {
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
            out.push(PortReport {
                name,
                gbps: self.rates[o.rate as usize],
                bytes: o.bytes,
                xmit_wait_ps: o.xmit_wait_ps,
                drops: o.drops,
                dropped_bytes: o.dropped_bytes,
            });
        }
        out
    }
}

/// The VL arbiter's weighted round robin after a packet of VL `v`.
fn next_vl_turn(o: &mut OutPort, v: u8, weights: &[u32], vls: u8) {
    if v != o.vl_turn {
        o.vl_turn = v;
        o.vl_left = weights.get(v as usize).copied().unwrap_or(1);
    }
    o.vl_left = o.vl_left.saturating_sub(1);
    if o.vl_left == 0 {
        o.vl_turn = (v + 1) % vls;
        o.vl_left = weights.get(o.vl_turn as usize).copied().unwrap_or(1);
    }
}

/// PFC thresholds of an Ethernet input port on a link of `gbps`: XOFF
/// leaves room in the buffer for what still comes once PAUSE is decided
/// (the switch latency, the PAUSE's way up and the data's way down, a
/// frame the sender has begun and one on the wire), XON two frames below.
pub fn pfc_thresholds(params: &Params, gbps: f64) -> (u32, u32) {
    let eth = &params.eth;
    let frame = eth.mtu + eth.header_bytes + RETH;
    let bytes_per_ps = gbps / 8.0 / 1000.0;
    let flight = (2 * params.link_latency_ps + eth.switch_latency_ps) as f64 * bytes_per_ps;
    let headroom = flight.ceil() as u32 + 2 * frame;
    let xoff = eth.buffer_bytes.saturating_sub(headroom).max(frame);
    (xoff, xoff.saturating_sub(2 * frame))
}

impl OutPort {
    /// Credits of `vl` (`blocks`) on their way, arriving at `t`: kept in
    /// time order (they come almost always in it, so at the back).
    fn credit_back(&mut self, t: Ps, vl: u8, blocks: u32) {
        self.next_credit = self.next_credit.min(t);
        if self.last_credit <= t {
            self.last_credit = t;
            self.incoming.push_back((t, vl, blocks));
        } else {
            let at = self.incoming.partition_point(|c| c.0 <= t);
            self.incoming.insert(at, (t, vl, blocks));
        }
    }

    fn new(to: Target, vls: usize, blocks: u32, rate: u8) -> OutPort {
        assert!(vls <= MAX_VLS, "at most {MAX_VLS} virtual lanes");
        let mut credits = [0; MAX_VLS];
        credits[..vls].fill(blocks);
        OutPort {
            next_credit: Ps::MAX,
            last_credit: 0,
            _pad: [0; 5],
            to,
            rate,
            tx_base: 0,
            head_delay: 0,
            credit_based: true,
            eth_switch: false,
            credits,
            busy: false,
            pace_until: 0,
            waiting: VecDeque::new(),
            egress: Vec::new(),
            egress_bytes: 0,
            paused: 0,
            vl_turn: 0,
            vl_left: 1,
            bytes: 0,
            xmit_wait_ps: 0,
            blocked_since: None,
            incoming: VecDeque::new(),
            credit_wake: None,
            fed_by: u32::MAX,
            fed_vl: 0,
            fed_wire: 0,
            drops: 0,
            dropped_bytes: 0,
        }
    }
}

impl InPort {
    fn new(switch: u32, vls: usize, upstream: u32, eth: bool) -> InPort {
        assert!(vls <= MAX_VLS, "at most {MAX_VLS} virtual lanes");
        InPort {
            switch,
            upstream,
            requested: 0,
            busy: false,
            reading_vl: 0,
            eth,
            head_port: [u16::MAX; MAX_VLS],
            pausing: 0,
            xoff: u32::MAX,
            xon: u32::MAX,
            _pad: 0,
            queues: Default::default(),
            held: vec![0; if eth { vls } else { 0 }],
        }
    }
}

/// Per (source, destination) host: the path's rate where it is below the
/// source's own link rate, else 0; empty if there is none (or the fabric
/// is too large for a table of every pair: no pacing then).
fn slower_paths(fabric: &SimFabric, default: f64) -> Vec<f32> {
    const MAX_HOSTS: usize = 4096;
    let n = fabric.hosts();
    if n > MAX_HOSTS {
        return Vec::new();
    }
    let mut table = vec![0f32; n * n];
    let mut any = false;
    for src in 0..n {
        let own = fabric.host_link_gbps(src, default);
        for dst in (0..n).filter(|&d| d != src) {
            if let Some(r) = fabric.path_gbps(src, dst, default).filter(|&r| r < own) {
                table[src * n + dst] = r as f32;
                any = true;
            }
        }
    }
    if any {
        table
    } else {
        Vec::new()
    }
}
