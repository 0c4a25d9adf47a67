//! The decision on GPUs reached without asking for them (issue #33, item 5).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;

const NS: &str = "team-a";

fn now() -> Timestamp {
    "2026-11-10T12:00:00Z".parse().unwrap()
}

fn snapshot(mode: &str) -> Snapshot {
    let policy: GpuPolicy = serde_json::from_value(json!({
        "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
        "metadata": {"name": "research"},
        "spec": {"match": {"namespaceSelector": {"matchLabels": {"tier": "research"}}},
                 "admission": {"largeClaimGpus": 8, "mode": mode}},
    }))
    .unwrap();
    Snapshot::build(
        [Arc::new(policy)],
        [],
        [
            (
                NS.to_string(),
                BTreeMap::from([("tier".to_string(), "research".to_string())]),
            ),
            ("free".to_string(), BTreeMap::new()),
        ],
        Default::default(),
    )
}

fn request(operation: &str, ns: &str, object: Value, old: Option<Value>) -> AdmissionRequest {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    serde_json::from_value(json!({
        "uid": "u", "kind": {"group": group, "version": version, "kind": object["kind"]},
        "name": object["metadata"]["name"], "namespace": ns, "operation": operation,
        "userInfo": {"username": "alice"}, "object": object, "oldObject": old,
    }))
    .unwrap()
}

fn deployment(env: Value, gpus: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "x", "namespace": NS},
        "spec": {"replicas": 12, "template": {"spec": {"containers": [{"name": "main",
            "env": env, "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}}}})
}

fn all() -> Value {
    json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
}

fn decide(s: &Snapshot, r: &AdmissionRequest) -> Decision {
    admit(r, s, &Settings::default(), now())
}

#[test]
fn enforce_refuses_a_deployment_whose_pods_see_every_gpu_without_asking() {
    let d = decide(
        &snapshot("Enforce"),
        &request("CREATE", NS, deployment(all(), 0), None),
    );
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    assert_eq!(d.reason, Reason::UncountedDevices);
    assert_eq!(
        d.message.as_deref(),
        Some(
            "Deployment team-a/x asks for GPU devices through NVIDIA_VISIBLE_DEVICES=all in container \"main\" of its pods without requesting nvidia.com/gpu: request the GPUs as resources (limits: nvidia.com/gpu: N) so they are counted, or remove the variable; cluster admins should also set accept-nvidia-visible-devices-envvar-when-unprivileged = false in the NVIDIA container toolkit (docs/security.md)."
        )
    );
}

#[test]
fn warn_admits_it_with_the_sentence_as_a_warning() {
    let d = decide(
        &snapshot("Warn"),
        &request("CREATE", NS, deployment(all(), 0), None),
    );
    assert_eq!(d.verdict, Verdict::Warn, "{d:?}");
    assert_eq!(d.reason, Reason::UncountedDevices);
    assert!(d.all_warnings()[0].contains("NVIDIA_VISIBLE_DEVICES=all"));
}

#[test]
fn in_warn_mode_the_devices_do_not_hide_a_large_claim() {
    // 12 × 1 GPU is above the allowance: the claim's own warning stays first.
    let mut object = deployment(all(), 1);
    object["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "sidecar", "env": all()}));
    let d = decide(&snapshot("Warn"), &request("CREATE", NS, object, None));
    assert_eq!(d.verdict, Verdict::Warn, "{d:?}");
    assert_ne!(d.reason, Reason::UncountedDevices);
    assert!(
        d.warnings
            .iter()
            .any(|w| w.contains("container \"sidecar\"")),
        "{d:?}"
    );
}

#[test]
fn a_namespace_no_policy_governs_is_not_affected() {
    let mut object = deployment(all(), 0);
    object["metadata"]["namespace"] = json!("free");
    let d = decide(
        &snapshot("Enforce"),
        &request("CREATE", "free", object, None),
    );
    assert_eq!(d.verdict, Verdict::Allow, "{d:?}");
}

#[test]
fn a_container_that_asks_for_its_gpus_is_judged_as_a_claim() {
    let mut object = deployment(all(), 1);
    object["spec"]["replicas"] = json!(1);
    let d = decide(&snapshot("Enforce"), &request("CREATE", NS, object, None));
    assert_eq!(d.verdict, Verdict::Allow, "{d:?}");
    assert_eq!(d.reason, Reason::WithinLimit);
}

#[test]
fn an_update_refuses_only_the_devices_it_adds() {
    let s = snapshot("Enforce");
    let old = deployment(all(), 0);
    // A label edit (or the garbage collector's write) of what was there goes in…
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let d = decide(&s, &request("UPDATE", NS, relabelled, Some(old.clone())));
    assert!(d.allowed(), "{d:?}");
    // …removing the variable goes in…
    let d = decide(
        &s,
        &request("UPDATE", NS, deployment(json!([]), 0), Some(old.clone())),
    );
    assert!(d.allowed(), "{d:?}");
    // …adding it to a workload that had none is refused.
    let d = decide(
        &s,
        &request("UPDATE", NS, old, Some(deployment(json!([]), 0))),
    );
    assert_eq!(d.reason, Reason::UncountedDevices, "{d:?}");
}

#[test]
fn an_ephemeral_container_that_sets_the_variable_is_refused() {
    // `kubectl debug` writes the pods/ephemeralcontainers subresource with the whole pod.
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": NS},
        "spec": {"containers": [{"name": "main"}]}});
    let mut debugged = pod.clone();
    debugged["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "env": all()}]);
    let mut r = request("UPDATE", NS, debugged, Some(pod));
    r.sub_resource = Some("ephemeralcontainers".to_string());
    let d = decide(&snapshot("Enforce"), &r);
    assert_eq!(d.reason, Reason::UncountedDevices, "{d:?}");
    assert!(
        d.message
            .unwrap()
            .contains("in ephemeral container \"debugger\" without requesting")
    );
}

#[test]
fn a_privileged_container_is_told_to_ask_for_its_gpus_or_drop_privileged() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": NS},
        "spec": {"containers": [{"name": "main", "securityContext": {"privileged": true}}]}});
    let d = decide(&snapshot("Enforce"), &request("CREATE", NS, pod, None));
    assert_eq!(
        d.message.as_deref(),
        Some(
            "Pod team-a/p asks for GPU devices through securityContext.privileged in container \"main\" without requesting a GPU resource: request the GPUs as resources (limits: nvidia.com/gpu: N, or your GPUs' resource) so they are counted, or drop privileged; Pod Security's baseline level forbids privileged containers (docs/security.md)."
        )
    );
}
