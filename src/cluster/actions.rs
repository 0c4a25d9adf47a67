//! Actions on root workloads, and restoring them (`gpu-reaper wake`). IO edge.
//!
//! Every action records what restoring needs in `gpureaper.io/restore` before, or in the
//! same write as, the change (invariant 5):
//! - ScaleToZero (`/scale` subresource): first an annotation write with the replica count
//!   and `"state": "pending"`, then the scale to 0, then `"state": "done"`. A controller
//!   killed in between finds `pending` and finishes the scale (the same action, not a
//!   second one); `done` with replicas above 0 means the owner scaled it back by hand.
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

use super::inventory::{ObjectInfo, PodInfo};
use crate::api::keys;
use crate::api::policy::ActionType;

/// `gpureaper.io/woken-at`: when `wake` restored the workload; its startup grace counts
/// from here.
pub const WOKEN_AT: &str = "gpureaper.io/woken-at";

/// What `gpureaper.io/restore` holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// An annotation the action set and restoring removes (Notebook stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation: Option<String>,
    /// The Kueue Workload deactivated instead of suspending the job (Kueue-managed jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kueue_workload: Option<String>,
    /// `pending` until the action's write succeeded, then `done`.
    pub state: String,
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

/// A dynamic API for the object's kind (plural by Kubernetes' convention).
pub fn api_for(client: &Client, object: &ObjectInfo) -> Api<DynamicObject> {
    let (group, version) = match object.api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), object.api_version.clone()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, &object.kind);
    let resource = ApiResource::from_gvk(&gvk);
    Api::namespaced_with(client.clone(), &object.namespace, &resource)
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
        ActionType::ScaleToZero if root.kind == "Notebook" => {
            stop_notebook(client, root, now).await
        }
        ActionType::ScaleToZero => scale_to_zero(client, root, now).await,
        ActionType::Suspend => suspend(client, root, now).await,
        ActionType::Evict => evict(client, root, pods, now).await,
        ActionType::None => Ok(Outcome::AlreadyDone("the policy only warns".into())),
    }
}

/// Scales through the `/scale` subresource, recording the replica count first.
pub async fn scale_to_zero(
    client: &Client,
    root: &ObjectInfo,
    now: Timestamp,
) -> Result<Outcome, ActionError> {
    let key = root.key();
    let api = api_for(client, root);
    let pp = PatchParams::default();
    let scale = api
        .get_scale(&root.name)
        .await
        .map_err(err(format!("reading the scale of {key}")))?;
    let current = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
    let existing = RestoreRecord::parse(&root.annotations);
    let replicas = match &existing {
        // Resuming an action a previous run started: keep the count it recorded.
        Some(r) if r.state == "pending" => r.replicas.unwrap_or(current),
        _ if current == 0 => {
            return Ok(Outcome::AlreadyDone(format!(
                "{key} already has 0 replicas"
            )));
        }
        _ => {
            let record = RestoreRecord {
                replicas: Some(current),
                state: "pending".into(),
                ..RestoreRecord::default()
            };
            let patch = reclaim_annotations(&record, "ScaleToZero", now);
            merge_patch(
                client,
                root,
                &patch,
                format!("recording the restore point of {key}"),
            )
            .await?;
            current
        }
    };
    api.patch_scale(
        &root.name,
        &pp,
        &Patch::Merge(&json!({"spec": {"replicas": 0}})),
    )
    .await
    .map_err(err(format!("scaling {key} to 0")))?;
    let done = RestoreRecord {
        replicas: Some(replicas),
        state: "done".into(),
        ..RestoreRecord::default()
    };
    let patch = annotate(&[(keys::RESTORE, Some(done.to_annotation()))]);
    merge_patch(
        client,
        root,
        &patch,
        format!("marking the restore point of {key} done"),
    )
    .await?;
    Ok(Outcome::Done(format!(
        "scaled {key} from {replicas} replicas to 0"
    )))
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
    let Some(path) = suspend_path(root) else {
        return Ok(Outcome::Unsupported(format!(
            "{key}: Suspend works on Job, JobSet, RayJob, RayCluster and Kubeflow training jobs; use ScaleToZero or Evict for a {}",
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
    let patch = reclaim_annotations(&record, "Suspend", now);
    merge_patch(
        client,
        root,
        &patch,
        format!("recording the restore point of {key}"),
    )
    .await?;
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
    let api = api_for(client, root);
    let pp = PatchParams::default();
    let record = RestoreRecord::parse(&root.annotations);
    let clear = restart_ladder_patch(now);
    let what = match &record {
        Some(RestoreRecord {
            replicas: Some(n), ..
        }) => {
            api.patch_scale(
                &root.name,
                &pp,
                &Patch::Merge(&json!({"spec": {"replicas": n}})),
            )
            .await
            .map_err(err(format!("scaling {key} back to {n}")))?;
            format!("scaled {key} back to {n} replicas")
        }
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
            ..
        }) => {
            let mut patch = clear.clone();
            patch["metadata"]["annotations"][a.as_str()] = serde_json::Value::Null;
            merge_patch(client, root, &patch, format!("starting {key} again")).await?;
            return Ok(Outcome::Done(format!("started {key} again (removed {a})")));
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
