//! Watches of the long-running controller: reflector stores of pods (fields the
//! inventory does not read are pruned), owners' metadata for every owner kind that is
//! served, GpuPolicies and namespace metadata. A cycle reads the stores instead of
//! listing; a GpuPolicy change wakes the loop early.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;

use crate::admission::count::GpuResources;
use crate::api::GpuPolicy;
use crate::cluster::inventory::{self, ObjectInfo, ObjectKey, PodInfo};

/// The stores a cycle reads.
pub struct Caches {
    pods: Store<Pod>,
    owners: Vec<(ApiResource, Store<PartialObjectMeta<DynamicObject>>)>,
    policies: Store<GpuPolicy>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// DRA claim templates, when resource.k8s.io/v1 is served.
    templates: Option<Store<ResourceClaimTemplate>>,
    /// Notified on every GpuPolicy event.
    pub policy_changed: Arc<Notify>,
}

fn drive<S, T, E>(name: &'static str, stream: S, on_event: Option<Arc<Notify>>)
where
    S: Stream<Item = Result<T, E>> + Send + 'static,
    T: Send,
    E: std::fmt::Display + Send,
{
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    if let Some(n) = &on_event {
                        n.notify_one();
                    }
                }
                Err(e) => {
                    tracing::warn!(watch = name, error = %e, "watch failed; retrying with backoff")
                }
            }
        }
    });
}

/// Drops what the inventory never reads, so 50,000 pods stay small in memory.
fn prune(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = None;
        spec.affinity = None;
        spec.tolerations = None;
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            c.env = None;
            c.env_from = None;
            c.volume_mounts = None;
            c.command = None;
            c.args = None;
            c.ports = None;
            c.liveness_probe = None;
            c.readiness_probe = None;
            c.startup_probe = None;
        }
    }
}

impl Caches {
    /// Starts the watches; owner kinds whose API is not served are skipped quietly.
    pub async fn start(client: &Client, owner_kinds: &[(&str, &str, &str, &str)]) -> Self {
        let config = watcher::Config::default().page_size(500);
        let (pods, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(Api::<Pod>::all(client.clone()), config.clone()).modify(prune),
        )
        .default_backoff();
        drive("pods", stream, None);

        let mut owners = Vec::new();
        for &(group, version, kind, plural) in owner_kinds {
            let resource = ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: format!("{group}/{version}"),
                kind: kind.into(),
                plural: plural.into(),
            };
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::all_with(client.clone(), &resource);
            if let Err(e) = api.list(&ListParams::default().limit(1)).await {
                tracing::debug!(kind, error = %e, "not watched (not served here)");
                continue;
            }
            let writer = reflector::store::Writer::new(resource.clone());
            let reader = writer.as_reader();
            let stream =
                reflector::reflector(writer, watcher(api, config.clone())).default_backoff();
            drive("owners", stream, None);
            owners.push((resource, reader));
        }

        let policy_changed = Arc::new(Notify::new());
        let (policies, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(Api::<GpuPolicy>::all(client.clone()), config.clone()),
        )
        .default_backoff();
        drive("gpupolicies", stream, Some(policy_changed.clone()));

        let template_api = Api::<ResourceClaimTemplate>::all(client.clone());
        let templates = if template_api
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
        {
            let (reader, writer) = reflector::store();
            let stream = reflector::reflector(writer, watcher(template_api, config.clone()))
                .default_backoff();
            drive("resourceclaimtemplates", stream, None);
            Some(reader)
        } else {
            None
        };

        let (namespaces, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                config,
            ),
        )
        .default_backoff();
        drive("namespaces", stream, None);

        Self {
            pods,
            owners,
            policies,
            namespaces,
            templates,
            policy_changed,
        }
    }

    /// Waits until every watch has listed once.
    pub async fn wait_synced(&self) {
        let _ = self.pods.wait_until_ready().await;
        for (_, store) in &self.owners {
            let _ = store.wait_until_ready().await;
        }
        let _ = self.policies.wait_until_ready().await;
        let _ = self.namespaces.wait_until_ready().await;
        if let Some(t) = &self.templates {
            let _ = t.wait_until_ready().await;
        }
    }

    /// What the stores hold now, in the inventory's terms.
    #[allow(clippy::type_complexity)]
    pub fn read(
        &self,
        resources: &GpuResources,
        now: jiff::Timestamp,
    ) -> (
        Vec<PodInfo>,
        HashMap<ObjectKey, ObjectInfo>,
        Vec<GpuPolicy>,
        HashMap<String, BTreeMap<String, String>>,
    ) {
        let template_objects: Vec<_> = self.templates.iter().flat_map(|t| t.state()).collect();
        let templates = crate::admission::count::claim_template_gpus(
            template_objects.iter().map(|t| t.as_ref()),
            resources,
        );
        let pods = self
            .pods
            .state()
            .iter()
            .filter(|p| claims_gpus(p))
            .filter_map(|p| serde_json::to_value(p.as_ref()).ok())
            .filter_map(|v| inventory::pod_info_with(&v, resources, &templates, now))
            .collect();
        let mut owners = HashMap::new();
        for (resource, store) in &self.owners {
            for m in store.state() {
                let Ok(meta) = serde_json::to_value(&m.metadata) else {
                    continue;
                };
                let value = serde_json::json!({"apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta});
                if let Some(info) = ObjectInfo::from_value(&value) {
                    owners.insert(info.key(), info);
                }
            }
        }
        let policies = self
            .policies
            .state()
            .iter()
            .map(|p| p.as_ref().clone())
            .collect();
        let namespaces = self
            .namespaces
            .state()
            .iter()
            .filter_map(|n| {
                Some((
                    n.metadata.name.clone()?,
                    n.metadata.labels.clone().unwrap_or_default(),
                ))
            })
            .collect();
        (pods, owners, policies, namespaces)
    }
}

/// A cheap first filter before the exact count: some container asks for an extended
/// resource, or the pod uses DRA claims.
fn claims_gpus(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let extended = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources.as_ref().is_some_and(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flat_map(|m| m.keys())
                .any(|k| k.contains('/') && !k.starts_with("kubernetes.io/"))
        })
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(extended)
        || spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
}
