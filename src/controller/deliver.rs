//! PURE: what the controller tells people and the bookkeeping that sends each warning
//! once (docs/notifications.md#delivery).
//!
//! - [`fields`] fills the template fields from a decision;
//! - [`Delivery`] is the `gpureaper.io/notified` annotation: per channel, the state of
//!   the current idle period's warning (`for` = its warned-at time). It is written in the
//!   same patch as `gpureaper.io/warned-at`, before anything is sent (state `sending`),
//!   then updated with each channel's result. A controller that dies between sending and
//!   recording finds `sending` and sends again: delivery is at-least-once with that one
//!   narrow window, and a warning is never lost silently. Failures are retried with
//!   exponential backoff (1 min doubling to 1 h, at most [`MAX_ATTEMPTS`]).

use crate::engine::classify::human;
use crate::engine::inference::Softer;
use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::api::GpuPolicy;
use crate::api::policy::{Channel, PolicyMode};
use crate::cluster::inventory::Workload;
use crate::engine::model::Decision;
use crate::notify::content::{self, Fields, Kind};

/// Attempts per channel and idle period before gpu-reaper gives up (the Event stays).
pub const MAX_ATTEMPTS: u32 = 8;

/// State of one channel's message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ChannelState {
    /// `sending`, `sent`, `failed` or `unrouted`.
    pub state: SendState,
    #[serde(default)]
    pub attempts: u32,
    /// When to retry a failed send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Timestamp>,
    /// Who it went to (sent), or why not (failed, unrouted).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// Where one channel's message stands; written as the lowercase words every version has
/// written.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SendState {
    /// Recorded before sending (left so by a controller that stopped: sent again).
    #[default]
    Sending,
    /// It reached someone.
    Sent,
    /// A send failed; retried after a backoff.
    Failed,
    /// Nobody to send it to (no owner found): not retried.
    Unrouted,
    /// A word this version does not know (a newer controller's): neither due nor sent.
    #[serde(other)]
    Unknown,
}

/// The `gpureaper.io/notified` annotation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Delivery {
    /// The warned-at time of the idle period these messages belong to.
    #[serde(rename = "for")]
    pub for_: Option<Timestamp>,
    #[serde(flatten)]
    pub channels: BTreeMap<String, ChannelState>,
}

/// The annotation's name for a channel.
pub fn channel_name(c: Channel) -> &'static str {
    match c {
        Channel::Event => "event",
        Channel::Slack => "slack",
        Channel::Email => "email",
        Channel::Unknown => "unknown",
    }
}

/// The non-Event channels a policy warns on.
pub fn personal_channels(policy: &GpuPolicy) -> Vec<Channel> {
    let mut out: Vec<Channel> = policy
        .spec
        .warn
        .channels
        .iter()
        .copied()
        .filter(|c| *c != Channel::Event)
        .collect();
    out.dedup();
    out
}

