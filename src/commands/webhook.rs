//! `gpu-reaper webhook`: the edge. Wires the admission room's caches, TLS server and probe
//! server together, with the counting settings from the flags.

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::admission::metrics::Metrics;
use crate::admission::server::{self, AppState, CertReloader, SnapshotCell};
use crate::cli::WebhookArgs;
use crate::{Error, Result};

/// Runs the webhook until SIGTERM or Ctrl-C.
pub fn run(args: &WebhookArgs) -> Result<()> {
    let settings = Arc::new(super::gpu_settings(&args.gpus)?);
    let reload_every = args.tls_reload_interval;
    let debounce = args.cache_debounce;
    let certs = Arc::new(CertReloader::load(&args.tls_cert, &args.tls_key)?);
    let tls = server::tls_config(certs.clone())?;
    let runtime = super::multi_thread_runtime()?;
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
        tokio::spawn(crate::admission::cache::run(client, cell, settings, metrics, debounce));
        server::serve_tls(listener, tls, app, super::shutdown_signal()).await;
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
