//! `backtest --sweep`: the policy replayed over a range of fixed idle durations and of
//! resumption-risk levels, beside the fixed rules other tools use, on the same trace. Each
//! point is what that variant reclaims and how often it regrets: the frontier of
//! reclaimed GPU-hours against regret rate (docs/decision-quality.md).
//!
//! Pure: takes the policy and the trace, returns points; rendering is in `report`.

use jiff::SignedDuration;
use serde::Serialize;

use super::{Backtest, BacktestOptions, TimelineState, run};
use crate::api::policy::GpuPolicySpec;
use crate::engine::rules::dur as std_dur;
use crate::telemetry::trace::Trace;

/// Which family a point belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Family {
    /// This policy with a fixed `action.after` and no risk gate.
    Fixed,
    /// This policy with `idle.maxResumeRisk`.
    Risk,
    /// Another tool's fixed rule, acting at once when it fires (no warning).
    Baseline,
}

/// One variant's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    pub family: Family,
    pub label: String,
    pub actions: usize,
    pub regrets: usize,
    pub regret_rate: f64,
    pub reclaimed_gpu_hours: f64,
}

/// The variants to run.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    /// `action.after` of the fixed variants (the notice before it is the policy's).
    pub fixed_after: Vec<SignedDuration>,
    /// `idle.maxResumeRisk` of the risk variants (the policy's durations are the minimum).
    pub risk_levels: Vec<f64>,
}

impl Default for SweepSpec {
    fn default() -> Self {
        Self {
            fixed_after: [60, 90, 120, 180, 240, 360, 480]
                .into_iter()
                .map(SignedDuration::from_mins)
                .collect(),
            risk_levels: vec![0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5],
        }
    }
}

fn kube_duration(d: SignedDuration) -> kube::core::Duration {
    kube::core::Duration::from(std::time::Duration::from_secs(
        d.as_secs().max(0).unsigned_abs(),
    ))
}

fn point(family: Family, label: String, b: &Backtest) -> Point {
    Point {
        family,
        label,
        actions: b.summary.actions,
        regrets: b.summary.regrets,
        regret_rate: b.summary.regret_rate,
        reclaimed_gpu_hours: b.summary.reclaimed_gpu_hours,
    }
}

/// Runs every variant. `maxPerHour` is lifted: the sweep measures when to act, not how
/// many actions at once.
pub fn sweep(
    policy: &GpuPolicySpec,
    trace: &Trace,
    spec: &SweepSpec,
    regret_horizon: SignedDuration,
) -> Vec<Point> {
    let options = BacktestOptions {
        regret_horizon,
        keep_timelines: false,
    };
    let mut base = policy.clone();
    base.action.max_per_hour = u32::MAX;
    base.mode = crate::api::policy::PolicyMode::Enforce;
    let notice = std_dur(&base.action.after) - std_dur(&base.warn.after);
    let mut points = Vec::new();
    for &after in &spec.fixed_after {
        let mut p = base.clone();
        p.idle.max_resume_risk = None;
        p.idle.max_idle = None;
        let warn = (after - notice).max(SignedDuration::ZERO);
        p.warn.after = kube_duration(warn);
        p.action.after = kube_duration(after);
        let window = std_dur(&p.idle.window).min(after);
        p.idle.window = kube_duration(window.max(SignedDuration::from_mins(1)));
        let b = run("sweep", &p, trace, &options);
        points.push(point(
            Family::Fixed,
            format!("act after {}", crate::engine::classify::human(after)),
            &b,
        ));
    }
    for &risk in &spec.risk_levels {
        let mut p = base.clone();
        p.idle.max_resume_risk = Some(risk);
        p.idle.resume_horizon = kube_duration(regret_horizon);
        let b = run("sweep", &p, trace, &options);
        points.push(point(
            Family::Risk,
            format!("maxResumeRisk {:.0} %", risk * 100.0),
            &b,
        ));
    }
    let timelines = run(
        "sweep",
        &base,
        trace,
        &BacktestOptions {
            regret_horizon,
            keep_timelines: true,
        },
    );
    let threshold = base.idle.threshold as f32;
    let step = trace.step_seconds;
    let steps = |m: i64| ((m * 60) / step).max(1) as usize;
    points.push(baseline(
        "other tools: max over 30m == 0",
        &timelines,
        step,
        threshold,
        regret_horizon,
        |w| {
            w.len() >= steps(30)
                && w[w.len() - steps(30)..]
                    .iter()
                    .all(|a| a.is_finite() && *a == 0.0)
        },
    ));
    points.push(baseline(
        "other tools: avg over 1h <= 1 %",
        &timelines,
        step,
        threshold,
        regret_horizon,
        |w| {
            let n = steps(60);
            w.len() >= n && {
                let tail = &w[w.len() - n..];
                tail.iter().all(|a| a.is_finite())
                    && tail.iter().map(|a| f64::from(*a)).sum::<f64>() / n as f64 <= 0.01
            }
        },
    ));
    points
}

