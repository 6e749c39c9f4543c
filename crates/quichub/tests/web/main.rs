//! End-to-end tests of the web pages in headless Chromium; `media` is the
//! small hang publisher they play.

mod e2e_web;
mod media;
