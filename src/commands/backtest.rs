//! `gpu-reaper backtest`: the CLI edge. Reads the policy and trace (files or the bundled
//! samples), runs the pure replay, prints the report and writes the SVG.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::GzDecoder;
use jiff::{SignedDuration, Timestamp};

use crate::api::GpuPolicy;
use crate::api::validate::parse_resource;
use crate::backtest::{self, BacktestOptions};
use crate::cli::{BacktestArgs, OutputFormat, PrometheusArgs, Since};
use crate::error::{Error, Result};
use crate::telemetry::coverage::Coverage;
use crate::telemetry::prometheus::PrometheusSource;
use crate::telemetry::trace::{ReadOptions, Trace, read_trace};

pub use crate::backtest::samples::{SAMPLE_POLICY, SAMPLE_TRACE_GZ};

/// Runs the command and prints its report to stdout.
pub fn run(args: &BacktestArgs) -> Result<()> {
    let out = execute(args)?;
    print!("{out}");
    Ok(())
}

/// Runs the command and returns what it prints.
pub fn execute(args: &BacktestArgs) -> Result<String> {
    let (step, regret_horizon, warmup) = (args.step, args.regret_horizon, args.warmup);
    if step.as_secs() < 1 {
        return Err(Error::InvalidArgument {
            flag: "step",
            message: "must be at least 1s, e.g. 1m".into(),
        });
    }
    let policy = load_policy(args.policy.as_deref())?;
    let options = ReadOptions {
        workload_labels: workload_labels(&args.prometheus),
        step_seconds: step.as_secs(),
        skip_unknown_metrics: args.skip_unknown_metrics,
    };
    let trace = match (&args.prometheus.prometheus_url, &args.synthetic) {
        (Some(url), _) => {
            let (from, to) = time_range(args.from, args.to)?;
            let (trace, coverage) = fetch_trace(&args.prometheus, from, to, &options)?;
            // Rather than "0 workloads on 0 GPUs": which series or labels are missing.
            coverage.check(url, from, to)?;
            trace
        }
        (None, Some(mix)) => synthetic_trace(mix, &options)?,
        (None, None) => load_trace(args.trace.as_deref(), &options)?,
    };
    let length = (trace.last_bucket + 1 - trace.first_bucket) * trace.step_seconds;
    if warmup.as_secs() >= length {
        return Err(Error::InvalidArgument {
            flag: "warmup",
            message: format!(
                "{} leaves nothing of the {} trace to evaluate: use a shorter warm-up, e.g. --warmup {}",
                crate::engine::classify::human(warmup),
                crate::engine::classify::human(SignedDuration::from_secs(length)),
                crate::engine::classify::human(SignedDuration::from_secs(length / 4)),
            ),
        });
    }
    let name = policy
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "unnamed".into());
    if args.sweep {
        let after = crate::engine::rules::dur(&policy.spec.action.after);
        if let Some(short) = args.max_idle.iter().find(|m| **m < after) {
            return Err(Error::InvalidArgument {
                flag: "max-idle",
                message: format!(
                    "{} is shorter than the policy's action.after ({}): a ceiling comes after the action is first allowed; use --max-idle {} or longer",
                    crate::engine::classify::human(*short),
                    crate::engine::classify::human(after),
                    crate::engine::classify::human(after),
                ),
            });
        }
        let spec = crate::backtest::sweep::SweepSpec {
            max_idle: args.max_idle.clone(),
            ..crate::backtest::sweep::SweepSpec::default()
        };
        let points = crate::backtest::sweep::sweep(
            &policy.spec,
            &trace,
            &spec,
            regret_horizon,
            warmup,
            args.history_backfill.0,
        );
        if let Some(path) = &args.svg {
            let title = format!("{name}: reclaimed GPU-hours against regret rate");
            std::fs::write(path, crate::report::svg::frontier(&title, &points)).map_err(
                |source| Error::Io {
                    path: path.clone(),
                    source,
                },
            )?;
        }
        return Ok(match args.format {
            OutputFormat::Table => {
                let cold = warmup.is_zero() && policy.spec.uses_idle_history();
                crate::report::render::sweep_table(&name, &points, cold)
            }
            OutputFormat::Json => {
                serde_json::to_string_pretty(&points)
                    .map_err(|e| Error::Serialize(e.to_string()))?
                    + "\n"
            }
            OutputFormat::Csv => crate::report::render::sweep_csv(&points),
        });
    }
    let result = backtest::run(
        &name,
        &policy.spec,
        &trace,
        &BacktestOptions {
            regret_horizon,
            keep_timelines: args.svg.is_some(),
            warmup,
            history_backfill: args.history_backfill.0,
        },
    );
    if let Some(path) = &args.svg {
        std::fs::write(path, crate::report::svg::timeline(&result)).map_err(|source| {
            Error::Io {
                path: path.clone(),
                source,
            }
        })?;
    }
    Ok(match args.format {
        OutputFormat::Table => crate::report::render::table(&result),
        OutputFormat::Json => crate::report::render::json(&result)? + "\n",
        OutputFormat::Csv => crate::report::render::csv(&result),
    })
}

