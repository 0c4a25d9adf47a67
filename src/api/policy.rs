//! `GpuPolicy`: which workloads gpu-reaper governs, what counts as idle, when to warn,
//! what to do, what a GPU-hour costs, and the budget gate's admission rules.

// kube's `printcolumn(...)` repeats `type_ =` per column, which clippy mistakes for a
// duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::core::Duration;
use kube::{CustomResource, KubeSchema};

use super::selector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A GpuPolicy tells gpu-reaper which GPU workloads to govern and how: what counts as
/// idle, when to warn the owner, what to do when a workload stays idle, what a GPU-hour
/// costs, and which large GPU claims need a ReadinessAttestation.
///
/// Several policies may match one workload: the highest `priority` wins, then the
/// alphabetically first name.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gpureaper.io",
    version = "v1alpha1",
    kind = "GpuPolicy",
    plural = "gpupolicies",
    shortname = "gpol",
    category = "gpu-reaper",
    status = "GpuPolicyStatus",
    derive = "PartialEq",
    cel,
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action.type"),
    printcolumn(
        name = "Priority",
        type_ = "integer",
        json_path = ".spec.priority",
        priority = 1
    ),
    printcolumn(
        name = "Governed",
        type_ = "integer",
        json_path = ".status.workloads.governed"
    ),
    printcolumn(name = "Idle", type_ = "integer", json_path = ".status.workloads.idle"),
    printcolumn(
        name = "Warned",
        type_ = "integer",
        json_path = ".status.workloads.warned"
    ),
    // Whole dollars: the API server's table turns a fractional value into an integer.
    printcolumn(
        name = "Savings USD",
        type_ = "integer",
        json_path = ".status.estimatedSavingsUsd"
    ),
    // Ready and Degraded tell "nothing idle" from "could not look" (Prometheus down).
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Degraded\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("duration(self.action.after) >= duration(self.warn.after)")
    .message("spec.action.after must be at least spec.warn.after: gpu-reaper always warns before it acts")
    .field_path(".action.after"))]
#[x_kube(validation = Rule::new("duration(self.idle.window) > duration('0s')")
    .message("spec.idle.window must be longer than 0s, e.g. \"30m\"")
    .field_path(".idle.window"))]
#[x_kube(validation = Rule::new("duration(self.idle.startupGrace) >= duration('0s') && duration(self.idle.provisioningGrace) >= duration('0s') && duration(self.warn.after) >= duration('0s') && duration(self.exemptions.maxSnooze) >= duration('0s')")
    .message("durations in spec must not be negative")
    .field_path(".idle"))]
#[x_kube(validation = Rule::new("!has(self.idle.maxIdle) || duration(self.idle.maxIdle) >= duration(self.action.after)")
    .message("spec.idle.maxIdle must be at least spec.action.after: it is the ceiling after which the ladder proceeds whatever the resumption risk")
    .field_path(".idle.maxIdle"))]
#[x_kube(validation = Rule::new("duration(self.idle.resumeHorizon) > duration('0s') && duration(self.idle.history) >= duration(self.idle.resumeHorizon)")
    .message("spec.idle.resumeHorizon must be longer than 0s and spec.idle.history at least as long, e.g. resumeHorizon: 2h, history: 168h")
    .field_path(".idle.resumeHorizon"))]
#[x_kube(validation = Rule::new("!has(self.action.inference) || self.action.type == 'ScaleToZero'")
    .message("spec.action.inference applies to action.type ScaleToZero only: remove it, or set type: ScaleToZero")
    .field_path(".action.inference"))]
#[x_kube(validation = Rule::new("!has(self.action.preWarm) || self.action.type == 'ScaleToZero' || self.action.type == 'Suspend'")
    .message("spec.action.preWarm needs action.type ScaleToZero or Suspend (what a wake can undo): remove it, or change the type")
    .field_path(".action.preWarm"))]
#[serde(rename_all = "camelCase")]
pub struct GpuPolicySpec {
    /// `Audit` classifies, warns and reports what it would have done, but never changes a
    /// workload. `Enforce` also acts. Start in Audit.
    #[serde(default)]
    pub mode: PolicyMode,

    /// When several policies match a workload the highest priority wins (ties: first name).
    #[serde(default)]
    pub priority: i32,

