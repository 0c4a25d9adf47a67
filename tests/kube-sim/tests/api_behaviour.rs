//! kube-sim's API behaviour where a scenario cannot run on a real cluster unchanged
//! (compaction, injected faults, seeded status) or where raw HTTP is needed (bad
//! bodies): error Status objects, 410 Gone, bookmarks, eviction and PDBs, garbage
//! collection, CRD subresources, selectors and fault injection.

mod common;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams,
    Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_sim::{Fault, KubeSim, Options};
use serde_json::{Value, json};

use common::{SAFETY, crd};

async fn sim() -> (KubeSim, Client) {
    let sim = KubeSim::start_with(Options {
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    })
    .await
    .expect("kube-sim starts");
    // Without kube-client's default retries, so 429s and 504s are seen as answered.
    let mut config = sim.config().await.expect("config");
    config.default_retry = false;
    let client = Client::try_from(config).expect("client");
    (sim, client)
}

/// A raw request; returns status code, parsed JSON body (Null if not JSON) and headers.
async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    accept: &str,
    body: &[u8],
) -> (u16, Value, http::HeaderMap) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, accept)
        .body(kube::client::Body::from(body.to_vec()))
        .unwrap();
    let response = tokio::time::timeout(SAFETY, client.send(request))
        .await
        .expect("answered in time")
        .expect("sent");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect_bytes().await.expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

fn assert_status(body: &Value, code: u16, reason: &str) {
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["status"], "Failure", "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
}

fn running_pod(name: &str, node: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "train"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    })
}

#[tokio::test]
async fn a_malformed_json_body_is_a_400_bad_request_status() {
    let (_sim, client) = sim().await;
    let (code, body, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        "application/json",
        b"{not json",
    )
    .await;
    assert_eq!(code, 400);
    assert_status(&body, 400, "BadRequest");
    let (code, body, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        "application/json",
        b"[1,2]",
    )
    .await;
    assert_eq!(code, 400);
    assert_status(&body, 400, "BadRequest");
}

#[tokio::test]
async fn an_unknown_resource_or_group_is_a_404_status() {
    let (_sim, client) = sim().await;
    for path in [
        "/api/v1/namespaces/default/widgets",
        "/apis/nope.example.com/v1/things",
        "/apis/apps/v9/deployments",
        "/nothing/here",
    ] {
        let (code, body, _) = raw(&client, "GET", path, "", "application/json", b"").await;
        assert_eq!(code, 404, "{path}");
        assert_status(&body, 404, "NotFound");
    }
}

#[tokio::test]
async fn a_body_of_another_kind_is_400_and_a_bad_name_is_422_invalid() {
    let (_sim, client) = sim().await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
    let (code, body, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        "application/json",
        secret.to_string().as_bytes(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    let bad = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_Valid"}});
    let (code, body, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        "application/json",
        bad.to_string().as_bytes(),
    )
    .await;
    assert_eq!(code, 422);
    assert_status(&body, 422, "Invalid");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.name");
}

#[tokio::test]
async fn creating_in_a_missing_namespace_is_404_for_the_namespace() {
    let (_sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "nowhere");
    let err = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, "namespaces \"nowhere\" not found");
}

#[tokio::test]
async fn protobuf_bodies_are_415_unsupported_media_type() {
    let (_sim, client) = sim().await;
    let (code, body, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/vnd.kubernetes.protobuf",
        "application/json",
        b"k8s\0",
    )
    .await;
    assert_eq!(code, 415);
    assert_status(&body, 415, "UnsupportedMediaType");
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_gone() {
    let (sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let old_rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "later"}}))
        .unwrap();
    sim.compact();
    let mut stream = cms
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(SAFETY, stream.try_next())
        .await
        .expect("event in time")
        .unwrap()
        .expect("an event");
    let WatchEvent::Error(status) = event else {
        panic!("expected an ERROR event, got {event:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    assert!(
        status.message.starts_with("too old resource version"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn a_short_history_window_expires_old_resource_versions() {
    let (sim, client) = sim().await;
    sim.set_history_limit(2);
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let old_rv = sim.resource_version().to_string();
    for i in 0..3 {
        sim.seed(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}")}}),
        )
        .unwrap();
    }
    let mut stream = cms
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(SAFETY, stream.try_next())
        .await
        .expect("in time")
        .unwrap()
        .unwrap();
    assert!(
        matches!(event, WatchEvent::Error(ref s) if s.code == 410),
        "{event:?}"
    );
    // A version still in the window resumes normally.
    let recent = (sim.resource_version() - 1).to_string();
    let mut stream = cms
        .watch(&WatchParams::default(), &recent)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(SAFETY, stream.try_next())
        .await
        .expect("in time")
        .unwrap()
        .unwrap();
    assert!(
        matches!(event, WatchEvent::Added(ref c) if c.metadata.name.as_deref() == Some("c2")),
        "{event:?}"
    );
}

#[tokio::test]
async fn a_continue_token_from_before_compaction_is_410() {
    let (sim, client) = sim().await;
    for i in 0..3 {
        sim.seed(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}")}}),
        )
        .unwrap();
    }
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = cms.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.expect("more pages");
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c9"}}))
        .unwrap();
    sim.compact();
    let err = cms
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 410);
}

