//! G2 at the edge: the ResourceQuota `gpu-reaper-gpus` in every namespace an Enforce
//! admission policy governs, kept each cycle at what G1 allows (the unattested
//! allowance plus every approved, unexpired attestation, or, over the monthly budget,
//! what is in use), so the API server itself refuses the pod that would cross it even
//! while the webhook is down; and the `Approved` condition of attestations whose approval
//! no longer counts (spec changed, expired) set to False, so `kubectl get` shows it.
//!
//! What the quota and the condition say is computed in [`crate::admission::quota`]
//! (pure); this module reads attestations, nodes and the existing quotas, and writes.
//! Only the leader calls it. A namespace no longer governed loses the quota (only the
//! quotas of this controller's own policies are removed, so shards do not fight); a
//! deleted policy's quotas go with it (owner reference).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::json;

use crate::admission::budget::month_of;
use crate::admission::policy::admission_policy;
use crate::admission::quota::{self, POLICY_LABEL, QUOTA_NAME};
use crate::api::policy::AdmissionMode;
use crate::api::{GpuPolicy, ReadinessAttestation};
use crate::cluster::snapshot::list_all_matching;
use crate::gpus::GpuResources;
use crate::notify::Severity;
use crate::notify::events::EventWriter;

/// How often the GPU resource names nodes serve (MIG profiles, Intel's) are re-read.
const SERVED_REFRESH: Duration = Duration::from_secs(600);

/// What one pass did, for the log and the tests.
#[derive(Debug, Default, PartialEq)]
pub struct Kept {
    /// Quotas created or changed.
    pub written: usize,
    /// Quotas removed from namespaces no longer governed.
    pub removed: usize,
    /// Attestations whose `Approved` condition was set to False.
    pub conditions: usize,
}

/// The quota keeper's settings and what it remembers between cycles.
pub struct QuotaKeeper {
    enabled: bool,
    /// Namespaces never given a quota (the webhook's excluded namespaces).
    excluded: HashSet<String>,
    /// GPU resource names the nodes serve that a prefix covers, and when they were read.
    served: Option<(Instant, Vec<String>)>,
    /// Events on attestations: unreadable ones, lapsed approvals.
    events: EventWriter,
    /// Unreadable attestations already reported, by key and resourceVersion.
    reported: HashSet<(String, String)>,
}

