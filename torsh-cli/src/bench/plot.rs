//! `--plot FILE.svg`: a self-contained SVG chart of a run, written by hand (no plotting library).
//!
//! One panel per section and thread count; in each, one group of horizontal bars per case: ours and
//! each peer, in GFLOP/s or GB/s, with the value at the end of each bar, a labelled axis with grid
//! lines, the pass's ceiling as a dashed line (FMA peak or copy bandwidth) and a legend.

use super::cases::{Section, Work};
use super::ceiling::Ceilings;
use super::report::{ceilings_of, peer_keys};
use super::Measured;

/// Width of the whole chart.
const WIDTH: f64 = 1100.0;
/// Left margin holding the case labels.
const LABEL_W: f64 = 330.0;
/// Width of the bars' area.
const PLOT_W: f64 = 640.0;
/// Height of one bar.
const BAR_H: f64 = 9.0;
/// Space between the bars of one case.
const BAR_GAP: f64 = 1.0;
/// Space between cases.
const GROUP_GAP: f64 = 7.0;
/// Height above a panel's bars: title and legend.
const PANEL_HEAD: f64 = 56.0;
/// Height below a panel's bars: axis ticks and label.
const PANEL_FOOT: f64 = 40.0;
/// Colours of the known series, so that each keeps its colour in every panel.
const COLOURS: [(&str, &str); 6] = [
    ("ours", "#d62728"),
    ("OpenBLAS", "#1f77b4"),
    ("gemm", "#2ca02c"),
    ("matrixmultiply", "#9467bd"),
    ("scalar", "#ff7f0e"),
    ("cuBLAS", "#17becf"),
];
/// Colours of any other series, by position.
const OTHER_COLOURS: [&str; 3] = ["#8c564b", "#e377c2", "#7f7f7f"];

/// The colour of series `name`, the `i`-th of its panel.
fn colour(name: &str, i: usize) -> &'static str {
    COLOURS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(OTHER_COLOURS[i % OTHER_COLOURS.len()], |(_, c)| c)
}

/// One bar group: a case's label and each series' value (`None`: not measured).
struct Group {
    /// The case, as the table names it.
    label: String,
    /// One value per series, in GFLOP/s or GB/s.
    values: Vec<Option<f64>>,
}

