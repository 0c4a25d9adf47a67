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
