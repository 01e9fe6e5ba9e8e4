//! Traffic injectors: the synthetic patterns of the reference study and
//! the event builder itself.
//!
//! `eb` runs one `evb_core::Node` per host (the EM in host 0), the very
//! state machines `evb run` drives over TCP, here driven by simulated time:
//! control messages and fragments become messages on the fabric. With
//! `output.consumers`, every built batch travels from its BU to a Filter
//! Unit as a message of the batch's size: over the output network (the
//! BUs' second NICs and the consumers, hosts after the event-building
//! fabric's, `sim.output.network = "ethernet"`), or over the event-building
//! fabric itself, the Filter Units its last hosts (`"fabric"`).

use evb_core::bu::Admit;
use evb_core::liveness::Timers;
use evb_core::source::SourceModel;
use evb_core::wire::{Message, FLAG_BATCH, FRAGMENT_HEADER_LEN, FRAME_HEADER_LEN};
use evb_core::{Action, Config, FragmentHeader, Layout, Node, Outcome};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::engine::{Msg, Net, Ps, Traffic, PS_PER_NS};

/// Bytes of a control message on the wire (frame + body, padded).
const CONTROL_BYTES: u64 = 64;

/// Linear shifter: host i sends `bytes` to (i + s) mod N, then moves to
/// the next step when the message has left.
pub struct ShiftFixed {
    pub bytes: u64,
    step: Vec<u32>,
}

impl ShiftFixed {
    pub fn new(bytes: u64) -> ShiftFixed {
        ShiftFixed {
            bytes,
            step: Vec::new(),
        }
    }

    fn post_next(&mut self, net: &mut Net, host: u32) {
        let n = net.host_count();
        let s = self.step[host as usize];
        self.step[host as usize] = s % (n - 1) + 1;
        net.post(host, (host + s) % n, self.bytes, 0, 0, None);
    }
}

impl Traffic for ShiftFixed {
    fn start(&mut self, net: &mut Net) {
        self.step = vec![1; net.host_count() as usize];
        if net.host_count() < 2 {
            return;
        }
        for h in 0..net.host_count() {
            self.post_next(net, h);
        }
    }
    fn delivered(&mut self, _: &mut Net, _: &Msg) {}
    fn send_done(&mut self, net: &mut Net, msg: &Msg) {
        self.post_next(net, msg.src);
    }
}

/// Linear shifter on a time window: in window k host i sends to
/// (i + 1 + k mod (N-1)) mod N, and nobody sends in the last `grace` of a
/// window.
pub struct ShiftWindow {
    pub window: Ps,
    pub grace: Ps,
}

impl Traffic for ShiftWindow {
    fn start(&mut self, net: &mut Net) {
        net.set_timer(0, 0, 0);
    }
    fn delivered(&mut self, _: &mut Net, _: &Msg) {}
    fn send_done(&mut self, _: &mut Net, _: &Msg) {}
    fn timer(&mut self, net: &mut Net, _host: u32, k: u64) {
        let n = net.host_count();
        if n < 2 {
            return;
        }
        let start = k * self.window;
        let until = start + self.window - self.grace;
        // More than the window can carry; the rest is cut at `until`.
        let bytes = (net.params.link_gbps * (self.window as f64) / 8.0 / 1000.0) as u64 + 1;
        let shift = 1 + (k % u64::from(n - 1)) as u32;
        for h in 0..n {
            net.post(h, (h + shift) % n, bytes, 0, k, Some(until));
        }
        net.set_timer(0, start + self.window, k + 1);
    }
}

/// Random destination per message of one MTU, at an offered load.
pub struct Uniform {
    pub load: f64,
    rng: Pcg64Mcg,
    gap: Ps,
}

impl Uniform {
    pub fn new(load: f64, seed: u64) -> Uniform {
        Uniform {
            load,
            rng: Pcg64Mcg::seed_from_u64(seed),
            gap: 0,
        }
    }
}

