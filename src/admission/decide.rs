//! The budget gate's decision: a pure function of the request, a snapshot of the caches
//! and the time. No IO here (invariant 9: never a call per request).
//!
//! Which rules apply is chosen by namespace only ([`admission_policy`], G6); whether an
//! attestation counts and covers a claim is [`super::checks`]; what the caches hold is the
//! [`Snapshot`]; how GPUs are counted and whom to trust is the [`Settings`].
//!
//! Order of the rules for a write: not a GPU claim → allow; a pod, ReplicaSet or Job a
//! listed controller made for a gated owner → allow; no policy → allow; an update that
//! adds a way for a container to reach GPU devices without requesting them (a device
//! variable, a device hostPath, a privileged container: `gpus::DeviceGrant`) → deny (in
//! `Warn`, a warning and the claim is judged on); an update that
//! does not raise the GPU count → allow; an open-ended claim (no bound the gate can see)
//! → deny; the namespace's GPUs held plus the claim above what it may hold (the
//! unattested allowance plus every approved, unexpired attestation, G1) → deny; the claim
//! at or below `largeClaimGpus` and inside the unattested allowance → allow; else an
//! attestation that selects it, approved for its current spec, unexpired, with room for
//! it next to what the workloads it selects already hold, and with the evidence the
//! policy requires → allow, else deny naming the closest attestation's first failing
//! check. Last, any claim whose cost to the month's end (or the attestation's expiry)
//! does not fit what is left of the monthly budget → deny (G3). `Warn` mode turns every
//! deny into an allow with a warning.
//!
//! Writes to `*/scale` are judged as the replicas they ask for times the per-replica GPUs
//! of the parent the caches hold; an unknown parent is an open-ended claim.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::Value;

