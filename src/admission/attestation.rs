//! Rules on ReadinessAttestation writes that the CRD's CEL cannot express: status is set
//! only by approvers through the status subresource, and only for the generation they
//! saw; a spec must not be born expired; a selector that selects everything is flagged.

use jiff::Timestamp;

use super::decide::{Decision, Reason, Verdict};
use super::review::{AdmissionRequest, Operation};
use crate::api::ReadinessAttestation;
use crate::api::attestation::APPROVED;

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
    let spec_changed = match (&request.operation, &request.old_object) {
        (Operation::Update, Some(old)) => old.get("spec") != object.get("spec"),
        _ => true,
    };
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
