//! hang catalogs and legacy frames: parse, re-serialise, parse again.
//! The body is `quichub_media::fuzz::fuzz_catalog`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quichub_media::fuzz::fuzz_catalog(data);
});
