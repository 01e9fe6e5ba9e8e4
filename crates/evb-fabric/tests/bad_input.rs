//! Bad files give errors that name the file and the line, never a panic.

use evb_fabric::conflicts::{analyze, shift_steps};
use evb_fabric::io::{
    parse_ibnetdiscover, parse_lfts, parse_order, write_ibnetdiscover, write_opensm_lfts,
};
use evb_fabric::optimize::order_by_name;
use evb_fabric::topo::FatTreeSpec;
use std::path::{Path, PathBuf};

struct Files {
    dir: tempfile::TempDir,
    topo: evb_fabric::Topology,
    ibnd: String,
    lfts: String,
}

fn setup() -> Files {
    let topo = FatTreeSpec::parse("fat-tree:radix=8,hosts=16")
        .unwrap()
        .build()
        .unwrap();
    let lfts = evb_fabric::ftree::route_ftree(&topo).unwrap().lfts;
    Files {
        dir: tempfile::tempdir().unwrap(),
        ibnd: write_ibnetdiscover(&topo),
        lfts: write_opensm_lfts(&topo, &lfts),
        topo,
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The error must name the file and the given line.
fn assert_at(err: impl std::fmt::Display, file: &Path, line: usize, what: &str) {
    let msg = err.to_string();
    let want = format!("{}:{line}", file.display());
    assert!(msg.contains(&want), "expected '{want}' in error: {msg}");
    assert!(
        msg.to_lowercase().contains(what),
        "expected '{what}' in error: {msg}"
    );
}

#[test]
fn round_trip_of_written_files() {
    let f = setup();
    let p = write(f.dir.path(), "ibnd", &f.ibnd);
    let t = parse_ibnetdiscover(&p).unwrap();
    assert_eq!(t.hosts().len(), 16);
    assert_eq!(t.switches().len(), 8);
    let l = parse_lfts(&write(f.dir.path(), "lfts", &f.lfts), &t).unwrap();
    let a = analyze(&t, &l, &order_by_name(&t), &shift_steps(16), 3).unwrap();
    assert_eq!(a.total.conflicts, 0);
    let _ = f.topo;
}

#[test]
fn truncated_ibnetdiscover() {
    let f = setup();
    let cut: String = f.ibnd.lines().take(30).collect::<Vec<_>>().join("\n");
    let p = write(f.dir.path(), "cut", &cut);
    let err = parse_ibnetdiscover(&p).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&p.display().to_string()) && msg.contains("unknown node"),
        "{msg}"
    );
    // A line cut in the middle of a port entry.
    let lines: Vec<&str> = f.ibnd.lines().collect();
    let k = lines.iter().position(|l| l.starts_with("[1]")).unwrap();
    let mut text = lines[..k].join("\n");
    text.push_str("\n[1]\t\"S-00");
    let p = write(f.dir.path(), "cut2", &text);
    assert_at(parse_ibnetdiscover(&p).unwrap_err(), &p, k + 1, "remote");
}

#[test]
fn wrong_format_files() {
    let f = setup();
    // An LFT dump given as topology.
    let p = write(f.dir.path(), "lfts-as-topo", &f.lfts);
    assert_at(
        parse_ibnetdiscover(&p).unwrap_err(),
        &p,
        1,
        "not ibnetdiscover",
    );
    // A topology given as LFTs.
    let p = write(f.dir.path(), "topo-as-lfts", &f.ibnd);
    let t = parse_ibnetdiscover(&write(f.dir.path(), "ibnd", &f.ibnd)).unwrap();
    let err = parse_lfts(&p, &t).unwrap_err();
    assert!(err.to_string().contains(&p.display().to_string()), "{err}");
    // Empty files.
    let p = write(f.dir.path(), "empty", "");
    assert!(parse_ibnetdiscover(&p)
        .unwrap_err()
        .to_string()
        .contains("empty"));
    assert!(parse_lfts(&p, &t)
        .unwrap_err()
        .to_string()
        .contains("empty"));
    // Binary junk.
    let p = write(f.dir.path(), "junk", "\u{1}\u{2}garbage\n");
    assert_at(
        parse_ibnetdiscover(&p).unwrap_err(),
        &p,
        1,
        "not ibnetdiscover",
    );
    // Missing file.
    let err = parse_ibnetdiscover(&f.dir.path().join("nope")).unwrap_err();
    assert!(err.to_string().contains("nope"));
}

