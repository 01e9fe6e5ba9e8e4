//! MEP buffers: the memory an RU's fragments live in, as the transports
//! see it.
//!
//! A [`MepBuf`] is either a heap allocation of its own (fresh data on
//! demand, a batch delivered to a consumer) or one slot of a [`SlotStore`]:
//! a fixed set of equal slots in one mapping, allocated at start, that go
//! back to their store when the last handle on them is dropped. A store is
//! what the RU's readout ring lives in (`source.readout = "ring"`), and
//! what a fixed pool is (`event_builder.preallocate_buffers`). Mapped from
//! a memfd, it is shared memory that the `shm` transport's peers map too:
//! a BU then builds in place from the RU's slots
//! (`transport.shm_zero_copy`, see [`crate::shm`]).
//!
//! Handles are reference counted (`Rc<MepBuf>`): the RU's map of MEPs, a
//! transport's send queue and a local batch may hold one each; the slot is
//! free again once all of them are gone, so a slot is never written while
//! anyone can still read it.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;

use anyhow::{bail, Result};

/// Bytes of a huge page: a store's slots start at multiples of it.
const HUGE_PAGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// An RU's fragment data (or any payload a transport sends).
pub struct MepBuf {
    mem: Mem,
    /// Bytes in use (the payload), at most the slot's size.
    len: usize,
}

enum Mem {
    Vec(Vec<u8>),
    Slot { store: Rc<Store>, index: u32 },
}

impl MepBuf {
    /// A buffer of its own holding `v`.
    pub fn from_vec(v: Vec<u8>) -> MepBuf {
        MepBuf {
            len: v.len(),
            mem: Mem::Vec(v),
        }
    }

    /// The allocation of a heap buffer (to pool it again); `None` for a
    /// store's slot, which goes back to its store when dropped.
    pub fn into_vec(mut self) -> Option<Vec<u8>> {
        match &mut self.mem {
            Mem::Vec(v) => Some(std::mem::take(v)),
            Mem::Slot { .. } => None,
        }
    }

    /// Sets the bytes in use: a heap buffer grows (zero-filled) or shrinks;
    /// a slot's length stays within the slot.
    pub fn set_len(&mut self, len: usize) {
        match &mut self.mem {
            Mem::Vec(v) => v.resize(len, 0),
            Mem::Slot { store, .. } => assert!(
                len <= store.slot_bytes,
                "{len} bytes in a slot of {}",
                store.slot_bytes
            ),
        }
        self.len = len;
    }

    /// The store and slot this buffer is, if it is one.
    pub fn slot(&self) -> Option<(&Store, u32)> {
        match &self.mem {
            Mem::Slot { store, index } => Some((store, *index)),
            Mem::Vec(_) => None,
        }
    }
}

impl Deref for MepBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.mem {
            Mem::Vec(v) => &v[..self.len],
            // SAFETY: the slot is `slot_bytes` long inside the store's
            // mapping, which the Rc keeps mapped; len <= slot_bytes
            // (set_len); this handle owns the slot until it is dropped.
            Mem::Slot { store, index } => unsafe {
                std::slice::from_raw_parts(store.slot_ptr(*index), self.len)
            },
        }
    }
}

impl DerefMut for MepBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Mem::Vec(v) => &mut v[..self.len],
            // SAFETY: as in deref; `&mut self` is the only handle, and the
            // store hands a slot to one buffer at a time (take/release).
            Mem::Slot { store, index } => unsafe {
                std::slice::from_raw_parts_mut(store.slot_ptr(*index), self.len)
            },
        }
    }
}

impl AsRef<[u8]> for MepBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for MepBuf {
    fn drop(&mut self) {
        if let Mem::Slot { store, index } = &self.mem {
            store.release(*index);
        }
    }
}

/// A fixed set of equal slots in one mapping (see the module doc).
#[derive(Clone)]
pub struct SlotStore(Rc<Store>);

pub struct Store {
    base: *mut u8,
    map_len: usize,
    /// Where slot 0 starts in the mapping (after the control area).
    data_offset: usize,
    slot_bytes: usize,
    /// Bytes of each slot's place in the mapping (slot_bytes rounded up).
    stride: usize,
    slots: u32,
    /// Free slots, the most recently freed last (taken first: its memory
    /// is the likeliest to be in cache).
    free: RefCell<Vec<u32>>,
    /// The memfd of a shared store (peers map it).
    fd: Option<OwnedFd>,
    control_bytes: usize,
}

