//! Actions on root workloads, and restoring them (`gpu-reaper wake`). IO edge.
//!
//! Every action records what restoring needs in `gpureaper.io/restore` before, or in the
//! same write as, the change (invariant 5):
//! - ScaleToZero (`/scale` subresource, found by API discovery for any kind): first an
//!   annotation write with the replica count and `"state": "pending"`, then the scale to
//!   0, then `"state": "done"`. A controller killed in between finds `pending` and
//!   finishes the scale (the same action, not a second one); `done` with replicas above 0
//!   means the owner scaled it back by hand. A kind without `/scale` gets
//!   [`Outcome::Unsupported`] naming what works instead, never an error.
//! - ScaleToZero on a KServe InferenceService / LLMInferenceService: KServe's own stop
//!   annotation `serving.kserve.io/stop: "true"`, in one write with the record (its
//!   previous value kept); an InferenceService whose KServe predates the annotation gets
//!   `spec.predictor.minReplicas: 0` (Serverless scale-to-zero) instead.
//! - ScaleToZero on a RayCluster, and ScaleToZero or Suspend on a RayService (which has
//!   no `spec.suspend`): the worker groups of the RayCluster (a RayService's active one)
//!   go to 0 replicas, minReplicas and maxReplicas, recorded first as with `/scale`.
//! - Suspend (Job `spec.suspend`): one merge patch carries the annotations and the suspend.
//! - Evict: a policy/v1 Eviction per pod; a PodDisruptionBudget refusal (429) is reported
//!   and retried on a later cycle, never forced.
//!   Give `evict` a client built with `Config::default_retry = false`: kube-client's
//!   default retry layer would otherwise retry the 429 for minutes inside one call.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, EvictParams, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::discovery;
use super::inventory::{ObjectInfo, PodInfo, group_of};
use crate::api::keys;
use crate::api::policy::ActionType;

pub use crate::api::keys::WOKEN_AT;

/// What `gpureaper.io/restore` holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Replicas left serving by a scale to a minimum (request-driven inference, the
    /// policy's `action.inference.minReplicas`); absent: scaled to 0. The owner scaling
    /// above it means the workload is back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// An annotation the action set (Notebook stop, KServe stop); restoring puts back
    /// `annotation_value`, or removes the annotation when that is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation: Option<String>,
    /// The value `annotation` had before the action (absent: it was not set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_value: Option<String>,
    /// A merge patch of `spec` that puts back what the action changed; `null` removes a
    /// field that was absent (e.g. `{"predictor": {"minReplicas": null}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_patch: Option<serde_json::Value>,
    /// The RayCluster whose worker groups were scaled to 0 (a RayService's active
    /// cluster, or the RayCluster itself), in the workload's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster: Option<String>,
    /// What each of those worker groups had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub worker_groups: Vec<WorkerGroupRecord>,
    /// The Kueue Workload deactivated instead of suspending the job (Kueue-managed jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kueue_workload: Option<String>,
    /// `pending` until the action's write succeeded, then `done`.
    pub state: String,
}

/// A Ray worker group's replica fields before a reclaim (absent: not set).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WorkerGroupRecord {
    pub group_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i64>,
}

impl RestoreRecord {
    /// The value of `gpureaper.io/restore`.
    pub fn to_annotation(&self) -> String {
        // A struct of strings, numbers and bools always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn parse(annotations: &std::collections::BTreeMap<String, String>) -> Option<Self> {
        serde_json::from_str(annotations.get(keys::RESTORE)?).ok()
    }
}

/// What an action did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The workload was changed; the sentence says how.
    Done(String),
    /// Nothing to change (already at zero, already suspended).
    AlreadyDone(String),
    /// Refused by the cluster for now (a PodDisruptionBudget); retried later.
    Refused(String),
    /// This kind cannot take this action.
    Unsupported(String),
}

/// The error of a Kubernetes call, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct ActionError {
    pub action: String,
    #[source]
    pub source: kube::Error,
}

fn err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ActionError {
    let action = action.into();
    move |source| ActionError { action, source }
}

/// A dynamic API for the object's kind: its discovered resource when discovery has seen
/// the kind (see [`discovery::known`]), else the plural by Kubernetes' convention.
pub fn api_for(client: &Client, object: &ObjectInfo) -> Api<DynamicObject> {
    let resource = discovery::known(&object.api_version, &object.kind)
        .map(|served| served.resource)
        .unwrap_or_else(|| {
            let (group, version) = discovery::split_api_version(&object.api_version);
            ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &object.kind))
        });
    Api::namespaced_with(client.clone(), &object.namespace, &resource)
}

