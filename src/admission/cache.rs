//! The webhook's caches: watches over GpuPolicies, ReadinessAttestations, namespace
//! metadata, pods, DRA ResourceClaims and ResourceClaimTemplates, the parents of `/scale`
//! (Deployments, StatefulSets, ReplicaSets, ReplicationControllers) and nodes, folded
//! into one immutable [`Snapshot`] that requests read without locking out the watches
//! (invariant 9: no API call per request).
//!
//! Every watch reads objects untyped ([`DynamicObject`]) and each object is read on its
//! own ([`Fold`]): one object that does not fit the Rust types (a `maxGpus` written
//! before the CRD had a maximum) is skipped, logged and counted in
//! `gpu_reaper_admission_unreadable_objects`, and never fails the list, so it can neither
//! keep `/readyz` failing nor freeze the cache (G4). An unreadable attestation covers
//! nothing; an unreadable new version of a GpuPolicy leaves its last readable version in
//! force, so the gate never loosens because of it.
//!
//! Only what a decision needs is kept: GPUs and labels per pod, per-replica GPUs per
//! scalable parent, so the caches stay small with tens of thousands of pods.
//!
//! The snapshot is rebuilt after changes, at most every `debounce`, and published only
//! once every watch has listed: before that `/readyz` fails and `/validate` answers 503,
//! so the API server applies the webhook's `failurePolicy`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ReplicationController};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client};
use serde_json::Value;

use super::metrics::{Metrics, ResourceLabels};
use super::{Scalable, ScaleTarget, Settings, Snapshot};
use crate::api::{GpuPolicy, ReadinessAttestation};
use crate::gpus::{self, Counted, GpuResources};

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

/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub type Key = (String, String);

/// The readable objects of one watch, by key, and the ones that were skipped.
#[derive(Debug)]
pub struct Fold<V> {
    items: HashMap<Key, V>,
    /// Objects listed since the last `Init`, swapped in at `InitDone`.
    listing: Option<HashMap<Key, V>>,
    /// Objects that could not be read, and why.
    pub skipped: HashMap<Key, String>,
    /// Whether the first list has completed.
    pub synced: bool,
    /// On an unreadable new version, keep the last readable one (policies: the gate must
    /// not loosen) instead of dropping it (attestations: cover nothing).
    keep_last_readable: bool,
}

impl<V: Clone> Fold<V> {
    pub fn new(keep_last_readable: bool) -> Self {
        Self {
            items: HashMap::new(),
            listing: None,
            skipped: HashMap::new(),
            synced: false,
            keep_last_readable,
        }
    }

    /// The readable objects.
    pub fn items(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.items.iter()
    }

    /// Applies one watch event; `read` turns an object into what is kept (`Ok(None)`:
    /// nothing to keep, `Err`: unreadable, with the reason). Returns the key and reason
    /// of an object newly skipped, for the log.
    pub fn apply(
        &mut self,
        event: Event<DynamicObject>,
        read: &dyn Fn(&DynamicObject) -> Result<Option<V>, String>,
    ) -> Option<(Key, String)> {
        match event {
            Event::Init => {
                self.listing = Some(HashMap::new());
                self.skipped.clear();
                None
            }
            Event::InitApply(object) => {
                let key = key_of(&object);
                let read = read(&object);
                let listing = self.listing.get_or_insert_with(HashMap::new);
                match read {
                    Ok(Some(v)) => {
                        listing.insert(key, v);
                        None
                    }
                    Ok(None) => None,
                    Err(e) => {
                        if self.keep_last_readable
                            && let Some(last) = self.items.get(&key)
                        {
                            listing.insert(key.clone(), last.clone());
                        }
                        self.skipped.insert(key.clone(), e.clone());
                        Some((key, e))
                    }
                }
            }
            Event::InitDone => {
                if let Some(listing) = self.listing.take() {
                    self.items = listing;
                }
                self.synced = true;
                None
            }
            Event::Apply(object) => {
                let key = key_of(&object);
                match read(&object) {
                    Ok(Some(v)) => {
                        self.skipped.remove(&key);
                        self.items.insert(key, v);
                        None
                    }
                    Ok(None) => {
                        self.skipped.remove(&key);
                        self.items.remove(&key);
                        None
                    }
                    Err(e) => {
                        if !self.keep_last_readable {
                            self.items.remove(&key);
                        }
                        self.skipped.insert(key.clone(), e.clone());
                        Some((key, e))
                    }
                }
            }
            Event::Delete(object) => {
                let key = key_of(&object);
                self.items.remove(&key);
                self.skipped.remove(&key);
                None
            }
        }
    }
}

