//! A budget-gate workload shared by `benches/admission.rs` and
//! `examples/webhook_load.rs`: a snapshot of 10,000 approved attestations in 1,000
//! namespaces, and 16-GPU Job reviews each covered by one of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use gpu_reaper::admission::Snapshot;
use gpu_reaper::api::{GpuPolicy, ReadinessAttestation};
use serde_json::json;

pub const NAMESPACES: usize = 1_000;
pub const ATTESTATIONS: usize = 10_000;

pub fn snapshot() -> Snapshot {
    let policy: GpuPolicy = serde_json::from_value(json!({
        "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy",
        "metadata": {"name": "research"},
        "spec": {"admission": {"largeClaimGpus": 8, "mode": "Enforce",
                               "requireEvidence": {"minDataThroughputGBpsPerGpu": 0.5}}},
    }))
    .unwrap();
    let attestations = (0..ATTESTATIONS).map(|i| {
        let a: ReadinessAttestation = serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": format!("team-{i}"), "namespace": format!("ns-{}", i % NAMESPACES), "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": format!("app-{i}")}}, "maxGpus": 64,
                     "expiresAt": "2030-01-01T00:00:00Z",
                     "owner": {"email": format!("owner-{i}@example.com")},
                     "evidence": {"datasetUri": format!("s3://bucket/data/{i}"), "dataThroughputGBps": 40.0, "checkpointing": true}},
            "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Approved", "message": "ok",
                                       "lastTransitionTime": "2026-11-01T00:00:00Z"}],
                       "approvedBy": "oncall", "approvedGeneration": 1},
        }))
        .unwrap();
        Arc::new(a)
    });
    let namespaces = (0..NAMESPACES).map(|i| {
        (
            format!("ns-{i}"),
            BTreeMap::from([("gpu-tier".to_string(), "research".to_string())]),
        )
    });
    Snapshot::build(
        [Arc::new(policy)],
        attestations,
        namespaces,
        Default::default(),
    )
}

/// A 16-GPU Job covered by attestation `team-{i}` (the full decision path), as an
/// AdmissionReview body.
pub fn review(i: usize) -> Bytes {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-0000-0000-{i:012}"),
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "name": "train", "namespace": format!("ns-{}", i % NAMESPACES), "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "train", "namespace": format!("ns-{}", i % NAMESPACES), "labels": {"app": format!("app-{i}")}},
                "spec": {"parallelism": 2, "template": {
                    "metadata": {"labels": {"app": format!("app-{i}")}},
                    "spec": {"restartPolicy": "Never", "containers": [{
                        "name": "train", "image": "pytorch/pytorch:2.4.0",
                        "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}}}]}}},
            },
            "dryRun": false,
        }
    });
    Bytes::from(serde_json::to_vec(&body).unwrap())
}
