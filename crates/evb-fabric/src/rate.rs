//! Link width and speed as `ibnetdiscover` prints them (`4xQDR`, `4xEDR`,
//! `1xSDR`, ...), the data rate they carry, and the degraded links of a
//! fabric (a link slower than most links of its tier).
//!
//! Data rates are after line encoding, per lane: SDR 2, DDR 4, QDR 8 Gb/s
//! (2.5, 5, 10 Gbaud with 8b/10b); FDR10 10, FDR 13.64, EDR 25 Gb/s
//! (10.3125, 14.0625, 25.78125 Gbaud with 64b/66b); HDR 50, NDR 100,
//! XDR 200 Gb/s (the nominal data rates of the PAM4 generations). A link
//! carries `width x lane rate`: 4xQDR 32, 4xFDR 54.55, 4xEDR 100, 4xHDR
//! 200 Gb/s.

use crate::io::switch_heights;
use crate::topo::Topology;
use std::collections::BTreeMap;
use std::fmt;

/// Lane speed of an InfiniBand link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Speed {
    Sdr,
    Ddr,
    Qdr,
    Fdr10,
    Fdr,
    Edr,
    Hdr,
    Ndr,
    Xdr,
}

/// Every speed with its `ibnetdiscover` spelling and data rate per lane.
const SPEEDS: &[(Speed, &str, f64)] = &[
    (Speed::Sdr, "SDR", 2.0),
    (Speed::Ddr, "DDR", 4.0),
    (Speed::Qdr, "QDR", 8.0),
    (Speed::Fdr10, "FDR10", 10.0),
    // 14.0625 Gbaud, 64b/66b.
    (Speed::Fdr, "FDR", 14.0625 * 64.0 / 66.0),
    (Speed::Edr, "EDR", 25.0),
    (Speed::Hdr, "HDR", 50.0),
    (Speed::Ndr, "NDR", 100.0),
    (Speed::Xdr, "XDR", 200.0),
];

/// Link widths (lanes) InfiniBand defines.
pub const WIDTHS: &[u8] = &[1, 2, 4, 8, 12];

impl Speed {
    fn entry(self) -> &'static (Speed, &'static str, f64) {
        SPEEDS
            .iter()
            .find(|e| e.0 == self)
            .expect("every speed is in SPEEDS")
    }
    /// Data rate of one lane, Gb/s.
    pub fn lane_gbps(self) -> f64 {
        self.entry().2
    }
    /// The symbol time: how long one byte takes on one lane, ns (SDR 4,
    /// QDR 1, EDR 0.32). IBA counts `PortXmitWait` in ticks that are a
    /// multiple of it.
    pub fn symbol_ns(self) -> f64 {
        8.0 / self.lane_gbps()
    }
    /// `QDR`, `EDR`, ...
    pub fn name(self) -> &'static str {
        self.entry().1
    }
    pub fn parse(s: &str) -> Option<Speed> {
        SPEEDS
            .iter()
            .find(|e| e.1.eq_ignore_ascii_case(s))
            .map(|e| e.0)
    }
}

/// Width and speed of a link: what it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkRate {
    /// Lanes: 1, 2, 4, 8 or 12.
    pub width: u8,
    pub speed: Speed,
}

impl LinkRate {
    pub const EDR4: LinkRate = LinkRate {
        width: 4,
        speed: Speed::Edr,
    };

    /// Data rate, Gb/s.
    pub fn gbps(&self) -> f64 {
        self.width as f64 * self.speed.lane_gbps()
    }

    /// Parses `4xEDR` (case-insensitive). The error says what is wrong.
    pub fn parse(s: &str) -> Result<LinkRate, String> {
        let (w, sp) = s
            .split_once(['x', 'X'])
            .ok_or_else(|| format!("'{s}' is not WIDTHxSPEED (e.g. 4xEDR)"))?;
        let width: u8 = w
            .parse()
            .ok()
            .filter(|w| WIDTHS.contains(w))
            .ok_or_else(|| format!("'{s}': width '{w}x' is not one of 1x 2x 4x 8x 12x"))?;
        let speed = Speed::parse(sp).ok_or_else(|| {
            format!(
                "'{s}': speed '{sp}' is not one of {}",
                SPEEDS.iter().map(|e| e.1).collect::<Vec<_>>().join(" ")
            )
        })?;
        Ok(LinkRate { width, speed })
    }

