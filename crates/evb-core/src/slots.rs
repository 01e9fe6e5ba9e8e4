//! The slotted barrel shift: every Readout Unit follows one clock.
//!
//! Time is cut into slots of `event_builder.slot_us`; slot `S` covers
//! `[S * slot, (S + 1) * slot)` of the EM's clock. A rotation is `T`
//! slots, and in slot `S` the RU of source `s` ships to the BU its
//! [`SlotPlan`] names for `S mod T`. The default plan is the barrel shift:
//! in slot k of a rotation RU s sends to BU (s + k) mod B, so in every slot
//! every BU receives from exactly one RU. Folded nodes whose local
//! fragments stay in memory skip the slot of their own BU (T = B - 1).
//! A schedule file replaces the plan by any table of partial permutations,
//! such as the conflict-aware schedule `evb fabric schedule` writes.
//!
//! Why a clock and not the RU's own sends: a barrel whose phase advances
//! with each RU's sends drifts (RUs finish at slightly different times),
//! and once two RUs aim at the same BU both slow down and the drift grows
//! into head-of-line blocking. With one clock the RUs stay in step however
//! long the run; the slot is a little longer than a fragment takes on the
//! link, which absorbs jitter (the time-window linear shifter of the
//! reference simulation study).

use std::path::Path;
use std::sync::Arc;

use crate::bu::Nanos;
use crate::config::{Config, ConfigError, LocalTraffic, SizeModel};
use crate::layout::Layout;
use crate::wire::{FRAGMENT_HEADER_LEN, FRAME_HEADER_LEN};

/// Per-packet headers of the fabric, as a fraction of the payload: the
/// auto slot leaves room for them (InfiniBand: 26 B per 4 KiB packet plus
/// 16 B on a message's first, 0.6 %; Ethernet with RoCE about 1.5 %).
const HEADER_ALLOWANCE: f64 = 0.015;

/// A schedule read from `event_builder.schedule_file`: per slot of a
/// rotation, the destination node of every node (or none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTable {
    /// Nodes the table was written for.
    pub nodes: u16,
    /// `slots[k][n]`: where node `n` sends in slot `k`.
    pub slots: Vec<Vec<Option<u16>>>,
    /// `spans[k][n]`: slots node `n`'s fragment of slot `k` spans (`+` in
    /// the file in the slots after the first: a path slower than the
    /// slots are sized for); empty when every fragment spans one slot.
    pub spans: Vec<Vec<u8>>,
}

/// Upper bound on the slots of a schedule file (a rotation of a 4096-node
/// barrel with every step split in four), so a hostile file cannot make a
/// node allocate without bound.
pub const MAX_TABLE_SLOTS: usize = 1 << 14;

