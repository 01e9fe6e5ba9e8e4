//! What the counters say about each directed link over the interval
//! between two snapshots (or since the counters were last cleared):
//!
//! - **utilisation**: data sent (`PortXmitDataExtended`, else
//!   `PortXmitData`; IBA counts 4-octet words of headers and payload) x 32
//!   bits / interval / the link's data rate. When the sending port has no
//!   counters, the far end's received data (`PortRcvData`) stands in;
//! - **wait**: `PortXmitWait` ticks x the tick / interval: the share of the
//!   time the port had data and no credits (its next hop was full). The
//!   tick is the port's own when the snapshot has it (read from
//!   `PortSamplesControl`, or the simulator's), else `--xmit-wait-tick-ns`,
//!   else one symbol time of the link's speed (SDR 4 ns, QDR 1 ns, FDR
//!   0.59 ns, EDR 0.32 ns, HDR 0.16 ns);
//! - **errors**: every error counter that grew (symbol errors, link
//!   downs, receive errors, discards, ...).
//!
//! A counter that went down or stopped at all ones is flagged with what
//! was made of it ([`Change`]).

use crate::counters::{counter_def, delta, Change, Class, Placed, COUNTERS};
use crate::error::{FabricError, Result};
use crate::rate::Speed;
use crate::topo::Topology;
use serde::Serialize;
use std::collections::BTreeMap;

/// One directed link (the output of `node` port `port`) over the interval.
#[derive(Debug, Clone, Serialize)]
pub struct LinkFigures {
    /// `NAME:PORT->NAME:PORT`.
    pub link: String,
    pub node: String,
    pub port: u8,
    pub to: String,
    pub to_port: u8,
    /// `host up`, `host down`, `switch` (between switches).
    pub tier: &'static str,
    #[serde(skip)]
    pub node_id: usize,
    #[serde(skip)]
    pub to_id: usize,
    /// `4xEDR` and its data rate, when the topology knows it.
    pub rate: Option<String>,
    pub gbps: f64,
    pub interval_s: f64,
    /// Data sent, Gb/s (headers included), and as a share of the rate.
    pub data_gbps: Option<f64>,
    pub utilisation: Option<f64>,
    /// Share of the interval the port waited for credits.
    pub wait: Option<f64>,
    pub tick_ns: Option<f64>,
    /// Error counters that grew, by name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, u64>,
    /// Counters that did not simply grow: `PortXmitData: saturated`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
}

/// Options of the measurement.
#[derive(Debug, Clone, Default)]
pub struct MeasureOptions {
    /// `PortXmitWait` tick for ports whose snapshot has none, ns.
    pub tick_ns: Option<f64>,
    /// Link rate where the topology has none, Gb/s.
    pub default_gbps: Option<f64>,
}

/// The figures of every cabled directed link that has counters (or whose
/// far end has), between `a` (or the counters' last clearing) and `b`.
pub fn measure(
    topo: &Topology,
    a: Option<&Placed>,
    b: &Placed,
    opts: &MeasureOptions,
) -> Result<(Vec<LinkFigures>, Vec<String>)> {
    check_clocks(a, b)?;
    let default_gbps = opts
        .default_gbps
        .or_else(|| most_common_gbps(topo))
        .unwrap_or(100.0);
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for (n, node) in topo.nodes.iter().enumerate() {
        for p in 1..node.ports.len() {
            let Some(far) = node.ports[p] else { continue };
            let port = p as u8;
            if b.sample(n, port).is_none() && b.sample(far.node, far.port).is_none() {
                continue;
            }
            let f = link_figures(topo, a, b, (n, port), default_gbps, opts.tick_ns);
            out.push(f);
        }
    }
    if out.is_empty() {
        return Err(FabricError::Invalid(format!(
            "{}: no port of the snapshot is a cabled port of the topology",
            b.file.display()
        )));
    }
    let saturated = out
        .iter()
        .filter(|f| f.flags.iter().any(|x| x.ends_with("saturated")))
        .count();
    if saturated > 0 {
        notes.push(format!(
            "{saturated} link(s) have a counter at all ones (saturated): read the extended counters (perfquery -x) or clear them (evb fabric counters --reset) closer to the interval"
        ));
    }
    Ok((out, notes))
}

/// Two snapshots must be on one clock, the later after the earlier; a
/// single one needs the time its counters were cleared.
fn check_clocks(a: Option<&Placed>, b: &Placed) -> Result<()> {
    let bad = |m: String| FabricError::Invalid(m);
    match a {
        Some(a) => {
            if a.snap.clock != b.snap.clock {
                return Err(bad(format!(
                    "{} is on the {} clock and {} on the {} clock",
                    a.file.display(),
                    a.snap.clock,
                    b.file.display(),
                    b.snap.clock
                )));
            }
            if b.snap.time_s <= a.snap.time_s {
                return Err(bad(format!(
                    "{} (read at {}) is not later than {} (read at {}): give the earlier snapshot first",
                    b.file.display(),
                    b.snap.time_s,
                    a.file.display(),
                    a.snap.time_s
                )));
            }
        }
        None => {
            let ok = b.snap.reset_at_s.is_some_and(|r| r < b.snap.time_s);
            if !ok {
                return Err(bad(format!(
                    "{}: one snapshot gives rates only when it says since when it counts (reset_at_s, as evb sim writes); give two snapshots: --counters EARLIER LATER",
                    b.file.display()
                )));
            }
        }
    }
    Ok(())
}

