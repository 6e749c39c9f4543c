//! The media crate against Debian's ffmpeg: what ffmpeg writes demuxes to
//! what ffprobe reads, and what the muxer writes decodes again.

mod fmp4_ffmpeg;
mod ts_ffmpeg;
