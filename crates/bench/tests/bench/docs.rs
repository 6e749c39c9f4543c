//! Every `quichub-bench …` line the documentation shows (README, docs/,
//! the crates' pages, contrib/) parses with the binary's own arguments, so
//! that a renamed command or flag cannot leave the pages behind.

use clap::Parser;
use quichub_bench::Cli;
use quichub_testkit::docs;

#[test]
fn every_documented_command_parses() {
    let commands = docs::documented_commands("quichub-bench");
    let mut bad = Vec::new();
    for (page, cmd) in &commands {
        if let Err(e) = Cli::try_parse_from(cmd) {
            // --help and --version "fail" by printing.
            if !matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) {
                bad.push(format!("{}: {}\n{e}", page.display(), cmd.join(" ")));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
    // The search still reaches the pages that show the benchmarks.
    let root = docs::workspace_root();
    let on = |page: &str| {
        let page = root.join(page);
        commands
            .iter()
            .filter(|(p, _)| p.starts_with(&page))
            .count()
    };
    assert!(
        on("docs/benchmarks.md") >= 5,
        "only {} in docs/benchmarks.md",
        on("docs/benchmarks.md")
    );
    assert!(
        on("crates/bench/README.md") >= 3,
        "only {} in crates/bench/README.md",
        on("crates/bench/README.md")
    );
    assert!(
        commands.len() > 10,
        "found only {} commands",
        commands.len()
    );
}
