//! How many GPUs an object claims, for every kind the budget gate governs.
//!
//! Pure: reads the object the API server sends (JSON: apiVersion, kind, metadata, spec) and
//! never calls out. DRA claim templates are resolved through the [`ClaimTemplates`] the
//! caller passes (the webhook's cache).
//!
//! Counting rules, in short:
//! - A pod: the larger of its running containers (main + sidecar init containers) and its
//!   init phase, per GPU resource the larger of requests and limits, plus its DRA claims
//!   made from templates (see [`pod_spec_gpus`]).
//! - A workload: pods × the largest number of pods it can run at once, per kind (see
//!   [`count`]). A MIG slice counts as its share of a GPU.
//! - Anything created by a controller (a controller ownerReference) is counted at its
//!   owner, never twice: [`Counted::OwnedBy`].
//! - A field of the wrong type is a [`CountError`] naming its path; missing optional
//!   fields take the API's defaults.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;

use serde_json::{Map, Value};

/// The GPU resources every part of gpu-reaper counts by default: the binary's flags, the
/// Helm chart's `gpu.resources` (a test keeps them equal) and `gpu-reaper check`. An entry
/// ending in `*` is a prefix. `nvidia.com/mig-*` slices count their share of a GPU (see
/// [`GpuResources::mig_prefix`]); every other unit is one whole GPU — a time-sliced
/// `nvidia.com/gpu.shared` replica too, since the gate cannot know how many replicas
/// share a device and must never count low.
pub const DEFAULT_GPU_RESOURCES: [&str; 8] = [
    "nvidia.com/gpu",
    "nvidia.com/mig-*",
    "nvidia.com/gpu.shared",
    "amd.com/gpu",
    "gpu.intel.com/*",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron",
    "google.com/tpu",
];

/// DRA device classes whose devices are GPUs, by default: NVIDIA's (`gpu.nvidia.com`,
/// `mig.nvidia.com`), AMD's, Intel's GPU and Gaudi drivers, and `gpu.example.com` (the
/// class the upstream DRA examples use).
pub const DEFAULT_GPU_DEVICE_CLASSES: [&str; 6] = [
    "gpu.nvidia.com",
    "mig.nvidia.com",
    "gpu.amd.com",
    "gpu.intel.com",
    "gaudi.intel.com",
    "gpu.example.com",
];

/// Resources under a GPU prefix that are not devices: Intel's GPU plugin advertises
/// shares of a device (`millicores`, 1000 per GPU; `memory.max`, bytes; `tiles`) next to
/// the device count `gpu.intel.com/i915` (or `xe`) that a pod asks for with them.
const NOT_DEVICES: [&str; 3] = [
    "gpu.intel.com/millicores",
    "gpu.intel.com/memory.max",
    "gpu.intel.com/tiles",
];

/// The KAI scheduler's GPU-sharing annotations on a pod (template): `gpu-fraction` asks
/// for that fraction of a GPU (times `gpu-fraction-num-devices`, default 1);
/// `gpu-memory` asks for memory of one shared GPU, counted as one GPU (its share of a
/// device is only known at scheduling).
pub const KAI_GPU_FRACTION: &str = "gpu-fraction";
/// See [`KAI_GPU_FRACTION`].
pub const KAI_GPU_FRACTION_DEVICES: &str = "gpu-fraction-num-devices";
/// See [`KAI_GPU_FRACTION`].
pub const KAI_GPU_MEMORY: &str = "gpu-memory";

/// Which resources are GPUs, and how much of a GPU each unit is.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuResources {
    /// Extended resources counted as one GPU per unit; an entry ending in `*` is a
    /// prefix. Default: [`DEFAULT_GPU_RESOURCES`].
    pub whole: Vec<String>,
    /// Prefix of MIG slice resources, `nvidia.com/mig-<N>g.<M>gb` (default
    /// `nvidia.com/mig-`). One unit counts N / `mig_slices_per_gpu` of a GPU (at most one
    /// GPU). N is read from the first `<N>g` segment, so `1c.3g.20gb` (a compute instance
    /// of a 3g slice) counts 3 and `1g.10gb+me` counts 1. A name with no readable `<N>g`
    /// counts as a whole GPU, the same rule as idle-time prices
    /// ([`crate::engine::cost::mig_profile_share`]): never under-counted.
    pub mig_prefix: String,
    /// Compute slices per physical GPU (7 on A100/H100). Not a positive number: every MIG
    /// unit counts as a whole GPU.
    pub mig_slices_per_gpu: f64,
    /// DRA device classes whose devices are GPUs, one GPU per device. Default:
    /// [`DEFAULT_GPU_DEVICE_CLASSES`]. A `mig.nvidia.com` device counts as a whole GPU:
    /// its profile is only chosen at allocation.
    pub device_classes: Vec<String>,
    /// What a DRA request with `allocationMode: All` counts as (its size is only known at
    /// allocation). Default 8.
    pub dra_all_gpus: f64,
}

impl Default for GpuResources {
    fn default() -> Self {
        Self {
            whole: DEFAULT_GPU_RESOURCES.map(String::from).to_vec(),
            mig_prefix: "nvidia.com/mig-".to_string(),
            mig_slices_per_gpu: 7.0,
            device_classes: DEFAULT_GPU_DEVICE_CLASSES.map(String::from).to_vec(),
            dra_all_gpus: 8.0,
        }
    }
}

impl GpuResources {
    /// The share of a GPU one unit of `resource` is, `None` when it is not a GPU.
    pub fn share_of(&self, resource: &str) -> Option<f64> {
        if self.whole.iter().any(|w| w == resource) {
            return Some(1.0);
        }
        if !self.mig_prefix.is_empty()
            && let Some(profile) = resource.strip_prefix(self.mig_prefix.as_str())
        {
            // One rule with the idle-time prices: an unreadable profile is a whole GPU.
            return Some(crate::engine::cost::mig_profile_share(
                profile,
                self.mig_slices_per_gpu,
            ));
        }
        if NOT_DEVICES.contains(&resource) {
            return None;
        }
        let prefixed = self.whole.iter().any(|w| {
            w.strip_suffix('*')
                .is_some_and(|prefix| resource.starts_with(prefix))
        });
        prefixed.then_some(1.0)
    }

    fn is_gpu_class(&self, class: &str) -> bool {
        self.device_classes.iter().any(|c| c == class)
    }
}

/// What the caller's caches know that a count needs: the GPUs of DRA claim templates
/// ((namespace, template name) → GPUs per pod) and of existing ResourceClaims a pod names,
/// and how many nodes offer GPUs (a DaemonSet runs one pod on each). `None`: unknown.
pub trait ClaimTemplates {
    fn gpus(&self, namespace: &str, name: &str) -> Option<f64>;

