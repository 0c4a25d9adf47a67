//! What the gate answers, shared by the decision (`decide`), the sentences (`message`)
//! and the attestation rules (`attestation`), so none of them imports another's types.

use jiff::Timestamp;

/// Why the gate decided as it did; the `reason` label of the decision metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Not a write the gate reviews (delete, connect, a kind that claims no GPUs).
    NotAClaim,
    /// An object a listed controller created or changed for a gated owner, within the
    /// namespace's total and budget: the owner was gated.
    OwnedByController,
    /// No GpuPolicy matches, or the matching one has no admission rules.
    NoPolicy,
    /// An update that does not raise the GPU count.
    NotIncreased,
    /// At or below `largeClaimGpus`.
    WithinLimit,
    /// Covered by an approved attestation.
    Attested,
    /// No attestation in the namespace selects the workload.
    NoAttestation,
    /// The attestation has no `Approved=True` condition.
    NotApproved,
    /// Approved for an older spec.
    StaleApproval,
    /// Past `spec.expiresAt`.
    Expired,
    /// `spec.maxGpus` below the claim.
    TooFewGpus,
    /// Evidence below the policy's requirement.
    InsufficientEvidence,
    /// The claim's cost until the month's end does not fit the namespace's budget left.
    OverBudget,
    /// The namespace would hold more GPUs than its unattested allowance plus its
    /// approved, unexpired attestations (G1).
    OverAllowance,
    /// The claim has no bound the gate can see (a DaemonSet on unknown nodes, a CronJob
    /// whose runs overlap, a kind it cannot count, the scale of a parent it has not seen).
    OpenEnded,
    /// An approval written by the person who last changed the attestation's spec.
    SelfApproval,
    /// The object cannot be read (a field of the wrong type).
    Unreadable,
    /// A container reaches GPU devices without requesting them as resources (a device
    /// variable such as `NVIDIA_VISIBLE_DEVICES`, a device hostPath, NVIDIA's device-list
    /// mount, a privileged container), so no count would see them.
    UncountedDevices,
    /// An update that changes the KAI GPU share (`gpu-fraction`, `gpu-memory`) of a pod
    /// that exists.
    ShareChanged,
    /// A ReadinessAttestation write that is valid.
    AttestationValid,
    /// A ReadinessAttestation write that breaks a rule CEL cannot express.
    AttestationInvalid,
}

impl Reason {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotAClaim => "not_a_claim",
            Reason::OwnedByController => "owned_by_controller",
            Reason::NoPolicy => "no_policy",
            Reason::NotIncreased => "not_increased",
            Reason::WithinLimit => "within_limit",
            Reason::Attested => "attested",
            Reason::NoAttestation => "no_attestation",
            Reason::NotApproved => "not_approved",
            Reason::StaleApproval => "stale_approval",
            Reason::Expired => "expired",
            Reason::TooFewGpus => "too_few_gpus",
            Reason::InsufficientEvidence => "insufficient_evidence",
            Reason::OverBudget => "over_budget",
            Reason::OverAllowance => "over_allowance",
            Reason::OpenEnded => "open_ended",
            Reason::SelfApproval => "self_approval",
            Reason::Unreadable => "unreadable",
            Reason::UncountedDevices => "uncounted_devices",
            Reason::ShareChanged => "share_changed",
            Reason::AttestationValid => "attestation_valid",
            Reason::AttestationInvalid => "attestation_invalid",
        }
    }
}

/// Allowed, allowed with a warning (Warn mode), or denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Allow,
    Warn,
    Deny,
}

impl Verdict {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Warn => "warn",
            Verdict::Deny => "deny",
        }
    }
}

/// The gate's answer and what it was based on (logged with every decision).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    pub reason: Reason,
    /// The denial or warning sentence.
    pub message: Option<String>,
    /// Extra kubectl warnings (e.g. a count that may be low).
    pub warnings: Vec<String>,
    /// GPUs claimed, when counted.
    pub gpus: Option<f64>,
    /// The GpuPolicy applied.
    pub policy: Option<String>,
    /// The attestation that covered the claim or came closest.
    pub attestation: Option<String>,
}

impl Decision {
    pub(super) fn allow(reason: Reason) -> Self {
        Self {
            verdict: Verdict::Allow,
            reason,
            message: None,
            warnings: Vec::new(),
            gpus: None,
            policy: None,
            attestation: None,
        }
    }

    /// Whether the write is admitted.
    pub fn allowed(&self) -> bool {
        self.verdict != Verdict::Deny
    }

    /// Every warning kubectl should print: the Warn-mode sentence first.
    pub fn all_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.verdict == Verdict::Warn
            && let Some(m) = &self.message
        {
            out.push(m.clone());
        }
        out.extend(self.warnings.iter().cloned());
        out
    }
}

/// The first check an attestation fails, in the order an approver would fix them.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    NotApproved,
    StaleApproval {
        approved: Option<i64>,
        current: Option<i64>,
    },
    /// Approved as another object of the same name (deleted and created again since).
    OtherObject {
        approved: String,
        current: Option<String>,
    },
    Expired {
        at: Timestamp,
    },
    TooFewGpus {
        max: u32,
        /// GPUs the workloads it selects already hold.
        held: f64,
    },
    LowThroughput {
        per_gpu: f64,
        required: f64,
    },
    NoCheckpointing,
    Passes,
}

impl Check {
    pub(super) fn rank(&self) -> usize {
        match self {
            Check::NotApproved => 0,
            Check::StaleApproval { .. } | Check::OtherObject { .. } => 1,
            Check::Expired { .. } => 2,
            Check::TooFewGpus { .. } => 3,
            Check::LowThroughput { .. } | Check::NoCheckpointing => 4,
            Check::Passes => 5,
        }
    }
}