/// The object's kind as the cluster serves it (one discovery request, then cached).
async fn served(client: &Client, root: &ObjectInfo) -> Result<discovery::Served, ActionError> {
    discovery::kind(client, &root.api_version, &root.kind)
        .await
        .map_err(err(format!(
            "discovering the API of {} ({})",
            root.kind, root.api_version
        )))
}

fn annotate(pairs: &[(&str, Option<String>)]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for (k, v) in pairs {
        map.insert(
            k.to_string(),
            v.clone().map_or(serde_json::Value::Null, Into::into),
        );
    }
    json!({"metadata": {"annotations": map}})
}

/// The annotations of a reclaim: the restore record, when, and which action.
fn reclaim_annotations(record: &RestoreRecord, action: &str, now: Timestamp) -> serde_json::Value {
    annotate(&[
        (keys::RESTORE, Some(record.to_annotation())),
        (keys::REAPED_AT, Some(now.to_string())),
        (keys::REAPED_ACTION, Some(action.into())),
    ])
}

/// Records what restoring `root` needs (and when and how it was reclaimed) before the
/// action itself, so an interrupted action is finished or undone from the record.
async fn record_restore(
    client: &Client,
    root: &ObjectInfo,
    record: &RestoreRecord,
    action: &str,
    now: Timestamp,
) -> Result<(), ActionError> {
    let patch = reclaim_annotations(record, action, now);
    merge_patch(
        client,
        root,
        &patch,
        format!("recording the restore point of {}", root.key()),
    )
    .await
}