#[test]
fn lft_errors_name_the_line() {
    let f = setup();
    let t = parse_ibnetdiscover(&write(f.dir.path(), "ibnd", &f.ibnd)).unwrap();
    let lines: Vec<String> = f.lfts.lines().map(String::from).collect();
    let entry = lines.iter().position(|l| l.starts_with("0x")).unwrap();
    // Unknown LID.
    let mut l2 = lines.clone();
    l2[entry] = "0x0999 001 # nobody".into();
    let p = write(f.dir.path(), "unknown-lid", &l2.join("\n"));
    assert_at(
        parse_lfts(&p, &t).unwrap_err(),
        &p,
        entry + 1,
        "unknown lid",
    );
    // Unknown switch GUID.
    let mut l2 = lines.clone();
    l2[0] = "Unicast lids [0-24] of switch Lid 99 guid 0x00000000deadbeef ('x'):".into();
    let p = write(f.dir.path(), "unknown-sw", &l2.join("\n"));
    assert_at(
        parse_lfts(&p, &t).unwrap_err(),
        &p,
        1,
        "not in the topology",
    );
    // Port beyond the switch's radix.
    let mut l2 = lines.clone();
    l2[entry] = format!("{} 077", &l2[entry][..6]);
    let p = write(f.dir.path(), "bad-port", &l2.join("\n"));
    assert_at(parse_lfts(&p, &t).unwrap_err(), &p, entry + 1, "no port 77");
    // Truncated in the middle of an entry.
    let p = write(
        f.dir.path(),
        "cut",
        &format!("{}\n0x00", lines[..entry + 3].join("\n")),
    );
    assert_at(parse_lfts(&p, &t).unwrap_err(), &p, entry + 4, "bad");
    // Entry before a header.
    let p = write(f.dir.path(), "headless", &lines[entry..].join("\n"));
    assert_at(parse_lfts(&p, &t).unwrap_err(), &p, 1, "before any");
}

/// Find the table line of switch `sw_name` for `lid`.
fn entry_line(lines: &[String], sw_name: &str, lid: u16) -> usize {
    let h = lines
        .iter()
        .position(|l| l.starts_with("Unicast") && l.contains(&format!("('{sw_name}')")))
        .unwrap();
    h + 1
        + lines[h + 1..]
            .iter()
            .position(|l| l.starts_with(&format!("0x{lid:04x} ")))
            .unwrap()
}

#[test]
fn routing_loop_and_missing_route() {
    let f = setup();
    let t = parse_ibnetdiscover(&write(f.dir.path(), "ibnd", &f.ibnd)).unwrap();
    let lines: Vec<String> = f.lfts.lines().map(String::from).collect();
    let order = order_by_name(&t);
    let dst = order[15];
    let lid = t.nodes[dst].lid;
    let leaf = t.leaf_of(dst).unwrap();
    // Missing route: drop the leaf's entry for the destination.
    let k = entry_line(&lines, &t.nodes[leaf].name, lid);
    let mut l2 = lines.clone();
    l2.remove(k);
    let p = write(f.dir.path(), "missing", &l2.join("\n"));
    let lf = parse_lfts(&p, &t).unwrap();
    let err = analyze(&t, &lf, &order, &shift_steps(16), 3).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("no route")
            && msg.contains(&p.display().to_string())
            && msg.contains(&t.nodes[leaf].name),
        "{msg}"
    );
    // Loop: the destination's leaf sends it back up to spine01, which sends
    // it down to that leaf again.
    let spine = t.find("spine01").unwrap();
    let up_port = (1..t.nodes[leaf].ports.len())
        .find(|&p| t.nodes[leaf].ports[p].map(|r| r.node) == Some(spine))
        .unwrap();
    let mut l2 = lines.clone();
    l2[k] = format!("0x{lid:04x} {up_port:03} # looped");
    let p = write(f.dir.path(), "loop", &l2.join("\n"));
    let lf = parse_lfts(&p, &t).unwrap();
    let err = analyze(&t, &lf, &order, &shift_steps(16), 3).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("loop") && msg.contains(&p.display().to_string()),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(":{}", k + 1)) || msg.contains("spine01"),
        "{msg}"
    );
}

