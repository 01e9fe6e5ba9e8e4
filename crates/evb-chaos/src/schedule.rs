//! A fault schedule: what is injected, where, when and for how long,
//! drawn from a seed (the same seed and setup give the same schedule), and
//! spelled as text (`kill:2@3.10+1.20`) so that a schedule can be printed,
//! shrunk and replayed (`evb chaos --faults`).

use std::fmt;

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// The kinds of fault, each a real one done to real processes, sockets or
/// files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `kill -9` of an RU/BU node, restarted `dur` later.
    Kill,
    /// `kill -9` of the Event Manager's endpoint, restarted `dur` later.
    KillEm,
    /// `kill -9` of a consumer (Filter Unit), restarted `dur` later.
    KillConsumer,
    /// SIGSTOP of an endpoint, SIGCONT `dur` later.
    Stop,
    /// Every TCP connection of an endpoint cut (nftables drops its
    /// packets both ways) for `dur`.
    LinkDown,
    /// `param` % of an endpoint's TCP packets dropped (nftables) for `dur`.
    Loss,
    /// Loopback rate-limited to `param` Mb/s (tbf) for `dur`.
    Rate,
    /// The event store's file system filled up (a ballast file) for `dur`.
    StoreFull,
    /// A stranger connects to a listening port and stays silent for `dur`.
    Stranger,
    /// A stranger sends garbage to a listening port.
    Garbage,
    /// A well-formed Hello with the run's id and a made-up proof (no run key).
    WrongKey,
    /// A Hello cut short, then silence for `dur`.
    HelloTruncated,
    /// One node's genuine Hello, nonce and proof replayed to another node.
    HelloReplayed,
}

impl Kind {
    pub const ALL: [Kind; 13] = [
        Kind::Kill,
        Kind::KillEm,
        Kind::KillConsumer,
        Kind::Stop,
        Kind::LinkDown,
        Kind::Loss,
        Kind::Rate,
        Kind::StoreFull,
        Kind::Stranger,
        Kind::Garbage,
        Kind::WrongKey,
        Kind::HelloTruncated,
        Kind::HelloReplayed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::KillEm => "kill-em",
            Kind::KillConsumer => "kill-consumer",
            Kind::Stop => "stop",
            Kind::LinkDown => "link-down",
            Kind::Loss => "loss",
            Kind::Rate => "rate",
            Kind::StoreFull => "store-full",
            Kind::Stranger => "stranger",
            Kind::Garbage => "garbage",
            Kind::WrongKey => "wrong-key",
            Kind::HelloTruncated => "hello-truncated",
            Kind::HelloReplayed => "hello-replayed",
        }
    }

    pub fn parse(name: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .with_context(|| {
                let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown fault kind `{name}` (one of {})", names.join(", "))
            })
    }

    /// A fault `evb run` injects itself (`--kill/--restart`, `--stop/--resume`).
    pub fn is_process(self) -> bool {
        matches!(
            self,
            Kind::Kill | Kind::KillEm | Kind::KillConsumer | Kind::Stop
        )
    }

    /// A fault that takes its endpoint out for its duration.
    pub fn takes_down(self) -> bool {
        self.is_process() || self == Kind::LinkDown
    }

    /// A fault of the network between the nodes (tcp-based transports).
    pub fn is_network(self) -> bool {
        matches!(self, Kind::LinkDown | Kind::Loss | Kind::Rate)
    }

    /// A stranger on a listening port.
    pub fn is_stranger(self) -> bool {
        matches!(
            self,
            Kind::Stranger
                | Kind::Garbage
                | Kind::WrongKey
                | Kind::HelloTruncated
                | Kind::HelloReplayed
        )
    }
}

/// One fault of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fault {
    pub kind: Kind,
    /// The endpoint (rank) it is done to; for `hello-replayed` the node
    /// whose Hello is replayed to `param`; none for `rate` and `store-full`.
    pub target: Option<u16>,
    /// Seconds into the run.
    pub at_s: f64,
    /// Seconds it lasts (the restart, resume or repair comes then).
    pub dur_s: f64,
    /// `loss`: percent dropped; `rate`: Mb/s; strangers: which listening
    /// port of the target (an index, modulo their number); `hello-replayed`:
    /// the node it is replayed to.
    pub param: u32,
}

impl Fault {
    pub fn end_s(&self) -> f64 {
        self.at_s + self.dur_s
    }
}

impl fmt::Display for Fault {
    /// `kind:target@at+dur/param` (target and param left out when unused).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.kind.name())?;
        if let Some(t) = self.target {
            write!(f, "{t}")?;
        }
        write!(f, "@{:.2}+{:.2}", self.at_s, self.dur_s)?;
        if self.param != 0 {
            write!(f, "/{}", self.param)?;
        }
        Ok(())
    }
}

