//! The budget gate's decision: a pure function of the request, a snapshot of the caches
//! and the time. No IO here (invariant 9: never a call per request).
//!
//! Order of the rules for a workload: not a GPU claim → allow; no policy with admission
//! rules → allow; an update that does not raise the GPU count → allow; at or below
//! `largeClaimGpus` → allow; namespace over its monthly budget → deny; an attestation that
//! selects it and is approved for its current spec, unexpired, large enough and with the
//! evidence the policy requires → allow; otherwise deny, naming the closest attestation's
//! first failing check. `Warn` mode turns every deny into an allow with a warning.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use serde_json::Value;

use super::count::{self, ClaimTemplates, Counted, GpuResources};
use super::message;
use super::review::{AdmissionRequest, Operation};
use crate::api::attestation::APPROVED;
use crate::api::policy::{self, AdmissionMode, AdmissionSpec};
use crate::api::{GpuPolicy, ReadinessAttestation, selector};

/// What the webhook's caches hold, indexed for the decision.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every GpuPolicy.
    pub policies: Vec<Arc<GpuPolicy>>,
    /// ReadinessAttestations by namespace.
    pub attestations: HashMap<String, Vec<Arc<ReadinessAttestation>>>,
    /// Namespace labels by name.
    pub namespaces: HashMap<String, BTreeMap<String, String>>,
    /// GPUs per pod of each DRA ResourceClaimTemplate, by (namespace, name).
    pub claim_templates: HashMap<(String, String), f64>,
}

impl Snapshot {
    /// Indexes the cached objects.
    pub fn build(
        policies: impl IntoIterator<Item = Arc<GpuPolicy>>,
        attestations: impl IntoIterator<Item = Arc<ReadinessAttestation>>,
        namespaces: impl IntoIterator<Item = (String, BTreeMap<String, String>)>,
        claim_templates: HashMap<(String, String), f64>,
    ) -> Self {
        let mut by_namespace: HashMap<String, Vec<Arc<ReadinessAttestation>>> = HashMap::new();
        for a in attestations {
            let ns = a.metadata.namespace.clone().unwrap_or_default();
            by_namespace.entry(ns).or_default().push(a);
        }
        let mut policies: Vec<_> = policies.into_iter().collect();
        policies.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Self {
            policies,
            attestations: by_namespace,
            namespaces: namespaces.into_iter().collect(),
            claim_templates,
        }
    }

    /// Number of attestations cached.
    pub fn attestation_count(&self) -> usize {
        self.attestations.values().map(Vec::len).sum()
    }
}

/// Why the gate decided as it did; the `reason` label of the decision metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Not a write the gate reviews (delete, connect, a kind that claims no GPUs).
    NotAClaim,
    /// A pod created by a controller: the controller's object was gated.
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
    /// The namespace's monthly budget is used up.
    OverBudget,
    /// The object cannot be read (a field of the wrong type).
    Unreadable,
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
            Reason::Unreadable => "unreadable",
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
    fn allow(reason: Reason) -> Self {
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

/// How the gate counts GPUs.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub resources: GpuResources,
}

struct Templates<'a>(&'a HashMap<(String, String), f64>);

impl ClaimTemplates for Templates<'_> {
    fn gpus(&self, namespace: &str, name: &str) -> Option<f64> {
        self.0
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
    }
}

/// The month of `now` as `YYYY-MM` (UTC), the key of published namespace spend.
pub fn month_of(now: Timestamp) -> String {
    now.strftime("%Y-%m").to_string()
}

