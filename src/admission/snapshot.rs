//! What the budget gate decides over: the webhook's caches indexed by namespace and key,
//! rebuilt whole and never changed once published. Pure data; `cache` fills it from the
//! watches, `commands::check` from files, the tests by hand.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::api::{GpuPolicy, ReadinessAttestation};
use crate::gpus::ClaimTemplates;

/// Something a namespace holds GPUs with now: a pod that has not finished, or a
/// ResourceClaim that no pod owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    /// Its labels (what attestation selectors match).
    pub labels: Arc<BTreeMap<String, String>>,
    pub gpus: f64,
}

/// A parent of a `/scale` subresource: (API group, resource plural, namespace, name).
pub type ScaleTarget = (String, String, String, String);

/// What a scale write needs of its parent.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalable {
    /// GPUs one replica claims.
    pub per_replica: f64,
    /// Labels of the object and its pod template.
    pub label_sets: Vec<BTreeMap<String, String>>,
}

/// What the webhook's caches hold, indexed for the decision.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every GpuPolicy.
    pub policies: Vec<Arc<GpuPolicy>>,
    /// ReadinessAttestations by namespace.
    pub attestations: HashMap<String, Vec<Arc<ReadinessAttestation>>>,
    /// Namespace labels by name.
    pub namespaces: HashMap<String, BTreeMap<String, String>>,
    /// GPUs per pod of each DRA ResourceClaimTemplate, by (namespace, name).
    pub claim_templates: HashMap<(String, String), f64>,
    /// GPUs of each existing DRA ResourceClaim, by (namespace, name).
    pub claims: HashMap<(String, String), f64>,
    /// What each namespace holds GPUs with now (pods, unowned ResourceClaims).
    pub held: HashMap<String, Vec<Held>>,
    /// Parents of `/scale` subresources (Deployments, StatefulSets, ReplicaSets,
    /// ReplicationControllers), every one of them, GPUs or not.
    pub scalable: HashMap<ScaleTarget, Scalable>,
    /// Nodes that offer GPUs (a DaemonSet runs one pod on each); `None`: unknown.
    pub gpu_nodes: Option<u64>,
}

impl Snapshot {
    /// Indexes the cached objects.
    pub fn build(
        policies: impl IntoIterator<Item = Arc<GpuPolicy>>,
        attestations: impl IntoIterator<Item = Arc<ReadinessAttestation>>,
        namespaces: impl IntoIterator<Item = (String, BTreeMap<String, String>)>,
        claim_templates: HashMap<(String, String), f64>,
    ) -> Self {
        let mut by_namespace: HashMap<String, Vec<Arc<ReadinessAttestation>>> = HashMap::new();
        for a in attestations {
            let ns = a.metadata.namespace.clone().unwrap_or_default();
            by_namespace.entry(ns).or_default().push(a);
        }
        let mut policies: Vec<_> = policies.into_iter().collect();
        policies.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Self {
            policies,
            attestations: by_namespace,
            namespaces: namespaces.into_iter().collect(),
            claim_templates,
            ..Self::default()
        }
    }

    /// Records that `namespace` holds `gpus` GPUs with an object labelled `labels`.
    pub fn add_held(&mut self, namespace: &str, labels: BTreeMap<String, String>, gpus: f64) {
        if gpus.is_finite() && gpus > 0.0 {
            self.held
                .entry(namespace.to_string())
                .or_default()
                .push(Held {
                    labels: Arc::new(labels),
                    gpus,
                });
        }
    }

    /// Records the parent of a `/scale` subresource.
    pub fn add_scalable(&mut self, target: ScaleTarget, scalable: Scalable) {
        self.scalable.insert(target, scalable);
    }

    /// Number of attestations cached.
    pub fn attestation_count(&self) -> usize {
        self.attestations.values().map(Vec::len).sum()
    }

    /// GPUs `namespace` holds now.
    pub fn held_gpus(&self, namespace: &str) -> f64 {
        total(
            self.held
                .get(namespace)
                .into_iter()
                .flatten()
                .map(|h| h.gpus),
        )
    }
}

/// The facts a GPU count reads from the caches: claim templates, existing claims, GPU
/// nodes.
impl ClaimTemplates for Snapshot {
    fn gpus(&self, namespace: &str, name: &str) -> Option<f64> {
        self.claim_templates
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
    }

    fn claim_gpus(&self, namespace: &str, name: &str) -> Option<f64> {
        self.claims
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
    }

    fn gpu_nodes(&self) -> Option<u64> {
        self.gpu_nodes
    }
}

/// A sum that is +0 when empty (`Iterator::sum` of no `f64` is -0, printed "-0").
pub(super) fn total(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, |a, b| a + b)
}
