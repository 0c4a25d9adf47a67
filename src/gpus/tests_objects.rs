//! Tests of the GPU count on hand-built objects: pods, workloads, errors naming their
//! path, quantities, and properties over arbitrary JSON.

use super::count::*;
use super::quantity::*;
use super::tests::*;
use super::*;
use proptest::prelude::*;
use serde_json::{Value, json};

fn deployment(replicas: Value, template: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "labels": {"team": "a"}},
        "spec": {"replicas": replicas, "template": template}})
}

fn pod(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
}

#[test]
fn deployment_with_four_replicas_of_two_gpus_counts_eight() {
    let mut template = gpu_template(2);
    template["metadata"] = json!({"labels": {"app": "trainer"}});
    let c = claim(&deployment(json!(4), template));
    assert_eq!(c.gpus, 8.0);
    assert_eq!(c.basis, "4 replicas × 2 GPUs");
    assert_eq!(
        c.label_sets,
        vec![labels(&[("team", "a")]), labels(&[("app", "trainer")])]
    );
    assert!(c.unresolved_claim_templates.is_empty());
}

#[test]
fn stateful_set_without_replicas_runs_one_pod() {
    let mut set = deployment(json!(null), gpu_template(3));
    set["kind"] = json!("StatefulSet");
    assert_eq!(claim(&set).gpus, 3.0);
}

#[test]
fn a_plain_init_container_larger_than_the_main_containers_sets_the_pod_count() {
    // Main 1 + 1 = 2; init 3 runs alone before them → 3.
    let spec = json!({
    "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": 3}}}],
    "containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
    ]});
    assert_eq!(claim(&pod(spec)).gpus, 3.0);
}

#[test]
fn sidecars_add_to_the_main_containers_and_to_later_init_containers() {
    // Sidecar 1 (restartPolicy Always) runs beside main 1 → 2.
    let sidecar = json!({"name": "proxy", "restartPolicy": "Always",
        "resources": {"limits": {"nvidia.com/gpu": 1}}});
    let main = json!({"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}});
    let spec = json!({"initContainers": [sidecar.clone()], "containers": [main.clone()]});
    assert_eq!(claim(&pod(spec)).gpus, 2.0);
    // A plain init container of 2 after the sidecar runs beside it: 1 + 2 = 3 > 2.
    let init = json!({"name": "load", "resources": {"limits": {"nvidia.com/gpu": 2}}});
    let spec =
        json!({"initContainers": [sidecar.clone(), init.clone()], "containers": [main.clone()]});
    assert_eq!(claim(&pod(spec)).gpus, 3.0);
    // The same init container before the sidecar runs alone: max(2, 1 + 1) = 2.
    let spec = json!({"initContainers": [init, sidecar], "containers": [main]});
    assert_eq!(claim(&pod(spec)).gpus, 2.0);
}

#[test]
fn mig_slices_count_their_share_of_a_gpu() {
    // nvidia.com/mig-1g.5gb: 2 → 2 × 1/7.
    let spec = json!({"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/mig-1g.5gb": 2}}}]});
    let c = claim(&pod(spec));
    assert!((c.gpus - 2.0 / 7.0).abs() < 1e-12, "{}", c.gpus);
    assert_eq!(c.basis, "1 pod × 0.29 GPU");
    // 3g.40gb → 3/7; a compute instance 1c.3g.20gb → 3/7; 7g.80gb → 1; an unreadable
    // profile → a whole GPU, 1. Sum: 3/7 + 3/7 + 7/7 + 7/7 = 20/7.
    let spec = json!({"containers": [{"name": "m", "resources": {"limits": {
        "nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1c.3g.20gb": 1,
        "nvidia.com/mig-7g.80gb": 1, "nvidia.com/mig-weird": 1}}}]});
    let c = claim(&pod(spec));
    assert!((c.gpus - 20.0 / 7.0).abs() < 1e-12, "{}", c.gpus);
}

#[test]
fn other_vendors_count_as_whole_gpus_and_other_resources_not_at_all() {
    // Gaudi is a GPU of the default list (G7); HAMi's gpumem and Intel's millicores
    // are shares of a device, not devices.
    let spec = json!({"containers": [{"name": "m", "resources": {"limits": {
        "amd.com/gpu": 2, "gpu.intel.com/i915": "1", "habana.ai/gaudi": 8,
        "gpu.intel.com/millicores": "500",
        "nvidia.com/gpumem": "1024", "cpu": "500m", "memory": "1Gi"}}}]});
    assert_eq!(claim(&pod(spec)).gpus, 11.0);
}