#[tokio::test]
async fn watches_that_allow_bookmarks_receive_them() {
    let (_sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(SAFETY, stream.try_next())
        .await
        .expect("bookmark in time")
        .unwrap()
        .unwrap();
    let WatchEvent::Bookmark(bookmark) = event else {
        panic!("expected a bookmark, got {event:?}")
    };
    assert!(
        bookmark.metadata.resource_version.parse::<u64>().unwrap() >= rv.parse::<u64>().unwrap()
    );
}

#[tokio::test]
async fn a_watch_ends_after_its_timeout_seconds() {
    let (_sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let stream = cms
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), &rv)
        .await
        .unwrap();
    let events: Vec<_> = tokio::time::timeout(SAFETY, stream.collect())
        .await
        .expect("the watch ended");
    assert!(events.is_empty(), "{events:?}");
}

#[tokio::test]
async fn metadata_only_lists_and_gets_use_partial_object_metadata() {
    let (sim, client) = sim().await;
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "data": {"secret": "x"}})).unwrap();
    let accept =
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let (code, body, _) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        "",
        accept,
        b"",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(body["kind"], "PartialObjectMetadataList");
    assert_eq!(body["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(body["items"][0]["metadata"]["name"], "m");
    assert!(body["items"][0].get("data").is_none());
}

#[tokio::test]
async fn field_selectors_match_node_name_and_phase_and_reject_unknown_fields() {
    let (sim, client) = sim().await;
    sim.seed(running_pod("on-a", "node-a", true)).unwrap();
    sim.seed(running_pod("on-b", "node-b", true)).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let names = |list: kube::core::ObjectList<Pod>| {
        list.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("spec.nodeName=node-a"))
                .await
                .unwrap()
        ),
        ["on-a"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("status.phase=Running,spec.nodeName!=node-a"))
                .await
                .unwrap()
        ),
        ["on-b"]
    );
    let err = pods
        .list(&ListParams::default().fields("spec.gpus=8"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400 && s.message.contains("field label not supported")),
        "{err}"
    );
}

fn pdb(min_available: Value) -> Value {
    json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "train-pdb", "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "train"}}},
    })
}

#[tokio::test]
async fn eviction_is_refused_with_429_when_a_pdb_would_be_violated() {
    let (sim, client) = sim().await;
    sim.seed(running_pod("p1", "n", true)).unwrap();
    sim.seed(running_pod("p2", "n", true)).unwrap();
    sim.seed(pdb(json!(2))).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let err = pods.evict("p1", &EvictParams::default()).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(
        (status.code, status.reason.as_str()),
        (429, "TooManyRequests")
    );
    assert_eq!(
        status.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = status.details.unwrap().causes[0].message.clone();
    assert_eq!(
        cause,
        "The disruption budget train-pdb needs 2 healthy pods and has 2 currently"
    );
    assert!(sim.get("", "pods", "default", "p1").is_some());
}

#[tokio::test]
async fn eviction_deletes_the_pod_when_the_budget_allows_it() {
    let (sim, client) = sim().await;
    sim.seed(running_pod("p1", "n", true)).unwrap();
    sim.seed(running_pod("p2", "n", true)).unwrap();
    sim.seed(pdb(json!("50%"))).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.evict("p1", &EvictParams::default()).await.unwrap();
    assert!(sim.get("", "pods", "default", "p1").is_none());
    // An unready pod can always be evicted; it does not count as healthy.
    sim.seed(running_pod("p3", "n", false)).unwrap();
    pods.evict("p3", &EvictParams::default()).await.unwrap();
    let err = pods.evict("p2", &EvictParams::default()).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 429),
        "{err}"
    );
}

