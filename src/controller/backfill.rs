//! Start-up backfill of the idle-span history. The controller learns idle spans from the
//! observations each cycle already has; a controller that just started (or a new leader)
//! has none, so the resumption-risk estimate and the request-driven-inference test would
//! fall back to the fixed durations for days. Once per policy, it replays the activity of
//! the last `--history-backfill` from Prometheus (chunked range-vector queries of the two
//! activity families only: the same raw samples `backtest` reads) into the history.
//!
//! [`feed`] is pure: [`crate::engine::step::backfill`], which `backtest --warmup` runs
//! too, bucket by bucket, for the workloads that exist now (a pod is mapped to its root workload through
//! the current inventory; pods gone since are not).

use std::collections::HashMap;

use jiff::Timestamp;

use crate::cluster::inventory::{ObjectKey, Workload};
use crate::engine::{Histories, Rules};
use crate::telemetry::trace::Trace;

/// The activity families the backfill reads.
pub const FAMILIES: [&str; 2] = ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"];

/// What a backfill added.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backfilled {
    /// Workloads with at least one GPU series in the trace.
    pub workloads: usize,
    /// Finished idle spans now in the history.
    pub spans: usize,
}

/// Feeds `history` with every bucket of `trace` before `until`, for the root workloads
/// of `workloads`: a bucket with a sample at or above the threshold on any GPU is busy,
/// one with samples all below is idle, one without samples is not observed.
pub fn feed(
    history: &mut Histories<ObjectKey>,
    trace: &Trace,
    workloads: &[Workload],
    rules: &Rules,
    until: Timestamp,
) -> Backfilled {
    let mut root_of: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, w) in workloads.iter().enumerate() {
        for p in &w.pods {
            root_of.insert((&p.meta.namespace, &p.meta.name), i);
        }
    }
    let mut gpus_of: Vec<Vec<usize>> = vec![Vec::new(); workloads.len()];
    for (gi, g) in trace.gpus.iter().enumerate() {
        if let Some(&wi) = root_of.get(&(g.gpu.namespace.as_str(), g.gpu.pod.as_str())) {
            gpus_of[wi].push(gi);
        }
    }
    let fed: Vec<(ObjectKey, Vec<usize>)> = workloads
        .iter()
        .zip(gpus_of.iter())
        .map(|(w, gpus)| (w.root.key(), gpus.clone()))
        .collect();
    // The same feed `backtest --warmup` runs.
    crate::engine::step::backfill(history, trace, &fed, rules, Timestamp::MIN, until);
    Backfilled {
        workloads: gpus_of.iter().filter(|g| !g.is_empty()).count(),
        spans: history.spans(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::inventory::{pod_info, resolve};
    use crate::engine::inference::request_driven;
    use crate::gpus::GpuResources;
    use crate::telemetry::trace::{ReadOptions, read_trace};
    use serde_json::json;
    use std::fmt::Write as _;

    const T0: i64 = 1_793_577_600;

    /// `ml/chat-0` busy 10 minutes, idle 3, for `hours`; `ml/gone-0` (no longer in the
    /// cluster) the same.
    fn trace(hours: i64) -> Trace {
        let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
        for pod in ["chat-0", "gone-0"] {
            for m in 0..hours * 60 {
                let v = if m % 13 < 10 { 0.8 } else { 0.0 };
                let _ = writeln!(
                    s,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"0\",UUID=\"GPU-{pod}\",modelName=\"NVIDIA L4\",namespace=\"ml\",pod=\"{pod}\"}} {v} {}",
                    T0 + m * 60
                );
            }
        }
        s.push_str("# EOF\n");
        read_trace(s.as_bytes(), "test", &ReadOptions::default()).unwrap()
    }

    fn workloads() -> Vec<Workload> {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "chat-0", "namespace": "ml", "creationTimestamp": "2026-11-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}});
        let now = Timestamp::from_second(T0).unwrap();
        resolve(
            vec![pod_info(&pod, &GpuResources::default(), now).unwrap()],
            &HashMap::new(),
        )
    }

    #[test]
    fn a_day_of_history_teaches_the_rhythm_of_the_workloads_that_exist_now() {
        let spec = crate::backtest::samples::sample_policy().unwrap().spec;
        let rules = Rules::from_spec(&spec);
        let w = workloads();
        let key = w[0].root.key();
        let until = Timestamp::from_second(T0 + 24 * 3600).unwrap();
        let mut history = Histories::new(rules.risk);
        let added = feed(&mut history, &trace(24), &w, &rules, until);
        assert_eq!(added.workloads, 1, "gone-0 is not in the cluster");
        // 24 h / 13 min ≈ 110 busy→idle→busy cycles, each a finished idle span.
        assert!(added.spans >= 100, "{added:?}");
        assert_eq!(history.workloads(), 1);
        let why = request_driven(history.get(&key)).expect("chatty");
        assert!(why.contains("under 4m"), "{why}");
        // Too short a backfill: not enough spans to tell.
        let mut short = Histories::new(rules.risk);
        feed(&mut short, &trace(2), &w, &rules, until);
        assert_eq!(request_driven(short.get(&key)), None);
    }

    #[test]
    fn nothing_at_or_after_the_cut_is_fed() {
        let spec = crate::backtest::samples::sample_policy().unwrap().spec;
        let rules = Rules::from_spec(&spec);
        let w = workloads();
        let t = trace(24);
        let cut = Timestamp::from_second(T0 + 12 * 3600).unwrap();
        let mut full = Histories::new(rules.risk);
        feed(&mut full, &t, &w, &rules, cut);
        let mut half = Histories::new(rules.risk);
        feed(&mut half, &trace(12), &w, &rules, cut);
        assert_eq!(full.spans(), half.spans());
    }
}