fn key_of(object: &DynamicObject) -> Key {
    (
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// The object as JSON, with its metadata (what the counting code reads).
fn as_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

/// Reads an object as the Rust type `K`; the error names the field that does not fit.
pub fn read_typed<K: serde::de::DeserializeOwned>(object: &DynamicObject) -> Result<K, String> {
    crate::api::read_dynamic(object)
}

/// What the caches keep of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodEntry {
    pub labels: Arc<BTreeMap<String, String>>,
    /// GPUs of its containers and KAI annotations (its DRA claims are counted as claims).
    pub gpus: f64,
    /// Succeeded or Failed: holds nothing.
    pub finished: bool,
}

/// A pod's entry; `None` for pods that claim no GPUs in any way.
pub fn read_pod(object: &Value, resources: &GpuResources) -> Result<Option<PodEntry>, String> {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    let gpus = gpus::pod_object_gpus(object, namespace, resources).map_err(|e| e.to_string())?;
    let has_claims = object["spec"]["resourceClaims"]
        .as_array()
        .is_some_and(|c| !c.is_empty());
    if gpus <= 0.0 && !has_claims {
        return Ok(None);
    }
    let finished = matches!(
        object["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    Ok(Some(PodEntry {
        labels: Arc::new(crate::api::selector::string_map(
            &object["metadata"]["labels"],
        )),
        gpus,
        finished,
    }))
}

/// What the caches keep of a ResourceClaim.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimEntry {
    pub gpus: f64,
    pub labels: Arc<BTreeMap<String, String>>,
    /// The pod that owns it (claims made from a pod's templates).
    pub pod: Option<String>,
    /// Devices are allocated to it (`status.allocation`): they are held until the claim
    /// is deallocated, whatever became of the pod that owns it.
    pub allocated: bool,
}