impl Traffic for Uniform {
    fn start(&mut self, net: &mut Net) {
        let mtu = net.params.mtu;
        self.gap = (net.params.tx_ps(mtu) as f64 / self.load) as Ps;
        for h in 0..net.host_count() {
            let jitter = self.rng.gen_range(0..self.gap.max(1));
            net.set_timer(h, jitter, 0);
        }
    }
    fn delivered(&mut self, _: &mut Net, _: &Msg) {}
    fn send_done(&mut self, _: &mut Net, _: &Msg) {}
    fn timer(&mut self, net: &mut Net, host: u32, _: u64) {
        let n = net.host_count();
        if n < 2 {
            return;
        }
        let mut dst = self.rng.gen_range(0..n - 1);
        if dst >= host {
            dst += 1;
        }
        let mtu = u64::from(net.params.mtu);
        net.post(host, dst, mtu, 0, 0, None);
        let t = net.now() + self.gap;
        net.set_timer(host, t, 0);
    }
}

/// Continuous streams: each host to fixed partners, `depth` messages in
/// flight per partner (permutation, incast, all-to-all).
pub struct Streams {
    pub bytes: u64,
    pub depth: u32,
    partners: Vec<Vec<u32>>,
}

impl Streams {
    /// A random derangement: every host sends to one other and receives from one.
    pub fn permutation(n: u32, bytes: u64, seed: u64) -> Streams {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let mut perm: Vec<u32> = (0..n).collect();
        if n > 1 {
            loop {
                perm.shuffle(&mut rng);
                if perm.iter().enumerate().all(|(i, &p)| i as u32 != p) {
                    break;
                }
            }
        }
        Streams {
            bytes,
            depth: 2,
            partners: perm
                .into_iter()
                .map(|p| if n > 1 { vec![p] } else { vec![] })
                .collect(),
        }
    }

    /// Every host but 0 sends to host 0.
    pub fn incast(n: u32, bytes: u64) -> Streams {
        Streams {
            bytes,
            depth: 2,
            partners: (0..n)
                .map(|h| if h == 0 { vec![] } else { vec![0] })
                .collect(),
        }
    }

    /// Every host sends to every other at once.
    pub fn all_to_all(n: u32, bytes: u64) -> Streams {
        Streams {
            bytes,
            depth: 1,
            partners: (0..n)
                .map(|h| (0..n).filter(|&d| d != h).collect())
                .collect(),
        }
    }
}

impl Traffic for Streams {
    fn start(&mut self, net: &mut Net) {
        for h in 0..net.host_count() {
            for &d in &self.partners[h as usize] {
                for _ in 0..self.depth {
                    net.post(h, d, self.bytes, 0, 0, None);
                }
            }
        }
    }
    fn delivered(&mut self, _: &mut Net, _: &Msg) {}
    fn send_done(&mut self, net: &mut Net, msg: &Msg) {
        net.post(msg.src, msg.dst, self.bytes, 0, 0, None);
    }
}

/// What a message of the `eb` traffic carries.
#[derive(Debug, Clone)]
enum Carried {
    /// Control messages for one destination, sent together.
    Control(Vec<Message>),
    Fragment(FragmentHeader),
}

/// The output stage over one time-series interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ConsumerSample {
    pub t_us: f64,
    /// Batch bytes the BUs delivered, Gb/s.
    pub producer_gbps: f64,
    /// Batch bytes the consumers finished, Gb/s.
    pub consumer_gbps: f64,
    /// Mean number of consumers busy.
    pub busy_consumers: f64,
}

