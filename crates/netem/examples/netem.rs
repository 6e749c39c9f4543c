//! Stand-alone `netem` command, the same as `quichub-lab netem`:
//! `cargo run -p quichub-netem --example netem -- run --profile lte -- ping -c 3 10.201.0.2`.

use clap::Parser;

/// Command line of the example.
#[derive(Parser)]
#[command(name = "netem")]
struct Cli {
    #[command(flatten)]
    args: quichub_netem::NetemArgs,
}

fn main() {
    let cli = Cli::parse();
    match quichub_netem::main(cli.args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