#[test]
fn order_file_errors() {
    let f = setup();
    let t = parse_ibnetdiscover(&write(f.dir.path(), "ibnd", &f.ibnd)).unwrap();
    let p = write(f.dir.path(), "hosts", "node001\nnode002\nnobody\n");
    assert_at(parse_order(&p, &t).unwrap_err(), &p, 3, "unknown host");
    let p = write(f.dir.path(), "dup", "node001\nnode001\n");
    assert_at(parse_order(&p, &t).unwrap_err(), &p, 2, "twice");
    let p = write(f.dir.path(), "ca", "0x0001\tnode001\n0x0777\tx\n");
    assert_at(parse_order(&p, &t).unwrap_err(), &p, 2, "unknown lid");
    let p = write(f.dir.path(), "sw", "node001\nleaf001\n");
    assert_at(parse_order(&p, &t).unwrap_err(), &p, 2, "switch");
    // Hostfile with slots and comments, and OpenSM's DUMMY lines, are fine.
    let p = write(
        f.dir.path(),
        "ok",
        "# ranks\nnode002 slots=1\nnode001\n0xFFFF\tDUMMY\n",
    );
    assert_eq!(parse_order(&p, &t).unwrap().len(), 2);
}

#[test]
fn generator_spec_errors() {
    for bad in [
        "fat-tree:radix=x",
        "fat-tree:radix=8,levels=4",
        "fat-tree:radix=8,down=7,up=7",
        "fat-tree:radix=8,hosts=1",
        "fat-tree:radix=8,hosts=9999",
        "tree:radix=8",
    ] {
        let r = FatTreeSpec::parse(bad).and_then(|s| s.build());
        assert!(r.is_err(), "{bad} accepted");
    }
}

/// Randomly mangled files (truncated anywhere, bytes changed, lines
/// swapped) are parsed or rejected, never a panic; analysis of what parses
/// either works or errs.
#[test]
fn mangled_files_never_panic() {
    use evb_fabric::io::{parse_ibnetdiscover_str, parse_lfts_str};
    use rand::{Rng, SeedableRng};
    let f = setup();
    let t = parse_ibnetdiscover(&write(f.dir.path(), "ibnd", &f.ibnd)).unwrap();
    let mut rng = rand_pcg::Pcg64::seed_from_u64(3);
    let p = Path::new("mangled");
    let junk = [
        " ", "0x", "[", "]", "\"", "#", "99", "0xffff", "\n", "Switch", "Ca", "(", "-", "4x", "x",
        "QDR", "H-", "S-",
    ];
    let names: String = t
        .hosts()
        .iter()
        .map(|&h| format!("H-{:016x} \"host{h} HCA-1\"\n", t.nodes[h].guid))
        .collect();
    for _ in 0..400 {
        for (which, text) in [(0, &f.ibnd), (1, &f.lfts), (2, &names)] {
            let mut b: Vec<char> = text.chars().collect();
            for _ in 0..rng.gen_range(1..8) {
                match rng.gen_range(0..4) {
                    0 => b.truncate(rng.gen_range(0..=b.len())),
                    1 if !b.is_empty() => {
                        let i = rng.gen_range(0..b.len());
                        b.remove(i);
                    }
                    2 => {
                        let i = rng.gen_range(0..=b.len());
                        let j = junk[rng.gen_range(0..junk.len())];
                        for (k, c) in j.chars().enumerate() {
                            b.insert(i + k, c);
                        }
                    }
                    _ if !b.is_empty() => {
                        let i = rng.gen_range(0..b.len());
                        b[i] = char::from(b'0' + rng.gen_range(0..10u8));
                    }
                    _ => {}
                }
            }
            let s: String = b.into_iter().collect();
            if which == 0 {
                if let Ok(m) = parse_ibnetdiscover_str(p, &s) {
                    let o = order_by_name(&m);
                    for e in [
                        evb_fabric::routing::Engine::Ftree,
                        evb_fabric::routing::Engine::Minhop,
                        evb_fabric::routing::Engine::Updn,
                        evb_fabric::routing::Engine::Dfsssp,
                    ] {
                        let r = evb_fabric::routing::route_or_fallback(&m, &e, false);
                        if let (Ok(r), true) = (r, o.len() >= 2) {
                            let _ = analyze(&m, &r.lfts, &o, &shift_steps(o.len()), 2);
                        }
                    }
                    let _ = evb_fabric::io::write_slurm_topology(&m);
                    let _ = evb_fabric::rate::degraded_links(&m);
                    let _ = evb_fabric::names::naming_notes(&m);
                }
            } else if which == 2 {
                if let Ok(map) = evb_fabric::names::parse_name_map_str(p, &s) {
                    let mut m = t.clone();
                    if evb_fabric::names::apply_name_map(&mut m, &map).is_ok() {
                        let mut seen: Vec<&str> = m.nodes.iter().map(|n| n.name.as_str()).collect();
                        seen.sort();
                        seen.dedup();
                        assert_eq!(seen.len(), m.nodes.len(), "names stay unique");
                    }
                }
            } else if let Ok(l) = parse_lfts_str(p, &s, &t) {
                let _ = analyze(&t, &l, &order_by_name(&t), &shift_steps(16), 2);
            }
        }
    }
}

