//! Validating admission webhooks called by kube-sim over HTTPS: what is sent
//! (AdmissionReview v1), which requests match (rules, namespaceSelector,
//! objectSelector), and what happens on denial, failure, timeout and a bad caBundle.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_sim::KubeSim;
use serde_json::{Value, json};

use common::{Webhook, pod_rules};

async fn sim() -> (KubeSim, kube::Client) {
    let sim = KubeSim::start().await.expect("kube-sim starts");
    let client = sim.client().await.expect("client");
    (sim, client)
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }))
    .unwrap()
}

fn api_error(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(status) => status,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn a_denial_returns_the_webhooks_code_and_message_and_stores_nothing() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(|_| json!({"allowed": false, "status": {"code": 403, "reason": "Forbidden", "message": "no GPUs today"}})).await;
    sim.seed(webhook.configuration("deny", pod_rules(), "Fail"))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let status = api_error(
        pods.create(&PostParams::default(), &pod("p", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 403);
    assert_eq!(status.reason, "Forbidden");
    assert_eq!(
        status.message,
        "admission webhook \"deny.gpu-reaper.test\" denied the request: no GPUs today"
    );
    assert!(sim.get("", "pods", "default", "p").is_none());
}

#[tokio::test]
async fn a_denial_without_a_code_is_400_and_without_a_message_says_so() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(|_| json!({"allowed": false})).await;
    sim.seed(webhook.configuration("mute", pod_rules(), "Fail"))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let status = api_error(
        pods.create(&PostParams::default(), &pod("p", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 400);
    assert_eq!(
        status.message,
        "admission webhook \"mute.gpu-reaper.test\" denied the request without explanation"
    );
}

#[tokio::test]
async fn the_review_carries_the_request_and_updates_carry_the_old_object() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(|_| json!({"allowed": true})).await;
    sim.seed(webhook.configuration("audit", pod_rules(), "Fail"))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("p", json!({"v": "1"})))
        .await
        .unwrap();
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &pod("dry", json!({})),
    )
    .await
    .unwrap();
    let reviews = webhook.requests();
    assert_eq!(reviews.len(), 3);
    let create = &reviews[0];
    assert_eq!(create["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(create["kind"], "AdmissionReview");
    let request = &create["request"];
    assert!(request["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(request["namespace"], "default");
    assert_eq!(request["name"], "p");
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(request["object"]["metadata"]["labels"]["v"], "1");
    assert!(request["oldObject"].is_null());
    assert_eq!(request["dryRun"], false);
    assert!(request["userInfo"]["username"].is_string());
    let update = &reviews[1]["request"];
    assert_eq!(update["operation"], "UPDATE");
    assert_eq!(update["oldObject"]["metadata"]["labels"]["v"], "1");
    assert_eq!(update["object"]["metadata"]["labels"]["v"], "2");
    assert_eq!(reviews[2]["request"]["dryRun"], true);
}

#[tokio::test]
async fn rules_namespace_selectors_and_object_selectors_decide_who_is_asked() {
    let (sim, client) = sim().await;
    let webhook =
        Webhook::start(|_| json!({"allowed": false, "status": {"message": "blocked"}})).await;
    let mut config = webhook.configuration("scoped", pod_rules(), "Fail");
    config["webhooks"][0]["namespaceSelector"] =
        json!({"matchLabels": {"gpu-reaper.test/guarded": "true"}});
    config["webhooks"][0]["objectSelector"] =
        json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]});
    sim.seed(config).unwrap();
    sim.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "guarded", "labels": {"gpu-reaper.test/guarded": "true"}}})).unwrap();
    let guarded: Api<Pod> = Api::namespaced(client.clone(), "guarded");
    let open: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Not a pod: no rule matches.
    let cms: Api<ConfigMap> = Api::namespaced(client, "guarded");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c", "labels": {"gpu": "1"}}}))
            .unwrap(),
    )
    .await
    .unwrap();
    // Namespace without the label: not asked.
    open.create(&PostParams::default(), &pod("a", json!({"gpu": "1"})))
        .await
        .unwrap();
    // Object without the label: not asked.
    guarded
        .create(&PostParams::default(), &pod("b", json!({})))
        .await
        .unwrap();
    assert!(webhook.requests().is_empty());
    // Both match: asked, and denied.
    let status = api_error(
        guarded
            .create(&PostParams::default(), &pod("c", json!({"gpu": "1"})))
            .await
            .unwrap_err(),
    );
    assert!(
        status.message.ends_with("denied the request: blocked"),
        "{}",
        status.message
    );
    assert_eq!(webhook.requests().len(), 1);
}

