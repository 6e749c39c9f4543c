//! The options every experiment takes from the command line.

use std::path::PathBuf;

/// How long, how often and where: what every experiment takes
/// (`--quick`, `--reps`, `--out`, `--cc`, before or after its name).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// CI mode: short runs (the whole experiment in under 2 minutes).
    #[arg(long, global = true)]
    pub quick: bool,
    /// Repetitions of every mode on every link (figures are median, min–max).
    #[arg(long, default_value_t = 3, global = true)]
    pub reps: u32,
    /// Results root: the run is written to OUT/EXPERIMENT/TIMESTAMP/.
    #[arg(long, default_value = "results", global = true)]
    pub out: PathBuf,
    /// QUIC congestion controller of `lab mar` (both ends): cubic, newreno
    /// or bbr (default: the relay's, cubic); `lab uplink` compares all three
    /// unless this is given. Other experiments use the default.
    #[arg(long, global = true)]
    pub cc: Option<quichub_net::CongestionControl>,
}