#[test]
fn larger_of_requests_and_limits_counts() {
    let spec = json!({"containers": [{"name": "m", "resources": {
        "requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": 1}}}]});
    assert_eq!(claim(&pod(spec)).gpus, 2.0);
}

#[test]
fn a_controller_owned_pod_is_owned_by_its_controller() {
    let mut p = pod(gpu_template(8)["spec"].clone());
    p["metadata"]["ownerReferences"] = json!([
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "1"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "2", "controller": true}
    ]);
    assert_eq!(
        count_default(&p),
        Ok(Counted::OwnedBy {
            kind: "ReplicaSet".to_string(),
            name: "web-5d8f".to_string()
        })
    );
    // A ReplicaSet its Deployment created is not counted twice either.
    let mut rs = deployment(json!(3), gpu_template(1));
    rs["kind"] = json!("ReplicaSet");
    rs["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "controller": true}]);
    assert_eq!(
        count_default(&rs),
        Ok(Counted::OwnedBy {
            kind: "Deployment".to_string(),
            name: "web".to_string()
        })
    );
}

#[test]
fn a_pod_with_only_non_controller_owners_is_counted() {
    let mut p = pod(gpu_template(8)["spec"].clone());
    p["metadata"]["ownerReferences"] =
        json!([{"kind": "ConfigMap", "name": "c", "controller": false}]);
    assert_eq!(claim(&p).gpus, 8.0);
}

#[test]
fn a_config_map_and_unknown_kinds_are_not_governed() {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}});
    assert_eq!(count_default(&cm), Ok(Counted::NotGoverned));
    // A Deployment in another group is not apps/Deployment.
    let other =
        json!({"apiVersion": "example.com/v1", "kind": "Deployment", "spec": {"replicas": "x"}});
    assert_eq!(count_default(&other), Ok(Counted::NotGoverned));
}

#[test]
fn pod_claims_from_templates_count_per_pod_and_named_claims_count_zero() {
    // Two template claims (2 + unknown) and one shared named claim (counted at its own
    // creation): 2, with the unknown template reported once.
    let spec = json!({
        "resourceClaims": [
            {"name": "a", "resourceClaimTemplateName": "two-gpus"},
            {"name": "b", "resourceClaimTemplateName": "missing"},
            {"name": "c", "source": {"resourceClaimTemplateName": "missing"}},
            {"name": "d", "resourceClaimName": "shared"}
        ],
        "containers": [{"name": "m"}]});
    let templates: HashMap<(String, String), f64> =
        HashMap::from([(("ml".to_string(), "two-gpus".to_string()), 2.0)]);
    let (gpus, unresolved) =
        pod_spec_gpus(&spec, "spec", "ml", &GpuResources::default(), &templates).unwrap();
    assert_eq!(gpus, 2.0);
    assert_eq!(unresolved, vec!["missing".to_string()]);
}

#[test]
fn resource_claims_count_exact_all_and_first_available_requests() {
    // v1: exactly 2 gpu.nvidia.com + All (8) + firstAvailable max(1 mig, 4 gpu) +
    // a non-GPU class + adminAccess → 2 + 8 + 4 + 0 + 0 = 14.
    let rc = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "rc"},
    "spec": {"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
        {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
        {"name": "c", "firstAvailable": [
            {"name": "small", "deviceClassName": "mig.nvidia.com"},
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4}]},
        {"name": "d", "exactly": {"deviceClassName": "nic.example.com", "count": 4}},
        {"name": "e", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": true}}
    ]}}});
    let c = claim(&rc);
    assert_eq!(c.gpus, 14.0);
    assert_eq!(
        c.basis,
        "request a 2 GPUs + request b 8 GPUs + request c 4 GPUs + request d 0 GPUs + request e 0 GPUs"
    );
    // v1beta1 flat shape: 3 devices of gpu.amd.com.
    let beta = json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
        "spec": {"devices": {"requests": [{"name": "g", "deviceClassName": "gpu.amd.com", "count": 3}]}}});
    assert_eq!(claim(&beta).gpus, 3.0);
}

#[test]
fn train_job_counts_nodes_times_resources_per_node() {
    // Derived: numNodes 2 × limits nvidia.com/gpu 4 → 8.
    let tj = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "4"}}}}});
    let c = claim(&tj);
    assert_eq!(c.gpus, 8.0);
    assert_eq!(c.basis, "2 nodes × 4 GPUs");
}

// --- unreadable fields ---

