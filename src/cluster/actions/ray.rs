//! Ray: a RayCluster's (or a RayService's active cluster's) worker groups go to zero
//! and back, recorded on the root first as with `/scale`. IO edge.

use jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::{
    ActionError, Outcome, RestoreRecord, WorkerGroupRecord, api_for, err, mark_done, record_restore,
};
use crate::cluster::inventory::ObjectInfo;

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
    let resuming = RestoreRecord::parse(&root.annotations).filter(|r| {
        r.state == crate::cluster::actions::RestoreState::Pending && r.ray_cluster.is_some()
    });
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
                    state: crate::cluster::actions::RestoreState::Done,
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
                state: crate::cluster::actions::RestoreState::Pending,
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
        state: crate::cluster::actions::RestoreState::Done,
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
pub(super) async fn restore_ray_workers(
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