use super::budget::{self, month_end, month_of};
use super::checks::{check_attestation_held, standing};
use super::message;
pub use super::model::{Check, Decision, Reason, Verdict};
use super::policy::admission_policy;
use super::review::{AdmissionRequest, Operation};
use super::settings::Settings;
use super::snapshot::{Held, Snapshot, total};
use crate::api::policy::{AdmissionMode, AdmissionSpec};
use crate::api::{GpuPolicy, ReadinessAttestation, selector};
use crate::gpus::{self, Claim, ClaimTemplates, Counted};

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
    if request.sub_resource.as_deref() == Some("scale") {
        return admit_scale(request, snapshot, now);
    }
    // Other subresources (status, binding) carry no GPU requests. Ephemeral containers
    // (`kubectl debug`) request none either, but may reach devices: their write is the
    // whole pod, judged like an update of it.
    if request
        .sub_resource
        .as_deref()
        .is_some_and(|s| s != "ephemeralcontainers")
    {
        return Decision::allow(Reason::NotAClaim);
    }
    let Some(object) = &request.object else {
        return Decision::allow(Reason::NotAClaim);
    };
    let facts: &dyn ClaimTemplates = snapshot;
    let counted = gpus::count(object, &request.namespace, &settings.resources, facts);
    if let Ok(Counted::NotGoverned) = counted {
        return Decision::allow(Reason::NotAClaim);
    }
    // Only a listed controller's own write is trusted to carry a controller
    // ownerReference: a person (or a token the team holds) could write one by hand to slip
    // a bare pod past the gate, so theirs is counted as if the reference were not there.
    let counted = match counted {
        Ok(Counted::OwnedBy { kind, name })
            if settings
                .trusted_controllers
                .contains(&request.user_info.username) =>
        {
            return admit_owned(request, object, (&kind, &name), snapshot, settings, now);
        }
        Ok(Counted::OwnedBy { .. }) => gpus::count(
            &without_owners(object),
            &request.namespace,
            &settings.resources,
            facts,
        ),
        other => other,
    };
    let counted = match counted {
        Ok(Counted::NotGoverned | Counted::OwnedBy { .. }) => {
            return Decision::allow(Reason::NotAClaim);
        }
        Ok(Counted::Claim(claim)) => Ok(claim),
        Err(e) => Err(e),
    };
    let kind = request.kind.kind.as_str();
    let Some(gate) = Gate::new(request, snapshot, workload_name(request, object), kind) else {
        let mut d = Decision::allow(Reason::NoPolicy);
        d.gpus = counted.ok().map(|c| c.gpus);
        return d;
    };
    let claim = match counted {
        Ok(claim) => claim,
        Err(e) => {
            let text = message::unreadable(&gate.subject(), &e);
            return gate.finish(Reason::Unreadable, text, None, None, Vec::new());
        }
    };
    let before = match (&request.operation, &request.old_object) {
        (Operation::Update, Some(old)) => {
            let old = if matches!(
                gpus::count(old, &request.namespace, &settings.resources, facts),
                Ok(Counted::OwnedBy { .. })
            ) {
                without_owners(old)
            } else {
                old.clone()
            };
            match gpus::count(&old, &request.namespace, &settings.resources, facts) {
                // A suspended Job (JobSet, RayJob, Kubeflow job) holds nothing: resuming
                // it claims all of its GPUs again, and is judged as such; so does a
                // Deployment created paused, on its first rollout.
                Ok(Counted::Claim(before))
                    if !resumed(&old, object)
                        && !first_rollout(request, &old, object, snapshot) =>
                {
                    Some(before)
                }
                _ => None,
            }
        }
        _ => None,
    };
    // KAI's GPU share of a pod that exists cannot change: the pod keeps the share it was
    // admitted and scheduled with, and an edit would only hide it from the count.
    if let (Operation::Update, Some(old)) = (&request.operation, &request.old_object)
        && request.kind.kind == "Pod"
        && let Some(annotation) = changed_share_annotation(old, object)
    {
        let text = message::share_changed(&gate.subject(), annotation);
        return gate.finish(
            Reason::ShareChanged,
            text,
            Some(claim.gpus),
            None,
            Vec::new(),
        );
    }
    // Devices reached around the count: only what this write adds (an update that keeps
    // what the object had, such as a label edit or the garbage collector's, goes in).
    let new_grants: Vec<&gpus::DeviceGrant> = claim
        .device_grants
        .iter()
        .filter(|g| before.as_ref().is_none_or(|b| !b.device_grants.contains(g)))
        .collect();
    let devices = new_grants
        .first()
        .map(|g| message::uncounted_devices(&gate.subject(), g, new_grants.len() - 1));
    let mut warnings = Vec::new();
    if let Some(text) = &devices
        && gate.rules.mode == AdmissionMode::Enforce
    {
        return gate.finish(
            Reason::UncountedDevices,
            text.clone(),
            Some(claim.gpus),
            None,
            warnings,
        );
    }
    if !claim.unresolved_claim_templates.is_empty() {
        warnings.push(message::unresolved_templates(
            &gate.subject(),
            &claim.unresolved_claim_templates,
        ));
    }
    if !claim.unresolved_claims.is_empty() {
        warnings.push(message::unresolved_claims(
            &gate.subject(),
            &claim.unresolved_claims,
        ));
    }
    let mut decision = gate.judge(&claim, before.as_ref(), warnings, snapshot, now);
    // Warn mode: the devices are a warning, and the claim is still judged in full.
    if let Some(text) = devices {
        if decision.verdict == Verdict::Allow {
            decision.verdict = Verdict::Warn;
            decision.reason = Reason::UncountedDevices;
            decision.message = Some(text);
        } else {
            decision.warnings.push(text);
        }
    }
    decision
}

/// KAI scheduler's annotations that give a pod a share of a GPU.
const SHARE_ANNOTATIONS: [&str; 2] = ["gpu-fraction", "gpu-memory"];

/// The share annotation an update adds, removes or changes, if any.
fn changed_share_annotation(old: &Value, new: &Value) -> Option<&'static str> {
    SHARE_ANNOTATIONS
        .into_iter()
        .find(|a| old["metadata"]["annotations"][*a] != new["metadata"]["annotations"][*a])
}