/// The event builder: `evb_core` nodes on every host.
pub struct EventBuilder {
    pub nodes: Vec<Node>,
    sources: Vec<Option<SourceModel>>,
    scratch: Vec<u32>,
    carried: Vec<Carried>,
    /// Events still to come per slot of `carried` (delivery, send completion).
    refs: Vec<u8>,
    free: Vec<usize>,
    /// Per host: the time its next timer event is already set for.
    timer_at: Vec<Option<Ps>>,
    /// Control messages of the current step, by destination.
    outbox: std::collections::BTreeMap<u16, Vec<Message>>,
    /// `sim.host.producer_copy_gbps` as ps per byte (0: zero copy): a
    /// producer's (BU's) thread that serves the output network copies each
    /// batch once before its NIC may send it, one batch after the other.
    producer_ps_per_byte: f64,
    /// Per endpoint: when its producer thread is free, and the deliveries
    /// it has prepared or is preparing (ready at, src host, dst host,
    /// bytes, tag), in order.
    producer_free: Vec<Ps>,
    prepared: Vec<std::collections::VecDeque<Prepared>>,
    pub built_bytes: u64,
    pub events_built: u64,
    pub batches_incomplete: u64,
    /// When the first batch was built, ns (none built: `None`).
    pub first_built_ns: Option<u64>,
    /// Batch payload bytes handed to consumers.
    pub delivered_bytes: u64,
    /// With consumers: one entry per time-series interval.
    pub consumer_series: Vec<ConsumerSample>,
    /// Delivered bytes, consumed bytes, busy ns at the last sample.
    last_output: (u64, u64, u64),
    /// Built payload, Gb/s, per time-series interval: payload of batches
    /// counted as their fragments reach the BU (through the network or
    /// handed over in memory), a batch that ends unbuilt taken back out
    /// when it ends. Completed batches come in bursts (a slotted barrel
    /// finishes every BU's batch in the same slot), so counting them only
    /// at completion makes a series that steps once a rotation.
    pub built_series: Vec<f64>,
    /// Of that, what crossed the network, Gb/s per interval.
    pub network_series: Vec<f64>,
    /// Bytes of the current interval: built (may go below zero when a
    /// batch is taken back out) and through the network.
    interval_built: u64,
    interval_network: u64,
    /// `sim.crash`: the node that dies, when, and when a survivor first
    /// found it silent (ps; `None`: not within the run).
    pub crash: Option<(u16, Ps, Option<Ps>)>,
    /// Per node: it has died (takes no input, does nothing more).
    dead: Vec<bool>,
    layout: Layout,
    run_id: u32,
    /// Host of each endpoint on the output network (BUs' second NICs and
    /// the FUs; `u32::MAX` otherwise); empty when FUs share the fabric.
    out_host: Vec<u32>,
    /// Endpoint of each host.
    endpoint_of_host: Vec<u16>,
    /// Each endpoint's clock (`sim.host.clock_ppm`, `clock_offset_us`).
    clocks: Vec<HostClock>,
}

/// A host's clock against the simulator's time: what its node reads as
/// "now", and when in simulated time its node's deadlines fall.
#[derive(Debug, Clone, Copy, PartialEq)]
enum HostClock {
    /// The simulator's time, to the nanosecond.
    Ideal,
    /// `rate` times the simulator's time, `offset_ns` ahead.
    Off { rate: f64, offset_ns: f64 },
}

impl HostClock {
    /// Every endpoint's clock, drawn from `run.seed` (ideal when the
    /// configuration perturbs none).
    fn draw(config: &Config, endpoints: usize) -> Vec<HostClock> {
        let (ppm, offset_us) = (config.sim.host.clock_ppm, config.sim.host.clock_offset_us);
        if ppm == 0.0 && offset_us == 0.0 {
            return vec![HostClock::Ideal; endpoints];
        }
        use rand::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(config.run.seed ^ 0xc10c_c10c);
        (0..endpoints)
            .map(|_| HostClock::Off {
                rate: 1.0 + ppm * 1e-6 * rng.gen_range(-1.0..=1.0),
                offset_ns: offset_us * 1e3 * rng.gen_range(0.0..=1.0),
            })
            .collect()
    }

    /// The host's time, ns, at simulated time `t`.
    fn local_ns(self, t: Ps) -> u64 {
        match self {
            HostClock::Ideal => t / PS_PER_NS,
            HostClock::Off { rate, offset_ns } => {
                (t as f64 / PS_PER_NS as f64 * rate + offset_ns).floor() as u64
            }
        }
    }

