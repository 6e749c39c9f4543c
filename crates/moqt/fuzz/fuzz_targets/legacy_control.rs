//! Drafts 14 and 16 (the first byte picks): `moqt::fuzz::fuzz_legacy_control`, which the
//! crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_legacy_control(data);
});
