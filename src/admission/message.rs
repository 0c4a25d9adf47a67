//! The sentences `kubectl` prints: what was claimed, which rule, what exactly is missing,
//! and the next step. One sentence each; see docs/budget-gate.md for what they mean.

use jiff::Timestamp;

use super::model::{Check, Reason};
use crate::gpus::{CountError, DeviceGrant, Route, Vendor};

/// Where the budget-gate documentation lives, named in every denial.
pub const DOCS: &str = "docs/budget-gate.md";

/// Where the node settings that close what the gate cannot see are documented.
pub const SECURITY_DOCS: &str = "docs/security.md";

/// The workload a message is about.
pub struct Subject<'a> {
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub policy: &'a str,
    pub large: u32,
}

impl Subject<'_> {
    fn who(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }

    fn claims(&self, gpus: f64) -> String {
        format!(
            "{} claims {} GPU{}, more than the {} GpuPolicy {:?} admits without a ReadinessAttestation",
            self.who(),
            gpu_count(gpus),
            if gpus == 1.0 { "" } else { "s" },
            self.large,
            self.policy
        )
    }
}

/// A GPU count: whole numbers as integers, MIG fractions with two decimals.
pub fn gpu_count(gpus: f64) -> String {
    if gpus.fract() == 0.0 {
        format!("{gpus:.0}")
    } else {
        format!("{gpus:.2}")
    }
}

/// Dollars with thousands separators, no cents: `51,200`.
pub fn usd(amount: f64) -> String {
    let whole = amount.round().abs() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if amount < 0.0 { format!("-{out}") } else { out }
}

pub fn unreadable(s: &Subject, e: &CountError) -> String {
    format!(
        "{} cannot be checked by the GPU budget gate of GpuPolicy {:?} because {e}; fix that field and apply again.",
        s.who(),
        s.policy
    )
}

/// A container that reaches GPU devices without requesting them (the first of
/// `1 + more` such places in the object).
pub fn uncounted_devices(s: &Subject, grant: &DeviceGrant, more: usize) -> String {
    let wanted = match grant.vendor {
        Vendor::Any => "a GPU resource".to_string(),
        vendor => vendor.resource().to_string(),
    };
    let limits = match grant.vendor {
        Vendor::Any => "limits: nvidia.com/gpu: N, or your GPUs' resource".to_string(),
        vendor => format!("limits: {}: N", vendor.resource()),
    };
    let (remove, admins) = match &grant.route {
        Route::Variable { name, .. } if name == "NVIDIA_VISIBLE_DEVICES" => (
            "remove the variable",
            "; cluster admins should also set accept-nvidia-visible-devices-envvar-when-unprivileged = false in the NVIDIA container toolkit",
        ),
        Route::Variable { .. } => (
            "remove the variable",
            "; cluster admins should also keep amd-container-runtime from being the nodes' default runtime",
        ),
        Route::HostPath { .. } => (
            "remove the volume",
            "; Pod Security's baseline level forbids hostPath volumes",
        ),
        Route::DeviceListMount { .. } => ("remove the mount", ""),
        Route::Privileged => (
            "drop privileged",
            "; Pod Security's baseline level forbids privileged containers",
        ),
    };
    let of = if s.kind == "Pod" { "" } else { " of its pods" };
    let others = match more {
        0 => String::new(),
        1 => " (and 1 more place)".to_string(),
        n => format!(" (and {n} more places)"),
    };
    format!(
        "{} asks for GPU devices through {} in {}{of}{others} without requesting {wanted}: request the GPUs as resources ({limits}) so they are counted, or {remove}{admins} ({SECURITY_DOCS}).",
        s.who(),
        grant.route,
        grant.container,
    )
}

