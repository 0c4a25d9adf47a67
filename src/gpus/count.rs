//! Counting one object: the kind's shape, the running tally, and what cannot be counted.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{Map, Value};

use super::fields::*;
use super::kinds::*;
use super::pod::*;
use super::quantity::*;
use super::tally::*;
use super::*;

/// Counts the GPUs `object` (a full Kubernetes object as JSON) claims. `namespace` is the
/// request's namespace (for claim template lookup).
///
/// Kinds are matched by API group and kind, any version; the largest size each allows:
/// - `Pod`: its spec.
/// - apps `Deployment`, `StatefulSet`, `ReplicaSet`, core `ReplicationController`:
///   `spec.replicas` (default 1) × pod.
/// - apps `DaemonSet`: one pod per node that offers GPUs (as the caches know them); when
///   that number is unknown the claim is open-ended.
/// - batch `Job`: `spec.parallelism` (default 1) × pod; `CronJob`: the same for one run
///   of `spec.jobTemplate` when `concurrencyPolicy` is `Forbid` or `Replace`; with
///   `Allow` (the default) runs may pile up without bound, so the claim is open-ended.
/// - jobset.x-k8s.io `JobSet`: Σ replicatedJobs replicas × parallelism × pod.
/// - ray.io `RayCluster`: head + Σ worker groups replicas × numOfHosts × pod, the
///   replicas as KubeRay sets them: `replicas` (absent: `minReplicas`, both absent: 1)
///   kept within [`minReplicas`, `maxReplicas`]; with `enableInTreeAutoscaling` the
///   autoscaler may reach `maxReplicas`, so that is counted — unless it is the CRD's
///   default 2147483647 ("no bound"), which is ignored (the basis says so). `RayJob`:
///   the same over `spec.rayClusterSpec` (absent: 0, it runs on an existing cluster);
///   `RayService`: over `spec.rayClusterConfig`.
/// - kubeflow.org `PyTorchJob`, `TFJob`, `MPIJob`, `XGBoostJob`, `PaddleJob`, `JAXJob`:
///   Σ over every `spec.*ReplicaSpecs` entry replicas (default 1) × pod; the `Worker`
///   entry counts `max(replicas, spec.elasticPolicy.maxReplicas)`. `Notebook`: one pod.
/// - trainer.kubeflow.org `TrainJob`: `spec.trainer.numNodes` (default 1) ×
///   `spec.trainer.resourcesPerNode`. GPUs set only in the training runtime are not seen.
/// - serving.kserve.io `InferenceService`: per component (predictor, transformer,
///   explainer) max(maxReplicas, minReplicas, 1) × (its pod fields + each child object
///   with `resources`, the framework shorthand `model`, `pytorch`, … being one container;
///   a multi-node `workerSpec` adds pipelineParallelSize − 1 worker pods, at least one).
///   GPUs set only in a ServingRuntime are not seen.
/// - serving.kserve.io `LLMInferenceService`: as KServe deploys it. Without `spec.worker`:
///   `spec.replicas` (default 1) × `spec.template`. With `spec.worker`: a
///   LeaderWorkerSet of `spec.replicas` groups, each the leader (`spec.template`, else a
///   worker) + (size − 1) workers, size from `spec.parallelism` as KServe computes it:
///   max(data / dataLocal, 1) with data parallelism, else `pipeline`, else 1. The same
///   again for `spec.prefill`. Templates inherited through `baseRefs` are not seen.
/// - leaderworkerset.x-k8s.io `LeaderWorkerSet`: `spec.replicas` (default 1) × (leader
///   (else a worker) + (size − 1) workers), size default 1.
/// - resource.k8s.io `ResourceClaim` (`spec.devices.requests`) and
///   `ResourceClaimTemplate` (`spec.spec.devices.requests`, the count of each claim made
///   from it): per request `count` (default 1) devices of a GPU class,
///   `allocationMode: All` → `dra_all_gpus`, `firstAvailable` → the largest alternative,
///   `adminAccess` → 0 (it allocates nothing). v1 (`exactly`) and v1beta1 (flat) shapes.
/// - Pod templates may also ask for a fraction of a GPU through KAI's `gpu-fraction`
///   annotation ([`KAI_GPU_FRACTION`]).
/// - kueue.x-k8s.io `Workload`, core `PodTemplate`, apps `ControllerRevision` are
///   [`Counted::NotGoverned`]: they create no pods (Kueue makes Workloads for jobs that
///   were already gated). Any other kind is not governed unless it asks for GPUs
///   somewhere (a `resources.limits`/`requests` naming a GPU resource): then it is a
///   claim the gate cannot count, open-ended (G6: never "no claim").
pub fn count(
    object: &Value,
    namespace: &str,
    resources: &GpuResources,
    templates: &dyn ClaimTemplates,
) -> Result<Counted, CountError> {
    let Some(obj) = object.as_object() else {
        return Ok(Counted::NotGoverned);
    };
    let (Some(api_version), Some(kind)) =
        (opt_str(obj, "apiVersion", "")?, opt_str(obj, "kind", "")?)
    else {
        return Ok(Counted::NotGoverned);
    };
    let group = api_version.split_once('/').map_or("", |(group, _)| group);
    let Some(shape) = Shape::of(group, kind) else {
        return uncountable(obj, group, kind, resources);
    };
    if let Some((kind, name)) = controller_owner(obj)? {
        return Ok(Counted::OwnedBy { kind, name });
    }
    let ctx = Ctx {
        namespace,
        resources,
        templates,
    };
    let mut tally = Tally {
        ctx: &ctx,
        gpus: 0.0,
        parts: Vec::new(),
        label_sets: Vec::new(),
        seen_labels: HashMap::new(),
        unresolved: Vec::new(),
        unresolved_claims: Vec::new(),
        unresolved_seen: HashSet::new(),
        named_claims: HashSet::new(),
        named_claim_gpus: 0.0,
        open_ended: None,
        device_grants: Vec::new(),
    };
    let own_labels = labels_of(obj, "")?;
    tally.label_sets.push(own_labels);
    tally
        .seen_labels
        .insert(label_hash(&tally.label_sets[0]), vec![0]);
    let empty = Map::new();
    let spec = opt_object(obj, "spec", "")?.unwrap_or(&empty);
    match shape {
        Shape::Pod => {
            let g = tally.pod_spec(obj.get("spec"), "spec", 0.0)?;
            let g = g + kai_fraction(obj, "")?;
            tally.add(g, format!("1 pod × {}", gpus_text(g)));
        }
        Shape::DaemonSet => {
            let g = tally.pod_template(spec.get("template"), "spec.template")?;
            match ctx.templates.gpu_nodes() {
                Some(nodes) => tally.add(
                    nodes as f64 * g,
                    format!(
                        "1 pod on each of {} × {}",
                        n_text(nodes, "GPU node"),
                        gpus_text(g)
                    ),
                ),
                None => {
                    tally.add(g, format!("1 pod per node × {}", gpus_text(g)));
                    if g > 0.0 {
                        tally.open_ended = Some(
                            "a DaemonSet runs one pod on every node it fits and the gate does not know how many nodes offer GPUs".to_string(),
                        );
                    }
                }
            }
        }
        Shape::Replicated => {
            let replicas = opt_count(spec, "replicas", "spec")?.unwrap_or(1);
            let g = tally.pod_template(spec.get("template"), "spec.template")?;
            tally.add(
                replicas as f64 * g,
                format!("{} × {}", n_text(replicas, "replica"), gpus_text(g)),
            );
        }
        Shape::Job => job(&mut tally, spec, "spec", "")?,
        Shape::CronJob => {
            let job_template = opt_object(spec, "jobTemplate", "spec")?.unwrap_or(&empty);
            let job_spec = opt_object(job_template, "spec", "spec.jobTemplate")?.unwrap_or(&empty);
            let labels = labels_of(job_template, "spec.jobTemplate")?;
            tally.add_labels(labels);
            let before = tally.gpus;
            job(&mut tally, job_spec, "spec.jobTemplate.spec", " per run")?;
            let policy = opt_str(spec, "concurrencyPolicy", "spec")?.unwrap_or("Allow");
            match policy {
                "Forbid" | "Replace" => {}
                "Allow" if tally.gpus > before => {
                    tally.open_ended = Some(
                        "its spec.concurrencyPolicy is Allow, so a run starts on every schedule while earlier runs still hold their GPUs; set it to Forbid or Replace".to_string(),
                    );
                }
                "Allow" => {}
                other => {
                    return Err(problem(
                        "spec.concurrencyPolicy",
                        format!(
                            "expected Allow, Forbid or Replace, found {}",
                            found(&Value::from(other))
                        ),
                    ));
                }
            }
        }
        Shape::JobSet => jobset(&mut tally, spec)?,
        Shape::RayCluster => ray_cluster(&mut tally, spec, "spec")?,
        Shape::RayJob | Shape::RayService => {
            let key = if shape == Shape::RayJob {
                "rayClusterSpec"
            } else {
                "rayClusterConfig"
            };
            match opt_object(spec, key, "spec")? {
                Some(cluster) => ray_cluster(&mut tally, cluster, &join("spec", key))?,
                None => tally.add(
                    0.0,
                    format!("no spec.{key}: runs on an existing RayCluster"),
                ),
            }
        }
        Shape::KubeflowReplicas => kubeflow_replicas(&mut tally, spec)?,
        Shape::Notebook => {
            let g = tally.pod_template(spec.get("template"), "spec.template")?;
            tally.add(g, format!("1 pod × {}", gpus_text(g)));
        }
        Shape::TrainJob => train_job(&mut tally, spec)?,
        Shape::InferenceService => inference_service(&mut tally, spec)?,
        Shape::LlmInferenceService => {
            llm_workload(&mut tally, spec, "spec", "")?;
            if let Some(prefill) = opt_object(spec, "prefill", "spec")? {
                llm_workload(&mut tally, prefill, "spec.prefill", "prefill ")?;
            }
        }
        Shape::LeaderWorkerSet => leader_worker_set(&mut tally, spec)?,
        Shape::ResourceClaim => claim_requests(&mut tally, spec, "spec", "")?,
        Shape::ResourceClaimTemplate => {
            let claim_spec = opt_object(spec, "spec", "spec")?.unwrap_or(&empty);
            let labels = labels_of(claim_spec, "spec")?;
            tally.add_labels(labels);
            claim_requests(&mut tally, claim_spec, "spec.spec", "each claim: ")?;
        }
    }
    tally.finish()
}

