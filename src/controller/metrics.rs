//! The controller's Prometheus metrics (prefix `gpu_reaper_`), documented in
//! docs/metrics.md; served on `/metrics` by [`crate::admin`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabels {
    pub channel: String,
    pub result: &'static str,
}

/// The kind of an object the controller reads, e.g. `GpuPolicy`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
    pub result: &'static str,
}

/// The controller's metrics.
pub struct Metrics {
    registry: Registry,
    pub governed_gpus: Family<PolicyLabels, Gauge>,
    pub idle_workloads: Family<PolicyLabels, Gauge>,
    pub actions: Family<ActionLabels, Counter>,
    pub telemetry_errors: Family<PolicyLabels, Counter>,
    pub notifications: Family<NotifyLabels, Counter>,
    pub cycle: Histogram,
    pub leader: Gauge,
    /// Objects set aside because this gpu-reaper cannot use them, by kind (now).
    pub unreadable_objects: Family<KindLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(&crate::notify::interact::InteractionMetrics::default())
    }
}

impl Metrics {
    /// The controller's metrics, with the Slack interaction outcomes `interactions` counts
    /// (the `/slack/interactivity` endpoint is served beside them).
    pub fn new(interactions: &crate::notify::interact::InteractionMetrics) -> Self {
        let mut registry = Registry::with_prefix("gpu_reaper");
        interactions.register(&mut registry);
        let governed_gpus = Family::default();
        registry.register(
            "governed_gpus",
            "GPUs held by workloads a policy governs",
            Clone::clone(&governed_gpus),
        );
        let idle_workloads = Family::default();
        registry.register(
            "idle_workloads",
            "Governed workloads classified idle",
            Clone::clone(&idle_workloads),
        );
        let actions = Family::default();
        registry.register(
            "actions",
            "Actions by kind and result (done, would_act, refused, failed)",
            Clone::clone(&actions),
        );
        let telemetry_errors = Family::default();
        registry.register(
            "telemetry_errors",
            "Evaluations skipped because Prometheus failed",
            Clone::clone(&telemetry_errors),
        );
        let notifications = Family::default();
        registry.register(
            "notifications",
            "Slack and email messages by channel and result (sent, failed, unrouted)",
            Clone::clone(&notifications),
        );
        let cycle = Histogram::new(exponential_buckets(0.01, 2.0, 12));
        registry.register(
            "evaluation_duration_seconds",
            "Time of one evaluation cycle",
            cycle.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the Lease",
            leader.clone(),
        );
        let unreadable_objects = Family::default();
        registry.register(
            "unreadable_objects",
            "Objects the controller cannot use (a field that does not fit, a value it does not know), by kind; each is skipped and the rest go on",
            Clone::clone(&unreadable_objects),
        );
        Self {
            registry,
            governed_gpus,
            idle_workloads,
            actions,
            telemetry_errors,
            notifications,
            cycle,
            leader,
            unreadable_objects,
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        crate::admin::encode(&self.registry)
    }

    /// Counts one action (or held or would-be action) of `action` with `result`.
    pub fn action(&self, action: crate::api::policy::ActionType, result: &'static str) {
        self.actions
            .get_or_create(&ActionLabels {
                action: format!("{action:?}"),
                result,
            })
            .inc();
    }

    /// A pre-warm (`action.preWarm`): counted under `action="PreWarm"`.
    pub fn pre_warm(&self, result: &'static str) {
        self.actions
            .get_or_create(&ActionLabels {
                action: "PreWarm".into(),
                result,
            })
            .inc();
    }
}
