//! fMP4 demuxing (`Fmp4Demuxer`) of arbitrary bytes fed in pieces.
//! The body is `quichub_media::fuzz::fuzz_fmp4`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quichub_media::fuzz::fuzz_fmp4(data);
});
