//! What `evb sim` and `evb scan` make of their results besides the JSON:
//! the text they print, the CSV files and the plots.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use evb_plot::{line_chart, Series};

use crate::scan::{heat_grid, HeatGrid, ScanResult};
use crate::{EbSummary, SimConsumers, SimResult, SimSummary};

/// The result as `evb sim` prints it: what ran, the links and what they
/// can carry, the event builder's steady state and whole run, and, with
/// consumers, the distribution to them. Every figure says whether it is
/// a steady state (warm-up left out) or the whole run, and every share of
/// a link is of its usable payload rate, which the summary states.
pub fn summary_text(result: &SimResult) -> String {
    let mut out = String::new();
    let s = &result.summary;
    out += &format!(
        "evb sim: {} on {} ({} hosts), {:.1} us simulated in {:.2} s ({} events, {:.0} us/s)\n",
        s.traffic,
        s.topology,
        s.hosts,
        s.simulated_seconds * 1e6,
        s.wall_seconds,
        s.events_processed,
        s.speed_us_per_s
    );
    for note in &s.notes {
        out += &format!("note: {note}\n");
    }
    out += &format!(
        "links: {:.1} Gb/s, usable payload {:.2} Gb/s ({}-byte packets with {} bytes of headers each); \"of usable\" is of that rate\n",
        s.link_rate_gbps, s.usable_link_gbps, s.mtu_bytes, s.packet_header_bytes
    );
    let fabric = format!(
        "payload received per host {:.2} Gb/s mean ({:.1}% of usable; all messages, control included), min {:.2}, max {:.2}; busiest link busy {:.1}% of the time; PortXmitWait {:.3} ms in all",
        s.throughput_per_host_gbps,
        s.fraction_of_usable * 100.0,
        s.min_host_gbps,
        s.max_host_gbps,
        s.max_link_utilisation * 100.0,
        s.total_xmit_wait_s * 1e3
    );
    match &s.eb {
        Some(eb) => out += &event_builder_text(eb, s, &fabric),
        None => out += &format!("whole run: {fabric}\n"),
    }
    if let Some(o) = &s.consumers {
        out += &distribution_text(o, s.eb.as_ref().is_none_or(|e| e.steady));
    }
    if let Some(c) = &result.consumers {
        let unconsumed = c.batches_delivered.saturating_sub(c.batches_consumed);
        let busy = c.busy_fraction.iter().sum::<f64>() / c.busy_fraction.len().max(1) as f64;
        out += &format!(
            "consumers, whole run ({:.2} ms, warm-up included): {} batches handed to the output network, {} consumed ({:.2} Gb/s of batch payload, all {} consumers), {unconsumed} handed over and not consumed by the end (queued in the producers' NICs, on their way or being consumed); busy {:.0}% of the time on average ({}); EM credit stalls {}, BU output queues full {:.1} us in all\n",
            s.simulated_seconds * 1e3,
            c.batches_delivered,
            c.batches_consumed,
            c.consumer_gbps,
            c.consumers,
            busy * 100.0,
            c.busy_fraction
                .iter()
                .map(|b| format!("{:.0}%", b * 100.0))
                .collect::<Vec<_>>()
                .join(" "),
            c.em_credit_stalls,
            c.output_full_s * 1e6,
        );
        if c.events_accepted < c.events_consumed {
            out += &format!(
                "trigger: accepted {} of {} events consumed ({:.1} %)\n",
                c.events_accepted,
                c.events_consumed,
                100.0 * c.events_accepted as f64 / c.events_consumed.max(1) as f64
            );
        }
    }
    out
}

/// How long a run must be, from the `needs_us` of a run without a steady
/// state, in whole milliseconds.
fn run_at_least(needs_us: f64) -> String {
    let ms = (needs_us / 1000.0).ceil().max(1.0);
    format!("run at least {ms:.0} ms (--duration-us {:.0})", ms * 1000.0)
}

