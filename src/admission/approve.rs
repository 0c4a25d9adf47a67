//! `gpu-reaper attest approve|revoke <namespace>/<name>`: writes a ReadinessAttestation's
//! status through the status subresource, which the chart grants only to approvers.
//!
//! An approval binds to what the approver saw (G5): `approve` prints the spec and its
//! `metadata.generation` and requires `--generation N`, refusing if the spec is not at
//! generation N any more. The write carries the resourceVersion that was read, so a spec
//! edit racing the approval fails with a conflict; after one, the attestation is read
//! again and the approval is refused unless its generation is still N (a status-only
//! change is retried). The webhook refuses an approver who last changed the spec.

use jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::attestation::APPROVED;
use crate::api::conditions::{condition, set_condition};
use crate::api::{ReadinessAttestation, ReadinessAttestationStatus};
use crate::cli::{AttestAction, AttestArgs, AttestTarget};
use crate::commands::block_on;
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

/// The identity the API server authenticated this client as (a SelfSubjectReview, what
/// `kubectl auth whoami` asks): the name the webhook's four-eyes rule compares.
async fn authenticated_user(client: &Client) -> Option<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .inspect_err(|e| tracing::debug!(error = %e, "no SelfSubjectReview; naming the approver from the kubeconfig"))
        .ok()?;
    review.status?.user_info?.username
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

/// The spec an approver reviews, as YAML, with its generation.
pub fn spec_text(a: &ReadinessAttestation) -> String {
    let spec = serde_yaml::to_string(&a.spec).unwrap_or_default();
    let mut out = format!(
        "spec at generation {}:\n",
        a.metadata.generation.unwrap_or(0)
    );
    for line in spec.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Whether the approval may go ahead: the reviewed `generation` is the current one.
pub fn check_generation(
    full: &str,
    reviewed: Option<i64>,
    current: &ReadinessAttestation,
) -> Result<()> {
    let now = current.metadata.generation.unwrap_or(0);
    match reviewed {
        None => Err(Error::InvalidArgument {
            flag: "generation",
            message: format!(
                "approving binds to the spec you reviewed; review it and run `gpu-reaper attest approve {full} --generation {now}`\n{}",
                spec_text(current)
            ),
        }),
        Some(g) if g != now => Err(Error::InvalidArgument {
            flag: "generation",
            message: format!(
                "ReadinessAttestation {full} is at generation {now}, not the generation {g} you reviewed: its spec changed; review it again and pass --generation {now}\n{}",
                spec_text(current)
            ),
        }),
        Some(_) => Ok(()),
    }
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
    let approver = match &target.approver {
        Some(a) => Some(a.clone()),
        None => authenticated_user(&client).await.or_else(kubeconfig_user),
    };
    let approver = match approver {
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
        if approve {
            check_generation(&full, target.generation, &current)?;
        }
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
                if approve {
                    // What was approved, for the approver's terminal; stdout keeps one line.
                    eprint!("{}", spec_text(&current));
                }
                return Ok(if approve {
                    format!(
                        "readinessattestation {full} approved by {approver} for generation {}",
                        generation.unwrap_or(0)
                    )
                } else {
                    format!("readinessattestation {full} approval revoked by {approver}")
                });
            }
            // Changed since it was read: read again; a new spec is refused above (its
            // generation is not the reviewed one), a status-only change is retried.
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

    fn attestation_at(generation: i64) -> ReadinessAttestation {
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": "llama", "namespace": "team-a", "generation": generation},
            "spec": {"selector": {"matchLabels": {"app": "llama"}}, "maxGpus": 64,
                     "expiresAt": "2030-01-01T00:00:00Z"},
        }))
        .unwrap()
    }

    #[test]
    fn approving_without_the_reviewed_generation_is_refused_and_shows_the_spec() {
        let err = check_generation("team-a/llama", None, &attestation_at(2))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--generation 2"), "{err}");
        assert!(err.contains("maxGpus: 64"), "{err}");
    }

    #[test]
    fn approving_a_spec_that_changed_since_it_was_reviewed_is_refused() {
        // The team edited the spec (generation 1 → 2) between review and approval.
        let err = check_generation("team-a/llama", Some(1), &attestation_at(2))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("at generation 2, not the generation 1 you reviewed"),
            "{err}"
        );
        assert!(check_generation("team-a/llama", Some(2), &attestation_at(2)).is_ok());
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