    /// The 4x link of a data rate (`100` -> 4xEDR), or a `WIDTHxSPEED` name.
    pub fn parse_gbps_or_name(s: &str) -> Result<LinkRate, String> {
        if s.contains(['x', 'X']) {
            return LinkRate::parse(s);
        }
        let g: f64 = s
            .parse()
            .map_err(|_| format!("'{s}' is neither Gb/s nor WIDTHxSPEED (e.g. 200 or 4xHDR)"))?;
        SPEEDS
            .iter()
            .map(|e| LinkRate {
                width: 4,
                speed: e.0,
            })
            // 54.5 for 4xFDR's 54.55.
            .find(|r| (r.gbps() - g).abs() < 0.1)
            .ok_or_else(|| {
                format!(
                    "{s} Gb/s is not the rate of a 4x link ({}); give WIDTHxSPEED for other widths",
                    SPEEDS
                        .iter()
                        .map(|e| fmt_gbps(4.0 * e.2))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

impl fmt::Display for LinkRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.speed.name())
    }
}

/// A data rate for people: `100`, `54.55`.
pub fn fmt_gbps(g: f64) -> String {
    if (g - g.round()).abs() < 1e-9 {
        format!("{}", g.round() as i64)
    } else {
        format!("{g:.2}")
    }
}

/// A link slower than most links of its tier.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DegradedLink {
    /// One end (the end nearer the hosts) and its port.
    pub node: String,
    pub port: u8,
    pub to: String,
    pub to_port: u8,
    /// `4xDDR`.
    pub rate: String,
    pub gbps: f64,
    /// What most links of the tier run at.
    pub usual_rate: String,
    pub usual_gbps: f64,
    /// `host links`, `switch links at heights 0-1`, ...
    pub tier: String,
    /// Links of the tier, and how many run at the usual rate.
    pub tier_links: usize,
    pub tier_usual: usize,
}

/// Cables grouped by rate: `(rate, count)`, fastest first, and the cables
/// without a known rate.
pub fn rate_census(topo: &Topology) -> (Vec<(LinkRate, usize)>, usize) {
    let mut by: BTreeMap<LinkRate, usize> = BTreeMap::new();
    let mut unknown = 0;
    for_each_cable(topo, |_, _, rate| match rate {
        Some(r) => *by.entry(r).or_default() += 1,
        None => unknown += 1,
    });
    let mut v: Vec<(LinkRate, usize)> = by.into_iter().collect();
    v.sort_by(|a, b| b.0.gbps().total_cmp(&a.0.gbps()).then(a.0.cmp(&b.0)));
    (v, unknown)
}

/// Calls `f(node, port, rate)` once per cable (from its lower-numbered end).
fn for_each_cable(topo: &Topology, mut f: impl FnMut(usize, u8, Option<LinkRate>)) {
    for (i, n) in topo.nodes.iter().enumerate() {
        for (p, r) in n.ports.iter().enumerate() {
            if let Some(r) = r {
                if (i, p as u8) < (r.node, r.port) {
                    f(i, p as u8, r.rate);
                }
            }
        }
    }
}

/// Links slower than the usual rate of their tier. A tier is the pair of
/// levels a cable joins (hosts, then switches by distance from the hosts),
/// so host links are compared with host links and leaf up-links with leaf
/// up-links. The usual rate is the most common one (the faster on a tie);
/// cables without a known rate are left out.
pub fn degraded_links(topo: &Topology) -> Vec<DegradedLink> {
    let h = switch_heights(topo);
    // Hosts at level 0, switches at 1 + height; unreachable switches last.
    let level = |i: usize| -> u32 {
        if topo.nodes[i].is_switch() {
            h[i].saturating_add(1)
        } else {
            0
        }
    };
    // (lower level, upper level) -> cables as (node, port, rate).
    type Cables = Vec<(usize, u8, LinkRate)>;
    let mut tiers: BTreeMap<(u32, u32), Cables> = BTreeMap::new();
    for_each_cable(topo, |i, p, rate| {
        let Some(rate) = rate else { return };
        let r = topo.nodes[i].ports[p as usize].expect("cabled");
        // The end nearer the hosts first.
        let (a, pa) = if (level(i), i) <= (level(r.node), r.node) {
            (i, p)
        } else {
            (r.node, r.port)
        };
        let (la, lb) = (level(i).min(level(r.node)), level(i).max(level(r.node)));
        tiers.entry((la, lb)).or_default().push((a, pa, rate));
    });
    let mut out = vec![];
    for ((la, lb), links) in tiers {
        let mut count: BTreeMap<LinkRate, usize> = BTreeMap::new();
        for l in &links {
            *count.entry(l.2).or_default() += 1;
        }
        let (&usual, &n_usual) = count
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(a.0.gbps().total_cmp(&b.0.gbps())))
            .expect("a tier has links");
        let tier = match (la, lb) {
            (0, _) => "host links".to_string(),
            (a, b) if a == b => format!("switch links within height {}", a - 1),
            (a, b) => format!("switch links between heights {} and {}", a - 1, b - 1),
        };
        for &(a, pa, rate) in &links {
            if rate.gbps() < usual.gbps() - 1e-9 {
                let r = topo.nodes[a].ports[pa as usize].expect("cabled");
                out.push(DegradedLink {
                    node: topo.nodes[a].name.clone(),
                    port: pa,
                    to: topo.nodes[r.node].name.clone(),
                    to_port: r.port,
                    rate: rate.to_string(),
                    gbps: rate.gbps(),
                    usual_rate: usual.to_string(),
                    usual_gbps: usual.gbps(),
                    tier: tier.clone(),
                    tier_links: links.len(),
                    tier_usual: n_usual,
                });
            }
        }
    }
    out
}