/// The distribution line: steady-state figures per producer and per
/// consumer against their links' usable rate, or why there are none.
fn distribution_text(o: &crate::OutputSummary, eb_steady: bool) -> String {
    let usable = if (o.producer_usable_gbps - o.consumer_usable_gbps).abs() < 1e-9 {
        format!("usable payload {:.2} Gb/s each", o.producer_usable_gbps)
    } else {
        format!(
            "usable payload {:.2} / {:.2} Gb/s",
            o.producer_usable_gbps, o.consumer_usable_gbps
        )
    };
    let what = format!(
        "distribution ({}, {} producers at {} Gb/s -> {} consumers at {} Gb/s, {usable})",
        o.network, o.producers, o.producer_link_gbps, o.consumers, o.consumer_link_gbps
    );
    let mut out = if !eb_steady || o.batch_means < 2 {
        format!("{what}: no steady state, too short to measure\n")
    } else {
        format!(
            "{what}, steady state after {:.2} ms, {} batch means: sent {:.2} +- {:.2} Gb/s per producer ({:.1}% of usable), received {:.2} +- {:.2} Gb/s per consumer ({:.1}% of usable); all producers {:.1} Gb/s, all consumers {:.1} Gb/s\n",
            o.warmup_us / 1e3,
            o.batch_means,
            o.producer_gbps_per_producer,
            o.producer_ci95_gbps,
            o.producer_fraction_of_usable * 100.0,
            o.consumer_gbps_per_consumer,
            o.consumer_ci95_gbps,
            o.consumer_fraction_of_usable * 100.0,
            o.producer_gbps_total,
            o.consumer_gbps_total,
        )
    };
    out += &format!(
        "output network, whole run: producers' NICs paused {:.1}% of the time, pause frames {}, drops {}, resent {:.1} MB\n",
        o.producer_paused_fraction * 100.0,
        o.pause_frames,
        o.drops,
        o.retransmitted_bytes as f64 * 1e-6
    );
    out
}

/// The steady-state line of the event builder: the window, the warm-up
/// and why, built and crossed per node, the drift; or, for a run too
/// short, that there is none and how long to run.
fn steady_text(eb: &EbSummary, s: &SimSummary) -> String {
    let mut out = String::new();
    match eb.steady_needs_us.filter(|_| !eb.steady) {
        Some(needs) => {
            let first = eb.first_built_us.map_or("no batch built".to_string(), |t| {
                format!("first batch built at {t:.0} us")
            });
            // A run long enough whose set warm-up ends before the first
            // batch: a longer run would not help, a longer warm-up would.
            let advice = match eb.first_built_us {
                Some(t) if t > eb.warmup_us && s.simulated_seconds * 1e6 >= needs => format!(
                    "the warm-up ({:.2} ms) ends before the first batch: set sim.warmup_us past {:.2} ms, or 0 (two rotations)",
                    eb.warmup_us / 1000.0,
                    t / 1000.0
                ),
                _ => format!("too short to measure a rate: {}", run_at_least(needs)),
            };
            out += &format!(
                "no steady state: {} events built, {first}; {advice}\n",
                eb.events_built,
            );
        }
        None => {
            // The node's own fragment is handed over in memory: what a
            // node builds can be more than its link carries.
            let local = if eb.built_gbps_per_node > eb.network_gbps_per_node * 1.0001 {
                format!(
                    ", its own fragment included ({}, it crosses no link{})",
                    if eb.local == "nic" {
                        "looped back by its NIC"
                    } else {
                        "handed over in memory"
                    },
                    if eb.built_gbps_per_node > s.usable_link_gbps {
                        ": hence above the link's rate"
                    } else {
                        ""
                    }
                )
            } else {
                String::new()
            };
            out += &format!(
                "steady state over {:.2} ms{} after a warm-up of {:.2} ms ({}), {} batch means: built {:.2} +- {:.2} Gb/s per node{local}; crossed the network {:.2} Gb/s per node ({:.1}% of usable); drift {:+.1}%\n",
                eb.steady_us / 1e3,
                eb.rotation_us
                    .filter(|&r| r > 0.0)
                    .map_or(String::new(), |r| format!(
                        " ({:.0} rotations)",
                        eb.steady_us / r
                    )),
                eb.warmup_us / 1e3,
                eb.warmup_rule,
                eb.batch_means,
                eb.built_gbps_per_node,
                eb.built_ci95_gbps,
                eb.network_gbps_per_node,
                eb.network_fraction_of_usable * 100.0,
                eb.drift * 100.0
            );
        }
    }
    out
}

