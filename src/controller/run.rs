//! `gpu-reaper controller`: the loop. Builds the [`Context`] from its [`Config`] (typed
//! from the flags by `commands::controller`), serves the
//! admin port (probes, metrics, Slack's interactivity endpoint), keeps the Lease on its
//! own clock, and every `--interval` (or as soon as a GpuPolicy changes) runs
//! [`cycle::evaluate`] while this replica leads; `--once` takes the Lease, evaluates
//! once and exits. What a cycle does is in `cycle` and its stages.
//!
//! On SIGTERM (every rollout and node drain) it stops at a safe point: between cycles at
//! once; during one, the cycle is given [`SHUTDOWN_GRACE`] to finish (every write is
//! idempotent and a restore record precedes its action, so a cycle cut short is finished
//! by the next leader, never doubled). Then it stops renewing and releases the Lease, so
//! the standby takes over at its next attempt (a third of `--lease-duration`), not a
//! whole lease duration later.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use kube::Client;

use super::context::{Config, Context, Memory, Notifiers, slack_notifier};
use super::cycle;
use super::lease::Elector;
use super::metrics::Metrics;
use super::observe::kube_err;
use super::{audit_memory, caches};
use crate::cluster::discovery;
use crate::telemetry::prometheus::PrometheusSource;
use crate::{Error, Result};

/// The admin port: `/healthz`, `/readyz` (after the first evaluation, or as a standby),
/// `/metrics`, and Slack's `/slack/interactivity` when configured.
async fn serve_admin(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    extra: Option<Router>,
) {
    let app = crate::admin::router(
        Arc::new(move || {
            if ready.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("not evaluated yet")
            }
        }),
        Arc::new(move || crate::admin::openmetrics(metrics.encode())),
    );
    let app = match extra {
        Some(extra) => app.merge(extra),
        None => app,
    };
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "probe server stopped");
    }
}

/// How long a cycle under way at SIGTERM may run on. The chart's
/// `terminationGracePeriodSeconds` (30 s) leaves room for it and the Lease release.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// Keeps `ctx.leading` current: the Lease is renewed on its own clock (a third of its
/// duration), not once per evaluation: with --interval longer than --lease-duration,
/// replicas would otherwise take turns leading.
async fn keep_leading(elector: Arc<Elector>, ctx: Arc<Context>) {
    let period =
        (ctx.settings.lease_duration.unsigned_abs() / 3).max(std::time::Duration::from_secs(1));
    loop {
        tokio::time::sleep(period).await;
        let now_leading = match elector.try_lead().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "leader election failed; not acting until the Lease is renewed");
                false
            }
        };
        if ctx.set_leading(now_leading) != now_leading {
            tracing::info!(leading = now_leading, "leadership changed");
        }
    }
}

