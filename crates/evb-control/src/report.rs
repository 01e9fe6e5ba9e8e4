//! What a node reports (as `STATS` / `FINAL` JSON lines on its stdout, and
//! in `final-<rank>.json` under a cluster launcher); `evb run` adds the
//! reports up into the run summary (`evb_launch::summary`).
//!
//! The JSON written by `evb run --json` is documented in `docs/run-json.md`.

use evb_core::bu::{BuStats, Outcome};
use evb_core::NodeStats;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

pub use evb_transport::outnet::{LinkAddresses, OutputNetworkReport};

/// Latency percentiles in nanoseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

/// An incomplete or corrupt batch, as reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IncidentReport {
    pub mep: u64,
    pub at_s: f64,
    /// `incomplete` or `corrupt`.
    pub kind: String,
    /// Source (RU) indices missing, or that sent corrupt data.
    pub sources: Vec<u16>,
}

/// One node's counters (cumulative).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeReport {
    pub node: u16,
    pub role: String,
    /// Seconds since this node started its run.
    pub elapsed_s: f64,
    pub meps_assigned: u64,
    pub meps_produced: u64,
    pub fragments_sent: u64,
    pub bytes_sent: u64,
    pub fragments_received: u64,
    pub bytes_received: u64,
    pub batches_built: u64,
    pub events_built: u64,
    pub bytes_built: u64,
    pub batches_incomplete: u64,
    pub events_incomplete: u64,
    pub batches_corrupt: u64,
    pub events_corrupt: u64,
    /// (BU) Batches the EM took from it while it had lost it (`Revoked`):
    /// counted by the BU they were re-assigned to, or lost; not in this
    /// BU's built, incomplete or corrupt counts, latency or missing sources.
    #[serde(default)]
    pub batches_revoked: u64,
    pub fragments_corrupt: u64,
    pub fragments_duplicate: u64,
    pub fragments_unexpected: u64,
    pub control_rejected: u64,
    pub max_in_flight: u32,
    /// (RU) Most assigned MEPs held at once: the RU buffer occupancy.
    #[serde(default)]
    pub max_meps_held: u64,
    pub max_open_batches: u32,
    pub latency_ns: Latency,
    /// Non-empty latency histogram buckets (value ns, count), for merging.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_buckets: Vec<(u64, u64)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_by_source: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<IncidentReport>,
    /// (RU) Fragments shipped through the transport, per destination BU:
    /// how many, their bytes and how long they took (FINAL only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sends_by_bu: Vec<BuSends>,
    /// Peers this node lost during the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers_lost: Vec<PeerLoss>,
    /// Lost peers that came back (restarted or reconnected), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejoins: Vec<PeerRejoin>,
    /// This process is a restarted node that rejoined the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarted: bool,
    /// (EM, restarted) The MEP at which it resumed assigning, once the
    /// nodes had said how far the run got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub em_resumed_at: Option<u64>,
    /// (EM) MEPs finished by outcome, and lost with a BU, as the BUs
    /// reported them to the EM: the run's authoritative accounting.
    #[serde(default)]
    pub em_meps_built: u64,
    #[serde(default)]
    pub em_meps_incomplete: u64,
    #[serde(default)]
    pub em_meps_corrupt: u64,
    #[serde(default)]
    pub em_meps_lost_bu_gone: u64,
    /// (EM) MEPs of a lost BU that the RUs still held and that were
    /// re-assigned to another BU (each also counted by its outcome there).
    #[serde(default)]
    pub em_meps_reassigned: u64,
    /// (EM) MEPs taken from a BU lost while alive (re-assigned, or lost)
    /// and named to it when it came back (`Revoked`), each counted once.
    #[serde(default)]
    pub em_meps_revoked: u64,
    /// (EM, paced readout) MEPs vetoed at the source while throttled, time
    /// throttled (s), throttle episodes, MEPs read out and lost for want of
    /// any BU, most MEPs not yet built at once (the bounded RU buffer).
    #[serde(default)]
    pub em_meps_vetoed: u64,
    #[serde(default)]
    pub em_throttled_s: f64,
    #[serde(default)]
    pub em_throttle_episodes: u64,
    #[serde(default)]
    pub em_meps_lost_no_bu: u64,
    #[serde(default)]
    pub em_max_unbuilt: u64,
    /// The drain period ran out before everything was finished.
    #[serde(default)]
    pub drain_timed_out: bool,
    /// Resident memory of the node process, bytes.
    #[serde(default)]
    pub rss_bytes: u64,
    /// CPU time of the node process since it started (all its threads),
    /// user and system, seconds; and per GB (10^9 bytes) it built (a BU;
    /// 0 before it built anything).
    #[serde(default)]
    pub cpu_user_s: f64,
    #[serde(default)]
    pub cpu_system_s: f64,
    #[serde(default)]
    pub cpu_user_s_per_gb: f64,
    #[serde(default)]
    pub cpu_system_s_per_gb: f64,
    /// `event_builder.preallocate_buffers`: bytes of the buffers this node
    /// allocated and touched at start; MEPs that waited for a free MEP
    /// buffer; receive buffers allocated past the pool's bound (the
    /// protocol's bounds say never).
    #[serde(default)]
    pub buffers_preallocated_bytes: u64,
    #[serde(default)]
    pub mep_buffer_waits: u64,
    #[serde(default)]
    pub rx_buffer_overflows: u64,
    /// (EM) Times the EM had a MEP to assign and no BU had credit.
    #[serde(default)]
    pub em_credit_stalls: u64,
    /// (BU with consumers) Built batches handed to consumers, their bytes,
    /// those no consumer could take, time the output queue was full (s),
    /// its longest length.
    #[serde(default)]
    pub batches_delivered: u64,
    #[serde(default)]
    pub bytes_delivered: u64,
    /// (BU, `output.deliver_partial`) Incomplete batches delivered anyway,
    /// flagged partial (to consumers, or without them to the sink).
    #[serde(default)]
    pub batches_delivered_partial: u64,
    /// (FU) Deliveries flagged partial it received.
    #[serde(default)]
    pub batches_consumed_partial: u64,
    #[serde(default)]
    pub batches_undelivered: u64,
    /// (BU with consumers) Deliveries confirmed by each consumer's credit
    /// (by FU index), and deliveries made again because their consumer
    /// died before confirming them.
    #[serde(default)]
    pub batches_confirmed: Vec<u64>,
    #[serde(default)]
    pub batches_redelivered: u64,
    /// (BU with consumers) Deliveries still unconfirmed when the drain ended.
    #[serde(default)]
    pub batches_unconfirmed: u64,
    #[serde(default)]
    pub output_full_s: f64,
    #[serde(default)]
    pub max_output_queue: u32,
    /// (FU) Batches, events and bytes consumed, corrupt batches, deliveries
    /// dropped as unexpected, time busy (s).
    #[serde(default)]
    pub batches_consumed: u64,
    #[serde(default)]
    pub events_consumed: u64,
    #[serde(default)]
    pub bytes_consumed: u64,
    #[serde(default)]
    pub batches_consumed_corrupt: u64,
    #[serde(default)]
    pub deliveries_unexpected: u64,
    #[serde(default)]
    pub busy_s: f64,
    /// (FU) Events of the consumed batches its trigger accepted, and the
    /// batches with any accepted event.
    #[serde(default)]
    pub events_accepted: u64,
    #[serde(default)]
    pub batches_accepted: u64,
    /// (`output.sink = "store"`) Objects, events and bytes this node wrote
    /// to the event store (in the final report: everything it queued).
    #[serde(default)]
    pub store_objects: u64,
    #[serde(default)]
    pub store_events: u64,
    #[serde(default)]
    pub store_bytes: u64,
    /// The slotted barrel's clock on this node: its measured offset to the
    /// EM's clock, and where this process's clock started (for `evb run`
    /// to compute the true offsets of nodes on one host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockReport>,
    /// With an output network (`output.bind`, `output.interface`,
    /// `output.addresses`; final report only): this endpoint's address
    /// there and the links that ran over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_network: Option<OutputNetworkReport>,
}