    /// Which workloads this policy governs. Empty matches every GPU workload.
    #[serde(default, rename = "match")]
    pub match_: WorkloadMatch,

    /// What counts as idle.
    #[serde(default)]
    pub idle: IdleSpec,

    /// When and how to warn the owner before acting.
    #[serde(default)]
    pub warn: WarnSpec,

    /// What to do with a workload that stays idle.
    #[serde(default)]
    pub action: ActionSpec,

    /// Limits on user opt-outs.
    #[serde(default)]
    pub exemptions: ExemptionSpec,

    /// What a GPU-hour costs, for reports, warnings and budgets.
    #[serde(default)]
    pub cost: CostSpec,

    /// Rules of the budget-gate admission webhook. Absent: the webhook admits everything
    /// this policy matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSpec>,
}

/// Whether the policy may change workloads.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PolicyMode {
    /// Classify, warn and report "would act"; never change a workload.
    #[default]
    Audit,
    /// Warn, then act.
    Enforce,
    // A value a newer gpu-reaper (or CRD) knows and this one does not: read, so one such
    // policy is not fatal, and refused when used (`GpuPolicySpec::unknown_values`). Not
    // in the CRD's enum.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// Which workloads a policy governs. All given conditions must hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadMatch {
    /// Labels of the workload's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Labels of the root workload (the Deployment, Job, Notebook… that owns the pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<LabelSelector>,
    /// Kinds of root workload, e.g. `Deployment`, `Job`, `Notebook`. Empty: every kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
}

/// What counts as idle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdleSpec {
    /// Activity metric. `Auto` uses DCGM_FI_PROF_GR_ENGINE_ACTIVE (0–1) and falls back to
    /// DCGM_FI_DEV_GPU_UTIL/100 where the profiling metric is absent.
    #[serde(default)]
    pub signal: Signal,
    /// A GPU is busy at or above this activity (0 < threshold ≤ 1).
    #[serde(default = "default_threshold")]
    #[schemars(range(min = 0.0, max = 1.0))]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("spec.idle.threshold must be in (0, 1], e.g. 0.05 for 5 % activity"))]
    pub threshold: f64,
    /// How long every GPU of a workload must stay below the threshold before the workload
    /// counts as idle, e.g. `30m`. Go duration syntax: `90s`, `30m`, `1h30m`.
    #[serde(default = "default_window")]
    pub window: Duration,
    /// Workloads younger than this are never judged.
    #[serde(default = "default_startup_grace")]
    pub startup_grace: Duration,
    /// A pod bound to GPUs that is Pending, crash-looping or failing to pull its image for
    /// longer than this is "provisioning idle".
    #[serde(default = "default_provisioning_grace")]
    pub provisioning_grace: Duration,
    /// What a gap in telemetry means. `Ignore` (default) never treats missing data as idle.
    #[serde(default)]
    pub missing_telemetry: MissingTelemetry,
    /// Share of the window that must have samples for a GPU to be judged (0–1).
    #[serde(default = "default_min_coverage")]
    #[schemars(range(min = 0.0, max = 1.0))]
    #[x_kube(validation = Rule::new("self >= 0.0 && self <= 1.0").message("spec.idle.minCoverage must be in [0, 1], e.g. 0.8"))]
    pub min_coverage: f64,
    /// Framebuffer above this many MiB means a compute-idle GPU still holds memory (a model
    /// resident in VRAM: "inference idle").
    #[serde(default = "default_memory_held_mib")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("spec.idle.memoryHeldMib must not be negative"))]
    pub memory_held_mib: f64,
    /// PCIe receive throughput (bytes/s, DCGM_FI_PROF_PCIE_RX_BYTES) above which a
    /// compute-idle GPU is reported as data-starved rather than idle.
    #[serde(default = "default_starved_pcie")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("spec.idle.dataStarvedPcieRxBytesPerSecond must not be negative"))]
    pub data_starved_pcie_rx_bytes_per_second: f64,
    /// Act on data-starved workloads too. Off by default: starvation is a pipeline problem
    /// to fix, not an abandoned workload.
    #[serde(default)]
    pub reap_data_starved: bool,
    /// Resumption-risk gate, off when absent. The ladder warns and acts only when the
    /// estimated probability that the workload becomes active again within
    /// `resumeHorizon` is at most this (0–1), e.g. `0.05`. The estimate comes from the
    /// workload's own idle spans over `history`, else from workloads of the same idle
    /// shape, else there is none and the ladder waits until `maxIdle` (docs/decision-quality.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self <= 1.0").message("spec.idle.maxResumeRisk must be in [0, 1], e.g. 0.05 for 5 %"))]
    pub max_resume_risk: Option<f64>,
    /// Activity within this long after an action makes the action a regret: the horizon
    /// of the resumption-risk estimate.
    #[serde(default = "default_resume_horizon")]
    pub resume_horizon: Duration,
    /// How far back idle spans are remembered for the estimate, e.g. `168h` (7 days).
    #[serde(default = "default_history")]
    pub history: Duration,
    /// Past idle spans that lasted at least as long as the current one needed before an
    /// estimate counts; fewer, and the workload's peers are asked; fewer there too, and
    /// nothing is known: a risk-gated policy waits until maxIdle.
    #[serde(default = "default_min_idle_spans")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.idle.minIdleSpans must be at least 1, e.g. 10"))]
    pub min_idle_spans: u32,
    /// Ceiling: a workload idle this long is acted on whatever its resumption risk; its
    /// warning comes the notice (action.after − warn.after) before (exemptions, snoozes
    /// and Audit mode still apply), e.g. `8h`. It is also a deadline: before it, in a
    /// window the workload's past days call quiet or rarely busy, a risk above
    /// maxResumeRisk proceeds when waiting for maxIdle is expected to regret more (the
    /// chance the span lasts to it times the share of comparable cases that resumed
    /// there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_idle: Option<Duration>,
}

