//! The checks an attestation passes or fails for a claim: approved for its current spec
//! and object, unexpired, with room, with the evidence the policy requires. Pure; used by
//! the decision, by the quota and attestation conditions the controller keeps
//! (`quota`), and by the tests.

use jiff::Timestamp;

use super::model::Check;
use crate::api::ReadinessAttestation;
use crate::api::attestation::APPROVED;
use crate::api::policy::AdmissionSpec;

/// Approved for its current spec and unexpired: counts toward what a namespace may hold.
pub fn standing(a: &ReadinessAttestation, now: Timestamp) -> bool {
    matches!(
        check_attestation_held(a, 0.0, 0.0, 0.0, &AdmissionSpec::default(), now),
        Check::Passes
    )
}

/// Runs the checks of one attestation against a claim of `gpus`, nothing else held.
pub fn check_attestation(
    a: &ReadinessAttestation,
    gpus: f64,
    rules: &AdmissionSpec,
    now: Timestamp,
) -> Check {
    check_attestation_held(a, gpus, gpus, 0.0, rules, now)
}

/// Runs the checks of one attestation against a claim of `gpus` that adds `added` to the
/// `held` GPUs the workloads it selects hold now: its `maxGpus` is one budget for all.
pub fn check_attestation_held(
    a: &ReadinessAttestation,
    gpus: f64,
    added: f64,
    held: f64,
    rules: &AdmissionSpec,
    now: Timestamp,
) -> Check {
    let status = a.status.as_ref();
    let approved = status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == APPROVED && c.status == "True")
    });
    if !approved {
        return Check::NotApproved;
    }
    let approved_generation = status.and_then(|s| s.approved_generation);
    if approved_generation.is_none() || approved_generation != a.metadata.generation {
        return Check::StaleApproval {
            approved: approved_generation,
            current: a.metadata.generation,
        };
    }
    if let Some(status) = status
        && !status.approves_object(a.metadata.uid.as_deref())
    {
        return Check::OtherObject {
            approved: status.approved_uid.clone().unwrap_or_default(),
            current: a.metadata.uid.clone(),
        };
    }
    if now >= a.spec.expires_at.0 {
        return Check::Expired {
            at: a.spec.expires_at.0,
        };
    }
    let max = f64::from(a.spec.max_gpus);
    if max < gpus || max < held + added {
        return Check::TooFewGpus {
            max: a.spec.max_gpus,
            held,
        };
    }
    if let Some(required) = &rules.require_evidence {
        if let Some(min) = required.min_data_throughput_g_bps_per_gpu {
            let per_gpu = a.spec.evidence.data_throughput_g_bps.unwrap_or(0.0) / gpus.max(1e-9);
            if per_gpu < min {
                return Check::LowThroughput {
                    per_gpu,
                    required: min,
                };
            }
        }
        if required.checkpointing && !a.spec.evidence.checkpointing {
            return Check::NoCheckpointing;
        }
    }
    Check::Passes
}
