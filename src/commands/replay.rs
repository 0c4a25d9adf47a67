//! `gpu-reaper replay`: the edge of `telemetry::replay` — the clock, the pods of the
//! cluster the series are mapped onto (listed on every scrape, so a Deployment's new pods
//! after a scale to zero and back are fed too), and the HTTP server of the `/metrics` page.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::backtest::load_trace;
use crate::cli::ReplayArgs;
use crate::telemetry::replay::{
    GpuNow, Pattern, PodSelector, PodTarget, TraceReplay, pattern_now, render,
};
use crate::telemetry::trace::{ReadOptions, Trace};
use crate::{Error, Result};

/// What `replay` serves, validated from its flags.
pub struct ReplayConfig {
    pub patterns: Vec<(PodSelector, Pattern)>,
    pub trace: Option<PathBuf>,
    /// Recorded (namespace, pod) → where it shows up.
    pub map: Vec<((String, String), PodSelector)>,
    pub speed: f64,
    pub listen: std::net::SocketAddr,
}

impl ReplayConfig {
    pub fn from_args(args: &ReplayArgs) -> Result<Self> {
        let invalid = |flag, message| Error::InvalidArgument { flag, message };
        let mut patterns = Vec::new();
        for p in &args.patterns {
            let (selector, pattern) = p.split_once('=').ok_or_else(|| {
                invalid(
                    "pattern",
                    format!("{p:?} is not NAMESPACE/POD=PATTERN, e.g. ml/chat-*=busy:2m,idle"),
                )
            })?;
            patterns.push((
                selector.parse().map_err(|e| invalid("pattern", e))?,
                pattern.parse().map_err(|e| invalid("pattern", e))?,
            ));
        }
        let mut map = Vec::new();
        for m in &args.map {
            let parsed = m.split_once('=').and_then(|(from, to)| {
                let (ns, pod) = from.split_once('/')?;
                Some(((ns.to_string(), pod.to_string()), to))
            });
            let Some((from, to)) = parsed else {
                return Err(invalid(
                    "map",
                    format!(
                        "{m:?} is not REC_NAMESPACE/REC_POD=NAMESPACE/POD, e.g. ml/chat-0=demo/chat-*"
                    ),
                ));
            };
            map.push((from, to.parse().map_err(|e| invalid("map", e))?));
        }
        if patterns.is_empty() && args.trace.is_none() {
            return Err(invalid(
                "pattern",
                "nothing to serve: give --pattern NAMESPACE/POD=PATTERN (e.g. --pattern 'demo/chat-*=busy:2m,idle') or --trace FILE".into(),
            ));
        }
        if !map.is_empty() && args.trace.is_none() {
            return Err(invalid(
                "map",
                "--map maps a recorded trace's pods: give --trace FILE too".into(),
            ));
        }
        Ok(Self {
            patterns,
            trace: args.trace.clone(),
            map,
            speed: args.speed,
            listen: args.listen,
        })
    }
}

/// GPUs a pod requests (`nvidia.com/gpu`, limits or requests): how many series it gets.
fn gpus_of(pod: &Pod) -> u32 {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
    containers
        .unwrap_or_default()
        .iter()
        .filter_map(|c| {
            let r = c.resources.as_ref()?;
            let q = r
                .limits
                .as_ref()
                .and_then(|l| l.get("nvidia.com/gpu"))
                .or_else(|| r.requests.as_ref()?.get("nvidia.com/gpu"))?;
            q.0.parse::<u32>().ok()
        })
        .sum()
}

/// The running pods (not being deleted) of `namespace` that hold GPUs, sorted by name.
async fn running_pods(client: &kube::Client, namespace: &str) -> Vec<PodTarget> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = match pods.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(namespace, error = %e, "could not list pods; serving none of them");
            return Vec::new();
        }
    };
    let mut out: Vec<PodTarget> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| {
            let gpus = gpus_of(p);
            (gpus > 0).then(|| PodTarget {
                namespace: namespace.to_string(),
                pod: p.metadata.name.clone().unwrap_or_default(),
                container: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .map(|c| c.name.clone())
                    .unwrap_or_default(),
                gpus,
            })
        })
        .collect();
    out.sort();
    out
}

