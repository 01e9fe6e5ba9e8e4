//! What a node reports: its STATS and FINAL lines (written by a thread of
//! their own), the same figures for `/metrics`, and the host facts they
//! carry (clock, host name).

use evb_control::lines::ToLauncher;
use std::io::Write;

use crate::report::NodeReport;

use super::*;

impl Runtime {
    /// The final report, as the FINAL line and the report file have it.
    pub(super) fn final_report(&self) -> NodeReport {
        self.report(true, &self.engine.node.stats())
    }

    pub(super) fn print_report(&self, full: bool) {
        if self.embedded && !full && self.metrics.is_none() {
            return; // Nobody reads STATS lines there.
        }
        let stats = self.engine.node.stats();
        let mut r = self.report(full, &stats);
        if let Some(m) = &self.metrics {
            m.update(&r, &self.gauges());
        }
        if !full {
            // STATS lines stay small: the histogram only in FINAL.
            r.latency_buckets.clear();
            r.incidents.clear();
        }
        if let (Some(path), true) = (&self.report_file, full) {
            let line = serde_json::to_string(&r).expect("report serialises");
            let written = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| std::fs::write(path, &line));
            if let Err(e) = written {
                tracing::warn!("evb node {}: writing {}: {e}", self.rank, path.display());
            }
        }
        if self.embedded {
            return; // Another program's stdout: the report file only.
        }
        if self.report_file.is_some() && !full && !self.stats_under_launcher {
            return; // No STATS lines on a launcher's shared stdout.
        }
        if full {
            self.report_lines
                .write(ToLauncher::Final(Box::new(r)).encode());
        } else {
            self.report_lines
                .offer(ToLauncher::Stats(Box::new(r)).encode());
        }
    }

    /// This node's report now (`full`: with the latency histogram and the
    /// output network's links).
    fn report(&self, full: bool, stats: &evb_core::NodeStats) -> NodeReport {
        let elapsed = self.engine.epoch.elapsed().as_secs_f64();
        // Metrics want the latency histogram every time.
        let mut r = NodeReport::from_stats(
            self.rank,
            self.layout.role(self.rank),
            elapsed,
            stats,
            full || self.metrics.is_some(),
        );
        r.peers_lost = self.lost.clone();
        r.rejoins = self.rejoins.clone();
        r.restarted = self.restarted;
        if let Some(fu) = self.engine.node.fu() {
            r.busy_s = fu.busy_time(self.engine.now()) as f64 * 1e-9;
        }
        self.add_resources(&mut r);
        r.mep_buffer_waits = self.engine.mep_buffer_waits;
        if let Some(em) = &stats.em {
            r.em_meps_built = em.meps_built;
            r.em_meps_incomplete = em.meps_incomplete;
            r.em_meps_corrupt = em.meps_corrupt;
            r.em_meps_lost_bu_gone = em.meps_lost_bu_gone;
            r.em_meps_reassigned = em.meps_reassigned;
            r.em_meps_revoked = em.meps_revoked;
            r.em_resumed_at = em.resumed_at;
        }
        r.drain_timed_out = self.engine.node.drain_timed_out();
        if full {
            r.output_network = self.output_network.clone();
            r.sends_by_bu = self.sent_by_bu.values().cloned().collect();
        }
        r.clock = self.clock_report(stats);
        r
    }

    /// What the node uses besides its figures: memory, CPU time (also per
    /// GB built), what it stored, the buffers it allocated up front.
    fn add_resources(&self, r: &mut NodeReport) {
        r.rss_bytes = crate::report::resident_bytes();
        (r.cpu_user_s, r.cpu_system_s) = crate::report::cpu_times();
        if r.bytes_built > 0 {
            let gb = r.bytes_built as f64 / 1e9;
            r.cpu_user_s_per_gb = r.cpu_user_s / gb;
            r.cpu_system_s_per_gb = r.cpu_system_s / gb;
        }
        if let Some(st) = self
            .store_closed
            .clone()
            .or_else(|| self.store.as_ref().map(|w| w.stats()))
        {
            r.store_objects = st.objects;
            r.store_events = st.events;
            r.store_bytes = st.bytes;
        }
        if let Some(f) = self.engine.rx_pool.fixed {
            r.buffers_preallocated_bytes += (f.buffers * f.len) as u64;
            r.rx_buffer_overflows = f.short;
        }
        if let (Some(store), true) = (
            &self.engine.slots,
            self.config.event_builder.preallocate_buffers,
        ) {
            let s = store.store();
            r.buffers_preallocated_bytes += u64::from(s.slots()) * s.slot_bytes() as u64;
        }
    }

    /// The slot clock as this node knows it: with a slotted barrel, at the
    /// EM and wherever the clock is measured.
    fn clock_report(&self, stats: &evb_core::NodeStats) -> Option<crate::report::ClockReport> {
        let slotted = self.config.event_builder.schedule == evb_core::config::Schedule::Slotted;
        let is_em = self.layout.em == self.rank;
        if !(slotted && (is_em || stats.clock.is_some())) {
            return None;
        }
        let c = stats.clock.unwrap_or_default();
        Some(crate::report::ClockReport {
            host: hostname(),
            epoch_monotonic_ns: self.engine.epoch_monotonic_ns,
            offset_ns: c.offset_ns,
            uncertainty_ns: c.uncertainty_ns,
            probes: c.probes,
            replies: c.replies,
            max_step_ns: c.max_step_ns,
            em: is_em,
        })
    }

    /// The figures `/metrics` shows that are not in the report: what is
    /// queued and open now, and how many peers are up.
    fn gauges(&self) -> crate::metrics::Gauges {
        let (bu_output, consumer) = crate::metrics::output_gauges(&self.engine.node, &self.layout);
        crate::metrics::Gauges {
            bu_output,
            consumer,
            ru_meps_held: self.engine.meps.len(),
            bu_open_batches: self.engine.batches.len(),
            peers_up: self
                .linked
                .iter()
                .filter(|&&p| p != self.rank && !self.is_lost(p))
                .count(),
        }
    }
}

