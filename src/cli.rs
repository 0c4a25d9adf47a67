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
    /// Read-only waste report of the last hours from Prometheus: idle GPU-hours by shape
    /// and namespace, dollars, top offenders. Changes nothing.
    Audit(AuditArgs),
}

/// Where Prometheus is and how to talk to it.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PrometheusArgs {
    /// Prometheus (or Thanos/Mimir query) base URL.
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// Bearer token file, re-read on every request.
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_BEARER_TOKEN_FILE")]
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// Basic-auth user for Prometheus (with --prometheus-basic-auth-password-file).
    #[arg(
        long,
        env = "GPU_REAPER_PROMETHEUS_BASIC_AUTH_USER",
        requires = "prometheus_basic_auth_password_file"
    )]
    pub prometheus_basic_auth_user: Option<String>,
    /// File holding the basic-auth password, re-read on every request.
    #[arg(
        long,
        env = "GPU_REAPER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE",
        requires = "prometheus_basic_auth_user"
    )]
    pub prometheus_basic_auth_password_file: Option<PathBuf>,
    /// Extra CA bundle (PEM) to trust for Prometheus.
    #[arg(long, env = "GPU_REAPER_PROMETHEUS_CA_FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// Per-request timeout (Go duration).
    #[arg(long, default_value = "30s", env = "GPU_REAPER_PROMETHEUS_TIMEOUT")]
    pub prometheus_timeout: String,
    /// Length of history pulled per query (Go duration); shorter keeps answers small.
    #[arg(long, default_value = "2h", env = "GPU_REAPER_PROMETHEUS_CHUNK")]
    pub prometheus_chunk: String,
    /// Largest Prometheus answer accepted, bytes.
    #[arg(long, default_value_t = 256 << 20, env = "GPU_REAPER_PROMETHEUS_MAX_RESPONSE_BYTES")]
    pub prometheus_max_response_bytes: usize,
    /// Label naming a DCGM series' pod (default: `exported_pod` when present, else `pod`).
    #[arg(long, env = "GPU_REAPER_DCGM_POD_LABEL")]
    pub dcgm_pod_label: Option<String>,
    /// Label naming a DCGM series' namespace (default: matches the pod label's convention).
    #[arg(long, env = "GPU_REAPER_DCGM_NAMESPACE_LABEL")]
    pub dcgm_namespace_label: Option<String>,
    /// Retries of a failed query (connection errors, 429, 5xx).
    #[arg(long, default_value_t = 2, env = "GPU_REAPER_PROMETHEUS_RETRIES")]
    pub prometheus_retries: u32,
}

/// `gpu-reaper audit`.
#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// How far back to look (Go duration).
    #[arg(long, default_value = "24h", env = "GPU_REAPER_SINCE")]
    pub since: String,
    /// Idle rules and prices from this GpuPolicy (default: the bundled sample's).
    #[arg(long, env = "GPU_REAPER_POLICY")]
    pub policy: Option<PathBuf>,
    /// Instead of the report, check that the cluster's telemetry is ready for
    /// gpu-reaper and say what is missing.
    #[arg(long)]
    pub check: bool,
    /// How many top offenders to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table, env = "GPU_REAPER_FORMAT")]
    pub format: OutputFormat,
}

/// `gpu-reaper backtest`.
#[derive(clap::Args, Debug, Clone)]
pub struct BacktestArgs {
    /// GpuPolicy YAML. Default: the bundled sample policy (config/samples/policy.yaml).
    #[arg(long, env = "GPU_REAPER_POLICY")]
    pub policy: Option<PathBuf>,
    /// OpenMetrics text with timestamps (optionally .gz): DCGM exporter and
    /// kube-state-metrics series. Default: the bundled sample trace.
    #[arg(long, env = "GPU_REAPER_TRACE", conflicts_with = "prometheus_url")]
    pub trace: Option<PathBuf>,
    /// Pull the history from Prometheus instead of a file.
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// Start of the history pulled from Prometheus: RFC 3339, or a Go duration before --to.
    #[arg(long, default_value = "24h", env = "GPU_REAPER_FROM")]
    pub from: String,
    /// End of the history pulled from Prometheus: RFC 3339 (default: now).
    #[arg(long, env = "GPU_REAPER_TO")]
    pub to: Option<String>,
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
