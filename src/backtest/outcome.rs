//! What a replay reports: per workload (its timeline, actions, reclaimed and idle
//! GPU-hours, regrets) and in sum. Plain data, serialised as `backtest --format json`.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::api::policy::ActionType;

/// How to replay.
#[derive(Debug, Clone)]
pub struct BacktestOptions {
    pub regret_horizon: SignedDuration,
    /// Keep per-step activity and state per workload (for the SVG timeline).
    pub keep_timelines: bool,
    /// The replay is a controller installed this long after the trace's start: the
    /// warm-up's last [`CONTROLLER_BACKFILL`] at most are fed into the idle history as the
    /// controller's start-up backfill feeds it (the same function), and nothing is
    /// classified, warned, acted on, counted or drawn in it. Zero: installed at the start,
    /// with no history (a cold start).
    pub warmup: SignedDuration,
    /// How much of the warm-up's end the start-up backfill reads (the controller's
    /// `--history-backfill`; [`CONTROLLER_BACKFILL`] by default).
    pub history_backfill: SignedDuration,
}

/// What one action reclaimed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActionOutcome {
    pub at: Timestamp,
    pub action: ActionType,
    /// When activity resumed (None: it never did before the pods went away or the trace ended).
    pub resumed_at: Option<Timestamp>,
    pub reclaimed_gpu_hours: f64,
    pub reclaimed_usd: f64,
    pub regret: bool,
    /// The engine's reason for acting (with the resumption-risk estimate, when gated).
    pub reason: String,
    /// Replicas kept serving (`action.inference.minReplicas` for request-driven
    /// inference): only the others' GPU-hours were reclaimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_replicas: Option<i32>,
    /// The resumption risk the estimate gave at the action (policies with
    /// `idle.maxResumeRisk`; None: there was no estimate, the action came at `maxIdle`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_risk: Option<f64>,
    /// When `action.preWarm` woke it before its predicted use (its reclaim ended there;
    /// not a regret, whenever the use came).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prewarmed_at: Option<Timestamp>,
}

/// Per-step activity and state of a workload, for drawing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub first_bucket: i64,
    /// Highest activity of any GPU per step (NaN: no sample).
    pub activity: Vec<f32>,
    pub state: Vec<TimelineState>,
}

/// State of a workload at one step, for drawing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineState {
    Absent,
    Active,
    Idle,
    NoTelemetry,
    NotJudged,
    Reclaimed,
}

/// What the policy would have done to one workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadOutcome {
    pub namespace: String,
    pub kind: String,
    pub name: String,
    /// GPU devices held (most at any time).
    pub gpus: u32,
    /// Classification that held longest over the trace.
    pub classification: String,
    pub idle_gpu_hours: f64,
    /// What the idle GPU time cost, USD.
    pub idle_usd: f64,
    /// GPU-hours held, by classification (reclaimed time counts under the classification
    /// it was acted on in).
    pub gpu_hours_by_class: BTreeMap<String, f64>,
    /// First warning.
    pub warned_at: Option<Timestamp>,
    /// First action.
    pub acted_at: Option<Timestamp>,
    pub action: Option<ActionType>,
    pub reclaimed_gpu_hours: f64,
    pub reclaimed_usd: f64,
    /// Whether any action on it was regretted.
    pub regret: bool,
    /// The policy's action, due but unsupported on this kind (e.g. ScaleToZero on a bare
    /// Pod): nothing was reclaimed, as the controller would do nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<ActionType>,
    pub warnings: Vec<Timestamp>,
    pub actions: Vec<ActionOutcome>,
    /// The engine's last explanation.
    pub last_reason: String,
    #[serde(skip)]
    pub timeline: Option<Timeline>,
}

/// Totals over all governed workloads.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub workloads: usize,
    /// GPU devices held by governed workloads (most at any time, summed).
    pub governed_gpus: u32,
    /// GPUs seen in telemetry with no workload bound to them.
    pub unallocated_gpus: usize,
    pub gpu_hours: f64,
    pub idle_gpu_hours: f64,
    pub idle_share: f64,
    pub reclaimed_gpu_hours: f64,
    /// Reclaimed GPU-hours over all governed GPU-hours.
    pub reclaimed_share: f64,
    pub reclaimed_usd: f64,
    pub warnings: usize,
    pub actions: usize,
    pub regrets: usize,
    pub regret_rate: f64,
    /// Actions deferred by `action.maxPerHour`.
    pub rate_limited: usize,
    /// Workloads whose action was due but which the controller cannot act on that way
    /// (their kind does not support it): nothing reclaimed.
    pub unsupported: usize,
    /// What `action.preWarm` did (all zero without it).
    pub prewarm: PreWarmSummary,
}

/// What waking reclaimed workloads before their predicted use cost and saved.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PreWarmSummary {
    /// Reclaims ended by a pre-warm.
    pub wakes: usize,
    /// Wakes whose workload was busy again within the regret horizon of the wake: its
    /// user found it warm.
    pub warm_starts: usize,
    /// Wakes with no use within the regret horizon (then reclaimed again, gone, the
    /// trace's end, or used later).
    pub unused: usize,
    /// GPU-hours held warm and idle from each wake to the first use, the next action,
    /// the pods' end or the trace's end: what the pre-warms cost.
    pub warm_gpu_hours: f64,
    /// Wakes followed by a use within the regret horizon of the action they ended: each
    /// would have been a regret, and was a warm start.
    pub regrets_avoided: usize,
}

/// A whole backtest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Backtest {
    pub policy: String,
    pub mode: String,
    pub start: Timestamp,
    pub end: Timestamp,
    pub step_seconds: i64,
    pub regret_horizon_seconds: i64,
    pub workloads: Vec<WorkloadOutcome>,
    pub summary: Summary,
}
