use std::collections::HashMap;
use std::fmt::Write as _;

use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use super::*;
use crate::api::GpuPolicy;
use crate::api::policy::ActionType;
use crate::cluster::inventory::{Workload, pod_info, resolve};
use crate::controller::plan::{AuditMemory, by_pod, plan_with};
use crate::engine::{Classification, Histories, Step};
use crate::gpus::GpuResources;
use crate::telemetry::openmetrics::{RawSample, read_samples};
use crate::telemetry::trace::{ReadOptions, TraceBuilder};

/// Start of the controller's life in the recorded history.
const T0: i64 = 1_793_577_600;
const MIN: i64 = 60;

/// A recorded history: the DCGM exporter's samples every 30 s, owned, in file order.
struct Recording(Vec<(String, String, String, f64, f64)>);

impl Recording {
    fn parse(text: &str) -> Self {
        let mut out = Vec::new();
        read_samples(text.as_bytes(), "test", |s| {
            out.push((
                s.metric.to_string(),
                s.series.to_string(),
                s.labels.to_string(),
                s.value,
                s.timestamp,
            ));
            Ok(())
        })
        .unwrap();
        Self(out)
    }

    /// What `FAMILY[to - from]` at `to` returns for every family: the samples in
    /// (`from`, `to`], bucketed as the Prometheus source buckets them.
    fn read(&self, from: i64, to: i64) -> Option<Trace> {
        let mut builder = TraceBuilder::new(&ReadOptions {
            skip_unknown_metrics: true,
            ..ReadOptions::default()
        });
        for (metric, series, labels, value, timestamp) in &self.0 {
            if *timestamp > from as f64 && *timestamp <= to as f64 {
                builder
                    .add(&RawSample {
                        metric,
                        series,
                        labels,
                        value: *value,
                        timestamp: *timestamp,
                        line: 0,
                    })
                    .unwrap();
            }
        }
        builder.finish("test").ok()
    }
}

/// Four one-GPU bare pods, from two hours before T0 to three hours after:
/// `nb-0` busy until T0+20m, then idle; `nb-1` busy until T0+30m, its exporter silent from T0+40m to
/// T0+70m; `nb-2` busy 10 minutes of every hour; `nb-3` idle but for a burst from T0+95m
/// to T0+98m, inside the controller's outage.
fn history() -> Recording {
    record(4, Some(1), |pod, m| match pod {
        0 => m < 20,
        1 => m < 30,
        2 => m.rem_euclid(60) < 10,
        _ => (95..98).contains(&m),
    })
}

/// `pods` one-GPU pods `nb-<i>`, busy at minute `m` after T0 when `busy(i, m)`; the
/// exporter of `nb-<gap>` is silent from T0+40m to T0+70m.
fn record(pods: usize, gap: Option<usize>, busy: impl Fn(usize, i64) -> bool) -> Recording {
    let mut s = String::new();
    for family in ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"] {
        let _ = writeln!(s, "# TYPE {family} gauge");
        for pod in 0..pods {
            let mut t = T0 - 120 * MIN;
            while t <= T0 + 180 * MIN {
                let m = (t - T0).div_euclid(MIN);
                let busy = busy(pod, m);
                let silent = gap == Some(pod) && (40..70).contains(&m);
                let value = if family.ends_with("FB_USED") {
                    30_000.0
                } else if busy {
                    0.7
                } else {
                    0.01
                };
                if !silent {
                    let _ = writeln!(
                        s,
                        "{family}{{gpu=\"0\",UUID=\"GPU-{pod}\",modelName=\"NVIDIA L4\",namespace=\"ml\",pod=\"nb-{pod}\"}} {value} {t}"
                    );
                }
                t += 30;
            }
        }
    }
    s.push_str("# EOF\n");
    Recording::parse(&s)
}

fn policy() -> GpuPolicy {
    policy_with(20)
}

fn policy_with(max_per_hour: u32) -> GpuPolicy {
    serde_json::from_value(json!({
        "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
        "spec": {"mode": "Enforce", "action": {"type": "Evict", "after": "60m", "maxPerHour": max_per_hour},
                 "warn": {"after": "30m"}},
    }))
    .unwrap()
}

fn pods(annotations: &[serde_json::Value]) -> Vec<Workload> {
    let now = Timestamp::from_second(T0).unwrap();
    let infos = annotations
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("nb-{i}"), "namespace": "ml",
                             "creationTimestamp": "2026-11-01T00:00:00Z", "annotations": a},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running"}});
            pod_info(&pod, &GpuResources::default(), now).unwrap()
        })
        .collect();
    resolve(infos, &HashMap::new())
}