fn owned_config_map(name: &str, owner: &Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
        }]},
    })
}

#[tokio::test]
async fn background_deletion_collects_dependents_and_orphan_deletion_keeps_them() {
    let (sim, client) = sim().await;
    let owner = sim
        .seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}))
        .unwrap();
    sim.seed(owned_config_map("child", &owner)).unwrap();
    sim.seed(owned_config_map(
        "grandchild",
        &sim.get("", "configmaps", "default", "child").unwrap(),
    ))
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    assert!(sim.get("", "configmaps", "default", "child").is_none());
    assert!(sim.get("", "configmaps", "default", "grandchild").is_none());

    let owner = sim
        .seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner2"}}))
        .unwrap();
    sim.seed(owned_config_map("kept", &owner)).unwrap();
    cms.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    let kept = sim
        .get("", "configmaps", "default", "kept")
        .expect("orphan kept");
    assert!(
        kept["metadata"]["ownerReferences"]
            .as_array()
            .is_none_or(|r| r.is_empty()),
        "{kept}"
    );
}

#[tokio::test]
async fn deleting_a_namespace_deletes_what_is_in_it() {
    let (sim, client) = sim().await;
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "doomed"}})).unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    assert!(sim.get("", "configmaps", "doomed", "c").is_none());
    assert!(sim.get("", "namespaces", "", "doomed").is_none());
}

#[tokio::test]
async fn a_crd_scale_subresource_maps_its_replica_paths_and_status_is_separate() {
    let (sim, client) = sim().await;
    let mut definition = crd("ray.io", "v1", "RayCluster", "rayclusters", true);
    definition["spec"]["versions"][0]["subresources"]["scale"] = json!({
        "specReplicasPath": ".spec.workerGroup.replicas", "statusReplicasPath": ".status.readyWorkers",
    });
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    let created = crds
        .create(
            &PostParams::default(),
            &serde_json::from_value(definition).unwrap(),
        )
        .await
        .unwrap();
    let established = created.status.unwrap().conditions.unwrap();
    assert!(
        established
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );

    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ray.io", "v1", "RayCluster"),
        "rayclusters",
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
        "spec": {"workerGroup": {"replicas": 2}}, "status": {"readyWorkers": 9},
    }))
    .unwrap();
    let created = clusters
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create: {:?}",
        created.data
    );
    clusters
        .patch_status(
            "rc",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"readyWorkers": 1}, "spec": {"workerGroup": {"replicas": 7}}}),
            ),
        )
        .await
        .unwrap();
    let scale = clusters.get_scale("rc").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().replicas, 1);
    clusters
        .patch_scale(
            "rc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    let stored = sim.get("ray.io", "rayclusters", "default", "rc").unwrap();
    assert_eq!(stored["spec"]["workerGroup"]["replicas"], 5);
    assert_eq!(stored["metadata"]["generation"], 2);
}

#[tokio::test]
async fn a_strategic_merge_patch_merges_containers_by_name() {
    let (sim, client) = sim().await;
    sim.seed(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let patched = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "b", "image": "b:2"}]}})),
        )
        .await
        .unwrap();
    let images: Vec<String> = patched
        .spec
        .unwrap()
        .containers
        .into_iter()
        .filter_map(|c| c.image)
        .collect();
    assert_eq!(images, ["a:1", "b:2"]);
}

