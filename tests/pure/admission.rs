//! The budget gate's HTTP handler driven with `Router::oneshot` on real AdmissionReviews
//! (../shared/fixtures/admission) and GPU variants derived from them here, and on every real
//! GPU manifest in ../shared/fixtures/manifests. No network: the router is called directly.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpu_reaper::admission::metrics::Metrics;
use gpu_reaper::admission::server::{AppState, SnapshotCell, router};
use gpu_reaper::admission::{Settings, Snapshot};
use gpu_reaper::api::{GpuPolicy, ReadinessAttestation};
use gpu_reaper::gpus::{self, Counted, GpuResources};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// The public fixtures, beside the checkout (never copied into it).
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures");

/// A fixture as a full AdmissionReview (the `kubewarden-policies__*` files hold only the
/// request member).
fn review(file: &str) -> Value {
    let path = format!("{FIXTURES}/admission/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap();
    if v.get("request").is_some() {
        v
    } else {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v})
    }
}

fn all_reviews() -> Vec<(String, Value)> {
    let mut names: Vec<String> = std::fs::read_dir(format!("{FIXTURES}/admission"))
        .map_err(|e| format!("{FIXTURES}/admission: {e}"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    assert!(names.len() >= 12, "fixtures missing: {names:?}");
    names.into_iter().map(|n| (n.clone(), review(&n))).collect()
}

/// Derived variant: every container of the object's pod template asks for `gpus` GPUs.
fn with_gpus(mut review: Value, gpus: u32) -> Value {
    let object = &mut review["request"]["object"];
    let spec = match object["kind"].as_str().unwrap() {
        "Pod" => &mut object["spec"],
        "CronJob" => &mut object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &mut object["spec"]["template"]["spec"],
    };
    for c in spec["containers"].as_array_mut().unwrap() {
        c["resources"]["limits"]["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    review
}

fn policy(admission: Value) -> Arc<GpuPolicy> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "GpuPolicy",
            "metadata": {"name": "research"},
            "spec": {"admission": admission},
        }))
        .unwrap(),
    )
}

fn enforce() -> Arc<GpuPolicy> {
    policy(json!({"largeClaimGpus": 8, "mode": "Enforce"}))
}