impl SlotTable {
    /// Parses a schedule file: `#` comments, then one line per slot with
    /// one entry per node, the destination node index or `-` for none.
    /// Errors name the file and the line.
    pub fn parse(origin: &str, text: &str) -> Result<SlotTable, String> {
        let mut nodes: Option<usize> = None;
        let mut slots: Vec<Vec<Option<u16>>> = Vec::new();
        let mut spans: Vec<Vec<u8>> = Vec::new();
        let mut plus: Vec<Vec<bool>> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = |m: String| format!("{origin}:{}: {m}", i + 1);
            // An optional `slot K:` label, as `evb fabric schedule` writes.
            let entries = match line.split_once(':') {
                Some((label, rest)) if label.trim_start().starts_with("slot") => rest,
                Some(_) => return Err(at(format!("expected `slot K: d0 d1 ...`, got `{line}`"))),
                None => line,
            };
            let words: Vec<&str> = entries.split_whitespace().collect();
            let row: Vec<Option<u16>> = words
                .iter()
                .map(|&e| match e {
                    "-" | "+" => Ok(None),
                    _ => e
                        .parse::<u16>()
                        .map(Some)
                        .map_err(|_| at(format!("`{e}` is neither a node index, `-` nor `+`"))),
                })
                .collect::<Result<_, _>>()?;
            let n = *nodes.get_or_insert(row.len());
            if row.len() != n {
                return Err(at(format!(
                    "{} entries, but the first slot has {n} (one per node)",
                    row.len()
                )));
            }
            if let Some(bad) = row.iter().flatten().find(|&&d| usize::from(d) >= n) {
                return Err(at(format!("node {bad} does not exist ({n} nodes)")));
            }
            let mut seen = vec![false; n];
            for &d in row.iter().flatten() {
                if std::mem::replace(&mut seen[usize::from(d)], true) {
                    return Err(at(format!(
                        "node {d} receives twice in one slot (a slot is a partial permutation)"
                    )));
                }
            }
            if slots.len() == MAX_TABLE_SLOTS {
                return Err(at(format!("more than {MAX_TABLE_SLOTS} slots")));
            }
            // `+`: the node's fragment of an earlier slot spans this one.
            spans.push(vec![1u8; n]);
            for (node, _) in words.iter().enumerate().filter(|(_, w)| **w == "+") {
                let k = slots.len();
                let first = (0..k).rev().find(|&j| slots[j][node].is_some());
                let Some(first) = first.filter(|&j| (j + 1..k).all(|m| plus[m][node])) else {
                    return Err(at(format!(
                        "`+` for node {node}, whose slot before sends nothing (`+` continues a fragment)"
                    )));
                };
                let span: &mut u8 = &mut spans[first][node];
                *span = span
                    .checked_add(1)
                    .ok_or_else(|| at("a fragment spans over 255 slots".into()))?;
            }
            plus.push(words.iter().map(|w| *w == "+").collect());
            slots.push(row);
        }
        let Some(nodes) = nodes.filter(|&n| n > 0) else {
            return Err(format!("{origin}: no slots (one line per slot)"));
        };
        if spans.iter().flatten().all(|&s| s == 1) {
            spans.clear();
        }
        Ok(SlotTable {
            nodes: u16::try_from(nodes).map_err(|_| format!("{origin}: too many nodes"))?,
            slots,
            spans,
        })
    }

    /// Reads and parses a schedule file.
    pub fn load(path: &Path) -> Result<SlotTable, String> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{origin}: {e}"))?;
        SlotTable::parse(&origin, &text)
    }

    /// The table as a schedule file (what [`SlotTable::parse`] reads).
    pub fn to_text(&self, comment: &str) -> String {
        let mut out = String::new();
        for line in comment.lines() {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
        let mut spanning = vec![0u8; usize::from(self.nodes)];
        for (k, row) in self.slots.iter().enumerate() {
            out.push_str(&format!("slot {k}:"));
            for (n, d) in row.iter().enumerate() {
                match d {
                    Some(d) => {
                        out.push_str(&format!(" {d}"));
                        spanning[n] = self.span_of(k, n) - 1;
                    }
                    None if spanning[n] > 0 => {
                        out.push_str(" +");
                        spanning[n] -= 1;
                    }
                    None => out.push_str(" -"),
                }
            }
            out.push('\n');
        }
        out
    }

    /// Slots node `node`'s fragment of slot `k` spans (1 unless the table
    /// says otherwise with `+`).
    pub fn span_of(&self, k: usize, node: usize) -> u8 {
        self.spans.get(k).map_or(1, |row| row[node])
    }

    /// Checks the table against the run: the node count matches, and every
    /// RU reaches every BU it must ship to (else their MEPs could never be
    /// built). Returns a message for `event_builder.schedule_file`.
    pub fn check(&self, layout: &Layout, local: LocalTraffic) -> Result<(), String> {
        if self.nodes != layout.nodes {
            return Err(format!(
                "the schedule is for {} nodes, the run has {}",
                self.nodes, layout.nodes
            ));
        }
        for &ru in &layout.ru_nodes {
            for &bu in &layout.bu_nodes {
                if ru == bu && local == LocalTraffic::Memory {
                    continue;
                }
                if !self.slots.iter().any(|row| row[ru as usize] == Some(bu)) {
                    return Err(format!(
                        "node {ru} never sends to node {bu} (its fragments for that BU could never be shipped)"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where the slots lie on the EM's clock: from slot `from` on, slot S
/// starts at `start_ns + (S - from) * slot_ns`. It starts as slot S at
/// `S * slot_ns`; the EM moves it to longer (or back to shorter) slots
/// with [`crate::wire::Message::SlotLength`], from a slot every RU has
/// yet to reach, so the RUs' slots stay one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotEpoch {
    pub from: u64,
    pub start_ns: u64,
    pub slot_ns: Nanos,
}

impl SlotEpoch {
    pub fn nominal(slot_ns: Nanos) -> SlotEpoch {
        SlotEpoch {
            from: 0,
            start_ns: 0,
            slot_ns: slot_ns.max(1),
        }
    }

    /// The slot EM time `t` falls in (the epoch's first slot for times
    /// before it: those slots are of an earlier epoch, long gone).
    pub fn slot_at(&self, t: i128) -> u64 {
        let since = (t - i128::from(self.start_ns)).max(0);
        self.from + (since / i128::from(self.slot_ns.max(1))) as u64
    }

    /// When slot `slot` starts, EM time.
    pub fn start_of(&self, slot: u64) -> i128 {
        let k = i128::from(slot) - i128::from(self.from);
        i128::from(self.start_ns) + k * i128::from(self.slot_ns)
    }

    /// This epoch with slots of `slot_ns` from slot `from` on.
    pub fn changed_at(&self, from: u64, slot_ns: Nanos) -> SlotEpoch {
        let start = self.start_of(from).clamp(0, i128::from(u64::MAX)) as u64;
        SlotEpoch {
            from,
            start_ns: start,
            slot_ns: slot_ns.max(1),
        }
    }
}

/// The slots in effect: the current epoch, and the one before it for the
/// slots before the current one starts (an epoch is announced ahead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotClock {
    prev: SlotEpoch,
    cur: SlotEpoch,
}

impl SlotClock {
    pub fn new(slot_ns: Nanos) -> SlotClock {
        let e = SlotEpoch::nominal(slot_ns);
        SlotClock { prev: e, cur: e }
    }

    /// The latest epoch (in effect from its first slot on).
    pub fn epoch(&self) -> SlotEpoch {
        self.cur
    }

    /// Takes `epoch` from its first slot on; the epoch in effect until
    /// then stays for the slots before.
    pub fn set(&mut self, epoch: SlotEpoch) {
        if epoch != self.cur {
            self.prev = self.cur;
            self.cur = epoch;
        }
    }

    pub fn slot_at(&self, t: i128) -> u64 {
        if t >= i128::from(self.cur.start_ns) {
            self.cur.slot_at(t)
        } else {
            self.prev.slot_at(t).min(self.cur.from.saturating_sub(1))
        }
    }

    pub fn start_of(&self, slot: u64) -> i128 {
        if slot >= self.cur.from {
            self.cur.start_of(slot)
        } else {
            self.prev.start_of(slot)
        }
    }

    /// The length of slot `slot`.
    pub fn len_of(&self, slot: u64) -> Nanos {
        if slot >= self.cur.from {
            self.cur.slot_ns
        } else {
            self.prev.slot_ns
        }
    }
}

/// What one RU does in each slot of a rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPlan {
    /// Slot length.
    pub slot_ns: Nanos,
    /// How late into its slot a fragment may always start (timers and
    /// completions are not exact).
    pub late_ns: Nanos,
    /// Femtoseconds a byte of fragment takes on the link (with the header
    /// allowance): a fragment starts late only if it still ends within
    /// its slot ([`SlotPlan::fits`]).
    pub fs_per_byte: u64,
    /// The mean fragment's time on the link at the nominal rate: what a
    /// slot holds beside it is the headroom control messages are paced
    /// into ([`SlotPlan::control_per_slot`], [`crate::pacer`]).
    pub mean_wire_ns: Nanos,
    /// Femtoseconds a byte takes at the rate the slots are sized for: a
    /// fragment's time on the link against what its slots allow.
    pub slot_fs_per_byte: u64,
    /// Slots the fragment of each slot of the rotation spans (empty: one).
    pub span: Vec<u8>,
    /// Per slot of the rotation: the BU index this RU ships to, if any.
    pub dest: Vec<Option<u16>>,
}

/// Bytes a control message takes on the link, generously (64 bytes and
/// its packet's headers), for pacing.
const CONTROL_WIRE_BYTES: u64 = 128;

impl SlotPlan {
    /// The plan of the RU of `source`, from the schedule file if there is
    /// one, else the barrel shift.
    pub fn for_source(config: &Config, layout: &Layout, source: u16) -> SlotPlan {
        let slot_ns = config.slot_ns();
        let late_ns = (config.event_builder.slot_grace_us * 1000.0) as Nanos;
        let fs_per_byte =
            ((1.0 + HEADER_ALLOWANCE) * 8e6 / config.node_link_gbps().max(1e-3)).round() as u64;
        let mean_fragment = event_size_moments(config).0 * f64::from(config.source.events_per_mep);
        let mean_wire_ns = (mean_fragment * fs_per_byte as f64 / 1e6) as Nanos;
        // The pace the slot's length implies: a fragment three standard
        // deviations above the mean fills it (less the grace), whether the
        // slot is the automatic one or `slot_us` set by hand.
        let slot_fs_per_byte = ((slot_ns.saturating_sub(late_ns).max(1) as f64) * 1e6
            / sized_fragment_bytes(config))
        .round()
        .max(1.0) as u64;
        let node = layout.ru_nodes[source as usize];
        if let Some(table) = &config.slot_table {
            let dest = table
                .slots
                .iter()
                .map(|row| row[node as usize].and_then(|d| layout.bu_of[d as usize]))
                .collect();
            let span = if table.spans.is_empty() {
                Vec::new()
            } else {
                (0..table.slots.len())
                    .map(|k| table.span_of(k, usize::from(node)))
                    .collect()
            };
            return SlotPlan {
                slot_ns,
                late_ns,
                fs_per_byte,
                mean_wire_ns,
                slot_fs_per_byte,
                span,
                dest,
            };
        }
        let b = layout.bus();
        let own_bu = layout.bu_of[node as usize];
        // The rotation skips the local slot only if every RU has one to
        // skip: all RUs must agree on the rotation length.
        let skip_local = config.event_builder.local == LocalTraffic::Memory
            && layout
                .ru_nodes
                .iter()
                .all(|&n| layout.bu_of[n as usize].is_some());
        let start = own_bu.map_or(source as usize % b.max(1), usize::from);
        let dest = if skip_local {
            (1..b).map(|k| Some(((start + k) % b) as u16)).collect()
        } else {
            (0..b).map(|k| Some(((start + k) % b) as u16)).collect()
        };
        SlotPlan {
            slot_ns,
            late_ns,
            fs_per_byte,
            mean_wire_ns,
            slot_fs_per_byte,
            span: Vec::new(),
            dest,
        }
    }

    /// Control messages a node sends in the headroom of a slot of
    /// `slot_ns`, at most: a quarter of what the mean fragment at the
    /// nominal rate leaves of it. From the slot in force, not the nominal
    /// one: slots the EM lengthened for a slow link leave the other nodes
    /// far more room (measured, 72 nodes with one half-rate link: the
    /// nominal budget of 36 a slot against the EM's ~40 left 10,000
    /// assignments queued at its node and the build rate falling from 36 %
    /// of link to 27 %). Not from the node's own measured stretch: over
    /// `evb run` a host's completions make its fragments look slower than
    /// the link, and a budget of one a slot would hold the EM's
    /// assignments back (the node lets them out only once its own
    /// fragment has left the link anyway).
    pub fn control_per_slot(&self, slot_ns: Nanos) -> usize {
        let headroom_bytes = u128::from(slot_ns.saturating_sub(self.mean_wire_ns)) * 1_000_000
            / u128::from(self.fs_per_byte.max(1));
        ((headroom_bytes / 4) as u64 / CONTROL_WIRE_BYTES).max(1) as usize
    }

    /// Whether a fragment of `payload` bytes that starts `late` ns into
    /// its slot of `slot_ns` still ends within it (or starts within the
    /// grace). Later,
    /// it would overlap the next slot's fragment at its BU, slow both, and
    /// the overrun would spread from BU to RU to BU: measured, letting
    /// fragments start up to a tenth of a slot late whatever their size
    /// collapses a 288-node barrel to a quarter of its rate.
    pub fn fits(&self, late: Nanos, wire_ns: Nanos, allotted_ns: Nanos) -> bool {
        late <= self.late_ns || late.saturating_add(wire_ns) <= allotted_ns
    }

    /// Slots the fragment of (absolute) slot `slot` spans.
    pub fn span_of(&self, slot: u64) -> u64 {
        if self.span.is_empty() {
            return 1;
        }
        u64::from(self.span[(slot % self.rotation()) as usize].max(1))
    }

    /// Time a fragment of `payload` bytes takes at the rate the slots are
    /// sized for.
    pub fn slot_wire_ns(&self, payload: u32) -> Nanos {
        let bytes = u64::from(payload) + (FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN) as u64;
        bytes.saturating_mul(self.slot_fs_per_byte) / 1_000_000
    }

    /// Time a fragment of `payload` bytes takes on the link, with its
    /// headers.
    pub fn wire_ns(&self, payload: u32) -> Nanos {
        let bytes = u64::from(payload) + (FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN) as u64;
        bytes.saturating_mul(self.fs_per_byte) / 1_000_000
    }

    /// Slots in a rotation.
    pub fn rotation(&self) -> u64 {
        self.dest.len().max(1) as u64
    }

    /// The BU this RU ships to in (absolute) slot `slot`.
    pub fn dest_of(&self, slot: u64) -> Option<u16> {
        self.dest
            .get((slot % self.rotation()) as usize)
            .copied()
            .flatten()
    }
}

/// The fragment a slot is sized for: three standard deviations above the
/// mean under the source model, with its headers, bytes.
fn sized_fragment_bytes(config: &Config) -> f64 {
    let (mean, std) = event_size_moments(config);
    let events = f64::from(config.source.events_per_mep);
    events * mean + 3.0 * std * events.sqrt() + (FRAME_HEADER_LEN + FRAGMENT_HEADER_LEN) as f64
}

/// Mean and standard deviation of one event's fragment size under the
/// source model, bytes (the size table's 4 bytes included).
fn event_size_moments(config: &Config) -> (f64, f64) {
    let s = &config.source;
    let (mean, std) = match s.size {
        SizeModel::Fixed => (f64::from(s.mean_bytes), 0.0),
        SizeModel::Normal => (f64::from(s.mean_bytes), f64::from(s.std_bytes)),
        SizeModel::Histogram => {
            let total: f64 = config.histogram_bins.iter().map(|b| b.1).sum();
            if total <= 0.0 {
                (0.0, 0.0)
            } else {
                let mean = config
                    .histogram_bins
                    .iter()
                    .map(|b| f64::from(b.0) * b.1)
                    .sum::<f64>()
                    / total;
                let var = config
                    .histogram_bins
                    .iter()
                    .map(|b| (f64::from(b.0) - mean).powi(2) * b.1)
                    .sum::<f64>()
                    / total;
                (mean, var.sqrt())
            }
        }
    };
    (mean + 4.0, std)
}

/// The slot length `slot_us = 0` stands for: the time a MEP fragment three
/// standard deviations above the mean takes at `link_gbps`, with room for
/// per-packet headers, plus the grace `slot_grace_us`.
pub fn auto_slot_ns(config: &Config, link_gbps: f64) -> Nanos {
    let bytes = sized_fragment_bytes(config);
    let wire_ns = bytes * (1.0 + HEADER_ALLOWANCE) * 8.0 / link_gbps.max(1e-9);
    (wire_ns + config.event_builder.slot_grace_us * 1000.0).ceil() as Nanos
}

/// Loads `event_builder.schedule_file` (relative to the configuration
/// file) into the configuration.
pub(crate) fn load_schedule(
    config: &mut Config,
    base_dir: &Path,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    config.slot_table = None;
    if config.event_builder.schedule_file.is_empty() {
        return Ok(());
    }
    let path = base_dir.join(&config.event_builder.schedule_file);
    let table = SlotTable::load(&path).map_err(|e| err("event_builder.schedule_file", e))?;
    let layout = Layout::from_config(config);
    table
        .check(&layout, config.event_builder.local)
        .map_err(|e| {
            err(
                "event_builder.schedule_file",
                format!("{}: {e}", path.display()),
            )
        })?;
    config.slot_table = Some(Arc::new(table));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(n: u16) -> (Config, Layout) {
        let mut config = Config::default();
        config.nodes.count = n;
        let layout = Layout::from_config(&config);
        (config, layout)
    }

    /// The control budget is a quarter of what the mean fragment leaves of
    /// the slot in force: slots lengthened for a slow link leave far more.
    #[test]
    fn the_control_budget_follows_the_slot_in_force() {
        let (config, layout) = layout(72);
        let plan = SlotPlan::for_source(&config, &layout, 0);
        let nominal = plan.control_per_slot(plan.slot_ns);
        assert!(nominal >= 1);
        let longer = plan.control_per_slot(plan.slot_ns * 2);
        let headroom = plan.slot_ns - plan.mean_wire_ns;
        let ratio = (plan.slot_ns * 2 - plan.mean_wire_ns) as f64 / headroom as f64;
        assert!(
            (longer as f64 / nominal as f64 - ratio).abs() < 0.05 * ratio,
            "{nominal} -> {longer}, headroom x{ratio:.1}"
        );
        assert_eq!(
            plan.control_per_slot(plan.mean_wire_ns),
            1,
            "no headroom: one a slot"
        );
    }

    #[test]
    fn the_barrel_is_a_permutation_in_every_slot_and_skips_the_local_bu() {
        let (config, layout) = layout(5);
        let plans: Vec<SlotPlan> = (0..5)
            .map(|s| SlotPlan::for_source(&config, &layout, s))
            .collect();
        assert_eq!(plans[0].rotation(), 4);
        for k in 0..4u64 {
            let mut dests: Vec<u16> = plans.iter().map(|p| p.dest_of(k).unwrap()).collect();
            assert!(plans
                .iter()
                .enumerate()
                .all(|(s, p)| p.dest_of(k) != Some(s as u16)));
            dests.sort_unstable();
            dests.dedup();
            assert_eq!(dests.len(), 5, "slot {k}: every BU from one RU");
        }
    }

    #[test]
    fn through_the_nic_the_rotation_includes_the_local_slot() {
        let (mut config, _) = layout(4);
        config.event_builder.local = LocalTraffic::Nic;
        let layout = Layout::from_config(&config);
        let plan = SlotPlan::for_source(&config, &layout, 2);
        assert_eq!(plan.dest, vec![Some(2), Some(3), Some(0), Some(1)]);
    }

    #[test]
    fn schedule_files_are_checked_line_by_line() {
        let ok = "# two slots\nslot 0: 1 2 0\n2 0 1\n";
        let t = SlotTable::parse("s.txt", ok).unwrap();
        assert_eq!(t.nodes, 3);
        assert_eq!(SlotTable::parse("s.txt", &t.to_text("again")).unwrap(), t);
        let e = SlotTable::parse("s.txt", "1 2 0\n1 1 -\n").unwrap_err();
        assert_eq!(
            e,
            "s.txt:2: node 1 receives twice in one slot (a slot is a partial permutation)"
        );
        let e = SlotTable::parse("s.txt", "1 2 0\n1 2\n").unwrap_err();
        assert!(e.starts_with("s.txt:2: 2 entries"), "{e}");
        let e = SlotTable::parse("s.txt", "1 x 0\n").unwrap_err();
        assert!(e.starts_with("s.txt:1: `x`"), "{e}");
        let e = SlotTable::parse("s.txt", "1 3 0\n").unwrap_err();
        assert!(e.contains("node 3 does not exist"), "{e}");
        assert!(SlotTable::parse("s.txt", "# nothing\n").is_err());
        // Node 0 never reaches node 2.
        let (config, layout) = layout(3);
        let t = SlotTable::parse("s.txt", "1 2 0\n1 0 -\n").unwrap();
        let e = t.check(&layout, config.event_builder.local).unwrap_err();
        assert!(e.contains("node 0 never sends to node 2"), "{e}");
    }

    #[test]
    fn a_plus_continues_a_fragment_over_the_slots_its_path_needs() {
        // Node 0's fragment to 1 spans slots 0-1, node 2's to 0 slots 1-3.
        let text = "slot 0: 1 2 -\nslot 1: + - 0\nslot 2: 2 0 +\nslot 3: - - +\nslot 4: - - 1\n";
        let t = SlotTable::parse("s.txt", text).unwrap();
        assert_eq!(t.span_of(0, 0), 2);
        assert_eq!(t.span_of(1, 2), 3);
        assert_eq!(t.span_of(2, 0), 1);
        assert_eq!(SlotTable::parse("s.txt", &t.to_text("again")).unwrap(), t);
        let (config, layout) = layout(3);
        let mut config = config;
        config.slot_table = Some(Arc::new(t));
        let plan = SlotPlan::for_source(&config, &layout, 2);
        assert_eq!(plan.span_of(1), 3);
        assert_eq!(plan.span_of(1 + plan.rotation()), 3, "every rotation");
        assert_eq!(plan.span_of(4), 1);
        // A `+` must follow a fragment or another `+` of its node.
        let e = SlotTable::parse("s.txt", "slot 0: 1 + 0\n").unwrap_err();
        assert!(e.starts_with("s.txt:1: `+` for node 1"), "{e}");
        let e = SlotTable::parse("s.txt", "1 2 0\n- 0 1\n+ 0 1\n").unwrap_err();
        assert!(e.starts_with("s.txt:3: `+` for node 0"), "{e}");
        // Without a `+` nothing spans: no spans kept.
        assert!(SlotTable::parse("s.txt", "1 2 0\n")
            .unwrap()
            .spans
            .is_empty());
    }

    #[test]
    fn the_auto_slot_covers_a_large_fragment_at_the_link_rate() {
        let config = Config::default();
        // 4096 events of 256 +- 64 bytes and a 4-byte size each: 1.065 MB,
        // 85.2 us at 100 Gb/s; the slot adds 3 sigma, headers and grace.
        let ns = auto_slot_ns(&config, 100.0);
        let bare = 4096.0 * 260.0 * 8.0 / 100.0;
        assert!(
            ns as f64 > bare * 1.015 && (ns as f64) < bare * 1.04,
            "{ns}"
        );
    }
}
