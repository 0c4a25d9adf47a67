use super::*;
use crate::cluster::inventory::ObjectInfo;
use std::collections::BTreeMap;

fn fields(risk: &str) -> Fields {
    Fields::from([
        ("gpus", "2".to_string()),
        ("idle_since", "2026-11-30T07:02:00Z".to_string()),
        ("shape", "Idle/MemoryHeld".to_string()),
        ("hourly_usd", "8.00".to_string()),
        ("action", "ScaleToZero".to_string()),
        ("action_at", "2026-11-30T09:02:00Z".to_string()),
        ("kind", "Deployment".to_string()),
        ("name", "chat".to_string()),
        ("namespace", "team-a".to_string()),
        ("risk", risk.to_string()),
    ])
}

fn root() -> ObjectInfo {
    ObjectInfo {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        namespace: "team-a".into(),
        name: "chat".into(),
        uid: String::new(),
        owner: None,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        created_at: "2026-11-30T00:00:00Z".parse().unwrap(),
        deleting: false,
    }
}

#[test]
fn an_audit_warning_reads_as_the_quickstart_shows_it() {
    assert_eq!(
        warning(&fields(""), &Softer::No, true),
        "2 GPU(s) idle since 2026-11-30T07:02:00Z (Idle/MemoryHeld, 8.00 USD/h). In Enforce mode gpu-reaper will ScaleToZero it from 2026-11-30T09:02:00Z unless it is used again or snoozed: kubectl annotate deployment chat -n team-a gpureaper.io/snooze-until=<RFC 3339 time>."
    );
}

#[test]
fn an_enforce_warning_says_gpu_reaper_will_and_ends_with_the_resumption_risk() {
    let note = warning(
        &fields("4 % of similar spans resumed within 1h (12 cases). "),
        &Softer::No,
        false,
    );
    assert!(note.starts_with("2 GPU(s) idle since "), "{note}");
    assert!(
        note.contains(". gpu-reaper will ScaleToZero it from "),
        "{note}"
    );
    assert!(
        note.ends_with(
            "=<RFC 3339 time>. Resumption risk: 4 % of similar spans resumed within 1h (12 cases)."
        ),
        "{note}"
    );
}

#[test]
fn request_driven_inference_is_warned_of_the_scale_down_to_its_minimum() {
    let softer = Softer::Keep {
        keep: 1,
        why: "its idle spans are short".into(),
    };
    let note = warning(&fields(""), &softer, false);
    assert!(
        note.contains("gpu-reaper will scale it down to 1 replica(s) instead of zero (request-driven inference: its idle spans are short) it from 2026-11-30T09:02:00Z"),
        "{note}"
    );
    assert_eq!(
        would_act(ActionType::ScaleToZero, &softer, "idle 2h"),
        "Audit mode: would scale it down to 1 replica(s) now (request-driven inference: its idle spans are short; idle 2h); nothing was changed."
    );
    // The softer action is a scale: another action is reported as it is.
    assert_eq!(
        would_act(ActionType::Suspend, &softer, "idle 2h"),
        "Audit mode: would Suspend now (idle 2h); nothing was changed."
    );
}

#[test]
fn a_done_action_names_why_and_how_to_restore_and_failures_are_warnings() {
    let done = acted(
        &Ok(Outcome::Done(
            "scaled team-a/Deployment/chat from 1 replicas to 0".into(),
        )),
        &root(),
        "idle 1h",
    );
    assert_eq!(
        done,
        Acted {
            result: "done",
            severity: Severity::Normal,
            reason: "Reclaimed",
            note: "scaled team-a/Deployment/chat from 1 replicas to 0 (idle 1h); restore with `gpu-reaper wake team-a/Deployment/chat`".into(),
        }
    );
    let refused = acted(&Ok(Outcome::Refused("PDB".into())), &root(), "idle 1h");
    assert_eq!(
        (
            refused.result,
            refused.severity,
            refused.reason,
            refused.note.as_str()
        ),
        ("refused", Severity::Warning, "ReclaimRefused", "PDB")
    );
    let unsupported = acted(&Ok(Outcome::Unsupported("no".into())), &root(), "x");
    assert_eq!(
        (unsupported.result, unsupported.reason),
        ("unsupported", "ReclaimUnsupported")
    );
    let already = acted(&Ok(Outcome::AlreadyDone("at 0".into())), &root(), "x");
    assert_eq!(
        (already.result, already.severity, already.note.as_str()),
        ("already_done", Severity::Normal, "at 0")
    );
}

#[test]
fn housekeeping_reports_the_outcomes_own_sentence() {
    assert_eq!(
        housekeeping(Ok(Outcome::Done("woke".into()))),
        (Severity::Normal, "woke".to_string())
    );
    assert_eq!(
        housekeeping(Ok(Outcome::Unsupported("no /scale".into()))),
        (Severity::Warning, "no /scale".to_string())
    );
}

#[test]
fn a_pre_warm_says_why_then_what_the_wake_did_with_its_metric_result() {
    let why = "usually busy again at 08:00 UTC on weekdays: on 5 of the 5 past weekdays on which a pause of 1h or more ended, one ended between 07:00 and 08:00 UTC; woken 15m before";
    assert_eq!(
        pre_warmed(
            why,
            Ok(Outcome::Done(
                "scaled ml/Deployment/chat back to 1 replicas".into()
            ))
        ),
        (
            "done",
            Severity::Normal,
            "Usually busy again at 08:00 UTC on weekdays: on 5 of the 5 past weekdays on which a pause of 1h or more ended, one ended between 07:00 and 08:00 UTC; woken 15m before: scaled ml/Deployment/chat back to 1 replicas".to_string()
        )
    );
    let (result, severity, note) = pre_warmed(why, Ok(Outcome::Unsupported("no /scale".into())));
    assert_eq!((result, severity), ("unsupported", Severity::Warning));
    assert!(note.ends_with(": no /scale"), "{note}");
}
