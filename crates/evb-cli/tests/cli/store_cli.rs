//! `evb store read` against real stores: a local directory, and a real
//! MinIO server on loopback (built by scripts/minio.sh, which
//! scripts/setup.sh runs). Batches are written with the same `StoreWriter`
//! the builder unit uses, then read back, corrupted, and read again.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use evb_store::s3::S3Client;
use evb_store::{
    format, S3Options, S3Target, StoreError, StoreStats, StoreTarget, StoreWriter, WriterOptions,
};
use evb_testkit::minio::{Minio, ACCESS_KEY, SECRET_KEY};
use evb_testkit::process::wait_exit;
use evb_testkit::{evb, run_bounded};

const EVENTS: u32 = 32;
const SOURCES: u32 = 3;

/// Runs a command to completion, killing it after 120 s (a test never hangs).
fn run(mut cmd: Command) -> Output {
    run_bounded(&mut cmd, "evb", Duration::from_secs(120)).0
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Fragment payloads of one batch as RUs send them (size table, then data).
fn batch(mep: u64) -> Vec<Vec<u8>> {
    (0..SOURCES)
        .map(|s| {
            let sizes: Vec<u32> = (0..EVENTS)
                .map(|e| 16 + (mep as u32 * 7 + s * 3 + e * 11) % 500)
                .collect();
            let mut f: Vec<u8> = sizes.iter().flat_map(|x| x.to_le_bytes()).collect();
            for (e, &size) in sizes.iter().enumerate() {
                f.extend((0..size).map(|i| (mep as u32 + s + e as u32 + i) as u8));
            }
            f
        })
        .collect()
}

fn write_batches(writer: &mut StoreWriter, meps: std::ops::Range<u64>) {
    for mep in meps {
        let fragments = batch(mep);
        let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match writer.write_batch(mep, EVENTS, &refs) {
                Ok(()) => break,
                Err(StoreError::Backpressure { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("write_batch {mep}: {e}"),
            }
        }
    }
}

fn json_report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

#[test]
fn read_a_local_store_and_find_a_corrupt_object() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    for node in 0..2 {
        let mut writer = StoreWriter::open(&target, 9, node).unwrap();
        write_batches(&mut writer, 0..5);
        assert_eq!(writer.close().unwrap().objects, 5);
    }

    let mut cmd = evb();
    cmd.args(["store", "read"]).arg(dir.path());
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "objects 10 (10 good, 0 bad)  events {}",
            10 * EVENTS
        )),
        "{}",
        text(&out)
    );

    // Flip one payload byte of one object.
    let name = format::object_key(9, 1, 3);
    let path = dir.path().join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();

    let mut cmd = evb();
    cmd.args(["store", "read", "--json"]).arg(dir.path());
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["objects"], 10);
    assert_eq!(report["good_objects"], 9);
    assert_eq!(report["events"], 9 * EVENTS);
    assert_eq!(report["bad"][0]["name"], name.as_str());
    let reason = report["bad"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("payload of event {}", EVENTS - 1)) && reason.contains("CRC-32C"),
        "{reason}"
    );

    // The text form names the object and the failure too.
    let mut cmd = evb();
    cmd.args(["store", "read"]).arg(dir.path());
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("bad: {name}: payload of event")),
        "{}",
        text(&out)
    );
}