/// Replays a fixed rule over each workload's activity: when `fires` on the activity so
/// far, act at once; the action reclaims the GPUs until activity at or above `threshold`
/// resumes (a regret within `horizon`), the pods go away, or the trace ends.
fn baseline(
    label: &str,
    timelines: &Backtest,
    step_seconds: i64,
    threshold: f32,
    horizon: SignedDuration,
    fires: impl Fn(&[f32]) -> bool,
) -> Point {
    let hours_per_step = step_seconds as f64 / 3600.0;
    let horizon_steps = (horizon.as_secs() / step_seconds.max(1)) as usize;
    let (mut actions, mut regrets, mut reclaimed) = (0usize, 0usize, 0.0f64);
    for w in &timelines.workloads {
        let Some(t) = &w.timeline else { continue };
        let gpus = f64::from(w.gpus.max(1));
        // Activity since the workload (re)appeared or was last given back.
        let mut since = 0usize;
        let mut acted: Option<usize> = None;
        for k in 0..t.activity.len() {
            let a = t.activity[k];
            let present = !matches!(t.state[k], TimelineState::Absent);
            if let Some(at) = acted {
                if !present || a >= threshold {
                    reclaimed += (k - at) as f64 * hours_per_step * gpus;
                    if present && k - at <= horizon_steps {
                        regrets += 1;
                    }
                    acted = None;
                    since = k;
                }
                continue;
            }
            if !present {
                since = k + 1;
                continue;
            }
            if fires(&t.activity[since..=k]) {
                actions += 1;
                acted = Some(k);
            }
        }
        if let Some(at) = acted {
            reclaimed += (t.activity.len() - at) as f64 * hours_per_step * gpus;
        }
    }
    Point {
        family: Family::Baseline,
        label: label.to_string(),
        actions,
        regrets,
        regret_rate: if actions > 0 {
            regrets as f64 / actions as f64
        } else {
            0.0
        },
        reclaimed_gpu_hours: reclaimed,
    }
}

/// Whether every fixed point is dominated: some risk point reclaims at least as much with
/// a regret rate no higher, or regrets less while reclaiming at least as much.
pub fn risk_dominates_fixed(points: &[Point]) -> Vec<(String, Option<String>)> {
    points
        .iter()
        .filter(|p| p.family != Family::Risk)
        .map(|f| {
            let better = points
                .iter()
                .filter(|r| r.family == Family::Risk)
                .filter(|r| {
                    r.reclaimed_gpu_hours >= f.reclaimed_gpu_hours && r.regret_rate <= f.regret_rate
                })
                .min_by(|a, b| a.regret_rate.total_cmp(&b.regret_rate))
                .map(|r| r.label.clone());
            (f.label.clone(), better)
        })
        .collect()
}
