//! The engine's invariants (DESIGN.md §4, 1–7), as sentences, plus property tests.

use std::collections::BTreeMap;

use gpu_reaper::api::keys;
use gpu_reaper::api::policy::{ActionType, GpuPolicySpec, MissingTelemetry, PolicyMode};
use gpu_reaper::engine::model::{
    Classification, Decision, GpuObservation, IdleShape, LadderState, PodPhase, PodState, Step,
    WorkloadMeta,
};
use gpu_reaper::engine::{ActivityTracker, Rules, Sample, evaluate, limit_actions};
use jiff::SignedDuration;
use proptest::prelude::*;

use crate::time::at;

fn rules(mode: PolicyMode) -> Rules {
    Rules::from_spec(&GpuPolicySpec {
        mode,
        ..GpuPolicySpec::default()
    })
}

fn meta(created_min: i64) -> WorkloadMeta {
    WorkloadMeta {
        kind: "Deployment".into(),
        namespace: "team-a".into(),
        name: "llm".into(),
        created_at: at(created_min),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

fn running(gpus: u32) -> PodState {
    PodState {
        phase: PodPhase::Running,
        waiting_reason: None,
        stuck_since: None,
        gpu_devices: gpus,
    }
}

/// A GPU with full telemetry since minute 0, last busy at `busy` (None: never).
fn gpu(i: usize, busy: Option<i64>, fb: f64) -> GpuObservation {
    GpuObservation {
        id: format!("GPU-{i}"),
        model: "NVIDIA H100 80GB HBM3".into(),
        share: 1.0,
        pod: 0,
        coverage: 1.0,
        first_sample_at: Some(at(0)),
        last_busy_at: busy.map(at),
        blind_until: Some(at(0)),
        fb_used_mib: Some(fb),
        ..GpuObservation::default()
    }
}

fn eval(
    r: &Rules,
    m: &WorkloadMeta,
    pods: &[PodState],
    gpus: &[GpuObservation],
    ladder: &LadderState,
    now: i64,
) -> Decision {
    evaluate(r, m, pods, gpus, ladder, at(now))
}

#[test]
fn a_pod_with_one_busy_gpu_of_eight_is_not_idle() {
    let r = rules(PolicyMode::Enforce);
    let mut gpus: Vec<_> = (0..8).map(|i| gpu(i, None, 0.0)).collect();
    gpus[3].last_busy_at = Some(at(299));
    let d = eval(
        &r,
        &meta(-600),
        &[running(8)],
        &gpus,
        &LadderState::default(),
        300,
    );
    assert_eq!(d.verdict.classification, Classification::Active);
    assert_eq!(d.step, Step::Nothing);
}

#[test]
fn eight_idle_gpus_holding_memory_are_inference_idle_since_their_last_activity() {
    let r = rules(PolicyMode::Enforce);
    let gpus: Vec<_> = (0..8).map(|i| gpu(i, Some(100), 74_000.0)).collect();
    let d = eval(
        &r,
        &meta(-600),
        &[running(8)],
        &gpus,
        &LadderState::default(),
        200,
    );
    assert_eq!(
        d.verdict.classification,
        Classification::Idle(IdleShape::MemoryHeld)
    );
    assert_eq!(d.verdict.idle_since, Some(at(100)));
    assert_eq!(d.step, Step::Warn);
    assert!(
        (d.hourly_usd - 8.0 * 2.5).abs() < 1e-9,
        "default price without byModel"
    );
}

#[test]
fn missing_telemetry_is_never_idleness_by_default() {
    let r = rules(PolicyMode::Enforce);
    let mut g = gpu(0, None, 0.0);
    g.coverage = 0.1;
    let d = eval(
        &r,
        &meta(-600),
        &[running(1)],
        &[g.clone()],
        &LadderState::default(),
        300,
    );
    assert_eq!(d.verdict.classification, Classification::NoTelemetry);
    assert_eq!(d.step, Step::Nothing);
    // A requested GPU with no series at all is missing telemetry too.
    let d = eval(
        &r,
        &meta(-600),
        &[running(2)],
        &[gpu(0, None, 0.0)],
        &LadderState::default(),
        300,
    );
    assert_eq!(d.verdict.classification, Classification::NoTelemetry);
}

#[test]
fn treat_as_idle_makes_a_silent_gpu_idle_since_the_workload_started() {
    let mut spec = GpuPolicySpec::default();
    spec.idle.missing_telemetry = MissingTelemetry::TreatAsIdle;
    let r = Rules::from_spec(&spec);
    let d = eval(
        &r,
        &meta(-600),
        &[running(1)],
        &[],
        &LadderState::default(),
        300,
    );
    assert_eq!(
        d.verdict.classification,
        Classification::Idle(IdleShape::Unused)
    );
    assert_eq!(d.verdict.idle_since, Some(at(-600)));
}

#[test]
fn the_idle_clock_restarts_after_a_telemetry_blind_spot() {
    let r = rules(PolicyMode::Enforce);
    let mut g = gpu(0, None, 0.0);
    g.blind_until = Some(at(280));
    let d = eval(
        &r,
        &meta(-600),
        &[running(1)],
        &[g],
        &LadderState::default(),
        300,
    );
    assert_eq!(
        d.verdict.classification,
        Classification::Active,
        "{}",
        d.reason
    );
    assert!(d.reason.contains("less than idle.window"), "{}", d.reason);
}

#[test]
fn young_exempt_and_snoozed_workloads_are_never_touched() {
    let r = rules(PolicyMode::Enforce);
    let idle = [gpu(0, None, 0.0)];
    let done = LadderState {
        warned_at: Some(at(1)),
        ..LadderState::default()
    };
    let young = eval(&r, &meta(290), &[running(1)], &idle, &done, 300);
    assert_eq!(young.verdict.classification, Classification::TooYoung);
    let mut exempt = meta(-600);
    exempt
        .labels
        .insert(keys::EXEMPT_LABEL.into(), "true".into());
    let e = eval(&r, &exempt, &[running(1)], &idle, &done, 300);
    assert_eq!(e.verdict.classification, Classification::Exempt);
    let snoozed = LadderState {
        snooze_until: Some(at(400)),
        ..done.clone()
    };
    let s = eval(&r, &meta(-600), &[running(1)], &idle, &snoozed, 300);
    assert_eq!(s.verdict.classification, Classification::Snoozed);
    for d in [young, e, s] {
        assert_eq!(d.step, Step::Nothing);
    }
}

#[test]
fn a_snooze_longer_than_max_snooze_is_ignored_and_said_so() {
    let r = rules(PolicyMode::Enforce);
    let ladder = LadderState {
        snooze_until: Some(at(300 + 60 * 48)),
        ..LadderState::default()
    };
    let d = eval(
        &r,
        &meta(-600),
        &[running(1)],
        &[gpu(0, None, 0.0)],
        &ladder,
        300,
    );
    assert!(d.verdict.classification.is_idle());
    assert!(
        d.verdict.reason.contains("maxSnooze"),
        "{}",
        d.verdict.reason
    );
}

#[test]
fn the_owner_is_warned_before_any_action_and_the_action_waits_for_the_notice_period() {
    let r = rules(PolicyMode::Enforce);
    let g = [gpu(0, Some(0), 0.0)];
    let pods = [running(1)];
    let none = LadderState::default();
    assert_eq!(
        eval(&r, &meta(-60), &pods, &g, &none, 29).step,
        Step::Nothing
    );
    assert_eq!(eval(&r, &meta(-60), &pods, &g, &none, 30).step, Step::Warn);
    // Never warned: still only a warning, however long idle.
    assert_eq!(eval(&r, &meta(-60), &pods, &g, &none, 500).step, Step::Warn);
    // Warned late (at 200): the action waits action.after - warn.after = 30m from then.
    let late = LadderState {
        warned_at: Some(at(200)),
        ..none.clone()
    };
    let d = eval(&r, &meta(-60), &pods, &g, &late, 229);
    assert_eq!(d.step, Step::Nothing);
    assert_eq!(d.next_step_at, Some(at(230)));
    assert_eq!(
        eval(&r, &meta(-60), &pods, &g, &late, 230).step,
        Step::Act(ActionType::ScaleToZero)
    );
}

#[test]
fn a_warning_from_an_earlier_idle_period_does_not_count() {
    let r = rules(PolicyMode::Enforce);
    let old = LadderState {
        warned_at: Some(at(10)),
        ..LadderState::default()
    };
    let d = eval(
        &r,
        &meta(-60),
        &[running(1)],
        &[gpu(0, Some(100), 0.0)],
        &old,
        200,
    );
    assert_eq!(d.step, Step::Warn);
}

#[test]
fn audit_mode_reports_would_act_instead_of_acting() {
    let r = rules(PolicyMode::Audit);
    let ladder = LadderState {
        warned_at: Some(at(30)),
        ..LadderState::default()
    };
    let d = eval(
        &r,
        &meta(-60),
        &[running(1)],
        &[gpu(0, Some(0), 0.0)],
        &ladder,
        90,
    );
    assert_eq!(d.step, Step::WouldAct(ActionType::ScaleToZero));
    assert!(!d.step.changes_workload());
}

#[test]
fn a_crash_looping_pod_bound_to_gpus_is_provisioning_idle_after_the_grace() {
    let r = rules(PolicyMode::Enforce);
    let stuck = PodState {
        phase: PodPhase::Running,
        waiting_reason: Some("CrashLoopBackOff".into()),
        stuck_since: Some(at(100)),
        gpu_devices: 4,
    };
    let d = eval(
        &r,
        &meta(0),
        std::slice::from_ref(&stuck),
        &[],
        &LadderState::default(),
        110,
    );
    assert_eq!(
        d.verdict.classification,
        Classification::Active,
        "within provisioningGrace: {}",
        d.reason
    );
    let d = eval(&r, &meta(0), &[stuck], &[], &LadderState::default(), 200);
    assert_eq!(
        d.verdict.classification,
        Classification::Idle(IdleShape::Provisioning)
    );
    assert!(d.verdict.reason.contains("CrashLoopBackOff"));
    assert_eq!(d.verdict.idle_since, Some(at(100)));
}

#[test]
fn high_pcie_receive_with_an_idle_engine_is_data_starved_and_not_reaped_by_default() {
    let r = rules(PolicyMode::Enforce);
    let mut g = gpu(0, Some(0), 30_000.0);
    g.pcie_rx_bytes_per_second = Some(5.0e9);
    let warned = LadderState {
        warned_at: Some(at(30)),
        ..LadderState::default()
    };
    let d = eval(&r, &meta(-60), &[running(1)], &[g], &warned, 300);
    assert_eq!(
        d.verdict.classification,
        Classification::Idle(IdleShape::DataStarved)
    );
    assert_eq!(d.step, Step::Nothing);
    assert!(d.reason.contains("reapDataStarved"));
}

#[test]
fn an_action_already_taken_in_this_idle_period_is_not_repeated() {
    let r = rules(PolicyMode::Enforce);
    let ladder = LadderState {
        warned_at: Some(at(30)),
        reaped_at: Some(at(60)),
        ..LadderState::default()
    };
    let d = eval(
        &r,
        &meta(-60),
        &[running(1)],
        &[gpu(0, Some(0), 0.0)],
        &ladder,
        90,
    );
    assert_eq!(d.step, Step::Nothing);
}

#[test]
fn max_per_hour_bounds_actions_when_hundreds_go_idle_at_once() {
    let r = rules(PolicyMode::Enforce);
    let ladder = LadderState {
        warned_at: Some(at(30)),
        ..LadderState::default()
    };
    let mut decisions: Vec<Decision> = (0..300)
        .map(|i| {
            eval(
                &r,
                &meta(-60),
                &[running(1)],
                &[gpu(0, Some(i % 7), 0.0)],
                &ladder,
                200,
            )
        })
        .collect();
    assert!(
        decisions
            .iter()
            .all(|d| d.step == Step::Act(ActionType::ScaleToZero))
    );
    let mut refs: Vec<&mut Decision> = decisions.iter_mut().collect();
    let allowed = limit_actions(&mut refs, 5, r.max_per_hour);
    assert_eq!(allowed, 15);
    let acted: Vec<_> = decisions
        .iter()
        .filter(|d| d.step.changes_workload())
        .collect();
    assert_eq!(acted.len(), 15);
    // The longest idle go first.
    assert!(acted.iter().all(|d| d.verdict.idle_since <= Some(at(2))));
}

fn tracker_decision(
    r: &Rules,
    activity: &[(f64, bool)],
    busy_gpu: Option<usize>,
    gpus: usize,
) -> (Decision, Vec<GpuObservation>) {
    let step = SignedDuration::from_mins(1);
    let mut trackers: Vec<_> = (0..gpus).map(|_| ActivityTracker::new(r, step)).collect();
    let mut obs: Vec<_> = (0..gpus)
        .map(|i| GpuObservation {
            id: format!("GPU-{i}"),
            share: 1.0,
            ..Default::default()
        })
        .collect();
    for (m, (a, present)) in activity.iter().enumerate() {
        for (k, t) in trackers.iter_mut().enumerate() {
            let busy_now = Some(k) == busy_gpu && m == activity.len() - 1;
            let value = if busy_now { 1.0 } else { *a };
            let s = Sample {
                engine_active: Some(value),
                ..Sample::default()
            };
            t.advance(at(m as i64), (*present || busy_now).then_some(&s), r);
        }
    }
    for (t, o) in trackers.iter().zip(obs.iter_mut()) {
        t.fill(o);
    }
    let now = activity.len() as i64 - 1;
    let ladder = LadderState {
        warned_at: Some(at(0)),
        ..LadderState::default()
    };
    (
        eval(r, &meta(-1000), &[running(gpus as u32)], &obs, &ladder, now),
        obs,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn no_sequence_of_samples_makes_a_workload_with_a_busy_gpu_idle(
        activity in prop::collection::vec((0.0f64..0.04, prop::bool::weighted(0.9)), 40..200),
        gpus in 1usize..8,
        busy in 0usize..8,
    ) {
        let r = rules(PolicyMode::Enforce);
        let (d, _) = tracker_decision(&r, &activity, Some(busy % gpus), gpus);
        prop_assert_eq!(d.verdict.classification, Classification::Active);
        prop_assert!(!d.step.changes_workload());
    }

    #[test]
    fn audit_mode_never_plans_a_change(
        activity in prop::collection::vec((0.0f64..0.2, prop::bool::weighted(0.95)), 40..300),
        gpus in 1usize..4,
    ) {
        let r = rules(PolicyMode::Audit);
        let (d, _) = tracker_decision(&r, &activity, None, gpus);
        prop_assert!(!d.step.changes_workload(), "{:?}", d.step);
    }

    #[test]
    fn an_action_needs_idle_for_action_after_and_full_coverage_in_the_window(
        activity in prop::collection::vec((0.0f64..0.2, prop::bool::weighted(0.9)), 40..300),
    ) {
        let r = rules(PolicyMode::Enforce);
        let (d, obs) = tracker_decision(&r, &activity, None, 2);
        if d.step.changes_workload() {
            let now = at(activity.len() as i64 - 1);
            let since = d.verdict.idle_since.expect("acted means idle");
            prop_assert!(now.duration_since(since) >= r.action_after);
            prop_assert!(obs.iter().all(|o| o.coverage >= r.min_coverage));
            prop_assert!(obs.iter().all(|o| o.last_busy_at.is_none_or(|b| b <= since)));
        }
    }

    #[test]
    fn gaps_are_never_counted_as_idle_time(
        idle_before in 40usize..120, gap in 20usize..120, idle_after in 0usize..60,
    ) {
        // Busy, then idle, then a long gap, then idle again: with Ignore the idle clock
        // starts after the gap, so the workload is idle for at most `idle_after` minutes.
        let r = rules(PolicyMode::Enforce);
        let mut activity = vec![(0.9, true)];
        activity.extend(std::iter::repeat_n((0.0, true), idle_before));
        activity.extend(std::iter::repeat_n((0.0, false), gap));
        activity.extend(std::iter::repeat_n((0.0, true), idle_after));
        let (d, _) = tracker_decision(&r, &activity, None, 1);
        let now = at(activity.len() as i64 - 1);
        if let Some(since) = d.verdict.idle_since {
            prop_assert!(now.duration_since(since) <= SignedDuration::from_mins(idle_after as i64));
        }
    }
}

/// Invariant 1 at the end of the data: the idle clock runs only as far as the telemetry
/// reaches. A GPU busy until minute 100 whose samples stop there (Prometheus down, or its
/// next scrape not read yet) is not idle at minute 200, however long ago that was; once
/// samples reach a window past its last activity, it is. (In the soak of 2026-12-04 a
/// Prometheus outage left the partial bucket of the first read after it empty, and fifty
/// busy Deployments were warned.)
#[test]
fn idleness_is_not_inferred_past_the_end_of_the_telemetry() {
    let r = rules(PolicyMode::Enforce);
    let window_min = r.window.as_secs() / 60;
    let at_minute_200_with_data_until = |minute: i64| {
        let mut g = gpu(0, Some(100), 74_000.0);
        g.data_until = Some(at(minute));
        eval(
            &r,
            &meta(-600),
            &[running(1)],
            std::slice::from_ref(&g),
            &LadderState::default(),
            200,
        )
    };
    let d = at_minute_200_with_data_until(100);
    assert_eq!(d.verdict.classification, Classification::Active, "{d:?}");
    let d = at_minute_200_with_data_until(100 + window_min);
    assert!(
        matches!(d.verdict.classification, Classification::Idle(_)),
        "{d:?}"
    );
}