    /// The simulated time at which the host's clock reads `local_ns` or
    /// later (a nanosecond over, so that the node finds its deadline due).
    fn sim_ps(self, local_ns: u64) -> Ps {
        match self {
            HostClock::Ideal => local_ns * PS_PER_NS,
            HostClock::Off { rate, offset_ns } => {
                let ns = (local_ns as f64 - offset_ns) / rate;
                ((ns * PS_PER_NS as f64).ceil().max(0.0) as Ps).saturating_add(PS_PER_NS)
            }
        }
    }
}

/// A delivery a producer's thread is preparing: when it is ready, from
/// and to which hosts, its bytes, its tag.
#[derive(Debug, Clone, Copy)]
struct Prepared {
    ready: Ps,
    src: u32,
    dst: u32,
    bytes: u64,
    tag: u64,
}

/// Timer tokens: the node's own deadline, its death.
const TIMER_DEADLINE: u64 = 0;
const TIMER_CRASH: u64 = 1;
/// A producer thread has prepared a delivery.
const TIMER_PREPARED: u64 = 2;

impl EventBuilder {
    pub fn new(config: &Config, hosts: usize) -> Result<EventBuilder, String> {
        let layout = Layout::from_config(config);
        let separate = layout.fus() > 0
            && config.sim.output.network == evb_core::config::OutputNetwork::Ethernet;
        let (mut out_host, mut endpoint_of_host) = (Vec::new(), Vec::new());
        if separate {
            // The fabric's hosts, then the output network's: the BUs'
            // second NICs, then the consumers.
            let core = layout.endpoints as usize - layout.fus();
            let want = core + layout.bus() + layout.fus();
            if hosts != want {
                return Err(format!(
                    "the event builder has {core} endpoints on the fabric (nodes.count = {}{}) and {} producers and {} consumers on the output network, {want} hosts in all, but the fabric has {hosts}",
                    config.nodes.count,
                    if layout.em >= layout.nodes { ", plus a separate EM" } else { "" },
                    layout.bus(),
                    layout.fus()
                ));
            }
            out_host = vec![u32::MAX; layout.endpoints as usize];
            endpoint_of_host = (0..core as u16).collect();
            for (b, &node) in layout.bu_nodes.iter().enumerate() {
                out_host[node as usize] = (core + b) as u32;
                endpoint_of_host.push(node);
            }
            for (k, &fu) in layout.fu_nodes.iter().enumerate() {
                out_host[fu as usize] = (core + layout.bus() + k) as u32;
                endpoint_of_host.push(fu);
            }
        } else if layout.endpoints as usize > hosts {
            return Err(format!(
                "the event builder has {} endpoints (nodes.count = {}{}) but the fabric has {hosts} hosts{}",
                layout.endpoints,
                config.nodes.count,
                if layout.em >= layout.nodes { ", plus a separate EM" } else { "" },
                if layout.fus() > 0 { format!(", plus {} consumers", layout.fus()) } else { String::new() }
            ));
        }
        let layout_endpoints = layout.endpoints as usize;
        let crash = config
            .sim
            .crash
            .map(|fault| (fault.node, fault.at.saturating_mul(PS_PER_NS), None));
        // A death is found as `evb run` finds a stopped node: by its
        // silence, on the simulator's time scale. Without one, no
        // heartbeats: they would only add control messages to every figure.
        let timers = Timers {
            heartbeat: if crash.is_some() {
                (config.sim.heartbeat_us * 1e3) as u64
            } else {
                0
            },
            peer_timeout: (config.sim.peer_timeout_us * 1e3) as u64,
            ..Timers::from_config(config)
        };
        let nodes = (0..layout.endpoints)
            .map(|i| {
                let mut node = Node::new(config, &layout, i);
                node.set_timers(timers);
                node
            })
            .collect();
        let sources = (0..layout.endpoints as usize)
            .map(|i| layout.ru_of[i].map(|s| SourceModel::new(config, s)))
            .collect();
        Ok(EventBuilder {
            nodes,
            sources,
            scratch: Vec::new(),
            carried: Vec::new(),
            refs: Vec::new(),
            free: Vec::new(),
            timer_at: vec![None; layout.endpoints as usize],
            outbox: std::collections::BTreeMap::new(),
            producer_ps_per_byte: match config.sim.host.producer_copy_gbps {
                g if g > 0.0 => 8000.0 / g,
                _ => 0.0,
            },
            producer_free: vec![0; layout.endpoints as usize],
            prepared: vec![std::collections::VecDeque::new(); layout.endpoints as usize],
            built_bytes: 0,
            events_built: 0,
            batches_incomplete: 0,
            first_built_ns: None,
            delivered_bytes: 0,
            consumer_series: Vec::new(),
            last_output: (0, 0, 0),
            built_series: Vec::new(),
            network_series: Vec::new(),
            interval_built: 0,
            interval_network: 0,
            crash,
            dead: vec![false; layout.endpoints as usize],
            layout,
            run_id: config.run.run_id,
            out_host,
            endpoint_of_host,
            clocks: HostClock::draw(config, layout_endpoints),
        })
    }

