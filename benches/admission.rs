//! The budget gate's pure decision: `admit()` on a snapshot of 10,000 attestations, and
//! the AdmissionReview parse in front of it; a PyTorchJob of as many roles as fit in
//! 1.5 MiB, etcd's object limit, so the biggest CREATE the API server can send (parse and
//! decide: counting must stay linear in the object's size, G4).
//! `cargo bench --bench admission`; figures in docs/performance.md.

#[path = "support/admission_load.rs"]
mod admission_load;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_reaper::admission::{Settings, Snapshot, admit, review};

// The allocator the binary uses (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bench(c: &mut Criterion) {
    let snapshot = admission_load::snapshot();
    let settings = Settings::default();
    let now = jiff::Timestamp::now();
    let body = admission_load::review(4242);
    let request = review::parse(&body).unwrap();
    assert!(admit(&request, &snapshot, &settings, now).allowed());
    c.bench_function("admission/parse_review_16_gpu_job", |b| {
        b.iter(|| review::parse(black_box(&body)).unwrap())
    });
    c.bench_function("admission/admit_16_gpu_job_10k_attestations", |b| {
        b.iter(|| admit(black_box(&request), &snapshot, &settings, now))
    });
    let mut config_map = request.clone();
    config_map.kind.kind = "ConfigMap".into();
    config_map.kind.group = String::new();
    if let Some(object) = config_map.object.as_mut() {
        object["apiVersion"] = "v1".into();
        object["kind"] = "ConfigMap".into();
    }
    c.bench_function("admission/admit_not_a_claim", |b| {
        b.iter(|| admit(black_box(&config_map), &snapshot, &settings, now))
    });
    // What the webhook's cache does after a change: re-index the cached objects.
    let attestations: Vec<_> = snapshot.attestations.values().flatten().cloned().collect();
    let namespaces: Vec<_> = snapshot
        .namespaces
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    c.bench_function("admission/rebuild_snapshot_10k_attestations", |b| {
        b.iter(|| {
            Snapshot::build(
                snapshot.policies.clone(),
                attestations.clone(),
                namespaces.clone(),
                Default::default(),
            )
        })
    });
}

/// etcd's limit on one object (the API server refuses a bigger one).
const ETCD_OBJECT_LIMIT: usize = 1536 * 1024;

/// An AdmissionReview creating a PyTorchJob of `roles` replica roles, each with its own
/// labels and one GPU.
fn pytorchjob_review(roles: usize) -> (Vec<u8>, usize) {
    let mut specs = serde_json::Map::new();
    for i in 0..roles {
        specs.insert(
            format!("Role{i:05}"),
            serde_json::json!({"replicas": 1, "template": {
                "metadata": {"labels": {"app": "llama", "role": format!("r{i}"), "pad": "p".repeat(150)}},
                "spec": {"containers": [{"name": "main", "image": "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}),
        );
    }
    let object = serde_json::json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "big", "namespace": "ns-0"},
        "spec": {"pytorchReplicaSpecs": specs}});
    let object_bytes = serde_json::to_vec(&object).unwrap().len();
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "big", "kind": {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"},
            "name": "big", "namespace": "ns-0", "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": object}}))
    .unwrap();
    (body, object_bytes)
}

/// The review of the biggest such PyTorchJob etcd stores.
fn big_pytorchjob_review() -> Vec<u8> {
    let (_, per_100) = pytorchjob_review(100);
    let mut roles = ETCD_OBJECT_LIMIT * 100 / per_100;
    loop {
        let (body, object_bytes) = pytorchjob_review(roles);
        if object_bytes <= ETCD_OBJECT_LIMIT {
            eprintln!(
                "big review: {roles} roles, object {object_bytes} bytes, review {} bytes",
                body.len()
            );
            return body;
        }
        roles -= 10;
    }
}

fn bench_big(c: &mut Criterion) {
    let snapshot = admission_load::snapshot();
    let settings = Settings::default();
    let now = jiff::Timestamp::now();
    let body = big_pytorchjob_review();
    c.bench_function("admission/parse_1_5_mib_pytorchjob", |b| {
        b.iter(|| review::parse(black_box(&body)).unwrap())
    });
    let request = review::parse(&body).unwrap();
    c.bench_function("admission/admit_1_5_mib_pytorchjob", |b| {
        b.iter(|| admit(black_box(&request), &snapshot, &settings, now))
    });
    c.bench_function("admission/parse_and_admit_1_5_mib_pytorchjob", |b| {
        b.iter(|| {
            let request = review::parse(black_box(&body)).unwrap();
            admit(&request, &snapshot, &settings, now)
        })
    });
}

/// A pod naming 50,000 ResourceClaims no one has created (each must be reported, never
/// counted twice): before the fix the names were merged with a linear search each, 12-13 s.
fn unresolved_claims_review(claims: usize) -> Vec<u8> {
    let names: Vec<serde_json::Value> = (0..claims)
        .map(|i| serde_json::json!({"name": format!("c{i}"), "resourceClaimName": format!("missing-{i}")}))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "claims", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "hoarder", "namespace": "ns-0", "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "hoarder", "namespace": "ns-0"},
                "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": names}}}
    }))
    .unwrap()
}

fn bench_claims(c: &mut Criterion) {
    let snapshot = admission_load::snapshot();
    let settings = Settings::default();
    let now = jiff::Timestamp::now();
    let body = unresolved_claims_review(50_000);
    let request = review::parse(&body).unwrap();
    c.bench_function("admission/admit_pod_naming_50k_unresolved_claims", |b| {
        b.iter(|| admit(black_box(&request), &snapshot, &settings, now))
    });
}

criterion_group! {
    name = claims;
    config = Criterion::default().sample_size(10);
    targets = bench_claims
}

criterion_group! {
    name = big;
    config = Criterion::default().sample_size(10);
    targets = bench_big
}
criterion_group!(benches, bench);
criterion_main!(benches, big, claims);
