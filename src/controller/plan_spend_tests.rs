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
fn a_reclaimed_deployment_counts_once_though_its_replica_set_carries_copies_of_its_annotations() {
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