/// An attestation in `default` selecting `app=llama`, approved for `approved` (None: not
/// approved) while its generation is `generation`.
fn attestation(
    max_gpus: u32,
    generation: i64,
    approved: Option<i64>,
    expires: &str,
    throughput: f64,
) -> Arc<ReadinessAttestation> {
    let status = approved.map(|g| {
        json!({
            "conditions": [{"type": "Approved", "status": "True", "reason": "Approved", "message": "ok",
                            "lastTransitionTime": "2026-11-01T00:00:00Z"}],
            "approvedBy": "platform-oncall",
            "approvedGeneration": g,
        })
    });
    let mut v = json!({
        "apiVersion": "gpureaper.io/v1alpha1",
        "kind": "ReadinessAttestation",
        "metadata": {"name": "llama", "namespace": "default", "generation": generation},
        "spec": {
            "selector": {"matchLabels": {"app": "llama"}},
            "maxGpus": max_gpus,
            "expiresAt": expires,
            "evidence": {"dataThroughputGBps": throughput},
        },
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    Arc::new(serde_json::from_value(v).unwrap())
}

fn snapshot(
    policies: Vec<Arc<GpuPolicy>>,
    attestations: Vec<Arc<ReadinessAttestation>>,
) -> Snapshot {
    Snapshot::build(
        policies,
        attestations,
        [("default".to_string(), BTreeMap::new())],
        Default::default(),
    )
}

fn app_with(cell: Arc<SnapshotCell>) -> (axum::Router, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let app = router(AppState {
        snapshot: cell,
        settings: Arc::new(Settings::default()),
        metrics: metrics.clone(),
    });
    (app, metrics)
}

fn app(snapshot: Snapshot) -> axum::Router {
    app_with(Arc::new(SnapshotCell::ready(snapshot))).0
}

fn super_app(snapshot: Snapshot) -> axum::Router {
    app(snapshot)
}

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

/// POSTs the review and returns its `response`.
async fn validate(app: &axum::Router, review: &Value) -> Value {
    let (status, body) = call(
        app,
        "POST",
        "/validate",
        serde_json::to_vec(review).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], review["request"]["uid"]);
    v["response"].clone()
}

/// The Job fixture made a 16-GPU claim labelled `app=llama`: parallelism 2 × 8 GPUs.
fn llama_job() -> Value {
    let mut r = with_gpus(
        review("kubewarden-policies__user-group-psp-policy__job_root_user.json"),
        8,
    );
    r["request"]["object"]["spec"]["parallelism"] = json!(2);
    r["request"]["object"]["metadata"]["labels"] = json!({"app": "llama"});
    r
}

const FUTURE: &str = "2030-01-01T00:00:00Z";

/// Except the pods that reach GPU devices without requesting them (here: privileged
/// containers), which a governed namespace refuses naming the route.
#[tokio::test]
async fn every_real_review_without_gpus_is_allowed_without_warnings() {
    let app = app(snapshot(vec![enforce()], vec![]));
    let mut reaching = Vec::new();
    for (name, review) in all_reviews() {
        let response = validate(&app, &review).await;
        let message = response["status"]["message"].as_str().unwrap_or_default();
        if message.contains("asks for GPU devices through securityContext.privileged") {
            assert_eq!(response["allowed"], false, "{name}: {response}");
            reaching.push(name);
            continue;
        }
        assert_eq!(response["allowed"], true, "{name}: {response}");
        assert!(response.get("warnings").is_none(), "{name}: {response}");
    }
    assert_eq!(
        reaching,
        ["kubewarden-policy-server__pod_with_privileged_containers.json"]
    );
}

#[tokio::test]
async fn a_16_gpu_job_without_attestation_is_denied_with_one_sentence_naming_the_next_step() {
    let app = app(snapshot(vec![enforce()], vec![]));
    let response = validate(&app, &llama_job()).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(
        response["status"]["message"],
        "Job default/pi claims 16 GPUs, more than the 8 GpuPolicy \"research\" admits without a ReadinessAttestation, and no ReadinessAttestation in namespace default selects its labels; create one that does (see docs/budget-gate.md) and ask an approver to run `gpu-reaper attest approve default/<name>`."
    );
}

#[tokio::test]
async fn each_real_workload_kind_is_counted_and_gated_when_it_claims_gpus() {
    // Deployment (replicas unset = 1), StatefulSet (3 replicas), Job, CronJob, Pod: 9 GPUs
    // per container makes every one of them a large claim.
    let app = app(snapshot(vec![enforce()], vec![]));
    for (file, gpus) in [
        (
            "kubewarden-policies__capabilities-psp-policy__req_pod_with_container_with_capabilities_added_for_deployment.json",
            "9",
        ),
        (
            "kubewarden-policies__user-group-psp-policy__statefulset_root_user.json",
            "27",
        ),
        (
            "kubewarden-policies__user-group-psp-policy__job_root_user.json",
            "9",
        ),
        // With concurrencyPolicy Forbid (the fixture's Allow is open-ended: a run per
        // schedule may pile up, tests/pure/gate_attacks.rs), one run.
        (
            "kubewarden-policies__user-group-psp-policy__cronjob_root_user.json",
            "9",
        ),
        // This pod has two containers: 2 × 9.
        (
            "kubewarden-policy-server__pod_without_privileged_containers.json",
            "18",
        ),
    ] {
        let mut r = with_gpus(review(file), 9);
        if r["request"]["object"]["kind"] == "CronJob" {
            r["request"]["object"]["spec"]["concurrencyPolicy"] = json!("Forbid");
        }
        let response = validate(&app, &r).await;
        assert_eq!(response["allowed"], false, "{file}: {response}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!(" claims {gpus} GPUs,")),
            "{file}: {message}"
        );
    }
    // The Deployment fixture with replicas 0 claims nothing until scaled.
    let zero = with_gpus(
        review(
            "kubewarden-policies__container-resources-policy__deployment_with_limits_admission_request.json",
        ),
        9,
    );
    assert_eq!(validate(&app, &zero).await["allowed"], true);
}

#[tokio::test]
async fn an_approved_attestation_that_covers_the_claim_admits_it() {
    let app = app(snapshot(
        vec![enforce()],
        vec![attestation(64, 2, Some(2), FUTURE, 40.0)],
    ));
    let response = validate(&app, &llama_job()).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none());
}

