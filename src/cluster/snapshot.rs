//! One listing of the cluster's GPU pods and their owners (IO edge, paged): what
//! `controller --once` evaluates and what `audit --kubeconfig` attributes GPU-hours to.
//! The long-running controller reads the same from its watches instead
//! (`controller::caches`).

use std::collections::HashMap;

use jiff::Timestamp;
use kube::api::{ApiResource, ListParams};
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::{Api, Client};

use super::inventory::{self, ObjectInfo, ObjectKey, PodInfo};
use crate::gpus::GpuResources;
use crate::{Error, Result};

/// Lists every object of `api` in pages of 500.
pub async fn list_all<K>(api: &Api<K>) -> std::result::Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    list_all_matching(api, "").await
}

/// Lists the objects of `api` with these labels (a label selector; empty: all), in
/// pages of 500.
pub async fn list_all_matching<K>(
    api: &Api<K>,
    label_selector: &str,
) -> std::result::Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500).labels(label_selector);
    loop {
        let page = api.list(&params).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        out.extend(page.items);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

fn kube_err(action: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::Kube {
        action: action.to_string(),
        source,
    }
}

/// An owner's metadata (from a metadata-only list) as [`ObjectInfo`].
pub fn meta_info(
    api_version: &str,
    kind: &str,
    m: &PartialObjectMeta<DynamicObject>,
) -> Option<ObjectInfo> {
    ObjectInfo::from_meta(api_version, kind, &m.metadata)
}

/// Every pod that claims GPUs (devices, DRA claim templates and named claims counted as
/// the budget gate counts them), and the metadata of every object of `owner_resources`
/// (the kinds a pod's owner chain is followed through). An owner kind that is not served
/// or that RBAC does not let us list is skipped: pods under it stop at that owner.
pub async fn gpu_pods_and_owners(
    c: &Client,
    resources: &GpuResources,
    owner_resources: &[ApiResource],
    now: Timestamp,
) -> Result<(Vec<PodInfo>, HashMap<ObjectKey, ObjectInfo>)> {
    let templates = crate::gpus::claim_template_gpus(
        list_all(&Api::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>::all(c.clone()))
            .await
            .unwrap_or_default()
            .iter(),
        resources,
    );
    // Pods may name a ResourceClaim directly: its GPUs count (as the watches do).
    let claims = inventory::claim_gpus(
        list_all(&Api::<k8s_openapi::api::resource::v1::ResourceClaim>::all(
            c.clone(),
        ))
        .await
        .unwrap_or_default()
        .iter(),
        resources,
    );
    let pods = list_all(&Api::<k8s_openapi::api::core::v1::Pod>::all(c.clone()))
        .await
        .map_err(kube_err("listing pods"))?;
    let gpu_pods: Vec<_> = pods
        .iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .filter_map(|v| inventory::pod_info_with_claims(&v, resources, &templates, &claims, now))
        .collect();
    let mut owners: HashMap<ObjectKey, ObjectInfo> = HashMap::new();
    for resource in owner_resources {
        let (group, kind) = (resource.group.as_str(), resource.kind.as_str());
        let api: Api<DynamicObject> = Api::all_with(c.clone(), resource);
        let mut params = ListParams::default().limit(500);
        loop {
            let page = match api.list_metadata(&params).await {
                Ok(page) => page,
                // A CRD that is not installed: its kind is skipped quietly.
                Err(kube::Error::Api(e))
                    if e.code == 404
                        && !group.is_empty()
                        && group != "apps"
                        && group != "batch" =>
                {
                    tracing::debug!(kind, "not served here; skipped");
                    break;
                }
                // A discovered kind RBAC does not let us list: skipped, as the watches do.
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    tracing::info!(kind, "not allowed to list; skipped");
                    break;
                }
                Err(e) => return Err(kube_err("listing workload owners")(e)),
            };
            let next = page.metadata.continue_.clone().filter(|t| !t.is_empty());
            for m in &page.items {
                if let Some(info) = meta_info(&resource.api_version, kind, m) {
                    owners.insert(info.key(), info);
                }
            }
            match next {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok((gpu_pods, owners))
}
