//! `gpu-reaper attest approve|revoke <namespace>/<name>`: writes a ReadinessAttestation's
//! status through the status subresource, which the chart grants only to approvers.
//!
//! The approval records the `metadata.generation` the approver saw; the write carries the
//! resourceVersion that was read, so a spec edit racing the approval makes it fail with a
//! conflict (and it is retried on the new spec) instead of approving an unseen spec.

use jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::attestation::APPROVED;
use crate::api::conditions::{condition, set_condition};
use crate::api::{ReadinessAttestation, ReadinessAttestationStatus};
use crate::cli::{AttestAction, AttestArgs, AttestTarget};
use crate::report::backtest::block_on;
use crate::{Error, Result};

/// The status after approving (or revoking) `generation` as `approver`.
pub fn approval_status(
    existing: Option<&ReadinessAttestationStatus>,
    approve: bool,
    approver: &str,
    generation: Option<i64>,
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

fn kubeconfig_user() -> Option<String> {
    let config = kube::config::Kubeconfig::read().ok()?;
    let context_name = config.current_context.clone()?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)?
        .context
        .clone()?;
    context.user
}

pub fn run(args: &AttestArgs) -> Result<()> {
    let (target, approve) = match &args.action {
        AttestAction::Approve(t) => (t, true),
        AttestAction::Revoke(t) => (t, false),
    };
    let line = block_on(async {
        let client = Client::try_default().await.map_err(|source| Error::Kube {
            action: "connecting to the Kubernetes API (KUBECONFIG or in-cluster config)".into(),
            source,
        })?;
        set_approval(client, target, approve).await
    })??;
    println!("{line}");
    Ok(())
}

/// Approves or revokes; returns the line to print.
pub async fn set_approval(client: Client, target: &AttestTarget, approve: bool) -> Result<String> {
    let (namespace, name) = parse_target(&target.attestation)?;
    let approver = match target.approver.clone().or_else(kubeconfig_user) {
        Some(a) if !a.trim().is_empty() => a,
        _ => {
            return Err(Error::InvalidArgument {
                flag: "approver",
                message: "no approver given and no user in the kubeconfig's current context; pass --approver <name>".into(),
            });
        }
    };
    let api: Api<ReadinessAttestation> = Api::namespaced(client, &namespace);
    let full = format!("{namespace}/{name}");
    for _ in 0..5 {
        let current = api.get(&name).await.map_err(|source| Error::Kube {
            action: format!("reading ReadinessAttestation {full}"),
            source,
        })?;
        let generation = current.metadata.generation;
        let status = approval_status(
            current.status.as_ref(),
            approve,
            &approver,
            generation,
            target.message.as_deref(),
            Timestamp::now(),
        );
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "status": status,
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                return Ok(if approve {
                    format!(
                        "readinessattestation {full} approved by {approver} for generation {}",
                        generation.unwrap_or(0)
                    )
                } else {
                    format!("readinessattestation {full} approval revoked by {approver}")
                });
            }
            // The spec (or status) changed since it was read: read again, so the approval
            // binds to what is there now.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(source) => {
                return Err(Error::Kube {
                    action: format!("writing the status of ReadinessAttestation {full}"),
                    source,
                });
            }
        }
    }
    Err(Error::Webhook(format!(
        "ReadinessAttestation {full} kept changing while it was being approved; try again"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_binds_to_the_generation_and_names_the_approver() {
        let now: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        let s = approval_status(None, true, "oncall", Some(3), None, now);
        assert_eq!(s.approved_generation, Some(3));
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
            Some(3),
            Some("pipeline broke"),
            now,
        );
        assert_eq!(revoked.approved_generation, None);
        assert_eq!(revoked.conditions.len(), 1);
        assert_eq!(revoked.conditions[0].status, "False");
        assert_eq!(revoked.conditions[0].reason, "Revoked");
        assert_eq!(revoked.conditions[0].message, "pipeline broke");
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
