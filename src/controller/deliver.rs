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
//! - The warning's Event is a channel of the same record (`event`), with the note it
//!   states: a leader that stops between recording the warning and writing its Event
//!   leaves `event` `sending`, and the next one writes that very note (create-if-absent:
//!   the same sentence is never a second occurrence). [`Delivery::notice`] holds the
//!   action until the warning reached someone on some channel a notice before it.

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
    /// When it reached someone (sent). Records of versions before the Event was a
    /// channel have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    /// The `event` channel: the note the warning's Event states, written again as it was
    /// when the Event is retried. (Earlier versions ignore both fields.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The record's name of the warning's Event.
pub const EVENT: &str = "event";

/// Why a due action waits for its warning ([`Delivery::notice`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The warning reached someone a notice ago or more, or every channel gave up, or
    /// the record predates the Event as a channel: the action may go ahead.
    Given,
    /// No channel delivered the warning yet (e.g. its Event was lost with a leader):
    /// retried first, then a whole notice.
    Undelivered,
    /// First delivered at `at` (later than the warning: a retry), so the notice runs
    /// to `until`.
    Running { at: Timestamp, until: Timestamp },
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

    /// The record of a warning given at `warned_at` whose Event states `note`: the Event
    /// and every personal channel `sending`.
    pub fn warning(warned_at: Timestamp, note: &str, personal: &[Channel]) -> Self {
        let mut d = Self::start(warned_at, personal);
        d.channels.insert(
            EVENT.to_string(),
            ChannelState {
                note: Some(note.to_string()),
                ..ChannelState::default()
            },
        );
        d
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
                entry.at = Some(now);
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

    /// A Slack or email warning reached someone (`warn.requireDelivery`; the Event does
    /// not count).
    pub fn delivered(&self) -> bool {
        self.channels
            .iter()
            .any(|(c, s)| c != EVENT && s.state == SendState::Sent)
    }

    /// Whether the warning this record belongs to has given its notice at `now`: it
    /// reached someone on some channel (its Event included) at least `notice` before
    /// (`action.after − warn.after`, the time the engine leaves between a warning and
    /// its action). A warning delivered late — its Event lost with a leader and written
    /// by the retry, an email sent after an outage — moves the action to a notice after
    /// that delivery, never earlier than the deadline it states. Not held: records of
    /// versions before the Event was a channel, and warnings whose every channel gave
    /// up (attempts spent, nobody to route to): nothing more can tell anyone.
    pub fn notice(&self, notice: SignedDuration, now: Timestamp) -> Notice {
        if !self.channels.contains_key(EVENT) {
            return Notice::Given;
        }
        let sent = self
            .channels
            .values()
            .filter(|s| s.state == SendState::Sent);
        let first = sent.clone().filter_map(|s| s.at).min();
        if sent.clone().any(|s| s.at.is_none()) {
            return Notice::Given;
        }
        match first {
            Some(at) if at + notice <= now => Notice::Given,
            Some(at) => Notice::Running {
                at,
                until: at + notice,
            },
            None => {
                let gave_up = self.channels.values().all(|s| match s.state {
                    SendState::Sending | SendState::Failed => s.attempts >= MAX_ATTEMPTS,
                    SendState::Sent => false,
                    SendState::Unrouted | SendState::Unknown => true,
                });
                if gave_up {
                    Notice::Given
                } else {
                    Notice::Undelivered
                }
            }
        }
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

    #[test]
    fn a_warning_event_lost_with_a_leader_holds_the_action_until_a_notice_after_it_is_written() {
        let warned = t("2026-12-04T16:54:41Z");
        let notice = SignedDuration::from_mins(1);
        let mut d = Delivery::warning(warned, "… scaled to zero at 16:55:41 …", &[Channel::Email]);
        assert_eq!(
            d.channels[EVENT].note.as_deref(),
            Some("… scaled to zero at 16:55:41 …")
        );
        // The leader died after recording the warning: nothing written, nothing sent.
        let due_at = t("2026-12-04T16:56:47Z");
        assert_eq!(d.due(due_at), ["email", "event"]);
        assert_eq!(d.notice(notice, due_at), Notice::Undelivered);
        // The next leader writes the Event and sends the email: a whole notice from there.
        d.record(EVENT, &Ok("Event on ml/Deployment/wave-07".into()), due_at);
        d.record("email", &Ok("ana@example.com".into()), due_at);
        let until = due_at + notice;
        assert_eq!(
            d.notice(notice, due_at + SignedDuration::from_secs(20)),
            Notice::Running { at: due_at, until }
        );
        assert_eq!(d.notice(notice, until), Notice::Given);
        // The Event does not count as a Slack or email delivery (`requireDelivery`).
        let mut event_only = Delivery::warning(warned, "n", &[Channel::Email]);
        event_only.record(EVENT, &Ok("Event".into()), warned);
        assert!(!event_only.delivered());
        // The note survives the annotation, and earlier versions' parsers ignore it.
        let text = d.to_annotation();
        let annotations = BTreeMap::from([(crate::api::keys::NOTIFIED.to_string(), text)]);
        assert_eq!(Delivery::parse(&annotations), Some(d));
    }

    #[test]
    fn a_warning_delivered_on_time_is_not_held_and_old_records_are_never_held() {
        let warned = t("2026-11-29T10:00:00Z");
        let notice = SignedDuration::from_mins(30);
        let mut d = Delivery::warning(warned, "n", &[]);
        d.record(EVENT, &Ok("Event".into()), warned);
        assert_eq!(d.notice(notice, warned + notice), Notice::Given);
        assert_eq!(
            d.notice(notice, warned + SignedDuration::from_mins(29)),
            Notice::Running {
                at: warned,
                until: warned + notice
            }
        );
        // A record written before the Event was a channel: as before, never held.
        let mut old = Delivery::start(warned, &[Channel::Email]);
        assert_eq!(old.notice(notice, warned), Notice::Given);
        old.record("email", &Err(Failure::Retry("down".into())), warned);
        assert_eq!(old.notice(notice, warned), Notice::Given);
    }

    #[test]
    fn a_warning_every_channel_gave_up_on_does_not_hold_the_action_for_ever() {
        let warned = t("2026-11-29T10:00:00Z");
        let notice = SignedDuration::from_mins(30);
        let mut d = Delivery::warning(warned, "n", &[Channel::Slack]);
        d.record("slack", &Err(Failure::Unrouted("no owner".into())), warned);
        let mut at = warned;
        for _ in 0..MAX_ATTEMPTS - 1 {
            d.record(EVENT, &Err(Failure::Retry("forbidden".into())), at);
            at += SignedDuration::from_hours(1);
            assert_eq!(d.notice(notice, at), Notice::Undelivered);
        }
        d.record(EVENT, &Err(Failure::Retry("forbidden".into())), at);
        assert!(d.due(at + SignedDuration::from_hours(2)).is_empty());
        assert_eq!(d.notice(notice, at), Notice::Given);
    }
}
