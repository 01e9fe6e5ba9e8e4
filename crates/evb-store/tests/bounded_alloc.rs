//! A header whose counts claim far more than the object holds must be
//! rejected without allocating what it claims. Checked with a counting
//! allocator (its own test binary: the allocator is global).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use evb_store::format::{self, HEADER_LEN};
use evb_store::{read_store, ReadOptions, StoreTarget};

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A header-only object claiming `events` x `sources` and `payload` bytes,
/// with a valid header CRC (so only the lengths can give it away).
fn lying_header(events: u32, sources: u32, payload: u64) -> Vec<u8> {
    let f: Vec<u8> = Vec::new();
    let mut object = format::encode(1, 0, 0, 0, &[&f]).unwrap();
    object[24..28].copy_from_slice(&events.to_le_bytes());
    object[28..32].copy_from_slice(&sources.to_le_bytes());
    object[32..40].copy_from_slice(&payload.to_le_bytes());
    let crc = crc32c::crc32c(&object[..44]);
    object[44..48].copy_from_slice(&crc.to_le_bytes());
    // The header, the source table of one source and the event-number
    // table of no events (layout version 3).
    assert_eq!(object.len(), HEADER_LEN + 8 + 4);
    object
}

#[test]
fn lengths_beyond_the_object_are_rejected_without_allocating_them() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (u32::MAX, u32::MAX, u64::MAX, "index"),
        (1 << 20, 4, 0, "index"),
        (0, 1, 1 << 40, "payload"),
    ];
    for (i, (events, sources, payload, part)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("lie{i}.evbo"));
        std::fs::write(&path, lying_header(events, sources, payload)).unwrap();
        LARGEST.store(0, Ordering::Relaxed);
        let report = read_store(&StoreTarget::Dir(path), &ReadOptions::default()).unwrap();
        let largest = LARGEST.load(Ordering::Relaxed);
        assert_eq!(report.bad.len(), 1, "{report:?}");
        let reason = &report.bad[0].reason;
        assert!(
            reason.starts_with("truncated") && reason.contains(part)
                || reason.contains("overflows"),
            "case {i}: {reason}"
        );
        assert!(largest < 64 << 10, "case {i}: allocated {largest} bytes");
    }
}
