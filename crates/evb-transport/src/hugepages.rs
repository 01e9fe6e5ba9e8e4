//! Large buffers on transparent huge pages (`event_builder.huge_pages`).
//!
//! MEP fragments and batch buffers are 1 MiB and up; the shared-memory
//! transport moves them with `process_vm_readv`, which pins and maps the
//! sender's pages one 4 KiB page at a time, and the producer and the CRC
//! walk them through the TLB. Where the kernel has THP in `madvise` mode
//! (Debian's default), glibc's `malloc` never gets them: its 1 MiB
//! mappings are not 2 MiB-aligned. When on, this allocator maps every
//! allocation of at least [`THRESHOLD`] bytes itself, 2 MiB-aligned, and
//! asks for huge pages; smaller ones go to the system allocator. (1 MiB
//! fragments: +6-12 % built throughput over shm, and more resident memory,
//! since a buffer of 1-2 MiB takes a whole 2 MiB page.)
//!
//! A block is freed the way it was allocated because its size and the
//! switch decide both, and the switch only goes from off to on before the
//! first large allocation (a node turns it on from its configuration,
//! before it allocates buffers; `EVB_HUGEPAGES=0|1` overrides the
//! configuration's `event_builder.huge_pages`, docs/config.md).
//!
//! The `evb` binary installs [`MaybeHuge`] as its global allocator; the
//! slot stores of [`crate::mepbuf`] ask for huge pages themselves
//! ([`crate::buffers::huge_pages`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

/// Allocations of at least this size are mapped (when on). Below 1 MiB the
/// rounding to 2 MiB costs more memory than huge pages save time; MEP
/// fragments of 1 MiB are where the gain was measured.
pub const THRESHOLD: usize = 1 << 20;
const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

static ON: AtomicBool = AtomicBool::new(false);
/// A large block was allocated: the switch may no longer change.
static LARGE_SEEN: AtomicBool = AtomicBool::new(false);

pub struct MaybeHuge;

/// Huge pages for this process's large buffers, as `configured`
/// (`event_builder.huge_pages`). Call once, before buffers are allocated
/// and while the process has one thread. Returns whether they are on.
pub fn choose(configured: bool) -> bool {
    if configured && !LARGE_SEEN.load(Ordering::SeqCst) {
        ON.store(true, Ordering::SeqCst);
    }
    ON.load(Ordering::SeqCst)
}

fn mapped(layout: &Layout) -> bool {
    layout.size() >= THRESHOLD && layout.align() <= HUGE && ON.load(Ordering::Relaxed)
}

/// A block under 2 MiB takes one huge page (at most twice its size); a
/// larger one is mapped to the next 4 KiB page, its tail past the last
/// whole huge page on ordinary pages: never more than 4 KiB wasted.
fn mapped_len(size: usize) -> usize {
    if size < HUGE {
        HUGE
    } else {
        size.div_ceil(PAGE) * PAGE
    }
}

// SAFETY: mapped blocks come from mmap (2 MiB-aligned, zero-filled,
// `mapped_len(size)` >= `size` bytes) and go back with munmap of the same length; the rest
// is the system allocator's.
unsafe impl GlobalAlloc for MaybeHuge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= THRESHOLD && !LARGE_SEEN.load(Ordering::Relaxed) {
            LARGE_SEEN.store(true, Ordering::SeqCst);
        }
        if !mapped(&layout) {
            return unsafe { System.alloc(layout) };
        }
        let len = mapped_len(layout.size());
        // Over-map by one huge page, then cut to an aligned `len`.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + HUGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return std::ptr::null_mut();
        }
        let start = raw as usize;
        let aligned = start.div_ceil(HUGE) * HUGE;
        let tail = start + len + HUGE - (aligned + len);
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: without THP the block is ordinary pages.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        aligned as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !mapped(&layout) {
            return unsafe { System.dealloc(ptr, layout) };
        }
        unsafe {
            libc::munmap(ptr.cast(), mapped_len(layout.size()));
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !mapped(&layout) {
            return unsafe { System.alloc_zeroed(layout) };
        }
        // Fresh anonymous mappings are zero-filled.
        unsafe { self.alloc(layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_lengths_round_up_to_huge_pages() {
        assert_eq!(mapped_len(THRESHOLD), HUGE);
        assert_eq!(mapped_len(HUGE - 1), HUGE);
        assert_eq!(mapped_len(HUGE), HUGE);
        assert_eq!(mapped_len(HUGE + 1), HUGE + PAGE);
        assert_eq!(mapped_len(5 * HUGE + 100), 5 * HUGE + PAGE);
    }
}
