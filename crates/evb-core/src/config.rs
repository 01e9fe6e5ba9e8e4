//! The configuration of an event builder: one TOML file read by `evb run`,
//! `evb node` and (later) `evb sim`. Every key and its default is documented
//! in `docs/config.md`; keep the two in step.
//!
//! Errors name the file, the line and the key. Values given with
//! `--set key=value` are applied after the file has been checked on its own,
//! so a bad override is reported against `--set`, not a made-up line.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where a configuration error was found, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// File name, or `--set` for command-line overrides, or `<default>`.
    pub origin: String,
    /// 1-based line in `origin`, when known.
    pub line: Option<usize>,
    /// Dotted key, e.g. `event_builder.credits`, when known.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.origin)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Writes a closed set's TOML spelling, so that messages and reports show
/// the value as the configuration names it.
macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// RUs send as soon as the EM has assigned the MEP.
    Push,
    /// The BU requests each fragment and the RU answers.
    Pull,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Time-slotted barrel shift: every RU follows one clock (the EM's,
    /// measured over the connections, or the hosts' own with `clock =
    /// "system"`); in slot S RU s ships to the BU its plan names for S,
    /// by default (s + S) mod B ([`crate::slots`]).
    Slotted,
    /// Barrel shift, phase-locked: phase n of RU i sends to BU (i + n) mod N
    /// and waits for that BU's MEP if it is not there yet, at most
    /// `barrel_wait_us` (then another BU is served out of turn); lost BUs
    /// are skipped; after the end of the run it no longer waits.
    Barrel,
    /// Barrel shift that never waits: when the phase's BU has nothing, the
    /// next one with work is served out of turn (the phase stays).
    #[serde(rename = "barrel-skip")]
    BarrelSkip,
    /// A seeded random destination among those with work.
    Random,
    /// Everything at once, no limit on transfers in flight.
    All,
}

/// Where the slotted barrel's schedule comes from when no
/// `schedule_file` names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotSchedule {
    /// Computed from the fabric's routes when the driver knows the fabric
    /// (`evb sim`; `evb run` and `evb node` with `--fabric`): the
    /// conflict-aware schedule `evb fabric schedule` writes. Else the
    /// barrel.
    Fabric,
    /// The plain barrel in node order, whatever the fabric.
    Barrel,
}

/// Which clock the slotted barrel follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClockSource {
    /// The EM's clock: every node measures its offset to it, and the
    /// rate at which that changes, over the connection it already has
    /// (NTP-style probes; [`crate::clock`]).
    Em,
    /// The node's own clock, trusted as synchronised (PTP on the cluster,
    /// or one host): no probes.
    System,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LocalTraffic {
    /// A node's RU hands fragments to its own BU in memory.
    Memory,
    /// A node's RU sends to its own BU through the transport like any other.
    Nic,
}

/// What an RU's readout writes for each MEP (`source.readout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Readout {
    /// As a readout board's DMA ring: the RU's MEP buffers are filled once
    /// (event sizes and data) and reused; per MEP only the event numbers
    /// are written (and the CRC computed when the fragment is one the BU
    /// checks). What the network question needs: the CPU touches little
    /// of the payload, as on a real node.
    Ring,
    /// Every MEP is written in full with fresh sizes and data (and its
    /// CRC): the memory-bandwidth question, what producing the data costs.
    Fresh,
}

/// What a BU checks of each fragment it receives (`event_builder.verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Ids, lengths and sequence: the fragment header (run, source, MEP,
    /// event count, length), the event-size table adding up to the
    /// length, and the first and last events carrying their numbers. What
    /// a production builder checks per fragment.
    Header,
    /// `header`, and the CRC-32C of one fragment in
    /// `event_builder.verify_sample` (chosen from source and MEP, so the RU
    /// computes the CRC only of those).
    Sample,
    /// `header`, and the CRC-32C of every fragment.
    Crc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SizeModel {
    Fixed,
    Normal,
    Histogram,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmPlacement {
    /// The EM runs inside node 0.
    Node0,
    /// The EM runs as its own process (endpoint N).
    Separate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// Count and verify built batches, keep nothing.
    Count,
    /// Write each built batch to a file in `output.directory`.
    File,
    /// Write each built batch as a checksummed object to the event store
    /// `output.store` (a directory, or `s3://bucket/prefix`).
    Store,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    pub run_id: u32,
    pub seed: u64,
    /// Seconds `evb run` builds before it stops and drains.
    pub duration_s: f64,
    /// Stop after this many MEPs have been assigned (0: no limit).
    pub max_meps: u64,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            run_id: 1,
            seed: 1,
            duration_s: 10.0,
            max_meps: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventBuilderSection {
    pub protocol: Protocol,
    pub schedule: Schedule,
    /// Transfers in flight per RU (PUSH) or requests in flight per BU (PULL).
    pub parallel_sends: u32,
    /// Batches a BU builds at once (credits it grants the EM).
    pub credits: u32,
    /// Phase-locked barrel: longest wait for the phase's MEP before another
    /// BU is served out of turn (bounds the stall a slow BU can cause).
    pub barrel_wait_us: u64,
    /// Slotted barrel: slot length, microseconds (0: from the fragment
    /// size and `sim.link_gbps`, see [`crate::slots::auto_slot_ns`]).
    pub slot_us: f64,
    /// Slotted barrel: time added to the auto slot so that jitter does not
    /// make two RUs overlap at one BU, microseconds.
    pub slot_grace_us: f64,
    /// Slotted barrel: a schedule file (one line per slot, the destination
    /// node of every node), relative to the configuration file; empty:
    /// `slot_schedule` decides.
    pub schedule_file: String,
    /// Slotted barrel without a schedule file: the fabric's schedule or
    /// the plain barrel.
    pub slot_schedule: SlotSchedule,
    /// Slotted barrel: the EM lengthens the slots when the RUs keep
    /// overrunning them, and brings them back when they no longer do
    /// ([`crate::adapt`]).
    pub adaptive_slots: bool,
    /// Slotted barrel: whose clock the slots follow.
    pub clock: ClockSource,
    /// `clock = "em"`: how often a node measures its offset to the EM's
    /// clock again (after a burst of probes at the start and probes every
    /// 1.25 ms until its skew is known), milliseconds.
    pub clock_probe_ms: u64,
    /// MEP assignments the EM collects before it tells the RUs, as runs
    /// (0: one per BU, so about one message to each RU per rotation of the
    /// barrel): its messages per MEP do not grow with the event builder,
    /// and come as one burst a rotation rather than many.
    pub assign_batch: u32,
    /// Longest an assignment waits in the EM for its batch to fill,
    /// microseconds.
    pub assign_flush_us: u64,
    pub local: LocalTraffic,
    /// A batch not complete this long after it was opened is incomplete.
    pub batch_timeout_ms: u64,
    /// After the end of the run, how long nodes may take to finish.
    pub drain_timeout_ms: u64,
    /// How long a node cut off from the EM (lost: dead, or a link down)
    /// waits for it to come back before it finishes what it holds and ends
    /// its run. Raise it where links may stay down for longer (a 24/7
    /// system whose EM or links are brought back by hand).
    pub em_lost_wait_ms: u64,
    /// Upper bound for any message body, checked before allocation.
    pub max_message_bytes: u64,
    /// With `source.mep_rate_hz`: MEPs the readout may hold that are not yet
    /// built (waiting for a BU, in flight or being built) before it is
    /// throttled; the RUs' buffer memory is this many MEP fragments.
    pub ru_buffer_meps: u32,
    /// Fixed buffer pools: each node allocates and touches at start every
    /// MEP and receive buffer its roles can need at the configured bounds,
    /// keeps them for the whole run and never grows past them (a MEP with
    /// no free buffer waits for one, counted). Off: buffers are allocated
    /// on demand and spares unused for 10-20 s are freed.
    pub preallocate_buffers: bool,
    /// Buffers of 1 MiB and more on transparent huge pages (2 MiB-aligned;
    /// one under 2 MiB takes a whole huge page): fewer pages for the copy
    /// between processes and the TLB to walk, more resident memory. Where the kernel has no
    /// THP they are ordinary pages.
    pub huge_pages: bool,
    /// MEP buffers of each RU: 0 (the default) as many as its BUs' credits
    /// can hold at once (docs/transports.md); fewer make MEPs wait for a
    /// buffer (a test of the readout's back-pressure).
    pub mep_buffers: u32,
    /// What a BU checks of each fragment (and so what the RU computes).
    pub verify: Verify,
    /// `verify = "sample"`: the CRC of one fragment in this many is checked.
    pub verify_sample: u32,
}

impl EventBuilderSection {
    /// Whether the CRC-32C of `source`'s fragment of `mep` is checked: the
    /// RU computes it (else the header's CRC is 0) and the BU compares.
    /// Both decide alone, from the configuration they share, so an RU
    /// computes no CRC that nobody checks. `sample` picks one fragment in
    /// `verify_sample` by a hash of (source, MEP): spread over sources and
    /// MEPs, none skipped for ever.
    pub fn crc_checked(&self, source: u16, mep: u64) -> bool {
        crc_checked(self.verify, self.verify_sample, source, mep)
    }
}

/// [`EventBuilderSection::crc_checked`] from the two keys alone.
pub fn crc_checked(verify: Verify, sample: u32, source: u16, mep: u64) -> bool {
    match verify {
        Verify::Crc => true,
        Verify::Header => false,
        Verify::Sample => {
            let h = crate::source::mix64(mep ^ (u64::from(source) << 48) ^ 0x0c5c_5a3f);
            h.is_multiple_of(u64::from(sample.max(1)))
        }
    }
}

impl Default for EventBuilderSection {
    fn default() -> Self {
        EventBuilderSection {
            protocol: Protocol::Push,
            schedule: Schedule::Slotted,
            parallel_sends: 2,
            credits: 3,
            barrel_wait_us: 1000,
            slot_us: 0.0,
            slot_grace_us: 0.5,
            schedule_file: String::new(),
            slot_schedule: SlotSchedule::Fabric,
            adaptive_slots: true,
            clock: ClockSource::Em,
            clock_probe_ms: 20,
            assign_batch: 0,
            assign_flush_us: 500,
            local: LocalTraffic::Memory,
            batch_timeout_ms: 2000,
            drain_timeout_ms: 10000,
            em_lost_wait_ms: 10000,
            max_message_bytes: 64 << 20,
            ru_buffer_meps: 16,
            preallocate_buffers: false,
            huge_pages: true,
            mep_buffers: 0,
            verify: Verify::Sample,
            verify_sample: 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceSection {
    /// Events packed in one MEP (packing factor).
    pub events_per_mep: u32,
    pub size: SizeModel,
    /// Fixed size, or mean of the normal distribution, per event fragment.
    pub mean_bytes: u32,
    /// Standard deviation of the normal distribution.
    pub std_bytes: u32,
    /// Histogram file (lines `size weight`), relative to the config file.
    pub histogram: String,
    /// Largest event fragment the source may produce (normal draws are clamped).
    pub max_fragment_bytes: u32,
    /// MEPs per second the readout delivers whether or not the event builder
    /// keeps up (0: a MEP is made whenever a BU has credit).
    pub mep_rate_hz: f64,
    /// What the readout writes per MEP: a DMA-like ring (`ring`) or fresh
    /// data (`fresh`).
    pub readout: Readout,
}

impl Default for SourceSection {
    fn default() -> Self {
        SourceSection {
            events_per_mep: 4096,
            size: SizeModel::Normal,
            mean_bytes: 256,
            std_bytes: 64,
            histogram: String::new(),
            max_fragment_bytes: 4096,
            mep_rate_hz: 0.0,
            readout: Readout::Ring,
        }
    }
}

/// `transport.progress`: how a node waits for its transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Progress {
    /// Sleeps on the library's wait object (right when processes outnumber
    /// cores).
    Blocking,
    /// Spins on progress (lowest latency with a core to spare).
    Busy,
}

impl Progress {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Progress::Blocking => "blocking",
            Progress::Busy => "busy",
        }
    }
}

display_as_str!(Progress);

/// `transport.kind`: the transport the nodes talk over, spelled in the
/// configuration as `auto`, `tcp`, `shm`, `mpi`, `ofi[:<provider>]` or
/// `ucx[:<UCX_TLS>]` (docs/transports.md), parsed once here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TransportKind {
    /// `evb run` picks: shared memory on one machine, TCP with an output
    /// network; a node started by hand takes TCP ([`TransportKind::on_node`]).
    Auto,
    Tcp,
    Shm,
    /// libfabric with a provider as users write it (`tcp`, `shm`, ...);
    /// `None`: `ofi` alone, which is libfabric's tcp provider.
    Ofi(Option<String>),
    /// UCX with an optional UCX_TLS value.
    Ucx(Option<String>),
    Mpi,
}

impl TransportKind {
    /// What a node runs for this kind: `auto` is TCP on a node (`evb run`
    /// resolves it before it starts them, and so does a node given no
    /// launcher).
    pub fn on_node(&self) -> TransportKind {
        match self {
            TransportKind::Auto => TransportKind::Tcp,
            kind => kind.clone(),
        }
    }

    /// libfabric's provider, for `ofi` and `ofi:<provider>`.
    pub fn ofi_provider(&self) -> Option<&str> {
        match self {
            TransportKind::Ofi(p) => Some(p.as_deref().unwrap_or("tcp")),
            _ => None,
        }
    }
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(kind: &str) -> Result<TransportKind, String> {
        Ok(match kind.split_once(':') {
            None if kind == "auto" => TransportKind::Auto,
            None if kind == "tcp" => TransportKind::Tcp,
            None if kind == "shm" => TransportKind::Shm,
            None if kind == "mpi" => TransportKind::Mpi,
            None if kind == "ucx" => TransportKind::Ucx(None),
            None if kind == "ofi" => TransportKind::Ofi(None),
            Some(("ofi", p)) if !p.is_empty() => TransportKind::Ofi(Some(p.into())),
            Some(("ucx", t)) if !t.is_empty() => TransportKind::Ucx(Some(t.into())),
            _ => {
                return Err(format!(
                    "unknown transport `{kind}` (one of auto, tcp, shm, ofi, ofi:<provider>, ucx, ucx:<UCX_TLS>, mpi)"
                ))
            }
        })
    }
}

impl TryFrom<String> for TransportKind {
    type Error = String;
    fn try_from(kind: String) -> Result<TransportKind, String> {
        kind.parse()
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportKind::Auto => f.write_str("auto"),
            TransportKind::Tcp => f.write_str("tcp"),
            TransportKind::Shm => f.write_str("shm"),
            TransportKind::Mpi => f.write_str("mpi"),
            TransportKind::Ofi(None) => f.write_str("ofi"),
            TransportKind::Ofi(Some(p)) => write!(f, "ofi:{p}"),
            TransportKind::Ucx(None) => f.write_str("ucx"),
            TransportKind::Ucx(Some(t)) => write!(f, "ucx:{t}"),
        }
    }
}

