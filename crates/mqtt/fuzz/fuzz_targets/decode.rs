//! MQTT packet streams: `decode` before CONNECT, as 3.1.1 and as 5.0, round-tripping each packet.
//! The body is `quichub_mqtt::fuzz::fuzz_decode`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quichub_mqtt::fuzz::fuzz_decode(data);
});
