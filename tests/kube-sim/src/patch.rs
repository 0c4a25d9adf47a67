//! PATCH bodies by content type: JSON merge patch (RFC 7386), JSON patch (RFC 6902),
//! strategic merge patch (approximated by JSON merge patch with associative lists merged
//! by key, see `fields`), and server-side apply (`application/apply-patch+yaml`, in
//! `fields::apply`). Pure functions.

use serde_json::Value;

use crate::status::ApiError;

/// The PATCH flavours kube-apiserver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let base = content_type.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            _ => Err(ApiError::unsupported_media_type(content_type)),
        }
    }
}

/// Parses a patch body; apply bodies are YAML (JSON is YAML too).
pub fn parse_body(kind: PatchKind, body: &[u8]) -> Result<Value, ApiError> {
    let parsed = if kind == PatchKind::Apply {
        serde_json::from_slice(body)
            .or_else(|_| serde_yaml::from_slice::<Value>(body).map_err(|e| e.to_string()))
    } else {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// Strategic merge: like a merge patch, but lists of keyed objects merge item by item
/// and `$patch: delete` items are dropped. Directives beyond that are not supported.
fn strategic_merge(doc: &mut Value, patch: &Value) {
    match (doc, patch) {
        (Value::Object(doc), Value::Object(patch)) => {
            for (k, v) in patch {
                if k.starts_with("$setElementOrder/") || k == "$retainKeys" {
                    continue;
                }
                if v.is_null() {
                    doc.remove(k);
                } else if let Some(existing) = doc.get_mut(k) {
                    strategic_merge(existing, v);
                } else {
                    let mut fresh = Value::Null;
                    strategic_merge(&mut fresh, v);
                    doc.insert(k.clone(), fresh);
                }
            }
        }
        (Value::Array(doc_items), Value::Array(patch_items)) => {
            let key = ["name", "type", "containerPort", "port", "mountPath"]
                .into_iter()
                .find(|k| {
                    !patch_items.is_empty() && patch_items.iter().all(|i| i.get(*k).is_some())
                });
            match key {
                Some(key) => {
                    for item in patch_items {
                        let position = doc_items.iter().position(|d| d.get(key) == item.get(key));
                        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                        match (position, delete) {
                            (Some(i), true) => {
                                doc_items.remove(i);
                            }
                            (Some(i), false) => strategic_merge(&mut doc_items[i], item),
                            (None, false) => doc_items.push(item.clone()),
                            (None, true) => {}
                        }
                    }
                }
                None => *doc_items = patch_items.clone(),
            }
        }
        (doc, patch) => {
            if patch.is_object() {
                *doc = Value::Object(Default::default());
                strategic_merge(doc, patch);
            } else {
                *doc = patch.clone();
            }
        }
    }
}

/// Applies a merge, JSON or strategic patch to `doc`.
pub fn apply_patch(kind: PatchKind, doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    match kind {
        PatchKind::Merge => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("merge patch must be a JSON object"));
            }
            json_patch::merge(doc, patch);
            Ok(())
        }
        PatchKind::Strategic => {
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "strategic merge patch must be a JSON object",
                ));
            }
            strategic_merge(doc, patch);
            Ok(())
        }
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(doc, &ops).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })
        }
        PatchKind::Apply => Err(ApiError::internal("apply patches go through fields::apply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_keeps_other_containers_and_merges_by_name() {
        let mut doc = json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}});
        let patch = json!({"spec": {"containers": [{"name": "b", "image": "3"}]}});
        apply_patch(PatchKind::Strategic, &mut doc, &patch).unwrap();
        assert_eq!(doc["spec"]["containers"][0]["image"], "1");
        assert_eq!(doc["spec"]["containers"][1]["image"], "3");
    }

    #[test]
    fn a_failing_json_patch_test_op_is_invalid() {
        let mut doc = json!({"a": 1});
        let err = apply_patch(
            PatchKind::Json,
            &mut doc,
            &json!([{"op": "test", "path": "/a", "value": 2}]),
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn unknown_patch_content_types_are_415() {
        assert_eq!(
            PatchKind::from_content_type("text/plain").unwrap_err().code,
            415
        );
    }
}
