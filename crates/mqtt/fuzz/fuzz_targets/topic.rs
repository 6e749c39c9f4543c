//! Topic filters and names: validation, `$share` parsing, `TopicTree` against brute-force matching.
//! The body is `quichub_mqtt::fuzz::fuzz_topic`, which the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quichub_mqtt::fuzz::fuzz_topic(data);
});
