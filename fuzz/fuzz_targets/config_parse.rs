//! Arbitrary text as a configuration file: an error or a valid config,
//! never a panic.
#![no_main]

use evb_core::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        // A file named in the config is read (bounded); device files such
        // as /dev/stdin could block the fuzzer itself.
        if ["/dev", "/proc", "/sys"].iter().any(|d| text.contains(d)) {
            return;
        }
        let _ = Config::from_str_with_overrides("fuzz.toml", text, &[], std::path::Path::new("/nonexistent"));
    }
});
