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
use crate::telemetry::prometheus::Observations;

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
        .map(|((i, ..), p)| Planned {
            workload: *i,
            decision: p.decision,
            softer: p.softer,
            unsupported: p.unsupported,
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
    let month = crate::admission::decide::month_of(now);
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
mod tests {
    use super::*;
    use crate::cluster::inventory::{pod_info, resolve};
    use crate::engine::model::Step;
    use crate::gpus::GpuResources;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-11-29T12:00:00Z".parse().unwrap()
    }

    fn policy() -> GpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
            "spec": {"mode": "Enforce", "action": {"type": "ScaleToZero", "after": "60m", "maxPerHour": 20},
                     "warn": {"after": "30m"}},
        }))
        .unwrap()
    }

    /// [`policy`] evicting: what works on the bare pods of [`idle_fleet`] (a bare Pod
    /// cannot be scaled to zero).
    fn evicting() -> GpuPolicy {
        let mut p = policy();
        p.spec.action.type_ = ActionType::Evict;
        p
    }

    #[test]
    fn warnings_name_what_is_done_to_the_kind_not_the_policys_word() {
        let root = |api_version: &str, kind: &str| crate::cluster::inventory::ObjectInfo {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: "ml".into(),
            name: "w".into(),
            owner: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            created_at: now(),
            deleting: false,
        };
        let p = policy();
        assert_eq!(
            effective_action(&p, &root("batch/v1", "Job")),
            ActionType::Suspend
        );
        assert_eq!(
            effective_action(&p, &root("kubeflow.org/v1", "PyTorchJob")),
            ActionType::Suspend
        );
        assert_eq!(
            effective_action(&p, &root("apps/v1", "Deployment")),
            ActionType::ScaleToZero
        );
        assert_eq!(
            effective_action(&evicting(), &root("batch/v1", "Job")),
            ActionType::Evict
        );
    }

    #[test]
    fn scale_to_zero_on_a_bare_pod_is_planned_as_unsupported_not_attempted() {
        let p = policy();
        let plan = plan_fleet(&p, &[&p], 1, 0);
        let planned = &plan.planned[0];
        assert_eq!(planned.decision.step, Step::Nothing);
        assert_eq!(planned.unsupported, Some(ActionType::ScaleToZero));
        assert!(
            planned
                .decision
                .reason
                .contains("a Pod cannot be scaled to zero"),
            "{}",
            planned.decision.reason
        );
    }

    /// A one-GPU pod `ml/name` created a day ago, with `meta` merged into its metadata.
    fn gpu_pod(name: &str, meta: serde_json::Value) -> crate::cluster::inventory::PodInfo {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-11-28T12:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"},
        });
        for (k, v) in meta.as_object().into_iter().flatten() {
            pod["metadata"][k] = v.clone();
        }
        pod_info(&pod, &GpuResources::default(), now()).unwrap()
    }

    /// GPU `i`, fully observed for a day, last busy `idle_for` ago.
    fn idle_gpu(i: usize, idle_for: SignedDuration) -> GpuObservation {
        GpuObservation {
            id: format!("GPU-{i}"),
            model: "NVIDIA L4".into(),
            share: 1.0,
            coverage: 1.0,
            first_sample_at: Some(now() - SignedDuration::from_hours(24)),
            last_busy_at: Some(now() - idle_for),
            ..GpuObservation::default()
        }
    }

    /// `n` bare GPU pods created a day ago, warned 45 minutes ago, idle for 2 hours.
    fn idle_fleet(n: usize, reaped: usize) -> (Vec<Workload>, Observations) {
        let mut pods = Vec::new();
        let mut observations = Observations::new();
        for i in 0..n {
            let mut annotations = json!({"gpureaper.io/warned-at": "2026-11-29T11:15:00Z"});
            if i < reaped {
                annotations["gpureaper.io/reaped-at"] = json!("2026-11-29T11:50:00Z");
            }
            let name = format!("nb-{i:03}");
            pods.push(gpu_pod(&name, json!({"annotations": annotations})));
            let idle_for = SignedDuration::from_hours(2) + SignedDuration::from_mins(i as i64);
            observations.insert(
                ("ml".into(), name, format!("GPU-{i}")),
                idle_gpu(i, idle_for),
            );
        }
        (resolve(pods, &HashMap::new()), observations)
    }

    /// A Deployment `chat` with `replicas` GPU pods, warned 45 minutes ago and idle 2 h.
    fn chat(replicas: usize) -> (Vec<Workload>, Observations) {
        let owner = |kind: &str, name: &str| json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true}]);
        let objects = [
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "chat", "namespace": "ml", "creationTimestamp": "2026-11-01T00:00:00Z",
                                "annotations": {"gpureaper.io/warned-at": "2026-11-29T11:15:00Z"}}}),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": "chat-7f", "namespace": "ml", "ownerReferences": owner("Deployment", "chat")}}),
        ]
        .iter()
        .map(|v| {
            let o = crate::cluster::inventory::ObjectInfo::from_value(v).unwrap();
            (o.key(), o)
        })
        .collect();
        let mut pods = Vec::new();
        let mut observations = Observations::new();
        for i in 0..replicas {
            let name = format!("chat-7f-{i}");
            pods.push(gpu_pod(
                &name,
                json!({"ownerReferences": owner("ReplicaSet", "chat-7f")}),
            ));
            observations.insert(
                ("ml".into(), name, format!("GPU-{i}")),
                idle_gpu(i, SignedDuration::from_hours(2)),
            );
        }
        (resolve(pods, &objects), observations)
    }

    /// Idle spans of 3 minutes between 10 busy minutes, 30 times, ending 2 h ago.
    fn chatty(history: &mut Histories<ObjectKey>, key: &ObjectKey) {
        let minute = SignedDuration::from_mins(1);
        let mut t = now() - SignedDuration::from_hours(2) - minute * (30 * 13);
        for _ in 0..30 {
            for _ in 0..10 {
                history.busy(key, t, minute);
                t += minute;
            }
            for _ in 0..3 {
                history.idle(key, t);
                t += minute;
            }
        }
        history.busy(key, t, minute);
    }

    /// The span an action cuts short stays open while the workload is gone and closes,
    /// resumed, when the owner brings it back busy: the controller learns its regrets.
    #[test]
    fn an_idle_span_cut_by_an_action_is_learnt_when_the_workload_comes_back() {
        let p = policy();
        let mut history = Histories::new(Rules::from_spec(&p.spec).risk);
        let (workloads, observations) = chat(1);
        let half_hour = SignedDuration::from_mins(30);
        let cycle = |history: &mut Histories<ObjectKey>,
                     workloads: &[Workload],
                     observations: &Observations,
                     at: Timestamp| {
            cycle(&p, &[&p], workloads, observations, history, half_hour, at)
        };
        let acted = cycle(&mut history, &workloads, &observations, now());
        assert_eq!(
            acted.planned[0].decision.step,
            Step::Act(ActionType::ScaleToZero)
        );
        assert_eq!(history.spans(), 0, "the span is still open");
        // Scaled to zero: no pods, nothing governed.
        cycle(
            &mut history,
            &[],
            &Observations::new(),
            now() + SignedDuration::from_mins(30),
        );
        assert_eq!(history.spans(), 0, "still open while it is gone");
        // Back and busy an hour after the action.
        let back = now() + SignedDuration::from_hours(1);
        let mut busy = observations.clone();
        for o in busy.values_mut() {
            o.last_busy_at = Some(back);
        }
        cycle(&mut history, &workloads, &busy, back);
        assert_eq!(history.spans(), 1, "closed, resumed, when it came back");
    }

    #[test]
    fn request_driven_inference_is_scaled_to_its_minimum_and_left_alone_there() {
        let mut p = policy();
        p.spec.action.inference = Some(crate::api::policy::InferenceAction { min_replicas: 1 });
        let run = |replicas: usize, learnt: bool, p: &GpuPolicy| {
            let (workloads, observations) = chat(replicas);
            let mut history = Histories::new(Rules::from_spec(&p.spec).risk);
            if learnt {
                chatty(&mut history, &workloads[0].root.key());
            }
            let minute = SignedDuration::from_mins(1);
            cycle(
                p,
                &[p],
                &workloads,
                &observations,
                &mut history,
                minute,
                now(),
            )
            .planned
            .remove(0)
        };
        // Three replicas of a chatty server: act, keeping one.
        let planned = run(3, true, &p);
        assert_eq!(planned.decision.step, Step::Act(ActionType::ScaleToZero));
        match &planned.softer {
            Softer::Keep { keep: 1, why } => assert!(why.contains("under 4m"), "{why}"),
            other => panic!("{other:?}"),
        }
        // One replica left: nothing to reclaim, and the reason says so.
        let planned = run(1, true, &p);
        assert_eq!(planned.decision.step, Step::Nothing);
        assert!(
            planned.decision.reason.contains("already at 1 replica(s)"),
            "{}",
            planned.decision.reason
        );
        // No rhythm learnt yet, or no inference section: the policy's own action.
        assert_eq!(run(3, false, &p).softer, Softer::No);
        assert_eq!(
            run(1, false, &p).decision.step,
            Step::Act(ActionType::ScaleToZero)
        );
        assert_eq!(run(3, true, &policy()).softer, Softer::No);
    }

    /// One cycle of `policy` (`all` the policies in the cluster) at `at`, with no
    /// namespace labels and no Audit memory.
    fn cycle(
        policy: &GpuPolicy,
        all: &[&GpuPolicy],
        workloads: &[Workload],
        observations: &Observations,
        history: &mut Histories<ObjectKey>,
        resolution: SignedDuration,
        at: Timestamp,
    ) -> PolicyPlan {
        plan(
            policy,
            all,
            workloads,
            &HashMap::new(),
            &by_pod(observations),
            &AuditMemory::default(),
            history,
            resolution,
            at,
        )
    }

    /// `policy`'s plan over `n` idle workloads, with `all` the policies in the cluster.
    fn plan_fleet(policy: &GpuPolicy, all: &[&GpuPolicy], n: usize, reaped: usize) -> PolicyPlan {
        let (workloads, observations) = idle_fleet(n, reaped);
        let mut history = Histories::new(Rules::from_spec(&policy.spec).risk);
        let minute = SignedDuration::from_mins(1);
        cycle(
            policy,
            all,
            &workloads,
            &observations,
            &mut history,
            minute,
            now(),
        )
    }

    fn acts(plan: &PolicyPlan) -> usize {
        plan.planned
            .iter()
            .filter(|p| matches!(p.decision.step, Step::Act(_)))
            .count()
    }

    #[test]
    fn two_hundred_idle_workloads_get_exactly_max_per_hour_actions_longest_idle_first() {
        let p = evicting();
        let plan = plan_fleet(&p, &[&p], 200, 0);
        assert_eq!(plan.planned.len(), 200);
        assert_eq!(acts(&plan), 20);
        // The longest idle (highest index: idle longest) are the ones acted on.
        let acted: Vec<usize> = plan
            .planned
            .iter()
            .filter(|p| matches!(p.decision.step, Step::Act(_)))
            .map(|p| p.workload)
            .collect();
        assert!(acted.iter().all(|&i| i >= 180), "{acted:?}");
        assert!(
            plan.planned
                .iter()
                .filter(|p| matches!(p.decision.step, Step::RateLimited(_)))
                .count()
                == 180
        );
    }

    #[test]
    fn the_controller_learns_idle_spans_across_cycles_and_the_risk_gate_holds_a_workload_that_always_came_back()
     {
        let mut p = policy();
        p.spec.idle.max_resume_risk = Some(0.1);
        p.spec.idle.min_idle_spans = 3;
        let all = [&p];
        let (workloads, _) = idle_fleet(1, 0);
        let key = workloads[0].root.key();
        let mut history = Histories::new(Rules::from_spec(&p.spec).risk);
        let minute = SignedDuration::from_mins(1);
        // Four days: each day the pod is busy, idle 3 hours, busy again, then idle until
        // the next day. Of its past idle spans longer than 2h, half ended within 2h more.
        let day0 = now() - SignedDuration::from_hours(24 * 4);
        for d in 0..4 {
            let start = day0 + SignedDuration::from_hours(24 * d);
            for (at, busy) in [
                (start, start),
                (
                    start + SignedDuration::from_hours(3),
                    start + SignedDuration::from_hours(3),
                ),
            ] {
                let mut observations = Observations::new();
                observations.insert(
                    ("ml".into(), "nb-000".into(), "GPU-0".into()),
                    GpuObservation {
                        id: "GPU-0".into(),
                        share: 1.0,
                        coverage: 1.0,
                        first_sample_at: Some(day0 - SignedDuration::from_hours(24)),
                        last_busy_at: Some(busy - minute),
                        ..GpuObservation::default()
                    },
                );
                // The cycle that sees the busy instant, then an idle one an hour later.
                for when in [at, at + SignedDuration::from_hours(1)] {
                    cycle(
                        &p,
                        &all,
                        &workloads,
                        &observations,
                        &mut history,
                        minute,
                        when,
                    );
                }
            }
        }
        assert!(
            history.get(&key).is_some_and(|h| h.len() >= 3),
            "{history:?}"
        );
        // Now idle 2 hours: every past span that outlasted 2h ended within the next 2h.
        let (workloads, observations) = idle_fleet(1, 0);
        let planned = cycle(
            &p,
            &all,
            &workloads,
            &observations,
            &mut history,
            minute,
            now(),
        );
        let d = &planned.planned[0].decision;
        assert_eq!(d.step, Step::Nothing, "{}", d.reason);
        assert!(
            d.reason.contains("above idle.maxResumeRisk (10 %)"),
            "{}",
            d.reason
        );
        // A fresh controller has no history: knowing nothing is not permission (invariant
        // 13), it waits, and says until when.
        let fresh = plan_fleet(&p, &all, 1, 0);
        let d = &fresh.planned[0].decision;
        assert_eq!(d.step, Step::Nothing, "{d:?}");
        assert!(
            d.reason.contains("no comparable history yet")
                && d.reason.contains("waits until there is"),
            "{}",
            d.reason
        );
        let mut capped = p.clone();
        capped.spec.idle.max_idle = Some("8h".parse().unwrap());
        let d = plan_fleet(&capped, &[&capped], 1, 0)
            .planned
            .remove(0)
            .decision;
        assert_eq!(d.step, Step::Nothing, "{d:?}");
        assert!(d.reason.contains("waits until 8h"), "{}", d.reason);
    }

    #[test]
    fn actions_taken_in_the_last_hour_count_against_the_budget() {
        let p = evicting();
        // 20 were reclaimed ten minutes ago (their pods are still listed while they stop).
        let plan = plan_fleet(&p, &[&p], 200, 20);
        assert_eq!(acts(&plan), 0);
    }

    #[test]
    fn a_workload_governed_by_a_higher_priority_policy_is_reported_as_shadowed() {
        let low = policy();
        let mut high = policy();
        high.metadata.name = Some("high".into());
        high.spec.priority = 10;
        let plan = plan_fleet(&low, &[&low, &high], 2, 0);
        assert_eq!(plan.shadowed.len(), 2);
        assert_eq!(plan.shadowed[0].1, "high");
        assert_eq!(plan.shadowed[0].0.to_string(), "ml/Pod/nb-000");
        let winner = plan_fleet(&high, &[&low, &high], 2, 0);
        assert!(winner.shadowed.is_empty());
    }

    #[test]
    fn a_workload_governed_by_a_higher_priority_policy_is_not_planned_here() {
        let low = policy();
        let mut high = policy();
        high.metadata.name = Some("high".into());
        high.spec.priority = 10;
        let plan = plan_fleet(&low, &[&low, &high], 3, 0);
        assert!(plan.planned.is_empty());
    }
}