/// One merge patch on the root workload; `what` says what it was for when it fails.
pub async fn merge_patch(
    client: &Client,
    root: &ObjectInfo,
    patch: &serde_json::Value,
    what: String,
) -> Result<(), ActionError> {
    api_for(client, root)
        .patch(&root.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(err(what))
}

/// Acts on `root` (and its `pods` for Evict) as `action` says.
pub async fn act(
    client: &Client,
    action: ActionType,
    root: &ObjectInfo,
    pods: &[PodInfo],
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    if root.deleting {
        return Ok(Outcome::AlreadyDone(format!(
            "{} is being deleted",
            root.key()
        )));
    }
    match action {
        ActionType::ScaleToZero => scale_to_zero(client, root, now).await,
        ActionType::Suspend => suspend(client, root, now).await,
        ActionType::Evict => evict(client, root, pods, now).await,
        ActionType::None => Ok(Outcome::AlreadyDone("the policy only warns".into())),
    }
}

/// Whether `ScaleToZero` goes through the `/scale` subresource for this kind (see
/// [`crate::engine::inference::stops_its_own_way`]). Pure.
pub fn scaled_through_subresource(api_version: &str, kind: &str) -> bool {
    !crate::engine::inference::stops_its_own_way(Some(group_of(api_version)), kind)
}

/// Scales the workload to zero the way its kind expects: the Kubeflow Notebook and KServe
/// stop annotations, a Ray cluster's worker groups, else the `/scale` subresource. Also
/// what finishes a `pending` restore record a previous run left (to the replicas it
/// keeps, for a scale to a minimum).
pub async fn scale_to_zero(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    if scaled_through_subresource(&root.api_version, &root.kind) {
        return scale_subresource(client, root, 0, now).await;
    }
    match (group_of(&root.api_version), root.kind.as_str()) {
        ("kubeflow.org", "Notebook") => stop_notebook(client, root, now).await,
        ("ray.io", _) => scale_ray_workers(client, root, now, "ScaleToZero").await,
        _ => stop_kserve(client, root, now).await,
    }
}

/// Scales request-driven inference down to `keep` replicas instead of zero (the policy's
/// `action.inference.minReplicas`), through the `/scale` subresource, with the same
/// restore record as a scale to zero (`kept` says how many stayed).
pub async fn scale_to_minimum(
    client: &Client,
    root: &ObjectInfo,
    keep: i32,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    if !scaled_through_subresource(&root.api_version, &root.kind) {
        return Ok(Outcome::Unsupported(format!(
            "{}: a {} is not scaled through /scale, so it cannot keep {keep} replicas",
            root.key(),
            root.kind
        )));
    }
    scale_subresource(client, root, keep.max(0), now).await
}

/// Scales through the `/scale` subresource to `keep` replicas (0: to zero), recording
/// the replica count first. Whether the kind has one comes from API discovery, so any
/// CRD that declares it works. A `pending` record a previous run left is finished with
/// the target it recorded.
pub async fn scale_subresource(
    client: &Client,
    root: &ObjectInfo,
    keep: i32,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let served = served(client, root).await?;
    if !served.scalable {
        let instead = if suspend_path(root).is_some() {
            "Suspend"
        } else {
            "Evict"
        };
        return Ok(Outcome::Unsupported(format!(
            "{key}: cannot scale a {} ({}): it has no /scale subresource; use {instead} for it",
            root.kind, root.api_version
        )));
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &root.namespace, &served.resource);
    let pp = PatchParams::default();
    let scale = api
        .get_scale(&root.name)
        .await
        .map_err(err(format!("reading the scale of {key}")))?;
    let current = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
    let existing = RestoreRecord::parse(&root.annotations);
    let (replicas, keep) = match &existing {
        // Resuming an action a previous run started: keep the counts it recorded.
        Some(r) if r.state == "pending" => (r.replicas.unwrap_or(current), r.kept.unwrap_or(0)),
        _ if current <= keep => {
            return Ok(Outcome::AlreadyDone(format!(
                "{key} already has {current} replicas"
            )));
        }
        _ => {
            let record = RestoreRecord {
                replicas: Some(current),
                kept: (keep > 0).then_some(keep),
                state: "pending".into(),
                ..RestoreRecord::default()
            };
            record_restore(client, root, &record, "ScaleToZero", now).await?;
            (current, keep)
        }
    };
    api.patch_scale(
        &root.name,
        &pp,
        &Patch::Merge(&json!({"spec": {"replicas": keep}})),
    )
    .await
    .map_err(err(format!("scaling {key} to {keep}")))?;
    let done = RestoreRecord {
        replicas: Some(replicas),
        kept: (keep > 0).then_some(keep),
        state: "done".into(),
        ..RestoreRecord::default()
    };
    mark_done(client, root, &done).await?;
    Ok(Outcome::Done(format!(
        "scaled {key} from {replicas} replicas to {keep}"
    )))
}

/// Writes the finished restore record.
async fn mark_done(
    client: &Client,
    root: &ObjectInfo,
    done: &RestoreRecord,
) -> Result<(), ActionError> {
    let patch = annotate(&[(keys::RESTORE, Some(done.to_annotation()))]);
    merge_patch(
        client,
        root,
        &patch,
        format!("marking the restore point of {} done", root.key()),
    )
    .await
}

/// Suspends a Job (or any kind with `spec.suspend`) in one write with its restore record.
pub async fn suspend(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    if root.labels.contains_key(KUEUE_QUEUE_LABEL) {
        return deactivate_kueue_workload(client, root, now).await;
    }
    if (group_of(&root.api_version), root.kind.as_str()) == ("ray.io", "RayService") {
        // No spec.suspend to set: its worker groups go to 0, reversibly.
        return scale_ray_workers(client, root, now, "Suspend").await;
    }
    let Some(path) = suspend_path(root) else {
        return Ok(Outcome::Unsupported(format!(
            "{key}: Suspend works on Job, JobSet, RayJob, RayCluster, RayService and Kubeflow training jobs; use ScaleToZero or Evict for a {}",
            root.kind
        )));
    };
    let record = RestoreRecord {
        suspend: Some(false),
        state: "done".into(),
        ..RestoreRecord::default()
    };
    let mut patch = reclaim_annotations(&record, "Suspend", now);
    patch["spec"] = suspend_patch(path, true);
    merge_patch(client, root, &patch, format!("suspending {key}")).await?;
    Ok(Outcome::Done(format!("suspended {key}")))
}

/// Where a kind keeps its suspend flag: `spec.suspend` (Job, JobSet, RayJob, RayCluster)
/// or `spec.runPolicy.suspend` (Kubeflow training jobs: PyTorchJob, TFJob, MPIJob, …).
/// `None`: the kind cannot be suspended.
pub fn suspend_path(root: &ObjectInfo) -> Option<&'static [&'static str]> {
    let group = super::inventory::group_of(&root.api_version);
    match (group, root.kind.as_str()) {
        ("batch", "Job") | ("jobset.x-k8s.io", "JobSet") | ("ray.io", "RayJob" | "RayCluster") => {
            Some(&["suspend"])
        }
        ("kubeflow.org", kind) if kind.ends_with("Job") => Some(&["runPolicy", "suspend"]),
        _ => None,
    }
}

/// `{"suspend": v}` or `{"runPolicy": {"suspend": v}}`.
fn suspend_patch(path: &[&str], value: bool) -> serde_json::Value {
    path.iter().rev().fold(
        serde_json::Value::Bool(value),
        |inner, key| json!({ *key: inner }),
    )
}

/// Label Kueue puts on (or users put on) the jobs it manages.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// Kueue's Workload API in `namespace`, at the newest version the cluster serves
/// (v1beta2 from Kueue 0.15, v1beta1 before).
async fn kueue_workloads(
    client: &Client,
    namespace: &str,
) -> Result<Api<DynamicObject>, ActionError> {
    let version = |v: &str| -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("kueue.x-k8s.io", v, "Workload");
        Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
    };
    let probe = kube::api::ListParams::default().limit(1);
    let newest = version("v1beta2");
    if newest.list_metadata(&probe).await.is_ok() {
        return Ok(newest);
    }
    let older = version("v1beta1");
    older.list_metadata(&probe).await.map_err(err(
        "finding Kueue's Workload API (kueue.x-k8s.io v1beta2 or v1beta1)",
    ))?;
    Ok(older)
}

