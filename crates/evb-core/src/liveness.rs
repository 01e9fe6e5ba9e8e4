//! Liveness: the timers that keep a node's links alive, judge its peers
//! and end its run, driven by the time every input brings like the rest
//! of the core.
//!
//! - **Heartbeat due**: every `transport.heartbeat_ms` a node sends a
//!   heartbeat to each live peer it sent nothing else to in that time, so
//!   that every link carries something at least that often ([`PeerWatch`]).
//! - **Peer silent**: at each heartbeat the node judges its peers; one it
//!   has heard nothing from for more than `transport.peer_timeout_ms` is
//!   lost, with the same consequences as a connection that failed.
//! - **Drain over**: once the run has ended (or the EM is lost) the node
//!   has `event_builder.drain_timeout_ms` (`em_lost_wait_ms`) to finish;
//!   then it gives up what is left ([`Drain`]).
//! - **Linger**: a finished node waits at most [`LINGER`] for its peers
//!   to finish too before its driver stops.
//!
//! The driver supplies what only it can see: something arrived from a
//! peer, or the transport sees it alive (its bytes wait unread, it takes
//! ours); a peer on this host is runnable but starved of CPU; a peer said
//! goodbye. The policy (how long, how often, what a loss does) lives here,
//! so the runtime, the simulator and the test harness run the same code.
//!
//! Silence is counted on the node's own running clock ([`RunningClock`]):
//! a stretch of time in which the node itself did not run (its process
//! was descheduled on a loaded machine, or stopped) counts as at most two
//! heartbeats. A node that wakes after a long pause has not heard its
//! peers because it was not listening; it judges them after it had the
//! time to read what they sent.

use crate::bu::Nanos;
use crate::wire::NodeId;

/// A finished node waits at most this long for its peers to finish.
pub const LINGER: Nanos = 5_000_000_000;

/// Timeouts of silence a runnable peer on this host is given before it is
/// lost (see [`PeerWatch::starved`]).
pub const STARVED_GRACE: u64 = 4;

/// A gap between two inputs counts as at most this many heartbeats of
/// running time: a node that runs is woken by its heartbeat timer at
/// least once a heartbeat.
const MAX_GAP_BEATS: u64 = 2;

/// The durations of the liveness timers, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// How often a node sends each peer a heartbeat and judges their
    /// silence; 0: never (no heartbeats, no peer is lost for its silence).
    pub heartbeat: Nanos,
    /// A peer silent for longer than this is lost.
    pub peer_timeout: Nanos,
    /// After the end of the run, how long a node may take to finish.
    pub drain: Nanos,
    /// How long a node cut off from the EM waits for it to come back.
    pub em_lost_wait: Nanos,
    /// How long a finished node waits for its peers to finish.
    pub linger: Nanos,
}

impl Timers {
    /// The timers a configuration sets (`transport.heartbeat_ms`,
    /// `transport.peer_timeout_ms`, `event_builder.drain_timeout_ms`,
    /// `event_builder.em_lost_wait_ms`).
    pub fn from_config(config: &crate::Config) -> Timers {
        let ms = 1_000_000;
        Timers {
            heartbeat: config.transport.heartbeat_ms * ms,
            peer_timeout: config.transport.peer_timeout_ms * ms,
            drain: config.event_builder.drain_timeout_ms * ms,
            em_lost_wait: config.event_builder.em_lost_wait_ms * ms,
            linger: LINGER,
        }
    }
}

/// What a peer is to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Expected to speak: judged at every heartbeat.
    Live,
    /// Declared lost (silent, or its connection failed) and not back.
    Lost,
    /// It said it finished with the run: no longer expected to speak.
    Finished,
}

/// What a heartbeat tick asks of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Send this peer a heartbeat.
    Heartbeat(NodeId),
    /// This peer was silent for `silent_ns` of running time, more than the
    /// peer timeout: it is lost.
    Silent { peer: NodeId, silent_ns: Nanos },
}

/// Time as the node lived it: the driver's time, except that a gap
/// between two inputs longer than `max_gap` counts as `max_gap`.
#[derive(Debug, Clone)]
pub struct RunningClock {
    /// The driver's time at the last input (`None`: none yet).
    last: Option<Nanos>,
    /// Running time at the last input.
    running: Nanos,
    max_gap: Nanos,
}

impl RunningClock {
    /// `max_gap` 0: no gap is capped (plain driver time).
    pub fn new(max_gap: Nanos) -> RunningClock {
        RunningClock {
            last: None,
            running: 0,
            max_gap,
        }
    }

