//! Field ownership (`metadata.managedFields`, FieldsV1) and server-side apply.
//!
//! A field set is a tree in the FieldsV1 shape (`{"f:spec":{"f:replicas":{}}}`); lists
//! of objects whose items all carry `name` (or `type`, `containerPort`, `port`) are
//! treated as associative lists keyed by it (`k:{"name":"c"}`), every other list is
//! atomic. That heuristic stands in for the OpenAPI list-type markers the real server
//! reads from schemas. Pure functions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::status::ApiError;

/// A FieldsV1 tree; an empty tree is a leaf.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FieldSet(BTreeMap<String, FieldSet>);

/// Metadata fields nobody owns.
const UNOWNED_METADATA: [&str; 9] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

const LIST_KEYS: [&str; 4] = ["name", "type", "containerPort", "port"];

fn list_key(items: &[Value]) -> Option<&'static str> {
    if items.is_empty() {
        return None;
    }
    LIST_KEYS.into_iter().find(|k| {
        items
            .iter()
            .all(|i| i.get(*k).is_some_and(|v| !v.is_null()))
    })
}

fn item_key(key: &str, item: &Value) -> String {
    let mut m = Map::new();
    m.insert(
        key.to_string(),
        item.get(key).cloned().unwrap_or(Value::Null),
    );
    format!("k:{}", Value::Object(m))
}

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields present in `object`. `scope` picks the part a write may own:
    /// everything but status for the main resource, only status for `/status`.
    pub fn of_object(object: &Value, status_only: bool, status_separate: bool) -> Self {
        let mut set = FieldSet::default();
        let Some(map) = object.as_object() else {
            return set;
        };
        for (k, v) in map {
            let keep = match k.as_str() {
                "apiVersion" | "kind" => false,
                "status" => status_only || !status_separate,
                "metadata" => !status_only,
                _ => !status_only,
            };
            if !keep {
                continue;
            }
            let mut child = Self::of_value(v);
            if k == "metadata" {
                for f in UNOWNED_METADATA {
                    child.0.remove(&format!("f:{f}"));
                }
                if child.is_empty() {
                    continue;
                }
            }
            set.0.insert(format!("f:{k}"), child);
        }
        set
    }

    fn of_value(value: &Value) -> Self {
        let mut set = FieldSet::default();
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    set.0.insert(format!("f:{k}"), Self::of_value(v));
                }
            }
            Value::Array(items) => {
                if let Some(key) = list_key(items) {
                    for item in items {
                        let mut child = Self::of_value(item);
                        child.0.insert(".".into(), FieldSet::default());
                        set.0.insert(item_key(key, item), child);
                    }
                }
            }
            _ => {}
        }
        set
    }

    /// Leaves that differ between `old` and `new` (added or changed in `new`).
    pub fn changed(
        old: Option<&Value>,
        new: &Value,
        status_only: bool,
        status_separate: bool,
    ) -> Self {
        let all = Self::of_object(new, status_only, status_separate);
        let Some(old) = old else { return all };
        let mut changed = FieldSet::default();
        for path in all.leaves() {
            if resolve(old, &path) != resolve(new, &path) {
                changed.insert(&path);
            }
        }
        changed
    }

    /// Every path from the root to a leaf.
    pub fn leaves(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        fn walk(set: &FieldSet, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
            for (k, child) in &set.0 {
                prefix.push(k.clone());
                if child.is_empty() {
                    out.push(prefix.clone());
                } else {
                    walk(child, prefix, out);
                }
                prefix.pop();
            }
        }
        walk(self, &mut Vec::new(), &mut out);
        out
    }

    pub fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for p in path {
            node = node.0.entry(p.clone()).or_default();
        }
    }

    pub fn contains(&self, path: &[String]) -> bool {
        let mut node = self;
        for p in path {
            match node.0.get(p) {
                Some(child) => node = child,
                None => return false,
            }
        }
        true
    }

    /// Removes a path and prunes parents left empty.
    pub fn remove(&mut self, path: &[String]) {
        fn go(node: &mut FieldSet, path: &[String]) -> bool {
            let Some((first, rest)) = path.split_first() else {
                return false;
            };
            if rest.is_empty() {
                node.0.remove(first);
            } else if let Some(child) = node.0.get_mut(first)
                && go(child, rest)
                && child.is_empty()
            {
                node.0.remove(first);
            }
            true
        }
        go(self, path);
    }

    pub fn union(&mut self, other: &FieldSet) {
        for path in other.leaves() {
            self.insert(&path);
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(json!({}))
    }

    pub fn from_value(value: &Value) -> Self {
        serde_json::from_value(value.clone()).unwrap_or_default()
    }
}