impl QuotaKeeper {
    pub fn new(
        client: &Client,
        instance: &str,
        enabled: bool,
        excluded: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            enabled,
            excluded: excluded.into_iter().collect(),
            served: None,
            events: EventWriter::new(client.clone(), instance),
            reported: HashSet::new(),
        }
    }

    /// A Warning Event on an attestation (best effort: logged when it fails).
    async fn event(&self, reference: &ObjectReference, reason: &str, note: String) {
        if let Err(e) = self
            .events
            .publish(reference.clone(), reason, Severity::Warning, &note)
            .await
        {
            tracing::warn!(error = %e, reason, "could not record an Event on an attestation");
        }
    }

    /// One pass over every namespace. Failures are logged and the next cycle tries
    /// again; a quota is never loosened because something could not be read.
    pub async fn keep(
        &mut self,
        client: &Client,
        policies: &[GpuPolicy],
        namespaces: &HashMap<String, BTreeMap<String, String>>,
        resources: &GpuResources,
        now: Timestamp,
    ) -> Kept {
        let mut kept = Kept::default();
        if !self.enabled || !policies.iter().any(|p| p.spec.admission.is_some()) {
            return kept;
        }
        let attestations = match list_attestations(client).await {
            Ok((a, unreadable)) => {
                for (reference, version, error) in unreadable {
                    let key = (
                        format!("{:?}/{:?}", reference.namespace, reference.name),
                        version,
                    );
                    if self.reported.insert(key) {
                        let note = format!(
                            "gpu-reaper cannot read this ReadinessAttestation, so it covers nothing and counts toward no GPU quota: {error}; fix the field or re-create it"
                        );
                        self.event(&reference, "Unreadable", note).await;
                    }
                }
                a
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not list ReadinessAttestations: GPU quotas left as they are");
                return kept;
            }
        };
        for (reference, note) in mark_lapsed(client, &attestations, now).await {
            kept.conditions += 1;
            self.event(&reference, "ApprovalLapsed", note).await;
        }
        let existing = match list_quotas(client).await {
            Ok(q) => q,
            Err(e) => {
                tracing::warn!(error = %e, "could not list GPU quotas: left as they are");
                return kept;
            }
        };
        let served = self.served(client, resources).await;
        let ours: HashSet<&str> = policies
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        let mut governed = HashSet::new();
        let mut names: Vec<&String> = namespaces.keys().collect();
        names.sort();
        for namespace in names {
            if self.excluded.contains(namespace) {
                continue;
            }
            let Some((policy, rules)) = admission_policy(policies, &namespaces[namespace]) else {
                continue;
            };
            if rules.mode != AdmissionMode::Enforce {
                continue;
            }
            governed.insert(namespace.clone());
            let standing: Vec<&ReadinessAttestation> =
                attestations.get(namespace).into_iter().flatten().collect();
            let current = existing.get(namespace);
            let allowed = quota::figure(policy, rules, namespace, &standing, now);
            let over_budget = rules
                .monthly_budget_usd
                .is_some_and(|budget| policy.spend_of(namespace, &month_of(now)) >= budget);
            let frozen = over_budget.then(|| current.map(|q| q.used.clone()).unwrap_or_default());
            let hard = quota::hard_limits(allowed, resources, &served, frozen.as_ref());
            let desired = quota::quota(namespace, hard, policy);
            if current.is_some_and(|q| q.same_as(&desired)) {
                continue;
            }
            let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
            match api
                .patch(
                    QUOTA_NAME,
                    &PatchParams::apply(crate::api::keys::FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await
            {
                Ok(_) => {
                    kept.written += 1;
                    tracing::info!(%namespace, allowed, over_budget, policy = policy.metadata.name.as_deref().unwrap_or_default(), "GPU quota written");
                }
                Err(e) => {
                    tracing::warn!(%namespace, error = %e, "could not write the GPU quota")
                }
            }
        }
        for (namespace, q) in &existing {
            let mine = q.policy.as_deref().is_none_or(|p| ours.contains(p));
            if governed.contains(namespace) || !mine {
                continue;
            }
            let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
            match api.delete(QUOTA_NAME, &DeleteParams::default()).await {
                Ok(_) => {
                    kept.removed += 1;
                    tracing::info!(%namespace, "GPU quota removed: no Enforce admission policy governs the namespace");
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => tracing::warn!(%namespace, error = %e, "could not remove the GPU quota"),
            }
        }
        kept
    }

    /// The GPU resource names nodes serve that only a prefix names (each MIG profile,
    /// Intel's device plugins), re-read every ten minutes; on a failure the last ones.
    async fn served(&mut self, client: &Client, resources: &GpuResources) -> Vec<String> {
        if let Some((at, names)) = &self.served
            && at.elapsed() < SERVED_REFRESH
        {
            return names.clone();
        }
        let listed = list_all_matching(&Api::<Node>::all(client.clone()), "").await;
        let names = match listed {
            Ok(nodes) => served_names(&nodes, resources),
            Err(e) => {
                tracing::warn!(error = %e, "could not list nodes for their GPU resource names");
                return self
                    .served
                    .as_ref()
                    .map(|(_, n)| n.clone())
                    .unwrap_or_default();
            }
        };
        self.served = Some((Instant::now(), names.clone()));
        names
    }
}

/// The GPU resource names in nodes' allocatable that are not named exactly.
fn served_names(nodes: &[Node], resources: &GpuResources) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.allocatable.as_ref())
        .flat_map(|a| a.keys())
        .filter(|k| !resources.whole.contains(k) && resources.share_of(k).is_some())
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A quota this controller wrote, as it is now.
struct Existing {
    policy: Option<String>,
    hard: BTreeMap<String, Quantity>,
    owner_uid: Option<String>,
    used: BTreeMap<String, Quantity>,
}

impl Existing {
    fn same_as(&self, desired: &ResourceQuota) -> bool {
        let meta = desired.meta();
        self.policy.as_deref()
            == meta
                .labels
                .as_ref()
                .and_then(|l| l.get(POLICY_LABEL))
                .map(String::as_str)
            && self.owner_uid.as_deref()
                == meta
                    .owner_references
                    .as_ref()
                    .and_then(|o| o.first())
                    .map(|o| o.uid.as_str())
            && Some(&self.hard) == desired.spec.as_ref().and_then(|s| s.hard.as_ref())
    }
}

async fn list_quotas(client: &Client) -> kube::Result<HashMap<String, Existing>> {
    let api: Api<ResourceQuota> = Api::all(client.clone());
    let listed = api
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=gpu-reaper"))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|q| q.metadata.name.as_deref() == Some(QUOTA_NAME))
        .filter_map(|q| {
            let namespace = q.metadata.namespace.clone()?;
            let existing = Existing {
                policy: q
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(POLICY_LABEL).cloned()),
                hard: q.spec.and_then(|s| s.hard).unwrap_or_default(),
                owner_uid: q
                    .metadata
                    .owner_references
                    .and_then(|o| o.into_iter().next())
                    .map(|o| o.uid),
                used: q.status.and_then(|s| s.used).unwrap_or_default(),
            };
            Some((namespace, existing))
        })
        .collect())
}

