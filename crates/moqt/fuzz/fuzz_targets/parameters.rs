//! Message Parameters: first byte picks the message's parameter set.
//! The body is `moqt::fuzz::fuzz_parameters`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_parameters(data);
});