    /// GPUs of the existing ResourceClaim `namespace/name`.
    fn claim_gpus(&self, _namespace: &str, _name: &str) -> Option<f64> {
        None
    }

    /// Nodes that offer GPUs.
    fn gpu_nodes(&self) -> Option<u64> {
        None
    }
}

/// Knows no template: every template a pod uses is reported unresolved.
impl ClaimTemplates for () {
    fn gpus(&self, _namespace: &str, _name: &str) -> Option<f64> {
        None
    }
}

/// Keyed by (namespace, name).
impl ClaimTemplates for HashMap<(String, String), f64> {
    fn gpus(&self, namespace: &str, name: &str) -> Option<f64> {
        self.get(&(namespace.to_string(), name.to_string()))
            .copied()
    }
}

/// What an object claims.
#[derive(Clone, Debug, PartialEq)]
pub enum Counted {
    /// The kind never claims GPUs (ConfigMap, Service, …) or is unknown: not gated.
    NotGoverned,
    /// Created by a controller (an ownerReference with `controller: true`): a pod of a
    /// ReplicaSet, a ReplicaSet of a Deployment, the Jobs of a JobSet, the RayCluster of a
    /// RayJob… Gated at its owner, not twice. The reference is taken as written: whether
    /// to trust an owner of a kind that is not governed is the caller's decision.
    OwnedBy { kind: String, name: String },
    /// The object claims `gpus` GPUs at its largest size.
    Claim(Claim),
}

/// A governed object's claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// GPUs claimed at once at the largest size the object allows (MIG slices as
    /// fractions).
    pub gpus: f64,
    /// Labels of the object (always first, even when empty) and of each of its pod
    /// templates that has labels (no duplicates); an attestation covers the claim when its
    /// selector matches any of these.
    pub label_sets: Vec<BTreeMap<String, String>>,
    /// How the count was made, for messages and logs, e.g. `3 replicas × 2 GPUs` or
    /// `head 0 GPUs + worker group gpu-group 1 replica × 4 GPUs`.
    pub basis: String,
    /// DRA ResourceClaimTemplates the pods use that could not be resolved (names), so the
    /// caller can say the count may be low.
    pub unresolved_claim_templates: Vec<String>,
    /// GPUs of existing ResourceClaims the pods name (included in `gpus`): the namespace
    /// already holds those from when each claim was created, so a total adds only the rest.
    pub named_claim_gpus: f64,
    /// Existing ResourceClaims a pod names that are not known (names): counted 0.
    pub unresolved_claims: Vec<String>,
    /// Why the object may run more than `gpus` GPUs with no bound the gate can see (a
    /// DaemonSet on an unknown number of nodes, a CronJob whose runs may overlap, a kind
    /// the gate cannot count). Such a claim is above every allowance: fail closed.
    pub open_ended: Option<String>,
}

/// A field of the object that cannot be read. Display: `<path>: <problem>`, e.g.
/// `spec.replicas: expected a non-negative integer, found "three"`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct CountError {
    pub path: String,
    pub problem: String,
}

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
        named_claims: HashSet::new(),
        named_claim_gpus: 0.0,
        open_ended: None,
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
enum Shape {
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
    fn of(group: &str, kind: &str) -> Option<Shape> {
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

/// A hash of a label set, for [`Tally::add_labels`] (equal sets are compared in full).
fn label_hash(labels: &BTreeMap<String, String>) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(labels)
}

struct Ctx<'a> {
    namespace: &'a str,
    resources: &'a GpuResources,
    templates: &'a dyn ClaimTemplates,
}

/// The running count of one object: GPUs, basis parts, label sets, unresolved templates.
struct Tally<'a> {
    ctx: &'a Ctx<'a>,
    gpus: f64,
    parts: Vec<String>,
    label_sets: Vec<BTreeMap<String, String>>,
    /// Where the label sets already in `label_sets` are, by hash: de-duplication stays
    /// linear however many pod templates an object has (a 1.5 MiB PyTorchJob of thousands
    /// of roles), without a second copy of each set.
    seen_labels: HashMap<u64, Vec<usize>>,
    unresolved: Vec<String>,
    unresolved_claims: Vec<String>,
    named_claims: HashSet<String>,
    named_claim_gpus: f64,
    open_ended: Option<String>,
}

impl Tally<'_> {
    fn add(&mut self, gpus: f64, part: String) {
        self.gpus += gpus;
        self.parts.push(part);
    }

    fn add_labels(&mut self, labels: BTreeMap<String, String>) {
        if labels.is_empty() {
            return;
        }
        let at = self.seen_labels.entry(label_hash(&labels)).or_default();
        if at.iter().any(|&i| self.label_sets[i] == labels) {
            return;
        }
        at.push(self.label_sets.len());
        self.label_sets.push(labels);
    }

    /// GPUs of one pod of a pod template (`metadata` + `spec`) at `path`; keeps its labels.
    fn pod_template(&mut self, template: Option<&Value>, path: &str) -> Result<f64, CountError> {
        let Some(template) = template.filter(|t| !t.is_null()) else {
            return Ok(0.0);
        };
        let template = object_at(template, path)?;
        let labels = labels_of(template, path)?;
        self.add_labels(labels);
        let g = self.pod_spec(template.get("spec"), &join(path, "spec"), 0.0)?;
        Ok(g + kai_fraction(template, path)?)
    }

    /// GPUs of one pod of a bare pod spec at `path`, plus `extra` main-container GPUs.
    fn pod_spec(
        &mut self,
        spec: Option<&Value>,
        path: &str,
        extra: f64,
    ) -> Result<f64, CountError> {
        let pod = pod_gpus_detailed(self.ctx, spec.unwrap_or(&Value::Null), path, extra)?;
        for name in pod.unresolved_templates {
            if !self.unresolved.contains(&name) {
                self.unresolved.push(name);
            }
        }
        for name in pod.unresolved_claims {
            if !self.unresolved_claims.contains(&name) {
                self.unresolved_claims.push(name);
            }
        }
        for (name, g) in pod.named_claims {
            if self.named_claims.insert(name.clone()) {
                self.named_claim_gpus += g;
                self.add(g, format!("ResourceClaim {name} {}", gpus_text(g)));
            }
        }
        Ok(pod.gpus)
    }

    fn finish(self) -> Result<Counted, CountError> {
        if !(self.gpus.is_finite() && self.gpus >= 0.0) {
            return Err(problem(
                "spec",
                "the GPU count is not a finite, non-negative number".to_string(),
            ));
        }
        let basis = if self.parts.is_empty() {
            "no pods".to_string()
        } else {
            self.parts.join(" + ")
        };
        Ok(Counted::Claim(Claim {
            gpus: self.gpus,
            label_sets: self.label_sets,
            basis,
            unresolved_claim_templates: self.unresolved,
            named_claim_gpus: self.named_claim_gpus.min(self.gpus),
            unresolved_claims: self.unresolved_claims,
            open_ended: self.open_ended,
        }))
    }
}

