//! Arbitrary bytes into the frame decoder: whole, and as a stream cut into
//! pieces. It must never panic and never accept a body above the bound.
#![no_main]

use evb_core::wire::{decode_stream, Message, FRAME_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

const MAX_BODY: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    // One decode of the whole input.
    let _ = decode_stream(data, MAX_BODY);
    // As a stream: decode message after message until an error or the end.
    let mut at = 0;
    while at < data.len() {
        match decode_stream(&data[at..], MAX_BODY) {
            Ok(Some((msg, used))) => {
                assert!(used >= FRAME_HEADER_LEN && used as u64 <= FRAME_HEADER_LEN as u64 + MAX_BODY);
                // What decodes re-encodes to the same bytes (fragment: header only).
                let mut again = Vec::new();
                msg.encode_into(&mut again);
                let header_len = match msg {
                    Message::Fragment(_) => again.len(),
                    _ => used,
                };
                assert_eq!(&again[..], &data[at..at + header_len.min(again.len())][..again.len()]);
                at += used;
            }
            Ok(None) | Err(_) => break,
        }
    }
});
