//! The ladder: nothing → warn → act, given the classification and what was already done.
//!
//! Invariants held here (DESIGN.md §4): warn strictly before act (4); Audit mode never
//! plans a change to a workload (6); `maxPerHour` bounds actions per policy (7).

use jiff::Timestamp;

use super::classify::{classify, human};
use super::cost::hourly_usd;
use super::model::{
    Classification, Decision, GpuObservation, IdleShape, LadderState, PodState, Step, Verdict,
    WorkloadMeta,
};
use super::rules::Rules;
use crate::api::policy::ActionType;

/// Classifies, prices and decides in one call: what the controller and backtest run for
/// every governed workload at every evaluation.
pub fn evaluate(
    rules: &Rules,
    meta: &WorkloadMeta,
    pods: &[PodState],
    gpus: &[GpuObservation],
    ladder: &LadderState,
    now: Timestamp,
) -> Decision {
    let verdict = classify(rules, meta, pods, gpus, ladder, now);
    let observed = gpus.len() as u32;
    let hourly = hourly_usd(rules, gpus, verdict.gpu_devices.saturating_sub(observed));
    decide(rules, verdict, ladder, hourly, now)
}

/// The next step for a classified workload.
pub fn decide(
    rules: &Rules,
    verdict: Verdict,
    ladder: &LadderState,
    hourly_usd: f64,
    now: Timestamp,
) -> Decision {
    let done = |step, next_step_at, reason: String| Decision {
        verdict: verdict.clone(),
        step,
        next_step_at,
        reason,
        hourly_usd,
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
    let Some(warned_at) = warned_at else {
        return if now >= warn_due {
            done(
                Step::Warn,
                None,
                format!("idle since {idle_since}: warn the owner"),
            )
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
    if *shape == IdleShape::DataStarved && !rules.reap_data_starved {
        return done(
            Step::Nothing,
            None,
            "warned; data-starved workloads are not reclaimed (idle.reapDataStarved is false): fix the input pipeline".into(),
        );
    }
    // Invariant 4: the owner always gets `action.after - warn.after` of notice, and the
    // action never happens in the same evaluation as the warning.
    let notice = (rules.action_after - rules.warn_after).max(jiff::SignedDuration::ZERO);
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
    let idle_for = human(now.duration_since(idle_since));
    if rules.enforce {
        done(
            Step::Act(rules.action),
            None,
            format!(
                "idle for {idle_for}, warned at {warned_at}: {}",
                action_name(rules.action)
            ),
        )
    } else {
        done(
            Step::WouldAct(rules.action),
            None,
            format!(
                "idle for {idle_for}, warned at {warned_at}: would {} (Audit mode)",
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
