//! Buffer pools: spare heap buffers kept for reuse and trimmed when a
//! burst is over, or a fixed pool allocated and touched at start
//! (`event_builder.preallocate_buffers`).

use std::time::Duration;

/// How often spare buffers unused since the last look are freed.
pub(super) const POOL_TRIM: Duration = Duration::from_secs(10);

/// Spare buffers, with the fewest spares there were since the last trim:
/// those were never needed, so [`SparePool::trim`] frees them.
///
/// Or, preallocated (`event_builder.preallocate_buffers`, [`SparePool::fixed`]):
/// a fixed set of buffers of one size, allocated and touched at start,
/// never trimmed; it keeps no more buffers than it was made with.
#[derive(Default)]
pub(super) struct SparePool {
    pub(super) spares: Vec<Vec<u8>>,
    pub(super) low_water: usize,
    pub(super) fixed: Option<Fixed>,
}

/// A preallocated pool's bound, and what went past it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Fixed {
    pub(super) buffers: usize,
    pub(super) len: usize,
    /// Times a buffer was wanted and none was free.
    pub(super) short: u64,
}

impl SparePool {
    /// Most spares kept, whatever the burst.
    pub(super) const MAX: usize = 256;

    /// `buffers` buffers of `len` bytes, every page written now so that
    /// the memory is resident from the start.
    pub(super) fn fixed(buffers: usize, len: usize) -> SparePool {
        let spares = (0..buffers)
            .map(|_| {
                let mut b = vec![0u8; len];
                // A large zeroed allocation is untouched mapped memory:
                // write one byte per page (volatile: the zeros are known).
                for i in (0..len).step_by(4096) {
                    // SAFETY: i < len, within the buffer.
                    unsafe { std::ptr::write_volatile(b.as_mut_ptr().add(i), 0) };
                }
                b
            })
            .collect();
        SparePool {
            spares,
            low_water: buffers,
            fixed: Some(Fixed {
                buffers,
                len,
                short: 0,
            }),
        }
    }

    pub(super) fn take(&mut self) -> Option<Vec<u8>> {
        let b = self.spares.pop();
        self.low_water = self.low_water.min(self.spares.len());
        if b.is_none() {
            self.note_short();
        }
        b
    }

    pub(super) fn give(&mut self, buf: Vec<u8>) {
        let keep = match &self.fixed {
            // Only the pool's own buffers, never more than it was made with.
            Some(f) => self.spares.len() < f.buffers && buf.capacity() >= f.len,
            None => self.spares.len() < Self::MAX,
        };
        if keep {
            self.spares.push(buf);
        }
    }

    /// A preallocated pool had no free buffer for a taker.
    pub(super) fn note_short(&mut self) {
        if let Some(f) = &mut self.fixed {
            f.short += 1;
        }
    }

    /// Frees the spares unused since the last trim; returns how many.
    /// A preallocated pool keeps its buffers.
    pub(super) fn trim(&mut self) -> usize {
        if self.fixed.is_some() {
            return 0;
        }
        let unused = self.low_water.min(self.spares.len());
        // The oldest spares go (taken last, they are the coldest).
        self.spares.drain(..unused);
        self.low_water = self.spares.len();
        unused
    }
}

#[cfg(test)]
mod tests {
    use super::SparePool;

    #[test]
    fn spares_unused_for_a_whole_period_are_freed() {
        let mut p = SparePool::default();
        // A burst leaves 10 spares.
        for _ in 0..10 {
            p.give(vec![0; 16]);
        }
        assert_eq!(p.trim(), 0, "the first look only starts the count");
        // The steady state uses at most 3 at once.
        for _ in 0..5 {
            let a: Vec<_> = (0..3).map(|_| p.take().unwrap()).collect();
            a.into_iter().for_each(|b| p.give(b));
        }
        assert_eq!(p.trim(), 7, "7 spares were never needed");
        assert_eq!(p.spares.len(), 3);
        // Nothing taken in the next period: all 3 go.
        assert_eq!(p.trim(), 3);
        assert!(p.take().is_none());
    }

    #[test]
    fn a_fixed_pool_is_resident_at_once_and_keeps_its_buffers_only() {
        const MIB: usize = 1 << 20;
        let before = crate::report::resident_bytes();
        let mut p = SparePool::fixed(8, 8 * MIB);
        let grown = crate::report::resident_bytes().saturating_sub(before);
        assert!(
            grown >= 56 * MIB as u64,
            "only {grown} bytes became resident"
        );
        let taken: Vec<_> = (0..8).map(|_| p.take().unwrap()).collect();
        assert!(p.take().is_none());
        assert_eq!(p.fixed.unwrap().short, 1, "the shortage is counted");
        taken.into_iter().for_each(|b| p.give(b));
        // One allocated past the bound is not kept...
        p.give(vec![0; 8 * MIB]);
        assert_eq!(p.spares.len(), 8);
        // ...nor a smaller one that is not the pool's.
        let one = p.take().unwrap();
        p.give(vec![0; 16]);
        assert_eq!(p.spares.len(), 7);
        p.give(one);
        assert_eq!(p.spares.len(), 8);
        // Never trimmed, however long unused.
        assert_eq!(p.trim(), 0);
        assert_eq!(p.trim(), 0);
        assert_eq!(p.spares.len(), 8);
    }
}