/// Activity metric choice.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Signal {
    /// Graphics-engine active when present, else GPU utilisation.
    #[default]
    Auto,
    /// DCGM_FI_PROF_GR_ENGINE_ACTIVE only.
    EngineActive,
    /// DCGM_FI_DEV_GPU_UTIL / 100 only.
    GpuUtil,
    // Unknown to this gpu-reaper: refused when used (see `PolicyMode::Unknown`).
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// Meaning of a telemetry gap.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MissingTelemetry {
    /// Never act on a workload without telemetry (it is reported as NoTelemetry).
    #[default]
    Ignore,
    /// Treat a GPU without telemetry as idle.
    TreatAsIdle,
    // Unknown to this gpu-reaper: refused when used (see `PolicyMode::Unknown`).
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// When and how to warn.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarnSpec {
    /// Warn once the workload has been idle this long (counted from its last activity).
    #[serde(default = "default_warn_after")]
    pub after: Duration,
    /// Where to warn. A Kubernetes Event on the workload is always recorded.
    #[serde(default = "default_channels")]
    pub channels: Vec<Channel>,
    /// Who to warn when the workload, its pods and its namespace name nobody in
    /// `gpureaper.io/owner`: an email address and/or a Slack member ID (comma-separated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_owner: Option<String>,
    /// Slack channel (ID or #name) for warnings about workloads with no Slack owner, and
    /// where "Not mine" answers go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack_channel: Option<String>,
    /// Act only after a Slack or email warning was delivered (not just the Event). A
    /// channel that keeps failing then holds the action back; the status says so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_delivery: bool,
}

/// Notification channel.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Channel {
    /// A Kubernetes Event on the workload.
    Event,
    /// Slack DM to the owner, or the policy's channel.
    Slack,
    /// Email to the owner.
    Email,
    // Unknown to this gpu-reaper: refused when used (see `PolicyMode::Unknown`).
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// What to do with a workload that stays idle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActionSpec {
    /// `ScaleToZero`, `Suspend`, `Evict` or `None` (warn only).
    #[serde(default, rename = "type")]
    pub type_: ActionType,
    /// Act once the workload has been idle this long; at least `warn.after`.
    #[serde(default = "default_action_after")]
    pub after: Duration,
    /// At most this many actions per policy per hour, even when hundreds go idle at once.
    #[serde(default = "default_max_per_hour")]
    pub max_per_hour: u32,
    /// A softer `ScaleToZero` for request-driven inference: a workload whose idle history
    /// shows short, frequent idle spans (requests come and go; its typical idle span is
    /// under 16 minutes over at least 20 spans) keeps `minReplicas` replicas serving
    /// instead of going to zero. Applies to kinds scaled through `/scale` (Deployments,
    /// StatefulSets, CRDs with a scale subresource); other kinds get the policy's action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference: Option<InferenceAction>,
    /// Off unless set: wake a workload gpu-reaper reclaimed (as `gpureaper.io/wake`
    /// does) `before` its predicted next use, so its first user does not wait for a cold
    /// start. The prediction is the workload's own rhythm: on at least `minDays` of the
    /// past days of the same kind (weekdays, or weekend days; UTC) in `idle.history`, and
    /// on most of those it was seen, a pause at least `action.after` long ended within the
    /// hour before that time. No such rhythm, no pre-warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_warm: Option<PreWarm>,
}