impl Fault {
    /// Reads the spelling of [`Fault`]'s `Display`.
    pub fn parse(text: &str) -> Result<Fault> {
        let bad = |why: &str| format!("fault `{text}`: {why} (kind:target@seconds+seconds/param)");
        let (kind, rest) = text.split_once(':').with_context(|| bad("no `:`"))?;
        let kind = Kind::parse(kind.trim()).with_context(|| bad("the kind"))?;
        let (target, rest) = rest.split_once('@').with_context(|| bad("no `@`"))?;
        let target = match target.trim() {
            "" => None,
            t => Some(t.parse::<u16>().with_context(|| bad("the target"))?),
        };
        let (times, param) = match rest.split_once('/') {
            Some((t, p)) => (
                t,
                p.trim().parse::<u32>().with_context(|| bad("the param"))?,
            ),
            None => (rest, 0),
        };
        let (at, dur) = times.split_once('+').unwrap_or((times, "0"));
        let num = |s: &str, what: &str| -> Result<f64> {
            let v: f64 = s.trim().parse().with_context(|| bad(what))?;
            if !v.is_finite() || v < 0.0 {
                bail!(bad(what));
            }
            Ok(v)
        };
        Ok(Fault {
            kind,
            target,
            at_s: num(at, "the time")?,
            dur_s: num(dur, "the duration")?,
            param,
        })
    }
}

/// Parses a comma-separated list of faults, sorted by time.
pub fn parse_list(text: &str) -> Result<Vec<Fault>> {
    let mut faults = text
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(Fault::parse)
        .collect::<Result<Vec<_>>>()?;
    faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(faults)
}

