//! What the experiments share: the results directory, tables and
//! statistics over repetitions (`stats`), SVG plots (`svg`), the studies
//! they cite (`studies`) and our figures against theirs (`differs`), small
//! runtimes and bounded setup steps (`rt`), quichub's media clients
//! (`moq_media`) and the MQTT packets of the lab's own publishers (`mqtt`).

pub mod differs;
pub mod moq_media;
pub mod mqtt;
mod options;
pub mod rt;
pub mod stats;
pub mod studies;
pub mod svg;

use std::path::{Path, PathBuf};

use anyhow::Context;
use quichub_net::CongestionControl;
use quichub_netem::profile::Profile;

pub use options::Options;

/// `OUT/EXPERIMENT/YYYYMMDDTHHMMSSZ[-N]/`, created.
pub fn result_dir(out: &Path, experiment: &str) -> anyhow::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil(secs.div_euclid(86400));
    let t = secs.rem_euclid(86400);
    let stamp = format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    );
    let base = out.join(experiment);
    for n in 0..1000 {
        let dir = if n == 0 {
            base.join(&stamp)
        } else {
            base.join(format!("{stamp}-{n}"))
        };
        if !dir.exists() {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            return Ok(dir);
        }
    }
    anyhow::bail!("too many result directories for {stamp}")
}

fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A profile's description on one line, without its name and source.
pub fn one_line(p: &Profile) -> String {
    p.describe()
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("profile ") && !l.starts_with("source:"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The kernel's name of a controller (`TCP_CONGESTION`).
pub fn kernel_name(cc: CongestionControl) -> &'static str {
    match cc {
        CongestionControl::Cubic => "cubic",
        CongestionControl::NewReno => "reno",
        CongestionControl::Bbr => "bbr",
    }
}

/// The controllers this kernel offers TCP sockets, and its default.
pub fn kernel_controllers() -> (Vec<String>, Option<String>) {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{f}")).ok();
    let available = read("tcp_available_congestion_control")
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let default = read("tcp_congestion_control").map(|s| s.trim().to_string());
    (available, default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(19_782), (2024, 2, 29));
    }
}
