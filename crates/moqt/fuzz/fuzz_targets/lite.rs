//! moq-lite 01…06 (the first byte picks the version): `moqt::fuzz::fuzz_lite`,
//! which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_lite(data);
});
