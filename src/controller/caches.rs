//! Watches of the long-running controller: the pods that claim GPUs (a fold of the pod
//! watch keeping only what the inventory reads; pods without GPUs are not kept), owners
//! (a fold of each kind's metadata watch keeping its `ObjectInfo`) for every owner kind
//! that is served — the kinds the controller names, plus, found by API discovery, every other
//! namespaced kind with a `/scale` subresource and the KServe LLMInferenceService —
//! GpuPolicies, namespace metadata, and the DRA ResourceClaimTemplates and ResourceClaims
//! (spec only) that pods' GPUs come from. A cycle reads the stores instead of listing; a
//! GpuPolicy change wakes the loop early. GpuPolicies are watched untyped and read one
//! at a time when a cycle reads the store (`policies::read_all`): one that does not fit
//! the Rust types can neither fail the watch's list nor keep `wait_synced` waiting.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;

use super::policies::{self, Policies};
use crate::api::GpuPolicy;
use crate::cluster::discovery;
use crate::cluster::inventory::{self, ClaimGpus, ObjectInfo, ObjectKey, PodInfo};
use crate::gpus::GpuResources;

/// The stores a cycle reads.
pub struct Caches {
    pods: GpuPods,
    /// Each owner kind's objects, as the inventory reads them (`ObjectInfo`).
    owners: Vec<(ApiResource, Folded<ObjectInfo>)>,
    /// GpuPolicies as the API server sent them, read by each cycle.
    policies: Store<DynamicObject>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// DRA claim templates, when resource.k8s.io/v1 is served.
    templates: Option<Store<ResourceClaimTemplate>>,
    /// DRA claims (spec only), for pods that name one (`resourceClaimName`).
    claims: Option<Store<ResourceClaim>>,
    /// Notified on every GpuPolicy event.
    pub policy_changed: Arc<Notify>,
}

/// A watch folded into a map by namespace and name, keeping of each object only what
/// `keep` makes of it (nothing: the object is not kept). The pods' watch keeps the pods
/// that claim GPUs: a pod that claims none is read as it passes (whether a pod claims GPUs
/// cannot change: extended resources and resource claims are immutable in a pod spec).
/// At 50,000 pods of which 10,000 hold GPUs, a reflector store of every pod kept 40,000
/// entries (an `ObjectMeta` and a key each, ≈ 40 MB) that no cycle reads. The owners'
/// watches keep each owner's `ObjectInfo`: a reflector store kept its
/// `PartialObjectMeta` and a key repeating the kind's `ApiResource` (≈ 25,000 owners at
/// 50,000 pods).
struct Folded<T> {
    inner: Arc<std::sync::RwLock<FoldedInner<T>>>,
    ready: Arc<tokio::sync::watch::Sender<bool>>,
}

impl<T> Clone for Folded<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<T> Default for Folded<T> {
    fn default() -> Self {
        Self {
            inner: Default::default(),
            ready: Default::default(),
        }
    }
}

struct FoldedInner<T> {
    items: HashMap<(String, String), T>,
    /// The objects of an initial list (or re-list) being read.
    listing: Option<HashMap<(String, String), T>>,
}

impl<T> Default for FoldedInner<T> {
    fn default() -> Self {
        Self {
            items: HashMap::new(),
            listing: None,
        }
    }
}

impl<T> Folded<T> {
    fn fold<K>(&self, event: &watcher::Event<K>, keep: impl Fn(&K) -> Option<T>)
    where
        K: kube::Resource,
    {
        let key = |o: &K| {
            let m = o.meta();
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            )
        };
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Init => inner.listing = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                if let Some(kept) = keep(o) {
                    inner
                        .listing
                        .get_or_insert_with(HashMap::new)
                        .insert(key(o), kept);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listing) = inner.listing.take() {
                    inner.items = listing;
                }
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(o) => match keep(o) {
                Some(kept) => {
                    inner.items.insert(key(o), kept);
                }
                None => {
                    inner.items.remove(&key(o));
                }
            },
            watcher::Event::Delete(o) => {
                inner.items.remove(&key(o));
            }
        }
    }

    /// Reads what is kept now.
    fn with<R>(&self, read: impl FnOnce(&HashMap<(String, String), T>) -> R) -> R {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        read(&inner.items)
    }

    async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
    }
}