/// Decides one admission request.
pub fn admit(
    request: &AdmissionRequest,
    snapshot: &Snapshot,
    settings: &Settings,
    now: Timestamp,
) -> Decision {
    if matches!(request.operation, Operation::Delete | Operation::Connect) {
        return Decision::allow(Reason::NotAClaim);
    }
    if request.kind.group == crate::api::GROUP && request.kind.kind == "ReadinessAttestation" {
        return super::attestation::validate(request, now);
    }
    // `kubectl scale` sends a Scale object without the pod template: nothing to count.
    if request.sub_resource.is_some() {
        return Decision::allow(Reason::NotAClaim);
    }
    let Some(object) = &request.object else {
        return Decision::allow(Reason::NotAClaim);
    };
    let templates = Templates(&snapshot.claim_templates);
    let counted = count::count(object, &request.namespace, &settings.resources, &templates);
    if let Ok(Counted::NotGoverned) = counted {
        return Decision::allow(Reason::NotAClaim);
    }
    let empty = BTreeMap::new();
    let namespace_labels = snapshot
        .namespaces
        .get(&request.namespace)
        .unwrap_or(&empty);
    let labels = object_labels(object);
    let kind = request.kind.kind.as_str();
    let (policy, _) = policy::select(
        snapshot.policies.iter().map(|p| p.as_ref()),
        kind,
        namespace_labels,
        &labels,
    );
    // Only a controller's own write is trusted to carry a controller ownerReference: a
    // person (or a token the team holds) could write one by hand to slip a bare pod past
    // the gate, so theirs is counted as if the reference were not there.
    let counted = match counted {
        Ok(Counted::OwnedBy { .. })
            if is_controller_identity(&request.user_info.username, &request.namespace) =>
        {
            return Decision::allow(Reason::OwnedByController);
        }
        Ok(Counted::OwnedBy { .. }) => {
            let mut bare = object.clone();
            if let Some(meta) = bare["metadata"].as_object_mut() {
                meta.remove("ownerReferences");
            }
            count::count(&bare, &request.namespace, &settings.resources, &templates)
        }
        other => other,
    };
    let counted = match counted {
        Ok(Counted::NotGoverned | Counted::OwnedBy { .. }) => {
            return Decision::allow(Reason::NotAClaim);
        }
        Ok(Counted::Claim(claim)) => Ok(claim),
        Err(e) => Err(e),
    };
    let Some((policy, rules)) = policy.and_then(|p| p.spec.admission.as_ref().map(|a| (p, a)))
    else {
        let mut d = Decision::allow(Reason::NoPolicy);
        d.gpus = counted.ok().map(|c| c.gpus);
        return d;
    };
    let subject = message::Subject {
        kind,
        namespace: &request.namespace,
        name: workload_name(request, object),
        policy: policy.metadata.name.as_deref().unwrap_or_default(),
        large: rules.large_claim_gpus,
    };
    let claim = match counted {
        Ok(claim) => claim,
        Err(e) => {
            let text = message::unreadable(&subject, &e);
            return finish(
                rules,
                Reason::Unreadable,
                text,
                policy,
                None,
                None,
                Vec::new(),
            );
        }
    };
    let mut warnings = Vec::new();
    if !claim.unresolved_claim_templates.is_empty() {
        warnings.push(message::unresolved_templates(
            &subject,
            &claim.unresolved_claim_templates,
        ));
    }
    let allow = |reason| Decision {
        gpus: Some(claim.gpus),
        policy: policy.metadata.name.clone(),
        warnings: warnings.clone(),
        ..Decision::allow(reason)
    };
    if request.operation == Operation::Update
        && let Some(old) = &request.old_object
        && let Ok(Counted::Claim(before)) =
            count::count(old, &request.namespace, &settings.resources, &templates)
        && claim.gpus <= before.gpus
    {
        return allow(Reason::NotIncreased);
    }
    if claim.gpus <= f64::from(rules.large_claim_gpus) {
        return allow(Reason::WithinLimit);
    }
    if let Some(budget) = rules.monthly_budget_usd {
        let month = month_of(now);
        let spent = policy.spend_of(&request.namespace, &month);
        if spent >= budget {
            let text = message::over_budget(&subject, claim.gpus, spent, budget, &month);
            return finish(
                rules,
                Reason::OverBudget,
                text,
                policy,
                Some(claim.gpus),
                None,
                warnings,
            );
        }
    }
    let candidates: Vec<&ReadinessAttestation> = snapshot
        .attestations
        .get(&request.namespace)
        .into_iter()
        .flatten()
        .map(|a| a.as_ref())
        .filter(|a| {
            claim
                .label_sets
                .iter()
                .any(|labels| selector::matches(&a.spec.selector, labels))
        })
        .collect();
    // The candidate that gets furthest through the checks; on a tie, the first by name.
    let mut best: Option<(usize, Check, &ReadinessAttestation)> = None;
    for a in candidates {
        let check = check_attestation(a, claim.gpus, rules, now);
        let rank = check.rank();
        let better = best
            .as_ref()
            .is_none_or(|(r, _, b)| rank > *r || (rank == *r && a.metadata.name < b.metadata.name));
        if better {
            best = Some((rank, check, a));
        }
    }
    let Some((_, check, attestation)) = best else {
        let text = message::no_attestation(&subject, claim.gpus);
        return finish(
            rules,
            Reason::NoAttestation,
            text,
            policy,
            Some(claim.gpus),
            None,
            warnings,
        );
    };
    let name = attestation.metadata.name.clone().unwrap_or_default();
    if check == Check::Passes {
        let mut d = allow(Reason::Attested);
        d.attestation = Some(name);
        return d;
    }
    let (reason, text) = message::attestation_failure(&subject, claim.gpus, &name, &check);
    finish(
        rules,
        reason,
        text,
        policy,
        Some(claim.gpus),
        Some(name),
        warnings,
    )
}

