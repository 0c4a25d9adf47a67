//! The ladder: nothing → warn → act, given the classification and what was already done.
//!
//! Invariants held here (DESIGN.md §4): warn strictly before act (4); Audit mode never
//! plans a change to a workload (6); `maxPerHour` bounds actions per policy (7).

use jiff::{SignedDuration, Timestamp};

use super::classify::{classify, human};
use super::cost::hourly_usd;
use super::model::{
    Classification, Decision, GpuObservation, IdleShape, LadderState, PodState, Step, Verdict,
    WorkloadMeta,
};
use super::risk::{Basis, CalendarClass, Estimate};
use super::rules::Rules;
use crate::api::policy::ActionType;

/// Classifies, prices and decides in one call, with no idle history: a policy with
/// `idle.maxResumeRisk` knows nothing, so it waits until `idle.maxIdle`. The controller
/// and backtest use [`super::evaluate_policy`], which calls [`evaluate_with`].
pub fn evaluate(
    rules: &Rules,
    meta: &WorkloadMeta,
    pods: &[PodState],
    gpus: &[GpuObservation],
    ladder: &LadderState,
    now: Timestamp,
) -> Decision {
    evaluate_with(rules, meta, pods, gpus, ladder, now, |_, _, _| None)
}

/// [`evaluate`] with the workload's resumption-risk estimate: `estimate(shape, idle_for,
/// at)` — the risk of a workload idle for `idle_for` at the instant `at` (now, or a
/// forecast of a later instant from what is known now) — is asked only when the policy
/// has `idle.maxResumeRisk` and the fixed minimum durations are met.
pub fn evaluate_with(
    rules: &Rules,
    meta: &WorkloadMeta,
    pods: &[PodState],
    gpus: &[GpuObservation],
    ladder: &LadderState,
    now: Timestamp,
    mut estimate: impl FnMut(IdleShape, SignedDuration, Timestamp) -> Option<Estimate>,
) -> Decision {
    let verdict = classify(rules, meta, pods, gpus, ladder, now);
    let observed = gpus.len() as u32;
    let hourly = hourly_usd(rules, gpus, verdict.gpu_devices.saturating_sub(observed));
    let (risk, deadline) = match (&verdict.classification, verdict.idle_since) {
        (Classification::Idle(shape), Some(since))
            if rules.max_resume_risk.is_some()
                && now.duration_since(since) >= rules.warn_after.max(rules.window) =>
        {
            let now_risk = estimate(*shape, now.duration_since(since), now);
            let deadline = now_risk
                .as_ref()
                .and_then(|e| forecast(rules, e, since, now, |t, at| estimate(*shape, t, at)));
            (now_risk, deadline)
        }
        _ => (None, None),
    };
    decide(rules, verdict, ladder, hourly, risk, deadline, now)
}

/// What waiting for the ceiling (`idle.maxIdle`) is expected to cost, from what is known
/// now: the risk the action will carry when it comes there, and the chance the idle span
/// lasts that long.
#[derive(Debug, Clone, PartialEq)]
pub struct Deadline {
    /// When the span reaches `idle.maxIdle`.
    pub at: Timestamp,
    /// The estimate for a workload idle `maxIdle` then (from its calendar's days at that
    /// hour, or its pools).
    pub then: Estimate,
    /// The chance it is still idle then: the product, over the horizons from now to the
    /// ceiling, of one less the risk forecast for each.
    pub reach: f64,
}

impl Deadline {
    /// Regrets expected from waiting for the ceiling: it acts there only if the span
    /// lasts, and then regrets with the share of its cases that resumed. Without the
    /// cautious prior: the prior overstates a risk, which is cautious for the action now
    /// but here would make waiting look worse than it is (and the chance of lasting,
    /// from the risks with the prior, is understated for the same reason).
    pub fn expected(&self) -> f64 {
        self.reach * self.then.share()
    }
}

/// The most horizons ahead a [`Deadline`] is forecast over (with a 2h horizon: a ceiling
/// up to 24h away).
const FORECAST_HORIZONS: i64 = 12;

/// The [`Deadline`] of a workload idle since `since`, at `now` with the estimate `now_risk`
/// above the policy's `maxResumeRisk`; None when the policy has no ceiling, the ceiling is
/// reached or more than [`FORECAST_HORIZONS`] horizons away, or any forecast on the way
/// has no estimate (knowing nothing is not permission, invariant 13).
fn forecast(
    rules: &Rules,
    now_risk: &Estimate,
    since: Timestamp,
    now: Timestamp,
    mut estimate: impl FnMut(SignedDuration, Timestamp) -> Option<Estimate>,
) -> Option<Deadline> {
    let (max, max_idle) = (rules.max_resume_risk?, rules.max_idle?);
    let idle_for = now.duration_since(since);
    if now_risk.risk() <= max || idle_for >= max_idle {
        return None;
    }
    // Acting early is for the quiet hours before the busy ones: only in a window the
    // workload's own past days call quiet or rarely busy (the calendar source), never in
    // one they call often busy, nor without a calendar (the span pools know no hour).
    if !matches!(now_risk.basis, Basis::Calendar(days, _) if days.class != CalendarClass::Busy) {
        return None;
    }
    let horizon = rules.risk.horizon.max(SignedDuration::from_mins(1));
    // A ceiling many horizons away is too far to forecast (and would cost an estimate per
    // horizon, every cycle): the gate alone decides until it is nearer.
    if (max_idle - idle_for).as_secs() > FORECAST_HORIZONS * horizon.as_secs() {
        return None;
    }
    // The first horizon is the estimate of now; each later one is forecast at its start.
    let mut reach = 1.0 - now_risk.risk();
    let mut t = idle_for + horizon;
    while t < max_idle {
        reach *= 1.0 - estimate(t, since + t)?.risk();
        t += horizon;
    }
    let at = since + max_idle;
    Some(Deadline {
        at,
        then: estimate(max_idle, at)?,
        reach,
    })
}

