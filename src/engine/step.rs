//! One evaluation of one policy over the workloads it governs: the step the controller
//! (`controller::plan`) and `backtest` both take, every cycle or trace step. PURE.
//!
//! In order, for every governed workload: feed this instant's observations into the
//! policy's idle-span history, classify and decide with the resumption-risk estimate
//! ([`super::evaluate_with`]), turn the policy's action into what the controller really
//! does for the workload's kind ([`action_for`]: a Job is suspended, not scaled; a bare
//! Pod cannot be scaled to zero), apply the softer action for request-driven inference
//! ([`super::inference`]); then bound the actions by `action.maxPerHour`
//! ([`super::limit_actions`]) and prune the history. Whatever `backtest` predicts is what
//! this function decided; there is no second copy of it.

use std::collections::BTreeMap;
use std::hash::Hash;

use jiff::{SignedDuration, Timestamp};

use super::inference::{self, Softer};
use super::ladder::{evaluate_with, limit_actions};
use super::model::{
    Classification, Decision, GpuObservation, LadderState, PodState, Step, WorkloadMeta,
};
use super::risk::Histories;
use super::rules::Rules;
use crate::api::policy::ActionType;
use crate::telemetry::trace::Trace;

/// One governed workload at this instant.
#[derive(Debug, Clone)]
pub struct Candidate<'a, K> {
    /// Its key in the policy's idle-span history.
    pub key: K,
    pub meta: &'a WorkloadMeta,
    pub pods: &'a [PodState],
    /// One observation per GPU, `pod` indexing `pods`.
    pub gpus: &'a [GpuObservation],
    pub ladder: LadderState,
    /// Replicas (pods) holding GPUs now.
    pub replicas: usize,
    /// The root workload's API group when known (the controller); None: by kind alone
    /// (a trace's kube-state-metrics owners carry no group).
    pub group: Option<&'a str>,
    /// Why nothing may be done to it now, whatever the ladder says (being deleted, owned
    /// by a kind gpu-reaper does not manage).
    pub blocked: Option<String>,
}

/// The engine's plan for one candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub decision: Decision,
    /// The softer action for request-driven inference (`action.inference`), if it applies.
    pub softer: Softer,
    /// The policy's action, which the controller cannot take on this kind: nothing is
    /// done or reclaimed, and the reason says so.
    pub unsupported: Option<ActionType>,
}

/// What the controller does when `action` is due on a root workload of `kind` (API
/// `group` when known, `labels`), or why it cannot. The same table the actions follow
/// (`cluster::actions`):
///
/// - ScaleToZero: through `/scale` (Deployment, StatefulSet, any kind with the
///   subresource), or the kind's own stop (Notebook, KServe, Ray). A Job, JobSet, RayJob
///   or Kubeflow training job has no replicas to scale: it is **suspended** instead, which
///   frees its GPUs just as reversibly. A bare Pod, a DaemonSet or a CronJob cannot be
///   scaled to zero: unsupported.
/// - Suspend: kinds with a suspend flag (and RayService, and anything Kueue queues).
/// - Evict: any workload (its pods are evicted).
pub fn action_for(
    action: ActionType,
    group: Option<&str>,
    kind: &str,
    labels: &BTreeMap<String, String>,
) -> Result<ActionType, String> {
    let is = |g: &str, k: &str| kind == k && group.is_none_or(|group| group == g);
    let suspendable = is("batch", "Job")
        || is("jobset.x-k8s.io", "JobSet")
        || is("ray.io", "RayJob")
        || is("ray.io", "RayCluster")
        || is("ray.io", "RayService")
        || (kind.ends_with("Job")
            && kind != "CronJob"
            && group.is_none_or(|g| g == "kubeflow.org"));
    let queued = labels.contains_key(KUEUE_QUEUE_LABEL);
    match action {
        ActionType::ScaleToZero if inference::stops_its_own_way(group, kind) => Ok(action),
        ActionType::ScaleToZero if suspendable => Ok(ActionType::Suspend),
        ActionType::ScaleToZero
            if is("", "Pod") || is("apps", "DaemonSet") || is("batch", "CronJob") =>
        {
            Err(format!(
                "a {kind} cannot be scaled to zero (no /scale subresource); use Evict for it"
            ))
        }
        ActionType::Suspend if !(suspendable || queued) => Err(format!(
            "a {kind} cannot be suspended; use ScaleToZero or Evict for it"
        )),
        other => Ok(other),
    }
}

