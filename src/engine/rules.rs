//! A GpuPolicy spec resolved once into plain numbers, so the hot path does no parsing.

use std::collections::BTreeMap;

use jiff::SignedDuration;

use crate::api::policy::{ActionType, GpuPolicySpec, MissingTelemetry, PolicyMode, Signal};

/// The policy as the engine uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    pub enforce: bool,
    pub signal: Signal,
    pub threshold: f64,
    pub window: SignedDuration,
    pub startup_grace: SignedDuration,
    pub provisioning_grace: SignedDuration,
    pub treat_missing_as_idle: bool,
    pub min_coverage: f64,
    pub memory_held_mib: f64,
    pub data_starved_pcie: f64,
    pub reap_data_starved: bool,
    /// Resumption-risk gate (None: fixed durations only).
    pub max_resume_risk: Option<f64>,
    pub risk: super::risk::RiskParams,
    /// Ceiling after which the ladder proceeds whatever the risk.
    pub max_idle: Option<SignedDuration>,
    pub warn_after: SignedDuration,
    pub action: ActionType,
    pub action_after: SignedDuration,
    /// `action.inference.minReplicas`: request-driven inference keeps this many replicas.
    pub inference_min_replicas: Option<i32>,
    /// `action.preWarm`: wake a reclaimed workload before its predicted next use.
    pub pre_warm: Option<super::prewarm::PreWarmRules>,
    pub max_per_hour: u32,
    pub max_snooze: SignedDuration,
    pub default_hourly_usd: f64,
    /// Lower-cased, trimmed model name → USD per GPU-hour.
    pub price_by_model: BTreeMap<String, f64>,
}

/// A Kubernetes duration as a signed duration (saturating; negative stays negative).
pub fn dur(d: &kube::core::Duration) -> SignedDuration {
    let std: std::time::Duration = (*d).into();
    let s = SignedDuration::try_from(std).unwrap_or(SignedDuration::MAX);
    if d.is_negative() { -s } else { s }
}

impl Rules {
    /// The notice an owner gets between a warning and its action (invariant 4):
    /// `action.after − warn.after`, never negative.
    pub fn notice(&self) -> jiff::SignedDuration {
        (self.action_after - self.warn_after).max(jiff::SignedDuration::ZERO)
    }

    pub fn from_spec(spec: &GpuPolicySpec) -> Self {
        Self {
            enforce: spec.mode == PolicyMode::Enforce,
            signal: spec.idle.signal,
            threshold: spec.idle.threshold,
            window: dur(&spec.idle.window),
            startup_grace: dur(&spec.idle.startup_grace),
            provisioning_grace: dur(&spec.idle.provisioning_grace),
            treat_missing_as_idle: spec.idle.missing_telemetry == MissingTelemetry::TreatAsIdle,
            min_coverage: spec.idle.min_coverage,
            memory_held_mib: spec.idle.memory_held_mib,
            data_starved_pcie: spec.idle.data_starved_pcie_rx_bytes_per_second,
            reap_data_starved: spec.idle.reap_data_starved,
            max_resume_risk: spec.idle.max_resume_risk,
            risk: super::risk::RiskParams {
                horizon: dur(&spec.idle.resume_horizon),
                lookback: dur(&spec.idle.history),
                min_spans: spec.idle.min_idle_spans,
            },
            max_idle: spec.idle.max_idle.as_ref().map(dur),
            warn_after: dur(&spec.warn.after),
            action: spec.action.type_,
            action_after: dur(&spec.action.after),
            inference_min_replicas: spec.action.inference.as_ref().map(|i| i.min_replicas),
            pre_warm: spec
                .action
                .pre_warm
                .as_ref()
                .map(|p| super::prewarm::PreWarmRules {
                    before: dur(&p.before),
                    min_days: p.min_days,
                }),
            max_per_hour: spec.action.max_per_hour,
            max_snooze: dur(&spec.exemptions.max_snooze),
            default_hourly_usd: spec.cost.default_hourly_usd,
            price_by_model: spec
                .cost
                .by_model
                .iter()
                .map(|(k, v)| (k.trim().to_lowercase(), *v))
                .collect(),
        }
    }

    /// The activity value of one sample under this policy's signal choice (0–1). A NaN or
    /// negative sample is no sample (a gap), never idleness — as in the live queries.
    pub fn activity(
        &self,
        engine_active: Option<f64>,
        gpu_util_percent: Option<f64>,
    ) -> Option<f64> {
        let valid = |v: f64| (v >= 0.0).then_some(v);
        let engine_active = engine_active.map(valid);
        let util = gpu_util_percent.map(|u| valid(u / 100.0));
        // A GPU reporting the preferred family keeps it, valid or not (the live cycle
        // describes a GPU by one family), so a bad engine sample is a gap, not GPU_UTIL.
        match self.signal {
            // Unknown is refused before use; read as Auto, it never invents idleness.
            Signal::Auto | Signal::Unknown => engine_active.or(util).flatten(),
            Signal::EngineActive => engine_active.flatten(),
            Signal::GpuUtil => util.flatten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_or_negative_sample_is_no_sample_never_idleness() {
        let rules = Rules::from_spec(&GpuPolicySpec::default());
        assert_eq!(rules.activity(Some(0.0), None), Some(0.0));
        assert_eq!(rules.activity(Some(f64::NAN), None), None);
        assert_eq!(rules.activity(Some(-0.5), Some(80.0)), None);
        assert_eq!(rules.activity(None, Some(-3.0)), None);
        assert_eq!(rules.activity(None, Some(40.0)), Some(0.4));
    }
}
