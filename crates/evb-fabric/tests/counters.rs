//! Port counters: the files users have (perfquery output recorded on
//! ibsim, ibdiagnet2's `.pm` and `.db_csv` written after the vendor's
//! format), evb's snapshots, what two snapshots say about each link, and
//! bad input that must give an error naming the file, line or field.

use evb_fabric::counters::formats::{read_any, read_ibdiagnet_csv, read_perfquery, Format};
use evb_fabric::counters::{place, PortSample, Snapshot};
use evb_fabric::diagnose::measure::{measure, MeasureOptions};
use evb_fabric::io::parse_ibnetdiscover;
use evb_fabric::Topology;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The ibsim fabric the files were recorded on: 4 hosts, 2 leaves, a spine.
fn topo() -> Topology {
    parse_ibnetdiscover(&data("ibsim-4hosts.ibnetdiscover")).unwrap()
}

fn port<'a>(s: &'a Snapshot, guid: &str, port: u8) -> &'a PortSample {
    s.ports
        .iter()
        .find(|p| p.guid == guid && p.port == port)
        .unwrap_or_else(|| panic!("no {guid} port {port} in {:?}", s.ports.len()))
}

#[test]
fn perfquery_output_recorded_on_ibsim() {
    let t = topo();
    let (read, format) = read_any(&data("perfquery-ibsim.txt"), &t, 100.0).unwrap();
    assert_eq!(format, Format::Perfquery);
    let s = read.snap;
    // leaf001 (LID 2) ports 1-3 and node002 (LID 5) port 1.
    assert_eq!(s.ports.len(), 4);
    let p3 = port(&s, "0x0002c90200100000", 3);
    assert_eq!(p3.name.as_deref(), Some("leaf001"));
    assert_eq!(p3.get("PortXmitData"), Some(3672));
    assert_eq!(p3.get("PortXmitDataExtended"), Some(3096));
    assert_eq!(p3.get("PortXmitWait"), Some(0));
    assert_eq!(p3.get("SymbolErrorCounter"), Some(0));
    let h = port(&s, "0x0002c90300000004", 1);
    assert_eq!(h.get("PortXmitData"), Some(648));
    assert_eq!(h.get("PortXmitDataExtended"), Some(576));
    // It fits the fabric.
    let placed = place(s, Path::new("pq"), &t).unwrap();
    assert!(placed.uncabled.is_empty());
}

#[test]
fn ibdiagnet_pm_and_db_csv() {
    let t = topo();
    let (pm, f1) = read_any(&data("ibdiagnet2.pm"), &t, 100.0).unwrap();
    let (csv, f2) = read_any(&data("ibdiagnet2.db_csv"), &t, 100.0).unwrap();
    assert_eq!((f1, f2), (Format::IbdiagnetPm, Format::IbdiagnetCsv));
    for s in [&pm.snap, &csv.snap] {
        assert_eq!(s.ports.len(), 6);
        let p3 = s.ports.iter().find(|p| p.port == 3).unwrap();
        assert_eq!(p3.get("PortXmitData"), Some(3_000_000));
        assert_eq!(
            p3.get("PortXmitDataExtended"),
            Some(3_000_000 + (2u64 << 33))
        );
        assert_eq!(p3.get("SymbolErrorCounter"), Some(17));
        assert_eq!(p3.get("LinkDownedCounterExt"), Some(1));
        assert_eq!(p3.get("PortXmitWaitExt"), Some(3 * 12345));
        // The host's extended error counters are NA: absent, not zero.
        let h = s
            .ports
            .iter()
            .find(|p| p.guid.ends_with("05") || p.guid.ends_with("04"))
            .unwrap();
        assert_eq!(h.get("SymbolErrorCounterExt"), None);
        assert_eq!(h.get("PortXmitData"), Some(6_000_000));
    }
    // The .pm names the host by its port GUID, the db_csv by its node
    // GUID: both place on node002.
    for s in [pm.snap, csv.snap] {
        let p = place(s, Path::new("x"), &t).unwrap();
        let n = t.find("node002").unwrap();
        assert!(p.sample(n, 1).is_some());
    }
    assert!(
        pm.notes.iter().any(|n| n.contains("not read")),
        "{:?}",
        pm.notes
    );
}

/// `text` written to a file in `dir`.
fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn err_of<T: std::fmt::Debug>(r: evb_fabric::Result<T>) -> String {
    r.expect_err("bad input was accepted").to_string()
}

