//! The HTTP(S) front: connection handling, fault injection at the door, routing of
//! discovery and resource paths, content negotiation (JSON, Table,
//! PartialObjectMetadata) and response helpers. The verbs live in `read`, `write`,
//! `eviction` and `watch`.

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

use crate::resources::{self, ResourceType};
use crate::status::ApiError;
use crate::{Shared, watch};

pub type Body = BoxBody<Bytes, std::io::Error>;

/// How many times a patch is retried when the object changes under it.
pub(crate) const PATCH_RETRIES: usize = 5;

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
                Err(_) => {
                    // Out of file descriptors or similar: do not spin.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
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
    /// The `Authorization` header (a service-account token makes the request RBAC-checked).
    pub authorization: String,
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

    pub fn dry_run(&self) -> bool {
        self.param("dryRun") == Some("All")
    }

    /// The field manager: `fieldManager`, else the client's program name, like the
    /// real server derives it from the user agent.
    pub fn manager(&self) -> String {
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

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
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
        authorization: header(header::AUTHORIZATION),
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
    let mut req = req;
    if req.content_type.contains("protobuf")
        && req.method == Method::POST
        && req.path.ends_with("/eviction")
    {
        // kubectl drain posts Evictions in protobuf; only their dryRun matters here.
        let dry_run = crate::protobuf::eviction_dry_run(&req.body);
        let body = if dry_run {
            json!({"deleteOptions": {"dryRun": ["All"]}})
        } else {
            json!({})
        };
        req.body = Bytes::from(body.to_string());
        req.content_type = "application/json".into();
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

pub(crate) fn not_found_path() -> ApiError {
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

/// The user of a request without a service-account token.
pub const ADMIN: &str = "kube-sim-admin";

/// A resolved resource path.
#[derive(Debug, Clone)]
pub struct Target {
    pub t: ResourceType,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    /// Who asks: `system:serviceaccount:NS:NAME` for a service-account token, else the
    /// admin. Admission webhooks see it in `userInfo`.
    pub user: String,
}

impl Target {
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
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
        user: ADMIN.to_string(),
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
    let mut target = resolve(shared, group, version, rest)?;
    if let Some((ns, name)) = crate::rbac::service_account(&req.authorization) {
        target.user = format!("system:serviceaccount:{ns}:{name}");
    }
    authorize(shared, req, group, &target, is_watch)?;
    if target.t.namespaced && target.namespace.is_none() && target.name.is_some() {
        return Err(not_found_path());
    }
    match (&req.method, target.name.is_some()) {
        (&Method::GET, _) if is_watch => watch::watch(shared, req, &target),
        (&Method::GET, false) => crate::read::list(shared, req, &target),
        (&Method::GET, true) => crate::read::get(shared, req, &target),
        (&Method::POST, false) => crate::write::create(shared, req, &target).await,
        (&Method::POST, true) if target.sub.as_deref() == Some("eviction") => {
            crate::eviction::evict(shared, req, &target).await
        }
        (&Method::PUT, true) => crate::write::update(shared, req, &target).await,
        (&Method::PATCH, true) => crate::write::patch_object(shared, req, &target).await,
        (&Method::DELETE, true) if target.sub.is_none() => {
            crate::write::delete(shared, req, &target).await
        }
        (&Method::DELETE, false) => crate::write::delete_collection(shared, req, &target).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} {})",
            req.method, req.path
        ))),
    }
}

/// RBAC for service-account callers (see [`crate::rbac`]); everyone else is admin.
fn authorize(
    shared: &Shared,
    req: &Req,
    group: &str,
    target: &Target,
    is_watch: bool,
) -> Result<(), ApiError> {
    let Some((sa_ns, sa_name)) = crate::rbac::service_account(&req.authorization) else {
        return Ok(());
    };
    let resource = match &target.sub {
        Some(sub) => format!("{}/{sub}", target.t.plural),
        None => target.t.plural.clone(),
    };
    let mut access = crate::rbac::Access {
        user: format!("system:serviceaccount:{sa_ns}:{sa_name}"),
        verb: crate::rbac::verb(req.method.as_str(), target.name.is_some(), is_watch).into(),
        group: group.to_string(),
        resource,
        namespace: target.ns().to_string(),
        name: target.name().to_string(),
        allowed: false,
    };
    access.allowed = crate::rbac::allowed(&shared.store.lock(), &sa_ns, &sa_name, &access);
    let refused = (!access.allowed).then(|| {
        let object = if access.name.is_empty() {
            target.t.plural.clone()
        } else {
            format!("{}.{} \"{}\"", target.t.plural, group, access.name)
        };
        let scope = if access.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", access.namespace)
        };
        format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{group}\" {scope}",
            access.user, access.verb, access.resource
        )
    });
    shared
        .accesses
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(access);
    match refused {
        Some(message) => Err(ApiError::new(403, "Forbidden", message)),
        None => Ok(()),
    }
}

pub(crate) fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
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

/// A 200-style response with a body already serialised as JSON.
pub(crate) fn bytes_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
