//! The Audit-mode memory (IO): an Audit policy writes nothing on workloads, so when it
//! warned and when it would have acted are kept in the controller's own ConfigMap
//! `<lease-name>-audit` (in the Lease's namespace; per shard), read when this replica
//! starts leading and saved after a cycle that changed it. What it holds is
//! [`AuditMemory`] (pure, in `plan`).

use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::context::Context;
use super::plan::AuditMemory;
use k8s_openapi::api::core::v1::ConfigMap;

/// Entries older than this are dropped when saving.
const KEPT_FOR: SignedDuration = SignedDuration::from_hours(24 * 7);

/// The Audit-mode ladder state from its ConfigMap; empty when there is none yet.
pub async fn load(ctx: &Context) -> AuditMemory {
    let s = &ctx.settings;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &s.lease_namespace);
    match api.get_opt(&s.audit_configmap()).await {
        Ok(Some(cm)) => cm
            .data
            .and_then(|d| d.get("state.json").map(|t| AuditMemory::from_json(t)))
            .unwrap_or_default(),
        Ok(None) => AuditMemory::default(),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the Audit-mode state; starting empty (warnings may repeat)");
            AuditMemory::default()
        }
    }
}

/// Saves the Audit-mode ladder state (server-side apply; entries older than 7 days go).
pub async fn save(ctx: &Context, audit: &AuditMemory, now: Timestamp) {
    let s = &ctx.settings;
    let name = s.audit_configmap();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &s.lease_namespace);
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": s.lease_namespace},
        "data": {"state.json": audit.to_json(now, KEPT_FOR)},
    });
    if let Err(e) = api
        .patch(
            &name,
            &PatchParams::apply(crate::api::keys::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        tracing::warn!(error = %e, "could not save the Audit-mode state");
    }
}
