//! The API gpu-reaper serves: the `GpuPolicy` and `ReadinessAttestation` custom resources,
//! the annotation and label names it reads and writes on workloads, and status conditions.
//!
//! Doc comments on these types are the user documentation: they become the `description`
//! fields of the generated CRDs (`gpu-reaper crd`). This room holds data shapes and pure
//! helpers over them only; nothing here does IO.

pub mod attestation;
pub mod conditions;
pub mod keys;
pub mod policy;
pub mod selector;
pub mod unknown;
pub mod validate;

pub use attestation::{ReadinessAttestation, ReadinessAttestationSpec, ReadinessAttestationStatus};
pub use policy::{GpuPolicy, GpuPolicySpec, GpuPolicyStatus};

/// API group of every gpu-reaper resource.
pub const GROUP: &str = "gpureaper.io";
/// API version served.
pub const VERSION: &str = "v1alpha1";

/// All CRDs gpu-reaper installs, in the order `gpu-reaper crd` prints them.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![GpuPolicy::crd(), ReadinessAttestation::crd()]
}

/// The CRDs as multi-document YAML: the exact bytes of `crds/gpu-reaper.yaml`.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

/// Reads a watched or listed object as the Rust type `K`, one object at a time (so one
/// that does not fit is skipped, never failing a whole list); the error names the field
/// that does not fit, e.g. `spec.maxGpus: invalid value: integer `4294967296`, expected
/// u32`. A duration too long for any clock is named before the typed read (kube-core's
/// parser panics on it: found by the `object` fuzz target in a watched GpuPolicy).
pub fn read_dynamic<K: serde::de::DeserializeOwned>(
    object: &kube::api::DynamicObject,
) -> Result<K, String> {
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    let mut oversized = Vec::new();
    validate::oversized_durations(&value, "", &mut oversized);
    if let Some(p) = oversized.first() {
        return Err(format!("{}: {}", p.field, p.message));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path.is_empty() || path == "." {
            e.into_inner().to_string()
        } else {
            format!("{path}: {}", e.into_inner())
        }
    })
}
