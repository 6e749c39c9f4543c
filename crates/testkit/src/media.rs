//! Helpers for the tests that run Debian's ffmpeg and ffprobe on media the
//! tests make and on what quichub writes.

use std::path::Path;
use std::process::{Command, Output, Stdio};

pub fn run(prog: &str, args: &[&str]) -> Output {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {prog}: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// (codec, frames decoded) per stream.
pub fn count_frames(path: &Path) -> Vec<(String, usize)> {
    let out = run(
        "ffprobe",
        &[
            "-loglevel",
            "error",
            "-count_frames",
            "-show_entries",
            "stream=codec_name,nb_read_frames",
            "-of",
            "csv=p=0",
            path.to_str().unwrap(),
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (c, n) = l.split_once(',')?;
            Some((c.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// The md5 of every decoded picture, in presentation order.
pub fn picture_md5s(path: &Path) -> Vec<String> {
    let out = run(
        "ffmpeg",
        &[
            "-loglevel",
            "error",
            "-i",
            path.to_str().unwrap(),
            "-map",
            "0:v",
            "-f",
            "framemd5",
            "-",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit(',').next().map(|s| s.trim().to_string()))
        .collect()
}
