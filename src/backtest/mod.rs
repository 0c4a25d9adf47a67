//! Backtest: replays a recorded trace through the engine, step by step, exactly as the
//! controller would have evaluated it, and measures what the policy would have done:
//! idle GPU-hours, warnings, actions, reclaimed GPU-hours and dollars, and regrets.
//!
//! Pure: takes a [`Trace`] in memory and returns outcomes; reading files and rendering
//! reports happen at the edges (`telemetry::trace`, `report`).
//!
//! Definitions: an action at time `a` **reclaims** the workload's GPUs until activity
//! (≥ threshold) resumes, its pods go away, or the trace ends; it is a **regret** if
//! activity resumes within the regret horizon of `a`. Backtest simulates Enforce: in an
//! Audit policy, "would act" counts as acting.

mod outcome;
pub mod samples;
pub mod sweep;
pub mod synth;

pub use outcome::{
    ActionOutcome, Backtest, BacktestOptions, PreWarmSummary, Summary, Timeline, TimelineState,
    WorkloadOutcome,
};

use std::collections::{BTreeMap, HashMap, VecDeque};

use jiff::{SignedDuration, Timestamp};

use crate::api::GpuPolicy;
use crate::api::keys;
use crate::api::policy::{ActionType, GpuPolicySpec};
use crate::engine::inference::Softer;
use crate::engine::model::{
    Classification, GpuObservation, LadderState, PodPhase, PodState, Step, WorkloadMeta,
};
use crate::engine::step::{backfill, prewarms};
use crate::engine::{
    ActivityTracker, Candidate, Histories, Planned, Rules, Sample, evaluate_policy,
};
use crate::telemetry::trace::{PHASE_FAILED, PHASE_PENDING, PHASE_SUCCEEDED, Trace};

/// `controller --history-backfill`'s default (the one place it is written: clap shows and
/// uses it through `cli::GoDuration`): the most of the warm-up a controller installed at
/// its end would read back from Prometheus. Seven days: what the risk estimate's calendar
/// looks back over (it needs three), so a restart leaves no policy without it; read one
/// piece at a time, it costs the controller a piece's memory, not the week's
/// (docs/performance.md, "Start-up backfill").
pub const CONTROLLER_BACKFILL: SignedDuration = SignedDuration::from_hours(7 * 24);

/// An action in effect on a workload.
struct Reaped {
    at: Timestamp,
    action: ActionType,
    hourly_usd: f64,
    /// The classification it was acted on in.
    class: &'static str,
    reason: String,
    /// Replicas kept (a scale to a minimum), and the share of the GPUs reclaimed.
    kept: Option<i32>,
    reclaimed_share: f64,
    /// The resumption risk the estimate gave when it acted (None: no estimate).
    risk: Option<f64>,
}

impl Reaped {
    /// What this reclaim came to, ended at `until`: GPU-hours and dollars for the time
    /// it held, `share` GPUs (times the share reclaimed).
    fn outcome(
        self,
        until: Timestamp,
        share: f64,
        resumed_at: Option<Timestamp>,
        regret: bool,
        prewarmed_at: Option<Timestamp>,
    ) -> ActionOutcome {
        let hours = until.duration_since(self.at).as_secs_f64() / 3600.0;
        ActionOutcome {
            at: self.at,
            action: self.action,
            resumed_at,
            reclaimed_gpu_hours: hours * share * self.reclaimed_share,
            reclaimed_usd: hours * self.hourly_usd * self.reclaimed_share,
            regret,
            reason: self.reason,
            kept_replicas: self.kept,
            estimated_risk: self.risk,
            prewarmed_at,
        }
    }
}

/// A pre-warm waiting for its use.
#[derive(Clone, Copy)]
struct Woken {
    at: Timestamp,
    /// The action the wake ended.
    action_at: Timestamp,
}

struct Live {
    /// Woken by a pre-warm and not used (nor acted on, nor gone) since.
    woken: Option<Woken>,
    meta: WorkloadMeta,
    /// Indexes into `trace.pods`.
    pods: Vec<usize>,
    /// Its pods' names, in the order of `pod_states` (a DCGM-only pod: its own).
    pod_names: Vec<String>,
    /// Indexes into `trace.gpus`.
    gpus: Vec<usize>,
    pod_states: Vec<PodState>,
    observations: Vec<GpuObservation>,
    trackers: Vec<ActivityTracker>,
    first_bucket: i64,
    last_bucket: i64,
    ladder: LadderState,
    /// The action in effect, if any.
    reaped: Option<Reaped>,
    class_steps: BTreeMap<&'static str, u64>,
    /// Steps in which the workload held GPUs (reclaimed steps included).
    held_steps: u64,
    outcome: WorkloadOutcome,
}

