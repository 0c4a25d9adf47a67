//! Server-side printing: the meta.k8s.io/v1 `Table` that `kubectl get` asks for.
//! Name and Age for every type, READY/STATUS/RESTARTS for pods, and a CRD's
//! `additionalPrinterColumns` (JSONPath subset: `.a.b`, `[n]`, `[?(@.k=="v")]`).
//! Pure functions.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// Age as kubectl shows it (`45s`, `12m`, `5h`, `3d`).
pub fn age(created: Option<&str>) -> String {
    let Some(Ok(created)) = created.map(str::parse::<jiff::Timestamp>) else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - created.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 2 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Evaluates the JSONPath subset used by printer columns; `None` when absent.
pub fn json_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let mut node = object;
    let mut rest = path.trim().trim_start_matches('{').trim_end_matches('}');
    rest = rest.strip_prefix('$').unwrap_or(rest);
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            node = node.get(&after[..end])?;
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix("[?(@.") {
            let end = after.find(")]")?;
            let (key, want) = after[..end].split_once("==")?;
            let want = want.trim().trim_matches(['"', '\'']);
            node = node
                .as_array()?
                .iter()
                .find(|item| item.get(key.trim()).and_then(Value::as_str) == Some(want))?;
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            node = node.get(after[..end].trim().parse::<usize>().ok()?)?;
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    Some(node)
}

struct Column {
    name: String,
    kind: String,
    priority: i64,
    cell: Box<dyn Fn(&Value) -> Value>,
}

fn columns(t: &ResourceType) -> Vec<Column> {
    let mut columns = vec![Column {
        name: "Name".into(),
        kind: "string".into(),
        priority: 0,
        cell: Box::new(|o: &Value| o["metadata"]["name"].clone()),
    }];
    if t.is("", "pods") {
        columns.push(Column {
            name: "Ready".into(),
            kind: "string".into(),
            priority: 0,
            cell: Box::new(|o: &Value| {
                let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
                let ready = o["status"]["containerStatuses"]
                    .as_array()
                    .map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
                json!(format!("{ready}/{total}"))
            }),
        });
        columns.push(Column {
            name: "Status".into(),
            kind: "string".into(),
            priority: 0,
            cell: Box::new(|o: &Value| {
                if o.pointer("/metadata/deletionTimestamp").is_some() {
                    return json!("Terminating");
                }
                o["status"]["reason"]
                    .as_str()
                    .or(o["status"]["phase"].as_str())
                    .map_or(json!("Unknown"), |s| json!(s))
            }),
        });
        columns.push(Column {
            name: "Restarts".into(),
            kind: "string".into(),
            priority: 0,
            cell: Box::new(|o: &Value| {
                let restarts: i64 = o["status"]["containerStatuses"].as_array().map_or(0, |s| {
                    s.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
                });
                json!(restarts.to_string())
            }),
        });
    }
    columns.extend(builtin_columns(t));
    for c in &t.printer_columns {
        let (path, kind) = (c.json_path.clone(), c.kind.clone());
        columns.push(Column {
            name: c.name.clone(),
            kind: c.kind.clone(),
            priority: c.priority,
            cell: Box::new(move |o: &Value| match json_path(o, &path) {
                None => Value::Null,
                Some(Value::String(s)) if kind == "date" => json!(age(Some(s))),
                Some(v) => v.clone(),
            }),
        });
    }
    if !t
        .printer_columns
        .iter()
        .any(|c| c.name.eq_ignore_ascii_case("age"))
    {
        columns.push(Column {
            name: "Age".into(),
            kind: "string".into(),
            priority: 0,
            cell: Box::new(|o: &Value| {
                json!(age(o
                    .pointer("/metadata/creationTimestamp")
                    .and_then(Value::as_str)))
            }),
        });
    }
    columns
}

fn int(o: &Value, pointer: &str) -> i64 {
    o.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn text(name: &str, cell: impl Fn(&Value) -> String + 'static) -> Column {
    Column {
        name: name.into(),
        kind: "string".into(),
        priority: 0,
        cell: Box::new(move |o: &Value| json!(cell(o))),
    }
}

/// The main columns kube-apiserver prints for a few more built-in types.
fn builtin_columns(t: &ResourceType) -> Vec<Column> {
    match (t.group.as_str(), t.plural.as_str()) {
        ("", "namespaces") => vec![text("Status", |o| {
            o["status"]["phase"].as_str().unwrap_or("Active").into()
        })],
        ("", "nodes") => vec![
            text("Status", |o| {
                let ready = o["status"]["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                    .is_some_and(|c| c["status"] == "True");
                if ready {
                    "Ready".into()
                } else {
                    "NotReady".into()
                }
            }),
            text("Version", |o| {
                o["status"]["nodeInfo"]["kubeletVersion"]
                    .as_str()
                    .unwrap_or("")
                    .into()
            }),
        ],
        ("", "configmaps") => vec![text("Data", |o| {
            let count = |f: &str| o[f].as_object().map_or(0, |m| m.len());
            (count("data") + count("binaryData")).to_string()
        })],
        ("apps", "deployments") => vec![
            text("Ready", |o| {
                format!(
                    "{}/{}",
                    int(o, "/status/readyReplicas"),
                    int(o, "/spec/replicas")
                )
            }),
            text("Up-to-date", |o| {
                int(o, "/status/updatedReplicas").to_string()
            }),
            text("Available", |o| {
                int(o, "/status/availableReplicas").to_string()
            }),
        ],
        ("apps", "statefulsets") => vec![text("Ready", |o| {
            format!(
                "{}/{}",
                int(o, "/status/readyReplicas"),
                int(o, "/spec/replicas")
            )
        })],
        ("apps", "replicasets") => vec![
            text("Desired", |o| int(o, "/spec/replicas").to_string()),
            text("Current", |o| int(o, "/status/replicas").to_string()),
            text("Ready", |o| int(o, "/status/readyReplicas").to_string()),
        ],
        ("batch", "jobs") => vec![text("Completions", |o| {
            let wanted = o
                .pointer("/spec/completions")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            format!("{}/{wanted}", int(o, "/status/succeeded"))
        })],
        _ => Vec::new(),
    }
}

/// A Table of `objects`; each row carries the object's metadata (kubectl reads the
/// namespace for `-A` from it).
pub fn table(
    t: &ResourceType,
    objects: &[Value],
    rv: u64,
    continue_token: Option<String>,
) -> Value {
    let columns = columns(t);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let cells: Vec<Value> = columns.iter().map(|c| (c.cell)(o)).collect();
            json!({"cells": cells, "object": crate::http::metadata_only(o)})
        })
        .collect();
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            let format = if c.name == "Name" { "name" } else { "" };
            json!({"name": c.name, "type": if c.kind == "date" { "string" } else { c.kind.as_str() }, "format": format, "description": "", "priority": c.priority})
        })
        .collect();
    let mut table = json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": definitions,
        "rows": rows,
    });
    if let Some(token) = continue_token {
        table["metadata"]["continue"] = json!(token);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_follows_fields_indexes_and_filters() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"xs": [1, 2]}});
        assert_eq!(
            json_path(&o, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(&json!("True"))
        );
        assert_eq!(json_path(&o, ".spec.xs[1]"), Some(&json!(2)));
        assert_eq!(json_path(&o, ".spec.missing"), None);
        assert_eq!(json_path(&o, "garbage"), None);
    }
}
