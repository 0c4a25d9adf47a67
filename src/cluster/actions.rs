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
//!
//! This file holds the record, `/scale`, Suspend and Evict; the kinds that stop their own
//! way are in `stop` (Kueue, Kubeflow Notebook, KServe) and `ray` (worker groups), and
//! undoing a reclaim (`wake`, `forget`) in `restore`.

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
pub use ray::scale_ray_workers;
pub use restore::{forget, wake};
pub use stop::{
    KSERVE_STOP, KUEUE_QUEUE_LABEL, NOTEBOOK_STOPPED, deactivate_kueue_workload, stop_kserve,
    stop_notebook,
};

mod ray;
mod restore;
mod stop;

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
    pub state: RestoreState,
}

/// Where the action a [`RestoreRecord`] belongs to stands; written as the lowercase
/// words every version has written (`pending`, `done`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum RestoreState {
    /// Recorded before the action; its write has not succeeded yet.
    #[default]
    Pending,
    /// The action's write succeeded.
    Done,
    /// A word this version does not know (a newer controller's): neither pending nor
    /// done, as the string it was read as never matched either.
    #[serde(other)]
    Unknown,
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
        // Never reached: a policy with an unknown action is refused before it is used.
        ActionType::Unknown => Ok(Outcome::AlreadyDone(
            "the policy's action.type is unknown to this gpu-reaper: nothing was done".into(),
        )),
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
        Some(r) if r.state == RestoreState::Pending => {
            (r.replicas.unwrap_or(current), r.kept.unwrap_or(0))
        }
        _ if current <= keep => {
            return Ok(Outcome::AlreadyDone(format!(
                "{key} already has {current} replicas"
            )));
        }
        _ => {
            let record = RestoreRecord {
                replicas: Some(current),
                kept: (keep > 0).then_some(keep),
                state: RestoreState::Pending,
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
        state: RestoreState::Done,
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
        state: RestoreState::Done,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn record(json: &str) -> Option<RestoreRecord> {
        RestoreRecord::parse(&BTreeMap::from([(
            keys::RESTORE.to_string(),
            json.to_string(),
        )]))
    }

    #[test]
    fn restore_records_written_as_strings_by_earlier_versions_still_parse() {
        let pending = record(r#"{"replicas":3,"kept":1,"state":"pending"}"#).unwrap();
        assert_eq!(pending.state, RestoreState::Pending);
        assert_eq!((pending.replicas, pending.kept), (Some(3), Some(1)));
        let done = record(r#"{"replicas":1,"state":"done"}"#).unwrap();
        assert_eq!(done.state, RestoreState::Done);
        // A word this version does not know is neither, as before.
        assert_eq!(
            record(r#"{"replicas":1,"state":"restoring"}"#)
                .unwrap()
                .state,
            RestoreState::Unknown
        );
        assert_eq!(
            serde_json::to_string(&done).unwrap(),
            r#"{"replicas":1,"state":"done"}"#
        );
    }
}
