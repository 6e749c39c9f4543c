//! Figures over repetitions: median, min and max, and how tables show them.

use serde::Serialize;

/// Median with min and max.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Values it summarises.
    pub n: usize,
}

impl Spread {
    /// Summarises `v`; `None` when empty.
    pub fn of(v: &[f64]) -> Option<Spread> {
        if v.is_empty() {
            return None;
        }
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: s[0],
            max: s[n - 1],
            n,
        })
    }

    /// `median [min–max]` with `prec` decimals.
    pub fn show(&self, prec: usize) -> String {
        format!(
            "{:.p$} [{:.p$}–{:.p$}]",
            self.median,
            self.min,
            self.max,
            p = prec
        )
    }
}

/// Summarises the values of an iterator; `None` when empty.
pub fn spread_of(v: impl Iterator<Item = f64>) -> Option<Spread> {
    Spread::of(&v.collect::<Vec<_>>())
}

/// Shows an optional spread, `–` when absent.
pub fn show(s: &Option<Spread>, prec: usize) -> String {
    s.map(|s| s.show(prec)).unwrap_or_else(|| "–".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_median_min_max() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of(&[1.0, 4.0]).unwrap().median, 2.5);
        assert!(Spread::of(&[]).is_none());
    }
}
