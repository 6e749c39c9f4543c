//! `quichub-bench`: the benchmarks' binary. Everything is in the library
//! ([`quichub_bench::Cli`]); this file only parses the arguments.

use clap::Parser;

fn main() -> std::process::ExitCode {
    quichub_bench::Cli::parse().run()
}
