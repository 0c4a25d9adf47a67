//! The webhook's caches: watches over GpuPolicies, ReadinessAttestations, namespace
//! metadata, pods, DRA ResourceClaims and ResourceClaimTemplates, the parents of `/scale`
//! (Deployments, StatefulSets, ReplicaSets, ReplicationControllers) and nodes, folded
//! into one immutable [`Snapshot`] that requests read without locking out the watches
//! (invariant 9: no API call per request).
//!
//! Every watch reads objects untyped ([`DynamicObject`]) and hands each event to its pure
//! [`Fold`] (`super::fold`: what is kept of each object, and the snapshot they make): one
//! object that does not fit the Rust types (a `maxGpus` written before the CRD had a
//! maximum) is skipped there, logged and counted here in
//! `gpu_reaper_admission_unreadable_objects`, and never fails the list, so it can neither
//! keep `/readyz` failing nor freeze the cache (G4). Only what a decision needs is kept,
//! so the caches stay small with tens of thousands of pods.
//!
//! The snapshot is rebuilt after changes, at most every `debounce`, and published only
//! once every watch has listed: before that `/readyz` fails and `/validate` answers 503,
//! so the API server applies the webhook's `failurePolicy`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ReplicationController};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use serde_json::Value;

use super::fold::{
    Fold, Folds, build, node_has_gpus, read_claim, read_pod, read_scalable, read_typed,
};
use super::metrics::{Metrics, ResourceLabels};
use super::{Scalable, Settings, Snapshot};
use crate::api::{GpuPolicy, ReadinessAttestation};
use crate::gpus;

/// The latest snapshot of the caches; `None` until they have synced.
#[derive(Default)]
pub struct SnapshotCell(RwLock<Option<Arc<Snapshot>>>);

impl SnapshotCell {
    /// A cell that is ready from the start (offline use, benchmarks).
    pub fn ready(snapshot: Snapshot) -> Self {
        Self(RwLock::new(Some(Arc::new(snapshot))))
    }

    /// The current snapshot, if synced.
    pub fn get(&self) -> Option<Arc<Snapshot>> {
        self.0
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Publishes a new snapshot.
    pub fn set(&self, snapshot: Snapshot) {
        let snapshot = Some(Arc::new(snapshot));
        match self.0.write() {
            Ok(mut s) => *s = snapshot,
            Err(p) => *p.into_inner() = snapshot,
        }
    }
}

/// The object as JSON, with its metadata (what the counting code reads).
fn as_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

type Reader<V> = Box<dyn Fn(&DynamicObject) -> Result<Option<V>, String> + Send + Sync>;

/// A change of one fold.
type Change = Box<dyn FnOnce(&mut Folds, &Metrics) + Send>;

fn watch<V: Clone + Send + 'static>(
    client: &Client,
    resource: ApiResource,
    name: &'static str,
    metrics: Arc<Metrics>,
    pick: fn(&mut Folds) -> Option<&mut Fold<V>>,
    read: Reader<V>,
) -> BoxStream<'static, Change> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let read = Arc::new(read);
    let config = watcher::Config::default().page_size(500);
    watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let metrics = metrics.clone();
            let read = read.clone();
            async move {
                match event {
                    Ok(event) => {
                        let change: Change = Box::new(move |folds: &mut Folds, metrics: &Metrics| {
                            let Some(fold) = pick(folds) else {
                                return;
                            };
                            if let Some(((ns, object), error)) = fold.apply(event, read.as_ref()) {
                                metrics
                                    .unreadable
                                    .get_or_create(&ResourceLabels { resource: name })
                                    .inc();
                                tracing::warn!(resource = name, namespace = %ns, name = %object, %error, "skipping an object the budget gate cannot read; fix or delete it");
                            }
                        });
                        Some(change)
                    }
                    Err(e) => {
                        metrics
                            .watch_errors
                            .get_or_create(&ResourceLabels { resource: name })
                            .inc();
                        tracing::warn!(resource = name, error = %e, "watch failed; retrying with backoff");
                        None
                    }
                }
            }
        })
        .boxed()
}

async fn readable(client: &Client, resource: &ApiResource) -> bool {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::info!(resource = %resource.plural, error = %e, "not readable; the budget gate goes without it");
            false
        }
    }
}

