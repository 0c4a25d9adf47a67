//! An SVG timeline per workload: activity as a line, idle and reclaimed spans shaded,
//! warnings and actions marked. Hand-written SVG, no dependency.

use std::fmt::Write;

use crate::backtest::{Backtest, TimelineState};

const ROW: f64 = 46.0;
const LABEL: f64 = 300.0;
const PLOT: f64 = 900.0;

/// The whole backtest as one SVG document (workloads without a timeline are skipped).
pub fn timeline(b: &Backtest) -> String {
    let span = (b.end.as_second() - b.start.as_second()).max(1) as f64;
    let first_bucket = b.start.as_second() / b.step_seconds.max(1);
    let x =
        |bucket: i64| LABEL + (bucket - first_bucket) as f64 * b.step_seconds as f64 / span * PLOT;
    let xt =
        |t: jiff::Timestamp| LABEL + (t.as_second() - b.start.as_second()) as f64 / span * PLOT;
    let rows: Vec<_> = b
        .workloads
        .iter()
        .filter(|w| w.timeline.is_some())
        .collect();
    let height = 60.0 + ROW * rows.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="11">"#,
        w = LABEL + PLOT + 20.0
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="13" font-weight="bold">gpu-reaper backtest: {} ({} → {})</text>"#,
        esc(&b.policy),
        b.start,
        b.end
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="34">line: highest GPU activity · <tspan fill="#e8a33d">■</tspan> idle · <tspan fill="#9aa5b1">■</tspan> no telemetry · <tspan fill="#4c9a6a">■</tspan> reclaimed · <tspan fill="#d08c00">▲</tspan> warned · <tspan fill="#c0392b">▼</tspan> acted (✕ regret)</text>"##
    );
    for (i, w) in rows.iter().enumerate() {
        let Some(t) = &w.timeline else { continue };
        let top = 50.0 + ROW * i as f64;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}">{}/{} {} ({} GPU)</text>"#,
            top + 22.0,
            esc(&w.namespace),
            esc(&w.kind),
            esc(&w.name),
            w.gpus
        );
        let _ = writeln!(
            s,
            r##"<rect x="{LABEL}" y="{top}" width="{PLOT}" height="36" fill="#f7f7f7"/>"##
        );
        // Shaded spans: merge consecutive steps of the same state.
        let mut start = 0usize;
        for k in 1..=t.state.len() {
            if k == t.state.len() || t.state[k] != t.state[start] {
                let color = match t.state[start] {
                    TimelineState::Idle => Some("#e8a33d"),
                    TimelineState::NoTelemetry => Some("#9aa5b1"),
                    TimelineState::Reclaimed => Some("#4c9a6a"),
                    _ => None,
                };
                if let Some(c) = color {
                    let x0 = x(t.first_bucket + start as i64);
                    let x1 = x(t.first_bucket + k as i64);
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x0:.1}" y="{top}" width="{:.1}" height="36" fill="{c}" opacity="0.45"/>"#,
                        (x1 - x0).max(0.5)
                    );
                }
                start = k;
            }
        }
        let mut path = String::new();
        let mut pen_down = false;
        for (k, a) in t.activity.iter().enumerate() {
            if a.is_nan() {
                pen_down = false;
                continue;
            }
            let px = x(t.first_bucket + k as i64);
            let py = top + 36.0 - f64::from(a.clamp(0.0, 1.0)) * 34.0;
            let _ = write!(path, "{}{px:.1},{py:.1} ", if pen_down { "L" } else { "M" });
            pen_down = true;
        }
        if !path.is_empty() {
            let _ = writeln!(
                s,
                r##"<path d="{}" fill="none" stroke="#2d5aa0" stroke-width="1"/>"##,
                path.trim_end()
            );
        }
        for at in &w.warnings {
            let px = xt(*at);
            let _ = writeln!(
                s,
                r##"<path d="M{px:.1},{top} l-4,-6 h8 z" fill="#d08c00"><title>warned {at}</title></path>"##
            );
        }
        for a in &w.actions {
            let px = xt(a.at);
            let y = top + 36.0;
            let mark = if a.regret { "✕" } else { "▼" };
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" fill="#c0392b" font-size="12">{mark}<title>{:?} at {}{}</title></text>"##,
                px - 4.0,
                y + 10.0,
                a.action,
                a.at,
                if a.regret {
                    " (regret: activity resumed)"
                } else {
                    ""
                }
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `backtest --sweep --svg`: reclaimed GPU-hours (y) against regret rate (x), one polyline
/// per family of variants.
pub fn frontier(title: &str, points: &[crate::backtest::sweep::Point]) -> String {
    use crate::backtest::sweep::Family;
    let (w, h, left, top, pw, ph) = (880.0, 480.0, 70.0, 50.0, 560.0, 370.0);
    let max_y = points
        .iter()
        .map(|p| p.reclaimed_gpu_hours)
        .fold(1.0f64, f64::max)
        * 1.1;
    let x = |r: f64| left + r.clamp(0.0, 1.0) * pw;
    let y = |g: f64| top + ph - g / max_y * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="13" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>"##
    );
    for i in 0..=10 {
        let r = f64::from(i) / 10.0;
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle">{:.0}%</text>"##,
            x(r),
            top + ph + 15.0,
            r * 100.0
        );
        let g = max_y * r;
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{:.0}</text>"##,
            left - 5.0,
            y(g) + 4.0,
            g
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">regret rate (actions followed by activity within the horizon)</text>"#,
        left + pw / 2.0,
        top + ph + 32.0
    );
    let _ = writeln!(
        s,
        r#"<text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">reclaimed GPU-hours</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    let families = [
        (Family::Risk, "#2e7d32", "risk-based (idle.maxResumeRisk)"),
        (
            Family::Fixed,
            "#c0392b",
            "fixed idle duration (action.after)",
        ),
        (
            Family::PreWarm,
            "#e67e22",
            "fixed and risk-based with action.preWarm",
        ),
        (Family::Baseline, "#555555", "other tools' fixed rules"),
        (
            Family::Oracle,
            "#1f5fa8",
            "oracle (hindsight: never a regret)",
        ),
    ];
    for (k, (family, colour, name)) in families.iter().enumerate() {
        let mut mine: Vec<_> = points.iter().filter(|p| p.family == *family).collect();
        mine.sort_by(|a, b| a.regret_rate.total_cmp(&b.regret_rate));
        // A line through the fixed and the risk points: one per maxIdle ceiling for
        // `--max-idle` risk points.
        let mut ceilings: Vec<Option<i64>> = mine.iter().map(|p| p.max_idle_seconds).collect();
        ceilings.sort_unstable();
        ceilings.dedup();
        if !matches!(family, Family::Risk | Family::Fixed) {
            ceilings.clear();
        }
        for ceiling in ceilings {
            let line: Vec<_> = mine
                .iter()
                .filter(|p| p.max_idle_seconds == ceiling)
                .collect();
            if line.len() < 2 {
                continue;
            }
            let path: Vec<String> = line
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.regret_rate), y(p.reclaimed_gpu_hours)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
        }
        for p in &mine {
            let (px, py) = (x(p.regret_rate), y(p.reclaimed_gpu_hours));
            let _ = writeln!(
                s,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="{colour}"><title>{}: {} actions, {:.0} % regret, {:.1} GPU-h</title></circle>"#,
                esc(&p.label),
                p.actions,
                p.regret_rate * 100.0,
                p.reclaimed_gpu_hours
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" fill="{colour}" font-size="9">{}</text>"#,
                px + 6.0,
                py - 4.0,
                esc(&p.label)
            );
        }
        let ly = top + 14.0 + 16.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="10" height="10" fill="{colour}"/><text x="{}" y="{}">{name}</text>"#,
            left + pw + 10.0,
            ly - 9.0,
            left + pw + 24.0,
            ly
        );
    }
    s.push_str("</svg>\n");
    s
}
