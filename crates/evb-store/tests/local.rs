//! The store on a local directory, end to end: batches through the writer
//! thread to files, read back and verified; every kind of damage found and
//! named; a failing disk reported, not ignored.

use std::path::Path;

use evb_store::format::{self, HEADER_LEN};
use evb_store::{read_store, ReadOptions, StoreError, StoreTarget, StoreWriter, WriterOptions};
use proptest::prelude::*;

/// A fragment payload as an RU sends it: `sizes.len()` u32 sizes, then the
/// events, each filled with bytes derived from (source, event).
fn fragment(source: u32, sizes: &[u32]) -> Vec<u8> {
    let mut f: Vec<u8> = sizes.iter().flat_map(|s| s.to_le_bytes()).collect();
    for (e, &size) in sizes.iter().enumerate() {
        f.extend((0..size).map(|i| (source * 31 + e as u32 * 7 + i) as u8));
    }
    f
}

/// Fragments of `sources` sources for one batch, sizes varying with mep.
fn batch(mep: u64, sources: u32, events: u32) -> Vec<Vec<u8>> {
    (0..sources)
        .map(|s| {
            let sizes: Vec<u32> = (0..events)
                .map(|e| (mep as u32 * 13 + s * 5 + e * 3) % 200)
                .collect();
            fragment(s, &sizes)
        })
        .collect()
}

fn write_run(root: &Path, run: u32, node: u16, meps: u64, sources: u32, events: u32) {
    let target = StoreTarget::Dir(root.to_path_buf());
    let mut writer = StoreWriter::open(&target, run, node).unwrap();
    for mep in 0..meps {
        let fragments = batch(mep, sources, events);
        let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
        loop {
            match writer.write_batch(mep, events, &refs) {
                Ok(()) => break,
                Err(StoreError::Backpressure { .. }) => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("write_batch: {e}"),
            }
        }
    }
    let stats = writer.close().unwrap();
    assert_eq!(stats.objects, meps);
    assert_eq!(stats.events, meps * u64::from(events));
    assert_eq!(stats.failed, 0);
}

