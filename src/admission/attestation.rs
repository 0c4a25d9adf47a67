//! Rules on ReadinessAttestation writes that the CRD's CEL cannot express: status is set
//! only by approvers through the status subresource, and only for the generation they
//! saw; a spec must not be born expired; a selector that selects everything is flagged.
//!
//! Four eyes (G5): [`mutate`] records in the `gpureaper.io/spec-changed-by` annotation
//! who created or last changed the spec (the mutating webhook); [`validate`] refuses a
//! write whose annotation does not say the truth (the mutating webhook did not run, or
//! someone typed it) and an approval by anyone who could have made that change
//! ([`not_a_second_pair_of_eyes`]).
//!
//! Who could have made it is decided from the request alone (invariant 9: no API call
//! per review): with impersonation (`kubectl --as`) the API server sends the impersonated
//! identity and keeps no trace of the person behind it (k8s.io/apiserver
//! `filters/impersonation.go`), and the built-in `edit` role may impersonate every
//! ServiceAccount of its namespace, mint tokens for them and run pods as them. So a
//! ServiceAccount is never taken for a person: a spec it changed cannot be approved, and
//! it cannot approve (docs/security.md, "Who counts as a second pair of eyes").

use jiff::Timestamp;

use serde_json::{Value, json};

use super::model::{Decision, Reason, Verdict};
use super::review::{AdmissionRequest, Operation};
use crate::api::ReadinessAttestation;
use crate::api::attestation::APPROVED;
use crate::api::keys::SPEC_CHANGED_BY;

/// How the API server names a ServiceAccount: `system:serviceaccount:<namespace>:<name>`.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The namespace of a ServiceAccount's username; `None` for anyone else.
pub fn service_account_namespace(username: &str) -> Option<&str> {
    let rest = username.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    Some(rest.split_once(':').map_or(rest, |(ns, _)| ns))
}

/// Why `approver` (the authenticated user writing the approval; `approved_by`, what it
/// records) is not a second pair of eyes on a spec last changed by `author`, as the
/// sentence's middle and next step; `None`: they are. `approve` is the command to run,
/// e.g. `gpu-reaper attest approve team-a/llama --generation 2 --uid …`.
///
/// Refused: the author themself (also when named in `approved_by`); a spec a
/// ServiceAccount changed (whoever may edit its namespace may have acted as it); an
/// approval written by a ServiceAccount (whoever may edit its namespace, the author
/// included, may act as it).
pub fn not_a_second_pair_of_eyes(
    author: &str,
    approver: &str,
    approved_by: Option<&str>,
    approve: &str,
) -> Option<String> {
    if author == approver || approved_by.map(str::trim) == Some(author) {
        return Some(format!(
            "was last changed by {author}, who may not approve it (four eyes); ask another approver to review it and run `{approve}`"
        ));
    }
    if let Some(ns) = service_account_namespace(author) {
        return Some(format!(
            "was last changed by ServiceAccount {author}, which anyone who may edit namespace {ns} can act as (kubectl --as, a token, a pod), so no approver can be its second pair of eyes (four eyes); a person must make the spec change as themself (kubectl apply with your own credentials), then another person runs `{approve}`"
        ));
    }
    if let Some(ns) = service_account_namespace(approver) {
        return Some(format!(
            "cannot be approved by {approver}: approvals are made by people, and anyone who may edit namespace {ns} (the spec's author {author} among them, perhaps) can act as that ServiceAccount (four eyes); approve with your own credentials: `{approve}`"
        ));
    }
    None
}

fn spec_changed_by(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][SPEC_CHANGED_BY].as_str()
}

/// Whether the write creates the spec or changes it.
fn spec_changed(request: &AdmissionRequest, object: &Value) -> bool {
    match (&request.operation, &request.old_object) {
        (Operation::Update, Some(old)) => old.get("spec") != object.get("spec"),
        _ => true,
    }
}