/// One controller's decisions, cycle by cycle: (minute after T0, pod, step,
/// classification, reason).
type Decisions = Vec<(i64, String, Step, Classification, String)>;

/// How a simulated controller reads its telemetry each cycle.
#[derive(Clone, Copy, PartialEq)]
enum Reads {
    /// What the controller does: the gap since the previous read.
    Incremental,
    /// Everything since the start-up read's beginning, into a fresh state.
    Full,
    /// A broken reader that loses what it did not read in time (for the control).
    LastMinuteOnly,
    /// Incremental, with the controller restarted (its memory lost) at this minute.
    RestartAt(i64),
}

/// Runs the controller's observe → plan over the recorded history at cycles every
/// minute (17 s past), none from T0+90m to T0+100m (an outage), applying warnings and
/// actions to the workloads' annotations as the controller would.
fn decisions(recording: &Recording, reads: Reads) -> Decisions {
    decisions_of(recording, reads, &policy(), 4)
}

fn decisions_of(
    recording: &Recording,
    reads: Reads,
    policy: &GpuPolicy,
    count: usize,
) -> Decisions {
    let policy = policy.clone();
    let rules = Rules::from_spec(&policy.spec);
    let mut live = LiveTelemetry::new(60);
    let mut start_from = None;
    let mut annotations = vec![json!({}); count];
    let mut history = Histories::new(rules.risk);
    let mut out = Decisions::new();
    let mut last_evaluation: Option<Timestamp> = None;
    for minute in 0..180 {
        if (90..100).contains(&minute) {
            continue;
        }
        let now = Timestamp::from_second(T0 + minute * MIN + 17).unwrap();
        let to = now.as_second() - READ_LAG_SECONDS;
        if reads == Reads::RestartAt(minute) {
            live = LiveTelemetry::new(60);
        }
        let read = live.next_read(std::slice::from_ref(&rules), to);
        let start = *start_from.get_or_insert_with(|| read.expect("first read").from);
        match reads {
            Reads::Incremental | Reads::RestartAt(_) => {
                if let Some(read) = read {
                    live.apply(
                        read,
                        std::slice::from_ref(&rules),
                        recording.read(read.from, read.to).as_ref(),
                    );
                }
            }
            Reads::Full => {
                let read = Read {
                    from: start,
                    to,
                    rebuild: true,
                };
                live = LiveTelemetry::new(60);
                live.apply(
                    read,
                    std::slice::from_ref(&rules),
                    recording.read(start, to).as_ref(),
                );
            }
            Reads::LastMinuteOnly => {
                if let Some(mut read) = read {
                    if !read.rebuild {
                        read.from = read.from.max(to - MIN);
                    }
                    live.apply(
                        read,
                        std::slice::from_ref(&rules),
                        recording.read(read.from, read.to).as_ref(),
                    );
                }
            }
        }
        let observations = live.observe(&rules);
        let grouped = by_pod(&observations);
        let workloads = pods(&annotations);
        let resolution = last_evaluation
            .map_or(SignedDuration::from_mins(1), |t| now.duration_since(t))
            .clamp(SignedDuration::from_secs(1), SignedDuration::from_hours(1));
        let plan = plan_with(
            &policy,
            &[&policy],
            &workloads,
            &HashMap::new(),
            &grouped,
            &AuditMemory::default(),
            &mut history,
            resolution,
            now,
            0,
        );
        last_evaluation = Some(now);
        for p in &plan.planned {
            let w = &workloads[p.workload];
            let index: usize = w.root.name.trim_start_matches("nb-").parse().unwrap();
            let d = &p.decision;
            match d.step {
                Step::Warn => annotations[index]["gpureaper.io/warned-at"] = json!(now.to_string()),
                Step::Act(_) => {
                    annotations[index]["gpureaper.io/reaped-at"] = json!(now.to_string())
                }
                _ => {}
            }
            out.push((
                minute,
                w.root.name.clone(),
                d.step,
                d.verdict.classification.clone(),
                d.reason.clone(),
            ));
        }
    }
    out
}

fn steps_of(d: &Decisions, pod: &str, step: Step) -> Vec<i64> {
    d.iter()
        .filter(|(_, p, s, _, _)| p == pod && *s == step)
        .map(|(m, ..)| *m)
        .collect()
}