/// The event builder's lines of the summary: the steady state (or why
/// there is none), the whole run with the fabric's figures (`fabric`),
/// and what the run's faults, slot clock and throttle did.
fn event_builder_text(eb: &EbSummary, s: &SimSummary, fabric: &str) -> String {
    let mut out = String::new();
    out += &steady_text(eb, s);
    let latency = if eb.events_built == 0 {
        "no batch latency: none built".to_string()
    } else {
        format!(
            "batch latency p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            eb.latency_p50_us, eb.latency_p99_us, eb.latency_max_us
        )
    };
    out += &format!(
        "whole run ({:.2} ms, warm-up included): {} events built, {} batches incomplete; {latency}; {fabric}\n",
        s.simulated_seconds * 1e3,
        eb.events_built,
        eb.batches_incomplete,
    );
    if let Some(c) = &eb.crash {
        out += &format!(
            "node {} died at {:.1} us (noticed at {:.1} us): built {:.2} Gb/s before, {:.2} Gb/s after: {:.3} of before (expected {:.3})\n",
            c.node, c.at_us, c.detected_us, c.built_gbps_before, c.built_gbps_after, c.ratio, c.expected_ratio
        );
    }
    if let Some(c) = &eb.slot_clock {
        out += &format!(
            "slot clock (measured, clock = \"em\"): {} nodes; phase error at the end max {} ns, resting on round trips of at most {} ns; largest step {} ns; {} probes\n",
            c.nodes, c.max_phase_error_ns, 2 * c.max_uncertainty_ns, c.max_step_ns, c.probes
        );
    }
    if let Some(s) = &eb.schedule {
        let bound = if s.lower_bound < s.slots {
            format!(
                " (no schedule on these routes has fewer than {})",
                s.lower_bound
            )
        } else {
            String::new()
        };
        let took = if s.seconds >= 0.05 {
            format!("; computed in {:.1} s", s.seconds)
        } else {
            String::new()
        };
        out += &format!(
            "slot schedule ({}): {}; {} slots a rotation{bound}, slots of {:.2} us sized for {} Gb/s{took}\n",
            s.source, s.what, s.slots, s.slot_us, s.slot_gbps
        );
    }
    if let Some(k) = &eb.slots {
        out += &format!(
            "slots, whole run: {} fragments sent, {} started late within their slot, {} slots missed (the fragment waited a rotation)",
            k.fragments, k.late_starts, k.slots_missed
        );
        if k.slot_changes > 0 {
            out += &format!(
                "; the EM changed the slot length {} times: {:.2} us at the end, {:.2} us at most",
                k.slot_changes, k.slot_us_end, k.longest_slot_us
            );
        }
        out.push('\n');
    }
    if eb.throttled_fraction > 0.0 || eb.events_vetoed > 0 {
        out += &format!(
            "readout throttle: {:.1}% of the time, {} events vetoed at the source\n",
            eb.throttled_fraction * 100.0,
            eb.events_vetoed
        );
    }
    out
}

/// Every host's sent and received payload over time (`--csv-hosts`):
/// `t_us`, then `<host>.tx`, `<host>.rx` per host, Gb/s.
pub fn hosts_csv(result: &SimResult) -> String {
    let mut text = String::from("t_us");
    for h in &result.hosts {
        text += &format!(",{0}.tx,{0}.rx", h.host);
    }
    text.push('\n');
    for (sample, rates) in result.timeseries.iter().zip(&result.host_series) {
        text += &format!("{:.3}", sample.t_us);
        for (tx, rx) in rates {
            text += &format!(",{tx:.3},{rx:.3}");
        }
        text.push('\n');
    }
    text
}

/// The throughput time series (`--csv`): mean, min and max received
/// payload per host, Gb/s.
pub fn timeseries_csv(result: &SimResult) -> String {
    let mut text = String::from("t_us,mean_rx_gbps,min_rx_gbps,max_rx_gbps\n");
    for p in &result.timeseries {
        text += &format!(
            "{:.3},{:.4},{:.4},{:.4}\n",
            p.t_us, p.mean_rx_gbps, p.min_rx_gbps, p.max_rx_gbps
        );
    }
    text
}

