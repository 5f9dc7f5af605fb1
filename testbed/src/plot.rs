//! Plots of a run (SVG and PNG, drawn by plotters): throughput against the swept parameter,
//! per-target utilisation, and the aggregate rate over time.

use std::path::Path;

use plotters::prelude::*;

use crate::error::TestbedError;
use crate::Report;

/// Plots need a font to measure and draw text: the system's DejaVu Sans (Debian's
/// fonts-dejavu-core), registered once; without it only the CSVs are written.
fn font_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        for p in [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
        ] {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        eprintln!(
            "lode sim: no DejaVuSans.ttf found (apt-get install fonts-dejavu-core); CSVs only"
        );
        false
    })
}

struct Ctx {
    title: String,
    xs: Vec<f64>,
    ys: Vec<f64>,
    x_label: String,
    y_label: String,
    bars: bool,
}

fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    c: &Ctx,
) -> Result<(), TestbedError>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| TestbedError::Plot(format!("{e:?}"));
    let xmax = c.xs.iter().copied().fold(0.0, f64::max).max(1e-9);
    let xmin = c.xs.iter().copied().fold(f64::INFINITY, f64::min).min(0.0);
    let ymax = c.ys.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.1;
    let pad = if c.bars { 1.0 } else { 0.0 };
    let mut ch = ChartBuilder::on(area)
        .caption(&c.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin - pad * 0.5)..(xmax + pad * 0.5), 0.0..ymax)
        .map_err(e)?;
    ch.configure_mesh()
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    if c.bars {
        ch.draw_series(
            c.xs.iter().zip(&c.ys).map(|(x, y)| {
                Rectangle::new([(x - 0.4, 0.0), (x + 0.4, *y)], BLUE.mix(0.7).filled())
            }),
        )
        .map_err(e)?;
    } else {
        ch.draw_series(LineSeries::new(
            c.xs.iter().copied().zip(c.ys.iter().copied()),
            BLUE.stroke_width(2),
        ))
        .map_err(e)?;
        ch.draw_series(
            c.xs.iter()
                .zip(&c.ys)
                .map(|(x, y)| Circle::new((*x, *y), 4, BLUE.filled())),
        )
        .map_err(e)?;
    }
    Ok(())
}

fn draw(out: &Path, name: &str, c: &Ctx) -> Result<(), TestbedError> {
    if !font_ready() {
        return Ok(()); // the CSVs hold everything the plots show
    }
    let svg = out.join(format!("{name}.svg"));
    {
        let area = SVGBackend::new(&svg, (900, 560)).into_drawing_area();
        area.fill(&WHITE)
            .map_err(|e| TestbedError::Plot(format!("{e:?}")))?;
        chart(&area, c)?;
        area.present()
            .map_err(|e| TestbedError::Plot(format!("{e:?}")))?;
    }
    let png = out.join(format!("{name}.png"));
    let area = BitMapBackend::new(&png, (900, 560)).into_drawing_area();
    area.fill(&WHITE)
        .map_err(|e| TestbedError::Plot(format!("{e:?}")))?;
    chart(&area, c)?;
    area.present()
        .map_err(|e| TestbedError::Plot(format!("{e:?}")))?;
    Ok(())
}

fn scale(unit: &str) -> (f64, &'static str) {
    if unit == "B" {
        (1e9, "GB/s")
    } else {
        (1.0, "ops/s")
    }
}

pub fn plot_sweep(out: &Path, rs: &[Report]) -> Result<(), TestbedError> {
    let param = rs[0].parameter.clone().unwrap_or_default();
    let (div, u) = scale(rs[0].unit);
    // Values as numbers where they are (stripe_count = -1 shows as "all" at the far right).
    let numeric: Vec<Option<f64>> = rs
        .iter()
        .map(|r| r.value.as_deref().and_then(|v| v.parse::<f64>().ok()))
        .collect();
    let max = numeric.iter().flatten().copied().fold(0.0, f64::max);
    let xs: Vec<f64> = numeric
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Some(v) if *v >= 0.0 => *v,
            Some(_) => max * 1.25 + 1.0,
            None => i as f64,
        })
        .collect();
    let c = Ctx {
        title: format!("aggregate throughput against {param} (-1 plotted at the right)"),
        xs,
        ys: rs.iter().map(|r| r.aggregate_rate() / div).collect(),
        x_label: param,
        y_label: u.into(),
        bars: false,
    };
    draw(out, "throughput", &c)
}

pub fn plot_targets(out: &Path, i: usize, r: &Report) -> Result<(), TestbedError> {
    let c = Ctx {
        title: format!(
            "per-target load, run {i}{}",
            r.value
                .as_deref()
                .map(|v| format!(" ({} = {v})", r.parameter.as_deref().unwrap_or("")))
                .unwrap_or_default()
        ),
        xs: (0..r.target_amount.len()).map(|t| t as f64).collect(),
        ys: r.target_utilisation.iter().map(|u| u * 100.0).collect(),
        x_label: "target".into(),
        y_label: "utilisation %".into(),
        bars: true,
    };
    draw(out, &format!("targets-{i}"), &c)
}

pub fn plot_timeline(out: &Path, i: usize, r: &Report) -> Result<(), TestbedError> {
    let (div, u) = scale(r.unit);
    // A step line: each rate holds until the next event.
    let mut xs = vec![];
    let mut ys = vec![];
    for w in r.timeline.windows(2) {
        xs.extend([w[0].0, w[1].0]);
        ys.extend([w[0].1 / div, w[0].1 / div]);
    }
    let c = Ctx {
        title: format!("aggregate throughput over time, run {i}"),
        xs,
        ys,
        x_label: "seconds".into(),
        y_label: u.into(),
        bars: false,
    };
    draw(out, &format!("timeline-{i}"), &c)
}
