//! Arbitrary text as `ibnetdiscover` output: a topology or an error naming
//! the line, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = evb_fabric::io::parse_ibnetdiscover_str(std::path::Path::new("fuzz.topo"), text);
    }
});
