//! The controller's actions against kube-sim (a real HTTP API server with `/scale`,
//! `/eviction` and PodDisruptionBudgets), and `gpu-reaper wake` restoring them.

use std::process::Stdio;

use gpu_reaper::admission::count::GpuResources;
use gpu_reaper::api::policy::ActionType;
use gpu_reaper::cluster::actions::{self, Outcome, RestoreRecord, WorkerGroupRecord};
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
            state: "done".into(),
            ..RestoreRecord::default()
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
            state: "done".into(),
            ..RestoreRecord::default()
        }
    );
    // The first run's reclaim time is kept: it is one action, not two.
    assert_eq!(
        after["metadata"]["annotations"]["gpureaper.io/reaped-at"],
        "2026-11-29T11:59:00Z"
    );
}

/// Request-driven inference under `action.inference.minReplicas`: scaled down to the
/// minimum, not to zero; the record says how many stayed, an interrupted action finishes
/// at the same minimum, and wake puts the full count back.
#[tokio::test]
async fn request_driven_inference_is_scaled_to_its_minimum_and_wake_restores_every_replica() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(deployment("chat", 4, json!({}))).unwrap();
    let root = info(&stored(&sim, "apps", "deployments", "chat"));
    let outcome = actions::scale_to_minimum(&client, &root, 1, now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("scaled ml/Deployment/chat from 4 replicas to 1".into())
    );
    let after = stored(&sim, "apps", "deployments", "chat");
    assert_eq!(after["spec"]["replicas"], 1);
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            replicas: Some(4),
            kept: Some(1),
            state: "done".into(),
            ..RestoreRecord::default()
        }
    );
    // At the minimum already: nothing more to do.
    let again = actions::scale_to_minimum(&client, &info(&after), 1, now())
        .await
        .unwrap();
    assert_eq!(
        again,
        Outcome::AlreadyDone("ml/Deployment/chat already has 1 replicas".into())
    );
    let woken = actions::wake(&client, &info(&after), now()).await.unwrap();
    assert_eq!(
        woken,
        Outcome::Done("scaled ml/Deployment/chat back to 4 replicas".into())
    );
    assert_eq!(
        stored(&sim, "apps", "deployments", "chat")["spec"]["replicas"],
        4
    );

    // A run killed after its restore record: the next finishes at the recorded minimum,
    // whichever way it is called (the controller's housekeeping calls scale_to_zero).
    let pending =
        json!({"gpureaper.io/restore": "{\"replicas\":3,\"kept\":2,\"state\":\"pending\"}"});
    sim.seed(deployment("embed", 3, pending)).unwrap();
    let root = info(&stored(&sim, "apps", "deployments", "embed"));
    let outcome = actions::scale_to_zero(&client, &root, now()).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("scaled ml/Deployment/embed from 3 replicas to 2".into())
    );
    assert_eq!(
        stored(&sim, "apps", "deployments", "embed")["spec"]["replicas"],
        2
    );

    // A kind with its own way to stop cannot keep replicas: said, not zeroed.
    let notebook = ObjectInfo {
        api_version: "kubeflow.org/v1".into(),
        kind: "Notebook".into(),
        ..info(&stored(&sim, "apps", "deployments", "embed"))
    };
    let outcome = actions::scale_to_minimum(&client, &notebook, 1, now())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Unsupported(ref s) if s.contains("cannot keep 1 replicas")),
        "{outcome:?}"
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
    assert_eq!(outcome, Outcome::Unsupported("ml/Deployment/chat: Suspend works on Job, JobSet, RayJob, RayCluster, RayService and Kubeflow training jobs; use ScaleToZero or Evict for a Deployment".into()));
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

