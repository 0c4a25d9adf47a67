//! The budget gate's pure decision: `admit()` on a snapshot of 10,000 attestations, and
//! the AdmissionReview parse in front of it. `cargo bench --bench admission`; figures in
//! docs/performance.md.

#[path = "support/admission_load.rs"]
mod admission_load;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_reaper::admission::{Settings, Snapshot, admit, review};

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

criterion_group!(benches, bench);
criterion_main!(benches);
