//! Scale check: seeds N pods (default 50,000) into kube-sim, then measures, through
//! `kube::Client` over HTTPS, one full list, a paginated list (limit 500), and a
//! kube-runtime reflector that lists + watches every pod and then sees 1,000 more
//! changes. Prints wall time per step and the process RSS (server and client share the
//! process). Run: `cargo run --release -p kube-sim --example scale -- 50000`.

use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn report(step: &str, started: Instant) {
    let (rss, peak) = rss_mib();
    println!(
        "{step:<48} {:>8.2} s   RSS {rss:>7.0} MiB   peak {peak:>7.0} MiB",
        started.elapsed().as_secs_f64()
    );
}

fn pod(i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i:06}"), "namespace": format!("ns-{}", i % 50),
            "labels": {"app": format!("app-{}", i % 100), "gpu-reaper.io/managed": "true"}},
        "spec": {"nodeName": format!("node-{}", i % 500), "containers": [{
            "name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"}},
        }]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

#[tokio::main]
async fn main() -> Result<(), kube_sim::BoxError> {
    let count: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000);
    let sim = kube_sim::KubeSim::start_with(kube_sim::Options {
        history_limit: 10_000,
        ..Default::default()
    })
    .await?;
    report("started", Instant::now());

    let started = Instant::now();
    for i in 0..count {
        sim.seed(pod(i))?;
    }
    report(&format!("seeded {count} pods (in-process)"), started);

    let pods: Api<Pod> = Api::all(sim.client().await?);
    let started = Instant::now();
    let all = pods.list(&ListParams::default()).await?;
    assert_eq!(all.items.len(), count);
    report(&format!("list all {count} pods (one request)"), started);
    drop(all);

    let started = Instant::now();
    let mut params = ListParams::default().limit(500);
    let (mut seen, mut pages) = (0, 0);
    loop {
        let page = pods.list(&params).await?;
        seen += page.items.len();
        pages += 1;
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(seen, count);
    report(&format!("list in {pages} pages of 500"), started);

    let started = Instant::now();
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(pods.clone(), watcher::Config::default().page_size(500)),
    )
    .default_backoff();
    let driver = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await?;
    assert_eq!(reader.state().len(), count);
    report(&format!("reflector ready with {count} pods"), started);

    let started = Instant::now();
    let changes = 1_000.min(count);
    for i in 0..changes {
        let ns = format!("ns-{}", i % 50);
        let api: Api<Pod> = Api::namespaced(pods.clone().into_client(), &ns);
        let patch = json!({"metadata": {"annotations": {"gpu-reaper.io/seen": "1"}}});
        api.patch(
            &format!("pod-{i:06}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    // Events arrive in order: the last patched pod annotated means all of them are.
    let last = reflector::ObjectRef::new(&format!("pod-{:06}", changes - 1))
        .within(&format!("ns-{}", (changes - 1) % 50));
    while !reader.get(&last).is_some_and(|p| {
        p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("gpu-reaper.io/seen"))
    }) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    report(&format!("{changes} patches seen by the reflector"), started);
    driver.abort();
    Ok(())
}