impl SlotStore {
    /// `slots` slots of `slot_bytes` in private memory (huge pages if
    /// `huge_pages`: each slot starts on a 2 MiB boundary).
    pub fn private(slots: u32, slot_bytes: usize, huge_pages: bool) -> Result<SlotStore> {
        Self::map(slots, slot_bytes, huge_pages, None)
    }

    /// `slots` slots of `slot_bytes` in a memfd that other processes of
    /// this host can map, after a control area of `control_bytes` (the
    /// transport's, for the readers' release marks).
    pub fn shared(slots: u32, slot_bytes: usize, control_bytes: usize) -> Result<SlotStore> {
        Self::map(slots, slot_bytes, false, Some(control_bytes))
    }

    fn map(
        slots: u32,
        slot_bytes: usize,
        huge_pages: bool,
        shared: Option<usize>,
    ) -> Result<SlotStore> {
        if slots == 0 || slot_bytes == 0 {
            bail!("a slot store needs slots ({slots}) of some size ({slot_bytes} bytes)");
        }
        let align = if huge_pages { HUGE_PAGE } else { PAGE };
        let stride = slot_bytes.next_multiple_of(align);
        let control_bytes = shared.unwrap_or(0);
        let data_offset = control_bytes.next_multiple_of(align);
        let Some(map_len) = (slots as usize)
            .checked_mul(stride)
            .and_then(|d| d.checked_add(data_offset))
        else {
            bail!("{slots} slots of {slot_bytes} bytes do not fit the address space");
        };
        let fd = match shared {
            Some(_) => {
                let name = c"evb-mep-slots";
                // SAFETY: a plain system call; a non-negative result is a
                // new fd that we own.
                let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
                if raw < 0 {
                    bail!("memfd_create: {}", std::io::Error::last_os_error());
                }
                // SAFETY: raw is a valid fd nobody else owns.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                // SAFETY: ftruncate on our own memfd.
                if unsafe { libc::ftruncate(fd.as_raw_fd(), map_len as libc::off_t) } != 0 {
                    bail!(
                        "sizing the shared MEP buffers to {map_len} bytes: {}",
                        std::io::Error::last_os_error()
                    );
                }
                Some(fd)
            }
            None => None,
        };
        // Private: over-map by one alignment unit to start on a boundary.
        let reserve = if fd.is_some() {
            map_len
        } else {
            map_len + align
        };
        // SAFETY: a new mapping of our own (anonymous, or of our memfd at
        // offset 0 for its whole size); checked for failure below.
        let raw = unsafe {
            match &fd {
                Some(fd) => libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                ),
                None => libc::mmap(
                    std::ptr::null_mut(),
                    reserve,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                ),
            }
        };
        if raw == libc::MAP_FAILED {
            bail!(
                "mapping {slots} MEP buffers of {slot_bytes} bytes: {}",
                std::io::Error::last_os_error()
            );
        }
        let raw = raw as *mut u8;
        let (base, map_len) = if fd.is_some() {
            (raw, map_len)
        } else {
            // Trim the mapping to an aligned start and `map_len` bytes.
            let lead = (raw as usize).next_multiple_of(align) - raw as usize;
            // SAFETY: both pieces lie inside the mapping just made.
            unsafe {
                if lead > 0 {
                    libc::munmap(raw as *mut libc::c_void, lead);
                }
                let tail = reserve - lead - map_len;
                if tail > 0 {
                    libc::munmap(raw.add(lead + map_len) as *mut libc::c_void, tail);
                }
            }
            // SAFETY: lead < align <= reserve - map_len.
            (unsafe { raw.add(lead) }, map_len)
        };
        if huge_pages {
            // SAFETY: advice on our own mapping; failure is harmless.
            unsafe {
                libc::madvise(base as *mut libc::c_void, map_len, libc::MADV_HUGEPAGE);
            }
        }
        Ok(SlotStore(Rc::new(Store {
            base,
            map_len,
            data_offset,
            slot_bytes,
            stride,
            slots,
            // Taken from the end: slot 0 first.
            free: RefCell::new((0..slots).rev().collect()),
            fd,
            control_bytes,
        })))
    }

    /// A free slot, `len` bytes in use; `None` when every slot is held.
    pub fn take(&self, len: usize) -> Option<MepBuf> {
        let index = self.0.free.borrow_mut().pop()?;
        let mut b = MepBuf {
            mem: Mem::Slot {
                store: self.0.clone(),
                index,
            },
            len: 0,
        };
        b.set_len(len);
        Some(b)
    }

    /// Writes every page of every slot now, so that the memory is
    /// resident from the start (`event_builder.preallocate_buffers`).
    pub fn touch_all(&self) {
        let s = &self.0;
        assert_eq!(
            s.free_slots(),
            s.slots as usize,
            "slots are touched before any is taken"
        );
        for i in 0..s.slots {
            let p = s.slot_ptr(i);
            for at in (0..s.slot_bytes).step_by(PAGE) {
                // SAFETY: at < slot_bytes, inside slot i; volatile so the
                // write of a known zero is not left out. No handle holds a
                // slot yet (called before any take).
                unsafe { std::ptr::write_volatile(p.add(at), 0) };
            }
        }
    }

    pub fn store(&self) -> &Store {
        &self.0
    }
}

