//! How a workload is named on the command line and in Events: `<namespace>/<kind>/<name>`,
//! and the API version of the built-in kinds gpu-reaper acts on. PURE; used by
//! `gpu-reaper wake` and `gpu-reaper explain`.

use crate::{Error, Result};

/// The API version of a built-in kind gpu-reaper acts on.
pub fn builtin_api_version(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" | "StatefulSet" | "ReplicaSet" => Some("apps/v1"),
        "Job" => Some("batch/v1"),
        "Pod" => Some("v1"),
        _ => None,
    }
}

/// The API version to address `kind` with: the one given (`--api-version`), else the
/// built-in kind's; `None` when neither says (the caller names the flag).
pub fn api_version_for(kind: &str, given: Option<&String>) -> Option<String> {
    given
        .cloned()
        .or_else(|| builtin_api_version(kind).map(str::to_string))
}

/// Splits `<namespace>/<kind>/<name>`.
pub fn parse_workload(text: &str) -> Result<(String, String, String)> {
    let parts: Vec<&str> = text.split('/').collect();
    match parts.as_slice() {
        [ns, kind, name] if !ns.is_empty() && !kind.is_empty() && !name.is_empty() => {
            Ok((ns.to_string(), kind.to_string(), name.to_string()))
        }
        _ => Err(Error::InvalidArgument {
            flag: "workload",
            message: format!(
                "{text:?} is not <namespace>/<kind>/<name>, e.g. ml/Deployment/llama-chat"
            ),
        }),
    }
}