#[test]
fn a_replica_count_that_is_not_an_integer_is_an_error_naming_its_path() {
    assert_eq!(
        error_text(&deployment(json!("three"), gpu_template(1))),
        "spec.replicas: expected a non-negative integer, found \"three\""
    );
    assert_eq!(
        error_text(&deployment(json!(-2), gpu_template(1))),
        "spec.replicas: expected a non-negative integer, found -2"
    );
}

#[test]
fn containers_that_are_not_a_list_are_an_error_naming_their_path() {
    let d = deployment(json!(1), json!({"spec": {"containers": {"name": "x"}}}));
    assert_eq!(
        error_text(&d),
        "spec.template.spec.containers: expected a list, found an object"
    );
}

#[test]
fn gpu_counts_that_are_negative_fractional_or_not_numbers_are_errors_naming_the_resource() {
    let with_limit = |v: Value| {
        deployment(
            json!(1),
            json!({"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": v}}}]}}),
        )
    };
    let path = "spec.template.spec.containers[0].resources.limits[\"nvidia.com/gpu\"]";
    assert_eq!(
        error_text(&with_limit(json!("-1"))),
        format!("{path}: expected a non-negative number of devices, found \"-1\"")
    );
    assert_eq!(
        error_text(&with_limit(json!(-1))),
        format!("{path}: expected a non-negative number of devices, found -1")
    );
    assert_eq!(
        error_text(&with_limit(json!("0.5"))),
        format!(
            "{path}: a device count must be whole (a part of a GPU is a MIG resource), found \"0.5\""
        )
    );
    assert_eq!(
        error_text(&with_limit(json!("500m"))),
        format!(
            "{path}: a device count must be whole (a part of a GPU is a MIG resource), found \"500m\""
        )
    );
    assert_eq!(
        error_text(&with_limit(json!("two"))),
        format!("{path}: expected a whole, non-negative number of devices, found \"two\"")
    );
    assert_eq!(
        error_text(&with_limit(json!(true))),
        format!("{path}: expected a whole, non-negative number of devices, found true")
    );
    assert_eq!(
        error_text(&with_limit(json!("1Ei"))),
        format!("{path}: the number of devices is implausibly large, found \"1Ei\"")
    );
}

#[test]
fn whole_quantities_parse_in_every_kubernetes_form() {
    for (text, expected) in [
        ("4", 4),
        ("+4", 4),
        ("4.0", 4),
        ("4000m", 4),
        ("0.004k", 4),
        ("4e0", 4),
        ("40e-1", 4),
        ("1k", 1000),
        ("1Ki", 1024),
        ("0", 0),
        ("-0", 0),
        (".0", 0),
    ] {
        assert_eq!(whole_quantity(text), Ok(expected), "{text}");
    }
    assert_eq!(whole_quantity("1.5"), Err(QuantityError::Fractional));
    assert_eq!(whole_quantity("1.1.1"), Err(QuantityError::Invalid));
    assert_eq!(whole_quantity(""), Err(QuantityError::Invalid));
    assert_eq!(whole_quantity("inf"), Err(QuantityError::Invalid));
    assert_eq!(whole_quantity("1 "), Err(QuantityError::Invalid));
    assert_eq!(whole_quantity("1e999999"), Err(QuantityError::TooLarge));
    assert_eq!(whole_quantity("-3"), Err(QuantityError::Negative));
}

#[test]
fn an_unknown_allocation_mode_is_an_error_naming_its_path() {
    let rc = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "Some"}}]}}});
    assert_eq!(
        error_text(&rc),
        "spec.devices.requests[0].exactly.allocationMode: expected ExactCount or All, found \"Some\""
    );
}

#[test]
fn a_kind_that_is_not_a_string_is_an_error() {
    assert_eq!(
        error_text(&json!({"apiVersion": "v1", "kind": 7})),
        "kind: expected a string, found 7"
    );
}

// --- no input makes it panic ---

