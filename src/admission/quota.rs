//! Pure parts of G2 and of an attestation's visible state, for the controller to apply:
//! the ResourceQuota a governed namespace should have so the API server itself refuses
//! the pod that would cross what G1 allows (even while the webhook is down), and the
//! `Approved` condition an attestation should show (False with reason `SpecChanged` or
//! `Expired` once its approval no longer counts).
//!
//! No IO here. The controller writes both with server-side apply (one field manager,
//! force) every cycle: the quota `gpu-reaper-gpus` in each namespace a policy with
//! `admission` selects, the condition through the status subresource.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};

use super::count::GpuResources;
use super::decide::{Check, check_attestation};
use crate::api::ReadinessAttestation;
use crate::api::attestation::APPROVED;
use crate::api::conditions::condition;
use crate::api::policy::AdmissionSpec;

/// Name of the ResourceQuota the controller keeps in each governed namespace.
pub const QUOTA_NAME: &str = "gpu-reaper-gpus";

/// The GPUs G1 lets `attestations`' namespace hold at `now`: the unattested allowance
/// plus the `maxGpus` of each approved, unexpired attestation.
pub fn allowed_gpus(
    rules: &AdmissionSpec,
    attestations: &[&ReadinessAttestation],
    now: Timestamp,
) -> u64 {
    let allowance = u64::from(rules.unattested_gpus.unwrap_or(rules.large_claim_gpus));
    let attested: u64 = attestations
        .iter()
        .filter(|a| check_attestation(a, 0.0, &AdmissionSpec::default(), now) == Check::Passes)
        .map(|a| u64::from(a.spec.max_gpus))
        .sum();
    allowance + attested
}

/// The ResourceQuota for `namespace` at `gpus` GPUs: every whole GPU resource that is not
/// a prefix (`requests.` and `limits.`, since either may be set alone), each at the full
/// figure (a quota cannot bound a sum across resources; the webhook does), and the DRA
/// device-class quota `<class>.deviceclass.resource.k8s.io/devices` of every GPU device
/// class (served since Kubernetes 1.34; older servers ignore it). Over budget (G3) the
/// caller passes what the namespace holds now, so the quota stops growth.
pub fn quota(namespace: &str, gpus: u64, resources: &GpuResources) -> ResourceQuota {
    let amount = Quantity(gpus.to_string());
    let mut hard: BTreeMap<String, Quantity> = BTreeMap::new();
    for resource in resources.whole.iter().filter(|r| !r.ends_with('*')) {
        hard.insert(format!("requests.{resource}"), amount.clone());
        hard.insert(format!("limits.{resource}"), amount.clone());
    }
    for class in &resources.device_classes {
        hard.insert(
            format!("{class}.deviceclass.resource.k8s.io/devices"),
            amount.clone(),
        );
    }
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(QUOTA_NAME.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "gpu-reaper".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    }
}

/// The `Approved` condition an approved attestation should show when its approval no
/// longer counts: False with reason `SpecChanged` (the spec was edited after approval) or
/// `Expired`. `None`: leave it as the approver wrote it.
pub fn approval_condition(a: &ReadinessAttestation, now: Timestamp) -> Option<Condition> {
    let approved = a.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == APPROVED && c.status == "True")
    });
    if !approved {
        return None;
    }
    match check_attestation(a, 0.0, &AdmissionSpec::default(), now) {
        Check::StaleApproval { approved, current } => Some(condition(
            APPROVED,
            false,
            "SpecChanged",
            format!(
                "the spec changed after the approval of generation {} (now {}); an approver must review it and run `gpu-reaper attest approve`",
                approved.map_or("(unset)".to_string(), |g| g.to_string()),
                current.map_or("(unset)".to_string(), |g| g.to_string())
            ),
        )),
        Check::Expired { at } => Some(condition(
            APPROVED,
            false,
            "Expired",
            format!("spec.expiresAt {at} has passed"),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attestation(
        generation: i64,
        approved: i64,
        expires: &str,
        max: u32,
    ) -> ReadinessAttestation {
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": "a", "namespace": "team-a", "generation": generation},
            "spec": {"selector": {}, "maxGpus": max, "expiresAt": expires},
            "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
                "message": "ok", "lastTransitionTime": "2026-11-01T00:00:00Z"}],
                "approvedBy": "oncall", "approvedGeneration": approved},
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2026-11-10T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_namespace_may_hold_its_allowance_plus_its_standing_attestations() {
        let rules = AdmissionSpec::default();
        let good = attestation(1, 1, "2030-01-01T00:00:00Z", 64);
        let stale = attestation(2, 1, "2030-01-01T00:00:00Z", 64);
        let expired = attestation(1, 1, "2026-01-01T00:00:00Z", 64);
        assert_eq!(
            allowed_gpus(&rules, &[&good, &stale, &expired], now()),
            8 + 64
        );
    }

    #[test]
    fn the_quota_bounds_every_gpu_resource_and_device_class() {
        let q = quota("team-a", 72, &GpuResources::default());
        let hard = q.spec.unwrap().hard.unwrap();
        assert_eq!(hard["requests.nvidia.com/gpu"], Quantity("72".into()));
        assert_eq!(hard["limits.amd.com/gpu"], Quantity("72".into()));
        assert_eq!(
            hard["gpu.nvidia.com.deviceclass.resource.k8s.io/devices"],
            Quantity("72".into())
        );
        assert!(!hard.keys().any(|k| k.contains('*')), "{hard:?}");
    }

    #[test]
    fn an_edited_or_expired_approval_shows_approved_false() {
        let stale = attestation(2, 1, "2030-01-01T00:00:00Z", 64);
        let c = approval_condition(&stale, now()).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "SpecChanged")
        );
        let expired = attestation(1, 1, "2026-01-01T00:00:00Z", 64);
        assert_eq!(
            approval_condition(&expired, now()).unwrap().reason,
            "Expired"
        );
        let good = attestation(1, 1, "2030-01-01T00:00:00Z", 64);
        assert_eq!(approval_condition(&good, now()), None);
    }
}
