//! One policy's evaluation: which workloads it governs and their inputs, then the engine's
//! one decision step ([`evaluate_policy`], which `backtest` calls too) over them. Pure.

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};

use crate::api::policy::ActionType;
use crate::api::policy::{self, NamespaceSpend, PolicyMode};
use crate::api::{GpuPolicy, keys};
use crate::cluster::inventory::{ObjectKey, Workload, group_of};
use crate::engine::inference::Softer;
use crate::engine::model::{Decision, GpuObservation, LadderState, WorkloadMeta};
use crate::engine::{Candidate, Histories, Rules, evaluate_policy};
use crate::telemetry::live::Observations;

/// What the controller will do for one workload this cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Index into the inventory.
    pub workload: usize,
    pub decision: Decision,
    /// The softer action for request-driven inference (`action.inference`), if it applies.
    pub softer: Softer,
    /// The policy's action, unsupported on this kind (nothing is done; the reason says so).
    pub unsupported: Option<ActionType>,
    /// When the owner was warned, as the ladder knew it (the annotation; in Audit mode,
    /// the controller's memory): what the status's `warned` count reads.
    pub warned_at: Option<Timestamp>,
}

/// A policy's plan for this cycle.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyPlan {
    pub planned: Vec<Planned>,
    /// Governed GPUs.
    pub gpus: f64,
    /// Workloads this policy matches that another policy (higher priority, or same
    /// priority and a name sorting first) governs: `(workload, governing policy)`.
    pub shadowed: Vec<(ObjectKey, String)>,
}

/// Observations grouped by (namespace, pod), built once per cycle.
pub fn by_pod(observations: &Observations) -> HashMap<(&str, &str), Vec<&GpuObservation>> {
    let mut out: HashMap<(&str, &str), Vec<&GpuObservation>> = HashMap::new();
    for ((ns, pod, _), o) in observations {
        out.entry((ns.as_str(), pod.as_str())).or_default().push(o);
    }
    out
}

/// Ladder state of Audit mode, where gpu-reaper writes nothing on workloads: when each
/// was warned and when it would have been acted on. The controller keeps it in a
/// ConfigMap of its own namespace so a restart or a new leader does not warn again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditMemory {
    pub warned_at: HashMap<ObjectKey, Timestamp>,
    pub would_act_at: HashMap<ObjectKey, Timestamp>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEntry {
    workload: ObjectKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warned_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    would_act_at: Option<Timestamp>,
}

impl AuditMemory {
    /// As JSON, dropping entries older than `keep` before `now` (bounded size).
    pub fn to_json(&self, now: Timestamp, keep: SignedDuration) -> String {
        let oldest = now - keep;
        let mut keys: Vec<&ObjectKey> = self
            .warned_at
            .keys()
            .chain(self.would_act_at.keys())
            .collect();
        keys.sort();
        keys.dedup();
        let entries: Vec<AuditEntry> = keys
            .into_iter()
            .map(|k| AuditEntry {
                workload: k.clone(),
                warned_at: self.warned_at.get(k).copied().filter(|t| *t >= oldest),
                would_act_at: self.would_act_at.get(k).copied().filter(|t| *t >= oldest),
            })
            .filter(|e| e.warned_at.is_some() || e.would_act_at.is_some())
            .collect();
        serde_json::to_string(&entries).unwrap_or_else(|_| "[]".into())
    }

    /// From [`AuditMemory::to_json`]; anything unreadable starts empty.
    pub fn from_json(text: &str) -> Self {
        let entries: Vec<AuditEntry> = serde_json::from_str(text).unwrap_or_default();
        let mut out = Self::default();
        for e in entries {
            if let Some(t) = e.warned_at {
                out.warned_at.insert(e.workload.clone(), t);
            }
            if let Some(t) = e.would_act_at {
                out.would_act_at.insert(e.workload, t);
            }
        }
        out
    }
}

/// Evaluates `policy` over the inventory. `policies` are all policies (a workload is
/// governed by the highest-priority match only). `history` holds the policy's idle spans
/// across cycles: this cycle's observations are added to it (one span step is
/// `resolution`, the time since the previous cycle) before the resumption-risk estimate
/// is asked, and workloads no longer governed are pruned from it.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    policy: &GpuPolicy,
    policies: &[&GpuPolicy],
    workloads: &[Workload],
    namespaces: &HashMap<String, BTreeMap<String, String>>,
    observations: &HashMap<(&str, &str), Vec<&GpuObservation>>,
    audit: &AuditMemory,
    history: &mut Histories<ObjectKey>,
    resolution: SignedDuration,
    now: Timestamp,
) -> PolicyPlan {
    plan_with(
        policy,
        policies,
        workloads,
        namespaces,
        observations,
        audit,
        history,
        resolution,
        now,
        0,
    )
}

