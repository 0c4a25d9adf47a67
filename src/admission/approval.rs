//! The rules of an approval (`gpu-reaper attest approve|revoke`), PURE: the status an
//! approval or a revocation writes, and the checks before writing — the approver reviewed
//! this object at this generation, and is a second pair of eyes on its last spec change.
//! The command's edge (reading and writing the attestation) is `commands::attest`.

use jiff::Timestamp;

use super::attestation::not_a_second_pair_of_eyes;
use crate::api::attestation::APPROVED;
use crate::api::conditions::{condition, set_condition};
use crate::api::keys::SPEC_CHANGED_BY;
use crate::api::{ReadinessAttestation, ReadinessAttestationStatus};
use crate::{Error, Result};

/// The status after approving (or revoking) `generation` of the object `uid` as
/// `approver`.
pub fn approval_status(
    existing: Option<&ReadinessAttestationStatus>,
    approve: bool,
    approver: &str,
    (generation, uid): (Option<i64>, Option<&str>),
    message: Option<&str>,
    now: Timestamp,
) -> ReadinessAttestationStatus {
    let mut status = existing.cloned().unwrap_or_default();
    let (reason, default_message) = if approve {
        (
            "Approved",
            format!(
                "approved by {approver} for generation {}",
                generation.unwrap_or(0)
            ),
        )
    } else {
        ("Revoked", format!("approval revoked by {approver}"))
    };
    set_condition(
        &mut status.conditions,
        condition(
            APPROVED,
            approve,
            reason,
            message.map_or(default_message, str::to_string),
        ),
        now,
    );
    status.approved_by = Some(approver.to_string());
    status.approved_generation = if approve { generation } else { None };
    status.approved_uid = if approve {
        uid.map(str::to_string)
    } else {
        None
    };
    status
}

/// Splits `<namespace>/<name>`.
pub fn parse_target(text: &str) -> Result<(String, String)> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(Error::InvalidArgument {
            flag: "attestation",
            message: format!("{text:?} is not <namespace>/<name>, e.g. team-a/llama-finetune"),
        }),
    }
}

/// The spec an approver reviews, as YAML, with the object's uid and its generation.
pub fn spec_text(a: &ReadinessAttestation) -> String {
    let spec = serde_yaml::to_string(&a.spec).unwrap_or_default();
    let mut out = format!(
        "spec of uid {} at generation {}, last changed by {}:\n",
        a.metadata.uid.as_deref().unwrap_or("(unset)"),
        a.metadata.generation.unwrap_or(0),
        a.metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(SPEC_CHANGED_BY))
            .map_or("(not recorded)", String::as_str)
    );
    for line in spec.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The command that approves `current` as it is now.
fn approve_command(full: &str, current: &ReadinessAttestation) -> String {
    format!(
        "gpu-reaper attest approve {full} --generation {} --uid {}",
        current.metadata.generation.unwrap_or(0),
        current.metadata.uid.as_deref().unwrap_or("(unset)")
    )
}

/// Whether the approval may go ahead: the reviewed object (`uid`) is the one there now,
/// at the reviewed `generation`.
pub fn check_reviewed(
    full: &str,
    (reviewed_generation, reviewed_uid): (Option<i64>, Option<&str>),
    current: &ReadinessAttestation,
) -> Result<()> {
    let now = current.metadata.generation.unwrap_or(0);
    let command = approve_command(full, current);
    let (Some(generation), Some(uid)) = (reviewed_generation, reviewed_uid) else {
        return Err(Error::InvalidArgument {
            flag: "generation",
            message: format!(
                "approving binds to the object and the spec you reviewed; review it and run `{command}`\n{}",
                spec_text(current)
            ),
        });
    };
    if current.metadata.uid.as_deref() != Some(uid) {
        return Err(Error::InvalidArgument {
            flag: "uid",
            message: format!(
                "ReadinessAttestation {full} is another object now (uid {}), not the uid {uid} you reviewed: it was deleted and created again; review this one and run `{command}`\n{}",
                current.metadata.uid.as_deref().unwrap_or("(unset)"),
                spec_text(current)
            ),
        });
    }
    if generation != now {
        return Err(Error::InvalidArgument {
            flag: "generation",
            message: format!(
                "ReadinessAttestation {full} is at generation {now}, not the generation {generation} you reviewed: its spec changed; review it again and run `{command}`\n{}",
                spec_text(current)
            ),
        });
    }
    Ok(())
}

