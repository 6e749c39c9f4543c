//! `quichub-bench` end to end, one test binary: the draft's runs through the
//! library, the binary's commands as processes, and the documented command
//! lines. The relays they measure run in this process (quichub-testkit's
//! hub fixtures), so no other package's binary is needed.

mod docs;
mod e2e_bench;
mod e2e_cli;
