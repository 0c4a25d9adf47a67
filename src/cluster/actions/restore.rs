//! Undoing a reclaim: `wake` puts the workload back as its restore record says,
//! `forget` drops the record when the owner scaled it back by hand; both restart the
//! idle ladder with a fresh startup grace. IO edge.

use jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::ray::restore_ray_workers;
use super::stop::kueue_workloads;
use super::{
    ActionError, Outcome, RestoreRecord, WOKEN_AT, annotate, err, merge_patch, served,
    suspend_patch, suspend_path,
};
use crate::api::keys;
use crate::cluster::inventory::ObjectInfo;

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