#[tokio::test]
async fn forced_status_codes_reach_the_client_with_their_reasons() {
    let (sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (code, reason) in [
        (429, "TooManyRequests"),
        (500, "InternalError"),
        (504, "Timeout"),
        (409, "Conflict"),
    ] {
        sim.clear_faults();
        sim.add_fault(
            Fault::on("/api/v1/namespaces/default/configmaps")
                .method("GET")
                .status(code)
                .times(1),
        );
        let (got, body, headers) = raw(
            &client,
            "GET",
            "/api/v1/namespaces/default/configmaps",
            "",
            "application/json",
            b"",
        )
        .await;
        assert_eq!(got, code);
        assert_status(&body, code, reason);
        if code == 429 {
            assert_eq!(headers.get(http::header::RETRY_AFTER).unwrap(), "1");
        }
        // `times(1)`: the next request is served.
        cms.list(&ListParams::default()).await.unwrap();
    }
}

#[tokio::test]
async fn an_error_rate_fault_hits_one_request_in_n() {
    let (sim, client) = sim().await;
    sim.add_fault(
        Fault::on("/api/v1/namespaces/default/configmaps")
            .status(500)
            .every_nth(3),
    );
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut failures = 0;
    for _ in 0..9 {
        if cms.list(&ListParams::default()).await.is_err() {
            failures += 1;
        }
    }
    assert_eq!(failures, 3);
    assert_eq!(sim.fault_hits(), [3]);
}

#[tokio::test]
async fn a_latency_fault_delays_requests_but_still_serves_them() {
    let (sim, client) = sim().await;
    sim.add_fault(
        Fault::on("/api/v1/namespaces/default/configmaps").latency(Duration::from_millis(50)),
    );
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(sim.fault_hits(), [1]);
}

#[tokio::test]
async fn dropping_watches_breaks_open_watch_streams() {
    let (sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    sim.drop_watches();
    let end = tokio::time::timeout(SAFETY, stream.next())
        .await
        .expect("the stream ended in time");
    assert!(matches!(end, None | Some(Err(_))), "{end:?}");
}

#[tokio::test]
async fn a_label_selected_watch_sees_objects_move_in_and_out_of_its_selector() {
    let (sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(
            &WatchParams::default().labels("gpu=yes").disable_bookmarks(),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"gpu": "no"}}})).unwrap();
    for value in ["yes", "no"] {
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"gpu": value}}})),
        )
        .await
        .unwrap();
    }
    let mut next = async || {
        tokio::time::timeout(SAFETY, stream.try_next())
            .await
            .expect("in time")
            .unwrap()
            .unwrap()
    };
    assert!(
        matches!(next().await, WatchEvent::Added(ref c) if c.metadata.labels.as_ref().unwrap()["gpu"] == "yes")
    );
    assert!(
        matches!(next().await, WatchEvent::Deleted(ref c) if c.metadata.labels.as_ref().unwrap()["gpu"] == "yes")
    );
}

