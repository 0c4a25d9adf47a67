use super::*;

fn policy(name: &str, generation: i64, evaluated: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
        "metadata": {"name": name, "generation": generation},
        "spec": {},
        "status": {"lastEvaluationTime": evaluated},
    }))
    .unwrap()
}

#[test]
fn only_pods_that_claim_gpus_are_kept_and_a_relist_replaces_them() {
    let pod = |name: &str, limits: serde_json::Value| -> StoredPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    };
    let gpu = |name: &str| pod(name, serde_json::json!({"nvidia.com/gpu": "1"}));
    let cpu = |name: &str| pod(name, serde_json::json!({"cpu": "1"}));
    let names = |pods: &GpuPods| {
        let mut n: Vec<String> = pods.state().iter().map(|p| p.meta.name.clone()).collect();
        n.sort();
        n
    };
    let pods = GpuPods::default();
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(gpu("a")),
        watcher::Event::InitApply(cpu("web")),
        watcher::Event::InitApply(gpu("b")),
    ] {
        pods.apply(&event);
    }
    assert!(names(&pods).is_empty(), "nothing until the list is done");
    assert!(!*pods.ready.borrow());
    pods.apply(&watcher::Event::InitDone);
    assert_eq!(names(&pods), ["a", "b"]);
    assert!(*pods.ready.borrow());
    pods.apply(&watcher::Event::Apply(gpu("c")));
    pods.apply(&watcher::Event::Apply(cpu("web-2")));
    pods.apply(&watcher::Event::Delete(gpu("a")));
    assert_eq!(names(&pods), ["b", "c"]);
    // A re-list (after a 410 Gone) replaces what was kept: "b" is gone.
    pods.apply(&watcher::Event::Init);
    pods.apply(&watcher::Event::InitApply(gpu("c")));
    assert_eq!(names(&pods), ["b", "c"], "kept until the re-list is done");
    pods.apply(&watcher::Event::InitDone);
    assert_eq!(names(&pods), ["c"]);
}

#[test]
fn pods_without_gpus_are_kept_as_names_only() {
    let pod = |limits: serde_json::Value| -> StoredPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "a"},
                         "resourceVersion": "7"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    };
    let cpu = pod(serde_json::json!({"cpu": "4"}));
    assert_eq!(cpu.metadata.name.as_deref(), Some("p"));
    assert_eq!(cpu.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(
        cpu.metadata.resource_version.as_deref(),
        Some("7"),
        "the watcher reads it"
    );
    assert!(cpu.gpu.is_none() && cpu.metadata.labels.is_none());
    let gpu = pod(serde_json::json!({"nvidia.com/gpu": "1"}));
    let parts = gpu.gpu.expect("a GPU pod keeps what the inventory reads");
    assert_eq!(parts.status()["phase"], "Running");
    assert_eq!(parts.meta.labels["app"], "a");
}

#[test]
fn a_stored_gpu_pod_reads_as_the_whole_pod_does() {
    use crate::cluster::inventory::{ClaimGpus, pod_info_with_claims};
    let resources = GpuResources::default();
    let now: jiff::Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
    let claims: ClaimGpus = [(("ml".to_string(), "shared".to_string()), 2.0)].into();
    let pods = [
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "train-0", "namespace": "ml", "uid": "u1", "resourceVersion": "9",
                "creationTimestamp": "2026-11-30T10:00:00Z",
                "labels": {"app": "train", "team": "a"},
                "annotations": {"gpureaper.io/owner": "a@example.com"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Thing", "name": "other", "uid": "x"},
                    {"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                     "uid": "j", "controller": true},
                ],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "spec": {
                "initContainers": [
                    {"name": "fetch", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "side", "image": "i", "restartPolicy": "Always",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                ],
                "containers": [
                    {"name": "main", "image": "i", "env": [{"name": "A", "value": "b"}],
                     "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"},
                                   "requests": {"nvidia.com/gpu": "2"}}},
                    {"name": "log", "image": "i"},
                ],
                "resourceClaims": [{"name": "c", "resourceClaimName": "shared"}],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "status": {
                "phase": "Running", "startTime": "2026-11-30T10:01:00Z",
                "containerStatuses": [
                    {"name": "main", "image": "i", "imageID": "", "ready": false,
                     "restartCount": 3,
                     "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "m"}}},
                    {"name": "log", "image": "i", "imageID": "", "ready": true,
                     "restartCount": 0, "state": {"running": {"startedAt": "2026-11-30T10:02:00Z"}}},
                ],
            },
        }),
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "serve", "namespace": "ml", "resourceVersion": "3",
                         "creationTimestamp": "2026-11-30T11:00:00Z",
                         "deletionTimestamp": "2026-11-30T11:59:00Z"},
            "spec": {"containers": [{"name": "m", "image": "i",
                     "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
            "status": {"phase": "Pending"},
        }),
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "done", "namespace": "ml", "resourceVersion": "4"},
            "spec": {"containers": [{"name": "m", "image": "i",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Succeeded"},
        }),
    ];
    for json in pods {
        let typed: Pod = serde_json::from_value(json.clone()).unwrap();
        // What the cycle read before: the typed pod back to JSON.
        let whole = serde_json::to_value(&typed).unwrap();
        let expected = pod_info_with_claims(&whole, &resources, &(), &claims, now);
        let stored = StoredPod::from(typed);
        let parts = stored.gpu.expect("claims GPUs");
        let got = inventory::pod_info_from_parts(
            parts.meta.clone(),
            &parts.spec(),
            &parts.status(),
            &resources,
            &(),
            &claims,
            now,
        );
        assert_eq!(got, expected, "{}", json["metadata"]["name"]);
    }
}

