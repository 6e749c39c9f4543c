//! Subgroup streams: SUBGROUP_HEADER then objects.
//! The body is `moqt::fuzz::fuzz_subgroup_stream`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_subgroup_stream(data);
});