impl From<TransportKind> for String {
    fn from(kind: TransportKind) -> String {
        kind.to_string()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransportSection {
    pub kind: TransportKind,
    /// Interface nodes listen on.
    pub bind: String,
    /// 0: the OS picks ports (`evb run`); otherwise node i listens on base_port + i.
    pub base_port: u16,
    /// SO_SNDBUF / SO_RCVBUF for data connections (0: kernel default).
    pub socket_buffer_bytes: u32,
    /// `host:port` of every endpoint, for `evb node` without `evb run`.
    pub addresses: Vec<String>,
    /// A peer silent this long (no data, no heartbeat) is declared lost.
    pub peer_timeout_ms: u64,
    /// How often a node sends every peer a heartbeat, and judges their
    /// silence ([`crate::liveness`]).
    pub heartbeat_ms: u64,
    /// How a node waits for its transport: `blocking` sleeps on the
    /// library's wait object (right when processes outnumber cores),
    /// `busy` spins on progress (lowest latency with a core to spare).
    pub progress: Progress,
    /// `shm`: bytes of each sender-to-receiver ring (control messages and
    /// small fragments go through it; large payloads are copied once,
    /// straight from the sender's memory).
    pub shm_ring_bytes: u32,
    /// `shm`: large fragments are not copied at all: the RUs' MEP buffers
    /// live in shared memory and a BU builds in place from them (the local
    /// analogue of an RDMA read). Off: one copy, with process_vm_readv.
    pub shm_zero_copy: bool,
    /// `shm`: every inbox keeps its name in /dev/shm for the whole run, so
    /// that a restarted node can find its peers' and rejoin (`evb run`
    /// sets it in the configuration it gives its nodes when it plans
    /// restarts; then only it removes what a killed node leaves there).
    pub shm_rejoin: bool,
    /// A file holding the run key connections must prove (HMAC handshake);
    /// empty: the key from EVB_RUN_KEY if set (`evb run` sets a fresh one),
    /// else none.
    pub run_key_file: String,
    /// `ucx`: bodies of this many bytes and more go as their own contiguous
    /// message (zero-copy rendezvous) instead of one iov message with their
    /// header; 0 (the default): never (docs/transports.md).
    pub ucx_split_body_from: u64,
    /// `ucx` with `progress = "blocking"`: how long a wait that found
    /// nothing spins before it sleeps, microseconds (experimental; 0: no
    /// spinning).
    pub ucx_spin_us: u64,
}

impl Default for TransportSection {
    fn default() -> Self {
        TransportSection {
            kind: TransportKind::Auto,
            bind: "127.0.0.1".into(),
            base_port: 0,
            socket_buffer_bytes: 4 << 20,
            addresses: Vec::new(),
            peer_timeout_ms: 800,
            heartbeat_ms: 100,
            progress: Progress::Blocking,
            shm_ring_bytes: 1 << 20,
            shm_zero_copy: true,
            shm_rejoin: false,
            run_key_file: String::new(),
            ucx_split_body_from: 0,
            ucx_spin_us: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodesSection {
    pub count: u16,
    pub em: EmPlacement,
    /// Node indices that run only a Readout Unit.
    pub ru_only: Vec<u16>,
    /// Node indices that run only a Builder Unit.
    pub bu_only: Vec<u16>,
}

impl Default for NodesSection {
    fn default() -> Self {
        NodesSection {
            count: 4,
            em: EmPlacement::Node0,
            ru_only: Vec::new(),
            bu_only: Vec::new(),
        }
    }
}

/// How long a consumer is busy with one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusyModel {
    /// Exactly `consumer_busy_us`.
    Fixed,
    /// Exponentially distributed with mean `consumer_busy_us`.
    Exponential,
}

/// How a consumer process spends its busy time in `evb run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusyWait {
    /// Sleeps in its event loop until the busy time is over.
    Sleep,
    /// Spins (burns its core), like a real filter would.
    Spin,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSection {
    pub sink: SinkKind,
    pub directory: String,
    /// `sink = "store"`: a directory or `s3://bucket/prefix[?endpoint=..]`
    /// (credentials from the AWS_* environment); empty: `directory`.
    pub store: String,
    /// Filter Unit consumers the BUs hand built batches to (0: none; built
    /// batches go to the sink on the BU).
    pub consumers: u16,
    /// Batches each consumer accepts at once from each BU.
    pub consumer_credits: u32,
    /// Mean time a consumer is busy with one batch, microseconds (0: none).
    pub consumer_busy_us: u64,
    pub consumer_busy: BusyModel,
    /// `evb run`: how consumer processes spend their busy time.
    pub consumer_wait: BusyWait,
    /// `evb run`: passes a consumer's trigger makes over every byte of a
    /// batch (CRC-32C), on top of `consumer_busy_us`: a real processing
    /// cost, whose time is measured (0: none).
    pub consumer_work_passes: u32,
    /// Fraction of events a consumer accepts (its software trigger: a
    /// decision per event, drawn from the run seed and the event's number,
    /// so it replays). With `sink = "store"` and consumers, each consumer
    /// stores the events it accepted, one object per batch.
    pub accept_fraction: f64,
    /// Built batches a BU may hold for consumers after returning their
    /// credit to the EM; past that, batches keep their credit until they
    /// are delivered, which is how busy consumers stall the EM.
    pub bu_output_batches: u32,
    /// Batches that time out with fragments missing are still delivered,
    /// flagged partial (to the consumers, or to the file or store sink),
    /// with what did arrive; they count as incomplete all the same.
    pub deliver_partial: bool,
    /// The output network (`evb run`, `evb node` over TCP): this host's
    /// address on it, the BUs' second NIC and the consumers' network. The
    /// links to and from consumers listen and dial there; the event
    /// building stays on `transport`. Empty: no output network.
    pub bind: String,
    /// The same given as an interface name (its IPv4 address, else its
    /// first global IPv6 one): one setting for every host of a cluster.
    pub interface: String,
    /// `evb node` with `transport.addresses`: every endpoint's `host:port`
    /// on the output network, by endpoint.
    pub addresses: Vec<String>,
}

impl Default for OutputSection {
    fn default() -> Self {
        OutputSection {
            sink: SinkKind::Count,
            directory: "evb-out".into(),
            store: String::new(),
            consumers: 0,
            consumer_credits: 2,
            consumer_busy_us: 0,
            consumer_busy: BusyModel::Fixed,
            consumer_wait: BusyWait::Sleep,
            consumer_work_passes: 0,
            accept_fraction: 1.0,
            bu_output_batches: 4,
            deliver_partial: false,
            bind: String::new(),
            interface: String::new(),
            addresses: Vec::new(),
        }
    }
}

/// Prometheus metrics served by every node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Interface the metrics endpoints listen on.
    pub bind: String,
    /// 0: no metrics; otherwise endpoint i serves `/metrics` on base_port + i.
    pub base_port: u16,
    /// A node under a cluster launcher prints its periodic STATS lines too
    /// (by default only FINAL: ranks share the launcher's stdout), for when
    /// each rank's output is its own (`srun --output=evb-%t.out`).
    pub stats_lines: bool,
    /// Each node logs where its memory is (resident, heap, pools) every
    /// time it trims its pools: a diagnostic of memory growth.
    pub log_memory: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            bind: "127.0.0.1".into(),
            base_port: 0,
            stats_lines: false,
            log_memory: false,
        }
    }
}

/// `sim.traffic`: what the simulated hosts send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimTraffic {
    /// The event builder itself (EM, RUs, BUs, FUs).
    Eb,
    /// Barrel shift with a fixed message size.
    ShiftFixed,
    /// Barrel shift in windows with a quiet grace at each end.
    ShiftWindow,
    /// Random destinations at an offered load.
    Uniform,
    /// A fixed random permutation of the hosts.
    Permutation,
    /// Every host sends to one.
    Incast,
    /// Every host sends to every other.
    AllToAll,
}

