//! The engine's inputs and outputs.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::api::policy::ActionType;

pub use super::shape::IdleShape;

/// A root workload (Deployment, Job, Notebook, bare Pod…): identity, age, labels and
/// annotations (where the ladder state and user opt-outs live).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadMeta {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub created_at: Timestamp,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Lifecycle phase of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

/// One pod of the workload that holds GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct PodState {
    pub phase: PodPhase,
    /// Reason a container is waiting (`CrashLoopBackOff`, `ImagePullBackOff`, …).
    pub waiting_reason: Option<String>,
    /// Since when the pod has been Pending or waiting (None when it runs normally).
    pub stuck_since: Option<Timestamp>,
    /// GPU devices (full GPUs or MIG instances) the pod requests.
    pub gpu_devices: u32,
}

impl PodState {
    /// Bound to GPUs but not running its work.
    pub fn is_stuck(&self) -> bool {
        self.phase == PodPhase::Pending || self.waiting_reason.is_some()
    }
}

/// What telemetry says about one GPU (or MIG instance) of the workload, at `now`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuObservation {
    /// `GPU-<uuid>`, or `GPU-<uuid>/<GPU_I_ID>` for a MIG instance.
    pub id: String,
    /// DCGM `modelName`.
    pub model: String,
    /// Share of a physical GPU: 1 for a full GPU, 1/7 for a 1g MIG slice of an A100.
    pub share: f64,
    /// Index of the pod (in the workload's pod list) the GPU is bound to.
    pub pod: usize,
    /// Share of the idle window that has samples (0–1).
    pub coverage: f64,
    /// First sample ever seen.
    pub first_sample_at: Option<Timestamp>,
    /// Last sample at or above the policy's threshold.
    pub last_busy_at: Option<Timestamp>,
    /// Last time telemetry coverage was below the policy's minimum: the idle clock cannot
    /// run through a period nobody observed.
    pub blind_until: Option<Timestamp>,
    /// Framebuffer used, MiB (latest).
    pub fb_used_mib: Option<f64>,
    /// PCIe receive throughput, bytes/s (latest).
    pub pcie_rx_bytes_per_second: Option<f64>,
    /// Power draw, W (latest).
    pub power_watts: Option<f64>,
    /// How far the telemetry behind this observation reaches (None: to the instant it is
    /// judged at). The idle clock runs only up to it: a Prometheus outage, or a scrape not
    /// yet seen at the end of the last read, is not idleness.
    pub data_until: Option<Timestamp>,
}

/// What gpu-reaper already did in the current idle period, read from annotations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LadderState {
    pub warned_at: Option<Timestamp>,
    pub reaped_at: Option<Timestamp>,
    pub snooze_until: Option<Timestamp>,
}

impl LadderState {
    /// Reads `gpureaper.io/warned-at`, `reaped-at` and `snooze-until`. Unparsable values
    /// are ignored (and reported by the caller): a typo must not make anything act sooner.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        use crate::api::keys;
        let ts = |k: &str| {
            annotations
                .get(k)
                .and_then(|v| v.trim().parse::<Timestamp>().ok())
        };
        Self {
            warned_at: ts(keys::WARNED_AT),
            reaped_at: ts(keys::REAPED_AT),
            snooze_until: ts(keys::SNOOZE_UNTIL),
        }
    }
}

/// The engine's judgement of a workload.
#[derive(Debug, Clone, PartialEq)]
pub enum Classification {
    Active,
    Idle(IdleShape),
    NoTelemetry,
    TooYoung,
    Exempt,
    Snoozed,
}

impl Classification {
    /// Stable name used in reports, metrics and JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            Classification::Active => "Active",
            Classification::Idle(IdleShape::MemoryHeld) => "Idle/MemoryHeld",
            Classification::Idle(IdleShape::Unused) => "Idle/Unused",
            Classification::Idle(IdleShape::Provisioning) => "Idle/Provisioning",
            Classification::Idle(IdleShape::DataStarved) => "Idle/DataStarved",
            Classification::NoTelemetry => "NoTelemetry",
            Classification::TooYoung => "TooYoung",
            Classification::Exempt => "Exempt",
            Classification::Snoozed => "Snoozed",
        }
    }

    pub fn is_idle(&self) -> bool {
        matches!(self, Classification::Idle(_))
    }
}

/// Classification with its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub classification: Classification,
    /// The last time any GPU was at or above threshold (or since when it could be
    /// observed idle), when the workload is idle or heading there.
    pub idle_since: Option<Timestamp>,
    /// GPU devices held.
    pub gpu_devices: u32,
    /// GPU shares held (MIG slices count their share).
    pub gpu_share: f64,
    /// One sentence explaining the classification.
    pub reason: String,
}

/// The next step of the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do now.
    Nothing,
    /// Warn the owner (Event, Slack, email).
    Warn,
    /// Act (Enforce mode).
    Act(ActionType),
    /// Would act, but the policy is in Audit mode: report only.
    WouldAct(ActionType),
    /// Would act, but the policy's `maxPerHour` is used up: retried next cycle.
    RateLimited(ActionType),
}

impl Step {
    /// Whether this step changes the workload itself (invariant 6: never in Audit).
    pub fn changes_workload(self) -> bool {
        matches!(self, Step::Act(_))
    }
}

/// The engine's full answer for one workload at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    pub step: Step,
    /// When the next step becomes due if nothing changes.
    pub next_step_at: Option<Timestamp>,
    /// One sentence explaining the step.
    pub reason: String,
    /// USD per hour the workload's GPUs cost.
    pub hourly_usd: f64,
    /// The resumption-risk estimate the step was decided with (policies with
    /// `idle.maxResumeRisk`, once the fixed minimum durations are met).
    pub estimate: Option<super::risk::Estimate>,
}
