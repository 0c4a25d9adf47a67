//! AdmissionReview v1: the request the API server sends and the response it expects.
//!
//! Only the fields the budget gate reads are typed; the objects stay JSON so every kind
//! (built-in or custom) is read by one counting code path. Parsing never panics: a body
//! that is not an AdmissionReview gets an error naming what is wrong.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API group/version/kind of a request's object.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// The API group/version/resource a request was made to (for `deployments/scale`, the
/// parent's: group `apps`, resource `deployments`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// The write being reviewed.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

/// Who asks.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// `request` of an AdmissionReview.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<GroupVersionResource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReview {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<AdmissionRequest>,
}

/// Why a body is not a usable AdmissionReview.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("not an admission.k8s.io/v1 AdmissionReview: {0}")]
pub struct ReviewError(pub String);

/// Parses an `admission.k8s.io/v1` AdmissionReview with a request.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
    let review: AdmissionReview =
        serde_json::from_slice(body).map_err(|e| ReviewError(e.to_string()))?;
    match (review.api_version.as_deref(), review.kind.as_deref()) {
        (Some("admission.k8s.io/v1"), Some("AdmissionReview")) => {}
        (api_version, kind) => {
            return Err(ReviewError(format!(
                "apiVersion {:?} and kind {:?}; expected \"admission.k8s.io/v1\" and \"AdmissionReview\"",
                api_version.unwrap_or(""),
                kind.unwrap_or("")
            )));
        }
    }
    let request = review
        .request
        .ok_or_else(|| ReviewError("the field `request` is missing".into()))?;
    if request.uid.is_empty() {
        return Err(ReviewError("request.uid is empty".into()));
    }
    Ok(request)
}

/// `response` of an AdmissionReview.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// `JSONPatch` when `patch` is set (mutating webhook only).
    #[serde(default, rename = "patchType", skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Base64 of the JSON patch (mutating webhook only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

/// The `status` of a denial: what kubectl prints after `denied the request:`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ResponseStatus {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

/// The whole AdmissionReview answering `uid`.
pub fn response_body(response: &AdmissionResponse) -> Vec<u8> {
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    });
    // Serializing a json! value of strings and bools cannot fail.
    serde_json::to_vec(&review).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_is_not_json_names_the_problem() {
        let err = parse(b"{not json").unwrap_err();
        assert!(err.to_string().starts_with("not an admission.k8s.io/v1"));
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn a_review_of_another_version_is_refused() {
        let err = parse(br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x","kind":{"kind":"Pod"},"operation":"CREATE"}}"#).unwrap_err();
        assert!(err.0.contains("\"admission.k8s.io/v1beta1\""), "{err}");
    }

    #[test]
    fn a_review_without_request_is_refused() {
        let err =
            parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).unwrap_err();
        assert_eq!(err.0, "the field `request` is missing");
    }

    #[test]
    fn a_denial_serializes_as_the_api_server_expects() {
        let body = response_body(&AdmissionResponse {
            uid: "u1".into(),
            allowed: false,
            status: Some(ResponseStatus {
                code: 403,
                reason: "Forbidden".into(),
                message: "no".into(),
            }),
            warnings: vec![],
            patch_type: None,
            patch: None,
        });
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["response"]["uid"], "u1");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["message"], "no");
        assert!(v["response"].get("warnings").is_none());
    }
}
