//! `colo bench --plot FILE.png`: round-trip p50 per size and throughput, one bar per transport.

use crate::results::Row;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const FONT: &str = "sans-serif";

fn color(transport: &str) -> RGBColor {
    match transport {
        "tcp" => RGBColor(200, 80, 60),
        "unix" => RGBColor(230, 160, 40),
        "colo" => RGBColor(40, 120, 200),
        t if t.starts_with("colo msg") => RGBColor(40, 170, 110),
        t if t.starts_with("bare") => RGBColor(120, 120, 120),
        _ => RGBColor(100, 90, 190),
    }
}

fn panel(area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>, title: &str, rows: &[&Row], value: impl Fn(&Row) -> f64, unit: &str) -> Result<(), Box<dyn std::error::Error>> {
    let max = rows.iter().map(|r| value(r)).fold(0.0, f64::max).max(1e-9) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        // A segmented `0..n` has a slot for `n` too: `0..n - 1` gives exactly one per row.
        .build_cartesian_2d((0..rows.len().saturating_sub(1)).into_segmented(), 0.0..max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => rows.get(*i).map_or(String::new(), |r| label(r)),
            _ => String::new(),
        })
        .x_label_style((FONT, 13))
        .y_desc(unit)
        .draw()?;
    chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
        let mut bar = Rectangle::new(
            [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), value(r))],
            color(&r.transport).filled(),
        );
        bar.set_margin(0, 0, 6, 6);
        bar
    }))?;
    // The value above each bar: small ones (colo's round trips) are otherwise invisible.
    chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
        let v = value(r);
        let text = if v >= 10.0 { format!("{v:.1}") } else { format!("{v:.2}") };
        Text::new(text, (SegmentValue::CenterOf(i), v + max * 0.01), TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom)))
    }))?;
    Ok(())
}

/// A bar's label: the transport, and the write size where a panel has several.
fn label(r: &Row) -> String {
    if r.group == "throughput" {
        format!("{} {}", r.case.trim_end_matches(" writes"), r.transport)
    } else {
        r.transport.clone()
    }
}

/// Fonts tried for labels (plotters draws text with ab_glyph and needs a TrueType file).
const FONT_FILES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn load_font() -> Result<(), Box<dyn std::error::Error>> {
    for f in FONT_FILES {
        if let Ok(bytes) = std::fs::read(f) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes).map_err(|_| "bad font file")?;
            return Ok(());
        }
    }
    Err("no TrueType font found for the plot labels (install fonts-dejavu-core)".into())
}

/// Draws the rows of a bench run.
pub fn draw(rows: &[Row], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    load_font()?;
    let root = BitMapBackend::new(path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(450);
    let rtt: Vec<&Row> = rows.iter().filter(|r| r.group == "round trip" && r.case == "64 B").collect();
    // Zero-copy messages move descriptors, not bytes: on this scale they would flatten the rest.
    let tput: Vec<&Row> = rows.iter().filter(|r| r.unit == "GB/s" && !r.transport.contains("zero-copy")).collect();
    panel(&top, "64 B round trip, p50 (lower is better)", &rtt, |r| r.p50_us.unwrap_or(0.0), "microseconds")?;
    panel(&bottom, "one-way stream throughput (higher is better)", &tput, |r| r.rate.unwrap_or(0.0), "GB/s")?;
    root.present()?;
    Ok(())
}
