//! The per-policy queries of before the incremental reads (`observe`): kept to measure
//! the live path against (examples/live_cycle.rs).

use super::*;

/// What the live cycle needs besides the policy: how often the exporter is scraped (to
/// turn sample counts into coverage), how far back to look for the last activity, and an
/// optional extra selector (e.g. one cluster of a Thanos).
#[derive(Debug, Clone)]
pub struct LiveSettings {
    pub scrape_interval_seconds: i64,
    pub horizon_seconds: i64,
    pub step_seconds: i64,
    pub selector: String,
    /// Override of the workload label names (default: detected per series).
    pub workload_labels: crate::telemetry::trace::WorkloadLabels,
}

/// Observations of every GPU at one instant, keyed by (namespace, pod, GPU id); GPUs with
/// no workload have empty namespace and pod. `pod` indexes are left 0 for the caller.
pub type Observations =
    std::collections::BTreeMap<(String, String, String), crate::engine::GpuObservation>;

impl PrometheusSource {
    /// Observes every GPU at `now` with a fixed number of queries (11 per policy; see
    /// [`crate::telemetry::promql`]), whatever the number of GPUs.
    pub async fn observe(
        &self,
        rules: &crate::engine::Rules,
        live: &LiveSettings,
        now: i64,
    ) -> Result<Observations, PrometheusError> {
        use crate::api::policy::Signal;
        use crate::telemetry::promql::{ACTIVITY_SIGNALS, QueryShape, activity_queries, latest};
        let window = rules.window.as_secs();
        let min_samples = ((rules.min_coverage * window as f64)
            / live.scrape_interval_seconds.max(1) as f64)
            .ceil() as u32;
        let mut out = Observations::new();
        let signals: Vec<(&str, f64)> = match rules.signal {
            Signal::Auto | Signal::Unknown => ACTIVITY_SIGNALS.to_vec(),
            Signal::EngineActive => vec![ACTIVITY_SIGNALS[0]],
            Signal::GpuUtil => vec![ACTIVITY_SIGNALS[1]],
        };
        // GPUs already described by an earlier (preferred) family keep it.
        let mut described: std::collections::BTreeSet<(String, String, String)> =
            Default::default();
        for (family, scale) in signals {
            let shape = QueryShape {
                threshold: rules.threshold,
                window,
                horizon: live.horizon_seconds,
                step: live.step_seconds,
                min_samples,
            };
            let q = activity_queries(family, scale, &live.selector, &shape);
            let counts = self
                .vector(&q.samples_in_window, now, &live.workload_labels)
                .await?;
            let busy = self
                .vector(&q.last_busy, now, &live.workload_labels)
                .await?;
            let blind = self
                .vector(&q.last_blind, now, &live.workload_labels)
                .await?;
            let first = self
                .vector(&q.first_sample, now, &live.workload_labels)
                .await?;
            let mut this_family = std::collections::BTreeSet::new();
            for (key, (identity, _)) in counts.iter().chain(first.iter()) {
                if described.contains(key) {
                    continue;
                }
                this_family.insert(key.clone());
                let obs = out
                    .entry(key.clone())
                    .or_insert_with(|| crate::engine::GpuObservation {
                        id: identity.id.clone(),
                        model: identity.model.clone(),
                        share: identity.share,
                        ..Default::default()
                    });
                let count = counts.get(key).map_or(0.0, |(_, v)| *v);
                obs.coverage =
                    (count * live.scrape_interval_seconds as f64 / window.max(1) as f64).min(1.0);
                obs.last_busy_at = busy.get(key).and_then(|(_, v)| ts(*v));
                obs.first_sample_at = first.get(key).and_then(|(_, v)| ts(*v));
                // The current window counts too: with too few samples now, it is blind now.
                let blind_now = (count as u32) < min_samples.max(1);
                obs.blind_until = if blind_now {
                    ts(now as f64)
                } else {
                    blind.get(key).and_then(|(_, v)| ts(*v))
                };
            }
            described.extend(this_family);
        }
        for (family, field) in [
            ("DCGM_FI_DEV_FB_USED", 0),
            ("DCGM_FI_PROF_PCIE_RX_BYTES", 1),
            ("DCGM_FI_DEV_POWER_USAGE", 2),
        ] {
            for (key, (_, value)) in self
                .vector(
                    &latest(family, &live.selector, window),
                    now,
                    &live.workload_labels,
                )
                .await?
            {
                if let Some(obs) = out.get_mut(&key) {
                    match field {
                        0 => obs.fb_used_mib = Some(value),
                        1 => obs.pcie_rx_bytes_per_second = Some(value),
                        _ => obs.power_watts = Some(value),
                    }
                }
            }
        }
        Ok(out)
    }

    /// An instant vector keyed by GPU.
    async fn vector(
        &self,
        query: &str,
        at: i64,
        names: &crate::telemetry::trace::WorkloadLabels,
    ) -> Result<GpuVector, PrometheusError> {
        let fail = |message: String| PrometheusError {
            url: self.config.url.clone(),
            query: query.to_string(),
            message,
        };
        // The answer's errors (retried when transient) come first; a vector without GPU
        // identities is not retried.
        self.instant_with(query, at, |status, body| parse_vector(status, body, names))
            .await?
            .map_err(fail)
    }
}

fn ts(seconds: f64) -> Option<jiff::Timestamp> {
    seconds
        .is_finite()
        .then(|| jiff::Timestamp::from_second(seconds.floor() as i64).ok())
        .flatten()
}