/// A Kueue-managed job is never suspended behind Kueue's back (Kueue owns `spec.suspend`
/// and would resume it): its Kueue Workload is deactivated (`spec.active: false`), which
/// Kueue answers by evicting the job and keeping it out of the queue until reactivated.
pub async fn deactivate_kueue_workload(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let api = kueue_workloads(client, &root.namespace).await?;
    let list = api.list(&Default::default()).await.map_err(err(format!(
        "listing the Kueue Workloads of namespace {}",
        root.namespace
    )))?;
    let owned = list.items.into_iter().find(|w| {
        w.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == root.kind && o.name == root.name && o.controller == Some(true))
    });
    let Some(workload) = owned else {
        return Ok(Outcome::Refused(format!(
            "{key} is managed by Kueue but Kueue has not created its Workload yet; retried next cycle"
        )));
    };
    let name = workload.metadata.name.clone().unwrap_or_default();
    let record = RestoreRecord {
        kueue_workload: Some(name.clone()),
        state: "done".into(),
        ..RestoreRecord::default()
    };
    record_restore(client, root, &record, "Suspend", now).await?;
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"active": false}})),
    )
    .await
    .map_err(err(format!(
        "deactivating Kueue Workload {}/{name}",
        root.namespace
    )))?;
    Ok(Outcome::Done(format!(
        "deactivated Kueue Workload {}/{name} of {key}; Kueue evicts it",
        root.namespace
    )))
}

/// The Kubeflow Notebook controller stops a notebook's pod while this annotation is set.
pub const NOTEBOOK_STOPPED: &str = "kubeflow-resource-stopped";

/// Stops a Kubeflow Notebook the way its controller expects: the stop annotation (its
/// StatefulSet goes to 0); the restore record says to remove it.
pub async fn stop_notebook(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    if root.annotations.contains_key(NOTEBOOK_STOPPED) {
        return Ok(Outcome::AlreadyDone(format!("{key} is already stopped")));
    }
    let record = RestoreRecord {
        annotation: Some(NOTEBOOK_STOPPED.into()),
        state: "done".into(),
        ..RestoreRecord::default()
    };
    let patch = {
        let mut patch = reclaim_annotations(&record, "ScaleToZero", now);
        patch["metadata"]["annotations"][NOTEBOOK_STOPPED] = now.to_string().into();
        patch
    };
    merge_patch(client, root, &patch, format!("stopping {key}")).await?;
    Ok(Outcome::Done(format!("stopped {key} ({NOTEBOOK_STOPPED})")))
}

/// KServe stops an InferenceService or LLMInferenceService while this annotation is
/// `"true"` (compared case-insensitively, as KServe does): it deletes the serving
/// workloads and keeps the resource, and recreates them when the annotation is removed
/// or `"false"`.
pub const KSERVE_STOP: &str = "serving.kserve.io/stop";

/// The annotation choosing an InferenceService's deployment mode.
const KSERVE_DEPLOYMENT_MODE: &str = "serving.kserve.io/deploymentMode";

/// Stops a KServe service the way KServe expects: `serving.kserve.io/stop: "true"`, in
/// one write with the restore record, which keeps the annotation's previous value.
///
/// An InferenceService whose status has no `Stopped` condition is served by a KServe that
/// predates the annotation (it would be ignored): in Serverless mode its predictor gets
/// `minReplicas: 0` instead (Knative removes the pods once no request comes), recorded
/// as a `spec` merge patch; in RawDeployment mode such a KServe cannot go to zero, which
/// is reported. LLMInferenceServices always know the annotation (kserve/kserve#4839).
pub async fn stop_kserve(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let object = api_for(client, root)
        .get(&root.name)
        .await
        .map_err(err(format!("reading {key}")))?;
    // A DynamicObject is JSON already; it always serializes.
    let value = serde_json::to_value(&object).unwrap_or_default();
    let annotations = crate::api::selector::string_map(&value["metadata"]["annotations"]);
    let previous = annotations.get(KSERVE_STOP).cloned();
    if previous
        .as_deref()
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Ok(Outcome::AlreadyDone(format!(
            "{key} is already stopped ({KSERVE_STOP})"
        )));
    }
    let knows_stop = value["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Stopped"));
    if root.kind == "InferenceService" && !knows_stop {
        return scale_predictor_to_zero(client, root, &value, &annotations, now).await;
    }
    let record = RestoreRecord {
        annotation: Some(KSERVE_STOP.into()),
        annotation_value: previous,
        state: "done".into(),
        ..RestoreRecord::default()
    };
    let mut patch = reclaim_annotations(&record, "ScaleToZero", now);
    patch["metadata"]["annotations"][KSERVE_STOP] = "true".into();
    merge_patch(client, root, &patch, format!("stopping {key}")).await?;
    Ok(Outcome::Done(format!(
        "stopped {key} ({KSERVE_STOP}: \"true\"); KServe removes its serving pods and keeps the service"
    )))
}

