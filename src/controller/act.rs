//! Act (IO): applying the plan's actions through `cluster::actions` (the restore record
//! always first), only while this replica holds the Lease; then what was reclaimed on the
//! workload (for the status' GPU-hours and savings), the metric, the Event, and a
//! best-effort Slack/email notice. In Audit mode a due action is only reported
//! ([`would_act`]).

use jiff::Timestamp;
use serde_json::json;

use super::context::{Context, Judged};
use super::deliver::{self, Delivery};
use super::events_text;
use super::plan::AuditMemory;
use super::warn::{self, Sent};
use crate::api::keys;
use crate::api::policy::ActionType;
use crate::cluster::actions;
use crate::cluster::inventory::ObjectInfo;
use crate::engine::Rules;
use crate::engine::inference::Softer;
use crate::notify::Severity;
use crate::notify::content::Kind;

/// An Audit-mode policy's due action: remembered, counted, reported; nothing changes.
pub async fn would_act(
    ctx: &Context,
    audit_memory: &mut AuditMemory,
    judged: &Judged<'_>,
    action: ActionType,
    now: Timestamp,
) {
    let root = &judged.workload.root;
    audit_memory.would_act_at.insert(root.key(), now);
    ctx.metrics.action(action, "would_act");
    let note = events_text::would_act(action, judged.softer, judged.decision.reason.as_str());
    warn::notify(ctx, root, Severity::Normal, "WouldReclaim", note).await;
}

/// An Enforce-mode policy's due action.
pub async fn act(
    ctx: &Context,
    sent: &mut Sent,
    judged: &Judged<'_>,
    action: ActionType,
    now: Timestamp,
) {
    let (policy, w, d) = (judged.policy, judged.workload, judged.decision);
    let root = &w.root;
    let key = root.key();
    if !ctx.is_leading() {
        tracing::warn!(workload = %key, "lost the Lease during the cycle; not acting (the new leader decides)");
        return;
    }
    if policy.spec.warn.require_delivery
        && !deliver::personal_channels(policy).is_empty()
        && !Delivery::parse(&root.annotations).is_some_and(|d| d.delivered())
    {
        tracing::info!(workload = %key, "warn.requireDelivery: no Slack or email warning delivered yet; not acting");
        ctx.metrics.action(action, "held_for_delivery");
        return;
    }
    if let Some(held) = held_for_notice(policy, root, now) {
        tracing::info!(workload = %key, "{held}; not acting yet");
        ctx.metrics.action(action, "held_for_notice");
        return;
    }
    let (result, reclaimed) = match judged.softer {
        Softer::Keep { keep, .. } if action == ActionType::ScaleToZero => (
            actions::scale_to_minimum(&ctx.client, root, *keep, now).await,
            crate::engine::inference::reclaimed_share(w.pods.len(), *keep),
        ),
        _ => (
            actions::act(&ctx.client, action, root, &w.pods, now).await,
            1.0,
        ),
    };
    if matches!(result, Ok(actions::Outcome::Done(_))) {
        record_reclaimed(ctx, root, w.gpus * reclaimed, d.hourly_usd * reclaimed).await;
    }
    let acted = events_text::acted(&result, root, d.reason.as_str());
    ctx.metrics.action(action, acted.result);
    tracing::info!(workload = %key, action = ?action, result = acted.result, detail = %acted.note, "action");
    let channels = deliver::personal_channels(policy);
    if acted.result == "done" && !channels.is_empty() {
        let rules = Rules::from_spec(&policy.spec);
        let action_at = d.verdict.idle_since.unwrap_or(now) + rules.action_after;
        let mut personal =
            warn::personal_message(ctx, sent, judged, Kind::Reclaimed, action_at, now).await;
        personal.fields.insert("detail", acted.note.clone());
        personal.rendered = ctx
            .settings
            .templates
            .render(Kind::Reclaimed, &personal.fields);
        // Best effort: the reclaim notice is not retried (the Event records it).
        let mut delivery = Delivery::start(now, &channels);
        let due: Vec<String> = delivery.channels.keys().cloned().collect();
        warn::send_personal(ctx, sent, judged, &personal, &due, &mut delivery, now).await;
    }
    warn::notify(ctx, root, acted.severity, acted.reason, acted.note).await;
}

/// Why a due action waits for its warning to give its notice (`deliver::Delivery::notice`),
/// if it does: the warning of this idle period reached nobody yet, or reached someone
/// late (its Event lost with a leader and written by a retry).
fn held_for_notice(
    policy: &crate::api::GpuPolicy,
    root: &ObjectInfo,
    now: Timestamp,
) -> Option<String> {
    let delivery = Delivery::parse(&root.annotations)?;
    let warned: Timestamp = root.annotations.get(keys::WARNED_AT)?.parse().ok()?;
    if delivery.for_ != Some(warned) {
        return None;
    }
    let rules = Rules::from_spec(&policy.spec);
    let notice = rules.notice();
    match delivery.notice(notice, now) {
        deliver::Notice::Given => None,
        deliver::Notice::Undelivered => Some(format!(
            "the warning of {warned} has reached nobody yet (its Event is written again first)"
        )),
        deliver::Notice::Running { at, until } => Some(format!(
            "the warning of {warned} was first delivered at {at}: its notice runs to {until}"
        )),
    }
}

/// Records what the reclaimed workload held, for reclaimed GPU-hours and savings.
async fn record_reclaimed(ctx: &Context, root: &ObjectInfo, gpus: f64, hourly_usd: f64) {
    let held = json!({"gpus": gpus, "hourlyUsd": hourly_usd}).to_string();
    let patch = json!({"metadata": {"annotations": {keys::RECLAIMED: held}}});
    if let Err(e) = actions::merge_patch(
        &ctx.client,
        root,
        &patch,
        "recording what was reclaimed".into(),
    )
    .await
    {
        tracing::warn!(workload = %root.key(), error = %e, "could not record what was reclaimed (status figures only)");
    }
}