/// When to wake a reclaimed workload before its predicted next use.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreWarm {
    /// How long before the predicted next use to wake it: about its cold-start time
    /// (pulling the image, loading the weights), e.g. `15m`. Between 1m and 2h.
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m') && duration(self) <= duration('2h')").message("spec.action.preWarm.before must be between 1m and 2h, e.g. \"15m\" (how long before the predicted use the workload is woken)"))]
    pub before: Duration,
    /// Past days of the same kind on which a long pause ended within the hour before that
    /// time of day, needed before a time counts as the workload's rhythm (at least 2;
    /// default 3).
    #[serde(default = "default_pre_warm_days")]
    #[x_kube(validation = Rule::new("self >= 2 && self <= 60").message("spec.action.preWarm.minDays must be between 2 and 60, e.g. 3"))]
    pub min_days: u32,
}

/// How request-driven inference is reclaimed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceAction {
    /// Replicas kept serving (at least 1). A workload already at or below it is left
    /// alone.
    #[x_kube(validation = Rule::new("self >= 1").message("spec.action.inference.minReplicas must be at least 1 (0 is what action.type ScaleToZero does without this section)"))]
    pub min_replicas: i32,
}

/// Reversible actions gpu-reaper can take.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ActionType {
    /// Scale to zero replicas (anything with `/scale`, Kubeflow Notebook, KServe).
    #[default]
    ScaleToZero,
    /// Suspend or requeue (Job, JobSet, RayJob, Kubeflow training jobs, Kueue Workload).
    Suspend,
    /// Evict the pods (policy/v1 Eviction, PodDisruptionBudgets respected).
    Evict,
    /// Warn only.
    None,
    // Unknown to this gpu-reaper: refused when used (see `PolicyMode::Unknown`).
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// Limits on user opt-outs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExemptionSpec {
    /// Longest snooze honoured: a `gpureaper.io/snooze-until` further ahead than this is
    /// ignored (and reported).
    #[serde(default = "default_max_snooze")]
    pub max_snooze: Duration,
}

/// What a GPU-hour costs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostSpec {
    /// USD per GPU-hour for models not listed in `byModel`.
    #[serde(default = "default_hourly_usd")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("spec.cost.defaultHourlyUsd must not be negative"))]
    pub default_hourly_usd: f64,
    /// USD per GPU-hour by DCGM `modelName`, e.g. `"NVIDIA H100 80GB HBM3": 4.0`.
    /// MIG slices cost their share of the GPU (a 1g.5gb slice of an A100 costs 1/7).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, self[k] >= 0.0)").message("spec.cost.byModel prices must not be negative"))]
    pub by_model: BTreeMap<String, f64>,
}

/// Rules of the budget-gate admission webhook.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionSpec {
    /// Claims of more GPUs than this need an approved ReadinessAttestation.
    #[serde(default = "default_large_claim_gpus")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000000").message("spec.admission.largeClaimGpus must be between 1 and 1000000"))]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub large_claim_gpus: u32,
    /// GPUs a namespace may hold in all without an attestation (the unattested
    /// allowance), e.g. eight 1-GPU notebooks. Absent: `largeClaimGpus`, so a large claim
    /// split into small ones is caught without extra settings. A namespace may hold this
    /// plus the `maxGpus` of each of its approved, unexpired attestations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self <= 1000000").message("spec.admission.unattestedGpus must be at most 1000000"))]
    #[schemars(range(max = 1_000_000))]
    pub unattested_gpus: Option<u32>,
    /// `Warn` admits with a warning; `Enforce` denies.
    #[serde(default)]
    pub mode: AdmissionMode,
    /// Monthly GPU budget per namespace in USD: a claim whose cost until the end of the
    /// month (or its attestation's expiry, if sooner) does not fit in what is left is
    /// refused, at the policy's dearest GPU-hour price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("spec.admission.monthlyBudgetUsd must not be negative"))]
    pub monthly_budget_usd: Option<f64>,
    /// Evidence an attestation must carry to count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_evidence: Option<EvidenceRequirements>,
}

