//! What an `evb bench` worker reports to the command that started it (its
//! `RESULT` line, and `result-<rank>.json` under a cluster launcher).

use serde::{Deserialize, Serialize};

/// One size's figures from one worker.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SizeResult {
    pub size: usize,
    /// Bytes this worker received in the bandwidth phase, and over how long.
    pub rx_bytes: u64,
    pub rx_seconds: f64,
    pub rx_gbps: f64,
    pub tx_bytes: u64,
    /// CPU seconds (user + system) this worker spent in the phase, and
    /// the two apart.
    pub cpu_s: f64,
    #[serde(default)]
    pub cpu_user_s: f64,
    #[serde(default)]
    pub cpu_system_s: f64,
    /// One-way latency from the ping-pong (rank 0 only), microseconds.
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
}

/// What a worker reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkerResult {
    pub rank: u16,
    pub transport: String,
    pub sizes: Vec<SizeResult>,
    /// Conformance: messages received from each rank.
    pub received_from: Vec<u64>,
    /// Messages out of order or missing, from peers that stayed alive
    /// (a dead sender's last messages may be lost: not an order error).
    pub order_errors: u64,
    pub content_errors: u64,
    /// Peers this worker found dead, with the seconds it took to notice
    /// (from the peer's last message).
    pub lost_peers: Vec<(u16, f64)>,
    /// Peers finished in an orderly way before this worker exited.
    pub finished_clean: bool,
    /// Most sends this worker had queued or in flight to one peer.
    pub max_outstanding: usize,
}