struct Served {
    config: ReplayConfig,
    trace: Option<(Trace, TraceReplay)>,
    client: Option<kube::Client>,
    started: Instant,
}

impl Served {
    async fn page(&self) -> String {
        let elapsed = self.started.elapsed().as_secs_f64() * self.config.speed;
        let mut namespaces: Vec<&str> = self
            .config
            .patterns
            .iter()
            .map(|(s, _)| s.namespace.as_str())
            .chain(self.config.map.iter().map(|(_, s)| s.namespace.as_str()))
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let mut pods = Vec::new();
        if let Some(client) = &self.client {
            for ns in namespaces {
                pods.extend(running_pods(client, ns).await);
            }
        }
        let mut gpus: Vec<GpuNow> = Vec::new();
        for (selector, pattern) in &self.config.patterns {
            let targets: Vec<PodTarget> = pods
                .iter()
                .filter(|p| selector.matches(&p.namespace, &p.pod))
                .cloned()
                .collect();
            gpus.extend(pattern_now(pattern, &targets, elapsed));
        }
        if let Some((trace, replay)) = &self.trace {
            // The i-th recorded pod mapped onto a selector gets its i-th matching pod.
            let mut taken: std::collections::HashMap<(String, String), PodTarget> =
                Default::default();
            for (i, (from, selector)) in self.config.map.iter().enumerate() {
                let earlier = self.config.map[..i]
                    .iter()
                    .filter(|(_, s)| s == selector)
                    .count();
                let target = pods
                    .iter()
                    .filter(|p| selector.matches(&p.namespace, &p.pod))
                    .nth(earlier);
                if let Some(t) = target {
                    taken.insert(from.clone(), t.clone());
                }
            }
            let mapped: std::collections::HashSet<&(String, String)> =
                self.config.map.iter().map(|(from, _)| from).collect();
            gpus.extend(replay.now(trace, elapsed, |ns, pod| {
                let key = (ns.to_string(), pod.to_string());
                match taken.get(&key) {
                    Some(t) => Some(t.clone()),
                    // Mapped, but no such pod runs now: nothing is served for it.
                    None if mapped.contains(&key) => None,
                    None => Some(PodTarget {
                        namespace: ns.into(),
                        pod: pod.into(),
                        container: "main".into(),
                        gpus: 1,
                    }),
                }
            }));
        }
        render(&gpus)
    }
}

fn text_page(page: String) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        page,
    )
        .into_response()
}

pub fn run(args: &ReplayArgs) -> Result<()> {
    let config = ReplayConfig::from_args(args)?;
    let options = ReadOptions {
        skip_unknown_metrics: true,
        ..ReadOptions::default()
    };
    let trace = match &config.trace {
        Some(path) => {
            let trace = load_trace(Some(path), &options)?;
            let replay = TraceReplay::new(&trace);
            Some((trace, replay))
        }
        None => None,
    };
    super::multi_thread_runtime()?.block_on(async move {
        // Patterns and mappings need the cluster's pods; a trace served under its
        // recorded names does not.
        let client = if config.patterns.is_empty() && config.map.is_empty() {
            None
        } else {
            Some(kube::Client::try_default().await.map_err(|source| Error::Kube {
                action: "connecting to the Kubernetes API to find the pods to feed (KUBECONFIG or in-cluster config)".into(),
                source,
            })?)
        };
        let listen = config.listen;
        let served = Arc::new(Served {
            config,
            trace,
            client,
            started: Instant::now(),
        });
        let app = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route(
                "/metrics",
                get(move || {
                    let served = served.clone();
                    async move { text_page(served.page().await) }
                }),
            );
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| Error::Io {
                path: format!("--listen {listen}").into(),
                source,
            })?;
        tracing::info!(%listen, "serving DCGM series on /metrics");
        axum::serve(listener, app).await.map_err(|source| Error::Io {
            path: format!("--listen {listen}").into(),
            source,
        })
    })
}
