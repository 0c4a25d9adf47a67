//! `gpu-reaper controller`: observe (IO) → plan (pure) → act (IO) → status, every
//! `--interval`, by the Lease holder only.
//!
//! Observe lists what the cycle needs (GPU pods, their owners, policies, namespaces) in
//! pages of 500, and reads from Prometheus every GPU's samples since the previous cycle
//! once for all policies (`telemetry::live`: one query per DCGM family, the horizon at
//! start-up). When that read fails every policy is marked Degraded and nothing is acted
//! on (invariant 1); the next read covers the gap.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::json;

use super::deliver::{self, Delivery};
use super::lease::Elector;
use super::plan::{AuditMemory, by_pod};
use crate::api::conditions::{condition, set_condition};
use crate::api::policy::ActionType;
use crate::api::policy::Channel;
use crate::api::policy::{GpuPolicyStatus, PolicyMode, WorkloadCounts};
use crate::api::{GpuPolicy, keys};
use crate::cli::ControllerArgs;
use crate::cluster::actions::{self, Outcome};
use crate::cluster::inventory::{self, ObjectInfo, ObjectKey, Workload};
use crate::cluster::{discovery, snapshot};
use crate::commands::{parse_duration, prometheus_config, workload_labels};
use crate::engine::inference::Softer;
use crate::engine::model::{Decision, Step};
use crate::engine::{Histories, Rules};
use crate::gpus::GpuResources;
use crate::notify::content::{Kind, Templates};
use crate::notify::events::EventNotifier;
use crate::notify::{Failure, Notification, Notifier, Personal, Severity};
use crate::telemetry::live::{LiveTelemetry, ReadSettings};
use crate::telemetry::prometheus::PrometheusSource;
use crate::{Error, Result};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NotifyLabels {
    channel: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
    result: &'static str,
}

/// The controller's metrics (prefix `gpu_reaper_`).
pub struct Metrics {
    registry: Registry,
    governed_gpus: Family<PolicyLabels, Gauge>,
    idle_workloads: Family<PolicyLabels, Gauge>,
    actions: Family<ActionLabels, Counter>,
    telemetry_errors: Family<PolicyLabels, Counter>,
    notifications: Family<NotifyLabels, Counter>,
    cycle: Histogram,
    leader: Gauge,
}

impl Metrics {
    fn new(interactions: &crate::notify::interact::InteractionMetrics) -> Self {
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
        Self {
            registry,
            governed_gpus,
            idle_workloads,
            actions,
            telemetry_errors,
            notifications,
            cycle,
            leader,
        }
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Audit-mode ladder state from its ConfigMap; empty when there is none yet.
async fn load_audit_memory(client: &Client, namespace: &str, name: &str) -> AuditMemory {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(cm)) => cm
            .data
            .and_then(|d| d.get("state.json").map(|t| AuditMemory::from_json(t)))
            .unwrap_or_default(),
        Ok(None) => AuditMemory::default(),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the Audit-mode state; starting empty (warnings may repeat)");
            AuditMemory::default()
        }
    }
}

/// Saves the Audit-mode ladder state (server-side apply; entries older than 7 days go).
async fn save_audit_memory(
    client: &Client,
    namespace: &str,
    name: &str,
    audit: &AuditMemory,
    now: Timestamp,
) {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"state.json": audit.to_json(now, SignedDuration::from_hours(24 * 7))},
    });
    if let Err(e) = api
        .patch(
            name,
            &PatchParams::apply("gpu-reaper").force(),
            &Patch::Apply(&body),
        )
        .await
    {
        tracing::warn!(error = %e, "could not save the Audit-mode state");
    }
}

/// What one evaluation of a policy found, for its status.
struct Evaluation {
    counts: WorkloadCounts,
    /// Matched workloads another policy governs.
    shadowed: Vec<(ObjectKey, String)>,
    hourly_by_namespace: BTreeMap<String, f64>,
    reclaimed: super::plan::Reclaimed,
    /// GPUs of the workloads classified idle.
    idle_gpus: f64,
}

/// What one observation of the cluster found.
struct Observed {
    workloads: Vec<Workload>,
    owners: HashMap<ObjectKey, ObjectInfo>,
    policies: Vec<GpuPolicy>,
    namespaces: HashMap<String, BTreeMap<String, String>>,
}

struct Controller {
    client: Client,
    notifiers: Vec<Box<dyn Notifier>>,
    /// The watches' stores (None with `--once`, which lists).
    caches: Option<super::caches::Caches>,
    source: PrometheusSource,
    /// Every GPU's activity between cycles, read incrementally (`telemetry::live`).
    live: LiveTelemetry,
    /// How it is read (`--prometheus-selector`, `--prometheus-read-lag`).
    reads: ReadSettings,
    /// Activity history replayed into a policy's idle spans when it is first evaluated.
    history_backfill: SignedDuration,
    selector_labels: crate::telemetry::trace::WorkloadLabels,
    /// Label selector of the GpuPolicies this controller governs (`--policy-selector`).
    policy_selector: String,
    resources: GpuResources,
    audit: AuditMemory,
    metrics: Arc<Metrics>,
    /// Longest interval billed to namespaces in one evaluation (twice `--interval`).
    max_billing_gap: SignedDuration,
    /// Whether this replica holds the Lease, kept current by the renewal task: an action
    /// is only taken while it is true, so a leader that loses the Lease mid-cycle stops.
    leading: Arc<AtomicBool>,
    /// Slack and email, for the policies that list them in `warn.channels`.
    personal: Vec<(Channel, Box<dyn Notifier>)>,
    templates: Templates,
    workload_url: Option<String>,
    /// Failed or unrouted personal messages this cycle, by policy (for its status); a
    /// policy with an entry attempted at least one message this cycle.
    delivery_problems: HashMap<String, Vec<String>>,
    /// The last NotificationsDelivered outcome per policy (ok, message): re-applied on
    /// every status write, since a server-side apply that leaves it out would drop it.
    delivery_outcome: HashMap<String, (bool, String)>,
    /// Namespace annotations read this cycle (owner resolution).
    namespace_annotations: HashMap<String, BTreeMap<String, String>>,
    /// Idle spans per policy, for the resumption-risk estimate (kept in memory: a new
    /// leader starts with none, and the fixed durations decide until spans accrue).
    histories: HashMap<String, Histories<crate::cluster::inventory::ObjectKey>>,
    /// When the previous evaluation ran (the resolution of the idle spans).
    last_evaluation: Option<Timestamp>,
    /// The GPU ResourceQuotas of the namespaces the budget gate governs (G2).
    quotas: super::quota::QuotaKeeper,
}