/// The value at a FieldsV1 path (`f:`/`k:` steps), if present.
fn resolve<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut node = object;
    for step in path {
        if step == "." {
            continue;
        }
        node = if let Some(field) = step.strip_prefix("f:") {
            node.get(field)?
        } else if let Some(key) = step.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(key).ok()?;
            node.as_array()?
                .iter()
                .find(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)))?
        } else {
            return None;
        };
    }
    Some(node)
}

/// Deletes the value at a path (a whole list item for a `k:` step or a trailing `.`).
fn delete_path(object: &mut Value, path: &[String]) {
    let path: Vec<&String> = path.iter().filter(|s| *s != ".").collect();
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for step in parents {
        let next = if let Some(field) = step.strip_prefix("f:") {
            node.get_mut(field)
        } else if let Some(key) = step.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Map<String, Value>>(key) else {
                return;
            };
            node.as_array_mut().and_then(|items| {
                items
                    .iter_mut()
                    .find(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)))
            })
        } else {
            None
        };
        match next {
            Some(n) => node = n,
            None => return,
        }
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(map) = node.as_object_mut() {
            map.remove(field);
        }
    } else if let Some(key) = last.strip_prefix("k:")
        && let (Ok(key), Some(items)) = (
            serde_json::from_str::<Map<String, Value>>(key),
            node.as_array_mut(),
        )
    {
        items.retain(|item| !key.iter().all(|(k, v)| item.get(k) == Some(v)));
    }
}

