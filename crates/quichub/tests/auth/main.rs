//! End-to-end tests of who may do what, and how much: MoQT tokens through
//! the real binary, every listener against every credential (the auth
//! matrix), and per-client rate limits.

mod e2e_auth;
mod e2e_auth_matrix;
mod e2e_rate_limits;