/// Label Kueue puts on the jobs it manages (their Workload is deactivated to suspend).
const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// Feeds one instant's observations of a workload into the idle-span history: busy up to
/// its GPUs' last busy instant and idle since, or not observed (no GPU reported, or too
/// little telemetry: the span in progress is censored). `resolution`: the time since the
/// previous evaluation (one span step).
pub fn observe<K: Eq + Hash + Clone>(
    history: &mut Histories<K>,
    key: &K,
    gpus: &[GpuObservation],
    rules: &Rules,
    resolution: SignedDuration,
    now: Timestamp,
) {
    if gpus.is_empty() || gpus.iter().any(|g| g.coverage < rules.min_coverage) {
        history.unobserved(key, now);
        return;
    }
    let last_busy = gpus.iter().filter_map(|g| g.last_busy_at).max();
    if let Some(b) = last_busy {
        history.busy(key, b, resolution);
    }
    if last_busy.is_none_or(|b| now.duration_since(b) >= resolution) {
        history.idle(key, now);
    }
}

/// The start-up backfill of the history (`controller --history-backfill`, and
/// `backtest --warmup`, which is the same thing): every bucket of `trace` before `until`,
/// from `from`, for each workload (`key`, indexes of its GPUs' series in the trace), fed from the raw
/// samples. A bucket with a sample at or above the threshold on any GPU is busy, one with
/// samples all below is idle, one without samples is not observed. Nothing is classified:
/// the spans join the pools of their workload's idle shape once it is first classified.
pub fn backfill<K: Eq + Hash + Clone>(
    history: &mut Histories<K>,
    trace: &Trace,
    workloads: &[(K, Vec<usize>)],
    rules: &Rules,
    from: Timestamp,
    until: Timestamp,
) {
    let step = SignedDuration::from_secs(trace.step_seconds.max(1));
    let last = (until.as_second() - 1).div_euclid(trace.step_seconds.max(1));
    let first = from.as_second().div_euclid(trace.step_seconds.max(1));
    for bucket in trace.first_bucket.max(first)..=trace.last_bucket.min(last) {
        let Ok(at) = Timestamp::from_second(bucket * trace.step_seconds) else {
            continue;
        };
        for (key, gpus) in workloads.iter().filter(|(_, g)| !g.is_empty()) {
            let (mut any_sample, mut any_busy) = (false, false);
            for &gi in gpus {
                let g = &trace.gpus[gi];
                let activity = rules.activity(
                    g.engine_active.get(bucket).map(f64::from),
                    g.gpu_util.get(bucket).map(f64::from),
                );
                if let Some(a) = activity {
                    any_sample = true;
                    any_busy |= a >= rules.threshold;
                }
            }
            match (any_sample, any_busy) {
                (false, _) => history.unobserved(key, at),
                (true, true) => history.busy(key, at, step),
                (true, false) => history.idle(key, at),
            }
        }
    }
    history.prune(until, |_| true);
}

