//! The controller's actions against kube-sim (a real HTTP API server with `/scale`,
//! `/eviction` and PodDisruptionBudgets), and `gpu-reaper wake` restoring them.

use std::process::Stdio;

use gpu_reaper::admission::count::GpuResources;
use gpu_reaper::api::policy::ActionType;
use gpu_reaper::cluster::actions::{self, Outcome, RestoreRecord};
use gpu_reaper::cluster::inventory::{ObjectInfo, PodInfo, pod_info};
use jiff::Timestamp;
use kube_sim::KubeSim;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");

fn now() -> Timestamp {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn deployment(name: &str, replicas: i32, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "vllm/vllm-openai:v0.6.0",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    })
}

fn stored(sim: &KubeSim, group: &str, plural: &str, name: &str) -> Value {
    sim.get(group, plural, "ml", name).unwrap()
}

fn info(v: &Value) -> ObjectInfo {
    ObjectInfo::from_value(v).unwrap()
}

fn restore_of(v: &Value) -> RestoreRecord {
    serde_json::from_str(
        v["metadata"]["annotations"]["gpureaper.io/restore"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn scale_to_zero_records_the_replicas_first_and_wake_puts_them_back() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(deployment(
        "chat",
        3,
        json!({"gpureaper.io/warned-at": "2026-11-29T11:00:00Z"}),
    ))
    .unwrap();
    let root = info(&stored(&sim, "apps", "deployments", "chat"));
    let outcome = actions::act(&client, ActionType::ScaleToZero, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("scaled ml/Deployment/chat from 3 replicas to 0".into())
    );
    let after = stored(&sim, "apps", "deployments", "chat");
    assert_eq!(after["spec"]["replicas"], 0);
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            replicas: Some(3),
            suspend: None,
            annotation: None,
            kueue_workload: None,
            state: "done".into()
        }
    );
    assert_eq!(
        after["metadata"]["annotations"]["gpureaper.io/reaped-action"],
        "ScaleToZero"
    );
    assert_eq!(
        after["metadata"]["annotations"]["gpureaper.io/reaped-at"],
        "2026-11-29T12:00:00Z"
    );

    // Acting again changes nothing and keeps the record.
    let again = actions::act(&client, ActionType::ScaleToZero, &info(&after), &[], now())
        .await
        .unwrap();
    assert!(matches!(again, Outcome::AlreadyDone(_)), "{again:?}");
    assert_eq!(
        restore_of(&stored(&sim, "apps", "deployments", "chat")).replicas,
        Some(3)
    );

    // `gpu-reaper wake` with kubectl's kubeconfig.
    let out = tokio::process::Command::new(BIN)
        .args(["wake", "ml/Deployment/chat"])
        .env("KUBECONFIG", sim.kubeconfig_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "scaled ml/Deployment/chat back to 3 replicas"
    );
    let woken = stored(&sim, "apps", "deployments", "chat");
    assert_eq!(woken["spec"]["replicas"], 3);
    let annotations = woken["metadata"]["annotations"].as_object().unwrap();
    for gone in [
        "gpureaper.io/restore",
        "gpureaper.io/reaped-at",
        "gpureaper.io/reaped-action",
        "gpureaper.io/warned-at",
    ] {
        assert!(
            !annotations.contains_key(gone),
            "{gone} left: {annotations:?}"
        );
    }
    assert!(annotations.contains_key("gpureaper.io/woken-at"));
}

#[tokio::test]
async fn a_controller_killed_between_the_restore_record_and_the_scale_finishes_without_losing_it() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    // What a run killed right after its first write leaves: the record says pending, the
    // replicas are still up.
    let pending = json!({"gpureaper.io/restore": "{\"replicas\":4,\"state\":\"pending\"}",
                         "gpureaper.io/reaped-at": "2026-11-29T11:59:00Z",
                         "gpureaper.io/reaped-action": "ScaleToZero"});
    sim.seed(deployment("chat", 4, pending)).unwrap();
    let root = info(&stored(&sim, "apps", "deployments", "chat"));
    let outcome = actions::act(&client, ActionType::ScaleToZero, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("scaled ml/Deployment/chat from 4 replicas to 0".into())
    );
    let after = stored(&sim, "apps", "deployments", "chat");
    assert_eq!(after["spec"]["replicas"], 0);
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            replicas: Some(4),
            suspend: None,
            annotation: None,
            kueue_workload: None,
            state: "done".into()
        }
    );
    // The first run's reclaim time is kept: it is one action, not two.
    assert_eq!(
        after["metadata"]["annotations"]["gpureaper.io/reaped-at"],
        "2026-11-29T11:59:00Z"
    );
}

