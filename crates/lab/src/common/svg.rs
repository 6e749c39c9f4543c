//! Small hand-written SVG charts: a line chart (numeric x axis) and a
//! category chart (one labelled band per category).
//!
//! Text is never clipped: the canvas is sized from an estimate of each text's
//! extent ([`text_width`]), long subtitle lines are wrapped, and the legend
//! column is as wide as its longest label. Axis ticks are round numbers
//! (steps of 1, 2 or 5 × 10^k, [`nice_ticks`]).

use std::fmt::Write;

/// One line: points, with an optional min–max band.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Colour (CSS).
    pub color: String,
    /// Dashed stroke.
    pub dashed: bool,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
    /// (x, min, max) band, drawn translucent.
    pub band: Vec<(f64, f64, f64)>,
}

/// One series of a category chart: a value per category.
pub struct CatSeries {
    /// Legend label.
    pub label: String,
    /// Colour (CSS).
    pub color: String,
    /// Hollow marker (e.g. for a reference value) instead of a filled one.
    pub hollow: bool,
    /// Per category (in the chart's order): (value, min, max), or `None`.
    pub values: Vec<Option<(f64, f64, f64)>>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Estimated width in pixels of `s` in a sans-serif font of `size` px: 0.6 em
/// per character, a little above the average advance of common sans-serif
/// fonts (Helvetica, DejaVu Sans), so the estimate errs on the wide side.
pub fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * 0.6 * size
}

/// Subtitle lines longer than this many characters are wrapped.
const WRAP: usize = 110;

/// Splits `s` into lines of at most `max` characters at spaces (a word
/// longer than `max` keeps its own line).
pub fn wrap(s: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in s.lines() {
        let mut cur = String::new();
        for word in line.split(' ') {
            if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > max {
                out.push(std::mem::take(&mut cur));
            }
            if !cur.is_empty() {
                cur.push(' ');
            }
            cur.push_str(word);
        }
        out.push(cur);
    }
    out
}

/// The smallest step of the form 1, 2 or 5 × 10^k that is at least `raw`.
pub fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        // Tolerance: 0.3 must give 0.5 and not 0.2 after rounding noise.
        if m * p >= raw * (1.0 - 1e-9) {
            return m * p;
        }
    }
    10.0 * p
}

/// Round ticks covering `[lo, hi]`: at most `max_ticks` (≥ 2) multiples of a
/// 1/2/5 × 10^k step, the first at or below `lo`, the last at or above `hi`.
pub fn nice_ticks(lo: f64, hi: f64, max_ticks: usize) -> Vec<f64> {
    let (lo, hi) = if lo.is_finite() && hi.is_finite() {
        (lo.min(hi), lo.max(hi))
    } else {
        (0.0, 1.0)
    };
    let hi = if hi - lo < 1e-12 { lo + 1.0 } else { hi };
    let intervals = max_ticks.max(2) as f64 - 1.0;
    let mut step = nice_step((hi - lo) / intervals);
    loop {
        let first = (lo / step + 1e-9).floor();
        let last = (hi / step - 1e-9).ceil();
        if last - first <= intervals {
            let dec = decimals(step);
            return (first as i64..=last as i64)
                .map(|i| round_to(i as f64 * step, dec))
                .collect();
        }
        step = nice_step(step * 1.5);
    }
}

/// Decimals needed to print multiples of `step` exactly.
fn decimals(step: f64) -> usize {
    (-step.log10().floor()).max(0.0) as usize
}

fn round_to(v: f64, dec: usize) -> f64 {
    let f = 10f64.powi(dec as i32);
    let r = (v * f).round() / f;
    if r == 0.0 {
        0.0
    } else {
        r
    }
}

/// Tick label: as many decimals as the step needs.
fn tick_label(v: f64, ticks: &[f64]) -> String {
    let step = if ticks.len() >= 2 {
        ticks[1] - ticks[0]
    } else {
        1.0
    };
    format!("{v:.*}", decimals(step))
}