/// Throughput over time and link utilisation (and with consumers, their
/// throughput and how many were busy), as SVG and PNG: PREFIX-throughput,
/// PREFIX-links, PREFIX-consumers, PREFIX-busy. Returns the files written.
pub fn write_plots(prefix: &Path, r: &SimResult) -> Result<Vec<PathBuf>> {
    let ts = &r.timeseries;
    let pick = |f: fn(&crate::engine::Sample) -> f64| ts.iter().map(|p| (p.t_us, f(p))).collect();
    let s = &r.summary;
    let title = format!("{} on {}: received payload per host", s.traffic, s.topology);
    let mut out = Vec::new();
    out.extend(line_chart(
        &plot_base(prefix, "-throughput"),
        &title,
        "simulated time (us)",
        "Gb/s",
        &[
            Series {
                name: "max".into(),
                points: pick(|p| p.max_rx_gbps),
            },
            Series {
                name: "mean".into(),
                points: pick(|p| p.mean_rx_gbps),
            },
            Series {
                name: "min".into(),
                points: pick(|p| p.min_rx_gbps),
            },
        ],
    )?);
    if let Some(c) = &r.consumers {
        out.extend(plot_consumers(prefix, s, c)?);
    }
    out.extend(plot_links(prefix, r)?);
    Ok(out)
}

/// PREFIX followed by `suffix`: where a plot goes (without its extension).
fn plot_base(prefix: &Path, suffix: &str) -> PathBuf {
    let mut p = prefix.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// The consumers' plots: producer and consumer throughput
/// (PREFIX-consumers) and how many consumers were busy (PREFIX-busy).
fn plot_consumers(prefix: &Path, s: &SimSummary, c: &SimConsumers) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    // Busy periods are often longer than a sample: average over about
    // a thirtieth of the run so that the curves show rates, not bursts.
    let k = (c.t_us.len() / 30).max(1);
    let smooth = |ys: &[f64]| -> Vec<(f64, f64)> {
        c.t_us
            .chunks(k)
            .zip(ys.chunks(k))
            .map(|(t, y)| (t[t.len() - 1], y.iter().sum::<f64>() / y.len() as f64))
            .collect()
    };
    out.extend(line_chart(
        &plot_base(prefix, "-consumers"),
        &format!(
            "{} on {}: producer and consumer throughput",
            s.traffic, s.topology
        ),
        "simulated time (us)",
        "Gb/s (all BUs / all consumers)",
        &[
            Series {
                name: "producers (delivered)".into(),
                points: smooth(&c.producer_gbps_series),
            },
            Series {
                name: "consumers (consumed)".into(),
                points: smooth(&c.consumer_gbps_series),
            },
        ],
    )?);
    out.extend(line_chart(
        &plot_base(prefix, "-busy"),
        &format!(
            "{} on {}: busy consumers (of {})",
            s.traffic, s.topology, c.consumers
        ),
        "simulated time (us)",
        "consumers busy (mean)",
        &[Series {
            name: "busy consumers".into(),
            points: smooth(&c.busy_consumers),
        }],
    )?);
    Ok(out)
}

/// Link utilisation and the time waiting for credits, links sorted
/// busiest first (PREFIX-links).
fn plot_links(prefix: &Path, r: &SimResult) -> Result<Vec<PathBuf>> {
    let s = &r.summary;
    let mut util: Vec<f64> = r.links.iter().map(|l| l.utilisation * 100.0).collect();
    util.sort_by(|a, b| b.total_cmp(a));
    let mut wait: Vec<f64> = r
        .links
        .iter()
        .map(|l| l.xmit_wait_s / s.simulated_seconds * 100.0)
        .collect();
    wait.sort_by(|a, b| b.total_cmp(a));
    let files = line_chart(
        &plot_base(prefix, "-links"),
        &format!(
            "{} on {}: link utilisation and credit wait, links sorted",
            s.traffic, s.topology
        ),
        "links (sorted, busiest first)",
        "% of simulated time",
        &[
            Series {
                name: "utilisation".into(),
                points: util
                    .iter()
                    .enumerate()
                    .map(|(i, &u)| (i as f64, u))
                    .collect(),
            },
            Series {
                name: "waiting for credits (PortXmitWait)".into(),
                points: wait
                    .iter()
                    .enumerate()
                    .map(|(i, &w)| (i as f64, w))
                    .collect(),
            },
        ],
    )?;
    Ok(files.into())
}

