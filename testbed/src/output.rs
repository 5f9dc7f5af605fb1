//! A run's results as files: `runs.csv` (one line per point of the sweep) and, per point,
//! `clients-N.csv`, `targets-N.csv` and `timeline-N.csv`.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::TestbedError;
use crate::Report;

fn write(path: &Path, text: String) -> Result<(), TestbedError> {
    std::fs::write(path, text).map_err(|source| TestbedError::Io {
        path: path.to_owned(),
        source,
    })
}

pub fn write_summary(out: &Path, rs: &[Report]) -> Result<(), TestbedError> {
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
        )
        .expect("writing to a String cannot fail");
    }
    write(&out.join("runs.csv"), s)?;
    Ok(())
}

pub fn write_run(out: &Path, i: usize, r: &Report) -> Result<(), TestbedError> {
    let mut s = String::from("client,amount,completion_s,rate_per_s\n");
    for (c, ((a, f), x)) in r
        .client_amount
        .iter()
        .zip(&r.client_finish)
        .zip(r.client_rates())
        .enumerate()
    {
        writeln!(s, "{c},{a},{f},{x}").expect("writing to a String cannot fail");
    }
    write(&out.join(format!("clients-{i}.csv")), s)?;
    let mut s = String::from("target,amount,utilisation\n");
    for (t, (a, u)) in r
        .target_amount
        .iter()
        .zip(&r.target_utilisation)
        .enumerate()
    {
        writeln!(s, "{t},{a},{u}").expect("writing to a String cannot fail");
    }
    write(&out.join(format!("targets-{i}.csv")), s)?;
    let mut s = String::from("time_s,aggregate_per_s\n");
    for (t, x) in &r.timeline {
        writeln!(s, "{t},{x}").expect("writing to a String cannot fail");
    }
    write(&out.join(format!("timeline-{i}.csv")), s)?;
    Ok(())
}