    /// The running time at driver time `now` (not before the last input).
    pub fn at(&self, now: Nanos) -> Nanos {
        let Some(last) = self.last else {
            return self.running;
        };
        let gap = now.saturating_sub(last);
        self.running
            + if self.max_gap > 0 {
                gap.min(self.max_gap)
            } else {
                gap
            }
    }

    /// An input at driver time `now`.
    pub fn advance(&mut self, now: Nanos) {
        self.running = self.at(now);
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }
}

#[derive(Debug, Clone)]
struct Peer {
    state: PeerState,
    /// Running time at which it was last heard from.
    heard: Nanos,
    /// Driver time at which something was last sent to it.
    sent: Option<Nanos>,
    /// The driver said, before this tick's judgement, that the peer is
    /// runnable on this host.
    starved: bool,
}

/// Heartbeats and the judgement of silent peers for one endpoint. Used by
/// [`crate::Node`]; usable alone by a driver with links but no node (the
/// transport benchmarks).
#[derive(Debug, Clone)]
pub struct PeerWatch {
    me: NodeId,
    heartbeat: Nanos,
    timeout: Nanos,
    peers: Vec<Peer>,
    clock: RunningClock,
    /// Driver time of the next heartbeat (`None`: not started, stopped, or
    /// no heartbeats).
    next_beat: Option<Nanos>,
}

impl PeerWatch {
    /// Endpoint `me` of `endpoints`, watching every other one. `heartbeat`
    /// 0: no heartbeats and no judgement.
    pub fn new(endpoints: u16, me: NodeId, heartbeat: Nanos, timeout: Nanos) -> PeerWatch {
        PeerWatch {
            me,
            heartbeat,
            timeout,
            peers: vec![
                Peer {
                    state: PeerState::Live,
                    heard: 0,
                    sent: None,
                    starved: false,
                };
                usize::from(endpoints)
            ],
            clock: RunningClock::new(MAX_GAP_BEATS * heartbeat),
            next_beat: None,
        }
    }

    /// Silence counts from now; the first heartbeat is one period away.
    pub fn start(&mut self, now: Nanos) {
        self.clock.advance(now);
        let running = self.clock.running;
        for p in &mut self.peers {
            p.heard = running;
        }
        self.next_beat = (self.heartbeat > 0).then(|| now + self.heartbeat);
    }

    /// No more heartbeats nor judgement (the node is done).
    pub fn stop(&mut self) {
        self.next_beat = None;
    }

    /// Any input at `now`: the running clock moves on.
    pub fn observe(&mut self, now: Nanos) {
        self.clock.advance(now);
    }

    /// Something came from `peer`, or the driver sees it alive.
    pub fn heard(&mut self, now: Nanos, peer: NodeId) {
        self.clock.advance(now);
        let running = self.clock.running;
        if let Some(p) = self.peers.get_mut(usize::from(peer)) {
            p.heard = running;
        }
    }

    /// Something was sent to `peer` at `now`: no heartbeat needed on that
    /// link for a period.
    pub fn sent(&mut self, now: Nanos, peer: NodeId) {
        if let Some(p) = self.peers.get_mut(usize::from(peer)) {
            p.sent = Some(now);
        }
    }

    /// `peer`'s process is on this host and waiting for a CPU: at this
    /// tick's judgement its silence is starvation, not a hang, up to
    /// [`STARVED_GRACE`] timeouts (a stopped or hung process is not
    /// runnable).
    pub fn starved(&mut self, peer: NodeId) {
        if let Some(p) = self.peers.get_mut(usize::from(peer)) {
            p.starved = true;
        }
    }

    /// `peer` is lost (the driver saw its connection fail, or it was silent).
    pub fn lost(&mut self, peer: NodeId) {
        if let Some(p) = self.peers.get_mut(usize::from(peer)) {
            p.state = PeerState::Lost;
        }
    }

    /// `peer` is back: its silence counts from now.
    pub fn joined(&mut self, now: Nanos, peer: NodeId) {
        self.clock.advance(now);
        let running = self.clock.running;
        if let Some(p) = self.peers.get_mut(usize::from(peer)) {
            p.state = PeerState::Live;
            p.heard = running;
        }
    }

    /// `peer` said it finished: no longer judged.
    pub fn finished(&mut self, peer: NodeId) {
        if let Some(p) = self.peers.get_mut(usize::from(peer)) {
            if p.state == PeerState::Live {
                p.state = PeerState::Finished;
            }
        }
    }

