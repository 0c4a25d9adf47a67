//! How the gate counts GPUs and whose writes of controller-owned objects it trusts: set
//! once at start-up (`commands` builds it from the flags), read by every decision.

use crate::gpus::GpuResources;

/// The identities whose writes of a controller-owned object (a pod of a ReplicaSet, a
/// ReplicaSet of a Deployment, a Job of a CronJob, a claim of a pod) are trusted: the
/// object's owner was gated, so it is not gated twice. kube-controller-manager's own
/// identity and its per-controller ServiceAccounts (`--use-service-account-credentials`).
/// Operators (KubeRay, the training operator, JobSet, …) are added by name
/// (`--trusted-controller`, the chart's `webhook.trustedControllers`), never by a
/// `system:` prefix (G7).
pub const DEFAULT_TRUSTED_CONTROLLERS: [&str; 9] = [
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:replicaset-controller",
    "system:serviceaccount:kube-system:deployment-controller",
    "system:serviceaccount:kube-system:statefulset-controller",
    "system:serviceaccount:kube-system:daemon-set-controller",
    "system:serviceaccount:kube-system:job-controller",
    "system:serviceaccount:kube-system:cronjob-controller",
    "system:serviceaccount:kube-system:replication-controller",
    "system:serviceaccount:kube-system:resource-claim-controller",
];

/// How the gate counts GPUs and whom it trusts.
#[derive(Clone, Debug)]
pub struct Settings {
    pub resources: GpuResources,
    /// Usernames whose writes of controller-owned objects are not asked for an
    /// attestation again (they are still held to the namespace's total).
    pub trusted_controllers: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            resources: GpuResources::default(),
            trusted_controllers: DEFAULT_TRUSTED_CONTROLLERS.map(String::from).to_vec(),
        }
    }
}
