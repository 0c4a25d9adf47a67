//! Kubernetes `Status` error objects (`meta.k8s.io/v1`, kind `Status`).
//!
//! Every failure the simulated API server returns goes through [`ApiError`], so clients
//! (kubectl, `kube::Client`) see the same `reason`, `code` and message shape as with
//! kube-apiserver. Nothing here does IO.

use serde_json::{Value, json};

/// An error answered to the client as a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
    /// `Warning` headers to send along (webhook warnings reach the client on denial too).
    pub warnings: Vec<String>,
}

impl ApiError {
    pub fn new(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
            warnings: Vec::new(),
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `<resource>.<group> "<name>" not found`, as kube-apiserver words it.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(details(group, resource, name))
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(details(group, resource, name))
    }

    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(details(group, resource, name))
    }

    /// 422 with one cause per invalid field, as field validation reports it.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[(&str, String)]) -> Self {
        let summary: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        // One cause is printed bare, several as a list, as kube-apiserver does.
        let summary = if summary.len() > 1 {
            vec![format!("[{}]", summary.join(", "))]
        } else {
            summary
        };
        let message = format!(
            "{kind}.{} \"{name}\" is invalid: {}",
            if group.is_empty() { "" } else { group },
            summary.join(", ")
        )
        .replace(". \"", " \"");
        let causes: Vec<Value> = causes
            .iter()
            .map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f}))
            .collect();
        Self::new(422, "Invalid", message).with_details(json!({
            "name": name, "group": group, "kind": kind, "causes": causes
        }))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object sent as the response body (or inside a watch ERROR event).
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// A `Status` with `status: Success`, as DELETE of an already-gone object returns.
pub fn success_status(group: &str, resource: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": resource, "uid": uid},
    })
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn details(group: &str, resource: &str, name: &str) -> Value {
    json!({"name": name, "group": group, "kind": resource})
}