#[tokio::test]
async fn each_attestation_defect_is_named_in_the_denial() {
    let policy = policy(json!({"largeClaimGpus": 8, "mode": "Enforce",
                               "requireEvidence": {"minDataThroughputGBpsPerGpu": 0.5}}));
    let cases = [
        (
            attestation(64, 1, None, FUTURE, 40.0),
            "ReadinessAttestation default/llama is not approved; ask an approver to review it and run `gpu-reaper attest approve default/llama`.",
        ),
        (
            attestation(64, 2, Some(1), FUTURE, 40.0),
            "ReadinessAttestation default/llama was approved for generation 1 but its spec has changed since (generation 2); ask an approver to review the change and run `gpu-reaper attest approve default/llama` again.",
        ),
        (
            attestation(64, 1, Some(1), "2026-01-31T00:00:00Z", 40.0),
            "ReadinessAttestation default/llama expired on 2026-01-31 00:00 UTC;",
        ),
        (
            attestation(8, 1, Some(1), FUTURE, 40.0),
            "ReadinessAttestation default/llama covers 8 of the 16 GPUs; claim at most 8 GPUs, or raise spec.maxGpus",
        ),
        (
            attestation(64, 1, Some(1), FUTURE, 4.0),
            "ReadinessAttestation default/llama attests 0.25 GB/s of data throughput per GPU, below the 0.5 GB/s the policy requires; record a measured spec.evidence.dataThroughputGBps of at least 8.0",
        ),
    ];
    for (a, expected) in cases {
        let app = app(snapshot(vec![policy.clone()], vec![a]));
        let response = validate(&app, &llama_job()).await;
        assert_eq!(response["allowed"], false, "{response}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("Job default/pi claims 16 GPUs, more than the 8 GpuPolicy \"research\" admits without a ReadinessAttestation, and "),
            "{message}"
        );
        assert!(
            message.contains(expected),
            "expected {expected:?} in {message:?}"
        );
        assert!(
            message.ends_with('.') && message.matches(". ").count() == 0,
            "one sentence: {message}"
        );
    }
}

#[tokio::test]
async fn warn_mode_admits_with_the_same_sentence_as_a_kubectl_warning() {
    let app = app(snapshot(
        vec![policy(json!({"largeClaimGpus": 8, "mode": "Warn"}))],
        vec![],
    ));
    let response = validate(&app, &llama_job()).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("status").is_none());
    let warnings = response["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("Job default/pi claims 16 GPUs"),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn a_namespace_over_its_budget_gets_large_claims_denied_even_when_attested() {
    let mut p =
        (*policy(json!({"largeClaimGpus": 8, "mode": "Enforce", "monthlyBudgetUsd": 50000.0})))
            .clone();
    let month = jiff::Timestamp::now().strftime("%Y-%m").to_string();
    p.status = Some(
        serde_json::from_value(json!({
            "namespaceSpend": [{"namespace": "default", "month": month, "spentUsd": 51200.0}]
        }))
        .unwrap(),
    );
    let app = app(snapshot(
        vec![Arc::new(p.clone())],
        vec![attestation(64, 1, Some(1), FUTURE, 40.0)],
    ));
    let response = validate(&app, &llama_job()).await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "has used 51,200 of its 50,000 USD budget for {month}"
        )),
        "{message}"
    );
    // Over budget, the namespace gets no new GPUs, small claims neither (G3); last
    // month's figure does not count.
    let small = with_gpus(
        review("kubewarden-policies__user-group-psp-policy__job_root_user.json"),
        2,
    );
    assert_eq!(validate(&app, &small).await["allowed"], false);
    p.status.as_mut().unwrap().namespace_spend[0].month = "1999-01".into();
    let fresh = super_app(snapshot(
        vec![Arc::new(p)],
        vec![attestation(64, 1, Some(1), FUTURE, 40.0)],
    ));
    assert_eq!(validate(&fresh, &llama_job()).await["allowed"], true);
}

#[tokio::test]
async fn an_update_that_does_not_raise_the_gpu_count_is_allowed_and_one_that_does_is_gated() {
    let app = app(snapshot(vec![enforce()], vec![]));
    let mut r = with_gpus(review("kubewarden-policies__echo__update_accept.json"), 4);
    r["request"]["object"]["spec"]["replicas"] = json!(4);
    r["request"]["oldObject"] = r["request"]["object"].clone();
    r["request"]["oldObject"]["spec"]["replicas"] = json!(5);
    assert_eq!(
        validate(&app, &r).await["allowed"],
        true,
        "scaling 5 → 4 replicas of 4 GPUs"
    );
    r["request"]["oldObject"]["spec"]["replicas"] = json!(2);
    let response = validate(&app, &r).await;
    assert_eq!(response["allowed"], false, "2 → 4 replicas: 16 GPUs");
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("claims 16 GPUs")
    );
}

