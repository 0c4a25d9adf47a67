//! `gpu-reaper attest approve|revoke <namespace>/<name>`: writes a ReadinessAttestation's
//! status through the status subresource, which the chart grants only to approvers.
//!
//! An approval binds to what the approver saw (G5, invariant 11): `approve` prints the
//! spec with the object's `metadata.uid` and `metadata.generation` and requires `--uid U
//! --generation N`, refusing if the attestation is another object now (deleted and
//! created again under the same name) or its spec is not at generation N any more; it
//! records both (`approvedUid`, `approvedGeneration`). The write carries the
//! resourceVersion that was read, so a spec edit racing the approval fails with a
//! conflict; after one, the attestation is read again and checked again (a status-only
//! change is retried). It refuses, as the webhook does, an approver who is not a second
//! pair of eyes on the last spec change (`admission::approval`).

use jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::block_on;
use crate::admission::approval::{
    approval_status, check_eyes, check_reviewed, parse_target, spec_text,
};
use crate::api::ReadinessAttestation;
use crate::cli::{AttestAction, AttestArgs, AttestTarget};
use crate::{Error, Result};

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
    let authenticated = authenticated_user(&client).await;
    let approver = match &target.approver {
        Some(a) => Some(a.clone()),
        None => authenticated.clone().or_else(kubeconfig_user),
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
            check_reviewed(&full, (target.generation, target.uid.as_deref()), &current)?;
            check_eyes(&full, &current, authenticated.as_deref(), &approver)?;
        }
        let generation = current.metadata.generation;
        let status = approval_status(
            current.status.as_ref(),
            approve,
            &approver,
            (generation, current.metadata.uid.as_deref()),
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
