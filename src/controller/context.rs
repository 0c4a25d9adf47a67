//! What every stage of a cycle shares. The [`Context`] is built once (from the [`Config`]
//! the command's edge types from the flags, or by [`Context::test`] for tests that run the
//! stages in-process): the Kubernetes client,
//! the notifiers, the telemetry source, the clock, the metrics, the leadership flag and
//! the settings. [`Memory`] is what the controller remembers between cycles (in the
//! process only: a new leader starts over, except for the Audit memory it reads back).
//!
//! Nothing here does IO by itself; the stages do, through the client and the notifiers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use jiff::{SignedDuration, Timestamp};
use kube::Client;

use super::caches::Caches;
use super::metrics::Metrics;
use super::plan::AuditMemory;
use super::quota::QuotaKeeper;
use crate::api::GpuPolicy;
use crate::api::policy::Channel;
use crate::cluster::inventory::{ObjectKey, Workload};
use crate::engine::Histories;
use crate::engine::inference::Softer;
use crate::engine::model::Decision;
use crate::gpus::GpuResources;
use crate::notify::content::Templates;
use crate::notify::events::EventNotifier;
use crate::notify::slack::SlackNotifier;
use crate::notify::{Notifier, NotifyConfig};
use crate::telemetry::live::{LiveTelemetry, ReadSettings};
use crate::telemetry::prometheus::{PrometheusConfig, PrometheusSource};
use crate::telemetry::trace::WorkloadLabels;
use crate::{Error, Result};

/// What the stages share, built once.
pub struct Context {
    pub client: Client,
    pub notifiers: Notifiers,
    /// Prometheus: the live reads of every cycle and the start-up backfill.
    pub telemetry: PrometheusSource,
    pub clock: Clock,
    pub metrics: Arc<Metrics>,
    /// Whether this replica holds the Lease, kept current by the renewal task: an action
    /// is only taken while it is true, so a leader that loses the Lease mid-cycle stops.
    pub leading: Arc<AtomicBool>,
    pub settings: Settings,
    /// The watches' stores; None lists everything each cycle (`--once`, tests).
    pub caches: Option<Caches>,
}

/// Where warnings and reports go.
pub struct Notifiers {
    /// Every step: the Kubernetes Event (always on).
    pub always: Vec<Box<dyn Notifier>>,
    /// Slack and email, for the policies that list them in `warn.channels`.
    pub personal: Vec<(Channel, Box<dyn Notifier>)>,
}

/// The time a cycle evaluates at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    Wall,
    /// `--now`: replaying history, tests.
    Fixed(Timestamp),
}

impl Clock {
    pub fn now(self) -> Timestamp {
        match self {
            Clock::Wall => Timestamp::now(),
            Clock::Fixed(t) => t,
        }
    }
}

/// The settings the stages and the loop read, parsed and checked once from the flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Label selector of the GpuPolicies this controller governs (`--policy-selector`).
    pub policy_selector: String,
    pub resources: GpuResources,
    /// How the live telemetry is read (`--prometheus-selector`, `--prometheus-read-lag`).
    pub reads: ReadSettings,
    /// Activity history replayed into a policy's idle spans when it is first evaluated.
    pub history_backfill: SignedDuration,
    /// The DCGM labels naming a sample's pod and namespace (the backfill's read).
    pub history_labels: WorkloadLabels,
    /// Width of the activity trackers' coverage steps, in seconds.
    pub live_step_seconds: i64,
    /// Longest interval billed to namespaces in one evaluation (twice `--interval`).
    pub max_billing_gap: SignedDuration,
    pub templates: Templates,
    pub workload_url: Option<String>,
    pub interval: std::time::Duration,
    /// This replica's name in the Lease and on its Events.
    pub identity: String,
    pub lease_namespace: String,
    pub lease_name: String,
    pub lease_duration: SignedDuration,
    /// `--gpu-quota` and the namespaces never given one.
    pub gpu_quota: bool,
    pub quota_excluded_namespaces: Vec<String>,
}

/// `--prometheus-selector`, checked: empty, or label matchers in braces.
pub fn prometheus_selector(text: &str) -> Result<String> {
    let selector = text.trim().to_string();
    if !selector.is_empty() && (!selector.starts_with('{') || !selector.ends_with('}')) {
        return Err(Error::InvalidArgument {
            flag: "prometheus-selector",
            message: format!(
                "{selector:?} is not a list of label matchers in braces, e.g. {{cluster=\"a\"}}"
            ),
        });
    }
    Ok(selector)
}

impl Settings {
    /// The ConfigMap of the Audit-mode memory: per Lease, so per shard.
    pub fn audit_configmap(&self) -> String {
        format!("{}-audit", self.lease_name)
    }
}

