//! The relay core over real QUIC on loopback, without the hub: its
//! authorisation hooks and quichub-auth's tokens (`quichub_testkit::bare`).

mod access;
mod tokens;