/// Whether the budget gate denies or only warns.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AdmissionMode {
    /// Admit, with a warning `kubectl` prints.
    #[default]
    Warn,
    /// Deny, with one sentence saying why and what to do.
    Enforce,
}

/// Evidence an attestation must carry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvidenceRequirements {
    /// Minimum measured data throughput per claimed GPU, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_data_throughput_g_bps_per_gpu: Option<f64>,
    /// The job must checkpoint.
    #[serde(default)]
    pub checkpointing: bool,
}

/// Observed state, written by the controller in one server-side apply.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuPolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Degraded` (e.g. telemetry missing), keyed on type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Counts of governed workloads by state.
    #[serde(default)]
    pub workloads: WorkloadCounts,
    /// GPU-hours spent idle by governed workloads over the last 24 hours.
    #[serde(default)]
    pub idle_gpu_hours_last24h: f64,
    /// GPU-hours reclaimed since the policy was created.
    #[serde(default)]
    pub reclaimed_gpu_hours: f64,
    /// Dollars those reclaimed GPU-hours would have cost.
    #[serde(default)]
    pub estimated_savings_usd: f64,
    /// When the controller last evaluated this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_evaluation_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// GPU spend of each governed namespace this month, computed by the controller from
    /// telemetry and read by the budget gate against `spec.admission.monthlyBudgetUsd`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["namespace"]))]
    pub namespace_spend: Vec<NamespaceSpend>,
}

/// One namespace's GPU spend in one calendar month (UTC).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSpend {
    /// The namespace.
    pub namespace: String,
    /// The month the figure covers, `YYYY-MM` (UTC). A figure for another month is stale
    /// and counts as zero spend.
    pub month: String,
    /// GPU spend so far this month, USD.
    pub spent_usd: f64,
}

/// Counts of governed workloads by state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WorkloadCounts {
    /// Workloads this policy governs.
    pub governed: u32,
    /// GPUs they hold.
    pub gpus: u32,
    /// Idle workloads.
    pub idle: u32,
    /// Warned workloads.
    pub warned: u32,
    /// Workloads gpu-reaper acted on and that are not restored yet.
    pub reclaimed: u32,
}

impl GpuPolicySpec {
    /// Whether the policy learns from the idle-span history (`idle.maxResumeRisk`,
    /// `action.inference`'s request-driven test, or `action.preWarm`'s rhythm): the
    /// controller backfills it at start-up, and a backtest that starts with none of it
    /// warns to use `--warmup`.
    pub fn uses_idle_history(&self) -> bool {
        self.idle.max_resume_risk.is_some()
            || self.action.inference.is_some()
            || self.action.pre_warm.is_some()
    }
}

impl GpuPolicy {
    /// Whether this policy's `match` covers a root workload of `kind` with `labels` in a
    /// namespace labelled `namespace_labels`.
    pub fn matches(
        &self,
        kind: &str,
        namespace_labels: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        let m = &self.spec.match_;
        m.namespace_selector
            .as_ref()
            .is_none_or(|s| selector::matches(s, namespace_labels))
            && m.workload_selector
                .as_ref()
                .is_none_or(|s| selector::matches(s, labels))
            && (m.kinds.is_empty() || m.kinds.iter().any(|k| k == kind))
    }

    /// This month's spend of `namespace` as published in status; 0 when absent or stale.
    pub fn spend_of(&self, namespace: &str, month: &str) -> f64 {
        self.status
            .iter()
            .flat_map(|s| &s.namespace_spend)
            .find(|s| s.namespace == namespace && s.month == month)
            .map_or(0.0, |s| s.spent_usd)
    }
}