/// Runs the watches and publishes snapshots into `cell` until the process ends.
pub async fn run(
    client: Client,
    cell: Arc<SnapshotCell>,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    debounce: Duration,
) {
    let resources = Arc::new(settings.resources.clone());
    let mut folds = Folds {
        policies: Fold::new(true),
        attestations: Fold::new(false),
        namespaces: Fold::new(false),
        templates: None,
        claims: None,
        pods: Fold::new(false),
        scalable: HashMap::new(),
        nodes: None,
    };
    let mut streams: Vec<BoxStream<'static, Change>> = vec![
        watch(
            &client,
            ApiResource::erase::<GpuPolicy>(&()),
            "gpupolicies",
            metrics.clone(),
            |f| Some(&mut f.policies),
            Box::new(|o| read_typed::<GpuPolicy>(o).map(|p| Some(Arc::new(p)))),
        ),
        watch(
            &client,
            ApiResource::erase::<ReadinessAttestation>(&()),
            "readinessattestations",
            metrics.clone(),
            |f| Some(&mut f.attestations),
            Box::new(|o| read_typed::<ReadinessAttestation>(o).map(|a| Some(Arc::new(a)))),
        ),
        watch(
            &client,
            ApiResource::erase::<Namespace>(&()),
            "namespaces",
            metrics.clone(),
            |f| Some(&mut f.namespaces),
            Box::new(|o| Ok(Some(o.metadata.labels.clone().unwrap_or_default()))),
        ),
        {
            let resources = resources.clone();
            watch(
                &client,
                ApiResource::erase::<Pod>(&()),
                "pods",
                metrics.clone(),
                |f| Some(&mut f.pods),
                Box::new(move |o| read_pod(&as_value(o), &resources)),
            )
        },
    ];
    let scalable: [(&'static str, ApiResource, &'static str, &'static str); 4] = [
        (
            "deployments",
            ApiResource::erase::<Deployment>(&()),
            "apps/v1",
            "Deployment",
        ),
        (
            "statefulsets",
            ApiResource::erase::<StatefulSet>(&()),
            "apps/v1",
            "StatefulSet",
        ),
        (
            "replicasets",
            ApiResource::erase::<ReplicaSet>(&()),
            "apps/v1",
            "ReplicaSet",
        ),
        (
            "replicationcontrollers",
            ApiResource::erase::<ReplicationController>(&()),
            "v1",
            "ReplicationController",
        ),
    ];
    for (name, resource, api_version, kind) in scalable {
        // A kind the server does not serve (or RBAC hides) must not hold readiness back:
        // its scales are then judged as of an unknown parent, open-ended (fail closed).
        if !readable(&client, &resource).await {
            continue;
        }
        folds.scalable.insert(name, Fold::new(false));
        let resources = resources.clone();
        let pick: fn(&mut Folds) -> Option<&mut Fold<Scalable>> = match name {
            "deployments" => |f| f.scalable.get_mut("deployments"),
            "statefulsets" => |f| f.scalable.get_mut("statefulsets"),
            "replicasets" => |f| f.scalable.get_mut("replicasets"),
            _ => |f| f.scalable.get_mut("replicationcontrollers"),
        };
        streams.push(watch(
            &client,
            resource,
            name,
            metrics.clone(),
            pick,
            Box::new(move |o| read_scalable(&as_value(o), api_version, kind, &resources)),
        ));
    }
    // DRA is optional: clusters without resource.k8s.io/v1 have no claims to count.
    let template_resource = ApiResource::erase::<ResourceClaimTemplate>(&());
    if readable(&client, &template_resource).await {
        folds.templates = Some(Fold::new(false));
        let resources = resources.clone();
        streams.push(watch(
            &client,
            template_resource,
            "resourceclaimtemplates",
            metrics.clone(),
            |f| f.templates.as_mut(),
            Box::new(move |o| {
                let t: ResourceClaimTemplate = read_typed(o)?;
                Ok(gpus::claim_template_gpus(std::iter::once(&t), &resources)
                    .into_values()
                    .next())
            }),
        ));
    }
    let claim_resource = ApiResource::erase::<ResourceClaim>(&());
    if readable(&client, &claim_resource).await {
        folds.claims = Some(Fold::new(false));
        let resources = resources.clone();
        streams.push(watch(
            &client,
            claim_resource,
            "resourceclaims",
            metrics.clone(),
            |f| f.claims.as_mut(),
            Box::new(move |o| read_claim(&as_value(o), &resources)),
        ));
    }
    // Without nodes, a DaemonSet's size is unknown and it is an open-ended claim.
    let node_resource = ApiResource::erase::<Node>(&());
    if readable(&client, &node_resource).await {
        folds.nodes = Some(Fold::new(false));
        let resources = resources.clone();
        streams.push(watch(
            &client,
            node_resource,
            "nodes",
            metrics.clone(),
            |f| f.nodes.as_mut(),
            Box::new(move |o| Ok(Some(node_has_gpus(&as_value(o), &resources)))),
        ));
    }
    let folds = Arc::new(Mutex::new(folds));
    let mut events = futures::stream::select_all(streams);
    let mut is_synced = false;
    let mut dirty = true;
    // A steady tick, not a sleep reset by each event: under constant churn the snapshot
    // still lags the watches by at most `debounce`.
    let mut tick = tokio::time::interval(debounce);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            change = events.next() => {
                let Some(change) = change else {
                    return;
                };
                let mut folds = folds.lock().unwrap_or_else(|p| p.into_inner());
                change(&mut folds, &metrics);
                dirty = true;
                continue;
            }
            _ = tick.tick() => {}
        }
        if !dirty {
            continue;
        }
        let snapshot = {
            let folds = folds.lock().unwrap_or_else(|p| p.into_inner());
            if !is_synced && folds.synced() {
                is_synced = true;
                tracing::info!("caches synced; the budget gate is ready");
            }
            if !is_synced {
                continue;
            }
            for (resource, n) in folds.skipped() {
                metrics
                    .skipped
                    .get_or_create(&ResourceLabels { resource })
                    .set(n as i64);
            }
            build(&folds)
        };
        record_sizes(&metrics, &snapshot);
        cell.set(snapshot);
        dirty = false;
    }
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
    set("resourceclaims", snapshot.claims.len());
    set("gpupods", snapshot.held.values().map(Vec::len).sum());
    set("scalable", snapshot.scalable.len());
}
