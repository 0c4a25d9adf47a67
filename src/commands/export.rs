//! `gpu-reaper export`: the CLI edge. Reads from Prometheus exactly what `backtest
//! --prometheus-url` reads (the same reader, `PrometheusSource::read_history`) and writes
//! it as OpenMetrics text (`telemetry::openmetrics_writer`), gzip when the file name ends
//! in `.gz`: the trace `backtest --trace` replays. A history that lacks the DCGM or
//! kube-state-metrics series a backtest needs is refused, naming what is missing.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::cli::ExportArgs;
use crate::commands::backtest::time_range;
use crate::commands::{block_on, prometheus_config, workload_labels};
use crate::error::{Error, Result};
use crate::telemetry::coverage::Coverage;
use crate::telemetry::openmetrics_writer::OpenMetricsWriter;
use crate::telemetry::prometheus::{PrometheusConfig, PrometheusSource};
use crate::telemetry::trace::WorkloadLabels;

/// What to export and where, checked once from the flags.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    pub prometheus: PrometheusConfig,
    /// Unix seconds: samples stamped from `from` to `to`, both included.
    pub from: i64,
    pub to: i64,
    pub workload_labels: WorkloadLabels,
    /// The file (gzip when it ends in `.gz`); `None`: standard output.
    pub output: Option<PathBuf>,
}

impl ExportConfig {
    pub fn from_args(args: &ExportArgs) -> Result<Self> {
        let prometheus = prometheus_config(&args.prometheus)?;
        let (from, to) = time_range(args.from, args.to)?;
        if let Some(path) = &args.output {
            let bad = |message: String| Error::InvalidArgument {
                flag: "output",
                message,
            };
            if path.is_dir() {
                return Err(bad(format!(
                    "{} is a directory: name a file, e.g. {}",
                    path.display(),
                    path.join("trace.om.gz").display()
                )));
            }
            let dir = parent(path);
            if !dir.is_dir() {
                return Err(bad(format!(
                    "the directory {} does not exist",
                    dir.display()
                )));
            }
        }
        Ok(Self {
            prometheus,
            from,
            to,
            workload_labels: workload_labels(&args.prometheus),
            output: args.output.clone(),
        })
    }
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    pub samples: u64,
    pub coverage: Coverage,
}

/// Runs the command: the trace to the file (or stdout), a one-line summary to stderr.
pub fn run(args: &ExportArgs) -> Result<()> {
    let config = ExportConfig::from_args(args)?;
    let exported = execute(&config)?;
    let time =
        |t: i64| jiff::Timestamp::from_second(t).map_or_else(|_| t.to_string(), |t| t.to_string());
    eprintln!(
        "exported {} samples of {} DCGM and {} kube-state-metrics series from {} to {}{}",
        exported.samples,
        exported.coverage.dcgm_series,
        exported.coverage.ksm_series,
        time(config.from),
        time(config.to),
        config
            .output
            .as_ref()
            .map(|p| format!(" to {}", p.display()))
            .unwrap_or_default()
    );
    Ok(())
}

/// Exports the history `config` names. A file is written beside its final name and
/// renamed once complete and checked, so a failed export leaves no partial trace.
pub fn execute(config: &ExportConfig) -> Result<Exported> {
    let source = PrometheusSource::new(config.prometheus.clone())?;
    let Some(path) = &config.output else {
        let stdout = std::io::stdout().lock();
        let (out, exported) = export_to(&source, config, BufWriter::new(stdout), "<stdout>")?;
        drop(out);
        return Ok(exported);
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "trace".into());
    let partial = parent(path).join(format!(".{name}.partial-{}", std::process::id()));
    let io = |source: std::io::Error| Error::Io {
        path: partial.clone(),
        source,
    };
    let file = BufWriter::with_capacity(1 << 20, File::create(&partial).map_err(io)?);
    let written = if is_gzip(path) {
        export_to(
            &source,
            config,
            GzEncoder::new(file, Compression::default()),
            &partial.display().to_string(),
        )
        .and_then(|(gz, exported)| {
            let file = gz.finish().map_err(io)?;
            file.into_inner()
                .map_err(|e| io(e.into_error()))?
                .sync_all()
                .map_err(io)?;
            Ok(exported)
        })
    } else {
        export_to(&source, config, file, &partial.display().to_string()).and_then(
            |(file, exported)| {
                file.into_inner()
                    .map_err(|e| io(e.into_error()))?
                    .sync_all()
                    .map_err(io)?;
                Ok(exported)
            },
        )
    };
    let exported = match written {
        Ok(exported) => exported,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, path).map_err(|source| {
        let _ = std::fs::remove_file(&partial);
        Error::Io {
            path: path.clone(),
            source,
        }
    })?;
    Ok(exported)
}

/// Reads the history into `out` as OpenMetrics text and checks what it holds.
fn export_to<W: Write>(
    source: &PrometheusSource,
    config: &ExportConfig,
    out: W,
    out_name: &str,
) -> Result<(W, Exported)> {
    let mut writer = OpenMetricsWriter::new(out);
    // A write error stops the read; it is reported as the file's, not as the query's.
    let mut write_error = None;
    let read =
        block_on(
            source.read_history(config.from, config.to, &config.workload_labels, &mut |s| {
                writer.write(s).map_err(|e| {
                    let message = e.to_string();
                    write_error = Some(e);
                    message
                })
            }),
        )?;
    let io = |source: std::io::Error| Error::Io {
        path: out_name.into(),
        source,
    };
    if let Some(e) = write_error {
        return Err(io(e));
    }
    let coverage = read?;
    coverage.check(&config.prometheus.url, config.from, config.to)?;
    let samples = writer.samples();
    let out = writer.finish().map_err(io)?;
    Ok((out, Exported { samples, coverage }))
}

fn is_gzip(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
}

/// The directory `path` is in (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}
