//! Tests of the GPU count on real manifests (../shared/fixtures), and the helpers the
//! other test file shares.

use super::count::*;
use super::*;
use serde::Deserialize;
use serde_json::{Value, json};

/// Every document of a (multi-document) YAML file, empty documents dropped.
pub(super) fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("fixture parses as YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

pub(super) fn only_document(yaml: &str) -> Value {
    let mut docs = documents(yaml);
    assert_eq!(docs.len(), 1, "one document expected");
    docs.remove(0)
}

pub(super) fn count_default(object: &Value) -> Result<Counted, CountError> {
    count(object, "default", &GpuResources::default(), &())
}

pub(super) fn claim(object: &Value) -> Claim {
    match count_default(object) {
        Ok(Counted::Claim(claim)) => claim,
        other => panic!("expected a claim, got {other:?}"),
    }
}

pub(super) fn claim_with(object: &Value, templates: &dyn ClaimTemplates) -> Claim {
    match count(object, "default", &GpuResources::default(), templates) {
        Ok(Counted::Claim(claim)) => claim,
        other => panic!("expected a claim, got {other:?}"),
    }
}

pub(super) fn error_text(object: &Value) -> String {
    match count_default(object) {
        Err(e) => e.to_string(),
        other => panic!("expected an error, got {other:?}"),
    }
}

pub(super) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A pod template whose one container has `limits` of `gpus` nvidia.com/gpu.
pub(super) fn gpu_template(gpus: u64) -> Value {
    json!({"spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
}

pub(super) static JOBSET: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| fixture("jobset__workload-aware-scheduling_dra_jobset.yaml"));
pub(super) static CLAIM_TEMPLATE: std::sync::LazyLock<&str> = std::sync::LazyLock::new(|| {
    fixture("jobset__workload-aware-scheduling_dra_resourceclaimtemplate.yaml")
});

/// A GPU workload manifest as its project ships it, read from ../shared/fixtures (the
/// public data lives beside the checkout, never copied into it).
pub(super) fn fixture(name: &str) -> &'static str {
    let path = format!(
        "{}/../shared/fixtures/manifests/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{path}: {e} (the public fixtures live in ../shared/fixtures beside the checkout)")
    });
    Box::leak(text.into_boxed_str())
}

// --- real manifests ---

#[test]
pub(super) fn resource_claim_template_fixture_counts_one_device_of_the_example_gpu_class() {
    // One request `gpu`, exactly: deviceClassName gpu.example.com, count absent → 1.
    let c = claim(&only_document(&CLAIM_TEMPLATE));
    assert_eq!(c.gpus, 1.0);
    assert_eq!(c.basis, "each claim: request gpu 1 GPU");
    assert_eq!(c.label_sets, vec![BTreeMap::new()]);
}

#[test]
pub(super) fn jobset_counts_replicas_times_parallelism_times_claim_template_gpus() {
    // The template, counted as the webhook's cache would, resolved through the HashMap:
    // replicatedJobs workers: 3 replicas × parallelism 2 × 1 GPU (claim template) = 6.
    let Counted::Claim(template) = count_default(&only_document(&CLAIM_TEMPLATE)).unwrap() else {
        panic!("the template is a claim")
    };
    let templates: HashMap<(String, String), f64> = HashMap::from([(
        ("default".to_string(), "gpu-claim-template".to_string()),
        template.gpus,
    )]);
    let c = claim_with(&only_document(&JOBSET), &templates);
    assert_eq!(c.gpus, 6.0);
    assert_eq!(c.basis, "workers 3 replicas × 2 pods × 1 GPU");
    assert!(c.unresolved_claim_templates.is_empty());
}

#[test]
pub(super) fn jobset_with_an_unknown_claim_template_counts_zero_and_names_the_template() {
    // Same JobSet, no template known: the container requests nothing itself → 0.
    let c = claim_with(&only_document(&JOBSET), &());
    assert_eq!(c.gpus, 0.0);
    assert_eq!(
        c.unresolved_claim_templates,
        vec!["gpu-claim-template".to_string()]
    );
    // A template in another namespace does not resolve either.
    let elsewhere: HashMap<(String, String), f64> =
        HashMap::from([(("other".to_string(), "gpu-claim-template".to_string()), 1.0)]);
    let c = claim_with(&only_document(&JOBSET), &elsewhere);
    assert_eq!(c.gpus, 0.0);
    assert_eq!(
        c.unresolved_claim_templates,
        vec!["gpu-claim-template".to_string()]
    );
}

