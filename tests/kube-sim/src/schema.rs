//! Custom-resource schemas, applied as kube-apiserver applies a CRD's
//! `openAPIV3Schema` on create and update: defaults, pruning of unknown fields (with
//! `fieldValidation` Strict → 400, Warn → warning, Ignore → silent), structural checks
//! (type, required, enum, numeric and length bounds, item counts, nullable,
//! int-or-string) and `x-kubernetes-validations` CEL rules (through kube-cel, with the
//! old object for transition rules). `pattern` and `format` are not checked.

use serde_json::Value;

use crate::status::ApiError;

/// What the client asked for with `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn from_param(param: Option<&str>) -> Self {
        match param {
            Some("Strict") => Self::Strict,
            Some("Ignore") => Self::Ignore,
            _ => Self::Warn,
        }
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"] == true
}

/// Removes fields the schema does not know; returns their paths.
fn prune(schema: &Value, value: &mut Value, path: &str, unknown: &mut Vec<String>) {
    if preserves_unknown(schema) && schema.get("properties").is_none() {
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                let keep_unknown = preserves_unknown(schema);
                let mut drop = Vec::new();
                for (k, v) in map.iter_mut() {
                    match properties.get(k) {
                        Some(child) => prune(child, v, &join(path, k), unknown),
                        None if !keep_unknown => drop.push(k.clone()),
                        None => {}
                    }
                }
                for k in drop {
                    map.remove(&k);
                    unknown.push(join(path, &k));
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (k, v) in map.iter_mut() {
                    prune(additional, v, &join(path, k), unknown);
                }
            } else if schema.get("type").and_then(Value::as_str) == Some("object")
                && !preserves_unknown(schema)
            {
                // An object schema with neither properties nor additionalProperties keeps nothing.
                for k in map.keys() {
                    unknown.push(join(path, k));
                }
                map.clear();
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item_schema, item, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

/// Structural checks; each failure is (field path, message) as kube-apiserver words it.
fn check(schema: &Value, value: &Value, path: &str, causes: &mut Vec<(String, String)>) {
    if value.is_null() {
        if schema["nullable"] != true && schema.get("type").is_some() {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"] == true;
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let got = type_name(value);
        let ok = got == want
            || (want == "number" && got == "integer")
            || (int_or_string && (got == "integer" || got == "string"));
        if !ok {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""
                ),
            ));
            return;
        }
    } else if int_or_string && !matches!(type_name(value), "integer" | "string") {
        let got = type_name(value);
        causes.push((path.into(), format!("Invalid value: \"{got}\": {path} in body must be of type integer or string: \"{got}\"")));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(shown).collect();
        causes.push((
            path.into(),
            format!(
                "Unsupported value: {}: supported values: {}",
                shown(value),
                list.join(", ")
            ),
        ));
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            let exclusive = schema["exclusiveMinimum"] == true;
            if n < min || (exclusive && n == min) {
                let relation = if exclusive {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                causes.push((
                    path.into(),
                    format!(
                        "Invalid value: {value}: {path} in body should be {relation} {}",
                        schema["minimum"]
                    ),
                ));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            let exclusive = schema["exclusiveMaximum"] == true;
            if n > max || (exclusive && n == max) {
                let relation = if exclusive {
                    "less than"
                } else {
                    "less than or equal to"
                };
                causes.push((
                    path.into(),
                    format!(
                        "Invalid value: {value}: {path} in body should be {relation} {}",
                        schema["maximum"]
                    ),
                ));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len < m)
        {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: {}: {path} in body should be at least {} chars long",
                    shown(value),
                    schema["minLength"]
                ),
            ));
        }
        if schema
            .get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len > m)
        {
            causes.push((
                path.into(),
                format!(
                    "Too long: may not be more than {} bytes",
                    schema["maxLength"]
                ),
            ));
        }
    }
    match value {
        Value::Object(map) => {
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(name) = required.as_str()
                    && !map.contains_key(name)
                {
                    causes.push((join(path, name), "Required value".into()));
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in map {
                let child = properties.and_then(|p| p.get(k)).or(additional);
                if let Some(child) = child {
                    check(child, v, &join(path, k), causes);
                }
            }
        }
        Value::Array(items) => {
            let count = items.len() as u64;
            if schema
                .get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| count < m)
            {
                causes.push((
                    path.into(),
                    format!(
                        "Invalid value: {count}: {path} in body should have at least {} items",
                        schema["minItems"]
                    ),
                ));
            }
            if schema
                .get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| count > m)
            {
                causes.push((
                    path.into(),
                    format!(
                        "Too many: {count}: must have at most {} items",
                        schema["maxItems"]
                    ),
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{i}]"), causes);
                }
            }
        }
        _ => {}
    }
}

/// The `openAPIV3Schema` of a CRD for one served version.
pub fn schema_for(crd: &Value, version: &str) -> Option<Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v["name"] == version)?
        .pointer("/schema/openAPIV3Schema")
        .cloned()
}

/// The fields every object has whatever its schema says; never pruned or checked here.
const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// The parts of a custom object the schema governs.
fn without_metadata(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(m) = o.as_object_mut() {
        for f in ROOT_FIELDS {
            m.remove(f);
        }
    }
    o
}