/// The pods that claim GPUs, by namespace and name.
type GpuPods = Folded<Arc<GpuPodParts>>;

impl GpuPods {
    fn apply(&self, event: &watcher::Event<StoredPod>) {
        self.fold(event, |p| p.gpu.clone());
    }

    fn state(&self) -> Vec<Arc<GpuPodParts>> {
        self.with(|items| items.values().cloned().collect())
    }
}

/// What an owner's watch keeps of it: its `ObjectInfo` with only our annotations
/// (kubectl's copy of the last applied manifest is often the largest part of an object)
/// and its controller reference.
fn owner_info(
    resource: &ApiResource,
    owner: &PartialObjectMeta<DynamicObject>,
) -> Option<ObjectInfo> {
    let mut info = ObjectInfo::from_meta(&resource.api_version, &resource.kind, &owner.metadata)?;
    info.annotations =
        our_annotations(Some(std::mem::take(&mut info.annotations))).unwrap_or_default();
    Some(info)
}

/// What wakes the loop early: a notifier and which events ring it.
type Wake<T> = (Arc<Notify>, Box<dyn FnMut(&T) -> bool + Send>);

fn drive<S, T, E>(name: &'static str, stream: S, mut on_event: Option<Wake<T>>)
where
    S: Stream<Item = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send,
{
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    if let Some((n, wanted)) = &mut on_event
                        && wanted(&event)
                    {
                        n.notify_one();
                    }
                }
                Err(e) => {
                    tracing::warn!(watch = name, error = %e, "watch failed; retrying with backoff")
                }
            }
        }
    });
}

/// A pod as the pod store keeps it: only what the inventory reads, so 50,000 pods stay
/// small in memory and a cycle reads them without converting whole pods. Each pod of a
/// list page or watch event is read as a typed [`Pod`] and reduced at once. A pod that
/// claims no GPU keeps only its name, namespace and resourceVersion (which the watcher
/// reads): whether a pod claims GPUs cannot change (extended resources and resource
/// claims are immutable in a pod spec), and most pods of a cluster claim none.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(from = "Pod")]
pub struct StoredPod {
    metadata: kube::api::ObjectMeta,
    /// `None` for a pod that claims no GPU.
    gpu: Option<Arc<GpuPodParts>>,
}

/// What [`inventory::pod_info_from_parts`] reads of a GPU pod. The spec and status parts
/// are kept as compact JSON text and read back once a cycle: a `serde_json::Value` tree
/// of them took ≈ 6 KB per pod (a map node per object), the text ≈ 300 bytes, and reading
/// 10,000 of them back costs a few milliseconds a cycle.
#[derive(Debug)]
struct GpuPodParts {
    meta: ObjectInfo,
    /// `containers` and `initContainers` (each with `resources` and `restartPolicy`
    /// only) and `resourceClaims`, as the API writes them; JSON text.
    spec: Box<str>,
    /// `phase`, `startTime` and each container's `state.waiting.reason`; JSON text.
    status: Box<str>,
    /// The `resourceClaimName`s of `resourceClaims`.
    claim_names: Box<[Box<str>]>,
}

impl GpuPodParts {
    fn spec(&self) -> serde_json::Value {
        serde_json::from_str(&self.spec).unwrap_or_default()
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.status).unwrap_or_default()
    }
}

/// The annotations the controller reads (all of them `gpureaper.io/`): a store keeps no
/// others, so 50,000 pods' and owners' annotations of other tools cost nothing.
fn our_annotations(
    annotations: Option<BTreeMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    let ours: BTreeMap<String, String> = annotations?
        .into_iter()
        .filter(|(k, _)| k.starts_with(crate::api::keys::PREFIX))
        .collect();
    (!ours.is_empty()).then_some(ours)
}

impl From<Pod> for StoredPod {
    fn from(pod: Pod) -> Self {
        let gpu = claims_gpus(&pod)
            .then(|| gpu_parts(&pod))
            .flatten()
            .map(Arc::new);
        let m = pod.metadata;
        Self {
            metadata: kube::api::ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                resource_version: m.resource_version,
                ..Default::default()
            },
            gpu,
        }
    }
}

