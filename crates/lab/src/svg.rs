//! A small hand-written SVG line chart.

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

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders a line chart; `subtitle` states how the data were measured.
pub fn line_chart(
    title: &str,
    subtitle: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
) -> String {
    let (w, h) = (820.0, 460.0);
    let (l, r, t, b) = (70.0, 200.0, 72.0, 50.0);
    let pw = w - l - r;
    let ph = h - t - b;
    let xs = series.iter().flat_map(|s| {
        s.points
            .iter()
            .map(|p| p.0)
            .chain(s.band.iter().map(|p| p.0))
    });
    let xmax = xs.fold(1.0f64, f64::max);
    let ys = series.iter().flat_map(|s| {
        s.points
            .iter()
            .map(|p| p.1)
            .chain(s.band.iter().map(|p| p.2))
    });
    let ymax = nice(ys.fold(1.0f64, f64::max) * 1.05);
    let px = |x: f64| l + x / xmax * pw;
    let py = |y: f64| t + ph - y / ymax * ph;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{l}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for (k, line) in subtitle.lines().enumerate() {
        let _ = writeln!(
            o,
            r##"<text x="{l}" y="{}" fill="#444" font-size="11">{}</text>"##,
            38 + 14 * k,
            esc(line)
        );
    }
    for i in 0..=5 {
        let y = ymax * i as f64 / 5.0;
        let _ = writeln!(
            o,
            r##"<line x1="{l}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            l + pw,
            l - 6.0,
            py(y) + 4.0,
            y,
            py = py(y)
        );
        let x = xmax * i as f64 / 5.0;
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{:.1}</text>"#,
            px(x),
            t + ph + 16.0,
            x
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        l + pw / 2.0,
        h - 12.0,
        esc(xlabel)
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        t + ph / 2.0,
        esc(ylabel)
    );
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
        let ly = t + 10.0 + i as f64 * 18.0;
        let lx = l + pw + 12.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            s.color,
            lx + 30.0,
            ly + 4.0,
            esc(&s.label)
        );
    }
    o.push_str("</svg>\n");
    o
}

fn nice(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

/// Colours by series index.
pub const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];