/// A ResourceClaim's entry (GPUs by the gate's rules for a claim).
pub fn read_claim(object: &Value, resources: &GpuResources) -> Result<Option<ClaimEntry>, String> {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut bare = object.clone();
    bare["apiVersion"] = "resource.k8s.io/v1".into();
    bare["kind"] = "ResourceClaim".into();
    let pod = object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == "Pod")
        .and_then(|o| o["name"].as_str())
        .map(str::to_string);
    if let Some(meta) = bare["metadata"].as_object_mut() {
        meta.remove("ownerReferences");
    }
    match gpus::count(&bare, namespace, resources, &()) {
        Ok(Counted::Claim(c)) => Ok(Some(ClaimEntry {
            gpus: c.gpus,
            labels: Arc::new(crate::api::selector::string_map(
                &object["metadata"]["labels"],
            )),
            pod,
            allocated: !object["status"]["allocation"].is_null(),
        })),
        Ok(_) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// A scalable parent's per-replica GPUs and labels (every one is kept: an unknown parent
/// is an open-ended claim).
pub fn read_scalable(
    object: &Value,
    api_version: &str,
    kind: &str,
    resources: &GpuResources,
) -> Result<Option<Scalable>, String> {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut one = object.clone();
    one["apiVersion"] = api_version.into();
    one["kind"] = kind.into();
    one["spec"]["replicas"] = 1.into();
    if let Some(meta) = one["metadata"].as_object_mut() {
        meta.remove("ownerReferences");
    }
    match gpus::count(&one, namespace, resources, &()) {
        Ok(Counted::Claim(c)) => Ok(Some(Scalable {
            per_replica: c.gpus,
            label_sets: if c.gpus > 0.0 {
                c.label_sets
            } else {
                Vec::new()
            },
        })),
        Ok(_) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether a node offers GPUs (any allocatable GPU resource above zero).
pub fn node_has_gpus(object: &Value, resources: &GpuResources) -> bool {
    object["status"]["allocatable"]
        .as_object()
        .into_iter()
        .flatten()
        .any(|(name, q)| {
            resources.share_of(name).is_some()
                && match q {
                    Value::String(s) => {
                        !s.trim_start_matches('0').is_empty() && !s.starts_with('-')
                    }
                    Value::Number(n) => n.as_f64().is_some_and(|n| n > 0.0),
                    _ => false,
                }
        })
}

/// Every fold the snapshot is built from.
#[derive(Debug)]
pub struct Folds {
    pub policies: Fold<Arc<GpuPolicy>>,
    pub attestations: Fold<Arc<ReadinessAttestation>>,
    pub namespaces: Fold<BTreeMap<String, String>>,
    pub templates: Option<Fold<f64>>,
    pub claims: Option<Fold<ClaimEntry>>,
    pub pods: Fold<PodEntry>,
    pub scalable: HashMap<&'static str, Fold<Scalable>>,
    pub nodes: Option<Fold<bool>>,
}

impl Folds {
    fn synced(&self) -> bool {
        self.policies.synced
            && self.attestations.synced
            && self.namespaces.synced
            && self.pods.synced
            && self.templates.as_ref().is_none_or(|f| f.synced)
            && self.claims.as_ref().is_none_or(|f| f.synced)
            && self.nodes.as_ref().is_none_or(|f| f.synced)
            && self.scalable.values().all(|f| f.synced)
    }

    /// Objects skipped as unreadable, by resource.
    pub fn skipped(&self) -> Vec<(&'static str, usize)> {
        let mut out = vec![
            ("gpupolicies", self.policies.skipped.len()),
            ("readinessattestations", self.attestations.skipped.len()),
            ("pods", self.pods.skipped.len()),
        ];
        if let Some(c) = &self.claims {
            out.push(("resourceclaims", c.skipped.len()));
        }
        if let Some(t) = &self.templates {
            out.push(("resourceclaimtemplates", t.skipped.len()));
        }
        for (resource, f) in &self.scalable {
            out.push((resource, f.skipped.len()));
        }
        out
    }
}

/// The snapshot the folds describe.
pub fn build(folds: &Folds) -> Snapshot {
    let templates: HashMap<(String, String), f64> = folds
        .templates
        .iter()
        .flat_map(|f| f.items())
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let mut snapshot = Snapshot::build(
        folds.policies.items().map(|(_, p)| p.clone()),
        folds.attestations.items().map(|(_, a)| a.clone()),
        folds
            .namespaces
            .items()
            .map(|((_, name), labels)| (name.clone(), labels.clone())),
        templates,
    );
    for ((ns, _), pod) in folds.pods.items() {
        if !pod.finished && pod.gpus > 0.0 {
            snapshot
                .held
                .entry(ns.clone())
                .or_default()
                .push(super::Held {
                    labels: pod.labels.clone(),
                    gpus: pod.gpus,
                });
        }
    }
    for ((ns, name), claim) in folds.claims.iter().flat_map(|f| f.items()) {
        snapshot
            .claims
            .insert((ns.clone(), name.clone()), claim.gpus);
        if claim.gpus <= 0.0 {
            continue;
        }
        // A claim made for a pod holds GPUs while the pod runs, under the pod's labels,
        // and while its devices stay allocated after the pod finished.
        let owner = claim
            .pod
            .as_ref()
            .and_then(|p| folds.pods.items.get(&(ns.clone(), p.clone())));
        if owner.is_some_and(|p| p.finished) && !claim.allocated {
            continue;
        }
        let labels = owner.map_or_else(|| claim.labels.clone(), |p| p.labels.clone());
        snapshot
            .held
            .entry(ns.clone())
            .or_default()
            .push(super::Held {
                labels,
                gpus: claim.gpus,
            });
    }
    for (resource, fold) in &folds.scalable {
        let group = if *resource == "replicationcontrollers" {
            ""
        } else {
            "apps"
        };
        for ((ns, name), s) in fold.items() {
            let target: ScaleTarget = (
                group.to_string(),
                resource.to_string(),
                ns.clone(),
                name.clone(),
            );
            snapshot.add_scalable(target, s.clone());
        }
    }
    snapshot.gpu_nodes = folds
        .nodes
        .as_ref()
        .filter(|f| f.synced)
        .map(|f| f.items().filter(|(_, has)| **has).count() as u64);
    snapshot
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

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
