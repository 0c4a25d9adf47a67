//! GPUs: which resources are GPUs, and how many GPUs an object claims, for every kind
//! the budget gate governs. Used by the webhook, the controller's inventory and quota,
//! audit and `check` (one count everywhere, G7).
//!
//! Pure: reads the object the API server sends (JSON: apiVersion, kind, metadata, spec) and
//! never calls out. DRA claim templates are resolved through the [`ClaimTemplates`] the
//! caller passes (the webhook's cache).
//!
//! Counting rules, in short:
//! - A pod: the larger of its running containers (main + sidecar init containers) and its
//!   init phase, per GPU resource the larger of requests and limits, plus its DRA claims
//!   made from templates (see [`pod_spec_gpus`]).
//! - A workload: pods × the largest number of pods it can run at once, per kind (see
//!   [`count`]). A MIG slice counts as its share of a GPU.
//! - Anything created by a controller (a controller ownerReference) is counted at its
//!   owner, never twice: [`Counted::OwnedBy`].
//! - A field of the wrong type is a [`CountError`] naming its path; missing optional
//!   fields take the API's defaults.

use std::collections::{BTreeMap, HashMap};

mod count;
mod devices;
mod fields;
mod kinds;
mod pod;
mod quantity;
mod tally;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_objects;

pub use count::{claim_template_gpus, count, pod_object_gpus, pod_spec_gpus};
pub use devices::{DeviceGrant, Route, Vendor, device_path_vendor};
pub use quantity::quantity_units;

/// The GPU resources every part of gpu-reaper counts by default: the binary's flags, the
/// Helm chart's `gpu.resources` (a test keeps them equal) and `gpu-reaper check`. An entry
/// ending in `*` is a prefix. `nvidia.com/mig-*` slices count their share of a GPU (see
/// [`GpuResources::mig_prefix`]); every other unit is one whole GPU — a time-sliced
/// `nvidia.com/gpu.shared` replica too, since the gate cannot know how many replicas
/// share a device and must never count low.
pub const DEFAULT_GPU_RESOURCES: [&str; 8] = [
    "nvidia.com/gpu",
    "nvidia.com/mig-*",
    "nvidia.com/gpu.shared",
    "amd.com/gpu",
    "gpu.intel.com/*",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron",
    "google.com/tpu",
];

/// DRA device classes whose devices are GPUs, by default: NVIDIA's (`gpu.nvidia.com`,
/// `mig.nvidia.com`), AMD's, Intel's GPU and Gaudi drivers, and `gpu.example.com` (the
/// class the upstream DRA examples use).
pub const DEFAULT_GPU_DEVICE_CLASSES: [&str; 6] = [
    "gpu.nvidia.com",
    "mig.nvidia.com",
    "gpu.amd.com",
    "gpu.intel.com",
    "gaudi.intel.com",
    "gpu.example.com",
];

/// Resources under a GPU prefix that are not devices: Intel's GPU plugin advertises
/// shares of a device (`millicores`, 1000 per GPU; `memory.max`, bytes; `tiles`) next to
/// the device count `gpu.intel.com/i915` (or `xe`) that a pod asks for with them.
const NOT_DEVICES: [&str; 3] = [
    "gpu.intel.com/millicores",
    "gpu.intel.com/memory.max",
    "gpu.intel.com/tiles",
];

/// The KAI scheduler's GPU-sharing annotations on a pod (template): `gpu-fraction` asks
/// for that fraction of a GPU (times `gpu-fraction-num-devices`, default 1);
/// `gpu-memory` asks for memory of one shared GPU, counted as one GPU (its share of a
/// device is only known at scheduling).
pub const KAI_GPU_FRACTION: &str = "gpu-fraction";
/// See [`KAI_GPU_FRACTION`].
pub const KAI_GPU_FRACTION_DEVICES: &str = "gpu-fraction-num-devices";
/// See [`KAI_GPU_FRACTION`].
pub const KAI_GPU_MEMORY: &str = "gpu-memory";

/// Which resources are GPUs, and how much of a GPU each unit is.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuResources {
    /// Extended resources counted as one GPU per unit; an entry ending in `*` is a
    /// prefix. Default: [`DEFAULT_GPU_RESOURCES`].
    pub whole: Vec<String>,
    /// Prefix of MIG slice resources, `nvidia.com/mig-<N>g.<M>gb` (default
    /// `nvidia.com/mig-`). One unit counts N / `mig_slices_per_gpu` of a GPU (at most one
    /// GPU). N is read from the first `<N>g` segment, so `1c.3g.20gb` (a compute instance
    /// of a 3g slice) counts 3 and `1g.10gb+me` counts 1. A name with no readable `<N>g`
    /// counts as a whole GPU, the same rule as idle-time prices
    /// ([`crate::engine::cost::mig_profile_share`]): never under-counted.
    pub mig_prefix: String,
    /// Compute slices per physical GPU (7 on A100/H100). Not a positive number: every MIG
    /// unit counts as a whole GPU.
    pub mig_slices_per_gpu: f64,
    /// DRA device classes whose devices are GPUs, one GPU per device. Default:
    /// [`DEFAULT_GPU_DEVICE_CLASSES`]. A `mig.nvidia.com` device counts as a whole GPU:
    /// its profile is only chosen at allocation.
    pub device_classes: Vec<String>,
    /// What a DRA request with `allocationMode: All` counts as (its size is only known at
    /// allocation). Default 8.
    pub dra_all_gpus: f64,
}

