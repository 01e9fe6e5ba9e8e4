//! The readout emulation, verification levels and shm zero copy, end to
//! end: real `evb node` processes over shm (in place and copying) and TCP.
//! Every built batch written to the file sink is checked byte for byte
//! against the source model (ring or fresh data, each event's number),
//! injected corruption is caught at every verification level, and the
//! summary says what was run and what it cost in CPU.

use std::path::PathBuf;
use std::time::Duration;

use evb_core::source::SourceModel;
use evb_core::Config;
use evb_testkit::json::summary_u64 as u;
use evb_testkit::scratch::scratch_file;
use evb_testkit::{evb, read_json_or_null, run_bounded};
use serde_json::Value;

fn tmp(name: &str) -> PathBuf {
    scratch_file("readout", name)
}

/// The settings every run here shares: small MEPs, a fixed count.
const BASE: [&str; 4] = [
    "run.max_meps=150",
    "run.duration_s=0",
    "source.events_per_mep=64",
    "event_builder.batch_timeout_ms=1500",
];

/// `evb run --nodes 3` with `sets`; returns (exit code, JSON, output).
fn run(name: &str, sets: &[String]) -> (i32, Value, String) {
    let json = tmp(&format!("{name}.json"));
    let mut cmd = evb();
    cmd.args(["run", "--nodes", "3", "--progress", "never", "--json"])
        .arg(&json);
    for s in BASE
        .iter()
        .map(|s| s.to_string())
        .chain(sets.iter().cloned())
    {
        cmd.args(["--set", &s]);
    }
    let (out, text) = run_bounded(&mut cmd, "evb run", Duration::from_secs(90));
    (
        out.status.code().unwrap_or(-1),
        read_json_or_null(&json),
        text,
    )
}

/// Every fragment of every `EVBB` record in `dir`, by (MEP, source).
fn fragments(dir: &std::path::Path) -> Vec<(u64, usize, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let mut at = 0;
        while at < data.len() {
            assert_eq!(&data[at..at + 4], b"EVBB");
            let mep = u64::from_le_bytes(data[at + 4..at + 12].try_into().unwrap());
            let n = u32::from_le_bytes(data[at + 12..at + 16].try_into().unwrap()) as usize;
            let lens: Vec<usize> = (0..n)
                .map(|i| {
                    let p = at + 16 + 4 * i;
                    u32::from_le_bytes(data[p..p + 4].try_into().unwrap()) as usize
                })
                .collect();
            let mut p = at + 16 + 4 * n;
            for (source, len) in lens.into_iter().enumerate() {
                out.push((mep, source, data[p..p + len].to_vec()));
                p += len;
            }
            at = p;
        }
    }
    out
}

