//! Slot schedules for fabrics whose links run at different rates.
//!
//! The slotted barrel sizes its slots so that a fragment fits one: on a
//! fabric of mixed rates (a QDR cluster with a DDR island, a host whose
//! cable trained at half width), slots sized for the slowest path make
//! every fragment on a fast path idle most of its slot. The alternative is
//! slots sized for a faster rate, in which a flow over a slower path takes
//! the slots it needs: `span = ceil(slot rate / path rate)` consecutive
//! slots, during which its links carry nothing else (flows share a link up to
//! its rate, each at its path's: a QDR link carries two DDR flows at once). The
//! source idles in the slots its fragment spans; the schedule file marks
//! them `+` ([`SlotSchedule::to_text`]).
//!
//! [`rated_schedule`] packs the flows first-fit into a rotation, the
//! longest flows first; [`choose_slot_rate`] compares, for each rate a path
//! of the fabric runs at, the rotation's length in time (slots over the
//! slot rate) and keeps the shortest, the schedule sized for the slowest
//! path among them. On a fabric of one rate nothing changes.

use crate::error::Result;
use crate::lft::{link_of, trace, Lfts};
use crate::schedule::{choose, ChosenSchedule, SlotSchedule};
use crate::topo::Topology;

/// Flows x slots above which no rate-aware schedule is packed (first fit
/// weighs slots for every flow, as the conflict-aware search does).
const RATED_SIZE_LIMIT: usize = 20_000_000;

/// Rates within this fraction count as one (a path at 99.9 % of the slot
/// rate takes one slot).
const RATE_SLACK: f64 = 1e-6;

/// Fraction of a link's rate flows that share it leave unused: two DDR
/// flows that fill a QDR link exactly stretch with every control message
/// beside them.
const SHARE_HEADROOM: f64 = 0.01;

/// One flow: source and destination rank, its directed links, and the
/// least rate along them (`None`: no link on it has a known rate).
struct Flow {
    src: usize,
    dst: usize,
    path: Vec<u32>,
    gbps: Option<f64>,
}

/// Every flow of the rotation (a rank to itself too with `local`).
fn flows(topo: &Topology, lfts: &Lfts, order: &[usize], local: bool) -> Result<Vec<Flow>> {
    let (offsets, _) = topo.port_offsets();
    let n = order.len();
    let mut out = Vec::with_capacity(n * n);
    for s in 0..n {
        for d in (0..n).filter(|&d| d != s || local) {
            let mut path = Vec::new();
            if s != d {
                trace(topo, lfts, &offsets, order[s], order[d], &mut path)?;
            }
            let gbps = path
                .iter()
                .filter_map(|&l| {
                    let (node, port) = link_of(&offsets, l);
                    topo.link_gbps(node, port)
                })
                .reduce(f64::min);
            out.push(Flow {
                src: s,
                dst: d,
                path,
                gbps,
            });
        }
    }
    Ok(out)
}

/// Whether a flow at `rate` fits on a link of `cap` that carries `used`
/// already: a flow alone always does; flows that share a link need
/// [`SHARE_HEADROOM`] of it to spare.
fn fits_beside(used: f64, rate: f64, cap: f64) -> bool {
    used <= 0.0 || used + rate <= cap * (1.0 - SHARE_HEADROOM)
}

/// Slots a flow at `gbps` spans when the slots are sized for `slot_gbps`.
fn span_for(gbps: Option<f64>, slot_gbps: f64) -> usize {
    gbps.map_or(1, |g| {
        ((slot_gbps / g) - RATE_SLACK).ceil().max(1.0) as usize
    })
}

/// The rate a directed link carries, Gb/s (`slot_gbps` where its rate is
/// unknown): flows share it up to that, each at its own path's rate, so
/// that a QDR link carries two DDR flows at once.
fn capacity(topo: &Topology, offsets: &[u32], link: u32, slot_gbps: f64) -> f64 {
    let (node, port) = link_of(offsets, link);
    topo.link_gbps(node, port).unwrap_or(slot_gbps)
}

/// The rate-aware schedule of the ranks `order` with slots sized for
/// `slot_gbps`: every flow placed at the first slot from which its links
/// have room for its whole span, the flows of longer spans first, each
/// group in shift order (step by step, rank by rank) so that a fabric of
/// one rate gets the plain barrel back. `None` when the fabric is too big
/// to pack this way.
pub fn rated_schedule(
    topo: &Topology,
    lfts: &Lfts,
    order: &[usize],
    local: bool,
    slot_gbps: f64,
) -> Result<Option<SlotSchedule>> {
    let all = flows(topo, lfts, order, local)?;
    Ok(pack(topo, order.len(), &all, local, slot_gbps))
}