#[tokio::test]
async fn a_pod_created_by_a_controller_is_not_gated_twice() {
    let gate = app(snapshot(vec![enforce()], vec![]));
    let mut r = with_gpus(
        review("kubewarden-policy-server__pod_without_privileged_containers.json"),
        16,
    );
    assert_eq!(
        validate(&gate, &r).await["allowed"],
        false,
        "a bare pod is gated"
    );
    r["request"]["object"]["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": "pi", "uid": "u", "controller": true
    }]);
    // A person writing a controller reference by hand does not slip past the gate, nor
    // does a token of the namespace's own ServiceAccounts (a CI bot's), nor anonymous…
    assert_eq!(validate(&gate, &r).await["allowed"], false);
    let ns = r["request"]["namespace"].as_str().unwrap().to_string();
    for user in [
        format!("system:serviceaccount:{ns}:ci-bot"),
        "system:anonymous".to_string(),
    ] {
        r["request"]["userInfo"]["username"] = json!(user);
        assert_eq!(validate(&gate, &r).await["allowed"], false, "{user}");
    }
    // …nor any ServiceAccount of another namespace, which is not a listed controller
    // (G7: never a `system:` prefix)…
    r["request"]["userInfo"]["username"] = json!(format!("system:serviceaccount:{ns}x:op"));
    assert_eq!(validate(&gate, &r).await["allowed"], false);
    // …and the Job controller creating its pod is not asked for an attestation again, but
    // what the pod adds must fit the namespace's total: its 32 GPUs (two containers of 16)
    // where 8 may be held are refused, naming the Job…
    r["request"]["userInfo"]["username"] =
        json!("system:serviceaccount:kube-system:job-controller");
    let response = validate(&gate, &r).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(", which Job pi creates, claims 32 GPUs, but namespace"),
        "{message}"
    );
    // …and admitted once an approved attestation makes room, whatever it selects.
    let mut room = (*attestation(32, 1, Some(1), FUTURE, 40.0)).clone();
    room.metadata.namespace = Some(ns.clone());
    let mut s = Snapshot::build(
        vec![enforce()],
        vec![Arc::new(room)],
        [(ns.clone(), BTreeMap::new())],
        Default::default(),
    );
    s.held.clear();
    let roomy = app(s);
    assert_eq!(validate(&roomy, &r).await["allowed"], true);
}

#[tokio::test]
async fn namespaces_outside_the_policy_selector_are_not_gated() {
    let mut p = (*enforce()).clone();
    p.spec.match_.namespace_selector =
        Some(serde_json::from_value(json!({"matchLabels": {"gpu-tier": "research"}})).unwrap());
    let app = app(snapshot(vec![Arc::new(p)], vec![]));
    assert_eq!(validate(&app, &llama_job()).await["allowed"], true);
}

#[tokio::test]
async fn a_body_that_is_not_an_admission_review_gets_a_400_naming_the_problem() {
    let app = app(snapshot(vec![enforce()], vec![]));
    for (body, expected) in [
        (b"{\"apiVersion\":".to_vec(), "EOF while parsing"),
        (b"[]".to_vec(), "expected struct AdmissionReview"),
    ] {
        let (status, body) = call(&app, "POST", "/validate", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let text = String::from_utf8(body).unwrap();
        assert!(
            text.starts_with("not an admission.k8s.io/v1 AdmissionReview: "),
            "{text}"
        );
        assert!(text.contains(expected), "{text}");
    }
    // A review with a uid is answered, refused, naming the problem: a 400 would be turned
    // into an allow by failurePolicy Ignore.
    let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"kind":"Pod"},"operation":"PATCH"}}"#;
    let (status, body) = call(&app, "POST", "/validate", body.to_vec()).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["uid"], "u");
    assert_eq!(v["response"]["allowed"], false);
    let message = v["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("unknown variant `PATCH`"), "{message}");
}

