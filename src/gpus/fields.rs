//! Reading fields (JSON null is the same as absent, as in the API server), the labels
//! and controller owner of an object, and the basis text.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::*;

/// The controller ownerReference of an object, if any.
pub(super) fn controller_owner(
    obj: &Map<String, Value>,
) -> Result<Option<(String, String)>, CountError> {
    let Some(meta) = opt_object(obj, "metadata", "")? else {
        return Ok(None);
    };
    for (i, owner) in opt_list(meta, "ownerReferences", "metadata")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("metadata.ownerReferences[{i}]");
        let owner = object_at(owner, &path)?;
        if opt_bool(owner, "controller", &path)? == Some(true) {
            let kind = opt_str(owner, "kind", &path)?
                .unwrap_or_default()
                .to_string();
            let name = opt_str(owner, "name", &path)?
                .unwrap_or_default()
                .to_string();
            return Ok(Some((kind, name)));
        }
    }
    Ok(None)
}

/// `metadata.labels` of the object (or template) at `path`.
pub(super) fn labels_of(
    obj: &Map<String, Value>,
    path: &str,
) -> Result<BTreeMap<String, String>, CountError> {
    let Some(meta) = opt_object(obj, "metadata", path)? else {
        return Ok(BTreeMap::new());
    };
    let Some(labels) = present(meta, "labels") else {
        return Ok(BTreeMap::new());
    };
    // Built only for an error (see opt_object).
    let labels_path = || join(&join(path, "metadata"), "labels");
    let Some(labels) = labels.as_object() else {
        return Err(problem(
            &labels_path(),
            format!("expected an object, found {}", found(labels)),
        ));
    };
    labels
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(problem(
                &keyed(&labels_path(), k),
                format!("expected a string, found {}", found(other)),
            )),
        })
        .collect()
}

pub(super) fn string_map(
    map: &Map<String, Value>,
    path: &str,
) -> Result<BTreeMap<String, String>, CountError> {
    map.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(problem(
                &keyed(path, k),
                format!("expected a string, found {}", found(other)),
            )),
        })
        .collect()
}

// --- reading fields; JSON null is the same as absent, as in the API server ---

pub(super) fn problem(path: &str, problem: String) -> CountError {
    CountError {
        path: path.to_string(),
        problem,
    }
}

/// A short rendering of a value for error messages.
pub(super) fn found(v: &Value) -> String {
    match v {
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "an object".to_string(),
        Value::String(s) if s.chars().count() > 40 => {
            let head: String = s.chars().take(40).collect();
            format!("{}…", Value::from(head))
        }
        other => other.to_string(),
    }
}

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A map entry whose key is data (resource names, labels): `path["key"]`.
pub(super) fn keyed(path: &str, key: &str) -> String {
    format!("{path}[{}]", Value::from(key))
}

/// A map entry whose key reads like a field (`Worker`), else `path["key"]`.
pub(super) fn member(path: &str, key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        join(path, key)
    } else {
        keyed(path, key)
    }
}

pub(super) fn object_at<'v>(
    v: &'v Value,
    path: &str,
) -> Result<&'v Map<String, Value>, CountError> {
    v.as_object()
        .ok_or_else(|| problem(path, format!("expected an object, found {}", found(v))))
}

pub(super) fn present<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(super) fn opt_object<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'v Map<String, Value>>, CountError> {
    // The path is only built for the error: this runs for every map of every pod
    // template, thousands of times in a big object.
    present(obj, key)
        .map(|v| {
            v.as_object().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected an object, found {}", found(v)),
                )
            })
        })
        .transpose()
}

pub(super) fn opt_list<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'v Vec<Value>>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_array().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected a list, found {}", found(v)),
                )
            })
        })
        .transpose()
}

pub(super) fn opt_str<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'v str>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_str().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected a string, found {}", found(v)),
                )
            })
        })
        .transpose()
}

pub(super) fn opt_bool(
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<bool>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_bool().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected true or false, found {}", found(v)),
                )
            })
        })
        .transpose()
}

/// A replica-like count: a non-negative JSON integer.
pub(super) fn opt_count(
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<u64>, CountError> {
    present(obj, key)
        .map(|v| {
            v.as_u64().ok_or_else(|| {
                problem(
                    &join(path, key),
                    format!("expected a non-negative integer, found {}", found(v)),
                )
            })
        })
        .transpose()
}

// --- the basis text ---

/// `1 GPU`, `4 GPUs`, `0.29 GPU` (MIG fractions with two decimals); written straight
/// into the basis text (no String per part of a big object).
pub(super) fn gpus_text(gpus: f64) -> impl std::fmt::Display {
    struct Gpus(f64);
    impl std::fmt::Display for Gpus {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let gpus = self.0;
            if gpus.fract() == 0.0 {
                let unit = if gpus == 1.0 { "GPU" } else { "GPUs" };
                write!(f, "{gpus:.0} {unit}")
            } else if gpus < 1.0 {
                write!(f, "{gpus:.2} GPU")
            } else {
                write!(f, "{gpus:.2} GPUs")
            }
        }
    }
    Gpus(gpus)
}

/// `1 replica`, `3 replicas`.
pub(super) fn n_text(n: u64, singular: &str) -> impl std::fmt::Display + '_ {
    struct N<'a>(u64, &'a str);
    impl std::fmt::Display for N<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            if self.0 == 1 {
                write!(f, "1 {}", self.1)
            } else {
                write!(f, "{} {}s", self.0, self.1)
            }
        }
    }
    N(n, singular)
}