    /// How long `peer` has been silent at `now`, in running time.
    pub fn silent_for(&self, now: Nanos, peer: NodeId) -> Option<Nanos> {
        let p = self.peers.get(usize::from(peer))?;
        Some(self.clock.at(now).saturating_sub(p.heard))
    }

    pub fn state(&self, peer: NodeId) -> Option<PeerState> {
        self.peers.get(usize::from(peer)).map(|p| p.state)
    }

    /// When the next heartbeat is due.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.next_beat
    }

    /// A heartbeat (and judgement) is due at `now`.
    pub fn is_due(&self, now: Nanos) -> bool {
        self.next_beat.is_some_and(|t| t <= now)
    }

    /// The peers the judgement due at `now` would find silent: the driver
    /// may vouch for them first ([`PeerWatch::heard`],
    /// [`PeerWatch::starved`]). Empty when no judgement is due.
    pub fn silent_peers(&self, now: Nanos) -> Vec<NodeId> {
        if !self.is_due(now) {
            return Vec::new();
        }
        let running = self.clock.at(now);
        self.watched()
            .filter(|&i| running.saturating_sub(self.peers[i].heard) > self.timeout)
            .map(|i| i as NodeId)
            .collect()
    }

    /// The heartbeat tick, if due at `now`: each live peer is judged
    /// (silent: [`Beat::Silent`], and it is lost) and the others that were
    /// sent nothing for a period get a heartbeat.
    pub fn on_timeout(&mut self, now: Nanos, out: &mut Vec<Beat>) {
        if !self.is_due(now) {
            return;
        }
        self.clock.advance(now);
        let running = self.clock.running;
        let watched: Vec<usize> = self.watched().collect();
        for i in watched {
            let peer = &mut self.peers[i];
            let silent_ns = running.saturating_sub(peer.heard);
            let starved = std::mem::take(&mut peer.starved);
            let spared = starved && silent_ns <= STARVED_GRACE * self.timeout;
            if silent_ns > self.timeout && !spared {
                peer.state = PeerState::Lost;
                out.push(Beat::Silent {
                    peer: i as NodeId,
                    silent_ns,
                });
            } else if peer
                .sent
                .is_none_or(|t| now.saturating_sub(t) >= self.heartbeat)
            {
                out.push(Beat::Heartbeat(i as NodeId));
            }
        }
        self.next_beat = Some(now + self.heartbeat);
    }

    /// The live peers, by index.
    fn watched(&self) -> impl Iterator<Item = usize> + '_ {
        let me = usize::from(self.me);
        (0..self.peers.len()).filter(move |&i| i != me && self.peers[i].state == PeerState::Live)
    }
}

/// The drain timer: armed when the run ends (`drain`) or when the EM is
/// lost before that (`em_lost_wait`), disarmed if the EM comes back before
/// it fired.
#[derive(Debug, Clone, Default)]
pub struct Drain {
    deadline: Option<Nanos>,
    timed_out: bool,
}

impl Drain {
    /// Arms or disarms the timer from the node's state at `now`.
    pub fn update(&mut self, now: Nanos, timers: &Timers, ended: bool, em_lost: bool) {
        if self.timed_out {
            return;
        }
        if self.deadline.is_none() {
            if ended {
                self.deadline = Some(now + timers.drain);
            } else if em_lost {
                self.deadline = Some(now + timers.em_lost_wait);
            }
        }
        if !em_lost && !ended {
            // The EM came back (rejoined) before the drain was over.
            self.deadline = None;
        }
    }

    pub fn deadline(&self) -> Option<Nanos> {
        self.deadline.filter(|_| !self.timed_out)
    }