#[test]
fn round_trip_through_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), 5, 0, 20, 4, 64);
    write_run(dir.path(), 5, 1, 10, 4, 64);
    let report = read_store(
        &StoreTarget::Dir(dir.path().into()),
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(report.bad, vec![]);
    assert_eq!(report.objects, 30);
    assert_eq!(report.good_objects, 30);
    assert_eq!(report.events, 30 * 64);
    assert_eq!(report.other_files, 0);

    // Every event of every object is the sources' fragments, in order.
    for mep in 0..20 {
        let path = dir.path().join(format::object_key(5, 0, mep));
        let bytes = std::fs::read(&path).unwrap();
        let stored = format::decode(&bytes).unwrap();
        let fragments = batch(mep, 4, 64);
        for e in 0..64u32 {
            let mut expected = Vec::new();
            for (s, f) in fragments.iter().enumerate() {
                let sizes: Vec<usize> = f[..64 * 4]
                    .chunks(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
                    .collect();
                let start = 64 * 4 + sizes[..e as usize].iter().sum::<usize>();
                let piece = &f[start..start + sizes[e as usize]];
                assert_eq!(
                    stored.fragment(e, s as u32),
                    piece,
                    "mep {mep} event {e} source {s}"
                );
                expected.extend_from_slice(piece);
            }
            assert_eq!(stored.event(e), expected.as_slice());
        }
    }
}

/// A run of 4 sources whose source 2 is lost after MEP 4: the writer
/// stores later batches with 3 sources, the reader names which.
#[test]
fn batches_without_a_lost_source_read_back_with_their_source_list() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().to_path_buf());
    let mut writer = StoreWriter::open(&target, 6, 1).unwrap();
    for mep in 0..10u64 {
        let all = batch(mep, 4, 16);
        let sources: Vec<u32> = if mep < 5 {
            vec![0, 1, 2, 3]
        } else {
            vec![0, 1, 3]
        };
        let refs: Vec<&[u8]> = sources
            .iter()
            .map(|&s| all[s as usize].as_slice())
            .collect();
        loop {
            match writer.write_batch_sources(mep, 16, 4, &sources, &refs) {
                Ok(()) => break,
                Err(StoreError::Backpressure { .. }) => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("write_batch_sources: {e}"),
            }
        }
    }
    // A source list that does not fit is refused, naming the MEP.
    let f = batch(0, 1, 16);
    let err = writer
        .write_batch_sources(10, 16, 4, &[3, 1], &[&f[0], &f[0]])
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("batch of MEP 10: fragment of source 1:"),
        "{err}"
    );
    writer.close().unwrap();
    let options = ReadOptions {
        list: true,
        ..ReadOptions::default()
    };
    let report = read_store(&target, &options).unwrap();
    assert_eq!(report.bad, vec![]);
    assert_eq!(report.good_objects, 10);
    assert_eq!(report.events, 10 * 16);
    assert_eq!(report.partial_objects, 5);
    assert_eq!(report.version_1_objects, 0);
    assert_eq!(
        report.missing_by_source,
        std::collections::BTreeMap::from([(2, 5)])
    );
    let partial: Vec<u64> = report.partial.iter().map(|p| p.mep).collect();
    assert_eq!(partial, vec![5, 6, 7, 8, 9]);
    assert!(report
        .partial
        .iter()
        .all(|p| p.missing == vec![2] && p.sources_stored == 3 && p.run_sources == 4));
    for o in &report.listed {
        let expected: Vec<u32> = if o.mep < 5 {
            vec![0, 1, 2, 3]
        } else {
            vec![0, 1, 3]
        };
        assert_eq!(o.sources, expected, "{}", o.name);
        assert_eq!((o.version, o.run_sources), (format::VERSION, 4));
    }
    // The stored fragments are the sources' own: column 2 of MEP 7 is source 3.
    let bytes = std::fs::read(dir.path().join(format::object_key(6, 1, 7))).unwrap();
    let stored = format::decode(&bytes).unwrap();
    assert_eq!(stored.source(2), 3);
    let source_3 = &batch(7, 4, 16)[3];
    let size_0 = u32::from_le_bytes(source_3[..4].try_into().unwrap()) as usize;
    assert_eq!(stored.fragment(0, 2), &source_3[16 * 4..16 * 4 + size_0]);
}

fn one_object(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    write_run(dir, 1, 2, 1, 3, 10);
    let path = dir.join(format::object_key(1, 2, 0));
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

/// Reads `dir` and returns the one bad reason, checking it names the object.
fn single_bad_reason(dir: &Path) -> String {
    let report = read_store(&StoreTarget::Dir(dir.into()), &ReadOptions::default()).unwrap();
    assert_eq!(report.bad.len(), 1, "{report:?}");
    assert_eq!(report.bad[0].name, format::object_key(1, 2, 0));
    report.bad[0].reason.clone()
}

#[test]
fn every_byte_flip_is_detected_and_located() {
    let dir = tempfile::tempdir().unwrap();
    let (path, good) = one_object(dir.path());
    let header = format::decode_header(&good).unwrap();
    let index_end = HEADER_LEN + header.index_len().unwrap() as usize;
    for at in 0..good.len() {
        let mut bad = good.clone();
        bad[at] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        let reason = single_bad_reason(dir.path());
        let expected = if at < 4 {
            "bad magic"
        } else if at < HEADER_LEN {
            "header CRC-32C"
        } else if at < index_end {
            "index CRC-32C"
        } else {
            "payload of event"
        };
        assert!(
            reason.contains(expected),
            "flip at byte {at}: `{reason}` does not say `{expected}`"
        );
    }
}

#[test]
fn every_truncation_and_extension_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (path, good) = one_object(dir.path());
    for len in 0..good.len() {
        std::fs::write(&path, &good[..len]).unwrap();
        let reason = single_bad_reason(dir.path());
        assert!(reason.starts_with("truncated"), "length {len}: {reason}");
    }
    let mut longer = good.clone();
    longer.push(0);
    std::fs::write(&path, &longer).unwrap();
    assert!(single_bad_reason(dir.path()).contains("1 trailing bytes"));
}

