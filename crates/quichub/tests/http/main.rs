//! End-to-end tests of the HTTP pub/sub API: HTTP/1.1 and HTTP/2 (curl),
//! HTTP/3 (aioquic), token authentication, and the Origin and Host checks.

mod e2e_http;
mod e2e_http3;
mod e2e_http_auth;
mod e2e_http_origin;
