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

/// The `request.uid` of a review that could not be read whole (too deep, too large, a
/// field of the wrong type), found by scanning its text: the API server writes `request`
/// with `uid` first. `None` when there is none to be found (then no answer can name the
/// request, and an error is all that is left). Only a plausible uid is taken (letters,
/// digits and `-`, at most 128 bytes).
pub fn recover_uid(body: &[u8]) -> Option<String> {
    let find =
        |haystack: &[u8], needle: &[u8]| haystack.windows(needle.len()).position(|w| w == needle);
    let request = find(body, b"\"request\"")?;
    let after = &body[request..];
    let uid = find(after, b"\"uid\"")?;
    let mut rest = &after[uid + 5..];
    while let [b' ' | b'\n' | b'\r' | b'\t', tail @ ..] = rest {
        rest = tail;
    }
    let rest = rest.strip_prefix(b":")?;
    let rest = rest.trim_ascii_start().strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let uid = &rest[..end];
    (!uid.is_empty()
        && uid.len() <= 128
        && uid.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-'))
    .then(|| String::from_utf8_lossy(uid).into_owned())
}

/// Whether `body` nests arrays and objects deeper than `limit` (strings skipped): the JSON
/// reader stops at 128 levels, the API server accepts deeper objects.
pub fn nested_deeper_than(body: &[u8], limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
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
