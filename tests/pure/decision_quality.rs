//! Decision quality (issue "learn each workload's rhythm"): the resumption-risk gate in
//! the ladder, its fallbacks and ceiling, one decision at a time. The same on whole traces
//! (no peeking into the future in backtest, the risk-based policy against fixed thresholds
//! on bursty inference traces) is in tests/replay/decision_quality.rs.

use std::collections::BTreeMap;

use gpu_reaper::api::policy::{GpuPolicySpec, PolicyMode};
use gpu_reaper::engine::model::{
    Decision, GpuObservation, IdleShape, LadderState, PodPhase, PodState, Step, WorkloadMeta,
};
use gpu_reaper::engine::risk::{CalendarClass, CalendarDays};
use gpu_reaper::engine::{Basis, Estimate, Rules, evaluate, evaluate_with};
use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use crate::time::at;

fn dur(text: &str) -> kube::core::Duration {
    text.parse().unwrap()
}

fn risk_spec(max_risk: f64, max_idle: Option<&str>, mode: PolicyMode) -> GpuPolicySpec {
    let mut s = GpuPolicySpec {
        mode,
        ..GpuPolicySpec::default()
    };
    s.idle.max_resume_risk = Some(max_risk);
    s.idle.max_idle = max_idle.map(dur);
    s
}

