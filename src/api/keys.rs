//! Annotation and label names under `gpureaper.io/`, shared by the engine, the controller,
//! the CLI and the docs. Per-workload ladder state lives on the root workload as
//! annotations so it survives restarts and is visible with `kubectl describe`.

/// What every annotation and label key of gpu-reaper starts with.
pub const PREFIX: &str = "gpureaper.io/";

/// Label: `"true"` exempts a workload (or, on a namespace, every workload in it).
pub const EXEMPT_LABEL: &str = "gpureaper.io/exempt";
/// Annotation (user-set, RFC 3339): do not warn or act before this time. Capped by
/// the policy's `exemptions.maxSnooze`.
pub const SNOOZE_UNTIL: &str = "gpureaper.io/snooze-until";
/// Annotation (user-set): who to warn, `email` and/or Slack member ID, comma-separated.
pub const OWNER: &str = "gpureaper.io/owner";
/// Annotation (controller): when the owner was warned for the current idle period.
pub const WARNED_AT: &str = "gpureaper.io/warned-at";
/// Annotation (controller): when gpu-reaper acted on the workload.
pub const REAPED_AT: &str = "gpureaper.io/reaped-at";
/// Annotation (controller): which action was taken (`ScaleToZero`, `Suspend`, `Evict`).
pub const REAPED_ACTION: &str = "gpureaper.io/reaped-action";
/// Annotation (controller): JSON with what restoring needs, written before or with the action.
pub const RESTORE: &str = "gpureaper.io/restore";
/// Annotation (controller): JSON `{"gpus": N, "hourlyUsd": X}` — what a reclaimed
/// workload held when it was acted on, for reclaimed GPU-hours and savings in status.
pub const RECLAIMED: &str = "gpureaper.io/reclaimed";
/// Annotation (user-set): `"true"` asks the controller to restore a reclaimed workload,
/// as `gpu-reaper wake` does; the controller removes it when done.
pub const WAKE: &str = "gpureaper.io/wake";

/// Annotation (controller): when `wake` restored the workload; its startup grace counts
/// from here.
pub const WOKEN_AT: &str = "gpureaper.io/woken-at";

/// Annotation (controller): JSON delivery state of the Slack and email warnings of the
/// current idle period, `{"for": <warned-at>, "slack": {...}, "email": {...}}` with
/// `state` (`sent`, `failed`, `unrouted`), `attempts`, `next` (retry time), `to` (who),
/// `error` (last failure) — docs/notifications.md#delivery.
pub const NOTIFIED: &str = "gpureaper.io/notified";
/// Annotation (controller): the owner and channels the last warning was routed to.
pub const NOTIFIED_OWNER: &str = "gpureaper.io/notified-owner";

/// Annotation (webhook) on a ReadinessAttestation: the username that last created or
/// changed its spec, written by the budget gate's mutating webhook and checked by the
/// validating one, so an approver who is that user is refused (four eyes, G5).
pub const SPEC_CHANGED_BY: &str = "gpureaper.io/spec-changed-by";

/// The name kube-state-metrics gives a label or annotation key in `kube_pod_labels` /
/// `kube_pod_annotations` (`gpureaper.io/exempt` → `gpureaper_io_exempt`).
pub fn ksm_sanitize(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The field manager of every server-side apply gpu-reaper makes (a GpuPolicy's status,
/// the GPU ResourceQuotas, the Audit-mode memory ConfigMap): one stable name, so a
/// forced apply takes over only the fields it wrote before.
pub const FIELD_MANAGER: &str = "gpu-reaper";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksm_sanitizing_replaces_dots_slashes_and_dashes() {
        assert_eq!(ksm_sanitize(SNOOZE_UNTIL), "gpureaper_io_snooze_until");
        assert_eq!(
            ksm_sanitize("app.kubernetes.io/name"),
            "app_kubernetes_io_name"
        );
    }
}