/// The first document of a fixture manifest from `tests/fixtures/manifests`, placed in
/// namespace `ml`.
fn manifest(file: &str) -> Value {
    use serde::Deserialize;
    let path = format!(
        "{}/tests/fixtures/manifests/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let mut object = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .find(|doc| !doc.is_null())
        .unwrap();
    object["metadata"]["namespace"] = json!("ml");
    object
}

fn annotations_of(v: &Value) -> serde_json::Map<String, Value> {
    v["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn an_inference_service_is_stopped_with_the_kserve_stop_annotation_and_wake_puts_its_old_value_back()
 {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd(
        "serving.kserve.io",
        "v1beta1",
        "InferenceService",
        "inferenceservices",
    ))
    .unwrap();
    // The real KServe GPU sample, as a KServe that knows the stop annotation reports it
    // (a Stopped condition, False), and with the annotation set to "false" by its owner.
    let mut isvc = manifest("kserve__autoscaling_autoscale_gpu.yaml");
    isvc["metadata"]["annotations"]["serving.kserve.io/stop"] = json!("false");
    isvc["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}, {"type": "Stopped", "status": "False"}]});
    sim.seed(isvc).unwrap();
    let get = || {
        sim.get(
            "serving.kserve.io",
            "inferenceservices",
            "ml",
            "flowers-sample-gpu",
        )
    };
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&get().unwrap()),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("stopped ml/InferenceService/flowers-sample-gpu (serving.kserve.io/stop: \"true\"); KServe removes its serving pods and keeps the service".into())
    );
    let stopped = get().unwrap();
    let annotations = annotations_of(&stopped);
    assert_eq!(annotations["serving.kserve.io/stop"], "true");
    assert_eq!(
        annotations["autoscaling.knative.dev/target"], "1",
        "other annotations kept"
    );
    assert_eq!(
        restore_of(&stopped),
        RestoreRecord {
            annotation: Some("serving.kserve.io/stop".into()),
            annotation_value: Some("false".into()),
            state: "done".into(),
            ..RestoreRecord::default()
        }
    );
    assert_eq!(
        stopped["spec"],
        manifest("kserve__autoscaling_autoscale_gpu.yaml")["spec"],
        "the spec is KServe's to change, not ours"
    );
    // Idempotent: a second action writes nothing.
    let rv = stopped["metadata"]["resourceVersion"].clone();
    let again = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&stopped),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert!(matches!(again, Outcome::AlreadyDone(_)), "{again:?}");
    assert_eq!(get().unwrap()["metadata"]["resourceVersion"], rv);

    let woken = actions::wake(&client, &info(&stopped), now())
        .await
        .unwrap();
    assert_eq!(
        woken,
        Outcome::Done("started ml/InferenceService/flowers-sample-gpu again (serving.kserve.io/stop back to \"false\")".into())
    );
    let started = annotations_of(&get().unwrap());
    assert_eq!(started["serving.kserve.io/stop"], "false");
    assert!(!started.contains_key("gpureaper.io/restore"));
}

#[tokio::test]
async fn an_llm_inference_service_is_stopped_and_wake_removes_the_annotation_it_did_not_have() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd(
        "serving.kserve.io",
        "v1alpha2",
        "LLMInferenceService",
        "llminferenceservices",
    ))
    .unwrap();
    sim.seed(manifest(
        "kserve__llmisvc_single-node-gpu_llm-inference-service-qwen2-7b-gpu.yaml",
    ))
    .unwrap();
    let get = || {
        sim.get(
            "serving.kserve.io",
            "llminferenceservices",
            "ml",
            "qwen2-7b-instruct-single",
        )
        .unwrap()
    };
    let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&get()), &[], now())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");
    let stopped = get();
    assert_eq!(annotations_of(&stopped)["serving.kserve.io/stop"], "true");
    assert_eq!(restore_of(&stopped).annotation_value, None);
    assert_eq!(stopped["spec"]["replicas"], 3, "replicas untouched");
    actions::wake(&client, &info(&stopped), now())
        .await
        .unwrap();
    assert!(
        !annotations_of(&get()).contains_key("serving.kserve.io/stop"),
        "{}",
        get()
    );
}