impl Notifiers {
    /// The Event notifier, and Slack and email when their settings configure them.
    pub fn new(
        client: &Client,
        identity: &str,
        notify: &NotifyConfig,
        slack: Option<SlackNotifier>,
    ) -> Result<Self> {
        let mut personal: Vec<(Channel, Box<dyn Notifier>)> = Vec::new();
        if let Some(slack) = slack {
            personal.push((Channel::Slack, Box::new(slack)));
        }
        let email = crate::notify::email::EmailNotifier::from_config(notify).map_err(|e| {
            Error::InvalidArgument {
                flag: "smtp",
                message: e.to_string(),
            }
        })?;
        if let Some(email) = email {
            personal.push((Channel::Email, Box::new(email)));
        }
        Ok(Self {
            always: vec![Box::new(EventNotifier::new(client.clone(), identity))],
            personal,
        })
    }
}

/// The Slack notifier the settings configure (None without a token file).
pub fn slack_notifier(notify: &NotifyConfig) -> Result<Option<SlackNotifier>> {
    SlackNotifier::from_config(notify).map_err(|e| Error::InvalidArgument {
        flag: "slack",
        message: e.to_string(),
    })
}

/// What `gpu-reaper controller` is given: typed and checked once by the command's edge
/// (`commands::controller`) from the flags.
#[derive(Debug, Clone)]
pub struct Config {
    pub settings: Settings,
    pub clock: Clock,
    pub prometheus: PrometheusConfig,
    pub notify: NotifyConfig,
    /// Plain-HTTP address of the admin port (`--listen`).
    pub listen: String,
    /// Evaluate once and exit (`--once`).
    pub once: bool,
}

impl Context {
    /// A context for running the stages in-process from the controller's `config` (a
    /// test builds it from the same flags it passes to `gpu-reaper controller`:
    /// `commands::controller::config_from_flags`). No watches (every cycle lists, as
    /// `--once` does); leading from the start (no Lease is taken).
    pub fn test(client: Client, config: Config) -> Result<Self> {
        let telemetry = PrometheusSource::new(config.prometheus)?;
        let notifiers = Notifiers::new(
            &client,
            &config.settings.identity,
            &config.notify,
            slack_notifier(&config.notify)?,
        )?;
        Ok(Self {
            client,
            notifiers,
            telemetry,
            clock: config.clock,
            metrics: Arc::new(Metrics::default()),
            leading: Arc::new(AtomicBool::new(true)),
            settings: config.settings,
            caches: None,
        })
    }

    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// Records whether this replica leads (the flag the stages read, and the metric).
    pub fn set_leading(&self, leading: bool) -> bool {
        let was = self.leading.swap(leading, Ordering::SeqCst);
        self.metrics.leader.set(i64::from(leading));
        was
    }
}

/// What the controller remembers between cycles.
pub struct Memory {
    /// Every GPU's activity between cycles, read incrementally (`telemetry::live`).
    pub live: LiveTelemetry,
    /// Idle spans per policy, for the resumption-risk estimate (kept in memory: a new
    /// leader starts with what `--history-backfill` reads back, and a risk-gated policy
    /// waits until `maxIdle` where that is not enough).
    pub histories: HashMap<String, Histories<ObjectKey>>,
    /// When the previous evaluation ran (the resolution of the idle spans).
    pub last_evaluation: Option<Timestamp>,
    /// Audit-mode ladder state, saved in its ConfigMap (`audit_memory`).
    pub audit: AuditMemory,
    /// The last NotificationsDelivered outcome per policy (ok, message): re-applied on
    /// every status write, since a server-side apply that leaves it out would drop it.
    pub delivery_outcome: HashMap<String, (bool, String)>,
    /// The GPU ResourceQuotas of the namespaces the budget gate governs (G2).
    pub quotas: QuotaKeeper,
    /// GpuPolicies set aside that were given their Event (`policies::report`).
    pub unreadable_reported: super::policies::Reported,
}

impl Memory {
    /// Nothing remembered yet (the Audit memory is read with `audit_memory::load`).
    pub fn new(ctx: &Context) -> Self {
        let s = &ctx.settings;
        Self {
            live: LiveTelemetry::new(s.live_step_seconds),
            histories: HashMap::new(),
            last_evaluation: None,
            audit: AuditMemory::default(),
            delivery_outcome: HashMap::new(),
            quotas: QuotaKeeper::new(
                &ctx.client,
                &s.identity,
                s.gpu_quota,
                s.quota_excluded_namespaces.iter().cloned(),
            ),
            unreadable_reported: Default::default(),
        }
    }
}

/// One workload the plan judged, with what warn and act need to say and do about it.
pub struct Judged<'a> {
    pub policy: &'a GpuPolicy,
    pub workload: &'a Workload,
    pub decision: &'a Decision,
    pub softer: &'a Softer,
    /// The DCGM model name of its GPUs, or empty.
    pub model: String,
}