fn job(
    tally: &mut Tally,
    spec: &Map<String, Value>,
    path: &str,
    suffix: &str,
) -> Result<(), CountError> {
    let parallelism = opt_count(spec, "parallelism", path)?.unwrap_or(1);
    let g = tally.pod_template(spec.get("template"), &join(path, "template"))?;
    tally.add(
        parallelism as f64 * g,
        format!("parallelism {parallelism} × {}{suffix}", gpus_text(g)),
    );
    Ok(())
}

fn jobset(tally: &mut Tally, spec: &Map<String, Value>) -> Result<(), CountError> {
    let empty = Map::new();
    for (i, replicated) in opt_list(spec, "replicatedJobs", "spec")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("spec.replicatedJobs[{i}]");
        let replicated = object_at(replicated, &path)?;
        let name =
            opt_str(replicated, "name", &path)?.map_or_else(|| format!("#{i}"), str::to_string);
        let replicas = opt_count(replicated, "replicas", &path)?.unwrap_or(1);
        let template_path = join(&path, "template");
        let template = opt_object(replicated, "template", &path)?.unwrap_or(&empty);
        let job_path = join(&template_path, "spec");
        let job_spec = opt_object(template, "spec", &template_path)?.unwrap_or(&empty);
        let parallelism = opt_count(job_spec, "parallelism", &job_path)?.unwrap_or(1);
        let g = tally.pod_template(job_spec.get("template"), &join(&job_path, "template"))?;
        tally.add(
            replicas as f64 * parallelism as f64 * g,
            format!(
                "{name} {} × {} × {}",
                n_text(replicas, "replica"),
                n_text(parallelism, "pod"),
                gpus_text(g)
            ),
        );
    }
    Ok(())
}

fn ray_cluster(tally: &mut Tally, spec: &Map<String, Value>, path: &str) -> Result<(), CountError> {
    let head_path = join(path, "headGroupSpec");
    let head = match opt_object(spec, "headGroupSpec", path)? {
        Some(head) => tally.pod_template(head.get("template"), &join(&head_path, "template"))?,
        None => 0.0,
    };
    tally.add(head, format!("head {}", gpus_text(head)));
    let autoscaling = opt_bool(spec, "enableInTreeAutoscaling", path)?.unwrap_or(false);
    for (i, group) in opt_list(spec, "workerGroupSpecs", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("{path}.workerGroupSpecs[{i}]");
        let group = object_at(group, &path)?;
        let name =
            opt_str(group, "groupName", &path)?.map_or_else(|| format!("#{i}"), str::to_string);
        let replicas = opt_count(group, "replicas", &path)?;
        let min = opt_count(group, "minReplicas", &path)?;
        let max = opt_count(group, "maxReplicas", &path)?;
        let hosts = opt_count(group, "numOfHosts", &path)?.unwrap_or(1);
        let (pods, note) = ray_worker_replicas(replicas, min, max, autoscaling);
        let g = tally.pod_template(group.get("template"), &join(&path, "template"))?;
        let hosts_text = if hosts == 1 {
            String::new()
        } else {
            format!(" × {hosts} hosts")
        };
        tally.add(
            pods as f64 * hosts as f64 * g,
            format!(
                "worker group {name} {}{hosts_text} × {}{note}",
                n_text(pods, "replica"),
                gpus_text(g)
            ),
        );
    }
    Ok(())
}

/// Worker replicas of a Ray worker group at its largest, and a note for the basis.
fn ray_worker_replicas(
    replicas: Option<u64>,
    min: Option<u64>,
    max: Option<u64>,
    autoscaling: bool,
) -> (u64, &'static str) {
    // The CRD defaults maxReplicas to MaxInt32, meaning "no bound".
    const UNBOUNDED: u64 = i32::MAX as u64;
    let bound = max.filter(|m| *m < UNBOUNDED);
    let wanted = match (replicas, min) {
        (None, None) => 1,
        (replicas, min) => {
            let min = min.unwrap_or(0);
            replicas.unwrap_or(min).max(min)
        }
    };
    // KubeRay keeps the replicas within [min, max], and uses max when min > max.
    let desired = bound.map_or(wanted, |m| wanted.min(m));
    match (autoscaling, bound) {
        (true, Some(m)) => (m.max(desired), ""),
        (true, None) => (
            desired,
            " (autoscaling without maxReplicas: counted at replicas)",
        ),
        (false, _) => (desired, ""),
    }
}

fn kubeflow_replicas(tally: &mut Tally, spec: &Map<String, Value>) -> Result<(), CountError> {
    let elastic_max = match opt_object(spec, "elasticPolicy", "spec")? {
        Some(elastic) => opt_count(elastic, "maxReplicas", "spec.elasticPolicy")?,
        None => None,
    };
    let mut keys: Vec<&String> = spec
        .keys()
        .filter(|k| k.ends_with("ReplicaSpecs"))
        .collect();
    keys.sort();
    for key in keys {
        let path = join("spec", key);
        let Some(specs) = opt_object(spec, key, "spec")? else {
            continue;
        };
        let mut roles: Vec<(&String, &Value)> =
            specs.iter().filter(|(_, v)| !v.is_null()).collect();
        roles.sort_by(|a, b| a.0.cmp(b.0));
        for (role, replica_spec) in roles {
            let path = member(&path, role);
            let replica_spec = object_at(replica_spec, &path)?;
            let mut replicas = opt_count(replica_spec, "replicas", &path)?.unwrap_or(1);
            if role == "Worker"
                && let Some(max) = elastic_max
            {
                replicas = replicas.max(max);
            }
            let g = tally.pod_template(replica_spec.get("template"), &join(&path, "template"))?;
            tally.add(
                replicas as f64 * g,
                format!("{role} {} × {}", n_text(replicas, "replica"), gpus_text(g)),
            );
        }
    }
    Ok(())
}

fn train_job(tally: &mut Tally, spec: &Map<String, Value>) -> Result<(), CountError> {
    let Some(trainer) = opt_object(spec, "trainer", "spec")? else {
        tally.add(
            0.0,
            "no spec.trainer: the runtime's GPUs are not seen".to_string(),
        );
        return Ok(());
    };
    let nodes = opt_count(trainer, "numNodes", "spec.trainer")?.unwrap_or(1);
    let g = match opt_object(trainer, "resourcesPerNode", "spec.trainer")? {
        Some(res) => resources_gpus(tally.ctx, res, "spec.trainer.resourcesPerNode")?,
        None => 0.0,
    };
    tally.add(
        nodes as f64 * g,
        format!("{} × {}", n_text(nodes, "node"), gpus_text(g)),
    );
    Ok(())
}

