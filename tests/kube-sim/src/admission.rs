//! Validating admission webhooks: finds the registered ValidatingWebhookConfigurations
//! that match a write (rules, namespaceSelector, objectSelector), calls each over HTTPS
//! with an AdmissionReview v1 (the server certificate checked against `caBundle`,
//! `timeoutSeconds` enforced), and turns denials, failures (per `failurePolicy`) and
//! warnings into what kube-apiserver answers. `matchConditions` are CEL expressions over
//! `object`, `oldObject` and `request`, evaluated with kube-cel.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use crate::Shared;
use crate::http::Target;
use crate::selectors::LabelSelector;
use crate::status::ApiError;

/// The admission operations kube-sim sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
        }
    }
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether one of a webhook's rules covers this request.
fn rules_match(webhook: &Value, target: &Target, operation: Operation) -> bool {
    let resource = match &target.sub {
        Some(sub) => format!("{}/{sub}", target.t.plural),
        None => target.t.plural.clone(),
    };
    strings_or_empty(&webhook["rules"]).iter().any(|rule| {
        let ops = strings(&rule["operations"]);
        let groups = strings(&rule["apiGroups"]);
        let versions = strings(&rule["apiVersions"]);
        let resources = strings(&rule["resources"]);
        let scope = rule["scope"].as_str().unwrap_or("*");
        (ops.contains(&"*") || ops.contains(&operation.as_str()))
            && (groups.contains(&"*") || groups.contains(&target.t.group.as_str()))
            && (versions.contains(&"*") || versions.contains(&target.version.as_str()))
            && resources.iter().any(|r| {
                *r == resource
                    || *r == "*/*"
                    || (*r == "*" && target.sub.is_none())
                    || r.strip_prefix("*/")
                        .is_some_and(|s| target.sub.as_deref() == Some(s))
                    || r.strip_suffix("/*")
                        .is_some_and(|p| p == target.t.plural && target.sub.is_some())
            })
            && match scope {
                "Namespaced" => target.t.namespaced,
                "Cluster" => !target.t.namespaced,
                _ => true,
            }
    })
}

fn strings_or_empty(value: &Value) -> Vec<Value> {
    value.as_array().cloned().unwrap_or_default()
}

/// `userInfo` as kube-apiserver fills it for the admin and for a service account.
fn user_info(user: &str) -> Value {
    match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, _)) => json!({"username": user, "groups": [
            "system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"]}),
        None => json!({"username": user, "groups": ["system:masters", "system:authenticated"]}),
    }
}

