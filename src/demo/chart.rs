//! A dependency-free SVG chart of the demo: queue wait against arrival time, one panel per
//! policy, the flood tenant's requests in grey and the small tenants' in colour.
//!
//! Invariant: output is a complete standalone SVG document for any input (empty runs included).

use std::fmt::Write;

/// One request as the client saw it.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    /// Seconds since the run started when the request was sent.
    pub sent_s: f64,
    /// Seconds it spent queued in fairgate.
    pub wait_s: f64,
    /// Whether it came from a small tenant (not the flood tenant).
    pub small: bool,
}

const W: f64 = 420.0;
const H: f64 = 260.0;
const PAD: f64 = 40.0;

/// Renders the panels side by side.
pub fn svg(panels: &[(&str, &[Point])]) -> String {
    let max_t = max_of(panels, |p| p.sent_s).max(1.0);
    let max_w = max_of(panels, |p| p.wait_s).max(1.0);
    let width = W * panels.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="sans-serif" font-size="12">"#,
        h = H + 30.0
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, (title, points)) in panels.iter().enumerate() {
        let x0 = W * i as f64;
        let (left, bottom, right, top) = (x0 + PAD, H - PAD + 10.0, x0 + W - 15.0, 30.0);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="18" font-weight="bold">{}</text>"#,
            left,
            escape(title)
        );
        let _ = writeln!(
            out,
            r##"<path d="M{left},{top} V{bottom} H{right}" stroke="#333" fill="none"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">request sent at (s), max {:.0}</text>"#,
            (left + right) / 2.0,
            bottom + 28.0,
            max_t
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">queue wait (s), max {:.1}</text>"#,
            x0 + 14.0,
            (top + bottom) / 2.0,
            x0 + 14.0,
            (top + bottom) / 2.0,
            max_w
        );
        for p in points.iter() {
            let x = left + (right - left) * p.sent_s / max_t;
            let y = bottom - (bottom - top) * p.wait_s / max_w;
            let (color, r) = if p.small {
                ("#d62728", 4.0)
            } else {
                ("#999", 2.0)
            };
            let _ = writeln!(
                out,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{color}" fill-opacity="0.8"/>"#
            );
        }
    }
    let _ = writeln!(
        out,
        r##"<text x="{PAD}" y="{}"><tspan fill="#999">● flood tenant A</tspan>   <tspan fill="#d62728">● small tenants</tspan></text>"##,
        H + 22.0
    );
    out.push_str("</svg>\n");
    out
}

fn max_of(panels: &[(&str, &[Point])], f: impl Fn(&Point) -> f64) -> f64 {
    panels
        .iter()
        .flat_map(|(_, ps)| ps.iter().map(&f))
        .fold(0.0, f64::max)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_complete_document() {
        let pts = [
            Point {
                sent_s: 1.0,
                wait_s: 5.0,
                small: true,
            },
            Point {
                sent_s: 2.0,
                wait_s: 0.1,
                small: false,
            },
        ];
        let s = svg(&[("fifo <a>", &pts), ("drr", &[])]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<circle").count(), 2);
        assert!(s.contains("fifo &lt;a&gt;"));
    }
}