/// What the resumption-risk gate says about proceeding now.
enum Gate {
    /// Proceed; the note says why (empty when the policy has no gate).
    Open(String),
    /// Hold, with the reason.
    Held(String),
}

/// `ceiling`: how long idle the step proceeds whatever the estimate. For the action it
/// is `maxIdle`; for the warning, `maxIdle` less the notice, so that a workload whose risk
/// stays high is acted on at `maxIdle`, not a notice later.
fn gate(
    rules: &Rules,
    estimate: Option<&Estimate>,
    deadline: Option<&Deadline>,
    idle_for: SignedDuration,
    ceiling: Option<SignedDuration>,
) -> Gate {
    let Some(max) = rules.max_resume_risk else {
        return Gate::Open(String::new());
    };
    if let (Some(m), Some(c)) = (rules.max_idle, ceiling.filter(|c| idle_for >= *c)) {
        return Gate::Open(if c < m {
            format!(
                "; idle for {} of idle.maxIdle ({}): the action is due at idle.maxIdle, whatever the resumption risk",
                human(idle_for),
                human(m)
            )
        } else {
            format!(
                "; idle past idle.maxIdle ({}), whatever the resumption risk",
                human(m)
            )
        });
    }
    match estimate {
        // Invariant 13: knowing nothing is not permission. Without an estimate the step
        // waits for the ceiling (maxIdle), never falls back to the shorter fixed durations.
        None => Gate::Held(format!(
            "idle {}; no comparable history yet (fewer than idle.minIdleSpans ({}) past idle spans lasted longer than {}): {}",
            human(idle_for),
            rules.risk.min_spans,
            human(idle_for),
            match rules.max_idle {
                Some(m) => format!("waits until {} (idle.maxIdle)", human(m)),
                None => "waits until there is (no idle.maxIdle is set)".into(),
            }
        )),
        Some(e) if e.risk() <= max => Gate::Open(format!(
            "; {}, within idle.maxResumeRisk ({:.0} %)",
            e.sentence(),
            max * 100.0
        )),
        // The ceiling is a deadline: acting now, before it, when that is expected to
        // regret less than the action due there.
        Some(e) if deadline.is_some_and(|d| e.risk() <= d.expected()) => {
            let d = deadline.expect("checked");
            Gate::Open(format!(
                "; {}: above idle.maxResumeRisk ({:.0} %), but the action is due at idle.maxIdle ({}, at {}) and waiting for it is expected to regret more: idle that long with {:.0} %, and then {:.0} % of the comparable cases resumed within {} ({:.0} % in all)",
                e.sentence(),
                max * 100.0,
                rules.max_idle.map(human).unwrap_or_default(),
                d.at,
                d.reach * 100.0,
                d.then.share() * 100.0,
                human(d.then.horizon),
                d.expected() * 100.0,
            ))
        }
        Some(e) => Gate::Held(format!(
            "{}: above idle.maxResumeRisk ({:.0} %), holding{}",
            e.sentence(),
            max * 100.0,
            rules
                .max_idle
                .map(|m| format!(" until idle.maxIdle ({})", human(m)))
                .unwrap_or_default()
        )),
    }
}

