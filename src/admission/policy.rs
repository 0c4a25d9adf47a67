//! Which GpuPolicy's admission rules govern a namespace (G6). Pure; the webhook's
//! decision and the controller's quota both choose with it, so they never disagree.

use std::collections::BTreeMap;

use crate::api::policy::AdmissionSpec;
use crate::api::{GpuPolicy, selector};

/// The GpuPolicy whose admission rules apply in a namespace labelled `namespace_labels`:
/// among the policies with `spec.admission` whose `match.namespaceSelector` selects it,
/// the highest `priority`, then the alphabetically first name. Workload labels and kinds
/// are not consulted: the team writes those (G6).
pub fn admission_policy<'a>(
    policies: impl IntoIterator<Item = &'a GpuPolicy>,
    namespace_labels: &BTreeMap<String, String>,
) -> Option<(&'a GpuPolicy, &'a AdmissionSpec)> {
    let mut best: Option<(&GpuPolicy, &AdmissionSpec)> = None;
    for policy in policies {
        let Some(rules) = policy.spec.admission.as_ref() else {
            continue;
        };
        let selected = policy
            .spec
            .match_
            .namespace_selector
            .as_ref()
            .is_none_or(|s| selector::matches(s, namespace_labels));
        if !selected {
            continue;
        }
        if best.is_none_or(|(b, _)| policy.outranks(b)) {
            best = Some((policy, rules));
        }
    }
    best
}