/// STATS and FINAL lines, written to stdout by a thread of their own. A
/// node whose stdout is not read (a stalled log collector, a launcher's
/// full pipe) would otherwise block on its next STATS line, stop building
/// and answering, and be taken for lost by its peers: STATS lines that
/// find the queue full are dropped (and counted) instead. The FINAL line
/// is always written: [`ReportLines::finish`] waits for it.
pub(super) struct ReportLines {
    tx: Option<std::sync::mpsc::SyncSender<String>>,
    writer: Option<std::thread::JoinHandle<()>>,
    dropped: std::cell::Cell<u64>,
}

impl ReportLines {
    /// Lines that may wait for stdout; STATS lines past them are dropped.
    const QUEUE: usize = 4;

    pub(super) fn start() -> ReportLines {
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(Self::QUEUE);
        let writer = std::thread::Builder::new()
            .name("evb-report-lines".into())
            .spawn(move || {
                for line in rx {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(line.as_bytes());
                    let _ = out.flush();
                }
            })
            .ok();
        ReportLines {
            tx: Some(tx),
            writer,
            dropped: std::cell::Cell::new(0),
        }
    }

    /// No lines at all (a node embedded in another program).
    pub(super) fn off() -> ReportLines {
        ReportLines {
            tx: None,
            writer: None,
            dropped: std::cell::Cell::new(0),
        }
    }

    /// A STATS line: queued, or dropped if the queue is full.
    pub(super) fn offer(&self, line: String) {
        match &self.tx {
            Some(tx) if self.writer.is_some() => {
                if tx.try_send(line).is_err() {
                    self.dropped.set(self.dropped.get() + 1);
                }
            }
            _ => Self::write_now(&line),
        }
    }

    /// A line that must be written (FINAL): waits for room in the queue.
    pub(super) fn write(&self, line: String) {
        match &self.tx {
            Some(tx) if self.writer.is_some() => {
                if let Err(e) = tx.send(line) {
                    Self::write_now(&e.0);
                }
            }
            _ => Self::write_now(&line),
        }
    }

    pub(super) fn write_now(line: &str) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }

    /// Waits until every queued line is written; returns the STATS lines
    /// dropped.
    pub(super) fn finish(&mut self) -> u64 {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        self.dropped.get()
    }
}

/// CLOCK_MONOTONIC now, ns: the clock `Instant` reads on Linux, shared by
/// every process of a host.
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This host's name (for telling which nodes share a clock).
pub(super) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its whole length, which is passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
