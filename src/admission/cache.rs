//! The webhook's caches: reflectors over GpuPolicies, ReadinessAttestations, namespace
//! metadata and DRA ResourceClaimTemplates, folded into one immutable [`Snapshot`] that
//! requests read without locking out the watches (invariant 9: no API call per request).
//!
//! The snapshot is rebuilt after changes, at most every `debounce`, and published only
//! once every watch has listed: before that `/readyz` fails and `/validate` answers 503,
//! so the API server applies the webhook's `failurePolicy`.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};

use super::count;
use super::decide::{Settings, Snapshot};
use super::metrics::{Metrics, ResourceLabels};
use super::server::SnapshotCell;
use crate::api::{GpuPolicy, ReadinessAttestation};

struct Stores {
    policies: Store<GpuPolicy>,
    attestations: Store<ReadinessAttestation>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    templates: Option<Store<ResourceClaimTemplate>>,
}

fn reflect<K>(
    api: Api<K>,
    resource: &'static str,
    metrics: Arc<Metrics>,
) -> (Store<K>, BoxStream<'static, ()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().page_size(500);
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .map(move |event| {
            if let Err(e) = event {
                metrics
                    .watch_errors
                    .get_or_create(&ResourceLabels { resource })
                    .inc();
                tracing::warn!(resource, error = %e, "watch failed; retrying with backoff");
            }
        })
        .boxed();
    (reader, stream)
}

/// Runs the watches and publishes snapshots into `cell` until the process ends.
pub async fn run(
    client: Client,
    cell: Arc<SnapshotCell>,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    debounce: Duration,
) {
    let (policies, s1) = reflect(
        Api::<GpuPolicy>::all(client.clone()),
        "gpupolicies",
        metrics.clone(),
    );
    let (attestations, s2) = reflect(
        Api::<ReadinessAttestation>::all(client.clone()),
        "readinessattestations",
        metrics.clone(),
    );
    // Metadata only: the budget gate needs namespace labels, not specs.
    let (ns_reader, s3) = reflect(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        "namespaces",
        metrics.clone(),
    );
    let mut streams = vec![s1, s2, s3];
    // DRA is optional: clusters without resource.k8s.io/v1 have no templates to resolve.
    let template_api = Api::<ResourceClaimTemplate>::all(client.clone());
    let templates = match template_api
        .list_metadata(&ListParams::default().limit(1))
        .await
    {
        Ok(_) => {
            let (reader, stream) = reflect(template_api, "resourceclaimtemplates", metrics.clone());
            streams.push(stream);
            Some(reader)
        }
        Err(e) => {
            tracing::info!(error = %e, "resource.k8s.io/v1 ResourceClaimTemplates not readable; DRA claims in pod templates are not counted");
            None
        }
    };
    let stores = Stores {
        policies,
        attestations,
        namespaces: ns_reader,
        templates,
    };
    let mut events = futures::stream::select_all(streams);
    let synced = wait_synced(&stores);
    tokio::pin!(synced);
    let mut is_synced = false;
    let mut dirty = true;
    // A steady tick, not a sleep reset by each event: under constant churn the snapshot
    // still lags the watches by at most `debounce`.
    let mut tick = tokio::time::interval(debounce);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut synced, if !is_synced => {
                is_synced = true;
                tracing::info!("caches synced; the budget gate is ready");
            }
            event = events.next() => {
                if event.is_none() {
                    return;
                }
                dirty = true;
                continue;
            }
            _ = tick.tick() => {}
        }
        if is_synced && dirty {
            let snapshot = build(&stores, &settings);
            record_sizes(&metrics, &snapshot);
            cell.set(snapshot);
            dirty = false;
        }
    }
}

async fn wait_synced(stores: &Stores) {
    let _ = stores.policies.wait_until_ready().await;
    let _ = stores.attestations.wait_until_ready().await;
    let _ = stores.namespaces.wait_until_ready().await;
    if let Some(t) = &stores.templates {
        let _ = t.wait_until_ready().await;
    }
}

fn build(stores: &Stores, settings: &Settings) -> Snapshot {
    let namespaces = stores.namespaces.state().into_iter().filter_map(|ns| {
        Some((
            ns.metadata.name.clone()?,
            ns.metadata.labels.clone().unwrap_or_default(),
        ))
    });
    let template_objects: Vec<_> = stores.templates.iter().flat_map(|s| s.state()).collect();
    let templates = count::claim_template_gpus(
        template_objects.iter().map(|t| t.as_ref()),
        &settings.resources,
    );
    Snapshot::build(
        stores.policies.state(),
        stores.attestations.state(),
        namespaces,
        templates,
    )
}

fn record_sizes(metrics: &Metrics, snapshot: &Snapshot) {
    let set = |resource, n: usize| {
        metrics
            .cached
            .get_or_create(&ResourceLabels { resource })
            .set(n as i64);
    };
    set("gpupolicies", snapshot.policies.len());
    set("readinessattestations", snapshot.attestation_count());
    set("namespaces", snapshot.namespaces.len());
    set("resourceclaimtemplates", snapshot.claim_templates.len());
}
