//! Write verbs: create, update (PUT), patch (all four kinds, with retries), delete and
//! deletecollection, each through admission, including status and scale subresources.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use crate::Shared;
use crate::admission::{self, Operation};
use crate::http::{Body, PATCH_RETRIES, Req, Target, json_response, not_found_path, parse_body};
use crate::objects::{self, WriteCtx};
use crate::patch::{self, PatchKind};
use crate::read::{represent, selectors};
use crate::resources::ResourceType;
use crate::schema::{self, FieldValidation};
use crate::status::ApiError;
use crate::store::{Propagation, now_rfc3339, object_rv};

pub(crate) fn ctx<'a>(
    target: &'a Target,
    manager: &'a str,
    now: &'a str,
    sub: Option<&'a str>,
) -> WriteCtx<'a> {
    WriteCtx {
        t: &target.t,
        version: &target.version,
        manager,
        subresource: sub,
        now,
    }
}

pub(crate) fn namespace_exists(shared: &Shared, target: &Target) -> Result<(), ApiError> {
    if target.t.namespaced
        && shared
            .store
            .lock()
            .get("", "namespaces", "", target.ns())
            .is_none()
    {
        return Err(ApiError::not_found("", "namespaces", target.ns()));
    }
    Ok(())
}

pub(crate) async fn create(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    if target.t.namespaced && target.namespace.is_none() {
        return Err(ApiError::method_not_allowed(
            "POST to a namespaced resource needs a namespace in the path",
        ));
    }
    let body = parse_body(&req.body)?;
    let manager = req.manager();
    let now = now_rfc3339();
    let ctx = ctx(target, &manager, &now, None);
    let mut object = objects::prepare_create(&ctx, body, target.namespace.as_deref(), true)?;
    let mut warnings = custom_schema(shared, req, target, &mut object, None)?;
    namespace_exists(shared, target)?;
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if shared
        .store
        .lock()
        .get(&target.t.group, &target.t.plural, target.ns(), &name)
        .is_some()
    {
        return Err(ApiError::already_exists(
            &target.t.group,
            &target.t.plural,
            &name,
        ));
    }
    warnings.extend(
        admission::validate(
            shared,
            target,
            Operation::Create,
            &name,
            Some(&object),
            None,
            req.dry_run(),
        )
        .await?,
    );
    let stored = if req.dry_run() {
        object
    } else {
        shared.store.lock().insert(&target.t, object)?
    };
    Ok(json_response(
        201,
        &represent(req, target, stored),
        &warnings,
    ))
}

pub(crate) fn expected_rv(body: &Value) -> Result<Option<u64>, ApiError> {
    match body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        None | Some("") => Ok(None),
        Some(rv) => rv
            .parse()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}"))),
    }
}

/// Applies a custom resource's CRD schema (defaults, pruning, validation) to a write.
fn custom_schema(
    shared: &Shared,
    req: &Req,
    target: &Target,
    object: &mut Value,
    old: Option<&Value>,
) -> Result<Vec<String>, ApiError> {
    let Some(crd) = &target.t.crd else {
        return Ok(Vec::new());
    };
    let schema = shared
        .store
        .lock()
        .get("apiextensions.k8s.io", "customresourcedefinitions", "", crd)
        .and_then(|crd| schema::schema_for(crd, &target.version));
    let Some(schema) = schema else {
        return Ok(Vec::new());
    };
    schema::admit(
        &schema,
        object,
        old,
        FieldValidation::from_param(req.param("fieldValidation")),
        (&target.t.kind, &target.t.group),
        &target.t.api_version(&target.version),
    )
}

/// Writes `new` over `old` after admission; answers as the endpoint should.
pub(crate) async fn commit_update(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
    old: &Value,
    mut new: Value,
    expected: u64,
) -> Result<Result<Response<Body>, ApiError>, ApiError> {
    let mut warnings = custom_schema(shared, req, target, &mut new, Some(old))?;
    warnings.extend(
        admission::validate(
            shared,
            target,
            Operation::Update,
            target.name(),
            Some(&new),
            Some(old),
            req.dry_run(),
        )
        .await?,
    );
    let stored = if req.dry_run() {
        Ok(new)
    } else {
        shared.store.lock().replace(&target.t, new, Some(expected))
    };
    Ok(stored.map(|stored| {
        let view = match (&target.sub.as_deref(), &target.t.scale) {
            (Some("scale"), Some(paths)) => objects::scale_of(&stored, paths),
            _ => represent(req, target, stored),
        };
        json_response(200, &view, &warnings)
    }))
}

