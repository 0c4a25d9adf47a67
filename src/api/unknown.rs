//! Values this gpu-reaper does not know. The enums of a GpuPolicy that a newer version
//! may grow (`mode`, `idle.signal`, `idle.missingTelemetry`, `warn.channels`,
//! `action.type`) read an unknown value as their `Unknown` variant instead of failing, so
//! one policy written by a newer CRD (an upgrade half done, a rollback) is not fatal to
//! the others; the policy is refused where it would be used, with the sentence made here.
//! The CRD's schema keeps its enums: the API server still refuses such values unless a
//! newer CRD is installed. `admission.mode` stays strict: the budget gate keeps a
//! policy's last readable version rather than guess (docs/controller.md).

use schemars::JsonSchema;
use serde_json::Value;

use super::policy::{ActionType, Channel, GpuPolicySpec, MissingTelemetry, PolicyMode, Signal};

/// A field whose value this gpu-reaper does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownValue {
    /// Dotted path, e.g. `spec.action.type`, `spec.warn.channels[1]`.
    pub field: String,
    /// JSON pointer to the value in the object, e.g. `/spec/action/type`.
    pub pointer: String,
    /// The values this gpu-reaper knows there (the CRD's enum).
    pub known: Vec<String>,
}

impl UnknownValue {
    fn of<T: JsonSchema>(field: &str, pointer: &str) -> Self {
        Self {
            field: field.to_string(),
            pointer: pointer.to_string(),
            known: known_values::<T>(),
        }
    }
}

/// The values of enum `T` as its schema (and so the CRD) lists them: an `enum`, or, for
/// variants with doc comments, a `oneOf` of `const`s (which kube folds into the CRD's
/// `enum`).
pub fn known_values<T: JsonSchema>() -> Vec<String> {
    fn collect(schema: &Value, out: &mut Vec<String>) {
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            out.extend(values.iter().filter_map(|v| v.as_str().map(String::from)));
        }
        if let Some(value) = schema.get("const").and_then(Value::as_str) {
            out.push(value.to_string());
        }
        for key in ["oneOf", "anyOf"] {
            for sub in schema
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                collect(sub, out);
            }
        }
    }
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<T>();
    let mut out = Vec::new();
    collect(schema.as_value(), &mut out);
    out
}

/// What to say about `value` where this gpu-reaper knows only `known`:
/// `unknown value "Hibernate" (this gpu-reaper knows ScaleToZero, Suspend, Evict, None):
/// upgrade gpu-reaper or change the value`.
pub fn unknown_value_message(value: &str, known: &[impl AsRef<str>]) -> String {
    let known: Vec<&str> = known.iter().map(AsRef::as_ref).collect();
    format!(
        "unknown value {value:?} (this gpu-reaper knows {}): upgrade gpu-reaper or change the value",
        known.join(", ")
    )
}

impl GpuPolicySpec {
    /// Every field whose value this gpu-reaper read as `Unknown`; empty for a policy it
    /// can use.
    pub fn unknown_values(&self) -> Vec<UnknownValue> {
        let mut out = Vec::new();
        if self.mode == PolicyMode::Unknown {
            out.push(UnknownValue::of::<PolicyMode>("spec.mode", "/spec/mode"));
        }
        if self.idle.signal == Signal::Unknown {
            out.push(UnknownValue::of::<Signal>(
                "spec.idle.signal",
                "/spec/idle/signal",
            ));
        }
        if self.idle.missing_telemetry == MissingTelemetry::Unknown {
            out.push(UnknownValue::of::<MissingTelemetry>(
                "spec.idle.missingTelemetry",
                "/spec/idle/missingTelemetry",
            ));
        }
        for (i, c) in self.warn.channels.iter().enumerate() {
            if *c == Channel::Unknown {
                out.push(UnknownValue::of::<Channel>(
                    &format!("spec.warn.channels[{i}]"),
                    &format!("/spec/warn/channels/{i}"),
                ));
            }
        }
        if self.action.type_ == ActionType::Unknown {
            out.push(UnknownValue::of::<ActionType>(
                "spec.action.type",
                "/spec/action/type",
            ));
        }
        out
    }
}