/// The JSON patch the mutating webhook answers a ReadinessAttestation write with: the
/// `gpureaper.io/spec-changed-by` annotation set to the writer when the spec is created
/// or changed, else kept as it was (nobody edits it by hand). `None`: nothing to patch.
pub fn mutate(request: &AdmissionRequest) -> Option<Vec<Value>> {
    if request.kind.group != crate::api::GROUP
        || request.kind.kind != "ReadinessAttestation"
        || request.sub_resource.is_some()
        || !matches!(request.operation, Operation::Create | Operation::Update)
    {
        return None;
    }
    let object = request.object.as_ref()?;
    let wanted: Option<String> = if spec_changed(request, object) {
        Some(request.user_info.username.clone())
    } else {
        request
            .old_object
            .as_ref()
            .and_then(spec_changed_by)
            .map(str::to_string)
    };
    let have = spec_changed_by(object);
    if have == wanted.as_deref() {
        return None;
    }
    let path = format!(
        "/metadata/annotations/{}",
        SPEC_CHANGED_BY.replace('/', "~1")
    );
    Some(match wanted {
        Some(user) if object["metadata"]["annotations"].is_object() => {
            vec![json!({"op": "add", "path": path, "value": user})]
        }
        Some(user) => vec![json!({
            "op": "add", "path": "/metadata/annotations", "value": {SPEC_CHANGED_BY: user}
        })],
        None => vec![json!({"op": "remove", "path": path})],
    })
}

fn verdict(verdict: Verdict, reason: Reason, message: Option<String>) -> Decision {
    Decision {
        verdict,
        reason,
        message,
        warnings: Vec::new(),
        gpus: None,
        policy: None,
        attestation: None,
    }
}

fn deny(name: &str, problem: String) -> Decision {
    verdict(
        Verdict::Deny,
        Reason::AttestationInvalid,
        Some(format!("ReadinessAttestation {name}: {problem}.")),
    )
}

/// Validates a create or update of a ReadinessAttestation (main resource or `status`).
pub fn validate(request: &AdmissionRequest, now: Timestamp) -> Decision {
    let name = format!("{}/{}", request.namespace, request.name);
    let Some(object) = &request.object else {
        return verdict(Verdict::Allow, Reason::NotAClaim, None);
    };
    let attestation: ReadinessAttestation = match serde_json::from_value(object.clone()) {
        Ok(a) => a,
        Err(e) => return deny(&name, format!("cannot be read: {e}")),
    };
    let name = format!(
        "{}/{}",
        request.namespace,
        attestation
            .metadata
            .name
            .as_deref()
            .unwrap_or(&request.name)
    );
    let status = attestation.status.clone().unwrap_or_default();
    if request.sub_resource.as_deref() == Some("status") {
        let approved = status
            .conditions
            .iter()
            .any(|c| c.type_ == APPROVED && c.status == "True");
        let old_status: Option<ReadinessAttestation> = request
            .old_object
            .as_ref()
            .and_then(|o| serde_json::from_value(o.clone()).ok());
        let unchanged_approval = old_status.and_then(|o| o.status).is_some_and(|o| {
            o.conditions
                .iter()
                .any(|c| c.type_ == APPROVED && c.status == "True")
                && o.approved_generation == status.approved_generation
                && o.approved_by == status.approved_by
                && o.approved_uid == status.approved_uid
        });
        let approve = format!(
            "gpu-reaper attest approve {name} --generation {} --uid {}",
            opt(attestation.metadata.generation),
            attestation.metadata.uid.as_deref().unwrap_or("(unset)")
        );
        if approved && !unchanged_approval {
            let approver = request.user_info.username.as_str();
            match spec_changed_by(object) {
                None => {
                    return deny(
                        &name,
                        format!(
                            "cannot be approved because it does not record who last changed its spec (annotation {SPEC_CHANGED_BY}, written by gpu-reaper's mutating webhook); ask its author to apply it again while the webhook runs, then approve"
                        ),
                    );
                }
                Some(author) => {
                    if let Some(problem) = not_a_second_pair_of_eyes(
                        author,
                        approver,
                        status.approved_by.as_deref(),
                        &approve,
                    ) {
                        let mut d = deny(&name, problem);
                        d.reason = Reason::SelfApproval;
                        return d;
                    }
                }
            }
        }
        if approved {
            if status
                .approved_by
                .as_deref()
                .unwrap_or("")
                .trim()
                .is_empty()
            {
                return deny(
                    &name,
                    "status.approvedBy must name the approver when Approved is True; approve with `gpu-reaper attest approve`".into(),
                );
            }
            if status.approved_generation != attestation.metadata.generation {
                return deny(
                    &name,
                    format!(
                        "status.approvedGeneration {} must equal metadata.generation {} when Approved is True, so the approval binds to the spec that was reviewed; approve with `gpu-reaper attest approve {name}`",
                        opt(status.approved_generation),
                        opt(attestation.metadata.generation)
                    ),
                );
            }
            // The approval binds to this object, not to its name: one deleted and created
            // again is another object, at generation 1 again.
            if !unchanged_approval && status.approved_uid != attestation.metadata.uid {
                return deny(
                    &name,
                    format!(
                        "status.approvedUid {} must equal metadata.uid {} when Approved is True, so the approval binds to the object that was reviewed (one deleted and created again under the same name is another object); review it and run `{approve}`",
                        status.approved_uid.as_deref().unwrap_or("(unset)"),
                        attestation.metadata.uid.as_deref().unwrap_or("(unset)")
                    ),
                );
            }
        }
        return verdict(Verdict::Allow, Reason::AttestationValid, None);
    }
    if request.operation == Operation::Create
        && (!status.conditions.is_empty()
            || status.approved_by.is_some()
            || status.approved_generation.is_some())
    {
        return deny(
            &name,
            "status is written only by approvers through the status subresource; remove `status` from the manifest and ask an approver to run `gpu-reaper attest approve`".into(),
        );
    }
    let spec_changed = spec_changed(request, object);
    let recorded = spec_changed_by(object);
    // No record at all: the mutating webhook did not run. Admitted, but it cannot be
    // approved until its author applies it again with the webhook running (fail closed
    // where it matters). A record naming someone else is a forgery: refused.
    let unrecorded = spec_changed && recorded.is_none();
    if spec_changed && recorded.is_some() && recorded != Some(request.user_info.username.as_str()) {
        return deny(
            &name,
            format!(
                "metadata.annotations[{SPEC_CHANGED_BY:?}] must name the user who changes the spec ({:?}), found {:?}; gpu-reaper's mutating webhook writes it, so check that it is installed and do not set the annotation by hand",
                request.user_info.username,
                recorded.unwrap_or("")
            ),
        );
    }
    let old_recorded = request.old_object.as_ref().and_then(spec_changed_by);
    if !spec_changed && recorded != old_recorded {
        return deny(
            &name,
            format!(
                "metadata.annotations[{SPEC_CHANGED_BY:?}] records who last changed the spec and cannot be edited; remove your change to it"
            ),
        );
    }
    if spec_changed && attestation.spec.expires_at.0 <= now {
        return deny(
            &name,
            format!(
                "spec.expiresAt {} is in the past; set a future time, e.g. {}",
                attestation.spec.expires_at.0,
                now.checked_add(jiff::SignedDuration::from_hours(24 * 90))
                    .unwrap_or(now)
                    .strftime("%Y-%m-%dT00:00:00Z")
            ),
        );
    }
    let selector = &attestation.spec.selector;
    let mut decision = verdict(Verdict::Allow, Reason::AttestationValid, None);
    if unrecorded {
        decision.warnings.push(format!(
            "ReadinessAttestation {name} does not record who changed its spec (annotation {SPEC_CHANGED_BY}, written by gpu-reaper's mutating webhook), so it cannot be approved until it is applied again with that webhook running."
        ));
    }
    if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty())
    {
        decision.warnings.push(format!(
            "ReadinessAttestation {name} has an empty spec.selector, so once approved it covers every workload in namespace {}.",
            request.namespace
        ));
    }
    decision
}

