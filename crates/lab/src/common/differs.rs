//! Our figures against a paper's: the cells that differ sharply, each with
//! what explains it, or a plain statement that it is not yet understood.
//!
//! A cell *differs* when our figure is more than [`RATIO`] times the paper's
//! or less than 1/[`RATIO`] of it, or, for percentages, more than [`POINTS`]
//! percentage points away from it.

use std::fmt::Write;

/// A ratio beyond ×2 either way differs.
pub const RATIO: f64 = 2.0;
/// A difference beyond 20 percentage points differs.
pub const POINTS: f64 = 20.0;

/// How a cell is compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Our figure over the paper's, either way, against [`RATIO`].
    Ratio,
    /// Absolute difference in percentage points, against [`POINTS`].
    Points,
}

/// One figure both the paper and we report.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Which figure: link, protocol, metric.
    pub what: String,
    /// The paper's figure.
    pub paper: f64,
    /// Ours.
    pub ours: f64,
    /// Unit ("ms", "%").
    pub unit: &'static str,
    /// Comparison rule.
    pub rule: Rule,
    /// What explains a difference, established from the run itself; `None`
    /// when it is not understood.
    pub explanation: Option<String>,
    /// Without an explanation: what might explain it, not yet tested.
    pub hint: Option<String>,
}

impl Cell {
    /// Whether our figure differs sharply from the paper's.
    pub fn differs(&self) -> bool {
        if !(self.paper.is_finite() && self.ours.is_finite()) {
            return false;
        }
        match self.rule {
            Rule::Points => (self.ours - self.paper).abs() > POINTS,
            Rule::Ratio => {
                let (a, b) = (self.paper.abs(), self.ours.abs());
                if a == 0.0 || b == 0.0 {
                    return a != b;
                }
                a / b > RATIO || b / a > RATIO
            }
        }
    }
}

/// The "Differs from the paper" section: empty when no cell differs.
pub fn section(cells: &[Cell]) -> String {
    let differ: Vec<&Cell> = cells.iter().filter(|c| c.differs()).collect();
    if differ.is_empty() {
        return String::new();
    }
    let mut notes: Vec<String> = Vec::new();
    let mut o = String::from("## Differs from the paper\n\n");
    let _ = writeln!(
        o,
        "{} of the {} figures compared with the paper differ from it by more than ×{RATIO} either way \
         (percentages: by more than {POINTS} percentage points). Each is listed with both figures and \
         what explains it; where nothing established does, it says so.\n",
        differ.len(),
        cells.len()
    );
    let _ = writeln!(o, "| figure | paper | ours | why |\n|---|---|---|---|");
    for c in &differ {
        let mut note = |e: &String| match notes.iter().position(|n| n == e) {
            Some(k) => k + 1,
            None => {
                notes.push(e.clone());
                notes.len()
            }
        };
        let why = match (&c.explanation, &c.hint) {
            (Some(e), _) => format!("note {}", note(e)),
            (None, Some(h)) => format!("not yet understood (note {})", note(h)),
            (None, None) => "not yet understood".into(),
        };
        let _ = writeln!(
            o,
            "| {} | {} {u} | {} {u} | {why} |",
            c.what,
            fmt(c.paper),
            fmt(c.ours),
            u = c.unit
        );
    }
    if !notes.is_empty() {
        let _ = writeln!(o);
        for (k, n) in notes.iter().enumerate() {
            let _ = writeln!(o, "{}. {n}", k + 1);
        }
    }
    o.push('\n');
    o
}

fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(paper: f64, ours: f64, rule: Rule, why: Option<&str>) -> Cell {
        Cell {
            what: format!("x {paper} {ours}"),
            paper,
            ours,
            unit: "ms",
            rule,
            explanation: why.map(String::from),
            hint: None,
        }
    }

    #[test]
    fn thresholds() {
        assert!(!cell(16.0, 31.9, Rule::Ratio, None).differs());
        assert!(cell(16.0, 32.1, Rule::Ratio, None).differs());
        assert!(cell(16.0, 7.9, Rule::Ratio, None).differs());
        assert!(!cell(16.0, 8.1, Rule::Ratio, None).differs());
        assert!(cell(0.0, 1.0, Rule::Ratio, None).differs());
        assert!(!cell(0.0, 0.0, Rule::Ratio, None).differs());
        assert!(cell(0.0, 90.0, Rule::Points, None).differs());
        assert!(!cell(0.0, 19.9, Rule::Points, None).differs());
        assert!(cell(57.4, 0.0, Rule::Points, None).differs());
        assert!(!cell(f64::NAN, 1.0, Rule::Ratio, None).differs());
    }

    #[test]
    fn section_lists_only_differing_cells_with_both_figures() {
        assert_eq!(section(&[cell(16.0, 17.0, Rule::Ratio, None)]), "");
        let s = section(&[
            cell(16.0, 17.0, Rule::Ratio, None),
            cell(16.16, 50.08, Rule::Ratio, Some("size")),
            cell(15.0, 48.0, Rule::Ratio, Some("size")),
            cell(0.0, 90.0, Rule::Points, None),
            Cell {
                hint: Some("maybe the deadline".into()),
                ..cell(0.0, 80.0, Rule::Points, None)
            },
        ]);
        assert!(s.starts_with("## Differs from the paper\n"), "{s}");
        assert!(s.contains("4 of the 5 figures"), "{s}");
        assert!(!s.contains("| x 16 17 |"), "{s}");
        assert!(
            s.contains("| x 16.16 50.08 | 16.16 ms | 50.08 ms | note 1 |"),
            "{s}"
        );
        assert!(
            s.contains("| x 15 48 | 15.00 ms | 48.00 ms | note 1 |"),
            "{s}"
        );
        assert!(
            s.contains("| x 0 90 | 0.00 ms | 90.00 ms | not yet understood |"),
            "{s}"
        );
        assert_eq!(
            s.matches("1. size").count(),
            1,
            "one note per explanation: {s}"
        );
        assert!(s.contains("| not yet understood (note 2) |"), "{s}");
        assert!(s.contains("2. maybe the deadline"), "{s}");
    }
}
