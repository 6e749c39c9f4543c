//! The documentation's command lines, as a user would paste them: every
//! `PROGRAM …` line in the ```` ```sh ```` blocks of the README, of every
//! page under docs/ (subfolders included), of the crates' own pages and of
//! contrib/, for a test that parses each with the program's real argument
//! parser, so that a renamed flag cannot leave the documentation behind.
//!
//! Written by hand rather than with a shell-parsing crate: the docs use a
//! small subset of sh (quotes, comments, continuation lines, `|`, `;`, `&`,
//! redirections), and what counts as a command here (one given as an
//! argument, `--server '…'`, or after `--`) is particular to these pages.

use std::path::{Path, PathBuf};

/// Placeholders the docs use, with a value of the right shape.
const PLACEHOLDERS: &[(&str, &str)] = &[
    ("$(pidof quichub)", "1"),
    ("$P", "1"),
    ("PID", "1"),
    ("PROFILE", "profiles/scenario1-audio.ini"),
    ("URL", "moqt://127.0.0.1:4443/"),
];

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every page searched for commands, in a stable order: README.md, every
/// `.md` under docs/ (recursively), each crate's top-level `.md` files and
/// contrib's.
pub fn pages() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = vec![root.join("README.md")];
    markdown_under(&root.join("docs"), true, &mut files);
    if let Ok(crates) = std::fs::read_dir(root.join("crates")) {
        let mut dirs: Vec<PathBuf> = crates.flatten().map(|e| e.path()).collect();
        dirs.sort();
        for d in dirs {
            markdown_under(&d, false, &mut files);
        }
    }
    markdown_under(&root.join("contrib"), false, &mut files);
    files
}

fn markdown_under(dir: &Path, recurse: bool, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if recurse {
                markdown_under(&p, true, out);
            }
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// Every invocation of `program` (a binary name: `quichub`,
/// `quichub-bench`, `quichub-lab`) documented in [`pages`], with the page
/// it is on. `cargo run` and `target/…/PROGRAM` forms count as the program.
pub fn documented_commands(program: &str) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    for page in pages() {
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        for cmd in commands(&text, program) {
            out.push((page.clone(), cmd));
        }
    }
    out
}

/// Every `program` invocation in the ```` ```sh ```` blocks of `text`:
/// continuation lines joined, comments, redirections and pipelines cut
/// off, commands given as an argument (`--server '…'`, `-- PROGRAM …`)
/// included.
pub fn commands(text: &str, program: &str) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    let mut in_sh = false;
    let mut acc = String::new();
    for l in text.lines() {
        if l.trim_start().starts_with("```") {
            in_sh = !in_sh && l.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        if let Some(body) = l.trim_end().strip_suffix('\\') {
            acc.push_str(body);
            acc.push(' ');
            continue;
        }
        acc.push_str(l);
        lines.push(std::mem::take(&mut acc));
    }
    let aliases = aliases(program);
    let nested = format!("{program} ");
    let mut out = Vec::new();
    for line in lines {
        let mut line = line;
        for a in &aliases {
            line = line.replace(a.as_str(), &nested);
        }
        for (k, v) in PLACEHOLDERS {
            line = line.replace(k, v);
        }
        for part in line.split([';', '|', '&']) {
            let part = part.split(['<', '>']).next().unwrap_or("").trim();
            let w = words(part);
            // `--server 'quichub relay …'` and `-- quichub …` are commands
            // too, whatever program they are given to.
            for (i, x) in w.iter().enumerate() {
                if x.starts_with(&nested) && i > 0 {
                    out.push(words(x));
                }
                if x == "--" && w.get(i + 1).map(String::as_str) == Some(program) {
                    out.push(w[i + 1..].to_vec());
                }
            }
            if w.first().map(String::as_str) == Some(program) {
                out.push(w);
            }
        }
    }
    out
}

/// The other ways the docs start `program`, each followed by a space.
fn aliases(program: &str) -> Vec<String> {
    let mut a = vec![
        format!("cargo run --release -p {program} -- "),
        format!("cargo run -p {program} --release -- "),
        format!("cargo run -p {program} -- "),
        format!("./target/release/{program} "),
        format!("./target/debug/{program} "),
        format!("target/release/{program} "),
        format!("target/debug/{program} "),
    ];
    // The product is the workspace's default member.
    if program == "quichub" {
        a.push("cargo run --release -- ".into());
        a.push("cargo run -- ".into());
    }
    a
}

/// Splits a shell line into words (single and double quotes, no escapes
/// beyond what the docs use).
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            // A comment runs to the end of the line.
            (None, '#') if !any => break,
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (_, c) => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitting() {
        assert_eq!(
            commands(
                "```sh\nquichub a 'b c' # note\nquichub x \\\n  y | jq .\n```\nquichub no\n",
                "quichub"
            ),
            vec![vec!["quichub", "a", "b c"], vec!["quichub", "x", "y"]]
        );
    }

    #[test]
    fn other_programs_are_not_this_one() {
        let text = "```sh\nquichub-bench run PROFILE\nquichub relay\n```\n";
        assert_eq!(commands(text, "quichub"), vec![vec!["quichub", "relay"]]);
        assert_eq!(
            commands(text, "quichub-bench"),
            vec![vec!["quichub-bench", "run", "profiles/scenario1-audio.ini"]]
        );
    }

    #[test]
    fn commands_inside_commands() {
        let text = "```sh\nquichub-lab netem run --server 'quichub relay --bind 10.201.0.2:4443' -- \\\n    quichub sub moqt://10.201.0.2:4443/ --stats\n```\n";
        assert_eq!(
            commands(text, "quichub"),
            vec![
                vec!["quichub", "relay", "--bind", "10.201.0.2:4443"],
                vec!["quichub", "sub", "moqt://10.201.0.2:4443/", "--stats"],
            ]
        );
        assert_eq!(commands(text, "quichub-lab").len(), 1);
    }

    #[test]
    fn cargo_run_and_built_binaries_count() {
        let text = "```sh\ncargo run --release -- demo\ncargo run --release -p quichub-bench -- fanout --help\ntarget/release/quichub-bench mqtt\n```\n";
        assert_eq!(commands(text, "quichub"), vec![vec!["quichub", "demo"]]);
        assert_eq!(
            commands(text, "quichub-bench"),
            vec![
                vec!["quichub-bench", "fanout", "--help"],
                vec!["quichub-bench", "mqtt"]
            ]
        );
    }

    /// The walk reaches the README, docs/ subfolders and the crates' pages.
    #[test]
    fn every_page_is_searched() {
        let root = workspace_root();
        let pages = pages();
        for p in [
            "README.md",
            "docs/README.md",
            "docs/lab/README.md",
            "crates/moqt/INTEROP.md",
        ] {
            assert!(pages.contains(&root.join(p)), "{p} not searched");
        }
    }
}
