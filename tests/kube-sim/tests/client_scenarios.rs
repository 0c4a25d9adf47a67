//! Scenarios written against `kube::Client` that run twice: against kube-sim, and
//! against a real cluster when `GPU_REAPER_E2E_KUBECONFIG` names a kubeconfig (kind,
//! k3d…). Without it the real-cluster half prints why and passes without running.
//! Each scenario works in its own fresh namespace and asserts only what a real
//! kube-apiserver guarantees.

mod common;

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::Client;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;

use common::SAFETY;

/// Where a scenario runs: a client and a namespace of its own.
struct Env {
    client: Client,
    ns: String,
}

fn status_code(error: &kube::Error) -> Option<(u16, String)> {
    match error {
        kube::Error::Api(status) => Some((status.code, status.reason.clone())),
        _ => None,
    }
}

async fn fresh_namespace(client: &Client, scenario: &str) -> String {
    let ns = format!(
        "ks-{}-{}",
        scenario
            .replace('_', "-")
            .chars()
            .take(40)
            .collect::<String>(),
        &uuid::Uuid::new_v4().to_string()[..6]
    );
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .expect("create namespace");
    ns
}

/// Generates, per scenario, a test against kube-sim and one against a real cluster.
macro_rules! scenario {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn against_kube_sim() {
                let sim = kube_sim::KubeSim::start().await.expect("kube-sim starts");
                let client = sim.client().await.expect("client");
                let ns = super::fresh_namespace(&client, stringify!($name)).await;
                tokio::time::timeout(super::SAFETY, super::$name(super::Env { client, ns }))
                    .await
                    .expect("scenario finished in time");
            }

            #[tokio::test]
            async fn against_a_real_cluster() {
                let Some(path) = std::env::var_os("GPU_REAPER_E2E_KUBECONFIG") else {
                    eprintln!(
                        "skipped {}: GPU_REAPER_E2E_KUBECONFIG is not set",
                        stringify!($name)
                    );
                    return;
                };
                let yaml = std::fs::read_to_string(&path).expect("read GPU_REAPER_E2E_KUBECONFIG");
                let client = kube_sim::client_from_kubeconfig_yaml(&yaml)
                    .await
                    .expect("client");
                let ns = super::fresh_namespace(&client, stringify!($name)).await;
                let result = tokio::time::timeout(
                    super::SAFETY,
                    super::$name(super::Env {
                        client: client.clone(),
                        ns: ns.clone(),
                    }),
                )
                .await;
                let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
                    kube::Api::all(client);
                let _ = namespaces.delete(&ns, &Default::default()).await;
                result.expect("scenario finished in time");
            }
        }
    };
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }))
    .unwrap()
}

scenario!(a_pod_is_created_read_listed_by_label_and_deleted);
async fn a_pod_is_created_read_listed_by_label_and_deleted(env: Env) {
    let pods: Api<Pod> = Api::namespaced(env.client, &env.ns);
    let created = pods
        .create(&PostParams::default(), &pod("a", json!({"gpu": "yes"})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b", json!({"gpu": "no"})))
        .await
        .unwrap();
    let read = pods.get("a").await.unwrap();
    assert_eq!(read.metadata.uid, created.metadata.uid);
    let listed = pods
        .list(&ListParams::default().labels("gpu=yes"))
        .await
        .unwrap();
    assert_eq!(
        listed
            .items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["a"]
    );
    let listed = pods
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    pods.delete("b", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let err = pods.get("b").await.unwrap_err();
    assert_eq!(status_code(&err), Some((404, "NotFound".into())));
}

scenario!(creating_an_existing_object_is_409_already_exists);
async fn creating_an_existing_object_is_409_already_exists(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    cms.create(&PostParams::default(), &config_map("c", &[("k", "v")]))
        .await
        .unwrap();
    let err = cms
        .create(&PostParams::default(), &config_map("c", &[("k", "v")]))
        .await
        .unwrap_err();
    assert_eq!(status_code(&err), Some((409, "AlreadyExists".into())));
}

scenario!(an_update_with_a_stale_resource_version_is_409_conflict);
async fn an_update_with_a_stale_resource_version_is_409_conflict(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    let first = cms
        .create(&PostParams::default(), &config_map("c", &[("k", "1")]))
        .await
        .unwrap();
    let mut newer = first.clone();
    newer.data = Some([("k".to_string(), "2".to_string())].into());
    cms.replace("c", &PostParams::default(), &newer)
        .await
        .unwrap();
    let mut stale = first;
    stale.data = Some([("k".to_string(), "3".to_string())].into());
    let err = cms
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(status_code(&err), Some((409, "Conflict".into())));
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["k"], "2");
}

scenario!(the_status_subresource_writes_only_status_and_the_main_endpoint_ignores_status);
async fn the_status_subresource_writes_only_status_and_the_main_endpoint_ignores_status(env: Env) {
    let services: Api<Service> = Api::namespaced(env.client, &env.ns);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let conditions = json!({"status": {"conditions": [{"type": "Probed", "status": "True", "reason": "Test", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    // Through the main endpoint, status is dropped.
    let patched = services
        .patch("s", &PatchParams::default(), &Patch::Merge(&conditions))
        .await
        .unwrap();
    assert!(
        patched
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .is_empty()
    );
    // Through /status, only status changes.
    let mut with_spec_change = conditions.clone();
    with_spec_change["spec"] = json!({"selector": {"app": "changed"}});
    let patched = services
        .patch_status(
            "s",
            &PatchParams::default(),
            &Patch::Merge(&with_spec_change),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.status.unwrap().conditions.unwrap()[0].type_,
        "Probed"
    );
    assert_eq!(patched.spec.unwrap().selector.unwrap()["app"], "x");
}

scenario!(generation_moves_on_spec_changes_only);
async fn generation_moves_on_spec_changes_only(env: Env) {
    let deployments: Api<Deployment> = Api::namespaced(env.client, &env.ns);
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"replicas": 0, "paused": true, "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}},
    }))
    .unwrap();
    let created = deployments
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let labelled = deployments
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    let changed = deployments
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minReadySeconds": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(changed.metadata.generation, Some(2));
}

scenario!(server_side_apply_reports_conflicts_and_force_takes_ownership);
async fn server_side_apply_reports_conflicts_and_force_takes_ownership(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    let applied = |value: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"owner": value}});
    cms.patch(
        "c",
        &PatchParams::apply("alpha"),
        &Patch::Apply(applied("alpha")),
    )
    .await
    .unwrap();
    // Re-applying the same config is a no-op success.
    cms.patch(
        "c",
        &PatchParams::apply("alpha"),
        &Patch::Apply(applied("alpha")),
    )
    .await
    .unwrap();
    let err = cms
        .patch(
            "c",
            &PatchParams::apply("beta"),
            &Patch::Apply(applied("beta")),
        )
        .await
        .unwrap_err();
    assert_eq!(status_code(&err), Some((409, "Conflict".into())));
    let kube::Error::Api(status) = &err else {
        unreachable!()
    };
    assert!(
        status.message.contains("conflict with \"alpha\""),
        "{}",
        status.message
    );
    let forced = cms
        .patch(
            "c",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(applied("beta")),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["owner"], "beta");
    let owners: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.to_string().contains("f:owner"))
        })
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(owners, ["beta"]);
}

