//! Housekeeping (IO), before any policy is evaluated: what is due whatever the telemetry
//! says — `gpureaper.io/wake=true` requests, actions a previous run started and did not
//! finish (restore record `pending`: the same action is finished, not a second one), and
//! reclaimed workloads their owner scaled back up by hand (their ladder restarts). Each
//! step gets an Event. [`prewarm`] is the same wake for a reclaimed workload the policy's
//! `action.preWarm` predicts busy soon (called by the cycle after the policy's plan).

use std::collections::{HashMap, HashSet};

use jiff::Timestamp;

use super::context::Context;
use super::{events_text, warn};
use crate::api::keys;
use crate::cluster::actions::{self, ActionError, Outcome};
use crate::cluster::inventory::{ObjectInfo, ObjectKey, Workload};

fn pending(o: &ObjectInfo) -> bool {
    actions::RestoreRecord::parse(&o.annotations)
        .is_some_and(|r| r.state == crate::cluster::actions::RestoreState::Pending)
}

fn wake_requested(o: &ObjectInfo) -> bool {
    o.annotations.get(keys::WAKE).map(String::as_str) == Some("true")
}

/// Whether `o` is owned by another object the controller knows: not a root. Kubernetes
/// copies a Deployment's annotations to its ReplicaSets, so a `wake` request on the
/// Deployment shows on its ReplicaSet too; only the root is woken.
fn owned_by_known(o: &ObjectInfo, owners: &HashMap<ObjectKey, ObjectInfo>) -> bool {
    o.owner.as_ref().is_some_and(|r| {
        owners.contains_key(&ObjectKey::new(
            &r.api_version,
            &r.kind,
            &o.namespace,
            &r.name,
        ))
    })
}

pub async fn run(
    ctx: &Context,
    owners: &HashMap<ObjectKey, ObjectInfo>,
    workloads: &[Workload],
    now: Timestamp,
) {
    // Only the few roots with a wake request or a pending restore record are sorted:
    // sorting every owner by a freshly built key (four strings per comparison) was
    // 7 % of the cycle CPU at 50,000 pods (perf).
    let mut sorted: Vec<&ObjectInfo> = owners
        .values()
        .filter(|o| !o.deleting && (wake_requested(o) || pending(o)) && !owned_by_known(o, owners))
        .collect();
    sorted.sort_by_cached_key(|o| o.key());
    let mut handled = HashSet::new();
    for root in sorted {
        let (reason, result) = if wake_requested(root) {
            ("Woken", actions::wake(&ctx.client, root, now).await)
        } else {
            (
                "Reclaimed",
                actions::scale_to_zero(&ctx.client, root, now).await,
            )
        };
        handled.insert(root.key());
        report(ctx, root, reason, result).await;
    }
    for w in workloads {
        if handled.contains(&w.root.key()) {
            continue;
        }
        let record = actions::RestoreRecord::parse(&w.root.annotations);
        // Replicas a scale to a minimum left serving are not the owner's doing.
        let kept = record.as_ref().and_then(|r| r.kept).unwrap_or(0);
        let scaled_back = record.is_some_and(|r| {
            r.state == crate::cluster::actions::RestoreState::Done && r.replicas.is_some()
        }) && w.pods.iter().filter(|p| !p.meta.deleting).count()
            > kept.max(0) as usize;
        if !scaled_back || w.root.deleting {
            continue;
        }
        // Pods can outlive the scale to 0 for a moment: the replica count decides.
        let replicas = actions::api_for(&ctx.client, &w.root)
            .get_scale(&w.root.name)
            .await
            .ok()
            .and_then(|s| s.spec?.replicas);
        if replicas.is_some_and(|r| r > kept) {
            let result = actions::forget(&ctx.client, &w.root, now).await;
            report(ctx, &w.root, "RestoredByOwner", result).await;
        }
    }
}

/// Wakes a reclaimed `root` before its predicted use (`action.preWarm`): the same
/// restore as a `gpureaper.io/wake` request, and a `PreWarmed` Event that says why.
pub async fn prewarm(
    ctx: &Context,
    root: &ObjectInfo,
    pre_warm: &crate::engine::prewarm::PreWarm,
    now: Timestamp,
) {
    let result = actions::wake(&ctx.client, root, now).await;
    let (label, severity, note) = events_text::pre_warmed(&pre_warm.reason, result);
    ctx.metrics.pre_warm(label);
    tracing::info!(workload = %root.key(), reason = "PreWarmed", result = label, detail = %note, "pre-warm");
    warn::notify(ctx, root, severity, "PreWarmed", note).await;
}

async fn report(
    ctx: &Context,
    root: &ObjectInfo,
    reason: &'static str,
    result: Result<Outcome, ActionError>,
) {
    let (severity, note) = events_text::housekeeping(result);
    tracing::info!(workload = %root.key(), reason, detail = %note, "housekeeping");
    warn::notify(ctx, root, severity, reason, note).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::inventory::OwnerRef;

    fn object(kind: &str, name: &str, owner: Option<(&str, &str)>) -> ObjectInfo {
        ObjectInfo {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            namespace: "ml".into(),
            name: name.into(),
            uid: String::new(),
            owner: owner.map(|(kind, name)| OwnerRef {
                api_version: "apps/v1".into(),
                kind: kind.into(),
                name: name.into(),
            }),
            labels: Default::default(),
            annotations: [(keys::WAKE.to_string(), "true".to_string())].into(),
            created_at: Timestamp::UNIX_EPOCH,
            deleting: false,
        }
    }

    #[test]
    fn a_wake_request_copied_onto_a_deployments_replicaset_is_not_a_root_to_wake() {
        let deployment = object("Deployment", "chat", None);
        let replica_set = object("ReplicaSet", "chat-7d9", Some(("Deployment", "chat")));
        let orphan = object("ReplicaSet", "lone", Some(("Deployment", "gone")));
        let owners: HashMap<ObjectKey, ObjectInfo> = [&deployment, &replica_set, &orphan]
            .into_iter()
            .map(|o| (o.key(), o.clone()))
            .collect();
        assert!(!owned_by_known(&deployment, &owners));
        assert!(owned_by_known(&replica_set, &owners));
        // An owner the controller does not know: the object is the root it governs.
        assert!(!owned_by_known(&orphan, &owners));
    }
}