impl Default for GpuResources {
    fn default() -> Self {
        Self {
            whole: DEFAULT_GPU_RESOURCES.map(String::from).to_vec(),
            mig_prefix: "nvidia.com/mig-".to_string(),
            mig_slices_per_gpu: 7.0,
            device_classes: DEFAULT_GPU_DEVICE_CLASSES.map(String::from).to_vec(),
            dra_all_gpus: 8.0,
        }
    }
}

impl GpuResources {
    /// The share of a GPU one unit of `resource` is, `None` when it is not a GPU.
    pub fn share_of(&self, resource: &str) -> Option<f64> {
        if self.whole.iter().any(|w| w == resource) {
            return Some(1.0);
        }
        if !self.mig_prefix.is_empty()
            && let Some(profile) = resource.strip_prefix(self.mig_prefix.as_str())
        {
            // One rule with the idle-time prices: an unreadable profile is a whole GPU.
            return Some(crate::engine::cost::mig_profile_share(
                profile,
                self.mig_slices_per_gpu,
            ));
        }
        if NOT_DEVICES.contains(&resource) {
            return None;
        }
        let prefixed = self.whole.iter().any(|w| {
            w.strip_suffix('*')
                .is_some_and(|prefix| resource.starts_with(prefix))
        });
        prefixed.then_some(1.0)
    }

    fn is_gpu_class(&self, class: &str) -> bool {
        self.device_classes.iter().any(|c| c == class)
    }
}

/// What the caller's caches know that a count needs: the GPUs of DRA claim templates
/// ((namespace, template name) → GPUs per pod) and of existing ResourceClaims a pod names,
/// and how many nodes offer GPUs (a DaemonSet runs one pod on each). `None`: unknown.
pub trait ClaimTemplates {
    fn gpus(&self, namespace: &str, name: &str) -> Option<f64>;

    /// GPUs of the existing ResourceClaim `namespace/name`.
    fn claim_gpus(&self, _namespace: &str, _name: &str) -> Option<f64> {
        None
    }

    /// Nodes that offer GPUs.
    fn gpu_nodes(&self) -> Option<u64> {
        None
    }
}

/// Knows no template: every template a pod uses is reported unresolved.
impl ClaimTemplates for () {
    fn gpus(&self, _namespace: &str, _name: &str) -> Option<f64> {
        None
    }
}

/// Keyed by (namespace, name).
impl ClaimTemplates for HashMap<(String, String), f64> {
    fn gpus(&self, namespace: &str, name: &str) -> Option<f64> {
        self.get(&(namespace.to_string(), name.to_string()))
            .copied()
    }
}

/// What an object claims.
#[derive(Clone, Debug, PartialEq)]
pub enum Counted {
    /// The kind never claims GPUs (ConfigMap, Service, …) or is unknown: not gated.
    NotGoverned,
    /// Created by a controller (an ownerReference with `controller: true`): a pod of a
    /// ReplicaSet, a ReplicaSet of a Deployment, the Jobs of a JobSet, the RayCluster of a
    /// RayJob… Gated at its owner, not twice. The reference is taken as written: whether
    /// to trust an owner of a kind that is not governed is the caller's decision.
    OwnedBy { kind: String, name: String },
    /// The object claims `gpus` GPUs at its largest size.
    Claim(Claim),
}

/// A governed object's claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// GPUs claimed at once at the largest size the object allows (MIG slices as
    /// fractions).
    pub gpus: f64,
    /// Labels of the object (always first, even when empty) and of each of its pod
    /// templates that has labels (no duplicates); an attestation covers the claim when its
    /// selector matches any of these.
    pub label_sets: Vec<BTreeMap<String, String>>,
    /// How the count was made, for messages and logs, e.g. `3 replicas × 2 GPUs` or
    /// `head 0 GPUs + worker group gpu-group 1 replica × 4 GPUs`.
    pub basis: String,
    /// DRA ResourceClaimTemplates the pods use that could not be resolved (names), so the
    /// caller can say the count may be low.
    pub unresolved_claim_templates: Vec<String>,
    /// GPUs of existing ResourceClaims the pods name (included in `gpus`): the namespace
    /// already holds those from when each claim was created, so a total adds only the rest.
    pub named_claim_gpus: f64,
    /// Existing ResourceClaims a pod names that are not known (names): counted 0.
    pub unresolved_claims: Vec<String>,
    /// Why the object may run more than `gpus` GPUs with no bound the gate can see (a
    /// DaemonSet on an unknown number of nodes, a CronJob whose runs may overlap, a kind
    /// the gate cannot count). Such a claim is above every allowance: fail closed.
    pub open_ended: Option<String>,
    /// Containers of its pods that reach GPU devices without requesting them as
    /// resources (a device variable, a device hostPath, NVIDIA's device-list mount, a
    /// privileged container), in the order they appear; see [`DeviceGrant`].
    pub device_grants: Vec<DeviceGrant>,
}

/// A field of the object that cannot be read. Display: `<path>: <problem>`, e.g.
/// `spec.replicas: expected a non-negative integer, found "three"`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct CountError {
    pub path: String,
    pub problem: String,
}
