//! `evb-sim`: a discrete-event, credit-based, InfiniBand-like fabric
//! simulator that runs the real event builder.
//!
//! - [`fabric`]: the switches, ports, cables and forwarding tables simulated;
//! - [`engine`]: the link-layer model (credits per VL in 64-byte blocks,
//!   virtual cut-through, switch arbitration, host queue pairs);
//! - [`traffic`]: synthetic patterns and `eb`, which drives the same
//!   `evb_core::Node` state machines that `evb run` drives over TCP;
//! - [`setup`]: the fabric from its description and the configuration
//!   sized for it; [`output`]: the text, CSV and plots of `evb sim` and
//!   `evb scan`, and a run's port counters; [`predict`]: the rate of a
//!   fabric `evb fabric diagnose` proposes.
//!
//! Deterministic: the same configuration and seed give the same result.

pub mod engine;
pub mod fabric;
pub mod output;
pub mod predict;
pub mod queue;
pub mod scan;
pub mod schedule;
pub mod setup;
pub mod stats;
pub mod traffic;

use std::time::Instant;

use evb_core::config::{FlowControl, Granularity, LocalTraffic, OutputNetwork, SimTraffic};
use evb_core::{Config, Layout};
use serde::{Deserialize, Serialize};

use engine::{default_host_latency, Net, Params, Ps, Traffic, PS_PER_NS};
use fabric::SimFabric;

/// The `summary` object of the simulation JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimSummary {
    pub topology: String,
    pub traffic: String,
    /// How the run was set up where the user did not say (the node count
    /// taken from the fabric, hosts left idle), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Hosts of the event-building fabric (the output network's are in
    /// `hosts[]` after them, and summarised in `consumers`).
    pub hosts: usize,
    /// Mean payload received per host of the fabric over the whole run
    /// (warm-up included), all messages (control too), Gb/s.
    pub throughput_per_host_gbps: f64,
    /// The hosts' links' data rate (after encoding), mean over the hosts.
    pub link_rate_gbps: f64,
    /// throughput_per_host_gbps / link_rate_gbps (of the raw data rate).
    pub fraction_of_link: f64,
    /// The payload rate the hosts' links can carry: the data rate less
    /// the headers of MTU-sized packets (`mtu_bytes` of payload and
    /// `packet_header_bytes` more each; a message's first packet carries
    /// a 16-byte RETH besides), Gb/s.
    #[serde(default)]
    pub usable_link_gbps: f64,
    #[serde(default)]
    pub mtu_bytes: u32,
    #[serde(default)]
    pub packet_header_bytes: u32,
    /// throughput_per_host_gbps / usable_link_gbps.
    #[serde(default)]
    pub fraction_of_usable: f64,
    pub min_host_gbps: f64,
    pub max_host_gbps: f64,
    pub simulated_seconds: f64,
    pub wall_seconds: f64,
    pub events_processed: u64,
    /// Simulated microseconds per wall second.
    pub speed_us_per_s: f64,
    pub max_link_utilisation: f64,
    /// Sum over ports of the time spent waiting for credits, seconds.
    pub total_xmit_wait_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eb: Option<EbSummary>,
    /// With `output.consumers`: the distribution to the consumers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumers: Option<OutputSummary>,
}

/// The distribution of built batches to the consumers, in steady state
/// (after the warm-up, batch means with a 95 % interval as for `eb`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputSummary {
    /// `ethernet pfc`, `ethernet lossy` (a network of its own) or `fabric`
    /// (the event-building fabric).
    pub network: String,
    pub producers: usize,
    pub consumers: usize,
    pub producer_link_gbps: f64,
    pub consumer_link_gbps: f64,
    /// The payload rate those links can carry (Ethernet: RoCE v2 packets
    /// of `sim.output.mtu_bytes` and 86 bytes of headers; `fabric`:
    /// InfiniBand's), Gb/s.
    #[serde(default)]
    pub producer_usable_gbps: f64,
    #[serde(default)]
    pub consumer_usable_gbps: f64,
    /// The steady window: after `warmup_us`, `batch_means` batches.
    #[serde(default)]
    pub warmup_us: f64,
    #[serde(default)]
    pub batch_means: usize,
    /// Per producer (BU): batch payload its output NIC sent, Gb/s
    /// (retransmissions included); with `fabric`, batches posted.
    pub producer_gbps_per_producer: f64,
    pub producer_ci95_gbps: f64,
    /// Per consumer: batch payload received in sequence, Gb/s.
    pub consumer_gbps_per_consumer: f64,
    pub consumer_ci95_gbps: f64,
    /// The same two as aggregates over all producers / all consumers.
    pub producer_gbps_total: f64,
    pub consumer_gbps_total: f64,
    /// Per producer and per consumer as a fraction of their links' usable
    /// payload rate.
    #[serde(default)]
    pub producer_fraction_of_usable: f64,
    #[serde(default)]
    pub consumer_fraction_of_usable: f64,
    /// The rest is over the whole run, warm-up included.
    /// Mean over consumers of the fraction of time busy with a batch.
    pub busy_fraction_mean: f64,
    /// Times the EM had a MEP to assign and no BU had credit.
    pub em_credit_stalls: u64,
    /// Output network: PAUSE frames sent (pfc), packets dropped, NAKs and
    /// timeouts, payload sent again (lossy), and the producers' NICs'
    /// share of time with data and paused.
    pub pause_frames: u64,
    pub drops: u64,
    pub naks: u64,
    pub timeouts: u64,
    pub retransmitted_bytes: u64,
    pub producer_paused_fraction: f64,
}