/// The parts of a GPU pod the inventory reads; `None` without a name.
fn gpu_parts(pod: &Pod) -> Option<GpuPodParts> {
    use serde_json::{Map, Value};
    let mut meta = ObjectInfo::from_meta("v1", "Pod", &pod.metadata)?;
    meta.annotations =
        our_annotations(Some(std::mem::take(&mut meta.annotations))).unwrap_or_default();
    let container = |resources: &Option<_>, restart_policy: &Option<String>| {
        let mut c = Map::new();
        if let Some(r) = resources {
            c.insert(
                "resources".into(),
                serde_json::to_value::<&k8s_openapi::api::core::v1::ResourceRequirements>(r)
                    .unwrap_or_default(),
            );
        }
        if let Some(p) = restart_policy {
            c.insert("restartPolicy".into(), p.as_str().into());
        }
        Value::Object(c)
    };
    let mut spec = Map::new();
    if let Some(s) = &pod.spec {
        spec.insert(
            "containers".into(),
            s.containers
                .iter()
                .map(|c| container(&c.resources, &c.restart_policy))
                .collect(),
        );
        if let Some(init) = &s.init_containers {
            spec.insert(
                "initContainers".into(),
                init.iter()
                    .map(|c| container(&c.resources, &c.restart_policy))
                    .collect(),
            );
        }
        if let Some(claims) = &s.resource_claims {
            spec.insert(
                "resourceClaims".into(),
                serde_json::to_value(claims).unwrap_or_default(),
            );
        }
    }
    let mut status = Map::new();
    if let Some(s) = &pod.status {
        if let Some(phase) = &s.phase {
            status.insert("phase".into(), phase.as_str().into());
        }
        if let Some(t) = &s.start_time {
            status.insert(
                "startTime".into(),
                serde_json::to_value(t).unwrap_or_default(),
            );
        }
        if let Some(cs) = &s.container_statuses {
            let waiting = |c: &k8s_openapi::api::core::v1::ContainerStatus| {
                let reason = c.state.as_ref()?.waiting.as_ref()?.reason.clone()?;
                Some(serde_json::json!({"state": {"waiting": {"reason": reason}}}))
            };
            status.insert(
                "containerStatuses".into(),
                cs.iter()
                    .map(|c| waiting(c).unwrap_or_else(|| Value::Object(Map::new())))
                    .collect(),
            );
        }
    }
    let claim_names = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref().map(Box::from))
        .collect();
    let text = |present: bool, v: Map<String, Value>| -> Box<str> {
        if present {
            Value::Object(v).to_string().into()
        } else {
            "null".into()
        }
    };
    Some(GpuPodParts {
        meta,
        spec: text(pod.spec.is_some(), spec),
        status: text(pod.status.is_some(), status),
        claim_names,
    })
}

impl k8s_openapi::Resource for StoredPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for StoredPod {
    type Ty = kube::api::ObjectMeta;

    fn metadata(&self) -> &Self::Ty {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut Self::Ty {
        &mut self.metadata
    }
}

/// Whether a GpuPolicy watch event should start a cycle at once: a policy added or
/// deleted, or its spec changed (a new `generation`). Status changes must not: the
/// controller applies every policy's status each cycle (`lastEvaluationTime` at least),
/// so waking on them made each cycle start the next one 200 ms later, evaluating (and
/// querying Prometheus) continuously instead of every `--interval`. `generations` holds
/// the generation last seen per policy; a re-list after a watch error wakes nothing when
/// no spec changed.
fn policy_spec_changed(
    generations: &mut HashMap<String, Option<i64>>,
    event: &watcher::Event<DynamicObject>,
) -> bool {
    use kube::ResourceExt as _;
    match event {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            generations.insert(p.name_any(), p.metadata.generation) != Some(p.metadata.generation)
        }
        watcher::Event::Delete(p) => {
            generations.remove(&p.name_any());
            true
        }
        watcher::Event::Init | watcher::Event::InitDone => false,
    }
}