pub(crate) fn read_current(shared: &Shared, target: &Target) -> Result<Value, ApiError> {
    let stored = shared
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
    // Writers and webhooks see the object as the requested API shows it.
    Ok(objects::for_version(&target.t, &target.version, stored))
}

pub(crate) async fn update(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let mut body = parse_body(&req.body)?;
    let manager = req.manager();
    let now = now_rfc3339();
    let sub = target.sub.as_deref();
    let ctx = ctx(target, &manager, &now, sub);
    let sent_rv = expected_rv(&body)?;
    if sub != Some("scale") {
        objects::check_type(&ctx, &mut body)?;
        let body_name = body["metadata"]["name"].as_str().unwrap_or_default();
        if body_name != target.name() {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                target.name()
            )));
        }
    }
    for _ in 0..PATCH_RETRIES {
        let old = read_current(shared, target)?;
        let new = match (sub, &target.t.scale) {
            (Some("scale"), Some(paths)) => {
                let scaled = objects::with_scale(&old, paths, &body)?;
                objects::prepare_update(&ctx, &old, scaled, true)?
            }
            _ => objects::prepare_update(&ctx, &old, body.clone(), true)?,
        };
        let expected = sent_rv.unwrap_or_else(|| object_rv(&old));
        match commit_update(shared, req, target, &old, new, expected).await? {
            Err(e) if e.reason == "Conflict" && sent_rv.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::conflict(
        &target.t.group,
        &target.t.plural,
        target.name(),
        "the object kept changing",
    ))
}

pub(crate) async fn patch_object(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let kind = PatchKind::from_content_type(&req.content_type)?;
    let patch_body = patch::parse_body(kind, &req.body)?;
    let manager = req.manager();
    if kind == PatchKind::Apply && req.param("fieldManager").is_none() {
        return Err(ApiError::bad_request(
            "PATCH apply requires a field manager: fieldManager is required for apply requests",
        ));
    }
    let now = now_rfc3339();
    let sub = target.sub.as_deref();
    let ctx = ctx(target, &manager, &now, sub);
    let force = req.flag("force");
    let sent_rv = if patch_body.is_object() {
        expected_rv(&patch_body)?
    } else {
        None
    };
    for _ in 0..PATCH_RETRIES {
        let current = shared
            .store
            .lock()
            .get(
                &target.t.group,
                &target.t.plural,
                target.ns(),
                target.name(),
            )
            .cloned()
            .map(|o| objects::for_version(&target.t, &target.version, o));
        let new = match (kind, current.as_ref(), sub) {
            (PatchKind::Apply, None, None) => {
                return apply_create(shared, req, target, &ctx, patch_body, force).await;
            }
            (_, None, _) => {
                return Err(ApiError::not_found(
                    &target.t.group,
                    &target.t.plural,
                    target.name(),
                ));
            }
            (_, Some(old), Some("scale")) => {
                let paths = target.t.scale.as_ref().ok_or_else(not_found_path)?;
                let mut scale = objects::scale_of(old, paths);
                if kind == PatchKind::Apply {
                    fields_merge(&mut scale, &patch_body);
                } else {
                    patch::apply_patch(kind, &mut scale, &patch_body)?;
                }
                let scaled = objects::with_scale(old, paths, &scale)?;
                objects::prepare_update(&ctx, old, scaled, true)?
            }
            (PatchKind::Apply, Some(old), _) => {
                let mut applied = patch_body.clone();
                objects::check_type(&ctx, &mut applied)?;
                check_name(&applied, target)?;
                let merged = crate::fields::apply(Some(old), &applied, &ctx.writer(), force)?;
                objects::prepare_update(&ctx, old, merged, false)?
            }
            (_, Some(old), _) => {
                let mut patched = objects::for_version(&target.t, &target.version, old.clone());
                patch::apply_patch(kind, &mut patched, &patch_body)?;
                objects::check_type(&ctx, &mut patched)?;
                check_name(&patched, target)?;
                objects::prepare_update(&ctx, old, patched, true)?
            }
        };
        let old = current.as_ref().ok_or_else(not_found_path)?;
        let expected = sent_rv.unwrap_or_else(|| object_rv(old));
        match commit_update(shared, req, target, old, new, expected).await? {
            Err(e) if e.reason == "Conflict" && sent_rv.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::conflict(
        &target.t.group,
        &target.t.plural,
        target.name(),
        "the object kept changing",
    ))
}

pub(crate) fn fields_merge(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

pub(crate) fn check_name(object: &Value, target: &Target) -> Result<(), ApiError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name != target.name() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            target.name()
        )));
    }
    Ok(())
}

