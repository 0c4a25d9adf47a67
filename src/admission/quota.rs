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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};

use super::budget;
use super::checks::{check_attestation, standing};
use super::model::Check;
use crate::api::attestation::APPROVED;
use crate::api::conditions::condition;
use crate::api::policy::AdmissionSpec;
use crate::api::{GpuPolicy, ReadinessAttestation};
use crate::gpus::GpuResources;
use crate::gpus::quantity_units;

/// Name of the ResourceQuota the controller keeps in each governed namespace.
pub const QUOTA_NAME: &str = "gpu-reaper-gpus";

/// Label naming the GpuPolicy a quota was written for (a controller sharded by
/// `--policy-selector` removes only the quotas of its own policies).
pub const POLICY_LABEL: &str = "gpureaper.io/policy";

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
        .filter(|a| standing(a, now))
        .map(|a| u64::from(a.spec.max_gpus))
        .sum();
    allowance + attested
}

/// The quota's figure for `namespace`: what G1 lets it hold ([`allowed_gpus`]), and no
/// more than its monthly budget pays for from `now` to the month's end at the policy's
/// dearest GPU-hour (G3 as a namespace total: the API server then refuses the pod that
/// would commit the namespace past its budget, even while the webhook is down).
pub fn figure(
    policy: &GpuPolicy,
    rules: &AdmissionSpec,
    namespace: &str,
    attestations: &[&ReadinessAttestation],
    now: Timestamp,
) -> u64 {
    let affordable = rules.monthly_budget_usd.and_then(|b| {
        let spent = policy.spend_of(namespace, &budget::month_of(now));
        budget::affordable_gpus(b, spent, budget::hourly_usd(policy), now)
    });
    allowed_gpus(rules, attestations, now).min(affordable.unwrap_or(u64::MAX))
}

/// The quota key of an extended resource (the API server takes only `requests.` for
/// extended resources: their requests always equal their limits).
fn request_key(resource: &str) -> String {
    format!("requests.{resource}")
}

/// The hard limits of the quota for `gpus` GPUs: for every GPU resource named in
/// `resources` that is not a prefix, and every `served` resource name (nodes'
/// allocatable) a prefix or the MIG prefix covers, as many units as fit in `gpus` (a MIG
/// `1g` slice is 1/7 of a GPU, so 8 GPUs allow 56 of them); and the DRA device-class
/// quota `<class>.deviceclass.resource.k8s.io/devices` of every GPU device class (one GPU
/// per device; served since Kubernetes 1.34, older servers ignore it). A quota cannot
/// bound a sum across resources: each resource may reach the whole figure alone, and the
/// webhook bounds the sum.
///
/// `frozen`: the namespace is over its monthly budget (G3) and gets no new GPUs; each
/// limit is capped at what the quota's status reports in use (none grows, none is
/// taken from running pods).
pub fn hard_limits(
    gpus: u64,
    resources: &GpuResources,
    served: &[String],
    frozen: Option<&BTreeMap<String, Quantity>>,
) -> BTreeMap<String, Quantity> {
    let mut units: BTreeMap<String, u64> = BTreeMap::new();
    let names = resources
        .whole
        .iter()
        .filter(|r| !r.ends_with('*'))
        .chain(served.iter());
    for resource in names {
        let Some(share) = resources.share_of(resource).filter(|s| *s > 0.0) else {
            continue;
        };
        let fit = ((gpus as f64) / share + 1e-9).floor();
        units.insert(request_key(resource), fit.min(u64::MAX as f64) as u64);
    }
    for class in &resources.device_classes {
        units.insert(format!("{class}.deviceclass.resource.k8s.io/devices"), gpus);
    }
    if let Some(used) = frozen {
        for (key, limit) in units.iter_mut() {
            let in_use = used
                .get(key)
                .and_then(|q| quantity_units(&q.0))
                .unwrap_or(0);
            *limit = (*limit).min(in_use);
        }
    }
    units
        .into_iter()
        .map(|(k, v)| (k, Quantity(v.to_string())))
        .collect()
}