/// Whether a Job-like object is suspended (`spec.suspend`, Kubeflow's
/// `spec.runPolicy.suspend`): it holds no GPUs until it is resumed.
fn suspended(object: &Value) -> bool {
    object["spec"]["suspend"] == Value::Bool(true)
        || object["spec"]["runPolicy"]["suspend"] == Value::Bool(true)
}

/// An update that resumes a suspended object: it claims all of its GPUs again.
fn resumed(old: &Value, new: &Value) -> bool {
    suspended(old) && !suspended(new)
}

/// An update that resumes a Deployment created paused, which has never rolled out (no
/// ReplicaSet of it is cached): it holds nothing yet, and resuming it claims all of its
/// GPUs (`kubectl rollout resume`). A paused Deployment that had rolled out keeps its
/// pods, and its resume is judged on what it changes; the ReplicaSet a resume rolls out
/// is held to the namespace's total either way ([`admit_owned`]).
fn first_rollout(
    request: &AdmissionRequest,
    old: &Value,
    new: &Value,
    snapshot: &Snapshot,
) -> bool {
    if request.kind.kind != "Deployment"
        || old["spec"]["paused"] != Value::Bool(true)
        || new["spec"]["paused"] == Value::Bool(true)
    {
        return false;
    }
    let prefix = format!("{}-", request.name);
    !snapshot.scalable.keys().any(|(group, resource, ns, name)| {
        group == "apps"
            && resource == "replicasets"
            && ns == &request.namespace
            && name.starts_with(&prefix)
    })
}

/// A write by a listed controller of an object it owns for a gated owner (the pods of a
/// ReplicaSet, the Jobs of a CronJob, the ReplicaSet a resumed Deployment rolls out, the
/// ResourceClaims of a pod's templates). Its owner passed the gate, so no attestation is
/// asked again, but what it adds must still fit the namespace's total (G1) and budget
/// (G3): the owner was judged against what the namespace held then, and a CronJob's run,
/// a resumed Deployment, a claim template created after its workload add GPUs now.
fn admit_owned(
    request: &AdmissionRequest,
    object: &Value,
    owner: (&str, &str),
    snapshot: &Snapshot,
    settings: &Settings,
    now: Timestamp,
) -> Decision {
    let facts: &dyn ClaimTemplates = snapshot;
    let count = |v: &Value| match gpus::count(
        &without_owners(v),
        &request.namespace,
        &settings.resources,
        facts,
    ) {
        Ok(Counted::Claim(c)) => Some(c),
        _ => None,
    };
    let allow = Decision::allow(Reason::OwnedByController);
    let Some(claim) = count(object) else {
        return allow;
    };
    let Some(gate) = Gate::new(
        request,
        snapshot,
        workload_name(request, object),
        &request.kind.kind,
    ) else {
        return allow;
    };
    let before = match (&request.operation, &request.old_object) {
        (Operation::Update, Some(old)) if !resumed(old, object) => count(old),
        _ => None,
    };
    let own = |c: &Claim| (c.gpus - c.named_claim_gpus).max(0.0);
    let added = (own(&claim) - before.as_ref().map_or(0.0, own)).max(0.0);
    if added <= 0.0 {
        return allow;
    }
    let held = snapshot.held_gpus(&request.namespace);
    let standing: Vec<&ReadinessAttestation> = snapshot
        .attestations
        .get(&request.namespace)
        .into_iter()
        .flatten()
        .map(|a| a.as_ref())
        .filter(|a| standing(a, now))
        .collect();
    let allowance = gate.allowance();
    let capacity = allowance + total(standing.iter().map(|a| f64::from(a.spec.max_gpus)));
    let subject = gate.subject();
    if held + added > capacity {
        let text = message::owned_over_allowance(
            &subject, owner, claim.gpus, held, added, allowance, capacity,
        );
        return gate.finish(
            Reason::OverAllowance,
            text,
            Some(claim.gpus),
            None,
            Vec::new(),
        );
    }
    if let Some(text) = gate.over_budget(&subject, claim.gpus, added, held, month_end(now), now) {
        return gate.finish(Reason::OverBudget, text, Some(claim.gpus), None, Vec::new());
    }
    Decision {
        gpus: Some(claim.gpus),
        policy: gate.policy.metadata.name.clone(),
        ..allow
    }
}