const TITLE_SIZE: f64 = 15.0;
const SUB_SIZE: f64 = 11.0;
const FONT: f64 = 12.0;
const LEGEND_ROW: f64 = 18.0;
const LEFT: f64 = 70.0;
const BOTTOM: f64 = 50.0;
const MIN_PLOT_H: f64 = 338.0;

/// The frame shared by both charts: canvas, title, subtitle, y axis, legend.
struct Frame {
    w: f64,
    h: f64,
    l: f64,
    t: f64,
    pw: f64,
    ph: f64,
    subtitle: Vec<String>,
    yticks: Vec<f64>,
}

impl Frame {
    /// `plot_w`: the plot area's minimum width; `texts`: other texts (x
    /// label) that must fit, with their font sizes.
    fn new(
        title: &str,
        subtitle: &str,
        xlabel: &str,
        legend: &[&str],
        plot_w: f64,
        (ymin, ymax): (f64, f64),
    ) -> Self {
        let subtitle = wrap(subtitle, WRAP);
        let legend_w = legend
            .iter()
            .map(|s| text_width(s, FONT))
            .fold(0.0, f64::max);
        // Legend: 12 px gap, 24 px swatch, 6 px gap, label, 12 px margin.
        let r = 12.0 + 30.0 + legend_w + 12.0;
        let top = [text_width(title, TITLE_SIZE)]
            .into_iter()
            .chain(subtitle.iter().map(|s| text_width(s, SUB_SIZE)))
            .fold(0.0, f64::max);
        let w = (LEFT + plot_w + r)
            .max(LEFT + top + 20.0)
            .max(LEFT + text_width(xlabel, FONT) + r)
            .ceil();
        let pw = w - LEFT - r;
        let t = 38.0 + 14.0 * subtitle.len() as f64 + 8.0;
        let ph = MIN_PLOT_H.max(legend.len() as f64 * LEGEND_ROW + 10.0);
        let h = (t + ph + BOTTOM).ceil();
        Frame {
            w,
            h,
            l: LEFT,
            t,
            pw,
            ph,
            subtitle,
            yticks: nice_ticks(ymin.min(0.0), ymax, 7),
        }
    }

    fn py(&self, y: f64) -> f64 {
        let (lo, hi) = (self.yticks[0], *self.yticks.last().unwrap_or(&1.0));
        self.t + self.ph - (y - lo) / (hi - lo) * self.ph
    }

    fn open(&self, o: &mut String, title: &str, ylabel: &str) {
        let (w, h, l) = (self.w, self.h, self.l);
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="{FONT}">"#
        );
        let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            o,
            r#"<text x="{l}" y="22" font-size="{TITLE_SIZE}" font-weight="bold">{}</text>"#,
            esc(title)
        );
        for (k, line) in self.subtitle.iter().enumerate() {
            let _ = writeln!(
                o,
                r##"<text x="{l}" y="{}" fill="#444" font-size="{SUB_SIZE}">{}</text>"##,
                38 + 14 * k,
                esc(line)
            );
        }
        for &y in &self.yticks {
            let py = self.py(y);
            let _ = writeln!(
                o,
                r##"<line x1="{l}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                l + self.pw,
                l - 6.0,
                py + 4.0,
                tick_label(y, &self.yticks),
            );
        }
        let _ = writeln!(
            o,
            r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            self.t + self.ph / 2.0,
            esc(ylabel)
        );
    }

    fn close(&self, o: &mut String, xlabel: &str) {
        let _ = writeln!(
            o,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            self.l, self.t, self.pw, self.ph
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            self.l + self.pw / 2.0,
            self.h - 12.0,
            esc(xlabel)
        );
        o.push_str("</svg>\n");
    }

    /// A legend row: `swatch` is the SVG of the swatch drawn at (lx, ly).
    fn legend(&self, o: &mut String, i: usize, label: &str, swatch: impl Fn(f64, f64) -> String) {
        let ly = self.t + 10.0 + i as f64 * LEGEND_ROW;
        let lx = self.l + self.pw + 12.0;
        let _ = writeln!(
            o,
            r#"{}<text x="{}" y="{}">{}</text>"#,
            swatch(lx, ly),
            lx + 30.0,
            ly + 4.0,
            esc(label)
        );
    }
}