/// What one step of a replay planned: the inputs the engine's one decision step
/// ([`evaluate_policy`]) was given and what it answered, for a test to replay the same
/// inputs through the controller.
#[derive(Debug)]
pub struct StepRecord<'a> {
    pub now: Timestamp,
    /// The governed workloads evaluated (those holding GPUs and not reclaimed).
    pub candidates: &'a [Candidate<'a, usize>],
    /// Each candidate's pods' names, in the order of its `pods`.
    pub pod_names: Vec<&'a [String]>,
    pub acted_last_hour: u32,
    pub planned: &'a [Planned],
    /// The workloads reclaimed (none kept serving) before this step's actions, and when.
    pub reclaimed: Vec<(&'a WorkloadMeta, Timestamp)>,
    /// The pre-warms due (`action.preWarm`), of workloads among `reclaimed`.
    pub prewarms: Vec<(&'a WorkloadMeta, &'a crate::engine::prewarm::PreWarm)>,
}

/// Replays `trace` under `policy`.
pub fn run(
    policy_name: &str,
    policy: &GpuPolicySpec,
    trace: &Trace,
    options: &BacktestOptions,
) -> Backtest {
    run_observed(policy_name, policy, trace, options, |_| {})
}

/// [`run`], showing each evaluated step to `observe`.
pub fn run_observed(
    policy_name: &str,
    policy: &GpuPolicySpec,
    trace: &Trace,
    options: &BacktestOptions,
    mut observe: impl FnMut(&StepRecord<'_>),
) -> Backtest {
    let rules = Rules::from_spec(policy);
    let step = SignedDuration::from_secs(trace.step_seconds);
    let hours_per_step = trace.step_seconds as f64 / 3600.0;
    let mut live = build_workloads(&rules, policy, trace, step);
    let bound: std::collections::HashSet<usize> =
        live.iter().flat_map(|w| w.gpus.iter().copied()).collect();
    let unallocated_gpus = (0..trace.gpus.len())
        .filter(|i| !bound.contains(i) && trace.gpus[*i].pod_unallocated())
        .count();
    let mut recent_actions: VecDeque<Timestamp> = VecDeque::new();
    let mut summary = Summary {
        unallocated_gpus,
        ..Summary::default()
    };
    // Idle spans seen so far (never after `now`): the resumption-risk estimate's input.
    let mut history: Histories<usize> = Histories::new(rules.risk);
    let step_secs = trace.step_seconds.max(1);
    let warm_until =
        trace.first_bucket + (options.warmup.as_secs().max(0) + step_secs - 1) / step_secs;
    // The warm-up is the controller's start-up backfill: the same raw samples fed into
    // the history, with nothing classified, warned, acted on or counted.
    if warm_until > trace.first_bucket {
        let gpus_of: Vec<(usize, Vec<usize>)> = live
            .iter()
            .enumerate()
            .map(|(wi, w)| (wi, w.gpus.clone()))
            .collect();
        let until = ts(warm_until * step_secs);
        let from = until - options.history_backfill;
        backfill(&mut history, trace, &gpus_of, &rules, from, until);
    }
    // Workloads evaluated this step: (index into `live`, replicas holding GPUs, highest
    // activity of any GPU).
    let mut evaluated: Vec<(usize, usize, f32)> = Vec::new();

    for bucket in trace.first_bucket..=trace.last_bucket {
        let now = ts(bucket * trace.step_seconds);
        evaluated.clear();
        // Still warming up: the trackers follow the samples (the controller's queries see
        // the recent past), the ladder and the report do not.
        let counting = bucket >= warm_until;
        for (wi, w) in live.iter_mut().enumerate() {
            let present = bucket >= w.first_bucket && bucket <= w.last_bucket;
            let mut max_activity = f32::NAN;
            let mut any_busy = false;
            for (k, &gi) in w.gpus.iter().enumerate() {
                let g = &trace.gpus[gi];
                let sample = Sample {
                    engine_active: g.engine_active.get(bucket).map(f64::from),
                    gpu_util_percent: g.gpu_util.get(bucket).map(f64::from),
                    fb_used_mib: g.fb_used.get(bucket).map(f64::from),
                    pcie_rx_bytes_per_second: g.pcie_rx.get(bucket).map(f64::from),
                    power_watts: g.power.get(bucket).map(f64::from),
                };
                let has_any = sample != Sample::default();
                w.trackers[k].advance(now, has_any.then_some(&sample), &rules);
                w.trackers[k].fill(&mut w.observations[k]);
                if let Some(a) = rules.activity(sample.engine_active, sample.gpu_util_percent) {
                    max_activity = max_activity.max(a as f32);
                    any_busy |= a >= rules.threshold;
                }
            }
            let mut holding = false;
            let mut replicas = 0usize;
            for (k, &pi) in w.pods.iter().enumerate() {
                let p = &trace.pods[pi];
                let state = &mut w.pod_states[k];
                let alive = bucket >= p.first_bucket && bucket <= p.last_bucket;
                let phase = p.phase.get(bucket);
                let waiting = p
                    .waiting
                    .get(bucket)
                    .map(|i| trace.waiting_reasons[i as usize].clone());
                state.phase = match phase {
                    _ if !alive => PodPhase::Succeeded,
                    Some(PHASE_PENDING) => PodPhase::Pending,
                    Some(PHASE_SUCCEEDED) => PodPhase::Succeeded,
                    Some(PHASE_FAILED) => PodPhase::Failed,
                    _ => PodPhase::Running,
                };
                state.waiting_reason = if alive { waiting } else { None };
                state.stuck_since = if state.is_stuck() {
                    state.stuck_since.or(Some(now))
                } else {
                    None
                };
                let holds = alive && !matches!(state.phase, PodPhase::Succeeded | PodPhase::Failed);
                holding |= holds;
                replicas += usize::from(holds);
            }
            if w.pods.is_empty() {
                // A pod known only from DCGM series: it holds its GPUs while they report.
                holding = present;
                replicas = usize::from(present);
            }
            if !counting {
                continue;
            }
            if present && holding {
                w.held_steps += 1;
            }

            if let Some(r) = &w.reaped {
                let (at, hourly, class) = (r.at, r.hourly_usd, r.class);
                if !present || !holding || any_busy {
                    // Back (the owner scaled it up: busy) or gone. Either way the
                    // controller sees it again, or never: the history learns the span's
                    // end from the next evaluation, or keeps it open.
                    let until = now;
                    let share: f64 = w.share_hint();
                    let regret = any_busy && until.duration_since(at) <= options.regret_horizon;
                    if let Some(r) = w.reaped.take() {
                        let resumed_at = any_busy.then_some(until);
                        w.outcome
                            .actions
                            .push(r.outcome(until, share, resumed_at, regret, None));
                    }
                    w.ladder = LadderState {
                        snooze_until: w.ladder.snooze_until,
                        ..LadderState::default()
                    };
                } else {
                    // Reclaimed: in the cluster its GPUs are gone, so the controller does
                    // not evaluate it. Reclaimed time was idle time: it counts in both.
                    *w.class_steps.entry(class).or_default() += 1;
                    let share = w.share_hint();
                    w.outcome.idle_gpu_hours += share * hours_per_step;
                    w.outcome.idle_usd += hourly * hours_per_step;
                    *w.outcome
                        .gpu_hours_by_class
                        .entry(class.to_string())
                        .or_default() += share * hours_per_step;
                    w.record(bucket, max_activity, TimelineState::Reclaimed, options);
                    continue;
                }
            }
            if let Some(woken) = w.woken.filter(|_| any_busy || !present || !holding) {
                w.woken = None;
                let share = w.share_hint();
                let p = &mut summary.prewarm;
                p.warm_gpu_hours += now.duration_since(woken.at).as_secs_f64() / 3600.0 * share;
                if any_busy && present && holding {
                    if now.duration_since(woken.at) <= options.regret_horizon {
                        p.warm_starts += 1;
                    } else {
                        p.unused += 1;
                    }
                    if now.duration_since(woken.action_at) <= options.regret_horizon {
                        p.regrets_avoided += 1;
                    }
                } else {
                    p.unused += 1;
                }
            }
            if !present || !holding {
                w.record(bucket, max_activity, TimelineState::Absent, options);
                continue;
            }
            evaluated.push((wi, replicas, max_activity));
        }
        if !counting {
            continue;
        }
        while recent_actions
            .front()
            .is_some_and(|t| now.duration_since(*t) >= SignedDuration::from_hours(1))
        {
            recent_actions.pop_front();
        }
        let candidates: Vec<Candidate<'_, usize>> = evaluated
            .iter()
            .map(|&(wi, replicas, _)| {
                let w = &live[wi];
                Candidate {
                    key: wi,
                    meta: &w.meta,
                    pods: &w.pod_states,
                    gpus: &w.observations,
                    ladder: w.ladder.clone(),
                    replicas,
                    group: None,
                    blocked: None,
                }
            })
            .collect();
        let acted_last_hour = recent_actions.len() as u32;
        let planned = evaluate_policy(
            &rules,
            &candidates,
            &mut history,
            acted_last_hour,
            step,
            now,
        );
        // `action.preWarm`: the reclaimed workloads (none kept serving) usually busy
        // again within `before` are woken, as the controller wakes them (after this
        // step's decisions: one reclaimed now is never due, see `engine::prewarm`).
        let reclaimed: Vec<(usize, Timestamp)> = live
            .iter()
            .enumerate()
            .filter_map(|(wi, w)| {
                w.reaped
                    .as_ref()
                    .filter(|r| r.kept.is_none())
                    .map(|r| (wi, r.at))
            })
            .collect();
        let due = prewarms(&rules, &reclaimed, &history, now);
        observe(&StepRecord {
            now,
            candidates: &candidates,
            pod_names: evaluated
                .iter()
                .map(|&(wi, ..)| live[wi].pod_names.as_slice())
                .collect(),
            acted_last_hour,
            planned: &planned,
            reclaimed: reclaimed
                .iter()
                .map(|&(wi, at)| (&live[wi].meta, at))
                .collect(),
            prewarms: due.iter().map(|(wi, p)| (&live[*wi].meta, p)).collect(),
        });
        drop(candidates);
        for (&(wi, replicas, max_activity), p) in evaluated.iter().zip(planned) {
            let w = &mut live[wi];
            let decision = p.decision;
            let class = &decision.verdict.classification;
            *w.class_steps.entry(class.as_str()).or_default() += 1;
            if class.is_idle() {
                w.outcome.idle_gpu_hours += decision.verdict.gpu_share * hours_per_step;
                w.outcome.idle_usd += decision.hourly_usd * hours_per_step;
            }
            *w.outcome
                .gpu_hours_by_class
                .entry(class.as_str().to_string())
                .or_default() += decision.verdict.gpu_share * hours_per_step;
            w.outcome.gpus = w.outcome.gpus.max(decision.verdict.gpu_devices);
            let drawn = match class {
                Classification::Active => TimelineState::Active,
                Classification::Idle(_) => TimelineState::Idle,
                Classification::NoTelemetry => TimelineState::NoTelemetry,
                _ => TimelineState::NotJudged,
            };
            w.record(bucket, max_activity, drawn, options);
            if let Some(action) = p.unsupported
                && w.outcome.unsupported.is_none()
            {
                w.outcome.unsupported = Some(action);
            }
            w.outcome.last_reason = decision.reason.clone();
            match decision.step {
                Step::Warn => {
                    w.ladder.warned_at = Some(now);
                    w.outcome.warnings.push(now);
                }
                Step::Act(action) | Step::WouldAct(action) => {
                    if let Some(woken) = w.woken.take() {
                        // Woken for nothing: reclaimed again.
                        let p = &mut summary.prewarm;
                        p.unused += 1;
                        p.warm_gpu_hours +=
                            now.duration_since(woken.at).as_secs_f64() / 3600.0 * w.share_hint();
                    }
                    // The idle span stays open: when the workload comes back and is busy,
                    // its length is known (as the controller sees an owner's scale-up).
                    w.ladder.reaped_at = Some(now);
                    let (kept, reclaimed_share, reason) = match p.softer {
                        Softer::Keep { keep, why } => (
                            Some(keep),
                            // `keep` < replicas, else it would be AtMinimum.
                            crate::engine::inference::reclaimed_share(replicas, keep),
                            format!(
                                "{}; request-driven inference ({why}): scaled down to {keep} replica(s) of {replicas} instead of zero",
                                decision.reason
                            ),
                        ),
                        _ => (None, 1.0, decision.reason.clone()),
                    };
                    w.reaped = Some(Reaped {
                        at: now,
                        action,
                        hourly_usd: decision.hourly_usd,
                        class: decision.verdict.classification.as_str(),
                        reason,
                        kept,
                        reclaimed_share,
                        risk: decision.estimate.as_ref().map(|e| e.risk()),
                    });
                    recent_actions.push_back(now);
                }
                Step::RateLimited(_) => summary.rate_limited += 1,
                Step::Nothing => {}
            }
        }
        for (wi, _) in due {
            let w = &mut live[wi];
            let Some(r) = w.reaped.take() else { continue };
            let share = w.share_hint();
            let action_at = r.at;
            w.outcome
                .actions
                .push(r.outcome(now, share, None, false, Some(now)));
            // As `gpureaper.io/woken-at` does: the ladder starts again, with a fresh
            // startup grace.
            w.meta.created_at = now;
            w.ladder = LadderState {
                snooze_until: w.ladder.snooze_until,
                ..LadderState::default()
            };
            w.woken = Some(Woken { at: now, action_at });
            summary.prewarm.wakes += 1;
        }
    }

    let end = ts((trace.last_bucket + 1) * trace.step_seconds);
    let mut workloads = Vec::with_capacity(live.len());
    for mut w in live {
        if let Some(r) = w.reaped.take() {
            let share = w.share_hint();
            w.outcome
                .actions
                .push(r.outcome(end, share, None, false, None));
        }
        if let Some(woken) = w.woken.take() {
            summary.prewarm.unused += 1;
            summary.prewarm.warm_gpu_hours +=
                end.duration_since(woken.at).as_secs_f64() / 3600.0 * w.share_hint();
        }
        let o = &mut w.outcome;
        o.classification = w
            .class_steps
            .iter()
            .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))
            .map_or("NotPresent", |(name, _)| name)
            .to_string();
        o.warned_at = o.warnings.first().copied();
        o.acted_at = o.actions.first().map(|a| a.at);
        o.action = o.actions.first().map(|a| a.action);
        o.reclaimed_gpu_hours = sum(o.actions.iter().map(|a| a.reclaimed_gpu_hours));
        o.reclaimed_usd = sum(o.actions.iter().map(|a| a.reclaimed_usd));
        o.regret = o.actions.iter().any(|a| a.regret);
        summary.gpu_hours += w.held_steps as f64 * hours_per_step * w.share_hint();
        workloads.push(w.outcome);
    }
    workloads
        .sort_by(|a, b| (&a.namespace, &a.kind, &a.name).cmp(&(&b.namespace, &b.kind, &b.name)));
    summary.workloads = workloads.len();
    summary.governed_gpus = workloads.iter().map(|w| w.gpus).sum();
    summary.idle_gpu_hours = sum(workloads.iter().map(|w| w.idle_gpu_hours));
    summary.reclaimed_gpu_hours = sum(workloads.iter().map(|w| w.reclaimed_gpu_hours));
    summary.reclaimed_usd = sum(workloads.iter().map(|w| w.reclaimed_usd));
    summary.warnings = workloads.iter().map(|w| w.warnings.len()).sum();
    summary.actions = workloads.iter().map(|w| w.actions.len()).sum();
    summary.unsupported = workloads.iter().filter(|w| w.unsupported.is_some()).count();
    summary.regrets = workloads
        .iter()
        .flat_map(|w| &w.actions)
        .filter(|a| a.regret)
        .count();
    summary.idle_share = ratio(summary.idle_gpu_hours, summary.gpu_hours);
    summary.reclaimed_share = ratio(summary.reclaimed_gpu_hours, summary.gpu_hours);
    summary.regret_rate = ratio(summary.regrets as f64, summary.actions as f64);

    Backtest {
        policy: policy_name.to_string(),
        mode: format!("{:?}", policy.mode),
        start: ts(warm_until.min(trace.last_bucket + 1) * trace.step_seconds),
        end,
        step_seconds: trace.step_seconds,
        regret_horizon_seconds: options.regret_horizon.as_secs(),
        workloads,
        summary,
    }
}