/// Ring and fresh readouts, over shm in place, shm copying and TCP, at
/// the three verification levels: every event built once, and the data
/// the BUs built (written by the file sink) is what the sources wrote,
/// byte for byte, each event with its own number: no ring buffer was
/// reused while a BU still read it in place.
#[test]
fn every_readout_builds_exactly_and_its_data_verifies() {
    let cases = [
        ("ring", "shm", true, "sample"),
        ("ring", "shm", false, "header"),
        ("ring", "tcp", false, "crc"),
        ("fresh", "shm", true, "crc"),
        ("fresh", "tcp", false, "header"),
    ];
    for (readout, transport, zero_copy, verify) in cases {
        let name = format!("{readout}-{transport}-{zero_copy}-{verify}");
        let dir = tmp(&format!("{name}-out"));
        let _ = std::fs::remove_dir_all(&dir);
        let sets = vec![
            format!("source.readout={readout}"),
            format!("transport.kind={transport}"),
            format!("transport.shm_zero_copy={zero_copy}"),
            format!("event_builder.verify={verify}"),
            "output.sink=file".into(),
            format!("output.directory=\"{}\"", dir.display()),
        ];
        let (code, v, text) = run(&name, &sets);
        assert_eq!(code, 0, "{name}: {text}");
        assert_eq!(u(&v, "events_built"), 150 * 64, "{name}: {text}");
        assert_eq!(u(&v, "fragments_corrupt"), 0, "{name}: {text}");
        let s = &v["summary"];
        assert_eq!(s["readout"], readout, "{name}");
        let level = if verify == "sample" {
            "sample 1/64".to_string()
        } else {
            verify.to_string()
        };
        assert_eq!(s["verify"], level.as_str(), "{name}");
        assert_eq!(s["zero_copy"], zero_copy, "{name}");
        assert!(
            text.contains(&format!("readout {readout}, verify {level}")),
            "{name}: {text}"
        );
        // CPU in the summary and per node (the kernel accounts it by the
        // tick: a node of a short run may show user or system time 0).
        let cpu = &s["cpu"];
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
        assert!(f(cpu, "user_s") + f(cpu, "system_s") > 0.0, "{name}: {cpu}");
        let per_gb = f(cpu, "user_s_per_gb") + f(cpu, "system_s_per_gb");
        let built_gb = u(&v, "bytes_built") as f64 / 1e9;
        let all = f(cpu, "user_s") + f(cpu, "system_s");
        assert!(
            (per_gb * built_gb - all).abs() < 1e-6 * all.max(1.0),
            "{name}: {cpu}"
        );
        assert!(cpu["max_node"].as_u64().is_some(), "{name}: {cpu}");
        for node in v["nodes"].as_array().unwrap() {
            let spent = f(node, "cpu_user_s") + f(node, "cpu_system_s");
            assert!(spent > 0.0, "{name}: {node}");
            let per_gb = f(node, "cpu_user_s_per_gb") + f(node, "cpu_system_s_per_gb");
            let gb = node["bytes_built"].as_u64().unwrap() as f64 / 1e9;
            assert!((per_gb * gb - spent).abs() < 1e-6, "{name}: {node}");
        }
        // The data, byte for byte.
        let overrides: Vec<String> = BASE
            .iter()
            .map(|s| s.to_string())
            .chain(sets.iter().take(4).cloned())
            .collect();
        let config = Config::load(None, &overrides).unwrap();
        let models: Vec<SourceModel> = (0..3).map(|i| SourceModel::new(&config, i)).collect();
        let frags = fragments(&dir);
        assert_eq!(frags.len(), 150 * 3, "{name}");
        let mut scratch = Vec::new();
        for (mep, source, payload) in &frags {
            let ok = match readout {
                "ring" => models[*source].verify_ring_payload(*mep, payload),
                _ => models[*source].verify_payload(*mep, payload, &mut scratch),
            };
            assert!(ok, "{name}: MEP {mep} source {source} does not verify");
        }
    }
}

/// `faults.corrupt_meps` damages the first event's number after the CRC:
/// every readout at every level counts it.
#[test]
fn corruption_is_caught_at_every_level() {
    for readout in ["ring", "fresh"] {
        for verify in ["header", "sample", "crc"] {
            let name = format!("corrupt-{readout}-{verify}");
            let sets = vec![
                format!("source.readout={readout}"),
                format!("event_builder.verify={verify}"),
                "faults.source=1".into(),
                "faults.corrupt_meps=[7, 50]".into(),
            ];
            let (code, v, text) = run(&name, &sets);
            assert_eq!(code, 1, "{name}: a corrupt batch fails the run: {text}");
            assert_eq!(u(&v, "fragments_corrupt"), 2, "{name}: {text}");
            assert_eq!(u(&v, "events_corrupt"), 2 * 64, "{name}");
            assert_eq!(u(&v, "events_built"), 148 * 64, "{name}");
            assert_eq!(u(&v, "events_lost"), 0, "{name}");
        }
    }
}

/// The sample level checks the CRC of about one fragment in K, the same
/// ones at the RU (which computes only those) and the BU: with K = 1 it
/// is every fragment, and a corrupted data byte (not the header's) would
/// be caught; here a clean run at K = 1 and K = 7 builds everything.
#[test]
fn sample_rates_agree_between_ru_and_bu() {
    for k in [1, 7] {
        let name = format!("sample-{k}");
        let sets = vec![
            "event_builder.verify=sample".to_string(),
            format!("event_builder.verify_sample={k}"),
            "transport.kind=tcp".into(),
        ];
        let (code, v, text) = run(&name, &sets);
        assert_eq!(code, 0, "{name}: {text}");
        assert_eq!(u(&v, "events_built"), 150 * 64, "{name}: {text}");
        assert_eq!(v["summary"]["verify"], format!("sample 1/{k}"), "{name}");
    }
    // A bad rate is refused naming the key, before anything starts.
    let (code, _, text) = run("sample-0", &["event_builder.verify_sample=0".into()]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("event_builder.verify_sample"), "{text}");
}
