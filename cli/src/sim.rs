//! `lode sim run EXPERIMENT.toml [--mode model|real] [--out DIR]`: runs an experiment of the
//! striping testbed and writes CSV files and plots (PNG and SVG).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use testbed::{load, run_model};

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
                testbed::run_real(p, budget_mbs * 1e6, move |done, total| {
                    b.set_length(total);
                    b.set_position(done);
                })?
            }
        };
        bar.finish_with_message(format!("in {:.2} s", t.elapsed().as_secs_f64()));
        out!(
            "  {}: {} in {:.3} s, {} flows, {} rate computations, wall time {:.2} s",
            label,
            rate(r.aggregate_rate(), r.unit),
            r.makespan,
            r.flows,
            r.events,
            t.elapsed().as_secs_f64()
        );
        testbed::output::write_run(&out, i, &r)?;
        testbed::plot::plot_targets(&out, i, &r)?;
        testbed::plot::plot_timeline(&out, i, &r)?;
        reports.push(r);
    }
    testbed::output::write_summary(&out, &reports)?;
    if reports.len() > 1 {
        testbed::plot::plot_sweep(&out, &reports)?;
    }
    out!("results in {}", out.display());
    Ok(())
}

fn rate(x: f64, unit: &str) -> String {
    if unit == "B" {
        format!("{:.2} GB/s", x / 1e9)
    } else {
        format!("{x:.0} {unit}/s")
    }
}