#[test]
fn decisions_are_identical_with_incremental_and_full_reads_through_an_exporter_gap_and_an_outage() {
    let recording = history();
    let incremental = decisions(&recording, Reads::Incremental);
    let full = decisions(&recording, Reads::Full);
    assert_eq!(incremental.len(), 170 * 4, "every pod decided every cycle");
    for (a, b) in incremental.iter().zip(&full) {
        assert_eq!(a, b);
    }
    assert_eq!(incremental, full);

    // What the history holds is what was decided. nb-0: idle from T0+20m, warned after
    // 30 minutes and acted on after 60 (the busy minute's bucket counts).
    assert_eq!(steps_of(&incremental, "nb-0", Step::Warn), vec![50]);
    assert_eq!(
        steps_of(&incremental, "nb-0", Step::Act(ActionType::Evict)),
        vec![80]
    );
    // nb-1: idle from T0+30m, but the exporter's gap is no telemetry, never idleness
    // (invariant 1), and the idle clock starts again once the window is covered after
    // it (T0+92m).
    for (m, pod, step, class, _) in &incremental {
        if pod == "nb-1" && (60..=89).contains(m) {
            assert_eq!(*class, Classification::NoTelemetry, "minute {m}");
            assert_eq!(*step, Step::Nothing, "minute {m}");
        }
    }
    // Seen without the gap it would have been warned at minute 59.
    assert_eq!(steps_of(&incremental, "nb-1", Step::Warn), vec![123]);
    // nb-3 was busy during the outage: the read after it sees that, so nb-3 is active at
    // minute 100 and its clock restarts.
    let at_100 = incremental
        .iter()
        .find(|(m, p, ..)| *m == 100 && p == "nb-3")
        .unwrap();
    assert_eq!(at_100.3, Classification::Active, "{at_100:?}");
    // nb-2 is never idle for an hour.
    assert!(steps_of(&incremental, "nb-2", Step::Act(ActionType::Evict)).is_empty());
}

#[test]
fn a_restart_rebuilds_the_same_state_and_a_warned_workload_is_not_warned_again() {
    // Restarted 11 minutes after nb-0 was warned (and inside nb-1's exporter gap): the
    // rebuild reads the horizon and one idle window before it, so the idle clocks, the
    // blind spots and the warning's idle period are what they were.
    let recording = history();
    let incremental = decisions(&recording, Reads::Incremental);
    let restarted = decisions(&recording, Reads::RestartAt(60));
    assert_eq!(restarted, incremental);
    assert_eq!(steps_of(&restarted, "nb-0", Step::Warn), vec![50]);
    // Two pods never busy, one action an hour: nb-1 waits, warned, for an hour after
    // nb-0 is acted on. A restart 85 minutes after the warning must not start a new idle
    // period (the rebuilt trackers would be blind for their first window without the
    // window read before the horizon).
    let idle = record(2, None, |_, _| false);
    let one_an_hour = policy_with(1);
    let incremental = decisions_of(&idle, Reads::Incremental, &one_an_hour, 2);
    let restarted = decisions_of(&idle, Reads::RestartAt(85), &one_an_hour, 2);
    assert_eq!(steps_of(&incremental, "nb-1", Step::Warn), vec![0]);
    assert_eq!(
        steps_of(&incremental, "nb-1", Step::Act(ActionType::Evict)),
        vec![100]
    );
    // The reasons name how long each has been idle: after the restart, as far back as
    // the rebuild read. The steps are the same.
    let steps = |d: &Decisions| -> Vec<(i64, String, Step, Classification)> {
        d.iter()
            .map(|(m, p, s, c, _)| (*m, p.clone(), *s, c.clone()))
            .collect()
    };
    assert_eq!(steps(&restarted), steps(&incremental));
}

#[test]
fn a_reader_that_drops_the_outage_decides_differently() {
    // The control for the test above: it can tell a reader that loses samples.
    let recording = history();
    let dropped = decisions(&recording, Reads::LastMinuteOnly);
    let incremental = decisions(&recording, Reads::Incremental);
    assert_ne!(dropped, incremental);
    let at_100 = dropped
        .iter()
        .find(|(m, p, ..)| *m == 100 && p == "nb-3")
        .unwrap();
    assert_ne!(at_100.3, Classification::Active, "{at_100:?}");
}