/// [`rated_schedule`] of the flows `all` among `n` ranks.
fn pack(
    topo: &Topology,
    n: usize,
    all: &[Flow],
    local: bool,
    slot_gbps: f64,
) -> Option<SlotSchedule> {
    assert!(slot_gbps > 0.0, "slots sized for a positive rate");
    let (offsets, nlinks) = topo.port_offsets();
    let spans: Vec<usize> = all.iter().map(|f| span_for(f.gbps, slot_gbps)).collect();
    // What a flow takes of each link on its path, Gb/s, for its span.
    let demand = |f: &Flow| f.gbps.map_or(slot_gbps, |g| g.min(slot_gbps));
    let cap: Vec<f64> = (0..nlinks as u32)
        .map(|l| capacity(topo, &offsets, l, slot_gbps))
        .collect();
    // The busiest link, in slots: no rotation is shorter.
    // A flow that cannot share its link with one like it takes the link
    // whole; smaller ones their share of it.
    let mut load = vec![0f64; nlinks];
    for (f, &span) in all.iter().zip(&spans) {
        for &l in &f.path {
            let c = cap[l as usize];
            let share = if fits_beside(demand(f), demand(f), c) {
                demand(f) / c
            } else {
                1.0
            };
            load[l as usize] += share * span as f64;
        }
    }
    // A rank's own fragments (local ones included) take its time too.
    let mut per_rank = vec![0usize; n];
    for (f, &span) in all.iter().zip(&spans) {
        per_rank[f.src] += span;
    }
    let lower_bound = load
        .iter()
        .map(|&l| (l - RATE_SLACK).ceil().max(0.0) as usize)
        .chain(per_rank)
        .max()
        .unwrap_or(0);
    if all.len().saturating_mul(lower_bound.max(1)) > RATED_SIZE_LIMIT {
        return None;
    }
    // Longest spans first; within a span, the shift's order.
    let mut idx: Vec<usize> = (0..all.len()).collect();
    let step = |f: &Flow| (f.dst + n - f.src) % n;
    idx.sort_by_key(|&i| (std::cmp::Reverse(spans[i]), step(&all[i]), all[i].src));
    let mut used: Vec<Vec<f64>> = vec![Vec::new(); nlinks];
    let mut busy: Vec<Vec<bool>> = vec![Vec::new(); n]; // a rank's source side
    let mut slots: Vec<Vec<Option<usize>>> = Vec::new();
    let mut span_rows: Vec<Vec<u8>> = Vec::new();
    for i in idx {
        let (f, span, rate) = (&all[i], spans[i], demand(&all[i]));
        let free = |t: usize| {
            (t..t + span).all(|k| !busy[f.src].get(k).copied().unwrap_or(false))
                && f.path.iter().all(|&l| {
                    let (u, c) = (&used[l as usize], cap[l as usize]);
                    (t..t + span).all(|k| fits_beside(u.get(k).copied().unwrap_or(0.0), rate, c))
                })
        };
        let t = (0..)
            .find(|&t| free(t))
            .expect("a slot past the end is free");
        let end = t + span;
        if slots.len() < end {
            slots.resize(end, vec![None; n]);
            span_rows.resize(end, vec![1; n]);
        }
        for &l in &f.path {
            let u = &mut used[l as usize];
            if u.len() < end {
                u.resize(end, 0.0);
            }
            u[t..end].iter_mut().for_each(|c| *c += rate);
        }
        let b = &mut busy[f.src];
        if b.len() < end {
            b.resize(end, false);
        }
        b[t..end].iter_mut().for_each(|x| *x = true);
        debug_assert!(slots[t][f.src].is_none(), "a rank sends once a slot");
        slots[t][f.src] = Some(f.dst);
        span_rows[t][f.src] = span as u8;
    }
    let plain_slots = if local { n } else { n.saturating_sub(1) };
    let moved = slots.len().saturating_sub(plain_slots);
    debug_assert!(slots.len() >= lower_bound);
    Some(SlotSchedule {
        ranks: n,
        slots,
        plain_slots,
        steps_split: 0,
        flows_moved: moved,
        lower_bound,
        spans: span_rows,
    })
}

/// A schedule and the link rate its slots are sized for.
#[derive(Debug, Clone)]
pub struct RatedChoice {
    pub chosen: ChosenSchedule,
    /// The slots' rate, Gb/s (`None`: no link has a known rate).
    pub slot_gbps: Option<f64>,
    /// The slowest path between two ranks, Gb/s.
    pub slowest_gbps: Option<f64>,
}

