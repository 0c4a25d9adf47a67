//! PURE: what the controller's Kubernetes Events say (reason and note), for every step.
//!
//! The warning's note is rendered with `notify::content`'s fields — the values
//! `controller::deliver::fields` fills for Slack and email from the same decision
//! (`gpus`, `idle_since`, `shape`, `hourly_usd`, `action`, `action_at`, `risk`, `kind`,
//! `name`, `namespace`) — so an Event and a message about one decision say the same
//! thing. Events are not templated (`--notify-templates` shapes Slack and email only):
//! their sentences are fixed here (docs/quickstart.md and docs/decision-quality.md quote
//! them).

use crate::api::keys;
use crate::api::policy::ActionType;
use crate::cluster::actions::{ActionError, Outcome};
use crate::cluster::inventory::ObjectInfo;
use crate::engine::inference::Softer;
use crate::notify::Severity;
use crate::notify::content::Fields;

fn field<'a>(fields: &'a Fields, name: &str) -> &'a str {
    fields.get(name).map_or("", String::as_str)
}

/// The `IdleGpus` note: what is idle since when, what gpu-reaper will do when (in Audit
/// mode, would do in Enforce), how to keep it, and the resumption risk when estimated.
pub fn warning(fields: &Fields, softer: &Softer, audit: bool) -> String {
    let what = match softer {
        Softer::Keep { keep, why } => format!(
            "scale it down to {keep} replica(s) instead of zero (request-driven inference: {why})"
        ),
        _ => field(fields, "action").to_string(),
    };
    let note = format!(
        "{} GPU(s) idle since {} ({}, {} USD/h). {} will {what} it from {} unless it is used again or snoozed: kubectl annotate {} {} -n {} {}=<RFC 3339 time>.",
        field(fields, "gpus"),
        field(fields, "idle_since"),
        field(fields, "shape"),
        field(fields, "hourly_usd"),
        if audit {
            "In Enforce mode gpu-reaper"
        } else {
            "gpu-reaper"
        },
        field(fields, "action_at"),
        field(fields, "kind").to_lowercase(),
        field(fields, "name"),
        field(fields, "namespace"),
        keys::SNOOZE_UNTIL
    );
    // The field is the estimate's sentence followed by ". " (empty without one).
    match field(fields, "risk") {
        "" => note,
        risk => format!(
            "{note} Resumption risk: {}",
            risk.strip_suffix(' ').unwrap_or(risk)
        ),
    }
}

/// The `WouldReclaim` note of an Audit-mode policy whose action is due.
pub fn would_act(action: ActionType, softer: &Softer, reason: &str) -> String {
    match softer {
        Softer::Keep { keep, why } if action == ActionType::ScaleToZero => format!(
            "Audit mode: would scale it down to {keep} replica(s) now (request-driven inference: {why}; {reason}); nothing was changed."
        ),
        _ => format!("Audit mode: would {action:?} now ({reason}); nothing was changed."),
    }
}

/// The Event of an action, and the `result` label it counts under.
#[derive(Debug, Clone, PartialEq)]
pub struct Acted {
    /// `done`, `already_done`, `refused`, `unsupported`, `failed`
    /// (`gpu_reaper_actions_total`'s `result`).
    pub result: &'static str,
    pub severity: Severity,
    pub reason: &'static str,
    pub note: String,
}

/// What an action's outcome says; a done action names why and how to restore it.
pub fn acted(outcome: &Result<Outcome, ActionError>, root: &ObjectInfo, why: &str) -> Acted {
    let (result, severity, reason, note) = match outcome {
        Ok(Outcome::Done(s)) => (
            "done",
            Severity::Normal,
            "Reclaimed",
            format!(
                "{s} ({why}); restore with `gpu-reaper wake {}/{}/{}`",
                root.namespace, root.kind, root.name
            ),
        ),
        Ok(Outcome::AlreadyDone(s)) => ("already_done", Severity::Normal, "Reclaimed", s.clone()),
        Ok(Outcome::Refused(s)) => ("refused", Severity::Warning, "ReclaimRefused", s.clone()),
        Ok(Outcome::Unsupported(s)) => (
            "unsupported",
            Severity::Warning,
            "ReclaimUnsupported",
            s.clone(),
        ),
        Err(e) => ("failed", Severity::Warning, "ReclaimFailed", e.to_string()),
    };
    Acted {
        result,
        severity,
        reason,
        note,
    }
}

/// The severity and note of a housekeeping step (wake, finishing a pending scale, an
/// owner's scale-up): the outcome's own sentence.
pub fn housekeeping(outcome: Result<Outcome, ActionError>) -> (Severity, String) {
    match outcome {
        Ok(Outcome::Done(s) | Outcome::AlreadyDone(s)) => (Severity::Normal, s),
        Ok(Outcome::Refused(s) | Outcome::Unsupported(s)) => (Severity::Warning, s),
        Err(e) => (Severity::Warning, e.to_string()),
    }
}

/// The `PreWarmed` note: why the workload was woken before its predicted use (the
/// engine's sentence), then what the wake did; with the result label of
/// `gpu_reaper_actions_total{action="PreWarm"}`.
pub fn pre_warmed(
    why: &str,
    outcome: Result<Outcome, ActionError>,
) -> (&'static str, Severity, String) {
    let result = match &outcome {
        Ok(Outcome::Done(_)) => "done",
        Ok(Outcome::AlreadyDone(_)) => "already_done",
        Ok(Outcome::Refused(_)) => "refused",
        Ok(Outcome::Unsupported(_)) => "unsupported",
        Err(_) => "failed",
    };
    let (severity, what) = housekeeping(outcome);
    let mut why = why.to_string();
    if let Some(first) = why.get(..1) {
        why.replace_range(..1, &first.to_uppercase());
    }
    (result, severity, format!("{why}: {what}"))
}

#[cfg(test)]
#[path = "events_text_tests.rs"]
mod tests;
