//! PromQL for the live evaluation cycle, built by pure functions (unit-tested on their
//! text). One set of queries per policy and signal: the number of queries per cycle grows
//! with policies, never with pods or GPUs — every answer carries every GPU.
//!
//! Only range functions over raw samples are used for coverage (`count_over_time`), and
//! subqueries only re-report real samples' own timestamps, so Prometheus' 5-minute
//! lookback can never turn a gap into data (invariant 1).

use std::fmt::Write as _;

/// The activity metric families, in fallback order, with the factor that brings them to 0–1.
pub const ACTIVITY_SIGNALS: [(&str, f64); 2] = [
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
    ("DCGM_FI_DEV_GPU_UTIL", 0.01),
];

/// What one cycle asks per activity family.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivityQueries {
    /// Samples per GPU in the idle window (coverage = count × scrape interval ÷ window).
    pub samples_in_window: String,
    /// Timestamp of the last sample at or above the threshold within the horizon.
    pub last_busy: String,
    /// Last evaluation step within the horizon whose window had too few samples, or a
    /// sample that is not an activity value (NaN from a broken exporter field, or
    /// negative): such a window is blind, never evidence of idleness.
    pub last_blind: String,
    /// Timestamp of the first sample within the horizon.
    pub first_sample: String,
}

/// Seconds as a PromQL duration.
fn secs(s: i64) -> String {
    format!("{}s", s.max(1))
}

/// `{k="v",…}` matchers, values escaped; empty when there are none.
pub fn matchers(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let mut out = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{k}=\"{}\"",
            v.replace('\\', "\\\\").replace('"', "\\\"")
        );
    }
    out.push('}');
    out
}

/// The shape of one cycle's queries under a policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryShape {
    /// Busy at or above this, on the 0–1 scale.
    pub threshold: f64,
    /// The idle window, seconds.
    pub window: i64,
    /// How far back the last activity is looked for, seconds.
    pub horizon: i64,
    /// Evaluation resolution, seconds.
    pub step: i64,
    /// Fewest samples a window may have to count as observed.
    pub min_samples: u32,
}

/// The queries for one activity family (`scale` brings it to 0–1).
pub fn activity_queries(
    family: &str,
    scale: f64,
    selector: &str,
    shape: &QueryShape,
) -> ActivityQueries {
    let QueryShape {
        threshold,
        window,
        horizon,
        step,
        min_samples,
    } = *shape;
    let series = format!("{family}{selector}");
    let raw_threshold = threshold / scale;
    ActivityQueries {
        samples_in_window: format!("count_over_time({series}[{}])", secs(window)),
        last_busy: format!(
            "max_over_time(timestamp({series} >= {raw_threshold})[{}:{}])",
            secs(horizon),
            secs(step)
        ),
        // `min_over_time` < 0: a negative sample; a NaN sample makes the window's sum NaN,
        // and NaN is the only value unequal to itself.
        last_blind: format!(
            "max_over_time(timestamp(count_over_time({series}[{w}]) < {min_samples} or min_over_time({series}[{w}]) < 0 or sum_over_time({series}[{w}]) != sum_over_time({series}[{w}]))[{}:{}])",
            secs(horizon),
            secs(step),
            w = secs(window),
        ),
        first_sample: format!(
            "min_over_time(timestamp({series})[{}:{}])",
            secs(horizon),
            secs(step)
        ),
    }
}

/// Latest value of a gauge family (memory held, PCIe receive, power), within the window.
pub fn latest(family: &str, selector: &str, window: i64) -> String {
    format!("last_over_time({family}{selector}[{}])", secs(window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_queries_scale_the_threshold_and_never_fill_gaps() {
        let shape = QueryShape {
            threshold: 0.05,
            window: 1800,
            horizon: 7200,
            step: 60,
            min_samples: 24,
        };
        let q = activity_queries("DCGM_FI_DEV_GPU_UTIL", 0.01, "", &shape);
        assert_eq!(
            q.samples_in_window,
            "count_over_time(DCGM_FI_DEV_GPU_UTIL[1800s])"
        );
        assert_eq!(
            q.last_busy,
            "max_over_time(timestamp(DCGM_FI_DEV_GPU_UTIL >= 5)[7200s:60s])"
        );
        assert_eq!(
            q.last_blind,
            "max_over_time(timestamp(count_over_time(DCGM_FI_DEV_GPU_UTIL[1800s]) < 24 or min_over_time(DCGM_FI_DEV_GPU_UTIL[1800s]) < 0 or sum_over_time(DCGM_FI_DEV_GPU_UTIL[1800s]) != sum_over_time(DCGM_FI_DEV_GPU_UTIL[1800s]))[7200s:60s])"
        );
        assert_eq!(
            q.first_sample,
            "min_over_time(timestamp(DCGM_FI_DEV_GPU_UTIL)[7200s:60s])"
        );
    }

    #[test]
    fn selectors_are_escaped() {
        let sel = matchers(&[("Hostname", "gpu-\"a\"")]);
        assert_eq!(sel, r#"{Hostname="gpu-\"a\""}"#);
        assert_eq!(
            latest("DCGM_FI_DEV_FB_USED", &sel, 1800),
            r#"last_over_time(DCGM_FI_DEV_FB_USED{Hostname="gpu-\"a\""}[1800s])"#
        );
        assert_eq!(matchers(&[]), "");
    }
}