impl SimTraffic {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            SimTraffic::Eb => "eb",
            SimTraffic::ShiftFixed => "shift-fixed",
            SimTraffic::ShiftWindow => "shift-window",
            SimTraffic::Uniform => "uniform",
            SimTraffic::Permutation => "permutation",
            SimTraffic::Incast => "incast",
            SimTraffic::AllToAll => "all-to-all",
        }
    }
}

/// `sim.granularity`: the unit the simulated links move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    /// Whole packets, virtual cut-through (the fast default).
    Packet,
    /// 64-byte flits.
    Flit,
}

impl Granularity {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Granularity::Packet => "packet",
            Granularity::Flit => "flit",
        }
    }
}

/// `sim.output.network`: where the consumers sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputNetwork {
    /// A network of its own, reached through the BUs' second NICs.
    Ethernet,
    /// Hosts of the event-building fabric: deliveries share the BUs' links.
    Fabric,
}

impl OutputNetwork {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputNetwork::Ethernet => "ethernet",
            OutputNetwork::Fabric => "fabric",
        }
    }
}

/// `sim.output.flow_control`: what a full output queue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowControl {
    /// Lossless: pause frames.
    Pfc,
    /// Drops, recovered by go-back-N retransmission.
    Lossy,
}

impl FlowControl {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowControl::Pfc => "pfc",
            FlowControl::Lossy => "lossy",
        }
    }
}

display_as_str!(SimTraffic, Granularity, OutputNetwork, FlowControl);

/// The simulated fabric and traffic (`evb sim`). Defaults are InfiniBand EDR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// Data rate of every link (after encoding), Gb/s.
    pub link_gbps: f64,
    /// Propagation latency of a link, ns.
    pub link_latency_ns: u64,
    /// Switch latency, input to output, ns.
    pub switch_latency_ns: u64,
    /// Largest packet payload, bytes.
    pub mtu_bytes: u32,
    /// Virtual lanes per port.
    pub vls: u8,
    /// Input buffer per port per VL, bytes (credits count 64-byte blocks).
    pub vl_buffer_bytes: u32,
    /// Relative weights of the VLs in the VL arbiter (empty: all equal).
    pub vl_weights: Vec<u32>,
    /// Host-side latency (PCIe + software) histogram file, lines `ns weight`;
    /// empty: a built-in EDR-like distribution around 1 us.
    pub host_latency: String,
    /// Simulated time, microseconds.
    pub duration_us: f64,
    /// Start of the run left out of the steady-state figures, microseconds
    /// (0: a fifth of the run, or two rotations of a slotted barrel if
    /// that is longer, at most half the run).
    pub warmup_us: f64,
    /// Traffic: eb, shift-fixed, shift-window, uniform, permutation, incast, all-to-all.
    pub traffic: SimTraffic,
    /// Message size of the synthetic traffic, bytes.
    pub message_bytes: u64,
    /// shift-window: length of a window, ns.
    pub window_ns: u64,
    /// shift-window: quiet time at the end of each window, ns.
    pub grace_ns: u64,
    /// uniform: offered load, fraction of the link rate.
    pub load: f64,
    /// Interval of the throughput time series, microseconds.
    pub sample_us: f64,
    /// `packet` (virtual cut-through, the fast default) or `flit` (64-byte flits).
    pub granularity: Granularity,
    /// MTU packets of one message moved as one unit of the model (their
    /// headers still counted one by one, their buffer space returned packet
    /// by packet): k times fewer events, the interleaving of messages on a
    /// link k times coarser. 1: every packet; 0 (auto): up to 8 for the
    /// slotted event builder on 128 hosts or more (one flow on a link at a
    /// time, where trains give the figures of single packets), else 1.
    pub train_packets: u32,
    /// InfiniBand hosts inject a message at its path's rate (the least
    /// link rate on its route, as the SA's path record gives it and an HCA
    /// applies as the QP's static rate); false: at their own link's rate,
    /// the excess queueing in the fabric's buffers.
    pub static_rate: bool,
    /// `eb` traffic: node `N` dies at `T` microseconds (`"N@T"`; empty:
    /// none): it stops, and the others find it by its silence (a
    /// [`FaultKind::Hang`](crate::fault::FaultKind::Hang)).
    #[serde(with = "crate::fault::sim_crash_spelling")]
    pub crash: Option<crate::fault::NodeFault>,
    /// With `crash`: the simulated nodes' peer timeout (what
    /// `transport.peer_timeout_ms` is to real ones, on the simulator's time
    /// scale), microseconds.
    pub peer_timeout_us: f64,
    /// With `crash`: how often the simulated nodes send heartbeats and
    /// judge their peers' silence, microseconds. Without `crash` the
    /// simulated nodes send no heartbeats (they would only add control
    /// messages to every figure).
    pub heartbeat_us: f64,
    /// The output network that carries built batches to the consumers.
    pub output: SimOutputSection,
    /// The hosts: what lies between a NIC and memory.
    pub host: SimHostSection,
}

/// `[sim.host]`: the part of a host between its NIC and its memory. Every
/// byte a NIC sends is read from memory over PCIe and every byte it
/// receives is written there (DMA), one direction each; a message from a
/// host to itself (`event_builder.local = "nic"`) never reaches the wire:
/// the NIC loops it back, reading and writing it over PCIe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimHostSection {
    /// Payload rate of a NIC's DMA per direction, Gb/s (0: the x16 slot
    /// of the PCIe generation a NIC of the host's link rate ships with,
    /// see [`SimHostSection::pcie_gbps_for`]).
    pub pcie_gbps: f64,
    /// A producer's (BU's) thread that serves the output network copies
    /// each batch once, at this rate, before its NIC may send it, one batch
    /// after the other, Gb/s (0: zero copy, the NIC reads the BU's buffers
    /// as evb's BU delivers).
    pub producer_copy_gbps: f64,
    /// Each host's clock runs fast or slow by a rate drawn uniformly within
    /// +- this many parts per million (from `run.seed`), as a crystal
    /// oscillator does (+-20 to +-100 ppm unsynchronized); 0: every host
    /// keeps the simulator's time.
    pub clock_ppm: f64,
    /// Each host's clock is ahead of the simulator's time by an offset
    /// drawn uniformly within 0 .. this many microseconds (from
    /// `run.seed`): NTP keeps hosts within ~100 us, PTP within ~1 us.
    pub clock_offset_us: f64,
}

impl Default for SimHostSection {
    fn default() -> Self {
        SimHostSection {
            pcie_gbps: 0.0,
            producer_copy_gbps: 0.0,
            clock_ppm: 0.0,
            clock_offset_us: 0.0,
        }
    }
}

impl SimHostSection {
    /// The DMA rate per direction of a host whose NIC runs at `link_gbps`:
    /// `pcie_gbps`, or (0) a x16 slot of PCIe Gen3 up to 100 Gb/s links
    /// (ConnectX-5 EDR), Gen4 up to 200 (ConnectX-6 HDR), Gen5 up to 400
    /// (ConnectX-7 NDR), Gen6 above: 16 lanes at 8/16/32/64 GT/s, less the
    /// line code (128b/130b) and the transaction layer's overhead on
    /// 256-byte payloads (24 bytes of header, sequence number and LCRC, and
    /// ~4 % for flow control and acknowledgements: 87.5 % in all), i.e.
    /// 110 / 221 / 441 / 882 Gb/s.
    pub fn pcie_gbps_for(&self, link_gbps: f64) -> f64 {
        if self.pcie_gbps > 0.0 {
            return self.pcie_gbps;
        }
        let gts = match link_gbps {
            l if l <= 100.0 => 8.0,
            l if l <= 200.0 => 16.0,
            l if l <= 400.0 => 32.0,
            _ => 64.0,
        };
        16.0 * gts * 128.0 / 130.0 * PCIE_EFFICIENCY
    }
}

/// What of a PCIe link's encoded rate carries payload: 256-byte TLP
/// payloads with 24 bytes of framing, header, sequence number and LCRC
/// (91.4 %), less the link's flow-control and ACK packets.
pub const PCIE_EFFICIENCY: f64 = 0.875;

/// `[sim.output]`: the network between the BUs' second NICs and the
/// consumers (the filter farm), an Ethernet network with RoCE v2 in the
/// reference design. Used when `output.consumers > 0`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimOutputSection {
    /// `ethernet`: a network of its own; `fabric`: the consumers are hosts
    /// of the event-building fabric and deliveries share the BUs' links.
    pub network: OutputNetwork,
    /// `switch` (one switch) or `fat-tree:radix=R[,...]` (an `evb-fabric`
    /// fat tree without `hosts`, routed by ftree).
    pub topology: String,
    /// Link rate of a producer's (BU's) second NIC, Gb/s.
    pub producer_gbps: f64,
    /// Link rate of a consumer, Gb/s.
    pub consumer_gbps: f64,
    /// Links between switches of a fat tree, Gb/s.
    pub uplink_gbps: f64,
    /// `pfc`: lossless, pause frames; `lossy`: a full output queue drops
    /// (go-back-N retransmission).
    pub flow_control: FlowControl,
    /// Switch buffer per port per priority, bytes (shallow: a 16 MB switch
    /// of 32 ports has 512 KiB a port).
    pub buffer_bytes: u32,
    /// Switch latency, ns.
    pub switch_latency_ns: u64,
    /// RoCE MTU, bytes.
    pub mtu_bytes: u32,
    /// `lossy`: retransmission timeout of a message whose last packet was
    /// lost, microseconds.
    pub rto_us: f64,
    /// Batches a producer's NIC sends at once, the others waiting in
    /// order (0: every delivery the consumers' credits allow, interleaved
    /// packet by packet).
    pub producer_messages: u32,
}

