//! FETCH streams: first byte picks the group order (bit 0) and whether a FETCH_HEADER leads (bit 1).
//! The body is `moqt::fuzz::fuzz_fetch_stream`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_fetch_stream(data);
});