/// Event-builder figures of an `eb` simulation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EbSummary {
    pub events_built: u64,
    pub batches_incomplete: u64,
    /// Whether the figures below are a steady state: a batch was built
    /// before the warm-up ended and at least two batch means (rotations
    /// of a slotted barrel) follow it. When not, the figures are a
    /// start-up transient, `steady_needs_us` says how long to run, and
    /// `evb scan` ranks the point below every steady one.
    #[serde(default = "yes")]
    pub steady: bool,
    /// When the first batch was built, us (none built: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_built_us: Option<f64>,
    /// Not steady: the simulated time a steady state needs, us.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steady_needs_us: Option<f64>,
    /// Payload of built events per BU, Gb/s, in steady state: the mean
    /// over the run after `warmup_us`, by batch means ([`stats`]), of the
    /// batches completed (counted when they complete), the local fragment
    /// included (it never crosses a link).
    pub built_gbps_per_node: f64,
    /// Half width of its 95 % confidence interval, and the batches.
    #[serde(default)]
    pub built_ci95_gbps: f64,
    #[serde(default)]
    pub batch_means: usize,
    /// Start of the run left out, microseconds, and why that long (the
    /// rule of [`warmup`], the rounding to whole rotations and the
    /// rotations the batches leave over), for the user.
    #[serde(default)]
    pub warmup_us: f64,
    #[serde(default)]
    pub warmup_rule: String,
    /// The steady window's length after the warm-up, microseconds, and a
    /// slotted barrel's rotation (the window holds whole ones).
    #[serde(default)]
    pub steady_us: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_us: Option<f64>,
    /// (last quarter - second quarter) / second quarter of the built
    /// series: a steady state has none.
    #[serde(default)]
    pub drift: f64,
    /// The part of `built_gbps_per_node` that crossed the network (all of
    /// it with `event_builder.local = "nic"`), and that as a fraction of
    /// the BUs' links' data rate and of their usable payload rate
    /// (`summary.usable_link_gbps`'s rule): never more than 1.
    #[serde(default)]
    pub network_gbps_per_node: f64,
    #[serde(default)]
    pub network_fraction_of_link: f64,
    #[serde(default)]
    pub network_fraction_of_usable: f64,
    /// Where a node's own fragment goes (`event_builder.local`): `memory`
    /// (handed over) or `nic` (looped back by its NIC); either way it
    /// crosses no link and is in `built_gbps_per_node` only.
    #[serde(default)]
    pub local: String,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub latency_max_us: f64,
    /// Paced readout (`source.mep_rate_hz`): fraction of the simulated time
    /// the readout was throttled, and events vetoed at the source meanwhile.
    #[serde(default)]
    pub throttled_fraction: f64,
    #[serde(default)]
    pub events_vetoed: u64,
    /// `sim.crash`: the built throughput before and after the death.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash: Option<CrashSummary>,
    /// `clock = "em"`: how well the nodes measured the EM's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_clock: Option<SlotClockSummary>,
    /// The slotted barrel: the schedule it ran and how the RUs kept their
    /// slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<schedule::ScheduleSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<SlotKeeping>,
    /// Built payload of all nodes, Gb/s, per `sim.sample_us` interval.
    #[serde(default)]
    pub built_gbps_series: Vec<f64>,
}

fn yes() -> bool {
    true
}

/// Whether an `eb` run's figures are a steady state, and if not, how
/// long a run would need to be: the first batch built within the warm-up
/// and two batch means (rotations) after it. `period_us` is a rotation
/// of a slotted barrel, else the warm-up.
fn steady_state(
    first_built_us: Option<f64>,
    warmup_us: f64,
    batch_means: usize,
    period_us: f64,
    end_us: f64,
) -> (bool, Option<f64>) {
    let steady = first_built_us.is_some_and(|t| t <= warmup_us) && batch_means >= 2;
    if steady {
        return (true, None);
    }
    // The warm-up grows with the run (a fifth of it) up to two rotations:
    // start from whichever is later, the first batch or that warm-up,
    // then three periods more. Nothing built: at least twice this run.
    let from = first_built_us.unwrap_or(2.0 * end_us).max(2.0 * period_us);
    (false, Some(from + 3.0 * period_us))
}

/// How the RUs of a slotted barrel kept their slots, over the whole run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SlotKeeping {
    /// Fragments the RUs sent through the network.
    pub fragments: u64,
    /// Of those, started after their slot's grace (still ending within it).
    pub late_starts: u64,
    /// Slots passed with a fragment waiting that could no longer end
    /// within them: it went at that BU's next turn, a rotation later.
    pub slots_missed: u64,
    /// The EM's changes of the slot length, the length at the end and the
    /// longest, us (`event_builder.adaptive_slots`).
    #[serde(default)]
    pub slot_changes: u64,
    #[serde(default)]
    pub slot_us_end: f64,
    #[serde(default)]
    pub longest_slot_us: f64,
}

/// The slot clock measured over the simulated fabric (`clock = "em"`).
/// Every simulated host reads the same time, so a node's estimate of its
/// offset to the EM is its phase error.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SlotClockSummary {
    /// Nodes that measure (the RUs, the EM's host aside).
    pub nodes: usize,
    /// Largest error of a node's offset estimate at the end (against the
    /// hosts' clocks as simulated, `sim.host.clock_*`): the phase error, ns.
    pub max_phase_error_ns: u64,

    /// Largest half round trip an estimate rests on at the end, ns.
    pub max_uncertainty_ns: u64,
    /// Largest change of one node's estimate from one answer to the next.
    pub max_step_ns: u64,
    /// Probes sent and answered, all nodes.
    pub probes: u64,
    pub replies: u64,
}

