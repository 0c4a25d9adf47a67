//! GpuPolicies read one object at a time, so that one the controller cannot use never
//! stops the others. The watch and the `--once` listing hand over untyped objects
//! ([`DynamicObject`]); [`read_all`] (PURE) reads each as a [`GpuPolicy`]. A policy is
//! set aside ([`Unusable`]) when a field does not fit the types, or when it holds a value
//! this gpu-reaper does not know (a newer CRD's `action.type: Hibernate` during an
//! upgrade or a rollback: read as `Unknown`, refused here, see [`crate::api::unknown`]).
//!
//! A policy set aside is not evaluated, and what it governs is left alone: its `match`
//! and `priority` (when that much can be read) still take part in choosing each
//! workload's policy, so a lower-priority policy never takes over the workloads it
//! governed. [`report`] (IO) then gives it, each cycle, a Warning Event `Unreadable`
//! naming the field and the fix (once per generation and problem), `Degraded=True` and
//! `Ready=False` in its status (the whole status, one server-side apply with the status
//! stage's field manager, only when it changes), and the gauge
//! `gpu_reaper_unreadable_objects{kind="GpuPolicy"}`.

use std::collections::HashSet;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use serde_json::Value;

use super::context::Context;
use super::metrics::KindLabels;
use super::status;
use crate::api::conditions::{DEGRADED, READY, condition, set_condition};
use crate::api::policy::{ActionType, GpuPolicyStatus, PolicyMode, WorkloadMatch};
use crate::api::{GpuPolicy, GpuPolicySpec, unknown};
use crate::notify::Severity;
use crate::notify::events::EventWriter;

/// The reason of the Event and of the conditions on a policy set aside.
pub const UNREADABLE: &str = "Unreadable";

/// A GpuPolicy the controller cannot use, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Unusable {
    pub name: String,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    /// The field, what is wrong with it and the fix, e.g. `spec.action.type: unknown
    /// value "Hibernate" (this gpu-reaper knows ScaleToZero, Suspend, Evict, None):
    /// upgrade gpu-reaper or change the value`.
    pub problem: String,
    /// Its `match` and `priority` (the rest left at defaults that never act), when they
    /// can be read: it still wins the workloads it governs, so no other policy judges
    /// them. `None`: not even those could be read.
    pub stand_in: Option<GpuPolicy>,
    /// Its status as last written, when readable (kept whole when the conditions change).
    pub status: Option<GpuPolicyStatus>,
}

/// The policies of one read.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    pub usable: Vec<GpuPolicy>,
    pub unusable: Vec<Unusable>,
}

impl Policies {
    /// What chooses a workload's policy: the usable policies and the stand-ins of the
    /// unusable ones.
    pub fn selection(&self) -> Vec<&GpuPolicy> {
        self.usable
            .iter()
            .chain(self.unusable.iter().filter_map(|u| u.stand_in.as_ref()))
            .collect()
    }
}