#[test]
fn unreadable_or_malformed_targets_are_usage_errors() {
    let mut cmd = evb();
    cmd.args(["store", "read", "/nonexistent/evb-store-test"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/evb-store-test"));

    let mut cmd = evb();
    cmd.args(["store", "read", "s3://Bad_Bucket/x"])
        .env("AWS_ACCESS_KEY_ID", "a")
        .env("AWS_SECRET_ACCESS_KEY", "b");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bucket `Bad_Bucket`"));
}

// ---------------------------------------------------------------- MinIO --

/// MinIO with the bucket `evb` (evb_testkit::minio), ready when the
/// bucket could be made.
fn start_minio() -> Minio {
    let minio = evb_testkit::minio::start_minio("store");
    let client = S3Client::new(&s3_target(&minio, "evb", ""), Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.create_bucket() {
            Ok(()) => return minio,
            Err(e) if Instant::now() > deadline => panic!("no bucket after 60 s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn s3_target(minio: &Minio, bucket: &str, prefix: &str) -> S3Target {
    let spec = format!("s3://{bucket}/{prefix}?endpoint={}", minio.endpoint);
    let options = S3Options {
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        ..S3Options::default()
    };
    match StoreTarget::parse_with(&spec, options).unwrap() {
        StoreTarget::S3(t) => t,
        other => panic!("not s3: {other:?}"),
    }
}

fn evb_read_s3(minio: &Minio, prefix: &str) -> Output {
    let mut cmd = evb();
    cmd.args(["store", "read", "--json"])
        .arg(format!("s3://evb/{prefix}"))
        .env("AWS_ENDPOINT_URL", &minio.endpoint)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env_remove("AWS_SESSION_TOKEN");
    run(cmd)
}

#[test]
fn s3_store_on_minio() {
    let minio = start_minio();
    let target = StoreTarget::S3(s3_target(&minio, "evb", "runs/test"));
    let options = WriterOptions {
        timeout: Duration::from_secs(20),
        ..WriterOptions::default()
    };

    // Two nodes write their batches.
    for node in 0..2u16 {
        let mut writer = StoreWriter::open_with(&target, 4, node, options.clone()).unwrap();
        write_batches(
            &mut writer,
            u64::from(node) * 100..u64::from(node) * 100 + 6,
        );
        let stats = writer.close().unwrap();
        assert_eq!((stats.objects, stats.events), (6, 6 * u64::from(EVENTS)));
    }
    // Two consumers handed the same 4 MEPs, claiming each (a conditional
    // PUT): each MEP is stored once, the claims are not read as objects.
    let claiming = WriterOptions {
        claim: true,
        ..options.clone()
    };
    let mut stored = StoreStats::default();
    for node in 5..7u16 {
        let mut writer = StoreWriter::open_with(&target, 4, node, claiming.clone()).unwrap();
        write_batches(&mut writer, 300..304);
        let stats = writer.close().unwrap();
        stored.objects += stats.objects;
        stored.already_stored += stats.already_stored;
    }
    assert_eq!(
        (stored.objects, stored.already_stored),
        (4, 4),
        "{stored:?}"
    );
    let client = S3Client::new(&s3_target(&minio, "evb", ""), Duration::from_secs(20));
    let claim = format!("runs/test/{}", format::claim_key(4, 301));
    assert!(
        !client.put_if_absent(&claim).unwrap(),
        "a claim is made once"
    );
    client
        .put_object("runs/test/notes.txt", b"not an object")
        .unwrap();

    let out = evb_read_s3(&minio, "runs/test");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["objects"], 16, "{report}");
    assert_eq!(report["good_objects"], 16);
    assert_eq!(report["events"], 16 * EVENTS);
    assert_eq!(report["other_files"], 1);

    // What came back is what was written, byte for byte.
    let key = format!("runs/test/{}", format::object_key(4, 1, 102));
    let stored = client.get_object(&key, 1 << 30).unwrap();
    let fragments = batch(102);
    let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
    assert_eq!(stored, format::encode(4, 1, 102, EVENTS, &refs).unwrap());

    // Corrupt that object's index in place and read again.
    let mut corrupt = stored.clone();
    corrupt[format::HEADER_LEN + 3] ^= 0x10;
    client.put_object(&key, &corrupt).unwrap();
    let out = evb_read_s3(&minio, "runs/test");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["good_objects"], 15);
    assert_eq!(report["bad"][0]["name"], format::object_key(4, 1, 102));
    let reason = report["bad"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("index CRC-32C mismatch"), "{reason}");
}

#[test]
fn s3_writer_reports_backpressure_while_the_server_stalls() {
    let minio = start_minio();
    let target = StoreTarget::S3(s3_target(&minio, "evb", "stall"));
    let options = WriterOptions {
        queue_depth: 2,
        timeout: Duration::from_secs(30),
        ..WriterOptions::default()
    };
    let mut writer = StoreWriter::open_with(&target, 1, 0, options).unwrap();
    let fragments = batch(0);
    let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();

    // Freeze the server: the first PUT hangs, the queue fills.
    // SAFETY: plain syscall on our own child's pid.
    unsafe {
        libc::kill(minio.child.id() as libc::pid_t, libc::SIGSTOP);
    }
    writer.write_batch(0, EVENTS, &refs).unwrap();
    writer.write_batch(1, EVENTS, &refs).unwrap();
    let started = Instant::now();
    let err = writer.write_batch(2, EVENTS, &refs).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "a full queue must not block"
    );
    assert!(
        matches!(err, StoreError::Backpressure { queued: 2 }),
        "{err}"
    );
    assert!(!writer.has_room());
    assert_eq!(writer.stats().refused, 1);

    // SAFETY: as above.
    unsafe {
        libc::kill(minio.child.id() as libc::pid_t, libc::SIGCONT);
    }
    let stats = writer.flush().unwrap();
    assert_eq!(stats.objects, 2);
    assert!(writer.has_room());
    writer.write_batch(2, EVENTS, &refs).unwrap();
    let stats = writer.close().unwrap();
    assert_eq!((stats.objects, stats.refused), (3, 1));
}

#[test]
fn s3_wrong_credentials_or_bucket_fail_at_open() {
    let minio = start_minio();
    let mut bad_key = s3_target(&minio, "evb", "x");
    bad_key.secret_access_key = "wrong-secret".into();
    let err = StoreWriter::open(&StoreTarget::S3(bad_key), 1, 0)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("HTTP 403"), "{err}");

    let missing = s3_target(&minio, "no-such-bucket", "x");
    let err = StoreWriter::open(&StoreTarget::S3(missing), 1, 0)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("HTTP 404") && err.contains("no-such-bucket"),
        "{err}"
    );
}