fn arb_json() -> impl Strategy<Value = Value> {
    let strings = prop::sample::select(vec![
        "1",
        "2",
        "-1",
        "0.5",
        "500m",
        "1k",
        "4.0",
        "1e3",
        "1e999",
        "Always",
        "All",
        "ExactCount",
        "gpu.example.com",
        "gpu.nvidia.com",
        "nvidia.com/gpu",
        "Worker",
        "",
        "x",
        "1Ei",
        "99999999999999999999999999999999999999999",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..10).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        strings.prop_map(Value::from),
    ];
    let keys = prop::sample::select(vec![
        "spec",
        "template",
        "metadata",
        "labels",
        "ownerReferences",
        "controller",
        "kind",
        "name",
        "containers",
        "initContainers",
        "restartPolicy",
        "resources",
        "limits",
        "requests",
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.5gb",
        "replicas",
        "parallelism",
        "replicatedJobs",
        "jobTemplate",
        "headGroupSpec",
        "workerGroupSpecs",
        "minReplicas",
        "maxReplicas",
        "numOfHosts",
        "enableInTreeAutoscaling",
        "rayClusterSpec",
        "pytorchReplicaSpecs",
        "Worker",
        "elasticPolicy",
        "trainer",
        "numNodes",
        "resourcesPerNode",
        "predictor",
        "model",
        "workerSpec",
        "pipelineParallelSize",
        "worker",
        "prefill",
        "data",
        "dataLocal",
        "pipeline",
        "leaderWorkerTemplate",
        "leaderTemplate",
        "workerTemplate",
        "size",
        "devices",
        "exactly",
        "firstAvailable",
        "deviceClassName",
        "allocationMode",
        "count",
        "adminAccess",
        "resourceClaims",
        "resourceClaimTemplateName",
        "source",
    ]);
    leaf.prop_recursive(7, 200, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..6).prop_map(|m| {
                Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

fn arb_object() -> impl Strategy<Value = Value> {
    let kinds = prop::sample::select(vec![
        ("v1", "Pod"),
        ("apps/v1", "Deployment"),
        ("batch/v1", "Job"),
        ("batch/v1", "CronJob"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("ray.io/v1", "RayCluster"),
        ("ray.io/v1", "RayJob"),
        ("ray.io/v1", "RayService"),
        ("kubeflow.org/v1", "PyTorchJob"),
        ("kubeflow.org/v1", "Notebook"),
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
        ("serving.kserve.io/v1beta1", "InferenceService"),
        ("serving.kserve.io/v1alpha2", "LLMInferenceService"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
        ("resource.k8s.io/v1", "ResourceClaim"),
        ("resource.k8s.io/v1", "ResourceClaimTemplate"),
        ("v1", "ConfigMap"),
    ]);
    prop_oneof![
        (kinds, arb_json(), arb_json()).prop_map(|((api_version, kind), metadata, spec)| {
            json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
        }),
        arb_json(),
    ]
}

/// Every document of the manifest fixtures, to mutate.
fn fixture_documents() -> Vec<Value> {
    [
        *JOBSET,
        *CLAIM_TEMPLATE,
        fixture("kserve__storage_hf_hf_isvc.yaml"),
        fixture("kserve__llmisvc_single-node-gpu_llm-inference-service-qwen2-7b-gpu.yaml"),
        fixture("kuberay__ray-service.llm-serve.yaml"),
        fixture("kueue__provisioning_sample-job.yaml"),
        fixture("kueue__serving-workloads_sample-hami.yaml"),
        fixture("kueue__serving-workloads_sample-leaderworkerset-tas.yaml"),
        fixture("training-operator-release-1.9__pytorch_job_mnist_nccl.yaml"),
    ]
    .into_iter()
    .flat_map(documents)
    .collect()
}

/// Replaces the `n`-th node (depth first) of `v` with `with`; false when `v` has fewer.
fn replace_nth(v: &mut Value, n: &mut usize, with: &Value) -> bool {
    if *n == 0 {
        *v = with.clone();
        return true;
    }
    *n -= 1;
    match v {
        Value::Array(items) => items.iter_mut().any(|item| replace_nth(item, n, with)),
        Value::Object(map) => map.values_mut().any(|item| replace_nth(item, n, with)),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn counting_mutated_fixtures_never_panics_and_claims_are_finite(
        doc in any::<prop::sample::Index>(),
        node in 0usize..200,
        with in arb_json(),
    ) {
        let docs = fixture_documents();
        let mut object = doc.get(&docs).clone();
        let mut n = node;
        replace_nth(&mut object, &mut n, &with);
        if let Ok(Counted::Claim(c)) = count(&object, "default", &GpuResources::default(), &()) {
            prop_assert!(c.gpus.is_finite() && c.gpus >= 0.0, "{}", c.gpus);
        }
    }

    #[test]
    fn counting_any_object_never_panics_and_claims_are_finite(object in arb_object()) {
        let templates: HashMap<(String, String), f64> =
            HashMap::from([(("default".to_string(), "x".to_string()), 2.0)]);
        if let Ok(Counted::Claim(c)) = count(&object, "default", &GpuResources::default(), &templates) {
            prop_assert!(c.gpus.is_finite() && c.gpus >= 0.0, "{}", c.gpus);
            prop_assert!(!c.label_sets.is_empty());
        }
    }
}