/// Server-side apply of an object that does not exist yet: it is created.
pub(crate) async fn apply_create(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
    ctx: &WriteCtx<'_>,
    mut applied: Value,
    force: bool,
) -> Result<Response<Body>, ApiError> {
    objects::check_type(ctx, &mut applied)?;
    check_name(&applied, target)?;
    let merged = crate::fields::apply(None, &applied, &ctx.writer(), force)?;
    let mut object = objects::prepare_create(ctx, applied, target.namespace.as_deref(), false)?;
    if let Some(mf) = merged.pointer("/metadata/managedFields") {
        object["metadata"]["managedFields"] = mf.clone();
    }
    let mut warnings = custom_schema(shared, req, target, &mut object, None)?;
    namespace_exists(shared, target)?;
    warnings.extend(
        admission::validate(
            shared,
            target,
            Operation::Create,
            target.name(),
            Some(&object),
            None,
            req.dry_run(),
        )
        .await?,
    );
    let stored = if req.dry_run() {
        object
    } else {
        shared.store.lock().insert(&target.t, object)?
    };
    Ok(json_response(
        201,
        &represent(req, target, stored),
        &warnings,
    ))
}

/// DeleteOptions from the body and the query string.
pub(crate) struct DeleteOptions {
    propagation: Propagation,
    uid: Option<String>,
    rv: Option<u64>,
    dry_run: bool,
}

pub(crate) fn delete_options(req: &Req, t: &ResourceType) -> Result<DeleteOptions, ApiError> {
    let body = if req.body.is_empty() {
        json!({})
    } else {
        parse_body(&req.body)?
    };
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or(req.param("propagationPolicy"))
        .map(String::from);
    let orphan = body.get("orphanDependents").and_then(Value::as_bool) == Some(true);
    let propagation = match policy.as_deref() {
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some("Background") => Propagation::Background,
        Some(other) => {
            return Err(ApiError::invalid(
                "",
                "DeleteOptions",
                "",
                &[("propagationPolicy", format!("Unsupported value: {other:?}"))],
            ));
        }
        // batch/v1 Jobs default to orphaning their pods, as in the real server.
        None if orphan || t.is("batch", "jobs") => Propagation::Orphan,
        None => Propagation::Background,
    };
    let dry_run = req.dry_run()
        || body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    Ok(DeleteOptions {
        propagation,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        rv: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok()),
        dry_run,
    })
}

pub(crate) async fn delete(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let options = delete_options(req, &target.t)?;
    let current = read_current(shared, target)?;
    let warnings = admission::validate(
        shared,
        target,
        Operation::Delete,
        target.name(),
        None,
        Some(&current),
        options.dry_run,
    )
    .await?;
    if options.dry_run {
        return Ok(json_response(
            200,
            &represent(req, target, current),
            &warnings,
        ));
    }
    let result = shared.store.lock().delete(
        &target.t,
        target.ns(),
        target.name(),
        options.propagation,
        options.uid.as_deref(),
        options.rv,
    )?;
    Ok(json_response(
        200,
        &represent(req, target, result),
        &warnings,
    ))
}

pub(crate) async fn delete_collection(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let options = delete_options(req, &target.t)?;
    let (labels, fields) = selectors(req, target)?;
    let names: Vec<(String, String)> = shared
        .store
        .lock()
        .list(
            &target.t.group,
            &target.t.plural,
            target.namespace.as_deref(),
            None,
        )
        .filter(|(_, o)| labels.matches(o) && fields.matches(o))
        .map(|(k, _)| k.clone())
        .collect();
    let mut deleted = Vec::new();
    for (ns, name) in names {
        // Each item is admitted on its own, as kube-apiserver does; a denial stops here.
        let item = Target {
            namespace: target.t.namespaced.then(|| ns.clone()),
            name: Some(name.clone()),
            ..target.clone()
        };
        let Some(current) = shared
            .store
            .lock()
            .get(&target.t.group, &target.t.plural, &ns, &name)
            .cloned()
        else {
            continue;
        };
        admission::validate(
            shared,
            &item,
            Operation::Delete,
            &name,
            None,
            Some(&current),
            options.dry_run,
        )
        .await?;
        if options.dry_run {
            deleted.push(objects::for_version(&target.t, &target.version, current));
            continue;
        }
        if let Ok(o) =
            shared
                .store
                .lock()
                .delete(&target.t, &ns, &name, options.propagation, None, None)
        {
            deleted.push(objects::for_version(&target.t, &target.version, o));
        }
    }
    let rv = shared.store.lock().resource_version();
    Ok(json_response(
        200,
        &json!({
            "kind": target.t.list_kind, "apiVersion": target.t.api_version(&target.version),
            "metadata": {"resourceVersion": rv.to_string()}, "items": deleted,
        }),
        &[],
    ))
}