/// The schedule [`choose`] makes with slots sized for the slowest path,
/// or, where the fabric's paths run at several rates, a rate-aware one
/// with slots sized for a faster rate, whichever makes the rotation
/// shorter in time (slots over the slot rate).
pub fn choose_slot_rate(
    topo: &Topology,
    lfts: &Lfts,
    order: &[usize],
    order_spec: &str,
    local: bool,
    compact: bool,
) -> Result<RatedChoice> {
    let base = choose(topo, lfts, order, order_spec, local, compact)?;
    let all = flows(topo, lfts, order, local)?;
    let mut rates: Vec<f64> = all.iter().filter_map(|f| f.gbps).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup_by(|a, b| (*a - *b).abs() <= RATE_SLACK * *b);
    let Some(&slowest) = rates.first() else {
        return Ok(RatedChoice {
            chosen: base,
            slot_gbps: None,
            slowest_gbps: None,
        });
    };
    let mut best = (base.aware.slots.len() as f64 / slowest, slowest, None);
    for &rate in rates.iter().skip(1) {
        let Some(s) = pack(topo, order.len(), &all, local, rate) else {
            continue;
        };
        let time = s.slots.len() as f64 / rate;
        if time < best.0 * (1.0 - 1e-9) {
            best = (time, rate, Some(s));
        }
    }
    let (_, slot_gbps, rated) = best;
    let chosen = match rated {
        None => base,
        Some(s) => ChosenSchedule {
            shift: format!(
                "rate-aware: slots for {slot_gbps} Gb/s, a flow over a slower path spanning the slots it needs (slots for the slowest path, {slowest} Gb/s: {} slots)",
                base.aware.slots.len()
            ),
            plain: base.plain,
            aware: s,
            positions: None,
            note: base.note,
        },
    };
    Ok(RatedChoice {
        chosen,
        slot_gbps: Some(slot_gbps),
        slowest_gbps: Some(slowest),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimize::order_by_name;
    use crate::rate::LinkRate;
    use crate::routing::{route, Engine};
    use crate::topo::FatTreeSpec;

    /// A 3:1 QDR tree of 24 hosts, ranks 1 and 6 on DDR cables.
    fn mixed() -> (Topology, Lfts, Vec<usize>) {
        let mut topo = FatTreeSpec::parse("fat-tree:radix=8,hosts=24,oversub=3,gbps=4xQDR")
            .unwrap()
            .build()
            .unwrap();
        let order = order_by_name(&topo);
        for r in [1, 6] {
            let p = topo.nodes[order[r]].first_port().unwrap();
            topo.set_link_rate(order[r], p, Some(LinkRate::parse("4xDDR").unwrap()))
                .unwrap();
        }
        let lfts = route(&topo, &Engine::Ftree).unwrap();
        (topo, lfts, order)
    }

    #[test]
    fn slow_paths_span_two_fast_slots_and_no_link_is_overbooked() {
        let (topo, lfts, order) = mixed();
        let c = choose_slot_rate(&topo, &lfts, &order, "name", false, false).unwrap();
        assert_eq!((c.slot_gbps, c.slowest_gbps), (Some(32.0), Some(16.0)));
        let s = &c.chosen.aware;
        let base = choose(&topo, &lfts, &order, "name", false, false).unwrap();
        // Shorter in time than the slowest path's slots.
        assert!((s.slots.len() as f64 / 32.0) < 0.8 * base.aware.slots.len() as f64 / 16.0);
        assert!(s.slots.len() >= s.lower_bound);
        let n = order.len();
        let (offsets, nlinks) = topo.port_offsets();
        let mut seen = vec![vec![0; n]; n];
        let mut used = vec![vec![0f64; nlinks]; s.slots.len()];
        let mut users = vec![vec![0u32; nlinks]; s.slots.len()];
        for (k, row) in s.slots.iter().enumerate() {
            for (src, d) in row.iter().enumerate() {
                let Some(dst) = *d else { continue };
                seen[src][dst] += 1;
                let slow = [1, 6].contains(&src) || [1, 6].contains(&dst);
                assert_eq!(s.span(k, src), if slow { 2 } else { 1 }, "{src}->{dst}");
                let mut path = Vec::new();
                trace(&topo, &lfts, &offsets, order[src], order[dst], &mut path).unwrap();
                let rate = if slow { 16.0 } else { 32.0 };
                for t in k..k + s.span(k, src) {
                    for &l in &path {
                        used[t][l as usize] += rate;
                        users[t][l as usize] += 1;
                    }
                }
            }
        }
        for (src, row) in seen.iter().enumerate() {
            for (dst, &c) in row.iter().enumerate() {
                assert_eq!(c, u32::from(src != dst), "{src}->{dst} once a rotation");
            }
        }
        for t in 0..s.slots.len() {
            for l in 0..nlinks {
                let cap = capacity(&topo, &offsets, l as u32, 32.0);
                assert!(users[t][l] <= 1 || used[t][l] <= cap, "slot {t} link {l}");
            }
        }
        // The file marks the spanned slots.
        let text = s.to_text("");
        assert_eq!(text.matches(" +").count(), 2 * 2 * (n - 1) - 2);
    }

    #[test]
    fn a_fabric_of_one_rate_keeps_the_schedule_of_its_slowest_path() {
        let topo = FatTreeSpec::parse("fat-tree:radix=8,hosts=24,oversub=3,gbps=4xQDR")
            .unwrap()
            .build()
            .unwrap();
        let order = order_by_name(&topo);
        let lfts = route(&topo, &Engine::Ftree).unwrap();
        let c = choose_slot_rate(&topo, &lfts, &order, "name", false, false).unwrap();
        let base = choose(&topo, &lfts, &order, "name", false, false).unwrap();
        assert_eq!(c.chosen.aware, base.aware);
        assert_eq!(c.slot_gbps, Some(32.0));
    }
}
