//! Control messages: `Message::decode` over a sequence of frames, round-tripping each.
//! The body is `moqt::fuzz::fuzz_message`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_message(data);
});