impl Caches {
    /// Starts the watches; owner kinds whose API is not served, or that RBAC does not let
    /// the controller list, are skipped (pods under them are reported, not acted on).
    pub async fn start(
        client: &Client,
        owner_kinds: &[(&str, &str, &str, &str)],
        policy_selector: &str,
    ) -> Self {
        let config = watcher::Config::default().page_size(500);
        let pods = GpuPods::default();
        let fold = pods.clone();
        let stream = watcher(Api::<StoredPod>::all(client.clone()), config.clone())
            .default_backoff()
            .map_ok(move |event| fold.apply(&event));
        drive("pods", stream, None);

        let mut owners = Vec::new();
        let named = owner_kinds.len();
        for (i, resource) in discovery::owner_resources(client, owner_kinds)
            .await
            .into_iter()
            .enumerate()
        {
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::all_with(client.clone(), &resource);
            if let Err(e) = api.list(&ListParams::default().limit(1)).await {
                let kind = resource.kind.as_str();
                if i < named {
                    tracing::debug!(kind, error = %e, "not watched (not served here)");
                } else {
                    tracing::info!(kind, group = %resource.group, error = %e, "found by discovery but not listable (RBAC?): pods under it are reported, not acted on");
                }
                continue;
            }
            let folded = Folded::default();
            let fold = folded.clone();
            let kind = resource.clone();
            let stream = watcher(api, config.clone())
                .default_backoff()
                .map_ok(move |event| fold.fold(&event, |o| owner_info(&kind, o)));
            drive("owners", stream, None);
            owners.push((resource, folded));
        }

        let policy_changed = Arc::new(Notify::new());
        let policy_resource = ApiResource::erase::<GpuPolicy>(&());
        let writer = reflector::store::Writer::new(policy_resource.clone());
        let policies = writer.as_reader();
        let stream = reflector::reflector(
            writer,
            watcher(
                Api::<DynamicObject>::all_with(client.clone(), &policy_resource),
                config.clone().labels(policy_selector),
            ),
        )
        .default_backoff();
        let mut generations = HashMap::new();
        drive(
            "gpupolicies",
            stream,
            Some((
                policy_changed.clone(),
                Box::new(move |event| policy_spec_changed(&mut generations, event)),
            )),
        );

        let template_api = Api::<ResourceClaimTemplate>::all(client.clone());
        let templates = if template_api
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
        {
            let (reader, writer) = reflector::store();
            let stream = reflector::reflector(writer, watcher(template_api, config.clone()))
                .default_backoff();
            drive("resourceclaimtemplates", stream, None);
            Some(reader)
        } else {
            None
        };

        // Claims are watched only for their spec: status (allocations, up to 256
        // reservedFor entries) is dropped.
        let claim_api = Api::<ResourceClaim>::all(client.clone());
        let claims = if claim_api
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
        {
            let (reader, writer) = reflector::store();
            let stream = reflector::reflector(
                writer,
                watcher(claim_api, config.clone()).modify(|c: &mut ResourceClaim| {
                    c.metadata.managed_fields = None;
                    c.status = None;
                }),
            )
            .default_backoff();
            drive("resourceclaims", stream, None);
            Some(reader)
        } else {
            None
        };

        let (namespaces, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                config,
            ),
        )
        .default_backoff();
        drive("namespaces", stream, None);

        Self {
            pods,
            owners,
            policies,
            namespaces,
            templates,
            claims,
            policy_changed,
        }
    }

    /// Waits until every watch has listed once.
    pub async fn wait_synced(&self) {
        self.pods.wait_until_ready().await;
        for (_, owners) in &self.owners {
            owners.wait_until_ready().await;
        }
        let _ = self.policies.wait_until_ready().await;
        let _ = self.namespaces.wait_until_ready().await;
        if let Some(t) = &self.templates {
            let _ = t.wait_until_ready().await;
        }
        if let Some(c) = &self.claims {
            let _ = c.wait_until_ready().await;
        }
    }

    /// What the stores hold now, in the inventory's terms.
    #[allow(clippy::type_complexity)]
    pub fn read(
        &self,
        resources: &GpuResources,
        now: jiff::Timestamp,
    ) -> (
        Vec<PodInfo>,
        HashMap<ObjectKey, ObjectInfo>,
        Policies,
        HashMap<String, BTreeMap<String, String>>,
    ) {
        let template_objects: Vec<_> = self.templates.iter().flat_map(|t| t.state()).collect();
        let templates = crate::gpus::claim_template_gpus(
            template_objects.iter().map(|t| t.as_ref()),
            resources,
        );
        let candidates = self.pods.state();
        let claims = self.named_claims(&candidates, resources);
        let pods: Vec<PodInfo> = candidates
            .iter()
            .filter_map(|p| {
                inventory::pod_info_from_parts(
                    p.meta.clone(),
                    &p.spec(),
                    &p.status(),
                    resources,
                    &templates,
                    &claims,
                    now,
                )
            })
            .collect();
        let owners = owners_read(&self.owners, pods.iter().map(|p| &p.meta));
        let policies = policies::read_all(self.policies.state().iter().map(|p| p.as_ref()));
        let namespaces = self
            .namespaces
            .state()
            .iter()
            .filter_map(|n| {
                Some((
                    n.metadata.name.clone()?,
                    n.metadata.labels.clone().unwrap_or_default(),
                ))
            })
            .collect();
        (pods, owners, policies, namespaces)
    }
}