    /// The hosts a message from endpoint `from` to endpoint `to` travels
    /// between: on the output network if one of them is a consumer and the
    /// output network is separate, else on the fabric.
    fn hosts_for(&self, from: u16, to: u16) -> (u32, u32) {
        if !self.out_host.is_empty()
            && (self.layout.fu_of[from as usize].is_some()
                || self.layout.fu_of[to as usize].is_some())
        {
            (self.out_host[from as usize], self.out_host[to as usize])
        } else {
            (u32::from(from), u32::from(to))
        }
    }

    /// The endpoint on host `h`.
    fn endpoint(&self, h: u32) -> u16 {
        match self.endpoint_of_host.get(h as usize) {
            Some(&e) => e,
            None => h as u16,
        }
    }

    /// The hosts of the output network that are producers (the BUs'
    /// second NICs) and consumers; `None` when FUs share the fabric.
    pub fn output_hosts(&self) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        if self.out_host.is_empty() {
            return None;
        }
        let core = self.layout.endpoints as usize - self.layout.fus();
        let p = core + self.layout.bus();
        Some((core..p, p..p + self.layout.fus()))
    }

    /// How far endpoint `h`'s estimate of its offset to the EM's clock is
    /// off at simulated time `at`, ns (`None`: it measures none).
    pub fn clock_error_ns(&self, h: usize, at: Ps) -> Option<u64> {
        let clock = self.nodes[h].clock()?;
        let local = self.clocks[h].local_ns(at);
        let em = self.clocks[usize::from(self.layout.em)].local_ns(at);
        let truth = i128::from(em) - i128::from(local);
        let est = clock.offset_at(local);
        Some((i128::from(est) - truth).unsigned_abs() as u64)
    }

    /// Bytes consumed so far by all consumers, and their busy time up to
    /// simulated time `now` (each by its host's clock).
    pub fn consumers_now(&self, now: Ps) -> (u64, u64) {
        self.nodes
            .iter()
            .zip(&self.clocks)
            .filter_map(|(n, c)| n.fu().map(|fu| (fu, c.local_ns(now))))
            .fold((0, 0), |(bytes, busy), (fu, local)| {
                (bytes + fu.stats.bytes_consumed, busy + fu.busy_time(local))
            })
    }

    fn carry(&mut self, c: Carried) -> u64 {
        match self.free.pop() {
            Some(i) => {
                self.carried[i] = c;
                self.refs[i] = 2;
                i as u64
            }
            None => {
                self.carried.push(c);
                self.refs.push(2);
                (self.carried.len() - 1) as u64
            }
        }
    }

    fn release(&mut self, slot: usize) {
        self.refs[slot] -= 1;
        if self.refs[slot] == 0 {
            self.free.push(slot);
        }
    }

    /// Now, by the clock of endpoint `h`'s host.
    fn now_ns(&self, net: &Net, h: usize) -> u64 {
        self.clocks[h].local_ns(net.now())
    }

    /// Endpoint `host`'s producer sends a batch of `bytes` (`tag`) from
    /// host `src` to `dst`: at once, or when its thread has copied it
    /// (one batch after the other).
    fn deliver(&mut self, net: &mut Net, host: u32, src: u32, dst: u32, bytes: u64, tag: u64) {
        if self.producer_ps_per_byte == 0.0 {
            net.post(src, dst, bytes, 0, tag, None);
            return;
        }
        let h = host as usize;
        let copy = (bytes as f64 * self.producer_ps_per_byte).round() as Ps;
        let ready = net.now().max(self.producer_free[h]) + copy;
        self.producer_free[h] = ready;
        self.prepared[h].push_back(Prepared {
            ready,
            src,
            dst,
            bytes,
            tag,
        });
        net.set_timer(host, ready, TIMER_PREPARED);
    }

    /// Carries out what the node on endpoint `host` asked for.
    fn drain(&mut self, net: &mut Net, host: u32) {
        let h = host as usize;
        if self.dead[h] {
            return;
        }
        while let Some(action) = self.nodes[h].poll_action() {
            let now = self.now_ns(net, h);
            match action {
                Action::Send { to, msg } => self.outbox.entry(to).or_default().push(msg),
                Action::Produce { mep } => {
                    let source = self.sources[h].as_ref().expect("an RU produces");
                    let header = source.describe_length(mep, &mut self.scratch);
                    self.nodes[h].on_mep_ready(now, header);
                }
                Action::SendFragment { to, header } => {
                    let tag = self.carry(Carried::Fragment(header));
                    let bytes = u64::from(header.payload_len)
                        + (FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN) as u64;
                    let (src, dst) = self.hosts_for(host as u16, to);
                    net.post(src, dst, bytes, 0, tag, None);
                }
                Action::HandOver { header } => {
                    self.nodes[h].on_local_fragment(now, &header, header.crc32c)
                }
                Action::Finish {
                    outcome,
                    bytes,
                    events,
                    ..
                } => match outcome {
                    // Built counts completed batches only, when they complete.
                    Outcome::Built => {
                        self.built_bytes += bytes;
                        self.events_built += events;
                        self.interval_built += bytes;
                        self.first_built_ns.get_or_insert(net.now() / PS_PER_NS);
                    }
                    _ => self.batches_incomplete += 1,
                },
                Action::Deliver {
                    to,
                    mep,
                    events,
                    bytes,
                    partial,
                } => {
                    let payload = evb_core::wire::batch_payload_len(self.layout.rus(), bytes);
                    let header = FragmentHeader {
                        run_id: self.run_id,
                        source: self.layout.bu_of[h].expect("a BU delivers"),
                        flags: FLAG_BATCH
                            | if partial {
                                evb_core::wire::FLAG_PARTIAL
                            } else {
                                0
                            },
                        mep,
                        event_count: events as u32,
                        payload_len: payload as u32,
                        crc32c: 0,
                    };
                    self.delivered_bytes += payload;
                    let tag = self.carry(Carried::Fragment(header));
                    let wire = payload + (FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN) as u64;
                    let (src, dst) = self.hosts_for(host as u16, to);
                    self.deliver(net, host, src, dst, wire, tag);
                }
                Action::Consumed { .. } | Action::Confirmed { .. } => {}
                Action::Release { .. } | Action::Done | Action::DrainTimedOut { .. } => {}
                Action::DropPeer { peer, .. } => {
                    // The first survivor to find the dead node silent.
                    if let Some((dead, _, found @ None)) = &mut self.crash {
                        if *dead == peer {
                            *found = Some(net.now());
                        }
                    }
                }
            }
        }
        // Control messages of one step to one destination travel together,
        // as the TCP runtime writes them in one go; on their own VL.
        for (to, msgs) in std::mem::take(&mut self.outbox) {
            let bytes = CONTROL_BYTES * msgs.len() as u64;
            let tag = self.carry(Carried::Control(msgs));
            let (src, dst) = self.hosts_for(host as u16, to);
            net.post(src, dst, bytes, 1, tag, None);
        }
        if let Some(d) = self.nodes[h].next_deadline() {
            let t = self.clocks[h].sim_ps(d);
            if self.timer_at[h].is_none_or(|armed| t < armed) {
                self.timer_at[h] = Some(t);
                net.set_timer(host, t, TIMER_DEADLINE);
            }
        }
    }
}

