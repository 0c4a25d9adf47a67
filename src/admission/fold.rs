//! What the webhook's caches keep of each watched object, and the [`Snapshot`] they
//! describe. Pure: a watch event goes in ([`Fold::apply`]), the counts and labels a
//! decision needs come out ([`build`]); `cache` runs the watches that feed it.
//!
//! Each object is read on its own: one that does not fit the Rust types is skipped with
//! the reason, never failing the list (G4). An unreadable attestation covers nothing; an
//! unreadable new version of a GpuPolicy leaves its last readable version in force, so
//! the gate never loosens because of it. Only what a decision needs is kept: GPUs and
//! labels per pod and claim, per-replica GPUs per scalable parent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use serde_json::Value;

use super::snapshot::{Held, Scalable, ScaleTarget, Snapshot};
use crate::api::{GpuPolicy, ReadinessAttestation};
use crate::gpus::{self, Counted, GpuResources};

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
    /// Whether every watch has listed once.
    pub fn synced(&self) -> bool {
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
            snapshot.held.entry(ns.clone()).or_default().push(Held {
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
        snapshot.held.entry(ns.clone()).or_default().push(Held {
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

#[cfg(test)]
#[path = "fold_tests.rs"]
mod tests;
