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
    /// A fixed or risk variant with `action.preWarm` (the policy's, else 15m before and 3
    /// days): reclaimed workloads woken before their predicted use.
    PreWarm,
    /// Hindsight: acts `idle.window` into exactly the idle spans that do not resume
    /// within the regret horizon. Not a rule anything can follow (it knows when each span
    /// ends): what there is to reclaim without a regret, to measure the others against.
    Oracle,
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
    /// Risk points: how they compare with the fixed curve at their regret rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_fixed: Option<VsFixed>,
    /// Risk points of `--max-idle`: the `idle.maxIdle` ceiling they ran at, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_idle_seconds: Option<i64>,
    /// Risk points: the level asked against the regret rate realised.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// Pre-warm points: what the wakes cost and saved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prewarm: Option<super::PreWarmSummary>,
}

/// Significance of the calibration test: a realised regret rate is "within the noise" of
/// the level asked unless so many regrets would happen less than 5 % of the time.
pub const CALIBRATION_ALPHA: f64 = 0.05;

/// A risk level asked (`idle.maxResumeRisk`) against the regrets it realised.
///
/// The promise covers the actions **the estimate allowed** (its risk at most the level
/// asked). The others came by `idle.maxIdle` whatever the estimate (none, or above the
/// level): at it, or before it where waiting for it was expected to regret more (the
/// deadline, `engine::ladder::Deadline`); they are counted apart. The test is a one-sided exact binomial test: if every
/// allowed action regretted with probability `asked`, how likely are at least `regrets`
/// of `actions`? Below [`CALIBRATION_ALPHA`] the realised rate is above the promise
/// beyond the noise of that many actions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Calibration {
    pub asked: f64,
    /// Actions the estimate allowed, and their regrets.
    pub actions: usize,
    pub regrets: usize,
    pub realised: f64,
    /// The mean of the risks the estimate gave those actions (what it expected).
    pub mean_estimated_risk: f64,
    /// P(X ≥ regrets) for X ~ Binomial(actions, asked).
    pub p_value: f64,
    /// One-sided 95 % upper bound (Clopper–Pearson) of the true regret rate.
    pub upper_bound_95: f64,
    /// `p_value` ≥ [`CALIBRATION_ALPHA`].
    pub within_noise: bool,
    /// Actions by `idle.maxIdle` whatever the estimate (at it, or before it by the
    /// deadline), and their regrets.
    pub ceiling_actions: usize,
    pub ceiling_regrets: usize,
    /// The same test over every action of the level (allowed and at the ceiling).
    pub all_p_value: f64,
    pub all_within_noise: bool,
}

impl Calibration {
    /// From a replay's actions at the level `asked`.
    pub fn of(asked: f64, b: &Backtest) -> Self {
        let (mut n, mut k, mut risk_sum, mut cn, mut ck) = (0usize, 0usize, 0.0, 0usize, 0usize);
        for a in b.workloads.iter().flat_map(|w| &w.actions) {
            match a.estimated_risk {
                // The same tolerance as the gate's comparison (`risk <= max`).
                Some(r) if r <= asked => {
                    n += 1;
                    k += usize::from(a.regret);
                    risk_sum += r;
                }
                _ => {
                    cn += 1;
                    ck += usize::from(a.regret);
                }
            }
        }
        let p_value = binomial_upper_tail(k, n, asked);
        let all_p_value = binomial_upper_tail(k + ck, n + cn, asked);
        Self {
            asked,
            actions: n,
            regrets: k,
            realised: if n > 0 { k as f64 / n as f64 } else { 0.0 },
            mean_estimated_risk: if n > 0 { risk_sum / n as f64 } else { 0.0 },
            p_value,
            upper_bound_95: clopper_pearson_upper(k, n, 0.95),
            within_noise: p_value >= CALIBRATION_ALPHA,
            ceiling_actions: cn,
            ceiling_regrets: ck,
            all_p_value,
            all_within_noise: all_p_value >= CALIBRATION_ALPHA,
        }
    }
}