/// What a node knows of its clock against the EM's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClockReport {
    /// The host the node runs on: true offsets are known only between
    /// processes of one host (one CLOCK_MONOTONIC).
    pub host: String,
    /// CLOCK_MONOTONIC at this node's time 0, ns.
    pub epoch_monotonic_ns: u64,
    /// Measured: EM time minus this node's time, ns (0 on the EM's node).
    pub offset_ns: i64,
    /// Half the round trip of the answer the offset rests on.
    pub uncertainty_ns: u64,
    pub probes: u64,
    pub replies: u64,
    /// Largest change of the estimate between answers.
    pub max_step_ns: u64,
    /// This node hosts the EM (the reference clock).
    #[serde(default)]
    pub em: bool,
}

impl NodeReport {
    pub fn from_stats(
        node: u16,
        role: String,
        elapsed_s: f64,
        s: &NodeStats,
        full: bool,
    ) -> NodeReport {
        let mut r = NodeReport {
            node,
            role,
            elapsed_s,
            control_rejected: s.control_rejected,
            ..Default::default()
        };
        if let Some(em) = &s.em {
            r.meps_assigned = em.meps_assigned;
        }
        if let Some(ru) = &s.ru {
            r.meps_produced = ru.meps_produced;
            r.fragments_sent = ru.fragments_sent;
            r.bytes_sent = ru.bytes_sent;
            r.max_in_flight = ru.max_in_flight;
            r.max_meps_held = ru.max_held;
        }
        if let Some(bu) = &s.bu {
            r.add_bu(bu, full);
        }
        if let Some(em) = &s.em {
            r.em_credit_stalls = em.credit_stalls;
            r.em_meps_vetoed = em.meps_vetoed;
            r.em_throttled_s = em.throttled_ns as f64 * 1e-9;
            r.em_throttle_episodes = em.throttle_episodes;
            r.em_meps_lost_no_bu = em.meps_lost_no_bu;
            r.em_max_unbuilt = em.max_unbuilt;
        }
        if let Some(fu) = &s.fu {
            r.batches_consumed = fu.batches_consumed;
            r.events_consumed = fu.events_consumed;
            r.bytes_consumed = fu.bytes_consumed;
            r.batches_consumed_corrupt = fu.batches_corrupt;
            r.batches_consumed_partial = fu.batches_partial;
            r.deliveries_unexpected = fu.deliveries_unexpected;
            r.busy_s = fu.busy_ns as f64 * 1e-9;
            r.events_accepted = fu.events_accepted;
            r.batches_accepted = fu.batches_accepted;
        }
        r
    }

