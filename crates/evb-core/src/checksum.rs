//! CRC-32C (Castagnoli), the checksum of every MEP fragment and batch.
//!
//! Computed with `crc-fast`, which picks the widest carry-less multiply the
//! CPU has at run time (AVX-512 VPCLMULQDQ where present). It is the
//! hottest loop of an event builder (the RU checksums every fragment it
//! produces, the BU every fragment it receives): `cargo bench -p evb-core
//! --bench checksum` prints it against the SSE4.2 `crc32c` crate.

use crc_fast::{CrcAlgorithm, Digest};

/// CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC-32C of the bytes that gave `crc`, followed by `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if data.is_empty() {
        return crc;
    }
    // The register holds the complement of a finished CRC.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_crc32c() {
        // The check value of CRC-32C ("123456789"), and the SSE4.2 crate
        // on buffers of many lengths and alignments.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        let data: Vec<u8> = (0..70_000u32)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in [0, 1, 7, 8, 63, 64, 65, 255, 4096, 65_537, 70_000] {
            for start in [0, 1, 3] {
                let d = &data[start..len.max(start)];
                assert_eq!(crc32c(d), ::crc32c::crc32c(d), "len {len} start {start}");
            }
        }
    }

    #[test]
    fn append_continues_a_crc() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let whole = crc32c(&data);
        for cut in [0, 1, 100, 32_768, 99_999, 100_000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(crc32c_append(crc32c(a), b), whole, "cut at {cut}");
            assert_eq!(
                crc32c_append(crc32c(a), b),
                ::crc32c::crc32c_append(crc32c(a), b)
            );
        }
        let mut crc = 0;
        for chunk in data.chunks(4099) {
            crc = crc32c_append(crc, chunk);
        }
        assert_eq!(crc, whole);
    }
}