/// The rate most host links run at, Gb/s.
fn most_common_gbps(topo: &Topology) -> Option<f64> {
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for h in topo.hosts() {
        if let Some(g) = topo.nodes[h]
            .first_port()
            .and_then(|p| topo.link_gbps(h, p))
        {
            *count.entry((g * 1000.0) as u64).or_default() += 1;
        }
    }
    count
        .into_iter()
        .max_by_key(|x| x.1)
        .map(|(g, _)| g as f64 / 1000.0)
}

/// The earlier value of a counter of a port: the earlier snapshot's, or
/// zero where the counters were cleared (`reset_at_s`, or read with
/// `perfquery -r`).
fn earlier(a: Option<&Placed>, node: usize, port: u8, name: &str) -> Option<u64> {
    match a {
        None => Some(0),
        Some(a) if a.snap.reset_after_read => Some(0),
        Some(a) => a.sample(node, port)?.get(name),
    }
}

/// When the earlier reading of `node` port `port` was.
fn earlier_time(a: Option<&Placed>, b: &Placed, node: usize, port: u8) -> f64 {
    match a {
        Some(a) => a.time_of(node, port),
        None => b.snap.reset_at_s.unwrap_or(0.0),
    }
}

/// The change of the first of `names` that both readings have, with the
/// name used and what happened.
fn change(
    a: Option<&Placed>,
    b: &Placed,
    at: (usize, u8),
    names: &[&str],
    plausible: &dyn Fn(&str, u64) -> bool,
) -> Option<(u64, &'static str, Change)> {
    let s = b.sample(at.0, at.1)?;
    names.iter().find_map(|&name| {
        let d = counter_def(name)?;
        let vb = s.get(name)?;
        let va = earlier(a, at.0, at.1, name)?;
        let (v, c) = delta(va, vb, d.bits, |x| plausible(name, x));
        Some((v, d.name, c))
    })
}

/// The figures of the directed link out of `at`.
fn link_figures(
    topo: &Topology,
    a: Option<&Placed>,
    b: &Placed,
    at: (usize, u8),
    default_gbps: f64,
    tick_override: Option<f64>,
) -> LinkFigures {
    let (n, port) = at;
    let far = topo.nodes[n].ports[port as usize].expect("cabled");
    let rate = topo.link_rate(n, port);
    let gbps = rate.map_or(default_gbps, |r| r.gbps());
    let interval = (b.time_of(n, port) - earlier_time(a, b, n, port)).max(1e-12);
    let speed = rate.map_or(Speed::Edr, |r| r.speed);
    let tick = b
        .sample(n, port)
        .and_then(|s| s.tick_ns)
        .or(tick_override)
        .unwrap_or_else(|| speed.symbol_ns());
    // A wrap is believed only where the wrapped amount is one the link
    // could have carried (or waited) in the interval.
    let plausible = |name: &str, v: u64| match counter_def(name).map(|d| d.class) {
        Some(Class::Data) => v as f64 * 32.0 / interval <= gbps * 1e9 * 1.05,
        Some(Class::Wait) => v as f64 * tick * 1e-9 <= interval * 1.05,
        _ => false,
    };
    let mut flags = Vec::new();
    let mut note = |name: &str, c: Change| {
        if c != Change::Grew {
            flags.push(format!("{name}: {}", c.as_str()));
        }
    };
    let sent = change(
        a,
        b,
        at,
        &["PortXmitDataExtended", "PortXmitData"],
        &plausible,
    )
    .or_else(|| {
        change(
            a,
            b,
            (far.node, far.port),
            &["PortRcvDataExtended", "PortRcvData"],
            &plausible,
        )
    });
    if let Some((_, name, c)) = sent {
        note(name, c);
    }
    let data_gbps = sent.map(|(v, _, _)| v as f64 * 32.0 / interval / 1e9);
    let waited = change(a, b, at, &["PortXmitWaitExt", "PortXmitWait"], &plausible);
    if let Some((_, name, c)) = waited {
        note(name, c);
    }
    let errors = errors(a, b, at, &mut note);
    let node = &topo.nodes[n];
    let to = &topo.nodes[far.node];
    LinkFigures {
        link: format!("{}:{}->{}:{}", node.name, port, to.name, far.port),
        node: node.name.clone(),
        port,
        to: to.name.clone(),
        to_port: far.port,
        tier: match (node.is_switch(), to.is_switch()) {
            (false, _) => "host up",
            (true, false) => "host down",
            (true, true) => "switch",
        },
        node_id: n,
        to_id: far.node,
        rate: rate.map(|r| r.to_string()),
        gbps,
        interval_s: interval,
        data_gbps,
        utilisation: data_gbps.map(|d| d / gbps),
        wait: waited.map(|(v, _, _)| v as f64 * tick * 1e-9 / interval),
        tick_ns: Some(tick),
        errors,
        flags,
    }
}

/// The error counters of the port at `at` that grew, by name (the
/// extended counter where both readings have it).
fn errors(
    a: Option<&Placed>,
    b: &Placed,
    at: (usize, u8),
    note: &mut dyn FnMut(&str, Change),
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let never = |_: &str, _: u64| false;
    for d in COUNTERS
        .iter()
        .filter(|d| d.class == Class::Error && d.bits < 64)
    {
        let ext = format!("{}Ext", d.name);
        let Some((v, name, c)) = change(a, b, at, &[ext.as_str(), d.name], &never) else {
            continue;
        };
        note(name, c);
        if v > 0 {
            out.insert(d.name.to_string(), v);
        }
    }
    out
}