#[test]
fn reads_tile_time_a_gap_is_read_once_and_a_long_one_rebuilds() {
    let rules = Rules::from_spec(&policy().spec);
    let policies = std::slice::from_ref(&rules);
    let recording = history();
    let mut live = LiveTelemetry::new(60);
    let horizon = horizon_seconds(&rules);
    assert_eq!(horizon, (60 + 30 + 30 + 10) * MIN);
    let first = live.next_read(policies, T0).unwrap();
    assert_eq!(
        first,
        Read {
            from: T0 - horizon,
            to: T0,
            rebuild: true
        }
    );
    live.apply(
        first,
        policies,
        recording.read(first.from, first.to).as_ref(),
    );
    assert_eq!(live.gpus(), 4);
    // Nothing new: no read.
    assert_eq!(live.next_read(policies, T0), None);
    let next = live.next_read(policies, T0 + MIN).unwrap();
    assert_eq!((next.from, next.to, next.rebuild), (T0, T0 + MIN, false));
    live.apply(next, policies, recording.read(next.from, next.to).as_ref());
    // Ten minutes missed: one read of them.
    let gap = live.next_read(policies, T0 + 11 * MIN).unwrap();
    assert_eq!(
        (gap.from, gap.to, gap.rebuild),
        (T0 + MIN, T0 + 11 * MIN, false)
    );
    live.apply(gap, policies, None);
    // Longer than the horizon: start over.
    let long = live
        .next_read(policies, T0 + 11 * MIN + horizon + 1)
        .unwrap();
    assert!(long.rebuild);
    assert_eq!(long.from, T0 + 11 * MIN + 1);
    // A policy with another threshold needs trackers of its own: rebuilt once, then
    // both are followed; a policy gone drops its trackers without a read.
    let mut other = rules.clone();
    other.threshold = 0.5;
    let both = [rules.clone(), other.clone()];
    let mut live = LiveTelemetry::new(60);
    let r = live.next_read(policies, T0).unwrap();
    live.apply(r, policies, recording.read(r.from, r.to).as_ref());
    let r = live.next_read(&both, T0 + MIN).unwrap();
    assert!(r.rebuild);
    live.apply(r, &both, recording.read(r.from, r.to).as_ref());
    assert!(!live.next_read(&both, T0 + 2 * MIN).unwrap().rebuild);
    assert!(
        !live
            .next_read(std::slice::from_ref(&other), T0 + 2 * MIN)
            .unwrap()
            .rebuild
    );
    assert!(live.observe(&rules).is_empty(), "its trackers were dropped");
    assert_eq!(live.observe(&other).len(), 4);
}

#[test]
fn silence_everywhere_is_a_gap_for_every_gpu_never_idleness() {
    let rules = Rules::from_spec(&policy().spec);
    let policies = std::slice::from_ref(&rules);
    let recording = history();
    let mut live = LiveTelemetry::new(60);
    let r = live.next_read(policies, T0).unwrap();
    live.apply(r, policies, recording.read(r.from, r.to).as_ref());
    let before = live.observe(&rules);
    assert!(before.values().all(|o| o.coverage == 1.0), "{before:?}");
    // Every exporter silent for 20 minutes: the reads come back empty.
    for m in 1..=20 {
        let r = live.next_read(policies, T0 + m * MIN).unwrap();
        live.apply(r, policies, None);
    }
    let after = live.observe(&rules);
    assert_eq!(after.len(), 4);
    for o in after.values() {
        assert!(o.coverage < rules.min_coverage, "{o:?}");
        assert!(
            o.blind_until >= Some(Timestamp::from_second(T0 + 19 * MIN).unwrap()),
            "{o:?}"
        );
    }
}

