//! Request-driven inference: a workload whose idle history shows short, frequent idle
//! spans — requests come and go — rather than the long silences of a notebook left
//! overnight or a hung job. Pure: judged from the idle spans the risk estimate keeps.
//!
//! A policy with `action.inference.minReplicas` reclaims such workloads more softly:
//! they keep that many replicas serving instead of going to zero (the cold start of a
//! model server is minutes of loading weights; the next request should not pay it).

use super::risk::{IdleHistory, Rhythm};

/// Why a workload counts as request-driven inference (a sentence for warnings and
/// Events), or `None`: too little history, or long idle spans.
pub fn request_driven(history: Option<&IdleHistory>) -> Option<String> {
    let rhythm = history?.rhythm()?;
    matches!(rhythm, Rhythm::Chatty | Rhythm::Steady).then(|| {
        format!(
            "its idle spans are short and frequent ({}), as request-driven inference's are",
            rhythm.words()
        )
    })
}

/// Kinds with their own way to stop (an annotation, their worker groups), not scaled
/// through `/scale`: the softer action does not apply to them. `group`: the API group
/// when known (the controller); None matches by kind alone (a backtest of
/// kube-state-metrics owners, which carry no group).
pub fn stops_its_own_way(group: Option<&str>, kind: &str) -> bool {
    const KINDS: [(&str, &str); 5] = [
        ("kubeflow.org", "Notebook"),
        ("serving.kserve.io", "InferenceService"),
        ("serving.kserve.io", "LLMInferenceService"),
        ("ray.io", "RayService"),
        ("ray.io", "RayCluster"),
    ];
    KINDS
        .iter()
        .any(|(g, k)| *k == kind && group.is_none_or(|group| group == *g))
}

/// What a softer inference action means for one workload now.
#[derive(Debug, Clone, PartialEq)]
pub enum Softer {
    /// The policy's own action applies (not request-driven, no `action.inference`, or a
    /// kind that is not scaled through `/scale`).
    No,
    /// Scale to `keep` replicas instead of zero.
    Keep { keep: i32, why: String },
    /// Already at or below `keep` replicas: nothing to reclaim.
    AtMinimum { keep: i32, why: String },
}

/// The share of a workload's GPUs that scaling its `replicas` pods down to `keep`
/// reclaims (the kept replicas' GPUs stay in use): what the controller reports for a
/// scale to a minimum, and what backtest counts as reclaimed.
pub fn reclaimed_share(replicas: usize, keep: i32) -> f64 {
    let replicas = replicas.max(1) as f64;
    (replicas - f64::from(keep)).max(0.0) / replicas
}

/// The softer action for a workload with `replicas` replicas, under a policy keeping
/// `min_replicas` (its `action.inference`), when its kind scales through `/scale`.
pub fn softer(
    min_replicas: Option<i32>,
    scalable: bool,
    replicas: usize,
    history: Option<&IdleHistory>,
) -> Softer {
    let (Some(keep), true) = (min_replicas, scalable) else {
        return Softer::No;
    };
    let Some(why) = request_driven(history) else {
        return Softer::No;
    };
    if replicas <= keep.max(0) as usize {
        Softer::AtMinimum { keep, why }
    } else {
        Softer::Keep { keep, why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::risk::{Histories, RiskParams};
    use jiff::{SignedDuration, Timestamp};

    /// A workload's history of `spans` idle spans of `idle_minutes`, each followed by
    /// 10 busy minutes, observed every minute.
    fn history(spans: i64, idle_minutes: i64) -> Histories<&'static str> {
        let mut h = Histories::new(RiskParams {
            horizon: SignedDuration::from_hours(2),
            lookback: SignedDuration::from_hours(24 * 30),
            min_spans: 10,
        });
        let minute = SignedDuration::from_mins(1);
        let mut t: Timestamp = "2026-11-01T00:00:00Z".parse().unwrap();
        for _ in 0..spans {
            for _ in 0..10 {
                h.busy(&"w", t, minute);
                t += minute;
            }
            for _ in 0..idle_minutes {
                h.idle(&"w", t);
                t += minute;
            }
        }
        h.busy(&"w", t, minute);
        h
    }

    #[test]
    fn short_frequent_idle_spans_are_request_driven_long_ones_are_not() {
        let chatty = history(30, 3);
        let why = request_driven(chatty.get(&"w")).expect("request-driven");
        assert!(why.contains("under 4m"), "{why}");
        let steady = history(30, 10);
        assert!(request_driven(steady.get(&"w")).is_some());
        // A notebook: long silences.
        let sparse = history(30, 90);
        assert_eq!(request_driven(sparse.get(&"w")), None);
        // Too little history to tell.
        let young = history(5, 3);
        assert_eq!(request_driven(young.get(&"w")), None);
        assert_eq!(request_driven(None), None);
    }

    #[test]
    fn the_softer_action_keeps_replicas_only_where_it_applies() {
        let chatty = history(30, 3);
        let h = chatty.get(&"w");
        assert!(matches!(
            softer(Some(1), true, 4, h),
            Softer::Keep { keep: 1, .. }
        ));
        assert!(matches!(
            softer(Some(1), true, 1, h),
            Softer::AtMinimum { keep: 1, .. }
        ));
        assert!(matches!(
            softer(Some(2), true, 1, h),
            Softer::AtMinimum { keep: 2, .. }
        ));
        // No inference section, a kind not scaled through /scale, or not request-driven.
        assert_eq!(softer(None, true, 4, h), Softer::No);
        assert_eq!(softer(Some(1), false, 4, h), Softer::No);
        let sparse = history(30, 90);
        assert_eq!(softer(Some(1), true, 4, sparse.get(&"w")), Softer::No);
    }
}