/// Renders a line chart; `subtitle` states how the data were measured.
pub fn line_chart(
    title: &str,
    subtitle: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
) -> String {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|p| p.0)
                .chain(s.band.iter().map(|p| p.0))
        })
        .collect();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|p| p.1)
                .chain(s.band.iter().flat_map(|p| [p.1, p.2]))
        })
        .collect();
    let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = |v: &[f64]| v.iter().copied().fold(0.0, f64::min);
    let ymax = if ys.is_empty() { 1.0 } else { max(&ys) };
    let xmax = if xs.is_empty() { 1.0 } else { max(&xs) };
    let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
    let f = Frame::new(title, subtitle, xlabel, &labels, 550.0, (min(&ys), ymax));
    let xticks = nice_ticks(min(&xs), xmax, 8);
    let (x0, x1) = (xticks[0], *xticks.last().unwrap_or(&1.0));
    let px = |x: f64| f.l + (x - x0) / (x1 - x0) * f.pw;
    let py = |y: f64| f.py(y);
    let mut o = String::new();
    f.open(&mut o, title, ylabel);
    for &x in &xticks {
        let _ = writeln!(
            o,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="#888"/><text x="{0:.1}" y="{3}" text-anchor="middle">{4}</text>"##,
            px(x),
            f.t + f.ph,
            f.t + f.ph + 4.0,
            f.t + f.ph + 16.0,
            tick_label(x, &xticks)
        );
    }
    for (i, s) in series.iter().enumerate() {
        if !s.band.is_empty() {
            let mut pts: Vec<String> = s
                .band
                .iter()
                .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.2)))
                .collect();
            pts.extend(
                s.band
                    .iter()
                    .rev()
                    .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1))),
            );
            let _ = writeln!(
                o,
                r#"<polygon points="{}" fill="{}" fill-opacity="0.15" stroke="none"/>"#,
                pts.join(" "),
                s.color
            );
        }
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            pts.join(" "),
            s.color
        );
        f.legend(&mut o, i, &s.label, |lx, ly| {
            format!(
                r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/>"#,
                lx + 24.0,
                s.color
            )
        });
    }
    f.close(&mut o, xlabel);
    o
}

/// Renders a category chart: one evenly spaced, labelled band per category
/// (each label once, under its band), every series a marker in each band
/// with its min–max as a whisker.
pub fn category_chart(
    title: &str,
    subtitle: &str,
    xlabel: &str,
    categories: &[String],
    ylabel: &str,
    series: &[CatSeries],
) -> String {
    let vals: Vec<(f64, f64, f64)> = series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied())
        .collect();
    let ymax = vals
        .iter()
        .map(|v| v.0.max(v.2))
        .fold(f64::NEG_INFINITY, f64::max);
    let ymin = vals.iter().map(|v| v.0.min(v.1)).fold(0.0, f64::min);
    let ymax = if vals.is_empty() { 1.0 } else { ymax };
    // A band is as wide as its label (plus a margin) and room for the markers.
    let band_w = categories
        .iter()
        .map(|c| text_width(c, FONT) + 16.0)
        .fold(14.0 * (series.len() as f64 + 1.0), f64::max);
    let n = categories.len().max(1) as f64;
    let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
    let f = Frame::new(
        title,
        subtitle,
        xlabel,
        &labels,
        (band_w * n).max(300.0),
        (ymin, ymax),
    );
    let bw = f.pw / n;
    let mut o = String::new();
    f.open(&mut o, title, ylabel);
    for (k, c) in categories.iter().enumerate() {
        let x = f.l + k as f64 * bw;
        if k % 2 == 1 {
            let _ = writeln!(
                o,
                r##"<rect x="{x:.1}" y="{}" width="{bw:.1}" height="{}" fill="#f4f4f4"/>"##,
                f.t, f.ph
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x + bw / 2.0,
            f.t + f.ph + 16.0,
            esc(c)
        );
    }
    let m = series.len() as f64;
    for (i, s) in series.iter().enumerate() {
        for (k, v) in s.values.iter().enumerate().take(categories.len()) {
            let Some((v, lo, hi)) = *v else { continue };
            let x = f.l + k as f64 * bw + bw * (i as f64 + 1.0) / (m + 1.0);
            let _ = writeln!(
                o,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="{}" stroke-width="1.5"/>"#,
                f.py(lo),
                f.py(hi),
                s.color
            );
            let _ = writeln!(o, "{}", marker(x, f.py(v), &s.color, s.hollow));
        }
        f.legend(&mut o, i, &s.label, |lx, ly| {
            marker(lx + 12.0, ly, &s.color, s.hollow)
        });
    }
    f.close(&mut o, xlabel);
    o
}