#[tokio::test]
async fn an_unreachable_webhook_fails_closed_with_fail_and_is_skipped_with_ignore() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(|_| json!({"allowed": true})).await;
    let mut config = webhook.configuration("gone", pod_rules(), "Fail");
    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    config["webhooks"][0]["clientConfig"]["url"] =
        json!(format!("https://127.0.0.1:{port}/validate"));
    sim.seed(config.clone()).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let status = api_error(
        pods.create(&PostParams::default(), &pod("p", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status.code, status.reason.as_str()),
        (500, "InternalError")
    );
    assert!(
        status
            .message
            .contains("failed calling webhook \"gone.gpu-reaper.test\""),
        "{}",
        status.message
    );

    let configs: Api<kube::api::DynamicObject> = Api::all_with(
        client,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingWebhookConfiguration",
            ),
            "validatingwebhookconfigurations",
        ),
    );
    configs
        .patch("gone", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}])).unwrap()))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("p", json!({})))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_webhook_slower_than_its_timeout_fails_the_request() {
    let (sim, client) = sim().await;
    let webhook =
        Webhook::start_with_delay(|_| json!({"allowed": true}), Duration::from_secs(3)).await;
    let mut config = webhook.configuration("slow", pod_rules(), "Fail");
    config["webhooks"][0]["timeoutSeconds"] = json!(1);
    sim.seed(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let status = api_error(
        pods.create(&PostParams::default(), &pod("p", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 500);
    assert!(
        status.message.contains("context deadline exceeded"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn a_webhook_whose_certificate_does_not_match_the_ca_bundle_fails() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(|_| json!({"allowed": true})).await;
    let other = kube_sim::tls::Pki::generate(&["localhost"]).unwrap();
    let mut config = webhook.configuration("untrusted", pod_rules(), "Fail");
    config["webhooks"][0]["clientConfig"]["caBundle"] = json!(other.ca_bundle());
    sim.seed(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let status = api_error(
        pods.create(&PostParams::default(), &pod("p", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 500);
    assert!(status.message.contains("certificate"), "{}", status.message);
    assert!(webhook.requests().is_empty());
}

#[tokio::test]
async fn delete_rules_see_the_old_object_and_a_service_reference_is_routed() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(|request| {
        let protected = request["oldObject"]["metadata"]["labels"]["protected"] == "true";
        json!({"allowed": !protected, "status": {"message": "protected"}})
    })
    .await;
    let mut config = webhook.configuration("deletes", json!([{"operations": ["DELETE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]), "Fail");
    config["webhooks"][0]["clientConfig"] = json!({
        "service": {"namespace": "gpu-reaper", "name": "webhook", "path": "/validate"},
        "caBundle": webhook.ca_bundle,
    });
    sim.route_service(
        "gpu-reaper",
        "webhook",
        webhook.url.trim_end_matches("/validate"),
    );
    sim.seed(config).unwrap();
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keep", "labels": {"protected": "true"}}})).unwrap();
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "drop"}}))
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let status = api_error(
        cms.delete("keep", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert!(
        status.message.ends_with("denied the request: protected"),
        "{}",
        status.message
    );
    cms.delete("drop", &DeleteParams::default()).await.unwrap();
    assert!(sim.get("", "configmaps", "default", "keep").is_some());
    assert!(sim.get("", "configmaps", "default", "drop").is_none());
    assert_eq!(webhook.requests()[0]["request"]["operation"], "DELETE");
}

#[tokio::test]
async fn match_conditions_written_in_cel_decide_whether_the_webhook_is_called() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(
        |_| json!({"allowed": false, "status": {"message": "GPU pods need an attestation"}}),
    )
    .await;
    let mut config = webhook.configuration("gpu-only", pod_rules(), "Fail");
    config["webhooks"][0]["matchConditions"] = json!([
        {"name": "asks-for-gpus", "expression": "object.spec.containers.exists(c, has(c.resources) && has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits)"},
        {"name": "not-dry-run", "expression": "!request.dryRun"},
    ]);
    sim.seed(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("cpu", json!({})))
        .await
        .unwrap();
    let mut gpu = pod("gpu", json!({}));
    gpu.spec.as_mut().unwrap().containers[0].resources =
        Some(serde_json::from_value(json!({"limits": {"nvidia.com/gpu": "1"}})).unwrap());
    pods.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &gpu,
    )
    .await
    .unwrap();
    assert!(
        webhook.requests().is_empty(),
        "neither request matched all conditions"
    );
    let status = api_error(pods.create(&PostParams::default(), &gpu).await.unwrap_err());
    assert!(
        status
            .message
            .ends_with("denied the request: GPU pods need an attestation"),
        "{}",
        status.message
    );
    assert_eq!(webhook.requests().len(), 1);
}

#[tokio::test]
async fn a_match_condition_that_cannot_be_evaluated_follows_the_failure_policy() {
    let (sim, client) = sim().await;
    let webhook = Webhook::start(|_| json!({"allowed": true})).await;
    let mut config = webhook.configuration("broken", pod_rules(), "Fail");
    config["webhooks"][0]["matchConditions"] =
        json!([{"name": "oops", "expression": "object.metadata.name +"}]);
    sim.seed(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let status = api_error(
        pods.create(&PostParams::default(), &pod("p", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 500);
    assert!(
        status.message.contains("matchCondition \"oops\""),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn the_review_parses_as_kube_core_admission_types() {
    use kube::api::DynamicObject;
    use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};

    let (sim, client) = sim().await;
    let webhook = Webhook::start(|_| json!({"allowed": true})).await;
    sim.seed(webhook.configuration("typed", pod_rules(), "Fail"))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("p", json!({"v": "1"})))
        .await
        .unwrap();
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await
    .unwrap();
    for (review, operation) in webhook
        .requests()
        .into_iter()
        .zip([Operation::Create, Operation::Update])
    {
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_value(review).expect("an AdmissionReview kube-core can read");
        let request: AdmissionRequest<DynamicObject> = review.try_into().expect("a request");
        assert_eq!(request.operation, operation);
        assert_eq!(request.name, "p");
        assert_eq!(request.namespace.as_deref(), Some("default"));
        assert_eq!(
            request
                .object
                .as_ref()
                .and_then(|o| o.metadata.name.as_deref()),
            Some("p")
        );
        assert_eq!(request.old_object.is_some(), operation == Operation::Update);
    }
}

#[tokio::test]
async fn a_denial_built_with_kube_core_reaches_the_client_as_kube_apiserver_words_it() {
    use kube::api::DynamicObject;
    use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

    let (sim, client) = sim().await;
    let webhook = Webhook::start(|request| {
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_value(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})).unwrap();
        let request: AdmissionRequest<DynamicObject> = review.try_into().unwrap();
        let mut response = AdmissionResponse::from(&request).deny("needs a ReadinessAttestation");
        response.warnings = Some(vec!["checked by gpu-reaper".into()]);
        serde_json::to_value(response.into_review()).unwrap()["response"].clone()
    })
    .await;
    sim.seed(webhook.configuration("typed", pod_rules(), "Fail"))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let status = api_error(
        pods.create(&PostParams::default(), &pod("p", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 400);
    assert_eq!(
        status.message,
        "admission webhook \"typed.gpu-reaper.test\" denied the request: needs a ReadinessAttestation"
    );
}