impl Traffic for EventBuilder {
    fn start(&mut self, net: &mut Net) {
        for h in 0..self.nodes.len() {
            self.nodes[h].start(self.clocks[h].local_ns(0));
            self.drain(net, h as u32);
        }
        if let Some((node, at, _)) = self.crash {
            net.set_timer(u32::from(node), at, TIMER_CRASH);
        }
    }

    fn delivered(&mut self, net: &mut Net, msg: &Msg) {
        let c = self.carried[msg.tag as usize].clone();
        self.release(msg.tag as usize);
        let (to, from) = (self.endpoint(msg.dst) as usize, self.endpoint(msg.src));
        if self.dead[to] {
            return; // The dead take no input.
        }
        let now = self.now_ns(net, to);
        match c {
            Carried::Control(msgs) => {
                for m in msgs {
                    self.nodes[to].on_message(now, from, m);
                }
            }
            Carried::Fragment(h) => {
                // No bytes are simulated: the CRC is taken as correct.
                if self.nodes[to].admit_fragment(now, from, &h) == Admit::Keep {
                    // A fragment the NIC looped back never crossed the network.
                    if h.flags & FLAG_BATCH == 0 && msg.src != msg.dst {
                        self.interval_network += u64::from(h.payload_len);
                    }
                    self.nodes[to].on_fragment(now, &h, h.crc32c);
                }
            }
        }
        self.drain(net, to as u32);
    }