/// Runs the controller until `shutdown` resolves (SIGTERM), or one cycle with `--once`.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let Config {
        settings,
        clock,
        prometheus,
        notify,
        listen,
        once,
    } = config;
    let slack = slack_notifier(&notify)?;
    let telemetry = PrometheusSource::new(prometheus)?;
    let mut kube_config = kube::Config::infer().await.map_err(|e| {
        Error::Controller(format!(
            "no Kubernetes configuration (KUBECONFIG or in-cluster): {e}"
        ))
    })?;
    // A PodDisruptionBudget's 429 must come back at once (retried next cycle), not be
    // retried for minutes inside one eviction.
    kube_config.default_retry = false;
    let client =
        Client::try_from(kube_config).map_err(kube_err("building the Kubernetes client"))?;
    let interactions = crate::notify::interact::InteractionMetrics::default();
    let metrics = Arc::new(Metrics::new(&interactions));
    let ready = Arc::new(AtomicBool::new(false));
    if !once {
        let listener =
            tokio::net::TcpListener::bind(&listen)
                .await
                .map_err(|e| Error::InvalidArgument {
                    flag: "listen",
                    message: format!("{listen}: {e}"),
                })?;
        let interact = crate::notify::interact::InteractState::from_config(
            &notify,
            client.clone(),
            slack.as_ref(),
        )
        .map_err(|e| Error::InvalidArgument {
            flag: "slack-signing-secret-file",
            message: e.to_string(),
        })?
        .map(|state| crate::notify::interact::router(state.with_metrics(interactions)));
        tokio::spawn(serve_admin(
            listener,
            metrics.clone(),
            ready.clone(),
            interact,
        ));
    }
    let notifiers = Notifiers::new(&client, &settings.identity, &notify, slack)?;
    let caches = if once {
        None
    } else {
        let caches =
            caches::Caches::start(&client, discovery::OWNER_KINDS, &settings.policy_selector).await;
        caches.wait_synced().await;
        tracing::info!("watches synced");
        Some(caches)
    };
    let policy_changed = caches.as_ref().map(|c| c.policy_changed.clone());
    let elector = Arc::new(Elector::new(
        client.clone(),
        &settings.lease_namespace,
        &settings.lease_name,
        &settings.identity,
        settings.lease_duration,
    ));
    let ctx = Arc::new(Context {
        client,
        notifiers,
        telemetry,
        clock,
        metrics,
        leading: Arc::new(AtomicBool::new(false)),
        settings,
        caches,
    });
    let mut memory = Memory::new(&ctx);
    memory.audit = audit_memory::load(&ctx).await;
    if !once {
        // The first attempt before the first evaluation, then on the renewal clock.
        let first = elector.try_lead().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "leader election failed; retrying");
            false
        });
        ctx.set_leading(first);
    }
    let renewing = (!once).then(|| tokio::spawn(keep_leading(elector.clone(), ctx.clone())));
    // SIGTERM, as a value every select below can wait on again.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if !once {
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
    }
    let stopping = || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let lease = format!(
        "{}/{}",
        ctx.settings.lease_namespace, ctx.settings.lease_name
    );
    let mut was_leading = false;
    let mut tick = tokio::time::interval(ctx.settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The watches' initial list rang for every policy; the first cycle (the first
    // tick, at once) sees them all anyway. Left stored, that ring started a second,
    // identical cycle right after the first: 11 more queries per policy at start-up.
    if let Some(changed) = &policy_changed {
        let _ = futures::FutureExt::now_or_never(changed.notified());
    }
    loop {
        // Every interval, and as soon as a GpuPolicy changes.
        match &policy_changed {
            Some(changed) => {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = changed.notified() => {
                        // Let an apply of several policies land together.
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                    _ = stopping() => break,
                }
            }
            None => {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopping() => break,
                }
            }
        }
        let leading = if once {
            let l = elector.try_lead().await.map_err(|e| Error::Kube {
                action: format!("taking the Lease {lease}"),
                source: e,
            })?;
            ctx.set_leading(l);
            l
        } else {
            ctx.is_leading()
        };
        if leading && !was_leading && !once {
            // A standby taking over reads what the previous leader recorded in Audit mode.
            memory.audit = audit_memory::load(&ctx).await;
        }
        was_leading = leading;
        if leading {
            let now = ctx.clock.now();
            let evaluation = cycle::evaluate(&ctx, &mut memory, now);
            tokio::pin!(evaluation);
            let mut stop_after = false;
            let outcome = tokio::select! {
                outcome = &mut evaluation => Some(outcome),
                _ = stopping() => {
                    stop_after = true;
                    tracing::info!(grace = ?SHUTDOWN_GRACE, "stopping: finishing the cycle under way");
                    tokio::time::timeout(SHUTDOWN_GRACE, &mut evaluation).await.ok()
                }
            };
            match outcome {
                Some(Ok(())) => ready.store(true, Ordering::Relaxed),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "evaluation failed");
                    if once {
                        return Err(e);
                    }
                }
                None => tracing::warn!(
                    "stopping: the cycle under way did not finish in time and was abandoned; the next leader finishes what it started"
                ),
            }
            if stop_after {
                break;
            }
        } else {
            // Standbys are ready: they serve metrics and take over when the Lease expires.
            ready.store(true, Ordering::Relaxed);
        }
        if once {
            return if leading {
                Ok(())
            } else {
                Err(Error::Controller(format!(
                    "not the leader: Lease {lease} is held by another replica"
                )))
            };
        }
    }
    // SIGTERM: stop renewing, then give the Lease to whoever asks next.
    if let Some(renewing) = renewing {
        renewing.abort();
    }
    ctx.set_leading(false);
    match elector.release().await {
        Ok(true) => tracing::info!(lease = %lease, "stopped; Lease released"),
        Ok(false) => tracing::info!(lease = %lease, "stopped; the Lease was not held here"),
        Err(e) => {
            tracing::warn!(lease = %lease, error = %e, "stopped; could not release the Lease (it expires on its own)")
        }
    }
    Ok(())
}
