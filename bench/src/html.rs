//! `--html`: one self-contained page (inline SVG, no scripts, nothing fetched) with the tables and charts:
//! latency over time per channel, θ_eff and utilisation over time, latency CDF per channel, escalation share
//! over time, throughput per channel and the LLM queue depth.

use std::fmt::Write as _;

use crate::output::Report;
use crate::report::RunReport;

const W: f64 = 760.0;
const H: f64 = 300.0;
const ML: f64 = 64.0;
const MR: f64 = 150.0;
const MT: f64 = 34.0;
const MB: f64 = 42.0;

/// One polyline.
pub struct Line {
    pub name: String,
    pub color: &'static str,
    pub dashed: bool,
    pub pts: Vec<(f64, f64)>,
}

fn color(channel: &str) -> &'static str {
    match channel {
        "tier0" => "#1f77b4",
        "escalated" => "#d62728",
        "degraded" => "#ff7f0e",
        "untiered" => "#9467bd",
        "errors" => "#7f7f7f",
        _ => "#2ca02c",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(mag * 10.0);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

/// Tick values over an axis range: powers of ten on a log axis (`lo`, `hi` are exponents there).
fn ticks(lo: f64, hi: f64, log: bool) -> Vec<f64> {
    if log {
        (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        nice_ticks(lo, hi)
    }
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || (v.fract() == 0.0 && v.abs() >= 1.0) {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

/// Axis scales of a chart.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scale {
    /// log10 x axis (values ≤ 0 dropped).
    pub xlog: bool,
    /// log10 y axis (values ≤ 0 dropped).
    pub ylog: bool,
    /// Fixed y range.
    pub y: Option<(f64, f64)>,
}

/// An SVG line chart; lines with few points also get a marker per point.
pub fn chart(title: &str, xlabel: &str, ylabel: &str, lines: &[Line], scale: Scale) -> String {
    let Scale {
        xlog,
        ylog,
        y: yfix,
    } = scale;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="{}" y="18" font-size="13" font-weight="bold">{}</text>"#,
        ML,
        esc(title)
    );
    let ty = |y: f64| if ylog { y.log10() } else { y };
    let tx = |x: f64| if xlog { x.log10() } else { x };
    let keep = |&(x, y): &(f64, f64)| {
        x.is_finite() && y.is_finite() && (!ylog || y > 0.0) && (!xlog || x > 0.0)
    };
    let pts: Vec<(f64, f64)> = lines
        .iter()
        .flat_map(|l| l.pts.iter().copied())
        .filter(keep)
        .map(|(x, y)| (tx(x), y))
        .collect();
    if pts.is_empty() {
        let _ = write!(
            svg,
            r##"<text x="{}" y="{}" fill="#888">no data</text></svg>"##,
            W / 2.0 - 20.0,
            H / 2.0
        );
        return svg;
    }
    let (mut x0, mut x1) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    if xlog {
        x0 = x0.floor();
        x1 = x1.ceil().max(x0 + 1.0);
    } else if x1 <= x0 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    let (mut y0, mut y1) = match yfix {
        Some(r) => (ty(r.0.max(if ylog { 1e-9 } else { f64::MIN })), ty(r.1)),
        None => pts
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
                (a.min(ty(p.1)), b.max(ty(p.1)))
            }),
    };
    if ylog {
        y0 = y0.floor();
        y1 = y1.ceil().max(y0 + 1.0);
    } else if yfix.is_none() {
        y0 = y0.min(0.0);
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        y1 *= 1.05;
    }
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    let sx = |x: f64| ML + (tx(x) - x0) / (x1 - x0) * pw;
    let sy = |y: f64| MT + ph - (ty(y) - y0) / (y1 - y0) * ph;
    // Axes and grid.
    let _ = write!(
        svg,
        r##"<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##
    );
    for t in ticks(y0, y1, ylog) {
        let y = sy(t);
        let _ = write!(
            svg,
            r##"<line x1="{ML}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ML + pw,
            ML - 4.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
    for t in ticks(x0, x1, xlog) {
        let x = sx(t);
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{MT}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            MT + ph,
            MT + ph + 14.0,
            fmt_tick(t)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="14" y="{}" text-anchor="middle" transform="rotate(-90 14 {})">{}</text>"#,
        ML + pw / 2.0,
        H - 8.0,
        esc(xlabel),
        MT + ph / 2.0,
        MT + ph / 2.0,
        esc(ylabel)
    );
    // Lines and legend.
    for (i, l) in lines.iter().enumerate() {
        let xy: Vec<(f64, f64)> = l
            .pts
            .iter()
            .filter(|p| keep(p))
            .map(|&(x, y)| (sx(x), sy(y).clamp(MT, MT + ph)))
            .collect();
        let path: Vec<String> = xy.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let dash = if l.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        if xy.len() < 40 && !l.dashed {
            for (x, y) in &xy {
                let _ = write!(
                    svg,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{}"/>"#,
                    l.color
                );
            }
        }
        if path.len() > 1 {
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.6"{dash} points="{}"/>"#,
                l.color,
                path.join(" ")
            );
        }
        let ly = MT + 8.0 + i as f64 * 16.0;
        let lx = ML + pw + 10.0;
        let _ = write!(
            svg,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 18.0,
            l.color,
            lx + 22.0,
            ly + 4.0,
            esc(&l.name)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// The charts of one run.
pub fn run_charts(r: &RunReport) -> Vec<String> {
    let present: Vec<&str> = crate::stats::Channel::ALL
        .iter()
        .map(|c| c.name())
        .filter(|c| r.channel(c).is_some_and(|s| s.count > 0))
        .collect();
    let mut lat = Vec::new();
    for &ch in &present {
        let pts = |p99: bool| -> Vec<(f64, f64)> {
            r.series
                .iter()
                .filter_map(|s| {
                    let m = if p99 { &s.p99_ms } else { &s.p50_ms };
                    m.get(ch).map(|v| (s.t as f64, *v))
                })
                .collect()
        };
        let (p99, p50) = (pts(true), pts(false));
        lat.push(Line {
            name: format!("{ch} p99"),
            color: color(ch),
            dashed: false,
            pts: p99,
        });
        lat.push(Line {
            name: format!("{ch} p50"),
            color: color(ch),
            dashed: true,
            pts: p50,
        });
    }
    let sc = &r.scrape.samples;
    let theta = vec![
        Line {
            name: "θ_eff".into(),
            color: "#000000",
            dashed: false,
            pts: sc
                .iter()
                .filter_map(|s| s.theta_eff.map(|v| (s.t, v)))
                .collect(),
        },
        Line {
            name: "utilisation".into(),
            color: "#e377c2",
            dashed: false,
            pts: sc
                .iter()
                .filter_map(|s| s.utilization.map(|v| (s.t, v)))
                .collect(),
        },
    ];
    let cdf: Vec<Line> = present
        .iter()
        .filter_map(|&ch| {
            r.channel(ch).map(|c| Line {
                name: ch.into(),
                color: color(ch),
                dashed: false,
                pts: c.cdf.clone(),
            })
        })
        .collect();
    let share = vec![
        Line {
            name: "measured (per s)".into(),
            color: "#d62728",
            dashed: false,
            pts: r
                .series
                .iter()
                .filter_map(|s| s.escalated_share.map(|v| (s.t as f64, v)))
                .collect(),
        },
        Line {
            name: "server, last 10 s".into(),
            color: "#555555",
            dashed: true,
            pts: sc
                .iter()
                .filter_map(|s| s.escalated_share_10s.map(|v| (s.t, v)))
                .collect(),
        },
    ];
    let mut rate: Vec<Line> = present
        .iter()
        .map(|&ch| Line {
            name: ch.into(),
            color: color(ch),
            dashed: false,
            pts: r
                .series
                .iter()
                .map(|s| (s.t as f64, s.count.get(ch).copied().unwrap_or(0) as f64))
                .collect(),
        })
        .collect();
    rate.push(Line {
        name: "all sent".into(),
        color: "#2ca02c",
        dashed: true,
        pts: r
            .series
            .iter()
            .map(|s| (s.t as f64, s.count.values().sum::<u64>() as f64))
            .collect(),
    });
    let depth = vec![Line {
        name: "queue depth".into(),
        color: "#8c564b",
        dashed: false,
        pts: sc
            .iter()
            .filter_map(|s| s.queue_depth.map(|v| (s.t, v)))
            .collect(),
    }];
    let unit = Scale {
        y: Some((0.0, 1.0)),
        ..Scale::default()
    };
    vec![
        chart(
            "Latency over time per channel (by send second)",
            "seconds",
            "latency ms (log)",
            &lat,
            Scale {
                ylog: true,
                ..Scale::default()
            },
        ),
        chart(
            "θ_eff and utilisation over time (scraped)",
            "seconds",
            "value",
            &theta,
            unit,
        ),
        chart(
            "Latency CDF per channel",
            "latency ms (log)",
            "fraction ≤",
            &cdf,
            Scale { xlog: true, ..unit },
        ),
        chart(
            "Escalation share over time",
            "seconds",
            "escalated + degraded / served",
            &share,
            unit,
        ),
        chart(
            "Requests per second by channel (by send second)",
            "seconds",
            "requests/s",
            &rate,
            Scale::default(),
        ),
        chart(
            "LLM queue depth (scraped)",
            "seconds",
            "jobs in flight",
            &depth,
            Scale::default(),
        ),
    ]
}

/// The page.
/// A run's cost and latency-experiment tables (when it has them).
fn tables(r: &crate::report::RunReport) -> String {
    let mut h = String::new();
    if let Some(c) = &r.cost {
        let _ = write!(
            h,
            "<h3>cost ({}; fleet {:.2}/h)</h3><table><tr><th>channel</th><th>req/s</th><th>cost/h</th>\
             <th>per 1k requests</th><th>band</th></tr>",
            esc(&c.currency),
            c.fleet_hourly
        );
        for ch in &c.channels {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{:.1}</td><td>{:.4}</td><td>{}</td><td>{}</td></tr>",
                esc(&ch.channel),
                ch.requests_per_s,
                ch.hourly,
                ch.per_1k.map_or("-".into(), |x| format!("{x:.4}")),
                if ch.out_of_band {
                    "out of band"
                } else {
                    "in band"
                }
            );
        }
        let _ = write!(
            h,
            "<tr><th>blended</th><td></td><td></td><td>{}</td><td>escalation: {} of the cost</td></tr></table>",
            c.blended_per_1k.map_or("-".into(), |x| format!("{x:.4}")),
            c.escalated_cost_share.map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
        );
    }
    if !r.variants.is_empty() {
        h.push_str(
            "<h3>latency experiment</h3><table><tr><th>variant</th><th>answers</th><th>p50 ms</th>\
                    <th>p95 ms</th><th>p99 ms</th><th>band</th><th>abandoned</th></tr>",
        );
        for v in &r.variants {
            let l = v.stats.latency.clone().unwrap_or_default();
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&v.variant),
                v.stats.count,
                crate::stats::ms(l.p50_ms),
                crate::stats::ms(l.p95_ms),
                crate::stats::ms(l.p99_ms),
                v.stats.band.unwrap_or("-"),
                v.abandoned.map_or("-".into(), |a| format!("{:.1}%", a * 100.0))
            );
        }
        h.push_str("</table>");
    }
    h
}

pub fn page(report: &Report, text: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>tiergate-bench — {}</title><style>\
         body{{font-family:sans-serif;margin:20px;color:#222}} pre{{background:#f6f6f6;padding:10px;font-size:12px;overflow-x:auto}}\
         .charts{{display:flex;flex-wrap:wrap;gap:10px}} h2{{margin-top:28px}}\
         table{{border-collapse:collapse;font-size:13px}} td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style></head><body>\
         <h1>tiergate-bench</h1><p>{} — route <code>{}</code></p>",
        esc(&report.url),
        esc(&report.url),
        esc(&report.route)
    );
    let _ = write!(h, "<pre>{}</pre>", esc(text));
    for r in &report.runs {
        let _ = write!(h, "<h2>{}</h2><div class=\"charts\">", esc(&r.name));
        for c in run_charts(r) {
            h.push_str(&c);
        }
        h.push_str("</div>");
        h.push_str(&tables(r));
    }
    if let Some(rows) = report
        .comparison
        .as_ref()
        .filter(|rs| rs.iter().any(|r| r.cost_per_1k.is_some()))
    {
        h.push_str("<h2>cost, latency and accuracy by policy</h2><table><tr><th>policy</th><th>cost per 1k</th><th>p99 ms</th><th>accuracy</th><th>escalated</th></tr>");
        for r in rows {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.variant),
                r.cost_per_1k.map_or("-".into(), |c| format!("{c:.4}")),
                r.p99_served_ms.map_or("-".into(), crate::stats::ms),
                r.accuracy.map_or("-".into(), |a| format!("{a:.3}")),
                r.escalation_share
                    .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(
            nice_ticks(0.0, 1.0),
            vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
        );
        assert_eq!(
            nice_ticks(0.0, 50.0),
            vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
        );
    }

    #[test]
    fn charts_draw_lines_and_say_no_data() {
        let l = Line {
            name: "a<b".into(),
            color: "#000",
            dashed: true,
            pts: vec![(0.0, 1.0), (1.0, 10.0), (2.0, 100.0)],
        };
        let svg = chart(
            "t",
            "x",
            "y",
            &[l],
            Scale {
                ylog: true,
                ..Scale::default()
            },
        );
        assert!(
            svg.contains("<polyline") && svg.contains("a&lt;b") && svg.contains("stroke-dasharray")
        );
        assert!(svg.ends_with("</svg>"));
        let empty = chart("t", "x", "y", &[], Scale::default());
        assert!(empty.contains("no data"));
    }
}