    fn add_bu(&mut self, bu: &BuStats, full: bool) {
        self.fragments_received = bu.fragments_received;
        self.bytes_received = bu.bytes_received;
        self.batches_built = bu.batches_built;
        self.events_built = bu.events_built;
        self.bytes_built = bu.bytes_built;
        self.batches_incomplete = bu.batches_incomplete;
        self.events_incomplete = bu.events_incomplete;
        self.batches_corrupt = bu.batches_corrupt;
        self.events_corrupt = bu.events_corrupt;
        self.batches_revoked = bu.batches_revoked;
        self.fragments_corrupt = bu.fragments_corrupt;
        self.fragments_duplicate = bu.fragments_duplicate;
        self.fragments_unexpected = bu.fragments_unexpected;
        self.max_open_batches = bu.max_open;
        self.batches_delivered = bu.batches_delivered;
        self.batches_delivered_partial = bu.batches_delivered_partial;
        self.bytes_delivered = bu.bytes_delivered;
        self.batches_undelivered = bu.batches_undelivered;
        self.batches_confirmed = bu.batches_confirmed.clone();
        self.batches_redelivered = bu.batches_redelivered;
        self.batches_unconfirmed = bu.batches_unconfirmed;
        self.output_full_s = bu.output_full_ns as f64 * 1e-9;
        self.max_output_queue = bu.max_output_queue;
        self.latency_ns = Latency::of(&bu.latency_ns);
        if full {
            self.latency_buckets = bu
                .latency_ns
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect();
            self.missing_by_source = bu.missing_by_source.clone();
            self.incidents = bu
                .incidents
                .iter()
                .map(|i| {
                    let (kind, sources) = match &i.outcome {
                        Outcome::Incomplete { missing } => ("incomplete", missing.clone()),
                        Outcome::Corrupt { sources } => ("corrupt", sources.clone()),
                        _ => ("other", Vec::new()),
                    };
                    IncidentReport {
                        mep: i.mep,
                        at_s: i.at as f64 * 1e-9,
                        kind: kind.into(),
                        sources,
                    }
                })
                .collect();
        }
    }
}

/// An RU's fragments to one BU: shipped through the transport, their
/// bytes, and the time they took summed over fragments, each from its
/// hand-over to the transport until the transport was done with it (with
/// `event_builder.parallel_sends` above 1, transfers overlap and each
/// takes longer): per-step throughput, `docs/run-json.md`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BuSends {
    /// The BU's endpoint.
    pub bu: u16,
    pub fragments: u64,
    pub bytes: u64,
    pub transfer_s: f64,
}

/// A peer declared lost, when (Unix time, s) and why.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PeerLoss {
    pub peer: u16,
    pub at_unix_s: f64,
    pub reason: String,
}

impl PeerLoss {
    pub fn now(peer: u16, reason: String) -> PeerLoss {
        PeerLoss {
            peer,
            at_unix_s: unix_now(),
            reason,
        }
    }
}

/// Resident memory of this process (Linux `/proc/self/statm`), bytes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PeerRejoin {
    pub peer: u16,
    pub at_unix_s: f64,
}

impl PeerRejoin {
    pub fn now(peer: u16) -> PeerRejoin {
        PeerRejoin {
            peer,
            at_unix_s: unix_now(),
        }
    }
}

pub fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// CPU seconds (user, system) this process has spent, all its threads.
pub fn cpu_times() -> (f64, f64) {
    // SAFETY: getrusage fills the struct we pass; a zeroed rusage is valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    (t(u.ru_utime), t(u.ru_stime))
}

/// Seconds since the Unix epoch (to compare times across processes).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
