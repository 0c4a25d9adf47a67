//! Warn (IO): telling people. The Kubernetes Event on every step ([`notify`]); for a
//! `Warn` step the `gpureaper.io/warned-at` annotation (in Enforce mode; the Audit memory
//! in Audit mode) and, for policies that list them, Slack and email to the owner, with
//! the per-channel delivery state (`controller::deliver`) recorded on the workload and
//! failed messages sent again after their backoff ([`retry`]).
//!
//! What the messages say is rendered elsewhere: the Event's words by `events_text`,
//! Slack's and email's by `notify::content` from `deliver::fields`.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use kube::Api;
use serde_json::json;

use super::context::{Context, Judged};
use super::deliver::{self, Delivery};
use super::events_text;
use super::metrics::NotifyLabels;
use super::plan::AuditMemory;
use crate::api::keys;
use crate::api::policy::PolicyMode;
use crate::cluster::actions;
use crate::cluster::inventory::ObjectInfo;
use crate::engine::Rules;
use crate::notify::content::Kind;
use crate::notify::{Failure, Notification, Personal, Severity};

/// What the warn stage keeps for one cycle.
#[derive(Default)]
pub struct Sent {
    /// Failed or unrouted personal messages, by policy (for its status); a policy with
    /// an entry attempted at least one message this cycle.
    pub problems: HashMap<String, Vec<String>>,
    /// Namespace annotations read this cycle (owner resolution).
    namespace_annotations: HashMap<String, BTreeMap<String, String>>,
}

/// Sends one notification through every always-on notifier (the Event); a failed
/// channel is logged and does not stop the others.
pub async fn notify(
    ctx: &Context,
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
    for notifier in &ctx.notifiers.always {
        if let Err(e) = notifier.notify(&notification).await {
            tracing::warn!(workload = %root.key(), channel = notifier.name(), error = %e, "notification not delivered");
        }
    }
}

/// The deadline a warning states, and its retries again: `action.after` after the idle
/// period began, and never less than the notice (`action.after - warn.after`) after the
/// warning — the engine's own rule for when the action is due once warned
/// (`engine::ladder`). (A retry used the first term alone, so a retried email named
/// another time than the Event when the warning had come late.)
pub fn stated_deadline(idle_since: Timestamp, warned_at: Timestamp, rules: &Rules) -> Timestamp {
    let notice = rules.notice();
    (idle_since + rules.action_after).max(warned_at + notice)
}

/// A `Warn` step: recorded first (a warning that cannot be recorded is not sent and is
/// retried next cycle), then the Event, then Slack and email. In Enforce mode the record
/// (`gpureaper.io/notified`, [`Delivery::warning`]) holds the Event's note and every
/// channel's state, so a warning whose Event or message a stopped leader never wrote is
/// written by the next one ([`retry`]).
pub async fn warn(
    ctx: &Context,
    audit_memory: &mut AuditMemory,
    sent: &mut Sent,
    judged: &Judged<'_>,
    now: Timestamp,
) {
    let (policy, w, d) = (judged.policy, judged.workload, judged.decision);
    let root = &w.root;
    let key = root.key();
    let audit = policy.spec.mode == PolicyMode::Audit;
    let rules = Rules::from_spec(&policy.spec);
    // When the engine says the action is due (maxIdle, for a risk-gated policy that knew
    // nothing until now), else the rule a retry states again.
    let action_at = d
        .next_step_at
        .unwrap_or_else(|| stated_deadline(d.verdict.idle_since.unwrap_or(now), now, &rules));
    let fields = deliver::fields(
        policy,
        w,
        d,
        judged.softer,
        &judged.model,
        action_at,
        now,
        "",
        None,
    );
    let note = events_text::warning(&fields, judged.softer, audit);
    let channels = deliver::personal_channels(policy);
    let mut delivery = Delivery::warning(now, &note, &channels);
    if audit {
        audit_memory.warned_at.insert(key.clone(), now);
    } else {
        // The delivery bookkeeping starts in the same patch as the warning.
        let patch = json!({"metadata": {"annotations": {
            keys::WARNED_AT: now.to_string(),
            keys::NOTIFIED: delivery.to_annotation(),
        }}});
        if let Err(e) =
            actions::merge_patch(&ctx.client, root, &patch, "recording the warning".into()).await
        {
            tracing::warn!(workload = %key, error = %e, "could not record the warning; retried next cycle");
            return;
        }
    }
    let event = send_event(ctx, judged, &note, false).await;
    delivery.record(deliver::EVENT, &event, now);
    let mut owner = None;
    if !channels.is_empty() {
        let personal = personal_message(ctx, sent, judged, Kind::Warning, action_at, now).await;
        let due: Vec<String> = channels
            .iter()
            .map(|c| deliver::channel_name(*c).to_string())
            .collect();
        send_personal(ctx, sent, judged, &personal, &due, &mut delivery, now).await;
        owner = Some(personal.owner.describe());
    }
    if !audit {
        save_delivery(ctx, root, &delivery, owner.as_deref()).await;
    }
}

