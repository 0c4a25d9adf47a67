use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::*;
use crate::api::GpuPolicy;
use crate::cluster::inventory::{ObjectInfo, pod_info, resolve};
use crate::controller::plan::Planned;
use crate::engine::model::{GpuObservation, LadderState, WorkloadMeta};
use crate::engine::risk::Estimate;
use crate::engine::{Rules, evaluate};
use crate::gpus::GpuResources;

fn now() -> Timestamp {
    "2026-11-02T10:00:00Z".parse().unwrap()
}

fn mins(m: i64) -> SignedDuration {
    SignedDuration::from_mins(m)
}

fn policy(mode: &str) -> GpuPolicy {
    let mut p = crate::backtest::samples::sample_policy().unwrap();
    p.metadata.name = Some("team".into());
    p.spec.mode = serde_json::from_value(json!(mode)).unwrap();
    p
}

fn sources() -> Sources {
    Sources {
        prometheus_url: "http://prometheus:9090".into(),
        history_backfill: "24h".into(),
    }
}

/// A root `kind` `ml/name` with one GPU pod created 3 hours ago, and `annotations`.
fn seen(kind: &str, mode: &str, annotations: Value, last_busy_ago: i64) -> Seen {
    seen_with(kind, mode, annotations, last_busy_ago, |_| {})
}

/// [`seen`], with `edit` made to the policy first.
fn seen_with(
    kind: &str,
    mode: &str,
    annotations: Value,
    last_busy_ago: i64,
    edit: impl Fn(&mut GpuPolicy),
) -> Seen {
    let (api_version, group_kind) = match kind {
        "Job" => ("batch/v1", "Job"),
        _ => ("apps/v1", "Deployment"),
    };
    let created = (now() - SignedDuration::from_hours(3)).to_string();
    let root = ObjectInfo::from_value(&json!({"apiVersion": api_version, "kind": group_kind,
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u1", "creationTimestamp": created,
                     "annotations": annotations}}))
    .unwrap();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "chat-0", "namespace": "ml", "creationTimestamp": created,
                     "ownerReferences": [{"apiVersion": api_version, "kind": group_kind, "name": "chat", "uid": "u1", "controller": true}]},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}});
    let mut owners = HashMap::new();
    owners.insert(root.key(), root.clone());
    let workload = resolve(
        vec![pod_info(&pod, &GpuResources::default(), now()).unwrap()],
        &owners,
    )
    .remove(0);
    let mut policy = policy(mode);
    edit(&mut policy);
    let rules = Rules::from_spec(&policy.spec);
    let gpu = GpuObservation {
        id: "GPU-1".into(),
        model: "NVIDIA H100 80GB HBM3".into(),
        share: 1.0,
        coverage: 1.0,
        first_sample_at: Some(now() - SignedDuration::from_hours(3)),
        last_busy_at: Some(now() - mins(last_busy_ago)),
        ..Default::default()
    };
    let meta = WorkloadMeta {
        kind: root.kind.clone(),
        namespace: root.namespace.clone(),
        name: root.name.clone(),
        created_at: root.created_at,
        labels: root.labels.clone(),
        annotations: root.annotations.clone(),
    };
    let ladder = LadderState::from_annotations(&root.annotations);
    let pods: Vec<_> = workload.pods.iter().map(|p| p.state.clone()).collect();
    let decision = evaluate(
        &rules,
        &meta,
        &pods,
        std::slice::from_ref(&gpu),
        &ladder,
        now(),
    );
    Seen {
        at: now(),
        action: crate::controller::plan::effective_action(&policy, &root),
        root,
        workload: Some(workload),
        policy,
        outranked: vec!["catch-all".into()],
        planned: Some(Planned {
            workload: 0,
            decision,
            softer: Softer::No,
            unsupported: None,
            warned_at: ladder.warned_at,
        }),
        gpus: vec![("chat-0".into(), gpu)],
        namespace_exempt: false,
        audit_warned_at: None,
        audit_would_act_at: None,
    }
}

fn json_of(e: &Explanation) -> Value {
    serde_json::to_value(e).unwrap()
}

#[test]
fn an_idle_workload_not_yet_warned_is_told_when_the_warning_is_due() {
    // Idle past a 15-minute window, the warning 30 minutes after the last activity.
    let s = seen_with("Deployment", "Enforce", json!({}), 20, |p| {
        p.spec.idle.window = "15m".parse().unwrap();
    });
    let e = build(&s, sources());
    let j = json_of(&e);
    let d = &j["decision"];
    assert_eq!(d["classification"], "Idle/Unused", "{j:#}");
    assert_eq!(d["step"], "Nothing");
    assert_eq!(d["nextStep"], "Warn");
    // Idle since 20 minutes ago; the warning is due 30 minutes after that.
    let due = (now() + mins(10)).to_string();
    assert_eq!(d["nextStepAt"], due.as_str());
    assert_eq!(j["gpus"][0]["pod"], "chat-0");
    assert_eq!(j["gpus"][0]["coverage"], 1.0);
    assert_eq!(j["policy"]["outranked"], json!(["catch-all"]));
    assert_eq!(j["workload"]["gpus"], 1.0);
    let text = text(&e);
    assert!(
        text.contains(&format!("next        Warn at {due} (in 10m)")),
        "{text}"
    );
    assert!(
        text.contains("also matched, outranked: catch-all"),
        "{text}"
    );
    assert!(
        text.contains("risk        not used (the policy has no idle.maxResumeRisk)"),
        "{text}"
    );
    assert!(
        text.contains("with 24h of activity history replayed"),
        "{text}"
    );
}

