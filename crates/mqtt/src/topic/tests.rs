//! Topic tests.