    fn send_done(&mut self, net: &mut Net, msg: &Msg) {
        let fragment = match &self.carried[msg.tag as usize] {
            // A delivered batch's buffers were freed at its Finish.
            Carried::Fragment(h) if h.flags & FLAG_BATCH == 0 => Some(*h),
            Carried::Fragment(_) | Carried::Control(_) => None,
        };
        self.release(msg.tag as usize);
        let src = self.endpoint(msg.src);
        if self.dead[src as usize] {
            return;
        }
        if let Some(h) = fragment {
            let now = self.now_ns(net, src as usize);
            self.nodes[src as usize].on_send_complete(now, h.mep);
            self.drain(net, u32::from(src));
        }
    }

    fn sample(&mut self, now: Ps, interval: Ps) {
        let secs = interval as f64 * 1e-12;
        self.built_series
            .push(std::mem::take(&mut self.interval_built) as f64 * 8.0 / secs / 1e9);
        self.network_series
            .push(std::mem::take(&mut self.interval_network) as f64 * 8.0 / secs / 1e9);
        if self.layout.fus() == 0 {
            return;
        }
        let (consumed, busy) = self.consumers_now(now);
        let (d0, c0, b0) = self.last_output;
        let secs = interval as f64 * 1e-12;
        let gbps = |bytes: u64| bytes as f64 * 8.0 / secs / 1e9;
        self.consumer_series.push(ConsumerSample {
            t_us: now as f64 * 1e-6,
            producer_gbps: gbps(self.delivered_bytes - d0),
            consumer_gbps: gbps(consumed - c0),
            busy_consumers: (busy - b0) as f64 / (interval / PS_PER_NS).max(1) as f64,
        });
        self.last_output = (self.delivered_bytes, consumed, busy);
    }

    fn timer(&mut self, net: &mut Net, host: u32, token: u64) {
        let h = host as usize;
        match token {
            TIMER_CRASH => {
                // It stops: no input, no output, no timers; its
                // connections stay open, so the survivors find it only by
                // its silence (the core's peer timeout).
                self.dead[h] = true;
                return;
            }
            _ if self.dead[h] => return,
            TIMER_PREPARED => {
                let now = net.now();
                while let Some(&p) = self.prepared[h].front() {
                    if p.ready > now {
                        break;
                    }
                    self.prepared[h].pop_front();
                    net.post(p.src, p.dst, p.bytes, 0, p.tag, None);
                }
                return;
            }
            _ => {}
        }
        self.timer_at[h] = None;
        let now = self.now_ns(net, h);
        if self.nodes[h].next_deadline().is_some_and(|d| d <= now) {
            self.nodes[h].on_timeout(now);
        }
        self.drain(net, host);
    }
}