/// `evb run` of 3 nodes building 90 MEPs of 64 events into the store at
/// `dir`, its JSON to `json`, with `extra` arguments.
fn run_into_store(dir: &Path, json: &Path, extra: &[&str]) -> Output {
    let mut cmd = evb();
    cmd.args(["run", "--progress", "never", "-n", "3", "--json"])
        .arg(json)
        .args(["--set", "run.max_meps=90", "--set", "run.duration_s=0"])
        .args([
            "--set",
            "source.events_per_mep=64",
            "--set",
            "output.sink=store",
        ])
        .arg("--set")
        .arg(format!("output.store={}", dir.display()))
        .args(extra);
    run(cmd)
}

/// `evb store read --json` of `dir`, which must succeed: the report and
/// its text.
fn read_store_json(dir: &Path) -> (serde_json::Value, String) {
    let mut cmd = evb();
    cmd.args(["store", "read", "--json"]).arg(dir);
    let read = run(cmd);
    let text = String::from_utf8_lossy(&read.stdout).into_owned();
    assert!(read.status.success(), "{text}");
    (serde_json::from_str(&text).unwrap(), text)
}

/// The event builder writes its built batches to the store (`output.sink =
/// "store"`); reading the store back verifies every object and finds every
/// built event.
#[test]
fn evb_run_writes_every_built_batch_to_the_store() {
    let dir = std::env::temp_dir().join(format!("evb-run-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let json = dir.with_extension("json");
    let out = run_into_store(&dir, &json, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(run["summary"]["events_built"], 90 * 64);
    let (v, text) = read_store_json(&dir);
    assert_eq!(v["objects"], 90, "{text}");
    assert_eq!(v["events"], 90 * 64, "{text}");
    assert_eq!(v["good_objects"], 90, "{text}");
    assert_eq!(v["bad"], serde_json::json!([]), "{text}");
}

/// With Filter Unit consumers the consumers store what their trigger
/// accepted (`output.accept_fraction`), one object per batch with any
/// accepted event, and the BUs store nothing. Every stored event is one the
/// trigger decision (recomputed here from the run's config) accepts; the
/// run's counts, the writers' counts and the reader's agree exactly.
#[test]
fn consumers_store_the_events_their_trigger_accepted() {
    let dir = std::env::temp_dir().join(format!("evb-run-store-fu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let json = dir.with_extension("json");
    let out = run_into_store(
        &dir,
        &json,
        &["--consumers", "2", "--set", "output.accept_fraction=0.2"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("trigger: accepted "), "{stdout}");
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let s = &run["summary"];
    let c = &s["consumers"];
    assert_eq!(s["events_built"], 90 * 64);
    assert_eq!(c["events_consumed"], 90 * 64, "{c}");
    let accepted = c["events_accepted"].as_u64().unwrap();
    let fraction = accepted as f64 / (90.0 * 64.0);
    assert!((fraction - 0.2).abs() < 0.05, "accepted {accepted}");
    assert_eq!(s["store_events"], accepted, "{s}");
    assert_eq!(s["store_objects"], c["batches_accepted"], "{s}");

    // The reader agrees and every object verifies.
    let (v, text) = read_store_json(&dir);
    assert_eq!(v["events"], accepted, "{text}");
    assert_eq!(v["objects"], s["store_objects"], "{text}");
    assert_eq!(v["bad"], serde_json::json!([]), "{text}");
    assert_eq!(v["selection_objects"], v["objects"], "{text}");

    // Only the consumers (endpoints 3 and 4) wrote, and what they wrote is
    // what the trigger accepts.
    let config: evb_core::Config = serde_json::from_value(run["config"].clone()).unwrap();
    let layout = evb_core::layout::Layout::from_config(&config);
    let fu = evb_core::fu::FilterUnit::new(&config, &layout, layout.fu_nodes[0]);
    let mut meps = std::collections::BTreeSet::new();
    let mut expected = Vec::new();
    for node in std::fs::read_dir(dir.join(format!("run{}", config.run.run_id))).unwrap() {
        let node = node.unwrap();
        let name = node.file_name().to_string_lossy().into_owned();
        if name == "claims" {
            // One claim per MEP stored (consumers claim before storing).
            let claims = std::fs::read_dir(node.path()).unwrap().count();
            assert_eq!(claims as u64, s["store_objects"].as_u64().unwrap());
            continue;
        }
        assert!(name == "node3" || name == "node4", "a BU wrote: {name}");
        for object in std::fs::read_dir(node.path()).unwrap() {
            let bytes = std::fs::read(object.unwrap().path()).unwrap();
            let batch = format::decode(&bytes).unwrap();
            let mep = batch.header.mep;
            assert!(meps.insert(mep), "MEP {mep} stored twice");
            assert_eq!(batch.mep_events(), 64);
            assert_eq!(batch.header.source_count, 3);
            fu.accepted_events(mep, 64, &mut expected);
            let stored: Vec<u32> = (0..batch.header.event_count)
                .map(|e| batch.event_number(e))
                .collect();
            assert_eq!(stored, expected, "MEP {mep}");
        }
    }
    assert_eq!(meps.len() as u64, s["store_objects"].as_u64().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&json);
}

/// A source lost mid-run (`--kill`: a real `kill -9` of node 2, its RU and
/// BU): the surviving BUs build the later batches without source 2 and
/// store them as such. `evb store read` verifies every object and names the
/// missing source; every complete object holds all 4 sources.
#[test]
fn objects_built_after_a_source_is_lost_record_their_sources() {
    let dir = std::env::temp_dir().join(format!("evb-run-store-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let json = dir.with_extension("json");
    let mut cmd = evb();
    // Small batches (8 events of 32 bytes a source): thousands of small
    // objects, not gigabytes.
    cmd.args(["run", "--progress", "never", "-n", "4", "--duration", "2.5"])
        .args(["--kill", "2@1", "--allow-loss", "--json"])
        .arg(&json)
        .args([
            "--set",
            "source.events_per_mep=8",
            "--set",
            "source.size=fixed",
        ])
        .args(["--set", "source.mean_bytes=32"])
        .args(["--set", "output.sink=store", "--set"])
        .arg(format!("output.store={}", dir.display()));
    let out = run(cmd);
    let run_text = text(&out);
    assert!(out.status.success(), "{run_text}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(result["summary"]["nodes_missing"], serde_json::json!([2]));

    // The listing is large: to a file, not a pipe the child could fill.
    let listing = dir.with_extension("list.json");
    let mut cmd = evb();
    cmd.args(["store", "read", "--json", "--list"]).arg(&dir);
    let read = run_to_file(cmd, &listing);
    let v: serde_json::Value = serde_json::from_slice(&read)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&read)));
    // Node 2 may have died in the middle of a write: only its unfinished
    // temporary file can be bad.
    for bad in v["bad"].as_array().unwrap() {
        let name = bad["name"].as_str().unwrap();
        assert!(
            name.contains("/node2/") && bad["reason"].as_str().unwrap().contains("unfinished"),
            "{bad}"
        );
    }
    let good = v["good_objects"].as_u64().unwrap();
    let partial = v["partial_objects"].as_u64().unwrap();
    eprintln!("store after kill -9 of node 2: {good} good objects, {partial} without source 2");
    assert!(partial > 0, "later batches lack source 2: {v}");
    assert!(good > partial, "batches before the kill hold every source");
    assert_eq!(v["missing_by_source"], serde_json::json!({ "2": partial }));
    let listed = v["listed"].as_array().unwrap();
    assert_eq!(listed.len() as u64, good);
    let mut last_complete = 0u64;
    let mut first_partial = u64::MAX;
    for o in listed {
        let sources = o["sources"].clone();
        let mep = o["mep"].as_u64().unwrap();
        assert_eq!(o["run_sources"], 4);
        if sources == serde_json::json!([0, 1, 3]) {
            first_partial = first_partial.min(mep);
            assert!(!o["name"].as_str().unwrap().contains("/node2/"));
        } else {
            assert_eq!(sources, serde_json::json!([0, 1, 2, 3]), "{o}");
            last_complete = last_complete.max(mep);
        }
    }
    eprintln!("last complete MEP {last_complete}, first without source 2 {first_partial}");
    // The store's events are those of the batches the BUs built.
    let node_built: u64 = result["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| !n.is_null() && n["node"] != 2)
        .map(|n| n["events_built"].as_u64().unwrap())
        .sum();
    let survivors_events: u64 = listed
        .iter()
        .filter(|o| !o["name"].as_str().unwrap().contains("/node2/"))
        .map(|o| o["events"].as_u64().unwrap())
        .sum();
    assert_eq!(survivors_events, node_built, "every built batch stored");
    // The text report names the partial objects.
    let mut cmd = evb();
    cmd.args(["store", "read"]).arg(&dir);
    let out = String::from_utf8_lossy(&run(cmd).stdout).to_string();
    assert!(
        out.contains(&format!(
            "partial objects {partial} (built without some sources; missing: source 2 in {partial})"
        )),
        "{out}"
    );
    assert!(out.contains("sources 3 of 4, missing 2"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&listing);
}

/// Runs a command with its stdout to `path` (killed after 120 s); returns
/// what it wrote.
fn run_to_file(mut cmd: Command, path: &Path) -> Vec<u8> {
    let mut child = cmd
        .stdout(std::fs::File::create(path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start evb");
    wait_exit(&mut child, Duration::from_secs(120), &format!("{cmd:?}"));
    std::fs::read(path).unwrap()
}
