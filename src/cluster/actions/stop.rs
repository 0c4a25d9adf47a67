//! The kinds that stop their own way instead of through `/scale` or `spec.suspend`:
//! Kueue-managed jobs (their Kueue Workload is deactivated), Kubeflow Notebooks (the stop
//! annotation) and KServe services (KServe's stop annotation, or Serverless
//! scale-to-zero on a KServe that predates it). IO edge, like the rest of `actions`.

use jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::{
    ActionError, Outcome, RestoreRecord, api_for, err, merge_patch, reclaim_annotations,
    record_restore,
};
use crate::cluster::inventory::ObjectInfo;

/// Label Kueue puts on (or users put on) the jobs it manages.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// Kueue's Workload API in `namespace`, at the newest version the cluster serves
/// (v1beta2 from Kueue 0.15, v1beta1 before).
pub(super) async fn kueue_workloads(
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
        state: crate::cluster::actions::RestoreState::Done,
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
        state: crate::cluster::actions::RestoreState::Done,
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
        state: crate::cluster::actions::RestoreState::Done,
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
        state: crate::cluster::actions::RestoreState::Done,
        ..RestoreRecord::default()
    };
    let mut patch = reclaim_annotations(&record, "ScaleToZero", now);
    patch["spec"] = json!({"predictor": {"minReplicas": 0}});
    merge_patch(client, root, &patch, format!("scaling {key} to zero")).await?;
    Ok(Outcome::Done(format!(
        "set spec.predictor.minReplicas of {key} from {was} to 0 (its KServe predates {KSERVE_STOP}); Knative scales the predictor to zero once no request comes"
    )))
}