/// A scan as `evb scan` prints it: what ran, then the points, best first.
pub fn scan_text(result: &ScanResult, fabric: &str) -> String {
    let mut out = String::new();
    let mut order: Vec<usize> = (0..result.points.len()).collect();
    // Steady points first, then the start-up transients (marked).
    order.sort_by(|&a, &b| {
        let (pa, pb) = (&result.points[a], &result.points[b]);
        (pb.is_steady(), pb.figure_gbps)
            .partial_cmp(&(pa.is_steady(), pa.figure_gbps))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let shard = result.shard.map_or(String::new(), |[i, n]| {
        format!(" (shard {i}/{n} of {})", result.total_points)
    });
    let replications = if result.replications > 1 {
        format!(
            ", {} seeds each: {} points not told apart from the best at 95 %",
            result.replications, result.tied_with_best
        )
    } else {
        String::new()
    };
    let usable = result
        .points
        .first()
        .map_or(String::new(), |p| match result.figure {
            crate::scan::Figure::Built => format!(
                " ({:.2} of {:.1} Gb/s)",
                p.summary.usable_link_gbps, p.summary.link_rate_gbps
            ),
            _ => String::new(),
        });
    out += &format!(
        "evb scan: {} points{shard} on {fabric} in {:.1} s, ranked by steady-state Gb/s {}; {:.0}% of points within 2% of the best{replications}; % of usable: {}{usable}\n",
        result.points.len(),
        result.wall_seconds,
        result.figure.label(),
        result.fraction_within_2pct_of_best * 100.0,
        result.figure.usable_label(),
    );
    out += &format!(
        "{:>10}  {:>8}  {:>11}  parameters\n",
        "Gb/s", "+- 95%", "% of usable"
    );
    for &i in &order {
        let p = &result.points[i];
        let params: Vec<String> = p.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if !p.is_steady() {
            // A start-up transient is no measurement: no figure.
            let needs = p
                .summary
                .eb
                .as_ref()
                .and_then(|e| e.steady_needs_us)
                .map_or(String::new(), |us| format!(": {}", run_at_least(us)));
            out += &format!(
                "{:>10}  {:>8}  {:>11}  {}  (no steady state, too short to measure{needs}; not ranked)\n",
                "-",
                "-",
                "-",
                params.join(" ")
            );
            continue;
        }
        let ci = p.ci95_gbps.map_or("-".to_string(), |c| format!("{c:.2}"));
        let pct = p
            .fraction_of_usable
            .map_or("-".to_string(), |f| format!("{:.1}%", f * 100.0));
        out += &format!(
            "{:>10.2}  {ci:>8}  {pct:>11}  {}\n",
            p.figure_gbps,
            params.join(" ")
        );
    }
    out
}

/// The scan's points as CSV (`evb scan --csv`), in point order.
pub fn scan_csv(result: &ScanResult) -> String {
    let mut text = String::from("index,")
        + &result.axes.join(",")
        + ",figure_gbps,ci95_gbps,replications,throughput_per_host_gbps\n";
    for p in &result.points {
        let vals: Vec<&str> = p.params.iter().map(|(_, v)| v.as_str()).collect();
        text += &format!(
            "{},{},{:.4},{},{},{:.4}\n",
            p.index,
            vals.join(","),
            p.figure_gbps,
            p.ci95_gbps.map_or(String::new(), |c| format!("{c:.4}")),
            p.replicates.len().max(1),
            p.summary.throughput_per_host_gbps
        );
    }
    text
}

/// The heat map of a scan over two or more parameters (the best over the
/// others): PREFIX-heatmap.svg and .png. Returns the files written.
pub fn write_heat_map(prefix: &Path, result: &ScanResult) -> Result<[PathBuf; 2]> {
    let Some(HeatGrid { xs, ys, rows }) = heat_grid(result) else {
        bail!("a heat map needs at least two --param axes");
    };
    let mut base = prefix.as_os_str().to_owned();
    base.push("-heatmap");
    let title = if result.axes.len() > 2 {
        "best Gb/s over the other parameters"
    } else {
        "Gb/s"
    };
    Ok(evb_plot::heat_map_labelled(
        Path::new(&base),
        title,
        &result.axes[1],
        &result.axes[0],
        &rows,
        &xs,
        &ys,
    )?)
}

/// The port counters of a finished simulation as a counters snapshot
/// (`evb sim --counters FILE`), in the form `evb fabric counters` writes
/// from a real fabric, placed on `topo` (the simulated fabric, edits
/// applied) by node name: every output port's data (the engine's wire
/// bytes: headers and payload, divided by 4 as IBA counts) and
/// `PortXmitWait` (time with a packet and no credits, in ticks of one
/// symbol time of the link, written with the snapshot), and each port's
/// received data (what the far end sent). The basic 32-bit counters stop
/// at all ones, as IBA's do; the extended ones hold the full count. The
/// counters start at zero with the run (`reset_at_s` 0, simulated clock).
/// Ports of a separate output network are not part of `topo` and are left
/// out. Packet counts are not kept by the engine and are not written.
pub fn counters_snapshot(
    result: &SimResult,
    topo: &evb_fabric::Topology,
) -> Result<evb_fabric::counters::Snapshot> {
    use evb_fabric::counters::{guid_text, max_value, PortSample, Snapshot};
    let secs = result.summary.simulated_seconds;
    let mut snap = Snapshot::new("evb sim", secs);
    snap.clock = "simulated".into();
    snap.reset_at_s = Some(0.0);
    // (node, port) -> (wire bytes sent, wait ps, link Gb/s).
    let mut sent: std::collections::BTreeMap<(usize, u8), (u64, u64, f64)> = Default::default();
    for r in &result.ports {
        if let Some(at) = port_of(topo, &r.name) {
            sent.insert(at, (r.bytes, r.xmit_wait_ps, r.gbps));
        }
    }
    if sent.is_empty() {
        bail!("no port of the simulation is a port of the topology");
    }
    for (&(node, port), &(bytes, wait_ps, gbps)) in &sent {
        let n = &topo.nodes[node];
        let far = n.ports[port as usize].map(|r| (r.node, r.port));
        let received = far.and_then(|f| sent.get(&f)).map_or(0, |s| s.0);
        let lane_gbps = topo
            .link_rate(node, port)
            .map_or(gbps / 4.0, |r| r.speed.lane_gbps());
        let tick_ns = 8.0 / lane_gbps;
        let ticks = (wait_ps as f64 / (tick_ns * 1000.0)).round() as u64;
        let mut counters = std::collections::BTreeMap::new();
        let mut put = |name: &str, v: u64, bits: u8| {
            counters.insert(name.to_string(), v.min(max_value(bits)));
        };
        put("PortXmitData", bytes / 4, 32);
        put("PortRcvData", received / 4, 32);
        put("PortXmitWait", ticks, 32);
        put("PortXmitDataExtended", bytes / 4, 64);
        put("PortRcvDataExtended", received / 4, 64);
        put("PortXmitWaitExt", ticks, 64);
        snap.ports.push(PortSample {
            guid: guid_text(n.guid),
            port,
            lid: (n.lid != 0).then_some(n.lid),
            name: Some(n.name.clone()),
            time_s: None,
            tick_ns: Some(tick_ns),
            counters,
            line: 0,
        });
    }
    Ok(snap)
}

/// The topology's (node, port) of an engine port named `HOST -> up` or
/// `SWITCH port P` (the names `Net::link_report` gives).
fn port_of(topo: &evb_fabric::Topology, name: &str) -> Option<(usize, u8)> {
    if let Some(host) = name.strip_suffix(" -> up") {
        let h = topo.find(host)?;
        return Some((h, topo.nodes[h].first_port()?));
    }
    let (sw, p) = name.rsplit_once(" port ")?;
    let s = topo.find(sw)?;
    let p: u8 = p.parse().ok()?;
    topo.nodes[s].ports.get(p as usize)?.as_ref()?;
    Some((s, p))
}
