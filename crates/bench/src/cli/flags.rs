//! Options and output rules that several benchmarks share.

/// Where a command's human-readable report goes: stdout, or stderr when
/// stdout carries its JSON (`--json`), which must then be alone there.
pub(super) fn human_out(json_on_stdout: bool) -> Box<dyn std::io::Write> {
    if json_on_stdout {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    }
}

/// `--draft`: the MoQT draft to speak to the relay. 18 is native; 14 and 16
/// go through the translating bridge (`quichub_net::legacy`).
pub(super) fn parse_draft(s: &str) -> Result<Draft, String> {
    match s.trim_start_matches("draft-") {
        "18" => Ok(Draft(None)),
        "16" => Ok(Draft(Some(moqt::legacy::Draft::D16))),
        "14" => Ok(Draft(Some(moqt::legacy::Draft::D14))),
        other => Err(format!("draft {other} is not served (14, 16 or 18)")),
    }
}

/// A parsed `--draft` (`None`: draft 18). A newtype because clap takes an
/// `Option` field for an optional flag.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Draft(pub Option<moqt::legacy::Draft>);
