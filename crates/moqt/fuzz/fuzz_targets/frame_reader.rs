//! `FrameReader`: chunked input (first byte = chunk size) must give what a one-shot decode gives.
//! The body is `moqt::fuzz::fuzz_frame_reader`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_frame_reader(data);
});