#[test]
fn a_warned_job_is_told_when_it_is_suspended() {
    let warned = (now() - mins(5)).to_string();
    let e = build(
        &seen(
            "Job",
            "Enforce",
            json!({"gpureaper.io/warned-at": warned}),
            40,
        ),
        sources(),
    );
    let d = e.decision.as_ref().unwrap();
    assert_eq!(d.step, "Nothing");
    assert_eq!(d.next_step.as_deref(), Some("Act"));
    // The notice (action.after − warn.after = 30m) from the warning: 25 minutes from
    // now, later than action.after (1h) from the last activity.
    assert_eq!(d.next_step_at, Some(now() + mins(25)));
    assert_eq!(e.policy.action_for_kind, "Suspend");
    assert_eq!(e.state.warned_at.as_deref(), Some(warned.as_str()));
    let text = text(&e);
    assert!(
        text.contains("Suspend (the policy's ScaleToZero for a Job)"),
        "{text}"
    );
    assert!(text.contains("next        Act at"), "{text}");
    assert!(text.contains("(in 25m)"), "{text}");
    assert!(text.contains(&format!("warned-at {warned}")), "{text}");
}

#[test]
fn a_workload_warned_this_cycle_is_told_when_the_action_follows() {
    let e = build(&seen("Deployment", "Enforce", json!({}), 40), sources());
    let d = e.decision.as_ref().unwrap();
    assert_eq!(d.step, "Warn");
    assert_eq!(d.next_step.as_deref(), Some("Act"));
    // A notice of 30 minutes from the warning given now.
    assert_eq!(d.next_step_at, Some(now() + mins(30)));
}

#[test]
fn in_audit_mode_the_next_step_after_the_warning_is_would_act() {
    let warned = (now() - mins(5)).to_string();
    let mut s = seen(
        "Deployment",
        "Audit",
        json!({"gpureaper.io/warned-at": warned}),
        40,
    );
    s.audit_warned_at = Some(now() - mins(5));
    let e = build(&s, sources());
    assert_eq!(
        e.decision.as_ref().unwrap().next_step.as_deref(),
        Some("WouldAct")
    );
    assert!(
        text(&e).contains("(the controller's Audit memory)"),
        "{}",
        text(&e)
    );
}

#[test]
fn a_busy_workload_has_no_next_step() {
    let e = build(&seen("Deployment", "Enforce", json!({}), 1), sources());
    let d = e.decision.as_ref().unwrap();
    assert_eq!(d.classification, "Active");
    assert_eq!((d.next_step.as_deref(), d.next_step_at), (None, None));
    assert!(text(&e).contains("nothing scheduled"), "{}", text(&e));
}

#[test]
fn the_risk_estimate_is_shown_with_the_cases_behind_it() {
    let mut s = seen("Deployment", "Enforce", json!({}), 40);
    s.policy.spec.idle.max_resume_risk = Some(0.1);
    s.planned.as_mut().unwrap().decision.estimate = Some(Estimate {
        idle_for: mins(40),
        horizon: SignedDuration::from_hours(2),
        resumed: 2,
        longer: 40,
        product_limit: 0.05,
        basis: crate::engine::risk::Basis::Own,
        blend: None,
    });
    let e = build(&s, sources());
    let r = e.decision.as_ref().unwrap().risk.as_ref().unwrap();
    assert_eq!((r.resumed, r.longer, r.limit), (2, 40, Some(0.1)));
    assert_eq!(r.basis, "own");
    let text = text(&e);
    assert!(
        text.contains(
            "(limit 10 %): 2 of 40 longer spans resumed within 2h (product-limit 5 %, basis own)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "this workload's idle spans longer than 40m ended within 2h in 2 of 40 cases"
        ),
        "{text}"
    );
    assert_eq!(json_of(&e)["decision"]["risk"]["longer"], 40);
}

#[test]
fn a_reclaimed_workload_holding_no_gpus_is_not_judged_and_says_how_to_wake_it() {
    let mut s = seen(
        "Deployment",
        "Enforce",
        json!({"gpureaper.io/reaped-at": "2026-11-02T09:00:00Z", "gpureaper.io/reaped-action": "ScaleToZero"}),
        90,
    );
    s.workload = None;
    s.planned = None;
    s.gpus.clear();
    let e = build(&s, sources());
    assert_eq!(json_of(&e)["decision"], Value::Null);
    assert_eq!(e.workload.gpus, 0.0);
    let text = text(&e);
    assert!(
        text.contains("it holds no GPUs now")
            && text.contains("`gpu-reaper wake ml/Deployment/chat`"),
        "{text}"
    );
    assert!(
        text.contains("reaped-at 2026-11-02T09:00:00Z (ScaleToZero)"),
        "{text}"
    );
}

#[test]
fn an_exempt_namespace_is_named_as_the_source_of_the_exemption() {
    let mut s = seen("Deployment", "Enforce", json!({}), 40);
    s.namespace_exempt = true;
    assert_eq!(
        build(&s, sources()).state.exempt.as_deref(),
        Some("namespace")
    );
}