fn kube_err(action: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::Kube {
        action: action.to_string(),
        source,
    }
}

impl Controller {
    /// Observe: GPU pods resolved to root workloads, policies, namespace labels — from the
    /// watches' stores when running, by listing with `--once`.
    async fn observe(&self, now: Timestamp) -> Result<Observed> {
        let (gpu_pods, owners, policies, namespaces) = match &self.caches {
            Some(caches) => caches.read(&self.resources, now),
            None => self.list(now).await?,
        };
        Ok(Observed {
            workloads: inventory::resolve(gpu_pods, &owners),
            owners,
            policies,
            namespaces,
        })
    }

    /// One listing of everything a cycle needs, in pages of 500.
    #[allow(clippy::type_complexity)]
    async fn list(
        &self,
        now: Timestamp,
    ) -> Result<(
        Vec<inventory::PodInfo>,
        HashMap<ObjectKey, ObjectInfo>,
        Vec<GpuPolicy>,
        HashMap<String, BTreeMap<String, String>>,
    )> {
        let c = &self.client;
        let owner_resources = discovery::owner_resources(c, discovery::OWNER_KINDS).await;
        let (gpu_pods, owners) =
            snapshot::gpu_pods_and_owners(c, &self.resources, &owner_resources, now).await?;
        let policies =
            snapshot::list_all_matching(&Api::<GpuPolicy>::all(c.clone()), &self.policy_selector)
                .await
                .map_err(kube_err("listing GpuPolicies"))?;
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(c.clone())
            .list_metadata(&ListParams::default())
            .await
            .map_err(kube_err("listing namespaces"))?
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
            .collect();
        Ok((gpu_pods, owners, policies, namespaces))
    }

    /// Sends one notification through every notifier; a failed channel is logged and
    /// does not stop the others (the Event is always attempted).
    async fn notify(
        &self,
        root: &ObjectInfo,
        severity: Severity,
        reason: &'static str,
        message: String,
    ) {
        let notification = Notification {
            workload: root.clone(),
            reason,
            severity,
            message,
            personal: None,
        };
        for notifier in &self.notifiers {
            if let Err(e) = notifier.notify(&notification).await {
                tracing::warn!(workload = %root.key(), channel = notifier.name(), error = %e, "notification not delivered");
            }
        }
    }

