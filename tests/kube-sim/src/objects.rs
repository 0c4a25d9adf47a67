//! What the API server does to an object before storing it: identity and timestamps on
//! create, immutable fields and generation on update, the status/main split, the scale
//! view, and managedFields bookkeeping. Pure functions over JSON.

use serde_json::{Value, json};

use crate::fields::{self, Writer};
use crate::resources::{ResourceType, ScalePaths};
use crate::status::ApiError;

/// Who is writing, and through which endpoint.
#[derive(Debug, Clone)]
pub struct WriteCtx<'a> {
    pub t: &'a ResourceType,
    /// The version the client used (apiVersion of the response).
    pub version: &'a str,
    pub manager: &'a str,
    /// `Some("status")` for the status subresource.
    pub subresource: Option<&'a str>,
    pub now: &'a str,
}

impl WriteCtx<'_> {
    pub fn writer(&self) -> Writer<'_> {
        Writer {
            manager: self.manager,
            api_version: self.version,
            subresource: self.subresource,
            now: self.now,
            status_separate: self.t.status,
        }
    }

    fn api_version(&self) -> String {
        self.t.api_version(self.version)
    }
}

/// Whether `name` is a valid DNS-1123 subdomain, which most object names must be.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// Rejects metadata the real server could not decode (wrong JSON types), as 400.
fn check_metadata_shape(metadata: Option<&Value>) -> Result<(), ApiError> {
    let Some(meta) = metadata.filter(|m| !m.is_null()) else {
        return Ok(());
    };
    let bad = |field: &str, want: &str| {
        ApiError::bad_request(format!(
            "json: cannot unmarshal metadata.{field}: expected {want}"
        ))
    };
    let Some(meta) = meta.as_object() else {
        return Err(bad("", "an object"));
    };
    for field in ["labels", "annotations"] {
        match meta.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.values().all(Value::is_string) => {}
            Some(_) => return Err(bad(field, "a map of strings")),
        }
    }
    match meta.get("finalizers") {
        None | Some(Value::Null) => {}
        Some(Value::Array(f)) if f.iter().all(Value::is_string) => {}
        Some(_) => return Err(bad("finalizers", "a list of strings")),
    }
    match meta.get("ownerReferences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(r)) if r.iter().all(Value::is_object) => {}
        Some(_) => return Err(bad("ownerReferences", "a list of objects")),
    }
    for field in ["name", "namespace", "generateName", "resourceVersion"] {
        match meta.get(field) {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(_) => return Err(bad(field, "a string")),
        }
    }
    Ok(())
}

/// Checks `apiVersion`/`kind` of a body against the endpoint and fills them in.
pub fn check_type(ctx: &WriteCtx, body: &mut Value) -> Result<(), ApiError> {
    let Some(map) = body.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    let expected = ctx.api_version();
    for field in ["apiVersion", "kind"] {
        if map
            .get(field)
            .is_some_and(|v| !v.is_string() && !v.is_null())
        {
            return Err(ApiError::bad_request(format!(
                "json: cannot unmarshal {field}: expected a string"
            )));
        }
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != expected => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )));
        }
        _ => {}
    }
    match map.get("kind").and_then(Value::as_str) {
        Some(k) if k != ctx.t.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                ctx.t.kind
            )));
        }
        _ => {}
    }
    check_metadata_shape(map.get("metadata"))?;
    map.insert("apiVersion".into(), json!(expected));
    map.insert("kind".into(), json!(ctx.t.kind));
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), json!({}));
    }
    Ok(())
}