/// PURE: every object read on its own, in name order.
pub fn read_all<'a>(objects: impl IntoIterator<Item = &'a DynamicObject>) -> Policies {
    let mut out = Policies::default();
    for object in objects {
        match read(object) {
            Ok(p) => out.usable.push(p),
            Err(u) => out.unusable.push(*u),
        }
    }
    out.usable
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out.unusable.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// PURE: one object as a policy this gpu-reaper can use, or why not.
pub fn read(object: &DynamicObject) -> Result<GpuPolicy, Box<Unusable>> {
    let raw = serde_json::to_value(object).unwrap_or(Value::Null);
    let unusable = |problem: String, stand_in: Option<GpuPolicy>| {
        Box::new(Unusable {
            name: object.metadata.name.clone().unwrap_or_default(),
            uid: object.metadata.uid.clone(),
            generation: object.metadata.generation,
            problem,
            stand_in,
            status: serde_json::from_value(raw["status"].clone()).ok(),
        })
    };
    match crate::api::read_dynamic::<GpuPolicy>(object) {
        Ok(policy) => {
            let unknown_values = policy.spec.unknown_values();
            if unknown_values.is_empty() {
                return Ok(policy);
            }
            let stand_in = stand_in(object, policy.spec.priority, policy.spec.match_.clone());
            Err(unusable(
                unknown::describe(&unknown_values, &raw),
                Some(stand_in),
            ))
        }
        Err(e) => {
            #[derive(serde::Deserialize)]
            struct Selection {
                #[serde(default)]
                priority: i32,
                #[serde(default, rename = "match")]
                match_: WorkloadMatch,
            }
            let selection = match raw.get("spec") {
                None | Some(Value::Null) => Some(Selection {
                    priority: 0,
                    match_: WorkloadMatch::default(),
                }),
                Some(spec) => serde_json::from_value::<Selection>(spec.clone()).ok(),
            };
            let stand_in = selection.map(|s| stand_in(object, s.priority, s.match_));
            Err(unusable(
                format!(
                    "{e}: this gpu-reaper cannot read the field; change it to what `kubectl explain gpupolicy.spec` describes, or upgrade gpu-reaper"
                ),
                stand_in,
            ))
        }
    }
}

/// A policy that only takes part in choosing: its name, `match` and `priority`; Audit
/// and action None, so nothing could come of it even if it were evaluated.
fn stand_in(object: &DynamicObject, priority: i32, match_: WorkloadMatch) -> GpuPolicy {
    let mut spec = GpuPolicySpec {
        mode: PolicyMode::Audit,
        priority,
        match_,
        ..GpuPolicySpec::default()
    };
    spec.action.type_ = ActionType::None;
    let mut policy = GpuPolicy::new(object.metadata.name.as_deref().unwrap_or_default(), spec);
    policy.metadata = object.metadata.clone();
    policy
}

/// What the Event on a policy set aside says.
pub fn note(u: &Unusable) -> String {
    let left = if u.stand_in.is_some() {
        "the workloads it governs are left alone until then"
    } else {
        "not even its match and priority could be read, so other policies may govern its workloads"
    };
    format!(
        "gpu-reaper does not evaluate this GpuPolicy: {}; {left}",
        u.problem
    )
}

/// PURE: the whole status of a policy set aside: its last status, `Degraded=True` and
/// `Ready=False` with the problem (transition times kept while unchanged).
pub fn status(u: &Unusable, now: Timestamp) -> GpuPolicyStatus {
    let mut status = u.status.clone().unwrap_or_default();
    status.observed_generation = u.generation;
    set_condition(
        &mut status.conditions,
        condition(DEGRADED, true, UNREADABLE, u.problem.clone()),
        now,
    );
    set_condition(
        &mut status.conditions,
        condition(
            READY,
            false,
            UNREADABLE,
            "not evaluated: see the Degraded condition",
        ),
        now,
    );
    status
}

/// The policies already given their Event, by (name, generation, problem): a policy is
/// told again only when it or its problem changes (or the process restarts).
pub type Reported = HashSet<(String, Option<i64>, String)>;

/// IO: for every policy set aside, its Event (once), its status (when it changes), and
/// the gauge of how many there are.
pub async fn report(ctx: &Context, reported: &mut Reported, unusable: &[Unusable], now: Timestamp) {
    ctx.metrics
        .unreadable_objects
        .get_or_create(&KindLabels { kind: "GpuPolicy" })
        .set(unusable.len() as i64);
    let events = EventWriter::new(ctx.client.clone(), &ctx.settings.identity);
    for u in unusable {
        tracing::warn!(policy = %u.name, problem = %u.problem, "GpuPolicy not evaluated: this gpu-reaper cannot use it");
        let key = (u.name.clone(), u.generation, u.problem.clone());
        if !reported.contains(&key) {
            let regarding = ObjectReference {
                api_version: Some(format!("{}/{}", crate::api::GROUP, crate::api::VERSION)),
                kind: Some("GpuPolicy".into()),
                name: Some(u.name.clone()),
                uid: u.uid.clone(),
                ..ObjectReference::default()
            };
            match events
                .publish(regarding, UNREADABLE, Severity::Warning, &note(u))
                .await
            {
                Ok(()) => {
                    reported.insert(key);
                }
                Err(e) => {
                    tracing::warn!(policy = %u.name, error = %e, "could not record an Event on an unreadable GpuPolicy")
                }
            }
        }
        let new = status(u, now);
        if u.status.as_ref() != Some(&new) {
            status::apply(&ctx.client, &u.name, &new).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(name: &str, spec: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 3},
            "spec": spec,
            "status": {"workloads": {"governed": 4, "gpus": 8, "idle": 1, "warned": 0, "reclaimed": 0}},
        }))
        .unwrap()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn one_policy_with_a_new_action_type_is_set_aside_and_the_others_are_read() {
        let objects = [
            object("b-normal", json!({"mode": "Enforce"})),
            object(
                "a-newer",
                json!({"priority": 5, "action": {"type": "Hibernate"},
                       "match": {"kinds": ["Deployment"]}}),
            ),
        ];
        let read = read_all(&objects);
        assert_eq!(read.usable.len(), 1);
        assert_eq!(read.usable[0].metadata.name.as_deref(), Some("b-normal"));
        let u = &read.unusable[0];
        assert_eq!(u.name, "a-newer");
        assert_eq!(u.generation, Some(3));
        assert_eq!(
            u.problem,
            "spec.action.type: unknown value \"Hibernate\" (this gpu-reaper knows ScaleToZero, Suspend, Evict, None): upgrade gpu-reaper or change the value"
        );
        // It still wins what it matches, and could never act on it.
        let stand_in = u.stand_in.as_ref().unwrap();
        assert_eq!(stand_in.spec.priority, 5);
        assert_eq!(stand_in.spec.match_.kinds, ["Deployment"]);
        assert_eq!(stand_in.spec.action.type_, ActionType::None);
        assert_eq!(stand_in.spec.mode, PolicyMode::Audit);
        assert_eq!(read.selection().len(), 2);
        assert_eq!(u.status.as_ref().unwrap().workloads.governed, 4);
    }

    #[test]
    fn a_field_that_does_not_fit_the_types_is_named_and_match_and_priority_still_read() {
        let u = read(&object(
            "p",
            json!({"priority": 7, "idle": {"threshold": "low"}}),
        ))
        .unwrap_err();
        assert!(
            u.problem
                .starts_with("spec.idle.threshold: invalid type: string \"low\""),
            "{}",
            u.problem
        );
        assert!(u.problem.contains("or upgrade gpu-reaper"), "{}", u.problem);
        assert_eq!(u.stand_in.unwrap().spec.priority, 7);
    }

    #[test]
    fn a_policy_whose_match_cannot_be_read_takes_no_part_in_choosing() {
        let u = read(&object("p", json!({"match": {"kinds": "Deployment"}}))).unwrap_err();
        assert!(u.problem.starts_with("spec.match.kinds: "), "{}", u.problem);
        assert!(u.stand_in.is_none());
        assert!(note(&u).contains("other policies may govern its workloads"));
    }

    #[test]
    fn the_status_of_a_policy_set_aside_is_degraded_and_keeps_the_rest() {
        let u = read(&object("p", json!({"mode": "Shadow"}))).unwrap_err();
        let first = status(&u, at("2026-11-30T00:00:00Z"));
        assert_eq!(first.observed_generation, Some(3));
        assert_eq!(first.workloads.governed, 4, "the last figures are kept");
        let degraded = first
            .conditions
            .iter()
            .find(|c| c.type_ == DEGRADED)
            .unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", UNREADABLE)
        );
        assert!(
            degraded
                .message
                .starts_with("spec.mode: unknown value \"Shadow\"")
        );
        let ready = first.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(ready.status, "False");
        // Written once: the next cycle computes the same status, so nothing is applied.
        let again = Unusable {
            status: Some(first.clone()),
            ..*u
        };
        assert_eq!(status(&again, at("2026-11-30T00:05:00Z")), first);
    }

    #[test]
    fn the_note_names_the_field_the_value_and_the_fix() {
        let u = read(&object("p", json!({"action": {"type": "Hibernate"}}))).unwrap_err();
        assert_eq!(
            note(&u),
            "gpu-reaper does not evaluate this GpuPolicy: spec.action.type: unknown value \"Hibernate\" (this gpu-reaper knows ScaleToZero, Suspend, Evict, None): upgrade gpu-reaper or change the value; the workloads it governs are left alone until then"
        );
    }
}