impl Store {
    fn slot_ptr(&self, index: u32) -> *mut u8 {
        assert!(index < self.slots);
        // SAFETY: index < slots, so the slot lies inside the mapping.
        unsafe {
            self.base
                .add(self.data_offset + index as usize * self.stride)
        }
    }

    fn release(&self, index: u32) {
        let mut free = self.free.borrow_mut();
        debug_assert!(!free.contains(&index), "slot {index} released twice");
        free.push(index);
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Slots not held by anyone.
    pub fn free_slots(&self) -> usize {
        self.free.borrow().len()
    }

    /// Bytes of the whole mapping (control area and slots).
    pub fn map_len(&self) -> usize {
        self.map_len
    }

    /// Where slot `index` starts, from the start of the mapping.
    pub fn slot_offset(&self, index: u32) -> usize {
        self.data_offset + index as usize * self.stride
    }

    /// Where in the mapping slot `index` lies and how long it may be:
    /// what a peer that maps the store checks a record against.
    pub fn stride(&self) -> usize {
        self.stride
    }

    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// A shared store's memfd (for peers to map), `None` for a private one.
    pub fn fd(&self) -> Option<i32> {
        self.fd.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The control area of a shared store: `control_bytes` at the start
    /// of the mapping, zeroed at creation (a fresh memfd).
    pub fn control(&self) -> (*mut u8, usize) {
        (self.base, self.control_bytes)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: base/map_len are the mapping made in SlotStore::map; no
        // MepBuf outlives the store (each holds an Rc on it).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.map_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_back_when_the_last_handle_goes() {
        let store = SlotStore::private(3, 10_000, false).unwrap();
        let a = Rc::new(store.take(100).unwrap());
        let mut b = store.take(5000).unwrap();
        b[4999] = 7;
        assert_eq!(b.len(), 5000);
        let c = store.take(1).unwrap();
        assert!(store.take(1).is_none(), "three slots");
        drop(c);
        assert_eq!(store.store().free_slots(), 1);
        // A slot shared by two holders is free once both dropped it.
        let a2 = a.clone();
        drop(a);
        assert_eq!(store.store().free_slots(), 1);
        drop(a2);
        assert_eq!(store.store().free_slots(), 2);
        // The most recently freed is taken first, its bytes as they were.
        drop(b);
        let b = store.take(5000).unwrap();
        assert_eq!(b[4999], 7);
        assert!(b.slot().is_some());
        assert!(b.into_vec().is_none());
        let v = MepBuf::from_vec(vec![1, 2, 3]);
        assert_eq!(&v[..], &[1, 2, 3]);
        assert_eq!(v.into_vec(), Some(vec![1, 2, 3]));
    }

    #[test]
    fn huge_page_slots_are_aligned_and_shared_ones_have_a_memfd() {
        let store = SlotStore::private(2, 3 << 20, true).unwrap();
        let a = store.take(16).unwrap();
        let b = store.take(16).unwrap();
        assert_eq!(a.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        assert!(store.store().fd().is_none());
        let shared = SlotStore::shared(2, 5000, 100).unwrap();
        shared.touch_all();
        assert!(shared.store().fd().is_some());
        let (ctl, len) = shared.store().control();
        assert_eq!(len, 100);
        // SAFETY: reading the first byte of the control area.
        assert_eq!(unsafe { *ctl }, 0);
        let s = shared.take(5000).unwrap();
        assert_eq!(
            s.as_ptr() as usize - ctl as usize,
            shared.store().slot_offset(0)
        );
    }

    #[test]
    #[should_panic(expected = "bytes in a slot of")]
    fn a_slot_never_grows_past_its_size() {
        let store = SlotStore::private(1, 100, false).unwrap();
        let _ = store.take(101);
    }
}