/// [`plan`], with `acted_without_pods` more actions of the last hour counted against
/// `maxPerHour`: those on workloads that have no pods any more
/// ([`acted_last_hour_without_pods`]).
#[allow(clippy::too_many_arguments)]
pub fn plan_with(
    policy: &GpuPolicy,
    policies: &[&GpuPolicy],
    workloads: &[Workload],
    namespaces: &HashMap<String, BTreeMap<String, String>>,
    observations: &HashMap<(&str, &str), Vec<&GpuObservation>>,
    audit: &AuditMemory,
    history: &mut Histories<ObjectKey>,
    resolution: SignedDuration,
    now: Timestamp,
    acted_without_pods: u32,
) -> PolicyPlan {
    let rules = Rules::from_spec(&policy.spec);
    let empty = BTreeMap::new();
    let mut out = PolicyPlan::default();
    let hour_ago = now - SignedDuration::from_hours(1);
    let mut acted_last_hour = acted_without_pods;
    // (inventory index, key, meta, pods, GPUs, ladder, blocked) of each governed workload.
    let mut governed = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        let root = &w.root;
        let ns_labels = namespaces.get(&root.namespace).unwrap_or(&empty);
        let (chosen, _) = policy::select(
            policies.iter().copied(),
            &root.kind,
            ns_labels,
            &root.labels,
        );
        if chosen.map(|p| &p.metadata.name) != Some(&policy.metadata.name) {
            if let Some(winner) = chosen
                && policy.matches(&root.kind, ns_labels, &root.labels)
            {
                out.shadowed
                    .push((root.key(), winner.metadata.name.clone().unwrap_or_default()));
            }
            continue;
        }
        out.gpus += w.gpus;
        let mut ladder = LadderState::from_annotations(&root.annotations);
        let key = root.key();
        if policy.spec.mode == PolicyMode::Audit {
            ladder.warned_at = ladder.warned_at.max(audit.warned_at.get(&key).copied());
            ladder.reaped_at = ladder.reaped_at.max(audit.would_act_at.get(&key).copied());
        }
        if ladder.reaped_at.is_some_and(|t| t >= hour_ago) {
            acted_last_hour += 1;
        }
        let woken = root
            .annotations
            .get(keys::WOKEN_AT)
            .and_then(|t| t.parse::<Timestamp>().ok());
        let mut labels = root.labels.clone();
        // An exempt namespace exempts its workloads.
        if ns_labels.get(keys::EXEMPT_LABEL).map(String::as_str) == Some("true") {
            labels.insert(keys::EXEMPT_LABEL.into(), "true".into());
        }
        let meta = WorkloadMeta {
            kind: root.kind.clone(),
            namespace: root.namespace.clone(),
            name: root.name.clone(),
            created_at: root.created_at.max(woken.unwrap_or(root.created_at)),
            labels,
            annotations: root.annotations.clone(),
        };
        let pods: Vec<_> = w.pods.iter().map(|p| p.state.clone()).collect();
        let mut gpus = Vec::new();
        for (pi, pod) in w.pods.iter().enumerate() {
            for o in observations
                .get(&(pod.meta.namespace.as_str(), pod.meta.name.as_str()))
                .into_iter()
                .flatten()
            {
                gpus.push(GpuObservation {
                    pod: pi,
                    ..(*o).clone()
                });
            }
        }
        let blocked = if root.deleting {
            Some(format!("{key} is being deleted"))
        } else {
            w.unwatched_owner.as_ref().map(|o| {
                format!(
                    "owned by {} {}, a kind gpu-reaper does not manage yet",
                    o.kind, o.name
                )
            })
        };
        governed.push((i, key, meta, pods, gpus, ladder, blocked));
    }
    let candidates: Vec<Candidate<'_, ObjectKey>> = governed
        .iter()
        .map(|(i, key, meta, pods, gpus, ladder, blocked)| Candidate {
            key: key.clone(),
            meta,
            pods,
            gpus,
            ladder: ladder.clone(),
            replicas: workloads[*i].pods.len(),
            group: Some(group_of(&workloads[*i].root.api_version)),
            blocked: blocked.clone(),
        })
        .collect();
    // The one decision step `backtest` takes too. A workload acted on keeps its idle span
    // open: once its GPUs are gone it is no longer governed, so the history runs the span
    // on (known not busy) until the owner brings it back busy, and the span's full length
    // — the action's regret or not — is learnt.
    let planned = evaluate_policy(
        &rules,
        &candidates,
        history,
        acted_last_hour,
        resolution,
        now,
    );
    out.planned = governed
        .iter()
        .zip(planned)
        .map(|((i, _, _, _, _, ladder, _), p)| Planned {
            workload: *i,
            decision: p.decision,
            softer: p.softer,
            unsupported: p.unsupported,
            warned_at: ladder.warned_at,
        })
        .collect();
    out
}