impl DegradedLink {
    /// `leaf001 port 3 -> node003 port 1: 4xDDR (16 Gb/s) where 31 of 32
    /// host links run 4xEDR (100 Gb/s)`.
    pub fn describe(&self) -> String {
        format!(
            "{} port {} -> {} port {}: {} ({} Gb/s) where {} of {} {} run {} ({} Gb/s)",
            self.node,
            self.port,
            self.to,
            self.to_port,
            self.rate,
            fmt_gbps(self.gbps),
            self.tier_usual,
            self.tier_links,
            self.tier,
            self.usual_rate,
            fmt_gbps(self.usual_gbps)
        )
    }
}

/// Link rates and degraded links, for people (stdout) and the JSON.
pub fn link_summary(topo: &Topology) -> (Vec<String>, serde_json::Value) {
    let (census, unknown) = rate_census(topo);
    let degraded = degraded_links(topo);
    let mut lines = vec![];
    if !census.is_empty() {
        let parts: Vec<String> = census
            .iter()
            .map(|(r, n)| format!("{n} x {r} ({} Gb/s)", fmt_gbps(r.gbps())))
            .collect();
        let unk = if unknown > 0 {
            format!(", {unknown} of unknown rate")
        } else {
            String::new()
        };
        lines.push(format!("links: {}{unk}", parts.join(", ")));
    }
    // One line per tier and rate: a slow leaf can have dozens.
    let mut shown: Vec<(&str, &str)> = vec![];
    for d in &degraded {
        if shown.contains(&(d.tier.as_str(), d.rate.as_str())) {
            continue;
        }
        shown.push((&d.tier, &d.rate));
        let same: Vec<&DegradedLink> = degraded
            .iter()
            .filter(|x| x.tier == d.tier && x.rate == d.rate)
            .collect();
        if same.len() == 1 {
            lines.push(format!("degraded link: {}", d.describe()));
            continue;
        }
        let ends: Vec<String> = same
            .iter()
            .take(4)
            .map(|x| format!("{} port {} -> {} port {}", x.node, x.port, x.to, x.to_port))
            .collect();
        lines.push(format!(
            "degraded links: {} of {} {} run {} ({} Gb/s) where {} run {} ({} Gb/s): {}{}",
            same.len(),
            d.tier_links,
            d.tier,
            d.rate,
            fmt_gbps(d.gbps),
            d.tier_usual,
            d.usual_rate,
            fmt_gbps(d.usual_gbps),
            ends.join(", "),
            if same.len() > ends.len() {
                format!(
                    ", ... ({} more; the JSON lists all)",
                    same.len() - ends.len()
                )
            } else {
                String::new()
            }
        ));
    }
    let json = serde_json::json!({
        "link_rates": census.iter().map(|(r, n)| serde_json::json!({
            "rate": r.to_string(), "gbps": r.gbps(), "cables": n})).collect::<Vec<_>>(),
        "links_of_unknown_rate": unknown,
        "degraded_links": degraded,
    });
    (lines, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_of_the_generations() {
        let g = |s: &str| LinkRate::parse(s).unwrap().gbps();
        assert_eq!(g("4xSDR"), 8.0);
        assert_eq!(g("4xDDR"), 16.0);
        assert_eq!(g("4xQDR"), 32.0);
        assert_eq!(g("4xFDR10"), 40.0);
        assert!((g("4xFDR") - 54.545).abs() < 1e-3);
        assert_eq!(g("4xEDR"), 100.0);
        assert_eq!(g("4xHDR"), 200.0);
        assert_eq!(g("4xNDR"), 400.0);
        assert_eq!(g("1xSDR"), 2.0);
        assert_eq!(g("12xQDR"), 96.0);
        assert_eq!(g("2xHDR"), 100.0);
        assert_eq!(LinkRate::parse("4xedr").unwrap().to_string(), "4xEDR");
        for bad in ["3xQDR", "4xQQR", "QDR", "x", "4x", "0xEDR", "256xEDR"] {
            assert!(LinkRate::parse(bad).is_err(), "{bad}");
        }
        let r = |s: &str| LinkRate::parse_gbps_or_name(s).unwrap().to_string();
        assert_eq!(r("100"), "4xEDR");
        assert_eq!(r("200"), "4xHDR");
        assert_eq!(r("54.5"), "4xFDR");
        assert_eq!(r("1xEDR"), "1xEDR");
        assert!(LinkRate::parse_gbps_or_name("150").is_err());
        assert!(LinkRate::parse_gbps_or_name("fast").is_err());
    }
}