/// One sentence about every unknown value of an object, each with its value as `raw`
/// (the object as the API server sent it) holds it:
/// `spec.action.type: unknown value "Hibernate" (this gpu-reaper knows …): upgrade
/// gpu-reaper or change the value`.
pub fn describe(unknown: &[UnknownValue], raw: &Value) -> String {
    unknown
        .iter()
        .map(|u| {
            let value = match raw.pointer(&u.pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => "?".to_string(),
            };
            format!("{}: {}", u.field, unknown_value_message(&value, &u.known))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuPolicy;
    use serde_json::json;

    fn policy(spec: Value) -> (GpuPolicy, Value) {
        let raw = json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
            "metadata": {"name": "p"}, "spec": spec,
        });
        (serde_json::from_value(raw.clone()).unwrap(), raw)
    }

    #[test]
    fn a_new_action_type_reads_as_unknown_and_is_named_with_its_value_and_the_fix() {
        let (p, raw) = policy(json!({"action": {"type": "Hibernate", "after": "2h"}}));
        assert_eq!(p.spec.action.type_, ActionType::Unknown);
        // The rest of the policy is read as written.
        assert_eq!(
            p.spec.action.after,
            "2h".parse::<kube::core::Duration>().unwrap()
        );
        let unknown = p.spec.unknown_values();
        assert_eq!(
            describe(&unknown, &raw),
            "spec.action.type: unknown value \"Hibernate\" (this gpu-reaper knows ScaleToZero, Suspend, Evict, None): upgrade gpu-reaper or change the value"
        );
    }

    #[test]
    fn every_growing_enum_reads_an_unknown_value_and_names_its_field() {
        let (p, raw) = policy(json!({
            "mode": "Shadow",
            "idle": {"signal": "SmActive", "missingTelemetry": "TreatAsBusy"},
            "warn": {"channels": ["Event", "Teams"]},
        }));
        let text = describe(&p.spec.unknown_values(), &raw);
        for expected in [
            "spec.mode: unknown value \"Shadow\" (this gpu-reaper knows Audit, Enforce)",
            "spec.idle.signal: unknown value \"SmActive\" (this gpu-reaper knows Auto, EngineActive, GpuUtil)",
            "spec.idle.missingTelemetry: unknown value \"TreatAsBusy\" (this gpu-reaper knows Ignore, TreatAsIdle)",
            "spec.warn.channels[1]: unknown value \"Teams\" (this gpu-reaper knows Event, Slack, Email)",
        ] {
            assert!(text.contains(expected), "{text}");
        }
    }

    #[test]
    fn a_policy_of_known_values_has_no_unknown_ones() {
        let (p, _) = policy(json!({
            "mode": "Enforce", "idle": {"signal": "GpuUtil", "missingTelemetry": "TreatAsIdle"},
            "warn": {"channels": ["Event", "Slack", "Email"]}, "action": {"type": "None"},
        }));
        assert!(p.spec.unknown_values().is_empty());
        assert!(GpuPolicySpec::default().unknown_values().is_empty());
    }

    #[test]
    fn the_fallback_variants_are_not_in_the_crd_so_the_api_server_still_refuses_unknown_values() {
        let crd = serde_json::to_value(<GpuPolicy as kube::CustomResourceExt>::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let enum_of = |v: &Value| -> Vec<String> {
            v["enum"]
                .as_array()
                .unwrap_or_else(|| panic!("no enum: {v}"))
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(enum_of(&spec["mode"]), ["Audit", "Enforce"]);
        assert_eq!(
            enum_of(&spec["action"]["properties"]["type"]),
            ["ScaleToZero", "Suspend", "Evict", "None"]
        );
        assert_eq!(
            enum_of(&spec["warn"]["properties"]["channels"]["items"]),
            ["Event", "Slack", "Email"]
        );
        assert_eq!(
            enum_of(&spec["idle"]["properties"]["signal"]),
            ["Auto", "EngineActive", "GpuUtil"]
        );
        assert_eq!(
            enum_of(&spec["idle"]["properties"]["missingTelemetry"]),
            ["Ignore", "TreatAsIdle"]
        );
    }
}
