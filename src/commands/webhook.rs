//! `gpu-reaper webhook`: wires the caches, the TLS server and the probe server together.

use std::sync::Arc;

use tokio::net::TcpListener;

use super::decide::Settings;
use super::metrics::Metrics;
use super::server::{self, AppState, CertReloader, SnapshotCell};
use crate::cli::{GpuCountArgs, WebhookArgs};
use crate::gpus::GpuResources;
use crate::{Error, Result};

/// The counting settings the flags describe.
pub fn settings(args: &GpuCountArgs) -> Result<Settings> {
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
    Ok(Settings {
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

/// Runs the webhook until SIGTERM or Ctrl-C.
pub fn run(args: &WebhookArgs) -> Result<()> {
    let settings = Arc::new(settings(&args.gpus)?);
    let reload_every = args.tls_reload_interval;
    let debounce = args.cache_debounce;
    let certs = Arc::new(CertReloader::load(&args.tls_cert, &args.tls_key)?);
    let tls = server::tls_config(certs.clone())?;
    let runtime = crate::commands::multi_thread_runtime()?;
    runtime.block_on(async move {
        let client = kube::Client::try_default().await.map_err(|source| Error::Kube {
            action: "connecting to the Kubernetes API (in-cluster config or KUBECONFIG)".into(),
            source,
        })?;
        let metrics = Arc::new(Metrics::new());
        let cell = Arc::new(SnapshotCell::default());
        let state = AppState {
            snapshot: cell.clone(),
            settings: settings.clone(),
            metrics: metrics.clone(),
        };
        let app = server::router(state.clone());
        let listener = bind(&args.listen, "listen").await?;
        tracing::info!(address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "budget-gate webhook serving HTTPS");
        if !args.probe_listen.is_empty() {
            let probes = bind(&args.probe_listen, "probe-listen").await?;
            // Plain HTTP: probes and scrapes only, never /validate (G4).
            let app = server::probe_router(state.clone());
            tokio::spawn(async move {
                if let Err(e) = axum::serve(probes, app).await {
                    tracing::error!(error = %e, "probe server stopped");
                }
            });
        }
        tokio::spawn(certs.watch(reload_every, metrics.clone()));
        tokio::spawn(super::cache::run(client, cell, settings, metrics, debounce));
        server::serve_tls(listener, tls, app, crate::commands::shutdown_signal()).await;
        tracing::info!("budget-gate webhook stopped");
        Ok(())
    })
}

async fn bind(address: &str, flag: &'static str) -> Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .map_err(|e| Error::InvalidArgument {
            flag,
            message: format!("cannot listen on {address:?}: {e}"),
        })
}