    /// One evaluation of every policy.
    async fn cycle(&mut self, now: Timestamp) -> Result<()> {
        let started = Instant::now();
        self.delivery_problems.clear();
        self.namespace_annotations.clear();
        let Observed {
            workloads,
            owners,
            policies,
            namespaces,
        } = self.observe(now).await?;
        self.housekeeping(&owners, &workloads, now).await;
        self.quotas
            .keep(&self.client, &policies, &namespaces, &self.resources, now)
            .await;
        tracing::info!(
            workloads = workloads.len(),
            gpus = workloads.iter().map(|w| w.gpus).sum::<f64>(),
            policies = policies.len(),
            %now,
            "evaluating"
        );
        let all: Vec<&GpuPolicy> = policies.iter().collect();
        // One read of every GPU's samples since the previous cycle, whatever the number of
        // policies; each policy then takes its observations from memory.
        let rules_of: Vec<Rules> = policies.iter().map(|p| Rules::from_spec(&p.spec)).collect();
        let telemetry = self
            .source
            .refresh(&mut self.live, &rules_of, &self.reads, now.as_second())
            .await;
        if let Ok(read) = &telemetry {
            tracing::debug!(
                queries = read.queries,
                rebuilt = read.rebuilt,
                seconds = read.seconds_read,
                samples = read.samples,
                gpus = self.live.gpus(),
                "telemetry read"
            );
        }
        // The activity history a start-up backfill reads, once for every policy.
        let mut backfill_read = None;
        for (policy, rules) in policies.iter().zip(&rules_of) {
            let name = policy.metadata.name.clone().unwrap_or_default();
            let rules = rules.clone();
            let observations = match &telemetry {
                Ok(_) => self.live.observe(&rules),
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "telemetry failed: nothing this policy governs is judged this cycle");
                    self.metrics
                        .telemetry_errors
                        .get_or_create(&PolicyLabels {
                            policy: name.clone(),
                        })
                        .inc();
                    self.write_status(policy, None, Some(e.to_string()), now)
                        .await;
                    continue;
                }
            };
            let grouped = by_pod(&observations);
            // Idle spans are remembered per policy; a change of its estimate's settings
            // starts them over. A policy evaluated for the first time here (start-up, new
            // leader, new policy) replays recent history first.
            if self
                .histories
                .get(&name)
                .is_none_or(|h| h.params() != rules.risk)
            {
                let mut fresh = Histories::new(rules.risk);
                self.backfill(
                    policy,
                    &rules,
                    &workloads,
                    &mut fresh,
                    &mut backfill_read,
                    now,
                )
                .await;
                self.histories.insert(name.clone(), fresh);
            }
            let history = self.histories.get_mut(&name).expect("inserted above");
            let resolution = self
                .last_evaluation
                .map_or(SignedDuration::from_mins(1), |t| now.duration_since(t))
                .clamp(SignedDuration::from_secs(1), SignedDuration::from_hours(1));
            let acted_without_pods = super::plan::acted_last_hour_without_pods(
                policy,
                &all,
                &owners,
                &workloads,
                &namespaces,
                now,
            );
            let plan = super::plan::plan_with(
                policy,
                &all,
                &workloads,
                &namespaces,
                &grouped,
                &self.audit,
                history,
                resolution,
                now,
                acted_without_pods,
            );
            let mut idle_gpus = 0.0;
            let mut counts = WorkloadCounts {
                governed: plan.planned.len() as u32,
                gpus: plan.gpus.round() as u32,
                ..WorkloadCounts::default()
            };
            for p in &plan.planned {
                let w = &workloads[p.workload];
                let d = &p.decision;
                if d.verdict.classification.is_idle() {
                    counts.idle += 1;
                    idle_gpus += w.gpus;
                }
                tracing::info!(
                    policy = %name,
                    workload = %w.root.key(),
                    gpus = w.gpus,
                    observed_gpus = d.verdict.gpu_devices,
                    classification = d.verdict.classification.as_str(),
                    step = ?d.step,
                    reason = %d.reason,
                    "decision"
                );
                let model = model_of(w, &grouped);
                if policy.spec.mode == PolicyMode::Enforce && d.step != Step::Warn {
                    self.retry_deliveries(policy, w, d, &p.softer, &model, now)
                        .await;
                }
                self.apply(policy, w, d, &p.softer, &model, now).await;
                if matches!(d.step, Step::Warn) || w.root.annotations.contains_key(keys::WARNED_AT)
                {
                    counts.warned += 1;
                }
            }
            let labels = PolicyLabels {
                policy: name.clone(),
            };
            self.metrics
                .governed_gpus
                .get_or_create(&labels)
                .set(plan.gpus.round() as i64);
            self.metrics
                .idle_workloads
                .get_or_create(&labels)
                .set(counts.idle as i64);
            let mut hourly: BTreeMap<String, f64> = BTreeMap::new();
            for p in &plan.planned {
                *hourly
                    .entry(workloads[p.workload].root.namespace.clone())
                    .or_default() += p.decision.hourly_usd;
            }
            let reclaimed = super::plan::reclaimed_holdings(policy, &all, &owners, &namespaces);
            let evaluation = Evaluation {
                counts,
                shadowed: plan.shadowed.clone(),
                hourly_by_namespace: hourly,
                reclaimed,
                idle_gpus,
            };
            self.write_status(policy, Some(evaluation), None, now).await;
        }
        self.last_evaluation = Some(now);
        self.metrics.cycle.observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Replays the last `--history-backfill` of activity into `history`, for policies
    /// that use it; spans older than the policy's `idle.history` are pruned. The activity
    /// is read from Prometheus once per cycle (`read`, shared by every policy backfilled in
    /// it). A failure is logged and the cycles learn on their own: the fixed durations
    /// decide meanwhile.
    async fn backfill(
        &self,
        policy: &GpuPolicy,
        rules: &Rules,
        workloads: &[Workload],
        history: &mut Histories<ObjectKey>,
        read: &mut Option<std::result::Result<crate::telemetry::trace::Trace, String>>,
        now: Timestamp,
    ) {
        let spec = &policy.spec;
        if !spec.uses_idle_history() || self.history_backfill <= SignedDuration::ZERO {
            return;
        }
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        if read.is_none() {
            let options = crate::telemetry::trace::ReadOptions {
                workload_labels: self.selector_labels.clone(),
                step_seconds: 60,
                skip_unknown_metrics: true,
            };
            let from = (now - self.history_backfill).as_second();
            *read = Some(
                self.source
                    .fetch_families(from, now.as_second(), &super::backfill::FAMILIES, &options)
                    .await
                    .map_err(|e| e.to_string()),
            );
        }
        match read.as_ref().expect("read above") {
            Ok(trace) => {
                let added = super::backfill::feed(history, trace, workloads, rules, now);
                tracing::info!(policy = name, from = %(now - self.history_backfill), workloads = added.workloads, spans = added.spans, "idle-span history backfilled from Prometheus");
            }
            Err(e) => {
                tracing::warn!(policy = name, error = %e, "could not backfill the idle-span history; learning it from the cycles");
            }
        }
    }

    /// What is due whatever the telemetry says: `gpureaper.io/wake=true` requests, actions
    /// a previous run started and did not finish (restore record `pending`), and reclaimed
    /// workloads their owner scaled back up by hand (their ladder restarts).
    async fn housekeeping(
        &self,
        owners: &HashMap<ObjectKey, ObjectInfo>,
        workloads: &[Workload],
        now: Timestamp,
    ) {
        // Only the few roots with a wake request or a pending restore record are sorted:
        // sorting every owner by a freshly built key (four strings per comparison) was
        // 7 % of the cycle CPU at 50,000 pods (perf).
        let mut sorted: Vec<&ObjectInfo> = owners
            .values()
            .filter(|o| {
                !o.deleting
                    && (o.annotations.get(keys::WAKE).map(String::as_str) == Some("true")
                        || actions::RestoreRecord::parse(&o.annotations)
                            .is_some_and(|r| r.state == "pending"))
            })
            .collect();
        sorted.sort_by_cached_key(|o| o.key());
        let mut handled = std::collections::HashSet::new();
        for root in sorted {
            if root.deleting {
                continue;
            }
            let (reason, result) =
                if root.annotations.get(keys::WAKE).map(String::as_str) == Some("true") {
                    ("Woken", actions::wake(&self.client, root, now).await)
                } else if actions::RestoreRecord::parse(&root.annotations)
                    .is_some_and(|r| r.state == "pending")
                {
                    (
                        "Reclaimed",
                        actions::scale_to_zero(&self.client, root, now).await,
                    )
                } else {
                    continue;
                };
            handled.insert(root.key());
            self.report(root, reason, result).await;
        }
        for w in workloads {
            if handled.contains(&w.root.key()) {
                continue;
            }
            let record = actions::RestoreRecord::parse(&w.root.annotations);
            // Replicas a scale to a minimum left serving are not the owner's doing.
            let kept = record.as_ref().and_then(|r| r.kept).unwrap_or(0);
            let scaled_back = record.is_some_and(|r| r.state == "done" && r.replicas.is_some())
                && w.pods.iter().filter(|p| !p.meta.deleting).count() > kept.max(0) as usize;
            if !scaled_back || w.root.deleting {
                continue;
            }
            // Pods can outlive the scale to 0 for a moment: the replica count decides.
            let replicas = actions::api_for(&self.client, &w.root)
                .get_scale(&w.root.name)
                .await
                .ok()
                .and_then(|s| s.spec?.replicas);
            if replicas.is_some_and(|r| r > kept) {
                let result = actions::forget(&self.client, &w.root, now).await;
                self.report(&w.root, "RestoredByOwner", result).await;
            }
        }
    }

    async fn report(
        &self,
        root: &ObjectInfo,
        reason: &'static str,
        result: std::result::Result<Outcome, actions::ActionError>,
    ) {
        let (type_, note) = match result {
            Ok(Outcome::Done(s) | Outcome::AlreadyDone(s)) => (Severity::Normal, s),
            Ok(Outcome::Refused(s) | Outcome::Unsupported(s)) => (Severity::Warning, s),
            Err(e) => (Severity::Warning, e.to_string()),
        };
        tracing::info!(workload = %root.key(), reason, detail = %note, "housekeeping");
        self.notify(root, type_, reason, note).await;
    }

    async fn apply(
        &mut self,
        policy: &GpuPolicy,
        w: &Workload,
        d: &Decision,
        softer: &Softer,
        model: &str,
        now: Timestamp,
    ) {
        let root = &w.root;
        let key = root.key();
        let audit = policy.spec.mode == PolicyMode::Audit;
        let reason = d.reason.as_str();
        match d.step {
            Step::Nothing | Step::RateLimited(_) => {}
            Step::Warn => {
                let rules = Rules::from_spec(&policy.spec);
                let idle_since = d.verdict.idle_since.unwrap_or(now);
                // When the engine says the action is due (maxIdle, for a risk-gated policy
                // that knew nothing until now), not merely action.after.
                let action_at = d.next_step_at.unwrap_or(idle_since + rules.action_after);
                let what = match softer {
                    Softer::Keep { keep, why } => format!(
                        "scale it down to {keep} replica(s) instead of zero (request-driven inference: {why})"
                    ),
                    _ => format!("{:?}", super::plan::effective_action(policy, root)),
                };
                let note = format!(
                    "{} GPU(s) idle since {idle_since} ({}, {:.2} USD/h). {} will {what} it from {} unless it is used again or snoozed: kubectl annotate {} {} -n {} {}=<RFC 3339 time>.",
                    inventory_gpus(w),
                    d.verdict.classification.as_str(),
                    d.hourly_usd,
                    if audit {
                        "In Enforce mode gpu-reaper"
                    } else {
                        "gpu-reaper"
                    },
                    action_at,
                    root.kind.to_lowercase(),
                    root.name,
                    root.namespace,
                    keys::SNOOZE_UNTIL
                );
                let note = match &d.estimate {
                    Some(e) => format!("{note} Resumption risk: {}.", e.sentence()),
                    None => note,
                };
                let channels = deliver::personal_channels(policy);
                if audit {
                    self.audit.warned_at.insert(key.clone(), now);
                } else {
                    // The Slack/email bookkeeping starts in the same patch as the warning.
                    let mut annotations = json!({keys::WARNED_AT: now.to_string()});
                    if !channels.is_empty() {
                        annotations[keys::NOTIFIED] =
                            json!(Delivery::start(now, &channels).to_annotation());
                    }
                    let patch = json!({"metadata": {"annotations": annotations}});
                    if let Err(e) = actions::merge_patch(
                        &self.client,
                        root,
                        &patch,
                        "recording the warning".into(),
                    )
                    .await
                    {
                        tracing::warn!(workload = %key, error = %e, "could not record the warning; retried next cycle");
                        return;
                    }
                }
                self.notify(root, Severity::Warning, "IdleGpus", note).await;
                if !channels.is_empty() {
                    let personal = self
                        .personal_message(
                            policy,
                            w,
                            d,
                            softer,
                            model,
                            Kind::Warning,
                            action_at,
                            now,
                        )
                        .await;
                    let mut delivery = Delivery::start(now, &channels);
                    let due: Vec<String> = delivery.channels.keys().cloned().collect();
                    self.send_personal(policy, root, &personal, &due, &mut delivery, now)
                        .await;
                    if !audit {
                        self.save_delivery(root, &delivery, &personal.owner.describe())
                            .await;
                    }
                }
            }
            Step::WouldAct(action) => {
                self.audit.would_act_at.insert(key.clone(), now);
                self.metrics
                    .actions
                    .get_or_create(&ActionLabels {
                        action: format!("{action:?}"),
                        result: "would_act",
                    })
                    .inc();
                self.notify(
                    root,
                    Severity::Normal,
                    "WouldReclaim",
                    match softer {
                        Softer::Keep { keep, why } if action == ActionType::ScaleToZero => format!(
                            "Audit mode: would scale it down to {keep} replica(s) now (request-driven inference: {why}; {reason}); nothing was changed."
                        ),
                        _ => format!("Audit mode: would {action:?} now ({reason}); nothing was changed."),
                    },
                )
                .await;
            }
            Step::Act(action) => {
                if !self.leading.load(Ordering::SeqCst) {
                    tracing::warn!(workload = %key, "lost the Lease during the cycle; not acting (the new leader decides)");
                    return;
                }
                if policy.spec.warn.require_delivery
                    && !deliver::personal_channels(policy).is_empty()
                    && !Delivery::parse(&root.annotations).is_some_and(|d| d.delivered())
                {
                    tracing::info!(workload = %key, "warn.requireDelivery: no Slack or email warning delivered yet; not acting");
                    self.metrics
                        .actions
                        .get_or_create(&ActionLabels {
                            action: format!("{action:?}"),
                            result: "held_for_delivery",
                        })
                        .inc();
                    return;
                }
                let (result, reclaimed) = match softer {
                    Softer::Keep { keep, .. } if action == ActionType::ScaleToZero => {
                        // The kept replicas' GPUs stay in use.
                        let pods = w.pods.len().max(1) as f64;
                        let share = (pods - f64::from(*keep)).max(0.0) / pods;
                        (
                            actions::scale_to_minimum(&self.client, root, *keep, now).await,
                            share,
                        )
                    }
                    _ => (
                        actions::act(&self.client, action, root, &w.pods, now).await,
                        1.0,
                    ),
                };
                let (label, type_, reason_word, note) = match result {
                    Ok(Outcome::Done(s)) => {
                        self.record_reclaimed(root, w.gpus * reclaimed, d.hourly_usd * reclaimed)
                            .await;
                        (
                            "done",
                            Severity::Normal,
                            "Reclaimed",
                            format!(
                                "{s} ({reason}); restore with `gpu-reaper wake {}/{}/{}`",
                                root.namespace, root.kind, root.name
                            ),
                        )
                    }
                    Ok(Outcome::AlreadyDone(s)) => {
                        ("already_done", Severity::Normal, "Reclaimed", s)
                    }
                    Ok(Outcome::Refused(s)) => ("refused", Severity::Warning, "ReclaimRefused", s),
                    Ok(Outcome::Unsupported(s)) => {
                        ("unsupported", Severity::Warning, "ReclaimUnsupported", s)
                    }
                    Err(e) => ("failed", Severity::Warning, "ReclaimFailed", e.to_string()),
                };
                self.metrics
                    .actions
                    .get_or_create(&ActionLabels {
                        action: format!("{action:?}"),
                        result: label,
                    })
                    .inc();
                tracing::info!(workload = %key, action = ?action, result = label, detail = %note, "action");
                let channels = deliver::personal_channels(policy);
                if label == "done" && !channels.is_empty() {
                    let rules = Rules::from_spec(&policy.spec);
                    let action_at = d.verdict.idle_since.unwrap_or(now) + rules.action_after;
                    let mut personal = self
                        .personal_message(
                            policy,
                            w,
                            d,
                            softer,
                            model,
                            Kind::Reclaimed,
                            action_at,
                            now,
                        )
                        .await;
                    personal.fields.insert("detail", note.clone());
                    personal.rendered = self.templates.render(Kind::Reclaimed, &personal.fields);
                    // Best effort: the reclaim notice is not retried (the Event records it).
                    let mut delivery = Delivery::start(now, &channels);
                    let due: Vec<String> = delivery.channels.keys().cloned().collect();
                    self.send_personal(policy, root, &personal, &due, &mut delivery, now)
                        .await;
                }
                self.notify(root, type_, reason_word, note).await;
            }
        }
    }

    /// The Slack/email message for a decision: owner resolved, fields filled, rendered.
    #[allow(clippy::too_many_arguments)]
    async fn personal_message(
        &mut self,
        policy: &GpuPolicy,
        w: &Workload,
        d: &Decision,
        softer: &Softer,
        model: &str,
        kind: Kind,
        action_at: Timestamp,
        now: Timestamp,
    ) -> Personal {
        let ns = w.root.namespace.clone();
        if !self.namespace_annotations.contains_key(&ns) {
            let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
            let annotations = match api.get_metadata_opt(&ns).await {
                Ok(m) => m.and_then(|m| m.metadata.annotations).unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(namespace = %ns, error = %e, "could not read the namespace's owner annotation");
                    BTreeMap::new()
                }
            };
            self.namespace_annotations.insert(ns.clone(), annotations);
        }
        let pods: Vec<&BTreeMap<String, String>> =
            w.pods.iter().map(|p| &p.meta.annotations).collect();
        let owner = crate::notify::owner::resolve(
            &w.root.annotations,
            &pods,
            &self.namespace_annotations[&ns],
            policy.spec.warn.default_owner.as_deref(),
        );
        if !owner.invalid.is_empty() {
            tracing::warn!(workload = %w.root.key(), invalid = ?owner.invalid, "gpureaper.io/owner entries that are neither an email nor a Slack member ID");
        }
        let fields = deliver::fields(
            policy,
            w,
            d,
            softer,
            model,
            action_at,
            now,
            &owner.describe(),
            self.workload_url.as_deref(),
        );
        Personal {
            kind,
            rendered: self.templates.render(kind, &fields),
            fields,
            owner,
            policy: policy.metadata.name.clone().unwrap_or_default(),
            slack_channel: policy.spec.warn.slack_channel.clone(),
        }
    }

    /// Sends `personal` on the `due` channels, recording each result in `delivery`, the
    /// metrics and the policy's delivery problems.
    async fn send_personal(
        &mut self,
        policy: &GpuPolicy,
        root: &ObjectInfo,
        personal: &Personal,
        due: &[String],
        delivery: &mut Delivery,
        now: Timestamp,
    ) {
        let policy_name = policy.metadata.name.clone().unwrap_or_default();
        let notification = Notification {
            workload: root.clone(),
            reason: match personal.kind {
                Kind::Warning => "IdleGpus",
                Kind::Reclaimed => "Reclaimed",
            },
            severity: Severity::Warning,
            message: personal.rendered.text.clone(),
            personal: Some(personal.clone()),
        };
        for channel in due {
            let notifier = self
                .personal
                .iter()
                .find(|(c, _)| deliver::channel_name(*c) == channel)
                .map(|(_, n)| n);
            let result = match notifier {
                Some(n) => n.notify(&notification).await,
                None => Err(Failure::Unrouted(format!(
                    "the policy warns on {channel} but the controller has no {channel} settings (docs/notifications.md)"
                ))),
            };
            self.delivery_problems
                .entry(policy_name.clone())
                .or_default();
            let label = match &result {
                Ok(_) => "sent",
                Err(Failure::Retry(_)) => "failed",
                Err(Failure::Unrouted(_)) => "unrouted",
            };
            match &result {
                Ok(to) => {
                    tracing::info!(workload = %root.key(), channel, to = %to, "notification sent")
                }
                Err(e) => {
                    tracing::warn!(workload = %root.key(), channel, error = %e, "notification not delivered");
                    self.delivery_problems
                        .entry(policy_name.clone())
                        .or_default()
                        .push(format!("{channel} to {}: {e}", root.key()));
                }
            }
            self.metrics
                .notifications
                .get_or_create(&NotifyLabels {
                    channel: channel.clone(),
                    result: label,
                })
                .inc();
            delivery.record(channel, &result, now);
        }
    }

    async fn save_delivery(&self, root: &ObjectInfo, delivery: &Delivery, owner: &str) {
        // The owner is kept next to the state: Slack's "Not mine" quotes it.
        let patch = json!({"metadata": {"annotations": {
            keys::NOTIFIED: delivery.to_annotation(),
            keys::NOTIFIED_OWNER: owner,
        }}});
        if let Err(e) =
            actions::merge_patch(&self.client, root, &patch, "recording delivery".into()).await
        {
            tracing::warn!(workload = %root.key(), error = %e, "could not record the delivery state (a message may be sent again)");
        }
    }

    /// Sends again the warnings of this idle period that failed (after their backoff) or
    /// were left `sending` by a controller that stopped.
    async fn retry_deliveries(
        &mut self,
        policy: &GpuPolicy,
        w: &Workload,
        d: &Decision,
        softer: &Softer,
        model: &str,
        now: Timestamp,
    ) {
        let root = &w.root;
        let Some(mut delivery) = Delivery::parse(&root.annotations) else {
            return;
        };
        let warned: Option<Timestamp> = root
            .annotations
            .get(keys::WARNED_AT)
            .and_then(|t| t.parse().ok());
        if warned.is_none()
            || delivery.for_ != warned
            || root.annotations.contains_key(keys::REAPED_AT)
        {
            return;
        }
        let due = delivery.due(now);
        if due.is_empty() {
            return;
        }
        let rules = Rules::from_spec(&policy.spec);
        let action_at = d.verdict.idle_since.unwrap_or(now) + rules.action_after;
        let personal = self
            .personal_message(policy, w, d, softer, model, Kind::Warning, action_at, now)
            .await;
        self.send_personal(policy, root, &personal, &due, &mut delivery, now)
            .await;
        self.save_delivery(root, &delivery, &personal.owner.describe())
            .await;
    }

    /// Records what the reclaimed workload held, for reclaimed GPU-hours and savings.
    async fn record_reclaimed(&self, root: &ObjectInfo, gpus: f64, hourly_usd: f64) {
        let held = json!({"gpus": gpus, "hourlyUsd": hourly_usd}).to_string();
        let patch = json!({"metadata": {"annotations": {keys::RECLAIMED: held}}});
        if let Err(e) = actions::merge_patch(
            &self.client,
            root,
            &patch,
            "recording what was reclaimed".into(),
        )
        .await
        {
            tracing::warn!(workload = %root.key(), error = %e, "could not record what was reclaimed (status figures only)");
        }
    }

    async fn write_status(
        &mut self,
        policy: &GpuPolicy,
        evaluated: Option<Evaluation>,
        telemetry_error: Option<String>,
        now: Timestamp,
    ) {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let evaluated_ok = evaluated.is_some();
        let mut status: GpuPolicyStatus = policy.status.clone().unwrap_or_default();
        status.observed_generation = policy.metadata.generation;
        if let Some(Evaluation {
            mut counts,
            shadowed,
            hourly_by_namespace: hourly,
            reclaimed,
            idle_gpus,
        }) = evaluated
        {
            // Reclaimed workloads usually have no pods left: counted from their records.
            counts.reclaimed = reclaimed.workloads;
            status.workloads = counts;
            let last = status.last_evaluation_time.as_ref().map(|t| t.0);
            let hours = super::plan::billable_hours(last, now, self.max_billing_gap);
            status.reclaimed_gpu_hours += reclaimed.gpus * hours;
            status.estimated_savings_usd += reclaimed.hourly_usd * hours;
            status.idle_gpu_hours_last24h =
                super::plan::decay_24h(status.idle_gpu_hours_last24h, idle_gpus, hours);
            let overlapping = !shadowed.is_empty();
            let mut listed: Vec<String> = shadowed
                .iter()
                .take(5)
                .map(|(w, by)| format!("{w} (by {by})"))
                .collect();
            if shadowed.len() > 5 {
                listed.push(format!("and {} more", shadowed.len() - 5));
            }
            set_condition(
                &mut status.conditions,
                condition(
                    "Overlapping",
                    overlapping,
                    if overlapping {
                        "GovernedByAnotherPolicy"
                    } else {
                        "NoOverlap"
                    },
                    if overlapping {
                        format!(
                            "{} workloads this policy matches are governed by another policy (higher priority, or the same priority and an earlier name): {}",
                            shadowed.len(),
                            listed.join(", ")
                        )
                    } else {
                        "every workload this policy matches is governed by it".into()
                    },
                ),
                now,
            );
            status.namespace_spend = super::plan::accrue_spend(
                &status.namespace_spend,
                last,
                now,
                &hourly,
                self.max_billing_gap,
            );
            status.last_evaluation_time =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        }
        // Updated when this evaluation sent (or tried to send) something; otherwise the
        // last attempts' outcome stands.
        if let (true, Some(problems)) = (evaluated_ok, self.delivery_problems.get(&name)) {
            let mut listed: Vec<String> = problems.iter().take(3).cloned().collect();
            if problems.len() > 3 {
                listed.push(format!("and {} more", problems.len() - 3));
            }
            let outcome = if problems.is_empty() {
                (
                    true,
                    format!("the Slack and email messages sent at {now} were delivered"),
                )
            } else {
                (
                    false,
                    format!("not delivered at {now}: {}", listed.join("; ")),
                )
            };
            self.delivery_outcome.insert(name.clone(), outcome);
        }
        if let (false, Some((ok, message))) = (
            deliver::personal_channels(policy).is_empty(),
            self.delivery_outcome.get(&name),
        ) {
            set_condition(
                &mut status.conditions,
                condition(
                    "NotificationsDelivered",
                    *ok,
                    if *ok { "Delivered" } else { "DeliveryFailed" },
                    message.clone(),
                ),
                now,
            );
        }
        let degraded = telemetry_error.is_some();
        set_condition(
            &mut status.conditions,
            condition(
                "Degraded",
                degraded,
                if degraded {
                    "TelemetryUnavailable"
                } else {
                    "AsExpected"
                },
                telemetry_error
                    .clone()
                    .unwrap_or_else(|| "telemetry and permissions are in place".into()),
            ),
            now,
        );
        set_condition(
            &mut status.conditions,
            condition(
                "Ready",
                !degraded,
                if degraded {
                    "TelemetryUnavailable"
                } else {
                    "Evaluated"
                },
                format!("last evaluation at {now}"),
            ),
            now,
        );
        let patch = json!({
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "GpuPolicy",
            "metadata": {"name": name},
            "status": status,
        });
        let api: Api<GpuPolicy> = Api::all(self.client.clone());
        if let Err(e) = api
            .patch_status(
                &name,
                &PatchParams::apply("gpu-reaper").force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            tracing::warn!(policy = %name, error = %e, "could not write policy status");
        }
    }
}