/// What a node's death (`sim.crash`) did to the built throughput.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct CrashSummary {
    pub node: u16,
    pub at_us: f64,
    pub detected_us: f64,
    /// Mean built Gb/s (all nodes) from a quarter of the way to the crash
    /// until the crash, and over the last three quarters of the time after
    /// the others learnt of it (the transient left out).
    pub built_gbps_before: f64,
    pub built_gbps_after: f64,
    /// `after / before`, and what losing one of N nodes leaves: (N-1)/N,
    /// or ((N-1)/N)^2 with the slotted barrel (its slots stay).
    pub ratio: f64,
    pub expected_ratio: f64,
}

/// How the slotted RUs kept their slots, summed over the RUs.
fn slot_keeping(config: &Config, e: &traffic::EventBuilder) -> Option<SlotKeeping> {
    if config.event_builder.schedule != evb_core::config::Schedule::Slotted {
        return None;
    }
    let em = e
        .nodes
        .iter()
        .find_map(evb_core::Node::em)
        .map(|em| &em.stats);
    let mut k = SlotKeeping {
        fragments: 0,
        late_starts: 0,
        slots_missed: 0,
        slot_changes: em.map_or(0, |s| s.slot_changes),
        slot_us_end: em.map_or(0.0, |s| s.slot_ns as f64 / 1e3),
        longest_slot_us: em.map_or(0.0, |s| s.longest_slot_ns as f64 / 1e3),
    };
    for ru in e.nodes.iter().filter_map(evb_core::Node::ru) {
        k.fragments += ru.stats.fragments_sent;
        k.late_starts += ru.stats.late_starts;
        k.slots_missed += ru.stats.slots_missed;
    }
    Some(k)
}

/// The slot clock figures from the nodes' measurements, if they made any.
fn slot_clock_summary(e: &traffic::EventBuilder, end: Ps) -> Option<SlotClockSummary> {
    let clocks: Vec<_> = e
        .nodes
        .iter()
        .filter_map(|n| n.clock().map(|c| c.stats))
        .collect();
    (!clocks.is_empty()).then(|| SlotClockSummary {
        nodes: clocks.len(),
        max_phase_error_ns: (0..e.nodes.len())
            .filter_map(|h| e.clock_error_ns(h, end))
            .max()
            .unwrap_or(0),

        max_uncertainty_ns: clocks.iter().map(|c| c.uncertainty_ns).max().unwrap_or(0),
        max_step_ns: clocks.iter().map(|c| c.max_step_ns).max().unwrap_or(0),
        probes: clocks.iter().map(|c| c.probes).sum(),
        replies: clocks.iter().map(|c| c.replies).sum(),
    })
}

