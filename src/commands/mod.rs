//! The commands' edges: `backtest`, `export`, `audit`, `explain` and `replay` (files, Prometheus and
//! the API server in, the pure reports and traces out), and what every command's edge
//! shares: the tokio runtimes, the typed Prometheus settings (used by the controller, the
//! webhook, `attest` and `wake` too).

pub mod audit;
pub mod backtest;
pub mod explain;
pub mod export;
pub mod replay;

use crate::cli::PrometheusArgs;
use crate::telemetry::prometheus::PrometheusConfig;
use crate::telemetry::trace::WorkloadLabels;
use crate::{Error, Result};

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