/// `--synthetic inference=143,hours=24,seed=1`: a generated trace (backtest::synth).
pub fn synthetic_trace(spec: &str, options: &ReadOptions) -> Result<Trace> {
    use crate::backtest::synth::{InferenceModel, Mix, write};
    let bad = |message: String| Error::InvalidArgument {
        flag: "synthetic",
        message,
    };
    let mut mix = Mix {
        inference: 0,
        ..Mix::default()
    };
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("{part:?} is not key=value, e.g. inference=143")))?;
        let number: u64 = value.trim().parse().map_err(|_| {
            bad(format!(
                "{key}={value:?}: the value must be a whole number, e.g. {key}=10"
            ))
        })?;
        let small = || {
            u32::try_from(number)
                .ok()
                .filter(|n| *n <= 100_000)
                .ok_or_else(|| bad(format!("{key}={number} is too large (at most 100000)")))
        };
        match key.trim() {
            "inference" => mix.inference = small()?,
            "replicas" => mix.replicas = small()?.clamp(1, 64),
            "notebooks" => mix.notebooks = small()?,
            "hungJobs" => mix.hung_jobs = small()?,
            "crashLoops" => mix.crash_loops = small()?,
            "hours" => mix.hours = small()?.clamp(1, 24 * 60),
            "seed" => mix.seed = number,
            other => {
                return Err(bad(format!(
                    "unknown key {other:?}; the keys are inference, replicas, notebooks, hungJobs, crashLoops, hours, seed"
                )));
            }
        }
    }
    if mix.inference + mix.notebooks + mix.hung_jobs + mix.crash_loops == 0 {
        return Err(bad(
            "generates no workload: give a count, e.g. inference=143,hours=24".into(),
        ));
    }
    mix.step_seconds = u32::try_from(options.step_seconds.clamp(1, 3600)).unwrap_or(60);
    let mut text = Vec::new();
    write(&mix, &InferenceModel::default(), &mut text)
        .map_err(|e| Error::Serialize(format!("generating the synthetic trace: {e}")))?;
    Ok(read_trace(
        BufReader::new(&text[..]),
        "<synthetic>",
        options,
    )?)
}

/// `--from`/`--since` (a time, or a duration before the end) and `--to` (default now) as
/// unix seconds.
pub fn time_range(from: Since, to: Option<Timestamp>) -> Result<(i64, i64)> {
    let to = to.unwrap_or_else(Timestamp::now);
    let from = from.before(to);
    if from >= to {
        return Err(Error::InvalidArgument {
            flag: "from",
            message: format!("{from} is not before --to {to}"),
        });
    }
    Ok((from.as_second(), to.as_second()))
}

/// Pulls a trace from Prometheus, with what the history holds.
pub fn fetch_trace(
    args: &PrometheusArgs,
    from: i64,
    to: i64,
    options: &ReadOptions,
) -> Result<(Trace, Coverage)> {
    let source = PrometheusSource::new(prometheus_config(args)?)?;
    Ok(block_on(source.fetch_trace(from, to, options))??)
}

use super::{block_on, prometheus_config, workload_labels};

/// The policy from `path`, or the bundled sample.
pub fn load_policy(path: Option<&Path>) -> Result<GpuPolicy> {
    match path {
        None => Ok(crate::backtest::samples::sample_policy()?),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| Error::Io {
                path: p.to_path_buf(),
                source,
            })?;
            Ok(parse_resource::<GpuPolicy>(
                &text,
                &p.display().to_string(),
            )?)
        }
    }
}

/// The trace from `path` (plain or gzip), or the bundled sample.
pub fn load_trace(path: Option<&Path>, options: &ReadOptions) -> Result<Trace> {
    match path {
        None => Ok(read_trace(
            BufReader::new(GzDecoder::new(SAMPLE_TRACE_GZ)),
            crate::backtest::samples::SAMPLE_TRACE_SOURCE,
            options,
        )?),
        Some(p) => {
            let file = File::open(p).map_err(|source| Error::Io {
                path: p.to_path_buf(),
                source,
            })?;
            let mut reader = BufReader::with_capacity(1 << 20, file);
            let gz = reader
                .fill_buf()
                .map_err(|source| Error::Io {
                    path: p.to_path_buf(),
                    source,
                })?
                .starts_with(&[0x1f, 0x8b]);
            let input: Box<dyn Read> = if gz {
                Box::new(GzDecoder::new(reader))
            } else {
                Box::new(reader)
            };
            let mut input = BufReader::with_capacity(1 << 20, input);
            let source = p.display().to_string();
            // A `dcgmi dmon` CSV export (e.g. MIGProfiler's traces) instead of OpenMetrics.
            let head = input.fill_buf().map_err(|source| Error::Io {
                path: p.to_path_buf(),
                source,
            })?;
            if crate::telemetry::dmon::is_dmon_header(
                head.split(|&b| b == b'\n').next().unwrap_or(head),
            ) {
                let identity = crate::telemetry::dmon::DmonIdentity::for_file(&source);
                return Ok(crate::telemetry::dmon::read_dmon(
                    input, &source, options, &identity,
                )?);
            }
            Ok(read_trace(input, &source, options)?)
        }
    }
}