/// Calls the matching validating webhooks. `Ok(warnings)` when all allow the write.
pub async fn validate(
    shared: &Arc<Shared>,
    target: &Target,
    operation: Operation,
    name: &str,
    object: Option<&Value>,
    old_object: Option<&Value>,
    dry_run: bool,
) -> Result<Vec<String>, ApiError> {
    // Like kube-apiserver, webhook configurations are never sent to webhooks.
    if target.t.group == "admissionregistration.k8s.io" {
        return Ok(Vec::new());
    }
    let (configs, namespace_labels) = {
        let state = shared.store.lock();
        let configs: Vec<Value> = state
            .list(
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                None,
                None,
            )
            .map(|(_, c)| c.clone())
            .collect();
        if configs.is_empty() {
            return Ok(Vec::new());
        }
        let namespace_labels = if target.t.is("", "namespaces") {
            object.or(old_object).cloned()
        } else if target.t.namespaced {
            state.get("", "namespaces", "", target.ns()).cloned()
        } else {
            None
        };
        (configs, namespace_labels)
    };
    let mut warnings = Vec::new();
    for config in &configs {
        for webhook in strings_or_empty(&config["webhooks"]) {
            if !rules_match(&webhook, target, operation) {
                continue;
            }
            if let (Some(selector), Some(ns)) =
                (webhook.get("namespaceSelector"), &namespace_labels)
                && !LabelSelector::from_object(selector).matches(ns)
            {
                continue;
            }
            if let Some(selector) = webhook.get("objectSelector") {
                let selector = LabelSelector::from_object(selector);
                if !object.is_some_and(|o| selector.matches(o))
                    && !old_object.is_some_and(|o| selector.matches(o))
                {
                    continue;
                }
            }
            let webhook_name = webhook["name"].as_str().unwrap_or_default().to_string();
            let review = review(target, operation, name, object, old_object, dry_run);
            match match_conditions(&webhook, &review["request"]) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) if webhook["failurePolicy"].as_str() == Some("Ignore") => continue,
                Err(why) => {
                    return Err(ApiError::internal(format!(
                        "Internal error occurred: failed calling webhook \"{webhook_name}\": {why}"
                    )));
                }
            }
            let uid = review["request"]["uid"].clone();
            let timeout = Duration::from_secs(
                webhook["timeoutSeconds"]
                    .as_u64()
                    .unwrap_or(10)
                    .clamp(1, 30),
            );
            let outcome =
                tokio::time::timeout(timeout, call(shared, &webhook["clientConfig"], &review))
                    .await
                    .unwrap_or_else(|_| Err("context deadline exceeded".into()))
                    .and_then(|response| {
                        let answer = response.get("response").cloned().unwrap_or(Value::Null);
                        if answer["uid"] != uid {
                            return Err(format!(
                                "expected response.uid={uid}, got {}",
                                answer["uid"]
                            ));
                        }
                        Ok(answer)
                    });
            let answer = match outcome {
                Ok(answer) => answer,
                Err(why) => {
                    if webhook["failurePolicy"].as_str() == Some("Ignore") {
                        continue;
                    }
                    return Err(ApiError::internal(format!(
                        "Internal error occurred: failed calling webhook \"{webhook_name}\": failed to call webhook: {why}"
                    )));
                }
            };
            for w in strings(&answer["warnings"]) {
                warnings.push(w.to_string());
            }
            if answer["allowed"].as_bool() != Some(true) {
                let mut error = denial(&webhook_name, &answer["status"]);
                error.warnings = warnings;
                return Err(error);
            }
        }
    }
    Ok(warnings)
}

/// Whether every `matchConditions` expression holds for this request; `Err` when one
/// does not compile, fails, or is not a bool (then `failurePolicy` decides).
fn match_conditions(webhook: &Value, request: &Value) -> Result<bool, String> {
    use kube_cel::KubeCelExt;
    use kube_cel::cel::{Context, Program, Value as Cel};
    let Some(conditions) = webhook["matchConditions"].as_array() else {
        return Ok(true);
    };
    let mut context = Context::default().with_all();
    for (variable, value) in [
        ("object", &request["object"]),
        ("oldObject", &request["oldObject"]),
        ("request", request),
    ] {
        let value = kube_cel::cel::to_value(value).map_err(|e| e.to_string())?;
        context.add_variable_from_value(variable, value);
    }
    for condition in conditions {
        let name = condition["name"].as_str().unwrap_or_default();
        let expression = condition["expression"].as_str().unwrap_or("true");
        let program = Program::compile(expression)
            .map_err(|e| format!("compilation failed for matchCondition {name:?}: {e}"))?;
        match program.execute(&context) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => return Ok(false),
            Ok(other) => {
                return Err(format!(
                    "matchCondition {name:?} did not evaluate to a bool: {other:?}"
                ));
            }
            Err(e) => return Err(format!("failed to evaluate matchCondition {name:?}: {e}")),
        }
    }
    Ok(true)
}

/// The error a denial becomes, worded like kube-apiserver's `ToStatusErr`.
fn denial(webhook_name: &str, status: &Value) -> ApiError {
    let denied_by = format!("admission webhook \"{webhook_name}\" denied the request");
    let message = status["message"].as_str().unwrap_or_default();
    let reason = status["reason"].as_str().unwrap_or_default();
    let text = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason.is_empty() {
        format!("{denied_by}: {reason}")
    } else {
        format!("{denied_by} without explanation")
    };
    let code = status["code"]
        .as_u64()
        .filter(|c| *c >= 400 && *c < 600)
        .unwrap_or(400) as u16;
    let mut error = ApiError::new(code, reason, text);
    if let Some(details) = status.get("details") {
        error = error.with_details(details.clone());
    }
    error
}

