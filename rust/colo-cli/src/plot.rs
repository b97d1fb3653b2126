//! `colo bench --plot FILE.png`: round-trip p50 per size and throughput, one bar per transport.

use crate::bench::Row;
use plotters::prelude::*;
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
        .x_label_area_size(110)
        .y_label_area_size(60)
        .build_cartesian_2d(0..rows.len(), 0.0..max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len())
        .x_label_formatter(&|i| rows.get(*i).map_or(String::new(), |r| format!("{} {}", r.case, r.transport)))
        .x_label_style(TextStyle::from((FONT, 11).into_font()).transform(FontTransform::Rotate90))
        .y_desc(unit)
        .draw()?;
    chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
        Rectangle::new([(i, 0.0), (i + 1, value(r))], color(&r.transport).filled())
    }))?;
    Ok(())
}

/// Draws the rows of a bench run.
pub fn draw(rows: &[Row], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(450);
    let rtt: Vec<&Row> = rows.iter().filter(|r| r.group == "round trip" && r.case == "64 B").collect();
    let tput: Vec<&Row> = rows.iter().filter(|r| r.unit == "GB/s").collect();
    panel(&top, "64 B round trip, p50 (lower is better)", &rtt, |r| r.p50_us.unwrap_or(0.0), "microseconds")?;
    panel(&bottom, "one-way throughput (higher is better)", &tput, |r| r.rate.unwrap_or(0.0), "GB/s")?;
    root.present()?;
    Ok(())
}