/// Spells a schedule as `parse_list` reads it.
pub fn spell(faults: &[Fault]) -> String {
    faults
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// What a schedule is drawn for: the run's shape and what may be done.
#[derive(Debug, Clone)]
pub struct Setup {
    /// RU/BU nodes (ranks `0..nodes`).
    pub nodes: u16,
    /// The EM's endpoint, when it is one of its own (`nodes.em = "separate"`).
    pub em_separate: Option<u16>,
    /// Consumer ranks.
    pub consumers: Vec<u16>,
    /// Seconds the run builds.
    pub duration_s: f64,
    /// Seconds at the start with no fault (the rate before any fault).
    pub warmup_s: f64,
    /// Seconds at the end every fault is over by.
    pub quiet_end_s: f64,
    /// Mean seconds between two faults.
    pub interval_s: f64,
    /// The kinds that may be drawn, with their weights.
    pub kinds: Vec<(Kind, u32)>,
    /// Most RU/BU nodes down (killed, stopped or cut off) at once.
    pub max_nodes_down: usize,
}

/// The default weights of each kind: process faults most often, then
/// network faults, then strangers.
pub fn default_weight(kind: Kind) -> u32 {
    match kind {
        Kind::Kill | Kind::Stop => 4,
        Kind::KillEm | Kind::KillConsumer | Kind::LinkDown => 2,
        Kind::Loss | Kind::Rate | Kind::StoreFull => 2,
        Kind::Stranger
        | Kind::Garbage
        | Kind::WrongKey
        | Kind::HelloTruncated
        | Kind::HelloReplayed => 1,
    }
}

/// splitmix64: small, fast, and the same on every machine (the schedule
/// must not depend on a library's choice of generator).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Rounds to the hundredth the spelling keeps, so that a printed schedule
/// replays exactly.
fn centi(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Draws the schedule of `seed` for `setup`.
pub fn draw(seed: u64, setup: &Setup) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let mut faults: Vec<Fault> = Vec::new();
    let total: u32 = setup.kinds.iter().map(|&(_, w)| w).sum();
    if total == 0 || setup.interval_s <= 0.0 {
        return faults;
    }
    let last_end = setup.duration_s - setup.quiet_end_s;
    let mut t = setup.warmup_s;
    loop {
        t += rng.range(0.5, 1.5) * setup.interval_s;
        if t >= last_end - 0.3 {
            break;
        }
        let mut pick = rng.below(u64::from(total)) as u32;
        let kind = setup
            .kinds
            .iter()
            .find(|&&(_, w)| {
                if pick < w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map(|&(k, _)| k)
            .expect("a kind below the total weight");
        if let Some(f) = draw_one(&mut rng, setup, kind, centi(t), last_end, &faults) {
            faults.push(f);
        }
    }
    faults
}

/// One fault of `kind` at `at`, or none when no target fits (every
/// candidate busy with another fault).
fn draw_one(
    rng: &mut Rng,
    setup: &Setup,
    kind: Kind,
    at: f64,
    last_end: f64,
    earlier: &[Fault],
) -> Option<Fault> {
    let (lo, hi) = match kind {
        Kind::Kill | Kind::KillEm | Kind::KillConsumer => (0.5, 2.5),
        Kind::Stop | Kind::LinkDown => (0.3, 2.5),
        Kind::Loss | Kind::Rate => (1.0, 3.0),
        Kind::StoreFull => (0.5, 2.5),
        _ => (0.2, 2.0),
    };
    let dur = centi(rng.range(lo, hi).min(last_end - at).max(0.1));
    let busy = |rank: u16| {
        earlier
            .iter()
            .any(|f| f.kind.takes_down() && f.target == Some(rank) && f.end_s() + 0.5 > at)
    };
    let nodes_down = earlier
        .iter()
        .filter(|f| {
            f.kind.takes_down() && f.target.is_some_and(|t| t < setup.nodes) && f.end_s() + 0.5 > at
        })
        .count();
    let pick = |rng: &mut Rng, ranks: Vec<u16>| -> Option<u16> {
        let free: Vec<u16> = ranks.into_iter().filter(|&r| !busy(r)).collect();
        (!free.is_empty()).then(|| free[rng.below(free.len() as u64) as usize])
    };
    let nodes: Vec<u16> = (0..setup.nodes).collect();
    let endpoints: Vec<u16> = nodes
        .iter()
        .copied()
        .chain(setup.em_separate)
        .chain(setup.consumers.iter().copied())
        .collect();
    let mut param = 0;
    let target = match kind {
        Kind::Kill | Kind::Stop | Kind::LinkDown if nodes_down >= setup.max_nodes_down => {
            // Another RU/BU node may not go; a consumer or the EM may.
            let others: Vec<u16> = endpoints
                .iter()
                .copied()
                .filter(|&r| r >= setup.nodes)
                .collect();
            if kind == Kind::Kill {
                return None;
            }
            pick(rng, others)?
        }
        Kind::Kill => pick(rng, nodes)?,
        Kind::Stop | Kind::LinkDown => pick(rng, endpoints)?,
        Kind::KillEm => pick(rng, setup.em_separate.into_iter().collect())?,
        Kind::KillConsumer => {
            // At least one consumer stays up.
            let down = setup.consumers.iter().filter(|&&c| busy(c)).count();
            if down + 1 >= setup.consumers.len() {
                return None;
            }
            pick(rng, setup.consumers.clone())?
        }
        Kind::Loss => {
            param = 5 + rng.below(26) as u32;
            endpoints[rng.below(endpoints.len() as u64) as usize]
        }
        Kind::Rate => {
            param = 100 * (1 + rng.below(8) as u32);
            return Some(Fault {
                kind,
                target: None,
                at_s: at,
                dur_s: dur,
                param,
            });
        }
        Kind::StoreFull => {
            return Some(Fault {
                kind,
                target: None,
                at_s: at,
                dur_s: dur,
                param,
            })
        }
        Kind::HelloReplayed => {
            if setup.nodes < 2 {
                return None;
            }
            let from = rng.below(u64::from(setup.nodes)) as u16;
            let to = (from + 1 + rng.below(u64::from(setup.nodes) - 1) as u16) % setup.nodes;
            param = u32::from(to);
            from
        }
        Kind::WrongKey | Kind::HelloTruncated => rng.below(u64::from(setup.nodes)) as u16,
        Kind::Stranger | Kind::Garbage => {
            param = rng.below(8) as u32;
            endpoints[rng.below(endpoints.len() as u64) as usize]
        }
    };
    Some(Fault {
        kind,
        target: Some(target),
        at_s: at,
        dur_s: dur,
        param,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup {
            nodes: 4,
            em_separate: Some(4),
            consumers: vec![5, 6],
            duration_s: 30.0,
            warmup_s: 3.0,
            quiet_end_s: 2.0,
            interval_s: 2.0,
            kinds: Kind::ALL.iter().map(|&k| (k, default_weight(k))).collect(),
            max_nodes_down: 1,
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let a = draw(7, &setup());
        assert_eq!(a, draw(7, &setup()));
        assert_ne!(a, draw(8, &setup()));
        assert!(a.len() >= 5, "{}", spell(&a));
    }

    #[test]
    fn a_schedule_replays_from_its_spelling() {
        for seed in 0..50 {
            let a = draw(seed, &setup());
            assert_eq!(parse_list(&spell(&a)).unwrap(), a, "seed {seed}");
        }
    }

    #[test]
    fn faults_keep_to_the_run_and_never_overlap_on_one_endpoint() {
        let s = setup();
        for seed in 0..200 {
            let faults = draw(seed, &s);
            for (i, f) in faults.iter().enumerate() {
                assert!(f.at_s >= s.warmup_s, "seed {seed}: {f}");
                assert!(
                    f.end_s() <= s.duration_s - s.quiet_end_s + 1e-9,
                    "seed {seed}: {f}"
                );
                for g in &faults[..i] {
                    let same = g.kind.takes_down() && f.kind.takes_down() && g.target == f.target;
                    assert!(!same || g.end_s() < f.at_s, "seed {seed}: {g} and {f}");
                }
                // At most one RU/BU node down at a time.
                let down = faults[..=i]
                    .iter()
                    .filter(|g| g.kind.takes_down() && g.target.is_some_and(|t| t < 4))
                    .filter(|g| g.end_s() + 0.5 > f.at_s)
                    .count();
                assert!(
                    down <= 1 || !f.kind.takes_down(),
                    "seed {seed}: {}",
                    spell(&faults)
                );
            }
        }
    }

    #[test]
    fn bad_spellings_are_refused_with_the_reason() {
        for bad in [
            "kill",
            "boom:1@2",
            "kill:x@2",
            "kill:1@-2",
            "kill:1@2+nan",
            "loss:1@2+1/x",
        ] {
            let err = Fault::parse(bad).expect_err(bad).to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
