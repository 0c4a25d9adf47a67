//! What the controller sees for one workload at `now` (IO, reads only): the stages a
//! cycle runs — [`observe::cluster`], [`observe::telemetry`], [`cycle::judge`] (the
//! history backfill and the pure `plan`) — for the workload's governing policy, with
//! nothing warned, acted on or written. `gpu-reaper explain` renders what [`see`] returns
//! (`report::explain`).
//!
//! It is a fresh controller's first cycle: the telemetry trackers start from one read of
//! the horizon, and the idle-span history from `--history-backfill`; a long-running
//! controller's memory may hold spans older than that.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::context::{Context, Memory};
use super::observe::{self, kube_err};
use super::plan::{Planned, by_pod, effective_action};
use super::{audit_memory, cycle};
use crate::api::GpuPolicy;
use crate::api::policy::{self, ActionType};
use crate::cluster::actions::api_for;
use crate::cluster::inventory::{ObjectInfo, Workload};
use crate::engine::Rules;
use crate::engine::model::GpuObservation;
use crate::telemetry::live::LiveTelemetry;
use crate::{Error, Result};

/// The workload asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    /// As Kubernetes spells it (`Deployment`); compared without regard to case.
    pub kind: String,
    pub name: String,
    /// Needed only for a kind that is neither built in nor among the kinds the
    /// controller follows owner chains through, when the workload holds no GPUs.
    pub api_version: Option<String>,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.kind, self.name)
    }
}

/// What the controller sees for the workload.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Timestamp,
    /// The root workload (where the ladder state lives).
    pub root: ObjectInfo,
    /// Its GPU pods; None when it holds no GPUs now (reclaimed, or never had any):
    /// nothing is judged then.
    pub workload: Option<Workload>,
    pub policy: GpuPolicy,
    /// Other policies that match it and are outranked.
    pub outranked: Vec<String>,
    /// The plan's entry for it: the decision, the softer inference action, an
    /// unsupported action.
    pub planned: Option<Planned>,
    /// Its GPUs as the policy observes them: (pod name, observation).
    pub gpus: Vec<(String, GpuObservation)>,
    /// The action taken when it is due, for this kind.
    pub action: ActionType,
    /// Its namespace carries `gpureaper.io/exempt=true`.
    pub namespace_exempt: bool,
    /// Audit mode: when the controller's memory (its ConfigMap) says it warned and
    /// would have acted.
    pub audit_warned_at: Option<Timestamp>,
    pub audit_would_act_at: Option<Timestamp>,
}

fn is_target(o: &ObjectInfo, t: &Target) -> bool {
    o.namespace == t.namespace
        && o.name == t.name
        && o.kind.eq_ignore_ascii_case(&t.kind)
        && t.api_version.as_ref().is_none_or(|v| *v == o.api_version)
}