/// Hours since the last evaluation that count for accruals: at most `max_gap` (a
/// controller that was down does not bill its downtime), none on the first evaluation.
/// The action the controller takes on `root` when `policy`'s action is due: the
/// policy's own, or what it becomes for the kind (a Job under ScaleToZero is suspended;
/// see [`crate::engine::step::action_for`]). What warnings name.
pub fn effective_action(
    policy: &GpuPolicy,
    root: &crate::cluster::inventory::ObjectInfo,
) -> ActionType {
    let action = policy.spec.action.type_;
    crate::engine::step::action_for(
        action,
        Some(group_of(&root.api_version)),
        &root.kind,
        &root.labels,
    )
    .unwrap_or(action)
}

pub fn billable_hours(last: Option<Timestamp>, now: Timestamp, max_gap: SignedDuration) -> f64 {
    last.map_or(0.0, |last| {
        now.duration_since(last)
            .clamp(SignedDuration::ZERO, max_gap.max(SignedDuration::ZERO))
            .as_secs_f64()
            / 3600.0
    })
}

/// Idle GPU-hours "of the last 24 hours" without keeping history: an exponentially
/// decayed sum (time constant 24 h) to which each evaluation adds `idle_gpus × hours`.
/// Steady idleness of N GPUs converges to about 24·N, as a true 24-hour window would.
pub fn decay_24h(previous: f64, idle_gpus: f64, hours: f64) -> f64 {
    previous * (-hours / 24.0).exp() + idle_gpus * hours
}

/// Reclaims in place under one policy.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reclaimed {
    pub workloads: u32,
    pub gpus: f64,
    pub hourly_usd: f64,
}

/// The workloads a policy has reclaimed and what they held (from their
/// `gpureaper.io/reclaimed` record): count, GPUs and USD per hour. Only reclaims still
/// in place count (a wake removes the record).
/// Whether `o` is the root of its chain among `owners`: the Deployment controller copies
/// a Deployment's annotations onto its ReplicaSets (and never removes them), so a record
/// such as `reaped-at` is read from roots only, or one workload would count twice.
fn is_root(
    o: &crate::cluster::inventory::ObjectInfo,
    owners: &HashMap<ObjectKey, crate::cluster::inventory::ObjectInfo>,
) -> bool {
    o.owner.as_ref().is_none_or(|up| {
        !owners.contains_key(&ObjectKey::new(
            &up.api_version,
            &up.kind,
            &o.namespace,
            &up.name,
        ))
    })
}

/// Actions of the last hour (`reaped-at`) on roots `policy` governs that have no pods
/// any more, so are not in `workloads`: a scaled-to-zero Deployment loses its pods once
/// its controller removes them, and `maxPerHour` must still count that action.
pub fn acted_last_hour_without_pods(
    policy: &GpuPolicy,
    policies: &[&GpuPolicy],
    owners: &HashMap<ObjectKey, crate::cluster::inventory::ObjectInfo>,
    workloads: &[Workload],
    namespaces: &HashMap<String, BTreeMap<String, String>>,
    now: Timestamp,
) -> u32 {
    let hour_ago = now - SignedDuration::from_hours(1);
    let listed: std::collections::HashSet<ObjectKey> =
        workloads.iter().map(|w| w.root.key()).collect();
    let empty = BTreeMap::new();
    let mut acted = 0;
    for o in owners.values() {
        let recent = o
            .annotations
            .get(keys::REAPED_AT)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|t| t >= hour_ago);
        if !recent || !is_root(o, owners) || listed.contains(&o.key()) {
            continue;
        }
        let ns_labels = namespaces.get(&o.namespace).unwrap_or(&empty);
        let (chosen, _) = policy::select(policies.iter().copied(), &o.kind, ns_labels, &o.labels);
        if chosen.map(|p| &p.metadata.name) == Some(&policy.metadata.name) {
            acted += 1;
        }
    }
    acted
}