/// Every readable attestation, by namespace. Each is read on its own: one that does not
/// fit the types (written before the CRD had maxima) is skipped and logged, and counts
/// toward no quota.
#[allow(clippy::type_complexity)]
async fn list_attestations(
    client: &Client,
) -> kube::Result<(
    HashMap<String, Vec<ReadinessAttestation>>,
    Vec<(ObjectReference, String, String)>,
)> {
    let resource = ApiResource::erase::<ReadinessAttestation>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut by_namespace: HashMap<String, Vec<ReadinessAttestation>> = HashMap::new();
    let mut unreadable = Vec::new();
    for object in list_all_matching(&api, "").await? {
        let key = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default()
        );
        let read = crate::api::read_dynamic::<ReadinessAttestation>(&object);
        match read {
            Ok(a) => by_namespace
                .entry(a.metadata.namespace.clone().unwrap_or_default())
                .or_default()
                .push(a),
            Err(e) => {
                tracing::warn!(attestation = %key, error = %e, "unreadable ReadinessAttestation skipped: it counts toward no quota");
                let reference = ObjectReference {
                    api_version: Some(format!("{}/{}", crate::api::GROUP, crate::api::VERSION)),
                    kind: Some("ReadinessAttestation".into()),
                    name: object.metadata.name.clone(),
                    namespace: object.metadata.namespace.clone(),
                    uid: object.metadata.uid.clone(),
                    ..ObjectReference::default()
                };
                let version = object.metadata.resource_version.clone().unwrap_or_default();
                unreadable.push((reference, version, e.to_string()));
            }
        }
    }
    Ok((by_namespace, unreadable))
}

/// Sets `Approved` to False on approved attestations whose approval no longer counts;
/// returns each one written, with the condition's message. The write carries the resourceVersion read, so an
/// approval written meanwhile is not overwritten (the next cycle looks again).
async fn mark_lapsed(
    client: &Client,
    attestations: &HashMap<String, Vec<ReadinessAttestation>>,
    now: Timestamp,
) -> Vec<(ObjectReference, String)> {
    let mut written = Vec::new();
    for a in attestations.values().flatten() {
        let Some(lapsed) = quota::approval_condition(a, now) else {
            continue;
        };
        let (Some(namespace), Some(name)) = (&a.metadata.namespace, &a.metadata.name) else {
            continue;
        };
        let mut conditions = a
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        conditions.retain(|c| c.type_ != lapsed.type_);
        conditions.push(lapsed.clone());
        let body = json!({
            "metadata": {"resourceVersion": a.metadata.resource_version},
            "status": {"conditions": conditions},
        });
        let api: Api<ReadinessAttestation> = Api::namespaced(client.clone(), namespace);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => {
                written.push((a.object_ref(&()), lapsed.message.clone()));
                tracing::info!(attestation = %format!("{namespace}/{name}"), reason = %lapsed.reason, "approval no longer counts: Approved set to False");
            }
            Err(e) => {
                tracing::warn!(attestation = %format!("{namespace}/{name}"), error = %e, "could not mark the lapsed approval")
            }
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_names_are_the_gpu_resources_only_a_prefix_names() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {
                "cpu": "96", "nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "7",
                "gpu.intel.com/xe": "2", "example.com/fpga": "1"}},
        }))
        .unwrap();
        assert_eq!(
            served_names(&[node.clone(), node], &GpuResources::default()),
            vec!["gpu.intel.com/xe", "nvidia.com/mig-1g.10gb"]
        );
    }
}