/// Prepares a new object for storage (after `check_type`).
/// `record: false` leaves managedFields to the caller (server-side apply).
pub fn prepare_create(
    ctx: &WriteCtx,
    mut body: Value,
    namespace: Option<&str>,
    record: bool,
) -> Result<Value, ApiError> {
    check_type(ctx, &mut body)?;
    let meta = &mut body["metadata"];
    let mut name = meta["name"].as_str().unwrap_or_default().to_string();
    if name.is_empty() {
        match meta["generateName"].as_str() {
            Some(prefix) if !prefix.is_empty() => name = format!("{prefix}{}", random_suffix()),
            _ => {
                return Err(ApiError::invalid(
                    &ctx.t.group,
                    &ctx.t.kind,
                    "",
                    &[(
                        "metadata.name",
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
        }
    }
    if !is_dns_subdomain(&name) {
        return Err(ApiError::invalid(
            &ctx.t.group,
            &ctx.t.kind,
            &name,
            &[(
                "metadata.name",
                format!(
                    "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            )],
        ));
    }
    if ctx.t.namespaced {
        let path_ns = namespace.unwrap_or("default");
        match meta["namespace"].as_str() {
            Some(ns) if !ns.is_empty() && ns != path_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => meta["namespace"] = json!(path_ns),
        }
    } else if let Some(m) = meta.as_object_mut() {
        m.remove("namespace");
    }
    meta["name"] = json!(name);
    meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
    meta["creationTimestamp"] = json!(ctx.now);
    meta["generation"] = json!(1);
    if let Some(m) = meta.as_object_mut() {
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ] {
            m.remove(f);
        }
    }
    if ctx.t.status
        && let Some(m) = body.as_object_mut()
    {
        m.remove("status");
    }
    if ctx.t.is("", "pods") {
        body["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
    }
    if ctx.t.is("", "namespaces") {
        body["status"] = json!({"phase": "Active"});
        body["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
    }
    if record {
        fields::record_update(None, &mut body, &ctx.writer());
    }
    body["apiVersion"] = json!(ctx.t.api_version(ctx.t.storage_version()));
    Ok(body)
}

/// Everything outside metadata and status: a change there bumps `generation`.
fn spec_part(object: &Value, status_separate: bool) -> Value {
    let mut o = object.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if status_separate {
            m.remove("status");
        }
    }
    o
}

/// Prepares an update of `old` to `new` (PUT body or patched object). `new` has already
/// passed `check_type`. For the status subresource only `status` is taken from `new`.
pub fn prepare_update(
    ctx: &WriteCtx,
    old: &Value,
    new: Value,
    record: bool,
) -> Result<Value, ApiError> {
    // Server-side apply computed these already (`record: false`).
    let applied_fields = new.pointer("/metadata/managedFields").cloned();
    let mut out = if ctx.subresource == Some("status") {
        let mut o = old.clone();
        o["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        if o["status"].is_null()
            && let Some(m) = o.as_object_mut()
        {
            m.remove("status");
        }
        o
    } else {
        let mut n = new;
        if ctx.t.status {
            match old.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        n
    };
    if !out.get("metadata").is_some_and(Value::is_object) {
        out["metadata"] = json!({});
    }
    for f in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old["metadata"].get(f) {
            Some(v) => out["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = out["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        // Finalizers may only be removed from an object being deleted.
        let old_f = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let new_f = out
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if new_f.iter().any(|f| !old_f.contains(f)) {
            return Err(ApiError::new(
                422,
                "Forbidden",
                format!(
                    "{} \"{}\" is forbidden: no new finalizers can be added if the object is being deleted",
                    ctx.t.kind,
                    old["metadata"]["name"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    let generation = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    if spec_part(old, ctx.t.status) != spec_part(&out, ctx.t.status) {
        out["metadata"]["generation"] = json!(generation + 1);
    }
    if record {
        // Clients do not write managedFields through updates here; the server does.
        if let Some(m) = out["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
        if let Some(mf) = old.pointer("/metadata/managedFields") {
            out["metadata"]["managedFields"] = mf.clone();
        }
        fields::record_update(Some(old), &mut out, &ctx.writer());
    } else if let Some(meta) = out["metadata"].as_object_mut() {
        match applied_fields {
            Some(mf) => meta.insert("managedFields".into(), mf),
            None => meta.remove("managedFields"),
        };
    }
    out["apiVersion"] = json!(ctx.t.api_version(ctx.t.storage_version()));
    out["kind"] = json!(ctx.t.kind);
    Ok(out)
}

/// core/v1 Event field ↔ events.k8s.io/v1 Event field, as kube-apiserver converts them.
const EVENT_FIELDS: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("count", "deprecatedCount"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("source", "deprecatedSource"),
];

/// An events.k8s.io/v1 Event in the core/v1 shape it is stored in.
pub fn event_to_core(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        for (core, events) in EVENT_FIELDS {
            if let Some(value) = map.remove(events) {
                map.insert(core.into(), value);
            }
        }
        map.insert("apiVersion".into(), json!("v1"));
    }
    object
}

/// A stored core/v1 Event as events.k8s.io/v1 shows it.
pub fn event_from_core(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        for (core, events) in EVENT_FIELDS {
            if let Some(value) = map.remove(core) {
                map.insert(events.into(), value);
            }
        }
        map.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    }
    object
}

/// Rewrites a stored object for a client of another served version (no conversion
/// webhooks: only `apiVersion` changes; events.k8s.io Events are converted from core).
pub fn for_version(t: &ResourceType, version: &str, mut object: Value) -> Value {
    if crate::store::is_event_alias(&t.group, &t.plural) {
        return event_from_core(object);
    }
    if let Some(m) = object.as_object_mut() {
        m.insert("apiVersion".into(), json!(t.api_version(version)));
    }
    object
}

fn pointer_of(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |mut acc, p| {
            acc.push('/');
            acc.push_str(p);
            acc
        })
}

/// The autoscaling/v1 Scale view of an object.
pub fn scale_of(object: &Value, paths: &ScalePaths) -> Value {
    let meta = &object["metadata"];
    let spec = object
        .pointer(&pointer_of(&paths.spec_replicas))
        .cloned()
        .unwrap_or(json!(0));
    let status = object
        .pointer(&pointer_of(&paths.status_replicas))
        .cloned()
        .unwrap_or(json!(0));
    let mut scale = json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": spec},
        "status": {"replicas": status},
    });
    let selector = match &paths.label_selector {
        Some(p) => object.pointer(&pointer_of(p)).cloned(),
        None => object
            .pointer("/spec/selector/matchLabels")
            .and_then(Value::as_object)
            .map(|labels| {
                json!(
                    labels
                        .iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }),
    };
    if let Some(s) = selector {
        scale["status"]["selector"] = s;
    }
    scale
}

/// The object with the replicas of a Scale written into its spec path.
pub fn with_scale(object: &Value, paths: &ScalePaths, scale: &Value) -> Result<Value, ApiError> {
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .ok_or_else(|| {
            ApiError::invalid(
                "autoscaling",
                "Scale",
                "",
                &[("spec.replicas", "Required value".into())],
            )
        })?;
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            object["metadata"]["name"].as_str().unwrap_or_default(),
            &[(
                "spec.replicas",
                format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            )],
        ));
    }
    let mut out = object.clone();
    let pointer = pointer_of(&paths.spec_replicas);
    let mut node = &mut out;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        if !node.is_object() {
            *node = json!({});
        }
        if i + 1 == parts.len() {
            node[*part] = json!(replicas);
            break;
        }
        node = &mut node[*part];
    }
    Ok(out)
}