/// Sends again what this idle period's warning has not delivered: messages that failed
/// (after their backoff) or were left `sending` by a controller that stopped, and its
/// Event when a stopped leader recorded the warning but never wrote it (the same note,
/// created if absent).
pub async fn retry(ctx: &Context, sent: &mut Sent, judged: &Judged<'_>, now: Timestamp) {
    let (policy, w, d) = (judged.policy, judged.workload, judged.decision);
    let root = &w.root;
    let Some(mut delivery) = Delivery::parse(&root.annotations) else {
        return;
    };
    let warned: Option<Timestamp> = root
        .annotations
        .get(keys::WARNED_AT)
        .and_then(|t| t.parse().ok());
    if warned.is_none() || delivery.for_ != warned || root.annotations.contains_key(keys::REAPED_AT)
    {
        return;
    }
    let (event_due, personal_due): (Vec<String>, Vec<String>) = delivery
        .due(now)
        .into_iter()
        .partition(|c| c == deliver::EVENT);
    let event_note = delivery
        .channels
        .get(deliver::EVENT)
        .and_then(|s| s.note.clone());
    if personal_due.is_empty() && (event_due.is_empty() || event_note.is_none()) {
        return;
    }
    if let (false, Some(note)) = (event_due.is_empty(), &event_note) {
        let event = send_event(ctx, judged, note, true).await;
        delivery.record(deliver::EVENT, &event, now);
    }
    let mut owner = None;
    if !personal_due.is_empty() {
        let rules = Rules::from_spec(&policy.spec);
        let action_at = stated_deadline(
            d.verdict.idle_since.unwrap_or(now),
            warned.unwrap_or(now),
            &rules,
        );
        let personal = personal_message(ctx, sent, judged, Kind::Warning, action_at, now).await;
        send_personal(
            ctx,
            sent,
            judged,
            &personal,
            &personal_due,
            &mut delivery,
            now,
        )
        .await;
        owner = Some(personal.owner.describe());
    }
    save_delivery(ctx, root, &delivery, owner.as_deref()).await;
}

/// Writes a warning's Event (every always-on notifier) and says whether it was written:
/// the first time as a new sentence, on a retry ([`crate::notify::Notifier::resend`]) only if absent.
async fn send_event(
    ctx: &Context,
    judged: &Judged<'_>,
    note: &str,
    again: bool,
) -> Result<String, Failure> {
    let root = &judged.workload.root;
    let notification = Notification {
        workload: root.clone(),
        reason: "IdleGpus",
        severity: Severity::Warning,
        message: note.to_string(),
        personal: None,
    };
    let mut out = Ok(format!("Event on {}", root.key()));
    for notifier in &ctx.notifiers.always {
        let result = if again {
            notifier.resend(&notification).await
        } else {
            notifier.notify(&notification).await
        };
        if let Err(e) = result {
            tracing::warn!(workload = %root.key(), channel = notifier.name(), error = %e, "warning Event not written; written by a later cycle");
            out = Err(e);
        }
    }
    // (The policy's NotificationsDelivered condition is about Slack and email: an
    // Event not written is logged and counted here, and written by a later cycle.)
    let label = if out.is_ok() { "sent" } else { "failed" };
    ctx.metrics
        .notifications
        .get_or_create(&NotifyLabels {
            channel: deliver::EVENT.to_string(),
            result: label,
        })
        .inc();
    out
}