#[test]
fn leftover_temporary_file_is_reported_and_other_files_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (path, good) = one_object(dir.path());
    std::fs::remove_file(&path).unwrap();
    let tmp = path.with_file_name(format!(
        "{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, &good[..10]).unwrap();
    std::fs::write(dir.path().join("README"), "not an object").unwrap();
    let report = read_store(
        &StoreTarget::Dir(dir.path().into()),
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(report.other_files, 1);
    assert_eq!(report.bad.len(), 1);
    assert!(
        report.bad[0].reason.contains("unfinished write"),
        "{report:?}"
    );
}

#[test]
fn object_under_the_wrong_name_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = one_object(dir.path());
    let renamed = dir.path().join(format::object_key(1, 2, 7));
    std::fs::rename(&path, &renamed).unwrap();
    let report = read_store(
        &StoreTarget::Dir(dir.path().into()),
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(report.bad.len(), 1);
    assert!(
        report.bad[0]
            .reason
            .contains("the name says run 1 node 2 MEP 7"),
        "{report:?}"
    );
}

#[test]
fn object_over_the_size_limit_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let (_, good) = one_object(dir.path());
    let options = ReadOptions {
        max_object_bytes: good.len() as u64 - 1,
        ..ReadOptions::default()
    };
    let report = read_store(&StoreTarget::Dir(dir.path().into()), &options).unwrap();
    assert_eq!(report.bad.len(), 1);
    assert!(report.bad[0].reason.contains("limit"), "{report:?}");
}

#[test]
fn missing_store_is_an_error_naming_it() {
    let err = read_store(
        &StoreTarget::Dir("/nonexistent/evb-store".into()),
        &ReadOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/evb-store"), "{err}");
}

#[test]
fn invalid_fragment_is_refused_and_names_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let mut writer = StoreWriter::open(&target, 1, 0).unwrap();
    let good = fragment(0, &[4, 4]);
    let bad = fragment(1, &[4, 5]);
    let err = writer
        .write_batch(3, 2, &[&good, &bad[..bad.len() - 1]])
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("MEP 3") && text.contains("source 1"),
        "{text}"
    );
    // The writer is still usable, and nothing was written for MEP 3.
    writer.write_batch(4, 2, &[&good, &bad]).unwrap();
    let stats = writer.close().unwrap();
    assert_eq!(stats.objects, 1);
    assert!(!dir.path().join(format::object_key(1, 0, 3)).exists());
}

#[test]
fn a_failing_disk_stops_the_writer_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let mut writer = StoreWriter::open_with(
        &target,
        1,
        0,
        WriterOptions {
            queue_depth: 1,
            ..WriterOptions::default()
        },
    )
    .unwrap();
    // Pull the node's directory away under the writer.
    let node_dir = dir.path().join("run1/node0");
    std::fs::remove_dir(&node_dir).unwrap();
    let f = fragment(0, &[8]);
    writer.write_batch(0, 1, &[&f]).unwrap();
    let err = writer.flush().unwrap_err().to_string();
    assert!(
        err.contains("run1/node0/00000000000000000000.evbo"),
        "{err}"
    );
    let err = writer.write_batch(1, 1, &[&f]).unwrap_err();
    assert!(matches!(err, StoreError::Failed(_)), "{err}");
    let err = writer.close().unwrap_err().to_string();
    assert!(err.contains("0 objects written"), "{err}");
}