impl Default for SimOutputSection {
    fn default() -> Self {
        SimOutputSection {
            network: OutputNetwork::Ethernet,
            topology: "switch".into(),
            producer_gbps: 100.0,
            consumer_gbps: 100.0,
            uplink_gbps: 100.0,
            flow_control: FlowControl::Pfc,
            buffer_bytes: 512 * 1024,
            switch_latency_ns: 400,
            mtu_bytes: 4096,
            rto_us: 100.0,
            producer_messages: 0,
        }
    }
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            link_gbps: 100.0,
            link_latency_ns: 170,
            switch_latency_ns: 90,
            mtu_bytes: 4096,
            vls: 4,
            vl_buffer_bytes: 65536,
            vl_weights: Vec::new(),
            host_latency: String::new(),
            duration_us: 20000.0,
            warmup_us: 0.0,
            traffic: SimTraffic::Eb,
            message_bytes: 1 << 20,
            window_ns: 100_000,
            grace_ns: 5_000,
            load: 1.0,
            sample_us: 10.0,
            granularity: Granularity::Packet,
            train_packets: 0,
            static_rate: true,
            crash: None,
            peer_timeout_us: 100.0,
            heartbeat_us: 25.0,
            output: SimOutputSection::default(),
            host: SimHostSection::default(),
        }
    }
}

/// Faults injected on purpose, to test that they are detected and counted.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultsSection {
    /// Source (RU) index the faults below apply to.
    pub source: u16,
    /// MEPs whose fragment from `source` is corrupted after its CRC was computed.
    pub corrupt_meps: Vec<u64>,
    /// MEPs whose fragment from `source` is never sent.
    pub drop_meps: Vec<u64>,
}

/// One event builder, for the runtime and the simulator alike.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub run: RunSection,
    pub event_builder: EventBuilderSection,
    pub source: SourceSection,
    pub transport: TransportSection,
    pub nodes: NodesSection,
    pub output: OutputSection,
    pub metrics: MetricsSection,
    pub faults: FaultsSection,
    pub sim: SimSection,
    /// Histogram bins `(size, weight)` loaded from `source.histogram`.
    #[serde(skip)]
    pub histogram_bins: Vec<(u32, f64)>,
    /// Host latency bins `(ns, weight)` loaded from `sim.host_latency`.
    #[serde(skip)]
    pub host_latency_bins: Vec<(u32, f64)>,
    /// The slot schedule: loaded from `event_builder.schedule_file`, or
    /// computed from the fabric by a driver that knows it (`evb sim`, `evb
    /// run --fabric`).
    #[serde(skip)]
    pub slot_table: Option<std::sync::Arc<crate::slots::SlotTable>>,
    /// The link rate the slots are sized for, Gb/s, when a driver knows the
    /// fabric's (its slowest path between two nodes); else `sim.link_gbps`.
    #[serde(skip)]
    pub slot_gbps: Option<f64>,
    /// The nodes' own link rate, Gb/s, when a driver knows the fabric's
    /// (the most common one): how long a fragment takes on an RU's link;
    /// else `sim.link_gbps`.
    #[serde(skip)]
    pub node_gbps: Option<f64>,
}

/// An environment variable that overrides a configuration key: for a knob
/// one wants to turn for a whole shell or job (a benchmark sweep, a batch
/// script) without editing its TOML. [`Config::load`] applies them after
/// the file and before `--set`, which wins; nothing else reads them.
#[derive(Debug, Clone, Copy)]
pub struct EnvOverride {
    pub var: &'static str,
    pub key: &'static str,
    /// How the variable's value is written.
    pub form: EnvForm,
}

/// How an [`EnvOverride`]'s value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvForm {
    /// `0` or `1`.
    ZeroOrOne,
    /// Set (to anything) turns the key on.
    Presence,
    /// A whole number.
    Count,
    /// A byte count, or `never` (the key's 0).
    BytesOrNever,
}

/// Every environment variable that stands for a configuration key
/// (docs/config.md lists them; a test keeps the two in step).
pub const ENV_OVERRIDES: &[EnvOverride] = &[
    EnvOverride {
        var: "EVB_HUGEPAGES",
        key: "event_builder.huge_pages",
        form: EnvForm::ZeroOrOne,
    },
    EnvOverride {
        var: "EVB_MEP_BUFFERS",
        key: "event_builder.mep_buffers",
        form: EnvForm::Count,
    },
    EnvOverride {
        var: "EVB_UCX_SPLIT_BODY_FROM",
        key: "transport.ucx_split_body_from",
        form: EnvForm::BytesOrNever,
    },
    EnvOverride {
        var: "EVB_UCX_SPIN_US",
        key: "transport.ucx_spin_us",
        form: EnvForm::Count,
    },
    EnvOverride {
        var: "EVB_STATS_LINES",
        key: "metrics.stats_lines",
        form: EnvForm::ZeroOrOne,
    },
    EnvOverride {
        var: "EVB_MEMDEBUG",
        key: "metrics.log_memory",
        form: EnvForm::Presence,
    },
];

/// The `key=value` overrides the environment (read through `var`) asks for,
/// in the order of [`ENV_OVERRIDES`]; a value of the wrong form is an error
/// naming the variable and the key.
pub fn env_overrides(var: impl Fn(&str) -> Option<String>) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for o in ENV_OVERRIDES {
        let Some(raw) = var(o.var) else { continue };
        let v = raw.trim();
        let value = match o.form {
            EnvForm::Presence => Some("true".to_string()),
            EnvForm::ZeroOrOne => match v {
                "0" => Some("false".into()),
                "1" => Some("true".into()),
                _ => None,
            },
            EnvForm::Count => v.parse::<u64>().ok().map(|n| n.to_string()),
            EnvForm::BytesOrNever if v == "never" => Some("0".into()),
            EnvForm::BytesOrNever => v.parse::<u64>().ok().map(|n| n.to_string()),
        };
        let Some(value) = value else {
            let expected = match o.form {
                EnvForm::ZeroOrOne => "0 or 1",
                EnvForm::Count | EnvForm::Presence => "a whole number",
                EnvForm::BytesOrNever => "a byte count or `never`",
            };
            return Err(ConfigError {
                origin: format!("environment variable {}", o.var),
                line: None,
                key: Some(o.key.into()),
                message: format!("{}={raw:?}: expected {expected}", o.var),
            });
        };
        out.push(format!("{}={value}", o.key));
    }
    Ok(out)
}

/// The documented default configuration, as TOML.
pub const DEFAULT_TOML: &str = include_str!("../../../configs/default.toml");

