//! Observe (IO): what a cycle looks at.
//!
//! - [`cluster`]: GPU pods resolved to root workloads, their owners, the policies (each
//!   read on its own: one that cannot be used is set aside, see `policies`) and
//!   namespace labels — from the watches' stores when running, by listing (pages of
//!   500) with `--once`;
//! - [`telemetry`]: every GPU's samples since the previous cycle, read once for all
//!   policies (`telemetry::live`: one query per DCGM family, the horizon at start-up);
//! - [`backfill`]: the activity history replayed into the idle spans of the policies
//!   evaluated for the first time, together, one piece of the range at a time.

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};

use super::context::Context;
use super::policies::{self, Policies, Unusable};
use crate::api::GpuPolicy;
use crate::cluster::inventory::{self, ObjectInfo, ObjectKey, Workload};
use crate::cluster::{discovery, snapshot};
use crate::engine::{Histories, Rules};
use crate::telemetry::live::LiveTelemetry;
use crate::telemetry::prometheus::{PrometheusError, Refreshed};
use crate::{Error, Result};

/// What one observation of the cluster found.
pub struct Observed {
    pub workloads: Vec<Workload>,
    pub owners: HashMap<ObjectKey, ObjectInfo>,
    /// The policies this gpu-reaper can use.
    pub policies: Vec<GpuPolicy>,
    /// The ones it cannot (a field that does not fit, a value it does not know): not
    /// evaluated, but their stand-ins still choose (`policies`).
    pub unusable: Vec<Unusable>,
    /// Namespace labels by name.
    pub namespaces: HashMap<String, BTreeMap<String, String>>,
}

pub(super) fn kube_err(action: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::Kube {
        action: action.to_string(),
        source,
    }
}

/// GPU pods resolved to root workloads, policies, namespace labels.
pub async fn cluster(ctx: &Context, now: Timestamp) -> Result<Observed> {
    let (gpu_pods, owners, policies, namespaces) = match &ctx.caches {
        Some(caches) => caches.read(&ctx.settings.resources, now),
        None => list(ctx, now).await?,
    };
    let Policies { usable, unusable } = policies;
    Ok(Observed {
        workloads: inventory::resolve(gpu_pods, &owners),
        owners,
        policies: usable,
        unusable,
        namespaces,
    })
}

/// One listing of everything a cycle needs, in pages of 500.
#[allow(clippy::type_complexity)]
async fn list(
    ctx: &Context,
    now: Timestamp,
) -> Result<(
    Vec<inventory::PodInfo>,
    HashMap<ObjectKey, ObjectInfo>,
    Policies,
    HashMap<String, BTreeMap<String, String>>,
)> {
    let c = &ctx.client;
    let owner_resources = discovery::owner_resources(c, discovery::OWNER_KINDS).await;
    let (gpu_pods, owners) =
        snapshot::gpu_pods_and_owners(c, &ctx.settings.resources, &owner_resources, now).await?;
    // Untyped, each read on its own: one policy that does not fit is set aside, never
    // failing the list.
    let objects = snapshot::list_all_matching(
        &Api::<DynamicObject>::all_with(c.clone(), &ApiResource::erase::<GpuPolicy>(&())),
        &ctx.settings.policy_selector,
    )
    .await
    .map_err(kube_err("listing GpuPolicies"))?;
    let policies = policies::read_all(&objects);
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(c.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(kube_err("listing namespaces"))?
        .items
        .into_iter()
        .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
        .collect();
    Ok((gpu_pods, owners, policies, namespaces))
}

/// One read of every GPU's samples since the previous cycle into `live`, whatever the
/// number of policies; each policy then takes its observations from memory.
pub async fn telemetry(
    ctx: &Context,
    live: &mut LiveTelemetry,
    rules: &[Rules],
    now: Timestamp,
) -> std::result::Result<Refreshed, PrometheusError> {
    let read = ctx
        .telemetry
        .refresh(live, rules, &ctx.settings.reads, now.as_second())
        .await;
    if let Ok(read) = &read {
        tracing::debug!(
            queries = read.queries,
            rebuilt = read.rebuilt,
            seconds = read.seconds_read,
            samples = read.samples,
            gpus = live.gpus(),
            "telemetry read"
        );
    }
    read
}

/// A policy whose idle-span history is backfilled this cycle.
pub struct Backfill<'a> {
    pub name: &'a str,
    pub rules: &'a Rules,
    pub history: &'a mut Histories<ObjectKey>,
}

/// Replays the last `--history-backfill` of activity into the histories of `policies`
/// (those that use one; spans older than each policy's `idle.history` are pruned), all
/// together: the range is read from Prometheus one piece (`--prometheus-chunk`) at a
/// time, oldest first, and each piece feeds every history before the next is read, so
/// one piece is held at a time, whatever the range and the number of policies. A piece
/// that cannot be read ends the backfill with a warning: what was fed is kept (the spans
/// in progress censored there) and the cycles learn the rest; the fixed durations decide
/// meanwhile.
pub async fn backfill(
    ctx: &Context,
    policies: &mut [Backfill<'_>],
    workloads: &[Workload],
    now: Timestamp,
) {
    let since = ctx.settings.history_backfill;
    if policies.is_empty() || since <= SignedDuration::ZERO {
        return;
    }
    let started = std::time::Instant::now();
    let options = crate::telemetry::trace::ReadOptions {
        workload_labels: ctx.settings.history_labels.clone(),
        step_seconds: super::backfill::STEP_SECONDS,
        skip_unknown_metrics: true,
    };
    let chunk = SignedDuration::try_from(ctx.telemetry.chunk()).unwrap_or(SignedDuration::MAX);
    let pieces = super::backfill::pieces(now - since, now, chunk);
    let mut stream = super::backfill::Stream::new(workloads);
    let mut read = 0;
    for &(from, until) in &pieces {
        match ctx
            .telemetry
            .fetch_families(
                from.as_second(),
                until.as_second(),
                &super::backfill::FAMILIES,
                &options,
            )
            .await
        {
            Ok(trace) => {
                read += 1;
                if let Some(trace) = trace {
                    let piece = stream.piece(&trace, from, until);
                    for p in policies.iter_mut() {
                        piece.feed(p.history, p.rules);
                    }
                }
            }
            Err(e) => {
                for p in policies.iter_mut() {
                    stream.interrupted(p.history, from);
                }
                let names: Vec<&str> = policies.iter().map(|p| p.name).collect();
                tracing::warn!(policies = ?names, error = %e, backfilled_from = %(now - since), failed_at = %from, "could not backfill all of the idle-span history; learning the rest from the cycles");
                break;
            }
        }
    }
    if read == 0 {
        return;
    }
    for p in policies.iter() {
        let added = stream.backfilled(p.history);
        tracing::info!(policy = p.name, from = %(now - since), pieces = read, seconds = started.elapsed().as_secs_f64(), workloads = added.workloads, spans = added.spans, "idle-span history backfilled from Prometheus");
    }
}