/// The first names of a list, and how many more (a warning stays one line however many
/// a pod names).
fn some_names(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

pub fn unresolved_templates(s: &Subject, names: &[String]) -> String {
    format!(
        "{} uses ResourceClaimTemplate {} that the GPU budget gate has not seen, so its GPUs there were not counted until its claims are made; create the template before the workload.",
        s.who(),
        some_names(names)
    )
}

pub fn unresolved_claims(s: &Subject, names: &[String]) -> String {
    format!(
        "{} names ResourceClaim {} that the GPU budget gate has not seen, so its GPUs there were not counted until the claim is made; create the claim before the workload.",
        s.who(),
        some_names(names)
    )
}

/// A namespace's standing against its monthly budget.
pub struct Spend {
    /// Spent so far this month.
    pub spent: f64,
    /// GPUs it holds now.
    pub held: f64,
    /// What those cost until the month ends.
    pub committed: f64,
    pub budget: f64,
}

pub fn over_budget(s: &Subject, gpus: f64, cost: f64, spend: Spend, month: &str) -> String {
    let holding = if spend.held > 0.0 {
        format!(
            ", and the {} GPUs it holds now will cost about {} USD more by then",
            gpu_count(spend.held),
            usd(spend.committed)
        )
    } else {
        String::new()
    };
    format!(
        "{} claims {} GPUs, which would cost about {} USD by the end of {month}, and namespace {} has used {} of its {} USD budget for {month} under GpuPolicy {:?}{holding}, leaving {} USD; ask the platform team to raise spec.admission.monthlyBudgetUsd, or claim fewer GPUs (see {DOCS}).",
        s.who(),
        gpu_count(gpus),
        usd(cost),
        s.namespace,
        usd(spend.spent),
        usd(spend.budget),
        s.policy,
        usd((spend.budget - spend.spent - spend.committed).max(0.0)),
    )
}

pub fn open_ended(s: &Subject, gpus: f64, why: &str) -> String {
    format!(
        "{} claims at least {} GPU{} with no upper bound the GPU budget gate of GpuPolicy {:?} can count, because {why}, so it is refused as a claim above the namespace's allowance (see {DOCS}).",
        s.who(),
        gpu_count(gpus),
        if gpus == 1.0 { "" } else { "s" },
        s.policy
    )
}

pub fn over_allowance(
    s: &Subject,
    gpus: f64,
    held: f64,
    added: f64,
    allowance: f64,
    capacity: f64,
) -> String {
    over_total(&s.who(), s, gpus, held, added, allowance, capacity)
}

/// An object a listed controller makes for a gated owner (a CronJob's Job, a
/// ReplicaSet's pod, a pod's ResourceClaim) that would take the namespace past its total.
pub fn owned_over_allowance(
    s: &Subject,
    owner: (&str, &str),
    gpus: f64,
    held: f64,
    added: f64,
    allowance: f64,
    capacity: f64,
) -> String {
    let who = format!("{}, which {} {} creates,", s.who(), owner.0, owner.1);
    over_total(&who, s, gpus, held, added, allowance, capacity)
}

fn over_total(
    who: &str,
    s: &Subject,
    gpus: f64,
    held: f64,
    added: f64,
    allowance: f64,
    capacity: f64,
) -> String {
    format!(
        "{who} claims {} GPUs, but namespace {} already holds {} GPUs and may hold {} under GpuPolicy {:?} ({} without an attestation plus the maxGpus of its approved, unexpired ReadinessAttestations), so {} more do not fit; free GPUs, or create a ReadinessAttestation for the workload and ask an approver to run `gpu-reaper attest approve {}/<name>` (see {DOCS}).",
        gpu_count(gpus),
        s.namespace,
        gpu_count(held),
        gpu_count(capacity),
        s.policy,
        gpu_count(allowance),
        gpu_count(added),
        s.namespace,
    )
}

/// An update of a running pod's KAI GPU share.
pub fn share_changed(s: &Subject, annotation: &str) -> String {
    format!(
        "{} may not change its {annotation:?} annotation after it is created: it is the pod's GPU share, which the GPU budget gate of GpuPolicy {:?} counts; delete the pod and create it with the share it needs (see {DOCS}).",
        s.who(),
        s.policy
    )
}

pub fn unattested_allowance(
    s: &Subject,
    gpus: f64,
    held: f64,
    added: f64,
    allowance: f64,
) -> String {
    format!(
        "{} claims {} GPUs, but namespace {} already holds {} GPUs outside any approved ReadinessAttestation and GpuPolicy {:?} allows {} in all without one, so {} more do not fit; free GPUs, or create a ReadinessAttestation that selects the workload and ask an approver to run `gpu-reaper attest approve {}/<name>` (see {DOCS}).",
        s.who(),
        gpu_count(gpus),
        s.namespace,
        gpu_count(held),
        s.policy,
        gpu_count(allowance),
        gpu_count(added),
        s.namespace,
    )
}

pub fn no_attestation(s: &Subject, gpus: f64) -> String {
    format!(
        "{}, and no ReadinessAttestation in namespace {} selects its labels; create one that does (see {DOCS}) and ask an approver to run `gpu-reaper attest approve {}/<name>`.",
        s.claims(gpus),
        s.namespace,
        s.namespace
    )
}

/// The reason and sentence for an attestation that selects the workload but fails `check`.
pub fn attestation_failure(s: &Subject, gpus: f64, name: &str, check: &Check) -> (Reason, String) {
    let full = format!("{}/{}", s.namespace, name);
    let approve = format!("`gpu-reaper attest approve {full}`");
    let (reason, problem, next) = match check {
        Check::NotApproved => (
            Reason::NotApproved,
            format!("ReadinessAttestation {full} is not approved"),
            format!("ask an approver to review it and run {approve}"),
        ),
        Check::StaleApproval { approved, current } => (
            Reason::StaleApproval,
            match approved {
                Some(g) => format!(
                    "ReadinessAttestation {full} was approved for generation {g} but its spec has changed since (generation {})",
                    current.map_or("unknown".to_string(), |c| c.to_string())
                ),
                None => format!(
                    "ReadinessAttestation {full} is marked approved without status.approvedGeneration"
                ),
            },
            format!("ask an approver to review the change and run {approve} again"),
        ),
        Check::OtherObject { approved, current } => (
            Reason::StaleApproval,
            format!(
                "ReadinessAttestation {full} was approved as another object of that name (uid {approved}), not this one (uid {}): it was deleted and created again since",
                current.as_deref().unwrap_or("unknown")
            ),
            format!("ask an approver to review it and run {approve}"),
        ),
        Check::Expired { at } => (
            Reason::Expired,
            format!("ReadinessAttestation {full} expired on {}", day(*at)),
            format!("set a later spec.expiresAt and ask an approver to run {approve}"),
        ),
        Check::TooFewGpus { max, held } if *held > 0.0 => (
            Reason::TooFewGpus,
            format!(
                "ReadinessAttestation {full} covers {max} GPUs in all and the workloads it selects already hold {} of them",
                gpu_count(*held)
            ),
            format!(
                "free GPUs it covers, or raise spec.maxGpus and ask an approver to run {approve}"
            ),
        ),
        Check::TooFewGpus { max, .. } => (
            Reason::TooFewGpus,
            format!(
                "ReadinessAttestation {full} covers {max} of the {} GPUs",
                gpu_count(gpus)
            ),
            format!(
                "claim at most {max} GPUs, or raise spec.maxGpus and ask an approver to run {approve}"
            ),
        ),
        Check::LowThroughput { per_gpu, required } => (
            Reason::InsufficientEvidence,
            format!(
                "ReadinessAttestation {full} attests {per_gpu:.2} GB/s of data throughput per GPU, below the {required} GB/s the policy requires"
            ),
            format!(
                "record a measured spec.evidence.dataThroughputGBps of at least {:.1} and ask an approver to run {approve}",
                required * gpus
            ),
        ),
        Check::NoCheckpointing => (
            Reason::InsufficientEvidence,
            format!(
                "ReadinessAttestation {full} does not attest spec.evidence.checkpointing, which the policy requires"
            ),
            format!("make the job checkpoint, set it to true and ask an approver to run {approve}"),
        ),
        Check::Passes => (Reason::Attested, String::new(), String::new()),
    };
    (
        reason,
        format!("{}, and {problem}; {next}.", s.claims(gpus)),
    )
}

fn day(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_get_thousands_separators() {
        assert_eq!(usd(51_200.4), "51,200");
        assert_eq!(usd(999.0), "999");
        assert_eq!(usd(1_000_000.0), "1,000,000");
        assert_eq!(usd(0.0), "0");
    }

    #[test]
    fn whole_gpu_counts_print_as_integers_and_mig_slices_with_decimals() {
        assert_eq!(gpu_count(16.0), "16");
        assert_eq!(gpu_count(2.0 / 7.0), "0.29");
    }
}