/// The next step for a classified workload, given its resumption-risk `estimate` and
/// what waiting for the ceiling is expected to cost (`deadline`, [`Deadline`]).
pub fn decide(
    rules: &Rules,
    verdict: Verdict,
    ladder: &LadderState,
    hourly_usd: f64,
    estimate: Option<Estimate>,
    deadline: Option<Deadline>,
    now: Timestamp,
) -> Decision {
    let done = |step, next_step_at, reason: String| Decision {
        verdict: verdict.clone(),
        step,
        next_step_at,
        reason,
        hourly_usd,
        estimate: estimate.clone(),
    };
    let (Classification::Idle(shape), Some(idle_since)) =
        (&verdict.classification, verdict.idle_since)
    else {
        return done(
            Step::Nothing,
            None,
            format!("{}: {}", verdict.classification.as_str(), verdict.reason),
        );
    };
    if let Some(reaped) = ladder.reaped_at.filter(|r| *r >= idle_since) {
        return done(
            Step::Nothing,
            None,
            format!("already reclaimed at {reaped}"),
        );
    }
    // The idle clock counts from the last activity; a warning from an earlier idle
    // period does not count for this one.
    let warn_due = idle_since + rules.warn_after.max(rules.window);
    let warned_at = ladder.warned_at.filter(|w| *w >= idle_since);
    let idle_for = now.duration_since(idle_since);
    // Invariant 4: the owner always gets `action.after - warn.after` of notice.
    let notice = rules.notice();
    let Some(warned_at) = warned_at else {
        return if now >= warn_due {
            // Past maxIdle less the notice, warn whatever the estimate: the action is then
            // due at maxIdle.
            let ceiling = rules.max_idle.map(|m| (m - notice).max(rules.warn_after));
            match gate(
                rules,
                estimate.as_ref(),
                deadline.as_ref(),
                idle_for,
                ceiling,
            ) {
                // The action is due a notice from now at the earliest.
                Gate::Open(note) => done(
                    Step::Warn,
                    Some((idle_since + rules.action_after).max(now + notice)),
                    format!("idle since {idle_since}: warn the owner{note}"),
                ),
                Gate::Held(why) => done(Step::Nothing, ceiling.map(|c| idle_since + c), why),
            }
        } else {
            done(
                Step::Nothing,
                Some(warn_due),
                format!("warning due at {warn_due}"),
            )
        };
    };
    if rules.action == ActionType::None {
        return done(
            Step::Nothing,
            None,
            "warned; action.type is None (warn only)".into(),
        );
    }
    // Refused before use (api::unknown); should one get here, it never acts.
    if rules.action == ActionType::Unknown {
        return done(
            Step::Nothing,
            None,
            "warned; action.type is unknown to this gpu-reaper: nothing is done".into(),
        );
    }
    if *shape == IdleShape::DataStarved && !rules.reap_data_starved {
        return done(
            Step::Nothing,
            None,
            "warned; data-starved workloads are not reclaimed (idle.reapDataStarved is false): fix the input pipeline".into(),
        );
    }
    // The action never happens in the same evaluation as the warning.
    let act_due = (idle_since + rules.action_after).max(warned_at + notice);
    if now < act_due || now <= warned_at {
        let due = if act_due > warned_at {
            act_due
        } else {
            warned_at + jiff::SignedDuration::from_secs(1)
        };
        return done(
            Step::Nothing,
            Some(due),
            format!(
                "warned at {warned_at}; {} due at {due}",
                action_name(rules.action)
            ),
        );
    }
    let note = match gate(
        rules,
        estimate.as_ref(),
        deadline.as_ref(),
        idle_for,
        rules.max_idle,
    ) {
        Gate::Open(note) => note,
        Gate::Held(why) => {
            let ceiling_at = rules.max_idle.map(|m| idle_since + m);
            return done(Step::Nothing, ceiling_at, format!("warned; {why}"));
        }
    };
    let idle_for = human(idle_for);
    if rules.enforce {
        done(
            Step::Act(rules.action),
            None,
            format!(
                "idle for {idle_for}, warned at {warned_at}: {}{note}",
                action_name(rules.action)
            ),
        )
    } else {
        done(
            Step::WouldAct(rules.action),
            None,
            format!(
                "idle for {idle_for}, warned at {warned_at}: would {} (Audit mode){note}",
                action_name(rules.action)
            ),
        )
    }
}

fn action_name(a: ActionType) -> &'static str {
    match a {
        ActionType::ScaleToZero => "scale to zero",
        ActionType::Suspend => "suspend",
        ActionType::Evict => "evict",
        ActionType::None => "no action",
        ActionType::Unknown => "no action (action.type unknown to this gpu-reaper)",
    }
}

/// Bounds the actions of one policy's evaluation (invariant 7). `acted_last_hour` is how
/// many actions the policy took in the past hour; the longest-idle workloads go first and
/// the rest become [`Step::RateLimited`]. Audit "would act" steps are limited the same way
/// so an Audit report shows what Enforce would really do. Returns how many were allowed.
pub fn limit_actions(
    decisions: &mut [&mut Decision],
    acted_last_hour: u32,
    max_per_hour: u32,
) -> u32 {
    let mut budget = max_per_hour.saturating_sub(acted_last_hour);
    let mut order: Vec<usize> = (0..decisions.len())
        .filter(|&i| matches!(decisions[i].step, Step::Act(_) | Step::WouldAct(_)))
        .collect();
    order.sort_by_key(|&i| decisions[i].verdict.idle_since);
    let mut allowed = 0;
    for i in order {
        if budget > 0 {
            budget -= 1;
            allowed += 1;
        } else if let Step::Act(a) | Step::WouldAct(a) = decisions[i].step {
            decisions[i].step = Step::RateLimited(a);
            decisions[i].reason =
                format!("action.maxPerHour ({max_per_hour}) reached; retried next cycle");
        }
    }
    allowed
}