/// With `keep_going` (what a node opens): a write that fails (here the
/// node's directory pulled away, as a full disk would fail it) costs its
/// object only, leaves no half object, and the writer takes the next ones
/// once the store can take them again; close reports the count.
#[test]
fn a_failing_write_costs_its_object_only_with_keep_going() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let options = WriterOptions {
        queue_depth: 1,
        keep_going: true,
        ..WriterOptions::default()
    };
    let mut writer = StoreWriter::open_with(&target, 1, 0, options).unwrap();
    let node_dir = dir.path().join("run1/node0");
    std::fs::remove_dir(&node_dir).unwrap();
    let f = fragment(0, &[8]);
    writer.write_batch(0, 1, &[&f]).unwrap();
    let stats = writer.flush().unwrap();
    assert_eq!((stats.objects, stats.failed), (0, 1));
    assert!(stats.last_error.unwrap().contains("run1/node0"));
    std::fs::create_dir_all(&node_dir).unwrap();
    writer.write_batch(1, 1, &[&f]).unwrap();
    let stats = writer.close().unwrap();
    assert_eq!((stats.objects, stats.failed), (1, 1));
    let names: Vec<_> = std::fs::read_dir(&node_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["00000000000000000001.evbo".to_string()]);
}

/// A batch delivered again is written only if no consumer stored it yet:
/// the first consumer's object stands, the second writes nothing.
#[test]
fn a_batch_delivered_again_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let f = fragment(0, &[8, 3]);
    let mut first = StoreWriter::open(&target, 1, 4).unwrap();
    first.write_batch(7, 2, &[&f]).unwrap();
    assert_eq!(first.close().unwrap().objects, 1);
    let mut second = StoreWriter::open(&target, 1, 5).unwrap();
    second.check_stored_by(&[4, 5]);
    second
        .write_events_again(7, 2, 1, &[0], &[&f], None)
        .unwrap();
    second.flush().unwrap();
    second
        .write_events_again(8, 2, 1, &[0], &[&f], None)
        .unwrap();
    let stats = second.close().unwrap();
    assert_eq!((stats.objects, stats.already_stored), (1, 1));
    let report = read_store(&target, &ReadOptions::default()).unwrap();
    assert_eq!(report.objects, 2, "{report:?}");
}

fn claiming(target: &StoreTarget, node: u16) -> StoreWriter {
    let options = WriterOptions {
        claim: true,
        keep_going: true,
        ..WriterOptions::default()
    };
    StoreWriter::open_with(target, 1, node, options).unwrap()
}