impl Config {
    /// Reads `path`, applies `overrides` (`key=value`), validates.
    /// Whether the configuration file at `path` sets `key` (`section.key`)
    /// itself. A file that cannot be read or parsed sets nothing here
    /// ([`Config::load`] reports why).
    pub fn file_sets(path: Option<&Path>, key: &str) -> bool {
        let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
            return false;
        };
        let Ok(table) = text.parse::<toml::Table>() else {
            return false;
        };
        let mut value = Some(&toml::Value::Table(table));
        for part in key.split('.') {
            value = value.and_then(|v| v.get(part));
        }
        value.is_some()
    }

    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Config, ConfigError> {
        let (origin, text, base_dir) = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| ConfigError {
                    origin: p.display().to_string(),
                    line: None,
                    key: None,
                    message: format!("cannot read: {e}"),
                })?;
                let dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
                (p.display().to_string(), text, dir)
            }
            None => (
                "<default>".to_string(),
                DEFAULT_TOML.to_string(),
                PathBuf::new(),
            ),
        };
        // The environment's overrides first, so that `--set` wins over them.
        let mut all = env_overrides(|var| std::env::var(var).ok())?;
        all.extend_from_slice(overrides);
        Config::from_str_with_overrides(&origin, &text, &all, &base_dir)
    }

    /// Parses `text` (named `origin` in errors), applies overrides, validates.
    pub fn from_str_with_overrides(
        origin: &str,
        text: &str,
        overrides: &[String],
        base_dir: &Path,
    ) -> Result<Config, ConfigError> {
        // The file alone first, so that its errors carry its own line numbers.
        let mut config = parse(origin, text)?;
        config.validate(origin, text, base_dir)?;
        if overrides.is_empty() {
            return Ok(config);
        }
        let mut doc: toml_edit::DocumentMut =
            text.parse()
                .map_err(|e: toml_edit::TomlError| ConfigError {
                    origin: origin.into(),
                    line: None,
                    key: None,
                    message: e.to_string(),
                })?;
        for ov in overrides {
            apply_override(&mut doc, ov)?;
        }
        let merged = doc.to_string();
        config = parse("--set", &merged).map_err(|mut e| {
            e.line = None;
            e
        })?;
        config.validate("--set", "", base_dir)?;
        Ok(config)
    }

    /// The slotted barrel's slot length, ns.
    pub fn slot_ns(&self) -> u64 {
        if self.event_builder.slot_us > 0.0 {
            (self.event_builder.slot_us * 1000.0).round().max(1.0) as u64
        } else {
            crate::slots::auto_slot_ns(self, self.slot_link_gbps())
        }
    }

    /// The link rate the slots are sized for: the fabric's, when the
    /// driver knows it, else `sim.link_gbps`.
    pub fn slot_link_gbps(&self) -> f64 {
        self.slot_gbps.unwrap_or(self.sim.link_gbps)
    }

    /// A node's own link rate: the fabric's, when the driver knows it,
    /// else `sim.link_gbps`.
    pub fn node_link_gbps(&self) -> f64 {
        self.node_gbps.unwrap_or(self.sim.link_gbps)
    }

    /// MEPs the EM collects before it sends them as runs.
    pub fn assign_batch(&self) -> u32 {
        match self.event_builder.assign_batch {
            0 => (self.unit_counts().1 as u32).max(1),
            n => n,
        }
    }

    /// The links to and from the consumers run over the output network
    /// (`output.bind`, `output.interface` or `output.addresses`, with
    /// consumers).
    pub fn output_network(&self) -> bool {
        let o = &self.output;
        o.consumers > 0 && !(o.bind.is_empty() && o.interface.is_empty() && o.addresses.is_empty())
    }

    /// The output network's keys: addresses that parse, an interface name
    /// that can be one, one address per endpoint, and TCP.
    fn validate_output_network(&self) -> Result<(), (&'static str, String)> {
        let o = &self.output;
        if !o.bind.is_empty() && o.bind.parse::<std::net::IpAddr>().is_err() {
            return Err((
                "output.bind",
                format!(
                    "`{}` is not an IP address (this host's address on the output network, e.g. 10.1.0.5)",
                    o.bind
                ),
            ));
        }
        if !o.interface.is_empty() {
            let name = &o.interface;
            if name.len() > 15 || name.contains(['/', ':']) || name.contains(char::is_whitespace) {
                return Err((
                    "output.interface",
                    format!("`{name}` is not an interface name (at most 15 characters, no `/`, `:` or spaces)"),
                ));
            }
            if !o.bind.is_empty() {
                return Err((
                    "output.interface",
                    "set output.bind or output.interface, not both".into(),
                ));
            }
        }
        for (i, a) in o.addresses.iter().enumerate() {
            let ok = a
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok {
                return Err((
                    "output.addresses",
                    format!("entry {i}, `{a}`, is not host:port"),
                ));
            }
        }
        if !self.output_network() {
            return Ok(());
        }
        let endpoints = crate::Layout::from_config(self).endpoints as usize;
        if !o.addresses.is_empty() && o.addresses.len() != endpoints {
            return Err((
                "output.addresses",
                format!(
                    "{} entries but the run has {endpoints} endpoints (nodes, a separate EM, consumers)",
                    o.addresses.len()
                ),
            ));
        }
        if ![TransportKind::Auto, TransportKind::Tcp].contains(&self.transport.kind) {
            return Err((
                "transport.kind",
                format!(
                    "the output network (output.bind, output.interface, output.addresses) runs over tcp, not `{}`: set tcp or auto",
                    self.transport.kind
                ),
            ));
        }
        Ok(())
    }

    /// Number of Readout Units and Builder Units.
    pub fn unit_counts(&self) -> (usize, usize) {
        let n = self.nodes.count as usize;
        (n - self.nodes.bu_only.len(), n - self.nodes.ru_only.len())
    }

    /// Largest MEP fragment payload a source can produce, in bytes.
    pub fn max_fragment_payload(&self) -> u64 {
        let per_event = match self.source.size {
            SizeModel::Fixed => u64::from(self.source.mean_bytes),
            SizeModel::Normal => u64::from(self.source.max_fragment_bytes),
            SizeModel::Histogram => self
                .histogram_bins
                .iter()
                .map(|b| u64::from(b.0))
                .max()
                .unwrap_or(0),
        };
        u64::from(self.source.events_per_mep) * (4 + per_event)
    }

    /// Upper bound of the event data one node holds at once, in bytes: its
    /// RU's MEP fragments (credits of every BU, or the paced readout's
    /// buffer) and its BU's open batches and built batches awaiting
    /// consumers. What `evb run` checks against the machine's memory.
    pub fn node_memory_bound(&self) -> u64 {
        let (rus, bus) = self.unit_counts();
        let eb = &self.event_builder;
        let fragment = self.max_fragment_payload();
        let ru_meps = if self.source.mep_rate_hz > 0.0 {
            u64::from(eb.ru_buffer_meps)
        } else {
            u64::from(eb.credits) * bus as u64
        };
        let batches = u64::from(eb.credits)
            + if self.output.consumers > 0 {
                u64::from(self.output.bu_output_batches)
            } else {
                0
            };
        ru_meps
            .saturating_mul(fragment)
            .saturating_add(batches.saturating_mul(rus as u64).saturating_mul(fragment))
    }

    /// Largest payload of a built batch delivered to a consumer, in bytes.
    pub fn max_batch_payload(&self) -> u64 {
        let (rus, _) = self.unit_counts();
        crate::wire::batch_payload_len(rus, rus as u64 * self.max_fragment_payload())
    }

    /// Checks every key against the others, loads the files the
    /// configuration names (histograms, the slot schedule); the first
    /// error found names its key and, in `text`, its line.
    fn validate(&mut self, origin: &str, text: &str, base_dir: &Path) -> Result<(), ConfigError> {
        let err = |key: &str, message: String| ConfigError {
            origin: origin.into(),
            line: locate_key(text, key),
            key: Some(key.into()),
            message,
        };
        let checked = |r: Result<(), (&'static str, String)>| r.map_err(|(key, m)| err(key, m));
        checked(self.validate_units())?;
        checked(self.validate_timers())?;
        checked(self.validate_source())?;
        match self.source.size {
            SizeModel::Histogram => {
                if self.source.histogram.is_empty() {
                    return Err(err(
                        "source.histogram",
                        "size = \"histogram\" needs a histogram file".into(),
                    ));
                }
                let path = base_dir.join(&self.source.histogram);
                self.histogram_bins = load_histogram(&path, "source.histogram")?;
            }
            SizeModel::Normal if self.source.max_fragment_bytes < self.source.mean_bytes => {
                return Err(err(
                    "source.max_fragment_bytes",
                    "must be at least source.mean_bytes".into(),
                ));
            }
            _ => {}
        }
        let eb = &self.event_builder;
        let biggest = self.max_fragment_payload();
        if biggest + crate::wire::FRAGMENT_HEADER_LEN as u64 > eb.max_message_bytes {
            return Err(err(
                "source.events_per_mep",
                format!(
                    "a MEP fragment can reach {biggest} bytes, more than event_builder.max_message_bytes = {}",
                    eb.max_message_bytes
                ),
            ));
        }
        if !(self.run.duration_s.is_finite() && self.run.duration_s >= 0.0) {
            return Err(err(
                "run.duration_s",
                "must be a non-negative number of seconds".into(),
            ));
        }
        if !self.sim.host_latency.is_empty() {
            // Relative to the configuration file, like source.histogram.
            let path = base_dir.join(&self.sim.host_latency);
            self.host_latency_bins = load_histogram(&path, "sim.host_latency")?;
        }
        checked(self.validate_sim())?;
        checked(self.validate_sim_output())?;
        checked(self.validate_output())?;
        checked(self.validate_output_network())?;
        checked(self.validate_transport_and_slots())?;
        crate::slots::load_schedule(self, base_dir, &err)?;
        Ok(())
    }

    /// Units and their counts: credits, sends in flight, which node runs what.
    fn validate_units(&self) -> Result<(), (&'static str, String)> {
        let eb = &self.event_builder;
        if eb.credits == 0 {
            return Err(("event_builder.credits", "must be at least 1".into()));
        }
        if eb.parallel_sends == 0 {
            return Err(("event_builder.parallel_sends", "must be at least 1".into()));
        }
        if self.nodes.count == 0 {
            return Err(("nodes.count", "must be at least 1".into()));
        }
        let n = self.nodes.count;
        for (key, list) in [
            ("nodes.ru_only", &self.nodes.ru_only),
            ("nodes.bu_only", &self.nodes.bu_only),
        ] {
            if let Some(bad) = list.iter().find(|&&i| i >= n) {
                return Err((
                    key,
                    format!("node {bad} does not exist (nodes.count = {n})"),
                ));
            }
            // Duplicates would miscount the units (and underflow in
            // `unit_counts` when the list is longer than `nodes.count`).
            if let Some((_, twice)) = list
                .iter()
                .enumerate()
                .find(|&(k, i)| list[..k].contains(i))
            {
                return Err((key, format!("node {twice} is listed twice")));
            }
        }
        if let Some(both) = self
            .nodes
            .ru_only
            .iter()
            .find(|i| self.nodes.bu_only.contains(i))
        {
            return Err((
                "nodes.bu_only",
                format!("node {both} is also listed in nodes.ru_only"),
            ));
        }
        let (rus, bus) = self.unit_counts();
        if rus == 0 || bus == 0 {
            return Err((
                "nodes.ru_only",
                "the event builder needs at least one RU and one BU".into(),
            ));
        }
        let peers = match eb.protocol {
            Protocol::Push => bus,
            Protocol::Pull => rus,
        };
        if eb.schedule != Schedule::All && eb.parallel_sends as usize > peers {
            return Err((
                "event_builder.parallel_sends",
                format!(
                    "{} transfers in flight but only {peers} {} to send to",
                    eb.parallel_sends,
                    if eb.protocol == Protocol::Push {
                        "BUs"
                    } else {
                        "RUs"
                    }
                ),
            ));
        }
        Ok(())
    }

    /// Liveness timers and message bounds.
    fn validate_timers(&self) -> Result<(), (&'static str, String)> {
        let eb = &self.event_builder;
        if self.transport.heartbeat_ms == 0 {
            return Err(("transport.heartbeat_ms", "must be at least 1".into()));
        }
        if self.transport.peer_timeout_ms < 3 * self.transport.heartbeat_ms {
            return Err((
                "transport.peer_timeout_ms",
                format!(
                    "must be at least 3 heartbeats, {} (heartbeats go every transport.heartbeat_ms = {} ms)",
                    3 * self.transport.heartbeat_ms,
                    self.transport.heartbeat_ms
                ),
            ));
        }
        if eb.batch_timeout_ms == 0 {
            return Err((
                "event_builder.batch_timeout_ms",
                "must be at least 1".into(),
            ));
        }
        if eb.em_lost_wait_ms == 0 {
            return Err(("event_builder.em_lost_wait_ms", "must be at least 1".into()));
        }
        if eb.max_message_bytes < 64 || eb.max_message_bytes > u64::from(u32::MAX) {
            return Err((
                "event_builder.max_message_bytes",
                "must be between 64 B and 4 GiB".into(),
            ));
        }
        Ok(())
    }

    /// The source model and the readout's bounds (the histogram is loaded
    /// by `validate`).
    fn validate_source(&self) -> Result<(), (&'static str, String)> {
        let eb = &self.event_builder;
        if self.source.events_per_mep == 0 {
            return Err(("source.events_per_mep", "must be at least 1".into()));
        }
        if !(self.source.mep_rate_hz.is_finite() && (0.0..=1e9).contains(&self.source.mep_rate_hz))
        {
            return Err((
                "source.mep_rate_hz",
                "must be between 0 (unpaced) and 1e9 MEPs per second".into(),
            ));
        }
        if eb.ru_buffer_meps == 0 {
            return Err(("event_builder.ru_buffer_meps", "must be at least 1".into()));
        }
        if eb.verify_sample == 0 {
            return Err((
                "event_builder.verify_sample",
                "must be at least 1 (1: every fragment's CRC, as verify = \"crc\")".into(),
            ));
        }
        Ok(())
    }

    /// The simulated fabric (`[sim]`).
    /// `[sim.host]`: rates and clocks.
    fn validate_sim_host(&self) -> Result<(), (&'static str, String)> {
        let h = &self.sim.host;
        // Up to 10 % for a clock: that far off is a broken host, and the
        // simulator's conversion of deadlines stays exact well beyond.
        let checks: [(&'static str, f64, f64, &str); 4] = [
            ("sim.host.pcie_gbps", h.pcie_gbps, 1e6, "must be 0 (the PCIe x16 slot of the link's generation) or a rate in Gb/s up to 1e6"),
            ("sim.host.producer_copy_gbps", h.producer_copy_gbps, 1e6, "must be 0 (zero copy) or a rate in Gb/s up to 1e6"),
            ("sim.host.clock_ppm", h.clock_ppm, 100_000.0, "must be between 0 (ideal clocks) and 100000 ppm (10 %)"),
            ("sim.host.clock_offset_us", h.clock_offset_us, 1e9, "must be between 0 and 1e9 microseconds"),
        ];
        for (key, value, max, why) in checks {
            if !(value.is_finite() && (0.0..=max).contains(&value)) {
                return Err((key, why.into()));
            }
        }
        Ok(())
    }

    fn validate_sim(&self) -> Result<(), (&'static str, String)> {
        let sim = &self.sim;
        if !(sim.link_gbps.is_finite() && sim.link_gbps > 0.0) {
            return Err(("sim.link_gbps", "must be a positive number".into()));
        }
        self.validate_sim_host()?;
        if sim.mtu_bytes < 64 || sim.mtu_bytes > 1 << 20 {
            return Err(("sim.mtu_bytes", "must be between 64 and 1048576".into()));
        }
        if sim.vls == 0 || sim.vls > 15 {
            return Err(("sim.vls", "must be between 1 and 15".into()));
        }
        if u64::from(sim.vl_buffer_bytes) < u64::from(sim.mtu_bytes) + 64 {
            return Err((
                "sim.vl_buffer_bytes",
                "must hold at least one MTU-sized packet".into(),
            ));
        }
        if !sim.vl_weights.is_empty()
            && (sim.vl_weights.len() != sim.vls as usize || sim.vl_weights.contains(&0))
        {
            return Err(("sim.vl_weights", "needs one positive weight per VL".into()));
        }
        if !(sim.duration_us.is_finite() && sim.duration_us > 0.0) {
            return Err(("sim.duration_us", "must be a positive number".into()));
        }
        if !(sim.warmup_us.is_finite() && sim.warmup_us >= 0.0 && sim.warmup_us < sim.duration_us) {
            return Err((
                "sim.warmup_us",
                "must be from 0 (auto) to less than sim.duration_us".into(),
            ));
        }
        if !(sim.sample_us.is_finite() && sim.sample_us > 0.0) {
            return Err(("sim.sample_us", "must be a positive number".into()));
        }
        if !(sim.load.is_finite() && sim.load > 0.0 && sim.load <= 1.0) {
            return Err(("sim.load", "must be in (0, 1]".into()));
        }
        if sim.grace_ns >= sim.window_ns {
            return Err(("sim.grace_ns", "must be shorter than sim.window_ns".into()));
        }
        if sim.train_packets > 64
            || u64::from(sim.vl_buffer_bytes)
                < u64::from(sim.train_packets) * (u64::from(sim.mtu_bytes) + 64) + 64
        {
            return Err((
                "sim.train_packets",
                "must be 0 (auto) or from 1 to 64, and a train of that many MTU packets must fit sim.vl_buffer_bytes"
                    .into(),
            ));
        }
        if sim.message_bytes == 0 {
            return Err(("sim.message_bytes", "must be at least 1".into()));
        }
        if let Some(crate::fault::NodeFault { node, .. }) = sim.crash {
            let layout = crate::Layout::from_config(self);
            if node >= self.nodes.count {
                return Err((
                    "sim.crash",
                    format!("node {node} does not exist ({} nodes)", self.nodes.count),
                ));
            }
            if node == layout.em {
                return Err((
                    "sim.crash",
                    format!("node {node} hosts the EM, without which the run cannot go on"),
                ));
            }
        }
        if !(sim.heartbeat_us.is_finite() && sim.heartbeat_us >= 0.001) {
            return Err((
                "sim.heartbeat_us",
                "must be at least 0.001 (a nanosecond)".into(),
            ));
        }
        if !(sim.peer_timeout_us.is_finite() && sim.peer_timeout_us >= 3.0 * sim.heartbeat_us) {
            return Err((
                "sim.peer_timeout_us",
                format!(
                    "must be at least 3 heartbeats, {} (sim.heartbeat_us = {})",
                    3.0 * sim.heartbeat_us,
                    sim.heartbeat_us
                ),
            ));
        }
        Ok(())
    }

    /// The simulated output network (`[sim.output]`).
    fn validate_sim_output(&self) -> Result<(), (&'static str, String)> {
        let (sim, so) = (&self.sim, &self.sim.output);
        if so.topology != "switch" && !so.topology.starts_with("fat-tree:") {
            return Err((
                "sim.output.topology",
                format!(
                    "`{}`: must be `switch` or `fat-tree:radix=R[,...]`",
                    so.topology
                ),
            ));
        }
        if so
            .topology
            .split(',')
            .any(|kv| kv.trim_start_matches("fat-tree:").starts_with("hosts="))
        {
            return Err((
                "sim.output.topology",
                "takes no `hosts`: the producers and consumers are its hosts".into(),
            ));
        }
        for (key, v) in [
            ("sim.output.producer_gbps", so.producer_gbps),
            ("sim.output.consumer_gbps", so.consumer_gbps),
            ("sim.output.uplink_gbps", so.uplink_gbps),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1e5) {
                return Err((key, "must be a positive number of Gb/s".into()));
            }
        }
        if so.mtu_bytes < 256 || so.mtu_bytes > 9000 {
            return Err((
                "sim.output.mtu_bytes",
                "must be between 256 and 9000".into(),
            ));
        }
        // PFC needs room for a round trip of data after PAUSE is decided.
        let fastest = so.producer_gbps.max(so.consumer_gbps).max(so.uplink_gbps);
        let frame = f64::from(so.mtu_bytes + 200);
        let headroom =
            fastest / 8.0 * (2 * sim.link_latency_ns + so.switch_latency_ns) as f64 + 2.0 * frame;
        if f64::from(so.buffer_bytes) < headroom + 2.0 * frame {
            return Err((
                "sim.output.buffer_bytes",
                format!(
                    "{} bytes cannot hold PFC's headroom at {fastest} Gb/s ({headroom:.0} bytes) and two frames more",
                    so.buffer_bytes
                ),
            ));
        }
        if so.switch_latency_ns > 1_000_000 {
            return Err((
                "sim.output.switch_latency_ns",
                "must be at most 1 ms".into(),
            ));
        }
        if !(so.rto_us.is_finite() && so.rto_us > 0.0 && so.rto_us <= 1e7) {
            return Err((
                "sim.output.rto_us",
                "must be a positive number of microseconds, at most 10 s".into(),
            ));
        }
        Ok(())
    }

    /// Metrics ports, consumers and what they receive.
    fn validate_output(&self) -> Result<(), (&'static str, String)> {
        if self.metrics.base_port != 0
            && u32::from(self.metrics.base_port)
                + u32::from(self.nodes.count)
                + 1
                + u32::from(self.output.consumers)
                > 65535
        {
            return Err((
                "metrics.base_port",
                format!(
                    "base_port {} + {} endpoints runs past port 65535",
                    self.metrics.base_port,
                    u32::from(self.nodes.count) + 1 + u32::from(self.output.consumers)
                ),
            ));
        }
        let out = &self.output;
        if out.consumers > 0 && out.consumer_credits == 0 {
            return Err((
                "output.consumer_credits",
                "must be at least 1 when there are consumers".into(),
            ));
        }
        if out.consumer_busy_us > 3_600_000_000 {
            return Err((
                "output.consumer_busy_us",
                "must be at most one hour (3600000000 us)".into(),
            ));
        }
        if out.consumer_work_passes > 10_000 {
            return Err((
                "output.consumer_work_passes",
                "must be at most 10000 passes over each batch".into(),
            ));
        }
        if !(0.0..=1.0).contains(&out.accept_fraction) {
            return Err((
                "output.accept_fraction",
                format!("{} is not a fraction between 0 and 1", out.accept_fraction),
            ));
        }
        if out.consumers > 0 && self.event_builder.preallocate_buffers {
            return Err((
                "event_builder.preallocate_buffers",
                "is not supported with output.consumers yet (batches delivered to consumers \
                 are not pooled): turn one of them off"
                    .into(),
            ));
        }
        if out.consumers > 0 && out.sink == SinkKind::File {
            return Err((
                "output.sink",
                "`file` writes on the BU; with output.consumers the batches go to the consumers"
                    .into(),
            ));
        }
        if out.consumers > 0 {
            // Each fragment is within max_message_bytes; a batch of them
            // must still fit the 32-bit length of a frame.
            let batch = self.max_batch_payload() + crate::wire::FRAGMENT_HEADER_LEN as u64;
            if batch > u64::from(u32::MAX) {
                return Err((
                    "output.consumers",
                    format!(
                        "a built batch can reach {batch} bytes, more than a frame can carry (4 GiB): fewer nodes or smaller MEPs"
                    ),
                ));
            }
        }
        if u32::from(self.nodes.count) + 1 + u32::from(out.consumers) > u32::from(u16::MAX) {
            return Err((
                "output.consumers",
                "nodes.count + output.consumers must fit in 65534 endpoints".into(),
            ));
        }
        Ok(())
    }

    /// The shm ring and the slotted barrel's timing keys.
    fn validate_transport_and_slots(&self) -> Result<(), (&'static str, String)> {
        if !(1 << 16..=1 << 30).contains(&self.transport.shm_ring_bytes)
            || !self.transport.shm_ring_bytes.is_power_of_two()
        {
            return Err((
                "transport.shm_ring_bytes",
                "must be a power of two from 65536 to 1073741824".into(),
            ));
        }
        let eb = &self.event_builder;
        for (key, v) in [
            ("event_builder.slot_us", eb.slot_us),
            ("event_builder.slot_grace_us", eb.slot_grace_us),
        ] {
            if !(v.is_finite() && (0.0..=1e7).contains(&v)) {
                return Err((
                    key,
                    format!("{v} is not a number of microseconds from 0 to 10 s"),
                ));
            }
        }
        if !(1..=60_000).contains(&eb.clock_probe_ms) {
            return Err((
                "event_builder.clock_probe_ms",
                "must be from 1 to 60000 ms".into(),
            ));
        }
        if eb.assign_flush_us > 10_000_000 {
            return Err((
                "event_builder.assign_flush_us",
                "must be at most 10 s (10000000 us)".into(),
            ));
        }
        if eb.assign_batch > 1 << 20 {
            return Err((
                "event_builder.assign_batch",
                "must be at most 1048576 MEPs".into(),
            ));
        }
        Ok(())
    }
}

