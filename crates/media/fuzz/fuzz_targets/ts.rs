//! MPEG-TS demuxing (`TsDemuxer`) of arbitrary bytes fed in pieces.
//! The body is `quichub_media::fuzz::fuzz_ts`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quichub_media::fuzz::fuzz_ts(data);
});
