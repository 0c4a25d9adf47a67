//! What the API server serves for a kind: its resource (the real plural, not a guess) and
//! whether it has a `/scale` subresource. IO edge: API discovery (`/api`, `/apis/...`,
//! readable by every authenticated user through the default `system:discovery` role).
//!
//! Answers are kept for [`TTL`] in one process-wide table, so an action costs at most one
//! discovery request per kind in that time, and [`known`] can name a kind's resource
//! without IO once it was discovered.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{ApiResource, GroupVersionKind};
use kube::discovery::{ApiCapabilities, ApiGroup, Discovery, Scope};

/// How long a discovered kind is trusted (a CRD can gain or lose `/scale` on upgrade).
pub const TTL: Duration = Duration::from_secs(600);

/// A kind as the API server serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    pub resource: ApiResource,
    /// The kind has a `/scale` subresource.
    pub scalable: bool,
    pub namespaced: bool,
}

impl Served {
    fn new(resource: ApiResource, caps: &ApiCapabilities) -> Self {
        Self {
            scalable: caps
                .subresources
                .iter()
                .any(|(sub, _)| sub.plural == "scale"),
            namespaced: caps.scope == Scope::Namespaced,
            resource,
        }
    }
}

type Table = HashMap<(String, String), (Served, Instant)>;

static TABLE: LazyLock<RwLock<Table>> = LazyLock::new(|| RwLock::new(HashMap::new()));

fn remember(served: &Served) {
    let key = (
        served.resource.api_version.clone(),
        served.resource.kind.clone(),
    );
    if let Ok(mut table) = TABLE.write() {
        table.insert(key, (served.clone(), Instant::now()));
    }
}

/// The kind at `api_version` if it was discovered less than [`TTL`] ago.
pub fn known(api_version: &str, kind: &str) -> Option<Served> {
    let table = TABLE.read().ok()?;
    let (served, at) = table.get(&(api_version.to_string(), kind.to_string()))?;
    (at.elapsed() < TTL).then(|| served.clone())
}

/// `group/version` → (group, version); `v1` → ("", "v1").
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// One kind: from the table, else one discovery request for its group version.
pub async fn kind(client: &Client, api_version: &str, kind: &str) -> Result<Served, kube::Error> {
    if let Some(served) = known(api_version, kind) {
        return Ok(served);
    }
    let (group, version) = split_api_version(api_version);
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    let served = Served::new(resource, &caps);
    remember(&served);
    Ok(served)
}

/// Every kind the cluster serves, at its preferred version: aggregated discovery (two
/// requests, Kubernetes 1.26+), else one request per API group.
pub async fn all(client: &Client) -> Result<Vec<Served>, kube::Error> {
    // A server without aggregated discovery may answer with the legacy lists, which
    // read as no groups at all: the core group is always there when it worked.
    let discovery = match Discovery::new(client.clone()).run_aggregated().await {
        Ok(d) if d.has_group(ApiGroup::CORE_GROUP) => d,
        Ok(_) => Discovery::new(client.clone()).run().await?,
        Err(e) => {
            tracing::debug!(error = %e, "aggregated discovery not served; per-group discovery");
            Discovery::new(client.clone()).run().await?
        }
    };
    let mut out = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            let served = Served::new(resource, &caps);
            remember(&served);
            out.push(served);
        }
    }
    Ok(out)
}

/// Kinds that can own GPU pods, listed (metadata only) to resolve root workloads. The
/// CRD kinds are skipped quietly where their CRD is not installed.
pub const OWNER_KINDS: &[(&str, &str, &str, &str)] = &[
    ("apps", "v1", "ReplicaSet", "replicasets"),
    ("apps", "v1", "Deployment", "deployments"),
    ("apps", "v1", "StatefulSet", "statefulsets"),
    ("batch", "v1", "Job", "jobs"),
    ("batch", "v1", "CronJob", "cronjobs"),
    ("kubeflow.org", "v1", "Notebook", "notebooks"),
    ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
    ("kubeflow.org", "v1", "TFJob", "tfjobs"),
    ("kubeflow.org", "v1", "XGBoostJob", "xgboostjobs"),
    ("kubeflow.org", "v1", "PaddleJob", "paddlejobs"),
    ("kubeflow.org", "v1", "JAXJob", "jaxjobs"),
    ("kubeflow.org", "v2beta1", "MPIJob", "mpijobs"),
    ("ray.io", "v1", "RayCluster", "rayclusters"),
    ("ray.io", "v1", "RayJob", "rayjobs"),
    ("ray.io", "v1", "RayService", "rayservices"),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    (
        "leaderworkerset.x-k8s.io",
        "v1",
        "LeaderWorkerSet",
        "leaderworkersets",
    ),
    (
        "serving.kserve.io",
        "v1beta1",
        "InferenceService",
        "inferenceservices",
    ),
];

/// Kinds gpu-reaper acts on that it watches whenever they are served, at the version
/// discovery prefers (group, kind).
const ALSO_WATCHED: &[(&str, &str)] = &[("serving.kserve.io", "LLMInferenceService")];

/// The owner kinds to watch: `owner_kinds` (group, version, kind, plural), then, from API
/// discovery, every other namespaced, watchable kind with a `/scale` subresource (any
/// CRD that declares one: its objects become roots that ScaleToZero scales) and the
/// [`ALSO_WATCHED`] kinds. Without discovery, `owner_kinds` alone.
pub async fn owner_resources(
    client: &Client,
    owner_kinds: &[(&str, &str, &str, &str)],
) -> Vec<ApiResource> {
    let mut out: Vec<ApiResource> = owner_kinds
        .iter()
        .map(|&(group, version, kind, plural)| ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            },
            kind: kind.into(),
            plural: plural.into(),
        })
        .collect();
    let served = match all(client).await {
        Ok(served) => served,
        Err(e) => {
            tracing::warn!(error = %e, "API discovery failed: only the built-in owner kinds are watched");
            return out;
        }
    };
    for s in served {
        let r = &s.resource;
        let wanted = s.scalable || ALSO_WATCHED.contains(&(r.group.as_str(), r.kind.as_str()));
        let known = out.iter().any(|o| o.group == r.group && o.kind == r.kind);
        if wanted && s.namespaced && !known {
            out.push(s.resource);
        }
    }
    out
}
