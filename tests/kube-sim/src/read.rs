//! Read verbs: get (full, metadata-only or Table) and list (selectors, pagination,
//! resourceVersion checks), serialised without copying stored objects.

use http::Response;
use serde_json::{Value, json};

use crate::Shared;
use crate::http::{
    Body, Representation, Req, Target, bytes_response, json_response, metadata_only, not_found_path,
};
use crate::objects;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::object_rv;

pub(crate) fn represent(req: &Req, target: &Target, object: Value) -> Value {
    let object = objects::for_version(&target.t, &target.version, object);
    match req.wants() {
        Representation::Full => object,
        Representation::Metadata => metadata_only(&object),
        Representation::Table => {
            let rv = object_rv(&object);
            crate::table::table(&target.t, &[object], rv, None)
        }
    }
}

pub(crate) fn get(shared: &Shared, req: &Req, target: &Target) -> Result<Response<Body>, ApiError> {
    let object = shared
        .store
        .lock()
        .get(
            &target.t.group,
            &target.t.plural,
            target.ns(),
            target.name(),
        )
        .cloned()
        .ok_or_else(|| ApiError::not_found(&target.t.group, &target.t.plural, target.name()))?;
    if target.sub.as_deref() == Some("scale") {
        let paths = target.t.scale.as_ref().ok_or_else(not_found_path)?;
        return Ok(json_response(200, &objects::scale_of(&object, paths), &[]));
    }
    Ok(json_response(200, &represent(req, target, object), &[]))
}

/// A continue token: where the next page starts and the list's resourceVersion.
pub(crate) fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    use base64::Engine;
    let raw = json!({"rv": rv, "ns": namespace, "name": name}).to_string();
    base64::engine::general_purpose::STANDARD.encode(raw)
}

pub(crate) fn decode_continue(token: &str) -> Result<(u64, (String, String)), ApiError> {
    use base64::Engine;
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let value: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((
        value["rv"].as_u64().ok_or_else(bad)?,
        (
            value["ns"].as_str().ok_or_else(bad)?.to_string(),
            value["name"].as_str().ok_or_else(bad)?.to_string(),
        ),
    ))
}

/// Selectors of a list or watch request.
pub fn selectors(req: &Req, target: &Target) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(
        req.param("fieldSelector").unwrap_or_default(),
        &target.t.group,
        &target.t.plural,
    )?;
    Ok((labels, fields))
}

pub(crate) fn list(
    shared: &Shared,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = selectors(req, target)?;
    let limit: usize = match req.param("limit") {
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?
            .max(0) as usize,
        None => 0,
    };
    let continued = req.param("continue").map(decode_continue).transpose()?;
    let mut items: Vec<std::sync::Arc<Value>> = Vec::new();
    let mut next = None;
    let rv;
    {
        let state = shared.store.lock();
        if let Some((token_rv, _)) = &continued
            && *token_rv < state.compacted()
        {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            ));
        }
        if let (Some("Exact"), Some(asked)) = (
            req.param("resourceVersionMatch"),
            req.param("resourceVersion"),
        ) {
            let asked: u64 = asked
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {asked:?}")))?;
            // Only the newest state is kept: an older exact version is gone.
            if asked != state.resource_version() {
                return Err(ApiError::gone(format!(
                    "too old resource version: {asked} ({})",
                    state.resource_version()
                )));
            }
        }
        rv = continued
            .as_ref()
            .map(|(r, _)| *r)
            .unwrap_or_else(|| state.resource_version());
        let after = continued.as_ref().map(|(_, key)| key);
        let mut iter = state
            .list_shared(
                &target.t.group,
                &target.t.plural,
                target.namespace.as_deref(),
                after,
            )
            .filter(|(_, o)| labels.matches(o) && fields.matches(o));
        for (key, object) in iter.by_ref() {
            items.push(object.clone());
            if limit > 0 && items.len() == limit {
                next = Some(key.clone());
                break;
            }
        }
        if next.is_some() && iter.next().is_none() {
            next = None;
        }
    }
    // Serialised after the lock is released, without copying the objects.
    let continue_token = next.map(|(ns, name)| encode_continue(rv, &ns, &name));
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(token) = &continue_token {
        metadata["continue"] = json!(token);
    }
    let storage_version = target.version == target.t.storage_version()
        && !crate::store::is_event_alias(&target.t.group, &target.t.plural);
    let converted = |o: &Value| objects::for_version(&target.t, &target.version, o.clone());
    let (kind, api_version, rendered): (String, String, Vec<Value>) = match req.wants() {
        Representation::Table => {
            let objects: Vec<Value> = items.iter().map(|o| converted(o)).collect();
            return Ok(json_response(
                200,
                &crate::table::table(&target.t, &objects, rv, continue_token),
                &[],
            ));
        }
        Representation::Metadata => (
            "PartialObjectMetadataList".into(),
            "meta.k8s.io/v1".into(),
            items.iter().map(|o| metadata_only(o)).collect(),
        ),
        Representation::Full if storage_version => (
            target.t.list_kind.clone(),
            target.t.api_version(&target.version),
            Vec::new(),
        ),
        Representation::Full => (
            target.t.list_kind.clone(),
            target.t.api_version(&target.version),
            items.iter().map(|o| converted(o)).collect(),
        ),
    };
    let mut body = Vec::with_capacity(64 + items.len() * 1024);
    body.extend_from_slice(b"{\"kind\":");
    let _ = serde_json::to_writer(&mut body, &kind);
    body.extend_from_slice(b",\"apiVersion\":");
    let _ = serde_json::to_writer(&mut body, &api_version);
    body.extend_from_slice(b",\"metadata\":");
    let _ = serde_json::to_writer(&mut body, &metadata);
    body.extend_from_slice(b",\"items\":[");
    let mut write_item = |i: usize, item: &Value| {
        if i > 0 {
            body.push(b',');
        }
        let _ = serde_json::to_writer(&mut body, item);
    };
    if rendered.is_empty() {
        for (i, item) in items.iter().enumerate() {
            write_item(i, item);
        }
    } else {
        for (i, item) in rendered.iter().enumerate() {
            write_item(i, item);
        }
    }
    body.extend_from_slice(b"]}");
    Ok(bytes_response(200, body))
}
