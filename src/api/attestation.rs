//! `ReadinessAttestation`: a team's proof that its data pipeline can feed the GPUs it asks
//! for. The budget gate admits large GPU claims only with an approved, unexpired one.

// kube's `printcolumn(...)` repeats `type_ =` per column, which clippy mistakes for a
// duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A ReadinessAttestation is written by a team to show that its data pipeline can feed
/// the GPUs it asks for. Once an approver sets the `Approved` condition (RBAC on the
/// status subresource), GPU claims it covers may exceed the policy's `largeClaimGpus`.
/// Editing the spec after approval voids the approval: it binds to `approvedGeneration`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpureaper.io",
    version = "v1alpha1",
    kind = "ReadinessAttestation",
    plural = "readinessattestations",
    shortname = "attest",
    shortname = "ra",
    category = "gpu-reaper",
    namespaced,
    status = "ReadinessAttestationStatus",
    derive = "PartialEq",
    cel,
    printcolumn(name = "Max GPUs", type_ = "integer", json_path = ".spec.maxGpus"),
    printcolumn(name = "Expires", type_ = "string", json_path = ".spec.expiresAt"),
    printcolumn(
        name = "Approved",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Approved\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Approved\")].reason"
    ),
    printcolumn(
        name = "Approved By",
        type_ = "string",
        json_path = ".status.approvedBy",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessAttestationSpec {
    /// Labels of the workloads (pods, or the pod template of a Job/Deployment/…) this
    /// attestation covers, in its namespace.
    pub selector: LabelSelector,
    /// Most GPUs the workloads it selects may hold together: one budget shared by every
    /// covered claim.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000000").message("spec.maxGpus must be between 1 and 1000000"))]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_gpus: u32,
    /// After this time (RFC 3339) the attestation no longer covers anything.
    pub expires_at: Time,
    /// Who answers for the workloads; warnings go here.
    #[serde(default)]
    pub owner: Owner,
    /// What the team attests about its pipeline.
    #[serde(default)]
    pub evidence: Evidence,
}

/// Contact for a team or workload.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// Email address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// Slack member ID (e.g. `U0123ABC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack: Option<String>,
}

/// What a team attests about its data pipeline.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    /// Where the training or serving data lives, e.g. `s3://bucket/llama/v3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_uri: Option<String>,
    /// Aggregate data throughput the loader sustains, GB/s, as measured by the team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("spec.evidence.dataThroughputGBps must not be negative"))]
    pub data_throughput_g_bps: Option<f64>,
    /// Network bandwidth available to the job, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0").message("spec.evidence.networkGbps must not be negative"))]
    pub network_gbps: Option<f64>,
    /// The job checkpoints, so it can be suspended and resumed.
    #[serde(default)]
    pub checkpointing: bool,
    /// Anything else the approver should know (benchmark link, ticket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

/// Approval state, written only by approvers through the status subresource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessAttestationStatus {
    /// `Approved` (True/False), keyed on type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Who approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// The `metadata.generation` that was approved; any later spec edit voids the approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_generation: Option<i64>,
    /// The `metadata.uid` of the object that was approved. An attestation deleted and
    /// created again under the same name is another object: an approval of the first
    /// never counts for the second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_uid: Option<String>,
}

/// Condition type set by approvers.
pub const APPROVED: &str = "Approved";

impl ReadinessAttestationStatus {
    /// Whether this approval was made for the object with `uid`. An approval that records
    /// no uid (written before `approvedUid` existed) is taken as this object's: a status
    /// never outlives its object, so it cannot have come from another one, and the
    /// webhook refuses every new approval that does not name the object's uid.
    pub fn approves_object(&self, uid: Option<&str>) -> bool {
        self.approved_uid.is_none() || self.approved_uid.as_deref() == uid
    }
}