/// ln C(n, i) · p^i · (1−p)^(n−i), for every i in 0..=n.
fn binomial_log_pmf(n: usize, p: f64) -> Vec<f64> {
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let (lp, lq) = (p.ln(), (1.0 - p).ln());
    let mut out = Vec::with_capacity(n + 1);
    let mut log_choose = 0.0f64;
    for i in 0..=n {
        if i > 0 {
            log_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        out.push(log_choose + i as f64 * lp + (n - i) as f64 * lq);
    }
    out
}

fn log_sum_exp(xs: &[f64]) -> f64 {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// P(X ≥ k) for X ~ Binomial(n, p): 1 when k is 0.
pub fn binomial_upper_tail(k: usize, n: usize, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    if p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    log_sum_exp(&binomial_log_pmf(n, p)[k..]).exp().min(1.0)
}

/// The one-sided upper confidence bound of a binomial rate (Clopper–Pearson): the `p`
/// at which P(X ≤ k) = 1 − `confidence`. 1 with no trials.
pub fn clopper_pearson_upper(k: usize, n: usize, confidence: f64) -> f64 {
    if n == 0 || k >= n {
        return 1.0;
    }
    let alpha = 1.0 - confidence;
    let lower_tail = |p: f64| 1.0 - binomial_upper_tail(k + 1, n, p);
    let (mut lo, mut hi) = (k as f64 / n as f64, 1.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if lower_tail(mid) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// A risk point against the fixed curve: the fixed variants that are not worse on both
/// counts than another, joined by straight lines in (regret rate, GPU-hours).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VsFixed {
    /// What it is compared with: the two fixed variants whose regret rates bracket its
    /// own ("act after 6h–act after 4h"), or the curve's end when its rate is outside.
    pub against: String,
    /// Where its regret rate lies: below every fixed variant's, inside the curve, above.
    pub position: CurvePosition,
    /// The fixed curve's reclaimed GPU-hours at this regret rate (at the end, outside).
    pub curve_gpu_hours: f64,
    /// This point's minus the curve's. Positive inside or below the curve: more GPU-hours
    /// for the same (or a lower) regret rate, i.e. the fixed rules are dominated there.
    pub margin_gpu_hours: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CurvePosition {
    /// A lower regret rate than every fixed variant: compared with the lowest.
    Below,
    Inside,
    /// A higher regret rate than every fixed variant: compared with the highest.
    Above,
}

/// The fixed curve: fixed points by regret rate, without those another fixed point beats
/// on both counts (reclaims as much or more at a rate no higher).
fn fixed_curve(points: &[Point]) -> Vec<&Point> {
    let mut fixed: Vec<&Point> = points
        .iter()
        .filter(|p| p.family == Family::Fixed)
        .collect();
    fixed.sort_by(|a, b| {
        a.regret_rate
            .total_cmp(&b.regret_rate)
            .then(b.reclaimed_gpu_hours.total_cmp(&a.reclaimed_gpu_hours))
    });
    let mut curve: Vec<&Point> = Vec::new();
    for p in fixed {
        if curve
            .last()
            .is_none_or(|q| p.reclaimed_gpu_hours > q.reclaimed_gpu_hours)
        {
            curve.push(p);
        }
    }
    curve
}

/// How `p` compares with `curve` (from [`fixed_curve`]); None when there is no curve.
pub fn versus_fixed(curve: &[&Point], p: &Point) -> Option<VsFixed> {
    let (first, last) = (curve.first()?, curve.last()?);
    let r = p.regret_rate;
    let (against, position, at) = if r < first.regret_rate {
        (
            first.label.clone(),
            CurvePosition::Below,
            first.reclaimed_gpu_hours,
        )
    } else if r > last.regret_rate {
        (
            last.label.clone(),
            CurvePosition::Above,
            last.reclaimed_gpu_hours,
        )
    } else {
        let k = curve
            .windows(2)
            .position(|w| r <= w[1].regret_rate)
            .unwrap_or(0);
        match curve.get(k..=k + 1) {
            Some([a, b]) => {
                let span = b.regret_rate - a.regret_rate;
                let f = if span > 0.0 {
                    (r - a.regret_rate) / span
                } else {
                    1.0
                };
                (
                    format!("{}–{}", a.label, b.label),
                    CurvePosition::Inside,
                    a.reclaimed_gpu_hours + f * (b.reclaimed_gpu_hours - a.reclaimed_gpu_hours),
                )
            }
            // A single-point curve, at exactly its rate.
            _ => (
                first.label.clone(),
                CurvePosition::Inside,
                first.reclaimed_gpu_hours,
            ),
        }
    };
    Some(VsFixed {
        against,
        position,
        curve_gpu_hours: at,
        margin_gpu_hours: p.reclaimed_gpu_hours - at,
    })
}

/// The variants to run.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    /// `action.after` of the fixed variants (the notice before it is the policy's).
    pub fixed_after: Vec<SignedDuration>,
    /// `idle.maxResumeRisk` of the risk variants (the policy's durations are the minimum).
    pub risk_levels: Vec<f64>,
    /// `idle.maxIdle` of the risk variants: every level at each of these ceilings. Empty:
    /// the policy's own. Where the gate knows nothing it waits until `maxIdle`, so on a cold
    /// start the ceiling is the policy's real fixed rule.
    pub max_idle: Vec<SignedDuration>,
    /// Also run every fixed and risk variant (at the policy's `maxIdle`) with
    /// `action.preWarm` ([`Family::PreWarm`]); the others run without it.
    pub pre_warm: bool,
}

impl Default for SweepSpec {
    fn default() -> Self {
        Self {
            fixed_after: [60, 90, 120, 180, 240, 360, 480]
                .into_iter()
                .map(SignedDuration::from_mins)
                .collect(),
            risk_levels: vec![0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5],
            max_idle: Vec::new(),
            pre_warm: true,
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
        vs_fixed: None,
        max_idle_seconds: None,
        calibration: None,
        prewarm: None,
    }
}

/// The pre-warm of the sweep's [`Family::PreWarm`] variants: the policy's, else 15
/// minutes before a use seen on 3 past days.
pub fn sweep_pre_warm(policy: &GpuPolicySpec) -> crate::api::policy::PreWarm {
    policy
        .action
        .pre_warm
        .clone()
        .unwrap_or(crate::api::policy::PreWarm {
            before: kube_duration(SignedDuration::from_mins(15)),
            min_days: 3,
        })
}

/// A rule replayed over the timelines (the other tools', the oracle).
fn replayed(
    family: Family,
    label: String,
    actions: usize,
    regrets: usize,
    reclaimed_gpu_hours: f64,
) -> Point {
    Point {
        family,
        label,
        actions,
        regrets,
        regret_rate: if actions > 0 {
            regrets as f64 / actions as f64
        } else {
            0.0
        },
        reclaimed_gpu_hours,
        vs_fixed: None,
        max_idle_seconds: None,
        calibration: None,
        prewarm: None,
    }
}

/// Runs every variant, on as many threads as the machine has cores (each variant is an
/// independent replay; the points come back in the same order). `maxPerHour` is lifted:
/// the sweep measures when to act, not how many actions at once. `warmup` applies to
/// every variant alike (see [`BacktestOptions::warmup`]).
pub fn sweep(
    policy: &GpuPolicySpec,
    trace: &Trace,
    spec: &SweepSpec,
    regret_horizon: SignedDuration,
    warmup: SignedDuration,
    history_backfill: SignedDuration,
) -> Vec<Point> {
    let mut base = policy.clone();
    base.action.max_per_hour = u32::MAX;
    base.mode = crate::api::policy::PolicyMode::Enforce;
    let pre_warm = sweep_pre_warm(policy);
    base.action.pre_warm = None;
    let notice = std_dur(&base.action.after) - std_dur(&base.warn.after);
    // (family, label, policy, the --max-idle ceiling in seconds); the last job is the base
    // policy with timelines, for the other tools' rules and the oracle.
    let mut jobs: Vec<(Family, String, GpuPolicySpec, Option<i64>)> = Vec::new();
    for &after in &spec.fixed_after {
        let mut p = base.clone();
        p.idle.max_resume_risk = None;
        p.idle.max_idle = None;
        let warn = (after - notice).max(SignedDuration::ZERO);
        p.warn.after = kube_duration(warn);
        p.action.after = kube_duration(after);
        let window = std_dur(&p.idle.window).min(after);
        p.idle.window = kube_duration(window.max(SignedDuration::from_mins(1)));
        let label = format!("act after {}", crate::engine::classify::human(after));
        jobs.push((Family::Fixed, label, p, None));
    }
    let ceilings: Vec<Option<SignedDuration>> = if spec.max_idle.is_empty() {
        vec![None]
    } else {
        spec.max_idle.iter().copied().map(Some).collect()
    };
    for ceiling in ceilings {
        for &risk in &spec.risk_levels {
            let mut p = base.clone();
            p.idle.max_resume_risk = Some(risk);
            p.idle.resume_horizon = kube_duration(regret_horizon);
            let mut label = format!("maxResumeRisk {:.0} %", risk * 100.0);
            if let Some(m) = ceiling {
                p.idle.max_idle = Some(kube_duration(m));
                label = format!("{label} (maxIdle {})", crate::engine::classify::human(m));
            }
            jobs.push((Family::Risk, label, p, ceiling.map(|m| m.as_secs())));
        }
    }
    if spec.pre_warm {
        let warmed: Vec<_> = jobs
            .iter()
            .filter(|(family, _, _, ceiling)| *family == Family::Fixed || ceiling.is_none())
            .map(|(_, label, p, _)| {
                let mut p = p.clone();
                p.action.pre_warm = Some(pre_warm.clone());
                let label = format!(
                    "{label} + pre-warm {}",
                    crate::engine::classify::human(std_dur(&pre_warm.before))
                );
                (Family::PreWarm, label, p, None)
            })
            .collect();
        jobs.extend(warmed);
    }
    jobs.push((Family::Baseline, String::new(), base.clone(), None));
    let last = jobs.len() - 1;
    let runs = parallel_map(&jobs, |k, (_, _, p, _)| {
        let options = BacktestOptions {
            regret_horizon,
            keep_timelines: k == last,
            warmup,
            history_backfill,
        };
        run("sweep", p, trace, &options)
    });
    let mut runs = runs.into_iter();
    let mut points: Vec<Point> = jobs[..last]
        .iter()
        .zip(runs.by_ref())
        .map(|((family, label, p, ceiling), b)| Point {
            max_idle_seconds: *ceiling,
            calibration: match (family, p.idle.max_resume_risk) {
                (Family::Risk | Family::PreWarm, Some(asked)) => Some(Calibration::of(asked, &b)),
                _ => None,
            },
            prewarm: (*family == Family::PreWarm).then(|| b.summary.prewarm.clone()),
            ..point(*family, label.clone(), &b)
        })
        .collect();
    let timelines = runs.next().expect("one run per job");
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
    points.push(oracle(
        &timelines,
        step,
        threshold,
        regret_horizon,
        std_dur(&base.idle.window),
    ));
    let curve = fixed_curve(&points);
    let versus: Vec<Option<VsFixed>> = points
        .iter()
        .map(|p| match p.family {
            Family::Risk | Family::PreWarm => versus_fixed(&curve, p),
            _ => None,
        })
        .collect();
    for (p, v) in points.iter_mut().zip(versus) {
        p.vs_fixed = v;
    }
    points
}

/// `f` over `items` on up to `available_parallelism` threads, results in input order.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(usize, &T) -> R + Sync) -> Vec<R> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(items.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(k) else { break };
                    let r = f(k, item);
                    results.lock().unwrap_or_else(|e| e.into_inner())[k] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item was run"))
        .collect()
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
    replayed(
        Family::Baseline,
        label.to_string(),
        actions,
        regrets,
        reclaimed,
    )
}

/// The hindsight bound ([`Family::Oracle`]) over the base run's timelines: an idle span
/// begins at the first step below `threshold` after activity (or after the workload
/// appeared, or was given back); `after` into it the oracle looks ahead, and acts only if
/// activity does not resume within `horizon` of that instant. The action reclaims the GPUs
/// until activity resumes, the pods go away or the trace ends — as the other rules'.
/// A few steps without samples neither begin nor end a span; more than `after` of them
/// end it where they began (as a policy cannot judge what it cannot see).
fn oracle(
    timelines: &Backtest,
    step_seconds: i64,
    threshold: f32,
    horizon: SignedDuration,
    after: SignedDuration,
) -> Point {
    let hours_per_step = step_seconds as f64 / 3600.0;
    let horizon_steps = (horizon.as_secs() / step_seconds.max(1)) as usize;
    let after_steps = (after.as_secs().max(0) / step_seconds.max(1)) as usize;
    let (mut actions, mut reclaimed) = (0usize, 0.0f64);
    for w in &timelines.workloads {
        let Some(t) = &w.timeline else { continue };
        let gpus = f64::from(w.gpus.max(1));
        let present = |k: usize| !matches!(t.state[k], TimelineState::Absent);
        let mut k = 0usize;
        while k < t.activity.len() {
            // The next span: the first present step with a sample below the threshold.
            let begins = (k..t.activity.len()).find(|&i| present(i) && t.activity[i] < threshold);
            let Some(begin) = begins else { break };
            // Where it ends: activity again, the pods gone, telemetry gone for longer than
            // `after` (what cannot be seen is not reclaimed), or the trace's end.
            let mut end = t.activity.len();
            let mut resumed = false;
            let mut unseen = 0usize;
            for i in begin + 1..t.activity.len() {
                let a = t.activity[i];
                if !present(i) || a >= threshold {
                    end = i;
                    resumed = present(i);
                    break;
                }
                unseen = if a.is_nan() { unseen + 1 } else { 0 };
                if unseen > after_steps.max(1) {
                    end = i + 1 - unseen;
                    break;
                }
            }
            let at = begin + after_steps;
            if at < end && !(resumed && end - at <= horizon_steps) {
                actions += 1;
                reclaimed += (end - at) as f64 * hours_per_step * gpus;
            }
            k = end + 1;
        }
    }
    let label = format!(
        "oracle: {} in (hindsight)",
        crate::engine::classify::human(after)
    );
    replayed(Family::Oracle, label, actions, 0, reclaimed)
}

/// Whether every fixed point is dominated: some risk point reclaims at least as much with
/// a regret rate no higher, or regrets less while reclaiming at least as much.
pub fn risk_dominates_fixed(points: &[Point]) -> Vec<(String, Option<String>)> {
    points
        .iter()
        .filter(|p| !matches!(p.family, Family::Risk | Family::Oracle | Family::PreWarm))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p(family: Family, label: &str, rate: f64, gpu_hours: f64) -> Point {
        Point {
            family,
            label: label.into(),
            actions: 100,
            regrets: (rate * 100.0) as usize,
            regret_rate: rate,
            reclaimed_gpu_hours: gpu_hours,
            vs_fixed: None,
            max_idle_seconds: None,
            calibration: None,
            prewarm: None,
        }
    }

    #[test]
    fn the_binomial_tail_and_bound_match_known_values() {
        // P(X ≥ 1 | 10, 0.1) = 1 − 0.9^10.
        assert!((binomial_upper_tail(1, 10, 0.1) - (1.0 - 0.9f64.powi(10))).abs() < 1e-12);
        // P(X ≥ 3 | 5, 0.5) = 1/2.
        assert!((binomial_upper_tail(3, 5, 0.5) - 0.5).abs() < 1e-12);
        assert_eq!(binomial_upper_tail(0, 7, 0.3), 1.0);
        assert_eq!(binomial_upper_tail(8, 7, 0.3), 0.0);
        // Large n at p = 0.5 does not underflow: P(X ≥ 1000 | 2000, 0.5) ≈ 0.509.
        let t = binomial_upper_tail(1000, 2000, 0.5);
        assert!((t - 0.5089).abs() < 1e-3, "{t}");
        // Clopper–Pearson, 0 of n at 95 %: 1 − 0.05^(1/n) (the "rule of three" ≈ 3/n).
        let u = clopper_pearson_upper(0, 100, 0.95);
        assert!((u - (1.0 - 0.05f64.powf(0.01))).abs() < 1e-9, "{u}");
        // 5 of 100: about 10.2 %.
        let u = clopper_pearson_upper(5, 100, 0.95);
        assert!((u - 0.1024).abs() < 2e-3, "{u}");
    }

    #[test]
    fn calibration_tests_the_actions_the_estimate_allowed_apart_from_the_ceiling() {
        use super::super::{ActionOutcome, Summary, WorkloadOutcome};
        let action = |risk: Option<f64>, regret: bool| ActionOutcome {
            at: jiff::Timestamp::UNIX_EPOCH,
            action: crate::api::policy::ActionType::ScaleToZero,
            resumed_at: None,
            reclaimed_gpu_hours: 1.0,
            reclaimed_usd: 1.0,
            regret,
            reason: String::new(),
            kept_replicas: None,
            estimated_risk: risk,
            prewarmed_at: None,
        };
        // 40 allowed actions at a 5 % estimate, 6 regretted; 10 at the ceiling, 5 regretted.
        let mut actions: Vec<ActionOutcome> = (0..40).map(|i| action(Some(0.04), i < 6)).collect();
        actions.extend((0..10).map(|i| action(if i % 2 == 0 { None } else { Some(0.3) }, i < 5)));
        let b = Backtest {
            policy: "p".into(),
            mode: "Enforce".into(),
            start: jiff::Timestamp::UNIX_EPOCH,
            end: jiff::Timestamp::UNIX_EPOCH,
            step_seconds: 60,
            regret_horizon_seconds: 7200,
            workloads: vec![WorkloadOutcome {
                namespace: "n".into(),
                kind: "Deployment".into(),
                name: "w".into(),
                gpus: 1,
                classification: String::new(),
                idle_gpu_hours: 0.0,
                idle_usd: 0.0,
                gpu_hours_by_class: Default::default(),
                warned_at: None,
                acted_at: None,
                action: None,
                reclaimed_gpu_hours: 0.0,
                reclaimed_usd: 0.0,
                regret: false,
                unsupported: None,
                warnings: vec![],
                actions,
                last_reason: String::new(),
                timeline: None,
            }],
            summary: Summary::default(),
        };
        let c = Calibration::of(0.05, &b);
        assert_eq!((c.actions, c.regrets), (40, 6));
        assert_eq!((c.ceiling_actions, c.ceiling_regrets), (10, 5));
        assert!((c.mean_estimated_risk - 0.04).abs() < 1e-12);
        // 6 of 40 at 5 %: P(X ≥ 6) ≈ 1.4 %: above the promise beyond the noise.
        assert!(
            c.p_value < CALIBRATION_ALPHA && !c.within_noise,
            "{}",
            c.p_value
        );
        // At 10 % asked, 6 of 40 is within the noise (P ≈ 21 %).
        let c = Calibration::of(0.10, &b);
        assert!(c.within_noise, "{}", c.p_value);
        assert!(!c.all_within_noise);
    }

    #[test]
    fn the_fixed_curve_leaves_out_dominated_points_and_interpolates_between_the_rest() {
        let points = [
            p(Family::Fixed, "1h", 0.50, 8000.0),
            p(Family::Fixed, "4h", 0.20, 5000.0),
            // Worse than 4h on both counts: not on the curve.
            p(Family::Fixed, "6h", 0.22, 4000.0),
            p(Family::Fixed, "8h", 0.10, 3000.0),
            p(Family::Baseline, "other", 0.05, 9000.0),
        ];
        let curve = fixed_curve(&points);
        let labels: Vec<&str> = curve.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["8h", "4h", "1h"]);
        // Halfway between 8h and 4h: the curve gives 4,000.
        let v = versus_fixed(&curve, &p(Family::Risk, "r", 0.15, 4500.0)).unwrap();
        assert_eq!(v.position, CurvePosition::Inside);
        assert_eq!(v.against, "8h–4h");
        assert!((v.curve_gpu_hours - 4000.0).abs() < 1e-9);
        assert!((v.margin_gpu_hours - 500.0).abs() < 1e-9);
        // Fewer regrets than every fixed point: against the one that regrets least.
        let v = versus_fixed(&curve, &p(Family::Risk, "r", 0.05, 2900.0)).unwrap();
        assert_eq!(
            (v.position, v.against.as_str()),
            (CurvePosition::Below, "8h")
        );
        assert!((v.margin_gpu_hours + 100.0).abs() < 1e-9);
        let v = versus_fixed(&curve, &p(Family::Risk, "r", 0.60, 8100.0)).unwrap();
        assert_eq!(
            (v.position, v.against.as_str()),
            (CurvePosition::Above, "1h")
        );
        assert!(versus_fixed(&[], &points[0]).is_none());
    }

    #[test]
    fn parallel_map_keeps_the_order() {
        let items: Vec<u64> = (0..50).collect();
        let out = parallel_map(&items, |k, x| (k as u64) * 1000 + x * x);
        let want: Vec<u64> = (0..50).map(|x| x * 1000 + x * x).collect();
        assert_eq!(out, want);
    }
}