#[tokio::test]
async fn badly_shaped_bodies_and_patches_get_4xx_statuses_and_never_break_the_server() {
    let (sim, client) = sim().await;
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}))
        .unwrap();
    let collection = "/api/v1/namespaces/default/configmaps";
    let item = "/api/v1/namespaces/default/configmaps/c";
    let bodies = [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": "c"}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": 7}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": "x"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": 1}}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": {"a": "b"}}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "ownerReferences": "x"}}),
        json!({"apiVersion": 1, "kind": ["ConfigMap"], "metadata": {"name": "c"}}),
    ];
    for body in &bodies {
        let bytes = body.to_string();
        for (method, path, content_type) in [
            ("POST", collection, "application/json"),
            ("PUT", item, "application/json"),
            ("PATCH", item, "application/merge-patch+json"),
            ("PATCH", item, "application/strategic-merge-patch+json"),
            (
                "PATCH",
                "/api/v1/namespaces/default/configmaps/c?fieldManager=t",
                "application/apply-patch+yaml",
            ),
        ] {
            let (code, answer, _) = raw(
                &client,
                method,
                path,
                content_type,
                "application/json",
                bytes.as_bytes(),
            )
            .await;
            assert!(
                (400..500).contains(&code),
                "{method} {path} {content_type} {body} -> {code} {answer}"
            );
            assert_eq!(answer["kind"], "Status", "{answer}");
        }
    }
    for patch in [
        json!([{"op": "replace", "path": "", "value": 5}]),
        json!([{"op": "explode"}]),
        json!({"not": "a list"}),
        json!([{"op": "add", "path": "/metadata", "value": "x"}]),
    ] {
        let (code, answer, _) = raw(
            &client,
            "PATCH",
            item,
            "application/json-patch+json",
            "application/json",
            patch.to_string().as_bytes(),
        )
        .await;
        assert!((400..500).contains(&code), "{patch} -> {code} {answer}");
    }
    let (code, _, _) = raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c?fieldManager=t",
        "application/apply-patch+yaml",
        "application/json",
        b"a: [unclosed",
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(b",
        "",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=-x",
        "",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps?continue=%%%",
        "",
        "application/json",
        b"",
    )
    .await;
    assert_eq!(code, 400);
    // Still serving, and the object is untouched.
    let stored = sim.get("", "configmaps", "default", "c").unwrap();
    assert_eq!(stored["metadata"]["name"], "c");
    let (code, _, _) = raw(&client, "GET", item, "", "application/json", b"").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn delete_collection_deletes_what_the_selector_matches() {
    let (sim, client) = sim().await;
    for (name, gpu) in [("a", "yes"), ("b", "yes"), ("c", "no")] {
        sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"gpu": gpu}}})).unwrap();
    }
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let dry = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    cms.delete_collection(&dry, &ListParams::default().labels("gpu=yes"))
        .await
        .unwrap();
    assert_eq!(sim.list("", "configmaps", Some("default")).len(), 3);
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("gpu=yes"),
    )
    .await
    .unwrap();
    let left: Vec<Value> = sim.list("", "configmaps", Some("default"));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["metadata"]["name"], "c");
}

#[tokio::test]
async fn foreground_deletion_waits_for_a_dependent_held_by_a_finalizer() {
    let (sim, client) = sim().await;
    let owner = sim
        .seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}))
        .unwrap();
    let mut held = owned_config_map("held", &owner);
    held["metadata"]["finalizers"] = json!(["gpu-reaper.test/hold"]);
    sim.seed(held).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    let waiting = sim
        .get("", "configmaps", "default", "owner")
        .expect("owner waits");
    assert!(waiting["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        waiting["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
    assert!(
        sim.get("", "configmaps", "default", "held").unwrap()["metadata"]["deletionTimestamp"]
            .is_string()
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(sim.get("", "configmaps", "default", "held").is_none());
    assert!(
        sim.get("", "configmaps", "default", "owner").is_none(),
        "the owner goes with its last dependent"
    );
}

#[tokio::test]
async fn server_side_apply_to_the_status_subresource_changes_only_status() {
    let (sim, client) = sim().await;
    sim.seed(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
        .unwrap();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client, "default");
    let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 9}, "status": {"readyReplicas": 1, "replicas": 1}});
    let out = deployments
        .patch_status(
            "d",
            &PatchParams::apply("status-writer"),
            &Patch::Apply(&applied),
        )
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().ready_replicas, Some(1));
    assert_eq!(out.spec.unwrap().replicas, Some(1));
    let entry = out
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("status-writer"))
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    assert_eq!(entry.operation.as_deref(), Some("Apply"));
}

fn gpu_policy_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "budgets.test.gpu-reaper.io"},
        "spec": {"group": "test.gpu-reaper.io", "scope": "Namespaced",
            "names": {"kind": "Budget", "plural": "budgets", "singular": "budget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["gpus"],
                        "x-kubernetes-validations": [
                            {"rule": "self.gpus <= self.limit", "message": "gpus must not exceed limit"},
                            {"rule": "!has(oldSelf.limit) || self.limit >= oldSelf.limit", "message": "limit may only grow"},
                        ],
                        "properties": {
                            "gpus": {"type": "integer", "minimum": 0},
                            "limit": {"type": "integer", "default": 8},
                            "mode": {"type": "string", "enum": ["Audit", "Enforce"]},
                        }},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }}},
            }]},
    })
}

