//! The diagnosis as `evb fabric diagnose` prints it: what was measured,
//! where the waiting is and what it waits on, what is wrong with the
//! fabric, and the remedies best first.

use super::Diagnosis;
use std::fmt::Write;

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

fn gbps(x: Option<f64>) -> String {
    x.map_or("-".into(), |g| format!("{g:.1}"))
}

/// The whole summary.
pub fn summary(d: &Diagnosis) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "fabric: {} ({} ranks, {} switches), {}, order '{}'",
        d.topology, d.hosts, d.switches, d.routing, d.order
    );
    let _ = writeln!(
        s,
        "counters: {}; interval {:.6} s; PortXmitWait tick {}",
        d.counters.join(" -> "),
        d.interval_s,
        d.xmit_wait_tick
    );
    measured(&mut s, d);
    waiting(&mut s, d);
    if !d.findings.is_empty() {
        let _ = writeln!(s, "findings:");
        for (i, f) in d.findings.iter().enumerate() {
            let _ = writeln!(s, "  {}. {}", i + 1, f.what);
            if !f.explains.is_empty() {
                let total = d.explained_wait + d.unexplained_wait;
                let share = if total > 0.0 { f.blame / total } else { 0.0 };
                let _ = writeln!(
                    s,
                    "     explains {} shared link(s), {} of the measured waiting",
                    f.explains.len(),
                    pct(share)
                );
            }
        }
    } else {
        let _ = writeln!(
            s,
            "findings: none (cabling regular, rates as usual, no errors)"
        );
    }
    remedies(&mut s, d);
    for n in &d.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

fn measured(s: &mut String, d: &Diagnosis) {
    let m = &d.measured;
    let _ = writeln!(
        s,
        "measured: hosts receive {} Gb/s each on average ({} of their links); {} port(s) waiting for credits >= the hot threshold (most: {} at {}); {} link(s) with errors",
        gbps(m.host_gbps_mean),
        m.host_utilisation_mean.map_or("-".into(), pct),
        m.ports_waiting,
        pct(m.max_wait),
        m.max_wait_link,
        m.links_with_errors
    );
}

fn waiting(s: &mut String, d: &Diagnosis) {
    let total = d.explained_wait + d.unexplained_wait;
    let _ = writeln!(
        s,
        "shift on these tables: {} conflicts, {} shared link(s); of the measured waiting {} is on shared links{}",
        d.baseline.conflicts,
        d.shared_links_total,
        if total > 0.0 { pct(d.explained_wait / total) } else { "-".into() },
        if total > 0.0 { format!(", {} elsewhere", pct(d.unexplained_wait / total)) } else { String::new() }
    );
    if !d.hot_ports.is_empty() {
        let _ = writeln!(s, "hot ports (waiting for credits):");
        for h in &d.hot_ports {
            let on = h.waits_on.as_ref().map_or(String::new(), |l| {
                format!(", mostly on {l} ({})", pct(h.waits_on_wait))
            });
            let _ = writeln!(s, "  {} waits {}{on}", h.link, pct(h.wait));
        }
    }
    for st in &d.slow_steps {
        let links: Vec<String> = st
            .links
            .iter()
            .take(4)
            .map(|(l, c)| format!("{l} ({c} flows)"))
            .collect();
        let _ = writeln!(
            s,
            "slow step {} in the run: {:.1} Gb/s against a median of {:.1}; it overloads {}",
            st.step,
            st.gbps,
            st.median_gbps,
            if links.is_empty() {
                "no link (on these tables and this order)".to_string()
            } else {
                links.join(", ")
            }
        );
    }
    if !d.shared_links.is_empty() {
        let _ = writeln!(s, "links the shift overloads, most waited on first:");
        for l in &d.shared_links {
            let steps: Vec<String> = l.steps.iter().take(8).map(usize::to_string).collect();
            let pairs: Vec<String> = l
                .pairs
                .iter()
                .take(4)
                .map(|p| format!("{}->{}", p[0], p[1]))
                .collect();
            let _ = writeln!(
                s,
                "  {}: {} conflicts in {} steps ({}{}), ranks {}; {} of the waiting, utilisation {}",
                l.link,
                l.conflicts,
                l.steps_shared,
                steps.join(", "),
                if l.steps_shared > steps.len() { ", ..." } else { "" },
                pairs.join(", "),
                if total > 0.0 { pct(l.blame / total) } else { "-".into() },
                l.utilisation.map_or("-".into(), pct)
            );
        }
    }
}

fn remedies(s: &mut String, d: &Diagnosis) {
    let b = &d.baseline;
    let _ = writeln!(
        s,
        "now: {} Gb/s per node predicted ({}), {} by the shift estimate",
        gbps(b.predicted_gbps_per_node),
        b.prediction,
        gbps(Some(b.estimated_gbps_per_node))
    );
    if d.remedies.is_empty() {
        let _ = writeln!(s, "remedies: none");
        return;
    }
    let _ = writeln!(s, "remedies, best first (Gb/s per node after each):");
    for (i, r) in d.remedies.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {}. {} [{}]: {} Gb/s ({}; estimate {}), {} conflicts",
            i + 1,
            r.kind,
            r.ports.join(", "),
            gbps(r.predicted_gbps_per_node),
            r.prediction,
            gbps(Some(r.estimated_gbps_per_node)),
            r.conflicts
        );
        let _ = writeln!(s, "     {}", r.what);
        if !r.apply.is_empty() {
            let _ = writeln!(s, "     apply: {}", r.apply);
        }
    }
}
