//! Inventory: pods that hold GPUs, resolved through controller owner references to the
//! root workload gpu-reaper acts on. Pure: the controller feeds it what its watches hold.
//!
//! Resolution walks `controller: true` owner references through the objects it knows
//! (ReplicaSet → Deployment, Job, StatefulSet, …). A Job owned by a CronJob stays the
//! root (the Job is what is suspended) and the CronJob is reported. When an owner is not
//! in the watched set (e.g. a RayCluster or Notebook whose CRD gpu-reaper does not watch
//! yet), the last known object in the chain is the root and the unknown owner is kept in
//! `unwatched_owner` so it can be reported instead of acted on blindly.
//!
//! GPUs are counted by the budget gate's rules (`crate::gpus`): extended resources,
//! DRA claims made from claim templates, and ResourceClaims a pod names directly
//! (`resourceClaimName`). A named claim can be shared by several pods: a workload counts
//! each claim once.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::engine::model::{PodPhase, PodState};
use crate::gpus::{self, Counted, GpuResources};

/// A controller owner reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

/// Identity of an object: API group (no version), kind, namespace, name.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            group: group_of(api_version).to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.kind, self.name)
    }
}

/// The API group of an `apiVersion` (`apps/v1` → `apps`, `v1` → ``).
pub fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

/// What the inventory needs of any object.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectInfo {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// `metadata.uid` (empty when unknown): Events name the object by it, so
    /// `kubectl describe` shows them.
    pub uid: String,
    pub owner: Option<OwnerRef>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub created_at: Timestamp,
    /// `metadata.deletionTimestamp` is set: never acted on.
    pub deleting: bool,
}

impl ObjectInfo {
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.api_version, &self.kind, &self.namespace, &self.name)
    }

    /// From an object's JSON (`apiVersion`, `kind`, `metadata`).
    pub fn from_value(v: &serde_json::Value) -> Option<Self> {
        let meta = &v["metadata"];
        let strings = crate::api::selector::string_map;
        let owner = meta["ownerReferences"].as_array().and_then(|refs| {
            refs.iter()
                .find(|r| r["controller"].as_bool() == Some(true))
                .and_then(|r| {
                    Some(OwnerRef {
                        api_version: r["apiVersion"].as_str()?.to_string(),
                        kind: r["kind"].as_str()?.to_string(),
                        name: r["name"].as_str()?.to_string(),
                    })
                })
        });
        Some(Self {
            api_version: v["apiVersion"].as_str()?.to_string(),
            kind: v["kind"].as_str()?.to_string(),
            namespace: meta["namespace"].as_str().unwrap_or("").to_string(),
            name: meta["name"].as_str()?.to_string(),
            uid: meta["uid"].as_str().unwrap_or("").to_string(),
            owner,
            labels: strings(&meta["labels"]),
            annotations: strings(&meta["annotations"]),
            created_at: meta["creationTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or(Timestamp::UNIX_EPOCH),
            deleting: meta.get("deletionTimestamp").is_some_and(|d| !d.is_null()),
        })
    }
}

impl ObjectInfo {
    /// From typed metadata: what [`Self::from_value`] reads of the same object's JSON
    /// (timestamps to the second, as the API serialises them), without building it.
    pub fn from_meta(
        api_version: &str,
        kind: &str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Option<Self> {
        let seconds = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
            Timestamp::from_second(t.0.as_second()).ok()
        };
        Some(Self {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone()?,
            uid: meta.uid.clone().unwrap_or_default(),
            owner: meta.owner_references.as_ref().and_then(|refs| {
                refs.iter()
                    .find(|r| r.controller == Some(true))
                    .map(|r| OwnerRef {
                        api_version: r.api_version.clone(),
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                    })
            }),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
            created_at: meta
                .creation_timestamp
                .as_ref()
                .and_then(seconds)
                .unwrap_or(Timestamp::UNIX_EPOCH),
            deleting: meta.deletion_timestamp.is_some(),
        })
    }
}

/// A pod that holds GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    pub meta: ObjectInfo,
    pub state: PodState,
    /// GPUs (MIG slices as fractions) the pod claims, its named ResourceClaims included.
    pub gpus: f64,
    /// The ResourceClaims the pod names directly and the GPUs of each: a claim shared by
    /// several pods of one workload is counted once for the workload.
    pub named_claims: Vec<(String, f64)>,
}