#[test]
pub(super) fn inference_service_fixtures_count_the_framework_shorthand_as_one_container() {
    // predictor.tensorflow limits nvidia.com/gpu: 1; no min/maxReplicas → 1 replica.
    let tensorflow = only_document(fixture("kserve__autoscaling_autoscale_gpu.yaml"));
    let c = claim(&tensorflow);
    assert_eq!(c.gpus, 1.0);
    assert_eq!(c.basis, "predictor 1 replica × 1 GPU");
    // predictor.model requests "1" and limits "1" nvidia.com/gpu → 1.
    let hf = only_document(fixture("kserve__storage_hf_hf_isvc.yaml"));
    assert_eq!(claim(&hf).gpus, 1.0);
    // predictor.pytorch limits nvidia.com/gpu "1" → 1.
    let torchserve = only_document(fixture("kserve__v1beta1_torchserve_v1_gpu.yaml"));
    assert_eq!(claim(&torchserve).gpus, 1.0);
}

#[test]
pub(super) fn inference_service_counts_max_replicas_of_every_component() {
    // Derived from the tensorflow fixture: minReplicas 2, maxReplicas 3 and a
    // transformer with one custom container of 1 GPU (KServe default 1 replica):
    // predictor 3 × 1 + transformer 1 × 1 = 4.
    let mut isvc = only_document(fixture("kserve__autoscaling_autoscale_gpu.yaml"));
    isvc["spec"]["predictor"]["minReplicas"] = json!(2);
    isvc["spec"]["predictor"]["maxReplicas"] = json!(3);
    isvc["spec"]["transformer"] =
        json!({"containers": [{"name": "t", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]});
    let c = claim(&isvc);
    assert_eq!(c.gpus, 4.0);
    assert_eq!(
        c.basis,
        "predictor 3 replicas × 1 GPU + transformer 1 replica × 1 GPU"
    );
}

#[test]
pub(super) fn inference_service_worker_spec_adds_pipeline_parallel_size_minus_one_workers() {
    // Derived: model 2 GPUs on the head, workerSpec 2 GPUs, pipelineParallelSize 3 →
    // 1 replica × (2 + 2 workers × 2) = 6.
    let isvc = json!({
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "mn"},
        "spec": {"predictor": {
            "model": {"modelFormat": {"name": "huggingface"}, "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            "workerSpec": {"pipelineParallelSize": 3,
                "containers": [{"name": "worker-container", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
        }}
    });
    let c = claim(&isvc);
    assert_eq!(c.gpus, 6.0);
    assert_eq!(
        c.basis,
        "predictor 1 replica × (head 2 GPUs + 2 workers × 2 GPUs)"
    );
}

#[test]
pub(super) fn llm_inference_service_fixture_counts_three_replicas_of_one_gpu() {
    // replicas 3 × template main container requests = limits = "1" → 3.
    let c = claim(&only_document(fixture(
        "kserve__llmisvc_single-node-gpu_llm-inference-service-qwen2-7b-gpu.yaml",
    )));
    assert_eq!(c.gpus, 3.0);
    assert_eq!(c.basis, "3 replicas × 1 GPU");
}

#[test]
pub(super) fn llm_inference_service_with_a_worker_counts_leader_and_workers_per_replica() {
    // Derived from the fixture: a worker of 1 GPU and parallelism data 4 / dataLocal 2 →
    // group size 2 (KServe GetSize) → 3 replicas × (leader 1 + 1 worker × 1) = 6; plus a
    // prefill of 2 replicas × template 1 GPU = 2 → 8.
    let mut llm = only_document(fixture(
        "kserve__llmisvc_single-node-gpu_llm-inference-service-qwen2-7b-gpu.yaml",
    ));
    llm["spec"]["worker"] =
        json!({"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
    llm["spec"]["parallelism"] = json!({"data": 4, "dataLocal": 2, "tensor": 1});
    llm["spec"]["prefill"] = json!({"replicas": 2, "template": gpu_template(1)["spec"]});
    let c = claim(&llm);
    assert_eq!(c.gpus, 8.0);
    assert_eq!(
        c.basis,
        "3 replicas × (leader 1 GPU + 1 worker × 1 GPU) + prefill 2 replicas × 1 GPU"
    );
    // Pipeline parallelism 4 without a leader template: 3 × (1 + 3 × 1) = 12, + 2.
    llm["spec"]["parallelism"] = json!({"pipeline": 4});
    llm["spec"].as_object_mut().unwrap().remove("template");
    assert_eq!(claim(&llm).gpus, 14.0);
}

#[test]
pub(super) fn notebook_sample_is_a_claim_of_no_gpus() {
    // One container, no resources → 0.
    let c = claim(&only_document(fixture(
        "kubeflow-v1.10.0__notebook-controller_samples__v1_notebook.yaml",
    )));
    assert_eq!(c.gpus, 0.0);
    assert_eq!(c.basis, "1 pod × 0 GPUs");
}

#[test]
pub(super) fn notebook_template_with_placeholders_is_unreadable_at_its_labels() {
    // `app: {name}` is a YAML flow mapping, not a string: the template is not a manifest.
    let template = only_document(fixture(
        "kubeflow-v1.10.0__jupyter-web-app__notebook_template.yaml",
    ));
    assert_eq!(
        error_text(&template),
        "metadata.labels[\"app\"]: expected a string, found an object"
    );
}

#[test]
pub(super) fn files_that_are_not_manifests_are_not_governed() {
    let ui = only_document(fixture(
        "kubeflow-v1.10.0__jupyter-web-app__spawner_ui_config.yaml",
    ));
    assert_eq!(count_default(&ui), Ok(Counted::NotGoverned));
    let notebooks: Value = serde_json::from_str(fixture(
        "kubeflow-v1.10.0__jupyter-web-app__tests_fixtures_notebooks.json",
    ))
    .unwrap();
    assert_eq!(count_default(&notebooks), Ok(Counted::NotGoverned));
    assert_eq!(count_default(&json!("a string")), Ok(Counted::NotGoverned));
}

#[test]
pub(super) fn ray_job_fixture_counts_its_head_gpu() {
    // rayClusterSpec: head requests = limits = "1" nvidia.com/gpu, no worker groups → 1.
    let c = claim(&only_document(fixture(
        "kuberay__pytorch-text-classifier_ray-job.pytorch-distributed-training.yaml",
    )));
    assert_eq!(c.gpus, 1.0);
    assert_eq!(c.basis, "head 1 GPU");
}

#[test]
pub(super) fn ray_job_on_an_existing_cluster_claims_nothing() {
    let job = json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"},
        "spec": {"clusterSelector": {"ray.io/cluster": "shared"}}});
    let c = claim(&job);
    assert_eq!(c.gpus, 0.0);
    assert_eq!(
        c.basis,
        "no spec.rayClusterSpec: runs on an existing RayCluster"
    );
}

#[test]
pub(super) fn ray_cluster_verl_fixture_counts_four_head_gpus() {
    // Head limits = requests = "4" nvidia.com/gpu, no worker groups → 4.
    let c = claim(&only_document(fixture("kuberay__ray-cluster.verl.yaml")));
    assert_eq!(c.gpus, 4.0);
}

#[test]
pub(super) fn ray_service_fixture_counts_one_worker_of_four_gpus_and_skips_the_secret() {
    // Head 0 GPUs; gpu-group replicas 1 (min 1, max 1) × numOfHosts 1 × "4" → 4.
    let docs = documents(fixture("kuberay__ray-service.llm-serve.yaml"));
    assert_eq!(docs.len(), 2);
    let c = claim(&docs[0]);
    assert_eq!(c.gpus, 4.0);
    assert_eq!(
        c.basis,
        "head 0 GPUs + worker group gpu-group 1 replica × 4 GPUs"
    );
    assert_eq!(count_default(&docs[1]), Ok(Counted::NotGoverned));
}

#[test]
pub(super) fn kai_gpu_sharing_fixture_counts_its_gpu_fractions_and_queues_are_not_governed() {
    // Two KAI Queues, then a RayCluster whose workers ask for half a GPU each through
    // the `gpu-fraction` annotation: 0 head + 2 replicas × 0.5 → 1.
    let docs = documents(fixture("kuberay__ray-cluster.kai-gpu-sharing.yaml"));
    assert_eq!(docs.len(), 3);
    assert_eq!(count_default(&docs[0]), Ok(Counted::NotGoverned));
    assert_eq!(count_default(&docs[1]), Ok(Counted::NotGoverned));
    let c = claim(&docs[2]);
    assert_eq!(c.gpus, 1.0);
    assert_eq!(
        c.basis,
        "head 0 GPUs + worker group shared-gpu 2 replicas × 0.50 GPU"
    );
    assert_eq!(
        c.label_sets,
        vec![labels(&[("kai.scheduler/queue", "team-a")])]
    );
}

#[test]
pub(super) fn ray_worker_groups_count_replicas_within_bounds_and_max_when_autoscaling() {
    // Derived: a group of 1 GPU with replicas 2, minReplicas 1, maxReplicas 5.
    let mut cluster = json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"},
        "spec": {"headGroupSpec": {"template": gpu_template(0)},
            "workerGroupSpecs": [{"groupName": "g", "replicas": 2, "minReplicas": 1, "maxReplicas": 5,
                "numOfHosts": 2, "template": gpu_template(1)}]}});
    // No autoscaling: replicas 2 × 2 hosts × 1 = 4.
    let c = claim(&cluster);
    assert_eq!(c.gpus, 4.0);
    assert_eq!(
        c.basis,
        "head 0 GPUs + worker group g 2 replicas × 2 hosts × 1 GPU"
    );
    // Autoscaling may reach maxReplicas: 5 × 2 × 1 = 10.
    cluster["spec"]["enableInTreeAutoscaling"] = json!(true);
    assert_eq!(claim(&cluster).gpus, 10.0);
    // The CRD default maxReplicas (MaxInt32) is no bound: counted at replicas, 4.
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = json!(2147483647);
    let c = claim(&cluster);
    assert_eq!(c.gpus, 4.0);
    assert!(
        c.basis
            .ends_with("(autoscaling without maxReplicas: counted at replicas)")
    );
    // Replicas below minReplicas are raised to it (KubeRay): min 3 → 3 × 2 × 1 = 6.
    cluster["spec"]["enableInTreeAutoscaling"] = json!(false);
    cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = json!(3);
    assert_eq!(claim(&cluster).gpus, 6.0);
    // Nothing set: one replica → 1 × 2 × 1 = 2.
    let group = cluster["spec"]["workerGroupSpecs"][0]
        .as_object_mut()
        .unwrap();
    for key in ["replicas", "minReplicas", "maxReplicas"] {
        group.remove(key);
    }
    assert_eq!(claim(&cluster).gpus, 2.0);
}

#[test]
pub(super) fn kueue_workload_is_not_governed() {
    // Kueue creates Workloads for jobs the gate already counted.
    let workload = only_document(fixture(
        "kueue__docs_concepts_workload.extracted-Workload.yaml",
    ));
    assert_eq!(count_default(&workload), Ok(Counted::NotGoverned));
}

#[test]
pub(super) fn pytorch_job_fixtures_count_master_plus_workers() {
    // Master 1 × limits 1 + Worker 1 × limits 1 → 2, for both training-operator samples.
    let nccl = only_document(fixture(
        "training-operator-release-1.9__pytorch_job_mnist_nccl.yaml",
    ));
    let c = claim(&nccl);
    assert_eq!(c.gpus, 2.0);
    assert_eq!(
        c.basis,
        "Master 1 replica × 1 GPU + Worker 1 replica × 1 GPU"
    );
    let deepspeed = only_document(fixture(
        "training-operator-release-1.9__pytorch_deepspeed_demo.yaml",
    ));
    assert_eq!(claim(&deepspeed).gpus, 2.0);
    // Kueue's sample requests only cpu and memory → 0.
    let cpu = only_document(fixture("kueue__jobs_sample-pytorchjob.yaml"));
    let c = claim(&cpu);
    assert_eq!(c.gpus, 0.0);
    assert_eq!(
        c.label_sets,
        vec![labels(&[("kueue.x-k8s.io/queue-name", "user-queue")])]
    );
}

#[test]
pub(super) fn elastic_pytorch_job_counts_workers_at_max_replicas() {
    // Derived from the nccl sample: elasticPolicy.maxReplicas 4 → Master 1 + Worker 4 = 5.
    let mut job = only_document(fixture(
        "training-operator-release-1.9__pytorch_job_mnist_nccl.yaml",
    ));
    job["spec"]["elasticPolicy"] = json!({"minReplicas": 1, "maxReplicas": 4});
    assert_eq!(claim(&job).gpus, 5.0);
    // Another kind with other replica specs: TFJob PS 2 × 0 + Worker 3 × 2 = 6.
    let tf = json!({"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "tf"},
        "spec": {"tfReplicaSpecs": {"PS": {"replicas": 2, "template": gpu_template(0)},
            "Worker": {"replicas": 3, "template": gpu_template(2)}}}});
    assert_eq!(claim(&tf).gpus, 6.0);
}

#[test]
pub(super) fn kueue_gpu_job_counts_parallelism_times_pod_gpus() {
    // parallelism 3 × (requests 1, limits 1 → 1) = 3.
    let c = claim(&only_document(fixture(
        "kueue__provisioning_sample-job.yaml",
    )));
    assert_eq!(c.gpus, 3.0);
    assert_eq!(c.basis, "parallelism 3 × 1 GPU");
}

#[test]
pub(super) fn cron_job_counts_one_run_of_its_job_template_and_overlapping_runs_are_open_ended() {
    // Derived: jobTemplate parallelism 2 × 4 GPUs = 8.
    let mut cron = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"parallelism": 2, "template": gpu_template(4)}}}});
    let c = claim(&cron);
    assert_eq!(c.gpus, 8.0);
    assert_eq!(c.basis, "parallelism 2 × 4 GPUs per run");
    // concurrencyPolicy defaults to Allow: runs may overlap without bound.
    assert!(c.open_ended.unwrap().contains("Forbid or Replace"));
    cron["spec"]["concurrencyPolicy"] = json!("Replace");
    assert_eq!(claim(&cron).open_ended, None);
    cron["spec"]["concurrencyPolicy"] = json!("Sometimes");
    assert!(
        error_text(&cron).starts_with("spec.concurrencyPolicy: expected Allow, Forbid or Replace")
    );
}

