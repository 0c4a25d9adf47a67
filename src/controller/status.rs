//! Status: the whole GpuPolicy status computed by a PURE function ([`compute`]) from the
//! previous status, what this evaluation found and the clock, then written with one
//! server-side apply ([`apply`]: status written whole, one field manager, forced).
//!
//! - counts of governed / idle / warned / reclaimed workloads and governed GPUs;
//! - reclaimed GPU-hours and savings, the idle GPU-hours of the last 24 h and the spend
//!   per namespace (the budget gate's), billed for at most `max_billing_gap` per
//!   evaluation;
//! - conditions (constant names, `lastTransitionTime` kept while unchanged): Ready,
//!   Degraded (telemetry), Overlapping (workloads another policy governs),
//!   NotificationsDelivered (policies with Slack or email).

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::deliver;
use super::plan::{self, PolicyPlan, Reclaimed};
use crate::api::GpuPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::conditions::{DEGRADED, READY, condition, set_condition};
use crate::api::policy::{GpuPolicyStatus, WorkloadCounts};
use crate::cluster::inventory::{ObjectKey, Workload};
use crate::engine::model::Step;

/// What one evaluation of a policy found, for its status.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub counts: WorkloadCounts,
    /// Matched workloads another policy governs.
    pub shadowed: Vec<(ObjectKey, String)>,
    pub hourly_by_namespace: BTreeMap<String, f64>,
    pub reclaimed: Reclaimed,
    /// GPUs of the workloads classified idle.
    pub idle_gpus: f64,
}

/// What a cycle knows about a policy.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    Evaluated(Evaluation),
    /// Telemetry failed: nothing it governs was judged (the error, for Degraded).
    TelemetryFailed(String),
}

/// PURE: the figures of one evaluation from its plan (over the observed `workloads`,
/// before anything was acted on) and what its earlier actions reclaimed.
pub fn evaluation(plan: &PolicyPlan, workloads: &[Workload], reclaimed: Reclaimed) -> Evaluation {
    let mut idle_gpus = 0.0;
    let mut counts = WorkloadCounts {
        governed: plan.planned.len() as u32,
        gpus: plan.gpus.round() as u32,
        ..WorkloadCounts::default()
    };
    let mut hourly_by_namespace: BTreeMap<String, f64> = BTreeMap::new();
    for p in &plan.planned {
        let w = &workloads[p.workload];
        let d = &p.decision;
        if d.verdict.classification.is_idle() {
            counts.idle += 1;
            idle_gpus += w.gpus;
        }
        // Warned in this idle period: now, or earlier (the annotation in Enforce mode, the
        // controller's memory in Audit mode — both reach the plan as its ladder).
        let warned_earlier = p
            .warned_at
            .zip(d.verdict.idle_since)
            .is_some_and(|(warned, since)| warned >= since);
        if matches!(d.step, Step::Warn) || warned_earlier {
            counts.warned += 1;
        }
        *hourly_by_namespace
            .entry(w.root.namespace.clone())
            .or_default() += d.hourly_usd;
    }
    Evaluation {
        counts,
        shadowed: plan.shadowed.clone(),
        hourly_by_namespace,
        reclaimed,
        idle_gpus,
    }
}

/// PURE: the NotificationsDelivered outcome (ok, message) of the messages this
/// evaluation sent, from their problems (empty: all delivered).
pub fn delivery_outcome(problems: &[String], now: Timestamp) -> (bool, String) {
    let mut listed: Vec<String> = problems.iter().take(3).cloned().collect();
    if problems.len() > 3 {
        listed.push(format!("and {} more", problems.len() - 3));
    }
    if problems.is_empty() {
        (
            true,
            format!("the Slack and email messages sent at {now} were delivered"),
        )
    } else {
        (
            false,
            format!("not delivered at {now}: {}", listed.join("; ")),
        )
    }
}