#[tokio::test]
async fn a_job_is_suspended_in_the_same_write_as_its_restore_record_and_resumed_by_wake() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
    }))
    .unwrap();
    let root = info(&stored(&sim, "batch", "jobs", "train"));
    let rv = stored(&sim, "batch", "jobs", "train")["metadata"]["resourceVersion"].clone();
    let outcome = actions::act(&client, ActionType::Suspend, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Done("suspended ml/Job/train".into()));
    let after = stored(&sim, "batch", "jobs", "train");
    assert_eq!(after["spec"]["suspend"], true);
    assert_eq!(restore_of(&after).suspend, Some(false));
    // One write: the resourceVersion moved once.
    let before: u64 = rv.as_str().unwrap().parse().unwrap();
    let now_rv: u64 = after["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(sim.resource_version(), now_rv);
    assert!(now_rv > before);
    let woken = actions::wake(&client, &info(&after), now()).await.unwrap();
    assert_eq!(woken, Outcome::Done("resumed ml/Job/train".into()));
    let resumed = stored(&sim, "batch", "jobs", "train");
    assert_eq!(resumed["spec"]["suspend"], false);
    assert!(
        resumed["metadata"]["annotations"]
            .get("gpureaper.io/restore")
            .is_none()
    );
}

#[tokio::test]
async fn suspend_on_a_deployment_is_refused_with_the_alternative() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(deployment("chat", 1, json!({}))).unwrap();
    let root = info(&stored(&sim, "apps", "deployments", "chat"));
    let outcome = actions::act(&client, ActionType::Suspend, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Unsupported("ml/Deployment/chat: Suspend works on Job, JobSet, RayJob, RayCluster and Kubeflow training jobs; use ScaleToZero or Evict for a Deployment".into()));
    assert_eq!(
        stored(&sim, "apps", "deployments", "chat")["spec"]["replicas"],
        1
    );
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": {"app": "nb"}},
        "spec": {"containers": [{"name": "c", "image": "jupyter", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

#[tokio::test]
async fn eviction_refused_by_a_disruption_budget_is_reported_and_succeeds_once_allowed() {
    let sim = KubeSim::start().await.unwrap();
    // As the controller builds its client: no blanket retry of 429, so a PDB refusal
    // comes back at once and the next cycle retries.
    let mut config = sim.config().await.unwrap();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    sim.seed(pod("nb-0")).unwrap();
    sim.seed(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "nb", "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "nb"}}},
    }))
    .unwrap();
    let stored_pod = stored(&sim, "", "pods", "nb-0");
    let root = info(&stored_pod);
    let pods: Vec<PodInfo> = vec![pod_info(&stored_pod, &GpuResources::default(), now()).unwrap()];
    let outcome = actions::act(&client, ActionType::Evict, &root, &pods, now())
        .await
        .unwrap();
    let Outcome::Refused(text) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        text.starts_with(
            "evicted 0 of 1 pods of ml/Pod/nb-0; a PodDisruptionBudget refused the rest"
        ),
        "{text}"
    );
    assert!(sim.get("", "pods", "ml", "nb-0").is_some(), "never forced");
    // The budget is lifted: the next cycle's eviction goes through.
    let pdb = sim
        .get("policy", "poddisruptionbudgets", "ml", "nb")
        .unwrap();
    let mut relaxed = pdb.clone();
    relaxed["spec"]["minAvailable"] = json!(0);
    kube::Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        client.clone(),
        "ml",
    )
    .replace(
        "nb",
        &Default::default(),
        &serde_json::from_value(relaxed).unwrap(),
    )
    .await
    .unwrap();
    let outcome = actions::act(&client, ActionType::Evict, &root, &pods, now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("evicted 1 pods of ml/Pod/nb-0".into())
    );
    assert!(sim.get("", "pods", "ml", "nb-0").is_none());
}

/// A CRD for `kind` that keeps whatever it is given (as a project's CRD would, for the
/// fields these tests touch).
fn crd(group: &str, version: &str, kind: &str, plural: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                 "versions": [{"name": version, "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
    })
}