#[tokio::test]
async fn crd_schemas_default_prune_and_validate_custom_objects_with_cel() {
    let (sim, client) = sim().await;
    sim.seed(gpu_policy_crd()).unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.gpu-reaper.io", "v1", "Budget"),
        "budgets",
    );
    let budgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let object = |spec: Value| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "test.gpu-reaper.io/v1", "kind": "Budget", "metadata": {"name": "b"}, "spec": spec})).unwrap()
    };
    // Defaults and pruning; the pruned field comes back as a warning (fieldValidation=Warn).
    let body = json!({"apiVersion": "test.gpu-reaper.io/v1", "kind": "Budget", "metadata": {"name": "b"}, "spec": {"gpus": 2, "colour": "red"}});
    let (code, created, headers) = raw(
        &client,
        "POST",
        "/apis/test.gpu-reaper.io/v1/namespaces/default/budgets",
        "application/json",
        "application/json",
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"], json!({"gpus": 2, "limit": 8}));
    assert_eq!(
        headers.get(http::header::WARNING).unwrap(),
        "299 - \"unknown field \\\"spec.colour\\\"\""
    );
    // Strict field validation refuses the unknown field instead.
    let (code, answer, _) = raw(&client, "POST", "/apis/test.gpu-reaper.io/v1/namespaces/default/budgets?fieldValidation=Strict", "application/json", "application/json",
        json!({"apiVersion": "test.gpu-reaper.io/v1", "kind": "Budget", "metadata": {"name": "s"}, "spec": {"gpus": 1, "colour": "red"}}).to_string().as_bytes()).await;
    assert_eq!(code, 400);
    assert_eq!(
        answer["message"],
        "strict decoding error: unknown field \"spec.colour\""
    );
    // Structural and CEL failures are 422 Invalid.
    let invalid = |err: kube::Error| match err {
        kube::Error::Api(s) if s.code == 422 && s.reason == "Invalid" => s.message,
        other => panic!("expected 422 Invalid, got {other}"),
    };
    let msg = invalid(
        budgets
            .create(
                &PostParams::default(),
                &object(json!({"gpus": -1, "mode": "Sometimes"})),
            )
            .await
            .unwrap_err(),
    );
    assert!(
        msg.starts_with("Budget.test.gpu-reaper.io \"b\" is invalid: ["),
        "{msg}"
    );
    assert!(
        msg.contains(
            "spec.gpus: Invalid value: -1: spec.gpus in body should be greater than or equal to 0"
        ),
        "{msg}"
    );
    assert!(
        msg.contains(
            "spec.mode: Unsupported value: \"Sometimes\": supported values: \"Audit\", \"Enforce\""
        ),
        "{msg}"
    );
    let msg = invalid(
        budgets
            .patch(
                "b",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"gpus": 9}})),
            )
            .await
            .unwrap_err(),
    );
    assert!(msg.contains("gpus must not exceed limit"), "{msg}");
    // A transition rule sees the old object.
    let msg = invalid(
        budgets
            .patch(
                "b",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"gpus": 1, "limit": 4}})),
            )
            .await
            .unwrap_err(),
    );
    assert!(msg.contains("limit may only grow"), "{msg}");
    budgets
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"limit": 16, "gpus": 12}})),
        )
        .await
        .unwrap();
    assert_eq!(
        sim.get("test.gpu-reaper.io", "budgets", "default", "b")
            .unwrap()["spec"]["gpus"],
        12
    );
}

#[tokio::test]
async fn wait_for_returns_when_a_write_makes_the_condition_true() {
    let (sim, client) = sim().await;
    sim.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"state": "busy"}})).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let writer = tokio::spawn(async move {
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"state": "idle"}})),
        )
        .await
        .unwrap();
        cms.delete("c", &DeleteParams::default()).await.unwrap();
    });
    let idle = sim
        .wait_for(("", "configmaps"), "default", "c", SAFETY, |o| {
            o.is_some_and(|o| o["data"]["state"] == "idle")
        })
        .await
        .expect("became idle");
    assert_eq!(idle["data"]["state"], "idle");
    let gone = sim
        .wait_for(("", "configmaps"), "default", "c", SAFETY, |o| o.is_none())
        .await;
    assert_eq!(gone, Some(Value::Null));
    writer.await.unwrap();
    let never = sim
        .wait_for(
            ("", "configmaps"),
            "default",
            "c",
            Duration::from_millis(50),
            |o| o.is_some(),
        )
        .await;
    assert!(never.is_none());
}
