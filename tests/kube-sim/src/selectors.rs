//! Label selectors (equality and set-based) and field selectors, parsed from the query
//! string and matched against JSON objects. Also `LabelSelector` objects (as in PDBs and
//! webhook namespace/object selectors). Pure functions.

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed `labelSelector` query parameter.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside `( … )`.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn invalid_selector(raw: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: invalid label selector: {raw:?}"
    ))
}

impl LabelSelector {
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for part in split_top_level(raw) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let set_op = [" notin ", " in "]
                .iter()
                .find_map(|op| part.find(op).map(|i| (i, *op)));
            let requirement = if let Some((i, op)) = set_op {
                let key = part[..i].trim().to_string();
                let values = part[i + op.len()..].trim();
                let values = values
                    .strip_prefix('(')
                    .and_then(|v| v.strip_suffix(')'))
                    .ok_or_else(|| invalid_selector(raw))?;
                let values = values
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect();
                if op == " in " {
                    Requirement::In(key, values)
                } else {
                    Requirement::NotIn(key, values)
                }
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::DoesNotExist(k.trim().into())
            } else {
                Requirement::Exists(part.into())
            };
            let key = match &requirement {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::DoesNotExist(k) => k,
            };
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(invalid_selector(raw));
            }
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    /// Builds a selector from a `metav1.LabelSelector` object (`matchLabels` +
    /// `matchExpressions`). An absent selector object matches everything.
    pub fn from_object(selector: &Value) -> Self {
        let mut requirements = Vec::new();
        if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                requirements.push(Requirement::Equals(
                    k.clone(),
                    v.as_str().unwrap_or_default().into(),
                ));
            }
        }
        if let Some(exprs) = selector.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                requirements.push(match e.get("operator").and_then(Value::as_str) {
                    Some("In") => Requirement::In(key, values),
                    Some("NotIn") => Requirement::NotIn(key, values),
                    Some("Exists") => Requirement::Exists(key),
                    _ => Requirement::DoesNotExist(key),
                });
            }
        }
        Self(requirements)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Matches the labels of an object (`metadata.labels`).
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` query parameter.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Field labels the real server accepts per resource (besides `metadata.name` and
/// `metadata.namespace`, accepted for every resource).
fn supported_fields(group: &str, resource: &str) -> &'static [&'static str] {
    match (group, resource) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
        ],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        ("", "nodes") => &["spec.unschedulable"],
        ("batch", "jobs") => &["status.successful"],
        _ => &[],
    }
}

impl FieldSelector {
    pub fn parse(raw: &str, group: &str, resource: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{raw}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !supported_fields(group, resource).contains(&field)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            // events.k8s.io field names on Events stored in the core/v1 shape.
            let core_pointer = pointer
                .replacen("/regarding/", "/involvedObject/", 1)
                .replacen("/reportingController", "/reportingComponent", 1);
            let actual = match object
                .pointer(&pointer)
                .or_else(|| object.pointer(&core_pointer))
            {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn set_based_and_equality_requirements_combine_with_and() {
        let s = LabelSelector::parse("app in (web, api),tier!=db,gpu,!legacy").unwrap();
        assert!(s.matches(&pod(json!({"app": "web", "tier": "fe", "gpu": "a100"}))));
        assert!(!s.matches(&pod(json!({"app": "web", "gpu": "a100", "legacy": "y"}))));
        assert!(!s.matches(&pod(json!({"app": "batch", "gpu": "a100"}))));
        assert!(!s.matches(&pod(json!({"app": "web", "tier": "db", "gpu": "x"}))));
    }

    #[test]
    fn notin_matches_objects_without_the_label() {
        let s = LabelSelector::parse("env notin (prod)").unwrap();
        assert!(s.matches(&pod(json!({}))));
        assert!(!s.matches(&pod(json!({"env": "prod"}))));
    }

    #[test]
    fn unsupported_field_labels_are_rejected_like_the_real_server() {
        let err = FieldSelector::parse("spec.foo=bar", "", "pods").unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains("field label not supported: spec.foo"));
    }

    #[test]
    fn field_selectors_match_node_name_and_negation() {
        let s = FieldSelector::parse("spec.nodeName=n1,metadata.name!=q", "", "pods").unwrap();
        assert!(s.matches(&pod(json!({}))));
        let s = FieldSelector::parse("spec.nodeName!=n1", "", "pods").unwrap();
        assert!(!s.matches(&pod(json!({}))));
    }
}