#[test]
fn only_spec_changes_of_policies_start_a_cycle_early() {
    use watcher::Event;
    let mut seen = HashMap::new();
    let t1 = "2026-11-30T00:00:00Z";
    let t2 = "2026-11-30T00:01:00Z";
    assert!(!policy_spec_changed(&mut seen, &Event::Init));
    assert!(policy_spec_changed(
        &mut seen,
        &Event::InitApply(policy("a", 1, t1))
    ));
    assert!(!policy_spec_changed(&mut seen, &Event::InitDone));
    // The controller's own status apply: same generation, no early cycle.
    assert!(!policy_spec_changed(
        &mut seen,
        &Event::Apply(policy("a", 1, t2))
    ));
    // A re-list after a watch error with nothing changed.
    assert!(!policy_spec_changed(
        &mut seen,
        &Event::InitApply(policy("a", 1, t2))
    ));
    // An edit of the spec, a new policy, a deleted one.
    assert!(policy_spec_changed(
        &mut seen,
        &Event::Apply(policy("a", 2, t2))
    ));
    assert!(policy_spec_changed(
        &mut seen,
        &Event::Apply(policy("b", 1, t2))
    ));
    assert!(policy_spec_changed(
        &mut seen,
        &Event::Delete(policy("b", 1, t2))
    ));
}

#[test]
fn a_cycle_reads_the_owners_its_pods_reach_and_those_with_our_annotations() {
    let resource = |group: &str, kind: &str, plural: &str| ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    };
    let meta = |name: &str, owner: Option<(&str, &str)>, reaped: bool| {
        let mut m: PartialObjectMeta<DynamicObject> = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": "ml", "uid": name},
        }))
        .unwrap();
        if let Some((kind, owner)) = owner {
            m.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: kind.into(),
                    name: owner.into(),
                    uid: owner.into(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]);
        }
        if reaped {
            m.metadata.annotations = Some(
                [(
                    crate::api::keys::REAPED_AT.to_string(),
                    "2026-12-04T00:00:00Z".to_string(),
                )]
                .into(),
            );
        }
        m
    };
    // As the owners' watches fold them.
    let store = |r: &ApiResource, objects: Vec<PartialObjectMeta<DynamicObject>>| {
        let kept = Folded::default();
        let keep = |o: &PartialObjectMeta<DynamicObject>| owner_info(r, o);
        kept.fold(&watcher::Event::Init, keep);
        for o in objects {
            kept.fold(&watcher::Event::InitApply(o), keep);
        }
        kept.fold(&watcher::Event::InitDone, keep);
        (r.clone(), kept)
    };
    let deployments = resource("apps", "Deployment", "deployments");
    let replica_sets = resource("apps", "ReplicaSet", "replicasets");
    let stores = [
        store(
            &deployments,
            vec![
                meta("serve", None, false),
                meta("idle", None, true),
                // Woken: its record removed; its old ReplicaSet keeps the copy.
                meta("woken", None, false),
                meta("web", None, false),
            ],
        ),
        store(
            &replica_sets,
            vec![
                meta("serve-1", Some(("Deployment", "serve")), false),
                meta("idle-1", Some(("Deployment", "idle")), true),
                meta("woken-1", Some(("Deployment", "woken")), true),
                meta("web-1", Some(("Deployment", "web")), false),
            ],
        ),
    ];
    let pod = ObjectInfo {
        owner: Some(inventory::OwnerRef {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "serve-1".into(),
        }),
        ..ObjectInfo::from_meta("v1", "Pod", &meta("serve-1-x", None, false).metadata).unwrap()
    };
    let read = owners_read(&stores, std::iter::once(&pod));
    let mut names: Vec<&str> = read.values().map(|o| o.name.as_str()).collect();
    names.sort();
    // The GPU pod's chain; the reaped workload; the ReplicaSet with a leftover copy
    // and the Deployment above it (so it is not taken for a root). Not "web".
    assert_eq!(
        names,
        ["idle", "idle-1", "serve", "serve-1", "woken", "woken-1"]
    );
    assert!(
        read[&ObjectKey::new("apps/v1", "Deployment", "ml", "idle")]
            .annotations
            .contains_key(crate::api::keys::REAPED_AT)
    );
}
