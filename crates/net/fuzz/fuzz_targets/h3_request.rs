//! HTTP/3 request streams: frames, limits and request heads (static-table
//! QPACK). The body is `quichub_net::h3::codec::fuzz_request_stream`, which
//! the crate's proptests also run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    quichub_net::h3::codec::fuzz_request_stream(data);
});