/// The Slack/email message for a decision: owner resolved, fields filled, rendered.
pub(super) async fn personal_message(
    ctx: &Context,
    sent: &mut Sent,
    judged: &Judged<'_>,
    kind: Kind,
    action_at: Timestamp,
    now: Timestamp,
) -> Personal {
    let (policy, w) = (judged.policy, judged.workload);
    let ns = w.root.namespace.clone();
    if !sent.namespace_annotations.contains_key(&ns) {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
        let annotations = match api.get_metadata_opt(&ns).await {
            Ok(m) => m.and_then(|m| m.metadata.annotations).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(namespace = %ns, error = %e, "could not read the namespace's owner annotation");
                BTreeMap::new()
            }
        };
        sent.namespace_annotations.insert(ns.clone(), annotations);
    }
    let pods: Vec<&BTreeMap<String, String>> = w.pods.iter().map(|p| &p.meta.annotations).collect();
    let owner = crate::notify::owner::resolve(
        &w.root.annotations,
        &pods,
        &sent.namespace_annotations[&ns],
        policy.spec.warn.default_owner.as_deref(),
    );
    if !owner.invalid.is_empty() {
        tracing::warn!(workload = %w.root.key(), invalid = ?owner.invalid, "gpureaper.io/owner entries that are neither an email nor a Slack member ID");
    }
    let fields = deliver::fields(
        policy,
        w,
        judged.decision,
        judged.softer,
        &judged.model,
        action_at,
        now,
        &owner.describe(),
        ctx.settings.workload_url.as_deref(),
    );
    Personal {
        kind,
        rendered: ctx.settings.templates.render(kind, &fields),
        fields,
        owner,
        policy: policy.metadata.name.clone().unwrap_or_default(),
        slack_channel: policy.spec.warn.slack_channel.clone(),
    }
}

/// Sends `personal` on the `due` channels, recording each result in `delivery`, the
/// metrics and the policy's delivery problems.
pub(super) async fn send_personal(
    ctx: &Context,
    sent: &mut Sent,
    judged: &Judged<'_>,
    personal: &Personal,
    due: &[String],
    delivery: &mut Delivery,
    now: Timestamp,
) {
    let root = &judged.workload.root;
    let policy_name = judged.policy.metadata.name.clone().unwrap_or_default();
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
        let notifier = ctx
            .notifiers
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
        sent.problems.entry(policy_name.clone()).or_default();
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
                sent.problems
                    .entry(policy_name.clone())
                    .or_default()
                    .push(format!("{channel} to {}: {e}", root.key()));
            }
        }
        ctx.metrics
            .notifications
            .get_or_create(&NotifyLabels {
                channel: channel.clone(),
                result: label,
            })
            .inc();
        delivery.record(channel, &result, now);
    }
}

async fn save_delivery(ctx: &Context, root: &ObjectInfo, delivery: &Delivery, owner: Option<&str>) {
    // The owner is kept next to the state: Slack's "Not mine" quotes it.
    let mut annotations = json!({keys::NOTIFIED: delivery.to_annotation()});
    if let Some(owner) = owner {
        annotations[keys::NOTIFIED_OWNER] = json!(owner);
    }
    let patch = json!({"metadata": {"annotations": annotations}});
    if let Err(e) =
        actions::merge_patch(&ctx.client, root, &patch, "recording delivery".into()).await
    {
        tracing::warn!(workload = %root.key(), error = %e, "could not record the delivery state (a message may be sent again)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_warning_and_its_retry_state_the_same_deadline() {
        let spec: crate::api::policy::GpuPolicySpec = serde_json::from_value(serde_json::json!({
            "warn": {"after": "1m"}, "action": {"type": "ScaleToZero", "after": "2m"},
        }))
        .unwrap();
        let rules = Rules::from_spec(&spec);
        let t = |s: &str| -> Timestamp { s.parse().unwrap() };
        let idle = t("2026-12-04T16:53:00Z");
        // On time: action.after after the idle period began.
        assert_eq!(
            stated_deadline(idle, t("2026-12-04T16:54:00Z"), &rules),
            t("2026-12-04T16:55:00Z")
        );
        // Late (its first record failed): the notice from the warning, as the engine acts.
        assert_eq!(
            stated_deadline(idle, t("2026-12-04T16:54:41Z"), &rules),
            t("2026-12-04T16:55:41Z")
        );
    }
}
