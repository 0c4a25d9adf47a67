use super::*;
use crate::api::policy::GpuPolicyStatus;
use serde_json::json;

fn at(minute: i64) -> Timestamp {
    Timestamp::from_second(1_795_000_000 + minute * 60).unwrap()
}

fn policy(channels: &[&str], status: Option<GpuPolicyStatus>) -> GpuPolicy {
    let mut p: GpuPolicy = serde_json::from_value(json!({
        "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
        "metadata": {"name": "p", "generation": 3},
        "spec": {"mode": "Enforce", "warn": {"channels": channels}}}))
    .unwrap();
    p.status = status;
    p
}

fn evaluated(shadowed: usize) -> Found {
    Found::Evaluated(Evaluation {
        counts: WorkloadCounts {
            governed: 3,
            gpus: 10,
            idle: 1,
            warned: 1,
            ..WorkloadCounts::default()
        },
        shadowed: (0..shadowed)
            .map(|i| {
                (
                    ObjectKey::new("apps/v1", "Deployment", "ml", &format!("w{i}")),
                    "other".to_string(),
                )
            })
            .collect(),
        hourly_by_namespace: BTreeMap::from([("ml".to_string(), 25.0)]),
        reclaimed: Reclaimed {
            workloads: 1,
            gpus: 2.0,
            hourly_usd: 5.0,
        },
        idle_gpus: 1.0,
    })
}

fn get<'a>(status: &'a GpuPolicyStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {:?}", status.conditions))
}

const GAP: SignedDuration = SignedDuration::from_mins(2);

#[test]
fn an_evaluation_is_ready_and_bills_the_minute_since_the_last_one() {
    let first = compute(&policy(&[], None), &evaluated(0), None, at(0), GAP);
    assert_eq!(first.observed_generation, Some(3));
    assert_eq!(get(&first, "Ready").status, "True");
    assert_eq!(get(&first, "Ready").reason, "Evaluated");
    assert_eq!(get(&first, "Degraded").status, "False");
    assert_eq!(get(&first, "Overlapping").reason, "NoOverlap");
    assert_eq!(first.workloads.reclaimed, 1, "counted from the records");
    assert_eq!(first.workloads.governed, 3);
    assert_eq!(
        first.reclaimed_gpu_hours, 0.0,
        "nothing billed before a first evaluation"
    );
    let second = compute(
        &policy(&[], Some(first.clone())),
        &evaluated(0),
        None,
        at(1),
        GAP,
    );
    assert!(
        (second.reclaimed_gpu_hours - 2.0 / 60.0).abs() < 1e-9,
        "{second:?}"
    );
    assert!((second.estimated_savings_usd - 5.0 / 60.0).abs() < 1e-9);
    assert_eq!(second.namespace_spend[0].namespace, "ml");
    assert!((second.namespace_spend[0].spent_usd - 25.0 / 60.0).abs() < 1e-9);
    assert_eq!(second.last_evaluation_time.as_ref().unwrap().0, at(1));
    // Nothing changed: the transition times stay those of the first evaluation.
    assert_eq!(
        get(&second, "Ready").last_transition_time,
        get(&first, "Ready").last_transition_time
    );
    // Billed for at most the gap, however long the controller was away.
    let late = compute(&policy(&[], Some(first)), &evaluated(0), None, at(600), GAP);
    assert!(
        (late.reclaimed_gpu_hours - 2.0 * 2.0 / 60.0).abs() < 1e-9,
        "{late:?}"
    );
}

#[test]
fn a_telemetry_failure_is_degraded_and_leaves_the_figures_alone() {
    let before = compute(&policy(&[], None), &evaluated(0), None, at(0), GAP);
    let failed = compute(
        &policy(&[], Some(before.clone())),
        &Found::TelemetryFailed("Prometheus down".into()),
        None,
        at(1),
        GAP,
    );
    assert_eq!(get(&failed, "Degraded").status, "True");
    assert_eq!(get(&failed, "Degraded").reason, "TelemetryUnavailable");
    assert_eq!(get(&failed, "Degraded").message, "Prometheus down");
    assert_eq!(get(&failed, "Ready").status, "False");
    assert_eq!(get(&failed, "Ready").last_transition_time.0, at(1));
    assert_eq!(failed.workloads, before.workloads);
    assert_eq!(failed.last_evaluation_time, before.last_evaluation_time);
    assert_eq!(failed.reclaimed_gpu_hours, before.reclaimed_gpu_hours);
}

#[test]
fn overlapping_names_five_workloads_and_counts_the_rest() {
    let status = compute(&policy(&[], None), &evaluated(7), None, at(0), GAP);
    let c = get(&status, "Overlapping");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "GovernedByAnotherPolicy")
    );
    assert!(
        c.message
            .starts_with("7 workloads this policy matches are governed by another policy"),
        "{}",
        c.message
    );
    assert!(
        c.message
            .contains("ml/Deployment/w4 (by other), and 2 more"),
        "{}",
        c.message
    );
}

#[test]
fn notifications_delivered_only_for_policies_with_personal_channels() {
    let failed = delivery_outcome(
        &["a".into(), "b".into(), "c".into(), "d".into(), "e".into()],
        at(0),
    );
    assert_eq!(
        failed,
        (
            false,
            format!("not delivered at {}: a; b; c; and 2 more", at(0))
        )
    );
    let with = compute(
        &policy(&["Event", "Slack"], None),
        &evaluated(0),
        Some(&failed),
        at(0),
        GAP,
    );
    assert_eq!(
        get(&with, "NotificationsDelivered").reason,
        "DeliveryFailed"
    );
    let without = compute(&policy(&[], None), &evaluated(0), Some(&failed), at(0), GAP);
    assert!(
        without
            .conditions
            .iter()
            .all(|c| c.type_ != "NotificationsDelivered"),
        "{:?}",
        without.conditions
    );
    assert_eq!(
        delivery_outcome(&[], at(0)),
        (
            true,
            format!(
                "the Slack and email messages sent at {} were delivered",
                at(0)
            )
        )
    );
}
