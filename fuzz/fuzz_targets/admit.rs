//! Fuzzes what the budget gate does with a request body: AdmissionReview parsing, then
//! `admit` over a snapshot with a policy and an approved attestation. Any panic is a bug
//! (invariant 10). Seeds: fuzz/corpus/admit (the real reviews of ../shared/fixtures/admission
//! and GPU variants). Run: `cargo +nightly fuzz run admit` (see docs/testing.md).
#![no_main]

use std::sync::{Arc, OnceLock};

use gpu_reaper::admission::{Settings, Snapshot, admit, review};
use gpu_reaper::api::{GpuPolicy, ReadinessAttestation};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn snapshot() -> &'static Snapshot {
    static SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let policy: GpuPolicy = serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
            "spec": {"admission": {"largeClaimGpus": 1, "mode": "Enforce", "monthlyBudgetUsd": 10.0,
                                   "requireEvidence": {"minDataThroughputGBpsPerGpu": 0.5, "checkpointing": true}}},
        }))
        .unwrap();
        let attestation: ReadinessAttestation = serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": "a", "namespace": "default", "generation": 1},
            "spec": {"selector": {"matchLabels": {"env": "test"}}, "maxGpus": 64, "expiresAt": "2030-01-01T00:00:00Z",
                     "evidence": {"dataThroughputGBps": 40.0, "checkpointing": true}},
            "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "r", "message": "m",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                       "approvedBy": "x", "approvedGeneration": 1},
        }))
        .unwrap();
        Snapshot::build(
            [Arc::new(policy)],
            [Arc::new(attestation)],
            [("default".to_string(), Default::default())],
            Default::default(),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = review::parse(data) {
        let now = jiff::Timestamp::from_second(1_796_000_000).unwrap();
        let decision = admit(&request, snapshot(), &Settings::default(), now);
        // A denial always says why.
        assert!(decision.allowed() || decision.message.is_some());
    }
});
