//! OBJECT_DATAGRAM: `ObjectDatagram::decode`.
//! The body is `moqt::fuzz::fuzz_datagram`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    moqt::fuzz::fuzz_datagram(data);
});