fn without_owners(object: &Value) -> Value {
    let mut bare = object.clone();
    if let Some(meta) = bare["metadata"].as_object_mut() {
        meta.remove("ownerReferences");
    }
    bare
}

/// A write to `<resource>/scale`: an `autoscaling/v1` Scale whose `spec.replicas` is the
/// new size, judged as that many replicas of the parent the caches hold.
fn admit_scale(request: &AdmissionRequest, snapshot: &Snapshot, now: Timestamp) -> Decision {
    let replicas = |v: Option<&Value>| -> Option<u64> {
        let r = &v?["spec"]["replicas"];
        if r.is_null() { Some(0) } else { r.as_u64() }
    };
    let resource = request.resource.clone().unwrap_or_default();
    let kind = match resource.resource.as_str() {
        "deployments" => "Deployment",
        "statefulsets" => "StatefulSet",
        "replicasets" => "ReplicaSet",
        "replicationcontrollers" => "ReplicationController",
        other => other,
    };
    let name = request.name.as_str();
    let Some(gate) = Gate::new(request, snapshot, name, kind) else {
        return Decision::allow(Reason::NoPolicy);
    };
    let Some(new) = replicas(request.object.as_ref()) else {
        let e = gpus::CountError {
            path: "spec.replicas".into(),
            problem: "expected a non-negative integer in the Scale object".into(),
        };
        let text = message::unreadable(&gate.subject(), &e);
        return gate.finish(Reason::Unreadable, text, None, None, Vec::new());
    };
    let old = replicas(request.old_object.as_ref());
    if old.is_some_and(|old| new <= old) {
        return Decision::allow(Reason::NotIncreased);
    }
    let target = (
        resource.group.clone(),
        resource.resource.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let (claim, before) = match snapshot.scalable.get(&target) {
        Some(parent) => {
            let claim = |n: u64| Claim {
                gpus: n as f64 * parent.per_replica,
                label_sets: parent.label_sets.clone(),
                basis: format!("{n} replicas × {} GPUs", parent.per_replica),
                unresolved_claim_templates: Vec::new(),
                named_claim_gpus: 0.0,
                unresolved_claims: Vec::new(),
                open_ended: None,
                device_grants: Vec::new(),
            };
            (claim(new), old.map(claim))
        }
        None => (
            Claim {
                gpus: 0.0,
                label_sets: vec![BTreeMap::new()],
                basis: format!("{new} replicas of an unknown pod template"),
                unresolved_claim_templates: Vec::new(),
                named_claim_gpus: 0.0,
                unresolved_claims: Vec::new(),
                open_ended: Some(format!(
                    "the GPU budget gate has not seen {} {}/{name}, so it cannot count what {new} replicas claim; try again in a few seconds",
                    resource.resource, request.namespace
                )),
                device_grants: Vec::new(),
            },
            None,
        ),
    };
    gate.judge(&claim, before.as_ref(), Vec::new(), snapshot, now)
}

/// The rules that apply to one write, and whom it is about.
struct Gate<'a> {
    policy: &'a GpuPolicy,
    rules: &'a AdmissionSpec,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
}

impl<'a> Gate<'a> {
    fn new(
        request: &'a AdmissionRequest,
        snapshot: &'a Snapshot,
        name: &'a str,
        kind: &'a str,
    ) -> Option<Self> {
        let empty = BTreeMap::new();
        let namespace_labels = snapshot
            .namespaces
            .get(&request.namespace)
            .unwrap_or(&empty);
        let (policy, rules) = admission_policy(
            snapshot.policies.iter().map(|p| p.as_ref()),
            namespace_labels,
        )?;
        Some(Self {
            policy,
            rules,
            kind,
            namespace: &request.namespace,
            name,
        })
    }