/// Merges an applied configuration into a live object: maps recursively, associative
/// lists item by item, anything else replaced.
fn merge_applied(live: &mut Value, applied: &Value) {
    match (live, applied) {
        (Value::Object(live), Value::Object(applied)) => {
            for (k, v) in applied {
                match live.get_mut(k) {
                    Some(existing) if !v.is_null() => merge_applied(existing, v),
                    _ => {
                        live.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(live_items), Value::Array(applied_items)) => {
            let key =
                list_key(applied_items).filter(|k| live_items.iter().all(|i| i.get(*k).is_some()));
            match key {
                Some(key) => {
                    for item in applied_items {
                        match live_items.iter_mut().find(|l| l.get(key) == item.get(key)) {
                            Some(existing) => merge_applied(existing, item),
                            None => live_items.push(item.clone()),
                        }
                    }
                }
                None => *live_items = applied_items.clone(),
            }
        }
        (live, applied) => *live = applied.clone(),
    }
}

/// One `managedFields` entry, as parsed from / written to metadata.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    fields: FieldSet,
}

fn entries(object: &Value) -> Vec<Entry> {
    object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or_default().into(),
                    operation: e["operation"].as_str().unwrap_or("Update").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or_default().into(),
                    time: e["time"].as_str().unwrap_or_default().into(),
                    subresource: e
                        .get("subresource")
                        .and_then(Value::as_str)
                        .map(String::from),
                    fields: FieldSet::from_value(e.get("fieldsV1").unwrap_or(&Value::Null)),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_entries(object: &mut Value, entries: Vec<Entry>) {
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": e.fields.to_value(),
            });
            if let Some(s) = e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Who writes, and how: the identity of a managedFields entry.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub subresource: Option<&'a str>,
    pub now: &'a str,
    /// Whether the type keeps status in a subresource.
    pub status_separate: bool,
}

/// Records a non-apply write (create, update, patch): the changed fields become the
/// writer's (operation `Update`) and leave every other manager.
pub fn record_update(old: Option<&Value>, new: &mut Value, writer: &Writer) {
    let status_only = writer.subresource == Some("status");
    let changed = FieldSet::changed(old, new, status_only, writer.status_separate);
    let mut list = old.map(entries).unwrap_or_default();
    if changed.is_empty() {
        write_entries(new, list);
        return;
    }
    for e in list.iter_mut() {
        for path in changed.leaves() {
            e.fields.remove(&path);
        }
    }
    match list.iter_mut().find(|e| {
        e.manager == writer.manager
            && e.operation == "Update"
            && e.subresource.as_deref() == writer.subresource
    }) {
        Some(e) => {
            e.fields.union(&changed);
            e.time = writer.now.into();
            e.api_version = writer.api_version.into();
        }
        None => list.push(Entry {
            manager: writer.manager.into(),
            operation: "Update".into(),
            api_version: writer.api_version.into(),
            time: writer.now.into(),
            subresource: writer.subresource.map(String::from),
            fields: changed,
        }),
    }
    write_entries(new, list);
}

fn dotted(path: &[String]) -> String {
    let mut out = String::new();
    for step in path {
        if let Some(f) = step.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = step.strip_prefix("k:") {
            out.push('[');
            out.push_str(&k.replace(['{', '}'], "").replace(':', "="));
            out.push(']');
        }
    }
    out
}

/// Server-side apply of `applied` onto `live` (`None`: the object is created).
/// Returns the merged object with managedFields updated, or 409 with one cause per
/// conflicting field when another manager owns a field set to a different value and
/// `force` is off.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    writer: &Writer,
    force: bool,
) -> Result<Value, ApiError> {
    let status_only = writer.subresource == Some("status");
    let applied_set = FieldSet::of_object(applied, status_only, writer.status_separate);
    let mut list = live.map(entries).unwrap_or_default();
    let mine = |e: &Entry| {
        e.manager == writer.manager
            && e.operation == "Apply"
            && e.subresource.as_deref() == writer.subresource
    };
    let mut conflicts: Vec<(String, Vec<String>)> = Vec::new();
    if let Some(live) = live {
        for e in list.iter().filter(|e| !mine(e)) {
            for path in applied_set.leaves() {
                if e.fields.contains(&path) && resolve(live, &path) != resolve(applied, &path) {
                    conflicts.push((e.manager.clone(), path));
                }
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, p)| json!({"type": "FieldManagerConflict", "message": format!("conflict with {m:?}"), "field": dotted(p)}))
            .collect();
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(m, p)| format!("conflict with {m:?}: {}", dotted(p)))
            .collect();
        let message = if conflicts.len() == 1 {
            format!("Apply failed with 1 conflict: {}", lines[0])
        } else {
            format!(
                "Apply failed with {} conflicts: {}",
                conflicts.len(),
                lines.join("\n")
            )
        };
        return Err(ApiError::new(409, "Conflict", message).with_details(json!({"causes": causes})));
    }
    for (manager, path) in &conflicts {
        for e in list.iter_mut().filter(|e| &e.manager == manager) {
            e.fields.remove(path);
        }
    }
    let mut merged = live.cloned().unwrap_or_else(|| json!({}));
    // Fields this manager applied before but no longer does go, unless someone else owns them.
    if let Some(previous) = list.iter().find(|e| mine(e)) {
        for path in previous.fields.leaves() {
            if !applied_set.contains(&path)
                && !list.iter().any(|e| !mine(e) && e.fields.contains(&path))
            {
                delete_path(&mut merged, &path);
            }
        }
    }
    let mut body = applied.clone();
    if let Some(map) = body.as_object_mut() {
        if status_only {
            map.retain(|k, _| k == "status");
        } else if writer.status_separate {
            map.remove("status");
        }
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
            meta.remove("resourceVersion");
        }
    }
    merge_applied(&mut merged, &body);
    list.retain(|e| !mine(e));
    list.push(Entry {
        manager: writer.manager.into(),
        operation: "Apply".into(),
        api_version: writer.api_version.into(),
        time: writer.now.into(),
        subresource: writer.subresource.map(String::from),
        fields: applied_set,
    });
    write_entries(&mut merged, list);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            api_version: "apps/v1",
            subresource: None,
            now: "2026-01-01T00:00:00Z",
            status_separate: true,
        }
    }

    #[test]
    fn containers_are_an_associative_list_keyed_by_name() {
        let set = FieldSet::of_object(
            &json!({"spec": {"containers": [{"name": "a", "image": "x"}]}}),
            false,
            true,
        );
        assert_eq!(
            set.to_value(),
            json!({"f:spec": {"f:containers": {"k:{\"name\":\"a\"}": {".": {}, "f:image": {}, "f:name": {}}}}})
        );
    }

    #[test]
    fn apply_conflicts_with_another_managers_field_unless_forced() {
        let mut live = json!({"metadata": {"name": "d"}, "spec": {"replicas": 1}});
        record_update(None, &mut live, &writer("kubectl-scale"));
        let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 3}});
        let err = apply(Some(&live), &applied, &writer("mine"), false).unwrap_err();
        assert_eq!(err.code, 409);
        assert!(
            err.message
                .contains("conflict with \"kubectl-scale\": .spec.replicas"),
            "{}",
            err.message
        );
        let forced = apply(Some(&live), &applied, &writer("mine"), true).unwrap();
        assert_eq!(forced["spec"]["replicas"], 3);
        let managers: Vec<&str> = forced["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, vec!["mine"]);
    }

    #[test]
    fn applying_the_same_value_as_another_manager_shares_ownership() {
        let mut live = json!({"metadata": {"name": "d"}, "spec": {"replicas": 3}});
        record_update(None, &mut live, &writer("other"));
        let applied = json!({"metadata": {"name": "d"}, "spec": {"replicas": 3}});
        assert!(apply(Some(&live), &applied, &writer("mine"), false).is_ok());
    }

    #[test]
    fn fields_dropped_from_the_applied_config_are_removed() {
        let first = json!({"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}}});
        let live = apply(None, &first, &writer("mine"), false).unwrap();
        let second = json!({"metadata": {"name": "c", "labels": {"a": "1"}}});
        let live = apply(Some(&live), &second, &writer("mine"), false).unwrap();
        assert_eq!(live["metadata"]["labels"], json!({"a": "1"}));
    }
}
