//! The Slack interactivity endpoint's outcome counters (prometheus-client), registered by
//! whoever serves `/slack/interactivity` and `/metrics` (the controller's registry, prefix
//! `gpu_reaper_`): `slack_interactions_total{outcome}` and `slack_snoozes_capped_total`
//! (docs/metrics.md). No IO.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// What became of one request to `/slack/interactivity`: the `outcome` label of
/// `gpu_reaper_slack_interactions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// "Keep 4h" applied (snooze written).
    Kept4h,
    /// "Keep 24h" applied (possibly capped by maxSnooze, see the capped counter).
    Kept24h,
    /// "Not mine" passed to the policy's channel.
    NotMine,
    /// Authentic, but nothing for gpu-reaper to do (other payload types, link clicks).
    Ignored,
    /// The policy or the workload the button names no longer exists.
    UnknownWorkload,
    /// Authentic and understood, but not applied (API server or Slack errors, a policy
    /// without a channel or a snooze); the clicker is told why.
    Error,
    /// Missing or wrong signature (401).
    BadSignature,
    /// Timestamp missing or more than 5 minutes from now (401).
    Stale,
    /// A signature already seen (401).
    Replayed,
    /// Authentic but unreadable body (400).
    Malformed,
    /// The signing secret could not be read (500).
    NoSecret,
}

impl Outcome {
    pub const ALL: [Outcome; 11] = [
        Outcome::Kept4h,
        Outcome::Kept24h,
        Outcome::NotMine,
        Outcome::Ignored,
        Outcome::UnknownWorkload,
        Outcome::Error,
        Outcome::BadSignature,
        Outcome::Stale,
        Outcome::Replayed,
        Outcome::Malformed,
        Outcome::NoSecret,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Kept4h => "kept_4h",
            Outcome::Kept24h => "kept_24h",
            Outcome::NotMine => "not_mine",
            Outcome::Ignored => "ignored",
            Outcome::UnknownWorkload => "unknown_workload",
            Outcome::Error => "error",
            Outcome::BadSignature => "bad_signature",
            Outcome::Stale => "stale",
            Outcome::Replayed => "replayed",
            Outcome::Malformed => "malformed",
            Outcome::NoSecret => "no_secret",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The interactivity endpoint's metrics (prometheus-client). Cheap to clone: clones
/// count into the same series.
#[derive(Clone, Debug, Default)]
pub struct InteractionMetrics {
    interactions: Family<OutcomeLabels, Counter>,
    capped: Counter,
}

impl InteractionMetrics {
    /// Registers `slack_interactions_total{outcome}` and `slack_snoozes_capped_total`
    /// (under the registry's prefix, `gpu_reaper_` for the controller's). Every outcome
    /// is present from the start, at 0.
    pub fn register(&self, registry: &mut Registry) {
        for outcome in Outcome::ALL {
            let _ = self.interactions.get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            });
        }
        registry.register(
            "slack_interactions",
            "Requests to /slack/interactivity by outcome (kept_4h, kept_24h, not_mine, ignored, unknown_workload, error, bad_signature, stale, replayed, malformed, no_secret)",
            self.interactions.clone(),
        );
        registry.register(
            "slack_snoozes_capped",
            "Keeps from Slack granted less time than asked (the policy's exemptions.maxSnooze)",
            self.capped.clone(),
        );
    }

    pub(crate) fn record(&self, outcome: Outcome) {
        self.interactions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// How many requests had `outcome` so far.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.interactions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .get()
    }

    pub(crate) fn record_capped(&self) {
        self.capped.inc();
    }

    /// How many Keeps were capped by the policy's maxSnooze.
    pub fn capped(&self) -> u64 {
        self.capped.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_in_the_metrics_text() {
        let metrics = InteractionMetrics::default();
        let mut registry = Registry::with_prefix("gpu_reaper");
        metrics.register(&mut registry);
        metrics.record(Outcome::Kept4h);
        metrics.record(Outcome::Kept4h);
        metrics.record(Outcome::BadSignature);
        metrics.record_capped();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"gpu_reaper_slack_interactions_total{outcome="kept_4h"} 2"#,
            r#"gpu_reaper_slack_interactions_total{outcome="bad_signature"} 1"#,
            r#"gpu_reaper_slack_interactions_total{outcome="unknown_workload"} 0"#,
            "gpu_reaper_slack_snoozes_capped_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert_eq!(metrics.count(Outcome::Kept4h), 2);
    }
}