fn parse(origin: &str, text: &str) -> Result<Config, ConfigError> {
    toml::from_str::<Config>(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let key = line.and_then(|l| key_at_line(text, l));
        ConfigError {
            origin: origin.into(),
            line,
            key,
            message: e.message().trim().to_string(),
        }
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The dotted key defined on 1-based `line`, reconstructed from the nearest
/// table header above it.
fn key_at_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let this = lines.get(line - 1)?.trim();
    let table = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(table_name);
    if this.starts_with('[') {
        return Some(table_name(this));
    }
    let key = this.split('=').next()?.trim();
    if key.is_empty() {
        return None;
    }
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

/// The name in a `[table]` header line, without a comment after it.
fn table_name(header: &str) -> String {
    let inner = header.trim_start_matches('[');
    inner.split(']').next().unwrap_or(inner).trim().to_string()
}

/// 1-based line where dotted `key` is set in `text`, if it is.
pub fn locate_key(text: &str, key: &str) -> Option<usize> {
    let doc: toml_edit::ImDocument<&str> = toml_edit::ImDocument::parse(text).ok()?;
    let mut parts = key.split('.');
    let first = parts.next()?;
    let mut item = doc.as_table().get(first)?;
    let mut span = item.span();
    for part in parts {
        let table = item.as_table_like()?;
        let (k, v) = table.get_key_value(part)?;
        span = k.span().or(v.span());
        item = v;
    }
    span.map(|s| line_of(text, s.start))
}

fn apply_override(doc: &mut toml_edit::DocumentMut, ov: &str) -> Result<(), ConfigError> {
    let bad = |key: Option<String>, message: String| ConfigError {
        origin: "--set".into(),
        line: None,
        key,
        message,
    };
    let (key, raw) = ov
        .split_once('=')
        .ok_or_else(|| bad(None, format!("`{ov}` is not of the form key=value")))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    // section.key, or section.table.key (e.g. sim.output.buffer_bytes).
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
        return Err(bad(
            Some(key.into()),
            "keys are written section.key, e.g. event_builder.credits".into(),
        ));
    }
    // A TOML value if it parses as one, else a plain string.
    let value: toml_edit::Value = raw
        .trim()
        .parse()
        .unwrap_or_else(|_| toml_edit::Value::from(raw.trim()));
    let (last, tables) = parts.split_last().expect("two or three parts");
    let mut table = doc.as_table_mut() as &mut dyn toml_edit::TableLike;
    for (i, name) in tables.iter().enumerate() {
        table = table
            .entry(name)
            .or_insert(toml_edit::table())
            .as_table_like_mut()
            .ok_or_else(|| {
                bad(
                    Some(key.into()),
                    format!("`{}` is not a section", tables[..=i].join(".")),
                )
            })?;
    }
    table.insert(last, toml_edit::Item::Value(value));
    Ok(())
}

/// Reads a fragment-size histogram: one `size weight` pair per line, `#`
/// comments. Sizes in bytes, weights relative.
pub fn load_histogram(path: &Path, key: &str) -> Result<Vec<(u32, f64)>, ConfigError> {
    use std::io::Read;
    const MAX_BYTES: u64 = 16 << 20;
    let origin = path.display().to_string();
    let fail = |message: String| ConfigError {
        origin: origin.clone(),
        line: None,
        key: Some(key.into()),
        message,
    };
    // Bounded: a histogram naming /dev/zero or a huge file is an error, not
    // a hang or an exhausted memory.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| fail(format!("cannot read histogram: {e}")))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(fail(format!(
            "histogram file larger than {} MiB",
            MAX_BYTES >> 20
        )));
    }
    let mut bins = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |m: &str| ConfigError {
            origin: origin.clone(),
            line: Some(i + 1),
            key: None,
            message: format!("{m}: expected `size weight`, got `{line}`"),
        };
        let mut it = line.split_whitespace();
        let size: u32 = it
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad size"))?;
        let weight: f64 = it
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|w: &f64| w.is_finite() && *w >= 0.0)
            .ok_or_else(|| bad("bad weight"))?;
        if it.next().is_some() {
            return Err(bad("trailing text"));
        }
        bins.push((size, weight));
    }
    if bins.iter().map(|b| b.1).sum::<f64>() <= 0.0 {
        return Err(ConfigError {
            origin,
            line: None,
            key: Some(key.into()),
            message: "histogram has no bin with positive weight".into(),
        });
    }
    Ok(bins)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, overrides: &[&str]) -> Result<Config, ConfigError> {
        let ov: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Config::from_str_with_overrides("test.toml", text, &ov, Path::new("."))
    }

    #[test]
    fn default_file_is_the_default_struct() {
        let parsed = load(DEFAULT_TOML, &[]).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = load("[run]\nseed = 3\n\n[event_builder]\ncredit = 2\n", &[]).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert_eq!(e.key.as_deref(), Some("event_builder.credit"), "{e}");
        assert!(
            e.to_string()
                .starts_with("test.toml:5: key `event_builder.credit`"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_names_key_and_line() {
        let e = load("[event_builder]\n\ncredits = \"two\"\n", &[]).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.key.as_deref(), Some("event_builder.credits"));
    }

    #[test]
    fn impossible_values_name_key_and_line() {
        let e = load("[event_builder]\nprotocol = \"push\"\ncredits = 0\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(3), Some("event_builder.credits"))
        );
        let e = load(
            "[nodes]\ncount = 2\n[event_builder]\nparallel_sends = 3\n",
            &[],
        )
        .unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(4), Some("event_builder.parallel_sends"))
        );
        let e = load("[source]\nevents_per_mep = 100000000\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("source.events_per_mep"), "{e}");
        let e = load("[event_builder]\n\nem_lost_wait_ms = 0\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(3), Some("event_builder.em_lost_wait_ms"))
        );
        let e = load("[sim.host]\nclock_ppm = 200000\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("sim.host.clock_ppm"))
        );
        let e = load("[sim.host]\nclock_offset_us = -1\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.host.clock_offset_us"), "{e}");
    }

    #[test]
    fn the_peer_timeout_spans_at_least_three_heartbeats() {
        let e = load("[transport]\nheartbeat_ms = 0\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("transport.heartbeat_ms"), "{e}");
        let e = load("[transport]\npeer_timeout_ms = 299\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("transport.peer_timeout_ms"), "{e}");
        assert!(e.message.contains("300"), "{e}");
        let c = load(
            "[transport]\nheartbeat_ms = 10\npeer_timeout_ms = 30\n",
            &[],
        )
        .unwrap();
        assert_eq!(
            (c.transport.heartbeat_ms, c.transport.peer_timeout_ms),
            (10, 30)
        );
        let e = load("[sim]\npeer_timeout_us = 50.0\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.peer_timeout_us"), "{e}");
        let e = load("[sim]\nheartbeat_us = 0.0\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.heartbeat_us"), "{e}");
    }

    /// A fake environment of `pairs`.
    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn environment_variables_override_their_keys_and_set_wins() {
        assert!(env_overrides(env(&[])).unwrap().is_empty());
        let ov = env_overrides(env(&[
            ("EVB_HUGEPAGES", "0"),
            ("EVB_MEP_BUFFERS", "2"),
            ("EVB_UCX_SPLIT_BODY_FROM", "never"),
            ("EVB_UCX_SPIN_US", "50"),
            ("EVB_STATS_LINES", "1"),
            ("EVB_MEMDEBUG", ""),
            ("EVB_NOT_A_KNOB", "1"),
        ]))
        .unwrap();
        let mut all: Vec<&str> = ov.iter().map(String::as_str).collect();
        let c = load("", &all).unwrap();
        assert!(!c.event_builder.huge_pages);
        assert_eq!(c.event_builder.mep_buffers, 2);
        assert_eq!(c.transport.ucx_split_body_from, 0);
        assert_eq!(c.transport.ucx_spin_us, 50);
        assert!(c.metrics.stats_lines && c.metrics.log_memory);
        // `--set` comes after the environment: it wins.
        all.push("event_builder.mep_buffers=5");
        assert_eq!(load("", &all).unwrap().event_builder.mep_buffers, 5);
        let ov = env_overrides(env(&[("EVB_UCX_SPLIT_BODY_FROM", "65536")])).unwrap();
        assert_eq!(ov, ["transport.ucx_split_body_from=65536"]);
        for (var, bad) in [
            ("EVB_HUGEPAGES", "yes"),
            ("EVB_MEP_BUFFERS", "two"),
            ("EVB_UCX_SPLIT_BODY_FROM", "lots"),
            ("EVB_UCX_SPIN_US", "-1"),
        ] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(vec![(var, bad)].into_boxed_slice());
            let e = env_overrides(env(pairs)).unwrap_err();
            let key = ENV_OVERRIDES.iter().find(|o| o.var == var).unwrap().key;
            assert_eq!(e.key.as_deref(), Some(key), "{e}");
            assert!(e.to_string().contains(&format!("{var}=\"{bad}\"")), "{e}");
        }
    }

    #[test]
    fn every_environment_override_names_a_key_and_is_documented() {
        let docs = include_str!("../../../docs/config.md");
        let keys = toml::to_string(&Config::default()).unwrap();
        for o in ENV_OVERRIDES {
            let (section, key) = o.key.split_once('.').unwrap();
            let table: toml::Table = toml::from_str(&keys).unwrap();
            assert!(table[section].get(key).is_some(), "{} is no key", o.key);
            assert!(
                docs.contains(&format!("| `{}` | `{}` |", o.var, o.key)),
                "docs/config.md does not list {} -> {}",
                o.var,
                o.key
            );
        }
    }

    #[test]
    fn overrides_apply_and_are_checked() {
        let c = load(
            "[event_builder]\ncredits = 3\n",
            &["event_builder.credits=5", "event_builder.protocol=pull"],
        )
        .unwrap();
        assert_eq!(c.event_builder.credits, 5);
        assert_eq!(c.event_builder.protocol, Protocol::Pull);
        let e = load("", &["event_builder.credits=0"]).unwrap_err();
        assert_eq!(e.origin, "--set");
        assert_eq!(e.key.as_deref(), Some("event_builder.credits"));
        let e = load("", &["event_builder.nope=1"]).unwrap_err();
        assert_eq!(e.origin, "--set");
        let e = load("", &["credits"]).unwrap_err();
        assert!(e.message.contains("key=value"), "{e}");
        // A commented table header (as the example config has) still names
        // the key cleanly.
        let text = "[sim]   # the simulated fabric\nnope = 1\n";
        let e = load(text, &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.nope"), "{e}");
        let e = load(
            text.replace("nope = 1", "vls = 2").as_str(),
            &["sim.nope=1"],
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.nope"), "{e}");
    }

    #[test]
    fn readout_and_verification_keys_are_checked() {
        let d = Config::default();
        assert_eq!(d.source.readout, Readout::Ring);
        assert_eq!(d.event_builder.verify, Verify::Sample);
        assert_eq!(d.event_builder.verify_sample, 64);
        assert!(d.transport.shm_zero_copy);
        let c = load(
            "[source]\nreadout = \"fresh\"\n[event_builder]\nverify = \"crc\"\n",
            &["transport.shm_zero_copy=false"],
        )
        .unwrap();
        assert_eq!(c.source.readout, Readout::Fresh);
        assert_eq!(c.event_builder.verify, Verify::Crc);
        assert!(!c.transport.shm_zero_copy);
        let e = load("[source]\nmean_bytes = 200\nreadout = \"dma\"\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(3), Some("source.readout")),
            "{e}"
        );
        let e = load("[event_builder]\nverify = \"md5\"\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("event_builder.verify"))
        );
        let e = load("[event_builder]\ncredits = 2\nverify_sample = 0\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(3), Some("event_builder.verify_sample"))
        );
        let e = load("", &["event_builder.verify_sample=0"]).unwrap_err();
        assert_eq!(
            (e.origin.as_str(), e.key.as_deref()),
            ("--set", Some("event_builder.verify_sample"))
        );
        let e = load("[transport]\nshm_zero_copy = 1\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("transport.shm_zero_copy"), "{e}");
    }

    #[test]
    fn output_network_keys_are_checked_and_named() {
        let text = "[sim.output]\nconsumer_gbps = 25\nflow_control = \"lossy\"\n";
        let c = load(text, &["sim.output.buffer_bytes=262144"]).unwrap();
        assert_eq!(c.sim.output.consumer_gbps, 25.0);
        assert_eq!(c.sim.output.flow_control, FlowControl::Lossy);
        assert_eq!(c.sim.output.buffer_bytes, 262144);
        assert_eq!(c.sim.output.network, OutputNetwork::Ethernet, "the default");
        let e = load("[sim.output]\nflow_control = \"xon\"\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("sim.output.flow_control")),
            "{e}"
        );
        let e = load("", &["sim.output.network=shared"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.output.network"), "{e}");
        // PFC needs room for a round trip at the fastest link.
        let e = load("", &["sim.output.buffer_bytes=8192"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.output.buffer_bytes"), "{e}");
        assert!(e.message.contains("headroom"), "{e}");
        let e = load("", &["sim.output.topology=\"fat-tree:radix=8,hosts=4\""]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.output.topology"), "{e}");
        let e = load("", &["sim.output.consumer_gbps=0"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.output.consumer_gbps"), "{e}");
        let e = load("[sim.output]\nnope = 1\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.output.nope"), "{e}");
        // Four parts is no key of ours.
        let e = load("", &["sim.output.x.y=1"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.output.x.y"), "{e}");
    }

    /// Each closed set of values round-trips through its TOML spelling, and
    /// an unknown value is reported with the file, the line, the key and the
    /// values allowed.
    #[test]
    fn closed_sets_round_trip_and_name_the_key() {
        let cases: Vec<(&str, Vec<String>)> = vec![
            (
                "sim.traffic",
                [
                    SimTraffic::Eb,
                    SimTraffic::ShiftFixed,
                    SimTraffic::ShiftWindow,
                    SimTraffic::Uniform,
                    SimTraffic::Permutation,
                    SimTraffic::Incast,
                    SimTraffic::AllToAll,
                ]
                .iter()
                .map(ToString::to_string)
                .collect(),
            ),
            (
                "sim.granularity",
                [Granularity::Packet, Granularity::Flit]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            ),
            (
                "sim.output.network",
                [OutputNetwork::Ethernet, OutputNetwork::Fabric]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            ),
            (
                "sim.output.flow_control",
                [FlowControl::Pfc, FlowControl::Lossy]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            ),
            (
                "transport.progress",
                [Progress::Blocking, Progress::Busy]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            ),
        ];
        let value_of = |c: &Config, key: &str| match key {
            "sim.traffic" => c.sim.traffic.to_string(),
            "sim.granularity" => c.sim.granularity.to_string(),
            "sim.output.network" => c.sim.output.network.to_string(),
            "transport.progress" => c.transport.progress.to_string(),
            _ => c.sim.output.flow_control.to_string(),
        };
        for (key, values) in &cases {
            for value in values {
                let c = load("", &[&format!("{key}=\"{value}\"")]).unwrap();
                assert_eq!(&value_of(&c, key), value);
                // Written back, the value reads the same.
                let again: Config = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
                assert_eq!(again, c, "{key} = {value}");
            }
            let (table, name) = key.rsplit_once('.').unwrap();
            let text = format!("[{table}]\n{name} = \"nope\"\n");
            let e = load(&text, &[]).unwrap_err();
            assert_eq!((e.line, e.key.as_deref()), (Some(2), Some(*key)), "{e}");
            assert!(e.message.contains("nope"), "{e}");
            for value in values {
                assert!(e.message.contains(&format!("`{value}`")), "{e}");
            }
            let e = load("", &[&format!("{key}=nope")]).unwrap_err();
            assert_eq!((e.origin.as_str(), e.key.as_deref()), ("--set", Some(*key)));
        }
    }

    #[test]
    fn transport_kind_is_parsed_once_and_keeps_its_spelling() {
        for (text, kind) in [
            ("auto", TransportKind::Auto),
            ("tcp", TransportKind::Tcp),
            ("shm", TransportKind::Shm),
            ("mpi", TransportKind::Mpi),
            ("ofi", TransportKind::Ofi(None)),
            ("ofi:shm", TransportKind::Ofi(Some("shm".into()))),
            ("ucx", TransportKind::Ucx(None)),
            ("ucx:tcp,self", TransportKind::Ucx(Some("tcp,self".into()))),
        ] {
            let c = load(&format!("[transport]\nkind = \"{text}\"\n"), &[]).unwrap();
            assert_eq!(c.transport.kind, kind, "{text}");
            // Written back (a launcher hands its nodes the config) as read.
            assert_eq!(c.transport.kind.to_string(), text);
            let back: Config = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
            assert_eq!(back.transport.kind, kind, "{text}");
        }
        assert_eq!(TransportKind::Ofi(None).ofi_provider(), Some("tcp"));
        assert_eq!(TransportKind::Auto.on_node(), TransportKind::Tcp);
        for bad in ["carrier-pigeon", "ofi:", "ucx:", "tcp:x", ""] {
            let e = load(&format!("\n[transport]\nkind = \"{bad}\"\n"), &[]).unwrap_err();
            assert_eq!(
                (e.line, e.key.as_deref()),
                (Some(3), Some("transport.kind")),
                "{bad}: {e}"
            );
            assert!(e.message.contains("unknown transport"), "{e}");
        }
        let e = load("", &["transport.kind=pigeon"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("transport.kind"), "{e}");
    }

    #[test]
    fn runtime_output_network_keys_are_checked_and_named() {
        let c = load(
            "[output]\nconsumers = 2\nbind = \"10.1.0.5\"\n",
            &["transport.kind=tcp"],
        )
        .unwrap();
        assert!(c.output_network());
        // Without consumers the keys are unused.
        let c = load("[output]\nbind = \"10.1.0.5\"\n", &[]).unwrap();
        assert!(!c.output_network());
        let e = load("[output]\nconsumers = 2\nbind = \"10.1.0.300\"\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(3), Some("output.bind")),
            "{e}"
        );
        assert!(e.message.contains("10.1.0.300"), "{e}");
        // An address that does not parse is an error with or without consumers.
        let e = load("", &["output.bind=eth1"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.bind"), "{e}");
        let e = load("", &["output.interface=\"eth 1\""]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.interface"), "{e}");
        let e = load("", &["output.interface=eth1", "output.bind=10.0.0.1"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.interface"), "{e}");
        assert!(e.message.contains("not both"), "{e}");
        let e = load("", &["output.addresses=[\"10.0.0.1\"]"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.addresses"), "{e}");
        assert!(e.message.contains("`10.0.0.1`"), "{e}");
        // One address per endpoint: 4 nodes and 2 consumers.
        let e = load(
            "",
            &["output.consumers=2", "output.addresses=[\"10.0.0.1:7000\"]"],
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.addresses"), "{e}");
        assert!(e.message.contains("6 endpoints"), "{e}");
        // TCP only.
        let e = load(
            "",
            &[
                "output.consumers=2",
                "output.bind=10.0.0.1",
                "transport.kind=ucx",
            ],
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("transport.kind"), "{e}");
    }

    #[test]
    fn consumer_keys_are_checked() {
        let c = load(
            "[output]\nconsumers = 3\nconsumer_busy = \"exponential\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.output.consumers, 3);
        assert_eq!(c.output.consumer_busy, BusyModel::Exponential);
        let e = load("[output]\nconsumers = 2\nconsumer_credits = 0\n", &[]).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(3), Some("output.consumer_credits"))
        );
        let e = load("[output]\nconsumer_busy = \"gamma\"\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.consumer_busy"), "{e}");
        let e = load("", &["output.consumers=2", "output.sink=file"]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.sink"), "{e}");
        let e = load(
            "",
            &[
                "output.consumers=1",
                "nodes.count=300",
                "source.max_fragment_bytes=1000000",
                "source.events_per_mep=60",
            ],
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("output.consumers"), "{e}");
    }

    #[test]
    fn preallocate_buffers_is_checked() {
        let c = load("[event_builder]\npreallocate_buffers = true\n", &[]).unwrap();
        assert!(c.event_builder.preallocate_buffers);
        assert!(!Config::default().event_builder.preallocate_buffers);
        let e = load("[event_builder]\npreallocate_buffers = 1\n", &[]).unwrap_err();
        assert_eq!(
            e.key.as_deref(),
            Some("event_builder.preallocate_buffers"),
            "{e}"
        );
        let e = load(
            "",
            &[
                "event_builder.preallocate_buffers=true",
                "output.consumers=1",
            ],
        )
        .unwrap_err();
        assert_eq!(
            e.key.as_deref(),
            Some("event_builder.preallocate_buffers"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_node_lists_are_rejected() {
        // Found reviewing for the config_parse fuzz target: used to underflow
        // in `unit_counts` (1 node, 2 BU-only entries).
        let e = load("[nodes]\ncount = 1\nbu_only = [0, 0]\n", &[]).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("nodes.bu_only"), "{e}");
        assert!(e.message.contains("listed twice"), "{e}");
        let e = load("[nodes]\ncount = 4\nru_only = [3, 3]\n", &[]).unwrap_err();
        assert_eq!((e.line, e.key.as_deref()), (Some(3), Some("nodes.ru_only")));
    }

    #[test]
    fn named_files_are_bounded_and_relative_to_the_config() {
        let e = load("", &["source.size=histogram", "source.histogram=/dev/zero"]).unwrap_err();
        assert!(e.message.contains("larger than 16 MiB"), "{e}");
        let dir = std::env::temp_dir().join(format!("evb-lat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("lat.txt"), "1000 1\n2000 3\n").unwrap();
        let ov = vec!["sim.host_latency=lat.txt".to_string()];
        let c = Config::from_str_with_overrides("t.toml", "", &ov, &dir).unwrap();
        assert_eq!(c.host_latency_bins, vec![(1000, 1.0), (2000, 3.0)]);
        let e = Config::from_str_with_overrides("t.toml", "", &ov, Path::new("/nonexistent"))
            .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("sim.host_latency"), "{e}");
    }

    #[test]
    fn histogram_file_errors_name_line() {
        let dir = std::env::temp_dir().join(format!("evb-hist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("h.txt"), "# size weight\n100 1\n200 x\n").unwrap();
        let ov = vec![
            "source.size=histogram".to_string(),
            "source.histogram=h.txt".to_string(),
        ];
        let e = Config::from_str_with_overrides("t.toml", "", &ov, &dir).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.origin.ends_with("h.txt"));
        std::fs::write(dir.join("h.txt"), "100 1\n300 3\n").unwrap();
        let c = Config::from_str_with_overrides("t.toml", "", &ov, &dir).unwrap();
        assert_eq!(c.histogram_bins, vec![(100, 1.0), (300, 3.0)]);
    }
}