#[test]
pub(super) fn hami_fixture_deployment_counts_its_vgpus_and_queue_objects_are_not_governed() {
    // ResourceFlavor, ClusterQueue, Namespace, LocalQueue, then a Deployment of
    // replicas 1 × limits nvidia.com/gpu "2" (gpucores, gpumem are not GPUs) → 2.
    let docs = documents(fixture("kueue__serving-workloads_sample-hami.yaml"));
    assert_eq!(docs.len(), 5);
    for doc in &docs[..4] {
        assert_eq!(count_default(doc), Ok(Counted::NotGoverned));
    }
    let c = claim(&docs[4]);
    assert_eq!(c.gpus, 2.0);
    assert_eq!(c.basis, "1 replica × 2 GPUs");
    assert_eq!(
        c.label_sets,
        vec![
            labels(&[("kueue.x-k8s.io/queue-name", "user-queue")]),
            labels(&[("app-name", "gpu-burn")])
        ]
    );
}

#[test]
pub(super) fn leader_worker_set_fixture_counts_groups_times_leader_plus_workers() {
    // replicas 2 × (leader 0 + (size 3 − 1) workers × requests "1") = 4.
    let c = claim(&only_document(fixture(
        "kueue__serving-workloads_sample-leaderworkerset-tas.yaml",
    )));
    assert_eq!(c.gpus, 4.0);
    assert_eq!(c.basis, "2 groups × (leader 0 GPUs + 2 workers × 1 GPU)");
}

#[test]
pub(super) fn leader_worker_set_without_a_leader_template_runs_size_workers() {
    // Derived: replicas 1, size 4, worker 8 GPUs, no leader template → 1 × 4 × 8 = 32.
    let lws = json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "vllm"},
        "spec": {"leaderWorkerTemplate": {"size": 4, "workerTemplate": gpu_template(8)}}});
    let c = claim(&lws);
    assert_eq!(c.gpus, 32.0);
    assert_eq!(c.basis, "1 group × 4 pods × 8 GPUs");
}

#[test]
pub(super) fn topology_and_queue_fixtures_are_not_governed() {
    let docs = documents(fixture("kueue__tas_sample-gpu-queues.yaml"));
    assert_eq!(docs.len(), 4);
    for doc in &docs {
        assert_eq!(count_default(doc), Ok(Counted::NotGoverned));
    }
}

// --- derived variants ---