#[tokio::test]
async fn an_inference_service_of_a_kserve_without_stop_scales_its_predictor_to_zero_or_says_why_not()
 {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd(
        "serving.kserve.io",
        "v1beta1",
        "InferenceService",
        "inferenceservices",
    ))
    .unwrap();
    // Serverless (the old default), no Stopped condition: an older KServe.
    let mut serverless = manifest("kserve__autoscaling_autoscale_gpu.yaml");
    serverless["spec"]["predictor"]["minReplicas"] = json!(2);
    serverless["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    sim.seed(serverless.clone()).unwrap();
    let get = |name: &str| {
        sim.get("serving.kserve.io", "inferenceservices", "ml", name)
            .unwrap()
    };
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&get("flowers-sample-gpu")),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert!(
        matches!(&outcome, Outcome::Done(s) if s.starts_with("set spec.predictor.minReplicas of ml/InferenceService/flowers-sample-gpu from 2 to 0")),
        "{outcome:?}"
    );
    let scaled = get("flowers-sample-gpu");
    assert_eq!(scaled["spec"]["predictor"]["minReplicas"], 0);
    assert!(
        !annotations_of(&scaled).contains_key("serving.kserve.io/stop"),
        "an old KServe ignores the stop annotation"
    );
    assert_eq!(
        restore_of(&scaled).spec_patch,
        Some(json!({"predictor": {"minReplicas": 2}}))
    );
    actions::wake(&client, &info(&scaled), now()).await.unwrap();
    assert_eq!(
        get("flowers-sample-gpu")["spec"]["predictor"]["minReplicas"],
        2
    );

    // No minReplicas before: wake removes the field again.
    let mut unset = serverless.clone();
    unset["metadata"]["name"] = json!("unset");
    unset["spec"]["predictor"]
        .as_object_mut()
        .unwrap()
        .remove("minReplicas");
    sim.seed(unset).unwrap();
    actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&get("unset")),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert_eq!(get("unset")["spec"]["predictor"]["minReplicas"], 0);
    actions::wake(&client, &info(&get("unset")), now())
        .await
        .unwrap();
    assert!(
        get("unset")["spec"]["predictor"]
            .get("minReplicas")
            .is_none(),
        "{}",
        get("unset")
    );

    // RawDeployment on such a KServe cannot go to zero: said, and nothing written.
    let mut raw = serverless;
    raw["metadata"]["name"] = json!("raw");
    raw["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = json!("RawDeployment");
    sim.seed(raw).unwrap();
    let before = get("raw");
    let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&before), &[], now())
        .await
        .unwrap();
    let Outcome::Unsupported(text) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        text.contains("RawDeployment") && text.contains("upgrade KServe"),
        "{text}"
    );
    assert_eq!(get("raw"), before);
}

/// A RayService's active RayCluster as KubeRay creates it from `spec.rayClusterConfig`.
fn ray_service_and_cluster(sim: &KubeSim) -> (Value, Value) {
    sim.seed(crd("ray.io", "v1", "RayService", "rayservices"))
        .unwrap();
    sim.seed(crd("ray.io", "v1", "RayCluster", "rayclusters"))
        .unwrap();
    let mut service = manifest("kuberay__ray-service.llm-serve.yaml");
    service["status"] = json!({"activeServiceStatus": {"rayClusterName": "ray-serve-llm-x7k2p"},
                               "pendingServiceStatus": {}});
    sim.seed(service.clone()).unwrap();
    let service = sim
        .get("ray.io", "rayservices", "ml", "ray-serve-llm")
        .unwrap();
    let cluster = json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "ray-serve-llm-x7k2p", "namespace": "ml",
                     "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayService", "name": "ray-serve-llm",
                                          "uid": service["metadata"]["uid"], "controller": true}]},
        "spec": service["spec"]["rayClusterConfig"],
    });
    sim.seed(cluster).unwrap();
    let cluster = sim
        .get("ray.io", "rayclusters", "ml", "ray-serve-llm-x7k2p")
        .unwrap();
    (service, cluster)
}

