use super::*;
use serde_json::json;

fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

fn attestation(name: &str, max_gpus: Value) -> DynamicObject {
    dynamic(json!({
        "apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
        "metadata": {"name": name, "namespace": "team-a", "generation": 1},
        "spec": {"selector": {}, "maxGpus": max_gpus, "expiresAt": "2030-01-01T00:00:00Z"},
    }))
}

fn read_attestation(o: &DynamicObject) -> Result<Option<Arc<ReadinessAttestation>>, String> {
    read_typed::<ReadinessAttestation>(o).map(|a| Some(Arc::new(a)))
}

#[test]
fn one_unreadable_attestation_is_skipped_and_the_rest_sync() {
    let mut fold = Fold::new(false);
    fold.apply(Event::Init, &read_attestation);
    fold.apply(
        Event::InitApply(attestation("good", json!(8))),
        &read_attestation,
    );
    let skipped = fold.apply(
        Event::InitApply(attestation("huge", json!(4294967296u64))),
        &read_attestation,
    );
    fold.apply(Event::InitDone, &read_attestation);
    assert!(
        fold.synced,
        "one bad object must not keep the cache unsynced"
    );
    assert_eq!(skipped.unwrap().0, ("team-a".into(), "huge".into()));
    assert_eq!(fold.items().count(), 1);
    assert_eq!(fold.skipped.len(), 1);
}

#[test]
fn an_attestation_that_becomes_unreadable_stops_covering_and_later_changes_still_apply() {
    let mut fold = Fold::new(false);
    fold.apply(Event::Init, &read_attestation);
    fold.apply(
        Event::InitApply(attestation("a", json!(8))),
        &read_attestation,
    );
    fold.apply(Event::InitDone, &read_attestation);
    fold.apply(
        Event::Apply(attestation("a", json!("many"))),
        &read_attestation,
    );
    assert_eq!(fold.items().count(), 0);
    fold.apply(Event::Apply(attestation("b", json!(4))), &read_attestation);
    assert_eq!(fold.items().count(), 1, "the cache keeps updating");
}

#[test]
fn a_policy_that_becomes_unreadable_keeps_its_last_readable_version() {
    let policy = |large: Value| {
        dynamic(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
            "metadata": {"name": "p"},
            "spec": {"admission": {"largeClaimGpus": large, "mode": "Enforce"}},
        }))
    };
    let read = |o: &DynamicObject| read_typed::<GpuPolicy>(o).map(|p| Some(Arc::new(p)));
    let mut fold = Fold::new(true);
    fold.apply(Event::Init, &read);
    fold.apply(Event::InitApply(policy(json!(8))), &read);
    fold.apply(Event::InitDone, &read);
    fold.apply(Event::Apply(policy(json!(-1))), &read);
    let (_, kept) = fold.items().next().unwrap();
    assert_eq!(kept.spec.admission.as_ref().unwrap().large_claim_gpus, 8);
    // A relist keeps it too.
    fold.apply(Event::Init, &read);
    fold.apply(Event::InitApply(policy(json!(-1))), &read);
    fold.apply(Event::InitDone, &read);
    assert_eq!(fold.items().count(), 1);
}

/// An `action.type` from a newer CRD does not concern admission: the gate reads the
/// policy and applies its rules. `admission.mode` has no fallback: an unknown mode leaves
/// the last readable version in force, so the gate never guesses looser.
#[test]
fn a_new_action_type_does_not_blind_the_gate_and_an_unknown_admission_mode_keeps_the_last_version()
{
    let policy = |action: &str, mode: &str| {
        dynamic(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
            "metadata": {"name": "p"},
            "spec": {"action": {"type": action},
                     "admission": {"largeClaimGpus": 8, "mode": mode}},
        }))
    };
    let read = |o: &DynamicObject| read_typed::<GpuPolicy>(o).map(|p| Some(Arc::new(p)));
    let mut fold = Fold::new(true);
    fold.apply(Event::Init, &read);
    fold.apply(Event::InitApply(policy("Hibernate", "Enforce")), &read);
    fold.apply(Event::InitDone, &read);
    assert!(fold.skipped.is_empty(), "{:?}", fold.skipped);
    let (_, kept) = fold.items().next().unwrap();
    assert_eq!(
        kept.spec.admission.as_ref().unwrap().mode,
        crate::api::policy::AdmissionMode::Enforce
    );
    fold.apply(Event::Apply(policy("Hibernate", "Quarantine")), &read);
    assert_eq!(fold.skipped.len(), 1);
    let (_, kept) = fold.items().next().unwrap();
    assert_eq!(
        kept.spec.admission.as_ref().unwrap().mode,
        crate::api::policy::AdmissionMode::Enforce
    );
}

#[test]
fn pods_claims_and_nodes_are_kept_as_the_gate_needs_them() {
    let r = GpuResources::default();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "a", "labels": {"app": "x"},
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": true}]},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Running"}});
    let entry = read_pod(&pod, &r).unwrap().unwrap();
    assert_eq!(entry.gpus, 4.0, "a controller's pod still holds its GPUs");
    assert!(!entry.finished);
    let cpu = json!({"metadata": {"name": "c", "namespace": "a"}, "spec": {"containers": [{"name": "c"}]}});
    assert_eq!(read_pod(&cpu, &r).unwrap(), None);
    let node = json!({"status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}}});
    assert!(node_has_gpus(&node, &r));
    let no = json!({"status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "0"}}});
    assert!(!node_has_gpus(&no, &r));
    let deployment = json!({"metadata": {"name": "d", "namespace": "a"},
        "spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}});
    let s = read_scalable(&deployment, "apps/v1", "Deployment", &r)
        .unwrap()
        .unwrap();
    assert_eq!(s.per_replica, 8.0);
}

#[test]
fn a_claim_holds_its_gpus_while_its_devices_are_allocated_whatever_became_of_its_pod() {
    let r = GpuResources::default();
    let pod = |phase: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "a", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "eight"}]},
            "status": {"phase": phase}})
    };
    let claim = |allocated: bool| {
        let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "p-gpu", "namespace": "a",
                "ownerReferences": [{"kind": "Pod", "name": "p", "controller": true}]},
            "spec": {"devices": {"requests": [{"name": "g",
                "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]}}});
        if allocated {
            c["status"] = json!({"allocation": {"devices": {"results": [
                {"request": "g", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]}}});
        }
        c
    };
    let held = |phase: &str, allocated: bool| {
        let mut folds = Folds {
            policies: Fold::new(true),
            attestations: Fold::new(false),
            namespaces: Fold::new(false),
            templates: None,
            claims: Some(Fold::new(false)),
            pods: Fold::new(false),
            scalable: HashMap::new(),
            nodes: None,
        };
        let key = ("a".to_string(), "p".to_string());
        folds
            .pods
            .items
            .insert(key, read_pod(&pod(phase), &r).unwrap().unwrap());
        folds.claims.as_mut().unwrap().items.insert(
            ("a".to_string(), "p-gpu".to_string()),
            read_claim(&claim(allocated), &r).unwrap().unwrap(),
        );
        build(&folds).held_gpus("a")
    };
    assert_eq!(held("Running", false), 8.0, "reserved for a running pod");
    assert_eq!(held("Running", true), 8.0);
    // The pod finished, but the devices are still allocated to its claim: still held.
    assert_eq!(held("Succeeded", true), 8.0);
    assert_eq!(held("Failed", true), 8.0);
    // Deallocated after the pod finished: free.
    assert_eq!(held("Succeeded", false), 0.0);
}