/// A panel: one section at one thread count.
struct Panel {
    /// The title line.
    title: String,
    /// The unit of the axis.
    unit: &'static str,
    /// The series: `ours` then the peers.
    series: Vec<String>,
    /// The cases.
    groups: Vec<Group>,
    /// Dashed reference lines: label and value.
    lines: Vec<(String, f64)>,
}

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step for about `target` ticks up to `max`.
fn tick_step(max: f64, target: f64) -> f64 {
    let raw = (max / target).max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// A value as the chart's labels show it.
fn short(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Builds the panels of a run: for each thread count (in order) each section that has results.
fn panels(results: &[Measured], ceilings: &[Ceilings]) -> Vec<Panel> {
    let mut counts: Vec<Option<usize>> = Vec::new();
    for r in results {
        if !counts.contains(&r.threads) {
            counts.push(r.threads);
        }
    }
    let mut panels = Vec::new();
    for threads in counts {
        for section in Section::ALL {
            let rows: Vec<&Measured> = results
                .iter()
                .filter(|r| r.threads == threads && r.case.section() == section)
                .collect();
            let Some(first) = rows.first() else {
                continue;
            };
            let keys = peer_keys(rows.iter().copied());
            let mut series = vec!["ours".to_string()];
            series.extend(keys.iter().map(|k| k.to_string()));
            let groups = rows
                .iter()
                .map(|r| {
                    let work: Work = r.case.work();
                    let mut values = vec![r.ours.as_ref().ok().map(|t| work.per_second(t.median))];
                    values.extend(keys.iter().map(|k| {
                        r.peers
                            .iter()
                            .find(|p| p.key == *k)
                            .and_then(|p| p.timing.as_ref().ok())
                            .map(|t| work.per_second(t.median))
                    }));
                    Group {
                        label: format!(
                            "{} {} {}",
                            r.case.name(),
                            r.case.dtype_label(),
                            r.case.shape_label()
                        ),
                        values,
                    }
                })
                .collect();
            let mut lines = Vec::new();
            if let Some(c) = ceilings_of(first, ceilings) {
                if section.in_bytes() {
                    lines.extend(c.copy_gbps.map(|v| ("copy".to_string(), v)));
                    lines.extend(c.read_gbps.map(|v| ("read".to_string(), v)));
                } else {
                    lines.extend(c.fma_f32_gflops.map(|v| ("f32 FMA peak".to_string(), v)));
                    if rows
                        .iter()
                        .any(|r| r.case.dtype == torsh_backend::DType::F64)
                    {
                        lines.extend(c.fma_f64_gflops.map(|v| ("f64 FMA peak".to_string(), v)));
                    }
                }
            }
            let unit = if section.in_bytes() {
                "GB/s"
            } else {
                "GFLOP/s"
            };
            let title = match threads {
                Some(n) => format!("{} — {n} thread(s)", section.title()),
                None => section.title().to_string(),
            };
            panels.push(Panel {
                title,
                unit,
                series,
                groups,
                lines,
            });
        }
    }
    panels
}

/// Height of a panel's bar area.
fn bars_height(p: &Panel) -> f64 {
    let group = p.series.len() as f64 * (BAR_H + BAR_GAP) + GROUP_GAP;
    p.groups.len() as f64 * group
}

/// Draws `p` with its top at `top`; returns the SVG elements.
fn draw_panel(p: &Panel, top: f64) -> String {
    let mut out = String::new();
    let x0 = LABEL_W;
    out += &format!(
        "<text x=\"10\" y=\"{:.1}\" class=\"title\">{}</text>\n",
        top + 16.0,
        escape(&p.title)
    );
    // Legend.
    let mut lx = x0;
    for (i, name) in p.series.iter().enumerate() {
        let colour = colour(name, i);
        out += &format!(
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"10\" fill=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            top + 26.0,
            lx + 16.0,
            top + 35.0,
            escape(name)
        );
        lx += 30.0 + 7.5 * name.chars().count() as f64;
    }
    let bars_top = top + PANEL_HEAD;
    let height = bars_height(p);
    let max = p
        .groups
        .iter()
        .flat_map(|g| g.values.iter().flatten())
        .chain(p.lines.iter().map(|(_, v)| v))
        .fold(0.0f64, |a, &b| a.max(b));
    let step = tick_step(max.max(1e-9), 6.0);
    let axis_max = (max / step).ceil().max(1.0) * step;
    let scale = |v: f64| x0 + v / axis_max * PLOT_W;
    // Grid and ticks.
    let ticks = (axis_max / step).round() as usize;
    for i in 0..=ticks {
        let v = step * i as f64;
        let x = scale(v);
        out += &format!(
            "<line x1=\"{x:.1}\" y1=\"{bars_top:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" class=\"grid\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            bars_top + height,
            bars_top + height + 14.0,
            short(v)
        );
    }
    out += &format!(
        "<line x1=\"{x0:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" class=\"axis\"/>\
         <line x1=\"{x0:.1}\" y1=\"{bars_top:.1}\" x2=\"{x0:.1}\" y2=\"{:.1}\" class=\"axis\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"label\">{}</text>\n",
        bars_top + height,
        x0 + PLOT_W,
        bars_top + height,
        bars_top + height,
        x0 + PLOT_W / 2.0,
        bars_top + height + 32.0,
        p.unit
    );
    // Bars.
    let group_h = p.series.len() as f64 * (BAR_H + BAR_GAP) + GROUP_GAP;
    for (g, group) in p.groups.iter().enumerate() {
        let gy = bars_top + GROUP_GAP / 2.0 + g as f64 * group_h;
        let mid = gy + (group_h - GROUP_GAP) / 2.0 + 4.0;
        out += &format!(
            "<text x=\"{:.1}\" y=\"{mid:.1}\" text-anchor=\"end\">{}</text>\n",
            x0 - 6.0,
            escape(&group.label)
        );
        for (i, value) in group.values.iter().enumerate() {
            let Some(v) = value else { continue };
            let y = gy + i as f64 * (BAR_H + BAR_GAP);
            let w = (scale(*v) - x0).max(0.5);
            out += &format!(
                "<rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{BAR_H}\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" class=\"value\">{}</text>\n",
                colour(&p.series[i], i),
                x0 + w + 3.0,
                y + BAR_H - 1.0,
                short(*v)
            );
        }
    }
    // Ceilings: the label of the highest line right of it, the others left of theirs.
    let highest = p.lines.iter().map(|(_, v)| *v).fold(0.0f64, f64::max);
    for (name, v) in &p.lines {
        let x = scale(*v);
        let (lx, anchor) = if *v >= highest {
            (x + 3.0, "start")
        } else {
            (x - 3.0, "end")
        };
        out += &format!(
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" class=\"ceiling\"/>\
             <text x=\"{lx:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\" class=\"ceiling-label\">{} {}</text>\n",
            bars_top - 8.0,
            bars_top + height,
            bars_top - 2.0,
            escape(name),
            short(*v)
        );
    }
    out
}

/// The whole chart.
pub fn svg(title: &str, results: &[Measured], ceilings: &[Ceilings]) -> String {
    let panels = panels(results, ceilings);
    let mut body = String::new();
    let mut y = 40.0;
    for p in &panels {
        body += &draw_panel(p, y);
        y += PANEL_HEAD + bars_height(p) + PANEL_FOOT + 16.0;
    }
    if panels.is_empty() {
        body += "<text x=\"10\" y=\"60\">no results</text>\n";
        y += 40.0;
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{y:.0}\" \
         viewBox=\"0 0 {WIDTH} {y:.0}\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"11\">\n\
         <style>\
         .title {{ font-size: 13px; font-weight: bold; }} \
         .label {{ font-size: 12px; }} \
         .value {{ font-size: 9px; fill: #333; }} \
         .grid {{ stroke: #ddd; stroke-width: 1; }} \
         .axis {{ stroke: #333; stroke-width: 1; }} \
         .ceiling {{ stroke: #000; stroke-width: 1.2; stroke-dasharray: 5,3; }} \
         .ceiling-label {{ font-size: 10px; }}\
         </style>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" class=\"title\">{}</text>\n{body}</svg>\n",
        escape(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(200.0, 6.0), 50.0);
        assert_eq!(tick_step(31.0, 6.0), 10.0);
        assert!((tick_step(0.9, 6.0) - 0.2).abs() < 1e-12);
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }

    #[test]
    fn an_empty_run_is_still_an_svg() {
        let s = svg("t", &[], &[]);
        assert!(s.contains("<svg") && s.ends_with("</svg>\n"));
    }
}