#[tokio::test]
async fn a_ray_service_is_reclaimed_through_the_worker_groups_of_its_active_cluster_and_woken_back()
{
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    let (service, _) = ray_service_and_cluster(&sim);
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &info(&service),
        &[],
        now(),
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("scaled the worker groups of RayCluster ml/ray-serve-llm-x7k2p of ml/RayService/ray-serve-llm to 0 (were gpu-group 1); its head keeps running".into())
    );
    let cluster = sim
        .get("ray.io", "rayclusters", "ml", "ray-serve-llm-x7k2p")
        .unwrap();
    let group = &cluster["spec"]["workerGroupSpecs"][0];
    assert_eq!(
        (
            &group["replicas"],
            &group["minReplicas"],
            &group["maxReplicas"]
        ),
        (&json!(0), &json!(0), &json!(0))
    );
    assert_eq!(
        group["template"], service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"],
        "only the replica fields change"
    );
    let after = sim
        .get("ray.io", "rayservices", "ml", "ray-serve-llm")
        .unwrap();
    assert_eq!(
        after["spec"], service["spec"],
        "the RayService spec is not touched: KubeRay would not pass it on"
    );
    assert_eq!(
        restore_of(&after),
        RestoreRecord {
            ray_cluster: Some("ray-serve-llm-x7k2p".into()),
            worker_groups: vec![WorkerGroupRecord {
                group_name: "gpu-group".into(),
                replicas: Some(1),
                min_replicas: Some(1),
                max_replicas: Some(1),
            }],
            state: "done".into(),
            ..RestoreRecord::default()
        }
    );
    let again = actions::act(&client, ActionType::ScaleToZero, &info(&after), &[], now())
        .await
        .unwrap();
    assert!(matches!(again, Outcome::AlreadyDone(_)), "{again:?}");

    let woken = actions::wake(&client, &info(&after), now()).await.unwrap();
    assert_eq!(
        woken,
        Outcome::Done(
            "scaled the worker groups of RayCluster ml/ray-serve-llm-x7k2p back (gpu-group 1)"
                .into()
        )
    );
    let restored = sim
        .get("ray.io", "rayclusters", "ml", "ray-serve-llm-x7k2p")
        .unwrap();
    let group = &restored["spec"]["workerGroupSpecs"][0];
    assert_eq!(
        (
            &group["replicas"],
            &group["minReplicas"],
            &group["maxReplicas"]
        ),
        (&json!(1), &json!(1), &json!(1))
    );
    assert!(
        !annotations_of(
            &sim.get("ray.io", "rayservices", "ml", "ray-serve-llm")
                .unwrap()
        )
        .contains_key("gpureaper.io/restore")
    );
}

#[tokio::test]
async fn suspending_a_ray_service_scales_its_workers_and_an_interrupted_one_finishes_with_the_first_record()
 {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    let (service, _) = ray_service_and_cluster(&sim);
    let outcome = actions::act(&client, ActionType::Suspend, &info(&service), &[], now())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, Outcome::Done(s) if s.starts_with("scaled the worker groups")),
        "{outcome:?}"
    );
    let after = sim
        .get("ray.io", "rayservices", "ml", "ray-serve-llm")
        .unwrap();
    assert_eq!(
        annotations_of(&after)["gpureaper.io/reaped-action"],
        "Suspend"
    );
    assert!(after["spec"].get("suspend").is_none(), "no spec.suspend");

    // A run killed after its record: pending with the counts it saw; the cluster was
    // meanwhile changed to 3 by hand. The next cycle finishes with the recorded 1.
    actions::wake(&client, &info(&after), now()).await.unwrap();
    let pending = json!({"rayCluster": "ray-serve-llm-x7k2p", "state": "pending",
        "workerGroups": [{"groupName": "gpu-group", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]});
    let mut service = sim
        .get("ray.io", "rayservices", "ml", "ray-serve-llm")
        .unwrap();
    service["metadata"]["annotations"]["gpureaper.io/restore"] = json!(pending.to_string());
    let outcome = actions::scale_to_zero(&client, &info(&service), now())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");
    let cluster = sim
        .get("ray.io", "rayclusters", "ml", "ray-serve-llm-x7k2p")
        .unwrap();
    assert_eq!(cluster["spec"]["workerGroupSpecs"][0]["replicas"], 0);
    let record = restore_of(
        &sim.get("ray.io", "rayservices", "ml", "ray-serve-llm")
            .unwrap(),
    );
    assert_eq!(record.state, "done");
    assert_eq!(record.worker_groups[0].replicas, Some(1));
}