fn inference_service(tally: &mut Tally, spec: &Map<String, Value>) -> Result<(), CountError> {
    for component in ["predictor", "transformer", "explainer"] {
        let Some(c) = opt_object(spec, component, "spec")? else {
            continue;
        };
        let path = join("spec", component);
        let min = opt_count(c, "minReplicas", &path)?.unwrap_or(0);
        let max = opt_count(c, "maxReplicas", &path)?.unwrap_or(0);
        let replicas = min.max(max).max(1);
        if let Some(labels) = opt_object(c, "labels", &path)? {
            let labels = string_map(labels, &join(&path, "labels"))?;
            tally.add_labels(labels);
        }
        // The framework shorthand (`model`, `pytorch`, `huggingface`, …) is one container.
        let mut shorthand = 0.0;
        let mut children: Vec<(&String, &Value)> = c
            .iter()
            .filter(|(k, v)| {
                !matches!(
                    k.as_str(),
                    "containers"
                        | "initContainers"
                        | "workerSpec"
                        | "labels"
                        | "annotations"
                        | "nodeSelector"
                ) && v.as_object().is_some_and(|o| o.contains_key("resources"))
            })
            .collect();
        children.sort_by(|a, b| a.0.cmp(b.0));
        for (key, child) in children {
            shorthand += container_gpus(tally.ctx, child, &join(&path, key))?;
        }
        let component_value = spec.get(component).unwrap_or(&Value::Null);
        let head = tally.pod_spec(Some(component_value), &path, shorthand)?;
        let Some(worker) = opt_object(c, "workerSpec", &path)? else {
            tally.add(
                replicas as f64 * head,
                format!(
                    "{component} {} × {}",
                    n_text(replicas, "replica"),
                    gpus_text(head)
                ),
            );
            continue;
        };
        let worker_path = join(&path, "workerSpec");
        let pipeline = opt_count(worker, "pipelineParallelSize", &worker_path)?;
        let workers = pipeline.map_or(1, |p| p.saturating_sub(1).max(1));
        let w = tally.pod_spec(c.get("workerSpec"), &worker_path, 0.0)?;
        tally.add(
            replicas as f64 * (head + workers as f64 * w),
            format!(
                "{component} {} × (head {} + {} × {})",
                n_text(replicas, "replica"),
                gpus_text(head),
                n_text(workers, "worker"),
                gpus_text(w)
            ),
        );
    }
    Ok(())
}

/// One workload of an LLMInferenceService (the main one, or `spec.prefill`).
fn llm_workload(
    tally: &mut Tally,
    spec: &Map<String, Value>,
    path: &str,
    prefix: &str,
) -> Result<(), CountError> {
    let replicas = opt_count(spec, "replicas", path)?.unwrap_or(1);
    let has_template = opt_object(spec, "template", path)?.is_some();
    let template = tally.pod_spec(spec.get("template"), &join(path, "template"), 0.0)?;
    if opt_object(spec, "worker", path)?.is_none() {
        tally.add(
            replicas as f64 * template,
            format!(
                "{prefix}{} × {}",
                n_text(replicas, "replica"),
                gpus_text(template)
            ),
        );
        return Ok(());
    }
    let worker = tally.pod_spec(spec.get("worker"), &join(path, "worker"), 0.0)?;
    let size = match opt_object(spec, "parallelism", path)? {
        Some(p) => parallelism_size(p, &join(path, "parallelism"))?,
        None => 1,
    };
    let leader = if has_template { template } else { worker };
    let workers = size.saturating_sub(1);
    tally.add(
        replicas as f64 * (leader + workers as f64 * worker),
        format!(
            "{prefix}{} × (leader {} + {} × {})",
            n_text(replicas, "replica"),
            gpus_text(leader),
            n_text(workers, "worker"),
            gpus_text(worker)
        ),
    );
    Ok(())
}

/// Pods per LeaderWorkerSet group, as KServe's `ParallelismSpec.GetSize` computes it.
fn parallelism_size(p: &Map<String, Value>, path: &str) -> Result<u64, CountError> {
    let data = opt_count(p, "data", path)?;
    let data_local = opt_count(p, "dataLocal", path)?;
    let pipeline = opt_count(p, "pipeline", path)?;
    if data.unwrap_or(0) > 0 || data_local.unwrap_or(0) > 0 {
        let data = data.unwrap_or(1).max(1);
        let local = data_local.unwrap_or(1).max(1);
        return Ok((data / local).max(1));
    }
    Ok(pipeline.filter(|p| *p > 0).unwrap_or(1))
}

fn leader_worker_set(tally: &mut Tally, spec: &Map<String, Value>) -> Result<(), CountError> {
    let replicas = opt_count(spec, "replicas", "spec")?.unwrap_or(1);
    let path = "spec.leaderWorkerTemplate";
    let empty = Map::new();
    let lwt = opt_object(spec, "leaderWorkerTemplate", "spec")?.unwrap_or(&empty);
    let size = opt_count(lwt, "size", path)?.unwrap_or(1);
    let leader = match opt_object(lwt, "leaderTemplate", path)? {
        Some(_) => {
            Some(tally.pod_template(lwt.get("leaderTemplate"), &join(path, "leaderTemplate"))?)
        }
        None => None,
    };
    let worker = tally.pod_template(lwt.get("workerTemplate"), &join(path, "workerTemplate"))?;
    let groups = n_text(replicas, "group");
    match leader {
        Some(leader) => {
            let workers = size.saturating_sub(1);
            tally.add(
                replicas as f64 * (leader + workers as f64 * worker),
                format!(
                    "{groups} × (leader {} + {} × {})",
                    gpus_text(leader),
                    n_text(workers, "worker"),
                    gpus_text(worker)
                ),
            );
        }
        None => {
            let pods = size.max(1);
            tally.add(
                replicas as f64 * pods as f64 * worker,
                format!("{groups} × {} × {}", n_text(pods, "pod"), gpus_text(worker)),
            );
        }
    }
    Ok(())
}

/// The requests of a ResourceClaimSpec at `path` (`devices.requests`).
fn claim_requests(
    tally: &mut Tally,
    claim_spec: &Map<String, Value>,
    path: &str,
    prefix: &str,
) -> Result<(), CountError> {
    let Some(devices) = opt_object(claim_spec, "devices", path)? else {
        return Ok(());
    };
    let devices_path = join(path, "devices");
    for (i, request) in opt_list(devices, "requests", &devices_path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("{devices_path}.requests[{i}]");
        let request = object_at(request, &path)?;
        let name = opt_str(request, "name", &path)?.map_or_else(|| format!("#{i}"), str::to_string);
        let g = request_gpus(tally.ctx, request, &path)?;
        tally.add(g, format!("{prefix}request {name} {}", gpus_text(g)));
    }
    Ok(())
}

