//! The HTTP(S) front: connection handling, routing of discovery and resource paths,
//! content negotiation (JSON, Table, PartialObjectMetadata) and the verb handlers that
//! tie the store, patches, admission and fault injection together.
//!
//! Watches live in `watch`; everything here answers with one JSON body.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::admission::{self, Operation};
use crate::objects::{self, WriteCtx};
use crate::patch::{self, PatchKind};
use crate::resources::{self, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::{ApiError, success_status};
use crate::store::{Propagation, now_rfc3339, object_rv};
use crate::{Shared, watch};

pub type Body = BoxBody<Bytes, std::io::Error>;

/// How many times a patch is retried when the object changes under it.
const PATCH_RETRIES: usize = 5;

/// Accepts connections until `shutdown` flips; each connection is served on its own task.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(_) => continue,
            },
            _ = shutdown.changed() => return,
        };
        let shared = shared.clone();
        let acceptor = acceptor.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(shared, req).await) }
            });
            let builder = hyper::server::conn::http1::Builder::new();
            match acceptor {
                Some(acceptor) => {
                    let Ok(tls_stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(tls_stream), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = conn_shutdown.changed() => {}
                    }
                }
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = conn_shutdown.changed() => {}
                    }
                }
            }
        });
    }
}

/// One parsed request.
pub struct Req {
    pub method: Method,
    pub path: String,
    pub query: HashMap<String, String>,
    pub accept: String,
    pub content_type: String,
    pub user_agent: String,
    pub body: Bytes,
}

impl Req {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn flag(&self, name: &str) -> bool {
        self.param(name) == Some("true")
    }

    fn dry_run(&self) -> bool {
        self.param("dryRun") == Some("All")
    }

    /// The field manager: `fieldManager`, else the client's program name, like the
    /// real server derives it from the user agent.
    fn manager(&self) -> String {
        self.param("fieldManager")
            .map(String::from)
            .unwrap_or_else(|| {
                let ua = self.user_agent.split('/').next().unwrap_or_default();
                if ua.is_empty() {
                    "unknown".into()
                } else {
                    ua.into()
                }
            })
    }

    /// What representation the client asked for.
    pub fn wants(&self) -> Representation {
        if self.accept.contains("as=Table") {
            Representation::Table
        } else if self.accept.contains("as=PartialObjectMetadata") {
            Representation::Metadata
        } else {
            Representation::Full
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    Full,
    Metadata,
    Table,
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A JSON response, with `Warning` headers as kube-apiserver sends them.
pub fn json_response(code: u16, value: &Value, warnings: &[String]) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(full(body));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

pub fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.to_status(), &error.warnings)
}

/// Parses the query string (`a=b&c=d`, percent-decoded).
fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let header = |name: header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let query = parse_query(parts.uri.query());
    if shared.config.trace {
        eprintln!(
            "kube-sim: {} {} accept={:?} content-type={:?}",
            parts.method,
            parts.uri,
            header(header::ACCEPT),
            header(header::CONTENT_TYPE)
        );
    }
    let is_watch = query.get("watch").is_some_and(|w| w == "true" || w == "1")
        || parts.uri.path().contains("/watch/");
    let verdict = shared
        .faults
        .check(parts.method.as_str(), parts.uri.path(), is_watch);
    if let Some(latency) = verdict.latency {
        tokio::time::sleep(latency).await;
    }
    if let Some(code) = verdict.status {
        return forced_error(code, is_watch);
    }
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let req = Req {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        query,
        accept: header(header::ACCEPT),
        content_type: header(header::CONTENT_TYPE),
        user_agent: header(header::USER_AGENT),
        body,
    };
    if !req.accept.is_empty()
        && !req.path.starts_with("/openapi/")
        && !req.accept.contains("json")
        && !req.accept.contains("*/*")
        && !req.accept.contains("yaml")
    {
        return error_response(&ApiError::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json (asked for {})",
                req.accept
            ),
        ));
    }
    if req.content_type.contains("protobuf") || req.content_type.contains("cbor") {
        return error_response(&ApiError::unsupported_media_type(&req.content_type));
    }
    match route(&shared, &req, is_watch).await {
        Ok(response) => response,
        Err(e) => error_response(&e),
    }
}