    fn subject(&self) -> message::Subject<'_> {
        message::Subject {
            kind: self.kind,
            namespace: self.namespace,
            name: self.name,
            policy: self.policy.metadata.name.as_deref().unwrap_or_default(),
            large: self.rules.large_claim_gpus,
        }
    }

    /// GPUs the namespace may hold without an attestation.
    fn allowance(&self) -> f64 {
        f64::from(
            self.rules
                .unattested_gpus
                .unwrap_or(self.rules.large_claim_gpus),
        )
    }

    fn finish(
        &self,
        reason: Reason,
        message: String,
        gpus: Option<f64>,
        attestation: Option<String>,
        warnings: Vec<String>,
    ) -> Decision {
        Decision {
            verdict: match self.rules.mode {
                AdmissionMode::Enforce => Verdict::Deny,
                AdmissionMode::Warn => Verdict::Warn,
            },
            reason,
            message: Some(message),
            warnings,
            gpus,
            policy: self.policy.metadata.name.clone(),
            attestation,
        }
    }

    /// G3 as a namespace total: the sentence refusing a write that adds `added` GPUs
    /// (paid until `until`: the month's end, or a covering attestation's expiry) when that
    /// and what the `held` GPUs cost until the month ends do not fit what is left of the
    /// monthly budget; `None` without a budget or when it fits.
    fn over_budget(
        &self,
        subject: &message::Subject<'_>,
        gpus: f64,
        added: f64,
        held: f64,
        until: Timestamp,
        now: Timestamp,
    ) -> Option<String> {
        let budget = self.rules.monthly_budget_usd?;
        let month = month_of(now);
        let spent = self.policy.spend_of(self.namespace, &month);
        let hourly = budget::hourly_usd(self.policy);
        let cost = added * hourly * budget::hours_until(now, until);
        let committed = budget::committed_usd(held, hourly, now);
        (spent + committed + cost > budget).then(|| {
            message::over_budget(
                subject,
                gpus,
                cost,
                message::Spend {
                    spent,
                    held,
                    committed,
                    budget,
                },
                &month,
            )
        })
    }

    /// Decides a counted claim; `before` is what the object claimed before an update.
    fn judge(
        &self,
        claim: &Claim,
        before: Option<&Claim>,
        warnings: Vec<String>,
        snapshot: &Snapshot,
        now: Timestamp,
    ) -> Decision {
        let subject = self.subject();
        let gpus = claim.gpus;
        let allow = |reason, attestation: Option<String>| Decision {
            gpus: Some(gpus),
            policy: self.policy.metadata.name.clone(),
            warnings: warnings.clone(),
            attestation,
            ..Decision::allow(reason)
        };
        let grows_open_ended =
            claim.open_ended.is_some() && before.is_none_or(|b| b.open_ended.is_none());
        if let Some(before) = before
            && gpus <= before.gpus
            && !grows_open_ended
        {
            return allow(Reason::NotIncreased, None);
        }
        if let Some(why) = &claim.open_ended {
            let text = message::open_ended(&subject, gpus, why);
            return self.finish(Reason::OpenEnded, text, Some(gpus), None, warnings);
        }
        // What this write adds to what the namespace holds: named ResourceClaims were
        // counted when they were created, and an update's pods already run.
        let own = |c: &Claim| (c.gpus - c.named_claim_gpus).max(0.0);
        let added = (own(claim) - before.map_or(0.0, own)).max(0.0);
        // Nothing new and small (most writes: a Deployment without GPUs, a pod naming a
        // claim already held): admitted even in a namespace over what it may hold.
        if added <= 0.0 && gpus <= f64::from(self.rules.large_claim_gpus) {
            return allow(Reason::WithinLimit, None);
        }
        let in_namespace: Vec<&ReadinessAttestation> = snapshot
            .attestations
            .get(self.namespace)
            .into_iter()
            .flatten()
            .map(|a| a.as_ref())
            .collect();
        let held: &[Held] = snapshot
            .held
            .get(self.namespace)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let standing: Vec<&ReadinessAttestation> = in_namespace
            .iter()
            .copied()
            .filter(|a| standing(a, now))
            .collect();
        let allowance = self.allowance();
        let held_total = total(held.iter().map(|h| h.gpus));
        let capacity = allowance + total(standing.iter().map(|a| f64::from(a.spec.max_gpus)));
        let held_unattested = total(
            held.iter()
                .filter(|h| {
                    !standing
                        .iter()
                        .any(|a| selector::matches(&a.spec.selector, &h.labels))
                })
                .map(|h| h.gpus),
        );
        let within_allowance =
            gpus <= f64::from(self.rules.large_claim_gpus) && held_unattested + added <= allowance;
        // The candidate that gets furthest through the checks; on a tie, the first by name.
        let mut best: Option<(usize, Check, &ReadinessAttestation)> = None;
        if !within_allowance {
            for a in in_namespace.iter().copied().filter(|a| {
                claim
                    .label_sets
                    .iter()
                    .any(|labels| selector::matches(&a.spec.selector, labels))
            }) {
                let held_by_it = total(
                    held.iter()
                        .filter(|h| selector::matches(&a.spec.selector, &h.labels))
                        .map(|h| h.gpus),
                );
                let check = check_attestation_held(a, gpus, added, held_by_it, self.rules, now);
                let rank = check.rank();
                let better = best.as_ref().is_none_or(|(r, _, b)| {
                    rank > *r || (rank == *r && a.metadata.name < b.metadata.name)
                });
                if better {
                    best = Some((rank, check, a));
                }
            }
        }
        let covering = best
            .as_ref()
            .filter(|(_, check, _)| *check == Check::Passes)
            .map(|(_, _, a)| *a);
        let denial = if within_allowance || covering.is_some() {
            // Whichever bucket it fits, the namespace as a whole must have room (G1): a
            // pod several attestations select counts in each of them.
            (held_total + added > capacity).then(|| {
                (
                    Reason::OverAllowance,
                    message::over_allowance(&subject, gpus, held_total, added, allowance, capacity),
                    None,
                )
            })
        } else {
            Some(match &best {
                None if gpus <= f64::from(self.rules.large_claim_gpus) => (
                    Reason::OverAllowance,
                    message::unattested_allowance(
                        &subject,
                        gpus,
                        held_unattested,
                        added,
                        allowance,
                    ),
                    None,
                ),
                None => (
                    Reason::NoAttestation,
                    message::no_attestation(&subject, gpus),
                    None,
                ),
                Some((_, check, a)) => {
                    let name = a.metadata.name.clone().unwrap_or_default();
                    let (reason, text) = message::attestation_failure(&subject, gpus, &name, check);
                    (reason, text, Some(name))
                }
            })
        };
        // G3, a namespace total: what the claim costs until the month ends (or the
        // attestation expires), added to what the GPUs the namespace holds now cost until
        // the month ends, must fit what is left of the budget; over it, no new GPUs.
        if added > 0.0 {
            let until =
                covering.map_or(month_end(now), |a| month_end(now).min(a.spec.expires_at.0));
            if let Some(text) = self.over_budget(&subject, gpus, added, held_total, until, now) {
                return self.finish(Reason::OverBudget, text, Some(gpus), None, warnings);
            }
        }
        match denial {
            None => match covering {
                Some(a) => allow(Reason::Attested, a.metadata.name.clone()),
                None => allow(Reason::WithinLimit, None),
            },
            Some((reason, text, attestation)) => {
                self.finish(reason, text, Some(gpus), attestation, warnings)
            }
        }
    }
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

#[cfg(test)]
#[path = "decide_devices_tests.rs"]
mod devices_tests;