fn finish(
    rules: &AdmissionSpec,
    reason: Reason,
    message: String,
    policy: &GpuPolicy,
    gpus: Option<f64>,
    attestation: Option<String>,
    warnings: Vec<String>,
) -> Decision {
    Decision {
        verdict: match rules.mode {
            AdmissionMode::Enforce => Verdict::Deny,
            AdmissionMode::Warn => Verdict::Warn,
        },
        reason,
        message: Some(message),
        warnings,
        gpus,
        policy: policy.metadata.name.clone(),
        attestation,
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
    Expired {
        at: Timestamp,
    },
    TooFewGpus {
        max: u32,
    },
    LowThroughput {
        per_gpu: f64,
        required: f64,
    },
    NoCheckpointing,
    Passes,
}

impl Check {
    fn rank(&self) -> usize {
        match self {
            Check::NotApproved => 0,
            Check::StaleApproval { .. } => 1,
            Check::Expired { .. } => 2,
            Check::TooFewGpus { .. } => 3,
            Check::LowThroughput { .. } | Check::NoCheckpointing => 4,
            Check::Passes => 5,
        }
    }
}

/// Runs the checks of one attestation against a claim of `gpus`.
pub fn check_attestation(
    a: &ReadinessAttestation,
    gpus: f64,
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
    if now >= a.spec.expires_at.0 {
        return Check::Expired {
            at: a.spec.expires_at.0,
        };
    }
    if f64::from(a.spec.max_gpus) < gpus {
        return Check::TooFewGpus {
            max: a.spec.max_gpus,
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

/// Service accounts (controllers) and the control plane's own identities.
/// Whether a write comes from a controller: a `system:` identity, except the anonymous
/// user and the ServiceAccounts of the object's own namespace. The team that owns a
/// namespace holds those tokens (a CI bot's, a notebook's), so a reference written with
/// one is no proof that a gated workload made the pod. Controllers run as their own
/// namespace's ServiceAccounts (kube-system, kserve, ray-system, …) or as
/// `system:kube-controller-manager`. The chart's `not-a-controller-made-pod`
/// matchCondition says the same in CEL.
fn is_controller_identity(username: &str, namespace: &str) -> bool {
    let own_service_account = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(ns, _)| ns == namespace);
    username.starts_with("system:") && username != "system:anonymous" && !own_service_account
}

fn object_labels(object: &Value) -> BTreeMap<String, String> {
    selector::string_map(&object["metadata"]["labels"])
}

fn workload_name<'a>(request: &'a AdmissionRequest, object: &'a Value) -> &'a str {
    if !request.name.is_empty() {
        return &request.name;
    }
    object["metadata"]["name"]
        .as_str()
        .or_else(|| object["metadata"]["generateName"].as_str())
        .unwrap_or("<unnamed>")
}