/// The DCGM model name of a workload's GPUs (the first observed), or empty.
fn model_of(
    w: &Workload,
    grouped: &HashMap<(&str, &str), Vec<&crate::engine::model::GpuObservation>>,
) -> String {
    w.pods
        .iter()
        .filter_map(|p| grouped.get(&(p.meta.namespace.as_str(), p.meta.name.as_str())))
        .flatten()
        .map(|o| o.model.clone())
        .find(|m| !m.is_empty())
        .unwrap_or_default()
}

fn inventory_gpus(w: &Workload) -> String {
    crate::admission::message::gpu_count(w.gpus)
}

async fn serve_probes(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    extra: Option<Router>,
) {
    #[derive(Clone)]
    struct S(Arc<Metrics>, Arc<AtomicBool>);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(S(_, r)): State<S>| async move {
                if r.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not evaluated yet")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(S(m, _)): State<S>| async move { m.encode().into_response() }),
        )
        .with_state(S(metrics, ready));
    // Slack's interactivity endpoint (/slack/interactivity) when configured.
    let app = match extra {
        Some(extra) => app.merge(extra),
        None => app,
    };
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "probe server stopped");
    }
}

/// The Slack and email notifiers the flags configure (none without their settings).
fn personal_notifiers(
    args: &crate::cli::NotifyArgs,
    slack: Option<crate::notify::slack::SlackNotifier>,
) -> Result<Vec<(Channel, Box<dyn Notifier>)>> {
    let mut out: Vec<(Channel, Box<dyn Notifier>)> = Vec::new();
    if let Some(slack) = slack {
        out.push((Channel::Slack, Box::new(slack)));
    }
    let email = crate::notify::email::EmailNotifier::from_args(args).map_err(|e| {
        Error::InvalidArgument {
            flag: "smtp",
            message: e.to_string(),
        }
    })?;
    if let Some(email) = email {
        out.push((Channel::Email, Box::new(email)));
    }
    Ok(out)
}

