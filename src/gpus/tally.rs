//! The running count of one object ([`Tally`]): GPUs, the basis parts, label sets, the
//! claims it names and could not resolve; and what counting it may look up ([`Ctx`]).
//! The kinds (`kinds`) and pod specs (`pod`) add to it; `count` dispatches.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::fields::problem;
use super::*;

/// A hash of a label set, for [`Tally::add_labels`] (equal sets are compared in full).
pub(super) fn label_hash(labels: &BTreeMap<String, String>) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(labels)
}

pub(super) struct Ctx<'a> {
    pub(super) namespace: &'a str,
    pub(super) resources: &'a GpuResources,
    pub(super) templates: &'a dyn ClaimTemplates,
}

/// The running count of one object: GPUs, basis parts, label sets, unresolved templates.
pub(super) struct Tally<'a> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) gpus: f64,
    pub(super) parts: Vec<String>,
    pub(super) label_sets: Vec<BTreeMap<String, String>>,
    /// Where the label sets already in `label_sets` are, by hash: de-duplication stays
    /// linear however many pod templates an object has (a 1.5 MiB PyTorchJob of thousands
    /// of roles), without a second copy of each set.
    pub(super) seen_labels: HashMap<u64, Vec<usize>>,
    pub(super) unresolved: Vec<String>,
    pub(super) unresolved_claims: Vec<String>,
    /// The names in `unresolved` and `unresolved_claims`, so merging the pods' lists stays
    /// linear (a pod naming tens of thousands of claims no one has seen).
    pub(super) unresolved_seen: HashSet<(bool, String)>,
    pub(super) named_claims: HashSet<String>,
    pub(super) named_claim_gpus: f64,
    pub(super) open_ended: Option<String>,
    pub(super) device_grants: Vec<DeviceGrant>,
}

impl Tally<'_> {
    pub(super) fn add(&mut self, gpus: f64, part: String) {
        self.gpus += gpus;
        self.parts.push(part);
    }

    pub(super) fn add_labels(&mut self, labels: BTreeMap<String, String>) {
        if labels.is_empty() {
            return;
        }
        let at = self.seen_labels.entry(label_hash(&labels)).or_default();
        if at.iter().any(|&i| self.label_sets[i] == labels) {
            return;
        }
        at.push(self.label_sets.len());
        self.label_sets.push(labels);
    }

    pub(super) fn finish(self) -> Result<Counted, CountError> {
        if !(self.gpus.is_finite() && self.gpus >= 0.0) {
            return Err(problem(
                "spec",
                "the GPU count is not a finite, non-negative number".to_string(),
            ));
        }
        let basis = if self.parts.is_empty() {
            "no pods".to_string()
        } else {
            self.parts.join(" + ")
        };
        Ok(Counted::Claim(Claim {
            gpus: self.gpus,
            label_sets: self.label_sets,
            basis,
            unresolved_claim_templates: self.unresolved,
            named_claim_gpus: self.named_claim_gpus.min(self.gpus),
            unresolved_claims: self.unresolved_claims,
            open_ended: self.open_ended,
            device_grants: self.device_grants,
        }))
    }
}
