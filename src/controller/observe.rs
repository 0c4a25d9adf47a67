//! Observe (IO): what a cycle looks at.
//!
//! - [`cluster`]: GPU pods resolved to root workloads, their owners, the policies (each
//!   read on its own: one that cannot be used is set aside, see `policies`) and
//!   namespace labels — from the watches' stores when running, by listing (pages of
//!   500) with `--once`;
//! - [`telemetry`]: every GPU's samples since the previous cycle, read once for all
//!   policies (`telemetry::live`: one query per DCGM family, the horizon at start-up);
//! - [`backfill`]: the activity history replayed into a policy's idle spans the first
//!   time it is evaluated.

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
use crate::telemetry::trace::Trace;
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

/// The history a start-up backfill read, shared by every policy backfilled in a cycle.
pub type HistoryRead = Option<std::result::Result<Trace, String>>;

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

/// Replays the last `--history-backfill` of activity into `history`, for policies
/// that use it; spans older than the policy's `idle.history` are pruned. The activity
/// is read from Prometheus once per cycle (`read`, shared by every policy backfilled in
/// it). A failure is logged and the cycles learn on their own: the fixed durations
/// decide meanwhile.
pub async fn backfill(
    ctx: &Context,
    policy: &GpuPolicy,
    rules: &Rules,
    workloads: &[Workload],
    history: &mut Histories<ObjectKey>,
    read: &mut HistoryRead,
    now: Timestamp,
) {
    let spec = &policy.spec;
    let since = ctx.settings.history_backfill;
    if !spec.uses_idle_history() || since <= SignedDuration::ZERO {
        return;
    }
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    if read.is_none() {
        let options = crate::telemetry::trace::ReadOptions {
            workload_labels: ctx.settings.history_labels.clone(),
            step_seconds: 60,
            skip_unknown_metrics: true,
        };
        let from = (now - since).as_second();
        *read = Some(
            ctx.telemetry
                .fetch_families(from, now.as_second(), &super::backfill::FAMILIES, &options)
                .await
                .map_err(|e| e.to_string()),
        );
    }
    match read.as_ref().expect("read above") {
        Ok(trace) => {
            let added = super::backfill::feed(history, trace, workloads, rules, now);
            tracing::info!(policy = name, from = %(now - since), workloads = added.workloads, spans = added.spans, "idle-span history backfilled from Prometheus");
        }
        Err(e) => {
            tracing::warn!(policy = name, error = %e, "could not backfill the idle-span history; learning it from the cycles");
        }
    }
}