impl Delivery {
    pub fn parse(annotations: &BTreeMap<String, String>) -> Option<Self> {
        serde_json::from_str(annotations.get(crate::api::keys::NOTIFIED)?).ok()
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A fresh record for a warning given at `warned_at`: every channel `sending`.
    pub fn start(warned_at: Timestamp, channels: &[Channel]) -> Self {
        Self {
            for_: Some(warned_at),
            channels: channels
                .iter()
                .map(|c| {
                    (
                        channel_name(*c).to_string(),
                        ChannelState {
                            state: SendState::Sending,
                            ..ChannelState::default()
                        },
                    )
                })
                .collect(),
        }
    }

    /// Channels whose message is due again at `now`: failed with the backoff passed, or
    /// left `sending` by a controller that stopped (at-least-once).
    pub fn due(&self, now: Timestamp) -> Vec<String> {
        self.channels
            .iter()
            .filter(|(_, s)| s.attempts < MAX_ATTEMPTS)
            .filter(|(_, s)| match s.state {
                SendState::Sending => true,
                SendState::Failed => s.next.is_none_or(|t| t <= now),
                SendState::Sent | SendState::Unrouted | SendState::Unknown => false,
            })
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Records one attempt's result.
    pub fn record(
        &mut self,
        channel: &str,
        result: &Result<String, crate::notify::Failure>,
        now: Timestamp,
    ) {
        let entry = self.channels.entry(channel.to_string()).or_default();
        entry.attempts += 1;
        match result {
            Ok(to) => {
                entry.state = SendState::Sent;
                entry.detail = to.clone();
                entry.next = None;
            }
            Err(crate::notify::Failure::Unrouted(why)) => {
                entry.state = SendState::Unrouted;
                entry.detail = why.clone();
                entry.next = None;
            }
            Err(crate::notify::Failure::Retry(why)) => {
                entry.state = SendState::Failed;
                entry.detail = why.chars().take(300).collect();
                let backoff = 60i64 << (entry.attempts.saturating_sub(1)).min(6);
                entry.next = Some(now + SignedDuration::from_secs(backoff.min(3600)));
            }
        }
    }

    /// A Slack or email warning reached someone.
    pub fn delivered(&self) -> bool {
        self.channels.values().any(|s| s.state == SendState::Sent)
    }
}

/// Template fields for a decision about workload `w` under `policy`.
#[allow(clippy::too_many_arguments)]
pub fn fields(
    policy: &GpuPolicy,
    w: &Workload,
    d: &Decision,
    softer: &Softer,
    model: &str,
    action_at: Timestamp,
    now: Timestamp,
    owner: &str,
    url_template: Option<&str>,
) -> Fields {
    let root = &w.root;
    let idle_since = d.verdict.idle_since.unwrap_or(now);
    let idle_seconds = now.as_second() - idle_since.as_second();
    let idle_hours = idle_seconds.max(0) as f64 / 3600.0;
    let action = format!("{:?}", super::plan::effective_action(policy, root));
    let audit = policy.spec.mode == PolicyMode::Audit;
    let snooze_until = now + SignedDuration::from_hours(4);
    let url = url_template
        .map(|t| {
            t.replace("{namespace}", &root.namespace)
                .replace("{kind}", &root.kind)
                .replace("{name}", &root.name)
        })
        .unwrap_or_default();
    let gpus = w.gpus;
    Fields::from([
        ("namespace", root.namespace.clone()),
        ("kind", root.kind.clone()),
        ("name", root.name.clone()),
        (
            "workload",
            format!("{}/{}/{}", root.namespace, root.kind, root.name),
        ),
        ("policy", policy.metadata.name.clone().unwrap_or_default()),
        (
            "gpus",
            if gpus.fract() == 0.0 {
                format!("{gpus:.0}")
            } else {
                format!("{gpus:.2}")
            },
        ),
        (
            "model",
            if model.is_empty() {
                "GPU(s)".to_string()
            } else {
                format!("{model} GPU(s)")
            },
        ),
        ("idle_since", idle_since.to_string()),
        // In whole minutes, as every duration a notification states.
        (
            "idle_for",
            human(SignedDuration::from_mins(idle_seconds.max(0) / 60)),
        ),
        ("shape", d.verdict.classification.as_str().to_string()),
        ("hourly_usd", format!("{:.2}", d.hourly_usd)),
        (
            "risk",
            d.estimate
                .as_ref()
                .map(|e| format!("{}. ", e.sentence()))
                .unwrap_or_default(),
        ),
        ("wasted_usd", format!("{:.2}", d.hourly_usd * idle_hours)),
        (
            "action_verb",
            match softer {
                Softer::Keep { keep, why } => {
                    format!("scale it down to {keep} replica(s) instead of zero, since {why}")
                }
                _ => content::action_verb(&action).to_string(),
            },
        ),
        (
            "action",
            match softer {
                Softer::Keep { .. } => "ScaleToMinimum".to_string(),
                _ => action,
            },
        ),
        ("action_at", action_at.to_string()),
        (
            "mode_note",
            if audit {
                "(Audit mode: nothing will change yet; this is what Enforce mode would do.)"
                    .to_string()
            } else {
                String::new()
            },
        ),
        (
            "snooze_command",
            format!(
                "kubectl annotate {} {} -n {} --overwrite {}={}",
                root.kind.to_lowercase(),
                root.name,
                root.namespace,
                crate::api::keys::SNOOZE_UNTIL,
                snooze_until
            ),
        ),
        (
            "wake_command",
            format!(
                "gpu-reaper wake {}/{}/{}",
                root.namespace, root.kind, root.name
            ),
        ),
        ("owner", owner.to_string()),
        ("url", url),
    ])
}

/// The message kind of a notification reason.
pub fn kind_of(reason: &str) -> Option<Kind> {
    match reason {
        "IdleGpus" => Some(Kind::Warning),
        "Reclaimed" => Some(Kind::Reclaimed),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_states_written_as_strings_by_earlier_versions_still_parse() {
        let text = r#"{"for":"2026-11-02T08:00:00Z","slack":{"state":"sent","attempts":1,"detail":"@alice"},"email":{"state":"failed","attempts":2,"next":"2026-11-02T08:02:00Z"},"event":{"state":"sending"},"teams":{"state":"unrouted","detail":"no owner"},"pager":{"state":"queued"}}"#;
        let d = Delivery::parse(&BTreeMap::from([(
            crate::api::keys::NOTIFIED.to_string(),
            text.to_string(),
        )]))
        .unwrap();
        let state = |c: &str| d.channels[c].state;
        assert_eq!(state("slack"), SendState::Sent);
        assert_eq!(state("email"), SendState::Failed);
        assert_eq!(state("event"), SendState::Sending);
        assert_eq!(state("teams"), SendState::Unrouted);
        assert_eq!(state("pager"), SendState::Unknown);
        assert!(d.delivered());
        let now: Timestamp = "2026-11-02T08:03:00Z".parse().unwrap();
        assert_eq!(d.due(now), ["email", "event"]);
        assert!(
            d.to_annotation()
                .contains(r#""slack":{"state":"sent","attempts":1,"detail":"@alice"}"#)
        );
    }
    use crate::notify::Failure;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_message_fields_say_when_request_driven_inference_keeps_replicas() {
        use crate::engine::model::{Classification, IdleShape, Step, Verdict};
        let policy: GpuPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
            "spec": {"mode": "Enforce", "action": {"type": "ScaleToZero", "inference": {"minReplicas": 1}}},
        }))
        .unwrap();
        let root = crate::cluster::inventory::ObjectInfo::from_value(&serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat", "namespace": "ml"}}))
        .unwrap();
        let w = Workload {
            root,
            pods: Vec::new(),
            gpus: 4.0,
            cron_job: None,
            unwatched_owner: None,
        };
        let now = t("2026-11-29T12:00:00Z");
        let d = Decision {
            verdict: Verdict {
                classification: Classification::Idle(IdleShape::MemoryHeld),
                idle_since: Some(t("2026-11-29T09:00:00Z")),
                gpu_devices: 4,
                gpu_share: 4.0,
                reason: String::new(),
            },
            step: Step::Warn,
            next_step_at: None,
            reason: String::new(),
            hourly_usd: 8.0,
            estimate: None,
        };
        let field = |softer: &Softer, name: &str| {
            fields(&policy, &w, &d, softer, "NVIDIA L4", now, now, "ana", None)[name].clone()
        };
        let keep = Softer::Keep {
            keep: 1,
            why: "its idle spans are short and frequent".into(),
        };
        assert_eq!(field(&keep, "action"), "ScaleToMinimum");
        assert_eq!(
            field(&keep, "action_verb"),
            "scale it down to 1 replica(s) instead of zero, since its idle spans are short and frequent"
        );
        assert_eq!(field(&Softer::No, "action"), "ScaleToZero");
        assert_eq!(field(&Softer::No, "action_verb"), "scale it to zero");
    }

    #[test]
    fn a_warning_is_sent_once_per_channel_and_failures_back_off() {
        let at = t("2026-11-29T10:00:00Z");
        let mut d = Delivery::start(at, &[Channel::Slack, Channel::Email]);
        // Both `sending`: a controller that stopped here sends them again.
        assert_eq!(d.due(at), ["email", "slack"]);
        d.record("slack", &Ok("DM to U0123ABCD".into()), at);
        d.record(
            "email",
            &Err(Failure::Retry("connection refused".into())),
            at,
        );
        assert!(d.delivered());
        assert!(d.due(at).is_empty(), "the email waits for its backoff");
        assert_eq!(d.due(at + SignedDuration::from_secs(60)), ["email"]);
        d.record(
            "email",
            &Err(Failure::Retry("again".into())),
            at + SignedDuration::from_secs(60),
        );
        assert_eq!(
            d.channels["email"].next,
            Some(at + SignedDuration::from_secs(180))
        );
        d.record("email", &Err(Failure::Unrouted("no address".into())), at);
        assert!(
            d.due(at + SignedDuration::from_hours(5)).is_empty(),
            "unrouted is not retried"
        );
        // Round trip through the annotation.
        let annotations =
            BTreeMap::from([(crate::api::keys::NOTIFIED.to_string(), d.to_annotation())]);
        assert_eq!(Delivery::parse(&annotations), Some(d.clone()));
        assert!(
            d.to_annotation()
                .starts_with("{\"for\":\"2026-11-29T10:00:00Z\"")
        );
    }

    #[test]
    fn attempts_are_bounded() {
        let at = t("2026-11-29T10:00:00Z");
        let mut d = Delivery::start(at, &[Channel::Email]);
        for i in 0..MAX_ATTEMPTS {
            assert_eq!(
                d.due(at + SignedDuration::from_hours(i as i64 * 2)).len(),
                1
            );
            d.record(
                "email",
                &Err(Failure::Retry("down".into())),
                at + SignedDuration::from_hours(i as i64 * 2),
            );
        }
        assert!(d.due(at + SignedDuration::from_hours(100)).is_empty());
        assert!(!d.delivered());
    }
}