#[test]
fn bad_perfquery_and_ibdiagnet_files_name_file_and_line() {
    let t = topo();
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(data("perfquery-ibsim.txt")).unwrap();
    let cases = [
        // A line cut short: no value.
        (
            good.replacen(
                "PortXmitData:....................3672",
                "PortXmitData:.......",
                1,
            ),
            62,
            "no value",
        ),
        (
            good.replacen(
                "PortXmitWait:....................0",
                "PortXmitWait:....zero",
                1,
            ),
            22,
            "portxmitwait",
        ),
        (
            good.replacen("Lid 2 port 1 ", "Lid 99 port 1 ", 1),
            1,
            "lid 99",
        ),
        (format!("PortXmitData:.....3\n{good}"), 1, "before any"),
        (
            good.replacen("Lid 2 port 1 ", "Lid 2 port 255 ", 1),
            1,
            "perfquery -a",
        ),
    ];
    for (i, (text, line, what)) in cases.iter().enumerate() {
        let p = file(dir.path(), &format!("pq{i}"), text);
        let e = err_of(read_perfquery(&p, text, &t, 1.0)).to_lowercase();
        let want = format!("{}:{line}", p.display()).to_lowercase();
        assert!(e.contains(&want) && e.contains(what), "case {i}: {e}");
    }
    let csv = std::fs::read_to_string(data("ibdiagnet2.db_csv")).unwrap();
    let cut: String = csv.lines().take(15).collect::<Vec<_>>().join("\n");
    let p = file(dir.path(), "cut.db_csv", &cut);
    assert!(err_of(read_ibdiagnet_csv(&p, &cut, 1.0)).contains("cut short"));
    let short = csv.replacen(",1,0,0,0,0,0,0,", ",1,0,0,", 1);
    let p = file(dir.path(), "short.db_csv", &short);
    let e = err_of(read_ibdiagnet_csv(&p, &short, 1.0));
    assert!(
        e.contains(":14:") && e.contains("fields where the header has"),
        "{e}"
    );
    let pm = std::fs::read_to_string(data("ibdiagnet2.pm")).unwrap();
    let bad = pm.replacen("GUID=0x0002c90200100000", "GUID=0xzz", 1);
    let p = file(dir.path(), "bad.pm", &bad);
    let e = err_of(read_any(&p, &t, 1.0));
    assert!(e.contains("bad.pm:8") && e.contains("GUID=0xzz"), "{e}");
    let p = file(dir.path(), "junk", "hello\nworld\n");
    assert!(err_of(read_any(&p, &t, 1.0)).contains("not a counters file"));
}

fn sample(guid: &str, port: u8, counters: &[(&str, u64)]) -> PortSample {
    PortSample {
        guid: guid.into(),
        port,
        lid: None,
        name: None,
        time_s: None,
        tick_ns: None,
        counters: counters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        line: 0,
    }
}

#[test]
fn bad_snapshots_name_the_port_or_the_line() {
    let t = topo();
    let dir = tempfile::tempdir().unwrap();
    let mut s = Snapshot::new("test", 10.0);
    s.ports
        .push(sample("0x0002c90200100000", 1, &[("PortXmitData", 5)]));
    s.ports
        .push(sample("0x0002c90300000005", 1, &[("PortXmitData", 5)]));
    let text = s.to_json();
    // Cut short: the JSON error names the line.
    let cut = &text[..text.len() - 20];
    let p = file(dir.path(), "cut.json", cut);
    let e = err_of(Snapshot::load(&p));
    assert!(
        e.starts_with(&format!("{}:", p.display())) && e.contains("EOF"),
        "{e}"
    );
    // A GUID of another fabric, a port the node lacks, a port twice.
    let place_err = |s: &Snapshot| err_of(place(s.clone(), Path::new("snap.json"), &t));
    let mut other = s.clone();
    other.ports[1].guid = "0x00000000deadbeef".into();
    let e = place_err(&other);
    assert!(
        e.contains("snap.json: ports[1] (guid 0x00000000deadbeef port 1): unknown GUID"),
        "{e}"
    );
    let mut beyond = s.clone();
    beyond.ports[0].port = 9;
    assert!(place_err(&beyond).contains("leaf001 has 4 ports, not a port 9"));
    let mut twice = s.clone();
    twice.ports.push(sample("0x0002c90200100000", 1, &[]));
    assert!(place_err(&twice).contains("leaf001 port 1 is given twice (first at ports[0]"));
    // A value wider than its counter, and a file too large to read.
    let mut wide = s.clone();
    wide.ports[0]
        .counters
        .insert("PortXmitWait".into(), 1 << 33);
    let p = file(dir.path(), "wide.json", &wide.to_json());
    assert!(
        err_of(Snapshot::load(&p)).contains("PortXmitWait = 8589934592 does not fit its 32 bits")
    );
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    assert!(err_of(Snapshot::load(&big)).contains("more than the"));
}

