//! The edge layer: every command of the binary, one file each (IO set-up, then calls
//! into the rooms), and the one place besides `main.rs` that reads `crate::cli`. The
//! flags become the rooms' typed configs here (the controller's `Config`, the admission
//! `Settings`, `NotifyConfig`, `PrometheusConfig`, the report formats); no room sees a
//! clap type. Also what every command's edge shares: the tokio runtimes and the
//! shutdown signal.

pub mod attest;
pub mod audit;
pub mod backtest;
pub mod check;
pub mod controller;
pub mod explain;
pub mod export;
pub mod replay;
pub mod wake;
pub mod webhook;

use crate::admission::Settings as GateSettings;
use crate::cli::{self, Command, GpuCountArgs, NotifyArgs, PrometheusArgs};
use crate::gpus::GpuResources;
use crate::logging::LogFormat;
use crate::notify::{NotifyConfig, SmtpSecurity};
use crate::report::OutputFormat;
use crate::telemetry::prometheus::PrometheusConfig;
use crate::telemetry::trace::WorkloadLabels;
use crate::{Error, Result};

/// Runs one command of the command line.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Crd => crate::api::crds_yaml()
            .map(|y| print!("{y}"))
            .map_err(Error::from),
        Command::Backtest(args) => backtest::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Audit(args) => audit::run(&args),
        Command::Webhook(args) => webhook::run(&args),
        Command::Attest(args) => attest::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Wake(args) => wake::run(&args),
        Command::Controller(args) => controller::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Explain(args) => explain::run(&args),
    }
}

/// `--log-format`.
pub fn log_format(format: cli::LogFormat) -> LogFormat {
    match format {
        cli::LogFormat::Text => LogFormat::Text,
        cli::LogFormat::Json => LogFormat::Json,
    }
}

/// `--format` of `backtest` and `audit`.
pub fn output_format(format: cli::OutputFormat) -> OutputFormat {
    match format {
        cli::OutputFormat::Table => OutputFormat::Table,
        cli::OutputFormat::Json => OutputFormat::Json,
        cli::OutputFormat::Csv => OutputFormat::Csv,
    }
}

/// The Slack and email settings from the flags.
pub fn notify_config(args: &NotifyArgs) -> NotifyConfig {
    NotifyConfig {
        slack_token_file: args.slack_token_file.clone(),
        slack_signing_secret_file: args.slack_signing_secret_file.clone(),
        slack_api_url: args.slack_api_url.clone(),
        slack_ca_file: args.slack_ca_file.clone(),
        smtp_host: args.smtp_host.clone(),
        smtp_port: args.smtp_port,
        smtp_security: match args.smtp_security {
            cli::SmtpSecurity::Starttls => SmtpSecurity::Starttls,
            cli::SmtpSecurity::Tls => SmtpSecurity::Tls,
            cli::SmtpSecurity::None => SmtpSecurity::None,
        },
        smtp_ca_file: args.smtp_ca_file.clone(),
        smtp_user: args.smtp_user.clone(),
        smtp_password_file: args.smtp_password_file.clone(),
        smtp_from: args.smtp_from.clone(),
    }
}

/// The multi-threaded runtime of the long-running commands (webhook, controller).
pub fn multi_thread_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            path: "tokio runtime".into(),
            source,
        })
}

/// Resolves on SIGTERM (a rollout, a node drain) or Ctrl-C: what the long-running
/// commands stop on.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Runs a future to completion (the CLI has no other async work).
pub fn block_on<F: std::future::Future>(future: F) -> Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            path: "tokio runtime".into(),
            source,
        })?;
    Ok(runtime.block_on(future))
}

/// The DCGM workload label override from the flags.
pub fn workload_labels(args: &PrometheusArgs) -> WorkloadLabels {
    WorkloadLabels {
        pod: args.dcgm_pod_label.clone(),
        namespace: args.dcgm_namespace_label.clone(),
    }
}

/// Typed Prometheus settings from the flags.
pub fn prometheus_config(args: &PrometheusArgs) -> Result<PrometheusConfig> {
    let url = args
        .prometheus_url
        .clone()
        .ok_or_else(|| Error::InvalidArgument {
            flag: "prometheus-url",
            message: "is required, e.g. http://prometheus.monitoring:9090".into(),
        })?;
    Ok(PrometheusConfig {
        url,
        bearer_token_file: args.prometheus_bearer_token_file.clone(),
        basic_auth: args
            .prometheus_basic_auth_user
            .clone()
            .zip(args.prometheus_basic_auth_password_file.clone()),
        ca_file: args.prometheus_ca_file.clone(),
        client_identity: args
            .prometheus_client_cert_file
            .clone()
            .zip(args.prometheus_client_key_file.clone()),
        insecure_skip_tls_verify: args.prometheus_insecure_skip_tls_verify,
        timeout: args.prometheus_timeout,
        retries: args.prometheus_retries,
        max_response_bytes: args.prometheus_max_response_bytes,
        chunk: args.prometheus_chunk,
    })
}

/// The GPU counting settings the flags describe (webhook, check, controller, explain).
pub fn gpu_settings(args: &GpuCountArgs) -> Result<GateSettings> {
    if !(args.mig_slices_per_gpu >= 1.0 && args.mig_slices_per_gpu.is_finite()) {
        return Err(Error::InvalidArgument {
            flag: "mig-slices-per-gpu",
            message: format!(
                "{} must be at least 1, e.g. 7 for A100/H100",
                args.mig_slices_per_gpu
            ),
        });
    }
    if !(args.dra_all_gpus >= 0.0 && args.dra_all_gpus.is_finite()) {
        return Err(Error::InvalidArgument {
            flag: "dra-all-gpus",
            message: format!(
                "{} must be a non-negative number, e.g. 8",
                args.dra_all_gpus
            ),
        });
    }
    Ok(GateSettings {
        resources: GpuResources {
            whole: args.gpu_resources.clone(),
            device_classes: args.gpu_device_classes.clone(),
            mig_slices_per_gpu: args.mig_slices_per_gpu,
            dra_all_gpus: args.dra_all_gpus,
            ..GpuResources::default()
        },
        trusted_controllers: args.trusted_controllers.clone(),
    })
}
