//! End-to-end tests of the `quichub` binary's commands as processes: the
//! interop client, GOAWAY on SIGTERM, configuration, and `pub` across a slow
//! emulated uplink.

mod e2e_process;
mod e2e_slow_uplink;