/// The pre-warms due under `policy` at `now` (`action.preWarm`; none without it): its
/// reclaimed roots — `reaped-at` set, the restore record done and keeping no replica
/// serving, no GPU pods listed, not being deleted — through the engine's
/// [`crate::engine::prewarms`] over the policy's idle-span history, as `backtest`
/// calls it. Each is woken the way a `gpureaper.io/wake` request is
/// ([`super::housekeeping::prewarm`]).
pub fn prewarms_due<'a>(
    policy: &GpuPolicy,
    policies: &[&GpuPolicy],
    owners: &'a HashMap<ObjectKey, crate::cluster::inventory::ObjectInfo>,
    workloads: &[Workload],
    namespaces: &HashMap<String, BTreeMap<String, String>>,
    history: &Histories<ObjectKey>,
    now: Timestamp,
) -> Vec<(
    &'a crate::cluster::inventory::ObjectInfo,
    crate::engine::prewarm::PreWarm,
)> {
    use crate::cluster::actions::{RestoreRecord, RestoreState};
    let rules = Rules::from_spec(&policy.spec);
    if rules.pre_warm.is_none() {
        return Vec::new();
    }
    let listed: std::collections::HashSet<ObjectKey> =
        workloads.iter().map(|w| w.root.key()).collect();
    let empty = BTreeMap::new();
    let mut reclaimed = Vec::new();
    for o in owners.values() {
        let Some(reaped_at) = o
            .annotations
            .get(keys::REAPED_AT)
            .and_then(|t| t.parse::<Timestamp>().ok())
        else {
            continue;
        };
        let done = RestoreRecord::parse(&o.annotations)
            .is_some_and(|r| r.state == RestoreState::Done && r.kept.unwrap_or(0) == 0);
        if !done || o.deleting || !is_root(o, owners) || listed.contains(&o.key()) {
            continue;
        }
        let ns_labels = namespaces.get(&o.namespace).unwrap_or(&empty);
        let (chosen, _) = policy::select(policies.iter().copied(), &o.kind, ns_labels, &o.labels);
        if chosen.map(|p| &p.metadata.name) == Some(&policy.metadata.name) {
            reclaimed.push((o.key(), reaped_at));
        }
    }
    reclaimed.sort_by(|a, b| a.0.cmp(&b.0));
    crate::engine::prewarms(&rules, &reclaimed, history, now)
        .into_iter()
        .filter_map(|(key, p)| owners.get(&key).map(|o| (o, p)))
        .collect()
}

pub fn reclaimed_holdings(
    policy: &GpuPolicy,
    policies: &[&GpuPolicy],
    owners: &HashMap<ObjectKey, crate::cluster::inventory::ObjectInfo>,
    namespaces: &HashMap<String, BTreeMap<String, String>>,
) -> Reclaimed {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Held {
        gpus: f64,
        hourly_usd: f64,
    }
    let empty = BTreeMap::new();
    let mut out = Reclaimed::default();
    for o in owners.values() {
        if !o.annotations.contains_key(keys::REAPED_AT) {
            continue;
        }
        // Only a root holds the record (see `is_root`).
        if !is_root(o, owners) {
            continue;
        }
        let Some(held) = o
            .annotations
            .get(keys::RECLAIMED)
            .and_then(|t| serde_json::from_str::<Held>(t).ok())
        else {
            continue;
        };
        let ns_labels = namespaces.get(&o.namespace).unwrap_or(&empty);
        let (chosen, _) = policy::select(policies.iter().copied(), &o.kind, ns_labels, &o.labels);
        if chosen.map(|p| &p.metadata.name) == Some(&policy.metadata.name) {
            out.workloads += 1;
            out.gpus += held.gpus;
            out.hourly_usd += held.hourly_usd;
        }
    }
    out
}

/// This month's GPU spend per namespace after one more evaluation: the previous figures
/// (a figure for another month starts again from zero) plus what each namespace's
/// governed GPUs cost per hour (`hourly_by_namespace`) over the time since the last
/// evaluation, at most `max_gap` (a controller that was down does not bill its downtime)
/// and never across the month boundary.
pub fn accrue_spend(
    previous: &[NamespaceSpend],
    last: Option<Timestamp>,
    now: Timestamp,
    hourly_by_namespace: &BTreeMap<String, f64>,
    max_gap: SignedDuration,
) -> Vec<NamespaceSpend> {
    let month = crate::admission::budget::month_of(now);
    let month_start: Timestamp = format!("{month}-01T00:00:00Z").parse().unwrap_or(now);
    let elapsed = last.map_or(SignedDuration::ZERO, |last| {
        now.duration_since(last.max(month_start))
            .clamp(SignedDuration::ZERO, max_gap.max(SignedDuration::ZERO))
    });
    let hours = elapsed.as_secs_f64() / 3600.0;
    let mut spend: BTreeMap<String, f64> = previous
        .iter()
        .filter(|s| s.month == month)
        .map(|s| (s.namespace.clone(), s.spent_usd))
        .collect();
    for (namespace, hourly) in hourly_by_namespace {
        *spend.entry(namespace.clone()).or_default() += hourly * hours;
    }
    spend
        .into_iter()
        .map(|(namespace, spent_usd)| NamespaceSpend {
            namespace,
            month: month.clone(),
            // Not rounded: rounding every minute would drift by dollars over a month.
            spent_usd,
        })
        .collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "plan_spend_tests.rs"]
mod spend_tests;