    /// Whether the drain is over at `now` (it fires once).
    pub fn expire(&mut self, now: Nanos) -> bool {
        if self.deadline().is_some_and(|d| d <= now) {
            self.timed_out = true;
            return true;
        }
        false
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    /// Ticks `w` at every heartbeat from `from` to `to`, hearing from the
    /// peers in `talking` at each; returns the peers found silent, with when.
    fn run(w: &mut PeerWatch, from: Nanos, to: Nanos, talking: &[NodeId]) -> Vec<(NodeId, Nanos)> {
        let mut lost = Vec::new();
        let mut t = from;
        let mut out = Vec::new();
        while t <= to {
            for &p in talking {
                w.heard(t, p);
            }
            if w.is_due(t) {
                w.on_timeout(t, &mut out);
                for b in out.drain(..) {
                    if let Beat::Silent { peer, .. } = b {
                        lost.push((peer, t));
                    }
                }
            }
            t += 10 * MS;
        }
        lost
    }

    #[test]
    fn a_silent_peer_is_lost_after_the_timeout_and_a_talking_one_never() {
        let mut w = PeerWatch::new(3, 0, 100 * MS, 800 * MS);
        w.start(0);
        let lost = run(&mut w, 0, 3000 * MS, &[1]);
        assert_eq!(lost.len(), 1, "{lost:?}");
        let (peer, at) = lost[0];
        assert_eq!(peer, 2);
        // Judged at the heartbeats: after 800 ms, within one more period.
        assert!((800 * MS..=900 * MS).contains(&at), "{at}");
        assert_eq!(w.state(2), Some(PeerState::Lost));
        assert_eq!(w.state(1), Some(PeerState::Live));
    }

    #[test]
    fn heartbeats_go_to_live_peers_only_and_stop_with_the_node() {
        let mut w = PeerWatch::new(4, 1, 100 * MS, 800 * MS);
        w.start(0);
        w.lost(2);
        w.finished(3);
        let mut out = Vec::new();
        w.on_timeout(50 * MS, &mut out);
        assert!(out.is_empty(), "not due yet");
        w.on_timeout(100 * MS, &mut out);
        assert_eq!(out, vec![Beat::Heartbeat(0)]);
        assert_eq!(w.next_deadline(), Some(200 * MS));
        // A link that carried something within the period needs none.
        w.sent(150 * MS, 0);
        out.clear();
        w.on_timeout(200 * MS, &mut out);
        assert!(out.is_empty(), "{out:?}");
        w.stop();
        assert_eq!(w.next_deadline(), None);
        out.clear();
        w.on_timeout(300 * MS, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_node_that_did_not_run_does_not_blame_its_peers() {
        let mut w = PeerWatch::new(2, 0, 100 * MS, 800 * MS);
        w.start(0);
        assert!(run(&mut w, 0, 500 * MS, &[1]).is_empty());
        // Descheduled for 5 s: its first tick after waking comes before it
        // read what the peer sent meanwhile.
        let mut out = Vec::new();
        assert!(w.silent_peers(5500 * MS).is_empty());
        w.on_timeout(5500 * MS, &mut out);
        assert_eq!(out, vec![Beat::Heartbeat(1)]);
        // A peer that stays silent while the node runs is still found.
        let lost = run(&mut w, 5510 * MS, 8000 * MS, &[]);
        assert_eq!(lost.len(), 1);
        assert!(lost[0].1 <= 5500 * MS + 800 * MS, "{lost:?}");
    }

    #[test]
    fn a_starved_peer_gets_its_grace_and_no_more() {
        let mut w = PeerWatch::new(2, 0, 100 * MS, 800 * MS);
        w.start(0);
        let mut t = 100 * MS;
        let mut out = Vec::new();
        let lost_at = loop {
            for p in w.silent_peers(t) {
                w.starved(p);
            }
            w.on_timeout(t, &mut out);
            if out.iter().any(|b| matches!(b, Beat::Silent { .. })) {
                break t;
            }
            out.clear();
            t += 100 * MS;
        };
        assert_eq!(lost_at, 3300 * MS, "lost past 4 timeouts");
    }

    #[test]
    fn the_drain_timer_ends_the_run_or_waits_for_the_em() {
        let timers = Timers {
            heartbeat: 100 * MS,
            peer_timeout: 800 * MS,
            drain: 50 * MS,
            em_lost_wait: 1000 * MS,
            linger: LINGER,
        };
        let mut d = Drain::default();
        d.update(0, &timers, false, false);
        assert_eq!(d.deadline(), None);
        // The EM is lost, then comes back: disarmed.
        d.update(10 * MS, &timers, false, true);
        assert_eq!(d.deadline(), Some(1010 * MS));
        d.update(20 * MS, &timers, false, false);
        assert_eq!(d.deadline(), None);
        // The run ends: the drain period.
        d.update(30 * MS, &timers, true, false);
        assert_eq!(d.deadline(), Some(80 * MS));
        assert!(!d.expire(79 * MS));
        assert!(d.expire(80 * MS));
        assert!(!d.expire(90 * MS), "fires once");
        assert!(d.timed_out());
        assert_eq!(d.deadline(), None);
    }

    #[test]
    fn the_running_clock_caps_gaps() {
        let mut c = RunningClock::new(200);
        c.advance(1000);
        assert_eq!(c.at(1100), 100);
        c.advance(1100);
        c.advance(5000);
        assert_eq!(c.at(5000), 300);
    }
}