scenario!(the_scale_subresource_reads_and_writes_deployment_replicas);
async fn the_scale_subresource_reads_and_writes_deployment_replicas(env: Env) {
    let deployments: Api<Deployment> = Api::namespaced(env.client, &env.ns);
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"replicas": 1, "paused": true, "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}},
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    let scale = deployments.get_scale("d").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    let scaled = deployments
        .patch_scale(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(0));
    assert_eq!(
        deployments.get("d").await.unwrap().spec.unwrap().replicas,
        Some(0)
    );
}

scenario!(lists_page_through_limit_and_continue);
async fn lists_page_through_limit_and_continue(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &config_map(&format!("page-{i}"), &[]),
        )
        .await
        .unwrap();
    }
    let mut names = Vec::new();
    let mut params = ListParams::default().labels("").limit(2);
    let mut pages = 0;
    loop {
        let page = cms.list(&params).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 2);
        names.extend(
            page.items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .filter(|n| n.starts_with("page-")),
        );
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert!(pages >= 3);
    assert_eq!(names, ["page-0", "page-1", "page-2", "page-3", "page-4"]);
}

scenario!(metadata_only_lists_carry_metadata_and_no_data);
async fn metadata_only_lists_carry_metadata_and_no_data(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    cms.create(
        &PostParams::default(),
        &config_map("m", &[("big", "value")]),
    )
    .await
    .unwrap();
    let list = cms
        .list_metadata(&ListParams::default().fields("metadata.name=m"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("m"));
    let got = cms.get_metadata("m").await.unwrap();
    assert!(got.metadata.uid.is_some());
}

scenario!(a_dry_run_create_stores_nothing);
async fn a_dry_run_create_stores_nothing(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    let answered = cms
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &config_map("dry", &[]),
        )
        .await
        .unwrap();
    assert_eq!(answered.metadata.name.as_deref(), Some("dry"));
    assert_eq!(
        status_code(&cms.get("dry").await.unwrap_err()),
        Some((404, "NotFound".into()))
    );
}

scenario!(a_finalizer_holds_deletion_until_it_is_removed);
async fn a_finalizer_holds_deletion_until_it_is_removed(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    let mut cm = config_map("held", &[]);
    cm.metadata.finalizers = Some(vec!["gpu-reaper.test/hold".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(
        status_code(&cms.get("held").await.unwrap_err()),
        Some((404, "NotFound".into()))
    );
}

scenario!(generate_name_gives_distinct_names);
async fn generate_name_gives_distinct_names(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    let mut cm = config_map("", &[]);
    cm.metadata.name = None;
    cm.metadata.generate_name = Some("gen-".into());
    let a = cms
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .metadata
        .name
        .unwrap();
    let b = cms
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .metadata
        .name
        .unwrap();
    assert!(
        a.starts_with("gen-") && b.starts_with("gen-") && a != b,
        "{a} {b}"
    );
}

scenario!(a_watch_from_a_list_resource_version_sees_later_changes_in_order);
async fn a_watch_from_a_list_resource_version_sees_later_changes_in_order(env: Env) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client, &env.ns);
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &config_map("w", &[("k", "1")]))
        .await
        .unwrap();
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    cms.delete("w", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match stream.try_next().await.unwrap().expect("watch open") {
            WatchEvent::Added(c) => {
                seen.push(("ADDED", c.data.unwrap_or_default().get("k").cloned()))
            }
            WatchEvent::Modified(c) => {
                seen.push(("MODIFIED", c.data.unwrap_or_default().get("k").cloned()))
            }
            WatchEvent::Deleted(c) => {
                seen.push(("DELETED", c.data.unwrap_or_default().get("k").cloned()))
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    let one = Some("1".to_string());
    let two = Some("2".to_string());
    assert_eq!(
        seen,
        [("ADDED", one), ("MODIFIED", two.clone()), ("DELETED", two)]
    );
}