#[cfg(test)]
mod spend_tests {
    use super::*;

    #[test]
    fn an_action_on_a_workload_whose_pods_are_gone_still_counts_against_max_per_hour() {
        let policy: GpuPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
            "spec": {"mode": "Enforce"}}))
        .unwrap();
        let now: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
        let owner = |name: &str, reaped_at: &str, owned_by: Option<&str>| {
            let mut o = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-11-28T12:00:00Z",
                             "annotations": {keys::REAPED_AT: reaped_at}}});
            if let Some(parent) = owned_by {
                o["kind"] = "ReplicaSet".into();
                o["metadata"]["ownerReferences"] = serde_json::json!([
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": parent, "uid": "u", "controller": true}]);
            }
            let info = crate::cluster::inventory::ObjectInfo::from_value(&o).unwrap();
            (info.key(), info)
        };
        let owners: HashMap<_, _> = [
            // Scaled to zero 20 minutes ago; its controller has removed the pods.
            owner("chat", "2026-11-29T11:40:00Z", None),
            // Its ReplicaSet, with the copied annotation: the same action.
            owner("chat-7f9c", "2026-11-29T11:40:00Z", Some("chat")),
            // Two hours ago: outside the hour.
            owner("old", "2026-11-29T10:00:00Z", None),
        ]
        .into_iter()
        .collect();
        let acted =
            acted_last_hour_without_pods(&policy, &[&policy], &owners, &[], &HashMap::new(), now);
        assert_eq!(acted, 1);
    }

    #[test]
    fn a_reclaimed_deployment_counts_once_though_its_replica_set_carries_copies_of_its_annotations()
    {
        let policy: GpuPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
            "spec": {"mode": "Enforce"}}))
        .unwrap();
        let record = serde_json::json!({
            keys::REAPED_AT: "2026-11-29T12:00:00Z",
            keys::RECLAIMED: r#"{"gpus": 1.0, "hourlyUsd": 2.5}"#,
        });
        let deployment = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "chat", "namespace": "ml", "annotations": record,
                         "creationTimestamp": "2026-11-28T12:00:00Z"}});
        // What the Deployment controller writes: the Deployment's annotations, copied.
        let replica_set = serde_json::json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "chat-7f9c", "namespace": "ml", "annotations": record,
                         "creationTimestamp": "2026-11-28T12:00:00Z",
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat", "uid": "u", "controller": true}]}});
        let owners: HashMap<_, _> = [deployment, replica_set]
            .iter()
            .map(|o| {
                let info = crate::cluster::inventory::ObjectInfo::from_value(o).unwrap();
                (info.key(), info)
            })
            .collect();
        let held = reclaimed_holdings(&policy, &[&policy], &owners, &HashMap::new());
        assert_eq!(held.workloads, 1);
        assert_eq!(held.gpus, 1.0);
    }

    #[test]
    fn idle_gpu_hours_of_the_last_day_converge_to_a_day_of_idleness_and_fade_after() {
        let mut v = 0.0;
        for _ in 0..(24 * 60 * 7) {
            v = decay_24h(v, 2.0, 1.0 / 60.0);
        }
        assert!((v - 48.0).abs() < 0.5, "a week of 2 idle GPUs: {v}");
        for _ in 0..(24 * 60 * 3) {
            v = decay_24h(v, 0.0, 1.0 / 60.0);
        }
        assert!(v < 48.0 * 0.06, "three quiet days later: {v}");
    }

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn spend_accrues_per_namespace_and_starts_again_each_month() {
        let hourly = BTreeMap::from([("team-a".to_string(), 8.0), ("team-b".to_string(), 2.5)]);
        let gap = SignedDuration::from_mins(5);
        let first = accrue_spend(&[], None, t("2026-11-29T12:00:00Z"), &hourly, gap);
        assert_eq!(
            first.iter().map(|s| s.spent_usd).sum::<f64>(),
            0.0,
            "no interval yet"
        );
        let second = accrue_spend(
            &first,
            Some(t("2026-11-29T12:00:00Z")),
            t("2026-11-29T12:01:00Z"),
            &hourly,
            gap,
        );
        assert_eq!(second[0].namespace, "team-a");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(second[0].spent_usd, 8.0 / 60.0), "{second:?}"); // 8 USD/h × 1 min
        assert_eq!(second[0].month, "2026-11");
        // A controller down for a day bills at most `max_gap`.
        let after_outage = accrue_spend(
            &second,
            Some(t("2026-11-29T12:01:00Z")),
            t("2026-11-30T12:01:00Z"),
            &hourly,
            gap,
        );
        assert!(
            close(after_outage[0].spent_usd, 8.0 / 60.0 + 8.0 * 5.0 / 60.0),
            "{after_outage:?}"
        );
        // December starts from zero and does not bill November's minutes.
        let december = accrue_spend(
            &after_outage,
            Some(t("2026-11-30T23:59:00Z")),
            t("2026-12-01T00:01:00Z"),
            &hourly,
            gap,
        );
        assert_eq!(december[0].month, "2026-12");
        assert!(close(december[0].spent_usd, 8.0 / 60.0), "{december:?}"); // the 1 min after midnight
    }
}