/// The response for a fault rule's forced status code.
fn forced_error(code: u16, is_watch: bool) -> Response<Body> {
    let error = match code {
        409 => ApiError::new(409, "Conflict", "kube-sim: injected conflict"),
        410 => ApiError::gone("kube-sim: injected: too old resource version"),
        429 => ApiError::new(
            429,
            "TooManyRequests",
            "kube-sim: injected: too many requests, please try again later",
        ),
        500 => ApiError::internal("kube-sim: injected internal error"),
        503 => ApiError::new(
            503,
            "ServiceUnavailable",
            "kube-sim: injected: service unavailable",
        ),
        504 => ApiError::new(
            504,
            "Timeout",
            "kube-sim: injected: the server was unable to return a response in the time allotted",
        ),
        other => ApiError::new(
            other,
            "InternalError",
            format!("kube-sim: injected status {other}"),
        ),
    };
    if is_watch && code == 410 {
        // Like the watch cache: the stream opens, then carries one ERROR event.
        let event = json!({"type": "ERROR", "object": error.to_status()});
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        let mut response = Response::new(full(line));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return response;
    }
    let mut response = error_response(&error);
    if code == 429 {
        // As kube-apiserver's max-in-flight limiter answers (PDB refusals carry none).
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

async fn route(
    shared: &Arc<Shared>,
    req: &Req,
    is_watch: bool,
) -> Result<Response<Body>, ApiError> {
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    let discovery = |value: Option<Value>| -> Result<Response<Body>, ApiError> {
        if req.method != Method::GET {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        value
            .map(|v| json_response(200, &v, &[]))
            .ok_or_else(not_found_path)
    };
    match segments.as_slice() {
        ["version"] => discovery(Some(json!({
            "major": "1", "minor": "34", "gitVersion": "v1.34.0-kube-sim", "gitCommit": "kube-sim",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
            "compiler": "gc", "platform": "linux/amd64",
        }))),
        ["healthz"] | ["readyz"] | ["livez"] => {
            let mut r = Response::new(full("ok"));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            Ok(r)
        }
        ["api"] => discovery(Some(resources::core_versions())),
        ["openapi", "v3"] => discovery(Some(resources::openapi_root(shared.store.lock().types()))),
        ["openapi", "v3", "api", version] => discovery(resources::openapi_group_version(
            shared.store.lock().types(),
            "",
            version,
        )),
        ["openapi", "v3", "apis", group, version] => discovery(resources::openapi_group_version(
            shared.store.lock().types(),
            group,
            version,
        )),
        ["apis"] => discovery(Some(resources::group_list(shared.store.lock().types()))),
        ["api", "v1"] => discovery(resources::resource_list(
            shared.store.lock().types(),
            "",
            "v1",
        )),
        ["apis", group] => discovery(resources::group(shared.store.lock().types(), group)),
        ["apis", group, version] => discovery(resources::resource_list(
            shared.store.lock().types(),
            group,
            version,
        )),
        ["api", "v1", rest @ ..] => resource(shared, req, "", "v1", rest, is_watch).await,
        ["apis", group, version, rest @ ..] => {
            resource(shared, req, group, version, rest, is_watch).await
        }
        _ => Err(not_found_path()),
    }
}

/// A resolved resource path.
#[derive(Debug, Clone)]
pub struct Target {
    pub t: ResourceType,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

impl Target {
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

fn resolve(shared: &Shared, group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let rest = match rest {
        ["watch", tail @ ..] => tail,
        other => other,
    };
    let is_ns_subresource = group.is_empty()
        && rest.len() == 3
        && rest[0] == "namespaces"
        && matches!(rest[2], "status" | "finalize");
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() && !is_ns_subresource => {
            (Some(ns.to_string()), tail)
        }
        other => (None, other),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(not_found_path()),
    };
    let state = shared.store.lock();
    let t = state
        .served_type(group, version, plural)
        .cloned()
        .ok_or_else(not_found_path)?;
    if namespace.is_some() && !t.namespaced {
        return Err(not_found_path());
    }
    if let Some(sub) = &sub {
        let known = match sub.as_str() {
            "status" => t.status,
            "scale" => t.scale.is_some(),
            "eviction" => t.is("", "pods"),
            "finalize" => t.is("", "namespaces"),
            _ => false,
        };
        if !known {
            return Err(not_found_path());
        }
    }
    Ok(Target {
        t,
        version: version.to_string(),
        namespace,
        name,
        sub,
    })
}

async fn resource(
    shared: &Arc<Shared>,
    req: &Req,
    group: &str,
    version: &str,
    rest: &[&str],
    is_watch: bool,
) -> Result<Response<Body>, ApiError> {
    let target = resolve(shared, group, version, rest)?;
    if target.t.namespaced && target.namespace.is_none() && target.name.is_some() {
        return Err(not_found_path());
    }
    match (&req.method, target.name.is_some()) {
        (&Method::GET, _) if is_watch => watch::watch(shared, req, &target),
        (&Method::GET, false) => list(shared, req, &target),
        (&Method::GET, true) => get(shared, req, &target),
        (&Method::POST, false) => create(shared, req, &target).await,
        (&Method::POST, true) if target.sub.as_deref() == Some("eviction") => {
            evict(shared, req, &target).await
        }
        (&Method::PUT, true) => update(shared, req, &target).await,
        (&Method::PATCH, true) => patch_object(shared, req, &target).await,
        (&Method::DELETE, true) if target.sub.is_none() => delete(shared, req, &target).await,
        (&Method::DELETE, false) => delete_collection(shared, req, &target).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} {})",
            req.method, req.path
        ))),
    }
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    Ok(value)
}