/// The soak's finding (tests/soak): with `idle.window: 1m` and 60 s buckets, a GPU busy at
/// every sample looked idle between cycles — its last bucket was stamped at the bucket's
/// start, over a minute before the cycle when the read ended just after it. Buckets are
/// now stamped at the end of the time they cover, so at every cycle phase it is busy.
#[test]
fn a_gpu_busy_at_every_sample_is_never_idle_under_a_one_minute_window() {
    let recording = record(1, None, |_, _| true);
    let spec: crate::api::policy::GpuPolicySpec = serde_json::from_value(json!({
        "idle": {"window": "1m", "startupGrace": "0s", "minCoverage": 0.5},
    }))
    .unwrap();
    let rules = crate::engine::Rules::from_spec(&spec);
    let mut live = LiveTelemetry::new(60);
    let mut from = T0 - 30 * MIN;
    live.apply(
        Read {
            from,
            to: T0,
            rebuild: true,
        },
        std::slice::from_ref(&rules),
        recording.read(from, T0).as_ref(),
    );
    from = T0 + 17;
    live.apply(
        Read {
            from: T0,
            to: from,
            rebuild: false,
        },
        std::slice::from_ref(&rules),
        recording.read(T0, from).as_ref(),
    );
    // Cycles every 20 s, reads ending 15 s behind, at 17, 37 and 57 s past the minute
    // (samples at 0 and 30 s): the read ending at 57 s leaves the bucket's last sample
    // 42 s before the read's end.
    for cycle in 1..=18 {
        let now = T0 + 32 + 20 * cycle;
        let to = now - 15;
        live.apply(
            Read {
                from,
                to,
                rebuild: false,
            },
            std::slice::from_ref(&rules),
            recording.read(from, to).as_ref(),
        );
        from = to;
        let obs = live.observe(&rules);
        let gpu = obs.values().next().expect("the GPU is observed");
        let last_busy = gpu.last_busy_at.expect("busy").as_second();
        assert!(
            now - last_busy < 60,
            "at T0+{}s the GPU's last busy moment is {}s ago: it would be idle",
            now - T0,
            now - last_busy
        );
    }
}

/// A GPU's identity is kept between reads and replaced only when its labels change (a
/// new model name, a MIG profile): the observation shows the newest.
#[test]
fn a_gpu_whose_labels_change_is_observed_with_the_new_ones() {
    let rules = Rules::from_spec(&policy().spec);
    let policies = std::slice::from_ref(&rules);
    let recording = record(1, None, |_, _| false);
    let mut live = LiveTelemetry::new(60);
    let r = live.next_read(policies, T0).unwrap();
    live.apply(r, policies, recording.read(r.from, r.to).as_ref());
    let model = |live: &LiveTelemetry| {
        let obs = live.observe(&rules);
        obs.values().next().expect("observed").model.clone()
    };
    assert_eq!(model(&live), "NVIDIA L4");
    let relabelled = Recording(
        recording
            .0
            .iter()
            .map(|(m, series, labels, v, t)| {
                let swap = |s: &str| s.replace("NVIDIA L4", "NVIDIA L40S");
                (m.clone(), swap(series), swap(labels), *v, *t)
            })
            .collect(),
    );
    let r = live.next_read(policies, T0 + 2 * MIN).unwrap();
    live.apply(r, policies, relabelled.read(r.from, r.to).as_ref());
    assert_eq!(model(&live), "NVIDIA L40S");
    assert_eq!(live.gpus(), 1);
}

/// A read whose partial bucket has no sample yet (the scrapes stopped: Prometheus down)
/// reaches only the end of the last committed bucket: the observation says so, so the
/// idle clock does not run through the outage (`GpuObservation::data_until`).
#[test]
fn a_read_with_no_sample_in_its_partial_bucket_reaches_only_the_committed_buckets() {
    // Busy at every sample, silent from minute 40 to 70.
    let recording = record(1, Some(0), |_, _| true);
    let rules = Rules::from_spec(&policy().spec);
    let mut live = LiveTelemetry::new(60);
    live.apply(
        Read {
            from: T0,
            to: T0 + 39 * MIN + 50,
            rebuild: true,
        },
        std::slice::from_ref(&rules),
        recording.read(T0, T0 + 39 * MIN + 50).as_ref(),
    );
    let obs = live.observe(&rules);
    let gpu = obs.values().next().expect("observed");
    assert_eq!(
        gpu.data_until.map(|t| t.as_second()),
        Some(T0 + 39 * MIN + 50)
    );
    // The next read ends 49 s into minute 40, with nothing scraped since minute 39.
    let to = T0 + 40 * MIN + 49;
    live.apply(
        Read {
            from: T0 + 39 * MIN + 50,
            to,
            rebuild: false,
        },
        std::slice::from_ref(&rules),
        recording.read(T0 + 39 * MIN + 50, to).as_ref(),
    );
    let obs = live.observe(&rules);
    let gpu = obs.values().next().expect("observed");
    assert_eq!(gpu.data_until.map(|t| t.as_second()), Some(T0 + 40 * MIN));
    assert_eq!(
        gpu.last_busy_at.map(|t| t.as_second()),
        Some(T0 + 40 * MIN),
        "busy through minute 39, stamped at its end"
    );
}