fn request_gpus(ctx: &Ctx, request: &Map<String, Value>, path: &str) -> Result<f64, CountError> {
    if let Some(exactly) = opt_object(request, "exactly", path)? {
        return device_request_gpus(ctx, exactly, &join(path, "exactly"));
    }
    if let Some(alternatives) = opt_list(request, "firstAvailable", path)? {
        let mut largest: f64 = 0.0;
        for (i, alternative) in alternatives.iter().enumerate() {
            let path = format!("{path}.firstAvailable[{i}]");
            let alternative = object_at(alternative, &path)?;
            largest = largest.max(device_request_gpus(ctx, alternative, &path)?);
        }
        return Ok(largest);
    }
    // v1beta1: the request itself names the class.
    device_request_gpus(ctx, request, path)
}

/// One exact device request (v1 `exactly`, a `firstAvailable` entry, or a v1beta1 request).
fn device_request_gpus(
    ctx: &Ctx,
    request: &Map<String, Value>,
    path: &str,
) -> Result<f64, CountError> {
    let Some(class) = opt_str(request, "deviceClassName", path)? else {
        return Ok(0.0);
    };
    if !ctx.resources.is_gpu_class(class) || opt_bool(request, "adminAccess", path)? == Some(true) {
        return Ok(0.0);
    }
    match opt_str(request, "allocationMode", path)?.unwrap_or("ExactCount") {
        "ExactCount" => Ok(opt_count(request, "count", path)?.unwrap_or(1) as f64),
        "All" => Ok(ctx.resources.dra_all_gpus),
        other => Err(problem(
            &join(path, "allocationMode"),
            format!(
                "expected ExactCount or All, found {}",
                found(&Value::from(other))
            ),
        )),
    }
}

fn pod_gpus(
    ctx: &Ctx,
    spec: &Value,
    path: &str,
    extra: f64,
) -> Result<(f64, Vec<String>), CountError> {
    let pod = pod_gpus_detailed(ctx, spec, path, extra)?;
    Ok((pod.gpus, pod.unresolved_templates))
}

/// One pod spec's count. Named ResourceClaims are shared by every pod that names them, so
/// they are reported apart from `gpus` (per pod) and added once per object.
struct PodCount {
    gpus: f64,
    unresolved_templates: Vec<String>,
    named_claims: Vec<(String, f64)>,
    unresolved_claims: Vec<String>,
}

fn pod_gpus_detailed(
    ctx: &Ctx,
    spec: &Value,
    path: &str,
    extra: f64,
) -> Result<PodCount, CountError> {
    let mut out = PodCount {
        gpus: extra,
        unresolved_templates: Vec::new(),
        named_claims: Vec::new(),
        unresolved_claims: Vec::new(),
    };
    if spec.is_null() {
        return Ok(out);
    }
    let spec = object_at(spec, path)?;
    let mut main = extra;
    for (i, c) in opt_list(spec, "containers", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        main += container_gpus(ctx, c, &format!("{path}.containers[{i}]"))?;
    }
    let mut sidecars = 0.0;
    let mut init_peak: f64 = 0.0;
    for (i, c) in opt_list(spec, "initContainers", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let c_path = format!("{path}.initContainers[{i}]");
        let g = container_gpus(ctx, c, &c_path)?;
        let restartable =
            opt_str(object_at(c, &c_path)?, "restartPolicy", &c_path)? == Some("Always");
        if restartable {
            sidecars += g;
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(sidecars + g);
        }
    }
    let mut gpus = (main + sidecars).max(init_peak);
    let mut seen_templates: HashSet<&str> = HashSet::new();
    let mut seen_claims: HashSet<&str> = HashSet::new();
    for (i, claim) in opt_list(spec, "resourceClaims", path)?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let c_path = format!("{path}.resourceClaims[{i}]");
        let claim = object_at(claim, &c_path)?;
        let source = opt_object(claim, "source", &c_path)?;
        let source_path = join(&c_path, "source");
        let mut template = opt_str(claim, "resourceClaimTemplateName", &c_path)?;
        let mut named = opt_str(claim, "resourceClaimName", &c_path)?;
        if let Some(source) = source {
            if template.is_none() {
                template = opt_str(source, "resourceClaimTemplateName", &source_path)?;
            }
            if named.is_none() {
                named = opt_str(source, "resourceClaimName", &source_path)?;
            }
        }
        if let Some(name) = template {
            match ctx
                .templates
                .gpus(ctx.namespace, name)
                .filter(|g| g.is_finite() && *g >= 0.0)
            {
                Some(g) => gpus += g,
                None if seen_templates.insert(name) => {
                    out.unresolved_templates.push(name.to_string())
                }
                None => {}
            }
        } else if let Some(name) = named {
            if !seen_claims.insert(name) {
                continue;
            }
            match ctx
                .templates
                .claim_gpus(ctx.namespace, name)
                .filter(|g| g.is_finite() && *g >= 0.0)
            {
                Some(g) => out.named_claims.push((name.to_string(), g)),
                None => out.unresolved_claims.push(name.to_string()),
            }
        }
    }
    out.gpus = gpus;
    Ok(out)
}

fn container_gpus(ctx: &Ctx, container: &Value, path: &str) -> Result<f64, CountError> {
    let container = object_at(container, path)?;
    match opt_object(container, "resources", path)? {
        Some(res) => resources_gpus(ctx, res, &join(path, "resources")),
        None => Ok(0.0),
    }
}

/// GPUs of a ResourceRequirements (`limits`, `requests`) at `path`.
fn resources_gpus(ctx: &Ctx, res: &Map<String, Value>, path: &str) -> Result<f64, CountError> {
    let limits = opt_object(res, "limits", path)?;
    let requests = opt_object(res, "requests", path)?;
    let names: BTreeSet<&String> = limits
        .into_iter()
        .chain(requests)
        .flat_map(|m| m.keys())
        .collect();
    let mut gpus = 0.0;
    for name in names {
        let Some(share) = ctx.resources.share_of(name) else {
            continue;
        };
        let mut units: f64 = 0.0;
        for (map, field) in [(limits, "limits"), (requests, "requests")] {
            if let Some(v) = map.and_then(|m| m.get(name.as_str())) {
                units = units.max(device_count(v, &keyed(&join(path, field), name))?);
            }
        }
        gpus += units * share;
    }
    Ok(gpus)
}

/// More devices than any container can have; keeps every product finite.
const MAX_DEVICES: u128 = 1 << 32;