/// The fallback for a KServe without the stop annotation: Serverless scale-to-zero.
async fn scale_predictor_to_zero(
    client: &Client,
    root: &ObjectInfo,
    isvc: &serde_json::Value,
    annotations: &std::collections::BTreeMap<String, String>,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let mode = annotations
        .get(KSERVE_DEPLOYMENT_MODE)
        .map(String::as_str)
        .or_else(|| isvc["status"]["deploymentMode"].as_str());
    if let Some(mode @ ("RawDeployment" | "Standard" | "ModelMesh")) = mode {
        return Ok(Outcome::Unsupported(format!(
            "{key}: its KServe predates the {KSERVE_STOP} annotation (no Stopped condition in its status) and in {mode} mode keeps at least one predictor pod; upgrade KServe to a release that stops services (kserve/kserve#4455), or exempt the service"
        )));
    }
    let min = &isvc["spec"]["predictor"]["minReplicas"];
    let previous = match min {
        serde_json::Value::Null => serde_json::Value::Null,
        v if v.as_i64() == Some(0) => {
            return Ok(Outcome::AlreadyDone(format!(
                "{key} already has spec.predictor.minReplicas 0: Knative scales it to zero once no request comes"
            )));
        }
        v if v.as_i64().is_some() => v.clone(),
        other => {
            return Ok(Outcome::Refused(format!(
                "{key}: spec.predictor.minReplicas is {other}, not an integer; fix the field (the next cycle retries)"
            )));
        }
    };
    let was = if previous.is_null() {
        "unset (1)".to_string()
    } else {
        previous.to_string()
    };
    let record = RestoreRecord {
        spec_patch: Some(json!({"predictor": {"minReplicas": previous}})),
        state: "done".into(),
        ..RestoreRecord::default()
    };
    let mut patch = reclaim_annotations(&record, "ScaleToZero", now);
    patch["spec"] = json!({"predictor": {"minReplicas": 0}});
    merge_patch(client, root, &patch, format!("scaling {key} to zero")).await?;
    Ok(Outcome::Done(format!(
        "set spec.predictor.minReplicas of {key} from {was} to 0 (its KServe predates {KSERVE_STOP}); Knative scales the predictor to zero once no request comes"
    )))
}

/// The RayClusters API of the root's Ray version (RayService and RayCluster share it).
fn ray_clusters(client: &Client, root: &ObjectInfo) -> Api<DynamicObject> {
    let cluster = ObjectInfo {
        kind: "RayCluster".into(),
        ..root.clone()
    };
    api_for(client, &cluster)
}

/// The worker groups of a RayCluster as JSON; a field of the wrong type is named.
fn worker_groups(cluster: &serde_json::Value) -> Result<Vec<WorkerGroupRecord>, String> {
    let groups = match &cluster["spec"]["workerGroupSpecs"] {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Array(groups) => groups,
        other => return Err(format!("spec.workerGroupSpecs is {other}, not a list")),
    };
    let mut out = Vec::new();
    for (i, group) in groups.iter().enumerate() {
        let path = format!("spec.workerGroupSpecs[{i}]");
        let Some(name) = group["groupName"].as_str() else {
            return Err(format!(
                "{path}.groupName is {}, not a name",
                group["groupName"]
            ));
        };
        let count = |field: &str| -> Result<Option<i64>, String> {
            match &group[field] {
                serde_json::Value::Null => Ok(None),
                v => v
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| format!("{path}.{field} is {v}, not an integer")),
            }
        };
        out.push(WorkerGroupRecord {
            group_name: name.to_string(),
            replicas: count("replicas")?,
            min_replicas: count("minReplicas")?,
            max_replicas: count("maxReplicas")?,
        });
    }
    Ok(out)
}

/// A JSON patch (RFC 6902) from its operations.
fn json_patch(ops: Vec<serde_json::Value>) -> Result<Patch<()>, serde_json::Error> {
    Ok(Patch::Json(serde_json::from_value(
        serde_json::Value::Array(ops),
    )?))
}