fn meta() -> WorkloadMeta {
    WorkloadMeta {
        kind: "Deployment".into(),
        namespace: "serving".into(),
        name: "llm".into(),
        created_at: at(-10_000),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

fn pod() -> PodState {
    PodState {
        phase: PodPhase::Running,
        waiting_reason: None,
        stuck_since: None,
        gpu_devices: 1,
    }
}

/// One GPU holding memory, last busy at minute `busy`.
fn gpu(busy: i64) -> GpuObservation {
    GpuObservation {
        id: "GPU-0".into(),
        model: "NVIDIA H100 80GB HBM3".into(),
        share: 1.0,
        pod: 0,
        coverage: 1.0,
        first_sample_at: Some(at(-10_000)),
        last_busy_at: Some(at(busy)),
        blind_until: Some(at(-10_000)),
        fb_used_mib: Some(40_000.0),
        ..GpuObservation::default()
    }
}

fn estimate(resumed: u32, longer: u32, idle_for: SignedDuration) -> Estimate {
    estimate_from(Basis::Own, resumed, longer, idle_for)
}

fn estimate_from(basis: Basis, resumed: u32, longer: u32, idle_for: SignedDuration) -> Estimate {
    Estimate {
        idle_for,
        horizon: SignedDuration::from_hours(2),
        resumed,
        longer,
        product_limit: f64::from(resumed) / f64::from(longer.max(1)),
        basis,
        blend: None,
    }
}

/// The calendar source's basis: busy on `busy` of the last 7 days at this hour.
fn calendar(busy: u8) -> Basis {
    let class = match busy {
        0 => CalendarClass::Quiet,
        1 | 2 => CalendarClass::Low,
        _ => CalendarClass::Busy,
    };
    Basis::Calendar(
        CalendarDays {
            class,
            busy,
            seen: 7,
        },
        2,
    )
}

fn decide_at(
    spec: &GpuPolicySpec,
    ladder: &LadderState,
    now: i64,
    counts: Option<(u32, u32)>,
) -> Decision {
    decide_over_time(spec, ladder, now, |_| counts.map(|c| (Basis::Own, c)))
}

#[test]
fn a_workload_whose_long_idle_spans_usually_end_soon_is_not_warned() {
    let spec = risk_spec(0.05, None, PolicyMode::Enforce);
    let d = decide_at(&spec, &LadderState::default(), 190, Some((12, 40)));
    assert_eq!(d.step, Step::Nothing);
    assert_eq!(
        d.reason,
        "idle 3h10m; this workload's idle spans longer than 3h10m ended within 2h in 12 of 40 cases (product-limit 30 %): 36 % with the cautious prior (100 % over 4 cases): above idle.maxResumeRisk (5 %), holding"
    );
    assert_eq!(d.estimate.as_ref().map(|e| e.longer), Some(40));
}

#[test]
fn a_low_risk_warns_then_acts_and_both_say_why() {
    let spec = risk_spec(0.05, None, PolicyMode::Enforce);
    // 0 of 80: (80 × 0 % + 4 × 100 %) / 84 = 5 % with the prior.
    let d = decide_at(&spec, &LadderState::default(), 190, Some((0, 80)));
    assert_eq!(d.step, Step::Warn);
    assert!(
        d.reason.ends_with(
            "idle 3h10m; this workload's idle spans longer than 3h10m ended within 2h in 0 of 80 cases (product-limit 0 %): 5 % with the cautious prior (100 % over 4 cases), within idle.maxResumeRisk (5 %)"
        ),
        "{}",
        d.reason
    );
    let warned = LadderState {
        warned_at: Some(at(190)),
        ..LadderState::default()
    };
    let d = decide_at(&spec, &warned, 220, Some((0, 80)));
    assert!(matches!(d.step, Step::Act(_)), "{d:?}");
    assert!(d.reason.contains("0 of 80 cases"), "{}", d.reason);
    // Forty cases are not enough to outweigh the cautious prior under 5 %: 4 / 44.
    let d = decide_at(&spec, &warned, 220, Some((0, 40)));
    assert_eq!(d.step, Step::Nothing, "{d:?}");
    // The risk rose during the notice: the action is held, the warning stands.
    let d = decide_at(&spec, &warned, 220, Some((20, 40)));
    assert_eq!(d.step, Step::Nothing);
    assert!(d.reason.starts_with("warned; idle 3h40m"), "{}", d.reason);
}

#[test]
fn without_comparable_history_a_risk_gated_policy_waits_until_max_idle() {
    // Invariant 13: knowing nothing is not permission. The fixed durations (warn at 30m,
    // act at 1h) would act; the gated policy waits for maxIdle (8h) and says so.
    let spec = risk_spec(0.05, Some("8h"), PolicyMode::Enforce);
    let warned_early = LadderState {
        warned_at: Some(at(31)),
        ..LadderState::default()
    };
    for (now, ladder) in [31, 45, 61, 90, 300, 449]
        .map(|now| (now, LadderState::default()))
        .into_iter()
        .chain([61, 90, 300, 479].map(|now| (now, warned_early.clone())))
    {
        {
            let d = decide_at(&spec, &ladder, now, None);
            assert_eq!(
                d.step,
                Step::Nothing,
                "minute {now}, {ladder:?}: {}",
                d.reason
            );
            assert!(
                d.reason.contains("no comparable history yet")
                    && d.reason.contains("waits until 8h"),
                "{}",
                d.reason
            );
        }
    }
    let d = decide_at(&spec, &LadderState::default(), 90, None);
    assert_eq!(
        d.next_step_at,
        Some(at(450)),
        "warned at maxIdle less the notice"
    );
    // At maxIdle less the notice it warns, at maxIdle it acts, still knowing nothing.
    let d = decide_at(&spec, &LadderState::default(), 450, None);
    assert_eq!(d.step, Step::Warn, "{}", d.reason);
    assert_eq!(
        d.next_step_at,
        Some(at(480)),
        "the action is due at maxIdle"
    );
    let warned = LadderState {
        warned_at: Some(at(450)),
        ..LadderState::default()
    };
    assert!(matches!(
        decide_at(&spec, &warned, 480, None).step,
        Step::Act(_)
    ));
    // Audit says the same.
    let audit = risk_spec(0.05, Some("8h"), PolicyMode::Audit);
    let d = decide_at(&audit, &LadderState::default(), 90, None);
    assert_eq!(d.step, Step::Nothing);
    assert!(d.reason.contains("waits until 8h"), "{}", d.reason);
    // Without maxIdle it waits until there is history; the plain policy acts at 1h.
    let unbounded = risk_spec(0.05, None, PolicyMode::Enforce);
    let d = decide_at(&unbounded, &warned, 3000, None);
    assert_eq!(d.step, Step::Nothing);
    assert!(d.reason.contains("waits until there is"), "{}", d.reason);
    let fixed = Rules::from_spec(&GpuPolicySpec {
        mode: PolicyMode::Enforce,
        ..GpuPolicySpec::default()
    });
    let early = LadderState {
        warned_at: Some(at(31)),
        ..LadderState::default()
    };
    let plain = evaluate(&fixed, &meta(), &[pod()], &[gpu(0)], &early, at(61));
    assert!(matches!(plain.step, Step::Act(_)), "{plain:?}");
}

#[test]
fn max_idle_is_when_the_action_is_due_and_the_warning_comes_a_notice_before() {
    // warn.after 30m, action.after 1h: 30 minutes of notice.
    let spec = risk_spec(0.01, Some("8h"), PolicyMode::Enforce);
    let high = Some((30, 40));
    let d = decide_at(&spec, &LadderState::default(), 449, high);
    assert_eq!(d.step, Step::Nothing);
    assert_eq!(d.next_step_at, Some(at(450)));
    let d = decide_at(&spec, &LadderState::default(), 450, high);
    assert_eq!(d.step, Step::Warn);
    assert!(
        d.reason
            .ends_with("; idle for 7h30m of idle.maxIdle (8h): the action is due at idle.maxIdle, whatever the resumption risk"),
        "{}",
        d.reason
    );
    let warned = LadderState {
        warned_at: Some(at(450)),
        ..LadderState::default()
    };
    let d = decide_at(&spec, &warned, 479, high);
    assert_eq!(d.step, Step::Nothing);
    assert_eq!(d.next_step_at, Some(at(480)));
    let d = decide_at(&spec, &warned, 480, high);
    assert!(matches!(d.step, Step::Act(_)), "{d:?}");
    assert!(
        d.reason
            .ends_with("idle past idle.maxIdle (8h), whatever the resumption risk"),
        "{}",
        d.reason
    );
}

/// [`decide_at`] with an estimate that depends on the instant asked about: `cases(at)`
/// (minutes) gives its basis and (resumed, longer), or None for no estimate. The workload was
/// last busy at minute 0, so every forecast is asked for `at == idle`.
fn decide_over_time(
    spec: &GpuPolicySpec,
    ladder: &LadderState,
    now: i64,
    cases: impl Fn(i64) -> Option<(Basis, (u32, u32))>,
) -> Decision {
    let rules = Rules::from_spec(spec);
    evaluate_with(
        &rules,
        &meta(),
        &[pod()],
        &[gpu(0)],
        ladder,
        at(now),
        |shape, idle_for, instant| {
            assert_eq!(shape, IdleShape::MemoryHeld);
            let minute = (instant.as_second() - at(0).as_second()) / 60;
            assert_eq!(minute, idle_for.as_mins(), "a forecast for another span");
            assert!(
                minute >= now,
                "asked about minute {minute}, before now ({now})"
            );
            cases(minute).map(|(basis, (r, l))| estimate_from(basis, r, l, idle_for))
        },
    )
}

#[test]
fn max_idle_is_a_deadline_acting_before_it_when_waiting_would_regret_more() {
    // Idle 2h at 02:00; its risk now is 11 % (1 of 40, with the prior), above the 5 %
    // asked. The night ahead is quiet (0 of 200 resumed within 2h at 4h and 6h), but
    // maxIdle (8h) comes at 08:00, when its users usually come (150 of 200): waiting
    // acts then, at 75 %, on a span that lasts that long with 85 %.
    let spec = risk_spec(0.05, Some("8h"), PolicyMode::Enforce);
    let morning = |m: i64| match m {
        120 | 150 => Some((calendar(1), (1, 40))),
        480 => Some((calendar(6), (150, 200))),
        _ => Some((calendar(0), (0, 200))),
    };
    let d = decide_over_time(&spec, &LadderState::default(), 120, morning);
    assert_eq!(d.step, Step::Warn, "{}", d.reason);
    assert!(
        d.reason.contains("above idle.maxResumeRisk (5 %), but the action is due at idle.maxIdle (8h")
            && d.reason.contains("waiting for it is expected to regret more: idle that long with 85 %, and then 75 % of the comparable cases resumed within 2h (64 % in all)"),
        "{}",
        d.reason
    );
    let warned = LadderState {
        warned_at: Some(at(120)),
        ..LadderState::default()
    };
    let d = decide_over_time(&spec, &warned, 150, morning);
    assert!(matches!(d.step, Step::Act(_)), "{}", d.reason);
    // The same risk now, with a quiet morning too (10 of 200 at 8h: 5 %): waiting is
    // expected to regret less than acting now, so it holds until maxIdle.
    let quiet = |m: i64| {
        if m == 480 {
            Some((calendar(0), (10, 200)))
        } else {
            morning(m)
        }
    };
    let d = decide_over_time(&spec, &LadderState::default(), 120, quiet);
    assert_eq!(d.step, Step::Nothing, "{}", d.reason);
    assert!(
        d.reason.ends_with("holding until idle.maxIdle (8h)"),
        "{}",
        d.reason
    );
    let d = decide_over_time(&spec, &warned, 150, quiet);
    assert_eq!(d.step, Step::Nothing, "{}", d.reason);
    // Only in a window its own past days call quiet or rarely busy: not in one they call
    // often busy, nor from the span pools (which know no hour).
    for now_basis in [calendar(5), Basis::Own] {
        let busy_now = |m: i64| match m {
            120 => Some((now_basis, (1, 40))),
            _ => morning(m),
        };
        let d = decide_over_time(&spec, &LadderState::default(), 120, busy_now);
        assert_eq!(d.step, Step::Nothing, "{now_basis:?}: {}", d.reason);
    }
    // Invariant 13: a forecast on the way with no estimate is no permission either.
    let unknown_night = |m: i64| if m == 360 { None } else { morning(m) };
    let d = decide_over_time(&spec, &LadderState::default(), 120, unknown_night);
    assert_eq!(d.step, Step::Nothing, "{}", d.reason);
    let unknown_morning = |m: i64| if m == 480 { None } else { morning(m) };
    let d = decide_over_time(&spec, &LadderState::default(), 120, unknown_morning);
    assert_eq!(d.step, Step::Nothing, "{}", d.reason);
    // A ceiling too far ahead to forecast (over 12 horizons: 24h) is no deadline yet.
    let far = risk_spec(0.05, Some("72h"), PolicyMode::Enforce);
    // Quiet for three days, the risk at 2h and at 66h 11 %, a busy hour at 72h.
    let far_morning = |m: i64| match m {
        4320 => Some((calendar(6), (150, 200))),
        120 | 3960 => Some((calendar(1), (1, 40))),
        _ => Some((calendar(0), (0, 200))),
    };
    let d = decide_over_time(&far, &LadderState::default(), 120, far_morning);
    assert_eq!(d.step, Step::Nothing, "{}", d.reason);
    let near = decide_over_time(&far, &LadderState::default(), 3960, far_morning);
    assert_eq!(near.step, Step::Warn, "{}", near.reason);
    assert!(
        near.reason.contains("expected to regret more"),
        "{}",
        near.reason
    );
    // Without maxIdle there is no deadline: the gate alone decides.
    let unbounded = risk_spec(0.05, None, PolicyMode::Enforce);
    let d = decide_over_time(&unbounded, &LadderState::default(), 120, morning);
    assert_eq!(d.step, Step::Nothing, "{}", d.reason);
}

#[test]
fn the_estimate_is_not_asked_before_the_fixed_minimum_durations() {
    let spec = risk_spec(0.05, None, PolicyMode::Enforce);
    let rules = Rules::from_spec(&spec);
    let d = evaluate_with(
        &rules,
        &meta(),
        &[pod()],
        &[gpu(0)],
        &LadderState::default(),
        at(29),
        |_, _, _| panic!("asked for an estimate 29 minutes into idleness"),
    );
    assert_eq!(d.step, Step::Nothing);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// `maxIdle` is a ceiling: past it the ladder warns, then acts, whatever the estimate
    /// (Audit only reports; an exempt workload is never touched).
    #[test]
    fn max_idle_always_proceeds(
        resumed in 0u32..50, extra in 0u32..50, idle in 480i64..3000, warned_ago in 0i64..200,
        audit in any::<bool>(), exempt in any::<bool>(),
    ) {
        let mode = if audit { PolicyMode::Audit } else { PolicyMode::Enforce };
        let spec = risk_spec(0.01, Some("8h"), mode);
        let rules = Rules::from_spec(&spec);
        let mut m = meta();
        if exempt {
            m.labels.insert(gpu_reaper::api::keys::EXEMPT_LABEL.into(), "true".into());
        }
        let counts = Some((resumed, resumed + extra + 1));
        let est = |_: IdleShape, d: SignedDuration, _: Timestamp| counts.map(|(r, l)| estimate(r, l, d));
        let fresh = evaluate_with(&rules, &m, &[pod()], &[gpu(0)], &LadderState::default(), at(idle), est);
        let ladder = LadderState { warned_at: Some(at(idle - 30 - warned_ago)), ..LadderState::default() };
        let later = evaluate_with(&rules, &m, &[pod()], &[gpu(0)], &ladder, at(idle), est);
        if exempt {
            prop_assert_eq!(fresh.step, Step::Nothing);
            prop_assert_eq!(later.step, Step::Nothing);
        } else {
            prop_assert_eq!(fresh.step, Step::Warn);
            prop_assert!(matches!(later.step, Step::Act(_) | Step::WouldAct(_)), "{:?}", later);
            prop_assert_eq!(matches!(later.step, Step::Act(_)), !audit);
        }
    }
}