/// A device count: a JSON integer or a Kubernetes quantity string that is a whole,
/// non-negative number ("4", "4.0", "4000m", "1e1").
fn device_count(v: &Value, path: &str) -> Result<f64, CountError> {
    let parsed = match v {
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => Ok(u128::from(u)),
            (None, Some(f)) if f < 0.0 => Err(QuantityError::Negative),
            (None, Some(f)) if f.fract() != 0.0 => Err(QuantityError::Fractional),
            (None, Some(f)) if f <= MAX_DEVICES as f64 => Ok(f as u128),
            (None, Some(_)) => Err(QuantityError::TooLarge),
            (None, None) => Err(QuantityError::Invalid),
        },
        Value::String(s) => whole_quantity(s),
        _ => Err(QuantityError::Invalid),
    };
    let parsed = parsed.and_then(|n| {
        if n > MAX_DEVICES {
            Err(QuantityError::TooLarge)
        } else {
            Ok(n)
        }
    });
    match parsed {
        Ok(n) => Ok(n as f64),
        Err(e) => {
            let what = match e {
                QuantityError::Invalid => "expected a whole, non-negative number of devices",
                QuantityError::Negative => "expected a non-negative number of devices",
                QuantityError::Fractional => {
                    "a device count must be whole (a part of a GPU is a MIG resource)"
                }
                QuantityError::TooLarge => "the number of devices is implausibly large",
            };
            Err(problem(path, format!("{what}, found {}", found(v))))
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum QuantityError {
    Invalid,
    Negative,
    Fractional,
    TooLarge,
}

/// A quantity of whole units (a ResourceQuota's `used`), `None` when it is not one.
pub fn quantity_units(s: &str) -> Option<u64> {
    whole_quantity(s).ok().and_then(|v| u64::try_from(v).ok())
}

/// Parses a Kubernetes quantity exactly, as a whole number.
fn whole_quantity(s: &str) -> Result<u128, QuantityError> {
    use QuantityError::*;
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(Invalid);
    }
    let fraction = fraction.trim_end_matches('0');
    let (pow10, pow2): (i64, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E']).ok_or(Invalid)?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty()
                || unsigned.len() > 6
                || !unsigned.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(Invalid);
            }
            (digits.parse::<i64>().map_err(|_| Invalid)?, 0)
        }
    };
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(Negative);
    }
    let pow10 = pow10 - fraction.len() as i64;
    // More digits than u128 holds are more devices than anything has.
    if digits.len() > 38 {
        return Err(TooLarge);
    }
    let mut value: u128 = digits.parse().map_err(|_| Invalid)?;
    value = value.checked_mul(1u128 << pow2).ok_or(TooLarge)?;
    if pow10 >= 0 {
        let scale = u32::try_from(pow10)
            .ok()
            .and_then(|p| 10u128.checked_pow(p))
            .ok_or(TooLarge)?;
        value.checked_mul(scale).ok_or(TooLarge)
    } else {
        match u32::try_from(-pow10)
            .ok()
            .and_then(|p| 10u128.checked_pow(p))
        {
            Some(scale) if value.is_multiple_of(scale) => Ok(value / scale),
            _ => Err(Fractional),
        }
    }
}

/// The controller ownerReference of an object, if any.
fn controller_owner(obj: &Map<String, Value>) -> Result<Option<(String, String)>, CountError> {
    let Some(meta) = opt_object(obj, "metadata", "")? else {
        return Ok(None);
    };
    for (i, owner) in opt_list(meta, "ownerReferences", "metadata")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("metadata.ownerReferences[{i}]");
        let owner = object_at(owner, &path)?;
        if opt_bool(owner, "controller", &path)? == Some(true) {
            let kind = opt_str(owner, "kind", &path)?
                .unwrap_or_default()
                .to_string();
            let name = opt_str(owner, "name", &path)?
                .unwrap_or_default()
                .to_string();
            return Ok(Some((kind, name)));
        }
    }
    Ok(None)
}

/// `metadata.labels` of the object (or template) at `path`.
fn labels_of(obj: &Map<String, Value>, path: &str) -> Result<BTreeMap<String, String>, CountError> {
    let Some(meta) = opt_object(obj, "metadata", path)? else {
        return Ok(BTreeMap::new());
    };
    let Some(labels) = present(meta, "labels") else {
        return Ok(BTreeMap::new());
    };
    // Built only for an error (see opt_object).
    let labels_path = || join(&join(path, "metadata"), "labels");
    let Some(labels) = labels.as_object() else {
        return Err(problem(
            &labels_path(),
            format!("expected an object, found {}", found(labels)),
        ));
    };
    labels
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(problem(
                &keyed(&labels_path(), k),
                format!("expected a string, found {}", found(other)),
            )),
        })
        .collect()
}

fn string_map(
    map: &Map<String, Value>,
    path: &str,
) -> Result<BTreeMap<String, String>, CountError> {
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(problem(
                &keyed(path, k),
                format!("expected a string, found {}", found(other)),
            )),
        })
        .collect()
}

// --- reading fields; JSON null is the same as absent, as in the API server ---

fn problem(path: &str, problem: String) -> CountError {
    CountError {
        path: path.to_string(),
        problem,
    }
}

/// A short rendering of a value for error messages.
fn found(v: &Value) -> String {
    match v {
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "an object".to_string(),
        Value::String(s) if s.chars().count() > 40 => {
            let head: String = s.chars().take(40).collect();
            format!("{}…", Value::from(head))
        }
        other => other.to_string(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A map entry whose key is data (resource names, labels): `path["key"]`.
fn keyed(path: &str, key: &str) -> String {
    format!("{path}[{}]", Value::from(key))
}

/// A map entry whose key reads like a field (`Worker`), else `path["key"]`.
fn member(path: &str, key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        join(path, key)
    } else {
        keyed(path, key)
    }
}

fn object_at<'v>(v: &'v Value, path: &str) -> Result<&'v Map<String, Value>, CountError> {
    v.as_object()
        .ok_or_else(|| problem(path, format!("expected an object, found {}", found(v))))
}

fn present<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn opt_object<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'v Map<String, Value>>, CountError> {
    // The path is only built for the error: this runs for every map of every pod
    // template, thousands of times in a big object.
    present(obj, key)
        .map(|v| {
            v.as_object().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected an object, found {}", found(v)),
                )
            })
        })
        .transpose()
}

fn opt_list<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'v Vec<Value>>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_array().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected a list, found {}", found(v)),
                )
            })
        })
        .transpose()
}

fn opt_str<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'v str>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_str().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected a string, found {}", found(v)),
                )
            })
        })
        .transpose()
}

fn opt_bool(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<bool>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_bool().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected true or false, found {}", found(v)),
                )
            })
        })
        .transpose()
}

