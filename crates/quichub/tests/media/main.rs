//! End-to-end tests of real media through the binary (`quichub pub`/`sub`
//! with ffmpeg's output): formats, packaging, shaping and padding.

mod e2e_media;
mod e2e_shape;
