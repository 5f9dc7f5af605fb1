//! `lode sim run EXPERIMENT.toml [--mode model|real] [--out DIR]`: runs an experiment of the
//! striping testbed and writes CSV files and plots (PNG and SVG).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use lnet::testbed::{load, run_model, Report};
use plotters::prelude::*;

#[derive(Subcommand)]
pub enum SimCmd {
    /// Run an experiment (every point of its sweep) and write CSVs and plots.
    Run {
        experiment: PathBuf,
        #[arg(long, value_enum, default_value = "model")]
        mode: Mode,
        /// Where the CSVs and plots go (default: beside the experiment, in NAME.out/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Real-code mode: the simulated traffic this machine carries through real code, in
        /// MB/s; the run is slowed down to stay under it.
        #[arg(long, default_value_t = 250.0)]
        budget_mbs: f64,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Mode {
    /// The flow model: fast, for any scale.
    Model,
    /// Real lode code over the simulated fabric.
    Real,
}

pub fn run(cmd: SimCmd) -> Result<()> {
    let SimCmd::Run {
        experiment,
        mode,
        out,
        budget_mbs,
    } = cmd;
    let text = std::fs::read_to_string(&experiment)
        .with_context(|| format!("reading {}", experiment.display()))?;
    let points = load(&text).with_context(|| format!("in {}", experiment.display()))?;
    let out = out.unwrap_or_else(|| experiment.with_extension("out"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut reports = vec![];
    for (i, p) in points.iter().enumerate() {
        let label = match (&p.parameter, &p.value) {
            (Some(k), Some(v)) => format!("{k} = {v}"),
            _ => "run".to_string(),
        };
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} flows done {msg}")
                .expect("a valid template"),
        );
        bar.set_prefix(format!("[{}/{}] {label}", i + 1, points.len()));
        let t = Instant::now();
        let r = match mode {
            Mode::Model => run_model(p, |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            })?,
            Mode::Real => {
                bar.set_style(
                    ProgressStyle::with_template("{prefix} [{bar:40}] {bytes}/{total_bytes} {msg}")
                        .expect("a valid template"),
                );
                let b = bar.clone();
                crate::real::run_real(p, budget_mbs * 1e6, move |done, total| {
                    b.set_length(total);
                    b.set_position(done);
                })?
            }
        };
        bar.finish_with_message(format!("in {:.2} s", t.elapsed().as_secs_f64()));
        println!(
            "  {}: {} in {:.3} s, {} flows, {} rate computations, wall time {:.2} s",
            label,
            rate(r.aggregate_rate(), r.unit),
            r.makespan,
            r.flows,
            r.events,
            t.elapsed().as_secs_f64()
        );
        write_run(&out, i, &r)?;
        plot_targets(&out, i, &r)?;
        plot_timeline(&out, i, &r)?;
        reports.push(r);
    }
    write_summary(&out, &reports)?;
    if reports.len() > 1 {
        plot_sweep(&out, &reports)?;
    }
    println!("results in {}", out.display());
    Ok(())
}

fn rate(x: f64, unit: &str) -> String {
    if unit == "B" {
        format!("{:.2} GB/s", x / 1e9)
    } else {
        format!("{x:.0} {unit}/s")
    }
}

fn write_summary(out: &Path, rs: &[Report]) -> Result<()> {
    let mut s = String::from(
        "run,parameter,value,unit,total,completion_s,aggregate_per_s,client_mean_per_s,client_min_per_s,client_max_per_s,target_util_mean,target_util_max\n",
    );
    for (i, r) in rs.iter().enumerate() {
        let c = r.client_rates();
        let mean = c.iter().sum::<f64>() / c.len().max(1) as f64;
        let min = c.iter().copied().fold(f64::INFINITY, f64::min);
        let max = c.iter().copied().fold(0.0, f64::max);
        let u = &r.target_utilisation;
        let umean = u.iter().sum::<f64>() / u.len().max(1) as f64;
        let umax = u.iter().copied().fold(0.0, f64::max);
        writeln!(
            s,
            "{i},{},{},{},{},{},{},{},{},{},{},{}",
            r.parameter.as_deref().unwrap_or(""),
            r.value.as_deref().unwrap_or(""),
            r.unit,
            r.total,
            r.makespan,
            r.aggregate_rate(),
            mean,
            min,
            max,
            umean,
            umax
        )?;
    }
    std::fs::write(out.join("runs.csv"), s)?;
    Ok(())
}

fn write_run(out: &Path, i: usize, r: &Report) -> Result<()> {
    let mut s = String::from("client,amount,completion_s,rate_per_s\n");
    for (c, ((a, f), x)) in r
        .client_amount
        .iter()
        .zip(&r.client_finish)
        .zip(r.client_rates())
        .enumerate()
    {
        writeln!(s, "{c},{a},{f},{x}")?;
    }
    std::fs::write(out.join(format!("clients-{i}.csv")), s)?;
    let mut s = String::from("target,amount,utilisation\n");
    for (t, (a, u)) in r
        .target_amount
        .iter()
        .zip(&r.target_utilisation)
        .enumerate()
    {
        writeln!(s, "{t},{a},{u}")?;
    }
    std::fs::write(out.join(format!("targets-{i}.csv")), s)?;
    let mut s = String::from("time_s,aggregate_per_s\n");
    for (t, x) in &r.timeline {
        writeln!(s, "{t},{x}")?;
    }
    std::fs::write(out.join(format!("timeline-{i}.csv")), s)?;
    Ok(())
}

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

fn chart<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, c: &Ctx) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e:?}");
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

fn draw(out: &Path, name: &str, c: &Ctx) -> Result<()> {
    if !font_ready() {
        return Ok(()); // the CSVs hold everything the plots show
    }
    let svg = out.join(format!("{name}.svg"));
    {
        let area = SVGBackend::new(&svg, (900, 560)).into_drawing_area();
        area.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        chart(&area, c)?;
        area.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let png = out.join(format!("{name}.png"));
    let area = BitMapBackend::new(&png, (900, 560)).into_drawing_area();
    area.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart(&area, c)?;
    area.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

fn scale(unit: &str) -> (f64, &'static str) {
    if unit == "B" {
        (1e9, "GB/s")
    } else {
        (1.0, "ops/s")
    }
}

fn plot_sweep(out: &Path, rs: &[Report]) -> Result<()> {
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

fn plot_targets(out: &Path, i: usize, r: &Report) -> Result<()> {
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

fn plot_timeline(out: &Path, i: usize, r: &Report) -> Result<()> {
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