/// GPUs one pod spec claims, and the DRA claim templates it uses that `templates` does not
/// know (not counted).
///
/// max(main containers + sidecars (init containers with `restartPolicy: Always`), the init
/// phase), where the init phase peaks at each plain init container plus the sidecars
/// started before it, as the scheduler computes it. Per GPU resource, the larger of
/// requests and limits (an extended resource's limit implies its request). DRA: each
/// `spec.resourceClaims[]` with `resourceClaimTemplateName` (or the pre-1.28
/// `source.resourceClaimTemplateName`) adds the template's GPUs, since every pod gets its
/// own claim. A `resourceClaimName` names a claim shared by pods: not counted here (the
/// budget gate's [`count`] adds each named claim once per object, from the caches).
/// `path` is the JSON path of the pod spec, for errors.
pub fn pod_spec_gpus(
    spec: &Value,
    path: &str,
    namespace: &str,
    resources: &GpuResources,
    templates: &dyn ClaimTemplates,
) -> Result<(f64, Vec<String>), CountError> {
    let ctx = Ctx {
        namespace,
        resources,
        templates,
    };
    pod_gpus(&ctx, spec, path, 0.0)
}

/// GPUs a pod holds through its containers and KAI's sharing annotations, whoever owns
/// it (its DRA claims are counted as ResourceClaims). `pod` is the whole pod as JSON.
pub fn pod_object_gpus(
    pod: &Value,
    namespace: &str,
    resources: &GpuResources,
) -> Result<f64, CountError> {
    let ctx = Ctx {
        namespace,
        resources,
        templates: &(),
    };
    let (gpus, _) = pod_gpus(&ctx, &pod["spec"], "spec", 0.0)?;
    let kai = match pod.as_object() {
        Some(obj) => kai_fraction(obj, "")?,
        None => 0.0,
    };
    Ok(gpus + kai)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Shape {
    Pod,
    Replicated,
    DaemonSet,
    Job,
    CronJob,
    JobSet,
    RayCluster,
    RayJob,
    RayService,
    KubeflowReplicas,
    Notebook,
    TrainJob,
    InferenceService,
    LlmInferenceService,
    LeaderWorkerSet,
    ResourceClaim,
    ResourceClaimTemplate,
}

impl Shape {
    pub(super) fn of(group: &str, kind: &str) -> Option<Shape> {
        Some(match (group, kind) {
            ("", "Pod") => Shape::Pod,
            ("apps", "Deployment" | "StatefulSet" | "ReplicaSet") => Shape::Replicated,
            ("", "ReplicationController") => Shape::Replicated,
            ("apps", "DaemonSet") => Shape::DaemonSet,
            ("batch", "Job") => Shape::Job,
            ("batch", "CronJob") => Shape::CronJob,
            ("jobset.x-k8s.io", "JobSet") => Shape::JobSet,
            ("ray.io", "RayCluster") => Shape::RayCluster,
            ("ray.io", "RayJob") => Shape::RayJob,
            ("ray.io", "RayService") => Shape::RayService,
            (
                "kubeflow.org",
                "PyTorchJob" | "TFJob" | "MPIJob" | "XGBoostJob" | "PaddleJob" | "JAXJob",
            ) => Shape::KubeflowReplicas,
            ("kubeflow.org", "Notebook") => Shape::Notebook,
            ("trainer.kubeflow.org", "TrainJob") => Shape::TrainJob,
            ("serving.kserve.io", "InferenceService") => Shape::InferenceService,
            ("serving.kserve.io", "LLMInferenceService") => Shape::LlmInferenceService,
            ("leaderworkerset.x-k8s.io", "LeaderWorkerSet") => Shape::LeaderWorkerSet,
            ("resource.k8s.io", "ResourceClaim") => Shape::ResourceClaim,
            ("resource.k8s.io", "ResourceClaimTemplate") => Shape::ResourceClaimTemplate,
            _ => return None,
        })
    }
}

/// A kind [`Shape::of`] does not know: not governed, unless it asks for GPUs in a
/// `resources` somewhere, which the gate cannot multiply out — an open-ended claim.
pub(super) fn uncountable(
    obj: &Map<String, Value>,
    group: &str,
    kind: &str,
    resources: &GpuResources,
) -> Result<Counted, CountError> {
    // They create no pods of their own: Kueue's Workloads mirror jobs already gated.
    if matches!(
        (group, kind),
        ("kueue.x-k8s.io", "Workload") | ("", "PodTemplate") | ("apps", "ControllerRevision")
    ) {
        return Ok(Counted::NotGoverned);
    }
    let Some(spec) = present(obj, "spec") else {
        return Ok(Counted::NotGoverned);
    };
    let gpus = gpus_anywhere(spec, resources, 0);
    if gpus <= 0.0 {
        return Ok(Counted::NotGoverned);
    }
    let label_sets = vec![labels_of(obj, "").unwrap_or_default()];
    Ok(Counted::Claim(Claim {
        gpus,
        label_sets,
        basis: format!("{} in its resources", gpus_text(gpus)),
        unresolved_claim_templates: Vec::new(),
        named_claim_gpus: 0.0,
        unresolved_claims: Vec::new(),
        open_ended: Some(format!(
            "the GPU budget gate cannot count the pods a {kind} ({}) runs",
            if group.is_empty() { "core" } else { group }
        )),
        device_grants: Vec::new(),
    }))
}

/// The GPU units named in every `resources.limits`/`requests` under `v`, each entry the
/// larger of the two; unreadable quantities count one. Linear in the size of `v`.
pub(super) fn gpus_anywhere(v: &Value, resources: &GpuResources, depth: usize) -> f64 {
    // serde_json refuses documents nested deeper than 128.
    if depth > 128 {
        return 0.0;
    }
    match v {
        Value::Object(map) => {
            let mut total = 0.0;
            for (key, child) in map {
                if key == "resources"
                    && let Some(res) = child.as_object()
                {
                    let mut per_name: HashMap<&str, f64> = HashMap::new();
                    for field in ["limits", "requests"] {
                        for (name, q) in res
                            .get(field)
                            .and_then(Value::as_object)
                            .into_iter()
                            .flatten()
                        {
                            if let Some(share) = resources.share_of(name) {
                                let units = device_count(q, "").unwrap_or(1.0) * share;
                                let e = per_name.entry(name.as_str()).or_insert(0.0);
                                *e = e.max(units);
                            }
                        }
                    }
                    total += per_name.values().sum::<f64>();
                }
                total += gpus_anywhere(child, resources, depth + 1);
            }
            total
        }
        Value::Array(items) => items
            .iter()
            .map(|i| gpus_anywhere(i, resources, depth + 1))
            .sum(),
        _ => 0.0,
    }
}

/// GPUs per pod of each DRA ResourceClaimTemplate, by (namespace, name). Clusters that do
/// not serve resource.k8s.io/v1 have none.
pub fn claim_template_gpus<'a>(
    templates: impl Iterator<Item = &'a ResourceClaimTemplate>,
    resources: &GpuResources,
) -> HashMap<(String, String), f64> {
    let mut out = HashMap::new();
    for t in templates {
        let (Some(ns), Some(name)) = (t.metadata.namespace.clone(), t.metadata.name.clone()) else {
            continue;
        };
        let Ok(mut value) = serde_json::to_value(t) else {
            continue;
        };
        value["apiVersion"] = "resource.k8s.io/v1".into();
        value["kind"] = "ResourceClaimTemplate".into();
        if let Ok(Counted::Claim(claim)) = count(&value, &ns, resources, &()) {
            out.insert((ns, name), claim.gpus);
        }
    }
    out
}