/// The policy that governs a workload: among those matching, the highest `priority`, then
/// the alphabetically first name. Also returns how many matched, so callers can report
/// conflicts.
pub fn select<'a>(
    policies: impl IntoIterator<Item = &'a GpuPolicy>,
    kind: &str,
    namespace_labels: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> (Option<&'a GpuPolicy>, usize) {
    let mut best: Option<&GpuPolicy> = None;
    let mut matched = 0;
    for policy in policies {
        if !policy.matches(kind, namespace_labels, labels) {
            continue;
        }
        matched += 1;
        if best.is_none_or(|b| policy.outranks(b)) {
            best = Some(policy);
        }
    }
    (best, matched)
}

impl GpuPolicy {
    /// Whether this policy wins over `other` when both match: higher `priority`, then the
    /// name that sorts first.
    pub fn outranks(&self, other: &GpuPolicy) -> bool {
        (
            self.spec.priority,
            std::cmp::Reverse(self.metadata.name.as_deref()),
        ) > (
            other.spec.priority,
            std::cmp::Reverse(other.metadata.name.as_deref()),
        )
    }
}

impl Default for IdleSpec {
    fn default() -> Self {
        Self {
            signal: Signal::Auto,
            threshold: default_threshold(),
            window: default_window(),
            startup_grace: default_startup_grace(),
            provisioning_grace: default_provisioning_grace(),
            missing_telemetry: MissingTelemetry::Ignore,
            min_coverage: default_min_coverage(),
            memory_held_mib: default_memory_held_mib(),
            data_starved_pcie_rx_bytes_per_second: default_starved_pcie(),
            reap_data_starved: false,
            max_resume_risk: None,
            resume_horizon: default_resume_horizon(),
            history: default_history(),
            min_idle_spans: default_min_idle_spans(),
            max_idle: None,
        }
    }
}

impl Default for WarnSpec {
    fn default() -> Self {
        Self {
            after: default_warn_after(),
            channels: default_channels(),
            default_owner: None,
            slack_channel: None,
            require_delivery: false,
        }
    }
}

impl Default for ActionSpec {
    fn default() -> Self {
        Self {
            type_: ActionType::ScaleToZero,
            after: default_action_after(),
            max_per_hour: default_max_per_hour(),
            inference: None,
            pre_warm: None,
        }
    }
}

impl Default for ExemptionSpec {
    fn default() -> Self {
        Self {
            max_snooze: default_max_snooze(),
        }
    }
}

impl Default for CostSpec {
    fn default() -> Self {
        Self {
            default_hourly_usd: default_hourly_usd(),
            by_model: BTreeMap::new(),
        }
    }
}

impl Default for AdmissionSpec {
    fn default() -> Self {
        Self {
            large_claim_gpus: default_large_claim_gpus(),
            unattested_gpus: None,
            mode: AdmissionMode::Warn,
            monthly_budget_usd: None,
            require_evidence: None,
        }
    }
}

fn minutes(m: u64) -> Duration {
    Duration::from(std::time::Duration::from_secs(m * 60))
}
fn default_threshold() -> f64 {
    0.05
}
fn default_window() -> Duration {
    minutes(30)
}
fn default_startup_grace() -> Duration {
    minutes(20)
}
fn default_provisioning_grace() -> Duration {
    minutes(15)
}
fn default_resume_horizon() -> Duration {
    minutes(120)
}
fn default_history() -> Duration {
    minutes(7 * 24 * 60)
}
fn default_min_idle_spans() -> u32 {
    10
}
fn default_min_coverage() -> f64 {
    0.8
}
fn default_memory_held_mib() -> f64 {
    1024.0
}
fn default_starved_pcie() -> f64 {
    1.0e9
}
fn default_warn_after() -> Duration {
    minutes(30)
}
fn default_channels() -> Vec<Channel> {
    vec![Channel::Event]
}
fn default_action_after() -> Duration {
    minutes(60)
}
fn default_max_per_hour() -> u32 {
    20
}
fn default_pre_warm_days() -> u32 {
    3
}
fn default_max_snooze() -> Duration {
    minutes(24 * 60)
}
fn default_hourly_usd() -> f64 {
    2.5
}
fn default_large_claim_gpus() -> u32 {
    8
}