/// A replica-like count: a non-negative JSON integer.
fn opt_count(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_u64().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected a non-negative integer, found {}", found(v)),
                )
            })
        })
        .transpose()
}

// --- the basis text ---

/// `1 GPU`, `4 GPUs`, `0.29 GPU` (MIG fractions with two decimals); written straight
/// into the basis text (no String per part of a big object).
fn gpus_text(gpus: f64) -> impl std::fmt::Display {
    struct Gpus(f64);
    impl std::fmt::Display for Gpus {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let gpus = self.0;
            if gpus.fract() == 0.0 {
                let unit = if gpus == 1.0 { "GPU" } else { "GPUs" };
                write!(f, "{gpus:.0} {unit}")
            } else if gpus < 1.0 {
                write!(f, "{gpus:.2} GPU")
            } else {
                write!(f, "{gpus:.2} GPUs")
            }
        }
    }
    Gpus(gpus)
}

/// `1 replica`, `3 replicas`.
fn n_text(n: u64, singular: &str) -> impl std::fmt::Display + '_ {
    struct N<'a>(u64, &'a str);
    impl std::fmt::Display for N<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            if self.0 == 1 {
                write!(f, "1 {}", self.1)
            } else {
                write!(f, "{} {}s", self.0, self.1)
            }
        }
    }
    N(n, singular)
}

/// GPUs a pod (template) at `path` asks for through the KAI scheduler's sharing
/// annotations on its metadata: `gpu-fraction` × `gpu-fraction-num-devices`, or one GPU
/// for `gpu-memory`.
fn kai_fraction(obj: &Map<String, Value>, path: &str) -> Result<f64, CountError> {
    let Some(meta) = opt_object(obj, "metadata", path)? else {
        return Ok(0.0);
    };
    let meta_path = join(path, "metadata");
    let Some(annotations) = opt_object(meta, "annotations", &meta_path)? else {
        return Ok(0.0);
    };
    let annotations_path = join(&meta_path, "annotations");
    let text = |key: &str| -> Result<Option<&str>, CountError> {
        match present(annotations, key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(problem(
                &keyed(&annotations_path, key),
                format!("expected a string, found {}", found(other)),
            )),
        }
    };
    if let Some(fraction) = text(KAI_GPU_FRACTION)? {
        let share: f64 = fraction
            .trim()
            .parse()
            .ok()
            .filter(|f: &f64| f.is_finite() && *f > 0.0 && *f <= 1.0)
            .ok_or_else(|| {
                problem(
                    &keyed(&annotations_path, KAI_GPU_FRACTION),
                    format!(
                        "expected a fraction of a GPU above 0 and at most 1, e.g. \"0.5\", found {}",
                        found(&Value::from(fraction))
                    ),
                )
            })?;
        let devices = match text(KAI_GPU_FRACTION_DEVICES)? {
            None => 1.0,
            Some(n) => n
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    problem(
                        &keyed(&annotations_path, KAI_GPU_FRACTION_DEVICES),
                        format!(
                            "expected a whole number of devices of at least 1, found {}",
                            found(&Value::from(n))
                        ),
                    )
                })? as f64,
        };
        return Ok(share * devices);
    }
    if text(KAI_GPU_MEMORY)?.is_some() {
        return Ok(1.0);
    }
    Ok(0.0)
}

/// A kind [`Shape::of`] does not know: not governed, unless it asks for GPUs in a
/// `resources` somewhere, which the gate cannot multiply out — an open-ended claim.
fn uncountable(
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
    }))
}