#[tokio::test]
async fn before_the_caches_sync_readyz_fails_and_reviews_get_503_then_both_recover() {
    let cell = Arc::new(SnapshotCell::default());
    let (app, metrics) = app_with(cell.clone());
    assert_eq!(
        call(&app, "GET", "/healthz", vec![]).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, "GET", "/readyz", vec![]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let body = serde_json::to_vec(&llama_job()).unwrap();
    assert_eq!(
        call(&app, "POST", "/validate", body.clone()).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    cell.set(snapshot(vec![enforce()], vec![]));
    assert_eq!(call(&app, "GET", "/readyz", vec![]).await.0, StatusCode::OK);
    assert_eq!(
        call(&app, "POST", "/validate", body).await.0,
        StatusCode::OK
    );
    let text = metrics.encode();
    assert!(
        text.contains("gpu_reaper_admission_not_ready_requests_total 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "gpu_reaper_admission_decisions_total{verdict=\"deny\",reason=\"no_attestation\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("gpu_reaper_admission_duration_seconds_count 1"),
        "{text}"
    );
}

#[tokio::test]
async fn metrics_are_served_as_openmetrics_text() {
    let app = app(snapshot(vec![], vec![]));
    let (status, body) = call(&app, "GET", "/metrics", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("# TYPE gpu_reaper_admission_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("gpu_reaper_admission_malformed_requests_total 0"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"));
}

/// A write of the attestation `object`: the spec by its author alice (as the mutating
/// webhook records her), the status by the approver platform-oncall.
fn attestation_review(operation: &str, sub_resource: Option<&str>, mut object: Value) -> Value {
    object["metadata"]["annotations"] = json!({"gpureaper.io/spec-changed-by": "alice"});
    let user = if sub_resource.is_some() {
        "platform-oncall"
    } else {
        "alice"
    };
    let mut request = json!({
        "uid": "a1", "kind": {"group": "gpureaper.io", "version": "v1alpha1", "kind": "ReadinessAttestation"},
        "name": "llama", "namespace": "default", "operation": operation, "object": object,
        "userInfo": {"username": user},
    });
    if let Some(s) = sub_resource {
        request["subResource"] = json!(s);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

#[tokio::test]
async fn a_team_cannot_create_an_attestation_with_its_status_set() {
    let app = app(snapshot(vec![], vec![]));
    let approved =
        serde_json::to_value(attestation(64, 1, Some(1), FUTURE, 40.0).as_ref()).unwrap();
    let response = validate(&app, &attestation_review("CREATE", None, approved.clone())).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("status is written only by approvers")
    );
    let mut plain = approved;
    plain.as_object_mut().unwrap().remove("status");
    assert_eq!(
        validate(&app, &attestation_review("CREATE", None, plain.clone())).await["allowed"],
        true
    );
    plain["spec"]["expiresAt"] = json!("2020-01-01T00:00:00Z");
    let response = validate(&app, &attestation_review("CREATE", None, plain)).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.expiresAt 2020-01-01T00:00:00Z is in the past")
    );
}

#[tokio::test]
async fn an_approval_must_bind_to_the_current_generation_and_name_its_approver() {
    let app = app(snapshot(vec![], vec![]));
    let stale = serde_json::to_value(attestation(64, 3, Some(2), FUTURE, 40.0).as_ref()).unwrap();
    let response = validate(&app, &attestation_review("UPDATE", Some("status"), stale)).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("status.approvedGeneration 2 must equal metadata.generation 3")
    );
    let good = serde_json::to_value(attestation(64, 3, Some(3), FUTURE, 40.0).as_ref()).unwrap();
    assert_eq!(
        validate(
            &app,
            &attestation_review("UPDATE", Some("status"), good.clone())
        )
        .await["allowed"],
        true
    );
    let mut anonymous = good;
    anonymous["status"]["approvedBy"] = json!("");
    assert_eq!(
        validate(
            &app,
            &attestation_review("UPDATE", Some("status"), anonymous)
        )
        .await["allowed"],
        false
    );
}

#[tokio::test]
async fn an_attestation_with_an_empty_selector_is_admitted_with_a_warning() {
    let app = app(snapshot(vec![], vec![]));
    let mut a = serde_json::to_value(attestation(64, 1, None, FUTURE, 40.0).as_ref()).unwrap();
    a["spec"]["selector"] = json!({});
    let response = validate(&app, &attestation_review("CREATE", None, a)).await;
    assert_eq!(response["allowed"], true);
    assert!(
        response["warnings"][0]
            .as_str()
            .unwrap()
            .contains("covers every workload in namespace default")
    );
}

/// Every document of every real manifest, as a CREATE review.
fn manifest_reviews() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(format!("{FIXTURES}/manifests"))
        .map_err(|e| format!("{FIXTURES}/manifests: {e}"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    for name in names {
        let text = std::fs::read_to_string(format!("{FIXTURES}/manifests/{name}")).unwrap();
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let Ok(object) = <Value as serde::Deserialize>::deserialize(doc) else {
                continue;
            };
            let Some(kind) = object["kind"].as_str() else {
                continue;
            };
            let (group, version) = object["apiVersion"]
                .as_str()
                .unwrap_or("v1")
                .split_once('/')
                .unwrap_or(("", "v1"));
            let review = json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": format!("{name}#{i}"), "kind": {"group": group, "version": version, "kind": kind},
                    "name": object["metadata"]["name"].as_str().unwrap_or(""),
                    "namespace": object["metadata"]["namespace"].as_str().unwrap_or("default"),
                    "operation": "CREATE", "object": object.clone(),
                }
            });
            out.push((format!("{name}#{i}"), review));
        }
    }
    out
}

