//! Arbitrary text as a configuration file: an error or a valid config,
//! never a panic.
#![no_main]

use evb_core::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Config::from_str_with_overrides("fuzz.toml", text, &[], std::path::Path::new("/nonexistent"));
    }
});