/// The GPU units named in every `resources.limits`/`requests` under `v`, each entry the
/// larger of the two; unreadable quantities count one. Linear in the size of `v`.
fn gpus_anywhere(v: &Value, resources: &GpuResources, depth: usize) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;
    use serde_json::json;

    /// Every document of a (multi-document) YAML file, empty documents dropped.
    fn documents(yaml: &str) -> Vec<Value> {
        serde_yaml::Deserializer::from_str(yaml)
            .map(|doc| Value::deserialize(doc).expect("fixture parses as YAML"))
            .filter(|v| !v.is_null())
            .collect()
    }

    fn only_document(yaml: &str) -> Value {
        let mut docs = documents(yaml);
        assert_eq!(docs.len(), 1, "one document expected");
        docs.remove(0)
    }

    fn count_default(object: &Value) -> Result<Counted, CountError> {
        count(object, "default", &GpuResources::default(), &())
    }

    fn claim(object: &Value) -> Claim {
        match count_default(object) {
            Ok(Counted::Claim(claim)) => claim,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn claim_with(object: &Value, templates: &dyn ClaimTemplates) -> Claim {
        match count(object, "default", &GpuResources::default(), templates) {
            Ok(Counted::Claim(claim)) => claim,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn error_text(object: &Value) -> String {
        match count_default(object) {
            Err(e) => e.to_string(),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A pod template whose one container has `limits` of `gpus` nvidia.com/gpu.
    fn gpu_template(gpus: u64) -> Value {
        json!({"spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
    }

    static JOBSET: std::sync::LazyLock<&str> =
        std::sync::LazyLock::new(|| fixture("jobset__workload-aware-scheduling_dra_jobset.yaml"));
    static CLAIM_TEMPLATE: std::sync::LazyLock<&str> = std::sync::LazyLock::new(|| {
        fixture("jobset__workload-aware-scheduling_dra_resourceclaimtemplate.yaml")
    });

    /// A GPU workload manifest as its project ships it, read from ../shared/fixtures (the
    /// public data lives beside the checkout, never copied into it).
    fn fixture(name: &str) -> &'static str {
        let path = format!(
            "{}/../shared/fixtures/manifests/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{path}: {e} (the public fixtures live in ../shared/fixtures beside the checkout)"
            )
        });
        Box::leak(text.into_boxed_str())
    }

    // --- real manifests ---

    #[test]
    fn resource_claim_template_fixture_counts_one_device_of_the_example_gpu_class() {
        // One request `gpu`, exactly: deviceClassName gpu.example.com, count absent → 1.
        let c = claim(&only_document(&CLAIM_TEMPLATE));
        assert_eq!(c.gpus, 1.0);
        assert_eq!(c.basis, "each claim: request gpu 1 GPU");
        assert_eq!(c.label_sets, vec![BTreeMap::new()]);
    }

    #[test]
    fn jobset_counts_replicas_times_parallelism_times_claim_template_gpus() {
        // The template, counted as the webhook's cache would, resolved through the HashMap:
        // replicatedJobs workers: 3 replicas × parallelism 2 × 1 GPU (claim template) = 6.
        let Counted::Claim(template) = count_default(&only_document(&CLAIM_TEMPLATE)).unwrap()
        else {
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
    fn jobset_with_an_unknown_claim_template_counts_zero_and_names_the_template() {
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
    fn inference_service_fixtures_count_the_framework_shorthand_as_one_container() {
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
    fn inference_service_counts_max_replicas_of_every_component() {
        // Derived from the tensorflow fixture: minReplicas 2, maxReplicas 3 and a
        // transformer with one custom container of 1 GPU (KServe default 1 replica):
        // predictor 3 × 1 + transformer 1 × 1 = 4.
        let mut isvc = only_document(fixture("kserve__autoscaling_autoscale_gpu.yaml"));
        isvc["spec"]["predictor"]["minReplicas"] = json!(2);
        isvc["spec"]["predictor"]["maxReplicas"] = json!(3);
        isvc["spec"]["transformer"] = json!({"containers": [{"name": "t", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]});
        let c = claim(&isvc);
        assert_eq!(c.gpus, 4.0);
        assert_eq!(
            c.basis,
            "predictor 3 replicas × 1 GPU + transformer 1 replica × 1 GPU"
        );
    }

    #[test]
    fn inference_service_worker_spec_adds_pipeline_parallel_size_minus_one_workers() {
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
    fn llm_inference_service_fixture_counts_three_replicas_of_one_gpu() {
        // replicas 3 × template main container requests = limits = "1" → 3.
        let c = claim(&only_document(fixture(
            "kserve__llmisvc_single-node-gpu_llm-inference-service-qwen2-7b-gpu.yaml",
        )));
        assert_eq!(c.gpus, 3.0);
        assert_eq!(c.basis, "3 replicas × 1 GPU");
    }

    #[test]
    fn llm_inference_service_with_a_worker_counts_leader_and_workers_per_replica() {
        // Derived from the fixture: a worker of 1 GPU and parallelism data 4 / dataLocal 2 →
        // group size 2 (KServe GetSize) → 3 replicas × (leader 1 + 1 worker × 1) = 6; plus a
        // prefill of 2 replicas × template 1 GPU = 2 → 8.
        let mut llm = only_document(fixture(
            "kserve__llmisvc_single-node-gpu_llm-inference-service-qwen2-7b-gpu.yaml",
        ));
        llm["spec"]["worker"] = json!({"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
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
    fn notebook_sample_is_a_claim_of_no_gpus() {
        // One container, no resources → 0.
        let c = claim(&only_document(fixture(
            "kubeflow-v1.10.0__notebook-controller_samples__v1_notebook.yaml",
        )));
        assert_eq!(c.gpus, 0.0);
        assert_eq!(c.basis, "1 pod × 0 GPUs");
    }

    #[test]
    fn notebook_template_with_placeholders_is_unreadable_at_its_labels() {
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
    fn files_that_are_not_manifests_are_not_governed() {
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
    fn ray_job_fixture_counts_its_head_gpu() {
        // rayClusterSpec: head requests = limits = "1" nvidia.com/gpu, no worker groups → 1.
        let c = claim(&only_document(fixture(
            "kuberay__pytorch-text-classifier_ray-job.pytorch-distributed-training.yaml",
        )));
        assert_eq!(c.gpus, 1.0);
        assert_eq!(c.basis, "head 1 GPU");
    }

    #[test]
    fn ray_job_on_an_existing_cluster_claims_nothing() {
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
    fn ray_cluster_verl_fixture_counts_four_head_gpus() {
        // Head limits = requests = "4" nvidia.com/gpu, no worker groups → 4.
        let c = claim(&only_document(fixture("kuberay__ray-cluster.verl.yaml")));
        assert_eq!(c.gpus, 4.0);
    }

    #[test]
    fn ray_service_fixture_counts_one_worker_of_four_gpus_and_skips_the_secret() {
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
    fn kai_gpu_sharing_fixture_counts_its_gpu_fractions_and_queues_are_not_governed() {
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
    fn ray_worker_groups_count_replicas_within_bounds_and_max_when_autoscaling() {
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
    fn kueue_workload_is_not_governed() {
        // Kueue creates Workloads for jobs the gate already counted.
        let workload = only_document(fixture(
            "kueue__docs_concepts_workload.extracted-Workload.yaml",
        ));
        assert_eq!(count_default(&workload), Ok(Counted::NotGoverned));
    }

    #[test]
    fn pytorch_job_fixtures_count_master_plus_workers() {
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
    fn elastic_pytorch_job_counts_workers_at_max_replicas() {
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
    fn kueue_gpu_job_counts_parallelism_times_pod_gpus() {
        // parallelism 3 × (requests 1, limits 1 → 1) = 3.
        let c = claim(&only_document(fixture(
            "kueue__provisioning_sample-job.yaml",
        )));
        assert_eq!(c.gpus, 3.0);
        assert_eq!(c.basis, "parallelism 3 × 1 GPU");
    }

    #[test]
    fn cron_job_counts_one_run_of_its_job_template_and_overlapping_runs_are_open_ended() {
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
            error_text(&cron)
                .starts_with("spec.concurrencyPolicy: expected Allow, Forbid or Replace")
        );
    }

    #[test]
    fn hami_fixture_deployment_counts_its_vgpus_and_queue_objects_are_not_governed() {
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
    fn leader_worker_set_fixture_counts_groups_times_leader_plus_workers() {
        // replicas 2 × (leader 0 + (size 3 − 1) workers × requests "1") = 4.
        let c = claim(&only_document(fixture(
            "kueue__serving-workloads_sample-leaderworkerset-tas.yaml",
        )));
        assert_eq!(c.gpus, 4.0);
        assert_eq!(c.basis, "2 groups × (leader 0 GPUs + 2 workers × 1 GPU)");
    }

    #[test]
    fn leader_worker_set_without_a_leader_template_runs_size_workers() {
        // Derived: replicas 1, size 4, worker 8 GPUs, no leader template → 1 × 4 × 8 = 32.
        let lws = json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "vllm"},
            "spec": {"leaderWorkerTemplate": {"size": 4, "workerTemplate": gpu_template(8)}}});
        let c = claim(&lws);
        assert_eq!(c.gpus, 32.0);
        assert_eq!(c.basis, "1 group × 4 pods × 8 GPUs");
    }

    #[test]
    fn topology_and_queue_fixtures_are_not_governed() {
        let docs = documents(fixture("kueue__tas_sample-gpu-queues.yaml"));
        assert_eq!(docs.len(), 4);
        for doc in &docs {
            assert_eq!(count_default(doc), Ok(Counted::NotGoverned));
        }
    }

    // --- derived variants ---

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
        let spec = json!({"initContainers": [sidecar.clone(), init.clone()], "containers": [main.clone()]});
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
        rs["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "controller": true}]);
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
        let other = json!({"apiVersion": "example.com/v1", "kind": "Deployment", "spec": {"replicas": "x"}});
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
}