fn opt(v: Option<i64>) -> String {
    v.map_or("(unset)".to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const APPROVE: &str = "gpu-reaper attest approve team-a/llama --generation 1 --uid u";

    #[test]
    fn a_service_account_username_names_its_namespace() {
        assert_eq!(
            service_account_namespace("system:serviceaccount:team-a:builder"),
            Some("team-a")
        );
        assert_eq!(service_account_namespace("alice"), None);
        assert_eq!(service_account_namespace("system:admin"), None);
    }

    #[test]
    fn only_a_person_other_than_the_author_is_a_second_pair_of_eyes() {
        let sa = "system:serviceaccount:team-a:builder";
        let eyes = |author, approver, approved_by| {
            not_a_second_pair_of_eyes(author, approver, approved_by, APPROVE)
        };
        assert_eq!(eyes("alice", "bob", Some("bob")), None);
        // The author, under their name or writing it into approvedBy.
        assert!(
            eyes("alice", "alice", None)
                .unwrap()
                .contains("who may not approve it")
        );
        assert!(eyes("alice", "bob", Some(" alice ")).is_some());
        // A ServiceAccount's spec: whoever may edit team-a may have written it.
        for approver in ["bob", "system:serviceaccount:ci:deployer"] {
            let problem = eyes(sa, approver, None).unwrap();
            assert!(
                problem.contains("which anyone who may edit namespace team-a can act as"),
                "{problem}"
            );
            assert!(problem.contains(APPROVE), "{problem}");
        }
        // A ServiceAccount approving: whoever may edit its namespace may be behind it.
        let problem = eyes("alice", "system:serviceaccount:team-a:approver-bot", None).unwrap();
        assert!(
            problem.contains("approvals are made by people"),
            "{problem}"
        );
    }
}
