//! The webhook's Prometheus metrics (prefix `gpu_reaper_`), documented in docs/metrics.md.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::model::{Reason, Verdict};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub verdict: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Every metric the webhook exports.
pub struct Metrics {
    registry: Registry,
    pub decisions: Family<DecisionLabels, Counter>,
    pub duration: Histogram,
    pub malformed: Counter,
    pub not_ready: Counter,
    pub cached: Family<ResourceLabels, Gauge>,
    pub watch_errors: Family<ResourceLabels, Counter>,
    pub unreadable: Family<ResourceLabels, Counter>,
    pub skipped: Family<ResourceLabels, Gauge>,
    pub tls_reloads: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_reaper");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "admission_decisions",
            "Budget-gate decisions by verdict (allow, warn, deny) and reason",
            decisions.clone(),
        );
        // 50 µs … ~0.8 s.
        let duration = Histogram::new(exponential_buckets(0.00005, 2.0, 15));
        registry.register(
            "admission_duration_seconds",
            "Time to decide one AdmissionReview, from body received to response built",
            duration.clone(),
        );
        let malformed = Counter::default();
        registry.register(
            "admission_malformed_requests",
            "Bodies that were not an admission.k8s.io/v1 AdmissionReview (refused when their uid can be read, else answered 400)",
            malformed.clone(),
        );
        let not_ready = Counter::default();
        registry.register(
            "admission_not_ready_requests",
            "Reviews answered 503 because the caches were not synced yet",
            not_ready.clone(),
        );
        let cached = Family::<ResourceLabels, Gauge>::default();
        registry.register(
            "admission_cached_objects",
            "Objects in the webhook's caches by resource",
            cached.clone(),
        );
        let watch_errors = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "admission_watch_errors",
            "Errors of the watches that feed the caches, by resource",
            watch_errors.clone(),
        );
        let unreadable = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "admission_unreadable_objects",
            "Cached objects the budget gate could not read and skipped (each skip of a version), by resource",
            unreadable.clone(),
        );
        let skipped = Family::<ResourceLabels, Gauge>::default();
        registry.register(
            "admission_skipped_objects",
            "Objects skipped as unreadable in the current snapshot, by resource",
            skipped.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "admission_tls_reloads",
            "Serving certificate reloads by result (ok, error)",
            tls_reloads.clone(),
        );
        Self {
            registry,
            decisions,
            duration,
            malformed,
            not_ready,
            cached,
            watch_errors,
            unreadable,
            skipped,
            tls_reloads,
        }
    }

    /// Counts one decision.
    pub fn decided(&self, verdict: Verdict, reason: Reason, seconds: f64) {
        self.decisions
            .get_or_create(&DecisionLabels {
                verdict: verdict.as_str(),
                reason: reason.as_str(),
            })
            .inc();
        self.duration.observe(seconds);
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        crate::admin::encode(&self.registry)
    }
}