/// The ResourceQuota for `namespace` with `hard` limits, owned by `policy` (deleting the
/// policy deletes its quotas).
pub fn quota(
    namespace: &str,
    hard: BTreeMap<String, Quantity>,
    policy: &GpuPolicy,
) -> ResourceQuota {
    let name = policy.metadata.name.clone().unwrap_or_default();
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(QUOTA_NAME.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "gpu-reaper".to_string(),
                ),
                (POLICY_LABEL.to_string(), name.clone()),
            ])),
            owner_references: policy.metadata.uid.clone().map(|uid| {
                vec![OwnerReference {
                    api_version: format!("{}/{}", crate::api::GROUP, crate::api::VERSION),
                    kind: "GpuPolicy".to_string(),
                    name,
                    uid,
                    ..OwnerReference::default()
                }]
            }),
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
/// `Expired`, turned False at `now` (it is only returned while `Approved` is still True).
/// `None`: leave it as the approver wrote it.
pub fn approval_condition(a: &ReadinessAttestation, now: Timestamp) -> Option<Condition> {
    let approved = a.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == APPROVED && c.status == "True")
    });
    if !approved {
        return None;
    }
    let lapsed = match check_attestation(a, 0.0, &AdmissionSpec::default(), now) {
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
        Check::OtherObject { approved, .. } => Some(condition(
            APPROVED,
            false,
            "OtherObject",
            format!(
                "the approval was made for another object of this name (uid {approved}); an approver must review this one and run `gpu-reaper attest approve`"
            ),
        )),
        Check::Expired { at } => Some(condition(
            APPROVED,
            false,
            "Expired",
            format!("spec.expiresAt {at} has passed"),
        )),
        _ => None,
    };
    // `condition` leaves the transition time at the epoch for `set_condition` to fill;
    // this one is written as is, and the status changes now.
    lapsed.map(|c| Condition {
        last_transition_time: Time(now),
        ..c
    })
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

    fn policy() -> GpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
            "metadata": {"name": "gate", "uid": "u-1"},
            "spec": {"match": {}, "admission": {"largeClaimGpus": 8}},
        }))
        .unwrap()
    }

    #[test]
    fn the_quota_bounds_every_gpu_resource_and_device_class() {
        let served = vec![
            "nvidia.com/mig-1g.10gb".to_string(),
            "nvidia.com/mig-3g.40gb".to_string(),
            "gpu.intel.com/i915".to_string(),
            "example.com/fpga".to_string(),
        ];
        let hard = hard_limits(72, &GpuResources::default(), &served, None);
        let units = |k: &str| hard.get(k).map(|q| q.0.as_str());
        assert_eq!(units("requests.nvidia.com/gpu"), Some("72"));
        assert_eq!(units("requests.amd.com/gpu"), Some("72"));
        // A 1g slice is a seventh of a GPU, a 3g slice three sevenths.
        assert_eq!(units("requests.nvidia.com/mig-1g.10gb"), Some("504"));
        assert_eq!(units("requests.nvidia.com/mig-3g.40gb"), Some("168"));
        assert_eq!(units("requests.gpu.intel.com/i915"), Some("72"));
        assert_eq!(units("requests.example.com/fpga"), None);
        assert_eq!(
            units("gpu.nvidia.com.deviceclass.resource.k8s.io/devices"),
            Some("72")
        );
        assert!(!hard.keys().any(|k| k.contains('*')), "{hard:?}");
        assert!(!hard.keys().any(|k| k.starts_with("limits.")), "{hard:?}");
        let q = quota("team-a", hard, &policy());
        assert_eq!(q.metadata.labels.unwrap()[POLICY_LABEL], "gate");
        assert_eq!(q.metadata.owner_references.unwrap()[0].uid, "u-1");
    }

    #[test]
    fn over_budget_every_limit_stops_at_what_is_in_use() {
        let used = BTreeMap::from([
            ("requests.nvidia.com/gpu".to_string(), Quantity("16".into())),
            ("requests.amd.com/gpu".to_string(), Quantity("0".into())),
        ]);
        let hard = hard_limits(72, &GpuResources::default(), &[], Some(&used));
        assert_eq!(hard["requests.nvidia.com/gpu"], Quantity("16".into()));
        assert_eq!(hard["requests.amd.com/gpu"], Quantity("0".into()));
        // Not reported in use: nothing of it may be added.
        assert_eq!(hard["requests.habana.ai/gaudi"], Quantity("0".into()));
        // In use beyond what is allowed: the allowance still caps it.
        let used = BTreeMap::from([("requests.nvidia.com/gpu".to_string(), Quantity("99".into()))]);
        let hard = hard_limits(72, &GpuResources::default(), &[], Some(&used));
        assert_eq!(hard["requests.nvidia.com/gpu"], Quantity("72".into()));
    }

    #[test]
    fn the_figure_stops_at_what_the_budget_pays_for_until_the_month_ends() {
        let mut p = policy();
        p.spec.cost.default_hourly_usd = 2.0;
        p.spec.admission.as_mut().unwrap().monthly_budget_usd = Some(12_000.0);
        p.status = serde_json::from_value(json!({"namespaceSpend": [
            {"namespace": "team-a", "month": "2026-11", "spentUsd": 2000.0}]}))
        .unwrap();
        let rules = p.spec.admission.clone().unwrap();
        let good = attestation(1, 1, "2030-01-01T00:00:00Z", 64);
        // 21 days left at 2 USD per GPU-hour: 1,008 USD a GPU; the 10,000 USD left pays
        // for 9 GPUs, not the 72 the attestation allows.
        assert_eq!(figure(&p, &rules, "team-a", &[&good], now()), 9);
        // Another namespace has spent nothing: 11 GPUs.
        assert_eq!(figure(&p, &rules, "team-b", &[&good], now()), 11);
        // Without a budget, G1 alone.
        let mut free = rules.clone();
        free.monthly_budget_usd = None;
        assert_eq!(figure(&p, &free, "team-a", &[&good], now()), 72);
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

    #[test]
    fn a_lapsed_approval_turns_false_at_the_time_it_is_seen_not_in_1970() {
        // The controller writes this condition as is: Approved went True -> False now.
        let stale = attestation(2, 1, "2030-01-01T00:00:00Z", 64);
        let c = approval_condition(&stale, now()).unwrap();
        assert_eq!(c.last_transition_time, Time(now()));
        let expired = attestation(1, 1, "2026-01-01T00:00:00Z", 64);
        let c = approval_condition(&expired, now()).unwrap();
        assert_eq!(c.last_transition_time, Time(now()));
    }
}