/// Two snapshots a second apart on leaf001 port 3 (to spine01, 4xEDR).
fn two(a: &[(&str, u64)], b: &[(&str, u64)]) -> (Snapshot, Snapshot) {
    let mut sa = Snapshot::new("test", 100.0);
    let mut sb = Snapshot::new("test", 101.0);
    sa.ports.push(sample("0x0002c90200100000", 3, a));
    sb.ports.push(sample("0x0002c90200100000", 3, b));
    (sa, sb)
}

fn figures(a: Snapshot, b: Snapshot) -> evb_fabric::diagnose::measure::LinkFigures {
    let t = topo();
    let (pa, pb) = (
        place(a, Path::new("a"), &t).unwrap(),
        place(b, Path::new("b"), &t).unwrap(),
    );
    let (links, _) = measure(&t, Some(&pa), &pb, &MeasureOptions::default()).unwrap();
    links
        .into_iter()
        .find(|l| l.node == "leaf001" && l.port == 3)
        .unwrap()
}

#[test]
fn rates_from_two_snapshots_with_wraps_saturation_and_resets() {
    // Half of 100 Gb/s for a second: 50e9 / 32 four-octet words.
    let words = 50_000_000_000u64 / 32;
    let ext = figures(
        two(
            &[("PortXmitDataExtended", 7)],
            &[("PortXmitDataExtended", 7 + words)],
        )
        .0,
        two(&[], &[("PortXmitDataExtended", 7 + words)]).1,
    );
    assert!((ext.utilisation.unwrap() - 0.5).abs() < 1e-9, "{ext:?}");
    // The 32-bit counter wrapped once within the second (plausible).
    let before = u32::MAX as u64 - 1000;
    let (a, b) = two(&[("PortXmitData", before)], &[("PortXmitData", 9000)]);
    let w = figures(a, b);
    assert!((w.data_gbps.unwrap() - 10_001.0 * 32.0 / 1e9).abs() < 1e-9);
    assert_eq!(w.flags, vec!["PortXmitData: wrapped"]);
    // Saturated at all ones: a lower bound, flagged.
    let (a, b) = two(&[("PortXmitData", 5)], &[("PortXmitData", u32::MAX as u64)]);
    assert_eq!(figures(a, b).flags, vec!["PortXmitData: saturated"]);
    // Went down with no plausible wrap: cleared in between.
    let (a, b) = two(
        &[("PortXmitDataExtended", 1 << 40)],
        &[("PortXmitDataExtended", 3)],
    );
    let r = figures(a, b);
    assert_eq!(r.flags, vec!["PortXmitDataExtended: reset"]);
    // XmitWait: 1e9 ticks of one EDR symbol time (0.32 ns) in 1 s.
    let (a, b) = two(&[("PortXmitWait", 0)], &[("PortXmitWait", 1_000_000_000)]);
    assert!((figures(a, b).wait.unwrap() - 0.32).abs() < 1e-9);
    // Errors that grew are named, with the extended count where both have it.
    let (a, b) = two(
        &[
            ("SymbolErrorCounter", 3),
            ("SymbolErrorCounterExt", 3),
            ("LinkDownedCounter", 0),
        ],
        &[
            ("SymbolErrorCounter", 9),
            ("SymbolErrorCounterExt", 70_000),
            ("LinkDownedCounter", 2),
        ],
    );
    let e = figures(a, b).errors;
    let want: BTreeMap<String, u64> = [
        ("LinkDownedCounter".to_string(), 2),
        ("SymbolErrorCounter".to_string(), 69_997),
    ]
    .into();
    assert_eq!(e, want);
}

#[test]
fn one_snapshot_needs_its_clearing_time_and_clocks_must_agree() {
    let t = topo();
    let (a, mut b) = two(&[], &[("PortXmitData", 10)]);
    let pb = place(b.clone(), Path::new("b.json"), &t).unwrap();
    let e = measure(&t, None, &pb, &MeasureOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("b.json: one snapshot gives rates only when"),
        "{e}"
    );
    b.reset_at_s = Some(100.5);
    let pb = place(b.clone(), Path::new("b.json"), &t).unwrap();
    let (links, _) = measure(&t, None, &pb, &MeasureOptions::default()).unwrap();
    let l = links
        .iter()
        .find(|l| l.node == "leaf001" && l.port == 3)
        .unwrap();
    assert!((l.interval_s - 0.5).abs() < 1e-9);
    let mut sim = a.clone();
    sim.clock = "simulated".into();
    let (pa, pb) = (
        place(sim, Path::new("a.json"), &t).unwrap(),
        place(b, Path::new("b.json"), &t).unwrap(),
    );
    let e = measure(&t, Some(&pa), &pb, &MeasureOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("simulated clock"), "{e}");
    let _ = a;
}