/// GPUs of existing ResourceClaims, by (namespace, name).
pub type ClaimGpus = HashMap<(String, String), f64>;

/// The GPUs of each ResourceClaim, by the budget gate's rules for a claim
/// (`spec.devices.requests` of GPU device classes). A claim made from a template is
/// owned by its pod; the owner does not matter here, so it is counted all the same.
pub fn claim_gpus<'a>(
    claims: impl Iterator<Item = &'a ResourceClaim>,
    resources: &GpuResources,
) -> ClaimGpus {
    let mut out = HashMap::new();
    for claim in claims {
        let (Some(ns), Some(name)) = (&claim.metadata.namespace, &claim.metadata.name) else {
            continue;
        };
        let value = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": claim.spec,
        });
        if let Ok(Counted::Claim(c)) = gpus::count(&value, ns, resources, &()) {
            out.insert((ns.clone(), name.clone()), c.gpus);
        }
    }
    out
}

/// The claims a pod spec names directly: `spec.resourceClaims[].resourceClaimName` (or
/// the pre-1.28 `source.resourceClaimName`).
fn named_claim_names(spec: &serde_json::Value) -> Vec<&str> {
    spec["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            c["resourceClaimName"]
                .as_str()
                .or_else(|| c["source"]["resourceClaimName"].as_str())
        })
        .collect()
}

/// Reads a pod; `None` when it claims no GPUs, has finished, or cannot be read. GPUs
/// claimed through DRA claim templates are not counted (see [`pod_info_with`]).
pub fn pod_info(
    pod: &serde_json::Value,
    resources: &GpuResources,
    now: Timestamp,
) -> Option<PodInfo> {
    pod_info_with(pod, resources, &(), now)
}

/// As [`pod_info`], counting the GPUs of the pod's DRA claims made from the claim
/// templates `templates` knows.
pub fn pod_info_with(
    pod: &serde_json::Value,
    resources: &GpuResources,
    templates: &dyn gpus::ClaimTemplates,
    now: Timestamp,
) -> Option<PodInfo> {
    pod_info_with_claims(pod, resources, templates, &ClaimGpus::new(), now)
}

/// As [`pod_info_with`], also counting the GPUs of the ResourceClaims the pod names
/// directly, as `claims` knows them (a claim it does not know counts nothing).
pub fn pod_info_with_claims(
    pod: &serde_json::Value,
    resources: &GpuResources,
    templates: &dyn gpus::ClaimTemplates,
    claims: &ClaimGpus,
    now: Timestamp,
) -> Option<PodInfo> {
    pod_info_from_parts(
        ObjectInfo::from_value(pod)?,
        &pod["spec"],
        &pod["status"],
        resources,
        templates,
        claims,
        now,
    )
}

/// As [`pod_info_with_claims`], from the pod's metadata already read and its `spec` and
/// `status` as JSON (of which only what this function reads needs to be there).
pub fn pod_info_from_parts(
    meta: ObjectInfo,
    spec: &serde_json::Value,
    status: &serde_json::Value,
    resources: &GpuResources,
    templates: &dyn gpus::ClaimTemplates,
    claims: &ClaimGpus,
    now: Timestamp,
) -> Option<PodInfo> {
    let (mut gpus, _) =
        gpus::pod_spec_gpus(spec, "spec", &meta.namespace, resources, templates).ok()?;
    let mut named_claims: Vec<(String, f64)> = Vec::new();
    for name in named_claim_names(spec) {
        let Some(g) = claims
            .get(&(meta.namespace.clone(), name.to_string()))
            .copied()
            .filter(|g| g.is_finite() && *g > 0.0)
        else {
            continue;
        };
        if !named_claims.iter().any(|(n, _)| n == name) {
            gpus += g;
            named_claims.push((name.to_string(), g));
        }
    }
    if gpus <= 0.0 {
        return None;
    }
    let phase = match status["phase"].as_str() {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some("Pending") | None => PodPhase::Pending,
        _ => PodPhase::Unknown,
    };
    if matches!(phase, PodPhase::Succeeded | PodPhase::Failed) {
        return None;
    }
    let waiting_reason = status["containerStatuses"].as_array().and_then(|cs| {
        cs.iter().find_map(|c| {
            c["state"]["waiting"]["reason"]
                .as_str()
                .filter(|r| *r != "ContainerCreating" && *r != "PodInitializing")
                .map(str::to_string)
        })
    });
    let stuck_since = (phase == PodPhase::Pending || waiting_reason.is_some()).then(|| {
        status["startTime"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or(meta.created_at)
            .min(now)
    });
    Some(PodInfo {
        meta,
        state: PodState {
            phase,
            waiting_reason,
            stuck_since,
            gpu_devices: gpus.ceil() as u32,
        },
        gpus,
        named_claims,
    })
}

/// A root workload and the GPU pods it owns.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The object gpu-reaper acts on and keeps ladder state on.
    pub root: ObjectInfo,
    pub pods: Vec<PodInfo>,
    /// GPUs held by all its pods.
    pub gpus: f64,
    /// A CronJob that created the Job root (reported; the Job is acted on).
    pub cron_job: Option<String>,
    /// An owner of the root whose kind gpu-reaper does not watch (reported, not acted on).
    pub unwatched_owner: Option<OwnerRef>,
}