impl Caches {
    /// The GPUs of the ResourceClaims that `pods` name directly; only those are counted.
    fn named_claims(&self, pods: &[Arc<GpuPodParts>], resources: &GpuResources) -> ClaimGpus {
        let Some(store) = &self.claims else {
            return ClaimGpus::new();
        };
        let named: Vec<Arc<ResourceClaim>> = pods
            .iter()
            .flat_map(|p| {
                let ns = p.meta.namespace.as_str();
                p.claim_names
                    .iter()
                    .filter_map(move |name| store.get(&ObjectRef::new(name).within(ns)))
            })
            .collect();
        inventory::claim_gpus(named.iter().map(|c| c.as_ref()), resources)
    }
}

/// The owners a cycle reads: every object up the chain of a GPU pod (its workload),
/// and every object with a `gpureaper.io/` annotation — a workload scaled to zero has
/// no pods, and its restore record, `reaped-at` or wake request is read from it — with
/// the chain above it (a ReplicaSet keeps the annotations the Deployment controller
/// copied onto it; it is a root only if its owner is unknown). The other owners stay
/// in their stores unread: at 50,000 pods, turning each of ≈ 25,000 owners into an
/// `ObjectInfo` every cycle was most of what a cycle added to the steady memory.
fn owners_read<'a>(
    kinds: &[(ApiResource, Folded<ObjectInfo>)],
    pods: impl Iterator<Item = &'a ObjectInfo>,
) -> HashMap<ObjectKey, ObjectInfo> {
    let mut owners: HashMap<ObjectKey, ObjectInfo> = HashMap::new();
    // (apiVersion, kind, namespace, name) still to look up.
    let mut pending: Vec<(String, String, String, String)> = Vec::new();
    let up = |o: &ObjectInfo| {
        o.owner.as_ref().map(|r| {
            (
                r.api_version.clone(),
                r.kind.clone(),
                o.namespace.clone(),
                r.name.clone(),
            )
        })
    };
    pending.extend(pods.filter_map(up));
    for (_, kept) in kinds {
        kept.with(|items| {
            for info in items.values() {
                let ours = info
                    .annotations
                    .keys()
                    .any(|k| k.starts_with(crate::api::keys::PREFIX));
                if ours {
                    pending.extend(up(info));
                    owners.insert(info.key(), info.clone());
                }
            }
        });
    }
    while let Some((api_version, kind, namespace, name)) = pending.pop() {
        let key = ObjectKey::new(&api_version, &kind, &namespace, &name);
        if owners.contains_key(&key) {
            continue;
        }
        let group = inventory::group_of(&api_version);
        let Some((_, kept)) = kinds
            .iter()
            .find(|(r, _)| r.kind == kind && r.group == group)
        else {
            continue;
        };
        let Some(info) = kept.with(|items| items.get(&(namespace, name)).cloned()) else {
            continue;
        };
        pending.extend(up(&info));
        owners.insert(key, info);
    }
    owners
}

/// A cheap first filter before the exact count: some container asks for an extended
/// resource, or the pod uses DRA claims.
fn claims_gpus(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let extended = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources.as_ref().is_some_and(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flat_map(|m| m.keys())
                .any(|k| k.contains('/') && !k.starts_with("kubernetes.io/"))
        })
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(extended)
        || spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
}

#[cfg(test)]
#[path = "caches_tests.rs"]
mod tests;