/// A float sum that is `0.0`, not `-0.0`, when empty (std's starts from `-0.0`).
fn sum(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, |a, b| a + b)
}

/// The DCGM exporter's own pod (`nvidia-dcgm-exporter-…`, `dcgm-exporter-…`).
fn is_exporter_pod(pod: &str) -> bool {
    pod.contains("dcgm-exporter")
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

fn ts(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
}

impl Live {
    /// GPU shares held, as the engine counts them (observed shares + unobserved devices).
    fn share_hint(&self) -> f64 {
        let observed: f64 = self.observations.iter().map(|o| o.share).sum();
        let devices: u32 = self.outcome.gpus;
        observed + f64::from(devices.saturating_sub(self.observations.len() as u32))
    }

    fn record(
        &mut self,
        bucket: i64,
        activity: f32,
        state: TimelineState,
        options: &BacktestOptions,
    ) {
        if !options.keep_timelines {
            return;
        }
        let t = self.outcome.timeline.get_or_insert_with(|| Timeline {
            first_bucket: bucket,
            ..Timeline::default()
        });
        t.activity.push(activity);
        t.state.push(state);
    }
}

/// The policy as it matches a trace's workloads, through [`GpuPolicy::matches`] as in the
/// controller: kube-state-metrics exports labels under sanitised names
/// (`app.kubernetes.io/name` → `app_kubernetes_io_name`), so the selectors' keys are
/// sanitised once, the same way.
pub fn matching_trace_labels(policy: &GpuPolicySpec) -> GpuPolicy {
    let mut spec = policy.clone();
    let m = &mut spec.match_;
    for selector in [&mut m.namespace_selector, &mut m.workload_selector]
        .into_iter()
        .flatten()
    {
        if let Some(labels) = selector.match_labels.take() {
            selector.match_labels = Some(
                labels
                    .into_iter()
                    .map(|(k, v)| (keys::ksm_sanitize(&k), v))
                    .collect(),
            );
        }
        for e in selector.match_expressions.iter_mut().flatten() {
            e.key = keys::ksm_sanitize(&e.key);
        }
    }
    GpuPolicy::new("backtest", spec)
}

/// Groups pods into root workloads, keeps those the policy governs, and prepares their
/// trackers.
fn build_workloads(
    rules: &Rules,
    policy: &GpuPolicySpec,
    trace: &Trace,
    step: SignedDuration,
) -> Vec<Live> {
    let matcher = matching_trace_labels(policy);
    let mut pods_by_key: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, p) in trace.pods.iter().enumerate() {
        pods_by_key.insert((&p.namespace, &p.name), i);
    }
    let mut gpus_by_pod: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, g) in trace
        .gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| !g.gpu.pod.is_empty())
    {
        gpus_by_pod
            .entry((&g.gpu.namespace, &g.gpu.pod))
            .or_default()
            .push(i);
    }
    // Root workload of each pod that requests GPUs. A pod kube-state-metrics knows without
    // GPU requests holds none: DCGM series labelled with it are the exporter's own.
    let mut groups: BTreeMap<(String, String, String), Vec<usize>> = BTreeMap::new();
    for (i, p) in trace
        .pods
        .iter()
        .enumerate()
        .filter(|(_, p)| p.gpu_devices() > 0)
    {
        let (kind, name) = match &p.owner {
            None => ("Pod".to_string(), p.name.clone()),
            Some((k, n)) if k == "ReplicaSet" => trace
                .replicaset_owners
                .get(&(p.namespace.clone(), n.clone()))
                .cloned()
                .unwrap_or_else(|| (k.clone(), n.clone())),
            Some((k, n)) => (k.clone(), n.clone()),
        };
        groups
            .entry((p.namespace.clone(), kind, name))
            .or_default()
            .push(i);
    }
    // DCGM series whose pod kube-state-metrics never reported: a bare pod of their own,
    // unless the pod is the exporter itself (GPUs without a workload carry its labels).
    let mut orphan_pods: Vec<(String, String)> = gpus_by_pod
        .keys()
        .filter(|k| !pods_by_key.contains_key(*k) && !is_exporter_pod(k.1))
        .map(|(ns, pod)| (ns.to_string(), pod.to_string()))
        .collect();
    orphan_pods.sort();

    let mut out = Vec::new();
    let mut add =
        |namespace: String, kind: String, name: String, pods: Vec<usize>, orphan: Option<&str>| {
            let mut labels = BTreeMap::new();
            let mut annotations = BTreeMap::new();
            let mut created: Option<i64> = None;
            let mut first = i64::MAX;
            let mut last = i64::MIN;
            let mut gpus = Vec::new();
            let mut pod_states = Vec::new();
            for &pi in &pods {
                let p = &trace.pods[pi];
                labels.extend(p.labels.clone());
                annotations.extend(p.annotations.clone());
                created = created.min(p.created).or(p.created);
                first = first.min(p.first_bucket);
                last = last.max(p.last_bucket);
                let k = pod_states.len();
                pod_states.push(PodState {
                    phase: PodPhase::Running,
                    waiting_reason: None,
                    stuck_since: None,
                    gpu_devices: p.gpu_devices(),
                });
                for &gi in gpus_by_pod
                    .get(&(p.namespace.as_str(), p.name.as_str()))
                    .into_iter()
                    .flatten()
                {
                    gpus.push((gi, k));
                }
            }
            if let Some(pod) = orphan {
                let series = gpus_by_pod
                    .get(&(namespace.as_str(), pod))
                    .cloned()
                    .unwrap_or_default();
                for &gi in &series {
                    if let Some((a, b)) = trace.gpus[gi]
                        .engine_active
                        .span()
                        .or(trace.gpus[gi].gpu_util.span())
                    {
                        first = first.min(a);
                        last = last.max(b);
                    }
                    gpus.push((gi, 0));
                }
                pod_states.push(PodState {
                    phase: PodPhase::Running,
                    waiting_reason: None,
                    stuck_since: None,
                    gpu_devices: series.len() as u32,
                });
            }
            let ns_labels = trace
                .namespace_labels
                .get(&namespace)
                .cloned()
                .unwrap_or_default();
            let governed = matcher.matches(&kind, &ns_labels, &labels);
            if !governed || first > last {
                return;
            }
            let created_at = ts(created.unwrap_or(first * trace.step_seconds));
            let ladder = LadderState::from_annotations(&annotations);
            let observations = gpus
                .iter()
                .map(|&(gi, pod)| GpuObservation {
                    id: trace.gpus[gi].gpu.id.clone(),
                    model: trace.gpus[gi].gpu.model.clone(),
                    share: trace.gpus[gi].gpu.share,
                    pod,
                    ..GpuObservation::default()
                })
                .collect();
            let outcome = WorkloadOutcome {
                namespace: namespace.clone(),
                kind: kind.clone(),
                name: name.clone(),
                gpus: 0,
                classification: String::new(),
                idle_gpu_hours: 0.0,
                idle_usd: 0.0,
                gpu_hours_by_class: BTreeMap::new(),
                warned_at: None,
                acted_at: None,
                action: None,
                reclaimed_gpu_hours: 0.0,
                reclaimed_usd: 0.0,
                regret: false,
                unsupported: None,
                warnings: vec![],
                actions: vec![],
                last_reason: String::new(),
                timeline: None,
            };
            let mut pod_names: Vec<String> =
                pods.iter().map(|&pi| trace.pods[pi].name.clone()).collect();
            pod_names.extend(orphan.map(str::to_string));
            out.push(Live {
                woken: None,
                pod_names,
                meta: WorkloadMeta {
                    kind,
                    namespace,
                    name,
                    created_at,
                    labels,
                    annotations,
                },
                pods,
                trackers: gpus
                    .iter()
                    .map(|_| ActivityTracker::new(rules, step))
                    .collect(),
                gpus: gpus.iter().map(|(gi, _)| *gi).collect(),
                pod_states,
                observations,
                first_bucket: first,
                last_bucket: last,
                ladder: LadderState {
                    warned_at: None,
                    reaped_at: None,
                    ..ladder
                },
                reaped: None,
                class_steps: BTreeMap::new(),
                held_steps: 0,
                outcome,
            });
        };
    for ((ns, kind, name), pods) in groups {
        add(ns, kind, name, pods, None);
    }
    for (ns, pod) in orphan_pods {
        add(ns.clone(), "Pod".into(), pod.clone(), vec![], Some(&pod));
    }
    out
}