#[tokio::test]
async fn a_ray_service_without_an_active_cluster_or_mid_upgrade_is_left_for_a_later_cycle() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd("ray.io", "v1", "RayService", "rayservices"))
        .unwrap();
    sim.seed(crd("ray.io", "v1", "RayCluster", "rayclusters"))
        .unwrap();
    let mut starting = manifest("kuberay__ray-service.llm-serve.yaml");
    starting["metadata"]["name"] = json!("starting");
    sim.seed(starting).unwrap();
    let mut upgrading = manifest("kuberay__ray-service.llm-serve.yaml");
    upgrading["metadata"]["name"] = json!("upgrading");
    upgrading["status"] = json!({"activeServiceStatus": {"rayClusterName": "upgrading-a"},
                                 "pendingServiceStatus": {"rayClusterName": "upgrading-b"}});
    sim.seed(upgrading).unwrap();
    for (name, expected) in [
        ("starting", "has no active RayCluster yet"),
        ("upgrading", "is moving to a new RayCluster (upgrading-b)"),
    ] {
        let before = sim.get("ray.io", "rayservices", "ml", name).unwrap();
        let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&before), &[], now())
            .await
            .unwrap();
        assert!(
            matches!(&outcome, Outcome::Refused(s) if s.contains(expected)),
            "{name}: {outcome:?}"
        );
        assert_eq!(
            sim.get("ray.io", "rayservices", "ml", name).unwrap(),
            before,
            "nothing written"
        );
    }
}

/// A CRD with a `/scale` subresource and a plural that is not the conventional one
/// ("matrixes"): only discovery finds it.
fn scalable_crd() -> Value {
    let mut crd = crd("inference.example.com", "v1", "Matrix", "matrices");
    crd["spec"]["versions"][0]["subresources"] = json!({"scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}});
    crd
}

#[tokio::test]
async fn an_unknown_crd_with_a_scale_subresource_is_scaled_through_it_and_woken_back() {
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(scalable_crd()).unwrap();
    sim.seed(
        json!({"apiVersion": "inference.example.com/v1", "kind": "Matrix",
        "metadata": {"name": "mm", "namespace": "ml"}, "spec": {"replicas": 4}}),
    )
    .unwrap();
    let get = || {
        sim.get("inference.example.com", "matrices", "ml", "mm")
            .unwrap()
    };
    let outcome = actions::act(&client, ActionType::ScaleToZero, &info(&get()), &[], now())
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("scaled ml/Matrix/mm from 4 replicas to 0".into())
    );
    assert_eq!(get()["spec"]["replicas"], 0);
    assert_eq!(restore_of(&get()).replicas, Some(4));
    let woken = actions::wake(&client, &info(&get()), now()).await.unwrap();
    assert_eq!(
        woken,
        Outcome::Done("scaled ml/Matrix/mm back to 4 replicas".into())
    );
    assert_eq!(get()["spec"]["replicas"], 4);
    assert!(!annotations_of(&get()).contains_key("gpureaper.io/restore"));
}

#[tokio::test]
async fn a_kind_without_a_scale_subresource_is_reported_as_unscalable_every_time_and_never_written()
{
    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    sim.seed(crd("trainer.example.com", "v1", "Trainer", "trainers"))
        .unwrap();
    sim.seed(
        json!({"apiVersion": "trainer.example.com/v1", "kind": "Trainer",
        "metadata": {"name": "t", "namespace": "ml"}, "spec": {"replicas": 2}}),
    )
    .unwrap();
    sim.seed(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}},
    }))
    .unwrap();
    let rv = sim.resource_version();
    for _ in 0..2 {
        let trainer = info(
            &sim.get("trainer.example.com", "trainers", "ml", "t")
                .unwrap(),
        );
        let outcome = actions::act(&client, ActionType::ScaleToZero, &trainer, &[], now())
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Unsupported("ml/Trainer/t: cannot scale a Trainer (trainer.example.com/v1): it has no /scale subresource; use Evict for it".into())
        );
        let job = info(&sim.get("batch", "jobs", "ml", "train").unwrap());
        let outcome = actions::act(&client, ActionType::ScaleToZero, &job, &[], now())
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Unsupported("ml/Job/train: cannot scale a Job (batch/v1): it has no /scale subresource; use Suspend for it".into())
        );
    }
    assert_eq!(sim.resource_version(), rv, "nothing was written");
}