fn marker(x: f64, y: f64, color: &str, hollow: bool) -> String {
    let fill = if hollow { "white" } else { color };
    format!(
        r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{fill}" stroke="{color}" stroke-width="1.5"/>"#
    )
}

/// Colours by series index.
pub const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn is_round_step(s: f64) -> bool {
        let p = 10f64.powf(s.log10().floor());
        let m = s / p;
        [1.0, 2.0, 5.0, 10.0].iter().any(|r| (m - r).abs() < 1e-6)
    }

    #[test]
    fn nice_ticks_are_round_steps_covering_the_range() {
        for (lo, hi) in [
            (0.0, 1.0),
            (0.0, 7.3),
            (0.0, 151.2),
            (0.0, 36.29),
            (0.0, 0.61),
            (0.0, 1994.69),
            (12.0, 13.0),
            (-3.0, 48.5),
            (0.0, 2.25),
            (0.0, 100.0),
        ] {
            let t = nice_ticks(lo, hi, 7);
            assert!(t.len() >= 2 && t.len() <= 7, "{lo}..{hi}: {t:?}");
            assert!(t[0] <= lo && *t.last().unwrap() >= hi, "{lo}..{hi}: {t:?}");
            let step = t[1] - t[0];
            assert!(is_round_step(step), "{lo}..{hi}: step {step} in {t:?}");
            for w in t.windows(2) {
                assert!(((w[1] - w[0]) - step).abs() < step * 1e-6, "{t:?}");
            }
            for v in &t {
                assert!(((v / step).round() * step - v).abs() < step * 1e-6, "{t:?}");
            }
        }
        assert_eq!(nice_ticks(0.0, 151.2, 7), [0.0, 50.0, 100.0, 150.0, 200.0]);
        assert_eq!(nice_ticks(0.0, 20.0, 7), [0.0, 5.0, 10.0, 15.0, 20.0]);
        assert_eq!(
            nice_ticks(0.0, 0.61, 8),
            [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
        );
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(25.0), 50.0);
        assert_eq!(nice_step(2.0), 2.0);
    }

    #[test]
    fn tick_labels_have_the_steps_decimals() {
        let t = nice_ticks(0.0, 0.61, 8);
        assert_eq!(tick_label(t[3], &t), "0.3");
        let t = nice_ticks(0.0, 151.2, 7);
        assert_eq!(tick_label(t[1], &t), "50");
    }

    /// The `width="…"` of the root element.
    fn svg_width(svg: &str) -> f64 {
        let a = svg.find("width=\"").unwrap() + 7;
        let b = a + svg[a..].find('"').unwrap();
        svg[a..b].parse().unwrap()
    }

    /// The right edge of every `<text x=".." ...>label</text>` (start-anchored).
    fn text_right_edges(svg: &str) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for part in svg.split("<text ").skip(1) {
            if part.contains("text-anchor") || part.starts_with("transform") {
                continue;
            }
            let size = part
                .split("font-size=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(FONT);
            let x: f64 = part[3..3 + part[3..].find('"').unwrap()].parse().unwrap();
            let body = &part[part.find('>').unwrap() + 1..part.find("</text>").unwrap()];
            out.push((body.to_string(), x + text_width(body, size)));
        }
        out
    }

    #[test]
    fn long_subtitle_and_legend_fit_in_the_width() {
        let long_label =
            "a very long legend label that used to run off the right edge of the chart";
        let sub = format!(
            "link: {}\nsecond line",
            "up: delay 8.08 ms, jitter ±4.8 ms uniform, rate 50 Mbit/s, queue 50 ms; ".repeat(4)
        );
        let series = vec![Series {
            label: long_label.into(),
            color: COLORS[0].into(),
            dashed: false,
            points: vec![(0.0, 1.0), (10.0, 3.0)],
            band: Vec::new(),
        }];
        for svg in [
            line_chart("title", &sub, "x", "y", &series),
            category_chart(
                "title",
                &sub,
                "x",
                &["a".into(), "b".into()],
                "y",
                &[CatSeries {
                    label: long_label.into(),
                    color: COLORS[0].into(),
                    hollow: false,
                    values: vec![Some((1.0, 0.5, 2.0)), None],
                }],
            ),
        ] {
            let w = svg_width(&svg);
            let edges = text_right_edges(&svg);
            assert!(edges.iter().any(|(t, _)| t == long_label), "legend drawn");
            let subtitle_lines = svg.matches(r#"font-size="11""#).count();
            assert!(
                subtitle_lines >= 4,
                "long line wrapped: {subtitle_lines} lines"
            );
            for (t, right) in edges {
                assert!(right <= w, "{t:?} ends at {right} > width {w}");
            }
        }
    }

    #[test]
    fn many_legend_rows_fit_in_the_height() {
        let series: Vec<Series> = (0..30)
            .map(|i| Series {
                label: format!("series {i}"),
                color: COLORS[i % COLORS.len()].into(),
                dashed: false,
                points: vec![(0.0, i as f64)],
                band: Vec::new(),
            })
            .collect();
        let svg = line_chart("t", "s", "x", "y", &series);
        let h: f64 = {
            let a = svg.find("height=\"").unwrap() + 8;
            svg[a..a + svg[a..].find('"').unwrap()].parse().unwrap()
        };
        let last = svg
            .split("<text ")
            .find(|p| p.contains(">series 29<"))
            .unwrap();
        let y: f64 = {
            let a = last.find("y=\"").unwrap() + 3;
            last[a..a + last[a..].find('"').unwrap()].parse().unwrap()
        };
        assert!(y < h - BOTTOM, "legend row at {y} in height {h}");
    }

    #[test]
    fn category_labels_appear_once_each_in_even_bands() {
        let cats: Vec<String> = ["mqtt-tcp", "mqtt-tls", "mqtt-quic-0rtt", "http3-0rtt"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let series = [
            CatSeries {
                label: "rtt50".into(),
                color: COLORS[0].into(),
                hollow: false,
                values: vec![Some((1.5, 1.4, 1.6)); 4],
            },
            CatSeries {
                label: "expected".into(),
                color: "black".into(),
                hollow: true,
                values: vec![Some((1.5, 1.5, 1.5)); 4],
            },
        ];
        let svg = category_chart("t", "s", "mode", &cats, "RTTs", &series);
        let mut xs = Vec::new();
        for c in &cats {
            let needle = format!(">{c}</text>");
            assert_eq!(svg.matches(&needle).count(), 1, "{c} once");
            let at = svg.find(&needle).unwrap();
            let start = svg[..at].rfind("<text x=\"").unwrap() + 9;
            let x: f64 = svg[start..start + svg[start..].find('"').unwrap()]
                .parse()
                .unwrap();
            xs.push(x);
        }
        let gap = xs[1] - xs[0];
        assert!(gap > 0.0);
        for w in xs.windows(2) {
            assert!((w[1] - w[0] - gap).abs() < 0.2, "evenly spaced: {xs:?}");
        }
        // Every category's label fits its band.
        for c in &cats {
            assert!(text_width(c, FONT) < gap, "{c} wider than its band {gap}");
        }
        // Markers: 2 series × 4 categories, plus 2 legend swatches.
        assert_eq!(svg.matches("<circle").count(), 10);
    }
}