#[tokio::test]
async fn every_real_gpu_manifest_is_decided_by_its_counted_gpus() {
    // Threshold 1: every manifest that claims 2 GPUs or more is a large claim.
    let app = app(snapshot(
        vec![policy(json!({"largeClaimGpus": 1, "mode": "Enforce"}))],
        vec![],
    ));
    let reviews = manifest_reviews();
    let mut denied = 0;
    for (name, review) in &reviews {
        let object = &review["request"]["object"];
        let counted = gpus::count(object, "default", &GpuResources::default(), &());
        let response = validate(&app, review).await;
        match counted {
            // Templates with `{name}` placeholders are not objects the API server would
            // accept; the gate names the field it cannot read.
            Err(e) => {
                assert_eq!(response["allowed"], false, "{name}: {response}");
                let message = response["status"]["message"].as_str().unwrap();
                assert!(message.contains(&format!("cannot be checked by the GPU budget gate of GpuPolicy \"research\" because {e}")), "{name}: {message}");
            }
            Ok(Counted::Claim(claim)) if claim.gpus > 1.0 => {
                denied += 1;
                assert_eq!(response["allowed"], false, "{name}: {response}");
                let message = response["status"]["message"].as_str().unwrap();
                let gpus = gpu_reaper::admission::message::gpu_count(claim.gpus);
                assert!(
                    message.contains(&format!(" claims {gpus} GPUs,")),
                    "{name}: {message}"
                );
            }
            _ => assert_eq!(response["allowed"], true, "{name}: {response}"),
        }
    }
    assert!(reviews.len() >= 15, "manifests: {}", reviews.len());
    assert!(
        denied >= 5,
        "only {denied} large claims among the real manifests"
    );
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Walks to a nested member by index and replaces it: keeps most of the real shape.
    fn mutate(node: &mut Value, path: &[usize], replacement: Value) {
        match (path.split_first(), node) {
            (Some((&i, rest)), Value::Object(m)) if !m.is_empty() => {
                let key = m.keys().nth(i % m.len()).unwrap().clone();
                mutate(m.get_mut(&key).unwrap(), rest, replacement)
            }
            (Some((&i, rest)), Value::Array(a)) if !a.is_empty() => {
                let n = a.len();
                mutate(&mut a[i % n], rest, replacement)
            }
            (_, node) => *node = replacement,
        }
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z0-9./-]{0,12}".prop_map(Value::from),
            Just(json!({})),
            Just(json!([])),
            Just(json!("-1")),
            Just(json!("1e300")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

        /// Mutated real reviews (and GPU variants) never make the handler panic: the answer
        /// is a review for the same uid, or a 400.
        #[test]
        fn mutated_reviews_get_an_answer_never_a_panic(
            which in 0usize..32, path in proptest::collection::vec(0usize..16, 0..8), replacement in leaf()
        ) {
            let mut pool: Vec<Value> = all_reviews().into_iter().map(|(_, r)| r).collect();
            pool.push(llama_job());
            pool.extend(manifest_reviews().into_iter().map(|(_, r)| r));
            let mut review = pool[which % pool.len()].clone();
            mutate(&mut review, &path, replacement);
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let app = app(snapshot(vec![enforce()], vec![attestation(64, 1, Some(1), FUTURE, 40.0)]));
            let (status, body) = runtime.block_on(call(&app, "POST", "/validate", serde_json::to_vec(&review).unwrap()));
            prop_assert!(status == StatusCode::OK || status == StatusCode::BAD_REQUEST, "{status}");
            if status == StatusCode::OK {
                let v: Value = serde_json::from_slice(&body).unwrap();
                prop_assert!(v["response"]["allowed"].is_boolean());
            }
        }

        #[test]
        fn arbitrary_bytes_get_a_400_never_a_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let app = app(snapshot(vec![enforce()], vec![]));
            let (status, _) = runtime.block_on(call(&app, "POST", "/validate", body));
            prop_assert_eq!(status, StatusCode::BAD_REQUEST);
        }
    }
}
