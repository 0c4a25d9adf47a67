//! Command line: clap derive, every flag also readable from a `GPU_REAPER_…` environment
//! variable. Parsing only; typed configuration is built by the subcommands.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// gpu-reaper: find idle GPUs, warn their owners, reclaim what stays idle.
#[derive(Parser, Debug)]
#[command(name = "gpu-reaper", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "GPU_REAPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions as multi-document YAML.
    Crd,
    /// Replay recorded telemetry through a policy: what it would have warned about, what
    /// it would have reclaimed, and what it would have regretted.
    Backtest(BacktestArgs),
}

/// `gpu-reaper backtest`.
#[derive(clap::Args, Debug, Clone)]
pub struct BacktestArgs {
    /// GpuPolicy YAML. Default: the bundled sample policy (config/samples/policy.yaml).
    #[arg(long, env = "GPU_REAPER_POLICY")]
    pub policy: Option<PathBuf>,
    /// OpenMetrics text with timestamps (optionally .gz): DCGM exporter and
    /// kube-state-metrics series. Default: the bundled sample trace.
    #[arg(long, env = "GPU_REAPER_TRACE")]
    pub trace: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table, env = "GPU_REAPER_FORMAT")]
    pub format: OutputFormat,
    /// Also draw a timeline per workload into this SVG file.
    #[arg(long, env = "GPU_REAPER_SVG")]
    pub svg: Option<PathBuf>,
    /// Evaluation step, as the controller's `--interval` (Go duration).
    #[arg(long, default_value = "1m", env = "GPU_REAPER_STEP")]
    pub step: String,
    /// An action is a regret if activity resumes within this long (Go duration).
    #[arg(long, default_value = "2h", env = "GPU_REAPER_REGRET_HORIZON")]
    pub regret_horizon: String,
    /// Skip metric families gpu-reaper does not read instead of failing on them.
    #[arg(long, env = "GPU_REAPER_SKIP_UNKNOWN_METRICS")]
    pub skip_unknown_metrics: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Table,
    Json,
    Csv,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}
