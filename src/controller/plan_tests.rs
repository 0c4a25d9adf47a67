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
        uid: String::new(),
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
        d.reason.contains("no comparable history yet") && d.reason.contains("waits until there is"),
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

#[test]
fn an_audit_policy_counts_the_warnings_its_memory_holds() {
    let mut audit = policy();
    audit.spec.mode = PolicyMode::Audit;
    // Idle 2 h, no warned-at annotation (Audit writes none): warned 45 minutes ago in the
    // controller's memory only.
    let (mut workloads, observations) = idle_fleet(3, 0);
    for w in &mut workloads {
        w.root.annotations.remove("gpureaper.io/warned-at");
    }
    let mut memory = AuditMemory::default();
    for w in &workloads[..2] {
        memory
            .warned_at
            .insert(w.root.key(), now() - SignedDuration::from_mins(45));
    }
    let mut history = Histories::new(Rules::from_spec(&audit.spec).risk);
    let planned = plan(
        &audit,
        &[&audit],
        &workloads,
        &HashMap::new(),
        &by_pod(&observations),
        &memory,
        &mut history,
        SignedDuration::from_mins(1),
        now(),
    );
    let counts = super::super::status::evaluation(&planned, &workloads, Default::default()).counts;
    // Two remembered warnings, and the third is warned this cycle.
    assert_eq!(counts.warned, 3, "{planned:#?}");
    assert_eq!(
        planned
            .planned
            .iter()
            .filter(|p| matches!(p.decision.step, Step::Warn))
            .count(),
        1
    );
}