/// Two consumers handed the same MEPs as first deliveries (one given up
/// by its BU, alive all the same: the woken consumer of `evb chaos`'s
/// 1-MEP doubles, its write racing the other's still queued in its
/// writer thread) write them at the same moment from two threads: each
/// MEP is stored exactly once, by whichever claimed it first. Without
/// claims both store each (200 MEPs stored twice).
#[test]
fn meps_written_by_two_claiming_writers_at_once_are_stored_once() {
    const MEPS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let f = fragment(0, &[8, 3]);
    let start = std::sync::Barrier::new(2);
    let stats: Vec<_> = std::thread::scope(|s| {
        let writers: Vec<_> = [5u16, 6]
            .into_iter()
            .map(|node| {
                let (target, f, start) = (&target, &f, &start);
                s.spawn(move || {
                    let mut w = claiming(target, node);
                    start.wait();
                    for mep in 0..MEPS {
                        while let Err(e) = w.write_events(mep, 2, 1, &[0], &[f], None) {
                            assert!(matches!(e, StoreError::Backpressure { .. }), "{e}");
                            std::thread::yield_now();
                        }
                    }
                    w.close().unwrap()
                })
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let objects: u64 = stats.iter().map(|s| s.objects).sum();
    let skipped: u64 = stats.iter().map(|s| s.already_stored).sum();
    assert_eq!((objects, skipped), (MEPS, MEPS), "{stats:?}");
    let report = read_store(&target, &ReadOptions::default()).unwrap();
    assert_eq!((report.objects, report.good_objects), (MEPS, MEPS));
    assert_eq!(
        report.other_files, 0,
        "claims are not reported as other files"
    );
    let mut meps = std::collections::BTreeSet::new();
    for node in ["node5", "node6"] {
        for e in std::fs::read_dir(dir.path().join("run1").join(node)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            assert!(meps.insert(name.clone()), "MEP {name} stored twice");
        }
    }
}

/// A claimed MEP is not stored by a later writer either, delivered again
/// or not; a write that fails (the node's directory pulled away, as a
/// full disk fails it) claims nothing, so another writer still stores it.
#[test]
fn a_claim_holds_against_later_writers_and_a_failed_write_claims_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let f = fragment(0, &[8, 3]);
    let mut first = claiming(&target, 4);
    first.write_events(7, 2, 1, &[0], &[&f], None).unwrap();
    assert_eq!(first.close().unwrap().objects, 1);
    assert!(dir
        .path()
        .join("run1/claims/00000000000000000007")
        .is_file());
    let mut second = claiming(&target, 5);
    second.write_events(7, 2, 1, &[0], &[&f], None).unwrap();
    second.flush().unwrap();
    second
        .write_events_again(7, 2, 1, &[0], &[&f], None)
        .unwrap();
    let stats = second.close().unwrap();
    assert_eq!((stats.objects, stats.already_stored), (0, 2), "{stats:?}");

    let mut failing = claiming(&target, 8);
    std::fs::remove_dir(dir.path().join("run1/node8")).unwrap();
    failing.write_events(9, 2, 1, &[0], &[&f], None).unwrap();
    let stats = failing.close().unwrap();
    assert_eq!((stats.objects, stats.failed), (0, 1));
    assert!(!dir.path().join("run1/claims/00000000000000000009").exists());
    let mut other = claiming(&target, 5);
    other.write_events(9, 2, 1, &[0], &[&f], None).unwrap();
    assert_eq!(other.close().unwrap().objects, 1);
}

/// A writer stuck (no write finishing: here its file is a FIFO nobody
/// reads, a store that hangs) costs its caller at most the bound once: the
/// next wait gives up at once, and room comes back with the next write.
#[test]
fn a_stuck_writer_costs_its_caller_the_bound_once() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let options = WriterOptions {
        queue_depth: 1,
        ..WriterOptions::default()
    };
    let mut writer = StoreWriter::open_with(&target, 1, 0, options).unwrap();
    let fifo = dir.path().join("run1/node0/.00000000000000000000.evbo.tmp");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("no mkfifo: skipped");
        return;
    }
    let f = fragment(0, &[8]);
    writer.write_batch(0, 1, &[&f]).unwrap();
    let err = writer.write_batch(1, 1, &[&f]).unwrap_err();
    assert!(matches!(err, StoreError::Backpressure { .. }), "{err}");
    let bound = Duration::from_millis(200);
    let t = Instant::now();
    assert!(!writer.wait_for_room(bound));
    let first = t.elapsed();
    assert!(first >= bound && first < 5 * bound, "{first:?}");
    let t = Instant::now();
    assert!(!writer.wait_for_room(bound));
    assert!(t.elapsed() < bound / 2, "{:?}", t.elapsed());
    // The store wakes up: the write finishes, there is room again.
    let reader = std::thread::spawn(move || std::fs::read(fifo).unwrap().len());
    assert!(writer.wait_for_room(Duration::from_secs(10)));
    writer.write_batch(1, 1, &[&f]).unwrap();
    assert!(reader.join().unwrap() > 0);
    assert_eq!(writer.close().unwrap().objects, 2);
}

/// A node's new writer (its process restarted after a kill in the middle
/// of a write) removes the unfinished object its predecessor left.
#[test]
fn a_new_writer_removes_its_predecessors_unfinished_write() {
    let dir = tempfile::tempdir().unwrap();
    let target = StoreTarget::Dir(dir.path().into());
    let node_dir = dir.path().join("run1/node3");
    std::fs::create_dir_all(&node_dir).unwrap();
    let tmp = node_dir.join(".00000000000000000009.evbo.tmp");
    std::fs::write(&tmp, b"half an object").unwrap();
    let writer = StoreWriter::open(&target, 1, 3).unwrap();
    assert!(!tmp.exists());
    writer.close().unwrap();
    let report = read_store(&target, &ReadOptions::default()).unwrap();
    assert!(report.bad.is_empty(), "{report:?}");
}

#[test]
fn zero_queue_depth_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = WriterOptions {
        queue_depth: 0,
        ..WriterOptions::default()
    };
    let err = StoreWriter::open_with(&StoreTarget::Dir(dir.path().into()), 1, 0, options)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("queue_depth"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, timeout: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn encode_decode_round_trip(
        run in any::<u32>(),
        node in any::<u16>(),
        mep in any::<u64>(),
        sizes in prop::collection::vec(prop::collection::vec(0u32..300, 0..20), 1..6),
    ) {
        // Every source has the same number of events.
        let events = sizes.iter().map(Vec::len).min().unwrap();
        let fragments: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(s, sz)| fragment(s as u32, &sz[..events]))
            .collect();
        let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
        let object = format::encode(run, node, mep, events as u32, &refs).unwrap();
        let stored = format::decode(&object).unwrap();
        prop_assert_eq!(stored.header.run_id, run);
        prop_assert_eq!(stored.header.node, node);
        prop_assert_eq!(stored.header.mep, mep);
        prop_assert_eq!(stored.header.event_count as usize, events);
        prop_assert_eq!(stored.header.source_count as usize, fragments.len());
        for e in 0..events {
            let mut whole = Vec::new();
            for (s, sz) in sizes.iter().enumerate() {
                let start: usize = sz[..e].iter().map(|&x| x as usize).sum();
                let piece = &fragments[s][events * 4 + start..][..sz[e] as usize];
                prop_assert_eq!(stored.fragment(e as u32, s as u32), piece);
                whole.extend_from_slice(piece);
            }
            prop_assert_eq!(stored.event(e as u32), whole.as_slice());
        }
    }

    #[test]
    fn a_selection_holds_exactly_the_selected_events(
        sizes in prop::collection::vec(prop::collection::vec(0u32..300, 0..20), 1..6),
        keep in prop::collection::vec(any::<bool>(), 20),
    ) {
        let events = sizes.iter().map(Vec::len).min().unwrap();
        let fragments: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(s, sz)| fragment(s as u32, &sz[..events]))
            .collect();
        let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
        let whole = format::encode(1, 2, 3, events as u32, &refs).unwrap();
        let whole = format::decode(&whole).unwrap();
        let selected: Vec<u32> = (0..events as u32).filter(|&e| keep[e as usize]).collect();
        let sources: Vec<u32> = (0..refs.len() as u32).collect();
        let parts = format::BatchParts {
            run_id: 1,
            node: 2,
            mep: 3,
            mep_events: events as u32,
            run_sources: refs.len() as u32,
            sources: &sources,
            fragments: &refs,
        };
        let mut object = Vec::new();
        format::layout_selected(&mut object, &parts, Some(&selected)).unwrap();
        format::seal(&mut object);
        let stored = format::decode(&object).unwrap();
        prop_assert_eq!(stored.header.event_count as usize, selected.len());
        prop_assert_eq!(stored.mep_events() as usize, events);
        for (i, &e) in selected.iter().enumerate() {
            prop_assert_eq!(stored.event_number(i as u32), e);
            prop_assert_eq!(stored.event(i as u32), whole.event(e));
        }
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = format::decode(&bytes);
    }

    #[test]
    fn any_single_corruption_is_caught(flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let fragments = [fragment(0, &[5, 0, 9]), fragment(1, &[1, 2, 3])];
        let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
        let mut object = format::encode(1, 0, 9, 3, &refs).unwrap();
        let at = flip.index(object.len());
        object[at] ^= 1 << bit;
        prop_assert!(format::decode(&object).is_err(), "flip of bit {} at {} not caught", bit, at);
    }
}