/// Reads what the controller reads for `target` and runs its decision step at `now`.
pub async fn see(ctx: &Context, target: &Target, now: Timestamp) -> Result<Seen> {
    let seen = observe::cluster(ctx, now).await?;
    let index = seen
        .workloads
        .iter()
        .position(|w| is_target(&w.root, target));
    let root = match index {
        Some(i) => seen.workloads[i].root.clone(),
        None => match seen.owners.values().find(|o| is_target(o, target)) {
            Some(o) => o.clone(),
            None => read_root(ctx, target).await?,
        },
    };
    let empty = BTreeMap::new();
    let ns_labels = seen.namespaces.get(&root.namespace).unwrap_or(&empty);
    let (chosen, _) = policy::select(&seen.policies, &root.kind, ns_labels, &root.labels);
    let Some(policy) = chosen.cloned() else {
        let selector = &ctx.settings.policy_selector;
        return Err(Error::InvalidArgument {
            flag: "workload",
            message: format!(
                "{target} is not governed by any GpuPolicy{} ({} looked at): no policy's match (namespaceSelector, workloadSelector, kinds) selects it; `kubectl get gpupolicies` lists them",
                if selector.is_empty() {
                    String::new()
                } else {
                    format!(" selected by --policy-selector {selector:?}")
                },
                seen.policies.len()
            ),
        });
    };
    let name = policy.metadata.name.clone().unwrap_or_default();
    let outranked = seen
        .policies
        .iter()
        .filter(|p| p.metadata.name.as_deref() != Some(name.as_str()))
        .filter(|p| p.matches(&root.kind, ns_labels, &root.labels))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let mut memory = Memory::new(ctx);
    if policy.spec.mode == policy::PolicyMode::Audit {
        memory.audit = audit_memory::load(ctx).await;
    }
    let key = root.key();
    let mut out = Seen {
        at: now,
        action: effective_action(&policy, &root),
        namespace_exempt: ns_labels
            .get(crate::api::keys::EXEMPT_LABEL)
            .is_some_and(|v| v == "true"),
        audit_warned_at: memory.audit.warned_at.get(&key).copied(),
        audit_would_act_at: memory.audit.would_act_at.get(&key).copied(),
        root,
        workload: None,
        policy: policy.clone(),
        outranked,
        planned: None,
        gpus: Vec::new(),
    };
    let Some(index) = index else {
        return Ok(out);
    };
    let rules = Rules::from_spec(&policy.spec);
    let mut live = LiveTelemetry::new(ctx.settings.live_step_seconds);
    observe::telemetry(ctx, &mut live, std::slice::from_ref(&rules), now)
        .await
        .map_err(|e| Error::InvalidArgument {
            flag: "prometheus-url",
            message: format!(
                "Prometheus could not answer, so nothing about {target} can be judged (the controller marks the policy Degraded then): {}; check --prometheus-url and its credentials",
                crate::error::chain(&e)
            ),
        })?;
    let observations = live.observe(&rules);
    let grouped = by_pod(&observations);
    let all: Vec<&GpuPolicy> = seen.policies.iter().collect();
    let plan = cycle::judge(
        ctx,
        &mut memory,
        &seen,
        &all,
        &policy,
        &rules,
        &grouped,
        now,
    )
    .await;
    let workload = &seen.workloads[index];
    for pod in &workload.pods {
        let key = (pod.meta.namespace.as_str(), pod.meta.name.as_str());
        for o in grouped.get(&key).into_iter().flatten() {
            out.gpus.push((pod.meta.name.clone(), (*o).clone()));
        }
    }
    out.planned = plan.planned.into_iter().find(|p| p.workload == index);
    out.workload = Some(workload.clone());
    Ok(out)
}

/// A workload that is neither a root of GPU pods nor an object of the kinds owner
/// chains are followed through: read from the API server (its kind's API version is
/// needed for that).
async fn read_root(ctx: &Context, target: &Target) -> Result<ObjectInfo> {
    let Some(api_version) =
        crate::cluster::address::api_version_for(&target.kind, target.api_version.as_ref())
    else {
        return Err(Error::InvalidArgument {
            flag: "api-version",
            message: format!(
                "no {target} holds GPUs, and {} is not a kind gpu-reaper knows the API version of; check the name, or pass its API version, e.g. --api-version kubeflow.org/v1",
                target.kind
            ),
        });
    };
    let probe = ObjectInfo {
        api_version,
        kind: target.kind.clone(),
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        uid: String::new(),
        owner: None,
        labels: Default::default(),
        annotations: Default::default(),
        created_at: Timestamp::UNIX_EPOCH,
        deleting: false,
    };
    let object = api_for(&ctx.client, &probe)
        .get_opt(&target.name)
        .await
        .map_err(kube_err("reading the workload"))?
        .ok_or_else(|| Error::InvalidArgument {
            flag: "workload",
            message: format!(
                "{target} not found (`kubectl get {} {} -n {}` to check; kinds are written as Kubernetes spells them, e.g. Deployment)",
                target.kind.to_lowercase(),
                target.name,
                target.namespace
            ),
        })?;
    let value = serde_json::to_value(&object)?;
    let mut root = ObjectInfo::from_value(&value).unwrap_or(probe.clone());
    root.api_version = probe.api_version;
    Ok(root)
}