/// PartialObjectMetadata of an object.
pub fn metadata_only(object: &Value) -> Value {
    let mut meta = object.get("metadata").cloned().unwrap_or(json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.remove("managedFields");
    }
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
}

fn represent(req: &Req, target: &Target, object: Value) -> Value {
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

fn get(shared: &Shared, req: &Req, target: &Target) -> Result<Response<Body>, ApiError> {
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
fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    use base64::Engine;
    let raw = json!({"rv": rv, "ns": namespace, "name": name}).to_string();
    base64::engine::general_purpose::STANDARD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(u64, (String, String)), ApiError> {
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

fn list(shared: &Shared, req: &Req, target: &Target) -> Result<Response<Body>, ApiError> {
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
    let storage_version = target.version == target.t.storage_version();
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

/// A 200-style response with a body already serialised as JSON.
fn bytes_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn ctx<'a>(
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

fn namespace_exists(shared: &Shared, target: &Target) -> Result<(), ApiError> {
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

async fn create(
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
    let object = objects::prepare_create(&ctx, body, target.namespace.as_deref(), true)?;
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
    let warnings = admission::validate(
        shared,
        target,
        Operation::Create,
        &name,
        Some(&object),
        None,
        req.dry_run(),
    )
    .await?;
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

fn expected_rv(body: &Value) -> Result<Option<u64>, ApiError> {
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

/// Writes `new` over `old` after admission; answers as the endpoint should.
async fn commit_update(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
    old: &Value,
    new: Value,
    expected: u64,
) -> Result<Result<Response<Body>, ApiError>, ApiError> {
    let warnings = admission::validate(
        shared,
        target,
        Operation::Update,
        target.name(),
        Some(&new),
        Some(old),
        req.dry_run(),
    )
    .await?;
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

fn read_current(shared: &Shared, target: &Target) -> Result<Value, ApiError> {
    shared
        .store
        .lock()
        .get(
            &target.t.group,
            &target.t.plural,
            target.ns(),
            target.name(),
        )
        .cloned()
        .ok_or_else(|| ApiError::not_found(&target.t.group, &target.t.plural, target.name()))
}

async fn update(
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

async fn patch_object(
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
            .cloned();
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

fn fields_merge(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

fn check_name(object: &Value, target: &Target) -> Result<(), ApiError> {
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
async fn apply_create(
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
    namespace_exists(shared, target)?;
    let warnings = admission::validate(
        shared,
        target,
        Operation::Create,
        target.name(),
        Some(&object),
        None,
        req.dry_run(),
    )
    .await?;
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
struct DeleteOptions {
    propagation: Propagation,
    uid: Option<String>,
    rv: Option<u64>,
    dry_run: bool,
}

fn delete_options(req: &Req, t: &ResourceType) -> Result<DeleteOptions, ApiError> {
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

async fn delete(
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

async fn delete_collection(
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

/// Resolves a PDB's `minAvailable`/`maxUnavailable` (int or percent) against `expected`.
fn scaled(value: &Value, expected: i64, round_up: bool) -> i64 {
    match value {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let raw = pct * expected;
            if round_up {
                (raw + 99) / 100
            } else {
                raw / 100
            }
        }
        _ => 0,
    }
}

fn is_healthy(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_none()
        && pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
}

/// POST pods/<name>/eviction: deletes the pod unless a matching PDB has no disruption
/// left, in which case 429 as the real server answers.
async fn evict(
    shared: &Arc<Shared>,
    req: &Req,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let body = parse_body(&req.body)?;
    let pod = read_current(shared, target)?;
    let pdbs: Vec<Value> = {
        let state = shared.store.lock();
        state
            .list("policy", "poddisruptionbudgets", Some(target.ns()), None)
            .filter(|(_, pdb)| {
                pdb.pointer("/spec/selector")
                    .is_some_and(|s| LabelSelector::from_object(s).matches(&pod))
            })
            .map(|(_, pdb)| pdb.clone())
            .collect()
    };
    if pdbs.len() > 1 {
        return Err(ApiError::internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ));
    }
    if let Some(pdb) = pdbs.first()
        && is_healthy(&pod)
    {
        let selector = LabelSelector::from_object(&pdb["spec"]["selector"]);
        let (expected, healthy) = {
            let state = shared.store.lock();
            let matching: Vec<&Value> = state
                .list("", "pods", Some(target.ns()), None)
                .map(|(_, p)| p)
                .filter(|p| selector.matches(p))
                .collect();
            (
                matching.len() as i64,
                matching.iter().filter(|p| is_healthy(p)).count() as i64,
            )
        };
        let desired = if let Some(min) = pdb.pointer("/spec/minAvailable") {
            scaled(min, expected, true)
        } else if let Some(max) = pdb.pointer("/spec/maxUnavailable") {
            expected - scaled(max, expected, true)
        } else {
            expected
        };
        if healthy - desired < 1 {
            let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::new(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                )
                .with_details(json!({"causes": [{
                    "reason": "DisruptionBudget",
                    "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"),
                }]})));
        }
    }
    let dry_run = req.dry_run()
        || body
            .pointer("/deleteOptions/dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    // Like kube-apiserver: the eviction is admitted as a CREATE of pods/eviction.
    let mut eviction = body.clone();
    eviction["apiVersion"] = json!("policy/v1");
    eviction["kind"] = json!("Eviction");
    admission::validate(
        shared,
        target,
        Operation::Create,
        target.name(),
        Some(&eviction),
        None,
        dry_run,
    )
    .await?;
    if !dry_run {
        shared.store.lock().delete(
            &target.t,
            target.ns(),
            target.name(),
            Propagation::Background,
            None,
            None,
        )?;
    }
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    Ok(json_response(
        201,
        &success_status("", "pods", target.name(), uid),
        &[],
    ))
}