/// Runs the controller until SIGTERM (or one cycle with `--once`).
pub fn run(args: &ControllerArgs) -> Result<()> {
    let interval = parse_duration("interval", &args.interval)?.unsigned_abs();
    let scrape = parse_duration("scrape-interval", &args.scrape_interval)?
        .as_secs()
        .max(1);
    let lease_duration = parse_duration("lease-duration", &args.lease_duration)?;
    let history_backfill = parse_duration("history-backfill", &args.history_backfill)?;
    let read_lag = parse_duration("prometheus-read-lag", &args.prometheus_read_lag)?
        .as_secs()
        .max(0);
    let selector = args.prometheus_selector.trim().to_string();
    if !selector.is_empty() && (!selector.starts_with('{') || !selector.ends_with('}')) {
        return Err(Error::InvalidArgument {
            flag: "prometheus-selector",
            message: format!(
                "{selector:?} is not a list of label matchers in braces, e.g. {{cluster=\"a\"}}"
            ),
        });
    }
    let fixed_now = match &args.now {
        Some(t) => Some(t.parse::<Timestamp>().map_err(|e| Error::InvalidArgument {
            flag: "now",
            message: format!("{t:?}: {e}"),
        })?),
        None => None,
    };
    let settings = crate::admission::webhook::settings(&args.gpus)?;
    let templates = match &args.notify.notify_templates {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::InvalidArgument {
                flag: "notify-templates",
                message: format!("{}: {e}", path.display()),
            })?;
            Templates::from_yaml(&text, &path.display().to_string()).map_err(|e| {
                Error::InvalidArgument {
                    flag: "notify-templates",
                    message: e.to_string(),
                }
            })?
        }
        None => Templates::default(),
    };
    let slack = crate::notify::slack::SlackNotifier::from_args(&args.notify).map_err(|e| {
        Error::InvalidArgument {
            flag: "slack",
            message: e.to_string(),
        }
    })?;
    let source = PrometheusSource::new(prometheus_config(&args.prometheus)?)?;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("gpu-reaper-{}", std::process::id()));
    let runtime = crate::commands::multi_thread_runtime()?;
    runtime.block_on(async move {
        let mut config = kube::Config::infer().await.map_err(|e| {
            Error::Controller(format!(
                "no Kubernetes configuration (KUBECONFIG or in-cluster): {e}"
            ))
        })?;
        // A PodDisruptionBudget's 429 must come back at once (retried next cycle), not be
        // retried for minutes inside one eviction.
        config.default_retry = false;
        let client =
            Client::try_from(config).map_err(kube_err("building the Kubernetes client"))?;
        let interactions = crate::notify::interact::InteractionMetrics::default();
        let metrics = Arc::new(Metrics::new(&interactions));
        let ready = Arc::new(AtomicBool::new(false));
        if !args.once {
            let listener = tokio::net::TcpListener::bind(&args.listen)
                .await
                .map_err(|e| Error::InvalidArgument {
                    flag: "listen",
                    message: format!("{}: {e}", args.listen),
                })?;
            let interact = crate::notify::interact::InteractState::from_args(
                &args.notify,
                client.clone(),
                slack.as_ref(),
            )
            .map_err(|e| Error::InvalidArgument {
                flag: "slack-signing-secret-file",
                message: e.to_string(),
            })?
            .map(|state| crate::notify::interact::router(state.with_metrics(interactions)));
            tokio::spawn(serve_probes(listener, metrics.clone(), ready.clone(), interact));
        }
        let personal = personal_notifiers(&args.notify, slack)?;
        let notifiers: Vec<Box<dyn Notifier>> =
            vec![Box::new(EventNotifier::new(client.clone(), &identity))];
        let caches = if args.once {
            None
        } else {
            let caches =
                super::caches::Caches::start(&client, discovery::OWNER_KINDS, &args.policy_selector).await;
            caches.wait_synced().await;
            tracing::info!("watches synced");
            Some(caches)
        };
        let policy_changed = caches.as_ref().map(|c| c.policy_changed.clone());
        let audit_configmap = format!("{}-audit", args.lease_name);
        let mut controller = Controller {
            client: client.clone(),
            notifiers,
            caches,
            source,
            // A step shorter than the scrape interval would leave every other bucket
            // empty: coverage is counted in steps that each hold a sample.
            live: LiveTelemetry::new(scrape.max(60)),
            reads: ReadSettings {
                selector: selector.clone(),
                lag_seconds: read_lag,
                workload_labels: workload_labels(&args.prometheus),
            },
            history_backfill,
            selector_labels: workload_labels(&args.prometheus),
            policy_selector: args.policy_selector.clone(),
            resources: settings.resources,
            audit: load_audit_memory(&client, &args.lease_namespace, &audit_configmap).await,
            metrics: metrics.clone(),
            max_billing_gap: SignedDuration::try_from(interval * 2)
                .unwrap_or(SignedDuration::from_mins(2)),
            leading: Arc::new(AtomicBool::new(false)),
            personal,
            templates,
            workload_url: args.notify.workload_url.clone(),
            delivery_problems: HashMap::new(),
            delivery_outcome: HashMap::new(),
            namespace_annotations: HashMap::new(),
            histories: HashMap::new(),
            last_evaluation: None,
            quotas: super::quota::QuotaKeeper::new(
                &client,
                &identity,
                args.gpu_quota,
                args.quota_excluded_namespaces
                    .iter()
                    .map(|n| n.trim().to_string()),
            ),
        };
        let elector = Arc::new(Elector::new(
            client,
            &args.lease_namespace,
            &args.lease_name,
            &identity,
            lease_duration,
        ));
        if !args.once {
            // The Lease is renewed on its own clock (a third of its duration), not once per
            // evaluation: with --interval longer than --lease-duration, replicas would
            // otherwise take turns leading.
            let (elector, leading, metrics) = (
                elector.clone(),
                controller.leading.clone(),
                metrics.clone(),
            );
            let period = (lease_duration.unsigned_abs() / 3).max(std::time::Duration::from_secs(1));
            // The first attempt before the first evaluation, then on the renewal clock.
            let first = elector.try_lead().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "leader election failed; retrying");
                false
            });
            leading.store(first, Ordering::SeqCst);
            metrics.leader.set(i64::from(first));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    let now_leading = match elector.try_lead().await {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!(error = %e, "leader election failed; not acting until the Lease is renewed");
                            false
                        }
                    };
                    if leading.swap(now_leading, Ordering::SeqCst) != now_leading {
                        tracing::info!(leading = now_leading, "leadership changed");
                    }
                    metrics.leader.set(i64::from(now_leading));
                }
            });
        }
        let mut was_leading = false;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The watches' initial list rang for every policy; the first cycle (the first
        // tick, at once) sees them all anyway. Left stored, that ring started a second,
        // identical cycle right after the first: 11 more queries per policy at start-up.
        if let Some(changed) = &policy_changed {
            let _ = futures::FutureExt::now_or_never(changed.notified());
        }
        loop {
            // Every interval, and as soon as a GpuPolicy changes.
            match &policy_changed {
                Some(changed) => {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = changed.notified() => {
                            // Let an apply of several policies land together.
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        }
                    }
                }
                None => {
                    tick.tick().await;
                }
            }
            let leading = if args.once {
                let l = elector.try_lead().await.map_err(|e| Error::Kube {
                    action: format!(
                        "taking the Lease {}/{}",
                        args.lease_namespace, args.lease_name
                    ),
                    source: e,
                })?;
                controller.leading.store(l, Ordering::SeqCst);
                controller.metrics.leader.set(i64::from(l));
                l
            } else {
                controller.leading.load(Ordering::SeqCst)
            };
            if leading && !was_leading && !args.once {
                // A standby taking over reads what the previous leader recorded in Audit mode.
                controller.audit =
                    load_audit_memory(&controller.client, &args.lease_namespace, &audit_configmap)
                        .await;
            }
            was_leading = leading;
            if leading {
                let now = fixed_now.unwrap_or_else(Timestamp::now);
                let before = controller.audit.clone();
                let result = controller.cycle(now).await;
                if controller.audit != before {
                    save_audit_memory(
                        &controller.client,
                        &args.lease_namespace,
                        &audit_configmap,
                        &controller.audit,
                        now,
                    )
                    .await;
                }
                match result {
                    Ok(()) => ready.store(true, Ordering::Relaxed),
                    Err(e) => {
                        tracing::warn!(error = %e, "evaluation failed");
                        if args.once {
                            return Err(e);
                        }
                    }
                }
            } else {
                // Standbys are ready: they serve metrics and take over when the Lease expires.
                ready.store(true, Ordering::Relaxed);
            }
            if args.once {
                return if leading {
                    Ok(())
                } else {
                    Err(Error::Controller(format!(
                        "not the leader: Lease {}/{} is held by another replica",
                        args.lease_namespace, args.lease_name
                    )))
                };
            }
        }
    })
}