fn review(
    target: &Target,
    operation: Operation,
    name: &str,
    object: Option<&Value>,
    old_object: Option<&Value>,
    dry_run: bool,
) -> Value {
    let t = &target.t;
    let kind = match target.sub.as_deref() {
        Some("eviction") => json!({"group": "policy", "version": "v1", "kind": "Eviction"}),
        Some("scale") => json!({"group": "autoscaling", "version": "v1", "kind": "Scale"}),
        _ => json!({"group": t.group, "version": target.version, "kind": t.kind}),
    };
    let resource = json!({"group": t.group, "version": target.version, "resource": t.plural});
    let options = match operation {
        Operation::Create => json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
        Operation::Update => json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
        Operation::Delete => json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}),
    };
    let mut request = json!({
        "uid": uuid::Uuid::new_v4().to_string(),
        "kind": kind, "resource": resource, "requestKind": kind, "requestResource": resource,
        "name": name, "operation": operation.as_str(),
        "userInfo": user_info(&target.user),
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": old_object.cloned().unwrap_or(Value::Null),
        "dryRun": dry_run,
        "options": options,
    });
    if t.namespaced {
        request["namespace"] = json!(target.ns());
    }
    if let Some(sub) = &target.sub {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// POSTs the review to the webhook and returns its parsed answer.
async fn call(shared: &Shared, client_config: &Value, review: &Value) -> Result<Value, String> {
    // A service reference is verified against the name kube-apiserver uses for it,
    // `<name>.<namespace>.svc`, whatever address the route points at.
    let mut tls_name: Option<String> = None;
    let url = match (client_config["url"].as_str(), client_config.get("service")) {
        (Some(url), _) => url.to_string(),
        (None, Some(service)) => {
            let ns = service["namespace"].as_str().unwrap_or_default();
            let name = service["name"].as_str().unwrap_or_default();
            let path = service["path"].as_str().unwrap_or("/");
            tls_name = Some(format!("{name}.{ns}.svc"));
            let routes = shared
                .service_routes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match routes.get(&(ns.to_string(), name.to_string())) {
                Some(base) => format!("{}{path}", base.trim_end_matches('/')),
                None => {
                    return Err(format!(
                        "service \"{name}.{ns}\" has no route in kube-sim (use KubeSim::route_service)"
                    ));
                }
            }
        }
        _ => return Err("webhook clientConfig has neither url nor service".into()),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("bad webhook URL {url:?}: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("Post {url:?}: webhook URL must use https"));
    }
    let host = uri
        .host()
        .ok_or("webhook URL has no host")?
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let ca = client_config["caBundle"]
        .as_str()
        .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
        .transpose()
        .map_err(|e| format!("bad caBundle: {e}"))?
        .ok_or("webhook clientConfig has no caBundle")?;
    let tls = crate::tls::client_config(&ca)?;
    let post_err = |e: String| format!("Post {url:?}: {e}");
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| post_err(e.to_string()))?;
    let server_name = rustls::pki_types::ServerName::try_from(tls_name.unwrap_or(host.clone()))
        .map_err(|e| post_err(e.to_string()))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|e| post_err(format!("tls: failed to verify certificate: {e}")))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| post_err(e.to_string()))?;
    tokio::spawn(connection);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let request = http::Request::post(path)
        .header(http::header::HOST, format!("{host}:{port}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(review).unwrap_or_default(),
        )))
        .map_err(|e| post_err(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| post_err(e.to_string()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| post_err(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!(
            "received invalid webhook response: status {status}"
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("received invalid webhook response: {e}"))
}