#[tokio::test]
async fn a_notebook_is_stopped_with_its_controller_annotation_and_started_again_by_wake() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd("kubeflow.org", "v1", "Notebook", "notebooks"))
        .unwrap();
    // The real sample Notebook from the Kubeflow notebook controller, in namespace ml.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/manifests/kubeflow-v1.10.0__notebook-controller_samples__v1_notebook.yaml"
    ))
    .unwrap();
    let mut notebook: Value = serde_yaml::from_str(text.trim_start_matches("---\n")).unwrap();
    notebook["metadata"]["namespace"] = json!("ml");
    sim.seed(notebook).unwrap();
    let stored_nb = sim
        .get("kubeflow.org", "notebooks", "ml", "notebook-sample-v1")
        .unwrap();
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&stored_nb),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("stopped ml/Notebook/notebook-sample-v1 (kubeflow-resource-stopped)".into())
    );
    let stopped = sim
        .get("kubeflow.org", "notebooks", "ml", "notebook-sample-v1")
        .unwrap();
    assert_eq!(
        stopped["metadata"]["annotations"]["kubeflow-resource-stopped"],
        "2026-11-29T12:00:00Z"
    );
    assert_eq!(
        restore_of(&stopped).annotation.as_deref(),
        Some("kubeflow-resource-stopped")
    );
    let woken = actions::wake(&client, &info(&stopped), now())
        .await
        .unwrap();
    assert_eq!(
        woken,
        Outcome::Done(
            "started ml/Notebook/notebook-sample-v1 again (removed kubeflow-resource-stopped)"
                .into()
        )
    );
    let started = sim
        .get("kubeflow.org", "notebooks", "ml", "notebook-sample-v1")
        .unwrap();
    assert!(
        started["metadata"]["annotations"]
            .get("kubeflow-resource-stopped")
            .is_none(),
        "{started}"
    );
}

#[tokio::test]
async fn a_pytorchjob_is_suspended_through_its_run_policy() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"))
        .unwrap();
    // The real training-operator MNIST NCCL sample.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/manifests/training-operator-release-1.9__pytorch_job_mnist_nccl.yaml"
    ))
    .unwrap();
    let mut job: Value = serde_yaml::from_str(&text).unwrap();
    job["metadata"]["namespace"] = json!("ml");
    let name = job["metadata"]["name"].as_str().unwrap().to_string();
    sim.seed(job).unwrap();
    let root = info(&sim.get("kubeflow.org", "pytorchjobs", "ml", &name).unwrap());
    let outcome = actions::act(&client, ActionType::Suspend, &root, &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done(format!("suspended ml/PyTorchJob/{name}"))
    );
    let suspended = sim.get("kubeflow.org", "pytorchjobs", "ml", &name).unwrap();
    assert_eq!(
        suspended["spec"]["runPolicy"]["suspend"], true,
        "{suspended}"
    );
    assert!(
        suspended["spec"].get("suspend").is_none(),
        "not spec.suspend"
    );
    actions::wake(&client, &info(&suspended), now())
        .await
        .unwrap();
    let resumed = sim.get("kubeflow.org", "pytorchjobs", "ml", &name).unwrap();
    assert_eq!(resumed["spec"]["runPolicy"]["suspend"], false);
}

#[tokio::test]
async fn a_kueue_managed_job_is_deactivated_through_its_workload_not_suspended() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd("kueue.x-k8s.io", "v1beta2", "Workload", "workloads"))
        .unwrap();
    sim.seed(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "sample-job", "namespace": "team-a", "labels": {"kueue.x-k8s.io/queue-name": "team-a-queue"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
    }))
    .unwrap();
    let job = sim.get("batch", "jobs", "team-a", "sample-job").unwrap();
    // Not created by Kueue yet: refused, retried later.
    let early = actions::act(&client, ActionType::Suspend, &info(&job), &[], now())
        .await
        .unwrap();
    assert!(
        matches!(early, Outcome::Refused(ref s) if s.contains("Kueue has not created its Workload yet")),
        "{early:?}"
    );
    // The real Workload from Kueue's docs, owned by the Job as Kueue creates it.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/manifests/kueue__docs_concepts_workload.extracted-Workload.yaml"
    ))
    .unwrap();
    let mut workload: Value = serde_yaml::from_str(&text).unwrap();
    workload["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "sample-job",
        "uid": job["metadata"]["uid"], "controller": true}]);
    sim.seed(workload).unwrap();
    let outcome = actions::act(&client, ActionType::Suspend, &info(&job), &[], now())
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Done("deactivated Kueue Workload team-a/sample-job of team-a/Job/sample-job; Kueue evicts it".into()));
    let w = sim
        .get("kueue.x-k8s.io", "workloads", "team-a", "sample-job")
        .unwrap();
    assert_eq!(w["spec"]["active"], false);
    let job_after = sim.get("batch", "jobs", "team-a", "sample-job").unwrap();
    assert!(
        job_after["spec"].get("suspend").is_none_or(|s| s == false),
        "gpu-reaper must not touch spec.suspend under Kueue"
    );
    assert_eq!(
        restore_of(&job_after).kueue_workload.as_deref(),
        Some("sample-job")
    );
    let woken = actions::wake(&client, &info(&job_after), now())
        .await
        .unwrap();
    assert_eq!(
        woken,
        Outcome::Done(
            "reactivated Kueue Workload team-a/sample-job of team-a/Job/sample-job".into()
        )
    );
    assert_eq!(
        sim.get("kueue.x-k8s.io", "workloads", "team-a", "sample-job")
            .unwrap()["spec"]["active"],
        true
    );
}