/// Names maps: every bad line is named by file and line.
#[test]
fn names_map_errors_name_the_line() {
    use evb_fabric::names::{apply_name_map, parse_name_map_str};
    let f = setup();
    let p = Path::new("hosts.map");
    let host = f.topo.nodes[f.topo.hosts()[0]].guid;
    let host2 = f.topo.nodes[f.topo.hosts()[1]].guid;
    let sw = f.topo.nodes[f.topo.switches()[0]].guid;
    for (text, line, what) in [
        ("H-zz a\n".to_string(), 1, "is not a guid"),
        ("H-00000000000000001 a\n".to_string(), 1, "is not a guid"),
        (format!("\n\nH-{host:016x}\n"), 3, "no name"),
        (format!("H-{host:016x} a b\n"), 1, "unexpected text"),
        (format!("H-{host:016x} \"a\" b\n"), 1, "unexpected text"),
        (
            format!("H-{host:016x} a/b\n"),
            1,
            "cannot go into hostfiles",
        ),
        (format!("H-{host:016x} -a\n"), 1, "cannot go into hostfiles"),
        (
            format!("H-{host:016x} S-0002c90200100000\n"),
            1,
            "looks like a guid",
        ),
        (
            format!("H-{host:016x} a\nH-{host2:016x} a\n"),
            2,
            "given to guid",
        ),
        (
            format!("H-{host:016x} a\n# x\nH-{host:016x} b\n"),
            3,
            "at line 1 already",
        ),
    ] {
        let e = parse_name_map_str(p, &text).unwrap_err();
        assert_at(e, p, line, what);
    }
    // Same line twice is harmless; a host GUID given as a switch is not.
    let ok = parse_name_map_str(p, &format!("H-{host:016x} a\nH-{host:016x} a\n")).unwrap();
    assert_eq!(ok.entries.len(), 1);
    let map = parse_name_map_str(p, &format!("# c\nS-{host:016x} a\n")).unwrap();
    let e = apply_name_map(&mut f.topo.clone(), &map).unwrap_err();
    assert_at(e, p, 2, "is a host in this fabric");
    let map = parse_name_map_str(p, &format!("H-{sw:016x} a\n")).unwrap();
    let e = apply_name_map(&mut f.topo.clone(), &map).unwrap_err();
    assert_at(e, p, 1, "is a switch in this fabric");
    // Node and port GUID of one host with two names.
    let map = parse_name_map_str(p, &format!("0x{host:016x} a\n0x{:016x} b\n", host + 1)).unwrap();
    let e = apply_name_map(&mut f.topo.clone(), &map).unwrap_err();
    assert_at(e, p, 2, "named 'a' at line 1");
}

/// Link widths and speeds: unknown ones and ends that disagree name the line.
#[test]
fn link_rate_errors_name_the_line() {
    use evb_fabric::io::parse_ibnetdiscover_str;
    let f = setup();
    let p = Path::new("rates.ibnd");
    let lines: Vec<&str> = f.ibnd.lines().collect();
    let first = lines.iter().position(|l| l.contains("4xEDR")).unwrap();
    for (bad, what) in [
        ("3xEDR", "width '3x'"),
        ("4xQQR", "speed 'qqr'"),
        ("12xFOO", "speed 'foo'"),
    ] {
        let text = f.ibnd.replacen("4xEDR", bad, 1);
        let e = parse_ibnetdiscover_str(p, &text).unwrap_err();
        assert_at(e, p, first + 1, what);
    }
    // The far end of the first cable says otherwise.
    let text = f.ibnd.replacen("4xEDR", "4xHDR", 1);
    let e = parse_ibnetdiscover_str(p, &text).unwrap_err().to_string();
    assert!(
        e.contains(&format!("is 4xEDR here but 4xHDR at line {}", first + 1)),
        "{e}"
    );
    // Without rates the fabric reads, rates unknown.
    let text: String = f.ibnd.replace(" 4xEDR", "");
    let t = parse_ibnetdiscover_str(p, &text).unwrap();
    assert_eq!(t.link_gbps(t.hosts()[0], 1), None);
    assert!(evb_fabric::rate::degraded_links(&t).is_empty());
}