/// Refuses, before writing, an approval the webhook would refuse: by someone who is not a
/// second pair of eyes on the last spec change (`authenticated`: who the API server
/// says this client is, when it said).
pub fn check_eyes(
    full: &str,
    current: &ReadinessAttestation,
    authenticated: Option<&str>,
    approver: &str,
) -> Result<()> {
    let author = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|m| m.get(SPEC_CHANGED_BY));
    let (Some(author), Some(user)) = (author, authenticated) else {
        return Ok(());
    };
    match not_a_second_pair_of_eyes(
        author,
        user,
        Some(approver),
        &approve_command(full, current),
    ) {
        Some(problem) => Err(Error::InvalidArgument {
            flag: "approver",
            message: format!("ReadinessAttestation {full} {problem}"),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn approval_binds_to_the_object_and_generation_and_names_the_approver() {
        let now: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        let s = approval_status(None, true, "oncall", (Some(3), Some("u-1")), None, now);
        assert_eq!(s.approved_generation, Some(3));
        assert_eq!(s.approved_uid.as_deref(), Some("u-1"));
        assert_eq!(s.approved_by.as_deref(), Some("oncall"));
        assert_eq!(s.conditions.len(), 1);
        assert_eq!(s.conditions[0].status, "True");
        assert_eq!(
            s.conditions[0].message,
            "approved by oncall for generation 3"
        );
        let revoked = approval_status(
            Some(&s),
            false,
            "lead",
            (Some(3), Some("u-1")),
            Some("pipeline broke"),
            now,
        );
        assert_eq!(revoked.approved_generation, None);
        assert_eq!(revoked.approved_uid, None);
        assert_eq!(revoked.conditions.len(), 1);
        assert_eq!(revoked.conditions[0].status, "False");
        assert_eq!(revoked.conditions[0].reason, "Revoked");
        assert_eq!(revoked.conditions[0].message, "pipeline broke");
    }

    fn attestation_at(generation: i64) -> ReadinessAttestation {
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": "llama", "namespace": "team-a", "generation": generation,
                         "uid": "u-2", "annotations": {SPEC_CHANGED_BY: "alice"}},
            "spec": {"selector": {"matchLabels": {"app": "llama"}}, "maxGpus": 64,
                     "expiresAt": "2030-01-01T00:00:00Z"},
        }))
        .unwrap()
    }

    #[test]
    fn approving_without_the_reviewed_uid_and_generation_is_refused_and_shows_the_spec() {
        for reviewed in [(None, None), (Some(2), None), (None, Some("u-2"))] {
            let err = check_reviewed("team-a/llama", reviewed, &attestation_at(2))
                .unwrap_err()
                .to_string();
            assert!(err.contains("--generation 2 --uid u-2"), "{err}");
            assert!(err.contains("maxGpus: 64"), "{err}");
            assert!(err.contains("last changed by alice"), "{err}");
        }
    }

    #[test]
    fn approving_a_spec_that_changed_since_it_was_reviewed_is_refused() {
        // The team edited the spec (generation 1 → 2) between review and approval.
        let err = check_reviewed("team-a/llama", (Some(1), Some("u-2")), &attestation_at(2))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("at generation 2, not the generation 1 you reviewed"),
            "{err}"
        );
        assert!(check_reviewed("team-a/llama", (Some(2), Some("u-2")), &attestation_at(2)).is_ok());
    }

    #[test]
    fn approving_another_object_of_the_same_name_is_refused() {
        // Reviewed u-1 at generation 1; it was deleted and created again: u-2, generation 1.
        let err = check_reviewed("team-a/llama", (Some(1), Some("u-1")), &attestation_at(1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is another object now (uid u-2), not the uid u-1 you reviewed"),
            "{err}"
        );
    }

    #[test]
    fn the_cli_refuses_an_approver_who_is_no_second_pair_of_eyes() {
        let mut a = attestation_at(1);
        let refused = |a: &ReadinessAttestation, user: &str| {
            check_eyes("team-a/llama", a, Some(user), user)
                .err()
                .map(|e| e.to_string())
        };
        assert!(
            refused(&a, "alice")
                .unwrap()
                .contains("who may not approve it")
        );
        assert!(refused(&a, "bob").is_none());
        assert!(
            refused(&a, "system:serviceaccount:team-a:bot")
                .unwrap()
                .contains("approvals are made by people")
        );
        a.metadata.annotations = Some(
            [(
                SPEC_CHANGED_BY.to_string(),
                "system:serviceaccount:team-a:builder".to_string(),
            )]
            .into(),
        );
        assert!(
            refused(&a, "alice").unwrap().contains(
                "was last changed by ServiceAccount system:serviceaccount:team-a:builder"
            )
        );
        // Without knowing who it is, the CLI leaves the decision to the webhook.
        assert!(check_eyes("team-a/llama", &a, None, "alice").is_ok());
    }

    #[test]
    fn a_target_without_namespace_is_refused_with_an_example() {
        let err = parse_target("llama").unwrap_err().to_string();
        assert!(
            err.contains("--attestation") && err.contains("team-a/llama-finetune"),
            "{err}"
        );
        assert_eq!(
            parse_target("team-a/llama").unwrap(),
            ("team-a".into(), "llama".into())
        );
    }
}
