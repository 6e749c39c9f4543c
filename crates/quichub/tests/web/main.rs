//! End-to-end tests of the web pages in headless Chromium; `media` is the
//! small hang publisher they play; `moq_dev`, moq-dev's browser libraries
//! (`@moq/watch`, `@moq/publish`) against the relay.

mod e2e_web;
mod media;
mod moq_dev;