/// Evaluates one policy (`rules`) over its governed `candidates` at `now`: feeds the
/// history, decides, resolves the action per kind, applies the softer inference action
/// and `maxPerHour` (`acted_last_hour`: the policy's actions in the past hour). Workloads
/// not among the candidates (gone, scaled to zero, suspended) keep their idle span open
/// in the history until they come back busy: that is how the controller learns the
/// regrets of its own actions.
pub fn evaluate_policy<K: Eq + Hash + Clone>(
    rules: &Rules,
    candidates: &[Candidate<'_, K>],
    history: &mut Histories<K>,
    acted_last_hour: u32,
    resolution: SignedDuration,
    now: Timestamp,
) -> Vec<Planned> {
    // Every workload's observations first, then every decision, then the shapes learnt:
    // each estimate sees the same history whatever the order of the candidates (the
    // controller's inventory and a trace order them differently).
    for c in candidates {
        observe(history, &c.key, c.gpus, rules, resolution, now);
    }
    let decisions: Vec<Decision> = candidates
        .iter()
        .map(|c| {
            evaluate_with(
                rules,
                c.meta,
                c.pods,
                c.gpus,
                &c.ladder,
                now,
                |shape, idle_for, at| history.estimate_at(&c.key, shape, idle_for, at),
            )
        })
        .collect();
    let mut out = Vec::with_capacity(candidates.len());
    for (c, mut decision) in candidates.iter().zip(decisions) {
        if let Classification::Idle(shape) = decision.verdict.classification {
            history.set_shape(&c.key, shape);
        }
        let mut unsupported = None;
        if let Step::Act(action) | Step::WouldAct(action) = decision.step {
            match action_for(action, c.group, &c.meta.kind, &c.meta.labels) {
                Ok(real) => {
                    decision.step = match decision.step {
                        Step::Act(_) => Step::Act(real),
                        _ => Step::WouldAct(real),
                    };
                    if real != action {
                        decision.reason = format!(
                            "{}; a {} has no replicas to scale: suspended instead (as reversible, and frees the same GPUs)",
                            decision.reason, c.meta.kind
                        );
                    }
                }
                Err(why) => {
                    decision.step = Step::Nothing;
                    decision.reason = format!(
                        "{}; but {why}: action.type {action:?} is unsupported here, nothing is reclaimed",
                        decision.reason
                    );
                    unsupported = Some(action);
                }
            }
        }
        if let (Step::Act(action), Some(why)) = (decision.step, &c.blocked) {
            decision.step = Step::Nothing;
            decision.reason = format!("would {action:?} but {why}");
        }
        // The softer action is a scale through `/scale`: only where ScaleToZero stays one
        // for this kind.
        let scales = rules.action == ActionType::ScaleToZero
            && action_for(rules.action, c.group, &c.meta.kind, &c.meta.labels)
                == Ok(ActionType::ScaleToZero);
        let softer = if scales {
            inference::softer(
                rules.inference_min_replicas,
                !inference::stops_its_own_way(c.group, &c.meta.kind),
                c.replicas,
                history.get(&c.key),
            )
        } else {
            Softer::No
        };
        if let Softer::AtMinimum { keep, why } = &softer
            && decision.step != Step::Nothing
        {
            decision.step = Step::Nothing;
            decision.reason = format!(
                "{}; request-driven inference ({why}) already at {} replica(s), the policy's action.inference.minReplicas of {keep}: nothing to reclaim",
                decision.reason, c.replicas
            );
        }
        out.push(Planned {
            decision,
            softer,
            unsupported,
        });
    }
    let mut refs: Vec<&mut Decision> = out.iter_mut().map(|p| &mut p.decision).collect();
    limit_actions(&mut refs, acted_last_hour, rules.max_per_hour);
    let present: std::collections::HashSet<&K> = candidates.iter().map(|c| &c.key).collect();
    history.prune(now, |k| present.contains(k));
    out
}

/// The pre-warms due at `now` under `rules` (`action.preWarm`; none without it): of the
/// workloads the policy reclaimed (`key`, when: scaled to zero or suspended, none kept
/// serving), those whose own idle spans in `history` say they are usually busy again
/// within `action.preWarm.before` ([`super::prewarm::predict`]). The controller wakes
/// them through the `gpureaper.io/wake` path; `backtest` ends their reclaim there.
pub fn prewarms<K: Eq + Hash + Clone>(
    rules: &Rules,
    reclaimed: &[(K, Timestamp)],
    history: &Histories<K>,
    now: Timestamp,
) -> Vec<(K, super::prewarm::PreWarm)> {
    let Some(pre_warm) = rules.pre_warm else {
        return Vec::new();
    };
    let min_pause = rules.action_after.max(rules.window);
    reclaimed
        .iter()
        .filter_map(|(key, reaped_at)| {
            let h = history.get(key)?;
            super::prewarm::predict(
                &pre_warm,
                min_pause,
                history.params().lookback,
                h,
                *reaped_at,
                now,
            )
            .map(|p| (key.clone(), p))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    #[test]
    fn scale_to_zero_suspends_a_job_and_is_unsupported_on_a_bare_pod() {
        let s = ActionType::ScaleToZero;
        assert_eq!(
            action_for(s, Some("batch"), "Job", &labels()),
            Ok(ActionType::Suspend)
        );
        assert_eq!(
            action_for(s, None, "Job", &labels()),
            Ok(ActionType::Suspend)
        );
        assert_eq!(
            action_for(s, None, "PyTorchJob", &labels()),
            Ok(ActionType::Suspend)
        );
        assert_eq!(action_for(s, Some("apps"), "Deployment", &labels()), Ok(s));
        assert_eq!(action_for(s, None, "Notebook", &labels()), Ok(s));
        assert!(action_for(s, Some(""), "Pod", &labels()).is_err());
        assert!(action_for(s, None, "Pod", &labels()).is_err());
        // A kind named like a Job in another group is not guessed at.
        assert_eq!(
            action_for(s, Some("example.com"), "BuildJob", &labels()),
            Ok(s)
        );
    }

    #[test]
    fn suspend_needs_a_suspend_flag_or_kueue_and_evict_works_on_anything() {
        let s = ActionType::Suspend;
        assert_eq!(action_for(s, None, "Job", &labels()), Ok(s));
        assert!(action_for(s, Some("apps"), "Deployment", &labels()).is_err());
        let queued = BTreeMap::from([(KUEUE_QUEUE_LABEL.to_string(), "q".to_string())]);
        assert_eq!(action_for(s, Some("apps"), "Deployment", &queued), Ok(s));
        for kind in ["Pod", "Job", "Deployment", "Notebook"] {
            assert_eq!(
                action_for(ActionType::Evict, None, kind, &labels()),
                Ok(ActionType::Evict)
            );
        }
    }
}