/// Groups GPU pods by root workload. `objects` holds the watched owners (ReplicaSets,
/// Deployments, StatefulSets, Jobs, …) by key. Output is sorted by key.
pub fn resolve(pods: Vec<PodInfo>, objects: &HashMap<ObjectKey, ObjectInfo>) -> Vec<Workload> {
    let mut by_root: BTreeMap<ObjectKey, Workload> = BTreeMap::new();
    for pod in pods {
        let mut root = pod.meta.clone();
        let mut cron_job = None;
        let mut unwatched_owner = None;
        // Bounded: owner chains are short; a cycle in bad data must not hang the loop.
        for _ in 0..8 {
            let Some(owner) = root.owner.clone() else {
                break;
            };
            if owner.kind == "CronJob" && root.kind == "Job" {
                cron_job = Some(owner.name.clone());
                break;
            }
            let key = ObjectKey::new(
                &owner.api_version,
                &owner.kind,
                &root.namespace,
                &owner.name,
            );
            match objects.get(&key) {
                Some(parent) => root = parent.clone(),
                None => {
                    // Not watched (a CRD gpu-reaper does not know yet): report it and act
                    // on nothing, since acting below it would fight the controller above.
                    unwatched_owner = Some(owner);
                    break;
                }
            }
        }
        let entry = by_root.entry(root.key()).or_insert_with(|| Workload {
            root: root.clone(),
            pods: Vec::new(),
            gpus: 0.0,
            cron_job: cron_job.clone(),
            unwatched_owner: unwatched_owner.clone(),
        });
        // A claim another pod of this workload already named is the same devices.
        let shared: f64 = pod
            .named_claims
            .iter()
            .filter(|(name, _)| {
                entry
                    .pods
                    .iter()
                    .any(|p| p.named_claims.iter().any(|(n, _)| n == name))
            })
            .map(|(_, g)| g)
            .sum();
        entry.gpus += pod.gpus - shared;
        entry.pods.push(pod);
    }
    let mut out: Vec<Workload> = by_root.into_values().collect();
    for w in &mut out {
        w.pods.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(
        api_version: &str,
        kind: &str,
        name: &str,
        owner: Option<(&str, &str, &str)>,
    ) -> serde_json::Value {
        let mut v = json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-11-29T10:00:00Z",
                         "labels": {"app": name}, "annotations": {"gpureaper.io/warned-at": "2026-11-29T11:00:00Z"}},
        });
        if let Some((av, k, n)) = owner {
            v["metadata"]["ownerReferences"] =
                json!([{"apiVersion": av, "kind": k, "name": n, "uid": "u", "controller": true}]);
        }
        v
    }

    fn gpu_pod(
        name: &str,
        owner: Option<(&str, &str, &str)>,
        gpus: &str,
        phase: &str,
    ) -> serde_json::Value {
        let mut p = object("v1", "Pod", name, owner);
        p["spec"] = json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]});
        p["status"] = json!({"phase": phase});
        p
    }

    fn now() -> Timestamp {
        "2026-11-29T12:00:00Z".parse().unwrap()
    }

    fn objects(list: &[serde_json::Value]) -> HashMap<ObjectKey, ObjectInfo> {
        list.iter()
            .map(|v| {
                let o = ObjectInfo::from_value(v).unwrap();
                (o.key(), o)
            })
            .collect()
    }

    #[test]
    fn pods_of_a_deployment_resolve_through_their_replicaset_and_sum_their_gpus() {
        let owners = objects(&[
            object("apps/v1", "Deployment", "llm", None),
            object(
                "apps/v1",
                "ReplicaSet",
                "llm-5d8f",
                Some(("apps/v1", "Deployment", "llm")),
            ),
        ]);
        let rs = Some(("apps/v1", "ReplicaSet", "llm-5d8f"));
        let pods = vec![
            pod_info(
                &gpu_pod("llm-5d8f-a", rs, "2", "Running"),
                &GpuResources::default(),
                now(),
            )
            .unwrap(),
            pod_info(
                &gpu_pod("llm-5d8f-b", rs, "2", "Running"),
                &GpuResources::default(),
                now(),
            )
            .unwrap(),
        ];
        let workloads = resolve(pods, &owners);
        assert_eq!(workloads.len(), 1);
        let w = &workloads[0];
        assert_eq!(
            w.root.key(),
            ObjectKey::new("apps/v1", "Deployment", "ml", "llm")
        );
        assert_eq!(w.gpus, 4.0);
        assert_eq!(w.pods.len(), 2);
        assert_eq!(
            w.root.annotations["gpureaper.io/warned-at"],
            "2026-11-29T11:00:00Z"
        );
        assert_eq!(w.unwatched_owner, None);
    }

    #[test]
    fn a_job_of_a_cronjob_is_the_root_and_the_cronjob_is_reported() {
        let owners = objects(&[object(
            "batch/v1",
            "Job",
            "nightly-123",
            Some(("batch/v1", "CronJob", "nightly")),
        )]);
        let pod = pod_info(
            &gpu_pod(
                "nightly-123-x",
                Some(("batch/v1", "Job", "nightly-123")),
                "8",
                "Running",
            ),
            &GpuResources::default(),
            now(),
        )
        .unwrap();
        let w = resolve(vec![pod], &owners).remove(0);
        assert_eq!(w.root.kind, "Job");
        assert_eq!(w.cron_job.as_deref(), Some("nightly"));
    }

    #[test]
    fn an_unwatched_owner_is_reported_and_a_bare_pod_is_its_own_root() {
        let pods = vec![
            pod_info(
                &gpu_pod(
                    "ray-head",
                    Some(("ray.io/v1", "RayCluster", "rc")),
                    "1",
                    "Running",
                ),
                &GpuResources::default(),
                now(),
            )
            .unwrap(),
            pod_info(
                &gpu_pod("scratch", None, "1", "Running"),
                &GpuResources::default(),
                now(),
            )
            .unwrap(),
        ];
        let w = resolve(pods, &HashMap::new());
        assert_eq!(w.len(), 2);
        let ray = w.iter().find(|w| w.root.name == "ray-head").unwrap();
        assert_eq!(
            ray.unwatched_owner.as_ref().map(|o| o.kind.as_str()),
            Some("RayCluster")
        );
        let bare = w.iter().find(|w| w.root.name == "scratch").unwrap();
        assert_eq!(bare.root.kind, "Pod");
        assert_eq!(bare.unwatched_owner, None);
    }

    #[test]
    fn pods_without_gpus_and_finished_pods_are_not_inventoried() {
        let mut cpu = gpu_pod("cpu", None, "1", "Running");
        cpu["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "2"}});
        assert!(pod_info(&cpu, &GpuResources::default(), now()).is_none());
        assert!(
            pod_info(
                &gpu_pod("done", None, "1", "Succeeded"),
                &GpuResources::default(),
                now()
            )
            .is_none()
        );
        let mut crash = gpu_pod("crash", None, "1", "Running");
        crash["status"]["containerStatuses"] =
            json!([{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]);
        let info = pod_info(&crash, &GpuResources::default(), now()).unwrap();
        assert_eq!(
            info.state.waiting_reason.as_deref(),
            Some("CrashLoopBackOff")
        );
        assert!(info.state.stuck_since.is_some());
    }

    #[test]
    fn a_notebook_pod_resolves_through_its_statefulset_to_the_notebook() {
        let owners = objects(&[
            object("kubeflow.org/v1", "Notebook", "nb", None),
            object(
                "apps/v1",
                "StatefulSet",
                "nb",
                Some(("kubeflow.org/v1", "Notebook", "nb")),
            ),
        ]);
        let pod = pod_info(
            &gpu_pod(
                "nb-0",
                Some(("apps/v1", "StatefulSet", "nb")),
                "1",
                "Running",
            ),
            &GpuResources::default(),
            now(),
        )
        .unwrap();
        let w = resolve(vec![pod], &owners).remove(0);
        assert_eq!(
            w.root.key(),
            ObjectKey::new("kubeflow.org/v1", "Notebook", "ml", "nb")
        );
        assert_eq!(w.unwatched_owner, None);
    }

    #[test]
    fn a_pod_whose_gpus_come_from_a_dra_claim_template_is_inventoried_when_the_template_is_known() {
        let mut pod = gpu_pod("dra-0", None, "1", "Running");
        pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpus"}]});
        pod["spec"]["resourceClaims"] =
            json!([{"name": "gpus", "resourceClaimTemplateName": "four-gpus"}]);
        assert!(
            pod_info(&pod, &GpuResources::default(), now()).is_none(),
            "unknown template: no GPUs seen"
        );
        let templates = HashMap::from([(("ml".to_string(), "four-gpus".to_string()), 4.0)]);
        let info = pod_info_with(&pod, &GpuResources::default(), &templates, now()).unwrap();
        assert_eq!(info.gpus, 4.0);
        assert_eq!(info.state.gpu_devices, 4);
    }

    #[test]
    fn pods_naming_a_resource_claim_hold_its_gpus_and_a_shared_claim_counts_once_per_workload() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "two-gpus", "namespace": "ml",
                         // Made from a template: owned by a pod, counted all the same.
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "u", "controller": true}]},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
                {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com"}}]}},
        }))
        .unwrap();
        let claims = claim_gpus([&claim].into_iter(), &GpuResources::default());
        assert_eq!(claims[&("ml".to_string(), "two-gpus".to_string())], 2.0);
        let rs = Some(("apps/v1", "ReplicaSet", "serve-1"));
        let sharing = |name: &str, claim_ref: serde_json::Value| {
            let mut pod = gpu_pod(name, rs, "1", "Running");
            pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpus"}]});
            pod["spec"]["resourceClaims"] = json!([claim_ref]);
            pod_info_with_claims(&pod, &GpuResources::default(), &(), &claims, now())
        };
        let a = sharing(
            "a",
            json!({"name": "gpus", "resourceClaimName": "two-gpus"}),
        )
        .unwrap();
        let b = sharing(
            "b",
            json!({"name": "gpus", "source": {"resourceClaimName": "two-gpus"}}),
        )
        .unwrap();
        assert_eq!((a.gpus, a.state.gpu_devices), (2.0, 2));
        assert_eq!(b.named_claims, vec![("two-gpus".to_string(), 2.0)]);
        assert!(
            sharing("c", json!({"name": "gpus", "resourceClaimName": "missing"})).is_none(),
            "an unknown claim holds nothing known"
        );
        assert!(
            pod_info(
                &{
                    let mut p = gpu_pod("d", rs, "1", "Running");
                    p["spec"]["containers"][0]["resources"] = json!({});
                    p["spec"]["resourceClaims"] =
                        json!([{"name": "gpus", "resourceClaimName": "two-gpus"}]);
                    p
                },
                &GpuResources::default(),
                now()
            )
            .is_none(),
            "without the claims, as before"
        );
        let owners = objects(&[object("apps/v1", "ReplicaSet", "serve-1", None)]);
        let w = resolve(vec![a, b], &owners);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].gpus, 2.0, "one claim, two pods: 2 GPUs, not 4");
    }

    #[test]
    fn an_owner_cycle_in_bad_data_ends() {
        let owners = objects(&[
            object(
                "apps/v1",
                "ReplicaSet",
                "a",
                Some(("apps/v1", "ReplicaSet", "b")),
            ),
            object(
                "apps/v1",
                "ReplicaSet",
                "b",
                Some(("apps/v1", "ReplicaSet", "a")),
            ),
        ]);
        let pod = pod_info(
            &gpu_pod("p", Some(("apps/v1", "ReplicaSet", "a")), "1", "Running"),
            &GpuResources::default(),
            now(),
        )
        .unwrap();
        assert_eq!(resolve(vec![pod], &owners).len(), 1);
    }
}