/// The crash figures from the built-throughput series.
fn crash_summary(
    e: &traffic::EventBuilder,
    nodes: u16,
    slotted: bool,
    sample: Ps,
    end: Ps,
) -> Option<CrashSummary> {
    let (node, at, detected) = e.crash?;
    // Not found within the run: nothing after.
    let detected = detected.unwrap_or(end);
    let mean_over = |from: Ps, to: Ps| {
        // Interval i covers [i * sample, (i + 1) * sample).
        let picked: Vec<f64> = e
            .built_series
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as Ps * sample >= from && (*i as Ps + 1) * sample <= to)
            .map(|(_, g)| *g)
            .collect();
        (!picked.is_empty()).then(|| picked.iter().sum::<f64>() / picked.len() as f64)
    };
    let before = mean_over(at / 4, at).unwrap_or(0.0);
    let after = mean_over(detected + end.saturating_sub(detected) / 4, end).unwrap_or(0.0);
    Some(CrashSummary {
        node,
        at_us: at as f64 * 1e-6,
        detected_us: detected as f64 * 1e-6,
        built_gbps_before: before,
        built_gbps_after: after,
        ratio: if before > 0.0 { after / before } else { 0.0 },
        expected_ratio: {
            let f = f64::from(nodes.saturating_sub(1)) / f64::from(nodes.max(1));
            // A slotted barrel keeps the dead node's slots: every RU idles
            // in the slot of the dead BU and every BU in the slot of the
            // dead RU, on top of the smaller events.
            if slotted {
                f * f
            } else {
                f
            }
        },
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct HostResult {
    pub host: String,
    pub sent_gbps: f64,
    pub received_gbps: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LinkResult {
    pub link: String,
    /// The link's data rate, Gb/s.
    pub gbps: f64,
    pub utilisation: f64,
    /// PortXmitWait: time with data to send and no credits (or paused),
    /// seconds.
    pub xmit_wait_s: f64,
    /// Packets dropped at this port (lossy Ethernet).
    #[serde(skip_serializing_if = "is_zero")]
    pub drops: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The output stage of an `eb` simulation with consumers.
#[derive(Debug, Clone, Serialize)]
pub struct SimConsumers {
    pub consumers: u16,
    pub batches_delivered: u64,
    pub batches_consumed: u64,
    /// Events consumed, and those the consumers' triggers accepted
    /// (`output.accept_fraction`): what goes on to storage.
    pub events_consumed: u64,
    pub events_accepted: u64,
    /// Batch payload the BUs handed to the output network over the run,
    /// counted when handed over (the consumers' credits let several
    /// batches a consumer go at once, and those still queued in the
    /// producers' NICs at the end count too: not a rate any link carried,
    /// and above the links' for a short run), and the batch payload the
    /// consumers finished, Gb/s, all BUs / all consumers.
    pub producer_gbps: f64,
    pub consumer_gbps: f64,
    /// Times the EM had a MEP to assign and no BU had credit.
    pub em_credit_stalls: u64,
    /// Time BU output queues were full, summed, seconds.
    pub output_full_s: f64,
    /// Per consumer: fraction of the simulated time it was busy.
    pub busy_fraction: Vec<f64>,
    /// Time series, one entry per `sim.sample_us`.
    pub t_us: Vec<f64>,
    pub producer_gbps_series: Vec<f64>,
    pub consumer_gbps_series: Vec<f64>,
    /// Mean number of consumers busy in each interval.
    pub busy_consumers: Vec<f64>,
}

/// Everything `evb sim --json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    pub kind: &'static str,
    pub summary: SimSummary,
    pub hosts: Vec<HostResult>,
    pub links: Vec<LinkResult>,
    pub timeseries: Vec<engine::Sample>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumers: Option<SimConsumers>,
    /// Per sample, per host: (sent, received) payload Gb/s (CSV only: large).
    #[serde(skip)]
    pub host_series: Vec<Vec<(f32, f32)>>,
    /// Every output port's counts over the run, as the engine kept them:
    /// what `evb sim --counters` writes as port counters
    /// ([`output::counters_snapshot`]).
    #[serde(skip)]
    pub ports: Vec<engine::PortReport>,
}

/// Link-layer parameters from the configuration's `[sim]` section.
pub fn params_from_config(config: &Config) -> Result<Params, String> {
    let s = &config.sim;
    let host_latency = if s.host_latency.is_empty() {
        default_host_latency()
    } else {
        // Loaded (relative to the configuration file) when it was validated.
        config
            .host_latency_bins
            .iter()
            .copied()
            .map(|(ns, w)| (u64::from(ns) * PS_PER_NS, w))
            .collect()
    };
    Ok(Params {
        link_gbps: s.link_gbps,
        link_latency_ps: s.link_latency_ns * PS_PER_NS,
        switch_latency_ps: s.switch_latency_ns * PS_PER_NS,
        mtu: s.mtu_bytes,
        vls: s.vls,
        vl_buffer_bytes: s.vl_buffer_bytes,
        vl_weights: s.vl_weights.clone(),
        host_latency,
        seed: config.run.seed,
        flit: s.granularity == Granularity::Flit,
        train: s.train_packets.max(1),
        static_rate: s.static_rate,
        host: s.host.clone(),
        eth: engine::EthParams {
            mtu: s.output.mtu_bytes,
            switch_latency_ps: s.output.switch_latency_ns * PS_PER_NS,
            buffer_bytes: s.output.buffer_bytes,
            lossless: s.output.flow_control == FlowControl::Pfc,
            rto_ps: (s.output.rto_us * 1e6) as Ps,
            ..engine::EthParams::default()
        },
    })
}

/// Fabrics from this many hosts up get trains of packets by default.
pub const AUTO_TRAIN_HOSTS: usize = 128;

/// The MTU packets a train moves as one unit (`sim.train_packets`; 0:
/// auto). Auto: the slotted event builder puts one flow on a link at a
/// time, so a train of up to 8 packets (what fits a VL buffer) gives the
/// figures of single packets (equal to the hundredth of a Gb/s at 72
/// nodes, 163 x HDR and 128 x NDR, docs/sim.md) with 8 times fewer events;
/// on fabrics of `AUTO_TRAIN_HOSTS` hosts or more it is the default there.
/// Everything else, whose flows interleave packet by packet, keeps single
/// packets.
pub fn train_packets(config: &Config, hosts: usize) -> u32 {
    let s = &config.sim;
    if s.train_packets > 0 {
        return s.train_packets;
    }
    let slotted = s.traffic == SimTraffic::Eb
        && config.event_builder.schedule == evb_core::config::Schedule::Slotted
        && s.granularity == Granularity::Packet;
    if !slotted || hosts < AUTO_TRAIN_HOSTS {
        return 1;
    }
    let packet = u64::from(s.mtu_bytes) + 64;
    ((u64::from(s.vl_buffer_bytes) - 64) / packet).clamp(1, 8) as u32
}

/// Whether the consumers sit on an output network of their own.
pub fn separate_output(config: &Config) -> bool {
    config.sim.traffic == SimTraffic::Eb
        && config.output.consumers > 0
        && config.sim.output.network == OutputNetwork::Ethernet
}

/// Adds the output network (`[sim.output]`) to the event-building
/// `fabric`: the BUs' second NICs, named after their hosts, and the
/// consumers.
pub fn with_output_network(config: &Config, mut fabric: SimFabric) -> Result<SimFabric, String> {
    let layout = evb_core::Layout::from_config(config);
    let core = layout.endpoints as usize - layout.fus();
    if fabric.hosts() != core {
        return Err(format!(
            "the fabric has {} hosts for {core} event-builder endpoints (nodes.count = {}{}); the {} consumers are on the output network (sim.output.network = \"ethernet\")",
            fabric.hosts(),
            config.nodes.count,
            if layout.em >= layout.nodes { ", plus a separate EM" } else { "" },
            layout.fus()
        ));
    }
    let o = &config.sim.output;
    let producers: Vec<String> = layout
        .bu_nodes
        .iter()
        .map(|&b| fabric.host_names[b as usize].clone())
        .collect();
    let out = fabric::output_network(
        &o.topology,
        &producers,
        layout.fus(),
        o.producer_gbps,
        o.consumer_gbps,
        o.uplink_gbps,
    )?;
    fabric.name = format!("{} + {}", fabric.name, out.name);
    fabric.append(out);
    Ok(fabric)
}

/// The warm-up left out of the steady-state figures: `sim.warmup_us`, or
/// a fifth of the run, or two rotations of a slotted barrel if that is
/// longer, at most half the run.
pub fn warmup_ps(config: &Config) -> Ps {
    warmup(config).0
}

/// [`warmup_ps`] and which of its rules set it, for the user.
pub fn warmup(config: &Config) -> (Ps, &'static str) {
    let end = (config.sim.duration_us * 1e6) as Ps;
    if config.sim.warmup_us > 0.0 {
        return ((config.sim.warmup_us * 1e6) as Ps, "sim.warmup_us");
    }
    let fifth = end / 5;
    let rotations = rotation_ps(config).map_or(0, |r| 2 * r);
    if rotations > fifth {
        if rotations > end / 2 {
            (
                end / 2,
                "half the run, the most it may be: two rotations are longer",
            )
        } else {
            (rotations, "two rotations, longer than a fifth of the run")
        }
    } else {
        (fifth, "a fifth of the run")
    }
}

/// The payload rate a link of `gbps` carries in packets of `mtu` bytes of
/// payload and `header` bytes more.
pub fn usable_gbps(gbps: f64, mtu: u32, header: u32) -> f64 {
    gbps * f64::from(mtu) / f64::from(mtu + header)
}

/// Bytes an InfiniBand packet carries besides its payload: LRH, BTH, ICRC
/// and VCRC (the RETH of a message's first packet aside).
pub const IB_PACKET_HEADER_BYTES: u32 = engine::LRH + engine::BTH + engine::ICRC + engine::VCRC;

/// A slotted barrel's rotation, ps: the steady-state figures are taken
/// over whole rotations ([`stats::batch_means_periodic`]).
pub fn rotation_ps(config: &Config) -> Option<Ps> {
    if config.event_builder.schedule != evb_core::config::Schedule::Slotted {
        return None;
    }
    let layout = evb_core::Layout::from_config(config);
    (layout.rus() > 0).then(|| {
        let plan = evb_core::slots::SlotPlan::for_source(config, &layout, 0);
        plan.rotation() * plan.slot_ns * PS_PER_NS
    })
}

/// Runs the simulation the configuration describes on `fabric`.
/// `progress` is called with the fraction of simulated time done.
pub fn simulate(
    config: &Config,
    fabric: SimFabric,
    mut progress: impl FnMut(f64),
) -> Result<SimResult, String> {
    // The slots sized for the fabric and its schedule, before any unit is
    // made from the configuration.
    let mut config = config.clone();
    let schedule = schedule::prepare(&mut config, &fabric)?;
    let config = &config;
    let fabric = if separate_output(config) {
        with_output_network(config, fabric)?
    } else {
        fabric
    };
    fabric.validate()?;
    let mut params = params_from_config(config)?;
    params.train = train_packets(config, fabric.hosts());
    let s = &config.sim;
    let end: Ps = (s.duration_us * 1e6) as Ps;
    let sample: Ps = ((s.sample_us * 1e6) as Ps).max(1);
    let hosts = fabric.hosts();
    let n = hosts as u32;
    let seed = config.run.seed;
    let mut eb = match s.traffic {
        SimTraffic::Eb => Some(traffic::EventBuilder::new(config, hosts)?),
        _ => None,
    };
    let mut synthetic = synthetic_traffic(config, n, seed);
    let topology = fabric.name.clone();
    let mut net = Net::new(fabric, params, sample);
    // The summary's per-host figures are those of the event-building
    // fabric; the output network's are in `summary.consumers`.
    let mut fabric_hosts = hosts;
    if let Some((producers, _)) = eb.as_ref().and_then(|e| e.output_hosts()) {
        fabric_hosts = producers.start;
        for h in producers {
            net.limit_data_messages(h as u32, s.output.producer_messages);
        }
    }
    net.series_hosts = fabric_hosts;
    let wall = Instant::now();
    let report = |t: Ps| progress(t as f64 / end.max(1) as f64);
    match eb.as_mut() {
        Some(e) => net.run(e, end, report),
        None => net.run(synthetic.as_mut(), end, report),
    }
    let wall_seconds = wall.elapsed().as_secs_f64();
    let secs = end as f64 * 1e-12;
    let gbps = |bytes: u64| bytes as f64 * 8.0 / secs / 1e9;
    let host_results = host_results(&net, &gbps);
    let rx: Vec<f64> = host_results[..fabric_hosts]
        .iter()
        .map(|h| h.received_gbps)
        .collect();
    let mean = rx.iter().sum::<f64>() / rx.len().max(1) as f64;
    let ports = net.link_report();
    let links = link_results(&ports, secs);
    let first_steady = (warmup_ps(config).div_ceil(sample)) as usize;
    let host_link = mean_link_gbps(&net, 0..fabric_hosts as u32);
    let (mtu, header) = (net.params.mtu, IB_PACKET_HEADER_BYTES);
    let host_usable = usable_gbps(host_link, mtu, header);
    let eb_summary = eb.as_ref().map(|e| EbSummary {
        schedule: schedule.clone(),
        ..eb_summary(config, e, &net, end, sample)
    });
    let end_ns = end / PS_PER_NS;
    let consumers = eb
        .as_ref()
        .filter(|_| config.output.consumers > 0)
        .map(|e| consumer_summary(e, end_ns, &gbps));
    let output_summary = eb
        .as_ref()
        .filter(|_| config.output.consumers > 0)
        .map(|e| output_summary(config, e, &net, &links, first_steady, end_ns));
    Ok(SimResult {
        consumers,
        kind: "evb-sim",
        summary: SimSummary {
            topology,
            traffic: s.traffic.to_string(),
            notes: Vec::new(),
            hosts: fabric_hosts,
            throughput_per_host_gbps: mean,
            link_rate_gbps: host_link,
            fraction_of_link: mean / host_link,
            usable_link_gbps: host_usable,
            mtu_bytes: mtu,
            packet_header_bytes: header,
            fraction_of_usable: mean / host_usable,
            min_host_gbps: rx.iter().copied().fold(f64::INFINITY, f64::min),
            max_host_gbps: rx.iter().copied().fold(0.0, f64::max),
            simulated_seconds: secs,
            wall_seconds,
            events_processed: net.events_processed,
            speed_us_per_s: secs * 1e6 / wall_seconds.max(1e-9),
            max_link_utilisation: links.iter().map(|l| l.utilisation).fold(0.0, f64::max),
            total_xmit_wait_s: links.iter().map(|l| l.xmit_wait_s).sum(),
            eb: eb_summary,
            consumers: output_summary,
        },
        hosts: host_results,
        links,
        timeseries: net.samples.clone(),
        host_series: std::mem::take(&mut net.host_samples),
        ports,
    })
}

/// The synthetic traffic of `sim.traffic` on `n` hosts (a placeholder
/// for `eb`, which the event builder drives).
fn synthetic_traffic(config: &Config, n: u32, seed: u64) -> Box<dyn Traffic> {
    let s = &config.sim;
    match s.traffic {
        SimTraffic::Eb => Box::new(traffic::ShiftFixed::new(0)), // unused
        SimTraffic::ShiftFixed => Box::new(traffic::ShiftFixed::new(s.message_bytes)),
        SimTraffic::ShiftWindow => Box::new(traffic::ShiftWindow {
            window: s.window_ns * PS_PER_NS,
            grace: s.grace_ns * PS_PER_NS,
        }),
        SimTraffic::Uniform => Box::new(traffic::Uniform::new(s.load, seed)),
        SimTraffic::Permutation => {
            Box::new(traffic::Streams::permutation(n, s.message_bytes, seed))
        }
        SimTraffic::Incast => Box::new(traffic::Streams::incast(n, s.message_bytes)),
        SimTraffic::AllToAll => Box::new(traffic::Streams::all_to_all(n, s.message_bytes)),
    }
}

/// The mean rate of these hosts' own links (a topology's, else
/// `sim.link_gbps`): the fraction of link of a 200 Gb/s fabric is against
/// 200.
fn mean_link_gbps(net: &Net, hosts: impl Iterator<Item = u32>) -> f64 {
    let (sum, n) = hosts.fold((0.0, 0usize), |(s, n), h| (s + net.host_gbps(h), n + 1));
    if n == 0 {
        net.params.link_gbps
    } else {
        sum / n as f64
    }
}

/// Every host's sent and received payload over the run, Gb/s (`gbps`
/// turns bytes into that).
fn host_results(net: &Net, gbps: &dyn Fn(u64) -> f64) -> Vec<HostResult> {
    net.hosts
        .iter()
        .enumerate()
        .map(|(i, h)| HostResult {
            host: net.fabric.host_names[i].clone(),
            sent_gbps: gbps(h.payload_sent),
            received_gbps: gbps(h.payload_received),
        })
        .collect()
}

/// Every link's rate, utilisation, credit wait and drops over a run of
/// `secs` simulated seconds.
fn link_results(ports: &[engine::PortReport], secs: f64) -> Vec<LinkResult> {
    ports
        .iter()
        .map(|r| LinkResult {
            link: r.name.clone(),
            gbps: r.gbps,
            // Bytes are counted when a packet starts; one still on the wire
            // at the end would push a saturated link a hair over 1.
            utilisation: (r.bytes as f64 / (r.gbps * 1e9 / 8.0 * secs)).min(1.0),
            xmit_wait_s: r.xmit_wait_ps as f64 * 1e-12,
            drops: r.drops,
        })
        .collect()
}

/// A rotation of the slots in force at the end of a slotted run: the EM may
/// have lengthened them for a slow link, and batches of the nominal rotation
/// would then cut the built series (one burst of completions a rotation) at
/// arbitrary points. `None` for an unslotted schedule.
fn rotation_in_force(config: &Config, e: &traffic::EventBuilder) -> Option<Ps> {
    let nominal_slot_ns = config.slot_ns().max(1);
    rotation_ps(config).map(|r| {
        let end_slot_ns = e
            .nodes
            .iter()
            .find_map(evb_core::Node::em)
            .map_or(nominal_slot_ns, |em| em.stats.slot_ns.max(nominal_slot_ns));
        (u128::from(r) * u128::from(end_slot_ns) / u128::from(nominal_slot_ns)) as Ps
    })
}

/// The event-building figures of a finished `eb` simulation: built and
/// network throughput past the warm-up, latency quantiles, the EM's
/// throttling and vetoes, crash and slot-clock summaries.
fn eb_summary(
    config: &Config,
    e: &traffic::EventBuilder,
    net: &Net,
    end: Ps,
    sample: Ps,
) -> EbSummary {
    let bus = Layout::from_config(config).bu_nodes;
    let link_gbps = mean_link_gbps(net, bus.iter().map(|&b| u32::from(b)));
    let usable = usable_gbps(link_gbps, net.params.mtu, IB_PACKET_HEADER_BYTES);
    let (warmup, rule) = warmup(config);
    let first_steady = (warmup.div_ceil(sample)) as usize;
    let rotation = rotation_in_force(config, e);
    let bus = evb_core::Layout::from_config(config).bus().max(1) as f64;
    let (built, network, drift) = match rotation {
        Some(r) => (
            stats::batch_means_periodic(&e.built_series, warmup, r, sample),
            stats::batch_means_periodic(&e.network_series, warmup, r, sample),
            stats::drift_periodic(&e.built_series, r, sample),
        ),
        None => (
            stats::batch_means(&e.built_series, first_steady),
            stats::batch_means(&e.network_series, first_steady),
            stats::drift(&e.built_series),
        ),
    };
    let network_per_node = network.mean / bus;
    let mut hist = hdr_merge(e);
    if hist.is_empty() {
        hist.push(0);
    }
    hist.sort_unstable();
    let q = |f: f64| hist[((hist.len() - 1) as f64 * f) as usize] as f64 / 1000.0;
    let em = e.nodes.iter().find_map(evb_core::Node::em);
    let end_ns = end / PS_PER_NS;
    let warmup_us = match rotation {
        Some(_) => built.from_ps as f64 * 1e-6,
        None => first_steady as f64 * sample as f64 * 1e-6,
    };
    let steady_us = match rotation {
        Some(_) if built.to_ps > built.from_ps => (built.to_ps - built.from_ps) as f64 * 1e-6,
        _ => end as f64 * 1e-6 - warmup_us,
    }
    .max(0.0);
    let warmup_rule = warmup_text(warmup, rule, rotation, &built);
    let first_built_us = e.first_built_ns.map(|t| t as f64 * 1e-3);
    let period_us = rotation.map_or(warmup as f64, |r| r as f64) * 1e-6;
    // A slotted barrel completes its batches in bursts once a rotation:
    // fewer than two whole rotations after the warm-up (batch means cut
    // inside one) are no steady state, whatever their count (1024 hosts at
    // 400 Gb/s over 66 ms: 10 such means, +-340 Gb/s).
    let means = match rotation {
        Some(r) if (built.to_ps.saturating_sub(built.from_ps)) / r.max(1) < 2 => 0,
        _ => built.batches,
    };
    let (steady, steady_needs_us) = steady_state(
        first_built_us,
        warmup_us,
        means,
        period_us,
        end as f64 * 1e-6,
    );
    EbSummary {
        steady,
        first_built_us,
        steady_needs_us,
        throttled_fraction: em.map_or(0.0, |em| {
            em.throttled_ns_at(end_ns) as f64 / end_ns.max(1) as f64
        }),
        events_vetoed: em.map_or(0, |em| {
            em.stats.meps_vetoed * u64::from(config.source.events_per_mep)
        }),
        events_built: e.events_built,
        batches_incomplete: e.batches_incomplete,
        built_gbps_per_node: built.mean / bus,
        built_ci95_gbps: built.ci95 / bus,
        batch_means: built.batches,
        warmup_us,
        warmup_rule,
        steady_us,
        rotation_us: rotation.map(|r| r as f64 * 1e-6),
        drift,
        network_gbps_per_node: network_per_node,
        network_fraction_of_link: network_per_node / link_gbps,
        network_fraction_of_usable: network_per_node / usable,
        local: match config.event_builder.local {
            LocalTraffic::Memory => "memory",
            LocalTraffic::Nic => "nic",
        }
        .to_string(),
        latency_p50_us: q(0.5),
        latency_p99_us: q(0.99),
        latency_max_us: q(1.0),
        crash: crash_summary(
            e,
            config.nodes.count,
            config.event_builder.schedule == evb_core::config::Schedule::Slotted,
            sample,
            end,
        ),
        slot_clock: slot_clock_summary(e, end),
        schedule: None,
        slots: slot_keeping(config, e),
        built_gbps_series: e.built_series.clone(),
    }
}

/// Why the warm-up is as long as it is: the rule that set it (`base` ps,
/// [`warmup`]) and, for a slotted barrel, the rotations it came to once
/// rounded up to a rotation's end and given the rotations the batches
/// leave over.
fn warmup_text(base: Ps, rule: &str, rotation: Option<Ps>, built: &stats::Steady) -> String {
    let ms = |ps: u64| ps as f64 * 1e-9;
    let Some(r) = rotation.filter(|&r| r > 0 && built.to_ps > built.from_ps) else {
        return format!("{rule}, {:.2} ms", ms(base));
    };
    if !built.from_ps.is_multiple_of(r) {
        return format!(
            "{rule}, {:.2} ms; fewer than two whole rotations of {:.3} ms follow",
            ms(base),
            ms(r)
        );
    }
    let rounded = base.div_ceil(r);
    let total = built.from_ps / r;
    let over = total.saturating_sub(rounded);
    let window = (built.to_ps - built.from_ps) / r;
    let mut text = format!("{total} rotations of {:.3} ms: {rule}", ms(r));
    if !base.is_multiple_of(r) {
        text += &format!(", {:.2} ms, rounded up to whole rotations", ms(base));
    }
    if over > 0 {
        text += &format!(
            ", and {over} left over by cutting the {window} measured into {} equal batches",
            built.batches
        );
    }
    text
}

/// The steady-state distribution figures of a finished `eb` simulation
/// with consumers.
fn output_summary(
    config: &Config,
    e: &traffic::EventBuilder,
    net: &Net,
    links: &[LinkResult],
    first_steady: usize,
    end_ns: u64,
) -> OutputSummary {
    let layout = evb_core::Layout::from_config(config);
    let (p, c) = (layout.bus(), layout.fus());
    let series = |hosts: &[usize], rx: bool| -> Vec<f64> {
        net.host_samples
            .iter()
            .map(|s| {
                hosts
                    .iter()
                    .map(|&h| f64::from(if rx { s[h].1 } else { s[h].0 }))
                    .sum()
            })
            .collect()
    };
    let (network, producer_series, consumer_hosts) = match e.output_hosts() {
        Some((producers, consumers)) => (
            format!("ethernet {}", config.sim.output.flow_control),
            series(&producers.collect::<Vec<_>>(), false),
            consumers.collect::<Vec<_>>(),
        ),
        None => (
            "fabric".to_string(),
            // Producers' links carry fragments too: count batches posted.
            e.consumer_series.iter().map(|s| s.producer_gbps).collect(),
            layout.fu_nodes.iter().map(|&f| f as usize).collect(),
        ),
    };
    let produced = stats::batch_means(&producer_series, first_steady);
    let consumed = stats::batch_means(&series(&consumer_hosts, true), first_steady);
    let fus: Vec<_> = e.nodes.iter().filter_map(evb_core::Node::fu).collect();
    let busy = fus
        .iter()
        .map(|f| f.busy_time(end_ns) as f64 / end_ns.max(1) as f64)
        .sum::<f64>()
        / fus.len().max(1) as f64;
    let producer_links: Vec<&LinkResult> = match e.output_hosts() {
        Some((producers, _)) => producers.map(|h| &links[h]).collect(),
        None => Vec::new(),
    };
    let secs = end_ns as f64 * 1e-9;
    let ec = &net.eth_counters;
    let (pg, cg) = match e.output_hosts() {
        Some((producers, consumers)) => (
            net.host_gbps(producers.start as u32),
            net.host_gbps(consumers.start as u32),
        ),
        None => (net.params.link_gbps, net.params.link_gbps),
    };
    let (mtu, header) = match e.output_hosts() {
        Some(_) => (net.params.eth.mtu, net.params.eth.header_bytes),
        None => (net.params.mtu, IB_PACKET_HEADER_BYTES),
    };
    let (pu, cu) = (usable_gbps(pg, mtu, header), usable_gbps(cg, mtu, header));
    let per_producer = produced.mean / p.max(1) as f64;
    let per_consumer = consumed.mean / c.max(1) as f64;
    OutputSummary {
        network,
        producers: p,
        consumers: c,
        producer_link_gbps: pg,
        consumer_link_gbps: cg,
        producer_usable_gbps: pu,
        consumer_usable_gbps: cu,
        warmup_us: (first_steady as u64 * net.sample_ps) as f64 * 1e-6,
        batch_means: consumed.batches,
        producer_gbps_per_producer: per_producer,
        producer_ci95_gbps: produced.ci95 / p.max(1) as f64,
        consumer_gbps_per_consumer: per_consumer,
        consumer_ci95_gbps: consumed.ci95 / c.max(1) as f64,
        producer_gbps_total: produced.mean,
        consumer_gbps_total: consumed.mean,
        producer_fraction_of_usable: per_producer / pu,
        consumer_fraction_of_usable: per_consumer / cu,
        busy_fraction_mean: busy,
        em_credit_stalls: e
            .nodes
            .iter()
            .find_map(evb_core::Node::em)
            .map_or(0, |em| em.stats.credit_stalls),
        pause_frames: ec.pause_frames,
        drops: ec.drops,
        naks: ec.naks,
        timeouts: ec.timeouts,
        retransmitted_bytes: ec.retransmitted_bytes,
        producer_paused_fraction: producer_links
            .iter()
            .map(|l| l.xmit_wait_s / secs.max(1e-12))
            .sum::<f64>()
            / producer_links.len().max(1) as f64,
    }
}

/// The output-stage figures of a finished `eb` simulation.
fn consumer_summary(
    e: &traffic::EventBuilder,
    end_ns: u64,
    gbps: &dyn Fn(u64) -> f64,
) -> SimConsumers {
    let fus: Vec<_> = e.nodes.iter().filter_map(evb_core::Node::fu).collect();
    let bus: Vec<_> = e.nodes.iter().filter_map(evb_core::Node::bu).collect();
    let em = e.nodes.iter().find_map(evb_core::Node::em);
    let series = &e.consumer_series;
    SimConsumers {
        consumers: fus.len() as u16,
        batches_delivered: bus.iter().map(|b| b.stats.batches_delivered).sum(),
        batches_consumed: fus.iter().map(|f| f.stats.batches_consumed).sum(),
        events_consumed: fus.iter().map(|f| f.stats.events_consumed).sum(),
        events_accepted: fus.iter().map(|f| f.stats.events_accepted).sum(),
        producer_gbps: gbps(e.delivered_bytes),
        consumer_gbps: gbps(fus.iter().map(|f| f.stats.bytes_consumed).sum()),
        em_credit_stalls: em.map_or(0, |em| em.stats.credit_stalls),
        output_full_s: bus.iter().map(|b| b.stats.output_full_ns).sum::<u64>() as f64 * 1e-9,
        busy_fraction: fus
            .iter()
            .map(|f| f.busy_time(end_ns) as f64 / end_ns.max(1) as f64)
            .collect(),
        t_us: series.iter().map(|s| s.t_us).collect(),
        producer_gbps_series: series.iter().map(|s| s.producer_gbps).collect(),
        consumer_gbps_series: series.iter().map(|s| s.consumer_gbps).collect(),
        busy_consumers: series.iter().map(|s| s.busy_consumers).collect(),
    }
}

/// Batch latencies (ns) of every BU, one entry per recorded value.
fn hdr_merge(e: &traffic::EventBuilder) -> Vec<u64> {
    let mut v = Vec::new();
    for node in &e.nodes {
        if let Some(bu) = node.bu() {
            for r in bu.stats.latency_ns.iter_recorded() {
                v.extend(std::iter::repeat_n(
                    r.value_iterated_to(),
                    r.count_at_value() as usize,
                ));
            }
        }
    }
    v
}
