//! End-to-end tests of the MoQT relay, in process on loopback: objects,
//! fan-out, FETCH, hardening against hostile and malformed peers, MoQT over
//! WebSocket. One test binary of many modules, as the other areas have (each
//! binary links the whole workspace).

mod e2e_fanout;
mod e2e_hardening;
mod e2e_malformed;
mod e2e_negotiation;
mod e2e_relay;
mod e2e_websocket;