/// Defaults, prunes and validates `object` in place against `schema`. Returns warnings
/// (pruned fields under `Warn`), or the error kube-apiserver answers.
pub fn admit(
    schema: &Value,
    object: &mut Value,
    old: Option<&Value>,
    validation: FieldValidation,
    kind_group: (&str, &str),
    api_version: &str,
) -> Result<Vec<String>, ApiError> {
    let (kind, group) = kind_group;
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let root_fields: Vec<(&str, Value)> = ROOT_FIELDS
        .iter()
        .filter_map(|f| object.get(*f).map(|v| (*f, v.clone())))
        .collect();
    let mut body = without_metadata(object);
    body = kube_cel::apply_defaults(schema, &body);
    let mut unknown = Vec::new();
    prune(schema, &mut body, "", &mut unknown);
    if validation == FieldValidation::Strict && !unknown.is_empty() {
        let fields: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            fields.join(", ")
        )));
    }
    let mut causes = Vec::new();
    let mut root = schema.clone();
    if let Some(props) = root.get_mut("properties").and_then(Value::as_object_mut) {
        for f in ROOT_FIELDS {
            props.remove(f);
        }
    }
    if let Some(required) = root.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| !ROOT_FIELDS.iter().any(|f| r == f));
    }
    check(&root, &body, "", &mut causes);
    let mut out = body;
    if let Some(map) = out.as_object_mut() {
        for (field, value) in root_fields {
            map.insert(field.to_string(), value);
        }
    }
    if causes.is_empty() {
        // CEL rules see the whole object (root rules may read self.metadata.name).
        let root = kube_cel::RootContext {
            api_version: api_version.to_string(),
            api_group: group.to_string(),
            kind: kind.to_string(),
        };
        let validator = kube_cel::Validator::new();
        if let Err(errors) = validator.validate_with_context(schema, &out, old, Some(&root)) {
            for e in errors.iter() {
                let at = if e.field_path.is_empty() {
                    "<nil>".to_string()
                } else {
                    e.field_path.clone()
                };
                let value = if e.field_path.is_empty() {
                    Some(&out)
                } else {
                    out.pointer(&format!("/{}", e.field_path.replace('.', "/")))
                };
                let shown = value.map(type_name).unwrap_or("object");
                causes.push((at, format!("Invalid value: \"{shown}\": {}", e.message)));
            }
        }
    }
    if !causes.is_empty() {
        let refs: Vec<(&str, String)> = causes
            .iter()
            .map(|(f, m)| (f.as_str(), m.clone()))
            .collect();
        return Err(ApiError::invalid(group, kind, &name, &refs));
    }
    *object = out;
    Ok(match validation {
        FieldValidation::Warn => unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect(),
        _ => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["mode"],
                    "x-kubernetes-validations": [{"rule": "self.threshold <= 1.0", "message": "threshold is a fraction"}],
                    "properties": {
                        "mode": {"type": "string", "enum": ["Audit", "Enforce"]},
                        "threshold": {"type": "number", "minimum": 0, "default": 0.05},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                },
            },
        })
    }

    fn object(spec: Value) -> Value {
        json!({"apiVersion": "x.io/v1", "kind": "P", "metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn defaults_are_applied_and_unknown_fields_pruned_with_a_warning() {
        let mut o = object(json!({"mode": "Audit", "extra": 1, "labels": {"a": "b"}}));
        let warnings = admit(
            &schema(),
            &mut o,
            None,
            FieldValidation::Warn,
            ("P", "x.io"),
            "x.io/v1",
        )
        .unwrap();
        assert_eq!(o["spec"]["threshold"], json!(0.05));
        assert!(o["spec"].get("extra").is_none());
        assert_eq!(o["spec"]["labels"]["a"], "b");
        assert_eq!(o["metadata"]["name"], "p");
        assert_eq!(warnings, ["unknown field \"spec.extra\""]);
    }

    #[test]
    fn strict_field_validation_rejects_unknown_fields() {
        let mut o = object(json!({"mode": "Audit", "extra": 1}));
        let err = admit(
            &schema(),
            &mut o,
            None,
            FieldValidation::Strict,
            ("P", "x.io"),
            "x.io/v1",
        )
        .unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "strict decoding error: unknown field \"spec.extra\""
        );
    }

    #[test]
    fn structural_and_cel_failures_are_422_invalid() {
        let mut o = object(json!({"mode": "Sometimes", "threshold": -1}));
        let err = admit(
            &schema(),
            &mut o,
            None,
            FieldValidation::Warn,
            ("P", "x.io"),
            "x.io/v1",
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        assert!(
            err.message
                .contains("spec.mode: Unsupported value: \"Sometimes\""),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("spec.threshold: Invalid value: -1"),
            "{}",
            err.message
        );
        let mut o = object(json!({"threshold": 2.0}));
        let err = admit(
            &schema(),
            &mut o,
            None,
            FieldValidation::Warn,
            ("P", "x.io"),
            "x.io/v1",
        )
        .unwrap_err();
        assert!(
            err.message.contains("spec.mode: Required value"),
            "{}",
            err.message
        );
        let mut o = object(json!({"mode": "Audit", "threshold": 2.0}));
        let err = admit(
            &schema(),
            &mut o,
            None,
            FieldValidation::Warn,
            ("P", "x.io"),
            "x.io/v1",
        )
        .unwrap_err();
        assert!(
            err.message.contains("threshold is a fraction"),
            "{}",
            err.message
        );
    }
}