/// PURE: the whole status of `policy` after this cycle. `delivery` is the last
/// NotificationsDelivered outcome (this cycle's, or an earlier one's that still stands).
pub fn compute(
    policy: &GpuPolicy,
    found: &Found,
    delivery: Option<&(bool, String)>,
    now: Timestamp,
    max_billing_gap: SignedDuration,
) -> GpuPolicyStatus {
    let mut status: GpuPolicyStatus = policy.status.clone().unwrap_or_default();
    status.observed_generation = policy.metadata.generation;
    if let Found::Evaluated(e) = found {
        let mut counts = e.counts.clone();
        // Reclaimed workloads usually have no pods left: counted from their records.
        counts.reclaimed = e.reclaimed.workloads;
        status.workloads = counts;
        let last = status.last_evaluation_time.as_ref().map(|t| t.0);
        let hours = plan::billable_hours(last, now, max_billing_gap);
        status.reclaimed_gpu_hours += e.reclaimed.gpus * hours;
        status.estimated_savings_usd += e.reclaimed.hourly_usd * hours;
        status.idle_gpu_hours_last24h =
            plan::decay_24h(status.idle_gpu_hours_last24h, e.idle_gpus, hours);
        set_condition(&mut status.conditions, overlapping(&e.shadowed), now);
        status.namespace_spend = plan::accrue_spend(
            &status.namespace_spend,
            last,
            now,
            &e.hourly_by_namespace,
            max_billing_gap,
        );
        status.last_evaluation_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    }
    if let (false, Some((ok, message))) = (deliver::personal_channels(policy).is_empty(), delivery)
    {
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
    let telemetry_error = match found {
        Found::TelemetryFailed(e) => Some(e.clone()),
        Found::Evaluated(_) => None,
    };
    let degraded = telemetry_error.is_some();
    set_condition(
        &mut status.conditions,
        condition(
            DEGRADED,
            degraded,
            if degraded {
                "TelemetryUnavailable"
            } else {
                "AsExpected"
            },
            telemetry_error.unwrap_or_else(|| "telemetry and permissions are in place".into()),
        ),
        now,
    );
    set_condition(
        &mut status.conditions,
        condition(
            READY,
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
    status
}

fn overlapping(shadowed: &[(ObjectKey, String)]) -> Condition {
    let overlapping = !shadowed.is_empty();
    let mut listed: Vec<String> = shadowed
        .iter()
        .take(5)
        .map(|(w, by)| format!("{w} (by {by})"))
        .collect();
    if shadowed.len() > 5 {
        listed.push(format!("and {} more", shadowed.len() - 5));
    }
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
    )
}

/// IO: the status written whole (server-side apply of the status subresource).
pub async fn apply(client: &kube::Client, name: &str, status: &GpuPolicyStatus) {
    let patch = json!({
        "apiVersion": "gpureaper.io/v1alpha1",
        "kind": "GpuPolicy",
        "metadata": {"name": name},
        "status": status,
    });
    // Untyped: the answer is the whole policy, which may be one this gpu-reaper cannot
    // read (a policy set aside gets its Degraded condition here).
    let resource = kube::api::ApiResource::erase::<GpuPolicy>(&());
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    if let Err(e) = api
        .patch_status(
            name,
            &PatchParams::apply(crate::api::keys::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        tracing::warn!(policy = %name, error = %e, "could not write policy status");
    }
}

/// The status stage of one policy: this cycle's delivery outcome remembered in
/// `outcomes` (when it sent or tried to send something; otherwise the last one stands),
/// the status computed, then applied.
pub async fn write(
    ctx: &super::context::Context,
    outcomes: &mut HashMap<String, (bool, String)>,
    policy: &GpuPolicy,
    found: &Found,
    problems: Option<&Vec<String>>,
    now: Timestamp,
) {
    let name = policy.metadata.name.clone().unwrap_or_default();
    if let (Found::Evaluated(_), Some(problems)) = (found, problems) {
        outcomes.insert(name.clone(), delivery_outcome(problems, now));
    }
    let status = compute(
        policy,
        found,
        outcomes.get(&name),
        now,
        ctx.settings.max_billing_gap,
    );
    apply(&ctx.client, &name, &status).await;
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