/// The operations that set `group`'s replica fields at `index`, after checking it is
/// still that group (`None`: remove the field when it is there).
fn worker_group_ops(
    index: usize,
    current: &WorkerGroupRecord,
    target: &WorkerGroupRecord,
) -> Vec<serde_json::Value> {
    let base = format!("/spec/workerGroupSpecs/{index}");
    let mut ops = vec![
        json!({"op": "test", "path": format!("{base}/groupName"), "value": current.group_name}),
    ];
    for (field, now, wanted) in [
        ("replicas", current.replicas, target.replicas),
        ("minReplicas", current.min_replicas, target.min_replicas),
        ("maxReplicas", current.max_replicas, target.max_replicas),
    ] {
        match (now, wanted) {
            (_, Some(v)) => {
                ops.push(json!({"op": "add", "path": format!("{base}/{field}"), "value": v}))
            }
            (Some(_), None) => ops.push(json!({"op": "remove", "path": format!("{base}/{field}")})),
            (None, None) => {}
        }
    }
    ops
}

fn groups_text(groups: &[WorkerGroupRecord]) -> String {
    groups
        .iter()
        .map(|g| match g.replicas {
            Some(n) => format!("{} {n}", g.group_name),
            None => format!("{} (replicas unset)", g.group_name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Scales the worker groups of a RayCluster to zero: `replicas`, `minReplicas` (KubeRay
/// raises replicas to it) and `maxReplicas` (the Ray autoscaler scales up to it) all 0;
/// the head keeps running. For a RayService the cluster is its active one
/// (`status.activeServiceStatus.rayClusterName`): KubeRay does not pass replica changes
/// of `spec.rayClusterConfig` to a running cluster (they belong to the autoscaler), so
/// only the cluster's own worker groups free GPUs. What each group had is recorded on
/// `root` first (`pending`, finished by the next cycle if interrupted).
pub async fn scale_ray_workers(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
    action: &str,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let resuming = RestoreRecord::parse(&root.annotations)
        .filter(|r| r.state == "pending" && r.ray_cluster.is_some());
    let cluster_name = match &resuming {
        Some(r) => r.ray_cluster.clone().unwrap_or_default(),
        None if root.kind == "RayCluster" => root.name.clone(),
        None => {
            let service = api_for(client, root)
                .get(&root.name)
                .await
                .map_err(err(format!("reading {key}")))?;
            let status = &service.data["status"];
            let named =
                |v: &serde_json::Value| v.as_str().filter(|n| !n.is_empty()).map(str::to_string);
            if let Some(pending) = named(&status["pendingServiceStatus"]["rayClusterName"]) {
                return Ok(Outcome::Refused(format!(
                    "{key} is moving to a new RayCluster ({pending}); retried once KubeRay has switched over"
                )));
            }
            match named(&status["activeServiceStatus"]["rayClusterName"]) {
                Some(active) => active,
                None => {
                    return Ok(Outcome::Refused(format!(
                        "{key} has no active RayCluster yet (status.activeServiceStatus.rayClusterName is empty); retried next cycle"
                    )));
                }
            }
        }
    };
    let cluster_key = format!("RayCluster {}/{cluster_name}", root.namespace);
    let clusters = ray_clusters(client, root);
    let Some(cluster) = clusters
        .get_opt(&cluster_name)
        .await
        .map_err(err(format!("reading {cluster_key}")))?
    else {
        if let Some(r) = resuming {
            // Gone while the action was under way: nothing holds its GPUs any more.
            mark_done(
                client,
                root,
                &RestoreRecord {
                    state: "done".into(),
                    ..r
                },
            )
            .await?;
            return Ok(Outcome::AlreadyDone(format!(
                "{key}: {cluster_key} is gone; nothing left to scale"
            )));
        }
        return Ok(Outcome::Refused(format!(
            "{key}: {cluster_key} is not there (KubeRay may be replacing it); retried next cycle"
        )));
    };
    let cluster = serde_json::to_value(&cluster).unwrap_or_default();
    let current = match worker_groups(&cluster) {
        Ok(groups) => groups,
        Err(problem) => {
            return Ok(Outcome::Refused(format!(
                "{key}: cannot read {cluster_key}: {problem}; fix the field (the next cycle retries)"
            )));
        }
    };
    if current.is_empty() {
        return Ok(Outcome::Unsupported(format!(
            "{key}: {cluster_key} has no worker groups to scale to zero (only its head runs); use Evict"
        )));
    }
    let at_zero = |g: &WorkerGroupRecord| {
        g.replicas == Some(0) && g.min_replicas.unwrap_or(0) == 0 && g.max_replicas == Some(0)
    };
    let recorded = match resuming {
        Some(r) => r.worker_groups,
        None if current.iter().all(at_zero) => {
            return Ok(Outcome::AlreadyDone(format!(
                "the worker groups of {cluster_key} ({key}) are already at 0"
            )));
        }
        None => {
            let record = RestoreRecord {
                ray_cluster: Some(cluster_name.clone()),
                worker_groups: current.clone(),
                state: "pending".into(),
                ..RestoreRecord::default()
            };
            record_restore(client, root, &record, action, now).await?;
            current.clone()
        }
    };
    let zero = |name: &str| WorkerGroupRecord {
        group_name: name.to_string(),
        replicas: Some(0),
        min_replicas: Some(0),
        max_replicas: Some(0),
    };
    let ops: Vec<serde_json::Value> = current
        .iter()
        .enumerate()
        .filter(|(_, g)| recorded.iter().any(|r| r.group_name == g.group_name))
        .flat_map(|(i, g)| worker_group_ops(i, g, &zero(&g.group_name)))
        .collect();
    let patch = json_patch(ops).map_err(|e| ActionError {
        action: format!("building the patch of {cluster_key}"),
        source: kube::Error::SerdeError(e),
    })?;
    clusters
        .patch(&cluster_name, &PatchParams::default(), &patch)
        .await
        .map_err(err(format!(
            "scaling the worker groups of {cluster_key} to 0"
        )))?;
    let done = RestoreRecord {
        ray_cluster: Some(cluster_name.clone()),
        worker_groups: recorded.clone(),
        state: "done".into(),
        ..RestoreRecord::default()
    };
    mark_done(client, root, &done).await?;
    let of = if root.kind == "RayCluster" {
        String::new()
    } else {
        format!(" of {key}")
    };
    Ok(Outcome::Done(format!(
        "scaled the worker groups of {cluster_key}{of} to 0 (were {}); its head keeps running",
        groups_text(&recorded)
    )))
}

/// Puts the recorded worker groups back on their RayCluster, matched by name. A cluster
/// KubeRay has since replaced was made from the RayService spec: nothing to put back.
async fn restore_ray_workers(
    client: &Client,
    root: &ObjectInfo,
    cluster_name: &str,
    recorded: &[WorkerGroupRecord],
) -> Result<String, ActionError> {
    let key = root.key();
    let cluster_key = format!("RayCluster {}/{cluster_name}", root.namespace);
    let clusters = ray_clusters(client, root);
    let Some(cluster) = clusters
        .get_opt(cluster_name)
        .await
        .map_err(err(format!("reading {cluster_key}")))?
    else {
        return Ok(format!(
            "{cluster_key} of {key} is gone (KubeRay replaced it from its spec); nothing to scale back"
        ));
    };
    let cluster = serde_json::to_value(&cluster).unwrap_or_default();
    let current = worker_groups(&cluster).map_err(|problem| ActionError {
        action: format!(
            "reading the worker groups of {cluster_key} to scale them back (fix the field, then wake {key} again)"
        ),
        source: kube::Error::Service(problem.into()),
    })?;
    let mut ops = Vec::new();
    let mut missing = Vec::new();
    for wanted in recorded {
        match current
            .iter()
            .position(|g| g.group_name == wanted.group_name)
        {
            Some(i) => ops.extend(worker_group_ops(i, &current[i], wanted)),
            None => missing.push(wanted.group_name.as_str()),
        }
    }
    if !ops.is_empty() {
        let patch = json_patch(ops).map_err(|e| ActionError {
            action: format!("building the patch of {cluster_key}"),
            source: kube::Error::SerdeError(e),
        })?;
        clusters
            .patch(cluster_name, &PatchParams::default(), &patch)
            .await
            .map_err(err(format!(
                "scaling the worker groups of {cluster_key} back"
            )))?;
    }
    let mut text = format!(
        "scaled the worker groups of {cluster_key} back ({})",
        groups_text(recorded)
    );
    if !missing.is_empty() {
        text.push_str(&format!(
            "; groups no longer in the cluster were skipped: {}",
            missing.join(", ")
        ));
    }
    Ok(text)
}

/// Evicts every GPU pod of the workload through the Eviction API.
pub async fn evict(
    client: &Client,
    root: &ObjectInfo,
    pods: &[PodInfo],
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let api = api_for(client, root);
    let patch = annotate(&[
        (keys::REAPED_AT, Some(now.to_string())),
        (keys::REAPED_ACTION, Some("Evict".into())),
    ]);
    let mut evicted = 0;
    let mut refused = Vec::new();
    for pod in pods {
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), &pod.meta.namespace);
        match pods_api
            .evict(&pod.meta.name, &EvictParams::default())
            .await
        {
            Ok(_) => evicted += 1,
            Err(kube::Error::Api(e)) if e.code == 429 => {
                refused.push(format!("{}: {}", pod.meta.name, e.message))
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(ActionError {
                    action: format!("evicting pod {}/{}", pod.meta.namespace, pod.meta.name),
                    source,
                });
            }
        }
    }
    if evicted > 0 {
        // Recorded after the evictions: a refused eviction must leave the ladder where it
        // was so the next cycle retries. A bare pod is gone with its eviction: nothing to
        // record on.
        match api
            .patch(&root.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(ActionError {
                    action: format!("recording the eviction on {key}"),
                    source,
                });
            }
        }
    }
    if !refused.is_empty() {
        return Ok(Outcome::Refused(format!(
            "evicted {evicted} of {} pods of {key}; a PodDisruptionBudget refused the rest, retried next cycle ({})",
            pods.len(),
            refused.join("; ")
        )));
    }
    Ok(Outcome::Done(format!("evicted {evicted} pods of {key}")))
}

/// The annotation patch that forgets a reclaim and restarts the idle ladder with a fresh
/// startup grace (and consumes a `gpureaper.io/wake` request).
fn restart_ladder_patch(now: Timestamp) -> serde_json::Value {
    annotate(&[
        (keys::RESTORE, None),
        (keys::REAPED_AT, None),
        (keys::REAPED_ACTION, None),
        (keys::WARNED_AT, None),
        (keys::WAKE, None),
        (keys::RECLAIMED, None),
        (WOKEN_AT, Some(now.to_string())),
    ])
}

/// The owner brought a reclaimed workload back by hand: forget the reclaim and restart
/// its ladder, without touching its replicas.
pub async fn forget(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    merge_patch(
        client,
        root,
        &restart_ladder_patch(now),
        format!("clearing the reclaim annotations of {key}"),
    )
    .await?;
    Ok(Outcome::Done(format!(
        "{key} was scaled back up by its owner; its idle ladder starts again"
    )))
}

/// Puts the workload back as the restore record says and restarts its ladder with a
/// fresh startup grace.
pub async fn wake(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let pp = PatchParams::default();
    let record = RestoreRecord::parse(&root.annotations);
    let clear = restart_ladder_patch(now);
    let what = match &record {
        Some(RestoreRecord {
            replicas: Some(n), ..
        }) => {
            let served = served(client, root).await?;
            Api::<DynamicObject>::namespaced_with(
                client.clone(),
                &root.namespace,
                &served.resource,
            )
            .patch_scale(
                &root.name,
                &pp,
                &Patch::Merge(&json!({"spec": {"replicas": n}})),
            )
            .await
            .map_err(err(format!("scaling {key} back to {n}")))?;
            format!("scaled {key} back to {n} replicas")
        }
        Some(RestoreRecord {
            ray_cluster: Some(cluster),
            worker_groups,
            ..
        }) => restore_ray_workers(client, root, cluster, worker_groups).await?,
        Some(RestoreRecord {
            suspend: Some(s), ..
        }) => {
            let mut patch = clear.clone();
            patch["spec"] = suspend_patch(suspend_path(root).unwrap_or(&["suspend"]), *s);
            merge_patch(client, root, &patch, format!("resuming {key}")).await?;
            return Ok(Outcome::Done(format!("resumed {key}")));
        }
        Some(RestoreRecord {
            kueue_workload: Some(w),
            ..
        }) => {
            kueue_workloads(client, &root.namespace)
                .await?
                .patch(w, &pp, &Patch::Merge(&json!({"spec": {"active": true}})))
                .await
                .map_err(err(format!(
                    "reactivating Kueue Workload {}/{w}",
                    root.namespace
                )))?;
            format!("reactivated Kueue Workload {}/{w} of {key}", root.namespace)
        }
        Some(RestoreRecord {
            annotation: Some(a),
            annotation_value,
            ..
        }) => {
            let mut patch = clear.clone();
            patch["metadata"]["annotations"][a.as_str()] = annotation_value
                .clone()
                .map_or(serde_json::Value::Null, Into::into);
            merge_patch(client, root, &patch, format!("starting {key} again")).await?;
            let how = match annotation_value {
                Some(v) => format!("{a} back to {v:?}"),
                None => format!("removed {a}"),
            };
            return Ok(Outcome::Done(format!("started {key} again ({how})")));
        }
        Some(RestoreRecord {
            spec_patch: Some(spec),
            ..
        }) => {
            let mut patch = clear.clone();
            patch["spec"] = spec.clone();
            merge_patch(client, root, &patch, format!("restoring the spec of {key}")).await?;
            return Ok(Outcome::Done(format!("restored {key} (spec {spec})")));
        }
        _ => format!("restarted the idle ladder of {key} (nothing to restore)"),
    };
    merge_patch(
        client,
        root,
        &clear,
        format!("clearing the reclaim annotations of {key}"),
    )
    .await?;
    Ok(Outcome::Done(what))
}
