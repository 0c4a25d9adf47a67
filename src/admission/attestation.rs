//! Rules on ReadinessAttestation writes that the CRD's CEL cannot express: status is set
//! only by approvers through the status subresource, and only for the generation they
//! saw; a spec must not be born expired; a selector that selects everything is flagged.
//!
//! Four eyes (G5): [`mutate`] records in the `gpureaper.io/spec-changed-by` annotation
//! who created or last changed the spec (the mutating webhook); [`validate`] refuses a
//! write whose annotation does not say the truth (the mutating webhook did not run, or
//! someone typed it) and an approval by the user it names.

use jiff::Timestamp;

use serde_json::{Value, json};

use super::model::{Decision, Reason, Verdict};
use super::review::{AdmissionRequest, Operation};
use crate::api::ReadinessAttestation;
use crate::api::attestation::APPROVED;
use crate::api::keys::SPEC_CHANGED_BY;

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
        });
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
                Some(editor)
                    if editor == approver
                        || status.approved_by.as_deref().map(str::trim) == Some(editor) =>
                {
                    let mut d = deny(
                        &name,
                        format!(
                            "was last changed by {editor}, who may not approve it (four eyes); ask another approver to review it and run `gpu-reaper attest approve {name} --generation {}`",
                            opt(attestation.metadata.generation)
                        ),
                    );
                    d.reason = Reason::SelfApproval;
                    return d;
                }
                Some(_) => {}
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
